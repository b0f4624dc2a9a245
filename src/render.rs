//! How the CLI prints events and runs: one readable line per event, colour only on a
//! terminal and never with `NO_COLOR`, and on a terminal a live summary line (tasks done /
//! running / pending, tokens, cost, elapsed).

use std::collections::HashMap;
use std::io::IsTerminal;

use flotilla_actors::protocol::{Event, EventKind, Route, RunOutcome, TaskId, TaskState, Usd};

#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub color: bool,
    pub live: bool,
}

impl Style {
    /// Colour and the live line on a terminal; colour off when `NO_COLOR` is set.
    pub fn detect() -> Style {
        let tty = std::io::stdout().is_terminal();
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Style {
            color: tty && !no_color,
            live: tty,
        }
    }

    pub fn plain() -> Style {
        Style {
            color: false,
            live: false,
        }
    }

    fn paint(&self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }

    pub fn good(&self, text: &str) -> String {
        self.paint("32", text)
    }

    pub fn bad(&self, text: &str) -> String {
        self.paint("31", text)
    }

    pub fn dim(&self, text: &str) -> String {
        self.paint("2", text)
    }

    pub fn bold(&self, text: &str) -> String {
        self.paint("1", text)
    }
}

/// `HH:MM:SS` (UTC) of a Unix-millisecond timestamp.
pub fn clock(at_ms: u64) -> String {
    let secs = at_ms / 1000 % 86_400;
    format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

fn shorten(text: &str, max: usize) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        format!("{}…", one_line.chars().take(max - 1).collect::<String>())
    }
}

/// One human line for an event.
pub fn event_line(e: &Event, style: &Style) -> String {
    let what = match &e.kind {
        EventKind::RunStarted { request } => format!("run started: {}", shorten(request, 100)),
        EventKind::PlannerResponded {
            call,
            error: Some(error),
            ..
        } => style.bad(&format!(
            "planner call {} unusable: {}",
            call + 1,
            shorten(error, 120)
        )),
        EventKind::PlannerResponded { call, usage, .. } => {
            format!(
                "planner call {} answered ({} tokens)",
                call + 1,
                usage.tokens_in + usage.tokens_out
            )
        }
        EventKind::PlannerGaveUp { error } => {
            style.bad(&format!("planner gave up: {}", shorten(error, 120)))
        }
        EventKind::TaskAdded {
            task,
            spec,
            depends_on,
            ..
        } => {
            let after = if depends_on.is_empty() {
                String::new()
            } else {
                format!(
                    " after {}",
                    depends_on
                        .iter()
                        .map(TaskId::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            format!(
                "{} added: {} [{}]{after}",
                style.bold(&task.to_string()),
                shorten(&spec.description, 80),
                spec.scope.join(", ")
            )
        }
        EventKind::TasksRejected { reason } => {
            style.bad(&format!("planner batch rejected: {reason}"))
        }
        EventKind::TaskReady { task } => format!("{task} ready"),
        EventKind::TaskDispatched {
            task,
            attempt,
            profile,
            route,
        } => match route {
            Route::Worker => {
                format!("{task} dispatched to a worker ({profile}), attempt {attempt}")
            }
            Route::Subplanner => format!("{task} dispatched to the subplanner, attempt {attempt}"),
        },
        EventKind::TaskStarted { task, attempt } => format!("{task} started (attempt {attempt})"),
        EventKind::TaskRetried {
            task,
            attempt,
            failure,
        } => {
            format!(
                "{task} attempt {attempt} failed ({}); retrying",
                shorten(&failure.to_string(), 80)
            )
        }
        EventKind::TaskInterrupted { task, attempt } => {
            format!("{task} attempt {attempt} interrupted by a restart; queued again")
        }
        EventKind::TaskCompleted { task, handoff, .. } => {
            let summary = handoff
                .as_ref()
                .map(|h| format!(": {}", shorten(&h.summary, 100)))
                .unwrap_or_default();
            style.good(&format!("{task} completed{summary}"))
        }
        EventKind::TaskFailed { task, reason, .. } => style.bad(&format!(
            "{task} failed: {}",
            shorten(&reason.to_string(), 120)
        )),
        EventKind::TaskCancelled { task, reason, .. } => format!("{task} cancelled: {reason}"),
        EventKind::DecompositionAccepted {
            parent,
            subtasks,
            reason,
            ..
        } => format!(
            "{parent} decomposed ({reason:?}) into {}",
            subtasks
                .iter()
                .map(TaskId::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        EventKind::DecompositionRejected { parent, reason, .. } => {
            style.bad(&format!("{parent} subplan rejected: {reason}"))
        }
        EventKind::ProposalsStopped {
            task, rejections, ..
        } => style.bad(&format!(
            "{task} stopped after {rejections} rejected subplans"
        )),
        EventKind::SubtasksCompleted { parent } => format!("{parent} subtasks done; synthesizing"),
        EventKind::AwaitingUserDecision { parent } => format!("{parent} waits for your decision"),
        EventKind::MessageIgnored { task, message, why } => style.dim(&format!(
            "ignored {message}{}: {why}",
            task.as_ref()
                .map(|t| format!(" for {t}"))
                .unwrap_or_default()
        )),
        EventKind::PlanningFinished => "planning finished".to_string(),
        EventKind::RunCancelRequested { reason } => format!("run cancelling: {reason}"),
        EventKind::SpendCharged {
            task,
            attempt,
            spent,
        } => style.dim(&format!("{task} attempt {attempt} spent {spent}")),
        EventKind::RunBudgetExhausted { spent, budget } => style.bad(&format!(
            "run budget exhausted: spent {spent} of {budget}; stopping"
        )),
        EventKind::RunRestarted { restart, reason } => style.bad(&format!(
            "run restarted from the journal (restart {restart}): {}",
            shorten(reason, 120)
        )),
        EventKind::JournalUnavailable { error } => style.bad(&format!(
            "the journal cannot be written; the run is paused and retries: {}",
            shorten(error, 120)
        )),
        EventKind::RunFinished { outcome, reason } => {
            let why = reason
                .as_ref()
                .map(|r| format!(" ({})", shorten(r, 120)))
                .unwrap_or_default();
            let text = format!("run finished: {}{why}", outcome_name(*outcome));
            if *outcome == RunOutcome::Completed {
                style.good(&text)
            } else {
                style.bad(&text)
            }
        }
    };
    format!(
        "{} {} {what}",
        style.dim(&clock(e.at_ms)),
        style.dim(&format!("#{:<5}", e.seq))
    )
}

pub fn outcome_name(outcome: RunOutcome) -> &'static str {
    match outcome {
        RunOutcome::Completed => "completed",
        RunOutcome::Failed => "failed",
        RunOutcome::Cancelled => "cancelled",
    }
}

/// Running totals for the live summary line.
#[derive(Debug, Default)]
pub struct Tally {
    states: HashMap<TaskId, TaskState>,
    tokens: u64,
    cost: u64,
    started_ms: Option<u64>,
    last_ms: u64,
}

impl Tally {
    pub fn observe(&mut self, e: &Event) {
        self.started_ms.get_or_insert(e.at_ms);
        self.last_ms = e.at_ms;
        let mut set = |task: &TaskId, state| {
            self.states.insert(task.clone(), state);
        };
        match &e.kind {
            EventKind::TaskAdded { task, .. } => set(task, TaskState::Pending),
            EventKind::TaskDispatched { task, .. } | EventKind::TaskStarted { task, .. } => {
                set(task, TaskState::Running)
            }
            EventKind::TaskRetried { task, .. } | EventKind::TaskInterrupted { task, .. } => {
                set(task, TaskState::Ready)
            }
            EventKind::TaskCompleted { task, handoff, .. } => {
                set(task, TaskState::Completed);
                if let Some(h) = handoff {
                    self.tokens = self.tokens.saturating_add(h.metrics.spent().tokens);
                    self.cost = self.cost.saturating_add(h.metrics.cost_usd.micros());
                }
            }
            EventKind::TaskFailed { task, .. } => set(task, TaskState::Failed),
            EventKind::TaskCancelled { task, .. } => set(task, TaskState::Cancelled),
            EventKind::DecompositionAccepted { parent, .. } => {
                set(parent, TaskState::WaitingForSubtasks)
            }
            EventKind::PlannerResponded { usage, .. } => {
                let used = usage.tokens_in.saturating_add(usage.tokens_out);
                self.tokens = self.tokens.saturating_add(used);
                self.cost = self.cost.saturating_add(usage.cost_usd.micros());
            }
            _ => {}
        }
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
        let failed = count(|s| matches!(s, TaskState::Failed | TaskState::Cancelled));
        let elapsed = now_ms
            .max(self.last_ms)
            .saturating_sub(self.started_ms.unwrap_or(now_ms))
            / 1000;
        format!(
            "{done} done · {running} running · {pending} pending · {failed} failed/cancelled · {} tokens · {} · {}m{:02}s",
            self.tokens,
            Usd::from_micros(self.cost),
            elapsed / 60,
            elapsed % 60
        )
    }
}
