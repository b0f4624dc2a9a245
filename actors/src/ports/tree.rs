//! Reading one commit's tree, for the planners' read-only tools (ADR-037): what
//! [`RepoReader`](super::RepoReader)'s `read_path`, `grep`, `log` and `show_commit` take and
//! return.
//!
//! Confinement is structural: a [`TreePath`] is looked up in the git tree of a pinned commit,
//! never in a work tree. It cannot be absolute or climb (`..`), and a symbolic link in the
//! tree is reported with its target text, never followed (a lookup never passes through
//! one: git trees do not). Submodules are reported, not entered. Every answer is bounded by
//! its caller's numbers.
//!
//! [`grep_blob`] is the one matcher both the git implementation and test fakes use, so that
//! bounds and binary detection cannot differ between them.

use std::fmt;

use regex::bytes::Regex;

/// The longest path a tool may name.
pub const MAX_TREE_PATH_BYTES: usize = 4096;
/// Bytes at a blob's head in which a NUL makes it binary (git's own heuristic).
pub const BINARY_SNIFF_BYTES: usize = 8000;

/// A repository-relative path, checked: no leading `/`, no `..`, no NUL. `""` is the root;
/// `.` components and repeated or trailing slashes are dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct TreePath(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TreePathError {
    #[error("the path is absolute; name it relative to the repository's root")]
    Absolute,
    #[error("the path climbs out with `..`; paths are relative to the repository's root")]
    Parent,
    #[error("the path contains a NUL byte")]
    Nul,
    #[error("the path is longer than {MAX_TREE_PATH_BYTES} bytes")]
    TooLong,
}

impl TreePath {
    pub fn root() -> Self {
        TreePath(String::new())
    }

    pub fn parse(text: &str) -> Result<Self, TreePathError> {
        if text.len() > MAX_TREE_PATH_BYTES {
            return Err(TreePathError::TooLong);
        }
        if text.contains('\0') {
            return Err(TreePathError::Nul);
        }
        if text.starts_with('/') {
            return Err(TreePathError::Absolute);
        }
        let mut parts = Vec::new();
        for part in text.split('/') {
            match part {
                "" | "." => {}
                ".." => return Err(TreePathError::Parent),
                part => parts.push(part),
            }
        }
        Ok(TreePath(parts.join("/")))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `path` (repository-relative, as a tree walk spells it) is this path or under it.
    pub fn contains(&self, path: &str) -> bool {
        self.is_root()
            || path == self.0
            || (path.starts_with(&self.0) && path.as_bytes().get(self.0.len()) == Some(&b'/'))
    }
}

impl fmt::Display for TreePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_root() {
            f.write_str(".")
        } else {
            f.write_str(&self.0)
        }
    }
}

/// What a tree entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Executable,
    Directory,
    Link,
    Submodule,
}

/// One entry of a directory listing. A name git stores that is not UTF-8 is shown lossily.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    pub name: String,
    pub kind: EntryKind,
    /// Bytes of a file (or of a link's target text).
    pub size: Option<u64>,
}

/// What a path is at the pinned commit, read within [`ReadBounds`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeItem {
    Missing,
    File {
        size: u64,
        /// Where `bytes` start: the offset asked for, at most `size`.
        offset: u64,
        bytes: Vec<u8>,
        /// A NUL in its first [`BINARY_SNIFF_BYTES`]: `bytes` is empty.
        binary: bool,
        /// Larger than [`MAX_BLOB_READ`]: not read at all, `bytes` is empty.
        too_large: bool,
    },
    Directory {
        entries: Vec<TreeEntry>,
        omitted: usize,
    },
    /// A symbolic link: its target as text, never followed.
    Link {
        target: String,
    },
    /// A submodule: the commit it pins, never entered.
    Submodule {
        commit: String,
    },
}

/// The largest blob read into memory for a read or a grep.
pub const MAX_BLOB_READ: u64 = 64 * 1024 * 1024;

/// How much of a path to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadBounds {
    pub offset: u64,
    pub max_bytes: usize,
    pub max_entries: usize,
}

/// A search of the pinned tree's text files.
#[derive(Debug, Clone)]
pub struct GrepQuery {
    pub regex: Regex,
    /// Only files at or under this path.
    pub under: TreePath,
    pub max_matches: usize,
    pub max_files: usize,
    /// A matching line longer than this is cut.
    pub max_line_bytes: usize,
    /// Stop after reading this many bytes of blobs.
    pub max_scan_bytes: u64,
    /// Files larger than this are skipped (and counted).
    pub max_file_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrepMatch {
    pub path: String,
    /// 1-based.
    pub line: u64,
    pub text: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrepReport {
    pub matches: Vec<GrepMatch>,
    pub files_searched: usize,
    pub files_matched: usize,
    /// Binary files, and files larger than the query's `max_file_bytes`, not searched.
    pub files_skipped: usize,
    /// Why the search stopped early, if it did.
    pub stopped: Option<String>,
}

impl GrepReport {
    /// Whether the search must stop: a bound is reached.
    pub fn full(&self, query: &GrepQuery) -> bool {
        self.stopped.is_some()
            || self.matches.len() >= query.max_matches
            || self.files_matched >= query.max_files
    }
}

/// Searches one blob's text into `report`, within the query's bounds.
pub fn grep_blob(query: &GrepQuery, path: &str, bytes: &[u8], report: &mut GrepReport) {
    if report.full(query) {
        return;
    }
    if bytes.len() as u64 > query.max_file_bytes || is_binary(bytes) {
        report.files_skipped += 1;
        return;
    }
    report.files_searched += 1;
    let mut matched = false;
    for (i, line) in bytes.split(|b| *b == b'\n').enumerate() {
        if !query.regex.is_match(line) {
            continue;
        }
        if !matched {
            if report.files_matched >= query.max_files {
                report.stopped = Some(format!("{} files matched", query.max_files));
                return;
            }
            matched = true;
            report.files_matched += 1;
        }
        if report.matches.len() >= query.max_matches {
            report.stopped = Some(format!("{} matches", query.max_matches));
            return;
        }
        let cut = &line[..line.len().min(query.max_line_bytes)];
        let mut text = String::from_utf8_lossy(cut).into_owned();
        if cut.len() < line.len() {
            text.push_str(" […]");
        }
        report.matches.push(GrepMatch {
            path: path.to_string(),
            line: i as u64 + 1,
            text,
        });
    }
}

/// git's heuristic: a NUL byte near the start.
pub fn is_binary(bytes: &[u8]) -> bool {
    bytes[..bytes.len().min(BINARY_SNIFF_BYTES)].contains(&0)
}

/// One commit in a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitLine {
    pub id: String,
    pub author: String,
    /// Seconds since the Unix epoch.
    pub time: i64,
    pub subject: String,
}

/// A log of the pinned commit's history, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitLog {
    pub commits: Vec<CommitLine>,
    /// The walk stopped at its bound of commits examined (a path's log in a long history).
    pub walk_cut: bool,
}

/// One commit shown: its message and its patch against its first parent, bounded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitShown {
    pub id: String,
    pub author: String,
    pub time: i64,
    pub parents: Vec<String>,
    pub message: String,
    /// Lines like `M src/a.rs (+3 -1)`.
    pub files: Vec<String>,
    pub patch: String,
    /// Bytes of patch left out past the bound.
    pub patch_omitted: usize,
}

/// How a commit to show may be named: a hex id (4 to 40 digits) or `HEAD` (the pinned
/// commit). Nothing else: no revision syntax reaches git.
pub fn commit_name(text: &str) -> Option<&str> {
    let text = text.trim();
    let hex = (4..=40).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_hexdigit());
    (hex || text == "HEAD").then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_relative_and_never_climb() {
        assert_eq!(
            TreePath::parse("./src//a.rs/").unwrap().as_str(),
            "src/a.rs"
        );
        assert!(TreePath::parse(".").unwrap().is_root());
        assert!(TreePath::parse("").unwrap().is_root());
        assert_eq!(TreePath::parse("/etc/passwd"), Err(TreePathError::Absolute));
        assert_eq!(TreePath::parse("src/../../x"), Err(TreePathError::Parent));
        assert_eq!(TreePath::parse(".."), Err(TreePathError::Parent));
        assert_eq!(TreePath::parse("a\0b"), Err(TreePathError::Nul));
        assert_eq!(
            TreePath::parse(&"a".repeat(MAX_TREE_PATH_BYTES + 1)),
            Err(TreePathError::TooLong)
        );
        let src = TreePath::parse("src").unwrap();
        assert!(src.contains("src/a.rs") && src.contains("src"));
        assert!(!src.contains("srcx/a.rs"));
    }

    #[test]
    fn commits_are_named_by_hex_ids_or_head_only() {
        assert_eq!(commit_name(" abcd1234 "), Some("abcd1234"));
        assert_eq!(commit_name("HEAD"), Some("HEAD"));
        for bad in ["abc", "HEAD~1", "main", ":/fix", "@{-1}", &"a".repeat(41)] {
            assert_eq!(commit_name(bad), None, "{bad}");
        }
    }

    fn query(pattern: &str) -> GrepQuery {
        GrepQuery {
            regex: Regex::new(pattern).unwrap(),
            under: TreePath::root(),
            max_matches: 3,
            max_files: 2,
            max_line_bytes: 10,
            max_scan_bytes: u64::MAX,
            max_file_bytes: 100,
        }
    }

    #[test]
    fn grep_is_bounded_and_skips_binaries() {
        let q = query("x");
        let mut report = GrepReport::default();
        grep_blob(&q, "bin", b"x\0x", &mut report);
        grep_blob(&q, "big", &[b'x'; 101], &mut report);
        assert_eq!((report.files_skipped, report.matches.len()), (2, 0));
        grep_blob(&q, "a", b"x1\nno\nxxxxxxxxxxxxxxxxxxxxxx\n", &mut report);
        assert_eq!(report.matches[1].line, 3);
        assert!(report.matches[1].text.ends_with(" […]"));
        grep_blob(&q, "b", b"x\nx\n", &mut report);
        assert_eq!(report.matches.len(), 3);
        assert_eq!(report.stopped.as_deref(), Some("3 matches"));
    }
}
