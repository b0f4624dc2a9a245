//! Every limit a run enforces, in one struct, with the defaults the seeds name. Loaded from
//! `flotilla.toml` (later issue) and passed to the task graph and Dispatch unchanged.
//!
//! `Limits` holds depth (3), subtasks per subplan (10), nodes (100), caps, retries, the deadline
//! factor (2), the default budget, payload caps, worker and subplanner slots, the subplanner
//! threshold (4), and the M3 bounds: `max_task_budget`, `run_budget`, `max_subplan_rejections`
//! (K = 3) and `max_run_restarts` (3). `Limits::validate` refuses impossible limits by field
//! (zero workers, a depth task ids cannot hold, a default budget above the task maximum, …);
//! configs are validated at load, at submission and again before a run starts.

use serde::{Deserialize, Serialize};

use crate::protocol::{Budget, MAX_TASK_DEPTH, Usd};

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
    /// LLM calls the Subplanner may make for one task (the seed's 20): it replans after
    /// every subtask handoff, and at this cap its decomposition is closed with what it has.
    pub max_subplanner_iterations: u32,
    /// The most a single task may be given: a planner task or a subtask asking for more in
    /// any dimension is refused (`RejectionReason::TaskBudgetTooLarge`), never clamped.
    pub max_task_budget: Budget,
    /// What the whole run may spend: every task's charged spend plus the planner's usage.
    /// Past it, in any dimension, the run stops planning and dispatching and ends `Failed`.
    /// Its wall time is agent time, summed over tasks that may run side by side.
    pub run_budget: Budget,
    /// Rejected subplans one task attempt may propose before the task is stopped (K): it
    /// then completes with its last usable handoff, or fails with `ProposalLoop`.
    pub max_subplan_rejections: u32,
    /// How many times the supervisor restarts a run whose actor died before failing it.
    pub max_run_restarts: u32,
    /// Conflict-fix tasks one run may make (M6). A branch that conflicts past it fails with
    /// its conflicting files; a conflict on a conflict fix never makes another one.
    pub max_conflict_fixes: u32,
    /// Fix tasks one run may make for a red main (the Reconciler's sweeps).
    pub max_sweep_fixes: u32,
    /// Fix tasks one sweep may make (the seed's 5): groups beyond it wait for a later sweep.
    pub max_fix_tasks_per_sweep: u32,
    /// Finalization rounds (drain the queue, sweep, fix, repeat; the seed's 3) before a run
    /// whose main is still red ends `Failed`.
    pub max_finalization_attempts: u32,
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
            max_subplanner_iterations: 20,
            max_task_budget: Budget::new(
                1_000_000,
                Usd::from_micros(10_000_000),
                4 * 60 * 60 * 1000,
            ),
            run_budget: Budget::new(
                10_000_000,
                Usd::from_micros(100_000_000),
                48 * 60 * 60 * 1000,
            ),
            max_subplan_rejections: 3,
            max_run_restarts: 3,
            max_conflict_fixes: 10,
            max_sweep_fixes: 20,
            max_fix_tasks_per_sweep: 5,
            max_finalization_attempts: 3,
        }
    }
}

/// A `Limits` that cannot work, naming the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    #[error("{field} = 0: it must be at least 1")]
    Zero { field: &'static str },
    #[error("max_depth = {max_depth}: task ids hold at most {max} levels")]
    DepthBeyondTaskId { max_depth: u32, max: u32 },
    #[error("{field} ({value}) is larger than {limit_field} ({limit})")]
    AboveLimit {
        field: &'static str,
        value: String,
        limit_field: &'static str,
        limit: String,
    },
}

impl Limits {
    /// Checks that the limits can run a run: no zero where at least one is needed, no depth
    /// that task ids cannot hold, and default ≤ per-task maximum ≤ run budget.
    pub fn validate(&self) -> Result<(), LimitsError> {
        let at_least_one: [(&'static str, u64); 14] = [
            ("max_depth", self.max_depth.into()),
            ("max_subtasks", self.max_subtasks as u64),
            ("max_nodes", self.max_nodes as u64),
            ("max_attempts", self.max_attempts.into()),
            ("deadline_factor", self.deadline_factor.into()),
            ("max_description_bytes", self.max_description_bytes as u64),
            ("max_scope_paths", self.max_scope_paths as u64),
            ("max_path_bytes", self.max_path_bytes as u64),
            ("max_workers", self.max_workers as u64),
            ("max_subplanners", self.max_subplanners as u64),
            (
                "max_subplanner_iterations",
                self.max_subplanner_iterations.into(),
            ),
            ("max_subplan_rejections", self.max_subplan_rejections.into()),
            (
                "max_fix_tasks_per_sweep",
                self.max_fix_tasks_per_sweep.into(),
            ),
            (
                "max_finalization_attempts",
                self.max_finalization_attempts.into(),
            ),
        ];
        if let Some((field, _)) = at_least_one.iter().find(|(_, v)| *v == 0) {
            return Err(LimitsError::Zero { field });
        }
        // Task numbers are u32: a run cannot hold more tasks than ids can number.
        if self.max_nodes > u32::MAX as usize {
            return Err(LimitsError::AboveLimit {
                field: "max_nodes",
                value: self.max_nodes.to_string(),
                limit_field: "the largest task number",
                limit: u32::MAX.to_string(),
            });
        }
        if self.max_depth > MAX_TASK_DEPTH {
            return Err(LimitsError::DepthBeyondTaskId {
                max_depth: self.max_depth,
                max: MAX_TASK_DEPTH,
            });
        }
        let ordered = [
            (
                "default_budget",
                &self.default_budget,
                "max_task_budget",
                &self.max_task_budget,
            ),
            (
                "max_task_budget",
                &self.max_task_budget,
                "run_budget",
                &self.run_budget,
            ),
        ];
        for (field, value, limit_field, limit) in ordered {
            if value.exceeds(limit) {
                return Err(LimitsError::AboveLimit {
                    field,
                    value: value.to_string(),
                    limit_field,
                    limit: limit.to_string(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid() {
        assert_eq!(Limits::default().validate(), Ok(()));
    }

    #[test]
    fn validation_names_the_field_at_fault() {
        let zero_workers = Limits {
            max_workers: 0,
            ..Limits::default()
        };
        assert_eq!(
            zero_workers.validate(),
            Err(LimitsError::Zero {
                field: "max_workers"
            })
        );
        let zero_nodes = Limits {
            max_nodes: 0,
            ..Limits::default()
        };
        assert_eq!(
            zero_nodes.validate().unwrap_err().to_string(),
            "max_nodes = 0: it must be at least 1"
        );
        let too_deep = Limits {
            max_depth: MAX_TASK_DEPTH + 1,
            ..Limits::default()
        };
        assert_eq!(
            too_deep.validate(),
            Err(LimitsError::DepthBeyondTaskId {
                max_depth: MAX_TASK_DEPTH + 1,
                max: MAX_TASK_DEPTH
            })
        );
        let uncountable = Limits {
            max_nodes: u32::MAX as usize + 1,
            ..Limits::default()
        };
        assert!(matches!(
            uncountable.validate(),
            Err(LimitsError::AboveLimit {
                field: "max_nodes",
                ..
            })
        ));
        let deepest = Limits {
            max_depth: MAX_TASK_DEPTH,
            ..Limits::default()
        };
        assert_eq!(deepest.validate(), Ok(()));
        let lavish_default = Limits {
            default_budget: Budget::new(u64::MAX, Usd::ZERO, 0),
            ..Limits::default()
        };
        assert!(matches!(
            lavish_default.validate(),
            Err(LimitsError::AboveLimit {
                field: "default_budget",
                limit_field: "max_task_budget",
                ..
            })
        ));
    }

    #[test]
    fn missing_new_fields_take_their_defaults() {
        let limits: Limits = serde_json::from_str(r#"{"max_workers": 2}"#).unwrap();
        assert_eq!(limits.max_subplan_rejections, 3);
        assert_eq!(limits.max_run_restarts, 3);
        assert_eq!(limits.run_budget, Limits::default().run_budget);
    }
}
