//! `flotilla bench` requests: the largest request the root planner sends (ADR-030), as the
//! bytes of the request's JSON (messages, schema; what goes on the wire, give or take the
//! provider's own framing).
//!
//! - `requests/planner-run`: a scripted run of twenty sprints of fifty tasks (the 1,000-task
//!   run of the tests) through the TaskGraph, Dispatch, the workers and the Planner with
//!   the built-in root-planner prompt, the default `[planner]` budget, an in-memory
//!   journal and no repository.
//! - `requests/hostile-planner`: the Planner alone against a model whose every answer is
//!   5 MiB of junk, until it gives up after `max_consecutive_errors` (10) calls. Before
//!   bounded conversations each request carried every earlier answer whole.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use futures::future::BoxFuture;
use tokio::sync::oneshot;

use flotilla_actors::actors::{
    AgentSet, Dispatch, Planner, PlannerConfig, TaskGraph, WorkerKit, WorkerPool, WorkerProfile,
};
use flotilla_actors::config::Limits;
use flotilla_actors::graph::RunGraph;
use flotilla_actors::ports::{
    Llm, LlmCall, LlmError, LlmRequest, LlmResponse, MemoryJournal, Role, SystemClock,
};
use flotilla_actors::protocol::{
    Budget, EventKind, Published, RunId, RunOutcome, ToTaskGraph, Usd,
};

use super::throughput::{NameOnlyWorktrees, NoSubplanner};
use crate::process::TokioProcessRunner;
use crate::prompts::{self, PromptOverrides};
use crate::scripted::{Scenario, ScenarioError, ScriptedAgent, ScriptedLlm};

/// What one requests measurement saw.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestSizes {
    pub requests: usize,
    pub largest_bytes: usize,
    /// The sum of every request's bytes.
    pub total_bytes: usize,
}

/// Why a requests measurement measured nothing.
#[derive(Debug, thiserror::Error)]
pub enum RequestsError {
    #[error("the scenario: {0}")]
    Scenario(#[from] ScenarioError),
    #[error("the run ended {outcome:?}, not completed: {reason}")]
    NotCompleted { outcome: RunOutcome, reason: String },
    #[error("the run stopped before it finished")]
    Gone,
}

/// An `Llm` that measures every request before passing it on.
pub struct Metered {
    inner: Arc<dyn Llm>,
    seen: Mutex<RequestSizes>,
}

impl Metered {
    pub fn new(inner: Arc<dyn Llm>) -> Self {
        Metered {
            inner,
            seen: Mutex::new(RequestSizes::default()),
        }
    }

    pub fn sizes(&self) -> RequestSizes {
        self.seen.lock().map(|s| *s).unwrap_or_default()
    }
}

impl Llm for Metered {
    fn complete(
        &self,
        request: LlmRequest,
        call: LlmCall,
    ) -> BoxFuture<'static, Result<LlmResponse, LlmError>> {
        let bytes = serde_json::to_vec(&request).map_or(0, |b| b.len());
        if let Ok(mut seen) = self.seen.lock() {
            seen.requests += 1;
            seen.largest_bytes = seen.largest_bytes.max(bytes);
            seen.total_bytes = seen.total_bytes.saturating_add(bytes);
        }
        self.inner.complete(request, call)
    }
}

pub const SPRINTS: usize = 20;
pub const TASKS_PER_SPRINT: usize = 50;

/// Twenty sprints of fifty independent instant tasks; later calls answer an empty list.
fn thousand_tasks() -> Result<Scenario, ScenarioError> {
    let mut toml = String::from("[agent]\ndelay_ms = 0\ntokens = 1\n");
    for sprint in 0..SPRINTS {
        toml.push_str("[[planner.answers]]\ntasks = [\n");
        for i in 0..TASKS_PER_SPRINT {
            let n = sprint * TASKS_PER_SPRINT + i;
            toml.push_str(&format!(
                "  {{ description = \"module {n}\", scope = [\"src/m{n}.rs\"], acceptance = \"it builds\" }},\n"
            ));
        }
        toml.push_str("]\n");
    }
    Scenario::from_toml(&toml)
}

/// The 1,000-task scripted run with the Planner; its requests measured.
pub fn planner_run(workers: usize) -> Result<RequestSizes, RequestsError> {
    let scenario = thousand_tasks()?;
    actix::System::new().block_on(async move {
        let run = RunId::generate();
        let state = std::env::temp_dir().join(format!("flotilla-bench-{run}"));
        let unbounded = Budget::new(u64::MAX / 4, Usd::from_micros(u64::MAX / 4), u64::MAX / 4);
        let limits = Limits {
            max_nodes: SPRINTS * TASKS_PER_SPRINT + 16,
            max_workers: workers.max(1),
            run_budget: unbounded,
            ..Limits::default()
        };
        let metered = Arc::new(Metered::new(Arc::new(ScriptedLlm::new(scenario.clone()))));
        let (finished_tx, finished_rx) = oneshot::channel();
        let observer = Finish(Some(finished_tx)).start();
        let graph_ctx = Context::<TaskGraph>::new();
        let graph = graph_ctx.address();
        let kit = WorkerKit {
            agents: AgentSet::one(Arc::new(ScriptedAgent::new(scenario))),
            worktrees: Arc::new(NameOnlyWorktrees {
                root: PathBuf::from(&state),
            }),
            runner: Arc::new(TokioProcessRunner),
            checks: Arc::new(Default::default()),
            notices: None,
            keep_failed: false,
            retry_in_place: false,
            transcripts: flotilla_actors::ports::Transcripts::none(),
            reviewer: None,
        };
        let pool = WorkerPool::new(
            run,
            kit,
            graph.clone().recipient(),
            Duration::from_secs(3600),
        )
        .start();
        let dispatch = Dispatch::new(
            run,
            limits.clone(),
            vec![WorkerProfile::new("general", &[], 1)],
            graph.clone().recipient(),
            pool.recipient(),
            NoSubplanner.start().recipient(),
        )
        .start();
        let planner = Planner::new(
            run,
            "build the thousand modules".into(),
            prompts::for_role(Role::Planner, &PromptOverrides::default(), &limits),
            metered.clone(),
            graph.clone().recipient(),
            PlannerConfig::default(),
        )
        .with_graph_view(graph.clone().recipient())
        .start();
        let task_graph = TaskGraph::new(
            run,
            RunGraph::new(limits),
            Arc::new(MemoryJournal::new(Arc::new(SystemClock))),
            dispatch.recipient(),
            Some(observer.recipient()),
        )
        .with_planner(planner.clone().recipient());
        graph_ctx.run(task_graph);
        planner.do_send(flotilla_actors::protocol::ToPlanner::Start);
        match finished_rx.await.map_err(|_| RequestsError::Gone)? {
            (RunOutcome::Completed, _) => Ok(metered.sizes()),
            (outcome, reason) => Err(RequestsError::NotCompleted {
                outcome,
                reason: reason.unwrap_or_default(),
            }),
        }
    })
}

/// Answers when the run finishes.
struct Finish(Option<oneshot::Sender<(RunOutcome, Option<String>)>>);

impl Actor for Finish {
    type Context = Context<Self>;
}

impl Handler<Published> for Finish {
    type Result = ();

    fn handle(&mut self, Published(event): Published, _: &mut Context<Self>) {
        if let EventKind::RunFinished { outcome, reason } = event.kind
            && let Some(tx) = self.0.take()
        {
            let _ = tx.send((outcome, reason));
        }
    }
}

/// A model whose every answer is 5 MiB of junk.
struct Junk;

impl Llm for Junk {
    fn complete(
        &self,
        _request: LlmRequest,
        _call: LlmCall,
    ) -> BoxFuture<'static, Result<LlmResponse, LlmError>> {
        Box::pin(async {
            Ok(LlmResponse {
                content: "x".repeat(5 * 1024 * 1024),
                ..LlmResponse::default()
            })
        })
    }
}

/// Plays the TaskGraph for a planner alone: answers when it gives up.
struct GaveUp(Option<oneshot::Sender<()>>);

impl Actor for GaveUp {
    type Context = Context<Self>;
}

impl Handler<ToTaskGraph> for GaveUp {
    type Result = ();

    fn handle(&mut self, msg: ToTaskGraph, _: &mut Context<Self>) {
        if matches!(msg, ToTaskGraph::PlannerGaveUp { .. })
            && let Some(tx) = self.0.take()
        {
            let _ = tx.send(());
        }
    }
}

/// The Planner against junk answers until it gives up; its requests measured.
pub fn hostile_planner() -> Result<RequestSizes, RequestsError> {
    actix::System::new().block_on(async {
        let metered = Arc::new(Metered::new(Arc::new(Junk)));
        let (tx, rx) = oneshot::channel();
        let graph = GaveUp(Some(tx)).start();
        let config = PlannerConfig {
            backoff_base_ms: 1,
            backoff_max_ms: 2,
            ..PlannerConfig::default()
        };
        let planner = Planner::new(
            RunId::generate(),
            "build it".into(),
            prompts::for_role(
                Role::Planner,
                &PromptOverrides::default(),
                &Limits::default(),
            ),
            metered.clone(),
            graph.recipient(),
            config,
        )
        .start();
        planner.do_send(flotilla_actors::protocol::ToPlanner::Start);
        rx.await.map_err(|_| RequestsError::Gone)?;
        Ok(metered.sizes())
    })
}
