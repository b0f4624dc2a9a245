//! `GET /v1/runs/{id}/tasks/{task}/transcript[?attempt=N&from=OFFSET&wait=true]`: an
//! attempt's transcript (`flotilla log`, ADR-036). Files are read on a blocking thread.
//! With `wait`, an answer with nothing new is held until the transcript writer has written
//! something (its watch channel) or [`LONG_POLL`] passed: `--follow` asks again from
//! `next` until `ended`, and never polls the file on a timer.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use flotilla_actors::protocol::{RunId, TaskId};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::{ApiError, AppState, resolve};
use crate::api::transcript::Transcript;
use crate::daemon::transcripts::{self, ReadBack, TranscriptStore};

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
    let run_over = record.outcome.is_some();
    answer(
        &store,
        record.id,
        run_over,
        task,
        &query,
        &state.shutdown,
        LONG_POLL,
    )
    .await
    .map(Json)
}

/// The answer for `task` of `run` (over or not): read, and with `wait` held as the
/// module's comment says, for at most `long_poll`.
async fn answer(
    store: &TranscriptStore,
    run: RunId,
    run_over: bool,
    task: TaskId,
    query: &TranscriptQuery,
    shutdown: &CancellationToken,
    long_poll: Duration,
) -> Result<Transcript, ApiError> {
    let mut written = store.subscribe();
    let deadline = tokio::time::Instant::now() + long_poll;
    // A run that is over writes nothing more, whether or not its attempts said `end`, once
    // the attempt's sink is gone: the outcome is journaled before the Workers are told to
    // stop, and their `end` entries follow.
    let (attempts, attempt, back, finished) = loop {
        written.borrow_and_update();
        let (root, wanted) = (store.root().to_path_buf(), task.clone());
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
            run_over && attempt.is_none_or(|n| !store.is_open(&store.path(run, &task, n)));
        let from = query.from;
        let back = match attempt {
            Some(n) => {
                let path = store.path(run, &task, n);
                tokio::task::spawn_blocking(move || transcripts::read_from(&path, from))
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
                        run
                    ),
                ));
            }
        };
        if !query.wait || !back.entries.is_empty() || back.ended || finished {
            break (attempts, attempt, back, finished);
        }
        tokio::select! {
            changed = written.changed() => if changed.is_err() {
                // The writer thread is gone (it panicked): nothing more will be written.
                // Held like an answer with nothing new, so a follow does not spin.
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => {}
                    _ = shutdown.cancelled() => {}
                }
                break (attempts, attempt, back, run_over);
            },
            // A sink that outlived its run without an `end` (a Worker that died) does not
            // hold a follow forever: after a whole long poll, the run's outcome decides.
            _ = tokio::time::sleep_until(deadline) => break (attempts, attempt, back, run_over),
            _ = shutdown.cancelled() => break (attempts, attempt, back, finished),
        }
    };
    Ok(Transcript {
        run: run.to_string(),
        task: task.to_string(),
        // 0: no attempt has written yet (a follow that started early).
        attempt: attempt.unwrap_or(0),
        attempts,
        ended: back.ended || finished,
        next: back.next,
        entries: back.entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::transcripts::DEFAULT_CAP_BYTES;
    use flotilla_actors::ports::TranscriptKind;

    fn query(from: u64) -> TranscriptQuery {
        TranscriptQuery {
            attempt: None,
            from,
            wait: true,
        }
    }

    /// A run's outcome is journaled before its Workers queue their `end` entries: a follow
    /// of the finished run still gets them.
    #[tokio::test]
    async fn a_follow_of_a_finished_run_waits_for_the_attempts_last_entries() {
        let dir = tempfile::tempdir().unwrap();
        let store = TranscriptStore::start(dir.path().join("t"), DEFAULT_CAP_BYTES).unwrap();
        let (run, task) = (RunId::generate(), "t1".parse::<TaskId>().unwrap());
        let shutdown = CancellationToken::new();
        let poll = Duration::from_secs(20);
        let sink = store.transcripts().open(run, &task, 1);
        sink.record(TranscriptKind::Step, "hang");
        let first = answer(&store, run, false, task.clone(), &query(0), &shutdown, poll)
            .await
            .unwrap();
        assert_eq!(first.entries.len(), 1);
        assert!(!first.ended);

        // The run is over; the attempt's sink is still open, its `end` not yet queued.
        let pending = tokio::spawn({
            let (store, task, shutdown) = (store.clone(), task.clone(), shutdown.clone());
            async move { answer(&store, run, true, task, &query(first.next), &shutdown, poll).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        sink.record(TranscriptKind::Step, "the last step");
        sink.end();
        drop(sink);
        let second = pending.await.unwrap().unwrap();
        let mut entries = second.entries;
        let mut ended = second.ended;
        let mut next = second.next;
        // The last step may come in an answer of its own; the follow asks again.
        while !ended {
            let more = answer(
                &store,
                run,
                true,
                task.clone(),
                &query(next),
                &shutdown,
                poll,
            )
            .await
            .unwrap();
            entries.extend(more.entries);
            (ended, next) = (more.ended, more.next);
        }
        let kinds: Vec<_> = entries.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [TranscriptKind::Step, TranscriptKind::End]);
    }

    #[tokio::test]
    async fn a_finished_run_whose_attempts_are_closed_ends_a_follow_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = TranscriptStore::start(dir.path().join("t"), DEFAULT_CAP_BYTES).unwrap();
        let (run, task) = (RunId::generate(), "t1".parse::<TaskId>().unwrap());
        let shutdown = CancellationToken::new();
        let sink = store.transcripts().open(run, &task, 1);
        sink.record(TranscriptKind::Step, "interrupted");
        drop(sink);
        crate::daemon::transcripts::until_closed(&store, &store.path(run, &task, 1)).await;
        // No `end` entry (a daemon that died mid-attempt): the run's outcome ends it, at
        // once, not after a long poll.
        let got = tokio::time::timeout(
            Duration::from_secs(10),
            answer(&store, run, true, task, &query(0), &shutdown, LONG_POLL),
        )
        .await
        .expect("answered at once")
        .unwrap();
        assert!(got.ended);
        assert_eq!(got.entries.len(), 1);
    }
}
