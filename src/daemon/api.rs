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
//! - `POST /v1/runs/{id}/tasks/{task}/decision` `{"decision": "accept", "subtask": "t4.2"}`
//!   (or `complete`, `fail`) → 202: a human's answer for a task whose subplan stops on
//!   `user_decision`
//! - `POST /v1/runs/{id}/decision` `{"decision": "adopt_main"}` → 202: landing paused
//!   because main diverged; main as it is becomes the base (ADR-024)
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
//! Also: bearer auth, run-id prefixes, notices streamed without an `id:`. [`serve`] is the
//! HTTP server with `ServerLimits` (connection cap, header-read and body timeouts); when full
//! it evicts the oldest connection that never authenticated.

use crate::sandbox::SandboxPolicy;
use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use flotilla_actors::ports::{Journal, JournalError};
use flotilla_actors::protocol::{Event, EventKind, RunId, TaskId, TaskState, UserDecision};
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, broadcast};
use tokio_util::sync::CancellationToken;

use super::report;
use super::supervisor::{
    AdoptMain, CancelAnswer, CancelRun, CollectGarbage, DecideTask, GcReport, RunProblem,
    RunProblems, StartRun, Supervisor,
};
use crate::client::IDEMPOTENCY_KEY;
use crate::config::RunConfig;
use crate::journal::{RunRecord, SqliteJournal, SubmitKey, SubmitOutcome};

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
/// How often an event stream sends a keep-alive comment, so that clients can tell a quiet
/// run from a dead daemon.
pub const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

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
        .route("/v1/runs", post(create_run).get(list_runs))
        .route("/v1/runs/{id}", get(show_run))
        .route("/v1/runs/{id}/events", get(events))
        .route("/v1/runs/{id}/cancel", post(cancel_run))
        .route("/v1/runs/{id}/decision", post(decide_run))
        .route("/v1/runs/{id}/graph", get(graph))
        .route("/v1/runs/{id}/tasks/{task}", get(task_story))
        .route("/v1/runs/{id}/tasks/{task}/decision", post(decide))
        .route("/v1/gc", post(collect_garbage))
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
    if let Some(expected) = &state.token {
        let presented = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !constant_time_eq(presented.as_bytes(), expected.as_bytes()) {
            return ApiError::new(StatusCode::UNAUTHORIZED, "missing or wrong bearer token")
                .into_response();
        }
    }
    if let Some(proof) = req.extensions().get::<ConnectionProof>() {
        proof.prove();
    }
    next.run(req).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    // The length is no secret (every token is 64 hex digits); the bytes are compared in
    // constant time.
    subtle::ConstantTimeEq::ct_eq(a, b).into()
}

/// Finds the run `raw` names: a full id or a unique prefix.
async fn resolve(state: &AppState, raw: &str) -> Result<RunRecord, ApiError> {
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
        // The one match, read again with its config (the listing leaves configs out).
        1 => state
            .journal
            .run(matches.remove(0).id)
            .await?
            .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("no run matches {raw:?}"))),
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

fn run_config(record: &RunRecord) -> Result<RunConfig, ApiError> {
    serde_json::from_value(record.config.clone()).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("run {}: stored config unreadable: {e}", record.id),
        )
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRun {
    pub request: String,
    pub repo: PathBuf,
    #[serde(default)]
    pub config: Option<RunConfig>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Created {
    pub id: String,
    /// The branch the run lands on (ADR-022); absent from a daemon before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
}

fn unprocessable(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, message)
}

/// A stable fingerprint of a submission: FNV-1a (64 bits) of its canonical JSON (serde_json
/// sorts object keys), so that a retry of the same request matches whatever the whitespace
/// or key order, and the value does not change between daemon builds (std's hasher may).
fn request_fingerprint(body: &CreateRun) -> String {
    let canonical = serde_json::json!({
        "request": body.request, "repo": body.repo, "config": body.config,
    })
    .to_string();
    let hash = canonical.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")
}

/// The submission's idempotency key, if it sent one.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    let key = value.to_str().unwrap_or("").trim();
    if key.is_empty()
        || key.len() > MAX_IDEMPOTENCY_KEY_BYTES
        || !key.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "the Idempotency-Key header must be 1 to {MAX_IDEMPOTENCY_KEY_BYTES} visible ASCII characters"
            ),
        ));
    }
    Ok(Some(key.to_string()))
}

async fn create_run(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<CreateRun>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?.map(|key| SubmitKey {
        key,
        fingerprint: request_fingerprint(&body),
    });
    let request = body.request.trim().to_string();
    if request.is_empty() {
        return Err(unprocessable("the request is empty"));
    }
    if request.len() > MAX_REQUEST_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request is {} bytes; at most {MAX_REQUEST_BYTES}",
                request.len()
            ),
        ));
    }
    if !body.repo.is_absolute() {
        return Err(unprocessable(format!(
            "repo {:?} must be an absolute path",
            body.repo
        )));
    }
    let repo = body.repo.clone();
    let config = body.config;
    // git2 and file reads block: off the runtime's thread.
    let (repo, config) =
        tokio::task::spawn_blocking(move || -> Result<(PathBuf, RunConfig), ApiError> {
            let opened = git2::Repository::open(&repo).map_err(|e| {
                unprocessable(format!(
                    "{} is not a git repository: {}",
                    repo.display(),
                    e.message()
                ))
            })?;
            let root = opened.workdir().map(|p| p.to_path_buf()).unwrap_or(repo);
            let mut config = match config {
                Some(c) => c,
                None => RunConfig::load(&root.join("flotilla.toml"))
                    .map_err(|e| unprocessable(e.to_string()))?,
            };
            // A config sent in the body skipped RunConfig::load's checks: impossible limits
            // (no workers, no nodes) would leave the run hanging.
            config
                .validate()
                .map_err(|e| unprocessable(e.to_string()))?;
            // The branch work lands on, picked once (ADR-022): every task branch starts
            // from its tip, so it must have one. Journaled with the config, so a restart
            // lands on the same branch whatever HEAD names by then.
            let target = crate::git_repo::resolve_target(&opened, config.merge.branch.as_deref())
                .map_err(|e| unprocessable(format!("{}: {e}", root.display())))?;
            config.merge.branch = Some(target.name().to_string());
            // The daemon's PATH is the one its agents' commands are found on.
            let path = std::env::var_os("PATH");
            if let Some(missing) = config.missing_programs(path.as_deref(), &root).first() {
                return Err(unprocessable(missing.to_string()));
            }
            Ok((root, config))
        })
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;

    // No run is created where its commands could not be sandboxed: the error says what to
    // install, or how to turn the sandbox off on purpose (ADR-015).
    let sandbox = crate::process::probe(&SandboxPolicy::for_run(&config.sandbox, &[], &repo))
        .await
        .map_err(|e| unprocessable(e.to_string()))?;

    let id = RunId::generate();
    let branch = config.merge.branch.clone();
    let record = RunRecord {
        id,
        request: request.clone(),
        repo: repo.clone(),
        config: serde_json::to_value(&config).map_err(|e| unprocessable(e.to_string()))?,
        created_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        outcome: None,
    };
    let started = match state
        .journal
        .create_run_once(record, key, Some(sandbox))
        .await?
    {
        SubmitOutcome::Created(started) => *started,
        // A retry of a submission whose answer was lost: the run exists (and runs, or was
        // resumed at start-up); answer with it rather than start a second one.
        SubmitOutcome::Existing(existing) => {
            return Ok((
                StatusCode::OK,
                Json(Created {
                    id: existing.to_string(),
                    // The run as it was submitted then: its status says its branch.
                    branch: None,
                }),
            )
                .into_response());
        }
        SubmitOutcome::KeyReused(earlier) => {
            return Err(unprocessable(format!(
                "the Idempotency-Key was already used for a different request (run {earlier}); \
                 a new request needs a new key"
            )));
        }
    };
    let _ = state.hub.send(started.clone());
    state
        .supervisor
        .send(StartRun {
            run: id,
            request,
            repo,
            config,
            journal: vec![started],
        })
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the daemon is shutting down: {e}"),
            )
        })?
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e))?;
    Ok((
        StatusCode::CREATED,
        Json(Created {
            id: id.to_string(),
            branch,
        }),
    )
        .into_response())
}

#[derive(Debug, Serialize, Deserialize)]
pub struct RunSummary {
    pub id: String,
    pub request: String,
    pub repo: String,
    pub created_ms: u64,
    /// `running`, `damaged`, or the outcome.
    pub state: String,
    /// What is wrong with the run right now (damaged, paused on the journal, restarting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// The supervisor's view of what is wrong with each run (damaged, paused, restarting).
async fn problems(state: &AppState) -> HashMap<RunId, RunProblem> {
    state.supervisor.send(RunProblems).await.unwrap_or_default()
}

async fn list_runs(State(state): State<AppState>) -> Result<Json<Vec<RunSummary>>, ApiError> {
    let runs = state.journal.run_list().await?;
    let mut problems = problems(&state).await;
    Ok(Json(
        runs.into_iter()
            .map(|r| {
                let problem = problems.remove(&r.id).filter(|_| r.outcome.is_none());
                let damaged = problem.as_ref().is_some_and(RunProblem::is_damage);
                RunSummary {
                    id: r.id.to_string(),
                    request: r.request,
                    repo: r.repo.to_string_lossy().into_owned(),
                    created_ms: r.created_ms,
                    state: if damaged {
                        "damaged".into()
                    } else {
                        report::state_name(r.outcome).into()
                    },
                    problem: problem.map(|p| p.to_string()),
                }
            })
            .collect(),
    ))
}

async fn run_status(state: &AppState, id: &str) -> Result<report::RunStatus, ApiError> {
    let record = resolve(state, id).await?;
    let problem = problems(state).await.remove(&record.id);
    // A running run's replay continues from the last status call: only newer events are
    // read and applied.
    let run = record.id;
    let limits = run_config(&record).map(|c| c.limits).unwrap_or_default();
    let replay = state
        .status_replays
        .take(record.id)
        .unwrap_or_else(|| report::StatusReplay::new(limits));
    // A journal with an unreadable row still gives a status: the run is damaged, and shows
    // no graph (the read stops at the bad row and hands back none of it).
    let (events, unreadable) = match state.journal.read(record.id, replay.last_seq()).await {
        Ok(events) => (events, None),
        Err(e) => (Vec::new(), Some(format!("damaged: {e}"))),
    };
    let (replay, mut status) = if unreadable.is_some() {
        let empty = report::StatusReplay::new(flotilla_actors::config::Limits::default());
        let status = empty.status(&record);
        (None, status)
    } else {
        let (replay, status) = tokio::task::spawn_blocking(move || {
            let mut replay = replay;
            replay.apply(&events);
            let status = replay.status(&record);
            (replay, status)
        })
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        (Some(replay), status)
    };
    // (An unreadable journal gives no replay: the one taken out above is not put back.)
    if let Some(replay) = replay {
        state.status_replays.keep(run, replay);
    }
    if let Some(damage) = unreadable {
        status.mark_damaged(damage);
    } else if let Some(problem) = problem.filter(|_| status.outcome_is_open()) {
        // The supervisor's word: damaged (e.g. its stored config is unreadable), or paused.
        if problem.is_damage() {
            status.mark_damaged(problem.to_string());
        } else {
            status.problem = status.problem.or(Some(problem.to_string()));
        }
    }
    Ok(status)
}

/// A run's events after `after`. An unreadable row makes the run damaged: a 409 that says
/// so (status still shows the run), not a 500.
async fn read_events(state: &AppState, run: RunId, after: u64) -> Result<Vec<Event>, ApiError> {
    state.journal.read(run, after).await.map_err(|e| match e {
        JournalError::Corrupt { .. } => ApiError::new(
            StatusCode::CONFLICT,
            format!("run {run} is damaged: {e}; `flotilla status {run}` shows what is known"),
        ),
        other => other.into(),
    })
}

/// The run `raw` names, if it has not finished: a decision or a cancel for a finished run is
/// a 409 that says how it ended.
async fn unfinished(state: &AppState, raw: &str) -> Result<RunRecord, ApiError> {
    let record = resolve(state, raw).await?;
    match record.outcome {
        Some(outcome) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "run {} already finished ({})",
                record.id,
                report::state_name(Some(outcome))
            ),
        )),
        None => Ok(record),
    }
}

/// A run's status, replayed from its events on a blocking thread. A journal that does not
/// replay still gives one (state `damaged`); so does a damaged run's unreadable config.
async fn replay_status(
    record: RunRecord,
    events: Arc<Vec<Event>>,
) -> Result<report::RunStatus, ApiError> {
    let limits = run_config(&record).map(|c| c.limits).unwrap_or_default();
    tokio::task::spawn_blocking(move || report::status(&record, limits, &events))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

async fn show_run(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<report::RunStatus>, ApiError> {
    Ok(Json(run_status(&state, &id).await?))
}

#[derive(Debug, Deserialize)]
struct GcQuery {
    #[serde(default)]
    dry_run: bool,
}

/// Removes what runs that are no longer live left behind (`flotilla gc`).
async fn collect_garbage(
    State(state): State<AppState>,
    Query(q): Query<GcQuery>,
) -> Result<Json<GcReport>, ApiError> {
    let report = state
        .supervisor
        .send(CollectGarbage {
            dry_run: q.dry_run,
            progress: false,
        })
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e))?;
    Ok(Json(report))
}

async fn cancel_run(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let record = unfinished(&state, &id).await?;
    // Answered only once the cancellation is in the journal: an acknowledged cancel
    // survives a crash.
    let answer = state
        .supervisor
        .send(CancelRun {
            run: record.id,
            reason: "cancelled by the user".into(),
        })
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    match answer {
        CancelAnswer::Journaled => {}
        CancelAnswer::NotLive => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("run {} is not running in this daemon", record.id),
            ));
        }
        CancelAnswer::Unavailable(why) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "run {} cannot be cancelled right now: {why}; try again",
                    record.id
                ),
            ));
        }
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "id": record.id.to_string(), "cancelling": true })),
    )
        .into_response())
}

/// `flotilla decide`: checks the decision against the journal (the task exists, waits for a
/// decision, an accepted subtask is one of its completed subtasks) so that a mistake is a
/// clear 404 or 409 now, then forwards it to the run's TaskGraph, which applies it.
/// A task's whole story: every event of the run that is about it (`flotilla status RUN
/// TASK`).
async fn task_story(
    State(state): State<AppState>,
    Path((id, task)): Path<(String, String)>,
) -> Result<Json<super::story::TaskStory>, ApiError> {
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
    let story = tokio::task::spawn_blocking(move || super::story::story(run, wanted, events))
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

async fn decide(
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
                report::task_state_words(waiting.state)
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

/// A decision about a whole run (`POST /v1/runs/{id}/decision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum RunDecision {
    /// Landing paused because main no longer holds what the run landed: main as it is now
    /// becomes the base the merge queue lands on; what it dropped is reported, not replayed.
    AdoptMain,
}

/// `flotilla decide RUN --adopt-main`: checked against the journal (the run is running and
/// its landing paused on a diverged main) so that a mistake is a clear 409 now, then
/// forwarded to the run's TaskGraph, which journals `MainAdopted` once the merge queue has
/// read main (ADR-024).
async fn decide_run(
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
struct GraphQuery {
    #[serde(default)]
    format: Option<String>,
}

async fn graph(
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
            report::dot(&status.graph),
        )
            .into_response(),
        "mermaid" => (
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            report::mermaid(&status.graph),
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

#[derive(Debug, Deserialize)]
struct EventsQuery {
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

async fn events(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let record = resolve(&state, &id).await?;
    let last_event_id = match headers.get("last-event-id") {
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
            let data = serde_json::to_string(&e).unwrap_or_else(|_| "{}".into());
            let sse = SseEvent::default().event(e.kind.name()).data(data);
            // Notices carry no id, so that `Last-Event-ID` only ever names journal seqs.
            Ok(if e.seq > 0 {
                sse.id(e.seq.to_string())
            } else {
                sse
            })
        })
        // End streams promptly at shutdown, or graceful shutdown would wait on them.
        .take_until(state.shutdown.clone().cancelled_owned());
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(SSE_KEEP_ALIVE)))
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
