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
        Ok(b) => ref_lock::guarded_delete(repo, &refname, || {
            delete_unless_checked_out(repo, b.into_reference())
        }),
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

/// `git_branch_delete`'s check and deletion, at a fraction of its cost: to see whether a
/// worktree has the branch checked out, libgit2 opens every worktree's repository (its
/// configs, its paths made real), milliseconds a branch with a run's worktrees, and a landing
/// deletes its branches under the repository's lock, which the next landing's move of main
/// waits for (ADR-041). Here the same question is asked of each worktree's `HEAD` file, as
/// libgit2 asks it (a symbolic `HEAD` naming the branch). One difference: libgit2 also
/// removes the branch's `branch.<name>.*` config section, which flotilla never writes for its
/// task branches.
fn delete_unless_checked_out(
    repo: &git2::Repository,
    mut reference: git2::Reference<'_>,
) -> Result<(), git2::Error> {
    if let Some(holder) = checked_out_in(repo.commondir(), reference.name_bytes())? {
        return Err(git2::Error::new(
            git2::ErrorCode::GenericError,
            git2::ErrorClass::Reference,
            format!(
                "cannot delete branch {:?}: it is the current HEAD of {holder}",
                String::from_utf8_lossy(reference.name_bytes())
            ),
        ));
    }
    reference.delete()
}

/// The most of a `HEAD` file read: a symbolic one is `ref: ` and a ref name.
const MAX_HEAD_BYTES: u64 = 4096;

/// Which of the repository's checkouts (its own, or a worktree under `commondir/worktrees`)
/// has `refname` checked out, if one does. A worktree record without a `HEAD` is an error,
/// as it is to libgit2: a half-made record a kill left (`half_made_records_removed`).
pub(crate) fn checked_out_in(
    commondir: &Path,
    refname: &[u8],
) -> Result<Option<String>, git2::Error> {
    use std::io::Read;
    let names = |head: &[u8]| {
        head.strip_prefix(b"ref:")
            .map(|target| target.trim_ascii() == refname)
            .unwrap_or(false)
    };
    let read_head = |path: &Path| -> std::io::Result<Vec<u8>> {
        let mut head = Vec::new();
        std::fs::File::open(path)?
            .take(MAX_HEAD_BYTES)
            .read_to_end(&mut head)?;
        Ok(head)
    };
    let failed = |what: &Path, e: std::io::Error| {
        git2::Error::new(
            git2::ErrorCode::GenericError,
            git2::ErrorClass::Worktree,
            format!("cannot read {}: {e}", what.display()),
        )
    };
    let own = commondir.join("HEAD");
    match read_head(&own) {
        Ok(head) if names(&head) => return Ok(Some("the repository".into())),
        Ok(_) => {}
        Err(e) => return Err(failed(&own, e)),
    }
    let records = commondir.join("worktrees");
    let entries = match std::fs::read_dir(&records) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(failed(&records, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| failed(&records, e))?;
        // As libgit2 lists worktrees: a stray file there is none.
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let head = entry.path().join("HEAD");
        match read_head(&head) {
            Ok(text) if names(&text) => {
                return Ok(Some(format!(
                    "worktree {:?}",
                    entry.file_name().to_string_lossy()
                )));
            }
            Ok(_) => {}
            Err(e) => return Err(failed(&head, e)),
        }
    }
    Ok(None)
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
