//! The message-sequence harness: probe actors stand in for an actor's collaborators; a test
//! sends messages and expects what arrives at each probe, in order, with timeouts.
//!
//! Tests run on `#[actix::test]` with tokio's clock paused (`start_paused`-style via
//! [`virtual_time`]), so timers (decomposition deadlines) are driven with
//! `tokio::time::advance` and waiting for "nothing" costs no real time.
//!
//! `Inbox` (`expect`, `expect_none`, `fish_for`); `GraphHarness` (a TaskGraph with probes);
//! `PipelineHarness` (TaskGraph + Dispatch with probe agents).

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use flotilla_actors::actors::{Dispatch, TaskGraph, WorkerProfile};
use flotilla_actors::config::Limits;
use flotilla_actors::graph::RunGraph;
use flotilla_actors::ports::{Clock, MemoryJournal, SystemClock};
use flotilla_actors::protocol::*;
use tokio::sync::mpsc;

/// How long `expect` waits (virtual time: instant when nothing else can happen).
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Pauses tokio's clock for the current test: timers fire only when the test advances time
/// or when every task is idle.
pub fn virtual_time() {
    thread_local!(static PAUSED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    // Each test runs its own runtime on its own thread; pause once per test.
    if !PAUSED.with(|p| p.replace(true)) {
        tokio::time::pause();
    }
}

/// An actor that forwards every message it receives to its [`Inbox`].
pub struct Probe<M: Message<Result = ()> + Send + 'static>(mpsc::UnboundedSender<M>);

impl<M: Message<Result = ()> + Send + 'static> Actor for Probe<M> {
    type Context = Context<Self>;
}

impl<M: Message<Result = ()> + Send + 'static> Handler<M> for Probe<M> {
    type Result = ();
    fn handle(&mut self, msg: M, _: &mut Context<Self>) {
        let _ = self.0.send(msg);
    }
}

/// What a probe received, for the test to examine in order.
pub struct Inbox<M> {
    name: &'static str,
    rx: mpsc::UnboundedReceiver<M>,
}

/// Starts a probe standing in for the actor called `name`.
pub fn probe<M: Message<Result = ()> + Send + 'static>(
    name: &'static str,
) -> (Recipient<M>, Inbox<M>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Probe(tx).start().recipient(), Inbox { name, rx })
}

impl<M: Debug> Inbox<M> {
    /// The next message; fails the test if none arrives within [`TIMEOUT`].
    pub async fn expect(&mut self) -> M {
        match tokio::time::timeout(TIMEOUT, self.rx.recv()).await {
            Ok(Some(m)) => m,
            Ok(None) => panic!("{}: the probe stopped before a message arrived", self.name),
            Err(_) => panic!(
                "{}: expected a message within {TIMEOUT:?}, none arrived",
                self.name
            ),
        }
    }

    /// Fails the test if any message arrives before the system goes quiet.
    pub async fn expect_none(&mut self) {
        if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(200), self.rx.recv()).await
        {
            panic!("{}: expected no message, got {m:?}", self.name);
        }
    }

    /// Skips messages until `pick` accepts one; fails with everything skipped if none does.
    pub async fn fish_for<T>(&mut self, what: &str, mut pick: impl FnMut(&M) -> Option<T>) -> T {
        let mut skipped = Vec::new();
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(m)) => match pick(&m) {
                    Some(t) => return t,
                    None => skipped.push(format!("{m:?}")),
                },
                _ => {
                    panic!(
                        "{}: fished for {what} and never caught it; skipped:\n  {}",
                        self.name,
                        skipped.join("\n  ")
                    )
                }
            }
        }
    }

    /// Everything received so far, without waiting.
    pub fn drain(&mut self) -> Vec<M> {
        let mut all = Vec::new();
        while let Ok(m) = self.rx.try_recv() {
            all.push(m);
        }
        all
    }
}

impl Inbox<Published> {
    /// Fishes for the next event of kind `name` (see `EventKind::name`).
    pub async fn expect_kind(&mut self, name: &str) -> EventKind {
        self.fish_for(name, |Published(e)| {
            (e.kind.name() == name).then(|| e.kind.clone())
        })
        .await
    }

    /// The kinds of the next `n` events, in order.
    pub async fn next_kinds(&mut self, n: usize) -> Vec<&'static str> {
        let mut kinds = Vec::new();
        for _ in 0..n {
            kinds.push(self.expect().await.0.kind.name());
        }
        kinds
    }
}

pub fn task(s: &str) -> TaskId {
    s.parse().unwrap()
}

pub fn spec(description: &str, scope: &[&str]) -> TaskSpec {
    TaskSpec::new(description, scope)
}

pub fn ready(id: &str, spec: TaskSpec, critical_path: u32, created: u64) -> ReadyTask {
    ReadyTask {
        task: task(id),
        attempt: 1,
        spec: Arc::new(spec),
        critical_path,
        created,
        budget: Budget::default(),
        atomic: false,
        fix: None,
        previous: None,
    }
}

/// A TaskGraph actor under test, with probes for Dispatch, the agent and the event stream.
pub struct GraphHarness {
    pub graph: Addr<TaskGraph>,
    pub journal: Arc<MemoryJournal>,
    pub dispatch: Inbox<ToDispatch>,
    pub events: Inbox<Published>,
    pub agent: Recipient<ToAgent>,
    pub agent_inbox: Inbox<ToAgent>,
}

impl GraphHarness {
    pub fn start(limits: Limits) -> Self {
        let run = RunId::generate();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let journal = Arc::new(MemoryJournal::new(clock));
        let (dispatch_addr, dispatch) = probe::<ToDispatch>("dispatch");
        let (events_addr, events) = probe::<Published>("events");
        let (agent, agent_inbox) = probe::<ToAgent>("agent");
        let graph = TaskGraph::new(
            run,
            RunGraph::new(limits),
            journal.clone(),
            dispatch_addr,
            Some(events_addr),
        )
        .start();
        GraphHarness {
            graph,
            journal,
            dispatch,
            events,
            agent,
            agent_inbox,
        }
    }

    pub fn send(&self, msg: ToTaskGraph) {
        self.graph.do_send(msg);
    }

    pub async fn snapshot(&self) -> GraphSnapshot {
        self.graph
            .send(GetSnapshot)
            .await
            .expect("task graph stopped")
    }

    /// Submits root tasks and returns the ids Dispatch was told are ready.
    pub async fn submit(&mut self, specs: Vec<TaskSpec>) -> Vec<TaskId> {
        self.send(ToTaskGraph::SubmitTasks { tasks: specs });
        self.expect_ready().await
    }

    pub async fn expect_ready(&mut self) -> Vec<TaskId> {
        self.dispatch
            .fish_for("Ready", |m| match m {
                ToDispatch::Ready(tasks) => Some(tasks.iter().map(|t| t.task.clone()).collect()),
                _ => None,
            })
            .await
    }

    /// Plays Dispatch and the agent: the task is dispatched to the probe agent and started.
    pub fn start_task(&self, id: &str, attempt: u32) {
        self.send(ToTaskGraph::TaskDispatched {
            task: task(id),
            attempt,
            profile: "default".into(),
            route: Route::Worker,
            agent: self.agent.clone(),
        });
        self.send(ToTaskGraph::TaskStarted {
            task: task(id),
            attempt,
        });
    }

    pub fn report(
        &self,
        id: &str,
        attempt: u32,
        handoff: Option<Handoff>,
        subplan: Option<ProposedSubplan>,
    ) {
        self.send(ToTaskGraph::TaskCompleted(Box::new(TaskCompleted {
            task: task(id),
            attempt,
            handoff,
            artifacts: Vec::new(),
            subplan,
        })));
    }

    pub fn complete(&self, id: &str, attempt: u32) {
        self.report(
            id,
            attempt,
            Some(Handoff::complete(format!("{id} done"))),
            None,
        );
    }

    pub fn propose(
        &self,
        id: &str,
        attempt: u32,
        subtasks: Vec<SubtaskProposal>,
        stop_when: StopCondition,
    ) {
        let plan = ProposedSubplan {
            parent: task(id),
            reason: DecompositionReason::TooLarge,
            subtasks,
            stop_when,
        };
        self.report(id, attempt, None, Some(plan));
    }

    /// The next decision the agent received about a proposal.
    pub async fn expect_decision(
        &mut self,
    ) -> Result<TaskDecompositionAccepted, TaskDecompositionRejected> {
        self.agent_inbox
            .fish_for("a decomposition decision", |m| match m {
                ToAgent::DecompositionAccepted(a) => Some(Ok(a.clone())),
                ToAgent::DecompositionRejected(r) => Some(Err(r.clone())),
                _ => None,
            })
            .await
    }

    pub async fn state_of(&self, id: &str) -> TaskState {
        let snap = self.snapshot().await;
        snap.tasks
            .iter()
            .find(|t| t.id == task(id))
            .map(|t| t.state)
            .expect("no such task")
    }
}

/// TaskGraph and Dispatch wired together for real; probes play the worker and subplanner.
pub struct PipelineHarness {
    pub graph: Addr<TaskGraph>,
    pub journal: Arc<MemoryJournal>,
    pub events: Inbox<Published>,
    pub worker: Inbox<ToAgent>,
    /// Stands in for the subplanner; flows that route there fish on it.
    pub subplanner: Inbox<ToAgent>,
}

impl PipelineHarness {
    pub fn start(limits: Limits) -> Self {
        let run = RunId::generate();
        let journal = Arc::new(MemoryJournal::new(Arc::new(SystemClock)));
        let (events_addr, events) = probe::<Published>("events");
        let (worker_addr, worker) = probe::<ToAgent>("worker");
        let (subplanner_addr, subplanner) = probe::<ToAgent>("subplanner");
        let journal2 = journal.clone();
        let limits2 = limits.clone();
        // The two actors address each other: create both contexts first.
        let graph_ctx = Context::<TaskGraph>::new();
        let graph_addr = graph_ctx.address();
        let dispatch = Dispatch::new(
            run,
            limits,
            vec![WorkerProfile::new("default", &[], 1)],
            graph_addr.clone().recipient(),
            worker_addr,
            subplanner_addr,
        )
        .start();
        let graph = graph_ctx.run(TaskGraph::new(
            run,
            RunGraph::new(limits2),
            journal2,
            dispatch.recipient(),
            Some(events_addr),
        ));
        PipelineHarness {
            graph,
            journal,
            events,
            worker,
            subplanner,
        }
    }

    /// The next assignment the worker probe received.
    pub async fn expect_assign(&mut self) -> Assignment {
        self.worker
            .fish_for("Assign", |m| match m {
                ToAgent::Assign(a) => Some(a.clone()),
                _ => None,
            })
            .await
    }

    /// Plays the worker: starts the assignment and completes it with a handoff.
    pub fn finish(&self, a: &Assignment) {
        self.graph.do_send(ToTaskGraph::TaskStarted {
            task: a.task.task.clone(),
            attempt: a.task.attempt,
        });
        self.graph
            .do_send(ToTaskGraph::TaskCompleted(Box::new(TaskCompleted {
                task: a.task.task.clone(),
                attempt: a.task.attempt,
                handoff: Some(Handoff::complete(format!("{} done", a.task.task))),
                artifacts: Vec::new(),
                subplan: None,
            })));
    }
}
