//! The run lists: `flotilla runs`, `flotilla status` without a run (the daemon and the runs
//! that need attention), and `flotilla providers check`.

use std::fmt::Write as _;

use super::{clock, shorten};
use crate::api::runs::RunSummary;
use crate::text_safety::terminal_safe;

/// `flotilla providers check`: one line per model of each role, what failed escaped (it is
/// the provider's own text).
pub fn provider_checks_text(results: &[crate::providers::CheckResult]) -> String {
    let width = results
        .iter()
        .map(|r| r.model.chars().count())
        .max()
        .unwrap_or(0)
        .min(60);
    let mut out = String::new();
    for r in results {
        let model = terminal_safe(&r.model);
        let verdict = if r.reachable {
            format!("reachable    {:>6} ms", r.latency_ms)
        } else {
            format!(
                "unreachable  {:>6} ms  {}",
                r.latency_ms,
                terminal_safe(&shorten(r.error.as_deref().unwrap_or("no answer"), 200))
            )
        };
        let _ = writeln!(out, "{:<10}  {model:<width$}  {verdict}", r.role.as_str());
    }
    out
}

/// `flotilla runs`: one line per run, its id shortened to the shortest prefix (at least 8
/// characters) that names no other run.
pub fn runs_text(runs: &[RunSummary]) -> String {
    let ids: Vec<&str> = runs.iter().map(|r| r.id.as_str()).collect();
    let prefixes = unique_prefixes(&ids, 8);
    let width = prefixes.iter().map(|p| p.len()).max().unwrap_or(8);
    let mut out = String::new();
    for (r, prefix) in runs.iter().zip(&prefixes) {
        let problem = r
            .problem
            .as_deref()
            .map(|p| format!("  ({})", shorten(p, 60)))
            .unwrap_or_default();
        let line = format!(
            "{prefix:<width$}  {:<9}  {}  {}{problem}",
            r.state,
            clock(r.created_ms),
            shorten(&r.request, 70)
        );
        let _ = writeln!(out, "{}", terminal_safe(&line));
    }
    out
}

/// Whether `flotilla status` without a run lists the run: it runs, is damaged, or has a
/// problem (paused on an unwritable journal, restarting).
pub fn needs_listing(run: &RunSummary) -> bool {
    run.state == "running" || run.state == "damaged" || run.problem.is_some()
}

/// `flotilla status` without a run: the daemon, and its runs that run or need attention
/// (damaged, paused), each with its problem.
pub fn daemon_text(endpoint: &str, runs: &[RunSummary]) -> String {
    let ids: Vec<&str> = runs.iter().map(|r| r.id.as_str()).collect();
    let prefixes = unique_prefixes(&ids, 8);
    let listed: Vec<_> = runs
        .iter()
        .zip(&prefixes)
        .filter(|(r, _)| needs_listing(r))
        .collect();
    let count = |state: &str| runs.iter().filter(|r| r.state == state).count();
    let mut out = String::new();
    let _ = writeln!(out, "daemon: listening on {}", terminal_safe(endpoint));
    let damaged = match count("damaged") {
        0 => String::new(),
        n => format!(", {n} damaged"),
    };
    let _ = writeln!(
        out,
        "runs: {} in total, {} running{damaged}",
        runs.len(),
        count("running")
    );
    let width = listed.iter().map(|(_, p)| p.len()).max().unwrap_or(8);
    for (r, prefix) in listed {
        let problem = r
            .problem
            .as_deref()
            .map(|p| format!("  ({})", shorten(p, 100)))
            .unwrap_or_default();
        let line = format!(
            "{prefix:<width$}  {:<9}  {}{problem}",
            r.state,
            shorten(&r.request, 70)
        );
        let _ = writeln!(out, "  {}", terminal_safe(&line));
    }
    out
}

/// For each id, its shortest prefix of at least `min` characters that is not a prefix of
/// any other id in `ids` (the whole id if it has a duplicate). A prefix never ends on a
/// dash. Sorting puts the ids sharing the longest prefix with an id next to it, so only
/// neighbours need comparing.
pub fn unique_prefixes(ids: &[&str], min: usize) -> Vec<String> {
    let common = |a: &str, b: &str| a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_by_key(|&i| ids[i]);
    let mut out = vec![String::new(); ids.len()];
    for (pos, &i) in order.iter().enumerate() {
        let id = ids[i];
        let before = pos.checked_sub(1).map_or(0, |p| common(id, ids[order[p]]));
        let after = order.get(pos + 1).map_or(0, |&j| common(id, ids[j]));
        let mut len = (before.max(after) + 1).max(min).min(id.len());
        while len < id.len() && (!id.is_char_boundary(len) || id[..len].ends_with('-')) {
            len += 1;
        }
        out[i] = id[..len].to_string();
    }
    out
}

#[cfg(test)]
#[path = "lists_tests.rs"]
mod tests;
