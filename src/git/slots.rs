//! Reused attempt directories (ADR-044): how an attempt's work tree is made and unmade, so
//! that making one costs what differs from the last attempt's, not the whole tree.
//!
//! A released attempt's directory is parked under the run's root (`.parked/<dir>/tree`)
//! with flotilla's **snapshot** of it (`.parked/<dir>/index`: each file flotilla's checkout
//! wrote, its blob, mode and full stat, taken right after the checkout, before any agent
//! ran). The next attempt's worktree (recorded, locked, holding only its `.git` file) takes
//! a parked directory whole (a rename) and resets it: every entry whose stat is not exactly
//! the snapshot's (ctime, which no agent can set back, inode, size, mode, mtime), every
//! untracked or ignored file, `.git` and any nested repository are deleted, never read;
//! then libgit2's checkout, with the verified entries as its index, writes only what the
//! new start changes and what was deleted. An earlier agent is untrusted: nothing it wrote
//! reaches the next attempt. Entries as new as the snapshot file are never trusted (git's
//! racily clean rule: a write in the same clock tick keeps the ctime).
//!
//! Crash safety: a directory is only ever reset inside a worktree that is still locked (a
//! locked one is never reused and the sweep prunes it), and a parked one is always reset
//! before use, so nothing half reset is handed out. Parking and claiming are renames; the
//! sweep removes what they leave half done (`.parked`, `.claim-*`, stale snapshots).
//!
//! The snapshot and the pool live under the run's root, which an agent's sandbox hides
//! (only the workspace is writable, ADR-015). It must not know the journal or the actors.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use flotilla_actors::ports::RepoError;

use super::{git, io};

/// The run root's directory of parked attempt directories.
pub const PARKED_DIR: &str = ".parked";
/// The run root's directory of snapshots of live attempt directories (`.snap/<dir>`).
pub const SNAP_DIR: &str = ".snap";
/// A directory being claimed by an attempt: `.claim-<dir>` (only a crash leaves one).
const CLAIM_PREFIX: &str = ".claim-";
/// A parked entry being written: `.parked/<dir>.part` (only a crash leaves one).
const PART_SUFFIX: &str = ".part";
/// At most this many directories wait in a run's pool; a release past it deletes (the pool
/// holds what the run's workers release between two prepares, a handful).
pub const MAX_PARKED: usize = 16;

/// How an attempt's directory was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Made {
    /// Every file written from nothing.
    Fresh,
    /// A parked directory reset to the new start.
    Reused,
}

/// Makes the worktree at `path` (recorded and locked, holding only the `.git` file git
/// wrote) hold exactly its HEAD's tree, from a parked directory of the run at `root` when
/// there is one; then writes the snapshot a later park needs. `open` opens the worktree
/// through the repository's records; `started` is called as the long part starts (the
/// worker's unlocked checkout, ADR-041).
pub fn materialize(
    root: &Path,
    path: &Path,
    open: &dyn Fn() -> Result<git2::Repository, RepoError>,
    started: &dyn Fn(),
) -> Result<Made, RepoError> {
    let dir_name = path
        .file_name()
        .ok_or_else(|| RepoError::Git(format!("{} names no directory", path.display())))?;
    let snap = root.join(SNAP_DIR).join(dir_name);
    // A snapshot of an earlier life of this directory says nothing about the new one.
    remove_file(&snap)?;
    let made = match claim(root, dir_name)? {
        Some(claimed) => {
            let reset = reset(&claimed, path, open, started);
            // What is left of the claim (its snapshot; the tree, if the reset failed early).
            let _ = remove_tree(&claimed);
            reset?;
            Made::Reused
        }
        None => {
            started();
            open()?
                .checkout_head(Some(
                    git2::build::CheckoutBuilder::new()
                        .force()
                        .recreate_missing(true),
                ))
                .map_err(git)?;
            Made::Fresh
        }
    };
    snapshot(&open()?, path, &snap)?;
    Ok(made)
}

/// Takes a parked directory for the attempt `dir_name`: renamed to `.claim-<dir_name>`, so
/// two attempts never take the same one. None when the pool is empty.
fn claim(root: &Path, dir_name: &OsStr) -> Result<Option<PathBuf>, RepoError> {
    let parked = root.join(PARKED_DIR);
    let Ok(entries) = std::fs::read_dir(&parked) else {
        return Ok(None);
    };
    let mut claim_name = CLAIM_PREFIX.as_bytes().to_vec();
    claim_name.extend_from_slice(dir_name.as_bytes());
    let claimed = root.join(OsStr::from_bytes(&claim_name));
    // What an earlier try of this attempt left of its claim (it was cut short).
    remove_tree(&claimed).map_err(|e| io("cannot remove", &claimed, e))?;
    for entry in entries.flatten() {
        if entry
            .file_name()
            .as_bytes()
            .ends_with(PART_SUFFIX.as_bytes())
        {
            continue;
        }
        match std::fs::rename(entry.path(), &claimed) {
            Ok(()) => {}
            // Another attempt took it first.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io("cannot claim the parked directory", &entry.path(), e)),
        }
        let whole = |p: &Path, dir: bool| {
            std::fs::symlink_metadata(p).is_ok_and(|m| if dir { m.is_dir() } else { m.is_file() })
        };
        if whole(&claimed.join("tree"), true) && whole(&claimed.join("index"), false) {
            return Ok(Some(claimed));
        }
        remove_tree(&claimed).map_err(|e| io("cannot remove", &claimed, e))?;
    }
    Ok(None)
}

/// Moves the claimed tree to `path` (keeping the `.git` file git wrote there) and resets it
/// to the worktree's HEAD.
fn reset(
    claimed: &Path,
    path: &Path,
    open: &dyn Fn() -> Result<git2::Repository, RepoError>,
    started: &dyn Fn(),
) -> Result<(), RepoError> {
    let dot_git = path.join(".git");
    let link = std::fs::read(&dot_git).map_err(|e| io("cannot read", &dot_git, e))?;
    let snapshot = git2::Index::open(&claimed.join("index")).map_err(git)?;
    let stamp = mtime_of(&claimed.join("index"))?;
    std::fs::remove_dir_all(path).map_err(|e| io("cannot remove", path, e))?;
    std::fs::rename(claimed.join("tree"), path).map_err(|e| io("cannot move to", path, e))?;
    started();
    let verified = clean(path, &snapshot, stamp)?;
    std::fs::write(&dot_git, link).map_err(|e| io("cannot write", &dot_git, e))?;
    let worktree = open()?;
    // The verified entries are the checkout's index: it trusts their stat (git's own rule)
    // and so writes only what the new HEAD changes and what `clean` deleted.
    let mut index = git2::Index::open(&worktree.path().join("index")).map_err(git)?;
    index.clear().map_err(git)?;
    for entry in &verified {
        index.add(entry).map_err(git)?;
    }
    index.write().map_err(git)?;
    drop(index);
    worktree
        .checkout_head(Some(
            git2::build::CheckoutBuilder::new()
                .force()
                .remove_untracked(true)
                .remove_ignored(true)
                .recreate_missing(true),
        ))
        .map_err(git)
}

/// A file's mtime as (seconds, nanoseconds).
fn mtime_of(path: &Path) -> Result<(i64, u32), RepoError> {
    let meta = std::fs::metadata(path).map_err(|e| io("cannot read", path, e))?;
    Ok((meta.mtime(), meta.mtime_nsec() as u32))
}

/// Deletes from the directory at `root` everything that is not exactly what `snapshot`
/// recorded (taken no later than `stamp`), without following any link, and returns the
/// snapshot's entries still there. The root's `.git` always goes.
fn clean(
    root: &Path,
    snapshot: &git2::Index,
    stamp: (i64, u32),
) -> Result<Vec<git2::IndexEntry>, RepoError> {
    let mut want: HashMap<Vec<u8>, git2::IndexEntry> = HashMap::new();
    let mut dirs: HashSet<Vec<u8>> = HashSet::new();
    for entry in snapshot.iter() {
        for (i, byte) in entry.path.iter().enumerate() {
            if *byte == b'/' {
                dirs.insert(entry.path[..i].to_vec());
            }
        }
        want.insert(entry.path.clone(), entry);
    }
    let mut verified = Vec::new();
    let mut kept_dirs = Vec::new();
    let mut stack: Vec<(PathBuf, Vec<u8>)> = vec![(root.to_path_buf(), Vec::new())];
    while let Some((dir, rel)) = stack.pop() {
        keep_dir_mode(&dir)?;
        let entries = std::fs::read_dir(&dir).map_err(|e| io("cannot read", &dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| io("cannot read", &dir, e))?;
            let abs = entry.path();
            let mut path = rel.clone();
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(entry.file_name().as_bytes());
            // Never followed: a link is judged as a link.
            let meta = std::fs::symlink_metadata(&abs).map_err(|e| io("cannot read", &abs, e))?;
            if meta.is_dir() {
                if dirs.contains(&path) && path != b".git" {
                    stack.push((abs, path));
                } else {
                    remove_tree(&abs).map_err(|e| io("cannot remove", &abs, e))?;
                }
                continue;
            }
            match want.remove(&path) {
                Some(entry) if path != b".git" && untouched(&entry, &meta, stamp) => {
                    verified.push(entry);
                }
                _ => std::fs::remove_file(&abs).map_err(|e| io("cannot remove", &abs, e))?,
            }
        }
        if !rel.is_empty() {
            kept_dirs.push(dir);
        }
    }
    // Emptied directories go (deepest first), as a fresh checkout would not make them;
    // the checkout makes again those it needs.
    for dir in kept_dirs.iter().rev() {
        let _ = std::fs::remove_dir(dir);
    }
    Ok(verified)
}

/// The file is the one the snapshot recorded, unchanged since: same kind, inode, size,
/// mtime and ctime (an agent can set mtime, not ctime: any write, chmod, rename or link
/// moves it), one link, and older than the snapshot itself.
fn untouched(entry: &git2::IndexEntry, meta: &std::fs::Metadata, stamp: (i64, u32)) -> bool {
    let kind = match entry.mode {
        0o120000 => meta.file_type().is_symlink(),
        0o100644 => meta.is_file() && meta.mode() & 0o111 == 0,
        0o100755 => meta.is_file() && meta.mode() & 0o100 != 0,
        _ => false,
    };
    let time = |t: git2::IndexTime| (i64::from(t.seconds()), t.nanoseconds());
    let ctime = (meta.ctime(), meta.ctime_nsec() as u32);
    let mtime = (meta.mtime(), meta.mtime_nsec() as u32);
    kind && meta.nlink() == 1
        && meta.ino() as u32 == entry.ino
        && meta.dev() as u32 == entry.dev
        && meta.size() as u32 == entry.file_size
        && meta.uid() == entry.uid
        && meta.gid() == entry.gid
        && time(entry.ctime) == ctime
        && time(entry.mtime) == mtime
        && ctime < stamp
        && mtime < stamp
}

/// A kept directory gets back a plain mode: owner rwx, nothing writable by others, no
/// set-id or sticky bit (git records no directory modes; an agent may have set any).
fn keep_dir_mode(dir: &Path) -> Result<(), RepoError> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| io("cannot read", dir, e))?;
    if !meta.is_dir() {
        return Err(RepoError::Git(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    let mode = meta.mode() & 0o7777;
    let plain = (mode & 0o755) | 0o700;
    if mode != plain {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(plain))
            .map_err(|e| io("cannot set the mode of", dir, e))?;
    }
    Ok(())
}

/// Records what the worktree at `path` holds, as its index lists it, with each file's stat
/// read now: written to `snap` (through a temporary file and a rename).
fn snapshot(worktree: &git2::Repository, path: &Path, snap: &Path) -> Result<(), RepoError> {
    let parent = snap
        .parent()
        .ok_or_else(|| RepoError::Git(format!("{} has no parent", snap.display())))?;
    std::fs::create_dir_all(parent).map_err(|e| io("cannot create", parent, e))?;
    let mut written = snap.as_os_str().to_owned();
    written.push(PART_SUFFIX);
    let written = PathBuf::from(written);
    remove_file(&written)?;
    let mut out = git2::Index::open(&written).map_err(git)?;
    let index = worktree.index().map_err(git)?;
    for mut entry in index.iter() {
        // Stage bits: nothing conflicted is a file flotilla wrote; gitlinks are no file.
        if entry.flags & 0x3000 != 0 || entry.mode == 0o160000 {
            continue;
        }
        let file = path.join(OsStr::from_bytes(&entry.path));
        let Ok(meta) = std::fs::symlink_metadata(&file) else {
            continue;
        };
        let as_time = |secs: i64, nanos: i64| git2::IndexTime::new(secs as i32, nanos as u32);
        entry.ctime = as_time(meta.ctime(), meta.ctime_nsec());
        entry.mtime = as_time(meta.mtime(), meta.mtime_nsec());
        entry.dev = meta.dev() as u32;
        entry.ino = meta.ino() as u32;
        entry.uid = meta.uid();
        entry.gid = meta.gid();
        entry.file_size = meta.size() as u32;
        out.add(&entry).map_err(git)?;
    }
    out.write().map_err(git)?;
    std::fs::rename(&written, snap).map_err(|e| io("cannot write", snap, e))
}

/// Parks the released attempt directory `path` of the run at `root` for a later attempt,
/// and says whether it did: not when it has no snapshot, is not a plain directory (a link
/// put in its place) or the pool is full. Its worktree record is already gone. A few
/// renames: the caller holds the repository's lock, so that the run's final sweep never
/// misses a directory parked as it runs.
pub fn park(root: &Path, path: &Path) -> bool {
    let Some(dir_name) = path.file_name() else {
        return false;
    };
    let snap = root.join(SNAP_DIR).join(dir_name);
    let parked = root.join(PARKED_DIR);
    let plain_dir = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir());
    let room = std::fs::read_dir(&parked).map_or(0, |e| e.count()) < MAX_PARKED;
    // An agent may have left its root unwritable: moving it needs its `..` writable.
    plain_dir
        && room
        && snap.is_file()
        && keep_dir_mode(path).is_ok()
        && park_renames(&snap, path, &parked, dir_name).is_ok()
}

/// Deletes the released attempt directory `path` that was not parked, and its snapshot.
pub fn discard(root: &Path, path: &Path) -> Result<(), RepoError> {
    if let Some(dir_name) = path.file_name() {
        let snaps = root.join(SNAP_DIR);
        remove_file(&snaps.join(dir_name))?;
        // Gone once empty (an error only means another directory's snapshot is in it).
        let _ = std::fs::remove_dir(&snaps);
    }
    remove_workspace(path)
}

/// Snapshot and tree into `.parked/<dir>.part`, then that renamed to `.parked/<dir>`: a
/// parked entry is whole or has the suffix claims skip.
fn park_renames(snap: &Path, path: &Path, parked: &Path, dir_name: &OsStr) -> std::io::Result<()> {
    let mut part = dir_name.to_owned();
    part.push(PART_SUFFIX);
    let part = parked.join(part);
    std::fs::create_dir_all(&part)?;
    let moved = std::fs::rename(snap, part.join("index"))
        .and_then(|()| std::fs::rename(path, part.join("tree")))
        .and_then(|()| std::fs::rename(&part, parked.join(dir_name)));
    if moved.is_err() {
        // Back where it was, so the caller deletes it; then the rest goes.
        let _ = std::fs::rename(part.join("tree"), path);
        let _ = remove_tree(&part);
    }
    moved
}

/// Removes an attempt's directory, whatever an agent did to its modes or put in its place.
pub fn remove_workspace(path: &Path) -> Result<(), RepoError> {
    remove_tree(path).map_err(|e| io("cannot remove the worktree", path, e))
}

fn remove_file(path: &Path) -> Result<(), RepoError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("cannot remove", path, e)),
        _ => Ok(()),
    }
}

/// `remove_dir_all` that also removes directories an agent made unreadable or unwritable
/// (their modes are restored first); a link is removed, never followed; gone is fine.
pub fn remove_tree(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(_) => {}
        Ok(()) => return Ok(()),
    }
    if !std::fs::symlink_metadata(path)?.is_dir() {
        return std::fs::remove_file(path);
    }
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        for entry in std::fs::read_dir(&dir)?.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
    }
    std::fs::remove_dir_all(path)
}

/// The directory side of a sweep of the run at `root`: the pool and half-done claims go;
/// the snapshots of the directories in `kept` stay (a kept worktree can still be parked),
/// the others go.
pub fn sweep(root: &Path, kept: &[PathBuf]) -> Result<(), RepoError> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let path = entry.path();
        if name == PARKED_DIR || name.as_bytes().starts_with(CLAIM_PREFIX.as_bytes()) {
            remove_tree(&path).map_err(|e| io("cannot remove", &path, e))?;
        }
    }
    let snaps = root.join(SNAP_DIR);
    if let Ok(entries) = std::fs::read_dir(&snaps) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            if !kept.iter().any(|k| k.file_name() == Some(name.as_os_str())) {
                remove_file(&entry.path())?;
            }
        }
    }
    // Gone once empty (an error only means a kept directory's snapshot is in it).
    let _ = std::fs::remove_dir(&snaps);
    Ok(())
}

/// Whether `name`, an entry of a run's root, is the slots' own (not an attempt's directory).
pub fn is_slot_entry(name: &OsStr) -> bool {
    name.as_bytes().starts_with(b".")
}
