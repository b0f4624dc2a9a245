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
    let snap = g.snapshot();
    assert_eq!(
        (snap.run_spent, snap.run_budget),
        (tokens(300), Limits::default().run_budget)
    );
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

fn capped(description: &str, scope: &[&str], cap: Budget) -> SubtaskProposal {
    let mut s = SubtaskProposal::new(description, scope);
    s.budget_cap = Some(cap);
    s
}

fn subplan(parent: &str, subtasks: Vec<SubtaskProposal>) -> ProposedSubplan {
    ProposedSubplan {
        parent: task(parent),
        reason: DecompositionReason::TooLarge,
        subtasks,
        stop_when: StopCondition::AllSubtasksComplete,
    }
}

fn report(
    id: &str,
    attempt: u32,
    handoff: Option<Handoff>,
    plan: Option<ProposedSubplan>,
) -> TaskCompleted {
    TaskCompleted {
        task: task(id),
        attempt,
        handoff,
        artifacts: Vec::new(),
        subplan: plan,
    }
}

fn rejection(events: &[EventKind]) -> RejectionReason {
    events
        .iter()
        .find_map(|e| match e {
            EventKind::DecompositionRejected { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("expected a rejection, got {events:?}"))
}

/// Every dimension at `u64::MAX`: limits that refuse nothing, so only the arithmetic stands
/// between a model's numbers and an overflow.
fn unbounded() -> Limits {
    let all = Budget::new(u64::MAX, Usd::from_micros(u64::MAX), u64::MAX);
    Limits {
        max_task_budget: all,
        run_budget: all,
        ..Limits::default()
    }
}

#[test]
fn caps_of_i64_max_are_refused_cleanly_and_leave_the_graph_unchanged() {
    let mut g = running(Limits::default(), Budget::new(1_000, Usd::ZERO, 60_000));
    let huge = Budget::new(i64::MAX as u64, Usd::ZERO, 1_000);
    let plan = subplan(
        "t1",
        vec![
            capped("x", &["a/x"], huge),
            capped("y", &["a/y"], huge),
            SubtaskProposal::new("z", &["a/z"]),
            SubtaskProposal::new("w", &["a/w"]),
        ],
    );
    let events = g.complete(report("t1", 1, None, Some(plan))).unwrap();
    assert_eq!(
        rejection(&events),
        RejectionReason::TaskBudgetTooLarge {
            subtask: 0,
            asked: huge,
            max: Limits::default().max_task_budget
        }
    );
    assert_eq!(g.len(), 1);
    assert_eq!(g.task(&task("t1")).unwrap().state, TaskState::Running);
}

#[test]
fn caps_that_sum_past_u64_max_saturate_instead_of_overflowing() {
    // The per-task maximum lets these through, so the sums themselves must not overflow (a
    // debug build panicked here; a release build wrapped and said the subtasks "need 0").
    for cap in [i64::MAX as u64, u64::MAX] {
        let parent = Budget::new(u64::MAX, Usd::from_micros(u64::MAX), 60_000);
        let mut g = running(unbounded(), parent);
        let huge = Budget::new(cap, Usd::from_micros(cap), 1_000);
        let plan = subplan(
            "t1",
            vec![
                capped("x", &["a/x"], huge),
                capped("y", &["a/y"], huge),
                SubtaskProposal::new("z", &["a/z"]),
                SubtaskProposal::new("w", &["a/w"]),
            ],
        );
        let events = g.complete(report("t1", 1, None, Some(plan))).unwrap();
        match rejection(&events) {
            RejectionReason::BudgetExceeded { needed, remaining } => {
                assert!(needed.tokens >= cap, "needed {needed} must not wrap");
                assert_eq!(remaining.tokens, u64::MAX);
            }
            other => panic!("expected BudgetExceeded, got {other:?}"),
        }
        assert_eq!(g.len(), 1);
    }
}

#[test]
fn a_planner_task_asking_for_u64_max_tokens_is_refused() {
    let mut g = RunGraph::new(Limits::default());
    let mut greedy = spec("b", &["b"]);
    greedy.budget = Some(tokens(u64::MAX));
    let events = g.submit(vec![spec("a", &["a"]), greedy]).unwrap();
    assert_eq!(
        events,
        vec![EventKind::TasksRejected {
            reason: RejectionReason::TaskBudgetTooLarge {
                subtask: 1,
                asked: tokens(u64::MAX),
                max: Limits::default().max_task_budget
            }
        }]
    );
    assert!(g.is_empty());
}

#[test]
fn attempt_two_decomposes_only_what_attempt_one_left() {
    let budget = Budget::new(1_000, Usd::ZERO, 60_000);
    let two_caps = |each: u64| {
        subplan(
            "t1",
            vec![
                capped("x", &["a/x"], Budget::new(each, Usd::ZERO, 1_000)),
                capped("y", &["a/y"], Budget::new(each, Usd::ZERO, 1_000)),
            ],
        )
    };
    // Attempt 1 spends 600 tokens: 450 reported as it went, the rest in its failed handoff.
    let mut g = running(Limits::default(), budget);
    g.spend_reported(&task("t1"), 1, tokens(450)).unwrap();
    let mut failed = Handoff::complete("could not finish");
    failed.status = HandoffStatus::Failed;
    failed.metrics.tokens_in = 600;
    let events = g.complete(report("t1", 1, Some(failed), None)).unwrap();
    assert!(matches!(events.last(), Some(EventKind::TaskRetried { .. })));
    assert_eq!(g.task(&task("t1")).unwrap().spent, tokens(600));
    g.dispatched(&task("t1"), 2, "w", Route::Worker).unwrap();
    g.started(&task("t1"), 2).unwrap();

    // Attempt 2 may not give away the 600 already spent...
    let events = g
        .complete(report("t1", 2, None, Some(two_caps(250))))
        .unwrap();
    match rejection(&events) {
        RejectionReason::BudgetExceeded { needed, remaining } => {
            assert_eq!((needed.tokens, remaining.tokens), (500, 400));
        }
        other => panic!("expected BudgetExceeded, got {other:?}"),
    }
    assert_eq!(g.len(), 1);
    // ...but may give away the 400 left.
    let events = g
        .complete(report("t1", 2, None, Some(two_caps(200))))
        .unwrap();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, EventKind::DecompositionAccepted { .. })),
        "{events:?}"
    );
}

#[test]
fn planner_usage_counts_toward_the_run_budget() {
    let limits = Limits {
        run_budget: Budget::new(1_000, Usd::from_micros(1_000_000), 3_600_000),
        ..Limits::default()
    };
    let mut g = RunGraph::new(limits);
    let events = g
        .planner_answered(PlannerAnswer {
            call: 0,
            prompt: "plan".into(),
            content: "[...]".into(),
            usage: Usage {
                tokens_in: 900,
                tokens_out: 101,
                cost_usd: Usd::ZERO,
            },
            tasks: Ok(vec![spec("a", &["a"])]),
        })
        .unwrap();
    let kinds: Vec<&str> = events.iter().map(EventKind::name).collect();
    assert_eq!(
        kinds,
        ["planner_responded", "run_budget_exhausted", "run_finished"]
    );
    assert_eq!(g.run_spent(), tokens(1_001));
    assert!(g.is_empty(), "the answer's tasks must not be inserted");
    assert!(
        g.finish_reason()
            .is_some_and(|r| r.starts_with("budget exhausted"))
    );
}

// ---- The TaskGraph actor: what the planner and the agent hear, in order. ----

/// A TaskGraph actor with probes for Dispatch, the planner and the event stream.
struct PlannedGraph {
    graph: actix::Addr<flotilla_actors::actors::TaskGraph>,
    dispatch: Inbox<ToDispatch>,
    planner: Inbox<ToPlanner>,
    events: Inbox<Published>,
}

fn planned_graph(limits: Limits) -> PlannedGraph {
    use actix::Actor;
    use flotilla_actors::actors::TaskGraph;
    use flotilla_actors::ports::{MemoryJournal, SystemClock};
    use std::sync::Arc;

    virtual_time();
    let (dispatch_addr, dispatch) = probe::<ToDispatch>("dispatch");
    let (planner_addr, planner) = probe::<ToPlanner>("planner");
    let (events_addr, events) = probe::<Published>("events");
    let graph = TaskGraph::new(
        RunId::generate(),
        RunGraph::new(limits),
        Arc::new(MemoryJournal::new(Arc::new(SystemClock))),
        dispatch_addr,
        Some(events_addr),
    )
    .with_planner(planner_addr)
    .start();
    PlannedGraph {
        graph,
        dispatch,
        planner,
        events,
    }
}

#[actix::test]
async fn the_planner_hears_why_its_greedy_task_was_refused_and_nothing_is_inserted() {
    let mut h = planned_graph(Limits::default());
    let mut greedy = spec("b", &["b"]);
    greedy.budget = Some(tokens(u64::MAX));
    h.graph.do_send(ToTaskGraph::SubmitTasks {
        tasks: vec![spec("a", &["a"]), greedy],
    });
    match h.planner.expect().await {
        ToPlanner::BatchRejected { reason } => assert_eq!(
            reason,
            RejectionReason::TaskBudgetTooLarge {
                subtask: 1,
                asked: tokens(u64::MAX),
                max: Limits::default().max_task_budget
            }
        ),
        other => panic!("expected BatchRejected, got {other:?}"),
    }
    assert_eq!(
        h.events.expect_kind("tasks_rejected").await.name(),
        "tasks_rejected"
    );
    assert!(h.graph.send(GetSnapshot).await.unwrap().tasks.is_empty());
    h.dispatch.expect_none().await;
}

#[actix::test]
async fn a_subplan_with_i64_max_caps_is_refused_back_to_the_agent() {
    virtual_time();
    let mut h = GraphHarness::start(Limits::default());
    let mut parent = spec("a", &["a"]);
    parent.budget = Some(Budget::new(1_000, Usd::ZERO, 60_000));
    h.submit(vec![parent]).await;
    h.start_task("t1", 1);
    let before = h.snapshot().await;
    let huge = Budget::new(i64::MAX as u64, Usd::ZERO, 1_000);
    h.propose(
        "t1",
        1,
        vec![capped("x", &["a/x"], huge), capped("y", &["a/y"], huge)],
        StopCondition::AllSubtasksComplete,
    );
    let rejected = h.expect_decision().await.unwrap_err();
    assert!(
        matches!(
            rejected.reason,
            RejectionReason::TaskBudgetTooLarge { subtask: 0, .. }
        ),
        "{rejected:?}"
    );
    assert_eq!(h.snapshot().await, before);
    h.dispatch.expect_none().await;
}

#[actix::test]
async fn spend_over_the_task_budget_stops_the_task_and_cancels_its_agent() {
    virtual_time();
    let mut h = GraphHarness::start(Limits::default());
    let budget = Budget::new(1_000, Usd::ZERO, 60_000);
    let mut s = spec("a", &["a"]);
    s.budget = Some(budget);
    h.submit(vec![s, spec("b", &["b"])]).await;
    h.start_task("t1", 1);
    h.send(ToTaskGraph::SpendReported {
        task: task("t1"),
        attempt: 1,
        spent: tokens(700),
    });
    h.send(ToTaskGraph::SpendReported {
        task: task("t1"),
        attempt: 1,
        spent: tokens(301),
    });
    let mut kinds = Vec::new();
    while kinds.last() != Some(&"task_failed") {
        let kind = h.events.expect().await.0.kind.name();
        if kind.starts_with("spend") || kind.starts_with("task_failed") {
            kinds.push(kind);
        }
    }
    assert_eq!(kinds, ["spend_charged", "spend_charged", "task_failed"]);
    match h.agent_inbox.expect().await {
        ToAgent::Cancel { task, reason } => {
            assert_eq!(task, self::task("t1"));
            assert!(
                reason.contains("over budget: spent 1001 tokens"),
                "{reason}"
            );
        }
        other => panic!("expected Cancel, got {other:?}"),
    }
    let snap = h.snapshot().await;
    let t1 = snap.tasks.iter().find(|t| t.id == task("t1")).unwrap();
    assert_eq!(t1.state, TaskState::Failed);
    assert_eq!(
        t1.failure,
        Some(FailureReason::BudgetExceeded {
            spent: tokens(1_001),
            budget
        })
    );
    // The run is within its budget: the other task goes on.
    assert_eq!(h.state_of("t2").await, TaskState::Ready);
}

#[actix::test]
async fn spend_over_the_run_budget_stops_the_run_failed_with_the_figures() {
    virtual_time();
    let run_budget = Budget::new(1_500, Usd::from_micros(1_000_000), 3_600_000);
    let mut h = GraphHarness::start(Limits {
        run_budget,
        ..Limits::default()
    });
    let each = Budget::new(1_000, Usd::ZERO, 60_000);
    let (mut a, mut b) = (spec("a", &["a"]), spec("b", &["b"]));
    a.budget = Some(each);
    b.budget = Some(each);
    h.submit(vec![a, b]).await;
    h.start_task("t1", 1);
    h.start_task("t2", 1);
    h.send(ToTaskGraph::SpendReported {
        task: task("t1"),
        attempt: 1,
        spent: tokens(800),
    });
    h.send(ToTaskGraph::SpendReported {
        task: task("t2"),
        attempt: 1,
        spent: tokens(800),
    });
    let exhausted = h.events.expect_kind("run_budget_exhausted").await;
    assert_eq!(
        exhausted,
        EventKind::RunBudgetExhausted {
            spent: tokens(1_600),
            budget: run_budget
        }
    );
    let mut next = Vec::new();
    for _ in 0..3 {
        next.push(h.events.expect().await.0.kind);
    }
    let kinds: Vec<&str> = next.iter().map(EventKind::name).collect();
    assert_eq!(kinds, ["task_cancelled", "task_cancelled", "run_finished"]);
    assert_eq!(h.snapshot().await.outcome, Some(RunOutcome::Failed));
    let finished = match next.pop() {
        Some(EventKind::RunFinished { outcome, reason }) => (outcome, reason),
        other => panic!("expected RunFinished, got {other:?}"),
    };
    assert_eq!(finished.0, RunOutcome::Failed);
    let reason = finished.1.unwrap();
    assert!(reason.starts_with("budget exhausted"), "{reason}");
    assert!(
        reason.contains("1600 tokens") && reason.contains("1500 tokens"),
        "{reason}"
    );
    // Both agents are called off.
    for _ in 0..2 {
        assert!(matches!(
            h.agent_inbox.expect().await,
            ToAgent::Cancel { .. }
        ));
    }
    // Nothing more is dispatched: a late submission is ignored.
    h.dispatch.drain();
    h.send(ToTaskGraph::SubmitTasks {
        tasks: vec![spec("c", &["c"])],
    });
    h.dispatch.expect_none().await;
}

#[test]
fn spend_of_an_interrupted_attempt_still_counts_against_the_next_subplan() {
    let mut g = running(Limits::default(), Budget::new(1_000, Usd::ZERO, 60_000));
    g.spend_reported(&task("t1"), 1, tokens(700)).unwrap();
    // The daemon restarts: attempt 1 is interrupted without being charged a retry...
    g.interrupt_in_flight().unwrap();
    g.dispatched(&task("t1"), 2, "w", Route::Worker).unwrap();
    g.started(&task("t1"), 2).unwrap();
    // ...but its spend is real: attempt 2 has 300 tokens to give away, not 1,000.
    let plan = subplan(
        "t1",
        vec![capped("x", &["a/x"], Budget::new(400, Usd::ZERO, 1_000))],
    );
    let events = g.complete(report("t1", 2, None, Some(plan))).unwrap();
    match rejection(&events) {
        RejectionReason::BudgetExceeded { needed, remaining } => {
            assert_eq!((needed.tokens, remaining.tokens), (400, 300));
        }
        other => panic!("expected BudgetExceeded, got {other:?}"),
    }
}

/// The repro's budget: a thousand tokens, ten cents, a second and a half.
fn small() -> Budget {
    Budget::new(1_000, Usd::from_micros(100_000), 1_500)
}

#[actix::test]
async fn a_retry_is_assigned_only_what_the_earlier_attempts_left() {
    virtual_time();
    let mut h = PipelineHarness::start(Limits::default());
    let mut s = spec("a", &["a"]);
    s.budget = Some(small());
    h.graph.do_send(ToTaskGraph::SubmitTasks { tasks: vec![s] });
    let first = h.expect_assign().await;
    assert_eq!((first.task.attempt, first.task.budget), (1, small()));
    h.graph.do_send(ToTaskGraph::TaskStarted {
        task: task("t1"),
        attempt: 1,
    });
    h.graph.do_send(ToTaskGraph::SpendReported {
        task: task("t1"),
        attempt: 1,
        spent: Budget::new(400, Usd::from_micros(30_000), 1_000),
    });
    h.graph.do_send(ToTaskGraph::TaskFailed {
        task: task("t1"),
        attempt: 1,
        failure: AttemptFailure::Crashed {
            detail: "boom".into(),
        },
    });
    let second = h.expect_assign().await;
    assert_eq!(
        (second.task.attempt, second.task.budget),
        (2, Budget::new(600, Usd::from_micros(70_000), 500)),
        "the retry's time limit is the 500 ms the task has left, not a fresh 1500 ms"
    );
}

/// Fails attempt 1 of `running`'s task after it spent `spent`; the events that follow.
fn fail_after(budget: Budget, spent: Budget, failure: AttemptFailure) -> Vec<EventKind> {
    let mut g = running(Limits::default(), budget);
    g.spend_reported(&task("t1"), 1, spent).unwrap();
    g.failed(&task("t1"), 1, failure).unwrap()
}

fn crashed() -> AttemptFailure {
    AttemptFailure::Crashed {
        detail: "boom".into(),
    }
}

#[test]
fn a_task_with_a_dimension_used_up_is_not_retried_but_fails_with_the_figures() {
    let budget = Budget::new(1_000, Usd::ZERO, 60_000);
    // 1000 of 1000 tokens: a retry would be over budget at once.
    let events = fail_after(budget, tokens(1_000), crashed());
    assert!(
        !events.iter().any(|e| e.name() == "task_retried"),
        "{events:?}"
    );
    assert!(
        events.contains(&EventKind::TaskFailed {
            task: task("t1"),
            attempt: 1,
            reason: FailureReason::BudgetExceeded {
                spent: tokens(1_000),
                budget
            }
        }),
        "{events:?}"
    );
    // The wall time a timed-out attempt was charged leaves nothing for a retry either.
    let spent = Budget::new(500, Usd::ZERO, 1_500);
    let events = fail_after(small(), spent, AttemptFailure::TimedOut { limit_ms: 1_500 });
    assert!(
        events.contains(&EventKind::TaskFailed {
            task: task("t1"),
            attempt: 1,
            reason: FailureReason::BudgetExceeded {
                spent,
                budget: small()
            }
        }),
        "{events:?}"
    );
    // Something left in every dimension it allows (it allows no money): retried.
    let events = fail_after(budget, tokens(999), crashed());
    assert_eq!(
        events.iter().map(EventKind::name).collect::<Vec<_>>(),
        ["task_retried"]
    );
}
