//! `flotilla cancel RUN`.

use hyper::Method;

use crate::cli::client::{Client, segment};
use crate::cli::emit;
use crate::cli::error::{CliError, Exit};
use crate::text_safety;

pub async fn run(client: &Client, run: &str) -> Result<Exit, CliError> {
    let answer: serde_json::Value = client
        .json(
            Method::POST,
            &format!("/v1/runs/{}/cancel", segment(run)),
            None::<&()>,
        )
        .await?;
    let id = answer["id"].as_str().unwrap_or(run);
    emit(&format!(
        "cancelling run {}\n",
        text_safety::terminal_safe(id)
    ))?;
    Ok(Exit::Ok)
}
