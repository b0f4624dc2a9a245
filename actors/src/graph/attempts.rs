//! Attempts: what agents report about the work they were given (dispatched, started, the
//! deliverable, a failure) and the interruption of in-flight attempts after a restart.
//!
//! `dispatched`, `started`, the deliverable path of `complete`, `failed`, retries (on a fresh
//! branch), and `interrupt_in_flight` (`TaskInterrupted`, not charged as a retry).

use std::collections::VecDeque;

use petgraph::graph::NodeIndex;

use super::{AGENT_AT_WORK, Emitted, GraphError, RunGraph};
use crate::protocol::{
    AttemptFailure, Budget, EventKind, FailureReason, Finding, HandoffStatus, ReviewVerdict, Route,
    TaskCompleted, TaskId, TaskState, Usage,
};

impl RunGraph {
    /// Looks up the task a message is about. Unknown tasks, terminal tasks, stale attempts and
    /// tasks not in one of the `expected` states produce `MessageIgnored` and `None`: a late
    /// message never changes a settled task.
    pub(super) fn current(
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
        // what the attempt has not already reported as it went. Not for the Subplanner's
        // aggregate (ADR-008): its metrics sum its subtasks' handoffs, which were charged to
        // them, and its own calls were charged as they were answered.
        let aggregate = self.dag[ix].subplanned && self.dag[ix].state == TaskState::Synthesizing;
        if let Some(h) = report.handoff.as_ref().filter(|_| !aggregate) {
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
            if self.dag[ix].state != TaskState::Synthesizing {
                self.decompose(&mut out, ix, plan, report.handoff, report.artifacts)?;
                return Ok(out);
            }
            // A synthesis ends its task: the parent's subtasks are spent, and nobody would
            // answer a subplan now (the task would stay `synthesizing` for ever). The
            // subplan is refused; the handoff, if any, is the synthesis.
            let why = format!(
                "a synthesis handed back a subplan of {} subtask(s); it is refused (a \
                 synthesis reports its parent's result)",
                plan.subtasks.len()
            );
            if report.handoff.is_none() {
                let failure = AttemptFailure::Malformed { detail: why };
                self.fail_attempt(&mut out, ix, attempt, failure)?;
                self.check_run_budget(&mut out)?;
                return Ok(out);
            }
            self.ignore(&mut out, Some(&task), "ProposedSubplan", why);
        }

        let status = report
            .handoff
            .as_ref()
            .map_or(HandoffStatus::Complete, |h| h.status);
        match status {
            HandoffStatus::Complete | HandoffStatus::Partial => {
                if let Some((branch, head)) = self.lands(report.handoff.as_ref()) {
                    // A change to flotilla's own configuration waits for the user before it
                    // goes to the merge queue (ADR-016).
                    let held = report.handoff.as_ref().is_some_and(|h| {
                        h.findings
                            .iter()
                            .any(|f| matches!(f, Finding::ConfigChanged { allowed: false, .. }))
                    });
                    let asked = held.then(|| EventKind::AwaitingUserDecision {
                        parent: task.clone(),
                    });
                    // Done, but not Completed until its branch is on main (ADR-011): nothing
                    // ended, so there is nothing to settle yet.
                    self.emit(
                        &mut out,
                        EventKind::TaskLanding {
                            task,
                            attempt,
                            handoff: report.handoff,
                            artifacts: report.artifacts,
                            branch,
                            head,
                        },
                    )?;
                    if let Some(asked) = asked {
                        self.emit(&mut out, asked)?;
                    }
                    self.check_run_budget(&mut out)?;
                    return Ok(out);
                }
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
                // The handoff's findings (a failed verification) go to the retry (ADR-031).
                let (summary, findings) = report
                    .handoff
                    .map(|h| (h.summary, h.findings))
                    .unwrap_or_default();
                let failure = AttemptFailure::Reported { summary };
                self.fail_attempt_with(&mut out, ix, attempt, failure, findings)?;
                self.check_run_budget(&mut out)?;
                return Ok(out);
            }
        }
        self.settle(&mut out, VecDeque::from([ix]))?;
        self.check_run_budget(&mut out)?;
        Ok(out)
    }

    /// The reviewer's verdict on the attempt's sealed work (ADR-038): journaled, nothing
    /// else. The attempt's own report (completion or failure) follows it.
    pub fn reviewed(
        &mut self,
        task: &TaskId,
        attempt: u32,
        review: ReviewVerdict,
        calls: u32,
        usage: Usage,
    ) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        if self
            .current(&mut out, task, attempt, "Reviewed", AGENT_AT_WORK)
            .is_none()
        {
            return Ok(out);
        }
        self.emit(
            &mut out,
            EventKind::ReviewVerdict {
                task: task.clone(),
                attempt,
                review,
                calls,
                usage,
            },
        )?;
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

    /// Retries a retryable failure while attempts and budget remain (never for a
    /// synthesizing parent, whose subtasks are spent), otherwise fails the task and
    /// everything that needed it. A task that has used up any dimension of its budget (the
    /// Worker charged the attempt's wall time before its failure) fails `BudgetExceeded`
    /// with the figures: a retry would be over budget at once.
    pub(super) fn fail_attempt(
        &mut self,
        out: &mut Emitted,
        ix: NodeIndex,
        attempt: u32,
        failure: AttemptFailure,
    ) -> Result<(), GraphError> {
        self.fail_attempt_with(out, ix, attempt, failure, Vec::new())
    }

    /// [`RunGraph::fail_attempt`] of an attempt whose handoff had `findings`: a retry is
    /// told of them with its failure (ADR-031).
    pub(super) fn fail_attempt_with(
        &mut self,
        out: &mut Emitted,
        ix: NodeIndex,
        attempt: u32,
        failure: AttemptFailure,
        findings: Vec<Finding>,
    ) -> Result<(), GraphError> {
        let task = self.dag[ix].id.clone();
        let charged = attempt.saturating_sub(self.dag[ix].uncharged_attempts);
        // A parent's subtasks are spent: neither its synthesis nor its landing is retried.
        let retryable = failure.is_retryable()
            && self.dag[ix].state != TaskState::Synthesizing
            && self.dag[ix].children.is_empty()
            && charged < self.limits.max_attempts;
        let node = &self.dag[ix];
        if retryable && node.budget.is_used_up_by(&node.spent) {
            let reason = FailureReason::BudgetExceeded {
                spent: node.spent,
                budget: node.budget,
            };
            self.fail_and_settle(out, ix, reason)
        } else if retryable {
            self.emit(
                out,
                EventKind::TaskRetried {
                    task,
                    attempt,
                    failure,
                    findings,
                },
            )
        } else {
            self.fail_and_settle(out, ix, FailureReason::AgentFailed { failure })
        }
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
}
