//! Budgets bind where the daemon's pieces are needed: the status report and the live line
//! with huge reported numbers, and a real WorkerPool running scripted agents. The rest of
//! the budget tests need only the actors: `actors/tests/it/budgets.rs`.

use flotilla_actors::config::Limits;
use flotilla_actors::protocol::*;

use crate::harness::*;

fn tokens(n: u64) -> Budget {
    Budget::new(n, Usd::ZERO, 0)
}

/// The repro's budget: a thousand tokens, ten cents, a second and a half.
fn small() -> Budget {
    Budget::new(1_000, Usd::from_micros(100_000), 1_500)
}

/// Overflow checks are on in release builds too, so the daemon's status and the CLI's live
/// line must saturate a model's token counts, not panic on them.
#[test]
fn huge_reported_token_counts_do_not_crash_status_or_the_live_line() {
    let run = RunId::generate();
    let mut greedy = Handoff::complete("done");
    greedy.metrics.tokens_in = u64::MAX;
    greedy.metrics.tokens_out = u64::MAX;
    let kinds = vec![
        EventKind::TaskAdded {
            task: task("t1"),
            spec: spec("a", &["a"]),
            budget: tokens(10),
            depends_on: Vec::new(),
        },
        EventKind::TaskReady { task: task("t1") },
        EventKind::TaskDispatched {
            task: task("t1"),
            attempt: 1,
            profile: "w".into(),
            route: Route::Worker,
        },
        EventKind::TaskStarted {
            task: task("t1"),
            attempt: 1,
        },
        EventKind::SpendCharged {
            task: task("t1"),
            attempt: 1,
            spent: tokens(u64::MAX),
        },
        EventKind::SpendCharged {
            task: task("t1"),
            attempt: 1,
            spent: tokens(u64::MAX),
        },
        EventKind::DecompositionAccepted {
            parent: task("t1"),
            attempt: 1,
            reason: DecompositionReason::TooLarge,
            stop_when: StopCondition::AllSubtasksComplete,
            subtasks: Vec::new(),
            handoff: Some(greedy.clone()),
            artifacts: Vec::new(),
            subplanner: false,
        },
        EventKind::SubtasksCompleted { parent: task("t1") },
        EventKind::TaskCompleted {
            task: task("t1"),
            attempt: 1,
            handoff: Some(greedy),
            artifacts: Vec::new(),
        },
    ];
    let events: Vec<Event> = kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| Event {
            seq: i as u64 + 1,
            run,
            at_ms: 0,
            kind,
        })
        .collect();
    let mut live = flotilla::cli::render::live::LiveLine::default();
    for e in &events {
        live.observe(e);
    }
    let line = live.summary(0);
    assert!(line.contains(&format!("{} tokens", u64::MAX)), "{line}");
    let record = flotilla::journal::RunRecord {
        id: run,
        request: "r".into(),
        repo: std::path::PathBuf::from("/tmp"),
        config: serde_json::Value::Null,
        created_ms: 0,
        outcome: None,
    };
    let status = flotilla::daemon::report::status(&record, Limits::default(), &events);
    assert_eq!(status.graph.run_spent.tokens, u64::MAX);
}

/// A WorkerPool running the scripted `scenario`, reporting to `h`'s TaskGraph.
fn scripted_pool(
    h: &GraphHarness,
    scenario: &str,
    workspaces: &std::path::Path,
) -> actix::Addr<flotilla_actors::actors::WorkerPool> {
    use actix::Actor;
    use flotilla::scripted::{Scenario, ScriptedAgent};
    use std::sync::Arc;
    use std::time::Duration;

    let agent = Arc::new(ScriptedAgent::new(Scenario::from_toml(scenario).unwrap()));
    flotilla_actors::actors::WorkerPool::new(
        RunId::generate(),
        crate::scratch_kit::scratch_kit(agent, workspaces),
        h.graph.clone().recipient(),
        Duration::from_secs(60),
    )
    .start()
}

/// Plays Dispatch: hands every task of the next `Ready` to the pool, as Dispatch would.
async fn hand_out(h: &mut GraphHarness, pool: &actix::Addr<flotilla_actors::actors::WorkerPool>) {
    let ready = h
        .dispatch
        .fish_for("Ready", |m| match m {
            ToDispatch::Ready(tasks) => Some(tasks.clone()),
            _ => None,
        })
        .await;
    for t in ready {
        h.send(ToTaskGraph::TaskDispatched {
            task: t.task.clone(),
            attempt: t.attempt,
            profile: "default".into(),
            route: Route::Worker,
            agent: pool.clone().recipient(),
        });
        pool.do_send(ToAgent::Assign(Assignment {
            run: RunId::generate(),
            task: t,
            profile: "default".into(),
            route: Route::Worker,
            branch: "b".into(),
        }));
    }
}

/// The reviewer's repro, Worker and TaskGraph together: a hung agent with a 1500 ms budget
/// times out once, its time is charged to the task and the run, and it is not retried.
#[actix::test]
async fn a_hung_agent_spends_its_wall_time_budget_once_and_is_not_retried() {
    virtual_time();
    let mut h = GraphHarness::start(Limits::default());
    let workspaces = tempfile::tempdir().unwrap();
    let pool = scripted_pool(
        &h,
        "[tasks.t1]\noutcome = \"hang\"\ntokens = 500\n",
        workspaces.path(),
    );
    let mut s = spec("a", &["a"]);
    s.budget = Some(small());
    h.send(ToTaskGraph::SubmitTasks { tasks: vec![s] });
    hand_out(&mut h, &pool).await;
    let failed = h
        .events
        .fish_for("task_failed", |Published(e)| match &e.kind {
            EventKind::TaskFailed { reason, .. } => Some(reason.clone()),
            EventKind::TaskRetried { .. } => panic!("retried with nothing left"),
            _ => None,
        })
        .await;
    let FailureReason::BudgetExceeded { spent, budget } = failed else {
        panic!("expected BudgetExceeded, got {failed:?}");
    };
    assert_eq!(budget, small());
    // The 1500 ms it ran, give or take tokio's 1 ms timer tick; its 500 tokens.
    assert_eq!(spent.tokens, 500);
    assert!((1_500..=1_501).contains(&spent.wall_time_ms), "{spent}");
    let snap = h.snapshot().await;
    assert_eq!(
        snap.run_spent, spent,
        "the run is charged the agent's time too"
    );
    assert_eq!(snap.outcome, None, "planning may still add work");
    h.dispatch.drain();
    h.dispatch.expect_none().await;
}

/// The run budget's wall time is the sum of its agents' time (not the time since the run
/// started): two agents working side by side for 1.5 s each spend 3 s of it.
#[actix::test]
async fn the_run_budget_s_wall_time_sums_agent_time_and_binds() {
    virtual_time();
    let run_budget = Budget::new(1_000_000, Usd::from_micros(10_000_000), 2_500);
    let mut h = GraphHarness::start(Limits {
        run_budget,
        ..Limits::default()
    });
    let workspaces = tempfile::tempdir().unwrap();
    let pool = scripted_pool(
        &h,
        "[agent]\noutcome = \"hang\"\ntokens = 10\n",
        workspaces.path(),
    );
    let (mut a, mut b) = (spec("a", &["a"]), spec("b", &["b"]));
    a.budget = Some(small());
    b.budget = Some(small());
    h.send(ToTaskGraph::SubmitTasks { tasks: vec![a, b] });
    hand_out(&mut h, &pool).await;
    let exhausted = h.events.expect_kind("run_budget_exhausted").await;
    let EventKind::RunBudgetExhausted { spent, budget } = exhausted else {
        unreachable!()
    };
    assert_eq!(budget, run_budget);
    assert_eq!(spent.tokens, 20);
    assert!((3_000..=3_002).contains(&spent.wall_time_ms), "{spent}");
    match h.events.expect_kind("run_finished").await {
        EventKind::RunFinished { outcome, reason } => {
            assert_eq!(outcome, RunOutcome::Failed);
            let reason = reason.unwrap();
            assert!(reason.starts_with("budget exhausted"), "{reason}");
            assert!(reason.contains("2500 ms"), "{reason}");
        }
        other => panic!("expected RunFinished, got {other:?}"),
    }
}
