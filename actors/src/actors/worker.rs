//! The Worker actor: runs ONE attempt of one task through the `Agent` port, reports, and
//! ends. The run's [`WorkerPool`](super::worker_pool::WorkerPool) starts one per attempt
//! (and one per synthesis) and watches it through a [`Lifeline`]: a panic in one agent call
//! kills only its own Worker, and the pool turns that into a failed attempt.
//!
//! On start it reports `TaskStarted`, creates its scratch workspace and runs the agent,
//! bounded by the wall time the task has left (the assignment's budget: the graph subtracts
//! what earlier attempts spent); the agent's report becomes a `TaskCompleted`
//! carrying the task id and attempt *it* was given (the agent never names ids). Spend the
//! agent reports while it works goes to the TaskGraph as `SpendReported`. A report with a
//! subplan keeps the Worker alive for the decision: a rejection asks the agent to revise,
//! an acceptance ends the attempt (the synthesis is a new Worker). Cancel, timeout and stop
//! all go through one cancellation token that the agent honours, and the workspace is
//! removed when the Worker ends.
//!
//! The Worker charges the agent's time: when an agent call (run, revise, synthesis) ends,
//! whether with a report, a failure, a timeout or a cancel, it reports the call's elapsed
//! wall time as `SpendReported { spent: Budget { wall_time_ms, .. } }` *before* the report or
//! failure, so the TaskGraph charges it first (a task whose time is used up is not retried).
//! Agents report tokens and money; wall time is measured here, on tokio's clock.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::future::BoxFuture;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::ports::{Agent, AgentError, AgentReport, AttemptContext, SpendReporter};
use crate::protocol::{
    Assignment, AttemptFailure, Budget, SubtasksCompleted, TaskCompleted, TaskId, ToAgent,
    ToTaskGraph,
};
use crate::supervision::{Lifeline, StopCause, StopMember};

/// How long an agent that was called off (cancel, timeout) gets to stop what it started
/// before the Worker stops waiting for it.
pub const CALL_OFF_GRACE: Duration = Duration::from_secs(5);

/// What a Worker was started for.
#[derive(Debug, Clone)]
pub enum Job {
    /// Work on an assignment (one attempt).
    Run(Assignment),
    /// Merge the results of a decomposed task's subtasks.
    Synthesize(SubtasksCompleted),
}

pub struct Worker {
    agent: Arc<dyn Agent>,
    graph: Recipient<ToTaskGraph>,
    job: Job,
    task: TaskId,
    attempt: u32,
    limit: Duration,
    workspace: PathBuf,
    cancel: CancellationToken,
    in_flight: Option<SpawnHandle>,
    /// When the agent call in flight started; taken when its time is charged.
    call_started: Option<Instant>,
    /// Agent time this attempt's calls used so far: a revision gets what the first call
    /// left of `limit`, not a fresh `limit`.
    used: Duration,
    /// Cancelled: the agent's answer, when it comes, is not reported.
    called_off: bool,
    lifeline: Option<Lifeline>,
}

impl Worker {
    /// `limit` bounds the agent calls of the attempt together (a revision gets what the
    /// earlier calls left); `workspace` is created on start and removed at the
    /// end.
    pub fn new(
        agent: Arc<dyn Agent>,
        graph: Recipient<ToTaskGraph>,
        job: Job,
        limit: Duration,
        workspace: PathBuf,
    ) -> Self {
        let (task, attempt) = match &job {
            Job::Run(a) => (a.task.task.clone(), a.task.attempt),
            Job::Synthesize(done) => (done.parent.clone(), done.attempt),
        };
        Worker {
            agent,
            graph,
            job,
            task,
            attempt,
            limit,
            workspace,
            cancel: CancellationToken::new(),
            in_flight: None,
            call_started: None,
            used: Duration::ZERO,
            called_off: false,
            lifeline: None,
        }
    }

    /// Reports to the watcher when this Worker ends, however it ends.
    pub fn watched(mut self, lifeline: Lifeline) -> Self {
        self.lifeline = Some(lifeline);
        self
    }

    fn context(&self) -> AttemptContext {
        let graph = self.graph.clone();
        let (task, attempt) = (self.task.clone(), self.attempt);
        AttemptContext {
            workspace: self.workspace.clone(),
            cancel: self.cancel.clone(),
            spend: SpendReporter::new(move |spent| {
                graph.do_send(ToTaskGraph::SpendReported {
                    task: task.clone(),
                    attempt,
                    spent,
                })
            }),
        }
    }

    /// Charges the wall time of the agent call that just ended (once per call; nothing for a
    /// call that took no measurable time).
    fn charge_time(&mut self) {
        let Some(started) = self.call_started.take() else {
            return;
        };
        let elapsed = started.elapsed();
        self.used = self.used.saturating_add(elapsed);
        let elapsed = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        if elapsed > 0 {
            self.graph.do_send(ToTaskGraph::SpendReported {
                task: self.task.clone(),
                attempt: self.attempt,
                spent: Budget {
                    wall_time_ms: elapsed,
                    ..Budget::default()
                },
            });
        }
    }

    /// Runs one agent call and reports its outcome, after the time it took.
    fn drive(
        &mut self,
        call: BoxFuture<'static, Result<AgentReport, AgentError>>,
        ctx: &mut Context<Self>,
    ) {
        // A call replaced before it ended still used the agent's time.
        self.charge_time();
        self.call_started = Some(Instant::now());
        let limit = self
            .limit
            .saturating_sub(self.used)
            .max(Duration::from_millis(1));
        let cancel = self.cancel.clone();
        let bounded = async move {
            let mut call = call;
            tokio::select! {
                result = &mut call => result,
                _ = tokio::time::sleep(limit) => {
                    // Call the agent off and give it a moment to stop what it started;
                    // its answer no longer matters.
                    cancel.cancel();
                    let _ = tokio::time::timeout(CALL_OFF_GRACE, call).await;
                    Err(AgentError::Timeout)
                }
            }
        };
        let handle = ctx.spawn(bounded.into_actor(self).map(|result, act, ctx| {
            act.in_flight = None;
            act.charge_time();
            if act.called_off {
                act.finish(ctx);
                return;
            }
            let proposes = matches!(&result, Ok(report) if report.subplan.is_some());
            let (task, attempt) = (act.task.clone(), act.attempt);
            let message = match result {
                Ok(report) => ToTaskGraph::TaskCompleted(Box::new(TaskCompleted {
                    task,
                    attempt,
                    handoff: report.handoff,
                    artifacts: report.artifacts,
                    subplan: report.subplan,
                })),
                Err(error) => ToTaskGraph::TaskFailed {
                    task,
                    attempt,
                    failure: failure_of(error, act.limit),
                },
            };
            act.graph.do_send(message);
            // A proposal waits for the graph's decision; anything else ends the attempt.
            if !proposes {
                act.finish(ctx);
            }
        }));
        if let Some(previous) = self.in_flight.replace(handle) {
            ctx.cancel_future(previous);
        }
    }

    fn finish(&mut self, ctx: &mut Context<Self>) {
        if let Some(lifeline) = &mut self.lifeline {
            lifeline.set_cause(StopCause::Finished);
        }
        ctx.stop();
    }
}

/// The typed failure the TaskGraph sees: it retries a crash or a timeout, not a budget stop.
fn failure_of(error: AgentError, limit: Duration) -> AttemptFailure {
    match error {
        AgentError::Crashed(detail) => AttemptFailure::Crashed { detail },
        AgentError::Malformed(detail) => AttemptFailure::Malformed { detail },
        AgentError::Timeout => AttemptFailure::TimedOut {
            limit_ms: u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
        },
        AgentError::Cancelled => AttemptFailure::Cancelled,
    }
}

impl Actor for Worker {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        match self.job.clone() {
            Job::Run(assignment) => {
                self.graph.do_send(ToTaskGraph::TaskStarted {
                    task: self.task.clone(),
                    attempt: self.attempt,
                });
                let agent = self.agent.clone();
                let attempt = self.context();
                let workspace = self.workspace.clone();
                let call = Box::pin(async move {
                    tokio::fs::create_dir_all(&workspace).await.map_err(|e| {
                        AgentError::Crashed(format!(
                            "cannot create the workspace {}: {e}",
                            workspace.display()
                        ))
                    })?;
                    agent.run(assignment, attempt).await
                });
                self.drive(call, ctx);
            }
            Job::Synthesize(done) => {
                let call = self
                    .agent
                    .synthesize(done.parent, done.results, self.context());
                self.drive(call, ctx);
            }
        }
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        // Whatever the agent started ends with the attempt, and the time it took is charged
        // (a call cut short by a cancel's grace or a stop ends here).
        self.cancel.cancel();
        self.charge_time();
        let workspace = self.workspace.clone();
        if matches!(self.job, Job::Run(_)) {
            // Scratch only: nothing in it outlives the attempt (M5 replaces it with a
            // worktree whose branch keeps the work).
            actix::spawn(async move {
                if let Err(e) = tokio::fs::remove_dir_all(&workspace).await
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    warn!(workspace = %workspace.display(), error = %e, "cannot remove a scratch workspace");
                }
            });
        }
    }
}

impl Handler<ToAgent> for Worker {
    type Result = ();

    fn handle(&mut self, msg: ToAgent, ctx: &mut Context<Self>) {
        match msg {
            ToAgent::DecompositionAccepted(accepted) => {
                debug!(parent = %accepted.parent, subtasks = accepted.subtasks.len(), "subplan accepted; attempt done");
                self.finish(ctx);
            }
            ToAgent::DecompositionRejected(rejected) => match &self.job {
                Job::Run(assignment) => {
                    let call =
                        self.agent
                            .revise(assignment.clone(), rejected.reason, self.context());
                    self.drive(call, ctx);
                }
                Job::Synthesize(_) => {
                    warn!(task = %self.task, "a rejection reached a synthesizing worker");
                }
            },
            ToAgent::SubtasksCompleted(done) => {
                let call = self
                    .agent
                    .synthesize(done.parent, done.results, self.context());
                self.drive(call, ctx);
            }
            ToAgent::Cancel { task, reason } => {
                debug!(%task, %reason, "attempt called off");
                // The agent hears it through its token and gets a moment to stop; nothing
                // it answers is reported (the TaskGraph already settled the task).
                self.cancel.cancel();
                self.called_off = true;
                if self.in_flight.is_none() {
                    self.finish(ctx);
                } else {
                    ctx.run_later(CALL_OFF_GRACE, |act, ctx| act.finish(ctx));
                }
            }
            ToAgent::Assign(a) => {
                warn!(task = %a.task.task, "an assignment reached a running worker; the pool routes those");
            }
            ToAgent::SubtaskEnded(_) | ToAgent::Resume(_) | ToAgent::DecompositionClosed { .. } => {
                warn!(task = %self.task, "a Subplanner message reached a worker");
            }
        }
    }
}

impl Handler<StopMember> for Worker {
    type Result = ();

    fn handle(&mut self, _: StopMember, ctx: &mut Context<Self>) {
        self.cancel.cancel();
        self.finish(ctx);
    }
}
