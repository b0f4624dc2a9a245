//! Settling: following the consequences of tasks that ended (dependents become ready or are
//! cancelled, subtasks of an ended parent are cancelled, parents whose stop condition holds
//! move on, the run finishes), and the cancel and fail helpers that feed it.

use std::collections::VecDeque;

use petgraph::Direction;
use petgraph::graph::NodeIndex;

use super::{Emitted, GraphError, RunGraph};
use crate::protocol::{EventKind, FailureReason, RunOutcome, StopCondition, TaskId, TaskState};

impl RunGraph {
    /// Follows the consequences of tasks that just ended: dependents become ready or are
    /// cancelled, subtasks of an ended parent are cancelled, parents whose stop condition now
    /// holds move on, and the run finishes when nothing is left. Touches only the neighbours
    /// of what changed.
    pub(super) fn settle(
        &mut self,
        out: &mut Emitted,
        mut work: VecDeque<NodeIndex>,
    ) -> Result<(), GraphError> {
        while let Some(ix) = work.pop_front() {
            let state = self.dag[ix].state;
            let id = self.dag[ix].id.clone();
            if state == TaskState::Completed {
                self.fix_landed_nothing(out, ix)?;
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
                self.fix_ended_badly(out, ix, &mut work)?;
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
            } else if let Some(why) = &self.cancel_requested {
                (RunOutcome::Cancelled, Some(why.clone()))
            } else if let Some(error) = &self.planner_gave_up {
                let why = format!("the planner gave up: {error}");
                (RunOutcome::Failed, Some(why))
            } else if self.dag.node_count() == 0 {
                // Nothing was ever planned: completed only when the planner meant it (its
                // last answer was a valid, empty task list after the reminder), else failed
                // with what was wrong with its answers.
                self.nothing_planned()
            } else if self.unsuccessful_roots > 0 {
                let why = format!(
                    "{} of the planner's tasks did not complete",
                    self.unsuccessful_roots
                );
                (RunOutcome::Failed, Some(why))
            } else if self.merging {
                // Planning is done and every task ended well: main must be green too.
                return self.finalize(out);
            } else {
                (RunOutcome::Completed, None)
            };
            self.emit(out, EventKind::RunFinished { outcome, reason })?;
        }
        Ok(())
    }

    /// How a run that never had a task ends.
    fn nothing_planned(&self) -> (RunOutcome, Option<String>) {
        let calls = self.planner_calls;
        match &self.last_planner_problem {
            Some(None) => (
                RunOutcome::Completed,
                Some(format!(
                    "the planner planned no task: after {calls} call{} it answered that the \
                     request needs no work",
                    if calls == 1 { "" } else { "s" }
                )),
            ),
            Some(Some(problem)) => (
                RunOutcome::Failed,
                Some(format!(
                    "the planner produced no usable task in {calls} call{}; the last answer: {problem}",
                    if calls == 1 { "" } else { "s" }
                )),
            ),
            None => (
                RunOutcome::Failed,
                Some("the planner produced no task: it gave no answer".to_string()),
            ),
        }
    }

    /// A just-added task: cancelled if a dependency already failed, ready if none is pending.
    pub(super) fn settle_new(
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

    /// Moves a waiting parent on once its stop condition decides. The Subplanner's
    /// decomposition (ADR-008) has one condition of its own: closed, and every subtask
    /// ended, whatever its outcome (its aggregate says how it went).
    pub(super) fn check_parent(
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
        if parent.subplanned {
            if !parent.decomposition_open && open == 0 {
                self.emit(out, EventKind::SubtasksCompleted { parent: id })?;
            }
            return Ok(());
        }
        match parent.stop_when {
            StopCondition::AllSubtasksComplete => {
                let unsuccessful = total.saturating_sub(open).saturating_sub(completed);
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

    /// Carries out a whole-run cancel that is in the journal but was never carried out: the
    /// daemon journals one itself when the user cancels a run that has no actors for the
    /// moment (paused for refused storage, or between two lives). Every task not yet ended
    /// is cancelled, as a live cancel does, and the run ends once nothing is in flight, also
    /// when no task is left open (a cancel while planning, or during the final sweep).
    /// Nothing when no cancel waits or the run has finished.
    pub fn carry_out_journaled_cancel(&mut self) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        let Some(reason) = self.cancel_requested.clone() else {
            return Ok(out);
        };
        if self.outcome.is_some() {
            return Ok(out);
        }
        let targets: Vec<NodeIndex> = self
            .dag
            .node_indices()
            .filter(|&ix| self.dag[ix].parent.is_none() && !self.dag[ix].state.is_terminal())
            .collect();
        let mut work = VecDeque::new();
        for ix in targets {
            self.cancel_one(&mut out, ix, reason.clone(), &mut work)?;
        }
        self.settle(&mut out, work)?;
        Ok(out)
    }

    pub(super) fn cancel_one(
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
    pub(super) fn fail_and_settle(
        &mut self,
        out: &mut Emitted,
        ix: NodeIndex,
        reason: FailureReason,
    ) -> Result<(), GraphError> {
        let mut work = VecDeque::new();
        self.fail_task(out, ix, reason, &mut work)?;
        self.settle(out, work)
    }
}
