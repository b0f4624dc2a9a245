//! Paths an agent names, confined to its worktree. Every file an agent reads, writes or
//! deletes (the built-in agent's tools, the scripted agent's `writes` and `deletes`) goes
//! through [`confine`] first: a relative path, no `..`, nothing in `.git`, and, once the
//! links on the way are followed, still inside the worktree.
//!
//! The file tools then open what [`confine`] resolved with [`open_confined`]: one directory
//! at a time from the worktree's own descriptor, no link followed (`O_NOFOLLOW`), and the
//! opened file itself checked (`fstat`), never its path again. A regular file with more than
//! one name (a hard link, which `ln /outside/file x` makes with no link for a path check to
//! see) or on another file system is refused (ADR-016).
//!
//! `open_confined` uses `openat` and checks the descriptor: regular, one link, the worktree's
//! device.

use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathRefused {
    #[error("{0:?} is absolute: paths are relative to the worktree")]
    Absolute(String),
    #[error("{0:?} climbs out with '..'")]
    ParentTraversal(String),
    #[error("{0:?} is inside .git, which is flotilla's")]
    GitDirectory(String),
    #[error("{0:?} is empty")]
    Empty(String),
    #[error("{0:?} leads outside the worktree through a symbolic link")]
    Escapes(String),
    #[error("{path:?}: {detail}")]
    Unreadable { path: String, detail: String },
    #[error("{0:?} is not a regular file")]
    NotRegular(String),
    #[error(
        "{path:?} is a hard link ({links} names for one file): the file tools do not touch a file that may also be outside the worktree; write a new file instead"
    )]
    HardLink { path: String, links: u64 },
    #[error("{0:?} is on another file system than the worktree")]
    OtherFileSystem(String),
    #[error("{0:?} changed while it was opened: a link appeared on the way")]
    Changed(String),
}

/// What [`open_confined`] opens a file for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reading a file that exists.
    Read,
    /// Reading and rewriting a file that exists (an edit).
    Edit,
    /// Creating or replacing a file (not truncated here: the caller does, once it has the
    /// file and knows it may), the directories on the way made.
    Write,
}

/// Opens the file `raw` names in `root` for `access`: [`confine`]d first, then walked from
/// the worktree's descriptor one name at a time without following any link (the confined
/// path has none left: a link there now appeared after the check), and the file opened
/// checked by its descriptor: a regular file, with one name, on the worktree's file system.
pub fn open_confined(root: &Path, raw: &str, access: Access) -> Result<std::fs::File, PathRefused> {
    let full = confine(root, raw)?;
    let unreadable = |e: std::io::Error| PathRefused::Unreadable {
        path: quoted(raw),
        detail: e.to_string(),
    };
    let errno = |e: Errno| match e {
        // O_NOFOLLOW met a link.
        Errno::LOOP => PathRefused::Changed(quoted(raw)),
        // A directory, or a FIFO nobody reads (opened without blocking), is no file.
        Errno::ISDIR | Errno::NXIO => PathRefused::NotRegular(quoted(raw)),
        e => unreadable(e.into()),
    };
    let root = std::fs::canonicalize(root).map_err(unreadable)?;
    let relative = full
        .strip_prefix(&root)
        .map_err(|_| PathRefused::Escapes(quoted(raw)))?;
    let mut names: Vec<&OsStr> = relative.components().map(|c| c.as_os_str()).collect();
    let name = names.pop().ok_or_else(|| PathRefused::Empty(quoted(raw)))?;
    let directory = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut dir = rustix::fs::open(&root, directory, Mode::empty()).map_err(errno)?;
    let device = rustix::fs::fstat(&dir).map_err(errno)?.st_dev;
    for part in names {
        if access == Access::Write {
            match rustix::fs::mkdirat(&dir, part, Mode::from_raw_mode(0o777)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(errno(e)),
            }
        }
        let next = match rustix::fs::openat(&dir, part, directory | OFlags::NOFOLLOW, Mode::empty())
        {
            Ok(next) => next,
            // A link where a directory is asked for is "not a directory" to the kernel.
            Err(Errno::NOTDIR)
                if rustix::fs::statat(&dir, part, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Symlink) =>
            {
                return Err(PathRefused::Changed(quoted(raw)));
            }
            Err(e) => return Err(errno(e)),
        };
        if rustix::fs::fstat(&next).map_err(errno)?.st_dev != device {
            return Err(PathRefused::OtherFileSystem(quoted(raw)));
        }
        dir = next;
    }
    let flags = match access {
        Access::Read => OFlags::RDONLY,
        Access::Edit => OFlags::RDWR,
        Access::Write => OFlags::WRONLY | OFlags::CREATE,
    };
    // Without blocking: opening a FIFO would otherwise wait for its other end forever.
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
    let file = rustix::fs::openat(&dir, name, flags, Mode::from_raw_mode(0o666)).map_err(errno)?;
    let stat = rustix::fs::fstat(&file).map_err(errno)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(PathRefused::NotRegular(quoted(raw)));
    }
    #[allow(clippy::useless_conversion)] // nlink_t is u32 on some targets
    let links = u64::from(stat.st_nlink);
    if links > 1 {
        return Err(PathRefused::HardLink {
            path: quoted(raw),
            links,
        });
    }
    if stat.st_dev != device {
        return Err(PathRefused::OtherFileSystem(quoted(raw)));
    }
    Ok(std::fs::File::from(file))
}

/// The most of an agent's path an error quotes.
const QUOTED_CHARS: usize = 200;

fn quoted(raw: &str) -> String {
    raw.chars().take(QUOTED_CHARS).collect()
}

/// `raw` as a path inside `root` (the worktree), or why not. The file need not exist; the
/// part of the path that does exist is resolved (links followed) and must stay in `root`.
pub fn confine(root: &Path, raw: &str) -> Result<PathBuf, PathRefused> {
    let trimmed = raw.trim();
    if trimmed.is_empty() || trimmed.contains('\0') {
        return Err(PathRefused::Empty(quoted(raw)));
    }
    let path = Path::new(trimmed);
    let mut relative = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => {
                if part == ".git" {
                    return Err(PathRefused::GitDirectory(quoted(raw)));
                }
                relative.push(part);
            }
            Component::CurDir => {}
            Component::ParentDir => return Err(PathRefused::ParentTraversal(quoted(raw))),
            Component::RootDir | Component::Prefix(_) => {
                return Err(PathRefused::Absolute(quoted(raw)));
            }
        }
    }
    if relative.as_os_str().is_empty() {
        return Err(PathRefused::Empty(quoted(raw)));
    }
    let unreadable = |e: std::io::Error| PathRefused::Unreadable {
        path: quoted(raw),
        detail: e.to_string(),
    };
    let root = std::fs::canonicalize(root).map_err(unreadable)?;
    let full = root.join(&relative);
    // The deepest part that exists, with its links resolved, must still be under the root;
    // what does not exist yet is made below it.
    let mut existing = full.as_path();
    let resolved = loop {
        match std::fs::canonicalize(existing) {
            Ok(resolved) => break resolved,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // A dangling link is not "missing": it points somewhere.
                if std::fs::symlink_metadata(existing).is_ok() {
                    return Err(PathRefused::Escapes(quoted(raw)));
                }
                match existing.parent() {
                    Some(parent) => existing = parent,
                    None => return Err(PathRefused::Escapes(quoted(raw))),
                }
            }
            Err(e) => return Err(unreadable(e)),
        }
    };
    if !resolved.starts_with(&root) || resolved.starts_with(root.join(".git")) {
        return Err(PathRefused::Escapes(quoted(raw)));
    }
    // (`join("")` would add a trailing slash, which names a directory.)
    match full.strip_prefix(existing) {
        Ok(rest) if !rest.as_os_str().is_empty() => Ok(resolved.join(rest)),
        _ => Ok(resolved),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_in_the_worktree() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join(".git"), "gitdir: elsewhere").unwrap();
        let canonical = std::fs::canonicalize(root).unwrap();
        assert_eq!(
            confine(root, "src/new/lib.rs").unwrap(),
            canonical.join("src/new/lib.rs")
        );
        assert_eq!(confine(root, "./src").unwrap(), canonical.join("src"));
        std::fs::write(root.join("src/lib.rs"), "").unwrap();
        let existing = confine(root, "src/lib.rs").unwrap();
        assert_eq!(existing, canonical.join("src/lib.rs"));
        assert!(
            !existing.to_string_lossy().ends_with('/'),
            "an existing file is not made a directory"
        );
        assert!(matches!(
            confine(root, "/etc/passwd"),
            Err(PathRefused::Absolute(_))
        ));
        assert!(matches!(
            confine(root, "src/../../x"),
            Err(PathRefused::ParentTraversal(_))
        ));
        assert!(matches!(
            confine(root, ".git/config"),
            Err(PathRefused::GitDirectory(_))
        ));
        assert!(matches!(
            confine(root, "a/.git/hooks/pre-commit"),
            Err(PathRefused::GitDirectory(_))
        ));
        assert!(matches!(confine(root, " "), Err(PathRefused::Empty(_))));
        assert!(matches!(confine(root, "."), Err(PathRefused::Empty(_))));
    }

    #[test]
    fn a_link_out_of_the_worktree_is_refused_however_it_is_reached() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("out")).unwrap();
        std::os::unix::fs::symlink("/nonexistent/far", root.join("dangling")).unwrap();
        std::fs::create_dir(root.join("in")).unwrap();
        std::os::unix::fs::symlink(root.join("in"), root.join("inside")).unwrap();
        for raw in ["etc", "etc/passwd", "out/new.rs", "dangling", "dangling/x"] {
            assert!(
                matches!(confine(root, raw), Err(PathRefused::Escapes(_))),
                "{raw}: {:?}",
                confine(root, raw)
            );
        }
        // A link that stays inside is fine.
        let canonical = std::fs::canonicalize(root).unwrap();
        assert_eq!(
            confine(root, "inside/x.rs").unwrap(),
            canonical.join("in/x.rs")
        );
    }
}

#[cfg(test)]
mod open_tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_hard_link_to_a_file_outside_is_neither_read_nor_written() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret");
        std::fs::write(&secret, "outside\n").unwrap();
        std::fs::hard_link(&secret, dir.path().join("x")).unwrap();
        for access in [Access::Read, Access::Edit, Access::Write] {
            let refused = open_confined(dir.path(), "x", access).unwrap_err();
            assert_eq!(
                refused,
                PathRefused::HardLink {
                    path: "x".into(),
                    links: 2
                },
                "{access:?}"
            );
            assert!(refused.to_string().contains("hard link"), "{refused}");
        }
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "outside\n");
    }

    #[test]
    fn a_plain_file_is_opened_and_a_new_one_made_with_its_directories() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = open_confined(dir.path(), "a/b/new.rs", Access::Write).unwrap();
        file.write_all(b"fn x() {}").unwrap();
        drop(file);
        let mut text = String::new();
        open_confined(dir.path(), "a/b/new.rs", Access::Read)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "fn x() {}");
        assert!(matches!(
            open_confined(dir.path(), "a/missing.rs", Access::Read),
            Err(PathRefused::Unreadable { .. })
        ));
        assert!(
            !dir.path().join("a/missing.rs").exists(),
            "reading makes nothing"
        );
        assert_eq!(
            open_confined(dir.path(), "a/b", Access::Read).unwrap_err(),
            PathRefused::NotRegular("a/b".into())
        );
        // A link that stays inside is followed by the check, and the file it names opened.
        std::os::unix::fs::symlink("a/b", dir.path().join("inside")).unwrap();
        assert!(open_confined(dir.path(), "inside/new.rs", Access::Edit).is_ok());
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, Mode::from_raw_mode(0o600)).unwrap();
        for access in [Access::Read, Access::Edit, Access::Write] {
            assert_eq!(
                open_confined(dir.path(), "pipe", access).unwrap_err(),
                PathRefused::NotRegular("pipe".into()),
                "{access:?}"
            );
        }
    }
}
