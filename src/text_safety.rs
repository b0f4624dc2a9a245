//! Text made safe to show: on a terminal ([`terminal_safe`], [`terminal_safe_lines`]) and
//! inside JSON that is printed or logged ([`json_safe`], [`json_pretty`], [`json_line`]).
//! Everything flotilla shows that it did not write itself (a request, a model's text, file
//! names, failure texts, an HTTP error body) goes through here, so that no text can move
//! the cursor, retitle or clear the terminal, write to the clipboard or reorder a line.
//!
//! A leaf: the daemon (logs, graph exports, provider errors) and the CLI both use it, and
//! it knows neither.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` may change what a terminal does or how a line reads: C0 controls (escape,
/// carriage return, backspace, newline, …), DEL, C1 controls (an 8-bit CSI or OSC), and the
/// invisible characters that reorder or hide text (bidirectional marks, overrides and
/// isolates, zero-width characters and joiners, line and paragraph separators, the
/// byte-order mark, the soft hyphen, the Hangul fillers, Khmer and Mongolian invisible
/// vowels and separators, the interlinear annotation marks, and the Unicode tag characters
/// that can carry a hidden ASCII message).
pub fn is_unsafe_for_terminal(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{034F}'
                | '\u{061C}'
                | '\u{115F}'
                | '\u{1160}'
                | '\u{17B4}'
                | '\u{17B5}'
                | '\u{180B}'..='\u{180F}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{3164}'
                | '\u{FEFF}'
                | '\u{FFA0}'
                | '\u{FFF9}'..='\u{FFFB}'
                | '\u{1D173}'..='\u{1D17A}'
                | '\u{E0000}'..='\u{E007F}'
        )
}

/// Text someone else wrote, made safe to print on a terminal: every character that could
/// act on the terminal or reorder the line is shown as a visible escape instead (`\x1b`,
/// `\x0d`, `\u{9b}`, `\u{202e}`); everything else is unchanged. The result is one line.
pub fn terminal_safe(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe_for_terminal) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if !is_unsafe_for_terminal(c) {
            out.push(c);
        } else if c.is_ascii() {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
    Cow::Owned(out)
}

/// [`terminal_safe`] for each line of a multi-line text (graph exports): the line breaks
/// stay, nothing else that could act on the terminal does.
pub fn terminal_safe_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, end) = match line.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (line, ""),
        };
        out.push_str(&terminal_safe(body));
        out.push_str(end);
    }
    out
}

/// JSON text made safe for a terminal and still the same JSON: serde already escapes C0
/// controls inside strings; this also escapes DEL, C1 controls and the invisible formatting
/// characters as `\uXXXX`. Those characters only occur inside JSON strings, where a
/// `\uXXXX` escape means the same character.
pub fn json_safe(json: &str) -> Cow<'_, str> {
    // Raw C0 characters in serde's output are its own line breaks and indentation: inside
    // strings serde has escaped them already.
    let unsafe_in_json = |c: char| c as u32 >= 0x7f && is_unsafe_for_terminal(c);
    if !json.chars().any(unsafe_in_json) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if unsafe_in_json(c) {
            // Beyond the Basic Multilingual Plane (the tag characters), JSON's `\u` escape
            // is a UTF-16 surrogate pair.
            for unit in c.encode_utf16(&mut [0; 2]) {
                let _ = write!(out, "\\u{:04x}", unit);
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A value as pretty JSON, safe for a terminal (see [`json_safe`]).
pub fn json_pretty(value: &impl serde::Serialize) -> String {
    json_safe(&serde_json::to_string_pretty(value).unwrap_or_default()).into_owned()
}

/// A value as one line of JSON, safe for a terminal (see [`json_safe`]).
pub fn json_line(value: &impl serde::Serialize) -> String {
    json_safe(&serde_json::to_string(value).unwrap_or_default()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Retitles the terminal (OSC 0), clears it (CSI 2J), writes the clipboard (OSC 52),
    /// returns the carriage, an 8-bit CSI, reverses the line (RLO), DEL, an isolate.
    const HOSTILE: &str =
        "ok\x1b]0;pwned\x07\x1b[2J\x1b]52;c;ZXZpbA==\x07\r\u{9b}31m\u{202e}evil\x7f\u{2066}\x08";

    /// Nothing in `text` can act on a terminal (line breaks allowed when `multi_line`), and
    /// the hostile text's escape shows visibly.
    fn assert_safe(text: &str, multi_line: bool) {
        let bad: Vec<char> = text
            .chars()
            .filter(|&c| is_unsafe_for_terminal(c) && !(multi_line && c == '\n'))
            .collect();
        assert!(bad.is_empty(), "unescaped {bad:?} in {text:?}");
        assert!(
            text.contains("\\x1b]0;pwned"),
            "no visible escape in {text:?}"
        );
    }

    /// Issue 20: the live line printed an agent's activity raw (OSC retitle, clear screen,
    /// U+202E reached the terminal). The bytes it writes hold no ESC, C1 or bidi control
    /// but flotilla's own colour codes.
    #[test]
    fn terminal_safe_escapes_every_control_visibly_and_nothing_else() {
        assert_eq!(
            terminal_safe("plain text: é, 日本, ✓"),
            "plain text: é, 日本, ✓"
        );
        assert_eq!(
            terminal_safe("a\x1b[31mb\rc\u{9b}d\u{202e}e\x7f\u{200b}\n"),
            "a\\x1b[31mb\\x0dc\\u{9b}d\\u{202e}e\\x7f\\u{200b}\\x0a"
        );
        assert_safe(&terminal_safe(HOSTILE), false);
        assert_eq!(terminal_safe_lines("a\x1b\nb\n"), "a\\x1b\nb\n");
    }

    /// Issue 20: tag characters (a hidden ASCII message), soft hyphens and Hangul fillers
    /// passed the escaping; so would the other invisible characters.
    #[test]
    fn invisible_characters_are_shown_as_escapes() {
        let hidden: String = "ignore previous"
            .chars()
            .map(|c| char::from_u32(0xE0000 + c as u32).unwrap())
            .collect();
        let text = format!("a{hidden}b\u{ad}c\u{115f}\u{1160}\u{3164}\u{ffa0}d\u{e0001}\u{e007f}");
        let safe = terminal_safe(&text);
        assert!(
            safe.starts_with("a\\u{e0069}\\u{e0067}\\u{e006e}"),
            "{safe}"
        );
        assert!(
            safe.ends_with("b\\u{ad}c\\u{115f}\\u{1160}\\u{3164}\\u{ffa0}d\\u{e0001}\\u{e007f}"),
            "{safe}"
        );
        for c in [
            '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}', '\u{2066}', '\u{2067}',
            '\u{2068}', '\u{2069}', '\u{200b}', '\u{200c}', '\u{200d}', '\u{200e}', '\u{200f}',
            '\u{2060}', '\u{2061}', '\u{2062}', '\u{2063}', '\u{2064}', '\u{feff}', '\u{85}',
            '\u{9b}', '\u{9d}', '\x00', '\x07', '\x1b',
        ] {
            assert!(is_unsafe_for_terminal(c), "{c:?}");
            assert!(!terminal_safe(&c.to_string()).contains(c), "{c:?}");
        }
        // JSON escapes beyond the Basic Multilingual Plane are surrogate pairs.
        let value = serde_json::json!({ "text": text });
        let json = json_line(&value);
        assert!(json.contains("\\udb40\\udc69"), "{json}");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&json).unwrap(),
            value
        );
    }

    #[test]
    fn json_stays_json_and_escapes_what_serde_leaves_raw() {
        let value = serde_json::json!({ "text": HOSTILE });
        for json in [json_line(&value), json_pretty(&value)] {
            let back: serde_json::Value = serde_json::from_str(&json).unwrap();
            assert_eq!(back, value, "the same JSON");
            assert!(
                !json.chars().any(|c| is_unsafe_for_terminal(c) && c != '\n'),
                "{json:?}"
            );
        }
    }
}
