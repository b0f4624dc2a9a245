//! What the seal's one walk found (ADR-046 step a), kept with a parked directory so that
//! the next reset need not walk the tree again: every path that was not exactly as the
//! snapshot recorded (a file whose `lstat` differed, anything new, ignored files and the
//! ignored directories the walk skipped, a directory not in the tree), every snapshot entry
//! the walk did not find, and the directories whose mode is not a plain one.
//!
//! The record is only worth what the walk saw: it is the directory's state when nothing can
//! write into it between the walk and the reset. That holds when every process of every
//! command that ran in the workspace has ended before the seal began (bwrap's pid
//! namespace), and nothing ran in it after the seal: the Worker says so
//! (`Worktrees::release_sealed`), the run's sandbox decides whether to believe it
//! (`GitWorktrees::trusting_seals`), and without both a parked directory has no record and
//! is walked. A record is tied to the snapshot it was judged against and to the walked
//! directory (their inodes, which renames keep): a foreign, damaged or missing one means
//! the full walk. It must not know worktree records, the journal or the actors.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use flotilla_actors::ports::RepoError;

use super::io;
use super::snapshot::{RecordBytes, le_u32, le_u64};

const MAGIC: &[u8; 8] = b"FLOWALK1";
/// More paths than a record could hold for any tree: a longer count is a damaged file.
const MAX_PATHS: u64 = 50_000_000;
/// git's own limit on a path's length in practice; longer is a damaged file.
const MAX_PATH: u32 = 4096;

/// A file or directory as a record names it: device, inode, size and mtime (a rename keeps
/// them; a rewrite does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Identity {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime: (i64, u32),
}

impl Identity {
    pub fn of(path: &Path) -> Result<Identity, RepoError> {
        let meta = std::fs::symlink_metadata(path).map_err(|e| io("cannot read", path, e))?;
        Ok(Identity {
            dev: meta.dev(),
            ino: meta.ino(),
            size: if meta.is_dir() { 0 } else { meta.size() },
            mtime: if meta.is_dir() {
                (0, 0)
            } else {
                (meta.mtime(), meta.mtime_nsec() as u32)
            },
        })
    }
}

/// What one seal's walk found of a workspace, against one snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WalkRecord {
    /// The snapshot file the walk judged against.
    pub snapshot: Identity,
    /// The directory walked (its root).
    pub root: Identity,
    /// Present, not as recorded: to be deleted (a file, a link, a directory with all in it).
    pub remove: Vec<Vec<u8>>,
    /// Snapshot entries the walk did not find.
    pub missing: Vec<Vec<u8>>,
    /// Directories of the tree whose mode is not a plain one.
    pub modes: Vec<Vec<u8>>,
}

fn damaged(path: &Path, what: &str) -> RepoError {
    RepoError::Git(format!("{} is not a walk record: {what}", path.display()))
}

impl WalkRecord {
    /// Writes the record to `path` (through `<path>.part` and a rename: whole or absent).
    pub fn write(&self, path: &Path) -> Result<(), RepoError> {
        let mut bytes = Vec::with_capacity(256);
        bytes.extend_from_slice(MAGIC);
        for id in [self.snapshot, self.root] {
            bytes.extend_from_slice(&id.dev.to_le_bytes());
            bytes.extend_from_slice(&id.ino.to_le_bytes());
            bytes.extend_from_slice(&id.size.to_le_bytes());
            bytes.extend_from_slice(&id.mtime.0.to_le_bytes());
            bytes.extend_from_slice(&id.mtime.1.to_le_bytes());
        }
        for list in [&self.remove, &self.missing, &self.modes] {
            bytes.extend_from_slice(&(list.len() as u64).to_le_bytes());
            for p in list {
                bytes.extend_from_slice(&(p.len() as u32).to_le_bytes());
                bytes.extend_from_slice(p);
            }
        }
        let mut part = path.as_os_str().to_owned();
        part.push(".part");
        let part = std::path::PathBuf::from(part);
        std::fs::write(&part, &bytes).map_err(|e| io("cannot write", &part, e))?;
        std::fs::rename(&part, path).map_err(|e| io("cannot write", path, e))
    }

    /// Reads a record [`WalkRecord::write`] wrote; anything else is a typed error.
    pub fn read(path: &Path) -> Result<WalkRecord, RepoError> {
        let mut record = RecordBytes::read(path, damaged)?;
        let (u64_of, u32_of) = (le_u64, le_u32);
        if record.take(MAGIC.len())? != MAGIC {
            return Err(damaged(path, "no header"));
        }
        let mut ids = [Identity::default(); 2];
        for id in &mut ids {
            let b = record.take(36)?;
            *id = Identity {
                dev: u64_of(&b[0..8]),
                ino: u64_of(&b[8..16]),
                size: u64_of(&b[16..24]),
                mtime: (u64_of(&b[24..32]) as i64, u32_of(&b[32..36])),
            };
        }
        let mut lists: [Vec<Vec<u8>>; 3] = Default::default();
        for list in &mut lists {
            let count = u64_of(record.take(8)?);
            if count > MAX_PATHS {
                return Err(damaged(path, "too many paths"));
            }
            for _ in 0..count {
                let len = u32_of(record.take(4)?);
                if len == 0 || len > MAX_PATH {
                    return Err(damaged(path, "a bad path length"));
                }
                let p = record.take(len as usize)?;
                // Relative, plain components only: a record never names a path outside.
                if p.starts_with(b"/")
                    || p.split(|b| *b == b'/')
                        .any(|c| c.is_empty() || c == b"." || c == b"..")
                {
                    return Err(damaged(path, "a path that is not a plain relative one"));
                }
                list.push(p.to_vec());
            }
        }
        if !record.all_read() {
            return Err(damaged(path, "bytes after its paths"));
        }
        let [remove, missing, modes] = lists;
        Ok(WalkRecord {
            snapshot: ids[0],
            root: ids[1],
            remove,
            missing,
            modes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("walk");
        let record = WalkRecord {
            snapshot: Identity {
                dev: 1 << 40,
                ino: 7,
                size: 99,
                mtime: (1_700_000_000, 5),
            },
            root: Identity {
                dev: 3,
                ino: 8,
                ..Identity::default()
            },
            remove: vec![b"a/b".to_vec(), b"new".to_vec()],
            missing: vec![b"gone.rs".to_vec()],
            modes: vec![b"tests".to_vec()],
        };
        record.write(&path).unwrap();
        assert_eq!(WalkRecord::read(&path).unwrap(), record);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        assert!(WalkRecord::read(&path).is_err());
        for bad in [&b"../x"[..], b"/etc", b"a//b", b"a/./b"] {
            let mut evil = record.clone();
            evil.remove = vec![bad.to_vec()];
            evil.write(&path).unwrap();
            assert!(WalkRecord::read(&path).is_err(), "{bad:?}");
        }
    }
}
