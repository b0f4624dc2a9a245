//! The live summary line a terminal shows under `tail`: tasks done, running and pending,
//! spending against the run's budget, elapsed time and what is streaming now, redrawn in
//! place and cut to the terminal's width; and the line on what reached main that ends a
//! run followed from its start.
//!
//! The counts and the spending come from the run's events folded into a `RunGraph`, the
//! same fold that `status` replays (`RunGraph::apply`), counted the same way
//! (`api::status::Counts`): the live line cannot disagree with `status`. Only what the
//! graph does not hold (what is streaming now, main's moves and the sweeps) is folded here.

use flotilla_actors::config::Limits;
use flotilla_actors::graph::RunGraph;
use flotilla_actors::protocol::{Budget, Event, EventKind, FixOf};

use super::{clock, duration, short_commit, shorten, spending};
use crate::api::status::Counts;
use crate::text_safety::terminal_safe;

/// What the live summary line shows, as a run's events tell it.
#[derive(Debug)]
pub struct LiveLine {
    /// The run's graph, folded from its journaled events as `status` replays them.
    graph: RunGraph,
    /// An event did not apply (a damaged journal): the graph stays as it was before it,
    /// as `status` shows a damaged run.
    damaged: bool,
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

impl Default for LiveLine {
    fn default() -> Self {
        LiveLine {
            // The fold reads no limits: they bind the commands that emit events.
            graph: RunGraph::new(Limits::default()),
            damaged: false,
            budget: None,
            started_ms: None,
            last_ms: 0,
            finished_ms: None,
            streaming: None,
            landing: LandingTally::default(),
        }
    }
}

impl LiveLine {
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
        // Journaled events only (notices, seq 0, are not in the journal status replays).
        if e.seq > 0 && !self.damaged && self.graph.apply(&e.kind).is_err() {
            self.damaged = true;
        }
        match &e.kind {
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
            // The call streaming is over: its answer came.
            EventKind::PlannerResponded { .. } | EventKind::SubplannerResponded { .. } => {
                self.streaming = None;
            }
            // The clock stops with the run.
            EventKind::RunFinished { .. } => self.finished_ms = Some(e.at_ms),
            _ => {}
        }
        let landing = &mut self.landing;
        match &e.kind {
            EventKind::TaskLanded { .. } => landing.landed = landing.landed.saturating_add(1),
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
        let c = Counts::of(self.graph.tasks().map(|t| t.state));
        let done = c.completed;
        let running = c.running + c.waiting;
        let pending = c.pending;
        let landing = c.landing;
        let failed = c.failed + c.cancelled;
        // What the budgets count, as `status` says it: every charge and the planner's calls.
        let spent = self.graph.run_spent();
        let end = self.finished_ms.unwrap_or(now_ms.max(self.last_ms));
        let elapsed = end.saturating_sub(self.started_ms.unwrap_or(end));
        let spent = match &self.budget {
            Some(b) => format!(
                "{}/{} tokens · {}/{} · {}/{} agent time",
                spent.tokens,
                b.tokens,
                spent.cost_usd,
                b.cost_usd,
                duration(spent.wall_time_ms),
                duration(b.wall_time_ms)
            ),
            None => spending(&spent),
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

    /// The live line as a terminal `columns` wide shows it: [`LiveLine::summary`], cut to
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
