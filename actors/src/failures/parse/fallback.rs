//! What no format parser claimed: a generic `path:line[:col]: message` line, classed by the
//! command's kind, and the catch-all failure (the output's tail) when nothing parsed at all.

use super::*;

impl Parser {
    /// `path:line:col: message` or `path:line: message` at the start of a line no other
    /// parser claimed; the class comes from the command's kind.
    pub(super) fn fallback(&mut self, line: &str, kind: CommandKind) {
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
}

/// The catch-all's message for a command that printed nothing.
pub(in crate::failures) const NOTHING_PRINTED: &str =
    "the command failed without printing anything";

/// When nothing parsed: the output's last non-empty lines, at most [`MAX_TAIL_BYTES`].
pub(in crate::failures) fn catch_all(kind: CommandKind, text: &str, root: Option<&str>) -> Failure {
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

#[cfg(test)]
#[path = "fallback_tests.rs"]
mod tests;
