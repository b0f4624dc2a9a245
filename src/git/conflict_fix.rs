//! A conflict fix's start (`WorktreeStart::ConflictFix`, the `Worktrees` side): main plus
//! the task branch's work merged in from where the two last agreed, every conflict written
//! out with its markers and committed by flotilla, so that the fixing agent sees what
//! clashed; and where such a branch's own work begins after a restart. It must not know
//! worktrees' places or the merge queue's candidates.

use std::collections::BTreeSet;
use std::path::Path;

use flotilla_actors::ports::RepoError;

use super::target::TargetBranch;
use super::{git, signature};

/// The most conflicted paths a conflict fix's commit message names.
const MAX_NAMED_CONFLICTS: usize = 50;

/// The first commit of a conflict fix (`WorktreeStart::ConflictFix`): `main` plus the work
/// of the task branch `branch` (merged from where the two last agreed), every conflict
/// written out with its markers (`<<<<<<< main` … `>>>>>>> <branch>`), committed by
/// flotilla with `main` its only parent.
pub(super) fn conflict_fix_commit(
    repo: &git2::Repository,
    target: &TargetBranch,
    main: &git2::Commit<'_>,
    branch: &str,
) -> Result<git2::Oid, RepoError> {
    let task = match repo.find_branch(branch, git2::BranchType::Local) {
        Ok(b) => b.get().peel_to_commit().map_err(git)?,
        Err(e) if e.code() == git2::ErrorCode::NotFound => {
            return Err(RepoError::Git(format!(
                "the branch {branch} whose conflicts are to be fixed does not exist"
            )));
        }
        Err(e) => return Err(git(e)),
    };
    let ancestor = super::ancestry::merge_base(repo, main.id(), task.id()).map_err(|e| {
        RepoError::Git(format!(
            "branch {branch} shares no history with {target}: {}",
            e.message()
        ))
    })?;
    let ancestor = repo
        .find_commit(ancestor)
        .map_err(git)?
        .tree()
        .map_err(git)?;
    let merged = merge_marking_conflicts(
        repo,
        &ancestor,
        &main.tree().map_err(git)?,
        &task.tree().map_err(git)?,
        target.name(),
        branch,
    )?;
    let mut message = format!("flotilla: {branch} merged onto {target}");
    if merged.conflicted.is_empty() {
        message.push_str(" (no conflicts)");
    } else {
        let named = merged.conflicted.len().min(MAX_NAMED_CONFLICTS);
        message.push_str("; conflicts marked in: ");
        message.push_str(&merged.conflicted[..named].join(", "));
        if merged.conflicted.len() > named {
            message.push_str(&format!(" and {} more", merged.conflicted.len() - named));
        }
    }
    let tree = repo.find_tree(merged.tree).map_err(git)?;
    let sig = signature()?;
    repo.commit(None, &sig, &sig, &message, &tree, &[main])
        .map_err(git)
}

/// A conflict-fix branch's base after a restart: the first commit of its first-parent
/// history past main's (flotilla's merge commit), however main moved since and whatever the
/// fix merged in. The merge base with main if there is none.
pub(super) fn conflict_fix_base(
    repo: &git2::Repository,
    main: git2::Oid,
    tip: git2::Oid,
) -> Result<git2::Oid, RepoError> {
    // Most commits asked about here are not on main: libgit2's walk, not a first-parent
    // line read to its bound before it (ADR-053).
    let on_main = |id: git2::Oid| -> Result<bool, RepoError> {
        Ok(id == main || repo.graph_descendant_of(main, id).map_err(git)?)
    };
    let mut first = None;
    let mut current = Some(repo.find_commit(tip).map_err(git)?);
    for _ in 0..flotilla_actors::ports::MAX_LANDED_WALK {
        let Some(commit) = current else { break };
        if on_main(commit.id())? {
            if let Some(first) = first {
                return Ok(first);
            }
            break;
        }
        first = Some(commit.id());
        current = commit.parent(0).ok();
    }
    super::ancestry::merge_base(repo, main, tip).map_err(git)
}

/// A merge of three trees where every conflict is resolved by writing it out: both sides
/// with markers in a text file, and otherwise the side that still has the file (a
/// modify/delete) or `ours` (binary files, links, submodules).
struct MarkedMerge {
    pub tree: git2::Oid,
    /// The conflicted paths, sorted.
    pub conflicted: Vec<String>,
}

fn bytes_path(path: &[u8]) -> &Path {
    use std::os::unix::ffi::OsStrExt;
    Path::new(std::ffi::OsStr::from_bytes(path))
}

fn merge_input<'a>(content: &'a [u8], path: &Path) -> git2::MergeFileInput<'a> {
    let mut input = git2::MergeFileInput::new();
    input.content(content).path(path);
    input
}

fn index_entry(path: &[u8], mode: u32, id: git2::Oid, size: usize) -> git2::IndexEntry {
    git2::IndexEntry {
        ctime: git2::IndexTime::new(0, 0),
        mtime: git2::IndexTime::new(0, 0),
        dev: 0,
        ino: 0,
        mode,
        uid: 0,
        gid: 0,
        file_size: size as u32,
        id,
        flags: 0,
        flags_extended: 0,
        path: path.to_vec(),
    }
}

/// `entry` at stage 0.
fn resolved(entry: &git2::IndexEntry) -> git2::IndexEntry {
    index_entry(&entry.path, entry.mode, entry.id, entry.file_size as usize)
}

fn merge_marking_conflicts(
    repo: &git2::Repository,
    ancestor: &git2::Tree<'_>,
    ours: &git2::Tree<'_>,
    theirs: &git2::Tree<'_>,
    our_label: &str,
    their_label: &str,
) -> Result<MarkedMerge, RepoError> {
    let mut index = repo
        .merge_trees(ancestor, ours, theirs, None)
        .map_err(git)?;
    let conflicts = index
        .conflicts()
        .map_err(git)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(git)?;
    let mut conflicted = BTreeSet::new();
    let mut entries = Vec::new();
    let text_blob = |entry: &git2::IndexEntry| -> Result<Option<Vec<u8>>, RepoError> {
        if entry.mode != u32::from(git2::FileMode::Blob)
            && entry.mode != u32::from(git2::FileMode::BlobExecutable)
        {
            return Ok(None);
        }
        let blob = repo.find_blob(entry.id).map_err(git)?;
        Ok((!blob.is_binary()).then(|| blob.content().to_vec()))
    };
    for conflict in &conflicts {
        for entry in [&conflict.ancestor, &conflict.our, &conflict.their]
            .into_iter()
            .flatten()
        {
            conflicted.insert(entry.path.clone());
        }
        match (&conflict.our, &conflict.their) {
            (Some(our), Some(their)) if our.path == their.path => {
                let base = match &conflict.ancestor {
                    Some(a) => text_blob(a)?,
                    None => Some(Vec::new()),
                };
                match (base, text_blob(our)?, text_blob(their)?) {
                    (Some(base), Some(our_text), Some(their_text)) => {
                        let path = bytes_path(&our.path);
                        let mut options = git2::MergeFileOptions::new();
                        options.our_label(our_label).their_label(their_label);
                        let merged = git2::merge_file(
                            &merge_input(&base, path),
                            &merge_input(&our_text, path),
                            &merge_input(&their_text, path),
                            Some(&mut options),
                        )
                        .map_err(git)?;
                        let id = repo.blob(merged.content()).map_err(git)?;
                        // The executable bit as main has it, unless only the branch changed it.
                        let mode = match &conflict.ancestor {
                            Some(a) if a.mode == our.mode => their.mode,
                            _ => our.mode,
                        };
                        entries.push(index_entry(&our.path, mode, id, merged.content().len()));
                    }
                    _ => entries.push(resolved(our)),
                }
            }
            (our, their) => entries.extend(our.iter().chain(their.iter()).map(resolved)),
        }
    }
    for path in &conflicted {
        match index.conflict_remove(bytes_path(path)) {
            Err(e) if e.code() != git2::ErrorCode::NotFound => return Err(git(e)),
            _ => {}
        }
    }
    for entry in &entries {
        // A side that cannot sit beside what is there already (a file where the other side
        // has a directory) stays out; the path is named as conflicted all the same.
        let _ = index.add(entry);
    }
    let tree = index.write_tree_to(repo).map_err(git)?;
    Ok(MarkedMerge {
        tree,
        conflicted: conflicted
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect(),
    })
}
