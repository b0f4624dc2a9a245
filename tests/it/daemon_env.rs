//! Shared environment for daemon tests: an in-process daemon on a temporary socket (or
//! loopback port), a real `flotilla daemon` child process, and temporary git repositories.
//! On failure, helpers print what the daemon logged.
//!
//! The in-process daemon has a journal fault switch and a captured log; a failing daemon test
//! prints the journal's last events and the daemon's log.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use flotilla::cli::client::{Client, Endpoint};
use flotilla::config::RunConfig;
use flotilla::daemon::{self, Bound, DaemonOptions, Listen};
use flotilla::scripted::Scenario;
use flotilla_actors::ports::JournalFaults;
use flotilla_actors::protocol::{Event, EventKind, RunOutcome};
use flotilla_actors::testing::within;
use futures::StreamExt;
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

/// A git repository in a temporary directory, `main` checked out, with one commit (a
/// README): task branches start from main's tip.
pub fn git_repo() -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    init_repo(dir.path());
    dir
}

/// Makes `path` a git repository on `main` with one commit of a README.
pub fn init_repo(path: &Path) {
    let repo = git2::Repository::init_opts(
        path,
        git2::RepositoryInitOptions::new().initial_head("main"),
    )
    .unwrap();
    commit_files(&repo, &[("README.md", "a test repository\n")], "start");
}

/// Commits `files` (written into the work tree) on the checked-out branch, as a test
/// identity (CI machines have none of their own).
pub fn commit_files(repo: &git2::Repository, files: &[(&str, &str)], message: &str) -> git2::Oid {
    let sig = git2::Signature::now("test", "test@example.com").unwrap();
    let mut index = repo.index().unwrap();
    for (path, text) in files {
        let full = repo.workdir().unwrap().join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(&full, text).unwrap();
        index.add_path(Path::new(path)).unwrap();
    }
    index.write().unwrap();
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let parents: Vec<git2::Commit> = repo
        .head()
        .ok()
        .and_then(|h| h.peel_to_commit().ok())
        .into_iter()
        .collect();
    let parents: Vec<&git2::Commit> = parents.iter().collect();
    repo.commit(Some("HEAD"), &sig, &sig, message, &tree, &parents)
        .unwrap()
}

/// A temporary directory holding a state directory (`state`, made) and a repository
/// (`repo`, [`init_repo`]): what a daemon test starts from. Keep the `TempDir`: dropping it
/// removes both.
pub fn state_and_repo() -> (TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let repo = tmp.path().join("repo");
    init_repo(&repo);
    (tmp, state, repo)
}

/// A commit on `parent` made without touching any work tree, as the merge queue and the
/// workers' seals make them: `Some(text)` writes a file (with `mode`), `None` deletes it.
/// `update_ref` (if any) moves to it.
pub fn commit_tree_update(
    repo: &git2::Repository,
    parent: &git2::Commit<'_>,
    files: &[(&str, Option<&str>)],
    mode: git2::FileMode,
    sig: &git2::Signature<'_>,
    message: &str,
    update_ref: Option<&str>,
) -> String {
    let mut update = git2::build::TreeUpdateBuilder::new();
    for (path, text) in files {
        match text {
            Some(text) => {
                let blob = repo.blob(text.as_bytes()).unwrap();
                update.upsert(*path, blob, mode);
            }
            None => {
                update.remove(*path);
            }
        }
    }
    let tree = update
        .create_updated(repo, &parent.tree().unwrap())
        .unwrap();
    let tree = repo.find_tree(tree).unwrap();
    repo.commit(update_ref, sig, sig, message, &tree, &[parent])
        .unwrap()
        .to_string()
}

/// A local fake of an OpenAI chat endpoint as a built-in agent's worker model: it answers
/// `first` once, then `then` to every later request. Point a run at it with
/// [`use_local_worker_model`].
pub async fn fake_worker_model(
    first: wiremock::ResponseTemplate,
    then: wiremock::ResponseTemplate,
) -> wiremock::MockServer {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer};
    let server = MockServer::start().await;
    for (priority, answer) in [(1, first), (2, then)] {
        let mock = Mock::given(method("POST"))
            .and(path("/v1/chat/completions"))
            .respond_with(answer)
            .with_priority(priority);
        let mock = if priority == 1 {
            mock.up_to_n_times(1)
        } else {
            mock
        };
        mock.mount(&server).await;
    }
    server
}

/// An OpenAI chat completion answering with `calls` (see [`tool_call`]) and `content`
/// (`None`: JSON null).
pub fn tool_calls_answer(
    content: Option<&str>,
    calls: serde_json::Value,
) -> wiremock::ResponseTemplate {
    wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({
        "id": "c", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": content, "tool_calls": calls },
            "finish_reason": "tool_calls",
        }],
        "usage": { "prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20 },
    }))
}

/// One tool call of an OpenAI chat completion.
pub fn tool_call(id: &str, name: &str, arguments: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "id": id, "type": "function",
        "function": { "name": name, "arguments": arguments.to_string() },
    })
}

/// Makes a run config's worker model `server` (a [`fake_worker_model`]), its key read
/// from `OPENAI_API_KEY` in the daemon's environment.
pub fn use_local_worker_model(config: &mut serde_json::Value, server: &wiremock::MockServer) {
    config["models"] = serde_json::json!({
        "providers": {"local": {
            "kind": "openai",
            "base_url": format!("{}/v1", server.uri()),
            "api_key_env": "OPENAI_API_KEY",
            "stream": false,
        }},
        "roles": {"worker": "local/m"},
    });
}

/// The branch the test repositories ([`init_repo`]) land on.
pub fn main_branch() -> flotilla::git::target::TargetBranch {
    flotilla::git::target::TargetBranch::new("main").unwrap()
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

/// How to start an in-process daemon.
#[derive(Default)]
pub struct DaemonSetup {
    /// Loopback TCP with a token instead of the Unix socket.
    pub tcp: bool,
    /// Reuse this state directory (a restart); a fresh one otherwise.
    pub state: Option<TempDir>,
    /// A fault switch between the run actors and the journal.
    pub faults: Option<JournalFaults>,
}

/// What an in-process daemon logged (its thread's tracing output).
#[derive(Clone, Default)]
pub struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl LogBuffer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;
    fn make_writer(&'a self) -> LogBuffer {
        self.clone()
    }
}

/// The last `limit` events of the journal in `state_dir`, one line each, for failure
/// reports (ripgrep-style: a failing test shows what the daemon did).
pub fn journal_dump(state_dir: &Path, limit: usize) -> String {
    let path = state_dir.join("journal.sqlite");
    let Ok(conn) =
        rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
    else {
        return format!("(no journal at {})", path.display());
    };
    let Ok(mut stmt) =
        conn.prepare("SELECT seq, run, kind, data FROM events ORDER BY seq DESC LIMIT ?1")
    else {
        return "(the journal has no events table)".into();
    };
    let rows: Vec<String> = stmt
        .query_map([limit as i64], |r| {
            Ok(format!(
                "#{} {} {} {}",
                r.get::<_, i64>(0)?,
                &r.get::<_, String>(1)?[..8],
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?
            ))
        })
        .map(|rows| rows.filter_map(Result::ok).collect())
        .unwrap_or_default();
    rows.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// Prints the journal and the daemon's log when the test is failing.
fn report_failure(state_dir: &Path, log: &str) {
    if std::thread::panicking() {
        eprintln!(
            "---- the test failed; journal (last 300 events) in {}:\n{}\n---- daemon log:\n{log}\n----",
            state_dir.display(),
            journal_dump(state_dir, 300)
        );
    }
}

/// A daemon running on its own thread (its own actix System) inside the test process.
pub struct InProcessDaemon {
    pub client: Client,
    pub bound: Bound,
    /// Kept alive for the daemon's lifetime (journal, socket).
    state: Option<TempDir>,
    log: LogBuffer,
    shutdown: CancellationToken,
    thread: Option<JoinHandle<anyhow::Result<()>>>,
}

impl InProcessDaemon {
    pub fn start(tcp: bool) -> Self {
        Self::start_with(DaemonSetup {
            tcp,
            ..DaemonSetup::default()
        })
    }

    pub fn start_with(setup: DaemonSetup) -> Self {
        let state = setup.state.unwrap_or_else(|| tempfile::tempdir().unwrap());
        let listen = if setup.tcp {
            Listen::Tcp("127.0.0.1:0".parse().unwrap())
        } else {
            Listen::Unix(state.path().join("daemon.sock"))
        };
        let options = DaemonOptions {
            state_dir: state.path().to_path_buf(),
            listen,
            journal_faults: setup.faults,
            server: Default::default(),
            journal_sync: Default::default(),
        };
        let shutdown = CancellationToken::new();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let token = shutdown.clone();
        let log = LogBuffer::default();
        let writer = log.clone();
        let thread = std::thread::spawn(move || {
            let subscriber = tracing_subscriber::fmt()
                .with_writer(writer)
                .with_ansi(false)
                .with_env_filter("info")
                .finish();
            let _log = tracing::subscriber::set_default(subscriber);
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
        let bound = match ready_rx.recv_timeout(Duration::from_secs(30)) {
            Ok(bound) => bound,
            Err(_) => {
                shutdown.cancel();
                let outcome = thread.join();
                panic!(
                    "the daemon did not become ready: {outcome:?}\nlog:\n{}",
                    log.text()
                );
            }
        };
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
            state: Some(state),
            log,
            shutdown,
            thread: Some(thread),
        }
    }

    /// What the daemon logged so far.
    pub fn log_text(&self) -> String {
        self.log.text()
    }

    pub fn state_dir(&self) -> &Path {
        self.state.as_ref().unwrap().path()
    }

    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Stops the daemon and waits for its thread.
    pub fn stop(self) {
        self.stop_keeping_state();
    }

    /// Stops the daemon and hands back its state directory, to start another on it.
    pub fn stop_keeping_state(mut self) -> TempDir {
        self.shutdown.cancel();
        if let Some(t) = self.thread.take() {
            t.join().unwrap().unwrap();
        }
        self.state.take().unwrap()
    }
}

impl Drop for InProcessDaemon {
    fn drop(&mut self) {
        if let Some(state) = &self.state {
            report_failure(state.path(), &self.log.text());
        }
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
    follow_to_end_within(client, run, since, Duration::from_secs(60)).await
}

/// [`follow_to_end`] for a run that takes long by design: `limit` only bounds a hang (a
/// loaded machine must not fail a run that is merely slow).
pub async fn follow_to_end_within(
    client: &Client,
    run: &str,
    since: Option<u64>,
    limit: Duration,
) -> Vec<Event> {
    let stream = client.events(run, since).await.unwrap();
    let events = tokio::time::timeout(limit, stream.map(|e| e.unwrap()).collect::<Vec<_>>())
        .await
        .unwrap_or_else(|_| panic!("the run did not finish within {limit:?}"));
    assert!(
        matches!(
            events.last().map(|e| &e.kind),
            Some(EventKind::RunFinished { .. })
        ),
        "the stream ended before run_finished"
    );
    events
}

/// Follows a run's stream until `task` attempt `attempt` starts (within 60 s); the
/// daemon's log says why if it never does.
pub async fn until_attempt_starts(
    client: &Client,
    run: &str,
    attempt: u32,
    daemon: &DaemonProcess,
) {
    let mut stream = client.events(run, None).await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(event) = stream.next().await {
            if matches!(event.unwrap().kind, EventKind::TaskStarted { attempt: a, .. } if a == attempt)
            {
                return;
            }
        }
        panic!("the stream ended before attempt {attempt} started");
    })
    .await
    .unwrap_or_else(|_| panic!("attempt {attempt} did not start; log:\n{}", daemon.log()));
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
    state_dir: std::path::PathBuf,
}

impl DaemonProcess {
    /// Starts the binary and returns once it logged that it listens.
    pub fn start(state_dir: &Path) -> Self {
        Self::start_with_env(state_dir, &[])
    }

    /// Starts the binary with extra environment variables.
    pub fn start_with_env(state_dir: &Path, env: &[(&str, &str)]) -> Self {
        Self::spawn(state_dir, env, false)
    }

    /// Starts the binary armed to die by its own hand (a fail point in `env`): it returns
    /// once the daemon listens or has already died. A run it resumes can reach the fail
    /// point before the daemon binds its socket (it resumes runs first), above all on a
    /// loaded machine.
    pub fn start_armed(state_dir: &Path, env: &[(&str, &str)]) -> Self {
        Self::spawn(state_dir, env, true)
    }

    fn spawn(state_dir: &Path, env: &[(&str, &str)], may_die: bool) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .arg("--state-dir")
            .arg(state_dir)
            .arg("daemon")
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
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
                // Logged before it is announced: a test reading the log after start sees it.
                let ready = line.contains("listening on");
                sink.lock().unwrap().push(line);
                if ready {
                    let _ = ready_tx.send(());
                }
            }
            // Its standard error closed: the daemon has ended.
            let _ = ready_tx.send(());
        });
        let listening = |log: &Mutex<Vec<String>>| {
            log.lock()
                .unwrap()
                .iter()
                .any(|line| line.contains("listening on"))
        };
        if ready_rx.recv_timeout(Duration::from_secs(30)).is_err() || !(may_die || listening(&log))
        {
            let _ = child.kill();
            panic!(
                "the daemon did not start; it logged:\n{}",
                log.lock().unwrap().join("\n")
            );
        }
        DaemonProcess {
            child,
            log,
            state_dir: state_dir.to_path_buf(),
        }
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

    /// Waits, at most `limit`, for the daemon to exit by itself (a fail point that kills
    /// it): its exit status, or `None` if it still runs.
    pub async fn exited_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        within(limit, || std::future::ready(self.exited())).await
    }

    /// Its exit status if it has exited, now (no wait).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Waits, at most `limit`, for a line of the log containing `needle` (stderr is read on
    /// a thread of its own, so the last lines of a dead daemon may come a little later).
    pub async fn logged_within(&self, needle: &str, limit: Duration) -> bool {
        within(limit, || async {
            let log = self.log.lock().unwrap();
            log.iter().any(|l| l.contains(needle)).then_some(())
        })
        .await
        .is_some()
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        report_failure(&self.state_dir, &self.log());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The built binary as a user runs it against the daemon of `state_dir`: no colour, and
/// no socket from the test's own environment.
pub fn flotilla(state_dir: &Path) -> assert_cmd::Command {
    let mut cmd = assert_cmd::Command::cargo_bin("flotilla").unwrap();
    cmd.arg("--state-dir")
        .arg(state_dir)
        .env("NO_COLOR", "1")
        .env_remove("FLOTILLA_SOCKET");
    cmd
}
