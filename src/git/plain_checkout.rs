//! A fresh attempt directory's checkout without libgit2's per-file attribute lookups, where
//! they provably change nothing (ADR-046, "the fresh checkout"). libgit2's checkout asks,
//! for every file it writes, which filters apply (`text`, `eol`, `ident`, `filter`: a walk
//! up the file's directories through the attribute cache); at 10,000 files that was half of
//! a fresh checkout's CPU. When no attribute can be set anywhere (no `.gitattributes` in
//! the tree, no `info/attributes`, no attributes file in the config's, the user's or the
//! system's place) and the config asks for no conversion (`core.autocrlf`, `core.eol`; a
//! `filter.*` driver needs an attribute to apply), every filter passes each blob through
//! unchanged: the files are the blobs'
//! bytes, with git's modes, written here directly. Anything else (a submodule, a mode
//! other than git's three, a name libgit2's path checks might refuse, a directory not
//! empty) is left to libgit2's checkout, as before.
//!
//! The worktree's index and the snapshot are written from the same entries, with the stat
//! of each file taken from its open handle (ADR-046's reset does the same for its writes).
//! It must not know worktree records, the pool or the actors.

use std::ffi::OsStr;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, Mode, OFlags};

use flotilla_actors::ports::RepoError;

use super::index_file::write_index;
use super::snapshot::{Entry, Snapshot, Stat};
use super::{git, io};

const FILE: i32 = 0o100644;
const EXECUTABLE: i32 = 0o100755;
const LINK: i32 = 0o120000;
/// The longest path (and link target) written here: Linux's `PATH_MAX`.
const MAX_PLAIN_PATH: usize = 4096;
/// The deepest directory written here: each level above the file being written holds a
/// handle open, and a hand-made tree thousands of levels deep would take the daemon's
/// descriptors. Deeper trees are libgit2's.
const MAX_PLAIN_DEPTH: usize = 64;
const TREE: i32 = 0o040000;

/// Checks out the worktree's HEAD into `path` (holding only its `.git` file) when that
/// provably needs no filter; returns the snapshot of what it wrote (the worktree's index
/// written), or `None`, having written nothing, when libgit2's checkout must do it.
pub fn checkout_plain(
    worktree: &git2::Repository,
    path: &Path,
) -> Result<Option<Snapshot>, RepoError> {
    if !no_attributes_or_conversions(worktree) || !holds_only_dot_git(path) {
        return Ok(None);
    }
    let tree = worktree
        .head()
        .and_then(|h| h.peel_to_tree())
        .map_err(git)?;
    let mut files = Vec::new();
    // Each file's whole path stays within `PATH_MAX`, as the watch and the walks need it.
    let max_rel = MAX_PLAIN_PATH.saturating_sub(path.as_os_str().len() + 1);
    if !plain_entries(worktree, &tree, &[], max_rel, &mut files)? {
        return Ok(None);
    }
    // libgit2's checkout makes directories 0755 (less the umask), not 0777, and only
    // those a file needs (a hand-made tree may hold an empty one); one level at a time
    // below `path`, never `path` or above it: a worktree removed meanwhile (a sweep, a
    // cancel) is not made again. Everything is made relative to its directory's handle
    // (the files come in the tree's order, a directory's whole content together), so no
    // path is looked up again from the root at each file.
    let root = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io("cannot open", path, e.into()))?;
    // The directories open now, from the root down: each one's path length and handle;
    // `open_path`, the deepest one's path (each of the others' is a prefix of it).
    let mut open_dirs: Vec<(usize, OwnedFd)> = Vec::new();
    let mut open_path: &[u8] = &[];
    let mut entries = Vec::with_capacity(files.len());
    for (rel, id, mode) in &files {
        let (rel, id, mode) = (rel.as_slice(), *id, *mode);
        let at = |e: rustix::io::Errno| {
            let abs = path.join(OsStr::from_bytes(rel));
            io("cannot write", &abs, e.into())
        };
        let name_start = rel.iter().rposition(|b| *b == b'/').map_or(0, |i| i + 1);
        // Closed: those not above this file.
        while let Some((len, _)) = open_dirs.last() {
            if *len < name_start && rel[*len] == b'/' && rel[..*len] == open_path[..*len] {
                break;
            }
            open_dirs.pop();
        }
        // Made and opened: those above it not open yet.
        let mut from = open_dirs.last().map_or(0, |(len, _)| len + 1);
        while from < name_start {
            let end = from + rel[from..].iter().position(|b| *b == b'/').unwrap_or(0);
            let name = &rel[from..end];
            let parent = open_dirs.last().map_or(&root, |(_, fd)| fd);
            match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o755)) {
                // Made already: a hand-made tree whose entries are out of git's order
                // brings a directory back after another (opened below, never followed).
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(at(e)),
            }
            let dir = rustix::fs::openat(
                parent,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(at)?;
            open_dirs.push((end, dir));
            open_path = &rel[..end];
            from = end + 1;
        }
        let dir = open_dirs.last().map_or(&root, |(_, fd)| fd);
        let name = &rel[name_start..];
        let blob = worktree.find_blob(id).map_err(git)?;
        let stat = if mode == LINK {
            rustix::fs::symlinkat(blob.content(), dir, name).map_err(at)?;
            let stat = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(at)?;
            Stat::of_raw(&stat)
        } else {
            // The modes libgit2 gives (less the umask, as its `open` does).
            let bits = if mode == EXECUTABLE { 0o755 } else { 0o644 };
            let fd = rustix::fs::openat(
                dir,
                name,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(bits),
            )
            .map_err(at)?;
            let mut file = std::fs::File::from(fd);
            let meta = file
                .write_all(blob.content())
                .and_then(|()| file.metadata())
                .map_err(|e| io("cannot write", &path.join(OsStr::from_bytes(rel)), e))?;
            Stat::of(&meta)
        };
        entries.push(Entry {
            path: rel.to_vec(),
            id,
            mode: mode as u32,
            stat,
        });
    }
    // The index's order (bytes of the whole path), not the tree's (a directory sorts as
    // if its name ended in '/').
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    write_index(&worktree.path().join("index"), &entries)?;
    Ok(Some(Snapshot {
        tree: tree.id(),
        entries,
    }))
}

/// The files of `tree` under `prefix`, in the tree's order; false when an
/// entry needs libgit2's checkout (an attributes file, a submodule, another mode, a name
/// that is not plain).
fn plain_entries(
    repo: &git2::Repository,
    tree: &git2::Tree<'_>,
    prefix: &[u8],
    max_rel: usize,
    files: &mut Vec<(Vec<u8>, git2::Oid, i32)>,
) -> Result<bool, RepoError> {
    for entry in tree.iter() {
        let name = entry.name_bytes();
        let mode = entry.filemode();
        // A raw mode git would not write (an agent's hand-made tree: `0120755`) is read
        // one way here and another by libgit2: libgit2 decides.
        if !plain_name(name, mode == LINK)
            || name.eq_ignore_ascii_case(b".gitattributes")
            || entry.filemode_raw() != mode
        {
            return Ok(false);
        }
        let mut rel = prefix.to_vec();
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(name);
        // A hand-made tree thousands of levels deep: libgit2's, not this recursion's.
        if rel.len() > max_rel {
            return Ok(false);
        }
        // A link target the system call refuses (empty, a NUL, too long) that libgit2
        // writes cut short: libgit2's way, or every fresh checkout of it would fail.
        if mode == LINK {
            let target = repo.find_blob(entry.id()).map_err(git)?;
            let target = target.content();
            if target.is_empty() || target.contains(&0) || target.len() >= MAX_PLAIN_PATH {
                return Ok(false);
            }
        }
        match mode {
            TREE => {
                if rel.iter().filter(|b| **b == b'/').count() >= MAX_PLAIN_DEPTH {
                    return Ok(false);
                }
                let sub = repo.find_tree(entry.id()).map_err(git)?;
                if !plain_entries(repo, &sub, &rel, max_rel, files)? {
                    return Ok(false);
                }
            }
            FILE | EXECUTABLE | LINK => files.push((rel, entry.id(), mode)),
            _ => return Ok(false),
        }
    }
    Ok(true)
}

/// A name every path check of libgit2's accepts on any platform setting: printable ASCII
/// (no HFS-ignorable code points), none of `/ \ : ~` (NTFS streams and short names such
/// as `GIT~1`), no trailing dot or space (NTFS trims them), never `.git` in any case, and
/// no link named like git's own files (`.gitmodules`...).
fn plain_name(name: &[u8], link: bool) -> bool {
    !name.is_empty()
        && name != b"."
        && name != b".."
        && name
            .iter()
            .all(|b| (0x20..0x7f).contains(b) && !matches!(b, b'/' | b'\\' | b':' | b'~'))
        && !matches!(name.last(), Some(b'.' | b' '))
        && !name.eq_ignore_ascii_case(b".git")
        && !(link && name.len() >= 4 && name[..4].eq_ignore_ascii_case(b".git"))
}

/// The worktree's directory holds nothing but the `.git` file git wrote.
fn holds_only_dot_git(path: &Path) -> bool {
    std::fs::read_dir(path).is_ok_and(|entries| {
        entries
            .map(|e| e.map(|e| e.file_name()))
            .all(|name| name.is_ok_and(|name| name == ".git"))
    })
}

/// No attribute can apply to any path but from the tree (checked as it is read), and the
/// config asks for no conversion: what libgit2's filters then do is nothing. Whatever
/// cannot be read counts as "maybe".
///
/// A filter driver in the config (`filter.lfs.*`, which installing git-lfs puts in the
/// system's config) changes nothing here: a driver applies only to the paths whose `filter`
/// attribute names it, and no attribute can be set (libgit2 runs no external driver
/// either). Refusing it sent every first checkout on such a machine through libgit2's
/// per-file attribute lookups (ADR-054, amendment).
fn no_attributes_or_conversions(repo: &git2::Repository) -> bool {
    let Ok(config) = repo.config().and_then(|mut c| c.snapshot()) else {
        return false;
    };
    let absent = |key: &str| matches!(config.get_entry(key), Err(e) if e.code() == git2::ErrorCode::NotFound);
    let bool_or_absent =
        |key: &str, want: bool| absent(key) || config.get_bool(key).ok() == Some(want);
    absent("core.attributesfile")
        && absent("core.eol")
        && bool_or_absent("core.autocrlf", false)
        && bool_or_absent("core.symlinks", true)
        && bool_or_absent("core.ignorecase", false)
        && !repo.commondir().join("info/attributes").exists()
        && !repo.path().join("info/attributes").exists()
        && no_file_in_search_path(git2::ConfigLevel::System, "gitattributes")
        && no_file_in_search_path(git2::ConfigLevel::XDG, "attributes")
}

/// None of libgit2's directories for `level` (where it looks for the system's
/// `gitattributes` and the user's `attributes`) holds `name`.
fn no_file_in_search_path(level: git2::ConfigLevel, name: &str) -> bool {
    // SAFETY: reads libgit2's search paths; flotilla never sets them, so no write races
    // this read.
    let Ok(paths) = (unsafe { git2::opts::get_search_path(level) }) else {
        return false;
    };
    paths
        .as_bytes()
        .split(|b| *b == b':')
        .filter(|dir| !dir.is_empty())
        .all(|dir| std::fs::symlink_metadata(Path::new(OsStr::from_bytes(dir)).join(name)).is_err())
}

#[cfg(test)]
mod tests;
