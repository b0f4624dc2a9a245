//! `flotilla bench` throughput: N instant tasks through the whole actor pipeline of one
//! run (TaskGraph → Dispatch → WorkerPool → a Worker per attempt → the scripted agent →
//! the graph again), with the real SQLite journal in a temporary state directory or an
//! in-memory one, so the journal's cost shows.
//!
//! What is left out, and why: the Planner (one call that submits the tasks; its cost is
//! the model's), git (the worktrees are directory names only: an attempt's git work is
//! measured by the worktree tests, not here), and landing (the tasks change nothing, so
//! nothing goes to the merge queue).
//!
//! Timestamps come from a monotonic clock (`Instant`) in an observer that sees every event
//! as the TaskGraph publishes it, after its commit: dispatch latency is from `task_ready`
//! to `task_dispatched` of the same task, both as published.
//!
//! Every event is timed as published; ready → assigned counts from when a worker slot was
//! free.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::future::BoxFuture;
use tokio::sync::oneshot;

use flotilla_actors::actors::worker::check::{ChecksConfig, ChecksConfigError};
use flotilla_actors::actors::{AgentSet, Dispatch, TaskGraph, WorkerKit, WorkerPool};
use flotilla_actors::config::Limits;
use flotilla_actors::graph::RunGraph;
use flotilla_actors::ports::{
    BranchFate, Journal, JournalError, MemoryJournal, RepoError, SweepKeep, Swept, SystemClock,
    Workspace, WorktreeRequest, Worktrees,
};
use flotilla_actors::protocol::{
    BranchWork, Budget, DependencyRef, EventKind, Published, RunId, RunOutcome, TaskId, TaskSpec,
    ToAgent, ToTaskGraph, Usd,
};

use crate::journal::{JournalSync, RunRecord, SqliteJournal};
use crate::process::TokioProcessRunner;
use crate::scripted::{Scenario, ScriptedAgent};

/// Which journal the run appends to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalKind {
    /// SQLite in a temporary state directory, `synchronous=NORMAL` (the daemon's default).
    Sqlite,
    /// A vector in memory: the pipeline without the journal's cost.
    Memory,
}

impl JournalKind {
    pub fn as_str(self) -> &'static str {
        match self {
            JournalKind::Sqlite => "sqlite",
            JournalKind::Memory => "memory",
        }
    }
}

/// The tasks' dependencies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// No task depends on another: the workers are always busy.
    Independent,
    /// Each task depends on the one before: one runs at a time, and every completion makes
    /// the next one ready.
    Chain,
}

impl Shape {
    pub fn as_str(self) -> &'static str {
        match self {
            Shape::Independent => "independent",
            Shape::Chain => "chain",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Throughput {
    pub tasks: usize,
    pub shape: Shape,
    pub journal: JournalKind,
    /// Attempts running at once (`limits.max_workers`).
    pub workers: usize,
}

/// What one throughput run measured.
#[derive(Debug, Clone)]
pub struct ThroughputResult {
    pub tasks: usize,
    /// Events the run journaled and published.
    pub events: u64,
    /// From the first submission to `run_finished`.
    pub elapsed: Duration,
    /// Ready → dispatched, per task, sorted.
    pub dispatch_latencies: Vec<Duration>,
    /// The process's peak resident set during the run (Linux: VmHWM, reset before it when
    /// the kernel allows; otherwise the peak since the process started).
    pub peak_rss_bytes: Option<u64>,
}

impl ThroughputResult {
    pub fn tasks_per_s(&self) -> f64 {
        self.tasks as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn events_per_s(&self) -> f64 {
        self.events as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `q`-quantile (0..=1) of the dispatch latencies, in microseconds.
    pub fn dispatch_us(&self, q: f64) -> f64 {
        quantile_us(&self.dispatch_latencies, q)
    }
}

/// Nearest-rank quantile of sorted durations, in microseconds; 0 when there are none.
pub fn quantile_us(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1].as_secs_f64() * 1e6
}

/// Why a throughput run measured nothing.
#[derive(Debug, thiserror::Error)]
pub enum ThroughputError {
    #[error("a temporary state directory: {0}")]
    StateDir(#[source] std::io::Error),
    #[error("the journal: {0}")]
    Open(#[source] crate::journal::OpenError),
    #[error("the journal: {0}")]
    Journal(#[source] JournalError),
    #[error("checks: {0}")]
    Checks(#[source] ChecksConfigError),
    #[error("the run's observer stopped before the run finished")]
    ObserverGone,
    #[error("the run ended {outcome:?}, not completed: {reason}")]
    NotCompleted { outcome: RunOutcome, reason: String },
}

/// Runs one measurement on a fresh actix system of its own, on the calling thread.
pub fn run(config: &Throughput) -> Result<ThroughputResult, ThroughputError> {
    let config = config.clone();
    let system = actix::System::new();
    system.block_on(async move { measure(config).await })
}

async fn measure(config: Throughput) -> Result<ThroughputResult, ThroughputError> {
    let state = tempfile::tempdir().map_err(ThroughputError::StateDir)?;
    let run = RunId::generate();
    let journal: Arc<dyn Journal> = match config.journal {
        JournalKind::Memory => Arc::new(MemoryJournal::new(Arc::new(SystemClock))),
        JournalKind::Sqlite => {
            let journal = SqliteJournal::open_checked(
                &state.path().join("journal.sqlite"),
                Arc::new(SystemClock),
                false,
                JournalSync::Normal,
            )
            .map_err(ThroughputError::Open)?;
            journal
                .create_run(RunRecord {
                    id: run,
                    request: "flotilla bench".into(),
                    repo: state.path().into(),
                    config: serde_json::json!({}),
                    created_ms: 0,
                    outcome: None,
                })
                .await
                .map_err(ThroughputError::Journal)?;
            Arc::new(journal)
        }
    };

    let limits = bench_limits(config.tasks, config.workers);
    let (finished_tx, finished_rx) = oneshot::channel();
    let observer = Observer::new(config.tasks, config.workers, finished_tx).start();

    let graph_ctx = Context::<TaskGraph>::new();
    let graph = graph_ctx.address();
    let checks = ChecksConfig::default()
        .compile()
        .map_err(ThroughputError::Checks)?;
    let kit = WorkerKit {
        agents: AgentSet::one(Arc::new(ScriptedAgent::new(instant_scenario()))),
        worktrees: Arc::new(NameOnlyWorktrees {
            root: state.path().join("worktrees"),
        }),
        runner: Arc::new(TokioProcessRunner),
        checks: Arc::new(checks),
        notices: None,
        keep_failed: false,
        retry_in_place: false,
        transcripts: flotilla_actors::ports::Transcripts::none(),
        reviewer: None,
    };
    let workers = WorkerPool::new(
        run,
        kit,
        graph.clone().recipient(),
        Duration::from_secs(3600),
    )
    .start();
    let nobody = NoSubplanner.start();
    let dispatch = Dispatch::new(
        run,
        limits.clone(),
        vec![flotilla_actors::actors::WorkerProfile::new(
            "general",
            &[],
            1,
        )],
        graph.clone().recipient(),
        workers.recipient(),
        nobody.recipient(),
    )
    .start();
    let task_graph = TaskGraph::new(
        run,
        RunGraph::new(limits),
        journal,
        dispatch.recipient(),
        Some(observer.clone().recipient()),
    );
    graph_ctx.run(task_graph);

    reset_peak_rss();
    let started = Instant::now();
    observer.do_send(Started {
        at: started,
        workers: config.workers.max(1),
    });
    for batch in specs(config.tasks, config.shape).chunks(SUBMIT_BATCH) {
        graph.do_send(ToTaskGraph::SubmitTasks {
            tasks: batch.to_vec(),
        });
    }
    graph.do_send(ToTaskGraph::PlanningFinished);
    let seen = finished_rx
        .await
        .map_err(|_| ThroughputError::ObserverGone)?;
    let elapsed = seen.finished_at.duration_since(started);
    let peak_rss_bytes = peak_rss();
    match seen.outcome {
        RunOutcome::Completed => {}
        other => {
            return Err(ThroughputError::NotCompleted {
                outcome: other,
                reason: seen.reason.unwrap_or_default(),
            });
        }
    }
    let mut latencies = seen.latencies;
    latencies.sort_unstable();
    Ok(ThroughputResult {
        tasks: config.tasks,
        events: seen.events,
        elapsed,
        dispatch_latencies: latencies,
        peak_rss_bytes,
    })
}

/// Tasks go to the graph in batches of this many, as a planner's answers would.
const SUBMIT_BATCH: usize = 1_000;

/// Limits that let `tasks` instant tasks run: the node cap raised to fit them, budgets no
/// instant task can reach, and `workers` slots.
fn bench_limits(tasks: usize, workers: usize) -> Limits {
    let unbounded = Budget::new(u64::MAX / 4, Usd::from_micros(u64::MAX / 4), u64::MAX / 4);
    Limits {
        max_nodes: tasks.saturating_add(16),
        max_workers: workers.max(1),
        run_budget: unbounded,
        ..Limits::default()
    }
}

/// The tasks: distinct scopes (no scope waits), each depending on the one before in a
/// chain. A chain goes in one batch: a dependency is named by its place in the batch.
fn specs(tasks: usize, shape: Shape) -> Vec<TaskSpec> {
    (0..tasks)
        .map(|i| {
            let mut spec = TaskSpec::new(format!("bench task {i}"), &[&format!("src/m{i}.rs")]);
            if shape == Shape::Chain && i % SUBMIT_BATCH != 0 {
                spec.dependencies = vec![DependencyRef::Batch(i % SUBMIT_BATCH - 1)];
            } else if shape == Shape::Chain && i > 0 {
                // The first of a later batch waits for the last task of the batch before.
                spec.dependencies = vec![DependencyRef::Task(TaskId::root(i as u32))];
            }
            spec
        })
        .collect()
}

/// Every task completes at once, spending nothing measurable.
fn instant_scenario() -> Scenario {
    let mut scenario = Scenario::default();
    scenario.agent.delay_ms = Some(0);
    scenario.agent.tokens = Some(1);
    scenario
}

/// Worktrees that are names only: no directory, no git. `seal` reports no change, so a
/// task completes without landing.
pub(super) struct NameOnlyWorktrees {
    pub(super) root: PathBuf,
}

impl Worktrees for NameOnlyWorktrees {
    fn prepare(
        &self,
        request: WorktreeRequest,
    ) -> BoxFuture<'static, Result<Workspace, RepoError>> {
        let path = self.root.join(request.branch.replace('/', "-"));
        Box::pin(async move {
            Ok(Workspace {
                path,
                branch: request.branch,
                base: String::new(),
                continued_from: None,
            })
        })
    }

    fn seal(
        &self,
        workspace: Workspace,
        _subject: String,
    ) -> BoxFuture<'static, Result<BranchWork, RepoError>> {
        Box::pin(async move {
            Ok(BranchWork {
                branch: workspace.branch,
                base: workspace.base,
                head: String::new(),
                files: Vec::new(),
                files_omitted: 0,
                lines_added: 0,
                lines_removed: 0,
                committed_for_agent: false,
                links_outside: Vec::new(),
            })
        })
    }

    fn release(
        &self,
        _workspace: Workspace,
        _fate: BranchFate,
    ) -> BoxFuture<'static, Result<(), RepoError>> {
        Box::pin(async { Ok(()) })
    }

    fn sweep(&self, _keep: SweepKeep) -> BoxFuture<'static, Result<Swept, RepoError>> {
        Box::pin(async { Ok(Swept::default()) })
    }
}

/// Dispatch routes wide tasks to a Subplanner; the bench's tasks are never wide.
pub(super) struct NoSubplanner;

impl Actor for NoSubplanner {
    type Context = Context<Self>;
}

impl Handler<ToAgent> for NoSubplanner {
    type Result = ();

    fn handle(&mut self, msg: ToAgent, _: &mut Context<Self>) {
        tracing::warn!(?msg, "flotilla bench: a task went to the Subplanner");
    }
}

/// What the observer saw by the end of the run.
struct Seen {
    events: u64,
    latencies: Vec<Duration>,
    finished_at: Instant,
    outcome: RunOutcome,
    reason: Option<String>,
}

/// The clock starts: the run's tasks are about to be submitted, with `workers` free slots.
#[derive(Message)]
#[rtype(result = "()")]
struct Started {
    at: Instant,
    workers: usize,
}

/// Sees every event the TaskGraph publishes, timestamps what it needs, and answers when
/// the run finishes.
///
/// Dispatch latency is measured from the moment a task *could* be assigned: it is ready
/// and a worker slot is free. A task ready while every slot is busy waits for a slot, and
/// that wait is the workers' throughput, not the dispatcher's; so each dispatch takes the
/// slot that has been free the longest, and its latency runs from the later of its task's
/// `task_ready` and that slot's freeing (the end of the attempt that held it).
struct Observer {
    ready_at: HashMap<TaskId, Instant>,
    /// When each free slot became free, oldest first.
    free_since: VecDeque<Instant>,
    latencies: Vec<Duration>,
    events: u64,
    finished: Option<oneshot::Sender<Seen>>,
}

impl Observer {
    fn new(tasks: usize, workers: usize, finished: oneshot::Sender<Seen>) -> Self {
        Observer {
            ready_at: HashMap::with_capacity(tasks.min(1 << 20)),
            free_since: VecDeque::with_capacity(workers),
            latencies: Vec::with_capacity(tasks.min(1 << 20)),
            events: 0,
            finished: Some(finished),
        }
    }
}

impl Actor for Observer {
    type Context = Context<Self>;
}

impl Handler<Started> for Observer {
    type Result = ();

    /// Every slot is free from the start.
    fn handle(&mut self, Started { at, workers }: Started, _: &mut Context<Self>) {
        self.free_since = std::iter::repeat_n(at, workers).collect();
    }
}

impl Handler<Published> for Observer {
    type Result = ();

    fn handle(&mut self, Published(event): Published, _: &mut Context<Self>) {
        let now = Instant::now();
        self.events += 1;
        match &event.kind {
            EventKind::TaskReady { task } => {
                self.ready_at.insert(task.clone(), now);
            }
            EventKind::TaskDispatched { task, .. } => {
                let slot_free = self.free_since.pop_front();
                if let Some(ready) = self.ready_at.remove(task) {
                    let could_run = slot_free.map_or(ready, |free| free.max(ready));
                    self.latencies
                        .push(now.saturating_duration_since(could_run));
                }
            }
            EventKind::TaskCompleted { .. }
            | EventKind::TaskFailed { .. }
            | EventKind::TaskRetried { .. } => self.free_since.push_back(now),
            EventKind::RunFinished { outcome, reason } => {
                if let Some(tx) = self.finished.take() {
                    let _ = tx.send(Seen {
                        events: self.events,
                        latencies: std::mem::take(&mut self.latencies),
                        finished_at: now,
                        outcome: *outcome,
                        reason: reason.clone(),
                    });
                }
            }
            _ => {}
        }
    }
}

/// Resets the kernel's peak-RSS mark of this process (Linux 4.0+), so the next reading is
/// this measurement's peak. Harmless where it is not allowed.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// This process's peak resident set (VmHWM), in bytes; `None` off Linux.
pub fn peak_rss() -> Option<u64> {
    status_kib("VmHWM:").map(|kib| kib * 1024)
}

/// This process's resident set now (VmRSS), in bytes; `None` off Linux.
pub fn current_rss() -> Option<u64> {
    status_kib("VmRSS:").map(|kib| kib * 1024)
}

fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank_in_microseconds() {
        let d: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(quantile_us(&d, 0.5), 50.0);
        assert_eq!(quantile_us(&d, 0.99), 99.0);
        assert_eq!(quantile_us(&d, 1.0), 100.0);
        assert_eq!(quantile_us(&d, 0.0), 1.0);
        assert_eq!(quantile_us(&[], 0.5), 0.0);
    }

    #[test]
    fn a_chain_names_the_task_before_across_batches() {
        let chain = specs(SUBMIT_BATCH + 2, Shape::Chain);
        assert!(chain[0].dependencies.is_empty());
        assert_eq!(chain[1].dependencies, vec![DependencyRef::Batch(0)]);
        assert_eq!(
            chain[SUBMIT_BATCH].dependencies,
            vec![DependencyRef::Task(TaskId::root(SUBMIT_BATCH as u32))]
        );
        assert_eq!(
            chain[SUBMIT_BATCH + 1].dependencies,
            vec![DependencyRef::Batch(0)]
        );
        assert!(
            specs(10, Shape::Independent)
                .iter()
                .all(|s| s.dependencies.is_empty())
        );
    }

    #[test]
    fn a_small_run_completes_on_both_journals_and_measures_every_task() {
        for journal in [JournalKind::Memory, JournalKind::Sqlite] {
            for shape in [Shape::Independent, Shape::Chain] {
                let result = run(&Throughput {
                    tasks: 50,
                    shape,
                    journal,
                    workers: 4,
                })
                .unwrap();
                assert_eq!(result.tasks, 50);
                assert_eq!(result.dispatch_latencies.len(), 50, "{journal:?} {shape:?}");
                assert!(result.events >= 50 * 4, "{}", result.events);
                assert!(result.tasks_per_s() > 0.0);
            }
        }
    }
}
