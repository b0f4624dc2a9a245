//! A whole-run cancel the daemon journaled while the run had no actors (paused for refused
//! storage, or between two lives) is carried out by the run's next life, from the journal:
//! `RunGraph::carry_out_journaled_cancel` after `interrupt_in_flight`.

use flotilla_actors::config::Limits;
use flotilla_actors::graph::RunGraph;
use flotilla_actors::protocol::*;

use crate::harness::{spec, task};

/// Two tasks planned, one dispatched and started, then the supervisor's `RunCancelRequested`.
fn journal_with_a_cancel_nobody_carried_out() -> Vec<EventKind> {
    let mut g = RunGraph::new(Limits::default());
    let mut journal = g
        .submit(vec![spec("a", &["src/a.rs"]), spec("b", &["src/b.rs"])])
        .unwrap();
    journal.extend(g.planning_finished().unwrap());
    journal.extend(
        g.dispatched(&task("t1"), 1, "general", Route::Worker)
            .unwrap(),
    );
    journal.extend(g.started(&task("t1"), 1).unwrap());
    journal.push(EventKind::RunCancelRequested {
        reason: "cancelled by the user".into(),
    });
    journal
}

#[test]
fn a_journaled_cancel_is_carried_out_by_the_next_life_and_the_run_ends_cancelled() {
    let journal = journal_with_a_cancel_nobody_carried_out();
    let mut g = RunGraph::new(Limits::default()).replayed(&journal).unwrap();
    let mut events = g.interrupt_in_flight().unwrap();
    events.extend(g.carry_out_journaled_cancel().unwrap());
    let names: Vec<String> = events
        .iter()
        .map(|k| match k {
            EventKind::TaskInterrupted { task, .. } => format!("interrupted {task}"),
            EventKind::TaskCancelled { task, reason, .. } => format!("cancelled {task}: {reason}"),
            EventKind::RunFinished { outcome, .. } => format!("finished {outcome:?}"),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        names,
        [
            "interrupted t1",
            "cancelled t1: cancelled by the user",
            "cancelled t2: cancelled by the user",
            "finished Cancelled",
        ]
    );
    assert_eq!(g.outcome(), Some(RunOutcome::Cancelled));
    // Nothing is left to dispatch.
    assert!(g.tasks_in(TaskState::Ready).is_empty());
    // Replayed once more (a kill right after): nothing is carried out twice.
    let mut all = journal.clone();
    all.extend(events);
    let mut again = RunGraph::new(Limits::default()).replayed(&all).unwrap();
    assert!(again.carry_out_journaled_cancel().unwrap().is_empty());
}

#[test]
fn without_a_journaled_cancel_the_next_life_carries_out_nothing() {
    let mut journal = journal_with_a_cancel_nobody_carried_out();
    journal.pop();
    let mut g = RunGraph::new(Limits::default()).replayed(&journal).unwrap();
    g.interrupt_in_flight().unwrap();
    assert!(g.carry_out_journaled_cancel().unwrap().is_empty());
    assert_eq!(g.outcome(), None);
}

/// A cancel journaled while planning, before any task exists (the planner's life was cut
/// short): the next life ends the run cancelled, though there is nothing to cancel.
#[test]
fn a_journaled_cancel_with_no_task_open_still_ends_the_run() {
    let journal = vec![EventKind::RunCancelRequested {
        reason: "cancelled by the user".into(),
    }];
    let mut g = RunGraph::new(Limits::default()).replayed(&journal).unwrap();
    let events = g.carry_out_journaled_cancel().unwrap();
    assert!(
        matches!(
            &events[..],
            [EventKind::RunFinished {
                outcome: RunOutcome::Cancelled,
                ..
            }]
        ),
        "{events:?}"
    );
    assert_eq!(g.outcome(), Some(RunOutcome::Cancelled));
}
