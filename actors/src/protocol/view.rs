//! Read-only views of a run, for status output, the API and tests.
//!
//! `GraphSnapshot` is the one such view (status, the planner's `GetSnapshot`, tests).

use serde::{Deserialize, Serialize};

use super::event::RunOutcome;
use super::failure::FailureReason;
use super::ids::TaskId;
use super::review::LastReview;
use super::task::{Budget, Priority, TaskState};

/// A serializable view of the whole graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphSnapshot {
    pub tasks: Vec<TaskView>,
    pub planning_finished: bool,
    pub outcome: Option<RunOutcome>,
    /// What the run spent so far (every task's charged spend plus the planner's usage), and
    /// what it may spend.
    #[serde(default)]
    pub run_spent: Budget,
    #[serde(default)]
    pub run_budget: Budget,
    /// Why the run finished as it did (see `EventKind::RunFinished`).
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskView {
    pub id: TaskId,
    pub state: TaskState,
    pub attempt: u32,
    pub description: String,
    pub scope: Vec<String>,
    pub priority: Priority,
    pub parent: Option<TaskId>,
    pub depends_on: Vec<TaskId>,
    pub budget: Budget,
    pub spent: Budget,
    pub summary: Option<String>,
    pub failure: Option<FailureReason>,
    /// The reviewer's last verdict on it, when a reviewer read its work (ADR-038).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review: Option<LastReview>,
}
