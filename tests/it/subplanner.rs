//! The Subplanner actor with the real TaskGraph and Dispatch, on the scripted provider; a
//! probe plays the workers. Each test scripts the model's answers per call and checks what
//! the run journals, what the workers are given, and what the model was asked.

use std::sync::Arc;

use actix::prelude::*;
use flotilla::scripted::{Scenario, ScriptedLlm};
use flotilla_actors::actors::{
    Dispatch, RecordedExchange, Recovery, Subplanner, SubplannerConfig, TaskGraph, WorkerProfile,
};
use flotilla_actors::config::Limits;
use flotilla_actors::graph::RunGraph;
use flotilla_actors::ports::{ChatRole, LlmRequest, MemoryJournal, SystemClock};
use flotilla_actors::protocol::*;

use crate::harness::*;

struct SubplannerRun {
    graph: Addr<TaskGraph>,
    journal: Arc<MemoryJournal>,
    events: Inbox<Published>,
    worker: Inbox<ToAgent>,
    llm: Arc<ScriptedLlm>,
}

fn fast() -> SubplannerConfig {
    SubplannerConfig {
        backoff_base_ms: 10,
        backoff_max_ms: 100,
        ..SubplannerConfig::default()
    }
}

impl SubplannerRun {
    fn start(limits: Limits, config: SubplannerConfig, scenario: &str) -> Self {
        Self::wire(limits, config, scenario, None)
    }

    /// A second life of a run, wired as the supervisor wires it: the graph replayed from
    /// `journal`, the Subplanner's conversations read back from it, and the TaskGraph
    /// resuming.
    fn resume(
        limits: Limits,
        config: SubplannerConfig,
        scenario: &str,
        journal: &[EventKind],
    ) -> Self {
        Self::wire(limits, config, scenario, Some(journal))
    }

    fn wire(
        limits: Limits,
        config: SubplannerConfig,
        scenario: &str,
        resumed_from: Option<&[EventKind]>,
    ) -> Self {
        let run = RunId::generate();
        let journal = Arc::new(MemoryJournal::new(Arc::new(SystemClock)));
        let (events_addr, events) = probe::<Published>("events");
        let (worker_addr, worker) = probe::<ToAgent>("worker");
        let llm = Arc::new(ScriptedLlm::new(Scenario::from_toml(scenario).unwrap()));
        let graph_ctx = Context::<TaskGraph>::new();
        let graph_addr = graph_ctx.address();
        let recorded = resumed_from
            .map(RecordedExchange::from_journal)
            .unwrap_or_default();
        let subplanner = Subplanner::new(
            run,
            "You are a subplanner.".into(),
            llm.clone(),
            graph_addr.clone().recipient(),
            limits.clone(),
            config,
        )
        .resuming(recorded)
        .start();
        let dispatch = Dispatch::new(
            run,
            limits.clone(),
            vec![WorkerProfile::new("default", &[], 1)],
            graph_addr.clone().recipient(),
            worker_addr,
            subplanner.clone().recipient(),
        )
        .start();
        let graph_state = match resumed_from {
            Some(kinds) => RunGraph::replay(limits, kinds).unwrap(),
            None => RunGraph::new(limits),
        };
        let mut task_graph = TaskGraph::new(
            run,
            graph_state,
            journal.clone(),
            dispatch.recipient(),
            Some(events_addr),
        )
        .with_subplanner(subplanner.recipient());
        if resumed_from.is_some() {
            task_graph = task_graph.resuming(Recovery::default());
        }
        let graph = graph_ctx.run(task_graph);
        SubplannerRun {
            graph,
            journal,
            events,
            worker,
            llm,
        }
    }

    fn submit(&self, tasks: Vec<TaskSpec>) {
        self.graph.do_send(ToTaskGraph::SubmitTasks { tasks });
        self.graph.do_send(ToTaskGraph::PlanningFinished);
    }

    async fn expect_assign(&mut self) -> Assignment {
        self.worker
            .fish_for("Assign", |m| match m {
                ToAgent::Assign(a) => Some(a.clone()),
                _ => None,
            })
            .await
    }

    /// Plays the worker: starts the assignment and reports `handoff`.
    fn finish_with(&self, a: &Assignment, handoff: Handoff) {
        self.graph.do_send(ToTaskGraph::TaskStarted {
            task: a.task.task.clone(),
            attempt: a.task.attempt,
        });
        self.graph
            .do_send(ToTaskGraph::TaskCompleted(Box::new(TaskCompleted {
                task: a.task.task.clone(),
                attempt: a.task.attempt,
                handoff: Some(handoff),
                artifacts: Vec::new(),
                subplan: None,
            })));
    }

    fn finish(&self, a: &Assignment) {
        self.finish_with(a, Handoff::complete(format!("{} done", a.task.task)));
    }

    fn journaled(&self) -> Vec<EventKind> {
        self.journal.all().into_iter().map(|e| e.kind).collect()
    }

    /// The Subplanner's requests, in order.
    fn asked(&self) -> Vec<LlmRequest> {
        self.llm
            .requests()
            .into_iter()
            .filter(|r| r.role == Role::Subplanner)
            .collect()
    }

    async fn finished(&mut self) -> EventKind {
        self.events.expect_kind("run_finished").await
    }
}

/// The text of a request's last message (the prompt of that call).
fn prompt_of(request: &LlmRequest) -> &str {
    &request.messages.last().expect("a prompt").content
}

fn wide(description: &str, files: &[&str]) -> TaskSpec {
    let mut spec = spec(description, files);
    spec.acceptance = "every file compiles".into();
    spec
}

const LANG: [&str; 4] = [
    "src/lang/lex.rs",
    "src/lang/parse.rs",
    "src/lang/check.rs",
    "src/lang/mod.rs",
];

fn position(kinds: &[EventKind], what: &str, pick: impl Fn(&EventKind) -> bool) -> usize {
    kinds
        .iter()
        .position(pick)
        .unwrap_or_else(|| panic!("no {what} in the journal: {kinds:#?}"))
}

#[actix::test]
async fn a_task_the_subplanner_finds_atomic_goes_to_a_worker_uncharged_and_is_never_planned_again()
{
    virtual_time();
    // Nothing scripted for t1: the model answers an empty task list.
    let mut h = SubplannerRun::start(Limits::default(), fast(), "");
    h.submit(vec![wide("the language front end", &LANG)]);

    // The worker gets it as attempt 2: attempt 1 was the Subplanner's.
    let first = h.expect_assign().await;
    assert_eq!(first.task.task, task("t1"));
    assert_eq!(first.route, Route::Worker);
    assert_eq!(first.task.attempt, 2);
    assert!(first.task.atomic);

    // The Subplanner was asked once, with the parent task and its whole scope.
    let asked = h.asked();
    assert_eq!(asked.len(), 1);
    let prompt = prompt_of(&asked[0]);
    assert!(prompt.contains("## Parent task\n- ID: t1\n"), "{prompt}");
    assert!(prompt.contains(&LANG.join(", ")), "{prompt}");
    assert!(
        prompt.contains("- Acceptance: every file compiles"),
        "{prompt}"
    );

    // The handover is not a retry: with the default two attempts, the worker's crash is
    // retried (attempt 3), and still by a worker.
    h.graph.do_send(ToTaskGraph::TaskStarted {
        task: task("t1"),
        attempt: 2,
    });
    h.graph.do_send(ToTaskGraph::TaskFailed {
        task: task("t1"),
        attempt: 2,
        failure: AttemptFailure::Crashed {
            detail: "exit 101".into(),
        },
    });
    let retry = h.expect_assign().await;
    assert_eq!((retry.task.attempt, retry.route), (3, Route::Worker));
    h.finish(&retry);
    assert_eq!(
        h.finished().await,
        EventKind::RunFinished {
            outcome: RunOutcome::Completed,
            reason: None
        }
    );
    assert_eq!(h.asked().len(), 1, "an atomic task is never planned again");

    // In the journal: dispatched to the subplanner, its answer, then the handover.
    let kinds = h.journaled();
    let dispatched = position(&kinds, "the subplanner dispatch", |k| {
        matches!(
            k,
            EventKind::TaskDispatched {
                route: Route::Subplanner,
                attempt: 1,
                ..
            }
        )
    });
    let answered = position(&kinds, "the recorded answer", |k| {
        matches!(
            k,
            EventKind::SubplannerResponded {
                call: 0,
                error: None,
                ..
            }
        )
    });
    let atomic = position(&kinds, "task_atomic", |k| {
        matches!(k, EventKind::TaskAtomic { attempt: 1, .. })
    });
    let to_worker = position(&kinds, "the worker dispatch", |k| {
        matches!(
            k,
            EventKind::TaskDispatched {
                route: Route::Worker,
                attempt: 2,
                ..
            }
        )
    });
    assert!(dispatched < answered && answered < atomic && atomic < to_worker);
}

const ITERATIVE: &str = r#"
[[subplanner.t1.answers]]
tasks = [
  { description = "Lexer for the language", scope = ["src/lang/lex.rs"], acceptance = "lexes the samples" },
  { description = "Parser for the language", scope = ["src/lang/parse.rs"], acceptance = "parses the samples" },
]
[[subplanner.t1.answers]]
tasks = [
  { description = "Type checker, using the lexer's Token type", scope = ["src/lang/check.rs", "src/lang/mod.rs"], acceptance = "checks the samples" },
]
[[subplanner.t1.answers]]
tasks = []
[[subplanner.t1.answers]]
tasks = []
"#;

#[actix::test]
async fn the_subplanner_replans_after_every_handoff_and_the_parent_is_the_aggregate_of_its_subtasks()
 {
    virtual_time();
    let mut h = SubplannerRun::start(Limits::default(), fast(), ITERATIVE);
    h.submit(vec![wide("the language front end", &LANG)]);

    // First batch: two independent subtasks, both handed out at once.
    let a = h.expect_assign().await;
    let b = h.expect_assign().await;
    assert_eq!(
        (a.task.task.clone(), b.task.task.clone()),
        (task("t1.1"), task("t1.2"))
    );
    let mut lexed = Handoff::complete("lexer with a Token enum");
    lexed.files_changed = vec!["src/lang/lex.rs".into(), "src/lang/mod.rs".into()];
    lexed.concerns = vec!["no unicode identifiers yet".into()];
    lexed.metrics.tokens_in = 700;
    lexed.metrics.duration_ms = 4_000;
    h.finish_with(&a, lexed);

    // The lexer's handoff starts the second call, which adds the checker.
    let c = h.expect_assign().await;
    assert_eq!(c.task.task, task("t1.3"));
    assert_eq!(c.task.spec.scope, ["src/lang/check.rs", "src/lang/mod.rs"]);
    let asked = h.asked();
    assert_eq!(asked.len(), 2);
    let follow_up = prompt_of(&asked[1]);
    assert!(
        follow_up.contains("### t1.1 (completed, complete)"),
        "{follow_up}"
    );
    assert!(
        follow_up.contains("summary: lexer with a Token enum"),
        "{follow_up}"
    );
    assert!(
        follow_up.contains("concerns: no unicode identifiers yet"),
        "{follow_up}"
    );
    assert!(
        follow_up.contains("- t1.2: Parser for the language"),
        "{follow_up}"
    );
    // A delta: the parent task is in the first message, not repeated.
    assert!(!follow_up.contains("## Parent task"), "{follow_up}");
    // The conversation carries the first exchange.
    let turns: Vec<ChatRole> = asked[1].messages.iter().map(|m| m.role).collect();
    assert_eq!(
        turns,
        [
            ChatRole::System,
            ChatRole::User,
            ChatRole::Assistant,
            ChatRole::User
        ]
    );

    // The parser's handoff: the third call plans nothing, but the checker still runs, so the
    // decomposition stays open.
    let mut parsed = Handoff::complete("parser");
    parsed.files_changed = vec!["src/lang/parse.rs".into(), "src/lang/mod.rs".into()];
    parsed.suggestions = vec!["add error recovery".into()];
    parsed.metrics.tokens_in = 300;
    parsed.metrics.duration_ms = 9_000;
    h.finish_with(&b, parsed);
    h.events
        .fish_for("the third call", |Published(e)| {
            matches!(e.kind, EventKind::SubplannerResponded { call: 2, .. }).then_some(())
        })
        .await;
    assert!(
        !h.journaled()
            .iter()
            .any(|k| matches!(k, EventKind::DecompositionClosed { .. })),
        "closed while a subtask was running"
    );
    h.finish(&c);

    assert_eq!(
        h.finished().await,
        EventKind::RunFinished {
            outcome: RunOutcome::Completed,
            reason: None
        }
    );
    assert_eq!(h.asked().len(), 4, "one call per handoff, and the first");

    let kinds = h.journaled();
    // Which handoffs each call's prompt carried.
    let reported: Vec<(u32, Vec<TaskId>)> = kinds
        .iter()
        .filter_map(|k| match k {
            EventKind::SubplannerResponded { call, reported, .. } => {
                Some((*call, reported.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        reported,
        [
            (0, vec![]),
            (1, vec![task("t1.1")]),
            (2, vec![task("t1.2")]),
            (3, vec![task("t1.3")])
        ]
    );
    let accepted = position(
        &kinds,
        "the first batch",
        |k| matches!(k, EventKind::DecompositionAccepted { subplanner: true, subtasks, .. } if subtasks.len() == 2),
    );
    let added = position(
        &kinds,
        "the second batch",
        |k| matches!(k, EventKind::SubtasksAdded { subtasks, .. } if *subtasks == [task("t1.3")]),
    );
    let closed = position(&kinds, "the close", |k| {
        matches!(k, EventKind::DecompositionClosed { .. })
    });
    let aggregated = position(
        &kinds,
        "the parent's completion",
        |k| matches!(k, EventKind::TaskCompleted { task: t, .. } if *t == task("t1")),
    );
    assert!(accepted < added && added < closed && closed < aggregated);

    // The aggregate, by the seed's rule.
    let EventKind::TaskCompleted {
        handoff: Some(handoff),
        ..
    } = &kinds[aggregated]
    else {
        panic!("no handoff: {:?}", kinds[aggregated]);
    };
    assert_eq!(handoff.status, HandoffStatus::Complete);
    assert!(
        handoff
            .summary
            .starts_with("Decomposed \"the language front end\" into 3 subtasks: 3 complete"),
        "{}",
        handoff.summary
    );
    assert_eq!(
        handoff.files_changed,
        ["src/lang/lex.rs", "src/lang/mod.rs", "src/lang/parse.rs"]
    );
    assert_eq!(handoff.concerns, ["[t1.1] no unicode identifiers yet"]);
    assert_eq!(handoff.suggestions, ["[t1.2] add error recovery"]);
    assert_eq!(handoff.metrics.tokens_in, 1_000);
    assert_eq!(handoff.metrics.duration_ms, 9_000);

    // Metered once: the parent is charged its Subplanner calls only (the aggregate's token
    // metrics are its subtasks', already charged to them), and the run's total is the sum
    // of every recorded usage.
    let subplanner_tokens: u64 = kinds
        .iter()
        .filter_map(|k| match k {
            EventKind::SubplannerResponded { usage, .. } => {
                Some(usage.tokens_in + usage.tokens_out)
            }
            _ => None,
        })
        .sum();
    let charged: u64 = kinds
        .iter()
        .filter_map(|k| match k {
            EventKind::SpendCharged { spent, .. } => Some(spent.tokens),
            _ => None,
        })
        .sum();
    assert!(subplanner_tokens > 0);
    assert_eq!(charged, 1_000, "the subtasks' handoffs, charged once each");
    let snap = h.graph.send(GetSnapshot).await.unwrap();
    let parent = snap.tasks.iter().find(|t| t.id == task("t1")).unwrap();
    assert_eq!(parent.spent.tokens, subplanner_tokens);
    assert_eq!(snap.run_spent.tokens, subplanner_tokens + charged);

    // The graph is a fold of the journal.
    let replayed = RunGraph::replay(Limits::default(), &kinds).unwrap();
    assert_eq!(replayed.snapshot(), snap);
}

const FILTERED_THEN_REFUSED: &str = r#"
[[subplanner.t1.answers]]
tasks = [
  { description = "The lexer", scope = ["src/lang/lex.rs", "Cargo.toml"], acceptance = "done when it builds" },
  { description = "Something elsewhere", scope = ["/etc/passwd", "../outside.rs"], acceptance = "done when it builds" },
  { description = "The lexer's tests", scope = ["src/lang/lex.rs"], acceptance = "done when it builds" },
]
[[subplanner.t1.answers]]
tasks = [
  { description = "The lexer", scope = ["src/lang/lex.rs"], acceptance = "done when it builds" },
  { description = "The parser", scope = ["src/lang/parse.rs"], acceptance = "done when it builds" },
]
"#;

#[actix::test]
async fn paths_outside_the_parent_are_filtered_and_said_and_a_refused_batch_reaches_the_subplanner_with_the_graph_unchanged()
 {
    virtual_time();
    let mut h = SubplannerRun::start(Limits::default(), fast(), FILTERED_THEN_REFUSED);
    h.submit(vec![wide("the language front end", &LANG)]);

    // After filtering, the lexer and its tests both hold src/lang/lex.rs: refused whole.
    let refused = h.events.expect_kind("decomposition_rejected").await;
    assert_eq!(
        refused,
        EventKind::DecompositionRejected {
            parent: task("t1"),
            attempt: 1,
            reason: RejectionReason::ScopeOverlap {
                first: 0,
                second: 1,
                path: "src/lang/lex.rs".into()
            }
        }
    );
    let snap = h.graph.send(GetSnapshot).await.unwrap();
    assert_eq!(
        snap.tasks.len(),
        1,
        "nothing of a refused batch is inserted"
    );
    assert_eq!(snap.tasks[0].state, TaskState::Running);

    // The retry (after a backoff) says what was filtered, what was dropped and why the
    // batch was refused; its batch is accepted.
    let a = h.expect_assign().await;
    let b = h.expect_assign().await;
    assert_eq!(
        (a.task.task.clone(), b.task.task.clone()),
        (task("t1.1"), task("t1.2"))
    );
    let asked = h.asked();
    let retry = prompt_of(&asked[1]);
    assert!(
        retry.contains("Task 0: removed paths outside the parent's scope: \"Cargo.toml\"."),
        "{retry}"
    );
    assert!(
        retry.contains("Task 1 was dropped: none of its paths is inside the parent's scope."),
        "{retry}"
    );
    assert!(
        retry.contains("Your batch was refused: proposed tasks 0 and 1 both touch"),
        "{retry}"
    );

    // The rest of the run: unscripted calls answer empty, which closes the decomposition
    // once nothing runs.
    h.finish(&a);
    h.finish(&b);
    assert_eq!(
        h.finished().await,
        EventKind::RunFinished {
            outcome: RunOutcome::Completed,
            reason: None
        }
    );
}

const WITHOUT_ACCEPTANCE_THEN_WITH: &str = r#"
[[subplanner.t1.answers]]
tasks = [
  { description = "The lexer", scope = ["src/lang/lex.rs"], acceptance = "lexes the samples" },
  { description = "The parser", scope = ["src/lang/parse.rs"], acceptance = "  " },
]
[[subplanner.t1.answers]]
tasks = [
  { description = "The lexer", scope = ["src/lang/lex.rs"], acceptance = "lexes the samples" },
  { description = "The parser", scope = ["src/lang/parse.rs"], acceptance = "parses the samples" },
]
"#;

/// ADR-032: prompts/subplanner.md says every subtask needs acceptance criteria and that
/// flotilla refuses a batch without them; it does, with a typed reason that reaches the
/// Subplanner's next call, and nothing of the batch enters the graph.
#[actix::test]
async fn a_subplanner_batch_without_acceptance_is_refused_with_the_reason_and_the_graph_unchanged()
{
    virtual_time();
    let mut h = SubplannerRun::start(Limits::default(), fast(), WITHOUT_ACCEPTANCE_THEN_WITH);
    h.submit(vec![wide("the language front end", &LANG)]);
    let refused = h.events.expect_kind("decomposition_rejected").await;
    assert_eq!(
        refused,
        EventKind::DecompositionRejected {
            parent: task("t1"),
            attempt: 1,
            reason: RejectionReason::EmptyAcceptance { subtask: 1 }
        }
    );
    let snap = h.graph.send(GetSnapshot).await.unwrap();
    assert_eq!(
        snap.tasks.len(),
        1,
        "nothing of a refused batch is inserted"
    );
    assert_eq!(snap.tasks[0].state, TaskState::Running);
    let a = h.expect_assign().await;
    let b = h.expect_assign().await;
    assert_eq!(
        (a.task.task.clone(), b.task.task.clone()),
        (task("t1.1"), task("t1.2"))
    );
    assert_eq!(a.task.spec.acceptance, "lexes the samples");
    let asked = h.asked();
    let retry = prompt_of(&asked[1]);
    assert!(
        retry.contains("Your batch was refused: proposed task 1 has no acceptance criteria"),
        "{retry}"
    );
    let prompt =
        flotilla::prompts::for_role(Role::Subplanner, &Default::default(), &Limits::default());
    assert!(
        prompt.contains("flotilla refuses a batch in which a subtask has none"),
        "the prompt says what the code does"
    );
}

const RECURSIVE: &str = r#"
[[subplanner.t1.answers]]
tasks = [
  { description = "Everything below the language directory", scope = ["src/lang/lex.rs", "src/lang/parse.rs", "src/lang/check.rs", "src/lang/mod.rs"], acceptance = "done when it builds" },
]
[[subplanner."t1.1".answers]]
tasks = [
  { description = "All four files at once", scope = ["src/lang/lex.rs", "src/lang/parse.rs", "src/lang/check.rs", "src/lang/mod.rs"], acceptance = "done when it builds" },
]
"#;

#[actix::test]
async fn a_wide_subtask_is_decomposed_again_until_the_maximum_depth_then_a_worker_takes_it() {
    virtual_time();
    let limits = Limits {
        max_depth: 3,
        ..Limits::default()
    };
    let mut h = SubplannerRun::start(limits, fast(), RECURSIVE);
    h.submit(vec![wide("the language front end", &LANG)]);

    // t1 (depth 1) and t1.1 (depth 2) go to the Subplanner; t1.1.1 is at depth 3, the
    // maximum, so a worker takes it however wide it is.
    let leaf = h.expect_assign().await;
    assert_eq!(leaf.task.task, task("t1.1.1"));
    assert_eq!(leaf.route, Route::Worker);
    assert_eq!(leaf.task.attempt, 1);
    let firsts: Vec<String> = h
        .asked()
        .iter()
        .map(|r| {
            r.messages[1]
                .content
                .lines()
                .nth(1)
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(firsts, ["- ID: t1", "- ID: t1.1"]);

    h.finish(&leaf);
    assert_eq!(
        h.finished().await,
        EventKind::RunFinished {
            outcome: RunOutcome::Completed,
            reason: None
        }
    );
    // Each level aggregated its one subtask.
    let snap = h.graph.send(GetSnapshot).await.unwrap();
    for id in ["t1", "t1.1"] {
        let view = snap.tasks.iter().find(|t| t.id == task(id)).unwrap();
        assert_eq!(view.state, TaskState::Completed, "{id}");
        assert!(
            view.summary.as_deref().unwrap().starts_with("Decomposed"),
            "{id}: {:?}",
            view.summary
        );
    }
}

#[actix::test]
async fn a_subplanner_whose_answers_keep_failing_stops_and_a_worker_takes_the_task() {
    virtual_time();
    let scenario = r#"
[[subplanner.t1.answers]]
fault = "malformed"
[[subplanner.t1.answers]]
fault = "error"
"#;
    // The malformed answer, then the provider error, and the same error on the retry (the
    // scripted n-th answer is the n-th recorded exchange's).
    let config = SubplannerConfig {
        max_consecutive_errors: 3,
        ..fast()
    };
    let mut h = SubplannerRun::start(Limits::default(), config, scenario);
    h.submit(vec![wide("the language front end", &LANG)]);
    let a = h.expect_assign().await;
    assert_eq!((a.task.task.clone(), a.route), (task("t1"), Route::Worker));
    let kinds = h.journaled();
    // The provider error left no answer to record; the malformed one is recorded unusable.
    let recorded: Vec<Option<String>> = kinds
        .iter()
        .filter_map(|k| match k {
            EventKind::SubplannerResponded { error, .. } => Some(error.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(recorded.len(), 1);
    assert!(recorded[0].as_deref().unwrap().contains("no JSON object"));
    let reason = kinds
        .iter()
        .find_map(|k| match k {
            EventKind::TaskAtomic { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .unwrap();
    assert!(
        reason.contains("the Subplanner stopped: 3 errors in a row"),
        "{reason}"
    );
    h.finish(&a);
    assert!(matches!(
        h.finished().await,
        EventKind::RunFinished {
            outcome: RunOutcome::Completed,
            ..
        }
    ));
}

#[actix::test]
async fn at_its_iteration_cap_the_decomposition_is_closed_whatever_the_model_would_add() {
    virtual_time();
    let scenario = r#"
[[subplanner.t1.answers]]
tasks = [{ description = "The lexer", scope = ["src/lang/lex.rs"], acceptance = "done when it builds" }]
[[subplanner.t1.answers]]
tasks = [{ description = "The parser", scope = ["src/lang/parse.rs"], acceptance = "done when it builds" }]
[[subplanner.t1.answers]]
tasks = [{ description = "The checker", scope = ["src/lang/check.rs"], acceptance = "done when it builds" }]
"#;
    let limits = Limits {
        max_subplanner_iterations: 2,
        ..Limits::default()
    };
    let mut h = SubplannerRun::start(limits, fast(), scenario);
    h.submit(vec![wide("the language front end", &LANG)]);
    let a = h.expect_assign().await;
    h.finish(&a);
    let b = h.expect_assign().await;
    assert_eq!(b.task.task, task("t1.2"));
    let closed = h.events.expect_kind("decomposition_closed").await;
    assert!(
        matches!(&closed, EventKind::DecompositionClosed { reason, .. } if reason.contains("limit of 2 calls")),
        "{closed:?}"
    );
    h.finish(&b);
    assert!(matches!(
        h.finished().await,
        EventKind::RunFinished {
            outcome: RunOutcome::Completed,
            ..
        }
    ));
    assert_eq!(h.asked().len(), 2, "no call past the cap");
    h.worker.expect_none().await;
}

#[actix::test]
async fn a_failed_subtask_does_not_fail_the_parent_the_subplanner_plans_around_it() {
    virtual_time();
    let scenario = r#"
[[subplanner.t1.answers]]
tasks = [
  { description = "The lexer", scope = ["src/lang/lex.rs"], acceptance = "done when it builds" },
  { description = "The parser", scope = ["src/lang/parse.rs"], acceptance = "done when it builds" },
]
[[subplanner.t1.answers]]
tasks = [{ description = "The lexer again, smaller: only numbers", scope = ["src/lang/lex.rs"], acceptance = "done when it builds" }]
"#;
    let mut h = SubplannerRun::start(Limits::default(), fast(), scenario);
    h.submit(vec![wide("the language front end", &LANG)]);
    let a = h.expect_assign().await;
    let b = h.expect_assign().await;
    // The lexer is blocked: it fails without a retry.
    let mut blocked = Handoff::complete("needs the token list");
    blocked.status = HandoffStatus::Blocked;
    h.finish_with(&a, blocked);
    // The Subplanner hears it and plans a smaller lexer.
    let again = h.expect_assign().await;
    assert_eq!(again.task.task, task("t1.3"));
    let asked = h.asked();
    let follow_up = prompt_of(&asked[1]);
    assert!(
        follow_up.contains("### t1.1 (failed, blocked)\nwhy: blocked: needs the token list"),
        "{follow_up}"
    );
    h.finish(&b);
    h.finish(&again);
    h.finished().await;
    let snap = h.graph.send(GetSnapshot).await.unwrap();
    let parent = snap.tasks.iter().find(|t| t.id == task("t1")).unwrap();
    // Two of three subtasks did their work: partial, which completes the parent so the
    // root planner can plan the rest.
    assert_eq!(parent.state, TaskState::Completed);
    let kinds = h.journaled();
    let status = kinds.iter().find_map(|k| match k {
        EventKind::TaskCompleted {
            task: t,
            handoff: Some(h),
            ..
        } if *t == task("t1") => Some(h.status),
        _ => None,
    });
    assert_eq!(status, Some(HandoffStatus::Partial));
}

/// A restart in the middle of an open decomposition: the journal holds the first call and
/// its batch, and one subtask's handoff that no prompt carried yet. The new Subplanner reads
/// its conversation back, asks the *second* question (the first is never asked again), and
/// its prompt carries that handoff; the subtask that was in flight is re-run.
#[actix::test]
async fn after_a_restart_an_open_decomposition_resumes_its_conversation_without_asking_again() {
    virtual_time();
    let mut first = SubplannerRun::start(Limits::default(), fast(), ITERATIVE);
    first.submit(vec![wide("the language front end", &LANG)]);
    first.expect_assign().await;
    first.expect_assign().await;
    // The daemon "dies" here; t1.1 had finished just before, its handoff journaled.
    let mut kinds = first.journaled();
    let mut lexed = Handoff::complete("lexer with a Token enum");
    lexed.concerns = vec!["no unicode identifiers yet".into()];
    kinds.push(EventKind::TaskStarted {
        task: task("t1.1"),
        attempt: 1,
    });
    kinds.push(EventKind::TaskCompleted {
        task: task("t1.1"),
        attempt: 1,
        handoff: Some(lexed),
        artifacts: Vec::new(),
    });
    assert_eq!(
        kinds
            .iter()
            .filter(|k| matches!(k, EventKind::SubplannerResponded { .. }))
            .count(),
        1
    );

    // The second life, wired as the supervisor wires it.
    let mut second = SubplannerRun::resume(Limits::default(), fast(), ITERATIVE, &kinds);

    // The interrupted parser runs again, and the checker of the second batch is planned.
    let mut assigned = Vec::new();
    for _ in 0..2 {
        let a = second.expect_assign().await;
        assigned.push((a.task.task.to_string(), a.task.attempt));
    }
    assigned.sort();
    assert_eq!(assigned, [("t1.2".to_string(), 2), ("t1.3".to_string(), 1)]);
    let asked = second.asked();
    assert_eq!(asked.len(), 1, "only the new question is asked");
    let turns: Vec<ChatRole> = asked[0].messages.iter().map(|m| m.role).collect();
    assert_eq!(
        turns,
        [
            ChatRole::System,
            ChatRole::User,
            ChatRole::Assistant,
            ChatRole::User
        ],
        "the recorded exchange comes first"
    );
    let prompt = prompt_of(&asked[0]);
    assert!(
        prompt.contains("### t1.1 (completed, complete)"),
        "{prompt}"
    );
    assert!(
        prompt.contains("- t1.2: Parser for the language"),
        "{prompt}"
    );
    let recorded = second
        .events
        .fish_for("the second call", |Published(e)| match &e.kind {
            EventKind::SubplannerResponded { call, reported, .. } => {
                Some((*call, reported.clone()))
            }
            _ => None,
        })
        .await;
    assert_eq!(recorded, (1, vec![task("t1.1")]));
}

/// ADR-030, the hostile case of issue 22: a 259 KB answer of tiny subtasks, all outside the
/// parent's scope, became a 2.18 MB next prompt (8.4 times the answer: two notes per task,
/// each under its own heading, then all of them again in the error) plus the answer itself
/// sent again whole. Now the notes about one answer are at most `MAX_NOTES`, the reason
/// only counts them, and the answer goes back as an excerpt: the next request is smaller
/// than the answer it follows.
#[actix::test]
async fn a_hostile_answer_is_not_amplified_into_the_next_prompt() {
    virtual_time();
    let one = r#"{"description":"d","scope":["elsewhere/x"]}"#;
    let tasks = vec![one; 259_000 / (one.len() + 1)].join(",");
    let answer = format!(r#"{{"scratchpad":"s","tasks":[{tasks}]}}"#);
    let scenario = format!(
        "[[subplanner.t1.answers]]\ncontent = '''{answer}'''\n[[subplanner.t1.answers]]\nfault = \"malformed\"\n"
    );
    let config = SubplannerConfig {
        max_consecutive_errors: 2,
        ..fast()
    };
    let mut h = SubplannerRun::start(Limits::default(), config, &scenario);
    h.submit(vec![wide("the language front end", &LANG)]);
    let a = h.expect_assign().await;
    assert_eq!(a.route, Route::Worker, "the Subplanner stopped");
    let asked = h.asked();
    assert_eq!(asked.len(), 2);
    let bytes = |r: &LlmRequest| r.messages.iter().map(|m| m.content.len()).sum::<usize>();
    let (first, second) = (bytes(&asked[0]), bytes(&asked[1]));
    eprintln!(
        "answer {} bytes; requests {first} then {second} bytes",
        answer.len()
    );
    assert!(
        second < answer.len() / 4,
        "{second} bytes after a {} byte answer",
        answer.len()
    );
    assert!(second < first + 16 * 1024, "{first} → {second}");
    let prompt = prompt_of(&asked[1]);
    assert!(prompt.contains("more notes like these"), "{prompt}");
    assert!(prompt.matches("## About your last answer").count() <= 20);
    // The journal keeps the excerpt, not the 259 KB.
    let recorded: Vec<usize> = h
        .journaled()
        .iter()
        .filter_map(|k| match k {
            EventKind::SubplannerResponded { content, .. } => Some(content.len()),
            _ => None,
        })
        .collect();
    assert!(recorded.iter().all(|&n| n <= 2 * 1024), "{recorded:?}");
}
