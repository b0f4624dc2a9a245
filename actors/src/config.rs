//! Every limit a run enforces, in one struct, with the defaults the seeds name. Loaded from
//! `flotilla.toml` (later issue) and passed to the task graph and Dispatch unchanged.

use serde::{Deserialize, Serialize};

use crate::protocol::{Budget, Usd};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Deepest task allowed: root-planned tasks are depth 1, their subtasks depth 2, ….
    pub max_depth: u32,
    /// Subtasks in one proposal.
    pub max_subtasks: usize,
    /// Tasks in one run's graph, all states included.
    pub max_nodes: usize,
    /// Subplans one task attempt may propose (accepted or not): stops decomposition spam.
    pub max_proposals_per_attempt: u32,
    /// Decompositions one run may accept.
    pub max_decompositions_per_run: u32,
    /// Attempts per task: 2 means one retry.
    pub max_attempts: u32,
    /// A parent fails if its subtasks have not all ended within this multiple of its own
    /// wall-time budget.
    pub deadline_factor: u32,
    /// The budget of a task whose spec names none.
    pub default_budget: Budget,
    /// Size caps on LLM-written fields.
    pub max_description_bytes: usize,
    pub max_scope_paths: usize,
    pub max_path_bytes: usize,
    pub max_capabilities: usize,
    /// Worker slots: tasks running at once.
    pub max_workers: usize,
    /// Tasks being decomposed by the subplanner at once. Separate from worker slots so that
    /// a decomposing parent never holds a slot its own subtasks need.
    pub max_subplanners: usize,
    /// A task with at least this many scope paths (and depth below `max_depth`) goes to the
    /// subplanner instead of a worker.
    pub subplanner_scope_threshold: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_depth: 3,
            max_subtasks: 10,
            max_nodes: 100,
            max_proposals_per_attempt: 3,
            max_decompositions_per_run: 25,
            max_attempts: 2,
            deadline_factor: 2,
            default_budget: Budget::new(200_000, Usd::from_micros(2_000_000), 30 * 60 * 1000),
            max_description_bytes: 16 * 1024,
            max_scope_paths: 64,
            max_path_bytes: 1024,
            max_capabilities: 32,
            max_workers: 4,
            max_subplanners: 2,
            subplanner_scope_threshold: 4,
        }
    }
}
