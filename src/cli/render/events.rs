//! One human line per event (`tail`, `submit`, a task's story): what happened in words, its
//! journal seq and time, coloured by how it went. Charges are folded per attempt
//! ([`SpendFold`]) so that sixty per-call charges are one line.

use flotilla_actors::protocol::{
    Budget, CheckoutSync, DecompositionReason, Event, EventKind, FixOf, Handoff, ReviewVerdict,
    Route, RunOutcome, TaskId, Usd,
};

use super::style::Style;
use super::{clock, duration, list, short_commit, shorten};
use crate::api::runs::state_name;
use crate::text_safety::terminal_safe;

/// The most scope paths an event line shows, and the longest path it shows whole: a model
/// can name many long paths, and one line must stay a line.
const SCOPE_PATHS_SHOWN: usize = 4;
const SCOPE_PATH_CHARS: usize = 60;

/// A task's scope for an event line: the first paths, each shortened, and how many more.
fn scope_words(scope: &[String]) -> String {
    let mut words: Vec<String> = scope
        .iter()
        .take(SCOPE_PATHS_SHOWN)
        .map(|p| shorten(p, SCOPE_PATH_CHARS))
        .collect();
    if scope.len() > SCOPE_PATHS_SHOWN {
        words.push(format!("+{} more", scope.len() - SCOPE_PATHS_SHOWN));
    }
    words.join(", ")
}

/// A charge in words, naming only what was spent: agents report tokens and cost as they
/// work, and the worker charges the time each call took, so most charges are one of them.
fn charge_words(spent: &Budget) -> String {
    let mut parts = Vec::new();
    if spent.tokens > 0 {
        parts.push(format!("{} tokens", spent.tokens));
    }
    if spent.cost_usd > Usd::ZERO {
        parts.push(spent.cost_usd.to_string());
    }
    if spent.wall_time_ms > 0 || parts.is_empty() {
        parts.push(format!("{} ms", spent.wall_time_ms));
    }
    parts.join(", ")
}

/// How an event line is coloured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tone {
    Plain,
    Good,
    Bad,
    Dim,
}

/// Charges folded per attempt, for the human tail and a task's story. A running attempt is
/// charged once per model call (sixty charges an attempt on a real model), which as one line
/// each buries what happened; so charges are summed per attempt and said in one line when
/// the attempt ends (or the run does). `--json` still carries every charge.
#[derive(Default)]
pub struct SpendFold {
    /// Attempts charged and not yet said: task, attempt, the sum, how many charges.
    open: Vec<(TaskId, u32, Budget, u32)>,
}

impl SpendFold {
    /// Whether `kind` is a charge this fold keeps (so the caller prints nothing for it now).
    pub fn absorb(&mut self, kind: &EventKind) -> bool {
        let EventKind::SpendCharged {
            task,
            attempt,
            spent,
        } = kind
        else {
            return false;
        };
        match self
            .open
            .iter_mut()
            .find(|(t, a, _, _)| t == task && a == attempt)
        {
            Some((_, _, sum, count)) => {
                *sum = sum.saturating_add(*spent);
                *count = count.saturating_add(1);
            }
            None => self.open.push((task.clone(), *attempt, *spent, 1)),
        }
        true
    }

    /// The lines to print after `kind`: the spend of each attempt it ends (all of them when
    /// the run finishes), in the order they were first charged.
    pub fn ended(&mut self, kind: &EventKind) -> Vec<String> {
        let task = match kind {
            EventKind::TaskRetried { task, .. }
            | EventKind::TaskInterrupted { task, .. }
            | EventKind::TaskCompleted { task, .. }
            | EventKind::TaskFailed { task, .. }
            | EventKind::TaskCancelled { task, .. }
            | EventKind::TaskLanding { task, .. }
            | EventKind::TaskLanded { task, .. } => Some(task),
            EventKind::RunFinished { .. } => None,
            _ => return Vec::new(),
        };
        let (said, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.open)
            .into_iter()
            .partition(|(t, _, _, _)| task.is_none_or(|task| t == task));
        self.open = kept;
        said.into_iter().map(Self::line).collect()
    }

    /// The lines of every attempt still open (the end of a task's story).
    pub fn rest(&mut self) -> Vec<String> {
        std::mem::take(&mut self.open)
            .into_iter()
            .map(Self::line)
            .collect()
    }

    fn line((task, attempt, spent, charges): (TaskId, u32, Budget, u32)) -> String {
        let what = format!("{task} attempt {attempt} spent {}", charge_words(&spent));
        if charges > 1 {
            format!("{what} ({charges} charges)")
        } else {
            what
        }
    }
}

/// A line [`SpendFold`] made, laid out like an event line. It is no journal event, so it
/// has no number (like a notice).
pub fn folded_line(text: &str, at_ms: u64, style: &Style) -> String {
    format!(
        "{} {} {}",
        style.dim(&clock(at_ms)),
        style.dim("#-    "),
        style.dim(&terminal_safe(text))
    )
}

/// One human line for an event. Its text is escaped as a whole ([`terminal_safe`]) before
/// it is coloured, so no part of it can carry a control sequence.
pub fn event_line(e: &Event, style: &Style) -> String {
    let (what, tone) = describe(&e.kind);
    let what = terminal_safe(&what);
    let what = match tone {
        Tone::Plain => what.into_owned(),
        Tone::Good => style.good(&what),
        Tone::Bad => style.bad(&what),
        Tone::Dim => style.dim(&what),
    };
    // A notice (seq 0) is not in the journal: it has no number to resume from.
    let seq = if e.seq == 0 {
        "#-    ".to_string()
    } else {
        format!("#{:<5}", e.seq)
    };
    format!("{} {} {what}", style.dim(&clock(e.at_ms)), style.dim(&seq))
}

/// An event in words, unescaped, and how to colour it.
fn describe(kind: &EventKind) -> (String, Tone) {
    let plain = |text: String| (text, Tone::Plain);
    match kind {
        EventKind::RunStarted { request, sandbox } => match sandbox {
            Some(sandbox) => plain(format!(
                "run started: {} (sandbox: {})",
                shorten(request, 100),
                shorten(sandbox, 80)
            )),
            None => plain(format!("run started: {}", shorten(request, 100))),
        },
        EventKind::PlannerResponded {
            call,
            error: Some(error),
            ..
        } => (
            format!(
                "planner call {} unusable: {}",
                call + 1,
                shorten(error, 120)
            ),
            Tone::Bad,
        ),
        EventKind::PlannerResponded { call, usage, .. } => plain(format!(
            "planner call {} answered ({} tokens)",
            call + 1,
            usage.tokens_in.saturating_add(usage.tokens_out)
        )),
        EventKind::ToolsRan { tools } => {
            let who = match &tools.task {
                Some(task) => format!("subplanner call {} for {task}", tools.call + 1),
                None => format!("planner call {}", tools.call + 1),
            };
            let names: Vec<&str> = tools.runs.iter().map(|r| r.name.as_str()).collect();
            (
                format!("{who} read: {}", shorten(&names.join(", "), 100)),
                Tone::Dim,
            )
        }
        EventKind::PlannerGaveUp { error } => (
            format!("planner gave up: {}", shorten(error, 120)),
            Tone::Bad,
        ),
        EventKind::TaskAdded {
            task,
            spec,
            depends_on,
            ..
        } => {
            let after = if depends_on.is_empty() {
                String::new()
            } else {
                format!(" after {}", list(depends_on))
            };
            plain(format!(
                "{task} added: {} [{}]{after}",
                shorten(&spec.description, 80),
                scope_words(&spec.scope)
            ))
        }
        EventKind::TasksRejected { reason } => {
            (format!("planner batch rejected: {reason}"), Tone::Bad)
        }
        EventKind::TaskReady { task } => plain(format!("{task} ready")),
        EventKind::TaskDispatched {
            task,
            attempt,
            profile,
            route,
        } => plain(match route {
            Route::Worker => {
                format!("{task} dispatched to a worker ({profile}), attempt {attempt}")
            }
            Route::Subplanner => format!("{task} dispatched to the subplanner, attempt {attempt}"),
        }),
        EventKind::TaskStarted { task, attempt } => {
            plain(format!("{task} started (attempt {attempt})"))
        }
        EventKind::TaskRetried {
            task,
            attempt,
            failure,
            ..
        } => plain(format!(
            "{task} attempt {attempt} failed ({}); retrying",
            shorten(&failure.to_string(), 80)
        )),
        EventKind::ReviewVerdict {
            task,
            attempt,
            review,
            ..
        } => {
            let comments = review.comments();
            let first = comments
                .first()
                .map(|c| format!(": {}", shorten(c, 100)))
                .unwrap_or_default();
            match review {
                ReviewVerdict::Approve { .. } => (
                    format!("{task} attempt {attempt} approved by the reviewer{first}"),
                    Tone::Good,
                ),
                ReviewVerdict::ChangesRequested { .. } => (
                    format!(
                        "{task} attempt {attempt}: the reviewer asked for changes ({} comment(s)){first}",
                        comments.len()
                    ),
                    Tone::Bad,
                ),
                ReviewVerdict::Failed { reason } => (
                    format!(
                        "{task} attempt {attempt}: no review verdict ({})",
                        shorten(reason, 100)
                    ),
                    Tone::Bad,
                ),
            }
        }
        EventKind::TaskInterrupted { task, attempt } => plain(format!(
            "{task} attempt {attempt} interrupted by a restart; queued again"
        )),
        EventKind::TaskCompleted { task, handoff, .. } => {
            handoff_line(&format!("{task} completed"), handoff.as_ref())
        }
        EventKind::TaskLanding { task, handoff, .. } => {
            handoff_line(&format!("{task} done, waiting to land"), handoff.as_ref())
        }
        EventKind::TaskLanded { task, commit, via } => (
            match via {
                Some(fix) => format!(
                    "{task} landed on main with {fix} ({})",
                    short_commit(commit)
                ),
                None => format!("{task} landed on main ({})", short_commit(commit)),
            },
            Tone::Good,
        ),
        EventKind::FixTaskAdded {
            task, spec, fix, ..
        } => (
            match fix {
                FixOf::Conflict {
                    task: of, files, ..
                } => format!(
                    "{task} added to resolve {of}'s conflict with main [{}]",
                    scope_words(files)
                ),
                FixOf::Sweep { class, .. } => format!(
                    "{task} added to fix main ({class}): {} [{}]",
                    shorten(spec.description.lines().next().unwrap_or_default(), 80),
                    scope_words(&spec.scope)
                ),
            },
            Tone::Bad,
        ),
        EventKind::MergeConflict {
            task,
            files,
            retrying,
            ..
        } => (
            format!(
                "{task} conflicts with main in [{}]{}",
                scope_words(files),
                if *retrying {
                    "; trying again later in the queue"
                } else {
                    ""
                }
            ),
            Tone::Bad,
        ),
        EventKind::MergeGateFailed {
            tasks,
            command,
            output_tail,
            bisecting,
            flaky_retry,
        } => (
            format!(
                "merge gate failed for {} ({}){}: {}",
                list(tasks),
                shorten(command, 60),
                if *flaky_retry {
                    "; testing once more"
                } else if *bisecting {
                    "; bisecting"
                } else {
                    ""
                },
                shorten(
                    output_tail
                        .lines()
                        .rev()
                        .find(|l| !l.trim().is_empty())
                        .unwrap_or_default(),
                    100
                )
            ),
            Tone::Bad,
        ),
        EventKind::MainMoved {
            from,
            to,
            tasks,
            checkout,
        } => plain(format!(
            "main {} → {} with {}{}",
            short_commit(from),
            short_commit(to),
            list(tasks),
            match checkout {
                CheckoutSync::NotCheckedOut => String::new(),
                CheckoutSync::FastForwarded => "; your checkout of main was brought along".into(),
                CheckoutSync::Detached { at } => format!(
                    "; your checkout had changes, so HEAD was detached at {} (`git switch main` when ready)",
                    short_commit(at)
                ),
                CheckoutSync::Behind { at, paths } if paths.is_empty() => format!(
                    "; your checkout of main stays at {} while another git command holds its index",
                    short_commit(at)
                ),
                CheckoutSync::Behind { at, paths } => format!(
                    "; your checkout of main stays at {} (HEAD on main): you changed {}, which main changed too; nothing of yours was touched",
                    short_commit(at),
                    paths.join(", ")
                ),
            }
        )),
        EventKind::LandingIntended { from, to, landed } => (
            format!(
                "main {} → {} next, with {}",
                short_commit(from),
                short_commit(to),
                list(&landed.iter().map(|l| l.task.clone()).collect::<Vec<_>>())
            ),
            Tone::Dim,
        ),
        EventKind::MainDiverged { expected, actual } => (
            format!(
                "main was moved to {} and no longer holds {}, the work this run landed: \
                 landing is paused and nothing dropped is replayed. To go on, put it back \
                 (`git branch -f main {expected}`, or merge {} into main): landing resumes \
                 with the next branch or restart; or land on main as it is \
                 (`flotilla decide RUN --adopt-main`); or end the run \
                 (`flotilla decide RUN --cancel`)",
                short_commit(actual),
                short_commit(expected),
                short_commit(expected),
            ),
            Tone::Bad,
        ),
        EventKind::MainAdopted {
            expected,
            tip,
            dropped,
        } => (
            format!(
                "main adopted as it is ({} in place of {}): landing goes on on top of it; {}",
                short_commit(tip),
                short_commit(expected),
                if dropped.is_empty() {
                    "it holds every task this run landed".to_string()
                } else {
                    format!(
                        "main no longer holds the landed work of {} (not replayed: their \
                         commits are in `flotilla status RUN TASK`)",
                        list(dropped)
                    )
                }
            ),
            if dropped.is_empty() {
                Tone::Plain
            } else {
                Tone::Bad
            },
        ),
        EventKind::ProviderPauseStarted {
            provider,
            role,
            task,
            until_ms,
            why,
        } => (
            format!(
                "provider {} holds calls back until {} ({}; heard by the {role}{})",
                shorten(provider, 60),
                clock(*until_ms),
                shorten(why, 120),
                task.as_ref()
                    .map(|t| format!(" for {t}"))
                    .unwrap_or_default(),
            ),
            Tone::Bad,
        ),
        EventKind::ProviderResumed { provider } => plain(format!(
            "provider {}: its pause is over, calls go on",
            shorten(provider, 60)
        )),
        EventKind::LandingRequeued { task, fix } => plain(format!(
            "{fix} had nothing to resolve: {task} goes back to the merge queue"
        )),
        EventKind::SweepFinished { report } => {
            let what = if report.green {
                format!(
                    "sweep {} of main ({}) green",
                    report.sweep,
                    short_commit(&report.commit)
                )
            } else {
                format!(
                    "sweep {} of main ({}) red: {} failure{}, fixing {} ({} fix{})",
                    report.sweep,
                    short_commit(&report.commit),
                    report.failures,
                    if report.failures == 1 { "" } else { "s" },
                    report.class.as_deref().unwrap_or("?"),
                    report.fixes.len(),
                    if report.fixes.len() == 1 { "" } else { "es" }
                )
            };
            (what, if report.green { Tone::Good } else { Tone::Bad })
        }
        EventKind::SweepStale { sweep, commit } => (
            format!(
                "sweep {sweep} discarded: main moved from {} while it ran",
                short_commit(commit)
            ),
            Tone::Dim,
        ),
        EventKind::FinalizationStarted { attempt } => plain(format!(
            "finalizing (round {attempt}): merge queue drained; sweeping main"
        )),
        EventKind::TaskFailed { task, reason, .. } => (
            format!("{task} failed: {}", shorten(&reason.to_string(), 120)),
            Tone::Bad,
        ),
        EventKind::TaskCancelled { task, reason, .. } => {
            plain(format!("{task} cancelled: {reason}"))
        }
        EventKind::DecompositionAccepted {
            parent,
            subtasks,
            reason,
            ..
        } => plain(format!(
            "{parent} decomposed ({}) into {}",
            decomposition_reason(*reason),
            list(subtasks)
        )),
        EventKind::SubtasksAdded {
            parent, subtasks, ..
        } => plain(format!("{parent}: the subplanner added {}", list(subtasks))),
        EventKind::DecompositionClosed { parent, reason, .. } => plain(format!(
            "{parent}: no more subtasks ({})",
            shorten(reason, 100)
        )),
        EventKind::SubplannerResponded {
            task,
            call,
            error: Some(error),
            ..
        } => (
            format!(
                "subplanner call {} for {task} unusable: {}",
                call + 1,
                shorten(error, 120)
            ),
            Tone::Bad,
        ),
        EventKind::SubplannerResponded {
            task, call, usage, ..
        } => plain(format!(
            "subplanner call {} for {task} answered ({} tokens)",
            call + 1,
            usage.tokens_in.saturating_add(usage.tokens_out)
        )),
        EventKind::TaskAtomic { task, reason, .. } => plain(format!(
            "{task} goes to a worker as it is: {}",
            shorten(reason, 100)
        )),
        EventKind::DecompositionRejected { parent, reason, .. } => {
            (format!("{parent} subplan rejected: {reason}"), Tone::Bad)
        }
        EventKind::ProposalsStopped {
            task, rejections, ..
        } => (
            format!("{task} stopped after {rejections} rejected subplans"),
            Tone::Bad,
        ),
        EventKind::SubtasksCompleted { parent } => {
            plain(format!("{parent} subtasks done; synthesizing"))
        }
        EventKind::AwaitingUserDecision { parent } => {
            plain(format!("{parent} waits for your decision"))
        }
        EventKind::LandingAllowed { task } => plain(format!(
            "{task} may land: you allowed its change to flotilla's configuration"
        )),
        EventKind::MessageIgnored { task, message, why } => (
            format!(
                "ignored {message}{}: {why}",
                task.as_ref()
                    .map(|t| format!(" for {t}"))
                    .unwrap_or_default()
            ),
            Tone::Dim,
        ),
        EventKind::PlanningFinished => plain("planning finished".to_string()),
        EventKind::RunCancelRequested { reason } => plain(format!("run cancelling: {reason}")),
        EventKind::SpendCharged {
            task,
            attempt,
            spent,
        } => (
            format!("{task} attempt {attempt} spent {}", charge_words(spent)),
            Tone::Dim,
        ),
        EventKind::RunBudgetExhausted { spent, budget } => (
            format!("run budget exhausted: spent {spent} of {budget}; stopping"),
            Tone::Bad,
        ),
        EventKind::RunRestarted { restart, reason } => (
            format!(
                "run restarted from the journal (restart {restart}): {}",
                shorten(reason, 120)
            ),
            Tone::Bad,
        ),
        EventKind::LlmProgress {
            role,
            task,
            tokens_out,
        } => (
            format!(
                "{role}{} call streaming: {tokens_out} tokens so far",
                task.as_ref().map(|t| format!(" ({t})")).unwrap_or_default()
            ),
            Tone::Dim,
        ),
        EventKind::AgentActivity { task, activity, .. } => {
            (format!("{task}: {}", shorten(activity, 120)), Tone::Dim)
        }
        EventKind::ProviderPaused {
            role,
            task,
            provider,
            wait_ms,
        } => (
            format!(
                "{role}{} call paused {}: provider {} is rate limiting",
                task.as_ref().map(|t| format!(" ({t})")).unwrap_or_default(),
                duration(*wait_ms),
                shorten(provider, 60)
            ),
            Tone::Bad,
        ),
        EventKind::JournalUnavailable { error } => (
            // The error says what failed (written or read); say it once.
            format!("run paused, retrying: {}", shorten(error, 160)),
            Tone::Bad,
        ),
        EventKind::StorageUnavailable { task, error } => (
            format!(
                "{task} waits: flotilla's storage refused a write, retrying: {}",
                shorten(error, 160)
            ),
            Tone::Bad,
        ),
        EventKind::RunFinished { outcome, reason } => {
            let why = reason
                .as_ref()
                .map(|r| format!(" ({})", shorten(r, 120)))
                .unwrap_or_default();
            let text = format!("run finished: {}{why}", state_name(Some(*outcome)));
            if *outcome == RunOutcome::Completed {
                (text, Tone::Good)
            } else {
                (text, Tone::Bad)
            }
        }
    }
}

fn decomposition_reason(reason: DecompositionReason) -> &'static str {
    match reason {
        DecompositionReason::TooLarge => "too large",
        DecompositionReason::MissingInfo => "missing information",
        DecompositionReason::DependencyDiscovered => "a dependency was discovered",
        DecompositionReason::Ambiguity => "ambiguous",
        DecompositionReason::ExternalToolRequired => "needs an external tool",
    }
}

/// "t3 completed: summary [2 files, +10 -1, abc1234]; flagged: …": a handoff in one line.
fn handoff_line(head: &str, handoff: Option<&Handoff>) -> (String, Tone) {
    let Some(h) = handoff else {
        return (head.to_string(), Tone::Good);
    };
    let mut line = format!("{head}: {}", shorten(&h.summary, 100));
    if let Some(work) = &h.work {
        let files = work.files.len() as u64 + work.files_omitted;
        line.push_str(&format!(
            " [{files} file{}, +{} -{}, {}]",
            if files == 1 { "" } else { "s" },
            work.lines_added,
            work.lines_removed,
            short_commit(&work.head)
        ));
    }
    if h.findings.is_empty() {
        (line, Tone::Good)
    } else {
        let found: Vec<String> = h
            .findings
            .iter()
            .map(|f| shorten(&f.to_string(), 120))
            .collect();
        line.push_str(&format!("; flagged: {}", found.join("; ")));
        (line, Tone::Bad)
    }
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
