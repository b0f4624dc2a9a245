//! Dispatch's cost per hand-out as the queue grows (M7: "a completion looks only at tasks
//! that could now run"): `n` independent tasks queued at once, 4 worker slots, and an agent
//! that ends each task as soon as it is assigned; the time to hand all of them out, per
//! task, at 1k, 10k and 50k tasks. Flat per-task numbers mean no rescan of the queue.
//!
//! Run with `cargo bench -p flotilla-actors --bench dispatch`.

// Test code: a failed unwrap is a failed test (the lint policy, ADR-027).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use flotilla_actors::actors::{Dispatch, WorkerProfile};
use flotilla_actors::config::Limits;
use flotilla_actors::protocol::{
    Budget, ReadyTask, RunId, TaskId, TaskSpec, ToAgent, ToDispatch, ToTaskGraph,
};
use tokio::sync::oneshot;

const SIZES: [usize; 3] = [1_000, 10_000, 50_000];

/// Ends every assigned task at once, and says when the last one was handed out.
struct Agent {
    dispatch: Option<Addr<Dispatch>>,
    left: usize,
    done: Option<oneshot::Sender<()>>,
}

impl Actor for Agent {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "()")]
struct Wire(Addr<Dispatch>);

impl Handler<Wire> for Agent {
    type Result = ();
    fn handle(&mut self, Wire(dispatch): Wire, _: &mut Context<Self>) {
        self.dispatch = Some(dispatch);
    }
}

impl Handler<ToAgent> for Agent {
    type Result = ();
    fn handle(&mut self, msg: ToAgent, _: &mut Context<Self>) {
        if let ToAgent::Assign(a) = msg {
            if let Some(dispatch) = &self.dispatch {
                dispatch.do_send(ToDispatch::Release { task: a.task.task });
            }
            self.left -= 1;
            if self.left == 0
                && let Some(done) = self.done.take()
            {
                let _ = done.send(());
            }
        }
    }
}

/// Drops what Dispatch tells the graph.
struct Graph;

impl Actor for Graph {
    type Context = Context<Self>;
}

impl Handler<ToTaskGraph> for Graph {
    type Result = ();
    fn handle(&mut self, _: ToTaskGraph, _: &mut Context<Self>) {}
}

fn tasks(n: usize) -> Vec<ReadyTask> {
    (0..n)
        .map(|i| ReadyTask {
            task: TaskId::root(i as u32 + 1),
            attempt: 1,
            spec: Arc::new(TaskSpec::new(format!("task {i}"), &[&format!("d{i}")])),
            critical_path: 1,
            created: i as u64,
            budget: Budget::default(),
            atomic: false,
            fix: None,
            previous: None,
        })
        .collect()
}

/// The time to hand out `n` tasks through 4 slots.
fn hand_out(n: usize) -> Duration {
    let system = System::new();
    system.block_on(async move {
        let (done, finished) = oneshot::channel();
        let agent = Agent {
            dispatch: None,
            left: n,
            done: Some(done),
        }
        .start();
        let dispatch = Dispatch::new(
            RunId::generate(),
            Limits {
                max_workers: 4,
                max_nodes: usize::MAX,
                ..Limits::default()
            },
            vec![WorkerProfile::new("general", &[], 1)],
            Graph.start().recipient(),
            agent.clone().recipient(),
            agent.clone().recipient(),
        )
        .start();
        agent.send(Wire(dispatch.clone())).await.unwrap();
        let ready = tasks(n);
        let started = Instant::now();
        dispatch.do_send(ToDispatch::Ready(ready));
        finished.await.unwrap();
        started.elapsed()
    })
}

fn per_task(c: &mut Criterion) {
    let mut group = c.benchmark_group("dispatch_hand_out_per_task");
    group.sample_size(10);
    for n in SIZES {
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += hand_out(n) / n as u32;
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group!(benches, per_task);
criterion_main!(benches);
