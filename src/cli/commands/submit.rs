//! `flotilla submit`: starts a run, then follows it to its end and prints its report (or
//! with `--detach` prints its id).

use std::path::Path;

use crate::api::runs::{CreateRun, Created};
use crate::cli::client::Client;
use crate::cli::error::{CliError, ErrorKind, Exit};
use crate::cli::render::report;
use crate::cli::render::status::UNTESTED_MAIN;
use crate::cli::{emit, note};
use crate::config::RunConfig;
use crate::text_safety;

use super::tail::{exit_for, follow};

pub async fn submit(
    client: &Client,
    request: &str,
    repo: &Path,
    config: Option<&Path>,
    detach: bool,
    json: bool,
) -> Result<Exit, CliError> {
    let Started { created, untested } = start(client, request, repo, config).await?;
    // The branch the run lands on (ADR-022), said where the user reads.
    let landing = landing_note(&created);
    if detach {
        emit(&format!("{}\n", text_safety::terminal_safe(&created.id)))?;
        if !json && !landing.is_empty() {
            note(&format!(
                "run {} submitted{landing}",
                text_safety::terminal_safe(&created.id)
            ));
        }
        if !json && untested {
            note(&format!("gate: {UNTESTED_MAIN}"));
        }
        return Ok(Exit::Ok);
    }
    if !json {
        note(&format!(
            "run {} submitted{landing}; following it (Ctrl-C stops following, not the run)",
            text_safety::terminal_safe(&created.id)
        ));
        if untested {
            note(&format!("gate: {UNTESTED_MAIN}"));
        }
    }
    let outcome = follow(client, &created.id, None, json).await?;
    if outcome.is_some() && !json {
        print_report(client, &created.id).await?;
    }
    Ok(exit_for(outcome))
}

/// A run the daemon took.
pub struct Started {
    pub created: Created,
    /// Nothing tests what lands: no `[merge] gate`, no `[reconciler]` commands (ADR-032).
    /// Said once, before any event.
    pub untested: bool,
}

/// Loads the run's config (default: `<repo>/flotilla.toml`) and starts the run.
pub async fn start(
    client: &Client,
    request: &str,
    repo: &Path,
    config: Option<&Path>,
) -> Result<Started, CliError> {
    let repo = std::fs::canonicalize(repo).map_err(|e| {
        CliError::user(format!("repository {}", repo.display()))
            .because(e)
            .hint("pass --repo PATH")
    })?;
    let config_path = config
        .map(Path::to_path_buf)
        .unwrap_or_else(|| repo.join("flotilla.toml"));
    let run_config = RunConfig::load(&config_path).map_err(|e| {
        let hint = e.hint();
        CliError::wrap(ErrorKind::Config, e).hint(hint)
    })?;
    let untested = run_config.main_untested();
    let body = CreateRun {
        request: request.to_string(),
        repo,
        config: Some(run_config),
    };
    let created = client.submit(&body).await?;
    Ok(Started { created, untested })
}

/// `, landing on BRANCH` when the daemon said which branch the run lands on.
pub fn landing_note(created: &Created) -> String {
    created
        .branch
        .as_deref()
        .map(|b| format!(", landing on {}", text_safety::terminal_safe(b)))
        .unwrap_or_default()
}

/// The run's report, after its followed events (`flotilla report RUN` prints the same).
/// Not with `--json`, whose output is one event a line; `flotilla report RUN --json` gives it.
pub async fn print_report(client: &Client, run: &str) -> Result<(), CliError> {
    match client.report(run).await {
        Ok(report) => emit(&format!("\n{}", report::report_text(&report)))?,
        // The run's outcome stands; only its summary is missing.
        Err(e) => note(&format!(
            "no report for run {}: {}",
            text_safety::terminal_safe(run),
            text_safety::terminal_safe(&e.to_string())
        )),
    }
    Ok(())
}
