//! The run supervisor: starts the actors of each run (new or recovered from the journal),
//! keeps their addresses for cancellation, and forwards every journaled event to the
//! daemon's broadcast hub for the event streams.
//!
//! It is an actor because actors can only be started from inside the actix System: HTTP
//! handlers run on tokio tasks and ask the supervisor instead.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use actix::prelude::*;
use flotilla_actors::actors::{Dispatch, Exchange, Planner, Recovery, TaskGraph, Worker};
use flotilla_actors::graph::RunGraph;
use flotilla_actors::ports::{Agent, Clock, Journal, Llm};
use flotilla_actors::protocol::{
    Event, EventKind, Published, RootHandoff, RunId, TaskState, ToPlanner, ToTaskGraph,
};
use tokio::sync::broadcast;
use tracing::{error, info};

use crate::config::RunConfig;
use crate::journal::SqliteJournal;
use crate::scripted::{ScriptedAgent, ScriptedLlm};

const ROOT_PLANNER_PROMPT: &str = include_str!("../../prompts/root-planner.md");

pub struct Supervisor {
    journal: SqliteJournal,
    clock: Arc<dyn Clock>,
    hub: broadcast::Sender<Event>,
    live: HashMap<RunId, Addr<TaskGraph>>,
}

impl Supervisor {
    pub fn new(
        journal: SqliteJournal,
        clock: Arc<dyn Clock>,
        hub: broadcast::Sender<Event>,
    ) -> Self {
        Supervisor {
            journal,
            clock,
            hub,
            live: HashMap::new(),
        }
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;
}

/// Start a run's actors. `journal` holds its events so far (at least `RunStarted`); when it
/// holds more, the run is resumed from them.
#[derive(Message)]
#[rtype(result = "Result<(), String>")]
pub struct StartRun {
    pub run: RunId,
    pub request: String,
    pub repo: PathBuf,
    pub config: RunConfig,
    pub journal: Vec<Event>,
}

/// Cancel a live run. Answers false if the run is not live in this daemon.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct CancelRun {
    pub run: RunId,
    pub reason: String,
}

impl Handler<StartRun> for Supervisor {
    type Result = Result<(), String>;

    fn handle(&mut self, msg: StartRun, ctx: &mut Context<Self>) -> Self::Result {
        let StartRun {
            run,
            request,
            repo,
            config,
            journal,
        } = msg;
        let graph_state = RunGraph::replay(config.limits.clone(), journal.iter().map(|e| &e.kind))
            .map_err(|e| format!("run {run}: the journal does not replay: {e}"))?;
        if graph_state.outcome().is_some() {
            return Ok(());
        }
        let recovering = journal.len() > 1;
        let conversation: Vec<Exchange> = journal
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::PlannerResponded {
                    prompt, content, ..
                } => Some(Exchange {
                    prompt: prompt.clone(),
                    answer: content.clone(),
                }),
                _ => None,
            })
            .collect();
        let recovery = recovering.then(|| recovery(&graph_state, &journal, self.clock.now_ms()));
        let planner_calls = graph_state.planner_calls();

        let llm: Arc<dyn Llm> = Arc::new(ScriptedLlm::new(config.scenario.clone()));
        let agent: Arc<dyn Agent> = Arc::new(ScriptedAgent::new(config.scenario.clone()));
        let journal_port: Arc<dyn Journal> = Arc::new(self.journal.clone());

        let graph_ctx = Context::<TaskGraph>::new();
        let graph_addr = graph_ctx.address();
        let worker = Worker::new(agent, graph_addr.clone().recipient(), repo).start();
        // The subplanner route is served by the worker's agent until the Subplanner actor
        // exists (M3): a scripted agent answers wide tasks with a subplan.
        let dispatch = Dispatch::new(
            run,
            config.limits.clone(),
            config.profiles(),
            graph_addr.clone().recipient(),
            worker.clone().recipient(),
            worker.clone().recipient(),
        )
        .start();
        let planner = Planner::new(
            run,
            request,
            ROOT_PLANNER_PROMPT.to_string(),
            llm,
            graph_addr.clone().recipient(),
            config.planner.clone(),
        )
        .resuming(conversation)
        .start();
        let mut task_graph = TaskGraph::new(
            run,
            graph_state,
            journal_port,
            dispatch.recipient(),
            Some(ctx.address().recipient()),
        )
        .with_planner(planner.clone().recipient())
        .with_default_agent(worker.recipient());
        if let Some(recovery) = recovery {
            task_graph = task_graph.resuming(recovery);
        }
        graph_ctx.run(task_graph);
        if planner_calls == 0 {
            planner.do_send(ToPlanner::Start);
        }
        info!(%run, recovering, "run started");
        self.live.insert(run, graph_addr);
        Ok(())
    }
}

/// What the replayed journal says the resumed actors must redo: handoffs the planner had not
/// read, and deadline timers.
fn recovery(graph: &RunGraph, journal: &[Event], now_ms: u64) -> Recovery {
    let last_plan = journal
        .iter()
        .rposition(|e| matches!(e.kind, EventKind::PlannerResponded { .. }));
    let unread_handoffs = journal[last_plan.map_or(0, |i| i + 1)..]
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TaskCompleted { task, .. }
            | EventKind::TaskFailed { task, .. }
            | EventKind::TaskCancelled { task, .. }
                if task.depth() == 1 =>
            {
                graph.task(task).map(|n| RootHandoff {
                    task: task.clone(),
                    state: n.state,
                    description: n.spec.description.clone(),
                    handoff: n.handoff.as_deref().cloned(),
                })
            }
            _ => None,
        })
        .collect();
    let deadlines_in_ms = graph
        .tasks_in(TaskState::WaitingForSubtasks)
        .into_iter()
        .filter_map(|task| {
            let accepted_at = journal.iter().rev().find_map(|e| match &e.kind {
                EventKind::DecompositionAccepted { parent, .. } if *parent == task => Some(e.at_ms),
                _ => None,
            })?;
            let due = accepted_at + graph.deadline_ms(&task)?;
            Some((task, due.saturating_sub(now_ms)))
        })
        .collect();
    Recovery {
        unread_handoffs,
        deadlines_in_ms,
    }
}

impl Handler<CancelRun> for Supervisor {
    type Result = bool;

    fn handle(&mut self, msg: CancelRun, _: &mut Context<Self>) -> bool {
        match self.live.get(&msg.run) {
            Some(graph) => {
                graph.do_send(ToTaskGraph::Cancel {
                    task: None,
                    reason: msg.reason,
                });
                true
            }
            None => false,
        }
    }
}

impl Handler<Published> for Supervisor {
    type Result = ();

    fn handle(&mut self, Published(event): Published, _: &mut Context<Self>) {
        if let EventKind::RunFinished { outcome, .. } = &event.kind {
            info!(run = %event.run, ?outcome, "run finished");
            self.live.remove(&event.run);
        }
        // No subscriber is not an error: nobody is tailing.
        let _ = self.hub.send(event);
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if !self.live.is_empty() {
            error!(
                runs = self.live.len(),
                "supervisor stopped with live runs; they resume at the next start"
            );
        }
    }
}

/// A human's decision for a task waiting on one (`flotilla decide`), forwarded to the run's
/// TaskGraph, which checks it and journals what it does. Answers false if the run is not
/// live in this daemon.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct DecideTask {
    pub run: RunId,
    pub task: flotilla_actors::protocol::TaskId,
    pub decision: flotilla_actors::protocol::UserDecision,
}

impl Handler<DecideTask> for Supervisor {
    type Result = bool;

    fn handle(&mut self, msg: DecideTask, _: &mut Context<Self>) -> bool {
        match self.live.get(&msg.run) {
            Some(graph) => {
                graph.do_send(ToTaskGraph::UserDecision {
                    task: msg.task,
                    decision: msg.decision,
                });
                true
            }
            None => false,
        }
    }
}
