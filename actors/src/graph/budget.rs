//! Spend: charging what attempts report, stopping a task over its budget and a run over its
//! run budget.
//!
//! `spend_reported` emits `SpendCharged`; a run over its budget is `RunBudgetExhausted`.
//! Handoff metrics are charged only beyond what was already reported, so nothing is charged
//! twice.

use std::collections::VecDeque;

use petgraph::graph::NodeIndex;

use super::{AGENT_AT_WORK, Emitted, GraphError, RunGraph};
use crate::protocol::{Budget, EventKind, FailureReason, TaskId};

impl RunGraph {
    /// Spend a running attempt reported. Charged to the task and the run whatever the
    /// attempt's state (the money is spent even if the report is late); a current attempt
    /// over its task's budget is stopped, and a run over its run budget ends.
    pub fn spend_reported(
        &mut self,
        task: &TaskId,
        attempt: u32,
        spent: Budget,
    ) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        let Some(&ix) = self.index.get(task) else {
            self.ignore(
                &mut out,
                Some(task),
                "SpendReported",
                "no such task in this run".into(),
            );
            return Ok(out);
        };
        if attempt > self.dag[ix].attempt {
            self.ignore(
                &mut out,
                Some(task),
                "SpendReported",
                format!(
                    "attempt {attempt} has not been dispatched; the task is on attempt {}",
                    self.dag[ix].attempt
                ),
            );
            return Ok(out);
        }
        self.emit(
            &mut out,
            EventKind::SpendCharged {
                task: task.clone(),
                attempt,
                spent,
            },
        )?;
        let node = &self.dag[ix];
        let at_work = node.attempt == attempt && AGENT_AT_WORK.contains(&node.state);
        if at_work && node.spent.exceeds(&node.budget) {
            let reason = FailureReason::BudgetExceeded {
                spent: node.spent,
                budget: node.budget,
            };
            self.fail_and_settle(&mut out, ix, reason)?;
        }
        self.check_run_budget(&mut out)?;
        Ok(out)
    }

    /// Ends the run once it has spent more than its run budget: nothing more is planned or
    /// dispatched and every live task is cancelled. No-op while within budget.
    pub(super) fn check_run_budget(&mut self, out: &mut Emitted) -> Result<(), GraphError> {
        let budget = self.limits.run_budget;
        if self.budget_exhausted.is_some()
            || self.outcome.is_some()
            || !self.run_spent.exceeds(&budget)
        {
            return Ok(());
        }
        let spent = self.run_spent;
        self.emit(out, EventKind::RunBudgetExhausted { spent, budget })?;
        // Once per run, like whole-run cancellation: visits every root.
        let roots: Vec<NodeIndex> = self
            .dag
            .node_indices()
            .filter(|&ix| self.dag[ix].parent.is_none() && !self.dag[ix].state.is_terminal())
            .collect();
        let mut work = VecDeque::new();
        for ix in roots {
            self.cancel_one(out, ix, "the run budget is exhausted".into(), &mut work)?;
        }
        self.settle(out, work)
    }
}
