//! Everything flotilla does to a git repository, on git2: reading the target branch
//! ([`reader`]), attempt worktrees ([`worktrees`]) and what a branch changed ([`branch_work`]), merging and the merge gate's scratch
//! checkouts ([`merge`]), moving main and keeping the user's checkout whole ([`checkout`]),
//! the records that let a killed daemon's ref locks be healed ([`ref_lock`]), and the
//! branch names ([`target`]). Here: what they all share (the repository lock, flotilla's
//! signature, branch deletion, the target's commit, git errors as [`RepoError`]).
//!
//! It implements the actors' git ports; it must not know the actors, the daemon, the
//! journal or the CLI.

pub mod ancestry;
pub mod background;
pub mod branch_work;
pub mod checkout;
pub mod conflict_fix;
pub mod diff;
pub mod handles;
pub mod index_file;
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
pub mod watch;
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

/// The daemon's process-wide libgit2 settings, set once before any repository is read.
///
/// Objects read are not hashed again to check them against their names (libgit2's
/// `GIT_OPT_ENABLE_STRICT_HASH_VERIFICATION`, on by default; git itself does not do it on
/// a read either). Only the user's own git and flotilla write to `.git`: every command run
/// for a task sees it read-only (ADR-015), so no agent can plant an object under a name
/// that is not its content's. The check cost a SHA-1 of every blob a workspace's checkout
/// wrote and of every tree a landing read (ADR-054).
pub fn configure_libgit2() {
    git2::opts::strict_hash_verification(false);
}

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
    // A kill's half-made records of the branch's run go first (the caller holds the
    // repository's lock, inside which every record is made whole): libgit2 took one for
    // the branch's checkout and kept a landed branch for good, and git's own commands
    // still stumble on them. A readdir and a few stats. One that cannot go is said, not
    // fatal: it holds nothing (`checked_out_in`).
    if let Err(e) = remove_half_made_records(repo, branch) {
        tracing::warn!(%branch, error = %e, "removing a kill's half-made worktree records");
    }
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
/// has `refname` checked out, if one does. A worktree record without a `HEAD` holds
/// nothing (git and libgit2 list no such worktree; both write `HEAD` last); a `HEAD` that
/// cannot be read, or is no plain file, is an error: what it names is unknown.
pub(crate) fn checked_out_in(
    commondir: &Path,
    refname: &[u8],
) -> Result<Option<String>, git2::Error> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let names = |head: &[u8]| {
        head.strip_prefix(b"ref:")
            .map(|target| target.trim_ascii() == refname)
            .unwrap_or(false)
    };
    // Never waited on: a FIFO put there would otherwise hold this read, and the
    // repository's lock with it, for ever. A `HEAD` that is a link is a symbolic ref to its
    // target (git's `core.preferSymlinkRefs`).
    let read_head = |path: &Path| -> std::io::Result<Vec<u8>> {
        if std::fs::symlink_metadata(path)?.is_symlink() {
            use std::os::unix::ffi::OsStrExt;
            let target = std::fs::read_link(path)?;
            return Ok([b"ref: ", target.as_os_str().as_bytes()].concat());
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)?;
        if !file.metadata()?.is_file() {
            return Err(std::io::Error::other("not a plain file"));
        }
        let mut head = Vec::new();
        file.take(MAX_HEAD_BYTES).read_to_end(&mut head)?;
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
        // As git lists worktrees: a stray file there is none; a link to a directory is
        // followed.
        if !std::fs::metadata(entry.path()).is_ok_and(|m| m.is_dir()) {
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
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(failed(&head, e)),
        }
    }
    Ok(None)
}

/// Removes the half-made worktree records of the run a task branch `flotilla/<run>/…`
/// belongs to. The caller holds the repository's lock.
fn remove_half_made_records(repo: &git2::Repository, branch: &str) -> Result<(), RepoError> {
    if let Some((run, _)) = branch
        .strip_prefix("flotilla/")
        .and_then(|rest| rest.split_once('/'))
    {
        leftovers::remove_incomplete_records(repo, &format!("flotilla-{run}-"))?;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    const BRANCH: &[u8] = b"refs/heads/flotilla/r/t1";

    fn commondir_with_head(head: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("HEAD"), head).unwrap();
        dir
    }

    fn record(commondir: &Path, name: &str, head: Option<&str>) -> PathBuf {
        let record = commondir.join("worktrees").join(name);
        std::fs::create_dir_all(&record).unwrap();
        if let Some(head) = head {
            std::fs::write(record.join("HEAD"), head).unwrap();
        }
        record
    }

    #[test]
    fn a_head_names_the_branch_however_its_line_ends() {
        for head in [
            "ref: refs/heads/flotilla/r/t1\n",
            "ref: refs/heads/flotilla/r/t1\r\n",
            "ref: refs/heads/flotilla/r/t1",
            "ref:refs/heads/flotilla/r/t1\n",
        ] {
            let dir = commondir_with_head(head);
            assert_eq!(
                checked_out_in(dir.path(), BRANCH).unwrap().as_deref(),
                Some("the repository"),
                "{head:?}"
            );
        }
        for head in [
            "ref: refs/heads/flotilla/r/t10\n",
            "ref: refs/heads/flotilla/r\n",
            "0123456789abcdef0123456789abcdef01234567\n",
            "",
        ] {
            let dir = commondir_with_head(head);
            assert_eq!(
                checked_out_in(dir.path(), BRANCH).unwrap(),
                None,
                "{head:?}"
            );
        }
    }

    /// A record without `HEAD` (a kill's, or a `git worktree add` under way) holds nothing:
    /// it must not stop every worktree add and branch deletion of the repository. A
    /// worktree's `HEAD` that is a FIFO is an error at once, not a read that never ends
    /// under the repository's lock; a record reached through a link is read.
    #[test]
    fn half_made_records_hold_nothing_a_fifo_is_refused_and_a_linked_record_is_read() {
        let dir = commondir_with_head("ref: refs/heads/main\n");
        record(dir.path(), "half", None);
        assert_eq!(checked_out_in(dir.path(), BRANCH).unwrap(), None);

        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(
            elsewhere.path().join("HEAD"),
            "ref: refs/heads/flotilla/r/t1\n",
        )
        .unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("worktrees/linked")).unwrap();
        assert_eq!(
            checked_out_in(dir.path(), BRANCH).unwrap().as_deref(),
            Some("worktree \"linked\"")
        );
        std::fs::remove_file(dir.path().join("worktrees/linked")).unwrap();

        let fifo = record(dir.path(), "fifo", None).join("HEAD");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path; mkfifo only reads it.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
        // On a thread: a read that waits on the FIFO fails the test instead of hanging it
        // (a writer opened and closed gives the reader its end).
        let commondir = dir.path().to_path_buf();
        let (answer, answered) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = answer.send(checked_out_in(&commondir, BRANCH).map_err(|e| e.to_string()));
        });
        let result = match answered.recv_timeout(std::time::Duration::from_secs(10)) {
            Ok(result) => result,
            Err(_) => {
                drop(std::fs::OpenOptions::new().write(true).open(&fifo));
                panic!("the read of a FIFO HEAD waited");
            }
        };
        let e = result.unwrap_err();
        assert!(e.contains("not a plain file"), "{e}");
        std::fs::remove_file(&fifo).unwrap();

        // A `HEAD` that is a link (git's `core.preferSymlinkRefs`) names its target.
        let linked_head = record(dir.path(), "symref", None).join("HEAD");
        std::os::unix::fs::symlink("refs/heads/flotilla/r/t1", &linked_head).unwrap();
        assert_eq!(
            checked_out_in(dir.path(), BRANCH).unwrap().as_deref(),
            Some("worktree \"symref\"")
        );
    }

    /// Deleting a task branch removes its own run's half-made records, and no one else's.
    #[test]
    fn a_deletion_heals_its_runs_half_made_records_and_leaves_others() {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init(dir.path()).unwrap();
        let tree = repo
            .find_tree(repo.index().unwrap().write_tree().unwrap())
            .unwrap();
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        let commit = repo
            .commit(Some("HEAD"), &sig, &sig, "first", &tree, &[])
            .unwrap();
        let commit = repo.find_commit(commit).unwrap();
        repo.branch("flotilla/run1/t1", &commit, false).unwrap();
        let commondir = repo.commondir().to_path_buf();
        record(&commondir, "flotilla-run1-t2-a1", None);
        // A kill's half-made record of the branch's own run that names it (no `gitdir`):
        // it would hold the branch if it were not removed first.
        record(
            &commondir,
            "flotilla-run1-t1-a1",
            Some("ref: refs/heads/flotilla/run1/t1\n"),
        );
        record(&commondir, "flotilla-run2-t1-a1", None);
        record(&commondir, "users-half", None);
        assert!(delete_branch(&repo, "flotilla/run1/t1").unwrap());
        assert!(
            repo.find_branch("flotilla/run1/t1", git2::BranchType::Local)
                .is_err()
        );
        let mut left: Vec<String> = std::fs::read_dir(commondir.join("worktrees"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["flotilla-run2-t1-a1", "users-half"]);
    }
}
