//! A workspace followed by inotify (ADR-052): a watch on every directory and every file, so
//! that the seal learns from the events which paths an attempt touched instead of stating
//! every file (`seal_walk`).
//!
//! A directory's watch names what is done to its entries by the name used; a file's own
//! watch reports what is done to its inode through any name (a hard link, a mapping). So a
//! path whose content or entries changed is always named, by its directory's watch or its
//! own. What a watch cannot follow makes the watch **broken**, for good: a queue overflow,
//! a directory moved (the paths of its watches are then wrong, for this attempt and every
//! later one), a watch that could not be added (`ENOSPC`, `EEXIST`: one inode under two
//! paths), the root's watch gone, an event of a watch it does not know, more events than
//! [`MAX_EVENT_BYTES`]. A broken watch names nothing, and its caller walks.
//!
//! It reads events only when asked (non-blocking): the kernel queues them meanwhile, and a
//! full queue is an overflow. It must not know snapshots, git or the actors.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;

/// Why a watch broke when the user's inotify watches or instances ran out.
pub const EXHAUSTED: &str = "the user's inotify watches are used up";

/// Events read in one attempt's life, at most (a build that reads the whole tree makes a
/// few per file): past it the watch is broken rather than the daemon's memory spent.
pub const MAX_EVENT_BYTES: usize = 64 << 20;

/// What a directory's watch reports: its entries made, removed, renamed, written or
/// changed in mode, and itself removed or renamed.
fn dir_mask() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::MODIFY
        | WatchFlags::ATTRIB
        | WatchFlags::CLOSE_WRITE
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::ONLYDIR
        | WatchFlags::DONT_FOLLOW
        | WatchFlags::MASK_CREATE
}

/// What a file's own watch reports, whatever name was used: written, changed in mode or
/// links, opened (a write through a mapping reports no `MODIFY`, and its `CLOSE_WRITE` may
/// come after the writer ended), renamed or removed.
fn file_mask() -> WatchFlags {
    WatchFlags::MODIFY
        | WatchFlags::ATTRIB
        | WatchFlags::CLOSE_WRITE
        | WatchFlags::OPEN
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::DONT_FOLLOW
        | WatchFlags::MASK_CREATE
}

/// The paths an attempt touched, relative to the workspace's root.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changes {
    /// Every path an event named (a file, a link, a directory; perhaps gone since).
    pub paths: BTreeSet<Vec<u8>>,
    /// Directories made while watched: nothing watched what went into them, so the seal
    /// looks at them whole.
    pub new_dirs: BTreeSet<Vec<u8>>,
}

impl Changes {
    fn add(&mut self, other: &Changes) {
        self.paths.extend(other.paths.iter().cloned());
        self.new_dirs.extend(other.new_dirs.iter().cloned());
    }
}

/// One workspace's watches and what they reported: since the last [`WorkspaceWatch::restart`]
/// (a reset's own writes are behind it), and since the last [`WorkspaceWatch::seal_view`].
#[derive(Debug)]
pub struct WorkspaceWatch {
    fd: OwnedFd,
    /// Each watch's path relative to the root (empty for the root) and whether it is a
    /// directory's.
    watched: HashMap<i32, (Vec<u8>, bool)>,
    /// The directories watched, by path (the newest watch of each path: a directory
    /// removed keeps its watch until its last reference goes).
    dirs: HashMap<Vec<u8>, i32>,
    root: Option<i32>,
    broken: Option<&'static str>,
    /// Since the last restart, up to the last seal's view.
    sealed: Changes,
    /// Since the last seal's view (or restart).
    changes: Changes,
    /// Whether anything but an opening was reported since the last seal's view (the
    /// seal's own reads open files).
    wrote: bool,
    read: usize,
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = dir.to_vec();
    if !path.is_empty() {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

impl WorkspaceWatch {
    /// A watch with nothing watched yet; an error where inotify is unavailable (`EMFILE`:
    /// `max_user_instances`).
    pub fn new() -> std::io::Result<WorkspaceWatch> {
        let fd = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC)?;
        Ok(WorkspaceWatch {
            fd,
            watched: HashMap::new(),
            dirs: HashMap::new(),
            root: None,
            broken: None,
            sealed: Changes::default(),
            changes: Changes::default(),
            wrote: false,
            read: 0,
        })
    }

    /// How many watches it holds (of the user's `max_user_watches`).
    pub fn len(&self) -> usize {
        self.watched.len()
    }

    /// Whether it holds no watch.
    pub fn is_empty(&self) -> bool {
        self.watched.is_empty()
    }

    /// Why it names nothing, if it is broken.
    pub fn broken(&self) -> Option<&'static str> {
        self.broken
    }

    fn break_for(&mut self, why: &'static str) {
        if self.broken.is_none() {
            self.broken = Some(why);
        }
    }

    /// Watches the directory or file `rel` under `root` (empty: the root itself, first).
    /// Only for a tree nothing else writes into meanwhile (flotilla's own, between a reset
    /// and the next command): the path's directories are followed as they are.
    pub fn watch(&mut self, root: &Path, rel: &[u8], dir: bool) {
        if self.broken.is_some() {
            return;
        }
        let path = root.join(OsStr::from_bytes(rel));
        let mask = if dir { dir_mask() } else { file_mask() };
        match inotify::add_watch(&self.fd, &path, mask) {
            Ok(wd) => {
                if rel.is_empty() {
                    self.root = Some(wd);
                }
                if dir {
                    self.dirs.insert(rel.to_vec(), wd);
                }
                self.watched.insert(wd, (rel.to_vec(), dir));
            }
            // This very directory is watched already (a checkout made a file in it).
            Err(Errno::EXIST) if dir && self.dirs.contains_key(rel) => {}
            Err(Errno::NOSPC) => self.break_for(EXHAUSTED),
            Err(Errno::EXIST) => self.break_for("one inode under two paths"),
            Err(_) => self.break_for("a path could not be watched"),
        }
    }

    /// Reads what is queued. Never waits.
    pub fn drain(&mut self) {
        for (wd, flags, name) in self.queued() {
            self.apply(wd, flags, name);
        }
    }

    /// The events queued now, read out (at most [`MAX_EVENT_BYTES`] in a period).
    fn queued(&mut self) -> Vec<(i32, ReadFlags, Option<Vec<u8>>)> {
        let mut events = Vec::new();
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 64 << 10];
        let mut reader = inotify::Reader::new(&self.fd, &mut buf);
        let mut failed = None;
        loop {
            if self.read > MAX_EVENT_BYTES {
                failed = Some("more events than an attempt may queue");
                break;
            }
            match reader.next() {
                Ok(event) => {
                    let name = event.file_name().map(|n| n.to_bytes().to_vec());
                    self.read += 16 + name.as_ref().map_or(0, |n| n.len() + 1);
                    events.push((event.wd(), event.events(), name));
                }
                Err(Errno::AGAIN) => break,
                Err(Errno::INTR) => continue,
                Err(_) => {
                    failed = Some("the events could not be read");
                    break;
                }
            }
        }
        if let Some(why) = failed {
            self.break_for(why);
        }
        events
    }

    fn apply(&mut self, wd: i32, flags: ReadFlags, name: Option<Vec<u8>>) {
        if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
            self.break_for("the event queue overflowed");
            return;
        }
        if flags.contains(ReadFlags::IGNORED) {
            // The watch is gone (its inode removed, or its watch taken off).
            if self.root == Some(wd) {
                self.break_for("the root's watch is gone");
            }
            if let Some((path, true)) = self.watched.remove(&wd)
                && self.dirs.get(&path) == Some(&wd)
            {
                self.dirs.remove(&path);
            }
            return;
        }
        let Some((path, dir)) = self.watched.get(&wd).cloned() else {
            self.break_for("an event of an unknown watch");
            return;
        };
        // Not what an attempt wrote: the root's `.git` file, which flotilla writes at each
        // reset and the seal never takes from disk, and the root's own mode and name,
        // which flotilla sets (parking makes it writable, each reset plain) and renames.
        let root_own = dir
            && path.is_empty()
            && name
                .as_deref()
                .is_none_or(|name| name == b".git".as_slice());
        if !root_own && (flags - ReadFlags::OPEN - ReadFlags::ISDIR) != ReadFlags::empty() {
            self.wrote = true;
        }
        match (dir, name) {
            (true, Some(name)) => {
                let child = join(&path, &name);
                if flags.contains(ReadFlags::ISDIR)
                    && flags.intersects(ReadFlags::MOVED_FROM | ReadFlags::MOVED_TO)
                {
                    self.break_for("a directory was moved");
                } else if flags.contains(ReadFlags::ISDIR) && flags.contains(ReadFlags::CREATE) {
                    self.changes.new_dirs.insert(child.clone());
                }
                self.changes.paths.insert(child);
            }
            (true, None) => {
                if flags.contains(ReadFlags::MOVE_SELF) {
                    // The root is renamed by flotilla alone (parking, claiming): the
                    // sandbox binds it, so a command cannot rename it.
                    if self.root != Some(wd) {
                        self.break_for("a directory was moved");
                    }
                } else {
                    self.changes.paths.insert(path);
                }
            }
            (false, _) => {
                if flags.contains(ReadFlags::MOVE_SELF) {
                    // Its path is stale now: the renames are named by the directories'
                    // watches, and the inode is not followed further under this path.
                    let _ = inotify::remove_watch(&self.fd, wd);
                }
                self.changes.paths.insert(path);
            }
        }
    }

    /// Everything reported since the last restart, for a seal, or None when the watch is
    /// broken (the caller walks). What comes after is told apart ([`Self::wrote_since_seal`]).
    pub fn seal_view(&mut self) -> Option<Changes> {
        self.drain();
        let since = std::mem::take(&mut self.changes);
        self.sealed.add(&since);
        self.wrote = false;
        match self.broken {
            Some(_) => None,
            None => Some(self.sealed.clone()),
        }
    }

    /// Whether anything was written since the last seal's view (a late event of the
    /// attempt: a descriptor closed after its process ended), or None when the watch is
    /// broken and cannot say.
    pub fn wrote_since_seal(&mut self) -> Option<bool> {
        self.drain();
        match self.broken {
            Some(_) => None,
            None => Some(self.wrote),
        }
    }

    /// Starts a new attempt's period: what was reported so far (a reset's own writes) is
    /// dropped. False when the watch is broken.
    pub fn restart(&mut self) -> bool {
        self.drain();
        self.sealed = Changes::default();
        self.changes = Changes::default();
        self.wrote = false;
        self.read = 0;
        self.broken.is_none()
    }

    /// Everything reported since the last restart (a test's view), or None when broken;
    /// then a restart.
    pub fn take(&mut self) -> Option<Changes> {
        let view = self.seal_view();
        self.restart();
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(changes: &Changes) -> Vec<String> {
        changes
            .paths
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect()
    }

    /// A tree `a/f`, `b/g`, watched whole, with what its own making reported discarded.
    fn watched() -> (tempfile::TempDir, WorkspaceWatch) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::create_dir_all(root.join("b")).unwrap();
        std::fs::write(root.join("a/f"), "f").unwrap();
        std::fs::write(root.join("b/g"), "g").unwrap();
        let mut watch = WorkspaceWatch::new().unwrap();
        watch.watch(root, b"", true);
        for (rel, dir) in [("a", true), ("b", true), ("a/f", false), ("b/g", false)] {
            watch.watch(root, rel.as_bytes(), dir);
        }
        assert_eq!(watch.take(), Some(Changes::default()));
        (dir, watch)
    }

    #[test]
    fn a_write_through_a_hard_link_names_the_linked_file() {
        let (dir, mut watch) = watched();
        let root = dir.path();
        std::fs::hard_link(root.join("a/f"), root.join("b/l")).unwrap();
        std::fs::write(root.join("b/l"), "changed").unwrap();
        std::fs::remove_file(root.join("b/l")).unwrap();
        let changes = watch.take().unwrap();
        assert!(paths(&changes).contains(&"a/f".to_string()), "{changes:?}");
        assert!(paths(&changes).contains(&"b/l".to_string()), "{changes:?}");
    }

    #[test]
    fn new_directories_are_listed_and_a_moved_directory_breaks_the_watch() {
        let (dir, mut watch) = watched();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/new/deeper")).unwrap();
        std::fs::write(root.join("a/new/deeper/x"), "x").unwrap();
        let changes = watch.take().unwrap();
        assert_eq!(paths(&changes), ["a/new"]);
        assert_eq!(changes.new_dirs.len(), 1);
        std::fs::rename(root.join("b"), root.join("c")).unwrap();
        assert_eq!(watch.take(), None);
        assert_eq!(watch.broken(), Some("a directory was moved"));
        // Broken for good: later periods name nothing either.
        std::fs::write(root.join("a/f"), "later").unwrap();
        assert_eq!(watch.take(), None);
    }

    #[test]
    fn a_mode_a_truncation_and_a_replaced_file_are_named() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, mut watch) = watched();
        let root = dir.path();
        std::fs::set_permissions(root.join("a/f"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(root.join("b/g"))
            .unwrap()
            .set_len(0)
            .unwrap();
        assert_eq!(paths(&watch.take().unwrap()), ["a/f", "b/g"]);
        std::fs::write(root.join("a/tmp"), "new").unwrap();
        std::fs::rename(root.join("a/tmp"), root.join("a/f")).unwrap();
        assert_eq!(paths(&watch.take().unwrap()), ["a/f", "a/tmp"]);
    }

    #[test]
    fn after_a_seal_only_an_attempts_writes_count_not_flotillas_own_or_openings() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, mut watch) = watched();
        let root = dir.path();
        std::fs::write(root.join("a/f"), "the attempt's").unwrap();
        let view = watch.seal_view().unwrap();
        assert!(view.paths.contains(b"a/f".as_slice()));
        // The seal reads files; parking sets the root's mode; a reset writes `.git`.
        std::fs::read(root.join("b/g")).unwrap();
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(root.join(".git"), "gitdir: x\n").unwrap();
        assert_eq!(watch.wrote_since_seal(), Some(false));
        // A second seal still sees everything since the restart.
        assert!(watch.seal_view().unwrap().paths.contains(b"a/f".as_slice()));
        std::fs::write(root.join("b/g"), "late").unwrap();
        assert_eq!(watch.wrote_since_seal(), Some(true));
    }

    #[test]
    fn a_directory_made_again_while_the_old_one_is_held_open_is_watched_anew() {
        let (dir, mut watch) = watched();
        let root = dir.path();
        // Something holds the old directory: its watch lives on, its IGNORED waits.
        let held = std::fs::File::open(root.join("b")).unwrap();
        std::fs::remove_dir_all(root.join("b")).unwrap();
        std::fs::create_dir(root.join("b")).unwrap();
        watch.drain();
        watch.watch(root, b"b", true);
        assert!(watch.restart(), "{:?}", watch.broken());
        std::fs::write(root.join("b/new"), "unseen unless watched").unwrap();
        drop(held);
        let changes = watch.take().unwrap();
        assert!(changes.paths.contains(b"b/new".as_slice()), "{changes:?}");
    }

    #[test]
    fn the_roots_watch_gone_breaks_it_and_the_roots_rename_does_not() {
        let (dir, mut watch) = watched();
        let moved = dir.path().with_extension("moved");
        std::fs::rename(dir.path(), &moved).unwrap();
        assert_eq!(watch.take(), Some(Changes::default()));
        std::fs::remove_dir_all(&moved).unwrap();
        assert_eq!(watch.take(), None);
    }
}
