//! go test: `--- FAIL:` blocks with their logs, build errors and `-json` records (decoded by
//! the cargo parser, which hands their output lines back).

use super::*;

impl Parser {
    pub(super) fn go(&mut self, line: &str) -> bool {
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
    pub(super) fn go_block_line(&mut self, line: &str) -> bool {
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
}

pub(in crate::failures) fn go_symbol(message: &str) -> Option<String> {
    if let Some(name) = message
        .strip_prefix("undefined: ")
        .or_else(|| message.strip_prefix("undeclared name: "))
    {
        return clean_symbol(name);
    }
    let (_, after) = message.split_once("has no field or method ")?;
    clean_symbol(after.split([')', ',', ' ']).next()?)
}

#[cfg(test)]
#[path = "go_tests.rs"]
mod tests;
