//! `flotilla graph RUN`: the run's task graph as Mermaid, Graphviz DOT or JSON.

use hyper::Method;

use crate::cli::args::GraphFormat;
use crate::cli::client::{Client, segment};
use crate::cli::emit;
use crate::cli::error::{CliError, Exit};
use crate::text_safety;

pub async fn run(client: &Client, run: &str, format: GraphFormat) -> Result<Exit, CliError> {
    let name = match format {
        GraphFormat::Mermaid => "mermaid",
        GraphFormat::Dot => "dot",
        GraphFormat::Json => "json",
    };
    let text = client
        .text(
            Method::GET,
            &format!("/v1/runs/{}/graph?format={name}", segment(run)),
        )
        .await?;
    match format {
        GraphFormat::Json => emit(&text_safety::json_safe(&text))?,
        GraphFormat::Mermaid | GraphFormat::Dot => emit(&text_safety::terminal_safe_lines(&text))?,
    }
    Ok(Exit::Ok)
}
