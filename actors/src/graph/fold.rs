//! The fold: [`RunGraph::apply`] is the only code that mutates the graph. Commands reach it
//! through `emit`, which applies an event and records it; replay applies journaled events to
//! an empty graph.

use std::sync::Arc;

use petgraph::Direction;
use petgraph::graph::NodeIndex;

use super::{Emitted, GraphError, RunGraph, TaskNode, fingerprint, is_open};
use crate::config::Limits;
use crate::protocol::ScopePath;
use crate::protocol::{
    Budget, EventKind, FixOf, LastReview, PreviousAttempt, StopCondition, TaskId, TaskSpec,
    TaskState,
};

/// Intended commits kept per `Landing` task (each rebuild of its batch journals one).
const MAX_INTENTS_KEPT: usize = 16;

/// Whether a new attempt counts toward `max_attempts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Charged {
    Yes,
    No,
}

impl RunGraph {
    /// Rebuilds a graph from journaled events.
    /// Applies journaled events to this (empty) graph: for a graph built with options
    /// (`merging`).
    pub fn replayed<'a>(
        mut self,
        events: impl IntoIterator<Item = &'a EventKind>,
    ) -> Result<Self, GraphError> {
        for e in events {
            self.apply(e)?;
        }
        Ok(self)
    }

    pub fn replay<'a>(
        limits: Limits,
        events: impl IntoIterator<Item = &'a EventKind>,
    ) -> Result<Self, GraphError> {
        let mut graph = RunGraph::new(limits);
        for e in events {
            graph.apply(e)?;
        }
        Ok(graph)
    }

    /// Applies one event. The only mutator of the graph.
    pub fn apply(&mut self, event: &EventKind) -> Result<(), GraphError> {
        match event {
            EventKind::PlannerResponded {
                call, usage, error, ..
            } => {
                self.planner_calls = self.planner_calls.max(call.saturating_add(1));
                self.run_spent = self.run_spent.saturating_add(usage.spent());
                self.last_planner_problem = Some(error.clone());
            }
            // Only the planner's batches are judged here: a rejected subplan is the
            // proposer's business.
            EventKind::TasksRejected { reason } => {
                self.last_planner_problem = Some(Some(reason.to_string()));
            }
            EventKind::PlannerGaveUp { error } => {
                self.planning_finished = true;
                self.planner_gave_up = Some(error.clone());
            }
            EventKind::TaskInterrupted { task, attempt } => {
                let ix = self.ix_at(task, *attempt)?;
                self.next_attempt(ix, Charged::No)?;
            }
            EventKind::TaskAtomic { task, attempt, .. } => {
                let ix = self.ix_at(task, *attempt)?;
                self.next_attempt(ix, Charged::No)?;
                self.dag[ix].atomic = true;
            }
            EventKind::SubplannerResponded {
                task,
                call,
                usage,
                reported,
                ..
            } => {
                let ix = self.ix(task)?;
                let spent = usage.spent();
                let reported: Vec<NodeIndex> = reported
                    .iter()
                    .filter_map(|r| self.index.get(r).copied())
                    .collect();
                let node = &mut self.dag[ix];
                node.subplanner_calls = node.subplanner_calls.max(call.saturating_add(1));
                node.spent = node.spent.saturating_add(spent);
                node.unheard.retain(|c| !reported.contains(c));
                self.run_spent = self.run_spent.saturating_add(spent);
            }
            EventKind::SubtasksAdded {
                parent, attempt, ..
            } => {
                // The subtasks themselves came with their `TaskAdded` events. Rejections
                // count in a row for an open decomposition: an accepted batch ends the streak.
                let ix = self.ix_at(parent, *attempt)?;
                self.dag[ix].rejections_this_attempt = 0;
            }
            EventKind::DecompositionClosed {
                parent, attempt, ..
            } => {
                let ix = self.ix_at(parent, *attempt)?;
                self.dag[ix].decomposition_open = false;
            }
            EventKind::RunStarted { .. }
            | EventKind::MessageIgnored { .. }
            | EventKind::MergeConflict { .. }
            | EventKind::MergeGateFailed { .. }
            | EventKind::SweepStale { .. }
            | EventKind::LandingRequeued { .. } => {}
            EventKind::MainDiverged { expected, actual } => {
                self.diverged = Some(Box::new((expected.clone(), actual.clone())));
            }
            EventKind::MainAdopted { tip, dropped, .. } => {
                // Rare (a user's decision): a walk over the landings is fine here.
                for task in dropped {
                    let commits = self.landed_commits.iter().filter(|(t, _)| t == task);
                    for (_, commit) in commits {
                        if !self.dropped_commits.contains(commit) {
                            self.dropped_commits.push(commit.clone());
                        }
                    }
                }
                self.main_tip = Some(tip.clone());
                self.diverged = None;
                // main is not what the last sweep saw.
                self.last_sweep_green = None;
            }
            EventKind::AwaitingUserDecision { parent } => {
                // A landing task asked for a decision is held out of the merge queue; a
                // parent's question changes nothing in the graph.
                let ix = self.ix(parent)?;
                if self.dag[ix].state == TaskState::Landing {
                    self.dag[ix].landing_held = true;
                }
            }
            EventKind::LandingAllowed { task } => {
                let ix = self.ix(task)?;
                self.dag[ix].landing_held = false;
            }
            EventKind::MainMoved { to, .. } => {
                self.main_tip = Some(to.clone());
                self.diverged = None;
            }
            EventKind::LandingIntended { to, landed, .. } => {
                for l in landed {
                    let landing = self
                        .index
                        .get(&l.task)
                        .is_some_and(|&ix| self.dag[ix].state == TaskState::Landing);
                    if landing {
                        let commits = self.intents.entry(l.task.clone()).or_default();
                        // A batch is built again after a lost race or a bisection: the
                        // newest intents are the ones that may have reached main.
                        if commits.len() >= MAX_INTENTS_KEPT {
                            commits.remove(0);
                        }
                        commits.push(l.commit.clone());
                    }
                }
                let commits = landed.iter().map(|l| l.commit.clone()).collect();
                self.last_intent = Some(Box::new((to.clone(), commits)));
            }
            EventKind::TaskLanding {
                task,
                attempt,
                handoff,
                artifacts,
                branch,
                head,
            } => {
                let ix = self.ix_at(task, *attempt)?;
                self.set_state(ix, TaskState::Landing)?;
                let node = &mut self.dag[ix];
                node.reported_since_report = Budget::default();
                if let Some(h) = handoff {
                    node.handoff = Some(Box::new(h.clone()));
                }
                node.artifacts.extend(artifacts.iter().cloned());
                node.landing = Some(Box::new((branch.clone(), head.clone())));
            }
            EventKind::TaskLanded { task, commit, .. } => {
                let ix = self.ix(task)?;
                self.set_state(ix, TaskState::Completed)?;
                self.landed_commits.push((task.clone(), commit.clone()));
                // main moved: only a sweep after this says whether it is green.
                self.last_sweep_green = None;
            }
            EventKind::FixTaskAdded {
                task,
                spec,
                budget,
                fix,
            } => {
                self.add_task(task, spec, *budget, &[])?;
                let ix = self.ix(task)?;
                match fix {
                    FixOf::Conflict { task: of, .. } => {
                        let of = self.ix(of)?;
                        self.dag[of].fixed_by = Some(ix);
                        self.conflict_fixes = self.conflict_fixes.saturating_add(1);
                    }
                    FixOf::Sweep { signature, .. } => {
                        self.open_sweep_fixes.insert(signature.clone(), ix);
                        self.sweep_fixes = self.sweep_fixes.saturating_add(1);
                    }
                }
                self.dag[ix].fix = Some(Box::new(fix.clone()));
            }
            EventKind::SweepFinished { report } => {
                // The `reconciler` role's call, if its model worded the fixes (ADR-032).
                if let Some(wording) = &report.wording {
                    self.run_spent = self.run_spent.saturating_add(wording.usage.spent());
                }
                if report.finalization.is_some_and(|n| n == self.finalization) {
                    self.awaiting_sweep = false;
                }
                // A sweep of a main that has moved on since says nothing about main now.
                if self
                    .main_tip
                    .as_deref()
                    .is_none_or(|tip| tip == report.commit)
                {
                    self.last_sweep_green = Some(report.green);
                }
                self.last_red = (!report.green).then(|| {
                    let class = report.class.clone().unwrap_or_else(|| "failures".into());
                    let scope: Vec<&str> = report
                        .fixes
                        .iter()
                        .flat_map(|f| f.scope.iter().map(String::as_str))
                        .take(6)
                        .collect();
                    format!(
                        "{} ({} in all) at {}: {}",
                        class,
                        report.failures,
                        short(&report.commit),
                        scope.join(", ")
                    )
                });
            }
            EventKind::FinalizationStarted { attempt } => {
                self.finalization = *attempt;
                self.awaiting_sweep = true;
            }
            EventKind::TaskAdded {
                task,
                spec,
                budget,
                depends_on,
            } => {
                self.add_task(task, spec, *budget, depends_on)?;
            }
            EventKind::TaskReady { task } => {
                let ix = self.ix(task)?;
                self.set_state(ix, TaskState::Ready)?;
            }
            EventKind::TaskDispatched {
                task,
                attempt,
                profile,
                ..
            } => {
                let ix = self.ix_at(task, *attempt)?;
                self.set_state(ix, TaskState::Dispatched)?;
                self.dag[ix].profile = Some(profile.clone());
            }
            EventKind::TaskStarted { task, attempt } => {
                let ix = self.ix_at(task, *attempt)?;
                self.set_state(ix, TaskState::Running)?;
            }
            EventKind::TaskRetried {
                task,
                attempt,
                failure,
                findings,
            } => {
                let ix = self.ix_at(task, *attempt)?;
                self.next_attempt(ix, Charged::Yes)?;
                // Kept until the next failure: an interrupted or atomic-again attempt
                // leaves it for the one after (ADR-031).
                let previous = PreviousAttempt::new(*attempt, failure, findings);
                self.dag[ix].previous = Some(Arc::new(previous));
            }
            EventKind::ReviewVerdict {
                task,
                attempt,
                review,
                ..
            } => {
                let ix = self.ix_at(task, *attempt)?;
                self.dag[ix].last_review = Some(LastReview {
                    attempt: *attempt,
                    mark: review.mark(),
                });
            }
            EventKind::TaskCompleted {
                task,
                attempt,
                handoff,
                artifacts,
            } => {
                let ix = self.ix_at(task, *attempt)?;
                self.set_state(ix, TaskState::Completed)?;
                let node = &mut self.dag[ix];
                node.reported_since_report = Budget::default();
                if let Some(h) = handoff {
                    node.handoff = Some(Box::new(h.clone()));
                }
                node.artifacts.extend(artifacts.iter().cloned());
            }
            EventKind::TaskFailed { task, reason, .. } => {
                let ix = self.ix(task)?;
                self.set_state(ix, TaskState::Failed)?;
                self.dag[ix].failure = Some(Box::new(reason.clone()));
            }
            EventKind::TaskCancelled { task, .. } => {
                let ix = self.ix(task)?;
                self.set_state(ix, TaskState::Cancelled)?;
            }
            EventKind::DecompositionAccepted {
                parent,
                attempt,
                stop_when,
                handoff,
                artifacts,
                subplanner,
                ..
            } => {
                let ix = self.ix_at(parent, *attempt)?;
                self.set_state(ix, TaskState::WaitingForSubtasks)?;
                self.decompositions = self.decompositions.saturating_add(1);
                let node = &mut self.dag[ix];
                node.stop_when = *stop_when;
                node.subplanned = *subplanner;
                node.decomposition_open = *subplanner;
                node.decompositions = node.decompositions.saturating_add(1);
                node.proposals_this_attempt = node.proposals_this_attempt.saturating_add(1);
                node.reported_since_report = Budget::default();
                if let Some(h) = handoff {
                    node.handoff = Some(Box::new(h.clone()));
                }
                node.artifacts.extend(artifacts.iter().cloned());
            }
            EventKind::DecompositionRejected {
                parent, attempt, ..
            } => {
                let ix = self.ix_at(parent, *attempt)?;
                let node = &mut self.dag[ix];
                node.proposals_this_attempt = node.proposals_this_attempt.saturating_add(1);
                node.rejections_this_attempt = node.rejections_this_attempt.saturating_add(1);
                node.reported_since_report = Budget::default();
            }
            EventKind::ProposalsStopped { task, attempt, .. } => {
                // Its outcome (TaskCompleted or TaskFailed) follows; this only records why.
                self.ix_at(task, *attempt)?;
            }
            EventKind::SpendCharged {
                task,
                attempt,
                spent,
            } => {
                let ix = self.ix(task)?;
                let node = &mut self.dag[ix];
                node.spent = node.spent.saturating_add(*spent);
                if *attempt == node.attempt {
                    node.reported_since_report = node.reported_since_report.saturating_add(*spent);
                }
                self.run_spent = self.run_spent.saturating_add(*spent);
            }
            EventKind::RunBudgetExhausted { spent, budget } => {
                self.planning_finished = true;
                self.budget_exhausted = Some((*spent, *budget));
            }
            EventKind::SubtasksCompleted { parent } => {
                let ix = self.ix(parent)?;
                self.set_state(ix, TaskState::Synthesizing)?;
            }
            EventKind::PlanningFinished => self.planning_finished = true,
            EventKind::RunCancelRequested { reason } => {
                self.planning_finished = true;
                self.cancel_requested = Some(reason.clone());
            }
            EventKind::RunFinished { outcome, reason } => {
                self.outcome = Some(*outcome);
                self.finish_reason = reason.clone();
            }
            // The supervisor's records: nothing in the graph changes.
            EventKind::RunRestarted { .. }
            | EventKind::JournalUnavailable { .. }
            | EventKind::StorageUnavailable { .. }
            | EventKind::LlmProgress { .. }
            | EventKind::ProviderPaused { .. }
            | EventKind::ProviderPauseStarted { .. }
            | EventKind::ProviderResumed { .. }
            | EventKind::AgentActivity { .. } => {}
            // A record for replay: a planner's tool round changes no task (its usage is
            // charged with the call's answer).
            EventKind::ToolsRan { .. } => {}
        }
        Ok(())
    }

    /// The task goes back to Ready as its next attempt, with the per-attempt counters reset.
    /// An uncharged attempt (a restart's interruption, the Subplanner's handover) does not
    /// count toward `max_attempts`.
    fn next_attempt(&mut self, ix: NodeIndex, charged: Charged) -> Result<(), GraphError> {
        self.set_state(ix, TaskState::Ready)?;
        let node = &mut self.dag[ix];
        node.attempt = node.attempt.saturating_add(1);
        if charged == Charged::No {
            node.uncharged_attempts = node.uncharged_attempts.saturating_add(1);
        }
        node.proposals_this_attempt = 0;
        node.rejections_this_attempt = 0;
        node.subplanner_calls = 0;
        node.reported_since_report = Budget::default();
        Ok(())
    }

    pub(super) fn ix(&self, id: &TaskId) -> Result<NodeIndex, GraphError> {
        self.index
            .get(id)
            .copied()
            .ok_or_else(|| GraphError::UnknownTask(id.clone()))
    }

    fn ix_at(&self, id: &TaskId, attempt: u32) -> Result<NodeIndex, GraphError> {
        let ix = self.ix(id)?;
        let expected = self.dag[ix].attempt;
        if expected != attempt {
            return Err(GraphError::AttemptMismatch {
                task: id.clone(),
                got: attempt,
                expected,
            });
        }
        Ok(ix)
    }

    fn add_task(
        &mut self,
        id: &TaskId,
        spec: &TaskSpec,
        budget: Budget,
        deps: &[TaskId],
    ) -> Result<(), GraphError> {
        if self.index.contains_key(id) {
            return Err(GraphError::DuplicateTask(id.clone()));
        }
        let parent = match id.parent() {
            Some(p) => Some(self.ix(&p)?),
            None => None,
        };
        let dep_ixs = deps
            .iter()
            .map(|d| self.ix(d))
            .collect::<Result<Vec<_>, _>>()?;
        // The spec in the event is already normalized, so parsing cannot fail; fall back to
        // skipping a path rather than refusing to replay a journal.
        let scope: Vec<ScopePath> = spec
            .scope
            .iter()
            .filter_map(|p| ScopePath::parse(p, usize::MAX).ok())
            .collect();
        let fingerprint = fingerprint(&spec.description, &scope);
        // A subtask's work precedes its parent's synthesis, so its chain includes the parent's.
        let critical_path = parent.map_or(1, |p| self.dag[p].critical_path.saturating_add(1));
        let unfinished_deps = dep_ixs
            .iter()
            .filter(|&&d| self.dag[d].state != TaskState::Completed)
            .count() as u32;
        let node = TaskNode {
            id: id.clone(),
            spec: Arc::new(spec.clone()),
            scope,
            budget,
            spent: Budget::default(),
            reported_since_report: Budget::default(),
            state: TaskState::Pending,
            attempt: 1,
            parent,
            children: Vec::new(),
            stop_when: StopCondition::default(),
            decompositions: 0,
            proposals_this_attempt: 0,
            rejections_this_attempt: 0,
            uncharged_attempts: 0,
            atomic: false,
            subplanned: false,
            decomposition_open: false,
            subplanner_calls: 0,
            profile: None,
            unheard: Vec::new(),
            fix: None,
            fixed_by: None,
            landing: None,
            landing_held: false,
            unfinished_deps,
            open_children: 0,
            completed_children: 0,
            critical_path,
            created: self.dag.node_count() as u64,
            handoff: None,
            artifacts: Vec::new(),
            failure: None,
            previous: None,
            last_review: None,
            fingerprint,
        };
        let ix = self.dag.add_node(node);
        self.index.insert(id.clone(), ix);
        self.open_fingerprints.insert(fingerprint, ix);
        self.live += 1;
        for &d in &dep_ixs {
            self.dag.add_edge(d, ix, ());
        }
        self.raise_critical_paths(ix);
        match parent {
            Some(p) => {
                self.dag[p].children.push(ix);
                self.dag[p].open_children += 1;
            }
            None if id.is_fix() => {
                self.next_fix = self.next_fix.max(id.path()[0].saturating_add(1))
            }
            None => self.next_root = self.next_root.max(id.path()[0].saturating_add(1)),
        }
        Ok(())
    }

    /// A new task lengthens the chains of the tasks it depends on. Walks upward only while a
    /// chain actually grows, so the cost is bounded by the ancestors whose value changes.
    fn raise_critical_paths(&mut self, from: NodeIndex) {
        let mut stack = vec![from];
        while let Some(ix) = stack.pop() {
            let needed = self.dag[ix].critical_path.saturating_add(1);
            let mut deps = self
                .dag
                .neighbors_directed(ix, Direction::Incoming)
                .detach();
            while let Some(d) = deps.next_node(&self.dag) {
                if self.dag[d].critical_path < needed {
                    self.dag[d].critical_path = needed;
                    stack.push(d);
                }
            }
        }
    }

    /// Every state change goes through here: it checks the transition table and keeps the
    /// incremental counters true.
    fn set_state(&mut self, ix: NodeIndex, next: TaskState) -> Result<(), GraphError> {
        let node = &self.dag[ix];
        let prev = node.state;
        prev.transition(&node.id, next)?;
        let was_open = is_open(prev);
        self.dag[ix].state = next;
        if prev == TaskState::Landing && next != TaskState::Landing && !self.intents.is_empty() {
            let id = self.dag[ix].id.clone();
            self.intents.remove(&id);
        }
        if was_open && !is_open(next) {
            let fp = self.dag[ix].fingerprint;
            if self.open_fingerprints.get(&fp) == Some(&ix) {
                self.open_fingerprints.remove(&fp);
            }
        }
        if next.is_terminal() {
            self.live -= 1;
            // Only a retry reads it (ADR-031); an ended task gives its memory back.
            self.dag[ix].previous = None;
            if let Some(FixOf::Sweep { signature, .. }) = self.dag[ix].fix.as_deref()
                && self.open_sweep_fixes.get(signature) == Some(&ix)
            {
                self.open_sweep_fixes.remove(signature);
            }
            let parent = self.dag[ix].parent;
            match parent {
                Some(p) => {
                    let parent = &mut self.dag[p];
                    parent.open_children -= 1;
                    if next == TaskState::Completed {
                        parent.completed_children += 1;
                    }
                    if parent.decomposition_open {
                        parent.unheard.push(ix);
                    }
                }
                // A fix task's failure is judged by what it was for: a conflict fix fails its
                // task, and a red main is the finalization's to judge.
                None if next != TaskState::Completed && !self.dag[ix].id.is_fix() => {
                    self.unsuccessful_roots += 1
                }
                None => {}
            }
            if next == TaskState::Completed {
                let mut succ = self
                    .dag
                    .neighbors_directed(ix, Direction::Outgoing)
                    .detach();
                while let Some(s) = succ.next_node(&self.dag) {
                    self.dag[s].unfinished_deps -= 1;
                }
            }
        }
        Ok(())
    }

    pub(super) fn emit(&mut self, out: &mut Emitted, event: EventKind) -> Result<(), GraphError> {
        self.apply(&event)?;
        out.push(event);
        Ok(())
    }

    pub(super) fn ignore(
        &self,
        out: &mut Emitted,
        task: Option<&TaskId>,
        message: &str,
        why: String,
    ) {
        out.push(EventKind::MessageIgnored {
            task: task.cloned(),
            message: message.to_string(),
            why,
        });
    }
}

/// A commit's first 7 hex digits, for messages.
pub(super) fn short(commit: &str) -> &str {
    commit.get(..7).unwrap_or(commit)
}
