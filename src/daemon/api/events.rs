//! `GET /v1/runs/{id}/events`: a run's events as server-sent events, backlog from the
//! journal first, then live ones from the hub, de-duplicated by seq; resumable with
//! `Last-Event-ID` or `?since=SEQ`; the stream ends after `run_finished` or at shutdown.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use flotilla_actors::ports::Journal;
use flotilla_actors::protocol::{Event, EventKind, RunId};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use tokio::sync::broadcast;

use super::runs::read_events;
use super::{ApiError, AppState, resolve};
use crate::api::sse::EventFrame;
use crate::journal::SqliteJournal;

#[derive(Debug, Deserialize)]
pub(super) struct EventsQuery {
    #[serde(default)]
    since: Option<u64>,
}

/// The state of one event stream: backlog first, then live events, de-duplicated by seq.
struct Tail {
    run: RunId,
    last: u64,
    backlog: VecDeque<Event>,
    live: broadcast::Receiver<Event>,
    journal: SqliteJournal,
    /// The run had finished before the stream started: end when the backlog is drained.
    finished_before: bool,
    done: bool,
}

impl Tail {
    async fn next(mut self) -> Option<(Event, Tail)> {
        if self.done {
            return None;
        }
        loop {
            if let Some(e) = self.backlog.pop_front() {
                if e.seq <= self.last {
                    continue;
                }
                self.last = e.seq;
                self.done = matches!(e.kind, EventKind::RunFinished { .. });
                return Some((e, self));
            }
            if self.finished_before {
                return None;
            }
            match self.live.recv().await {
                // A notice (seq 0: not journaled) goes out at once and moves nothing.
                Ok(e) if e.run == self.run && e.seq == 0 => return Some((e, self)),
                Ok(e) if e.run == self.run && e.seq > self.last => self.backlog.push_back(e),
                Ok(_) => {}
                // Too slow to keep up with the live feed: catch up from the journal.
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    self.backlog
                        .extend(self.journal.read(self.run, self.last).await.ok()?);
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

pub(super) async fn events(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let record = resolve(&state, &id).await?;
    let last_event_id = match headers.get(crate::api::sse::LAST_EVENT_ID) {
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "Last-Event-ID must be a journal seq",
                    )
                })?,
        ),
        None => None,
    };
    let after = last_event_id.or(q.since).unwrap_or(0);
    // Subscribe before reading the backlog, so nothing falls between the two.
    let live = state.hub.subscribe();
    let backlog: VecDeque<Event> = read_events(&state, record.id, after).await?.into();
    let tail = Tail {
        run: record.id,
        last: after,
        backlog,
        live,
        journal: state.journal.clone(),
        finished_before: record.outcome.is_some(),
        done: false,
    };
    let stream = futures::stream::unfold(tail, Tail::next)
        .map(|e| {
            let frame = EventFrame::of(&e);
            let sse = SseEvent::default().event(frame.event).data(frame.data);
            Ok(match frame.id {
                Some(id) => sse.id(id),
                None => sse,
            })
        })
        // End streams promptly at shutdown, or graceful shutdown would wait on them.
        .take_until(state.shutdown.clone().cancelled_owned());
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(crate::api::sse::KEEP_ALIVE)))
}
