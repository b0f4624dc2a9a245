//! Budgets bind: spend is charged as reported, a task over its budget is stopped, a run over
//! its run budget ends `Failed` with the figures, and numbers from models cannot overflow.

use flotilla_actors::config::Limits;
use flotilla_actors::graph::RunGraph;
use flotilla_actors::protocol::*;

use crate::harness::*;

fn tokens(n: u64) -> Budget {
    Budget::new(n, Usd::ZERO, 0)
}

/// A graph with one running root task `t1` whose budget is `budget`.
fn running(limits: Limits, budget: Budget) -> RunGraph {
    let mut g = RunGraph::new(limits);
    let mut s = spec("a", &["a"]);
    s.budget = Some(budget);
    g.submit(vec![s]).unwrap();
    g.dispatched(&task("t1"), 1, "w", Route::Worker).unwrap();
    g.started(&task("t1"), 1).unwrap();
    g
}

#[test]
fn reported_spend_is_charged_to_the_task_and_the_run() {
    let mut g = running(Limits::default(), Budget::new(1_000, Usd::ZERO, 60_000));
    let events = g.spend_reported(&task("t1"), 1, tokens(300)).unwrap();
    assert_eq!(
        events,
        vec![EventKind::SpendCharged {
            task: task("t1"),
            attempt: 1,
            spent: tokens(300)
        }]
    );
    assert_eq!(g.task(&task("t1")).unwrap().spent, tokens(300));
    assert_eq!(g.run_spent(), tokens(300));
    assert_eq!(g.task(&task("t1")).unwrap().state, TaskState::Running);
}

#[test]
fn a_handoff_is_charged_only_beyond_what_its_attempt_already_reported() {
    let mut g = running(Limits::default(), Budget::new(1_000, Usd::ZERO, 60_000));
    g.spend_reported(&task("t1"), 1, tokens(300)).unwrap();
    let mut handoff = Handoff::complete("done");
    handoff.metrics.tokens_in = 400;
    handoff.metrics.tokens_out = 100;
    let events = g
        .complete(TaskCompleted {
            task: task("t1"),
            attempt: 1,
            handoff: Some(handoff),
            artifacts: Vec::new(),
            subplan: None,
        })
        .unwrap();
    assert_eq!(
        events[0],
        EventKind::SpendCharged {
            task: task("t1"),
            attempt: 1,
            spent: tokens(200)
        }
    );
    assert_eq!(g.task(&task("t1")).unwrap().spent, tokens(500));
    assert_eq!(g.run_spent(), tokens(500));
}

#[test]
fn spend_over_the_task_budget_stops_the_task_with_the_figures() {
    let budget = Budget::new(1_000, Usd::ZERO, 60_000);
    let mut g = running(Limits::default(), budget);
    let events = g.spend_reported(&task("t1"), 1, tokens(1_001)).unwrap();
    let failed = events
        .iter()
        .find_map(|e| match e {
            EventKind::TaskFailed { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .expect("the task must fail");
    assert_eq!(
        failed,
        FailureReason::BudgetExceeded {
            spent: tokens(1_001),
            budget
        }
    );
    assert_eq!(g.task(&task("t1")).unwrap().state, TaskState::Failed);
}

#[test]
fn spend_over_the_run_budget_ends_the_run_failed_with_the_figures() {
    let limits = Limits {
        run_budget: Budget::new(500, Usd::from_micros(1_000_000), 3_600_000),
        ..Limits::default()
    };
    let mut g = running(limits, Budget::new(1_000, Usd::ZERO, 60_000));
    let events = g.spend_reported(&task("t1"), 1, tokens(501)).unwrap();
    let kinds: Vec<&str> = events.iter().map(EventKind::name).collect();
    assert_eq!(
        kinds,
        [
            "spend_charged",
            "run_budget_exhausted",
            "task_cancelled",
            "run_finished"
        ]
    );
    let EventKind::RunFinished { outcome, reason } = events.last().unwrap() else {
        unreachable!()
    };
    assert_eq!(*outcome, RunOutcome::Failed);
    let reason = reason.as_deref().unwrap();
    assert!(reason.starts_with("budget exhausted"), "{reason}");
    assert!(reason.contains("501 tokens"), "{reason}");
    assert!(reason.contains("500 tokens"), "{reason}");
    // Nothing more is planned.
    let late = g.submit(vec![spec("b", &["b"])]).unwrap();
    assert!(matches!(late[..], [EventKind::MessageIgnored { .. }]));
}
