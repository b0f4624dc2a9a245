//! `GET /v1/runs/{id}/events`: a run's events as server-sent events, backlog from the
//! journal first, then live ones from the hub, de-duplicated by seq; resumable with
//! `Last-Event-ID` or `?since=SEQ`; the stream ends after `run_finished` or at shutdown.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use flotilla_actors::protocol::{Event, EventKind, RunId};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use tokio::sync::broadcast;

use super::runs::read_event_page;
use super::{ApiError, AppState, resolve_listed};
use crate::api::sse::EventFrame;
use crate::journal::SqliteJournal;

#[derive(Debug, Deserialize)]
pub(super) struct EventsQuery {
    #[serde(default)]
    since: Option<u64>,
}

/// Events a replay reads from the journal at a time (ADR-040): a stream holds at most one
/// page of backlog, and reads the next only once the client has taken the last (the socket's
/// backpressure), so ten replays of big runs cost ten pages, not ten journals.
pub(crate) const REPLAY_PAGE: usize = 512;

/// The event streams open at once, and how often the last of them ended (ADR-013): then
/// glibc is asked to give back what they freed ([`give_memory_back`]), so that ten
/// concurrent replays of finished runs do not leave the daemon's resident set above where
/// it was before them.
///
/// [`give_memory_back`]: crate::daemon::supervisor::memory::give_memory_back
pub(crate) struct OpenStreams {
    open: AtomicUsize,
    last_ended: AtomicUsize,
}

/// The daemon's event streams.
pub(crate) static EVENT_STREAMS: OpenStreams = OpenStreams::new();

impl OpenStreams {
    pub(crate) const fn new() -> Self {
        OpenStreams {
            open: AtomicUsize::new(0),
            last_ended: AtomicUsize::new(0),
        }
    }

    /// One more stream, until the guard is dropped.
    pub(crate) fn open(&'static self) -> OpenStream {
        self.open.fetch_add(1, Ordering::AcqRel);
        OpenStream(self)
    }
}

/// A stream counted in [`OpenStreams`] while it lives.
pub(crate) struct OpenStream(&'static OpenStreams);

impl Drop for OpenStream {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        self.0.last_ended.fetch_add(1, Ordering::AcqRel);
        // malloc_trim walks the heap: off the runtime's threads where there is one.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn_blocking(crate::daemon::supervisor::memory::give_memory_back);
            }
            Err(_) => crate::daemon::supervisor::memory::give_memory_back(),
        }
    }
}

/// The state of one event stream: the journal page by page up to its end, then live events,
/// de-duplicated by seq. A notice (seq 0: not journaled) that comes while the stream still
/// reads the journal goes out once it has caught up, or not at all if the run's end comes
/// first: a notice is about now, and the client is not there yet.
pub(crate) struct Tail {
    run: RunId,
    /// The seq of the last event sent (or the one the client resumes after).
    last: u64,
    /// Events read and not yet sent: one page of the journal, or live events.
    backlog: VecDeque<Event>,
    live: broadcast::Receiver<Event>,
    journal: SqliteJournal,
    page: usize,
    /// Still reading the journal: the backlog, or catching up after the live feed lagged.
    paging: bool,
    /// The run had finished before the stream started: end when the journal is read.
    finished_before: bool,
    done: bool,
    /// Counts the stream as open ([`Tail::counted`]).
    _open: Option<OpenStream>,
}

impl Tail {
    /// A stream of `run`'s events after `after`. `live` must have been subscribed before
    /// `first` (the journal's first page after `after`, at most `page` events) was read, so
    /// that nothing falls between the journal and the live feed.
    pub(crate) fn new(
        run: RunId,
        after: u64,
        first: Vec<Event>,
        live: broadcast::Receiver<Event>,
        journal: SqliteJournal,
        page: usize,
        finished_before: bool,
    ) -> Self {
        let page = page.max(1);
        Tail {
            run,
            last: after,
            paging: first.len() >= page,
            backlog: first.into(),
            live,
            journal,
            page,
            finished_before,
            done: false,
            _open: None,
        }
    }

    /// Counted as open until it ends.
    pub(crate) fn counted(mut self, open: OpenStream) -> Self {
        self._open = Some(open);
        self
    }

    pub(crate) fn stream(self) -> impl Stream<Item = Event> {
        futures::stream::unfold(self, Tail::next)
    }

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
            if self.paging {
                // A page that cannot be read ends the stream (a client resuming from its
                // last event learns why).
                let page = self
                    .journal
                    .read_page(self.run, self.last, self.page)
                    .await
                    .ok()?;
                self.paging = page.len() >= self.page;
                self.backlog.extend(page);
                continue;
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
                Err(broadcast::error::RecvError::Lagged(_)) => self.paging = true,
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
    let record = resolve_listed(&state, &id).await?;
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
    // The first page is read here, so that a journal that does not read is the answer's
    // status (a 409), as it was when the whole backlog was read first.
    let first = read_event_page(&state, record.id, after, REPLAY_PAGE).await?;
    let tail = Tail::new(
        record.id,
        after,
        first,
        live,
        state.journal.clone(),
        REPLAY_PAGE,
        record.outcome.is_some(),
    )
    .counted(EVENT_STREAMS.open());
    let stream = tail
        .stream()
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use flotilla_actors::ports::{Journal, SystemClock};
    use flotilla_actors::protocol::{RunOutcome, TaskId};

    use super::*;
    use crate::journal::RunRecord;

    fn ready(n: u32) -> EventKind {
        EventKind::TaskReady {
            task: TaskId::root(n),
        }
    }

    fn finished() -> EventKind {
        EventKind::RunFinished {
            outcome: RunOutcome::Completed,
            reason: None,
        }
    }

    async fn journal_with_run() -> (tempfile::TempDir, SqliteJournal, RunId) {
        let dir = tempfile::tempdir().unwrap();
        let journal =
            SqliteJournal::open(&dir.path().join("j.sqlite"), Arc::new(SystemClock)).unwrap();
        let run = RunId::generate();
        journal
            .create_run(RunRecord {
                id: run,
                request: "r".into(),
                repo: "/tmp".into(),
                config: serde_json::json!({}),
                created_ms: 0,
                outcome: None,
            })
            .await
            .unwrap();
        (dir, journal, run)
    }

    /// Journals `kinds` and publishes them, as the supervisor does (after the commit).
    async fn journal_and_publish(
        journal: &SqliteJournal,
        hub: &broadcast::Sender<Event>,
        run: RunId,
        kinds: Vec<EventKind>,
    ) {
        for event in journal.append(run, kinds).await.unwrap() {
            let _ = hub.send(event);
        }
    }

    /// A finished run's replay, in pages of every size around its length and from any
    /// point, is exactly its journal after that point, in order.
    #[tokio::test]
    async fn memory_is_given_back_once_the_last_open_stream_ends() {
        static STREAMS: OpenStreams = OpenStreams::new();
        let (_dir, journal, run) = journal_with_run().await;
        let tail = || {
            let (hub, _) = tokio::sync::broadcast::channel(4);
            Tail::new(
                run,
                0,
                Vec::new(),
                hub.subscribe(),
                journal.clone(),
                4,
                true,
            )
            .counted(STREAMS.open())
        };
        let (first, second) = (tail(), tail());
        let ended = || STREAMS.last_ended.load(Ordering::Acquire);
        let _: Vec<Event> = first.stream().collect().await;
        assert_eq!(ended(), 0, "another stream is still open");
        drop(second);
        assert_eq!(ended(), 1);
        assert_eq!(STREAMS.open.load(Ordering::Acquire), 0);
    }

    #[tokio::test]
    async fn a_paged_replay_of_a_finished_run_is_exactly_its_journal() {
        let (_dir, journal, run) = journal_with_run().await;
        let mut kinds: Vec<EventKind> = (1..=8).map(ready).collect();
        kinds.push(finished());
        journal.append(run, kinds).await.unwrap();
        let whole = journal.read(run, 0).await.unwrap();
        assert_eq!(whole.len(), 10);
        for page in 1..=12 {
            for after in [0, whole[2].seq, whole[9].seq] {
                let (_hub, live) = broadcast::channel(4);
                let first = journal.read_page(run, after, page).await.unwrap();
                let tail = Tail::new(run, after, first, live, journal.clone(), page, true);
                let got: Vec<Event> = tail.stream().collect().await;
                let expected: Vec<Event> =
                    whole.iter().filter(|e| e.seq > after).cloned().collect();
                assert_eq!(got, expected, "pages of {page} after #{after}");
            }
        }
    }

    /// Following a running run: what was journaled before the stream, what is journaled
    /// while it reads its pages, and what comes after, each exactly once and in order; an
    /// event journaled before the stream subscribed but published after it did is not
    /// repeated; a notice goes out as it comes once the stream has caught up.
    #[tokio::test]
    async fn a_followed_run_gets_each_event_once_across_the_live_boundary() {
        for page in [1, 2, 3, 5, 64] {
            let (_dir, journal, run) = journal_with_run().await;
            let (hub, _) = broadcast::channel(64);
            journal_and_publish(&journal, &hub, run, (1..=6).map(ready).collect()).await;
            let raced = journal.append(run, vec![ready(50)]).await.unwrap();
            let live = hub.subscribe();
            for event in raced {
                hub.send(event).unwrap();
            }
            let first = journal.read_page(run, 0, page).await.unwrap();
            let tail = Tail::new(run, 0, first, live, journal.clone(), page, false);
            let mut stream = Box::pin(tail.stream());
            let mut got = vec![stream.next().await.unwrap(), stream.next().await.unwrap()];
            journal_and_publish(&journal, &hub, run, (60..64).map(ready).collect()).await;
            // Everything journaled so far: 1 + 6 + 1 + 4 events.
            while got.len() < 12 {
                got.push(stream.next().await.unwrap());
            }
            // Caught up: what comes now comes from the live feed, notices too; another
            // run's events are not this stream's.
            hub.send(Event {
                run: RunId::generate(),
                ..got[3].clone()
            })
            .unwrap();
            let notice = Event {
                seq: 0,
                run,
                at_ms: 0,
                kind: EventKind::PlanningFinished,
            };
            hub.send(notice.clone()).unwrap();
            assert_eq!(stream.next().await.unwrap(), notice, "pages of {page}");
            journal_and_publish(&journal, &hub, run, vec![ready(70), finished()]).await;
            got.extend(stream.collect::<Vec<_>>().await);
            assert_eq!(got, journal.read(run, 0).await.unwrap(), "pages of {page}");
        }
    }

    /// A stream too slow for the live feed catches up from the journal, page by page,
    /// losing and repeating nothing.
    #[tokio::test]
    async fn a_stream_that_lags_behind_the_live_feed_catches_up_from_the_journal() {
        let (_dir, journal, run) = journal_with_run().await;
        let (hub, live) = broadcast::channel(2);
        let first = journal.read_page(run, 0, 3).await.unwrap();
        let tail = Tail::new(run, 0, first, live, journal.clone(), 3, false);
        let mut stream = Box::pin(tail.stream());
        let mut got = vec![stream.next().await.unwrap()];
        journal_and_publish(&journal, &hub, run, (1..=10).map(ready).collect()).await;
        journal_and_publish(&journal, &hub, run, vec![finished()]).await;
        got.extend(stream.collect::<Vec<_>>().await);
        assert_eq!(got, journal.read(run, 0).await.unwrap());
    }
}
