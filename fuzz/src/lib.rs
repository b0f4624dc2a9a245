//! What the fuzz targets share: the task graph's invariants, checked after every change.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use flotilla_actors::graph::RunGraph;
use flotilla_actors::protocol::{EventKind, TaskId, TaskState};
use petgraph::graph::DiGraph;

/// `to` can be reached from `from` by zero or more moves of the transition table (one
/// command may move a task several times: Running → Ready → … is one retry).
pub fn reachable(from: TaskState, to: TaskState) -> bool {
    let mut seen = BTreeSet::from([from]);
    let mut todo = vec![from];
    while let Some(s) = todo.pop() {
        for &(a, b) in TaskState::TRANSITIONS {
            if a == s && seen.insert(b) {
                todo.push(b);
            }
        }
    }
    seen.contains(&to)
}

/// Watches one graph through a run: the events it emitted so far (its journal) and the state
/// every task was last seen in.
#[derive(Default)]
pub struct Watch {
    pub journal: Vec<EventKind>,
    seen: BTreeMap<TaskId, TaskState>,
}

impl Drop for Watch {
    /// With `FLOTILLA_FUZZ_EVENTS=1`, prints the kinds of events each input produced: run a
    /// target over its corpus (`-runs=0`) to see which parts of the graph it reaches.
    fn drop(&mut self) {
        static SHOW: OnceLock<bool> = OnceLock::new();
        if *SHOW.get_or_init(|| std::env::var_os("FLOTILLA_FUZZ_EVENTS").is_some()) {
            let kinds: BTreeSet<&str> = self.journal.iter().map(EventKind::name).collect();
            eprintln!(
                "events: {}",
                kinds.into_iter().collect::<Vec<_>>().join(" ")
            );
        }
    }
}

impl Watch {
    /// Records what a command emitted and checks every invariant. A command that returns an
    /// error is a bug: commands validate and only emit events that apply.
    pub fn after<E: std::fmt::Debug>(
        &mut self,
        graph: &RunGraph,
        what: &str,
        result: Result<Vec<EventKind>, E>,
    ) {
        let events = result.unwrap_or_else(|e| panic!("{what} failed: {e:?}"));
        self.journal.extend(events);
        self.check(graph);
    }

    pub fn check(&mut self, graph: &RunGraph) {
        let limits = graph.limits();
        assert!(
            graph.len() <= limits.max_nodes,
            "{} tasks, max_nodes {}",
            graph.len(),
            limits.max_nodes
        );
        let snapshot = graph.snapshot();

        // Acyclic: dependencies, rebuilt from the snapshot alone.
        let mut dag = DiGraph::<(), ()>::new();
        let ix: BTreeMap<&TaskId, _> = snapshot
            .tasks
            .iter()
            .map(|t| (&t.id, dag.add_node(())))
            .collect();
        assert_eq!(ix.len(), snapshot.tasks.len(), "duplicate task ids");
        for t in &snapshot.tasks {
            for d in &t.depends_on {
                let from = ix
                    .get(d)
                    .unwrap_or_else(|| panic!("{} depends on unknown {d}", t.id));
                dag.add_edge(*from, ix[&t.id], ());
            }
        }
        assert!(
            !petgraph::algo::is_cyclic_directed(&dag),
            "dependency cycle"
        );

        let mut live = 0;
        for t in &snapshot.tasks {
            assert!(
                t.id.depth() <= limits.max_depth,
                "{} deeper than max_depth {}",
                t.id,
                limits.max_depth
            );
            assert_eq!(t.parent, t.id.parent(), "{}'s parent", t.id);
            if let Some(p) = &t.parent {
                assert!(ix.contains_key(p), "{}'s parent {p} is missing", t.id);
            }
            // Every state is reached by the transition table: from Pending for a new task,
            // from where it was last seen otherwise (so nothing leaves a terminal state).
            let before = self.seen.insert(t.id.clone(), t.state);
            let from = before.unwrap_or(TaskState::Pending);
            assert!(
                reachable(from, t.state),
                "{}: {from} -> {} is not in the transition table",
                t.id,
                t.state
            );
            if !t.state.is_terminal() {
                live += 1;
            }
        }
        assert_eq!(graph.live_tasks(), live, "live-task count");
        assert_eq!(self.seen.len(), snapshot.tasks.len(), "a task disappeared");

        // The graph is a fold of its events: the journal, through its JSON encoding and back,
        // rebuilds the same graph.
        let back: Vec<EventKind> = self
            .journal
            .iter()
            .map(|e| {
                let json = serde_json::to_string(e).expect("every event serializes");
                serde_json::from_str(&json)
                    .unwrap_or_else(|err| panic!("{} does not read back: {err}\n{json}", e.name()))
            })
            .collect();
        assert_eq!(back, self.journal, "events change through JSON");
        let replayed = RunGraph::replay(limits.clone(), &back).expect("the journal replays");
        assert_eq!(replayed.snapshot(), snapshot, "replay differs");
        assert_eq!(replayed.live_tasks(), graph.live_tasks());
        assert_eq!(replayed.planner_calls(), graph.planner_calls());
        assert_eq!(replayed.is_quiescent(), graph.is_quiescent());
        for t in graph.tasks() {
            let r = replayed.task(&t.id).expect("replayed task");
            let fields = |n: &flotilla_actors::graph::TaskNode| {
                (
                    (
                        n.atomic,
                        n.subplanned,
                        n.decomposition_open,
                        n.subplanner_calls,
                        n.unheard.clone(),
                    ),
                    n.attempt,
                    n.decompositions,
                    n.proposals_this_attempt,
                    n.rejections_this_attempt,
                    n.uncharged_attempts,
                    n.critical_path,
                    n.created,
                    n.reported_since_report,
                    n.stop_when,
                    n.artifacts.clone(),
                    n.scope.clone(),
                )
            };
            assert_eq!(fields(r), fields(t), "replayed {} differs", t.id);
            assert_eq!(replayed.ready_task(&t.id), graph.ready_task(&t.id));
            let stored: Vec<&str> = t.scope.iter().map(|p| p.as_str()).collect();
            assert_eq!(
                t.spec.scope, stored,
                "{}'s spec and parsed scope differ",
                t.id
            );
            // Stored scopes are normalized: they parse to themselves.
            for p in &t.scope {
                let again = flotilla_actors::protocol::ScopePath::parse(p.as_str(), usize::MAX);
                assert_eq!(
                    again.as_ref(),
                    Ok(p),
                    "scope {p} of {} does not re-parse",
                    t.id
                );
            }
        }
    }
}
