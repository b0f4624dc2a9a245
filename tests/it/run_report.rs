//! `flotilla report RUN` (and the summary `submit` ends with) through the built binary, on a finished run of a real daemon on the
//! scripted provider: one task lands first try, one after a retry, one delivers an empty
//! diff and one is blocked, with text that needs escaping. The `--json` fields say exactly
//! that, and the text says it to a person without letting the agent's text act on the
//! terminal.

use crate::daemon_env::*;

/// The command's standard output; it must exit with `code`.
fn output(state: &std::path::Path, args: &[&str], code: i32) -> String {
    let out = flotilla(state)
        .args(args)
        .timeout(std::time::Duration::from_secs(120))
        .assert()
        .code(code);
    String::from_utf8(out.get_output().stdout.clone()).unwrap()
}

/// One after the other (each depends on the one before), so that the run is the same every
/// time.
const SCENARIO: &str = r#"
[agent]
delay_ms = 30

[[planner.answers]]
tasks = [
  { description = "write the lexer", scope = ["src/lex.rs"] },
  { description = "write the parser", scope = ["src/parse.rs"], dependencies = [0] },
  { description = "check the docs", scope = ["docs"], dependencies = [1] },
  { description = "write the grammar", scope = ["src/grammar.rs"], dependencies = [2] },
]
[tasks.t1]
summary = "wrote the lexer"
writes = { "src/lex.rs" = "pub fn lex() {}\n" }
[tasks.t2]
summary = "wrote the parser"
writes = { "src/parse.rs" = "pub fn parse() {}\n" }
attempts = [{ outcome = "failed", summary = "the first try broke" }]
[tasks.t3]
summary = "the docs were fine"
[tasks.t4]
outcome = "blocked"
summary = "no grammar \u001b[2J given"
"#;

#[test]
fn report_counts_first_tries_retries_empty_diffs_landings_and_what_is_left() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    std::fs::write(
        repo.path().join("flotilla.toml"),
        "[provider]\nscenario = \"scenario.toml\"\n",
    )
    .unwrap();
    std::fs::write(repo.path().join("scenario.toml"), SCENARIO).unwrap();
    let _daemon = DaemonProcess::start(state.path());
    // Followed to its end (the blocked task fails the run: exit code 1), `submit` ends with
    // the run's report.
    let submitted = flotilla(state.path())
        .args(["submit", "build a parser", "--repo"])
        .arg(repo.path())
        .timeout(std::time::Duration::from_secs(120))
        .assert()
        .code(1);
    let stderr = String::from_utf8(submitted.get_output().stderr.clone()).unwrap();
    let run = stderr.split_whitespace().nth(1).unwrap().to_string();
    let followed = String::from_utf8(submitted.get_output().stdout.clone()).unwrap();
    let summary = followed
        .split_once("\nRun ")
        .map(|(_, report)| format!("Run {report}"))
        .unwrap_or_else(|| panic!("no report at the end of:\n{followed}"));
    assert!(
        summary.starts_with(&format!("Run {run} failed")),
        "{summary}"
    );
    assert!(summary.contains("Left for you:"), "{summary}");

    let json = output(state.path(), &["report", &run, "--json"], 0);
    let r: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(r["id"], run.as_str());
    assert_eq!(r["state"], "failed");
    let tasks = &r["tasks"];
    assert_eq!(tasks["total"], 4, "{json}");
    assert_eq!(tasks["completed"], 3, "{json}");
    assert_eq!(tasks["completed_first_try"], 2, "{json}");
    assert_eq!(tasks["retried"], 1, "{json}");
    assert_eq!(tasks["retries"], 1, "{json}");
    assert_eq!(tasks["empty_diffs"], 1, "{json}");
    assert_eq!(tasks["failed"], 1, "{json}");
    assert_eq!(tasks["unfinished"], 0, "{json}");
    let merges = &r["merges"];
    assert_eq!(merges["queued"], 2, "{json}");
    assert_eq!(merges["landed"], 2, "{json}");
    assert_eq!(merges["conflicts"], 0, "{json}");
    assert_eq!(merges["success_rate"], 1.0, "{json}");
    // The planner's calls and the agents' reports were charged.
    assert!(r["spent"]["tokens"].as_u64().unwrap() > 0, "{json}");
    assert!(r["planner_spent"]["tokens"].as_u64().unwrap() > 0, "{json}");
    assert_eq!(r["task_time"]["count"], 3, "{json}");
    assert!(
        r["task_time"]["p50_ms"].as_u64().unwrap() <= r["task_time"]["p90_ms"].as_u64().unwrap()
    );
    let makespan = &r["makespan"];
    let work = makespan["work_ms"].as_u64().unwrap();
    // Five worker attempts of at least the agent's delay each.
    assert!(work >= 5 * 30, "{json}");
    assert!(
        makespan["lower_bound_ms"].as_u64().unwrap() <= makespan["makespan_ms"].as_u64().unwrap(),
        "{json}"
    );
    assert_eq!(r["subtrees"].as_array().unwrap().len(), 4, "{json}");
    let left = &r["left_for_user"];
    assert_eq!(left["blocked"][0]["task"], "t4", "{json}");
    assert_eq!(
        left["blocked"][0]["why"], "no grammar \u{1b}[2J given",
        "{json}"
    );
    assert!(left["failed"].as_array().unwrap().is_empty(), "{json}");

    let text = output(state.path(), &["report", &run], 0);
    assert_eq!(text, summary, "submit's summary is the report");
    assert!(
        text.contains(&format!("Run {run} failed: build a parser")),
        "{text}"
    );
    assert!(
        text.contains("Tasks: 4 (0 fix tasks) · 3 completed, 2 first try"),
        "{text}"
    );
    assert!(text.contains("1 retried (1 retry)"), "{text}");
    assert!(text.contains("1 empty diff"), "{text}");
    assert!(
        text.contains(
            "Merges: 2 queued, 2 landed, 0 through a conflict fix (100% of queued branches landed)"
        ),
        "{text}"
    );
    assert!(text.contains("p50 "), "{text}");
    assert!(text.contains("Makespan: "), "{text}");
    assert!(
        text.contains("  t1 write the lexer: 1 task, 1 completed"),
        "{text}"
    );
    assert!(
        text.contains("t4 is blocked: no grammar \\x1b[2J given"),
        "{text}"
    );
    assert!(!text.contains('\u{1b}'), "{text}");

    // A prefix names the run; a run that does not exist is a clear error.
    let prefix = &run[..8];
    assert!(output(state.path(), &["report", prefix], 0).contains(&run));
    let missing = flotilla(state.path())
        .args(["report", "ffffffff"])
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .failure();
    let err = String::from_utf8(missing.get_output().stderr.clone()).unwrap();
    assert!(err.contains("ffffffff"), "{err}");
}

/// The report route is behind the bearer token like every other, and the typed client reads
/// it; its worker slots are the run's own `max_workers`.
#[tokio::test]
async fn the_report_route_needs_the_token_and_the_client_reads_it() {
    let daemon = InProcessDaemon::start(true);
    let flotilla::daemon::Bound::Tcp { addr, .. } = daemon.bound.clone() else {
        panic!("expected TCP")
    };
    let repo = git_repo();
    let scenario = r#"
[[planner.answers]]
tasks = [{ description = "write the lexer", scope = ["src/lex.rs"] }]
[tasks.t1]
summary = "wrote the lexer"
writes = { "src/lex.rs" = "pub fn lex() {}\n" }
"#;
    let run = submit(&daemon.client, repo.path(), run_config(scenario, 3)).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(
        outcome(&events),
        Some(flotilla_actors::protocol::RunOutcome::Completed)
    );

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request =
        format!("GET /v1/runs/{run}/report HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 401"), "{response}");

    let report = daemon.client.report(&run[..8]).await.unwrap();
    assert_eq!(report.id, run);
    assert_eq!(report.state, "completed");
    assert_eq!(report.tasks.total, 1);
    assert_eq!(report.tasks.completed_first_try, 1);
    assert_eq!(report.merges.landed, 1);
    assert_eq!(report.makespan.worker_slots, 3);
    assert!(report.left_for_user.is_empty(), "{report:?}");
    daemon.stop();
}
