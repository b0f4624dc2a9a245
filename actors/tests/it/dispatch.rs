//! The Dispatch actor alone, with probes for the task graph, the worker and the subplanner.

use actix::prelude::*;
use flotilla_actors::actors::{Dispatch, WorkerProfile};
use flotilla_actors::config::Limits;
use flotilla_actors::protocol::*;

use crate::harness::*;

struct DispatchHarness {
    dispatch: Addr<Dispatch>,
    graph: Inbox<ToTaskGraph>,
    worker: Inbox<ToAgent>,
    subplanner: Inbox<ToAgent>,
}

fn start(limits: Limits, profiles: Vec<WorkerProfile>) -> DispatchHarness {
    virtual_time();
    let (graph_addr, graph) = probe::<ToTaskGraph>("task graph");
    let (worker_addr, worker) = probe::<ToAgent>("worker");
    let (sub_addr, subplanner) = probe::<ToAgent>("subplanner");
    let dispatch = Dispatch::new(
        RunId::generate(),
        limits,
        profiles,
        graph_addr,
        worker_addr,
        sub_addr,
    )
    .start();
    DispatchHarness {
        dispatch,
        graph,
        worker,
        subplanner,
    }
}

fn general() -> Vec<WorkerProfile> {
    vec![WorkerProfile::new("general", &[], 1)]
}

async fn assigned(inbox: &mut Inbox<ToAgent>) -> Assignment {
    match inbox.expect().await {
        ToAgent::Assign(a) => a,
        other => panic!("expected Assign, got {other:?}"),
    }
}

fn with_priority(description: &str, scope: &[&str], priority: u8) -> TaskSpec {
    let mut s = spec(description, scope);
    s.priority = Priority::new(priority).unwrap();
    s
}

#[actix::test]
async fn order_is_priority_then_critical_path_then_age() {
    let mut h = start(
        Limits {
            max_workers: 1,
            ..Limits::default()
        },
        general(),
    );
    h.dispatch.do_send(ToDispatch::Ready(vec![
        ready("t1", with_priority("old, short chain", &["a"], 5), 1, 1),
        ready("t2", with_priority("urgent", &["b"], 1), 1, 2),
        ready("t3", with_priority("long chain", &["c"], 5), 4, 3),
        ready("t4", with_priority("young, short chain", &["d"], 5), 1, 4),
        ready("t5", with_priority("lowest", &["e"], 9), 9, 0),
    ]));
    let mut order = Vec::new();
    for _ in 0..5 {
        let a = assigned(&mut h.worker).await;
        h.worker.expect_none().await; // one slot: the next waits for a release
        order.push(a.task.task.to_string());
        h.dispatch
            .do_send(ToDispatch::Release { task: a.task.task });
    }
    assert_eq!(order, ["t2", "t3", "t1", "t4", "t5"]);
}

#[actix::test]
async fn overlapping_scopes_never_run_together() {
    let mut h = start(
        Limits {
            max_workers: 3,
            ..Limits::default()
        },
        general(),
    );
    h.dispatch.do_send(ToDispatch::Ready(vec![
        ready("t1", spec("net", &["src/net"]), 1, 1),
        ready("t2", spec("tcp", &["src/net/tcp.rs"]), 1, 2),
        ready("t3", spec("docs", &["docs"]), 1, 3),
    ]));
    assert_eq!(assigned(&mut h.worker).await.task.task, task("t1"));
    assert_eq!(assigned(&mut h.worker).await.task.task, task("t3"));
    h.worker.expect_none().await; // t2 waits for t1's lock although a slot is free
    h.dispatch.do_send(ToDispatch::Release { task: task("t1") });
    assert_eq!(assigned(&mut h.worker).await.task.task, task("t2"));
}

#[actix::test]
async fn max_workers_is_respected_and_the_graph_hears_of_each_dispatch_first() {
    let mut h = start(
        Limits {
            max_workers: 2,
            ..Limits::default()
        },
        general(),
    );
    h.dispatch.do_send(ToDispatch::Ready(
        (1..=4)
            .map(|i| ready(&format!("t{i}"), spec("x", &[&format!("f{i}")]), 1, i))
            .collect(),
    ));
    for i in 1..=2 {
        match h.graph.expect().await {
            ToTaskGraph::TaskDispatched {
                task: t,
                route,
                profile,
                ..
            } => {
                assert_eq!(
                    (t, route, profile.as_str()),
                    (task(&format!("t{i}")), Route::Worker, "general")
                )
            }
            other => panic!("expected TaskDispatched, got {other:?}"),
        }
        assigned(&mut h.worker).await;
    }
    h.worker.expect_none().await;
    h.dispatch.do_send(ToDispatch::Release { task: task("t2") });
    assert_eq!(assigned(&mut h.worker).await.task.task, task("t3"));
    h.worker.expect_none().await;
}

#[actix::test]
async fn wide_tasks_go_to_the_subplanner_unless_at_max_depth() {
    let mut h = start(Limits::default(), general());
    let wide = ["src/a", "src/b", "src/c", "src/d"];
    h.dispatch.do_send(ToDispatch::Ready(vec![
        ready("t1", spec("wide", &wide), 1, 1),
        ready(
            "t2.1.1",
            spec("wide but deep", &["lib/a", "lib/b", "lib/c", "lib/d"]),
            1,
            2,
        ),
        ready("t3", spec("narrow", &["x", "y", "z"]), 1, 3),
    ]));
    let sub = assigned(&mut h.subplanner).await;
    assert_eq!((sub.task.task, sub.route), (task("t1"), Route::Subplanner));
    assert_eq!(assigned(&mut h.worker).await.task.task, task("t2.1.1"));
    assert_eq!(assigned(&mut h.worker).await.task.task, task("t3"));
    h.subplanner.expect_none().await;
}

#[actix::test]
async fn the_best_fitting_profile_is_chosen_and_unfit_tasks_are_reported() {
    let profiles = vec![
        WorkerProfile::new("general", &[], 1),
        WorkerProfile::new("rust", &["rust"], 3),
        WorkerProfile::new("everything", &["rust", "web"], 9),
    ];
    let mut h = start(Limits::default(), profiles);
    let mut rust = spec("rust work", &["src/lib.rs"]);
    rust.capabilities = ["rust".to_string()].into();
    let mut gpu = spec("train a model", &["model"]);
    gpu.capabilities = ["gpu".to_string()].into();
    h.dispatch.do_send(ToDispatch::Ready(vec![
        ready("t1", rust, 1, 1),
        ready("t2", gpu, 1, 2),
    ]));
    let a = assigned(&mut h.worker).await;
    assert_eq!((a.task.task, a.profile.as_str()), (task("t1"), "rust"));
    let undispatchable = h
        .graph
        .fish_for("Undispatchable", |m| match m {
            ToTaskGraph::Undispatchable { task, reason, .. } => {
                Some((task.clone(), reason.clone()))
            }
            _ => None,
        })
        .await;
    assert_eq!(
        undispatchable,
        (
            task("t2"),
            "no worker profile offers capabilities [gpu]".into()
        )
    );
}

#[actix::test]
async fn a_released_queued_task_is_withdrawn() {
    let mut h = start(
        Limits {
            max_workers: 1,
            ..Limits::default()
        },
        general(),
    );
    h.dispatch.do_send(ToDispatch::Ready(vec![
        ready("t1", spec("a", &["a"]), 1, 1),
        ready("t2", spec("b", &["b"]), 1, 2),
    ]));
    assigned(&mut h.worker).await;
    h.dispatch.do_send(ToDispatch::Release { task: task("t2") }); // cancelled while queued
    h.dispatch.do_send(ToDispatch::Release { task: task("t1") });
    h.worker.expect_none().await;
}

/// The free worker slots Dispatch reported to the graph, in order, skipping other messages.
fn capacity_reports(inbox: &mut Inbox<ToTaskGraph>) -> Vec<usize> {
    inbox
        .drain()
        .into_iter()
        .filter_map(|m| match m {
            ToTaskGraph::WorkerCapacity { free } => Some(free),
            _ => None,
        })
        .collect()
}

#[actix::test]
async fn free_worker_slots_are_reported_to_the_graph_when_their_number_changes() {
    let mut h = start(
        Limits {
            max_workers: 2,
            ..Limits::default()
        },
        general(),
    );
    h.dispatch.do_send(ToDispatch::Ready(vec![
        ready("t1", spec("a", &["a"]), 1, 1),
        ready("t2", spec("b", &["b"]), 1, 2),
        ready("t3", spec("c", &["c"]), 1, 3),
    ]));
    let first = assigned(&mut h.worker).await;
    assigned(&mut h.worker).await;
    h.worker.expect_none().await;
    assert_eq!(capacity_reports(&mut h.graph), [0], "both slots busy");

    // A release refilled from the queue leaves the number unchanged: nothing is sent.
    h.dispatch.do_send(ToDispatch::Release {
        task: first.task.task,
    });
    let third = assigned(&mut h.worker).await;
    h.worker.expect_none().await;
    assert_eq!(capacity_reports(&mut h.graph), Vec::<usize>::new());

    // The queue is empty: a release frees a slot, and a second release a second one.
    h.dispatch.do_send(ToDispatch::Release {
        task: third.task.task,
    });
    h.dispatch.do_send(ToDispatch::Release { task: task("t2") });
    h.worker.expect_none().await;
    assert_eq!(capacity_reports(&mut h.graph), [1, 2]);
}

#[actix::test]
async fn every_ready_is_answered_with_the_free_slots_even_when_unchanged() {
    let mut h = start(
        Limits {
            max_workers: 1,
            ..Limits::default()
        },
        general(),
    );
    h.dispatch.do_send(ToDispatch::Ready(vec![ready(
        "t1",
        spec("a", &["a"]),
        1,
        1,
    )]));
    assigned(&mut h.worker).await;
    h.worker.expect_none().await;
    assert_eq!(capacity_reports(&mut h.graph), [0]);
    // Nothing can start, the number is unchanged, and still the planner, which counted the
    // new batch against the free slots, hears the real number.
    h.dispatch.do_send(ToDispatch::Ready(vec![ready(
        "t2",
        spec("b", &["b"]),
        1,
        2,
    )]));
    h.worker.expect_none().await;
    assert_eq!(capacity_reports(&mut h.graph), [0]);
}

/// A task waiting for a scope waits for the task that holds it: when that one ends it runs
/// (or, if another running task still holds part of its scope, waits for that one), in
/// queue order, and a withdrawn waiting task never runs.
#[actix::test]
async fn a_task_waiting_for_a_scope_runs_when_its_holders_have_ended() {
    let mut h = start(
        Limits {
            max_workers: 4,
            ..Limits::default()
        },
        general(),
    );
    h.dispatch.do_send(ToDispatch::Ready(vec![
        ready("t1", spec("a", &["src/a.rs"]), 1, 1),
        ready("t2", spec("b", &["src/b.rs"]), 1, 2),
    ]));
    assert_eq!(assigned(&mut h.worker).await.task.task, task("t1"));
    assert_eq!(assigned(&mut h.worker).await.task.task, task("t2"));
    h.dispatch.do_send(ToDispatch::Ready(vec![
        ready("t3", spec("both", &["src/a.rs", "src/b.rs"]), 1, 3),
        ready("t4", spec("b again", &["src/b.rs"]), 1, 4),
        ready("t5", spec("elsewhere", &["docs"]), 1, 5),
        ready("t6", spec("withdrawn", &["src/a.rs"]), 1, 6),
    ]));
    assert_eq!(assigned(&mut h.worker).await.task.task, task("t5"));
    h.worker.expect_none().await;
    h.dispatch.do_send(ToDispatch::Release { task: task("t6") });
    // t1 ends: t3 still needs t2's file; t6 was withdrawn.
    h.dispatch.do_send(ToDispatch::Release { task: task("t1") });
    h.worker.expect_none().await;
    // t2 ends: t3 (older) runs, and t4 waits for t3.
    h.dispatch.do_send(ToDispatch::Release { task: task("t2") });
    assert_eq!(assigned(&mut h.worker).await.task.task, task("t3"));
    h.worker.expect_none().await;
    h.dispatch.do_send(ToDispatch::Release { task: task("t3") });
    assert_eq!(assigned(&mut h.worker).await.task.task, task("t4"));
    h.worker.expect_none().await;
}
