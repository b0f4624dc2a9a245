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

pub mod scope;
mod validate;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use petgraph::Direction;
use petgraph::graph::{DiGraph, NodeIndex};

use crate::config::Limits;
use crate::protocol::{
    ArtifactRef, AttemptFailure, Budget, EventKind, FailureReason, GraphSnapshot, Handoff,
    HandoffStatus, ReadyTask, Route, RunOutcome, StopCondition, SubtaskResult, TaskCompleted,
    TaskId, TaskSpec, TaskState, TaskView, UserDecision,
};
use scope::ScopePath;
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
    /// Attempts ended by a daemon restart rather than by the agent; not charged as retries.
    pub interruptions: u32,
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
    cancel_requested: bool,
    planner_failed: bool,
    /// Root-planner calls recorded so far; the next call's index.
    planner_calls: u32,
    /// Everything the run spent: tasks' charged spend and the planner's usage.
    run_spent: Budget,
    /// Set once the run spent more than `limits.run_budget`: (spent, budget) at that moment.
    budget_exhausted: Option<(Budget, Budget)>,
    outcome: Option<RunOutcome>,
    /// Why the run finished as it did, when there is more to say than the outcome.
    finish_reason: Option<String>,
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
            cancel_requested: false,
            planner_failed: false,
            planner_calls: 0,
            run_spent: Budget::default(),
            budget_exhausted: None,
            outcome: None,
            finish_reason: None,
        }
    }

    /// Rebuilds a graph from journaled events.
    pub fn replay<'a>(
        limits: Limits,
        events: impl IntoIterator<Item = &'a EventKind>,
    ) -> Result<Self, GraphError> {
        let mut graph = RunGraph::new(limits);
        for e in events {
            graph.apply(e)?;
        }
        Ok(graph)
    }

    /// Makes room for `additional` more tasks, so that growing a large graph does not
    /// reallocate it in the middle of a command.
    pub fn reserve(&mut self, additional: usize) {
        self.dag.reserve_nodes(additional);
        self.dag.reserve_edges(additional);
        self.index.reserve(additional);
        self.open_fingerprints.reserve(additional);
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn len(&self) -> usize {
        self.dag.node_count()
    }

    pub fn is_empty(&self) -> bool {
        self.dag.node_count() == 0
    }

    pub fn live_tasks(&self) -> usize {
        self.live
    }

    pub fn outcome(&self) -> Option<RunOutcome> {
        self.outcome
    }

    pub fn planner_calls(&self) -> u32 {
        self.planner_calls
    }

    /// Everything the run spent so far, the planner included.
    pub fn run_spent(&self) -> Budget {
        self.run_spent
    }

    /// Why the run finished, when there is more to say than its outcome.
    pub fn finish_reason(&self) -> Option<&str> {
        self.finish_reason.as_deref()
    }

    pub fn is_planning_finished(&self) -> bool {
        self.planning_finished
    }

    /// Nothing is live but the planner may still add work.
    pub fn is_quiescent(&self) -> bool {
        self.live == 0 && !self.planning_finished && self.outcome.is_none()
    }

    /// Tasks in `state`. O(graph): for recovery and queries only.
    pub fn tasks_in(&self, state: TaskState) -> Vec<TaskId> {
        self.dag
            .node_weights()
            .filter(|n| n.state == state)
            .map(|n| n.id.clone())
            .collect()
    }

    pub fn task(&self, id: &TaskId) -> Option<&TaskNode> {
        self.index.get(id).map(|&ix| &self.dag[ix])
    }

    pub fn tasks(&self) -> impl Iterator<Item = &TaskNode> {
        self.dag.node_weights()
    }

    /// The ids of the tasks `id` depends on.
    pub fn dependencies(&self, id: &TaskId) -> Vec<TaskId> {
        self.index
            .get(id)
            .map(|&ix| {
                self.dag
                    .neighbors_directed(ix, Direction::Incoming)
                    .map(|d| self.dag[d].id.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// What Dispatch needs to queue a ready task.
    pub fn ready_task(&self, id: &TaskId) -> Option<ReadyTask> {
        let node = self.task(id)?;
        Some(ReadyTask {
            task: node.id.clone(),
            attempt: node.attempt,
            spec: node.spec.clone(),
            critical_path: node.critical_path,
            created: node.created,
            budget: node.budget,
        })
    }

    /// The children's results, for `SubtasksCompleted`.
    pub fn subtask_results(&self, parent: &TaskId) -> Vec<SubtaskResult> {
        let Some(&ix) = self.index.get(parent) else {
            return Vec::new();
        };
        self.dag[ix]
            .children
            .iter()
            .map(|&c| {
                let child = &self.dag[c];
                SubtaskResult {
                    task: child.id.clone(),
                    state: child.state,
                    handoff: child.handoff.as_deref().cloned(),
                }
            })
            .collect()
    }

    /// A serializable view for status output and tests. O(graph): queries only.
    pub fn snapshot(&self) -> GraphSnapshot {
        GraphSnapshot {
            tasks: self
                .dag
                .node_indices()
                .map(|ix| {
                    let n = &self.dag[ix];
                    TaskView {
                        id: n.id.clone(),
                        state: n.state,
                        attempt: n.attempt,
                        description: n.spec.description.clone(),
                        scope: n.spec.scope.clone(),
                        priority: n.spec.priority,
                        parent: n.parent.map(|p| self.dag[p].id.clone()),
                        depends_on: self.dependencies(&n.id),
                        budget: n.budget,
                        spent: n.spent,
                        summary: n.handoff.as_ref().map(|h| h.summary.clone()),
                        failure: n.failure.as_deref().cloned(),
                    }
                })
                .collect(),
            planning_finished: self.planning_finished,
            outcome: self.outcome,
        }
    }

    // ---------------------------------------------------------------------------------------
    // The fold.

    /// Applies one event. The only mutator of the graph.
    pub fn apply(&mut self, event: &EventKind) -> Result<(), GraphError> {
        match event {
            EventKind::PlannerResponded { call, usage, .. } => {
                self.planner_calls = self.planner_calls.max(call.saturating_add(1));
                let planner = Budget::new(
                    usage.tokens_in.saturating_add(usage.tokens_out),
                    usage.cost_usd,
                    0,
                );
                self.run_spent = self.run_spent.saturating_add(planner);
            }
            EventKind::PlannerGaveUp { .. } => {
                self.planning_finished = true;
                self.planner_failed = true;
            }
            EventKind::TaskInterrupted { task, attempt } => {
                let ix = self.ix_at(task, *attempt)?;
                self.set_state(ix, TaskState::Ready)?;
                let node = &mut self.dag[ix];
                node.attempt = node.attempt.saturating_add(1);
                node.interruptions = node.interruptions.saturating_add(1);
                node.proposals_this_attempt = 0;
                node.reported_since_report = Budget::default();
            }
            EventKind::RunStarted { .. }
            | EventKind::TasksRejected { .. }
            | EventKind::AwaitingUserDecision { .. }
            | EventKind::MessageIgnored { .. } => {}
            EventKind::TaskAdded {
                task,
                spec,
                budget,
                depends_on,
            } => {
                self.add_task(task, spec, *budget, depends_on)?;
            }
            EventKind::TaskReady { task } => {
                let ix = self.ix(task)?;
                self.set_state(ix, TaskState::Ready)?;
            }
            EventKind::TaskDispatched { task, attempt, .. } => {
                let ix = self.ix_at(task, *attempt)?;
                self.set_state(ix, TaskState::Dispatched)?;
            }
            EventKind::TaskStarted { task, attempt } => {
                let ix = self.ix_at(task, *attempt)?;
                self.set_state(ix, TaskState::Running)?;
            }
            EventKind::TaskRetried { task, attempt, .. } => {
                let ix = self.ix_at(task, *attempt)?;
                self.set_state(ix, TaskState::Ready)?;
                let node = &mut self.dag[ix];
                node.attempt = node.attempt.saturating_add(1);
                node.proposals_this_attempt = 0;
                node.reported_since_report = Budget::default();
            }
            EventKind::TaskCompleted {
                task,
                attempt,
                handoff,
                artifacts,
            } => {
                let ix = self.ix_at(task, *attempt)?;
                self.set_state(ix, TaskState::Completed)?;
                let node = &mut self.dag[ix];
                node.reported_since_report = Budget::default();
                if let Some(h) = handoff {
                    node.handoff = Some(Box::new(h.clone()));
                }
                node.artifacts.extend(artifacts.iter().cloned());
            }
            EventKind::TaskFailed { task, reason, .. } => {
                let ix = self.ix(task)?;
                self.set_state(ix, TaskState::Failed)?;
                self.dag[ix].failure = Some(Box::new(reason.clone()));
            }
            EventKind::TaskCancelled { task, .. } => {
                let ix = self.ix(task)?;
                self.set_state(ix, TaskState::Cancelled)?;
            }
            EventKind::DecompositionAccepted {
                parent,
                attempt,
                stop_when,
                handoff,
                artifacts,
                ..
            } => {
                let ix = self.ix_at(parent, *attempt)?;
                self.set_state(ix, TaskState::WaitingForSubtasks)?;
                self.decompositions = self.decompositions.saturating_add(1);
                let node = &mut self.dag[ix];
                node.stop_when = *stop_when;
                node.decompositions = node.decompositions.saturating_add(1);
                node.proposals_this_attempt = node.proposals_this_attempt.saturating_add(1);
                node.reported_since_report = Budget::default();
                if let Some(h) = handoff {
                    node.handoff = Some(Box::new(h.clone()));
                }
                node.artifacts.extend(artifacts.iter().cloned());
            }
            EventKind::DecompositionRejected {
                parent, attempt, ..
            } => {
                let ix = self.ix_at(parent, *attempt)?;
                let node = &mut self.dag[ix];
                node.proposals_this_attempt = node.proposals_this_attempt.saturating_add(1);
                node.reported_since_report = Budget::default();
            }
            EventKind::SpendCharged {
                task,
                attempt,
                spent,
            } => {
                let ix = self.ix(task)?;
                let node = &mut self.dag[ix];
                node.spent = node.spent.saturating_add(*spent);
                if *attempt == node.attempt {
                    node.reported_since_report = node.reported_since_report.saturating_add(*spent);
                }
                self.run_spent = self.run_spent.saturating_add(*spent);
            }
            EventKind::RunBudgetExhausted { spent, budget } => {
                self.planning_finished = true;
                self.budget_exhausted = Some((*spent, *budget));
            }
            EventKind::SubtasksCompleted { parent } => {
                let ix = self.ix(parent)?;
                self.set_state(ix, TaskState::Synthesizing)?;
            }
            EventKind::PlanningFinished => self.planning_finished = true,
            EventKind::RunCancelRequested { .. } => {
                self.planning_finished = true;
                self.cancel_requested = true;
            }
            EventKind::RunFinished { outcome, reason } => {
                self.outcome = Some(*outcome);
                self.finish_reason = reason.clone();
            }
            // The supervisor's records: nothing in the graph changes.
            EventKind::RunRestarted { .. } | EventKind::JournalUnavailable { .. } => {}
        }
        Ok(())
    }

    fn ix(&self, id: &TaskId) -> Result<NodeIndex, GraphError> {
        self.index
            .get(id)
            .copied()
            .ok_or_else(|| GraphError::UnknownTask(id.clone()))
    }

    fn ix_at(&self, id: &TaskId, attempt: u32) -> Result<NodeIndex, GraphError> {
        let ix = self.ix(id)?;
        let expected = self.dag[ix].attempt;
        if expected != attempt {
            return Err(GraphError::AttemptMismatch {
                task: id.clone(),
                got: attempt,
                expected,
            });
        }
        Ok(ix)
    }

    fn add_task(
        &mut self,
        id: &TaskId,
        spec: &TaskSpec,
        budget: Budget,
        deps: &[TaskId],
    ) -> Result<(), GraphError> {
        if self.index.contains_key(id) {
            return Err(GraphError::DuplicateTask(id.clone()));
        }
        let parent = match id.parent() {
            Some(p) => Some(self.ix(&p)?),
            None => None,
        };
        let dep_ixs = deps
            .iter()
            .map(|d| self.ix(d))
            .collect::<Result<Vec<_>, _>>()?;
        // The spec in the event is already normalized, so parsing cannot fail; fall back to
        // skipping a path rather than refusing to replay a journal.
        let scope: Vec<ScopePath> = spec
            .scope
            .iter()
            .filter_map(|p| ScopePath::parse(p, usize::MAX).ok())
            .collect();
        let fingerprint = fingerprint(&spec.description, &scope);
        // A subtask's work precedes its parent's synthesis, so its chain includes the parent's.
        let critical_path = parent.map_or(1, |p| self.dag[p].critical_path + 1);
        let unfinished_deps = dep_ixs
            .iter()
            .filter(|&&d| self.dag[d].state != TaskState::Completed)
            .count() as u32;
        let node = TaskNode {
            id: id.clone(),
            spec: Arc::new(spec.clone()),
            scope,
            budget,
            spent: Budget::default(),
            reported_since_report: Budget::default(),
            state: TaskState::Pending,
            attempt: 1,
            parent,
            children: Vec::new(),
            stop_when: StopCondition::default(),
            decompositions: 0,
            proposals_this_attempt: 0,
            interruptions: 0,
            unfinished_deps,
            open_children: 0,
            completed_children: 0,
            critical_path,
            created: self.dag.node_count() as u64,
            handoff: None,
            artifacts: Vec::new(),
            failure: None,
            fingerprint,
        };
        let ix = self.dag.add_node(node);
        self.index.insert(id.clone(), ix);
        self.open_fingerprints.insert(fingerprint, ix);
        self.live += 1;
        for &d in &dep_ixs {
            self.dag.add_edge(d, ix, ());
        }
        self.raise_critical_paths(ix);
        match parent {
            Some(p) => {
                self.dag[p].children.push(ix);
                self.dag[p].open_children += 1;
            }
            None => self.next_root = self.next_root.max(id.path()[0] + 1),
        }
        Ok(())
    }

    /// A new task lengthens the chains of the tasks it depends on. Walks upward only while a
    /// chain actually grows, so the cost is bounded by the ancestors whose value changes.
    fn raise_critical_paths(&mut self, from: NodeIndex) {
        let mut stack = vec![from];
        while let Some(ix) = stack.pop() {
            let needed = self.dag[ix].critical_path + 1;
            let mut deps = self
                .dag
                .neighbors_directed(ix, Direction::Incoming)
                .detach();
            while let Some(d) = deps.next_node(&self.dag) {
                if self.dag[d].critical_path < needed {
                    self.dag[d].critical_path = needed;
                    stack.push(d);
                }
            }
        }
    }

    /// Every state change goes through here: it checks the transition table and keeps the
    /// incremental counters true.
    fn set_state(&mut self, ix: NodeIndex, next: TaskState) -> Result<(), GraphError> {
        let node = &self.dag[ix];
        let prev = node.state;
        prev.transition(&node.id, next)?;
        let was_open = is_open(prev);
        self.dag[ix].state = next;
        if was_open && !is_open(next) {
            let fp = self.dag[ix].fingerprint;
            if self.open_fingerprints.get(&fp) == Some(&ix) {
                self.open_fingerprints.remove(&fp);
            }
        }
        if next.is_terminal() {
            self.live -= 1;
            let parent = self.dag[ix].parent;
            match parent {
                Some(p) => {
                    self.dag[p].open_children -= 1;
                    if next == TaskState::Completed {
                        self.dag[p].completed_children += 1;
                    }
                }
                None if next != TaskState::Completed => self.unsuccessful_roots += 1,
                None => {}
            }
            if next == TaskState::Completed {
                let mut succ = self
                    .dag
                    .neighbors_directed(ix, Direction::Outgoing)
                    .detach();
                while let Some(s) = succ.next_node(&self.dag) {
                    self.dag[s].unfinished_deps -= 1;
                }
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // Commands. Each validates, then emits events through `emit`, which applies them.

    fn emit(&mut self, out: &mut Emitted, event: EventKind) -> Result<(), GraphError> {
        self.apply(&event)?;
        out.push(event);
        Ok(())
    }

    fn ignore(&self, out: &mut Emitted, task: Option<&TaskId>, message: &str, why: String) {
        out.push(EventKind::MessageIgnored {
            task: task.cloned(),
            message: message.to_string(),
            why,
        });
    }

    /// Looks up the task a message is about. Unknown tasks, terminal tasks, stale attempts and
    /// tasks not in one of the `expected` states produce `MessageIgnored` and `None`: a late
    /// message never changes a settled task.
    fn current(
        &self,
        out: &mut Emitted,
        task: &TaskId,
        attempt: u32,
        message: &str,
        expected: &[TaskState],
    ) -> Option<NodeIndex> {
        let Some(&ix) = self.index.get(task) else {
            self.ignore(out, Some(task), message, "no such task in this run".into());
            return None;
        };
        let node = &self.dag[ix];
        if node.state.is_terminal() {
            self.ignore(
                out,
                Some(task),
                message,
                format!("the task is already {}", node.state),
            );
            return None;
        }
        if node.attempt != attempt {
            self.ignore(
                out,
                Some(task),
                message,
                format!(
                    "stale attempt {attempt}; the task is on attempt {}",
                    node.attempt
                ),
            );
            return None;
        }
        if !expected.contains(&node.state) {
            self.ignore(
                out,
                Some(task),
                message,
                format!("the task is {}", node.state),
            );
            return None;
        }
        Some(ix)
    }

    /// The planner's batch of root tasks. All or nothing: a batch with any invalid task is
    /// rejected whole with `TasksRejected`.
    pub fn submit(&mut self, specs: Vec<TaskSpec>) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        if self.planning_finished {
            self.ignore(
                &mut out,
                None,
                "SubmitTasks",
                "planning has finished for this run".into(),
            );
            return Ok(out);
        }
        self.submit_into(&mut out, specs)?;
        Ok(out)
    }

    fn submit_into(&mut self, out: &mut Emitted, specs: Vec<TaskSpec>) -> Result<(), GraphError> {
        if specs.is_empty() {
            return Ok(());
        }
        let batch = match validate::validate_batch(self, specs) {
            Ok(batch) => batch,
            Err(reason) => return self.emit(out, EventKind::TasksRejected { reason }),
        };
        let ids: Vec<TaskId> = (0..batch.items.len())
            .map(|i| TaskId::root(self.next_root + i as u32))
            .collect();
        for &i in &batch.order {
            let item = &batch.items[i];
            let mut depends_on = item.existing_deps.clone();
            depends_on.extend(item.batch_deps.iter().map(|&j| ids[j].clone()));
            self.emit(
                out,
                EventKind::TaskAdded {
                    task: ids[i].clone(),
                    spec: item.spec.clone(),
                    budget: item.budget,
                    depends_on,
                },
            )?;
        }
        let mut work = VecDeque::new();
        for id in &ids {
            self.settle_new(out, id, &mut work)?;
        }
        self.settle(out, work)
    }

    /// One root-planner call: recorded first, then its tasks submitted. A valid empty answer
    /// while nothing is live means the planner considers the request done.
    pub fn planner_answered(
        &mut self,
        answer: crate::protocol::PlannerAnswer,
    ) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        if self.planning_finished {
            self.ignore(
                &mut out,
                None,
                "PlannerAnswered",
                "planning has finished for this run".into(),
            );
            return Ok(out);
        }
        let error = answer.tasks.as_ref().err().cloned();
        let recorded = EventKind::PlannerResponded {
            call: answer.call,
            prompt: answer.prompt,
            content: answer.content,
            usage: answer.usage,
            error,
        };
        self.emit(&mut out, recorded)?;
        self.check_run_budget(&mut out)?;
        if self.budget_exhausted.is_some() {
            return Ok(out);
        }
        match answer.tasks {
            Ok(tasks) if tasks.is_empty() && self.live == 0 => {
                self.emit(&mut out, EventKind::PlanningFinished)?;
                self.settle(&mut out, VecDeque::new())?;
            }
            Ok(tasks) => self.submit_into(&mut out, tasks)?,
            Err(_) => {}
        }
        Ok(out)
    }

    pub fn planner_gave_up(&mut self, error: &str) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        if !self.planning_finished {
            self.emit(
                &mut out,
                EventKind::PlannerGaveUp {
                    error: error.into(),
                },
            )?;
            self.settle(&mut out, VecDeque::new())?;
        }
        Ok(out)
    }

    /// After a restart: every attempt that was in flight is over. Each such task goes back to
    /// Ready as a new attempt, without being charged a retry. O(graph), once per recovery.
    pub fn interrupt_in_flight(&mut self) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        let in_flight: Vec<(TaskId, u32)> = self
            .dag
            .node_weights()
            .filter(|n| matches!(n.state, TaskState::Dispatched | TaskState::Running))
            .map(|n| (n.id.clone(), n.attempt))
            .collect();
        for (task, attempt) in in_flight {
            self.emit(&mut out, EventKind::TaskInterrupted { task, attempt })?;
        }
        Ok(out)
    }

    /// A just-added task: cancelled if a dependency already failed, ready if none is pending.
    fn settle_new(
        &mut self,
        out: &mut Emitted,
        id: &TaskId,
        work: &mut VecDeque<NodeIndex>,
    ) -> Result<(), GraphError> {
        let ix = self.ix(id)?;
        let dead = self
            .dag
            .neighbors_directed(ix, Direction::Incoming)
            .find(|&d| matches!(self.dag[d].state, TaskState::Failed | TaskState::Cancelled));
        if let Some(d) = dead {
            let reason = format!("dependency {} is {}", self.dag[d].id, self.dag[d].state);
            self.emit(
                out,
                EventKind::TaskCancelled {
                    task: id.clone(),
                    was: TaskState::Pending,
                    reason,
                },
            )?;
            work.push_back(ix);
        } else if self.dag[ix].unfinished_deps == 0 {
            self.emit(out, EventKind::TaskReady { task: id.clone() })?;
        }
        Ok(())
    }

    pub fn planning_finished(&mut self) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        if !self.planning_finished {
            self.emit(&mut out, EventKind::PlanningFinished)?;
            self.settle(&mut out, VecDeque::new())?;
        }
        Ok(out)
    }

    pub fn dispatched(
        &mut self,
        task: &TaskId,
        attempt: u32,
        profile: &str,
        route: Route,
    ) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        if self
            .current(
                &mut out,
                task,
                attempt,
                "TaskDispatched",
                &[TaskState::Ready],
            )
            .is_none()
        {
            return Ok(out);
        }
        self.emit(
            &mut out,
            EventKind::TaskDispatched {
                task: task.clone(),
                attempt,
                profile: profile.into(),
                route,
            },
        )?;
        Ok(out)
    }

    pub fn undispatchable(
        &mut self,
        task: &TaskId,
        attempt: u32,
        reason: &str,
    ) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        let Some(ix) = self.current(
            &mut out,
            task,
            attempt,
            "Undispatchable",
            &[TaskState::Ready],
        ) else {
            return Ok(out);
        };
        let reason = FailureReason::Undispatchable {
            reason: reason.into(),
        };
        self.fail_and_settle(&mut out, ix, reason)?;
        Ok(out)
    }

    pub fn started(&mut self, task: &TaskId, attempt: u32) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        if self
            .current(
                &mut out,
                task,
                attempt,
                "TaskStarted",
                &[TaskState::Dispatched],
            )
            .is_none()
        {
            return Ok(out);
        }
        self.emit(
            &mut out,
            EventKind::TaskStarted {
                task: task.clone(),
                attempt,
            },
        )?;
        Ok(out)
    }

    /// An agent's report: a deliverable, a subplan, or both (ADR-009).
    pub fn complete(&mut self, report: TaskCompleted) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        let task = report.task.clone();
        let attempt = report.attempt;
        let Some(ix) = self.current(&mut out, &task, attempt, "TaskCompleted", AGENT_AT_WORK)
        else {
            return Ok(out);
        };
        // A report that overtook its own TaskStarted still means the agent ran.
        if self.dag[ix].state == TaskState::Dispatched {
            self.emit(
                &mut out,
                EventKind::TaskStarted {
                    task: task.clone(),
                    attempt,
                },
            )?;
        }
        // The handoff's metrics cover the work since the attempt's last report; charge only
        // what the attempt has not already reported as it went.
        if let Some(h) = &report.handoff {
            let unreported = h
                .metrics
                .spent()
                .saturating_sub(self.dag[ix].reported_since_report);
            if unreported != Budget::default() {
                self.emit(
                    &mut out,
                    EventKind::SpendCharged {
                        task: task.clone(),
                        attempt,
                        spent: unreported,
                    },
                )?;
            }
        }

        if let Some(plan) = report.subplan {
            match validate::validate_subplan(self, ix, &plan) {
                Err(reason) => {
                    self.emit(
                        &mut out,
                        EventKind::DecompositionRejected {
                            parent: task,
                            attempt,
                            reason,
                        },
                    )?;
                }
                Ok(valid) => {
                    let base = self.dag[ix].children.len() as u32;
                    let ids: Vec<TaskId> = (0..valid.items.len())
                        .map(|i| task.child(base + i as u32 + 1))
                        .collect();
                    for &i in &valid.order {
                        let item = &valid.items[i];
                        let depends_on = item.batch_deps.iter().map(|&j| ids[j].clone()).collect();
                        self.emit(
                            &mut out,
                            EventKind::TaskAdded {
                                task: ids[i].clone(),
                                spec: item.spec.clone(),
                                budget: item.budget,
                                depends_on,
                            },
                        )?;
                    }
                    self.emit(
                        &mut out,
                        EventKind::DecompositionAccepted {
                            parent: task.clone(),
                            attempt,
                            reason: plan.reason,
                            stop_when: plan.stop_when,
                            subtasks: ids.clone(),
                            handoff: report.handoff,
                            artifacts: report.artifacts,
                        },
                    )?;
                    let mut work = VecDeque::new();
                    for id in &ids {
                        self.settle_new(&mut out, id, &mut work)?;
                    }
                    self.settle(&mut out, work)?;
                }
            }
            return Ok(out);
        }

        let status = report
            .handoff
            .as_ref()
            .map_or(HandoffStatus::Complete, |h| h.status);
        match status {
            HandoffStatus::Complete | HandoffStatus::Partial => {
                self.emit(
                    &mut out,
                    EventKind::TaskCompleted {
                        task,
                        attempt,
                        handoff: report.handoff,
                        artifacts: report.artifacts,
                    },
                )?;
            }
            HandoffStatus::Blocked => {
                let summary = report.handoff.map(|h| h.summary).unwrap_or_default();
                self.emit(
                    &mut out,
                    EventKind::TaskFailed {
                        task,
                        attempt,
                        reason: FailureReason::Blocked { summary },
                    },
                )?;
            }
            HandoffStatus::Failed => {
                let summary = report.handoff.map(|h| h.summary).unwrap_or_default();
                self.fail_attempt(&mut out, ix, attempt, AttemptFailure::Reported { summary })?;
                self.check_run_budget(&mut out)?;
                return Ok(out);
            }
        }
        self.settle(&mut out, VecDeque::from([ix]))?;
        self.check_run_budget(&mut out)?;
        Ok(out)
    }

    /// The attempt ended without a report (crash, timeout, unusable output, dead runner).
    pub fn failed(
        &mut self,
        task: &TaskId,
        attempt: u32,
        failure: AttemptFailure,
    ) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        let Some(ix) = self.current(&mut out, task, attempt, "TaskFailed", AGENT_AT_WORK) else {
            return Ok(out);
        };
        self.fail_attempt(&mut out, ix, attempt, failure)?;
        Ok(out)
    }

    /// Retries a retryable failure while attempts remain (never for a synthesizing parent,
    /// whose subtasks are spent), otherwise fails the task and everything that needed it.
    fn fail_attempt(
        &mut self,
        out: &mut Emitted,
        ix: NodeIndex,
        attempt: u32,
        failure: AttemptFailure,
    ) -> Result<(), GraphError> {
        let task = self.dag[ix].id.clone();
        let charged = attempt.saturating_sub(self.dag[ix].interruptions);
        let retryable = failure.is_retryable()
            && self.dag[ix].state != TaskState::Synthesizing
            && charged < self.limits.max_attempts;
        if retryable {
            self.emit(
                out,
                EventKind::TaskRetried {
                    task,
                    attempt,
                    failure,
                },
            )
        } else {
            self.fail_and_settle(out, ix, FailureReason::AgentFailed { failure })
        }
    }

    /// Spend a running attempt reported. Charged to the task and the run whatever the
    /// attempt's state (the money is spent even if the report is late); a current attempt
    /// over its task's budget is stopped, and a run over its run budget ends.
    pub fn spend_reported(
        &mut self,
        task: &TaskId,
        attempt: u32,
        spent: Budget,
    ) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        let Some(&ix) = self.index.get(task) else {
            self.ignore(
                &mut out,
                Some(task),
                "SpendReported",
                "no such task in this run".into(),
            );
            return Ok(out);
        };
        if attempt > self.dag[ix].attempt {
            self.ignore(
                &mut out,
                Some(task),
                "SpendReported",
                format!(
                    "attempt {attempt} has not been dispatched; the task is on attempt {}",
                    self.dag[ix].attempt
                ),
            );
            return Ok(out);
        }
        self.emit(
            &mut out,
            EventKind::SpendCharged {
                task: task.clone(),
                attempt,
                spent,
            },
        )?;
        let node = &self.dag[ix];
        let at_work = node.attempt == attempt && AGENT_AT_WORK.contains(&node.state);
        if at_work && node.spent.exceeds(&node.budget) {
            let reason = FailureReason::BudgetExceeded {
                spent: node.spent,
                budget: node.budget,
            };
            self.fail_and_settle(&mut out, ix, reason)?;
        }
        self.check_run_budget(&mut out)?;
        Ok(out)
    }

    /// Ends the run once it has spent more than its run budget: nothing more is planned or
    /// dispatched and every live task is cancelled. No-op while within budget.
    fn check_run_budget(&mut self, out: &mut Emitted) -> Result<(), GraphError> {
        let budget = self.limits.run_budget;
        if self.budget_exhausted.is_some()
            || self.outcome.is_some()
            || !self.run_spent.exceeds(&budget)
        {
            return Ok(());
        }
        let spent = self.run_spent;
        self.emit(out, EventKind::RunBudgetExhausted { spent, budget })?;
        // Once per run, like whole-run cancellation: visits every root.
        let roots: Vec<NodeIndex> = self
            .dag
            .node_indices()
            .filter(|&ix| self.dag[ix].parent.is_none() && !self.dag[ix].state.is_terminal())
            .collect();
        let mut work = VecDeque::new();
        for ix in roots {
            self.cancel_one(out, ix, "the run budget is exhausted".into(), &mut work)?;
        }
        self.settle(out, work)
    }

    /// Cancels one task (its subtasks and dependents follow), or the whole run.
    pub fn cancel(&mut self, task: Option<&TaskId>, reason: &str) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        if self.outcome.is_some() {
            self.ignore(
                &mut out,
                task,
                "Cancel",
                "the run has already finished".into(),
            );
            return Ok(out);
        }
        let targets: Vec<NodeIndex> = match task {
            Some(id) => match self.index.get(id) {
                Some(&ix) if !self.dag[ix].state.is_terminal() => vec![ix],
                Some(&ix) => {
                    self.ignore(
                        &mut out,
                        Some(id),
                        "Cancel",
                        format!("the task is already {}", self.dag[ix].state),
                    );
                    return Ok(out);
                }
                None => {
                    self.ignore(
                        &mut out,
                        Some(id),
                        "Cancel",
                        "no such task in this run".into(),
                    );
                    return Ok(out);
                }
            },
            None => {
                self.emit(
                    &mut out,
                    EventKind::RunCancelRequested {
                        reason: reason.into(),
                    },
                )?;
                // Whole-run cancellation visits every task once; it happens once per run.
                self.dag
                    .node_indices()
                    .filter(|&ix| {
                        self.dag[ix].parent.is_none() && !self.dag[ix].state.is_terminal()
                    })
                    .collect()
            }
        };
        let mut work = VecDeque::new();
        for ix in targets {
            self.cancel_one(&mut out, ix, reason.to_string(), &mut work)?;
        }
        self.settle(&mut out, work)?;
        Ok(out)
    }

    fn cancel_one(
        &mut self,
        out: &mut Emitted,
        ix: NodeIndex,
        reason: String,
        work: &mut VecDeque<NodeIndex>,
    ) -> Result<(), GraphError> {
        let node = &self.dag[ix];
        if node.state.is_terminal() {
            return Ok(());
        }
        let event = EventKind::TaskCancelled {
            task: node.id.clone(),
            was: node.state,
            reason,
        };
        self.emit(out, event)?;
        work.push_back(ix);
        Ok(())
    }

    /// A human's answer for a parent waiting under `StopCondition::UserDecision`.
    pub fn user_decision(
        &mut self,
        task: &TaskId,
        decision: &UserDecision,
    ) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        let waiting = self.index.get(task).copied().filter(|&ix| {
            let n = &self.dag[ix];
            n.state == TaskState::WaitingForSubtasks
                && n.stop_when == StopCondition::UserDecision
                && n.open_children == 0
        });
        let Some(ix) = waiting else {
            self.ignore(
                &mut out,
                Some(task),
                "UserDecision",
                "the task is not awaiting a decision".into(),
            );
            return Ok(out);
        };
        match decision {
            UserDecision::Complete => {
                self.emit(
                    &mut out,
                    EventKind::SubtasksCompleted {
                        parent: task.clone(),
                    },
                )?;
            }
            UserDecision::Fail => {
                self.fail_and_settle(&mut out, ix, FailureReason::UserDeclined)?;
            }
            UserDecision::Accept { subtask } => {
                let chosen = self.index.get(subtask).copied().filter(|&c| {
                    self.dag[c].parent == Some(ix) && self.dag[c].state == TaskState::Completed
                });
                let Some(c) = chosen else {
                    self.ignore(
                        &mut out,
                        Some(task),
                        "UserDecision",
                        format!("{subtask} is not a completed subtask of {task}"),
                    );
                    return Ok(out);
                };
                let child = &self.dag[c];
                let event = EventKind::TaskCompleted {
                    task: task.clone(),
                    attempt: self.dag[ix].attempt,
                    handoff: child.handoff.as_deref().cloned(),
                    artifacts: child.artifacts.clone(),
                };
                self.emit(&mut out, event)?;
                self.settle(&mut out, VecDeque::from([ix]))?;
            }
        }
        Ok(out)
    }

    /// The decomposition deadline of `task` passed. No-op unless the same decomposition is
    /// still waiting.
    pub fn deadline_passed(
        &mut self,
        task: &TaskId,
        decomposition: u32,
    ) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        let Some(&ix) = self.index.get(task) else {
            return Ok(out);
        };
        let node = &self.dag[ix];
        if node.state != TaskState::WaitingForSubtasks || node.decompositions != decomposition {
            return Ok(out);
        }
        let reason = FailureReason::DecompositionDeadline {
            deadline_ms: self.deadline_ms(task).unwrap_or(0),
        };
        self.fail_and_settle(&mut out, ix, reason)?;
        Ok(out)
    }

    /// How long a decomposed task may wait for its subtasks.
    pub fn deadline_ms(&self, task: &TaskId) -> Option<u64> {
        self.task(task).map(|n| {
            n.budget
                .wall_time_ms
                .saturating_mul(self.limits.deadline_factor as u64)
        })
    }

    /// Follows the consequences of tasks that just ended: dependents become ready or are
    /// cancelled, subtasks of an ended parent are cancelled, parents whose stop condition now
    /// holds move on, and the run finishes when nothing is left. Touches only the neighbours
    /// of what changed.
    fn settle(
        &mut self,
        out: &mut Emitted,
        mut work: VecDeque<NodeIndex>,
    ) -> Result<(), GraphError> {
        while let Some(ix) = work.pop_front() {
            let state = self.dag[ix].state;
            let id = self.dag[ix].id.clone();
            if state == TaskState::Completed {
                let mut succ = self
                    .dag
                    .neighbors_directed(ix, Direction::Outgoing)
                    .detach();
                while let Some(s) = succ.next_node(&self.dag) {
                    let n = &self.dag[s];
                    if n.state == TaskState::Pending && n.unfinished_deps == 0 {
                        let task = n.id.clone();
                        self.emit(out, EventKind::TaskReady { task })?;
                    }
                }
            } else {
                for c in self.dag[ix].children.clone() {
                    self.cancel_one(out, c, format!("parent {id} is {state}"), &mut work)?;
                }
                let mut succ = self
                    .dag
                    .neighbors_directed(ix, Direction::Outgoing)
                    .detach();
                while let Some(s) = succ.next_node(&self.dag) {
                    self.cancel_one(out, s, format!("dependency {id} is {state}"), &mut work)?;
                }
            }
            if let Some(p) = self.dag[ix].parent {
                self.check_parent(out, p, &mut work)?;
            }
        }
        if self.planning_finished && self.live == 0 && self.outcome.is_none() {
            let (outcome, reason) = if let Some((spent, budget)) = self.budget_exhausted {
                let why = format!("budget exhausted: the run spent {spent} of its {budget}");
                (RunOutcome::Failed, Some(why))
            } else if self.cancel_requested {
                (RunOutcome::Cancelled, None)
            } else if self.unsuccessful_roots > 0 || self.planner_failed {
                (RunOutcome::Failed, None)
            } else {
                (RunOutcome::Completed, None)
            };
            self.emit(out, EventKind::RunFinished { outcome, reason })?;
        }
        Ok(())
    }

    /// Fails the task at `ix` on its current attempt; its consequences are followed when
    /// `work` is settled.
    fn fail_task(
        &mut self,
        out: &mut Emitted,
        ix: NodeIndex,
        reason: FailureReason,
        work: &mut VecDeque<NodeIndex>,
    ) -> Result<(), GraphError> {
        let node = &self.dag[ix];
        let event = EventKind::TaskFailed {
            task: node.id.clone(),
            attempt: node.attempt,
            reason,
        };
        self.emit(out, event)?;
        work.push_back(ix);
        Ok(())
    }

    /// Fails the task at `ix` and follows every consequence.
    fn fail_and_settle(
        &mut self,
        out: &mut Emitted,
        ix: NodeIndex,
        reason: FailureReason,
    ) -> Result<(), GraphError> {
        let mut work = VecDeque::new();
        self.fail_task(out, ix, reason, &mut work)?;
        self.settle(out, work)
    }

    /// Moves a waiting parent on once its stop condition decides.
    fn check_parent(
        &mut self,
        out: &mut Emitted,
        p: NodeIndex,
        work: &mut VecDeque<NodeIndex>,
    ) -> Result<(), GraphError> {
        let parent = &self.dag[p];
        if parent.state != TaskState::WaitingForSubtasks {
            return Ok(());
        }
        let id = parent.id.clone();
        let open = parent.open_children;
        let completed = parent.completed_children;
        let total = parent.children.len() as u32;
        match parent.stop_when {
            StopCondition::AllSubtasksComplete => {
                let unsuccessful = total - open - completed;
                if unsuccessful > 0 {
                    let failed = parent
                        .children
                        .iter()
                        .find(|&&c| {
                            matches!(self.dag[c].state, TaskState::Failed | TaskState::Cancelled)
                        })
                        .map(|&c| self.dag[c].id.clone())
                        .unwrap_or_else(|| id.clone());
                    self.fail_task(
                        out,
                        p,
                        FailureReason::SubtaskFailed { subtask: failed },
                        work,
                    )?;
                } else if open == 0 {
                    self.emit(out, EventKind::SubtasksCompleted { parent: id })?;
                }
            }
            StopCondition::FirstSuccess => {
                if completed > 0 {
                    for c in self.dag[p].children.clone() {
                        self.cancel_one(out, c, format!("a sibling completed {id} first"), work)?;
                    }
                    self.emit(out, EventKind::SubtasksCompleted { parent: id })?;
                } else if open == 0 {
                    self.fail_task(out, p, FailureReason::NoSubtaskSucceeded, work)?;
                }
            }
            StopCondition::UserDecision => {
                if open == 0 {
                    self.emit(out, EventKind::AwaitingUserDecision { parent: id })?;
                }
            }
        }
        Ok(())
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

impl RunGraph {
    pub(crate) fn node(&self, ix: NodeIndex) -> &TaskNode {
        &self.dag[ix]
    }

    pub(crate) fn index_of(&self, id: &TaskId) -> Option<NodeIndex> {
        self.index.get(id).copied()
    }

    pub(crate) fn open_duplicate(&self, fingerprint: Fingerprint) -> Option<&TaskId> {
        self.open_fingerprints
            .get(&fingerprint)
            .map(|&ix| &self.dag[ix].id)
    }

    pub(crate) fn decompositions(&self) -> u32 {
        self.decompositions
    }
}
