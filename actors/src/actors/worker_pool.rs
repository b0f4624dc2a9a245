//! The WorkerPool actor: one per run. It receives what Dispatch and the TaskGraph say to
//! agents (`ToAgent`) and gives every attempt its own [`Worker`] actor, so that a panic or a
//! hang in one agent call touches no other task.
//!
//! It owns no slots: Dispatch decides how many attempts run at once. It keeps one entry per
//! task with a live Worker, routes follow-ups (a subplan decision, a cancel) to it, starts a
//! new Worker for each synthesis, and watches every Worker through a [`Lifeline`]: a Worker
//! that ends without having finished its attempt (a panic) becomes a failed attempt
//! (`AttemptFailure::RunnerDied`) that the TaskGraph retries or fails like any other.
//!
//! Before its first attempt it sweeps what interrupted attempts left (keeping parents that
//! wait to synthesize); a synthesis runs on the parent's branch.

use std::collections::HashMap;
use std::time::Duration;

use actix::prelude::*;
use tracing::{debug, info, warn};

use super::worker::{Job, Worker, WorkerKit};
use crate::ports::SweepKeep;
use crate::protocol::{AttemptFailure, RunId, TaskId, ToAgent, ToTaskGraph, branch_name};
use crate::supervision::{Lifeline, StopCause, StopMember};

/// A Worker of this pool ended (from its lifeline).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct WorkerEnded {
    task: TaskId,
    attempt: u32,
    /// Tells this Worker from a later one of the same task.
    serial: u64,
    cause: StopCause,
}

struct Running {
    serial: u64,
    addr: Addr<Worker>,
}

pub struct WorkerPool {
    run: RunId,
    kit: WorkerKit,
    graph: Recipient<ToTaskGraph>,
    /// The longest a synthesis may take, whatever its parent has left.
    synthesis_limit: Duration,
    running: HashMap<TaskId, Running>,
    next_serial: u64,
    /// What the sweep at start keeps: parents waiting to synthesize, delivered branches.
    keep: SweepKeep,
    lifeline: Option<Lifeline>,
}

impl WorkerPool {
    pub fn new(
        run: RunId,
        kit: WorkerKit,
        graph: Recipient<ToTaskGraph>,
        synthesis_limit: Duration,
    ) -> Self {
        WorkerPool {
            run,
            kit,
            graph,
            synthesis_limit,
            running: HashMap::new(),
            next_serial: 0,
            keep: SweepKeep::default(),
            lifeline: None,
        }
    }

    /// Reports to the run's supervisor when the pool ends.
    pub fn watched(mut self, lifeline: Lifeline) -> Self {
        self.lifeline = Some(lifeline);
        self
    }

    /// After a restart: what survives the sweep the pool makes before its first attempt
    /// (the worktrees of parents waiting to synthesize, the branches the journal says were
    /// delivered); every other worktree and branch of the run belonged to an interrupted
    /// attempt and goes.
    pub fn keeping(mut self, keep: SweepKeep) -> Self {
        self.keep = keep;
        self
    }

    /// Attempts with a live Worker: for tests and status.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    fn start_worker(&mut self, job: Job, limit: Duration, ctx: &mut Context<Self>) {
        let (task, attempt) = match &job {
            Job::Run(a) => (a.task.task.clone(), a.task.attempt),
            Job::Synthesize { done, .. } => (done.parent.clone(), done.attempt),
        };
        // A Worker still holding the task belongs to an older attempt: call it off.
        if let Some(old) = self.running.remove(&task) {
            old.addr.do_send(StopMember);
        }
        self.next_serial += 1;
        let serial = self.next_serial;
        let pool = ctx.address().recipient::<WorkerEnded>();
        let (t, a) = (task.clone(), attempt);
        let lifeline = Lifeline::new(move |cause| {
            pool.do_send(WorkerEnded {
                task: t,
                attempt: a,
                serial,
                cause,
            })
        });
        let addr = Worker::new(self.kit.clone(), self.graph.clone(), job, limit)
            .watched(lifeline)
            .start();
        self.running.insert(task, Running { serial, addr });
    }

    fn forward(&self, task: &TaskId, message: ToAgent) {
        match self.running.get(task) {
            Some(worker) => worker.addr.do_send(message),
            None => debug!(run = %self.run, %task, "no worker holds the task; message dropped"),
        }
    }
}

impl Actor for WorkerPool {
    type Context = Context<Self>;

    /// Sweeps what an earlier life of the run left (worktrees of interrupted attempts)
    /// before any attempt starts: assignments wait in the mailbox meanwhile.
    fn started(&mut self, ctx: &mut Context<Self>) {
        let sweep = self.kit.worktrees.sweep(std::mem::take(&mut self.keep));
        let run = self.run;
        ctx.wait(sweep.into_actor(self).map(move |result, _, _| match result {
            Ok(swept) if !swept.worktrees.is_empty() || !swept.branches.is_empty() => {
                info!(%run, worktrees = swept.worktrees.len(), branches = swept.branches.len(), "removed what interrupted attempts left");
            }
            Ok(_) => {}
            Err(e) => warn!(%run, error = %e, "cannot sweep the run's worktrees"),
        }));
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        for (_, worker) in self.running.drain() {
            worker.addr.do_send(StopMember);
        }
    }
}

impl Handler<ToAgent> for WorkerPool {
    type Result = ();

    fn handle(&mut self, msg: ToAgent, ctx: &mut Context<Self>) {
        match msg {
            ToAgent::Assign(a) => {
                let limit = Duration::from_millis(a.task.budget.wall_time_ms.max(1));
                self.start_worker(Job::Run(a), limit, ctx);
            }
            ToAgent::SubtasksCompleted(done) => {
                // What the parent has left, and never more than the pool's cap.
                let left = Duration::from_millis(done.budget.wall_time_ms.max(1));
                let limit = left.min(self.synthesis_limit);
                // On the parent's own branch, in the worktree its attempt left.
                let branch = branch_name(self.run, &done.parent, done.attempt);
                let run = self.run;
                self.start_worker(Job::Synthesize { run, done, branch }, limit, ctx);
            }
            ToAgent::DecompositionAccepted(accepted) => {
                let task = accepted.parent.clone();
                self.forward(&task, ToAgent::DecompositionAccepted(accepted));
            }
            ToAgent::DecompositionRejected(rejected) => {
                let task = rejected.parent.clone();
                self.forward(&task, ToAgent::DecompositionRejected(rejected));
            }
            // The Subplanner's: a worker's decomposition is not replanned per subtask.
            ToAgent::SubtaskEnded(_) | ToAgent::Resume(_) | ToAgent::DecompositionClosed { .. } => {
                debug!(run = %self.run, "a Subplanner message reached the worker pool; dropped");
            }
            ToAgent::Cancel { task, reason } => {
                if let Some(worker) = self.running.remove(&task) {
                    worker.addr.do_send(ToAgent::Cancel { task, reason });
                }
            }
        }
    }
}

impl Handler<WorkerEnded> for WorkerPool {
    type Result = ();

    fn handle(&mut self, ended: WorkerEnded, _: &mut Context<Self>) {
        let current = self
            .running
            .get(&ended.task)
            .is_some_and(|w| w.serial == ended.serial);
        if current {
            self.running.remove(&ended.task);
        }
        if ended.cause != StopCause::Finished {
            warn!(run = %self.run, task = %ended.task, attempt = ended.attempt, cause = %ended.cause, "a worker died");
            // The TaskGraph ignores this if the attempt already ended (stale attempt).
            self.graph.do_send(ToTaskGraph::TaskFailed {
                task: ended.task,
                attempt: ended.attempt,
                failure: AttemptFailure::RunnerDied {
                    detail: format!("the attempt's worker {}", ended.cause),
                },
            });
        }
    }
}

impl Handler<StopMember> for WorkerPool {
    type Result = ();

    fn handle(&mut self, _: StopMember, ctx: &mut Context<Self>) {
        if let Some(lifeline) = &mut self.lifeline {
            lifeline.set_cause(StopCause::Finished);
        }
        ctx.stop();
    }
}
