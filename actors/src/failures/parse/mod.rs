//! The line-by-line state of all format parsers at once: every line goes through each format in
//! turn (one file per format), and [`Parser::finish`] completes what waited for the whole output
//! (tests and their panics or locations).

pub(super) mod fallback;
mod go;
mod libtest;
mod pytest;
mod rust;
mod tsc;

use super::*;
use rust::*;

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
pub(super) struct Parser {
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
    pub(super) fn new(root: Option<String>) -> Parser {
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
    pub(super) fn line(&mut self, line: &str, kind: CommandKind, json: bool) {
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

    // --- the end ------------------------------------------------------------------------

    /// Completes what waited for the whole output (tests and their panics or locations).
    pub(super) fn finish(mut self) -> Vec<Failure> {
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
}

/// The texts between backticks.
pub(in crate::failures) fn backticked(s: &str) -> Vec<&str> {
    s.split('`').skip(1).step_by(2).collect()
}

pub(in crate::failures) fn single_quoted(s: &str) -> Vec<&str> {
    s.split('\'').skip(1).step_by(2).collect()
}

pub(in crate::failures) fn clean_symbol(s: &str) -> Option<String> {
    let s = s.trim();
    let ok = !s.is_empty()
        && s.chars().count() <= MAX_FIELD_CHARS
        && !s
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || is_invisible(c));
    ok.then(|| s.to_string())
}

pub(in crate::failures) fn is_ident(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_alphanumeric() || c == '_')
}

pub(in crate::failures) fn is_dotted_ident(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 100
        && s.chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
}

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;
