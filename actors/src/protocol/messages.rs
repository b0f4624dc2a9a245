//! The actors' inboxes. Each actor accepts exactly one message enum, so this file is the
//! complete list of what can be said to whom. Payloads are the serde types of the sibling
//! modules; only the addresses (`Recipient`s) are not serializable.
//!
//! Architecture invariant: this is the only file of the protocol that knows actix. The wire
//! types (events, specs, handoffs, subplans, work items) live in the sibling modules and
//! derive only serde.

use std::fmt;

use actix::{Message, Recipient};

use super::event::{Event, EventKind};
use super::failure::AttemptFailure;
use super::handoff::Usage;
use super::ids::TaskId;
use super::merge::{
    CheckoutSync, IntendedLanding, LandRequest, LandingFailure, MergeHealth, SweepReport,
};
use super::review::ReviewVerdict;
use super::subplan::{
    OpenDecomposition, RejectionReason, SubtaskEnded, SubtasksCompleted, TaskDecompositionAccepted,
    TaskDecompositionRejected, UserDecision,
};
use super::task::{Budget, TaskSpec};
use super::tools::ToolRound;
use super::view::GraphSnapshot;
use super::work::{
    Assignment, PlannerAnswer, ReadyTask, RootHandoff, Route, SubplannerAnswer, TaskCompleted,
};

/// The TaskGraph actor's inbox.
#[derive(Message)]
#[rtype(result = "()")]
pub enum ToTaskGraph {
    /// Root tasks from the planner (LLM output: validated before anything is inserted).
    SubmitTasks {
        tasks: Vec<TaskSpec>,
    },
    /// The planner will submit nothing more; the run ends when every task has ended.
    PlanningFinished,
    /// The root planner's answer to one LLM call: recorded, then its tasks submitted. An
    /// empty, valid answer while no task is live finishes planning.
    PlannerAnswered(Box<PlannerAnswer>),
    /// A round of a planner's (or the Subplanner's) read-only tools, to journal
    /// (`ToolsRan`, ADR-037) before the call's answer.
    ToolsRan(Box<ToolRound>),
    /// The planner gave up (too many consecutive errors or iterations).
    PlannerGaveUp {
        error: String,
    },
    /// Dispatch handed the task to `agent`.
    TaskDispatched {
        task: TaskId,
        attempt: u32,
        profile: String,
        route: Route,
        agent: Recipient<ToAgent>,
    },
    /// No worker profile has the capabilities the task needs.
    Undispatchable {
        task: TaskId,
        attempt: u32,
        reason: String,
    },
    TaskStarted {
        task: TaskId,
        attempt: u32,
    },
    /// The run's reviewer's verdict on the attempt's sealed work (ADR-038), sent before the
    /// attempt's `TaskCompleted` (approved) or `TaskFailed`: journaled as `ReviewVerdict`.
    Reviewed {
        task: TaskId,
        attempt: u32,
        review: ReviewVerdict,
        calls: u32,
        usage: Usage,
    },
    TaskCompleted(Box<TaskCompleted>),
    /// The attempt ended without a report: the agent crashed, timed out, produced unusable
    /// output, or its runner died.
    TaskFailed {
        task: TaskId,
        attempt: u32,
        failure: AttemptFailure,
    },
    /// What a running attempt spent since its last `SpendReported`, as it happens. Charged to
    /// the task and the run at once; a task or run over its budget is stopped.
    SpendReported {
        task: TaskId,
        attempt: u32,
        spent: Budget,
    },
    /// Cancel one task (with its subtasks and dependents), or the whole run when `task` is
    /// `None`.
    Cancel {
        task: Option<TaskId>,
        reason: String,
    },
    /// A human's answer for a parent whose stop condition is `UserDecision`.
    UserDecision {
        task: TaskId,
        decision: UserDecision,
    },
    /// From Dispatch: how many worker slots are free after its last hand-out (sent when the
    /// number changes). Not journaled: it is not run state; the TaskGraph forwards it to the
    /// planner.
    WorkerCapacity {
        free: usize,
    },
    /// One Subplanner call about a task it was assigned or decomposes: recorded, then acted
    /// on (ADR-008).
    SubplannerAnswered(Box<SubplannerAnswer>),
    /// The Subplanner cannot go on planning `task` (its model failed for good, or too many
    /// answers in a row were unusable). A task it had not decomposed yet fails this attempt;
    /// an open decomposition is closed with what it has.
    SubplannerStopped {
        task: TaskId,
        attempt: u32,
        reason: String,
    },
    /// Timer: the parent's decomposition deadline. `decomposition` guards against a timer
    /// from an earlier decomposition of the same task.
    DecompositionDeadline {
        task: TaskId,
        decomposition: u32,
    },
    /// The user's decision for a run whose landing paused because main diverged
    /// (`flotilla decide RUN --adopt-main`, ADR-024): main as it is now becomes the base
    /// the merge queue lands on.
    AdoptMain,
}

/// The MergeQueue's and the Reconciler's word to the TaskGraph (M6), kept apart from
/// `ToTaskGraph` so that those two actors can be given only what they may say.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub enum FromMerging {
    /// main moved from `from` to `to` with the work of `landed` (task, attempt, the commit
    /// that holds it).
    MainMoved {
        from: String,
        to: String,
        landed: Vec<(TaskId, u32, String)>,
        checkout: CheckoutSync,
    },
    /// After a restart: main already holds the task's work (a crash after main moved,
    /// before the landing was journaled), in `commit`.
    FoundOnMain {
        task: TaskId,
        attempt: u32,
        commit: String,
    },
    /// The task's branch conflicts with main (and will not be retried by the queue).
    Conflict {
        task: TaskId,
        attempt: u32,
        files: Vec<String>,
        clashing: Vec<String>,
    },
    /// The queue gave up on the task's branch.
    Failed {
        task: TaskId,
        attempt: u32,
        failure: LandingFailure,
    },
    /// Something the tail should show that changes no task: a conflict retried later, a
    /// failed gate run (`MergeConflict`, `MergeGateFailed`).
    Note(Box<EventKind>),
    /// What a sweep of main found.
    Swept(Box<SweepReport>),
    /// A sweep was discarded: main moved from `commit` while it ran.
    SweepStale { sweep: u32, commit: String },
    /// The user adopts main's `tip` in place of `expected` (ADR-024): `dropped` are the
    /// landed tasks whose commits `tip` does not contain.
    MainAdopted {
        expected: String,
        tip: String,
        dropped: Vec<TaskId>,
    },
}

/// MergeQueue → TaskGraph, before it moves main (ADR-018): journal that main is about to
/// move from `from` to `to` with these commits holding these tasks' work. Answered once the
/// `LandingIntended` event is committed; the queue moves main only after an `Ok`.
#[derive(Debug, Message)]
#[rtype(result = "Result<(), IntentNotJournaled>")]
pub struct IntendLanding {
    pub from: String,
    pub to: String,
    pub landed: Vec<IntendedLanding>,
}

/// Why a landing's intent is not in the journal: main must not move. The causes are the
/// journal's and the graph's errors (boxed: the protocol knows neither module).
#[derive(Debug, thiserror::Error)]
pub enum IntentNotJournaled {
    #[error("the landing's intent was not journaled: {0}")]
    Refused(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("the run's task graph stopped before the landing's intent was journaled")]
    GraphStopped,
    /// The intent broke the graph's rules: the task graph stops.
    #[error("the run's task graph stopped: {0}")]
    Broken(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("the task graph is gone: {0}")]
    Gone(#[source] actix::MailboxError),
}

/// The MergeQueue's inbox.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub enum ToMergeQueue {
    /// A task's branch waits to land.
    Enqueue(Box<LandRequest>),
    /// The task was cancelled: its branch must not land (unless it is already being built,
    /// in which case its verdict is ignored by the graph).
    Withdraw { task: TaskId },
    /// The user adopts main as it is now in place of `expected` (ADR-024): the queue reads
    /// main's tip, finds which of `landed` (task, the commit that holds its work) it no
    /// longer contains, and answers `FromMerging::MainAdopted`. Nothing lands meanwhile.
    AdoptMain {
        expected: String,
        landed: Vec<(TaskId, String)>,
    },
    /// `MainAdopted` is journaled: `tip` replaces `expected` as the tip flotilla last
    /// wrote, and landing resumes (unless the queue has written another tip since).
    /// `dropped`: the commits of the landed work `tip` lacks; a branch holding one of them
    /// does not land (it would replay it).
    Adopted {
        expected: String,
        tip: String,
        dropped: Vec<String>,
    },
}

/// The Reconciler's inbox.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub enum ToReconciler {
    /// main moved (from the MergeQueue): sweep soon, debounced.
    MainMoved { tip: String },
    /// Finalization round `attempt` needs a sweep now: of `commit`, the tip this run last
    /// moved main to (ADR-018: what this run landed, whatever another run or the user put
    /// on top since), or of main's tip when the run moved nothing.
    Finalize {
        attempt: u32,
        commit: Option<String>,
    },
    /// Timer: the adaptive interval elapsed, or the debounce after main moved.
    Tick { generation: u64 },
}

/// Query: the TaskGraph actor's current graph. Costs O(graph); for status and tests only.
#[derive(Debug, Message)]
#[rtype(result = "GraphSnapshot")]
pub struct GetSnapshot;

/// An event, after it was journaled, on its way to whoever watches the run.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Published(pub Event);

/// The Planner actor's inbox.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub enum ToPlanner {
    /// Plan the first sprint.
    Start,
    Handoff(Box<RootHandoff>),
    /// No task is live and planning has not finished: plan the next sprint (or finish).
    Quiescent,
    /// The planner's last batch was refused; the reason goes into its next prompt.
    BatchRejected {
        reason: RejectionReason,
    },
    /// The planner's last batch was accepted (its tasks are in the graph); `ready` of them
    /// went to Dispatch at once and will take free worker slots.
    BatchAccepted {
        ready: usize,
    },
    /// Worker slots free after Dispatch handed out what it could (forwarded by the
    /// TaskGraph). The planner replans on handoffs only when a slot is free, or when a
    /// handoff needs attention.
    Capacity {
        free_workers: usize,
    },
    /// Timer: retry after an error.
    Retry,
    /// The merge queue's health, for the next follow-up message (M6).
    MergeHealth(MergeHealth),
}

/// The Dispatch actor's inbox.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub enum ToDispatch {
    Ready(Vec<ReadyTask>),
    /// The task no longer needs its slot, its scope locks or its queue place (it ended, is
    /// waiting for subtasks, or is being retried). Idempotent.
    Release {
        task: TaskId,
    },
}

/// What an agent (worker, subplanner) receives.
#[derive(Debug, Clone, PartialEq, Message)]
#[rtype(result = "()")]
pub enum ToAgent {
    Assign(Assignment),
    DecompositionAccepted(TaskDecompositionAccepted),
    DecompositionRejected(TaskDecompositionRejected),
    SubtasksCompleted(SubtasksCompleted),
    /// To the Subplanner: a subtask of its open decomposition ended.
    SubtaskEnded(SubtaskEnded),
    /// To the Subplanner, after a restart: an open decomposition to pick up again.
    Resume(OpenDecomposition),
    /// To the Subplanner: its decomposition of `parent` takes no more subtasks (it reached a
    /// cap); it stops planning and aggregates once the subtasks have ended.
    DecompositionClosed {
        parent: TaskId,
        reason: String,
    },
    Cancel {
        task: TaskId,
        reason: String,
    },
}

impl fmt::Debug for ToTaskGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToTaskGraph::SubmitTasks { tasks } => write!(f, "SubmitTasks({} tasks)", tasks.len()),
            ToTaskGraph::PlanningFinished => f.write_str("PlanningFinished"),
            ToTaskGraph::PlannerAnswered(a) => write!(f, "PlannerAnswered(call {})", a.call),
            ToTaskGraph::ToolsRan(r) => write!(f, "ToolsRan(call {} round {})", r.call, r.round),
            ToTaskGraph::PlannerGaveUp { error } => write!(f, "PlannerGaveUp({error})"),
            ToTaskGraph::TaskDispatched {
                task,
                attempt,
                profile,
                route,
                ..
            } => {
                write!(f, "TaskDispatched({task}#{attempt} {route:?} {profile})")
            }
            ToTaskGraph::Undispatchable { task, reason, .. } => {
                write!(f, "Undispatchable({task}: {reason})")
            }
            ToTaskGraph::TaskStarted { task, attempt } => {
                write!(f, "TaskStarted({task}#{attempt})")
            }
            ToTaskGraph::Reviewed {
                task,
                attempt,
                review,
                ..
            } => write!(f, "Reviewed({task}#{attempt}: {})", review.words()),
            ToTaskGraph::TaskCompleted(c) => write!(f, "TaskCompleted({}#{})", c.task, c.attempt),
            ToTaskGraph::TaskFailed {
                task,
                attempt,
                failure,
            } => write!(f, "TaskFailed({task}#{attempt}: {failure})"),
            ToTaskGraph::SpendReported {
                task,
                attempt,
                spent,
            } => write!(f, "SpendReported({task}#{attempt}: {spent})"),
            ToTaskGraph::Cancel { task, reason } => write!(f, "Cancel({task:?}: {reason})"),
            ToTaskGraph::UserDecision { task, decision } => {
                write!(f, "UserDecision({task}: {decision:?})")
            }
            ToTaskGraph::WorkerCapacity { free } => write!(f, "WorkerCapacity({free} free)"),
            ToTaskGraph::SubplannerAnswered(a) => {
                write!(
                    f,
                    "SubplannerAnswered({}#{} call {})",
                    a.task, a.attempt, a.call
                )
            }
            ToTaskGraph::SubplannerStopped {
                task,
                attempt,
                reason,
            } => write!(f, "SubplannerStopped({task}#{attempt}: {reason})"),
            ToTaskGraph::DecompositionDeadline { task, .. } => {
                write!(f, "DecompositionDeadline({task})")
            }
            ToTaskGraph::AdoptMain => f.write_str("AdoptMain"),
        }
    }
}
