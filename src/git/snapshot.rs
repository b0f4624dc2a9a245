//! flotilla's record of an attempt directory (ADR-044, ADR-046): each file its checkout
//! wrote, with the blob, mode and full `lstat` read right after, and the tree they make.
//! The reset of a parked directory trusts a file only if its stat is still exactly this;
//! the seal hashes only the files whose stat is not.
//!
//! Its own file format (not git's index): read and written whole in one pass, with 64-bit
//! stat fields, and the tree id the reset diffs the next start against. The worktree's own
//! index (for the agent's git) is written from the same entries by [`write_index`], in
//! git's format, without libgit2 parsing, sorting and hashing an index entry by entry.
//! It must not know worktree records, the journal or the actors.

use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use flotilla_actors::ports::RepoError;
use git2::Oid;

use super::io;

const MAGIC: &[u8; 8] = b"FLOSNAP1";
/// More entries than any tree this could record: a longer count is a damaged file.
const MAX_ENTRIES: u64 = 50_000_000;
/// The fewest bytes an entry takes in the file (a one-byte path): caps what a count
/// read from the file may reserve.
const MIN_ENTRY_BYTES: usize = 64;
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
    /// Reads a record [`Snapshot::write`] wrote; anything else is a typed error.
    pub fn read(path: &Path) -> Result<Snapshot, RepoError> {
        let mut record = RecordBytes::read(path, damaged)?;
        if record.take(MAGIC.len())? != MAGIC {
            return Err(damaged(path, "no header"));
        }
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
        Ok(Snapshot { tree, entries })
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

    /// Writes the record to `path` (through `<path>.part` and a rename: whole or absent).
    pub fn write(&self, path: &Path) -> Result<(), RepoError> {
        let mut part = path.as_os_str().to_owned();
        part.push(".part");
        let part = PathBuf::from(part);
        let file = std::fs::File::create(&part).map_err(|e| io("cannot write", &part, e))?;
        let mut out = BufWriter::with_capacity(1 << 16, file);
        let mut put = |bytes: &[u8]| out.write_all(bytes);
        let written = (|| {
            put(MAGIC)?;
            put(self.tree.as_bytes())?;
            put(&(self.entries.len() as u64).to_le_bytes())?;
            for e in &self.entries {
                put(&(e.path.len() as u32).to_le_bytes())?;
                put(&e.path)?;
                put(e.id.as_bytes())?;
                put(&e.mode.to_le_bytes())?;
                put(&e.stat.ctime.0.to_le_bytes())?;
                put(&e.stat.ctime.1.to_le_bytes())?;
                put(&e.stat.mtime.0.to_le_bytes())?;
                put(&e.stat.mtime.1.to_le_bytes())?;
                put(&e.stat.dev.to_le_bytes())?;
                put(&e.stat.ino.to_le_bytes())?;
                put(&e.stat.uid.to_le_bytes())?;
                put(&e.stat.gid.to_le_bytes())?;
                put(&e.stat.size.to_le_bytes())?;
            }
            Ok::<_, std::io::Error>(())
        })();
        written
            .and_then(|()| out.flush())
            .map_err(|e| io("cannot write", &part, e))?;
        drop(out);
        std::fs::rename(&part, path).map_err(|e| io("cannot write", path, e))
    }
}

/// Writes `entries` (sorted by path, stage 0) as a git index file (version 2) at `path`,
/// through git's own lock file (`<path>.lock`) and a rename, as git does.
pub fn write_index(path: &Path, entries: &[Entry]) -> Result<(), RepoError> {
    let mut lock = path.as_os_str().to_owned();
    lock.push(".lock");
    let lock = PathBuf::from(lock);
    let mut bytes = Vec::with_capacity(12 + entries.len() * 128 + 20);
    bytes.extend_from_slice(b"DIRC");
    bytes.extend_from_slice(&2u32.to_be_bytes());
    let count = u32::try_from(entries.len())
        .map_err(|_| RepoError::Git("too many files for a git index".into()))?;
    bytes.extend_from_slice(&count.to_be_bytes());
    for e in entries {
        // git's index keeps the low 32 bits of each stat field.
        for field in [
            e.stat.ctime.0 as u32,
            e.stat.ctime.1,
            e.stat.mtime.0 as u32,
            e.stat.mtime.1,
            e.stat.dev as u32,
            e.stat.ino as u32,
            e.mode,
            e.stat.uid,
            e.stat.gid,
            e.stat.size as u32,
        ] {
            bytes.extend_from_slice(&field.to_be_bytes());
        }
        bytes.extend_from_slice(e.id.as_bytes());
        let flags = e.path.len().min(0xfff) as u16;
        bytes.extend_from_slice(&flags.to_be_bytes());
        bytes.extend_from_slice(&e.path);
        // NUL-padded to a multiple of 8, at least one NUL.
        let len = 62 + e.path.len();
        let padded = (len + 8) & !7;
        bytes.resize(bytes.len() + (padded - len), 0);
    }
    // git's trailer: the SHA-1 of everything before it (ring is already rustls's).
    let sum = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &bytes);
    bytes.extend_from_slice(sum.as_ref());
    match std::fs::remove_file(&lock) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io("cannot remove", &lock, e));
        }
        _ => {}
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&lock)
        .and_then(|mut f| f.write_all(&bytes))
        .map_err(|e| io("cannot write", &lock, e))?;
    std::fs::rename(&lock, path).map_err(|e| io("cannot write", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, seed: u8) -> Entry {
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
        snap.write(&path).unwrap();
        assert_eq!(Snapshot::read(&path).unwrap(), snap);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        assert!(Snapshot::read(&path).is_err());
        std::fs::write(&path, b"FLOSNAP1").unwrap();
        assert!(Snapshot::read(&path).is_err());
    }

    #[test]
    fn the_index_written_is_one_libgit2_reads_entry_for_entry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index");
        let mut long = entry(&"x/".repeat(40), 3);
        long.mode = 0o100755;
        let entries = vec![entry("a", 1), long, entry("z", 2)];
        write_index(&path, &entries).unwrap();
        let index = git2::Index::open(&path).unwrap();
        let read: Vec<_> = index.iter().collect();
        assert_eq!(read.len(), 3);
        for (theirs, ours) in read.iter().zip(&entries) {
            assert_eq!(theirs.path, ours.path);
            assert_eq!(theirs.id, ours.id);
            assert_eq!(theirs.mode, ours.mode);
            assert_eq!(theirs.ino, ours.stat.ino as u32);
            assert_eq!(theirs.mtime.nanoseconds(), 7);
            assert_eq!(theirs.file_size, 12);
        }
        assert!(!dir.path().join("index.lock").exists());
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
