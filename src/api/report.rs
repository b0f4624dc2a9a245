//! A run's report (`GET /v1/runs/{id}/report`, `flotilla report RUN`): what happened to its
//! tasks, what it cost, how long it took against a lower bound, and what is left for the
//! user. Computed by the daemon from the run's journal (`daemon::run_report`).

use flotilla_actors::protocol::{Budget, TaskId};
use serde::{Deserialize, Serialize};

/// How each duration below is measured, said in the report itself so that nobody has to
/// guess: a task's time runs from its first `task_started` to the event that completed it
/// (`task_landed`, or `task_completed` for work with nothing to land), for tasks that did
/// their work themselves (a decomposed parent's time is its subtree's).
pub const TASK_TIME_MEASURE: &str =
    "from first start to landed, or to completed when nothing lands";
/// How the makespan's lower bound is computed.
pub const LOWER_BOUND_MEASURE: &str =
    "total worker-attempt time / worker slots, at least the longest attempt";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    pub id: String,
    pub request: String,
    /// `running`, `completed`, `failed`, `cancelled`.
    pub state: String,
    /// Why the run ended as it did, when the journal says.
    #[serde(default)]
    pub reason: Option<String>,
    pub tasks: TaskCounts,
    pub merges: MergeCounts,
    /// Everything the run spent: its tasks, Subplanner and planner calls.
    pub spent: Budget,
    /// What the root planner's calls spent (part of `spent`).
    pub planner_spent: Budget,
    pub task_time: Percentiles,
    /// Per top-level task (`t1`, `f1`, …) and everything below it.
    pub subtrees: Vec<Subtree>,
    pub makespan: Makespan,
    pub left_for_user: LeftForUser,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCounts {
    /// Every task that entered the graph, fix tasks included.
    pub total: u64,
    /// flotilla's own fix tasks (conflict fixes and sweep fixes), part of `total`.
    pub fix_tasks: u64,
    /// Tasks whose work is on main (or completed with nothing to land).
    pub completed: u64,
    /// Of those, how many did it on their first attempt.
    pub completed_first_try: u64,
    /// Tasks that needed more than one attempt (retries, not interruptions).
    pub retried: u64,
    /// Every `task_retried`.
    pub retries: u64,
    /// Tasks decomposed into subtasks.
    pub decomposed: u64,
    /// Deliveries whose branch changed nothing (`empty_diff` finding).
    pub empty_diffs: u64,
    pub failed: u64,
    pub cancelled: u64,
    /// Added, not yet ended (a running run's).
    pub unfinished: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MergeCounts {
    /// Branches that went to the merge queue (`task_landing`).
    pub queued: u64,
    /// Tasks whose own branch landed.
    pub landed: u64,
    /// Tasks that landed through a conflict fix.
    pub landed_via_fix: u64,
    /// `merge_conflict` events, and how many of them were retried later in the queue.
    pub conflicts: u64,
    pub conflicts_retried: u64,
    /// Conflict-fix tasks made, and how many of them completed.
    pub conflict_fixes: u64,
    pub conflict_fixes_completed: u64,
    /// `merge_gate_failed` events (bisections and flaky retries included).
    pub gate_failures: u64,
    /// Sweeps of main, the red ones, and the fix tasks the sweeps made.
    pub sweeps: u64,
    pub red_sweeps: u64,
    pub sweep_fixes: u64,
    /// (`landed` + `landed_via_fix`) / `queued`; absent when nothing was queued.
    pub success_rate: Option<f64>,
}

/// Nearest-rank percentiles of task times, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Percentiles {
    /// What is measured (`TASK_TIME_MEASURE`).
    pub measure: String,
    pub count: u64,
    pub p50_ms: Option<u64>,
    pub p90_ms: Option<u64>,
    pub max_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Subtree {
    pub root: TaskId,
    /// The top-level task's description, as the model wrote it (escape before showing).
    pub description: String,
    pub tasks: u64,
    pub completed: u64,
    pub failed: u64,
    pub spent: Budget,
    /// From the subtree's first start to its last completion; absent until one ended.
    pub span_ms: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Makespan {
    /// `run_started` to `run_finished` (to the last event, while running).
    pub makespan_ms: u64,
    /// What `lower_bound_ms` is (`LOWER_BOUND_MEASURE`).
    pub lower_bound: String,
    pub lower_bound_ms: u64,
    /// The summed time of every worker attempt, and the longest one.
    pub work_ms: u64,
    pub longest_attempt_ms: u64,
    pub worker_slots: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LeftForUser {
    /// Tasks that failed (not blocked), with why.
    pub failed: Vec<TaskNote>,
    /// Tasks whose agent said it cannot proceed, with what it said.
    pub blocked: Vec<TaskNote>,
    /// Tasks waiting for `flotilla decide`.
    pub awaiting_decision: Vec<TaskId>,
    /// main moved under flotilla and landing waits for `flotilla decide --adopt-main`.
    pub main_diverged: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskNote {
    pub task: TaskId,
    /// The failure's text, which may quote an agent (escape before showing).
    pub why: String,
}

impl LeftForUser {
    pub fn is_empty(&self) -> bool {
        self.failed.is_empty()
            && self.blocked.is_empty()
            && self.awaiting_decision.is_empty()
            && !self.main_diverged
    }
}
