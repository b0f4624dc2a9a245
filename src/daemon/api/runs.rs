//! The run handlers: create (idempotent), list, status, cancel, and `gc`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use flotilla_actors::ports::{Journal, JournalError};
use flotilla_actors::protocol::{Event, RunId};
use serde::Deserialize;

use super::super::supervisor::{
    CancelAnswer, CancelRun, CollectGarbage, RunProblem, RunProblems, StartRun,
};
use super::super::{report, summary};
use super::{
    ApiError, ApiJson, AppState, MAX_IDEMPOTENCY_KEY_BYTES, MAX_REQUEST_BYTES, resolve,
    resolve_listed, run_config, with_config,
};
use crate::api::IDEMPOTENCY_KEY;
use crate::api::gc::GcReport;
use crate::api::runs::{CreateRun, Created, RunSummary, state_name};
use crate::api::status::RunStatus;
use crate::config::RunConfig;
use crate::journal::{RunRecord, SubmitKey, SubmitOutcome};
use crate::sandbox::SandboxPolicy;

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

pub(super) async fn create_run(
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
            let target =
                crate::git::target::resolve_target(&opened, config.merge.branch.as_deref())
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
        // The wire format: the answer's `error` field is the error's text.
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok((
        StatusCode::CREATED,
        Json(Created {
            id: id.to_string(),
            branch,
        }),
    )
        .into_response())
}

/// The supervisor's view of what is wrong with each run (damaged, paused, restarting).
async fn problems(state: &AppState) -> HashMap<RunId, RunProblem> {
    state.supervisor.send(RunProblems).await.unwrap_or_default()
}

pub(super) async fn list_runs(
    State(state): State<AppState>,
) -> Result<Json<Vec<RunSummary>>, ApiError> {
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
                        state_name(r.outcome).into()
                    },
                    problem: problem.map(|p| p.to_string()),
                }
            })
            .collect(),
    ))
}

/// `status`'s lines for what the run's repository keeps between runs: its warm trees
/// (ADR-055; the run's own, in its scratch directory, where the repository's path did not
/// resolve when it started) and its pool of workspaces (ADR-052).
async fn repository_lines(
    state: &AppState,
    run: RunId,
    repo: &std::path::Path,
) -> (Option<String>, Option<String>) {
    let scratch = state
        .worktrees
        .join(run.to_string())
        .join(crate::git::worktrees::SCRATCH_DIR);
    let (worktrees, repo) = (state.worktrees.clone(), repo.to_path_buf());
    tokio::task::spawn_blocking(move || {
        let warm = crate::git::slots::repository_dir(&worktrees, crate::git::warm::WARM_DIR, &repo)
            .and_then(|root| crate::git::warm::describe(&root))
            .or_else(|| crate::git::warm::describe(&scratch));
        (warm, crate::git::slots::describe_pool(&worktrees, &repo))
    })
    .await
    .unwrap_or_default()
}

pub(super) async fn run_status(state: &AppState, id: &str) -> Result<RunStatus, ApiError> {
    let listed = resolve_listed(state, id).await?;
    // A finished run's status was folded once and kept (ADR-040): neither its config nor
    // its events are read again.
    if listed.outcome.is_some()
        && let Some(mut status) = summary::stored(&state.journal, listed.id).await
    {
        // What waits in the repository's pool and warm trees changes after the run
        // (ADR-052, ADR-055).
        (status.warm, status.pool) = repository_lines(state, listed.id, &listed.repo).await;
        return Ok(status);
    }
    let record = with_config(state, listed).await?;
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
    // no graph (the fold stops at the bad row and hands back none of it).
    let (replay, mut status, unreadable) =
        match summary::fold(&state.journal, record.clone(), replay).await {
            Ok((replay, status)) => (Some(replay), status, None),
            Err(e) => {
                let empty = report::StatusReplay::new(flotilla_actors::config::Limits::default());
                (None, empty.status(&record), Some(format!("damaged: {e}")))
            }
        };
    // (An unreadable journal gives no replay: the one taken out above is not put back.)
    if let Some(replay) = replay {
        state.status_replays.keep(run, replay);
    }
    (status.warm, status.pool) = repository_lines(state, run, &record.repo).await;
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
pub(super) async fn read_events(
    state: &AppState,
    run: RunId,
    after: u64,
) -> Result<Vec<Event>, ApiError> {
    state
        .journal
        .read(run, after)
        .await
        .map_err(|e| damaged_or(run, e))
}

/// At most `limit` of a run's events after `after` (a replay's page), as [`read_events`].
pub(super) async fn read_event_page(
    state: &AppState,
    run: RunId,
    after: u64,
    limit: usize,
) -> Result<Vec<Event>, ApiError> {
    state
        .journal
        .read_page(run, after, limit)
        .await
        .map_err(|e| damaged_or(run, e))
}

fn damaged_or(run: RunId, e: JournalError) -> ApiError {
    match e {
        JournalError::Corrupt { .. } => ApiError::new(
            StatusCode::CONFLICT,
            format!("run {run} is damaged: {e}; `flotilla status {run}` shows what is known"),
        ),
        other => other.into(),
    }
}

/// The run `raw` names, if it has not finished: a decision or a cancel for a finished run is
/// a 409 that says how it ended.
pub(super) async fn unfinished(state: &AppState, raw: &str) -> Result<RunRecord, ApiError> {
    let record = resolve(state, raw).await?;
    match record.outcome {
        Some(outcome) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "run {} already finished ({})",
                record.id,
                state_name(Some(outcome))
            ),
        )),
        None => Ok(record),
    }
}

/// A run's status, replayed from its events on a blocking thread. A journal that does not
/// replay still gives one (state `damaged`); so does a damaged run's unreadable config.
pub(super) async fn replay_status(
    record: RunRecord,
    events: Arc<Vec<Event>>,
) -> Result<RunStatus, ApiError> {
    let limits = run_config(&record).map(|c| c.limits).unwrap_or_default();
    tokio::task::spawn_blocking(move || report::status(&record, limits, &events))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

pub(super) async fn show_run(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<RunStatus>, ApiError> {
    Ok(Json(run_status(&state, &id).await?))
}

#[derive(Debug, Deserialize)]
pub(super) struct GcQuery {
    #[serde(default)]
    dry_run: bool,
}

/// Removes what runs that are no longer live left behind (`flotilla gc`).
pub(super) async fn collect_garbage(
    State(state): State<AppState>,
    Query(q): Query<GcQuery>,
) -> Result<Json<GcReport>, ApiError> {
    let report = state
        .supervisor
        .send(CollectGarbage {
            dry_run: q.dry_run,
            progress: false,
            transcripts: true,
        })
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?
        // The wire format: the answer's `error` field is the error's text.
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(Json(report))
}

pub(super) async fn cancel_run(
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
