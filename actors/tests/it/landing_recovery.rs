//! The TaskGraph actor's side of landing recovery (M8b, ADR-018), with probes in the
//! MergeQueue's, the Reconciler's and Dispatch's places: what a restart puts back in the
//! queue, and what happens to a task whose conflict fix had nothing to resolve.

use std::sync::Arc;

use actix::Actor;
use flotilla_actors::actors::{Recovery, TaskGraph};
use flotilla_actors::config::Limits;
use flotilla_actors::graph::RunGraph;
use flotilla_actors::ports::{Clock, MemoryJournal, SystemClock};
use flotilla_actors::protocol::*;

use crate::harness::{Inbox, probe, spec, task};

/// A handoff whose branch has commits (`head != base`), or none (`head == base`).
fn work(id: &str, commits: bool) -> Handoff {
    let mut h = Handoff::complete(format!("{id} done"));
    h.work = Some(Box::new(BranchWork {
        branch: format!("flotilla/run/{id}"),
        base: "base".into(),
        head: if commits {
            format!("head-{id}")
        } else {
            "base".into()
        },
        files: Vec::new(),
        files_omitted: 0,
        lines_added: u64::from(commits),
        lines_removed: 0,
        committed_for_agent: false,
        links_outside: Vec::new(),
    }));
    h
}

fn deliver(g: &mut RunGraph, id: &str, commits: bool) -> Vec<EventKind> {
    let t = task(id);
    let attempt = g.task(&t).unwrap().attempt;
    let mut out = g.dispatched(&t, attempt, "general", Route::Worker).unwrap();
    out.extend(g.started(&t, attempt).unwrap());
    out.extend(
        g.complete(TaskCompleted {
            task: t,
            attempt,
            handoff: Some(work(id, commits)),
            artifacts: Vec::new(),
            subplan: None,
        })
        .unwrap(),
    );
    out
}

struct Restarted {
    graph: actix::Addr<TaskGraph>,
    queue: Inbox<ToMergeQueue>,
    dispatch: Inbox<ToDispatch>,
    _reconciler: Inbox<ToReconciler>,
}

/// The run restarted from `journal`, as the supervisor does it.
fn restart(journal: &[EventKind]) -> Restarted {
    let graph = RunGraph::new(Limits::default())
        .merging()
        .replayed(journal)
        .unwrap();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (dispatch_addr, dispatch) = probe::<ToDispatch>("dispatch");
    let (queue_addr, queue) = probe::<ToMergeQueue>("merge queue");
    let (reconciler_addr, reconciler) = probe::<ToReconciler>("reconciler");
    let graph = TaskGraph::new(
        RunId::generate(),
        graph,
        Arc::new(MemoryJournal::new(clock)),
        dispatch_addr,
        None,
    )
    .with_merging(queue_addr, reconciler_addr)
    .resuming(Recovery::default())
    .start();
    Restarted {
        graph,
        queue,
        dispatch,
        _reconciler: reconciler,
    }
}

async fn enqueued(queue: &mut Inbox<ToMergeQueue>) -> LandRequest {
    queue
        .fish_for("an Enqueue", |m| match m {
            ToMergeQueue::Enqueue(r) => Some((**r).clone()),
            _ => None,
        })
        .await
}

#[actix::test]
async fn a_restart_never_enqueues_a_task_waiting_for_its_fix_and_an_empty_fix_sends_it_back() {
    // t1 and t2 delivered; t1's branch conflicted and f1 was made for it; the daemon dies
    // while f1 runs.
    let mut g = RunGraph::new(Limits::default()).merging();
    let mut journal = g
        .submit(vec![spec("a", &["src/a.rs"]), spec("b", &["src/b.rs"])])
        .unwrap();
    journal.extend(deliver(&mut g, "t1", true));
    journal.extend(deliver(&mut g, "t2", true));
    journal.extend(
        g.landing_conflict(&task("t1"), 1, vec!["src/a.rs".into()], Vec::new())
            .unwrap(),
    );
    let f1 = task("f1");
    journal.extend(g.dispatched(&f1, 1, "general", Route::Worker).unwrap());
    journal.extend(g.started(&f1, 1).unwrap());

    let mut run = restart(&journal);
    // Only t2 waits in the queue: t1 lands through f1 (or fails with it).
    let request = enqueued(&mut run.queue).await;
    assert_eq!(request.task, task("t2"));
    assert!(request.recovered);
    run.queue.expect_none().await;
    // f1 is dispatched again (its attempt was interrupted).
    let ready = run
        .dispatch
        .fish_for("f1 ready", |m| match m {
            ToDispatch::Ready(tasks) => tasks.iter().any(|t| t.task == task("f1")).then_some(()),
            _ => None,
        })
        .await;
    let () = ready;

    // f1's second attempt finds nothing to resolve (what t1 clashed with had not landed):
    // it completes without commits. t1's own branch goes back to the queue.
    let (agent, _agent_inbox) = probe::<ToAgent>("agent");
    run.graph.do_send(ToTaskGraph::TaskDispatched {
        task: f1.clone(),
        attempt: 2,
        profile: "general".into(),
        route: Route::Worker,
        agent,
    });
    run.graph.do_send(ToTaskGraph::TaskStarted {
        task: f1.clone(),
        attempt: 2,
    });
    run.graph
        .do_send(ToTaskGraph::TaskCompleted(Box::new(TaskCompleted {
            task: f1.clone(),
            attempt: 2,
            handoff: Some(work("f1", false)),
            artifacts: Vec::new(),
            subplan: None,
        })));
    let request = enqueued(&mut run.queue).await;
    assert_eq!(request.task, task("t1"));
    assert_eq!(request.branch, "flotilla/run/t1");
    // It lands; the run's tasks are all done.
    run.graph.do_send(FromMerging::MainMoved {
        from: "m0".into(),
        to: "m1".into(),
        landed: vec![(task("t1"), 1, "m1".into()), (task("t2"), 1, "m1".into())],
        checkout: CheckoutSync::NotCheckedOut,
    });
    let snapshot = run.graph.send(GetSnapshot).await.unwrap();
    for t in ["t1", "t2", "f1"] {
        let view = snapshot.tasks.iter().find(|v| v.id == task(t)).unwrap();
        assert_eq!(view.state, TaskState::Completed, "{t}");
    }
    run.queue.expect_none().await;
}

#[actix::test]
async fn adopting_a_diverged_main_asks_the_queue_what_it_dropped_and_journals_it_before_landing_resumes()
 {
    // t1 and t2 landed (c1, c2); then main was reset to u1, which holds c1 only.
    let mut g = RunGraph::new(Limits::default()).merging();
    let mut journal = g
        .submit(vec![spec("a", &["src/a.rs"]), spec("b", &["src/b.rs"])])
        .unwrap();
    journal.extend(deliver(&mut g, "t1", true));
    journal.extend(deliver(&mut g, "t2", true));
    for (t, from, to) in [("t1", "m0", "c1"), ("t2", "c1", "c2")] {
        let moved = EventKind::MainMoved {
            from: from.into(),
            to: to.into(),
            tasks: vec![task(t)],
            checkout: CheckoutSync::NotCheckedOut,
        };
        journal.extend(g.merge_noted(moved).unwrap());
        journal.extend(g.landed(&task(t), 1, to).unwrap());
    }
    let diverged = EventKind::MainDiverged {
        expected: "c2".into(),
        actual: "u1".into(),
    };
    journal.extend(g.merge_noted(diverged).unwrap());
    assert_eq!(g.diverged(), Some(("c2", "u1")));

    let mut run = restart(&journal);
    run.graph.do_send(ToTaskGraph::AdoptMain);
    let (expected, landed) = run
        .queue
        .fish_for("an AdoptMain", |m| match m {
            ToMergeQueue::AdoptMain { expected, landed } => {
                Some((expected.clone(), landed.clone()))
            }
            _ => None,
        })
        .await;
    assert_eq!(expected, "c2");
    assert_eq!(
        landed,
        vec![
            (task("t1"), "c1".to_string()),
            (task("t2"), "c2".to_string())
        ]
    );
    // Nothing is journaled or resumed until the queue has read main.
    run.queue.expect_none().await;

    run.graph.do_send(FromMerging::MainAdopted {
        expected: "c2".into(),
        tip: "u1".into(),
        dropped: vec![task("t2")],
    });
    let (expected, tip, dropped) = run
        .queue
        .fish_for("Adopted", |m| match m {
            ToMergeQueue::Adopted {
                expected,
                tip,
                dropped,
            } => Some((expected.clone(), tip.clone(), dropped.clone())),
            _ => None,
        })
        .await;
    assert_eq!((expected.as_str(), tip.as_str()), ("c2", "u1"));
    assert_eq!(
        dropped,
        vec!["c2".to_string()],
        "no branch holding c2 lands"
    );

    // Adopted once: a second decision finds nothing paused and the queue hears nothing.
    run.graph.do_send(ToTaskGraph::AdoptMain);
    run.queue.expect_none().await;
    // Both tasks stay completed: dropped work is named, never replayed.
    let snapshot = run.graph.send(GetSnapshot).await.unwrap();
    for t in ["t1", "t2"] {
        let view = snapshot.tasks.iter().find(|v| v.id == task(t)).unwrap();
        assert_eq!(view.state, TaskState::Completed, "{t}");
    }
}

#[test]
fn an_adoption_is_replayed_as_the_tip_flotilla_last_wrote_and_only_while_paused() {
    let mut g = RunGraph::new(Limits::default()).merging();
    let mut journal = Vec::new();
    // Not paused: the adoption is ignored, and says why.
    let ignored = g
        .main_adopted("c2".into(), "u1".into(), Vec::new())
        .unwrap();
    assert!(
        matches!(&ignored[..], [EventKind::MessageIgnored { why, .. }] if why.contains("not diverged")),
        "{ignored:?}"
    );
    assert!(g.adopt_main_asked().is_err());
    let moved = EventKind::MainMoved {
        from: "m0".into(),
        to: "c2".into(),
        tasks: Vec::new(),
        checkout: CheckoutSync::NotCheckedOut,
    };
    journal.extend(g.merge_noted(moved).unwrap());
    let diverged = EventKind::MainDiverged {
        expected: "c2".into(),
        actual: "u1".into(),
    };
    journal.extend(g.merge_noted(diverged).unwrap());
    // Paused on c2, not on another tip.
    let other = g
        .main_adopted("c9".into(), "u1".into(), Vec::new())
        .unwrap();
    assert!(
        matches!(&other[..], [EventKind::MessageIgnored { .. }]),
        "{other:?}"
    );
    journal.extend(
        g.main_adopted("c2".into(), "u1".into(), Vec::new())
            .unwrap(),
    );
    assert_eq!(g.main_tip().as_deref(), Some("u1"));
    assert_eq!(g.diverged(), None);

    let replayed = RunGraph::new(Limits::default())
        .merging()
        .replayed(&journal)
        .unwrap();
    assert_eq!(
        replayed.main_tip().as_deref(),
        Some("u1"),
        "a restart lands on u1"
    );
    assert_eq!(replayed.diverged(), None);
    assert!(
        replayed.dropped_commits().is_empty(),
        "nothing landed was dropped"
    );
}
