//! The seal's one walk (ADR-046): what an agent left in its workspace, found by comparing
//! every file's `lstat` with flotilla's snapshot of the checkout (`slots`, ADR-044), and
//! the tree to commit built from the branch's tip plus only the paths that differ.
//!
//! libgit2's `add_all` + `update_all` walked the tree twice and the commit went through
//! an index of every file. Here a file whose stat is exactly the snapshot's (ctime, which
//! no agent can set back, inode, size, mtime, one link, older than the snapshot) is what
//! flotilla wrote; any other is hashed through libgit2 (its filters and modes), new files
//! under git's ignore rules as `add_all` takes them. What only libgit2's whole add knows
//! how to take (a nested repository, a fifo, an unreadable directory, a submodule that
//! changed, no snapshot) makes the caller fall back to it. It must not know refs, the
//! worktree records or the journal.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use flotilla_actors::ports::RepoError;
use git2::{Oid, Repository};

use super::git;
use super::snapshot::{Snapshot, is_dir, mtime_of, untouched};
use super::tree_delta::{Update, changed_paths, with_updates};
use super::walk_record::{Identity, WalkRecord};
use super::watch::Changes;

const GITLINK: u32 = 0o160000;

/// The tree to commit on top of the tip, and the files left out of it.
pub struct Sealed {
    pub tree: Oid,
    /// Files over the size limit: the tip's version (or none) stays.
    pub too_large: Vec<String>,
    /// Files with more than one link (possibly a file outside the workspace): never read.
    pub hard_links: Vec<String>,
    /// What the walk found not exactly as the snapshot recorded (for the next reset).
    pub walk: WalkRecord,
}

fn text(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

/// What the workspace at `root` (the worktree `worktree`) holds, as a tree on top of
/// `tip`, judged against the snapshot at `snap`, by one walk of the whole workspace.
/// `Ok(None)`: the caller must take the whole add instead (see the module's comment).
pub fn seal_tree(
    worktree: &Repository,
    root: &Path,
    snap: &Path,
    tip: &git2::Tree<'_>,
    max_bytes: u64,
) -> Result<Option<Sealed>, RepoError> {
    seal_tree_with(worktree, root, snap, tip, max_bytes, None)
}

/// Where the search stands on one of the snapshot's entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// Not looked at: with events, nothing named it, so it is as the snapshot says.
    Unchecked,
    Found,
    Gone,
}

/// What the search for changes found, whichever way it looked.
struct Search<'a> {
    snapshot: &'a Snapshot,
    dirs: Vec<&'a [u8]>,
    stamp: (i64, u32),
    seen: Vec<Seen>,
    /// Files whose stat is not the snapshot's.
    candidates: Vec<(Vec<u8>, std::fs::Metadata)>,
    /// Directories read whole (real ones only).
    walked: HashSet<Vec<u8>>,
    /// New directories git ignores, not read.
    skipped_dirs: Vec<Vec<u8>>,
    walk: WalkRecord,
}

impl Search<'_> {
    fn mark(&mut self, path: &[u8], seen: Seen) {
        if let Some(i) = self.snapshot.find(path) {
            self.seen[i] = seen;
        }
    }

    /// The snapshot's entries below the directory `dir`, by position.
    fn below(&self, dir: &[u8]) -> std::ops::Range<usize> {
        let mut prefix = dir.to_vec();
        prefix.push(b'/');
        let entries = &self.snapshot.entries;
        let start = entries.partition_point(|e| e.path.as_slice() < prefix.as_slice());
        let end = start + entries[start..].partition_point(|e| e.path.starts_with(&prefix));
        start..end
    }

    /// `path` is not there (nor anything below it, if it was a directory).
    fn gone(&mut self, path: &[u8]) {
        self.mark(path, Seen::Gone);
        for i in self.below(path) {
            self.seen[i] = Seen::Gone;
        }
    }

    /// Reads every directory of `stack` and all below it. False: only the whole add can
    /// take what it met.
    fn walk_from(
        &mut self,
        worktree: &Repository,
        mut stack: Vec<(PathBuf, Vec<u8>)>,
    ) -> Result<bool, RepoError> {
        let recorded = &self.snapshot.entries;
        while let Some((dir, rel)) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                return Ok(false);
            };
            for entry in entries {
                let Ok(entry) = entry else {
                    return Ok(false);
                };
                let name = entry.file_name();
                if name == ".git" {
                    if rel.is_empty() {
                        continue;
                    }
                    // A nested repository: libgit2 adds it as a submodule, or refuses.
                    return Ok(false);
                }
                let mut path = rel.clone();
                if !path.is_empty() {
                    path.push(b'/');
                }
                path.extend_from_slice(name.as_bytes());
                // Never followed: a link is judged as a link.
                // Relative to the directory read: no walk of the whole path again.
                let Ok(meta) = entry.metadata() else {
                    return Ok(false);
                };
                if meta.is_dir() {
                    if let Some(i) = self.snapshot.find(&path)
                        && recorded[i].mode == GITLINK
                    {
                        self.seen[i] = Seen::Found;
                        // A submodule's directory is never trusted: the reset makes it again.
                        self.walk.remove.push(path);
                        continue;
                    }
                    let in_tree = is_dir(&self.dirs, &path);
                    // A new directory git ignores is not walked (as `add_all`), unless the
                    // tip tracks something in it (then the whole add decides).
                    if !in_tree
                        && worktree
                            .is_path_ignored(Path::new(OsStr::from_bytes(&path)))
                            .map_err(git)?
                    {
                        self.walk.remove.push(path.clone());
                        self.skipped_dirs.push(path);
                        continue;
                    }
                    if !in_tree {
                        // Not the tree's: it goes whole (what is in it is listed too).
                        self.walk.remove.push(path.clone());
                    } else if !plain_dir_mode(meta.mode()) {
                        self.walk.modes.push(path.clone());
                    }
                    stack.push((entry.path(), path));
                    continue;
                }
                if !meta.is_file() && !meta.file_type().is_symlink() {
                    return Ok(false);
                }
                match self.snapshot.find(&path) {
                    Some(i) => {
                        self.seen[i] = Seen::Found;
                        if !untouched(&recorded[i], &meta, self.stamp) {
                            self.candidates.push((path, meta));
                        }
                    }
                    None => self.candidates.push((path, meta)),
                }
            }
            self.walked.insert(rel);
        }
        Ok(true)
    }

    /// Looks at the paths the workspace's watch named (ADR-052), and walks only the
    /// directories made during the attempt. Reaches what [`Self::walk_from`] from the root
    /// would, for a workspace whose every change an event named. False: only the whole add
    /// can take what it met.
    fn by_changes(
        &mut self,
        worktree: &Repository,
        root: &Path,
        changes: &Changes,
    ) -> Result<bool, RepoError> {
        if changes.paths.contains(b"".as_slice()) && !searchable(root) {
            // The root itself made unreadable: the walk could not read it either.
            return Ok(false);
        }
        let mut real_dirs: HashMap<Vec<u8>, Above> = HashMap::new();
        let mut stack: Vec<(PathBuf, Vec<u8>)> = Vec::new();
        let mut walked_roots: Vec<Vec<u8>> = Vec::new();
        for path in &changes.paths {
            let path = path.as_slice();
            if path.is_empty() || path == b".git" {
                continue;
            }
            // Below a directory walked whole: the walk sees it.
            if walked_roots
                .iter()
                .any(|d| path.starts_with(d) && path.get(d.len()) == Some(&b'/'))
            {
                continue;
            }
            let meta = match through_real_dirs(root, path, &mut real_dirs) {
                Above::Dirs => {
                    match std::fs::symlink_metadata(root.join(OsStr::from_bytes(path))) {
                        Ok(meta) => Some(meta),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                        Err(_) => return Ok(false),
                    }
                }
                // A directory above it is gone, or is a link or a file now (itself named).
                Above::Gone | Above::NotDir => None,
                Above::Unreadable => return Ok(false),
            };
            let is_git = path.split(|b| *b == b'/').any(|c| c == b".git");
            let Some(meta) = meta else {
                self.gone(path);
                continue;
            };
            if is_git {
                // A nested repository (or something named .git in it).
                return Ok(false);
            }
            let entry = self.snapshot.find(path);
            if entry.is_some_and(|i| self.snapshot.entries[i].mode == GITLINK) {
                // Submodules are looked at below, each of them.
                continue;
            }
            if meta.is_dir() {
                if !searchable(&root.join(OsStr::from_bytes(path))) {
                    // The walk could not read it either.
                    return Ok(false);
                }
                if let Some(i) = entry {
                    // A file of the snapshot is a directory now.
                    self.seen[i] = Seen::Gone;
                }
                let in_tree = is_dir(&self.dirs, path);
                if in_tree && !changes.new_dirs.contains(path) {
                    // Watched since the reset: what changed in it was named on its own.
                    if !plain_dir_mode(meta.mode()) {
                        self.walk.modes.push(path.to_vec());
                    }
                    continue;
                }
                if !in_tree
                    && worktree
                        .is_path_ignored(Path::new(OsStr::from_bytes(path)))
                        .map_err(git)?
                {
                    self.walk.remove.push(path.to_vec());
                    self.skipped_dirs.push(path.to_vec());
                    continue;
                }
                if !in_tree {
                    self.walk.remove.push(path.to_vec());
                } else if !plain_dir_mode(meta.mode()) {
                    self.walk.modes.push(path.to_vec());
                }
                // Made during the attempt (perhaps where one of the tree's was): nothing
                // watched what went into it.
                walked_roots.push(path.to_vec());
                stack.push((root.join(OsStr::from_bytes(path)), path.to_vec()));
                continue;
            }
            if !meta.is_file() && !meta.file_type().is_symlink() {
                return Ok(false);
            }
            if is_dir(&self.dirs, path) {
                // A directory of the snapshot is a file or a link now.
                for i in self.below(path) {
                    self.seen[i] = Seen::Gone;
                }
            }
            match entry {
                Some(i) => {
                    self.seen[i] = Seen::Found;
                    if !untouched(&self.snapshot.entries[i], &meta, self.stamp) {
                        self.candidates.push((path.to_vec(), meta));
                    }
                }
                None => self.candidates.push((path.to_vec(), meta)),
            }
        }
        if !self.walk_from(worktree, stack)? {
            return Ok(false);
        }
        // What a directory walked whole did not hold is gone.
        for dir in &walked_roots {
            for i in self.below(dir) {
                if self.seen[i] == Seen::Unchecked {
                    self.seen[i] = Seen::Gone;
                }
            }
        }
        // Every submodule's directory, named or not, as the walk meets each: never trusted.
        for i in 0..self.snapshot.entries.len() {
            let entry = &self.snapshot.entries[i];
            if entry.mode != GITLINK || self.seen[i] != Seen::Unchecked {
                continue;
            }
            let path = entry.path.clone();
            let there = through_real_dirs(root, &path, &mut real_dirs) == Above::Dirs
                && std::fs::symlink_metadata(root.join(OsStr::from_bytes(&path)))
                    .is_ok_and(|m| m.is_dir());
            if !there {
                return Ok(false);
            }
            self.seen[i] = Seen::Found;
            self.walk.remove.push(path);
        }
        Ok(true)
    }
}

/// What is above a path: every directory a real, searchable one ([`Above::Dirs`]), one not
/// there ([`Above::Gone`]), one a link or a file ([`Above::NotDir`]), or one that cannot be
/// looked into ([`Above::Unreadable`]: only the whole add decides, as for the walk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Above {
    Dirs,
    Gone,
    NotDir,
    Unreadable,
}

/// Whether a directory can be listed and looked into (the walk's `read_dir` needs both).
fn searchable(dir: &Path) -> bool {
    rustix::fs::access(
        dir,
        rustix::fs::Access::READ_OK | rustix::fs::Access::EXEC_OK,
    )
    .is_ok()
}

/// What is above `rel` under `root` (see [`Above`]). `known` keeps what was found of each
/// directory.
fn through_real_dirs(root: &Path, rel: &[u8], known: &mut HashMap<Vec<u8>, Above>) -> Above {
    for (i, byte) in rel.iter().enumerate() {
        if *byte != b'/' {
            continue;
        }
        let dir = &rel[..i];
        let above = match known.get(dir) {
            Some(above) => *above,
            None => {
                let abs = root.join(OsStr::from_bytes(dir));
                let above = match std::fs::symlink_metadata(&abs) {
                    Ok(meta) if meta.is_dir() && searchable(&abs) => Above::Dirs,
                    Ok(meta) if meta.is_dir() => Above::Unreadable,
                    Ok(_) => Above::NotDir,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Above::Gone,
                    Err(_) => Above::Unreadable,
                };
                known.insert(dir.to_vec(), above);
                above
            }
        };
        if above != Above::Dirs {
            return above;
        }
    }
    Above::Dirs
}

/// [`seal_tree`], from the paths a watch named (`changes`, ADR-052) instead of a walk of
/// every file when there are some.
pub fn seal_tree_with(
    worktree: &Repository,
    root: &Path,
    snap: &Path,
    tip: &git2::Tree<'_>,
    max_bytes: u64,
    changes: Option<&Changes>,
) -> Result<Option<Sealed>, RepoError> {
    let (Ok(snapshot), Ok(stamp)) = (Snapshot::read(snap), mtime_of(snap)) else {
        return Ok(None);
    };
    let (Ok(snapshot_id), Ok(root_id)) = (Identity::of(snap), Identity::of(root)) else {
        return Ok(None);
    };
    let mut search = Search {
        snapshot: &snapshot,
        dirs: snapshot.dirs(),
        stamp,
        seen: vec![Seen::Unchecked; snapshot.entries.len()],
        candidates: Vec::new(),
        walked: HashSet::new(),
        skipped_dirs: Vec::new(),
        walk: WalkRecord {
            snapshot: snapshot_id,
            root: root_id,
            ..WalkRecord::default()
        },
    };
    let complete = match changes {
        Some(changes) => search.by_changes(worktree, root, changes)?,
        None => search.walk_from(worktree, vec![(root.to_path_buf(), Vec::new())])?,
    };
    if !complete {
        return Ok(None);
    }
    if changes.is_none() {
        // Every real directory was read: what was not found is gone.
        for seen in &mut search.seen {
            if *seen == Seen::Unchecked {
                *seen = Seen::Gone;
            }
        }
    }
    let Search {
        seen,
        candidates,
        walked,
        skipped_dirs,
        mut walk,
        ..
    } = search;
    let recorded = &snapshot.entries;
    // What is still wanted was not found: deleted (a submodule's directory gone: fall back).
    let missing = || {
        recorded
            .iter()
            .zip(&seen)
            .filter(|(_, seen)| **seen == Seen::Gone)
    };
    if missing().any(|(e, _)| e.mode == GITLINK) {
        return Ok(None);
    }
    let deleted: Vec<Vec<u8>> = missing().map(|(e, _)| e.path.clone()).collect();
    walk.missing.clone_from(&deleted);
    walk.remove
        .extend(candidates.iter().map(|(path, _)| path.clone()));

    let mut index = git2::Index::new().map_err(git)?;
    worktree.set_index(&mut index).map_err(git)?;
    let mut index = worktree.index().map_err(git)?;
    let mut sealed = Sealed {
        tree: tip.id(),
        too_large: Vec::new(),
        hard_links: Vec::new(),
        walk,
    };
    let mut updates: Vec<Update> = Vec::new();
    let mut handled: HashSet<Vec<u8>> = HashSet::new();
    let in_tip = |path: &[u8]| tip.get_path(Path::new(OsStr::from_bytes(path))).is_ok();
    for (path, meta) in candidates {
        handled.insert(path.clone());
        let rel = Path::new(OsStr::from_bytes(&path));
        let tracked = snapshot.find(&path).is_some() || in_tip(&path);
        if !tracked && worktree.is_path_ignored(rel).map_err(git)? {
            continue;
        }
        if meta.is_file() && meta.len() > max_bytes {
            sealed.too_large.push(text(&path));
            continue;
        }
        // A hard link may be a file outside the worktree: its content is never read.
        if meta.is_file() && meta.nlink() > 1 {
            sealed.hard_links.push(text(&path));
            continue;
        }
        index.add_path(rel).map_err(git)?;
        let added = index
            .get_path(rel, 0)
            .ok_or_else(|| RepoError::Git(format!("{} was not added", rel.display())))?;
        updates.push((path, Some((added.id, added.mode as i32))));
    }
    for path in deleted {
        handled.insert(path.clone());
        updates.push((path, None));
    }
    // What the agent committed itself (the tip moved from the snapshot's tree): where the
    // disk was not found changed above, the commit takes the disk's version again.
    let start = worktree.find_tree(snapshot.tree).map_err(git)?;
    for change in changed_paths(worktree, &start, tip).map_err(git)? {
        let path = change.path;
        if handled.contains(&path) {
            continue;
        }
        if change.after.is_some_and(|(_, mode)| mode as u32 == GITLINK)
            || change
                .before
                .is_some_and(|(_, mode)| mode as u32 == GITLINK)
            || skipped_dirs
                .iter()
                .any(|d| path.starts_with(d) && path.get(d.len()) == Some(&b'/'))
        {
            return Ok(None);
        }
        match snapshot.find(&path).map(|i| &recorded[i]) {
            // Found unchanged on disk by the walk: the disk holds the snapshot's file.
            Some(entry) => updates.push((path, Some((entry.id, entry.mode as i32)))),
            // Not on disk: only the walk could have found it (every real directory was
            // walked), and it did not.
            None => {
                let parent = match path.iter().rposition(|b| *b == b'/') {
                    Some(slash) => path[..slash].to_vec(),
                    None => Vec::new(),
                };
                // With events, only the directories made during the attempt were read:
                // look at the path itself, through real directories only.
                let parent_real = match changes {
                    None => walked.contains(&parent),
                    Some(_) => match through_real_dirs(root, &path, &mut HashMap::new()) {
                        Above::Dirs => true,
                        Above::Gone | Above::NotDir => false,
                        Above::Unreadable => return Ok(None),
                    },
                };
                let there = parent_real
                    && match std::fs::symlink_metadata(root.join(OsStr::from_bytes(&path))) {
                        Ok(_) => true,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                        // Not known to be gone: only the whole add decides.
                        Err(_) => return Ok(None),
                    };
                if there {
                    // An entry the walk saw as new and left out (ignored, too large): the
                    // whole add decides what an ignored tracked file is.
                    return Ok(None);
                }
                updates.push((path, None));
            }
        }
    }
    if !updates.is_empty() {
        sealed.tree = match with_updates(worktree, Some(tip), &updates).map_err(git)? {
            Some(id) => id,
            None => worktree
                .treebuilder(None)
                .and_then(|b| b.write())
                .map_err(git)?,
        };
    }
    Ok(Some(sealed))
}

/// A directory mode the reset keeps as it is: owner rwx, nothing writable by others, no
/// set-id or sticky bit (`slots`' rule for the directories it keeps).
pub fn plain_dir_mode(mode: u32) -> bool {
    let mode = mode & 0o7777;
    mode == (mode & 0o755) | 0o700
}

/// The seal's tree through libgit2's whole add (every file walked, twice), with the stat
/// the worktree's own index lends: for what the one-walk seal leaves to it.
pub fn whole_add(
    repo: &git2::Repository,
    worktree: &git2::Repository,
    root: &Path,
    tip: &git2::Tree<'_>,
    max_bytes: u64,
    hard_links: &mut Vec<String>,
) -> Result<(git2::Oid, Vec<String>), RepoError> {
    let root = root.to_path_buf();
    let mut too_large = Vec::new();
    let mut skip_large = |path: &Path, _: &[u8]| -> i32 {
        use std::os::unix::fs::MetadataExt;
        match std::fs::symlink_metadata(root.join(path)) {
            Ok(meta) if meta.is_file() && meta.len() > max_bytes => {
                too_large.push(path.to_string_lossy().into_owned());
                1
            }
            // A hard link may be a file outside the worktree (`ln ~/.ssh/id_rsa x`): its
            // content is never read into the repository; the seal reports it (ADR-016).
            Ok(meta) if meta.is_file() && meta.nlink() > 1 => {
                hard_links.push(path.to_string_lossy().replace('\\', "/"));
                1
            }
            _ => 0,
        }
    };
    // An index of flotilla's own, in memory, starting from the branch's tree: the one on
    // disk is the agent's to use (or break); only its stat data is borrowed.
    let disk = worktree.path().join("index");
    let mut index = git2::Index::new().map_err(git)?;
    worktree.set_index(&mut index).map_err(git)?;
    let mut index = worktree.index().map_err(git)?;
    index.read_tree(tip).map_err(git)?;
    borrow_stat(&mut index, &disk)?;
    index
        .add_all(["*"], git2::IndexAddOption::DEFAULT, Some(&mut skip_large))
        .map_err(git)?;
    // Files the agent deleted leave the index too; tracked files grown too large stay as
    // they were.
    index
        .update_all(["*"], Some(&mut skip_large))
        .map_err(git)?;
    let tree_id = index.write_tree_to(repo).map_err(git)?;
    Ok((tree_id, too_large))
}

/// Gives each entry of `index` (made from the branch's tree, so without stat data) the
/// stat data of the same file (path, mode and id) in the index file at `disk` (the
/// worktree's own, written by the checkout or the agent's git), so that adding the work
/// tree hashes only files whose stat changed, not every file. Entries as new as the index
/// file are left out (git's racily clean rule: a change in the same tick has the same
/// stat). An index that cannot be read lends nothing (every file is hashed); a forged one
/// can only keep the agent's own change out of its commit, never put anything in.
fn borrow_stat(index: &mut git2::Index, disk: &Path) -> Result<(), RepoError> {
    use std::os::unix::ffi::OsStrExt;
    let written = std::fs::metadata(disk)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
    let (Some(written), Ok(theirs)) = (written, git2::Index::open(disk)) else {
        return Ok(());
    };
    let written = (written.as_secs() as i64, written.subsec_nanos());
    for entry in theirs.iter() {
        let stamp = (i64::from(entry.mtime.seconds()), entry.mtime.nanoseconds());
        // Stage bits: a conflicted entry is no file's stat.
        if stamp >= written || entry.flags & 0x3000 != 0 {
            continue;
        }
        let path = Path::new(std::ffi::OsStr::from_bytes(&entry.path));
        // Only the stat fields: the agent's flags (skip-worktree, intent-to-add) stay its own.
        if let Some(mut ours) = index.get_path(path, 0)
            && ours.id == entry.id
            && ours.mode == entry.mode
        {
            ours.ctime = entry.ctime;
            ours.mtime = entry.mtime;
            ours.dev = entry.dev;
            ours.ino = entry.ino;
            ours.uid = entry.uid;
            ours.gid = entry.gid;
            ours.file_size = entry.file_size;
            index.add(&ours).map_err(git)?;
        }
    }
    Ok(())
}
