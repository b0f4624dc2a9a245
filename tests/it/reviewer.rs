//! The reviewer before landing (ADR-038). First the Worker's review step alone (a WorkerPool
//! with the scripted agent, the scripted provider as the reviewer's model and a probe for
//! the TaskGraph): approved work is reported after its verdict, changes requested and
//! unusable answers fail the attempt, and a run without a reviewer calls none. Then the
//! whole run through the daemon: attempt 2's agent reads attempt 1's review, only the
//! approved attempt lands, and `tail --json` and `status` show the verdicts.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use flotilla::scripted::{AgentCall, Scenario, ScriptedAgent, ScriptedLlm};
use flotilla_actors::actors::WorkerPool;
use flotilla_actors::actors::worker::review::{Reviewer, ReviewerConfig};
use flotilla_actors::ports::Role;
use flotilla_actors::protocol::*;

use crate::daemon_env::*;
use crate::harness::*;
use crate::scratch_kit::scratch_kit;

struct Pool {
    addr: Addr<WorkerPool>,
    agent: Arc<ScriptedAgent>,
    llm: Arc<ScriptedLlm>,
    graph: Inbox<ToTaskGraph>,
    _workspaces: tempfile::TempDir,
}

/// A pool whose agent and reviewer both play `scenario`; `reviewer` is the `[reviewer]`
/// table (`None`: the run has none).
fn start(scenario: &str, reviewer: Option<ReviewerConfig>) -> Pool {
    virtual_time();
    let scenario = Scenario::from_toml(scenario).unwrap();
    let agent = Arc::new(ScriptedAgent::new(scenario.clone()));
    let llm = Arc::new(ScriptedLlm::new(scenario));
    let (graph, inbox) = probe::<ToTaskGraph>("task graph");
    let workspaces = tempfile::tempdir().unwrap();
    let mut kit = scratch_kit(agent.clone(), workspaces.path());
    kit.reviewer = reviewer.map(|config| {
        Arc::new(Reviewer {
            llm: llm.clone(),
            system: "review".into(),
            config,
            reader: None,
        })
    });
    let addr = WorkerPool::new(RunId::generate(), kit, graph, Duration::from_secs(60)).start();
    Pool {
        addr,
        agent,
        llm,
        graph: inbox,
        _workspaces: workspaces,
    }
}

fn on() -> Option<ReviewerConfig> {
    Some(ReviewerConfig {
        enabled: true,
        ..ReviewerConfig::default()
    })
}

fn assign(attempt: u32, previous: Option<PreviousAttempt>) -> ToAgent {
    let mut spec = spec("write the parser", &["src"]);
    spec.acceptance = "parse(\"1+2\") is 3".into();
    let mut task = ready("t1", spec, 1, 1);
    task.attempt = attempt;
    task.budget = Budget::new(1_000_000, Usd::ZERO, 600_000);
    task.previous = previous.map(Arc::new);
    ToAgent::Assign(Assignment {
        run: RunId::generate(),
        task,
        profile: "general".into(),
        route: Route::Worker,
        branch: "b".into(),
    })
}

/// The attempt's messages to the TaskGraph up to its report, spend reports left out.
async fn until_report(graph: &mut Inbox<ToTaskGraph>) -> Vec<ToTaskGraph> {
    let mut seen = Vec::new();
    loop {
        let message = graph.expect().await;
        let done = matches!(
            message,
            ToTaskGraph::TaskCompleted(_) | ToTaskGraph::TaskFailed { .. }
        );
        if !matches!(message, ToTaskGraph::SpendReported { .. }) {
            seen.push(message);
        }
        if done {
            return seen;
        }
    }
}

fn names(messages: &[ToTaskGraph]) -> Vec<String> {
    messages
        .iter()
        .map(|m| format!("{m:?}").split('(').next().unwrap().to_string())
        .collect()
}

const WRITES: &str = r#"
[tasks.t1]
writes = { "src/parse.rs" = "pub fn parse(s: &str) -> i64 { 3 }\n" }
"#;

#[actix::test]
async fn approved_work_is_reported_after_its_verdict_and_the_reviewer_read_the_diff() {
    let scenario = format!(
        "{WRITES}\n[[reviewer.t1.attempts]]\nanswers = [{{ verdict = \"approve\", comments = [\"fine\"] }}]\n"
    );
    let mut pool = start(&scenario, on());
    pool.addr.do_send(assign(1, None));
    let messages = until_report(&mut pool.graph).await;
    assert_eq!(
        names(&messages),
        ["TaskStarted", "Reviewed", "TaskCompleted"],
        "the verdict comes before the report: {messages:?}"
    );
    let ToTaskGraph::Reviewed {
        attempt,
        review,
        calls,
        ..
    } = &messages[1]
    else {
        unreachable!()
    };
    assert_eq!((*attempt, *calls), (1, 1));
    assert!(matches!(review, ReviewVerdict::Approve { .. }));
    assert_eq!(review.comments(), ["fine"]);

    let asked = pool.llm.requests();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].role, Role::Reviewer);
    let text = &asked[0].messages[1].content;
    for needle in [
        "## Task t1 (attempt 1)",
        "write the parser",
        "acceptance: parse(\"1+2\") is 3",
        "+++ b/src/parse.rs",
        "+pub fn parse(s: &str) -> i64 { 3 }",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
}

#[actix::test]
async fn changes_requested_fail_the_attempt_and_the_retrys_agent_reads_the_comments() {
    let scenario = format!(
        "{WRITES}\n[[reviewer.t1.attempts]]\nanswers = [{{ verdict = \"changes_requested\", comments = [\"parse ignores its input: compute the sum\", \"add a test for 1+2\"] }}]\n"
    );
    let mut pool = start(&scenario, on());
    pool.addr.do_send(assign(1, None));
    let messages = until_report(&mut pool.graph).await;
    assert_eq!(names(&messages), ["TaskStarted", "Reviewed", "TaskFailed"]);
    let ToTaskGraph::TaskFailed { failure, .. } = &messages[2] else {
        unreachable!()
    };
    let AttemptFailure::ChangesRequested { comments } = failure else {
        panic!("{failure:?}");
    };
    assert_eq!(comments.len(), 2);
    assert!(failure.is_retryable(), "it counts as a retry");

    // The retry is told, as the TaskGraph tells it (from the journaled failure).
    let previous = PreviousAttempt::new(1, failure, &[]);
    pool.addr.do_send(assign(2, Some(previous)));
    let messages = until_report(&mut pool.graph).await;
    assert_eq!(
        names(&messages),
        ["TaskStarted", "Reviewed", "TaskCompleted"],
        "attempt 2 is reviewed too (approved: past its script)"
    );
    let told = pool
        .agent
        .calls()
        .into_iter()
        .find_map(|c| match c {
            AgentCall::Run {
                attempt: 2,
                task_text,
                ..
            } => Some(task_text),
            _ => None,
        })
        .unwrap();
    for needle in [
        "## Previous attempt (1) failed",
        "the reviewer asked for changes",
        "### The reviewer's comments",
        "> - parse ignores its input: compute the sum",
        "> - add a test for 1+2",
    ] {
        assert!(told.contains(needle), "{needle:?} not in:\n{told}");
    }
}

#[actix::test]
async fn without_a_reviewer_no_reviewer_is_called() {
    for reviewer in [None, Some(ReviewerConfig::default())] {
        let mut pool = start(WRITES, reviewer.clone());
        pool.addr.do_send(assign(1, None));
        let messages = until_report(&mut pool.graph).await;
        assert_eq!(
            names(&messages),
            ["TaskStarted", "TaskCompleted"],
            "{reviewer:?}"
        );
        assert!(pool.llm.requests().is_empty(), "{reviewer:?}");
    }
}

#[actix::test]
async fn work_with_nothing_to_land_is_not_reviewed() {
    let mut pool = start("[tasks.t1]\noutcome = \"failed\"\n", on());
    pool.addr.do_send(assign(1, None));
    let messages = until_report(&mut pool.graph).await;
    assert_eq!(names(&messages), ["TaskStarted", "TaskCompleted"]);
    assert!(pool.llm.requests().is_empty());
}

/// Unusable answers (not JSON, control characters, far too long, an unknown verdict,
/// changes requested without a comment, a failing model) are asked again at most
/// `max_calls` times; then the attempt fails with no verdict and nothing is delivered.
#[actix::test]
async fn hostile_or_unusable_answers_end_in_a_typed_failure_and_nothing_is_delivered() {
    let huge = "{\"verdict\": \"approve\", \"comments\": [\"".to_string() + &"x".repeat(200_000);
    let answers = [
        format!(
            "{{ content = {} }}",
            serde_json::to_string("LGTM \u{1b}]0;pwned\u{7}\u{0} ship it").unwrap()
        ),
        format!("{{ content = {} }}", serde_json::to_string(&huge).unwrap()),
        "{ verdict = \"maybe\" }".to_string(),
        "{ verdict = \"changes_requested\" }".to_string(),
        "{ fault = \"error\" }".to_string(),
    ];
    let scenario = format!(
        "{WRITES}\n[[reviewer.t1.attempts]]\nanswers = [{}]\n",
        answers.join(", ")
    );
    let config = ReviewerConfig {
        enabled: true,
        max_calls: 5,
        ..ReviewerConfig::default()
    };
    let mut pool = start(&scenario, Some(config));
    pool.addr.do_send(assign(1, None));
    let messages = until_report(&mut pool.graph).await;
    assert_eq!(names(&messages), ["TaskStarted", "Reviewed", "TaskFailed"]);
    let ToTaskGraph::Reviewed { review, calls, .. } = &messages[1] else {
        unreachable!()
    };
    assert_eq!(*calls, 5);
    let ReviewVerdict::Failed { reason } = review else {
        panic!("{review:?}")
    };
    assert!(
        reason.contains("no usable verdict in 5 call(s)"),
        "{reason}"
    );
    assert!(
        matches!(
            &messages[2],
            ToTaskGraph::TaskFailed {
                failure: AttemptFailure::ReviewFailed { .. },
                ..
            }
        ),
        "{:?}",
        messages[2]
    );
    // Each re-ask carries a bounded excerpt of the answer it refuses, never the answer.
    let asked = pool.llm.requests();
    assert_eq!(asked.len(), 5);
    let sizes: Vec<usize> = asked
        .iter()
        .map(|r| r.messages.iter().map(|m| m.content.len()).sum())
        .collect();
    assert!(
        sizes.windows(2).all(|w| w[1] < w[0] + 2_000),
        "a re-ask grows by an excerpt only: {sizes:?}"
    );
    let refusals: Vec<&str> = asked[4]
        .messages
        .iter()
        .filter(|m| m.content.starts_with("That answer cannot be used"))
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(refusals.len(), 4);
    assert!(refusals[1].contains("bytes; at most"), "{}", refusals[1]);
    assert!(
        refusals[3].contains("at least one comment"),
        "{}",
        refusals[3]
    );
}

#[actix::test]
async fn comments_with_control_characters_reach_the_retry_escaped_and_bounded() {
    let comments = format!(
        "[\"\\u001b[2J\\u001b]0;owned\\u0007clear the screen\", \"{}\"]",
        "y".repeat(50_000)
    );
    let scenario = format!(
        "{WRITES}\n[[reviewer.t1.attempts]]\nanswers = [{{ content = '{{\"verdict\": \"changes_requested\", \"comments\": {comments}}}' }}]\n"
    );
    let mut pool = start(&scenario, on());
    pool.addr.do_send(assign(1, None));
    let messages = until_report(&mut pool.graph).await;
    let ToTaskGraph::TaskFailed {
        failure: AttemptFailure::ChangesRequested { comments },
        ..
    } = &messages[2]
    else {
        panic!("{messages:?}")
    };
    assert_eq!(comments[0], "clear the screen");
    assert!(comments.iter().all(|c| !c.contains('\u{1b}')));
    let total: usize = comments.iter().map(String::len).sum();
    assert!(
        total <= ReviewerConfig::default().max_comment_bytes,
        "{total}"
    );
}

/// t1: attempt 1's work is sent back with a comment; attempt 2 must read it (or crash) and
/// is approved.
const SENT_BACK_ONCE: &str = r####"
[[planner.answers]]
tasks = [{ description = "write a", scope = ["src/a.txt"], acceptance = "src/a.txt says a" }]

[[tasks.t1.attempts]]
writes = { "src/a.txt" = "b\n" }

[[tasks.t1.attempts]]
expect_in_task = [
  "## Previous attempt (1) failed",
  "### The reviewer's comments",
  "> - src/a.txt says b; it must say a",
]
writes = { "src/a.txt" = "a\n" }

[[reviewer.t1.attempts]]
answers = [{ verdict = "changes_requested", comments = ["src/a.txt says b; it must say a"] }]

[[reviewer.t1.attempts]]
answers = [{ verdict = "approve" }]
"####;

#[tokio::test]
async fn through_the_daemon_only_approved_work_lands_and_tail_and_status_show_the_verdicts() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let mut config = run_config(SENT_BACK_ONCE, 1);
    config["reviewer"] = serde_json::json!({ "enabled": true });
    config["limits"]["max_attempts"] = serde_json::json!(2);
    let run = submit(&daemon.client, repo.path(), config).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));

    let at = |pick: &dyn Fn(&EventKind) -> bool| events.iter().position(|e| pick(&e.kind));
    let verdict = |n: u32, mark: ReviewMark| {
        at(
            &|k| matches!(k, EventKind::ReviewVerdict { attempt, review, .. } if *attempt == n && review.mark() == mark),
        )
    };
    let sent_back = verdict(1, ReviewMark::ChangesRequested).expect("attempt 1 sent back");
    let retried = at(&|k| {
        matches!(
            k,
            EventKind::TaskRetried {
                attempt: 1,
                failure: AttemptFailure::ChangesRequested { .. },
                ..
            }
        )
    })
    .expect("attempt 1 retried for the review");
    let approved = verdict(2, ReviewMark::Approved).expect("attempt 2 approved");
    let landing = at(&|k| matches!(k, EventKind::TaskLanding { attempt: 2, .. })).unwrap();
    assert!(sent_back < retried && retried < approved && approved < landing);
    assert!(
        at(&|k| matches!(k, EventKind::TaskLanding { attempt: 1, .. })).is_none(),
        "the merge queue never got attempt 1"
    );
    let main = git2::Repository::open(repo.path()).unwrap();
    let tip = main.revparse_single("main:src/a.txt").unwrap();
    assert_eq!(tip.as_blob().unwrap().content(), b"a\n");

    let prefix = &run[..8];
    let out = flotilla(daemon.state_dir())
        .args(["tail", prefix, "--json"])
        .assert()
        .success();
    let verdicts: Vec<serde_json::Value> = String::from_utf8(out.get_output().stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["kind"] == "review_verdict")
        .collect();
    assert_eq!(verdicts.len(), 2);
    assert_eq!(
        verdicts[0]["data"]["review"]["verdict"],
        "changes_requested"
    );
    assert_eq!(
        verdicts[0]["data"]["review"]["comments"][0],
        "src/a.txt says b; it must say a"
    );
    assert_eq!(verdicts[1]["data"]["review"]["verdict"], "approve");

    let out = flotilla(daemon.state_dir())
        .args(["tail", prefix])
        .assert()
        .success();
    let tail = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(
        tail.contains(
            "t1 attempt 1: the reviewer asked for changes (1 comment(s)): src/a.txt says b"
        ),
        "{tail}"
    );
    assert!(
        tail.contains("t1 attempt 2 approved by the reviewer"),
        "{tail}"
    );

    let out = flotilla(daemon.state_dir())
        .args(["status", prefix])
        .assert()
        .success();
    let status = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(
        status.contains("— review: approved (attempt 2)"),
        "{status}"
    );
    let out = flotilla(daemon.state_dir())
        .args(["status", prefix, "t1"])
        .assert()
        .success();
    let story = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(
        story.contains("comment: src/a.txt says b; it must say a"),
        "{story}"
    );
    // The attempt's transcript notes the verdict too (`flotilla log`).
    let out = flotilla(daemon.state_dir())
        .args(["log", prefix, "t1", "--attempt", "1"])
        .assert()
        .success();
    let log = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(
        log.contains("review (1 call(s)): changes requested"),
        "{log}"
    );
    assert!(log.contains("- src/a.txt says b; it must say a"), "{log}");
}

/// `config check` says whether the reviewer is on, refuses one with no model and no
/// scenario to play it, and refuses bounds out of range, naming the key.
#[test]
fn config_check_tells_the_reviewer_on_and_refuses_what_cannot_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flotilla.toml");
    let check = |text: &str| {
        std::fs::write(&path, text).unwrap();
        let out = assert_cmd::Command::cargo_bin("flotilla")
            .unwrap()
            .env("NO_COLOR", "1")
            .args(["config", "check"])
            .arg(&path)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), said)
    };
    std::fs::write(dir.path().join("s.toml"), "").unwrap();
    let scripted = "[provider]\nscenario = \"s.toml\"\n";
    let (code, said) = check(scripted);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("reviewer off"), "{said}");
    let (code, said) = check(&format!("{scripted}[reviewer]\nenabled = true\n"));
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("reviewer on"), "{said}");
    let (code, said) = check(&format!(
        "{scripted}[reviewer]\nenabled = true\nmax_calls = 0\n"
    ));
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("reviewer.max_calls"), "{said}");

    let models = "[providers.local]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
                  [roles]\nplanner = \"local/m\"\nsubplanner = \"local/m\"\nworker = \"local/m\"\n";
    let (code, said) = check(&format!("{models}[reviewer]\nenabled = true\n"));
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("the reviewer role"), "{said}");
    let (code, said) = check(&format!(
        "{models}reviewer = \"local/m\"\n[reviewer]\nenabled = true\n"
    ));
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("models for planner, subplanner, worker, reviewer"),
        "{said}"
    );
}

/// With a repository behind it, the reviewer may read the worker's sealed branch with the
/// read-only tools (ADR-037's): the file it reads is the branch's, not main's; the tool
/// rounds are capped, and past the cap it must answer without tools.
#[actix::test]
async fn the_reviewers_tools_read_the_sealed_branch_not_main() {
    use flotilla::git::reader::GitRepo;
    use flotilla::git::worktrees::GitWorktrees;

    virtual_time();
    let repo = git_repo();
    {
        let git = git2::Repository::open(repo.path()).unwrap();
        commit_files(&git, &[("src/a.txt", "main text\n")], "main's a");
    }
    let scenario = Scenario::from_toml(
        r#"
[tasks.t1]
writes = { "src/a.txt" = "the reviewed text\n" }

[[reviewer.t1.attempts]]
answers = [
  { tool_calls = [{ name = "read_file", arguments = { path = "src/a.txt" } }] },
  { tool_calls = [{ name = "grep", arguments = { pattern = "text" } }] },
  { verdict = "approve" },
]
"#,
    )
    .unwrap();
    let agent = Arc::new(ScriptedAgent::new(scenario.clone()));
    let llm = Arc::new(ScriptedLlm::new(scenario));
    let (graph, mut inbox) = probe::<ToTaskGraph>("task graph");
    let state = tempfile::tempdir().unwrap();
    let run = RunId::generate();
    let mut kit = scratch_kit(agent, state.path());
    kit.worktrees = Arc::new(GitWorktrees::new(
        repo.path(),
        run,
        state.path().join("w"),
        main_branch(),
    ));
    kit.reviewer = Some(Arc::new(Reviewer {
        llm: llm.clone(),
        system: "review".into(),
        config: ReviewerConfig {
            enabled: true,
            max_tool_rounds: 1,
            ..ReviewerConfig::default()
        },
        reader: Some(Arc::new(GitRepo::new(repo.path(), main_branch()))),
    }));
    let addr = WorkerPool::new(run, kit, graph, Duration::from_secs(60)).start();
    let ToAgent::Assign(mut assignment) = assign(1, None) else {
        unreachable!()
    };
    assignment.run = run;
    assignment.branch = branch_name(run, &task("t1"), 1);
    addr.do_send(ToAgent::Assign(assignment));
    let messages = until_report(&mut inbox).await;
    assert_eq!(
        names(&messages),
        ["TaskStarted", "Reviewed", "TaskCompleted"],
        "{messages:?}"
    );

    let asked = llm.requests();
    assert_eq!(asked.len(), 3, "one tool round, then answers only");
    assert!(
        asked[0].tools.iter().any(|t| t.name == "read_file")
            && asked[0]
                .tools
                .iter()
                .all(|t| !t.description.contains("main's tip")),
        "{:?}",
        asked[0].tools
    );
    let read = asked[1]
        .messages
        .iter()
        .find(|m| m.role == flotilla_actors::ports::ChatRole::Tool)
        .expect("the tool's result is in the next request");
    assert!(
        read.content.contains("the reviewed text"),
        "{}",
        read.content
    );
    assert!(!read.content.contains("main text"), "{}", read.content);
    assert!(
        asked[1].tools.is_empty(),
        "past the cap no tools are offered"
    );
    assert!(
        asked[1]
            .messages
            .iter()
            .any(|m| m.content.contains("No more tool rounds")),
    );
    // The second scripted answer asked for tools that were not offered: an unusable
    // answer, asked again; the third approves.
    let ToTaskGraph::Reviewed { calls, .. } = &messages[1] else {
        unreachable!()
    };
    assert_eq!(*calls, 3);
}
