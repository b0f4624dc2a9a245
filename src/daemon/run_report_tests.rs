use flotilla_actors::protocol::{
    AttemptFailure, Budget, Event, EventKind, FailureReason, Finding, FixOf, Handoff, Route, RunId,
    RunOutcome, SweepReport, TaskId, TaskSpec, Usage, Usd,
};

use super::{percentile, run_report};
use crate::api::report::RunReport;
use crate::journal::RunRecord;

fn t(id: &str) -> TaskId {
    id.parse().unwrap()
}

/// `(at_ms, kind)` as a journal holds them: seqs from 1.
fn report(slots: usize, script: Vec<(u64, EventKind)>) -> RunReport {
    let run = RunId::generate();
    let events: Vec<Event> = script
        .into_iter()
        .enumerate()
        .map(|(i, (at_ms, kind))| Event {
            seq: i as u64 + 1,
            run,
            at_ms,
            kind,
        })
        .collect();
    let record = RunRecord {
        id: run,
        request: "r".into(),
        repo: "/tmp".into(),
        config: serde_json::Value::Null,
        created_ms: 0,
        outcome: None,
    };
    run_report(&record, slots, &events)
}

fn added(id: &str) -> EventKind {
    EventKind::TaskAdded {
        task: t(id),
        spec: TaskSpec::new(format!("do {id}"), &["src"]),
        budget: Budget::default(),
        depends_on: Vec::new(),
    }
}

fn dispatched(id: &str, attempt: u32) -> EventKind {
    EventKind::TaskDispatched {
        task: t(id),
        attempt,
        profile: "general".into(),
        route: Route::Worker,
    }
}

fn started(id: &str, attempt: u32) -> EventKind {
    EventKind::TaskStarted {
        task: t(id),
        attempt,
    }
}

fn landing(id: &str, attempt: u32, handoff: Handoff) -> EventKind {
    EventKind::TaskLanding {
        task: t(id),
        attempt,
        handoff: Some(handoff),
        artifacts: Vec::new(),
        branch: format!("flotilla/x/{id}"),
        head: "abc".into(),
    }
}

fn landed(id: &str, via: Option<&str>) -> EventKind {
    EventKind::TaskLanded {
        task: t(id),
        commit: "def".into(),
        via: via.map(t),
    }
}

fn finished(outcome: RunOutcome) -> EventKind {
    EventKind::RunFinished {
        outcome,
        reason: None,
    }
}

fn run_started() -> EventKind {
    EventKind::RunStarted {
        request: "r".into(),
        sandbox: None,
    }
}

#[test]
fn a_task_landed_first_try_counts_as_such_and_times_from_start_to_landed() {
    let r = report(
        2,
        vec![
            (1_000, run_started()),
            (1_000, added("t1")),
            (1_100, dispatched("t1", 1)),
            (1_200, started("t1", 1)),
            (1_700, landing("t1", 1, Handoff::complete("done"))),
            (1_900, landed("t1", None)),
            (2_000, finished(RunOutcome::Completed)),
        ],
    );
    assert_eq!(r.state, "completed");
    assert_eq!(r.tasks.total, 1);
    assert_eq!(r.tasks.completed, 1);
    assert_eq!(r.tasks.completed_first_try, 1);
    assert_eq!(r.tasks.retries, 0);
    assert_eq!(r.merges.queued, 1);
    assert_eq!(r.merges.landed, 1);
    assert_eq!(r.merges.success_rate, Some(1.0));
    assert_eq!(r.task_time.count, 1);
    assert_eq!(r.task_time.p50_ms, Some(700));
    assert_eq!(r.makespan.makespan_ms, 1_000);
    assert_eq!(r.makespan.work_ms, 500);
    assert_eq!(r.makespan.longest_attempt_ms, 500);
    assert_eq!(r.makespan.lower_bound_ms, 500);
    assert_eq!(r.subtrees.len(), 1);
    assert_eq!(r.subtrees[0].span_ms, Some(700));
    assert!(r.left_for_user.is_empty());
}

#[test]
fn a_retry_and_a_gate_failure_are_counted_and_the_task_is_not_first_try() {
    let failure = AttemptFailure::GateFailed {
        command: "cargo test".into(),
        output_tail: "FAIL".into(),
    };
    let r = report(
        1,
        vec![
            (0, run_started()),
            (0, added("t1")),
            (0, dispatched("t1", 1)),
            (10, started("t1", 1)),
            (110, landing("t1", 1, Handoff::complete("done"))),
            (
                120,
                EventKind::MergeGateFailed {
                    tasks: vec![t("t1")],
                    command: "cargo test".into(),
                    output_tail: "FAIL".into(),
                    bisecting: false,
                    flaky_retry: false,
                },
            ),
            (
                130,
                EventKind::TaskRetried {
                    task: t("t1"),
                    attempt: 1,
                    failure,
                    findings: Vec::new(),
                },
            ),
            (130, dispatched("t1", 2)),
            (140, started("t1", 2)),
            (340, landing("t1", 2, Handoff::complete("fixed"))),
            (350, landed("t1", None)),
        ],
    );
    assert_eq!(r.state, "running");
    assert_eq!(r.tasks.completed, 1);
    assert_eq!(r.tasks.completed_first_try, 0);
    assert_eq!(r.tasks.retried, 1);
    assert_eq!(r.tasks.retries, 1);
    assert_eq!(r.merges.gate_failures, 1);
    assert_eq!(r.merges.queued, 2);
    assert_eq!(r.merges.landed, 1);
    assert_eq!(r.merges.success_rate, Some(0.5));
    // Two worker attempts: 100 ms and 200 ms; one slot.
    assert_eq!(r.makespan.work_ms, 300);
    assert_eq!(r.makespan.lower_bound_ms, 300);
    assert_eq!(r.makespan.makespan_ms, 350);
    assert_eq!(r.task_time.p50_ms, Some(340));
}

#[test]
fn a_conflict_fixed_by_a_fix_task_lands_through_it() {
    let r = report(
        4,
        vec![
            (0, run_started()),
            (0, added("t1")),
            (0, dispatched("t1", 1)),
            (0, started("t1", 1)),
            (100, landing("t1", 1, Handoff::complete("done"))),
            (
                110,
                EventKind::MergeConflict {
                    task: t("t1"),
                    files: vec!["src/a.rs".into()],
                    clashing: vec!["abc x".into()],
                    retrying: false,
                },
            ),
            (
                110,
                EventKind::FixTaskAdded {
                    task: TaskId::fix(1),
                    spec: TaskSpec::new("resolve", &["src/a.rs"]),
                    budget: Budget::default(),
                    fix: FixOf::Conflict {
                        task: t("t1"),
                        branch: "flotilla/x/t1".into(),
                        files: vec!["src/a.rs".into()],
                    },
                },
            ),
            (120, dispatched("f1", 1)),
            (120, started("f1", 1)),
            (200, landing("f1", 1, Handoff::complete("resolved"))),
            (210, landed("f1", None)),
            (210, landed("t1", Some("f1"))),
            (220, finished(RunOutcome::Completed)),
        ],
    );
    assert_eq!(r.tasks.total, 2);
    assert_eq!(r.tasks.fix_tasks, 1);
    assert_eq!(r.tasks.completed, 2);
    // t1 needed a fix; f1 did it first try.
    assert_eq!(r.tasks.completed_first_try, 1);
    assert_eq!(r.merges.conflicts, 1);
    assert_eq!(r.merges.conflict_fixes, 1);
    assert_eq!(r.merges.conflict_fixes_completed, 1);
    assert_eq!(r.merges.landed, 1);
    assert_eq!(r.merges.landed_via_fix, 1);
    assert_eq!(r.merges.success_rate, Some(1.0));
    let roots: Vec<String> = r.subtrees.iter().map(|s| s.root.to_string()).collect();
    let mut roots = roots;
    roots.sort();
    assert_eq!(roots, ["f1", "t1"]);
    assert_eq!(r.subtrees.len(), 2);
}

#[test]
fn an_empty_diff_a_red_sweep_and_a_blocked_task_are_reported() {
    let mut empty = Handoff::complete("nothing to do");
    empty.findings.push(Finding::EmptyDiff);
    let sweep = |green| EventKind::SweepFinished {
        report: SweepReport {
            sweep: 1,
            commit: "c".into(),
            green,
            class: None,
            failures: 0,
            fixes: Vec::new(),
            duration_ms: 5,
            finalization: None,
            wording: None,
        },
    };
    let r = report(
        2,
        vec![
            (0, run_started()),
            (0, added("t1")),
            (0, added("t2")),
            (0, dispatched("t1", 1)),
            (0, started("t1", 1)),
            (
                50,
                EventKind::TaskCompleted {
                    task: t("t1"),
                    attempt: 1,
                    handoff: Some(empty),
                    artifacts: Vec::new(),
                },
            ),
            (60, dispatched("t2", 1)),
            (60, started("t2", 1)),
            (
                90,
                EventKind::TaskFailed {
                    task: t("t2"),
                    attempt: 1,
                    reason: FailureReason::Blocked {
                        summary: "no grammar \u{1b}[2J given".into(),
                    },
                },
            ),
            (100, sweep(false)),
            (110, sweep(true)),
            (120, finished(RunOutcome::Failed)),
        ],
    );
    assert_eq!(r.tasks.empty_diffs, 1);
    assert_eq!(r.tasks.completed, 1);
    assert_eq!(r.tasks.failed, 1);
    assert_eq!(r.merges.sweeps, 2);
    assert_eq!(r.merges.red_sweeps, 1);
    assert_eq!(r.merges.queued, 0);
    assert_eq!(r.merges.success_rate, None);
    assert_eq!(r.left_for_user.blocked.len(), 1);
    assert_eq!(r.left_for_user.blocked[0].task, t("t2"));
    assert!(r.left_for_user.failed.is_empty());
    assert_eq!(r.state, "failed");
}

#[test]
fn a_decision_the_user_owes_is_left_for_them_until_given() {
    let asked = |id: &str| EventKind::AwaitingUserDecision { parent: t(id) };
    let r = report(
        1,
        vec![
            (0, added("t1")),
            (0, added("t2")),
            (5, asked("t1")),
            (6, asked("t2")),
            (7, EventKind::LandingAllowed { task: t("t2") }),
        ],
    );
    assert_eq!(r.left_for_user.awaiting_decision, vec![t("t1")]);
    assert_eq!(r.tasks.unfinished, 2);
}

#[test]
fn percentiles_are_nearest_rank() {
    let ten: Vec<u64> = (1..=10).map(|n| n * 100).collect();
    assert_eq!(percentile(&ten, 50), Some(500));
    assert_eq!(percentile(&ten, 90), Some(900));
    assert_eq!(percentile(&ten, 100), Some(1000));
    assert_eq!(percentile(&[7], 50), Some(7));
    assert_eq!(percentile(&[7], 90), Some(7));
    assert_eq!(percentile(&[], 50), None);
    let three = [10, 20, 30];
    assert_eq!(percentile(&three, 50), Some(20));
    assert_eq!(percentile(&three, 90), Some(30));
}

#[test]
fn the_largest_token_counts_costs_and_clock_values_saturate() {
    let huge = Budget::new(u64::MAX, Usd::from_micros(u64::MAX), u64::MAX);
    let usage = Usage {
        tokens_in: u64::MAX,
        tokens_out: u64::MAX,
        cost_usd: Usd::from_micros(u64::MAX),
    };
    let r = report(
        0,
        vec![
            (0, added("t1")),
            (0, dispatched("t1", 1)),
            (0, started("t1", 1)),
            (
                1,
                EventKind::SpendCharged {
                    task: t("t1"),
                    attempt: 1,
                    spent: huge,
                },
            ),
            (
                2,
                EventKind::SpendCharged {
                    task: t("t1"),
                    attempt: 1,
                    spent: huge,
                },
            ),
            (
                3,
                EventKind::PlannerResponded {
                    call: u32::MAX,
                    prompt: "p".into(),
                    content: "c".into(),
                    usage,
                    error: None,
                },
            ),
            (u64::MAX, landing("t1", 1, Handoff::complete("done"))),
            (u64::MAX, landed("t1", None)),
            // A clock that went backwards does not underflow.
            (5, finished(RunOutcome::Completed)),
        ],
    );
    assert_eq!(r.spent.tokens, u64::MAX);
    assert_eq!(r.spent.cost_usd, Usd::from_micros(u64::MAX));
    assert_eq!(r.planner_spent.tokens, u64::MAX);
    assert_eq!(r.subtrees[0].spent.tokens, u64::MAX);
    assert_eq!(r.makespan.work_ms, u64::MAX);
    // No slots configured counts as one.
    assert_eq!(r.makespan.worker_slots, 1);
    assert_eq!(r.makespan.lower_bound_ms, u64::MAX);
    assert_eq!(r.makespan.makespan_ms, 5);
    assert_eq!(r.task_time.max_ms, Some(u64::MAX));
}
