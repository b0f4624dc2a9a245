//! A run's status folded from its journal page by page, and a finished run's status kept
//! once folded (ADR-040): `status` of a big finished run reads one row instead of replaying
//! every event, and no fold holds a whole journal.
//!
//! A stored summary is used only while it says what a fold would: it names the flotilla
//! that wrote it ([`SUMMARY_FORMAT`]) and the last event it folded, and the journal's last
//! event must still be that one. It must not know the API's handlers or the supervisor.

use flotilla_actors::ports::JournalError;
use flotilla_actors::protocol::RunId;
use tracing::warn;

use super::report::StatusReplay;
use crate::api::status::RunStatus;
use crate::journal::{RunRecord, SqliteJournal};

/// What wrote a stored summary: this flotilla's version, and the revision of the fold and
/// of `RunStatus`. A summary in any other format is folded again. Bump the revision when
/// what `status` says of a finished run changes.
pub const SUMMARY_FORMAT: &str = concat!(env!("CARGO_PKG_VERSION"), "/status-1");

/// Events a fold reads from the journal at a time.
pub const FOLD_PAGE: usize = 2048;

/// The stored status of a finished run, if one is stored and still says what a fold would;
/// `None` (after saying why in the log, if something is wrong) otherwise.
pub async fn stored(journal: &SqliteJournal, run: RunId) -> Option<RunStatus> {
    let text = match journal.summary(run, SUMMARY_FORMAT).await {
        Ok(text) => text?,
        Err(e) => {
            warn!(%run, error = %e, "cannot read the run's stored status; folding its journal");
            return None;
        }
    };
    // A big run's status is megabytes of JSON: parsed off the runtime's thread.
    let parsed = tokio::task::spawn_blocking(move || serde_json::from_str::<RunStatus>(&text))
        .await
        .ok()?;
    match parsed {
        Ok(status) => Some(status),
        Err(e) => {
            warn!(%run, error = %e, "the run's stored status does not read; folding its journal");
            None
        }
    }
}

/// Applies `record`'s events after `replay.last_seq()` to `replay`, page by page, and
/// says the run's status. When the run has finished, its status is stored (in the
/// background) for the next call. An error is the journal's: nothing was applied.
pub async fn fold(
    journal: &SqliteJournal,
    record: RunRecord,
    replay: StatusReplay,
) -> Result<(StatusReplay, RunStatus), JournalError> {
    let run = record.id;
    let finished = record.outcome.is_some();
    let replay = journal
        .fold_pages(
            run,
            replay.last_seq(),
            FOLD_PAGE,
            replay,
            |replay, events| replay.apply(events),
        )
        .await?;
    let folded = tokio::task::spawn_blocking(move || {
        let status = replay.status(&record);
        // Only an ended run's status is final: a running one's changes with its next event
        // (and takes the supervisor's word on what is wrong with it).
        let summary = (finished && !status.outcome_is_open())
            .then(|| serde_json::to_string(&status))
            .and_then(Result::ok);
        (replay, status, summary)
    })
    .await
    .map_err(|e| JournalError::Storage(format!("the status fold stopped: {e}")))?;
    let (replay, status, summary) = folded;
    if let Some(summary) = summary {
        let store = journal.store_summary(run, SUMMARY_FORMAT, status.last_seq, summary);
        tokio::spawn(async move {
            if let Err(e) = store.await {
                warn!(%run, error = %e, "cannot store the run's status; the next call folds again");
            }
        });
    }
    Ok((replay, status))
}
