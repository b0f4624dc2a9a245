//! Makespan on virtual time: how long a run's tasks take end to end with `W` workers under
//! Dispatch's order (critical path first) compared with first-in-first-out.
//!
//! A workload is a seeded random DAG shaped like planner output (see [`Workload`]) with
//! log-normal task durations. The DAG goes into the real [`RunGraph`], so readiness comes
//! from the graph's one readiness rule and each ready task's critical path is the one the
//! graph maintains. A discrete-event simulation then runs it on virtual time: whenever a
//! worker is free and tasks are ready, it starts the first ready task in the policy's
//! order; at a task's end it reports the completion to the graph and queues the tasks the
//! graph reports ready. Nothing sleeps: virtual time is integer milliseconds.
//!
//! The yardstick is the lower bound no schedule can beat: `max(critical path, total work /
//! W)`, where the critical path is the longest chain *by duration*. Dispatch does not know
//! durations: the graph's critical path counts tasks on the longest chain, so "critical
//! path first" here is what Dispatch actually does, not an oracle.
//!
//! Scope locks play no part: every task has a scope of its own.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use flotilla_actors::actors::{DispatchOrder, dispatch_order};
use flotilla_actors::config::Limits;
use flotilla_actors::graph::{GraphError, RunGraph};
use flotilla_actors::protocol::{
    Budget, DependencyRef, EventKind, RejectionReason, Route, TaskCompleted, TaskId, TaskSpec, Usd,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal};

/// One simulated run: a random DAG, its durations and the number of workers.
///
/// The DAG is layered, like a planner's batches: tasks are created in order and split into
/// `layers` layers of (almost) equal size. A task of the first layer depends on nothing; a
/// task of a later layer depends on 0 to `max_deps` tasks (uniformly many, duplicates
/// dropped), each picked uniformly from the `reach` layers before its own. Dependencies
/// only point backwards, so the DAG is acyclic, and creation order is a topological order.
/// Tasks without dependencies in later layers are the independent work a planner also
/// emits. Many layers of few tasks make a deep, narrow DAG (critical path bound); few
/// layers of many tasks a wide one (work bound).
///
/// Durations are log-normal with median `median_secs` and shape `sigma` (the standard
/// deviation of the log): at `sigma = 1`, one task in twenty takes over 5× the median.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub name: String,
    pub tasks: usize,
    pub workers: usize,
    pub seed: u64,
    /// Layers the tasks are split into (at least 1).
    pub layers: usize,
    /// Most dependencies one task has.
    pub max_deps: usize,
    /// How many layers back a dependency may reach (at least 1).
    pub reach: usize,
    pub median_secs: f64,
    pub sigma: f64,
}

impl Workload {
    /// A layered workload with the defaults: 0–3 dependencies reaching 2 layers back,
    /// median 60 s, sigma 1.0.
    pub fn layered(name: &str, tasks: usize, workers: usize, layers: usize, seed: u64) -> Self {
        Workload {
            name: name.into(),
            tasks,
            workers,
            seed,
            layers,
            max_deps: 3,
            reach: 2,
            median_secs: 60.0,
            sigma: 1.0,
        }
    }
}

/// The workloads `flotilla bench` simulates: 200 to 2,000 tasks on 4 to 32 workers, with
/// layers about three times as wide as the worker count (plenty to choose from, but the
/// chain still matters), and one deep, narrow DAG whose layers are hardly wider than the
/// worker count.
pub fn default_workloads() -> Vec<Workload> {
    vec![
        Workload::layered("layered-200x4", 200, 4, 16, 1),
        Workload::layered("layered-500x8", 500, 8, 20, 2),
        Workload::layered("layered-1000x16", 1_000, 16, 20, 3),
        Workload::layered("layered-2000x32", 2_000, 32, 20, 4),
        Workload {
            reach: 1,
            ..Workload::layered("deep-1000x8", 1_000, 8, 100, 5)
        },
    ]
}

/// The order in which a free worker takes ready tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Exactly Dispatch's order ([`dispatch_order`]): priority, then the longest chain of
    /// tasks still ahead, then age.
    CriticalPath,
    /// The order tasks became ready; tasks that became ready at the same moment by age.
    Fifo,
}

impl Policy {
    pub const ALL: [Policy; 2] = [Policy::CriticalPath, Policy::Fifo];

    pub fn as_str(self) -> &'static str {
        match self {
            Policy::CriticalPath => "critical_path",
            Policy::Fifo => "fifo",
        }
    }
}

/// One policy on one workload.
#[derive(Debug, Clone, PartialEq)]
pub struct MakespanRow {
    pub workload: String,
    pub tasks: usize,
    pub workers: usize,
    pub seed: u64,
    pub policy: Policy,
    pub makespan_secs: f64,
    /// `max(critical_path_secs, total_work_secs / workers)`.
    pub lower_bound_secs: f64,
    /// The longest chain by duration.
    pub critical_path_secs: f64,
    pub total_work_secs: f64,
    pub makespan_over_lower_bound: f64,
    /// Real time the simulation took, building the graph included.
    pub elapsed: Duration,
}

/// Simulates `workload` under each policy, on the same DAG and durations.
pub fn run(workload: &Workload) -> Result<Vec<MakespanRow>, MakespanError> {
    let dag = Dag::generate(workload)?;
    let critical_path = dag.critical_path_ms();
    let total_work: u64 = dag.durations_ms.iter().sum();
    let lower_bound = lower_bound_ms(critical_path, total_work, workload.workers);
    Policy::ALL
        .into_iter()
        .map(|policy| {
            let start = Instant::now();
            let outcome =
                simulate(&dag, workload.workers, Order::Policy(policy)).map_err(|source| {
                    MakespanError::Simulation {
                        workload: workload.name.clone(),
                        policy: policy.as_str(),
                        source,
                    }
                })?;
            Ok(MakespanRow {
                workload: workload.name.clone(),
                tasks: workload.tasks,
                workers: workload.workers,
                seed: workload.seed,
                policy,
                makespan_secs: secs(outcome.makespan_ms),
                lower_bound_secs: lower_bound / 1000.0,
                critical_path_secs: secs(critical_path),
                total_work_secs: secs(total_work),
                makespan_over_lower_bound: outcome.makespan_ms as f64 / lower_bound,
                elapsed: start.elapsed(),
            })
        })
        .collect()
}

/// Why a workload could not be simulated.
#[derive(Debug, thiserror::Error)]
pub enum MakespanError {
    #[error("{workload}: tasks, workers, layers and reach must be positive")]
    NotPositive { workload: String },
    #[error("{workload}: durations: {source}")]
    Durations {
        workload: String,
        #[source]
        source: rand_distr::NormalError,
    },
    #[error("{workload} ({policy}): {source}")]
    Simulation {
        workload: String,
        policy: &'static str,
        #[source]
        source: SimulationError,
    },
}

/// Where a simulation went wrong: the graph refused what a run would do, or did not do
/// what it must (each a bug of the graph or the simulation, said with the task).
#[derive(Debug, thiserror::Error)]
pub enum SimulationError {
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error("the graph refused the tasks: {0:?}")]
    Refused(RejectionReason),
    #[error("task {0} is missing")]
    Missing(TaskId),
    #[error("task {task} is not the batch's task {index}")]
    NotInBatchOrder { task: TaskId, index: usize },
    #[error("ready task {0} is missing")]
    ReadyMissing(TaskId),
    #[error("unknown task {0} became ready")]
    UnknownReady(TaskId),
    #[error("task {task} did not complete: {events:?}")]
    NotCompleted {
        task: TaskId,
        events: Vec<EventKind>,
    },
    #[error("{completed} of {tasks} tasks completed; {queued} still queued")]
    Unfinished {
        completed: usize,
        tasks: usize,
        queued: usize,
    },
}

fn secs(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

/// In milliseconds, not rounded: `total / workers` is seldom whole.
fn lower_bound_ms(critical_path: u64, total_work: u64, workers: usize) -> f64 {
    (critical_path as f64).max(total_work as f64 / workers.max(1) as f64)
}

/// A DAG in creation order: `deps[i]` are earlier tasks than `i`.
#[derive(Debug, Clone, PartialEq)]
struct Dag {
    deps: Vec<Vec<usize>>,
    durations_ms: Vec<u64>,
}

impl Dag {
    fn generate(w: &Workload) -> Result<Dag, MakespanError> {
        if w.tasks == 0 || w.workers == 0 || w.layers == 0 || w.reach == 0 {
            return Err(MakespanError::NotPositive {
                workload: w.name.clone(),
            });
        }
        let lognormal = LogNormal::new(w.median_secs.ln(), w.sigma).map_err(|source| {
            MakespanError::Durations {
                workload: w.name.clone(),
                source,
            }
        })?;
        let mut rng = ChaCha8Rng::seed_from_u64(w.seed);
        let layers = w.layers.min(w.tasks);
        // Layer `l` holds tasks `start(l)..start(l + 1)`.
        let start = |l: usize| l * w.tasks / layers;
        let mut deps = Vec::with_capacity(w.tasks);
        let mut durations_ms = Vec::with_capacity(w.tasks);
        for l in 0..layers {
            let earliest = start(l.saturating_sub(w.reach));
            for _ in start(l)..start(l + 1) {
                let mut mine = BTreeSet::new();
                if l > 0 {
                    for _ in 0..rng.gen_range(0..=w.max_deps) {
                        mine.insert(rng.gen_range(earliest..start(l)));
                    }
                }
                deps.push(mine.into_iter().collect());
                let secs: f64 = lognormal.sample(&mut rng);
                durations_ms.push(((secs * 1000.0).round() as u64).max(1));
            }
        }
        Ok(Dag { deps, durations_ms })
    }

    /// The longest chain by duration: creation order is topological.
    fn critical_path_ms(&self) -> u64 {
        let mut finish = vec![0u64; self.deps.len()];
        for (i, deps) in self.deps.iter().enumerate() {
            let ready = deps.iter().map(|&d| finish[d]).max().unwrap_or(0);
            finish[i] = ready + self.durations_ms[i];
        }
        finish.into_iter().max().unwrap_or(0)
    }
}

/// How the simulation orders ready tasks: a public policy, or (for the tests' diagnostics)
/// an oracle that knows every duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Policy(Policy),
    /// Longest remaining chain *by duration* first: what critical-path dispatch could do if
    /// it knew how long tasks take.
    #[cfg_attr(not(test), allow(dead_code))]
    WeightedCriticalPath,
}

/// A ready task's place in the queue; only one kind is used in a simulation.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum QueueKey {
    Dispatch(DispatchOrder),
    Fifo {
        ready_ms: u64,
        created: u64,
    },
    Weighted {
        remaining_ms: Reverse<u64>,
        created: u64,
    },
}

#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    makespan_ms: u64,
    /// Virtual start time of each task, by creation index.
    started_ms: Vec<u64>,
    /// How many times each task was started.
    runs: Vec<u32>,
}

/// Submits `dag` to a fresh [`RunGraph`] and runs it to the end on `workers` workers.
fn simulate(dag: &Dag, workers: usize, order: Order) -> Result<Outcome, SimulationError> {
    let n = dag.deps.len();
    let unbounded = Budget::new(u64::MAX / 4, Usd::from_micros(u64::MAX / 4), u64::MAX / 4);
    let mut graph = RunGraph::new(Limits {
        max_nodes: n.saturating_add(16),
        max_workers: workers,
        run_budget: unbounded,
        ..Limits::default()
    });
    let specs = dag
        .deps
        .iter()
        .enumerate()
        .map(|(i, deps)| {
            let mut spec = TaskSpec::new(format!("simulated task {i}"), &[&format!("src/m{i}.rs")]);
            spec.dependencies = deps.iter().map(|&d| DependencyRef::Batch(d)).collect();
            spec
        })
        .collect();
    let submitted = graph.submit(specs)?;
    if let Some(EventKind::TasksRejected { reason }) = submitted
        .iter()
        .find(|e| matches!(e, EventKind::TasksRejected { .. }))
    {
        return Err(SimulationError::Refused(reason.clone()));
    }
    // The batch's i-th task is `t<i+1>` in a fresh graph.
    let ids: Vec<TaskId> = (0..n).map(|i| TaskId::root(i as u32 + 1)).collect();
    let index: HashMap<TaskId, usize> = ids.iter().cloned().zip(0..n).collect();
    for (i, id) in ids.iter().enumerate() {
        let node = graph
            .task(id)
            .ok_or_else(|| SimulationError::Missing(id.clone()))?;
        if node.spec.description != format!("simulated task {i}") {
            return Err(SimulationError::NotInBatchOrder {
                task: id.clone(),
                index: i,
            });
        }
    }
    let remaining = match order {
        Order::WeightedCriticalPath => remaining_ms(dag),
        Order::Policy(_) => Vec::new(),
    };

    let mut queue: BTreeSet<(QueueKey, usize)> = BTreeSet::new();
    let enqueue = |queue: &mut BTreeSet<(QueueKey, usize)>,
                   graph: &RunGraph,
                   events: &[EventKind],
                   now: u64|
     -> Result<(), SimulationError> {
        for event in events {
            let EventKind::TaskReady { task } = event else {
                continue;
            };
            let ready = graph
                .ready_task(task)
                .ok_or_else(|| SimulationError::ReadyMissing(task.clone()))?;
            let i = *index
                .get(task)
                .ok_or_else(|| SimulationError::UnknownReady(task.clone()))?;
            let key = match order {
                Order::Policy(Policy::CriticalPath) => QueueKey::Dispatch(dispatch_order(&ready)),
                Order::Policy(Policy::Fifo) => QueueKey::Fifo {
                    ready_ms: now,
                    created: ready.created,
                },
                Order::WeightedCriticalPath => QueueKey::Weighted {
                    remaining_ms: Reverse(remaining[i]),
                    created: ready.created,
                },
            };
            queue.insert((key, i));
        }
        Ok(())
    };
    enqueue(&mut queue, &graph, &submitted, 0)?;

    // Running tasks by end time (ties by creation index).
    let mut running: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut started_ms = vec![0u64; n];
    let mut runs = vec![0u32; n];
    let mut completed = 0usize;
    let mut now = 0u64;
    loop {
        while running.len() < workers {
            let Some((_, i)) = queue.pop_first() else {
                break;
            };
            let id = &ids[i];
            graph.dispatched(id, 1, "general", Route::Worker)?;
            graph.started(id, 1)?;
            started_ms[i] = now;
            runs[i] += 1;
            running.push(Reverse((now + dag.durations_ms[i], i)));
        }
        let Some(&Reverse((end, _))) = running.peek() else {
            break;
        };
        now = end;
        // Every task ending now ends before any worker picks again.
        while let Some(&Reverse((end, i))) = running.peek() {
            if end != now {
                break;
            }
            running.pop();
            let events = graph.complete(TaskCompleted {
                task: ids[i].clone(),
                attempt: 1,
                handoff: None,
                artifacts: Vec::new(),
                subplan: None,
            })?;
            if !events
                .iter()
                .any(|e| matches!(e, EventKind::TaskCompleted { task, .. } if *task == ids[i]))
            {
                return Err(SimulationError::NotCompleted {
                    task: ids[i].clone(),
                    events,
                });
            }
            completed += 1;
            enqueue(&mut queue, &graph, &events, now)?;
        }
    }
    if completed != n {
        return Err(SimulationError::Unfinished {
            completed,
            tasks: n,
            queued: queue.len(),
        });
    }
    Ok(Outcome {
        makespan_ms: now,
        started_ms,
        runs,
    })
}

/// Each task's longest chain by duration from its start to a sink, itself included.
fn remaining_ms(dag: &Dag) -> Vec<u64> {
    let n = dag.deps.len();
    let mut remaining = dag.durations_ms.clone();
    for i in (0..n).rev() {
        for &d in &dag.deps[i] {
            remaining[d] = remaining[d].max(dag.durations_ms[d] + remaining[i]);
        }
    }
    remaining
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ratio(dag: &Dag, workers: usize, order: Order) -> f64 {
        let outcome = simulate(dag, workers, order).unwrap();
        let total: u64 = dag.durations_ms.iter().sum();
        outcome.makespan_ms as f64 / lower_bound_ms(dag.critical_path_ms(), total, workers)
    }

    #[test]
    fn the_same_seed_gives_the_same_workload_and_makespans() {
        let w = Workload::layered("small", 300, 6, 10, 42);
        assert_eq!(Dag::generate(&w).unwrap(), Dag::generate(&w).unwrap());
        let other = Workload {
            seed: 43,
            ..w.clone()
        };
        assert_ne!(Dag::generate(&w).unwrap(), Dag::generate(&other).unwrap());
        let strip = |rows: Vec<MakespanRow>| -> Vec<(Policy, f64, f64)> {
            rows.into_iter()
                .map(|r| (r.policy, r.makespan_secs, r.lower_bound_secs))
                .collect()
        };
        assert_eq!(strip(run(&w).unwrap()), strip(run(&w).unwrap()));
    }

    #[test]
    fn generated_dags_point_backwards_with_at_most_max_deps() {
        let w = Workload::layered("small", 500, 8, 25, 7);
        let dag = Dag::generate(&w).unwrap();
        assert_eq!(dag.deps.len(), 500);
        for (i, deps) in dag.deps.iter().enumerate() {
            assert!(deps.len() <= w.max_deps);
            assert!(deps.iter().all(|&d| d < i));
            // The first layer depends on nothing; a task reaches at most `reach` layers back.
            let layer = i * w.layers / w.tasks;
            assert!(layer > 0 || deps.is_empty());
            assert!(
                deps.iter()
                    .all(|&d| layer - d * w.layers / w.tasks <= w.reach)
            );
        }
        assert!(dag.durations_ms.iter().all(|&d| d >= 1));
    }

    #[test]
    fn a_chain_takes_exactly_its_critical_path() {
        let n = 50;
        let dag = Dag {
            deps: (0..n)
                .map(|i| if i == 0 { vec![] } else { vec![i - 1] })
                .collect(),
            durations_ms: (0..n as u64).map(|i| 1_000 + 37 * i).collect(),
        };
        for policy in Policy::ALL {
            let outcome = simulate(&dag, 4, Order::Policy(policy)).unwrap();
            assert_eq!(outcome.makespan_ms, dag.critical_path_ms());
            assert_eq!(ratio(&dag, 4, Order::Policy(policy)), 1.0);
        }
    }

    #[test]
    fn independent_equal_tasks_take_whole_rounds() {
        let (n, w, d) = (10usize, 4usize, 60_000u64);
        let dag = Dag {
            deps: vec![Vec::new(); n],
            durations_ms: vec![d; n],
        };
        for policy in Policy::ALL {
            let outcome = simulate(&dag, w, Order::Policy(policy)).unwrap();
            assert_eq!(outcome.makespan_ms, n.div_ceil(w) as u64 * d);
        }
    }

    /// Four independent tasks created first, then a chain of four: FIFO runs the
    /// independent ones first and leaves the chain alone at the end; Dispatch's order
    /// starts the chain at once.
    #[test]
    fn critical_path_first_beats_fifo_when_the_chain_comes_last() {
        let mut deps = vec![Vec::new(); 5];
        deps.extend([vec![4], vec![5], vec![6]]);
        let dag = Dag {
            deps,
            durations_ms: vec![10_000; 8],
        };
        let cp = simulate(&dag, 2, Order::Policy(Policy::CriticalPath)).unwrap();
        let fifo = simulate(&dag, 2, Order::Policy(Policy::Fifo)).unwrap();
        assert_eq!(cp.makespan_ms, 40_000);
        assert_eq!(fifo.makespan_ms, 60_000);
        assert_eq!(ratio(&dag, 2, Order::Policy(Policy::CriticalPath)), 1.0);
        assert_eq!(ratio(&dag, 2, Order::Policy(Policy::Fifo)), 1.5);
        // The chain's head started first under Dispatch's order.
        assert_eq!(cp.started_ms[4], 0);
        assert_eq!(fifo.started_ms[4], 20_000);
    }

    #[test]
    fn every_task_runs_once_after_its_dependencies_and_never_beats_the_lower_bound() {
        for seed in 0..4 {
            let w = Workload::layered("small", 400, 6, 12, seed);
            let dag = Dag::generate(&w).unwrap();
            for order in [
                Order::Policy(Policy::CriticalPath),
                Order::Policy(Policy::Fifo),
                Order::WeightedCriticalPath,
            ] {
                let outcome = simulate(&dag, w.workers, order).unwrap();
                assert!(outcome.runs.iter().all(|&r| r == 1), "{order:?}");
                for (i, deps) in dag.deps.iter().enumerate() {
                    for &d in deps {
                        assert!(
                            outcome.started_ms[d] + dag.durations_ms[d] <= outcome.started_ms[i]
                        );
                    }
                }
                // No more than `workers` tasks at any start time.
                for &t in &outcome.started_ms {
                    let busy = (0..dag.deps.len())
                        .filter(|&i| {
                            outcome.started_ms[i] <= t
                                && t < outcome.started_ms[i] + dag.durations_ms[i]
                        })
                        .count();
                    assert!(busy <= w.workers);
                }
                assert!(ratio(&dag, w.workers, order) >= 1.0);
            }
        }
    }

    #[test]
    fn the_orders_differ_as_dispatch_and_fifo_do() {
        // Task 0 heads a chain of three; task 3 stands alone. One worker.
        let dag = Dag {
            deps: vec![vec![], vec![0], vec![1], vec![]],
            durations_ms: vec![1_000; 4],
        };
        // Dispatch: the longer chain first; at equal chains (tasks 2 and 3), the older. The
        // graph creates a batch's tasks in topological order (those without dependencies
        // first), so task 3 is older than task 2.
        let cp = simulate(&dag, 1, Order::Policy(Policy::CriticalPath)).unwrap();
        assert_eq!(cp.started_ms, vec![0, 1_000, 3_000, 2_000]);
        // FIFO: task 3 has been ready since 0, before task 1 became ready.
        let fifo = simulate(&dag, 1, Order::Policy(Policy::Fifo)).unwrap();
        assert_eq!(fifo.started_ms, vec![0, 2_000, 3_000, 1_000]);
    }

    /// The default workloads, printed as a table (run with `--nocapture`), with an oracle
    /// that knows the durations for comparison. Asserts only what must hold.
    #[test]
    fn default_workloads_report() {
        let start = Instant::now();
        eprintln!(
            "{:<18} {:>5} {:>3} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9}",
            "workload", "tasks", "W", "cp s", "work/W s", "LB s", "cp×", "fifo×", "oracle×", "ms"
        );
        for w in default_workloads() {
            let rows = run(&w).unwrap();
            let dag = Dag::generate(&w).unwrap();
            let oracle = ratio(&dag, w.workers, Order::WeightedCriticalPath);
            let (cp, fifo) = (&rows[0], &rows[1]);
            assert_eq!(
                (cp.policy, fifo.policy),
                (Policy::CriticalPath, Policy::Fifo)
            );
            eprintln!(
                "{:<18} {:>5} {:>3} {:>9.0} {:>9.0} {:>9.0} {:>8.3} {:>8.3} {:>8.3} {:>9.1}",
                w.name,
                w.tasks,
                w.workers,
                cp.critical_path_secs,
                cp.total_work_secs / w.workers as f64,
                cp.lower_bound_secs,
                cp.makespan_over_lower_bound,
                fifo.makespan_over_lower_bound,
                oracle,
                (cp.elapsed + fifo.elapsed).as_secs_f64() * 1e3,
            );
            for row in &rows {
                assert!(row.makespan_over_lower_bound >= 1.0, "{row:?}");
            }
        }
        eprintln!("all default workloads: {:?}", start.elapsed());
    }

    /// How the default shapes fare over many seeds and at other duration spreads (slow in a
    /// debug build):
    /// `cargo test --release --lib makespan::tests::seed_sweep -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn seed_sweep() {
        let seeds = 0..30u64;
        eprintln!(
            "{:<18} {:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10}",
            "shape",
            "sigma",
            "cp mean",
            "cp max",
            "fifo mean",
            "fifo max",
            "orc mean",
            "orc max",
            "cp>fifo",
            "cp>1.10"
        );
        for (sigma, base) in [0.5, 1.0, 1.5]
            .into_iter()
            .flat_map(|sigma| default_workloads().into_iter().map(move |w| (sigma, w)))
        {
            let base = Workload { sigma, ..base };
            let (mut cp, mut fifo, mut oracle) = (Vec::new(), Vec::new(), Vec::new());
            for seed in seeds.clone() {
                let w = Workload {
                    seed,
                    ..base.clone()
                };
                let dag = Dag::generate(&w).unwrap();
                cp.push(ratio(&dag, w.workers, Order::Policy(Policy::CriticalPath)));
                fifo.push(ratio(&dag, w.workers, Order::Policy(Policy::Fifo)));
                oracle.push(ratio(&dag, w.workers, Order::WeightedCriticalPath));
            }
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
            let max = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
            let worse = cp.iter().zip(&fifo).filter(|(c, f)| c > f).count();
            let over = cp.iter().filter(|&&c| c > 1.10).count();
            eprintln!(
                "{:<18} {:>5.1} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>7}/{} {:>7}/{}",
                base.name,
                sigma,
                mean(&cp),
                max(&cp),
                mean(&fifo),
                max(&fifo),
                mean(&oracle),
                max(&oracle),
                worse,
                cp.len(),
                over,
                cp.len(),
            );
        }
    }
}
