//! Crash recovery: a real `flotilla daemon` is SIGKILLed in the middle of a scripted run of
//! 53 tasks (one of them decomposed by the Subplanner, in two batches), restarted, and the run must
//! finish with every task completed exactly once, asserted from the journal itself.
//!
//! The landing half kills the daemon at each fail point of a landing (`merge::after-build` …
//! `merge::before-event`), then restarts it.

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
  { description = "w part a", scope = ["src/w/a.rs", "src/w/b.rs"], acceptance = "builds" },
  { description = "w part c", scope = ["src/w/c.rs"], acceptance = "builds" },
]
[[subplanner.t31.answers]]
tasks = [
  { description = "w part d, on parts a and c", scope = ["src/w/d.rs"], acceptance = "builds" },
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

// ---------------------------------------------------------------------------------------
// M6: crashes inside a landing (ADR-011, "Crash points and how they are tested"). The
// daemon kills itself (SIGKILL) at one of the MergeQueue's fail points, armed through
// FAILPOINTS; it is restarted without them, and main must hold every task's work exactly
// once, never an ungated tree, and agree with the journal.

/// Tasks of the landing scenario, each writing a file of its own.
const LANDERS: usize = 8;

/// The gate: a tree with BROKEN anywhere in it is refused.
const GATE: &str = "! grep -rq BROKEN .";

fn lander_file(n: usize) -> String {
    format!("src/f{n}.txt")
}

fn lander_text(n: usize) -> String {
    format!("the work of task {n}\n")
}

/// Eight tasks writing a file each; t1 is quick (it is first in the queue) and its first
/// attempt writes what the gate refuses, so a crash right after building its candidate has
/// an ungated tree that must never reach main. Its later attempts write a clean file.
fn landing_scenario() -> String {
    let mut s = String::from("[agent]\ndelay_ms = 500\n\n[[planner.answers]]\ntasks = [\n");
    for n in 1..=LANDERS {
        let priority = if n == 1 { ", priority = 1" } else { "" };
        s.push_str(&format!(
            "  {{ description = \"write file {n}\", scope = [\"{}\"]{priority} }},\n",
            lander_file(n)
        ));
    }
    s.push_str("]\n");
    for n in 1..=LANDERS {
        let quick = if n == 1 { "delay_ms = 10\n" } else { "" };
        s.push_str(&format!(
            "\n[tasks.t{n}]\n{quick}writes = {{ \"{}\" = {:?} }}\n",
            lander_file(n),
            lander_text(n)
        ));
    }
    s.push_str(&format!(
        "\n[[tasks.t1.attempts]]\ndelay_ms = 10\nwrites = {{ \"{}\" = \"BROKEN: fails the gate\\n\" }}\n",
        lander_file(1)
    ));
    s
}

fn landing_config() -> serde_json::Value {
    let mut config = run_config(&landing_scenario(), 3);
    config["merge"]["gate"] = serde_json::json!([GATE]);
    // Attempts interrupted by the crash count; t1 also spends one on the gate.
    config["limits"]["max_attempts"] = serde_json::json!(5);
    config
}

/// A commit on main's first-parent history and the tasks of `run` its trailers name.
struct MainCommit {
    id: git2::Oid,
    tasks: Vec<String>,
}

/// main's first-parent history, newest first, without the repository's first commit.
fn main_history(git: &git2::Repository, run: &str) -> Vec<MainCommit> {
    let prefix = format!("Flotilla-Task: {run}/");
    let mut out = Vec::new();
    let mut current = Some(
        git.find_reference("refs/heads/main")
            .unwrap()
            .peel_to_commit()
            .unwrap(),
    );
    while let Some(commit) = current {
        if commit.parent_count() == 0 {
            break;
        }
        let tasks = String::from_utf8_lossy(commit.message_bytes())
            .lines()
            .filter_map(|l| l.trim_end().strip_prefix(&prefix).map(str::to_string))
            .collect();
        out.push(MainCommit {
            id: commit.id(),
            tasks,
        });
        current = commit.parent(0).ok();
    }
    out
}

/// Every commit reachable from main whose tree has a file containing BROKEN.
fn ungated_commits(git: &git2::Repository) -> Vec<git2::Oid> {
    let mut walk = git.revwalk().unwrap();
    walk.push_ref("refs/heads/main").unwrap();
    let mut bad_blobs = BTreeSet::new();
    let mut seen_blobs = BTreeSet::new();
    let mut bad = Vec::new();
    for id in walk {
        let commit = git.find_commit(id.unwrap()).unwrap();
        let tree = commit.tree().unwrap();
        let mut broken = false;
        tree.walk(git2::TreeWalkMode::PreOrder, |_, entry| {
            if entry.kind() == Some(git2::ObjectType::Blob) {
                let blob = entry.id();
                if seen_blobs.insert(blob) {
                    let content = git.find_blob(blob).unwrap();
                    if content.content().windows(6).any(|w| w == b"BROKEN") {
                        bad_blobs.insert(blob);
                    }
                }
                broken |= bad_blobs.contains(&blob);
            }
            git2::TreeWalkResult::Ok
        })
        .unwrap();
        if broken {
            bad.push(commit.id());
        }
    }
    bad
}

fn file_at_main(git: &git2::Repository, path: &str) -> Option<String> {
    let tree = git
        .find_reference("refs/heads/main")
        .unwrap()
        .peel_to_tree()
        .unwrap();
    let entry = tree.get_path(Path::new(path)).ok()?;
    let blob = git.find_blob(entry.id()).ok()?;
    Some(String::from_utf8_lossy(blob.content()).into_owned())
}

impl Journal {
    /// `TaskLanded` events: (task, commit).
    fn landed(&self) -> Vec<(String, String)> {
        self.kinds
            .iter()
            .filter_map(|k| match k {
                EventKind::TaskLanded { task, commit, .. } => {
                    Some((task.to_string(), commit.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// The branch of `task`'s last `TaskLanding`.
    fn landing_branch(&self, task: &str) -> Option<String> {
        self.kinds.iter().rev().find_map(|k| match k {
            EventKind::TaskLanding {
                task: t, branch, ..
            } if t.to_string() == task => Some(branch.clone()),
            _ => None,
        })
    }

    fn gate_refused(&self, task: &str) -> bool {
        self.kinds.iter().any(|k| {
            matches!(k, EventKind::MergeGateFailed { tasks, .. }
                if tasks.iter().any(|t| t.to_string() == task))
        })
    }
}

/// Runs the landing scenario on a daemon that kills itself at fail point `point` (its first
/// hit), checks what the crash left, restarts the daemon and checks the finished run.
async fn crash_inside_a_landing(point: &str) {
    use std::os::unix::process::ExitStatusExt;

    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let git = git2::Repository::open(repo.path()).unwrap();
    let failpoints = format!("{point}=return");
    let mut daemon =
        DaemonProcess::start_with_env(state.path(), &[("FAILPOINTS", failpoints.as_str())]);
    assert!(
        daemon.log().contains("fail points are ACTIVE"),
        "an armed daemon says so loudly; log:\n{}",
        daemon.log()
    );
    let client = DaemonProcess::client(state.path());
    let run = submit(&client, repo.path(), landing_config()).await;

    // The daemon dies by its own hand, at the point.
    let status = daemon.exited_within(Duration::from_secs(90)).await;
    let Some(status) = status else {
        panic!(
            "{point}: the daemon was still running after 90 s; log:\n{}",
            daemon.log()
        );
    };
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "{point}: the daemon must die as kill -9 kills it ({status}); log:\n{}",
        daemon.log()
    );
    daemon
        .logged_within("fail point reached", Duration::from_secs(10))
        .await;
    assert!(
        daemon
            .log()
            .lines()
            .any(|l| l.contains("fail point reached") && l.contains(point)),
        "{point}: the kill came from that fail point; log:\n{}",
        daemon.log()
    );
    let journal = read_journal(state.path(), &run);
    assert!(
        !journal.finished(),
        "{point}: the crash came after the run had finished"
    );
    // It is the first landing: nothing is journaled as landed yet. Before the
    // compare-and-swap main has not moved; after it, main holds one batch the journal
    // does not know of, with its branches still there (after-cas) or already deleted
    // (before-event).
    assert_eq!(journal.landed(), Vec::new(), "{point}: nothing landed yet");
    let at_crash = main_history(&git, &run);
    match point {
        "merge::after-build" | "merge::after-gate" => assert!(
            at_crash.is_empty(),
            "{point}: main moved before the compare-and-swap"
        ),
        _ => {
            assert!(
                !at_crash.is_empty(),
                "{point}: main moved at the crash, before the journal heard"
            );
            for commit in &at_crash {
                for task in &commit.tasks {
                    let branch = journal.landing_branch(task).unwrap_or_else(|| {
                        panic!("{point}: {task} is on main without a journaled TaskLanding")
                    });
                    let exists = git.find_branch(&branch, git2::BranchType::Local).is_ok();
                    assert_eq!(
                        exists,
                        point == "merge::after-cas",
                        "{point}: {task}'s branch {branch} exists: {exists}"
                    );
                }
            }
        }
    }
    assert_eq!(
        ungated_commits(&git),
        Vec::new(),
        "{point}: main holds an ungated tree at the crash"
    );
    drop(daemon);

    // Restarted, without fail points: the run finishes.
    let daemon = DaemonProcess::start(state.path());
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(
        outcome(&events),
        Some(RunOutcome::Completed),
        "{point}: daemon log:\n{}",
        daemon.log()
    );
    drop(daemon);

    let journal = read_journal(state.path(), &run);
    let history = main_history(&git, &run);
    let context = format!(
        "{point}: main is\n{}",
        history
            .iter()
            .map(|c| format!("  {} {:?}", c.id, c.tasks))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // main never moved twice for one task: every commit flotilla put there names one task,
    // and every task is named by exactly one commit (the scripted agent's work is one
    // commit per attempt).
    let mut on_main: BTreeMap<String, git2::Oid> = BTreeMap::new();
    for commit in &history {
        assert_eq!(
            commit.tasks.len(),
            1,
            "{context}\n{} names {:?}",
            commit.id,
            commit.tasks
        );
        let task = &commit.tasks[0];
        assert!(
            on_main.insert(task.clone(), commit.id).is_none(),
            "{context}\nmain moved twice for {task}"
        );
    }
    let everyone: BTreeSet<String> = (1..=LANDERS).map(|n| format!("t{n}")).collect();
    assert_eq!(
        on_main.keys().cloned().collect::<BTreeSet<_>>(),
        everyone,
        "{context}"
    );
    // Each task landed once, in the journal, at the commit main has for it; its work is on
    // main's tip: no landed work lost.
    let landed = journal.landed();
    let mut landings: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (task, commit) in &landed {
        landings
            .entry(task.clone())
            .or_default()
            .push(commit.clone());
    }
    for n in 1..=LANDERS {
        let task = format!("t{n}");
        assert_eq!(
            landings.get(&task).map(Vec::len),
            Some(1),
            "{context}\n{task} must have exactly one TaskLanded: {landings:?}"
        );
        assert_eq!(
            landings[&task][0],
            on_main[&task].to_string(),
            "{context}\n{task} landed, says the journal, in another commit than main's"
        );
        assert_eq!(
            file_at_main(&git, &lander_file(n)).as_deref(),
            Some(lander_text(n).as_str()),
            "{context}\n{task}'s work is not on main's tip"
        );
    }
    // Never an ungated tree: t1's first attempt, once delivered, was refused by the gate
    // (it always is unless a very slow machine let the crash interrupt it first), and no
    // commit of main ever held it.
    let broken_delivered = journal.kinds.iter().any(|k| {
        matches!(k, EventKind::TaskLanding { task, attempt: 1, .. } if task.to_string() == "t1")
    });
    if broken_delivered {
        assert!(
            journal.gate_refused("t1"),
            "{point}: t1's broken attempt must have met the gate"
        );
    } else {
        eprintln!("{point}: t1's broken attempt was interrupted before it was delivered");
    }
    assert_eq!(
        ungated_commits(&git),
        Vec::new(),
        "{context}\nmain moved to an ungated tree"
    );
    // The user's clean checkout of main followed main, whatever the crash interrupted: on
    // main, at its tip, with nothing showing as changed (a checkout left on an older commit
    // would show the landed work reversed).
    let git = git2::Repository::open(repo.path()).unwrap();
    assert_eq!(
        git.find_reference("HEAD")
            .unwrap()
            .symbolic_target()
            .unwrap(),
        Some("refs/heads/main"),
        "{context}"
    );
    let changed: Vec<String> = git
        .statuses(Some(git2::StatusOptions::new().include_untracked(false)))
        .unwrap()
        .iter()
        .map(|s| format!("{:?} {}", s.status(), s.path().unwrap_or_default()))
        .collect();
    assert_eq!(changed, Vec::<String>::new(), "{context}");
    let interrupted = journal
        .kinds
        .iter()
        .filter(|k| matches!(k, EventKind::TaskInterrupted { .. }))
        .count();
    eprintln!(
        "{point}: {} commits on main, {} batch(es) in flight at the crash, {interrupted} interrupted attempts",
        history.len(),
        usize::from(!at_crash.is_empty()),
    );
}

#[tokio::test]
async fn a_crash_after_the_build_lands_nothing_ungated_and_everything_once() {
    crash_inside_a_landing("merge::after-build").await;
}

#[tokio::test]
async fn a_crash_after_the_gate_lands_everything_once() {
    crash_inside_a_landing("merge::after-gate").await;
}

#[tokio::test]
async fn a_crash_after_main_moved_finds_the_work_on_main_instead_of_landing_it_twice() {
    crash_inside_a_landing("merge::after-cas").await;
}

#[tokio::test]
async fn a_crash_after_the_branches_went_before_the_event_loses_no_landed_work() {
    crash_inside_a_landing("merge::before-event").await;
}

// ---------------------------------------------------------------------------------------
// M8 item 4 (ADR-018): trailers are not trusted. t1's agent commits its work itself with
// `Flotilla-Task:` lines naming t2…t6. The daemon is killed right after the second
// compare-and-swap (t2's), while t3…t6 wait to land. Before ADR-018 the restart took the
// forged trailers on main for their landings, with their files absent.

const FORGED: usize = 6;

fn forgery_scenario() -> String {
    let mut s = String::from("[agent]\ndelay_ms = 300\n\n[[planner.answers]]\ntasks = [\n");
    for n in 1..=FORGED {
        // The others wait for the forger: it lands first however loaded the machine is
        // (dependents start once their dependency is on main).
        let order = if n == 1 {
            ", priority = 1"
        } else {
            ", dependencies = [0]"
        };
        s.push_str(&format!(
            "  {{ description = \"write file {n}\", scope = [\"{}\"]{order} }},\n",
            lander_file(n)
        ));
    }
    s.push_str("]\n");
    // The forger's run id comes from its own branch's name (flotilla/<run>/t1).
    let forged: Vec<String> = (2..=FORGED)
        .map(|n| format!("Flotilla-Task: $run/t{n}"))
        .collect();
    let commit = format!(
        "run=$(git rev-parse --abbrev-ref HEAD | cut -d/ -f2) && git add -A && \
         git -c user.name=agent -c user.email=agent@example.com commit -q -m 'write file 1' \
         -m \"{}\"",
        forged.join("\n")
    );
    for n in 1..=FORGED {
        let step = if n == 1 {
            format!("delay_ms = 10\nrun = {commit:?}\n")
        } else {
            String::new()
        };
        s.push_str(&format!(
            "\n[tasks.t{n}]\n{step}writes = {{ \"{}\" = {:?} }}\n",
            lander_file(n),
            lander_text(n)
        ));
    }
    s
}

#[tokio::test]
async fn forged_trailers_and_a_kill_after_main_moved_record_no_landing_whose_work_is_absent() {
    use std::os::unix::process::ExitStatusExt;

    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let git = git2::Repository::open(repo.path()).unwrap();
    // The second compare-and-swap kills the daemon: one landing per batch, so t1 (the
    // forger, quick and first) is on main and journaled, and t2 is on main unjournaled.
    let mut daemon = DaemonProcess::start_with_env(
        state.path(),
        &[("FAILPOINTS", "merge::after-cas=1*off->return")],
    );
    let client = DaemonProcess::client(state.path());
    let mut config = run_config(&forgery_scenario(), FORGED);
    config["merge"]["batch_max"] = serde_json::json!(1);
    // The forger commits in its worktree: possible only without the sandbox (whose `.git`
    // is read-only), which a user may choose; trailers must not be trusted even then.
    config["sandbox"] = serde_json::json!("none");
    let run = submit(&client, repo.path(), config).await;
    let status = daemon.exited_within(Duration::from_secs(90)).await;
    let Some(status) = status else {
        panic!(
            "the daemon was still running after 90 s; log:\n{}",
            daemon.log()
        );
    };
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "log:\n{}",
        daemon.log()
    );
    let journal = read_journal(state.path(), &run);
    assert!(!journal.finished());
    let landed_before: Vec<String> = journal.landed().into_iter().map(|(t, _)| t).collect();
    assert_eq!(landed_before, vec!["t1".to_string()], "t1 first, alone");
    // The forgery is real: t1's delivered commit carries t2…t6's trailers.
    let forger_head = journal
        .kinds
        .iter()
        .find_map(|k| match k {
            EventKind::TaskLanding { task, head, .. } if task.to_string() == "t1" => {
                Some(head.clone())
            }
            _ => None,
        })
        .unwrap();
    let message = git
        .find_commit(forger_head.parse().unwrap())
        .unwrap()
        .message()
        .unwrap()
        .to_string();
    assert!(
        message.contains(&format!(
            "Flotilla-Task: {}/t{FORGED}",
            run.replace('-', "")
        )),
        "{message}"
    );
    let waiting = journal
        .kinds
        .iter()
        .filter(|k| matches!(k, EventKind::TaskLanding { .. }))
        .count();
    eprintln!("{waiting} deliveries journaled at the kill");
    drop(daemon);

    let daemon = DaemonProcess::start(state.path());
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(
        outcome(&events),
        Some(RunOutcome::Completed),
        "daemon log:\n{}",
        daemon.log()
    );
    drop(daemon);

    let journal = read_journal(state.path(), &run);
    let history = main_history(&git, &run);
    let on_main: BTreeSet<git2::Oid> = history.iter().map(|c| c.id).collect();
    // No forged line reached main: each of flotilla's commits names its own task once.
    for commit in &history {
        assert_eq!(
            commit.tasks.len(),
            1,
            "{} names {:?}",
            commit.id,
            commit.tasks
        );
    }
    let mut landed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (task, commit) in journal.landed() {
        landed.entry(task).or_default().push(commit);
    }
    for n in 1..=FORGED {
        let task = format!("t{n}");
        let commits = landed.get(&task).cloned().unwrap_or_default();
        assert_eq!(commits.len(), 1, "{task} lands once: {landed:?}");
        let commit: git2::Oid = commits[0].parse().unwrap();
        assert!(
            on_main.contains(&commit),
            "{task}'s landing {commit} is on main"
        );
        // The commit the journal names holds the task's work.
        let tree = git.find_commit(commit).unwrap().tree().unwrap();
        let entry = tree
            .get_path(Path::new(&lander_file(n)))
            .unwrap_or_else(|_| panic!("{task} recorded landed at {commit} without its file"));
        let blob = git.find_blob(entry.id()).unwrap();
        assert_eq!(blob.content(), lander_text(n).as_bytes());
        assert_eq!(
            file_at_main(&git, &lander_file(n)).as_deref(),
            Some(lander_text(n).as_str())
        );
    }
}

/// A daemon that died outright can leave a sandbox's namespace running (bwrap's init asks
/// for its parent's death signal only a while after it was forked): the next daemon on the
/// same state directory ends every process carrying that directory's mark before it starts
/// anything, and nothing carrying another's.
#[tokio::test]
async fn a_restarted_daemon_ends_what_the_dead_one_left_running() {
    use flotilla::process::left_behind::DaemonMark;
    use std::os::unix::process::ExitStatusExt;
    let state = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let token = format!("4003.{}", std::process::id());
    let start = |mark: DaemonMark| {
        std::process::Command::new("sleep")
            .arg(&token)
            .envs([mark.variable()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut left = start(DaemonMark::of(state.path()).unwrap());
    let mut other = start(DaemonMark::of(elsewhere.path()).unwrap());

    let daemon = DaemonProcess::start(state.path());
    let logged = daemon
        .logged_within(
            "ended what a previous daemon on this state directory left running",
            Duration::from_secs(10),
        )
        .await;
    // The scan is over once it logged: what it did not end by then, it never will. A
    // SIGKILL is sent by then, but the process dies only once it is next scheduled: waited
    // for, up to a bound.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        match left.try_wait().unwrap() {
            Some(status) => break Some(status),
            None if std::time::Instant::now() >= deadline => break None,
            None => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    let alive = other.try_wait().unwrap().is_none();
    for child in [&mut left, &mut other] {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(
        logged,
        "the daemon said what it ended; log:\n{}",
        daemon.log()
    );
    assert_eq!(
        status.and_then(|s| s.signal()),
        Some(libc::SIGKILL),
        "the process the dead daemon left was ended"
    );
    assert!(alive, "another state directory's process runs on");
}
