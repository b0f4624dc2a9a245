//! The Worker actor: runs assignments through the `Agent` port and reports back.
//!
//! On `Assign` it reports `TaskStarted`, runs the agent (bounded by the task's wall-time
//! budget) and turns the agent's report into a `TaskCompleted` carrying the task id and
//! attempt *it* was assigned; the agent never names ids. A rejected subplan goes back to the
//! agent (`revise`), `SubtasksCompleted` asks it to synthesize, `Cancel` drops the work.
//!
//! Until worktrees arrive (M4) one Worker actor hosts all of a run's worker slots: Dispatch
//! bounds how many assignments run at once, and each runs as its own future on this actor.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::future::BoxFuture;
use tracing::{debug, warn};

use crate::ports::{Agent, AgentError, AgentReport};
use crate::protocol::{Assignment, AttemptFailure, TaskCompleted, TaskId, ToAgent, ToTaskGraph};

pub struct Worker {
    agent: Arc<dyn Agent>,
    graph: Recipient<ToTaskGraph>,
    workspace: PathBuf,
    /// Assignments this worker holds, for revisions and syntheses.
    assignments: HashMap<TaskId, Assignment>,
    /// The agent call in flight per task, to cancel it.
    in_flight: HashMap<TaskId, SpawnHandle>,
}

impl Worker {
    pub fn new(agent: Arc<dyn Agent>, graph: Recipient<ToTaskGraph>, workspace: PathBuf) -> Self {
        Worker {
            agent,
            graph,
            workspace,
            assignments: HashMap::new(),
            in_flight: HashMap::new(),
        }
    }

    /// Runs one agent call for `task`/`attempt` and reports its outcome.
    fn drive(
        &mut self,
        task: TaskId,
        attempt: u32,
        limit: Duration,
        call: BoxFuture<'static, Result<AgentReport, AgentError>>,
        ctx: &mut Context<Self>,
    ) {
        let bounded = async move {
            tokio::time::timeout(limit, call)
                .await
                .unwrap_or(Err(AgentError::Timeout))
        };
        let key = task.clone();
        let handle = ctx.spawn(bounded.into_actor(self).map(move |result, act, _| {
            act.in_flight.remove(&task);
            // Only a subplan keeps the assignment alive (for a revision or the synthesis).
            if !matches!(&result, Ok(report) if report.subplan.is_some()) {
                act.assignments.remove(&task);
            }
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
                    failure: match error {
                        AgentError::Crashed(detail) => AttemptFailure::Crashed { detail },
                        AgentError::Malformed(detail) => AttemptFailure::Malformed { detail },
                        AgentError::Timeout => AttemptFailure::TimedOut {
                            limit_ms: u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
                        },
                    },
                },
            };
            act.graph.do_send(message);
        }));
        if let Some(previous) = self.in_flight.insert(key, handle) {
            ctx.cancel_future(previous);
        }
    }
}

fn wall_limit(a: &Assignment) -> Duration {
    Duration::from_millis(a.task.budget.wall_time_ms.max(1))
}

impl Actor for Worker {
    type Context = Context<Self>;
}

impl Handler<ToAgent> for Worker {
    type Result = ();

    fn handle(&mut self, msg: ToAgent, ctx: &mut Context<Self>) {
        match msg {
            ToAgent::Assign(a) => {
                let (task, attempt) = (a.task.task.clone(), a.task.attempt);
                self.graph.do_send(ToTaskGraph::TaskStarted {
                    task: task.clone(),
                    attempt,
                });
                let call = self.agent.run(a.clone(), self.workspace.clone());
                let limit = wall_limit(&a);
                self.assignments.insert(task.clone(), a);
                self.drive(task, attempt, limit, call, ctx);
            }
            ToAgent::DecompositionAccepted(accepted) => {
                debug!(parent = %accepted.parent, subtasks = accepted.subtasks.len(), "subplan accepted");
            }
            ToAgent::DecompositionRejected(rejected) => {
                let Some(a) = self.assignments.get(&rejected.parent).cloned() else {
                    warn!(task = %rejected.parent, "rejection for a task this worker does not hold");
                    return;
                };
                let call = self.agent.revise(a.clone(), rejected.reason);
                self.drive(
                    a.task.task.clone(),
                    a.task.attempt,
                    wall_limit(&a),
                    call,
                    ctx,
                );
            }
            ToAgent::SubtasksCompleted(done) => {
                let limit = self
                    .assignments
                    .get(&done.parent)
                    .map_or(Duration::from_secs(30 * 60), wall_limit);
                let call = self.agent.synthesize(done.parent.clone(), done.results);
                self.drive(done.parent, done.attempt, limit, call, ctx);
            }
            ToAgent::Cancel { task, reason } => {
                debug!(%task, %reason, "cancelled");
                self.assignments.remove(&task);
                if let Some(handle) = self.in_flight.remove(&task) {
                    ctx.cancel_future(handle);
                }
            }
        }
    }
}
