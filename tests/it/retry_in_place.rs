//! `[worktrees] retry_in_place` (ADR-031): a retry continues the failed attempt's branch.
//! At the git layer, `WorktreeStart::Continue` starts at the failed tip with the base where
//! that branch left main (so the scope check covers both attempts), falls back to main when
//! the branch is gone, and the sweep spares the kept branches. Through the daemon: attempt 2
//! sees and lands attempt 1's work with the option on and not with it off, an out-of-scope
//! edit of attempt 1 still fails attempt 2, the merge queue and a restart's sweep spare the
//! branch while the retry is pending, and no `flotilla/*` branch outlives the run.

use std::path::Path;

use flotilla::config::FileConfig;
use flotilla::git::worktrees::GitWorktrees;
use flotilla_actors::ports::{BranchFate, SweepKeep, WorktreeRequest, WorktreeStart, Worktrees};
use flotilla_actors::protocol::*;
use flotilla_actors::testing::{PATIENCE, within};

use crate::daemon_env::*;

fn request(run: RunId, task: &str, attempt: u32, start: WorktreeStart) -> WorktreeRequest {
    let task: TaskId = task.parse().unwrap();
    WorktreeRequest {
        branch: branch_name(run, &task, attempt),
        task,
        attempt,
        start,
    }
}

fn tip(repo: &Path, refname: &str) -> Option<String> {
    git2::Repository::open(repo)
        .unwrap()
        .refname_to_id(refname)
        .ok()
        .map(|id| id.to_string())
}

fn flotilla_branches(repo: &Path) -> Vec<String> {
    let git = git2::Repository::open(repo).unwrap();
    let mut names: Vec<String> = git
        .branches(Some(git2::BranchType::Local))
        .unwrap()
        .map(|b| b.unwrap().0.name().unwrap().unwrap().to_string())
        .filter(|n| n.starts_with("flotilla/"))
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_continued_branch_starts_at_the_failed_tip_and_its_diff_covers_both_attempts() {
    let repo = git_repo();
    let state = tempfile::tempdir().unwrap();
    let run = RunId::generate();
    let worktrees = GitWorktrees::new(repo.path(), run, state.path().join("wt"), main_branch());
    let left_main = tip(repo.path(), "refs/heads/main").unwrap();

    // Attempt 1 writes a, fails, keeps its branch.
    let first = worktrees
        .prepare(request(run, "t1", 1, WorktreeStart::Main))
        .await
        .unwrap();
    std::fs::write(first.path.join("a.txt"), "a\n").unwrap();
    worktrees.seal(first.clone(), "t1".into()).await.unwrap();
    worktrees
        .release(first.clone(), BranchFate::Keep)
        .await
        .unwrap();
    // main moves on meanwhile (another task landed).
    let git = git2::Repository::open(repo.path()).unwrap();
    commit_files(&git, &[("other.txt", "other\n")], "another task");
    assert_ne!(tip(repo.path(), "refs/heads/main").unwrap(), left_main);

    // Attempt 2 continues it: a is there, the base is where attempt 1 left main.
    let continued = WorktreeStart::Continue {
        branch: first.branch.clone(),
    };
    let second = worktrees
        .prepare(request(run, "t1", 2, continued))
        .await
        .unwrap();
    assert_eq!(
        second.continued_from.as_deref(),
        Some(first.branch.as_str())
    );
    assert_eq!(
        second.base, left_main,
        "the base is where attempt 1 left main"
    );
    assert_eq!(
        std::fs::read_to_string(second.path.join("a.txt")).unwrap(),
        "a\n"
    );
    std::fs::write(second.path.join("b.txt"), "b\n").unwrap();
    let work = worktrees.seal(second.clone(), "t1".into()).await.unwrap();
    let files: Vec<&str> = work.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        files,
        ["a.txt", "b.txt"],
        "both attempts' work, nothing of main's"
    );
    // Released, the continued branch goes: its work is on attempt 2's.
    worktrees
        .release(second.clone(), BranchFate::Keep)
        .await
        .unwrap();
    assert_eq!(
        flotilla_branches(repo.path()),
        std::slice::from_ref(&second.branch)
    );

    // A continuation whose branch is gone starts from main, and says so.
    let gone = WorktreeStart::Continue {
        branch: branch_name(run, &"t2".parse().unwrap(), 1),
    };
    let fresh = worktrees
        .prepare(request(run, "t2", 2, gone))
        .await
        .unwrap();
    assert_eq!(fresh.continued_from, None);
    assert_eq!(fresh.base, tip(repo.path(), "refs/heads/main").unwrap());
    assert!(!fresh.path.join("a.txt").exists());

    // A restart's sweep spares a branch kept for a pending retry, and nothing else that
    // was not delivered; the run's last sweep takes it.
    let swept = worktrees
        .sweep(SweepKeep {
            delivered: Some(Vec::new()),
            branches: vec![second.branch.clone()],
            ..SweepKeep::default()
        })
        .await
        .unwrap();
    assert!(swept.worktrees.contains(&fresh.path));
    assert_eq!(
        flotilla_branches(repo.path()),
        std::slice::from_ref(&second.branch)
    );
    worktrees
        .sweep(SweepKeep {
            delivered: Some(Vec::new()),
            closing: true,
            ..SweepKeep::default()
        })
        .await
        .unwrap();
    assert_eq!(flotilla_branches(repo.path()), Vec::<String>::new());
}

/// A gate that refuses every line with BROKEN in it.
const GATE: &str = "! grep -rn --exclude-dir=.git BROKEN .";

/// Attempt 1 writes a and a file the gate refuses; attempt 2 removes that file and writes
/// b. With the option on, attempt 2 must be told it continues attempt 1's work.
const CONTINUED: &str = r####"
[[planner.answers]]
tasks = [{ description = "write a and b", scope = ["src"], acceptance = "a and b" }]

[[tasks.t1.attempts]]
writes = { "src/a.txt" = "a\n", "src/bad.txt" = "BROKEN\n" }

[[tasks.t1.attempts]]
expect_in_task = ["## Previous attempt (1) failed", "continuing attempt 1's work"]
deletes = ["src/bad.txt"]
writes = { "src/b.txt" = "b\n" }
"####;

/// The same retry with the option off: a fresh branch, without attempt 1's a.
const FRESH: &str = r####"
[[planner.answers]]
tasks = [{ description = "write a and b", scope = ["src"], acceptance = "a and b" }]

[[tasks.t1.attempts]]
writes = { "src/a.txt" = "a\n", "src/bad.txt" = "BROKEN\n" }

[[tasks.t1.attempts]]
expect_in_task = ["## Previous attempt (1) failed", "on a fresh branch without that attempt's work"]
writes = { "src/b.txt" = "b\n" }
"####;

fn config(scenario: &str, in_place: bool) -> serde_json::Value {
    let mut config = run_config(scenario, 1);
    config["merge"]["gate"] = serde_json::json!([GATE]);
    config["limits"]["max_attempts"] = serde_json::json!(3);
    config["worktrees"] = serde_json::json!({ "retry_in_place": in_place });
    config
}

/// The text of `path` on main, if it is there.
fn on_main(repo: &Path, path: &str) -> Option<String> {
    let git = git2::Repository::open(repo).unwrap();
    let blob = git.revparse_single(&format!("main:{path}")).ok()?;
    String::from_utf8(blob.as_blob()?.content().to_vec()).ok()
}

/// The files of the handoff `attempt` of t1 delivered to the merge queue.
fn delivered_files(events: &[Event], attempt: u32) -> Vec<String> {
    events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::TaskLanding {
                attempt: a,
                handoff,
                ..
            } if *a == attempt => handoff.as_ref().and_then(|h| h.work.as_ref()),
            _ => None,
        })
        .map(|w| w.files.iter().map(|f| f.path.clone()).collect())
        .unwrap_or_default()
}

async fn run_to_end(
    daemon: &InProcessDaemon,
    repo: &Path,
    config: serde_json::Value,
) -> Vec<Event> {
    let run = submit(&daemon.client, repo, config).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    // The run's last sweep (branches and worktrees) runs after its actors stopped.
    let run_dir = daemon.state_dir().join("worktrees").join(&run);
    within(PATIENCE, || async { (!run_dir.exists()).then_some(()) }).await;
    events
}

#[tokio::test]
async fn with_the_option_the_retry_continues_the_failed_attempts_work_and_lands_both() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let events = run_to_end(&daemon, repo.path(), config(CONTINUED, true)).await;
    assert_eq!(
        outcome(&events),
        Some(RunOutcome::Completed),
        "an unmet expectation crashes the step"
    );
    assert_eq!(
        delivered_files(&events, 2),
        ["src/a.txt", "src/b.txt"],
        "attempt 2's handoff holds attempt 1's a and its own b (bad.txt removed)"
    );
    assert_eq!(on_main(repo.path(), "src/a.txt").as_deref(), Some("a\n"));
    assert_eq!(on_main(repo.path(), "src/b.txt").as_deref(), Some("b\n"));
    assert_eq!(on_main(repo.path(), "src/bad.txt"), None);
    // The merge queue spared attempt 1's branch for the retry (else attempt 2 would have
    // been told it starts from main), and nothing is left once the run is over.
    assert_eq!(flotilla_branches(repo.path()), Vec::<String>::new());
}

#[tokio::test]
async fn without_the_option_the_retry_starts_again_from_main() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let events = run_to_end(&daemon, repo.path(), config(FRESH, false)).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    assert_eq!(delivered_files(&events, 2), ["src/b.txt"]);
    assert_eq!(
        on_main(repo.path(), "src/a.txt"),
        None,
        "attempt 1's work is not on main"
    );
    assert_eq!(on_main(repo.path(), "src/b.txt").as_deref(), Some("b\n"));
    assert_eq!(flotilla_branches(repo.path()), Vec::<String>::new());
}

/// Attempt 1 fails with work on its branch and no attempt is left: the branch kept for a
/// retry that never comes goes with the run.
const NO_RETRY_LEFT: &str = r####"
[[planner.answers]]
tasks = [{ description = "write a", scope = ["src"], acceptance = "a" }]

[[tasks.t1.attempts]]
writes = { "src/a.txt" = "a\n" }
outcome = "failed"
"####;

/// The same when the merge gate failed it: the queue spared the branch, which the journal
/// records as handed to it, yet it goes with the run.
const GATE_NO_RETRY_LEFT: &str = r####"
[[planner.answers]]
tasks = [{ description = "write a", scope = ["src"], acceptance = "a" }]

[[tasks.t1.attempts]]
writes = { "src/a.txt" = "BROKEN\n" }
"####;

#[tokio::test]
async fn a_branch_kept_for_a_retry_that_never_comes_goes_with_the_run() {
    for scenario in [NO_RETRY_LEFT, GATE_NO_RETRY_LEFT] {
        let daemon = InProcessDaemon::start(false);
        let repo = git_repo();
        let mut config = config(scenario, true);
        config["limits"]["max_attempts"] = serde_json::json!(1);
        let events = run_to_end(&daemon, repo.path(), config).await;
        assert!(
            events.iter().any(|e| matches!(
                &e.kind,
                EventKind::TaskFailed { task, .. } if task.to_string() == "t1"
            )),
            "t1 failed for good"
        );
        assert_eq!(flotilla_branches(repo.path()), Vec::<String>::new());
    }
}

/// Attempt 1 writes notes.txt outside its scope; attempt 2, continuing, leaves it there and
/// is refused for it all the same; attempt 3 removes it and lands.
const OUT_OF_SCOPE: &str = r####"
[[planner.answers]]
tasks = [{ description = "write a", scope = ["src/a.txt"], acceptance = "a" }]

[[tasks.t1.attempts]]
writes = { "src/a.txt" = "a\n", "notes.txt" = "mine\n" }

[[tasks.t1.attempts]]
expect_in_task = ["continuing attempt 1's work", "- notes.txt\n"]
writes = { "src/a.txt" = "a, again\n" }

[[tasks.t1.attempts]]
expect_in_task = ["continuing attempt 2's work", "- notes.txt\n"]
deletes = ["notes.txt"]
"####;

#[tokio::test]
async fn an_out_of_scope_edit_of_the_continued_attempt_still_fails_the_retry() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let events = run_to_end(&daemon, repo.path(), config(OUT_OF_SCOPE, true)).await;
    let retried: Vec<(u32, AttemptFailure)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TaskRetried {
                attempt, failure, ..
            } => Some((*attempt, failure.clone())),
            _ => None,
        })
        .collect();
    let notes = vec!["notes.txt".to_string()];
    assert!(
        matches!(&retried[..], [
            (1, AttemptFailure::OutOfScope { paths: first }),
            (2, AttemptFailure::OutOfScope { paths: second }),
        ] if *first == notes && *second == notes),
        "attempt 2 did not touch notes.txt, but its branch holds attempt 1's edit: {retried:?}"
    );
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    assert_eq!(delivered_files(&events, 3), ["src/a.txt"]);
    assert_eq!(on_main(repo.path(), "notes.txt"), None);
    assert_eq!(
        on_main(repo.path(), "src/a.txt").as_deref(),
        Some("a, again\n")
    );
    assert_eq!(flotilla_branches(repo.path()), Vec::<String>::new());
}

/// Attempt 1 writes a and reports failure (never delivered: no landing keeps its branch);
/// attempt 2 (continuing) hangs until the daemon is killed; attempt 3, after the restart,
/// must continue attempt 1's work too: the restart's sweep spared that branch, and the
/// start is the same.
const CONTINUED_AFTER_KILL: &str = r####"
[[planner.answers]]
tasks = [{ description = "write a and b", scope = ["src"], acceptance = "a and b" }]

[[tasks.t1.attempts]]
writes = { "src/a.txt" = "a\n" }
outcome = "failed"

[[tasks.t1.attempts]]
expect_in_task = ["continuing attempt 1's work"]
outcome = "hang"

[[tasks.t1.attempts]]
expect_in_task = ["## Previous attempt (1) failed", "continuing attempt 1's work"]
writes = { "src/b.txt" = "b\n" }
"####;

#[tokio::test]
async fn after_a_sigkill_the_resumed_retry_still_continues_the_failed_attempt() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let daemon = DaemonProcess::start(state.path());
    let client = DaemonProcess::client(state.path());
    let mut config = config(CONTINUED_AFTER_KILL, true);
    config["limits"]["max_attempts"] = serde_json::json!(2);
    let run = submit(&client, repo.path(), config).await;

    until_attempt_starts(&client, &run, 2, &daemon).await;
    daemon.kill();

    let daemon = DaemonProcess::start(state.path());
    let events = follow_to_end(&client, &run, None).await;
    assert!(
        events
            .iter()
            .any(|e| matches!(e.kind, EventKind::TaskInterrupted { attempt: 2, .. })),
        "the kill interrupted attempt 2"
    );
    assert_eq!(
        outcome(&events),
        Some(RunOutcome::Completed),
        "attempt 3 was told it continues attempt 1; log:\n{}",
        daemon.log()
    );
    assert_eq!(delivered_files(&events, 3), ["src/a.txt", "src/b.txt"]);
    let run_dir = state.path().join("worktrees").join(&run);
    within(PATIENCE, || async { (!run_dir.exists()).then_some(()) }).await;
    assert_eq!(flotilla_branches(repo.path()), Vec::<String>::new());
}

#[test]
fn the_issues_spelling_under_workers_says_where_the_option_lives() {
    let problem = FileConfig::parse("[workers]\nretry_in_place = true\n").unwrap_err();
    let text = format!("{problem:?}");
    assert!(text.contains("[[workers]]"), "{text}");
    assert!(
        text.contains("write `retry_in_place = true` under `[worktrees]`"),
        "{text}"
    );
    let parsed = FileConfig::parse("[worktrees]\nretry_in_place = true\n").unwrap();
    assert!(parsed.worktrees.retry_in_place);
    assert!(
        !FileConfig::default().worktrees.retry_in_place,
        "off by default"
    );
    // A profile's own mistakes are still named as before.
    let problem = FileConfig::parse("[[workers]]\nname = \"a\"\ncost = \"x\"\n").unwrap_err();
    let text = format!("{problem:?}");
    assert!(
        text.contains("wrong type") && !text.contains("two brackets"),
        "{text}"
    );
}

#[test]
fn the_retry_section_says_which_start_it_was() {
    let failure = AttemptFailure::Reported {
        summary: "tests fail".into(),
    };
    let previous = PreviousAttempt::new(1, &failure, &[]);
    let text = |p: PreviousAttempt| flotilla::agents::previous_attempt_text(&p);
    assert!(
        text(previous.clone().starting(RetryStart::Continued))
            .contains("This is a retry continuing attempt 1's work")
    );
    assert!(
        text(previous.clone().starting(RetryStart::FromMain))
            .contains("This is a retry starting again from main")
    );
    assert!(text(previous).contains("on a fresh branch without that attempt's work"));
}
