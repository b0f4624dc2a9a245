//! Shared environment for daemon tests: an in-process daemon on a temporary socket (or
//! loopback port), a real `flotilla daemon` child process, and temporary git repositories.
//! On failure, helpers print what the daemon logged.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use flotilla::client::{Client, Endpoint};
use flotilla::config::RunConfig;
use flotilla::daemon::{self, Bound, DaemonOptions, Listen};
use flotilla::scripted::Scenario;
use flotilla_actors::protocol::{Event, EventKind, RunOutcome};
use futures::StreamExt;
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

/// A git repository in a temporary directory.
pub fn git_repo() -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    git2::Repository::init(dir.path()).unwrap();
    dir
}

/// A run config (as the API takes it) around a scenario written in TOML.
pub fn run_config(scenario_toml: &str, max_workers: usize) -> serde_json::Value {
    let mut config = RunConfig {
        scenario: Scenario::from_toml(scenario_toml).unwrap(),
        ..RunConfig::default()
    };
    config.limits.max_workers = max_workers;
    config.limits.max_nodes = 1_000;
    serde_json::to_value(config).unwrap()
}

/// A daemon running on its own thread (its own actix System) inside the test process.
pub struct InProcessDaemon {
    pub client: Client,
    pub bound: Bound,
    /// Kept alive for the daemon's lifetime (journal, socket).
    _state: TempDir,
    shutdown: CancellationToken,
    thread: Option<JoinHandle<anyhow::Result<()>>>,
}

impl InProcessDaemon {
    pub fn start(tcp: bool) -> Self {
        let state = tempfile::tempdir().unwrap();
        let listen = if tcp {
            Listen::Tcp("127.0.0.1:0".parse().unwrap())
        } else {
            Listen::Unix(state.path().join("daemon.sock"))
        };
        let options = DaemonOptions {
            state_dir: state.path().to_path_buf(),
            listen,
            server: Default::default(),
        };
        let shutdown = CancellationToken::new();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let token = shutdown.clone();
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
        let bound = ready_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the daemon did not become ready");
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
        InProcessDaemon {
            client: Client::new(endpoint),
            bound,
            _state: state,
            shutdown,
            thread: Some(thread),
        }
    }

    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Stops the daemon and waits for its thread.
    pub fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(t) = self.thread.take() {
            t.join().unwrap().unwrap();
        }
    }
}

impl Drop for InProcessDaemon {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Submits a run and returns its id.
pub async fn submit(client: &Client, repo: &Path, config: serde_json::Value) -> String {
    let body = serde_json::json!({ "request": "build the thing", "repo": repo, "config": config });
    let created: serde_json::Value = client
        .json(hyper::Method::POST, "/v1/runs", Some(&body))
        .await
        .unwrap();
    created["id"].as_str().unwrap().to_string()
}

/// Follows a run's stream to its end (bounded by a timeout) and returns every event.
pub async fn follow_to_end(client: &Client, run: &str, since: Option<u64>) -> Vec<Event> {
    let stream = client.events(run, since).await.unwrap();
    let events = tokio::time::timeout(
        Duration::from_secs(60),
        stream.map(|e| e.unwrap()).collect::<Vec<_>>(),
    )
    .await
    .expect("the run did not finish within 60 s");
    assert!(
        matches!(
            events.last().map(|e| &e.kind),
            Some(EventKind::RunFinished { .. })
        ),
        "the stream ended before run_finished"
    );
    events
}

pub fn outcome(events: &[Event]) -> Option<RunOutcome> {
    events.iter().find_map(|e| match e.kind {
        EventKind::RunFinished { outcome, .. } => Some(outcome),
        _ => None,
    })
}

/// A real `flotilla daemon` child process. Its stderr is collected for failure reports.
pub struct DaemonProcess {
    pub child: Child,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl DaemonProcess {
    /// Starts the binary and returns once it logged that it listens.
    pub fn start(state_dir: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .arg("--state-dir")
            .arg(state_dir)
            .arg("daemon")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start flotilla daemon");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("listening on") {
                    let _ = ready_tx.send(());
                }
                sink.lock().unwrap().push(line);
            }
        });
        if ready_rx.recv_timeout(Duration::from_secs(30)).is_err() {
            let _ = child.kill();
            panic!(
                "the daemon did not start; it logged:\n{}",
                log.lock().unwrap().join("\n")
            );
        }
        DaemonProcess { child, log }
    }

    pub fn client(state_dir: &Path) -> Client {
        Client::new(Endpoint::Unix(state_dir.join("daemon.sock")))
    }

    /// SIGKILL: no chance to clean up, like a crash or an OOM kill.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
