//! cargo and rustc: JSON records (cargo `--message-format=json`, rustc `--error-format=json`),
//! the human and short formats, and linker errors.

use super::*;

impl Parser {
    /// A JSON record: cargo's `--message-format=json`, rustc's `--error-format=json`, or a
    /// go test -json output record. False when the line is not a JSON object.
    pub(super) fn json(&mut self, line: &str, kind: CommandKind) -> bool {
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
    pub(super) fn rust_header(&mut self, line: &str) -> bool {
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
    pub(super) fn rust_short(&mut self, line: &str) -> bool {
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

    pub(super) fn push_rust(
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
    pub(super) fn linker(&mut self, line: &str) -> bool {
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
}

/// rustc's ` --> src/b.rs:3:8` under an error header.
pub(in crate::failures) fn arrow(line: &str) -> Option<Loc<'_>> {
    exact_loc(line.trim_start().strip_prefix("--> ")?)
}

/// A line inside a rustc diagnostic (its span, source excerpt, notes and help).
pub(in crate::failures) fn is_rust_block_line(line: &str) -> bool {
    line.starts_with(char::is_whitespace)
        || line.starts_with(|c: char| c.is_ascii_digit())
        || line.starts_with('|')
        || line.starts_with('=')
        || line.starts_with("note:")
        || line.starts_with("help:")
        || line.starts_with("...")
        || line.starts_with("::: ")
}

pub(in crate::failures) fn is_code(code: &str) -> bool {
    !code.is_empty()
        && code.len() <= 40
        && code
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '-')
}

// --- classification and symbols ----------------------------------------------------------

/// Cargo's own summaries, not failures.
pub(in crate::failures) fn is_rust_summary(message: &str) -> bool {
    let m = message.trim_start();
    m.starts_with("aborting due to")
        || m.starts_with("could not compile")
        || m.starts_with("test failed, to rerun")
        || m.starts_with("build failed")
        || (m.starts_with(|c: char| c.is_ascii_digit())
            && (m.contains(" target failed") || m.contains(" targets failed")))
}

/// Cargo and linker failures that stop the build whatever the code says.
pub(in crate::failures) fn is_cargo_build_message(message: &str) -> bool {
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

pub(in crate::failures) fn is_syntax_message(message: &str) -> bool {
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

pub(in crate::failures) fn rust_class(
    code: Option<&str>,
    message: &str,
    file: Option<&str>,
) -> FailureClass {
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

/// The name a rustc message is about, for the messages that are about a name (resolution,
/// missing items, fields, methods). Others (mismatched types, borrows) have none: their
/// backticked words are types or local variables, not what changed.
pub(in crate::failures) fn rust_symbol(message: &str) -> Option<String> {
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
pub(in crate::failures) fn rust_module_file(
    import: &str,
    importing: Option<&str>,
) -> Option<String> {
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

#[cfg(test)]
#[path = "rust_tests.rs"]
mod tests;
