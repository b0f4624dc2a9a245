//! The Dispatch actor: hands ready tasks to worker slots and to the subplanner.
//!
//! Order: priority (1 first), then the longest remaining dependency chain (critical path),
//! then age. A task whose scope overlaps a running task's scope waits; tasks behind it may
//! go first. A task with `subplanner_scope_threshold` or more scope paths, above the maximum
//! depth, goes to the subplanner (unless the Subplanner already found it atomic), which has its own concurrency limit and takes no scope
//! locks: it only plans, and its subtasks lock what they touch. The best-fitting worker
//! profile is chosen in the same turn (no bidding window).
//!
//! Dispatch reacts to `Ready` and `Release` only; it never polls. After each, it reports the
//! number of free worker slots to the TaskGraph when that number changed
//! (`WorkerCapacity`), which forwards it to the planner: the planner does not replan while
//! every slot is busy.
//!
//! A task whose scope a running task holds is parked under that task and looked at again only
//! when it ends, so a hand-out costs O(log n) in the waiting tasks, never a walk over them (M7).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use actix::prelude::*;
use serde::{Deserialize, Serialize};

use crate::config::Limits;
use crate::graph::scope::ScopeLocks;
use crate::protocol::ScopePath;
use crate::protocol::{
    Assignment, ReadyTask, Route, RunId, TaskId, ToAgent, ToDispatch, ToTaskGraph, WorkOrder,
    branch_name,
};
use crate::supervision::{Lifeline, StopCause, StopMember};
use tracing::warn;

/// A kind of worker: what it can do, what it costs, and which agent does the work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerProfile {
    pub name: String,
    #[serde(default)]
    pub capabilities: BTreeSet<String>,
    /// Relative cost; the cheapest profile that fits wins.
    #[serde(default = "default_cost")]
    pub cost: u32,
    /// `scripted`, `builtin`, or the name of an `[agents.NAME]` command agent. None: the
    /// built-in agent when the worker role has a model, else the scripted agent. Dispatch
    /// does not read it; the run's WorkerPool does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

fn default_cost() -> u32 {
    1
}

impl WorkerProfile {
    pub fn new(name: &str, capabilities: &[&str], cost: u32) -> Self {
        WorkerProfile {
            name: name.into(),
            capabilities: capabilities.iter().map(|c| c.to_string()).collect(),
            cost,
            agent: None,
        }
    }
}

/// The cheapest profile offering every required capability; ties go to the profile with the
/// fewest capabilities (keep specialists free), then to the name.
pub fn best_profile<'a>(
    profiles: &'a [WorkerProfile],
    required: &BTreeSet<String>,
) -> Option<&'a WorkerProfile> {
    profiles
        .iter()
        .filter(|p| required.is_subset(&p.capabilities))
        .min_by(|a, b| {
            (a.cost, a.capabilities.len(), &a.name).cmp(&(b.cost, b.capabilities.len(), &b.name))
        })
}

/// Where a ready task stands in Dispatch's queue: smaller goes first (the MergeQueue lands
/// by the same order, [`Urgency::order`](crate::protocol::Urgency::order)).
pub type DispatchOrder = WorkOrder;

/// The order Dispatch hands ready tasks out in (`flotilla bench` simulates it).
pub fn dispatch_order(task: &ReadyTask) -> DispatchOrder {
    task.urgency().order(&task.task)
}

type QueueKey = DispatchOrder;

struct Running {
    route: Route,
    scope: Vec<ScopePath>,
}

/// Where a task that waits for Dispatch is.
#[derive(Debug, Clone)]
enum Waiting {
    Ready(Route, QueueKey),
    /// Parked under the running task whose scope it needs.
    Parked(TaskId, QueueKey),
}

pub struct Dispatch {
    run: RunId,
    limits: Limits,
    profiles: Vec<WorkerProfile>,
    graph: Recipient<ToTaskGraph>,
    worker: Recipient<ToAgent>,
    subplanner: Recipient<ToAgent>,
    /// Tasks that may run as soon as their route has a slot, one queue per route.
    ready_workers: BTreeMap<QueueKey, ReadyTask>,
    ready_subplanners: BTreeMap<QueueKey, ReadyTask>,
    /// Worker tasks whose scope a running task holds, parked under that task: they are
    /// looked at again only when it ends (not on every hand-out).
    parked: HashMap<TaskId, BTreeMap<QueueKey, ReadyTask>>,
    /// Where each waiting task is.
    queued: HashMap<TaskId, Waiting>,
    running: HashMap<TaskId, Running>,
    busy_workers: usize,
    busy_subplanners: usize,
    locks: ScopeLocks,
    /// Free worker slots last reported to the graph (for the planner), so that only changes
    /// are sent.
    reported_free: Option<usize>,
    /// Reports to the run's supervisor when the actor ends.
    lifeline: Option<Lifeline>,
}

impl Dispatch {
    pub fn new(
        run: RunId,
        limits: Limits,
        profiles: Vec<WorkerProfile>,
        graph: Recipient<ToTaskGraph>,
        worker: Recipient<ToAgent>,
        subplanner: Recipient<ToAgent>,
    ) -> Self {
        Dispatch {
            run,
            limits,
            profiles,
            graph,
            worker,
            subplanner,
            ready_workers: BTreeMap::new(),
            ready_subplanners: BTreeMap::new(),
            parked: HashMap::new(),
            queued: HashMap::new(),
            running: HashMap::new(),
            busy_workers: 0,
            busy_subplanners: 0,
            locks: ScopeLocks::default(),
            reported_free: None,
            lifeline: None,
        }
    }

    /// Reports to the run's supervisor when the actor ends, however it ends.
    pub fn watched(mut self, lifeline: Lifeline) -> Self {
        self.lifeline = Some(lifeline);
        self
    }

    fn route(&self, task: &ReadyTask) -> Route {
        if !task.atomic
            && task.spec.scope.len() >= self.limits.subplanner_scope_threshold
            && task.task.depth() < self.limits.max_depth
        {
            Route::Subplanner
        } else {
            Route::Worker
        }
    }

    fn has_slot(&self, route: Route) -> bool {
        match route {
            Route::Worker => self.busy_workers < self.limits.max_workers,
            Route::Subplanner => self.busy_subplanners < self.limits.max_subplanners,
        }
    }

    fn queue_of(&mut self, route: Route) -> &mut BTreeMap<QueueKey, ReadyTask> {
        match route {
            Route::Worker => &mut self.ready_workers,
            Route::Subplanner => &mut self.ready_subplanners,
        }
    }

    fn enqueue(&mut self, task: ReadyTask) {
        self.remove_queued(&task.task);
        let key = dispatch_order(&task);
        let route = self.route(&task);
        self.queued
            .insert(task.task.clone(), Waiting::Ready(route, key.clone()));
        self.queue_of(route).insert(key, task);
    }

    fn remove_queued(&mut self, task: &TaskId) {
        match self.queued.remove(task) {
            Some(Waiting::Ready(route, key)) => {
                self.queue_of(route).remove(&key);
            }
            Some(Waiting::Parked(blocker, key)) => {
                if let Some(parked) = self.parked.get_mut(&blocker) {
                    parked.remove(&key);
                    if parked.is_empty() {
                        self.parked.remove(&blocker);
                    }
                }
            }
            None => {}
        }
    }

    fn release(&mut self, task: &TaskId) {
        self.remove_queued(task);
        if let Some(running) = self.running.remove(task) {
            match running.route {
                Route::Worker => self.busy_workers -= 1,
                Route::Subplanner => self.busy_subplanners -= 1,
            }
            self.locks.release(&running.scope);
        }
        // What waited for its scope may run now (or park under another holder).
        if let Some(parked) = self.parked.remove(task) {
            for (key, waiting) in parked {
                self.queued.insert(
                    waiting.task.clone(),
                    Waiting::Ready(Route::Worker, key.clone()),
                );
                self.ready_workers.insert(key, waiting);
            }
        }
    }

    /// The running task holding a path that `scope` overlaps (at most `max_workers` are
    /// looked at).
    fn holder_of(&self, scope: &[ScopePath]) -> Option<TaskId> {
        self.running
            .iter()
            .find(|(_, r)| {
                r.scope
                    .iter()
                    .any(|held| scope.iter().any(|wanted| held.overlaps(wanted)))
            })
            .map(|(task, _)| task.clone())
    }

    /// Hands out as many queued tasks as slots and scope locks allow, in queue order, route
    /// by route. Each decision looks at the head of a queue: a task that cannot run for
    /// want of a scope is parked under the task holding it, and one no profile can run
    /// leaves, so neither is looked at again until something changes for it. A hand-out
    /// costs O(log n) in the tasks waiting, not a walk over them.
    fn pump(&mut self) {
        while self.has_slot(Route::Subplanner) {
            let Some((_, task)) = self.ready_subplanners.pop_first() else {
                break;
            };
            self.queued.remove(&task.task);
            self.hand_out(
                task,
                Route::Subplanner,
                "subplanner".to_string(),
                Vec::new(),
            );
        }
        while self.has_slot(Route::Worker) {
            let Some((key, task)) = self.ready_workers.pop_first() else {
                break;
            };
            self.queued.remove(&task.task);
            let Some(profile) = best_profile(&self.profiles, &task.spec.capabilities) else {
                let wanted: Vec<&str> = task.spec.capabilities.iter().map(String::as_str).collect();
                self.graph.do_send(ToTaskGraph::Undispatchable {
                    task: task.task,
                    attempt: task.attempt,
                    reason: format!(
                        "no worker profile offers capabilities [{}]",
                        wanted.join(", ")
                    ),
                });
                continue;
            };
            let profile = profile.name.clone();
            // Scopes were normalized when the task entered the graph.
            let scope: Vec<ScopePath> = task
                .spec
                .scope
                .iter()
                .filter_map(|p| ScopePath::parse(p, usize::MAX).ok())
                .collect();
            if self.locks.conflicts(&scope) {
                match self.holder_of(&scope) {
                    Some(holder) => {
                        self.queued.insert(
                            task.task.clone(),
                            Waiting::Parked(holder.clone(), key.clone()),
                        );
                        self.parked.entry(holder).or_default().insert(key, task);
                    }
                    None => {
                        // The locks and the running tasks disagree: never lose the task.
                        warn!(run = %self.run, task = %task.task, "a scope conflict without a holder; the task waits in the queue");
                        self.queued.insert(
                            task.task.clone(),
                            Waiting::Ready(Route::Worker, key.clone()),
                        );
                        self.ready_workers.insert(key, task);
                        break;
                    }
                }
                continue;
            }
            self.locks.acquire(&scope);
            self.hand_out(task, Route::Worker, profile, scope);
        }
    }

    fn hand_out(&mut self, task: ReadyTask, route: Route, profile: String, scope: Vec<ScopePath>) {
        match route {
            Route::Worker => self.busy_workers += 1,
            Route::Subplanner => self.busy_subplanners += 1,
        }
        self.running
            .insert(task.task.clone(), Running { route, scope });
        let agent = match route {
            Route::Worker => self.worker.clone(),
            Route::Subplanner => self.subplanner.clone(),
        };
        // The graph hears of the dispatch before the agent can report a start.
        self.graph.do_send(ToTaskGraph::TaskDispatched {
            task: task.task.clone(),
            attempt: task.attempt,
            profile: profile.clone(),
            route,
            agent: agent.clone(),
        });
        let branch = branch_name(self.run, &task.task, task.attempt);
        agent.do_send(ToAgent::Assign(Assignment {
            run: self.run,
            task,
            profile,
            route,
            branch,
        }));
    }
}

impl Dispatch {
    /// Tells the graph (for the planner) how many worker slots stay free after a hand-out,
    /// when that number changed, and after every `Ready`: the planner lowers its count by
    /// the tasks of a batch it just got accepted, and this confirms or corrects it. The
    /// planner uses it to plan only when there is capacity to use; messages, never a poll.
    fn report_capacity(&mut self, always: bool) {
        let free = self.limits.max_workers.saturating_sub(self.busy_workers);
        if always || self.reported_free != Some(free) {
            self.reported_free = Some(free);
            self.graph.do_send(ToTaskGraph::WorkerCapacity { free });
        }
    }
}

impl Actor for Dispatch {
    type Context = Context<Self>;
}

impl Handler<ToDispatch> for Dispatch {
    type Result = ();

    fn handle(&mut self, msg: ToDispatch, _: &mut Context<Self>) {
        let after_ready = matches!(msg, ToDispatch::Ready(_));
        match msg {
            ToDispatch::Ready(tasks) => {
                for task in tasks {
                    if !self.running.contains_key(&task.task) {
                        self.enqueue(task);
                    }
                }
            }
            ToDispatch::Release { task } => self.release(&task),
        }
        self.pump();
        self.report_capacity(after_ready);
    }
}

impl Handler<StopMember> for Dispatch {
    type Result = ();

    fn handle(&mut self, _: StopMember, ctx: &mut Context<Self>) {
        if let Some(lifeline) = &mut self.lifeline {
            lifeline.set_cause(StopCause::Finished);
        }
        ctx.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cheapest_fitting_profile_wins() {
        let profiles = vec![
            WorkerProfile::new("big", &["rust", "web"], 5),
            WorkerProfile::new("rust", &["rust"], 2),
            WorkerProfile::new("general", &[], 1),
        ];
        let need = |caps: &[&str]| caps.iter().map(|c| c.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(best_profile(&profiles, &need(&[])).unwrap().name, "general");
        assert_eq!(
            best_profile(&profiles, &need(&["rust"])).unwrap().name,
            "rust"
        );
        assert_eq!(
            best_profile(&profiles, &need(&["rust", "web"]))
                .unwrap()
                .name,
            "big"
        );
        assert!(best_profile(&profiles, &need(&["gpu"])).is_none());
    }
}
