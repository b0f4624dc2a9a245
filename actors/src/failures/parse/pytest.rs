//! pytest: `FAILED`/`ERROR` summary lines, failure sections with their locations, and
//! collection errors (an import that fails is a compile error with its import chain).

use super::*;

impl Parser {
    pub(super) fn pytest(&mut self, line: &str) -> bool {
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
    pub(super) fn py_summary(&mut self, rest: &str, error: bool) -> bool {
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

    pub(super) fn push_py(
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

pub(in crate::failures) fn quoted_after<'a>(message: &'a str, marker: &str) -> Option<&'a str> {
    let (_, after) = message.split_once(marker)?;
    after.split('\'').next()
}

pub(in crate::failures) fn py_symbol(message: &str) -> Option<String> {
    quoted_after(message, "cannot import name '")
        .or_else(|| quoted_after(message, "name '").filter(|_| message.contains("is not defined")))
        .or_else(|| quoted_after(message, "has no attribute '"))
        .or_else(|| quoted_after(message, "No module named '"))
        .and_then(clean_symbol)
}

/// `cannot import name 'X' from 'm' (shapes.py)`: the module's file, when Python printed
/// one inside the repository.
pub(in crate::failures) fn py_module_file(message: &str) -> Option<String> {
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

#[cfg(test)]
#[path = "pytest_tests.rs"]
mod tests;
