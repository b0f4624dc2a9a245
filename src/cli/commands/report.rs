//! `flotilla report RUN`: the run's report, computed by the daemon from its journal.

use crate::cli::client::Client;
use crate::cli::emit;
use crate::cli::error::{CliError, Exit};
use crate::cli::render::report;
use crate::text_safety;

pub async fn run(client: &Client, run: &str, json: bool) -> Result<Exit, CliError> {
    let report = client.report(run).await?;
    if json {
        emit(&format!("{}\n", text_safety::json_pretty(&report)))?;
    } else {
        emit(&report::report_text(&report))?;
    }
    Ok(Exit::Ok)
}
