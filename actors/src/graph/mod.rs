//! The run's task graph as plain data: a petgraph DAG of tasks and the rules that move them.
//!
//! Architecture invariant: **the graph is a fold of its events.** [`RunGraph::apply`] is the
//! only code that mutates it. Commands ([`RunGraph::submit`], [`RunGraph::complete`], …) read
//! the graph, validate, and *emit* events, each applied as it is emitted, and return the
//! events they emitted. The actor journals those events before it acts on them; after a crash,
//! applying the journaled events to an empty graph rebuilds the same graph.
//!
//! Architecture invariant: **cost is proportional to the change.** Every command touches the
//! task, its parent, its children and its dependents, never the whole graph: ready-counts,
//! open-child counts, the live-task count and the duplicate index are maintained
//! incrementally, and subplan validation only looks at the proposal and its parent.
//!
//! This module knows nothing about actors, time or I/O.
//!
//! The code is split along the seams of the graph's life (this file holds the types):
//! - `fold`: `apply`, the only mutator, and `emit`;
//! - `settle`: the consequences of tasks that ended; cancel and fail helpers;
//! - `planning`: the root planner's batches and answers;
//! - `attempts`: dispatch, start, the deliverable, failures, interruption;
//! - `decomposition`: subplans, user decisions, deadlines;
//! - `subplanning`: the Subplanner's answers and its open decompositions (ADR-008);
//! - `budget`: spend charged as reported, task and run budgets;
//! - `queries`: read-only views;
//! - `validate`: the rules LLM-proposed work must pass; `scope`: the scope locks (the paths are `protocol::ScopePath`).
//!
//! `RunGraph` is a petgraph `DiGraph`: an edge `a → b` means b depends on a; parent/child
//! links live in the nodes (`TaskNode`). Errors are `GraphError`.

mod attempts;
mod budget;
mod decomposition;
mod fold;
mod landing;
mod planning;
mod queries;
pub mod scope;
mod settle;
mod subplanning;
mod validate;

use std::collections::HashMap;
use std::sync::Arc;

use petgraph::graph::{DiGraph, NodeIndex};

use crate::config::Limits;
use crate::protocol::ScopePath;
use crate::protocol::{
    ArtifactRef, Budget, EventKind, FailureReason, FixOf, Handoff, LastReview, PreviousAttempt,
    RunOutcome, StopCondition, TaskId, TaskSpec, TaskState,
};
pub use validate::{Fingerprint, fingerprint};

/// One task in the graph.
#[derive(Debug, Clone)]
pub struct TaskNode {
    pub id: TaskId,
    pub spec: Arc<TaskSpec>,
    /// `spec.scope`, parsed.
    pub scope: Vec<ScopePath>,
    pub budget: Budget,
    /// Everything charged to this task, over all its attempts.
    pub spent: Budget,
    /// Spend the current attempt reported (`SpendReported`) since its last report; the next
    /// report's handoff metrics are charged only beyond this, so nothing is counted twice.
    pub reported_since_report: Budget,
    pub state: TaskState,
    /// 1-based; increases on every retry.
    pub attempt: u32,
    pub parent: Option<NodeIndex>,
    pub children: Vec<NodeIndex>,
    pub stop_when: StopCondition,
    /// Accepted decompositions of this task (0 or 1); guards deadline timers.
    pub decompositions: u32,
    /// Subplans proposed during the current attempt, accepted or rejected.
    pub proposals_this_attempt: u32,
    /// Subplans rejected during the current attempt; at `max_subplan_rejections` the task is
    /// stopped, so an agent cannot loop on invalid proposals.
    pub rejections_this_attempt: u32,
    /// Attempts not charged as retries: ended by a daemon restart, or handed from the
    /// Subplanner to a worker (`TaskAtomic`).
    pub uncharged_attempts: u32,
    /// The Subplanner found the task atomic: it goes to a worker, never to the Subplanner
    /// again.
    pub atomic: bool,
    /// The task's decomposition is the Subplanner's (ADR-008): its subtasks' failures do
    /// not fail it, and its result is their aggregate.
    pub subplanned: bool,
    /// The Subplanner may still add subtasks (`SubtasksAdded`) until it closes the
    /// decomposition; the parent waits at least that long.
    pub decomposition_open: bool,
    /// Subplanner calls recorded for the task's current attempt.
    pub subplanner_calls: u32,
    /// Subtasks of an open Subplanner decomposition that ended and whose handoffs no
    /// recorded Subplanner prompt carried yet: what a restarted Subplanner must still read.
    pub unheard: Vec<NodeIndex>,
    /// Why flotilla made this fix task (`f<n>`), if it did.
    pub fix: Option<Box<FixOf>>,
    /// The conflict fix that carries this task's work to main while it is `Landing`.
    pub fixed_by: Option<NodeIndex>,
    /// While `Landing` (and after): the branch and the tip that land.
    pub landing: Option<Box<(String, String)>>,
    /// A `Landing` task whose work changes flotilla's own configuration, held out of the
    /// merge queue until the user decides (ADR-016).
    pub landing_held: bool,
    /// The worker profile the last dispatch chose (a synthesis runs on the same kind of
    /// agent as the attempt that proposed the subplan).
    pub profile: Option<String>,
    /// Dependencies that have not completed yet; 0 means the task may become ready.
    unfinished_deps: u32,
    open_children: u32,
    completed_children: u32,
    /// Tasks on the longest dependency chain from here to a sink, itself included.
    pub critical_path: u32,
    /// Creation order within the run.
    pub created: u64,
    /// Boxed: rarely read, and keeping nodes small keeps large graphs cache-friendly.
    pub handoff: Option<Box<Handoff>>,
    pub artifacts: Vec<ArtifactRef>,
    pub failure: Option<Box<FailureReason>>,
    /// Why the last failed attempt failed, for the next attempt's agent (ADR-031).
    pub previous: Option<Arc<PreviousAttempt>>,
    /// The reviewer's last verdict (ADR-038), for status.
    pub last_review: Option<LastReview>,
    fingerprint: Fingerprint,
}

/// Errors of the fold: an event that does not apply to the graph. Commands only emit events
/// that apply, so on replay this means a corrupt or foreign journal.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GraphError {
    #[error("event refers to unknown task {0}")]
    UnknownTask(TaskId),
    #[error("task {0} already exists")]
    DuplicateTask(TaskId),
    #[error(transparent)]
    IllegalTransition(#[from] crate::protocol::IllegalTransition),
    #[error("event for {task} carries attempt {got}, the task is on attempt {expected}")]
    AttemptMismatch {
        task: TaskId,
        got: u32,
        expected: u32,
    },
}

/// The task graph of one run.
#[derive(Debug, Clone)]
pub struct RunGraph {
    limits: Limits,
    /// Edge `a → b`: `b` depends on `a`. Parent/child links live in the nodes, not in edges.
    dag: DiGraph<TaskNode, ()>,
    index: HashMap<TaskId, NodeIndex>,
    next_root: u32,
    /// Tasks not in a terminal state.
    live: usize,
    /// Root tasks that ended other than Completed.
    unsuccessful_roots: usize,
    decompositions: u32,
    /// Open (not yet finished, not waiting) tasks by fingerprint, for rule (h).
    open_fingerprints: HashMap<Fingerprint, NodeIndex>,
    planning_finished: bool,
    /// Why the whole run is being cancelled, once it is.
    cancel_requested: Option<String>,
    /// The planner's last error, once it gave up.
    planner_gave_up: Option<String>,
    /// Root-planner calls recorded so far; the next call's index.
    planner_calls: u32,
    /// What the planner's last recorded answer came to: `None` while it gave none, else
    /// usable (a valid task list the graph took), or the problem with it (unparsable, or a
    /// batch the graph rejected). A run that ends with no task at all is judged by it.
    last_planner_problem: Option<Option<String>>,
    /// Everything the run spent: tasks' charged spend and the planner's usage.
    run_spent: Budget,
    /// Set once the run spent more than `limits.run_budget`: (spent, budget) at that moment.
    budget_exhausted: Option<(Budget, Budget)>,
    outcome: Option<RunOutcome>,
    /// Why the run finished as it did, when there is more to say than the outcome.
    finish_reason: Option<String>,
    /// The run lands work through a merge queue and ends with a sweep of main (M6, ADR-011):
    /// a completion with commits is `Landing` until its branch is on main, and the run
    /// finishes only on a green sweep. Off for graphs without a MergeQueue and a
    /// Reconciler (unit and actor tests): completion is then immediate. Configuration, not
    /// state: the same value must be given when a journal is replayed.
    merging: bool,
    /// The next fix task number (`f<n>`).
    next_fix: u32,
    /// Conflict fixes and sweep fixes made so far (capped by the limits).
    conflict_fixes: u32,
    sweep_fixes: u32,
    /// Open sweep fixes by the signature of the problem they fix.
    open_sweep_fixes: HashMap<String, NodeIndex>,
    /// Finalization rounds started.
    finalization: u32,
    /// A finalization round waits for its sweep.
    awaiting_sweep: bool,
    /// What the last sweep found: green, and if red, in words.
    last_sweep_green: Option<bool>,
    last_red: Option<String>,
    /// Where the merge queue last moved main (`MainMoved`).
    main_tip: Option<String>,
    /// The commits journaled ahead of a compare-and-swap (`LandingIntended`) as holding a
    /// `Landing` task's work, oldest first (ADR-018): after a crash, the only evidence that
    /// its work is on main. Dropped when the task lands or leaves `Landing`.
    intents: HashMap<TaskId, Vec<String>>,
    /// The last `LandingIntended`: its target tip and its commits. main may be there
    /// though no `MainMoved` says so (a crash after the compare-and-swap).
    last_intent: Option<Box<(String, Vec<String>)>>,
    /// main no longer contains `main_tip` (`MainDiverged`): (expected, actual), until main
    /// moves again or the user adopts it (`MainAdopted`, ADR-024).
    diverged: Option<Box<(String, String)>>,
    /// Every landed task with the commit that holds its work, in landing order: what an
    /// adoption of a diverged main checks against main (ADR-024).
    landed_commits: Vec<(TaskId, String)>,
    /// The commits of landed work an adopted main dropped (`MainAdopted`): a branch that
    /// holds one of them must not land (ADR-024).
    dropped_commits: Vec<String>,
}

/// What a command did: the events it emitted (already applied), in order.
pub type Emitted = Vec<EventKind>;

impl RunGraph {
    pub fn new(limits: Limits) -> Self {
        RunGraph {
            limits,
            dag: DiGraph::new(),
            index: HashMap::new(),
            next_root: 1,
            live: 0,
            unsuccessful_roots: 0,
            decompositions: 0,
            open_fingerprints: HashMap::new(),
            planning_finished: false,
            cancel_requested: None,
            planner_gave_up: None,
            planner_calls: 0,
            last_planner_problem: None,
            run_spent: Budget::default(),
            budget_exhausted: None,
            outcome: None,
            finish_reason: None,
            merging: false,
            next_fix: 1,
            conflict_fixes: 0,
            sweep_fixes: 0,
            open_sweep_fixes: HashMap::new(),
            finalization: 0,
            awaiting_sweep: false,
            last_sweep_green: None,
            last_red: None,
            main_tip: None,
            intents: HashMap::new(),
            last_intent: None,
            diverged: None,
            landed_commits: Vec::new(),
            dropped_commits: Vec::new(),
        }
    }

    /// A graph whose work lands through the merge queue and whose run ends with a sweep of
    /// main (see `merging`). The daemon's runs are all merging.
    pub fn merging(mut self) -> Self {
        self.merging = true;
        self
    }

    pub fn is_merging(&self) -> bool {
        self.merging
    }

    /// Makes room for `additional` more tasks, so that growing a large graph does not
    /// reallocate it in the middle of a command.
    pub fn reserve(&mut self, additional: usize) {
        self.dag.reserve_nodes(additional);
        self.dag.reserve_edges(additional);
        self.index.reserve(additional);
        self.open_fingerprints.reserve(additional);
    }
}

/// The states in which an agent may report on a task (a report may overtake its
/// `TaskStarted`).
const AGENT_AT_WORK: &[TaskState] = &[
    TaskState::Dispatched,
    TaskState::Running,
    TaskState::Synthesizing,
];

/// Not started, or running: the states in which a task "is in the frontier" for rule (h).
fn is_open(state: TaskState) -> bool {
    matches!(
        state,
        TaskState::Pending | TaskState::Ready | TaskState::Dispatched | TaskState::Running
    )
}

/// Batch and subplan items after validation, shared by both paths.
pub(crate) struct ValidItem {
    pub spec: TaskSpec,
    pub budget: Budget,
    pub batch_deps: Vec<usize>,
    pub existing_deps: Vec<TaskId>,
}

pub(crate) struct ValidBatch {
    pub items: Vec<ValidItem>,
    /// A topological order of `items`.
    pub order: Vec<usize>,
}
