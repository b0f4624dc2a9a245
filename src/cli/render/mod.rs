//! How the CLI prints events and runs: one readable line per event, colour only on a
//! terminal and never with `NO_COLOR`, and on a terminal a live summary line (tasks done /
//! running / pending, tokens, cost, elapsed).
//!
//! Everything shown here that flotilla did not write itself (a request, a model's
//! descriptions and summaries, file names, failure texts, the daemon's error messages) goes
//! through [`terminal_safe`] first (or `text_safety::json_safe` for `--json`), so that no text can move
//! the cursor, retitle or clear the terminal, write to the clipboard or reorder a line.
//!
//! The live line counts spending as the budgets do (`SpendCharged` and planner usage).
//! `terminal_safe` (in `text_safety`) escapes control, C1, bidi and zero-width characters.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::IsTerminal;

use flotilla_actors::protocol::{
    Budget, CheckoutSync, DecompositionReason, Event, EventKind, FixOf, Handoff, Route, RunOutcome,
    TaskId, TaskState, Usd,
};

use crate::api::runs::RunSummary;
use crate::api::status::{RunStatus, TaskStory, task_state_words};
use crate::text_safety::terminal_safe;

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
        } => plain(format!(
            "{task} attempt {attempt} failed ({}); retrying",
            shorten(&failure.to_string(), 80)
        )),
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
            let text = format!("run finished: {}{why}", outcome_name(*outcome));
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

fn list(tasks: &[TaskId]) -> String {
    tasks
        .iter()
        .map(TaskId::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

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
        let state = if status.awaiting_decision.contains(&t.id) {
            "awaiting your decision"
        } else {
            task_state_words(t.state)
        };
        let line = format!(
            "{} [{state}] {}{summary}{failure}",
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

/// `flotilla runs`: one line per run, its id shortened to the shortest prefix (at least 8
/// characters) that names no other run.
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

/// The CLI's error report: `error: …` and, when there is one, `hint: …`, each one line.
pub fn error_text(message: &str, hint: Option<&str>) -> String {
    let mut out = format!("error: {}\n", terminal_safe(message));
    if let Some(hint) = hint {
        let _ = writeln!(out, "hint: {}", terminal_safe(hint));
    }
    out
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

/// A commit's first 7 characters.
fn short_commit(commit: &str) -> String {
    commit.chars().take(7).collect()
}

#[cfg(test)]
mod tests {
    use flotilla_actors::protocol::{
        AttemptFailure, Budget, FailureReason, Finding, GraphSnapshot, Handoff, HandoffMetrics,
        HandoffStatus, Priority, Role, RunId, TaskSpec, TaskView, Usage, Usd,
    };

    use super::*;
    use crate::api::status::Counts;
    use crate::text_safety::{is_unsafe_for_terminal, json_line};

    #[test]
    fn a_charge_names_only_what_was_spent() {
        let tokens = Budget::new(1000, Usd::ZERO, 0);
        let time = Budget::new(0, Usd::ZERO, 152);
        let both = Budget::new(7, Usd::from_micros(1_500), 3);
        assert_eq!(charge_words(&tokens), "1000 tokens");
        assert_eq!(charge_words(&time), "152 ms");
        assert_eq!(charge_words(&both), "7 tokens, $0.0015, 3 ms");
        assert_eq!(charge_words(&Budget::default()), "0 ms");
    }

    /// A task's story says each attempt's spend once (its sixty per-call charges folded),
    /// and every failure, retried ones too, in full.
    #[test]
    fn a_task_story_folds_charges_per_attempt_and_gives_every_reason_whole() {
        let run = RunId::generate();
        let task = TaskId::root(1);
        let long = format!(
            "codex: turn failed: {} the cause at the end",
            "x".repeat(200)
        );
        let charge = |seq, attempt| Event {
            seq,
            run,
            at_ms: seq * 1000,
            kind: EventKind::SpendCharged {
                task: task.clone(),
                attempt,
                spent: Budget::new(100, Usd::ZERO, 0),
            },
        };
        let mut events = vec![];
        for seq in 1..=3 {
            events.push(charge(seq, 1));
        }
        events.push(Event {
            seq: 4,
            run,
            at_ms: 4000,
            kind: EventKind::TaskRetried {
                task: task.clone(),
                attempt: 1,
                failure: AttemptFailure::Crashed {
                    detail: long.clone(),
                },
            },
        });
        events.push(charge(5, 2));
        events.push(Event {
            seq: 6,
            run,
            at_ms: 6000,
            kind: EventKind::TaskFailed {
                task: task.clone(),
                attempt: 2,
                reason: FailureReason::AgentFailed {
                    failure: AttemptFailure::Crashed {
                        detail: long.clone(),
                    },
                },
            },
        });
        let story = TaskStory {
            run: run.to_string(),
            task,
            events,
            omitted: 0,
        };
        let text = task_story_text(&story, &Style::plain());
        let spend: Vec<&str> = text.lines().filter(|l| l.contains(" spent ")).collect();
        assert_eq!(spend.len(), 2, "{text}");
        assert!(
            spend[0].ends_with("t1 attempt 1 spent 300 tokens (3 charges)"),
            "{text}"
        );
        assert!(
            spend[1].ends_with("t1 attempt 2 spent 100 tokens"),
            "{text}"
        );
        let order: Vec<usize> = ["attempt 1 failed", "attempt 1 spent", "attempt 2 spent"]
            .iter()
            .map(|needle| text.find(needle).expect(needle))
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
        let whole = text
            .lines()
            .filter(|l| l.contains("the cause at the end"))
            .count();
        assert_eq!(whole, 2, "both reasons whole: {text}");
    }

    /// The fold keeps charges of other tasks open, and a run's end says them all.
    #[test]
    fn spend_fold_says_an_attempt_when_it_ends_and_the_rest_at_the_run_end() {
        let mut fold = SpendFold::default();
        let charge = |task: u32| EventKind::SpendCharged {
            task: TaskId::root(task),
            attempt: 1,
            spent: Budget::new(5, Usd::ZERO, 0),
        };
        assert!(fold.absorb(&charge(1)));
        assert!(fold.absorb(&charge(2)));
        assert!(!fold.absorb(&EventKind::PlanningFinished));
        let t1_done = EventKind::TaskInterrupted {
            task: TaskId::root(1),
            attempt: 1,
        };
        assert_eq!(fold.ended(&t1_done), vec!["t1 attempt 1 spent 5 tokens"]);
        assert!(fold.ended(&t1_done).is_empty());
        assert!(fold.ended(&EventKind::PlanningFinished).is_empty());
        let finished = EventKind::RunFinished {
            outcome: RunOutcome::Completed,
            reason: None,
        };
        assert_eq!(fold.ended(&finished), vec!["t2 attempt 1 spent 5 tokens"]);
    }

    /// Retitles the terminal (OSC 0), clears it (CSI 2J), writes the clipboard (OSC 52),
    /// returns the carriage, an 8-bit CSI, reverses the line (RLO), DEL, an isolate.
    const HOSTILE: &str =
        "ok\x1b]0;pwned\x07\x1b[2J\x1b]52;c;ZXZpbA==\x07\r\u{9b}31m\u{202e}evil\x7f\u{2066}\x08";

    /// Nothing in `text` can act on a terminal (line breaks allowed when `multi_line`), and
    /// the hostile text's escape shows visibly.
    fn assert_safe(text: &str, multi_line: bool) {
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

    /// Issue 20: the live line printed an agent's activity raw (OSC retitle, clear screen,
    /// U+202E reached the terminal). The bytes it writes hold no ESC, C1 or bidi control
    /// but flotilla's own colour codes.
    #[test]
    fn the_live_line_escapes_agent_activity() {
        let mut tally = Tally::default();
        tally.observe(&event(
            3,
            1_000,
            EventKind::AgentActivity {
                task: TaskId::root(1),
                attempt: 1,
                activity: format!("run_command {HOSTILE}\u{e0041}\u{ad}"),
            },
        ));
        for columns in [None, Some(400)] {
            let line = tally.live_line(1_000, columns);
            assert_safe(&line, false);
            let painted = Style {
                color: true,
                live: true,
            }
            .dim(&line);
            let bytes = format!("\r\x1b[2K{painted}");
            let ours = bytes
                .replacen("\r\x1b[2K", "", 1)
                .replace("\x1b[2m", "")
                .replace("\x1b[0m", "");
            assert!(
                !ours.chars().any(|c| c == '\x1b'
                    || ('\u{80}'..='\u{9f}').contains(&c)
                    || ('\u{202a}'..='\u{202e}').contains(&c)
                    || ('\u{2066}'..='\u{2069}').contains(&c)),
                "{ours:?}"
            );
        }
    }

    /// M8c: the live line was 146 characters with no regard for the terminal's width; on a
    /// terminal it fits in one row, counting wide characters as two columns.
    #[test]
    fn the_live_line_fits_the_terminals_width() {
        let mut tally = Tally::default();
        tally.set_budget(Budget::new(
            2_000_000,
            Usd::from_micros(5_000_000),
            3_600_000,
        ));
        tally.observe(&event(
            1,
            1_000,
            EventKind::AgentActivity {
                task: TaskId::root(1),
                attempt: 1,
                activity: "editing 日本語のファイル src/some/long/path/name.rs".into(),
            },
        ));
        let whole = tally.live_line(1_000, None);
        assert!(whole.chars().count() > 100, "{whole}");
        for columns in [0, 1, 2, 10, 40, 80, 120] {
            let line = tally.live_line(1_000, Some(columns));
            let width = unicode_width::UnicodeWidthStr::width(line.as_str());
            assert!(width < columns.max(1), "{columns}: {width} columns: {line}");
            if columns > 2 {
                assert!(line.ends_with('…'), "{line}");
            }
        }
        assert_eq!(
            tally.live_line(1_000, Some(1_000)),
            whole,
            "room enough: whole"
        );
        assert_eq!(fit_columns("日本語", 6), "日本…");
        assert_eq!(fit_columns("日本語", 7), "日本語");
    }

    fn hostile_events() -> Vec<EventKind> {
        let task = TaskId::root(1);
        let mut spec = TaskSpec::new(HOSTILE, &[HOSTILE]);
        spec.acceptance = HOSTILE.into();
        vec![
            EventKind::ProviderPaused {
                role: Role::Worker,
                task: Some(task.clone()),
                provider: HOSTILE.into(),
                wait_ms: 60_000,
            },
            EventKind::RunStarted {
                request: HOSTILE.into(),
                sandbox: Some(HOSTILE.into()),
            },
            EventKind::PlannerResponded {
                call: 0,
                prompt: HOSTILE.into(),
                content: HOSTILE.into(),
                usage: Usage::default(),
                error: Some(HOSTILE.into()),
            },
            EventKind::PlannerGaveUp {
                error: HOSTILE.into(),
            },
            EventKind::TaskAdded {
                task: task.clone(),
                spec,
                budget: Budget::default(),
                depends_on: vec![],
            },
            EventKind::TaskDispatched {
                task: task.clone(),
                attempt: 1,
                profile: HOSTILE.into(),
                route: Route::Worker,
            },
            EventKind::TaskRetried {
                task: task.clone(),
                attempt: 1,
                failure: AttemptFailure::Crashed {
                    detail: HOSTILE.into(),
                },
            },
            EventKind::TaskCompleted {
                task: task.clone(),
                attempt: 2,
                handoff: Some(Handoff {
                    status: HandoffStatus::Complete,
                    summary: HOSTILE.into(),
                    files_changed: vec![HOSTILE.into()],
                    concerns: vec![HOSTILE.into()],
                    suggestions: vec![],
                    metrics: HandoffMetrics::default(),
                    build_exit_code: None,
                    work: None,
                    findings: vec![Finding::VerificationFailed {
                        command: HOSTILE.into(),
                        exit: HOSTILE.into(),
                        output_tail: HOSTILE.into(),
                    }],
                }),
                artifacts: vec![],
            },
            EventKind::TaskFailed {
                task: task.clone(),
                attempt: 1,
                reason: FailureReason::Blocked {
                    summary: HOSTILE.into(),
                },
            },
            EventKind::TaskCancelled {
                task: task.clone(),
                was: TaskState::Running,
                reason: HOSTILE.into(),
            },
            EventKind::MessageIgnored {
                task: Some(task),
                message: HOSTILE.into(),
                why: HOSTILE.into(),
            },
            EventKind::RunCancelRequested {
                reason: HOSTILE.into(),
            },
            EventKind::RunFinished {
                outcome: RunOutcome::Failed,
                reason: Some(HOSTILE.into()),
            },
            EventKind::ProviderPauseStarted {
                provider: HOSTILE.into(),
                role: Role::Planner,
                task: Some(TaskId::root(3)),
                until_ms: u64::MAX,
                why: HOSTILE.into(),
            },
            EventKind::ProviderResumed {
                provider: HOSTILE.into(),
            },
        ]
    }

    #[test]
    fn tail_and_submit_lines_escape_what_models_and_users_wrote() {
        for kind in hostile_events() {
            let event = Event {
                seq: 1,
                run: RunId::generate(),
                at_ms: 0,
                kind,
            };
            for style in [
                Style::plain(),
                Style {
                    color: true,
                    live: true,
                },
            ] {
                let line = event_line(&event, &style);
                // Colour codes are flotilla's own: strip them, then nothing may remain.
                let uncoloured = ["\x1b[0m", "\x1b[1m", "\x1b[2m", "\x1b[31m", "\x1b[32m"]
                    .iter()
                    .fold(line.clone(), |l, code| l.replace(code, ""));
                assert_safe(&uncoloured, false);
            }
            let json = json_line(&event);
            assert!(!json.chars().any(is_unsafe_for_terminal), "{json:?}");
        }
    }

    fn hostile_status() -> RunStatus {
        let task = |n: u32, state, failure| TaskView {
            id: TaskId::root(n),
            state,
            attempt: 1,
            description: HOSTILE.into(),
            scope: vec![HOSTILE.into()],
            priority: Priority::default(),
            parent: None,
            depends_on: vec![],
            budget: Budget::default(),
            spent: Budget::default(),
            summary: Some(HOSTILE.into()),
            failure,
        };
        RunStatus {
            id: RunId::generate().to_string(),
            request: HOSTILE.into(),
            repo: HOSTILE.into(),
            created_ms: 0,
            state: "failed".into(),
            counts: Counts::default(),
            last_seq: 1,
            awaiting_decision: vec![],
            main_diverged: Some(crate::api::status::MainDivergence {
                expected: HOSTILE.into(),
                actual: HOSTILE.into(),
            }),
            provider_pauses: vec![crate::api::status::ProviderPause {
                provider: HOSTILE.into(),
                role: Role::Worker,
                task: Some(TaskId::root(1)),
                until_ms: u64::MAX,
                why: HOSTILE.into(),
            }],
            graph: GraphSnapshot {
                tasks: vec![
                    task(1, TaskState::Completed, None),
                    task(
                        2,
                        TaskState::Failed,
                        Some(FailureReason::AgentFailed {
                            failure: AttemptFailure::Crashed {
                                detail: HOSTILE.into(),
                            },
                        }),
                    ),
                ],
                planning_finished: true,
                outcome: Some(RunOutcome::Failed),
                run_spent: Budget::default(),
                run_budget: Budget::default(),
                finish_reason: Some(HOSTILE.into()),
            },
            problem: Some(HOSTILE.into()),
            sandbox: Some(HOSTILE.into()),
            branch: Some(HOSTILE.into()),
            damage_noted: false,
        }
    }

    #[test]
    fn status_escapes_everything_and_says_why_a_task_failed_in_words() {
        let text = status_text(&hostile_status(), &Style::plain());
        assert_safe(&text, true);
        assert!(text.contains("problem: ok"), "{text}");
        assert!(text.contains("why:     ok"), "{text}");
        let failed = text.lines().find(|l| l.contains("t2 [failed]")).unwrap();
        assert!(
            failed.contains("failed: the agent crashed: ok"),
            "the reason in words, not Debug: {failed}"
        );
        assert!(!failed.contains("AgentFailed"), "{failed}");
    }

    fn summary(id: &str, request: &str) -> RunSummary {
        RunSummary {
            id: id.into(),
            request: request.into(),
            repo: "/r".into(),
            created_ms: 0,
            state: "running".into(),
            problem: None,
        }
    }

    #[test]
    fn runs_and_daemon_status_escape_requests_and_problems() {
        let mut run = summary(&RunId::generate().to_string(), HOSTILE);
        run.problem = Some(HOSTILE.into());
        assert_safe(&runs_text(std::slice::from_ref(&run)), true);
        assert_safe(&daemon_text(HOSTILE, &[run]), true);
    }

    #[test]
    fn error_lines_escape_the_daemons_message_and_stay_two_lines() {
        let text = error_text(&format!("{HOSTILE}\nhint: forged"), Some(HOSTILE));
        assert_safe(&text, true);
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(text.starts_with("error: ok"));
    }

    #[test]
    fn status_says_states_in_words_and_spending_as_the_budgets_count_it() {
        let mut status = hostile_status();
        status.graph.tasks[0].state = TaskState::WaitingForSubtasks;
        let mut waiting = status.graph.tasks[0].clone();
        waiting.id = TaskId::root(3);
        status.graph.tasks.push(waiting);
        status.awaiting_decision = vec![TaskId::root(1)];
        status.graph.run_spent = Budget::new(1234, Usd::from_micros(5_000), 447_000);
        status.graph.run_budget = Budget::new(10_000, Usd::from_micros(1_000_000), 3_600_000);
        let text = status_text(&status, &Style::plain());
        assert!(text.contains("t1 [awaiting your decision]"), "{text}");
        assert!(text.contains("t3 [waiting for subtasks]"), "{text}");
        assert!(!text.contains("waiting_for_subtasks"), "{text}");
        assert!(
            text.contains(
                "spent:   1234 tokens · $0.0050 · 7m27s agent time\n\
                 budget:  10000 tokens · $1.0000 · 1h00m agent time\n"
            ),
            "{text}"
        );
    }

    fn event(seq: u64, at_ms: u64, kind: EventKind) -> Event {
        Event {
            seq,
            run: RunId::generate(),
            at_ms,
            kind,
        }
    }

    #[test]
    fn a_notice_has_no_seq_and_says_its_problem_once() {
        let line = event_line(
            &event(
                0,
                0,
                EventKind::JournalUnavailable {
                    error: format!(
                        "the journal could not be written: journal storage failed: {HOSTILE}"
                    ),
                },
            ),
            &Style::plain(),
        );
        assert!(line.starts_with("00:00:00 #-     run paused"), "{line}");
        assert_eq!(line.matches("could not be written").count(), 1, "{line}");
        assert_eq!(line.matches("cannot be written").count(), 0, "{line}");
        assert!(line.contains("\\x1b]0;pwned"), "escaped: {line}");
    }

    #[test]
    fn the_live_line_shows_a_streaming_call_until_its_answer_and_no_tail_line_is_printed_for_it() {
        let mut tally = Tally::default();
        let progress = event(
            0,
            1_000,
            EventKind::LlmProgress {
                role: Role::Planner,
                task: None,
                tokens_out: 340,
            },
        );
        tally.observe(&progress);
        assert!(
            tally
                .summary(1_000)
                .ends_with(" · planner: 340 tokens streaming"),
            "{}",
            tally.summary(1_000)
        );
        tally.observe(&event(
            1,
            1_100,
            EventKind::PlannerResponded {
                call: 0,
                prompt: String::new(),
                content: String::new(),
                usage: Usage::default(),
                error: None,
            },
        ));
        assert!(!tally.summary(1_100).contains("streaming"));
        let line = event_line(&progress, &Style::plain());
        assert!(
            line.contains("#-     planner call streaming: 340 tokens so far"),
            "{line}"
        );
    }

    #[test]
    fn the_subplanners_calls_count_in_what_the_run_spent_as_status_counts_them() {
        let mut tally = Tally::default();
        tally.observe(&event(
            1,
            1_000,
            EventKind::SubplannerResponded {
                task: TaskId::root(4),
                attempt: 1,
                call: 0,
                prompt: String::new(),
                content: String::new(),
                usage: Usage {
                    tokens_in: 1_000,
                    tokens_out: 332,
                    cost_usd: Usd::from_micros(3_000),
                },
                reported: Vec::new(),
                error: None,
            },
        ));
        assert!(
            tally.summary(1_000).contains("1332 tokens · $0.0030"),
            "{}",
            tally.summary(1_000)
        );
    }

    #[test]
    fn the_last_line_says_what_reached_main_the_fixes_and_the_sweeps() {
        let mut tally = Tally::default();
        assert_eq!(
            tally.landing_summary(),
            None,
            "nothing landed, nothing to say"
        );
        let (t1, f1, f2) = (TaskId::root(1), TaskId::fix(1), TaskId::fix(2));
        let moved = |from: &str, to: &str, task: &TaskId| EventKind::MainMoved {
            from: from.into(),
            to: to.into(),
            tasks: vec![task.clone()],
            checkout: CheckoutSync::FastForwarded,
        };
        let sweep = |green: bool| EventKind::SweepFinished {
            report: flotilla_actors::protocol::SweepReport {
                sweep: 1,
                commit: "c".into(),
                green,
                class: None,
                failures: 0,
                fixes: Vec::new(),
                duration_ms: 1,
                finalization: None,
            },
        };
        let landed = |task: &TaskId| EventKind::TaskLanded {
            task: task.clone(),
            commit: "c".into(),
            via: None,
        };
        let fix = |task: &TaskId, fix: FixOf| EventKind::FixTaskAdded {
            task: task.clone(),
            spec: TaskSpec::new("fix", &["a"]),
            budget: Budget::default(),
            fix,
        };
        for (seq, kind) in [
            moved("aaaaaaa111", "bbbbbbb222", &t1),
            landed(&t1),
            fix(
                &f1,
                FixOf::Conflict {
                    task: t1.clone(),
                    branch: "b".into(),
                    files: vec!["a".into()],
                },
            ),
            sweep(false),
            fix(
                &f2,
                FixOf::Sweep {
                    signature: "s".into(),
                    class: "build failure".into(),
                },
            ),
            moved("bbbbbbb222", "ccccccc333", &f2),
            landed(&f2),
            sweep(true),
        ]
        .into_iter()
        .enumerate()
        {
            tally.observe(&event(seq as u64 + 1, 1_000, kind));
        }
        assert_eq!(
            tally.landing_summary().as_deref(),
            Some(
                "main aaaaaaa → ccccccc in 2 moves · 2 tasks landed · fix tasks: 1 for \
                 conflicts, 1 for a red main · 2 sweeps, the last green"
            )
        );
    }

    #[test]
    fn the_live_line_counts_every_charge_once_and_stops_its_clock_with_the_run() {
        let t1 = TaskId::root(1);
        let mut handoff = Handoff::complete("done");
        handoff.metrics.tokens_in = 700;
        let mut tally = Tally::default();
        for e in [
            event(
                1,
                1_000,
                EventKind::RunStarted {
                    request: "r".into(),
                    sandbox: None,
                },
            ),
            event(
                2,
                1_010,
                EventKind::PlannerResponded {
                    call: 0,
                    prompt: String::new(),
                    content: String::new(),
                    usage: Usage {
                        tokens_in: 60,
                        tokens_out: 40,
                        cost_usd: Usd::from_micros(1_000),
                    },
                    error: None,
                },
            ),
            event(
                3,
                1_050,
                EventKind::SpendCharged {
                    task: t1.clone(),
                    attempt: 1,
                    spent: Budget::new(500, Usd::from_micros(2_000), 30),
                },
            ),
            // Its handoff's spend was charged above: not counted again.
            event(
                4,
                1_060,
                EventKind::TaskCompleted {
                    task: t1,
                    attempt: 1,
                    handoff: Some(handoff),
                    artifacts: vec![],
                },
            ),
            event(
                5,
                1_100,
                EventKind::RunFinished {
                    outcome: RunOutcome::Completed,
                    reason: None,
                },
            ),
        ] {
            tally.observe(&e);
        }
        // Minutes later, the run still took 0.1 s.
        let line = tally.summary(450_000);
        assert!(
            line.ends_with("600 tokens · $0.0030 · 0.0s agent time · 0.1s elapsed"),
            "{line}"
        );
        tally.set_budget(Budget::new(10_000, Usd::from_micros(1_000_000), 60_000));
        // Created before the first event this tail saw: counted from its creation.
        tally.set_created(500);
        let line = tally.summary(450_000);
        assert!(
            line.ends_with(
                "600/10000 tokens · $0.0030/$1.0000 · 0.0s/1m00s agent time · 0.6s elapsed"
            ),
            "{line}"
        );
    }

    #[test]
    fn daemon_status_lists_damaged_and_paused_runs_with_their_problem() {
        let mut damaged = summary("01a20163-c6be-7585-89dc-6c22ed29ed73", "broken");
        damaged.state = "damaged".into();
        damaged.problem = Some("damaged: journal entry 6 is unreadable".into());
        let mut paused = summary("01b00000-0000-7000-8000-000000000000", "paused");
        paused.problem = Some("the journal could not be written: disk full".into());
        let mut done = summary("01c00000-0000-7000-8000-000000000000", "done");
        done.state = "completed".into();
        let text = daemon_text("sock", &[damaged, paused, done]);
        assert!(
            text.contains("runs: 3 in total, 1 running, 1 damaged"),
            "{text}"
        );
        assert!(
            text.contains("damaged    broken  (damaged: journal entry 6 is unreadable)"),
            "{text}"
        );
        assert!(
            text.contains("running    paused  (the journal could not be written: disk full)"),
            "{text}"
        );
        assert!(!text.contains("done"), "{text}");
    }

    #[test]
    fn runs_prints_the_shortest_unique_prefix_of_at_least_eight() {
        let ids = [
            "01a20163-c6be-7585-89dc-6c22ed29ed73",
            "01a20163-c6bf-7000-89dc-6c22ed29ed73",
            "01a20163-d000-7000-89dc-6c22ed29ed73",
            "01b00000-0000-7000-8000-000000000000",
        ];
        assert_eq!(
            unique_prefixes(&ids, 8),
            ["01a20163-c6be", "01a20163-c6bf", "01a20163-d", "01b00000"]
        );
        let runs: Vec<RunSummary> = ids.iter().map(|id| summary(id, "x")).collect();
        let text = runs_text(&runs);
        assert!(text.starts_with("01a20163-c6be  running"), "{text}");
        assert!(text.contains("\n01a20163-d     running"), "{text}");
        // Never a trailing dash, and a duplicate is printed whole.
        assert_eq!(
            unique_prefixes(&["abcdefgh-1", "abcdefgh-2"], 8),
            ["abcdefgh-1", "abcdefgh-2"]
        );
        assert_eq!(unique_prefixes(&["abc", "abc"], 8), ["abc", "abc"]);
    }
}
