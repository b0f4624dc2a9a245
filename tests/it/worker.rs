//! The WorkerPool and its per-attempt Workers: the scripted agent (or a hand-written one),
//! and a probe in place of the TaskGraph.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use actix::prelude::*;
use flotilla::scripted::{AgentCall, Scenario, ScriptedAgent};
use flotilla_actors::actors::WorkerPool;
use flotilla_actors::ports::{
    Agent, AgentError, AgentReport, AgentSession, AttemptContext, Workspace,
};
use flotilla_actors::protocol::*;
use futures::future::BoxFuture;

use crate::harness::*;
use crate::scratch_kit::scratch_kit;

struct Pool {
    addr: Addr<WorkerPool>,
    agent: Arc<ScriptedAgent>,
    graph: Inbox<ToTaskGraph>,
    workspaces: tempfile::TempDir,
}

fn start(scenario: &str) -> Pool {
    virtual_time();
    let agent = Arc::new(ScriptedAgent::new(Scenario::from_toml(scenario).unwrap()));
    let (graph, inbox) = probe::<ToTaskGraph>("task graph");
    let workspaces = tempfile::tempdir().unwrap();
    let addr = WorkerPool::new(
        RunId::generate(),
        scratch_kit(agent.clone(), workspaces.path()),
        graph,
        Duration::from_secs(60),
    )
    .start();
    Pool {
        addr,
        agent,
        graph: inbox,
        workspaces,
    }
}

fn assign(id: &str, attempt: u32, wall_ms: u64) -> ToAgent {
    let mut task = ready(id, spec("work", &["a.rs"]), 1, 1);
    task.attempt = attempt;
    task.budget = Budget::new(1_000_000, Usd::ZERO, wall_ms);
    ToAgent::Assign(Assignment {
        run: RunId::generate(),
        task,
        profile: "general".into(),
        route: Route::Worker,
        branch: "b".into(),
    })
}

/// Skips spend reports: they may come at any point of an attempt.
async fn next(graph: &mut Inbox<ToTaskGraph>) -> ToTaskGraph {
    loop {
        match graph.expect().await {
            ToTaskGraph::SpendReported { .. } => continue,
            other => return other,
        }
    }
}

#[actix::test]
async fn reports_start_then_completion_with_the_ids_it_was_given() {
    let mut pool = start("[tasks.t1]\nsummary = \"lexer written\"\nconcerns = [\"no unicode\"]\n");
    pool.addr.do_send(assign("t1", 1, 60_000));
    assert!(
        matches!(next(&mut pool.graph).await, ToTaskGraph::TaskStarted { task, attempt: 1 } if task == self::task("t1"))
    );
    match next(&mut pool.graph).await {
        ToTaskGraph::TaskCompleted(c) => {
            assert_eq!((c.task.clone(), c.attempt), (task("t1"), 1));
            let h = c.handoff.unwrap();
            assert_eq!(
                (h.summary.as_str(), h.concerns.clone()),
                ("lexer written", vec!["no unicode".to_string()])
            );
        }
        other => panic!("expected TaskCompleted, got {other:?}"),
    }
}

#[actix::test]
async fn spend_is_reported_while_the_attempt_runs_with_the_ids_it_was_given() {
    let mut pool = start("[tasks.t1]\ntokens = 4242\ndelay_ms = 1000\n");
    pool.addr.do_send(assign("t1", 2, 60_000));
    let spent = pool
        .graph
        .fish_for("SpendReported", |m| match m {
            ToTaskGraph::SpendReported {
                task,
                attempt,
                spent,
            } => Some((task.clone(), *attempt, spent.tokens)),
            _ => None,
        })
        .await;
    assert_eq!(spent, (task("t1"), 2, 4242));
    // Reported before the work ended, not with it.
    assert!(matches!(
        next(&mut pool.graph).await,
        ToTaskGraph::TaskCompleted(_)
    ));
}

#[actix::test]
async fn a_hung_agent_fails_at_the_wall_time_budget_and_a_crash_is_a_typed_failure() {
    let mut pool = start("[tasks.t1]\noutcome = \"hang\"\n[tasks.t2]\noutcome = \"crash\"\n");
    pool.addr.do_send(assign("t1", 1, 5_000));
    pool.addr.do_send(assign("t2", 1, 5_000));
    let mut failures = Vec::new();
    while failures.len() < 2 {
        if let ToTaskGraph::TaskFailed { task, failure, .. } = next(&mut pool.graph).await {
            failures.push((task.to_string(), failure));
        }
    }
    failures.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        failures[0],
        ("t1".into(), AttemptFailure::TimedOut { limit_ms: 5_000 })
    );
    assert!(
        matches!(&failures[1].1, AttemptFailure::Crashed { detail } if detail.contains("scripted crash of t2")),
        "{failures:?}"
    );
}

#[actix::test]
async fn a_panic_in_one_agent_call_fails_only_its_own_attempt() {
    let mut pool = start("[tasks.t1]\noutcome = \"panic\"\n[tasks.t2]\ndelay_ms = 2000\n");
    pool.addr.do_send(assign("t2", 1, 60_000));
    pool.addr.do_send(assign("t1", 1, 60_000));
    let died = pool
        .graph
        .fish_for("t1's failure", |m| match m {
            ToTaskGraph::TaskFailed {
                task,
                attempt,
                failure,
            } if task.to_string() == "t1" => Some((*attempt, failure.clone())),
            _ => None,
        })
        .await;
    assert!(
        matches!(&died, (1, AttemptFailure::RunnerDied { .. })),
        "{died:?}"
    );
    // The other attempt, on the same pool, is untouched and completes.
    let done = pool
        .graph
        .fish_for("t2's completion", |m| match m {
            ToTaskGraph::TaskCompleted(c) => Some(c.task.clone()),
            _ => None,
        })
        .await;
    assert_eq!(done, task("t2"));
    assert!(pool.addr.connected(), "the pool survives a worker's panic");
}

#[actix::test]
async fn a_rejected_subplan_goes_back_to_the_agent_and_cancel_drops_the_work() {
    let scenario = r#"
        [tasks.t1]
        outcome = "subplan"
        [tasks.t1.subplan]
        subtasks = [{ description = "x", scope = ["a.rs"] }]
        [tasks.t1.on_rejection]
        summary = "did it in one go"
        [tasks.t2]
        delay_ms = 10000
    "#;
    let mut pool = start(scenario);
    pool.addr.do_send(assign("t1", 1, 60_000));
    let proposal = pool
        .graph
        .fish_for("TaskCompleted", |m| match m {
            ToTaskGraph::TaskCompleted(c) => Some(c.subplan.clone()),
            _ => None,
        })
        .await;
    assert_eq!(proposal.unwrap().parent, task("t1"));
    pool.addr
        .do_send(ToAgent::DecompositionRejected(TaskDecompositionRejected {
            parent: task("t1"),
            reason: RejectionReason::NoSubtasks,
        }));
    let revised = pool
        .graph
        .fish_for("revised report", |m| match m {
            ToTaskGraph::TaskCompleted(c) => c.handoff.clone(),
            _ => None,
        })
        .await;
    assert_eq!(revised.summary, "did it in one go");
    assert!(pool.agent.calls().contains(&AgentCall::Revise {
        task: task("t1"),
        reason: RejectionReason::NoSubtasks
    }));

    pool.addr.do_send(assign("t2", 1, 60_000));
    assert!(matches!(
        next(&mut pool.graph).await,
        ToTaskGraph::TaskStarted { .. }
    ));
    pool.addr.do_send(ToAgent::Cancel {
        task: task("t2"),
        reason: "user".into(),
    });
    tokio::time::sleep(Duration::from_secs(20)).await;
    let late: Vec<_> = pool
        .graph
        .drain()
        .into_iter()
        .filter(|m| !matches!(m, ToTaskGraph::SpendReported { .. }))
        .collect();
    assert!(late.is_empty(), "nothing after a cancel: {late:?}");
}

#[actix::test]
async fn each_attempt_works_in_its_own_scratch_workspace_which_is_removed_after() {
    let mut pool = start("[tasks.t1]\n");
    pool.addr.do_send(assign("t1", 3, 60_000));
    pool.graph
        .fish_for("TaskCompleted", |m| {
            matches!(m, ToTaskGraph::TaskCompleted(_)).then_some(())
        })
        .await;
    let workspace = pool
        .agent
        .calls()
        .into_iter()
        .find_map(|c| match c {
            AgentCall::Run { workspace, .. } => Some(workspace),
            _ => None,
        })
        .unwrap();
    assert_eq!(workspace, pool.workspaces.path().join("t1-a3"));
    wait_until_gone(&workspace).await;
}

/// The workspace is removed as the Worker stops, on a blocking thread: wait for it, bounded.
async fn wait_until_gone(path: &Path) {
    for _ in 0..200 {
        if !path.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} was not removed", path.display());
}

/// An agent that works until it is called off, and says whether it noticed.
struct Obedient {
    noticed: Arc<AtomicBool>,
    workspace: Arc<std::sync::Mutex<Option<PathBuf>>>,
}

impl Agent for Obedient {
    fn open(&self, workspace: Workspace, attempt: AttemptContext) -> Box<dyn AgentSession> {
        *self.workspace.lock().unwrap() = Some(workspace.path);
        Box::new(ObedientSession {
            noticed: self.noticed.clone(),
            attempt,
        })
    }
}

struct ObedientSession {
    noticed: Arc<AtomicBool>,
    attempt: AttemptContext,
}

impl AgentSession for ObedientSession {
    fn run(&mut self, _: Assignment) -> BoxFuture<'static, Result<AgentReport, AgentError>> {
        let noticed = self.noticed.clone();
        let cancel = self.attempt.cancel.clone();
        Box::pin(async move {
            cancel.cancelled().await;
            noticed.store(true, Ordering::SeqCst);
            Err(AgentError::Cancelled)
        })
    }

    fn revise(
        &mut self,
        _: Assignment,
        _: RejectionReason,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>> {
        Box::pin(async { Err(AgentError::Crashed("not asked to revise".into())) })
    }

    fn synthesize(
        &mut self,
        _: TaskId,
        _: Vec<SubtaskResult>,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>> {
        Box::pin(async { Err(AgentError::Crashed("not asked to synthesize".into())) })
    }
}

#[actix::test]
async fn cancel_and_timeout_reach_the_agent_through_its_cancellation_token() {
    virtual_time();
    let noticed = Arc::new(AtomicBool::new(false));
    let agent = Arc::new(Obedient {
        noticed: noticed.clone(),
        workspace: Arc::default(),
    });
    let (graph, mut inbox) = probe::<ToTaskGraph>("task graph");
    let dir = tempfile::tempdir().unwrap();
    let pool = WorkerPool::new(
        RunId::generate(),
        scratch_kit(agent.clone(), dir.path()),
        graph,
        Duration::from_secs(60),
    )
    .start();

    // Cancel: the agent hears of it (it does not just lose its future).
    pool.do_send(assign("t1", 1, 600_000));
    assert!(matches!(
        inbox.expect().await,
        ToTaskGraph::TaskStarted { .. }
    ));
    // Once its worktree is made and the agent is at work.
    for _ in 0..100 {
        if agent.workspace.lock().unwrap().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pool.do_send(ToAgent::Cancel {
        task: task("t1"),
        reason: "user".into(),
    });
    for _ in 0..100 {
        if noticed.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(noticed.load(Ordering::SeqCst), "the agent saw the cancel");

    // Timeout: the worker reports it, and the agent is told to stop too.
    noticed.store(false, Ordering::SeqCst);
    pool.do_send(assign("t2", 1, 1_000));
    let failure = inbox
        .fish_for("t2 timed out", |m| match m {
            ToTaskGraph::TaskFailed { failure, .. } => Some(failure.clone()),
            _ => None,
        })
        .await;
    assert_eq!(failure, AttemptFailure::TimedOut { limit_ms: 1_000 });
    for _ in 0..100 {
        if noticed.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(noticed.load(Ordering::SeqCst), "the agent saw the timeout");
    let workspace = agent.workspace.lock().unwrap().clone().unwrap();
    assert!(workspace.starts_with(dir.path()));
}

fn wall(ms: u64) -> Budget {
    Budget {
        wall_time_ms: ms,
        ..Budget::default()
    }
}

/// Wall time only, `ms` give or take tokio's timer granularity (a timer fires on the next
/// millisecond tick, so a 1500 ms sleep measures 1500 or 1501 ms even in virtual time).
fn about(spent: Budget, ms: u64) -> bool {
    spent.tokens == 0 && spent.cost_usd == Usd::ZERO && (ms..=ms + 1).contains(&spent.wall_time_ms)
}

/// The messages up to and including the first one `last` accepts, spend reports included.
async fn until(
    graph: &mut Inbox<ToTaskGraph>,
    last: impl Fn(&ToTaskGraph) -> bool,
) -> Vec<ToTaskGraph> {
    let mut seen = Vec::new();
    loop {
        let m = graph.expect().await;
        let done = last(&m);
        seen.push(m);
        if done {
            return seen;
        }
    }
}

/// The wall time a run of messages charges, in order of the spend reports.
fn wall_charges(messages: &[ToTaskGraph]) -> Vec<u64> {
    messages
        .iter()
        .filter_map(|m| match m {
            ToTaskGraph::SpendReported { spent, .. } if spent.wall_time_ms > 0 => {
                Some(spent.wall_time_ms)
            }
            _ => None,
        })
        .collect()
}

#[actix::test]
async fn a_timed_out_call_charges_its_wall_time_before_the_failure() {
    let mut pool = start("[tasks.t1]\noutcome = \"hang\"\n");
    pool.addr.do_send(assign("t1", 2, 1_500));
    let seen = until(&mut pool.graph, |m| {
        matches!(m, ToTaskGraph::TaskFailed { .. })
    })
    .await;
    let n = seen.len();
    assert!(n >= 2, "{} messages", n);
    assert!(
        matches!(&seen[n - 2], ToTaskGraph::SpendReported { task: t, attempt: 2, spent }
            if *t == task("t1") && about(*spent, 1_500)),
        "{:?}",
        seen.iter().map(|m| format!("{m:?}")).collect::<Vec<_>>()
    );
    assert!(matches!(
        &seen[n - 1],
        ToTaskGraph::TaskFailed {
            failure: AttemptFailure::TimedOut { limit_ms: 1_500 },
            ..
        }
    ));
    assert_eq!(wall_charges(&seen).len(), 1, "charged once");
}

#[actix::test]
async fn a_completed_call_charges_its_wall_time_before_the_report() {
    let mut pool = start("[tasks.t1]\ntokens = 10\ndelay_ms = 1000\n");
    pool.addr.do_send(assign("t1", 1, 60_000));
    let seen = until(&mut pool.graph, |m| {
        matches!(m, ToTaskGraph::TaskCompleted(_))
    })
    .await;
    let n = seen.len();
    assert!(
        matches!(&seen[n - 2], ToTaskGraph::SpendReported { task: t, attempt: 1, spent }
            if *t == task("t1") && about(*spent, 1_000)),
        "{:?}",
        seen.iter().map(|m| format!("{m:?}")).collect::<Vec<_>>()
    );
    assert_eq!(wall_charges(&seen).len(), 1, "charged once");
}

#[actix::test]
async fn a_cancelled_call_charges_the_time_it_ran_and_reports_nothing_else() {
    let mut pool = start("[tasks.t1]\noutcome = \"hang\"\n");
    pool.addr.do_send(assign("t1", 1, 60_000));
    assert!(matches!(
        next(&mut pool.graph).await,
        ToTaskGraph::TaskStarted { .. }
    ));
    tokio::time::sleep(Duration::from_millis(700)).await;
    pool.addr.do_send(ToAgent::Cancel {
        task: task("t1"),
        reason: "user".into(),
    });
    tokio::time::sleep(Duration::from_secs(20)).await;
    let late = pool.graph.drain();
    let described: Vec<String> = late.iter().map(|m| format!("{m:?}")).collect();
    let charged = wall_charges(&late);
    assert!(
        charged.len() == 1 && about(wall(charged[0]), 700),
        "{described:?}"
    );
    assert!(
        late.iter()
            .all(|m| matches!(m, ToTaskGraph::SpendReported { .. })),
        "{described:?}"
    );
}

#[actix::test]
async fn a_revision_gets_only_what_the_attempt_s_first_call_left_of_its_limit() {
    let scenario = r#"
        [tasks.t1]
        outcome = "subplan"
        delay_ms = 500
        [tasks.t1.subplan]
        subtasks = [{ description = "x", scope = ["a.rs"] }]
        [tasks.t1.on_rejection]
        outcome = "hang"
    "#;
    let mut pool = start(scenario);
    pool.addr.do_send(assign("t1", 1, 2_000));
    let first = until(&mut pool.graph, |m| {
        matches!(m, ToTaskGraph::TaskCompleted(_))
    })
    .await;
    let first_charge = wall_charges(&first);
    assert!(
        first_charge.len() == 1 && about(wall(first_charge[0]), 500),
        "{first_charge:?}"
    );
    pool.addr
        .do_send(ToAgent::DecompositionRejected(TaskDecompositionRejected {
            parent: task("t1"),
            reason: RejectionReason::NoSubtasks,
        }));
    let revision = until(&mut pool.graph, |m| {
        matches!(m, ToTaskGraph::TaskFailed { .. })
    })
    .await;
    let charged = wall_charges(&revision);
    // The hung revision is cut off when the attempt's 2000 ms are spent, not 2000 ms later.
    assert!(
        charged.len() == 1 && (1_499..=1_502).contains(&charged[0]),
        "{charged:?}"
    );
    assert!(matches!(
        revision.last(),
        Some(ToTaskGraph::TaskFailed {
            failure: AttemptFailure::TimedOut { limit_ms: 2_000 },
            ..
        })
    ));
}

#[actix::test]
async fn a_synthesis_gets_only_what_its_parent_has_left() {
    let mut pool = start("[tasks.t1.synthesis]\noutcome = \"hang\"\n");
    pool.addr
        .do_send(ToAgent::SubtasksCompleted(SubtasksCompleted {
            parent: task("t1"),
            attempt: 1,
            results: Vec::new(),
            budget: Budget::new(1_000, Usd::ZERO, 1_500),
            scope: vec!["a.rs".into()],
            profile: "general".into(),
        }));
    let failure = pool
        .graph
        .fish_for("the synthesis's failure", |m| match m {
            ToTaskGraph::TaskFailed { failure, .. } => Some(failure.clone()),
            _ => None,
        })
        .await;
    // The pool's own cap is 60 s: the parent's 1.5 s left is what bounds it.
    assert_eq!(failure, AttemptFailure::TimedOut { limit_ms: 1_500 });
}

/// A port that records how each workspace was released: sealed (nothing ran in it since
/// its seal, ADR-046) or not.
struct RecordingWorktrees {
    inner: flotilla_actors::ports::ScratchWorktrees,
    releases: std::sync::Mutex<Vec<bool>>,
}

impl flotilla_actors::ports::Worktrees for RecordingWorktrees {
    fn prepare(
        &self,
        request: flotilla_actors::ports::WorktreeRequest,
    ) -> BoxFuture<'static, Result<Workspace, flotilla_actors::ports::RepoError>> {
        self.inner.prepare(request)
    }
    fn seal(
        &self,
        workspace: Workspace,
        subject: String,
    ) -> BoxFuture<'static, Result<BranchWork, flotilla_actors::ports::RepoError>> {
        self.inner.seal(workspace, subject)
    }
    fn release(
        &self,
        workspace: Workspace,
        fate: flotilla_actors::ports::BranchFate,
    ) -> BoxFuture<'static, Result<(), flotilla_actors::ports::RepoError>> {
        self.releases.lock().unwrap().push(false);
        self.inner.release(workspace, fate)
    }
    fn release_sealed(
        &self,
        workspace: Workspace,
        fate: flotilla_actors::ports::BranchFate,
    ) -> BoxFuture<'static, Result<(), flotilla_actors::ports::RepoError>> {
        self.releases.lock().unwrap().push(true);
        self.inner.release(workspace, fate)
    }
    fn sweep(
        &self,
        keep: flotilla_actors::ports::SweepKeep,
    ) -> BoxFuture<'static, Result<flotilla_actors::ports::Swept, flotilla_actors::ports::RepoError>>
    {
        self.inner.sweep(keep)
    }
}

/// Runs one attempt of `t1` under `scenario` (with `verify` as the run's verification
/// command, run for real: on the real clock) to its end and says how its workspace was
/// released.
async fn released_sealed(scenario: &str, verify: Option<&str>, wall_ms: u64) -> Vec<bool> {
    if verify.is_none() {
        virtual_time();
    }
    let agent = Arc::new(ScriptedAgent::new(Scenario::from_toml(scenario).unwrap()));
    let (graph, mut inbox) = probe::<ToTaskGraph>("task graph");
    let dir = tempfile::tempdir().unwrap();
    let worktrees = Arc::new(RecordingWorktrees {
        inner: flotilla_actors::ports::ScratchWorktrees::new(dir.path()),
        releases: Default::default(),
    });
    let mut kit = scratch_kit(agent, dir.path());
    kit.worktrees = worktrees.clone();
    let config = flotilla_actors::actors::worker::check::ChecksConfig {
        verify: verify.map(String::from),
        ..Default::default()
    };
    kit.checks = Arc::new(config.compile().unwrap());
    let addr = WorkerPool::new(RunId::generate(), kit, graph, Duration::from_secs(60)).start();
    addr.do_send(assign("t1", 1, wall_ms));
    loop {
        match next(&mut inbox).await {
            ToTaskGraph::TaskCompleted(_) | ToTaskGraph::TaskFailed { .. } => break,
            _ => continue,
        }
    }
    // Released before the TaskGraph hears (the Worker's rule).
    worktrees.releases.lock().unwrap().clone()
}

/// The reset of a parked directory may trust the seal's walk only when nothing ran in the
/// workspace after that seal (ADR-046): the verification command runs there after it, and
/// an agent call cut short by its time limit was never sealed.
#[actix::test]
async fn a_workspace_is_released_as_sealed_only_when_nothing_ran_in_it_after_the_seal() {
    assert_eq!(released_sealed(DONE, None, 60_000).await, [true]);
    let hang = "[tasks.t1]\noutcome = \"hang\"\n";
    assert_eq!(
        released_sealed(hang, None, 5_000).await,
        [false],
        "cut short: never sealed"
    );
}

const DONE: &str = "[tasks.t1]\nsummary = \"done\"\n[tasks.t1.writes]\n\"a.rs\" = \"a\\n\"\n";

#[actix::test]
async fn a_workspace_the_verification_ran_in_after_the_seal_is_not_released_as_sealed() {
    assert_eq!(
        released_sealed(DONE, Some("echo built > out.txt"), 60_000).await,
        [false]
    );
}
