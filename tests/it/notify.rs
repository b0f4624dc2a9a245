//! `[notify]` (ADR-034): a run's webhook hears, as JSON POSTs to a local HTTP server (axum,
//! in the test), that a task needs a decision, that the run completed, that a run failed;
//! a failing or silent webhook is retried with backoff, each request bounded by its
//! timeout; the desktop notification runs `notify-send` with the text escaped.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use flotilla::config::{NotifyConfig, RunConfig};
use flotilla::daemon::notify::{self, Notification};
use flotilla::scripted::Scenario;
use hyper::Method;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::daemon::USER_DECIDES;
use crate::daemon_env::{InProcessDaemon, follow_to_end, git_repo, outcome};

/// What the hook does with the n-th request it gets (from 0).
#[derive(Clone, Copy)]
enum Answer {
    Ok,
    Fail,
    /// Never answers (the client's timeout must end the request).
    Hang,
}

#[derive(Clone)]
struct Hook {
    got: mpsc::UnboundedSender<Value>,
    count: Arc<AtomicUsize>,
    script: Arc<Vec<Answer>>,
}

async fn hook(State(hook): State<Hook>, body: axum::body::Bytes) -> StatusCode {
    let n = hook.count.fetch_add(1, Ordering::SeqCst);
    let _ = hook
        .got
        .send(serde_json::from_slice(&body).unwrap_or(Value::Null));
    match hook.script.get(n).copied().unwrap_or(Answer::Ok) {
        Answer::Ok => StatusCode::NO_CONTENT,
        Answer::Fail => StatusCode::SERVICE_UNAVAILABLE,
        Answer::Hang => std::future::pending().await,
    }
}

/// A local webhook on a loopback port: its URL and what it receives, in order.
async fn webhook(script: Vec<Answer>) -> (String, mpsc::UnboundedReceiver<Value>) {
    let (got, rx) = mpsc::unbounded_channel();
    let state = Hook {
        got,
        count: Arc::default(),
        script: Arc::new(script),
    };
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(hook))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/hook"), rx)
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Value>) -> Value {
    tokio::time::timeout(Duration::from_secs(60), rx.recv())
        .await
        .expect("the webhook heard nothing within 60 s")
        .unwrap()
}

fn config_with_webhook(scenario: &str, url: &str) -> Value {
    let mut config = RunConfig {
        scenario: Scenario::from_toml(scenario).unwrap(),
        notify: NotifyConfig {
            webhook: Some(url.to_string()),
            ..NotifyConfig::default()
        },
        ..RunConfig::default()
    };
    config.limits.max_workers = 2;
    serde_json::to_value(config).unwrap()
}

async fn submit(daemon: &InProcessDaemon, repo: &std::path::Path, config: Value) -> String {
    let body = json!({ "request": "build \u{1b}[2Jthe thing", "repo": repo, "config": config });
    let created: Value = daemon
        .client
        .json(Method::POST, "/v1/runs", Some(&body))
        .await
        .unwrap();
    created["id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn the_webhook_hears_that_a_task_needs_a_decision_and_that_the_run_completed() {
    let (url, mut heard) = webhook(vec![]).await;
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let run = submit(
        &daemon,
        repo.path(),
        config_with_webhook(USER_DECIDES, &url),
    )
    .await;

    let asked = next(&mut heard).await;
    assert_eq!(asked["event"], "needs_decision", "{asked}");
    assert_eq!(asked["run"], run.as_str());
    assert_eq!(asked["task"], "t1");
    assert!(
        asked["message"]
            .as_str()
            .unwrap()
            .contains("flotilla decide"),
        "{asked}"
    );
    // The request's escape sequence arrives inert.
    assert_eq!(asked["request"], "build  [2Jthe thing", "{asked}");
    assert!(asked["seq"].as_u64().unwrap() > 0);

    let (status, answer) = daemon
        .client
        .raw(
            Method::POST,
            &format!("/v1/runs/{run}/tasks/t1/decision"),
            Some(serde_json::to_vec(&json!({ "decision": "accept", "subtask": "t1.2" })).unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(
        status,
        StatusCode::ACCEPTED,
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let done = next(&mut heard).await;
    assert_eq!(done["event"], "run_completed", "{done}");
    assert_eq!(done["run"], run.as_str());
    assert!(done.get("task").is_none(), "{done}");
    daemon.stop();
    assert!(heard.try_recv().is_err(), "each was told once");
}

#[tokio::test]
async fn a_failed_run_is_told_and_a_failing_webhook_is_retried_until_it_answers() {
    const BLOCKED: &str = r#"
[[planner.answers]]
tasks = [{ description = "Migrate the database", scope = ["migrations"] }]
[tasks.t1]
outcome = "blocked"
summary = "no database credentials"
"#;
    // A 503, then no answer at all (the timeout ends it), then a 204.
    let (url, mut heard) = webhook(vec![Answer::Fail, Answer::Hang, Answer::Ok]).await;
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let mut config = config_with_webhook(BLOCKED, &url);
    config["notify"]["webhook_timeout_secs"] = json!(1);
    config["notify"]["on"] = json!(["run_failed"]);
    let run = submit(&daemon, repo.path(), config).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(
        outcome(&events),
        Some(flotilla_actors::protocol::RunOutcome::Failed)
    );
    let mut attempts = Vec::new();
    for _ in 0..3 {
        attempts.push(next(&mut heard).await);
    }
    for told in &attempts {
        assert_eq!(told["event"], "run_failed", "{told}");
        assert_eq!(told, &attempts[0], "the same notification each time");
    }
    daemon.stop();
}

fn note() -> Notification {
    Notification {
        event: "needs_decision",
        run: "0190".into(),
        task: Some("t1".into()),
        title: "flotilla: run 0190 needs you".into(),
        message: "task t1 <b>waits</b> & more".into(),
        request: "build it".into(),
        seq: 7,
        at_ms: 1,
    }
}

/// Writes an executable script from a child process. Written by this process, its open
/// descriptor would be copied into any child another test thread forks meanwhile, until
/// that child's exec, and running the script then fails with "text file busy".
fn write_program(path: &std::path::Path, text: &str) {
    use std::io::Write;
    let mut writer = std::process::Command::new("sh")
        .args(["-c", "cat > \"$1\" && chmod 755 \"$1\"", "sh"])
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    writer
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    assert!(writer.wait().unwrap().success());
}

#[tokio::test]
async fn the_desktop_notification_runs_notify_send_with_its_text_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let args = dir.path().join("args");
    let program = dir.path().join("notify-send");
    write_program(
        &program,
        &format!(
            "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n--\\n' \"$a\"; done > {}\n",
            args.display()
        ),
    );
    let path = std::env::join_paths([std::path::Path::new("/nonexistent"), dir.path()]).unwrap();
    assert_eq!(notify::find_notify_send(Some(&path)), Some(program.clone()));
    assert_eq!(
        notify::find_notify_send(Some(std::ffi::OsStr::new("/nonexistent"))),
        None
    );

    notify::desktop(&program, &note()).await.unwrap();
    let told = std::fs::read_to_string(&args).unwrap();
    assert!(told.contains("flotilla: run 0190 needs you"), "{told}");
    assert!(
        told.contains("task t1 &lt;b&gt;waits&lt;/b&gt; &amp; more"),
        "{told}"
    );

    // A notify-send that fails is an error, not a hang or a panic.
    write_program(&program, "#!/bin/sh\nexit 3\n");
    assert!(notify::desktop(&program, &note()).await.is_err());
}

#[tokio::test]
async fn a_webhook_that_never_succeeds_gives_up_after_its_attempts() {
    let (url, mut heard) = webhook(vec![Answer::Fail; 10]).await;
    let delivery = notify::Delivery::new(None)
        .unwrap()
        .with_backoff(Duration::from_millis(10));
    let config = NotifyConfig {
        webhook: Some(url),
        webhook_attempts: 3,
        ..NotifyConfig::default()
    };
    delivery.deliver(&config, &note()).await;
    for _ in 0..3 {
        assert_eq!(next(&mut heard).await["seq"], 7);
    }
    assert!(heard.try_recv().is_err(), "no fourth attempt");
}
