//! What an agent may not deliver (ADR-016): a change to flotilla's own configuration waits
//! for the user's decision and lands only when the user lets it; the run's gate is the one
//! of the config it was submitted with, whatever the candidate or main say.

use std::time::Duration;

use futures::StreamExt;
use hyper::{Method, StatusCode};

use flotilla::config::RunConfig;
use flotilla::scripted::Scenario;
use flotilla_actors::protocol::*;

use crate::daemon_env::*;

/// t1 rewrites flotilla.toml to a gate that always fails and a sweep that touches
/// `marker`; t2 (after it) changes code.
fn changes_the_config(marker: &std::path::Path) -> String {
    format!(
        r#"
[[planner.answers]]
tasks = [
  {{ description = "tune the config", scope = ["flotilla.toml"] }},
  {{ description = "code", scope = ["src"], depends_on = [0] }},
]
[tasks.t1]
writes = {{ "flotilla.toml" = "[merge]\ngate = [\"false\"]\n[reconciler]\ntest = \"touch {marker}\"\n" }}
[tasks.t2]
writes = {{ "src/lib.rs" = "pub fn x() {{}}\n" }}
"#,
        marker = marker.display()
    )
}

/// The run's config: the scenario above and a gate that passes.
fn config(marker: &std::path::Path) -> serde_json::Value {
    let mut config = RunConfig {
        scenario: Scenario::from_toml(&changes_the_config(marker)).unwrap(),
        ..RunConfig::default()
    };
    config.limits.max_workers = 2;
    config.limits.max_nodes = 1_000;
    config.merge.gate = vec!["true".into()];
    serde_json::to_value(config).unwrap()
}

async fn decide(
    c: &flotilla::cli::client::Client,
    run: &str,
    task: &str,
    body: serde_json::Value,
) -> (StatusCode, serde_json::Value) {
    let path = format!("/v1/runs/{run}/tasks/{task}/decision");
    let (status, answer) = c
        .raw(
            Method::POST,
            &path,
            Some(serde_json::to_vec(&body).unwrap()),
        )
        .await
        .unwrap();
    (status, serde_json::from_slice(&answer).unwrap())
}

fn main_file(repo: &std::path::Path, path: &str) -> Option<String> {
    let git = git2::Repository::open(repo).unwrap();
    let tree = git
        .find_reference("refs/heads/main")
        .unwrap()
        .peel_to_tree()
        .unwrap();
    let entry = tree.get_path(std::path::Path::new(path)).ok()?;
    let blob = entry.to_object(&git).unwrap().peel_to_blob().unwrap();
    Some(String::from_utf8_lossy(blob.content()).into_owned())
}

/// Waits for `AwaitingUserDecision` for `task` on the stream.
async fn asked(
    stream: &mut (
             impl futures::Stream<Item = Result<Event, flotilla::cli::client::ClientError>> + Unpin
         ),
) -> TaskId {
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(e) = stream.next().await {
            if let EventKind::AwaitingUserDecision { parent } = e.unwrap().kind {
                return parent;
            }
        }
        panic!("the stream ended before a decision was asked for")
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_change_to_flotillas_config_waits_for_the_user_and_lands_only_when_allowed() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let c = &daemon.client;
    let outside = tempfile::tempdir().unwrap();
    let marker = outside.path().join("swept-by-mains-config");
    let run = submit(c, repo.path(), config(&marker)).await;
    let mut stream = c.events(&run, None).await.unwrap();
    assert_eq!(asked(&mut stream).await.to_string(), "t1");

    // Held: nothing of it on main, the status says it waits, the finding says why.
    let status: serde_json::Value = c.get(&format!("/v1/runs/{run}")).await.unwrap();
    assert_eq!(
        status["awaiting_decision"],
        serde_json::json!(["t1"]),
        "{status}"
    );
    assert_eq!(main_file(repo.path(), "flotilla.toml"), None);
    let t1 = status["graph"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "t1")
        .unwrap()
        .clone();
    assert_eq!(t1["state"], "landing", "{t1}");

    // The wrong decisions are refused; --land lets it go.
    let (code, answer) = decide(c, &run, "t1", serde_json::json!({"decision": "complete"})).await;
    assert_eq!(code, StatusCode::CONFLICT, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("--land"),
        "{answer}"
    );
    let (code, answer) = decide(c, &run, "t1", serde_json::json!({"decision": "land"})).await;
    assert_eq!(code, StatusCode::ACCEPTED, "{answer}");

    let rest: Vec<Event> = tokio::time::timeout(
        Duration::from_secs(120),
        stream.map(|e| e.unwrap()).collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    // It landed, and t2 landed after it through the run's own gate (`true`), not the
    // `false` that main's flotilla.toml now names: a run's commands are its snapshot's.
    assert_eq!(outcome(&rest), Some(RunOutcome::Completed), "{rest:#?}");
    assert!(
        main_file(repo.path(), "flotilla.toml")
            .unwrap()
            .contains("gate = [\"false\"]")
    );
    assert_eq!(
        main_file(repo.path(), "src/lib.rs").as_deref(),
        Some("pub fn x() {}\n")
    );
    assert!(rest.iter().any(
        |e| matches!(&e.kind, EventKind::LandingAllowed { task } if task.to_string() == "t1")
    ));
    assert!(
        !marker.exists(),
        "the final sweep ran main's flotilla.toml instead of the run's config"
    );
    daemon.stop();
}

#[tokio::test]
async fn a_held_change_to_flotillas_config_that_the_user_fails_never_lands() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let c = &daemon.client;
    let outside = tempfile::tempdir().unwrap();
    let marker = outside.path().join("swept-by-mains-config");
    let run = submit(c, repo.path(), config(&marker)).await;
    let mut stream = c.events(&run, None).await.unwrap();
    assert_eq!(asked(&mut stream).await.to_string(), "t1");
    let (code, answer) = decide(c, &run, "t1", serde_json::json!({"decision": "fail"})).await;
    assert_eq!(code, StatusCode::ACCEPTED, "{answer}");
    let rest: Vec<Event> = tokio::time::timeout(
        Duration::from_secs(120),
        stream.map(|e| e.unwrap()).collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    assert_eq!(outcome(&rest), Some(RunOutcome::Failed));
    assert!(rest.iter().any(|e| matches!(
        &e.kind,
        EventKind::TaskFailed { task, reason: FailureReason::UserDeclined, .. } if task.to_string() == "t1"
    )));
    assert_eq!(
        main_file(repo.path(), "flotilla.toml"),
        None,
        "nothing landed"
    );
    daemon.stop();
}

/// The marker keys: in the daemon's environment only.
const MARKER: &str = "flotilla-marker-5e1b7c";

/// Every file under `dir`, read whole, with its path.
fn files_under(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(path),
                Ok(t) if t.is_file() => {
                    if let Ok(bytes) = std::fs::read(&path) {
                        found.push((path, bytes));
                    }
                }
                _ => {}
            }
        }
    }
    found
}

fn holds_marker(bytes: &[u8]) -> bool {
    bytes.windows(MARKER.len()).any(|w| w == MARKER.as_bytes())
}

/// An agent that goes for the keys (`env`, the daemon's `/proc/PID/environ`, every
/// process's) gets none of them into git, the journal, the daemon's log or its output
/// (M8 item 8, ADR-015/016): the sandbox hides the daemon's processes, the daemon is not
/// dumpable, and commands get a scrubbed environment.
#[tokio::test]
async fn a_marker_key_in_the_daemons_environment_reaches_no_git_object_journal_log_or_output() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let daemon = DaemonProcess::start_with_env(
        state.path(),
        &[("OPENAI_API_KEY", MARKER), ("ANTHROPIC_API_KEY", MARKER)],
    );
    let client = DaemonProcess::client(state.path());
    let scenario = r#"
[[planner.answers]]
tasks = [{ description = "look around", scope = ["src"] }]
[tasks.t1]
writes = { "src/lib.rs" = "pub fn x() {}\n" }
run = "mkdir -p src; env > src/env.txt; cat /proc/$PPID/environ > src/parent.txt; cat /proc/*/environ > src/all.txt; cat /proc/$PPID/environ; env; cat /proc/*/environ; true"
"#;
    let run = submit(&client, repo.path(), run_config(scenario, 1)).await;
    let events = follow_to_end(&client, &run, None).await;
    assert!(outcome(&events).is_some(), "the run ended");

    let git = git2::Repository::open(repo.path()).unwrap();
    let odb = git.odb().unwrap();
    let mut leaked = Vec::new();
    odb.foreach(|id| {
        if holds_marker(odb.read(*id).unwrap().data()) {
            leaked.push(format!("git object {id}"));
        }
        true
    })
    .unwrap();
    for (path, bytes) in files_under(state.path()) {
        if holds_marker(&bytes) {
            leaked.push(format!("state file {}", path.display()));
        }
    }
    for event in &events {
        if holds_marker(serde_json::to_string(event).unwrap().as_bytes()) {
            leaked.push(format!("event #{} {}", event.seq, event.kind.name()));
        }
    }
    if holds_marker(daemon.log().as_bytes()) {
        leaked.push("the daemon's log".into());
    }
    assert!(leaked.is_empty(), "the marker key leaked into: {leaked:#?}");
    daemon.kill();
}
