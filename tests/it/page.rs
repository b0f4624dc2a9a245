//! The live page (ADR-034), through the built binary: `flotilla ui` on a Unix-socket daemon opens a loopback
//! listener and prints a one-time link; the page, in headless Chromium (Debian's `chromium`),
//! draws every task of a run, follows it from waiting for a decision to completed without a
//! reload, shows a task's handoff on click, and shows model text as text. Screenshots of
//! the run in progress and finished are written under target/ (the path is printed).
//!
//! Chromium is driven over its DevTools pipe (`--remote-debugging-pipe`: JSON messages on
//! file descriptors 3 and 4, each ended by a NUL), which needs no WebSocket client.
//! `demo` drives the page on `flotilla demo --pause`'s run instead of a test's own.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use base64::Engine;
use flotilla_actors::protocol::EventKind;
use futures::StreamExt;
use hyper::{Method, StatusCode};
use serde_json::{Value, json};

use flotilla::cli::client::Client;

use crate::daemon_env::{DaemonProcess, InProcessDaemon, git_repo, run_config};

mod demo;

/// t1 lands a file; t2 splits into two designs and waits for the user to pick one. The
/// first description and the request hold markup, which the page must show as text.
const PAGE_RUN: &str = r#"
[[planner.answers]]
tasks = [
  { description = "lay the <b>foundation</b> & <img src=x>", scope = ["base.txt"] },
  { description = "explore two designs", scope = ["src"] },
]
[tasks.t1]
writes = { "base.txt" = "base\n" }
summary = "the base is laid"
[tasks.t2]
outcome = "subplan"
[tasks.t2.subplan]
reason = "ambiguity"
stop_when = "user_decision"
subtasks = [
  { description = "design one", scope = ["src/one.rs"] },
  { description = "design two", scope = ["src/two.rs"], depends_on = [0] },
]
[tasks."t2.1"]
writes = { "src/one.rs" = "// one\n" }
[tasks."t2.2"]
summary = "design two, the better one"
writes = { "src/two.rs" = "// two\n" }
"#;

const REQUEST: &str = "build <script>alert(1)</script> the thing";

/// Submits [`PAGE_RUN`] and returns its id once t2 waits for the decision.
async fn run_waiting_for_a_decision(client: &Client, repo: &Path) -> String {
    let body = json!({ "request": REQUEST, "repo": repo, "config": run_config(PAGE_RUN, 2) });
    let created: Value = client
        .json(Method::POST, "/v1/runs", Some(&body))
        .await
        .unwrap();
    let run = created["id"].as_str().unwrap().to_string();
    let mut stream = client.events(&run, None).await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(e) = stream.next().await {
            if matches!(e.unwrap().kind, EventKind::AwaitingUserDecision { .. }) {
                return;
            }
        }
        panic!("the run ended before it asked for a decision");
    })
    .await
    .expect("no decision was asked for within 60 s");
    run
}

/// `flotilla ui RUN` against the daemon's socket in `state_dir`: the link it prints.
fn ui_link(state_dir: &Path, run: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .arg("--state-dir")
        .arg(state_dir)
        .args(["ui", run])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let url = stdout.lines().next().unwrap().trim().to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{stdout}");
    assert!(url.contains("/ui/login?code="), "{stdout}");
    url
}

fn origin(url: &str) -> String {
    let rest = url.strip_prefix("http://").unwrap();
    format!("http://{}", rest.split('/').next().unwrap())
}

fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_page_link_works_once_and_its_cookie_only_reads() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let run = run_waiting_for_a_decision(&daemon.client, repo.path()).await;
    let link = ui_link(daemon.state_dir(), &run[..8]);
    assert!(link.ends_with(&format!("&run={run}")), "{link}");
    let origin = origin(&link);
    let http = http();

    // Without a credential, the loopback listener serves the page's files and nothing else.
    let runs = format!("{origin}/v1/runs");
    assert_eq!(
        http.get(&runs).send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    let index = http.get(format!("{origin}/ui/")).send().await.unwrap();
    assert_eq!(index.status(), StatusCode::OK);
    let csp = index.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'self'"), "{csp}");
    // The bearer token of `--listen` works there too: the same token as the API.
    let token = std::fs::read_to_string(daemon.state_dir().join("token")).unwrap();
    let with_token = http
        .get(&runs)
        .bearer_auth(token.trim())
        .send()
        .await
        .unwrap();
    assert_eq!(with_token.status(), StatusCode::OK);

    // The link gives a session cookie once, and sends the browser to the run's page.
    let login = http.get(&link).send().await.unwrap();
    assert_eq!(login.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        login.headers()["location"],
        format!("/ui/?run={run}").as_str()
    );
    let cookie = login.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains(token.trim()),
        "the token itself never reaches the browser"
    );
    let again = http.get(&link).send().await.unwrap();
    assert_eq!(
        again.status(),
        StatusCode::UNAUTHORIZED,
        "the link works once"
    );
    let session = cookie.split(';').next().unwrap().to_string();

    // The cookie reads (status, events) but never acts, and only under a loopback name.
    let status = http
        .get(format!("{origin}/v1/runs/{run}"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(status.status(), StatusCode::OK);
    let decide = http
        .post(format!("{origin}/v1/runs/{run}/tasks/t2/decision"))
        .header("cookie", &session)
        .json(&json!({ "decision": "fail" }))
        .send()
        .await
        .unwrap();
    assert_eq!(decide.status(), StatusCode::UNAUTHORIZED);
    let rebound = http
        .get(format!("{origin}/v1/runs"))
        .header("cookie", &session)
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), StatusCode::UNAUTHORIZED);
    // A second `flotilla ui` reuses the listener.
    let second = ui_link(daemon.state_dir(), &run);
    assert!(
        second.starts_with(&format!("{origin}/")),
        "{second} is not on {origin}"
    );
    daemon.stop();
}

#[tokio::test]
async fn a_daemon_on_loopback_tcp_serves_the_page_on_its_own_port() {
    let daemon = InProcessDaemon::start(true);
    let flotilla::daemon::Bound::Tcp { addr, .. } = daemon.bound.clone() else {
        panic!("a TCP daemon");
    };
    let link: Value = daemon
        .client
        .json(Method::POST, "/v1/ui", Some(&json!({})))
        .await
        .unwrap();
    let url = link["url"].as_str().unwrap();
    assert!(
        url.starts_with(&format!("http://{addr}/ui/login?code=")),
        "{url}"
    );
    assert_eq!(link["expires_in_secs"], 300);
    let login = http().get(url).send().await.unwrap();
    assert_eq!(login.status(), StatusCode::SEE_OTHER);
    assert_eq!(login.headers()["location"], "/ui/");
    // Without the token, no link: the page is as private as the API.
    let anonymous = http()
        .post(format!("http://{addr}/v1/ui"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    daemon.stop();
}

/// Chromium, if installed: Debian's `chromium`, or `chromium-browser`. Without it a
/// browser test says it was skipped (and returns).
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .flat_map(|dir| ["chromium", "chromium-browser"].map(|name| dir.join(name)))
        .find(|p| p.is_file());
    if found.is_none() {
        eprintln!(
            "SKIPPED: the live page's browser test needs Chromium (`apt-get install chromium`); \
             .ci/run installs it"
        );
    }
    found
}

/// Headless Chromium on its DevTools pipe.
struct Browser {
    child: Child,
    to: std::fs::File,
    from: mpsc::Receiver<Value>,
    next_id: u64,
    session: Option<String>,
    _profile: tempfile::TempDir,
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is two ints for pipe2 to fill; both ends are owned right after.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: pipe2 succeeded, so both are open descriptors nobody else owns.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

impl Browser {
    fn start(program: &Path) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let (their_in, our_out) = pipe();
        let (our_in, their_out) = pipe();
        let (child_in, child_out) = (their_in.as_raw_fd(), their_out.as_raw_fd());
        let mut command = Command::new(program);
        command
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--remote-debugging-pipe",
                "--window-size=1400,1000",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls (dup, dup2) between fork and exec.
        unsafe {
            command.pre_exec(move || {
                // Copied first, so that moving one to 3 cannot close the other.
                let (a, b) = (libc::dup(child_in), libc::dup(child_out));
                if a < 0 || b < 0 || libc::dup2(a, 3) < 0 || libc::dup2(b, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().unwrap();
        drop((their_in, their_out));
        let (tx, rx) = mpsc::channel();
        let reader = std::fs::File::from(our_in);
        std::thread::spawn(move || {
            let mut reader = BufReader::new(reader);
            loop {
                let mut message = Vec::new();
                match reader.read_until(0, &mut message) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        message.pop();
                        if let Ok(value) = serde_json::from_slice::<Value>(&message)
                            && tx.send(value).is_err()
                        {
                            return;
                        }
                    }
                }
            }
        });
        Browser {
            child,
            to: std::fs::File::from(our_out),
            from: rx,
            next_id: 0,
            session: None,
            _profile: profile,
        }
    }

    /// Sends a command (to the page's session once attached) and waits for its answer,
    /// at most `patience`; events that come meanwhile go to `seen`.
    fn call_with(
        &mut self,
        method: &str,
        params: Value,
        patience: Duration,
        seen: &mut Vec<Value>,
    ) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = &self.session {
            message["sessionId"] = json!(session);
        }
        let mut bytes = serde_json::to_vec(&message).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap();
        loop {
            let answer = self
                .from
                .recv_timeout(patience)
                .unwrap_or_else(|_| panic!("Chromium did not answer {method} within {patience:?}"));
            if answer["id"] == id {
                assert!(answer.get("error").is_none(), "{method}: {answer}");
                return answer["result"].clone();
            }
            seen.push(answer);
        }
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        self.call_with(method, params, Duration::from_secs(60), &mut Vec::new())
    }

    /// Opens `url` in a new tab and returns once its load event fired.
    fn open(&mut self, url: &str) {
        let target = self.call("Target.createTarget", json!({ "url": "about:blank" }));
        let attached = self.call(
            "Target.attachToTarget",
            json!({ "targetId": target["targetId"], "flatten": true }),
        );
        self.session = Some(attached["sessionId"].as_str().unwrap().to_string());
        self.call("Page.enable", json!({}));
        let mut seen = Vec::new();
        self.call_with(
            "Page.navigate",
            json!({ "url": url }),
            Duration::from_secs(60),
            &mut seen,
        );
        if seen.iter().any(|e| e["method"] == "Page.loadEventFired") {
            return;
        }
        loop {
            let event = self
                .from
                .recv_timeout(Duration::from_secs(60))
                .expect("the page did not load within 60 s");
            if event["method"] == "Page.loadEventFired" {
                return;
            }
        }
    }

    /// Evaluates `expression` in the page, awaiting a promise, and returns its value.
    fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "awaitPromise": true, "returnByValue": true }),
        );
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression}: {result}"
        );
        result["result"]["value"].clone()
    }

    /// A PNG of the whole page, written to `path`.
    fn screenshot(&mut self, path: &Path) {
        let shot = self.call(
            "Page.captureScreenshot",
            json!({ "format": "png", "captureBeyondViewport": true }),
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::write(path, png).unwrap();
        println!("screenshot: {}", path.display());
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The task ids of the run, as the API's status has them.
async fn task_ids(client: &Client, run: &str) -> Vec<String> {
    let status: Value = client.get(&format!("/v1/runs/{run}")).await.unwrap();
    let mut ids: Vec<String> = status["graph"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

fn shown(value: Value) -> Vec<String> {
    let mut ids: Vec<String> = serde_json::from_value(value).unwrap();
    ids.sort();
    ids
}

#[tokio::test]
async fn the_live_page_draws_every_task_and_follows_the_run_to_its_end_in_chromium() {
    let Some(program) = chromium() else {
        return;
    };
    // The real binary, as a user runs it.
    let state = tempfile::tempdir().unwrap();
    let daemon = DaemonProcess::start(state.path());
    let client = DaemonProcess::client(state.path());
    let repo = git_repo();
    let run = run_waiting_for_a_decision(&client, repo.path()).await;
    let link = ui_link(state.path(), &run);
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("page-screenshots");
    std::fs::create_dir_all(&shots).unwrap();

    let mut browser = Browser::start(&program);
    browser.open(&link);
    // In progress: t2 waits for the decision; every task is drawn.
    let waiting = task_ids(&client, &run).await;
    assert_eq!(waiting, ["t1", "t2", "t2.1", "t2.2"]);
    let drawn = browser.eval(&format!(
        "flotilla.until(() => document.body.dataset.runState === 'running' \
         && flotilla.tasksShown().length === {}).then(() => flotilla.tasksShown())",
        waiting.len()
    ));
    assert_eq!(shown(drawn), waiting);
    let awaiting = browser.eval(
        "flotilla.until(() => document.querySelector('g.node.awaiting')) \
         .then(() => document.querySelector('g.node.awaiting').dataset.task)",
    );
    assert_eq!(awaiting, "t2");
    // Model text is text: no element was made of it.
    let markup = browser.eval(
        "[document.querySelectorAll('main b, main img, header script').length, \
          document.getElementById('request').textContent, \
          document.querySelector('g.node[data-task=\"t1\"] title').textContent]",
    );
    assert_eq!(markup[0], 0, "{markup}");
    assert_eq!(markup[1], REQUEST);
    assert!(
        markup[2]
            .as_str()
            .unwrap()
            .contains("<b>foundation</b> & <img src=x>"),
        "{markup}"
    );
    // A click shows the task's attempts and handoff.
    let story = browser.eval(
        "document.querySelector('g.node[data-task=\"t2.2\"]').dispatchEvent(new MouseEvent('click')); \
         flotilla.until(() => document.getElementById('task-body').textContent.includes('design two, the better one')) \
         .then(() => document.getElementById('task-body').textContent)",
    );
    let story = story.as_str().unwrap();
    assert!(story.contains("attempt 1"), "{story}");
    assert!(story.contains("Handoff (complete)"), "{story}");
    browser.screenshot(&shots.join("run-in-progress.png"));

    // The user decides; the same page follows the run to its end without a reload.
    let decided = client
        .raw(
            Method::POST,
            &format!("/v1/runs/{run}/tasks/t2/decision"),
            Some(serde_json::to_vec(&json!({ "decision": "accept", "subtask": "t2.2" })).unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(decided.0, StatusCode::ACCEPTED);
    let finished = browser.eval(
        "flotilla.until(() => document.body.dataset.runState === 'completed') \
         .then(() => [flotilla.tasksShown(), document.getElementById('main-health').textContent, \
                      document.getElementById('stream').textContent])",
    );
    let all = task_ids(&client, &run).await;
    assert_eq!(
        shown(finished[0].clone()),
        all,
        "every task of the run is on the page"
    );
    let states =
        browser.eval("Array.from(document.querySelectorAll('g.node'), g => g.dataset.state)");
    assert!(
        states.as_array().unwrap().iter().all(|s| s == "completed"),
        "{states}"
    );
    assert!(
        finished[1].as_str().unwrap().starts_with("green"),
        "{finished}"
    );
    let picked = browser.eval("document.getElementById('runs').selectedOptions[0].textContent");
    assert!(picked.as_str().unwrap().contains(" completed "), "{picked}");
    browser.screenshot(&shots.join("run-finished.png"));
    drop(browser);
    drop(daemon);
}
