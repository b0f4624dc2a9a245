//! Warm trees (ADR-042), through `ScratchRun` as the merge gate runs it, with the real git
//! side and the real sandboxed runner: git works there at the candidate, ignored build
//! outputs carry over from one candidate to the next while tracked and untracked leftovers do
//! not, a tree over the budget is thrown away, and a gate that attacks the target repository
//! from inside changes nothing of it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use flotilla::git::merge::GitMerge;
use flotilla::process::ConfinedRunner;
use flotilla::sandbox::{SandboxConfig, SandboxPolicy};
use flotilla_actors::actors::scratch_commands::{CommandResult, NamedCommand, ScratchRun};
use flotilla_actors::ports::{
    CommandOutput, CommandSpec, LineSink, ProcessError, ProcessRunner, WarmSlot,
};
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::daemon_env::{commit_files, commit_tree_update, init_repo, main_branch, state_and_repo};
use crate::supervision::assert_checkout_untouched;

struct Fixture {
    repo: tempfile::TempDir,
    state: tempfile::TempDir,
    run: ScratchRun,
}

impl Fixture {
    /// A repository on `main` whose `.gitignore` ignores `target/`, with the gate's commands
    /// under the default sandbox of a run whose state is in `state`.
    fn new(budget_mb: u64) -> Fixture {
        let repo = tempfile::tempdir().unwrap();
        init_repo(repo.path());
        commit_files(
            &git2::Repository::open(repo.path()).unwrap(),
            &[
                (".gitignore", "target/\n"),
                ("a.txt", "a\n"),
                ("b.txt", "b\n"),
            ],
            "files",
        );
        let state = tempfile::tempdir().unwrap();
        let merge = GitMerge::new(repo.path(), state.path().join("scratch"), main_branch())
            .with_warm(budget_mb);
        let policy = SandboxPolicy::for_run(
            &SandboxConfig::default(),
            &[state.path().to_path_buf()],
            repo.path(),
        );
        let run = ScratchRun {
            git: Arc::new(merge),
            runner: Arc::new(ConfinedRunner::new(policy)),
            timeout: Duration::from_secs(300),
            stop_at_first_failure: false,
            slot: WarmSlot::Gate,
        };
        Fixture { repo, state, run }
    }

    fn git(&self) -> git2::Repository {
        git2::Repository::open(self.repo.path()).unwrap()
    }

    fn main_tip(&self) -> String {
        self.git()
            .refname_to_id("refs/heads/main")
            .unwrap()
            .to_string()
    }

    /// A commit on main's tip changing `files` (`None` deletes), with no ref moved: a
    /// candidate, as the merge queue builds them.
    fn candidate(&self, files: &[(&str, Option<&str>)]) -> String {
        let git = self.git();
        let parent = git.head().unwrap().peel_to_commit().unwrap();
        let sig = git2::Signature::now("agent", "agent@example.com").unwrap();
        let mode = git2::FileMode::Blob;
        commit_tree_update(&git, &parent, files, mode, &sig, "candidate", None)
    }

    async fn gate(&self, commit: &str, lines: &[String]) -> Vec<CommandResult> {
        let commands = lines
            .iter()
            .map(|line| NamedCommand {
                name: "gate".into(),
                line: line.clone(),
            })
            .collect();
        self.run
            .run(
                commit.to_string(),
                "gate".into(),
                commands,
                CancellationToken::new(),
            )
            .await
            .unwrap()
    }

    fn warm_dir(&self) -> PathBuf {
        flotilla::git::warm::tree_dir(&self.state.path().join("scratch"), WarmSlot::Gate)
    }
}

fn lines(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn assert_all_passed(results: &[CommandResult]) {
    for r in results {
        assert!(r.passed, "{} failed ({}): {}", r.line, r.exit, r.output);
    }
}

#[tokio::test]
async fn git_works_in_the_warm_tree_and_build_outputs_carry_over() {
    let f = Fixture::new(1024);
    let main = f.main_tip();
    let first = f.candidate(&[("c.txt", Some("c\n"))]);
    let results = f
        .gate(
            &first,
            &lines(&[
                &format!("test \"$(git rev-parse HEAD)\" = {first}"),
                "test -z \"$(git status --porcelain)\"",
                "git log --format=%s -2 | grep -qx files",
                "mkdir -p target && echo built > target/out",
                "echo junk > untracked.txt && echo changed > a.txt",
            ]),
        )
        .await;
    assert_eq!(results.len(), 5);
    assert_all_passed(&results);
    assert_eq!(Path::new(&results[0].dir), f.warm_dir());

    // The second candidate drops b.txt: its gate sees its own commit, the first gate's build
    // output, and none of the first gate's changes to the checkout.
    let second = f.candidate(&[("c.txt", Some("c2\n")), ("b.txt", None)]);
    let results = f
        .gate(
            &second,
            &lines(&[
                &format!("test \"$(git rev-parse HEAD)\" = {second}"),
                "test \"$(cat target/out)\" = built",
                "test ! -e b.txt",
                "test ! -e untracked.txt",
                "test \"$(cat a.txt)\" = a && test \"$(cat c.txt)\" = c2",
                "test -z \"$(git status --porcelain)\"",
            ]),
        )
        .await;
    assert_all_passed(&results);
    assert_eq!(Path::new(&results[0].dir), f.warm_dir());
    // Nothing of it touched the target repository.
    assert_eq!(f.main_tip(), main);
    assert_eq!(
        f.git().head().unwrap().name().unwrap(),
        "refs/heads/main",
        "the user's HEAD stays on main"
    );
    assert_checkout_untouched(f.repo.path());
    let usage = flotilla::git::warm::describe(&f.state.path().join("scratch")).unwrap();
    assert!(usage.starts_with("gate "), "{usage}");
    assert!(usage.contains(&second[..7]), "{usage}");
}

#[tokio::test]
async fn a_warm_tree_over_its_budget_is_thrown_away() {
    let f = Fixture::new(1);
    let first = f.candidate(&[("c.txt", Some("c\n"))]);
    let results = f
        .gate(
            &first,
            &lines(&["mkdir -p target && head -c 3000000 /dev/urandom > target/big"]),
        )
        .await;
    assert_all_passed(&results);
    assert!(!f.warm_dir().exists(), "the tree over the budget is gone");
    let usage = flotilla::git::warm::describe(&f.state.path().join("scratch")).unwrap();
    assert!(usage.contains("thrown away 1×"), "{usage}");

    let second = f.candidate(&[("c.txt", Some("c2\n"))]);
    let results = f
        .gate(
            &second,
            &lines(&[
                &format!("test \"$(git rev-parse HEAD)\" = {second}"),
                "test ! -e target/big",
                "test \"$(cat c.txt)\" = c2",
            ]),
        )
        .await;
    assert_all_passed(&results);
    assert!(f.warm_dir().exists(), "a small tree is kept");
}

#[tokio::test]
async fn a_gate_attacking_the_target_repository_changes_nothing_of_it() {
    let f = Fixture::new(1024);
    let main = f.main_tip();
    let target_git = std::fs::canonicalize(f.repo.path().join(".git")).unwrap();
    let t = target_git.display();
    let first = f.candidate(&[("c.txt", Some("evil\n"))]);
    let attacks = [
        // Each must fail: the target's `.git` is read-only in the sandbox.
        format!("git --git-dir={t} update-ref refs/heads/main {first}"),
        format!("git push --quiet {t} HEAD:refs/heads/main"),
        format!("git push --quiet {t} HEAD:refs/heads/planted"),
        format!("echo {first} > {t}/refs/heads/main"),
        format!("touch {t}/objects/planted"),
        format!("git --git-dir={t} symbolic-ref HEAD refs/heads/planted"),
        // Contained: the warm tree's own refs, and its own `.git`, pointed at the target's
        // (which the daemon must not follow when it prepares the next candidate).
        format!("git update-ref refs/heads/main {first}"),
        format!("rm -rf .git && ln -s {t} .git && ln -s {t}/.. user-checkout"),
    ];
    let results = f.gate(&first, &attacks).await;
    assert_eq!(results.len(), attacks.len());
    for r in &results[..6] {
        assert!(!r.passed, "the attack succeeded: {}", r.line);
    }
    for r in &results[6..] {
        assert!(r.passed, "{} ({}): {}", r.line, r.exit, r.output);
    }

    // The next candidate's tree is whole again, and the daemon wrote nothing through the
    // planted link: the target keeps its main, its HEAD, its index and its objects.
    let second = f.candidate(&[("c.txt", Some("fine\n"))]);
    let results = f
        .gate(
            &second,
            &lines(&[
                &format!("test \"$(git rev-parse HEAD)\" = {second}"),
                "test -d .git && test ! -L .git",
                "test \"$(cat c.txt)\" = fine",
                "test -z \"$(git status --porcelain)\"",
            ]),
        )
        .await;
    assert_all_passed(&results);
    assert_eq!(f.main_tip(), main, "main did not move");
    let git = f.git();
    assert_eq!(git.head().unwrap().name().unwrap(), "refs/heads/main");
    assert!(git.find_reference("refs/heads/planted").is_err());
    assert!(!target_git.join("objects/planted").exists());
    assert_checkout_untouched(f.repo.path());
    assert!(!f.repo.path().join("c.txt").exists());
}

/// Through the daemon, with the default `[merge]`: a gate that needs a real git checkout at
/// the candidate passes (in a scratch checkout, with no `.git`, it fails), so both tasks land.
#[test]
fn a_run_gates_in_a_warm_tree_by_default() {
    use crate::daemon_env::{DaemonProcess, flotilla, git_repo};
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    std::fs::write(
        repo.path().join("flotilla.toml"),
        "[provider]\nscenario = \"scenario.toml\"\n[merge]\n\
         gate = [\"test -d .git && git rev-parse --verify HEAD && test -z \\\"$(git status --porcelain)\\\"\"]\n",
    )
    .unwrap();
    std::fs::write(
        repo.path().join("scenario.toml"),
        r#"
[[planner.answers]]
tasks = [
  { description = "write the lexer", scope = ["src/lex.rs"] },
  { description = "write the parser", scope = ["src/parse.rs"], dependencies = [0] },
]
[tasks.t1]
writes = { "src/lex.rs" = "pub fn lex() {}\n" }
[tasks.t2]
writes = { "src/parse.rs" = "pub fn parse() {}\n" }
"#,
    )
    .unwrap();
    let _daemon = DaemonProcess::start(state.path());
    flotilla(state.path())
        .args(["submit", "build a parser", "--repo"])
        .arg(repo.path())
        .assert()
        .success()
        .stdout(predicates::str::contains("run finished: completed"));
    let git = git2::Repository::open(repo.path()).unwrap();
    let main = git.revparse_single("main").unwrap().peel_to_tree().unwrap();
    assert!(main.get_path(Path::new("src/parse.rs")).is_ok());
}

/// The sweeps have a tree of their own: a sweep runs, in its own tree, while the gate's
/// lease is held (one tree and one lease for both, and it would wait for ever).
#[tokio::test]
async fn a_sweep_runs_in_its_own_tree_while_the_gate_holds_its_own() {
    let f = Fixture::new(1024);
    let sweep = ScratchRun {
        slot: WarmSlot::Sweep,
        ..f.run.clone()
    };
    let commit = f.candidate(&[("c.txt", Some("c\n"))]);
    let held = f
        .run
        .git
        .warm(commit.clone(), WarmSlot::Gate)
        .await
        .unwrap()
        .expect("warm trees are on");
    let swept = sweep
        .run(
            commit.clone(),
            "sweep".into(),
            vec![NamedCommand {
                name: "test".into(),
                line: "git rev-parse HEAD".into(),
            }],
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_all_passed(&swept);
    let sweep_dir = flotilla::git::warm::tree_dir(&f.state.path().join("scratch"), WarmSlot::Sweep);
    assert_eq!(Path::new(&swept[0].dir), sweep_dir);
    assert_ne!(held.path, sweep_dir);
    assert!(swept[0].output.contains(&commit));
    f.run.git.settle_warm(held, true).await.unwrap();
    let results = f.gate(&commit, &lines(&["git rev-parse HEAD"])).await;
    assert_all_passed(&results);
}

/// Fails every warm tree's update (as on a host without git), running the rest.
struct NoUpdates(Arc<dyn ProcessRunner>);

impl ProcessRunner for NoUpdates {
    fn run(
        &self,
        command: CommandSpec,
        cancel: CancellationToken,
        lines: Option<LineSink>,
    ) -> BoxFuture<'static, Result<CommandOutput, ProcessError>> {
        let command = match command.args.last() {
            Some(line) if line.starts_with("git ") && line.contains(" checkout ") => {
                CommandSpec::shell("exit 1", command.cwd.clone())
            }
            _ => command,
        };
        self.0.run(command, cancel, lines)
    }
}

#[tokio::test]
async fn a_warm_tree_that_will_not_update_gives_way_to_a_scratch_checkout() {
    let f = Fixture::new(1024);
    let first = f.candidate(&[("c.txt", Some("c\n"))]);
    let results = f
        .gate(
            &first,
            &lines(&["mkdir -p target && echo built > target/out"]),
        )
        .await;
    assert_all_passed(&results);
    assert!(f.warm_dir().join("target/out").exists());

    let failing = ScratchRun {
        runner: Arc::new(NoUpdates(f.run.runner.clone())),
        ..f.run.clone()
    };
    let second = f.candidate(&[("c.txt", Some("c2\n"))]);
    let results = failing
        .run(
            second.clone(),
            "gate".into(),
            vec![NamedCommand {
                name: "gate".into(),
                line: "test \"$(cat c.txt)\" = c2 && test ! -e .git".into(),
            }],
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_all_passed(&results);
    assert_ne!(Path::new(&results[0].dir), f.warm_dir());
    assert!(
        !Path::new(&results[0].dir).exists(),
        "the scratch checkout is removed"
    );
    assert!(
        !f.warm_dir().exists(),
        "the tree that would not update is thrown away"
    );
}

#[test]
fn warm_trees_are_on_by_default_and_a_zero_budget_is_refused_while_they_are() {
    use flotilla_actors::actors::{MergeConfig, MergeConfigError};
    let mut config: MergeConfig = toml::from_str("gate = [\"true\"]").unwrap();
    assert!(config.warm_gate);
    assert_eq!(config.validate(), Ok(()));
    config.warm_budget_mb = 0;
    assert_eq!(config.validate(), Err(MergeConfigError::ZeroWarmBudget));
    let off: MergeConfig = toml::from_str("warm_gate = false\nwarm_budget_mb = 0").unwrap();
    assert_eq!(off.validate(), Ok(()));
}

/// `status` of a live run shows the gate's warm tree once a candidate was gated there.
#[tokio::test]
async fn status_shows_the_warm_tree_of_a_live_run() {
    use std::io::{BufRead, BufReader};

    use crate::daemon_env::{DaemonProcess, flotilla, run_config, submit};

    let (_tmp, state, repo) = state_and_repo();
    let daemon = DaemonProcess::start(&state);
    let scenario = r#"
[[planner.answers]]
tasks = [
  { description = "write a", scope = ["a.txt"] },
  { description = "wait", scope = ["b.txt"], dependencies = [0] },
]
[tasks.t1]
writes = { "a.txt" = "a\n" }
[tasks.t2]
outcome = "hang"
"#;
    let mut config = run_config(scenario, 1);
    config["merge"]["gate"] = serde_json::json!(["git rev-parse HEAD"]);
    let client = DaemonProcess::client(&state);
    let run = submit(&client, &repo, config).await;
    let mut tail = std::process::Command::new(assert_cmd::cargo::cargo_bin("flotilla"))
        .arg("--state-dir")
        .arg(&state)
        .args(["tail", &run])
        .env("NO_COLOR", "1")
        .env_remove("FLOTILLA_SOCKET")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = tail.stdout.take().unwrap();
    // Read until t1 landed: its gate ran in the warm tree, which was measured before main
    // moved.
    let landed = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|line| line.contains("t1 landed on main"))
    });
    let landed = tokio::time::timeout(Duration::from_secs(120), landed)
        .await
        .expect("t1 lands")
        .unwrap();
    assert!(landed, "{}", daemon.log());
    let out = flotilla(&state).args(["status", &run]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let warm = text
        .lines()
        .find(|l| l.starts_with("warm:"))
        .unwrap_or_else(|| panic!("no warm line in:\n{text}"));
    assert!(
        warm.contains("gate ") && warm.contains(" of 20480 MiB"),
        "{warm}"
    );
    let _: serde_json::Value = client
        .json(
            hyper::Method::POST,
            &format!("/v1/runs/{run}/cancel"),
            None::<&()>,
        )
        .await
        .unwrap_or(serde_json::Value::Null);
    let _ = tail.kill();
    let _ = tail.wait();
    drop(daemon);
}
