//! Retries that know why (ADR-031), through the real daemon: the scripted agent's steps say
//! what their task message must contain (`expect_in_task`), and crash, so that the task
//! never lands, if it does not. Attempt 2 is told of attempt 1's out-of-scope files,
//! attempt 3 of attempt 2's gate output; and after a SIGKILL of the daemon, the attempt
//! after the interrupted one is still told of the failure before it.

use std::time::Duration;

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
    until_attempt_starts(&client, &run, 2, &daemon).await;
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

// Each kind of agent reads the section in the message that starts its task.

/// Attempt 2 of t1, told that attempt 1 failed the gate and wrote outside its scope.
fn retry_assignment() -> Assignment {
    let failure = AttemptFailure::GateFailed {
        command: "make test".into(),
        output_tail: "FAIL: parse_empty\u{1b}[0m\n".into(),
    };
    let findings = [Finding::OutOfScope {
        paths: vec!["Makefile".into()],
    }];
    let mut task = crate::harness::ready(
        "t1",
        crate::harness::spec("Write the parser", &["src"]),
        1,
        1,
    );
    task.attempt = 2;
    task.previous = Some(std::sync::Arc::new(PreviousAttempt::new(
        1, &failure, &findings,
    )));
    let run = RunId::generate();
    Assignment {
        run,
        branch: branch_name(run, &task.task, 2),
        task,
        profile: "general".into(),
        route: Route::Worker,
    }
}

fn assert_told(message: &str) {
    for part in [
        "Write the parser",
        "## Previous attempt (1) failed",
        "### The merge gate failed: `make test`",
        "FAIL: parse_empty\n",
        "- Makefile\n",
    ] {
        assert!(
            message.contains(part),
            "{part:?} is missing from:\n{message}"
        );
    }
    assert!(!message.contains('\u{1b}'), "escapes never reach an agent");
}

#[actix::test]
async fn the_builtin_agents_first_message_tells_the_retry_why() {
    use flotilla::agents::builtin::{BuiltinAgent, BuiltinConfig};
    use flotilla::scripted::{Scenario, ScriptedLlm};
    use flotilla_actors::ports::{Agent, AttemptContext, ChatRole, Workspace};

    let scenario = "[[worker.t1.answers]]\ntool_calls = [{ name = \"finish\", arguments = { status = \"complete\", summary = \"s\" } }]\n";
    let llm = std::sync::Arc::new(ScriptedLlm::new(Scenario::from_toml(scenario).unwrap()));
    let agent = BuiltinAgent::new(
        llm.clone(),
        std::sync::Arc::new(crate::process::unsandboxed()),
        "You are a worker.".into(),
        BuiltinConfig::default(),
    );
    let dir = tempfile::tempdir().unwrap();
    let mut session = agent.open(
        Workspace::scratch(dir.path().into()),
        AttemptContext::detached(),
    );
    session.run(retry_assignment()).await.unwrap();
    let first = llm.requests().remove(0);
    let task = first
        .messages
        .iter()
        .find(|m| m.role == ChatRole::User)
        .expect("a task message");
    assert_told(&task.content);
}

#[actix::test]
async fn a_command_agents_prompt_tells_the_retry_why() {
    use flotilla::agents::command::{CommandAgent, CommandAgentConfig};
    use flotilla_actors::ports::{Agent, AttemptContext, Workspace};

    const FAKE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fake-agent.sh");
    let prompts = tempfile::tempdir().unwrap();
    let prompt_file = prompts.path().join("prompt");
    let config = CommandAgentConfig {
        program: Some("sh".into()),
        args: Some(vec![
            FAKE.into(),
            "prompt".into(),
            prompt_file.to_string_lossy().into_owned(),
        ]),
        ..CommandAgentConfig::default()
    };
    // The fake reports its prompt through a file outside the worktree: unsandboxed.
    let agent = CommandAgent::new(
        "fake".into(),
        config,
        std::sync::Arc::new(crate::process::unsandboxed()),
        "You are a worker.".into(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut session = agent.open(
        Workspace::scratch(dir.path().into()),
        AttemptContext::detached(),
    );
    tokio::time::timeout(Duration::from_secs(60), session.run(retry_assignment()))
        .await
        .unwrap()
        .unwrap();
    assert_told(&std::fs::read_to_string(&prompt_file).unwrap());
}

#[actix::test]
async fn the_scripted_agent_records_what_the_retry_was_told() {
    use flotilla::scripted::{AgentCall, Scenario, ScriptedAgent};
    use flotilla_actors::ports::{Agent, AttemptContext, Workspace};

    let agent = ScriptedAgent::new(Scenario::from_toml("[tasks.t1]\nsummary = \"ok\"\n").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let mut session = agent.open(
        Workspace::scratch(dir.path().into()),
        AttemptContext::detached(),
    );
    let assignment = retry_assignment();
    session.run(assignment.clone()).await.unwrap();
    let [
        AgentCall::Run {
            attempt,
            previous,
            task_text,
            ..
        },
    ] = &agent.calls()[..]
    else {
        panic!("{:?}", agent.calls());
    };
    assert_eq!(*attempt, 2);
    assert_eq!(previous, &assignment.task.previous);
    assert_told(task_text);
}
