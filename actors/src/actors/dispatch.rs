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

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use actix::prelude::*;
use serde::{Deserialize, Serialize};

use crate::config::Limits;
use crate::graph::scope::{ScopeLocks, ScopePath};
use crate::protocol::{
    Assignment, Priority, ReadyTask, Route, RunId, TaskId, ToAgent, ToDispatch, ToTaskGraph,
    branch_name,
};
use crate::supervision::{Lifeline, StopCause, StopMember};

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

/// Queue order: most urgent, then longest chain, then oldest.
type QueueKey = (Priority, Reverse<u32>, u64, TaskId);

struct Running {
    route: Route,
    scope: Vec<ScopePath>,
}

pub struct Dispatch {
    run: RunId,
    limits: Limits,
    profiles: Vec<WorkerProfile>,
    graph: Recipient<ToTaskGraph>,
    worker: Recipient<ToAgent>,
    subplanner: Recipient<ToAgent>,
    queue: BTreeMap<QueueKey, ReadyTask>,
    queued: HashMap<TaskId, QueueKey>,
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
            queue: BTreeMap::new(),
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

    fn enqueue(&mut self, task: ReadyTask) {
        self.remove_queued(&task.task);
        let key = (
            task.spec.priority,
            Reverse(task.critical_path),
            task.created,
            task.task.clone(),
        );
        self.queued.insert(task.task.clone(), key.clone());
        self.queue.insert(key, task);
    }

    fn remove_queued(&mut self, task: &TaskId) {
        if let Some(key) = self.queued.remove(task) {
            self.queue.remove(&key);
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
    }

    /// Hands out as many queued tasks as slots and scope locks allow, in queue order.
    fn pump(&mut self) {
        let mut handed = Vec::new();
        let mut undispatchable = Vec::new();
        for (key, task) in &self.queue {
            let worker_full = !self.has_slot(Route::Worker);
            if worker_full && !self.has_slot(Route::Subplanner) {
                break;
            }
            let route = self.route(task);
            if !self.has_slot(route) {
                continue;
            }
            let profile = match route {
                Route::Subplanner => "subplanner".to_string(),
                Route::Worker => match best_profile(&self.profiles, &task.spec.capabilities) {
                    Some(p) => p.name.clone(),
                    None => {
                        undispatchable.push(key.clone());
                        continue;
                    }
                },
            };
            // Scopes were normalized when the task entered the graph.
            let scope: Vec<ScopePath> = task
                .spec
                .scope
                .iter()
                .filter_map(|p| ScopePath::parse(p, usize::MAX).ok())
                .collect();
            if route == Route::Worker {
                if self.locks.conflicts(&scope) {
                    continue;
                }
                self.locks.acquire(&scope);
                self.busy_workers += 1;
            } else {
                self.busy_subplanners += 1;
            }
            self.running
                .insert(task.task.clone(), Running { route, scope });
            handed.push((key.clone(), route, profile));
        }
        for key in undispatchable {
            if let Some(task) = self.queue.remove(&key) {
                self.queued.remove(&task.task);
                let wanted: Vec<&str> = task.spec.capabilities.iter().map(String::as_str).collect();
                self.graph.do_send(ToTaskGraph::Undispatchable {
                    task: task.task,
                    attempt: task.attempt,
                    reason: format!(
                        "no worker profile offers capabilities [{}]",
                        wanted.join(", ")
                    ),
                });
            }
        }
        for (key, route, profile) in handed {
            let Some(task) = self.queue.remove(&key) else {
                continue;
            };
            self.queued.remove(&task.task);
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
