//! Git's lock on a ref (`refs/heads/<branch>.lock`) left behind by a killed daemon.
//!
//! Why: libgit2 moves a ref by creating `<ref>.lock`, writing the new value into it and
//! renaming it over the ref, all inside one call ([`git2::Repository::reference_matching`]).
//! A SIGKILL in between leaves the lock, and git never removes a lock it did not take: every
//! later landing would see [`MainRefError::Busy`](flotilla_actors::ports::MainRefError) and
//! wait forever, and the user's own `git commit` on that branch would fail too (ADR-021).
//!
//! So every ref update flotilla makes is wrapped by [`guarded`]: just before it, a record
//! `<commondir>/flotilla-ref-update.<pid>.<n>` names the lock git2 is about to take, the
//! process (pid and start time, so a reused pid is not mistaken for it) and the wall clock;
//! it is removed once the update returns, whatever the result. [`heal`] (run by
//! `checkout::heal`: before every landing, so also before a landing retried after `Busy`,
//! at the queue's start on a resume, at a run's end and in gc) takes each record whose
//! process is gone, removes the lock it names when the lock's modification time lies within
//! [`WINDOW_BEFORE_MS`]..[`WINDOW_AFTER_MS`] of the record's time (git2 creates the lock
//! right after the record is written; a lock the user's git took later falls outside and is
//! left alone), then removes the record. A lock no record names is never touched. It must
//! not know branches' meaning, runs or the checkout.
//!
//! A kill of the daemon loses nothing the kernel already holds, so a record needs no fsync
//! to be there for the heal after one. Only an OS crash or a power loss could keep the lock
//! and lose its record, which the journal itself survives only with `--journal-sync full`
//! (ADR-010): records (these and the checkout's, `index_lock`) are fsynced in that mode
//! alone ([`sync_records`], ADR-041 amended). Each fsync cost the landing 8–27 ms on a
//! loaded disk.

use std::cell::Cell;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use flotilla_actors::ports::RepoError;
use serde::{Deserialize, Serialize};

/// How a record's file name starts, in the repository's common git directory.
pub const RECORD_PREFIX: &str = "flotilla-ref-update.";
/// How a record being written is named before it is renamed into place (so that [`heal`]
/// never reads half a record).
const PARTIAL_PREFIX: &str = ".flotilla-ref-update-new.";
/// A lock older than the record by more than this is not the one the update took.
pub const WINDOW_BEFORE_MS: i128 = 2_000;
/// A lock newer than the record by more than this is someone else's, taken after the kill.
pub const WINDOW_AFTER_MS: i128 = 10_000;

/// Several updates of one process may run at once (different branches): each has its own
/// record.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// Whether records reach the disk before the update they name (the daemon's
/// `--journal-sync full`); on until the daemon says otherwise.
static SYNC_RECORDS: AtomicBool = AtomicBool::new(true);

thread_local! {
    static RECORD_SYNCS: Cell<u64> = const { Cell::new(0) };
}

/// Records are fsynced (with their directory) before the update they name: the daemon
/// turns it on with `--journal-sync full` (an OS crash must not lose what a heal needs)
/// and off otherwise (a kill loses nothing the kernel holds).
pub fn sync_records(on: bool) {
    SYNC_RECORDS.store(on, Ordering::Relaxed);
}

/// Syncs `file` (a record, or the directory a record was renamed in) when records are
/// synced.
pub(super) fn sync_record(file: &fs::File) -> std::io::Result<()> {
    if !SYNC_RECORDS.load(Ordering::Relaxed) {
        return Ok(());
    }
    RECORD_SYNCS.with(|n| n.set(n.get().saturating_add(1)));
    file.sync_all()
}

/// Syncs the directory `dir` a record was just renamed in, when records are synced: the
/// rename reaches the disk before what the record guards starts.
pub(super) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    if !SYNC_RECORDS.load(Ordering::Relaxed) {
        return Ok(());
    }
    sync_record(&fs::File::open(dir)?)
}

/// How many times this thread synced a record or its directory: a counter for tests.
pub fn record_syncs() -> u64 {
    RECORD_SYNCS.with(Cell::get)
}

/// What a ref update in progress leaves beside the refs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The lock git2 takes, relative to the common git directory (`refs/heads/main.lock`).
    pub lock: PathBuf,
    /// The process updating the ref.
    pub pid: u32,
    /// Its start time (field 22 of `/proc/<pid>/stat`, clock ticks since boot).
    pub start_time: u64,
    /// When the record was written (ms since the Unix epoch).
    pub at_ms: i128,
    /// The value the update writes (a commit id), when it writes one: libgit2 fills the
    /// lock with it just before the rename, so a lock holding anything else (another git
    /// command's, taken inside the window) is not this update's. A deletion writes none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// Runs `update` (one ref update of `refname` in `repo`) with a record of it on disk, so
/// that a kill inside it leaves a lock [`heal`] can take away. The record goes once
/// `update` returns, whatever it returns.
pub fn guarded<T>(
    repo: &git2::Repository,
    refname: &str,
    update: impl FnOnce() -> T,
) -> Result<T, RepoError> {
    guarded_lock(repo, refname, None, update)
}

/// [`guarded`] for an update that sets `refname` to `value`: the record names the value,
/// and [`heal`] removes only a lock that is empty or holds it.
pub fn guarded_to<T>(
    repo: &git2::Repository,
    refname: &str,
    value: git2::Oid,
    update: impl FnOnce() -> T,
) -> Result<T, RepoError> {
    guarded_lock(repo, refname, Some(value.to_string()), update)
}

/// [`guarded`] for the deletion of `refname`: when the repository has a `packed-refs`
/// file, libgit2 also rewrites it (through `packed-refs.lock`) if the ref is packed there
/// (a user's `git gc` or `git pack-refs` packs task branches too), and a kill inside that
/// write left a lock that failed every later deletion of a packed ref, flotilla's and the
/// user's (`git branch -d`, `git pack-refs`, `git gc`): that lock is recorded too.
pub fn guarded_delete<T>(
    repo: &git2::Repository,
    refname: &str,
    delete: impl FnOnce() -> T,
) -> Result<T, RepoError> {
    guarded_lock(repo, refname, None, || {
        if repo.commondir().join(PACKED_REFS).exists() {
            guarded_lock(repo, PACKED_REFS, None, delete)
        } else {
            Ok(delete())
        }
    })?
}

/// git's file of packed refs, in the common git directory: its lock is the one lock outside
/// `refs/` a record may name.
const PACKED_REFS: &str = "packed-refs";

/// Runs `update` with a record naming `<name>.lock` (relative to the common git directory).
fn guarded_lock<T>(
    repo: &git2::Repository,
    name: &str,
    value: Option<String>,
    update: impl FnOnce() -> T,
) -> Result<T, RepoError> {
    let dir = repo.commondir().to_path_buf();
    let record = Record {
        lock: PathBuf::from(format!("{name}.lock")),
        pid: std::process::id(),
        start_time: start_time(std::process::id()).unwrap_or(0),
        at_ms: now_ms(),
        value,
    };
    let path = write_record(&dir, &record).map_err(|e| {
        RepoError::Git(format!(
            "cannot record the update of {name} in {}: {e}",
            dir.display()
        ))
        .storage_or_self()
    })?;
    let result = update();
    if let Err(e) = fs::remove_file(&path) {
        tracing::warn!(record = %path.display(), error = %e, "cannot remove the record of a ref update");
    }
    Ok(result)
}

fn write_record(dir: &Path, record: &Record) -> std::io::Result<PathBuf> {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = format!("{}.{n}", record.pid);
    let partial = dir.join(format!("{PARTIAL_PREFIX}{name}"));
    let path = dir.join(format!("{RECORD_PREFIX}{name}"));
    let text = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    let written = (|| {
        let mut file = fs::File::create(&partial)?;
        file.write_all(&text)?;
        sync_record(&file)?;
        fs::rename(&partial, &path)?;
        // The rename itself reaches the disk before the ref update starts.
        sync_dir(dir)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&partial);
        let _ = fs::remove_file(&path);
        return Err(e);
    }
    Ok(path)
}

fn now_ms() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i128)
        .unwrap_or(0)
}

/// Field 22 of `/proc/<pid>/stat` (the process's start time); `None` when there is no such
/// process (or no `/proc`).
fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces and parentheses:
    // the fields after it start after the last `)`; field 3 is the first of them.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// Whether the process a record names still runs (the same process: a reused pid has
/// another start time).
fn alive(pid: u32, recorded_start: u64) -> bool {
    match start_time(pid) {
        Some(start) => start == recorded_start,
        // `/proc/<pid>` there but unreadable: assume it runs, and leave its lock alone.
        None => Path::new(&format!("/proc/{pid}")).exists(),
    }
}

/// Whether the pid a file name carries (`<prefix><pid>.<n>`) still names a process.
fn named_pid_exists(rest: &str) -> bool {
    match rest.split('.').next().and_then(|p| p.parse::<u32>().ok()) {
        Some(pid) => Path::new(&format!("/proc/{pid}")).exists(),
        None => false,
    }
}

/// Removes the ref locks that killed flotilla processes left in the repository whose common
/// git directory is `commondir`, and their records (see the module's notes). The locks
/// removed, relative to `commondir`. Never fails: what cannot be read or removed is said in
/// the log and left.
pub fn heal(commondir: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = fs::read_dir(commondir) else {
        return removed;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(rest) = name.strip_prefix(PARTIAL_PREFIX) {
            // Killed while writing the record: no ref update had started.
            if !named_pid_exists(rest) {
                let _ = fs::remove_file(entry.path());
            }
            continue;
        }
        if !name.starts_with(RECORD_PREFIX) {
            continue;
        }
        let path = entry.path();
        let record = match read_record(&path)
            .map_err(|e| e.to_string())
            .and_then(|bytes| serde_json::from_slice::<Record>(&bytes).map_err(|e| e.to_string()))
        {
            Ok(record) => record,
            Err(e) => {
                // Records are renamed into place whole: this one names nothing to trust.
                tracing::warn!(record = %path.display(), error = %e, "removing an unreadable record of a ref update");
                let _ = fs::remove_file(&path);
                continue;
            }
        };
        if alive(record.pid, record.start_time) {
            continue;
        }
        if let Some(lock) = stale_lock(commondir, &record) {
            match fs::remove_file(commondir.join(&lock)) {
                Ok(()) => {
                    tracing::warn!(
                        lock = %commondir.join(&lock).display(),
                        pid = record.pid,
                        "removed a ref lock a killed flotilla process left"
                    );
                    removed.push(lock);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(lock = %commondir.join(&lock).display(), error = %e, "cannot remove a ref lock a killed flotilla process left");
                    continue; // the record stays: the next heal tries again
                }
            }
        }
        if let Err(e) = fs::remove_file(&path) {
            tracing::warn!(record = %path.display(), error = %e, "cannot remove the record of a ref update");
        }
    }
    removed
}

/// A record's bytes, at most [`MAX_RECORD_BYTES`]: records are flotilla's own and small, and
/// a file someone grew under that name is cut, then refused as malformed JSON.
fn read_record(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    fs::File::open(path)?
        .take(MAX_RECORD_BYTES)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Far above a record's size (a path, two numbers and a time).
const MAX_RECORD_BYTES: u64 = 64 * 1024;

/// The lock a dead process's record names, when it exists, lies inside the repository's
/// refs and was made around the record's time.
fn stale_lock(commondir: &Path, record: &Record) -> Option<PathBuf> {
    let lock = &record.lock;
    // Only `refs/...*.lock` or `packed-refs.lock`, never a path leaving the git directory.
    let inside = (lock.starts_with("refs")
        && lock
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
        && lock.extension().is_some_and(|e| e == "lock"))
        || lock.as_os_str() == format!("{PACKED_REFS}.lock").as_str();
    if !inside {
        tracing::warn!(lock = %lock.display(), "a record of a ref update names no ref lock: ignored");
        return None;
    }
    let modified = fs::symlink_metadata(commondir.join(lock))
        .ok()?
        .modified()
        .ok()?;
    let modified_ms = match modified.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i128,
        Err(_) => return None,
    };
    let offset = modified_ms - record.at_ms;
    if (-WINDOW_BEFORE_MS..=WINDOW_AFTER_MS).contains(&offset) {
        if let Some(value) = &record.value {
            let held = read_record(&commondir.join(lock)).ok()?;
            let held = String::from_utf8_lossy(&held);
            if !held.trim().is_empty() && held.trim() != value {
                tracing::info!(lock = %lock.display(), "a ref lock holding another value than a killed update's is someone else's: left");
                return None;
            }
        }
        Some(lock.clone())
    } else {
        tracing::info!(lock = %lock.display(), offset_ms = %offset, "a ref lock taken long after a killed update's record is someone else's: left");
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        git2::Repository::init(dir.path()).unwrap();
        let git = dir.path().join(".git");
        fs::create_dir_all(git.join("refs/heads")).unwrap();
        (dir, git)
    }

    fn record_at(git: &Path, name: &str, pid: u32, start_time: u64, at_ms: i128) -> PathBuf {
        let record = Record {
            lock: PathBuf::from("refs/heads/main.lock"),
            pid,
            start_time,
            at_ms,
            value: None,
        };
        let path = git.join(format!("{RECORD_PREFIX}{name}"));
        fs::write(&path, serde_json::to_vec(&record).unwrap()).unwrap();
        path
    }

    fn lock(git: &Path) -> PathBuf {
        let lock = git.join("refs/heads/main.lock");
        fs::write(&lock, "0123456789012345678901234567890123456789\n").unwrap();
        lock
    }

    /// A pid that no longer runs: a child that has exited and been reaped.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn a_dead_process_lock_in_the_window_is_removed_with_its_record() {
        let (_dir, git) = repo();
        let lock = lock(&git);
        let record = record_at(&git, "1.0", dead_pid(), 1, now_ms());
        assert_eq!(heal(&git), vec![PathBuf::from("refs/heads/main.lock")]);
        assert!(!lock.exists());
        assert!(!record.exists());
    }

    #[test]
    fn a_reused_pid_counts_as_dead() {
        let (_dir, git) = repo();
        let lock = lock(&git);
        let me = std::process::id();
        let start = start_time(me).unwrap();
        let record = record_at(&git, "2.0", me, start + 1, now_ms());
        assert_eq!(heal(&git).len(), 1);
        assert!(!lock.exists());
        assert!(!record.exists());
    }

    #[test]
    fn a_live_process_lock_and_record_are_kept() {
        let (_dir, git) = repo();
        let lock = lock(&git);
        let me = std::process::id();
        let record = record_at(&git, "3.0", me, start_time(me).unwrap(), now_ms());
        assert!(heal(&git).is_empty());
        assert!(lock.exists());
        assert!(record.exists());
    }

    #[test]
    fn a_lock_outside_the_window_is_kept_and_the_record_goes() {
        let (_dir, git) = repo();
        let lock = lock(&git);
        // The record is a minute older than the lock: the lock was taken after the kill.
        let record = record_at(&git, "4.0", dead_pid(), 1, now_ms() - 60_000);
        assert!(heal(&git).is_empty());
        assert!(lock.exists());
        assert!(!record.exists());
        // A lock older than the record is not the update's either.
        let record = record_at(&git, "4.1", dead_pid(), 1, now_ms() + 60_000);
        assert!(heal(&git).is_empty());
        assert!(lock.exists());
        assert!(!record.exists());
    }

    #[test]
    fn a_dead_process_packed_refs_lock_in_the_window_is_removed() {
        let (_dir, git) = repo();
        let lock = git.join("packed-refs.lock");
        fs::write(&lock, "# pack-refs with: peeled fully-peeled sorted \n").unwrap();
        let record = Record {
            lock: PathBuf::from("packed-refs.lock"),
            pid: dead_pid(),
            start_time: 1,
            at_ms: now_ms(),
            value: None,
        };
        let path = git.join(format!("{RECORD_PREFIX}7.0"));
        fs::write(&path, serde_json::to_vec(&record).unwrap()).unwrap();
        assert_eq!(heal(&git), vec![PathBuf::from("packed-refs.lock")]);
        assert!(!lock.exists());
        assert!(!path.exists());
    }

    #[test]
    fn a_lock_holding_another_value_than_the_records_is_kept() {
        let (_dir, git) = repo();
        let ours = "0123456789012345678901234567890123456789";
        let theirs = "9876543210987654321098765432109876543210";
        let lock = git.join("refs/heads/main.lock");
        for (held, removed) in [(theirs, false), (ours, true), ("", true)] {
            fs::write(&lock, format!("{held}\n")).unwrap();
            let record = Record {
                lock: PathBuf::from("refs/heads/main.lock"),
                pid: dead_pid(),
                start_time: 1,
                at_ms: now_ms(),
                value: Some(ours.to_string()),
            };
            let path = git.join(format!("{RECORD_PREFIX}8.0"));
            fs::write(&path, serde_json::to_vec(&record).unwrap()).unwrap();
            assert_eq!(heal(&git).is_empty(), !removed, "{held:?}");
            assert_eq!(lock.exists(), !removed, "{held:?}");
            assert!(!path.exists());
            let _ = fs::remove_file(&lock);
        }
    }

    #[test]
    fn a_lock_no_record_names_is_kept() {
        let (_dir, git) = repo();
        let lock = lock(&git);
        assert!(heal(&git).is_empty());
        assert!(lock.exists());
    }

    #[test]
    fn a_malformed_record_goes_and_the_lock_stays() {
        let (_dir, git) = repo();
        let lock = lock(&git);
        let record = git.join(format!("{RECORD_PREFIX}5.0"));
        fs::write(&record, "{\"lock\": ").unwrap();
        assert!(heal(&git).is_empty());
        assert!(lock.exists());
        assert!(!record.exists());
    }

    #[test]
    fn a_record_naming_a_path_outside_the_refs_is_ignored() {
        let (_dir, git) = repo();
        let outside = git.join("config.lock");
        fs::write(&outside, "x").unwrap();
        let record = Record {
            lock: PathBuf::from("refs/../config.lock"),
            pid: dead_pid(),
            start_time: 1,
            at_ms: now_ms(),
            value: None,
        };
        let path = git.join(format!("{RECORD_PREFIX}6.0"));
        fs::write(&path, serde_json::to_vec(&record).unwrap()).unwrap();
        assert!(heal(&git).is_empty());
        assert!(outside.exists());
        assert!(!path.exists());
    }

    #[test]
    fn guarded_removes_its_record_whatever_the_update_returns() {
        let (dir, git) = repo();
        let repo = git2::Repository::open(dir.path()).unwrap();
        let seen = guarded(&repo, "refs/heads/main", || {
            let records: Vec<Record> = fs::read_dir(&git)
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(RECORD_PREFIX))
                .map(|e| serde_json::from_slice(&fs::read(e.path()).unwrap()).unwrap())
                .collect();
            Err::<(), _>(records)
        })
        .unwrap();
        let records = seen.unwrap_err();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].lock, PathBuf::from("refs/heads/main.lock"));
        assert_eq!(records[0].pid, std::process::id());
        assert_eq!(
            records[0].start_time,
            start_time(std::process::id()).unwrap()
        );
        let left = fs::read_dir(&git)
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .contains("flotilla-ref-update")
            })
            .count();
        assert_eq!(left, 0);
    }

    /// Records are written and removed either way; they reach the disk first (the record,
    /// then its directory) only when records are synced (`--journal-sync full`).
    #[test]
    fn a_record_is_synced_only_when_records_are() {
        let (dir, git) = repo();
        let repo = git2::Repository::open(dir.path()).unwrap();
        let recorded = |repo: &git2::Repository| {
            let before = record_syncs();
            let seen = guarded(repo, "refs/heads/main", || {
                fs::read_dir(&git)
                    .unwrap()
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(RECORD_PREFIX))
                    .count()
            })
            .unwrap();
            (seen, record_syncs() - before)
        };
        // The checkout's move record (index_lock) the same way: the record, then the
        // directory it was renamed in. One test, so no other flips the switch meanwhile.
        let moved = || {
            let before = record_syncs();
            let record = super::super::index_lock::Record {
                from: "a".into(),
                to: "b".into(),
                lock_dev: 0,
                lock_ino: 0,
                lock_mtime_ns: None,
                branch: None,
            };
            super::super::index_lock::write_record(&git, &record).unwrap();
            record_syncs() - before
        };
        sync_records(false);
        let unsynced = (recorded(&repo), moved());
        sync_records(true);
        let synced = (recorded(&repo), moved());
        assert_eq!(unsynced, ((1, 0), 0));
        assert_eq!(synced, ((1, 2), 2));
    }
}
