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

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use flotilla_actors::ports::RepoError;

use super::index_file::write_index;
use super::seal_walk::plain_dir_mode;
use super::snapshot::{Entry, Snapshot, Stat, forget_records_below, is_dir, mtime_of, untouched};
use super::walk_record::{Identity, WalkRecord};
use super::watch::{Changes, WorkspaceWatch};
use super::{git, io};

/// The run root's directory of parked attempt directories.
pub const PARKED_DIR: &str = ".parked";
/// The run root's directory of snapshots of live attempt directories (`.snap/<dir>`).
pub const SNAP_DIR: &str = ".snap";
/// A directory being claimed by an attempt: `.claim-<dir>` (only a crash leaves one).
const CLAIM_PREFIX: &str = ".claim-";
/// A parked entry being written: `.parked/<dir>.part` (only a crash leaves one).
const PART_SUFFIX: &str = ".part";
/// The seal's walk record of a live directory: `.snap/<dir>.walk` (ADR-046 step a).
const WALK_SUFFIX: &str = ".walk";
/// At most this many directories wait in a run's pool; a release past it deletes (the pool
/// holds what the run's workers release between two prepares, a handful).
pub const MAX_PARKED: usize = 16;
/// The worktrees directory's pools of parked directories finished runs left for the next
/// run of their repository: `<worktrees>/.pool/<key>/<run>-<dir>` (ADR-052, decision 3), so
/// that a run's first attempts need not write every file of the tree.
pub const POOL_DIR: &str = ".pool";
/// At most this many directories wait in a repository's pool between its runs (its disk
/// budget, `[worktrees] pool_budget_mb`, binds first for a large tree).
pub const MAX_POOLED: usize = 8;
/// A repository pool's file holding the repository's path (what gc checks). The pool's own
/// files start with a dot; its directories, with the run that left them.
const POOL_REPO_FILE: &str = ".repo";
/// In the pools' directory: a repository's pool being made (`.new-<key>-<nonce>`, renamed
/// to `<key>` once its `.repo` is written) or being removed (`.doomed-<key>-<nonce>`).
const POOL_NEW_PREFIX: &str = ".new-";
const POOL_DOOMED_PREFIX: &str = ".doomed-";
/// A repository pool's file holding its disk budget as the last run that left directories
/// there had it (what `status` shows).
const POOL_BUDGET_FILE: &str = ".budget";
/// How old such a leftover must be before gc takes it for a crash's.
const LEFT_POOL_AGE: std::time::Duration = std::time::Duration::from_secs(600);
/// A pooled directory's file holding the disk it took as it was pooled.
const POOLED_BYTES_FILE: &str = "bytes";

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
/// worker's unlocked checkout, ADR-041). `watched`: the tree is watched for the seals
/// (ADR-052), where they may use the events (the run's sandbox ends every process).
pub fn materialize(
    root: &Path,
    pool: Option<&Path>,
    path: &Path,
    open: &dyn Fn() -> Result<git2::Repository, RepoError>,
    started: &dyn Fn(),
    watched: bool,
) -> Result<Made, RepoError> {
    let dir_name = path
        .file_name()
        .ok_or_else(|| RepoError::Git(format!("{} names no directory", path.display())))?;
    let snap = root.join(SNAP_DIR).join(dir_name);
    // A snapshot of an earlier life of this directory says nothing about the new one.
    super::snapshot::forget(&snap);
    remove_file(&snap)?;
    forget_walk(root, path)?;
    // One an earlier run left is of this repository, but git may have pruned its tree since
    // (a history rewritten, the repository cloned anew at its path): then it is no use.
    let (claimed, pooled) = match claim(root, pool, dir_name)? {
        Some((claimed, true)) if open()?.find_tree(claimed.1.tree).is_err() => {
            forget_watch(&claimed.0.join("tree"));
            remove_tree(&claimed.0).map_err(|e| io("cannot remove", &claimed.0, e))?;
            (None, false)
        }
        // Its seal's walk record lends no trust across runs: the reset walks it.
        Some(((dir, snapshot, stamp, _), true)) => (Some((dir, snapshot, stamp, None)), true),
        Some((claimed, false)) => (Some(claimed), false),
        None => (None, false),
    };
    let (made, record) = match claimed {
        Some(claimed) => {
            let claimed_dir = claimed.0.clone();
            // What git wrote there, for a fresh start if the reset of a pooled one fails.
            let dot_git = path.join(".git");
            let link = std::fs::read(&dot_git).map_err(|e| io("cannot read", &dot_git, e))?;
            let reset = reset(claimed, path, open, started, watched);
            // What is left of the claim (its snapshot; the tree, if the reset failed early).
            let _ = remove_tree(&claimed_dir);
            match reset {
                Ok(record) => (Made::Reused, record),
                // An earlier run's directory git cannot reset any more (an object of its
                // old tree pruned since): made fresh instead of failing the attempt. Full
                // storage is the attempt's to wait out, as for any other.
                Err(e) if pooled && matches!(e.clone().storage_or_self(), RepoError::Git(_)) => {
                    tracing::warn!(
                        path = %path.display(),
                        error = %e,
                        "a workspace an earlier run left could not be reset; checking out fresh"
                    );
                    forget_watch(path);
                    remove_tree(path).map_err(|e| io("cannot remove", path, e))?;
                    std::fs::create_dir(path).map_err(|e| io("cannot create", path, e))?;
                    std::fs::write(&dot_git, link).map_err(|e| io("cannot write", &dot_git, e))?;
                    (Made::Fresh, fresh(path, open)?)
                }
                Err(e) => return Err(e),
            }
        }
        None => {
            started();
            (Made::Fresh, fresh(path, open)?)
        }
    };
    let parent = snap
        .parent()
        .ok_or_else(|| RepoError::Git(format!("{} has no parent", snap.display())))?;
    std::fs::create_dir_all(parent).map_err(|e| io("cannot create", parent, e))?;
    let record = record.write(&snap)?;
    if made == Made::Fresh && watched {
        // Watched from now on, for the seals of this attempt and of those that reuse it.
        forget_watch(path);
        if let Some(watch) = watch_whole(path, &record) {
            keep_watch(path, watch);
        }
    }
    Ok(made)
}

/// Checks the worktree at `path` (holding only its `.git` file) out whole; the record of
/// what it holds.
fn fresh(
    path: &Path,
    open: &dyn Fn() -> Result<git2::Repository, RepoError>,
) -> Result<Snapshot, RepoError> {
    let worktree = open()?;
    // Written directly where no filter can apply (ADR-046, "the fresh checkout").
    match super::plain_checkout::checkout_plain(&worktree, path)? {
        Some(record) => Ok(record),
        None => {
            worktree
                .checkout_head(Some(
                    git2::build::CheckoutBuilder::new()
                        .force()
                        .recreate_missing(true),
                ))
                .map_err(git)?;
            snapshot_of_checkout(&worktree, path)
        }
    }
}

/// A claimed directory: its path, its snapshot, the snapshot's stamp and, when the seal's
/// walk of it can be trusted, what that walk found.
type Claimed = (PathBuf, Snapshot, (i64, u32), Option<WalkRecord>);

/// The path of the seal's walk record of the live attempt directory `path`.
pub fn walk_record_path(root: &Path, path: &Path) -> Option<PathBuf> {
    let mut name = path.file_name()?.to_owned();
    name.push(WALK_SUFFIX);
    Some(root.join(SNAP_DIR).join(name))
}

/// Drops the seal's walk record of `path`: something may write into it after that walk.
pub fn forget_walk(root: &Path, path: &Path) -> Result<(), RepoError> {
    match walk_record_path(root, path) {
        Some(record) => remove_file(&record),
        None => Ok(()),
    }
}

/// The walk record parked with `claimed`, if it is one and belongs to this snapshot and
/// this tree (their inodes, sizes and mtimes, which the park's renames keep): anything
/// else lends no trust, and the reset walks.
fn parked_walk(claimed: &Path) -> Option<WalkRecord> {
    let record = WalkRecord::read(&claimed.join("walk")).ok()?;
    let snapshot = Identity::of(&claimed.join("index")).ok()?;
    let tree = Identity::of(&claimed.join("tree")).ok()?;
    (record.snapshot == snapshot && record.root == tree).then_some(record)
}

/// Takes a parked directory for the attempt `dir_name`, from the run's pool or else from
/// the repository's (`pool`; then `true`): renamed to `.claim-<dir_name>`, so two attempts
/// never take the same one. None when both are empty.
fn claim(
    root: &Path,
    pool: Option<&Path>,
    dir_name: &OsStr,
) -> Result<Option<(Claimed, bool)>, RepoError> {
    let mut claim_name = CLAIM_PREFIX.as_bytes().to_vec();
    claim_name.extend_from_slice(dir_name.as_bytes());
    let claimed = root.join(OsStr::from_bytes(&claim_name));
    // What an earlier try of this attempt left of its claim (it was cut short).
    remove_tree(&claimed).map_err(|e| io("cannot remove", &claimed, e))?;
    if let Some(found) = claim_from(&root.join(PARKED_DIR), &claimed)? {
        return Ok(Some((found, false)));
    }
    match pool {
        Some(pool) => Ok(claim_from(pool, &claimed)?.map(|found| (found, true))),
        None => Ok(None),
    }
}

/// [`claim`] from the pool directory `parked`, into `claimed`.
fn claim_from(parked: &Path, claimed: &Path) -> Result<Option<Claimed>, RepoError> {
    let Ok(entries) = std::fs::read_dir(parked) else {
        return Ok(None);
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        // (A repository pool's own files start with a dot; a run's parked ones never do.)
        if name.as_bytes().ends_with(PART_SUFFIX.as_bytes()) || name.as_bytes().starts_with(b".") {
            continue;
        }
        match std::fs::rename(entry.path(), claimed) {
            Ok(()) => {}
            // Another attempt took it first.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io("cannot claim the parked directory", &entry.path(), e)),
        }
        // A snapshot this build cannot read (damaged, or another version's) lends no trust.
        if std::fs::symlink_metadata(claimed.join("tree")).is_ok_and(|m| m.is_dir())
            && let Ok(snapshot) = Snapshot::take(&claimed.join("index"))
            && let Ok(stamp) = mtime_of(&claimed.join("index"))
        {
            let walk = parked_walk(claimed);
            return Ok(Some((claimed.to_path_buf(), snapshot, stamp, walk)));
        }
        forget_watch(&claimed.join("tree"));
        remove_tree(claimed).map_err(|e| io("cannot remove", claimed, e))?;
    }
    Ok(None)
}

/// Moves the claimed tree to `path` (keeping the `.git` file git wrote there) and resets it
/// to the worktree's HEAD; returns the record of what it holds then. One walk (`clean`),
/// or none when the seal's walk record is trusted (`apply_walk`); then only the paths the
/// new start changes and those deleted are written, and the worktree's index and the
/// record are made from what both already know.
fn reset(
    (claimed, old, stamp, mut walk): Claimed,
    path: &Path,
    open: &dyn Fn() -> Result<git2::Repository, RepoError>,
    started: &dyn Fn(),
    watched: bool,
) -> Result<Snapshot, RepoError> {
    // The tree's watch (ADR-052), if it kept one: anything written since its last seal
    // (a descriptor of the attempt closed late) means the seal's record is not the whole
    // story, and the reset walks.
    let mut watch = take_watch(&claimed.join("tree"));
    if let Some(watch) = watch.as_mut()
        && watch.wrote_since_seal() != Some(false)
    {
        walk = None;
    }
    let dot_git = path.join(".git");
    let link = std::fs::read(&dot_git).map_err(|e| io("cannot read", &dot_git, e))?;
    std::fs::remove_dir_all(path).map_err(|e| io("cannot remove", path, e))?;
    std::fs::rename(claimed.join("tree"), path).map_err(|e| io("cannot move to", path, e))?;
    started();
    let trusted = match walk {
        Some(walk) => apply_walk(path, &old, &walk)?,
        None => None,
    };
    let mut kept = match trusted {
        Some(kept) => kept,
        None => clean(path, &old, stamp)?.kept,
    };
    std::fs::write(&dot_git, link).map_err(|e| io("cannot write", &dot_git, e))?;
    let worktree = open()?;
    let new_tree = worktree
        .head()
        .and_then(|h| h.peel_to_tree())
        .map_err(git)?;
    let old_tree = worktree.find_tree(old.tree).map_err(git)?;
    let changes = super::tree_delta::changed_paths(&worktree, &old_tree, &new_tree).map_err(git)?;
    // What to write: what the new start changes, then what `clean` deleted that the new
    // start holds as before (its id and mode are the record's).
    let mut write: Vec<(Vec<u8>, git2::Oid, u32)> = Vec::new();
    let mut changed: HashSet<&[u8]> = HashSet::with_capacity(changes.len());
    for change in &changes {
        let rel = change.path.as_slice();
        changed.insert(rel);
        if change.before.is_some()
            && let Some(i) = old.find(rel)
            && std::mem::take(&mut kept[i])
        {
            let abs = path.join(OsStr::from_bytes(rel));
            remove_tree(&abs).map_err(|e| io("cannot remove", &abs, e))?;
            remove_empty_parents(path, rel);
        }
        if let Some((id, mode)) = change.after {
            write.push((rel.to_vec(), id, mode as u32));
        }
    }
    for (entry, kept) in old.entries.iter().zip(&kept) {
        if !kept && !changed.contains(entry.path.as_slice()) {
            write.push((entry.path.clone(), entry.id, entry.mode));
        }
    }
    drop(changed);
    let mut entries: Vec<Entry> = old
        .entries
        .into_iter()
        .zip(kept)
        .filter_map(|(entry, kept)| kept.then_some(entry))
        .collect();
    let written: Vec<Vec<u8>> = write.iter().map(|(rel, _, _)| rel.clone()).collect();
    if !write.is_empty() {
        // libgit2 writes them (its filters, modes, links, submodule directories): each is
        // missing on disk, so a checkout limited to these paths writes exactly them (an
        // empty list would mean every path). No index of its own: the worktree's is
        // written below, whole, once.
        let mut checkout = git2::build::CheckoutBuilder::new();
        checkout
            .force()
            .recreate_missing(true)
            .disable_pathspec_match(true)
            .update_index(false)
            .refresh(false);
        for (rel, _, _) in &write {
            checkout.path(rel.as_slice());
        }
        worktree
            .set_index(&mut git2::Index::new().map_err(git)?)
            .map_err(git)?;
        worktree
            .checkout_tree(new_tree.as_object(), Some(&mut checkout))
            .map_err(git)?;
        for (rel, id, mode) in write {
            let abs = path.join(OsStr::from_bytes(&rel));
            let stat = match std::fs::symlink_metadata(&abs) {
                Ok(meta) if mode != 0o160000 => Stat::of(&meta),
                _ => Stat::default(),
            };
            entries.push(Entry {
                path: rel,
                id,
                mode,
                stat,
            });
        }
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    write_index(&worktree.path().join("index"), &entries)?;
    let snapshot = Snapshot {
        tree: new_tree.id(),
        entries,
    };
    if watched {
        rewatch(path, watch, &written, &snapshot);
    }
    Ok(snapshot)
}

/// Removes the directories above `rel` that its removal left empty (a fresh checkout
/// would not make them; one the new start needs is made again by the checkout).
fn remove_empty_parents(root: &Path, rel: &[u8]) {
    let mut rel = rel;
    while let Some(slash) = rel.iter().rposition(|b| *b == b'/') {
        rel = &rel[..slash];
        if std::fs::remove_dir(root.join(OsStr::from_bytes(rel))).is_err() {
            return;
        }
    }
}

/// What [`clean`] left: which of the snapshot's entries are still there (by position), and
/// the disk what is left below the root takes (allocated blocks, from the walk's own stats).
struct Cleaned {
    kept: Vec<bool>,
    bytes: u64,
}

/// Deletes from the directory at `root` everything that is not exactly what `snapshot`
/// recorded (taken no later than `stamp`), without following any link, and says what is
/// left. The root's `.git` always goes.
fn clean(root: &Path, snapshot: &Snapshot, stamp: (i64, u32)) -> Result<Cleaned, RepoError> {
    let dirs = snapshot.dirs();
    let mut kept = vec![false; snapshot.entries.len()];
    let mut bytes: u64 = 0;
    let mut kept_dirs = Vec::new();
    let mut stack: Vec<(PathBuf, Vec<u8>)> = vec![(root.to_path_buf(), Vec::new())];
    while let Some((dir, rel)) = stack.pop() {
        keep_dir_mode(&dir)?;
        let entries = std::fs::read_dir(&dir).map_err(|e| io("cannot read", &dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| io("cannot read", &dir, e))?;
            let mut path = rel.clone();
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(entry.file_name().as_bytes());
            // Never followed: a link is judged as a link (an `lstat` relative to the
            // directory read, not a walk of the whole path again).
            let meta = entry
                .metadata()
                .map_err(|e| io("cannot read", &entry.path(), e))?;
            let blocks = meta.blocks().saturating_mul(512);
            if meta.is_dir() {
                if is_dir(&dirs, &path) && path != b".git" {
                    bytes = bytes.saturating_add(blocks);
                    stack.push((entry.path(), path));
                } else {
                    let abs = entry.path();
                    remove_tree(&abs).map_err(|e| io("cannot remove", &abs, e))?;
                }
                continue;
            }
            match snapshot.find(&path) {
                Some(i) if path != b".git" && untouched(&snapshot.entries[i], &meta, stamp) => {
                    kept[i] = true;
                    bytes = bytes.saturating_add(blocks);
                }
                _ => {
                    let abs = entry.path();
                    std::fs::remove_file(&abs).map_err(|e| io("cannot remove", &abs, e))?;
                }
            }
        }
        if !rel.is_empty() {
            kept_dirs.push(dir);
        }
    }
    // Emptied directories go (deepest first), as a fresh checkout would not make them;
    // the checkout makes again those it needs. (Their blocks stay counted: a measure may
    // be high, never low.)
    for dir in kept_dirs.iter().rev() {
        let _ = std::fs::remove_dir(dir);
    }
    Ok(Cleaned { kept, bytes })
}

/// What `clean` does, from the seal's walk record instead of a walk (ADR-046 step a): the
/// record's paths are deleted, the directories it names get a plain mode, the root's
/// `.git` goes, and those the deletions emptied go. Says which of the snapshot's entries
/// are still there; None when the directory is not what the record says (a link or a file
/// where it saw a directory): nothing is done through it, and the caller walks.
fn apply_walk(
    root: &Path,
    snapshot: &Snapshot,
    walk: &WalkRecord,
) -> Result<Option<Vec<bool>>, RepoError> {
    keep_dir_mode(root)?;
    let dot_git = root.join(".git");
    remove_tree(&dot_git).map_err(|e| io("cannot remove", &dot_git, e))?;
    let mut kept = vec![true; snapshot.entries.len()];
    // Shallowest first: a directory goes before what the record lists in it.
    let mut remove: Vec<&[u8]> = walk.remove.iter().map(Vec::as_slice).collect();
    remove.sort_by_key(|p| (p.iter().filter(|b| **b == b'/').count(), *p));
    for rel in remove {
        if let Some(i) = snapshot.find(rel) {
            kept[i] = false;
        }
        match through_real_dirs(root, rel)? {
            Some(true) => {}
            // Gone with a directory deleted before it.
            Some(false) => continue,
            None => return Ok(None),
        }
        let abs = root.join(OsStr::from_bytes(rel));
        remove_tree(&abs).map_err(|e| io("cannot remove", &abs, e))?;
        remove_empty_parents(root, rel);
    }
    for rel in &walk.missing {
        if let Some(i) = snapshot.find(rel) {
            kept[i] = false;
        }
        match through_real_dirs(root, rel)? {
            Some(true) => remove_empty_parents(root, rel),
            Some(false) => {}
            None => return Ok(None),
        }
    }
    for rel in &walk.modes {
        let abs = root.join(OsStr::from_bytes(rel));
        match through_real_dirs(root, rel)? {
            Some(true) => match std::fs::symlink_metadata(&abs) {
                Ok(meta) if meta.is_dir() => keep_dir_mode(&abs)?,
                Ok(_) => return Ok(None),
                Err(_) => {}
            },
            Some(false) => {}
            None => return Ok(None),
        }
    }
    Ok(Some(kept))
}

/// Whether every directory above `rel` under `root` is a real one (no link, no file), so
/// that a path built from it cannot lead outside: `Some(true)`; `Some(false)` when one is
/// not there (deleted with a directory above); None when one is a link or a file (the
/// record is not the directory's state).
fn through_real_dirs(root: &Path, rel: &[u8]) -> Result<Option<bool>, RepoError> {
    for (i, byte) in rel.iter().enumerate() {
        if *byte != b'/' {
            continue;
        }
        let dir = root.join(OsStr::from_bytes(&rel[..i]));
        match std::fs::symlink_metadata(&dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Some(false)),
            Err(e) => return Err(io("cannot read", &dir, e)),
        }
    }
    Ok(Some(true))
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
    if !plain_dir_mode(mode) {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(plain))
            .map_err(|e| io("cannot set the mode of", dir, e))?;
    }
    Ok(())
}

/// The daemon's watches of its workspaces (ADR-052), by the tree directory's device and
/// inode, which the park's and claim's renames keep, each with when it was kept (the
/// oldest go first past [`max_watched_trees`]). A tree removed without
/// [`forget_watch`] leaves its entry broken (its root's watch gone) until it is evicted.
struct Registry {
    trees: HashMap<(u64, u64), (u64, WorkspaceWatch)>,
    kept: u64,
    /// Until when no new watch is made: the user's watches or instances ran out.
    exhausted_until: Option<std::time::Instant>,
}

fn watches() -> &'static Mutex<Registry> {
    static WATCHES: OnceLock<Mutex<Registry>> = OnceLock::new();
    WATCHES.get_or_init(|| {
        Mutex::new(Registry {
            trees: HashMap::new(),
            kept: 0,
            exhausted_until: None,
        })
    })
}

/// Trees watched at once, at most: the live attempts and the parked ones, with room, and
/// no more than a quarter of the user's inotify instances (one a tree; the rest are the
/// user's editors' and the agents' own watchers').
fn max_watched_trees() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let instances = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(128);
        (4 * MAX_PARKED).min(instances / WATCH_SHARE)
    })
}

/// The share of the user's `max_user_watches` the daemon takes, at most: the rest is the
/// user's editors' and the agents' own watchers'.
const WATCH_SHARE: usize = 4;

/// After the user's watches ran out, no new watch for this long (the seals walk).
const EXHAUSTED_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// The user's inotify watch limit (`fs.inotify.max_user_watches`), read once.
fn max_user_watches() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(8192)
    })
}

fn tree_key(path: &Path) -> Option<(u64, u64)> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    meta.is_dir().then(|| (meta.dev(), meta.ino()))
}

/// Takes the watch of the tree at `path` out of the registry, if it has one.
fn take_watch(path: &Path) -> Option<WorkspaceWatch> {
    let key = tree_key(path)?;
    watches().lock().ok()?.trees.remove(&key).map(|(_, w)| w)
}

/// Keeps `watch` for the tree at `path` (a broken one is dropped; one that ran out of the
/// user's watches stops new ones for a while).
fn keep_watch(path: &Path, watch: WorkspaceWatch) {
    let (Some(key), Ok(mut all)) = (tree_key(path), watches().lock()) else {
        return;
    };
    if let Some(why) = watch.broken() {
        if why == super::watch::EXHAUSTED {
            all.exhausted_until = Some(std::time::Instant::now() + EXHAUSTED_FOR);
        }
        return;
    }
    drop_if_over(&mut all, key);
    all.kept += 1;
    let kept = all.kept;
    all.trees.insert(key, (kept, watch));
}

/// No new watch for a while: the user's inotify watches or instances ran out.
fn exhausted() {
    if let Ok(mut all) = watches().lock() {
        all.exhausted_until = Some(std::time::Instant::now() + EXHAUSTED_FOR);
    }
}

/// Makes room for `key` among at most [`max_watched_trees`].
fn drop_if_over(all: &mut Registry, key: (u64, u64)) {
    if !all.trees.contains_key(&key) && all.trees.len() >= max_watched_trees() {
        // The oldest kept: its seal walks, nothing worse.
        let oldest = all
            .trees
            .iter()
            .min_by_key(|(_, (kept, _))| *kept)
            .map(|(key, _)| *key);
        if let Some(oldest) = oldest {
            all.trees.remove(&oldest);
        }
    }
}

/// Whether a new watch of `entries` paths fits the daemon's share of the user's watches,
/// and the user's watches have not run out lately. Trees removed without their watch
/// dropped (their root's watch is gone: the queue says so) hold none of it; live trees are
/// never evicted for a new one (a tree past the budget seals by the walk, and evicting
/// would make every reset watch its tree whole again).
fn room_for_watches(entries: usize) -> bool {
    let Ok(mut all) = watches().lock() else {
        return false;
    };
    if all
        .exhausted_until
        .is_some_and(|until| std::time::Instant::now() < until)
    {
        return false;
    }
    all.trees.retain(|_, (_, watch)| {
        watch.drain();
        watch.broken().is_none()
    });
    let held: usize = all.trees.values().map(|(_, w)| w.len()).sum();
    held.saturating_add(entries) <= max_user_watches() / WATCH_SHARE
}

/// Drops the watches of the trees in the pool directory or claim at `path` (`.parked`:
/// `<dir>/tree` each; a claim: `tree`).
fn forget_watches_below(path: &Path) {
    forget_watch(&path.join("tree"));
    if let Ok(entries) = std::fs::read_dir(path) {
        for entry in entries.flatten() {
            forget_watch(&entry.path().join("tree"));
        }
    }
}

/// Drops the watch of the tree at `path` (it is being removed).
pub fn forget_watch(path: &Path) {
    drop(take_watch(path));
}

/// What the watch of the workspace at `path` reported since its reset, for the seal
/// (ADR-052); None when it has no watch or its watch broke (the seal walks).
pub fn changes_for_seal(path: &Path) -> Option<Changes> {
    // Out of the registry while its events are read: other workers' trees wait for none.
    let mut watch = take_watch(path)?;
    let changes = watch.seal_view();
    keep_watch(path, watch);
    changes
}

/// A watch on every directory and file of the tree at `path`, which holds exactly
/// `snapshot` (flotilla's checkout, before any command ran). None where inotify cannot.
fn watch_whole(path: &Path, snapshot: &Snapshot) -> Option<WorkspaceWatch> {
    let dirs = snapshot.dirs();
    // The root, each directory, each file.
    if !room_for_watches(1 + dirs.len() + snapshot.entries.len()) {
        return None;
    }
    let mut watch = match WorkspaceWatch::new() {
        Ok(watch) => watch,
        Err(_) => {
            // No instance left (`max_user_instances`): none tried for a while.
            exhausted();
            return None;
        }
    };
    watch.watch(path, b"", true);
    for dir in dirs {
        watch.watch(path, dir, true);
    }
    for entry in &snapshot.entries {
        // A submodule's directory is made again by every reset, never trusted.
        if entry.mode != 0o160000 {
            watch.watch(path, &entry.path, false);
        }
    }
    if watch.restart() {
        Some(watch)
    } else {
        // Dropped; if the user's watches ran out, none is tried for a while.
        keep_watch(path, watch);
        None
    }
}

/// After a reset that wrote `written` into the tree at `path`: the watch of the tree (if
/// it had one and it held) follows the new files and the directories made for them, and
/// starts the attempt's period; else the whole tree is watched anew.
fn rewatch(path: &Path, watch: Option<WorkspaceWatch>, written: &[Vec<u8>], snapshot: &Snapshot) {
    let watch = match watch {
        Some(mut watch) if watch.broken().is_none() => {
            // The reset's removals first: a directory it removed and the checkout made
            // again is a new inode, to be watched anew.
            watch.drain();
            let mut seen: HashSet<&[u8]> = HashSet::new();
            for rel in written {
                let mut end = 0;
                while let Some(slash) = rel[end..].iter().position(|b| *b == b'/') {
                    end += slash;
                    if seen.insert(&rel[..end]) {
                        watch.watch(path, &rel[..end], true);
                    }
                    end += 1;
                }
                if snapshot
                    .find(rel)
                    .is_some_and(|i| snapshot.entries[i].mode != 0o160000)
                {
                    watch.watch(path, rel, false);
                }
            }
            if watch.restart() {
                Some(watch)
            } else {
                keep_watch(path, watch);
                None
            }
        }
        _ => None,
    };
    if let Some(watch) = watch.or_else(|| watch_whole(path, snapshot)) {
        keep_watch(path, watch);
    }
}

/// The record of a fresh checkout: what the worktree's index (libgit2's, just written)
/// lists, with each file's stat read now.
fn snapshot_of_checkout(worktree: &git2::Repository, path: &Path) -> Result<Snapshot, RepoError> {
    let tree = worktree
        .head()
        .and_then(|h| h.peel_to_tree())
        .map_err(git)?
        .id();
    let index = worktree.index().map_err(git)?;
    let mut entries = Vec::with_capacity(index.len());
    for entry in index.iter() {
        // Stage bits: nothing conflicted is a file flotilla wrote.
        if entry.flags & 0x3000 != 0 {
            continue;
        }
        let file = path.join(OsStr::from_bytes(&entry.path));
        // A submodule's directory is no file: its stat is never trusted.
        let stat = match std::fs::symlink_metadata(&file) {
            Ok(meta) if entry.mode != 0o160000 => Stat::of(&meta),
            _ => Stat::default(),
        };
        entries.push(Entry {
            path: entry.path,
            id: entry.id,
            mode: entry.mode,
            stat,
        });
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Snapshot { tree, entries })
}

/// Parks the released attempt directory `path` of the run at `root` for a later attempt,
/// and says whether it did: not when it has no snapshot, is not a plain directory (a link
/// put in its place) or the pool is full. Its worktree record is already gone. A few
/// renames: the caller holds the repository's lock, so that the run's final sweep never
/// misses a directory parked as it runs. With `trusted` (nothing wrote into it since its
/// seal's walk: ADR-046 step a) the walk's record goes with it; without, it is dropped.
pub fn park(root: &Path, path: &Path, trusted: bool) -> bool {
    let Some(dir_name) = path.file_name() else {
        return false;
    };
    let walk = walk_record_path(root, path).filter(|_| trusted);
    if !trusted && forget_walk(root, path).is_err() {
        return false;
    }
    let snap = root.join(SNAP_DIR).join(dir_name);
    let parked = root.join(PARKED_DIR);
    let plain_dir = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir());
    let room = std::fs::read_dir(&parked).map_or(0, |e| e.count()) < MAX_PARKED;
    // An agent may have left its root unwritable: moving it needs its `..` writable.
    plain_dir
        && room
        && snap.is_file()
        && keep_dir_mode(path).is_ok()
        && park_renames(&snap, walk.as_deref(), path, &parked, dir_name).is_ok()
}

/// Deletes the released attempt directory `path` that was not parked, and its snapshot.
pub fn discard(root: &Path, path: &Path) -> Result<(), RepoError> {
    if let Some(dir_name) = path.file_name() {
        let snaps = root.join(SNAP_DIR);
        super::snapshot::forget(&snaps.join(dir_name));
        remove_file(&snaps.join(dir_name))?;
        forget_walk(root, path)?;
        // Gone once empty (an error only means another directory's snapshot is in it).
        let _ = std::fs::remove_dir(&snaps);
    }
    remove_workspace(path)
}

/// Snapshot (and the seal's walk record, if any) and tree into `.parked/<dir>.part`, then
/// that renamed to `.parked/<dir>`: a parked entry is whole or has the suffix claims skip.
fn park_renames(
    snap: &Path,
    walk: Option<&Path>,
    path: &Path,
    parked: &Path,
    dir_name: &OsStr,
) -> std::io::Result<()> {
    let mut part = dir_name.to_owned();
    part.push(PART_SUFFIX);
    let part = parked.join(part);
    std::fs::create_dir_all(&part)?;
    if let Some(walk) = walk {
        // No record (the seal fell back to the whole add, or this is not its directory's):
        // the next reset walks.
        let _ = std::fs::rename(walk, part.join("walk"));
    }
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
    forget_watch(path);
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
/// the others go. `leave_for`: the run is over, and its parked directories may wait in
/// this repository pool for the next run of the repository (the pool, the repository's
/// path for gc, the pool's disk budget in bytes; see [`leave_parked`]).
pub fn sweep(
    root: &Path,
    kept: &[PathBuf],
    leave_for: Option<(&Path, &Path, u64)>,
) -> Result<(), RepoError> {
    // First, whatever fails below: memory is no place for what a sweep removes.
    forget_records_below(root);
    let Ok(entries) = std::fs::read_dir(root) else {
        return Ok(());
    };
    if let Some((pool, repo, budget_bytes)) = leave_for {
        leave_parked(root, pool, repo, budget_bytes);
    }
    for entry in entries.flatten() {
        let name = entry.file_name();
        let path = entry.path();
        if name == PARKED_DIR || name.as_bytes().starts_with(CLAIM_PREFIX.as_bytes()) {
            forget_watches_below(&path);
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

/// Moves the run's parked directories (each whole: its tree, snapshot and walk record) into
/// the repository's `pool`, while it holds fewer than [`MAX_POOLED`] and the disk they take
/// stays within `budget_bytes` with what is there. Each is first cleaned (`clean`: what an
/// agent added or changed goes, every directory gets a plain mode, so that the next run
/// resets only what flotilla wrote and its build outputs take no budget the next reset
/// would free anyway), then measured, links not followed; one that cannot be measured
/// whole is not pooled. Best effort: what is not moved is removed with the run. Their
/// watches go (an idle daemon holds none); the next run's reset watches anew. The caller
/// holds the repository's lock (two runs' sweeps of one repository never interleave).
fn leave_parked(root: &Path, pool: &Path, repo: &Path, budget_bytes: u64) {
    let parked = root.join(PARKED_DIR);
    let Ok(entries) = std::fs::read_dir(&parked) else {
        return;
    };
    let (mut count, mut held_bytes) = pool_usage(pool);
    if count >= MAX_POOLED || !make_pool(pool, repo) {
        return;
    }
    let run = root.file_name().unwrap_or_default();
    // The last directory's measure: the run's others hold the same tree, about as much.
    let mut last: u64 = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name.as_bytes().ends_with(PART_SUFFIX.as_bytes()) {
            continue;
        }
        // Each one cleaned and measured is a walk under the repository's lock: none once
        // another would not fit.
        if count >= MAX_POOLED || held_bytes.saturating_add(last) > budget_bytes {
            return;
        }
        // Its watch goes (an idle daemon holds none), saying first whether anything was
        // written since the last seal: if not, the seal's walk record stands for a walk.
        let unwritten = take_watch(&entry.path().join("tree"))
            .is_some_and(|mut watch| watch.wrote_since_seal() == Some(false));
        let Some((bytes, by_record)) = cleaned_size(&entry.path(), unwritten) else {
            continue;
        };
        last = bytes;
        // Over the budget: removed with the run, and (the others being about as large)
        // the next turn stops.
        if held_bytes.saturating_add(bytes) > budget_bytes
            || std::fs::write(entry.path().join(POOLED_BYTES_FILE), bytes.to_string()).is_err()
        {
            continue;
        }
        let mut pooled = run.to_owned();
        pooled.push("-");
        pooled.push(&name);
        if by_record {
            note_pooled_by_record(&pooled);
        }
        if std::fs::rename(entry.path(), pool.join(pooled)).is_ok() {
            count += 1;
            held_bytes = held_bytes.saturating_add(bytes);
            let _ = std::fs::write(pool.join(POOL_BUDGET_FILE), budget_bytes.to_string());
        }
    }
}

/// The parked directory `dir` holding only what flotilla checked out and nothing an
/// agent changed, and its walk record gone (it no longer describes the tree); then the
/// disk it takes. None when any of it fails: a directory not measured whole is not pooled.
///
/// `unwritten`: its watch saw nothing written since the last seal, so the seal's walk
/// record, where it is this tree's, is what a walk would find: its paths are deleted
/// (`apply_walk`) and the tree's disk is counted from the snapshot (each file's size
/// rounded up to the file system's block: exact on tmpfs and ext4, high where a file
/// system keeps small files inline) and its directories' stats. Otherwise `clean` walks
/// and measures the tree by its stats.
/// (The next run's reset walks a pooled tree whole either way, ADR-052.)
fn cleaned_size(dir: &Path, unwritten: bool) -> Option<(u64, bool)> {
    // Not kept in memory: the closing sweep has just dropped its run's records.
    let snapshot = Snapshot::take(&dir.join("index")).ok()?;
    let tree = dir.join("tree");
    let applied = match unwritten.then(|| parked_walk(dir)).flatten() {
        Some(walk) => apply_walk(&tree, &snapshot, &walk).ok()?,
        None => None,
    };
    let (in_tree, by_record) = match applied {
        Some(kept) => (recorded_disk(&tree, &snapshot, &kept)?, true),
        None => {
            let stamp = mtime_of(&dir.join("index")).ok()?;
            (clean(&tree, &snapshot, stamp).ok()?.bytes, false)
        }
    };
    remove_file(&dir.join("walk")).ok()?;
    Some((
        measured_disk(dir, &tree)?.saturating_add(in_tree),
        by_record,
    ))
}

/// The names of the last pooled directories cleaned by their seal's record rather than a
/// walk (at most 64): which way a directory went, for the tests and a debugger.
fn pooled_by_record_names() -> &'static Mutex<VecDeque<OsString>> {
    static NAMES: OnceLock<Mutex<VecDeque<OsString>>> = OnceLock::new();
    NAMES.get_or_init(Default::default)
}

fn note_pooled_by_record(name: &OsStr) {
    if let Ok(mut names) = pooled_by_record_names().lock() {
        if names.len() >= 64 {
            names.pop_front();
        }
        names.push_back(name.to_owned());
    }
}

/// Whether the pooled directory `name` (its name in the repository's pool) was cleaned by
/// its seal's walk record, as far as this process remembers.
pub fn pooled_by_record(name: &OsStr) -> bool {
    pooled_by_record_names()
        .lock()
        .is_ok_and(|names| names.iter().any(|n| n == name))
}

/// The disk the entries of `snapshot` still in `tree` (`kept`) take, each file's size
/// rounded up to the file system's block, and its directories (one `lstat` each, far
/// fewer than the files; a large directory takes more than a block). None if a directory
/// cannot be looked at.
fn recorded_disk(tree: &Path, snapshot: &Snapshot, kept: &[bool]) -> Option<u64> {
    let block = std::fs::symlink_metadata(tree).ok()?.blksize().max(512);
    let files = snapshot
        .entries
        .iter()
        .zip(kept)
        .filter(|(_, kept)| **kept)
        .map(|(entry, _)| entry.stat.size.div_ceil(block).saturating_mul(block))
        .fold(0u64, u64::saturating_add);
    let mut dirs: u64 = 0;
    for dir in snapshot.dirs() {
        match std::fs::symlink_metadata(tree.join(OsStr::from_bytes(dir))) {
            Ok(meta) => dirs = dirs.saturating_add(meta.blocks().saturating_mul(512)),
            // Emptied by the record's deletions, and removed.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => return None,
        }
    }
    Some(files.saturating_add(dirs))
}

/// The disk the files under `path` take (allocated blocks), links not followed, the
/// directory `measured` counted as itself alone (its content measured already); None if a
/// directory or an entry cannot be read (never counted as empty).
fn measured_disk(path: &Path, measured: &Path) -> Option<u64> {
    let mut total: u64 = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).ok()? {
            let entry = entry.ok()?;
            let meta = entry.path().symlink_metadata().ok()?;
            total = total.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() && entry.path() != measured {
                stack.push(entry.path());
            }
        }
    }
    Some(total)
}

/// Makes the repository's pool `pool`, or any directory of [`repository_dir`]'s (its
/// `.repo` naming the repository's canonical path), unless it is there: written under
/// another name first and renamed into place, so that gc never finds one without its
/// `.repo`. Whether it is there now.
pub(super) fn make_pool(pool: &Path, repo: &Path) -> bool {
    let repo_file = pool.join(POOL_REPO_FILE);
    if repo_file.is_file() {
        return true;
    }
    let (Some(new), Ok(canonical)) = (
        beside_pool(pool, POOL_NEW_PREFIX),
        std::fs::canonicalize(repo),
    ) else {
        return false;
    };
    let made = std::fs::create_dir_all(&new)
        .and_then(|()| std::fs::write(new.join(POOL_REPO_FILE), canonical.as_os_str().as_bytes()))
        .and_then(|()| std::fs::rename(&new, pool));
    if made.is_err() {
        // Another made it first, or the storage refused.
        let _ = remove_tree(&new);
    }
    repo_file.is_file()
}

/// Empties the repository pool `pool` (a run with `pool_budget_mb = 0` ended): moved
/// aside first, so that no claim takes from what is being removed.
pub fn empty_pool(pool: &Path) {
    let Some(doomed) = beside_pool(pool, POOL_DOOMED_PREFIX) else {
        return;
    };
    if std::fs::rename(pool, &doomed).is_ok() {
        forget_watches_below(&doomed);
        let _ = remove_tree(&doomed);
    }
}

/// A name beside the repository pool `pool` for it being made or removed:
/// `<prefix><key>-<random>`, which gc takes for a crash's once it is old.
fn beside_pool(pool: &Path, prefix: &str) -> Option<PathBuf> {
    let (pools, key) = (pool.parent()?, pool.file_name()?);
    let mut name = std::ffi::OsString::from(prefix);
    name.push(key);
    name.push(format!("-{:016x}", rand::random::<u64>()));
    Some(pools.join(name))
}

/// How many directories the repository pool `pool` holds, and the disk they took as they
/// were pooled (one whose measure is unreadable counts as over any budget).
fn pool_usage(pool: &Path) -> (usize, u64) {
    let Ok(entries) = std::fs::read_dir(pool) else {
        return (0, 0);
    };
    let mut count = 0;
    let mut bytes: u64 = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name.as_bytes().starts_with(b".") {
            continue;
        }
        let measured = match std::fs::read_to_string(entry.path().join(POOLED_BYTES_FILE)) {
            Ok(text) => text.trim().parse::<u64>().unwrap_or(u64::MAX),
            // Claimed meanwhile (a run's claim takes no lock): no longer the pool's.
            Err(_) if !entry.path().exists() => continue,
            Err(_) => u64::MAX,
        };
        count += 1;
        bytes = bytes.saturating_add(measured);
    }
    (count, bytes)
}

/// One line for `status`: what the pool of the repository at `repo` (in the worktrees
/// directory `worktrees`) holds for its next run, against the budget of the last run that
/// left directories there; `None` when it holds nothing.
pub fn describe_pool(worktrees: &Path, repo: &Path) -> Option<String> {
    let pool = repository_pool(worktrees, repo)?;
    let (count, bytes) = pool_usage(&pool);
    if count == 0 {
        return None;
    }
    let budget = std::fs::read_to_string(pool.join(POOL_BUDGET_FILE))
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok());
    let mib = |b: u64| b.div_ceil(1024 * 1024);
    let size = if bytes == u64::MAX {
        "not all measured".to_string()
    } else {
        format!("{} MiB", mib(bytes))
    };
    let mut line = format!(
        "{count} workspace{} kept for the repository's next run, {size}",
        if count == 1 { "" } else { "s" },
    );
    if let Some(budget) = budget {
        line.push_str(&format!(" of {} MiB", mib(budget)));
    }
    Some(line)
}

/// The pool of the repository at `repo` in the worktrees directory `worktrees`: named by
/// the SHA-1 of the repository's canonical path.
pub fn repository_pool(worktrees: &Path, repo: &Path) -> Option<PathBuf> {
    repository_dir(worktrees, POOL_DIR, repo)
}

/// The directory of the repository at `repo` among the worktrees directory's `kind`
/// directories (its pool, [`POOL_DIR`]; its warm trees, `warm::WARM_DIR`): named by the
/// SHA-1 of the repository's canonical path.
pub fn repository_dir(worktrees: &Path, kind: &str, repo: &Path) -> Option<PathBuf> {
    let canonical = std::fs::canonicalize(repo).ok()?;
    let sum = <sha1::Sha1 as sha1::Digest>::digest(canonical.as_os_str().as_bytes());
    let key: String = sum[..8].iter().map(|b| format!("{b:02x}")).collect();
    Some(worktrees.join(kind).join(key))
}

/// The repository pools in the worktrees directory `worktrees` whose repository is gone
/// (its path no repository, or its pool no longer the one its path names): what gc
/// removes. With `remove`, they are removed too.
pub fn stale_pools(worktrees: &Path, remove: bool) -> Vec<PathBuf> {
    stale_repository_dirs(worktrees, POOL_DIR, remove)
}

/// [`stale_pools`] for any `kind` of per-repository directory ([`repository_dir`]).
pub fn stale_repository_dirs(worktrees: &Path, kind: &str, remove: bool) -> Vec<PathBuf> {
    let mut stale = Vec::new();
    let Ok(entries) = std::fs::read_dir(worktrees.join(kind)) else {
        return stale;
    };
    for entry in entries.flatten() {
        let pool = entry.path();
        let name = entry.file_name();
        if name.as_bytes().starts_with(b".") {
            // What a crash left of making or removing a pool, once surely not in use.
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > LEFT_POOL_AGE));
            if (name.as_bytes().starts_with(POOL_NEW_PREFIX.as_bytes())
                || name.as_bytes().starts_with(POOL_DOOMED_PREFIX.as_bytes()))
                && old
            {
                if remove {
                    let _ = remove_tree(&pool);
                }
                stale.push(pool);
            }
            continue;
        }
        let repo = std::fs::read(pool.join(POOL_REPO_FILE))
            .ok()
            .map(|bytes| PathBuf::from(OsStr::from_bytes(&bytes)));
        let live = repo.is_some_and(|repo| {
            git2::Repository::open(&repo).is_ok()
                && repository_dir(worktrees, kind, &repo).as_deref() == Some(pool.as_path())
        });
        if !live {
            if remove {
                empty_pool(&pool);
            }
            stale.push(pool);
        }
    }
    stale
}

/// Whether `name`, an entry of a run's root, is the slots' own (not an attempt's directory).
pub fn is_slot_entry(name: &OsStr) -> bool {
    name.as_bytes().starts_with(b".")
}
