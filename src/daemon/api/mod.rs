//! The HTTP+JSON API (axum). Every error is a JSON body `{"error": "..."}` with a fitting
//! status; bodies are capped; nothing here panics on bad input.
//!
//! - `POST /v1/runs` `{request, repo, config?}` → 201 `{id}`
//! - `GET  /v1/runs` → the runs, oldest first
//! - `GET  /v1/runs/{id}` → state, task tree, budgets spent, tokens, cost
//! - `GET  /v1/runs/{id}/events` → server-sent events, `id:` = journal seq; resumable with
//!   `Last-Event-ID` or `?since=SEQ`; the stream ends after `run_finished`
//! - `POST /v1/runs/{id}/cancel` → 202
//! - `GET  /v1/runs/{id}/graph?format=json|dot|mermaid`
//! - `GET  /v1/runs/{id}/report` → the run's report (`run_report.rs`)
//! - `POST /v1/runs/{id}/tasks/{task}/decision` `{"decision": "accept", "subtask": "t4.2"}`
//!   (or `complete`, `fail`) → 202: a human's answer for a task whose subplan stops on
//!   `user_decision`
//! - `POST /v1/runs/{id}/decision` `{"decision": "adopt_main"}` → 202: landing paused
//!   because main diverged; main as it is becomes the base (ADR-024)
//! - `GET  /v1/runs/{id}/tasks/{task}/transcript?attempt=N&from=OFFSET&wait=true` → an
//!   attempt's transcript (`transcripts.rs`; `wait` holds an empty answer: a long poll)
//! - `POST /v1/ui` → a one-time link to the live page, `GET /ui/…` the page (`page.rs`)
//!
//! `{id}` may be any unique prefix of a run id; an ambiguous prefix is a 409 that lists the
//! runs it matches.
//!
//! `POST /v1/runs` is idempotent: a request carrying an `Idempotency-Key` header that an
//! earlier request already carried gets that request's run (200) instead of a new one; a
//! key that came with a different request (by its fingerprint) is refused with a 422.
//!
//! [`serve`] runs the server itself, with a cap on concurrent connections and a timeout for
//! reading a request's head (which also closes idle keep-alive connections); a connection
//! past the cap gets a 503. An event stream is not idle: it is an answer being written.
//!
//! The handlers are in `runs.rs` (create, list, status, cancel, gc), `tasks.rs` (a task's
//! story, decisions, graph exports) and `events.rs` (the event stream); the wire types in
//! `crate::api`. Must not know the CLI, its client or its rendering.
//!
//! Also: bearer auth, run-id prefixes, notices streamed without an `id:`. [`serve`] is the
//! HTTP server with `ServerLimits` (connection cap, header-read and body timeouts); when full
//! it evicts the oldest connection that never authenticated.

mod events;
pub mod page;
mod run_report;
mod runs;
mod tasks;
mod transcripts;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use flotilla_actors::ports::JournalError;
use flotilla_actors::protocol::{Event, RunId};
use tokio::sync::{Semaphore, broadcast};
use tokio_util::sync::CancellationToken;

use super::report;
use super::supervisor::Supervisor;
use crate::config::RunConfig;
use crate::journal::{RunRecord, SqliteJournal};

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Largest oversize body read (and dropped) before its 413, so that the client, still
/// writing, can read the answer; a larger one is answered at once.
pub const MAX_DRAINED_BODY_BYTES: u64 = 16 * 1024 * 1024;
/// Largest request text accepted.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// Longest request target (path and query) accepted; longer ones get a 414.
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// Longest idempotency key accepted.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 128;

/// Limits on the connections the server holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections served at once; the next ones get a 503 and are closed.
    pub max_connections: usize,
    /// How long a client may take to send a request's head, counted from when the server
    /// starts waiting for it: a connection that sends nothing (new or kept alive) is closed
    /// after this long.
    pub header_read_timeout: Duration,
    /// How long a client may take to send a request's body, once its head arrived.
    pub body_read_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 256,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
        }
    }
}

/// [`ServerLimits::body_read_timeout`], as a request extension for the body extractor.
#[derive(Debug, Clone, Copy)]
struct BodyReadTimeout(Duration);

#[derive(Clone)]
pub struct AppState {
    pub journal: SqliteJournal,
    pub supervisor: Addr<Supervisor>,
    pub hub: broadcast::Sender<Event>,
    pub shutdown: CancellationToken,
    /// Required bearer token (TCP only; the Unix socket is protected by file permissions).
    pub token: Option<Arc<String>>,
    /// Status replays of running runs, carried from one status call to the next.
    pub status_replays: StatusReplays,
    /// The live page's one-time codes and listener (`page.rs`).
    pub page: page::PageState,
    /// Attempts' transcripts (`flotilla log`), when the writer could start.
    pub transcripts: Option<crate::daemon::transcripts::TranscriptStore>,
    /// The runs' state directories (where `status` reads the warm trees' notes, ADR-042).
    pub worktrees: std::path::PathBuf,
}

/// The status replays of running runs, kept between status calls so that polling a run
/// applies only its new events (`report::StatusReplay`). Bounded: at most
/// [`MAX_STATUS_REPLAYS`] runs; a replay not asked for in [`STATUS_REPLAY_IDLE`] goes, and
/// one whose run has ended is never kept, so a finished run leaves nothing here.
#[derive(Clone, Default)]
pub struct StatusReplays(
    Arc<std::sync::Mutex<HashMap<RunId, (std::time::Instant, report::StatusReplay)>>>,
);

pub const MAX_STATUS_REPLAYS: usize = 16;
pub const STATUS_REPLAY_IDLE: Duration = Duration::from_secs(60);

impl StatusReplays {
    /// The run's replay so far, taken out (a concurrent call for the same run starts
    /// afresh, which is slower, never wrong).
    fn take(&self, run: RunId) -> Option<report::StatusReplay> {
        let mut replays = self.0.lock().unwrap_or_else(|e| e.into_inner());
        replays.remove(&run).map(|(_, replay)| replay)
    }

    /// Keeps an open replay for the next call, dropping replays left idle.
    fn keep(&self, run: RunId, replay: report::StatusReplay) {
        if !replay.is_open() {
            return;
        }
        let mut replays = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        replays.retain(|_, (used, _)| now.duration_since(*used) < STATUS_REPLAY_IDLE);
        if replays.len() < MAX_STATUS_REPLAYS {
            replays.insert(run, (now, replay));
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/runs", post(runs::create_run).get(runs::list_runs))
        .route("/v1/runs/{id}", get(runs::show_run))
        .route("/v1/runs/{id}/events", get(events::events))
        .route("/v1/runs/{id}/cancel", post(runs::cancel_run))
        .route("/v1/runs/{id}/decision", post(tasks::decide_run))
        .route("/v1/runs/{id}/graph", get(tasks::graph))
        .route("/v1/runs/{id}/report", get(run_report::show_report))
        .route("/v1/runs/{id}/tasks/{task}", get(tasks::task_story))
        .route("/v1/runs/{id}/tasks/{task}/decision", post(tasks::decide))
        .route(
            "/v1/runs/{id}/tasks/{task}/transcript",
            get(transcripts::transcript),
        )
        .route("/v1/gc", post(runs::collect_garbage))
        .merge(page::routes())
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "no such endpoint; see `flotilla --help`",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .layer(middleware::from_fn(json_errors))
        .with_state(state)
}

/// Serves `app` on `listener` until `shutdown`, then lets open connections finish (event
/// streams end at shutdown by themselves). At most `limits.max_connections` connections
/// are served at once; the next ones get a 503, and beyond a small margin are closed at
/// once, so that no number of clients can exhaust the daemon's file descriptors.
pub async fn serve<L: axum::serve::Listener>(
    mut listener: L,
    app: Router,
    limits: ServerLimits,
    shutdown: CancellationToken,
) {
    let max = limits.max_connections.max(1);
    let slots = Arc::new(Semaphore::new(max));
    // Connections being told "busy": each lives a second at most.
    let refusals = Arc::new(Semaphore::new(max.div_ceil(4).max(16)));
    let unproven = Unproven::default();
    let app = app.layer(axum::Extension(BodyReadTimeout(limits.body_read_timeout)));
    let service = hyper_util::service::TowerToHyperService::new(app);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let mut next_id = 0u64;
    loop {
        let (io, _) = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.cancelled() => break,
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => Some(slot),
            // Full: a connection that never presented the token makes room, oldest first,
            // so that holding connections open without it cannot lock real clients out.
            Err(_) if unproven.evict_oldest() => {
                tokio::time::timeout(EVICTION_WAIT, slots.clone().acquire_owned())
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
            Err(_) => None,
        };
        let Some(slot) = slot else {
            if let Ok(permit) = refusals.clone().try_acquire_owned() {
                tokio::spawn(async move {
                    refuse_busy(io).await;
                    drop(permit);
                });
            }
            continue;
        };
        next_id += 1;
        let proof = unproven.admit(next_id);
        let evicted = proof.evicted.clone();
        let per_connection = {
            let service = service.clone();
            let proof = proof.clone();
            hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(proof.clone());
                hyper::service::Service::call(&service, req)
            })
        };
        let connection = http.serve_connection(hyper_util::rt::TokioIo::new(io), per_connection);
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                // Dropping the connection closes it.
                _ = evicted.cancelled() => {}
                _ = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            proof.forget();
            drop(slot);
        });
    }
    // Every connection holds a slot until it ends: having them all back means all ended.
    let _ = slots.acquire_many(max as u32).await;
}

/// How long a new connection waits for an evicted one's slot.
const EVICTION_WAIT: Duration = Duration::from_millis(500);

/// Connections that have not yet made a request that passed authentication (on the Unix
/// socket, any request does), oldest first: when the server is full, they are the ones
/// closed to make room.
#[derive(Clone, Default)]
struct Unproven(Arc<std::sync::Mutex<std::collections::BTreeMap<u64, CancellationToken>>>);

impl Unproven {
    fn admit(&self, id: u64) -> ConnectionProof {
        let evicted = CancellationToken::new();
        if let Ok(mut waiting) = self.0.lock() {
            waiting.insert(id, evicted.clone());
        }
        ConnectionProof {
            id,
            evicted,
            unproven: self.clone(),
        }
    }

    /// Closes the oldest unproven connection; false if there is none.
    fn evict_oldest(&self) -> bool {
        let oldest = self.0.lock().ok().and_then(|mut w| w.pop_first());
        match oldest {
            Some((_, evicted)) => {
                evicted.cancel();
                true
            }
            None => false,
        }
    }
}

/// A connection's standing, carried in each of its requests: `authenticate` proves it.
#[derive(Clone)]
struct ConnectionProof {
    id: u64,
    evicted: CancellationToken,
    unproven: Unproven,
}

impl ConnectionProof {
    /// The connection presented the token (or needed none): it is no longer evictable.
    fn prove(&self) {
        self.forget();
    }

    fn forget(&self) {
        if let Ok(mut waiting) = self.unproven.0.lock() {
            waiting.remove(&self.id);
        }
    }
}

/// Answers a connection past the cap with a 503 and closes it, reading (and dropping) what
/// the client sent meanwhile so that the close does not reset the answer away.
async fn refuse_busy<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut io: S) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const BODY: &str =
        r#"{"error":"the daemon is serving too many connections; try again shortly"}"#;
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        io.write_all(answer.as_bytes()).await?;
        io.shutdown().await?;
        let mut sink = [0u8; 4096];
        while io.read(&mut sink).await? > 0 {}
        Ok::<(), std::io::Error>(())
    })
    .await;
}

/// Makes every error answer JSON `{"error": "..."}`, including the ones axum and its
/// extractors produce as plain text or with no body (404, 405, a bad path or query), and
/// refuses over-long request targets with a 414.
async fn json_errors(req: Request, next: Next) -> Response {
    let target_len = req.uri().path_and_query().map_or(0, |pq| pq.as_str().len());
    if target_len > MAX_URI_BYTES {
        return ApiError::new(
            StatusCode::URI_TOO_LONG,
            format!("the request target is {target_len} bytes; at most {MAX_URI_BYTES}"),
        )
        .into_response();
    }
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let response = next.run(req).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    // Rejection texts are short; anything else is cut off rather than buffered.
    let text = match axum::body::to_bytes(response.into_body(), 4096).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_string(),
        Err(_) => String::new(),
    };
    let message = match status {
        StatusCode::METHOD_NOT_ALLOWED => format!("{method} is not allowed on {path}"),
        _ if text.is_empty() => status
            .canonical_reason()
            .unwrap_or("request failed")
            .to_lowercase(),
        _ => text,
    };
    ApiError::new(status, message).into_response()
}

/// An API error: a status and a message for humans.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(serde_json::json!({ "error": self.message })),
        )
            .into_response()
    }
}

impl From<JournalError> for ApiError {
    fn from(e: JournalError) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("journal: {e}"))
    }
}

/// `Json` whose rejections (malformed, wrong type, too large) use the API's error body.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T> FromRequest<S> for ApiJson<T>
where
    Json<T>: FromRequest<S, Rejection = JsonRejection>,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // A body sent slowly, or never finished, must not hold its connection slot forever.
        let limit = req
            .extensions()
            .get::<BodyReadTimeout>()
            .map_or(ServerLimits::default().body_read_timeout, |t| t.0);
        if let Some(declared) = declared_length(&req).filter(|&n| n > MAX_BODY_BYTES as u64) {
            // Answering before the body is read makes the server close a connection the
            // client is still writing to: the client sees a broken pipe instead of the 413.
            // Reading (and dropping) the rest first lets it read the answer; bounded in
            // bytes and time, so an endless body costs no more than a slow one.
            if declared <= MAX_DRAINED_BODY_BYTES {
                let _ = tokio::time::timeout(limit, drain(req.into_body())).await;
            }
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is {declared} bytes; at most {MAX_BODY_BYTES}"),
            ));
        }
        match tokio::time::timeout(limit, Json::<T>::from_request(req, state)).await {
            Ok(Ok(Json(value))) => Ok(ApiJson(value)),
            Ok(Err(rejection)) => Err(ApiError::new(rejection.status(), rejection.body_text())),
            Err(_) => Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s",
                    limit.as_secs_f32()
                ),
            )),
        }
    }
}

/// The body length a request declares (`Content-Length`), if it declares one.
fn declared_length(req: &Request) -> Option<u64> {
    req.headers()
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Reads a body to its end (at most [`MAX_DRAINED_BODY_BYTES`]) and drops it.
async fn drain(body: axum::body::Body) {
    use http_body_util::BodyExt;
    let mut body = body;
    let mut read: u64 = 0;
    while let Some(Ok(frame)) = body.frame().await {
        read = read.saturating_add(frame.data_ref().map_or(0, |d| d.len() as u64));
        if read > MAX_DRAINED_BODY_BYTES {
            return;
        }
    }
}

async fn authenticate(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let proven = match &state.token {
        None => true,
        Some(expected) => {
            let presented = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .unwrap_or("");
            // Or the live page's session cookie, for reads only.
            constant_time_eq(presented.as_bytes(), expected.as_bytes())
                || page::admits(&req, expected)
        }
    };
    if !proven && !page::is_open(&req) {
        return ApiError::new(StatusCode::UNAUTHORIZED, "missing or wrong bearer token")
            .into_response();
    }
    if let Some(proof) = req.extensions().get::<ConnectionProof>().filter(|_| proven) {
        proof.prove();
    }
    next.run(req).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    // The length is no secret (every token is 64 hex digits); the bytes are compared in
    // constant time.
    subtle::ConstantTimeEq::ct_eq(a, b).into()
}

/// Finds the run `raw` names: a full id or a unique prefix; with its config.
pub(super) async fn resolve(state: &AppState, raw: &str) -> Result<RunRecord, ApiError> {
    let listed = resolve_listed(state, raw).await?;
    with_config(state, listed).await
}

/// A run as listed, read again with its config.
pub(super) async fn with_config(
    state: &AppState,
    listed: RunRecord,
) -> Result<RunRecord, ApiError> {
    state
        .journal
        .run(listed.id)
        .await?
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("no run {}", listed.id)))
}

/// Finds the run `raw` names, as [`resolve`] does, without reading its config (`Null`): a
/// big run's config holds its whole scenario, and a replay or a stored status need none.
pub(super) async fn resolve_listed(state: &AppState, raw: &str) -> Result<RunRecord, ApiError> {
    let wanted = raw.trim().to_ascii_lowercase();
    // At least one hex digit: "---" would otherwise match every run once dashes are gone.
    if !wanted.chars().any(|c| c.is_ascii_hexdigit())
        || wanted.len() > 36
        || !wanted.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
    {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{raw:?} is not a run id or id prefix"),
        ));
    }
    let runs = state.journal.run_list().await?;
    let compact = wanted.replace('-', "");
    let mut matches: Vec<RunRecord> = runs
        .into_iter()
        .filter(|r| {
            let full = r.id.to_string();
            full.starts_with(&wanted) || full.replace('-', "").starts_with(&compact)
        })
        .collect();
    match matches.len() {
        1 => Ok(matches.remove(0)),
        0 => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no run matches {raw:?}"),
        )),
        n => {
            const SHOWN: usize = 10;
            let mut candidates: Vec<String> = matches
                .iter()
                .take(SHOWN)
                .map(|r| r.id.to_string())
                .collect();
            if n > SHOWN {
                candidates.push(format!("and {} more", n - SHOWN));
            }
            Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "{raw:?} matches {n} runs: {}; give more of the id",
                    candidates.join(", ")
                ),
            ))
        }
    }
}

pub(super) fn run_config(record: &RunRecord) -> Result<RunConfig, ApiError> {
    serde_json::from_value(record.config.clone()).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("run {}: stored config unreadable: {e}", record.id),
        )
    })
}

#[cfg(test)]
mod tests {
    use flotilla_actors::config::Limits;
    use flotilla_actors::graph::RunGraph;

    use super::*;

    fn finished_replay() -> report::StatusReplay {
        let mut graph = RunGraph::new(Limits::default());
        let events = report::journaled(RunId::generate(), graph.planning_finished().unwrap());
        let mut replay = report::StatusReplay::new(Limits::default());
        replay.apply(&events);
        replay
    }

    #[test]
    fn status_replays_keep_only_open_runs_at_most_sixteen_and_hand_each_out_once() {
        let replays = StatusReplays::default();
        let run = RunId::generate();
        replays.keep(run, report::StatusReplay::new(Limits::default()));
        assert_eq!(replays.len(), 1);
        assert!(replays.take(run).is_some());
        assert!(
            replays.take(run).is_none(),
            "taken out: a second call starts afresh"
        );

        let finished = finished_replay();
        assert!(
            !finished.is_open(),
            "planning finished with no task: the run ended"
        );
        replays.keep(RunId::generate(), finished);
        assert_eq!(replays.len(), 0, "a finished run's replay is never kept");

        for _ in 0..MAX_STATUS_REPLAYS + 4 {
            replays.keep(
                RunId::generate(),
                report::StatusReplay::new(Limits::default()),
            );
        }
        assert_eq!(replays.len(), MAX_STATUS_REPLAYS);
    }
}
