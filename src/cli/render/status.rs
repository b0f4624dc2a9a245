//! `flotilla status RUN` (the run, its counts and spending, its task tree) and
//! `flotilla status RUN TASK` (a task's whole story).

use std::fmt::Write as _;

use flotilla_actors::protocol::{EventKind, ReviewVerdict};

use super::events::{SpendFold, event_line, folded_line};
use super::style::Style;
use super::{clock, short_commit, shorten, spending};
use crate::api::status::{RunStatus, TaskStory, task_state_words};
use crate::text_safety::terminal_safe;

/// Said once by `submit` and `status` for a run with no `[merge] gate` and no
/// `[reconciler]` commands (ADR-032).
pub const UNTESTED_MAIN: &str = "none: main moves untested (no [merge] gate, no [reconciler] \
     build, typecheck or test; only conflict markers are checked). Set one in flotilla.toml, \
     e.g. [merge] gate = [\"cargo test\"] (docs/configuration.md, \"Landing on main\")";

/// `flotilla status RUN`: the run, its counts and spending, and its task tree; a failed
/// task says why it failed.
pub fn status_text(status: &RunStatus, style: &Style) -> String {
    let safe = |text: &str| terminal_safe(text).into_owned();
    let state = safe(&status.state);
    let state = match status.state.as_str() {
        "completed" => style.good(&state),
        "running" => state,
        _ => style.bad(&state),
    };
    let mut out = String::new();
    let _ = writeln!(out, "run {}  {state}", style.bold(&safe(&status.id)));
    if let Some(why) = &status.graph.finish_reason {
        let _ = writeln!(out, "why:     {}", safe(&shorten(why, 200)));
    }
    if let Some(problem) = &status.problem {
        let _ = writeln!(out, "{}", style.bad(&format!("problem: {}", safe(problem))));
    }
    if let Some(d) = &status.main_diverged {
        let line = format!(
            "landing paused: main is at {} and no longer holds {}, what this run landed \
             (put it back, `flotilla decide RUN --adopt-main`, or `flotilla decide RUN --cancel`)",
            short_commit(&d.actual),
            short_commit(&d.expected)
        );
        let _ = writeln!(out, "{}", style.bad(&safe(&line)));
    }
    for p in &status.provider_pauses {
        let line = format!(
            "provider paused: {} until {} ({}; heard by the {}{})",
            shorten(&p.provider, 60),
            clock(p.until_ms),
            shorten(&p.why, 120),
            p.role,
            p.task
                .as_ref()
                .map(|t| format!(" for {t}"))
                .unwrap_or_default(),
        );
        let _ = writeln!(out, "{}", style.bad(&safe(&line)));
    }
    let _ = writeln!(out, "request: {}", safe(&shorten(&status.request, 100)));
    let _ = writeln!(out, "repo:    {}", safe(&status.repo));
    if let Some(branch) = &status.branch {
        let _ = writeln!(out, "branch:  {}", safe(&shorten(branch, 200)));
    }
    if let Some(sandbox) = &status.sandbox {
        let _ = writeln!(out, "sandbox: {}", safe(&shorten(sandbox, 200)));
    }
    if let Some(warm) = &status.warm {
        let _ = writeln!(out, "warm:    {}", safe(&shorten(warm, 200)));
    }
    if let Some(pool) = &status.pool {
        let _ = writeln!(out, "pool:    {}", safe(&shorten(pool, 200)));
    }
    if status.main_untested {
        let _ = writeln!(out, "gate:    {}", style.bad(UNTESTED_MAIN));
    }
    let c = &status.counts;
    let _ = writeln!(
        out,
        "tasks:   {} total · {} completed · {} running · {} waiting · {} pending · {} failed · {} cancelled",
        c.total, c.completed, c.running, c.waiting, c.pending, c.failed, c.cancelled
    );
    let _ = writeln!(out, "spent:   {}", spending(&status.graph.run_spent));
    let _ = writeln!(out, "budget:  {}", spending(&status.graph.run_budget));
    for t in &status.graph.tasks {
        let indent = "  ".repeat((t.id.depth() as usize).saturating_sub(1));
        let summary = t
            .summary
            .as_deref()
            .map(|s| format!(" — {}", shorten(s, 60)))
            .unwrap_or_default();
        let failure = t
            .failure
            .as_ref()
            .map(|f| format!(" — failed: {}", shorten(&f.to_string(), 100)))
            .unwrap_or_default();
        // The reviewer's last verdict (ADR-038).
        let review = t
            .review
            .map(|r| format!(" — review: {} (attempt {})", r.mark.words(), r.attempt))
            .unwrap_or_default();
        let state = if status.awaiting_decision.contains(&t.id) {
            "awaiting your decision"
        } else {
            task_state_words(t.state)
        };
        let line = format!(
            "{} [{state}] {}{summary}{review}{failure}",
            t.id,
            shorten(&t.description, 60)
        );
        let _ = writeln!(out, "  {indent}{}", safe(&line));
    }
    out
}

/// A task's whole story (`flotilla status RUN TASK`): each event about it as the tail
/// prints it, and under it in full what the tail line shortens: why an attempt failed,
/// what its handoff said and what flotilla found in its branch.
pub fn task_story_text(story: &TaskStory, style: &Style) -> String {
    let safe = |text: &str| terminal_safe(text).into_owned();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} in run {}: {} event(s){}",
        style.bold(&story.task.to_string()),
        safe(&story.run),
        story.events.len(),
        if story.omitted > 0 {
            format!(" (the {} oldest left out)", story.omitted)
        } else {
            String::new()
        }
    );
    let detail = |out: &mut String, label: &str, text: &str| {
        let _ = writeln!(out, "        {label}: {}", safe(text));
    };
    let mut spend = SpendFold::default();
    for e in &story.events {
        if spend.absorb(&e.kind) {
            continue;
        }
        let _ = writeln!(out, "{}", event_line(e, style));
        match &e.kind {
            EventKind::TaskRetried { failure, .. } => detail(&mut out, "why", &failure.to_string()),
            EventKind::TaskFailed { reason, .. } => detail(&mut out, "why", &reason.to_string()),
            EventKind::TaskCompleted {
                handoff: Some(h), ..
            } => {
                detail(&mut out, "summary", &h.summary);
                for c in &h.concerns {
                    detail(&mut out, "concern", c);
                }
                for f in &h.findings {
                    detail(&mut out, "finding", &f.to_string());
                }
                if let Some(work) = &h.work {
                    detail(
                        &mut out,
                        "branch",
                        &format!(
                            "{} ({} file(s), +{} -{})",
                            work.branch,
                            work.files.len(),
                            work.lines_added,
                            work.lines_removed
                        ),
                    );
                }
            }
            EventKind::TaskCancelled { reason, .. } => detail(&mut out, "why", reason),
            EventKind::ReviewVerdict { review, .. } => match review {
                ReviewVerdict::Failed { reason } => detail(&mut out, "why", reason),
                _ => {
                    for c in review.comments() {
                        detail(&mut out, "comment", c);
                    }
                }
            },
            _ => {}
        }
        for line in spend.ended(&e.kind) {
            let _ = writeln!(out, "{}", folded_line(&line, e.at_ms, style));
        }
    }
    let end = story.events.last().map_or(0, |e| e.at_ms);
    for line in spend.rest() {
        let _ = writeln!(out, "{}", folded_line(&line, end, style));
    }
    out
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
