//! The daemon in-process on a temporary socket, driven through the real HTTP client.

use std::time::Duration;

use flotilla_actors::protocol::{EventKind, RunOutcome};
use futures::StreamExt;
use hyper::{Method, StatusCode};

use crate::daemon_env::*;

const THREE_TASKS: &str = r#"
[agent]
delay_ms = 20
[[planner.answers]]
tasks = [
  { description = "a", scope = ["a.rs"] },
  { description = "b", scope = ["b.rs"], dependencies = [0] },
  { description = "c", scope = ["c.rs"] },
]
"#;

#[tokio::test]
async fn submit_then_the_tail_receives_every_event_in_order_and_can_resume() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let run = submit(&daemon.client, repo.path(), run_config(THREE_TASKS, 2)).await;
    let events = follow_to_end(&daemon.client, &run, None).await;

    assert!(matches!(events[0].kind, EventKind::RunStarted { .. }));
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "seqs must be consecutive: {seqs:?}"
    );
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    let completed = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::TaskCompleted { .. }))
        .count();
    assert_eq!(completed, 3);

    // Resume from any point with Last-Event-ID: exactly the rest, in order.
    let cut = events[4].seq;
    let rest = follow_to_end(&daemon.client, &run, Some(cut)).await;
    assert_eq!(rest, events[5..].to_vec());
    // ?since= does the same.
    let (status, body) = daemon
        .client
        .raw(
            Method::GET,
            &format!("/v1/runs/{run}/events?since={cut}"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(body).unwrap();
    assert!(
        text.starts_with(&format!("id: {}\n", cut + 1))
            || text.contains(&format!("\nid: {}\n", cut + 1)),
        "{text}"
    );

    // Status and graph agree with the stream; a prefix of the id is enough.
    let status: serde_json::Value = daemon
        .client
        .get(&format!("/v1/runs/{}", &run[..8]))
        .await
        .unwrap();
    assert_eq!(status["state"], "completed");
    assert_eq!(status["counts"]["completed"], 3);
    assert_eq!(status["last_seq"], events.last().unwrap().seq);
    let dot = daemon
        .client
        .text(Method::GET, &format!("/v1/runs/{run}/graph?format=dot"))
        .await
        .unwrap();
    assert!(dot.contains("\"t1\" -> \"t2\""), "{dot}");
    let runs: Vec<serde_json::Value> = daemon.client.get("/v1/runs").await.unwrap();
    assert_eq!(runs.len(), 1);
    daemon.stop();
}

#[tokio::test]
async fn cancel_stops_a_running_run() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let slow = r#"
        [agent]
        delay_ms = 60000
        [[planner.answers]]
        tasks = [{ description = "slow", scope = ["a.rs"] }, { description = "slower", scope = ["b.rs"], dependencies = [0] }]
    "#;
    let run = submit(&daemon.client, repo.path(), run_config(slow, 2)).await;
    let mut stream = daemon.client.events(&run, None).await.unwrap();
    // Wait until the first task runs, then cancel.
    while let Some(e) = stream.next().await {
        if matches!(e.unwrap().kind, EventKind::TaskStarted { .. }) {
            break;
        }
    }
    let answer: serde_json::Value = daemon
        .client
        .json(Method::POST, &format!("/v1/runs/{run}/cancel"), None::<&()>)
        .await
        .unwrap();
    assert_eq!(answer["cancelling"], true);
    let rest: Vec<_> = tokio::time::timeout(
        Duration::from_secs(10),
        stream.map(|e| e.unwrap()).collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    assert_eq!(outcome(&rest), Some(RunOutcome::Cancelled));
    let cancelled = rest
        .iter()
        .filter(|e| matches!(e.kind, EventKind::TaskCancelled { .. }))
        .count();
    assert_eq!(cancelled, 2);
    // Cancelling again is a conflict, not a crash.
    let (status, body) = daemon
        .client
        .raw(Method::POST, &format!("/v1/runs/{run}/cancel"), None)
        .await
        .unwrap();
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "{}",
        String::from_utf8_lossy(&body)
    );
    daemon.stop();
}

#[tokio::test]
async fn tcp_requires_the_bearer_token() {
    let daemon = InProcessDaemon::start(true);
    let flotilla::daemon::Bound::Tcp { addr, .. } = daemon.bound.clone() else {
        panic!("expected TCP")
    };
    assert!(addr.ip().is_loopback());
    for token in [None, Some("wrong")] {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let request =
            format!("GET /v1/runs HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n");
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 401"), "{response}");
        assert!(response.contains("bearer token"), "{response}");
    }
    // With the token (the client reads it from the 0600 file) everything works.
    let runs: Vec<serde_json::Value> = daemon.client.get("/v1/runs").await.unwrap();
    assert!(runs.is_empty());
    let flotilla::daemon::Bound::Tcp { token_file, .. } = &daemon.bound else {
        unreachable!()
    };
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(token_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    daemon.stop();
}

#[tokio::test]
async fn the_unix_socket_is_private() {
    let daemon = InProcessDaemon::start(false);
    let flotilla::daemon::Bound::Unix(path) = daemon.bound.clone() else {
        panic!("expected a socket")
    };
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    daemon.stop();
    assert!(!path.exists(), "the socket is removed at shutdown");
}

#[tokio::test]
async fn bad_requests_get_json_errors_with_the_right_status() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let not_repo = tempfile::tempdir().unwrap();
    let c = &daemon.client;
    let post = |body: Vec<u8>| c.raw(Method::POST, "/v1/runs", Some(body));
    let cases: Vec<(Vec<u8>, StatusCode, &str)> = vec![
        (b"{not json".to_vec(), StatusCode::BAD_REQUEST, "parse"),
        (br#"{"request": 5, "repo": "/x"}"#.to_vec(), StatusCode::UNPROCESSABLE_ENTITY, "request"),
        (br#"{"request": "x", "repo": "/x", "extra": 1}"#.to_vec(), StatusCode::UNPROCESSABLE_ENTITY, "extra"),
        (
            serde_json::to_vec(&serde_json::json!({"request": "  ", "repo": repo.path()})).unwrap(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "empty",
        ),
        (
            serde_json::to_vec(&serde_json::json!({"request": "x", "repo": "relative/path"})).unwrap(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "absolute",
        ),
        (
            serde_json::to_vec(&serde_json::json!({"request": "x", "repo": not_repo.path()})).unwrap(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "not a git repository",
        ),
        (
            serde_json::to_vec(&serde_json::json!({"request": "x", "repo": repo.path()})).unwrap(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "flotilla.toml",
        ),
        (
            serde_json::to_vec(
                &serde_json::json!({"request": "x".repeat(70_000), "repo": repo.path(), "config": run_config("", 1)}),
            )
            .unwrap(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "at most",
        ),
        (vec![b' '; 2 * 1024 * 1024], StatusCode::PAYLOAD_TOO_LARGE, ""),
    ];
    for (body, want, needle) in cases {
        let (status, answer) = post(body).await.unwrap();
        let answer = String::from_utf8_lossy(&answer).to_string();
        assert_eq!(status, want, "{answer}");
        let json: serde_json::Value =
            serde_json::from_str(&answer).unwrap_or_else(|_| panic!("not JSON: {answer}"));
        assert!(
            json["error"].as_str().unwrap().contains(needle),
            "{answer} should mention {needle:?}"
        );
    }
    for (path, want) in [
        ("/v1/runs/0123abcd", StatusCode::NOT_FOUND),
        ("/v1/runs/not-an-id!", StatusCode::BAD_REQUEST),
        ("/v1/nothing", StatusCode::NOT_FOUND),
    ] {
        let (status, answer) = c.raw(Method::GET, path, None).await.unwrap();
        assert_eq!(status, want, "{path}: {}", String::from_utf8_lossy(&answer));
        assert!(serde_json::from_slice::<serde_json::Value>(&answer).unwrap()["error"].is_string());
    }
    let run = submit(c, repo.path(), run_config(THREE_TASKS, 1)).await;
    let (status, _) = c
        .raw(
            Method::GET,
            &format!("/v1/runs/{run}/graph?format=png"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = c
        .raw(Method::GET, &format!("/v1/runs/{run}/events"), None)
        .await
        .map(|(s, b)| (s, b.len()))
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    daemon.stop();
}

#[tokio::test]
async fn shutdown_closes_open_event_streams_promptly() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let slow = r#"
        [agent]
        delay_ms = 60000
        [[planner.answers]]
        tasks = [{ description = "slow", scope = ["a.rs"] }]
    "#;
    let run = submit(&daemon.client, repo.path(), run_config(slow, 1)).await;
    let mut stream = daemon.client.events(&run, None).await.unwrap();
    assert!(stream.next().await.is_some());
    let token = daemon.shutdown_token();
    let stopper = std::thread::spawn(move || daemon.stop());
    token.cancel();
    let drained = tokio::time::timeout(Duration::from_secs(5), async {
        while stream.next().await.is_some() {}
    })
    .await;
    assert!(
        drained.is_ok(),
        "the event stream stayed open after shutdown"
    );
    stopper.join().unwrap();
}

/// t1 proposes two subtasks and leaves the choice to a human.
pub const USER_DECIDES: &str = r#"
[[planner.answers]]
tasks = [{ description = "explore two designs", scope = ["src"] }]
[tasks.t1]
outcome = "subplan"
[tasks.t1.subplan]
reason = "ambiguity"
stop_when = "user_decision"
subtasks = [
  { description = "design one", scope = ["src/one.rs"] },
  { description = "design two", scope = ["src/two.rs"] },
]
[tasks."t1.2"]
summary = "design two, the better one"
"#;

#[tokio::test]
async fn a_user_decision_ends_a_task_waiting_for_one() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let c = &daemon.client;
    let run = submit(c, repo.path(), run_config(USER_DECIDES, 2)).await;
    let mut stream = c.events(&run, None).await.unwrap();
    let waiting = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(e) = stream.next().await {
            if let EventKind::AwaitingUserDecision { parent } = e.unwrap().kind {
                return parent;
            }
        }
        panic!("the stream ended before the decision was asked for")
    })
    .await
    .unwrap();
    assert_eq!(waiting.to_string(), "t1");

    let decide = |task: &str, body: serde_json::Value| {
        let path = format!("/v1/runs/{run}/tasks/{task}/decision");
        async move {
            let (status, answer) = c
                .raw(
                    Method::POST,
                    &path,
                    Some(serde_json::to_vec(&body).unwrap()),
                )
                .await
                .unwrap();
            let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
            (status, answer)
        }
    };
    let accept = |subtask: &str| serde_json::json!({ "decision": "accept", "subtask": subtask });
    // Mistakes are clear errors, and change nothing.
    for (task, body, want, needle) in [
        ("t9", accept("t1.2"), StatusCode::NOT_FOUND, "no task t9"),
        (
            "x!",
            accept("t1.2"),
            StatusCode::BAD_REQUEST,
            "not a task id",
        ),
        ("t1.1", accept("t1.2"), StatusCode::CONFLICT, "not waiting"),
        (
            "t1",
            accept("t1"),
            StatusCode::CONFLICT,
            "not a completed subtask",
        ),
        (
            "t1",
            serde_json::json!({ "decision": "maybe" }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "maybe",
        ),
    ] {
        let (status, answer) = decide(task, body).await;
        assert_eq!(status, want, "{task}: {answer}");
        assert!(
            answer["error"].as_str().unwrap().contains(needle),
            "{answer}"
        );
    }
    let (status, answer) = decide("t1", accept("t1.2")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");

    let rest: Vec<_> = tokio::time::timeout(
        Duration::from_secs(60),
        stream.map(|e| e.unwrap()).collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    assert_eq!(outcome(&rest), Some(RunOutcome::Completed));
    let status: serde_json::Value = c.get(&format!("/v1/runs/{run}")).await.unwrap();
    let t1 = status["graph"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "t1")
        .unwrap();
    assert_eq!(t1["state"], "completed", "{t1}");
    assert_eq!(t1["summary"], "design two, the better one", "{t1}");
    // The run is over: nothing left to decide.
    let (status, answer) = decide("t1", accept("t1.2")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    daemon.stop();
}

#[tokio::test]
async fn deciding_too_early_says_what_the_task_does_in_words() {
    const STILL_WORKING: &str = r#"
[[planner.answers]]
tasks = [{ description = "explore two designs", scope = ["src"] }]
[tasks.t1]
outcome = "subplan"
[tasks.t1.subplan]
reason = "ambiguity"
stop_when = "user_decision"
subtasks = [{ description = "design one", scope = ["src/one.rs"] }]
[tasks."t1.1"]
outcome = "hang"
"#;
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let c = &daemon.client;
    let run = submit(c, repo.path(), run_config(STILL_WORKING, 2)).await;
    let mut stream = c.events(&run, None).await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(e) = stream.next().await {
            // Not a let chain: rustc 1.95 refuses one inside this #[tokio::test] body
            // ("let chains are only allowed in Rust 2024", the macro's edition).
            if matches!(e.unwrap().kind, EventKind::TaskStarted { task, .. } if task.to_string() == "t1.1")
            {
                return;
            }
        }
        panic!("t1.1 never started")
    })
    .await
    .unwrap();
    let (status, answer) = c
        .raw(
            Method::POST,
            &format!("/v1/runs/{run}/tasks/t1/decision"),
            Some(br#"{"decision": "fail"}"#.to_vec()),
        )
        .await
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert!(
        answer.contains("not waiting for a decision (it is waiting for subtasks)"),
        "{answer}"
    );
    let (status, _) = c
        .raw(Method::POST, &format!("/v1/runs/{run}/cancel"), None)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::ACCEPTED);
    daemon.stop();
}

/// A run whose planner is a real (HTTP, OpenAI-compatible, streaming) provider, with
/// scripted workers: the key goes from the daemon's environment into the request header and
/// nowhere else (not the journal, not the log); every call's usage is journaled, priced from
/// the price table, and the run's spent tokens in `status` are exactly the sum of what the
/// journal recorded (planner usage and the workers' charges), counted once.
#[tokio::test]
async fn a_real_planner_is_metered_once_and_its_key_stays_in_the_daemons_environment() {
    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    const KEY: &str = "sk-metered-secret-0451";
    // SAFETY: set once, by this test only (a name no other test uses); the daemon under
    // test reads it from its (this) process's environment, as a real daemon would.
    unsafe { std::env::set_var("FLOTILLA_METERED_TEST_KEY", KEY) };
    let server = MockServer::start().await;
    let sse = |content: &str, usage: (u64, u64)| {
        let chunk = |v: serde_json::Value| format!("data: {v}\n\n");
        let mut body = String::new();
        // The answer in two pieces, then usage in its own chunk, as OpenAI streams it.
        let (a, b) = content.split_at(content.len() / 2);
        for piece in [a, b] {
            body.push_str(&chunk(serde_json::json!({
                "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": null}]
            })));
        }
        body.push_str(&chunk(serde_json::json!({
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]
        })));
        body.push_str(&chunk(serde_json::json!({
            "choices": [],
            "usage": {"prompt_tokens": usage.0, "completion_tokens": usage.1}
        })));
        body.push_str("data: [DONE]\n\n");
        ResponseTemplate::new(200)
            .insert_header("content-type", "text/event-stream")
            .set_body_string(body)
    };
    let first = r#"{"scratchpad": "s", "tasks": [
        {"description": "write the lexer", "scope": ["src/lex.rs"], "acceptance": "it lexes"},
        {"description": "write the parser", "scope": ["src/parse.rs"], "acceptance": "it parses"}
    ]}"#;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header("authorization", format!("Bearer {KEY}").as_str()))
        .respond_with(sse(first, (1000, 200)))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header("authorization", format!("Bearer {KEY}").as_str()))
        .respond_with(sse(r#"{"tasks": []}"#, (1500, 10)))
        .with_priority(2)
        .mount(&server)
        .await;

    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let mut config = run_config("[agent]\ndelay_ms = 10\n", 2);
    config["models"] = serde_json::json!({
        "providers": {"local": {
            "kind": "openai",
            "base_url": format!("{}/v1", server.uri()),
            "api_key_env": "FLOTILLA_METERED_TEST_KEY",
        }},
        "roles": {"planner": "local/tiny"},
        "prices": {"local/tiny": {"input": 2.0, "output": 10.0}},
    });
    let run = submit(&daemon.client, repo.path(), config).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));

    let mut recorded = 0u64;
    let mut planner_cost = 0u64;
    let mut calls = 0;
    for e in &events {
        match &e.kind {
            EventKind::PlannerResponded { usage, .. } => {
                calls += 1;
                recorded += usage.tokens_in + usage.tokens_out;
                planner_cost += usage.cost_usd.micros();
            }
            EventKind::SpendCharged { spent, .. } => recorded += spent.tokens,
            _ => {}
        }
    }
    assert!(
        calls >= 2,
        "a sprint, then the empty answer that ends planning"
    );
    // 1000 in × $2/M + 200 out × $10/M = 4000 µ$; each later call 1500 × 2 + 10 × 10 = 3100.
    assert_eq!(planner_cost, 4_000 + 3_100 * (calls - 1));
    let status: serde_json::Value = daemon.client.get(&format!("/v1/runs/{run}")).await.unwrap();
    assert_eq!(
        status["graph"]["run_spent"]["tokens"].as_u64(),
        Some(recorded),
        "status counts exactly what the journal recorded: {status}"
    );
    assert_eq!(
        server.received_requests().await.unwrap().len(),
        calls as usize
    );
    let journal = journal_dump(daemon.state_dir(), 10_000);
    assert!(!journal.contains(KEY), "the key is in the journal");
    assert!(!daemon.log_text().contains(KEY), "the key is in the log");
    assert!(!serde_json::to_string(&events).unwrap().contains(KEY));
}
