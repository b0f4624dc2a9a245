//! The user's checkout of the run's target branch, "main" below (`[merge] branch`,
//! ADR-022; ADR-021): main moves under it only together with its index and work tree, under
//! git's own index lock, or not at all; HEAD is never detached.
//!
//! - [`move_main`] wraps the compare-and-swap of the target's ref. When main is checked out
//!   (the repository's work tree, or a linked worktree that is not flotilla's), it takes
//!   `index.lock` (as every git command that writes the index does), checks that the files
//!   the landing changes are exactly as main's current tip has them in the index and the
//!   work tree, writes them, moves the ref, then commits the new index (renaming the lock
//!   into place). The user's changes to other files are carried over, as `git switch`
//!   carries them. A user's change to a file the landing changes, a conflicted index or a
//!   lock held by another git command leaves everything as it was:
//!   [`MainRefError::CheckoutBusy`], and the MergeQueue tries again later.
//! - A crash in the middle leaves a record (`<gitdir>/flotilla-checkout`) beside the lock.
//!   [`heal`] (every `sync_checkout`, daemon start, run end) puts each file the landing
//!   touched, when the user has not changed it since, to main's current version in the work
//!   tree and the index, and releases the lock. Each file is written beside its place and
//!   renamed onto it, so a kill never leaves half of one (which the heal would take for the
//!   user's).
//! - [`sync`] brings a checkout whose index stands on an older commit of main's history (a
//!   crash of an older flotilla, or main moved by another tool) up to main's tip when the
//!   user changed nothing the move changes; otherwise it leaves everything as it is.
//!
//! All of it runs on blocking threads, under the per-repository lock (`repo_lock`). It must
//! not know runs, worktrees or the merge queue.

use std::cell::Cell;
use std::collections::HashMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use flotilla_actors::ports::{CheckoutSync, MainRefError, RepoError};

use super::index_lock::{
    INDEX_LOCK, IndexLock, NEW_INDEX_FILE, RECORD_FILE, Record, STAGED_LOCK_FILE, index_copy,
    index_for_move, keep_index, remove_record, write_record,
};
use super::target::TargetBranch;
use super::tree_delta::{PathChange as Change, changed_paths};
use super::{git, io, repo_lock};

/// How far back main's first-parent history [`sync`] looks for the commit the index holds.
const BASE_WALK: usize = 64;
/// At most this many of the user's clashing paths are named.
const MAX_NAMED: usize = 20;

// ---------------------------------------------------------------------------------------
// indexes known to be in step

/// Per checkout (its git directory): the checksum git ends its index file with and main's
/// tip, for an index [`sync`] has nothing to do with at that tip, because a move or a sync
/// just wrote it there, or a sync compared it (ADR-045). The checksum is the content's:
/// the same checksum is the same entries, so the next sync of that index at that tip reads
/// 20 bytes instead of comparing the whole index with the whole tree.
fn in_step() -> &'static InStep {
    static IN_STEP: OnceLock<InStep> = OnceLock::new();
    IN_STEP.get_or_init(Mutex::default)
}

type InStep = Mutex<HashMap<PathBuf, ([u8; 20], git2::Oid)>>;

thread_local! {
    static INDEX_COMPARES: Cell<u64> = const { Cell::new(0) };
}

/// How many times this thread compared a whole index with a whole tree: a counter for
/// tests.
pub fn index_compares() -> u64 {
    INDEX_COMPARES.with(Cell::get)
}

/// The checksum at the end of the checkout's index file; `None` without one (no index,
/// or git's `index.skipHash`, which writes zeros).
fn index_checksum(gitdir: &Path) -> Option<[u8; 20]> {
    let mut file = fs::File::open(gitdir.join("index")).ok()?;
    // A header (12 bytes) and the checksum at least.
    if file.metadata().ok()?.len() < 32 {
        return None;
    }
    file.seek(SeekFrom::End(-20)).ok()?;
    let mut sum = [0u8; 20];
    file.read_exact(&mut sum).ok()?;
    (sum != [0u8; 20]).then_some(sum)
}

fn remember_in_step(gitdir: &Path, sum: Option<[u8; 20]>, tip: git2::Oid) {
    let mut known = in_step().lock().unwrap_or_else(|p| p.into_inner());
    match sum {
        Some(sum) => known.insert(gitdir.to_path_buf(), (sum, tip)),
        None => known.remove(gitdir),
    };
}

fn is_in_step(gitdir: &Path, tip: git2::Oid) -> bool {
    let Some(sum) = index_checksum(gitdir) else {
        return false;
    };
    let known = in_step().lock().unwrap_or_else(|p| p.into_inner());
    known.get(gitdir) == Some(&(sum, tip))
}

/// The checkouts of the repository that may have main checked out: its own work tree and
/// the linked worktrees that are not flotilla's (theirs never check out main).
fn checkouts(repo: &git2::Repository) -> Vec<git2::Repository> {
    let mut found = Vec::new();
    if repo.is_bare() {
        return found;
    }
    if let Some(workdir) = repo.workdir()
        && let Ok(own) = git2::Repository::open(workdir)
    {
        found.push(own);
    }
    if let Ok(names) = repo.worktrees() {
        for name in names.iter().flatten().flatten() {
            if name.starts_with("flotilla-") {
                continue;
            }
            if let Ok(worktree) = repo.find_worktree(name)
                && worktree.validate().is_ok()
                && let Ok(opened) = git2::Repository::open_from_worktree(&worktree)
            {
                found.push(opened);
            }
        }
    }
    found
}

fn on_main(checkout: &git2::Repository, target: &TargetBranch) -> bool {
    let main = target.refname();
    checkout
        .find_reference("HEAD")
        .ok()
        .is_some_and(|head| head.symbolic_target_bytes() == Some(main.as_bytes()))
}

/// The checkout that has main checked out, if any.
fn checkout_of_main(repo: &git2::Repository, target: &TargetBranch) -> Option<git2::Repository> {
    checkouts(repo)
        .into_iter()
        .find(|checkout| on_main(checkout, target))
}

// ---------------------------------------------------------------------------------------
// the files a move changes

/// The files a move changes, read from the subtrees that differ only (ADR-045).
fn changes(
    repo: &git2::Repository,
    from: &git2::Tree<'_>,
    to: &git2::Tree<'_>,
) -> Result<Vec<Change>, RepoError> {
    changed_paths(repo, from, to).map_err(git)
}

const LINK: i32 = 0o120000;
const SUBMODULE: i32 = 0o160000;

/// A changed path's bytes as a path relative to the work tree (git's names need not be
/// UTF-8: never read through a lossy string).
fn rel(path: &[u8]) -> &Path {
    use std::os::unix::ffi::OsStrExt;
    Path::new(std::ffi::OsStr::from_bytes(path))
}

/// A changed path as a user reads it (only ever shown, never looked up again).
fn shown(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

/// What the work tree holds at `path`, as a blob id (a file's content, a link's target).
fn worktree_blob(workdir: &Path, path: &Path) -> Option<git2::Oid> {
    let full = workdir.join(path);
    let meta = fs::symlink_metadata(&full).ok()?;
    if meta.file_type().is_symlink() {
        use std::os::unix::ffi::OsStrExt;
        let target = fs::read_link(&full).ok()?;
        git2::Oid::hash_object(git2::ObjectType::Blob, target.as_os_str().as_bytes()).ok()
    } else if meta.is_file() {
        git2::Oid::hash_file(git2::ObjectType::Blob, &full).ok()
    } else {
        // A directory where a file is expected, or something else: never a blob.
        Some(git2::Oid::ZERO_SHA1)
    }
}

/// The paths among `changes` where the user has something of their own (in the index or
/// the work tree), against `before`: a move may not touch them.
fn clashes(
    checkout: &git2::Repository,
    index: &git2::Index,
    changes: &[Change],
) -> Result<Vec<String>, RepoError> {
    let workdir = checkout
        .workdir()
        .ok_or_else(|| RepoError::Git("the checkout has no work tree".into()))?;
    let mut clashing = Vec::new();
    for change in changes {
        let staged = index
            .get_path(rel(&change.path), 0)
            .map(|e| (e.id, e.mode as i32));
        if staged != change.before {
            clashing.push(shown(&change.path));
            continue;
        }
        let mine = match change.before {
            None => {
                fs::symlink_metadata(workdir.join(rel(&change.path))).is_ok() || {
                    // A file where the new path needs a directory.
                    rel(&change.path).ancestors().skip(1).any(|dir| {
                        !dir.as_os_str().is_empty()
                            && fs::symlink_metadata(workdir.join(dir)).is_ok_and(|m| !m.is_dir())
                    })
                }
            }
            Some((_, SUBMODULE)) => false,
            Some(_) => {
                let before = change.before.map(|(id, _)| id);
                match checkout.status_file(rel(&change.path)) {
                    // A name git reads as a pattern: compare the bytes themselves.
                    Err(_) => worktree_blob(workdir, rel(&change.path)) != before,
                    Ok(status) => status.intersects(
                        git2::Status::WT_MODIFIED
                            | git2::Status::WT_DELETED
                            | git2::Status::WT_TYPECHANGE
                            | git2::Status::WT_RENAMED
                            | git2::Status::CONFLICTED,
                    ),
                }
            }
        };
        if mine {
            clashing.push(shown(&change.path));
        }
    }
    Ok(clashing)
}

/// Writes `entry` at `path` in the work tree (or removes what is there) and puts the same
/// in `index`.
fn put(
    checkout: &git2::Repository,
    index: &mut git2::Index,
    path: &[u8],
    entry: Option<(git2::Oid, i32)>,
) -> Result<(), RepoError> {
    let workdir = checkout
        .workdir()
        .ok_or_else(|| RepoError::Git("the checkout has no work tree".into()))?;
    let full = workdir.join(rel(path));
    let remove = |full: &Path| match fs::symlink_metadata(full) {
        Ok(meta) if meta.is_dir() && !meta.file_type().is_symlink() => {
            fs::remove_dir_all(full).map_err(|e| io("cannot remove", full, e))
        }
        Ok(_) => fs::remove_file(full).map_err(|e| io("cannot remove", full, e)),
        Err(_) => Ok(()),
    };
    match entry {
        None => {
            remove(&full)?;
            // Directories the removal emptied go too, as git's checkout does.
            let mut dir = full.parent();
            while let Some(d) = dir {
                if d == workdir || fs::remove_dir(d).is_err() {
                    break;
                }
                dir = d.parent();
            }
            match index.remove_path(rel(path)) {
                Err(e) if e.code() != git2::ErrorCode::NotFound => Err(git(e)),
                _ => Ok(()),
            }
        }
        Some((id, SUBMODULE)) => {
            let entry = git2::IndexEntry {
                ctime: git2::IndexTime::new(0, 0),
                mtime: git2::IndexTime::new(0, 0),
                dev: 0,
                ino: 0,
                mode: SUBMODULE as u32,
                uid: 0,
                gid: 0,
                file_size: 0,
                id,
                flags: 0,
                flags_extended: 0,
                path: path.to_vec(),
            };
            index.add(&entry).map_err(git)
        }
        Some((id, mode)) => {
            let blob = checkout.find_blob(id).map_err(git)?;
            if let Some(parent) = full.parent() {
                fs::create_dir_all(parent).map_err(|e| io("cannot create", parent, e))?;
            }
            // A rename cannot replace a directory (the user's, where the landing has a
            // file); a file or a link it replaces whole.
            if fs::symlink_metadata(&full).is_ok_and(|m| m.is_dir()) {
                remove(&full)?;
            }
            let staged = staged_path(&full);
            let written = write_staged(&staged, blob.content(), mode)
                .and_then(|()| fs::rename(&staged, &full));
            if let Err(e) = written {
                let _ = fs::remove_file(&staged);
                return Err(io("cannot write", &full, e));
            }
            index.add_path(rel(path)).map_err(git)
        }
    }
}

/// Where [`put`] writes a file before renaming it onto `full`, in the same directory.
///
/// Why: a file written in place is half written when the daemon is killed in the middle,
/// and half a file is neither side of the move: [`heal`] took it for the user's change and
/// kept it, and every later landing of that file waited for the user for ever. Renamed
/// into place, the path holds the old version or the new one, never a part; what a kill
/// leaves under this name is removed by [`heal`].
fn staged_path(full: &Path) -> PathBuf {
    full.with_file_name(STAGED_FILE)
}

/// The name [`staged_path`] gives, reserved in every directory a landing writes to.
const STAGED_FILE: &str = ".flotilla-landing-new";

/// Writes `content` (a file's, or a link's target) at `staged` with `mode`'s permissions.
fn write_staged(staged: &Path, content: &[u8], mode: i32) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt;
    // What a kill left here is ours (the name is reserved).
    let _ = fs::remove_file(staged);
    if mode == LINK {
        use std::os::unix::ffi::OsStrExt;
        return std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(content), staged);
    }
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(staged)?;
    let (first, rest) = content.split_at(content.len() / 2);
    file.write_all(first)?;
    fail::fail_point!("checkout::mid-write", |_| {
        super::crash_here("checkout::mid-write");
        Ok(())
    });
    file.write_all(rest)?;
    let bits = if mode == 0o100755 { 0o755 } else { 0o644 };
    file.set_permissions(fs::Permissions::from_mode(bits))?;
    // With `--journal-sync full`, on the disk before it is renamed into place: after a power
    // loss an empty file would be neither side of the move, which the heal keeps as the
    // user's.
    super::ref_lock::sync_record(&file)
}

/// The paths, for a message: the first [`MAX_NAMED`] and how many more.
fn named(paths: &[String]) -> String {
    let mut text = paths
        .iter()
        .take(MAX_NAMED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if paths.len() > MAX_NAMED {
        text.push_str(&format!(" and {} more", paths.len() - MAX_NAMED));
    }
    text
}

// ---------------------------------------------------------------------------------------
// moving main

/// Moves main from `from` to `to` with `cas` (the compare-and-swap of the ref), bringing a
/// checked-out main's index and work tree along in the same step, under git's index lock.
pub fn move_main(
    repo: &git2::Repository,
    target: &TargetBranch,
    from: &str,
    to: &str,
    cas: impl FnOnce() -> Result<(), MainRefError>,
) -> Result<(), MainRefError> {
    // What a crash left first: its lock would otherwise keep this move out for good.
    let Some(checkout) = healed_checkout_of_main(repo, target)? else {
        return cas();
    };
    let gitdir = checkout.path().to_path_buf();
    let mut record = Record {
        from: from.to_string(),
        to: to.to_string(),
        lock_dev: 0,
        lock_ino: 0,
        lock_mtime_ns: None,
        branch: Some(target.name().to_string()),
    };
    // `heal` left no record: the one written here is this move's alone.
    let mut lock = match IndexLock::take_recorded(&gitdir, &mut record) {
        Ok(Some(lock)) => lock,
        Ok(None) => {
            remove_record(&gitdir);
            return Err(MainRefError::CheckoutBusy {
                detail: format!(
                    "another git command holds {} ({target} is checked out there)",
                    gitdir.join(INDEX_LOCK).display()
                ),
            });
        }
        Err(e) => {
            remove_record(&gitdir);
            return Err(e.into());
        }
    };
    // Whatever happens below, a move that does not finish leaves no record behind it.
    let result = move_locked(&checkout, target, &mut lock, from, to, cas);
    if lock.held {
        // Not committed: the index is as it was.
        let _ = fs::remove_file(gitdir.join(NEW_INDEX_FILE));
    }
    release(lock, &gitdir);
    result
}

/// Releases `lock` (when not committed), then removes the record naming it. In this order:
/// a kill between leaves a record naming no lock, which [`heal`] redoes under a lock of its
/// own; the other way round it left an `index.lock` no record named, which the heal took
/// for another git command's (every later landing busy, the user's git refused, for ever).
fn release(lock: IndexLock, gitdir: &Path) {
    drop(lock);
    fail::fail_point!("checkout::released", |_| {
        super::crash_here("checkout::released");
    });
    remove_record(gitdir);
}

fn move_locked(
    checkout: &git2::Repository,
    target: &TargetBranch,
    lock: &mut IndexLock,
    from: &str,
    to: &str,
    cas: impl FnOnce() -> Result<(), MainRefError>,
) -> Result<(), MainRefError> {
    fail::fail_point!("checkout::locked", |_| {
        super::crash_here("checkout::locked");
        Ok(())
    });
    let actual = checkout
        .refname_to_id(&target.refname())
        .map_err(git)?
        .to_string();
    if !on_main(checkout, target) {
        // The user switched away meanwhile: main is no longer under anyone.
        return cas();
    }
    if actual != from {
        return Err(MainRefError::Moved {
            expected: from.to_string(),
            actual,
        });
    }
    let oid = |s: &str| git2::Oid::from_str(s).map_err(git);
    let from_tree = checkout
        .find_commit(oid(from)?)
        .and_then(|c| c.tree())
        .map_err(git)?;
    let to_tree = checkout
        .find_commit(oid(to)?)
        .and_then(|c| c.tree())
        .map_err(git)?;
    let changes = changes(checkout, &from_tree, &to_tree)?;
    let (mut index, new_index) = index_for_move(checkout)?;
    if index.has_conflicts() {
        return Err(MainRefError::CheckoutBusy {
            detail: format!(
                "the checkout of {target} is in the middle of a merge (its index has conflicts)"
            ),
        });
    }
    let clashing = clashes(checkout, &index, &changes)?;
    if !clashing.is_empty() {
        return Err(MainRefError::CheckoutBusy {
            detail: format!(
                "the checkout of {target} has changes of its own in files this landing changes: {}",
                named(&clashing)
            ),
        });
    }
    let mut written = Vec::new();
    let applied = changes.iter().try_for_each(|change| {
        written.push(change);
        put(checkout, &mut index, &change.path, change.after)
    });
    let applied = applied.and_then(|()| write_index(checkout, &mut index));
    if let Err(e) = applied {
        undo(checkout, &mut index, &written);
        return Err(e.into());
    }
    fail::fail_point!("checkout::after-worktree", |_| {
        super::crash_here("checkout::after-worktree");
        Ok(())
    });
    if let Err(e) = cas() {
        undo(checkout, &mut index, &written);
        return Err(e);
    }
    tracing::debug!(from, to, "{target} moved; its checkout's index follows");
    fail::fail_point!("checkout::after-ref", |_| {
        super::crash_here("checkout::after-ref");
        Ok(())
    });
    let stamp = lock.commit(&new_index)?;
    // What else the index holds is the user's own staging, which a sync leaves alone.
    if let Ok(to) = git2::Oid::from_str(to) {
        let gitdir = checkout.path();
        remember_in_step(gitdir, index_checksum(gitdir), to);
    }
    // The next move starts from this index, unless something writes the file first.
    if let Some(stamp) = stamp {
        keep_index(checkout, index, stamp);
    }
    Ok(())
}

/// Writes `index`, the copy of the checkout's index a move or sync changed, to its own file
/// (flotilla's writer, ADR-052): an entry as new as the index file it replaces is looked at
/// again, as git's racily clean rule needs.
fn write_index(checkout: &git2::Repository, index: &mut git2::Index) -> Result<(), RepoError> {
    let since = fs::symlink_metadata(checkout.path().join("index"))
        .ok()
        .map(|m| {
            use std::os::unix::fs::MetadataExt;
            (m.mtime(), m.mtime_nsec() as u32)
        });
    super::index_file::write_user_index(checkout, index, since)
}

/// Puts back what a move that did not happen wrote in the work tree (`index`, our copy, is
/// discarded; the index on disk was never written). What cannot be put back is named in the
/// log; the files are the landing's, which the user had not changed.
fn undo(checkout: &git2::Repository, index: &mut git2::Index, written: &[&Change]) {
    for change in written {
        if let Err(e) = put(checkout, index, &change.path, change.before) {
            tracing::warn!(path = %shown(&change.path), error = %e, "putting a file of the checkout back");
        }
    }
}

// ---------------------------------------------------------------------------------------
// healing after a crash

/// Finishes or undoes what a crashed [`move_main`] left in any checkout of the repository:
/// every file the move touched that still holds the version before or after it gets main's
/// current version (in the work tree and the index), and the lock and record go. A lock that
/// is no longer the one the move took is someone else's: the record waits, and the next
/// move says the checkout is busy.
pub fn heal(repo: &git2::Repository) -> Result<Vec<String>, MainRefError> {
    heal_in(repo, &checkouts(repo))
}

/// [`heal`], then the checkout that has main checked out: one opening of the checkouts for
/// both on every landing (each opening reads their configs and makes their paths real).
/// Opened afresh when one was healed: the healed index is read from the file again.
fn healed_checkout_of_main(
    repo: &git2::Repository,
    target: &TargetBranch,
) -> Result<Option<git2::Repository>, MainRefError> {
    let found = checkouts(repo);
    if !heal_in(repo, &found)?.is_empty() {
        return Ok(checkout_of_main(repo, target));
    }
    Ok(found.into_iter().find(|checkout| on_main(checkout, target)))
}

/// [`heal`] of the checkouts `found` (the repository's, as [`checkouts`] lists them).
fn heal_in(
    repo: &git2::Repository,
    found: &[git2::Repository],
) -> Result<Vec<String>, MainRefError> {
    // A ref lock a killed landing left would keep every landing (and the user's own git)
    // out of the branch for good.
    super::ref_lock::heal(repo.commondir());
    let mut healed = Vec::new();
    for checkout in found {
        let gitdir = checkout.path().to_path_buf();
        // A kill right after a lock was taken may leave its staged name (a second link to
        // `index.lock`, or nothing): it holds nothing.
        let _ = fs::remove_file(gitdir.join(STAGED_LOCK_FILE));
        let text = match fs::read(gitdir.join(RECORD_FILE)) {
            Ok(text) => text,
            Err(_) => continue,
        };
        let parsed = serde_json::from_slice::<Record>(&text)
            .ok()
            .and_then(|record| Some((record.target()?, record)));
        let Some((target, record)) = parsed else {
            // Cut short while written (the lock was taken, nothing else done), or naming
            // no branch a target can be.
            tracing::warn!(gitdir = %gitdir.display(), "a checkout record that cannot be read; removing it");
            remove_record(&gitdir);
            continue;
        };
        let mut record = record;
        let lock = match IndexLock::left_by(&record, &gitdir) {
            Some(lock) => lock,
            // The record is rewritten to name the lock taken now, which a kill while
            // healing would otherwise leave unnamed.
            None => match IndexLock::take_recorded(&gitdir, &mut record)? {
                Some(lock) => lock,
                None => {
                    return Err(MainRefError::CheckoutBusy {
                        detail: format!(
                            "another git command holds {}; a landing interrupted there is healed after it",
                            gitdir.join(INDEX_LOCK).display()
                        ),
                    });
                }
            },
        };
        let at = heal_locked(checkout, &target, lock, &record)?;
        remove_record(&gitdir);
        // Said once nothing of the move is left (a test waits for these words).
        if let Some(at) = at {
            tracing::info!(workdir = ?checkout.workdir(), %at, "healed the checkout of {target} after an interrupted landing");
        }
        healed.push(
            checkout
                .workdir()
                .map(|w| w.display().to_string())
                .unwrap_or_default(),
        );
    }
    Ok(healed)
}

fn heal_locked(
    checkout: &git2::Repository,
    branch: &TargetBranch,
    mut lock: IndexLock,
    record: &Record,
) -> Result<Option<String>, RepoError> {
    let gitdir = checkout.path().to_path_buf();
    let _ = fs::remove_file(gitdir.join(NEW_INDEX_FILE));
    let main = checkout
        .refname_to_id(&branch.refname())
        .map_err(git)?
        .to_string();
    let oid = |s: &str| git2::Oid::from_str(s).map_err(git);
    let tree = |s: &str| -> Result<git2::Tree<'_>, RepoError> {
        checkout
            .find_commit(oid(s)?)
            .and_then(|c| c.tree())
            .map_err(git)
    };
    let workdir = checkout
        .workdir()
        .ok_or_else(|| RepoError::Git("the checkout has no work tree".into()))?
        .to_path_buf();
    let changes = changes(checkout, &tree(&record.from)?, &tree(&record.to)?)?;
    // Half a file a kill left on its way in (never the user's: the name is reserved), also
    // when the checkout is left as it is below: `git add -A` would commit it.
    for change in &changes {
        let _ = fs::remove_file(staged_path(&workdir.join(rel(&change.path))));
    }
    if !on_main(checkout, branch) {
        tracing::warn!(workdir = %workdir.display(), %branch, "an interrupted landing's checkout is no longer on its branch: left as it is");
        drop(lock);
        return Ok(None);
    }
    // main is where the move left it (before or after); anything else is someone else's
    // doing, and the index the move did not commit stays the one of before.
    let target = if main == record.to {
        &record.to
    } else {
        &record.from
    };
    let target_tree = tree(target)?;
    let (mut index, new_index) = index_copy(checkout)?;
    for change in &changes {
        let now = worktree_blob(&workdir, rel(&change.path));
        let ours = [change.before, change.after]
            .iter()
            .any(|side| side.map(|(id, _)| id) == now);
        if !ours {
            tracing::warn!(path = %shown(&change.path), "a file an interrupted landing touched was changed since: left as it is");
            continue;
        }
        let wanted = target_tree
            .get_path(rel(&change.path))
            .ok()
            .map(|e| (e.id(), e.filemode()));
        put(checkout, &mut index, &change.path, wanted)?;
    }
    write_index(checkout, &mut index)?;
    lock.commit(&new_index)?;
    Ok(Some(target.clone()))
}

// ---------------------------------------------------------------------------------------
// bringing a checkout that fell behind along

/// Brings the checkout of main to main's tip, HEAD on main. A checkout whose index holds an
/// older commit of main's first-parent history (up to [`BASE_WALK`] back) is brought to the
/// tip, under the index lock, when the user changed nothing the difference touches;
/// otherwise nothing is touched ([`CheckoutSync::Behind`]). HEAD is never detached. The tip
/// is read from the ref, never taken from the caller: a user who reset main meanwhile has
/// their index where they put it.
pub fn sync(repo: &git2::Repository, target: &TargetBranch) -> Result<CheckoutSync, RepoError> {
    let healed = healed_checkout_of_main(repo, target).map_err(|e| match e {
        MainRefError::Repo(e) => e,
        other => RepoError::Git(other.to_string()),
    })?;
    let Some(checkout) = healed else {
        return Ok(CheckoutSync::NotCheckedOut);
    };
    let main = target.refname();
    let tip = checkout
        .find_reference(&main)
        .and_then(|r| r.peel_to_commit())
        .map_err(git)?;
    let gitdir = checkout.path().to_path_buf();
    // Nearly always the index is the one the last move or sync left at this tip.
    if is_in_step(&gitdir, tip.id()) {
        return Ok(CheckoutSync::FastForwarded);
    }
    // A look without the lock first: nearly always the index is on the tip. Remembered
    // only if the index file did not change while it was read.
    let sum = index_checksum(&gitdir);
    let Some(behind) = index_base(&checkout, &checkout.index().map_err(git)?, &tip)? else {
        if sum.is_some() && sum == index_checksum(&gitdir) {
            remember_in_step(&gitdir, sum, tip.id());
        }
        return Ok(CheckoutSync::FastForwarded);
    };
    // Recorded like a move (main is at `to` already), before the lock is taken: a kill
    // while the lock is held is healed the same way.
    let mut record = Record {
        from: behind.id().to_string(),
        to: tip.id().to_string(),
        lock_dev: 0,
        lock_ino: 0,
        lock_mtime_ns: None,
        branch: Some(target.name().to_string()),
    };
    let mut lock = match IndexLock::take_recorded(&gitdir, &mut record) {
        Ok(Some(lock)) => lock,
        Ok(None) => {
            remove_record(&gitdir);
            // Another git command is at work there; the next landing or run start tries
            // again.
            return Ok(CheckoutSync::Behind {
                at: behind.id().to_string(),
                paths: Vec::new(),
            });
        }
        Err(e) => {
            remove_record(&gitdir);
            return Err(e);
        }
    };
    // Until the first file is written, every way out leaves nothing to heal: the lock goes,
    // then the record ([`release`]).
    let planned = (|| {
        let (index, new_index) = index_copy(&checkout)?;
        let tip = checkout
            .find_reference(&main)
            .and_then(|r| r.peel_to_commit())
            .map_err(git)?;
        let Some(base) = index_base(&checkout, &index, &tip)? else {
            let _ = fs::remove_file(&new_index);
            return Ok(Err(CheckoutSync::FastForwarded));
        };
        let changes = changes(
            &checkout,
            &base.tree().map_err(git)?,
            &tip.tree().map_err(git)?,
        )?;
        let clashing = clashes(&checkout, &index, &changes)?;
        if !clashing.is_empty() {
            let _ = fs::remove_file(&new_index);
            return Ok(Err(CheckoutSync::Behind {
                at: base.id().to_string(),
                paths: clashing.into_iter().take(MAX_NAMED).collect(),
            }));
        }
        // Under the lock, the index's base and main's tip may have moved since the look
        // above: the record names what is written.
        if record.from != base.id().to_string() || record.to != tip.id().to_string() {
            record.from = base.id().to_string();
            record.to = tip.id().to_string();
            write_record(&gitdir, &record)?;
        }
        Ok(Ok((index, new_index, changes)))
    })();
    let (mut index, new_index, changes) = match planned {
        Ok(Ok(plan)) => plan,
        Ok(Err(sync)) => {
            release(lock, &gitdir);
            return Ok(sync);
        }
        Err(e) => {
            let _ = fs::remove_file(gitdir.join(NEW_INDEX_FILE));
            release(lock, &gitdir);
            return Err(e);
        }
    };
    for change in &changes {
        put(&checkout, &mut index, &change.path, change.after)?;
    }
    write_index(&checkout, &mut index)?;
    lock.commit(&new_index)?;
    remove_record(&gitdir);
    if let Ok(tip) = git2::Oid::from_str(&record.to) {
        remember_in_step(&gitdir, index_checksum(&gitdir), tip);
    }
    Ok(CheckoutSync::FastForwarded)
}

/// The older commit of `tip`'s first-parent history whose tree `index` holds; `None` when
/// it holds `tip`'s, or none of them (the user's staged changes: nothing to tell apart).
fn index_base<'r>(
    checkout: &'r git2::Repository,
    index: &git2::Index,
    tip: &git2::Commit<'r>,
) -> Result<Option<git2::Commit<'r>>, RepoError> {
    if index.has_conflicts() {
        return Ok(None);
    }
    let holds = |commit: &git2::Commit<'_>| -> Result<bool, RepoError> {
        INDEX_COMPARES.with(|n| n.set(n.get().saturating_add(1)));
        let tree = commit.tree().map_err(git)?;
        let diff = checkout
            .diff_tree_to_index(Some(&tree), Some(index), None)
            .map_err(git)?;
        Ok(diff.deltas().len() == 0)
    };
    let mut candidate = tip.clone();
    for _ in 0..BASE_WALK {
        if holds(&candidate)? {
            return Ok((candidate.id() != tip.id()).then_some(candidate));
        }
        match candidate.parent(0) {
            Ok(parent) => candidate = parent,
            Err(_) => break,
        }
    }
    Ok(None)
}

/// [`heal`] and [`sync`] of `target`'s checkout for the repository at `path`, on a
/// blocking thread under the repository's lock: what gc and a run's end do. `None` when
/// `path` is no repository any more.
pub async fn heal_repository(
    path: PathBuf,
    target: TargetBranch,
) -> Result<Option<CheckoutSync>, RepoError> {
    tokio::task::spawn_blocking(move || {
        let lock = repo_lock(&path);
        let _held = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Ok(repo) = git2::Repository::open(&path) else {
            return Ok(None);
        };
        sync(&repo, &target).map(Some)
    })
    .await
    .map_err(|e| RepoError::Git(format!("the git thread failed: {e}")))?
}
