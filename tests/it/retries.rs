//! Retries that know why (ADR-031), through the real daemon: the scripted agent's steps say
//! what their task message must contain (`expect_in_task`), and crash, so that the task
//! never lands, if it does not. Attempt 2 is told of attempt 1's out-of-scope files,
//! attempt 3 of attempt 2's gate output; and after a SIGKILL of the daemon, the attempt
//! after the interrupted one is still told of the failure before it.

use std::time::Duration;

use futures::StreamExt;

use flotilla_actors::protocol::*;

use crate::daemon_env::*;

/// A gate that prints what it refuses: every line with BROKEN in it.
const GATE: &str = "! grep -rn --exclude-dir=.git BROKEN .";

/// t1, scope `src/a.txt`: attempt 1 also writes README.md (outside its scope), attempt 2
/// writes what the gate refuses, attempt 3 the real thing. Each later attempt expects its
/// predecessor's failure in its task message.
const OUT_OF_SCOPE_THEN_GATE: &str = r####"
[[planner.answers]]
tasks = [{ description = "write a", scope = ["src/a.txt"], acceptance = "src/a.txt says a" }]

[[tasks.t1.attempts]]
writes = { "src/a.txt" = "a\n", "README.md" = "mine now\n" }

[[tasks.t1.attempts]]
expect_in_task = [
  "## Previous attempt (1) failed",
  "### Files it changed outside your scope",
  "- README.md\n",
]
writes = { "src/a.txt" = "BROKEN: fails the gate\n" }

[[tasks.t1.attempts]]
expect_in_task = [
  "## Previous attempt (2) failed",
  "### The merge gate failed: `! grep -rn --exclude-dir=.git BROKEN .",
  "src/a.txt:1:BROKEN: fails the gate",
]
writes = { "src/a.txt" = "a\n" }
"####;

fn retried(events: &[Event]) -> Vec<(u32, AttemptFailure)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TaskRetried {
                attempt, failure, ..
            } => Some((*attempt, failure.clone())),
            _ => None,
        })
        .collect()
}

/// t1's work of `attempt` was delivered, and t1 landed.
fn landed_on(events: &[Event], attempt: u32) -> bool {
    let t1 = |task: &TaskId| task.to_string() == "t1";
    let delivered = events.iter().any(
        |e| matches!(&e.kind, EventKind::TaskLanding { task, attempt: a, .. } if t1(task) && *a == attempt),
    );
    let landed = events
        .iter()
        .any(|e| matches!(&e.kind, EventKind::TaskLanded { task, .. } if t1(task)));
    delivered && landed
}

#[tokio::test]
async fn the_out_of_scope_list_and_the_gate_tail_reach_the_next_attempts_agent() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let mut config = run_config(OUT_OF_SCOPE_THEN_GATE, 1);
    config["merge"]["gate"] = serde_json::json!([GATE]);
    config["limits"]["max_attempts"] = serde_json::json!(3);
    let run = submit(&daemon.client, repo.path(), config).await;
    let events = follow_to_end(&daemon.client, &run, None).await;

    let retries = retried(&events);
    assert!(
        matches!(&retries[..], [
            (1, AttemptFailure::OutOfScope { paths }),
            (2, AttemptFailure::GateFailed { .. }),
        ] if paths == &["README.md".to_string()]),
        "an unmet expectation would be a crash here: {retries:?}"
    );
    assert!(landed_on(&events, 3), "attempt 3 was told why and landed");
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
}

/// Attempt 1 fails the gate; attempt 2 hangs until the daemon is killed; attempt 3, on the
/// restarted daemon, must still be told of attempt 1's gate output.
const GATE_THEN_KILL: &str = r####"
[[planner.answers]]
tasks = [{ description = "write a", scope = ["src/a.txt"], acceptance = "src/a.txt says a" }]

[[tasks.t1.attempts]]
writes = { "src/a.txt" = "BROKEN: fails the gate\n" }

[[tasks.t1.attempts]]
outcome = "hang"

[[tasks.t1.attempts]]
expect_in_task = [
  "## Previous attempt (1) failed",
  "src/a.txt:1:BROKEN: fails the gate",
]
writes = { "src/a.txt" = "a\n" }
"####;

#[tokio::test]
async fn after_a_sigkill_the_next_attempt_is_still_told_of_the_failure_before() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let daemon = DaemonProcess::start(state.path());
    let client = DaemonProcess::client(state.path());
    let mut config = run_config(GATE_THEN_KILL, 1);
    config["merge"]["gate"] = serde_json::json!([GATE]);
    config["limits"]["max_attempts"] = serde_json::json!(2);
    let run = submit(&client, repo.path(), config).await;

    // Attempt 2 is at work (hanging): the failure of attempt 1 is journaled.
    let mut stream = client.events(&run, None).await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(event) = stream.next().await {
            if matches!(
                event.unwrap().kind,
                EventKind::TaskStarted { attempt: 2, .. }
            ) {
                return;
            }
        }
        panic!("the stream ended before attempt 2 started");
    })
    .await
    .unwrap_or_else(|_| panic!("attempt 2 did not start; log:\n{}", daemon.log()));
    drop(stream);
    daemon.kill();

    let daemon = DaemonProcess::start(state.path());
    let events = follow_to_end(&client, &run, None).await;
    let interrupted = events
        .iter()
        .any(|e| matches!(e.kind, EventKind::TaskInterrupted { attempt: 2, .. }));
    assert!(interrupted, "the kill interrupted attempt 2");
    assert!(
        matches!(
            &retried(&events)[..],
            [(1, AttemptFailure::GateFailed { .. })]
        ),
        "{:?}; log:\n{}",
        retried(&events),
        daemon.log()
    );
    assert!(landed_on(&events, 3), "attempt 3 was told why and landed");
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
}
