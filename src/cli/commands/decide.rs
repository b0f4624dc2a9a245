//! `flotilla decide`: a decision for a task that waits for the user, or about a run whose
//! landing paused on a moved main (adopt main as it is, or cancel).

use flotilla_actors::protocol::{TaskId, UserDecision};
use hyper::Method;

use crate::cli::client::{Client, segment};
use crate::cli::emit;
use crate::cli::error::{CliError, Exit};
use crate::text_safety;

/// `flotilla decide RUN --adopt-main`.
pub async fn adopt_main(client: &Client, run: &str) -> Result<Exit, CliError> {
    let answer: serde_json::Value = client
        .json(
            Method::POST,
            &format!("/v1/runs/{}/decision", segment(run)),
            Some(&serde_json::json!({"decision": "adopt_main"})),
        )
        .await?;
    let actual = answer["actual"].as_str().unwrap_or_default();
    emit(&format!(
        "decided: landing goes on on main as it is ({}); `tail` names the tasks whose \
             landed work main no longer holds\n",
        text_safety::terminal_safe(actual.get(..12).unwrap_or(actual))
    ))?;
    Ok(Exit::Ok)
}

/// `flotilla decide RUN --cancel`.
pub async fn cancel(client: &Client, run: &str) -> Result<Exit, CliError> {
    let answer: serde_json::Value = client
        .json(
            Method::POST,
            &format!("/v1/runs/{}/cancel", segment(run)),
            None::<&()>,
        )
        .await?;
    let id = answer["id"].as_str().unwrap_or(run);
    emit(&format!(
        "decided: run {} is cancelled\n",
        text_safety::terminal_safe(id)
    ))?;
    Ok(Exit::Ok)
}

/// What to decide for a waiting task.
pub struct TaskDecision<'a> {
    pub accept: Option<&'a str>,
    pub fail: bool,
    pub land: bool,
}

/// `flotilla decide RUN TASK --accept SUBTASK | --complete | --fail | --land`.
pub async fn task(
    client: &Client,
    run: &str,
    task: Option<&str>,
    decision: TaskDecision<'_>,
) -> Result<Exit, CliError> {
    let TaskDecision { accept, fail, land } = decision;
    // clap requires a task unless the decision is about the whole run.
    let task = task.unwrap_or_default();
    let (decision, words) = match (accept, fail) {
        _ if land => (
            UserDecision::Land,
            format!("{task} lands its change to flotilla's configuration"),
        ),
        (Some(subtask), _) => {
            let subtask: TaskId = subtask.parse().map_err(|_| {
                CliError::user(format!("{subtask:?} is not a task id"))
                    .hint("task ids look like t4 or t4.2")
            })?;
            let words = format!("{task} completes with {subtask}'s result");
            (UserDecision::Accept { subtask }, words)
        }
        (None, true) => (UserDecision::Fail, format!("{task} fails")),
        // clap requires exactly one of the three.
        (None, false) => (
            UserDecision::Complete,
            format!("{task} synthesizes its subtasks' results"),
        ),
    };
    client
        .json::<serde_json::Value>(
            Method::POST,
            &format!("/v1/runs/{}/tasks/{}/decision", segment(run), segment(task)),
            Some(&decision),
        )
        .await?;
    emit(&format!(
        "decided: {}\n",
        text_safety::terminal_safe(&words)
    ))?;
    Ok(Exit::Ok)
}
