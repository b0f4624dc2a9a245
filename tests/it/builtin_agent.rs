//! The built-in agent, driven by the scripted provider, in a real worktree of a temporary
//! repository, under a real Worker: what it does with tools ends up on the branch and in a
//! handoff that matches git; it cannot leave its worktree; whatever the model does, the
//! attempt ends within its limits.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use flotilla::agents::builtin::{BuiltinAgent, BuiltinConfig};
use flotilla::git::worktrees::GitWorktrees;
use flotilla::process::TokioProcessRunner;
use flotilla::scripted::{Scenario, ScriptedLlm};
use flotilla_actors::actors::worker::check::Checks;
use flotilla_actors::actors::{AgentSet, WorkerKit, WorkerPool};
use flotilla_actors::ports::{ChatRole, Llm, LlmCall, LlmError, LlmRequest, LlmResponse};
use flotilla_actors::protocol::*;

use crate::daemon_env::{commit_files, init_repo, main_branch};
use crate::harness::*;

struct Session {
    graph: Inbox<ToTaskGraph>,
    llm: Arc<ScriptedLlm>,
    repo: tempfile::TempDir,
    _state: tempfile::TempDir,
    pool: Addr<WorkerPool>,
    run: RunId,
}

fn start(scenario: &str, config: BuiltinConfig) -> Session {
    start_telling(scenario, config, None)
}

fn start_telling(
    scenario: &str,
    config: BuiltinConfig,
    notices: Option<Recipient<Published>>,
) -> Session {
    start_with(
        scenario,
        config,
        notices,
        Arc::new(TokioProcessRunner),
        |llm| llm,
    )
}

/// With the sandbox off: for the file tools' own defences, which must hold even when a
/// user turned it off (inside the sandbox the attack below cannot even see its target).
fn start_unsandboxed(scenario: &str, config: BuiltinConfig) -> Session {
    start_with(
        scenario,
        config,
        None,
        Arc::new(crate::process::unsandboxed()),
        |llm| llm,
    )
}

fn start_with(
    scenario: &str,
    config: BuiltinConfig,
    notices: Option<Recipient<Published>>,
    runner: Arc<dyn flotilla_actors::ports::ProcessRunner>,
    model: impl FnOnce(Arc<ScriptedLlm>) -> Arc<dyn Llm>,
) -> Session {
    let repo = tempfile::tempdir().unwrap();
    init_repo(repo.path());
    let git = git2::Repository::open(repo.path()).unwrap();
    commit_files(&git, &[("src/lib.rs", "pub mod a;\n")], "code");
    let state = tempfile::tempdir().unwrap();
    let run = RunId::generate();
    let llm = Arc::new(ScriptedLlm::new(Scenario::from_toml(scenario).unwrap()));
    let agent = BuiltinAgent::new(
        model(llm.clone()),
        runner.clone(),
        "You are a worker.".into(),
        config,
    );
    let kit = WorkerKit {
        agents: AgentSet::one(Arc::new(agent)),
        worktrees: Arc::new(GitWorktrees::new(
            repo.path(),
            run,
            state.path().join(run.to_string()),
            main_branch(),
        )),
        runner,
        checks: Arc::new(Checks::default()),
        notices,
        keep_failed: false,
        retry_in_place: false,
        transcripts: flotilla_actors::ports::Transcripts::none(),
        reviewer: None,
    };
    let (graph, inbox) = probe::<ToTaskGraph>("task graph");
    let pool = WorkerPool::new(run, kit, graph, Duration::from_secs(60)).start();
    Session {
        graph: inbox,
        llm,
        repo,
        _state: state,
        pool,
        run,
    }
}

impl Session {
    fn assign(&self, id: &str, scope: &[&str]) {
        let mut task = ready(id, spec("work", scope), 1, 1);
        task.budget = Budget::new(10_000_000, Usd::ZERO, 60_000);
        let branch = branch_name(self.run, &task.task, 1);
        self.pool.do_send(ToAgent::Assign(Assignment {
            run: self.run,
            task,
            profile: "general".into(),
            route: Route::Worker,
            branch,
        }));
    }

    /// The attempt's last word: its completion or its failure.
    async fn outcome(&mut self) -> Result<Box<TaskCompleted>, AttemptFailure> {
        self.graph
            .fish_for("the attempt's outcome", |m| match m {
                ToTaskGraph::TaskCompleted(c) => Some(Ok(c.clone())),
                ToTaskGraph::TaskFailed { failure, .. } => Some(Err(failure.clone())),
                _ => None,
            })
            .await
    }

    /// What each tool call answered, in order, from the requests the model got.
    fn tool_results(&self) -> Vec<String> {
        let requests: Vec<LlmRequest> = self.llm.requests();
        requests
            .last()
            .map(|r| {
                r.messages
                    .iter()
                    .filter(|m| m.role == ChatRole::Tool)
                    .map(|m| m.content.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn completed(outcome: Result<Box<TaskCompleted>, AttemptFailure>) -> Box<TaskCompleted> {
    outcome.unwrap_or_else(|failure| panic!("expected a completion, got {failure:?}"))
}

#[actix::test]
async fn the_agent_writes_edits_and_runs_a_command_and_the_handoff_is_what_git_says() {
    let mut s = start(
        r#"
[[worker.t1.answers]]
tool_calls = [
  { name = "write_file", arguments = { path = "src/a.rs", content = "fn a() {}\n" } },
  { name = "write_file", arguments = { path = "src/b/mod.rs", content = "one\ntwo\n" } },
]
[[worker.t1.answers]]
tool_calls = [
  { name = "edit_file", arguments = { path = "src/a.rs", old_text = "fn a()", new_text = "pub fn a()" } },
  { name = "run_command", arguments = { command = "grep -c pub src/a.rs" } },
]
[[worker.t1.answers]]
tool_calls = [
  { name = "read_file", arguments = { path = "src/a.rs" } },
  { name = "list_dir", arguments = { path = "src" } },
  { name = "search", arguments = { pattern = "^pub" } },
]
[[worker.t1.answers]]
tool_calls = [
  { name = "finish", arguments = { status = "complete", summary = "a and b", concerns = ["b is a stub"], files_changed = ["src/a.rs"] } },
]
"#,
        BuiltinConfig::default(),
    );
    s.assign("t1", &["src"]);
    let done = completed(s.outcome().await);
    let h = done.handoff.unwrap();
    assert_eq!(h.status, HandoffStatus::Complete);
    assert_eq!(h.summary, "a and b");
    assert_eq!(h.concerns, ["b is a stub"], "the agent's words are kept");
    assert_eq!(
        h.files_changed,
        ["src/a.rs", "src/b/mod.rs"],
        "git's list, not the claim"
    );
    assert_eq!(h.metrics.tool_calls, 8);
    assert_eq!((h.metrics.lines_added, h.metrics.lines_removed), (3, 0));
    assert!(h.findings.is_empty(), "{:?}", h.findings);
    let work = h.work.unwrap();
    let git = git2::Repository::open(s.repo.path()).unwrap();
    let tip = git
        .find_branch(&work.branch, git2::BranchType::Local)
        .unwrap()
        .get()
        .target()
        .unwrap();
    assert_eq!(tip.to_string(), work.head);
    let blob = git
        .find_commit(tip)
        .unwrap()
        .tree()
        .unwrap()
        .get_path(std::path::Path::new("src/a.rs"))
        .unwrap()
        .to_object(&git)
        .unwrap()
        .peel_to_blob()
        .unwrap();
    assert_eq!(blob.content(), b"pub fn a() {}\n");

    let results = s.tool_results();
    assert_eq!(results[0], "wrote src/a.rs (10 bytes)");
    assert_eq!(results[2], "edited src/a.rs");
    assert!(
        results[3].starts_with("exit code 0") && results[3].contains("1"),
        "{}",
        results[3]
    );
    assert_eq!(results[4], "pub fn a() {}\n");
    assert_eq!(results[5], "a.rs\nb/\nlib.rs");
    assert!(
        results[6].contains("src/a.rs:1: pub fn a() {}"),
        "{}",
        results[6]
    );
    assert!(
        results[6].contains("src/lib.rs:1: pub mod a;"),
        "{}",
        results[6]
    );
}

#[actix::test]
async fn no_path_leaves_the_worktree_and_nothing_reaches_git() {
    let mut s = start(
        r#"
[[worker.t1.answers]]
tool_calls = [
  { name = "write_file", arguments = { path = "../escaped.rs", content = "x" } },
  { name = "write_file", arguments = { path = "/tmp/flotilla-escaped.rs", content = "x" } },
  { name = "read_file", arguments = { path = "/etc/passwd" } },
  { name = "write_file", arguments = { path = ".git/config", content = "x" } },
  { name = "write_file", arguments = { path = "src/.git/hooks/pre-commit", content = "x" } },
  { name = "run_command", arguments = { command = "ln -s /etc src/etc" } },
]
[[worker.t1.answers]]
tool_calls = [
  { name = "read_file", arguments = { path = "src/etc/passwd" } },
  { name = "write_file", arguments = { path = "src/etc/evil", content = "x" } },
  { name = "list_dir", arguments = { path = "src/etc" } },
  { name = "edit_file", arguments = { path = "../../etc/hostname", old_text = "a", new_text = "b" } },
  { name = "search", arguments = { pattern = "root", path = "src/etc" } },
]
[[worker.t1.answers]]
tool_calls = [{ name = "finish", arguments = { status = "complete", summary = "tried" } }]
"#,
        BuiltinConfig::default(),
    );
    s.assign("t1", &["src"]);
    // What reached git: only the link the command made inside the scope, which leaves the
    // repository and so fails the attempt (ADR-016); nothing any refused call named.
    assert_eq!(
        s.outcome().await.unwrap_err(),
        AttemptFailure::LinksOutside {
            paths: vec!["src/etc".into()]
        }
    );
    let results = s.tool_results();
    let refused: Vec<&String> = results.iter().filter(|r| r.starts_with("error:")).collect();
    assert_eq!(refused.len(), 10, "{results:#?}");
    assert!(results[0].contains("'..'"), "{}", results[0]);
    assert!(results[1].contains("absolute") && results[2].contains("absolute"));
    assert!(results[3].contains(".git") && results[4].contains(".git"));
    for escaped in &results[6..11] {
        assert!(
            escaped.contains("outside the worktree") || escaped.contains("'..'"),
            "{escaped}"
        );
    }
    assert!(!std::path::Path::new("/tmp/flotilla-escaped.rs").exists());
    assert!(!s.repo.path().parent().unwrap().join("escaped.rs").exists());
}

#[actix::test]
async fn a_model_that_never_finishes_is_stopped_at_its_tool_call_limit() {
    let mut answers = String::new();
    for _ in 0..10 {
        answers.push_str(
            "[[worker.t1.answers]]\ntool_calls = [{ name = \"list_dir\" }, { name = \"list_dir\" }]\n",
        );
    }
    let config = BuiltinConfig {
        max_tool_calls: 5,
        ..BuiltinConfig::default()
    };
    let mut s = start(&answers, config);
    s.assign("t1", &["src"]);
    let h = completed(s.outcome().await).handoff.unwrap();
    assert_eq!(h.status, HandoffStatus::Failed);
    assert!(h.summary.contains("5 tool calls"), "{}", h.summary);
    assert_eq!(h.metrics.tool_calls, 5);
    assert_eq!(
        s.llm.requests().len(),
        3,
        "two answers of two calls, then one of one"
    );
    // Every call the model asked for was answered, so the conversation stays well formed.
    let last = s.llm.requests().pop().unwrap();
    assert_eq!(
        last.messages
            .iter()
            .filter(|m| m.role == ChatRole::Tool)
            .count(),
        4
    );
}

#[actix::test]
async fn chatter_without_tools_fails_the_attempt_and_garbage_arguments_are_answered() {
    let mut s = start(
        r#"
[[worker.t1.answers]]
tool_calls = [
  { name = "write_file", raw_arguments = "{\"path\": \"src/a.rs\", \"content\": " },
  { name = "delete_everything", arguments = {} },
  { name = "write_file", arguments = { path = "src/a.rs", content = "x", mode = "0777" } },
]
[[worker.t1.answers]]
content = "I think I should write the file now."
[[worker.t1.answers]]
content = "Let me consider the options."
[[worker.t1.answers]]
content = "Thinking harder."
"#,
        BuiltinConfig::default(),
    );
    s.assign("t1", &["src"]);
    let failure = s.outcome().await.unwrap_err();
    let AttemptFailure::Malformed { detail } = failure else {
        panic!("{failure:?}");
    };
    assert!(detail.contains("3 times"), "{detail}");
    let results = s.tool_results();
    assert!(results[0].starts_with("error: the arguments of write_file are not valid"));
    assert!(results[1].contains("there is no tool \"delete_everything\""));
    assert!(
        results[2].contains("unknown field `mode`"),
        "{}",
        results[2]
    );
}

#[actix::test]
async fn a_subplan_handed_back_names_the_task_flotilla_gave_whatever_the_model_says() {
    let mut s = start(
        r#"
[[worker.t1.answers]]
tool_calls = [{ name = "finish", arguments = { status = "partial", summary = "too big", subplan = { reason = "too_large", subtasks = [
  { description = "lexer", scope = ["src/lex.rs"] },
  { description = "parser", scope = ["src/parse.rs"], depends_on = [0] },
] } } }]
"#,
        BuiltinConfig::default(),
    );
    s.assign("t1", &["src"]);
    let done = completed(s.outcome().await);
    let plan = done.subplan.unwrap();
    assert_eq!(plan.parent, "t1".parse::<TaskId>().unwrap());
    assert_eq!(plan.subtasks.len(), 2);
    assert_eq!(plan.subtasks[1].depends_on, [0]);
    assert_eq!(done.handoff.unwrap().status, HandoffStatus::Partial);
}

#[actix::test]
async fn the_tokens_a_task_may_spend_bind_the_loop() {
    let mut answers = String::new();
    for _ in 0..10 {
        answers.push_str(
            "[[worker.t1.answers]]\ntokens = 400\ntool_calls = [{ name = \"list_dir\" }]\n",
        );
    }
    let mut s = start(&answers, BuiltinConfig::default());
    let mut task = ready("t1", spec("work", &["src"]), 1, 1);
    task.budget = Budget::new(1_000, Usd::ZERO, 60_000);
    let branch = branch_name(s.run, &task.task, 1);
    s.pool.do_send(ToAgent::Assign(Assignment {
        run: s.run,
        task,
        profile: "general".into(),
        route: Route::Worker,
        branch,
    }));
    let h = completed(s.outcome().await).handoff.unwrap();
    assert_eq!(h.status, HandoffStatus::Failed);
    assert!(h.summary.contains("1000 tokens"), "{}", h.summary);
    assert_eq!(s.llm.requests().len(), 3, "400 + 400 + 400 reaches 1000");
}

#[actix::test]
async fn what_the_agent_does_shows_live_as_activity_notices() {
    let (notices, mut seen) = probe::<Published>("notices");
    let mut s = start_telling(
        r#"
[[worker.t1.answers]]
tool_calls = [{ name = "run_command", arguments = { command = "true" } }]
[[worker.t1.answers]]
tool_calls = [{ name = "finish", arguments = { status = "complete", summary = "s" } }]
"#,
        BuiltinConfig::default(),
        Some(notices),
    );
    s.assign("t1", &["src"]);
    completed(s.outcome().await);
    let first = seen
        .fish_for("an activity notice", |p| match &p.0.kind {
            EventKind::AgentActivity { task, activity, .. } => {
                Some((p.0.seq, task.to_string(), activity.clone()))
            }
            _ => None,
        })
        .await;
    assert_eq!(
        first,
        (0, "t1".into(), "run_command true".into()),
        "live only: seq 0"
    );
}

#[actix::test]
async fn a_long_session_compacts_its_oldest_tool_outputs_and_keeps_the_task() {
    let big = "x".repeat(3_000);
    let mut scenario = format!(
        "[[worker.t1.answers]]\ntool_calls = [{{ name = \"write_file\", arguments = {{ path = \"src/big.txt\", content = \"{big}\" }} }}]\n"
    );
    for _ in 0..4 {
        scenario.push_str(
            "[[worker.t1.answers]]\ntool_calls = [{ name = \"read_file\", arguments = { path = \"src/big.txt\" } }]\n",
        );
    }
    scenario.push_str(
        "[[worker.t1.answers]]\ntool_calls = [{ name = \"finish\", arguments = { status = \"complete\", summary = \"s\" } }]\n",
    );
    let config = BuiltinConfig {
        max_context_bytes: 8_000,
        keep_recent_outputs: 1,
        ..BuiltinConfig::default()
    };
    let mut s = start(&scenario, config);
    s.assign("t1", &["src"]);
    completed(s.outcome().await);
    let last = s.llm.requests().pop().unwrap();
    let tool_outputs: Vec<&str> = last
        .messages
        .iter()
        .filter(|m| m.role == ChatRole::Tool)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(tool_outputs.len(), 5);
    assert!(
        tool_outputs[1].starts_with("[compacted: 3000 bytes"),
        "{:?}",
        &tool_outputs[1][..40.min(tool_outputs[1].len())]
    );
    assert_eq!(tool_outputs[4], big, "the most recent output stays whole");
    let size: usize = last.messages.iter().map(|m| m.content.len()).sum();
    assert!(size <= 8_000 + 3_000, "{size}");
    assert!(
        last.messages[1].content.contains("## Your task (t1)"),
        "the task is never compacted"
    );
}

#[actix::test]
async fn reading_a_pipe_or_a_huge_file_is_bounded() {
    let mut s = start(
        r#"
[[worker.t1.answers]]
tool_calls = [{ name = "run_command", arguments = { command = "mkfifo src/pipe && truncate -s 10G src/huge" } }]
[[worker.t1.answers]]
tool_calls = [
  { name = "read_file", arguments = { path = "src/pipe" } },
  { name = "read_file", arguments = { path = "src/huge" } },
  { name = "read_file", arguments = { path = "src/huge", offset = 10737418000 } },
  { name = "edit_file", arguments = { path = "src/huge", old_text = "a", new_text = "b" } },
]
[[worker.t1.answers]]
tool_calls = [{ name = "finish", arguments = { status = "failed", summary = "tried" } }]
"#,
        BuiltinConfig::default(),
    );
    s.assign("t1", &["src"]);
    let _ = s.outcome().await;
    let results = s.tool_results();
    assert!(results[0].starts_with("exit code 0"), "{}", results[0]);
    assert!(results[1].contains("not a regular file"), "{}", results[1]);
    assert!(
        results[2].len() < 70 * 1024 && results[2].contains("the file is 10737418240 bytes"),
        "only a window of it: {} bytes",
        results[2].len()
    );
    assert_eq!(results[3].len(), 240, "the last 240 bytes, whole");
    assert!(results[4].contains("more than the"), "{}", results[4]);
}

#[actix::test]
async fn a_hard_link_made_with_run_command_does_not_let_the_file_tools_change_a_file_outside() {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("file");
    std::fs::write(&target, "outside: a\n").unwrap();
    let scenario = format!(
        r#"
[[worker.t1.answers]]
tool_calls = [{{ name = "run_command", arguments = {{ command = "ln {target} src/x" }} }}]
[[worker.t1.answers]]
tool_calls = [
  {{ name = "edit_file", arguments = {{ path = "src/x", old_text = "a", new_text = "b" }} }},
  {{ name = "write_file", arguments = {{ path = "src/x", content = "replaced" }} }},
  {{ name = "read_file", arguments = {{ path = "src/x" }} }},
  {{ name = "search", arguments = {{ pattern = "outside" }} }},
]
[[worker.t1.answers]]
tool_calls = [{{ name = "finish", arguments = {{ status = "complete", summary = "tried" }} }}]
"#,
        target = target.display()
    );
    let mut s = start_unsandboxed(&scenario, BuiltinConfig::default());
    s.assign("t1", &["src"]);
    let _ = s.outcome().await;
    let results = s.tool_results();
    assert!(results[0].starts_with("exit code 0"), "{}", results[0]);
    for refused in &results[1..4] {
        assert!(
            refused.starts_with("error:") && refused.contains("is a hard link"),
            "{refused}"
        );
    }
    assert_eq!(results[4], "no matches", "a hard link is not searched");
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "outside: a\n",
        "the file outside the worktree is unchanged"
    );
}

#[actix::test]
async fn a_hard_link_is_refused_at_delivery_and_its_content_never_reaches_git() {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("file");
    std::fs::write(&target, "outside-marker-7f3a\n").unwrap();
    let scenario = format!(
        r#"
[[worker.t1.answers]]
tool_calls = [{{ name = "run_command", arguments = {{ command = "ln {target} src/x" }} }}]
[[worker.t1.answers]]
tool_calls = [{{ name = "finish", arguments = {{ status = "complete", summary = "linked" }} }}]
"#,
        target = target.display()
    );
    let mut s = start_unsandboxed(&scenario, BuiltinConfig::default());
    s.assign("t1", &["src"]);
    assert_eq!(
        s.outcome().await.unwrap_err(),
        AttemptFailure::LinksOutside {
            paths: vec!["src/x".into()]
        }
    );
    let git = git2::Repository::open(s.repo.path()).unwrap();
    let odb = git.odb().unwrap();
    odb.foreach(|id| {
        let object = odb.read(*id).unwrap();
        assert!(
            !String::from_utf8_lossy(object.data()).contains("outside-marker-7f3a"),
            "the hard-linked file's content is in git object {id}"
        );
        true
    })
    .unwrap();
}

/// A model whose context holds `limit` bytes (messages and tool definitions): a larger
/// request is refused as llama.cpp refuses it; the others go to the scripted model.
struct SmallContext {
    inner: Arc<ScriptedLlm>,
    limit: usize,
    refused: std::sync::Mutex<Vec<usize>>,
    answered: std::sync::Mutex<Vec<usize>>,
}

impl Llm for SmallContext {
    fn complete(
        &self,
        request: LlmRequest,
        call: LlmCall,
    ) -> futures::future::BoxFuture<'static, Result<LlmResponse, LlmError>> {
        let bytes = request
            .messages
            .iter()
            .map(|m| m.content.len())
            .sum::<usize>()
            + serde_json::to_string(&request.tools).unwrap().len();
        if bytes > self.limit {
            self.refused.lock().unwrap().push(bytes);
            return Box::pin(async move {
                Err(LlmError::ContextTooLong {
                    status: 400,
                    message: "the request exceeds the available context size".into(),
                })
            });
        }
        self.answered.lock().unwrap().push(bytes);
        self.inner.complete(request, call)
    }
}

/// ADR-030: a context-length refusal does not crash the attempt: the agent compacts its
/// conversation below half the refused request and asks again; the task completes.
#[actix::test]
async fn a_context_length_refusal_compacts_the_agents_conversation_and_it_goes_on() {
    let big = "x".repeat(3_000);
    let mut scenario = format!(
        "[[worker.t1.answers]]\ntool_calls = [{{ name = \"write_file\", arguments = {{ path = \"src/big.txt\", content = \"{big}\" }} }}]\n"
    );
    for _ in 0..4 {
        scenario.push_str(
            "[[worker.t1.answers]]\ntool_calls = [{ name = \"read_file\", arguments = { path = \"src/big.txt\" } }]\n",
        );
    }
    scenario.push_str(
        "[[worker.t1.answers]]\ntool_calls = [{ name = \"finish\", arguments = { status = \"complete\", summary = \"s\" } }]\n",
    );
    let tools = serde_json::to_string(&flotilla::agents::tools::specs())
        .unwrap()
        .len();
    let limit = tools + 12_000;
    let small = std::sync::Mutex::new(None::<Arc<SmallContext>>);
    let mut s = start_with(
        &scenario,
        BuiltinConfig::default(),
        None,
        Arc::new(TokioProcessRunner),
        |inner| {
            let model = Arc::new(SmallContext {
                inner,
                limit,
                refused: Default::default(),
                answered: Default::default(),
            });
            *small.lock().unwrap() = Some(model.clone());
            model
        },
    );
    s.assign("t1", &["src"]);
    completed(s.outcome().await);
    let model = small.lock().unwrap().clone().unwrap();
    let refused = model.refused.lock().unwrap().clone();
    let answered = model.answered.lock().unwrap().clone();
    assert!(
        !refused.is_empty(),
        "the context was too small at some point"
    );
    assert_eq!(answered.len(), 6, "every scripted answer was given once");
    assert!(answered.iter().all(|&b| b <= limit), "{answered:?}");
}
