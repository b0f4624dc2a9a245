//! `flotilla daemon`: runs the daemon in the foreground, in an actix `System`, until SIGTERM
//! or Ctrl-C. `main` takes the provider keys out of the environment and hardens the process
//! before this runs (the process has one thread then).

use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use crate::cli::args::{Cli, LogFormat};
use crate::cli::error::{CliError, ErrorKind, Exit};
use crate::daemon::{self, Bound, DaemonOptions, Listen};
use crate::journal::JournalSync;
use crate::paths;

/// Runs the daemon until SIGTERM or Ctrl-C. `held`: the names of the credentials `main`
/// took out of the environment before anything else (ADR-015), for the log.
pub fn run(
    cli: &Cli,
    held: &[String],
    listen: Option<SocketAddr>,
    log_format: LogFormat,
    journal_sync: JournalSync,
) -> Result<Exit, CliError> {
    let filter = match std::env::var("FLOTILLA_LOG") {
        Err(_) => EnvFilter::new("info"),
        Ok(spec) => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
            // A typo must not silence the daemon: say so, and log as by default.
            eprintln!(
                "warning: FLOTILLA_LOG={:?} is not a log filter ({e}); logging at info",
                crate::text_safety::terminal_safe(&spec)
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
        LogFormat::Human => crate::logging::human(std::io::stderr, filter, ansi).init(),
        LogFormat::Json => crate::logging::json(std::io::stderr, filter).init(),
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
    outcome.map(|()| Exit::Ok).map_err(|e| {
        let hint = daemon_hint(&e);
        let error = CliError::wrap(ErrorKind::Internal, e);
        match hint {
            Some(hint) => error.hint(hint),
            None => error,
        }
    })
}

/// A hint that fits why the daemon could not start (none when the message says it all).
fn daemon_hint(error: &anyhow::Error) -> Option<String> {
    use crate::daemon::BindError;
    use crate::daemon::state_lock::LockError;
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
