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

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::graph::scope::ScopePath;

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

/// A rustc error header waiting for its ` --> path:line:col` on the next line.
struct Pending {
    code: Option<String>,
    message: String,
}

/// A failing test of libtest or go test, completed when the output ends.
#[derive(Default)]
struct NamedTest {
    name: String,
    file: Option<String>,
    line: Option<u32>,
    column: Option<u32>,
    message: Vec<String>,
    has_failed_subtest: bool,
}

/// A `thread '…' panicked at` report, attached to its test when the output ends.
struct Panic {
    thread: String,
    section: Option<String>,
    file: Option<String>,
    line: Option<u32>,
    column: Option<u32>,
    message: Vec<String>,
    /// Pre-1.73 format: the message is quoted and the location follows it.
    open_quote: bool,
}

struct PyTest {
    class: FailureClass,
    file: String,
    test: Option<String>,
    message: String,
}

struct PyLoc {
    section: String,
    file: String,
    line: u32,
}

/// The line-by-line state of all parsers at once.
struct Parser {
    root: Option<String>,
    out: Vec<Failure>,
    seen: HashSet<Failure>,
    // rustc, human format
    pending: Option<Pending>,
    in_rust_block: bool,
    // libtest
    rust_tests: Vec<NamedTest>,
    rust_test_names: HashSet<String>,
    libtest_section: Option<String>,
    panics: Vec<Panic>,
    capturing_panic: Option<usize>,
    // go test
    go_tests: Vec<NamedTest>,
    go_block: Option<(usize, usize)>,
    go_running: Option<String>,
    go_logs: HashMap<String, (String, u32, Option<u32>, String)>,
    // pytest
    py_tests: Vec<PyTest>,
    py_index: HashMap<(String, Option<String>), usize>,
    py_section: Option<String>,
    py_locs: Vec<PyLoc>,
    py_collect: BTreeMap<String, String>,
}

impl Parser {
    fn new(root: Option<String>) -> Parser {
        Parser {
            root,
            out: Vec::new(),
            seen: HashSet::new(),
            pending: None,
            in_rust_block: false,
            rust_tests: Vec::new(),
            rust_test_names: HashSet::new(),
            libtest_section: None,
            panics: Vec::new(),
            capturing_panic: None,
            go_tests: Vec::new(),
            go_block: None,
            go_running: None,
            go_logs: HashMap::new(),
            py_tests: Vec::new(),
            py_index: HashMap::new(),
            py_section: None,
            py_locs: Vec::new(),
            py_collect: BTreeMap::new(),
        }
    }

    fn full(&self) -> bool {
        self.out.len() + self.rust_tests.len() + self.go_tests.len() + self.py_tests.len()
            >= MAX_FAILURES
    }

    fn path(&self, raw: &str) -> Option<String> {
        normalize_path(raw, self.root.as_deref())
    }

    fn text(&self, raw: &str) -> String {
        clean_text(raw, self.root.as_deref(), false, MAX_MESSAGE_CHARS)
    }

    fn push(&mut self, mut failure: Failure) {
        if self.out.len() >= MAX_FAILURES {
            return;
        }
        failure.code = failure.code.and_then(|c| clean_field(&c));
        failure.symbol = failure.symbol.and_then(|s| clean_field(&s));
        failure.test = failure.test.and_then(|t| clean_field(&t));
        if self.seen.insert(failure.clone()) {
            self.out.push(failure);
        }
    }

    /// One line, already free of terminal escapes. `json` is false for lines that came out
    /// of a JSON record (go test -json), so they are not decoded again.
    fn line(&mut self, line: &str, kind: CommandKind, json: bool) {
        if json && line.trim_start().starts_with('{') && self.json(line.trim(), kind) {
            return;
        }
        if let Some(pending) = self.pending.take() {
            if let Some(loc) = arrow(line) {
                self.push_rust(
                    pending.code,
                    &pending.message,
                    Some(loc.path),
                    Some(loc.line),
                    loc.column,
                );
                self.in_rust_block = true;
                return;
            }
            // A coded header is rustc's for sure; an uncoded one without a span may be any
            // tool's "error: …" line (and would outrank real failures as a whole-repo build
            // failure), so it is dropped: the catch-all still shows it if nothing else parses.
            if pending.code.is_some() {
                self.push_rust(pending.code, &pending.message, None, None, None);
            }
        }
        if self.in_rust_block {
            if line.trim().is_empty() {
                self.in_rust_block = false;
                return;
            }
            if is_rust_block_line(line) {
                self.linker(line);
                return;
            }
            self.in_rust_block = false;
        }
        if self.capturing_panic.is_some() && self.panic_line(line) {
            return;
        }
        if self.go_block.is_some() && self.go_block_line(line) {
            return;
        }
        if self.rust_header(line)
            || self.rust_short(line)
            || self.libtest(line)
            || self.go(line)
            || self.tsc(line)
            || self.pytest(line)
            || self.linker(line)
        {
            return;
        }
        self.fallback(line, kind);
    }

    // --- cargo / rustc ------------------------------------------------------------------

    /// A JSON record: cargo's `--message-format=json`, rustc's `--error-format=json`, or a
    /// go test -json output record. False when the line is not a JSON object.
    fn json(&mut self, line: &str, kind: CommandKind) -> bool {
        let Ok(value) = serde_json::from_str::<Value>(line) else {
            return false;
        };
        let Some(obj) = value.as_object() else {
            return false;
        };
        // go test -json: test output, and (Go 1.24+) build errors as `build-output`.
        if matches!(
            obj.get("Action").and_then(Value::as_str),
            Some("output" | "build-output")
        ) {
            if let Some(output) = obj.get("Output").and_then(Value::as_str) {
                let output = output.strip_suffix('\n').unwrap_or(output);
                for inner in output.split('\n') {
                    if inner.len() <= MAX_LINE_BYTES {
                        let inner = clean_line(inner);
                        self.line(&inner, kind, false);
                    }
                }
            }
            return true;
        }
        let message = match obj.get("reason").and_then(Value::as_str) {
            Some("compiler-message") => obj.get("message"),
            Some(_) => return true,
            None if obj.contains_key("spans") && obj.contains_key("level") => Some(&value),
            None => return true,
        };
        let Some(m) = message.and_then(Value::as_object) else {
            return true;
        };
        if m.get("level").and_then(Value::as_str) != Some("error") {
            return true;
        }
        let text = m.get("message").and_then(Value::as_str).unwrap_or_default();
        if text.trim().is_empty() || is_rust_summary(text) {
            return true;
        }
        let code = m
            .get("code")
            .and_then(|c| c.get("code"))
            .and_then(Value::as_str)
            .filter(|c| is_code(c))
            .map(str::to_string);
        let spans = m.get("spans").and_then(Value::as_array);
        let span = spans.and_then(|spans| {
            spans
                .iter()
                .find(|s| s.get("is_primary").and_then(Value::as_bool) == Some(true))
                .or_else(|| spans.first())
        });
        let number = |key: &str| {
            span.and_then(|s| s.get(key))
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
        };
        let file = span
            .and_then(|s| s.get("file_name"))
            .and_then(Value::as_str);
        let (line, column) = (number("line_start"), number("column_start"));
        self.push_rust(code, text, file, line, column);
        true
    }

    /// `error[E0412]: …`, `error: …` (waits for its arrow) and `warning…` (skipped with its
    /// block).
    fn rust_header(&mut self, line: &str) -> bool {
        let (code, message) = if let Some(rest) = line.strip_prefix("error[") {
            let Some(end) = rest.find("]: ") else {
                return false;
            };
            let code = &rest[..end];
            if !is_code(code) {
                return false;
            }
            (Some(code.to_string()), &rest[end + 3..])
        } else if let Some(rest) = line.strip_prefix("error: ") {
            (None, rest)
        } else if line.starts_with("warning: ") || line.starts_with("warning[") {
            self.in_rust_block = true;
            return true;
        } else {
            return false;
        };
        let message = message.trim();
        if message.is_empty() || is_rust_summary(message) {
            return true;
        }
        if is_cargo_build_message(message) {
            // No span: a manifest, dependency or linker failure. A manifest named in the
            // message is its file.
            let manifest = backticked(message)
                .into_iter()
                .find(|p| file_name(p) == "Cargo.toml");
            self.push_rust(code, message, manifest, None, None);
            return true;
        }
        self.pending = Some(Pending {
            code,
            message: message.to_string(),
        });
        true
    }

    /// `--message-format=short`: `src/b.rs:2:12: error[E0425]: cannot find type …`. An
    /// uncoded `error:` counts only in a Rust file (gcc prints the same shape).
    fn rust_short(&mut self, line: &str) -> bool {
        let Some(loc) = parse_loc(line) else {
            return false;
        };
        if loc.sep != Sep::Colon {
            return false;
        }
        let (code, message) = if let Some(rest) = loc.rest.strip_prefix("error[") {
            let Some(end) = rest.find("]: ") else {
                return false;
            };
            if !is_code(&rest[..end]) {
                return false;
            }
            (Some(rest[..end].to_string()), &rest[end + 3..])
        } else if let Some(rest) = loc.rest.strip_prefix("error: ") {
            if !loc.path.ends_with(".rs") {
                return false;
            }
            (None, rest)
        } else {
            return loc.path.ends_with(".rs") && loc.rest.starts_with("warning");
        };
        if is_rust_summary(message) {
            return true;
        }
        self.push_rust(code, message, Some(loc.path), Some(loc.line), loc.column);
        true
    }

    fn push_rust(
        &mut self,
        code: Option<String>,
        message: &str,
        file: Option<&str>,
        line: Option<u32>,
        column: Option<u32>,
    ) {
        if self.out.len() >= MAX_FAILURES {
            return;
        }
        let file = file.and_then(|f| self.path(f));
        let class = rust_class(code.as_deref(), message, file.as_deref());
        let related_file = if message.starts_with("unresolved import") {
            backticked(message)
                .first()
                .and_then(|p| rust_module_file(p, file.as_deref()))
        } else {
            None
        };
        let mut failure = Failure::new(class, self.text(message));
        failure.symbol = rust_symbol(message);
        failure.file = file;
        failure.line = line;
        failure.column = column;
        failure.code = code;
        failure.related_file = related_file;
        self.push(failure);
    }

    /// `undefined reference to `foo'` from the linker, wherever it appears.
    fn linker(&mut self, line: &str) -> bool {
        const NEEDLE: &str = "undefined reference to";
        let Some(pos) = line.find(NEEDLE) else {
            return false;
        };
        let after = line[pos + NEEDLE.len()..].trim_start();
        let after = after.trim_start_matches(['`', '\'', '"']);
        let symbol = after
            .split(['\'', '`', '"'])
            .next()
            .filter(|s| !s.is_empty() && !s.contains(char::is_whitespace))
            .map(str::to_string);
        let mut failure = Failure::new(FailureClass::Build, self.text(line.trim()));
        failure.symbol = symbol;
        self.push(failure);
        true
    }

    // --- libtest (cargo test) -----------------------------------------------------------

    fn libtest(&mut self, line: &str) -> bool {
        if let Some(rest) = line.strip_prefix("test ") {
            let Some(idx) = rest.find(" ... ") else {
                return false;
            };
            let name = rest[..idx].trim();
            let name = name.strip_suffix(" - should panic").unwrap_or(name);
            if rest[idx + 5..].trim_start().starts_with("FAILED")
                && !name.is_empty()
                && !self.full()
                && self.rust_test_names.insert(name.to_string())
            {
                self.rust_tests.push(NamedTest {
                    name: name.to_string(),
                    ..NamedTest::default()
                });
            }
            return true;
        }
        if let Some(rest) = line.strip_prefix("---- ") {
            let name = rest
                .strip_suffix(" stdout ----")
                .or_else(|| rest.strip_suffix(" stderr ----"));
            if let Some(name) = name {
                self.libtest_section = Some(name.trim().to_string());
                return true;
            }
            return false;
        }
        if line.starts_with("failures:") || line.starts_with("test result:") {
            self.libtest_section = None;
            return true;
        }
        if let Some(rest) = line.strip_prefix("thread '") {
            return self.panic_start(rest);
        }
        if let Some(rest) = line.strip_prefix("note: test did not panic as expected") {
            if let Some(section) = self.libtest_section.clone() {
                let loc = rest.trim().strip_prefix("at ").and_then(exact_loc);
                self.add_panic(Panic {
                    thread: section.clone(),
                    section: Some(section),
                    file: loc.as_ref().and_then(|l| self.path(l.path)),
                    line: loc.as_ref().map(|l| l.line),
                    column: loc.as_ref().and_then(|l| l.column),
                    message: vec!["test did not panic as expected".to_string()],
                    open_quote: false,
                });
            }
            return true;
        }
        false
    }

    fn add_panic(&mut self, panic: Panic) -> Option<usize> {
        if self.panics.len() >= MAX_FAILURES {
            return None;
        }
        self.panics.push(panic);
        Some(self.panics.len() - 1)
    }

    /// `thread 'name' [(id)] panicked at src/lib.rs:10:5:` (the message follows on the next
    /// lines), or before Rust 1.73 `… panicked at 'message', src/lib.rs:10:5`.
    fn panic_start(&mut self, rest: &str) -> bool {
        let Some(quote) = rest.find('\'') else {
            return false;
        };
        let thread = &rest[..quote];
        let mut after = rest[quote + 1..].trim_start();
        // Recent Rust prints the thread's id: `thread 'name' (1234) panicked at`.
        if after.starts_with('(')
            && let Some(close) = after.find(')')
        {
            after = after[close + 1..].trim_start();
        }
        let Some(at) = after.strip_prefix("panicked at ") else {
            return false;
        };
        let mut panic = Panic {
            thread: thread.to_string(),
            section: self.libtest_section.clone(),
            file: None,
            line: None,
            column: None,
            message: Vec::new(),
            open_quote: false,
        };
        if let Some(quoted) = at.strip_prefix('\'') {
            match split_old_panic(quoted) {
                Some((message, loc)) => {
                    panic.message.push(message.to_string());
                    panic.file = self.path(loc.path);
                    panic.line = Some(loc.line);
                    panic.column = loc.column;
                }
                None => {
                    panic.message.push(quoted.to_string());
                    panic.open_quote = true;
                }
            }
        } else if let Some(loc) = exact_loc(at.trim_end().trim_end_matches(':')) {
            panic.file = self.path(loc.path);
            panic.line = Some(loc.line);
            panic.column = loc.column;
        }
        self.capturing_panic = self.add_panic(panic);
        true
    }

    /// A line after a panic header: part of its message, or the end of it (false: the line
    /// is then parsed as any other).
    fn panic_line(&mut self, line: &str) -> bool {
        let Some(idx) = self.capturing_panic else {
            return false;
        };
        let root = self.root.clone();
        let Some(panic) = self.panics.get_mut(idx) else {
            self.capturing_panic = None;
            return false;
        };
        if panic.open_quote {
            if let Some((message, loc)) = split_old_panic(line) {
                panic.message.push(message.to_string());
                panic.file = normalize_path(loc.path, root.as_deref());
                panic.line = Some(loc.line);
                panic.column = loc.column;
                panic.open_quote = false;
                self.capturing_panic = None;
                return true;
            }
            if panic.message.len() >= MAX_MESSAGE_LINES * 2 {
                panic.open_quote = false;
                self.capturing_panic = None;
                return false;
            }
            panic.message.push(line.trim().to_string());
            return true;
        }
        let t = line.trim();
        let ends = t.is_empty()
            || t.starts_with("note:")
            || t.starts_with("stack backtrace:")
            || line.starts_with("---- ")
            || line.starts_with("failures:")
            || line.starts_with("test ")
            || line.starts_with("thread '")
            || line.starts_with("error");
        if ends {
            self.capturing_panic = None;
            return false;
        }
        if panic.message.len() < MAX_MESSAGE_LINES {
            panic.message.push(t.to_string());
        }
        true
    }

    // --- go test ------------------------------------------------------------------------

    fn go(&mut self, line: &str) -> bool {
        let t = line.trim_start();
        let indent = line.len() - t.len();
        if let Some(rest) = t.strip_prefix("--- FAIL: ") {
            let name = rest.split(" (").next().unwrap_or(rest).trim();
            if name.is_empty() || self.full() {
                return true;
            }
            for parent in &mut self.go_tests {
                if name.len() > parent.name.len()
                    && name.starts_with(parent.name.as_str())
                    && name.as_bytes()[parent.name.len()] == b'/'
                {
                    parent.has_failed_subtest = true;
                }
            }
            let mut test = NamedTest {
                name: name.to_string(),
                ..NamedTest::default()
            };
            // In -v mode the test's log came before its verdict.
            if let Some((file, line, column, message)) = self.go_logs.get(name) {
                test.file = self.path(file);
                test.line = Some(*line);
                test.column = *column;
                test.message.push(message.clone());
            }
            self.go_tests.push(test);
            self.go_block = Some((self.go_tests.len() - 1, indent));
            return true;
        }
        for prefix in ["=== RUN ", "=== CONT ", "=== NAME "] {
            if let Some(rest) = t.strip_prefix(prefix) {
                self.go_running = Some(rest.trim().to_string());
                return true;
            }
        }
        if t.starts_with("=== PAUSE") || t.starts_with("--- PASS: ") || t.starts_with("--- SKIP: ")
        {
            return true;
        }
        if indent > 0 {
            if let (Some(running), Some(loc)) = (&self.go_running, parse_loc(t))
                && loc.path.ends_with(".go")
                && loc.sep == Sep::Colon
            {
                if !self.go_logs.contains_key(running) && self.go_logs.len() < MAX_FAILURES {
                    let entry = (
                        loc.path.to_string(),
                        loc.line,
                        loc.column,
                        loc.rest.to_string(),
                    );
                    self.go_logs.insert(running.clone(), entry);
                }
                return true;
            }
            return false;
        }
        // Build errors: `./calc.go:3:2: undefined: Foo`.
        let Some(loc) = parse_loc(line) else {
            return false;
        };
        if !loc.path.ends_with(".go") || loc.sep != Sep::Colon || loc.rest.is_empty() {
            return false;
        }
        let class = if is_syntax_message(loc.rest) {
            FailureClass::Build
        } else {
            FailureClass::Compile
        };
        let mut failure = Failure::new(class, self.text(loc.rest));
        failure.file = self.path(loc.path);
        failure.line = Some(loc.line);
        failure.column = loc.column;
        failure.symbol = go_symbol(loc.rest);
        self.push(failure);
        true
    }

    /// An indented line under `--- FAIL: Name`: the test's log. False ends the block.
    fn go_block_line(&mut self, line: &str) -> bool {
        let Some((idx, block_indent)) = self.go_block else {
            return false;
        };
        let t = line.trim_start();
        let indent = line.len() - t.len();
        if t.is_empty() || indent <= block_indent || t.starts_with("--- FAIL: ") {
            self.go_block = None;
            return false;
        }
        let root = self.root.clone();
        let Some(test) = self.go_tests.get_mut(idx) else {
            self.go_block = None;
            return false;
        };
        match parse_loc(t) {
            Some(loc) if loc.path.ends_with(".go") && loc.sep == Sep::Colon => {
                if test.file.is_none() && test.line.is_none() {
                    test.file = normalize_path(loc.path, root.as_deref());
                    test.line = Some(loc.line);
                    test.column = loc.column;
                    test.message.push(loc.rest.to_string());
                } else if test.message.len() < MAX_MESSAGE_LINES {
                    test.message.push(t.to_string());
                }
            }
            _ => {
                if test.message.len() < MAX_MESSAGE_LINES {
                    test.message.push(t.to_string());
                }
            }
        }
        true
    }

    // --- tsc ----------------------------------------------------------------------------

    fn tsc(&mut self, line: &str) -> bool {
        // src/a.ts(3,5): error TS2304: Cannot find name 'Foo'.
        if let Some(pos) = line.find("): error TS") {
            let head = &line[..pos];
            if let Some(open) = head.rfind('(') {
                let (path, numbers) = (&head[..open], &head[open + 1..]);
                let mut numbers = numbers.split(',').map(|n| n.trim().parse::<u32>().ok());
                let (l, c) = (numbers.next().flatten(), numbers.next().flatten());
                if let (Some(l), false) = (l, path.trim().is_empty())
                    && let Some((code, message)) = ts_code(&line[pos + "): error TS".len()..])
                {
                    self.push_ts(Some(path.trim()), Some(l), c, code, message);
                    return true;
                }
            }
        }
        // src/a.ts:3:5 - error TS2304: Cannot find name 'Foo'.
        if let Some(loc) = parse_loc(line)
            && loc.sep == Sep::Space
            && let Some(rest) = loc.rest.strip_prefix("- error TS")
            && let Some((code, message)) = ts_code(rest)
        {
            self.push_ts(Some(loc.path), Some(loc.line), loc.column, code, message);
            return true;
        }
        // error TS5083: Cannot read file 'tsconfig.json'.
        if let Some(rest) = line.strip_prefix("error TS")
            && let Some((code, message)) = ts_code(rest)
        {
            self.push_ts(None, None, None, code, message);
            return true;
        }
        false
    }

    fn push_ts(
        &mut self,
        path: Option<&str>,
        line: Option<u32>,
        column: Option<u32>,
        code: u32,
        message: &str,
    ) {
        let file = path.and_then(|p| self.path(p));
        let class = if code == 1185 || message.contains("Merge conflict marker") {
            FailureClass::ConflictMarkers
        } else if (1000..2000).contains(&code)
            || (5000..6000).contains(&code)
            || file.as_deref().is_some_and(is_manifest)
        {
            // TS1xxx are syntax errors, TS5xxx configuration errors: nothing type-checks.
            FailureClass::Build
        } else {
            FailureClass::Compile
        };
        let (symbol, module) = ts_symbol_and_module(code, message);
        let related_file = match (module, file.as_deref()) {
            (Some(module), Some(file)) => ts_module_file(file, module),
            _ => None,
        };
        let mut failure = Failure::new(class, self.text(message));
        failure.file = file;
        failure.line = line;
        failure.column = column;
        failure.code = Some(format!("TS{code}"));
        failure.symbol = symbol;
        failure.related_file = related_file;
        self.push(failure);
    }

    // --- pytest -------------------------------------------------------------------------

    fn pytest(&mut self, line: &str) -> bool {
        if let Some(rest) = line.strip_prefix("FAILED ") {
            return self.py_summary(rest, false);
        }
        if let Some(rest) = line.strip_prefix("ERROR ") {
            return self.py_summary(rest, true);
        }
        // Section headers: `____ test_add ____`, `____ ERROR collecting tests/x.py ____`.
        if line.len() >= 7 && line.starts_with("___") && line.trim_end().ends_with("___") {
            let name = line.trim_matches(|c: char| c == '_' || c.is_whitespace());
            if !name.is_empty() {
                self.py_section = Some(name.to_string());
            }
            return true;
        }
        if line.starts_with("===") {
            self.py_section = None;
            return true;
        }
        // Verbose: `tests/test_calc.py::test_add FAILED   [ 50%]`.
        let mut words = line.split_whitespace();
        if let (Some(id), Some(verdict)) = (words.next(), words.next())
            && id.contains("::")
            && (verdict == "FAILED" || verdict == "ERROR")
        {
            return self.py_summary(id, verdict == "ERROR");
        }
        if let Some(rest) = line.strip_prefix("E ") {
            let Some(section) = &self.py_section else {
                return false;
            };
            if let Some(path) = section.strip_prefix("ERROR collecting ") {
                let error = rest.trim();
                let is_error = error
                    .split(':')
                    .next()
                    .is_some_and(|n| n.ends_with("Error") || n.ends_with("Exception"));
                if is_error
                    && !self.py_collect.contains_key(path)
                    && self.py_collect.len() < MAX_FAILURES
                {
                    let error = self.text(error);
                    self.py_collect.insert(path.to_string(), error);
                }
            }
            return true;
        }
        // Traceback locations: `tests/test_calc.py:12: AssertionError`, `…:12: in test_add`.
        if let Some(loc) = parse_loc(line) {
            let rest = loc.rest;
            let is_location = loc.path.ends_with(".py")
                && loc.column.is_none()
                && loc.sep != Sep::Space
                && (rest.is_empty() || rest.starts_with("in ") || is_dotted_ident(rest));
            if is_location {
                if let (Some(section), Some(file)) = (&self.py_section, self.path(loc.path))
                    && self.py_locs.len() < MAX_FAILURES * 4
                {
                    self.py_locs.push(PyLoc {
                        section: section.clone(),
                        file,
                        line: loc.line,
                    });
                }
                return true;
            }
        }
        false
    }

    /// `FAILED tests/test_calc.py::test_add - AssertionError: …` or `ERROR tests/x.py - …`.
    fn py_summary(&mut self, rest: &str, error: bool) -> bool {
        let (id, message) = match rest.find(" - ") {
            Some(i) => (rest[..i].trim(), rest[i + 3..].trim()),
            None => (rest.trim(), ""),
        };
        let (path, test) = match id.find("::") {
            Some(i) => (&id[..i], Some(&id[i + 2..])),
            None => (id, None),
        };
        if !looks_like_file_path(path) {
            return false;
        }
        // A module that does not even import is a compile error; an error in a test's setup
        // is that test's failure.
        let class = if error && test.is_none() {
            FailureClass::Compile
        } else {
            FailureClass::Test
        };
        let message = self.text(message);
        let key = (path.to_string(), test.map(str::to_string));
        if let Some(existing) = self
            .py_index
            .get(&key)
            .and_then(|&i| self.py_tests.get_mut(i))
        {
            if existing.message.is_empty() {
                existing.message = message;
            }
            return true;
        }
        if !self.full() {
            self.py_index.insert(key, self.py_tests.len());
            self.py_tests.push(PyTest {
                class,
                file: path.to_string(),
                test: test.map(str::to_string),
                message,
            });
        }
        true
    }

    // --- generic fallback ---------------------------------------------------------------

    /// `path:line:col: message` or `path:line: message` at the start of a line no other
    /// parser claimed; the class comes from the command's kind.
    fn fallback(&mut self, line: &str, kind: CommandKind) {
        let Some(loc) = parse_loc(line) else {
            return;
        };
        if loc.sep != Sep::Colon || loc.rest.is_empty() || !looks_like_file_path(loc.path) {
            return;
        }
        let lower = loc.rest.to_ascii_lowercase();
        if ["warning", "note", "info", "help", "hint"]
            .iter()
            .any(|w| lower.starts_with(w))
        {
            return;
        }
        let mut message = loc.rest;
        for prefix in ["fatal error:", "error:", "Error:", "ERROR:"] {
            if let Some(m) = message.strip_prefix(prefix) {
                message = m.trim_start();
                break;
            }
        }
        if message.is_empty() {
            return;
        }
        let mut failure = Failure::new(kind.default_class(), self.text(message));
        failure.file = self.path(loc.path);
        failure.line = Some(loc.line);
        failure.column = loc.column;
        self.push(failure);
    }

    // --- the end ------------------------------------------------------------------------

    /// Completes what waited for the whole output (tests and their panics or locations).
    fn finish(mut self) -> Vec<Failure> {
        if let Some(pending) = self.pending.take()
            && pending.code.is_some()
        {
            self.push_rust(pending.code, &pending.message, None, None, None);
        }
        for test in std::mem::take(&mut self.rust_tests) {
            let panic = self
                .panics
                .iter()
                .find(|p| p.thread == test.name)
                .or_else(|| {
                    self.panics
                        .iter()
                        .find(|p| p.section.as_deref() == Some(test.name.as_str()))
                });
            let mut failure = Failure::new(FailureClass::Test, String::new());
            if let Some(panic) = panic {
                failure.file = panic.file.clone();
                failure.line = panic.line;
                failure.column = panic.column;
                failure.message = multiline(&panic.message, self.root.as_deref());
            }
            if failure.file.is_none() {
                // A doctest: `src/lib.rs - add (line 5)`.
                if let Some((path, item)) = test.name.split_once(" - ") {
                    failure.file = self.path(path);
                    failure.line = item
                        .rsplit_once("(line ")
                        .and_then(|(_, n)| n.trim_end_matches(')').parse().ok());
                }
            }
            if failure.message.is_empty() {
                failure.message = "test failed".to_string();
            }
            failure.test = Some(test.name);
            self.push(failure);
        }
        let go_tests = std::mem::take(&mut self.go_tests);
        for test in go_tests {
            // A parent whose subtests failed says nothing of its own.
            if test.has_failed_subtest && test.file.is_none() {
                continue;
            }
            let mut failure = Failure::new(
                FailureClass::Test,
                if test.message.is_empty() {
                    "test failed".to_string()
                } else {
                    multiline(&test.message, self.root.as_deref())
                },
            );
            failure.file = test.file;
            failure.line = test.line;
            failure.column = test.column;
            failure.test = Some(test.name);
            self.push(failure);
        }
        for py in std::mem::take(&mut self.py_tests) {
            let file = self.path(&py.file);
            let mut message = py.message;
            let mut line = None;
            if py.class == FailureClass::Compile {
                if let Some(error) = self.py_collect.remove(&py.file)
                    && (message.is_empty()
                        || message.ends_with("...")
                        || message.contains("while importing test module"))
                {
                    message = error;
                }
            } else if let (Some(test), Some(file)) = (&py.test, &file) {
                // `TestCalc::test_div` has the section `TestCalc.test_div`.
                let dotted = test.replace("::", ".");
                let last = test.rsplit("::").next().unwrap_or(test);
                line = self
                    .py_locs
                    .iter()
                    .find(|l| &l.file == file && (l.section == dotted || l.section == last))
                    .map(|l| l.line);
            }
            self.push_py(py.class, file, line, py.test, message);
        }
        // Collection errors pytest did not summarize.
        for (path, error) in std::mem::take(&mut self.py_collect) {
            let file = self.path(&path);
            self.push_py(FailureClass::Compile, file, None, None, error);
        }
        self.out.truncate(MAX_FAILURES);
        self.out
    }

    fn push_py(
        &mut self,
        class: FailureClass,
        file: Option<String>,
        line: Option<u32>,
        test: Option<String>,
        message: String,
    ) {
        let mut failure = Failure::new(
            class,
            if message.is_empty() {
                "test failed".to_string()
            } else {
                message
            },
        );
        failure.symbol = py_symbol(&failure.message);
        if class == FailureClass::Compile {
            failure.related_file = py_module_file(&failure.message);
        }
        failure.file = file;
        failure.line = line;
        failure.test = test;
        self.push(failure);
    }
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

/// The catch-all's message for a command that printed nothing.
const NOTHING_PRINTED: &str = "the command failed without printing anything";

/// When nothing parsed: the output's last non-empty lines, at most [`MAX_TAIL_BYTES`].
fn catch_all(kind: CommandKind, text: &str, root: Option<&str>) -> Failure {
    let mut picked = Vec::new();
    let mut bytes = 0;
    for raw in text.split('\n').rev() {
        if raw.len() > MAX_LINE_BYTES {
            continue;
        }
        let line = clean_text(&clean_line(raw), root, false, MAX_MESSAGE_CHARS);
        if line.is_empty() {
            continue;
        }
        if bytes + line.len() + 1 > MAX_TAIL_BYTES || picked.len() >= 40 {
            break;
        }
        bytes += line.len() + 1;
        picked.push(line);
    }
    picked.reverse();
    let message = if picked.is_empty() {
        NOTHING_PRINTED.to_string()
    } else {
        picked.join("\n")
    };
    Failure::new(kind.default_class(), message)
}

// --- line and location helpers -----------------------------------------------------------

/// A line as a terminal would show it: what follows the last carriage return, without
/// escape sequences (colors, cursor moves, titles).
fn clean_line(raw: &str) -> String {
    let raw = raw.strip_suffix('\r').unwrap_or(raw);
    let raw = raw.rsplit('\r').next().unwrap_or(raw);
    strip_ansi(raw)
}

fn strip_ansi(s: &str) -> String {
    if !s.contains('\u{1b}') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        match chars.next() {
            // CSI: parameters and intermediates, then one final byte in @..~.
            Some('[') => {
                for n in chars.by_ref() {
                    if ('@'..='~').contains(&n) {
                        break;
                    }
                }
            }
            // OSC: up to BEL or ESC \.
            Some(']') => {
                while let Some(n) = chars.next() {
                    if n == '\u{7}' {
                        break;
                    }
                    if n == '\u{1b}' {
                        if chars.peek() == Some(&'\\') {
                            chars.next();
                        }
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sep {
    /// `path:3:5: message`
    Colon,
    /// `path:3:5 - message` (tsc's pretty output)
    Space,
    /// `path:3:5`
    End,
}

#[derive(Debug)]
struct Loc<'a> {
    path: &'a str,
    line: u32,
    column: Option<u32>,
    sep: Sep,
    rest: &'a str,
}

/// `path:line[:column]` then `:`, a space or the end. The path has no whitespace.
fn parse_loc(s: &str) -> Option<Loc<'_>> {
    let colon = s.find(':')?;
    let path = &s[..colon];
    if path.is_empty() || path.len() > MAX_PATH_BYTES || path.contains(char::is_whitespace) {
        return None;
    }
    let (line, after) = leading_number(&s[colon + 1..])?;
    let (column, after) = match after.strip_prefix(':').and_then(leading_number) {
        Some((column, after)) => (Some(column), after),
        None => (None, after),
    };
    let (sep, rest) = if after.is_empty() {
        (Sep::End, "")
    } else if let Some(rest) = after.strip_prefix(':') {
        (Sep::Colon, rest.trim())
    } else if after.starts_with(' ') {
        (Sep::Space, after.trim())
    } else {
        return None;
    };
    Some(Loc {
        path,
        line,
        column,
        sep,
        rest,
    })
}

/// Exactly `path:line[:column]`.
fn exact_loc(s: &str) -> Option<Loc<'_>> {
    parse_loc(s.trim()).filter(|l| l.sep == Sep::End)
}

fn leading_number(s: &str) -> Option<(u32, &str)> {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if end == 0 || end > 9 {
        return None;
    }
    Some((s[..end].parse().ok()?, &s[end..]))
}

/// rustc's ` --> src/b.rs:3:8` under an error header.
fn arrow(line: &str) -> Option<Loc<'_>> {
    exact_loc(line.trim_start().strip_prefix("--> ")?)
}

/// A line inside a rustc diagnostic (its span, source excerpt, notes and help).
fn is_rust_block_line(line: &str) -> bool {
    line.starts_with(char::is_whitespace)
        || line.starts_with(|c: char| c.is_ascii_digit())
        || line.starts_with('|')
        || line.starts_with('=')
        || line.starts_with("note:")
        || line.starts_with("help:")
        || line.starts_with("...")
        || line.starts_with("::: ")
}

/// `message', path:line:col` (the old panic format's end).
fn split_old_panic(s: &str) -> Option<(&str, Loc<'_>)> {
    let pos = s.rfind("', ")?;
    let loc = exact_loc(&s[pos + 3..])?;
    Some((&s[..pos], loc))
}

fn is_code(code: &str) -> bool {
    !code.is_empty()
        && code.len() <= 40
        && code
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '-')
}

fn is_dotted_ident(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 100
        && s.chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
}

fn file_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

fn is_manifest(path: &str) -> bool {
    matches!(
        file_name(path),
        "Cargo.toml" | "Cargo.lock" | "package.json" | "tsconfig.json" | "go.mod" | "go.sum"
    )
}

/// Plausibly a file path a tool printed: no whitespace or shell punctuation, a letter, and a
/// slash or an extension (so `localhost:8080: refused` or `Error: 12:30` are not paths).
fn looks_like_file_path(path: &str) -> bool {
    if path.is_empty()
        || path.len() > MAX_PATH_BYTES
        || path.contains("://")
        || path.starts_with('-')
        || !path.chars().any(char::is_alphabetic)
        || path.chars().any(|c| {
            c.is_whitespace()
                || c.is_control()
                || matches!(
                    c,
                    '<' | '>'
                        | '"'
                        | '|'
                        | '*'
                        | '?'
                        | '('
                        | ')'
                        | '['
                        | ']'
                        | '{'
                        | '}'
                        | '='
                        | ','
                        | ';'
                        | '\''
                        | '`'
                        | '$'
                )
        })
    {
        return false;
    }
    if path.contains('/') {
        return true;
    }
    let name = file_name(path);
    match name.rfind('.') {
        Some(i) if i > 0 => {
            let ext = &name[i + 1..];
            !ext.is_empty()
                && ext.len() <= 10
                && ext.chars().all(|c| c.is_ascii_alphanumeric())
                && ext.chars().any(|c| c.is_ascii_alphabetic())
        }
        _ => false,
    }
}

// --- paths ---------------------------------------------------------------------------

/// An absolute root without its trailing slashes; `/` alone (or a relative root) would
/// turn every absolute path into a repo path, so it is refused.
fn normalize_root(root: &str) -> Option<String> {
    let root = root.trim().replace('\\', "/");
    let root = root.trim_end_matches('/');
    let absolute = root.starts_with('/') || looks_like_drive(root);
    (absolute && root.len() > 1 && !root.chars().any(char::is_control)).then(|| root.to_string())
}

fn looks_like_drive(path: &str) -> bool {
    let b = path.as_bytes();
    b.len() >= 2 && b[1] == b':' && b[0].is_ascii_alphabetic()
}

/// Repo-relative, `/`-separated, without `.` components; `None` for what is absolute (after
/// stripping `root`), leaves the repository (`..`), or is not a plausible path.
fn normalize_path(raw: &str, root: Option<&str>) -> Option<String> {
    let raw = raw.trim();
    if raw.is_empty() || raw.len() > MAX_PATH_BYTES || raw.chars().any(char::is_control) {
        return None;
    }
    let mut path = raw.replace('\\', "/");
    if let Some(root) = root
        && let Some(rest) = path.strip_prefix(root)
        && (rest.is_empty() || rest.starts_with('/'))
    {
        path = rest.to_string();
        if path.is_empty() {
            return None;
        }
        path = path.trim_start_matches('/').to_string();
    }
    if path.starts_with('/') || path.starts_with('~') || looks_like_drive(&path) {
        return None;
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return None,
            part => parts.push(part),
        }
    }
    if parts.is_empty() {
        None
    } else {
        Some(parts.join("/"))
    }
}

// --- classification and symbols ----------------------------------------------------------

/// Cargo's own summaries, not failures.
fn is_rust_summary(message: &str) -> bool {
    let m = message.trim_start();
    m.starts_with("aborting due to")
        || m.starts_with("could not compile")
        || m.starts_with("test failed, to rerun")
        || m.starts_with("build failed")
        || (m.starts_with(|c: char| c.is_ascii_digit())
            && (m.contains(" target failed") || m.contains(" targets failed")))
}

/// Cargo and linker failures that stop the build whatever the code says.
fn is_cargo_build_message(message: &str) -> bool {
    const PHRASES: &[&str] = &[
        "failed to parse manifest",
        "failed to load manifest",
        "no matching package",
        "could not find `cargo.toml`",
        "failed to select a version",
        "failed to get `",
        "failed to read `",
        "failed to run custom build command",
        "failed to download",
        "failed to fetch",
        "failed to load source for dependency",
        "cyclic package dependency",
        "lock file",
        "linking with `",
        "undefined reference to",
    ];
    let lower = message.to_lowercase();
    PHRASES.iter().any(|p| lower.contains(p))
}

fn is_syntax_message(message: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "expected ",
        "unexpected ",
        "unclosed delimiter",
        "this file contains an unclosed delimiter",
        "mismatched closing delimiter",
        "unterminated ",
        "unknown start of token",
        "unmatched ",
        "syntax error",
        "missing `",
    ];
    let lower = message.trim_start().to_lowercase();
    PREFIXES.iter().any(|p| lower.starts_with(p))
}

fn rust_class(code: Option<&str>, message: &str, file: Option<&str>) -> FailureClass {
    let lower = message.to_lowercase();
    if lower.contains("diff marker") || lower.contains("conflict marker") {
        FailureClass::ConflictMarkers
    } else if is_cargo_build_message(message) || file.is_some_and(is_manifest) {
        FailureClass::Build
    } else if code.is_some() {
        FailureClass::Compile
    } else if is_syntax_message(message) {
        FailureClass::Build
    } else {
        FailureClass::Compile
    }
}

/// The texts between backticks.
fn backticked(s: &str) -> Vec<&str> {
    s.split('`').skip(1).step_by(2).collect()
}

fn single_quoted(s: &str) -> Vec<&str> {
    s.split('\'').skip(1).step_by(2).collect()
}

fn clean_symbol(s: &str) -> Option<String> {
    let s = s.trim();
    let ok = !s.is_empty()
        && s.chars().count() <= MAX_FIELD_CHARS
        && !s
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || is_invisible(c));
    ok.then(|| s.to_string())
}

/// The name a rustc message is about, for the messages that are about a name (resolution,
/// missing items, fields, methods). Others (mismatched types, borrows) have none: their
/// backticked words are types or local variables, not what changed.
fn rust_symbol(message: &str) -> Option<String> {
    const FIRST: &[&str] = &[
        "cannot find ",
        "failed to resolve",
        "no method named",
        "no function or associated item named",
        "no associated item named",
        "no variant",
        "no field `",
        "use of undeclared",
        "use of unresolved",
        "file not found for module",
        "not all trait items implemented",
        "method `",
        "unresolved ",
    ];
    let ticks = backticked(message);
    let picked = if message.starts_with("unresolved import") {
        ticks.first().map(|p| p.rsplit("::").next().unwrap_or(p))
    } else if message.contains("has no field named") {
        ticks.get(1).copied()
    } else if message.starts_with("missing field") {
        ticks.last().copied()
    } else if FIRST.iter().any(|p| message.starts_with(p)) || message.ends_with(" is private") {
        ticks.first().copied()
    } else {
        None
    };
    picked.and_then(clean_symbol)
}

/// `crate::a::b::X` imported from `…/src/…` → `…/src/a/b.rs` (best effort: `a/b/mod.rs` is
/// as possible; `None` when the path does not start at `crate` or the crate root is unclear).
fn rust_module_file(import: &str, importing: Option<&str>) -> Option<String> {
    let segments: Vec<&str> = import.split("::").map(str::trim).collect();
    if segments.len() < 3 || segments[0] != "crate" {
        return None;
    }
    let module = &segments[1..segments.len() - 1];
    if !module.iter().all(|s| is_ident(s)) {
        return None;
    }
    let components: Vec<&str> = importing?.split('/').collect();
    let src = components.iter().rposition(|c| *c == "src")?;
    if components[src + 1..].first() == Some(&"bin") {
        return None;
    }
    let mut path = components[..=src].join("/");
    for m in module {
        path.push('/');
        path.push_str(m);
    }
    path.push_str(".rs");
    normalize_path(&path, None)
}

fn is_ident(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// `TS2304: message` → (2304, message).
fn ts_code(s: &str) -> Option<(u32, &str)> {
    let (code, rest) = leading_number(s)?;
    Some((code, rest.strip_prefix(':')?.trim()))
}

/// The name and, for an import chain, the module specifier of a tsc message.
fn ts_symbol_and_module(code: u32, message: &str) -> (Option<String>, Option<&str>) {
    let q = single_quoted(message);
    let module = |i: usize| q.get(i).map(|m| m.trim_matches('"'));
    let symbol = |i: usize| q.get(i).and_then(|s| clean_symbol(s));
    match code {
        // Module '"./b"' has no exported member 'Foo' / declares 'Foo' locally.
        2305 | 2614 | 2724 | 2459 => (symbol(1), module(0)),
        // Cannot find module './b'.
        2307 => (None, module(0)),
        // Cannot find name 'Foo'; Property 'x' does not exist / is missing; 'Foo' only
        // refers to a type; Cannot find namespace 'N'.
        2304 | 2552 | 2503 | 2339 | 2551 | 2741 | 2693 => (symbol(0), None),
        _ => (None, None),
    }
}

/// `'./b'` imported by `src/a.ts` → `src/b.ts` (a `.js` specifier names its `.ts`
/// source). Bare specifiers (packages) and paths leaving the repository give `None`.
fn ts_module_file(importing: &str, specifier: &str) -> Option<String> {
    if !(specifier.starts_with("./") || specifier.starts_with("../")) {
        return None;
    }
    let mut parts: Vec<&str> = importing.split('/').collect();
    parts.pop();
    for segment in specifier.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    let last = parts.pop()?;
    let file = if [".ts", ".tsx", ".mts", ".cts"]
        .iter()
        .any(|e| last.ends_with(e))
    {
        last.to_string()
    } else if let Some(stem) = last.strip_suffix(".js") {
        format!("{stem}.ts")
    } else if let Some(stem) = last.strip_suffix(".jsx") {
        format!("{stem}.tsx")
    } else if let Some(stem) = last.strip_suffix(".mjs") {
        format!("{stem}.mts")
    } else if let Some(stem) = last.strip_suffix(".cjs") {
        format!("{stem}.cts")
    } else {
        format!("{last}.ts")
    };
    parts.push(&file);
    normalize_path(&parts.join("/"), None)
}

fn go_symbol(message: &str) -> Option<String> {
    if let Some(name) = message
        .strip_prefix("undefined: ")
        .or_else(|| message.strip_prefix("undeclared name: "))
    {
        return clean_symbol(name);
    }
    let (_, after) = message.split_once("has no field or method ")?;
    clean_symbol(after.split([')', ',', ' ']).next()?)
}

fn quoted_after<'a>(message: &'a str, marker: &str) -> Option<&'a str> {
    let (_, after) = message.split_once(marker)?;
    after.split('\'').next()
}

fn py_symbol(message: &str) -> Option<String> {
    quoted_after(message, "cannot import name '")
        .or_else(|| quoted_after(message, "name '").filter(|_| message.contains("is not defined")))
        .or_else(|| quoted_after(message, "has no attribute '"))
        .or_else(|| quoted_after(message, "No module named '"))
        .and_then(clean_symbol)
}

/// `cannot import name 'X' from 'm' (shapes.py)`: the module's file, when Python printed
/// one inside the repository.
fn py_module_file(message: &str) -> Option<String> {
    if !message.contains("cannot import name") {
        return None;
    }
    let inner = message.trim_end().strip_suffix(')')?;
    let (_, path) = inner.rsplit_once('(')?;
    if !path.ends_with(".py") {
        return None;
    }
    normalize_path(path, None)
}

// --- text ----------------------------------------------------------------------------

/// Zero-width and bidirectional-override characters: invisible in a prompt, able to make
/// text read differently from what it is.
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}' | '\u{feff}'
    )
}

/// Control and invisible characters as `\u{1b}`; tabs (and newlines unless kept) as spaces.
fn escape_controls(s: &str, keep_newlines: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\n' if keep_newlines => out.push('\n'),
            '\n' | '\t' => out.push(' '),
            c if c.is_control() || is_invisible(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

fn truncate_chars(s: &str, max: usize) -> String {
    if max == 0 {
        return String::new();
    }
    match s.char_indices().nth(max) {
        None => s.to_string(),
        Some(_) => {
            let cut = s.char_indices().nth(max - 1).map_or(0, |(i, _)| i);
            format!("{}…", &s[..cut])
        }
    }
}

fn truncate_bytes(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
}

/// Untrusted text made safe to show: the root removed, controls escaped, bounded.
fn clean_text(raw: &str, root: Option<&str>, keep_newlines: bool, max_chars: usize) -> String {
    let text = match root {
        Some(root) => raw.replace(&format!("{root}/"), ""),
        None => raw.to_string(),
    };
    truncate_chars(
        escape_controls(text.trim(), keep_newlines).trim(),
        max_chars,
    )
}

fn clean_field(s: &str) -> Option<String> {
    let s = truncate_chars(&escape_controls(s.trim(), false), MAX_FIELD_CHARS);
    (!s.is_empty()).then_some(s)
}

fn multiline(lines: &[String], root: Option<&str>) -> String {
    let joined = lines
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    clean_text(&joined, root, true, MAX_MESSAGE_CHARS)
}

// ---------------------------------------------------------------------------------------
// Grouping
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Symbol(String),
    Related(String),
    FileCause(String, String),
    File(String),
    Unlocated,
}

/// What ties a group together, from the strongest tie to the weakest.
enum Cause {
    Symbol(String),
    Imports(Vec<String>),
    Code(String, String),
    Message(String),
    File(String),
    Unlocated(String),
}

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

fn group_keys(class: FailureClass, f: &Failure) -> Vec<Key> {
    let by_file = || f.file.clone().map_or(Key::Unlocated, Key::File);
    match class {
        // A test file's failures are one task; so are a file's conflict markers.
        FailureClass::Test | FailureClass::ConflictMarkers => vec![by_file()],
        FailureClass::Build | FailureClass::Compile => {
            let mut keys = Vec::new();
            if let Some(symbol) = &f.symbol {
                keys.push(Key::Symbol(symbol.clone()));
            }
            if let Some(related) = &f.related_file {
                keys.push(Key::Related(related.clone()));
            }
            if keys.is_empty() {
                keys.push(match &f.file {
                    Some(file) => Key::FileCause(
                        file.clone(),
                        f.code
                            .clone()
                            .unwrap_or_else(|| first_line(&f.message).to_string()),
                    ),
                    None => Key::Unlocated,
                });
            }
            keys
        }
    }
}

fn find(parent: &mut [usize], mut i: usize) -> usize {
    while parent[i] != i {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    i
}

fn union(parent: &mut [usize], a: usize, b: usize) {
    let (ra, rb) = (find(parent, a), find(parent, b));
    if ra != rb {
        // The smaller index is the root: deterministic.
        let (lo, hi) = if ra < rb { (ra, rb) } else { (rb, ra) };
        parent[hi] = lo;
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("").trim()
}

fn group_cause(class: FailureClass, scope: &[String], members: &[Failure]) -> Cause {
    if scope.is_empty() {
        let first = members.first().map_or("", |f| first_line(&f.message));
        return Cause::Unlocated(first.to_string());
    }
    if matches!(class, FailureClass::Test | FailureClass::ConflictMarkers) {
        let file = members.iter().find_map(|f| f.file.clone());
        return Cause::File(file.unwrap_or_else(|| scope[0].clone()));
    }
    let mut symbols: BTreeMap<&str, usize> = BTreeMap::new();
    for f in members {
        if let Some(s) = &f.symbol {
            *symbols.entry(s.as_str()).or_default() += 1;
        }
    }
    // The most frequent symbol; on a tie the first in order.
    let mut best: Option<(&str, usize)> = None;
    for (symbol, count) in symbols {
        if best.is_none_or(|(_, c)| count > c) {
            best = Some((symbol, count));
        }
    }
    if let Some((symbol, _)) = best {
        return Cause::Symbol(symbol.to_string());
    }
    let related: BTreeSet<String> = members
        .iter()
        .filter_map(|f| f.related_file.clone())
        .collect();
    if !related.is_empty() {
        return Cause::Imports(related.into_iter().collect());
    }
    let first = &members[0];
    match &first.code {
        Some(code) if members.iter().all(|f| f.code.as_ref() == Some(code)) => {
            Cause::Code(code.clone(), first_line(&first.message).to_string())
        }
        _ => Cause::Message(first_line(&first.message).to_string()),
    }
}

fn build_group(class: FailureClass, scope: Vec<String>, members: Vec<Failure>) -> FixGroup {
    let cause = group_cause(class, &scope, &members);
    let total = members.len();
    let plural = total > 1;
    let noun = class.noun(plural);
    let files = list_files(&scope, 3);
    let short = |s: &str, n: usize| truncate_chars(&escape_controls(s, false), n);
    let (cause_text, cause_key, title) = match &cause {
        Cause::Symbol(symbol) => {
            let text = format!("`{}`", short(symbol, 120));
            let title = format!("Fix {noun} about {text} in {files}");
            (text, format!("symbol:{symbol}"), title)
        }
        Cause::Imports(related) => {
            let text = format!("imports from {}", list_files(related, 3));
            let title = format!("Fix {noun} about {text} in {files}");
            (text, format!("imports:{}", related.join("\n")), title)
        }
        Cause::Code(code, message) => {
            let title = format!(
                "Fix {noun} {} ({}) in {files}",
                short(code, 40),
                short(message, 80)
            );
            (short(code, 40), format!("code:{code}"), title)
        }
        Cause::Message(message) => {
            let title = format!("Fix {noun} in {files}: {}", short(message, 80));
            (
                short(message, 120),
                format!("message:{}", digits_masked(message)),
                title,
            )
        }
        Cause::File(file) => {
            let title = match class {
                FailureClass::ConflictMarkers => {
                    format!("Resolve merge conflict markers in {files}")
                }
                _ => format!("Fix {noun} in {files}"),
            };
            (short(file, 200), format!("file:{file}"), title)
        }
        Cause::Unlocated(message) => {
            let title = format!(
                "Fix {noun} reported without a file location: {}",
                short(message, 80)
            );
            (
                "no file location".to_string(),
                "unlocated".to_string(),
                title,
            )
        }
    };
    let hashed = format!("{}\n{cause_key}\n{}", class.slug(), scope.join("\n"));
    FixGroup {
        class,
        failures: members.into_iter().take(MAX_GROUP_FAILURES).collect(),
        failures_total: total,
        cause: cause_text,
        signature: format!("{}-{:016x}", class.slug(), fnv1a64(hashed.as_bytes())),
        title: truncate_chars(&title, 240),
        scope,
    }
}

/// `a, b, c and 4 more`, escaped.
fn list_files(files: &[String], max: usize) -> String {
    let mut shown: Vec<String> = files
        .iter()
        .take(max)
        .map(|f| truncate_chars(&escape_controls(f, false), 120))
        .collect();
    if files.len() > max {
        let last = format!(
            "{} and {} more",
            shown.pop().unwrap_or_default(),
            files.len() - max + 1
        );
        shown.push(last);
    }
    if shown.is_empty() {
        "the repository".to_string()
    } else {
        shown.join(", ")
    }
}

/// Digit runs as `#`: a message cause that names a count or position must not change the
/// signature when only the number moves.
fn digits_masked(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_digits = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('#');
            }
            in_digits = true;
        } else {
            in_digits = false;
            out.push(c);
        }
    }
    out
}

/// FNV-1a: stable across Rust versions and platforms (std's hasher promises neither), so a
/// journaled signature still matches after an upgrade.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

// ---------------------------------------------------------------------------------------
// Description
// ---------------------------------------------------------------------------------------

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

fn describe_failure(f: &Failure) -> String {
    let esc = |s: &str, n: usize| truncate_chars(&escape_controls(s, false), n);
    let mut entry = String::from("- ");
    match &f.file {
        Some(file) => {
            entry.push_str(&esc(file, 200));
            if let Some(line) = f.line {
                let _ = write!(entry, ":{line}");
                if let Some(column) = f.column {
                    let _ = write!(entry, ":{column}");
                }
            }
        }
        None => entry.push_str("(no file)"),
    }
    if let Some(code) = &f.code {
        let _ = write!(entry, " {}", esc(code, 40));
    }
    if let Some(test) = &f.test {
        let _ = write!(entry, " test `{}`", esc(test, 200));
    }
    let mut lines = f.message.lines().map(str::trim).filter(|l| !l.is_empty());
    let _ = write!(
        entry,
        ": {}",
        esc(lines.next().unwrap_or(""), MAX_MESSAGE_CHARS)
    );
    for line in lines.take(MAX_MESSAGE_LINES * 2) {
        let _ = write!(entry, "\n    {}", esc(line, MAX_MESSAGE_CHARS));
    }
    if let Some(related) = &f.related_file {
        let _ = write!(entry, " (imports from {})", esc(related, 200));
    }
    entry.push('\n');
    // One failure may not take more than a third of the description.
    if entry.len() > MAX_DESCRIPTION_BYTES / 3 {
        truncate_bytes(&mut entry, MAX_DESCRIPTION_BYTES / 3 - 4);
        entry.push_str("…\n");
    }
    entry
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
) -> Result<Vec<String>, String> {
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
            "the failures name no file, and a fix task with an empty scope could change any \
             file without holding a lock"
                .to_string()
        } else {
            format!(
                "none of the {} files the failures name may be in a task's scope (absolute, \
                 outside the repository or inside .git)",
                group_scope.len()
            )
        });
    }
    if scope.len() > max_paths {
        return Err(format!(
            "the failures name {} files, more than a task's scope may hold ({max_paths}, \
             limits.max_scope_paths){}",
            scope.len(),
            if left_out > 0 {
                format!("; {left_out} more were not paths a task may have")
            } else {
                String::new()
            }
        ));
    }
    Ok(scope)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_that_timed_out_says_so_and_keeps_what_it_printed() {
        let found = timed_out(CommandKind::Test, "cargo test", 600, "", None);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].message, "`cargo test` timed out after 600 s");
        let found = timed_out(
            CommandKind::Test,
            "make\x1b]0;title\x07",
            5,
            "src/a.rs:3: error: boom\n",
            None,
        );
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].file.as_deref(), Some("src/a.rs"));
        assert!(found[1].message.contains("timed out after 5 s"));
        assert!(!found[1].message.contains('\x1b'), "{}", found[1].message);
    }

    #[test]
    fn a_fix_scope_follows_the_rules_of_any_tasks_scope() {
        let paths = |v: &[&str]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        assert_eq!(
            fix_scope(
                &paths(&[
                    "./src/a.rs",
                    "src/a.rs",
                    ".GIT/config",
                    ".Git/x",
                    "/abs",
                    "a/../../b",
                    "b.rs"
                ]),
                64,
                1024
            ),
            Ok(paths(&["b.rs", "src/a.rs"]))
        );
        let why = fix_scope(&[], 64, 1024).unwrap_err();
        assert!(why.contains("empty scope"), "{why}");
        let why = fix_scope(&paths(&[".gIt/config", "/etc/x"]), 64, 1024).unwrap_err();
        assert!(why.contains("none of the 2 files"), "{why}");
        let many: Vec<String> = (0..65).map(|i| format!("f{i}")).collect();
        let why = fix_scope(&many, 64, 1024).unwrap_err();
        assert!(why.contains("65 files") && why.contains("(64"), "{why}");
        assert_eq!(fix_scope(&many[..64], 64, 1024).map(|s| s.len()), Ok(64));
    }

    const RUSTC_RENAME_HUMAN: &str =
        include_str!("../tests/fixtures/failures/rustc_rename_human.txt");
    const RUSTC_RENAME_JSON: &str =
        include_str!("../tests/fixtures/failures/rustc_rename_json.txt");
    const RUSTC_IMPORT_HUMAN: &str =
        include_str!("../tests/fixtures/failures/rustc_import_human.txt");
    const RUSTC_SYNTAX: &str = include_str!("../tests/fixtures/failures/rustc_syntax_human.txt");
    const RUSTC_DIFF_MARKER: &str =
        include_str!("../tests/fixtures/failures/rustc_diff_marker_human.txt");
    const RUSTC_WARNING_AND_ERROR: &str =
        include_str!("../tests/fixtures/failures/rustc_warning_and_error.txt");
    const RUSTC_TWO_CAUSES: &str =
        include_str!("../tests/fixtures/failures/rustc_two_causes_one_file.txt");
    const CARGO_MANIFEST: &str =
        include_str!("../tests/fixtures/failures/cargo_manifest_errors.txt");
    const CARGO_TEST_FAILURES: &str =
        include_str!("../tests/fixtures/failures/cargo_test_failures.txt");
    const CARGO_TEST_COMPILE: &str =
        include_str!("../tests/fixtures/failures/cargo_test_compile_error.txt");
    const TSC_PLAIN: &str = include_str!("../tests/fixtures/failures/tsc_plain.txt");
    const TSC_PRETTY: &str = include_str!("../tests/fixtures/failures/tsc_pretty.txt");
    const PYTEST_FAILURES: &str = include_str!("../tests/fixtures/failures/pytest_failures.txt");
    const PYTEST_COLLECTION: &str =
        include_str!("../tests/fixtures/failures/pytest_collection_error.txt");
    const GO_TEST_MIXED: &str = include_str!("../tests/fixtures/failures/go_test_mixed.txt");
    const GO_TEST_VERBOSE: &str = include_str!("../tests/fixtures/failures/go_test_verbose.txt");

    fn at(f: &Failure) -> (Option<&str>, Option<u32>, Option<u32>) {
        (f.file.as_deref(), f.line, f.column)
    }

    // --- the types ---------------------------------------------------------------------

    #[test]
    fn classes_order_by_priority_and_display() {
        use FailureClass::*;
        assert!(ConflictMarkers > Build && Build > Compile && Compile > Test);
        assert_eq!(
            [Test, ConflictMarkers, Compile].into_iter().max(),
            Some(ConflictMarkers)
        );
        assert!(ConflictMarkers.priority() > Build.priority());
        assert!(Build.priority() > Compile.priority());
        assert!(Compile.priority() > Test.priority());
        let shown: Vec<String> = [ConflictMarkers, Build, Compile, Test]
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            shown,
            [
                "conflict markers",
                "build failure",
                "compile error",
                "test failure"
            ]
        );
        assert_eq!(
            serde_json::to_string(&ConflictMarkers).unwrap(),
            "\"conflict_markers\""
        );
        assert_eq!(
            serde_json::to_string(&CommandKind::Typecheck).unwrap(),
            "\"typecheck\""
        );
    }

    // --- rustc ---------------------------------------------------------------------------

    #[test]
    fn rustc_json_keeps_errors_and_skips_notes() {
        let found = parse_output(CommandKind::Build, RUSTC_RENAME_JSON);
        assert_eq!(found.len(), 5, "{found:#?}");
        assert!(found.iter().all(|f| f.class == FailureClass::Compile));
        assert!(found.iter().all(|f| f.symbol.as_deref() == Some("Calc")));
        assert_eq!(found[0].code.as_deref(), Some("E0433"));
        assert_eq!(found[0].message, "cannot find `Calc` in `calc`");
        assert_eq!(at(&found[0]), (Some("src/a.rs"), Some(4), Some(11)));
        assert_eq!(at(&found[4]), (Some("src/b.rs"), Some(2), Some(25)));
    }

    #[test]
    fn rustc_human_output_matches_its_json() {
        let human = parse_output(CommandKind::Build, RUSTC_RENAME_HUMAN);
        let json = parse_output(CommandKind::Build, RUSTC_RENAME_JSON);
        assert_eq!(human, json);
    }

    #[test]
    fn renamed_type_across_two_files_is_one_group() {
        for text in [RUSTC_RENAME_HUMAN, RUSTC_RENAME_JSON] {
            let groups = classify_and_group(&parse_output(CommandKind::Build, text), 5);
            assert_eq!(groups.len(), 1, "{groups:#?}");
            let g = &groups[0];
            assert_eq!(g.class, FailureClass::Compile);
            assert_eq!(g.scope, ["src/a.rs", "src/b.rs"]);
            assert_eq!(g.failures_total, 5);
            assert_eq!(g.cause, "`Calc`");
            assert_eq!(
                g.title,
                "Fix compile errors about `Calc` in src/a.rs, src/b.rs"
            );
        }
    }

    #[test]
    fn rustc_unresolved_import_points_at_the_module_file() {
        let found = parse_output(CommandKind::Build, RUSTC_IMPORT_HUMAN);
        assert_eq!(found.len(), 3, "{found:#?}");
        assert_eq!(found[0].code.as_deref(), Some("E0432"));
        assert_eq!(found[0].symbol.as_deref(), Some("Calc"));
        assert_eq!(found[0].related_file.as_deref(), Some("src/calc.rs"));
        let groups = classify_and_group(&found, 5);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].scope, ["src/a.rs", "src/b.rs", "src/calc.rs"]);
        // Not from `crate::`: unsure, so no file.
        assert_eq!(
            rust_module_file("calc::a::Adder", Some("tests/broken.rs")),
            None
        );
        assert_eq!(
            rust_module_file("crate::a::b::X", Some("crates/k/src/lib.rs")).as_deref(),
            Some("crates/k/src/a/b.rs")
        );
        assert_eq!(rust_module_file("crate::X", Some("src/lib.rs")), None);
    }

    #[test]
    fn rustc_short_format() {
        let text = "   Compiling calc v0.1.0 (/tmp/fx/calc)\nsrc/a.rs:2:37: error[E0433]: cannot find `Calc` in `calc`: could not find `Calc` in `calc`\nsrc/a.rs:2:24: error[E0425]: cannot find type `Calc` in module `calc`: not found in `calc`\nsrc/b.rs:1:20: warning: unused variable: `unused`\nsrc/b.rs:1:45: error[E0308]: mismatched types: expected `i64`, found `&str`\nerror: could not compile `calc` (lib) due to 3 previous errors\n";
        let found = parse_output(CommandKind::Test, text);
        assert_eq!(found.len(), 3, "{found:#?}");
        assert!(found.iter().all(|f| f.class == FailureClass::Compile));
        assert_eq!(found[0].symbol.as_deref(), Some("Calc"));
        assert_eq!(at(&found[2]), (Some("src/b.rs"), Some(1), Some(45)));
        assert_eq!(found[2].code.as_deref(), Some("E0308"));
        // gcc's `error:` keeps the command's class.
        let gcc = parse_output(CommandKind::Build, "src/m.c:3:5: error: 'x' undeclared\n");
        assert_eq!(gcc[0].class, FailureClass::Build);
    }

    #[test]
    fn rustc_warnings_are_skipped() {
        let found = parse_output(CommandKind::Build, RUSTC_WARNING_AND_ERROR);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(found[0].code.as_deref(), Some("E0505"));
        assert_eq!(found[0].class, FailureClass::Compile);
        assert_eq!(at(&found[0]), (Some("src/b.rs"), Some(5), Some(10)));
        // A borrow error is about a local, not a symbol callers share.
        assert_eq!(found[0].symbol, None);
    }

    #[test]
    fn rustc_syntax_error_is_a_build_failure() {
        let found = parse_output(CommandKind::Typecheck, RUSTC_SYNTAX);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(found[0].class, FailureClass::Build);
        assert_eq!(found[0].message, "mismatched closing delimiter: `}`");
        assert_eq!(at(&found[0]), (Some("src/a.rs"), Some(2), Some(13)));
        let expected = "error: expected one of `,`, `:`, or `}`, found `x`\n --> src/c.rs:4:9\n";
        assert_eq!(
            parse_output(CommandKind::Test, expected)[0].class,
            FailureClass::Build
        );
    }

    #[test]
    fn rustc_diff_marker_is_a_conflict_marker_failure() {
        let found = parse_output(CommandKind::Build, RUSTC_DIFF_MARKER);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(found[0].class, FailureClass::ConflictMarkers);
        assert_eq!(at(&found[0]), (Some("src/a.rs"), Some(1), Some(1)));
    }

    #[test]
    fn cargo_manifest_and_dependency_errors_are_build_failures() {
        let found = parse_output(CommandKind::Test, CARGO_MANIFEST);
        let summary: Vec<(FailureClass, Option<&str>, &str)> = found
            .iter()
            .map(|f| (f.class, f.file.as_deref(), f.message.as_str()))
            .collect();
        assert_eq!(
            summary,
            [
                (
                    FailureClass::Build,
                    Some("Cargo.toml"),
                    "unclosed inline table, expected `}`"
                ),
                (
                    FailureClass::Build,
                    Some("Cargo.toml"),
                    "invalid type: integer `3`, expected a string"
                ),
                (
                    FailureClass::Build,
                    None,
                    "no matching package named `serde_nonexistent_zz` found"
                ),
                (
                    FailureClass::Build,
                    Some("Cargo.toml"),
                    "could not find `Cargo.toml` in `/tmp` or any parent directory"
                ),
            ]
        );
    }

    #[test]
    fn linker_errors_are_build_failures() {
        let text = "error: linking with `cc` failed: exit status: 1\n  |\n  = note: some arguments are omitted\n  = note: /usr/bin/ld: calc.o: in function `main':\n          calc.c:(.text+0x9): undefined reference to `add_numbers'\n          collect2: error: ld returned 1 exit status\n\nerror: could not compile `calc` (bin \"calc\") due to 1 previous error\n";
        let found = parse_output(CommandKind::Build, text);
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(
            found
                .iter()
                .all(|f| f.class == FailureClass::Build && f.file.is_none())
        );
        assert_eq!(found[1].symbol.as_deref(), Some("add_numbers"));
        let groups = classify_and_group(&found, 5);
        assert_eq!(groups.len(), 1);
        assert!(groups[0].scope.is_empty());
    }

    // --- cargo test ----------------------------------------------------------------------

    #[test]
    fn cargo_test_failures_carry_their_panic_location() {
        let found = parse_output(CommandKind::Test, CARGO_TEST_FAILURES);
        let tests: Vec<_> = found
            .iter()
            .map(|f| (f.test.as_deref().unwrap(), at(f)))
            .collect();
        assert_eq!(
            tests,
            [
                ("a::tests::adds_zero", (Some("src/a.rs"), Some(9), Some(22))),
                ("a::tests::adds", (Some("src/a.rs"), Some(7), Some(17))),
                (
                    "a::tests::must_panic",
                    (Some("src/a.rs"), Some(14), Some(8))
                ),
                ("integration_adds", (Some("tests/it.rs"), Some(4), Some(14))),
            ]
        );
        assert!(found.iter().all(|f| f.class == FailureClass::Test));
        assert_eq!(
            found[1].message,
            "assertion `left == right` failed\nleft: 4\nright: 3"
        );
        assert_eq!(found[2].message, "test did not panic as expected");
        let groups = classify_and_group(&found, 5);
        let scopes: Vec<&[String]> = groups.iter().map(|g| g.scope.as_slice()).collect();
        assert_eq!(
            scopes,
            [
                &["src/a.rs".to_string()][..],
                &["tests/it.rs".to_string()][..]
            ]
        );
        assert_eq!(groups[0].title, "Fix test failures in src/a.rs");
    }

    #[test]
    fn cargo_test_old_panic_format_and_doctests() {
        let text = "test tests::adds ... FAILED\ntest src/lib.rs - add (line 5) ... FAILED\n\nfailures:\n\n---- tests::adds stdout ----\nthread 'tests::adds' panicked at 'assertion failed: `(left == right)`\n  left: `3`,\n right: `4`', src/lib.rs:10:5\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
        let found = parse_output(CommandKind::Test, text);
        assert_eq!(found.len(), 2, "{found:#?}");
        assert_eq!(at(&found[0]), (Some("src/lib.rs"), Some(10), Some(5)));
        assert_eq!(
            found[0].message,
            "assertion failed: `(left == right)`\nleft: `3`,\nright: `4`"
        );
        assert_eq!(found[1].test.as_deref(), Some("src/lib.rs - add (line 5)"));
        assert_eq!(at(&found[1]), (Some("src/lib.rs"), Some(5), None));
    }

    #[test]
    fn a_test_run_that_failed_to_compile_gives_compile_failures() {
        let found = parse_output(CommandKind::Test, CARGO_TEST_COMPILE);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(found[0].class, FailureClass::Compile);
        assert_eq!(found[0].symbol.as_deref(), Some("Adder"));
        assert_eq!(at(&found[0]), (Some("tests/broken.rs"), Some(1), Some(5)));
    }

    #[test]
    fn a_compile_error_outranks_failing_tests() {
        let mut found = parse_output(CommandKind::Test, CARGO_TEST_FAILURES);
        found.extend(parse_output(CommandKind::Build, RUSTC_TWO_CAUSES));
        let groups = classify_and_group(&found, 5);
        assert!(!groups.is_empty());
        assert!(
            groups.iter().all(|g| g.class == FailureClass::Compile),
            "{groups:#?}"
        );
        // The same in one output (go test: one package failed to build, another's tests
        // failed).
        let groups = classify_and_group(&parse_output(CommandKind::Test, GO_TEST_MIXED), 5);
        assert_eq!(groups.len(), 1, "{groups:#?}");
        assert_eq!(groups[0].class, FailureClass::Compile);
        assert_eq!(groups[0].cause, "`NewCircle`");
    }

    // --- tsc -----------------------------------------------------------------------------

    #[test]
    fn tsc_plain_output() {
        let found = parse_output(CommandKind::Typecheck, TSC_PLAIN);
        assert_eq!(found.len(), 6, "{found:#?}");
        assert_eq!(found[0].code.as_deref(), Some("TS2305"));
        assert_eq!(found[0].symbol.as_deref(), Some("Circle"));
        assert_eq!(found[0].related_file.as_deref(), Some("src/shapes.ts"));
        assert_eq!(at(&found[0]), (Some("src/app.ts"), Some(1), Some(10)));
        assert_eq!(found[1].symbol.as_deref(), Some("Circle"));
        assert_eq!(found[2].related_file.as_deref(), Some("src/shapes.ts"));
        assert_eq!(found[3].symbol, None);
        assert_eq!(found[3].class, FailureClass::Compile);
        assert_eq!(found[5].class, FailureClass::Build, "TS1xxx is syntax");
    }

    #[test]
    fn tsc_pretty_output() {
        let found = parse_output(CommandKind::Typecheck, TSC_PRETTY);
        assert_eq!(found.len(), 2, "{found:#?}");
        assert_eq!(found[0].code.as_deref(), Some("TS2307"));
        assert_eq!(found[0].related_file.as_deref(), Some("src/shapes.ts"));
        assert_eq!(at(&found[1]), (Some("src/util.ts"), Some(12), Some(7)));
        assert_eq!(
            found[1].message,
            "Type 'string' is not assignable to type 'number'."
        );
        // Colored, as with --pretty on a terminal.
        let colored = "\u{1b}[96msrc/a.ts\u{1b}[0m:\u{1b}[93m3\u{1b}[0m:\u{1b}[93m5\u{1b}[0m - \u{1b}[91merror\u{1b}[0m\u{1b}[90m TS2304: \u{1b}[0mCannot find name 'Foo'.\n";
        let found = parse_output(CommandKind::Typecheck, colored);
        assert_eq!(at(&found[0]), (Some("src/a.ts"), Some(3), Some(5)));
        assert_eq!(found[0].symbol.as_deref(), Some("Foo"));
    }

    #[test]
    fn import_chain_groups_both_files() {
        let text =
            "src/app.ts(1,10): error TS2305: Module './shapes' has no exported member 'Circle'.\n";
        let groups = classify_and_group(&parse_output(CommandKind::Typecheck, text), 5);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].scope, ["src/app.ts", "src/shapes.ts"]);
        // Everything about `Circle`, and what imports from src/shapes.ts, is one task.
        let groups = classify_and_group(&parse_output(CommandKind::Typecheck, TSC_PLAIN), 5);
        assert_eq!(
            groups[0].class,
            FailureClass::Build,
            "the syntax error outranks"
        );
        let typed: Vec<Failure> = parse_output(CommandKind::Typecheck, TSC_PLAIN)
            .into_iter()
            .filter(|f| f.class == FailureClass::Compile)
            .collect();
        let groups = classify_and_group(&typed, 5);
        assert_eq!(groups.len(), 2, "{groups:#?}");
        assert_eq!(
            groups[0].scope,
            ["src/app.ts", "src/geometry/area.ts", "src/shapes.ts"]
        );
        assert_eq!(groups[0].failures_total, 3);
        assert_eq!(groups[1].scope, ["src/util.ts"]);
        assert_eq!(groups[1].cause, "TS2322");
        // A chain without a symbol (the module is missing) still joins both files.
        let groups = classify_and_group(&parse_output(CommandKind::Typecheck, TSC_PRETTY), 5);
        assert_eq!(groups[0].scope, ["src/app.ts", "src/shapes.ts"]);
        assert_eq!(groups[0].cause, "imports from src/shapes.ts");
        assert_eq!(ts_module_file("src/a.ts", "../../x"), None);
        assert_eq!(ts_module_file("src/a.ts", "react"), None);
        assert_eq!(
            ts_module_file("src/a/b.ts", "../c.js").as_deref(),
            Some("src/c.ts")
        );
    }

    // --- pytest --------------------------------------------------------------------------

    #[test]
    fn pytest_failures_with_locations() {
        let found = parse_output_in(
            CommandKind::Test,
            PYTEST_FAILURES,
            Some("/tmp/flotilla-sweep-7/repo"),
        );
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(found.iter().all(|f| f.class == FailureClass::Test));
        assert_eq!(found[0].test.as_deref(), Some("test_add"));
        assert_eq!(at(&found[0]), (Some("tests/test_calc.py"), Some(12), None));
        assert_eq!(found[0].message, "assert 3 == 4");
        assert_eq!(found[1].test.as_deref(), Some("TestCalc::test_div"));
        assert_eq!(at(&found[1]), (Some("tests/test_calc.py"), Some(20), None));
        assert_eq!(classify_and_group(&found, 5).len(), 1);
    }

    #[test]
    fn pytest_collection_error_is_a_compile_error_with_its_import_chain() {
        let found = parse_output_in(
            CommandKind::Test,
            PYTEST_COLLECTION,
            Some("/tmp/flotilla-sweep-7/repo/"),
        );
        assert_eq!(found.len(), 1, "{found:#?}");
        let f = &found[0];
        assert_eq!(f.class, FailureClass::Compile);
        assert_eq!(f.file.as_deref(), Some("tests/test_shapes.py"));
        assert_eq!(
            f.message,
            "ImportError: cannot import name 'Circle' from 'shapes' (shapes.py)"
        );
        assert_eq!(f.symbol.as_deref(), Some("Circle"));
        assert_eq!(f.related_file.as_deref(), Some("shapes.py"));
        // Without the root the module's path is absolute: no related file.
        let found = parse_output(CommandKind::Test, PYTEST_COLLECTION);
        assert_eq!(found[0].related_file, None);
        // An older summary line with its message.
        let text = "ERROR tests/test_x.py - ModuleNotFoundError: No module named 'calc'\n";
        let found = parse_output(CommandKind::Test, text);
        assert_eq!(found[0].class, FailureClass::Compile);
        assert_eq!(found[0].symbol.as_deref(), Some("calc"));
    }

    // --- go ------------------------------------------------------------------------------

    #[test]
    fn go_test_failures_and_build_errors() {
        let found = parse_output(CommandKind::Test, GO_TEST_MIXED);
        let summary: Vec<_> = found
            .iter()
            .map(|f| (f.class, f.file.as_deref(), f.line, f.test.as_deref()))
            .collect();
        assert_eq!(
            summary,
            [
                (
                    FailureClass::Compile,
                    Some("shapes/shapes_test.go"),
                    Some(8),
                    None
                ),
                (
                    FailureClass::Compile,
                    Some("shapes/shapes_test.go"),
                    Some(14),
                    None
                ),
                (
                    FailureClass::Test,
                    Some("calc_test.go"),
                    Some(12),
                    Some("TestAdd")
                ),
                (
                    FailureClass::Test,
                    Some("calc_test.go"),
                    Some(25),
                    Some("TestDiv/by_zero")
                ),
            ],
            "{found:#?}"
        );
        assert_eq!(found[0].symbol.as_deref(), Some("NewCircle"));
        assert_eq!(found[2].message, "Add(1, 2) = 4; want 3");
        let go_build = "# example.com/calc\n./calc.go:3:2: undefined: Foo\n./calc.go:9:1: syntax error: unexpected }\n";
        let found = parse_output(CommandKind::Test, go_build);
        assert_eq!(found[0].file.as_deref(), Some("calc.go"));
        assert_eq!(found[0].class, FailureClass::Compile);
        assert_eq!(found[1].class, FailureClass::Build);
    }

    #[test]
    fn go_test_verbose_and_json() {
        let found = parse_output(CommandKind::Test, GO_TEST_VERBOSE);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(found[0].test.as_deref(), Some("TestAdd"));
        assert_eq!(at(&found[0]), (Some("calc_test.go"), Some(12), None));
        let json = concat!(
            r#"{"Time":"2024-05-01T10:00:00Z","Action":"run","Package":"example.com/calc","Test":"TestAdd"}"#,
            "\n",
            r#"{"Time":"2024-05-01T10:00:00Z","Action":"output","Package":"example.com/calc","Test":"TestAdd","Output":"--- FAIL: TestAdd (0.00s)\n"}"#,
            "\n",
            r#"{"Time":"2024-05-01T10:00:00Z","Action":"output","Package":"example.com/calc","Test":"TestAdd","Output":"    calc_test.go:12: Add(1, 2) = 4; want 3\n"}"#,
            "\n",
            r#"{"Time":"2024-05-01T10:00:00Z","Action":"fail","Package":"example.com/calc","Test":"TestAdd","Elapsed":0}"#,
            "\n"
        );
        let found = parse_output(CommandKind::Test, json);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(at(&found[0]), (Some("calc_test.go"), Some(12), None));
        assert_eq!(found[0].message, "Add(1, 2) = 4; want 3");
        let build = r#"{"ImportPath":"example.com/calc [example.com/calc.test]","Action":"build-output","Output":"./calc.go:3:2: undefined: Foo\n"}"#;
        let found = parse_output(CommandKind::Test, build);
        assert_eq!(found[0].class, FailureClass::Compile);
        assert_eq!(found[0].symbol.as_deref(), Some("Foo"));
    }

    // --- fallback and catch-all ------------------------------------------------------------

    #[test]
    fn generic_fallback_takes_its_class_from_the_command() {
        let text = "./build.sh:12: syntax error near unexpected token `fi'\nsrc/main.c:3:5: error: 'x' undeclared (first use in this function)\nsrc/main.c:3:5: note: each undeclared identifier is reported only once\nMakefile:4: recipe for target 'all' failed\nlocalhost:8080: connection refused\nError: 12:30: nothing\n  indented/file.c:1:1: not at the start\n";
        let found = parse_output(CommandKind::Build, text);
        let summary: Vec<_> = found
            .iter()
            .map(|f| {
                (
                    f.class,
                    f.file.as_deref(),
                    f.line,
                    f.column,
                    f.message.as_str(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                (
                    FailureClass::Build,
                    Some("build.sh"),
                    Some(12),
                    None,
                    "syntax error near unexpected token `fi'"
                ),
                (
                    FailureClass::Build,
                    Some("src/main.c"),
                    Some(3),
                    Some(5),
                    "'x' undeclared (first use in this function)"
                ),
            ]
        );
        let mypy = "src/calc.py:3: error: Name \"Foo\" is not defined  [name-defined]\n";
        assert_eq!(
            parse_output(CommandKind::Typecheck, mypy)[0].class,
            FailureClass::Compile
        );
        assert_eq!(
            parse_output(CommandKind::Test, mypy)[0].class,
            FailureClass::Test
        );
    }

    #[test]
    fn unparsed_output_gives_one_catch_all_failure() {
        let text =
            "Compiling...\n\nSegmentation fault (core dumped)\nmake: *** [all] Error 139\n\n";
        let found = parse_output(CommandKind::Build, text);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].class, FailureClass::Build);
        assert_eq!(found[0].file, None);
        assert_eq!(
            found[0].message,
            "Compiling...\nSegmentation fault (core dumped)\nmake: *** [all] Error 139"
        );
        let found = parse_output(CommandKind::Test, "");
        assert_eq!(found[0].class, FailureClass::Test);
        assert_eq!(
            found[0].message,
            "the command failed without printing anything"
        );
        // The tail is bounded: the last lines are kept.
        let long: String = (0..2_000).map(|i| format!("line {i}\n")).collect();
        let found = parse_output(CommandKind::Typecheck, &long);
        assert!(found[0].message.len() <= MAX_TAIL_BYTES);
        assert!(found[0].message.ends_with("line 1999"));
        assert_eq!(found[0].class, FailureClass::Compile);
        // An uncoded `error:` without a span is not trusted as rustc's, so only the
        // catch-all shows it.
        let found = parse_output(CommandKind::Test, "error: Recipe `test` failed on line 3\n");
        assert_eq!(found[0].class, FailureClass::Test);
        assert_eq!(found[0].message, "error: Recipe `test` failed on line 3");
    }

    // --- grouping --------------------------------------------------------------------------

    #[test]
    fn conflict_markers_outrank_everything() {
        let mut found = parse_output(CommandKind::Build, RUSTC_SYNTAX);
        found.extend(parse_output(CommandKind::Build, RUSTC_RENAME_HUMAN));
        found.extend(parse_output(CommandKind::Test, CARGO_TEST_FAILURES));
        found.extend(markers_failures(&[
            ("./src/z.rs".to_string(), 30),
            ("src/z.rs".to_string(), 10),
            ("src/y.rs".to_string(), 1),
            ("src/z.rs".to_string(), 20),
        ]));
        let groups = classify_and_group(&found, 5);
        assert_eq!(groups.len(), 2, "{groups:#?}");
        assert!(
            groups
                .iter()
                .all(|g| g.class == FailureClass::ConflictMarkers)
        );
        assert_eq!(groups[0].scope, ["src/y.rs"]);
        assert_eq!(groups[1].scope, ["src/z.rs"]);
        assert_eq!(
            groups[1].title,
            "Resolve merge conflict markers in src/z.rs"
        );
        let z = &groups[1].failures[0];
        assert_eq!(z.line, Some(10));
        assert!(z.message.ends_with("at lines 10, 20, 30"), "{}", z.message);
    }

    #[test]
    fn same_file_different_causes_are_two_groups() {
        let found = parse_output(CommandKind::Build, RUSTC_TWO_CAUSES);
        assert_eq!(found.len(), 2, "{found:#?}");
        let groups = classify_and_group(&found, 5);
        assert_eq!(groups.len(), 2, "{groups:#?}");
        assert!(groups.iter().all(|g| g.scope == ["src/b.rs"]));
        let causes: BTreeSet<&str> = groups.iter().map(|g| g.cause.as_str()).collect();
        assert_eq!(causes, BTreeSet::from(["E0061", "E0308"]));
        assert!(
            groups
                .iter()
                .any(|g| g.title == "Fix compile error E0308 (mismatched types) in src/b.rs")
        );
        // Same file, same code: one group.
        let twice = format!(
            "{RUSTC_TWO_CAUSES}{}",
            RUSTC_TWO_CAUSES.replace("src/b.rs:3:21", "src/b.rs:9:21")
        );
        let groups = classify_and_group(&parse_output(CommandKind::Build, &twice), 5);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].failures_total, 2);
        assert_eq!(groups[0].cause, "E0308");
    }

    fn compile_error(file: &str, line: u32, code: &str, message: &str) -> Failure {
        let mut f = Failure::new(FailureClass::Compile, message.to_string());
        f.file = Some(file.to_string());
        f.line = Some(line);
        f.code = Some(code.to_string());
        f
    }

    #[test]
    fn max_groups_caps_the_groups_biggest_first() {
        let mut found = Vec::new();
        for (i, file) in [
            "src/a.rs", "src/b.rs", "src/c.rs", "src/d.rs", "src/e.rs", "src/f.rs", "src/g.rs",
        ]
        .iter()
        .enumerate()
        {
            for line in 0..=(i % 3) {
                found.push(compile_error(
                    file,
                    line as u32 + 1,
                    "E0308",
                    "mismatched types",
                ));
            }
        }
        let groups = classify_and_group(&found, 5);
        assert_eq!(groups.len(), 5);
        let order: Vec<(&str, usize)> = groups
            .iter()
            .map(|g| (g.scope[0].as_str(), g.failures_total))
            .collect();
        assert_eq!(
            order,
            [
                ("src/c.rs", 3),
                ("src/f.rs", 3),
                ("src/b.rs", 2),
                ("src/e.rs", 2),
                ("src/a.rs", 1)
            ]
        );
        assert!(classify_and_group(&found, 0).is_empty());
        assert!(classify_and_group(&[], 5).is_empty());
        // A group keeps 20 failures and counts them all.
        let many: Vec<Failure> = (1..=45)
            .map(|l| compile_error("src/a.rs", l, "E0308", "mismatched types"))
            .collect();
        let groups = classify_and_group(&many, 5);
        assert_eq!(groups[0].failures.len(), MAX_GROUP_FAILURES);
        assert_eq!(groups[0].failures_total, 45);
    }

    #[test]
    fn signatures_survive_reordering_and_moved_lines() {
        let before = classify_and_group(&parse_output(CommandKind::Build, RUSTC_RENAME_HUMAN), 5);
        // The next sweep: the same problem, lines moved, errors in another order.
        let mut moved = parse_output(CommandKind::Build, RUSTC_RENAME_JSON);
        for f in &mut moved {
            f.line = f.line.map(|l| l + 40);
            f.column = f.column.map(|c| c + 1);
        }
        moved.reverse();
        let after = classify_and_group(&moved, 5);
        assert_eq!(before.len(), 1);
        assert_eq!(before[0].signature, after[0].signature);
        assert!(before[0].signature.starts_with("compile-"));
        assert!(!before[0].signature.contains(char::is_whitespace));

        let two = classify_and_group(&parse_output(CommandKind::Build, RUSTC_TWO_CAUSES), 5);
        let shifted = RUSTC_TWO_CAUSES
            .replace("src/b.rs:3:21", "src/b.rs:13:2")
            .replace("src/b.rs:4:5", "src/b.rs:17:1");
        let mut again = parse_output(CommandKind::Build, &shifted);
        again.reverse();
        let again = classify_and_group(&again, 5);
        let sigs = |g: &[FixGroup]| {
            g.iter()
                .map(|g| g.signature.clone())
                .collect::<BTreeSet<_>>()
        };
        assert_eq!(sigs(&two), sigs(&again));
        assert_eq!(sigs(&two).len(), 2);
        // A different problem is a different signature.
        assert_ne!(before[0].signature, two[0].signature);
        // Test groups: the same failing file, whatever the test output says.
        let t1 = classify_and_group(&parse_output(CommandKind::Test, CARGO_TEST_FAILURES), 5);
        let t2 = classify_and_group(
            &parse_output(
                CommandKind::Test,
                &CARGO_TEST_FAILURES.replace("left: 4", "left: 5"),
            ),
            5,
        );
        assert_eq!(sigs(&t1), sigs(&t2));
        // Message causes mask their numbers.
        let a = classify_and_group(
            &parse_output(CommandKind::Build, "build.sh:3: needs 2 args\n"),
            5,
        );
        let b = classify_and_group(
            &parse_output(CommandKind::Build, "build.sh:9: needs 3 args\n"),
            5,
        );
        assert_eq!(a[0].signature, b[0].signature);
    }

    #[test]
    fn unlocated_failures_form_one_whole_repo_group() {
        let mut found = vec![
            Failure::new(FailureClass::Build, "first".into()),
            Failure::new(FailureClass::Build, "second".into()),
        ];
        found[1].symbol = Some("foo".into());
        let mut located = Failure::new(FailureClass::Build, "expected `;`".into());
        located.file = Some("src/a.rs".into());
        found.push(located);
        let groups = classify_and_group(&found, 5);
        assert_eq!(groups.len(), 2, "{groups:#?}");
        let whole: Vec<&FixGroup> = groups.iter().filter(|g| g.scope.is_empty()).collect();
        assert_eq!(whole.len(), 1);
        assert_eq!(whole[0].failures_total, 2);
        assert_eq!(
            whole[0].title,
            "Fix build failures reported without a file location: first"
        );
    }

    // --- describe --------------------------------------------------------------------------

    #[test]
    fn describe_lists_the_failures() {
        let groups = classify_and_group(&parse_output(CommandKind::Build, RUSTC_RENAME_HUMAN), 5);
        let text = describe(&groups[0]);
        assert!(
            text.starts_with("Fix compile errors about `Calc` in src/a.rs, src/b.rs\n"),
            "{text}"
        );
        assert!(text.contains("Files: src/a.rs, src/b.rs\n"), "{text}");
        assert!(
            text.contains("- src/a.rs:3:24 E0425: cannot find type `Calc` in module `calc`\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "- src/b.rs:2:25 E0425: cannot find type `Calc` in module `crate::calc`\n"
            ),
            "{text}"
        );
        let tests = classify_and_group(&parse_output(CommandKind::Test, CARGO_TEST_FAILURES), 5);
        let text = describe(&tests[0]);
        assert!(
            text.contains("- src/a.rs:7:17 test `a::tests::adds`: assertion `left == right` failed\n    left: 4\n    right: 3\n"),
            "{text}"
        );
    }

    #[test]
    fn describe_escapes_control_characters_and_is_bounded() {
        let hostile = "boom\u{1b}]0;pwned\u{7}\u{1b}[2J\r\u{0}\u{202e}txt.exe\u{8}";
        let mut found: Vec<Failure> = (1..=400)
            .map(|l| {
                let mut f = compile_error(
                    "src/a.rs",
                    l,
                    "E0308",
                    &format!("{hostile} {}", "x".repeat(480)),
                );
                f.test = Some("t\u{1b}[31m".into());
                f
            })
            .collect();
        found[0].file = Some("src/\u{1b}evil.rs".into());
        let groups = classify_and_group(&found, 5);
        for g in &groups {
            assert!(
                !g.title.chars().any(|c| c.is_control() || is_invisible(c)),
                "{}",
                g.title
            );
            let text = describe(g);
            assert!(text.len() <= MAX_DESCRIPTION_BYTES, "{}", text.len());
            assert!(
                !text
                    .chars()
                    .any(|c| (c.is_control() && c != '\n') || is_invisible(c)),
                "{text:?}"
            );
            assert!(text.contains("\\u{1b}"), "escaped, not dropped");
        }
        // The path with an escape in it is no path: that failure is unlocated.
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].failures_total, 399);
        let text = describe(&groups[0]);
        assert!(text.ends_with("- … and 393 more\n"), "{text}");
        assert!(
            text.contains("Failures (399 in all, 6 listed):\n"),
            "{text}"
        );
        // Parsed output is escaped at the source too.
        let found = parse_output(CommandKind::Build, "src/a.c:1:1: bad\u{7} thing\u{202e}\n");
        assert_eq!(found[0].message, "bad\\u{7} thing\\u{202e}");
    }

    // --- paths and bounds -------------------------------------------------------------------

    #[test]
    fn paths_are_normalized_and_roots_stripped() {
        assert_eq!(
            normalize_path("./src/./a.rs", None).as_deref(),
            Some("src/a.rs")
        );
        assert_eq!(
            normalize_path("src\\b\\c.rs", None).as_deref(),
            Some("src/b/c.rs")
        );
        assert_eq!(
            normalize_path("src//a.rs", None).as_deref(),
            Some("src/a.rs")
        );
        assert_eq!(normalize_path("/abs/a.rs", None), None);
        assert_eq!(normalize_path("C:\\x\\a.rs", None), None);
        assert_eq!(normalize_path("src/../../etc/passwd", None), None);
        assert_eq!(normalize_path("src/../a.rs", None), None);
        assert_eq!(
            normalize_path("/tmp/s/src/a.rs", Some("/tmp/s")).as_deref(),
            Some("src/a.rs")
        );
        assert_eq!(normalize_path("/tmp/s2/src/a.rs", Some("/tmp/s")), None);
        let text = "/tmp/scratch-1/src/a.rs:3:1: failed to open /tmp/scratch-1/data/x.bin\n/elsewhere/b.rs:1:1: bad\n";
        let found = parse_output_in(CommandKind::Build, text, Some("/tmp/scratch-1/"));
        assert_eq!(found[0].file.as_deref(), Some("src/a.rs"));
        assert_eq!(found[0].message, "failed to open data/x.bin");
        assert_eq!(found[1].file, None);
        // A root of `/` would make every absolute path look like the repository's.
        let found = parse_output_in(CommandKind::Build, "/etc/x.conf:1: bad\n", Some("/"));
        assert_eq!(found[0].file, None);
        let json = r#"{"reason":"compiler-message","message":{"level":"error","message":"cannot find value `y` in this scope","code":{"code":"E0425"},"spans":[{"file_name":"/tmp/scratch-1/src/c.rs","line_start":2,"column_start":3,"is_primary":true}]}}"#;
        let found = parse_output_in(CommandKind::Build, json, Some("/tmp/scratch-1"));
        assert_eq!(at(&found[0]), (Some("src/c.rs"), Some(2), Some(3)));
        let found = parse_output(CommandKind::Build, json);
        assert_eq!(found[0].file, None, "absolute without a root");
    }

    #[test]
    fn parsing_is_bounded() {
        let many: String = (0..3_000)
            .map(|i| format!("src/f{i}.c:1:1: error: bad\n"))
            .collect();
        let found = parse_output(CommandKind::Build, &many);
        assert_eq!(found.len(), MAX_FAILURES);
        let long = format!("src/a.c:1:1: {}\n", "é".repeat(5_000));
        let found = parse_output(CommandKind::Build, &long);
        assert_eq!(found[0].message.chars().count(), MAX_MESSAGE_CHARS);
        assert!(found[0].message.ends_with('…'));
        // A line over 64 KiB is skipped unread.
        let huge = format!(
            "src/a.c:1:1: {}\nsrc/b.c:2:2: short\n",
            "x".repeat(MAX_LINE_BYTES)
        );
        let found = parse_output(CommandKind::Build, &huge);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].file.as_deref(), Some("src/b.c"));
        let tests: String = (0..3_000)
            .map(|i| format!("test t{i} ... FAILED\n"))
            .collect();
        assert_eq!(parse_output(CommandKind::Test, &tests).len(), MAX_FAILURES);
    }

    /// xorshift64*: deterministic noise without a dependency.
    struct Noise(u64);
    impl Noise {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn garbage_never_panics() {
        const PIECES: &[&str] = &[
            "error[",
            "E0412",
            "]: ",
            "error: ",
            "warning: ",
            " --> ",
            "-->",
            ":",
            "::",
            "(",
            ")",
            ",",
            "'",
            "`",
            "\"",
            "{",
            "}",
            "[",
            "]",
            "\n",
            "\r",
            "\t",
            " ",
            "    ",
            "0",
            "12",
            "99999999999",
            "4294967296",
            "src/a.rs",
            "./x.go",
            "a.ts",
            "tests/t.py",
            "/abs/p.rs",
            "../up.rs",
            "C:\\w.rs",
            "test ",
            " ... FAILED",
            "thread '",
            "' (7) panicked at ",
            "panicked at '",
            "', ",
            "---- ",
            " stdout ----",
            "--- FAIL: ",
            "=== RUN   ",
            "FAILED ",
            "ERROR ",
            "ERROR collecting ",
            "____ ",
            "E   ",
            "): error TS",
            " - error TS",
            "error TS",
            "2305",
            "1185",
            "undefined reference to `",
            "unresolved import `crate::",
            "cannot find ",
            "has no field named",
            "\u{1b}[",
            "\u{1b}]",
            "\u{1b}",
            "é",
            "日本",
            "\u{202e}",
            "\u{0}",
            "{\"reason\":\"compiler-message\",\"message\":",
            "{\"level\":\"error\",\"spans\":",
            "{\"Action\":\"output\",\"Output\":\"",
            "null",
            "[[[[[[[[",
            "}}}}",
            "\\u0000",
            "…",
        ];
        let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
        let kinds = [
            CommandKind::Build,
            CommandKind::Typecheck,
            CommandKind::Test,
        ];
        for round in 0..400 {
            let text = if round % 4 == 0 {
                let bytes: Vec<u8> = (0..noise.below(4_000))
                    .map(|_| noise.next() as u8)
                    .collect();
                String::from_utf8_lossy(&bytes).into_owned()
            } else {
                (0..noise.below(600))
                    .map(|_| PIECES[noise.below(PIECES.len())])
                    .collect()
            };
            let root = ["/abs", "/", "", "relative", "/tmp/x/"][round % 5];
            let found = parse_output_in(kinds[round % 3], &text, Some(root));
            check_bounds(&found);
            let mut all = found;
            all.extend(markers_failures(&[
                ("../x".to_string(), 1),
                (text.chars().take(50).collect(), 2),
            ]));
            for g in classify_and_group(&all, MAX_FIX_GROUPS) {
                assert!(describe(&g).len() <= MAX_DESCRIPTION_BYTES);
                assert!(g.failures.len() <= MAX_GROUP_FAILURES);
            }
        }
        // Huge lines, deep JSON, broken JSON, lone escapes.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let nested = format!(
            "{{\"reason\":\"compiler-message\",\"message\":{}1{}}}\n",
            "[".repeat(60_000),
            "]".repeat(60_000)
        );
        let weird_json = r#"{"reason":"compiler-message","message":{"level":"error","message":"cannot find type `X`","code":{"code":"E0412"},"spans":[{"file_name":7,"line_start":-1,"column_start":1e99,"is_primary":"yes"}]}}"#;
        for text in [
            "x".repeat(5 * MAX_LINE_BYTES),
            deep,
            nested,
            weird_json.to_string(),
            "{\"reason\":\"compiler-message\",\"message\":{\"level\":\"error\"".to_string(),
            "\u{1b}".to_string(),
            "\u{1b}[".to_string(),
            "\u{1b}]0;title".to_string(),
            "thread 'x' panicked at 'never closed\n".repeat(50),
            "--- FAIL: \n".to_string(),
            "test  ... FAILED\n".to_string(),
            "___\n_____\n__ x __\n".to_string(),
            "error[E0412]: cannot find type `Foo`".to_string(),
        ] {
            for kind in kinds {
                check_bounds(&parse_output(kind, &text));
            }
        }
    }

    fn check_bounds(found: &[Failure]) {
        assert!(
            !found.is_empty(),
            "a failed command always yields a failure"
        );
        assert!(found.len() <= MAX_FAILURES);
        for f in found {
            assert!(f.message.len() <= MAX_TAIL_BYTES.max(MAX_MESSAGE_CHARS * 4));
            assert!(
                !f.message
                    .chars()
                    .any(|c| (c.is_control() && c != '\n') || is_invisible(c)),
                "{f:?}"
            );
            for path in [&f.file, &f.related_file].into_iter().flatten() {
                assert!(
                    !path.starts_with('/') && !path.split('/').any(|p| p == ".." || p.is_empty()),
                    "{path}"
                );
            }
        }
    }
}
