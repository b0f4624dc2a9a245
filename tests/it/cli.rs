//! The `flotilla` binary as a user runs it (assert_cmd). On failure, assert_cmd prints the
//! command, its exit code and both output streams.

use assert_cmd::Command;
use predicates::prelude::*;

use crate::daemon_env::*;

fn flotilla(state_dir: &std::path::Path) -> Command {
    let mut cmd = Command::cargo_bin("flotilla").unwrap();
    cmd.arg("--state-dir")
        .arg(state_dir)
        .env("NO_COLOR", "1")
        .env_remove("FLOTILLA_SOCKET");
    cmd
}

fn write_project(repo: &std::path::Path, scenario: &str) {
    std::fs::write(
        repo.join("flotilla.toml"),
        "[provider]\nscenario = \"scenario.toml\"\n",
    )
    .unwrap();
    std::fs::write(repo.join("scenario.toml"), scenario).unwrap();
}

const TWO_TASKS: &str = r#"
[[planner.answers]]
tasks = [
  { description = "write the lexer", scope = ["src/lex.rs"] },
  { description = "write the parser", scope = ["src/parse.rs"], dependencies = [0] },
]
"#;

#[test]
fn without_a_daemon_every_command_says_so_in_one_line_with_a_hint() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    write_project(repo.path(), TWO_TASKS);
    for args in [
        vec!["status"],
        vec!["runs"],
        vec!["tail", "0123"],
        vec!["submit", "x", "--repo"],
    ] {
        let mut cmd = flotilla(state.path());
        cmd.args(&args);
        if args[0] == "submit" {
            cmd.arg(repo.path());
        }
        let out = cmd.assert().code(3).get_output().clone();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(
            stderr.starts_with("error: the flotilla daemon is not running"),
            "{stderr}"
        );
        assert!(
            stderr.contains("hint: start it with `flotilla daemon`"),
            "{stderr}"
        );
        assert_eq!(
            stderr.lines().count(),
            2,
            "one error line and one hint: {stderr}"
        );
    }
}

#[test]
fn submit_follows_the_run_to_the_end_and_the_other_commands_see_it() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    write_project(repo.path(), TWO_TASKS);
    let _daemon = DaemonProcess::start(state.path());

    let out = flotilla(state.path())
        .args(["submit", "build a parser", "--repo"])
        .arg(repo.path())
        .assert()
        .success();
    let stdout = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    for needle in [
        "run started: build a parser",
        "t1 added: write the lexer",
        "t2 added: write the parser [src/parse.rs] after t1",
        "t1 completed",
        "t2 completed",
        "run finished: completed",
    ] {
        assert!(stdout.contains(needle), "missing {needle:?} in:\n{stdout}");
    }
    assert!(
        !stdout.contains('\x1b'),
        "no colour when not on a terminal / NO_COLOR:\n{stdout}"
    );
    let stderr = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    let run = stderr.split_whitespace().nth(1).unwrap().to_string();
    let prefix = &run[..8];

    let out = flotilla(state.path())
        .args(["tail", prefix, "--json"])
        .assert()
        .success();
    let lines: Vec<serde_json::Value> = String::from_utf8(out.get_output().stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON event per line"))
        .collect();
    assert_eq!(lines.first().unwrap()["kind"], "run_started");
    assert_eq!(lines.last().unwrap()["kind"], "run_finished");
    let out = flotilla(state.path())
        .args(["tail", prefix, "--json", "--since", "3"])
        .assert()
        .success();
    let first: serde_json::Value = serde_json::from_str(
        String::from_utf8(out.get_output().stdout.clone())
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(first["seq"], 4);

    flotilla(state.path())
        .args(["status", prefix])
        .assert()
        .success()
        .stdout(predicates::str::contains("completed"));
    let status = flotilla(state.path())
        .args(["status", prefix, "--json"])
        .assert()
        .success();
    let status: serde_json::Value = serde_json::from_slice(&status.get_output().stdout).unwrap();
    assert_eq!(status["counts"]["completed"], 2);
    flotilla(state.path())
        .arg("runs")
        .assert()
        .success()
        .stdout(predicates::str::contains(prefix));
    flotilla(state.path())
        .args(["graph", prefix])
        .assert()
        .success()
        .stdout(
            predicates::str::contains("flowchart LR").and(predicates::str::contains("t1 --> t2")),
        );
    flotilla(state.path())
        .args(["cancel", prefix])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("already finished"));
}

#[test]
fn submit_exits_non_zero_when_the_run_does_not_complete() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    write_project(
        repo.path(),
        r#"
        [[planner.answers]]
        tasks = [{ description = "needs credentials", scope = ["a.rs"] }]
        [tasks.t1]
        outcome = "blocked"
        summary = "no database credentials"
        "#,
    );
    let _daemon = DaemonProcess::start(state.path());
    flotilla(state.path())
        .args(["submit", "x", "--repo"])
        .arg(repo.path())
        .assert()
        .code(1)
        .stdout(
            predicates::str::contains("t1 failed")
                .and(predicates::str::contains("run finished: failed")),
        );
}

#[test]
fn a_broken_config_is_reported_before_anything_is_sent() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    std::fs::write(
        repo.path().join("flotilla.toml"),
        "[provider]\nscenario = \"missing.toml\"\n",
    )
    .unwrap();
    flotilla(state.path())
        .args(["submit", "x", "--repo"])
        .arg(repo.path())
        .assert()
        .code(2)
        .stderr(predicates::str::contains("missing.toml").and(predicates::str::contains("hint:")));
}

#[test]
fn help_explains_every_command() {
    let out = Command::cargo_bin("flotilla")
        .unwrap()
        .arg("--help")
        .assert()
        .success();
    let help = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    for command in [
        "daemon", "submit", "tail", "status", "graph", "cancel", "runs",
    ] {
        assert!(
            help.contains(command),
            "--help does not mention {command}:\n{help}"
        );
    }
}
