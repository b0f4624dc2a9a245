//! The Planner actor alone: a scripted LLM (which records what it was asked) and a probe in
//! place of the TaskGraph.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use flotilla::scripted::{Scenario, ScriptedLlm};
use flotilla_actors::actors::{
    Dispatch, Exchange, Planner, PlannerConfig, TaskGraph, WorkerProfile,
};
use flotilla_actors::config::Limits;
use flotilla_actors::graph::RunGraph;
use flotilla_actors::ports::{
    ChatRole, CommitLog, CommitShown, GrepQuery, GrepReport, Llm, LlmCall, LlmError, LlmRequest,
    LlmResponse, MemoryJournal, ReadBounds, RepoError, RepoReader, RepoSnapshot, SystemClock,
    TreeItem, TreePath,
};
use flotilla_actors::protocol::*;
use futures::future::BoxFuture;

use crate::harness::*;

fn start(
    scenario: &str,
    config: PlannerConfig,
) -> (Addr<Planner>, Arc<ScriptedLlm>, Inbox<ToTaskGraph>) {
    virtual_time();
    let llm = Arc::new(ScriptedLlm::new(Scenario::from_toml(scenario).unwrap()));
    let (graph, inbox) = probe::<ToTaskGraph>("task graph");
    let planner = Planner::new(
        RunId::generate(),
        "build a calculator".into(),
        "SYSTEM".into(),
        llm.clone(),
        graph,
        config,
    )
    .start();
    (planner, llm, inbox)
}

async fn expect_answer(inbox: &mut Inbox<ToTaskGraph>) -> PlannerAnswer {
    inbox
        .fish_for("PlannerAnswered", |m| match m {
            ToTaskGraph::PlannerAnswered(a) => Some((**a).clone()),
            _ => None,
        })
        .await
}

fn handoff(id: &str) -> ToPlanner {
    ToPlanner::Handoff(Box::new(RootHandoff {
        task: task(id),
        state: TaskState::Completed,
        description: format!("task {id}"),
        handoff: Some(Handoff::complete(format!(
            "{id} is done; watch the error paths"
        ))),
        failure: None,
    }))
}

/// A root task whose worker reported a failure.
fn failed_handoff(id: &str) -> ToPlanner {
    let mut report = Handoff::complete(format!("{id}: the build is broken"));
    report.status = HandoffStatus::Failed;
    ToPlanner::Handoff(Box::new(RootHandoff {
        task: task(id),
        state: TaskState::Failed,
        description: format!("task {id}"),
        handoff: Some(report),
        failure: Some(FailureReason::AgentFailed {
            failure: AttemptFailure::Reported {
                summary: format!("{id}: the build is broken"),
            },
        }),
    }))
}

const TWO_SPRINTS: &str = r#"
[[planner.answers]]
tasks = [{ description = "lexer", scope = ["lex.rs"] }]
[[planner.answers]]
tasks = [{ description = "parser", scope = ["parse.rs"] }]
"#;

#[actix::test]
async fn plans_the_first_sprint_then_replans_only_after_three_handoffs() {
    let (planner, llm, mut graph) = start(TWO_SPRINTS, PlannerConfig::default());
    planner.do_send(ToPlanner::Start);
    let first = expect_answer(&mut graph).await;
    assert_eq!(first.call, 0);
    assert_eq!(first.tasks.as_ref().unwrap()[0].description, "lexer");
    assert!(first.prompt.contains("build a calculator"));
    planner.do_send(ToPlanner::BatchAccepted { ready: 1 });

    planner.do_send(handoff("t1"));
    planner.do_send(handoff("t2"));
    graph.expect_none().await;
    planner.do_send(handoff("t3"));
    let second = expect_answer(&mut graph).await;
    assert_eq!(second.call, 1);
    for id in ["t1", "t2", "t3"] {
        assert!(
            second.prompt.contains(&format!("### {id} (completed)")),
            "{}",
            second.prompt
        );
    }
    assert!(second.prompt.contains("watch the error paths"));

    // The second request carried the whole conversation: system, the first exchange, the new prompt.
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    let roles: Vec<ChatRole> = requests[1].messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            ChatRole::System,
            ChatRole::User,
            ChatRole::Assistant,
            ChatRole::User
        ]
    );
    assert_eq!(requests[1].messages[2].content, first.content);
}

#[actix::test]
async fn quiescence_triggers_a_plan_and_a_refused_batch_is_explained_next_time() {
    let (planner, _llm, mut graph) = start(TWO_SPRINTS, PlannerConfig::default());
    planner.do_send(ToPlanner::Start);
    expect_answer(&mut graph).await;
    planner.do_send(ToPlanner::BatchRejected {
        reason: RejectionReason::EmptyScope { subtask: 0 },
    });
    let next = expect_answer(&mut graph).await;
    assert!(
        next.prompt.contains("Your last batch was refused"),
        "{}",
        next.prompt
    );
    assert!(next.prompt.contains("empty scope"), "{}", next.prompt);
    planner.do_send(ToPlanner::BatchAccepted { ready: 1 });
    planner.do_send(ToPlanner::Quiescent);
    let third = expect_answer(&mut graph).await;
    assert_eq!(
        third.tasks,
        Ok(vec![]),
        "beyond the script the planner answers an empty sprint"
    );
}

#[actix::test]
async fn a_malformed_answer_is_recorded_and_retried_with_backoff_then_the_planner_gives_up() {
    let scenario = r#"
        [[planner.answers]]
        fault = "malformed"
        [[planner.answers]]
        fault = "malformed"
        [[planner.answers]]
        fault = "malformed"
    "#;
    let config = PlannerConfig {
        max_consecutive_errors: 3,
        backoff_base_ms: 1_000,
        ..PlannerConfig::default()
    };
    let (planner, _llm, mut graph) = start(scenario, config);
    planner.do_send(ToPlanner::Start);
    let first = expect_answer(&mut graph).await;
    assert!(first.tasks.as_ref().unwrap_err().contains("no JSON object"));
    // Backoff: nothing for the first second, then the retry explains the problem.
    tokio::time::sleep(Duration::from_millis(700)).await; // + 200 ms of expect_none: still < 1 s
    graph.expect_none().await;
    let second = expect_answer(&mut graph).await;
    assert!(
        second.prompt.contains("could not be used"),
        "{}",
        second.prompt
    );
    let _third = expect_answer(&mut graph).await;
    let gave_up = graph
        .fish_for("PlannerGaveUp", |m| match m {
            ToTaskGraph::PlannerGaveUp { error } => Some(error.clone()),
            _ => None,
        })
        .await;
    assert!(
        gave_up.contains("3 consecutive planner errors"),
        "{gave_up}"
    );
    planner.do_send(ToPlanner::Quiescent);
    graph.expect_none().await;
}

#[actix::test]
async fn a_resumed_planner_continues_its_recorded_conversation_without_asking_again() {
    virtual_time();
    let llm = Arc::new(ScriptedLlm::new(Scenario::from_toml(TWO_SPRINTS).unwrap()));
    let (graph, mut inbox) = probe::<ToTaskGraph>("task graph");
    let recorded = vec![Exchange {
        prompt: "first prompt".into(),
        answer: "{\"tasks\": []}".into(),
        unused: None,
    }];
    let planner = Planner::new(
        RunId::generate(),
        "r".into(),
        "S".into(),
        llm.clone(),
        graph,
        PlannerConfig::default(),
    )
    .resuming(recorded)
    .start();
    planner.do_send(ToPlanner::Quiescent);
    let answer = expect_answer(&mut inbox).await;
    assert_eq!(answer.call, 1, "call 0 was recorded; it is not asked again");
    assert_eq!(answer.tasks.unwrap()[0].description, "parser");
    assert_eq!(llm.requests().len(), 1);
}

/// ADR-030: a resumed planner's first request is bounded like any other: the fixed first
/// message, the scratchpad of the latest used answer (read back from the journaled
/// answers, though that answer is no longer shown), and the last exchange, whose unusable
/// answer is an excerpt with its reason. The call count goes on from the journal: nothing
/// recorded is asked again.
#[actix::test]
async fn a_resumed_planner_carries_its_latest_scratchpad_and_only_the_last_exchanges() {
    virtual_time();
    let llm = Arc::new(ScriptedLlm::new(Scenario::from_toml(TWO_SPRINTS).unwrap()));
    let (graph, mut inbox) = probe::<ToTaskGraph>("task graph");
    let answer = |i: usize| {
        format!(
            "{{\"scratchpad\": \"pad {i}\", \"tasks\": [{{\"description\": \"t{i}\", \"scope\": [\"m{i}.rs\"]}}]}}"
        )
    };
    let mut recorded: Vec<Exchange> = (0..6)
        .map(|i| Exchange::new(format!("prompt {i}"), answer(i), None))
        .collect();
    recorded.push(Exchange::new(
        "prompt 6".into(),
        "junk ".repeat(100_000),
        Some("the answer contains no JSON object".into()),
    ));
    let config = PlannerConfig {
        keep_exchanges: 1,
        ..PlannerConfig::default()
    };
    let planner = Planner::new(
        RunId::generate(),
        "r".into(),
        "S".into(),
        llm.clone(),
        graph,
        config,
    )
    .resuming(recorded)
    .start();
    planner.do_send(ToPlanner::Quiescent);
    let answered = expect_answer(&mut inbox).await;
    assert_eq!(answered.call, 7, "calls 0 to 6 were recorded");
    let requests = llm.requests();
    assert_eq!(requests.len(), 1, "nothing recorded is asked again");
    let texts: Vec<&str> = requests[0]
        .messages
        .iter()
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(texts.len(), 6, "{texts:#?}");
    assert_eq!(texts[1], "prompt 0", "the fixed first message");
    assert!(
        texts[2].contains("6 of the 7 earlier answers") && texts[2].contains("pad 5"),
        "the carried scratchpad: {}",
        texts[2]
    );
    assert_eq!(texts[3], "prompt 6");
    assert!(
        texts[4].starts_with(
            "[flotilla: this answer was not used: the answer contains no JSON object]"
        ) && texts[4].len() < 4 * 1024,
        "{}",
        &texts[4][..200]
    );
    assert!(!texts.iter().any(|t| t.contains("pad 4")));
}

/// A real TaskGraph (in-memory journal) and the Planner, wired to each other; probes stand
/// in for Dispatch and the event stream.
fn start_with_graph(
    scenario: &str,
    config: PlannerConfig,
    limits: Limits,
) -> (
    Addr<TaskGraph>,
    Arc<ScriptedLlm>,
    Inbox<Published>,
    Inbox<ToDispatch>,
) {
    virtual_time();
    let run = RunId::generate();
    let llm = Arc::new(ScriptedLlm::new(Scenario::from_toml(scenario).unwrap()));
    let (dispatch, dispatch_inbox) = probe::<ToDispatch>("dispatch");
    let (events, events_inbox) = probe::<Published>("events");
    let planner_ctx = Context::<Planner>::new();
    let graph = TaskGraph::new(
        run,
        RunGraph::new(limits),
        Arc::new(MemoryJournal::new(Arc::new(SystemClock))),
        dispatch,
        Some(events),
    )
    .with_planner(planner_ctx.address().recipient())
    .start();
    let planner = planner_ctx.run(Planner::new(
        run,
        "build a calculator".into(),
        "SYSTEM".into(),
        llm.clone(),
        graph.clone().recipient(),
        config,
    ));
    planner.do_send(ToPlanner::Start);
    (graph, llm, events_inbox, dispatch_inbox)
}

/// Plays Dispatch and a worker: the next ready task is dispatched, started and completed.
async fn run_next_ready(graph: &Addr<TaskGraph>, dispatch: &mut Inbox<ToDispatch>) -> TaskId {
    let ready = dispatch
        .fish_for("Ready", |m| match m {
            ToDispatch::Ready(tasks) => Some(tasks[0].clone()),
            _ => None,
        })
        .await;
    run_to_completion(graph, &ready.task);
    ready.task
}

/// Plays Dispatch and a worker for one ready task (first attempt).
fn run_to_completion(graph: &Addr<TaskGraph>, id: &TaskId) {
    let (agent, _agent_inbox) = probe::<ToAgent>("agent");
    graph.do_send(ToTaskGraph::TaskDispatched {
        task: id.clone(),
        attempt: 1,
        profile: "default".into(),
        route: Route::Worker,
        agent,
    });
    graph.do_send(ToTaskGraph::TaskStarted {
        task: id.clone(),
        attempt: 1,
    });
    graph.do_send(ToTaskGraph::TaskCompleted(Box::new(TaskCompleted {
        task: id.clone(),
        attempt: 1,
        handoff: Some(Handoff::complete(format!("{id} done"))),
        artifacts: Vec::new(),
        subplan: None,
    })));
}

#[actix::test]
async fn refused_batches_back_off_like_errors_and_the_planner_gives_up_after_the_limit() {
    // Every answer is valid JSON whose batch the graph refuses (a task with no scope).
    let refused = "[[planner.answers]]\ntasks = [{ description = \"x\", scope = [] }]\n";
    let config = PlannerConfig {
        backoff_base_ms: 1_000,
        backoff_max_ms: 8_000,
        ..PlannerConfig::default()
    };
    let limit = config.max_consecutive_errors;
    let (_graph, llm, mut events, _dispatch) =
        start_with_graph(&refused.repeat(30), config, Limits::default());

    let mut calls_at = Vec::new();
    loop {
        let event = events
            .fish_for("a planner call or the give-up", |Published(e)| {
                match &e.kind {
                    EventKind::PlannerResponded { .. } | EventKind::PlannerGaveUp { .. } => {
                        Some(e.kind.clone())
                    }
                    _ => None,
                }
            })
            .await;
        match event {
            EventKind::PlannerResponded { .. } => {
                calls_at.push(tokio::time::Instant::now());
                let rejected = events.expect_kind("tasks_rejected").await;
                assert!(
                    matches!(
                        rejected,
                        EventKind::TasksRejected {
                            reason: RejectionReason::EmptyScope { .. }
                        }
                    ),
                    "{rejected:?}"
                );
            }
            EventKind::PlannerGaveUp { error } => {
                assert!(
                    error.contains(&format!("{limit} consecutive planner errors")),
                    "{error}"
                );
                assert!(error.contains("refused"), "{error}");
                break;
            }
            _ => unreachable!(),
        }
    }
    assert_eq!(calls_at.len(), limit as usize, "one call per allowed error");
    let gaps: Vec<u64> = calls_at
        .windows(2)
        .map(|w| (w[1] - w[0]).as_millis() as u64)
        .collect();
    // 1 s, doubling, capped at 8 s; virtual time makes the gaps exact up to scheduling.
    let expected = [
        1_000, 2_000, 4_000, 8_000, 8_000, 8_000, 8_000, 8_000, 8_000,
    ];
    for (gap, want) in gaps.iter().zip(expected) {
        assert!(
            (want..want + 50).contains(gap),
            "gaps between calls {gaps:?}, expected {expected:?}"
        );
    }
    let finished = events.expect_kind("run_finished").await;
    assert!(
        matches!(
            finished,
            EventKind::RunFinished {
                outcome: RunOutcome::Failed,
                ..
            }
        ),
        "{finished:?}"
    );
    // Nothing more is asked, however long we wait.
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(llm.requests().len(), limit as usize);
    let requests = llm.requests();
    let second_prompt = &requests[1].messages.last().unwrap().content;
    assert!(
        second_prompt.contains("Your last batch was refused"),
        "{second_prompt}"
    );
}

#[actix::test]
async fn reaching_the_iteration_limit_finishes_planning_and_the_run_completes() {
    let scenario = r#"
        [[planner.answers]]
        tasks = [{ description = "lexer", scope = ["lex.rs"] }]
        [[planner.answers]]
        tasks = [{ description = "parser", scope = ["parse.rs"] }]
        [[planner.answers]]
        tasks = [{ description = "never asked for", scope = ["x.rs"] }]
    "#;
    let config = PlannerConfig {
        max_iterations: 2,
        ..PlannerConfig::default()
    };
    let (graph, llm, mut events, mut dispatch) =
        start_with_graph(scenario, config, Limits::default());
    assert_eq!(run_next_ready(&graph, &mut dispatch).await, task("t1"));
    // t1's end makes the graph quiescent: the planner plans its second (last) sprint.
    assert_eq!(run_next_ready(&graph, &mut dispatch).await, task("t2"));
    // Quiescent again: the limit is reached, so planning finishes instead of failing.
    let mut kinds = Vec::new();
    loop {
        let Published(event) = events.expect().await;
        kinds.push(event.kind.name());
        if let EventKind::RunFinished { outcome, .. } = event.kind {
            assert_eq!(outcome, RunOutcome::Completed, "events: {kinds:?}");
            break;
        }
    }
    assert!(kinds.contains(&"planning_finished"), "{kinds:?}");
    assert!(!kinds.contains(&"planner_gave_up"), "{kinds:?}");
    assert_eq!(llm.requests().len(), 2, "no call beyond the limit");
    events.expect_none().await;
}

#[actix::test]
async fn handoffs_do_not_trigger_a_plan_while_every_worker_slot_is_busy() {
    let (planner, llm, mut graph) = start(TWO_SPRINTS, PlannerConfig::default());
    planner.do_send(ToPlanner::Start);
    expect_answer(&mut graph).await;
    planner.do_send(ToPlanner::BatchAccepted { ready: 1 });
    planner.do_send(ToPlanner::Capacity { free_workers: 0 });
    for id in ["t1", "t2", "t3", "t4"] {
        planner.do_send(handoff(id));
    }
    graph.expect_none().await;
    assert_eq!(llm.requests().len(), 1, "all slots busy: no call");

    // A slot frees up: the planner plans, with every handoff it read meanwhile.
    planner.do_send(ToPlanner::Capacity { free_workers: 1 });
    let second = expect_answer(&mut graph).await;
    assert_eq!(second.call, 1);
    for id in ["t1", "t2", "t3", "t4"] {
        assert!(second.prompt.contains(&format!("### {id} (completed)")));
    }
}

#[actix::test]
async fn a_failed_handoff_needs_attention_even_while_every_slot_is_busy() {
    let (planner, _llm, mut graph) = start(TWO_SPRINTS, PlannerConfig::default());
    planner.do_send(ToPlanner::Start);
    expect_answer(&mut graph).await;
    planner.do_send(ToPlanner::BatchAccepted { ready: 1 });
    planner.do_send(ToPlanner::Capacity { free_workers: 0 });
    planner.do_send(handoff("t1"));
    planner.do_send(handoff("t2"));
    planner.do_send(failed_handoff("t3"));
    let second = expect_answer(&mut graph).await;
    assert!(
        second.prompt.contains("### t3 (failed)"),
        "{}",
        second.prompt
    );
    assert!(second.prompt.contains("the build is broken"));
}

#[actix::test]
async fn quiescence_plans_whatever_the_last_capacity_report_said() {
    let (planner, _llm, mut graph) = start(TWO_SPRINTS, PlannerConfig::default());
    planner.do_send(ToPlanner::Start);
    expect_answer(&mut graph).await;
    planner.do_send(ToPlanner::BatchAccepted { ready: 1 });
    planner.do_send(ToPlanner::Capacity { free_workers: 0 });
    planner.do_send(ToPlanner::Quiescent);
    assert_eq!(expect_answer(&mut graph).await.call, 1);
}

#[actix::test]
async fn the_task_graph_forwards_dispatchs_capacity_reports_to_the_planner() {
    let scenario = r#"
        [[planner.answers]]
        tasks = [
            { description = "a", scope = ["a.rs"] },
            { description = "b", scope = ["b.rs"] },
            { description = "c", scope = ["c.rs"] },
            { description = "d", scope = ["d.rs"] },
        ]
        [[planner.answers]]
        tasks = [{ description = "e", scope = ["e.rs"] }]
    "#;
    let (graph, llm, mut events, mut dispatch) =
        start_with_graph(scenario, PlannerConfig::default(), Limits::default());
    dispatch
        .fish_for("Ready", |m| matches!(m, ToDispatch::Ready(_)).then_some(()))
        .await;
    graph.do_send(ToTaskGraph::WorkerCapacity { free: 0 });
    for id in ["t1", "t2", "t3"] {
        run_to_completion(&graph, &task(id));
        events.expect_kind("task_completed").await;
    }
    events.expect_none().await;
    assert_eq!(llm.requests().len(), 1, "three handoffs, but no free slot");

    graph.do_send(ToTaskGraph::WorkerCapacity { free: 1 });
    let EventKind::PlannerResponded { call, prompt, .. } =
        events.expect_kind("planner_responded").await
    else {
        unreachable!()
    };
    assert_eq!(call, 1);
    assert!(prompt.contains("### t3 (completed)"), "{prompt}");
}

const EMPTY_THEN_A_TASK: &str = r#"
[[planner.answers]]
tasks = []
[[planner.answers]]
tasks = [{ description = "lexer", scope = ["lex.rs"] }]
"#;

#[actix::test]
async fn an_empty_first_sprint_is_asked_once_more_with_a_reminder() {
    let (planner, llm, mut graph) = start(EMPTY_THEN_A_TASK, PlannerConfig::default());
    planner.do_send(ToPlanner::Start);
    let first = expect_answer(&mut graph).await;
    let why = first.tasks.unwrap_err();
    assert!(why.contains("empty"), "{why}");
    // At once: no backoff, no quiescence needed.
    let second = expect_answer(&mut graph).await;
    assert_eq!(second.call, 1);
    assert_eq!(second.tasks.unwrap()[0].description, "lexer");

    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    let reminder = &requests[1].messages.last().unwrap().content;
    assert!(
        reminder.contains("Your previous answer was an empty task list"),
        "{reminder}"
    );
    assert!(reminder.contains("plan the first sprint"), "{reminder}");
    assert!(
        reminder.contains("empty task list again to confirm"),
        "{reminder}"
    );
    assert!(!reminder.contains("could not be used"), "{reminder}");
}

#[actix::test]
async fn a_second_empty_answer_finishes_planning_and_the_run() {
    // Beyond the script the LLM answers empty lists: two of them here.
    let (_graph, llm, mut events, _dispatch) =
        start_with_graph("", PlannerConfig::default(), Limits::default());
    let mut kinds = Vec::new();
    loop {
        let Published(event) = events.expect().await;
        kinds.push(event.kind.name());
        if let EventKind::RunFinished { outcome, reason } = event.kind {
            assert_eq!(outcome, RunOutcome::Completed, "{kinds:?}");
            // A plan of no task that the model meant says so.
            let reason = reason.expect("a run with no task says why it completed");
            assert!(reason.contains("planned no task"), "{reason}");
            assert!(reason.contains("after 2 calls"), "{reason}");
            break;
        }
    }
    assert_eq!(
        kinds,
        [
            "planner_responded",
            "planner_responded",
            "planning_finished",
            "run_finished"
        ]
    );
    events.expect_none().await;
    let requests = llm.requests();
    assert_eq!(requests.len(), 2, "the reminder is sent once");
    assert!(
        requests[1]
            .messages
            .last()
            .unwrap()
            .content
            .contains("Your previous answer was an empty task list")
    );
}

#[actix::test]
async fn a_planner_that_never_produced_a_usable_task_fails_the_run_with_the_reason() {
    // Every batch is refused (a scope that escapes the repository), until the planner's
    // call limit ends planning: no task ever existed, so the run did nothing it was asked.
    let scenario = r#"
        [[planner.answers]]
        tasks = [{ description = "escape", scope = ["../outside.rs"] }]
        [[planner.answers]]
        tasks = [{ description = "escape again", scope = ["/etc/passwd"] }]
    "#;
    let config = PlannerConfig {
        max_iterations: 2,
        max_consecutive_errors: 10,
        backoff_base_ms: 1,
        backoff_max_ms: 1,
        ..PlannerConfig::default()
    };
    let (_graph, llm, mut events, _dispatch) =
        start_with_graph(scenario, config, Limits::default());
    let mut kinds = Vec::new();
    loop {
        let Published(event) = events.expect().await;
        kinds.push(event.kind.name());
        if let EventKind::RunFinished { outcome, reason } = event.kind {
            assert_eq!(outcome, RunOutcome::Failed, "{kinds:?}");
            let reason = reason.expect("a failed run says why");
            assert!(
                reason.contains("no usable task in 2 calls"),
                "the reason says what happened: {reason}"
            );
            assert!(
                reason.contains("/etc/passwd"),
                "and names the last problem: {reason}"
            );
            break;
        }
    }
    assert!(kinds.contains(&"tasks_rejected"), "{kinds:?}");
    assert!(!kinds.contains(&"task_added"), "{kinds:?}");
    assert_eq!(llm.requests().len(), 2);
}

#[actix::test]
async fn no_reminder_once_something_was_planned() {
    let (planner, llm, mut graph) = start(TWO_SPRINTS, PlannerConfig::default());
    planner.do_send(ToPlanner::Start);
    expect_answer(&mut graph).await;
    planner.do_send(ToPlanner::BatchAccepted { ready: 1 });
    planner.do_send(ToPlanner::Quiescent);
    expect_answer(&mut graph).await;
    planner.do_send(ToPlanner::BatchAccepted { ready: 1 });
    planner.do_send(ToPlanner::Quiescent);
    let third = expect_answer(&mut graph).await;
    assert_eq!(
        third.tasks,
        Ok(vec![]),
        "an empty later sprint is taken as done"
    );
    graph.expect_none().await;
    assert_eq!(llm.requests().len(), 3);
}

#[actix::test]
async fn a_resumed_planner_still_owes_the_reminder_after_an_empty_first_sprint() {
    virtual_time();
    let llm = Arc::new(ScriptedLlm::new(
        Scenario::from_toml(EMPTY_THEN_A_TASK).unwrap(),
    ));
    let (graph, mut inbox) = probe::<ToTaskGraph>("task graph");
    let recorded = vec![Exchange {
        prompt: "## Request\nbuild a calculator".into(),
        answer: "{\"tasks\": []}".into(),
        unused: None,
    }];
    let planner = Planner::new(
        RunId::generate(),
        "build a calculator".into(),
        "S".into(),
        llm.clone(),
        graph,
        PlannerConfig::default(),
    )
    .resuming(recorded)
    .start();
    planner.do_send(ToPlanner::Quiescent);
    let answer = expect_answer(&mut inbox).await;
    assert_eq!(answer.call, 1);
    assert!(
        answer
            .prompt
            .contains("Your previous answer was an empty task list"),
        "{}",
        answer.prompt
    );
}

/// An LLM that is rate limited with an absurd retry-after once, then answers one task.
struct RateLimitedOnce(std::sync::Mutex<u32>);

impl Llm for RateLimitedOnce {
    fn complete(
        &self,
        _: LlmRequest,
        _: LlmCall,
    ) -> BoxFuture<'static, Result<LlmResponse, LlmError>> {
        let mut calls = self.0.lock().unwrap();
        *calls += 1;
        let first = *calls == 1;
        Box::pin(async move {
            if first {
                return Err(LlmError::RateLimited {
                    retry_after_ms: u64::MAX,
                });
            }
            Ok(LlmResponse {
                content: r#"{"tasks": [{"description": "d", "scope": ["a"]}]}"#.into(),
                ..LlmResponse::default()
            })
        })
    }
}

#[actix::test]
async fn a_providers_retry_after_is_honoured_up_to_a_bound() {
    virtual_time();
    let (graph, mut inbox) = probe::<ToTaskGraph>("task graph");
    let planner = Planner::new(
        RunId::generate(),
        "r".into(),
        "S".into(),
        Arc::new(RateLimitedOnce(std::sync::Mutex::new(0))),
        graph,
        PlannerConfig::default(),
    )
    .start();
    planner.do_send(ToPlanner::Start);
    // u64::MAX ms would be forever; the planner retries within 15 minutes.
    tokio::time::sleep(Duration::from_secs(14 * 60)).await;
    assert!(inbox.drain().is_empty(), "still honouring the retry-after");
    tokio::time::sleep(Duration::from_secs(60)).await;
    let answer = expect_answer(&mut inbox).await;
    assert_eq!(answer.tasks.unwrap().len(), 1);
}

/// The TaskGraph, Dispatch and the Planner wired for real; a probe plays the worker.
fn start_pipeline(
    scenario: &str,
    limits: Limits,
) -> (Addr<TaskGraph>, Arc<ScriptedLlm>, Inbox<ToAgent>) {
    virtual_time();
    let run = RunId::generate();
    let llm = Arc::new(ScriptedLlm::new(Scenario::from_toml(scenario).unwrap()));
    let (worker, worker_inbox) = probe::<ToAgent>("worker");
    let graph_ctx = Context::<TaskGraph>::new();
    let planner_ctx = Context::<Planner>::new();
    let dispatch = Dispatch::new(
        run,
        limits.clone(),
        vec![WorkerProfile::new("default", &[], 1)],
        graph_ctx.address().recipient(),
        worker.clone(),
        worker,
    )
    .start();
    let graph = graph_ctx.run(
        TaskGraph::new(
            run,
            RunGraph::new(limits),
            Arc::new(MemoryJournal::new(Arc::new(SystemClock))),
            dispatch.recipient(),
            None,
        )
        .with_planner(planner_ctx.address().recipient()),
    );
    let planner = planner_ctx.run(Planner::new(
        run,
        "build a calculator".into(),
        "SYSTEM".into(),
        llm.clone(),
        graph.clone().recipient(),
        PlannerConfig::default(),
    ));
    planner.do_send(ToPlanner::Start);
    (graph, llm, worker_inbox)
}

async fn assigned_tasks(worker: &mut Inbox<ToAgent>, n: usize) -> Vec<TaskId> {
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(
            worker
                .fish_for("Assign", |m| match m {
                    ToAgent::Assign(a) => Some(a.task.task.clone()),
                    _ => None,
                })
                .await,
        );
    }
    ids
}

fn tasks_toml(from: usize, n: usize) -> String {
    let tasks: Vec<String> = (from..from + n)
        .map(|i| format!("{{ description = \"m{i}\", scope = [\"m{i}.rs\"] }}"))
        .collect();
    format!("[[planner.answers]]\ntasks = [{}]\n", tasks.join(", "))
}

#[actix::test]
async fn a_batch_that_fills_the_free_slots_is_not_followed_by_another_call_at_once() {
    // Sprint 1: seven tasks for four workers. Sprint 2 (a slow call): six more.
    let scenario = format!(
        "{}{}delay_ms = 1000\n{}",
        tasks_toml(1, 7),
        tasks_toml(8, 6),
        tasks_toml(14, 1)
    );
    let (graph, llm, mut worker) = start_pipeline(&scenario, Limits::default());
    let running = assigned_tasks(&mut worker, 4).await;
    for id in &running[..3] {
        run_to_completion(&graph, id);
    }
    let refills = assigned_tasks(&mut worker, 3).await;
    // t4 ends with the queue empty: a slot is free and four handoffs are unread, so the
    // planner asks for sprint 2. The other three end while that call is in flight.
    run_to_completion(&graph, &running[3]);
    // Virtual time: everything else settles before the clock reaches the call's answer.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(llm.requests().len(), 2, "sprint 2 is being asked for");
    for id in &refills {
        run_to_completion(&graph, id);
    }
    let sprint_2 = assigned_tasks(&mut worker, 4).await;
    assert_eq!(sprint_2[0], task("t8"));
    worker.expect_none().await;
    // Three handoffs were unread when sprint 2 was accepted, but its tasks took every
    // free slot: no third call until a slot frees up.
    assert_eq!(llm.requests().len(), 2);

    run_to_completion(&graph, &sprint_2[0]);
    let next = assigned_tasks(&mut worker, 1).await;
    assert_eq!(
        next,
        [task("t12")],
        "the queued fifth task of sprint 2 takes the slot"
    );
    worker.expect_none().await;
    assert_eq!(llm.requests().len(), 2);
}

/// An LLM whose every call is refused for good (as a bad API key is), counting its calls.
struct RefusesForGood(std::sync::atomic::AtomicU32);

impl Llm for RefusesForGood {
    fn complete(
        &self,
        _: LlmRequest,
        _: LlmCall,
    ) -> BoxFuture<'static, Result<LlmResponse, LlmError>> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async {
            Err(LlmError::Refused {
                status: 401,
                message: "invalid api key".into(),
            })
        })
    }
}

#[actix::test]
async fn a_final_provider_error_ends_planning_at_once_with_the_providers_reason() {
    virtual_time();
    let (graph, mut inbox) = probe::<ToTaskGraph>("task graph");
    let llm = Arc::new(RefusesForGood(Default::default()));
    let planner = Planner::new(
        RunId::generate(),
        "r".into(),
        "S".into(),
        llm.clone(),
        graph,
        PlannerConfig::default(),
    )
    .start();
    planner.do_send(ToPlanner::Start);
    let error = inbox
        .fish_for("PlannerGaveUp", |m| match m {
            ToTaskGraph::PlannerGaveUp { error } => Some(error.clone()),
            _ => None,
        })
        .await;
    assert!(
        error.contains("HTTP 401") && error.contains("invalid api key"),
        "{error}"
    );
    // No backoff and no second call: a refusal would be refused again.
    tokio::time::sleep(Duration::from_secs(600)).await;
    inbox.expect_none().await;
    assert_eq!(llm.0.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A repository whose `main` reads as each snapshot in turn (the last one repeats).
struct ScriptedRepo(std::sync::Mutex<std::collections::VecDeque<RepoSnapshot>>);

impl RepoReader for ScriptedRepo {
    fn main_tip(&self) -> BoxFuture<'static, Result<String, RepoError>> {
        Box::pin(async { Ok("tip".to_string()) })
    }

    fn snapshot(&self) -> BoxFuture<'static, Result<RepoSnapshot, RepoError>> {
        let mut queue = self.0.lock().unwrap();
        let next = if queue.len() > 1 {
            queue.pop_front().unwrap()
        } else {
            queue.front().cloned().unwrap()
        };
        Box::pin(async move { Ok(next) })
    }

    fn changed_paths(
        &self,
        _: String,
        _: String,
    ) -> BoxFuture<'static, Result<Vec<String>, RepoError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn read_path(
        &self,
        _: String,
        _: TreePath,
        _: ReadBounds,
    ) -> BoxFuture<'static, Result<TreeItem, RepoError>> {
        not_used("read_path")
    }

    fn grep(&self, _: String, _: GrepQuery) -> BoxFuture<'static, Result<GrepReport, RepoError>> {
        not_used("grep")
    }

    fn log(
        &self,
        _: String,
        _: Option<TreePath>,
        _: usize,
    ) -> BoxFuture<'static, Result<CommitLog, RepoError>> {
        not_used("log")
    }

    fn show_commit(
        &self,
        _: String,
        _: String,
        _: usize,
    ) -> BoxFuture<'static, Result<Option<CommitShown>, RepoError>> {
        not_used("show_commit")
    }
}

/// The scripted repository's tools are never called: these tests script no tool calls.
fn not_used<T: Send + 'static>(what: &str) -> BoxFuture<'static, Result<T, RepoError>> {
    let e = RepoError::Git(format!("{what}: these tests call no tool"));
    Box::pin(async move { Err(e) })
}

fn repo_snapshot(files: impl IntoIterator<Item = String>, features: &str) -> RepoSnapshot {
    let mut files: Vec<String> = files.into_iter().collect();
    files.sort();
    RepoSnapshot {
        commit: "c".into(),
        files,
        files_omitted: 0,
        docs: vec![
            ("SPEC.md".into(), "# The spec: a calculator".into()),
            ("FEATURES.json".into(), features.into()),
        ],
        recent_commits: vec!["abc1234 first commit".into()],
    }
}

/// The first prompt carries the repository whole (planning documents, file tree, recent
/// commits); a follow-up carries only what changed: files added and removed, and
/// FEATURES.json only when its text changed. On a 2,000-file repository where 20 files
/// changed, the follow-up is more than ten times smaller.
#[actix::test]
async fn follow_up_prompts_carry_the_repositorys_changes_not_its_unchanged_state() {
    virtual_time();
    let base: Vec<String> = (0..2000)
        .map(|i| format!("src/mod{i:04}/file.rs"))
        .collect();
    let mut changed = base.clone();
    changed.retain(|f| f != "src/mod0005/file.rs");
    changed.extend((0..20).map(|i| format!("src/new{i:02}.rs")));
    let repo = Arc::new(ScriptedRepo(std::sync::Mutex::new(
        [
            repo_snapshot(base, r#"{"add": false}"#),
            repo_snapshot(changed.clone(), r#"{"add": false}"#),
            repo_snapshot(changed, r#"{"add": true}"#),
        ]
        .into(),
    )));
    let one_task = "[[planner.answers]]\ntasks = [{ description = \"d\", scope = [\"a\"] }]\n";
    let llm = Arc::new(ScriptedLlm::new(
        Scenario::from_toml(&one_task.repeat(3)).unwrap(),
    ));
    let (graph, mut inbox) = probe::<ToTaskGraph>("task graph");
    let planner = Planner::new(
        RunId::generate(),
        "build a calculator".into(),
        "SYSTEM".into(),
        llm.clone(),
        graph,
        PlannerConfig::default(),
    )
    .with_repo(repo)
    .start();
    planner.do_send(ToPlanner::Start);
    let first = expect_answer(&mut inbox).await.prompt;
    for part in [
        "## SPEC.md",
        "# The spec: a calculator",
        "## FEATURES.json",
        "## Repository file tree (2000 files)",
        "src/mod1999/file.rs",
        "## Recent commits\nabc1234 first commit",
    ] {
        assert!(first.contains(part), "the first prompt lacks {part:?}");
    }
    for features_changed in [false, true] {
        planner.do_send(ToPlanner::BatchAccepted { ready: 0 });
        planner.do_send(ToPlanner::Quiescent);
        let follow_up = expect_answer(&mut inbox).await.prompt;
        assert!(
            follow_up.contains("File tree (2019 files)")
                || follow_up.contains("unchanged (2019 files)"),
            "{follow_up}"
        );
        assert!(
            !follow_up.contains("src/mod1999/file.rs"),
            "unchanged files are not re-sent"
        );
        assert!(!follow_up.contains("SPEC.md"), "the spec is sent once");
        assert_eq!(
            follow_up.contains("## FEATURES.json (changed)"),
            features_changed,
            "{follow_up}"
        );
        if !features_changed {
            assert!(
                follow_up.contains("New: src/new00.rs, src/new01.rs"),
                "{follow_up}"
            );
            assert!(
                follow_up.contains("Removed: src/mod0005/file.rs"),
                "{follow_up}"
            );
            assert!(
                follow_up.len() * 10 < first.len(),
                "follow-up {} chars, first {}",
                follow_up.len(),
                first.len()
            );
        } else {
            assert!(
                follow_up.contains("File tree: unchanged (2019 files)"),
                "{follow_up}"
            );
        }
    }
    // What reached the model: the follow-ups above, after the first exchange.
    let asked = llm.requests();
    assert_eq!(asked.len(), 3);
    assert!(
        asked[2]
            .messages
            .last()
            .unwrap()
            .content
            .contains("{\"add\": true}")
    );
}

/// An LLM that streams: it reports its progress three times, then answers one task.
struct Streams;

impl Llm for Streams {
    fn complete(
        &self,
        _: LlmRequest,
        call: LlmCall,
    ) -> BoxFuture<'static, Result<LlmResponse, LlmError>> {
        Box::pin(async move {
            for tokens_out in [10, 20, 30] {
                call.progress(flotilla_actors::ports::LlmProgress { tokens_out });
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Ok(LlmResponse {
                content: r#"{"tasks": [{"description": "d", "scope": ["a"]}]}"#.into(),
                ..LlmResponse::default()
            })
        })
    }
}

/// A streaming planner call shows its progress as live notices (seq 0: never journaled),
/// throttled, naming the role; the answer itself goes to the graph as before.
#[actix::test]
async fn a_streaming_planner_call_publishes_its_progress_as_live_notices() {
    let (graph, mut inbox) = probe::<ToTaskGraph>("task graph");
    let (notices, mut seen) = probe::<Published>("notices");
    let planner = Planner::new(
        RunId::generate(),
        "r".into(),
        "S".into(),
        Arc::new(Streams),
        graph,
        PlannerConfig::default(),
    )
    .with_notices(notices)
    .start();
    planner.do_send(ToPlanner::Start);
    let mut progress = Vec::new();
    for _ in 0..3 {
        let Published(event) = seen.expect().await;
        assert_eq!(event.seq, 0, "a notice is not journaled");
        match event.kind {
            EventKind::LlmProgress {
                role: Role::Planner,
                task: None,
                tokens_out,
            } => progress.push(tokens_out),
            other => panic!("not progress: {other:?}"),
        }
    }
    assert_eq!(progress, [10, 20, 30]);
    let answer = expect_answer(&mut inbox).await;
    assert_eq!(answer.tasks.unwrap().len(), 1);
}

/// Answers every `GetSnapshot` with the same graph.
struct FixedGraph(GraphSnapshot);

impl Actor for FixedGraph {
    type Context = Context<Self>;
}

impl Handler<GetSnapshot> for FixedGraph {
    type Result = MessageResult<GetSnapshot>;

    fn handle(&mut self, _: GetSnapshot, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.0.clone())
    }
}

fn view(id: &str, state: TaskState, scope: &[&str]) -> TaskView {
    TaskView {
        id: id.parse().unwrap(),
        state,
        attempt: 1,
        description: format!("task {id}"),
        scope: scope.iter().map(|s| s.to_string()).collect(),
        priority: Priority::default(),
        parent: None,
        depends_on: vec![],
        budget: Budget::default(),
        spent: Budget::default(),
        summary: None,
        failure: None,
        review: None,
    }
}

/// A follow-up names the tasks still active and the paths running tasks hold (the seed's
/// "locked scopes"), so the model does not plan into them; finished tasks are not listed.
#[actix::test]
async fn follow_ups_name_the_active_tasks_and_the_locked_scopes() {
    virtual_time();
    let graph_view = FixedGraph(GraphSnapshot {
        tasks: vec![
            view("t1", TaskState::Completed, &["src/done.rs"]),
            view("t2", TaskState::Running, &["src/parse.rs", "src/ast.rs"]),
            view("t3", TaskState::Pending, &["src/eval.rs"]),
        ],
        planning_finished: false,
        outcome: None,
        run_spent: Budget::default(),
        run_budget: Budget::default(),
        finish_reason: None,
    })
    .start();
    let one_task = "[[planner.answers]]\ntasks = [{ description = \"d\", scope = [\"a\"] }]\n";
    let llm = Arc::new(ScriptedLlm::new(
        Scenario::from_toml(&one_task.repeat(2)).unwrap(),
    ));
    let (graph, mut inbox) = probe::<ToTaskGraph>("task graph");
    let planner = Planner::new(
        RunId::generate(),
        "r".into(),
        "S".into(),
        llm,
        graph,
        PlannerConfig::default(),
    )
    .with_graph_view(graph_view.recipient())
    .start();
    planner.do_send(ToPlanner::Start);
    let first = expect_answer(&mut inbox).await.prompt;
    assert!(!first.contains("## Active tasks"), "nothing is planned yet");
    planner.do_send(ToPlanner::BatchAccepted { ready: 0 });
    planner.do_send(ToPlanner::Quiescent);
    let follow_up = expect_answer(&mut inbox).await.prompt;
    assert!(follow_up.contains("## Active tasks (2)\nt2 [running] task t2 [src/parse.rs, src/ast.rs]\nt3 [pending] task t3 [src/eval.rs]\n"), "{follow_up}");
    assert!(
        follow_up.contains("## Locked file scopes (2 paths)")
            && follow_up.contains("src/ast.rs, src/parse.rs"),
        "{follow_up}"
    );
    assert!(
        !follow_up.contains("src/done.rs"),
        "finished tasks are not listed"
    );
    assert!(
        !follow_up.contains("src/eval.rs, src/parse.rs"),
        "a pending task locks nothing"
    );
}

/// An LLM whose answer is cut off at its output-token limit.
struct CutOff;

impl Llm for CutOff {
    fn complete(
        &self,
        _: LlmRequest,
        _: LlmCall,
    ) -> BoxFuture<'static, Result<LlmResponse, LlmError>> {
        Box::pin(async {
            Ok(LlmResponse {
                content: r#"{"scratchpad": "s", "tasks": [{"description": "a very long"#.into(),
                finish: flotilla_actors::ports::FinishReason::Length,
                ..LlmResponse::default()
            })
        })
    }
}

/// An answer cut off at the output-token limit is unusable, and says why in words the model
/// can act on in its next prompt, instead of only the parser's "EOF while parsing".
#[actix::test]
async fn a_cut_off_answer_says_it_was_cut_off() {
    virtual_time();
    let (graph, mut inbox) = probe::<ToTaskGraph>("task graph");
    let planner = Planner::new(
        RunId::generate(),
        "r".into(),
        "S".into(),
        Arc::new(CutOff),
        graph,
        PlannerConfig::default(),
    )
    .start();
    planner.do_send(ToPlanner::Start);
    let first = expect_answer(&mut inbox).await;
    let error = first.tasks.unwrap_err();
    assert!(
        error.contains("cut off at the output-token limit (the answer"),
        "{error}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let second = expect_answer(&mut inbox).await;
    assert!(
        second.prompt.contains("cut off at the output-token limit"),
        "{}",
        second.prompt
    );
}
