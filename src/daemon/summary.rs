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
use crate::config::RunConfig;
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

/// Folds a run that has just finished and stores its status (the supervisor, as the run
/// retires): the first `status` after a run's end reads it instead of folding.
pub async fn fold_finished(journal: &SqliteJournal, run: RunId) {
    let record = match journal.run(run).await {
        Ok(Some(record)) if record.outcome.is_some() => record,
        Ok(_) => return,
        Err(e) => {
            warn!(%run, error = %e, "cannot read the finished run; its first status folds it");
            return;
        }
    };
    // A config that no longer reads folds with the default limits, as `status` does.
    let limits = serde_json::from_value::<RunConfig>(record.config.clone())
        .map(|c| c.limits)
        .unwrap_or_default();
    if let Err(e) = fold(journal, record, StatusReplay::new(limits)).await {
        warn!(%run, error = %e, "cannot fold the finished run; its first status tries again");
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
        let stored = journal
            .store_summary(run, SUMMARY_FORMAT, status.last_seq, summary)
            .await;
        if let Err(e) = stored {
            warn!(%run, error = %e, "cannot store the run's status; the next call folds again");
        }
    }
    Ok((replay, status))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use flotilla_actors::config::Limits;
    use flotilla_actors::graph::RunGraph;
    use flotilla_actors::ports::{Journal, SystemClock};
    use flotilla_actors::protocol::{
        Budget, Handoff, Route, RunOutcome, TaskCompleted, TaskSpec, Usd,
    };

    use super::*;
    use crate::daemon::report;

    /// A run of `tasks` tasks that each complete, as its TaskGraph journals it.
    fn completed_run(tasks: u32, limits: &Limits) -> Vec<flotilla_actors::protocol::EventKind> {
        let mut g = RunGraph::new(limits.clone());
        let specs = (0..tasks)
            .map(|n| TaskSpec::new(format!("task {n}"), &[&format!("src/m{n}.rs")]))
            .collect();
        let mut kinds = g.submit(specs).unwrap();
        kinds.extend(g.planning_finished().unwrap());
        for n in 1..=tasks {
            let t = flotilla_actors::protocol::TaskId::root(n);
            kinds.extend(g.dispatched(&t, 1, "general", Route::Worker).unwrap());
            kinds.extend(g.started(&t, 1).unwrap());
            kinds.extend(
                g.complete(TaskCompleted {
                    task: t,
                    attempt: 1,
                    handoff: Some(Handoff::complete("done")),
                    artifacts: Vec::new(),
                    subplan: None,
                })
                .unwrap(),
            );
        }
        assert_eq!(g.outcome(), Some(RunOutcome::Completed));
        kinds
    }

    /// A finished run's status folded page by page, and then read back as stored, says
    /// exactly what one fold of its whole journal says (the status before ADR-040); a
    /// running run's is never stored.
    #[tokio::test]
    async fn a_finished_runs_stored_status_is_the_whole_journals_fold() {
        let dir = tempfile::tempdir().unwrap();
        let journal =
            SqliteJournal::open(&dir.path().join("j.sqlite"), Arc::new(SystemClock)).unwrap();
        let unbounded = Budget::new(u64::MAX / 4, Usd::from_micros(u64::MAX / 4), u64::MAX / 4);
        let limits = Limits {
            max_nodes: 2_000,
            run_budget: unbounded,
            ..Limits::default()
        };
        let mut record = RunRecord {
            id: RunId::generate(),
            request: "r".into(),
            repo: "/tmp".into(),
            config: serde_json::json!({ "merge": { "branch": "trunk" } }),
            created_ms: 3,
            outcome: None,
        };
        journal.create_run(record.clone()).await.unwrap();
        let run = record.id;
        // More events than a fold's page, so that the fold crosses page boundaries.
        let kinds = completed_run(1_000, &limits);
        assert!(kinds.len() > 2 * FOLD_PAGE, "{} events", kinds.len());
        let (mut running, ended) = (kinds.clone(), kinds.len() - 1);
        running.truncate(ended);
        journal.append(run, running).await.unwrap();
        let json = |s: &RunStatus| serde_json::to_string(s).unwrap();

        // Running: folded, not stored.
        let (_, status) = fold(&journal, record.clone(), StatusReplay::new(limits.clone()))
            .await
            .unwrap();
        assert_eq!(status.state, "running");
        assert!(
            journal
                .summary(run, SUMMARY_FORMAT)
                .await
                .unwrap()
                .is_none()
        );

        journal.append(run, kinds[ended..].to_vec()).await.unwrap();
        record.outcome = Some(RunOutcome::Completed);
        let whole = report::status(
            &record,
            limits.clone(),
            &journal.read(run, 0).await.unwrap(),
        );
        assert_eq!(whole.state, "completed");
        assert_eq!(whole.branch.as_deref(), Some("trunk"));
        let (_, folded) = fold(&journal, record.clone(), StatusReplay::new(limits))
            .await
            .unwrap();
        assert_eq!(json(&folded), json(&whole));
        let kept = stored(&journal, run).await.expect("stored once folded");
        assert_eq!(json(&kept), json(&whole));
    }
}
