//! flotilla's record of an attempt directory (ADR-044, ADR-046): each file its checkout
//! wrote, with the blob, mode and full `lstat` read right after, and the tree they make.
//! The reset of a parked directory trusts a file only if its stat is still exactly this;
//! the seal hashes only the files whose stat is not.
//!
//! Its own file format (not git's index): read and written whole in one pass, with 64-bit
//! stat fields, and the tree id the reset diffs the next start against. The worktree's own
//! index (for the agent's git) is written from the same entries by `index_file::write_index`, in
//! git's format, without libgit2 parsing, sorting and hashing an index entry by entry.
//!
//! The daemon keeps the records it wrote or read last in memory ([`Snapshot::read`], bounded
//! by [`MAX_KEPT_BYTES`], dropped with their files and their run's sweep): each
//! file holds a random nonce, and a file whose nonce and length are those of a kept record
//! is that record (only flotilla writes these files, each write with a new nonce, where no
//! agent can reach). A 10,000-file record took 2.5 ms to read and parse, twice a task.
//! It must not know worktree records, the journal or the actors.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use flotilla_actors::ports::RepoError;
use git2::Oid;

use super::io;

const MAGIC: &[u8; 8] = b"FLOSNAP2";
/// The random bytes after the magic that name one write of a record.
const NONCE_BYTES: usize = 16;
/// At most this much memory (as [`Snapshot::memory`] counts it) for the records kept in
/// memory, all together; the least recently used go first. A 10,000-file record takes about
/// 1.3 MB.
const MAX_KEPT_BYTES: usize = 64 << 20;
/// More entries than any tree this could record: a longer count is a damaged file.
const MAX_ENTRIES: u64 = 50_000_000;
/// The fewest bytes an entry takes in the file (a one-byte path): caps what a count
/// read from the file may reserve.
const MIN_ENTRY_BYTES: usize = 64;
/// How much of a record is built before it is written.
const CHUNK: usize = 64 << 10;
/// git's own limit on a path's length in practice (PATH_MAX); longer is a damaged file.
const MAX_PATH: u32 = 4096;

/// A file's `lstat`, as the reset and the seal compare it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stat {
    pub ctime: (i64, u32),
    pub mtime: (i64, u32),
    pub dev: u64,
    pub ino: u64,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
}

impl Stat {
    /// The same, from an `fstatat` of the file (a link, stat'ed by its directory's handle).
    pub fn of_raw(st: &rustix::fs::Stat) -> Stat {
        Stat {
            ctime: (st.st_ctime, st.st_ctime_nsec as u32),
            mtime: (st.st_mtime, st.st_mtime_nsec as u32),
            dev: st.st_dev,
            ino: st.st_ino,
            uid: st.st_uid,
            gid: st.st_gid,
            size: st.st_size as u64,
        }
    }

    pub fn of(meta: &std::fs::Metadata) -> Stat {
        Stat {
            ctime: (meta.ctime(), meta.ctime_nsec() as u32),
            mtime: (meta.mtime(), meta.mtime_nsec() as u32),
            dev: meta.dev(),
            ino: meta.ino(),
            uid: meta.uid(),
            gid: meta.gid(),
            size: meta.size(),
        }
    }
}

/// One file of the record: its path in the tree, blob, git mode and stat (all zero for a
/// file that was not there to stat, which never matches a real one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: Vec<u8>,
    pub id: Oid,
    pub mode: u32,
    pub stat: Stat,
}

/// What a directory held when flotilla last wrote it: `tree`'s files, sorted by path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub tree: Oid,
    pub entries: Vec<Entry>,
}

/// The file is the one the record holds, unchanged since: same kind, inode, size, owner,
/// mtime and ctime (an agent can set mtime, not ctime: any write, chmod, rename or link
/// moves it), one link, and older than the record itself (`stamp`, its file's mtime: git's
/// racily clean rule, a write in the same clock tick keeps the ctime).
pub fn untouched(entry: &Entry, meta: &std::fs::Metadata, stamp: (i64, u32)) -> bool {
    let kind = match entry.mode {
        0o120000 => meta.file_type().is_symlink(),
        0o100644 => meta.is_file() && meta.mode() & 0o111 == 0,
        0o100755 => meta.is_file() && meta.mode() & 0o100 != 0,
        _ => false,
    };
    let stat = Stat::of(meta);
    kind && meta.nlink() == 1
        && stat == entry.stat
        && entry.stat != Stat::default()
        && stat.ctime < stamp
        && stat.mtime < stamp
}

/// Whether `path` is one of `dirs` ([`Snapshot::dirs`]).
pub fn is_dir(dirs: &[&[u8]], path: &[u8]) -> bool {
    dirs.binary_search(&path).is_ok()
}

/// A file's mtime as (seconds, nanoseconds): the stamp of a record written to it.
pub fn mtime_of(path: &Path) -> Result<(i64, u32), RepoError> {
    let meta = std::fs::metadata(path).map_err(|e| io("cannot read", path, e))?;
    Ok((meta.mtime(), meta.mtime_nsec() as u32))
}

/// The bytes of a record file flotilla wrote (a snapshot, a walk record), read in order;
/// past the end, each reader's own kind of damage.
pub(super) struct RecordBytes<'p> {
    bytes: Vec<u8>,
    at: usize,
    path: &'p Path,
    damaged: fn(&Path, &str) -> RepoError,
}

impl<'p> RecordBytes<'p> {
    /// The file at `path`; `damaged` says what is wrong with it, in its reader's words.
    pub(super) fn read(
        path: &'p Path,
        damaged: fn(&Path, &str) -> RepoError,
    ) -> Result<Self, RepoError> {
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|e| io("cannot read", path, e))?;
        Ok(RecordBytes {
            bytes,
            at: 0,
            path,
            damaged,
        })
    }

    /// The next `n` bytes; damaged when the file is cut short.
    pub(super) fn take(&mut self, n: usize) -> Result<&[u8], RepoError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len());
        let end = end.ok_or_else(|| (self.damaged)(self.path, "cut short"))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    pub(super) fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether every byte was taken.
    pub(super) fn all_read(&self) -> bool {
        self.at == self.bytes.len()
    }
}

/// Little-endian integers of a record (`b` holds at least their bytes).
pub(super) fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

pub(super) fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

fn damaged(path: &Path, what: &str) -> RepoError {
    RepoError::Git(format!(
        "{} is not a workspace snapshot: {what}",
        path.display()
    ))
}

impl Snapshot {
    /// Reads a record [`Snapshot::write`] wrote; anything else is a typed error. The one
    /// kept in memory when the file is that write of it (its nonce and length).
    pub fn read(path: &Path) -> Result<Arc<Snapshot>, RepoError> {
        if let Some((nonce, len)) = header(path)
            && let Some(kept) = kept_records()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&nonce, len, path)
        {
            return Ok(kept);
        }
        let (snapshot, nonce, len) = Snapshot::read_file(path)?;
        let snapshot = Arc::new(snapshot);
        kept_records()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keep(nonce, len, path, &snapshot);
        Ok(snapshot)
    }

    /// [`Snapshot::read`], for a caller that consumes the record: the memory's copy goes
    /// with it (the file is about to go too).
    pub fn take(path: &Path) -> Result<Snapshot, RepoError> {
        let kept = header(path).and_then(|(nonce, len)| {
            kept_records()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(&nonce, len)
        });
        match kept {
            Some(kept) => Ok(Arc::unwrap_or_clone(kept)),
            None => Snapshot::read_file(path).map(|(snapshot, _, _)| snapshot),
        }
    }

    /// The record in the file at `path`, its nonce and the file's length.
    fn read_file(path: &Path) -> Result<(Snapshot, [u8; NONCE_BYTES], u64), RepoError> {
        let mut record = RecordBytes::read(path, damaged)?;
        if record.take(MAGIC.len())? != MAGIC {
            return Err(damaged(path, "no header"));
        }
        let mut nonce = [0u8; NONCE_BYTES];
        nonce.copy_from_slice(record.take(NONCE_BYTES)?);
        let tree = Oid::from_bytes(record.take(20)?).map_err(|_| damaged(path, "a bad tree id"))?;
        let count = le_u64(record.take(8)?);
        if count > MAX_ENTRIES {
            return Err(damaged(path, "too many entries"));
        }
        // No more than the file's bytes can hold: a damaged count allocates nothing big.
        let mut entries = Vec::with_capacity((count as usize).min(record.len() / MIN_ENTRY_BYTES));
        for _ in 0..count {
            let len = le_u32(record.take(4)?);
            if len == 0 || len > MAX_PATH {
                return Err(damaged(path, "a bad path length"));
            }
            let entry_path = record.take(len as usize)?.to_vec();
            let id =
                Oid::from_bytes(record.take(20)?).map_err(|_| damaged(path, "a bad blob id"))?;
            let mode = le_u32(record.take(4)?);
            let fixed = record.take(8 + 4 + 8 + 4 + 8 + 8 + 4 + 4 + 8)?;
            let stat = Stat {
                ctime: (le_u64(&fixed[0..8]) as i64, le_u32(&fixed[8..12])),
                mtime: (le_u64(&fixed[12..20]) as i64, le_u32(&fixed[20..24])),
                dev: le_u64(&fixed[24..32]),
                ino: le_u64(&fixed[32..40]),
                uid: le_u32(&fixed[40..44]),
                gid: le_u32(&fixed[44..48]),
                size: le_u64(&fixed[48..56]),
            };
            entries.push(Entry {
                path: entry_path,
                id,
                mode,
                stat,
            });
        }
        if !record.all_read() {
            return Err(damaged(path, "bytes after its entries"));
        }
        // Looked up by binary search: sorted, each path once.
        if entries.windows(2).any(|w| w[0].path >= w[1].path) {
            return Err(damaged(path, "entries out of order"));
        }
        Ok((Snapshot { tree, entries }, nonce, record.len() as u64))
    }

    /// The position of the entry at `path` (the entries are sorted by path).
    pub fn find(&self, path: &[u8]) -> Option<usize> {
        self.entries
            .binary_search_by(|e| e.path.as_slice().cmp(path))
            .ok()
    }

    /// Every directory that holds an entry, sorted (for [`is_dir`]).
    pub fn dirs(&self) -> Vec<&[u8]> {
        let mut dirs = Vec::new();
        let mut last: &[u8] = &[];
        for entry in &self.entries {
            let path = entry.path.as_slice();
            // The directories this path shares with the one before were listed for it:
            // in the record's order, a directory's entries are side by side, so each
            // directory is listed about once instead of once per file under it.
            let shared = path.iter().zip(last).take_while(|(a, b)| a == b).count();
            for (i, byte) in path.iter().enumerate().skip(shared) {
                if *byte == b'/' {
                    dirs.push(&path[..i]);
                }
            }
            last = path;
        }
        // Whatever the order (a record is read from disk), sorted and listed once.
        dirs.sort_unstable();
        dirs.dedup();
        dirs
    }

    /// Writes the record to `path` (through `<path>.part` and a rename: whole or absent),
    /// and keeps it in memory for the reads of that file.
    pub fn write(self, path: &Path) -> Result<Arc<Snapshot>, RepoError> {
        let mut part = path.as_os_str().to_owned();
        part.push(".part");
        let part = PathBuf::from(part);
        let mut nonce = [0u8; NONCE_BYTES];
        getrandom::fill(&mut nonce)
            .map_err(|e| RepoError::Git(format!("no random bytes for a snapshot: {e}")))?;
        // Built in a buffer that stays in the cache and written as it fills: thirteen small
        // writes an entry through a `BufWriter`, or the record built whole (a MiB at
        // 10,000 files, its pages faulted in), were a visible part of every reset.
        let mut file = std::fs::File::create(&part).map_err(|e| io("cannot write", &part, e))?;
        let mut len = 0u64;
        let mut chunk = Vec::with_capacity(CHUNK + 84 + MAX_PATH as usize);
        chunk.extend_from_slice(MAGIC);
        chunk.extend_from_slice(&nonce);
        chunk.extend_from_slice(self.tree.as_bytes());
        chunk.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        let written = (|| {
            for e in &self.entries {
                chunk.extend_from_slice(&(e.path.len() as u32).to_le_bytes());
                chunk.extend_from_slice(&e.path);
                let mut fixed = [0u8; 80];
                fixed[..20].copy_from_slice(e.id.as_bytes());
                fixed[20..24].copy_from_slice(&e.mode.to_le_bytes());
                fixed[24..32].copy_from_slice(&e.stat.ctime.0.to_le_bytes());
                fixed[32..36].copy_from_slice(&e.stat.ctime.1.to_le_bytes());
                fixed[36..44].copy_from_slice(&e.stat.mtime.0.to_le_bytes());
                fixed[44..48].copy_from_slice(&e.stat.mtime.1.to_le_bytes());
                fixed[48..56].copy_from_slice(&e.stat.dev.to_le_bytes());
                fixed[56..64].copy_from_slice(&e.stat.ino.to_le_bytes());
                fixed[64..68].copy_from_slice(&e.stat.uid.to_le_bytes());
                fixed[68..72].copy_from_slice(&e.stat.gid.to_le_bytes());
                fixed[72..80].copy_from_slice(&e.stat.size.to_le_bytes());
                chunk.extend_from_slice(&fixed);
                if chunk.len() >= CHUNK {
                    len += chunk.len() as u64;
                    file.write_all(&chunk)?;
                    chunk.clear();
                }
            }
            len += chunk.len() as u64;
            file.write_all(&chunk)
        })();
        written.map_err(|e| io("cannot write", &part, e))?;
        drop(file);
        std::fs::rename(&part, path).map_err(|e| io("cannot write", path, e))?;
        let mut this = self;
        this.entries.shrink_to_fit();
        let snapshot = Arc::new(this);
        // Only a record its file's reader would take back is kept for it.
        if snapshot.well_formed() {
            kept_records()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .keep(nonce, len, path, &snapshot);
        }
        Ok(snapshot)
    }

    /// What [`Snapshot::read_file`] checks of a record: entries sorted, each path once,
    /// of a length it takes.
    fn well_formed(&self) -> bool {
        self.entries.len() as u64 <= MAX_ENTRIES
            && self
                .entries
                .iter()
                .all(|e| !e.path.is_empty() && e.path.len() <= MAX_PATH as usize)
            && self.entries.windows(2).all(|w| w[0].path < w[1].path)
    }

    /// The memory the record takes, about: its entries, their paths, and a share for the
    /// rest (so that a record of no entries still counts).
    fn memory(&self) -> usize {
        let paths: usize = self.entries.iter().map(|e| e.path.capacity()).sum();
        256 + self.entries.capacity() * std::mem::size_of::<Entry>() + paths
    }
}

/// Drops from memory the record kept for the file at `path`, if any (the file is about to
/// go, or to be replaced).
pub fn forget(path: &Path) {
    if let Some((nonce, _)) = header(path) {
        kept_records()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .forget(&nonce);
    }
}

/// Drops from memory the records last seen under `root` (a run's sweep removes them).
pub fn forget_records_below(root: &Path) {
    kept_records()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .forget_below(root);
}

/// The nonce and length of the record file at `path`, if it has this format's header.
fn header(path: &Path) -> Option<([u8; NONCE_BYTES], u64)> {
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    let mut head = [0u8; MAGIC.len() + NONCE_BYTES];
    file.read_exact(&mut head).ok()?;
    if &head[..MAGIC.len()] != MAGIC {
        return None;
    }
    let mut nonce = [0u8; NONCE_BYTES];
    nonce.copy_from_slice(&head[MAGIC.len()..]);
    Some((nonce, len))
}

/// The records in memory, by nonce.
#[derive(Default)]
struct KeptRecords {
    by_nonce: HashMap<[u8; NONCE_BYTES], Kept>,
    /// Their [`Snapshot::memory`], together.
    bytes: usize,
    clock: u64,
}

struct Kept {
    len: u64,
    /// Where it was last written or read (parking renames it within the run's root).
    path: PathBuf,
    used: u64,
    bytes: usize,
    snapshot: Arc<Snapshot>,
}

fn kept_records() -> &'static Mutex<KeptRecords> {
    static KEPT: OnceLock<Mutex<KeptRecords>> = OnceLock::new();
    KEPT.get_or_init(Mutex::default)
}

impl KeptRecords {
    fn get(&mut self, nonce: &[u8; NONCE_BYTES], len: u64, path: &Path) -> Option<Arc<Snapshot>> {
        self.clock += 1;
        let kept = self.by_nonce.get_mut(nonce).filter(|k| k.len == len)?;
        kept.used = self.clock;
        if kept.path != path {
            kept.path = path.to_path_buf();
        }
        Some(kept.snapshot.clone())
    }

    fn take(&mut self, nonce: &[u8; NONCE_BYTES], len: u64) -> Option<Arc<Snapshot>> {
        if self.by_nonce.get(nonce)?.len != len {
            return None;
        }
        self.forget(nonce)
    }

    fn forget(&mut self, nonce: &[u8; NONCE_BYTES]) -> Option<Arc<Snapshot>> {
        let kept = self.by_nonce.remove(nonce)?;
        self.bytes -= kept.bytes;
        Some(kept.snapshot)
    }

    fn keep(&mut self, nonce: [u8; NONCE_BYTES], len: u64, path: &Path, snapshot: &Arc<Snapshot>) {
        self.forget(&nonce);
        let bytes = snapshot.memory();
        if bytes > MAX_KEPT_BYTES {
            return;
        }
        while self.bytes + bytes > MAX_KEPT_BYTES {
            // A scan: the records kept are a handful (a run's workers and its pool).
            let Some(oldest) = self
                .by_nonce
                .iter()
                .min_by_key(|(_, k)| k.used)
                .map(|(n, _)| *n)
            else {
                break;
            };
            self.forget(&oldest);
        }
        self.clock += 1;
        let kept = Kept {
            len,
            path: path.to_path_buf(),
            used: self.clock,
            bytes,
            snapshot: snapshot.clone(),
        };
        self.by_nonce.insert(nonce, kept);
        self.bytes += bytes;
    }

    fn forget_below(&mut self, root: &Path) {
        let bytes = &mut self.bytes;
        self.by_nonce.retain(|_, kept| {
            let below = kept.path.starts_with(root);
            if below {
                *bytes -= kept.bytes;
            }
            !below
        });
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An entry at `path` with made-up blob and stat (`seed` varies them).
    pub(crate) fn entry(path: &str, seed: u8) -> Entry {
        Entry {
            path: path.as_bytes().to_vec(),
            id: Oid::from_bytes(&[seed; 20]).unwrap(),
            mode: 0o100644,
            stat: Stat {
                ctime: (1_700_000_000 + i64::from(seed), 5),
                mtime: (1_700_000_001, 7),
                dev: 1 << 40,
                ino: 42 + u64::from(seed),
                uid: 1000,
                gid: 1000,
                size: 12,
            },
        }
    }

    #[test]
    fn a_snapshot_reads_back_as_written_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap");
        let snap = Snapshot {
            tree: Oid::from_bytes(&[9; 20]).unwrap(),
            entries: vec![entry("a", 1), entry("dir/b", 2)],
        };
        snap.clone().write(&path).unwrap();
        assert_eq!(*Snapshot::read(&path).unwrap(), snap);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        assert!(Snapshot::read(&path).is_err());
        std::fs::write(&path, b"FLOSNAP1").unwrap();
        assert!(Snapshot::read(&path).is_err());
    }

    #[test]
    fn a_record_is_read_from_memory_only_while_its_file_is_that_write_of_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap");
        let a = Snapshot {
            tree: Oid::from_bytes(&[1; 20]).unwrap(),
            entries: vec![entry("a", 1), entry("dir/b", 2)],
        };
        let written = a.clone().write(&path).unwrap();
        assert!(Arc::ptr_eq(&written, &Snapshot::read(&path).unwrap()));
        // The tree id changed in place, header and length kept: only flotilla writes these
        // files, so this write's record is still the one in memory.
        let mut bytes = std::fs::read(&path).unwrap();
        let tree_at = MAGIC.len() + NONCE_BYTES;
        bytes[tree_at..tree_at + 20].copy_from_slice(&[2; 20]);
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(*Snapshot::read(&path).unwrap(), a);
        // Taken, it is no longer in memory: the next read is the file's.
        assert_eq!(Snapshot::take(&path).unwrap(), a);
        assert_eq!(
            Snapshot::read(&path).unwrap().tree,
            Oid::from_bytes(&[2; 20]).unwrap()
        );
        // A new write is a new nonce, whatever was kept of the old one (the same length:
        // only the nonce tells them apart).
        let b = Snapshot {
            tree: Oid::from_bytes(&[3; 20]).unwrap(),
            entries: vec![entry("a", 3), entry("dir/c", 4)],
        };
        let kept = b.clone().write(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().len() as usize,
            bytes.len()
        );
        assert_eq!(*Snapshot::read(&path).unwrap(), b);
        // Forgotten (the file is about to go): the next read is the file's.
        forget(&path);
        assert!(!Arc::ptr_eq(&kept, &Snapshot::read(&path).unwrap()));
        let kept = Snapshot::read(&path).unwrap();
        // A sweep of the run's root drops what was kept of it; the file still reads.
        forget_records_below(dir.path());
        let reread = Snapshot::read(&path).unwrap();
        assert!(!Arc::ptr_eq(&kept, &reread));
        assert_eq!(*reread, b);
        // A file cut short is never the kept record.
        std::fs::write(&path, &std::fs::read(&path).unwrap()[..40]).unwrap();
        assert!(Snapshot::read(&path).is_err());
        assert!(Snapshot::take(&path).is_err());
    }

    #[test]
    fn the_records_kept_in_memory_stay_within_their_bound() {
        let mut kept = KeptRecords::default();
        let record = |n: usize| {
            Arc::new(Snapshot {
                tree: Oid::from_bytes(&[1; 20]).unwrap(),
                entries: vec![entry("a", 1); n],
            })
        };
        // Each entry: the struct and its one-byte path.
        let per = std::mem::size_of::<Entry>() + 1;
        let big = record((MAX_KEPT_BYTES / 2 - 256) / per);
        assert!(big.memory() * 2 <= MAX_KEPT_BYTES && big.memory() * 3 > MAX_KEPT_BYTES);
        let dir = Path::new("/run/x");
        kept.keep([1; NONCE_BYTES], 10, dir, &big);
        kept.keep([2; NONCE_BYTES], 10, dir, &big);
        assert!(kept.get(&[1; NONCE_BYTES], 10, dir).is_some());
        // A third goes in; the least recently used (the second) goes out.
        kept.keep([3; NONCE_BYTES], 10, dir, &big);
        assert_eq!(kept.bytes, 2 * big.memory());
        assert!(kept.get(&[2; NONCE_BYTES], 10, dir).is_none());
        assert!(kept.get(&[1; NONCE_BYTES], 10, dir).is_some());
        // A length that is not the write's is not the record.
        assert!(kept.get(&[3; NONCE_BYTES], 11, dir).is_none());
        assert!(kept.take(&[3; NONCE_BYTES], 11).is_none());
        // Records of no entries count too.
        assert!(record(0).memory() > 0);
        // One larger than the bound is not kept at all.
        let huge = record(MAX_KEPT_BYTES / std::mem::size_of::<Entry>() + 1);
        kept.keep([4; NONCE_BYTES], 10, dir, &huge);
        assert!(kept.get(&[4; NONCE_BYTES], 10, dir).is_none());
        assert_eq!(kept.bytes, 2 * big.memory());
        kept.forget_below(Path::new("/run"));
        assert_eq!((kept.bytes, kept.by_nonce.len()), (0, 0));
    }

    #[test]
    fn the_directories_are_every_parent_once_in_any_order_of_entries() {
        use rand::{Rng, SeedableRng, seq::SliceRandom};
        // Every directory of every path, the slow way.
        fn every_parent(entries: &[Entry]) -> Vec<Vec<u8>> {
            let mut dirs = Vec::new();
            for entry in entries {
                for (i, byte) in entry.path.iter().enumerate() {
                    if *byte == b'/' {
                        dirs.push(entry.path[..i].to_vec());
                    }
                }
            }
            dirs.sort_unstable();
            dirs.dedup();
            dirs
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        // Names chosen to sort around '/': "a-b" < "a/" < "a0", and a file "a" beside "a/".
        let parts = ["a", "a-b", "a0", "b", "ab", "a.c"];
        for round in 0..300 {
            let mut paths: Vec<String> = (0..rng.gen_range(0..40))
                .map(|_| {
                    let depth = rng.gen_range(1..5);
                    (0..depth)
                        .map(|_| parts[rng.gen_range(0..parts.len())])
                        .collect::<Vec<_>>()
                        .join("/")
                })
                .collect();
            paths.sort();
            paths.dedup();
            if round % 2 == 1 {
                paths.shuffle(&mut rng);
            }
            let snap = Snapshot {
                tree: Oid::from_bytes(&[1; 20]).unwrap(),
                entries: paths.iter().map(|p| entry(p, 0)).collect(),
            };
            let got: Vec<Vec<u8>> = snap.dirs().into_iter().map(<[u8]>::to_vec).collect();
            assert_eq!(got, every_parent(&snap.entries), "paths {paths:?}");
        }
    }
}
