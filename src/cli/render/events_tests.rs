use flotilla_actors::protocol::{
    AttemptFailure, Budget, Event, EventKind, FailureReason, Finding, Handoff, HandoffMetrics,
    HandoffStatus, Role, Route, RunId, RunOutcome, TaskId, TaskSpec, TaskState, Usage, Usd,
};

use super::*;
use crate::cli::render::test_support::*;
use crate::text_safety::{is_unsafe_for_terminal, json_line};

#[test]
fn a_charge_names_only_what_was_spent() {
    let tokens = Budget::new(1000, Usd::ZERO, 0);
    let time = Budget::new(0, Usd::ZERO, 152);
    let both = Budget::new(7, Usd::from_micros(1_500), 3);
    assert_eq!(charge_words(&tokens), "1000 tokens");
    assert_eq!(charge_words(&time), "152 ms");
    assert_eq!(charge_words(&both), "7 tokens, $0.0015, 3 ms");
    assert_eq!(charge_words(&Budget::default()), "0 ms");
}

/// The fold keeps charges of other tasks open, and a run's end says them all.
#[test]
fn spend_fold_says_an_attempt_when_it_ends_and_the_rest_at_the_run_end() {
    let mut fold = SpendFold::default();
    let charge = |task: u32| EventKind::SpendCharged {
        task: TaskId::root(task),
        attempt: 1,
        spent: Budget::new(5, Usd::ZERO, 0),
    };
    assert!(fold.absorb(&charge(1)));
    assert!(fold.absorb(&charge(2)));
    assert!(!fold.absorb(&EventKind::PlanningFinished));
    let t1_done = EventKind::TaskInterrupted {
        task: TaskId::root(1),
        attempt: 1,
    };
    assert_eq!(fold.ended(&t1_done), vec!["t1 attempt 1 spent 5 tokens"]);
    assert!(fold.ended(&t1_done).is_empty());
    assert!(fold.ended(&EventKind::PlanningFinished).is_empty());
    let finished = EventKind::RunFinished {
        outcome: RunOutcome::Completed,
        reason: None,
    };
    assert_eq!(fold.ended(&finished), vec!["t2 attempt 1 spent 5 tokens"]);
}

fn hostile_events() -> Vec<EventKind> {
    let task = TaskId::root(1);
    let mut spec = TaskSpec::new(HOSTILE, &[HOSTILE]);
    spec.acceptance = HOSTILE.into();
    vec![
        EventKind::ProviderPaused {
            role: Role::Worker,
            task: Some(task.clone()),
            provider: HOSTILE.into(),
            wait_ms: 60_000,
        },
        EventKind::RunStarted {
            request: HOSTILE.into(),
            sandbox: Some(HOSTILE.into()),
        },
        EventKind::PlannerResponded {
            call: 0,
            prompt: HOSTILE.into(),
            content: HOSTILE.into(),
            usage: Usage::default(),
            error: Some(HOSTILE.into()),
        },
        EventKind::PlannerGaveUp {
            error: HOSTILE.into(),
        },
        EventKind::TaskAdded {
            task: task.clone(),
            spec,
            budget: Budget::default(),
            depends_on: vec![],
        },
        EventKind::TaskDispatched {
            task: task.clone(),
            attempt: 1,
            profile: HOSTILE.into(),
            route: Route::Worker,
        },
        EventKind::TaskRetried {
            task: task.clone(),
            attempt: 1,
            failure: AttemptFailure::Crashed {
                detail: HOSTILE.into(),
            },
            findings: Vec::new(),
        },
        EventKind::TaskCompleted {
            task: task.clone(),
            attempt: 2,
            handoff: Some(Handoff {
                status: HandoffStatus::Complete,
                summary: HOSTILE.into(),
                files_changed: vec![HOSTILE.into()],
                concerns: vec![HOSTILE.into()],
                suggestions: vec![],
                metrics: HandoffMetrics::default(),
                build_exit_code: None,
                work: None,
                findings: vec![Finding::VerificationFailed {
                    command: HOSTILE.into(),
                    exit: HOSTILE.into(),
                    output_tail: HOSTILE.into(),
                }],
            }),
            artifacts: vec![],
        },
        EventKind::TaskFailed {
            task: task.clone(),
            attempt: 1,
            reason: FailureReason::Blocked {
                summary: HOSTILE.into(),
            },
        },
        EventKind::TaskCancelled {
            task: task.clone(),
            was: TaskState::Running,
            reason: HOSTILE.into(),
        },
        EventKind::MessageIgnored {
            task: Some(task),
            message: HOSTILE.into(),
            why: HOSTILE.into(),
        },
        EventKind::RunCancelRequested {
            reason: HOSTILE.into(),
        },
        EventKind::RunFinished {
            outcome: RunOutcome::Failed,
            reason: Some(HOSTILE.into()),
        },
        EventKind::ProviderPauseStarted {
            provider: HOSTILE.into(),
            role: Role::Planner,
            task: Some(TaskId::root(3)),
            until_ms: u64::MAX,
            why: HOSTILE.into(),
        },
        EventKind::ProviderResumed {
            provider: HOSTILE.into(),
        },
    ]
}

#[test]
fn tail_and_submit_lines_escape_what_models_and_users_wrote() {
    for kind in hostile_events() {
        let event = Event {
            seq: 1,
            run: RunId::generate(),
            at_ms: 0,
            kind,
        };
        for style in [
            Style::plain(),
            Style {
                color: true,
                live: true,
            },
        ] {
            let line = event_line(&event, &style);
            // Colour codes are flotilla's own: strip them, then nothing may remain.
            let uncoloured = ["\x1b[0m", "\x1b[1m", "\x1b[2m", "\x1b[31m", "\x1b[32m"]
                .iter()
                .fold(line.clone(), |l, code| l.replace(code, ""));
            assert_safe(&uncoloured, false);
        }
        let json = json_line(&event);
        assert!(!json.chars().any(is_unsafe_for_terminal), "{json:?}");
    }
}

#[test]
fn a_notice_has_no_seq_and_says_its_problem_once() {
    let line = event_line(
        &event(
            0,
            0,
            EventKind::JournalUnavailable {
                error: format!(
                    "the journal could not be written: journal storage failed: {HOSTILE}"
                ),
            },
        ),
        &Style::plain(),
    );
    assert!(line.starts_with("00:00:00 #-     run paused"), "{line}");
    assert_eq!(line.matches("could not be written").count(), 1, "{line}");
    assert_eq!(line.matches("cannot be written").count(), 0, "{line}");
    assert!(line.contains("\\x1b]0;pwned"), "escaped: {line}");
}
