//! The Codex preset against the real Codex CLI and a local fake of the OpenAI Responses API
//! (issue 25, M8c item 4). The fake speaks what Codex 0.171 speaks: `POST /v1/responses`
//! with `stream: true`, answered as server-sent events (`response.created`,
//! `response.output_item.added`/`.done`, `response.completed` with usage). It scripts one
//! turn: Codex's first request is answered with a call of its `exec_command` tool that
//! writes a file in the worktree; the request that carries that call's output is answered
//! with a final assistant message holding the result envelope (the preset reads the last
//! agent message of the completed turn).
//!
//! CI has no Codex, so the test is `#[ignore]`d, and run on purpose with the CLI named in
//! `FLOTILLA_CODEX` (CONTRIBUTING.md, "Running the real-CLI tests"):
//!
//! ```text
//! FLOTILLA_CODEX=/path/to/bin/codex cargo test --test it codex_real:: -- --ignored
//! ```
//!
//! Without `FLOTILLA_CODEX` it passes with a note on stderr, so `--ignored` runs of the
//! whole suite on a machine without Codex stay green.

use std::path::{Path, PathBuf};

use flotilla_actors::protocol::*;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::daemon_env::{InProcessDaemon, follow_to_end, init_repo, outcome, run_config, submit};

/// The environment variable that names the real Codex CLI to test.
const CODEX_VAR: &str = "FLOTILLA_CODEX";
/// The id of the one tool call the fake makes; the second request must carry its output.
const CALL_ID: &str = "call_flotilla_fake_1";
/// What the tool call writes, and where.
const WRITTEN: &str = "src/from_codex.rs";
const CONTENT: &str = "pub fn from_codex() -> u32 {\n    171\n}\n";
/// The usage the fake reports for each of its two answers.
const FIRST_USAGE: (u64, u64) = (1_000, 40);
const SECOND_USAGE: (u64, u64) = (1_300, 60);

/// The real Codex CLI to test, or `None` (with a note) when none is named.
fn real_codex() -> Option<PathBuf> {
    match std::env::var_os(CODEX_VAR) {
        Some(program) if !program.is_empty() => Some(PathBuf::from(program)),
        _ => {
            eprintln!(
                "codex_real: skipped: set {CODEX_VAR} to the Codex CLI (codex 0.171 or later) \
                 to run this test (CONTRIBUTING.md, \"Running the real-CLI tests\")"
            );
            None
        }
    }
}

/// One server-sent event as the Responses API frames it.
fn sse(events: &[serde_json::Value]) -> String {
    events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
        .collect()
}

/// The events of one streamed response whose output is `items`.
fn response(id: &str, items: &[serde_json::Value], usage: (u64, u64)) -> String {
    let mut events = vec![serde_json::json!({
        "type": "response.created",
        "response": { "id": id, "status": "in_progress", "output": [] },
    })];
    for (i, item) in items.iter().enumerate() {
        events.push(serde_json::json!({
            "type": "response.output_item.added", "output_index": i, "item": item,
        }));
        events.push(serde_json::json!({
            "type": "response.output_item.done", "output_index": i, "item": item,
        }));
    }
    let (input, output) = usage;
    events.push(serde_json::json!({
        "type": "response.completed",
        "response": {
            "id": id,
            "status": "completed",
            "output": items,
            "usage": {
                "input_tokens": input,
                "input_tokens_details": { "cached_tokens": 0 },
                "output_tokens": output,
                "output_tokens_details": { "reasoning_tokens": 0 },
                "total_tokens": input + output,
            },
        },
    }));
    sse(&events)
}

/// The scripted model: a tool call first, the final message once the call's output is back.
/// Answers by what the request holds, not by how many came before, so Codex's own retries
/// of a request get the same answer.
struct ScriptedModel;

impl Respond for ScriptedModel {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: serde_json::Value = match serde_json::from_slice(&request.body) {
            Ok(body) => body,
            Err(e) => return ResponseTemplate::new(400).set_body_string(format!("not JSON: {e}")),
        };
        let has_output = body["input"].as_array().is_some_and(|items| {
            items
                .iter()
                .any(|i| i["type"] == "function_call_output" && i["call_id"] == CALL_ID)
        });
        let answer = if has_output {
            let envelope = serde_json::json!({
                "status": "complete",
                "summary": "wrote src/from_codex.rs with exec_command",
                "files_changed": [WRITTEN],
            });
            let message = serde_json::json!({
                "type": "message",
                "id": "msg_fake_2",
                "role": "assistant",
                "status": "completed",
                "content": [{
                    "type": "output_text",
                    "text": format!("I wrote {WRITTEN}.\n{envelope}"),
                    "annotations": [],
                }],
            });
            response("resp_fake_2", &[message], SECOND_USAGE)
        } else {
            let cmd = format!("mkdir -p src && printf '%s' '{CONTENT}' > {WRITTEN}");
            let call = serde_json::json!({
                "type": "function_call",
                "id": "fc_fake_1",
                "call_id": CALL_ID,
                "name": "exec_command",
                "arguments": serde_json::json!({ "cmd": cmd }).to_string(),
                "status": "completed",
            });
            response("resp_fake_1", &[call], FIRST_USAGE)
        };
        ResponseTemplate::new(200).set_body_raw(answer, "text/event-stream")
    }
}

/// The directory of Codex's npm package (its launcher and its native binary), for
/// `[sandbox] read_only`: where the launcher is a link, where it leads.
fn codex_install(program: &Path) -> PathBuf {
    let real = std::fs::canonicalize(program)
        .unwrap_or_else(|e| panic!("{CODEX_VAR}={}: {e}", program.display()));
    // …/node_modules/@openai/codex/bin/codex.js: the package is two levels up.
    real.ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or(real)
}

fn requests_with_tool_output(requests: &[Request]) -> (Vec<serde_json::Value>, usize) {
    let bodies: Vec<serde_json::Value> = requests
        .iter()
        .filter(|r| r.url.path() == "/v1/responses")
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    let answered = bodies
        .iter()
        .filter(|b| {
            b["input"].as_array().is_some_and(|items| {
                items
                    .iter()
                    .any(|i| i["type"] == "function_call_output" && i["call_id"] == CALL_ID)
            })
        })
        .count();
    (bodies, answered)
}

/// A whole run with the Codex preset and the real CLI: Codex calls the fake, runs the tool
/// call in flotilla's sandbox (with the network, narrowed to the fake's port), hands back
/// the envelope in its final message; the task completes, its file lands on main, Codex's
/// usage is charged, and the checkout is left clean.
#[tokio::test]
#[ignore = "needs the real Codex CLI: FLOTILLA_CODEX=/path/to/codex cargo test --test it codex_real:: -- --ignored"]
async fn the_codex_preset_runs_the_real_cli_against_a_responses_api_fake() {
    let Some(codex) = real_codex() else {
        return;
    };
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/responses"))
        .respond_with(ScriptedModel)
        .mount(&server)
        .await;
    let port = server.address().port();
    let base_url = format!("{}/v1", server.uri());

    let repo = tempfile::tempdir().unwrap();
    init_repo(repo.path());
    let scenario = r#"
[[planner.answers]]
tasks = [{ description = "Add src/from_codex.rs with a function from_codex returning 171.", scope = ["src"] }]
"#;
    let mut config = run_config(scenario, 1);
    config["workers"] = serde_json::json!([{ "name": "codex", "agent": "codex" }]);
    config["agents"] = serde_json::json!({
        "codex": {
            "preset": "codex",
            "program": codex.to_string_lossy(),
            "extra_args": [
                "-c", "model_provider=\"fake\"",
                "-c", "model_providers.fake.name=\"fake\"",
                "-c", format!("model_providers.fake.base_url=\"{base_url}\""),
                "-c", "model_providers.fake.wire_api=\"responses\"",
                "-m", "flotilla-fake-model",
                "--sandbox", "workspace-write",
            ],
            "sandbox": "network",
        }
    });
    config["sandbox"] = serde_json::json!({
        "read_only": [codex_install(&codex).to_string_lossy()],
        "allow_tcp_ports": [port],
    });

    let daemon = InProcessDaemon::start(false);
    let run = submit(&daemon.client, repo.path(), config).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    let requests = server.received_requests().await.unwrap_or_default();
    let (bodies, answered) = requests_with_tool_output(&requests);
    assert_eq!(
        outcome(&events),
        Some(RunOutcome::Completed),
        "requests: {bodies:#?}; events: {events:#?}"
    );

    // What Codex sent: the streamed Responses request with its shell tool, then the tool
    // call's output back.
    let first = bodies.first().expect("Codex called the fake");
    assert_eq!(first["stream"], true, "{first:#}");
    assert!(
        first["tools"]
            .as_array()
            .is_some_and(|tools| tools.iter().any(|t| t["name"] == "exec_command")),
        "Codex offers its exec_command tool: {:#}",
        first["tools"]
    );
    assert_eq!(
        answered, 1,
        "one request carried the call's output: {bodies:#?}"
    );

    // The task completed with the envelope of Codex's final message, and landed.
    let handoff = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::TaskLanding { task, handoff, .. } if task.to_string() == "t1" => {
                handoff.clone()
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("t1 completed with a handoff: {events:#?}"));
    assert_eq!(handoff.status, HandoffStatus::Complete, "{handoff:?}");
    assert_eq!(handoff.files_changed, [WRITTEN], "{handoff:?}");
    assert_eq!(handoff.metrics.tool_calls, 1, "one command: {handoff:?}");
    assert!(
        events.iter().any(
            |e| matches!(&e.kind, EventKind::TaskLanded { task, .. } if task.to_string() == "t1")
        ),
        "t1 landed: {events:#?}"
    );

    // Codex's usage (both answers of its one turn) is charged to the task.
    let charged: u64 = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::SpendCharged { task, spent, .. } if task.to_string() == "t1" => {
                Some(spent.tokens)
            }
            _ => None,
        })
        .sum();
    assert!(charged > 0, "Codex's usage is charged: {events:#?}");
    let reported = FIRST_USAGE.0 + FIRST_USAGE.1 + SECOND_USAGE.0 + SECOND_USAGE.1;
    assert_eq!(charged, reported, "what the fake reported: {events:#?}");

    // The file landed on main, and nothing else of the run is left in the checkout.
    let git = git2::Repository::open(repo.path()).unwrap();
    let main = git.find_branch("main", git2::BranchType::Local).unwrap();
    let tree = main.get().peel_to_tree().unwrap();
    let entry = tree
        .get_path(Path::new(WRITTEN))
        .expect("the file is on main");
    let blob = git.find_blob(entry.id()).unwrap();
    assert_eq!(std::str::from_utf8(blob.content()).unwrap(), CONTENT);
    let statuses = git
        .statuses(Some(git2::StatusOptions::new().include_untracked(true)))
        .unwrap();
    let dirty: Vec<String> = statuses
        .iter()
        .map(|s| format!("{:?} {}", s.status(), s.path().unwrap_or("?")))
        .collect();
    assert!(dirty.is_empty(), "the checkout is not clean: {dirty:?}");
    let branches: Vec<String> = git
        .branches(Some(git2::BranchType::Local))
        .unwrap()
        .map(|b| b.unwrap().0.name().unwrap().unwrap().to_string())
        .collect();
    assert_eq!(branches, ["main"], "no task branch left");
    assert_eq!(git.worktrees().unwrap().len(), 0, "no worktree left");
}
