//! Paths an agent names, confined to its worktree. Every file an agent reads, writes or
//! deletes (the built-in agent's tools, the scripted agent's `writes` and `deletes`) goes
//! through [`confine`] first: a relative path, no `..`, nothing in `.git`, and, once the
//! links on the way are followed, still inside the worktree.

use std::path::{Component, Path, PathBuf};

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
