//! Planning: the root planner's batches, its recorded answers, and the end of planning.
//!
//! Commands: `submit`, `planner_answered`, and the end of planning.

use std::collections::VecDeque;

use super::{Emitted, GraphError, RunGraph, validate};
use crate::protocol::{EventKind, PlannerAnswer, TaskId, TaskSpec, ToolRound};

impl RunGraph {
    /// The planner's batch of root tasks. All or nothing: a batch with any invalid task is
    /// rejected whole with `TasksRejected`.
    pub fn submit(&mut self, specs: Vec<TaskSpec>) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        if self.planning_finished {
            self.ignore(
                &mut out,
                None,
                "SubmitTasks",
                "planning has finished for this run".into(),
            );
            return Ok(out);
        }
        self.submit_into(&mut out, specs)?;
        Ok(out)
    }

    fn submit_into(&mut self, out: &mut Emitted, specs: Vec<TaskSpec>) -> Result<(), GraphError> {
        if specs.is_empty() {
            return Ok(());
        }
        let batch = match validate::validate_batch(self, specs) {
            Ok(batch) => batch,
            Err(reason) => return self.emit(out, EventKind::TasksRejected { reason }),
        };
        let ids: Vec<TaskId> = (0..batch.items.len())
            .map(|i| TaskId::root(self.next_root.saturating_add(i as u32)))
            .collect();
        for &i in &batch.order {
            let item = &batch.items[i];
            let mut depends_on = item.existing_deps.clone();
            depends_on.extend(item.batch_deps.iter().map(|&j| ids[j].clone()));
            self.emit(
                out,
                EventKind::TaskAdded {
                    task: ids[i].clone(),
                    spec: item.spec.clone(),
                    budget: item.budget,
                    depends_on,
                },
            )?;
        }
        let mut work = VecDeque::new();
        for id in &ids {
            self.settle_new(out, id, &mut work)?;
        }
        self.settle(out, work)
    }

    /// One root-planner call: recorded first, then its tasks submitted. A valid empty answer
    /// while nothing is live means the planner considers the request done.
    pub fn planner_answered(&mut self, answer: PlannerAnswer) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        if self.planning_finished {
            self.ignore(
                &mut out,
                None,
                "PlannerAnswered",
                "planning has finished for this run".into(),
            );
            return Ok(out);
        }
        let error = answer.tasks.as_ref().err().cloned();
        let recorded = EventKind::PlannerResponded {
            call: answer.call,
            prompt: answer.prompt,
            content: answer.content,
            usage: answer.usage,
            error,
        };
        self.emit(&mut out, recorded)?;
        self.check_run_budget(&mut out)?;
        if self.budget_exhausted.is_some() {
            return Ok(out);
        }
        match answer.tasks {
            Ok(tasks) if tasks.is_empty() && self.live == 0 => {
                self.emit(&mut out, EventKind::PlanningFinished)?;
                self.settle(&mut out, VecDeque::new())?;
            }
            Ok(tasks) => self.submit_into(&mut out, tasks)?,
            Err(_) => {}
        }
        Ok(out)
    }

    /// A round of a planner's read-only tools (ADR-037): only recorded, for replay.
    pub fn tools_ran(&mut self, round: ToolRound) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        self.emit(&mut out, EventKind::ToolsRan { tools: round })?;
        Ok(out)
    }

    pub fn planner_gave_up(&mut self, error: &str) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        if !self.planning_finished {
            self.emit(
                &mut out,
                EventKind::PlannerGaveUp {
                    error: error.into(),
                },
            )?;
            self.settle(&mut out, VecDeque::new())?;
        }
        Ok(out)
    }

    pub fn planning_finished(&mut self) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        if !self.planning_finished {
            self.emit(&mut out, EventKind::PlanningFinished)?;
            self.settle(&mut out, VecDeque::new())?;
        }
        Ok(out)
    }
}
