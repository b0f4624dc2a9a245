//! The run supervisor: starts the actors of each run (new or recovered from the journal),
//! holds every one of them, learns when one stops, and ends them all when the run ends.
//! It also forwards every journaled event to the daemon's broadcast hub for the streams.
//!
//! Supervision (ADR-006): every member of a run (TaskGraph, Dispatch, Planner, WorkerPool)
//! holds a [`Lifeline`] that tells the supervisor when it ends, however it ends. A member
//! that ends while its run is live means the run's actors no longer agree, so the supervisor
//! stops the others and restarts the whole run from the journal, which is the truth:
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
//! Each run's actors are wired on the run's own thread (ADR-014). It pauses a run whose storage
//! refused a write (a `StorageUnavailable` notice) until a test write goes through, and
//! journals long provider pauses (`ProviderPauseStarted` / `ProviderResumed`, ADR-024).
//! `CollectGarbage` (`flotilla gc`, and once in the background after the daemon listens)
//! finds finished runs' stale ref locks, worktrees and branches by name in each repository,
//! then their directories under `worktrees/`; the dry run is the same plan (ADR-021).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use flotilla_actors::actors::{
    self, AgentSet, Dispatch, Exchange, MergeKit, MergeQueue, Planner, Reconciler, ReconcilerKit,
    RecordedExchange, Recovery, Subplanner, TaskGraph, WorkerKit, WorkerPool,
};
use flotilla_actors::graph::RunGraph;
use flotilla_actors::ports::{
    Agent, Clock, Journal, JournalError, Llm, ProcessRunner, RepoError, SweepKeep, Worktrees,
};
use flotilla_actors::protocol::{
    CheckoutSync, Event, EventKind, Published, Role, RootHandoff, RunId, RunOutcome, TaskId,
    TaskState, ToPlanner, ToTaskGraph, UserDecision, branch_name,
};
use flotilla_actors::supervision::{Lifeline, StopCause, StopMember};
use tokio::sync::broadcast;
use tracing::{error, info, warn};

use crate::agents::builtin::BuiltinAgent;
use crate::agents::command::CommandAgent;
use crate::config::RunConfig;
use crate::git::merge::GitMerge;
use crate::git::reader::GitRepo;
use crate::git::target::TargetBranch;
use crate::git::worktrees::GitWorktrees;
use crate::journal::SqliteJournal;
use crate::process::ConfinedRunner;
use crate::prompts;
use crate::providers::ProviderRegistry;
use crate::sandbox::SandboxPolicy;
use crate::scripted::{ScriptedAgent, ScriptedLlm};

/// First wait before retrying a run whose journal could not be written; doubles up to
/// [`JOURNAL_RETRY_MAX`].
const JOURNAL_RETRY_FIRST: Duration = Duration::from_millis(500);
const JOURNAL_RETRY_MAX: Duration = Duration::from_secs(30);
/// Wait before restarting a run whose member died: enough to let its old actors go.
const RESTART_DELAY: Duration = Duration::from_millis(50);

/// Starting an actor on a given thread (an arbiter): a run's actors live on the run's own.
trait StartOn: Actor<Context = Context<Self>> + Send + Sized {
    fn start_on(self, thread: &ArbiterHandle) -> Addr<Self> {
        Self::start_in_arbiter(thread, move |_| self)
    }
}

impl<A: Actor<Context = Context<A>> + Send> StartOn for A {}

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
    runs: HashMap<RunId, RunEntry>,
    /// Threads of runs that ended, until their actors have stopped (then the thread is
    /// stopped; after [`RETIRE_LIMIT`] it is stopped anyway).
    retiring: Vec<Retiring>,
}

/// A finished run's thread, waiting for its actors to stop.
struct Retiring {
    members: RunMembers,
    thread: Arbiter,
    since: std::time::Instant,
}

/// How long a finished run's actors get to stop before their thread is stopped under them.
const RETIRE_LIMIT: Duration = Duration::from_secs(30);

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
            runs: HashMap::new(),
            retiring: Vec::new(),
        }
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

    /// Replays `journal` and starts the run's actors. Marks the run damaged if the journal
    /// does not replay.
    fn start_members(
        &mut self,
        run: RunId,
        journal: &[Event],
        ctx: &mut Context<Self>,
    ) -> Result<(), String> {
        let Some(entry) = self.runs.get_mut(&run) else {
            return Err(format!("run {run} is not known to the supervisor"));
        };
        let config = entry.config.clone();
        let impossible = config
            .validate()
            .and_then(|()| Ok(config.target_branch()?))
            .map_err(|e| format!("its configuration cannot run: {e}"));
        let target = match impossible {
            Ok(target) => target,
            Err(reason) => {
                entry.problem = Some(RunProblem::Damaged(reason.clone()));
                entry.life = Life::Damaged;
                if let Some(thread) = entry.thread.take() {
                    thread.stop();
                }
                return Err(reason);
            }
        };
        let graph_state = match RunGraph::new(config.limits.clone())
            .merging()
            .replayed(journal.iter().map(|e| &e.kind))
        {
            Ok(graph) => graph,
            Err(e) => {
                let reason = format!("the journal does not replay: {e}");
                error!(%run, %reason, "run damaged");
                entry.problem = Some(RunProblem::Damaged(reason.clone()));
                entry.life = Life::Damaged;
                if let Some(thread) = entry.thread.take() {
                    thread.stop();
                }
                if let Some(thread) = entry.thread.take() {
                    thread.stop();
                }
                return Err(reason);
            }
        };
        entry.restarts = journal
            .iter()
            .filter(|e| matches!(e.kind, EventKind::RunRestarted { .. }))
            .count() as u32;
        if graph_state.outcome().is_some() {
            if let Some(thread) = self.runs.remove(&run).and_then(|e| e.thread) {
                thread.stop();
            }
            return Ok(());
        }
        // The run's actors all start on the run's own thread (ADR-014).
        let thread = entry.thread.get_or_insert_with(Arbiter::new).handle();
        entry.generation += 1;
        let generation = entry.generation;
        let request = entry.request.clone();
        let entry_repo = entry.repo.clone();
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
        let subplanner_conversations =
            RecordedExchange::from_journal(journal.iter().map(|e| &e.kind));
        let recovery = recovering.then(|| recovery(&graph_state, journal, self.clock.now_ms()));
        let planner_calls = graph_state.planner_calls();

        // Roles with models in [roles] call them (through the daemon's shared endpoints);
        // the others replay the scenario.
        let scripted: Arc<dyn Llm> = Arc::new(ScriptedLlm::new(config.scenario.clone()));
        let llm: Arc<dyn Llm> = Arc::new(self.providers.llm_for(&config.models, Some(scripted)));
        // One sandbox policy for every command of the run: agents, verification, the merge
        // gate and the Reconciler's sweeps (ADR-015).
        let policy = SandboxPolicy::for_run(&config.sandbox, &self.daemon_paths, &entry_repo);
        let runner: Arc<dyn ProcessRunner> = Arc::new(ConfinedRunner::new(policy));
        let runner_for_merge = runner.clone();
        let agents = agent_set(&config, llm.clone(), runner.clone());
        let checks = config
            .checks
            .compile()
            .map_err(|e| format!("its configuration cannot run: {e}"))?
            .protecting(config.protected_paths(&entry_repo));
        let kit = WorkerKit {
            agents,
            worktrees: Arc::new(GitWorktrees::new(
                entry_repo.clone(),
                run,
                self.worktrees.join(run.to_string()),
                target.clone(),
            )),
            runner,
            checks: Arc::new(checks),
            notices: Some(ctx.address().recipient()),
            keep_failed: config.worktrees.keep_failed,
        };
        // Parents waiting for their subtasks keep the worktree their synthesis runs in.
        let synthesizing: Vec<String> = graph_state
            .tasks()
            .filter(|n| {
                !n.subplanned
                    && matches!(
                        n.state,
                        TaskState::WaitingForSubtasks | TaskState::Synthesizing
                    )
            })
            .map(|n| branch_name(run, &n.id, n.attempt))
            .collect();
        // What the journal says was delivered: any other branch of the run (a crash between
        // a Worker releasing its worktree and its report being journaled) goes. A branch
        // handed to the merge queue (`TaskLanding`) is delivered too: a `Landing` task is
        // enqueued again after the restart and lands from it.
        let delivered: Vec<String> = journal
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::TaskCompleted {
                    handoff: Some(h), ..
                } => h.work.as_ref().map(|w| w.branch.clone()),
                EventKind::TaskLanding { branch, .. } => Some(branch.clone()),
                _ => None,
            })
            .collect();

        // The TaskGraph's address is needed before the actor exists (its collaborators hold
        // it): its mailbox is made here, and the actor is started on that mailbox, on the
        // run's thread, once built (a Context cannot cross threads; its mailbox can).
        let (graph_sender, graph_mailbox) = actix::dev::channel::channel::<TaskGraph>(16);
        let graph_addr = Addr::new(graph_sender);
        let mut keep_worktrees = synthesizing;
        if config.worktrees.keep_failed {
            keep_worktrees.extend(failed_attempts(run, journal.iter().map(|e| &e.kind)));
        }
        let workers = WorkerPool::new(
            run,
            kit,
            graph_addr.clone().recipient(),
            Duration::from_millis(config.limits.default_budget.wall_time_ms.max(1)),
        )
        .keeping(SweepKeep {
            worktrees: keep_worktrees,
            delivered: Some(delivered),
            closing: false,
        })
        .watched(self.lifeline(run, generation, Member::Workers, ctx))
        .start_on(&thread);
        let entry_repo_for_merge = entry_repo.clone();
        let repo_for_merge = Arc::new(GitRepo::new(entry_repo.clone(), target.clone()));
        let repo = Arc::new(GitRepo::new(entry_repo, target.clone()));
        let subplanner = Subplanner::new(
            run,
            prompts::for_role(Role::Subplanner, &config.prompts, &config.limits),
            llm.clone(),
            graph_addr.clone().recipient(),
            config.limits.clone(),
            config.subplanner.clone(),
        )
        .with_repo(repo.clone())
        .with_notices(ctx.address().recipient())
        .resuming(subplanner_conversations)
        .watched(self.lifeline(run, generation, Member::Subplanner, ctx))
        .start_on(&thread);
        let dispatch = Dispatch::new(
            run,
            config.limits.clone(),
            config.profiles(),
            graph_addr.clone().recipient(),
            workers.clone().recipient(),
            subplanner.clone().recipient(),
        )
        .watched(self.lifeline(run, generation, Member::Dispatch, ctx))
        .start_on(&thread);
        let planner = Planner::new(
            run,
            request,
            prompts::for_role(Role::Planner, &config.prompts, &config.limits),
            llm,
            graph_addr.clone().recipient(),
            config.planner.clone(),
        )
        .with_repo(repo)
        .with_notices(ctx.address().recipient())
        .with_graph_view(graph_addr.clone().recipient())
        .resuming(conversation)
        .watched(self.lifeline(run, generation, Member::Planner, ctx))
        .start_on(&thread);
        let merge_git = Arc::new(GitMerge::new(
            entry_repo_for_merge.clone(),
            self.worktrees
                .join(run.to_string())
                .join(crate::git::worktrees::SCRATCH_DIR),
            target,
        ));
        let reconciler = Reconciler::new(
            run,
            ReconcilerKit {
                git: merge_git.clone(),
                reader: repo_for_merge.clone(),
                runner: runner_for_merge.clone(),
                config: config.reconciler.clone(),
                max_fixes: config.limits.max_fix_tasks_per_sweep as usize,
            },
            graph_addr.clone().recipient(),
        )
        .watched(self.lifeline(run, generation, Member::Reconciler, ctx))
        .start_on(&thread);
        let merge_queue = MergeQueue::new(
            run,
            MergeKit {
                git: merge_git,
                main: repo_for_merge.clone(),
                reader: repo_for_merge,
                runner: runner_for_merge,
                config: config.merge.clone(),
            },
            graph_addr.clone().recipient(),
            graph_addr.clone().recipient(),
        )
        .with_written(graph_state.main_tip())
        .with_dropped(graph_state.dropped_commits().to_vec())
        .with_notices(ctx.address().recipient())
        .with_reconciler(reconciler.clone().recipient())
        .with_planner(planner.clone().recipient())
        .watched(self.lifeline(run, generation, Member::MergeQueue, ctx))
        .start_on(&thread);
        let mut task_graph = TaskGraph::new(
            run,
            graph_state,
            self.journal_port.clone(),
            dispatch.clone().recipient(),
            Some(ctx.address().recipient()),
        )
        .with_planner(planner.clone().recipient())
        .with_default_agent(workers.clone().recipient())
        .with_subplanner(subplanner.clone().recipient())
        .with_merging(
            merge_queue.clone().recipient(),
            reconciler.clone().recipient(),
        )
        .watched(self.lifeline(run, generation, Member::TaskGraph, ctx));
        if let Some(recovery) = recovery {
            task_graph = task_graph.resuming(recovery);
        }
        thread.spawn_fn(move || {
            Context::with_receiver(graph_mailbox).run(task_graph);
        });
        if planner_calls == 0 {
            planner.do_send(ToPlanner::Start);
        }
        self.resume_journaled_pauses(run, journal, ctx);
        info!(%run, recovering, generation, "run started");
        if let Some(entry) = self.runs.get_mut(&run) {
            entry.life = Life::Live(RunMembers {
                task_graph: graph_addr,
                dispatch,
                planner,
                subplanner,
                workers,
                merge_queue,
                reconciler,
            });
        }
        Ok(())
    }

    /// Reads the run's journal again and starts it from there (or journals its failure).
    fn restart(&mut self, run: RunId, ctx: &mut Context<Self>) {
        let Some(entry) = self.runs.get(&run) else {
            return;
        };
        if let Some(reason) = entry.failing.clone() {
            self.journal_failure(run, reason, ctx);
            return;
        }
        let read = self.journal.read(run, 0);
        ctx.spawn(
            read.into_actor(self)
                .map(move |result, act, ctx| match result {
                    Ok(events) => {
                        if let Err(e) = act.start_members(run, &events, ctx) {
                            warn!(%run, error = %e, "cannot restart the run");
                        }
                    }
                    Err(e) => {
                        act.retry_later(run, format!("the journal could not be read: {e}"), ctx)
                    }
                }),
        );
    }

    /// The journal refused a write (or a read): say so, and try again later.
    fn retry_later(&mut self, run: RunId, problem: String, ctx: &mut Context<Self>) {
        let Some(entry) = self.runs.get_mut(&run) else {
            return;
        };
        entry.life = Life::Restarting;
        let delay = JOURNAL_RETRY_FIRST
            .saturating_mul(1u32 << entry.journal_retries.min(16))
            .min(JOURNAL_RETRY_MAX);
        entry.journal_retries = entry.journal_retries.saturating_add(1);
        warn!(%run, %problem, retry_in_ms = delay.as_millis() as u64, "run paused");
        entry.problem = Some(RunProblem::Paused(problem.clone()));
        self.notice(run, EventKind::JournalUnavailable { error: problem });
        ctx.run_later(delay, move |act, ctx| act.restart(run, ctx));
    }

    /// Ends the run `Failed` with `reason`, once the journal takes it.
    fn journal_failure(&mut self, run: RunId, reason: String, ctx: &mut Context<Self>) {
        if let Some(entry) = self.runs.get_mut(&run) {
            entry.failing = Some(reason.clone());
            entry.life = Life::Restarting;
        }
        let finished = EventKind::RunFinished {
            outcome: RunOutcome::Failed,
            reason: Some(reason),
        };
        self.record(run, finished, ctx, |_, _| {});
    }

    /// Journals one of the supervisor's own records for `run`, publishes it and then runs
    /// `then`; a journal that refuses it pauses the run (`retry_later`) instead.
    fn record(
        &mut self,
        run: RunId,
        kind: EventKind,
        ctx: &mut Context<Self>,
        then: impl FnOnce(&mut Self, &mut Context<Self>) + 'static,
    ) {
        let append = self.journal.append(run, vec![kind]);
        ctx.spawn(
            append
                .into_actor(self)
                .map(move |result, act, ctx| match result {
                    Ok(events) => {
                        for event in events {
                            act.publish(event);
                        }
                        then(act, ctx);
                    }
                    Err(e) => {
                        act.retry_later(run, format!("the journal could not be written: {e}"), ctx)
                    }
                }),
        );
    }

    /// A journaled event on its way to the streams; a finished run's actors are stopped.
    fn publish(&mut self, event: Event) {
        if let EventKind::RunFinished { outcome, .. } = &event.kind {
            info!(run = %event.run, ?outcome, "run finished");
            if let Some(mut entry) = self.runs.remove(&event.run) {
                let thread = entry.thread.take();
                match (std::mem::replace(&mut entry.life, Life::Restarting), thread) {
                    (Life::Live(members), Some(thread)) => {
                        members.stop_all();
                        self.retiring.push(Retiring {
                            members,
                            thread,
                            since: std::time::Instant::now(),
                        });
                    }
                    (Life::Live(members), None) => members.stop_all(),
                    (_, Some(thread)) => {
                        thread.stop();
                    }
                    (_, None) => {}
                }
                // With keep_failed, the failed attempts' worktrees outlive the run.
                let journal = entry
                    .config
                    .worktrees
                    .keep_failed
                    .then(|| self.journal.read(event.run, 0));
                // A config whose branch does not pass never started: nothing of it to heal.
                let target = entry.config.target_branch().ok();
                clean_up_after(
                    GitWorktrees::new(
                        entry.repo.clone(),
                        event.run,
                        self.worktrees.join(event.run.to_string()),
                        target.clone().unwrap_or_else(TargetBranch::legacy),
                    ),
                    target,
                    event.run,
                    journal,
                );
            }
        } else if event.seq > 0
            && let Some(entry) = self.runs.get_mut(&event.run)
        {
            // An append went through: whatever kept the journal from being written is over.
            // (A notice, seq 0, was not appended: it proves nothing.)
            if matches!(entry.life, Life::Live(_)) && entry.journal_retries > 0 {
                entry.journal_retries = 0;
                entry.problem = None;
            }
            // Work went through the storage again (a delivery needs a worktree, a landing
            // its gate's scratch): the next refusal waits from the start again.
            if matches!(
                event.kind,
                EventKind::TaskCompleted { .. }
                    | EventKind::TaskLanding { .. }
                    | EventKind::MainMoved { .. }
            ) {
                entry.storage_pauses = 0;
            }
        }
        // No subscriber is not an error: nobody is tailing.
        let _ = self.hub.send(event);
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(Duration::from_millis(500), |act, _| act.reap_threads());
    }
}

impl Supervisor {
    /// Stops the threads of finished runs whose actors have all stopped (or that had
    /// [`RETIRE_LIMIT`] to do so).
    fn reap_threads(&mut self) {
        let before = self.retiring.len();
        self.retiring.retain(|r| {
            let keep = r.members.any_alive() && r.since.elapsed() < RETIRE_LIMIT;
            if !keep {
                r.thread.stop();
            }
            keep
        });
        if self.retiring.len() < before {
            give_memory_back();
        }
    }
}

/// A collection point (ADR-013): a run's thread has stopped and its memory is free; glibc is
/// asked to return what it can to the system (`malloc_trim`), so the daemon's resident set
/// goes back down after each run instead of staying at its peak.
fn give_memory_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the system; no pointer is involved.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// At the daemon's stop the supervisor's thread ends and the Supervisor is dropped: every
/// run's thread is stopped and joined, so none outlives the daemon (and its state lock).
impl Drop for Supervisor {
    fn drop(&mut self) {
        let live = self
            .runs
            .values()
            .filter(|e| matches!(e.life, Life::Live(_)))
            .count();
        if live > 0 {
            info!(
                runs = live,
                "supervisor stopped with live runs; they resume at the next start"
            );
        }
        let threads = self
            .runs
            .values_mut()
            .filter_map(|e| e.thread.take())
            .chain(self.retiring.drain(..).map(|r| r.thread));
        for thread in threads.collect::<Vec<_>>() {
            thread.stop();
            if thread.join().is_err() {
                warn!("a run's thread did not end cleanly");
            }
        }
    }
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
        if let Some(Life::Live(_)) = self.runs.get(&run).map(|e| &e.life) {
            return Err(format!("run {run} is already live"));
        }
        self.runs.insert(
            run,
            RunEntry {
                request,
                repo,
                config,
                generation: 0,
                life: Life::Restarting,
                restarts: 0,
                journal_retries: 0,
                storage_pauses: 0,
                problem: None,
                failing: None,
                thread: None,
                provider_pauses: HashMap::new(),
            },
        );
        self.start_members(run, &journal, ctx)
    }
}

impl Handler<RunDamaged> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: RunDamaged, _: &mut Context<Self>) {
        error!(run = %msg.run, reason = %msg.reason, "run damaged");
        self.runs.insert(
            msg.run,
            RunEntry {
                request: String::new(),
                repo: PathBuf::new(),
                config: RunConfig::default(),
                generation: 0,
                problem: Some(RunProblem::Damaged(msg.reason.clone())),
                life: Life::Damaged,
                restarts: 0,
                journal_retries: 0,
                storage_pauses: 0,
                failing: None,
                thread: None,
                provider_pauses: HashMap::new(),
            },
        );
    }
}

impl Handler<MemberStopped> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: MemberStopped, ctx: &mut Context<Self>) {
        let run = msg.run;
        let max_restarts = {
            let Some(entry) = self.runs.get_mut(&run) else {
                return;
            };
            if entry.generation != msg.generation {
                return; // an actor of an earlier life, stopped on purpose
            }
            let Life::Live(members) = &entry.life else {
                return;
            };
            // The others must not act on a run whose actors no longer agree.
            members.stop_all();
            entry.life = Life::Restarting;
            entry.config.limits.max_run_restarts
        };
        warn!(%run, member = ?msg.member, cause = %msg.cause, "a run actor stopped");
        match msg.cause {
            StopCause::JournalUnwritable(e) => {
                self.retry_later(run, format!("the journal could not be written: {e}"), ctx)
            }
            cause => {
                let Some(entry) = self.runs.get_mut(&run) else {
                    return;
                };
                let restart = entry.restarts.saturating_add(1);
                let reason = format!("the run's {:?} actor {cause}", msg.member);
                if restart > max_restarts {
                    let reason = format!(
                        "{reason}; the run was already restarted {} times (max_run_restarts = {max_restarts})",
                        entry.restarts
                    );
                    self.journal_failure(run, reason, ctx);
                    return;
                }
                entry.problem = Some(RunProblem::Restarting(reason.clone()));
                let restarted = EventKind::RunRestarted { restart, reason };
                self.record(run, restarted, ctx, move |_, ctx| {
                    ctx.run_later(RESTART_DELAY, move |act, ctx| act.restart(run, ctx));
                });
            }
        }
    }
}

/// The branches of the run's attempts that failed (as the journal has them): what
/// `[worktrees] keep_failed` keeps.
fn failed_attempts<'a>(run: RunId, events: impl Iterator<Item = &'a EventKind>) -> Vec<String> {
    events
        .filter_map(|kind| match kind {
            EventKind::TaskRetried { task, attempt, .. }
            | EventKind::TaskFailed { task, attempt, .. } => Some(branch_name(run, task, *attempt)),
            _ => None,
        })
        .collect()
}

/// The run's agents by worker profile: `scripted`, `builtin` (on the worker role's model),
/// or, for a profile that names none, the built-in agent when `[roles]` gives the worker
/// role a model and the scripted agent otherwise.
fn agent_set(config: &RunConfig, llm: Arc<dyn Llm>, runner: Arc<dyn ProcessRunner>) -> AgentSet {
    let scripted: Arc<dyn Agent> = Arc::new(ScriptedAgent::with_runner(
        config.scenario.clone(),
        runner.clone(),
    ));
    let builtin: Arc<dyn Agent> = Arc::new(BuiltinAgent::new(
        llm,
        runner.clone(),
        prompts::for_role(Role::Worker, &config.prompts, &config.limits),
        config.builtin_agent.clone(),
    ));
    let worker_has_model = config.models.roles.get(Role::Worker).is_some();
    let default = if worker_has_model {
        builtin.clone()
    } else {
        scripted.clone()
    };
    let worker_prompt = prompts::for_role(Role::Worker, &config.prompts, &config.limits);
    let mut set = AgentSet::one(default);
    for profile in config.profiles() {
        let agent = match profile.agent.as_deref() {
            Some("builtin") => builtin.clone(),
            Some("scripted") => scripted.clone(),
            Some(name) => match config.agents.get(name).map(|cfg| {
                CommandAgent::new(
                    name.to_string(),
                    cfg.clone(),
                    runner.clone(),
                    worker_prompt.clone(),
                )
            }) {
                Some(Ok(agent)) => Arc::new(agent),
                // Validated when the config was loaded and again before the run started:
                // only a config changed in between gets here, and its profile keeps the
                // default agent, said in the log.
                Some(Err(e)) => {
                    warn!(profile = %profile.name, agent = name, error = %e, "cannot build the profile's agent");
                    continue;
                }
                None => continue,
            },
            None => continue,
        };
        set = set.with(&profile.name, agent);
    }
    set
}

/// After a run ended: removes its worktrees (and the branches of attempts that never
/// delivered; delivered work stays on its branch), and asks glibc to return the run's freed
/// memory to the system, so that a long-lived daemon's footprint follows its live runs.
fn clean_up_after(
    worktrees: GitWorktrees,
    target: Option<TargetBranch>,
    run: RunId,
    journal: Option<futures::future::BoxFuture<'static, Result<Vec<Event>, JournalError>>>,
) {
    actix::spawn(async move {
        // Let the run's actors finish stopping first: their memory is what is given back,
        // and their Workers release their own worktrees as they stop.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let kept_failed = match journal {
            Some(read) => match read.await {
                Ok(events) => failed_attempts(run, events.iter().map(|e| &e.kind)),
                Err(e) => {
                    warn!(%run, error = %e, "cannot read which attempts failed; their worktrees stay for gc");
                    return;
                }
            },
            None => Vec::new(),
        };
        let run_over = SweepKeep {
            worktrees: kept_failed,
            closing: true,
            ..SweepKeep::default()
        };
        if let Err(e) = worktrees.sweep(run_over).await {
            warn!(error = %e, "cannot remove a finished run's worktrees");
        }
        // A landing interrupted in the user's checkout (a kill, then a cancel) is healed
        // when the run ends, not left for a queue that will not start again (ADR-021).
        let healed = match target {
            Some(target) => {
                crate::git::checkout::heal_repository(worktrees.repository().to_path_buf(), target)
                    .await
            }
            None => Ok(None),
        };
        match healed {
            Ok(Some(CheckoutSync::Behind { at, paths })) => {
                warn!(%run, %at, ?paths, "the checkout of the target branch is behind it with changes of its own: left as it is")
            }
            Ok(_) => {}
            Err(e) => warn!(%run, error = %e, "cannot heal the checkout of the target branch"),
        }
        info!(%run, "cleaned up after the run");
        let _ = tokio::task::spawn_blocking(|| {
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            // SAFETY: malloc_trim only releases free memory of the allocator's own heaps.
            unsafe {
                libc::malloc_trim(0);
            }
        })
        .await;
    });
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
                    failure: n.failure.as_deref().cloned(),
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
            let due = accepted_at.saturating_add(graph.deadline_ms(&task)?);
            Some((task, due.saturating_sub(now_ms)))
        })
        .collect();
    Recovery {
        unread_handoffs,
        deadlines_in_ms,
    }
}

impl Handler<CancelRun> for Supervisor {
    type Result = ResponseActFuture<Self, CancelAnswer>;

    fn handle(&mut self, msg: CancelRun, _: &mut Context<Self>) -> Self::Result {
        let Some(entry) = self.runs.get(&msg.run) else {
            return Box::pin(fut::ready(CancelAnswer::NotLive));
        };
        match &entry.life {
            Life::Live(members) => {
                let asked = members
                    .task_graph
                    .send(actors::CancelRun { reason: msg.reason });
                Box::pin(asked.into_actor(self).map(|answer, _, _| match answer {
                    Ok(Ok(())) => CancelAnswer::Journaled,
                    Ok(Err(e)) => CancelAnswer::Unavailable(e.to_string()),
                    Err(_) => CancelAnswer::Unavailable(
                        "the run's task graph stopped; it is being restarted".into(),
                    ),
                }))
            }
            Life::Restarting => Box::pin(fut::ready(CancelAnswer::Unavailable(
                entry
                    .problem
                    .as_ref()
                    .map_or_else(|| "the run is restarting".into(), ToString::to_string),
            ))),
            Life::Damaged => {
                // A damaged run has no actors: its end is journaled directly.
                let run = msg.run;
                let append = self.journal.append(
                    run,
                    vec![EventKind::RunFinished {
                        outcome: RunOutcome::Cancelled,
                        reason: Some(msg.reason),
                    }],
                );
                Box::pin(
                    append
                        .into_actor(self)
                        .map(move |result, act, _| match result {
                            Ok(events) => {
                                for event in events {
                                    act.publish(event);
                                }
                                CancelAnswer::Journaled
                            }
                            Err(e) => CancelAnswer::Unavailable(format!(
                                "the journal could not be written: {e}"
                            )),
                        }),
                )
            }
        }
    }
}

impl Handler<RunProblems> for Supervisor {
    type Result = MessageResult<RunProblems>;

    fn handle(&mut self, _: RunProblems, _: &mut Context<Self>) -> Self::Result {
        MessageResult(
            self.runs
                .iter()
                .filter_map(|(run, e)| e.problem.clone().map(|p| (*run, p)))
                .collect(),
        )
    }
}

impl Handler<GetRunMembers> for Supervisor {
    type Result = Option<RunMembers>;

    fn handle(&mut self, GetRunMembers(run): GetRunMembers, _: &mut Context<Self>) -> Self::Result {
        match self.runs.get(&run).map(|e| &e.life) {
            Some(Life::Live(members)) => Some(members.clone()),
            _ => None,
        }
    }
}

/// The threads of runs (ADR-014): of live runs, and of finished runs whose actors are
/// still stopping. For tests and diagnostics.
#[derive(Message)]
#[rtype(result = "RunThreadCount")]
pub struct RunThreads;

#[derive(Debug, Clone, Copy, PartialEq, Eq, MessageResponse)]
pub struct RunThreadCount {
    pub live: usize,
    pub retiring: usize,
}

impl Handler<RunThreads> for Supervisor {
    type Result = RunThreadCount;

    fn handle(&mut self, _: RunThreads, _: &mut Context<Self>) -> Self::Result {
        RunThreadCount {
            live: self.runs.values().filter(|e| e.thread.is_some()).count(),
            retiring: self.retiring.len(),
        }
    }
}

impl Handler<Published> for Supervisor {
    type Result = ();

    fn handle(&mut self, Published(event): Published, ctx: &mut Context<Self>) {
        if let (0, EventKind::ProviderPaused { .. }) = (event.seq, &event.kind)
            && self.journal_provider_pause(&event, ctx)
        {
            return; // said by the journaled event
        }
        if let (0, EventKind::StorageUnavailable { error, .. }) = (event.seq, &event.kind) {
            self.storage_pause(event.run, error.clone(), ctx);
        }
        self.publish(event);
    }
}

/// First wait before looking whether storage that refused a write takes writes again;
/// doubles up to [`STORAGE_RETRY_MAX`].
const STORAGE_RETRY_FIRST: Duration = Duration::from_secs(1);
const STORAGE_RETRY_MAX: Duration = Duration::from_secs(60);

impl Supervisor {
    /// flotilla's own storage refused a write for a live run (a worktree or a scratch
    /// checkout: disk full, read-only; ADR-024): the run pauses as for an unwritable
    /// journal. Its actors stop (attempts in flight are interrupted at the restart, never
    /// charged), `status` says why, and once a test write under the run's directory goes
    /// through the run is restarted from its journal.
    fn storage_pause(&mut self, run: RunId, error: String, ctx: &mut Context<Self>) {
        let Some(entry) = self.runs.get_mut(&run) else {
            return;
        };
        let Life::Live(members) = &entry.life else {
            return; // already paused (or restarting)
        };
        members.stop_all();
        entry.life = Life::Restarting;
        let problem = format!("flotilla's storage refused a write: {error}");
        warn!(%run, %problem, "run paused");
        entry.problem = Some(RunProblem::Paused(problem));
        self.retry_storage_later(run, ctx);
    }

    fn retry_storage_later(&mut self, run: RunId, ctx: &mut Context<Self>) {
        let Some(entry) = self.runs.get_mut(&run) else {
            return;
        };
        let delay = STORAGE_RETRY_FIRST
            .saturating_mul(1u32 << entry.storage_pauses.min(16))
            .min(STORAGE_RETRY_MAX);
        entry.storage_pauses = entry.storage_pauses.saturating_add(1);
        let probe = self.worktrees.join(run.to_string());
        ctx.run_later(delay, move |act, ctx| {
            let write = tokio::task::spawn_blocking(move || storage_takes_writes(&probe));
            ctx.spawn(write.into_actor(act).map(move |result, act, ctx| {
                let error = match result {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(e) => Some(e.to_string()),
                };
                match error {
                    None => {
                        info!(%run, "flotilla's storage takes writes again: the run resumes");
                        if let Some(entry) = act.runs.get_mut(&run) {
                            entry.problem = None;
                        }
                        act.restart(run, ctx);
                    }
                    Some(e) => {
                        warn!(%run, error = %e, "flotilla's storage still refuses writes");
                        if let Some(entry) = act.runs.get_mut(&run) {
                            entry.problem = Some(RunProblem::Paused(format!(
                                "flotilla's storage refused a write: {e}"
                            )));
                        }
                        act.retry_storage_later(run, ctx);
                    }
                }
            }));
        });
    }
}

/// Whether a file can be written (and synced) under `dir`: what a worktree or a scratch
/// checkout needs first. The file is removed after.
fn storage_takes_writes(dir: &std::path::Path) -> std::io::Result<()> {
    use std::io::Write as _;
    std::fs::create_dir_all(dir)?;
    let probe = dir.join(".flotilla-storage-probe");
    let written = std::fs::File::create(&probe).and_then(|mut f| {
        f.write_all(&[0u8; 4096])?;
        f.sync_all()
    });
    let _ = std::fs::remove_file(&probe);
    written
}

/// A journaled pause is said again only when a new one reaches this much further.
const PAUSE_EXTENSION_SAID_MS: u64 = 1_000;

impl Supervisor {
    /// A provider's long rate-limit pause (a live notice from a call) is journaled as
    /// `ProviderPauseStarted`, so that `status` shows it while it lasts, once per pause
    /// (calls of every role hear the same one), and again only when it reaches further;
    /// `ProviderResumed` is journaled when it is over (ADR-024). Whether it is journaled.
    fn journal_provider_pause(&mut self, notice: &Event, ctx: &mut Context<Self>) -> bool {
        let EventKind::ProviderPaused {
            role,
            task,
            provider,
            wait_ms,
        } = &notice.kind
        else {
            return false;
        };
        let run = notice.run;
        let Some(entry) = self.runs.get_mut(&run) else {
            return false;
        };
        if !matches!(entry.life, Life::Live(_)) {
            return false;
        }
        let until_ms = notice.at_ms.saturating_add(*wait_ms);
        let known = entry.provider_pauses.get(provider).copied().unwrap_or(0);
        if until_ms <= known.saturating_add(PAUSE_EXTENSION_SAID_MS) {
            return false;
        }
        entry.provider_pauses.insert(provider.clone(), until_ms);
        let started = EventKind::ProviderPauseStarted {
            provider: provider.clone(),
            role: *role,
            task: task.clone(),
            until_ms,
            why: "rate limited: the provider answered 429 and asked to wait".into(),
        };
        self.record(run, started, ctx, |_, _| {});
        self.resume_provider_at(run, provider.clone(), until_ms, ctx);
        true
    }

    /// At `until_ms`, journals that `provider`'s pause is over, unless a longer one was
    /// journaled since (its own timer says it) or the run ended.
    fn resume_provider_at(
        &self,
        run: RunId,
        provider: String,
        until_ms: u64,
        ctx: &mut Context<Self>,
    ) {
        let wait = Duration::from_millis(until_ms.saturating_sub(self.clock.now_ms()));
        ctx.run_later(wait, move |act, ctx| {
            let Some(entry) = act.runs.get_mut(&run) else {
                return;
            };
            if entry.provider_pauses.get(&provider) != Some(&until_ms) {
                return;
            }
            entry.provider_pauses.remove(&provider);
            act.record(run, EventKind::ProviderResumed { provider }, ctx, |_, _| {});
        });
    }

    /// The pauses a run's journal has open (a daemon stopped during one): their ends are
    /// journaled when due, at once if past.
    fn resume_journaled_pauses(&mut self, run: RunId, journal: &[Event], ctx: &mut Context<Self>) {
        let mut open: HashMap<String, u64> = HashMap::new();
        for e in journal {
            match &e.kind {
                EventKind::ProviderPauseStarted {
                    provider, until_ms, ..
                } => {
                    open.insert(provider.clone(), *until_ms);
                }
                EventKind::ProviderResumed { provider } => {
                    open.remove(provider);
                }
                _ => {}
            }
        }
        let Some(entry) = self.runs.get_mut(&run) else {
            return;
        };
        entry.provider_pauses.extend(open.clone());
        for (provider, until_ms) in open {
            self.resume_provider_at(run, provider, until_ms, ctx);
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
    pub task: TaskId,
    pub decision: UserDecision,
}

impl Handler<DecideTask> for Supervisor {
    type Result = bool;

    fn handle(&mut self, msg: DecideTask, _: &mut Context<Self>) -> bool {
        match self.runs.get(&msg.run).map(|e| &e.life) {
            Some(Life::Live(members)) => {
                members.task_graph.do_send(ToTaskGraph::UserDecision {
                    task: msg.task,
                    decision: msg.decision,
                });
                true
            }
            _ => false,
        }
    }
}

/// The user adopts main as it is for a run whose landing paused because main diverged
/// (`flotilla decide RUN --adopt-main`, ADR-024), forwarded to the run's TaskGraph, which
/// checks it and journals what it does. Answers false if the run is not live here.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct AdoptMain {
    pub run: RunId,
}

impl Handler<AdoptMain> for Supervisor {
    type Result = bool;

    fn handle(&mut self, msg: AdoptMain, _: &mut Context<Self>) -> bool {
        match self.runs.get(&msg.run).map(|e| &e.life) {
            Some(Life::Live(members)) => {
                members.task_graph.do_send(ToTaskGraph::AdoptMain);
                true
            }
            _ => false,
        }
    }
}

/// Removes what finished runs left (ADR-021, "Nothing left behind"): in each repository,
/// their stale ref locks, attempt worktrees and task branches (found by name, whatever a
/// crash left), and under the state directory their run directories, plus directories no
/// run of the journal accounts for. Runs that are live or unfinished are never touched
/// (their own sweeps collect at restart and at their end). With `dry_run`, only says what
/// it would remove: the same list a collection then removes, when nothing changed between.
/// Also heals the checkouts of main of every repository the journal knows (not in a dry
/// run). `progress`: log each repository as it is done (the daemon's start-up collection).
#[derive(Debug, Message)]
#[rtype(result = "Result<GcReport, String>")]
pub struct CollectGarbage {
    pub dry_run: bool,
    pub progress: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GcReport {
    /// Worktrees removed (or, in a dry run, that would be): attempt worktrees and the
    /// other directories of finished runs (their scratch checkouts).
    pub worktrees: Vec<String>,
    /// Task branches of finished runs deleted.
    pub branches: Vec<String>,
    /// Stale ref locks (`.git/refs/heads/flotilla/<run>/….lock`) removed.
    #[serde(default)]
    pub locks: Vec<String>,
    /// Directories of runs the journal does not know (or whose repository is gone),
    /// removed whole.
    pub unknown: Vec<String>,
    /// Runs whose leftovers could not be removed, and why (the rest were).
    pub errors: Vec<String>,
    pub dry_run: bool,
}

/// A directory under the worktrees root that no run of the journal accounts for is only
/// removed once its run id (a UUIDv7, a timestamp first) is this old: a run being
/// submitted right now has an id, and soon a directory, before the journal lists it.
const UNKNOWN_RUN_MIN_AGE_MS: u64 = 10 * 60 * 1000;

/// Not atomic: the collection works on a snapshot (the runs live and the runs finished
/// when it started) and runs off the Supervisor, so runs start and end meanwhile. A run
/// that finishes meanwhile is swept by its own end.
impl Handler<CollectGarbage> for Supervisor {
    type Result = ResponseFuture<Result<GcReport, String>>;

    fn handle(&mut self, msg: CollectGarbage, _: &mut Context<Self>) -> Self::Result {
        let live: HashSet<RunId> = self.runs.keys().copied().collect();
        let records = self.journal.runs();
        let root = self.worktrees.clone();
        Box::pin(async move {
            let records = records
                .await
                .map_err(|e| format!("cannot read the runs: {e}"))?;
            collect_garbage(live, records, root, msg).await
        })
    }
}

async fn collect_garbage(
    live: HashSet<RunId>,
    records: Vec<crate::journal::RunRecord>,
    root: PathBuf,
    msg: CollectGarbage,
) -> Result<GcReport, String> {
    let started_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let known: HashMap<RunId, &crate::journal::RunRecord> =
        records.iter().map(|r| (r.id, r)).collect();
    let over: HashSet<RunId> = records
        .iter()
        .filter(|r| r.outcome.is_some() && !live.contains(&r.id))
        .map(|r| r.id)
        .collect();
    let mut repos: Vec<PathBuf> = records.iter().map(|r| r.repo.clone()).collect();
    repos.sort();
    repos.dedup();
    // The branches each repository's runs land on (ADR-022): their checkouts are healed.
    let mut targets: HashMap<&std::path::Path, std::collections::BTreeSet<TargetBranch>> =
        HashMap::new();
    for record in &records {
        let branch = record
            .config
            .pointer("/merge/branch")
            .and_then(|b| b.as_str());
        if let Ok(target) = TargetBranch::of_run(branch) {
            targets.entry(&record.repo).or_default().insert(target);
        }
    }
    let mut report = GcReport {
        dry_run: msg.dry_run,
        ..GcReport::default()
    };
    if msg.progress {
        info!(
            finished_runs = over.len(),
            repositories = repos.len(),
            "collecting what finished runs left behind"
        );
    }
    // Repository by repository: locks, worktrees, branches of the finished runs.
    let mut gone: HashSet<PathBuf> = HashSet::new();
    // Repositories whose leftovers could not be read or removed: their runs' directories
    // stay until a collection succeeds (a worktree's directory goes with its record).
    let mut failed: HashSet<PathBuf> = HashSet::new();
    let mut planned_dirs: HashSet<PathBuf> = HashSet::new();
    for (done, repo) in repos.iter().enumerate() {
        let over = over.clone();
        let (path, root_dir, dry_run) = (repo.clone(), root.clone(), msg.dry_run);
        let found = tokio::task::spawn_blocking(move || {
            let found = crate::git::leftovers::leftovers(&path, &root_dir, &over)?;
            if dry_run {
                Ok(found)
            } else {
                crate::git::leftovers::remove_leftovers(&path, &found)
            }
        })
        .await
        .map_err(|e| format!("the git thread failed: {e}"))?;
        let found = match found {
            Ok(found) => found,
            Err(RepoError::NotARepository(_)) => {
                gone.insert(repo.clone());
                continue;
            }
            Err(e) => {
                report.errors.push(format!("{}: {e}", repo.display()));
                failed.insert(repo.clone());
                continue;
            }
        };
        if !msg.dry_run {
            for target in targets.get(repo.as_path()).into_iter().flatten() {
                match crate::git::checkout::heal_repository(repo.clone(), target.clone()).await {
                    Ok(Some(CheckoutSync::Behind { at, paths })) => warn!(
                        repo = %repo.display(), %target, %at, ?paths,
                        "the checkout of the target branch is behind it with changes of its own: left as it is"
                    ),
                    Ok(_) => {}
                    Err(e) => report.errors.push(format!(
                        "{}: healing the checkout of {target}: {e}",
                        repo.display()
                    )),
                }
            }
        }
        if msg.progress && !found.is_empty() {
            info!(
                repo = %repo.display(),
                done = done + 1,
                of = repos.len(),
                worktrees = found.worktrees.len(),
                branches = found.branches.len(),
                locks = found.locks.len(),
                "collected a repository's leftovers"
            );
        }
        for (_, path) in found.worktrees {
            planned_dirs.insert(path.clone());
            report.worktrees.push(path.display().to_string());
        }
        report.branches.extend(found.branches);
        report
            .locks
            .extend(found.locks.iter().map(|p| p.display().to_string()));
    }
    // The state directory: finished runs' directories (what is left in them), and
    // directories no run accounts for.
    let Ok(mut entries) = tokio::fs::read_dir(&root).await else {
        return Ok(report); // nothing was ever made
    };
    let mut doomed: Vec<PathBuf> = Vec::new();
    while let Ok(Some(entry)) = entries.next_entry().await {
        let dir = entry.path();
        let uuid = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<uuid::Uuid>().ok());
        let run = uuid.map(RunId::from_uuid);
        match run.and_then(|run| known.get(&run)) {
            Some(record) if failed.contains(&record.repo) => {}
            Some(record) if over.contains(&record.id) && !gone.contains(&record.repo) => {
                if let Ok(mut inside) = tokio::fs::read_dir(&dir).await {
                    while let Ok(Some(item)) = inside.next_entry().await {
                        if !planned_dirs.contains(&item.path()) {
                            report.worktrees.push(item.path().display().to_string());
                        }
                    }
                }
                doomed.push(dir);
            }
            Some(record) if over.contains(&record.id) => {
                report.unknown.push(dir.display().to_string());
                doomed.push(dir);
            }
            Some(_) => {} // live, unfinished, or its repository failed
            None => {
                let created_ms = uuid
                    .and_then(|u| u.get_timestamp())
                    .map(|t| {
                        let (secs, nanos) = t.to_unix();
                        secs * 1000 + u64::from(nanos) / 1_000_000
                    })
                    .unwrap_or(0);
                if started_ms.saturating_sub(created_ms) >= UNKNOWN_RUN_MIN_AGE_MS {
                    report.unknown.push(dir.display().to_string());
                    doomed.push(dir);
                }
            }
        }
    }
    if !msg.dry_run {
        for dir in doomed {
            match tokio::fs::remove_dir_all(&dir).await {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    report.errors.push(format!("{}: {e}", dir.display()))
                }
                _ => {}
            }
        }
    }
    report.worktrees.sort();
    report.worktrees.dedup();
    report.unknown.sort();
    if msg.progress {
        info!(
            worktrees = report.worktrees.len(),
            branches = report.branches.len(),
            locks = report.locks.len(),
            unknown = report.unknown.len(),
            errors = report.errors.len(),
            "collection done"
        );
    }
    Ok(report)
}
