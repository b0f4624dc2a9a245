//! Task graph costs that must not grow with the run (ARCHITECTURE.md, invariant 6):
//! validating and inserting a 10-subtask proposal, and the frontier update after one
//! completion, in graphs of 1k, 10k and 100k tasks.
//!
//! Run with `cargo bench -p flotilla-actors --bench task_graph`. Each measured operation runs
//! on a copy of a prebuilt graph that is refreshed (untimed) before it has grown by 10%, so
//! the graph size stays within 10% of the nominal one.

// Test code: a failed unwrap is a failed test (the lint policy, ADR-027).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use flotilla_actors::config::Limits;
use flotilla_actors::graph::RunGraph;
use flotilla_actors::protocol::{
    DecompositionReason, DependencyRef, EventKind, ProposedSubplan, Route, StopCondition,
    SubtaskProposal, TaskCompleted, TaskId, TaskSpec,
};

const SIZES: [usize; 3] = [1_000, 10_000, 100_000];

fn unbounded() -> Limits {
    Limits {
        max_nodes: usize::MAX,
        max_decompositions_per_run: u32::MAX,
        ..Limits::default()
    }
}

fn run(graph: &mut RunGraph, id: &TaskId) {
    graph.dispatched(id, 1, "bench", Route::Worker).unwrap();
    graph.started(id, 1).unwrap();
}

/// `n` independent root tasks, all running; task `i` owns directory `d{i}`.
fn running_roots(n: usize) -> RunGraph {
    let mut graph = RunGraph::new(unbounded());
    let specs = (0..n)
        .map(|i| TaskSpec::new(format!("task {i}"), &[&format!("d{i}")]))
        .collect();
    graph.submit(specs).unwrap();
    for i in 1..=n as u32 {
        run(&mut graph, &TaskId::root(i));
    }
    graph
}

/// `n` tasks in pairs: `a` running, `b` pending on `a`.
fn running_pairs(n: usize) -> RunGraph {
    let mut graph = RunGraph::new(unbounded());
    let mut specs = Vec::with_capacity(n);
    for i in 0..n / 2 {
        specs.push(TaskSpec::new(format!("a {i}"), &[&format!("a{i}")]));
        let mut b = TaskSpec::new(format!("b {i}"), &[&format!("b{i}")]);
        b.dependencies = vec![DependencyRef::Batch(2 * i)];
        specs.push(b);
    }
    graph.submit(specs).unwrap();
    for i in 0..n / 2 {
        run(&mut graph, &TaskId::root(2 * i as u32 + 1));
    }
    graph
}

fn proposal(parent: u32) -> TaskCompleted {
    let subtasks = (0..10)
        .map(|j| {
            let sub = SubtaskProposal::new(
                format!("part {j}"),
                &[&format!("d{}/part{j}.rs", parent - 1)],
            );
            if j > 0 { sub.after(&[j - 1]) } else { sub }
        })
        .collect();
    TaskCompleted {
        task: TaskId::root(parent),
        attempt: 1,
        handoff: None,
        artifacts: Vec::new(),
        subplan: Some(ProposedSubplan {
            parent: TaskId::root(parent),
            reason: DecompositionReason::TooLarge,
            subtasks,
            stop_when: StopCondition::AllSubtasksComplete,
        }),
    }
}

fn completion(task: u32) -> TaskCompleted {
    TaskCompleted {
        task: TaskId::root(task),
        attempt: 1,
        handoff: None,
        artifacts: Vec::new(),
        subplan: None,
    }
}

/// Times `op(graph, k)` for k = 0, 1, 2, … on fresh copies of `base`, `per_copy` ops a copy.
fn measure(
    base: &RunGraph,
    per_copy: usize,
    iters: u64,
    mut op: impl FnMut(&mut RunGraph, usize) -> Vec<EventKind>,
) -> Duration {
    // Room for everything the copy will grow by: amortized reallocation of a 100k-node
    // graph is real but belongs to growth, not to one step.
    let fresh = || {
        let mut graph = base.clone();
        graph.reserve(per_copy * 10);
        graph
    };
    let mut total = Duration::ZERO;
    let mut graph = fresh();
    let mut k = 0;
    for _ in 0..iters {
        if k == per_copy {
            graph = fresh();
            k = 0;
        }
        let start = Instant::now();
        let events = op(&mut graph, k);
        total += start.elapsed();
        black_box(events);
        k += 1;
    }
    total
}

fn subplan_insert(c: &mut Criterion) {
    let mut group = c.benchmark_group("validate_and_insert_10_subtasks");
    for n in SIZES {
        let base = running_roots(n);
        // Sanity, untimed: the proposal is accepted.
        let events = base.clone().complete(proposal(1)).unwrap();
        assert!(
            events
                .iter()
                .any(|e| matches!(e, EventKind::DecompositionAccepted { .. }))
        );
        let per_copy = (n / 100).max(1);
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter_custom(|iters| {
                measure(&base, per_copy, iters, |g, k| {
                    g.complete(proposal(k as u32 + 1)).unwrap()
                })
            })
        });
    }
    group.finish();
}

fn frontier_update(c: &mut Criterion) {
    let mut group = c.benchmark_group("frontier_update_after_completion");
    for n in SIZES {
        let base = running_pairs(n);
        let events = base.clone().complete(completion(1)).unwrap();
        assert!(
            events
                .iter()
                .any(|e| matches!(e, EventKind::TaskReady { .. }))
        );
        let per_copy = (n / 20).max(1);
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter_custom(|iters| {
                measure(&base, per_copy, iters, |g, k| {
                    g.complete(completion(2 * k as u32 + 1)).unwrap()
                })
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = subplan_insert, frontier_update
}
criterion_main!(benches);
