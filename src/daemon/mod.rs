//! `flotilla daemon`: the long-running process. It opens the journal, resumes every
//! unfinished run, and serves the API on a private Unix socket (default) or on a loopback TCP
//! port with a bearer token.
//!
//! [`serve`] must run inside an actix `System` (it starts actors); `main` and the tests do
//! exactly that.
//!
//! `serve(options, shutdown, ready)`: takes the state lock, opens the journal (refusing a
//! missing or emptied one: `journal.marker`), resumes unfinished runs (a run that cannot be
//! loaded is damaged, never fatal), binds, serves until shutdown. The API and the streams stay
//! on the System thread; the Supervisor has an arbiter (thread) of its own, and each run
//! another, where all its actors live (ADR-014).

pub mod api;
pub mod notify;
pub mod report;
pub mod run_report;
pub mod state_lock;
pub mod story;
pub mod summary;
pub mod supervisor;
pub mod transcripts;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use actix::Actor;
use anyhow::Context as _;
use flotilla_actors::ports::{Clock, Journal, SystemClock};
#[cfg(feature = "testing")]
use flotilla_actors::ports::{FailingJournal, JournalFaults};
use tokio::sync::{broadcast, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::RunConfig;
use crate::journal::{JournalSync, SqliteJournal};
use crate::paths;
use crate::process::left_behind::{DaemonMark, end_left_behind};
use crate::providers::ProviderRegistry;
use state_lock::StateLock;
use supervisor::{RunDamaged, StartRun, Supervisor};

/// How long the daemon's stop waits for ended runs to finish retiring: a 10,000-task run's
/// sweep and status fold take about a second on two cores.
const CLEAN_UPS_AT_STOP: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, Clone)]
pub enum Listen {
    /// A Unix socket, mode 0600.
    Unix(PathBuf),
    /// A loopback TCP address; requests need the bearer token.
    Tcp(SocketAddr),
}

#[derive(Debug, Clone)]
pub struct DaemonOptions {
    pub state_dir: PathBuf,
    pub listen: Listen,
    /// A fault switch between the run actors and the journal, for tests and drills; only in
    /// builds with the `testing` feature (ADR-027).
    #[cfg(feature = "testing")]
    pub journal_faults: Option<JournalFaults>,
    /// Connection cap and timeouts of the API server.
    pub server: api::ServerLimits,
    /// How far a journal commit goes before it is answered (ADR-010).
    pub journal_sync: JournalSync,
}

/// Where the daemon ended up listening (a TCP port 0 becomes a real port).
#[derive(Debug, Clone)]
pub enum Bound {
    Unix(PathBuf),
    Tcp {
        addr: SocketAddr,
        token_file: PathBuf,
    },
}

/// Runs the daemon until `shutdown` is cancelled. `ready` receives the bound address once the
/// daemon accepts requests.
pub async fn serve(
    options: DaemonOptions,
    shutdown: CancellationToken,
    ready: Option<oneshot::Sender<Bound>>,
) -> anyhow::Result<()> {
    crate::git::configure_libgit2();
    paths::ensure_private_dir(&options.state_dir).with_context(|| {
        format!(
            "cannot create the state directory {}",
            options.state_dir.display()
        )
    })?;
    // Before anything is opened for writing or resumed: one daemon per state directory.
    let lock = StateLock::acquire(&options.state_dir)?;
    // With the lock held no other daemon here is alive: whatever still carries this state
    // directory's mark was started for one that died (a SIGKILL can leave a sandbox's
    // namespace running, ADR-050). Ended before any command of ours starts.
    let mark = DaemonMark::of(&options.state_dir).with_context(|| {
        format!(
            "cannot keep the daemon's mark in {}",
            options.state_dir.display()
        )
    })?;
    end_what_a_dead_daemon_left(&mark).await;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    // Records beside git's locks reach the disk first only where the journal's commits do
    // (ADR-041 amended, ADR-010).
    crate::git::ref_lock::sync_records(options.journal_sync == JournalSync::Full);
    let journal = open_journal(&options.state_dir, clock.clone(), options.journal_sync)?;
    let (hub, _) = broadcast::channel(4096);
    #[cfg(feature = "testing")]
    let journal_port: Arc<dyn Journal> = match &options.journal_faults {
        Some(faults) => Arc::new(FailingJournal::new(
            Arc::new(journal.clone()),
            faults.clone(),
        )),
        None => Arc::new(journal.clone()),
    };
    #[cfg(not(feature = "testing"))]
    let journal_port: Arc<dyn Journal> = Arc::new(journal.clone());
    // Bind before resuming: a daemon that cannot serve (address refused or taken) must exit
    // having changed nothing.
    let (listener, bound, token) = bind(&options).await?;
    let providers =
        ProviderRegistry::new().context("cannot set up the HTTP client for LLM providers")?;
    // The runs live on a thread of their own (the Supervisor's arbiter: every run's actors
    // start there), the HTTP API and the event streams on this one, so a busy run cannot
    // starve the API, and answering the API cannot slow the runs (ADR-014).
    let runs_thread = actix::Arbiter::new();
    // Attempts' transcripts, written on a thread of their own (ADR-036).
    let transcripts = match transcripts::TranscriptStore::start(
        paths::transcripts_dir(&options.state_dir),
        transcripts::DEFAULT_CAP_BYTES,
    ) {
        Ok(store) => Some(store),
        Err(e) => {
            warn!(error = %e, "cannot start the transcript writer; no transcripts will be kept");
            None
        }
    };
    let supervisor = Supervisor::new(
        journal.clone(),
        journal_port,
        clock,
        hub.clone(),
        paths::worktrees_dir(&options.state_dir),
        Arc::new(providers),
    )
    .marking(mark)
    .hiding(match &options.listen {
        Listen::Unix(socket) => Some(socket.clone()),
        Listen::Tcp(_) => None,
    });
    let supervisor = match &transcripts {
        Some(store) => supervisor.with_transcripts(store.clone()),
        None => supervisor,
    };
    let supervisor = Supervisor::start_in_arbiter(&runs_thread.handle(), move |_| supervisor);
    resume_unfinished(&journal, &supervisor).await;
    // Notifications ([notify]) on tasks of their own, off every actor's thread.
    match notify::Delivery::new(notify::find_notify_send(
        std::env::var_os("PATH").as_deref(),
    )) {
        Ok(delivery) => {
            notify::spawn(&hub, journal.clone(), delivery, shutdown.clone());
        }
        Err(e) => warn!(error = %e, "cannot set up notifications; none will be sent"),
    }
    let page = match &bound {
        Bound::Tcp { addr, .. } => api::page::PageState::tcp(*addr),
        Bound::Unix(_) => {
            api::page::PageState::on_demand(options.state_dir.clone(), options.server.clone())
        }
    };
    let state = api::AppState {
        journal,
        supervisor,
        hub,
        shutdown: shutdown.clone(),
        token,
        status_replays: api::StatusReplays::default(),
        page: page.clone(),
        transcripts,
        worktrees: paths::worktrees_dir(&options.state_dir),
    };
    // What runs that ended while no daemon watched (a crash, a kill) left behind, and a
    // checkout of main a landing was interrupted in: collected in the background once the
    // daemon listens (a big collection took minutes), with progress in the log. Finished
    // runs' transcripts stay: after a crash is when they are read (`flotilla gc` takes them).
    let collector = state.supervisor.clone();
    tokio::spawn(async move {
        match collector
            .send(supervisor::CollectGarbage {
                dry_run: false,
                progress: true,
                transcripts: false,
            })
            .await
        {
            Ok(Ok(report)) => {
                if !report.errors.is_empty() {
                    warn!(errors = ?report.errors, "some leftovers of finished runs could not be removed");
                }
            }
            Ok(Err(e)) => warn!(error = %e, "cannot collect what finished runs left"),
            Err(e) => warn!(error = %e, "cannot collect what finished runs left"),
        }
    });
    let stopping = state.supervisor.clone();
    let app = api::router(state);
    if let Some(ready) = ready {
        let _ = ready.send(bound.clone());
    }
    match listener {
        Listener::Unix(l) => api::serve(l, app, options.server.clone(), shutdown).await,
        Listener::Tcp(l) => api::serve(l, app, options.server.clone(), shutdown).await,
    }
    if let Some(page_server) = page.take_server() {
        let _ = page_server.await;
    }
    if let Bound::Unix(path) = &bound {
        let _ = std::fs::remove_file(path);
    }
    // A run that ended just before the stop is still retiring: its sweep, the heal of its
    // target's checkout and its stored status are let finish, for a while.
    // (The supervisor logs what it left unfinished.)
    let _ = stopping
        .send(supervisor::FinishCleanUps {
            within: CLEAN_UPS_AT_STOP,
        })
        .await;
    // The runs' thread ends (its actors dropped, as at any stop) before the state lock goes:
    // a daemon started next on this state directory must not meet this one's runs.
    runs_thread.stop();
    if tokio::task::spawn_blocking(move || runs_thread.join())
        .await
        .is_err()
    {
        warn!("the runs' thread did not end cleanly");
    }
    info!("daemon stopped");
    drop(lock);
    Ok(())
}

/// Opens the journal, refusing to start over silently when one existed before: the marker
/// beside it says so.
fn open_journal(
    state_dir: &Path,
    clock: Arc<dyn Clock>,
    sync: JournalSync,
) -> anyhow::Result<SqliteJournal> {
    let journal_path = paths::journal_path(state_dir);
    let marker = paths::journal_marker_path(state_dir);
    let had_journal = marker.exists();
    let journal = SqliteJournal::open_checked(&journal_path, clock, had_journal, sync).with_context(|| {
        if had_journal {
            format!(
                "cannot open the journal {}. If it was lost for good and you want to start over, delete {}",
                journal_path.display(),
                marker.display()
            )
        } else {
            format!("cannot open the journal {}", journal_path.display())
        }
    })?;
    if !had_journal {
        std::fs::write(
            &marker,
            format!(
                "flotilla: a journal was created at {} by PID {}; a daemon that finds it missing or empty refuses to start\n",
                journal_path.display(),
                std::process::id()
            ),
        )
        .with_context(|| format!("cannot write {}", marker.display()))?;
    }
    Ok(journal)
}

/// Resumes every unfinished run. A run that cannot be loaded is reported damaged; it never
/// stops the daemon from starting or the other runs from resuming. Only the runs it resumes
/// have their config read (ADR-040): a finished run's (a big one's holds its whole
/// scenario) is not even read, whatever it holds.
async fn resume_unfinished(journal: &SqliteJournal, supervisor: &actix::Addr<Supervisor>) {
    let runs = match journal.run_list().await {
        Ok(runs) => runs,
        Err(e) => {
            warn!(error = %e, "cannot list the journal's runs; none resumed");
            return;
        }
    };
    for listed in runs.into_iter().filter(|r| r.outcome.is_none()) {
        let damaged = |reason: String| RunDamaged {
            run: listed.id,
            reason,
        };
        let record = match journal.run(listed.id).await {
            Ok(Some(record)) => record,
            Ok(None) => continue, // listed a moment ago: runs are never removed
            Err(e) => {
                supervisor.do_send(damaged(e.to_string()));
                continue;
            }
        };
        let config: RunConfig = match serde_json::from_value(record.config) {
            Ok(c) => c,
            Err(e) => {
                supervisor.do_send(damaged(format!("its stored config is unreadable: {e}")));
                continue;
            }
        };
        let events = match journal.read(record.id, 0).await {
            Ok(events) => events,
            Err(e) => {
                supervisor.do_send(damaged(e.to_string()));
                continue;
            }
        };
        info!(run = %record.id, events = events.len(), "resuming run");
        let started = supervisor
            .send(StartRun {
                run: record.id,
                request: record.request.clone(),
                repo: record.repo.clone(),
                config,
                journal: events,
            })
            .await;
        match started {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(run = %record.id, error = %e, "cannot resume run"),
            Err(e) => warn!(run = %record.id, error = %e, "the supervisor is gone"),
        }
    }
}

enum Listener {
    Unix(tokio::net::UnixListener),
    Tcp(tokio::net::TcpListener),
}

/// Why the daemon could not start serving; each says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("refusing to listen on {0}: only loopback addresses (127.0.0.1, ::1) are allowed")]
    NotLoopback(SocketAddr),
    #[error("refusing to listen on {}: something that is not a socket is there", .0.display())]
    NotASocket(PathBuf),
    #[error("a flotilla daemon is already listening on {}", .0.display())]
    AlreadyServing(PathBuf),
    #[error("cannot listen on {at}: {source}")]
    Listen { at: String, source: std::io::Error },
}

impl BindError {
    /// What to do about it.
    pub fn hint(&self) -> &'static str {
        match self {
            BindError::NotLoopback(_) => "use --listen 127.0.0.1:PORT (or [::1]:PORT)",
            BindError::NotASocket(_) => "name a path where nothing is yet with --socket",
            BindError::AlreadyServing(_) => "stop the other daemon, or pass another --socket",
            BindError::Listen { .. } => {
                "pick another port, stop what uses it, or check the directory exists"
            }
        }
    }
}

async fn bind(options: &DaemonOptions) -> anyhow::Result<(Listener, Bound, Option<Arc<String>>)> {
    let listen_error = |at: String| move |source| BindError::Listen { at, source };
    match &options.listen {
        Listen::Unix(path) => {
            if let Ok(existing) = std::fs::symlink_metadata(path) {
                use std::os::unix::fs::FileTypeExt;
                // Only a socket is ours to replace: `--socket` naming a file by mistake must
                // not cost the user that file.
                if !existing.file_type().is_socket() {
                    return Err(BindError::NotASocket(path.clone()).into());
                }
                if tokio::net::UnixStream::connect(path).await.is_ok() {
                    return Err(BindError::AlreadyServing(path.clone()).into());
                }
                // Left behind by a daemon that died: nobody answers on it.
                std::fs::remove_file(path)
                    .with_context(|| format!("cannot remove stale socket {}", path.display()))?;
            }
            let listener = tokio::net::UnixListener::bind(path)
                .map_err(listen_error(path.display().to_string()))?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            Ok((Listener::Unix(listener), Bound::Unix(path.clone()), None))
        }
        Listen::Tcp(addr) => {
            if !addr.ip().is_loopback() {
                return Err(BindError::NotLoopback(*addr).into());
            }
            let token_file = paths::token_path(&options.state_dir);
            let token = load_or_create_token(&token_file)?;
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(listen_error(addr.to_string()))?;
            let addr = listener.local_addr()?;
            Ok((
                Listener::Tcp(listener),
                Bound::Tcp { addr, token_file },
                Some(Arc::new(token)),
            ))
        }
    }
}

/// How long start-up waits for the scan of what a dead daemon left: reading a process's
/// environment waits on its memory's lock, which a process stuck in the kernel can hold.
const LEFT_BEHIND_SCAN: std::time::Duration = std::time::Duration::from_secs(10);

/// Ends, and logs, what carries `mark`: processes a previous daemon on this state directory
/// left running when it died (`process::left_behind`). Bounded: past its time the daemon
/// starts anyway and says so.
async fn end_what_a_dead_daemon_left(mark: &DaemonMark) {
    let scan = mark.clone();
    let scanned = tokio::time::timeout(
        LEFT_BEHIND_SCAN,
        tokio::task::spawn_blocking(move || end_left_behind(&scan)),
    )
    .await;
    let found = match scanned {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => {
            warn!(error = %e, "the scan for what a previous daemon left running failed");
            return;
        }
        Err(_) => {
            warn!(
                "the scan for what a previous daemon left running took over {}s; starting without it",
                LEFT_BEHIND_SCAN.as_secs()
            );
            return;
        }
    };
    if !found.killed.is_empty() {
        warn!(
            count = found.killed.len(),
            pids = ?found.killed,
            "ended what a previous daemon on this state directory left running"
        );
    }
    if !found.unended.is_empty() {
        warn!(
            pids = ?found.unended,
            "a previous daemon on this state directory left processes running that cannot be \
             ended safely here (no pidfds): end them by hand"
        );
    }
}

/// The bearer token for TCP clients: 32 random bytes, hex, in a 0600 file.
pub(crate) fn load_or_create_token(path: &Path) -> anyhow::Result<String> {
    if let Ok(existing) = std::fs::read_to_string(path) {
        let existing = existing.trim().to_string();
        if existing.len() >= 32 {
            return Ok(existing);
        }
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| anyhow::anyhow!("the OS gave no random bytes for the token: {e}"))?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(token.as_bytes())?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use flotilla_actors::ports::{Journal, SystemClock};
    use flotilla_actors::protocol::{EventKind, RunId, RunOutcome};

    use super::supervisor::RunProblems;
    use super::*;
    use crate::journal::RunRecord;

    /// Start-up reads the config of the runs it resumes and no other (ADR-040): finished
    /// runs' configs are not read, even one that no longer reads; an unfinished run whose
    /// config does not read is damaged, as before.
    #[test]
    fn start_up_reads_only_the_configs_of_the_runs_it_resumes() {
        actix::System::new().block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("journal.sqlite");
            let clock: Arc<dyn Clock> = Arc::new(SystemClock);
            let journal = SqliteJournal::open(&path, clock.clone()).unwrap();
            let record = |config| RunRecord {
                id: RunId::generate(),
                request: "r".into(),
                repo: dir.path().into(),
                config,
                created_ms: 1,
                outcome: None,
            };
            let mut finished = Vec::new();
            for _ in 0..3 {
                let r = record(serde_json::to_value(RunConfig::default()).unwrap());
                finished.push(r.id);
                journal.create_run(r).await.unwrap();
                let end = EventKind::RunFinished {
                    outcome: RunOutcome::Completed,
                    reason: None,
                };
                journal
                    .append(*finished.last().unwrap(), vec![end])
                    .await
                    .unwrap();
            }
            rusqlite::Connection::open(&path)
                .unwrap()
                .execute(
                    "UPDATE runs SET config = '{\"limits\": not json' WHERE id = ?1",
                    [finished[0].to_string()],
                )
                .unwrap();
            let unreadable = record(serde_json::json!("not a config"));
            let unfinished = unreadable.id;
            journal.create_run(unreadable).await.unwrap();

            let (hub, _) = broadcast::channel(16);
            let supervisor = Supervisor::new(
                journal.clone(),
                Arc::new(journal.clone()),
                clock,
                hub,
                dir.path().join("worktrees"),
                Arc::new(ProviderRegistry::new().unwrap()),
            )
            .start();
            resume_unfinished(&journal, &supervisor).await;
            assert_eq!(
                journal.configs_read(),
                1,
                "only the unfinished run's config"
            );
            let problems = supervisor.send(RunProblems).await.unwrap();
            assert_eq!(problems.keys().collect::<Vec<_>>(), [&unfinished]);
            assert!(problems[&unfinished].is_damage());
        });
    }
}
