use flotilla_actors::protocol::RunId;

use super::*;
use crate::cli::render::test_support::*;

fn summary(id: &str, request: &str) -> RunSummary {
    RunSummary {
        id: id.into(),
        request: request.into(),
        repo: "/r".into(),
        created_ms: 0,
        state: "running".into(),
        problem: None,
    }
}

#[test]
fn runs_and_daemon_status_escape_requests_and_problems() {
    let mut run = summary(&RunId::generate().to_string(), HOSTILE);
    run.problem = Some(HOSTILE.into());
    assert_safe(&runs_text(std::slice::from_ref(&run)), true);
    assert_safe(&daemon_text(HOSTILE, &[run]), true);
}

#[test]
fn daemon_status_lists_damaged_and_paused_runs_with_their_problem() {
    let mut damaged = summary("01a20163-c6be-7585-89dc-6c22ed29ed73", "broken");
    damaged.state = "damaged".into();
    damaged.problem = Some("damaged: journal entry 6 is unreadable".into());
    let mut paused = summary("01b00000-0000-7000-8000-000000000000", "paused");
    paused.problem = Some("the journal could not be written: disk full".into());
    let mut done = summary("01c00000-0000-7000-8000-000000000000", "done");
    done.state = "completed".into();
    let text = daemon_text("sock", &[damaged, paused, done]);
    assert!(
        text.contains("runs: 3 in total, 1 running, 1 damaged"),
        "{text}"
    );
    assert!(
        text.contains("damaged    broken  (damaged: journal entry 6 is unreadable)"),
        "{text}"
    );
    assert!(
        text.contains("running    paused  (the journal could not be written: disk full)"),
        "{text}"
    );
    assert!(!text.contains("done"), "{text}");
}

#[test]
fn runs_prints_the_shortest_unique_prefix_of_at_least_eight() {
    let ids = [
        "01a20163-c6be-7585-89dc-6c22ed29ed73",
        "01a20163-c6bf-7000-89dc-6c22ed29ed73",
        "01a20163-d000-7000-89dc-6c22ed29ed73",
        "01b00000-0000-7000-8000-000000000000",
    ];
    assert_eq!(
        unique_prefixes(&ids, 8),
        ["01a20163-c6be", "01a20163-c6bf", "01a20163-d", "01b00000"]
    );
    let runs: Vec<RunSummary> = ids.iter().map(|id| summary(id, "x")).collect();
    let text = runs_text(&runs);
    assert!(text.starts_with("01a20163-c6be  running"), "{text}");
    assert!(text.contains("\n01a20163-d     running"), "{text}");
    // Never a trailing dash, and a duplicate is printed whole.
    assert_eq!(
        unique_prefixes(&["abcdefgh-1", "abcdefgh-2"], 8),
        ["abcdefgh-1", "abcdefgh-2"]
    );
    assert_eq!(unique_prefixes(&["abc", "abc"], 8), ["abc", "abc"]);
}
