//! `GET /v1/runs/{id}/tasks/{task}/transcript[?attempt=N&from=OFFSET&wait=true]`: an
//! attempt's transcript (`flotilla log`, ADR-036). Files are read on a blocking thread.
//! With `wait`, an answer with nothing new is held until the transcript writer has written
//! something (its watch channel) or [`LONG_POLL`] passed: `--follow` asks again from
//! `next` until `ended`, and never polls the file on a timer.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use flotilla_actors::protocol::TaskId;
use serde::Deserialize;

use super::{ApiError, AppState, resolve};
use crate::api::transcript::Transcript;
use crate::daemon::transcripts::{self, ReadBack};

/// The longest an answer is held (below the CLI's request timeout).
pub const LONG_POLL: Duration = Duration::from_secs(20);

#[derive(Debug, Deserialize)]
pub(super) struct TranscriptQuery {
    attempt: Option<u32>,
    #[serde(default)]
    from: u64,
    #[serde(default)]
    wait: bool,
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

pub(super) async fn transcript(
    State(state): State<AppState>,
    Path((id, task)): Path<(String, String)>,
    Query(query): Query<TranscriptQuery>,
) -> Result<Json<Transcript>, ApiError> {
    let task: TaskId = task.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{task:?} is not a task id (they look like t4, t4.2 or f1)"),
        )
    })?;
    let record = resolve(&state, &id).await?;
    let Some(store) = state.transcripts.clone() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "this daemon keeps no transcripts (its writer could not start; see its log)",
        ));
    };
    let mut written = store.subscribe();
    let deadline = tokio::time::Instant::now() + LONG_POLL;
    // A run that is over writes nothing more, whether or not its attempts said `end`, once
    // the attempt's sink is gone: the outcome is journaled before the Workers are told to
    // stop, and their `end` entries follow.
    let run_over = record.outcome.is_some();
    let (attempts, attempt, back, finished) = loop {
        written.borrow_and_update();
        let (root, run, wanted) = (store.root().to_path_buf(), record.id, task.clone());
        let attempts =
            tokio::task::spawn_blocking(move || transcripts::attempts(&root, run, &wanted))
                .await
                .map_err(internal)?;
        let attempt = match query.attempt {
            Some(n) if attempts.contains(&n) => Some(n),
            None => attempts.iter().copied().max(),
            Some(_) => None,
        };
        // Asked before the file is read: an attempt no longer open has all of it there.
        let finished =
            run_over && attempt.is_none_or(|n| !store.is_open(&store.path(record.id, &task, n)));
        let back = match attempt {
            Some(n) => {
                let path = store.path(record.id, &task, n);
                tokio::task::spawn_blocking(move || transcripts::read_from(&path, query.from))
                    .await
                    .map_err(internal)?
                    .map_err(|e| internal(format!("cannot read the transcript: {e}")))?
            }
            // Followed before the attempt wrote anything: waited for, like new entries.
            None if query.wait && !run_over => ReadBack::default(),
            None => {
                let which = query
                    .attempt
                    .map_or_else(String::new, |n| format!(" for attempt {n}"));
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!(
                        "run {} has no transcript of task {task}{which} (attempts with one: {attempts:?})",
                        record.id
                    ),
                ));
            }
        };
        if !query.wait || !back.entries.is_empty() || back.ended || finished {
            break (attempts, attempt, back, finished);
        }
        tokio::select! {
            changed = written.changed() => if changed.is_err() { break (attempts, attempt, back, finished) },
            // A sink that outlived its run without an `end` (a Worker that died) does not
            // hold a follow forever: after a whole long poll, the run's outcome decides.
            _ = tokio::time::sleep_until(deadline) => break (attempts, attempt, back, run_over),
            _ = state.shutdown.cancelled() => break (attempts, attempt, back, finished),
        }
    };
    Ok(Json(Transcript {
        run: record.id.to_string(),
        task: task.to_string(),
        // 0: no attempt has written yet (a follow that started early).
        attempt: attempt.unwrap_or(0),
        attempts,
        ended: back.ended || finished,
        next: back.next,
        entries: back.entries,
    }))
}
