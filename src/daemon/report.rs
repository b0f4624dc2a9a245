//! Read models derived from a run's journal: the status summary (the wire type is
//! `api::status::RunStatus`). They replay the journal rather than ask the live actor, so
//! finished and running runs share one code path, and what the API shows is exactly what a
//! restart would rebuild (the graph exports are in `graph_export`).
//!
//! A journal that does not replay still gives a status (`damaged`).
//! `StatusReplay` carries a running run's replay between status calls (the API keeps at most
//! 16, never a finished run's), so a poll applies only the new events (ADR-014).

use std::collections::BTreeMap;

use flotilla_actors::config::Limits;
use flotilla_actors::graph::{GraphError, RunGraph};
use flotilla_actors::protocol::{Event, EventKind, GraphSnapshot, TaskId, TaskState};

use crate::api::runs::state_name;
use crate::api::status::{Counts, MainDivergence, ProviderPause, RunStatus};
use crate::journal::RunRecord;

/// The tasks whose latest word, after their latest decomposition, is that they wait for
/// the user's decision, and that still wait (as `decide` checks them).
/// Tasks that announced they wait for the user's decision after their latest
/// decomposition, and still wait for their subtasks.
fn awaiting_decision(asked: &BTreeMap<TaskId, bool>, graph: &GraphSnapshot) -> Vec<TaskId> {
    graph
        .tasks
        .iter()
        .filter(|t| {
            // A parent waiting for its subtasks, or a landing held for the user (ADR-016).
            matches!(t.state, TaskState::WaitingForSubtasks | TaskState::Landing)
                && asked.get(&t.id).copied().unwrap_or(false)
        })
        .map(|t| t.id.clone())
        .collect()
}

/// The run's status from its journal. A journal that does not replay still gives a status:
/// the graph as far as it replayed, the state `damaged` and the reason.
/// A run's status from its whole journal.
pub fn status(record: &RunRecord, limits: Limits, events: &[Event]) -> RunStatus {
    let mut replay = StatusReplay::new(limits);
    replay.apply(events);
    replay.status(record)
}

/// A status replay that can be carried forward: each status call applies only the events
/// after the last one it saw (`last_seq`), so polling a running run costs what happened
/// since the last poll, not its whole journal.
pub struct StatusReplay {
    graph: RunGraph,
    /// Per parent, whether its latest word was "waiting for your decision".
    asked: BTreeMap<TaskId, bool>,
    last_seq: u64,
    /// What the run's `RunStarted` says of its sandbox.
    sandbox: Option<String>,
    /// The last `MainDiverged`, until a `MainMoved` or `MainAdopted`.
    main_diverged: Option<MainDivergence>,
    /// Ongoing provider pauses, by provider.
    provider_pauses: BTreeMap<String, ProviderPause>,
    /// The first event that does not replay; nothing after it is applied (it still counts
    /// in `last_seq`).
    damage: Option<(u64, GraphError)>,
}

impl StatusReplay {
    pub fn new(limits: Limits) -> Self {
        StatusReplay {
            graph: RunGraph::new(limits),
            asked: BTreeMap::new(),
            last_seq: 0,
            sandbox: None,
            main_diverged: None,
            provider_pauses: BTreeMap::new(),
            damage: None,
        }
    }

    /// The seq of the last event applied: read the journal after it.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Whether more events can change what this replay says: the run has not ended and
    /// its journal replays.
    pub fn is_open(&self) -> bool {
        self.damage.is_none() && self.graph.outcome().is_none()
    }

    /// Applies `events`, which must follow the last one applied.
    pub fn apply(&mut self, events: &[Event]) {
        for e in events {
            if e.seq <= self.last_seq && self.last_seq > 0 {
                continue;
            }
            self.last_seq = e.seq;
            if self.damage.is_some() {
                continue;
            }
            match &e.kind {
                EventKind::AwaitingUserDecision { parent } => {
                    self.asked.insert(parent.clone(), true);
                }
                EventKind::DecompositionAccepted { parent, .. }
                | EventKind::LandingAllowed { task: parent } => {
                    self.asked.insert(parent.clone(), false);
                }
                EventKind::RunStarted { sandbox, .. } => self.sandbox = sandbox.clone(),
                EventKind::MainDiverged { expected, actual } => {
                    self.main_diverged = Some(MainDivergence {
                        expected: expected.clone(),
                        actual: actual.clone(),
                    });
                }
                EventKind::MainMoved { .. } | EventKind::MainAdopted { .. } => {
                    self.main_diverged = None
                }
                EventKind::ProviderPauseStarted {
                    provider,
                    role,
                    task,
                    until_ms,
                    why,
                } => {
                    let pause = ProviderPause {
                        provider: provider.clone(),
                        role: *role,
                        task: task.clone(),
                        until_ms: *until_ms,
                        why: why.clone(),
                    };
                    self.provider_pauses.insert(provider.clone(), pause);
                }
                EventKind::ProviderResumed { provider } => {
                    self.provider_pauses.remove(provider);
                }
                // A finished run waits for nothing.
                EventKind::RunFinished { .. } => {
                    self.main_diverged = None;
                    self.provider_pauses.clear();
                }
                _ => {}
            }
            if let Err(error) = self.graph.apply(&e.kind) {
                self.damage = Some((e.seq, error));
            }
        }
    }

    pub fn status(&self, record: &RunRecord) -> RunStatus {
        let snapshot = self.graph.snapshot();
        let counts = Counts::of(snapshot.tasks.iter().map(|t| t.state));
        let state = match (&self.damage, self.graph.outcome()) {
            (_, Some(outcome)) => state_name(Some(outcome)),
            (Some(_), None) => "damaged",
            (None, None) => state_name(None),
        };
        RunStatus {
            id: record.id.to_string(),
            request: record.request.clone(),
            repo: record.repo.to_string_lossy().into_owned(),
            created_ms: record.created_ms,
            state: state.into(),
            counts,
            last_seq: self.last_seq,
            awaiting_decision: awaiting_decision(&self.asked, &snapshot),
            graph: snapshot,
            damage_noted: self.damage.is_some(),
            sandbox: self.sandbox.clone(),
            warm: None,
            pool: None,
            main_diverged: self.main_diverged.clone(),
            provider_pauses: self.provider_pauses.values().cloned().collect(),
            main_untested: untested(&record.config),
            branch: record
                .config
                .pointer("/merge/branch")
                .and_then(|b| b.as_str())
                .map(String::from),
            problem: self.damage.as_ref().map(|(seq, error)| {
                format!("damaged: the journal does not replay at #{seq}: {error}")
            }),
        }
    }
}

/// Whether the run's journaled config leaves main untested ([`crate::config::main_untested`]);
/// a config that does not read as one says nothing.
fn untested(config: &serde_json::Value) -> bool {
    fn section<T: serde::de::DeserializeOwned + Default>(
        config: &serde_json::Value,
        key: &str,
    ) -> Option<T> {
        match config.get(key) {
            None => Some(T::default()),
            Some(value) => serde_json::from_value(value.clone()).ok(),
        }
    }
    if !config.is_object() {
        return false;
    }
    match (section(config, "merge"), section(config, "reconciler")) {
        (Some(merge), Some(reconciler)) => crate::config::main_untested(&merge, &reconciler),
        _ => false,
    }
}

/// `kinds` as a run's journal would hold them: seqs from 1, in order.
#[cfg(test)]
pub(crate) fn journaled(
    run: flotilla_actors::protocol::RunId,
    kinds: Vec<EventKind>,
) -> Vec<Event> {
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| Event {
            seq: i as u64 + 1,
            run,
            at_ms: 0,
            kind,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A journaled config with neither a gate nor a sweep command leaves main untested;
    /// either one tests it; a config that does not read says nothing.
    #[test]
    fn a_run_without_gate_or_sweep_commands_is_marked_untested() {
        use serde_json::json;
        assert!(untested(&json!({"merge": {"branch": "main"}})));
        assert!(untested(&json!({})));
        assert!(!untested(&json!({"merge": {"gate": ["cargo test"]}})));
        assert!(!untested(&json!({"reconciler": {"test": "pytest -q"}})));
        assert!(!untested(&json!({"merge": {"gate": 3}})));
        assert!(!untested(&serde_json::Value::Null));
    }

    /// A replay carried across status calls says exactly what one replay of the whole
    /// journal says, at every point; once the run ends it is no longer open.
    #[test]
    fn a_status_replay_carried_forward_matches_a_replay_from_scratch() {
        use flotilla_actors::protocol::{RunId, TaskSpec};
        let mut g = RunGraph::new(Limits::default());
        let mut kinds = g
            .submit(vec![
                TaskSpec::new("one", &["a"]),
                TaskSpec::new("two", &["b"]),
            ])
            .unwrap();
        kinds.extend(g.planning_finished().unwrap());
        for id in ["t1", "t2"] {
            let t: TaskId = id.parse().unwrap();
            kinds.extend(
                g.dispatched(&t, 1, "general", flotilla_actors::protocol::Route::Worker)
                    .unwrap(),
            );
            kinds.extend(g.started(&t, 1).unwrap());
            kinds.extend(
                g.complete(flotilla_actors::protocol::TaskCompleted {
                    task: t,
                    attempt: 1,
                    handoff: Some(flotilla_actors::protocol::Handoff::complete("done")),
                    artifacts: Vec::new(),
                    subplan: None,
                })
                .unwrap(),
            );
        }
        let run = RunId::generate();
        let events = journaled(run, kinds);
        let record = RunRecord {
            id: run,
            request: "r".into(),
            repo: "/tmp".into(),
            config: serde_json::Value::Null,
            created_ms: 0,
            outcome: None,
        };
        let json = |s: &RunStatus| serde_json::to_string(s).unwrap();
        let mut carried = StatusReplay::new(Limits::default());
        for cut in 1..=events.len() {
            // What a status call at this point reads: the events after the last one seen
            // (and, once, one it had already seen, which is skipped).
            let from = carried.last_seq().saturating_sub(1) as usize;
            carried.apply(&events[from..cut]);
            let whole = status(&record, Limits::default(), &events[..cut]);
            assert_eq!(json(&carried.status(&record)), json(&whole), "after #{cut}");
        }
        assert_eq!(carried.status(&record).state, "completed");
        assert!(!carried.is_open(), "a finished run's replay is not kept");
    }
}
