//! The `Worktrees` port on git2: one worktree per attempt, under the state directory
//! (`worktrees/<run>/<task>-a<attempt>`), on the branch flotilla named for the attempt. The
//! target repository's own work tree and index are never touched: a worktree has its own
//! index and `HEAD`, and git keeps its bookkeeping in `.git/worktrees/<name>`.
//!
//! Every call runs on a blocking thread (git2 blocks, and `Repository` is not `Sync`). What
//! changes the repository's `.git` (branches, worktree entries) is serialized per repository
//! across the whole daemon: runs on the same repository share one lock, so two attempts
//! never race on a ref or on `.git/worktrees`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use flotilla_actors::ports::{BranchFate, RepoError, Swept, Workspace, WorktreeRequest, Worktrees};
use flotilla_actors::protocol::{BranchWork, ChangeKind, FileChange, RunId, TaskId};
use futures::future::BoxFuture;

use crate::git_repo::main_commit;

/// Who flotilla's own commits are by: never a person (CI machines have no git identity, and
/// an agent's work must not look like the user's).
pub const FLOTILLA_NAME: &str = "flotilla";
pub const FLOTILLA_EMAIL: &str = "flotilla@localhost";

/// The largest file the safety-net commit takes: anything bigger stays out of the branch
/// (and out of git's object store) and is named in the commit message.
pub const MAX_COMMITTED_FILE_BYTES: u64 = 16 * 1024 * 1024;

pub struct GitWorktrees {
    repo: PathBuf,
    run: RunId,
    /// This run's worktrees: `<state>/worktrees/<run>`.
    root: PathBuf,
}

impl GitWorktrees {
    /// `root` is the directory for this run's worktrees (created when the first one is).
    pub fn new(repo: impl Into<PathBuf>, run: RunId, root: impl Into<PathBuf>) -> Self {
        GitWorktrees {
            repo: repo.into(),
            run,
            root: root.into(),
        }
    }

    fn dir_name(task: &TaskId, attempt: u32) -> String {
        format!("{task}-a{attempt}")
    }

    fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Place) -> Result<T, RepoError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, RepoError>> {
        let place = Place {
            repo: self.repo.clone(),
            run: self.run,
            root: self.root.clone(),
        };
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let lock = repo_lock(&place.repo);
                let _held = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                work(&place)
            })
            .await
            .map_err(|e| RepoError::Git(format!("the git thread failed: {e}")))?
        })
    }
}

/// One lock per repository, for the whole daemon.
fn repo_lock(repo: &Path) -> Arc<Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>> = OnceLock::new();
    let key = std::fs::canonicalize(repo).unwrap_or_else(|_| repo.to_path_buf());
    let mut locks = LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    locks.entry(key).or_default().clone()
}

/// What a blocking call needs to know.
struct Place {
    repo: PathBuf,
    run: RunId,
    root: PathBuf,
}

impl Place {
    fn open(&self) -> Result<git2::Repository, RepoError> {
        git2::Repository::open(&self.repo).map_err(|_| RepoError::NotARepository(self.repo.clone()))
    }

    /// git's name for a worktree (`.git/worktrees/<name>`): unique per run and attempt.
    fn worktree_name(&self, dir_name: &str) -> String {
        format!("flotilla-{}-{dir_name}", self.run.as_uuid().simple())
    }

    fn name_prefix(&self) -> String {
        self.worktree_name("")
    }
}

fn git(e: git2::Error) -> RepoError {
    RepoError::Git(e.message().to_string())
}

fn io(what: &str, path: &Path, e: std::io::Error) -> RepoError {
    RepoError::Git(format!("{what} {}: {e}", path.display()))
}

fn signature() -> Result<git2::Signature<'static>, RepoError> {
    git2::Signature::now(FLOTILLA_NAME, FLOTILLA_EMAIL).map_err(git)
}

/// Removes a worktree git knows by `name`: its directory and `.git/worktrees/<name>`.
fn prune(repo: &git2::Repository, name: &str, path: &Path) -> Result<(), RepoError> {
    if let Ok(worktree) = repo.find_worktree(name) {
        let _ = worktree.unlock();
        worktree
            .prune(Some(
                git2::WorktreePruneOptions::new()
                    .valid(true)
                    .locked(true)
                    .working_tree(true),
            ))
            .map_err(git)?;
    }
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(io("cannot remove the worktree", path, e))
        }
        _ => Ok(()),
    }
}

fn delete_branch(repo: &git2::Repository, branch: &str) -> Result<bool, RepoError> {
    match repo.find_branch(branch, git2::BranchType::Local) {
        Ok(mut b) => b.delete().map(|_| true).map_err(git),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(false),
        Err(e) => Err(git(e)),
    }
}

/// The worktree `path` is a live checkout of `branch`.
fn is_checkout_of(path: &Path, branch: &str) -> bool {
    git2::Repository::open(path)
        .ok()
        .and_then(|r| r.head().ok().and_then(|h| h.name().ok().map(String::from)))
        .is_some_and(|head| head == format!("refs/heads/{branch}"))
}

fn prepare(place: &Place, request: &WorktreeRequest) -> Result<Workspace, RepoError> {
    let repo = place.open()?;
    let dir_name = GitWorktrees::dir_name(&request.task, request.attempt);
    let name = place.worktree_name(&dir_name);
    let path = place.root.join(&dir_name);
    let main = main_commit(&repo)?.ok_or_else(|| {
        RepoError::Git(
            "the repository has no commits: a task branch needs one to start from".into(),
        )
    })?;
    let existing = match repo.find_branch(&request.branch, git2::BranchType::Local) {
        Ok(b) => Some(b.get().peel_to_commit().map_err(git)?),
        Err(e) if e.code() == git2::ErrorCode::NotFound => None,
        Err(e) => return Err(git(e)),
    };
    let base = match &existing {
        // The branch left main where main and it last agreed.
        Some(tip) => repo.merge_base(main.id(), tip.id()).map_err(git)?,
        None => main.id(),
    };
    if existing.is_some() && is_checkout_of(&path, &request.branch) {
        return Ok(Workspace {
            path,
            branch: request.branch.clone(),
            base: base.to_string(),
        });
    }
    // Whatever is at the path (a crash mid-way, a stale entry) goes before a fresh checkout.
    prune(&repo, &name, &path)?;
    if existing.is_none() {
        repo.branch(&request.branch, &main, false).map_err(git)?;
    }
    std::fs::create_dir_all(&place.root).map_err(|e| io("cannot create", &place.root, e))?;
    let reference = repo
        .find_reference(&format!("refs/heads/{}", request.branch))
        .map_err(git)?;
    let mut options = git2::WorktreeAddOptions::new();
    options.reference(Some(&reference));
    repo.worktree(&name, &path, Some(&options)).map_err(git)?;
    Ok(Workspace {
        path,
        branch: request.branch.clone(),
        base: base.to_string(),
    })
}

/// Commits what the agent left in the worktree (if anything), as flotilla. Files over
/// [`MAX_COMMITTED_FILE_BYTES`] are left out and named in the message. Returns whether a
/// commit was made.
fn commit_leftovers(worktree: &git2::Repository, workspace: &Workspace) -> Result<bool, RepoError> {
    let root = workspace.path.clone();
    let mut index = worktree.index().map_err(git)?;
    let mut too_large = Vec::new();
    let mut skip_large = |path: &Path, _: &[u8]| -> i32 {
        match std::fs::symlink_metadata(root.join(path)) {
            Ok(meta) if meta.is_file() && meta.len() > MAX_COMMITTED_FILE_BYTES => {
                too_large.push(path.to_string_lossy().into_owned());
                1
            }
            _ => 0,
        }
    };
    index
        .add_all(["*"], git2::IndexAddOption::DEFAULT, Some(&mut skip_large))
        .map_err(git)?;
    // Files the agent deleted leave the index too.
    index.update_all(["*"], None).map_err(git)?;
    index.write().map_err(git)?;
    let tree_id = index.write_tree().map_err(git)?;
    let head = worktree
        .head()
        .and_then(|h| h.peel_to_commit())
        .map_err(git)?;
    if head.tree_id() == tree_id {
        return Ok(false);
    }
    let tree = worktree.find_tree(tree_id).map_err(git)?;
    let mut message = format!(
        "flotilla: commit the work left uncommitted on {}",
        workspace.branch
    );
    if !too_large.is_empty() {
        too_large.sort();
        message.push_str(&format!(
            "\n\nLeft out (over {} MiB): {}",
            MAX_COMMITTED_FILE_BYTES / (1024 * 1024),
            too_large.join(", ")
        ));
    }
    let sig = signature()?;
    worktree
        .commit(Some("HEAD"), &sig, &sig, &message, &tree, &[&head])
        .map_err(git)?;
    Ok(true)
}

fn change_kind(status: git2::Delta) -> ChangeKind {
    match status {
        git2::Delta::Added | git2::Delta::Untracked => ChangeKind::Added,
        git2::Delta::Deleted => ChangeKind::Deleted,
        git2::Delta::Renamed => ChangeKind::Renamed,
        git2::Delta::Copied => ChangeKind::Copied,
        git2::Delta::Typechange => ChangeKind::TypeChanged,
        _ => ChangeKind::Modified,
    }
}

/// What the branch changed between `base` and `head`: `git diff --stat base head` (renames
/// detected as git does by default).
pub fn branch_work(
    repo: &git2::Repository,
    branch: &str,
    base: git2::Oid,
    head: git2::Oid,
) -> Result<BranchWork, RepoError> {
    let tree = |id| repo.find_commit(id).and_then(|c| c.tree()).map_err(git);
    let (old, new) = (tree(base)?, tree(head)?);
    let mut diff = repo
        .diff_tree_to_tree(Some(&old), Some(&new), None)
        .map_err(git)?;
    diff.find_similar(Some(git2::DiffFindOptions::new().renames(true)))
        .map_err(git)?;
    let mut files = Vec::new();
    let (mut added, mut removed, mut omitted) = (0u64, 0u64, 0u64);
    let path_of =
        |file: git2::DiffFile<'_>| file.path().map(|p| p.to_string_lossy().replace('\\', "/"));
    for (i, delta) in diff.deltas().enumerate() {
        let patch = git2::Patch::from_diff(&diff, i).map_err(git)?;
        let (binary, lines_added, lines_removed) = match &patch {
            Some(p) if !delta.flags().is_binary() => {
                let (_, plus, minus) = p.line_stats().map_err(git)?;
                (false, plus as u64, minus as u64)
            }
            _ => (true, 0, 0),
        };
        added = added.saturating_add(lines_added);
        removed = removed.saturating_add(lines_removed);
        if files.len() >= BranchWork::MAX_FILES {
            omitted += 1;
            continue;
        }
        let change = change_kind(delta.status());
        let new_path = path_of(delta.new_file());
        let old_path = path_of(delta.old_file());
        let (path, old_path) = match change {
            ChangeKind::Deleted => (old_path.unwrap_or_default(), None),
            ChangeKind::Renamed | ChangeKind::Copied => (new_path.unwrap_or_default(), old_path),
            _ => (new_path.or(old_path).unwrap_or_default(), None),
        };
        files.push(FileChange {
            path,
            old_path,
            change,
            lines_added,
            lines_removed,
            binary,
        });
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(BranchWork {
        branch: branch.to_string(),
        base: base.to_string(),
        head: head.to_string(),
        files,
        files_omitted: omitted,
        lines_added: added,
        lines_removed: removed,
        committed_for_agent: false,
    })
}

fn seal(place: &Place, workspace: &Workspace) -> Result<BranchWork, RepoError> {
    let worktree = git2::Repository::open(&workspace.path)
        .map_err(|_| RepoError::NotARepository(workspace.path.clone()))?;
    let committed = commit_leftovers(&worktree, workspace)?;
    let head = worktree
        .head()
        .and_then(|h| h.peel_to_commit())
        .map_err(git)?
        .id();
    let base = match git2::Oid::from_str(&workspace.base) {
        Ok(base) => base,
        Err(_) => {
            let repo = place.open()?;
            let main = main_commit(&repo)?
                .ok_or_else(|| RepoError::Git("the repository has no commits".into()))?
                .id();
            worktree.merge_base(main, head).map_err(git)?
        }
    };
    let mut work = branch_work(&worktree, &workspace.branch, base, head)?;
    work.committed_for_agent = committed;
    Ok(work)
}

fn release(place: &Place, workspace: &Workspace, fate: BranchFate) -> Result<(), RepoError> {
    let repo = place.open()?;
    let dir_name = workspace
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    prune(&repo, &place.worktree_name(&dir_name), &workspace.path)?;
    if fate == BranchFate::Delete {
        delete_branch(&repo, &workspace.branch)?;
    }
    Ok(())
}

fn sweep(place: &Place, keep: &[String]) -> Result<Swept, RepoError> {
    let repo = place.open()?;
    let mut swept = Swept::default();
    let prefix = place.name_prefix();
    let names = repo.worktrees().map_err(git)?;
    let mut kept = Vec::new();
    for name in names.iter().flatten().flatten() {
        let Some(dir_name) = name.strip_prefix(&prefix) else {
            continue;
        };
        let path = place.root.join(dir_name);
        // The branch it has checked out, read before it goes.
        let branch = git2::Repository::open(&path).ok().and_then(|r| {
            r.head()
                .ok()
                .and_then(|h| h.shorthand().ok().map(String::from))
        });
        if branch.as_ref().is_some_and(|b| keep.contains(b)) {
            kept.push(path);
            continue;
        }
        prune(&repo, name, &path)?;
        swept.worktrees.push(path);
        if let Some(branch) = branch
            && delete_branch(&repo, &branch)?
        {
            swept.branches.push(branch);
        }
    }
    // Directories git no longer knows (a crash between making the directory and
    // registering it).
    if let Ok(entries) = std::fs::read_dir(&place.root) {
        for entry in entries.flatten() {
            let path = entry.path();
            if !kept.contains(&path) && !swept.worktrees.contains(&path) {
                std::fs::remove_dir_all(&path).map_err(|e| io("cannot remove", &path, e))?;
                swept.worktrees.push(path);
            }
        }
    }
    if keep.is_empty() {
        // Nothing of the run is left in it (an error here only means something is).
        let _ = std::fs::remove_dir(&place.root);
    }
    Ok(swept)
}

impl Worktrees for GitWorktrees {
    fn prepare(
        &self,
        request: WorktreeRequest,
    ) -> BoxFuture<'static, Result<Workspace, RepoError>> {
        self.blocking(move |place| prepare(place, &request))
    }

    fn seal(&self, workspace: Workspace) -> BoxFuture<'static, Result<BranchWork, RepoError>> {
        self.blocking(move |place| seal(place, &workspace))
    }

    fn release(
        &self,
        workspace: Workspace,
        fate: BranchFate,
    ) -> BoxFuture<'static, Result<(), RepoError>> {
        self.blocking(move |place| release(place, &workspace, fate))
    }

    fn sweep(&self, keep: Vec<String>) -> BoxFuture<'static, Result<Swept, RepoError>> {
        self.blocking(move |place| sweep(place, &keep))
    }
}
