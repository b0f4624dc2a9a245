//! `flotilla report RUN` as text: a few lines a person reads at the end of a run. Every text
//! a model or agent wrote (the request, task descriptions, failure reasons) is escaped.

use std::fmt::Write as _;

use crate::api::report::RunReport;
use crate::text_safety::terminal_safe;

use super::{duration, shorten};

/// `n thing` or `n things`.
fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `part / whole` as a percentage with no decimals; `None` without a whole.
fn percent(part: u64, whole: u64) -> Option<u128> {
    (whole > 0).then(|| u128::from(part) * 100 / u128::from(whole))
}

/// How many times the lower bound the makespan is, to a tenth (`2.5×`).
fn times_bound(makespan_ms: u64, bound_ms: u64) -> Option<String> {
    (bound_ms > 0).then(|| {
        let tenths = u128::from(makespan_ms) * 10 / u128::from(bound_ms);
        format!("{}.{}×", tenths / 10, tenths % 10)
    })
}

pub fn report_text(r: &RunReport) -> String {
    let mut out = String::new();
    let t = &r.tasks;
    let m = &r.merges;
    let _ = writeln!(
        out,
        "Run {} {}: {}",
        r.id,
        r.state,
        terminal_safe(&shorten(&r.request, 100))
    );
    if let Some(reason) = &r.reason {
        let _ = writeln!(out, "  why: {}", terminal_safe(&shorten(reason, 200)));
    }
    let _ = writeln!(
        out,
        "Tasks: {} ({}) · {} completed, {} first try · {} ({}) · {} · {} · {} failed · {} cancelled{}",
        t.total,
        count(t.fix_tasks, "fix task", "fix tasks"),
        t.completed,
        t.completed_first_try,
        count(t.retried, "retried", "retried"),
        count(t.retries, "retry", "retries"),
        count(t.decomposed, "decomposed", "decomposed"),
        count(t.empty_diffs, "empty diff", "empty diffs"),
        t.failed,
        t.cancelled,
        if t.unfinished > 0 {
            format!(" · {} unfinished", t.unfinished)
        } else {
            String::new()
        }
    );
    let landed = m.landed.saturating_add(m.landed_via_fix);
    let rate = percent(landed.min(m.queued), m.queued)
        .map(|p| format!(" ({p}% of queued branches landed)"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "Merges: {} queued, {} landed, {} through a conflict fix{rate}",
        m.queued, m.landed, m.landed_via_fix
    );
    let _ = writeln!(
        out,
        "  {} ({} retried in the queue) · {} ({} completed) · {} · {} ({} red, {})",
        count(m.conflicts, "conflict", "conflicts"),
        m.conflicts_retried,
        count(m.conflict_fixes, "conflict fix", "conflict fixes"),
        m.conflict_fixes_completed,
        count(m.gate_failures, "gate failure", "gate failures"),
        count(m.sweeps, "sweep", "sweeps"),
        m.red_sweeps,
        count(m.sweep_fixes, "sweep fix", "sweep fixes"),
    );
    let _ = writeln!(
        out,
        "Spent: {} tokens · {} (root planner: {} tokens · {})",
        r.spent.tokens, r.spent.cost_usd, r.planner_spent.tokens, r.planner_spent.cost_usd
    );
    let tt = &r.task_time;
    match (tt.p50_ms, tt.p90_ms, tt.max_ms) {
        (Some(p50), Some(p90), Some(max)) => {
            let _ = writeln!(
                out,
                "Time per task ({}): p50 {} · p90 {} · max {} over {}",
                tt.measure,
                duration(p50),
                duration(p90),
                duration(max),
                count(tt.count, "task", "tasks")
            );
        }
        _ => {
            let _ = writeln!(out, "Time per task ({}): no task yet", tt.measure);
        }
    }
    let ms = &r.makespan;
    let _ = writeln!(
        out,
        "Makespan: {} against a lower bound of {}{} ({}: {} of work on {})",
        duration(ms.makespan_ms),
        duration(ms.lower_bound_ms),
        times_bound(ms.makespan_ms, ms.lower_bound_ms)
            .map(|x| format!(", {x}"))
            .unwrap_or_default(),
        ms.lower_bound,
        duration(ms.work_ms),
        count(ms.worker_slots, "worker slot", "worker slots"),
    );
    if !r.subtrees.is_empty() {
        let _ = writeln!(out, "Per top-level task:");
        for s in &r.subtrees {
            let span = s
                .span_ms
                .map(|ms| format!(" · {}", duration(ms)))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  {} {}: {}, {} completed, {} failed · {} tokens · {}{span}",
                s.root,
                terminal_safe(&shorten(&s.description, 60)),
                count(s.tasks, "task", "tasks"),
                s.completed,
                s.failed,
                s.spent.tokens,
                s.spent.cost_usd,
            );
        }
    }
    let left = &r.left_for_user;
    if left.is_empty() {
        let _ = writeln!(out, "Left for you: nothing.");
        return out;
    }
    let _ = writeln!(out, "Left for you:");
    for note in &left.failed {
        let _ = writeln!(
            out,
            "  {} failed: {} (`flotilla status {} {}` tells its story)",
            note.task,
            terminal_safe(&shorten(&note.why, 200)),
            r.id,
            note.task
        );
    }
    for note in &left.blocked {
        let _ = writeln!(
            out,
            "  {} is blocked: {}",
            note.task,
            terminal_safe(&shorten(&note.why, 200))
        );
    }
    for task in &left.awaiting_decision {
        let _ = writeln!(
            out,
            "  {task} waits for your decision: `flotilla decide {} {task} …`",
            r.id
        );
    }
    if left.main_diverged {
        let _ = writeln!(
            out,
            "  main was moved under flotilla; landing waits: `flotilla decide {} --adopt-main`",
            r.id
        );
    }
    out
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
