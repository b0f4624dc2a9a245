//! Cutting a CLI's words down to size, for the live activity line and for error messages.

/// What an error message shows of the CLI's last output (stderr and stdout together).
pub(super) const TAIL_CHARS: usize = 2_000;

/// How much of a message or a command the live line shows.
pub(super) const GIST_CHARS: usize = 80;
pub(super) const DETAIL_CHARS: usize = 120;

/// The end of what the CLI wrote, for an error message: at most [`TAIL_CHARS`] of stderr
/// and stdout together, each getting half when both have more.
pub(super) fn last_output(stdout: &str, stderr: &str) -> String {
    const ERR: &str = "[stderr] ";
    const OUT: &str = "\n[stdout] ";
    let (out, err) = (stdout.trim(), stderr.trim());
    match (out.is_empty(), err.is_empty()) {
        (true, true) => "(none)".into(),
        (false, true) => last_chars(out, TAIL_CHARS),
        (true, false) => last_chars(err, TAIL_CHARS),
        (false, false) => {
            let budget = TAIL_CHARS - ERR.len() - OUT.len();
            let (err_n, out_n) = (err.chars().count(), out.chars().count());
            let err_take = err_n.min((budget / 2).max(budget.saturating_sub(out_n)));
            let out_take = out_n.min(budget - err_take);
            format!(
                "{ERR}{}{OUT}{}",
                last_chars(err, err_take),
                last_chars(out, out_take)
            )
        }
    }
}

pub(super) fn last_chars(text: &str, n: usize) -> String {
    let count = text.chars().count();
    text.chars().skip(count.saturating_sub(n)).collect()
}

/// `text` on one line, cut to `max` characters (with an ellipsis when cut).
pub(super) fn one_line(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        flat
    } else {
        let mut cut: String = flat.chars().take(max).collect();
        cut.push('…');
        cut
    }
}

#[cfg(test)]
#[path = "text_tests.rs"]
mod tests;
