//! The command agent: an external coding-agent CLI (here a fake one,
//! `tests/fixtures/fake-agent.sh`) as a worker, in a real worktree of a temporary repository
//! under a real Worker, and as a session on its own. Its handoff is what git says and none of
//! flotilla's files for the CLI reach the branch; its events become live activity and spend;
//! every way a CLI goes wrong (garbage, a crash, silence, a cancel, no such program) ends the
//! call with the right error and no process left behind.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use flotilla::agents::command::{
    CommandAgent, CommandAgentConfig, OutputFormat, PromptVia, ResultVia,
};
use flotilla::worktrees::GitWorktrees;
use flotilla_actors::actors::{AgentSet, WorkerKit, WorkerPool};
use flotilla_actors::ports::{Agent, AgentError, AttemptContext, Workspace};
use flotilla_actors::protocol::*;
use flotilla_actors::work_check::Checks;

use crate::daemon_env::{commit_files, init_repo};
use crate::harness::*;

const FAKE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fake-agent.sh");

/// Real processes on a busy machine: waits are generous, and never an upper bound that a
/// test asserts.
const PATIENCE: Duration = Duration::from_secs(60);

/// The fake CLI in `mode`, run as `sh fake-agent.sh mode more…`.
fn fake(mode: &str, more: &[&str]) -> CommandAgentConfig {
    let args = [FAKE, mode]
        .iter()
        .chain(more)
        .map(|a| a.to_string())
        .collect();
    CommandAgentConfig {
        program: Some("sh".into()),
        args: Some(args),
        ..CommandAgentConfig::default()
    }
}

fn agent(config: CommandAgentConfig) -> CommandAgent {
    CommandAgent::new(
        "fake".into(),
        config,
        // These fakes report their pids and prompts through files outside the worktree, and
        // the tests look for those pids on the host: unsandboxed (ADR-015; the sandboxed CLI
        // is tests/it/escapes.rs).
        Arc::new(crate::process::unsandboxed()),
        "You are a worker.".into(),
    )
    .unwrap()
}

struct Session {
    graph: Inbox<ToTaskGraph>,
    repo: tempfile::TempDir,
    state: tempfile::TempDir,
    pool: Addr<WorkerPool>,
    run: RunId,
}

fn start(config: CommandAgentConfig) -> Session {
    start_telling(config, None)
}

fn start_telling(config: CommandAgentConfig, notices: Option<Recipient<Published>>) -> Session {
    let repo = tempfile::tempdir().unwrap();
    init_repo(repo.path());
    let git = git2::Repository::open(repo.path()).unwrap();
    commit_files(&git, &[("src/lib.rs", "pub mod a;\n")], "code");
    let state = tempfile::tempdir().unwrap();
    let run = RunId::generate();
    let kit = WorkerKit {
        agents: AgentSet::one(Arc::new(agent(config))),
        worktrees: Arc::new(GitWorktrees::new(
            repo.path(),
            run,
            state.path().join(run.to_string()),
        )),
        runner: // These fakes report their pids and prompts through files outside the worktree, and
        // the tests look for those pids on the host: unsandboxed (ADR-015; the sandboxed CLI
        // is tests/it/escapes.rs).
        Arc::new(crate::process::unsandboxed()),
        checks: Arc::new(Checks::default()),
        notices,
        keep_failed: false,
    };
    let (graph, inbox) = probe::<ToTaskGraph>("task graph");
    let pool = WorkerPool::new(run, kit, graph, PATIENCE).start();
    Session {
        graph: inbox,
        repo,
        state,
        pool,
        run,
    }
}

impl Session {
    fn assign(&self, id: &str, scope: &[&str]) -> String {
        let mut task = ready(id, spec("work", scope), 1, 1);
        task.budget = Budget::new(10_000_000, Usd::from_dollars(100.0).unwrap(), 600_000);
        let branch = branch_name(self.run, &task.task, 1);
        self.pool.do_send(ToAgent::Assign(Assignment {
            run: self.run,
            task,
            profile: "general".into(),
            route: Route::Worker,
            branch: branch.clone(),
        }));
        branch
    }

    /// The attempt's last word, and the tokens and money it reported before it (the
    /// Worker's wall time aside).
    async fn outcome(&mut self) -> (Result<Box<TaskCompleted>, AttemptFailure>, Budget) {
        let mut spent = Budget::default();
        let outcome = self
            .graph
            .fish_for("the attempt's outcome", |m| match m {
                ToTaskGraph::SpendReported { spent: s, .. } => {
                    spent.tokens += s.tokens;
                    spent.cost_usd = spent.cost_usd.saturating_add(s.cost_usd);
                    None
                }
                ToTaskGraph::TaskCompleted(c) => Some(Ok(c.clone())),
                ToTaskGraph::TaskFailed { failure, .. } => Some(Err(failure.clone())),
                _ => None,
            })
            .await;
        (outcome, spent)
    }

    /// Every path in the tree of `branch`'s tip.
    fn paths_on(&self, branch: &str) -> Vec<String> {
        let git = git2::Repository::open(self.repo.path()).unwrap();
        let tree = git
            .find_branch(branch, git2::BranchType::Local)
            .unwrap()
            .get()
            .peel_to_tree()
            .unwrap();
        let mut paths = Vec::new();
        tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
            if entry.kind() == Some(git2::ObjectType::Blob) {
                paths.push(format!("{dir}{}", entry.name().unwrap()));
            }
            git2::TreeWalkResult::Ok
        })
        .unwrap();
        paths
    }

    fn file_on(&self, branch: &str, path: &str) -> String {
        let git = git2::Repository::open(self.repo.path()).unwrap();
        let tree = git
            .find_branch(branch, git2::BranchType::Local)
            .unwrap()
            .get()
            .peel_to_tree()
            .unwrap();
        let blob = tree
            .get_path(Path::new(path))
            .unwrap()
            .to_object(&git)
            .unwrap()
            .peel_to_blob()
            .unwrap();
        String::from_utf8_lossy(blob.content()).into_owned()
    }

    /// Where the run's worktrees live.
    fn worktrees(&self) -> PathBuf {
        self.state.path().join(self.run.to_string())
    }
}

fn completed(outcome: Result<Box<TaskCompleted>, AttemptFailure>) -> Box<TaskCompleted> {
    outcome.unwrap_or_else(|failure| panic!("expected a completion, got {failure:?}"))
}

fn no_flotilla_files(paths: &[String]) {
    assert!(
        !paths.iter().any(|p| p.contains("FLOTILLA_")),
        "flotilla's files for the CLI reached the branch: {paths:?}"
    );
}

/// The pids a `hang` fake wrote to `file` (itself and its child), once it has.
async fn pids_in(file: &Path) -> Vec<i32> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Ok(text) = std::fs::read_to_string(file) {
            let pids: Vec<i32> = text
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
            if pids.len() == 2 {
                return pids;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no pids in {}",
            file.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether the process is gone (a zombie counts: an orphan is reaped by pid 1, which in
/// some containers never reaps).
fn gone(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let exists = unsafe { libc::kill(pid, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false);
    !exists || zombie
}

async fn all_gone(pids: &[i32]) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !pids.iter().all(|&pid| gone(pid)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still alive: {pids:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix::test]
async fn a_cli_that_prints_its_envelope_hands_back_what_git_says_and_no_file_of_flotillas() {
    let config = CommandAgentConfig {
        prompt: Some(PromptVia::File),
        ..fake("envelope", &["{prompt_file}"])
    };
    let mut s = start(config);
    let branch = s.assign("t1", &["src"]);
    let (outcome, _) = s.outcome().await;
    let h = completed(outcome).handoff.unwrap();
    assert_eq!(h.status, HandoffStatus::Complete);
    assert_eq!(h.summary, "wrote a");
    assert_eq!(
        h.concerns,
        ["the fake agent wrote it"],
        "its words are kept"
    );
    assert_eq!(h.files_changed, ["src/a.rs"]);
    assert_eq!((h.metrics.lines_added, h.metrics.lines_removed), (2, 0));
    assert!(h.findings.is_empty(), "{:?}", h.findings);
    let work = h.work.unwrap();
    assert_eq!(work.branch, branch);
    let paths = s.paths_on(&branch);
    assert!(paths.contains(&"src/a.rs".to_string()), "{paths:?}");
    no_flotilla_files(&paths);
    assert_eq!(
        s.file_on(&branch, "src/a.rs"),
        "pub fn a() {}\npub fn b() {}\n"
    );
}

#[actix::test]
async fn a_result_file_is_read_and_never_reaches_the_branch() {
    let config = CommandAgentConfig {
        result: Some(ResultVia::File),
        ..fake("result-file", &[])
    };
    let mut s = start(config);
    let branch = s.assign("t1", &["src"]);
    let (outcome, _) = s.outcome().await;
    let h = completed(outcome).handoff.unwrap();
    assert_eq!(h.summary, "from the file");
    assert_eq!(h.files_changed, ["src/r.rs"]);
    no_flotilla_files(&s.paths_on(&branch));
}

#[actix::test]
async fn claude_style_events_report_spend_once_and_show_live_activity() {
    let (notices, mut seen) = probe::<Published>("notices");
    let config = CommandAgentConfig {
        output: Some(OutputFormat::ClaudeStreamJson),
        ..fake("claude", &[])
    };
    let mut s = start_telling(config, Some(notices));
    let branch = s.assign("t1", &["src"]);
    let (outcome, spent) = s.outcome().await;
    let h = completed(outcome).handoff.unwrap();
    assert_eq!(h.summary, "wrote c");
    assert_eq!(h.files_changed, ["src/c.rs"]);
    assert_eq!(
        (spent.tokens, spent.cost_usd),
        (300, Usd::from_dollars(0.0123).unwrap()),
        "the messages' usage as it came, then the result's cost; nothing twice"
    );
    assert_eq!((h.metrics.tokens_in, h.metrics.tokens_out), (250, 50));
    assert_eq!(h.metrics.cost_usd, Usd::from_dollars(0.0123).unwrap());
    assert_eq!(h.metrics.tool_calls, 1);
    no_flotilla_files(&s.paths_on(&branch));
    let first = seen
        .fish_for("an activity notice", |p| match &p.0.kind {
            EventKind::AgentActivity { task, activity, .. } => {
                Some((task.to_string(), activity.clone()))
            }
            _ => None,
        })
        .await;
    assert_eq!(first, ("t1".into(), "Edit src/c.rs".into()));
}

#[actix::test]
async fn codex_style_events_report_spend_and_the_last_agent_message_is_the_envelope() {
    let (notices, mut seen) = probe::<Published>("notices");
    let config = CommandAgentConfig {
        output: Some(OutputFormat::CodexJson),
        ..fake("codex", &[])
    };
    let mut s = start_telling(config, Some(notices));
    s.assign("t1", &["src"]);
    let (outcome, spent) = s.outcome().await;
    let h = completed(outcome).handoff.unwrap();
    assert_eq!(h.summary, "wrote d");
    assert_eq!(h.files_changed, ["src/d.rs"]);
    assert_eq!((spent.tokens, spent.cost_usd), (1300, Usd::ZERO));
    assert_eq!((h.metrics.tokens_in, h.metrics.tokens_out), (1000, 300));
    assert_eq!(h.metrics.tool_calls, 2, "a command and a file change");
    let first = seen
        .fish_for("an activity notice", |p| match &p.0.kind {
            EventKind::AgentActivity { activity, .. } => Some(activity.clone()),
            _ => None,
        })
        .await;
    assert_eq!(first, "bash: bash -lc ls");
}

#[actix::test]
async fn output_without_an_envelope_is_malformed_and_says_what_the_cli_printed() {
    let mut s = start(fake("garbage", &[]));
    s.assign("t1", &["src"]);
    let (outcome, _) = s.outcome().await;
    let AttemptFailure::Malformed { detail } = outcome.unwrap_err() else {
        panic!("expected a malformed attempt");
    };
    assert!(detail.contains("printed no result envelope"), "{detail}");
    assert!(detail.contains("nothing useful"), "{detail}");
}

#[actix::test]
async fn a_crash_is_reported_with_its_exit_code_and_last_output() {
    let mut s = start(fake("crash", &[]));
    s.assign("t1", &["src"]);
    let (outcome, _) = s.outcome().await;
    let AttemptFailure::Crashed { detail } = outcome.unwrap_err() else {
        panic!("expected a crash");
    };
    assert!(detail.contains("exited with code 3"), "{detail}");
    assert!(
        detail.contains("fatal: the model refused the request") && detail.contains("starting"),
        "{detail}"
    );
}

#[actix::test]
async fn an_envelope_from_a_cli_that_then_fails_is_kept_with_a_concern() {
    let mut s = start(fake("envelope-exit", &[]));
    s.assign("t1", &["src"]);
    let (outcome, _) = s.outcome().await;
    let h = completed(outcome).handoff.unwrap();
    assert_eq!(h.status, HandoffStatus::Partial);
    assert_eq!(h.files_changed, ["src/e.rs"]);
    assert!(h.concerns[0].contains("exit code 2"), "{:?}", h.concerns);
    assert_eq!(h.concerns[1], "the fake agent wrote it");
}

#[actix::test]
async fn a_silent_cli_is_killed_at_its_stall_limit_with_its_whole_group() {
    let pids = tempfile::tempdir().unwrap();
    let pid_file = pids.path().join("pids");
    let config = CommandAgentConfig {
        stall_secs: 1,
        ..fake("hang", &[pid_file.to_str().unwrap()])
    };
    let mut s = start(config);
    s.assign("t1", &["src"]);
    let (outcome, _) = s.outcome().await;
    let AttemptFailure::Crashed { detail } = outcome.unwrap_err() else {
        panic!("expected a crash");
    };
    assert!(detail.contains("stalled"), "{detail}");
    assert!(detail.contains("thinking hard"), "the tail: {detail}");
    all_gone(&pids_in(&pid_file).await).await;
}

#[actix::test]
async fn a_subplan_names_the_task_flotilla_gave() {
    let mut s = start(fake("subplan", &[]));
    s.assign("t1", &["src"]);
    let (outcome, _) = s.outcome().await;
    let done = completed(outcome);
    let plan = done.subplan.unwrap();
    assert_eq!(plan.parent, "t1".parse::<TaskId>().unwrap());
    assert_eq!(plan.subtasks.len(), 2);
    assert_eq!(plan.subtasks[1].depends_on, [0]);
    assert_eq!(done.handoff.unwrap().status, HandoffStatus::Partial);
}

#[actix::test]
async fn the_cli_gets_a_scrubbed_environment_with_its_task_and_branch() {
    for name in ["CARGO_MANIFEST_DIR", "CARGO_PKG_NAME", "PATH"] {
        assert!(
            std::env::var_os(name).is_some(),
            "cargo sets {name} for tests"
        );
    }
    let config = CommandAgentConfig {
        secrets: vec!["CARGO_PKG_NAME".into()],
        env_pass: vec!["CARGO_PKG_VERSION".into()],
        ..fake("env", &[])
    };
    let mut s = start(config);
    let branch = s.assign("t1", &["src"]);
    let (outcome, _) = s.outcome().await;
    completed(outcome);
    let env = s.file_on(&branch, "src/env.txt");
    let has = |line: &str| env.lines().any(|l| l.starts_with(line));
    assert!(has("PATH="), "{env}");
    assert!(has("TERM=dumb"), "{env}");
    assert!(env.lines().any(|l| l == "FLOTILLA_TASK=t1"), "{env}");
    assert!(
        env.lines()
            .any(|l| l == format!("FLOTILLA_BRANCH={branch}")),
        "{env}"
    );
    assert!(
        has("CARGO_PKG_NAME=flotilla"),
        "a secret named on purpose: {env}"
    );
    assert!(
        has("CARGO_PKG_VERSION="),
        "a variable named in env_pass: {env}"
    );
    assert!(
        !has("CARGO_MANIFEST_DIR="),
        "nothing else of the daemon's: {env}"
    );
}

#[actix::test]
async fn a_missing_program_is_a_crash_that_says_it_cannot_start() {
    let config = CommandAgentConfig {
        program: Some("/nonexistent/flotilla-fake-agent".into()),
        ..CommandAgentConfig::default()
    };
    let mut s = start(config);
    s.assign("t1", &["src"]);
    let (outcome, _) = s.outcome().await;
    let AttemptFailure::Crashed { detail } = outcome.unwrap_err() else {
        panic!("expected a crash");
    };
    assert!(detail.contains("cannot start"), "{detail}");
    assert!(
        detail.contains("/nonexistent/flotilla-fake-agent"),
        "{detail}"
    );
}

#[actix::test]
async fn calling_the_attempt_off_kills_the_cli_and_leaves_no_worktree() {
    let pids = tempfile::tempdir().unwrap();
    let pid_file = pids.path().join("pids");
    let s = start(fake("hang", &[pid_file.to_str().unwrap()]));
    s.assign("t1", &["src"]);
    let running = pids_in(&pid_file).await;
    s.pool.do_send(ToAgent::Cancel {
        task: "t1".parse().unwrap(),
        reason: "the user cancelled it".into(),
    });
    all_gone(&running).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let left: Vec<_> = std::fs::read_dir(s.worktrees())
            .map(|dir| dir.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default();
        if left.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "worktrees left: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// The session on its own, outside a Worker.

fn assignment(id: &str, description: &str) -> Assignment {
    let task = ready(id, spec(description, &["src"]), 1, 1);
    let run = RunId::generate();
    Assignment {
        run,
        branch: branch_name(run, &task.task, 1),
        task,
        profile: "general".into(),
        route: Route::Worker,
    }
}

#[actix::test]
async fn a_called_off_session_is_cancelled_and_its_prompt_file_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let pids = tempfile::tempdir().unwrap();
    let pid_file = pids.path().join("pids");
    let config = CommandAgentConfig {
        prompt: Some(PromptVia::File),
        ..fake("hang", &[pid_file.to_str().unwrap()])
    };
    let attempt = AttemptContext::detached();
    let cancel = attempt.cancel.clone();
    let mut session = agent(config).open(Workspace::scratch(dir.path().into()), attempt);
    let call = tokio::spawn(session.run(assignment("t1", "work")));
    let running = pids_in(&pid_file).await;
    assert!(dir.path().join("FLOTILLA_TASK.md").exists());
    cancel.cancel();
    let result = tokio::time::timeout(PATIENCE, call).await.unwrap().unwrap();
    assert_eq!(result, Err(AgentError::Cancelled));
    all_gone(&running).await;
    assert!(!dir.path().join("FLOTILLA_TASK.md").exists());
}

#[actix::test]
async fn a_stale_result_file_is_never_taken_for_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("FLOTILLA_RESULT.json"),
        r#"{"status": "complete", "summary": "from an earlier call"}"#,
    )
    .unwrap();
    let config = CommandAgentConfig {
        result: Some(ResultVia::File),
        ..fake("garbage", &[])
    };
    let mut session = agent(config).open(
        Workspace::scratch(dir.path().into()),
        AttemptContext::detached(),
    );
    let result = tokio::time::timeout(PATIENCE, session.run(assignment("t1", "work")))
        .await
        .unwrap();
    let Err(AgentError::Malformed(detail)) = result else {
        panic!("expected a malformed result, got {result:?}");
    };
    assert!(detail.contains("FLOTILLA_RESULT.json"), "{detail}");
    assert!(detail.contains("missing"), "{detail}");
    assert!(!dir.path().join("FLOTILLA_RESULT.json").exists());
}

#[actix::test]
async fn every_call_tells_the_cli_the_whole_story() {
    let dir = tempfile::tempdir().unwrap();
    let prompts = tempfile::tempdir().unwrap();
    let prompt_file = prompts.path().join("prompt");
    let read = || std::fs::read_to_string(&prompt_file).unwrap();
    let mut session = agent(fake("prompt", &[prompt_file.to_str().unwrap()])).open(
        Workspace::scratch(dir.path().into()),
        AttemptContext::detached(),
    );
    let task = assignment("t1", "Write the lexer");

    let report = tokio::time::timeout(PATIENCE, session.run(task.clone()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(report.handoff.unwrap().summary, "read the prompt");
    let prompt = read();
    assert!(prompt.starts_with("You are a worker."), "{prompt}");
    for part in [
        "## Your task (t1)",
        "Write the lexer",
        "scope (the only files you may change): src",
        &format!("branch: {}", task.branch),
        "## Handing back",
        "the last thing you write",
    ] {
        assert!(prompt.contains(part), "{part:?} is missing from:\n{prompt}");
    }

    let rejection = RejectionReason::TooManySubtasks {
        proposed: 12,
        max: 10,
    };
    tokio::time::timeout(PATIENCE, session.revise(task.clone(), rejection.clone()))
        .await
        .unwrap()
        .unwrap();
    let prompt = read();
    assert!(
        prompt.contains("Write the lexer"),
        "the task again: {prompt}"
    );
    assert!(prompt.contains(&rejection.to_string()), "{prompt}");

    let results = vec![SubtaskResult {
        task: "t1.1".parse().unwrap(),
        state: TaskState::Completed,
        handoff: Some(Handoff::complete("the lexer's tokens")),
        failure: None,
    }];
    tokio::time::timeout(PATIENCE, session.synthesize("t1".parse().unwrap(), results))
        .await
        .unwrap()
        .unwrap();
    let prompt = read();
    assert!(prompt.contains("The subtasks of t1 ended"), "{prompt}");
    assert!(prompt.contains("t1.1"), "{prompt}");
    assert!(prompt.contains("the lexer's tokens"), "{prompt}");
}
