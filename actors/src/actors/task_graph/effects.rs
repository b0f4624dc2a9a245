//! What the TaskGraph does once events are journaled ([`TaskGraph::perform`]): ready tasks to
//! Dispatch, decisions to the proposing agent, cancellations and subtask news to agents and the
//! Subplanner, landings to the MergeQueue, deadlines armed. Nothing here is sent before the
//! events it follows from are committed.

use super::*;

impl TaskGraph {
    pub(super) fn perform(&mut self, events: Vec<Event>, ctx: &mut Context<Self>) {
        let mut ready = Vec::new();
        let mut something_ended = false;
        // The planner counts a refused batch as an error; an accepted one ends its streak.
        let mut batch_accepted = false;
        for event in &events {
            if let EventKind::TaskAdded { task, .. } = &event.kind {
                batch_accepted |= task.depth() == 1;
            }
            if let EventKind::TaskCompleted { task, .. }
            | EventKind::TaskLanded { task, .. }
            | EventKind::TaskFailed { task, .. }
            | EventKind::TaskCancelled { task, .. } = &event.kind
            {
                something_ended = true;
                self.tell_planner_root_ended(task);
                self.tell_subplanner_subtask_ended(task);
            }
            match &event.kind {
                EventKind::TasksRejected { reason } => {
                    if let Some(planner) = &self.planner {
                        planner.do_send(ToPlanner::BatchRejected {
                            reason: reason.clone(),
                        });
                    }
                }
                EventKind::TaskReady { task } => ready.extend(self.graph.ready_task(task)),
                EventKind::TaskRetried { task, .. } => {
                    self.agents.remove(task);
                    self.dispatch
                        .do_send(ToDispatch::Release { task: task.clone() });
                    ready.extend(self.graph.ready_task(task));
                }
                EventKind::TaskCompleted { task, .. } => {
                    self.agents.remove(task);
                    self.dispatch
                        .do_send(ToDispatch::Release { task: task.clone() });
                }
                // The agent is done: its slot and scope go back; the branch goes to the
                // merge queue.
                EventKind::TaskLanding { task, .. } => {
                    self.agents.remove(task);
                    self.dispatch
                        .do_send(ToDispatch::Release { task: task.clone() });
                    self.enqueue_landing(task, false);
                }
                // Its conflict fix had nothing to resolve: the task's branch lands itself.
                EventKind::LandingRequeued { task, .. } => self.enqueue_landing(task, false),
                // The user let a held landing go (ADR-016).
                EventKind::LandingAllowed { task } => self.enqueue_landing(task, false),
                // The user adopted a diverged main (ADR-024): landing resumes on top of it.
                EventKind::MainAdopted { expected, tip, .. } => {
                    if let Some(queue) = &self.merge_queue {
                        queue.do_send(ToMergeQueue::Adopted {
                            expected: expected.clone(),
                            tip: tip.clone(),
                            dropped: self.graph.dropped_commits().to_vec(),
                        });
                    }
                }
                EventKind::FinalizationStarted { attempt } => {
                    if let Some(reconciler) = &self.reconciler {
                        reconciler.do_send(ToReconciler::Finalize {
                            attempt: *attempt,
                            commit: self.graph.main_tip(),
                        });
                    }
                }
                EventKind::TaskFailed { task, reason, .. } => {
                    self.dispatch
                        .do_send(ToDispatch::Release { task: task.clone() });
                    let agent = self.agents.remove(task);
                    // The agent reported these itself; any other failure it must hear about.
                    let from_agent = matches!(
                        reason,
                        FailureReason::AgentFailed { .. } | FailureReason::Blocked { .. }
                    );
                    if let (Some(agent), false) = (agent, from_agent) {
                        let reason = format!("task failed: {reason}");
                        agent.do_send(ToAgent::Cancel {
                            task: task.clone(),
                            reason,
                        });
                    }
                }
                EventKind::TaskCancelled { task, reason, was } => {
                    self.dispatch
                        .do_send(ToDispatch::Release { task: task.clone() });
                    if let (TaskState::Landing, Some(queue)) = (was, &self.merge_queue) {
                        queue.do_send(ToMergeQueue::Withdraw { task: task.clone() });
                    }
                    if let Some(agent) = self.agents.remove(task) {
                        agent.do_send(ToAgent::Cancel {
                            task: task.clone(),
                            reason: reason.clone(),
                        });
                    }
                }
                EventKind::DecompositionAccepted {
                    parent, subtasks, ..
                } => {
                    // A waiting parent holds no worker slot and no scope lock: its subtasks
                    // need both.
                    self.dispatch.do_send(ToDispatch::Release {
                        task: parent.clone(),
                    });
                    self.tell_agent(
                        parent,
                        ToAgent::DecompositionAccepted(TaskDecompositionAccepted {
                            parent: parent.clone(),
                            subtasks: subtasks.clone(),
                        }),
                    );
                    self.arm_deadline(parent, ctx);
                }
                // A task stopped for proposing too often is over: its agent gets the Cancel
                // below, not an invitation to revise.
                EventKind::DecompositionRejected { parent, .. } if self.is_over(parent) => {}
                EventKind::ProposalsStopped {
                    task, rejections, ..
                } => {
                    if let Some(agent) = self.agents.remove(task) {
                        agent.do_send(ToAgent::Cancel {
                            task: task.clone(),
                            reason: format!("stopped after {rejections} rejected subplans"),
                        });
                    }
                }
                EventKind::DecompositionRejected { parent, reason, .. } => {
                    self.tell_agent(
                        parent,
                        ToAgent::DecompositionRejected(TaskDecompositionRejected {
                            parent: parent.clone(),
                            reason: reason.clone(),
                        }),
                    );
                }
                EventKind::SubtasksCompleted { parent } => self.send_subtasks_completed(parent),
                EventKind::DecompositionClosed { parent, reason, .. } => {
                    self.tell_agent(
                        parent,
                        ToAgent::DecompositionClosed {
                            parent: parent.clone(),
                            reason: reason.clone(),
                        },
                    );
                }
                EventKind::SubtasksAdded {
                    parent, subtasks, ..
                } => {
                    self.tell_agent(
                        parent,
                        ToAgent::DecompositionAccepted(TaskDecompositionAccepted {
                            parent: parent.clone(),
                            subtasks: subtasks.clone(),
                        }),
                    );
                }
                // The Subplanner handed the task over: it goes back to Dispatch, for a
                // worker this time.
                EventKind::TaskAtomic { task, reason, .. } => {
                    if let Some(agent) = self.agents.remove(task) {
                        agent.do_send(ToAgent::Cancel {
                            task: task.clone(),
                            reason: format!("handed to a worker: {reason}"),
                        });
                    }
                    self.dispatch
                        .do_send(ToDispatch::Release { task: task.clone() });
                    ready.extend(self.graph.ready_task(task));
                }
                _ => {}
            }
            if let Some(observer) = &self.observer {
                observer.do_send(Published(event.clone()));
            }
        }
        let readied = ready.len();
        if !ready.is_empty() {
            self.dispatch.do_send(ToDispatch::Ready(ready));
        }
        if let (true, Some(planner)) = (batch_accepted, &self.planner) {
            planner.do_send(ToPlanner::BatchAccepted { ready: readied });
        }
        self.quiescence_due |= something_ended;
    }

    /// The Subplanner replans after every subtask handoff of a decomposition it still
    /// plans (ADR-008).
    pub(super) fn tell_subplanner_subtask_ended(&self, task: &TaskId) {
        let Some(parent) = self.graph.task(task).and_then(|n| n.id.parent()) else {
            return;
        };
        let open = self
            .graph
            .task(&parent)
            .is_some_and(|p| p.state == TaskState::WaitingForSubtasks && p.decomposition_open);
        if !open {
            return;
        }
        let (Some(result), Some(p)) = (self.graph.subtask_result(task), self.graph.task(&parent))
        else {
            return;
        };
        let attempt = p.attempt;
        self.tell_agent(
            &parent,
            ToAgent::SubtaskEnded(SubtaskEnded {
                parent: parent.clone(),
                attempt,
                result,
            }),
        );
    }

    pub(super) fn is_over(&self, task: &TaskId) -> bool {
        self.graph.task(task).is_some_and(|n| n.state.is_terminal())
    }

    pub(super) fn tell_agent(&self, task: &TaskId, message: ToAgent) {
        // After a restart no agent is registered: the Subplanner's decompositions stay its
        // own, every other parent's synthesis goes to the default agent.
        let subplanned = self.graph.task(task).is_some_and(|n| n.subplanned);
        let fallback = if subplanned {
            self.subplanner.as_ref()
        } else {
            self.default_agent.as_ref()
        };
        match self.agents.get(task).or(fallback) {
            Some(agent) => agent.do_send(message),
            None => {
                warn!(run = %self.run, %task, "no agent registered for the task; message dropped")
            }
        }
    }

    /// Rule (j): the parent fails unless its subtasks all end within `deadline_factor` × its
    /// wall-time budget.
    pub(super) fn arm_deadline(&self, parent: &TaskId, ctx: &mut Context<Self>) {
        if let Some(ms) = self.graph.deadline_ms(parent) {
            self.arm_deadline_in(parent, ms, ctx);
        }
    }

    pub(super) fn arm_deadline_in(&self, parent: &TaskId, ms: u64, ctx: &mut Context<Self>) {
        let Some(node) = self.graph.task(parent) else {
            return;
        };
        let decomposition = node.decompositions;
        let task = parent.clone();
        ctx.run_later(Duration::from_millis(ms), move |_, ctx| {
            ctx.notify(ToTaskGraph::DecompositionDeadline {
                task,
                decomposition,
            });
        });
    }
}
