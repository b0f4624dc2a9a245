//! A daemon on a state directory of finished runs (ADR-040): start-up reads no finished
//! run's config, so one whose stored config no longer reads breaks nothing; a finished
//! run's status, folded once and kept, says what it said before the restart; its replay is
//! its journal, event for event.

use std::sync::Arc;

use flotilla::journal::{RunRecord, SqliteJournal};
use flotilla_actors::ports::SystemClock;
use flotilla_actors::protocol::{RunId, RunOutcome};
use hyper::{Method, StatusCode};

use crate::daemon_env::*;

const TWO_TASKS: &str = r#"
[[planner.answers]]
tasks = [
  { description = "a", scope = ["a.rs"] },
  { description = "b", scope = ["b.rs"], dependencies = [0] },
]
"#;

#[tokio::test]
async fn a_finished_run_whose_config_no_longer_reads_breaks_no_start_up_status_or_replay() {
    let repo = git_repo();
    let daemon = InProcessDaemon::start(false);
    let first = submit(&daemon.client, repo.path(), run_config(TWO_TASKS, 2)).await;
    let replayed = follow_to_end(&daemon.client, &first, None).await;
    assert_eq!(outcome(&replayed), Some(RunOutcome::Completed));
    let status_path = format!("/v1/runs/{first}");
    // The finished run's status is folded once (as it retires, or by the first call) and
    // kept: every call says the same.
    let folded = run_part(daemon.client.get(&status_path).await.unwrap());
    let kept = run_part(daemon.client.get(&status_path).await.unwrap());
    assert_eq!(folded, kept);
    assert_eq!(folded["state"], "completed");
    assert_eq!(folded["counts"]["completed"], 2);
    let state = daemon.stop_keeping_state();

    // While no daemon runs: the finished run's stored config is broken, and a run that has
    // not finished (only its `RunStarted`) is added, to be resumed.
    let path = state.path().join("journal.sqlite");
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute(
            "UPDATE runs SET config = '{\"limits\": not json' WHERE id = ?1",
            [&first],
        )
        .unwrap();
    let second = RunId::generate();
    SqliteJournal::open(&path, Arc::new(SystemClock))
        .unwrap()
        .create_run(RunRecord {
            id: second,
            request: "build the other thing".into(),
            repo: repo.path().into(),
            config: run_config(TWO_TASKS, 2),
            created_ms: 1,
            outcome: None,
        })
        .await
        .unwrap();

    let daemon = InProcessDaemon::start_with(DaemonSetup {
        state: Some(state),
        ..DaemonSetup::default()
    });
    let resumed = follow_to_end(&daemon.client, &second.to_string(), None).await;
    assert_eq!(outcome(&resumed), Some(RunOutcome::Completed));
    let after = run_part(daemon.client.get(&status_path).await.unwrap());
    assert_eq!(after, folded, "the finished run's status, as before");
    assert_eq!(
        follow_to_end(&daemon.client, &first, None).await,
        replayed,
        "its replay is its journal"
    );
    let runs: Vec<serde_json::Value> = daemon.client.get("/v1/runs").await.unwrap();
    let states: Vec<&str> = runs.iter().map(|r| r["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["completed", "completed"]);
    let (status, body) = daemon
        .client
        .raw(Method::POST, "/v1/gc", None)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert!(
        !daemon.log_text().contains("damaged"),
        "{}",
        daemon.log_text()
    );
    daemon.stop();
}

/// A run's status is stored as the run retires (ADR-040, `run_summaries`, migration 3),
/// with no `status` call to fold it first: the row holds the finished run's outcome and
/// counts, in this flotilla's format, folded up to the run's last event. After a restart,
/// `status` answers from that row, not from a fold: a marker written into the stored
/// status while no daemon runs is what it says.
#[tokio::test]
async fn a_finished_run_s_status_is_stored_as_it_retires_and_answered_from_after_a_restart() {
    use flotilla::daemon::summary::SUMMARY_FORMAT;
    use flotilla_actors::testing::{PATIENCE, within};

    let repo = git_repo();
    let daemon = InProcessDaemon::start(false);
    let (run, last_seq) = two_tasks_completed(&daemon, &repo).await;

    // The supervisor stores it once the run has retired (after its clean-up), on its own:
    // nothing here asks for the run's status.
    let journal = daemon.state_dir().join("journal.sqlite");
    let stored = within(PATIENCE, || async { stored_row(&journal, &run) }).await;
    let Some((format, stored_seq, summary)) = stored else {
        panic!(
            "no stored status for the retired run\n{}",
            daemon.log_text()
        );
    };
    assert_eq!(format, SUMMARY_FORMAT);
    assert_eq!(
        stored_seq,
        i64::try_from(last_seq).unwrap(),
        "folded to its end"
    );
    let summary: serde_json::Value = serde_json::from_str(&summary).unwrap();
    assert_eq!(summary["id"], run.as_str());
    assert_eq!(summary["state"], "completed");
    assert_eq!(summary["counts"]["completed"], 2);
    assert_eq!(summary["counts"]["failed"], 0);
    assert_eq!(summary["counts"]["total"], 2);
    assert_eq!(summary["last_seq"], last_seq);
    let state = daemon.stop_keeping_state();

    // While no daemon runs, the stored status is marked (format and last seq untouched).
    let journal = state.path().join("journal.sqlite");
    let marked = rusqlite::Connection::open(&journal)
        .unwrap()
        .execute(
            "UPDATE run_summaries SET summary = json_set(summary, '$.request', 'from the stored row')
             WHERE run = ?1",
            [&run],
        )
        .unwrap();
    assert_eq!(marked, 1);

    let daemon = InProcessDaemon::start_with(DaemonSetup {
        state: Some(state),
        ..DaemonSetup::default()
    });
    let status: serde_json::Value = daemon.client.get(&format!("/v1/runs/{run}")).await.unwrap();
    assert_eq!(status["request"], "from the stored row", "{status}");
    let mut unmarked = status.clone();
    unmarked["request"] = summary["request"].clone();
    // What waits in the repository's pool is read as the status is asked for (ADR-052):
    // the run left its workspaces there, the stored row says nothing of them.
    let pool = unmarked
        .as_object_mut()
        .unwrap()
        .remove("pool")
        .unwrap_or_else(|| panic!("{status}"));
    assert!(
        pool.as_str()
            .is_some_and(|p| p.contains("kept for the repository's next run")),
        "{pool}"
    );
    assert_eq!(summary.get("pool"), None);
    assert_eq!(unmarked, summary, "the stored status, whole");
    daemon.stop();
}

/// A daemon stopped right after a run ends lets the run finish retiring first (for a
/// while): its worktrees are swept and its status stored, not left for the next start's
/// collection and the first `status` to fold. The stop comes as soon as the run's end is
/// seen, with nothing waited for in between.
#[tokio::test]
async fn a_daemon_stopped_just_after_a_run_ends_still_sweeps_it_and_stores_its_status() {
    let repo = git_repo();
    let daemon = InProcessDaemon::start(false);
    let (run, last_seq) = two_tasks_completed(&daemon, &repo).await;
    let state = daemon.stop_keeping_state();

    let stored = stored_row(&state.path().join("journal.sqlite"), &run);
    assert_eq!(
        stored.map(|(_, seq, _)| seq),
        Some(i64::try_from(last_seq).unwrap()),
        "the status is stored before the daemon stops"
    );
    let run_worktrees = state.path().join("worktrees").join(&run);
    let left: Vec<_> = std::fs::read_dir(&run_worktrees)
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "the run's worktrees are swept: {left:?}");
}

/// Runs [`TWO_TASKS`] on `daemon` to its end, which must be `Completed`: its id and its
/// last event's seq.
async fn two_tasks_completed(daemon: &InProcessDaemon, repo: &tempfile::TempDir) -> (String, u64) {
    let run = submit(&daemon.client, repo.path(), run_config(TWO_TASKS, 2)).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    let last_seq = events.iter().map(|e| e.seq).max().unwrap();
    (run, last_seq)
}

/// A run's status less what waits in its repository's pool, which is the repository's, read
/// as the status is asked for (ADR-052): a later run of the repository takes from it.
fn run_part(mut status: serde_json::Value) -> serde_json::Value {
    status.as_object_mut().unwrap().remove("pool");
    status
}

/// `run`'s stored status in `journal`: its format, the last seq it folded, its JSON.
fn stored_row(journal: &std::path::Path, run: &str) -> Option<(String, i64, String)> {
    let conn = rusqlite::Connection::open(journal).unwrap();
    conn.query_row(
        "SELECT format, last_seq, summary FROM run_summaries WHERE run = ?1",
        [run],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
    .ok()
}
