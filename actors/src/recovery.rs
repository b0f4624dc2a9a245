//! What a run's journal says its actors must pick up again when the run is started from it
//! (a restart after a member died, the daemon's start): the conversations to resume, what
//! the TaskGraph must redo, which worktrees and branches the WorkerPool's first sweep keeps,
//! and the provider pauses still open. Pure code over the journaled events (and the graph
//! they replay to): no actor, no I/O, no clock. The daemon's supervisor wires the result
//! into the run's actors; this module must not know the daemon, git or the journal's
//! storage.

use std::collections::HashMap;

use crate::actors::{Exchange, RecordedExchange, Recovery};
use crate::graph::RunGraph;
use crate::protocol::{
    Event, EventKind, Role, RootHandoff, RunId, TaskState, ToolRound, branch_name,
};

/// Everything a (re)started run's actors take from its journal.
#[derive(Debug, Default)]
pub struct RunRecovery {
    /// Restarts after a member died, as journaled (`RunRestarted`): what `max_run_restarts`
    /// is counted against, across daemon restarts too.
    pub restarts: u32,
    /// The Planner's conversation so far (`PlannerResponded`), so it is not asked again.
    pub conversation: Vec<Exchange>,
    /// The Subplanner's conversations so far (`SubplannerResponded`).
    pub subplanner_conversations: Vec<RecordedExchange>,
    /// The tool rounds (`ToolsRan`) of planning calls the journal has no answer for: the
    /// resumed call replays them (ADR-037).
    pub tool_rounds: Vec<ToolRound>,
    /// What the TaskGraph must redo; `None` for a run whose journal holds only its start.
    pub resume: Option<Recovery>,
    /// Branches of parents waiting for their subtasks or synthesizing: their worktrees are
    /// where the synthesis runs, so the first sweep keeps them.
    pub synthesizing: Vec<String>,
    /// Branches the journal says were delivered (`TaskCompleted` with work, or handed to the
    /// merge queue, `TaskLanding`): the first sweep deletes any other branch of the run.
    pub delivered: Vec<String>,
    /// Branches of the run's failed attempts: what `[worktrees] keep_failed` keeps.
    pub failed_attempts: Vec<String>,
    /// Branches of failed attempts that a task's next attempt may continue from (its
    /// retry is pending or was interrupted): what `[worktrees] retry_in_place` keeps.
    pub continued: Vec<String>,
    /// Providers whose journaled pause (`ProviderPauseStarted`) has no `ProviderResumed`
    /// yet: until when (ms since the epoch).
    pub provider_pauses: HashMap<String, u64>,
}

/// Reads `journal` (all of the run's events, in order; `graph` is what they replay to) as
/// of `now_ms`.
pub fn run_recovery(run: RunId, graph: &RunGraph, journal: &[Event], now_ms: u64) -> RunRecovery {
    let kinds = || journal.iter().map(|e| &e.kind);
    let restarts = kinds()
        .filter(|k| matches!(k, EventKind::RunRestarted { .. }))
        .count();
    // An answer not used (unusable, or its batch refused right after it) is continued as
    // the excerpt it was when the run stopped (ADR-030).
    let mut conversation: Vec<Exchange> = Vec::new();
    for kind in kinds() {
        match kind {
            EventKind::PlannerResponded {
                prompt,
                content,
                error,
                ..
            } => conversation.push(Exchange::new(
                prompt.clone(),
                content.clone(),
                error.clone(),
            )),
            EventKind::TasksRejected { reason } => {
                if let Some(last) = conversation.last_mut().filter(|e| e.unused.is_none()) {
                    let kept = std::mem::take(last);
                    *last = Exchange::new(
                        kept.prompt,
                        kept.answer,
                        Some(format!("the batch was refused: {reason}")),
                    );
                }
            }
            _ => {}
        }
    }
    let synthesizing = graph
        .tasks()
        .filter(|n| {
            !n.subplanned
                && matches!(
                    n.state,
                    TaskState::WaitingForSubtasks | TaskState::Synthesizing
                )
        })
        .map(|n| branch_name(run, &n.id, n.attempt))
        .collect();
    // A crash between a Worker releasing its worktree and its report being journaled leaves
    // a branch that was never delivered. A `Landing` task is enqueued again after the
    // restart and lands from its branch: delivered too.
    let delivered = delivered_branches(kinds());
    // A task with a pending retry (or one a restart interrupted) still has its previous
    // attempt: a continuable failure's branch is where that retry starts (ADR-031).
    let continued = graph
        .tasks()
        .filter(|n| {
            matches!(
                n.state,
                TaskState::Ready | TaskState::Dispatched | TaskState::Running
            )
        })
        .filter_map(|n| {
            let previous = n.previous.as_ref().filter(|p| p.continuable())?;
            Some(branch_name(run, &n.id, previous.attempt()))
        })
        .collect();
    RunRecovery {
        restarts: u32::try_from(restarts).unwrap_or(u32::MAX),
        conversation,
        subplanner_conversations: RecordedExchange::from_journal(kinds()),
        tool_rounds: unanswered_tool_rounds(kinds()),
        resume: (journal.len() > 1).then(|| recovery(graph, journal, now_ms)),
        synthesizing,
        delivered,
        failed_attempts: failed_attempts(run, kinds()),
        continued,
        provider_pauses: open_provider_pauses(kinds()),
    }
}

/// What the replayed journal says the resumed TaskGraph must redo: root handoffs the planner
/// had not read (journaled after its last answer), and the deadlines of decompositions still
/// waiting, from now (0 when already due).
pub fn recovery(graph: &RunGraph, journal: &[Event], now_ms: u64) -> Recovery {
    let last_plan = journal
        .iter()
        .rposition(|e| matches!(e.kind, EventKind::PlannerResponded { .. }));
    let unread_handoffs = journal[last_plan.map_or(0, |i| i + 1)..]
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TaskCompleted { task, .. }
            | EventKind::TaskFailed { task, .. }
            | EventKind::TaskCancelled { task, .. }
                if task.depth() == 1 =>
            {
                graph.task(task).map(|n| RootHandoff {
                    task: task.clone(),
                    state: n.state,
                    description: n.spec.description.clone(),
                    handoff: n.handoff.as_deref().cloned(),
                    failure: n.failure.as_deref().cloned(),
                })
            }
            _ => None,
        })
        .collect();
    let deadlines_in_ms = graph
        .tasks_in(TaskState::WaitingForSubtasks)
        .into_iter()
        .filter_map(|task| {
            let accepted_at = journal.iter().rev().find_map(|e| match &e.kind {
                EventKind::DecompositionAccepted { parent, .. } if *parent == task => Some(e.at_ms),
                _ => None,
            })?;
            let due = accepted_at.saturating_add(graph.deadline_ms(&task)?);
            Some((task, due.saturating_sub(now_ms)))
        })
        .collect();
    Recovery {
        unread_handoffs,
        deadlines_in_ms,
    }
}

/// The tool rounds of the calls without a recorded answer, in order.
pub fn unanswered_tool_rounds<'a>(
    events: impl IntoIterator<Item = &'a EventKind>,
) -> Vec<ToolRound> {
    let mut rounds: Vec<ToolRound> = Vec::new();
    for kind in events {
        match kind {
            EventKind::ToolsRan { tools } => rounds.push(tools.clone()),
            EventKind::PlannerResponded { call, .. } => {
                rounds.retain(|r| !(r.of(Role::Planner, None, 0) && r.call == *call));
            }
            EventKind::SubplannerResponded {
                task,
                attempt,
                call,
                ..
            } => rounds
                .retain(|r| !(r.of(Role::Subplanner, Some(task), *attempt) && r.call == *call)),
            _ => {}
        }
    }
    rounds
}

/// The branches the journal says were delivered (`TaskCompleted` with work, or handed to
/// the merge queue, `TaskLanding`): a sweep given them deletes any other branch of the run.
pub fn delivered_branches<'a>(events: impl IntoIterator<Item = &'a EventKind>) -> Vec<String> {
    events
        .into_iter()
        .filter_map(|kind| match kind {
            EventKind::TaskCompleted {
                handoff: Some(h), ..
            } => h.work.as_ref().map(|w| w.branch.clone()),
            EventKind::TaskLanding { branch, .. } => Some(branch.clone()),
            _ => None,
        })
        .collect()
}

/// The branches of the run's attempts that failed (retried or failed for good), as the
/// journal has them: what `[worktrees] keep_failed` keeps, at a restart and at the run's end.
pub fn failed_attempts<'a>(
    run: RunId,
    events: impl IntoIterator<Item = &'a EventKind>,
) -> Vec<String> {
    events
        .into_iter()
        .filter_map(|kind| match kind {
            EventKind::TaskRetried { task, attempt, .. }
            | EventKind::TaskFailed { task, attempt, .. } => Some(branch_name(run, task, *attempt)),
            _ => None,
        })
        .collect()
}

/// The provider pauses the journal has open (a daemon stopped during one): provider → until
/// when (ms since the epoch).
pub fn open_provider_pauses<'a>(
    events: impl IntoIterator<Item = &'a EventKind>,
) -> HashMap<String, u64> {
    let mut open = HashMap::new();
    for kind in events {
        match kind {
            EventKind::ProviderPauseStarted {
                provider, until_ms, ..
            } => {
                open.insert(provider.clone(), *until_ms);
            }
            EventKind::ProviderResumed { provider } => {
                open.remove(provider);
            }
            _ => {}
        }
    }
    open
}

#[cfg(test)]
#[path = "recovery_tests.rs"]
mod tests;
