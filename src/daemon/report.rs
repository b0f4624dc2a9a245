//! Read models derived from a run's journal: the status summary and graph exports. They
//! replay the journal rather than ask the live actor, so finished and running runs share
//! one code path, and what the API shows is exactly what a restart would rebuild.

use std::fmt::Write as _;

use flotilla_actors::config::Limits;
use flotilla_actors::graph::{GraphError, RunGraph};
use flotilla_actors::protocol::{Event, EventKind, GraphSnapshot, RunOutcome, TaskState, Usd};
use serde::{Deserialize, Serialize};

use crate::journal::RunRecord;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunStatus {
    pub id: String,
    pub request: String,
    pub repo: String,
    pub created_ms: u64,
    /// `running`, or the outcome.
    pub state: String,
    pub counts: Counts,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
    pub last_seq: u64,
    pub graph: GraphSnapshot,
    /// What is wrong with the run, if anything: damaged (its journal does not replay; the
    /// graph then shows what replayed), or paused because the journal cannot be written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Counts {
    pub total: usize,
    pub pending: usize,
    pub running: usize,
    pub waiting: usize,
    pub completed: usize,
    pub failed: usize,
    pub cancelled: usize,
}

impl RunStatus {
    /// Neither finished nor damaged.
    pub fn outcome_is_open(&self) -> bool {
        self.state == "running"
    }
}

pub fn state_name(outcome: Option<RunOutcome>) -> &'static str {
    match outcome {
        None => "running",
        Some(RunOutcome::Completed) => "completed",
        Some(RunOutcome::Failed) => "failed",
        Some(RunOutcome::Cancelled) => "cancelled",
    }
}

/// The run's status from its journal. A journal that does not replay still gives a status:
/// the graph as far as it replayed, the state `damaged` and the reason.
pub fn status(record: &RunRecord, limits: Limits, events: &[Event]) -> RunStatus {
    let mut graph = RunGraph::new(limits);
    let mut damage: Option<(u64, GraphError)> = None;
    for e in events {
        if let Err(error) = graph.apply(&e.kind) {
            damage = Some((e.seq, error));
            break;
        }
    }
    let snapshot = graph.snapshot();
    let mut counts = Counts {
        total: snapshot.tasks.len(),
        ..Counts::default()
    };
    for t in &snapshot.tasks {
        match t.state {
            TaskState::Pending | TaskState::Ready => counts.pending += 1,
            TaskState::Dispatched | TaskState::Running | TaskState::Synthesizing => {
                counts.running += 1
            }
            TaskState::WaitingForSubtasks => counts.waiting += 1,
            TaskState::Completed => counts.completed += 1,
            TaskState::Failed => counts.failed += 1,
            TaskState::Cancelled => counts.cancelled += 1,
        }
    }
    let (mut tokens_in, mut tokens_out, mut cost) = (0u64, 0u64, 0u64);
    for e in events {
        match &e.kind {
            EventKind::PlannerResponded { usage, .. } => {
                tokens_in = tokens_in.saturating_add(usage.tokens_in);
                tokens_out = tokens_out.saturating_add(usage.tokens_out);
                cost = cost.saturating_add(usage.cost_usd.micros());
            }
            EventKind::TaskCompleted {
                handoff: Some(h), ..
            }
            | EventKind::DecompositionAccepted {
                handoff: Some(h), ..
            } => {
                tokens_in = tokens_in.saturating_add(h.metrics.tokens_in);
                tokens_out = tokens_out.saturating_add(h.metrics.tokens_out);
                cost = cost.saturating_add(h.metrics.cost_usd.micros());
            }
            _ => {}
        }
    }
    let state = match (&damage, graph.outcome()) {
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
        tokens_in,
        tokens_out,
        cost_usd: Usd::from_micros(cost).dollars(),
        last_seq: events.last().map_or(0, |e| e.seq),
        graph: snapshot,
        problem: damage
            .map(|(seq, error)| format!("damaged: the journal does not replay at #{seq}: {error}")),
    }
}

fn label(description: &str) -> String {
    let short: String = description.chars().take(60).collect();
    short.replace(['"', '\\', '\n', '[', ']', '<', '>', '{', '}', '|'], " ")
}

/// Graphviz: dependency edges solid, subtask edges dashed.
pub fn dot(graph: &GraphSnapshot) -> String {
    let mut out = String::from("digraph flotilla {\n  rankdir=LR;\n  node [shape=box];\n");
    for t in &graph.tasks {
        let _ = writeln!(
            out,
            "  \"{}\" [label=\"{} [{}]\\n{}\"];",
            t.id,
            t.id,
            t.state,
            label(&t.description)
        );
    }
    for t in &graph.tasks {
        for d in &t.depends_on {
            let _ = writeln!(out, "  \"{d}\" -> \"{}\";", t.id);
        }
        if let Some(p) = &t.parent {
            let _ = writeln!(
                out,
                "  \"{}\" -> \"{p}\" [style=dashed, label=\"subtask of\"];",
                t.id
            );
        }
    }
    out.push_str("}\n");
    out
}

/// Mermaid flowchart: dependency edges solid, subtask edges dotted.
pub fn mermaid(graph: &GraphSnapshot) -> String {
    let node = |id: &str| id.replace('.', "_");
    let mut out = String::from("flowchart LR\n");
    for t in &graph.tasks {
        let id = t.id.to_string();
        let _ = writeln!(
            out,
            "  {}[\"{} ({}): {}\"]",
            node(&id),
            id,
            t.state,
            label(&t.description)
        );
    }
    for t in &graph.tasks {
        let id = t.id.to_string();
        for d in &t.depends_on {
            let _ = writeln!(out, "  {} --> {}", node(&d.to_string()), node(&id));
        }
        if let Some(p) = &t.parent {
            let _ = writeln!(out, "  {} -.-> {}", node(&id), node(&p.to_string()));
        }
    }
    out
}
