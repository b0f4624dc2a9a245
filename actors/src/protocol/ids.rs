//! Identifiers. flotilla generates every id itself: run ids are UUIDv7 (time ordered, so
//! `runs` lists oldest first for free) and task ids are hierarchical paths (`t3`, `t3.1`)
//! whose length *is* the task's depth. Nothing here is ever taken from LLM output: an LLM
//! may only *refer* to an id flotilla showed it, and such references are checked to exist.
//!
//! Branch names come from `branch_name(run, task, attempt)`: `flotilla/<run>/<task>[-a<n>]`,
//! with the run's full id.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use uuid::Uuid;

/// One run: one request, one task graph, one journal stream.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunId(Uuid);

impl RunId {
    /// A fresh, time-ordered run id.
    pub fn generate() -> Self {
        RunId(Uuid::now_v7())
    }

    pub fn from_uuid(uuid: Uuid) -> Self {
        RunId(uuid)
    }

    pub fn as_uuid(&self) -> Uuid {
        self.0
    }

    /// The first 8 hex digits: what humans type and what branch names embed. UUIDv7 starts
    /// with a millisecond timestamp, so two runs started in the same ~65 s window share a
    /// prefix; the CLI resolves prefixes against the full list and reports ambiguity.
    pub fn short(&self) -> String {
        self.0.simple().to_string()[..8].to_string()
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.hyphenated())
    }
}

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RunId({})", self.short())
    }
}

impl FromStr for RunId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s)
            .map(RunId)
            .map_err(|_| IdError::MalformedRunId(s.chars().take(64).collect()))
    }
}

/// A task's place in the run: `t3` is the third task the root planner created, `t3.1` the
/// first subtask of `t3`; `f2` is the second fix task flotilla made itself (a conflict fix
/// or a fix for a red main, M6), in a namespace of its own so that it never collides with a
/// planned task. Cheap to clone (one `Arc`), ordered by namespace, then path.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId {
    space: IdSpace,
    path: Arc<[u32]>,
}

/// Who numbered a top-level task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum IdSpace {
    /// The root planner's tasks: `t<n>`.
    Planned,
    /// flotilla's own fix tasks (merge conflicts, a red main): `f<n>`.
    Fix,
}

impl IdSpace {
    fn letter(self) -> char {
        match self {
            IdSpace::Planned => 't',
            IdSpace::Fix => 'f',
        }
    }
}

/// Ids deeper than this are refused when parsed; `Limits::validate` keeps the graph's own
/// depth limit within it.
pub const MAX_TASK_DEPTH: u32 = 16;
const MAX_ID_DEPTH: usize = MAX_TASK_DEPTH as usize;

impl TaskId {
    /// The `n`th (1-based) task planned at the top level of a run.
    pub fn root(n: u32) -> Self {
        assert!(n >= 1, "task numbers start at 1");
        TaskId {
            space: IdSpace::Planned,
            path: Arc::from(vec![n]),
        }
    }

    /// The `n`th (1-based) fix task flotilla made in a run (`f<n>`).
    pub fn fix(n: u32) -> Self {
        assert!(n >= 1, "task numbers start at 1");
        TaskId {
            space: IdSpace::Fix,
            path: Arc::from(vec![n]),
        }
    }

    /// The `n`th (1-based) subtask of this task.
    pub fn child(&self, n: u32) -> Self {
        assert!(n >= 1, "task numbers start at 1");
        let mut path = self.path.to_vec();
        path.push(n);
        TaskId {
            space: self.space,
            path: Arc::from(path),
        }
    }

    /// 1 for a top-level task, 2 for its subtasks, and so on.
    pub fn depth(&self) -> u32 {
        self.path.len() as u32
    }

    pub fn parent(&self) -> Option<TaskId> {
        (self.path.len() > 1).then(|| TaskId {
            space: self.space,
            path: Arc::from(&self.path[..self.path.len() - 1]),
        })
    }

    pub fn path(&self) -> &[u32] {
        &self.path
    }

    /// A fix task flotilla made (or a subtask of one), not one the planner planned.
    pub fn is_fix(&self) -> bool {
        self.space == IdSpace::Fix
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.space.letter())?;
        for (i, n) in self.path.iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            write!(f, "{n}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for TaskId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || IdError::MalformedTaskId(s.chars().take(64).collect());
        let (space, rest) = if let Some(rest) = s.strip_prefix('t') {
            (IdSpace::Planned, rest)
        } else if let Some(rest) = s.strip_prefix('f') {
            (IdSpace::Fix, rest)
        } else {
            return Err(bad());
        };
        let mut path = Vec::new();
        for part in rest.split('.') {
            // Digits only, no sign, no leading zero: exactly one spelling per id.
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) || part.starts_with('0')
            {
                return Err(bad());
            }
            path.push(part.parse::<u32>().map_err(|_| bad())?);
            if path.len() > MAX_ID_DEPTH {
                return Err(bad());
            }
        }
        Ok(TaskId {
            space,
            path: Arc::from(path),
        })
    }
}

impl Serialize for TaskId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TaskId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The branch one attempt of a task commits to: `flotilla/<run>/<task>` for the first
/// attempt, `flotilla/<run>/<task>-a<n>` for a retry, so that a retry starts on a fresh
/// branch (and worktree) and never inherits a failed attempt's commits. Derived from ids
/// flotilla generated, so an LLM can never choose a branch name (let alone `main`). The run
/// is its full id: the 8-digit short form is a timestamp prefix that two runs started in
/// the same minute share.
pub fn branch_name(run: RunId, task: &TaskId, attempt: u32) -> String {
    let run = run.0.simple();
    if attempt <= 1 {
        format!("flotilla/{run}/{task}")
    } else {
        format!("flotilla/{run}/{task}-a{attempt}")
    }
}

/// The prefix of every branch of a run (`flotilla/<run>/`), for finding what a run left.
pub fn branch_prefix(run: RunId) -> String {
    format!("flotilla/{}/", run.0.simple())
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error(
        "malformed task id {0:?}: expected t<N>[.<N>…] such as t3 or t3.1 (f<N> for fix tasks)"
    )]
    MalformedTaskId(String),
    #[error("malformed run id {0:?}: expected a UUID")]
    MalformedRunId(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_round_trip_and_know_their_depth() {
        let t = TaskId::root(3).child(1).child(12);
        assert_eq!(t.to_string(), "t3.1.12");
        assert_eq!(t.depth(), 3);
        assert_eq!(t.parent().unwrap().to_string(), "t3.1");
        assert_eq!("t3.1.12".parse::<TaskId>().unwrap(), t);
        assert_eq!(serde_json::to_string(&t).unwrap(), "\"t3.1.12\"");
    }

    #[test]
    fn fix_task_ids_have_a_namespace_of_their_own() {
        let f = TaskId::fix(3);
        assert_eq!(f.to_string(), "f3");
        assert!(f.is_fix() && !TaskId::root(3).is_fix());
        assert_ne!(f, TaskId::root(3));
        assert_eq!("f3".parse::<TaskId>().unwrap(), f);
        assert_eq!("f3.2".parse::<TaskId>().unwrap(), f.child(2));
        assert!(
            TaskId::root(99) < TaskId::fix(1),
            "planned tasks sort first"
        );
        assert!("g1".parse::<TaskId>().is_err() && "f".parse::<TaskId>().is_err());
    }

    #[test]
    fn malformed_task_ids_are_rejected() {
        for bad in [
            "",
            "t",
            "3",
            "t0",
            "t01",
            "t1.",
            "t.1",
            "t1..2",
            "t-1",
            "t1.x",
            "main",
            "t99999999999",
        ] {
            assert!(bad.parse::<TaskId>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn branch_names_come_from_flotilla_ids_only() {
        let run = RunId::generate();
        let full = run.as_uuid().simple().to_string();
        let b = branch_name(run, &TaskId::root(2).child(1), 1);
        assert_eq!(b, format!("flotilla/{full}/t2.1"));
        assert_eq!(
            branch_name(run, &TaskId::root(2), 3),
            format!("flotilla/{full}/t2-a3")
        );
        assert!(b.starts_with(&branch_prefix(run)));
        // Two runs of the same minute share `short()`, never a branch.
        let (a, b) = (RunId::generate(), RunId::generate());
        assert_ne!(
            branch_name(a, &TaskId::root(1), 1),
            branch_name(b, &TaskId::root(1), 1)
        );
    }
}
