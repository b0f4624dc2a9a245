//! git's lock on a checkout's index (`index.lock`, taken as git takes it) and flotilla's
//! record of a move of main in progress beside it (`<gitdir>/flotilla-checkout`): what a
//! crash in the middle of a landing leaves, so that `checkout::heal` can put the checkout
//! right. It must not know what a move changes or how it is healed.

use std::cell::Cell;
use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use flotilla_actors::ports::RepoError;
use serde::{Deserialize, Serialize};

use super::target::TargetBranch;
use super::{git, io};

/// The record of a move in progress, in the checkout's git directory.
pub const RECORD_FILE: &str = "flotilla-checkout";
/// The new index while it is being written, in the checkout's git directory.
pub(super) const NEW_INDEX_FILE: &str = "flotilla-index";
/// Git's lock on a checkout's index.
pub const INDEX_LOCK: &str = "index.lock";
/// The lock file before it becomes [`INDEX_LOCK`], in the checkout's git directory: made
/// under this name first so that the record can name it before `index.lock` exists.
pub(super) const STAGED_LOCK_FILE: &str = "flotilla-index-lock";

/// `index.lock`, created by us (exclusively, as git does).
pub(super) struct IndexLock {
    path: PathBuf,
    /// Released (removed) when dropped unless committed or kept for
    /// `checkout::heal`.
    pub(super) held: bool,
}

impl IndexLock {
    /// The lock, with `record` (naming it) written before it exists; `None` when another
    /// process holds it (the record stays written: the caller decides what becomes of it).
    ///
    /// The file is made under [`STAGED_LOCK_FILE`], named in the record, then hard-linked to
    /// `index.lock` (exclusive, as git's `O_EXCL` create). Taken the other way round, a kill
    /// between the lock and the record left an `index.lock` that no record named: `checkout::heal`
    /// took it for another git command's, and every later landing was busy for ever.
    pub(super) fn take_recorded(
        gitdir: &Path,
        record: &mut Record,
    ) -> Result<Option<IndexLock>, RepoError> {
        let path = gitdir.join(INDEX_LOCK);
        let staged = gitdir.join(STAGED_LOCK_FILE);
        // A kill between the link and the removal below leaves it; it holds nothing.
        let _ = fs::remove_file(&staged);
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&staged)
            .map_err(|e| io("cannot take git's index lock", &staged, e))?;
        let meta = file.metadata().map_err(|e| io("cannot read", &staged, e))?;
        drop(file);
        record.lock_dev = meta.dev();
        record.lock_ino = meta.ino();
        record.lock_mtime_ns = Some(mtime_ns(&meta));
        let linked =
            write_record(gitdir, record).and_then(|()| match fs::hard_link(&staged, &path) {
                Ok(()) => Ok(Some(IndexLock {
                    path: path.clone(),
                    held: true,
                })),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(None),
                Err(e) => Err(io("cannot take git's index lock", &path, e)),
            });
        let _ = fs::remove_file(&staged);
        if matches!(linked, Ok(Some(_))) {
            fail::fail_point!("checkout::lock-taken", |_| {
                super::crash_here("checkout::lock-taken");
                Ok(None)
            });
        }
        linked
    }

    /// The lock a crashed move left, when the file there is still the one it made.
    pub(super) fn left_by(record: &Record, gitdir: &Path) -> Option<IndexLock> {
        let path = gitdir.join(INDEX_LOCK);
        let meta = fs::symlink_metadata(&path).ok()?;
        // The file's mtime too: a record may outlive its lock (a kill after the lock went),
        // and the file system hands a freed inode to the next file made, maybe another git
        // command's `index.lock`. The lock's content is never written, so its mtime stays
        // its creation's. (A record of an older flotilla has none.)
        let ours = meta.dev() == record.lock_dev
            && meta.ino() == record.lock_ino
            && record.lock_mtime_ns.is_none_or(|at| at == mtime_ns(&meta));
        // Built only when it is ours: a dropped `IndexLock` removes its file, and one built
        // for a lock that is not ours (`then_some` builds it either way) removed another git
        // command's `index.lock` from under it.
        ours.then(|| IndexLock { path, held: true })
    }

    /// Puts `new_index` in place (renamed onto `index`), then releases the lock.
    ///
    /// Why not as git does (the new index into the lock, the lock onto `index`): the first
    /// rename replaced the file the record names by another, and a kill between the two
    /// left an `index.lock` no record named, which `checkout::heal` took for another git
    /// command's: every later landing was busy for ever, and the user's own git refused
    /// to run. Renamed this way, a kill between the two leaves the recorded lock, and the
    /// heal finds the index already at the move's end.
    ///
    /// Returns the committed index file's stamp, taken while the lock still keeps every
    /// other git command from replacing it (`None`: it has no checksum to tell it by).
    pub(super) fn commit(&mut self, new_index: &Path) -> Result<Option<IndexStamp>, RepoError> {
        let index = self.path.with_file_name("index");
        fs::rename(new_index, &index).map_err(|e| io("cannot write", &index, e))?;
        fail::fail_point!("checkout::mid-commit", |_| {
            super::crash_here("checkout::mid-commit");
            Ok(None)
        });
        let stamp = index_stamp(&index);
        // The index is committed whatever comes of the release.
        self.held = false;
        match fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(lock = %self.path.display(), error = %e, "cannot release git's index lock");
            }
            _ => {}
        }
        Ok(stamp)
    }
}

impl Drop for IndexLock {
    fn drop(&mut self) {
        if self.held {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// A move in progress: written once the lock is held, removed once it is released.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Record {
    pub(super) from: String,
    pub(super) to: String,
    pub(super) lock_dev: u64,
    pub(super) lock_ino: u64,
    /// The lock file's mtime (ns since the epoch), which tells it from a later file given
    /// the same inode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) lock_mtime_ns: Option<i128>,
    /// The branch that moved (ADR-022): `checkout::heal` needs no run to know it. A record of a
    /// flotilla before ADR-022 names none: `main`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) branch: Option<String>,
}

impl Record {
    /// The branch the record's move was of; `None` when the name is not one a target can
    /// have (a record written by hand): nothing is healed on its word.
    pub(super) fn target(&self) -> Option<TargetBranch> {
        TargetBranch::of_run(self.branch.as_deref()).ok()
    }
}

/// A file's mtime in ns since the epoch.
fn mtime_ns(meta: &fs::Metadata) -> i128 {
    i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec())
}

pub(super) fn write_record(gitdir: &Path, record: &Record) -> Result<(), RepoError> {
    let path = gitdir.join(RECORD_FILE);
    let temporary = gitdir.join(format!("{RECORD_FILE}.new"));
    let text = serde_json::to_vec(record).map_err(|e| RepoError::Git(e.to_string()))?;
    let mut file = fs::File::create(&temporary).map_err(|e| io("cannot write", &temporary, e))?;
    file.write_all(&text)
        .and_then(|_| super::ref_lock::sync_record(&file))
        .map_err(|e| io("cannot write", &temporary, e))?;
    fs::rename(&temporary, &path).map_err(|e| io("cannot write", &path, e))?;
    // With `--journal-sync full` the rename reaches the disk before the move starts.
    super::ref_lock::sync_dir(gitdir).map_err(|e| io("cannot sync", gitdir, e))
}

pub(super) fn remove_record(gitdir: &Path) {
    let _ = fs::remove_file(gitdir.join(RECORD_FILE));
}

// ---------------------------------------------------------------------------------------
// the index a move last committed, kept parsed

/// What an index file is: where it lives (device, inode), its size, times and the checksum
/// git ends it with (a hash of all its bytes). The same stamp is the same bytes: every git
/// command replaces the index by a new file (a new inode, a new checksum for new content).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct IndexStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    sum: [u8; 20],
}

/// The stamp of the index file at `path`; `None` without a checksum (no file, a short one,
/// or git's `index.skipHash`, which writes zeros).
pub(super) fn index_stamp(path: &Path) -> Option<IndexStamp> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = fs::File::open(path).ok()?;
    let meta = file.metadata().ok()?;
    // A header (12 bytes) and the checksum at least.
    if meta.len() < 32 {
        return None;
    }
    file.seek(SeekFrom::End(-20)).ok()?;
    let mut sum = [0u8; 20];
    file.read_exact(&mut sum).ok()?;
    (sum != [0u8; 20]).then_some(IndexStamp {
        dev: meta.dev(),
        ino: meta.ino(),
        len: meta.len(),
        mtime_ns: mtime_ns(&meta),
        ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
        sum,
    })
}

/// The index a move committed, parsed, with the stamp of the file it became.
struct Kept {
    stamp: IndexStamp,
    index: git2::Index,
}

// SAFETY: a kept index is owned by nothing else: [`keep_index`] detaches it from the
// repository it served first (libgit2 then holds no other reference to it), and it is only
// ever used by the thread that took it out of the map, under the map's lock until then.
unsafe impl Send for Kept {}

/// Per checkout (its git directory): the index flotilla's last move committed there.
fn kept() -> &'static Mutex<HashMap<PathBuf, Kept>> {
    static KEPT: OnceLock<Mutex<HashMap<PathBuf, Kept>>> = OnceLock::new();
    KEPT.get_or_init(Mutex::default)
}

thread_local! {
    static INDEX_READS: Cell<u64> = const { Cell::new(0) };
}

/// How many times this thread read a checkout's whole index for a move: a counter for
/// tests.
pub fn index_reads() -> u64 {
    INDEX_READS.with(Cell::get)
}

/// The checkout's index for a move, made the repository's index in memory, writing to
/// [`NEW_INDEX_FILE`]: the one the last move committed when the file is still exactly the
/// one it became (nothing wrote it since), else a copy of the file, read whole.
pub(super) fn index_for_move(
    checkout: &git2::Repository,
) -> Result<(git2::Index, PathBuf), RepoError> {
    let gitdir = checkout.path();
    let copy = gitdir.join(NEW_INDEX_FILE);
    let taken = kept()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(gitdir);
    if let Some(Kept { stamp, mut index }) = taken
        && index_stamp(&gitdir.join("index")) == Some(stamp)
        && index.path() == Some(copy.as_path())
    {
        // What a kill left of a copy and its lock (see `index_copy`).
        let _ = fs::remove_file(gitdir.join(format!("{NEW_INDEX_FILE}.lock")));
        let _ = fs::remove_file(&copy);
        checkout.set_index(&mut index).map_err(git)?;
        return Ok((index, copy));
    }
    INDEX_READS.with(|n| n.set(n.get() + 1));
    index_copy(checkout)
}

/// Keeps `index`, which the move just committed as the checkout's index file `stamp`, for
/// the next move (taken off the repository first: it must be nobody else's).
pub(super) fn keep_index(checkout: &git2::Repository, index: git2::Index, stamp: IndexStamp) {
    let Ok(mut nothing) = git2::Index::new() else {
        return;
    };
    if checkout.set_index(&mut nothing).is_err() {
        return;
    }
    kept()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(checkout.path().to_path_buf(), Kept { stamp, index });
}

/// A copy of the checkout's index, made the repository's index in memory, that writes to
/// [`NEW_INDEX_FILE`] (never to `index`, whose lock we hold).
pub(super) fn index_copy(checkout: &git2::Repository) -> Result<(git2::Index, PathBuf), RepoError> {
    let gitdir = checkout.path();
    let copy = gitdir.join(NEW_INDEX_FILE);
    let index = gitdir.join("index");
    // libgit2 writes the copy through `<copy>.lock`, which a kill in the middle leaves: every
    // later write of the copy then failed ("the index is locked"), the heal included, and
    // every landing failed with it. The copy is ours alone while git's `index.lock` is held
    // by us, so is its lock.
    let _ = fs::remove_file(gitdir.join(format!("{NEW_INDEX_FILE}.lock")));
    match fs::copy(&index, &copy) {
        Ok(_) => {
            // The copy as old as the index: libgit2 takes its file's time for when the
            // index was written, and trusts the stat of any entry older than that (its
            // racily clean rule), so a later time would trust too much.
            fs::metadata(&index)
                .and_then(|m| m.modified())
                .and_then(|written| {
                    fs::File::options()
                        .write(true)
                        .open(&copy)?
                        .set_times(fs::FileTimes::new().set_modified(written))
                })
                .map_err(|e| {
                    let _ = fs::remove_file(&copy);
                    io("cannot keep the time of", &index, e)
                })?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let _ = fs::remove_file(&copy);
        }
        Err(e) => return Err(io("cannot copy", &index, e)),
    }
    let mut opened = git2::Index::open(&copy).map_err(git)?;
    checkout.set_index(&mut opened).map_err(git)?;
    Ok((opened, copy))
}
