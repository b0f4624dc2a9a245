//! What a task is: its spec, its budget, and the state machine it moves through.
//!
//! `TaskSpec`, `DependencyRef`, `Priority`, `Budget` and `Usd` (exact micro-dollars, no
//! floats); `TaskState` with its transition table `TaskState::TRANSITIONS` (no edge out of a
//! terminal state).

use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::ids::TaskId;

/// The kind of a typed output (ADR-008): what a task is expected to produce and what an
/// `ArtifactRef` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArtifactKind {
    Commit,
    File,
    Report,
    TestResult,
}

/// What a task must achieve. Root tasks come from the planner; subtasks come from an accepted
/// [`ProposedSubplan`](super::subplan::ProposedSubplan). Either way the spec is LLM output, so
/// the task graph normalizes and validates it before it is stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskSpec {
    pub description: String,
    /// Repo-relative files or directories the task may change. A directory covers everything
    /// below it.
    pub scope: Vec<String>,
    #[serde(default)]
    pub acceptance: String,
    #[serde(default)]
    pub priority: Priority,
    #[serde(default)]
    pub capabilities: BTreeSet<String>,
    /// `None` takes the run's default task budget.
    #[serde(default)]
    pub budget: Option<Budget>,
    /// Tasks that must complete first: ids of existing tasks, or indexes into the same batch.
    /// Stored specs have this resolved into the graph's edges and left empty.
    #[serde(default)]
    pub dependencies: Vec<DependencyRef>,
    /// What the task is expected to produce (ADR-008 artifact kinds).
    #[serde(default)]
    pub expected_outputs: Vec<ArtifactKind>,
}

impl TaskSpec {
    /// A spec with defaults for everything but the description and scope.
    pub fn new(description: impl Into<String>, scope: &[&str]) -> Self {
        TaskSpec {
            description: description.into(),
            scope: scope.iter().map(|s| s.to_string()).collect(),
            acceptance: String::new(),
            priority: Priority::default(),
            capabilities: BTreeSet::new(),
            budget: None,
            dependencies: Vec::new(),
            expected_outputs: Vec::new(),
        }
    }
}

/// A dependency as written in a submitted batch: `"t3"` (an existing task) or `2` (the third
/// task of the same batch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DependencyRef {
    Batch(usize),
    Task(TaskId),
}

/// 1 is the most urgent, 10 the least; 5 by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Priority(u8);

impl Priority {
    pub const MOST_URGENT: Priority = Priority(1);
    pub const LEAST_URGENT: Priority = Priority(10);

    pub fn new(value: u8) -> Result<Self, PriorityOutOfRange> {
        if (1..=10).contains(&value) {
            Ok(Priority(value))
        } else {
            Err(PriorityOutOfRange(value.into()))
        }
    }

    pub fn get(self) -> u8 {
        self.0
    }
}

impl Default for Priority {
    fn default() -> Self {
        Priority(5)
    }
}

impl<'de> Deserialize<'de> for Priority {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = i64::deserialize(d)?;
        u8::try_from(v)
            .map_err(|_| PriorityOutOfRange(v))
            .and_then(Priority::new)
            .map_err(serde::de::Error::custom)
    }
}

/// How urgent a task's work is, for every queue that orders it: Dispatch hands ready tasks
/// out and the MergeQueue lands branches by [`Urgency::order`] (ADR-032), so that what
/// others wait for starts first and lands first (dependents start only once it is on main).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Urgency {
    /// 1 (most urgent) first.
    pub priority: Priority,
    /// Tasks on the longest chain from this one to a sink, itself included: the longer, the
    /// sooner (the chain is the run's critical path).
    pub critical_path: u32,
    /// Creation order within the run: older first among equals.
    pub created: u64,
}

/// Where a task stands in a queue ordered by urgency: smaller goes first. Most urgent, then
/// the longest remaining dependency chain, then oldest; the id makes keys unique.
pub type WorkOrder = (Priority, Reverse<u32>, u64, TaskId);

impl Urgency {
    /// The one ordering Dispatch and the MergeQueue share.
    pub fn order(&self, task: &TaskId) -> WorkOrder {
        (
            self.priority,
            Reverse(self.critical_path),
            self.created,
            task.clone(),
        )
    }
}

/// A priority outside 1 to 10 (as given: a model may send any integer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("priority must be 1 (most urgent) to 10, got {0}")]
pub struct PriorityOutOfRange(pub i64);

/// US dollars, held as whole micro-dollars so that budget sums are exact. Serialized as a
/// decimal number of dollars.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Usd(u64);

impl Usd {
    pub const ZERO: Usd = Usd(0);
    /// $1e9: the largest amount accepted from outside and the ceiling of every sum, so that
    /// any amount flotilla journals reads back (serialized as dollars, an `f64`).
    pub const MAX: Usd = Usd(1_000_000_000 * 1_000_000);

    /// Amounts above [`Usd::MAX`] are held as `Usd::MAX`.
    pub fn from_micros(micros: u64) -> Self {
        Usd(micros.min(Self::MAX.0))
    }

    /// `self + other`, at most [`Usd::MAX`].
    pub fn saturating_add(self, other: Usd) -> Usd {
        Usd::from_micros(self.0.saturating_add(other.0))
    }

    pub fn saturating_sub(self, other: Usd) -> Usd {
        Usd(self.0.saturating_sub(other.0))
    }

    pub fn micros(self) -> u64 {
        self.0
    }

    pub fn from_dollars(dollars: f64) -> Result<Self, CostOutOfRange> {
        if !dollars.is_finite() || !(0.0..=1e9).contains(&dollars) {
            return Err(CostOutOfRange(dollars));
        }
        Ok(Usd((dollars * 1e6).round() as u64))
    }

    pub fn dollars(self) -> f64 {
        self.0 as f64 / 1e6
    }
}

/// A cost that is not a finite amount of dollars between 0 and 1e9 (as given).
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("cost must be a finite amount between 0 and 1e9 USD, got {0}")]
pub struct CostOutOfRange(pub f64);

impl fmt::Display for Usd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "${:.4}", self.dollars())
    }
}

impl Serialize for Usd {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.dollars())
    }
}

impl<'de> Deserialize<'de> for Usd {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Usd::from_dollars(f64::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// What a task may spend: tokens, money and wall time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Budget {
    pub tokens: u64,
    pub cost_usd: Usd,
    pub wall_time_ms: u64,
}

impl Budget {
    pub fn new(tokens: u64, cost_usd: Usd, wall_time_ms: u64) -> Self {
        Budget {
            tokens,
            cost_usd,
            wall_time_ms,
        }
    }

    pub fn saturating_sub(self, other: Budget) -> Budget {
        Budget {
            tokens: self.tokens.saturating_sub(other.tokens),
            cost_usd: self.cost_usd.saturating_sub(other.cost_usd),
            wall_time_ms: self.wall_time_ms.saturating_sub(other.wall_time_ms),
        }
    }

    pub fn saturating_add(self, other: Budget) -> Budget {
        Budget {
            tokens: self.tokens.saturating_add(other.tokens),
            cost_usd: self.cost_usd.saturating_add(other.cost_usd),
            wall_time_ms: self.wall_time_ms.saturating_add(other.wall_time_ms),
        }
    }
}

impl Budget {
    /// Whether `spent` has used all of this budget in some dimension, so another attempt
    /// would start with nothing there. A dimension that allowed nothing and got nothing is
    /// not used up (a retry starts with what the first attempt had).
    pub fn is_used_up_by(&self, spent: &Budget) -> bool {
        (spent.tokens > 0 && spent.tokens >= self.tokens)
            || (spent.cost_usd > Usd::ZERO && spent.cost_usd >= self.cost_usd)
            || (spent.wall_time_ms > 0 && spent.wall_time_ms >= self.wall_time_ms)
    }

    /// Whether any dimension of `self` is above the same dimension of `limit`.
    pub fn exceeds(&self, limit: &Budget) -> bool {
        self.tokens > limit.tokens
            || self.cost_usd > limit.cost_usd
            || self.wall_time_ms > limit.wall_time_ms
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} tokens, {}, {} ms",
            self.tokens, self.cost_usd, self.wall_time_ms
        )
    }
}

/// The task lifecycle. See [`TaskState::TRANSITIONS`] for every legal move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Waiting for dependencies.
    Pending,
    /// All dependencies completed; queued in Dispatch.
    Ready,
    /// Handed to an agent that has not started yet.
    Dispatched,
    /// An agent is working on it.
    Running,
    /// Its accepted subplan's subtasks are running.
    WaitingForSubtasks,
    /// Its agent is merging the subtasks' results.
    Synthesizing,
    /// Its work is done and its branch waits in the merge queue; dependents wait for it to
    /// land (M6).
    Landing,
    Completed,
    Failed,
    Cancelled,
}

use TaskState::*;

impl TaskState {
    /// Every legal transition. Anything else is an [`IllegalTransition`]; in particular
    /// nothing leaves a terminal state, so a late message can never overwrite one.
    pub const TRANSITIONS: &'static [(TaskState, TaskState)] = &[
        (Pending, Ready),
        (Pending, Cancelled),
        (Ready, Dispatched),
        (Ready, Failed), // no worker profile can run it
        (Ready, Cancelled),
        (Dispatched, Running),
        (Dispatched, Ready), // retry: the agent failed before it started
        (Dispatched, Failed),
        (Dispatched, Cancelled),
        (Running, Completed),
        (Running, Failed),
        (Running, Ready), // retry with attempt + 1
        (Running, WaitingForSubtasks),
        (Running, Cancelled),
        (WaitingForSubtasks, Synthesizing),
        (WaitingForSubtasks, Completed), // a human accepted one subtask's result as the parent's
        (WaitingForSubtasks, Failed),
        (WaitingForSubtasks, Cancelled),
        (Synthesizing, Completed),
        (Synthesizing, Failed),
        (Synthesizing, Cancelled),
        (Running, Landing),
        (Synthesizing, Landing),
        (Landing, Completed), // the branch is on main
        (Landing, Ready),     // the merge gate failed: attempt + 1
        (Landing, Failed),
        (Landing, Cancelled),
    ];

    pub fn is_terminal(self) -> bool {
        matches!(self, Completed | Failed | Cancelled)
    }

    pub fn can_become(self, next: TaskState) -> bool {
        Self::TRANSITIONS.contains(&(self, next))
    }

    /// Checks a move against the table.
    pub fn transition(
        self,
        task: &TaskId,
        next: TaskState,
    ) -> Result<TaskState, IllegalTransition> {
        if self.can_become(next) {
            Ok(next)
        } else {
            Err(IllegalTransition {
                task: task.clone(),
                from: self,
                to: next,
            })
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned));
        f.write_str(s.as_deref().unwrap_or("?"))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("task {task}: illegal transition {from} -> {to}")]
pub struct IllegalTransition {
    pub task: TaskId,
    pub from: TaskState,
    pub to: TaskState,
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [TaskState; 10] = [
        Pending,
        Ready,
        Dispatched,
        Running,
        WaitingForSubtasks,
        Synthesizing,
        Landing,
        Completed,
        Failed,
        Cancelled,
    ];

    #[test]
    fn terminal_states_have_no_way_out() {
        for from in ALL.iter().filter(|s| s.is_terminal()) {
            for to in ALL {
                assert!(!from.can_become(to), "{from} -> {to} must be illegal");
            }
        }
    }

    #[test]
    fn illegal_transitions_are_typed_errors() {
        let t = TaskId::root(1);
        let err = Pending.transition(&t, Completed).unwrap_err();
        assert_eq!(
            err.to_string(),
            "task t1: illegal transition pending -> completed"
        );
        assert_eq!(
            Running.transition(&t, WaitingForSubtasks),
            Ok(WaitingForSubtasks)
        );
    }

    #[test]
    fn priorities_outside_one_to_ten_are_rejected() {
        assert!(serde_json::from_str::<Priority>("0").is_err());
        assert!(serde_json::from_str::<Priority>("11").is_err());
        assert!(serde_json::from_str::<Priority>("-3").is_err());
        assert_eq!(
            serde_json::from_str::<Priority>("1").unwrap(),
            Priority::MOST_URGENT
        );
    }

    #[test]
    fn usd_is_exact_and_rejects_nonsense() {
        let a = Usd::from_dollars(0.1).unwrap();
        let b = Usd::from_dollars(0.2).unwrap();
        assert_eq!(Usd(a.0 + b.0), Usd::from_dollars(0.3).unwrap());
        assert!(serde_json::from_str::<Usd>("-1.0").is_err());
        assert!(Usd::from_dollars(f64::NAN).is_err());
    }

    #[test]
    fn every_amount_and_every_sum_reads_back() {
        for usd in [
            Usd::from_micros(u64::MAX),
            Usd::MAX.saturating_add(Usd::MAX),
            Usd::from_micros(123_456_789),
        ] {
            let json = serde_json::to_string(&usd).unwrap();
            assert_eq!(serde_json::from_str::<Usd>(&json).unwrap(), usd, "{json}");
        }
        assert_eq!(Usd::from_micros(u64::MAX), Usd::MAX);
        let spent = Budget::new(1, Usd::MAX, 1).saturating_add(Budget::new(1, Usd::MAX, 1));
        let json = serde_json::to_string(&spent).unwrap();
        assert_eq!(serde_json::from_str::<Budget>(&json).unwrap(), spent);
    }

    #[test]
    fn a_budget_is_used_up_when_any_dimension_it_allowed_is_spent() {
        let budget = Budget::new(1_000, Usd::ZERO, 1_500);
        assert!(!budget.is_used_up_by(&Budget::default()));
        assert!(!budget.is_used_up_by(&Budget::new(999, Usd::ZERO, 1_499)));
        assert!(budget.is_used_up_by(&Budget::new(1_000, Usd::ZERO, 0)));
        assert!(budget.is_used_up_by(&Budget::new(0, Usd::ZERO, 1_500)));
        // A dimension that allowed nothing is used up only once something was spent there.
        assert!(budget.is_used_up_by(&Budget::new(0, Usd::from_micros(1), 0)));
    }

    #[test]
    fn dependencies_parse_as_batch_indexes_or_task_ids() {
        let deps: Vec<DependencyRef> = serde_json::from_str(r#"[0, "t2.1"]"#).unwrap();
        assert_eq!(
            deps,
            vec![
                DependencyRef::Batch(0),
                DependencyRef::Task("t2.1".parse().unwrap())
            ]
        );
    }
}
