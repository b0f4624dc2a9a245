//! The task graph under arbitrary LLM output and arbitrary message sequences: a running
//! parent, then an arbitrary planner batch, an arbitrary subplan for the parent, and a
//! sequence of commands (every one the actors send) with arbitrary tasks, attempts and
//! numbers. After every command the invariants of `flotilla_fuzz::Watch` must hold.

#![no_main]

use std::collections::BTreeSet;

use arbitrary::Arbitrary;
use flotilla_actors::config::Limits;
use flotilla_actors::graph::RunGraph;
use flotilla_actors::protocol::*;
use flotilla_fuzz::Watch;
use libfuzzer_sys::fuzz_target;

/// Text: mostly from a pool of interesting values, sometimes anything.
#[derive(Arbitrary, Debug)]
enum Text {
    Pool(u8),
    Raw(String),
}

const PATHS: &[&str] = &[
    "src",
    "src/a",
    "src/a/b.rs",
    "src/b",
    "docs",
    "docs/x.md",
    "lib.rs",
    "src/a /",
    " src ",
    "./src//a",
    ".git",
    "src/.git /",
    "..",
    "src/../x",
    "~/x",
    "C:/x",
    "/etc",
    "a\\b",
    "",
    " ",
    ".",
    "src/ a b /",
    "s /",
    "\u{a0}src",
    "src\u{0}",
];
const WORDS: &[&str] = &[
    "lexer", "parser", "docs", "", " ", "\t", "lexer ", "Lexer", "ü",
];

impl Text {
    fn pick(&self, pool: &[&str]) -> String {
        match self {
            Text::Pool(i) => pool[*i as usize % pool.len()].to_string(),
            Text::Raw(s) => s.clone(),
        }
    }
    fn path(&self) -> String {
        self.pick(PATHS)
    }
    fn word(&self) -> String {
        self.pick(WORDS)
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Num {
    Small(u8),
    Mid(u32),
    Max,
    Raw(u64),
}

impl Num {
    fn get(self) -> u64 {
        match self {
            Num::Small(n) => n.into(),
            Num::Mid(n) => n.into(),
            Num::Max => u64::MAX,
            Num::Raw(n) => n,
        }
    }
}

#[derive(Arbitrary, Debug)]
struct BudgetIn {
    tokens: Num,
    micros: Num,
    wall_ms: Num,
}

impl BudgetIn {
    fn get(&self) -> Budget {
        Budget::new(
            self.tokens.get(),
            Usd::from_micros(self.micros.get()),
            self.wall_ms.get(),
        )
    }
}

/// A task: one that exists (by index, modulo the graph's size), or any id.
#[derive(Arbitrary, Debug)]
enum TaskRef {
    Existing(u8),
    Raw(Vec<u8>),
}

impl TaskRef {
    fn get(&self, g: &RunGraph) -> TaskId {
        match self {
            TaskRef::Existing(i) => {
                let ids: Vec<TaskId> = g.tasks().map(|t| t.id.clone()).collect();
                if ids.is_empty() {
                    TaskId::root(1)
                } else {
                    ids[*i as usize % ids.len()].clone()
                }
            }
            // Ids from outside (a report, a subplan, a user) are parsed, so they are never
            // deeper than MAX_TASK_DEPTH.
            TaskRef::Raw(path) => {
                let mut id = TaskId::root(u32::from(*path.first().unwrap_or(&1)).max(1));
                for n in path.iter().skip(1).take(MAX_TASK_DEPTH as usize - 1) {
                    id = id.child(u32::from(*n).max(1));
                }
                id
            }
        }
    }
}

#[derive(Arbitrary, Debug)]
enum AttemptIn {
    Current,
    Raw(u32),
}

impl AttemptIn {
    fn get(&self, g: &RunGraph, task: &TaskId) -> u32 {
        match self {
            AttemptIn::Current => g.task(task).map_or(1, |t| t.attempt),
            AttemptIn::Raw(n) => *n,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum DepIn {
    Batch(u8),
    Task(TaskRef),
}

#[derive(Arbitrary, Debug)]
struct SpecIn {
    description: Text,
    scope: Vec<Text>,
    priority: Option<u8>,
    capabilities: Vec<Text>,
    budget: Option<BudgetIn>,
    dependencies: Vec<DepIn>,
}

impl SpecIn {
    fn get(&self, g: &RunGraph) -> TaskSpec {
        let mut spec = TaskSpec::new(self.description.word(), &[]);
        spec.scope = self.scope.iter().map(Text::path).collect();
        if let Some(p) = self.priority.and_then(|p| Priority::new(p % 12).ok()) {
            spec.priority = p;
        }
        spec.capabilities = self.capabilities.iter().map(Text::word).collect();
        spec.budget = self.budget.as_ref().map(BudgetIn::get);
        spec.dependencies = self
            .dependencies
            .iter()
            .map(|d| match d {
                DepIn::Batch(i) => DependencyRef::Batch((*i % 8).into()),
                DepIn::Task(t) => DependencyRef::Task(t.get(g)),
            })
            .collect();
        spec
    }
}

#[derive(Arbitrary, Debug)]
struct SubIn {
    description: Text,
    scope: Vec<Text>,
    capabilities: Vec<Text>,
    depends_on: Vec<u8>,
    budget_cap: Option<BudgetIn>,
    priority: Option<u8>,
}

/// A subplan: well-formed (so that decompositions are accepted often enough for the
/// fuzzer to reach subtasks, synthesis and user decisions), or anything.
#[derive(Arbitrary, Debug)]
enum SubplanIn {
    Valid {
        count: u8,
        chain: bool,
        stop_when: u8,
    },
    Raw(RawSubplan),
}

#[derive(Arbitrary, Debug)]
struct RawSubplan {
    /// `None`: the task the report is about.
    parent: Option<TaskRef>,
    reason: u8,
    stop_when: u8,
    subtasks: Vec<SubIn>,
}

const STOP: [StopCondition; 3] = [
    StopCondition::AllSubtasksComplete,
    StopCondition::FirstSuccess,
    StopCondition::UserDecision,
];

impl SubplanIn {
    fn get(&self, g: &RunGraph, task: &TaskId) -> ProposedSubplan {
        match self {
            SubplanIn::Raw(raw) => raw.get(g, task),
            SubplanIn::Valid {
                count,
                chain,
                stop_when,
            } => {
                // Disjoint paths inside the task's own first scope path.
                let base = g
                    .task(task)
                    .and_then(|t| t.scope.first())
                    .map_or("src".to_string(), |p| p.as_str().to_string());
                let subtasks = (0..usize::from(*count % 4) + 1)
                    .map(|i| {
                        let mut s = SubtaskProposal::new(
                            format!("part {i} of {task}"),
                            &[&format!("{base}/p{i}")],
                        );
                        if *chain && i > 0 {
                            s.depends_on = vec![i - 1];
                        }
                        s
                    })
                    .collect();
                ProposedSubplan {
                    parent: task.clone(),
                    reason: DecompositionReason::TooLarge,
                    stop_when: STOP[*stop_when as usize % 3],
                    subtasks,
                }
            }
        }
    }
}

impl RawSubplan {
    fn get(&self, g: &RunGraph, task: &TaskId) -> ProposedSubplan {
        ProposedSubplan {
            parent: self
                .parent
                .as_ref()
                .map_or_else(|| task.clone(), |p| p.get(g)),
            reason: [
                DecompositionReason::TooLarge,
                DecompositionReason::MissingInfo,
                DecompositionReason::DependencyDiscovered,
                DecompositionReason::Ambiguity,
                DecompositionReason::ExternalToolRequired,
            ][self.reason as usize % 5],
            stop_when: STOP[self.stop_when as usize % 3],
            subtasks: self
                .subtasks
                .iter()
                .map(|s| SubtaskProposal {
                    description: s.description.word(),
                    scope: s.scope.iter().map(Text::path).collect(),
                    acceptance: String::new(),
                    capabilities: s
                        .capabilities
                        .iter()
                        .map(Text::word)
                        .collect::<BTreeSet<_>>(),
                    depends_on: s.depends_on.iter().map(|d| (*d % 12).into()).collect(),
                    budget_cap: s.budget_cap.as_ref().map(BudgetIn::get),
                    expected_outputs: Vec::new(),
                    priority: s.priority.and_then(|p| Priority::new(p % 12).ok()),
                })
                .collect(),
        }
    }
}

#[derive(Arbitrary, Debug)]
struct HandoffIn {
    status: u8,
    summary: Text,
    tokens_in: Num,
    tokens_out: Num,
    micros: Num,
    duration_ms: Num,
}

impl HandoffIn {
    fn get(&self) -> Handoff {
        let mut h = Handoff::complete(self.summary.word());
        h.status = [
            HandoffStatus::Complete,
            HandoffStatus::Partial,
            HandoffStatus::Blocked,
            HandoffStatus::Failed,
        ][self.status as usize % 4];
        h.metrics.tokens_in = self.tokens_in.get();
        h.metrics.tokens_out = self.tokens_out.get();
        h.metrics.cost_usd = Usd::from_micros(self.micros.get());
        h.metrics.duration_ms = self.duration_ms.get();
        h
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    Submit(Vec<SpecIn>),
    PlannerAnswered {
        tasks: Result<Vec<SpecIn>, Text>,
        tokens: Num,
        micros: Num,
    },
    Dispatched {
        task: TaskRef,
        attempt: AttemptIn,
        subplanner: bool,
    },
    Undispatchable {
        task: TaskRef,
        attempt: AttemptIn,
    },
    Started {
        task: TaskRef,
        attempt: AttemptIn,
    },
    /// Dispatch and start a ready task, as the actors would.
    Run(TaskRef),
    Complete {
        task: TaskRef,
        attempt: AttemptIn,
        handoff: Option<HandoffIn>,
        subplan: Option<SubplanIn>,
    },
    Failed {
        task: TaskRef,
        attempt: AttemptIn,
        failure: u8,
    },
    Spend {
        task: TaskRef,
        attempt: AttemptIn,
        spent: BudgetIn,
    },
    Cancel(Option<TaskRef>),
    UserDecision {
        task: TaskRef,
        decision: u8,
        subtask: TaskRef,
    },
    Deadline {
        task: TaskRef,
        decomposition: u8,
    },
    Interrupt,
    PlanningFinished,
    PlannerGaveUp,
    /// Report on the `n`th task an agent is at work on (its current attempt).
    Report {
        n: u8,
        handoff: Option<HandoffIn>,
        subplan: Option<SubplanIn>,
    },
    /// A Subplanner answer about a task: its subtasks (as the Subplanner would send them
    /// after filtering, or anything), or why the answer was unusable.
    SubplannerAnswered {
        task: TaskRef,
        attempt: AttemptIn,
        subtasks: Result<Option<SubplanIn>, Text>,
        tokens: Num,
        /// Report the first `reported` ended subtasks as carried by the prompt.
        reported: u8,
    },
    SubplannerStopped {
        task: TaskRef,
        attempt: AttemptIn,
    },
    /// Every live task one step along the happy path: ready ones are dispatched and
    /// started, running and synthesizing ones complete, waiting ones get `decision`.
    Settle {
        decision: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct LimitsIn {
    max_depth: u8,
    max_subtasks: u8,
    max_nodes: u8,
    max_proposals_per_attempt: u8,
    max_decompositions_per_run: u8,
    max_attempts: u8,
    max_subplan_rejections: u8,
    max_scope_paths: u8,
    max_path_bytes: u8,
    max_description_bytes: u8,
    max_capabilities: u8,
    subplanner_scope_threshold: u8,
    tight_budgets: bool,
}

impl LimitsIn {
    fn get(&self) -> Limits {
        let small = |n: u8, max: u8| usize::from(n % max) + 1;
        let mut l = Limits {
            max_depth: (self.max_depth % (MAX_TASK_DEPTH as u8 + 1)).max(1).into(),
            max_subtasks: small(self.max_subtasks, 12),
            max_nodes: small(self.max_nodes, 40),
            max_proposals_per_attempt: (self.max_proposals_per_attempt % 5).into(),
            max_decompositions_per_run: (self.max_decompositions_per_run % 8).into(),
            max_attempts: (self.max_attempts % 4).max(1).into(),
            max_subplan_rejections: (self.max_subplan_rejections % 4).max(1).into(),
            max_scope_paths: small(self.max_scope_paths, 8),
            max_path_bytes: small(self.max_path_bytes, 64),
            max_description_bytes: small(self.max_description_bytes, 64),
            max_capabilities: usize::from(self.max_capabilities % 4),
            subplanner_scope_threshold: usize::from(self.subplanner_scope_threshold % 6),
            ..Limits::default()
        };
        if self.tight_budgets {
            l.default_budget = Budget::new(1_000, Usd::from_micros(1_000), 1_000);
            l.max_task_budget = Budget::new(2_000, Usd::from_micros(2_000), 2_000);
            l.run_budget = Budget::new(5_000, Usd::from_micros(5_000), 5_000);
        }
        l
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    limits: LimitsIn,
    batch: Vec<SpecIn>,
    subplan: SubplanIn,
    handoff: Option<HandoffIn>,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let limits = input.limits.get();
    if limits.validate().is_err() {
        return;
    }
    let mut g = RunGraph::new(limits);
    let mut w = Watch::default();
    // A running parent.
    let parent = TaskId::root(1);
    let r = g.submit(vec![TaskSpec::new("parent", &["src"])]);
    w.after(&g, "submit", r);
    let r = g.dispatched(&parent, 1, "general", Route::Worker);
    w.after(&g, "dispatched", r);
    let r = g.started(&parent, 1);
    w.after(&g, "started", r);
    // An arbitrary planner batch, then an arbitrary subplan for the parent.
    let batch = input.batch.iter().map(|s| s.get(&g)).collect();
    let r = g.submit(batch);
    w.after(&g, "planner batch", r);
    let report = TaskCompleted {
        task: parent.clone(),
        attempt: 1,
        handoff: input.handoff.as_ref().map(HandoffIn::get),
        artifacts: Vec::new(),
        subplan: Some(input.subplan.get(&g, &parent)),
    };
    let r = g.complete(report);
    w.after(&g, "subplan", r);

    for (n, op) in input.ops.iter().enumerate().take(64) {
        let (what, r) = match op {
            Op::Submit(specs) => {
                let specs = specs.iter().map(|s| s.get(&g)).collect();
                ("submit", g.submit(specs))
            }
            Op::PlannerAnswered {
                tasks,
                tokens,
                micros,
            } => {
                let tasks = match tasks {
                    Ok(specs) => Ok(specs.iter().map(|s| s.get(&g)).collect()),
                    Err(e) => Err(e.word()),
                };
                let answer = PlannerAnswer {
                    call: g.planner_calls(),
                    prompt: "p".into(),
                    content: "c".into(),
                    usage: Usage {
                        tokens_in: tokens.get(),
                        tokens_out: tokens.get(),
                        cost_usd: Usd::from_micros(micros.get()),
                    },
                    tasks,
                };
                ("planner_answered", g.planner_answered(answer))
            }
            Op::Dispatched {
                task,
                attempt,
                subplanner,
            } => {
                let t = task.get(&g);
                let a = attempt.get(&g, &t);
                let route = if *subplanner {
                    Route::Subplanner
                } else {
                    Route::Worker
                };
                ("dispatched", g.dispatched(&t, a, "general", route))
            }
            Op::Undispatchable { task, attempt } => {
                let t = task.get(&g);
                let a = attempt.get(&g, &t);
                ("undispatchable", g.undispatchable(&t, a, "no profile"))
            }
            Op::Started { task, attempt } => {
                let t = task.get(&g);
                let a = attempt.get(&g, &t);
                ("started", g.started(&t, a))
            }
            Op::Run(task) => {
                let t = task.get(&g);
                let a = g.task(&t).map_or(1, |n| n.attempt);
                let r = g.dispatched(&t, a, "general", Route::Worker);
                w.after(&g, "dispatched", r);
                ("started", g.started(&t, a))
            }
            Op::Complete {
                task,
                attempt,
                handoff,
                subplan,
            } => {
                let t = task.get(&g);
                let a = attempt.get(&g, &t);
                let report = TaskCompleted {
                    task: t.clone(),
                    attempt: a,
                    handoff: handoff.as_ref().map(HandoffIn::get),
                    artifacts: Vec::new(),
                    subplan: subplan.as_ref().map(|s| s.get(&g, &t)),
                };
                ("complete", g.complete(report))
            }
            Op::Failed {
                task,
                attempt,
                failure,
            } => {
                let t = task.get(&g);
                let a = attempt.get(&g, &t);
                let failure = match failure % 6 {
                    0 => AttemptFailure::Crashed { detail: "x".into() },
                    1 => AttemptFailure::Malformed { detail: "x".into() },
                    2 => AttemptFailure::TimedOut { limit_ms: u64::MAX },
                    3 => AttemptFailure::RunnerDied { detail: "x".into() },
                    4 => AttemptFailure::Reported {
                        summary: "x".into(),
                    },
                    _ => AttemptFailure::Cancelled,
                };
                ("failed", g.failed(&t, a, failure))
            }
            Op::Spend {
                task,
                attempt,
                spent,
            } => {
                let t = task.get(&g);
                let a = attempt.get(&g, &t);
                ("spend_reported", g.spend_reported(&t, a, spent.get()))
            }
            Op::Cancel(task) => {
                let t = task.as_ref().map(|t| t.get(&g));
                ("cancel", g.cancel(t.as_ref(), "fuzz"))
            }
            Op::UserDecision {
                task,
                decision,
                subtask,
            } => {
                let t = task.get(&g);
                let decision = match decision % 3 {
                    0 => UserDecision::Accept {
                        subtask: subtask.get(&g),
                    },
                    1 => UserDecision::Complete,
                    _ => UserDecision::Fail,
                };
                ("user_decision", g.user_decision(&t, &decision))
            }
            Op::Deadline {
                task,
                decomposition,
            } => {
                let t = task.get(&g);
                (
                    "deadline_passed",
                    g.deadline_passed(&t, (*decomposition % 4).into()),
                )
            }
            Op::Report {
                n,
                handoff,
                subplan,
            } => {
                let at_work: Vec<TaskId> = g
                    .tasks()
                    .filter(|t| matches!(t.state, TaskState::Running | TaskState::Synthesizing))
                    .map(|t| t.id.clone())
                    .collect();
                let Some(t) =
                    (!at_work.is_empty()).then(|| at_work[*n as usize % at_work.len()].clone())
                else {
                    continue;
                };
                let report = TaskCompleted {
                    task: t.clone(),
                    attempt: g.task(&t).map_or(1, |n| n.attempt),
                    handoff: handoff.as_ref().map(HandoffIn::get),
                    artifacts: Vec::new(),
                    subplan: subplan.as_ref().map(|s| s.get(&g, &t)),
                };
                ("report", g.complete(report))
            }
            Op::Settle { decision } => {
                let live: Vec<(TaskId, TaskState, u32)> = g
                    .tasks()
                    .filter(|t| !t.state.is_terminal())
                    .map(|t| (t.id.clone(), t.state, t.attempt))
                    .collect();
                for (t, state, a) in live {
                    let r = match state {
                        TaskState::Ready => {
                            let r = g.dispatched(&t, a, "general", Route::Worker);
                            w.after(&g, "settle: dispatched", r);
                            g.started(&t, a)
                        }
                        TaskState::Dispatched => g.started(&t, a),
                        TaskState::Running | TaskState::Synthesizing => g.complete(TaskCompleted {
                            task: t.clone(),
                            attempt: a,
                            handoff: Some(Handoff::complete(format!("{t} done"))),
                            artifacts: Vec::new(),
                            subplan: None,
                        }),
                        TaskState::WaitingForSubtasks => {
                            let first_done = g
                                .subtask_results(&t)
                                .into_iter()
                                .find(|r| r.state == TaskState::Completed);
                            let d = match (decision % 3, first_done) {
                                (0, Some(r)) => UserDecision::Accept { subtask: r.task },
                                (1, _) => UserDecision::Fail,
                                _ => UserDecision::Complete,
                            };
                            g.user_decision(&t, &d)
                        }
                        _ => continue,
                    };
                    w.after(&g, &format!("settle: {t} {state}"), r);
                }
                continue;
            }
            Op::SubplannerAnswered {
                task,
                attempt,
                subtasks,
                tokens,
                reported,
            } => {
                let t = task.get(&g);
                let a = attempt.get(&g, &t);
                let call = g.task(&t).map_or(0, |n| n.subplanner_calls);
                let reported = g
                    .task(&t)
                    .map(|n| n.children.len())
                    .map(|_| {
                        g.subtask_results(&t)
                            .into_iter()
                            .filter(|r| r.state.is_terminal())
                            .take(usize::from(*reported))
                            .map(|r| r.task)
                            .collect()
                    })
                    .unwrap_or_default();
                let subtasks = match subtasks {
                    Ok(None) => Ok(Vec::new()),
                    Ok(Some(plan)) => Ok(plan.get(&g, &t).subtasks),
                    Err(e) => Err(e.word()),
                };
                let answer = SubplannerAnswer {
                    task: t,
                    attempt: a,
                    call,
                    prompt: "p".into(),
                    content: "c".into(),
                    usage: Usage {
                        tokens_in: tokens.get(),
                        tokens_out: 1,
                        cost_usd: Usd::from_micros(0),
                    },
                    reported,
                    subtasks,
                };
                ("subplanner_answered", g.subplanner_answered(answer))
            }
            Op::SubplannerStopped { task, attempt } => {
                let t = task.get(&g);
                let a = attempt.get(&g, &t);
                ("subplanner_stopped", g.subplanner_stopped(&t, a, "fuzz"))
            }
            Op::Interrupt => ("interrupt_in_flight", g.interrupt_in_flight()),
            Op::PlanningFinished => ("planning_finished", g.planning_finished()),
            Op::PlannerGaveUp => ("planner_gave_up", g.planner_gave_up("gave up")),
        };
        w.after(&g, &format!("op {n}: {what}"), r);
    }
});
