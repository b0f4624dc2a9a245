//! One daemon per state directory, supervised runs, and a journal that can fail: the
//! daemon (in-process or a real child process) driven through its API, with faults injected
//! between the run actors and the journal, and the outcome checked from the journal itself.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use flotilla::cli::client::Client;
use flotilla::daemon::supervisor::{
    GetRunMembers, Member, RunThreadCount, RunThreads, StartRun, Supervisor,
};
use flotilla::journal::{RunRecord, SqliteJournal};
use flotilla_actors::ports::{Journal, JournalFault, JournalFaults, SystemClock};
use flotilla_actors::protocol::{
    AttemptFailure, Event, EventKind, FailureReason, RunId, RunOutcome, TaskId,
};
use flotilla_actors::supervision::StopMember;
use flotilla_actors::testing::{PATIENCE, blocking_within, within};
use futures::StreamExt;

use crate::daemon_env::*;

/// `n` independent tasks, each taking `delay_ms`.
fn scenario(n: usize, delay_ms: u64, extra: &str) -> String {
    let mut s = format!("[agent]\ndelay_ms = {delay_ms}\n\n[[planner.answers]]\ntasks = [\n");
    for i in 0..n {
        s.push_str(&format!(
            "  {{ description = \"task {i}\", scope = [\"src/{i}.rs\"] }},\n"
        ));
    }
    s.push_str("]\n");
    s.push_str(extra);
    s
}

/// Every event of a run, read straight from the SQLite file.
fn journal_kinds(state_dir: &Path, run: &str) -> Vec<EventKind> {
    let conn = rusqlite::Connection::open(state_dir.join("journal.sqlite")).unwrap();
    let mut stmt = conn
        .prepare("SELECT data FROM events WHERE run = ?1 ORDER BY seq")
        .unwrap();
    stmt.query_map([run], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|d| serde_json::from_str::<EventKind>(&d.unwrap()).unwrap())
        .collect()
}

/// Each task added exactly once and completed exactly once.
fn assert_each_task_completed_once(kinds: &[EventKind]) {
    let mut completions: BTreeMap<TaskId, usize> = BTreeMap::new();
    for k in kinds {
        match k {
            EventKind::TaskAdded { task, .. } => {
                assert!(
                    completions.insert(task.clone(), 0).is_none(),
                    "{task} added twice"
                )
            }
            EventKind::TaskCompleted { task, .. } => *completions.get_mut(task).unwrap() += 1,
            _ => {}
        }
    }
    assert!(!completions.is_empty());
    for (task, n) in completions {
        assert_eq!(n, 1, "{task} completed {n} times");
    }
}

/// Waits until the run's stream shows an event `pick` accepts (bounded).
async fn wait_for(client: &Client, run: &str, what: &str, pick: impl Fn(&Event) -> bool) -> Event {
    let mut stream = client.events(run, None).await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(item) = stream.next().await {
            if let Ok(e) = item
                && pick(&e)
            {
                return e;
            }
        }
        panic!("the stream ended before {what}");
    })
    .await
    .unwrap_or_else(|_| panic!("no {what} within 60 s"))
}

#[tokio::test]
async fn a_second_daemon_on_the_same_state_dir_exits_at_once_naming_the_first_and_writes_nothing() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let first = DaemonProcess::start(state.path());
    let client = DaemonProcess::client(state.path());
    let run = submit(&client, repo.path(), run_config(&scenario(6, 300, ""), 2)).await;
    wait_for(&client, &run, "a started task", |e| {
        matches!(e.kind, EventKind::TaskStarted { .. })
    })
    .await;

    // On loopback TCP nothing else would stop it; on the default socket neither must the
    // socket be what stops it (the lock comes first).
    for listen in [Some("127.0.0.1:0"), None] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla"));
        command.arg("--state-dir").arg(state.path()).arg("daemon");
        if let Some(addr) = listen {
            command.arg("--listen").arg(addr);
        }
        let stderr_file = tempfile::NamedTempFile::new().unwrap();
        let mut second = command
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr_file.reopen().unwrap())
            .spawn()
            .unwrap();
        let status = within(PATIENCE, || std::future::ready(second.try_wait().unwrap())).await;
        let Some(status) = status else {
            let _ = second.kill();
            let _ = second.wait();
            panic!("the second daemon must exit at once, not serve");
        };
        let stderr = std::fs::read_to_string(stderr_file.path()).unwrap();
        assert!(!status.success(), "{stderr}");
        assert!(
            stderr.contains(&format!("PID {}", first.child.id())),
            "names the holder: {stderr}"
        );
    }

    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    let kinds = journal_kinds(state.path(), &run);
    assert!(
        !kinds
            .iter()
            .any(|k| matches!(k, EventKind::TaskInterrupted { .. })),
        "the second daemon interrupted nothing"
    );
    assert_each_task_completed_once(&kinds);
    drop(first);
}

/// Writes runs straight into a journal: one healthy, one whose events do not fit its graph,
/// one with an undecodable row, one whose config is unreadable.
async fn journal_with_damaged_runs(state_dir: &Path) -> [RunId; 4] {
    let journal =
        SqliteJournal::open(&state_dir.join("journal.sqlite"), Arc::new(SystemClock)).unwrap();
    let config =
        serde_json::from_value::<serde_json::Value>(run_config(&scenario(3, 0, ""), 2)).unwrap();
    let ids = [
        RunId::generate(),
        RunId::generate(),
        RunId::generate(),
        RunId::generate(),
    ];
    let repo = state_dir.join("repo");
    init_repo(&repo);
    for (i, id) in ids.iter().enumerate() {
        journal
            .create_run(RunRecord {
                id: *id,
                request: format!("run {i}"),
                repo: repo.clone(),
                config: config.clone(),
                created_ms: i as u64,
                outcome: None,
            })
            .await
            .unwrap();
    }
    journal
        .append(
            ids[1],
            vec![EventKind::TaskStarted {
                task: TaskId::root(9),
                attempt: 1,
            }],
        )
        .await
        .unwrap();
    drop(journal);
    let conn = rusqlite::Connection::open(state_dir.join("journal.sqlite")).unwrap();
    conn.execute(
        "INSERT INTO events (run, at_ms, kind, data) VALUES (?1, 0, 'task_ready', '{not json')",
        [ids[2].to_string()],
    )
    .unwrap();
    conn.execute(
        "UPDATE runs SET config = '{\"limits\": 7' WHERE id = ?1",
        [ids[3].to_string()],
    )
    .unwrap();
    ids
}

#[tokio::test]
async fn runs_whose_journal_does_not_replay_are_damaged_and_everything_else_carries_on() {
    let state = tempfile::tempdir().unwrap();
    let ids = journal_with_damaged_runs(state.path()).await;
    let daemon = InProcessDaemon::start_with(DaemonSetup {
        state: Some(state),
        ..DaemonSetup::default()
    });
    // The healthy run resumes and completes.
    let events = follow_to_end(&daemon.client, &ids[0].to_string(), None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));

    let runs: Vec<serde_json::Value> = daemon.client.get("/v1/runs").await.unwrap();
    let problem = |id: &RunId| {
        runs.iter()
            .find(|r| r["id"] == id.to_string())
            .and_then(|r| r["problem"].as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    assert!(problem(&ids[0]).is_empty(), "{runs:?}");
    assert!(
        problem(&ids[1]).contains("damaged") && problem(&ids[1]).contains("t9"),
        "{runs:?}"
    );
    assert!(problem(&ids[2]).contains("damaged"), "{runs:?}");
    assert!(problem(&ids[3]).contains("config"), "{runs:?}");

    // A damaged run can still be cancelled, which ends it.
    let (status, _) = daemon
        .client
        .raw(
            hyper::Method::POST,
            &format!("/v1/runs/{}/cancel", ids[1]),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, hyper::StatusCode::ACCEPTED);
    let kinds = journal_kinds(daemon.state_dir(), &ids[1].to_string());
    assert!(matches!(
        kinds.last(),
        Some(EventKind::RunFinished {
            outcome: RunOutcome::Cancelled,
            ..
        })
    ));
}

/// Starts `serve` on `state_dir` (its default socket) and returns its error if it refuses
/// to start.
///
/// Another test forking a child in the instant this process releases the state lock
/// briefly shares the lock's open file (until the child's exec closes it): a lock "held"
/// by this very process is that, and is tried again.
fn serve_error(state_dir: &Path) -> Option<String> {
    serve_error_on(
        state_dir,
        flotilla::daemon::Listen::Unix(state_dir.join("daemon.sock")),
    )
}

fn serve_error_on(state_dir: &Path, listen: flotilla::daemon::Listen) -> Option<String> {
    let me = format!("PID {})", std::process::id());
    blocking_within(PATIENCE, || match serve_once(state_dir, listen.clone()) {
        Some(e) if e.contains(&me) => None,
        other => Some(other),
    })
    .unwrap_or_else(|| Some("the state lock stayed held".into()))
}

fn serve_once(state_dir: &Path, listen: flotilla::daemon::Listen) -> Option<String> {
    let options = flotilla::daemon::DaemonOptions {
        state_dir: state_dir.to_path_buf(),
        listen,
        journal_faults: None,
        server: Default::default(),
        journal_sync: Default::default(),
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let stop = shutdown.clone();
    let thread = std::thread::spawn(move || {
        actix_rt::System::new().block_on(async move {
            let (tx, rx) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                if rx.await.is_ok() {
                    stop.cancel(); // it started: stop it again at once
                }
            });
            flotilla::daemon::serve(options, shutdown, Some(tx)).await
        })
    });
    thread.join().unwrap().err().map(|e| format!("{e:#}"))
}

#[tokio::test]
async fn a_journal_that_went_missing_or_empty_is_reported_loudly_not_started_fresh() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let run = submit(
        &daemon.client,
        repo.path(),
        run_config(&scenario(2, 0, ""), 2),
    )
    .await;
    follow_to_end(&daemon.client, &run, None).await;
    let state = daemon.stop_keeping_state();
    let journal = state.path().join("journal.sqlite");
    let remove = |suffix: &str| {
        let _ = std::fs::remove_file(format!("{}{suffix}", journal.display()));
    };
    for suffix in ["", "-wal", "-shm"] {
        remove(suffix);
    }
    let missing = serve_error(state.path()).expect("a missing journal refuses to start");
    assert!(missing.contains("missing"), "{missing}");
    assert!(
        missing.contains("journal.marker"),
        "says how to start over: {missing}"
    );
    assert!(!journal.exists(), "nothing was created in its place");

    std::fs::write(&journal, b"").unwrap();
    let empty = serve_error(state.path()).expect("an empty journal refuses to start");
    assert!(empty.contains("empty"), "{empty}");
    assert_eq!(
        std::fs::metadata(&journal).unwrap().len(),
        0,
        "the refused journal is left as it was found"
    );

    // Deleting the marker is the way to start over on purpose.
    std::fs::remove_file(state.path().join("journal.marker")).unwrap();
    assert_eq!(serve_error(state.path()), None);
}

#[tokio::test]
async fn a_panicking_agent_call_costs_its_attempt_and_nothing_else() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let extra = "[tasks.t1]\nattempts = [{ outcome = \"panic\" }]\n";
    let run = submit(
        &daemon.client,
        repo.path(),
        run_config(&scenario(4, 50, extra), 4),
    )
    .await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    let kinds = journal_kinds(daemon.state_dir(), &run);
    assert!(
        kinds.iter().any(|k| matches!(k,
            EventKind::TaskRetried { task, failure: AttemptFailure::RunnerDied { .. }, .. }
                if task.to_string() == "t1")),
        "t1's first attempt died with its runner: {kinds:?}"
    );
    assert_each_task_completed_once(&kinds);
    // The agents worked in worktrees under the state directory, never in the repo.
    assert_checkout_untouched(repo.path());
}

/// The user's checkout is as the test made it: `main` checked out, its README only, nothing
/// modified, staged or untracked, and no worktree of flotilla's left registered.
pub fn assert_checkout_untouched(path: &Path) {
    let repo = git2::Repository::open(path).unwrap();
    let statuses = repo
        .statuses(Some(
            git2::StatusOptions::new()
                .include_untracked(true)
                .include_ignored(false),
        ))
        .unwrap();
    let dirty: Vec<String> = statuses
        .iter()
        .map(|s| format!("{:?} {}", s.status(), s.path().unwrap_or("?")))
        .collect();
    assert!(
        dirty.is_empty(),
        "the user's checkout was touched: {dirty:?}"
    );
    assert_eq!(repo.head().unwrap().shorthand().unwrap(), "main");
    let worktrees: Vec<String> = repo
        .worktrees()
        .unwrap()
        .iter()
        .flatten()
        .flatten()
        .map(String::from)
        .collect();
    assert!(
        worktrees.is_empty(),
        "worktrees left registered: {worktrees:?}"
    );
}

/// An in-process daemon with a journal fault switch, running `n` tasks of `delay_ms` on two
/// workers, once the run's stream shows `first` (an event name). The run's repository lives
/// as long as the daemon's state directory.
async fn faulted_run(
    n: usize,
    delay_ms: u64,
    first: &str,
) -> (InProcessDaemon, JournalFaults, String) {
    let faults = JournalFaults::default();
    let daemon = InProcessDaemon::start_with(DaemonSetup {
        faults: Some(faults.clone()),
        ..DaemonSetup::default()
    });
    let repo = daemon.state_dir().join("repo");
    init_repo(&repo);
    let run = submit(
        &daemon.client,
        &repo,
        run_config(&scenario(n, delay_ms, ""), 2),
    )
    .await;
    wait_for(&daemon.client, &run, first, |e| e.kind.name() == first).await;
    (daemon, faults, run)
}

#[tokio::test]
async fn a_task_graph_that_dies_is_restarted_from_the_journal_and_the_run_completes() {
    let (daemon, faults, run) = faulted_run(8, 100, "task_completed").await;
    faults.set(JournalFault::PanicOnce);
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    let kinds = journal_kinds(daemon.state_dir(), &run);
    let restarts = kinds
        .iter()
        .filter(|k| matches!(k, EventKind::RunRestarted { .. }))
        .count();
    assert_eq!(restarts, 1, "{kinds:?}");
    assert_each_task_completed_once(&kinds);
}

#[tokio::test]
async fn a_run_that_keeps_crashing_ends_failed_with_the_reason_after_max_restarts() {
    let (daemon, faults, run) = faulted_run(4, 200, "task_started").await;
    faults.set(JournalFault::PanicOnAppend);
    let events = follow_to_end(&daemon.client, &run, None).await;
    let Some(EventKind::RunFinished { outcome, reason }) = events.last().map(|e| &e.kind) else {
        panic!("no run_finished");
    };
    assert_eq!(*outcome, RunOutcome::Failed);
    let reason = reason.clone().unwrap_or_default();
    assert!(reason.contains("restarted 3 times"), "{reason}");
    let kinds = journal_kinds(daemon.state_dir(), &run);
    let restarts: Vec<u32> = kinds
        .iter()
        .filter_map(|k| match k {
            EventKind::RunRestarted { restart, .. } => Some(*restart),
            _ => None,
        })
        .collect();
    assert_eq!(restarts, vec![1, 2, 3]);
}

#[tokio::test]
async fn an_unwritable_journal_pauses_the_run_says_so_and_the_run_resumes_when_it_is_writable() {
    let (daemon, faults, run) = faulted_run(6, 100, "task_completed").await;
    faults.set(JournalFault::FailAppends);
    // The live stream says so (a notice that is not in the journal: seq 0)…
    let notice = wait_for(&daemon.client, &run, "a journal notice", |e| {
        matches!(e.kind, EventKind::JournalUnavailable { .. })
    })
    .await;
    assert_eq!(notice.seq, 0);
    // …and so does the run's status.
    let status: serde_json::Value = daemon.client.get(&format!("/v1/runs/{run}")).await.unwrap();
    assert!(
        status["problem"]
            .as_str()
            .is_some_and(|p| p.contains("journal could not be written")),
        "{status}"
    );
    faults.set(JournalFault::None);
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    let kinds = journal_kinds(daemon.state_dir(), &run);
    assert!(
        !kinds
            .iter()
            .any(|k| matches!(k, EventKind::RunRestarted { .. })),
        "a full disk is not charged as a crash"
    );
    assert_each_task_completed_once(&kinds);
}

#[tokio::test]
async fn a_cancel_is_journaled_before_it_is_acknowledged() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let run = submit(
        &daemon.client,
        repo.path(),
        run_config(&scenario(4, 5_000, ""), 2),
    )
    .await;
    wait_for(&daemon.client, &run, "a started task", |e| {
        matches!(e.kind, EventKind::TaskStarted { .. })
    })
    .await;
    let (status, _) = daemon
        .client
        .raw(hyper::Method::POST, &format!("/v1/runs/{run}/cancel"), None)
        .await
        .unwrap();
    assert_eq!(status, hyper::StatusCode::ACCEPTED);
    // Read right after the 202, from the file: a kill -9 now would lose nothing.
    let kinds = journal_kinds(daemon.state_dir(), &run);
    assert!(
        kinds
            .iter()
            .any(|k| matches!(k, EventKind::RunCancelRequested { .. })),
        "{kinds:?}"
    );
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Cancelled));
}

#[actix::test]
async fn when_a_run_ends_every_one_of_its_actors_stops() {
    let state = tempfile::tempdir().unwrap();
    let (supervisor, _journal, run, mut events) = supervised_run(state.path(), 5, 20).await;
    let members = supervisor
        .send(GetRunMembers(run))
        .await
        .unwrap()
        .expect("the run is live");
    // The run's actors live on a thread of the run's own (ADR-014)...
    assert_eq!(
        supervisor.send(RunThreads).await.unwrap(),
        RunThreadCount {
            live: 1,
            retiring: 0
        }
    );
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let e = events.recv().await.unwrap();
            if matches!(e.kind, EventKind::RunFinished { .. }) {
                break;
            }
        }
    })
    .await
    .expect("the run finished");
    within(PATIENCE, || async { (!members.any_alive()).then_some(()) }).await;
    assert!(
        !members.any_alive(),
        "a finished run's actors are all stopped"
    );
    assert!(supervisor.send(GetRunMembers(run)).await.unwrap().is_none());
    // ...which is stopped once they have all stopped (the supervisor looks twice a second).
    let retired = within(PATIENCE, || async {
        let threads = supervisor.send(RunThreads).await.unwrap();
        (threads.retiring == 0).then_some(threads)
    })
    .await;
    let threads = match retired {
        Some(threads) => threads,
        None => supervisor.send(RunThreads).await.unwrap(),
    };
    assert_eq!(
        threads,
        RunThreadCount {
            live: 0,
            retiring: 0
        },
        "a finished run leaves no thread behind"
    );
}

#[tokio::test]
async fn a_daemon_that_cannot_serve_exits_having_changed_nothing() {
    // A run left unfinished by a crash: a daemon that resumed it would journal interruptions.
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let daemon = DaemonProcess::start(state.path());
    let client = DaemonProcess::client(state.path());
    let run = submit(&client, repo.path(), run_config(&scenario(4, 2_000, ""), 2)).await;
    wait_for(&client, &run, "a started task", |e| {
        matches!(e.kind, EventKind::TaskStarted { .. })
    })
    .await;
    daemon.kill();
    let before = journal_kinds(state.path(), &run).len();

    // A refused address…
    let refused = serve_error_on(
        state.path(),
        flotilla::daemon::Listen::Tcp("0.0.0.0:0".parse().unwrap()),
    )
    .expect("a non-loopback address is refused");
    assert!(refused.contains("loopback"), "{refused}");
    // …and a regular file where the socket would go, which must survive.
    let precious = state.path().join("precious.txt");
    std::fs::write(&precious, "keep me").unwrap();
    let not_socket = serve_error_on(
        state.path(),
        flotilla::daemon::Listen::Unix(precious.clone()),
    )
    .expect("a path that is not a socket is refused");
    assert!(not_socket.contains("not a socket"), "{not_socket}");
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me");

    assert_eq!(
        journal_kinds(state.path(), &run).len(),
        before,
        "nothing was resumed or journaled"
    );
}

#[tokio::test]
async fn a_log_filter_with_a_typo_is_reported_and_the_daemon_still_logs() {
    let state = tempfile::tempdir().unwrap();
    let daemon = DaemonProcess::start_with_env(state.path(), &[("FLOTILLA_LOG", "bogus[")]);
    let log = daemon.log();
    assert!(
        log.contains("FLOTILLA_LOG") && log.contains("logging at info"),
        "{log}"
    );
    assert!(log.contains("listening on"), "{log}");
}

#[tokio::test]
async fn a_finished_runs_workspaces_are_removed_even_those_of_interrupted_attempts() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let daemon = DaemonProcess::start(state.path());
    let client = DaemonProcess::client(state.path());
    let run = submit(&client, repo.path(), run_config(&scenario(4, 1_000, ""), 2)).await;
    wait_for(&client, &run, "a started task", |e| {
        matches!(e.kind, EventKind::TaskStarted { .. })
    })
    .await;
    let run_workspaces = state.path().join("worktrees").join(&run);
    within(PATIENCE, || async {
        std::fs::read_dir(&run_workspaces)
            .is_ok_and(|mut d| d.next().is_some())
            .then_some(())
    })
    .await;
    daemon.kill(); // the attempts in flight leave their workspaces behind
    // Attempt directories; the pool's own entries (ADR-044) are made again by the
    // restarted run's attempts, its snapshots of these are checked below.
    let interrupted: Vec<std::path::PathBuf> = std::fs::read_dir(&run_workspaces)
        .unwrap()
        .flatten()
        .filter(|e| !flotilla::git::slots::is_slot_entry(&e.file_name()))
        .map(|e| e.path())
        .collect();
    assert!(!interrupted.is_empty());
    let before: i64 = rusqlite::Connection::open(state.path().join("journal.sqlite"))
        .unwrap()
        .query_row("SELECT MAX(seq) FROM events", [], |r| r.get(0))
        .unwrap();
    let before = before as u64;
    let daemon = DaemonProcess::start(state.path());
    // The restarted run's pool sweeps before its first attempt: by the time one starts,
    // the interrupted attempts' worktrees are gone (not only at the end of the run).
    wait_for(&client, &run, "an attempt started after the restart", |e| {
        e.seq > before && matches!(e.kind, EventKind::TaskStarted { .. })
    })
    .await;
    for path in &interrupted {
        assert!(!path.exists(), "{} survived the restart", path.display());
        let snapshot = run_workspaces
            .join(flotilla::git::slots::SNAP_DIR)
            .join(path.file_name().unwrap());
        assert!(
            !snapshot.exists(),
            "{} survived the restart",
            snapshot.display()
        );
    }
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    // The sweep runs after the run's actors stopped, on a blocking thread: on a loaded
    // machine that can take a while (bounded).
    within(PATIENCE, || async {
        (!run_workspaces.exists()).then_some(())
    })
    .await;
    let left: Vec<_> = std::fs::read_dir(&run_workspaces)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        !run_workspaces.exists(),
        "{} is left behind, holding {left:?}",
        run_workspaces.display()
    );
    drop(daemon);
    // The interrupted attempts' branches went with their worktrees, and the delivered ones
    // too: the scenario's tasks write nothing, and a delivery without commits leaves no
    // branch (ADR-021).
    assert_checkout_untouched(repo.path());
    let git = git2::Repository::open(repo.path()).unwrap();
    let mut task_branches: Vec<String> = git
        .branches(Some(git2::BranchType::Local))
        .unwrap()
        .map(|b| b.unwrap().0.name().unwrap().unwrap().to_string())
        .filter(|name| name.starts_with("flotilla/"))
        .map(|name| name.rsplit('/').next().unwrap().to_string())
        .map(|task| task.split("-a").next().unwrap().to_string())
        .collect();
    task_branches.sort();
    assert_eq!(
        task_branches,
        Vec::<String>::new(),
        "no branch is left: nothing had commits to land"
    );
}

#[tokio::test]
async fn a_stored_run_with_impossible_settings_is_damaged_not_started() {
    let state = tempfile::tempdir().unwrap();
    let journal =
        SqliteJournal::open(&state.path().join("journal.sqlite"), Arc::new(SystemClock)).unwrap();
    let mut config = run_config(&scenario(2, 0, ""), 2);
    // Written by an older flotilla, or by hand: no worker could ever run its tasks.
    config["limits"]["max_workers"] = 0.into();
    let run = RunId::generate();
    journal
        .create_run(RunRecord {
            id: run,
            request: "r".into(),
            repo: "/tmp".into(),
            config,
            created_ms: 0,
            outcome: None,
        })
        .await
        .unwrap();
    drop(journal);
    let daemon = InProcessDaemon::start_with(DaemonSetup {
        state: Some(state),
        ..DaemonSetup::default()
    });
    let runs: Vec<serde_json::Value> = daemon.client.get("/v1/runs").await.unwrap();
    let problem = runs[0]["problem"].as_str().unwrap_or_default().to_string();
    assert!(
        problem.contains("damaged") && problem.contains("max_workers"),
        "{runs:?}"
    );
    assert_eq!(runs[0]["state"], "damaged");
}

/// t1 (whose budget the test sets) is decomposed into two subtasks that take a while.
const DECOMPOSED: &str = r#"
[[planner.answers]]
tasks = [{ description = "the long one", scope = ["src/long"] }]

[tasks.t1]
outcome = "subplan"
[tasks.t1.subplan]
subtasks = [
  { description = "long part a", scope = ["src/long/a.rs"] },
  { description = "long part b", scope = ["src/long/b.rs"] },
]
[tasks."t1.1"]
delay_ms = 1500
[tasks."t1.2"]
delay_ms = 1500
"#;

/// [`DECOMPOSED`] with t1's wall-time budget at `wall_time_ms`, under limits that allow it.
fn decomposed_with_wall_time(wall_time_ms: u64) -> serde_json::Value {
    let mut config: flotilla::config::RunConfig =
        serde_json::from_value(run_config(DECOMPOSED, 2)).unwrap();
    config.limits.max_task_budget.wall_time_ms = u64::MAX;
    config.limits.run_budget.wall_time_ms = u64::MAX;
    let t1 = &mut config.scenario.planner.answers[0].tasks.as_mut().unwrap()[0];
    t1["budget"] = serde_json::json!({
        "tokens": 100_000,
        "cost_usd": 1.0,
        "wall_time_ms": wall_time_ms,
    });
    config.validate().expect("the limits allow the huge budget");
    serde_json::to_value(config).unwrap()
}

/// Issue: "A `wall_time_ms` of `i64::MAX` overflows at the deadline computation in
/// supervisor.rs on recovery." The daemon is killed while t1 (with a wall-time budget of
/// i64::MAX, then u64::MAX ms) waits for its subtasks; the restarted daemon computes t1's
/// decomposition deadline from the journal (`recovery`). It must neither panic (an overflow
/// in a debug build) nor wrap into a deadline already passed (a release build): the run
/// resumes, its subtasks run again, and t1 completes instead of failing on a deadline.
#[tokio::test]
async fn a_huge_wall_time_budget_survives_recovery_of_a_task_waiting_for_its_subtasks() {
    for wall_time_ms in [i64::MAX as u64, u64::MAX] {
        let state = tempfile::tempdir().unwrap();
        let repo = git_repo();
        let daemon = DaemonProcess::start(state.path());
        let client = DaemonProcess::client(state.path());
        let run = submit(
            &client,
            repo.path(),
            decomposed_with_wall_time(wall_time_ms),
        )
        .await;
        wait_for(
            &client,
            &run,
            "a started subtask",
            |e| matches!(&e.kind, EventKind::TaskStarted { task, .. } if task.depth() == 2),
        )
        .await;
        daemon.kill();

        // The crash caught t1 waiting for its subtasks, with its huge budget.
        let before = journal_kinds(state.path(), &run);
        assert!(
            before.iter().any(|k| matches!(k,
                EventKind::TaskAdded { task, budget, .. }
                    if task.to_string() == "t1" && budget.wall_time_ms == wall_time_ms)),
            "{before:?}"
        );
        assert!(
            before.iter().any(|k| matches!(k,
                EventKind::DecompositionAccepted { parent, .. } if parent.to_string() == "t1")),
            "{before:?}"
        );
        assert!(
            !before.iter().any(|k| matches!(
                k,
                EventKind::SubtasksCompleted { .. } | EventKind::RunFinished { .. }
            )),
            "the kill came too late: {before:?}"
        );

        let daemon = DaemonProcess::start(state.path());
        let events = follow_to_end(&client, &run, None).await;
        let log = daemon.log();
        assert_eq!(
            outcome(&events),
            Some(RunOutcome::Completed),
            "wall_time_ms = {wall_time_ms}; daemon log:\n{log}"
        );
        assert!(!log.contains("panicked"), "{log}");
        let runs: Vec<serde_json::Value> = client.get("/v1/runs").await.unwrap();
        let listed = runs.iter().find(|r| r["id"] == run.as_str()).unwrap();
        assert!(listed["problem"].is_null(), "not damaged: {listed}");
        drop(daemon);

        let kinds = journal_kinds(state.path(), &run);
        let resumed = &kinds[before.len()..];
        assert!(
            resumed.iter().any(|k| matches!(k,
                EventKind::TaskInterrupted { task, .. } if task.depth() == 2)),
            "the restart interrupted the subtasks in flight: {resumed:?}"
        );
        assert!(
            !kinds.iter().any(|k| matches!(
                k,
                EventKind::TaskFailed {
                    reason: FailureReason::DecompositionDeadline { .. },
                    ..
                }
            )),
            "the re-armed deadline is not already due: {kinds:?}"
        );
        assert!(
            resumed.iter().any(|k| matches!(k,
                EventKind::SubtasksCompleted { parent } if parent.to_string() == "t1")),
            "{resumed:?}"
        );
        assert!(
            resumed.iter().any(|k| matches!(k,
                EventKind::TaskCompleted { task, .. } if task.to_string() == "t1")),
            "t1 completed after the restart: {resumed:?}"
        );
        assert_each_task_completed_once(&kinds);
    }
}

/// POSTs a cancel of `run`; its status, bounded in time (an acknowledgement that never comes
/// is not one).
async fn cancel(client: &Client, run: &str) -> hyper::StatusCode {
    let path = format!("/v1/runs/{run}/cancel");
    let asked = client.raw(hyper::Method::POST, &path, None);
    let (status, _) = tokio::time::timeout(Duration::from_secs(30), asked)
        .await
        .expect("the cancel was answered within 30 s")
        .unwrap();
    status
}

/// The deterministic form of `a_cancel_is_journaled_before_it_is_acknowledged`: while the
/// journal refuses every append, a cancel cannot be journaled, so it must not be
/// acknowledged (the supervisor answers `Unavailable`: 503, "try again"); once the journal
/// takes writes again, a cancel is acknowledged, and by then `RunCancelRequested` is in the
/// file, and the run ends cancelled.
#[tokio::test]
async fn a_cancel_the_journal_cannot_take_is_not_acknowledged_and_one_it_can_take_is() {
    let (daemon, faults, run) = faulted_run(4, 5_000, "task_started").await;
    faults.set(JournalFault::FailAppends);
    let refused = cancel(&daemon.client, &run).await;
    assert_eq!(
        refused,
        hyper::StatusCode::SERVICE_UNAVAILABLE,
        "a cancel that is not in the journal is not acknowledged"
    );
    let kinds = journal_kinds(daemon.state_dir(), &run);
    assert!(
        !kinds.iter().any(|k| matches!(
            k,
            EventKind::RunCancelRequested { .. } | EventKind::RunFinished { .. }
        )),
        "nothing could be journaled: {kinds:?}"
    );
    // However often it is asked while the journal refuses writes.
    for _ in 0..3 {
        assert_ne!(
            cancel(&daemon.client, &run).await,
            hyper::StatusCode::ACCEPTED
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    faults.set(JournalFault::None);
    // The run resumes once its supervisor retries (backing off): until then it answers 503.
    let acknowledged = within(PATIENCE, || async {
        let status = cancel(&daemon.client, &run).await;
        if status == hyper::StatusCode::ACCEPTED {
            return Some(());
        }
        assert_eq!(status, hyper::StatusCode::SERVICE_UNAVAILABLE);
        None
    })
    .await;
    assert!(
        acknowledged.is_some(),
        "no cancel acknowledged after the journal's return"
    );
    // Read right after the 202, from the file.
    let kinds = journal_kinds(daemon.state_dir(), &run);
    assert_eq!(
        kinds
            .iter()
            .filter(|k| matches!(k, EventKind::RunCancelRequested { .. }))
            .count(),
        1,
        "{kinds:?}"
    );
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Cancelled));
}

/// A Supervisor driven directly (no HTTP), running `scenario(n, delay_ms)` on two workers:
/// the supervisor, its journal, the run and the hub's receiver.
async fn supervised_run(
    state: &Path,
    n: usize,
    delay_ms: u64,
) -> (
    actix::Addr<Supervisor>,
    SqliteJournal,
    RunId,
    tokio::sync::broadcast::Receiver<Event>,
) {
    let journal =
        SqliteJournal::open(&state.join("journal.sqlite"), Arc::new(SystemClock)).unwrap();
    let repo = state.join("repo");
    init_repo(&repo);
    let (hub, events) = tokio::sync::broadcast::channel(4096);
    let supervisor = actix::Actor::start(Supervisor::new(
        journal.clone(),
        Arc::new(journal.clone()),
        Arc::new(SystemClock),
        hub,
        state.join("workspaces"),
        Arc::new(flotilla::providers::ProviderRegistry::new().unwrap()),
    ));
    let run = RunId::generate();
    let config: flotilla::config::RunConfig =
        serde_json::from_value(run_config(&scenario(n, delay_ms, ""), 2)).unwrap();
    let started = journal
        .create_run(RunRecord {
            id: run,
            request: "r".into(),
            repo: repo.clone(),
            config: serde_json::to_value(&config).unwrap(),
            created_ms: 0,
            outcome: None,
        })
        .await
        .unwrap();
    supervisor
        .send(StartRun {
            run,
            request: "r".into(),
            repo,
            config,
            journal: vec![started],
        })
        .await
        .unwrap()
        .unwrap();
    (supervisor, journal, run, events)
}

/// Receives hub events of `run` until `pick` accepts one (bounded).
async fn hub_until(
    events: &mut tokio::sync::broadcast::Receiver<Event>,
    run: RunId,
    what: &str,
    pick: impl Fn(&EventKind) -> bool,
) -> EventKind {
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let e = events.recv().await.unwrap();
            if e.run == run && pick(&e.kind) {
                return e.kind;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {what} within 60 s"))
}

/// `a_task_graph_that_dies_is_restarted_from_the_journal_and_the_run_completes` for the
/// other members. Nothing in a scenario or the journal's fault switch can make the Planner,
/// Dispatch or the WorkerPool panic, so each is made to end in the middle of the run the one
/// way it can be from outside: `StopMember` sent to it alone. A member that ends while its
/// run is live, for whatever reason, means the run's actors no longer agree: the supervisor
/// stops the others, journals one `RunRestarted` naming the member, restarts the run from
/// the journal, and the run completes with every task completed exactly once.
#[actix::test]
async fn a_planner_dispatch_or_worker_pool_that_dies_mid_run_is_restarted_and_the_run_completes() {
    for (member, name) in [
        (Member::Planner, "Planner"),
        (Member::Dispatch, "Dispatch"),
        (Member::Subplanner, "Subplanner"),
        (Member::Workers, "Workers"),
        (Member::MergeQueue, "MergeQueue"),
        (Member::Reconciler, "Reconciler"),
    ] {
        let state = tempfile::tempdir().unwrap();
        let (supervisor, journal, run, mut events) = supervised_run(state.path(), 8, 150).await;
        hub_until(&mut events, run, "a completed task", |k| {
            matches!(k, EventKind::TaskCompleted { .. })
        })
        .await;
        let before = supervisor
            .send(GetRunMembers(run))
            .await
            .unwrap()
            .expect("the run is live");
        match member {
            Member::Planner => before.planner.do_send(StopMember),
            Member::Dispatch => before.dispatch.do_send(StopMember),
            Member::Subplanner => before.subplanner.do_send(StopMember),
            Member::Workers => before.workers.do_send(StopMember),
            Member::MergeQueue => before.merge_queue.do_send(StopMember),
            Member::Reconciler => before.reconciler.do_send(StopMember),
            Member::TaskGraph => unreachable!(),
        }
        let restarted = hub_until(&mut events, run, "run_restarted", |k| {
            matches!(
                k,
                EventKind::RunRestarted { .. } | EventKind::RunFinished { .. }
            )
        })
        .await;
        let EventKind::RunRestarted { restart, reason } = restarted else {
            panic!("{name}: the run finished instead of restarting: {restarted:?}");
        };
        assert_eq!(restart, 1, "{name}");
        assert!(reason.contains(name), "{name}: {reason}");
        let finished = hub_until(&mut events, run, "run_finished", |k| {
            matches!(k, EventKind::RunFinished { .. })
        })
        .await;
        assert!(
            matches!(
                finished,
                EventKind::RunFinished {
                    outcome: RunOutcome::Completed,
                    ..
                }
            ),
            "{name}: {finished:?}"
        );
        // The earlier life's actors were all stopped, not left running beside the new ones.
        within(PATIENCE, || async { (!before.any_alive()).then_some(()) }).await;
        assert!(!before.any_alive(), "{name}: the old members still run");
        let kinds: Vec<EventKind> = journal
            .read(run, 0)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(
            kinds
                .iter()
                .filter(|k| matches!(k, EventKind::RunRestarted { .. }))
                .count(),
            1,
            "{name}: {kinds:?}"
        );
        assert_each_task_completed_once(&kinds);
    }
}

/// A provider's long rate-limit pause (a live notice from a call) is journaled once, so
/// that `status` shows who holds calls back, until when and why, and its end is journaled
/// when it is over (ADR-024).
#[actix::test]
async fn a_provider_pause_is_journaled_once_shown_by_status_and_cleared_when_it_ends() {
    use flotilla::daemon::report::StatusReplay;
    use flotilla_actors::ports::Clock;
    use flotilla_actors::protocol::{Published, Role};

    let state = tempfile::tempdir().unwrap();
    let (supervisor, journal, run, mut events) = supervised_run(state.path(), 1, 5_000).await;
    let at_ms = SystemClock.now_ms();
    let notice = |task: &str| {
        Published(Event {
            seq: 0,
            run,
            at_ms,
            kind: EventKind::ProviderPaused {
                role: Role::Worker,
                task: Some(task.parse().unwrap()),
                provider: "p".into(),
                wait_ms: 400,
            },
        })
    };
    supervisor.do_send(notice("t1"));
    // Another call hearing the same pause: not journaled again, only said live.
    supervisor.do_send(notice("t2"));
    let mut seen = Vec::new();
    let rx = &mut events;
    tokio::time::timeout(Duration::from_secs(30), async {
        while seen.len() < 3 {
            let e = rx.recv().await.unwrap();
            if matches!(
                e.kind,
                EventKind::ProviderPaused { .. }
                    | EventKind::ProviderPauseStarted { .. }
                    | EventKind::ProviderResumed { .. }
            ) {
                seen.push(e);
            }
        }
    })
    .await
    .expect("the pause, its echo and its end");
    // The second notice is said at once; the first is said once journaled.
    let started = seen
        .iter()
        .find(|e| matches!(e.kind, EventKind::ProviderPauseStarted { .. }))
        .expect("journaled");
    let echo = seen
        .iter()
        .find(|e| matches!(e.kind, EventKind::ProviderPaused { .. }))
        .expect("the second call's notice");
    assert!(started.seq > 0, "journaled: {started:?}");
    match &started.kind {
        EventKind::ProviderPauseStarted {
            provider,
            role,
            task,
            until_ms,
            why,
        } => {
            assert_eq!(provider, "p");
            assert_eq!(*role, Role::Worker);
            assert_eq!(
                task.as_ref().map(ToString::to_string).as_deref(),
                Some("t1")
            );
            assert_eq!(*until_ms, at_ms + 400);
            assert!(why.contains("429"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(echo.seq, 0, "the second call's notice is only live");
    assert!(
        matches!(&seen[2].kind, EventKind::ProviderResumed { provider } if provider == "p")
            && seen[2].seq > started.seq,
        "{:?}",
        seen[2]
    );

    // status, replayed from the journal: the pause while it lasted, then nothing.
    let stored = journal.read(run, 0).await.unwrap();
    let record = RunRecord {
        id: run,
        request: "r".into(),
        repo: state.path().join("repo"),
        config: serde_json::Value::Null,
        created_ms: 0,
        outcome: None,
    };
    let upto = |seq: u64| {
        let mut replay = StatusReplay::new(Default::default());
        let events: Vec<Event> = stored.iter().filter(|e| e.seq <= seq).cloned().collect();
        replay.apply(&events);
        replay.status(&record)
    };
    let during = upto(started.seq);
    assert_eq!(during.provider_pauses.len(), 1, "{during:?}");
    assert_eq!(during.provider_pauses[0].until_ms, at_ms + 400);
    let text = flotilla::cli::render::status::status_text(
        &during,
        &flotilla::cli::render::style::Style::plain(),
    );
    assert!(text.contains("provider paused: p until"), "{text}");
    assert!(upto(seen[2].seq).provider_pauses.is_empty());
}

/// Waits for a task of `run` to start, then tells the supervisor, as a Worker does, that
/// flotilla's storage refused a write for it with `error`.
async fn storage_refuses_once_a_task_started(
    supervisor: &actix::Addr<Supervisor>,
    run: RunId,
    events: &mut tokio::sync::broadcast::Receiver<Event>,
    error: &str,
) {
    let started = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let e = events.recv().await.unwrap();
            if let EventKind::TaskStarted { task, .. } = e.kind {
                return task;
            }
        }
    })
    .await
    .expect("a task started");
    supervisor.do_send(flotilla_actors::protocol::Published(Event {
        seq: 0,
        run,
        at_ms: 0,
        kind: EventKind::StorageUnavailable {
            task: started,
            error: error.into(),
        },
    }));
}

/// flotilla's storage refusing a write (a worktree, a scratch checkout) pauses the run as an
/// unwritable journal does: its actors stop, `status` says why, and once a test write goes
/// through it resumes from its journal; nothing is charged to a task (ADR-024).
#[actix::test]
async fn storage_that_refuses_a_write_pauses_the_run_which_resumes_uncharged_when_it_clears() {
    use flotilla::daemon::supervisor::{RunProblem, RunProblems};

    let state = tempfile::tempdir().unwrap();
    let (supervisor, journal, run, mut events) = supervised_run(state.path(), 3, 300).await;
    storage_refuses_once_a_task_started(
        &supervisor,
        run,
        &mut events,
        "cannot create /state/worktrees/r/t1-a1: Read-only file system (os error 30)",
    )
    .await;
    let problems = supervisor.send(RunProblems).await.unwrap();
    match problems.get(&run) {
        Some(RunProblem::Paused(why)) => {
            assert!(why.contains("storage refused a write"), "{why}");
            assert!(why.contains("Read-only file system"), "{why}");
        }
        other => panic!("paused: {other:?}"),
    }
    assert!(
        supervisor.send(GetRunMembers(run)).await.unwrap().is_none(),
        "its actors are stopped while it is paused"
    );
    // The storage takes writes (it always did here): the run resumes and completes.
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let e = events.recv().await.unwrap();
            if matches!(e.kind, EventKind::RunFinished { .. }) {
                break;
            }
        }
    })
    .await
    .expect("the run finished");
    let kinds: Vec<EventKind> = journal
        .read(run, 0)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(
        kinds.iter().any(|k| matches!(
            k,
            EventKind::RunFinished {
                outcome: RunOutcome::Completed,
                ..
            }
        )),
        "{kinds:?}"
    );
    assert!(
        !kinds.iter().any(|k| matches!(
            k,
            EventKind::TaskFailed { .. }
                | EventKind::TaskRetried { .. }
                | EventKind::RunRestarted { .. }
        )),
        "nothing charged, no restart counted: {kinds:?}"
    );
    assert!(
        kinds
            .iter()
            .any(|k| matches!(k, EventKind::TaskInterrupted { .. })),
        "the attempt in flight was interrupted, uncharged: {kinds:?}"
    );
    let problems = supervisor.send(RunProblems).await.unwrap();
    assert!(!problems.contains_key(&run), "{problems:?}");
}

/// A cancel while the run is paused for refused storage (no actors to ask) is journaled at
/// once and answered, and the run ends Cancelled at the pause's next look, though the
/// storage still refuses: every task not yet ended is cancelled, nothing is dispatched after
/// the cancel, and the run's end is its last event. (It was refused with "try again" until
/// the storage cleared, which a full disk may never do.)
#[actix::test]
async fn a_run_paused_for_refused_storage_can_be_cancelled_while_the_storage_still_refuses() {
    use flotilla::daemon::supervisor::{CancelAnswer, CancelRun, RunProblem, RunProblems};

    let state = tempfile::tempdir().unwrap();
    let (supervisor, journal, run, mut events) = supervised_run(state.path(), 3, 300).await;
    storage_refuses_once_a_task_started(
        &supervisor,
        run,
        &mut events,
        "No space left on device (os error 28)",
    )
    .await;
    assert!(matches!(
        supervisor.send(RunProblems).await.unwrap().get(&run),
        Some(RunProblem::Paused(_))
    ));
    // The storage keeps refusing: where the pause's look writes, a file stands in the way.
    // The task's workspace is released on a thread of its own (ADR-049), which can make
    // the run's directory again between the removal and the write: tried until the file
    // stands (a directory cannot be made where it is).
    let probe = state.path().join("workspaces").join(run.to_string());
    let stands = within(PATIENCE, || async {
        let _ = std::fs::remove_dir_all(&probe);
        std::fs::create_dir_all(probe.parent().unwrap()).unwrap();
        std::fs::write(&probe, "in the way").ok()
    })
    .await;
    assert!(
        stands.is_some(),
        "a file stands where the run's workspaces go"
    );

    let answer = supervisor
        .send(CancelRun {
            run,
            reason: "cancelled by the user".into(),
        })
        .await
        .unwrap();
    assert_eq!(answer, CancelAnswer::Journaled);
    // Asked again before it is carried out: the same answer, journaled once.
    let again = supervisor
        .send(CancelRun {
            run,
            reason: "cancelled by the user".into(),
        })
        .await
        .unwrap();
    assert_eq!(again, CancelAnswer::Journaled);
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let e = events.recv().await.unwrap();
            if matches!(e.kind, EventKind::RunFinished { .. }) {
                break;
            }
        }
    })
    .await
    .expect("the run finished");
    assert!(probe.is_file(), "the storage still refused at the end");

    let kinds: Vec<EventKind> = journal
        .read(run, 0)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    let requested: Vec<usize> = kinds
        .iter()
        .enumerate()
        .filter(|(_, k)| matches!(k, EventKind::RunCancelRequested { .. }))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(requested.len(), 1, "journaled once: {kinds:?}");
    let after = &kinds[requested[0]..];
    assert!(
        !after
            .iter()
            .any(|k| matches!(k, EventKind::TaskDispatched { .. })),
        "nothing dispatched after the cancel: {kinds:?}"
    );
    let cancelled = after
        .iter()
        .filter(|k| matches!(k, EventKind::TaskCancelled { .. }))
        .count();
    assert_eq!(cancelled, 3, "every task cancelled: {kinds:?}");
    assert!(
        matches!(
            kinds.last(),
            Some(EventKind::RunFinished {
                outcome: RunOutcome::Cancelled,
                ..
            })
        ),
        "{kinds:?}"
    );
    assert!(
        !kinds
            .iter()
            .any(|k| matches!(k, EventKind::TaskFailed { .. })),
        "nothing charged: {kinds:?}"
    );
}
