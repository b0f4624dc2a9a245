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
//!
//! `{id}` may be any unique prefix of a run id.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;

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
use flotilla_actors::protocol::{Event, EventKind, RunId};
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::report;
use super::supervisor::{CancelAnswer, CancelRun, RunProblems, StartRun, Supervisor};
use crate::config::RunConfig;
use crate::journal::{RunRecord, SqliteJournal};

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Largest request text accepted.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

#[derive(Clone)]
pub struct AppState {
    pub journal: SqliteJournal,
    pub supervisor: Addr<Supervisor>,
    pub hub: broadcast::Sender<Event>,
    pub shutdown: CancellationToken,
    /// Required bearer token (TCP only; the Unix socket is protected by file permissions).
    pub token: Option<Arc<String>>,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/runs", post(create_run).get(list_runs))
        .route("/v1/runs/{id}", get(show_run))
        .route("/v1/runs/{id}/events", get(events))
        .route("/v1/runs/{id}/cancel", post(cancel_run))
        .route("/v1/runs/{id}/graph", get(graph))
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "no such endpoint; see `flotilla --help`",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .with_state(state)
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
        match Json::<T>::from_request(req, state).await {
            Ok(Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(ApiError::new(rejection.status(), rejection.body_text())),
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
    next.run(req).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Finds the run `raw` names: a full id or a unique prefix.
async fn resolve(state: &AppState, raw: &str) -> Result<RunRecord, ApiError> {
    let wanted = raw.trim().to_ascii_lowercase();
    if wanted.is_empty()
        || wanted.len() > 36
        || !wanted.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
    {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{raw:?} is not a run id or id prefix"),
        ));
    }
    let runs = state.journal.runs().await?;
    let compact = wanted.replace('-', "");
    let mut matches = runs.into_iter().filter(|r| {
        let full = r.id.to_string();
        full.starts_with(&wanted) || full.replace('-', "").starts_with(&compact)
    });
    match (matches.next(), matches.next()) {
        (Some(run), None) => Ok(run),
        (None, _) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no run matches {raw:?}"),
        )),
        (Some(_), Some(_)) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("{raw:?} matches several runs; give more of the id"),
        )),
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
}

fn unprocessable(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, message)
}

async fn create_run(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateRun>,
) -> Result<Response, ApiError> {
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
            let config = match config {
                Some(c) => c,
                None => RunConfig::load(&root.join("flotilla.toml"))
                    .map_err(|e| unprocessable(e.to_string()))?,
            };
            config
                .scenario
                .check()
                .map_err(|e| unprocessable(e.to_string()))?;
            Ok((root, config))
        })
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;

    let id = RunId::generate();
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
    let started = state.journal.create_run(record).await?;
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
    Ok((StatusCode::CREATED, Json(Created { id: id.to_string() })).into_response())
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
async fn problems(state: &AppState) -> HashMap<RunId, String> {
    state.supervisor.send(RunProblems).await.unwrap_or_default()
}

async fn list_runs(State(state): State<AppState>) -> Result<Json<Vec<RunSummary>>, ApiError> {
    let runs = state.journal.runs().await?;
    let mut problems = problems(&state).await;
    Ok(Json(
        runs.into_iter()
            .map(|r| {
                let problem = problems.remove(&r.id).filter(|_| r.outcome.is_none());
                let damaged = problem.as_deref().is_some_and(|p| p.starts_with("damaged"));
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
                    problem,
                }
            })
            .collect(),
    ))
}

async fn run_status(state: &AppState, id: &str) -> Result<report::RunStatus, ApiError> {
    let record = resolve(state, id).await?;
    let problem = problems(state).await.remove(&record.id);
    // A damaged run's stored config may be unreadable too: its status still shows.
    let limits = run_config(&record).map(|c| c.limits).unwrap_or_default();
    let events = match state.journal.read(record.id, 0).await {
        Ok(events) => events,
        Err(e) => {
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("run {} is damaged: {e}", record.id),
            ));
        }
    };
    let mut status = tokio::task::spawn_blocking(move || report::status(&record, limits, &events))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    if status.outcome_is_open() {
        status.problem = status.problem.or(problem);
    }
    Ok(status)
}

async fn show_run(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<report::RunStatus>, ApiError> {
    Ok(Json(run_status(&state, &id).await?))
}

async fn cancel_run(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let record = resolve(&state, &id).await?;
    if let Some(outcome) = record.outcome {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("run {} already finished ({outcome:?})", record.id),
        ));
    }
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
    let backlog: VecDeque<Event> = state.journal.read(record.id, after).await?.into();
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
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
