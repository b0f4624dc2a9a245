//! The reviewer's verdicts in the graph (ADR-038): a verdict is journaled as
//! `ReviewVerdict` and changes nothing else; changes requested are a retry whose
//! `PreviousAttempt` carries the comments, rebuilt by a replay of the journal; a stale
//! attempt's verdict is ignored; out of attempts, the task fails as any other; the last
//! verdict is in the snapshot for `status`.

use flotilla_actors::config::Limits;
use flotilla_actors::graph::RunGraph;
use flotilla_actors::protocol::*;

use crate::harness::{spec, task};

fn limits(max_attempts: u32) -> Limits {
    Limits {
        max_attempts,
        ..Limits::default()
    }
}

fn changes(comments: &[&str]) -> ReviewVerdict {
    ReviewVerdict::ChangesRequested {
        comments: ReviewComments::new(comments.iter().copied()),
    }
}

/// Dispatches and starts `t1`'s current attempt; its events.
fn start(g: &mut RunGraph) -> (u32, Vec<EventKind>) {
    let t = task("t1");
    let attempt = g.task(&t).unwrap().attempt;
    let mut events = g.dispatched(&t, attempt, "general", Route::Worker).unwrap();
    events.extend(g.started(&t, attempt).unwrap());
    (attempt, events)
}

fn last_review(g: &RunGraph) -> Option<LastReview> {
    g.snapshot().tasks[0].review
}

#[test]
fn changes_requested_are_a_retry_that_carries_the_comments_through_a_replay() {
    let mut g = RunGraph::new(limits(2));
    let mut journal = g.submit(vec![spec("a", &["src/a.rs"])]).unwrap();
    let (attempt, events) = start(&mut g);
    journal.extend(events);
    let verdict = changes(&["a.rs: handle the empty input"]);
    let reviewed = g
        .reviewed(&task("t1"), attempt, verdict.clone(), 2, Usage::default())
        .unwrap();
    assert!(
        matches!(&reviewed[..], [EventKind::ReviewVerdict { attempt: 1, review, calls: 2, .. }] if *review == verdict),
        "{reviewed:?}"
    );
    journal.extend(reviewed);
    let failure = AttemptFailure::ChangesRequested {
        comments: verdict.comments().to_vec(),
    };
    let failed = g.failed(&task("t1"), attempt, failure).unwrap();
    assert!(
        matches!(&failed[..], [EventKind::TaskRetried { attempt: 1, .. }, ..]),
        "{failed:?}"
    );
    journal.extend(failed);
    let told = g.ready_task(&task("t1")).unwrap().previous.unwrap();
    assert_eq!(told.review(), Some("- a.rs: handle the empty input"));
    assert_eq!(
        last_review(&g),
        Some(LastReview {
            attempt: 1,
            mark: ReviewMark::ChangesRequested
        })
    );

    let replayed = RunGraph::new(limits(2)).replayed(&journal).unwrap();
    assert_eq!(
        replayed.ready_task(&task("t1")).unwrap().previous,
        Some(told)
    );
    assert_eq!(last_review(&replayed), last_review(&g));

    // Attempt 1's verdict arriving late is ignored; attempt 2's is kept.
    let (second, _) = start(&mut g);
    let stale = g
        .reviewed(&task("t1"), 1, changes(&["late"]), 1, Usage::default())
        .unwrap();
    assert!(
        matches!(&stale[..], [EventKind::MessageIgnored { .. }]),
        "{stale:?}"
    );
    let approved = ReviewVerdict::Approve {
        comments: ReviewComments::default(),
    };
    g.reviewed(&task("t1"), second, approved, 1, Usage::default())
        .unwrap();
    assert_eq!(
        last_review(&g),
        Some(LastReview {
            attempt: 2,
            mark: ReviewMark::Approved
        })
    );
}

#[test]
fn changes_requested_on_the_last_attempt_fail_the_task_as_any_failure_does() {
    let mut g = RunGraph::new(limits(1));
    g.submit(vec![spec("a", &["src/a.rs"])]).unwrap();
    let (attempt, _) = start(&mut g);
    let failure = AttemptFailure::ChangesRequested {
        comments: vec!["no".into()],
    };
    let events = g.failed(&task("t1"), attempt, failure.clone()).unwrap();
    assert!(
        events.iter().any(|e| matches!(e, EventKind::TaskFailed { reason: FailureReason::AgentFailed { failure: f }, .. } if *f == failure)),
        "{events:?}"
    );
    assert_eq!(g.task(&task("t1")).unwrap().state, TaskState::Failed);
    // A review that gave no verdict is retried like any retryable failure.
    let mut g = RunGraph::new(limits(2));
    g.submit(vec![spec("a", &["src/a.rs"])]).unwrap();
    let (attempt, _) = start(&mut g);
    let failed = AttemptFailure::ReviewFailed {
        reason: "no usable verdict in 3 call(s)".into(),
    };
    let events = g.failed(&task("t1"), attempt, failed).unwrap();
    assert!(matches!(&events[..], [EventKind::TaskRetried { .. }, ..]));
}
