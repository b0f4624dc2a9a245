//! `flotilla submit`: starts a run, then follows it to its end and prints its report (or
//! with `--detach` prints its id).

use std::path::Path;

use crate::api::runs::CreateRun;
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
    // Said once, before any event: nothing will test what lands (ADR-032).
    let untested = run_config.main_untested();
    let body = CreateRun {
        request: request.to_string(),
        repo,
        config: Some(run_config),
    };
    let created = client.submit(&body).await?;
    // The branch the run lands on (ADR-022), said where the user reads.
    let landing = created
        .branch
        .as_deref()
        .map(|b| format!(", landing on {}", text_safety::terminal_safe(b)))
        .unwrap_or_default();
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
    // Followed to its end: the run's report closes what was printed (not with `--json`,
    // whose output is one event a line; `flotilla report RUN --json` gives it).
    if outcome.is_some() && !json {
        match client.report(&created.id).await {
            Ok(report) => emit(&format!("\n{}", report::report_text(&report)))?,
            // The run's outcome stands; only its summary is missing.
            Err(e) => note(&format!(
                "no report for run {}: {}",
                text_safety::terminal_safe(&created.id),
                text_safety::terminal_safe(&e.to_string())
            )),
        }
    }
    Ok(exit_for(outcome))
}
