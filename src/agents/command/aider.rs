//! aider's usage report, read from its plain text: after each model reply aider prints
//! `Tokens: 2.3k sent, 1.1k cache write, 215 received. Cost: $0.0016 message, $0.0032
//! session.` (aider 0.86, `base_coder.py`), the message's own counts, reset after each
//! report. Sent already holds the cache writes; cache hits are left out, as for Claude.
//! With both cache writes and hits, the `Cost: …` part comes on a line of its own.
//!
//! The line is untrusted text (the model's words are printed on the same stream): a line
//! that does not read exactly so charges nothing, numbers are read with checked
//! arithmetic, and a cost must be an amount `Usd` takes. Printing a false line can only
//! charge the task more, never less than aider's own lines.

use flotilla_actors::protocol::Usd;

/// One usage report: the message's tokens, and the session's cost so far when given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Usage {
    pub(super) sent: u64,
    pub(super) received: u64,
    pub(super) session_cost: Option<Usd>,
}

/// The usage a line reports, if it is aider's usage line (or its cost line).
pub(super) fn usage_line(line: &str) -> Option<Usage> {
    let line = line.trim();
    if let Some(cost) = line.strip_prefix("Cost: ") {
        return Some(Usage {
            session_cost: Some(session_cost(cost)?),
            ..Usage::default()
        });
    }
    let rest = line.strip_prefix("Tokens: ")?;
    let (counts, cost) = match rest.split_once(". Cost: ") {
        Some((counts, cost)) => (counts, Some(cost)),
        None => (rest.strip_suffix('.')?, None),
    };
    let mut usage = Usage::default();
    let mut received = false;
    for part in counts.split(", ") {
        let (number, what) = part.split_once(' ')?;
        let n = token_count(number)?;
        match what {
            "sent" => usage.sent = n,
            "received" => {
                usage.received = n;
                received = true;
            }
            "cache write" | "cache hit" => {}
            _ => return None,
        }
    }
    if !received {
        return None;
    }
    usage.session_cost = match cost {
        Some(cost) => Some(session_cost(cost)?),
        None => None,
    };
    Some(usage)
}

/// aider's `format_tokens`: `215`, `2.3k` (one decimal under 10k), `12k`.
fn token_count(text: &str) -> Option<u64> {
    let (digits, scale) = match text.strip_suffix('k') {
        Some(digits) => (digits, 1000u64),
        None => (text, 1),
    };
    let (whole, tenths) = match digits.split_once('.') {
        Some((whole, tenth)) if scale == 1000 && tenth.len() == 1 => (whole, tenth),
        Some(_) => return None,
        None => (digits, "0"),
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    let tenths: u64 = tenths
        .parse()
        .ok()
        .filter(|_| tenths.bytes().all(|b| b.is_ascii_digit()))?;
    whole
        .checked_mul(scale)?
        .checked_add(tenths.checked_mul(scale / 10)?)
}

/// `$0.0016 message, $0.0032 session.` → the session's cost.
fn session_cost(text: &str) -> Option<Usd> {
    let session = text
        .strip_suffix(" session.")?
        .rsplit_once(", ")?
        .1
        .strip_prefix('$')?;
    if session.is_empty() || !session.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    Usd::from_dollars(session.parse().ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(usage: Usage) -> (u64, u64) {
        (usage.sent, usage.received)
    }

    #[test]
    fn aider_s_usage_lines_read_as_the_message_s_tokens_and_the_session_s_cost() {
        let usage = usage_line(
            "Tokens: 2.3k sent, 1.1k cache write, 4.5k cache hit, 215 received. Cost: $0.0016 message, $0.0032 session.",
        )
        .unwrap();
        assert_eq!(tokens(usage), (2_300, 215));
        assert_eq!(usage.session_cost, Some(Usd::from_dollars(0.0032).unwrap()));
        let apart = usage_line("Cost: $0.12 message, $1.50 session.").unwrap();
        assert_eq!(tokens(apart), (0, 0));
        assert_eq!(apart.session_cost, Some(Usd::from_dollars(1.5).unwrap()));
        let local = usage_line("Tokens: 12k sent, 1.0k received.").unwrap();
        assert_eq!(tokens(local), (12_000, 1_000));
        assert_eq!(local.session_cost, None);
    }

    #[test]
    fn anything_else_charges_nothing_and_big_numbers_do_not_overflow() {
        for line in [
            "Tokens: 2k sent",
            "Tokens: 2k sent, 5 received",
            "Tokens: 2k sent, 5 received, 3 stolen.",
            "Tokens: -2 sent, 5 received.",
            "Tokens: 2.35k sent, 5 received.",
            "Tokens: 2.3 sent, 5 received.",
            "Tokens: k sent, 5 received.",
            "Tokens: 99999999999999999999k sent, 5 received.",
            "Tokens: 18446744073709552k sent, 5 received.",
            "Tokens: 1 sent, 5 received. Cost: $NaN message, $inf session.",
            "Tokens: 1 sent, 5 received. Cost: $1 message, $1e99 session.",
            "Tokens: 1 sent, 5 received. Cost: $1 message, $9999999999.0 session.",
            "tokens: 1 sent, 5 received.",
            "Cost: $1 message.",
            "Cost: $1 message, $-1 session.",
            "Applied edit to src/a.rs",
        ] {
            assert_eq!(usage_line(line), None, "{line}");
        }
        let max = usage_line("Tokens: 18446744073709551 sent, 18446744073709551615 received.");
        assert_eq!(max.map(tokens), Some((18_446_744_073_709_551, u64::MAX)));
    }
}
