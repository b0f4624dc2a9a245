//! The run supervisor: the actor that starts the actors of each run (new or recovered from
//! the journal), holds every one of them, learns when one stops, and ends them all when the
//! run ends. It also forwards every journaled event to the daemon's broadcast hub for the
//! streams.
//!
//! Supervision (ADR-006): every member of a run (TaskGraph, Dispatch, Planner, Subplanner,
//! WorkerPool, MergeQueue, Reconciler) holds a [`Lifeline`] that tells the supervisor when
//! it ends, however it ends. A member that ends while its run is live means the run's actors
//! no longer agree, so the supervisor stops the others and restarts the whole run from the
//! journal, which is the truth:
//! - because the journal could not be written: the run waits and retries with backoff
//!   (the stream and `status` say so), and resumes once appends go through again; such
//!   retries are not charged, the disk is not the run's fault;
//! - for any other reason (a panic, a broken invariant): the restart is journaled
//!   (`RunRestarted`), and after `max_run_restarts` of them the run ends `Failed` with the
//!   reason, so a run that keeps crashing cannot loop forever, even across daemon restarts.
//!
//! A run whose journal does not replay is *damaged*: it is listed with the reason and left
//! alone; every other run, and the daemon, keep working.
//!
//! It is an actor because actors can only be started from inside the actix System: HTTP
//! handlers run on tokio tasks and ask the supervisor instead.
//!
//! Here: the Supervisor's state and its messages. Beside it, one file per concern:
//! - `lifecycle.rs`: a run's start, restart, failure and end, and the handlers that drive it;
//! - `wiring.rs`: the composition root that builds and starts a run's seven actors;
//! - `pauses.rs`: runs paused for refused storage and for providers' rate limits (ADR-024);
//! - `retire.rs`: a finished run's thread and the sweep of what it left (ADR-014, ADR-021);
//! - `memory.rs`: memory given back to the system once a run's thread is gone (ADR-013);
//! - `gc.rs`: `flotilla gc`, what finished runs left in every repository (ADR-021).
//!
//! What a run's journal says its actors resume from is pure code in the actors crate
//! (`flotilla_actors::recovery`).
//!
//! It must not know the CLI, the client or rendering.

mod gc;
mod lifecycle;
pub(crate) mod memory;
mod pauses;
mod retire;
mod wiring;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use actix::prelude::*;
use flotilla_actors::actors::worker::check::ChecksConfigError;
use flotilla_actors::actors::{
    Dispatch, MergeQueue, Planner, Reconciler, Subplanner, TaskGraph, WorkerPool,
};
use flotilla_actors::graph::GraphError;
use flotilla_actors::ports::{Clock, Journal};
use flotilla_actors::protocol::{Event, EventKind, RunId, TaskId, UserDecision};
use flotilla_actors::supervision::{Lifeline, StopCause, StopMember};
use tokio::sync::broadcast;

pub use self::gc::GcError;
use super::transcripts::TranscriptStore;
pub use crate::api::gc::GcReport;
use crate::config::{RunConfig, RunConfigError};
use crate::daemon_mark::DaemonMark;
use crate::git::target::TargetBranch;
use crate::journal::SqliteJournal;
use crate::providers::ProviderRegistry;

/// Which actor of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Member {
    TaskGraph,
    Dispatch,
    Planner,
    Subplanner,
    Workers,
    MergeQueue,
    Reconciler,
}

/// A member of a run ended (from its lifeline).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct MemberStopped {
    pub run: RunId,
    pub generation: u64,
    pub member: Member,
    pub cause: StopCause,
}

/// The live actors of a run.
#[derive(Clone)]
pub struct RunMembers {
    pub task_graph: Addr<TaskGraph>,
    pub dispatch: Addr<Dispatch>,
    pub planner: Addr<Planner>,
    pub subplanner: Addr<Subplanner>,
    pub workers: Addr<WorkerPool>,
    pub merge_queue: Addr<MergeQueue>,
    pub reconciler: Addr<Reconciler>,
}

impl RunMembers {
    fn stop_all(&self) {
        self.task_graph.do_send(StopMember);
        self.dispatch.do_send(StopMember);
        self.planner.do_send(StopMember);
        self.subplanner.do_send(StopMember);
        self.workers.do_send(StopMember);
        self.merge_queue.do_send(StopMember);
        self.reconciler.do_send(StopMember);
    }

    /// Whether any of them still runs.
    pub fn any_alive(&self) -> bool {
        self.task_graph.connected()
            || self.dispatch.connected()
            || self.planner.connected()
            || self.subplanner.connected()
            || self.workers.connected()
            || self.merge_queue.connected()
            || self.reconciler.connected()
    }
}

enum Life {
    Live(RunMembers),
    /// Stopped; a `RestartRun` timer is pending.
    Restarting,
    /// The journal does not replay (the reason is the entry's problem): left alone.
    Damaged,
}

struct RunEntry {
    request: String,
    /// The target repository (its `main` is what the planner reads).
    repo: PathBuf,
    config: RunConfig,
    /// Bumped on every (re)start; notices from older members are ignored.
    generation: u64,
    life: Life,
    /// Restarts after a member died, as journaled (`RunRestarted`).
    restarts: u32,
    /// Consecutive retries that found the journal unwritable.
    journal_retries: u32,
    /// Consecutive pauses for flotilla's storage refusing a write (the backoff's exponent);
    /// reset when work goes through again.
    storage_pauses: u32,
    /// What is wrong right now, for `status` and `runs`.
    problem: Option<RunProblem>,
    /// The run must end Failed with this reason once the journal takes it.
    failing: Option<String>,
    /// A cancel the user asked for while the run had no actors, journaled
    /// (`RunCancelRequested`) at this seq: the run's next life carries it out, and a life
    /// that read its journal before that seq is told (`cancel_between_lives`).
    cancel_journaled: Option<(u64, String)>,
    /// The last seq the current life's journal read held.
    life_read_upto: u64,
    /// The thread the run's actors live on (ADR-014): made at its first start, kept across
    /// restarts, stopped once its actors have stopped after the run ended.
    thread: Option<Arbiter>,
    /// Providers whose rate-limit pause is journaled (`ProviderPauseStarted`) and not yet
    /// over: until when (ms since the epoch). A timer journals `ProviderResumed` then.
    provider_pauses: HashMap<String, u64>,
}

pub struct Supervisor {
    /// The journal for the supervisor's own records (runs, restarts, failures).
    journal: SqliteJournal,
    /// What the run actors append through: the journal, or a fault-injecting decorator.
    journal_port: Arc<dyn Journal>,
    clock: Arc<dyn Clock>,
    hub: broadcast::Sender<Event>,
    /// Runs' attempt worktrees live below it, one directory per run.
    worktrees: PathBuf,
    /// The daemon's LLM endpoints, shared by every run (rate limits, concurrency caps).
    providers: Arc<ProviderRegistry>,
    /// What no command of a run may see (ADR-015): the state directory (journal, token,
    /// every attempt's worktree), the socket wherever it is.
    daemon_paths: Vec<PathBuf>,
    /// What every command of every run carries for the next daemon to end, should this one
    /// die with them still running (`process::left_behind`).
    mark: Option<DaemonMark>,
    runs: HashMap<RunId, RunEntry>,
    /// Runs that ended, until their actors have stopped (then their thread is stopped; after
    /// a deadline it is stopped anyway).
    retiring: HashMap<RunId, Retiring>,
    /// Threads of retired runs, stopped and being joined (each by a joiner of its own, so the
    /// Supervisor never blocks): joined at the Supervisor's drop, so that none outlives the
    /// daemon; finished ones are let go at the next retirement.
    joining: Vec<std::thread::JoinHandle<()>>,
    /// Attempts' transcripts (ADR-036); `gc` removes finished runs' with them.
    transcripts: Option<TranscriptStore>,
    /// How many ended runs have not finished retiring (their sweep, the heal of their
    /// target's checkout, their stored status): the daemon's stop waits for them, for a
    /// while ([`FinishCleanUps`]), so that stopping right after a run ends loses none of it.
    cleaning: Arc<tokio::sync::watch::Sender<usize>>,
}

/// A finished run, waiting for its actors to stop before its thread retires.
struct Retiring {
    /// The life whose members are awaited (notices of earlier lives are not theirs).
    generation: u64,
    /// Its members that have not stopped yet.
    awaited: Vec<Member>,
    thread: Option<Arbiter>,
    /// What its sweep needs: the repository, whether failed attempts' worktrees stay, and
    /// the branch whose checkout is healed.
    repo: PathBuf,
    keep_failed: bool,
    /// Failed attempts' branches kept for a retry in place (ADR-031): the sweep deletes
    /// every branch the journal does not record as delivered.
    retry_in_place: bool,
    /// The disk the directories it leaves for the repository's next run may take (MiB; 0
    /// empties the pool); None: it leaves none, the pool as it is.
    pool_budget_mb: Option<u64>,
    target: Option<TargetBranch>,
    /// Counts the run in [`Supervisor::cleaning`] until its clean-up ends.
    cleaning: retire::Cleaning,
}

impl Supervisor {
    pub fn new(
        journal: SqliteJournal,
        journal_port: Arc<dyn Journal>,
        clock: Arc<dyn Clock>,
        hub: broadcast::Sender<Event>,
        worktrees: PathBuf,
        providers: Arc<ProviderRegistry>,
    ) -> Self {
        Supervisor {
            journal,
            journal_port,
            clock,
            hub,
            daemon_paths: vec![worktrees.parent().unwrap_or(&worktrees).to_path_buf()],
            worktrees,
            providers,
            mark: None,
            runs: HashMap::new(),
            retiring: HashMap::new(),
            joining: Vec::new(),
            transcripts: None,
            cleaning: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    /// Keeps every attempt's transcript in `store`.
    pub fn with_transcripts(mut self, store: TranscriptStore) -> Self {
        self.transcripts = Some(store);
        self
    }

    /// Puts `mark` on every command of every run.
    pub fn marking(mut self, mark: DaemonMark) -> Self {
        self.mark = Some(mark);
        self
    }

    /// Also hides `paths` from every command (the daemon's socket, when it is not in the
    /// state directory).
    pub fn hiding(mut self, paths: impl IntoIterator<Item = PathBuf>) -> Self {
        self.daemon_paths.extend(paths);
        self
    }

    fn lifeline(
        &self,
        run: RunId,
        generation: u64,
        member: Member,
        ctx: &Context<Self>,
    ) -> Lifeline {
        let supervisor = ctx.address().recipient::<MemberStopped>();
        Lifeline::new(move |cause| {
            supervisor.do_send(MemberStopped {
                run,
                generation,
                member,
                cause,
            })
        })
    }

    /// Publishes an event that is not in the journal (seq 0): a notice for live streams.
    fn notice(&self, run: RunId, kind: EventKind) {
        let _ = self.hub.send(Event {
            seq: 0,
            run,
            at_ms: self.clock.now_ms(),
            kind,
        });
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;
}

/// Start a run's actors. `journal` holds its events so far (at least `RunStarted`); when it
/// holds more, the run is resumed from them.
#[derive(Message)]
#[rtype(result = "Result<(), StartError>")]
pub struct StartRun {
    pub run: RunId,
    pub request: String,
    pub repo: PathBuf,
    pub config: RunConfig,
    pub journal: Vec<Event>,
}

/// Why a run's actors were not started. A run whose configuration cannot run or whose
/// journal does not replay is also marked damaged, with this error's text as the reason.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("run {0} is not known to the supervisor")]
    Unknown(RunId),
    #[error("run {0} is already live")]
    AlreadyLive(RunId),
    /// Its stored configuration does not validate (or names an impossible target branch).
    #[error("its configuration cannot run: {0}")]
    Config(#[source] RunConfigError),
    /// Its checks' globs do not compile.
    #[error("its configuration cannot run: {0}")]
    Checks(#[source] ChecksConfigError),
    #[error("the journal does not replay: {0}")]
    Replay(#[source] GraphError),
}

/// A run the daemon could not even load (its stored config or events are unreadable):
/// listed as damaged with the reason.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RunDamaged {
    pub run: RunId,
    pub reason: String,
}

/// How a cancel went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelAnswer {
    /// The cancellation is journaled; the run is winding down.
    Journaled,
    /// The run is not live in this daemon (finished, or unknown).
    NotLive,
    /// The run is between two lives (restarting, or waiting for the journal): try again.
    Unavailable(String),
}

/// Cancel a live run. Answered once the cancellation is in the journal.
#[derive(Message)]
#[rtype(result = "CancelAnswer")]
pub struct CancelRun {
    pub run: RunId,
    pub reason: String,
}

/// What is wrong with each run that has a problem (damaged, journal unwritable, restarting).
#[derive(Message)]
#[rtype(result = "HashMap<RunId, RunProblem>")]
pub struct RunProblems;

/// What is wrong with a run, as the supervisor knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunProblem {
    /// Its journal does not replay, or its stored config cannot run: it is left alone.
    Damaged(String),
    /// Its journal could not be written (or read): it waits and retries.
    Paused(String),
    /// One of its actors died: it is being restarted from the journal.
    Restarting(String),
}

impl RunProblem {
    pub fn is_damage(&self) -> bool {
        matches!(self, RunProblem::Damaged(_))
    }
}

impl std::fmt::Display for RunProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunProblem::Damaged(reason) => write!(f, "damaged: {reason}"),
            // The text says what failed ("the journal could not be written: …").
            RunProblem::Paused(problem) => f.write_str(problem),
            RunProblem::Restarting(reason) => write!(f, "restarting: {reason}"),
        }
    }
}

/// The live actors of a run, if it is live: for tests and diagnostics.
#[derive(Message)]
#[rtype(result = "Option<RunMembers>")]
pub struct GetRunMembers(pub RunId);

/// The threads of runs (ADR-014): of live runs, and of finished runs whose actors are
/// still stopping. For tests and diagnostics.
#[derive(Message)]
#[rtype(result = "RunThreadCount")]
pub struct RunThreads;

/// The daemon is stopping: wait until every ended run has finished retiring (its sweep,
/// the heal of its target's checkout, its stored status), for at most `within`. Answers how
/// many had not finished by then (the start-up collection and the first `status` do what
/// they left).
#[derive(Message)]
#[rtype(result = "usize")]
pub struct FinishCleanUps {
    pub within: std::time::Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, MessageResponse)]
pub struct RunThreadCount {
    pub live: usize,
    pub retiring: usize,
}

/// A human's decision for a task waiting on one (`flotilla decide`), forwarded to the run's
/// TaskGraph, which checks it and journals what it does. Answers false if the run is not
/// live in this daemon.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct DecideTask {
    pub run: RunId,
    pub task: TaskId,
    pub decision: UserDecision,
}

/// The user adopts main as it is for a run whose landing paused because main diverged
/// (`flotilla decide RUN --adopt-main`, ADR-024), forwarded to the run's TaskGraph, which
/// checks it and journals what it does. Answers false if the run is not live here.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct AdoptMain {
    pub run: RunId,
}

/// Removes what finished runs left (ADR-021, "Nothing left behind"): in each repository,
/// their stale ref locks, attempt worktrees and task branches (found by name, whatever a
/// crash left), and under the state directory their run directories, plus directories no
/// run of the journal accounts for. Runs that are live or unfinished are never touched
/// (their own sweeps collect at restart and at their end). With `dry_run`, only says what
/// it would remove: the same list a collection then removes, when nothing changed between.
/// Also heals the checkouts of main of every repository the journal knows (not in a dry
/// run). `progress`: log each repository as it is done (the daemon's start-up collection).
/// `transcripts`: finished runs' transcripts go too (`flotilla gc`); the start-up
/// collection keeps them, as a restart after a crash is when they are read (ADR-036).
#[derive(Debug, Message)]
#[rtype(result = "Result<GcReport, GcError>")]
pub struct CollectGarbage {
    pub dry_run: bool,
    pub progress: bool,
    pub transcripts: bool,
}
