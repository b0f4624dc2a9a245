//! `flotilla runs`: every run, oldest first.

use crate::api::runs::RunSummary;
use crate::cli::client::Client;
use crate::cli::emit;
use crate::cli::error::{CliError, Exit};
use crate::cli::render::lists;
use crate::text_safety;

pub async fn run(client: &Client, json: bool) -> Result<Exit, CliError> {
    let runs: Vec<RunSummary> = client.get("/v1/runs").await?;
    if json {
        emit(&format!("{}\n", text_safety::json_pretty(&runs)))?;
    } else if runs.is_empty() {
        emit("no runs yet; start one with `flotilla submit \"<request>\" --repo .`\n")?;
    } else {
        emit(&lists::runs_text(&runs))?;
    }
    Ok(Exit::Ok)
}
