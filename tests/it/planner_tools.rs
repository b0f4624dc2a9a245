//! The planners' read-only tools (ADR-037) against a real git repository: a scripted
//! planner that reads, lists, greps, logs and shows before it answers; what a hostile model
//! can ask of them; the round cap; a resumed call that replays its journaled rounds; the
//! request budget with tool results in it; and a run through the daemon.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use actix::prelude::*;
use flotilla::git::reader::GitRepo;
use flotilla::scripted::{Scenario, ScriptedLlm};
use flotilla_actors::actors::{Planner, PlannerConfig};
use flotilla_actors::ports::{
    ChatRole, CommitLog, CommitShown, GrepQuery, GrepReport, Llm, LlmCall, LlmError, LlmRequest,
    LlmResponse, ReadBounds, RepoError, RepoReader, RepoSnapshot, TreeItem, TreePath,
};
use flotilla_actors::protocol::*;
use futures::future::BoxFuture;

use crate::daemon_env::*;
use crate::harness::*;

/// A repository on `main` with two commits: the second adds a 3 MiB file, a binary file, a
/// symbolic link pointing out of the repository, a submodule and `sub` in `src/lib.rs`.
/// Returns the directory and main's tip.
fn repository() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init_opts(
        dir.path(),
        git2::RepositoryInitOptions::new().initial_head("main"),
    )
    .unwrap();
    let sig = git2::Signature::now("test", "test@example.com").unwrap();
    let blob = |bytes: &[u8]| repo.blob(bytes).unwrap();
    let tree = |entries: &[(&str, git2::Oid, i32)]| {
        let mut builder = repo.treebuilder(None).unwrap();
        for (name, id, mode) in entries {
            builder.insert(name, *id, *mode).unwrap();
        }
        builder.write().unwrap()
    };
    let spec = blob(b"# Calculator\nadd and subtract integers\n");
    let lib_one = blob(b"pub fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n");
    let src_one = tree(&[("lib.rs", lib_one, 0o100644)]);
    let root_one = tree(&[("SPEC.md", spec, 0o100644), ("src", src_one, 0o040000)]);
    let first = repo
        .commit(
            Some("refs/heads/main"),
            &sig,
            &sig,
            "first: the spec and add",
            &repo.find_tree(root_one).unwrap(),
            &[],
        )
        .unwrap();
    let lib_two = blob(
        b"pub fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n\npub fn sub(a: i32, b: i32) -> i32 {\n    a - b\n}\n",
    );
    let src_two = tree(&[("lib.rs", lib_two, 0o100644)]);
    let big: Vec<u8> = (0..300_000)
        .flat_map(|i| format!("line {i:06}\n").into_bytes())
        .collect();
    let root_two = tree(&[
        ("SPEC.md", spec, 0o100644),
        ("big.txt", blob(&big), 0o100644),
        ("blob.bin", blob(b"\x7fELF\0\0\0binary"), 0o100644),
        ("escape", blob(b"../../../etc/passwd"), 0o120000),
        ("src", src_two, 0o040000),
        ("vendor", first, 0o160000),
    ]);
    let parent = repo.find_commit(first).unwrap();
    let second = repo
        .commit(
            Some("refs/heads/main"),
            &sig,
            &sig,
            "second: sub, a big file and a link",
            &repo.find_tree(root_two).unwrap(),
            &[&parent],
        )
        .unwrap();
    (dir, second.to_string())
}

/// `GitRepo`, counting the tool reads it serves.
struct Counting {
    git: GitRepo,
    reads: AtomicUsize,
}

impl Counting {
    fn new(dir: &std::path::Path) -> Arc<Self> {
        Arc::new(Counting {
            git: GitRepo::new(dir, main_branch()),
            reads: AtomicUsize::new(0),
        })
    }

    fn read(&self) {
        self.reads.fetch_add(1, Ordering::SeqCst);
    }
}

impl RepoReader for Counting {
    fn main_tip(&self) -> BoxFuture<'static, Result<String, RepoError>> {
        self.git.main_tip()
    }
    fn snapshot(&self) -> BoxFuture<'static, Result<RepoSnapshot, RepoError>> {
        self.git.snapshot()
    }
    fn changed_paths(
        &self,
        branch: String,
        base: String,
    ) -> BoxFuture<'static, Result<Vec<String>, RepoError>> {
        self.git.changed_paths(branch, base)
    }
    fn read_path(
        &self,
        commit: String,
        path: TreePath,
        bounds: ReadBounds,
    ) -> BoxFuture<'static, Result<TreeItem, RepoError>> {
        self.read();
        self.git.read_path(commit, path, bounds)
    }
    fn grep(
        &self,
        commit: String,
        query: GrepQuery,
    ) -> BoxFuture<'static, Result<GrepReport, RepoError>> {
        self.read();
        self.git.grep(commit, query)
    }
    fn log(
        &self,
        commit: String,
        path: Option<TreePath>,
        max_count: usize,
    ) -> BoxFuture<'static, Result<CommitLog, RepoError>> {
        self.read();
        self.git.log(commit, path, max_count)
    }
    fn show_commit(
        &self,
        commit: String,
        name: String,
        max_patch_bytes: usize,
    ) -> BoxFuture<'static, Result<Option<CommitShown>, RepoError>> {
        self.read();
        self.git.show_commit(commit, name, max_patch_bytes)
    }
}

struct Started {
    llm: Arc<ScriptedLlm>,
    graph: Inbox<ToTaskGraph>,
    reader: Arc<Counting>,
    planner: Addr<Planner>,
}

fn start(
    dir: &std::path::Path,
    scenario: &str,
    config: PlannerConfig,
    resumed: &[ToolRound],
) -> Started {
    let llm = Arc::new(ScriptedLlm::new(Scenario::from_toml(scenario).unwrap()));
    start_on(dir, llm.clone(), llm, config, resumed)
}

fn start_on(
    dir: &std::path::Path,
    scripted: Arc<ScriptedLlm>,
    llm: Arc<dyn Llm>,
    config: PlannerConfig,
    resumed: &[ToolRound],
) -> Started {
    let (graph, inbox) = probe::<ToTaskGraph>("task graph");
    let reader = Counting::new(dir);
    let planner = Planner::new(
        RunId::generate(),
        "build a calculator".into(),
        "SYSTEM".into(),
        llm,
        graph,
        config,
    )
    .with_repo(reader.clone())
    .resuming(Vec::new())
    .resuming_tools(resumed)
    .start();
    planner.do_send(ToPlanner::Start);
    Started {
        llm: scripted,
        graph: inbox,
        reader,
        planner,
    }
}

/// The tool rounds the planner sent to be journaled, then its answer.
async fn rounds_then_answer(inbox: &mut Inbox<ToTaskGraph>) -> (Vec<ToolRound>, PlannerAnswer) {
    let mut rounds = Vec::new();
    loop {
        match inbox.expect().await {
            ToTaskGraph::ToolsRan(round) => rounds.push(*round),
            ToTaskGraph::PlannerAnswered(answer) => return (rounds, *answer),
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn result_of<'a>(round: &'a ToolRound, name: &str) -> &'a str {
    &round
        .runs
        .iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no {name} in {round:?}"))
        .result
}

const EXPLORES: &str = r#"
[[planner.answers]]
tasks = [{ description = "multiply", scope = ["src/lib.rs"] }]
tool_rounds = [
  [{ name = "read_file", arguments = { path = "SPEC.md" } }, { name = "list_dir", arguments = { path = "src" } }],
  [{ name = "grep", arguments = { pattern = 'fn \w+\(', path = "src" } }, { name = "git_log", arguments = {} }],
  [{ name = "git_show", arguments = { commit = "HEAD" } }, { name = "git_log", arguments = { path = "src/lib.rs", max_count = 1 } }],
]
"#;

#[actix::test]
async fn a_planner_reads_lists_greps_logs_and_shows_then_answers_with_every_result_in_order() {
    let (dir, tip) = repository();
    let mut s = start(dir.path(), EXPLORES, PlannerConfig::default(), &[]);
    let (rounds, answer) = rounds_then_answer(&mut s.graph).await;
    assert_eq!(answer.tasks.as_ref().unwrap()[0].description, "multiply");
    assert_eq!(rounds.len(), 3);
    for (i, round) in rounds.iter().enumerate() {
        assert_eq!((round.call, round.round as usize), (0, i));
        assert_eq!(round.commit, tip, "every round reads the pinned tip");
        assert_eq!(round.role, Role::Planner);
    }
    assert!(result_of(&rounds[0], "read_file").contains("add and subtract integers"));
    assert!(result_of(&rounds[0], "list_dir").contains("lib.rs (file, "));
    let grep = result_of(&rounds[1], "grep");
    assert!(
        grep.contains("src/lib.rs:1: pub fn add") && grep.contains("src/lib.rs:5: pub fn sub"),
        "{grep}"
    );
    let log = result_of(&rounds[1], "git_log");
    assert!(log.find("second: sub").unwrap() < log.find("first: the spec").unwrap());
    let show = &rounds[2].runs[0].result;
    assert!(show.contains(&format!("commit {tip}")), "{show}");
    assert!(show.contains("A big.txt (+300000 -0)") && show.contains("M src/lib.rs (+4 -0)"));
    // The 3 MiB patch is cut to the result's bound, and says so.
    assert!(show.contains("+line 000001") && show.contains("more bytes of patch not shown"));
    assert!(show.len() <= PlannerConfig::default().max_tool_result_bytes);
    let path_log = &rounds[2].runs[1].result;
    assert!(path_log.contains("(1 commits)") && path_log.contains("second: sub"));

    // Four requests: each offers the tools and carries every earlier result, in order.
    let requests = s.llm.requests();
    assert_eq!(requests.len(), 4);
    for (i, request) in requests.iter().enumerate() {
        assert_eq!(request.tools.len(), 5, "request {i} offers the tools");
        let results: Vec<&str> = request
            .messages
            .iter()
            .filter(|m| m.role == ChatRole::Tool)
            .map(|m| m.content.as_str())
            .collect();
        let expected: Vec<&str> = rounds[..i]
            .iter()
            .flat_map(|r| r.runs.iter().map(|run| run.result.as_str()))
            .collect();
        assert_eq!(results, expected, "request {i}");
    }
    // The rounds' model calls are charged with the answer.
    let charged: u64 = rounds.iter().map(|r| r.usage.tokens_in).sum();
    assert!(answer.usage.tokens_in > charged, "{:?}", answer.usage);
    assert_eq!(s.reader.reads.load(Ordering::SeqCst), 6);
}

const ESCAPES: &str = r#"
[[planner.answers]]
tasks = [{ description = "multiply", scope = ["src/lib.rs"] }]
tool_rounds = [
  [
    { name = "read_file", arguments = { path = "../outside.txt" } },
    { name = "read_file", arguments = { path = "/etc/passwd" } },
    { name = "read_file", arguments = { path = "escape" } },
    { name = "read_file", arguments = { path = "escape/passwd" } },
    { name = "read_file", arguments = { path = "big.txt" } },
    { name = "read_file", arguments = { path = "big.txt", offset = 9223372036854775807 } },
    { name = "read_file", arguments = { path = "big.txt", offset = -1 } },
    { name = "read_file", arguments = { path = "blob.bin" } },
  ],
  [
    { name = "list_dir", arguments = { path = "vendor" } },
    { name = "grep", arguments = { pattern = '(((a{100}){100}){100})' } },
    { name = "grep", arguments = { pattern = "(unclosed" } },
    { name = "rm_rf", arguments = { path = "." } },
    { name = "read_file", raw_arguments = "{not json" },
    { name = "read_file", arguments = { path = "SPEC.md", follow = true } },
    { name = "git_show", arguments = { commit = "HEAD~1" } },
    { name = "grep", arguments = { pattern = "no such text", path = "." } },
    { name = "list_dir", arguments = { path = "src" } },
  ],
]
"#;

/// What a hostile or confused model can ask of the tools: every answer is text the model
/// reads back, nothing outside the pinned tree is read, and every result is bounded.
#[actix::test]
async fn escapes_and_hostile_arguments_are_refused_with_reasons_and_results_stay_bounded() {
    let (dir, _) = repository();
    let config = PlannerConfig {
        max_tool_result_bytes: 4096,
        ..PlannerConfig::default()
    };
    let mut s = start(dir.path(), ESCAPES, config, &[]);
    let (rounds, answer) = rounds_then_answer(&mut s.graph).await;
    assert!(answer.tasks.is_ok(), "{:?}", answer.tasks);
    let results: Vec<&str> = rounds
        .iter()
        .flat_map(|r| r.runs.iter().map(|run| run.result.as_str()))
        .collect();
    assert_eq!(results.len(), 16);
    let expect = |i: usize, needle: &str| {
        assert!(results[i].contains(needle), "call {i}: {:?}", results[i]);
    };
    expect(0, "climbs out with `..`");
    expect(1, "is absolute");
    expect(
        2,
        "is a symbolic link to \"../../../etc/passwd\" (not followed",
    );
    expect(3, "escape/passwd does not exist");
    expect(4, "big.txt at ");
    expect(4, "read on with offset");
    expect(
        5,
        "offset 9223372036854775807 is past the end of big.txt (3600000 bytes)",
    );
    expect(6, "read_file: bad arguments: invalid value: integer `-1`");
    expect(7, "binary file of");
    expect(8, "vendor is a submodule at commit");
    expect(9, "not a usable regex");
    expect(10, "not a usable regex");
    expect(11, "\"rm_rf\" is not a tool");
    expect(12, "read_file: bad arguments");
    expect(13, "unknown field `follow`");
    expect(14, "not a commit name");
    expect(
        15,
        "0 matches in 0 files (2 files searched, 2 binary or large files skipped)",
    );
    // A ninth call in one round is not run, and the model is told.
    expect(
        15,
        "[flotilla: 1 more calls of this round were not run: at most 8 a round]",
    );
    for (i, result) in results.iter().enumerate() {
        assert!(result.len() <= 4096, "call {i} is {} bytes", result.len());
        assert!(
            !result.contains("root:x:0:0"),
            "call {i} read outside the repository"
        );
    }
}

const FOUR_ROUNDS: &str = r#"
[[planner.answers]]
tasks = [{ description = "multiply", scope = ["src/lib.rs"] }]
tool_rounds = [
  [{ name = "list_dir" }],
  [{ name = "list_dir", arguments = { path = "src" } }],
  [{ name = "read_file", arguments = { path = "SPEC.md" } }],
  [{ name = "read_file", arguments = { path = "src/lib.rs" } }],
]
"#;

/// At the cap the model is told so and asked for its answer without tools.
#[actix::test]
async fn the_round_cap_asks_for_the_answer_without_tools() {
    let (dir, _) = repository();
    let config = PlannerConfig {
        max_tool_rounds: 2,
        ..PlannerConfig::default()
    };
    let mut s = start(dir.path(), FOUR_ROUNDS, config, &[]);
    let (rounds, answer) = rounds_then_answer(&mut s.graph).await;
    assert_eq!(rounds.len(), 2);
    assert_eq!(answer.tasks.unwrap()[0].description, "multiply");
    let requests = s.llm.requests();
    assert_eq!(requests.len(), 3);
    let last = &requests[2];
    assert!(last.tools.is_empty(), "no tools past the cap");
    let note = &last.messages.last().unwrap().content;
    assert!(
        note.contains("no more tools in this call: this call has used its 2 tool rounds"),
        "{note}"
    );

    // With 0 rounds, no tool is ever offered.
    let config = PlannerConfig {
        max_tool_rounds: 0,
        ..PlannerConfig::default()
    };
    let mut s = start(dir.path(), FOUR_ROUNDS, config, &[]);
    let (rounds, _) = rounds_then_answer(&mut s.graph).await;
    assert!(rounds.is_empty());
    assert!(s.llm.requests().iter().all(|r| r.tools.is_empty()));
    assert_eq!(s.reader.reads.load(Ordering::SeqCst), 0);
}

/// A resumed call replays the rounds the journal holds: the model reads their results, the
/// repository is not read again, and nothing is journaled twice.
#[actix::test]
async fn a_resumed_call_replays_its_journaled_rounds_without_reading_again() {
    let (dir, tip) = repository();
    let journaled = vec![ToolRound {
        role: Role::Planner,
        task: None,
        attempt: 0,
        call: 0,
        round: 0,
        commit: tip,
        content: String::new(),
        runs: vec![ToolRun {
            id: "call_0_0_0".into(),
            name: "read_file".into(),
            arguments: "{\"path\":\"SPEC.md\"}".into(),
            result: "SPEC.md as it was read before the restart".into(),
        }],
        usage: Usage {
            tokens_in: 1_000_000,
            ..Usage::default()
        },
    }];
    let scenario = r#"
[[planner.answers]]
tasks = [{ description = "multiply", scope = ["src/lib.rs"] }]
tool_rounds = [[{ name = "read_file", arguments = { path = "SPEC.md" } }]]
"#;
    let mut s = start(dir.path(), scenario, PlannerConfig::default(), &journaled);
    let (rounds, answer) = rounds_then_answer(&mut s.graph).await;
    assert!(
        rounds.is_empty(),
        "the replayed round is not journaled again"
    );
    assert_eq!(answer.tasks.unwrap()[0].description, "multiply");
    assert!(
        answer.usage.tokens_in > 1_000_000,
        "the replayed round is charged"
    );
    assert_eq!(s.reader.reads.load(Ordering::SeqCst), 0);
    let requests = s.llm.requests();
    assert_eq!(requests.len(), 1, "round 0 is not asked again");
    let results: Vec<&str> = requests[0]
        .messages
        .iter()
        .filter(|m| m.role == ChatRole::Tool)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(results, ["SPEC.md as it was read before the restart"]);
    let asked = requests[0]
        .messages
        .iter()
        .find(|m| !m.tool_calls.is_empty())
        .unwrap();
    assert_eq!(asked.tool_calls[0].id, "call_0_0_0");
}

/// A provider that refuses as too long for its context any request over `max` bytes.
struct SmallContext {
    inner: Arc<ScriptedLlm>,
    max: usize,
    refused: Arc<AtomicUsize>,
}

impl Llm for SmallContext {
    fn complete(
        &self,
        request: LlmRequest,
        call: LlmCall,
    ) -> BoxFuture<'static, Result<LlmResponse, LlmError>> {
        let bytes: usize = request.messages.iter().map(|m| m.content.len()).sum();
        if bytes > self.max {
            self.refused.fetch_add(1, Ordering::SeqCst);
            let error = LlmError::ContextTooLong {
                status: 400,
                message: format!("{bytes} bytes exceed the context"),
            };
            return Box::pin(async move { Err(error) });
        }
        self.inner.complete(request, call)
    }
}

/// Eight rounds of 16 KiB reads: every request stays within the planner's budget (old
/// results summarized), and a context-length refusal shrinks the tool rounds first, so the
/// call is answered, not failed.
#[actix::test]
async fn tool_results_stay_within_the_request_budget_and_a_refusal_shrinks_them_first() {
    let (dir, _) = repository();
    let reads: Vec<String> = (0..8)
        .map(|i| {
            format!(
                "[{{ name = \"read_file\", arguments = {{ path = \"big.txt\", offset = {} }} }}]",
                i * 16_384
            )
        })
        .collect();
    let scenario = format!(
        "[[planner.answers]]\ntasks = [{{ description = \"m\", scope = [\"src/lib.rs\"] }}]\ntool_rounds = [{}]\n",
        reads.join(", ")
    );
    let scripted = Arc::new(ScriptedLlm::new(Scenario::from_toml(&scenario).unwrap()));
    let refused = Arc::new(AtomicUsize::new(0));
    let llm = Arc::new(SmallContext {
        inner: scripted.clone(),
        max: 40 * 1024,
        refused: refused.clone(),
    });
    let config = PlannerConfig {
        max_context_bytes: 64 * 1024,
        max_tool_bytes: 1024 * 1024,
        ..PlannerConfig::default()
    };
    let mut s = start_on(dir.path(), scripted, llm, config, &[]);
    let (rounds, answer) = rounds_then_answer(&mut s.graph).await;
    assert_eq!(rounds.len(), 8);
    assert!(answer.tasks.is_ok(), "{:?}", answer.tasks);
    assert!(refused.load(Ordering::SeqCst) > 0, "the budget was tested");
    for request in s.llm.requests() {
        let bytes: usize = request.messages.iter().map(|m| m.content.len()).sum();
        assert!(bytes <= 64 * 1024, "a request of {bytes} bytes");
    }
    // Old results are summarized before anything is dropped; the newest stays whole.
    let last = s.llm.requests().pop().unwrap();
    let results: Vec<&str> = last
        .messages
        .iter()
        .filter(|m| m.role == ChatRole::Tool)
        .map(|m| m.content.as_str())
        .collect();
    assert!(results.iter().any(|r| r.starts_with("[compacted: ")));
    let newest = results.last().unwrap();
    assert!(newest.starts_with("big.txt at ") && newest.contains("bytes 114688..130560"));
}

/// Through the daemon: the planner reads the repository's SPEC.md at main's tip, and the
/// Subplanner the wide task's directory; both rounds are journaled before their call's
/// answer, and the run completes.
#[tokio::test]
async fn through_the_daemon_tool_rounds_of_both_planners_are_journaled_with_what_they_read() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let git = git2::Repository::open(repo.path()).unwrap();
    commit_files(
        &git,
        &[
            ("SPEC.md", "the spec says: add numbers\n"),
            ("src/a.rs", "// a\n"),
        ],
        "spec",
    );
    let scenario = r#"
[[planner.answers]]
tasks = [{ description = "wide", scope = ["src/a.rs", "src/b.rs", "src/c.rs", "src/d.rs"] }]
tool_rounds = [[{ name = "read_file", arguments = { path = "SPEC.md" } }, { name = "grep", arguments = { pattern = "add" } }]]
[[subplanner.t1.answers]]
tasks = []
tool_rounds = [[{ name = "list_dir", arguments = { path = "src" } }]]
"#;
    let run = submit(&daemon.client, repo.path(), run_config(scenario, 1)).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    let at = |pick: &dyn Fn(&EventKind) -> bool| events.iter().position(|e| pick(&e.kind));
    let rounds: Vec<(usize, &ToolRound)> = events
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match &e.kind {
            EventKind::ToolsRan { tools } => Some((i, tools)),
            _ => None,
        })
        .collect();
    assert_eq!(rounds.len(), 2, "one round each");
    let (planner_at, planner) = rounds[0];
    assert_eq!((planner.role, planner.task.clone()), (Role::Planner, None));
    assert!(
        planner.runs[0]
            .result
            .contains("the spec says: add numbers")
    );
    assert!(planner.runs[1].result.contains("SPEC.md:1: the spec says"));
    let answered = at(&|k| matches!(k, EventKind::PlannerResponded { .. })).unwrap();
    assert!(
        planner_at < answered,
        "the round is journaled before the answer"
    );
    let (sub_at, sub) = rounds[1];
    assert_eq!(sub.role, Role::Subplanner);
    assert_eq!(sub.task, Some(TaskId::root(1)));
    assert!(
        sub.runs[0].result.contains("a.rs (file, 5 bytes)"),
        "{}",
        sub.runs[0].result
    );
    let sub_answered = at(&|k| matches!(k, EventKind::SubplannerResponded { .. })).unwrap();
    assert!(sub_at < sub_answered);
}

/// A provider that refuses any request offering tools (as a server that cannot combine them
/// with a JSON schema might).
struct NoTools {
    inner: Arc<ScriptedLlm>,
    refused: Arc<AtomicUsize>,
}

impl Llm for NoTools {
    fn complete(
        &self,
        request: LlmRequest,
        call: LlmCall,
    ) -> BoxFuture<'static, Result<LlmResponse, LlmError>> {
        if !request.tools.is_empty() {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Box::pin(async {
                Err(LlmError::Refused {
                    status: 400,
                    message: "tools cannot be used with a grammar".into(),
                })
            });
        }
        self.inner.complete(request, call)
    }
}

/// Tools refused once: the call is asked again without them, and the conversation does not
/// offer them again; planning goes on.
#[actix::test]
async fn a_provider_that_refuses_tools_is_asked_without_them_from_then_on() {
    let (dir, _) = repository();
    let scenario = r#"
[[planner.answers]]
tasks = [{ description = "multiply", scope = ["src/lib.rs"] }]
tool_rounds = [[{ name = "list_dir" }]]
[[planner.answers]]
tasks = [{ description = "divide", scope = ["src/div.rs"] }]
tool_rounds = [[{ name = "list_dir" }]]
"#;
    let scripted = Arc::new(ScriptedLlm::new(Scenario::from_toml(scenario).unwrap()));
    let refused = Arc::new(AtomicUsize::new(0));
    let llm = Arc::new(NoTools {
        inner: scripted.clone(),
        refused: refused.clone(),
    });
    let mut s = start_on(dir.path(), scripted, llm, PlannerConfig::default(), &[]);
    let (rounds, answer) = rounds_then_answer(&mut s.graph).await;
    assert!(rounds.is_empty());
    assert_eq!(answer.tasks.unwrap()[0].description, "multiply");
    s.planner.do_send(ToPlanner::BatchAccepted { ready: 0 });
    s.planner.do_send(ToPlanner::Quiescent);
    let (rounds, answer) = rounds_then_answer(&mut s.graph).await;
    assert!(rounds.is_empty());
    assert_eq!(answer.tasks.unwrap()[0].description, "divide");
    assert_eq!(refused.load(Ordering::SeqCst), 1, "tools were offered once");
    assert_eq!(s.reader.reads.load(Ordering::SeqCst), 0);
}

/// A greedy model: nine huge reads and 20 KB of junk arguments in one round. What is kept
/// and shown stays within the call's bound, the junk is not kept, and the call then has to
/// answer without tools.
#[actix::test]
async fn a_greedy_round_is_held_to_the_calls_byte_bound() {
    let (dir, _) = repository();
    let junk = "x".repeat(20_000);
    let read =
        r#"{ name = "read_file", arguments = { path = "big.txt", max_bytes = 1000000000000 } }"#;
    let scenario = format!(
        "[[planner.answers]]\ntasks = [{{ description = \"m\", scope = [\"src/lib.rs\"] }}]\ntool_rounds = [[{{ name = \"grep\", raw_arguments = \"{junk}\" }}, {}]]\n",
        [read; 9].join(", ")
    );
    let config = PlannerConfig {
        max_tool_bytes: 40 * 1024,
        ..PlannerConfig::default()
    };
    let mut s = start(dir.path(), &scenario, config, &[]);
    let (rounds, answer) = rounds_then_answer(&mut s.graph).await;
    assert!(answer.tasks.is_ok());
    assert_eq!(rounds.len(), 1);
    let runs = &rounds[0].runs;
    assert_eq!(runs.len(), 8, "two calls past the cap are dropped");
    assert_eq!(
        runs[0].arguments,
        "{\"compacted\":\"20000 bytes of arguments\"}"
    );
    assert!(runs[0].result.contains("at most 8192 are read"));
    let total: usize = runs.iter().map(|r| r.result.len()).sum();
    // The bound, plus a line for each call it left unrun and the note on the dropped ones.
    assert!(
        total <= 40 * 1024 + 8 * 60 + 100,
        "{total} bytes of results"
    );
    assert!(
        runs[7]
            .result
            .starts_with("not run: this call's tool results reached")
    );
    assert!(
        runs[7]
            .result
            .ends_with("2 more calls of this round were not run: at most 8 a round]")
    );
    let last = s.llm.requests().pop().unwrap();
    assert!(last.tools.is_empty());
    assert!(
        last.messages
            .last()
            .unwrap()
            .content
            .contains("reached their bound of 40960 bytes")
    );
}

/// The Subplanner's resumed decomposition replays its unanswered call's journaled round (its
/// task and attempt's only), without reading the repository again.
#[actix::test]
async fn a_resumed_subplanner_conversation_replays_its_own_rounds_only() {
    use flotilla_actors::actors::{RecordedExchange, Subplanner, SubplannerConfig};
    use flotilla_actors::config::Limits;
    let (dir, tip) = repository();
    let t1 = TaskId::root(1);
    let round = |task: &TaskId, attempt: u32, call: u32, result: &str| ToolRound {
        role: Role::Subplanner,
        task: Some(task.clone()),
        attempt,
        call,
        round: 0,
        commit: tip.clone(),
        content: String::new(),
        runs: vec![ToolRun {
            id: format!("call_{call}_0_0"),
            name: "list_dir".into(),
            arguments: "{}".into(),
            result: result.into(),
        }],
        usage: Usage::default(),
    };
    let journaled = vec![
        round(&t1, 1, 1, "t1's listing, read before the restart"),
        round(&t1, 0, 1, "an older attempt's listing"),
        round(&TaskId::root(2), 1, 1, "another task's listing"),
    ];
    let scenario = r#"
[[subplanner.t1.answers]]
tasks = [{ description = "half", scope = ["src/lib.rs"], acceptance = "builds" }]
[[subplanner.t1.answers]]
tasks = []
tool_rounds = [[{ name = "list_dir" }]]
"#;
    let llm = Arc::new(ScriptedLlm::new(Scenario::from_toml(scenario).unwrap()));
    let (graph, mut inbox) = probe::<ToTaskGraph>("task graph");
    let reader = Counting::new(dir.path());
    let recorded = vec![RecordedExchange {
        task: t1.clone(),
        attempt: 1,
        exchange: flotilla_actors::actors::Exchange::new(
            "the parent".into(),
            "{\"tasks\": [{\"description\": \"half\", \"scope\": [\"src/lib.rs\"], \"acceptance\": \"builds\"}]}".into(),
            None,
        ),
    }];
    let subplanner = Subplanner::new(
        RunId::generate(),
        "SUB".into(),
        llm.clone(),
        graph,
        Limits::default(),
        SubplannerConfig::default(),
    )
    .with_repo(reader.clone())
    .resuming(recorded)
    .resuming_tools(&journaled)
    .start();
    subplanner.do_send(ToAgent::Resume(OpenDecomposition {
        parent: t1.clone(),
        attempt: 1,
        spec: Arc::new(TaskSpec::new("wide", &["src/lib.rs", "src/b.rs"])),
        active: Vec::new(),
        unheard: Vec::new(),
    }));
    let answer = inbox
        .fish_for("SubplannerAnswered", |m| match m {
            ToTaskGraph::SubplannerAnswered(a) => Some((**a).clone()),
            ToTaskGraph::ToolsRan(r) => panic!("a round was run again: {r:?}"),
            _ => None,
        })
        .await;
    assert_eq!((answer.call, answer.attempt), (1, 1));
    assert_eq!(reader.reads.load(Ordering::SeqCst), 0);
    let requests = llm.requests();
    assert_eq!(requests.len(), 1);
    let results: Vec<&str> = requests[0]
        .messages
        .iter()
        .filter(|m| m.role == ChatRole::Tool)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(results, ["t1's listing, read before the restart"]);
}

/// SIGKILL after a planner's tool round was journaled and before its answer: the restarted
/// daemon's planner replays the round (the journal holds it once) and the run completes.
#[tokio::test]
async fn a_daemon_killed_between_a_tool_round_and_the_answer_replays_the_round() {
    use futures::StreamExt;
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let daemon = DaemonProcess::start(state.path());
    let client = DaemonProcess::client(state.path());
    // Every request of the call takes 3 s: the kill lands while the answer is being made.
    let scenario = r#"
[[planner.answers]]
tasks = [{ description = "add", scope = ["add.rs"] }]
delay_ms = 3000
tool_rounds = [[{ name = "read_file", arguments = { path = "README.md" } }]]
"#;
    let run = submit(&client, repo.path(), run_config(scenario, 1)).await;
    let mut stream = client.events(&run, None).await.unwrap();
    let mut seen = Vec::new();
    while let Some(Ok(e)) = stream.next().await {
        let ran = matches!(e.kind, EventKind::ToolsRan { .. });
        seen.push(e.kind);
        if ran {
            break;
        }
    }
    drop(stream);
    daemon.kill();
    assert!(seen.iter().any(|k| matches!(k, EventKind::ToolsRan { .. })));
    let conn = rusqlite::Connection::open(state.path().join("journal.sqlite")).unwrap();
    let answered: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM events WHERE run = ?1 AND kind = 'planner_responded'",
            [&run],
            |r| r.get(0),
        )
        .unwrap();
    drop(conn);
    assert_eq!(
        answered, 0,
        "the kill must fall between the round and the answer"
    );
    let _daemon = DaemonProcess::start(state.path());
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    let rounds: Vec<&ToolRound> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolsRan { tools } => Some(tools),
            _ => None,
        })
        .collect();
    assert_eq!(rounds.len(), 1, "the round is replayed, not run again");
    assert!(rounds[0].runs[0].result.contains("a test repository"));
    let answers = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::PlannerResponded { call: 0, .. }))
        .count();
    assert_eq!(answers, 1);
}
