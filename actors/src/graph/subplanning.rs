//! The Subplanner's commands (ADR-008): its recorded answers, which decompose a task, add a
//! batch to its open decomposition, close it, or hand the task to a worker as atomic; and
//! its giving up on a task.
//!
//! Also the Subplanner's iteration cap and the open decompositions a restart resumes
//! (`Resume`, ADR-008).

use petgraph::graph::NodeIndex;

use super::decomposition::Proposer;
use super::{Emitted, GraphError, RunGraph};
use crate::protocol::{
    DecompositionReason, EventKind, FailureReason, OpenDecomposition, ProposedSubplan,
    StopCondition, SubplannerAnswer, SubtaskResult, TaskId, TaskState,
};

/// The states in which the Subplanner may answer about a task: deciding (dispatched to it,
/// or running) and planning further batches (waiting for subtasks).
const SUBPLANNER_AT_WORK: &[TaskState] = &[
    TaskState::Dispatched,
    TaskState::Running,
    TaskState::WaitingForSubtasks,
];

impl RunGraph {
    /// One Subplanner call: recorded first (`SubplannerResponded`, which charges its usage
    /// to the task and the run), then acted on:
    /// - the first answers, while the task runs: subtasks decompose it (an open
    ///   decomposition); none means the task is atomic and goes to a worker;
    /// - later answers: subtasks are a further batch; none, with no subtask left running
    ///   and none unread, closes the decomposition;
    /// - an unusable answer changes nothing but the record.
    ///
    /// At `max_subplanner_iterations` calls an open decomposition is closed, and a task
    /// still undecided goes to a worker: a model cannot keep a task in planning forever.
    pub fn subplanner_answered(&mut self, answer: SubplannerAnswer) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        let Some(ix) = self.current(
            &mut out,
            &answer.task,
            answer.attempt,
            "SubplannerAnswered",
            SUBPLANNER_AT_WORK,
        ) else {
            return Ok(out);
        };
        let node = &self.dag[ix];
        if node.state == TaskState::WaitingForSubtasks && !node.decomposition_open {
            self.ignore(
                &mut out,
                Some(&answer.task),
                "SubplannerAnswered",
                "the task's decomposition is closed".into(),
            );
            return Ok(out);
        }
        let task = answer.task.clone();
        let attempt = answer.attempt;
        // An answer that overtook its own TaskStarted still means the Subplanner ran.
        if node.state == TaskState::Dispatched {
            self.emit(
                &mut out,
                EventKind::TaskStarted {
                    task: task.clone(),
                    attempt,
                },
            )?;
        }
        self.emit(
            &mut out,
            EventKind::SubplannerResponded {
                task: task.clone(),
                attempt,
                call: answer.call,
                prompt: answer.prompt,
                content: answer.content,
                usage: answer.usage,
                reported: answer.reported,
                error: answer.subtasks.as_ref().err().cloned(),
            },
        )?;
        let node = &self.dag[ix];
        if node.spent.exceeds(&node.budget) {
            let reason = FailureReason::BudgetExceeded {
                spent: node.spent,
                budget: node.budget,
            };
            self.fail_and_settle(&mut out, ix, reason)?;
            self.check_run_budget(&mut out)?;
            return Ok(out);
        }
        self.check_run_budget(&mut out)?;
        if self.dag[ix].state.is_terminal() {
            return Ok(out);
        }
        let deciding = self.dag[ix].state == TaskState::Running;
        match answer.subtasks {
            Ok(subtasks) if subtasks.is_empty() && deciding => {
                self.emit(
                    &mut out,
                    EventKind::TaskAtomic {
                        task: task.clone(),
                        attempt,
                        reason: "the Subplanner found nothing to split".into(),
                    },
                )?;
                return Ok(out);
            }
            Ok(subtasks) if subtasks.is_empty() => {
                let node = &self.dag[ix];
                if node.open_children == 0 && node.unheard.is_empty() {
                    self.close_decomposition(
                        &mut out,
                        ix,
                        "the Subplanner has nothing more to plan".into(),
                    )?;
                }
            }
            Ok(subtasks) => {
                let plan = ProposedSubplan {
                    parent: task.clone(),
                    reason: DecompositionReason::TooLarge,
                    subtasks,
                    stop_when: StopCondition::AllSubtasksComplete,
                };
                let proposer = if deciding {
                    Proposer::SubplannerFirst
                } else {
                    Proposer::SubplannerMore
                };
                self.propose(&mut out, ix, plan, proposer)?;
            }
            Err(_) => {}
        }
        self.enforce_subplanner_cap(&mut out, ix)?;
        Ok(out)
    }

    /// At the iteration cap: an open decomposition is closed; an undecided task goes to a
    /// worker.
    fn enforce_subplanner_cap(
        &mut self,
        out: &mut Emitted,
        ix: NodeIndex,
    ) -> Result<(), GraphError> {
        let node = &self.dag[ix];
        let cap = self.limits.max_subplanner_iterations;
        if node.subplanner_calls < cap {
            return Ok(());
        }
        let reason = format!("the Subplanner reached its limit of {cap} calls for the task");
        match node.state {
            TaskState::WaitingForSubtasks => self.close_decomposition(out, ix, reason),
            TaskState::Running => {
                let event = EventKind::TaskAtomic {
                    task: node.id.clone(),
                    attempt: node.attempt,
                    reason,
                };
                self.emit(out, event)
            }
            _ => Ok(()),
        }
    }

    /// The Subplanner gave up on `task` (its model failed for good, or its answers kept
    /// being unusable). An undecided task goes to a worker as it is; an open decomposition
    /// is closed with the subtasks it has.
    pub fn subplanner_stopped(
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
            "SubplannerStopped",
            SUBPLANNER_AT_WORK,
        ) else {
            return Ok(out);
        };
        let reason = format!("the Subplanner stopped: {reason}");
        if self.dag[ix].state == TaskState::WaitingForSubtasks {
            self.close_decomposition(&mut out, ix, reason)?;
        } else {
            self.emit(
                &mut out,
                EventKind::TaskAtomic {
                    task: task.clone(),
                    attempt,
                    reason,
                },
            )?;
        }
        Ok(out)
    }

    /// After a restart: the Subplanner's decompositions that are still open. O(graph), for
    /// recovery only.
    pub fn open_decompositions(&self) -> Vec<OpenDecomposition> {
        self.dag
            .node_weights()
            .filter(|n| n.state == TaskState::WaitingForSubtasks && n.decomposition_open)
            .map(|n| OpenDecomposition {
                parent: n.id.clone(),
                attempt: n.attempt,
                spec: n.spec.clone(),
                active: n
                    .children
                    .iter()
                    .map(|&c| &self.dag[c])
                    .filter(|c| !c.state.is_terminal())
                    .map(|c| (c.id.clone(), c.spec.description.clone()))
                    .collect(),
                unheard: n.unheard.iter().map(|&c| self.result_of(c)).collect(),
            })
            .collect()
    }

    /// A subtask's result as its parent's agent sees it.
    pub fn subtask_result(&self, task: &TaskId) -> Option<SubtaskResult> {
        self.index.get(task).map(|&ix| self.result_of(ix))
    }

    pub(super) fn result_of(&self, ix: NodeIndex) -> SubtaskResult {
        let node = &self.dag[ix];
        SubtaskResult {
            task: node.id.clone(),
            state: node.state,
            handoff: node.handoff.as_deref().cloned(),
            failure: node.failure.as_deref().cloned(),
        }
    }
}
