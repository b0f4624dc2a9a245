//! Locations in untrusted tool output: `path:line[:col]` shapes and repo-relative path
//! normalization (nothing absolute, nothing leaving the repository).

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sep {
    /// `path:3:5: message`
    Colon,
    /// `path:3:5 - message` (tsc's pretty output)
    Space,
    /// `path:3:5`
    End,
}

#[derive(Debug)]
pub(super) struct Loc<'a> {
    pub(super) path: &'a str,
    pub(super) line: u32,
    pub(super) column: Option<u32>,
    pub(super) sep: Sep,
    pub(super) rest: &'a str,
}

/// `path:line[:column]` then `:`, a space or the end. The path has no whitespace.
pub(super) fn parse_loc(s: &str) -> Option<Loc<'_>> {
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
pub(super) fn exact_loc(s: &str) -> Option<Loc<'_>> {
    parse_loc(s.trim()).filter(|l| l.sep == Sep::End)
}

pub(super) fn leading_number(s: &str) -> Option<(u32, &str)> {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if end == 0 || end > 9 {
        return None;
    }
    Some((s[..end].parse().ok()?, &s[end..]))
}

pub(super) fn file_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

pub(super) fn is_manifest(path: &str) -> bool {
    matches!(
        file_name(path),
        "Cargo.toml" | "Cargo.lock" | "package.json" | "tsconfig.json" | "go.mod" | "go.sum"
    )
}

/// Plausibly a file path a tool printed: no whitespace or shell punctuation, a letter, and a
/// slash or an extension (so `localhost:8080: refused` or `Error: 12:30` are not paths).
pub(super) fn looks_like_file_path(path: &str) -> bool {
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
pub(super) fn normalize_root(root: &str) -> Option<String> {
    let root = root.trim().replace('\\', "/");
    let root = root.trim_end_matches('/');
    let absolute = root.starts_with('/') || looks_like_drive(root);
    (absolute && root.len() > 1 && !root.chars().any(char::is_control)).then(|| root.to_string())
}

pub(super) fn looks_like_drive(path: &str) -> bool {
    let b = path.as_bytes();
    b.len() >= 2 && b[1] == b':' && b[0].is_ascii_alphabetic()
}

/// Repo-relative, `/`-separated, without `.` components; `None` for what is absolute (after
/// stripping `root`), leaves the repository (`..`), or is not a plausible path.
pub(super) fn normalize_path(raw: &str, root: Option<&str>) -> Option<String> {
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

#[cfg(test)]
#[path = "paths_tests.rs"]
mod tests;
