//! What flotilla leaves in a repository and how it goes: git's records of attempt
//! worktrees (`.git/worktrees/flotilla-<run>-<dir>`, whole or half written), task branches
//! (`flotilla/<run>/…`) and stale ref locks under them. A run's own sweep prunes its
//! worktrees through [`prune`]; `flotilla gc` finds what runs that are over left by name
//! ([`leftovers`]) and removes it ([`remove_leftovers`]). It must not know a live run's
//! worktrees (`worktrees.rs`) or the daemon's journal: which runs are over is an input.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use flotilla_actors::ports::RepoError;
use flotilla_actors::protocol::{RunId, branch_prefix};

use super::{delete_branch, git, io, repo_lock};

/// Removes a worktree git knows by `name`: its directory and `.git/worktrees/<name>`.
pub(super) fn prune(repo: &git2::Repository, name: &str, path: &Path) -> Result<(), RepoError> {
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
    // A crash in the middle of making a worktree can leave git's record of it half written
    // (a HEAD naming the branch, no gitdir): git cannot open it to prune it, yet it keeps
    // the branch "checked out" and so undeletable. It is flotilla's (the name says so): it
    // goes by hand.
    let record = admin_dir(repo, name);
    match std::fs::remove_dir_all(&record) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io("cannot remove the worktree's record", &record, e));
        }
        _ => {}
    }
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(io("cannot remove the worktree", path, e))
        }
        _ => Ok(()),
    }
}

/// Removes git's record of the worktree `name` (`.git/worktrees/<name>`), not its files:
/// what a worktree's release does under the repository's lock, its files going after.
pub(super) fn forget(repo: &git2::Repository, name: &str) -> Result<(), RepoError> {
    if let Ok(worktree) = repo.find_worktree(name) {
        let _ = worktree.unlock();
        worktree
            .prune(Some(
                git2::WorktreePruneOptions::new()
                    .valid(true)
                    .locked(true)
                    .working_tree(false),
            ))
            .map_err(git)?;
    }
    let record = admin_dir(repo, name);
    match std::fs::remove_dir_all(&record) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(io("cannot remove the worktree's record", &record, e))
        }
        _ => Ok(()),
    }
}

/// Removes git's records of worktrees named `prefix…` that are not whole (a `commondir`,
/// `gitdir` and `HEAD` file each): what a kill leaves while libgit2 makes or removes one.
/// The caller holds the repository's lock, inside which every record is made and removed
/// whole, so one not whole is a kill's leftover.
///
/// Why: libgit2 (1.9) lists worktrees skipping the entry after each one not whole, fails to
/// look that one up, and its `git_branch_is_checked_out` takes the failure for "checked
/// out". With two such records every worktree add and every branch deletion of the
/// repository failed ("reference … is already checked out"): all of a run's attempts
/// failed (the soak, after a kill with four worktrees being made).
pub(super) fn remove_incomplete_records(
    repo: &git2::Repository,
    prefix: &str,
) -> Result<usize, RepoError> {
    let mut removed = 0;
    let Ok(entries) = std::fs::read_dir(repo.commondir().join("worktrees")) else {
        return Ok(removed);
    };
    for entry in entries.flatten() {
        // The name first: another run's or the user's records cost no stat (a deletion
        // asks this of every record, under the repository's lock).
        if !entry.file_name().to_string_lossy().starts_with(prefix) {
            continue;
        }
        let whole = ["commondir", "gitdir", "HEAD"]
            .iter()
            .all(|file| entry.path().join(file).is_file());
        if whole {
            continue;
        }
        let path = entry.path();
        match std::fs::remove_dir_all(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io("cannot remove the worktree's record", &path, e));
            }
            _ => removed += 1,
        }
    }
    Ok(removed)
}

/// Where git keeps its record of the worktree `name` (`.git/worktrees/<name>`).
pub(super) fn admin_dir(repo: &git2::Repository, name: &str) -> PathBuf {
    repo.commondir().join("worktrees").join(name)
}

/// The names of this run's worktrees as git records them, whole or half written.
pub(super) fn recorded_worktrees(
    repo: &git2::Repository,
    prefix: &str,
) -> Result<Vec<String>, RepoError> {
    let mut names: Vec<String> = repo
        .worktrees()
        .map_err(git)?
        .iter()
        .flatten()
        .flatten()
        .filter(|name| name.starts_with(prefix))
        .map(String::from)
        .collect();
    if let Ok(entries) = std::fs::read_dir(repo.commondir().join("worktrees")) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(prefix) && !names.contains(&name) {
                names.push(name);
            }
        }
    }
    Ok(names)
}

/// What runs that are over left in one repository: found by name, never through a run's
/// directory, so that a gc killed half way leaves nothing the next one cannot find.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Leftovers {
    /// Stale ref locks under `.git/refs/heads/flotilla/<run>/` (a process killed while it
    /// moved a task branch): they go first, or the branch could not be deleted.
    pub locks: Vec<PathBuf>,
    /// git's records of attempt worktrees (`flotilla-<run>-<dir>`), with the directory each
    /// stands for.
    pub worktrees: Vec<(String, PathBuf)>,
    /// Task branches (`flotilla/<run>/…`).
    pub branches: Vec<String>,
}

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.locks.is_empty() && self.worktrees.is_empty() && self.branches.is_empty()
    }
}

/// The run a name made by flotilla embeds (a run id's 32 hex digits).
fn run_in_name(simple: &str) -> Option<RunId> {
    (simple.len() == 32)
        .then(|| uuid::Uuid::try_parse(simple).ok().map(RunId::from_uuid))
        .flatten()
}

/// The `*.lock` files under `dir`, recursively.
fn lock_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(kind) if kind.is_dir() => lock_files(&path, found),
            Ok(_) if path.extension().is_some_and(|e| e == "lock") => found.push(path),
            _ => {}
        }
    }
}

/// The stale ref locks of `run` under `.git/refs/heads/flotilla/<run>/`.
pub(super) fn run_ref_locks(repo: &git2::Repository, run: RunId) -> Vec<PathBuf> {
    let mut found = Vec::new();
    lock_files(
        &repo
            .commondir()
            .join("refs/heads")
            .join(branch_prefix(run).trim_end_matches('/')),
        &mut found,
    );
    found.sort();
    found
}

/// Removes the stale ref locks of `run` ([`run_ref_locks`]): for a sweep, when no process
/// of the run writes a ref.
pub(super) fn remove_run_ref_locks(repo: &git2::Repository, run: RunId) -> Result<(), RepoError> {
    for path in run_ref_locks(repo, run) {
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io("cannot remove the stale lock", &path, e));
            }
            _ => {}
        }
    }
    Ok(())
}

/// What the runs in `over` left in the repository at `repo`; `root` is the state
/// directory's `worktrees`, where each run's attempt directories are.
pub fn leftovers(repo: &Path, root: &Path, over: &HashSet<RunId>) -> Result<Leftovers, RepoError> {
    let lock = repo_lock(repo);
    let _held = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let git = git2::Repository::open(repo).map_err(|_| RepoError::NotARepository(repo.into()))?;
    find_leftovers(&git, root, over)
}

fn find_leftovers(
    repo: &git2::Repository,
    root: &Path,
    over: &HashSet<RunId>,
) -> Result<Leftovers, RepoError> {
    let mut found = Leftovers::default();
    let mut runs = BTreeSet::new();
    for name in recorded_worktrees(repo, "flotilla-")? {
        let Some((run, dir)) = name
            .strip_prefix("flotilla-")
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(run, dir)| Some((run_in_name(run)?, dir.to_string())))
        else {
            continue;
        };
        if over.contains(&run) {
            let path = root.join(run.to_string()).join(dir);
            found.worktrees.push((name, path));
        }
    }
    for branch in repo.branches(Some(git2::BranchType::Local)).map_err(git)? {
        let (branch, _) = branch.map_err(git)?;
        let Some(name) = branch.name().ok().flatten() else {
            continue;
        };
        let run = name
            .strip_prefix("flotilla/")
            .and_then(|rest| rest.split_once('/'))
            .and_then(|(run, _)| run_in_name(run));
        if let Some(run) = run
            && over.contains(&run)
        {
            found.branches.push(name.to_string());
            runs.insert(run);
        }
    }
    // Locks are found per run directory of refs, whether or not a branch is left there.
    if let Ok(entries) = std::fs::read_dir(repo.commondir().join("refs/heads/flotilla")) {
        for entry in entries.flatten() {
            if let Some(run) = run_in_name(&entry.file_name().to_string_lossy())
                && over.contains(&run)
            {
                runs.insert(run);
            }
        }
    }
    for run in runs {
        found.locks.extend(run_ref_locks(repo, run));
    }
    found.worktrees.sort();
    found.branches.sort();
    Ok(found)
}

/// Removes `leftovers` (as [`leftovers`] found them) and says what was removed: locks
/// first, then worktrees, then branches, each step idempotent, so that a kill anywhere
/// leaves what the next gc finds again.
pub fn remove_leftovers(repo: &Path, leftovers: &Leftovers) -> Result<Leftovers, RepoError> {
    let lock = repo_lock(repo);
    let _held = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let git = git2::Repository::open(repo).map_err(|_| RepoError::NotARepository(repo.into()))?;
    let mut removed = Leftovers::default();
    for path in &leftovers.locks {
        match std::fs::remove_file(path) {
            Ok(()) => removed.locks.push(path.clone()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("cannot remove the stale lock", path, e)),
        }
    }
    for (name, path) in &leftovers.worktrees {
        prune(&git, name, path)?;
        removed.worktrees.push((name.clone(), path.clone()));
    }
    // Crash point (the gc tests): locks and worktrees gone, branches still there.
    fail::fail_point!("gc::after-worktrees", |_| {
        super::crash_here("gc::after-worktrees");
        Ok(Leftovers::default())
    });
    for branch in &leftovers.branches {
        if delete_branch(&git, branch)? {
            removed.branches.push(branch.clone());
        }
    }
    Ok(removed)
}
