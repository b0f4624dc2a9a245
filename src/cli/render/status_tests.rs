use flotilla_actors::protocol::{
    AttemptFailure, Budget, Event, EventKind, FailureReason, GraphSnapshot, Priority, Role, RunId,
    RunOutcome, TaskId, TaskState, TaskView, Usd,
};

use super::*;
use crate::api::status::Counts;
use crate::cli::render::test_support::*;

/// A task's story says each attempt's spend once (its sixty per-call charges folded),
/// and every failure, retried ones too, in full.
#[test]
fn a_task_story_folds_charges_per_attempt_and_gives_every_reason_whole() {
    let run = RunId::generate();
    let task = TaskId::root(1);
    let long = format!(
        "codex: turn failed: {} the cause at the end",
        "x".repeat(200)
    );
    let charge = |seq, attempt| Event {
        seq,
        run,
        at_ms: seq * 1000,
        kind: EventKind::SpendCharged {
            task: task.clone(),
            attempt,
            spent: Budget::new(100, Usd::ZERO, 0),
        },
    };
    let mut events = vec![];
    for seq in 1..=3 {
        events.push(charge(seq, 1));
    }
    events.push(Event {
        seq: 4,
        run,
        at_ms: 4000,
        kind: EventKind::TaskRetried {
            task: task.clone(),
            attempt: 1,
            failure: AttemptFailure::Crashed {
                detail: long.clone(),
            },
            findings: Vec::new(),
        },
    });
    events.push(charge(5, 2));
    events.push(Event {
        seq: 6,
        run,
        at_ms: 6000,
        kind: EventKind::TaskFailed {
            task: task.clone(),
            attempt: 2,
            reason: FailureReason::AgentFailed {
                failure: AttemptFailure::Crashed {
                    detail: long.clone(),
                },
            },
        },
    });
    let story = TaskStory {
        run: run.to_string(),
        task,
        events,
        omitted: 0,
    };
    let text = task_story_text(&story, &Style::plain());
    let spend: Vec<&str> = text.lines().filter(|l| l.contains(" spent ")).collect();
    assert_eq!(spend.len(), 2, "{text}");
    assert!(
        spend[0].ends_with("t1 attempt 1 spent 300 tokens (3 charges)"),
        "{text}"
    );
    assert!(
        spend[1].ends_with("t1 attempt 2 spent 100 tokens"),
        "{text}"
    );
    let order: Vec<usize> = ["attempt 1 failed", "attempt 1 spent", "attempt 2 spent"]
        .iter()
        .map(|needle| text.find(needle).expect(needle))
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
    let whole = text
        .lines()
        .filter(|l| l.contains("the cause at the end"))
        .count();
    assert_eq!(whole, 2, "both reasons whole: {text}");
}

fn hostile_status() -> RunStatus {
    let task = |n: u32, state, failure| TaskView {
        id: TaskId::root(n),
        state,
        attempt: 1,
        description: HOSTILE.into(),
        scope: vec![HOSTILE.into()],
        priority: Priority::default(),
        parent: None,
        depends_on: vec![],
        budget: Budget::default(),
        spent: Budget::default(),
        summary: Some(HOSTILE.into()),
        failure,
        review: None,
    };
    RunStatus {
        id: RunId::generate().to_string(),
        request: HOSTILE.into(),
        repo: HOSTILE.into(),
        created_ms: 0,
        state: "failed".into(),
        counts: Counts::default(),
        last_seq: 1,
        awaiting_decision: vec![],
        main_diverged: Some(crate::api::status::MainDivergence {
            expected: HOSTILE.into(),
            actual: HOSTILE.into(),
        }),
        provider_pauses: vec![crate::api::status::ProviderPause {
            provider: HOSTILE.into(),
            role: Role::Worker,
            task: Some(TaskId::root(1)),
            until_ms: u64::MAX,
            why: HOSTILE.into(),
        }],
        graph: GraphSnapshot {
            tasks: vec![
                task(1, TaskState::Completed, None),
                task(
                    2,
                    TaskState::Failed,
                    Some(FailureReason::AgentFailed {
                        failure: AttemptFailure::Crashed {
                            detail: HOSTILE.into(),
                        },
                    }),
                ),
            ],
            planning_finished: true,
            outcome: Some(RunOutcome::Failed),
            run_spent: Budget::default(),
            run_budget: Budget::default(),
            finish_reason: Some(HOSTILE.into()),
        },
        problem: Some(HOSTILE.into()),
        sandbox: Some(HOSTILE.into()),
        warm: Some(HOSTILE.into()),
        pool: Some(HOSTILE.into()),
        branch: Some(HOSTILE.into()),
        main_untested: true,
        damage_noted: false,
    }
}

/// ADR-032: a run nothing tests says so once, with where to set a gate; one that is tested
/// says nothing of it.
#[test]
fn status_says_once_that_main_moves_untested_and_how_to_set_a_gate() {
    let mut status = hostile_status();
    let text = status_text(&status, &Style::plain());
    let said: Vec<&str> = text.lines().filter(|l| l.contains("untested")).collect();
    assert_eq!(said.len(), 1, "{text}");
    assert!(
        said[0].starts_with("gate:    none: main moves untested"),
        "{text}"
    );
    assert!(
        said[0].contains("[merge] gate = [\"cargo test\"]"),
        "{text}"
    );
    assert!(said[0].contains("docs/configuration.md"), "{text}");
    status.main_untested = false;
    let text = status_text(&status, &Style::plain());
    assert!(
        !text.contains("untested") && !text.contains("gate:"),
        "{text}"
    );
}

#[test]
fn status_escapes_everything_and_says_why_a_task_failed_in_words() {
    let text = status_text(&hostile_status(), &Style::plain());
    assert_safe(&text, true);
    assert!(text.contains("problem: ok"), "{text}");
    assert!(text.contains("why:     ok"), "{text}");
    let failed = text.lines().find(|l| l.contains("t2 [failed]")).unwrap();
    assert!(
        failed.contains("failed: the agent crashed: ok"),
        "the reason in words, not Debug: {failed}"
    );
    assert!(!failed.contains("AgentFailed"), "{failed}");
}

#[test]
fn status_says_states_in_words_and_spending_as_the_budgets_count_it() {
    let mut status = hostile_status();
    status.graph.tasks[0].state = TaskState::WaitingForSubtasks;
    let mut waiting = status.graph.tasks[0].clone();
    waiting.id = TaskId::root(3);
    status.graph.tasks.push(waiting);
    status.awaiting_decision = vec![TaskId::root(1)];
    status.graph.run_spent = Budget::new(1234, Usd::from_micros(5_000), 447_000);
    status.graph.run_budget = Budget::new(10_000, Usd::from_micros(1_000_000), 3_600_000);
    let text = status_text(&status, &Style::plain());
    assert!(text.contains("t1 [awaiting your decision]"), "{text}");
    assert!(text.contains("t3 [waiting for subtasks]"), "{text}");
    assert!(!text.contains("waiting_for_subtasks"), "{text}");
    assert!(
        text.contains(
            "spent:   1234 tokens · $0.0050 · 7m27s agent time\n\
             budget:  10000 tokens · $1.0000 · 1h00m agent time\n"
        ),
        "{text}"
    );
}
