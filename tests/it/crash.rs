//! Crash recovery: a real `flotilla daemon` is SIGKILLed in the middle of a scripted run of
//! 53 tasks (one of them decomposed by the Subplanner, in two batches), restarted, and the run must
//! finish with every task completed exactly once, asserted from the journal itself.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use flotilla_actors::protocol::{EventKind, RunOutcome};
use futures::StreamExt;

use crate::daemon_env::*;

/// Sprint 1: 30 tasks (each third one depends on the task three before it); sprint 2: 20
/// more, of which t31 is wide (4 files) and is decomposed into 3 subtasks.
fn scenario() -> String {
    let mut s = String::from("[agent]\ndelay_ms = 80\n\n[[planner.answers]]\ntasks = [\n");
    for i in 0..30 {
        let dep = if i >= 3 && i % 3 == 0 {
            format!(", dependencies = [{}]", i - 3)
        } else {
            String::new()
        };
        s.push_str(&format!(
            "  {{ description = \"sprint one task {i}\", scope = [\"src/one/{i}.rs\"]{dep} }},\n"
        ));
    }
    s.push_str("]\n\n[[planner.answers]]\ntasks = [\n");
    s.push_str("  { description = \"the wide one\", scope = [\"src/w/a.rs\", \"src/w/b.rs\", \"src/w/c.rs\", \"src/w/d.rs\"] },\n");
    for i in 1..20 {
        s.push_str(&format!(
            "  {{ description = \"sprint two task {i}\", scope = [\"src/two/{i}.rs\"] }},\n"
        ));
    }
    // t31 is decomposed by the Subplanner: two subtasks first, the third after a handoff;
    // later calls answer empty, which closes the decomposition once nothing runs.
    s.push_str(
        r#"]

[[subplanner.t31.answers]]
tasks = [
  { description = "w part a", scope = ["src/w/a.rs", "src/w/b.rs"] },
  { description = "w part c", scope = ["src/w/c.rs"] },
]
[[subplanner.t31.answers]]
tasks = [
  { description = "w part d, on parts a and c", scope = ["src/w/d.rs"] },
]
"#,
    );
    s
}

const TASKS: usize = 53;

/// Everything the journal says about one run.
struct Journal {
    kinds: Vec<EventKind>,
}

fn read_journal(state_dir: &Path, run: &str) -> Journal {
    let conn = rusqlite::Connection::open(state_dir.join("journal.sqlite")).unwrap();
    let mut stmt = conn
        .prepare("SELECT data FROM events WHERE run = ?1 ORDER BY seq")
        .unwrap();
    let kinds = stmt
        .query_map([run], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|d| serde_json::from_str::<EventKind>(&d.unwrap()).unwrap())
        .collect();
    Journal { kinds }
}

impl Journal {
    fn finished(&self) -> bool {
        self.kinds
            .iter()
            .any(|k| matches!(k, EventKind::RunFinished { .. }))
    }

    /// The exactly-once checks.
    fn assert_exactly_once(&self, context: &str) {
        let mut added = BTreeSet::new();
        for k in &self.kinds {
            if let EventKind::TaskAdded { task, .. } = k {
                assert!(
                    added.insert(task.clone()),
                    "{context}: {task} was added twice"
                );
            }
        }
        assert_eq!(
            added.len(),
            TASKS,
            "{context}: every task enters the graph once, with a stable id"
        );

        let mut completions: BTreeMap<String, usize> = BTreeMap::new();
        let mut handoffs = 0;
        for k in &self.kinds {
            if let EventKind::TaskCompleted { task, handoff, .. } = k {
                *completions.entry(task.to_string()).or_default() += 1;
                handoffs += usize::from(handoff.is_some());
            }
        }
        for task in &added {
            assert_eq!(
                completions.get(&task.to_string()),
                Some(&1),
                "{context}: {task} must complete exactly once"
            );
        }
        assert_eq!(handoffs, TASKS, "{context}: each handoff is recorded once");

        let decompositions = self
            .kinds
            .iter()
            .filter(|k| {
                matches!(
                    k,
                    EventKind::DecompositionAccepted {
                        subplanner: true,
                        ..
                    }
                )
            })
            .count();
        assert_eq!(decompositions, 1, "{context}: the subplan is accepted once");

        // The Subplanner's calls, per task attempt: 0, 1, 2, … with no call asked twice,
        // whatever the kills interrupted.
        let mut subplanner_calls: BTreeMap<(String, u32), Vec<u32>> = BTreeMap::new();
        for k in &self.kinds {
            if let EventKind::SubplannerResponded {
                task,
                attempt,
                call,
                ..
            } = k
            {
                subplanner_calls
                    .entry((task.to_string(), *attempt))
                    .or_default()
                    .push(*call);
            }
        }
        assert!(
            !subplanner_calls.is_empty(),
            "{context}: the Subplanner ran"
        );
        for ((task, attempt), calls) in &subplanner_calls {
            assert_eq!(
                *calls,
                (0..calls.len() as u32).collect::<Vec<_>>(),
                "{context}: {task} attempt {attempt}: no Subplanner answer is asked for twice"
            );
        }
        let added_batches = self
            .kinds
            .iter()
            .filter(|k| matches!(k, EventKind::SubtasksAdded { .. }))
            .count();
        assert_eq!(
            added_batches, 1,
            "{context}: the second batch is added once"
        );

        let calls: Vec<u32> = self
            .kinds
            .iter()
            .filter_map(|k| match k {
                EventKind::PlannerResponded { call, .. } => Some(*call),
                _ => None,
            })
            .collect();
        assert_eq!(
            calls,
            (0..calls.len() as u32).collect::<Vec<_>>(),
            "{context}: no planner answer is asked for twice"
        );

        let finished: Vec<_> = self
            .kinds
            .iter()
            .filter_map(|k| match k {
                EventKind::RunFinished { outcome, .. } => Some(*outcome),
                _ => None,
            })
            .collect();
        assert_eq!(
            finished,
            vec![RunOutcome::Completed],
            "{context}: the run finishes once, completed"
        );
    }
}

/// Starts a run on a fresh daemon, kills it each time the journal passes one of
/// `kill_after` (seqs), restarts it, and lets the run finish.
async fn crash_and_recover(kill_after: &[u64]) {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let mut daemon = DaemonProcess::start(state.path());
    let client = DaemonProcess::client(state.path());
    let run = submit(&client, repo.path(), run_config(&scenario(), 4)).await;

    for &point in kill_after {
        let mut stream = client.events(&run, None).await.unwrap();
        let reached = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(Ok(e)) = stream.next().await {
                if e.seq >= point {
                    return true;
                }
            }
            false
        })
        .await
        .unwrap_or(false);
        assert!(
            reached,
            "the journal never reached seq {point}; daemon log:\n{}",
            daemon.log()
        );
        daemon.kill();
        let journal = read_journal(state.path(), &run);
        assert!(
            !journal.finished(),
            "the kill at seq {point} came after the run had finished: not a mid-run crash"
        );
        daemon = DaemonProcess::start(state.path());
    }

    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(
        outcome(&events),
        Some(RunOutcome::Completed),
        "daemon log:\n{}",
        daemon.log()
    );
    let interrupted = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::TaskInterrupted { .. }))
        .count();
    drop(daemon);
    eprintln!(
        "kills at {kill_after:?}: {} events, {interrupted} interrupted attempts",
        events.len()
    );
    read_journal(state.path(), &run).assert_exactly_once(&format!(
        "kills at {kill_after:?} ({interrupted} interrupted attempts)"
    ));
}

#[tokio::test]
async fn sigkill_at_five_different_points_then_restart_completes_every_task_exactly_once() {
    for point in [4, 45, 110, 170, 230] {
        crash_and_recover(&[point]).await;
    }
}

#[tokio::test]
async fn repeated_sigkills_in_one_run_still_complete_every_task_exactly_once() {
    crash_and_recover(&[30, 90, 150, 210]).await;
}
