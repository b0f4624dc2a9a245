//! `flotilla bench --landing`: drives the landing measurement ([`crate::bench::landing`])
//! through a real daemon. Per case: a fresh repository from the cached template, a fresh
//! `flotilla daemon` child on a state directory of its own (so its CPU, peak RSS and disk
//! are the case's), the run submitted and followed over the API to `run_finished`, the
//! daemon stopped, the numbers printed. It lives here because the HTTP client does. Also
//! the driver of `--gate-timing` ([`crate::bench::gate_timing`]), which needs no daemon.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::bench::gate_timing::{self, GateTimingOptions, GateTimingReport};
use crate::bench::landing::{self, DaemonUsage, LandingCase, LandingClock};
use crate::bench::{Measurement, Printer, landing_repo};
use crate::cli::client::{Client, Endpoint};
use crate::text_safety::terminal_safe;

/// What `flotilla bench --landing` runs.
#[derive(Debug, Clone)]
pub struct LandingOptions {
    pub files: Vec<usize>,
    pub tasks: Vec<usize>,
    pub workers: usize,
    pub gate: Option<String>,
    pub repeat: usize,
    /// Each case's next run on its repository is measured too (after a daemon restart).
    pub next_run: bool,
    /// Templates are cached here, cases made (and removed) here.
    pub dir: PathBuf,
    pub json: bool,
}

/// How long a daemon may take to listen.
const DAEMON_START: Duration = Duration::from_secs(60);
/// Lines of the daemon's log kept for an error report.
const LOG_TAIL: usize = 40;

#[derive(Debug, thiserror::Error)]
pub enum LandingBenchError {
    #[error("the bench's directory {path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the repository: {0}")]
    Repo(#[from] landing_repo::RepoGenError),
    #[error("this program's path (to start its daemon): {0}")]
    Exe(#[source] std::io::Error),
    #[error("starting the daemon: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("the daemon did not start; it logged:\n{log}")]
    DaemonDidNotStart { log: String },
    #[error("the run's config: {0}")]
    Config(#[source] serde_json::Error),
    #[error("the daemon: {source}; it logged:\n{log}")]
    Api {
        #[source]
        source: crate::cli::client::ClientError,
        log: String,
    },
    #[error("{files} files, {tasks} tasks: {source}; the daemon logged:\n{log}")]
    Case {
        files: usize,
        tasks: usize,
        #[source]
        source: landing::LandingError,
        log: String,
    },
    #[error("an async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    Print(#[from] crate::bench::BenchError),
}

/// Runs every case of `options` (sizes × task counts × repeats), printing each row as it
/// finishes. Outside any async runtime: it makes its own.
pub fn run(
    options: &LandingOptions,
    out: &mut dyn std::io::Write,
) -> Result<Vec<Measurement>, LandingBenchError> {
    let exe = std::env::current_exe().map_err(LandingBenchError::Exe)?;
    std::fs::create_dir_all(&options.dir).map_err(|source| LandingBenchError::Dir {
        path: options.dir.clone(),
        source,
    })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(LandingBenchError::Runtime)?;
    let mut printer = Printer::new(options.json, out);
    let mut rows = Vec::new();
    // Each case's repository and state go once every case has run, not between two: on a
    // file system without a journal (this VM's ext4) each new inode is slowed by every one
    // freed in the last ~30 s, so deleting one case's trees charged the next case's
    // checkouts for it (ADR-041).
    let mut done = Vec::new();
    for &files in &options.files {
        for &tasks in &options.tasks {
            for _ in 0..options.repeat.max(1) {
                let case = LandingCase {
                    files,
                    tasks,
                    workers: options.workers,
                    gate: options.gate.clone(),
                };
                let (measured, work) =
                    runtime.block_on(one_case(&exe, &options.dir, &case, options.next_run))?;
                for row in measured {
                    printer.landing(&row)?;
                    rows.push(row);
                }
                done.push(work);
            }
        }
    }
    drop(done);
    Ok(rows)
}

/// One case: its repository, its first run and, with `next_run`, the run after it on the
/// same repository and state (the first daemon stopped, a new one started).
async fn one_case(
    exe: &Path,
    dir: &Path,
    case: &LandingCase,
    next_run: bool,
) -> Result<(Vec<Measurement>, tempfile::TempDir), LandingBenchError> {
    let prepared = Instant::now();
    let template = landing_repo::template(dir, case.files)?;
    let work = tempfile::Builder::new()
        .prefix("case-")
        .tempdir_in(dir)
        .map_err(|source| LandingBenchError::Dir {
            path: dir.to_path_buf(),
            source,
        })?;
    let repo = work.path().join("repo");
    let state = work.path().join("state");
    landing_repo::checkout_copy(&template, &repo)?;
    let prepare_ms = prepared.elapsed().as_millis() as u64;

    let mut rows = vec![Measurement::of_landing(
        case,
        &one_run(exe, &state, &repo, case, 0).await?,
        prepare_ms,
    )];
    if next_run {
        let next = one_run(exe, &state, &repo, case, 1).await?;
        let mut row = Measurement::of_landing(case, &next, 0);
        row.name.push_str("/next-run");
        rows.push(row);
    }
    Ok((rows, work))
}

/// One run of `case` (the repository's `round`th) on `repo` through a daemon of its own on `state`, followed to its
/// end; the daemon is stopped (its clean-up of the run done) before this returns.
async fn one_run(
    exe: &Path,
    state: &Path,
    repo: &Path,
    case: &LandingCase,
    round: usize,
) -> Result<landing::LandingResult, LandingBenchError> {
    let daemon = BenchDaemon::start(exe, state)?;
    let client = Client::new(Endpoint::Unix(state.join("daemon.sock")));
    let config = serde_json::to_value(landing::run_config(case, round))
        .map_err(LandingBenchError::Config)?;
    let body = serde_json::json!({
        "request": format!("flotilla bench --landing: {} tasks on {} files", case.tasks, case.files),
        "repo": repo,
        "config": config,
    });
    let api = |source| LandingBenchError::Api {
        source,
        log: daemon.log_tail(),
    };
    let cpu_before = daemon.cpu_ms();
    let created = client.submit(&body).await.map_err(api)?;
    let mut clock = LandingClock::default();
    let mut stream = client.events(&created.id, None).await.map_err(api)?;
    while let Some(event) = stream.next().await {
        clock.observe(&event.map_err(api)?);
        if clock.finished() {
            break;
        }
    }
    drop(stream);
    let cpu_ms = daemon.cpu_ms().saturating_sub(cpu_before);
    let peak_rss_bytes = landing::process_peak_rss(daemon.pid());
    let log = daemon.log_tail();
    daemon.stop();
    let usage = DaemonUsage {
        cpu_ms,
        peak_rss_bytes,
        disk_bytes: landing::disk_bytes(state) + landing::disk_bytes(&repo.join(".git")),
    };
    clock
        .result(case, usage)
        .map_err(|source| LandingBenchError::Case {
            files: case.files,
            tasks: case.tasks,
            source,
            log,
        })
}

/// A `flotilla daemon` child on a state directory of the bench's. Stopped with SIGTERM
/// (and waited for) by [`BenchDaemon::stop`]; killed if dropped otherwise.
struct BenchDaemon {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl BenchDaemon {
    fn start(exe: &Path, state: &Path) -> Result<Self, LandingBenchError> {
        let mut child = Command::new(exe)
            .arg("--state-dir")
            .arg(state)
            .arg("daemon")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(LandingBenchError::Spawn)?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        if let Some(stderr) = child.stderr.take() {
            let sink = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let ready = line.contains("listening on");
                    if let Ok(mut log) = sink.lock() {
                        log.push(terminal_safe(&line).into_owned());
                        let excess = log.len().saturating_sub(LOG_TAIL);
                        log.drain(..excess);
                    }
                    if ready {
                        let _ = ready_tx.send(true);
                    }
                }
                // Standard error closed: the daemon ended.
                let _ = ready_tx.send(false);
            });
        }
        let daemon = BenchDaemon { child, log };
        match ready_rx.recv_timeout(DAEMON_START) {
            Ok(true) => Ok(daemon),
            _ => Err(LandingBenchError::DaemonDidNotStart {
                log: daemon.log_tail(),
            }),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn cpu_ms(&self) -> u64 {
        landing::process_cpu_ms(self.pid()).unwrap_or(0)
    }

    fn log_tail(&self) -> String {
        self.log.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// SIGTERM, then waits: the daemon stops its runs and removes its socket.
    fn stop(mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: a signal to our own child, which has not been waited for yet.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let _ = self.child.wait();
    }
}

impl Drop for BenchDaemon {
    fn drop(&mut self) {
        // Stopped already (then this does nothing), or an error on the way: no daemon left.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `flotilla bench --gate-timing`: measures on a runtime of its own and prints the report
/// (one JSON object with `--json`).
pub fn run_gate_timing(
    options: &GateTimingOptions,
    json: bool,
) -> Result<crate::cli::error::Exit, crate::cli::error::CliError> {
    use crate::cli::error::{CliError, Exit};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::internal("an async runtime").because(e))?;
    let report = runtime
        .block_on(gate_timing::measure(options))
        .map_err(|e| CliError::internal("the gate timing failed").because(e))?;
    let text = if json {
        let mut value = serde_json::to_value(&report)
            .map_err(|e| CliError::internal("the report").because(e))?;
        value["cold_later_median_ms"] = GateTimingReport::later_median(&report.cold_ms).into();
        value["warm_later_median_ms"] = GateTimingReport::later_median(&report.warm_ms).into();
        value["speed_up"] = report.speed_up().into();
        format!("{value}\n")
    } else {
        report.text()
    };
    let mut out = std::io::stdout().lock();
    std::io::Write::write_all(&mut out, text.as_bytes())
        .map_err(|e| CliError::internal("writing the report").because(e))?;
    Ok(Exit::Ok)
}
