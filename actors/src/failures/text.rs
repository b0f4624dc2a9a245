//! Text cleaning: terminal escapes stripped, control and invisible characters escaped, the
//! sweep's root removed, bounded by characters or bytes.

use super::*;

// --- line and location helpers -----------------------------------------------------------

/// A line as a terminal would show it: what follows the last carriage return, without
/// escape sequences (colors, cursor moves, titles).
pub(super) fn clean_line(raw: &str) -> String {
    let raw = raw.strip_suffix('\r').unwrap_or(raw);
    let raw = raw.rsplit('\r').next().unwrap_or(raw);
    strip_ansi(raw)
}

pub(super) fn strip_ansi(s: &str) -> String {
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

// --- text ----------------------------------------------------------------------------

/// Zero-width and bidirectional-override characters: invisible in a prompt, able to make
/// text read differently from what it is.
pub(super) fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}' | '\u{feff}'
    )
}

/// Control and invisible characters as `\u{1b}`; tabs (and newlines unless kept) as spaces.
pub(super) fn escape_controls(s: &str, keep_newlines: bool) -> String {
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

pub(super) fn truncate_chars(s: &str, max: usize) -> String {
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

pub(super) fn truncate_bytes(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
}

/// Untrusted text made safe to show: the root removed, controls escaped, bounded.
pub(super) fn clean_text(
    raw: &str,
    root: Option<&str>,
    keep_newlines: bool,
    max_chars: usize,
) -> String {
    let text = match root {
        Some(root) => raw.replace(&format!("{root}/"), ""),
        None => raw.to_string(),
    };
    truncate_chars(
        escape_controls(text.trim(), keep_newlines).trim(),
        max_chars,
    )
}

pub(super) fn clean_field(s: &str) -> Option<String> {
    let s = truncate_chars(&escape_controls(s.trim(), false), MAX_FIELD_CHARS);
    (!s.is_empty()).then_some(s)
}

pub(super) fn multiline(lines: &[String], root: Option<&str>) -> String {
    let joined = lines
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    clean_text(&joined, root, true, MAX_MESSAGE_CHARS)
}
