use flotilla_actors::protocol::{Budget, TaskId, Usd};

use super::report_text;
use crate::api::report::{
    LeftForUser, Makespan, MergeCounts, Percentiles, RunReport, Subtree, TaskCounts, TaskNote,
};
use crate::cli::render::test_support::{HOSTILE, assert_safe};

fn sample() -> RunReport {
    RunReport {
        id: "0190-run".into(),
        request: format!("fix it {HOSTILE}"),
        state: "failed".into(),
        reason: Some(format!("because {HOSTILE}")),
        tasks: TaskCounts {
            total: 3,
            fix_tasks: 1,
            completed: 2,
            completed_first_try: 1,
            retried: 1,
            retries: 2,
            failed: 1,
            ..TaskCounts::default()
        },
        merges: MergeCounts {
            queued: 4,
            landed: 1,
            landed_via_fix: 1,
            conflicts: 1,
            conflict_fixes: 1,
            conflict_fixes_completed: 1,
            gate_failures: 2,
            success_rate: Some(0.5),
            ..MergeCounts::default()
        },
        spent: Budget::new(u64::MAX, Usd::from_micros(1_500_000), 0),
        planner_spent: Budget::new(10, Usd::from_micros(0), 0),
        task_time: Percentiles {
            measure: "m".into(),
            count: 2,
            p50_ms: Some(1_500),
            p90_ms: Some(3_000),
            max_ms: Some(3_000),
        },
        subtrees: vec![Subtree {
            root: TaskId::root(1),
            description: format!("lexer {HOSTILE}"),
            tasks: 2,
            completed: 2,
            failed: 0,
            spent: Budget::default(),
            span_ms: Some(4_000),
        }],
        makespan: Makespan {
            makespan_ms: 10_000,
            lower_bound: "b".into(),
            lower_bound_ms: 4_000,
            work_ms: 8_000,
            longest_attempt_ms: 3_000,
            worker_slots: 2,
        },
        left_for_user: LeftForUser {
            failed: vec![TaskNote {
                task: TaskId::root(2),
                why: format!("crashed {HOSTILE}"),
            }],
            blocked: Vec::new(),
            awaiting_decision: vec![TaskId::root(3)],
            main_diverged: true,
        },
    }
}

#[test]
fn the_report_says_counts_rates_times_and_what_is_left_and_escapes_model_text() {
    let text = report_text(&sample());
    assert_safe(&text, true);
    assert!(text.contains("Run 0190-run failed: fix it"), "{text}");
    assert!(
        text.contains("3 (1 fix task) · 2 completed, 1 first try"),
        "{text}"
    );
    assert!(text.contains("1 retried (2 retries)"), "{text}");
    assert!(text.contains("(50% of queued branches landed)"), "{text}");
    assert!(text.contains("2 gate failures"), "{text}");
    assert!(text.contains("p50 1.5s · p90 3.0s"), "{text}");
    assert!(
        text.contains("Makespan: 10s against a lower bound of 4.0s, 2.5×"),
        "{text}"
    );
    assert!(text.contains(&format!("{} tokens", u64::MAX)), "{text}");
    assert!(text.contains("  t1 lexer"), "{text}");
    assert!(text.contains("t2 failed: crashed"), "{text}");
    assert!(text.contains("t3 waits for your decision"), "{text}");
    assert!(text.contains("--adopt-main"), "{text}");
}

#[test]
fn a_clean_run_leaves_nothing_and_a_zero_bound_has_no_ratio() {
    let mut r = sample();
    r.left_for_user = LeftForUser::default();
    r.makespan.lower_bound_ms = 0;
    r.merges.queued = 0;
    let text = report_text(&r);
    assert!(text.contains("Left for you: nothing."), "{text}");
    assert!(!text.contains('×'), "{text}");
    assert!(!text.contains("% of queued"), "{text}");
}
