//! `flotilla ui [RUN]`: prints a link that opens the live page (a run's task graph as it
//! changes) in a browser on this machine. The link holds a one-time code (ADR-034).

use hyper::Method;

use crate::api::ui::{OpenPage, PageLink};
use crate::cli::client::Client;
use crate::cli::emit;
use crate::cli::error::{CliError, Exit};
use crate::text_safety;

pub async fn run(client: &Client, run: Option<&str>) -> Result<Exit, CliError> {
    let body = OpenPage {
        run: run.map(str::to_string),
    };
    let link: PageLink = client.json(Method::POST, "/v1/ui", Some(&body)).await?;
    emit(&format!(
        "{}\nOpen it in a browser on this machine within {} minutes; it works once.\n",
        text_safety::terminal_safe(&link.url),
        link.expires_in_secs / 60
    ))?;
    Ok(Exit::Ok)
}
