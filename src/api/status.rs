//! A run's status (`GET /v1/runs/{id}`) and a task's story (`GET /v1/runs/{id}/tasks/{task}`),
//! as the daemon replays them from the journal and the CLI prints them.

use flotilla_actors::protocol::{Event, GraphSnapshot, TaskId, TaskState};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunStatus {
    pub id: String,
    pub request: String,
    pub repo: String,
    pub created_ms: u64,
    /// `running`, or the outcome.
    pub state: String,
    pub counts: Counts,
    pub last_seq: u64,
    /// What the run spent (`graph.run_spent`: every charge, the planner's calls included,
    /// as the budgets count it) and may spend (`graph.run_budget`) are in the graph.
    pub graph: GraphSnapshot,
    /// Tasks that wait for the user's decision (`flotilla decide`): they announced it after
    /// their latest decomposition and still wait for their subtasks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub awaiting_decision: Vec<TaskId>,
    /// What is wrong with the run, if anything: damaged (its journal does not replay; the
    /// graph then shows what replayed), or paused because the journal cannot be written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// The sandbox the run's commands are in (ADR-015), from its `RunStarted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// The warm trees of the run's repository, which its runs share (ADR-042, ADR-055):
    /// each one's disk use and commit, against the budget; absent before a gate or a sweep
    /// first ran in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<String>,
    /// What the repository's pool holds for its next run (ADR-052): how many workspaces,
    /// their disk against the budget; absent when it holds none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Landing is paused because main no longer holds what the run landed (`MainDiverged`,
    /// until main moves again or the user adopts it: ADR-024).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub main_diverged: Option<MainDivergence>,
    /// Providers whose rate limit holds calls back right now (`ProviderPauseStarted`
    /// without its `ProviderResumed`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub provider_pauses: Vec<ProviderPause>,
    /// The branch the run lands on (ADR-022), from its journaled config; absent for runs
    /// from before it (which landed on `main`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// Nothing tests main in this run: no `[merge] gate` and no `[reconciler]` build,
    /// typecheck or test command (ADR-032).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub main_untested: bool,
    /// `problem` is a damage (the first one found is kept).
    #[serde(skip)]
    pub(crate) damage_noted: bool,
}

/// Where landing paused: main holds `actual`, which lacks `expected` (the tip flotilla last
/// wrote).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MainDivergence {
    pub expected: String,
    pub actual: String,
}

/// A provider's ongoing rate-limit pause, as journaled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderPause {
    pub provider: String,
    pub role: flotilla_actors::protocol::Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskId>,
    /// Milliseconds since the Unix epoch.
    pub until_ms: u64,
    pub why: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Counts {
    pub total: usize,
    pub pending: usize,
    pub running: usize,
    pub waiting: usize,
    /// Done, waiting in the merge queue (M6).
    #[serde(default)]
    pub landing: usize,
    pub completed: usize,
    pub failed: usize,
    pub cancelled: usize,
}

impl Counts {
    /// Tasks counted by state, as `status` shows them and the live line under `tail` too.
    pub fn of(states: impl IntoIterator<Item = TaskState>) -> Counts {
        let mut counts = Counts::default();
        for state in states {
            counts.total += 1;
            let count = match state {
                TaskState::Pending | TaskState::Ready => &mut counts.pending,
                TaskState::Dispatched | TaskState::Running | TaskState::Synthesizing => {
                    &mut counts.running
                }
                TaskState::WaitingForSubtasks => &mut counts.waiting,
                TaskState::Landing => &mut counts.landing,
                TaskState::Completed => &mut counts.completed,
                TaskState::Failed => &mut counts.failed,
                TaskState::Cancelled => &mut counts.cancelled,
            };
            *count += 1;
        }
        counts
    }
}

impl RunStatus {
    /// Neither finished nor damaged.
    pub fn outcome_is_open(&self) -> bool {
        self.state == "running"
    }

    /// Marks a run that has not finished as damaged (its journal or config cannot be read),
    /// keeping the first reason found.
    pub fn mark_damaged(&mut self, problem: String) {
        if self.graph.outcome.is_none() {
            self.state = "damaged".into();
        }
        if !self.damage_noted {
            self.problem = Some(problem);
            self.damage_noted = true;
        }
    }
}

/// A task's state in words, for people (`waiting for subtasks`, not `waiting_for_subtasks`).
pub fn task_state_words(state: TaskState) -> &'static str {
    match state {
        TaskState::Pending => "pending",
        TaskState::Ready => "ready",
        TaskState::Dispatched => "dispatched",
        TaskState::Running => "running",
        TaskState::WaitingForSubtasks => "waiting for subtasks",
        TaskState::Synthesizing => "synthesizing",
        TaskState::Landing => "landing",
        TaskState::Completed => "completed",
        TaskState::Failed => "failed",
        TaskState::Cancelled => "cancelled",
    }
}

/// `GET /v1/runs/{id}/tasks/{task}`: every journaled event of the run that is about the
/// task, the newest ones when there are too many.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskStory {
    pub run: String,
    pub task: TaskId,
    /// In journal order.
    pub events: Vec<Event>,
    /// Older events of the task left out past the daemon's bound.
    pub omitted: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_state_has_words() {
        for (from, to) in TaskState::TRANSITIONS {
            for words in [task_state_words(*from), task_state_words(*to)] {
                assert!(!words.contains('_'), "{words}");
            }
        }
        assert_eq!(
            task_state_words(TaskState::WaitingForSubtasks),
            "waiting for subtasks"
        );
    }
}
