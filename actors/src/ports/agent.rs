//! The `Agent` port: a coding agent (the built-in tool-using agent, an external CLI, the
//! scripted agent) as a *session* bound to one attempt's workspace. The Worker opens the
//! session on the attempt's git worktree and every call of the attempt (the first run, a
//! revision after a refused subplan) goes to that session, in that worktree; a synthesis
//! opens a session on the parent's worktree again.
//!
//! `Agent::open(workspace, attempt)` gives an `AgentSession` whose `run`, `revise` and
//! `synthesize` all work in that worktree; `AttemptContext` carries a `CancellationToken` the
//! agent must honour and a `SpendReporter`.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::protocol::{
    ArtifactRef, Assignment, Budget, Handoff, ProposedSubplan, RejectionReason, SubtaskResult,
    TaskId,
};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentError {
    #[error("the agent crashed: {0}")]
    Crashed(String),
    #[error("the agent's output could not be parsed: {0}")]
    Malformed(String),
    #[error("the agent exceeded its time budget")]
    Timeout,
    /// The attempt was called off (its token was cancelled) and the agent stopped.
    #[error("the agent was called off")]
    Cancelled,
    /// The agent cannot start on this machine (its program is missing, the sandbox it must
    /// run in is unavailable): another attempt would fail the same way. The text starts
    /// with the agent's name and the cause.
    #[error("{0}")]
    CannotStart(String),
}

/// Where an agent reports what it spends while it works, so that budgets bind during an
/// attempt and not only at its end.
#[derive(Clone)]
pub struct SpendReporter(Arc<dyn Fn(Budget) + Send + Sync>);

impl SpendReporter {
    pub fn new(report: impl Fn(Budget) + Send + Sync + 'static) -> Self {
        SpendReporter(Arc::new(report))
    }

    /// Reports to nobody: for agents called outside a run.
    pub fn none() -> Self {
        SpendReporter(Arc::new(|_| {}))
    }

    /// `spent` is what was spent since the previous report (not a running total).
    pub fn report(&self, spent: Budget) {
        (self.0)(spent)
    }
}

impl fmt::Debug for SpendReporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SpendReporter")
    }
}

/// Where a session works: one attempt's git worktree, on a branch flotilla named, made
/// from main's tip. Never the user's checkout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    pub path: PathBuf,
    pub branch: String,
    /// The commit the branch left from.
    pub base: String,
    /// The failed attempt's branch this branch started from (a retry in place, ADR-031):
    /// released with this workspace, it is deleted (this branch holds its work).
    pub continued_from: Option<String>,
}

impl Workspace {
    /// A directory that is not a worktree: for agents called outside a run (tests).
    pub fn scratch(path: PathBuf) -> Self {
        Workspace {
            path,
            branch: String::new(),
            base: String::new(),
            continued_from: None,
        }
    }
}

/// Where an agent says what it is doing as it does it (a tool it called, a step of an
/// external agent's event stream), for `flotilla tail`'s live line. Live only: never
/// journaled, and the text is cut to [`ActivityReporter::MAX_CHARS`].
#[derive(Clone)]
pub struct ActivityReporter(Arc<dyn Fn(String) + Send + Sync>);

impl ActivityReporter {
    pub const MAX_CHARS: usize = 200;

    pub fn new(report: impl Fn(String) + Send + Sync + 'static) -> Self {
        ActivityReporter(Arc::new(report))
    }

    /// Reports to nobody.
    pub fn none() -> Self {
        ActivityReporter(Arc::new(|_| {}))
    }

    pub fn report(&self, what: &str) {
        (self.0)(what.chars().take(Self::MAX_CHARS).collect())
    }
}

impl fmt::Debug for ActivityReporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ActivityReporter")
    }
}

/// What a session gets for its whole attempt besides the workspace.
#[derive(Debug, Clone)]
pub struct AttemptContext {
    /// Cancelled when the attempt is called off (cancel, timeout, budget, run end). An agent
    /// must stop promptly, and stop what it started.
    pub cancel: CancellationToken,
    pub spend: SpendReporter,
    pub activity: ActivityReporter,
    /// Where the agent writes its conversation (`flotilla log`, ADR-036).
    pub transcript: super::TranscriptSink,
}

impl AttemptContext {
    /// A context that is never cancelled and reports spend, activity and transcript to nobody.
    pub fn detached() -> Self {
        AttemptContext {
            cancel: CancellationToken::new(),
            spend: SpendReporter::none(),
            activity: ActivityReporter::none(),
            transcript: super::TranscriptSink::none(),
        }
    }
}

/// What an agent reports: a handoff, a subplan, or both (ADR-009). The worker wraps it in a
/// `TaskCompleted` with the task id and attempt it assigned: ids never come from the agent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentReport {
    #[serde(default)]
    pub handoff: Option<Handoff>,
    #[serde(default)]
    pub artifacts: Vec<ArtifactRef>,
    #[serde(default)]
    pub subplan: Option<ProposedSubplan>,
}

/// A coding agent: it opens one session per attempt.
pub trait Agent: Send + Sync + 'static {
    /// A session for one attempt (or one synthesis), bound to `workspace` for its life.
    fn open(&self, workspace: Workspace, attempt: AttemptContext) -> Box<dyn AgentSession>;
}

/// One attempt's conversation with an agent, in one workspace. The futures are `'static`:
/// a session keeps what its calls share (a conversation) behind its own handles.
pub trait AgentSession: Send + 'static {
    /// Works on the assignment.
    fn run(
        &mut self,
        assignment: Assignment,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>>;
    /// The session's subplan was refused: it may propose again or finish the task as it is.
    fn revise(
        &mut self,
        assignment: Assignment,
        rejection: RejectionReason,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>>;
    /// The subtasks of `parent` ended: merge their results into the parent's final report.
    fn synthesize(
        &mut self,
        parent: TaskId,
        results: Vec<SubtaskResult>,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>>;
}
