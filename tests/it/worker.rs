//! The Worker actor alone: the scripted agent, and a probe in place of the TaskGraph.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use flotilla::scripted::{AgentCall, Scenario, ScriptedAgent};
use flotilla_actors::actors::Worker;
use flotilla_actors::protocol::*;

use crate::harness::*;

fn start(scenario: &str) -> (Addr<Worker>, Arc<ScriptedAgent>, Inbox<ToTaskGraph>) {
    virtual_time();
    let agent = Arc::new(ScriptedAgent::new(Scenario::from_toml(scenario).unwrap()));
    let (graph, inbox) = probe::<ToTaskGraph>("task graph");
    (
        Worker::new(agent.clone(), graph, std::env::temp_dir()).start(),
        agent,
        inbox,
    )
}

fn assign(id: &str, wall_ms: u64) -> ToAgent {
    let mut task = ready(id, spec("work", &["a.rs"]), 1, 1);
    task.budget = Budget::new(1_000, Usd::ZERO, wall_ms);
    ToAgent::Assign(Assignment {
        run: RunId::generate(),
        task,
        profile: "general".into(),
        route: Route::Worker,
        branch: "b".into(),
    })
}

#[actix::test]
async fn reports_start_then_completion_with_the_ids_it_was_given() {
    let (worker, _agent, mut graph) =
        start("[tasks.t1]\nsummary = \"lexer written\"\nconcerns = [\"no unicode\"]\n");
    worker.do_send(assign("t1", 60_000));
    assert!(
        matches!(graph.expect().await, ToTaskGraph::TaskStarted { task, attempt: 1 } if task == self::task("t1"))
    );
    match graph.expect().await {
        ToTaskGraph::TaskCompleted(c) => {
            assert_eq!((c.task.clone(), c.attempt), (task("t1"), 1));
            let h = c.handoff.unwrap();
            assert_eq!(
                (h.summary.as_str(), h.concerns.clone()),
                ("lexer written", vec!["no unicode".to_string()])
            );
        }
        other => panic!("expected TaskCompleted, got {other:?}"),
    }
}

#[actix::test]
async fn a_hung_agent_fails_at_the_wall_time_budget_and_a_crash_is_a_failure() {
    let (worker, _agent, mut graph) =
        start("[tasks.t1]\noutcome = \"hang\"\n[tasks.t2]\noutcome = \"crash\"\n");
    worker.do_send(assign("t1", 5_000));
    worker.do_send(assign("t2", 5_000));
    let mut failures = Vec::new();
    while failures.len() < 2 {
        if let ToTaskGraph::TaskFailed { task, failure, .. } = graph.expect().await {
            failures.push((task.to_string(), failure));
        }
    }
    failures.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(failures[0].0, "t1");
    assert_eq!(
        failures[0].1,
        AttemptFailure::TimedOut { limit_ms: 5_000 },
        "{failures:?}"
    );
    assert!(
        matches!(failures[1].1, AttemptFailure::Crashed { .. }),
        "{failures:?}"
    );
}

#[actix::test]
async fn a_rejected_subplan_goes_back_to_the_agent_and_cancel_drops_the_work() {
    let scenario = r#"
        [tasks.t1]
        outcome = "subplan"
        [tasks.t1.subplan]
        subtasks = [{ description = "x", scope = ["a.rs"] }]
        [tasks.t1.on_rejection]
        summary = "did it in one go"
        [tasks.t2]
        delay_ms = 10000
    "#;
    let (worker, agent, mut graph) = start(scenario);
    worker.do_send(assign("t1", 60_000));
    let proposal = graph
        .fish_for("TaskCompleted", |m| match m {
            ToTaskGraph::TaskCompleted(c) => Some(c.subplan.clone()),
            _ => None,
        })
        .await;
    assert_eq!(proposal.unwrap().parent, task("t1"));
    worker.do_send(ToAgent::DecompositionRejected(TaskDecompositionRejected {
        parent: task("t1"),
        reason: RejectionReason::NoSubtasks,
    }));
    let revised = graph
        .fish_for("revised report", |m| match m {
            ToTaskGraph::TaskCompleted(c) => c.handoff.clone(),
            _ => None,
        })
        .await;
    assert_eq!(revised.summary, "did it in one go");
    assert!(agent.calls().contains(&AgentCall::Revise {
        task: task("t1"),
        reason: RejectionReason::NoSubtasks
    }));

    worker.do_send(assign("t2", 60_000));
    graph.expect().await; // TaskStarted
    worker.do_send(ToAgent::Cancel {
        task: task("t2"),
        reason: "user".into(),
    });
    tokio::time::sleep(Duration::from_secs(20)).await;
    graph.expect_none().await;
}
