//! Any target branch (ADR-022): a run lands on `[merge] branch`, or on the branch the
//! repository's HEAD names, or (HEAD detached) on its only branch; never on a `main` it
//! made up. Whole offline runs on `master`, on a configured branch that HEAD is not on, and
//! on a detached checkout; and the submissions refused before a run exists.

use std::path::Path;

use crate::daemon_env::flotilla;
use flotilla::cli::client::ClientError;
use flotilla::git::reader::GitRepo;
use flotilla::git::target::TargetBranch;
use flotilla_actors::ports::{MainRef, MainRefError};
use flotilla_actors::protocol::{EventKind, RunOutcome};

use crate::daemon_env::{
    DaemonProcess, InProcessDaemon, commit_files, follow_to_end, outcome, run_config,
};

/// Two tasks that write files, the second after the first has landed.
const SCENARIO: &str = r#"
[[planner.answers]]
tasks = [
  { description = "the lexer", scope = ["src/lex.rs"] },
  { description = "the parser", scope = ["src/parse.rs"], dependencies = [0] },
]

[tasks.t1]
writes = { "src/lex.rs" = "pub fn lex() {}\n" }

[tasks.t2]
writes = { "src/parse.rs" = "pub fn parse() {}\n" }
"#;

/// A repository whose HEAD is on `branch`, with one commit (a README).
fn repo_on(branch: &str) -> (tempfile::TempDir, git2::Repository) {
    let dir = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init_opts(
        dir.path(),
        git2::RepositoryInitOptions::new().initial_head(branch),
    )
    .unwrap();
    commit_files(&repo, &[("README.md", "a test repository\n")], "start");
    (dir, repo)
}

fn branch_tip(repo: &git2::Repository, branch: &str) -> Option<git2::Oid> {
    repo.refname_to_id(&format!("refs/heads/{branch}")).ok()
}

/// The tasks whose trailer is on `branch`'s first-parent history.
fn landed_on(repo: &git2::Repository, branch: &str) -> Vec<String> {
    let mut landed = Vec::new();
    let mut commit = repo.find_commit(branch_tip(repo, branch).unwrap()).ok();
    while let Some(c) = commit {
        for line in c.message().unwrap_or_default().lines() {
            if let Some(task) = line
                .strip_prefix("Flotilla-Task:")
                .and_then(|t| t.rsplit('/').next())
            {
                landed.push(task.trim().to_string());
            }
        }
        commit = c.parent(0).ok();
    }
    landed.sort();
    landed
}

fn local_branches(repo: &git2::Repository) -> Vec<String> {
    let mut names: Vec<String> = repo
        .branches(Some(git2::BranchType::Local))
        .unwrap()
        .map(|b| b.unwrap().0.name().unwrap().unwrap().to_string())
        .collect();
    names.sort();
    names
}

/// Nothing modified, staged or untracked against HEAD, and no worktree left registered.
fn assert_clean(path: &Path) {
    let repo = git2::Repository::open(path).unwrap();
    let statuses = repo
        .statuses(Some(git2::StatusOptions::new().include_untracked(true)))
        .unwrap();
    let dirty: Vec<String> = statuses
        .iter()
        .map(|s| format!("{:?} {}", s.status(), s.path().unwrap_or("?")))
        .collect();
    assert!(dirty.is_empty(), "the checkout is not clean: {dirty:?}");
    assert_eq!(repo.worktrees().unwrap().len(), 0, "a worktree is left");
}

/// What a finished run left in `repo`: its two tasks on `target`, no task branch, no
/// `main` unless there was one.
fn assert_landed_on(repo: &git2::Repository, target: &str, branches_before: &[String]) {
    assert_eq!(
        landed_on(repo, target),
        ["t1", "t2"],
        "the work is on {target}"
    );
    assert_eq!(
        local_branches(repo),
        branches_before,
        "no branch made (no main, no flotilla/*), none removed"
    );
    let tree = repo
        .find_commit(branch_tip(repo, target).unwrap())
        .unwrap()
        .tree()
        .unwrap();
    for path in ["src/lex.rs", "src/parse.rs", "README.md"] {
        assert!(
            tree.get_path(Path::new(path)).is_ok(),
            "{target} has {path}"
        );
    }
}

async fn run_to_end(
    daemon: &InProcessDaemon,
    repo: &Path,
    config: serde_json::Value,
) -> (serde_json::Value, Vec<flotilla_actors::protocol::Event>) {
    let body = serde_json::json!({ "request": "build the thing", "repo": repo, "config": config });
    let created: serde_json::Value = daemon
        .client
        .json(hyper::Method::POST, "/v1/runs", Some(&body))
        .await
        .unwrap();
    let run = created["id"].as_str().unwrap().to_string();
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed), "{events:#?}");
    let failures: Vec<&EventKind> = events
        .iter()
        .map(|e| &e.kind)
        .filter(|k| {
            matches!(
                k,
                EventKind::TaskRetried { .. } | EventKind::TaskFailed { .. }
            )
        })
        .collect();
    assert!(
        failures.is_empty(),
        "nothing failed on the way: {failures:#?}"
    );
    (created, events)
}

/// The status of `run` as the API gives it.
async fn status_of(daemon: &InProcessDaemon, run: &str) -> serde_json::Value {
    daemon
        .client
        .json(hyper::Method::GET, &format!("/v1/runs/{run}"), None::<&()>)
        .await
        .unwrap()
}

fn project_config(extra: &str) -> String {
    format!("[provider]\nscenario = \"scenario.toml\"\n{extra}")
}

fn write_project(repo: &Path, extra: &str) {
    std::fs::write(repo.join("flotilla.toml"), project_config(extra)).unwrap();
    std::fs::write(repo.join("scenario.toml"), SCENARIO).unwrap();
}

/// The repository of the M8c report: its branch is `master`. `submit` says where the work
/// lands, the run completes there, `status` names it, and the checkout is on master, clean.
#[test]
fn a_repository_on_master_lands_on_master_and_leaves_nothing_behind() {
    let state = tempfile::tempdir().unwrap();
    let _daemon = DaemonProcess::start(state.path());
    let (dir, repo) = repo_on("master");
    // The project's files are committed: the checkout is clean before the run.
    commit_files(
        &repo,
        &[
            ("flotilla.toml", &project_config("")),
            ("scenario.toml", SCENARIO),
        ],
        "the project's files",
    );
    assert_clean(dir.path());
    let before = local_branches(&repo);
    assert_eq!(before, ["master"]);

    let submitted = flotilla(state.path())
        .args(["submit", "build the thing", "--repo"])
        .arg(dir.path())
        .timeout(std::time::Duration::from_secs(120))
        .assert()
        .success();
    let stderr = String::from_utf8(submitted.get_output().stderr.clone()).unwrap();
    assert!(
        stderr
            .lines()
            .next()
            .unwrap()
            .contains(", landing on master"),
        "submit says where the work lands: {stderr}"
    );
    let run = stderr.split_whitespace().nth(1).unwrap().to_string();

    assert_landed_on(&repo, "master", &before);
    let head = repo.find_reference("HEAD").unwrap();
    assert_eq!(head.symbolic_target(), Ok(Some("refs/heads/master")));
    assert_clean(dir.path());
    // The user's checkout followed master: the landed files are in the work tree.
    assert!(dir.path().join("src/parse.rs").exists());

    let status = flotilla(state.path())
        .args(["status", &run])
        .assert()
        .success();
    let text = String::from_utf8(status.get_output().stdout.clone()).unwrap();
    assert!(
        text.lines().any(|l| l == "branch:  master"),
        "status names the branch: {text}"
    );
}

/// `[merge] branch = "release"` while HEAD is on `dev`: the work lands on release, and
/// dev (HEAD's branch, and the user's checkout) is not touched.
#[tokio::test]
async fn a_configured_branch_lands_there_and_heads_own_branch_is_untouched() {
    let (dir, repo) = repo_on("dev");
    let start = branch_tip(&repo, "dev").unwrap();
    repo.branch("release", &repo.find_commit(start).unwrap(), false)
        .unwrap();
    // release has moved on from dev: the tasks start from release's tip.
    repo.set_head("refs/heads/release").unwrap();
    repo.checkout_head(Some(git2::build::CheckoutBuilder::new().force()))
        .unwrap();
    commit_files(&repo, &[("CHANGELOG.md", "1.0\n")], "release notes");
    repo.set_head("refs/heads/dev").unwrap();
    repo.checkout_head(Some(
        git2::build::CheckoutBuilder::new()
            .force()
            .remove_untracked(true),
    ))
    .unwrap();
    assert_clean(dir.path());
    let before = local_branches(&repo);

    let daemon = InProcessDaemon::start(false);
    let mut config = run_config(SCENARIO, 2);
    config["merge"]["branch"] = serde_json::json!("release");
    let (created, _) = run_to_end(&daemon, dir.path(), config).await;
    assert_eq!(created["branch"], "release");

    assert_landed_on(&repo, "release", &before);
    let release = repo
        .find_commit(branch_tip(&repo, "release").unwrap())
        .unwrap();
    assert!(
        release
            .tree()
            .unwrap()
            .get_path(Path::new("CHANGELOG.md"))
            .is_ok(),
        "built on release's own tip"
    );
    assert_eq!(branch_tip(&repo, "dev"), Some(start), "dev did not move");
    let head = repo.find_reference("HEAD").unwrap();
    assert_eq!(head.symbolic_target(), Ok(Some("refs/heads/dev")));
    assert_clean(dir.path());
    assert!(
        !dir.path().join("src").exists(),
        "dev's checkout got none of it"
    );
    let status = status_of(&daemon, created["id"].as_str().unwrap()).await;
    assert_eq!(status["branch"], "release");
}

/// A detached checkout of a repository with one branch: the work lands on that branch,
/// and HEAD stays detached where the user left it.
#[tokio::test]
async fn a_detached_checkout_with_one_branch_lands_on_that_branch() {
    let (dir, repo) = repo_on("trunk");
    let start = branch_tip(&repo, "trunk").unwrap();
    repo.set_head_detached(start).unwrap();
    let before = local_branches(&repo);

    let daemon = InProcessDaemon::start(false);
    let (created, _) = run_to_end(&daemon, dir.path(), run_config(SCENARIO, 2)).await;
    assert_eq!(created["branch"], "trunk");

    assert_landed_on(&repo, "trunk", &before);
    assert!(repo.head_detached().unwrap(), "HEAD is still detached");
    assert_eq!(repo.head().unwrap().target(), Some(start), "where it was");
    assert_clean(dir.path());
    let status = status_of(&daemon, created["id"].as_str().unwrap()).await;
    assert_eq!(status["branch"], "trunk", "journaled with the run's config");
}

/// Detached, two branches, no `[merge] branch`: which one is meant cannot be known. The
/// submission is refused in one line that says what to set, with the exit code of the
/// other submit-time checks, and no run is made.
#[test]
fn a_detached_checkout_with_two_branches_is_refused_at_submit() {
    let state = tempfile::tempdir().unwrap();
    let _daemon = DaemonProcess::start(state.path());
    let (dir, repo) = repo_on("master");
    let start = branch_tip(&repo, "master").unwrap();
    repo.branch("topic", &repo.find_commit(start).unwrap(), false)
        .unwrap();
    repo.set_head_detached(start).unwrap();
    write_project(dir.path(), "");

    let out = flotilla(state.path())
        .args(["submit", "x", "--repo"])
        .arg(dir.path())
        .assert()
        .code(2);
    let stderr = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        first.contains("HEAD is detached")
            && first.contains("\"master\", \"topic\"")
            && first.contains("set [merge] branch"),
        "one line with the fix: {stderr}"
    );
    let runs = flotilla(state.path())
        .args(["runs", "--json"])
        .assert()
        .success();
    let runs: serde_json::Value = serde_json::from_slice(&runs.get_output().stdout).unwrap();
    assert_eq!(runs.as_array().map(Vec::len), Some(0), "{runs}");

    // Setting it is the fix.
    write_project(dir.path(), "[merge]\nbranch = \"topic\"\n");
    let out = flotilla(state.path())
        .args(["submit", "x", "--detach", "--repo"])
        .arg(dir.path())
        .assert()
        .success();
    let stderr = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    assert!(stderr.contains("landing on topic"), "{stderr}");
}

/// A configured branch the repository does not have is refused at submit, naming the
/// branches there are and how to make it; so is one git would not take as a name.
#[tokio::test]
async fn a_configured_branch_that_does_not_exist_is_refused_at_submit() {
    let (dir, repo) = repo_on("master");
    let daemon = InProcessDaemon::start(false);
    for (branch, expected) in [
        ("main", "no such branch"),
        ("bad..name", "not a branch name git accepts"),
        ("flotilla/mine", "flotilla's own namespace"),
    ] {
        let mut config = run_config(SCENARIO, 2);
        config["merge"]["branch"] = serde_json::json!(branch);
        let body =
            serde_json::json!({ "request": "build it", "repo": dir.path(), "config": config });
        let refused = daemon
            .client
            .json::<serde_json::Value>(hyper::Method::POST, "/v1/runs", Some(&body))
            .await
            .unwrap_err();
        let ClientError::Api { status, message } = refused else {
            panic!("{branch}: {refused:?}");
        };
        assert_eq!(status, hyper::StatusCode::UNPROCESSABLE_ENTITY, "{branch}");
        assert!(message.contains(expected), "{branch}: {message}");
        assert!(!message.contains('\n'), "one line: {message}");
        if branch == "main" {
            assert!(
                message.contains("\"master\"") && message.contains("git branch main"),
                "the branches there are, and the fix: {message}"
            );
        }
    }
    let runs: serde_json::Value = daemon
        .client
        .json(hyper::Method::GET, "/v1/runs", None::<&()>)
        .await
        .unwrap();
    assert_eq!(runs.as_array().map(Vec::len), Some(0), "{runs}");
    assert_eq!(local_branches(&repo), ["master"], "nothing made");
}

/// A landing on a checked-out `master` moves it only with its index and work tree: with a
/// change of the user's in a file the landing changes, master stays where it is and nothing
/// of theirs is touched (ADR-021, for the run's branch).
#[tokio::test]
async fn a_checked_out_target_moves_only_with_its_checkout() {
    let (dir, repo) = repo_on("master");
    let master = TargetBranch::new("master").unwrap();
    let old = branch_tip(&repo, "master").unwrap();
    // What the merge queue would build: README.md changed, on master's tip.
    let new = {
        let parent = repo.find_commit(old).unwrap();
        let mut update = git2::build::TreeUpdateBuilder::new();
        update.upsert(
            "README.md",
            repo.blob(b"landed\n").unwrap(),
            git2::FileMode::Blob,
        );
        let tree = update
            .create_updated(&repo, &parent.tree().unwrap())
            .unwrap();
        let tree = repo.find_tree(tree).unwrap();
        let sig = git2::Signature::now("flotilla", "flotilla@localhost").unwrap();
        repo.commit(None, &sig, &sig, "landed", &tree, &[&parent])
            .unwrap()
    };
    let git = GitRepo::new(dir.path(), master);
    std::fs::write(dir.path().join("README.md"), "mine\n").unwrap();
    let refused = git
        .compare_and_swap(old.to_string(), new.to_string())
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, MainRefError::CheckoutBusy { detail } if detail.contains("the checkout of master")),
        "{refused}"
    );
    assert_eq!(
        branch_tip(&repo, "master"),
        Some(old),
        "master did not move"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("README.md")).unwrap(),
        "mine\n"
    );
    // The user's change gone, master moves and its checkout with it.
    std::fs::write(dir.path().join("README.md"), "a test repository\n").unwrap();
    git.compare_and_swap(old.to_string(), new.to_string())
        .await
        .unwrap();
    assert_eq!(branch_tip(&repo, "master"), Some(new));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("README.md")).unwrap(),
        "landed\n"
    );
    assert_clean(dir.path());
    assert!(repo.find_branch("main", git2::BranchType::Local).is_err());
}

/// Killed inside the move of a checked-out `master` (master moved, its index not yet): the
/// record left beside git's lock names master, and the restarted daemon heals master's
/// checkout and completes the run there.
#[tokio::test]
async fn a_kill_inside_the_move_of_a_checked_out_master_is_healed_on_master() {
    let state = tempfile::tempdir().unwrap();
    let (dir, repo) = repo_on("master");
    let mut daemon = DaemonProcess::start_with_env(
        state.path(),
        &[("FAILPOINTS", "checkout::after-ref=return")],
    );
    let client = DaemonProcess::client(state.path());
    let run = crate::daemon_env::submit(&client, dir.path(), run_config(SCENARIO, 2)).await;
    assert!(
        daemon
            .exited_within(std::time::Duration::from_secs(90))
            .await
            .is_some(),
        "the daemon did not reach the fail point; log:\n{}",
        daemon.log()
    );
    let record = std::fs::read_to_string(dir.path().join(".git/flotilla-checkout")).unwrap();
    assert!(record.contains(r#""branch":"master""#), "{record}");
    assert!(dir.path().join(".git/index.lock").exists());
    drop(daemon);

    let _daemon = DaemonProcess::start(state.path());
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    assert_landed_on(&repo, "master", &["master".to_string()]);
    let head = repo.find_reference("HEAD").unwrap();
    assert_eq!(head.symbolic_target(), Ok(Some("refs/heads/master")));
    assert!(
        !dir.path().join(".git/index.lock").exists(),
        "the lock is gone"
    );
    assert!(
        !dir.path().join(".git/flotilla-checkout").exists(),
        "the record is gone"
    );
    assert_clean(dir.path());
    assert!(dir.path().join("src/parse.rs").exists());
}
