//! A run's report (the wire type is `api::report::RunReport`): a pure fold over the run's
//! journal, like `report::status`, so a finished run and a running one share one code path
//! and the report says exactly what the journal holds.
//!
//! Every sum saturates: token counts and costs come from models and agents, and a journal
//! may hold the largest numbers its types allow.

use std::collections::{BTreeMap, BTreeSet};

use flotilla_actors::protocol::{
    Budget, Event, EventKind, FailureReason, Finding, FixOf, Handoff, Route, TaskId,
};

use crate::api::report::{
    LOWER_BOUND_MEASURE, LeftForUser, Makespan, MergeCounts, Percentiles, RunReport, Subtree,
    TASK_TIME_MEASURE, TaskCounts, TaskNote,
};
use crate::api::runs::state_name;
use crate::journal::RunRecord;

/// What the fold keeps about one task.
#[derive(Default)]
struct TaskFacts {
    description: String,
    is_fix: bool,
    conflict_fix: bool,
    retries: u64,
    decomposed: bool,
    first_start_ms: Option<u64>,
    completed_ms: Option<u64>,
    landed_via_fix: bool,
    failed: bool,
    cancelled: bool,
    spent: Budget,
    /// The running attempt: when it started, and whether a worker runs it.
    open_attempt: Option<(u64, bool)>,
    /// The route of the latest dispatch.
    worker_route: bool,
}

/// The top-level task `task` belongs to.
fn top(task: &TaskId) -> TaskId {
    let mut top = task.clone();
    while let Some(parent) = top.parent() {
        top = parent;
    }
    top
}

fn is_empty_diff(handoff: &Option<Handoff>) -> bool {
    handoff
        .as_ref()
        .is_some_and(|h| h.findings.iter().any(|f| matches!(f, Finding::EmptyDiff)))
}

/// The `p`th percentile (0 < p ≤ 100) of `sorted` by nearest rank; `None` when empty.
pub fn percentile(sorted: &[u64], p: u32) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len() as u128;
    let rank = (u128::from(p.min(100)) * n).div_ceil(100).max(1);
    let ix = usize::try_from(rank - 1).unwrap_or(usize::MAX);
    sorted.get(ix.min(sorted.len() - 1)).copied()
}

/// The run's report from its record, its journal and its worker slots (`max_workers`).
pub fn run_report(record: &RunRecord, worker_slots: usize, events: &[Event]) -> RunReport {
    let mut tasks: BTreeMap<TaskId, TaskFacts> = BTreeMap::new();
    let mut merges = MergeCounts::default();
    let mut spent = Budget::default();
    let mut planner_spent = Budget::default();
    let mut empty_diffs = 0u64;
    let mut failed_notes = Vec::new();
    let mut blocked_notes = Vec::new();
    let mut awaiting: BTreeSet<TaskId> = BTreeSet::new();
    let mut main_diverged = false;
    let mut work_ms = 0u64;
    let mut longest_attempt_ms = 0u64;
    let mut started_ms: Option<u64> = None;
    let mut finished: Option<(u64, String, Option<String>)> = None;
    let mut last_ms = 0u64;

    for e in events.iter().filter(|e| e.seq > 0) {
        let at = e.at_ms;
        last_ms = last_ms.max(at);
        started_ms.get_or_insert(at);
        // The end of a running attempt of `task`, for the work sum.
        let mut end_attempt = |tasks: &mut BTreeMap<TaskId, TaskFacts>, task: &TaskId| {
            if let Some((from, worker)) = tasks.get_mut(task).and_then(|t| t.open_attempt.take())
                && worker
            {
                let took = at.saturating_sub(from);
                work_ms = work_ms.saturating_add(took);
                longest_attempt_ms = longest_attempt_ms.max(took);
            }
        };
        match &e.kind {
            EventKind::RunStarted { .. } => started_ms = Some(at),
            EventKind::TaskAdded { task, spec, .. } => {
                let facts = tasks.entry(task.clone()).or_default();
                facts.description = spec.description.clone();
            }
            EventKind::FixTaskAdded {
                task, spec, fix, ..
            } => {
                let facts = tasks.entry(task.clone()).or_default();
                facts.description = spec.description.clone();
                facts.is_fix = true;
                match fix {
                    FixOf::Conflict { .. } => {
                        facts.conflict_fix = true;
                        merges.conflict_fixes = merges.conflict_fixes.saturating_add(1);
                    }
                    FixOf::Sweep { .. } => {
                        merges.sweep_fixes = merges.sweep_fixes.saturating_add(1);
                    }
                }
            }
            EventKind::TaskDispatched { task, route, .. } => {
                tasks.entry(task.clone()).or_default().worker_route = *route == Route::Worker;
            }
            EventKind::TaskStarted { task, .. } => {
                let facts = tasks.entry(task.clone()).or_default();
                facts.first_start_ms.get_or_insert(at);
                facts.open_attempt = Some((at, facts.worker_route));
            }
            EventKind::TaskRetried { task, .. } => {
                end_attempt(&mut tasks, task);
                let facts = tasks.entry(task.clone()).or_default();
                facts.retries = facts.retries.saturating_add(1);
            }
            EventKind::TaskInterrupted { task, .. } | EventKind::TaskAtomic { task, .. } => {
                end_attempt(&mut tasks, task)
            }
            EventKind::DecompositionAccepted { parent, .. } => {
                end_attempt(&mut tasks, parent);
                tasks.entry(parent.clone()).or_default().decomposed = true;
                awaiting.remove(parent);
            }
            EventKind::TaskCompleted { task, handoff, .. } => {
                end_attempt(&mut tasks, task);
                if is_empty_diff(handoff) {
                    empty_diffs = empty_diffs.saturating_add(1);
                }
                tasks.entry(task.clone()).or_default().completed_ms = Some(at);
                awaiting.remove(task);
            }
            EventKind::TaskLanding { task, handoff, .. } => {
                end_attempt(&mut tasks, task);
                if is_empty_diff(handoff) {
                    empty_diffs = empty_diffs.saturating_add(1);
                }
                merges.queued = merges.queued.saturating_add(1);
            }
            EventKind::TaskLanded { task, via, .. } => {
                let facts = tasks.entry(task.clone()).or_default();
                facts.completed_ms = Some(at);
                if via.is_some() {
                    facts.landed_via_fix = true;
                    merges.landed_via_fix = merges.landed_via_fix.saturating_add(1);
                } else {
                    merges.landed = merges.landed.saturating_add(1);
                }
                awaiting.remove(task);
            }
            EventKind::TaskFailed { task, reason, .. } => {
                end_attempt(&mut tasks, task);
                tasks.entry(task.clone()).or_default().failed = true;
                awaiting.remove(task);
                let note = TaskNote {
                    task: task.clone(),
                    why: reason.to_string(),
                };
                match reason {
                    FailureReason::Blocked { summary } => blocked_notes.push(TaskNote {
                        task: task.clone(),
                        why: summary.clone(),
                    }),
                    _ => failed_notes.push(note),
                }
            }
            EventKind::TaskCancelled { task, .. } => {
                end_attempt(&mut tasks, task);
                tasks.entry(task.clone()).or_default().cancelled = true;
                awaiting.remove(task);
            }
            EventKind::MergeConflict { retrying, .. } => {
                merges.conflicts = merges.conflicts.saturating_add(1);
                if *retrying {
                    merges.conflicts_retried = merges.conflicts_retried.saturating_add(1);
                }
            }
            EventKind::MergeGateFailed { .. } => {
                merges.gate_failures = merges.gate_failures.saturating_add(1);
            }
            EventKind::SweepFinished { report } => {
                merges.sweeps = merges.sweeps.saturating_add(1);
                if !report.green {
                    merges.red_sweeps = merges.red_sweeps.saturating_add(1);
                }
            }
            EventKind::SpendCharged {
                task, spent: more, ..
            } => {
                let facts = tasks.entry(task.clone()).or_default();
                facts.spent = facts.spent.saturating_add(*more);
                spent = spent.saturating_add(*more);
            }
            EventKind::SubplannerResponded { task, usage, .. } => {
                let facts = tasks.entry(task.clone()).or_default();
                facts.spent = facts.spent.saturating_add(usage.spent());
                spent = spent.saturating_add(usage.spent());
            }
            EventKind::PlannerResponded { usage, .. } => {
                planner_spent = planner_spent.saturating_add(usage.spent());
                spent = spent.saturating_add(usage.spent());
            }
            EventKind::AwaitingUserDecision { parent } => {
                awaiting.insert(parent.clone());
            }
            EventKind::LandingAllowed { task } => {
                awaiting.remove(task);
            }
            EventKind::MainDiverged { .. } => main_diverged = true,
            EventKind::MainMoved { .. } | EventKind::MainAdopted { .. } => main_diverged = false,
            EventKind::RunFinished { outcome, reason } => {
                finished = Some((at, state_name(Some(*outcome)).into(), reason.clone()));
                main_diverged = false;
                awaiting.clear();
            }
            _ => {}
        }
    }

    let mut counts = TaskCounts {
        total: tasks.len() as u64,
        empty_diffs,
        ..TaskCounts::default()
    };
    let mut times = Vec::new();
    let mut subtrees: BTreeMap<TaskId, Subtree> = BTreeMap::new();
    // Per subtree: its first start and last completion.
    let mut spans: BTreeMap<TaskId, (Option<u64>, Option<u64>)> = BTreeMap::new();
    for (id, t) in &tasks {
        let add = |n: &mut u64, yes: bool| *n = n.saturating_add(u64::from(yes));
        add(&mut counts.fix_tasks, t.is_fix);
        add(&mut counts.completed, t.completed_ms.is_some());
        add(
            &mut counts.completed_first_try,
            t.completed_ms.is_some() && t.retries == 0 && !t.landed_via_fix,
        );
        add(&mut counts.retried, t.retries > 0);
        counts.retries = counts.retries.saturating_add(t.retries);
        add(&mut counts.decomposed, t.decomposed);
        add(&mut counts.failed, t.failed);
        add(&mut counts.cancelled, t.cancelled);
        add(
            &mut counts.unfinished,
            t.completed_ms.is_none() && !t.failed && !t.cancelled,
        );
        add(
            &mut merges.conflict_fixes_completed,
            t.conflict_fix && t.completed_ms.is_some(),
        );
        if let (Some(from), Some(to), false) = (t.first_start_ms, t.completed_ms, t.decomposed) {
            times.push(to.saturating_sub(from));
        }
        let root = top(id);
        let description = tasks
            .get(&root)
            .map(|r| r.description.clone())
            .unwrap_or_default();
        let sub = subtrees.entry(root.clone()).or_insert_with(|| Subtree {
            root: root.clone(),
            description,
            tasks: 0,
            completed: 0,
            failed: 0,
            spent: Budget::default(),
            span_ms: None,
        });
        add(&mut sub.tasks, true);
        add(&mut sub.completed, t.completed_ms.is_some());
        add(&mut sub.failed, t.failed);
        sub.spent = sub.spent.saturating_add(t.spent);
        let span = spans.entry(root).or_default();
        span.0 = match (span.0, t.first_start_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        span.1 = span.1.max(t.completed_ms);
    }
    for (root, (from, to)) in spans {
        if let (Some(sub), Some(from), Some(to)) = (subtrees.get_mut(&root), from, to) {
            sub.span_ms = Some(to.saturating_sub(from));
        }
    }
    times.sort_unstable();
    let queued = merges.queued;
    merges.success_rate = (queued > 0).then(|| {
        let landed = merges.landed.saturating_add(merges.landed_via_fix);
        (landed.min(queued) as f64) / (queued as f64)
    });

    let slots = worker_slots.max(1) as u64;
    let (end_ms, state, reason) = match finished {
        Some((at, state, reason)) => (at, state, reason),
        None => (last_ms, state_name(None).into(), None),
    };
    let makespan = Makespan {
        makespan_ms: end_ms.saturating_sub(started_ms.unwrap_or(end_ms)),
        lower_bound: LOWER_BOUND_MEASURE.into(),
        lower_bound_ms: work_ms.div_ceil(slots).max(longest_attempt_ms),
        work_ms,
        longest_attempt_ms,
        worker_slots: slots,
    };
    RunReport {
        id: record.id.to_string(),
        request: record.request.clone(),
        state,
        reason,
        tasks: counts,
        merges,
        spent,
        planner_spent,
        task_time: Percentiles {
            measure: TASK_TIME_MEASURE.into(),
            count: times.len() as u64,
            p50_ms: percentile(&times, 50),
            p90_ms: percentile(&times, 90),
            max_ms: times.last().copied(),
        },
        subtrees: subtrees.into_values().collect(),
        makespan,
        left_for_user: LeftForUser {
            failed: failed_notes,
            blocked: blocked_notes,
            awaiting_decision: awaiting.into_iter().collect(),
            main_diverged,
        },
    }
}

#[cfg(test)]
#[path = "run_report_tests.rs"]
mod tests;
