//! The run-level event. Every state change of a run is one `EventKind`; the journal stores
//! them (it assigns `seq` and `at_ms`), the in-memory task graph is a fold over them, the API
//! streams them and `flotilla tail` prints them. One type for all four, so they cannot drift.

use serde::{Deserialize, Serialize};

use super::handoff::{ArtifactRef, Handoff, Usage};
use super::ids::{RunId, TaskId};
use super::messages::Route;
use super::subplan::{DecompositionReason, RejectionReason, StopCondition};
use super::task::{Budget, TaskSpec, TaskState};

/// A journaled event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Monotonic per journal; the SSE `id:`.
    pub seq: u64,
    pub run: RunId,
    /// Milliseconds since the Unix epoch, from the journal's clock.
    pub at_ms: u64,
    #[serde(flatten)]
    pub kind: EventKind,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "data", rename_all = "snake_case")]
pub enum EventKind {
    RunStarted {
        request: String,
    },
    /// One root-planner LLM call, recorded before its tasks are submitted, so that recovery
    /// rebuilds the conversation instead of asking again. `error` is set when the answer
    /// could not be used (its tasks, if any, were not submitted).
    PlannerResponded {
        call: u32,
        prompt: String,
        content: String,
        usage: Usage,
        error: Option<String>,
    },
    /// The planner stopped after too many consecutive errors; the run will fail.
    PlannerGaveUp {
        error: String,
    },
    /// A task entered the graph. `spec` is normalized; `depends_on` are resolved ids.
    TaskAdded {
        task: TaskId,
        spec: TaskSpec,
        budget: Budget,
        depends_on: Vec<TaskId>,
    },
    /// A planner batch was refused as a whole; nothing was inserted.
    TasksRejected {
        reason: RejectionReason,
    },
    TaskReady {
        task: TaskId,
    },
    TaskDispatched {
        task: TaskId,
        attempt: u32,
        profile: String,
        route: Route,
    },
    TaskStarted {
        task: TaskId,
        attempt: u32,
    },
    /// The attempt failed and the task goes back to Ready as attempt `attempt + 1`.
    TaskRetried {
        task: TaskId,
        attempt: u32,
        error: String,
    },
    /// The daemon stopped while the attempt was in flight; the task goes back to Ready as
    /// attempt `attempt + 1` without being charged a retry.
    TaskInterrupted {
        task: TaskId,
        attempt: u32,
    },
    TaskCompleted {
        task: TaskId,
        attempt: u32,
        handoff: Option<Handoff>,
        artifacts: Vec<ArtifactRef>,
    },
    TaskFailed {
        task: TaskId,
        attempt: u32,
        reason: FailureReason,
    },
    TaskCancelled {
        task: TaskId,
        was: TaskState,
        reason: String,
    },
    /// The parent's subplan was inserted (its `TaskAdded` events precede this one); the
    /// parent now waits for them.
    DecompositionAccepted {
        parent: TaskId,
        attempt: u32,
        reason: DecompositionReason,
        stop_when: StopCondition,
        subtasks: Vec<TaskId>,
        /// Partial work delivered together with the proposal.
        handoff: Option<Handoff>,
        artifacts: Vec<ArtifactRef>,
    },
    DecompositionRejected {
        parent: TaskId,
        attempt: u32,
        reason: RejectionReason,
    },
    /// The stop condition holds; the parent's agent is synthesizing.
    SubtasksCompleted {
        parent: TaskId,
    },
    /// Every subtask ended; a human must decide (`flotilla` sends `UserDecision`).
    AwaitingUserDecision {
        parent: TaskId,
    },
    /// A message that could not apply (late, stale attempt, unknown task). Nothing changed.
    MessageIgnored {
        task: Option<TaskId>,
        message: String,
        why: String,
    },
    PlanningFinished,
    /// The whole run is being cancelled; the cancellations of its tasks follow.
    RunCancelRequested {
        reason: String,
    },
    RunFinished {
        outcome: RunOutcome,
    },
}

impl EventKind {
    /// The snake_case name used as the journal's `kind` column and the SSE `event:` field.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::RunStarted { .. } => "run_started",
            EventKind::PlannerResponded { .. } => "planner_responded",
            EventKind::PlannerGaveUp { .. } => "planner_gave_up",
            EventKind::TaskInterrupted { .. } => "task_interrupted",
            EventKind::TaskAdded { .. } => "task_added",
            EventKind::TasksRejected { .. } => "tasks_rejected",
            EventKind::TaskReady { .. } => "task_ready",
            EventKind::TaskDispatched { .. } => "task_dispatched",
            EventKind::TaskStarted { .. } => "task_started",
            EventKind::TaskRetried { .. } => "task_retried",
            EventKind::TaskCompleted { .. } => "task_completed",
            EventKind::TaskFailed { .. } => "task_failed",
            EventKind::TaskCancelled { .. } => "task_cancelled",
            EventKind::DecompositionAccepted { .. } => "decomposition_accepted",
            EventKind::DecompositionRejected { .. } => "decomposition_rejected",
            EventKind::SubtasksCompleted { .. } => "subtasks_completed",
            EventKind::AwaitingUserDecision { .. } => "awaiting_user_decision",
            EventKind::MessageIgnored { .. } => "message_ignored",
            EventKind::PlanningFinished => "planning_finished",
            EventKind::RunCancelRequested { .. } => "run_cancel_requested",
            EventKind::RunFinished { .. } => "run_finished",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cause", rename_all = "snake_case")]
pub enum FailureReason {
    /// The agent failed and the task has no attempts left.
    AgentFailed { error: String },
    /// The worker's handoff said `blocked`; retrying would not help.
    Blocked { summary: String },
    /// A subtask failed under `AllSubtasksComplete`.
    SubtaskFailed { subtask: TaskId },
    /// Every subtask ended under `FirstSuccess` and none completed.
    NoSubtaskSucceeded,
    /// The subtasks were not all finished within the decomposition deadline.
    DecompositionDeadline { deadline_ms: u64 },
    /// A human declined to proceed after the subtasks ended.
    UserDeclined,
    /// No worker profile offers the capabilities the task needs.
    Undispatchable { reason: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    Completed,
    Failed,
    Cancelled,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_serialize_with_kind_and_data_and_round_trip() {
        let e = Event {
            seq: 7,
            run: RunId::generate(),
            at_ms: 1,
            kind: EventKind::TaskReady {
                task: TaskId::root(1),
            },
        };
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["kind"], "task_ready");
        assert_eq!(json["data"]["task"], "t1");
        assert_eq!(json["kind"], e.kind.name());
        let back: Event = serde_json::from_value(json).unwrap();
        assert_eq!(back, e);
    }
}
