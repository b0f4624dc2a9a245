//! The handlers about a run's tasks and graph: a task's story, the user's decisions (for a
//! task, or adopting a moved main for the whole run), and the graph exports.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use flotilla_actors::protocol::{TaskId, TaskState, UserDecision};
use serde::Deserialize;

use super::super::supervisor::{AdoptMain, DecideTask};
use super::runs::{read_events, replay_status, run_status, unfinished};
use super::{ApiError, ApiJson, AppState, resolve};
use crate::api::runs::RunDecision;
use crate::api::status::{TaskStory, task_state_words};

/// A task's whole story: every event of the run that is about it (`flotilla status RUN
/// TASK`).
pub(super) async fn task_story(
    State(state): State<AppState>,
    Path((id, task)): Path<(String, String)>,
) -> Result<Json<TaskStory>, ApiError> {
    let task: TaskId = task.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{task:?} is not a task id (they look like t4, t4.2 or f1)"),
        )
    })?;
    let record = resolve(&state, &id).await?;
    let events = read_events(&state, record.id, 0).await?;
    let run = record.id.to_string();
    let wanted = task.clone();
    // A big run's events are many: filtered off the runtime's thread.
    let story =
        tokio::task::spawn_blocking(move || super::super::story::story(run, wanted, events))
            .await
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    if story.events.is_empty() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("run {} has no task {task}", record.id),
        ));
    }
    Ok(Json(story))
}

/// `flotilla decide`: checks the decision against the journal (the task exists, waits for a
/// decision, an accepted subtask is one of its completed subtasks) so that a mistake is a
/// clear 404 or 409 now, then forwards it to the run's TaskGraph, which applies it.
pub(super) async fn decide(
    State(state): State<AppState>,
    Path((id, task)): Path<(String, String)>,
    ApiJson(decision): ApiJson<UserDecision>,
) -> Result<Response, ApiError> {
    let task: TaskId = task.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{task:?} is not a task id (they look like t4 or t4.2)"),
        )
    })?;
    let record = unfinished(&state, &id).await?;
    let events = Arc::new(read_events(&state, record.id, 0).await?);
    let status = replay_status(record.clone(), events).await?;
    let view = |id: &TaskId| status.graph.tasks.iter().find(|t| t.id == *id);
    let Some(waiting) = view(&task) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("run {} has no task {task}", record.id),
        ));
    };
    // Awaiting: it announced so after its latest decomposition, and still waits.
    let awaiting = status.awaiting_decision.contains(&task);
    if !awaiting {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "task {task} is not waiting for a decision (it is {})",
                task_state_words(waiting.state)
            ),
        ));
    }
    // A held landing (ADR-016) is let go or failed; a parent's subtasks are chosen from.
    let landing = waiting.state == TaskState::Landing;
    match (&decision, landing) {
        (UserDecision::Land, false) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "task {task} holds no work waiting to land; decide --accept, --complete or --fail"
                ),
            ));
        }
        (UserDecision::Accept { .. } | UserDecision::Complete, true) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "task {task} changes flotilla's configuration and waits to land; decide --land or --fail"
                ),
            ));
        }
        _ => {}
    }
    if let UserDecision::Accept { subtask } = &decision {
        let completed_child = view(subtask)
            .is_some_and(|s| s.parent.as_ref() == Some(&task) && s.state == TaskState::Completed);
        if !completed_child {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("{subtask} is not a completed subtask of {task}; only one can be accepted"),
            ));
        }
    }
    let live = state
        .supervisor
        .send(DecideTask {
            run: record.id,
            task: task.clone(),
            decision: decision.clone(),
        })
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    if !live {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("run {} is not running in this daemon", record.id),
        ));
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(serde_json::json!({
            "id": record.id.to_string(), "task": task.to_string(), "decision": decision,
        })),
    )
        .into_response())
}

/// `flotilla decide RUN --adopt-main`: checked against the journal (the run is running and
/// its landing paused on a diverged main) so that a mistake is a clear 409 now, then
/// forwarded to the run's TaskGraph, which journals `MainAdopted` once the merge queue has
/// read main (ADR-024).
pub(super) async fn decide_run(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(decision): ApiJson<RunDecision>,
) -> Result<Response, ApiError> {
    let record = unfinished(&state, &id).await?;
    let events = Arc::new(read_events(&state, record.id, 0).await?);
    let status = replay_status(record.clone(), events).await?;
    let Some(diverged) = status.main_diverged else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "run {}'s landing is not paused: main holds what it landed; nothing to adopt",
                record.id
            ),
        ));
    };
    let live = state
        .supervisor
        .send(AdoptMain { run: record.id })
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    if !live {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("run {} is not running in this daemon", record.id),
        ));
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(serde_json::json!({
            "id": record.id.to_string(), "decision": decision,
            "expected": diverged.expected, "actual": diverged.actual,
        })),
    )
        .into_response())
}

#[derive(Debug, Deserialize)]
pub(super) struct GraphQuery {
    #[serde(default)]
    format: Option<String>,
}

pub(super) async fn graph(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<GraphQuery>,
) -> Result<Response, ApiError> {
    let status = run_status(&state, &id).await?;
    let format = q.format.as_deref().unwrap_or("json");
    Ok(match format {
        "json" => Json(status.graph).into_response(),
        "dot" => (
            [(header::CONTENT_TYPE, "text/vnd.graphviz; charset=utf-8")],
            crate::graph_export::dot(&status.graph),
        )
            .into_response(),
        "mermaid" => (
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            crate::graph_export::mermaid(&status.graph),
        )
            .into_response(),
        other => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("unknown graph format {other:?}; use json, dot or mermaid"),
            ));
        }
    })
}
