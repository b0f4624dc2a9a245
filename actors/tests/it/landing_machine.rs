//! Every run ends (M8b item 3): a seeded generator of interleavings over the landing state
//! machine. The graph is driven as the actors drive it: workers deliver (with commits, with
//! none, or fail), the merge queue lands, reports conflicts, gate failures and git
//! failures for what it holds, sweeps answer finalization rounds, and the daemon is killed
//! and restarted from the journal at random points. Whatever the order, the run must reach
//! an outcome, and while it has none something must be able to move it on: a task left
//! `Landing` with nothing in the queue for it, or `Synthesizing` with nobody asked, would
//! be a run that never ends.

use std::collections::BTreeSet;

use flotilla_actors::config::Limits;
use flotilla_actors::graph::RunGraph;
use flotilla_actors::protocol::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::harness::spec;

/// The world around the graph: the journal, the merge queue's content, running attempts.
struct World {
    g: RunGraph,
    journal: Vec<EventKind>,
    /// Tasks whose branch waits in the merge queue.
    queue: BTreeSet<TaskId>,
    /// Attempts dispatched and not yet reported.
    running: BTreeSet<(TaskId, u32)>,
    restarts: u32,
    commits: u64,
}

fn limits() -> Limits {
    Limits {
        max_conflict_fixes: 4,
        max_attempts: 3,
        max_finalization_attempts: 2,
        ..Limits::default()
    }
}

impl World {
    fn new(tasks: usize) -> Self {
        let mut w = World {
            g: RunGraph::new(limits()).merging(),
            journal: Vec::new(),
            queue: BTreeSet::new(),
            running: BTreeSet::new(),
            restarts: 0,
            commits: 0,
        };
        let specs = (0..tasks)
            .map(|i| spec(&format!("task {i}"), &[&format!("src/{i}.rs")]))
            .collect();
        let events = w.g.submit(specs).unwrap();
        w.take(events);
        let events = w.g.planning_finished().unwrap();
        w.take(events);
        w
    }

    /// Journals what a command emitted and does what the TaskGraph actor does with it.
    fn take(&mut self, events: Vec<EventKind>) {
        for e in &events {
            match e {
                EventKind::TaskLanding { task, .. } | EventKind::LandingRequeued { task, .. } => {
                    self.queue.insert(task.clone());
                }
                _ => {}
            }
        }
        self.journal.extend(events);
    }

    fn state(&self, t: &TaskId) -> TaskState {
        self.g.task(t).unwrap().state
    }

    fn attempt(&self, t: &TaskId) -> u32 {
        self.g.task(t).unwrap().attempt
    }

    /// The moves possible now, each a closure's worth of description.
    fn moves(&self) -> Vec<Move> {
        let mut moves = Vec::new();
        for t in self.g.tasks_in(TaskState::Ready) {
            moves.push(Move::Dispatch(t));
        }
        for (t, a) in &self.running {
            moves.push(Move::Report(t.clone(), *a));
        }
        for t in &self.queue {
            if self.state(t) == TaskState::Landing {
                moves.push(Move::Verdict(t.clone()));
            }
        }
        if let Some(attempt) = self.g.awaiting_final_sweep() {
            moves.push(Move::Sweep(attempt));
        }
        if self.restarts < 4 {
            moves.push(Move::Restart);
        }
        moves
    }

    fn play(&mut self, m: Move, rng: &mut ChaCha8Rng) {
        match m {
            Move::Dispatch(t) => {
                let a = self.attempt(&t);
                let mut events = self.g.dispatched(&t, a, "general", Route::Worker).unwrap();
                events.extend(self.g.started(&t, a).unwrap());
                self.take(events);
                self.running.insert((t, a));
            }
            Move::Report(t, a) => {
                self.running.remove(&(t.clone(), a));
                let roll = rng.gen_range(0..10);
                let events = if roll < 2 {
                    let failure = AttemptFailure::Crashed {
                        detail: "boom".into(),
                    };
                    self.g.failed(&t, a, failure).unwrap()
                } else {
                    // A conflict fix finds nothing to resolve now and then; other work
                    // sometimes has no commits.
                    let empty = if t.is_fix() { roll < 5 } else { roll == 9 };
                    self.g.complete(delivery(&t, a, !empty)).unwrap()
                };
                self.take(events);
            }
            Move::Verdict(t) => {
                self.queue.remove(&t);
                let a = self.attempt(&t);
                let roll = rng.gen_range(0..10);
                let events = if roll < 5 {
                    self.commits += 1;
                    let commit = format!("c{}", self.commits);
                    self.g.landed(&t, a, &commit).unwrap()
                } else if roll < 8 {
                    self.g
                        .landing_conflict(&t, a, vec!["src/shared.rs".into()], Vec::new())
                        .unwrap()
                } else if roll < 9 {
                    let failure = LandingFailure::GateFailed {
                        command: "gate".into(),
                        output_tail: "red".into(),
                    };
                    self.g.landing_failed(&t, a, failure).unwrap()
                } else {
                    let failure = LandingFailure::Git {
                        detail: "branch gone".into(),
                    };
                    self.g.landing_failed(&t, a, failure).unwrap()
                };
                self.take(events);
            }
            Move::Sweep(attempt) => {
                let green = rng.gen_bool(0.6);
                let fixes = if green {
                    Vec::new()
                } else {
                    vec![SweepFix {
                        title: "red".into(),
                        description: "src/x.rs:1:1: error".into(),
                        scope: vec!["src/x.rs".into()],
                        signature: format!("sig{}", rng.gen_range(0..3)),
                        class: "compile error".into(),
                        worded: None,
                    }]
                };
                let report = SweepReport {
                    sweep: attempt,
                    commit: self.g.main_tip().unwrap_or_default(),
                    green,
                    class: (!green).then(|| "compile error".into()),
                    failures: fixes.len(),
                    fixes,
                    duration_ms: 1,
                    finalization: Some(attempt),
                    wording: None,
                };
                let events = self.g.sweep_finished(report).unwrap();
                self.take(events);
            }
            Move::Restart => {
                // kill -9: the graph comes back from the journal; the queue is rebuilt from
                // it (as `TaskGraph::resume` does), running attempts are interrupted.
                self.restarts += 1;
                self.g = RunGraph::new(limits())
                    .merging()
                    .replayed(&self.journal)
                    .unwrap();
                self.running.clear();
                let events = self.g.interrupt_in_flight().unwrap();
                self.take(events);
                self.queue = self.g.landing_tasks().into_iter().collect();
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Move {
    Dispatch(TaskId),
    Report(TaskId, u32),
    Verdict(TaskId),
    Sweep(u32),
    Restart,
}

fn delivery(t: &TaskId, attempt: u32, commits: bool) -> TaskCompleted {
    let mut h = Handoff::complete("done");
    h.work = Some(Box::new(BranchWork {
        branch: format!("flotilla/run/{t}-a{attempt}"),
        base: "base".into(),
        head: if commits {
            format!("head-{t}-{attempt}")
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
    TaskCompleted {
        task: t.clone(),
        attempt,
        handoff: Some(h),
        artifacts: Vec::new(),
        subplan: None,
    }
}

/// Plays one seeded interleaving to its end; the moves made, for a failure's message.
fn play(seed: u64) -> Vec<Move> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut w = World::new(rng.gen_range(1..=5));
    let mut trace = Vec::new();
    for _ in 0..10_000 {
        if w.g.outcome().is_some() {
            return trace;
        }
        let moves = w.moves();
        // Restart is always possible while restarts remain; without it, something else
        // must be.
        let progress: Vec<&Move> = moves
            .iter()
            .filter(|m| !matches!(m, Move::Restart))
            .collect();
        assert!(
            !progress.is_empty(),
            "seed {seed}: stuck with no outcome; tasks: {:?}\nqueue: {:?}\nmoves: {trace:?}",
            w.g.snapshot()
                .tasks
                .iter()
                .map(|t| (t.id.to_string(), t.state))
                .collect::<Vec<_>>(),
            w.queue
        );
        let m = moves[rng.gen_range(0..moves.len())].clone();
        trace.push(m.clone());
        w.play(m, &mut rng);
    }
    panic!("seed {seed}: no outcome after 10 000 moves: {trace:?}");
}

#[test]
fn every_generated_interleaving_of_landings_conflicts_fixes_and_restarts_ends() {
    let mut longest = 0;
    for seed in 0..400 {
        longest = longest.max(play(seed).len());
    }
    eprintln!("longest interleaving: {longest} moves");
}
