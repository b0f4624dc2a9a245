//! Decomposition (ADR-009): an agent's subplan, a human's decision on a parent waiting under
//! `UserDecision`, and the decomposition deadline.
//!
//! Subplans come from an agent or the Subplanner (`propose`); the proposal loop stops
//! (`ProposalsStopped`) after K rejections; closing the Subplanner's open decomposition lives
//! here too.

use std::collections::VecDeque;

use petgraph::graph::NodeIndex;

use super::validate::Proposal;
use super::{Emitted, GraphError, RunGraph, validate};
use crate::protocol::{
    ArtifactRef, EventKind, FailureReason, Handoff, HandoffStatus, ProposedSubplan,
    RejectionReason, StopCondition, TaskId, TaskState, UserDecision,
};

/// Who proposed a subplan.
pub(super) enum Proposer {
    /// An agent's report (ADR-009), with the work delivered beside the proposal.
    Agent {
        handoff: Option<Box<Handoff>>,
        artifacts: Vec<ArtifactRef>,
    },
    /// The Subplanner's first batch for a running task (ADR-008).
    SubplannerFirst,
    /// A further batch of the Subplanner's open decomposition.
    SubplannerMore,
}

impl RunGraph {
    /// The subplan part of an agent's report (ADR-009): validated, then inserted with the
    /// parent waiting for it, or rejected with the graph unchanged.
    pub(super) fn decompose(
        &mut self,
        out: &mut Emitted,
        ix: NodeIndex,
        plan: ProposedSubplan,
        handoff: Option<Handoff>,
        artifacts: Vec<ArtifactRef>,
    ) -> Result<(), GraphError> {
        self.propose(
            out,
            ix,
            plan,
            Proposer::Agent {
                handoff: handoff.map(Box::new),
                artifacts,
            },
        )
    }

    /// A subplan from an agent or from the Subplanner, validated by the same rules
    /// (`validate_subplan`), then inserted all at once or rejected with the graph unchanged.
    /// Who proposed decides what an acceptance records and what happens once too many
    /// proposals of the attempt were rejected.
    pub(super) fn propose(
        &mut self,
        out: &mut Emitted,
        ix: NodeIndex,
        plan: ProposedSubplan,
        proposer: Proposer,
    ) -> Result<(), GraphError> {
        let task = self.dag[ix].id.clone();
        let attempt = self.dag[ix].attempt;
        let proposal = match proposer {
            Proposer::SubplannerMore => Proposal::FurtherBatch,
            _ => Proposal::Decompose,
        };
        // The Subplanner is told that each subtask needs acceptance criteria, and flotilla
        // refuses a batch without them; an agent's subplan is asked for less (worker.md).
        let checked = match proposer {
            Proposer::Agent { .. } => Ok(()),
            Proposer::SubplannerFirst | Proposer::SubplannerMore => {
                validate::require_acceptance(&plan)
            }
        };
        match checked.and_then(|()| validate::validate_subplan(self, ix, &plan, proposal)) {
            Err(reason) => {
                let past_cap = matches!(reason, RejectionReason::AttemptDecompositionCap { .. });
                self.emit(
                    out,
                    EventKind::DecompositionRejected {
                        parent: task.clone(),
                        attempt,
                        reason,
                    },
                )?;
                let rejections = self.dag[ix].rejections_this_attempt;
                if past_cap || rejections >= self.limits.max_subplan_rejections {
                    match proposer {
                        Proposer::Agent { handoff, artifacts } => {
                            let handoff = handoff.map(|h| *h);
                            self.stop_proposing(out, ix, rejections, handoff, artifacts)?;
                        }
                        // The Subplanner could not split the task validly: a worker takes it
                        // as it is, which is what the Subplanner does with an atomic task.
                        Proposer::SubplannerFirst => self.emit(
                            out,
                            EventKind::TaskAtomic {
                                task,
                                attempt,
                                reason: format!(
                                    "the Subplanner's subplans were rejected {rejections} times; a worker takes the task as it is"
                                ),
                            },
                        )?,
                        Proposer::SubplannerMore => self.close_decomposition(
                            out,
                            ix,
                            format!("{rejections} further batches in a row were rejected"),
                        )?,
                    }
                }
            }
            Ok(valid) => {
                // Child numbers stay far below u32::MAX: `Limits::validate` keeps max_nodes
                // within what ids can number.
                let base = self.dag[ix].children.len() as u32;
                let ids: Vec<TaskId> = (0..valid.items.len() as u32)
                    .map(|i| task.child(base.saturating_add(i).saturating_add(1)))
                    .collect();
                for &i in &valid.order {
                    let item = &valid.items[i];
                    let depends_on = item.batch_deps.iter().map(|&j| ids[j].clone()).collect();
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
                let accepted = match proposer {
                    Proposer::Agent { handoff, artifacts } => EventKind::DecompositionAccepted {
                        parent: task.clone(),
                        attempt,
                        reason: plan.reason,
                        stop_when: plan.stop_when,
                        subtasks: ids.clone(),
                        handoff: handoff.map(|h| *h),
                        artifacts,
                        subplanner: false,
                    },
                    Proposer::SubplannerFirst => EventKind::DecompositionAccepted {
                        parent: task.clone(),
                        attempt,
                        reason: plan.reason,
                        stop_when: plan.stop_when,
                        subtasks: ids.clone(),
                        handoff: None,
                        artifacts: Vec::new(),
                        subplanner: true,
                    },
                    Proposer::SubplannerMore => EventKind::SubtasksAdded {
                        parent: task.clone(),
                        attempt,
                        subtasks: ids.clone(),
                    },
                };
                self.emit(out, accepted)?;
                let mut work = VecDeque::new();
                for id in &ids {
                    self.settle_new(out, id, &mut work)?;
                }
                self.settle(out, work)?;
            }
        }
        self.check_run_budget(out)
    }

    /// Closes the Subplanner's open decomposition of the task at `ix`: no more subtasks; the
    /// parent's result is aggregated once every subtask has ended (perhaps at once).
    pub(super) fn close_decomposition(
        &mut self,
        out: &mut Emitted,
        ix: NodeIndex,
        reason: String,
    ) -> Result<(), GraphError> {
        let node = &self.dag[ix];
        if !node.decomposition_open || node.state != TaskState::WaitingForSubtasks {
            return Ok(());
        }
        let event = EventKind::DecompositionClosed {
            parent: node.id.clone(),
            attempt: node.attempt,
            reason,
        };
        self.emit(out, event)?;
        let mut work = VecDeque::new();
        self.check_parent(out, ix, &mut work)?;
        self.settle(out, work)
    }

    /// Ends an attempt that keeps proposing rejected subplans: with the last report's handoff
    /// if it is usable work (complete or partial), otherwise as failed with `ProposalLoop`.
    /// Not retried: another attempt of the same agent would loop the same way.
    fn stop_proposing(
        &mut self,
        out: &mut Emitted,
        ix: NodeIndex,
        rejections: u32,
        handoff: Option<Handoff>,
        artifacts: Vec<ArtifactRef>,
    ) -> Result<(), GraphError> {
        let task = self.dag[ix].id.clone();
        let attempt = self.dag[ix].attempt;
        self.emit(
            out,
            EventKind::ProposalsStopped {
                task: task.clone(),
                attempt,
                rejections,
            },
        )?;
        let usable = handoff
            .as_ref()
            .is_some_and(|h| matches!(h.status, HandoffStatus::Complete | HandoffStatus::Partial));
        if usable {
            self.emit(
                out,
                EventKind::TaskCompleted {
                    task,
                    attempt,
                    handoff,
                    artifacts,
                },
            )?;
            self.settle(out, VecDeque::from([ix]))
        } else {
            self.fail_and_settle(out, ix, FailureReason::ProposalLoop { rejections })
        }
    }

    /// A human's answer for a parent waiting under `StopCondition::UserDecision`.
    pub fn user_decision(
        &mut self,
        task: &TaskId,
        decision: &UserDecision,
    ) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        let held =
            self.index.get(task).copied().filter(|&ix| {
                self.dag[ix].state == TaskState::Landing && self.dag[ix].landing_held
            });
        if let Some(ix) = held {
            match decision {
                UserDecision::Land => {
                    self.emit(&mut out, EventKind::LandingAllowed { task: task.clone() })?
                }
                UserDecision::Fail => {
                    self.fail_and_settle(&mut out, ix, FailureReason::UserDeclined)?
                }
                UserDecision::Accept { .. } | UserDecision::Complete => self.ignore(
                    &mut out,
                    Some(task),
                    "UserDecision",
                    "the task waits to land: decide --land or --fail".into(),
                ),
            }
            return Ok(out);
        }
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
            UserDecision::Land => {
                self.ignore(
                    &mut out,
                    Some(task),
                    "UserDecision",
                    "the task holds no work waiting to land".into(),
                );
            }
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
}
