//! The `flotilla` binary as a user runs it (assert_cmd). On failure, assert_cmd prints the
//! command, its exit code and both output streams.

use assert_cmd::Command;
use predicates::prelude::*;

use crate::daemon_env::*;

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
    // No gate, no sweep commands: said once, with where to set a gate (ADR-032).
    let untested: Vec<&str> = stderr.lines().filter(|l| l.contains("untested")).collect();
    assert_eq!(untested.len(), 1, "{stderr}");
    assert!(
        untested[0].starts_with("gate: none: main moves untested")
            && untested[0].contains("[merge] gate"),
        "{stderr}"
    );

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

    let status = flotilla(state.path())
        .args(["status", prefix])
        .assert()
        .success()
        .stdout(predicates::str::contains("completed"));
    let status = String::from_utf8(status.get_output().stdout.clone()).unwrap();
    assert_eq!(status.matches("main moves untested").count(), 1, "{status}");
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
    // With a gate nothing is said.
    std::fs::write(
        repo.path().join("flotilla.toml"),
        "[provider]\nscenario = \"scenario.toml\"\n[merge]\ngate = [\"true\"]\n",
    )
    .unwrap();
    flotilla(state.path())
        .args(["submit", "build a parser", "--detach", "--repo"])
        .arg(repo.path())
        .assert()
        .success()
        .stderr(predicates::str::contains("untested").not());
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
fn an_agent_cli_missing_from_the_daemons_path_is_refused_at_submit() {
    let state = tempfile::tempdir().unwrap();
    let _daemon = DaemonProcess::start(state.path());
    let repo = git_repo();
    write_project(repo.path(), TWO_TASKS);
    let config = std::fs::read_to_string(repo.path().join("flotilla.toml")).unwrap();
    std::fs::write(
        repo.path().join("flotilla.toml"),
        format!(
            "{config}[agents.ghost]\npreset = \"aider\"\nprogram = \"flotilla-no-such-agent-cli\"\n\
             [[workers]]\nname = \"coder\"\nagent = \"ghost\"\n"
        ),
    )
    .unwrap();
    let out = flotilla(state.path())
        .args(["submit", "x", "--repo"])
        .arg(repo.path())
        .assert()
        .code(2);
    let stderr = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    assert!(
        stderr.contains("\"flotilla-no-such-agent-cli\"")
            && stderr.contains("not on the daemon's PATH"),
        "{stderr}"
    );
    // Refused before a run existed: nothing was planned or tried.
    let runs = flotilla(state.path())
        .args(["runs", "--json"])
        .assert()
        .success();
    let runs: serde_json::Value = serde_json::from_slice(&runs.get_output().stdout).unwrap();
    assert_eq!(runs.as_array().map(Vec::len), Some(0), "{runs}");
}

#[test]
fn status_of_a_task_tells_its_whole_story_with_the_reasons_in_full() {
    // t2's agent reports it is blocked, with a long reason: the tail line shortens it, the
    // task's story has it whole.
    let long = format!(
        "blocked because {} END-OF-REASON",
        "the schema is missing ".repeat(12)
    );
    let scenario = format!(
        r#"
        [[planner.answers]]
        tasks = [
          {{ description = "write a", scope = ["a.rs"] }},
          {{ description = "write b", scope = ["b.rs"] }},
        ]
        [tasks.t1]
        summary = "wrote a"
        [tasks.t2]
        outcome = "blocked"
        summary = "{long}"
        "#
    );
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    write_project(repo.path(), &scenario);
    let _daemon = DaemonProcess::start(state.path());
    let submitted = flotilla(state.path())
        .args(["submit", "x", "--repo"])
        .arg(repo.path())
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .code(1);
    let stderr = String::from_utf8(submitted.get_output().stderr.clone()).unwrap();
    let run = stderr.split_whitespace().nth(1).unwrap().to_string();

    let story = flotilla(state.path())
        .args(["status", &run, "t2"])
        .assert()
        .success();
    let text = String::from_utf8(story.get_output().stdout.clone()).unwrap();
    assert!(text.starts_with("t2 in run "), "{text}");
    for needle in ["t2 added", "t2 dispatched", "END-OF-REASON", "why: "] {
        assert!(text.contains(needle), "{needle:?} in:\n{text}");
    }
    assert!(!text.contains("t1 "), "only t2's events:\n{text}");

    let json = flotilla(state.path())
        .args(["status", &run, "t2", "--json"])
        .assert()
        .success();
    let json: serde_json::Value = serde_json::from_slice(&json.get_output().stdout).unwrap();
    assert_eq!(json["task"], "t2");
    assert!(json["events"].as_array().unwrap().len() >= 4, "{json}");

    let missing = flotilla(state.path())
        .args(["status", &run, "t9"])
        .assert()
        .code(2);
    let stderr = String::from_utf8(missing.get_output().stderr.clone()).unwrap();
    assert!(stderr.contains("has no task t9"), "{stderr}");
}

#[test]
fn each_command_offers_only_the_daemon_flags_it_uses() {
    let help = |args: &[&str]| {
        let out = Command::cargo_bin("flotilla")
            .unwrap()
            .args(args)
            .arg("--help")
            .assert()
            .success();
        String::from_utf8(out.get_output().stdout.clone()).unwrap()
    };
    let daemon = help(&["daemon"]);
    assert!(
        daemon.contains("--state-dir") && daemon.contains("--socket"),
        "{daemon}"
    );
    assert!(
        !daemon.contains("--connect"),
        "the daemon connects to nothing:\n{daemon}"
    );
    let bench = help(&["bench"]);
    for flag in ["--state-dir", "--socket", "--connect"] {
        assert!(
            !bench.contains(flag),
            "bench needs no daemon: {flag}\n{bench}"
        );
    }
    let status = help(&["status"]);
    for flag in ["--state-dir", "--socket", "--connect"] {
        assert!(status.contains(flag), "{flag}\n{status}");
    }
    // Given after the subcommand, the flags find the daemon as before it.
    let state = tempfile::tempdir().unwrap();
    let _daemon = DaemonProcess::start(state.path());
    Command::cargo_bin("flotilla")
        .unwrap()
        .env_remove("FLOTILLA_SOCKET")
        .env_remove("FLOTILLA_STATE_DIR")
        .args(["runs", "--json", "--state-dir"])
        .arg(state.path())
        .assert()
        .success()
        .stdout("[]\n");
}

#[test]
fn a_config_error_points_to_the_reference_that_explains_it() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    // A mistyped key: the configuration reference explains it, not the scenario guide.
    std::fs::write(
        repo.path().join("flotilla.toml"),
        "[limits]\nmax_wokers = 3\n",
    )
    .unwrap();
    flotilla(state.path())
        .args(["submit", "x", "--repo"])
        .arg(repo.path())
        .assert()
        .code(2)
        .stderr(
            predicates::str::contains("max_wokers")
                .and(predicates::str::contains("hint: see docs/configuration.md")),
        );
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
        "daemon", "submit", "tail", "status", "graph", "cancel", "decide", "runs",
    ] {
        assert!(
            help.contains(command),
            "--help does not mention {command}:\n{help}"
        );
    }
}

/// Runs a two-task project to completion and returns (state dir, daemon, run id).
fn finished_run(scenario: &str) -> (tempfile::TempDir, DaemonProcess, String) {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    write_project(repo.path(), scenario);
    let daemon = DaemonProcess::start(state.path());
    let out = flotilla(state.path())
        .args(["submit", "build it", "--detach", "--repo"])
        .arg(repo.path())
        .assert()
        .success();
    let run = String::from_utf8(out.get_output().stdout.clone())
        .unwrap()
        .trim()
        .to_string();
    // Follow it to its end (whatever its outcome).
    let followed = flotilla(state.path())
        .args(["tail", &run])
        .timeout(std::time::Duration::from_secs(60))
        .assert();
    let finished = String::from_utf8_lossy(&followed.get_output().stdout).into_owned();
    assert!(finished.contains("run finished"), "{finished}");
    (state, daemon, run)
}

#[test]
fn tail_since_the_end_of_a_finished_run_prints_nothing_and_exits_with_its_code() {
    let (state, _daemon, run) = finished_run(TWO_TASKS);
    let out = flotilla(state.path())
        .args(["tail", &run, "--json"])
        .assert()
        .success();
    let last: serde_json::Value = serde_json::from_str(
        String::from_utf8(out.get_output().stdout.clone())
            .unwrap()
            .lines()
            .last()
            .unwrap(),
    )
    .unwrap();
    let last_seq = last["seq"].as_u64().unwrap();
    for since in [last_seq, last_seq + 100] {
        for json in [false, true] {
            let mut cmd = flotilla(state.path());
            cmd.args(["tail", &run, "--since", &since.to_string()]);
            if json {
                cmd.arg("--json");
            }
            // Before the fix this looped on "lost the daemon; reconnecting…" forever.
            cmd.timeout(std::time::Duration::from_secs(30))
                .assert()
                .success()
                .stdout("")
                .stderr(predicates::str::contains("reconnecting").not());
        }
    }
    // A failed run's code is 1, as when following it live.
    let (state, _daemon, run) = finished_run(
        r#"
        [[planner.answers]]
        tasks = [{ description = "needs credentials", scope = ["a.rs"] }]
        [tasks.t1]
        outcome = "blocked"
        summary = "no database credentials"
        "#,
    );
    flotilla(state.path())
        .args(["tail", &run, "--since", "1000000"])
        .timeout(std::time::Duration::from_secs(30))
        .assert()
        .code(1)
        .stdout("");
}

#[test]
fn a_closed_stdout_ends_every_printing_command_quietly() {
    let (state, _daemon, run) = finished_run(TWO_TASKS);
    for args in [
        vec!["tail", run.as_str()],
        vec!["tail", run.as_str(), "--json"],
        vec!["status", run.as_str()],
        vec!["runs"],
        vec!["graph", run.as_str()],
    ] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .arg("--state-dir")
            .arg(state.path())
            .args(&args)
            .env("NO_COLOR", "1")
            .env("RUST_BACKTRACE", "0")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Close the reading end before the command writes: like `| head` that has had enough.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(stderr, "", "{args:?}: quietly");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    }
}

/// Retitles the terminal, clears it, writes the clipboard, returns the carriage, reverses
/// the line.
const HOSTILE: &str = "x\\u001b]0;pwned\\u0007\\u001b[2J\\u001b]52;c;ZXZpbA==\\u0007\\r\\u202eevil";

#[test]
fn what_models_wrote_reaches_the_terminal_escaped_in_every_command() {
    let scenario = format!(
        r#"
        [[planner.answers]]
        tasks = [
          {{ description = "{HOSTILE}", scope = ["a.rs"] }},
          {{ description = "second {HOSTILE}", scope = ["b.rs"] }},
        ]
        [tasks.t1]
        summary = "{HOSTILE}"
        [tasks.t2]
        outcome = "blocked"
        summary = "{HOSTILE}"
        "#
    );
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    write_project(repo.path(), &scenario);
    let _daemon = DaemonProcess::start(state.path());
    let request = "build \u{1b}]0;owned\u{7} it\r";
    let submitted = flotilla(state.path())
        .args(["submit", request, "--repo"])
        .arg(repo.path())
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .code(1);
    let stderr = String::from_utf8(submitted.get_output().stderr.clone()).unwrap();
    let run = stderr.split_whitespace().nth(1).unwrap().to_string();
    let mut outputs = vec![("submit".to_string(), submitted.get_output().stdout.clone())];
    for args in [
        vec!["tail", run.as_str()],
        vec!["tail", run.as_str(), "--json"],
        vec!["status", run.as_str()],
        vec!["status", run.as_str(), "--json"],
        vec!["status"],
        vec!["runs"],
        vec!["runs", "--json"],
        vec!["graph", run.as_str()],
        vec!["graph", run.as_str(), "--format", "dot"],
        vec!["graph", run.as_str(), "--format", "json"],
        vec!["report", run.as_str()],
        vec!["report", run.as_str(), "--json"],
    ] {
        let out = flotilla(state.path()).args(&args).assert();
        let out = out.get_output();
        outputs.push((args.join(" "), out.stdout.clone()));
        outputs.push((format!("{} (stderr)", args.join(" ")), out.stderr.clone()));
    }
    for (command, bytes) in outputs {
        let text = String::from_utf8(bytes).unwrap();
        let bad: Vec<char> = text
            .chars()
            .filter(|&c| (c.is_control() && c != '\n') || c == '\u{202e}')
            .collect();
        assert!(bad.is_empty(), "{command} printed {bad:?}:\n{text}");
    }
    let status = flotilla(state.path()).args(["status", &run]).assert();
    let status = String::from_utf8(status.get_output().stdout.clone()).unwrap();
    assert!(
        status.contains("t2 [failed]") && status.contains("failed: blocked: x\\x1b]0;pwned"),
        "{status}"
    );
}

#[test]
fn a_daemon_error_is_escaped_on_the_error_line() {
    let state = tempfile::tempdir().unwrap();
    let _daemon = DaemonProcess::start(state.path());
    // The daemon quotes the id it could not parse; the CLI must not replay it raw.
    let out = flotilla(state.path())
        .args(["status", "\u{1b}]0;pwned\u{7}\u{202e}"])
        .assert()
        .code(2);
    let stderr = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(
        !stderr
            .chars()
            .any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'),
        "{stderr:?}"
    );
}

#[tokio::test]
async fn decide_answers_a_task_waiting_for_the_user() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    write_project(repo.path(), crate::daemon::USER_DECIDES);
    let _daemon = DaemonProcess::start(state.path());
    let out = flotilla(state.path())
        .args(["submit", "pick a design", "--detach", "--repo"])
        .arg(repo.path())
        .assert()
        .success();
    let run = String::from_utf8(out.get_output().stdout.clone())
        .unwrap()
        .trim()
        .to_string();
    let client = DaemonProcess::client(state.path());
    let mut stream = client.events(&run, None).await.unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(60), async {
        use futures::StreamExt;
        while let Some(e) = stream.next().await {
            if matches!(
                e.unwrap().kind,
                flotilla_actors::protocol::EventKind::AwaitingUserDecision { .. }
            ) {
                return;
            }
        }
        panic!("no decision was asked for");
    })
    .await
    .unwrap();
    flotilla(state.path())
        .args(["status", &run])
        .assert()
        .success()
        .stdout(
            predicates::str::contains("t1 [awaiting your decision]")
                .and(predicates::str::contains("waiting_for_subtasks").not()),
        );
    for format in ["mermaid", "dot"] {
        flotilla(state.path())
            .args(["graph", &run, "--format", format])
            .assert()
            .success()
            .stdout(
                predicates::str::contains("waiting for subtasks")
                    .and(predicates::str::contains("waiting_for_subtasks").not()),
            );
    }
    flotilla(state.path())
        .args(["decide", &run, "t1.1", "--fail"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "task t1.1 is not waiting for a decision (it is completed)",
        ));
    // Exactly one decision: none, or two, is a usage error.
    flotilla(state.path())
        .args(["decide", &run, "t1"])
        .assert()
        .code(2);
    flotilla(state.path())
        .args(["decide", &run, "t1", "--fail", "--complete"])
        .assert()
        .code(2);
    flotilla(state.path())
        .args(["decide", &run, "t1", "--accept", "t1.7"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("not a completed subtask of t1"));
    flotilla(state.path())
        .args(["decide", &run, "t1", "--fail"])
        .assert()
        .success()
        .stdout("decided: t1 fails\n");
    flotilla(state.path())
        .args(["tail", &run])
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .code(1)
        .stdout(
            predicates::str::contains("t1 failed: declined by the user")
                .and(predicates::str::contains("run finished: failed")),
        );
    // After the end, in words.
    for args in [vec!["decide", &run, "t1", "--fail"], vec!["cancel", &run]] {
        flotilla(state.path())
            .args(&args)
            .assert()
            .code(2)
            .stderr(predicates::str::contains("already finished (failed)"));
    }
}

#[test]
fn help_describes_every_option_and_how_to_run_the_daemon() {
    let help = |args: &[&str]| {
        let out = Command::cargo_bin("flotilla")
            .unwrap()
            .args(args)
            .arg("--help")
            .assert()
            .success();
        String::from_utf8(out.get_output().stdout.clone()).unwrap()
    };
    let described = |help: &str, option: &str| {
        // clap prints an option's description on its line, or (in the long layout it picks
        // when options carry `[env: …]`) indented on the next; an option without one has
        // neither.
        let lines: Vec<&str> = help.lines().collect();
        lines
            .iter()
            .position(|l| l.trim_start().starts_with(option))
            .is_some_and(|i| {
                lines[i].trim() != option
                    || lines.get(i + 1).is_some_and(|next| {
                        let next = next.trim();
                        !next.is_empty() && !next.starts_with('-')
                    })
            })
    };
    assert!(described(&help(&["status"]), "--json"), "status --json");
    assert!(described(&help(&["runs"]), "--json"), "runs --json");
    assert!(described(&help(&["graph"]), "--format"), "graph --format");
    let daemon = help(&["daemon"]);
    for words in ["stderr", "FLOTILLA_LOG", "Ctrl-C", "SIGTERM", "daemon.lock"] {
        assert!(
            daemon.contains(words),
            "daemon --help lacks {words}:\n{daemon}"
        );
    }
}

#[test]
fn the_token_is_never_sent_to_a_non_loopback_address() {
    let state = tempfile::tempdir().unwrap();
    std::fs::write(state.path().join("token"), "s3cr3t\n").unwrap();
    let out = flotilla(state.path())
        .args(["--connect", "192.0.2.1:7070", "runs"])
        .timeout(std::time::Duration::from_secs(20))
        .assert()
        .code(2);
    let stderr = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    assert!(stderr.contains("not a loopback address"), "{stderr}");
    assert!(stderr.contains("hint: "), "{stderr}");
    let out = flotilla(state.path())
        .env("FLOTILLA_CONNECT", "[2001:db8::1]:7070")
        .arg("runs")
        .timeout(std::time::Duration::from_secs(20))
        .assert()
        .code(2);
    let stderr = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    assert!(stderr.contains("not a loopback address"), "{stderr}");
}

/// A fake daemon on a Unix socket that answers each request with the next of `answers`
/// (raw HTTP), then closes. Returns how many requests it read.
fn scripted_server(
    path: &std::path::Path,
    answers: Vec<String>,
) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    use std::io::{Read, Write};
    let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for answer in answers {
            let Ok((mut stream, _)) = listener.accept() else {
                return;
            };
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    count
}

#[test]
fn an_error_answer_that_is_not_json_is_still_reported() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("fake.sock");
    scripted_server(
        &socket,
        vec![
            "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".into(),
            "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 8\r\n\r\n\x1b]0;pwn\x07".into(),
        ],
    );
    let out = flotilla(dir.path())
        .arg("--socket")
        .arg(&socket)
        .args(["status", "0123"])
        .assert()
        .code(2);
    let stderr = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    assert!(
        stderr.starts_with("error: the daemon answered 404 Not Found"),
        "{stderr:?}"
    );
    let out = flotilla(dir.path())
        .arg("--socket")
        .arg(&socket)
        .args(["status", "0123"])
        .assert()
        .code(4);
    let stderr = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    assert!(
        stderr
            .starts_with("error: the daemon answered 500 Internal Server Error: \\x1b]0;pwn\\x07"),
        "escaped: {stderr:?}"
    );
}

#[test]
fn a_busy_daemon_is_asked_again_as_it_says_then_given_up_on_with_a_hint() {
    let busy = "HTTP/1.1 503 Service Unavailable\r\nretry-after: 0\r\ncontent-type: application/json\r\ncontent-length: 73\r\n\r\n{\"error\":\"the daemon is serving too many connections; try again shortly\"}";
    assert_eq!(busy.split("\r\n\r\n").nth(1).unwrap().len(), 73);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("fake.sock");
    let mut answers = vec![busy.to_string(); 2];
    answers.push(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n[]".into(),
    );
    let seen = scripted_server(&socket, answers);
    flotilla(dir.path())
        .arg("--socket")
        .arg(&socket)
        .arg("runs")
        .assert()
        .success()
        .stdout(predicates::str::contains("no runs yet"));
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 3);

    let socket = dir.path().join("busy.sock");
    let seen = scripted_server(&socket, vec![busy.to_string(); 10]);
    let out = flotilla(dir.path())
        .arg("--socket")
        .arg(&socket)
        .arg("runs")
        .assert()
        .failure();
    let stderr = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    assert!(stderr.contains("too many connections"), "{stderr}");
    assert!(
        stderr.contains("hint: ") && stderr.contains("try again shortly"),
        "{stderr}"
    );
    assert_eq!(
        seen.load(std::sync::atomic::Ordering::SeqCst),
        flotilla::cli::client::BUSY_ATTEMPTS as usize
    );
}

#[test]
fn common_api_errors_come_with_a_hint() {
    let state = tempfile::tempdir().unwrap();
    let _daemon = DaemonProcess::start(state.path());
    flotilla(state.path())
        .args(["status", "0123abcd"])
        .assert()
        .code(2)
        .stderr(
            predicates::str::contains("no run matches")
                .and(predicates::str::contains("hint: see `flotilla runs`")),
        );
    flotilla(state.path())
        .args(["status", "not-an-id"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("not a run id").and(predicates::str::contains("hint: ")));
}

/// A state directory with two runs the daemon cannot resume: one with an undecodable journal
/// row, one whose stored config is unreadable.
async fn state_with_damaged_runs() -> (tempfile::TempDir, [String; 2]) {
    use flotilla::journal::{RunRecord, SqliteJournal};
    use flotilla_actors::ports::SystemClock;
    use flotilla_actors::protocol::RunId;
    let state = tempfile::tempdir().unwrap();
    let path = state.path().join("journal.sqlite");
    let journal = SqliteJournal::open(&path, std::sync::Arc::new(SystemClock)).unwrap();
    let ids = [RunId::generate(), RunId::generate()];
    for (i, id) in ids.iter().enumerate() {
        journal
            .create_run(RunRecord {
                id: *id,
                request: format!("damaged run {i}"),
                repo: "/tmp".into(),
                config: run_config("", 1),
                created_ms: i as u64,
                outcome: None,
            })
            .await
            .unwrap();
    }
    drop(journal);
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute(
        "INSERT INTO events (run, at_ms, kind, data) VALUES (?1, 0, 'task_ready', '{not json')",
        [ids[0].to_string()],
    )
    .unwrap();
    conn.execute(
        "UPDATE runs SET config = '{\"limits\": 7' WHERE id = ?1",
        [ids[1].to_string()],
    )
    .unwrap();
    (state, ids.map(|id| id.to_string()))
}

#[tokio::test]
async fn damaged_runs_are_shown_as_damaged_with_their_problem() {
    let (state, [unreadable_row, unreadable_config]) = state_with_damaged_runs().await;
    let _daemon = DaemonProcess::start(state.path());
    for (run, why) in [
        (&unreadable_row, "unreadable"),
        (&unreadable_config, "config"),
    ] {
        let out = flotilla(state.path())
            .args(["status", run])
            .assert()
            .success();
        let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
        assert!(text.starts_with(&format!("run {run}  damaged\n")), "{text}");
        let problem = text
            .lines()
            .find(|l| l.starts_with("problem: damaged"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(problem.contains(why), "{text}");
    }
    flotilla(state.path())
        .args(["tail", &unreadable_row])
        .assert()
        .code(2)
        .stderr(predicates::str::contains(format!(
            "error: run {unreadable_row} is damaged: journal entry"
        )));
    let out = flotilla(state.path()).arg("status").assert().success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(
        text.contains("runs: 2 in total, 0 running, 2 damaged"),
        "{text}"
    );
    for run in [&unreadable_row, &unreadable_config] {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(&run[..8]))
            .unwrap_or_else(|| panic!("{run} is not listed: {text}"));
        assert!(
            line.contains("damaged") && line.contains("(damaged: "),
            "{line}"
        );
    }
}

#[test]
fn ctrl_c_stops_following_and_says_how_to_follow_again() {
    use std::io::BufRead;
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    // The run waits for a decision: it goes on until someone decides.
    write_project(repo.path(), crate::daemon::USER_DECIDES);
    let _daemon = DaemonProcess::start(state.path());
    let out = flotilla(state.path())
        .args(["submit", "pick a design", "--detach", "--repo"])
        .arg(repo.path())
        .assert()
        .success();
    let run = String::from_utf8(out.get_output().stdout.clone())
        .unwrap()
        .trim()
        .to_string();
    let mut tail = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .arg("--state-dir")
        .arg(state.path())
        .args(["tail", &run])
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(tail.stdout.take().unwrap()).lines();
    let mut last_seq = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        last_seq = line
            .split_whitespace()
            .nth(1)
            .unwrap()
            .trim_start_matches('#')
            .to_string();
        if line.contains("waits for your decision") {
            break;
        }
    }
    let killed = std::process::Command::new("kill")
        .args(["-INT", &tail.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = tail.wait_with_output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("goes on"), "{stderr}");
    assert!(
        stderr.contains(&format!("`flotilla tail {run} --since {last_seq}`")),
        "{stderr}"
    );
}

/// `providers check` calls each configured model once, without a daemon, and says per role
/// whether it answered; the exit code is 0 only if all did. The key goes to the server and
/// never to the output.
#[tokio::test]
async fn providers_check_says_per_role_which_models_answer() {
    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header("authorization", "Bearer sk-check-secret-1234"))
        .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 1},
        })))
        .mount(&server)
        .await;
    // Nothing listens on port 1: that endpoint is unreachable.
    let config = format!(
        r#"
[providers.good]
kind = "openai"
base_url = "{}/v1"
api_key_env = "FLOTILLA_CHECK_TEST_KEY"
stream = false

[providers.gone]
kind = "openai"
base_url = "http://127.0.0.1:1/v1"

[roles]
planner = "good/tiny"
worker = "gone/other"
"#,
        server.uri()
    );
    let repo = git_repo();
    std::fs::write(repo.path().join("flotilla.toml"), config).unwrap();
    let state = tempfile::tempdir().unwrap();
    let mut cmd = flotilla(state.path());
    cmd.args(["providers", "check", "--timeout", "10", "--repo"])
        .arg(repo.path())
        .env("FLOTILLA_CHECK_TEST_KEY", "sk-check-secret-1234");
    // The binary blocks; the mock server answers on this test's runtime meanwhile.
    let out = tokio::task::spawn_blocking(move || cmd.assert().code(4).get_output().clone())
        .await
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(
        lines[0].starts_with("planner") && lines[0].contains("good/tiny"),
        "{stdout}"
    );
    assert!(lines[0].contains(" reachable"), "{stdout}");
    assert!(
        lines[1].starts_with("worker") && lines[1].contains("unreachable"),
        "{stdout}"
    );
    assert!(lines[1].contains("could not be reached"), "{stdout}");
    assert!(!stdout.contains("sk-check-secret"), "{stdout}");
    let received = server.received_requests().await.unwrap();
    assert_eq!(received.len(), 1, "one call, no retries");
}

/// `flotilla gc` removes what a finished run left (a worktree a crash left, a directory no
/// run owns), keeps delivered branches, and says what it did; `--dry-run` only says.
#[tokio::test]
async fn gc_removes_what_finished_runs_left_and_keeps_delivered_work() {
    use flotilla::git::worktrees::GitWorktrees;
    use flotilla_actors::ports::{WorktreeRequest, Worktrees};
    use flotilla_actors::protocol::{RunId, TaskId, branch_name};

    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let daemon = DaemonProcess::start(state.path());
    let client = DaemonProcess::client(state.path());
    let scenario = r#"
[[planner.answers]]
tasks = [{ description = "one", scope = ["a.rs"] }]
[tasks.t1]
writes = { "a.rs" = "fn a() {}\n" }
"#;
    let run = submit(&client, repo.path(), run_config(scenario, 1)).await;
    follow_to_end(&client, &run, None).await;
    // The daemon's own clean-up after the run comes after its last event: planted before
    // it, the leftover below would be its to remove, not gc's.
    assert!(
        daemon
            .logged_within(
                "cleaned up after the run",
                std::time::Duration::from_secs(60)
            )
            .await,
        "{}",
        daemon.log()
    );
    // What a crash at the wrong moment leaves: a worktree of the finished run, and a
    // directory nobody owns.
    let run_id = RunId::from_uuid(run.parse().unwrap());
    let leftover_dir = state.path().join("worktrees").join(&run);
    let task: TaskId = "t9".parse().unwrap();
    let leftover = GitWorktrees::new(repo.path(), run_id, &leftover_dir, main_branch())
        .prepare(WorktreeRequest {
            branch: branch_name(run_id, &task, 1),
            task,
            attempt: 1,
            start: flotilla_actors::ports::WorktreeStart::Main,
        })
        .await
        .unwrap();
    let stray = state.path().join("worktrees").join("not-a-run");
    std::fs::create_dir_all(&stray).unwrap();

    let dry = flotilla(state.path())
        .args(["gc", "--dry-run"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&dry.stdout);
    assert!(dry.status.success(), "{text}");
    assert!(text.starts_with("would remove 1 worktree(s)"), "{text}");
    assert!(
        leftover.path.exists() && stray.exists(),
        "a dry run removes nothing"
    );

    let out = flotilla(state.path())
        .args(["gc", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["worktrees"].as_array().unwrap().len(), 1, "{report}");
    assert_eq!(report["branches"][0], leftover.branch.as_str());
    assert_eq!(report["unknown"].as_array().unwrap().len(), 1);
    assert!(!leftover.path.exists() && !stray.exists());
    let git = git2::Repository::open(repo.path()).unwrap();
    assert!(
        git.find_branch(
            &branch_name(run_id, &"t1".parse().unwrap(), 1),
            git2::BranchType::Local
        )
        .is_err(),
        "the delivered branch landed on main and was deleted"
    );
    assert!(
        git.find_branch(&leftover.branch, git2::BranchType::Local)
            .is_err()
    );
    let again = flotilla(state.path()).arg("gc").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&again.stdout),
        "nothing to collect\n"
    );
    drop(daemon);
}

/// Issue 20: the live tail line printed an agent's activity raw (an OSC retitle, a clear
/// screen and U+202E reached the terminal). `submit` follows the run on a pseudo-terminal
/// (util-linux `script`), with an external agent printing hostile activity: the bytes
/// that reach the terminal hold the activity visibly escaped, and no ESC, C1 or bidi
/// control but flotilla's own line redraw (`\r\x1b[2K`).
#[test]
fn the_live_line_on_a_terminal_shows_agent_activity_escaped() {
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: util-linux `script` (for a pseudo-terminal) is not installed");
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    // The agent says what it does (its lines are its activity), waits a little so the
    // run is followed while it works, and hands back an envelope.
    let agent = r#"sleep 1; printf 'editing \033]0;pwned\007\033[2J\342\200\256evil\302\233c\n'; sleep 1; echo '{"status": "complete", "summary": "nothing to do"}'"#;
    std::fs::write(
        repo.path().join("flotilla.toml"),
        format!(
            "[provider]\nscenario = \"scenario.toml\"\n\n[agents.hostile]\nprogram = \"sh\"\n\
             args = [\"-c\", {}]\n\n[[workers]]\nname = \"general\"\nagent = \"hostile\"\n",
            toml_string(agent)
        ),
    )
    .unwrap();
    std::fs::write(
        repo.path().join("scenario.toml"),
        "[[planner.answers]]\ntasks = [{ description = \"look\", scope = [\"a.rs\"] }]\n",
    )
    .unwrap();
    let _daemon = DaemonProcess::start(state.path());
    // A terminal wide enough for the whole live line (it is cut to the width).
    let line = format!(
        "stty cols 1000 rows 50; {} --state-dir {} submit 'look around' --repo {}",
        env!("CARGO_BIN_EXE_flotilla"),
        state.path().display(),
        repo.path().display()
    );
    let out = std::process::Command::new("script")
        .args(["-q", "-e", "-c", &line, "/dev/null"])
        .env("NO_COLOR", "1")
        .env_remove("FLOTILLA_SOCKET")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("run finished"), "{text}");
    assert!(
        text.contains("editing \\x1b]0;pwned\\x07\\x1b[2J\\u{202e}evil\\u{9b}c"),
        "the activity is shown, escaped: {text:?}"
    );
    let ours = text.replace("\r\x1b[2K", "");
    let bad: Vec<char> = ours
        .chars()
        .filter(|&c| {
            c == '\x1b'
                || ('\u{80}'..='\u{9f}').contains(&c)
                || ('\u{202a}'..='\u{202e}').contains(&c)
                || ('\u{2066}'..='\u{2069}').contains(&c)
        })
        .collect();
    assert!(bad.is_empty(), "raw {bad:?} reached the terminal: {text:?}");
}

/// `text` as a TOML basic string.
fn toml_string(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

/// Issue 21 item 6: an error keeps its causes to the end: `error:` says what failed, a
/// `Caused by:` line each why (a cause its error already says is not repeated), `hint:`
/// what to do, with the kind's exit code (a user's or a config's mistake: 2).
#[test]
fn an_error_says_what_failed_then_each_cause_then_the_hint() {
    let state = tempfile::tempdir().unwrap();
    let missing = state.path().join("no-such-repo");
    let out = flotilla(state.path())
        .args(["submit", "x", "--repo"])
        .arg(&missing)
        .assert()
        .code(2);
    let stderr = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 3, "{stderr}");
    assert_eq!(lines[0], format!("error: repository {}", missing.display()));
    assert!(
        lines[1].starts_with("Caused by: ") && lines[1].contains("No such file"),
        "{stderr}"
    );
    assert_eq!(lines[2], "hint: pass --repo PATH");

    // The token of a daemon on TCP: its reading error says the file and the cause once.
    let out = flotilla(state.path())
        .args(["status", "--connect", "127.0.0.1:9"])
        .assert()
        .code(2);
    let stderr = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 3, "{stderr}");
    assert_eq!(lines[0], "error: the daemon's token");
    assert!(
        lines[1].starts_with("Caused by: ") && lines[1].contains("token"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("No such file").count(), 1, "{stderr}");
    assert!(
        lines[2].starts_with("hint: use the same --state-dir"),
        "{stderr}"
    );
}

/// Issue 21 item 1: the live line under `tail` counts tasks with the same fold and the
/// same counting as `status`, so the two cannot disagree (the CLI used to fold task states
/// by hand). A run with a done task, a failed attempt, a running one and pending ones.
#[test]
fn the_live_line_counts_what_status_counts() {
    use flotilla_actors::config::Limits;
    use flotilla_actors::graph::RunGraph;
    use flotilla_actors::protocol::{
        AttemptFailure, Event, Handoff, Route, RunId, TaskCompleted, TaskId, TaskSpec,
    };

    let mut g = RunGraph::new(Limits::default());
    let specs = (1..=5)
        .map(|n| TaskSpec::new(format!("task {n}"), &[&format!("src/{n}.rs")]))
        .collect();
    let mut kinds = g.submit(specs).unwrap();
    kinds.extend(g.planning_finished().unwrap());
    let t = |n: u32| TaskId::root(n);
    for n in 1..=3 {
        kinds.extend(g.dispatched(&t(n), 1, "w", Route::Worker).unwrap());
        kinds.extend(g.started(&t(n), 1).unwrap());
    }
    kinds.extend(
        g.complete(TaskCompleted {
            task: t(1),
            attempt: 1,
            handoff: Some(Handoff::complete("done")),
            artifacts: Vec::new(),
            subplan: None,
        })
        .unwrap(),
    );
    // Retried or failed, as the limits say: both sides count what the graph says.
    kinds.extend(
        g.failed(
            &t(2),
            1,
            AttemptFailure::Crashed {
                detail: "gave up".into(),
            },
        )
        .unwrap(),
    );
    let run = RunId::generate();
    let events: Vec<Event> = kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| Event {
            seq: i as u64 + 1,
            run,
            at_ms: 1_000,
            kind,
        })
        .collect();
    let record = flotilla::journal::RunRecord {
        id: run,
        request: "r".into(),
        repo: "/tmp".into(),
        config: serde_json::Value::Null,
        created_ms: 1_000,
        outcome: None,
    };
    let status = flotilla::daemon::report::status(&record, Limits::default(), &events);
    let c = &status.counts;
    let mut live = flotilla::cli::render::live::LiveLine::default();
    for e in &events {
        live.observe(e);
    }
    let line = live.summary(1_000);
    let expected = format!(
        "{} done · {} running · {} pending · {} failed/cancelled",
        c.completed,
        c.running + c.waiting,
        c.pending,
        c.failed + c.cancelled
    );
    assert!(line.starts_with(&expected), "{line} / status: {c:?}");
    assert_eq!(c.completed, 1, "{c:?}");
    assert_eq!(c.total, 5, "{c:?}");
}

/// The state directory (here: where the CLI looks for the daemon's socket) is
/// `$FLOTILLA_STATE_DIR`, else `$XDG_STATE_HOME/flotilla`, else `~/.local/state/flotilla`;
/// an empty `$XDG_STATE_HOME` counts as unset.
#[test]
fn the_state_directory_is_flotilla_state_dir_else_xdg_state_home_else_home() {
    let explicit = tempfile::tempdir().unwrap();
    let xdg = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let looked_in = |env: &[(&str, &std::path::Path)]| -> String {
        let mut cmd = Command::cargo_bin("flotilla").unwrap();
        cmd.env("NO_COLOR", "1")
            .env_remove("FLOTILLA_SOCKET")
            .env_remove("FLOTILLA_STATE_DIR")
            .env_remove("XDG_STATE_HOME");
        for (key, value) in env {
            cmd.env(key, value);
        }
        let out = cmd.arg("runs").assert().code(3);
        String::from_utf8(out.get_output().stderr.clone()).unwrap()
    };
    let socket = |dir: std::path::PathBuf| dir.join("daemon.sock").display().to_string();
    let cases = [
        (
            looked_in(&[
                ("FLOTILLA_STATE_DIR", explicit.path()),
                ("XDG_STATE_HOME", xdg.path()),
                ("HOME", home.path()),
            ]),
            socket(explicit.path().to_path_buf()),
        ),
        (
            looked_in(&[("XDG_STATE_HOME", xdg.path()), ("HOME", home.path())]),
            socket(xdg.path().join("flotilla")),
        ),
        (
            looked_in(&[("HOME", home.path())]),
            socket(home.path().join(".local/state/flotilla")),
        ),
        (
            looked_in(&[
                ("XDG_STATE_HOME", std::path::Path::new("")),
                ("HOME", home.path()),
            ]),
            socket(home.path().join(".local/state/flotilla")),
        ),
    ];
    for (stderr, expected) in cases {
        assert!(
            stderr.contains(&expected),
            "expected {expected} in: {stderr}"
        );
    }
}
