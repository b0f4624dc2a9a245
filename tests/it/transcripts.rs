//! Transcripts (ADR-036) through the built binary: a scripted and a built-in-agent attempt
//! (the built-in agent's model a local fake of an OpenAI endpoint) keep their conversation
//! under the state directory, `flotilla log` shows it with the agents' hostile text escaped
//! (`--json` as entries, `--follow` ending with the attempt), and `flotilla gc` removes a
//! finished run's transcripts with it. A command agent's output lines reach the sink the
//! attempt context carries.

use std::path::Path;
use std::sync::{Arc, Mutex};

use flotilla::api::transcript::TranscriptLine;
use flotilla_actors::ports::{
    Agent, AttemptContext, TranscriptKind, TranscriptSink, TranscriptWriter, Workspace,
};
use flotilla_actors::protocol::RunOutcome;

use crate::daemon_env::*;

/// The command's standard output and error; it must exit with `code`.
fn output(state: &Path, args: &[&str], code: i32) -> (String, String) {
    let out = flotilla(state)
        .args(args)
        .timeout(std::time::Duration::from_secs(120))
        .assert()
        .code(code);
    let out = out.get_output();
    (
        String::from_utf8(out.stdout.clone()).unwrap(),
        String::from_utf8(out.stderr.clone()).unwrap(),
    )
}

/// `log --json`'s entries.
fn entries(state: &Path, run: &str, task: &str) -> Vec<TranscriptLine> {
    let (json, _) = output(state, &["log", run, task, "--json"], 0);
    json.lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn kinds(entries: &[TranscriptLine]) -> Vec<TranscriptKind> {
    entries.iter().map(|e| e.kind).collect()
}

const HOSTILE: &str = "\u{1b}]0;owned\u{7}\u{1b}[2J";

#[tokio::test]
async fn a_scripted_attempt_s_transcript_is_shown_escaped_and_gc_removes_it() {
    let (_tmp, state, repo) = state_and_repo();
    let daemon = DaemonProcess::start(&state);
    let scenario = r#"
[[planner.answers]]
tasks = [{ description = "write the lexer", scope = ["src"] }]
[tasks.t1]
summary = "wrote the lexer \u001b]0;owned\u0007\u001b[2J"
writes = { "src/lex.rs" = "pub fn lex() {}\n" }
"#;
    let client = DaemonProcess::client(&state);
    let run = submit(&client, &repo, run_config(scenario, 1)).await;
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(
        outcome(&events),
        Some(RunOutcome::Completed),
        "{}",
        daemon.log()
    );

    let file = state.join("transcripts").join(&run).join("t1-a1.jsonl");
    assert!(file.exists(), "{}", file.display());
    let found = entries(&state, &run, "t1");
    assert_eq!(
        kinds(&found),
        [
            TranscriptKind::Prompt,
            TranscriptKind::Step,
            TranscriptKind::Assistant,
            TranscriptKind::End
        ],
        "{found:?}"
    );
    assert!(
        found[0].text.contains("write the lexer"),
        "the task it was given"
    );
    assert!(found[1].text.contains("src/lex.rs"), "{}", found[1].text);
    assert!(found[2].text.ends_with(HOSTILE), "kept as written");

    let (text, _) = output(&state, &["log", &run, "t1"], 0);
    assert!(text.contains("attempt 1"), "{text}");
    assert!(
        text.contains("wrote the lexer \\x1b]0;owned\\x07\\x1b[2J"),
        "{text}"
    );
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{text:?}"
    );
    // Following an attempt that ended shows it whole and ends.
    let (followed, _) = output(&state, &["log", &run, "t1", "--follow"], 0);
    assert_eq!(followed, text);
    // An attempt without a transcript is a clear error.
    let (_, error) = output(&state, &["log", &run, "t1", "--attempt", "7"], 2);
    assert!(
        error.contains("no transcript of task t1 for attempt 7"),
        "{error}"
    );

    // A restart, after a crash above all, is when a transcript is read: the start-up
    // collection keeps it.
    daemon.kill();
    let daemon = DaemonProcess::start(&state);
    assert!(
        daemon
            .logged_within("collection done", std::time::Duration::from_secs(30))
            .await,
        "{}",
        daemon.log()
    );
    assert!(file.exists(), "kept across a restart");
    let (after_restart, _) = output(&state, &["log", &run, "t1"], 0);
    assert_eq!(after_restart, text);

    let (collected, _) = output(&state, &["gc"], 0);
    assert!(
        collected.contains("the transcripts of 1 run(s)"),
        "{collected}"
    );
    assert!(!file.exists() && !file.parent().unwrap().exists());
    let (_, error) = output(&state, &["log", &run, "t1"], 2);
    assert!(error.contains("no transcript of task t1"), "{error}");
    drop(daemon);
}

#[tokio::test]
async fn a_builtin_agent_s_messages_tool_calls_and_results_are_shown_escaped() {
    let server = fake_worker_model(
        tool_calls_answer(
            Some("looking \u{1b}[31maround"),
            serde_json::json!([tool_call(
                "a",
                "run_command",
                serde_json::json!({ "command":
                "mkdir -p out && printf 'hi \\033]0;owned\\007 there\\n' | tee out/said.txt" })
            )]),
        ),
        tool_calls_answer(
            Some(""),
            serde_json::json!([tool_call(
                "b",
                "finish",
                serde_json::json!({ "status": "complete", "summary": "said hi" })
            )]),
        ),
    )
    .await;

    let (_tmp, state, repo) = state_and_repo();
    let daemon = DaemonProcess::start_with_env(&state, &[("OPENAI_API_KEY", "sk-test")]);
    let scenario = r#"
[[planner.answers]]
tasks = [{ description = "say hi", scope = ["out"] }]
"#;
    let mut config = run_config(scenario, 1);
    use_local_worker_model(&mut config, &server);
    let client = DaemonProcess::client(&state);
    let run = submit(&client, &repo, config).await;
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(
        outcome(&events),
        Some(RunOutcome::Completed),
        "{}",
        daemon.log()
    );

    let found = entries(&state, &run, "t1");
    assert_eq!(
        kinds(&found),
        [
            TranscriptKind::Prompt, // the system prompt
            TranscriptKind::Prompt, // the task
            TranscriptKind::Assistant,
            TranscriptKind::ToolCall,
            TranscriptKind::ToolResult,
            TranscriptKind::ToolCall, // finish
            TranscriptKind::End
        ],
        "{found:?}"
    );
    assert!(found[1].text.contains("say hi"), "{}", found[1].text);
    assert!(
        found[3].text.starts_with("run_command "),
        "{}",
        found[3].text
    );
    assert!(
        found[4].text.contains("hi \u{1b}]0;owned\u{7} there"),
        "{}",
        found[4].text
    );
    assert!(found[5].text.starts_with("finish "), "{}", found[5].text);

    let (text, _) = output(&state, &["log", &run, "t1", "--attempt", "1"], 0);
    assert!(text.contains("looking \\x1b[31maround"), "{text}");
    assert!(text.contains("hi \\x1b]0;owned\\x07 there"), "{text}");
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{text:?}"
    );
    drop(daemon);
}

/// Keeps what it is given, for a test to read.
#[derive(Default)]
struct Kept(Mutex<Vec<(TranscriptKind, String)>>);

impl TranscriptWriter for Kept {
    fn record(&self, kind: TranscriptKind, text: &str) {
        self.0.lock().unwrap().push((kind, text.to_string()));
    }

    fn end(&self) {
        self.record(TranscriptKind::End, "");
    }
}

#[actix::test]
async fn a_command_agent_s_output_lines_are_its_transcript() {
    use flotilla::agents::command::{CommandAgent, CommandAgentConfig, PromptVia};

    let dir = tempfile::tempdir().unwrap();
    let fake = format!("{}/fake-agent.sh", crate::command_agent::FIXTURES);
    let config = CommandAgentConfig {
        program: Some("sh".into()),
        args: Some(vec![fake, "envelope".into(), "{prompt_file}".into()]),
        prompt: Some(PromptVia::File),
        ..CommandAgentConfig::default()
    };
    let agent = CommandAgent::new(
        "fake".into(),
        config,
        Arc::new(crate::process::unsandboxed()),
        "You are a worker.".into(),
    )
    .unwrap();
    let kept = Arc::new(Kept::default());
    let attempt = AttemptContext {
        transcript: TranscriptSink::new(kept.clone()),
        ..AttemptContext::detached()
    };
    let mut session = agent.open(Workspace::scratch(dir.path().into()), attempt);
    let report = session
        .run(crate::command_agent::assignment("t1", "write a"))
        .await
        .unwrap();
    assert_eq!(report.handoff.unwrap().summary, "wrote a");
    let lines = kept.0.lock().unwrap().clone();
    let stdout: Vec<&str> = lines
        .iter()
        .filter(|(k, _)| *k == TranscriptKind::Stdout)
        .map(|(_, t)| t.as_str())
        .collect();
    assert_eq!(
        stdout,
        ["reading the task", "writing src/a.rs", "handed back"]
    );
    assert!(
        lines.contains(&(TranscriptKind::Stderr, "a warning on stderr".into())),
        "{lines:?}"
    );
}

/// `log --follow` started before the task: it waits for the attempt's first entries (the
/// daemon's long poll, woken by the writer), shows them as they come, and ends when the
/// attempt does (here called off by a cancel).
#[tokio::test]
async fn following_shows_a_live_attempt_and_ends_with_it() {
    use std::io::{BufRead, BufReader};

    let (_tmp, state, repo) = state_and_repo();
    let daemon = DaemonProcess::start(&state);
    let scenario = r#"
[[planner.answers]]
tasks = [{ description = "wait forever", scope = ["src"] }]
[tasks.t1]
outcome = "hang"
"#;
    let client = DaemonProcess::client(&state);
    let run = submit(&client, &repo, run_config(scenario, 1)).await;
    let mut follower = std::process::Command::new(assert_cmd::cargo::cargo_bin("flotilla"))
        .arg("--state-dir")
        .arg(&state)
        .args(["log", &run, "t1", "--follow"])
        .env("NO_COLOR", "1")
        .env_remove("FLOTILLA_SOCKET")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = follower.stdout.take().unwrap();
    // Read until the step shows: the attempt is live and hanging.
    let reading = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stdout).lines();
        let mut seen = Vec::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            let step = line.contains("scripted step: Hang");
            seen.push(line);
            if step {
                break;
            }
        }
        (lines, seen)
    });
    let (mut lines, seen) = tokio::time::timeout(std::time::Duration::from_secs(120), reading)
        .await
        .expect("the follow shows the live attempt")
        .unwrap();
    assert!(seen[0].contains("attempt 1"), "{seen:?}");
    assert!(
        seen.last().unwrap().contains("scripted step: Hang"),
        "{seen:?}"
    );
    let _: serde_json::Value = client
        .json(
            hyper::Method::POST,
            &format!("/v1/runs/{run}/cancel"),
            None::<&()>,
        )
        .await
        .unwrap_or(serde_json::Value::Null);
    let rest = tokio::task::spawn_blocking(move || {
        let rest: Vec<String> = lines.by_ref().map(|l| l.unwrap()).collect();
        (rest, follower.wait().unwrap())
    });
    let (rest, status) = tokio::time::timeout(std::time::Duration::from_secs(120), rest)
        .await
        .expect("the follow ends with the attempt")
        .unwrap();
    assert!(status.success(), "{rest:?}");
    assert!(
        rest.last()
            .is_some_and(|l| l.contains("end │ the attempt ended")),
        "{rest:?}\n{}",
        daemon.log()
    );
    drop(daemon);
}
