//! `GET /v1/runs/{id}/report`: the run's report (`flotilla report RUN`), folded from its
//! journal on a blocking thread (`run_report`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;

use super::runs::read_events;
use super::{ApiError, AppState, resolve, run_config};
use crate::api::report::RunReport;
use crate::daemon::run_report;

pub(super) async fn show_report(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<RunReport>, ApiError> {
    let record = resolve(&state, &id).await?;
    // The worker slots the run had; a run whose config no longer reads still gets a report,
    // its lower bound computed with the default.
    let slots = run_config(&record)
        .map(|c| c.limits.max_workers)
        .unwrap_or_else(|_| flotilla_actors::config::Limits::default().max_workers);
    let events = read_events(&state, record.id, 0).await?;
    // A big run's events are many: folded off the runtime's thread.
    let report =
        tokio::task::spawn_blocking(move || run_report::run_report(&record, slots, &events))
            .await
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(Json(report))
}
