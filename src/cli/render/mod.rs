//! How the CLI prints: one readable line per event, a run's status and a task's story, the
//! run lists, and on a terminal a live summary line (tasks done / running / pending,
//! spending, elapsed). Colour only on a terminal and never with `NO_COLOR` ([`style`]).
//!
//! Everything shown here that flotilla did not write itself (a request, a model's
//! descriptions and summaries, file names, failure texts, the daemon's error messages) goes
//! through `text_safety::terminal_safe` first (or `text_safety::json_safe` for `--json`),
//! so that no text can move the cursor, retitle or clear the terminal, write to the
//! clipboard or reorder a line.
//!
//! Knows the wire types (`api`) and the actors' protocol; never the daemon.

pub mod events;
pub mod lists;
pub mod live;
pub mod report;
pub mod status;
pub mod style;

use flotilla_actors::protocol::{Budget, TaskId};

/// `HH:MM:SS` (UTC) of a Unix-millisecond timestamp.
pub fn clock(at_ms: u64) -> String {
    let secs = at_ms / 1000 % 86_400;
    format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

pub(crate) fn shorten(text: &str, max: usize) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        format!("{}…", one_line.chars().take(max - 1).collect::<String>())
    }
}

pub(crate) fn list(tasks: &[TaskId]) -> String {
    tasks
        .iter()
        .map(TaskId::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Tokens, cost and agent wall time, as the budgets count them.
pub fn spending(b: &Budget) -> String {
    format!(
        "{} tokens · {} · {} agent time",
        b.tokens,
        b.cost_usd,
        duration(b.wall_time_ms)
    )
}

/// A duration for people: `0.1s`, `42s`, `7m27s`, `2h05m`.
pub fn duration(ms: u64) -> String {
    let secs = ms / 1000;
    if secs < 10 {
        format!("{}.{}s", secs, ms % 1000 / 100)
    } else if secs < 60 {
        format!("{secs}s")
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{}h{:02}m", secs / 3600, secs / 60 % 60)
    }
}

/// A commit's first 7 characters.
pub(crate) fn short_commit(commit: &str) -> String {
    commit.chars().take(7).collect()
}

#[cfg(test)]
pub(crate) mod test_support {
    use flotilla_actors::protocol::{Event, EventKind, RunId};

    use crate::text_safety::is_unsafe_for_terminal;

    /// Retitles the terminal (OSC 0), clears it (CSI 2J), writes the clipboard (OSC 52),
    /// returns the carriage, an 8-bit CSI, reverses the line (RLO), DEL, an isolate.
    pub const HOSTILE: &str =
        "ok\x1b]0;pwned\x07\x1b[2J\x1b]52;c;ZXZpbA==\x07\r\u{9b}31m\u{202e}evil\x7f\u{2066}\x08";

    /// Nothing in `text` can act on a terminal (line breaks allowed when `multi_line`), and
    /// the hostile text's escape shows visibly.
    pub fn assert_safe(text: &str, multi_line: bool) {
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

    pub fn event(seq: u64, at_ms: u64, kind: EventKind) -> Event {
        Event {
            seq,
            run: RunId::generate(),
            at_ms,
            kind,
        }
    }
}
