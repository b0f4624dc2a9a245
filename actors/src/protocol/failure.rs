//! Why a task or one of its attempts failed: `FailureReason` and the typed `AttemptFailure`
//! (crashed, malformed, timed out, runner died, reported, cancelled, ...).
//! `AttemptFailure::is_retryable` says which are retried; `CannotStart` (an agent program gone
//! missing after submit, Codex's 404 on a server without `/v1/responses`) never is (ADR-017).
//! A leaf of the protocol: events, work reports, subplans and views all name these reasons.

use serde::{Deserialize, Serialize};

use super::ids::TaskId;
use super::merge::LandingFailure;
use super::task::Budget;

/// Why a task failed. Only [`FailureReason::AgentFailed`] with a retryable
/// [`AttemptFailure`] is ever retried (as `TaskRetried`, while attempts remain); every other
/// reason is final: retrying would hit the same wall (a budget, a human's answer, a deadline).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "cause", rename_all = "snake_case")]
pub enum FailureReason {
    /// The agent's attempt failed and the task has no attempts left (or the failure is not
    /// retryable).
    #[error("{failure}")]
    AgentFailed { failure: AttemptFailure },
    /// The worker's handoff said `blocked`; retrying would not help.
    #[error("blocked: {summary}")]
    Blocked { summary: String },
    /// A subtask failed under `AllSubtasksComplete`.
    #[error("subtask {subtask} did not complete")]
    SubtaskFailed { subtask: TaskId },
    /// Every subtask ended under `FirstSuccess` and none completed.
    #[error("no subtask succeeded")]
    NoSubtaskSucceeded,
    /// The subtasks were not all finished within the decomposition deadline.
    #[error("the subtasks did not finish within the {deadline_ms} ms deadline")]
    DecompositionDeadline { deadline_ms: u64 },
    /// A human declined to proceed after the subtasks ended.
    #[error("declined by the user")]
    UserDeclined,
    /// No worker profile offers the capabilities the task needs.
    #[error("no worker can run it: {reason}")]
    Undispatchable { reason: String },
    /// The task spent more than its budget (charged as reported); its agent was stopped.
    #[error("over budget: spent {spent} of {budget}")]
    BudgetExceeded { spent: Budget, budget: Budget },
    /// The agent kept proposing subplans the graph rejected (the per-attempt proposal cap or
    /// `max_subplan_rejections` was reached) and had no usable result; its agent was stopped.
    #[error("stopped after {rejections} rejected subplans")]
    ProposalLoop { rejections: u32 },
    /// Its work was done but could not land on main (M6).
    #[error("not landed: {why}")]
    NotLanded { why: LandingFailure },
}

/// Why one attempt of a task failed, as the attempt's runner saw it. Typed so that the graph
/// can tell a timeout from a crash: see [`AttemptFailure::is_retryable`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AttemptFailure {
    /// The agent process or call failed.
    #[error("the agent crashed: {detail}")]
    Crashed { detail: String },
    /// The agent's output could not be parsed or used.
    #[error("the agent's output could not be used: {detail}")]
    Malformed { detail: String },
    /// The attempt ran past its wall-time limit.
    #[error("the attempt exceeded its time limit of {limit_ms} ms")]
    TimedOut { limit_ms: u64 },
    /// The attempt's runner actor panicked or stopped without reporting.
    #[error("the attempt's runner died without reporting: {detail}")]
    RunnerDied { detail: String },
    /// The agent's own handoff said `failed`.
    #[error("the agent reported failure: {summary}")]
    Reported { summary: String },
    /// The attempt was called off (by flotilla, not by the agent).
    #[error("the attempt was cancelled")]
    Cancelled,
    /// The branch changes files outside the task's scope (the run's policy fails such
    /// work rather than flag it). A fresh attempt may keep to its scope.
    #[error("changed files outside the task's scope: {}", list_paths(paths))]
    OutOfScope { paths: Vec<String> },
    /// The branch adds links that point outside the repository, or hard links (the run's
    /// policy fails such work: ADR-016).
    #[error(
        "added links that point outside the repository (or hard links): {}",
        list_paths(paths)
    )]
    LinksOutside { paths: Vec<String> },
    /// The merge gate failed on main with this attempt's work (M6): the next attempt starts
    /// again from main, told what failed.
    #[error("the merge gate failed ({command}): {output_tail}")]
    GateFailed {
        command: String,
        output_tail: String,
    },
    /// The attempt's git worktree could not be made or read.
    #[error("the workspace failed: {detail}")]
    Workspace { detail: String },
    /// The run's reviewer (ADR-038) read the sealed work and asked for changes: the next
    /// attempt is told its comments (already bounded and escaped by the reviewer).
    #[error("the reviewer asked for changes: {}", list_comments(comments))]
    ChangesRequested { comments: Vec<String> },
    /// The run's reviewer gave no usable verdict (its model failed, or answered nothing
    /// usable within `[reviewer] max_calls`): unreviewed work never lands, so the attempt
    /// fails; a retry is reviewed again.
    #[error("the review could not be done: {reason}")]
    ReviewFailed { reason: String },
    /// The agent cannot start on this machine: its program went missing after submit (or
    /// the sandbox hides it), or the sandbox became unavailable. Not retried: every attempt
    /// would fail the same way. `detail` starts with the agent's name and the cause.
    #[error("{detail}")]
    CannotStart { detail: String },
}

/// At most 10 paths, then how many more.
fn list_paths(paths: &[String]) -> String {
    let shown: Vec<&str> = paths.iter().take(10).map(String::as_str).collect();
    match paths.len().saturating_sub(shown.len()) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

/// At most 3 comments, each cut to 200 characters, then how many more.
fn list_comments(comments: &[String]) -> String {
    let shown: Vec<String> = comments
        .iter()
        .take(3)
        .map(|c| c.chars().take(200).collect())
        .collect();
    match comments.len().saturating_sub(shown.len()) {
        0 if shown.is_empty() => "(no comments)".into(),
        0 => shown.join("; "),
        more => format!("{} and {more} more", shown.join("; ")),
    }
}

impl AttemptFailure {
    /// Whether another attempt may help. A crash, unusable output, a timeout, a dead runner or
    /// a failure the agent reported may be transient; a cancelled attempt was stopped on
    /// purpose and must not come back; an agent that cannot start here would not start on
    /// the next attempt either.
    pub fn is_retryable(&self) -> bool {
        !matches!(
            self,
            AttemptFailure::Cancelled | AttemptFailure::CannotStart { .. }
        )
    }

    /// Whether, with `[worktrees] retry_in_place`, the next attempt may continue from this
    /// attempt's branch (ADR-031). Not after a workspace failure: the branch could not be
    /// made or read, or (a `StaleBase` landing) it holds work an adopted main dropped, which
    /// must never land; nor after a failure that is not retried.
    pub fn continues_in_place(&self) -> bool {
        self.is_retryable() && !matches!(self, AttemptFailure::Workspace { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_failures_are_tagged_by_kind_and_say_what_happened() {
        let f = AttemptFailure::TimedOut { limit_ms: 5_000 };
        let json = serde_json::to_value(&f).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"kind": "timed_out", "limit_ms": 5000})
        );
        assert_eq!(serde_json::from_value::<AttemptFailure>(json).unwrap(), f);
        assert_eq!(
            f.to_string(),
            "the attempt exceeded its time limit of 5000 ms"
        );
        let reason = FailureReason::AgentFailed {
            failure: AttemptFailure::Crashed {
                detail: "exit 1".into(),
            },
        };
        assert_eq!(reason.to_string(), "the agent crashed: exit 1");
        assert!(f.is_retryable());
        assert!(!AttemptFailure::Cancelled.is_retryable());
        let missing = AttemptFailure::CannotStart {
            detail: "codex: program not found on PATH".into(),
        };
        assert!(!missing.is_retryable());
        assert!(f.continues_in_place());
        assert!(
            !AttemptFailure::Workspace {
                detail: "stale".into()
            }
            .continues_in_place()
        );
        assert!(!missing.continues_in_place());
        assert_eq!(
            FailureReason::AgentFailed { failure: missing }.to_string(),
            "codex: program not found on PATH",
            "cause first, with nothing before the agent's name"
        );
    }
}
