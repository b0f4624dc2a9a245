//! `flotilla status`: a run (state, counts, spending, task tree), a task's whole story, or
//! without a run the daemon and the runs that need attention.

use crate::api::runs::RunSummary;
use crate::api::status::{RunStatus, TaskStory};
use crate::cli::client::{Client, segment};
use crate::cli::emit;
use crate::cli::error::{CliError, Exit};
use crate::cli::render::style::Style;
use crate::cli::render::{lists, status};
use crate::text_safety;

/// `flotilla status RUN TASK`.
pub async fn task(client: &Client, run: &str, task: &str, json: bool) -> Result<Exit, CliError> {
    let story: TaskStory = client
        .get(&format!(
            "/v1/runs/{}/tasks/{}",
            segment(run),
            segment(task)
        ))
        .await?;
    if json {
        emit(&format!("{}\n", text_safety::json_pretty(&story)))?;
    } else {
        emit(&status::task_story_text(&story, &Style::detect()))?;
    }
    Ok(Exit::Ok)
}

/// `flotilla status RUN`.
pub async fn run(client: &Client, run: &str, json: bool) -> Result<Exit, CliError> {
    let status: RunStatus = client.get(&format!("/v1/runs/{}", segment(run))).await?;
    if json {
        emit(&format!("{}\n", text_safety::json_pretty(&status)))?;
    } else {
        emit(&status::status_text(&status, &Style::detect()))?;
    }
    Ok(Exit::Ok)
}

/// `flotilla status`: the daemon and its runs that run or need attention.
pub async fn daemon(client: &Client, json: bool) -> Result<Exit, CliError> {
    let runs: Vec<RunSummary> = client.get("/v1/runs").await?;
    if json {
        let running: Vec<&RunSummary> = runs.iter().filter(|r| r.state == "running").collect();
        // Damaged and paused runs need the user's attention as much as running ones.
        let attention: Vec<&RunSummary> = runs
            .iter()
            .filter(|r| r.state != "running" && lists::needs_listing(r))
            .collect();
        emit(&format!(
            "{}\n",
            text_safety::json_pretty(&serde_json::json!({
                "daemon": client.endpoint_label(), "runs": runs.len(), "running": running,
                "needs_attention": attention,
            }))
        ))?;
    } else {
        emit(&lists::daemon_text(&client.endpoint_label(), &runs))?;
    }
    Ok(Exit::Ok)
}
