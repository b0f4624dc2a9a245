//! The TaskGraph actor alone, with probes for Dispatch, the agent and the event stream.

use std::time::Duration;

use flotilla_actors::config::Limits;
use flotilla_actors::protocol::*;

use crate::harness::*;

fn one_retry() -> Limits {
    Limits {
        max_attempts: 2,
        ..Limits::default()
    }
}

#[actix::test]
async fn failure_cancels_dependents_transitively_with_reasons() {
    virtual_time();
    let mut h = GraphHarness::start(one_retry());
    let mut b = spec("b", &["b"]);
    b.dependencies = vec![DependencyRef::Batch(0)];
    let mut c = spec("c", &["c"]);
    c.dependencies = vec![DependencyRef::Batch(1)];
    let ready = h
        .submit(vec![spec("a", &["a"]), b, c, spec("d", &["d"])])
        .await;
    assert_eq!(ready, vec![task("t1"), task("t4")]);

    h.start_task("t1", 1);
    h.send(ToTaskGraph::TaskFailed {
        task: task("t1"),
        attempt: 1,
        failure: crashed("boom"),
    });
    // First failure: retried as attempt 2, released and re-queued in that order.
    assert!(
        matches!(h.dispatch.expect().await, ToDispatch::Release { task } if task == self::task("t1"))
    );
    match h.dispatch.expect().await {
        ToDispatch::Ready(tasks) => {
            assert_eq!((tasks[0].task.clone(), tasks[0].attempt), (task("t1"), 2))
        }
        other => panic!("expected Ready, got {other:?}"),
    }
    h.start_task("t1", 2);
    h.send(ToTaskGraph::TaskFailed {
        task: task("t1"),
        attempt: 2,
        failure: crashed("boom again"),
    });

    let failed = h.events.expect_kind("task_failed").await;
    assert!(matches!(
        failed,
        EventKind::TaskFailed {
            reason: FailureReason::AgentFailed { .. },
            ..
        }
    ));
    let c2 = h.events.expect_kind("task_cancelled").await;
    assert_eq!(
        c2,
        EventKind::TaskCancelled {
            task: task("t2"),
            was: TaskState::Pending,
            reason: "dependency t1 is failed".into()
        }
    );
    let c3 = h.events.expect_kind("task_cancelled").await;
    assert_eq!(
        c3,
        EventKind::TaskCancelled {
            task: task("t3"),
            was: TaskState::Pending,
            reason: "dependency t2 is cancelled".into()
        }
    );
    assert_eq!(h.state_of("t4").await, TaskState::Ready);

    // The journal holds everything: replaying it rebuilds the same graph.
    let kinds: Vec<EventKind> = h.journal.all().into_iter().map(|e| e.kind).collect();
    let replayed = flotilla_actors::graph::RunGraph::replay(one_retry(), &kinds).unwrap();
    assert_eq!(replayed.snapshot(), h.snapshot().await);
}

#[actix::test]
async fn a_failed_subtask_fails_its_parent_instead_of_leaving_it_waiting() {
    virtual_time();
    let mut h = GraphHarness::start(Limits {
        max_attempts: 1,
        ..Limits::default()
    });
    h.submit(vec![spec("parent", &["src"])]).await;
    h.start_task("t1", 1);
    h.propose(
        "t1",
        1,
        vec![
            SubtaskProposal::new("x", &["src/x"]),
            SubtaskProposal::new("y", &["src/y"]),
        ],
        StopCondition::AllSubtasksComplete,
    );
    h.expect_decision().await.unwrap();
    h.start_task("t1.1", 1);
    h.send(ToTaskGraph::TaskFailed {
        task: task("t1.1"),
        attempt: 1,
        failure: crashed("compile error"),
    });

    let failed = h
        .events
        .fish_for("parent failure", |Published(e)| match &e.kind {
            EventKind::TaskFailed {
                task: t, reason, ..
            } if *t == task("t1") => Some(reason.clone()),
            _ => None,
        })
        .await;
    assert_eq!(
        failed,
        FailureReason::SubtaskFailed {
            subtask: task("t1.1")
        }
    );
    assert_eq!(h.state_of("t1.2").await, TaskState::Cancelled);
    // The parent's agent is told, so it does not wait for SubtasksCompleted forever.
    let told = h
        .agent_inbox
        .fish_for("Cancel t1", |m| match m {
            ToAgent::Cancel { task: t, .. } if *t == task("t1") => Some(()),
            _ => None,
        })
        .await;
    assert_eq!(told, ());
}

#[actix::test]
async fn first_success_cancels_the_remaining_siblings() {
    virtual_time();
    let mut h = GraphHarness::start(Limits::default());
    h.submit(vec![spec("find a fast hash", &["src/hash"])])
        .await;
    h.start_task("t1", 1);
    h.propose(
        "t1",
        1,
        vec![
            SubtaskProposal::new("try fxhash", &["src/hash/fx.rs"]),
            SubtaskProposal::new("try ahash", &["src/hash/a.rs"]),
        ],
        StopCondition::FirstSuccess,
    );
    h.expect_decision().await.unwrap();
    h.start_task("t1.1", 1);
    h.start_task("t1.2", 1);
    h.complete("t1.2", 1);

    let cancelled = h.events.expect_kind("task_cancelled").await;
    assert_eq!(
        cancelled,
        EventKind::TaskCancelled {
            task: task("t1.1"),
            was: TaskState::Running,
            reason: "a sibling completed t1 first".into()
        }
    );
    assert_eq!(
        h.events.expect_kind("subtasks_completed").await,
        EventKind::SubtasksCompleted { parent: task("t1") }
    );
    // The running loser is called off; the parent's agent gets the results.
    let mut saw_cancel = false;
    let results = h
        .agent_inbox
        .fish_for("SubtasksCompleted", |m| match m {
            ToAgent::Cancel { task: t, .. } if *t == task("t1.1") => {
                saw_cancel = true;
                None
            }
            ToAgent::SubtasksCompleted(s) => Some(s.results.clone()),
            _ => None,
        })
        .await;
    assert!(saw_cancel, "the cancelled sibling's agent must be told");
    assert_eq!(
        results.iter().map(|r| r.state).collect::<Vec<_>>(),
        [TaskState::Cancelled, TaskState::Completed]
    );
    h.complete("t1", 1);
    h.events.expect_kind("task_completed").await;
    assert_eq!(h.state_of("t1").await, TaskState::Completed);
}

#[actix::test]
async fn user_decision_waits_for_an_explicit_answer() {
    virtual_time();
    let mut h = GraphHarness::start(Limits::default());
    h.submit(vec![spec("pick a design", &["docs"])]).await;
    h.start_task("t1", 1);
    h.propose(
        "t1",
        1,
        vec![
            SubtaskProposal::new("option a", &["docs/a.md"]),
            SubtaskProposal::new("option b", &["docs/b.md"]),
        ],
        StopCondition::UserDecision,
    );
    h.expect_decision().await.unwrap();
    for t in ["t1.1", "t1.2"] {
        h.start_task(t, 1);
        h.complete(t, 1);
    }
    h.events.expect_kind("awaiting_user_decision").await;
    h.agent_inbox.expect_none().await;
    assert_eq!(h.state_of("t1").await, TaskState::WaitingForSubtasks);

    h.send(ToTaskGraph::UserDecision {
        task: task("t1"),
        decision: UserDecision::Complete,
    });
    h.events.expect_kind("subtasks_completed").await;
    assert!(matches!(
        h.agent_inbox.expect().await,
        ToAgent::SubtasksCompleted(_)
    ));
    assert_eq!(h.state_of("t1").await, TaskState::Synthesizing);
}

#[actix::test]
async fn the_decomposition_deadline_fails_the_parent_and_cancels_its_subtasks() {
    virtual_time();
    let mut h = GraphHarness::start(Limits::default());
    let mut parent = spec("slow parent", &["src"]);
    parent.budget = Some(Budget::new(10_000, Usd::from_micros(1_000_000), 1_000));
    h.submit(vec![parent]).await;
    h.start_task("t1", 1);
    h.propose(
        "t1",
        1,
        vec![
            SubtaskProposal::new("a", &["src/a"]),
            SubtaskProposal::new("b", &["src/b"]),
        ],
        StopCondition::AllSubtasksComplete,
    );
    h.expect_decision().await.unwrap();
    h.start_task("t1.1", 1);
    h.complete("t1.1", 1);
    h.events.expect_kind("task_completed").await;

    // 2 × 1 s budget: nothing at 1.9 s, failure at 2 s.
    tokio::time::advance(Duration::from_millis(1_900)).await;
    assert_eq!(h.state_of("t1").await, TaskState::WaitingForSubtasks);
    tokio::time::advance(Duration::from_millis(200)).await;
    let failed = h
        .events
        .fish_for("deadline failure", |Published(e)| match &e.kind {
            EventKind::TaskFailed {
                task: t, reason, ..
            } if *t == task("t1") => Some(reason.clone()),
            _ => None,
        })
        .await;
    assert_eq!(
        failed,
        FailureReason::DecompositionDeadline { deadline_ms: 2_000 }
    );
    assert_eq!(h.state_of("t1.2").await, TaskState::Cancelled);
    assert_eq!(h.state_of("t1.1").await, TaskState::Completed);
}

#[actix::test]
async fn a_late_completion_after_cancellation_is_ignored() {
    virtual_time();
    let mut h = GraphHarness::start(Limits::default());
    h.submit(vec![spec("a", &["a"])]).await;
    h.start_task("t1", 1);
    h.send(ToTaskGraph::Cancel {
        task: Some(task("t1")),
        reason: "user asked".into(),
    });
    assert!(matches!(
        h.agent_inbox.expect().await,
        ToAgent::Cancel { .. }
    ));
    h.complete("t1", 1);

    let ignored = h.events.expect_kind("message_ignored").await;
    assert_eq!(
        ignored,
        EventKind::MessageIgnored {
            task: Some(task("t1")),
            message: "TaskCompleted".into(),
            why: "the task is already cancelled".into()
        }
    );
    assert_eq!(h.state_of("t1").await, TaskState::Cancelled);
    let snap = h.snapshot().await;
    assert!(
        snap.tasks[0].summary.is_none(),
        "the late handoff must not be recorded"
    );
}

#[actix::test]
async fn a_completion_for_a_stale_attempt_is_ignored() {
    virtual_time();
    let mut h = GraphHarness::start(one_retry());
    h.submit(vec![spec("a", &["a"])]).await;
    h.start_task("t1", 1);
    h.send(ToTaskGraph::TaskFailed {
        task: task("t1"),
        attempt: 1,
        failure: AttemptFailure::TimedOut { limit_ms: 1_000 },
    });
    h.events.expect_kind("task_retried").await;
    h.complete("t1", 1);
    let ignored = h.events.expect_kind("message_ignored").await;
    assert!(
        matches!(ignored, EventKind::MessageIgnored { why, .. } if why.contains("stale attempt 1"))
    );
    assert_eq!(h.state_of("t1").await, TaskState::Ready);
}

#[actix::test]
async fn handoff_status_is_honoured() {
    virtual_time();
    let mut h = GraphHarness::start(Limits::default());
    h.submit(vec![spec("a", &["a"]), spec("b", &["b"])]).await;
    h.start_task("t1", 1);
    let mut blocked = Handoff::complete("need database credentials");
    blocked.status = HandoffStatus::Blocked;
    h.report("t1", 1, Some(blocked), None);
    let failed = h.events.expect_kind("task_failed").await;
    assert!(
        matches!(failed, EventKind::TaskFailed { reason: FailureReason::Blocked { summary }, .. } if summary == "need database credentials")
    );

    h.start_task("t2", 1);
    let mut partial = Handoff::complete("half of it");
    partial.status = HandoffStatus::Partial;
    partial.concerns = vec!["error paths untested".into()];
    h.report("t2", 1, Some(partial), None);
    h.events.expect_kind("task_completed").await;
    assert_eq!(h.state_of("t2").await, TaskState::Completed);
}

#[actix::test]
async fn a_bad_planner_batch_is_rejected_whole() {
    virtual_time();
    let mut h = GraphHarness::start(Limits::default());
    let mut cyclic_a = spec("a", &["a"]);
    cyclic_a.dependencies = vec![DependencyRef::Batch(2)];
    let mut cyclic_b = spec("b", &["b"]);
    cyclic_b.dependencies = vec![DependencyRef::Batch(1)];
    h.send(ToTaskGraph::SubmitTasks {
        tasks: vec![spec("fine", &["c"]), cyclic_a, cyclic_b],
    });
    let rejected = h.events.expect_kind("tasks_rejected").await;
    assert_eq!(
        rejected,
        EventKind::TasksRejected {
            reason: RejectionReason::DependencyCycle { cycle: vec![1, 2] }
        }
    );

    let mut unknown = spec("x", &["x"]);
    unknown.dependencies = vec![DependencyRef::Task(task("t9"))];
    h.send(ToTaskGraph::SubmitTasks {
        tasks: vec![unknown],
    });
    let rejected = h.events.expect_kind("tasks_rejected").await;
    assert!(matches!(
        rejected,
        EventKind::TasksRejected {
            reason: RejectionReason::UnknownDependency { .. }
        }
    ));
    h.send(ToTaskGraph::SubmitTasks {
        tasks: vec![spec("escape", &["../../etc"])],
    });
    let rejected = h.events.expect_kind("tasks_rejected").await;
    assert!(matches!(
        rejected,
        EventKind::TasksRejected {
            reason: RejectionReason::InvalidPath {
                problem: PathProblem::ParentTraversal,
                ..
            }
        }
    ));

    assert!(h.snapshot().await.tasks.is_empty());
    h.dispatch.expect_none().await;
}

#[actix::test]
async fn cancelling_the_run_cancels_everything_and_finishes_it() {
    virtual_time();
    let mut h = GraphHarness::start(Limits::default());
    let mut b = spec("b", &["b"]);
    b.dependencies = vec![DependencyRef::Batch(0)];
    h.submit(vec![spec("a", &["a"]), b]).await;
    h.start_task("t1", 1);
    h.send(ToTaskGraph::Cancel {
        task: None,
        reason: "user cancelled the run".into(),
    });
    assert_eq!(
        h.events.expect_kind("run_finished").await,
        EventKind::RunFinished {
            outcome: RunOutcome::Cancelled,
            reason: Some("user cancelled the run".into())
        }
    );
    let snap = h.snapshot().await;
    assert!(snap.tasks.iter().all(|t| t.state == TaskState::Cancelled));
    assert!(matches!(
        h.agent_inbox.expect().await,
        ToAgent::Cancel { .. }
    ));
}

#[test]
fn an_interrupted_attempt_is_requeued_without_charging_a_retry() {
    use flotilla_actors::graph::RunGraph;
    let mut g = RunGraph::new(Limits {
        max_attempts: 1,
        ..Limits::default()
    });
    g.submit(vec![spec("a", &["a"])]).unwrap();
    g.dispatched(&task("t1"), 1, "w", Route::Worker).unwrap();
    g.started(&task("t1"), 1).unwrap();
    let events = g.interrupt_in_flight().unwrap();
    assert_eq!(
        events,
        vec![EventKind::TaskInterrupted {
            task: task("t1"),
            attempt: 1
        }]
    );
    assert_eq!(
        (
            g.task(&task("t1")).unwrap().state,
            g.task(&task("t1")).unwrap().attempt
        ),
        (TaskState::Ready, 2)
    );
    // max_attempts = 1 and this is attempt 2, yet the failure is the first charged one: no
    // retry is left, so it fails (rather than having been refused a first try).
    g.dispatched(&task("t1"), 2, "w", Route::Worker).unwrap();
    g.started(&task("t1"), 2).unwrap();
    let events = g.failed(&task("t1"), 2, crashed("boom")).unwrap();
    assert!(matches!(events[0], EventKind::TaskFailed { .. }));

    let mut g = RunGraph::new(Limits {
        max_attempts: 2,
        ..Limits::default()
    });
    g.submit(vec![spec("a", &["a"])]).unwrap();
    g.dispatched(&task("t1"), 1, "w", Route::Worker).unwrap();
    g.interrupt_in_flight().unwrap();
    g.dispatched(&task("t1"), 2, "w", Route::Worker).unwrap();
    g.started(&task("t1"), 2).unwrap();
    let events = g.failed(&task("t1"), 2, crashed("boom")).unwrap();
    assert_eq!(
        events,
        vec![EventKind::TaskRetried {
            task: task("t1"),
            attempt: 2,
            failure: crashed("boom"),
            findings: Vec::new(),
        }]
    );
}

fn crashed(detail: &str) -> AttemptFailure {
    AttemptFailure::Crashed {
        detail: detail.into(),
    }
}

#[test]
fn a_failed_run_says_why_in_its_last_event() {
    use flotilla_actors::graph::RunGraph;
    let mut g = RunGraph::new(Limits::default());
    g.submit(vec![spec("a", &["a"])]).unwrap();
    g.planning_finished().unwrap();
    g.cancel(Some(&task("t1")), "not needed").unwrap();
    assert_eq!(g.outcome(), Some(RunOutcome::Failed));
    assert_eq!(
        g.finish_reason(),
        Some("1 of the planner's tasks did not complete")
    );

    let mut g = RunGraph::new(Limits::default());
    let events = g
        .planner_gave_up("five malformed answers in a row")
        .unwrap();
    assert_eq!(
        events.last(),
        Some(&EventKind::RunFinished {
            outcome: RunOutcome::Failed,
            reason: Some("the planner gave up: five malformed answers in a row".into())
        })
    );
}

/// t1 decomposed under `UserDecision` into t1.1 (completed), t1.2 (failed): awaiting a human.
async fn awaiting_decision() -> GraphHarness {
    virtual_time();
    let mut h = GraphHarness::start(Limits {
        max_attempts: 1,
        ..Limits::default()
    });
    h.submit(vec![spec("pick a design", &["docs"])]).await;
    h.start_task("t1", 1);
    h.propose(
        "t1",
        1,
        vec![
            SubtaskProposal::new("option a", &["docs/a.md"]),
            SubtaskProposal::new("option b", &["docs/b.md"]),
        ],
        StopCondition::UserDecision,
    );
    h.expect_decision().await.unwrap();
    h.start_task("t1.1", 1);
    h.report(
        "t1.1",
        1,
        Some(Handoff::complete("option a written up")),
        None,
    );
    h.start_task("t1.2", 1);
    h.send(ToTaskGraph::TaskFailed {
        task: task("t1.2"),
        attempt: 1,
        failure: crashed("boom"),
    });
    h.events.expect_kind("awaiting_user_decision").await;
    h
}

#[actix::test]
async fn accepting_a_subtask_completes_the_parent_with_its_handoff_without_synthesis() {
    let mut h = awaiting_decision().await;
    // Only a completed subtask of this parent can be accepted; anything else changes nothing.
    h.send(ToTaskGraph::UserDecision {
        task: task("t1"),
        decision: UserDecision::Accept {
            subtask: task("t1.2"),
        },
    });
    let ignored = h.events.expect_kind("message_ignored").await;
    assert!(
        matches!(&ignored, EventKind::MessageIgnored { why, .. } if why == "t1.2 is not a completed subtask of t1"),
        "{ignored:?}"
    );
    assert_eq!(h.state_of("t1").await, TaskState::WaitingForSubtasks);

    h.send(ToTaskGraph::UserDecision {
        task: task("t1"),
        decision: UserDecision::Accept {
            subtask: task("t1.1"),
        },
    });
    let completed = h.events.expect_kind("task_completed").await;
    assert!(
        matches!(&completed, EventKind::TaskCompleted { task: t, handoff: Some(hd), .. } if *t == task("t1") && hd.summary == "option a written up"),
        "{completed:?}"
    );
    assert_eq!(h.state_of("t1").await, TaskState::Completed);
    // No synthesis was asked for.
    h.agent_inbox.expect_none().await;
}

#[actix::test]
async fn declining_fails_the_parent() {
    let mut h = awaiting_decision().await;
    h.send(ToTaskGraph::UserDecision {
        task: task("t1"),
        decision: UserDecision::Fail,
    });
    let failed = h.events.expect_kind("task_failed").await;
    assert!(
        matches!(&failed, EventKind::TaskFailed { task: t, reason: FailureReason::UserDeclined, .. } if *t == task("t1")),
        "{failed:?}"
    );
}

/// Which failures are retried: the graph tells them apart by type, not by message.
#[test]
fn timeouts_crashes_and_dead_runners_retry_a_cancelled_attempt_and_a_budget_stop_do_not() {
    use flotilla_actors::graph::RunGraph;
    let running = || {
        let mut g = RunGraph::new(Limits {
            max_attempts: 3,
            ..Limits::default()
        });
        let mut s = spec("a", &["a"]);
        s.budget = Some(Budget::new(1_000, Usd::ZERO, 60_000));
        g.submit(vec![s]).unwrap();
        g.dispatched(&task("t1"), 1, "w", Route::Worker).unwrap();
        g.started(&task("t1"), 1).unwrap();
        g
    };
    let retryable = [
        AttemptFailure::TimedOut { limit_ms: 60_000 },
        crashed("exit 137"),
        AttemptFailure::Malformed {
            detail: "not json".into(),
        },
        AttemptFailure::RunnerDied {
            detail: "panicked".into(),
        },
        AttemptFailure::Reported {
            summary: "tests fail".into(),
        },
    ];
    for failure in retryable {
        let mut g = running();
        let events = g.failed(&task("t1"), 1, failure.clone()).unwrap();
        assert_eq!(
            events,
            vec![EventKind::TaskRetried {
                task: task("t1"),
                attempt: 1,
                failure,
                findings: Vec::new(),
            }]
        );
    }

    let mut g = running();
    let events = g.failed(&task("t1"), 1, AttemptFailure::Cancelled).unwrap();
    assert!(matches!(
        &events[0],
        EventKind::TaskFailed {
            reason: FailureReason::AgentFailed {
                failure: AttemptFailure::Cancelled
            },
            ..
        }
    ));

    let mut g = running();
    let events = g
        .spend_reported(&task("t1"), 1, Budget::new(2_000, Usd::ZERO, 0))
        .unwrap();
    assert!(
        events.iter().any(|e| matches!(
            e,
            EventKind::TaskFailed {
                reason: FailureReason::BudgetExceeded { .. },
                ..
            }
        )),
        "{events:?}"
    );
    assert!(!events.iter().any(|e| e.name() == "task_retried"));
    assert_eq!(g.task(&task("t1")).unwrap().state, TaskState::Failed);
}
