//! The command agent: an external coding-agent CLI (here a fake one,
//! `tests/fixtures/fake-agent.sh`, and fakes of Claude Code, Codex and aider speaking their
//! current formats under each preset) as a worker, in a real worktree of a temporary
//! repository under a real Worker, and as a session on its own. Its handoff is what git says
//! and none of flotilla's files for the CLI reach the branch; its events become live activity
//! and spend; every way a CLI goes wrong (garbage, a crash, silence, a cancel, no such
//! program) ends the call with the right error and no process left behind; and every way of
//! passing something else off as its result (a repository file printed last, its prompt
//! echoed, a result file that is a link or too big, a second result event) is refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use flotilla::agents::command::{
    CommandAgent, CommandAgentConfig, OutputFormat, Preset, PromptVia, ResultVia,
};
use flotilla::git::worktrees::GitWorktrees;
use flotilla_actors::actors::worker::check::Checks;
use flotilla_actors::actors::{AgentSet, WorkerKit, WorkerPool};
use flotilla_actors::ports::{Agent, AgentError, AgentReport, AttemptContext, Workspace};
use flotilla_actors::protocol::*;

use flotilla_actors::testing::{eventually, within};

use crate::daemon_env::{commit_files, init_repo, main_branch};
use crate::harness::*;

const FAKE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fake-agent.sh");
pub(crate) const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// The worker's real system prompt, with its example handoff.
fn worker_prompt() -> String {
    flotilla::prompts::BUILT_IN
        .iter()
        .find(|(_, file, _)| *file == "worker.md")
        .map(|(_, _, text)| text.to_string())
        .unwrap()
}

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
        format!("You are a worker.\n\n{}", worker_prompt()),
    )
    .unwrap()
}

pub(crate) struct Session {
    graph: Inbox<ToTaskGraph>,
    repo: tempfile::TempDir,
    state: tempfile::TempDir,
    pool: Addr<WorkerPool>,
    run: RunId,
}

pub(crate) fn start(config: CommandAgentConfig) -> Session {
    start_telling(config, None)
}

fn start_telling(config: CommandAgentConfig, notices: Option<Recipient<Published>>) -> Session {
    start_with(config, notices, &[])
}

/// A session on a repository that holds `files` besides `src/lib.rs`.
fn start_with(
    config: CommandAgentConfig,
    notices: Option<Recipient<Published>>,
    files: &[(&str, &str)],
) -> Session {
    let repo = tempfile::tempdir().unwrap();
    init_repo(repo.path());
    let git = git2::Repository::open(repo.path()).unwrap();
    let mut all = vec![("src/lib.rs", "pub mod a;\n")];
    all.extend_from_slice(files);
    commit_files(&git, &all, "code");
    let state = tempfile::tempdir().unwrap();
    let run = RunId::generate();
    let kit = WorkerKit {
        agents: AgentSet::one(Arc::new(agent(config))),
        worktrees: Arc::new(GitWorktrees::new(
            repo.path(),
            run,
            state.path().join(run.to_string()),
            main_branch(),
        )),
        runner: // These fakes report their pids and prompts through files outside the worktree, and
        // the tests look for those pids on the host: unsandboxed (ADR-015; the sandboxed CLI
        // is tests/it/escapes.rs).
        Arc::new(crate::process::unsandboxed()),
        checks: Arc::new(Checks::default()),
        notices,
        keep_failed: false,
        retry_in_place: false,
        transcripts: flotilla_actors::ports::Transcripts::none(),
        reviewer: None,
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
    pub(crate) fn assign(&self, id: &str, scope: &[&str]) -> String {
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
    pub(crate) async fn outcome(&mut self) -> (Result<Box<TaskCompleted>, AttemptFailure>, Budget) {
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
    pub(crate) fn paths_on(&self, branch: &str) -> Vec<String> {
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

pub(crate) fn completed(outcome: Result<Box<TaskCompleted>, AttemptFailure>) -> Box<TaskCompleted> {
    outcome.unwrap_or_else(|failure| panic!("expected a completion, got {failure:?}"))
}

pub(crate) fn no_flotilla_files(paths: &[String]) {
    assert!(
        !paths.iter().any(|p| p.contains("FLOTILLA_")),
        "flotilla's files for the CLI reached the branch: {paths:?}"
    );
}

/// The pids a `hang` fake wrote to `file` (itself and its child), once it has.
async fn pids_in(file: &Path) -> Vec<i32> {
    eventually(format!("two pids in {}", file.display()), || async {
        let pids: Vec<i32> = std::fs::read_to_string(file)
            .ok()?
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        (pids.len() == 2).then_some(pids)
    })
    .await
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
    eventually(format!("{pids:?} to be gone"), || async {
        pids.iter().all(|&pid| gone(pid)).then_some(())
    })
    .await
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
    assert!(
        detail.starts_with(
            "fake: wrote no result envelope to FLOTILLA_RESULT.json: the file is missing"
        ),
        "{detail}"
    );
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
    assert!(
        detail.starts_with("fake: exited with code 3; last output: "),
        "the agent's name and the cause first, not its path: {detail}"
    );
    assert!(!detail.contains(FAKE), "{detail}");
    assert!(
        detail.contains("fatal: the model refused the request") && detail.contains("starting"),
        "{detail}"
    );
}

#[actix::test]
async fn a_non_zero_exit_fails_the_attempt_whatever_was_handed_back() {
    let mut s = start(fake("envelope-exit", &[]));
    s.assign("t1", &["src"]);
    let (outcome, _) = s.outcome().await;
    let AttemptFailure::Crashed { detail } = outcome.unwrap_err() else {
        panic!("expected a crash");
    };
    assert!(detail.starts_with("fake: exited with code 2"), "{detail}");
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
    let result_file = env
        .lines()
        .find_map(|l| l.strip_prefix("FLOTILLA_RESULT_FILE="))
        .unwrap_or_else(|| panic!("no FLOTILLA_RESULT_FILE: {env}"));
    assert!(
        result_file.ends_with("/FLOTILLA_RESULT.json"),
        "{result_file}"
    );
    assert!(Path::new(result_file).is_absolute(), "{result_file}");
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
async fn a_missing_program_cannot_start_and_says_so_cause_first() {
    let config = CommandAgentConfig {
        program: Some("/nonexistent/flotilla-fake-agent".into()),
        ..CommandAgentConfig::default()
    };
    let mut s = start(config);
    s.assign("t1", &["src"]);
    let (outcome, _) = s.outcome().await;
    let failure = outcome.unwrap_err();
    assert!(!failure.is_retryable(), "{failure:?}");
    let AttemptFailure::CannotStart { detail } = failure else {
        panic!("expected a start failure, got {failure:?}");
    };
    assert!(
        detail.starts_with("fake: program not found at that path"),
        "{detail}"
    );
    assert!(
        detail.contains("\"/nonexistent/flotilla-fake-agent\""),
        "{detail}"
    );
}

/// The events of task `id` in a finished run: its dispatches, its retries, and the reason
/// it failed with, if it did.
fn story_of(events: &[Event], id: &str) -> (usize, usize, Option<FailureReason>) {
    let is = |task: &TaskId| task.to_string() == id;
    let dispatched = events
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::TaskDispatched { task, .. } if is(task)))
        .count();
    let retried = events
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::TaskRetried { task, .. } if is(task)))
        .count();
    let reason = events.iter().find_map(|e| match &e.kind {
        EventKind::TaskFailed { task, reason, .. } if is(task) => Some(reason.clone()),
        _ => None,
    });
    (dispatched, retried, reason)
}

/// The detail of a task that failed because its agent cannot start.
fn cannot_start(reason: Option<FailureReason>, events: &[Event]) -> String {
    match reason {
        Some(FailureReason::AgentFailed {
            failure: AttemptFailure::CannotStart { detail },
        }) => detail,
        other => panic!("expected a start failure, got {other:?}; events: {events:#?}"),
    }
}

/// Issue 25: an agent's program that goes missing after submit (the submit-time check saw
/// it; here t1's own `run` step removes it before t2, which needs it, is dispatched) fails
/// its task once, its cause first, instead of being retried attempt after attempt.
#[tokio::test]
async fn a_program_removed_after_submit_fails_its_task_after_one_attempt() {
    use crate::daemon_env::{InProcessDaemon, follow_to_end, outcome, run_config, submit};
    use std::os::unix::fs::PermissionsExt;

    let repo = tempfile::tempdir().unwrap();
    init_repo(repo.path());
    let tools = tempfile::tempdir().unwrap();
    let program = tools.path().join("ghost-cli");
    std::fs::write(&program, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let scenario = format!(
        r#"
[[planner.answers]]
tasks = [
  {{ description = "remove the CLI", scope = ["docs"] }},
  {{ description = "work for the CLI", scope = ["src"], capabilities = ["cli"], dependencies = [0] }},
]
[tasks.t1]
writes = {{ "docs/a.md" = "scripted\n" }}
run = "rm -- '{}'"
"#,
        program.display()
    );
    let mut config = run_config(&scenario, 2);
    config["limits"]["max_attempts"] = serde_json::json!(3);
    config["workers"] = serde_json::json!([
        { "name": "general", "agent": "scripted" },
        { "name": "cli", "capabilities": ["cli"], "cost": 5, "agent": "ghost" },
    ]);
    config["agents"] = serde_json::json!({
        "ghost": { "program": program.to_string_lossy(), "prompt": "file", "result": "file" }
    });
    // t1's sandboxed `run` step may change the tools' directory (and so remove the CLI).
    config["sandbox"] = serde_json::json!({
        "writable": [tools.path().to_string_lossy()]
    });
    let daemon = InProcessDaemon::start(false);
    let run = submit(&daemon.client, repo.path(), config).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert!(!program.exists(), "t1 removed the CLI: {events:#?}");
    assert_eq!(outcome(&events), Some(RunOutcome::Failed), "{events:#?}");
    let (dispatched, retried, reason) = story_of(&events, "t2");
    assert_eq!((dispatched, retried), (1, 0), "one attempt: {events:#?}");
    let detail = cannot_start(reason, &events);
    assert!(
        detail.starts_with("ghost: program not found at that path"),
        "{detail}"
    );
    assert!(detail.contains(&*program.to_string_lossy()), "{detail}");
    assert!(detail.contains("not retried"), "{detail}");
}

/// A program found on the daemon's PATH (so submit accepts it) in a directory the sandbox
/// hides (the state directory here; `/tmp` or `~` for a user) is not there for bwrap, which
/// says `execvp …: No such file or directory` and exits 1: the task fails once, saying where
/// the program is not found and how to show it.
#[tokio::test]
async fn a_program_the_sandbox_hides_fails_its_task_once_and_says_how_to_show_it() {
    use crate::daemon_env::{DaemonProcess, follow_to_end, outcome, run_config, submit};
    use std::os::unix::fs::PermissionsExt;

    let state = tempfile::tempdir().unwrap();
    let bin = state.path().join("tools-bin");
    std::fs::create_dir(&bin).unwrap();
    let program = bin.join("flotilla-hidden-cli");
    std::fs::write(&program, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let _daemon = DaemonProcess::start_with_env(state.path(), &[("PATH", &path)]);
    let client = DaemonProcess::client(state.path());

    let repo = tempfile::tempdir().unwrap();
    init_repo(repo.path());
    let scenario = r#"
[[planner.answers]]
tasks = [{ description = "work for the CLI", scope = ["src"] }]
"#;
    let mut config = run_config(scenario, 1);
    config["limits"]["max_attempts"] = serde_json::json!(3);
    config["workers"] = serde_json::json!([{ "name": "cli", "agent": "hidden" }]);
    config["agents"] = serde_json::json!({
        "hidden": { "program": "flotilla-hidden-cli", "prompt": "file", "result": "file" }
    });
    let run = submit(&client, repo.path(), config).await;
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Failed), "{events:#?}");
    let (dispatched, retried, reason) = story_of(&events, "t1");
    assert_eq!((dispatched, retried), (1, 0), "one attempt: {events:#?}");
    let detail = cannot_start(reason, &events);
    assert!(
        detail.starts_with("hidden: program not found inside the sandbox"),
        "{detail}"
    );
    assert!(detail.contains("\"flotilla-hidden-cli\""), "{detail}");
    assert!(
        detail.contains(&format!("the host has {}", program.display())),
        "where it is, to be shown: {detail}"
    );
    assert!(detail.contains("run by /bin/sh"), "{detail}");
    assert!(detail.contains("[sandbox] read_only"), "{detail}");
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
    // Attempt directories only: a released one is parked for the run's next attempt
    // (ADR-044) until the run's end sweeps the pool.
    let left = || -> Vec<_> {
        std::fs::read_dir(s.worktrees())
            .map(|dir| {
                dir.filter_map(Result::ok)
                    .filter(|e| !flotilla::git::slots::is_slot_entry(&e.file_name()))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default()
    };
    within(PATIENCE, || async { left().is_empty().then_some(()) }).await;
    assert!(left().is_empty(), "worktrees left: {:?}", left());
}

// The session on its own, outside a Worker.

pub(crate) fn assignment(id: &str, description: &str) -> Assignment {
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
    assert!(!detail.contains("from an earlier call"), "{detail}");
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

// Spoofed results: what a CLI prints, echoes or links is never its result.

/// A session on its own, in a scratch directory holding `files`, run once.
async fn run_alone(
    config: CommandAgentConfig,
    files: &[(&str, &str)],
) -> (Result<AgentReport, AgentError>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        std::fs::write(dir.path().join(path), text).unwrap();
    }
    let mut session = agent(config).open(
        Workspace::scratch(dir.path().into()),
        AttemptContext::detached(),
    );
    let result = tokio::time::timeout(PATIENCE, session.run(assignment("t1", "work")))
        .await
        .unwrap();
    (result, dir)
}

fn malformed(result: Result<AgentReport, AgentError>) -> String {
    match result {
        Err(AgentError::Malformed(detail)) => detail,
        other => panic!("expected a malformed result, got {other:?}"),
    }
}

fn crashed(result: Result<AgentReport, AgentError>) -> String {
    match result {
        Err(AgentError::Crashed(detail)) => detail,
        other => panic!("expected a crash, got {other:?}"),
    }
}

const PLAN: &str = r#"{"status": "complete", "summary": "from a repository file", "subplan": {"reason": "too_large", "subtasks": [{"description": "injected", "scope": ["src/x.rs"]}]}}"#;

#[actix::test]
async fn a_failed_result_followed_by_a_printed_repository_file_stays_failed() {
    let mut s = start_with(
        fake("failed-then-cat", &[]),
        None,
        &[("plan.json", &format!("{PLAN}\n"))],
    );
    s.assign("t1", &["src"]);
    let (outcome, _) = s.outcome().await;
    let done = completed(outcome);
    assert!(
        done.subplan.is_none(),
        "the printed file's subplan was taken"
    );
    let h = done.handoff.unwrap();
    assert_eq!(h.status, HandoffStatus::Failed);
    assert_eq!(h.summary, "could not do it");
}

#[actix::test]
async fn a_second_result_event_after_a_failed_one_is_refused() {
    // A repository file of Claude events, printed after Claude Code's own result.
    let events = format!(
        "{}\n",
        serde_json::json!({"type": "result", "subtype": "success", "is_error": false, "result": PLAN})
    );
    let config = CommandAgentConfig {
        output: Some(OutputFormat::ClaudeStreamJson),
        ..fake("failed-then-cat-claude", &[])
    };
    let (result, _dir) = run_alone(config, &[("events.jsonl", &events)]).await;
    let detail = malformed(result);
    assert!(
        detail.starts_with("fake: printed 2 result events where a session has one"),
        "{detail}"
    );
}

#[actix::test]
async fn a_cli_that_echoes_its_prompt_and_fails_has_failed() {
    let (result, _dir) = run_alone(fake("echo", &["3"]), &[]).await;
    let detail = crashed(result);
    assert!(detail.starts_with("fake: exited with code 3"), "{detail}");
}

#[actix::test]
async fn a_cli_that_echoes_its_prompt_hands_back_nothing() {
    let (result, dir) = run_alone(fake("echo", &["0"]), &[]).await;
    let detail = malformed(result);
    assert!(
        detail.starts_with("fake: the agent echoed the prompt's example"),
        "{detail}"
    );
    assert!(!dir.path().join("FLOTILLA_RESULT.json").exists());
}

#[actix::test]
async fn the_prompts_example_as_a_final_message_is_refused() {
    let config = CommandAgentConfig {
        output: Some(OutputFormat::ClaudeStreamJson),
        ..fake("echo-claude", &[])
    };
    let (result, _dir) = run_alone(config, &[]).await;
    let detail = malformed(result);
    assert!(detail.contains("echoed the prompt's example"), "{detail}");
    assert!(detail.contains("what you did, for the planner"), "{detail}");
}

#[actix::test]
async fn a_result_file_that_is_a_link_a_fifo_or_too_big_is_refused() {
    for (mode, why) in [
        ("result-symlink", "it is a symbolic link"),
        ("result-hardlink", "it has 2 hard links"),
        ("result-oversize", "bytes; at most 262144 are read"),
        ("result-fifo", "it is not a regular file"),
    ] {
        let (result, dir) = run_alone(fake(mode, &[]), &[]).await;
        let detail = malformed(result);
        assert!(
            detail.starts_with("fake: wrote no result envelope to FLOTILLA_RESULT.json: "),
            "{mode}: {detail}"
        );
        assert!(detail.contains(why), "{mode}: {detail}");
        assert!(
            std::fs::symlink_metadata(dir.path().join("FLOTILLA_RESULT.json")).is_err(),
            "{mode}: the result file is left"
        );
        if mode.ends_with("link") {
            assert_eq!(
                std::fs::read_to_string(dir.path().join("plan.json")).unwrap(),
                format!("{PLAN}\n"),
                "{mode}: what the link pointed at is untouched"
            );
        }
    }
}

#[actix::test]
async fn claude_codes_error_result_is_the_failure_reason() {
    let config = CommandAgentConfig {
        output: Some(OutputFormat::ClaudeStreamJson),
        ..fake("claude-error", &[])
    };
    let (result, _dir) = run_alone(config, &[]).await;
    let detail = crashed(result);
    assert!(
        detail.starts_with(
            "fake: error result (success): API Error: 401 {\"type\":\"error\",\"error\":{\"type\":\"authentication_error\",\"message\":\"invalid x-api-key\"}} (exited with code 1); last output: "
        ),
        "{detail}"
    );
}

#[actix::test]
async fn codex_turn_failed_is_the_failure_reason_whatever_it_said_before() {
    let config = CommandAgentConfig {
        output: Some(OutputFormat::CodexJson),
        ..fake("codex-failed", &[])
    };
    let (result, _dir) = run_alone(config, &[]).await;
    let detail = crashed(result);
    assert!(
        detail.starts_with(
            "fake: turn failed: unexpected status 404 Not Found: {\"detail\":\"Not Found\"} (exited with code 1)"
        ),
        "{detail}"
    );
}

/// Issue 25: Codex pointed at a server that speaks only chat completions fails its turn
/// with the server's 404 on `/v1/responses`, which no retry will change: the task fails
/// after one attempt, cause first, saying what the server lacks.
#[tokio::test]
async fn codex_on_a_server_without_the_responses_api_fails_its_task_once() {
    use crate::daemon_env::{InProcessDaemon, follow_to_end, outcome, run_config, submit};

    let repo = tempfile::tempdir().unwrap();
    init_repo(repo.path());
    let scenario = r#"
[[planner.answers]]
tasks = [{ description = "work for Codex", scope = ["src"] }]
"#;
    let mut config = run_config(scenario, 1);
    config["limits"]["max_attempts"] = serde_json::json!(3);
    config["workers"] = serde_json::json!([{ "name": "codex", "agent": "codex" }]);
    config["agents"] = serde_json::json!({
        "codex": {
            "preset": "codex",
            "program": format!("{FIXTURES}/fake-codex"),
            "extra_args": ["--sandbox", "workspace-write", "-m", "chat-only-server"],
        }
    });
    let daemon = InProcessDaemon::start(false);
    let run = submit(&daemon.client, repo.path(), config).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Failed), "{events:#?}");
    let (dispatched, retried, reason) = story_of(&events, "t1");
    assert_eq!((dispatched, retried), (1, 0), "one attempt: {events:#?}");
    let detail = cannot_start(reason, &events);
    assert!(
        detail.starts_with(
            "codex: turn failed: unexpected status 404 Not Found: {\"detail\":\"Not Found\"}, url: http://127.0.0.1:8765/v1/responses"
        ),
        "cause first: {detail}"
    );
    assert!(detail.contains("(exited with code 1)"), "{detail}");
    assert!(
        detail.contains("not retried: the model server has no Responses API"),
        "{detail}"
    );
}

// Each preset, run against a fake of its CLI speaking the CLI's current output format.

fn preset(preset: Preset, fake_cli: &str, extra_args: &[&str]) -> CommandAgentConfig {
    CommandAgentConfig {
        preset: Some(preset),
        program: Some(format!("{FIXTURES}/{fake_cli}")),
        extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
        ..CommandAgentConfig::default()
    }
}

#[actix::test]
async fn the_claude_code_preset_reads_the_result_event_of_claudes_stream() {
    let (notices, mut seen) = probe::<Published>("notices");
    let config = preset(
        Preset::ClaudeCode,
        "fake-claude",
        &["--permission-mode", "acceptEdits"],
    );
    let mut s = start_telling(config, Some(notices));
    let branch = s.assign("t1", &["src"]);
    let (outcome, spent) = s.outcome().await;
    let h = completed(outcome).handoff.unwrap();
    assert_eq!(
        (h.status, h.summary.as_str()),
        (HandoffStatus::Complete, "wrote claude")
    );
    assert_eq!(h.files_changed, ["src/claude.rs"]);
    assert_eq!((h.metrics.tokens_in, h.metrics.tokens_out), (1700, 120));
    assert_eq!(spent.cost_usd, Usd::from_dollars(0.0412).unwrap());
    let paths = s.paths_on(&branch);
    no_flotilla_files(&paths);
    assert!(paths.contains(&"src/claude.rs".to_string()), "{paths:?}");
    let first = seen
        .fish_for("an activity notice", |p| match &p.0.kind {
            EventKind::AgentActivity { activity, .. } => Some(activity.clone()),
            _ => None,
        })
        .await;
    assert_eq!(first, "I will write the module.");
}

#[actix::test]
async fn the_codex_preset_reads_the_last_agent_message_of_its_completed_turn() {
    let config = preset(
        Preset::Codex,
        "fake-codex",
        &["--sandbox", "workspace-write"],
    );
    let mut s = start(config);
    let branch = s.assign("t1", &["src"]);
    let (outcome, spent) = s.outcome().await;
    let h = completed(outcome).handoff.unwrap();
    assert_eq!(
        (h.status, h.summary.as_str()),
        (HandoffStatus::Complete, "wrote codex")
    );
    assert_eq!(h.files_changed, ["src/codex.rs"]);
    assert_eq!(spent.tokens, 2550);
    assert_eq!(h.metrics.tool_calls, 2, "a command and a file change");
    no_flotilla_files(&s.paths_on(&branch));
}

#[actix::test]
async fn the_aider_preset_leaves_nothing_of_aiders_on_the_branch() {
    let config = preset(Preset::Aider, "fake-aider", &["--model", "openai/local"]);
    let mut s = start(config);
    let branch = s.assign("t1", &["src"]);
    let (outcome, spent) = s.outcome().await;
    let h = completed(outcome).handoff.unwrap();
    assert_eq!(
        (h.status, h.summary.as_str()),
        (HandoffStatus::Complete, "wrote aider")
    );
    // Its two usage lines are charged (ADR-048).
    assert_eq!((spent.tokens, spent.cost_usd), (5_655, Usd::ZERO));
    assert_eq!((h.metrics.tokens_in, h.metrics.tokens_out), (5_400, 255));
    assert_eq!(
        h.files_changed,
        ["src/aider.rs"],
        "git's word: nothing else"
    );
    assert!(h.findings.is_empty(), "{:?}", h.findings);
    let paths = s.paths_on(&branch);
    assert_eq!(
        paths,
        ["README.md", "src/aider.rs", "src/lib.rs"],
        "no .gitignore, no .aider*"
    );
    no_flotilla_files(&paths);
}

#[actix::test]
async fn a_leftover_the_repository_already_holds_is_left_alone() {
    // A repository that tracks a file where aider keeps its cache: the call did not make
    // it, so flotilla does not remove it.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join(".aider.tags.cache.v4")).unwrap();
    std::fs::write(dir.path().join(".aider.tags.cache.v4/keep"), "mine").unwrap();
    let mut session = agent(preset(Preset::Aider, "fake-aider", &[])).open(
        Workspace::scratch(dir.path().into()),
        AttemptContext::detached(),
    );
    let report = tokio::time::timeout(PATIENCE, session.run(assignment("t1", "work")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(report.handoff.unwrap().summary, "wrote aider");
    assert_eq!(
        std::fs::read_to_string(dir.path().join(".aider.tags.cache.v4/keep")).unwrap(),
        "mine"
    );
    assert!(!dir.path().join("FLOTILLA_RESULT.json").exists());
    assert!(!dir.path().join("FLOTILLA_TASK.md").exists());
}
