//! libtest (`cargo test`): `test … FAILED` lines, the failures sections and the panic reports
//! (both the current and the pre-1.73 panic format).

use super::*;

impl Parser {
    pub(super) fn libtest(&mut self, line: &str) -> bool {
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

    pub(super) fn add_panic(&mut self, panic: Panic) -> Option<usize> {
        if self.panics.len() >= MAX_FAILURES {
            return None;
        }
        self.panics.push(panic);
        Some(self.panics.len() - 1)
    }

    /// `thread 'name' [(id)] panicked at src/lib.rs:10:5:` (the message follows on the next
    /// lines), or before Rust 1.73 `… panicked at 'message', src/lib.rs:10:5`.
    pub(super) fn panic_start(&mut self, rest: &str) -> bool {
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
    pub(super) fn panic_line(&mut self, line: &str) -> bool {
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
}

/// `message', path:line:col` (the old panic format's end).
pub(in crate::failures) fn split_old_panic(s: &str) -> Option<(&str, Loc<'_>)> {
    let pos = s.rfind("', ")?;
    let loc = exact_loc(&s[pos + 3..])?;
    Some((&s[..pos], loc))
}

#[cfg(test)]
#[path = "libtest_tests.rs"]
mod tests;
