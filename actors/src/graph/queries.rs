//! Queries: read-only views of the graph for the actors, status output and tests.
//!
//! Snapshots (`GraphSnapshot`) and read-only accessors; nothing here mutates.

use petgraph::Direction;
use petgraph::graph::NodeIndex;

use super::{Fingerprint, RunGraph, TaskNode};
use crate::config::Limits;
use crate::protocol::{
    Budget, GraphSnapshot, ReadyTask, RunOutcome, SubtaskResult, TaskId, TaskState, TaskView,
};

impl RunGraph {
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

    /// What Dispatch needs to queue a ready task. Its budget is what the task has left after
    /// its earlier attempts (interrupted and failed ones included), so each attempt's limits,
    /// its wall time above all, bind across attempts rather than restarting.
    pub fn ready_task(&self, id: &TaskId) -> Option<ReadyTask> {
        let node = self.task(id)?;
        Some(ReadyTask {
            task: node.id.clone(),
            attempt: node.attempt,
            spec: node.spec.clone(),
            critical_path: node.critical_path,
            created: node.created,
            budget: node.budget.saturating_sub(node.spent),
            atomic: node.atomic,
            fix: node.fix.as_deref().cloned(),
            previous: node.previous.clone(),
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
            .map(|&c| self.result_of(c))
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
                        review: n.last_review,
                    }
                })
                .collect(),
            planning_finished: self.planning_finished,
            outcome: self.outcome,
            run_spent: self.run_spent,
            run_budget: self.limits.run_budget,
            finish_reason: self.finish_reason.clone(),
        }
    }

    /// How long a decomposed task may wait for its subtasks.
    pub fn deadline_ms(&self, task: &TaskId) -> Option<u64> {
        self.task(task).map(|n| {
            n.budget
                .wall_time_ms
                .saturating_mul(self.limits.deadline_factor as u64)
        })
    }

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
