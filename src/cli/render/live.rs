//! The live summary line a terminal shows under `tail`: tasks done, running and pending,
//! spending against the run's budget, elapsed time and what is streaming now, redrawn in
//! place and cut to the terminal's width.

use std::collections::HashMap;

use flotilla_actors::protocol::{Budget, Event, EventKind, FixOf, TaskId, TaskState};

use super::{clock, duration, short_commit, shorten, spending};
use crate::text_safety::terminal_safe;

/// Running totals for the live summary line.
#[derive(Debug, Default)]
pub struct Tally {
    states: HashMap<TaskId, TaskState>,
    spent: Budget,
    /// The run's budget, when known (the tail asks for it once).
    budget: Option<Budget>,
    started_ms: Option<u64>,
    last_ms: u64,
    finished_ms: Option<u64>,
    /// An LLM call streaming now: "planner: 340 tokens" (live notices only).
    streaming: Option<String>,
    /// What landing did, for the run's last line.
    landing: LandingTally,
}

/// main's moves, the fix tasks and the sweeps of a run, as its events tell them.
#[derive(Debug, Default)]
struct LandingTally {
    /// main before the first move seen and after the last.
    main: Option<(String, String)>,
    moves: u64,
    landed: u64,
    conflict_fixes: u64,
    sweep_fixes: u64,
    sweeps: u64,
    last_sweep_green: Option<bool>,
}

impl Tally {
    /// Shows spending against `budget` from now on.
    pub fn set_budget(&mut self, budget: Budget) {
        self.budget = Some(budget);
    }

    /// Counts elapsed time from when the run was created, not from the first event seen
    /// (which, with `tail --since`, may be hours later).
    pub fn set_created(&mut self, created_ms: u64) {
        self.started_ms = Some(created_ms);
    }

    pub fn observe(&mut self, e: &Event) {
        self.started_ms.get_or_insert(e.at_ms);
        self.last_ms = e.at_ms;
        let mut set = |task: &TaskId, state| {
            self.states.insert(task.clone(), state);
        };
        match &e.kind {
            EventKind::TaskAdded { task, .. } | EventKind::FixTaskAdded { task, .. } => {
                set(task, TaskState::Pending)
            }
            EventKind::TaskLanding { task, .. } => set(task, TaskState::Landing),
            EventKind::TaskLanded { task, .. } => {
                set(task, TaskState::Completed);
                self.landing.landed = self.landing.landed.saturating_add(1);
            }
            EventKind::TaskDispatched { task, .. } | EventKind::TaskStarted { task, .. } => {
                set(task, TaskState::Running)
            }
            EventKind::TaskRetried { task, .. } | EventKind::TaskInterrupted { task, .. } => {
                set(task, TaskState::Ready)
            }
            EventKind::TaskCompleted { task, .. } => set(task, TaskState::Completed),
            EventKind::TaskFailed { task, .. } => set(task, TaskState::Failed),
            EventKind::TaskCancelled { task, .. } => set(task, TaskState::Cancelled),
            EventKind::DecompositionAccepted { parent, .. } => {
                set(parent, TaskState::WaitingForSubtasks)
            }
            // What the budgets count: each charge to a task (a handoff's spend is charged
            // only beyond what was already reported, so handoffs are not counted again)
            // and the planner's calls.
            EventKind::SpendCharged { spent, .. } => {
                self.spent = self.spent.saturating_add(*spent);
            }
            EventKind::LlmProgress {
                role,
                task,
                tokens_out,
            } => {
                self.streaming = Some(format!(
                    "{role}{}: {tokens_out} tokens streaming",
                    task.as_ref().map(|t| format!(" {t}")).unwrap_or_default()
                ));
            }
            EventKind::AgentActivity { task, activity, .. } => {
                self.streaming = Some(format!("{task}: {}", shorten(activity, 60)));
            }
            EventKind::ProviderPaused {
                provider, wait_ms, ..
            } => {
                self.streaming = Some(format!(
                    "{} rate-limited, waiting {}",
                    shorten(provider, 30),
                    duration(*wait_ms)
                ));
            }
            EventKind::ProviderPauseStarted {
                provider, until_ms, ..
            } => {
                self.streaming = Some(format!(
                    "{} rate-limited until {}",
                    shorten(provider, 30),
                    clock(*until_ms)
                ));
            }
            EventKind::ProviderResumed { .. } => self.streaming = None,
            // The planner's and the Subplanner's calls, as the graph charges them.
            EventKind::PlannerResponded { usage, .. }
            | EventKind::SubplannerResponded { usage, .. } => {
                self.streaming = None;
                self.spent = self.spent.saturating_add(usage.spent());
            }
            // The clock stops with the run.
            EventKind::RunFinished { .. } => self.finished_ms = Some(e.at_ms),
            _ => {}
        }
        let landing = &mut self.landing;
        match &e.kind {
            EventKind::MainMoved { from, to, .. } => {
                landing.moves = landing.moves.saturating_add(1);
                let first = landing.main.take().map_or_else(|| from.clone(), |(f, _)| f);
                landing.main = Some((first, to.clone()));
            }
            EventKind::FixTaskAdded { fix, .. } => match fix {
                FixOf::Conflict { .. } => {
                    landing.conflict_fixes = landing.conflict_fixes.saturating_add(1)
                }
                FixOf::Sweep { .. } => landing.sweep_fixes = landing.sweep_fixes.saturating_add(1),
            },
            EventKind::SweepFinished { report } => {
                landing.sweeps = landing.sweeps.saturating_add(1);
                landing.last_sweep_green = Some(report.green);
            }
            _ => {}
        }
    }

    /// One line on what reached main, for the end of a run followed from its start:
    /// "main 725b9ef → 9728aa2 in 21 moves · 23 tasks landed · fix tasks: 2 for conflicts,
    /// 1 for a red main · 2 sweeps, the last green". `None` when nothing landed or was swept.
    pub fn landing_summary(&self) -> Option<String> {
        let l = &self.landing;
        if l.moves == 0 && l.sweeps == 0 {
            return None;
        }
        let plural =
            |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let mut parts = Vec::new();
        match &l.main {
            Some((from, to)) => parts.push(format!(
                "main {} → {} in {}",
                short_commit(from),
                short_commit(to),
                plural(l.moves, "move", "moves")
            )),
            None => parts.push("main did not move".to_string()),
        }
        parts.push(format!("{} landed", plural(l.landed, "task", "tasks")));
        if l.conflict_fixes + l.sweep_fixes > 0 {
            parts.push(format!(
                "fix tasks: {} for conflicts, {} for a red main",
                l.conflict_fixes, l.sweep_fixes
            ));
        }
        if l.sweeps > 0 {
            let last = match l.last_sweep_green {
                Some(true) => "the last green",
                _ => "the last red",
            };
            parts.push(format!("{}, {last}", plural(l.sweeps, "sweep", "sweeps")));
        }
        Some(parts.join(" · "))
    }

    /// Whether any event was seen.
    pub fn started(&self) -> bool {
        self.started_ms.is_some()
    }

    pub fn summary(&self, now_ms: u64) -> String {
        let count = |f: fn(&TaskState) -> bool| self.states.values().filter(|s| f(s)).count();
        let done = count(|s| *s == TaskState::Completed);
        let running = count(|s| {
            matches!(
                s,
                TaskState::Running | TaskState::WaitingForSubtasks | TaskState::Synthesizing
            )
        });
        let pending = count(|s| matches!(s, TaskState::Pending | TaskState::Ready));
        let landing = count(|s| *s == TaskState::Landing);
        let failed = count(|s| matches!(s, TaskState::Failed | TaskState::Cancelled));
        let end = self.finished_ms.unwrap_or(now_ms.max(self.last_ms));
        let elapsed = end.saturating_sub(self.started_ms.unwrap_or(end));
        let spent = match &self.budget {
            Some(b) => format!(
                "{}/{} tokens · {}/{} · {}/{} agent time",
                self.spent.tokens,
                b.tokens,
                self.spent.cost_usd,
                b.cost_usd,
                duration(self.spent.wall_time_ms),
                duration(b.wall_time_ms)
            ),
            None => spending(&self.spent),
        };
        let streaming = match (&self.streaming, self.finished_ms) {
            (Some(call), None) => format!(" · {call}"),
            _ => String::new(),
        };
        let landing = if landing > 0 {
            format!(" · {landing} landing")
        } else {
            String::new()
        };
        let line = format!(
            "{done} done{landing} · {running} running · {pending} pending · {failed} failed/cancelled · {spent} · {} elapsed{streaming}",
            duration(elapsed)
        );
        // The streaming part quotes an agent's activity: a model's or a tool's text.
        terminal_safe(&line).into_owned()
    }

    /// The live line as a terminal `columns` wide shows it: [`Tally::summary`], cut to
    /// fit in one row (a line that wraps is not redrawn in place, and each redraw would
    /// scroll). `None`: the width is unknown, and the line is not cut.
    pub fn live_line(&self, now_ms: u64, columns: Option<usize>) -> String {
        let line = self.summary(now_ms);
        match columns {
            Some(columns) => fit_columns(&line, columns),
            None => line,
        }
    }
}

/// `line` cut to fewer than `columns` terminal columns, ending in `…` when cut. One column
/// is left free: writing the last column makes some terminals wrap at once.
pub fn fit_columns(line: &str, columns: usize) -> String {
    use unicode_width::UnicodeWidthChar;
    let room = columns.saturating_sub(1);
    if unicode_width::UnicodeWidthStr::width(line) <= room {
        return line.to_string();
    }
    let mut out = String::new();
    let mut used = 0usize;
    for c in line.chars() {
        let w = c.width().unwrap_or(0);
        // Keep one column for the ellipsis.
        if used + w + 1 > room {
            break;
        }
        used += w;
        out.push(c);
    }
    if room > 0 {
        out.push('…');
    }
    out
}

/// The width in columns of the terminal on standard output, when it is one.
pub fn terminal_columns() -> Option<usize> {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` to the pointer given, which lives across the
    // call; on a descriptor that is not a terminal it fails and writes nothing.
    let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
    (ok && size.ws_col > 0).then_some(usize::from(size.ws_col))
}

#[cfg(test)]
#[path = "live_tests.rs"]
mod tests;
