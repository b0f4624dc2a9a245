//! The planners' read-only tools (ADR-037): `read_file`, `list_dir`, `grep`, `git_log` and
//! `git_show`, over the tree and history of one pinned commit of main, through the
//! [`RepoReader`] port. Never a work tree: what a path can name is what that commit's tree
//! holds ([`TreePath`]), links are shown with their target and not followed, submodules
//! are not entered.
//!
//! A tool's arguments are the model's untrusted text: parsed into typed structs (unknown
//! fields refused), numbers checked and clamped to flotilla's bounds, regexes compiled with
//! a size limit. Every failure is text the model reads back (never an error of the call),
//! and every result is at most the configured bytes.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::llm::conversation::excerpt;
use crate::ports::{
    CommitShown, EntryKind, GrepQuery, GrepReport, ReadBounds, RepoReader, ToolCall, ToolSpec,
    TreeItem, TreePath, commit_name,
};

pub const READ_FILE: &str = "read_file";
pub const LIST_DIR: &str = "list_dir";
pub const GREP: &str = "grep";
pub const GIT_LOG: &str = "git_log";
pub const GIT_SHOW: &str = "git_show";

/// Arguments longer than this are refused unread.
pub const MAX_ARGUMENT_BYTES: usize = 8 * 1024;
/// The longest regex `grep` compiles.
pub const MAX_PATTERN_BYTES: usize = 1024;
/// What a compiled regex may take (the regex crate's own limits, lowered): a pattern that
/// would blow up is refused, and matching is linear in the text.
const REGEX_SIZE_LIMIT: usize = 1 << 20;
const MAX_ENTRIES: usize = 500;
const MAX_MATCHES: usize = 100;
const MAX_FILES_MATCHED: usize = 50;
const MAX_LINE_BYTES: usize = 300;
const MAX_GREP_FILE_BYTES: u64 = 1024 * 1024;
const MAX_GREP_SCAN_BYTES: u64 = 64 * 1024 * 1024;
const MAX_LOG: usize = 50;
const DEFAULT_LOG: usize = 20;
/// Room kept for a result's header and footer lines.
const FRAME_BYTES: usize = 512;

/// The tools' definitions, as a request offers them.
pub fn specs() -> Vec<ToolSpec> {
    let spec = |name: &str, description: &str, parameters: serde_json::Value| ToolSpec {
        name: name.into(),
        description: description.into(),
        parameters,
    };
    vec![
        spec(
            READ_FILE,
            "Read a file of the repository at main's tip (bounded; use offset to read on).",
            json!({"type": "object", "properties": {
                "path": {"type": "string", "description": "repository-relative path"},
                "offset": {"type": "integer", "minimum": 0, "description": "byte offset to start at"},
                "max_bytes": {"type": "integer", "minimum": 1}
            }, "required": ["path"], "additionalProperties": false}),
        ),
        spec(
            LIST_DIR,
            "List a directory of the repository at main's tip (\"\" or \".\" is the root).",
            json!({"type": "object", "properties": {
                "path": {"type": "string"}
            }, "additionalProperties": false}),
        ),
        spec(
            GREP,
            "Search the text files at main's tip for a regular expression (Rust regex syntax), line by line.",
            json!({"type": "object", "properties": {
                "pattern": {"type": "string"},
                "path": {"type": "string", "description": "only files at or under this path"},
                "ignore_case": {"type": "boolean"},
                "max_matches": {"type": "integer", "minimum": 1}
            }, "required": ["pattern"], "additionalProperties": false}),
        ),
        spec(
            GIT_LOG,
            "The commits of main up to its tip, newest first; with path, only those that changed it.",
            json!({"type": "object", "properties": {
                "path": {"type": "string"},
                "max_count": {"type": "integer", "minimum": 1}
            }, "additionalProperties": false}),
        ),
        spec(
            GIT_SHOW,
            "One commit of main's history (a hex id from git_log, or HEAD): its message, files and patch (bounded).",
            json!({"type": "object", "properties": {
                "commit": {"type": "string"}
            }, "required": ["commit"], "additionalProperties": false}),
        ),
    ]
}

/// Bytes the tools' definitions take in a request (their JSON).
pub fn specs_bytes() -> usize {
    serde_json::to_string(&specs()).map_or(0, |text| text.len())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadFileArgs {
    path: String,
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    max_bytes: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListDirArgs {
    #[serde(default)]
    path: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrepArgs {
    pattern: String,
    #[serde(default)]
    path: String,
    #[serde(default)]
    ignore_case: bool,
    #[serde(default)]
    max_matches: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GitLogArgs {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    max_count: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GitShowArgs {
    commit: String,
}

/// The tools of one planning call: `reader` at the pinned `commit`, each result at most
/// `max_result_bytes`.
#[derive(Clone)]
pub struct ReadTools {
    reader: Arc<dyn RepoReader>,
    commit: String,
    max_result_bytes: usize,
}

/// A number the model sent, clamped to `1..=max` (`default` when absent).
fn clamp(asked: Option<u64>, default: usize, max: usize) -> usize {
    asked
        .map_or(default, |n| usize::try_from(n).unwrap_or(usize::MAX))
        .clamp(1, max)
}

fn parse<T: DeserializeOwned>(tool: &str, arguments: &str) -> Result<T, String> {
    if arguments.len() > MAX_ARGUMENT_BYTES {
        return Err(format!(
            "{tool}: the arguments are {} bytes; at most {MAX_ARGUMENT_BYTES} are read",
            arguments.len()
        ));
    }
    let text = if arguments.trim().is_empty() {
        "{}"
    } else {
        arguments
    };
    serde_json::from_str(text).map_err(|e| format!("{tool}: bad arguments: {e}"))
}

fn tree_path(tool: &str, text: &str) -> Result<TreePath, String> {
    TreePath::parse(text).map_err(|e| format!("{tool}: {text:?} cannot be read: {e}"))
}

impl ReadTools {
    pub fn new(reader: Arc<dyn RepoReader>, commit: String, max_result_bytes: usize) -> Self {
        ReadTools {
            reader,
            commit,
            max_result_bytes: max_result_bytes.max(FRAME_BYTES * 2),
        }
    }

    pub fn commit(&self) -> &str {
        &self.commit
    }

    /// What `call` returns, as the model will read it: a result or the reason there is
    /// none, at most `max_result_bytes`.
    pub fn run(&self, call: &ToolCall) -> BoxFuture<'static, String> {
        let this = self.clone();
        let call = call.clone();
        Box::pin(async move {
            let text = match this.dispatch(&call).await {
                Ok(text) | Err(text) => text,
            };
            excerpt(&text, this.max_result_bytes).into_owned()
        })
    }

    async fn dispatch(&self, call: &ToolCall) -> Result<String, String> {
        let name = call.name.as_str();
        let args = call.arguments.as_str();
        let short = self.commit.get(..10).unwrap_or(&self.commit);
        let failed = |e: crate::ports::RepoError| format!("{name}: git could not read: {e}");
        match name {
            READ_FILE => {
                let a: ReadFileArgs = parse(name, args)?;
                let path = tree_path(name, &a.path)?;
                let room = self.max_result_bytes - FRAME_BYTES;
                let bounds = ReadBounds {
                    offset: a.offset,
                    max_bytes: clamp(a.max_bytes, room, room),
                    max_entries: MAX_ENTRIES,
                };
                let item = self
                    .reader
                    .read_path(self.commit.clone(), path.clone(), bounds)
                    .await
                    .map_err(failed)?;
                Ok(show_file(&path, short, a.offset, item))
            }
            LIST_DIR => {
                let a: ListDirArgs = parse(name, args)?;
                let path = tree_path(name, &a.path)?;
                let bounds = ReadBounds {
                    offset: 0,
                    max_bytes: 1024,
                    max_entries: MAX_ENTRIES,
                };
                let item = self
                    .reader
                    .read_path(self.commit.clone(), path.clone(), bounds)
                    .await
                    .map_err(failed)?;
                Ok(show_listing(&path, short, item))
            }
            GREP => {
                let a: GrepArgs = parse(name, args)?;
                if a.pattern.len() > MAX_PATTERN_BYTES {
                    return Err(format!(
                        "grep: the pattern is {} bytes; at most {MAX_PATTERN_BYTES}",
                        a.pattern.len()
                    ));
                }
                let regex = regex::bytes::RegexBuilder::new(&a.pattern)
                    .case_insensitive(a.ignore_case)
                    .size_limit(REGEX_SIZE_LIMIT)
                    .dfa_size_limit(REGEX_SIZE_LIMIT)
                    .build()
                    .map_err(|e| format!("grep: the pattern is not a usable regex: {e}"))?;
                let query = GrepQuery {
                    regex,
                    under: tree_path(name, &a.path)?,
                    max_matches: clamp(a.max_matches, MAX_MATCHES, MAX_MATCHES),
                    max_files: MAX_FILES_MATCHED,
                    max_line_bytes: MAX_LINE_BYTES,
                    max_scan_bytes: MAX_GREP_SCAN_BYTES,
                    max_file_bytes: MAX_GREP_FILE_BYTES,
                };
                let report = self
                    .reader
                    .grep(self.commit.clone(), query)
                    .await
                    .map_err(failed)?;
                Ok(show_grep(&a.pattern, short, &report))
            }
            GIT_LOG => {
                let a: GitLogArgs = parse(name, args)?;
                let path = match &a.path {
                    Some(p) => Some(tree_path(name, p)?),
                    None => None,
                };
                let max = clamp(a.max_count, DEFAULT_LOG, MAX_LOG);
                let log = self
                    .reader
                    .log(self.commit.clone(), path.clone(), max)
                    .await
                    .map_err(failed)?;
                let mut out = match &path {
                    Some(p) => format!(
                        "git log of {p} at {short} ({} commits):\n",
                        log.commits.len()
                    ),
                    None => format!("git log at {short} ({} commits):\n", log.commits.len()),
                };
                for c in &log.commits {
                    let id = c.id.get(..10).unwrap_or(&c.id);
                    out.push_str(&format!("{id} {} <{}> {}\n", c.time, c.author, c.subject));
                }
                if log.walk_cut {
                    out.push_str("[the walk stopped at its bound; older commits not examined]\n");
                }
                Ok(out)
            }
            GIT_SHOW => {
                let a: GitShowArgs = parse(name, args)?;
                let Some(commit) = commit_name(&a.commit) else {
                    return Err(format!(
                        "git_show: {:?} is not a commit name: give a hex id (4 to 40 digits, from git_log) or HEAD",
                        excerpt(&a.commit, 100)
                    ));
                };
                let room = self.max_result_bytes.saturating_sub(4 * FRAME_BYTES);
                let shown = self
                    .reader
                    .show_commit(self.commit.clone(), commit.to_string(), room)
                    .await
                    .map_err(failed)?;
                match shown {
                    Some(shown) => Ok(show_commit(&shown, room)),
                    None => Err(format!(
                        "git_show: no commit {commit} in main's history at {short}"
                    )),
                }
            }
            other => Err(format!(
                "{:?} is not a tool; the tools are {READ_FILE}, {LIST_DIR}, {GREP}, {GIT_LOG} and {GIT_SHOW}",
                excerpt(other, 100)
            )),
        }
    }
}

fn kind_word(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::File => "file",
        EntryKind::Executable => "executable file",
        EntryKind::Directory => "directory",
        EntryKind::Link => "symbolic link",
        EntryKind::Submodule => "submodule",
    }
}

fn show_listing(path: &TreePath, short: &str, item: TreeItem) -> String {
    match item {
        TreeItem::Directory { entries, omitted } => {
            let mut out = format!("{path} at {short}: {} entries\n", entries.len() + omitted);
            for e in entries {
                match (e.kind, e.size) {
                    (EntryKind::Directory, _) => out.push_str(&format!("{}/\n", e.name)),
                    (kind, Some(size)) => {
                        out.push_str(&format!("{} ({}, {size} bytes)\n", e.name, kind_word(kind)))
                    }
                    (kind, None) => out.push_str(&format!("{} ({})\n", e.name, kind_word(kind))),
                }
            }
            if omitted > 0 {
                out.push_str(&format!("[… {omitted} more entries not listed]\n"));
            }
            out
        }
        other => show_other(path, short, other, LIST_DIR),
    }
}

fn show_other(path: &TreePath, short: &str, item: TreeItem, tool: &str) -> String {
    match item {
        TreeItem::Missing => format!("{tool}: {path} does not exist at {short}"),
        TreeItem::Link { target } => format!(
            "{path} is a symbolic link to {target:?} (not followed: read the path it names, if it is in the repository)"
        ),
        TreeItem::Submodule { commit } => {
            format!("{path} is a submodule at commit {commit} (not entered)")
        }
        TreeItem::File { size, .. } => {
            format!("{path} is a file of {size} bytes (use read_file to read it)")
        }
        TreeItem::Directory { entries, omitted } => format!(
            "{path} is a directory of {} entries (use list_dir to list it)",
            entries.len() + omitted
        ),
    }
}

fn show_file(path: &TreePath, short: &str, asked: u64, item: TreeItem) -> String {
    let TreeItem::File {
        size,
        offset,
        bytes,
        binary,
        too_large,
    } = item
    else {
        return show_other(path, short, item, READ_FILE);
    };
    if too_large {
        return format!("{path} is {size} bytes: too large to read");
    }
    if binary {
        return format!("{path} is a binary file of {size} bytes (not shown)");
    }
    if asked > size {
        return format!("read_file: offset {asked} is past the end of {path} ({size} bytes)");
    }
    // End on a whole character, so that reading on from the end misses nothing.
    let valid = match std::str::from_utf8(&bytes) {
        Ok(_) => bytes.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => bytes.len(),
    };
    let text = String::from_utf8_lossy(&bytes[..valid]);
    let end = offset.saturating_add(valid as u64);
    let mut out = format!("{path} at {short}: bytes {offset}..{end} of {size}\n{text}");
    if end < size {
        out.push_str(&format!(
            "\n[… {} more bytes: read on with offset {end}]",
            size - end
        ));
    }
    out
}

fn show_grep(pattern: &str, short: &str, report: &GrepReport) -> String {
    let mut out = format!(
        "grep {:?} at {short}: {} matches in {} files ({} files searched",
        excerpt(pattern, 100),
        report.matches.len(),
        report.files_matched,
        report.files_searched
    );
    if report.files_skipped > 0 {
        out.push_str(&format!(
            ", {} binary or large files skipped",
            report.files_skipped
        ));
    }
    out.push_str(")\n");
    for m in &report.matches {
        out.push_str(&format!("{}:{}: {}\n", m.path, m.line, m.text));
    }
    if let Some(why) = &report.stopped {
        out.push_str(&format!(
            "[stopped early: {why}; narrow the pattern or the path]\n"
        ));
    }
    out
}

fn show_commit(shown: &CommitShown, room: usize) -> String {
    let mut out = format!(
        "commit {}\nauthor {}\ntime {}\nparents {}\n\n{}\n\nfiles:\n",
        shown.id,
        shown.author,
        shown.time,
        shown.parents.join(" "),
        excerpt(shown.message.trim_end(), 2048)
    );
    for f in &shown.files {
        out.push_str(f);
        out.push('\n');
    }
    out.push('\n');
    out.push_str(&excerpt(&shown.patch, room));
    if shown.patch_omitted > 0 {
        out.push_str(&format!(
            "\n[… {} more bytes of patch not shown]",
            shown.patch_omitted
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_from_the_model_are_clamped_and_arguments_bounded() {
        assert_eq!(clamp(None, 20, 50), 20);
        assert_eq!(clamp(Some(0), 20, 50), 1);
        assert_eq!(clamp(Some(u64::MAX), 20, 50), 50);
        let long = format!("{{\"path\": \"{}\"}}", "a".repeat(MAX_ARGUMENT_BYTES));
        let refused = parse::<ListDirArgs>(LIST_DIR, &long).err().unwrap();
        assert!(refused.contains("at most 8192 are read"), "{refused}");
        let empty: ListDirArgs = parse(LIST_DIR, "  ").unwrap();
        assert_eq!(empty.path, "");
        let float = parse::<ReadFileArgs>(READ_FILE, r#"{"path": "a", "offset": 1.5}"#);
        assert!(float.err().unwrap().contains("bad arguments"));
    }

    #[test]
    fn a_slice_ends_on_a_whole_character_and_says_where_to_read_on() {
        let path = TreePath::parse("é.txt").unwrap();
        // "aé" cut after the first byte of "é": the slice ends before it.
        let item = TreeItem::File {
            size: 10,
            offset: 0,
            bytes: vec![b'a', 0xc3],
            binary: false,
            too_large: false,
        };
        let shown = show_file(&path, "abc", 0, item);
        assert!(
            shown.starts_with("é.txt at abc: bytes 0..1 of 10\na"),
            "{shown}"
        );
        assert!(
            shown.ends_with("[… 9 more bytes: read on with offset 1]"),
            "{shown}"
        );
    }

    #[test]
    fn every_tool_has_an_object_schema() {
        let specs = specs();
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, [READ_FILE, LIST_DIR, GREP, GIT_LOG, GIT_SHOW]);
        assert!(specs.iter().all(|s| s.parameters["type"] == "object"));
    }
}
