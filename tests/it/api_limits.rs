//! The API's bounds: connection cap and timeouts on the server, request timeouts and stream
//! silence in the client, JSON for every error, run-id matching, idempotent submission.

use std::time::Duration;

use flotilla::cli::client::{Client, ClientError, Endpoint};
use flotilla::daemon::api::ServerLimits;
use flotilla::daemon::{self, Bound, DaemonOptions, Listen};
use hyper::{Method, StatusCode};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::daemon_env::*;

/// An in-process daemon with the given server limits (on loopback TCP, or a Unix socket).
struct LimitedDaemon {
    client: Client,
    bound: Bound,
    _state: TempDir,
    shutdown: CancellationToken,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl LimitedDaemon {
    fn start(tcp: bool, server: ServerLimits) -> Self {
        let state = tempfile::tempdir().unwrap();
        let listen = if tcp {
            Listen::Tcp("127.0.0.1:0".parse().unwrap())
        } else {
            Listen::Unix(state.path().join("daemon.sock"))
        };
        let options = DaemonOptions {
            state_dir: state.path().to_path_buf(),
            listen,
            server,
            journal_faults: None,
            journal_sync: Default::default(),
        };
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            actix_rt::System::new().block_on(async move {
                let (tx, rx) = tokio::sync::oneshot::channel();
                tokio::spawn(async move {
                    if let Ok(bound) = rx.await {
                        let _ = ready_tx.send(bound);
                    }
                });
                daemon::serve(options, token, Some(tx)).await
            })
        });
        let bound = ready_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        let endpoint = match &bound {
            Bound::Unix(path) => Endpoint::Unix(path.clone()),
            Bound::Tcp { addr, token_file } => Endpoint::Tcp {
                addr: *addr,
                token: std::fs::read_to_string(token_file)
                    .unwrap()
                    .trim()
                    .to_string(),
            },
        };
        LimitedDaemon {
            client: Client::new(endpoint),
            bound,
            _state: state,
            shutdown,
            thread: Some(thread),
        }
    }

    fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(t) = self.thread.take() {
            t.join().unwrap().unwrap();
        }
    }
}

impl Drop for LimitedDaemon {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Reads until the peer closes; what it sent meanwhile (a 503, or nothing).
async fn read_until_closed(stream: &mut tokio::net::TcpStream) -> String {
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn idle_connections_past_the_cap_cannot_starve_requests_and_are_closed() {
    const CAP: usize = 4;
    let daemon = LimitedDaemon::start(
        true,
        ServerLimits {
            max_connections: CAP,
            header_read_timeout: Duration::from_millis(500),
            ..ServerLimits::default()
        },
    );
    let Bound::Tcp { addr, .. } = daemon.bound.clone() else {
        unreachable!()
    };
    // Connections that never send a byte (not even a token).
    let mut idle = Vec::new();
    for _ in 0..CAP + 10 {
        idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // A normal request is served, or told clearly that the daemon is busy.
    match daemon.client.raw(Method::GET, "/v1/runs", None).await {
        Ok((status, body)) => {
            assert!(
                status == StatusCode::OK || status == StatusCode::SERVICE_UNAVAILABLE,
                "{status}"
            );
            let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
            if status == StatusCode::SERVICE_UNAVAILABLE {
                assert!(json["error"].as_str().unwrap().contains("too many"));
            }
        }
        Err(e) => panic!("neither served nor refused clearly: {e}"),
    }
    // Every idle connection is closed by the daemon, eventually (the 503 ones at once, the
    // others after the header timeout): reading ends instead of waiting forever.
    let closed = tokio::time::timeout(Duration::from_secs(30), async {
        for stream in &mut idle {
            let answer = read_until_closed(stream).await;
            assert!(
                answer.is_empty()
                    || answer.starts_with("HTTP/1.1 503")
                    || answer.starts_with("HTTP/1.1 408"),
                "{answer}"
            );
        }
    })
    .await;
    assert!(closed.is_ok(), "idle connections stayed open");
    // With them gone, requests are served again.
    let runs: Vec<serde_json::Value> = daemon.client.get("/v1/runs").await.unwrap();
    assert!(runs.is_empty());
    daemon.stop();
}

#[tokio::test]
async fn connections_without_the_token_cannot_lock_real_clients_out() {
    const CAP: usize = 4;
    let daemon = LimitedDaemon::start(
        true,
        ServerLimits {
            max_connections: CAP,
            ..ServerLimits::default()
        },
    );
    let Bound::Tcp { addr, .. } = daemon.bound.clone() else {
        unreachable!()
    };
    // A local user without the token keeps the server full: it opens connections that send
    // nothing, and opens a new one whenever one is closed (bounded: until the test is done).
    let stop = CancellationToken::new();
    let flood = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut held: Vec<tokio::net::TcpStream> = Vec::new();
            let mut opened = 0usize;
            while !stop.is_cancelled() && opened < 10_000 {
                held.retain(|s| s.peer_addr().is_ok());
                if held.len() < CAP + 4 {
                    if let Ok(s) = tokio::net::TcpStream::connect(addr).await {
                        held.push(s);
                        opened += 1;
                    }
                } else {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            opened
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Every request of a client with the token is served (the proven are never evicted).
    for _ in 0..10 {
        let (status, body) = daemon
            .client
            .raw(Method::GET, "/v1/runs", None)
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    }
    stop.cancel();
    let opened = flood.await.unwrap();
    assert!(
        opened >= CAP,
        "the flood held the server full ({opened} connections)"
    );
    daemon.stop();
}

#[tokio::test]
async fn an_event_stream_outlives_the_idle_timeout() {
    let daemon = LimitedDaemon::start(
        false,
        ServerLimits {
            max_connections: 4,
            header_read_timeout: Duration::from_millis(200),
            ..ServerLimits::default()
        },
    );
    let repo = git_repo();
    let slow = r#"
        [agent]
        delay_ms = 1500
        [[planner.answers]]
        tasks = [{ description = "slow", scope = ["a.rs"] }]
    "#;
    let run = submit(&daemon.client, repo.path(), run_config(slow, 1)).await;
    // The stream is quiet for 1.5 s, far past the header timeout, and must stay open.
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(
        outcome(&events),
        Some(flotilla_actors::protocol::RunOutcome::Completed)
    );
    daemon.stop();
}

#[tokio::test]
async fn the_client_gives_up_on_a_daemon_that_does_not_answer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("daemon.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    // Accepts, reads, never answers (a stopped or wedged daemon).
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            held.push(stream);
        }
    });
    let client = Client::new(Endpoint::Unix(path.clone()))
        .with_timeouts(Duration::from_millis(300), Duration::from_millis(300));
    let answer = tokio::time::timeout(
        Duration::from_secs(30),
        client.get::<serde_json::Value>("/v1/runs"),
    )
    .await
    .expect("the request timeout did not fire");
    assert!(
        matches!(answer, Err(ClientError::TimedOut { .. })),
        "{answer:?}"
    );
    assert!(answer.unwrap_err().to_string().contains("did not answer"));
    silent.abort();

    // An event stream that sends its head and then nothing, not even keep-alives.
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let mute = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                .await;
            held.push(stream);
        }
    });
    use futures::StreamExt;
    let mut stream = client.events("0123", None).await.unwrap();
    let item = tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .expect("a silent stream must be noticed");
    assert!(matches!(item, Some(Err(_))), "{item:?}");
    mute.abort();
}

#[tokio::test]
async fn every_error_answer_is_json() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let c = &daemon.client;
    let run = submit(c, repo.path(), run_config("", 1)).await;
    let long = format!("/v1/runs/{}", "a".repeat(16 * 1024));
    let cases: Vec<(Method, String, StatusCode)> = vec![
        (Method::GET, "/v1/nothing".into(), StatusCode::NOT_FOUND),
        (
            Method::DELETE,
            "/v1/runs".into(),
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (
            Method::GET,
            format!("/v1/runs/{run}/cancel"),
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (Method::GET, long, StatusCode::URI_TOO_LONG),
        (
            Method::GET,
            format!("/v1/runs/{run}/events?since=abc"),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            format!("/v1/runs/{run}/graph?format="),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            format!("/v1/runs/{run}/graph?format=png"),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            "/v1/runs/%ff%fe".into(),
            StatusCode::BAD_REQUEST,
        ),
        (Method::GET, "/v1/runs/---".into(), StatusCode::BAD_REQUEST),
    ];
    for (method, path, want) in cases {
        let (status, body) = c.raw(method.clone(), &path, None).await.unwrap();
        let text = String::from_utf8_lossy(&body);
        let short: String = path.chars().take(60).collect();
        assert_eq!(status, want, "{method} {short}: {text}");
        let json: serde_json::Value = serde_json::from_slice(&body)
            .unwrap_or_else(|_| panic!("{method} {short}: not JSON: {text:?}"));
        assert!(
            json["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{method} {short}: {text}"
        );
    }
    daemon.stop();
}

#[tokio::test]
async fn run_ids_of_only_dashes_match_nothing_and_ambiguity_lists_the_candidates() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let c = &daemon.client;
    let first = submit(c, repo.path(), run_config("", 1)).await;
    let second = submit(c, repo.path(), run_config("", 1)).await;
    for dashes in ["-", "---", "--------"] {
        let (status, body) = c
            .raw(Method::GET, &format!("/v1/runs/{dashes}"), None)
            .await
            .unwrap();
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{}",
            String::from_utf8_lossy(&body)
        );
    }
    // UUIDv7 ids of runs started together share their first characters.
    let shared: String = first
        .chars()
        .zip(second.chars())
        .take_while(|(a, b)| a == b)
        .map(|(a, _)| a)
        .collect();
    assert!(shared.len() >= 4, "{first} {second}");
    let (status, body) = c
        .raw(Method::GET, &format!("/v1/runs/{}", &shared[..4]), None)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::CONFLICT);
    let message = serde_json::from_slice::<serde_json::Value>(&body).unwrap()["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains(&first) && message.contains(&second),
        "{message}"
    );
    daemon.stop();
}

#[tokio::test]
async fn submitting_twice_with_one_key_creates_one_run() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let body = serde_json::json!({
        "request": "build it", "repo": repo.path(), "config": run_config("", 1),
    });
    let key = "3f6c2d0e-retry-of-the-same-submit";
    let first = daemon.client.submit_with_key(&body, key).await.unwrap();
    let again = daemon.client.submit_with_key(&body, key).await.unwrap();
    assert_eq!(first.id, again.id);
    let other = daemon.client.submit(&body).await.unwrap();
    assert_ne!(other.id, first.id, "a new submit gets a new key");
    let runs: Vec<serde_json::Value> = daemon.client.get("/v1/runs").await.unwrap();
    assert_eq!(runs.len(), 2, "{runs:?}");
    let (status, body) = daemon
        .client
        .raw(Method::GET, "/v1/runs", None)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    daemon.stop();
}

#[tokio::test]
async fn a_key_reused_for_a_different_request_is_refused() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let body = serde_json::json!({
        "request": "build it", "repo": repo.path(), "config": run_config("", 1),
    });
    let key = "reused-key";
    let first = daemon.client.submit_with_key(&body, key).await.unwrap();
    let mut other = body.clone();
    other["request"] = "build something else".into();
    let refused = daemon
        .client
        .submit_with_key(&other, key)
        .await
        .unwrap_err();
    match &refused {
        ClientError::Api { status, message } => {
            assert_eq!(*status, StatusCode::UNPROCESSABLE_ENTITY, "{message}");
            assert!(message.contains("different request"), "{message}");
            assert!(message.contains(&first.id), "{message}");
        }
        other => panic!("expected a 422, got {other:?}"),
    }
    // The same request in other words (key order, whitespace) is the same request.
    let mut reordered = serde_json::to_string(&serde_json::json!({
        "config": body["config"], "repo": body["repo"], "request": body["request"],
    }))
    .unwrap();
    reordered.insert(1, ' ');
    let (status, answer) = daemon
        .client
        .raw_with_headers(
            Method::POST,
            "/v1/runs",
            Some(reordered.into_bytes()),
            &[("idempotency-key", key.to_string())],
        )
        .await
        .unwrap();
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert!(String::from_utf8_lossy(&answer).contains(&first.id));
    let runs: Vec<serde_json::Value> = daemon.client.get("/v1/runs").await.unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    daemon.stop();
}

#[tokio::test]
async fn impossible_limits_in_a_submitted_config_are_refused() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let mut config = run_config("", 1);
    config["limits"]["max_workers"] = 0.into();
    let body = serde_json::json!({ "request": "x", "repo": repo.path(), "config": config });
    let (status, answer) = daemon
        .client
        .raw(
            Method::POST,
            "/v1/runs",
            Some(serde_json::to_vec(&body).unwrap()),
        )
        .await
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert!(answer.contains("max_workers"), "{answer}");
    let runs: Vec<serde_json::Value> = daemon.client.get("/v1/runs").await.unwrap();
    assert!(runs.is_empty());
    daemon.stop();
}

#[tokio::test]
async fn impossible_planner_settings_in_a_submitted_config_are_refused() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    for (field, value) in [
        ("max_iterations", 0u64),
        ("max_consecutive_errors", 0),
        ("max_answer_bytes", 10),
    ] {
        let mut config = run_config("", 1);
        config["planner"][field] = value.into();
        let body = serde_json::json!({ "request": "x", "repo": repo.path(), "config": config });
        let (status, answer) = daemon
            .client
            .raw(
                Method::POST,
                "/v1/runs",
                Some(serde_json::to_vec(&body).unwrap()),
            )
            .await
            .unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
        assert!(answer.contains(field), "{answer}");
    }
    let runs: Vec<serde_json::Value> = daemon.client.get("/v1/runs").await.unwrap();
    assert!(runs.is_empty());
    daemon.stop();
}

/// A fake daemon that reads each request and hangs up without answering the first `drop`
/// of them (an answer lost to a crash), then answers 201. Returns the requests it read.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

fn lossy_daemon(path: std::path::PathBuf, drop: usize) -> (tokio::task::JoinHandle<()>, Seen) {
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    let seen = Seen::default();
    let log = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            // Head and body: the body ends with the JSON's closing brace.
            while !request.ends_with(b"}") {
                let n = stream.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buf[..n]);
            }
            let count = {
                let mut log = log.lock().unwrap();
                log.push(String::from_utf8_lossy(&request).into_owned());
                log.len()
            };
            if count > drop {
                let body = r#"{"id":"01a20163-c6be-7585-89dc-6c22ed29ed73"}"#;
                let answer = format!(
                    "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(answer.as_bytes()).await.unwrap();
                return;
            }
        }
    });
    (task, seen)
}

#[tokio::test]
async fn submit_retries_a_lost_answer_with_the_same_key_a_bounded_number_of_times() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("daemon.sock");
    let (daemon, seen) = lossy_daemon(path.clone(), 2);
    let client = Client::new(Endpoint::Unix(path.clone()));
    let created = client
        .submit(&serde_json::json!({ "request": "x" }))
        .await
        .unwrap();
    assert_eq!(created.id, "01a20163-c6be-7585-89dc-6c22ed29ed73");
    daemon.await.unwrap();
    let requests = seen.lock().unwrap().clone();
    assert_eq!(requests.len(), 3);
    let key = |r: &str| {
        r.lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("idempotency-key: ")
                    .map(str::to_owned)
            })
            .expect("every attempt carries the key")
    };
    assert!(
        requests.iter().all(|r| key(r) == key(&requests[0])),
        "{requests:?}"
    );

    // A daemon that never answers: the client gives up after SUBMIT_ATTEMPTS.
    let _ = std::fs::remove_file(&path);
    let (daemon, seen) = lossy_daemon(path.clone(), usize::MAX);
    let failed = client.submit(&serde_json::json!({ "request": "x" })).await;
    assert!(failed.is_err());
    daemon.abort();
    assert_eq!(
        seen.lock().unwrap().len(),
        flotilla::cli::client::SUBMIT_ATTEMPTS as usize
    );
}

#[tokio::test]
async fn a_body_that_never_arrives_is_answered_408_and_frees_its_slot() {
    let daemon = LimitedDaemon::start(
        true,
        ServerLimits {
            max_connections: 1,
            body_read_timeout: Duration::from_millis(300),
            ..ServerLimits::default()
        },
    );
    let Bound::Tcp { addr, .. } = daemon.bound.clone() else {
        unreachable!()
    };
    let Bound::Tcp { token_file, .. } = &daemon.bound else {
        unreachable!()
    };
    let token = std::fs::read_to_string(token_file).unwrap();
    let token = token.trim();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The head promises 100 bytes; two arrive, then nothing.
    let head = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{{\""
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(30), async {
        let mut buf = vec![0u8; 4096];
        let n = stream.read(&mut buf).await.unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    })
    .await
    .expect("a stalled body must be answered");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("did not arrive"), "{answer}");
    drop(stream);
    // The only slot is free again.
    let runs: Vec<serde_json::Value> = daemon.client.get("/v1/runs").await.unwrap();
    assert!(runs.is_empty());
    daemon.stop();
}

/// A body over the cap is answered 413 with a JSON error, every time: the server reads the
/// rest of a declared-oversize body before answering, so a client still writing it gets the
/// answer instead of a broken pipe (which a 2 MiB body got now and then when the answer came
/// first).
#[tokio::test]
async fn an_oversize_body_always_gets_its_413() {
    let daemon = InProcessDaemon::start(false);
    for size in [2 * 1024 * 1024, 4 * 1024 * 1024] {
        for _ in 0..10 {
            let (status, answer) = daemon
                .client
                .raw(Method::POST, "/v1/runs", Some(vec![b' '; size]))
                .await
                .expect("the 413 reaches a client that writes its whole body first");
            assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
            let json: serde_json::Value = serde_json::from_slice(&answer).unwrap();
            assert!(
                json["error"].as_str().unwrap().contains("at most"),
                "{json}"
            );
        }
    }
}
