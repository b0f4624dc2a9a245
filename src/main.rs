//! The `flotilla` binary: parses the command line, runs the daemon inside an actix System or
//! a client command on a small tokio runtime, and turns errors into one line plus a hint.
//!
//! Provider keys are taken out of the environment first (`keys.rs`); errors end in an
//! `error:` + `hint:` line and the command's exit code.

use std::process::ExitCode;

use clap::Parser;
use flotilla::cli::{Cli, CliError, Command, Exit, LogFormat, run_client};
use flotilla::daemon::{self, Bound, DaemonOptions, Listen};
use flotilla::paths;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Daemon {
            listen,
            log_format,
            journal_sync,
            ..
        } => run_daemon(&cli, *listen, *log_format, *journal_sync),
        command @ Command::Bench { .. } => {
            tune_malloc();
            flotilla::cli::run_bench(command)
        }
        _ => match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt.block_on(run_client(&cli)),
            Err(e) => Err(CliError {
                message: format!("cannot start: {e}"),
                hint: None,
                exit: Exit::Failure,
            }),
        },
    };
    match result {
        Ok(exit) => ExitCode::from(exit as u8),
        Err(e) => {
            if !e.is_quiet() {
                use std::io::Write;
                let text = flotilla::render::error_text(&e.message, e.hint.as_deref());
                let _ = std::io::stderr().lock().write_all(text.as_bytes());
            }
            ExitCode::from(e.exit as u8)
        }
    }
}

/// Before anything else of the daemon but taking its keys (ADR-015): no core dumps, and not
/// dumpable, so that a process of the same user (an unsandboxed command) can neither ptrace
/// the daemon nor read its memory, where the keys are, or its `/proc/PID/environ`, which
/// still shows the environment it was started with.
fn harden() -> std::io::Result<()> {
    let none = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on integers and a struct we own.
    unsafe {
        if libc::setrlimit(libc::RLIMIT_CORE, &none) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn run_daemon(
    cli: &Cli,
    listen: Option<std::net::SocketAddr>,
    log_format: LogFormat,
    journal_sync: flotilla::journal::JournalSync,
) -> Result<Exit, CliError> {
    // SAFETY: the process has one thread here: nothing before this (argument parsing)
    // starts one, and the tracing subscriber, the actix System and tokio's runtimes all
    // start below. Removing variables then races no reader of the environment.
    let held = unsafe { flotilla::keys::take_daemon_keys() };
    harden().map_err(|e| CliError {
        message: format!("cannot harden the daemon: {e}"),
        hint: None,
        exit: Exit::Failure,
    })?;
    tune_malloc();
    let filter = match std::env::var("FLOTILLA_LOG") {
        Err(_) => EnvFilter::new("info"),
        Ok(spec) => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
            // A typo must not silence the daemon: say so, and log as by default.
            eprintln!(
                "warning: FLOTILLA_LOG={:?} is not a log filter ({e}); logging at info",
                flotilla::render::terminal_safe(&spec)
            );
            EnvFilter::new("info")
        }),
    };
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    // Every field and message escaped: log lines carry text flotilla did not write.
    use tracing_subscriber::util::SubscriberInitExt;
    match log_format {
        LogFormat::Human => flotilla::logging::human(std::io::stderr, filter, ansi).init(),
        LogFormat::Json => flotilla::logging::json(std::io::stderr, filter).init(),
    }
    // The names only: which credentials the providers and command agents can be given.
    tracing::info!(keys = ?held, "credentials taken out of the environment");
    // Fail points (the crash tests): armed from FAILPOINTS for the daemon's lifetime. An
    // armed point of the merge queue kills the daemon on purpose, so say so loudly. Only in
    // builds with the `failpoints` feature (the tests' build, ADR-027).
    #[cfg(feature = "failpoints")]
    let _failpoints = std::env::var_os("FAILPOINTS").map(|spec| {
        tracing::warn!(
            failpoints = %spec.to_string_lossy(),
            "FAILPOINTS is set: fail points are ACTIVE and may crash this daemon on purpose; \
             never set it outside tests"
        );
        fail::FailScenario::setup()
    });
    let state_dir = cli.state_dir();
    let listen = match listen {
        Some(addr) => Listen::Tcp(addr),
        None => Listen::Unix(
            cli.socket()
                .unwrap_or_else(|| paths::socket_path(&state_dir)),
        ),
    };
    let options = DaemonOptions {
        state_dir: state_dir.clone(),
        listen,
        #[cfg(feature = "testing")]
        journal_faults: None,
        server: Default::default(),
        journal_sync,
    };
    let system = actix_rt::System::new();
    let outcome = system.block_on(async move {
        let shutdown = CancellationToken::new();
        let signals = shutdown.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                return;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!("shutting down");
            signals.cancel();
        });
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            match ready_rx.await {
                Ok(Bound::Unix(path)) => {
                    tracing::info!(
                        "listening on {} (state: {})",
                        path.display(),
                        state_dir.display()
                    )
                }
                Ok(Bound::Tcp { addr, token_file }) => {
                    tracing::info!(
                        "listening on http://{addr}; bearer token in {}",
                        token_file.display()
                    )
                }
                Err(_) => {}
            }
        });
        daemon::serve(options, shutdown, Some(ready_tx)).await
    });
    outcome.map(|()| Exit::Ok).map_err(|e| CliError {
        message: format!("{e:#}"),
        hint: daemon_hint(&e),
        exit: Exit::Failure,
    })
}

/// A hint that fits why the daemon could not start (none when the message says it all).
fn daemon_hint(error: &anyhow::Error) -> Option<String> {
    use flotilla::daemon::BindError;
    use flotilla::daemon::state_lock::LockError;
    error.chain().find_map(|cause| {
        if let Some(LockError::Held { holder, .. }) = cause.downcast_ref::<LockError>() {
            return Some(match holder {
                Some(pid) => format!(
                    "stop that daemon first (kill {pid}), or give this one its own --state-dir"
                ),
                None => "stop the other daemon first, or give this one its own --state-dir".into(),
            });
        }
        cause
            .downcast_ref::<BindError>()
            .map(|e| e.hint().to_string())
    })
}

/// Makes glibc give back the memory a finished run freed (ADR-013).
/// - Arenas: glibc gives every thread that allocates its own malloc arena (up to 8 per
///   core), and the daemon's blocking threads (SQLite, files) come and go: memory a
///   finished run freed then sits in arenas nobody reuses. Measured on 5,000-task scripted
///   runs, one after another: with the default the daemon's RSS grew by about 30 MB per run
///   (420 MB after 12 runs); with two arenas it stays between 75 and 120 MB.
/// - The mmap threshold: glibc raises it each time a large block is freed (up to 32 MiB),
///   so a big run's large buffers (event batches, graph vectors) end up inside the heap,
///   where a few small live blocks keep the pages from going back. Fixed at 128 KiB (which
///   also stops it moving), they are mapped and unmapped on their own. `flotilla bench`'s
///   memory rows, 10k-task runs: 9.8 MB above idle after each run with the default, 3.6 MB
///   with this.
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it is called before any other thread
    // exists, and a refusal (return 0) leaves the default in place, which is harmless.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}
