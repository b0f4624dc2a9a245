//! Nothing left behind (ADR-021): `flotilla gc` and the daemon's start-up collection find a
//! finished run's leftovers by name (stale ref locks, worktrees, task branches), a dry run
//! names exactly what a collection then removes, a kill in the middle leaves nothing a
//! later collection cannot remove, and a task that changed nothing leaves no branch.

use std::path::Path;
use std::time::Duration;

use flotilla::git::worktrees::GitWorktrees;
use flotilla_actors::ports::{WorktreeRequest, WorktreeStart, Worktrees};
use flotilla_actors::protocol::{RunId, TaskId, branch_name};

use crate::daemon_env::*;

const ONE_TASK: &str = r#"
[[planner.answers]]
tasks = [{ description = "one", scope = ["a.rs"] }]
[tasks.t1]
writes = { "a.rs" = "fn a() {}\n" }
"#;

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

fn ref_locks(repo: &Path) -> Vec<String> {
    fn walk(dir: &Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "lock") {
                found.push(path.display().to_string());
            }
        }
    }
    let mut found = Vec::new();
    walk(&repo.join(".git/refs/heads/flotilla"), &mut found);
    found
}

/// What a finished run's crashes and cancels leave: a worktree (t6), branches of an
/// interrupted attempt (t7) and of a delivered task never landed (t8-a2), a stale lock of a
/// ref being created (t9) and one beside an existing branch (t8-a2).
async fn leave_leftovers(repo: &Path, state: &Path, run: &str, tag: &str) -> Vec<String> {
    let run_id = RunId::from_uuid(run.parse().unwrap());
    let dir = state.join("worktrees").join(run);
    let task = |t: &str| -> TaskId { format!("{t}{tag}").parse().unwrap() };
    let worktree = GitWorktrees::new(repo, run_id, &dir, main_branch())
        .prepare(WorktreeRequest {
            branch: branch_name(run_id, &task("t6"), 1),
            task: task("t6"),
            attempt: 1,
            start: WorktreeStart::Main,
        })
        .await
        .unwrap();
    let git = git2::Repository::open(repo).unwrap();
    let main = git.head().unwrap().peel_to_commit().unwrap();
    let t7 = branch_name(run_id, &task("t7"), 1);
    let t8 = branch_name(run_id, &task("t8"), 2);
    git.branch(&t7, &main, false).unwrap();
    git.branch(&t8, &main, false).unwrap();
    let refs = repo.join(".git/refs/heads");
    std::fs::write(
        refs.join(format!("{}.lock", branch_name(run_id, &task("t9"), 1))),
        "",
    )
    .unwrap();
    std::fs::write(refs.join(format!("{t8}.lock")), "").unwrap();
    let mut branches = vec![worktree.branch, t7, t8];
    branches.sort();
    branches
}

/// A daemon on a fresh state directory that ran `ONE_TASK` on a fresh repository to its
/// end and cleaned up after it: the state, the repository, the daemon, the run's id.
async fn one_finished_run() -> (tempfile::TempDir, tempfile::TempDir, DaemonProcess, String) {
    one_finished_run_with(run_config(ONE_TASK, 1)).await
}

/// [`one_finished_run`] with `config`.
async fn one_finished_run_with(
    config: serde_json::Value,
) -> (tempfile::TempDir, tempfile::TempDir, DaemonProcess, String) {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let daemon = DaemonProcess::start(state.path());
    let client = DaemonProcess::client(state.path());
    let run = submit(&client, repo.path(), config).await;
    follow_to_end(&client, &run, None).await;
    daemon
        .logged_within("cleaned up after the run", Duration::from_secs(30))
        .await;
    (state, repo, daemon, run)
}

fn gc_json(state: &Path, dry_run: bool) -> serde_json::Value {
    let mut cmd = assert_cmd::Command::cargo_bin("flotilla").unwrap();
    cmd.arg("--state-dir")
        .arg(state)
        .env("NO_COLOR", "1")
        .env_remove("FLOTILLA_SOCKET")
        .args(["gc", "--json"]);
    if dry_run {
        cmd.arg("--dry-run");
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn sorted(value: &serde_json::Value, key: &str) -> Vec<String> {
    let mut items: Vec<String> = value[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    items.sort();
    items
}

#[tokio::test]
async fn a_dry_run_names_exactly_what_gc_removes_and_a_second_gc_finds_nothing() {
    // The run's own end sweeps; what follows is what crashes leave past it.
    let (state, repo, daemon, run) = one_finished_run().await;
    let branches = leave_leftovers(repo.path(), state.path(), &run, "").await;
    assert_eq!(ref_locks(repo.path()).len(), 2);

    let dry = gc_json(state.path(), true);
    assert_eq!(sorted(&dry, "branches"), branches, "{dry}");
    assert_eq!(sorted(&dry, "locks").len(), 2, "{dry}");
    assert_eq!(sorted(&dry, "worktrees").len(), 1, "{dry}");
    assert_eq!(
        flotilla_branches(repo.path()),
        branches,
        "a dry run removes nothing"
    );

    let done = gc_json(state.path(), false);
    for key in ["worktrees", "branches", "locks", "unknown", "errors"] {
        assert_eq!(
            sorted(&dry, key),
            sorted(&done, key),
            "{key}: {dry} vs {done}"
        );
    }
    assert_eq!(flotilla_branches(repo.path()), Vec::<String>::new());
    assert_eq!(ref_locks(repo.path()), Vec::<String>::new());
    assert!(!state.path().join("worktrees").join(&run).exists());
    let again = gc_json(state.path(), false);
    for key in ["worktrees", "branches", "locks", "unknown"] {
        assert_eq!(sorted(&again, key), Vec::<String>::new(), "{again}");
    }
    drop(daemon);
}

/// A finished run leaves its workspace for the repository's next run (ADR-052), and its
/// gate's warm tree (ADR-055): `status` says so, and gc keeps a live repository's pool and
/// warm trees, neither removing them nor naming them.
#[tokio::test]
async fn a_finished_runs_workspace_waits_in_its_repositorys_pool_through_gc() {
    let mut config = run_config(ONE_TASK, 1);
    config["merge"]["gate"] = serde_json::json!(["git rev-parse HEAD"]);
    let (state, repo, daemon, run) = one_finished_run_with(config).await;
    let warm = flotilla::git::slots::repository_dir(
        &state.path().join("worktrees"),
        flotilla::git::warm::WARM_DIR,
        repo.path(),
    )
    .unwrap();
    let warm_tree = flotilla::git::warm::tree_dir(&warm, flotilla_actors::ports::WarmSlot::Gate);
    assert!(
        warm_tree.join(".git").is_dir(),
        "the gate's warm tree stays"
    );
    let pool = flotilla::git::slots::repository_pool(&state.path().join("worktrees"), repo.path())
        .unwrap();
    let pooled = || {
        std::fs::read_dir(&pool)
            .map(|e| {
                e.flatten()
                    .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                    .count()
            })
            .unwrap_or(0)
    };
    assert_eq!(pooled(), 1, "the run's one workspace waits");
    let status = assert_cmd::Command::cargo_bin("flotilla")
        .unwrap()
        .arg("--state-dir")
        .arg(state.path())
        .env("NO_COLOR", "1")
        .env_remove("FLOTILLA_SOCKET")
        .args(["status", &run, "--json"])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let line = status["pool"]
        .as_str()
        .unwrap_or_else(|| panic!("{status}"));
    assert!(
        line.starts_with("1 workspace kept for the repository's next run, ")
            && line.ends_with(" MiB of 2048 MiB"),
        "{line}"
    );

    assert!(
        status["warm"]
            .as_str()
            .is_some_and(|l| l.starts_with("gate ")),
        "{status}"
    );

    for dry_run in [true, false] {
        let done = gc_json(state.path(), dry_run);
        assert_eq!(sorted(&done, "unknown"), Vec::<String>::new(), "{done}");
        assert_eq!(pooled(), 1, "kept by gc");
        assert!(warm_tree.join(".git").is_dir(), "kept by gc");
    }
    drop(daemon);
}

/// Only a run whose sandbox ends every process leaves workspaces for the next run
/// (ADR-052): without one (`[sandbox] mode = "none"`) a process may outlive the run and
/// write into them after they were cleaned.
#[tokio::test]
async fn a_run_without_a_sandbox_leaves_no_workspace_for_the_next_run() {
    let mut config = run_config(ONE_TASK, 1);
    config["sandbox"]["mode"] = "none".into();
    let (state, repo, daemon, _run) = one_finished_run_with(config).await;
    let pool = flotilla::git::slots::repository_pool(&state.path().join("worktrees"), repo.path())
        .unwrap();
    assert!(!pool.exists(), "no pool made");
    drop(daemon);
}

/// The start-up collection runs in the background once the daemon listens, logs its
/// progress, and a kill in its middle (worktrees gone, branches not yet) leaves nothing the
/// next start cannot collect.
#[tokio::test]
async fn a_kill_in_the_middle_of_the_start_up_collection_leaves_nothing_for_good() {
    let (state, repo, daemon, run) = one_finished_run().await;
    let branches = leave_leftovers(repo.path(), state.path(), &run, "").await;
    daemon.kill();

    let mut dying = DaemonProcess::start_with_env(
        state.path(),
        &[("FAILPOINTS", "gc::after-worktrees=return")],
    );
    assert!(
        dying.exited_within(Duration::from_secs(60)).await.is_some(),
        "the collection reached its fail point; log:\n{}",
        dying.log()
    );
    // Killed past the worktrees: the branches are what is left, with no worktree or
    // directory of the run to find them by.
    assert_eq!(flotilla_branches(repo.path()), branches);
    assert_eq!(ref_locks(repo.path()), Vec::<String>::new());
    drop(dying);

    let daemon = DaemonProcess::start(state.path());
    assert!(
        daemon
            .logged_within("collection done", Duration::from_secs(60))
            .await,
        "{}",
        daemon.log()
    );
    assert!(
        daemon
            .log()
            .contains("collecting what finished runs left behind"),
        "progress in the log"
    );
    assert_eq!(flotilla_branches(repo.path()), Vec::<String>::new());
    assert!(!state.path().join("worktrees").join(&run).exists());
    let again = gc_json(state.path(), true);
    for key in ["worktrees", "branches", "locks", "unknown"] {
        assert_eq!(sorted(&again, key), Vec::<String>::new(), "{again}");
    }
    drop(daemon);
}

#[tokio::test]
async fn a_task_that_changes_nothing_leaves_no_branch() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let daemon = DaemonProcess::start(state.path());
    let client = DaemonProcess::client(state.path());
    let scenario = r#"
[[planner.answers]]
tasks = [
  { description = "look only", scope = ["a.rs"] },
  { description = "write", scope = ["b.rs"] },
]
[tasks.t2]
writes = { "b.rs" = "fn b() {}\n" }
"#;
    let run = submit(&client, repo.path(), run_config(scenario, 2)).await;
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(
        outcome(&events),
        Some(flotilla_actors::protocol::RunOutcome::Completed),
        "{}",
        daemon.log()
    );
    assert_eq!(flotilla_branches(repo.path()), Vec::<String>::new());
    drop(daemon);
}
