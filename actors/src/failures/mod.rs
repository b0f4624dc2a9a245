//! The Reconciler's deterministic failure handling: parsing, classification and grouping
//! (pure: no I/O, no time, no LLM).
//!
//! After a sweep runs the configured build, typecheck and test commands on main, the
//! Reconciler turns what they printed into a few fix tasks. This module is the part that
//! needs no model:
//!
//! - [`parse_output_in`] reads one command's output into [`Failure`]s. Every parser runs on
//!   every output and recognizes its format by content (cargo/rustc JSON and human output,
//!   cargo test, tsc, pytest, go test, then a generic `path:line: message` fallback); the
//!   command's [`CommandKind`] only decides the class of failures that nothing classifies
//!   better. [`markers_failures`] turns conflict-marker hits into failures.
//! - [`classify_and_group`] keeps only the highest [`FailureClass`] present (the seed's error
//!   priority: conflict markers > build > compile > test, and never tasks for two levels in
//!   one sweep) and groups related failures into [`FixGroup`]s: one per symbol (a renamed
//!   type breaks its callers in many files: one task), one per import chain (a file cannot
//!   find an export of another: one task scoped to both), else one per file and cause.
//! - [`describe`] writes a group as a bounded fix-task description.
//!
//! Command output is untrusted: agents wrote the code that prints it. Every parser is bounded
//! (line length, failures per output, message length), never panics, and strips terminal
//! escapes and control characters before any text can reach a prompt.
//!
//! [`fix_scope`] checks a sweep fix's scope as any task's is checked (path rules,
//! `max_scope_paths`, never empty; ADR-019).
//!
//! Files: `parse/` holds one parser per output format (`rust` for cargo/rustc, `libtest`, `go`,
//! `tsc`, `pytest`, `fallback`) around the shared line-by-line state in `parse/mod.rs`; `paths`
//! reads locations and normalizes paths; `text` cleans untrusted text; `group` and `describe`
//! hold the helpers of [`classify_and_group`] and [`describe`]. Each file's tests sit beside
//! it in `*_tests.rs`. Nothing here knows the actors, the journal, processes or time.

mod describe;
mod group;
mod parse;
mod paths;
#[cfg(test)]
mod test_fixtures;
mod text;

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocol::ScopePath;

use describe::*;
use group::*;
use parse::Parser;
use parse::fallback::{NOTHING_PRINTED, catch_all};
use paths::*;
use text::*;

/// Failures kept from one command's output; the rest is dropped (a sweep fixes at most a few
/// groups anyway, and the next sweep sees what is left).
pub const MAX_FAILURES: usize = 1_000;
/// Characters kept of one failure's message (the catch-all's tail: [`MAX_TAIL_BYTES`]).
pub const MAX_MESSAGE_CHARS: usize = 500;
/// Lines longer than this are skipped unread: no tool prints a diagnostic that long.
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// Failures a [`FixGroup`] carries (it counts all of them in `failures_total`).
pub const MAX_GROUP_FAILURES: usize = 20;
/// Bytes of a [`describe`]d fix task.
pub const MAX_DESCRIPTION_BYTES: usize = 4 * 1024;
/// Fix tasks one sweep creates at most (the seed's rule), for callers of
/// [`classify_and_group`].
pub const MAX_FIX_GROUPS: usize = 5;
/// Bytes of output kept in the catch-all failure when nothing else parsed.
pub const MAX_TAIL_BYTES: usize = 2 * 1024;
/// Characters kept of a symbol, test name or code.
const MAX_FIELD_CHARS: usize = 200;
/// Bytes of a path: longer ones are not paths a compiler printed.
const MAX_PATH_BYTES: usize = 1_024;
/// Lines of a panic or go test message kept.
const MAX_MESSAGE_LINES: usize = 8;

/// What kind of failure, in the seed's priority order. The derived order makes
/// `ConflictMarkers` the greatest (the variants are declared from lowest to highest), so the
/// class a sweep fixes is simply the `max()` of those present: nothing builds until markers
/// are resolved, nothing type-checks until it builds, and test results mean little until the
/// code compiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// A test failed: a functional regression.
    Test,
    /// A type or name-resolution error: type-safety violations compound, so fix them first.
    Compile,
    /// The project cannot be built at all: syntax, manifest, dependency or linker errors.
    Build,
    /// Unresolved merge conflict markers: nothing works until they are resolved.
    ConflictMarkers,
}

impl FailureClass {
    /// Higher is fixed first (consistent with `Ord`): conflict markers 4, build 3, compile 2,
    /// test 1.
    pub fn priority(self) -> u8 {
        match self {
            FailureClass::ConflictMarkers => 4,
            FailureClass::Build => 3,
            FailureClass::Compile => 2,
            FailureClass::Test => 1,
        }
    }

    /// The stable name used in signatures (the serde name).
    fn slug(self) -> &'static str {
        match self {
            FailureClass::ConflictMarkers => "conflict_markers",
            FailureClass::Build => "build",
            FailureClass::Compile => "compile",
            FailureClass::Test => "test",
        }
    }

    fn noun(self, plural: bool) -> &'static str {
        match (self, plural) {
            (FailureClass::ConflictMarkers, _) => "merge conflict markers",
            (FailureClass::Build, false) => "build failure",
            (FailureClass::Build, true) => "build failures",
            (FailureClass::Compile, false) => "compile error",
            (FailureClass::Compile, true) => "compile errors",
            (FailureClass::Test, false) => "test failure",
            (FailureClass::Test, true) => "test failures",
        }
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureClass::ConflictMarkers => "conflict markers",
            FailureClass::Build => "build failure",
            FailureClass::Compile => "compile error",
            FailureClass::Test => "test failure",
        })
    }
}

/// Which configured sweep command produced an output. It decides only the class of failures
/// that carry no better signal (the generic fallback and the catch-all): a compiler error
/// printed by the test command is still a compile error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandKind {
    Build,
    Typecheck,
    Test,
}

impl CommandKind {
    fn default_class(self) -> FailureClass {
        match self {
            CommandKind::Build => FailureClass::Build,
            CommandKind::Typecheck => FailureClass::Compile,
            CommandKind::Test => FailureClass::Test,
        }
    }
}

/// One failure a command reported. Paths are normalized repo-relative (`/`-separated, no `.`
/// or `..`); a path that is absolute or leaves the repository is `None`, so a scope is never
/// built from it. Text fields hold no control characters except the newlines of a multi-line
/// `message` (a panic, the catch-all's tail).
///
/// The field order is the sort order (file, then line, column, ...), which the grouping
/// relies on for deterministic groups.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Failure {
    pub class: FailureClass,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub column: Option<u32>,
    /// The tool's code: `E0412`, `TS2304`.
    pub code: Option<String>,
    /// At most [`MAX_MESSAGE_CHARS`] characters (the catch-all: [`MAX_TAIL_BYTES`] bytes).
    pub message: String,
    /// The name the error is about (`Foo` in "cannot find type `Foo`"): failures about the
    /// same symbol are one problem (a renamed type and its broken callers), whatever file
    /// they are in.
    pub symbol: Option<String>,
    /// The failing test's name.
    pub test: Option<String>,
    /// Import chain: the file the missing export should come from, when it can be derived
    /// (`crate::a::B` → `src/a.rs`, `'./b'` from `src/a.ts` → `src/b.ts`). A fix usually
    /// touches both files, so the group's scope includes it.
    pub related_file: Option<String>,
}

impl Failure {
    fn new(class: FailureClass, message: String) -> Failure {
        Failure {
            class,
            file: None,
            line: None,
            column: None,
            code: None,
            message,
            symbol: None,
            test: None,
            related_file: None,
        }
    }
}

/// Related failures that one fix task should handle together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FixGroup {
    pub class: FailureClass,
    /// Sorted, deduplicated repo-relative files: the failures' files and related files.
    /// Empty: no failure said where it is; the reconciler treats that as the whole repo.
    pub scope: Vec<String>,
    /// The first [`MAX_GROUP_FAILURES`] failures, sorted by file, line, column.
    pub failures: Vec<Failure>,
    pub failures_total: usize,
    /// What ties the failures together: the symbol (in backticks), the imported files, the
    /// code, the message, or the file.
    pub cause: String,
    /// A stable key for deduplication across sweeps: a hash of the class, the cause and the
    /// scope, never of line numbers or order, so the same unresolved problem in the next
    /// sweep gives the same signature. `<class>-<16 hex digits>`.
    pub signature: String,
    /// One line, e.g. "Fix compile errors about `Calc` in src/a.rs, src/b.rs".
    pub title: String,
}

// ---------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------

/// [`parse_output_in`] without a root to strip: absolute paths become `None`.
pub fn parse_output(kind: CommandKind, text: &str) -> Vec<Failure> {
    parse_output_in(kind, text, None)
}

/// The failures in one failed command's output. `root` is the absolute directory the command
/// ran in (the sweep's scratch checkout): paths under it become repo-relative, and it is
/// removed from messages (it changes every sweep and would only add noise). Call this only
/// for a command that failed: when nothing parses, the result is one catch-all failure with
/// no file whose message is the output's last non-empty lines.
pub fn parse_output_in(kind: CommandKind, text: &str, root: Option<&str>) -> Vec<Failure> {
    let root = root.and_then(normalize_root);
    let mut parser = Parser::new(root.clone());
    for raw in text.split('\n') {
        if raw.len() > MAX_LINE_BYTES {
            continue;
        }
        let line = clean_line(raw);
        parser.line(&line, kind, true);
    }
    let failures = parser.finish();
    if failures.is_empty() {
        vec![catch_all(kind, text, root.as_deref())]
    } else {
        failures
    }
}

/// Conflict-marker hits (path, line) → one failure per file, class `ConflictMarkers`, at the
/// file's first marker, the message listing the marker lines. Files are sorted.
pub fn markers_failures(hits: &[(String, u32)]) -> Vec<Failure> {
    let mut by_file: BTreeMap<Option<String>, BTreeSet<u32>> = BTreeMap::new();
    for (path, line) in hits {
        let file = normalize_path(path, None);
        if !by_file.contains_key(&file) && by_file.len() >= MAX_FAILURES {
            continue;
        }
        by_file.entry(file).or_default().insert(*line);
    }
    by_file
        .into_iter()
        .map(|(file, lines)| {
            const LISTED: usize = 20;
            let mut listed: Vec<String> = lines.iter().take(LISTED).map(u32::to_string).collect();
            if lines.len() > LISTED {
                listed.push(format!("… ({} in all)", lines.len()));
            }
            let plural = if lines.len() == 1 { "" } else { "s" };
            let mut failure = Failure::new(
                FailureClass::ConflictMarkers,
                format!(
                    "unresolved merge conflict markers (<<<<<<<, =======, >>>>>>>) at line{plural} {}",
                    listed.join(", ")
                ),
            );
            failure.line = lines.first().copied();
            failure.file = file;
            failure
        })
        .collect()
}

/// What a command killed at its time limit after `secs` seconds found: what its output
/// says failed so far, and that it timed out (never "failed without printing anything":
/// the command did not fail, it did not finish).
pub fn timed_out(
    kind: CommandKind,
    line: &str,
    secs: u64,
    output: &str,
    root: Option<&str>,
) -> Vec<Failure> {
    let mut found: Vec<Failure> = parse_output_in(kind, output, root)
        .into_iter()
        .filter(|f| f.message != NOTHING_PRINTED)
        .collect();
    let line = clean_text(line, root, false, MAX_FIELD_CHARS);
    found.truncate(MAX_FAILURES - 1);
    found.push(Failure::new(
        kind.default_class(),
        format!("`{line}` timed out after {secs} s"),
    ));
    found
}

// ---------------------------------------------------------------------------------------
// Grouping and description
// ---------------------------------------------------------------------------------------

/// The fix groups for one sweep: only the highest class present, related failures together
/// (one symbol across files; an import chain with the file it imports from; else one file
/// and one code or message; tests by file; everything without a file in one group with an
/// empty scope), biggest first then by scope, at most `max_groups`.
pub fn classify_and_group(failures: &[Failure], max_groups: usize) -> Vec<FixGroup> {
    let Some(top) = failures.iter().map(|f| f.class).max() else {
        return Vec::new();
    };
    let mut chosen: Vec<Failure> = failures
        .iter()
        .filter(|f| f.class == top)
        .cloned()
        .map(|mut f| {
            f.file = f.file.and_then(|p| normalize_path(&p, None));
            f.related_file = f.related_file.and_then(|p| normalize_path(&p, None));
            f
        })
        .collect();
    // Sorted first, so the groups do not depend on the order of the input.
    chosen.sort();
    chosen.dedup();

    let mut parent: Vec<usize> = (0..chosen.len()).collect();
    let mut first_with: HashMap<Key, usize> = HashMap::new();
    for (i, failure) in chosen.iter().enumerate() {
        for key in group_keys(top, failure) {
            match first_with.entry(key) {
                Entry::Occupied(e) => union(&mut parent, *e.get(), i),
                Entry::Vacant(e) => {
                    e.insert(i);
                }
            }
        }
    }
    let mut sets: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for i in 0..chosen.len() {
        let root = find(&mut parent, i);
        sets.entry(root).or_default().push(i);
    }
    let mut located: Vec<(Vec<String>, Vec<Failure>)> = Vec::new();
    let mut unlocated: Vec<Failure> = Vec::new();
    for members in sets.into_values() {
        let members: Vec<Failure> = members.into_iter().map(|i| chosen[i].clone()).collect();
        let scope: BTreeSet<String> = members
            .iter()
            .flat_map(|f| [f.file.clone(), f.related_file.clone()])
            .flatten()
            .collect();
        if scope.is_empty() {
            // One whole-repo group per class, however many unlocated causes.
            unlocated.extend(members);
        } else {
            located.push((scope.into_iter().collect(), members));
        }
    }
    if !unlocated.is_empty() {
        unlocated.sort();
        located.push((Vec::new(), unlocated));
    }
    let mut groups: Vec<FixGroup> = located
        .into_iter()
        .map(|(scope, members)| build_group(top, scope, members))
        .collect();
    groups.sort_by(|a, b| {
        b.failures_total
            .cmp(&a.failures_total)
            .then_with(|| a.scope.cmp(&b.scope))
            .then_with(|| a.signature.cmp(&b.signature))
    });
    groups.truncate(max_groups);
    groups
}

/// A fix task's description: what is broken, where, and the failures themselves
/// (`file:line:col [code] message`), at most [`MAX_DESCRIPTION_BYTES`]. Every piece of tool
/// output in it is escaped (control and invisible characters as `\u{…}`); the only raw
/// control characters are the description's own line breaks.
pub fn describe(group: &FixGroup) -> String {
    const RESERVE: usize = 120;
    let mut out = String::new();
    let esc = |s: &str, n: usize| truncate_chars(&escape_controls(s, false), n);
    let _ = writeln!(out, "{}", esc(&group.title, 240));
    out.push('\n');
    out.push_str(match group.class {
        FailureClass::ConflictMarkers => {
            "Merge conflict markers (<<<<<<<, =======, >>>>>>>) were committed. Resolve each \
             conflict, keeping the intent of both sides, and delete the marker lines."
        }
        FailureClass::Build => {
            "The project does not build. Fix these errors: nothing else can be checked until \
             they are gone."
        }
        FailureClass::Compile => {
            "These compile errors share one cause. Fix the cause (a renamed or changed item, a \
             missing export), updating every caller, rather than silencing each error."
        }
        FailureClass::Test => {
            "These tests fail. Fix the code under test; change a test only if it is wrong, \
             and never delete or weaken it to make it pass."
        }
    });
    out.push_str("\n\n");
    let _ = writeln!(out, "Cause: {}", esc(&group.cause, 240));
    if group.scope.is_empty() {
        out.push_str("Files: none reported (the whole repository)\n");
    } else {
        let mut files = format!("Files: {}", list_files(&group.scope, 30));
        truncate_bytes(&mut files, 1_500);
        out.push_str(&files);
        out.push('\n');
    }
    // The header line below, the "… and N more" line and slack.
    let budget = MAX_DESCRIPTION_BYTES.saturating_sub(out.len() + RESERVE);
    let mut entries = String::new();
    let mut listed = 0;
    for failure in &group.failures {
        let entry = describe_failure(failure);
        if entries.len() + entry.len() > budget {
            break;
        }
        entries.push_str(&entry);
        listed += 1;
    }
    let total = group.failures_total.max(group.failures.len());
    let _ = writeln!(out, "\nFailures ({total} in all, {listed} listed):");
    out.push_str(&entries);
    let missing = total.saturating_sub(listed);
    if missing > 0 {
        let _ = writeln!(out, "- … and {missing} more");
    }
    truncate_bytes(&mut out, MAX_DESCRIPTION_BYTES);
    out
}

/// The scope a fix task for `group_scope` may have, checked as any task's scope is
/// (ADR-019): each path repo-relative and normalized, none absolute, climbing out with `..`
/// or inside `.git` in any letter case ([`ScopePath::parse`]); such paths are left out, since
/// the command output that named them is untrusted. `Err` says why no fix task can be made:
/// no path is left (a task with an empty scope would hold no lock and could change any
/// file), or more than `max_paths` are (the cap every planned task has).
pub fn fix_scope(
    group_scope: &[String],
    max_paths: usize,
    max_path_bytes: usize,
) -> Result<Vec<String>, FixScopeError> {
    let mut left_out = 0usize;
    let mut scope: Vec<String> = group_scope
        .iter()
        .filter_map(|p| match ScopePath::parse(p, max_path_bytes) {
            Ok(path) => Some(path.to_string()),
            Err(_) => {
                left_out += 1;
                None
            }
        })
        .collect();
    scope.sort();
    scope.dedup();
    if scope.is_empty() {
        return Err(if group_scope.is_empty() {
            FixScopeError::NoFile
        } else {
            FixScopeError::NoneAllowed {
                named: group_scope.len(),
            }
        });
    }
    if scope.len() > max_paths {
        return Err(FixScopeError::TooMany {
            files: scope.len(),
            max_paths,
            left_out: LeftOut(left_out),
        });
    }
    Ok(scope)
}

/// Why no fix task can be made for a group of failures ([`fix_scope`]). Its text becomes
/// the reason an ignored sweep fix is journaled with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FixScopeError {
    #[error(
        "the failures name no file, and a fix task with an empty scope could change any \
         file without holding a lock"
    )]
    NoFile,
    #[error(
        "none of the {named} files the failures name may be in a task's scope (absolute, \
         outside the repository or inside .git)"
    )]
    NoneAllowed { named: usize },
    #[error(
        "the failures name {files} files, more than a task's scope may hold ({max_paths}, \
         limits.max_scope_paths){left_out}"
    )]
    TooMany {
        files: usize,
        max_paths: usize,
        left_out: LeftOut,
    },
}

/// How many of the named files were not paths a task may have: said after a
/// [`FixScopeError::TooMany`] when there are any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeftOut(pub usize);

impl std::fmt::Display for LeftOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            0 => Ok(()),
            n => write!(f, "; {n} more were not paths a task may have"),
        }
    }
}

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;
