//! The composition root of a run: builds the run's seven actors (TaskGraph, Dispatch,
//! Planner, Subplanner, WorkerPool, MergeQueue, Reconciler) with their ports on git2, the
//! sandboxed process runner and the run's agents and LLMs, wires their addresses into each
//! other, and starts them all on the run's own thread (ADR-014). What the journal says they
//! resume from comes in as a [`RunRecovery`]; when they are started and who watches them is
//! the Supervisor's (`lifecycle.rs`). It must not know the Supervisor's state or the journal.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use flotilla_actors::actors::worker::review::Reviewer;
use flotilla_actors::actors::{
    AgentSet, Dispatch, FixWriter, MergeKit, MergeQueue, Planner, Reconciler, ReconcilerKit,
    Subplanner, TaskGraph, WorkerKit, WorkerPool,
};
use flotilla_actors::graph::RunGraph;
use flotilla_actors::ports::{Agent, Journal, Llm, ProcessRunner, Sandbox, SweepKeep, Transcripts};
use flotilla_actors::protocol::{Published, Role, RunId, ToPlanner};
use flotilla_actors::recovery::RunRecovery;
use flotilla_actors::supervision::Lifeline;
use tracing::warn;

use super::{Member, RunMembers, StartError};
use crate::agents::builtin::BuiltinAgent;
use crate::agents::command::CommandAgent;
use crate::config::RunConfig;
use crate::daemon_mark::DaemonMark;
use crate::git::merge::GitMerge;
use crate::git::reader::GitRepo;
use crate::git::target::TargetBranch;
use crate::git::worktrees::{GitWorktrees, SCRATCH_DIR};
use crate::process::ConfinedRunner;
use crate::prompts;
use crate::providers::ProviderRegistry;
use crate::sandbox::SandboxPolicy;
use crate::scripted::{ScriptedAgent, ScriptedLlm};

/// Starting an actor on a given thread (an arbiter): a run's actors live on the run's own.
trait StartOn: Actor<Context = Context<Self>> + Send + Sized {
    fn start_on(self, thread: &ArbiterHandle) -> Addr<Self> {
        Self::start_in_arbiter(thread, move |_| self)
    }
}

impl<A: Actor<Context = Context<A>> + Send> StartOn for A {}

/// What the daemon gives every run: shared endpoints, where things live, what is hidden.
pub(super) struct Daemon<'a> {
    /// What the run's actors append through.
    pub journal: Arc<dyn Journal>,
    pub providers: &'a ProviderRegistry,
    /// Runs' attempt worktrees live below it, one directory per run.
    pub worktrees: &'a Path,
    /// What no command of a run may see (ADR-015).
    pub daemon_paths: &'a [PathBuf],
    /// What every command of the run carries (`process::left_behind`).
    pub mark: Option<&'a DaemonMark>,
    /// Where the run's actors send live notices (the Supervisor).
    pub notices: Recipient<Published>,
    /// Where attempts' transcripts go (ADR-036).
    pub transcripts: Transcripts,
}

/// One run to start: what it is, what its journal replays to, and what it resumes.
pub(super) struct Run<'a> {
    pub run: RunId,
    pub request: String,
    pub repo: &'a Path,
    pub config: &'a RunConfig,
    pub target: TargetBranch,
    pub graph: RunGraph,
    pub recovered: RunRecovery,
}

/// Builds the run's actors and starts them on `thread`, each watched through the lifeline
/// `lifeline` makes for it. A run whose checks do not compile is not started.
pub(super) fn start_run(
    daemon: Daemon<'_>,
    run: Run<'_>,
    thread: &ArbiterHandle,
    lifeline: impl Fn(Member) -> Lifeline,
) -> Result<RunMembers, StartError> {
    let Run {
        run,
        request,
        repo: entry_repo,
        config,
        target,
        graph: graph_state,
        recovered,
    } = run;
    let planner_calls = graph_state.planner_calls();
    // Roles with models in [roles] call them (through the daemon's shared endpoints);
    // the others replay the scenario.
    let scripted: Arc<dyn Llm> = Arc::new(ScriptedLlm::new(config.scenario.clone()));
    let llm: Arc<dyn Llm> = Arc::new(daemon.providers.llm_for(&config.models, Some(scripted)));
    // One sandbox policy for every command of the run: agents, verification, the merge
    // gate and the Reconciler's sweeps (ADR-015).
    let mut policy = SandboxPolicy::for_run(&config.sandbox, daemon.daemon_paths, entry_repo);
    if let Some(mark) = daemon.mark {
        policy = policy.marked(mark.clone());
    }
    let runner: Arc<dyn ProcessRunner> = Arc::new(ConfinedRunner::new(policy.clone()));
    let agents = agent_set(config, llm.clone(), runner.clone(), &policy);
    let checks = config
        .checks
        .compile()
        .map_err(StartError::Checks)?
        .protecting(config.protected_paths(entry_repo));
    let repo = Arc::new(GitRepo::new(entry_repo.to_path_buf(), target.clone()));
    let run_dir = daemon.worktrees.join(run.to_string());
    let kit = WorkerKit {
        agents,
        // Under bwrap no process outlives its command (its pid namespace): a seal's walk
        // may stand for the next reset's (ADR-046).
        worktrees: Arc::new(
            GitWorktrees::new(
                entry_repo.to_path_buf(),
                run,
                run_dir.clone(),
                target.clone(),
            )
            .trusting_seals(
                policy.mode == crate::sandbox::SandboxMode::Bwrap,
                crate::process::every_end_seen,
            ),
        ),
        runner: runner.clone(),
        checks: Arc::new(checks),
        notices: Some(daemon.notices.clone()),
        keep_failed: config.worktrees.keep_failed,
        retry_in_place: config.worktrees.retry_in_place,
        transcripts: daemon.transcripts.clone(),
        // Off unless `[reviewer] enabled` (ADR-038): then no work lands unreviewed.
        reviewer: config.reviewer.enabled.then(|| {
            Arc::new(Reviewer {
                llm: llm.clone(),
                system: prompts::for_role(Role::Reviewer, &config.prompts, &config.limits),
                config: config.reviewer.clone(),
                // Its tools read the sealed branch's commit in the same repository.
                reader: Some(repo.clone()),
            })
        }),
    };

    // The TaskGraph's address is needed before the actor exists (its collaborators hold
    // it): its mailbox is made here, and the actor is started on that mailbox, on the
    // run's thread, once built (a Context cannot cross threads; its mailbox can).
    let (graph_sender, graph_mailbox) = actix::dev::channel::channel::<TaskGraph>(16);
    let graph_addr = Addr::new(graph_sender);
    // Parents waiting for their subtasks keep the worktree their synthesis runs in; what
    // the journal says was delivered keeps its branch, any other branch of the run goes.
    let mut keep_worktrees = recovered.synthesizing;
    if config.worktrees.keep_failed {
        keep_worktrees.extend(recovered.failed_attempts);
    }
    let workers = WorkerPool::new(
        run,
        kit,
        graph_addr.clone().recipient(),
        Duration::from_millis(config.limits.default_budget.wall_time_ms.max(1)),
    )
    .keeping(SweepKeep {
        worktrees: keep_worktrees,
        delivered: Some(recovered.delivered),
        // The failed attempts a pending retry continues from (ADR-031).
        branches: if config.worktrees.retry_in_place {
            recovered.continued
        } else {
            Vec::new()
        },
        closing: false,
    })
    .watched(lifeline(Member::Workers))
    .start_on(thread);
    let subplanner = Subplanner::new(
        run,
        prompts::for_role(Role::Subplanner, &config.prompts, &config.limits),
        llm.clone(),
        graph_addr.clone().recipient(),
        config.limits.clone(),
        config.subplanner.clone(),
    )
    .with_repo(repo.clone())
    .with_notices(daemon.notices.clone())
    .resuming(recovered.subplanner_conversations)
    .resuming_tools(&recovered.tool_rounds)
    .watched(lifeline(Member::Subplanner))
    .start_on(thread);
    let dispatch = Dispatch::new(
        run,
        config.limits.clone(),
        config.profiles(),
        graph_addr.clone().recipient(),
        workers.clone().recipient(),
        subplanner.clone().recipient(),
    )
    .watched(lifeline(Member::Dispatch))
    .start_on(thread);
    // The `reconciler` role's model words fix tasks only when [roles] names one (ADR-032);
    // otherwise flotilla's own wording stands and no scripted answer is asked for.
    let fix_writer = config
        .models
        .roles
        .get(Role::Reconciler)
        .is_some()
        .then(|| FixWriter {
            llm: llm.clone(),
            system: prompts::for_role(Role::Reconciler, &config.prompts, &config.limits),
        });
    let planner = Planner::new(
        run,
        request,
        prompts::for_role(Role::Planner, &config.prompts, &config.limits),
        llm,
        graph_addr.clone().recipient(),
        config.planner.clone(),
    )
    .with_repo(repo.clone())
    .with_notices(daemon.notices.clone())
    .with_graph_view(graph_addr.clone().recipient())
    .resuming(recovered.conversation)
    .resuming_tools(&recovered.tool_rounds)
    .watched(lifeline(Member::Planner))
    .start_on(thread);
    let merge_git = GitMerge::new(entry_repo.to_path_buf(), run_dir.join(SCRATCH_DIR), target);
    // The gate and the sweeps in the repository's warm trees unless the run said otherwise
    // (ADR-042, ADR-055): beside the run's directory, kept for the repository's next run.
    let merge_git = Arc::new(match (config.merge.warm_gate, run_dir.parent()) {
        (true, Some(worktrees)) => {
            merge_git.with_repository_warm(worktrees, config.merge.warm_budget_mb)
        }
        (true, None) => merge_git.with_warm(config.merge.warm_budget_mb),
        (false, _) => merge_git,
    });
    let reconciler = Reconciler::new(
        run,
        ReconcilerKit {
            git: merge_git.clone(),
            reader: repo.clone(),
            runner: runner.clone(),
            config: config.reconciler.clone(),
            max_fixes: config.limits.max_fix_tasks_per_sweep as usize,
        },
        graph_addr.clone().recipient(),
    );
    let reconciler = match fix_writer {
        Some(writer) => reconciler.with_writer(writer),
        None => reconciler,
    }
    .watched(lifeline(Member::Reconciler))
    .start_on(thread);
    let merge_queue = MergeQueue::new(
        run,
        MergeKit {
            git: merge_git,
            main: repo.clone(),
            reader: repo,
            runner,
            config: config.merge.clone(),
            retry_in_place: config.worktrees.retry_in_place,
        },
        graph_addr.clone().recipient(),
        graph_addr.clone().recipient(),
    )
    .with_written(graph_state.main_tip())
    .with_dropped(graph_state.dropped_commits().to_vec())
    .with_notices(daemon.notices.clone())
    .with_reconciler(reconciler.clone().recipient())
    .with_planner(planner.clone().recipient())
    .watched(lifeline(Member::MergeQueue))
    .start_on(thread);
    let mut task_graph = TaskGraph::new(
        run,
        graph_state,
        daemon.journal,
        dispatch.clone().recipient(),
        Some(daemon.notices),
    )
    .with_planner(planner.clone().recipient())
    .with_default_agent(workers.clone().recipient())
    .with_subplanner(subplanner.clone().recipient())
    .with_merging(
        merge_queue.clone().recipient(),
        reconciler.clone().recipient(),
    )
    .watched(lifeline(Member::TaskGraph));
    if let Some(resume) = recovered.resume {
        task_graph = task_graph.resuming(resume);
    }
    thread.spawn_fn(move || {
        Context::with_receiver(graph_mailbox).run(task_graph);
    });
    if planner_calls == 0 {
        planner.do_send(ToPlanner::Start);
    }
    Ok(RunMembers {
        task_graph: graph_addr,
        dispatch,
        planner,
        subplanner,
        workers,
        merge_queue,
        reconciler,
    })
}

/// The run's agents by worker profile: `scripted`, `builtin` (on the worker role's model),
/// or, for a profile that names none, the built-in agent when `[roles]` gives the worker
/// role a model and the scripted agent otherwise. Each agent's worker prompt says what its
/// commands get of the sandbox and the network under `policy` (ADR-032).
fn agent_set(
    config: &RunConfig,
    llm: Arc<dyn Llm>,
    runner: Arc<dyn ProcessRunner>,
    policy: &SandboxPolicy,
) -> AgentSet {
    let worker_prompt = |asks: Sandbox| {
        let sandbox = policy.for_agent(asks == Sandbox::Network);
        prompts::for_worker(&config.prompts, &config.limits, &sandbox)
    };
    let scripted: Arc<dyn Agent> = Arc::new(ScriptedAgent::with_runner(
        config.scenario.clone(),
        runner.clone(),
    ));
    let builtin: Arc<dyn Agent> = Arc::new(BuiltinAgent::new(
        llm,
        runner.clone(),
        worker_prompt(config.builtin_agent.sandbox),
        config.builtin_agent.clone(),
    ));
    let worker_has_model = config.models.roles.get(Role::Worker).is_some();
    let default = if worker_has_model {
        builtin.clone()
    } else {
        scripted.clone()
    };
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
                    worker_prompt(cfg.sandbox),
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
