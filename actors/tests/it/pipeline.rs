//! TaskGraph and Dispatch together, with probe agents: whole flows.

use flotilla_actors::config::Limits;
use flotilla_actors::graph::RunGraph;
use flotilla_actors::protocol::*;

use crate::harness::*;

#[actix::test]
async fn plan_dispatch_complete_run_done() {
    virtual_time();
    let mut h = PipelineHarness::start(Limits::default());
    let mut second = spec("write the tests", &["tests/a.rs"]);
    second.dependencies = vec![DependencyRef::Batch(0)];
    h.graph.do_send(ToTaskGraph::SubmitTasks {
        tasks: vec![spec("write the code", &["src/a.rs"]), second],
    });
    h.graph.do_send(ToTaskGraph::PlanningFinished);

    let first = h.expect_assign().await;
    assert_eq!(first.task.task, task("t1"));
    assert_eq!(first.route, Route::Worker);
    assert!(first.branch.starts_with("flotilla/") && first.branch.ends_with("/t1"));
    h.worker.expect_none().await; // t2 waits for t1
    h.finish(&first);

    let second = h.expect_assign().await;
    assert_eq!(second.task.task, task("t2"));
    h.finish(&second);

    let kinds = h.events.next_kinds(12).await;
    assert_eq!(
        kinds,
        [
            "task_added",
            "task_added",
            "task_ready",
            "planning_finished",
            "task_dispatched",
            "task_started",
            "task_completed",
            "task_ready",
            "task_dispatched",
            "task_started",
            "task_completed",
            "run_finished",
        ]
    );
    h.events.expect_none().await;
    let snap = h.graph.send(GetSnapshot).await.unwrap();
    assert_eq!(snap.outcome, Some(RunOutcome::Completed));
    assert!(snap.tasks.iter().all(|t| t.state == TaskState::Completed));
}

#[actix::test]
async fn subplan_accepted_subtasks_dispatched_then_synthesis_completes_the_parent() {
    virtual_time();
    let mut h = PipelineHarness::start(Limits::default());
    h.graph.do_send(ToTaskGraph::SubmitTasks {
        tasks: vec![spec("build the parser", &["src/parse"])],
    });
    h.graph.do_send(ToTaskGraph::PlanningFinished);
    let parent = h.expect_assign().await;
    h.graph.do_send(ToTaskGraph::TaskStarted {
        task: task("t1"),
        attempt: 1,
    });

    let plan = ProposedSubplan {
        parent: task("t1"),
        reason: DecompositionReason::TooLarge,
        subtasks: vec![
            SubtaskProposal::new("lexer", &["src/parse/lex.rs"]),
            SubtaskProposal::new("grammar", &["src/parse/grammar.rs"]).after(&[0]),
        ],
        stop_when: StopCondition::AllSubtasksComplete,
    };
    h.graph
        .do_send(ToTaskGraph::TaskCompleted(Box::new(TaskCompleted {
            task: task("t1"),
            attempt: parent.task.attempt,
            handoff: None,
            artifacts: Vec::new(),
            subplan: Some(plan),
        })));

    let accepted = h
        .worker
        .fish_for("DecompositionAccepted", |m| match m {
            ToAgent::DecompositionAccepted(a) => Some(a.clone()),
            _ => None,
        })
        .await;
    assert_eq!(accepted.subtasks, vec![task("t1.1"), task("t1.2")]);

    // The parent gave its slot and scope lock back: the first subtask runs in it.
    let lexer = h.expect_assign().await;
    assert_eq!(lexer.task.task, task("t1.1"));
    h.worker.expect_none().await; // t1.2 depends on t1.1
    h.finish(&lexer);
    let grammar = h.expect_assign().await;
    assert_eq!(grammar.task.task, task("t1.2"));
    h.finish(&grammar);

    let done = h
        .worker
        .fish_for("SubtasksCompleted", |m| match m {
            ToAgent::SubtasksCompleted(s) => Some(s.clone()),
            _ => None,
        })
        .await;
    assert_eq!(done.parent, task("t1"));
    let results: Vec<_> = done
        .results
        .iter()
        .map(|r| (r.task.to_string(), r.state))
        .collect();
    assert_eq!(
        results,
        [
            ("t1.1".into(), TaskState::Completed),
            ("t1.2".into(), TaskState::Completed)
        ]
    );
    assert_eq!(
        done.results[1].handoff.as_ref().unwrap().summary,
        "t1.2 done"
    );

    // Synthesis: the parent's agent reports the final result.
    h.graph
        .do_send(ToTaskGraph::TaskCompleted(Box::new(TaskCompleted {
            task: task("t1"),
            attempt: 1,
            handoff: Some(Handoff::complete("parser assembled")),
            artifacts: Vec::new(),
            subplan: None,
        })));
    let outcome = h.events.expect_kind("run_finished").await;
    assert_eq!(
        outcome,
        EventKind::RunFinished {
            outcome: RunOutcome::Completed,
            reason: None
        }
    );
    let snap = h.graph.send(GetSnapshot).await.unwrap();
    let parent_view = snap.tasks.iter().find(|t| t.id == task("t1")).unwrap();
    assert_eq!(parent_view.state, TaskState::Completed);
    assert_eq!(parent_view.summary.as_deref(), Some("parser assembled"));

    // The graph is a fold of the journal: replaying it rebuilds the same graph.
    let kinds: Vec<EventKind> = h.journal.all().into_iter().map(|e| e.kind).collect();
    let replayed = RunGraph::replay(Limits::default(), &kinds).unwrap();
    assert_eq!(replayed.snapshot(), snap);
}

#[actix::test]
async fn a_wide_task_goes_to_the_subplanner_whose_proposal_is_validated_like_any_other() {
    virtual_time();
    let mut h = PipelineHarness::start(Limits::default());
    let wide = spec(
        "the whole http layer",
        &[
            "src/http/a.rs",
            "src/http/b.rs",
            "src/http/c.rs",
            "src/http/d.rs",
        ],
    );
    h.graph
        .do_send(ToTaskGraph::SubmitTasks { tasks: vec![wide] });
    let assigned = h
        .subplanner
        .fish_for("Assign", |m| match m {
            ToAgent::Assign(a) => Some(a.clone()),
            _ => None,
        })
        .await;
    assert_eq!(
        (assigned.task.task.clone(), assigned.route),
        (task("t1"), Route::Subplanner)
    );
    h.worker.expect_none().await;

    // The subplanner answers with a subplan that escapes the parent's scope: refused, and the
    // refusal goes to the subplanner, not the worker.
    h.graph.do_send(ToTaskGraph::TaskStarted {
        task: task("t1"),
        attempt: 1,
    });
    h.graph
        .do_send(ToTaskGraph::TaskCompleted(Box::new(TaskCompleted {
            task: task("t1"),
            attempt: 1,
            handoff: None,
            artifacts: Vec::new(),
            subplan: Some(ProposedSubplan {
                parent: task("t1"),
                reason: DecompositionReason::TooLarge,
                subtasks: vec![
                    SubtaskProposal::new("a", &["src/http/a.rs"]),
                    SubtaskProposal::new("b", &["Cargo.toml"]),
                ],
                stop_when: StopCondition::AllSubtasksComplete,
            }),
        })));
    let rejected = h
        .subplanner
        .fish_for("DecompositionRejected", |m| match m {
            ToAgent::DecompositionRejected(r) => Some(r.reason.clone()),
            _ => None,
        })
        .await;
    assert_eq!(
        rejected,
        RejectionReason::ScopeOutsideParent {
            subtask: 1,
            path: "Cargo.toml".into()
        }
    );
    h.worker.expect_none().await;
}
