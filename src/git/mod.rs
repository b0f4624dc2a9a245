//! Everything flotilla does to a git repository, on git2: reading the target branch
//! ([`reader`]), attempt worktrees ([`worktrees`]) and what a branch changed ([`branch_work`]), merging and the merge gate's scratch
//! checkouts ([`merge`]), moving main and keeping the user's checkout whole ([`checkout`]),
//! the records that let a killed daemon's ref locks be healed ([`ref_lock`]), and the
//! branch names ([`target`]). Here: what they all share (the repository lock, flotilla's
//! signature, branch deletion, the target's commit, git errors as [`RepoError`]).
//!
//! It implements the actors' git ports; it must not know the actors, the daemon, the
//! journal or the CLI.

pub mod background;
pub mod branch_work;
pub mod checkout;
pub mod conflict_fix;
pub mod diff;
pub mod handles;
pub mod index_lock;
pub mod leftovers;
pub mod markers;
pub mod merge;
pub mod plain_checkout;
pub mod reader;
pub mod ref_lock;
pub mod seal_walk;
pub mod slots;
pub mod snapshot;
pub mod target;
pub mod tree_delta;
mod tree_read;
pub mod walk_record;
pub mod warm;
pub mod worktrees;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use flotilla_actors::ports::RepoError;

use self::target::TargetBranch;

/// Who flotilla's own commits are by: never a person (CI machines have no git identity, and
/// an agent's work must not look like the user's).
pub const FLOTILLA_NAME: &str = "flotilla";
pub const FLOTILLA_EMAIL: &str = "flotilla@localhost";

/// One lock per repository, for the whole daemon: what changes a repository's `.git`
/// (branches, worktree entries, main's ref, the checkout) is serialized per repository, so
/// two runs on it never race on a ref or on `.git/worktrees`.
pub(crate) fn repo_lock(repo: &Path) -> Arc<Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>> = OnceLock::new();
    // The path as given, then made real: the landing asks several times a cycle, and
    // making a path real reads every component's link (ADR-041, "a cheaper cycle").
    static SPELLED: OnceLock<Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>> = OnceLock::new();
    let spelled = SPELLED.get_or_init(Default::default);
    if let Some(lock) = spelled
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get(repo)
    {
        return lock.clone();
    }
    let real = std::fs::canonicalize(repo).ok();
    let key = real.clone().unwrap_or_else(|| repo.to_path_buf());
    let lock = LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .entry(key)
        .or_default()
        .clone();
    // A path not made real (not there yet) is made real again next time.
    if real.is_some() {
        spelled
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(repo.to_path_buf(), lock.clone());
    }
    lock
}

pub(crate) fn signature() -> Result<git2::Signature<'static>, RepoError> {
    git2::Signature::now(FLOTILLA_NAME, FLOTILLA_EMAIL).map_err(git)
}

/// Deletes a local branch; `false` when there was none.
///
/// Recorded for `ref_lock` (a kill inside it leaves the ref's lock, or `packed-refs.lock`).
/// A deletion refused for a lock heals the repository's ref locks and tries once more: a
/// killed flotilla's (its record proves it) kept the branch for good, since a landed task's
/// branch is deleted once, and nothing else would. The caller holds the repository's lock.
pub(crate) fn delete_branch(repo: &git2::Repository, branch: &str) -> Result<bool, RepoError> {
    let refname = format!("refs/heads/{branch}");
    let delete = |repo: &git2::Repository| match repo.find_branch(branch, git2::BranchType::Local) {
        Ok(mut b) => ref_lock::guarded_delete(repo, &refname, || b.delete()),
        Err(e) => Ok(Err(e)),
    };
    // With packed refs, on a handle of its own: the caller's may be kept between calls
    // (`handles`), and after a deletion failed on `packed-refs.lock` libgit2's cache of
    // packed refs on that handle no longer matches the file (a later deletion there
    // returned success and deleted nothing).
    let opened;
    let repo = if repo.commondir().join("packed-refs").exists() {
        opened = git2::Repository::open(repo.path()).map_err(git)?;
        &opened
    } else {
        repo
    };
    let deleted = match delete(repo)? {
        Err(e)
            if e.code() == git2::ErrorCode::Locked
                && !ref_lock::heal(repo.commondir()).is_empty() =>
        {
            // Opened again: libgit2 forgot a packed ref whose deletion failed on the lock
            // (its cache of packed refs had dropped it), and would call it gone.
            delete(&git2::Repository::open(repo.path()).map_err(git)?)?
        }
        // libgit2 takes a worktree record it cannot read for the branch's checkout: a half
        // made one of the branch's run (a kill's leftover, `leftovers`) goes, and once more.
        Err(e)
            if e.code() != git2::ErrorCode::NotFound
                && half_made_records_removed(repo, branch)? =>
        {
            delete(&git2::Repository::open(repo.path()).map_err(git)?)?
        }
        deleted => deleted,
    };
    match deleted {
        Ok(()) => Ok(true),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(false),
        Err(e) => Err(git(e)),
    }
}

/// Removes the half-made worktree records of the run a task branch `flotilla/<run>/…`
/// belongs to; whether there was any. The caller holds the repository's lock.
fn half_made_records_removed(repo: &git2::Repository, branch: &str) -> Result<bool, RepoError> {
    let Some((run, _)) = branch
        .strip_prefix("flotilla/")
        .and_then(|rest| rest.split_once('/'))
    else {
        return Ok(false);
    };
    Ok(leftovers::remove_incomplete_records(repo, &format!("flotilla-{run}-"))? > 0)
}

/// The commit local branch `branch` points at; `None` when there is no such branch.
pub(crate) fn branch_tip(
    repo: &git2::Repository,
    branch: &str,
) -> Result<Option<git2::Oid>, RepoError> {
    match repo.find_branch(branch, git2::BranchType::Local) {
        Ok(b) => Ok(Some(b.get().peel_to_commit().map_err(git)?.id())),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
        Err(e) => Err(git(e)),
    }
}

/// The target branch's commit; none when the branch does not exist (an unborn branch:
/// `git init` and nothing committed yet). Never another branch's: the run lands on this
/// one, and reading HEAD instead would build on what the compare-and-swap then refuses.
pub(crate) fn main_commit<'r>(
    repo: &'r git2::Repository,
    target: &TargetBranch,
) -> Result<Option<git2::Commit<'r>>, RepoError> {
    match repo.find_reference(&target.refname()) {
        Ok(reference) => reference.peel_to_commit().map(Some).map_err(git),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
        Err(e) => Err(git(e)),
    }
}

/// A git2 error as the ports say it.
pub(crate) fn git(e: git2::Error) -> RepoError {
    RepoError::Git(e.message().to_string())
}

/// A failed file operation on `path` as the ports say it.
pub(crate) fn io(what: &str, path: &Path, e: std::io::Error) -> RepoError {
    RepoError::Git(format!("{what} {}: {e}", path.display()))
}

/// What an armed fail point inside the checkout sync or gc does (the crash tests): SIGKILL.
/// Only with the `failpoints` feature (ADR-027).
#[cfg(feature = "failpoints")]
pub(crate) fn crash_here(point: &str) {
    tracing::error!(
        point,
        "fail point reached: the daemon kills itself (SIGKILL)"
    );
    // SAFETY: getpid and kill have no preconditions; SIGKILL cannot be caught.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}
