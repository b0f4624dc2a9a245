//! The planners' read-only tools on git2 (ADR-037): a path, a grep, a log and a commit of a
//! pinned commit, read from git's objects, never from a work tree. A path is looked up in
//! the commit's tree (it cannot name anything outside it, and a lookup never passes through
//! a link); a link is reported with its target, a submodule with its commit. Every answer
//! is bounded by the caller's numbers and by [`MAX_BLOB_READ`]. Blocking: called on the
//! reader's blocking thread.

use flotilla_actors::ports::{
    CommitLine, CommitLog, CommitShown, EntryKind, GrepQuery, GrepReport, MAX_BLOB_READ,
    ReadBounds, RepoError, TreeEntry, TreeItem, TreePath, grep_blob, is_binary,
};
use git2::{ObjectType, Oid, Repository};

use super::git;

/// Commits a path's log examines at most, however few of them changed the path.
const MAX_LOG_WALK: usize = 10_000;
/// Files a commit shown lists at most.
const MAX_FILES_SHOWN: usize = 200;

fn pinned<'r>(repo: &'r Repository, commit: &str) -> Result<git2::Commit<'r>, RepoError> {
    let oid = Oid::from_str(commit).map_err(git)?;
    repo.find_commit(oid).map_err(git)
}

fn kind_of(mode: i32, kind: Option<ObjectType>) -> EntryKind {
    match (mode, kind) {
        (0o120000, _) => EntryKind::Link,
        (0o100755, _) => EntryKind::Executable,
        (_, Some(ObjectType::Tree)) => EntryKind::Directory,
        (_, Some(ObjectType::Commit)) => EntryKind::Submodule,
        _ => EntryKind::File,
    }
}

/// A blob's size without reading it.
fn blob_size(repo: &Repository, id: Oid) -> Result<u64, RepoError> {
    let (size, _) = repo
        .odb()
        .and_then(|odb| odb.read_header(id))
        .map_err(git)?;
    Ok(size as u64)
}

pub fn read_path(
    repo: &Repository,
    commit: &str,
    path: &TreePath,
    bounds: ReadBounds,
) -> Result<TreeItem, RepoError> {
    let commit = pinned(repo, commit)?;
    let root = commit.tree().map_err(git)?;
    let (id, kind) = if path.is_root() {
        (root.id(), EntryKind::Directory)
    } else {
        match root.get_path(std::path::Path::new(path.as_str())) {
            Ok(entry) => (entry.id(), kind_of(entry.filemode(), entry.kind())),
            Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(TreeItem::Missing),
            Err(e) => return Err(git(e)),
        }
    };
    match kind {
        EntryKind::Submodule => Ok(TreeItem::Submodule {
            commit: id.to_string(),
        }),
        EntryKind::Link => {
            let blob = repo.find_blob(id).map_err(git)?;
            let target = blob.content();
            let target = &target[..target.len().min(bounds.max_bytes)];
            Ok(TreeItem::Link {
                target: String::from_utf8_lossy(target).into_owned(),
            })
        }
        EntryKind::Directory => {
            let tree = repo.find_tree(id).map_err(git)?;
            let mut entries = Vec::new();
            for entry in tree.iter().take(bounds.max_entries) {
                let kind = kind_of(entry.filemode(), entry.kind());
                let size = match kind {
                    EntryKind::File | EntryKind::Executable | EntryKind::Link => {
                        Some(blob_size(repo, entry.id())?)
                    }
                    _ => None,
                };
                entries.push(TreeEntry {
                    name: String::from_utf8_lossy(entry.name_bytes()).into_owned(),
                    kind,
                    size,
                });
            }
            Ok(TreeItem::Directory {
                omitted: tree.len().saturating_sub(entries.len()),
                entries,
            })
        }
        EntryKind::File | EntryKind::Executable => {
            let size = blob_size(repo, id)?;
            let offset = bounds.offset.min(size);
            if size > MAX_BLOB_READ {
                return Ok(TreeItem::File {
                    size,
                    offset,
                    bytes: Vec::new(),
                    binary: false,
                    too_large: true,
                });
            }
            let blob = repo.find_blob(id).map_err(git)?;
            let content = blob.content();
            if is_binary(content) {
                return Ok(TreeItem::File {
                    size,
                    offset,
                    bytes: Vec::new(),
                    binary: true,
                    too_large: false,
                });
            }
            // `offset <= size <= MAX_BLOB_READ`: it fits a usize.
            let start = usize::try_from(offset)
                .unwrap_or(content.len())
                .min(content.len());
            let end = start.saturating_add(bounds.max_bytes).min(content.len());
            Ok(TreeItem::File {
                size,
                offset,
                bytes: content[start..end].to_vec(),
                binary: false,
                too_large: false,
            })
        }
    }
}

pub fn grep(repo: &Repository, commit: &str, query: &GrepQuery) -> Result<GrepReport, RepoError> {
    let commit = pinned(repo, commit)?;
    let tree = commit.tree().map_err(git)?;
    let mut report = GrepReport::default();
    let mut scanned: u64 = 0;
    let mut failure = None;
    tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
        if report.full(query) {
            return git2::TreeWalkResult::Abort;
        }
        let path = format!("{dir}{}", String::from_utf8_lossy(entry.name_bytes()));
        if entry.kind() == Some(ObjectType::Tree) {
            // Skip directories that cannot hold the searched path (nor lead to it).
            let leads = query.under.contains(&path) || query.under.as_str().starts_with(&path);
            return if leads {
                git2::TreeWalkResult::Ok
            } else {
                git2::TreeWalkResult::Skip
            };
        }
        // Blobs only: links are not followed, submodules not entered.
        let regular = matches!(entry.filemode(), 0o100644 | 0o100755);
        if !regular || !query.under.contains(&path) {
            return git2::TreeWalkResult::Ok;
        }
        let size = match blob_size(repo, entry.id()) {
            Ok(size) => size,
            Err(e) => {
                failure = Some(e);
                return git2::TreeWalkResult::Abort;
            }
        };
        if size > query.max_file_bytes.min(MAX_BLOB_READ) {
            report.files_skipped += 1;
            return git2::TreeWalkResult::Ok;
        }
        scanned = scanned.saturating_add(size);
        if scanned > query.max_scan_bytes {
            report.stopped = Some(format!(
                "{} bytes of files were searched",
                query.max_scan_bytes
            ));
            return git2::TreeWalkResult::Abort;
        }
        match repo.find_blob(entry.id()) {
            Ok(blob) => grep_blob(query, &path, blob.content(), &mut report),
            Err(e) => {
                failure = Some(git(e));
                return git2::TreeWalkResult::Abort;
            }
        }
        git2::TreeWalkResult::Ok
    })
    // An abort is how the walk stops early; its error says nothing more.
    .or_else(|e| match e.code() {
        git2::ErrorCode::User => Ok(()),
        _ => Err(git(e)),
    })?;
    match failure {
        Some(e) => Err(e),
        None => Ok(report),
    }
}

fn line(commit: &git2::Commit<'_>) -> CommitLine {
    CommitLine {
        id: commit.id().to_string(),
        author: String::from_utf8_lossy(commit.author().name_bytes()).into_owned(),
        time: commit.time().seconds(),
        subject: String::from_utf8_lossy(commit.summary_bytes().unwrap_or_default())
            .chars()
            .take(200)
            .collect(),
    }
}

/// The id of `path` in `commit`'s tree, if it is there.
fn path_id(commit: &git2::Commit<'_>, path: &TreePath) -> Option<Oid> {
    let tree = commit.tree().ok()?;
    if path.is_root() {
        return Some(tree.id());
    }
    tree.get_path(std::path::Path::new(path.as_str()))
        .ok()
        .map(|e| e.id())
}

pub fn log(
    repo: &Repository,
    commit: &str,
    path: Option<&TreePath>,
    max_count: usize,
) -> Result<CommitLog, RepoError> {
    let start = pinned(repo, commit)?;
    let mut walk = repo.revwalk().map_err(git)?;
    walk.set_sorting(git2::Sort::TOPOLOGICAL | git2::Sort::TIME)
        .map_err(git)?;
    walk.push(start.id()).map_err(git)?;
    let mut log = CommitLog::default();
    for (examined, id) in walk.enumerate() {
        if log.commits.len() >= max_count {
            break;
        }
        if examined >= MAX_LOG_WALK {
            log.walk_cut = true;
            break;
        }
        let commit = repo.find_commit(id.map_err(git)?).map_err(git)?;
        let changed = match path {
            None => true,
            Some(path) => {
                let here = path_id(&commit, path);
                let before = commit.parent(0).ok().and_then(|p| path_id(&p, path));
                here != before
            }
        };
        if changed {
            log.commits.push(line(&commit));
        }
    }
    Ok(log)
}

pub fn show_commit(
    repo: &Repository,
    commit: &str,
    name: &str,
    max_patch_bytes: usize,
) -> Result<Option<CommitShown>, RepoError> {
    let tip = pinned(repo, commit)?;
    let shown = if name == "HEAD" {
        tip.clone()
    } else {
        match repo.find_commit_by_prefix(name) {
            Ok(c) => c,
            Err(e)
                if matches!(
                    e.code(),
                    git2::ErrorCode::NotFound | git2::ErrorCode::Ambiguous
                ) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(git(e)),
        }
    };
    // Only main's history at the pinned tip: not another branch's work, nor a later main.
    let reachable = super::ancestry::descends(repo, tip.id(), shown.id()).map_err(git)?;
    if !reachable {
        return Ok(None);
    }
    let new = shown.tree().map_err(git)?;
    let old = match shown.parent(0) {
        Ok(parent) => Some(parent.tree().map_err(git)?),
        Err(_) => None,
    };
    let diff = repo
        .diff_tree_to_tree(old.as_ref(), Some(&new), None)
        .map_err(git)?;
    let mut files = Vec::new();
    let deltas = diff.deltas().len();
    for (i, delta) in diff.deltas().enumerate().take(MAX_FILES_SHOWN) {
        let status = match delta.status() {
            git2::Delta::Added => "A",
            git2::Delta::Deleted => "D",
            git2::Delta::Renamed => "R",
            _ => "M",
        };
        let path = delta
            .new_file()
            .path()
            .or(delta.old_file().path())
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let counts = git2::Patch::from_diff(&diff, i)
            .ok()
            .flatten()
            .and_then(|p| p.line_stats().ok())
            .map(|(_, added, removed)| format!(" (+{added} -{removed})"))
            .unwrap_or_default();
        files.push(format!("{status} {path}{counts}"));
    }
    if deltas > MAX_FILES_SHOWN {
        files.push(format!("… and {} more files", deltas - MAX_FILES_SHOWN));
    }
    let mut patch = Vec::new();
    let mut omitted = 0usize;
    diff.print(git2::DiffFormat::Patch, |_, _, line| {
        let mut bytes = Vec::new();
        if matches!(line.origin(), '+' | '-' | ' ') {
            bytes.push(line.origin() as u8);
        }
        bytes.extend_from_slice(line.content());
        if patch.len() + bytes.len() <= max_patch_bytes {
            patch.extend_from_slice(&bytes);
        } else {
            omitted = omitted.saturating_add(bytes.len());
        }
        true
    })
    .map_err(git)?;
    let line = line(&shown);
    Ok(Some(CommitShown {
        id: line.id,
        author: line.author,
        time: line.time,
        parents: shown.parent_ids().map(|p| p.to_string()).collect(),
        message: String::from_utf8_lossy(shown.message_bytes()).into_owned(),
        files,
        patch: String::from_utf8_lossy(&patch).into_owned(),
        patch_omitted: omitted,
    }))
}
