//! `flotilla gc`: removes (or with `--dry-run` lists) what finished runs left behind.

use hyper::Method;

use crate::api::gc::GcReport;
use crate::cli::client::Client;
use crate::cli::emit;
use crate::cli::error::{CliError, Exit};
use crate::text_safety;

pub async fn run(client: &Client, dry_run: bool, json: bool) -> Result<Exit, CliError> {
    let path = if dry_run {
        "/v1/gc?dry_run=true"
    } else {
        "/v1/gc"
    };
    let report: GcReport = client.json(Method::POST, path, None::<&()>).await?;
    if json {
        emit(&format!(
            "{}\n",
            text_safety::json_safe(&serde_json::to_string(&report).unwrap_or_default())
        ))?;
        return Ok(Exit::Ok);
    }
    let verb = if report.dry_run {
        "would remove"
    } else {
        "removed"
    };
    if report.worktrees.is_empty()
        && report.unknown.is_empty()
        && report.branches.is_empty()
        && report.locks.is_empty()
        && report.transcripts.is_empty()
    {
        emit("nothing to collect\n")?;
    } else {
        emit(&format!(
            "{verb} {} worktree(s), {} branch(es) and {} stale ref lock(s) of finished runs, {} unknown director(ies)\n",
            report.worktrees.len(),
            report.branches.len(),
            report.locks.len(),
            report.unknown.len()
        ))?;
        for line in report
            .worktrees
            .iter()
            .chain(&report.branches)
            .chain(&report.locks)
            .chain(&report.unknown)
        {
            emit(&format!("  {}\n", text_safety::terminal_safe(line)))?;
        }
        if !report.transcripts.is_empty() {
            emit(&format!(
                "{verb} the transcripts of {} run(s)\n",
                report.transcripts.len()
            ))?;
        }
    }
    for error in &report.errors {
        emit(&format!(
            "could not collect: {}\n",
            text_safety::terminal_safe(error)
        ))?;
    }
    Ok(if report.errors.is_empty() {
        Exit::Ok
    } else {
        Exit::Failure
    })
}
