//! The TaskGraph actor: owns one run's [`RunGraph`], journals every change before acting on
//! it, and tells Dispatch and the agents what changed.
//!
//! Each message is handled in three steps: the graph command validates and emits events
//! (applied in memory), the journal appends them, and only then are the effects sent: ready
//! tasks to Dispatch, decisions to the proposing agent, cancellations to agents, and every
//! event to the live stream.
//!
//! One append is in flight at a time (ADR-012). Messages that arrive meanwhile are handled
//! at once, against the graph in memory, and their events wait in `pending`; when the
//! append in flight has committed and its effects are sent, everything pending goes in the
//! next append, as one transaction. So a busy run commits once per batch instead of once
//! per message, and journal order, effect order and handling order stay one order. Nothing
//! leaves the actor before its events are committed, and a decision that looks at the graph
//! as a whole (is the run quiescent?) waits until nothing is pending.
//!
//! When an append fails, the actor stops (its memory would be ahead of the journal) and its
//! [`Lifeline`] tells the run's supervisor why; what was pending is never appended; the
//! supervisor restarts the run from the journal. [`CancelRun`] answers only once the
//! cancellation is journaled, so an acknowledged cancel survives a crash.
//!
//! It also remembers which agent runs which task (to route decisions to the proposer), tells
//! the planner of root handoffs, refused and accepted batches, quiescence and Dispatch's free
//! worker slots (`WorkerCapacity`, forwarded, not journaled), and `resuming(Recovery)`
//! re-queues interrupted work after a restart (ADR-004). The effects of committed events are
//! `effects.rs`.

mod effects;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tracing::{error, warn};

use crate::graph::{GraphError, RunGraph};
use crate::ports::{Journal, JournalError};
use crate::protocol::{
    Event, EventKind, FailureReason, FromMerging, GetSnapshot, IntendLanding, IntentNotJournaled,
    Published, RootHandoff, RunId, SubtaskEnded, SubtasksCompleted, TaskDecompositionAccepted,
    TaskDecompositionRejected, TaskId, TaskState, ToAgent, ToDispatch, ToMergeQueue, ToPlanner,
    ToReconciler, ToTaskGraph,
};
use crate::supervision::{Lifeline, StopCause, StopMember};

/// Cancel the whole run; answered once `RunCancelRequested` (and what follows from it) is in
/// the journal, or with the reason it could not be journaled.
#[derive(Debug, Message)]
#[rtype(result = "Result<(), JournalError>")]
pub struct CancelRun {
    pub reason: String,
}

pub struct TaskGraph {
    run: RunId,
    graph: RunGraph,
    journal: Arc<dyn Journal>,
    dispatch: Recipient<ToDispatch>,
    /// Where journaled events go next (the daemon's stream hub; a probe in tests).
    observer: Option<Recipient<Published>>,
    /// The agent currently responsible for each dispatched task. Addresses are not state:
    /// after a restart, tasks are dispatched again and re-register.
    agents: HashMap<TaskId, Recipient<ToAgent>>,
    /// Who synthesizes for a parent whose agent is unknown (after a restart).
    default_agent: Option<Recipient<ToAgent>>,
    /// The run's Subplanner: it owns the decompositions it made, also after a restart.
    subplanner: Option<Recipient<ToAgent>>,
    planner: Option<Recipient<ToPlanner>>,
    /// Where branches of `Landing` tasks go (M6).
    merge_queue: Option<Recipient<ToMergeQueue>>,
    /// Who sweeps main for a finalization round (M6).
    reconciler: Option<Recipient<ToReconciler>>,
    /// Set when the graph was rebuilt from the journal: `started` resumes the run.
    recovery: Option<Recovery>,
    lifeline: Option<Lifeline>,
    /// Events handled (applied in memory) and not yet handed to the journal: the next
    /// append, once the one in flight has committed.
    pending: Vec<EventKind>,
    /// Who waits for the pending events to be committed (an acknowledged cancel).
    pending_waiters: Vec<tokio::sync::oneshot::Sender<Result<(), JournalError>>>,
    /// An append is in flight.
    appending: bool,
    /// Something ended in a performed batch: once nothing is pending, see whether the run
    /// is quiescent (the planner's cue).
    quiescence_due: bool,
}

/// What resuming a replayed run needs beyond the graph.
#[derive(Debug, Default)]
pub struct Recovery {
    /// Root handoffs the planner had not yet read when the daemon stopped.
    pub unread_handoffs: Vec<RootHandoff>,
    /// Decomposition deadlines still pending, as milliseconds from now (0 = already due).
    pub deadlines_in_ms: Vec<(TaskId, u64)>,
}

impl TaskGraph {
    pub fn new(
        run: RunId,
        graph: RunGraph,
        journal: Arc<dyn Journal>,
        dispatch: Recipient<ToDispatch>,
        observer: Option<Recipient<Published>>,
    ) -> Self {
        TaskGraph {
            run,
            graph,
            journal,
            dispatch,
            observer,
            agents: HashMap::new(),
            default_agent: None,
            subplanner: None,
            planner: None,
            merge_queue: None,
            reconciler: None,
            recovery: None,
            lifeline: None,
            pending: Vec::new(),
            pending_waiters: Vec::new(),
            appending: false,
            quiescence_due: false,
        }
    }

    /// Reports to the run's supervisor when the actor ends, however it ends.
    pub fn watched(mut self, lifeline: Lifeline) -> Self {
        self.lifeline = Some(lifeline);
        self
    }

    /// Stops the actor, telling the supervisor why.
    fn stop_because(&mut self, cause: StopCause, ctx: &mut Context<Self>) {
        error!(run = %self.run, %cause, "the run's task graph stops");
        if let Some(lifeline) = &mut self.lifeline {
            lifeline.set_cause(cause);
        }
        ctx.stop();
    }

    /// The root planner, told of root handoffs and of quiescence.
    pub fn with_planner(mut self, planner: Recipient<ToPlanner>) -> Self {
        self.planner = Some(planner);
        self
    }

    /// The agent that synthesizes for parents whose own agent is gone.
    pub fn with_default_agent(mut self, agent: Recipient<ToAgent>) -> Self {
        self.default_agent = Some(agent);
        self
    }

    /// The run's Subplanner, which hears about the subtasks of its decompositions.
    pub fn with_subplanner(mut self, subplanner: Recipient<ToAgent>) -> Self {
        self.subplanner = Some(subplanner);
        self
    }

    /// The run's MergeQueue and Reconciler (a merging graph needs both: ADR-011).
    pub fn with_merging(
        mut self,
        merge_queue: Recipient<ToMergeQueue>,
        reconciler: Recipient<ToReconciler>,
    ) -> Self {
        self.merge_queue = Some(merge_queue);
        self.reconciler = Some(reconciler);
        self
    }

    fn enqueue_landing(&self, task: &TaskId, recovered: bool) {
        if let (Some(queue), Some(request)) =
            (&self.merge_queue, self.graph.land_request(task, recovered))
        {
            queue.do_send(ToMergeQueue::Enqueue(Box::new(request)));
        }
    }

    /// Resume a graph replayed from the journal when the actor starts.
    pub fn resuming(mut self, recovery: Recovery) -> Self {
        self.recovery = Some(recovery);
        self
    }

    /// Journals the interruption of in-flight attempts, then puts every runnable task back
    /// in Dispatch, re-sends pending syntheses, re-arms deadlines and wakes the planner.
    fn resume(&mut self, recovery: Recovery, ctx: &mut Context<Self>) {
        // A cancel the daemon journaled while the run had no actors is carried out now.
        let events = match self.graph.interrupt_in_flight().and_then(|mut events| {
            events.extend(self.graph.carry_out_journaled_cancel()?);
            Ok(events)
        }) {
            Ok(events) => events,
            Err(e) => {
                self.stop_because(StopCause::InvariantBroken(e.to_string()), ctx);
                return;
            }
        };
        let append = self.journal.append(self.run, events);
        ctx.wait(append.into_actor(self).map(move |result, act, ctx| {
            let journaled = match result {
                Ok(journaled) => journaled,
                Err(e) => {
                    act.stop_because(StopCause::JournalUnwritable(e.to_string()), ctx);
                    return;
                }
            };
            if let Some(observer) = &act.observer {
                for event in journaled {
                    observer.do_send(Published(event));
                }
            }
            let ready: Vec<_> = act
                .graph
                .tasks_in(TaskState::Ready)
                .iter()
                .filter_map(|t| act.graph.ready_task(t))
                .collect();
            if !ready.is_empty() {
                act.dispatch.do_send(ToDispatch::Ready(ready));
            }
            for parent in act.graph.tasks_in(TaskState::Synthesizing) {
                act.send_subtasks_completed(&parent);
            }
            // Branches waiting to land go back in the queue, which first looks whether
            // main already holds them (a crash after the ref moved, before `TaskLanded`).
            for task in act.graph.landing_tasks() {
                act.enqueue_landing(&task, true);
            }
            if let (Some(attempt), Some(reconciler)) =
                (act.graph.awaiting_final_sweep(), &act.reconciler)
            {
                reconciler.do_send(ToReconciler::Finalize {
                    attempt,
                    commit: act.graph.main_tip(),
                });
            }
            // The Subplanner's open decompositions continue where its journaled
            // conversation left off.
            if let Some(subplanner) = &act.subplanner {
                for open in act.graph.open_decompositions() {
                    subplanner.do_send(ToAgent::Resume(open));
                }
            }
            for (task, ms) in recovery.deadlines_in_ms {
                act.arm_deadline_in(&task, ms, ctx);
            }
            if let Some(planner) = &act.planner {
                for handoff in recovery.unread_handoffs {
                    planner.do_send(ToPlanner::Handoff(Box::new(handoff)));
                }
                if act.graph.is_quiescent() {
                    planner.do_send(ToPlanner::Quiescent);
                }
            }
        }));
    }

    fn send_subtasks_completed(&self, parent: &TaskId) {
        let results = self.graph.subtask_results(parent);
        let attempt = self.graph.task(parent).map_or(1, |n| n.attempt);
        // What the parent has left after its own attempts: the synthesis is bounded by it.
        let budget = self
            .graph
            .ready_task(parent)
            .map(|t| t.budget)
            .unwrap_or_default();
        let (scope, profile) = self
            .graph
            .task(parent)
            .map(|n| (n.spec.scope.clone(), n.profile.clone().unwrap_or_default()))
            .unwrap_or_default();
        self.tell_agent(
            parent,
            ToAgent::SubtasksCompleted(SubtasksCompleted {
                parent: parent.clone(),
                attempt,
                results,
                budget,
                scope,
                profile,
            }),
        );
    }

    fn tell_planner_root_ended(&self, task: &TaskId) {
        let (Some(planner), Some(node)) = (&self.planner, self.graph.task(task)) else {
            return;
        };
        if node.parent.is_none() {
            planner.do_send(ToPlanner::Handoff(Box::new(RootHandoff {
                task: task.clone(),
                state: node.state,
                description: node.spec.description.clone(),
                handoff: node.handoff.as_deref().cloned(),
                failure: node.failure.as_deref().cloned(),
            })));
        }
    }

    /// Journals `events`, then performs their effects: in the next append, after the one in
    /// flight (if any) has committed and its effects were sent.
    fn commit(&mut self, events: Vec<EventKind>, ctx: &mut Context<Self>) {
        if events.is_empty() {
            return;
        }
        self.pending.extend(events);
        if !self.appending {
            self.flush(ctx);
        }
    }

    /// Appends everything pending as one batch. When it has committed: its effects, its
    /// waiters answered, and the next batch. When it failed: the actor stops, and what is
    /// pending is never appended (the journal would have a hole where this batch was).
    fn flush(&mut self, ctx: &mut Context<Self>) {
        if self.pending.is_empty() {
            return;
        }
        self.appending = true;
        let events = std::mem::take(&mut self.pending);
        let waiters = std::mem::take(&mut self.pending_waiters);
        let append = self.journal.append(self.run, events);
        ctx.spawn(append.into_actor(self).map(move |result, act, ctx| {
            act.appending = false;
            match result {
                Ok(journaled) => {
                    act.perform(journaled, ctx);
                    for waiter in waiters {
                        let _ = waiter.send(Ok(()));
                    }
                    act.flush(ctx);
                    act.check_quiescence();
                }
                Err(e) => {
                    for waiter in waiters {
                        let _ = waiter.send(Err(e.clone()));
                    }
                    for waiter in act.pending_waiters.drain(..) {
                        let _ = waiter.send(Err(e.clone()));
                    }
                    act.pending.clear();
                    // The in-memory graph is now ahead of the journal; continuing
                    // would act on state that a restart would not see. Stop; the
                    // supervisor restarts the run from the journal.
                    act.stop_because(StopCause::JournalUnwritable(e.to_string()), ctx);
                }
            }
        }));
    }

    /// Tells the planner the run is quiescent, if something ended and the graph (with
    /// nothing pending, so as committed) has nothing running or waiting.
    fn check_quiescence(&mut self) {
        if !self.quiescence_due || !self.pending.is_empty() || self.appending {
            return;
        }
        self.quiescence_due = false;
        if let (true, Some(planner)) = (self.graph.is_quiescent(), &self.planner) {
            planner.do_send(ToPlanner::Quiescent);
        }
    }
}

impl Actor for TaskGraph {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if let Some(recovery) = self.recovery.take() {
            self.resume(recovery, ctx);
        }
    }
}

impl Handler<ToTaskGraph> for TaskGraph {
    type Result = ();

    fn handle(&mut self, msg: ToTaskGraph, ctx: &mut Context<Self>) {
        let result: Result<Vec<EventKind>, GraphError> = match msg {
            ToTaskGraph::SubmitTasks { tasks } => self.graph.submit(tasks),
            ToTaskGraph::PlanningFinished => self.graph.planning_finished(),
            ToTaskGraph::PlannerAnswered(answer) => self.graph.planner_answered(*answer),
            ToTaskGraph::ToolsRan(round) => self.graph.tools_ran(*round),
            ToTaskGraph::PlannerGaveUp { error } => self.graph.planner_gave_up(&error),
            ToTaskGraph::TaskDispatched {
                task,
                attempt,
                profile,
                route,
                agent,
            } => {
                let result = self.graph.dispatched(&task, attempt, &profile, route);
                let accepted = matches!(&result, Ok(ev) if ev.iter().any(|e| matches!(e, EventKind::TaskDispatched { .. })));
                if accepted {
                    self.agents.insert(task, agent);
                } else {
                    // Cancelled while it sat in Dispatch's queue: call the agent off and give
                    // the slot back.
                    agent.do_send(ToAgent::Cancel {
                        task: task.clone(),
                        reason: "the task is no longer runnable".into(),
                    });
                    self.dispatch.do_send(ToDispatch::Release { task });
                }
                result
            }
            ToTaskGraph::Undispatchable {
                task,
                attempt,
                reason,
            } => self.graph.undispatchable(&task, attempt, &reason),
            ToTaskGraph::TaskStarted { task, attempt } => self.graph.started(&task, attempt),
            ToTaskGraph::Reviewed {
                task,
                attempt,
                review,
                calls,
                usage,
            } => self.graph.reviewed(&task, attempt, review, calls, usage),
            ToTaskGraph::TaskCompleted(report) => self.graph.complete(*report),
            ToTaskGraph::TaskFailed {
                task,
                attempt,
                failure,
            } => self.graph.failed(&task, attempt, failure),
            ToTaskGraph::SpendReported {
                task,
                attempt,
                spent,
            } => self.graph.spend_reported(&task, attempt, spent),
            ToTaskGraph::Cancel { task, reason } => self.graph.cancel(task.as_ref(), &reason),
            ToTaskGraph::UserDecision { task, decision } => {
                self.graph.user_decision(&task, &decision)
            }
            ToTaskGraph::WorkerCapacity { free } => {
                if let Some(planner) = &self.planner {
                    planner.do_send(ToPlanner::Capacity { free_workers: free });
                }
                Ok(Vec::new())
            }
            ToTaskGraph::DecompositionDeadline {
                task,
                decomposition,
            } => self.graph.deadline_passed(&task, decomposition),
            ToTaskGraph::SubplannerAnswered(answer) => self.graph.subplanner_answered(*answer),
            ToTaskGraph::SubplannerStopped {
                task,
                attempt,
                reason,
            } => self.graph.subplanner_stopped(&task, attempt, &reason),
            // The queue checks main and answers `FromMerging::MainAdopted`, which is
            // journaled before landing resumes (ADR-024).
            ToTaskGraph::AdoptMain => match (self.graph.adopt_main_asked(), &self.merge_queue) {
                (Ok((expected, landed)), Some(queue)) => {
                    queue.do_send(ToMergeQueue::AdoptMain { expected, landed });
                    Ok(Vec::new())
                }
                (Ok(_), None) => Ok(Vec::new()),
                (Err(ignored), _) => Ok(ignored),
            },
        };
        match result {
            Ok(events) => self.commit(events, ctx),
            Err(e) => {
                // Commands only emit events that apply; this is a bug, not bad input.
                self.stop_because(StopCause::InvariantBroken(e.to_string()), ctx);
            }
        }
    }
}

impl Handler<FromMerging> for TaskGraph {
    type Result = ();

    fn handle(&mut self, msg: FromMerging, ctx: &mut Context<Self>) {
        let result = match msg {
            FromMerging::MainMoved {
                from,
                to,
                landed,
                checkout,
            } => {
                let tasks = landed.iter().map(|(t, _, _)| t.clone()).collect();
                let note = EventKind::MainMoved {
                    from,
                    to,
                    tasks,
                    checkout,
                };
                let mut events = Vec::new();
                let mut result = self.graph.merge_noted(note).map(|e| events.extend(e));
                for (task, attempt, commit) in landed {
                    if result.is_err() {
                        break;
                    }
                    result = self
                        .graph
                        .landed(&task, attempt, &commit)
                        .map(|e| events.extend(e));
                }
                result.map(|_| events)
            }
            FromMerging::Conflict {
                task,
                attempt,
                files,
                clashing,
            } => self.graph.landing_conflict(&task, attempt, files, clashing),
            FromMerging::Failed {
                task,
                attempt,
                failure,
            } => self.graph.landing_failed(&task, attempt, failure),
            FromMerging::FoundOnMain {
                task,
                attempt,
                commit,
            } => self.graph.found_on_main(&task, attempt, &commit),
            FromMerging::Note(note) => self.graph.merge_noted(*note),
            FromMerging::Swept(report) => self.graph.sweep_finished(*report),
            FromMerging::SweepStale { sweep, commit } => self.graph.sweep_stale(sweep, &commit),
            FromMerging::MainAdopted {
                expected,
                tip,
                dropped,
            } => self.graph.main_adopted(expected, tip, dropped),
        };
        match result {
            Ok(events) => self.commit(events, ctx),
            Err(e) => self.stop_because(StopCause::InvariantBroken(e.to_string()), ctx),
        }
    }
}

impl Handler<CancelRun> for TaskGraph {
    type Result = ResponseFuture<Result<(), JournalError>>;

    /// Answered once the cancellation's events are committed (and their effects sent); the
    /// actor goes on handling messages meanwhile, against the cancelled graph.
    fn handle(&mut self, msg: CancelRun, ctx: &mut Context<Self>) -> Self::Result {
        match self.graph.cancel(None, &msg.reason) {
            Ok(events) if !events.is_empty() => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                self.pending_waiters.push(tx);
                self.commit(events, ctx);
                Box::pin(async move {
                    rx.await.unwrap_or_else(|_| {
                        Err(JournalError::Storage(
                            "the run's task graph stopped before the cancellation was journaled"
                                .into(),
                        ))
                    })
                })
            }
            Ok(_) => Box::pin(async { Ok(()) }),
            Err(e) => {
                let detail = e.to_string();
                self.stop_because(StopCause::InvariantBroken(detail.clone()), ctx);
                Box::pin(async move {
                    Err(JournalError::Storage(format!(
                        "the run's task graph stopped: {detail}"
                    )))
                })
            }
        }
    }
}

impl Handler<IntendLanding> for TaskGraph {
    type Result = ResponseFuture<Result<(), IntentNotJournaled>>;

    /// Answered once `LandingIntended` is committed: the merge queue moves main only then
    /// (ADR-018, write-ahead of the compare-and-swap).
    fn handle(&mut self, msg: IntendLanding, ctx: &mut Context<Self>) -> Self::Result {
        match self.graph.landing_intended(msg.from, msg.to, msg.landed) {
            Ok(events) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                self.pending_waiters.push(tx);
                self.commit(events, ctx);
                Box::pin(async move {
                    match rx.await {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(e)) => Err(IntentNotJournaled::Refused(Box::new(e))),
                        Err(_) => Err(IntentNotJournaled::GraphStopped),
                    }
                })
            }
            Err(e) => {
                self.stop_because(StopCause::InvariantBroken(e.to_string()), ctx);
                Box::pin(async move { Err(IntentNotJournaled::Broken(Box::new(e))) })
            }
        }
    }
}

impl Handler<StopMember> for TaskGraph {
    type Result = ();

    fn handle(&mut self, _: StopMember, ctx: &mut Context<Self>) {
        if let Some(lifeline) = &mut self.lifeline {
            lifeline.set_cause(StopCause::Finished);
        }
        ctx.stop();
    }
}

impl Handler<GetSnapshot> for TaskGraph {
    type Result = MessageResult<GetSnapshot>;

    fn handle(&mut self, _: GetSnapshot, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.graph.snapshot())
    }
}
