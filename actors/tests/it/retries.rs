//! Retries that know why (ADR-031): a retry's `ReadyTask` carries the previous attempt's
//! failure (`PreviousAttempt`), built from the journaled `TaskRetried`, so a replay after a
//! restart rebuilds it; the TaskGraph actor hands it to Dispatch with the retry.

use flotilla_actors::config::Limits;
use flotilla_actors::graph::RunGraph;
use flotilla_actors::protocol::*;

use crate::harness::{GraphHarness, spec, task};

fn limits(max_attempts: u32) -> Limits {
    Limits {
        max_attempts,
        ..Limits::default()
    }
}

/// Runs `id`'s current attempt to a report of `handoff` (with work on a branch, so that it
/// lands), and returns every event.
fn deliver(g: &mut RunGraph, id: &str, handoff: Handoff) -> Vec<EventKind> {
    let t = task(id);
    let attempt = g.task(&t).unwrap().attempt;
    let mut events = g.dispatched(&t, attempt, "general", Route::Worker).unwrap();
    events.extend(g.started(&t, attempt).unwrap());
    events.extend(
        g.complete(TaskCompleted {
            task: t,
            attempt,
            handoff: Some(handoff),
            artifacts: Vec::new(),
            subplan: None,
        })
        .unwrap(),
    );
    events
}

fn with_work(id: &str) -> Handoff {
    let mut h = Handoff::complete("done");
    h.work = Some(Box::new(BranchWork {
        branch: format!("flotilla/run/{id}"),
        base: "base".into(),
        head: format!("head-{id}"),
        ..BranchWork::default()
    }));
    h
}

fn previous(g: &RunGraph, id: &str) -> Option<std::sync::Arc<PreviousAttempt>> {
    g.ready_task(&task(id)).unwrap().previous
}

#[test]
fn a_gate_failure_reaches_the_retry_and_a_replay_of_the_journal_rebuilds_it() {
    let mut g = RunGraph::new(limits(3)).merging();
    let mut journal = g.submit(vec![spec("a", &["src/a.rs"])]).unwrap();
    assert_eq!(
        previous(&g, "t1"),
        None,
        "a first attempt has nothing before it"
    );
    // Delivered with a failed verification (flagged, not failed): the retry hears of it too.
    let mut delivered = with_work("t1");
    delivered.findings.push(Finding::VerificationFailed {
        command: "cargo clippy".into(),
        exit: "exit code 101".into(),
        output_tail: "error: unused variable".into(),
    });
    journal.extend(deliver(&mut g, "t1", delivered));
    let gate = LandingFailure::GateFailed {
        command: "cargo test (exit code 101)".into(),
        output_tail: "running 3 tests\ntest add ... FAILED\n".into(),
    };
    journal.extend(g.landing_failed(&task("t1"), 1, gate).unwrap());

    let told = previous(&g, "t1").expect("the retry is told why");
    assert_eq!(told.attempt(), 1);
    let tail = told.gate().unwrap();
    assert_eq!(tail.command(), "cargo test (exit code 101)");
    assert!(tail.output_tail().contains("test add ... FAILED"));
    let verification = told.verification().unwrap();
    assert_eq!(verification.command(), "cargo clippy");

    // After a restart: the graph is the journal's fold, and says the same.
    let mut replayed = RunGraph::new(limits(3))
        .merging()
        .replayed(&journal)
        .unwrap();
    assert_eq!(previous(&replayed, "t1"), Some(told.clone()));
    // The restart interrupts attempt 2 in flight: attempt 3 is still told of attempt 1.
    replayed
        .dispatched(&task("t1"), 2, "general", Route::Worker)
        .unwrap();
    let interrupted = replayed.interrupt_in_flight().unwrap();
    assert_eq!(interrupted.len(), 1);
    let third = replayed.ready_task(&task("t1")).unwrap();
    assert_eq!((third.attempt, third.previous), (3, Some(told)));
}

#[test]
fn out_of_scope_crash_and_timeout_failures_are_each_told_to_the_next_attempt() {
    let mut g = RunGraph::new(limits(4));
    g.submit(vec![spec("a", &["src/a.rs"])]).unwrap();
    let failures = [
        AttemptFailure::OutOfScope {
            paths: vec!["src/b.rs".into(), "Cargo.toml".into()],
        },
        AttemptFailure::Crashed {
            detail: "exit status 139".into(),
        },
        AttemptFailure::TimedOut { limit_ms: 90_000 },
    ];
    for (i, failure) in failures.into_iter().enumerate() {
        let attempt = i as u32 + 1;
        g.dispatched(&task("t1"), attempt, "general", Route::Worker)
            .unwrap();
        g.started(&task("t1"), attempt).unwrap();
        let events = g.failed(&task("t1"), attempt, failure.clone()).unwrap();
        assert!(
            matches!(&events[..], [EventKind::TaskRetried { .. }]),
            "{events:?}"
        );
        let told = previous(&g, "t1").unwrap();
        assert_eq!(
            told.attempt(),
            attempt,
            "the latest failure replaces the one before"
        );
        match failure {
            AttemptFailure::OutOfScope { .. } => assert_eq!(
                told.out_of_scope().paths(),
                ["src/b.rs".to_string(), "Cargo.toml".to_string()]
            ),
            AttemptFailure::Crashed { .. } => {
                assert_eq!(told.reason(), "the agent crashed: exit status 139");
                assert!(told.out_of_scope().is_empty());
            }
            _ => assert_eq!(
                told.reason(),
                "the attempt exceeded its time limit of 90000 ms"
            ),
        }
    }
}

#[test]
fn a_failed_handoffs_verification_is_journaled_with_the_retry_and_an_ended_task_forgets_it() {
    let mut g = RunGraph::new(limits(2));
    g.submit(vec![spec("a", &["src/a.rs"])]).unwrap();
    let mut failed = Handoff::complete("tests still fail");
    failed.status = HandoffStatus::Failed;
    failed.findings.push(Finding::VerificationFailed {
        command: "make check".into(),
        exit: "exit code 2".into(),
        output_tail: "FAIL: test_parse\n".into(),
    });
    let events = deliver(&mut g, "t1", failed);
    let retried = events
        .iter()
        .find_map(|e| match e {
            EventKind::TaskRetried { findings, .. } => Some(findings.clone()),
            _ => None,
        })
        .expect("retried");
    assert_eq!(
        retried.len(),
        1,
        "the finding is in the journal: {events:?}"
    );
    let told = previous(&g, "t1").unwrap();
    let verification = told.verification().unwrap();
    assert_eq!(verification.exit(), "exit code 2");
    assert!(verification.output_tail().contains("FAIL: test_parse"));
    assert!(told.reason().contains("tests still fail"));

    deliver(&mut g, "t1", Handoff::complete("fixed"));
    assert_eq!(g.task(&task("t1")).unwrap().state, TaskState::Completed);
    assert!(
        g.task(&task("t1")).unwrap().previous.is_none(),
        "an ended task gives it back"
    );
}

#[actix::test]
async fn the_task_graph_hands_the_retry_to_dispatch_with_its_previous_attempt() {
    let mut h = GraphHarness::start(limits(2));
    assert_eq!(h.submit(vec![spec("a", &["src/a.rs"])]).await, [task("t1")]);
    h.start_task("t1", 1);
    h.send(ToTaskGraph::TaskFailed {
        task: task("t1"),
        attempt: 1,
        failure: AttemptFailure::OutOfScope {
            paths: vec!["src/z.rs".into()],
        },
    });
    let retry = h
        .dispatch
        .fish_for("the retry's Ready", |m| match m {
            ToDispatch::Ready(tasks) => tasks.iter().find(|t| t.attempt == 2).cloned(),
            _ => None,
        })
        .await;
    let told = retry
        .previous
        .expect("the retry carries its previous attempt");
    assert_eq!(told.out_of_scope().paths(), ["src/z.rs".to_string()]);
}
