//! How a run's events travel (`GET /v1/runs/{id}/events`): server-sent events whose `event:`
//! is the event kind's name, whose `data:` is the [`Event`] as JSON, and whose `id:` is its
//! journal seq, so that a client resumes with `Last-Event-ID`. Notices (seq 0, not in the
//! journal) carry no `id:`. The daemon sends a keep-alive comment every [`KEEP_ALIVE`].

use std::time::Duration;

use flotilla_actors::protocol::Event;

/// How often an event stream sends a keep-alive comment, so that clients can tell a quiet
/// run from a dead daemon.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The header naming the last journal seq a client has seen; the stream starts after it.
pub const LAST_EVENT_ID: &str = "last-event-id";

/// The most bytes one event may hold (its JSON), beyond which a client breaks the stream
/// off: the daemon's largest events (a plan, a handoff) are far smaller.
pub const MAX_EVENT_BYTES: usize = 64 * 1024 * 1024;

/// One event as the fields of its SSE frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventFrame {
    pub event: &'static str,
    pub data: String,
    /// The journal seq; none for a notice, so that `Last-Event-ID` only ever names seqs.
    pub id: Option<String>,
}

impl EventFrame {
    pub fn of(event: &Event) -> EventFrame {
        EventFrame {
            event: event.kind.name(),
            data: serde_json::to_string(event).unwrap_or_else(|_| "{}".into()),
            id: (event.seq > 0).then(|| event.seq.to_string()),
        }
    }

    /// The event a frame's `data:` carries.
    pub fn parse(data: &str) -> Result<Event, serde_json::Error> {
        serde_json::from_str(data)
    }
}
