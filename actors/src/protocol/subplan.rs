//! ADR-009 progressive decomposition: an agent may answer a task with a [`ProposedSubplan`]
//! instead of (or alongside) its deliverable. The task graph validates it and replies
//! [`TaskDecompositionAccepted`] or [`TaskDecompositionRejected`] with a typed
//! [`RejectionReason`]; when the subtasks are done the parent's agent receives
//! [`SubtasksCompleted`] and synthesizes the final result.
//!
//! Also `SubtaskProposal`, `StopCondition`, `RejectionReason` (one variant per validation
//! rule) and `UserDecision` (accept a subtask / complete / fail).

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::failure::FailureReason;
use super::handoff::Handoff;
use super::ids::TaskId;
use super::task::ArtifactKind;
use super::task::{Budget, Priority, TaskSpec, TaskState};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProposedSubplan {
    /// Must equal the task the proposal answers; a mismatch is rejected.
    pub parent: TaskId,
    pub reason: DecompositionReason,
    pub subtasks: Vec<SubtaskProposal>,
    #[serde(default)]
    pub stop_when: StopCondition,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecompositionReason {
    TooLarge,
    MissingInfo,
    DependencyDiscovered,
    Ambiguity,
    ExternalToolRequired,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubtaskProposal {
    pub description: String,
    pub scope: Vec<String>,
    #[serde(default)]
    pub acceptance: String,
    #[serde(default)]
    pub capabilities: BTreeSet<String>,
    /// Indexes of sibling subtasks in the same proposal that must complete first.
    #[serde(default)]
    pub depends_on: Vec<usize>,
    /// `None`: share what the capped siblings leave of the parent's remaining budget.
    #[serde(default)]
    pub budget_cap: Option<Budget>,
    #[serde(default)]
    pub expected_outputs: Vec<ArtifactKind>,
    /// `None` inherits the parent's priority.
    #[serde(default)]
    pub priority: Option<Priority>,
}

impl SubtaskProposal {
    pub fn new(description: impl Into<String>, scope: &[&str]) -> Self {
        SubtaskProposal {
            description: description.into(),
            scope: scope.iter().map(|s| s.to_string()).collect(),
            acceptance: String::new(),
            capabilities: BTreeSet::new(),
            depends_on: Vec::new(),
            budget_cap: None,
            expected_outputs: Vec::new(),
            priority: None,
        }
    }

    pub fn after(mut self, deps: &[usize]) -> Self {
        self.depends_on = deps.to_vec();
        self
    }
}

/// When a parent's subtasks count as done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopCondition {
    /// Every subtask completed; any failure fails the parent.
    #[default]
    AllSubtasksComplete,
    /// Exploration: the first completed subtask wins and its siblings are cancelled.
    FirstSuccess,
    /// A human decides once every subtask has ended.
    UserDecision,
}

/// A human's answer for a parent whose stop condition is [`StopCondition::UserDecision`],
/// once every subtask has ended. Serialized as `{"decision": "accept", "subtask": "t4.2"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum UserDecision {
    /// The parent completes with this (completed) subtask's handoff as its result; no
    /// synthesis.
    Accept { subtask: TaskId },
    /// The parent's agent synthesizes the subtasks' results, as when the stop condition holds.
    Complete,
    /// The parent fails with `FailureReason::UserDeclined`.
    Fail,
    /// A `Landing` task held because its work changes flotilla's own configuration goes to
    /// the merge queue (ADR-016).
    Land,
}

/// Sent to the proposer when its subplan was inserted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskDecompositionAccepted {
    pub parent: TaskId,
    pub subtasks: Vec<TaskId>,
}

/// Sent to the proposer when its subplan was refused; the graph is unchanged and the task is
/// still the proposer's to finish or to propose again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskDecompositionRejected {
    pub parent: TaskId,
    pub reason: RejectionReason,
}

/// Sent to the parent's agent when the stop condition holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubtasksCompleted {
    pub parent: TaskId,
    /// The parent's attempt, for the synthesis report.
    pub attempt: u32,
    pub results: Vec<SubtaskResult>,
    /// What the parent has left of its budget: the synthesis must fit in it.
    #[serde(default)]
    pub budget: Budget,
    /// The parent's scope (as in its spec): what the synthesis may change.
    #[serde(default)]
    pub scope: Vec<String>,
    /// The worker profile of the attempt that proposed the subplan: the synthesis runs on
    /// the same kind of agent.
    #[serde(default)]
    pub profile: String,
}

/// Sent to the Subplanner when a subtask of its open decomposition ended: it replans after
/// every subtask handoff.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubtaskEnded {
    pub parent: TaskId,
    pub attempt: u32,
    pub result: SubtaskResult,
}

/// After a restart: a Subplanner decomposition that is still open, for the Subplanner to
/// pick up where its journaled conversation left off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenDecomposition {
    pub parent: TaskId,
    pub attempt: u32,
    pub spec: Arc<TaskSpec>,
    /// Subtasks still live, with their descriptions.
    pub active: Vec<(TaskId, String)>,
    /// Subtasks that ended and whose handoffs no recorded prompt carried yet.
    pub unheard: Vec<SubtaskResult>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubtaskResult {
    pub task: TaskId,
    pub state: TaskState,
    pub handoff: Option<Handoff>,
    /// Why it failed, when it did (a blocked worker's summary is here: a failed task keeps
    /// no handoff).
    #[serde(default)]
    pub failure: Option<FailureReason>,
}

/// Why a path in a scope was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
pub enum PathProblem {
    #[error("the path is empty")]
    Empty,
    #[error("the path is absolute")]
    Absolute,
    #[error("the path climbs out with '..'")]
    ParentTraversal,
    #[error("the path is inside .git")]
    GitDirectory,
    #[error("the path contains a backslash or a control character")]
    BadCharacter,
    #[error("the path is too long")]
    TooLong,
}

/// Why a proposal (or a planner's batch) was refused. One variant per validation rule, so that
/// the proposer (and a test) can tell exactly which rule fired. `subtask` is the 0-based index
/// of the offending item in the proposal or batch.
///
/// The same reasons answer an agent's subplan and a planner's batch, and the message does not
/// know which: it names an item as "proposed task N" (its 0-based index in the list the
/// proposer sent), which reads right for both a subplan's subtasks and a batch's tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum RejectionReason {
    /// Rule (a).
    #[error("{proposed} subtasks proposed; at most {max} are allowed")]
    TooManySubtasks { proposed: usize, max: usize },
    /// Rule (b).
    #[error("subtasks would sit at depth {depth}; the maximum is {max}")]
    DepthExceeded { depth: u32, max: u32 },
    /// Rule (c).
    #[error("the run would hold {would_hold} tasks; the maximum is {max}")]
    NodeLimitExceeded { would_hold: usize, max: usize },
    /// Rule (d).
    #[error("subtask budgets need {needed} but the parent has {remaining} left")]
    BudgetExceeded { needed: Budget, remaining: Budget },
    /// Rule (d): one task may not be given more than `Limits::max_task_budget` in any
    /// dimension. Refused, never clamped: the proposer learns the limit and can plan for it.
    #[error("proposed task {subtask} asks for {asked}; one task may have at most {max}")]
    TaskBudgetTooLarge {
        subtask: usize,
        asked: Budget,
        max: Budget,
    },
    /// Rule (e).
    #[error(
        "proposed task {subtask} depends on {dependency}, which is not an index in the same list"
    )]
    DependencyOutOfRange { subtask: usize, dependency: usize },
    /// Rule (e).
    #[error("proposed task {subtask} depends on itself")]
    SelfDependency { subtask: usize },
    /// Rule (e).
    #[error("proposed tasks {cycle:?} depend on each other in a cycle")]
    DependencyCycle { cycle: Vec<usize> },
    /// Rule (f).
    #[error("proposed task {subtask}'s path {path:?} is outside the parent's scope")]
    ScopeOutsideParent { subtask: usize, path: String },
    /// Rule (f).
    #[error(
        "proposed tasks {first} and {second} both touch {path:?} and neither depends on the other"
    )]
    ScopeOverlap {
        first: usize,
        second: usize,
        path: String,
    },
    /// Rule (f), for a further batch of an open decomposition: a new subtask may not touch
    /// what a running sibling is changing. Plan it after that sibling's handoff.
    #[error(
        "proposed task {subtask}'s path {path:?} overlaps the scope of {sibling}, which is still running; plan it after {sibling}'s handoff"
    )]
    ScopeOverlapsLiveSubtask {
        subtask: usize,
        sibling: TaskId,
        path: String,
    },
    /// Rule (g).
    #[error("proposed task {subtask}'s path {path:?} is invalid: {problem}")]
    InvalidPath {
        subtask: usize,
        path: String,
        problem: PathProblem,
    },
    /// Rule (g).
    #[error("proposed task {subtask} has an empty scope")]
    EmptyScope { subtask: usize },
    /// Rule (h).
    #[error("proposed task {subtask} duplicates {existing}")]
    DuplicateTask { subtask: usize, existing: String },
    /// Rule (i).
    #[error("this task attempt has already proposed {max} subplans")]
    AttemptDecompositionCap { max: u32 },
    /// Rule (i).
    #[error("this run has already accepted {max} decompositions")]
    RunDecompositionCap { max: u32 },
    /// A submitted batch refers to a task that does not exist in this run.
    #[error("proposed task {subtask} depends on {task}, which does not exist in this run")]
    UnknownDependency { subtask: usize, task: String },
    #[error("the proposal contains no subtasks")]
    NoSubtasks,
    #[error("proposed task {subtask} has an empty description")]
    EmptyDescription { subtask: usize },
    /// The Subplanner's subtasks need acceptance criteria (prompts/subplanner.md says so):
    /// a worker without them cannot tell when it is done (ADR-032).
    #[error(
        "proposed task {subtask} has no acceptance criteria; say how to check it is done (the command to run and its result, the tests that must pass)"
    )]
    EmptyAcceptance { subtask: usize },
    #[error("proposed task {subtask}'s {field} is {size} bytes/items; the limit is {max}")]
    PayloadTooLarge {
        subtask: usize,
        field: String,
        size: usize,
        max: usize,
    },
    #[error("the proposal names parent {named} but answers task {actual}")]
    ParentMismatch { named: TaskId, actual: TaskId },
    #[error("the parent is {state}; only a running task can be decomposed")]
    ParentNotRunning { state: TaskState },
    /// A further batch for a decomposition that is not open (closed, or not the
    /// Subplanner's).
    #[error("the parent's decomposition takes no more subtasks")]
    DecompositionNotOpen,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch's and a subplan's refusals come from the same reasons: every message that
    /// names an item by index says "proposed task N", never a subplan's or a batch's noun
    /// (a refused batch used to read "subtask 0", a refused subplan "item 0").
    #[test]
    fn rejections_name_items_the_same_way_for_batches_and_subplans() {
        let by_index = [
            RejectionReason::TaskBudgetTooLarge {
                subtask: 0,
                asked: Budget::new(u64::MAX, Default::default(), 1),
                max: Budget::new(1, Default::default(), 1),
            },
            RejectionReason::DependencyOutOfRange {
                subtask: 0,
                dependency: 7,
            },
            RejectionReason::SelfDependency { subtask: 0 },
            RejectionReason::ScopeOutsideParent {
                subtask: 0,
                path: "b".into(),
            },
            RejectionReason::InvalidPath {
                subtask: 0,
                path: "../x".into(),
                problem: PathProblem::ParentTraversal,
            },
            RejectionReason::EmptyScope { subtask: 0 },
            RejectionReason::DuplicateTask {
                subtask: 0,
                existing: "t1".into(),
            },
            RejectionReason::UnknownDependency {
                subtask: 0,
                task: "t9".into(),
            },
            RejectionReason::EmptyDescription { subtask: 0 },
            RejectionReason::PayloadTooLarge {
                subtask: 0,
                field: "description".into(),
                size: 9,
                max: 1,
            },
        ];
        for reason in by_index {
            let text = reason.to_string();
            assert!(text.starts_with("proposed task 0"), "{text}");
            assert!(
                !text.contains("item ") && !text.contains("subtask"),
                "{text}"
            );
        }
        assert_eq!(
            RejectionReason::InvalidPath {
                subtask: 0,
                path: "../x".into(),
                problem: PathProblem::ParentTraversal
            }
            .to_string(),
            r#"proposed task 0's path "../x" is invalid: the path climbs out with '..'"#
        );
        for pair in [
            RejectionReason::ScopeOverlap {
                first: 0,
                second: 1,
                path: "a".into(),
            },
            RejectionReason::DependencyCycle { cycle: vec![0, 1] },
        ] {
            let text = pair.to_string();
            assert!(text.starts_with("proposed tasks "), "{text}");
        }
    }

    #[test]
    fn user_decisions_are_tagged_by_decision() {
        let accept: UserDecision =
            serde_json::from_str(r#"{"decision": "accept", "subtask": "t4.2"}"#).unwrap();
        assert_eq!(
            accept,
            UserDecision::Accept {
                subtask: "t4.2".parse().unwrap()
            }
        );
        assert_eq!(
            serde_json::to_value(UserDecision::Complete).unwrap(),
            serde_json::json!({"decision": "complete"})
        );
        assert_eq!(
            serde_json::from_str::<UserDecision>(r#"{"decision": "fail"}"#).unwrap(),
            UserDecision::Fail
        );
    }
}
