//! Ports: the side effects actors need, as small traits, so that every actor runs against
//! fakes in tests and against SQLite, git, HTTP providers and child processes in the daemon.
//!
//! Every method returns a `'static` future. Implementations that block (SQLite, git2) must
//! move the work onto a blocking thread inside that future; an actor awaiting a port never
//! blocks its own thread (ARCHITECTURE.md, invariant 5).

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

mod llm;
pub use llm::*;
use tokio_util::sync::CancellationToken;

use crate::protocol::{
    ArtifactRef, Assignment, Budget, Event, EventKind, Handoff, ProposedSubplan, RejectionReason,
    RunId, SubtaskResult, TaskId,
};

/// Wall-clock time for event timestamps. Timers use the runtime's clock, which tests pause.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A clock tests set by hand.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst)
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum JournalError {
    #[error("journal storage failed: {0}")]
    Storage(String),
    #[error("journal entry {seq} is unreadable: {detail}")]
    Corrupt { seq: u64, detail: String },
}

/// The durable, append-only record of every run. Appends are atomic per call and assign
/// consecutive, increasing `seq`s.
pub trait Journal: Send + Sync + 'static {
    fn append(
        &self,
        run: RunId,
        events: Vec<EventKind>,
    ) -> BoxFuture<'static, Result<Vec<Event>, JournalError>>;
    /// The run's events with `seq > after`, in order.
    fn read(&self, run: RunId, after: u64) -> BoxFuture<'static, Result<Vec<Event>, JournalError>>;
}

/// An in-memory journal: for tests and for the actors' own unit of work in benchmarks.
pub struct MemoryJournal {
    clock: Arc<dyn Clock>,
    events: Mutex<Vec<Event>>,
}

impl MemoryJournal {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryJournal {
            clock,
            events: Mutex::new(Vec::new()),
        }
    }

    /// Everything appended so far, all runs.
    pub fn all(&self) -> Vec<Event> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }
}

impl Journal for MemoryJournal {
    fn append(
        &self,
        run: RunId,
        events: Vec<EventKind>,
    ) -> BoxFuture<'static, Result<Vec<Event>, JournalError>> {
        let at_ms = self.clock.now_ms();
        let result = match self.events.lock() {
            Ok(mut log) => {
                let first = log.last().map_or(1, |e| e.seq + 1);
                let new: Vec<Event> = events
                    .into_iter()
                    .enumerate()
                    .map(|(i, kind)| Event {
                        seq: first + i as u64,
                        run,
                        at_ms,
                        kind,
                    })
                    .collect();
                log.extend(new.iter().cloned());
                Ok(new)
            }
            Err(_) => Err(JournalError::Storage("journal lock poisoned".into())),
        };
        Box::pin(async move { result })
    }

    fn read(&self, run: RunId, after: u64) -> BoxFuture<'static, Result<Vec<Event>, JournalError>> {
        let result = match self.events.lock() {
            Ok(log) => Ok(log
                .iter()
                .filter(|e| e.run == run && e.seq > after)
                .cloned()
                .collect()),
            Err(_) => Err(JournalError::Storage("journal lock poisoned".into())),
        };
        Box::pin(async move { result })
    }
}

/// Which fault a [`FailingJournal`] injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum JournalFault {
    /// Appends go through.
    None = 0,
    /// Appends fail with a storage error, as on a full disk or a read-only file system.
    FailAppends = 1,
    /// The append future panics: a bug in the journal's caller's thread.
    PanicOnAppend = 2,
    /// The next append panics, then appends go through again.
    PanicOnce = 3,
}

/// A switch shared between a [`FailingJournal`] and whoever drives the fault (a test, a
/// drill): flipping it takes effect on the next append.
#[derive(Debug, Clone, Default)]
pub struct JournalFaults(Arc<AtomicU8>);

impl JournalFaults {
    pub fn set(&self, fault: JournalFault) {
        self.0.store(fault as u8, Ordering::SeqCst)
    }

    pub fn get(&self) -> JournalFault {
        match self.0.load(Ordering::SeqCst) {
            1 => JournalFault::FailAppends,
            2 => JournalFault::PanicOnAppend,
            3 => JournalFault::PanicOnce,
            _ => JournalFault::None,
        }
    }

    /// The fault for one append: a `PanicOnce` is used up by the append that takes it.
    fn take(&self) -> JournalFault {
        let once = JournalFault::PanicOnce as u8;
        match self
            .0
            .compare_exchange(once, 0, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => JournalFault::PanicOnce,
            Err(_) => self.get(),
        }
    }
}

/// A `Journal` decorator whose appends fail (or panic) on demand; reads always go through.
/// Ports that are never made to fail leave recovery code untested.
pub struct FailingJournal {
    inner: Arc<dyn Journal>,
    faults: JournalFaults,
}

impl FailingJournal {
    pub fn new(inner: Arc<dyn Journal>, faults: JournalFaults) -> Self {
        FailingJournal { inner, faults }
    }
}

impl Journal for FailingJournal {
    fn append(
        &self,
        run: RunId,
        events: Vec<EventKind>,
    ) -> BoxFuture<'static, Result<Vec<Event>, JournalError>> {
        match self.faults.take() {
            JournalFault::None => self.inner.append(run, events),
            JournalFault::FailAppends => Box::pin(async {
                Err(JournalError::Storage(
                    "injected fault: the journal is not writable".into(),
                ))
            }),
            JournalFault::PanicOnAppend | JournalFault::PanicOnce => {
                Box::pin(async { panic!("injected fault: the journal append panicked") })
            }
        }
    }

    fn read(&self, run: RunId, after: u64) -> BoxFuture<'static, Result<Vec<Event>, JournalError>> {
        self.inner.read(run, after)
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentError {
    #[error("the agent crashed: {0}")]
    Crashed(String),
    #[error("the agent's output could not be parsed: {0}")]
    Malformed(String),
    #[error("the agent exceeded its time budget")]
    Timeout,
    /// The attempt was called off (its token was cancelled) and the agent stopped.
    #[error("the agent was called off")]
    Cancelled,
}

/// Where an agent reports what it spends while it works, so that budgets bind during an
/// attempt and not only at its end.
#[derive(Clone)]
pub struct SpendReporter(Arc<dyn Fn(Budget) + Send + Sync>);

impl SpendReporter {
    pub fn new(report: impl Fn(Budget) + Send + Sync + 'static) -> Self {
        SpendReporter(Arc::new(report))
    }

    /// Reports to nobody: for agents called outside a run.
    pub fn none() -> Self {
        SpendReporter(Arc::new(|_| {}))
    }

    /// `spent` is what was spent since the previous report (not a running total).
    pub fn report(&self, spent: Budget) {
        (self.0)(spent)
    }
}

impl fmt::Debug for SpendReporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SpendReporter")
    }
}

/// What an agent gets with each call besides the work itself.
#[derive(Debug, Clone)]
pub struct AttemptContext {
    /// Where it may work: a scratch directory of its own under the state directory (M5
    /// makes it a git worktree). Never the user's checkout.
    pub workspace: PathBuf,
    /// Cancelled when the attempt is called off (cancel, timeout, budget, run end). An agent
    /// must stop promptly, and stop what it started.
    pub cancel: CancellationToken,
    pub spend: SpendReporter,
}

impl AttemptContext {
    /// A context that is never cancelled and reports spend to nobody.
    pub fn detached(workspace: PathBuf) -> Self {
        AttemptContext {
            workspace,
            cancel: CancellationToken::new(),
            spend: SpendReporter::none(),
        }
    }
}

/// What an agent reports: a handoff, a subplan, or both (ADR-009). The worker wraps it in a
/// `TaskCompleted` with the task id and attempt it assigned: ids never come from the agent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentReport {
    #[serde(default)]
    pub handoff: Option<Handoff>,
    #[serde(default)]
    pub artifacts: Vec<ArtifactRef>,
    #[serde(default)]
    pub subplan: Option<ProposedSubplan>,
}

/// A coding agent that runs one task in one workspace and reports back.
pub trait Agent: Send + Sync + 'static {
    /// Works on the assignment.
    fn run(
        &self,
        assignment: Assignment,
        attempt: AttemptContext,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>>;
    /// The agent's subplan was rejected: it may propose again or finish the task as it is.
    fn revise(
        &self,
        assignment: Assignment,
        rejection: RejectionReason,
        attempt: AttemptContext,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>>;
    /// The subtasks of `parent` ended: merge their results into the parent's final report.
    fn synthesize(
        &self,
        parent: TaskId,
        results: Vec<SubtaskResult>,
        attempt: AttemptContext,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>>;
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RepoError {
    #[error("git: {0}")]
    Git(String),
    #[error("{0} is not a git repository")]
    NotARepository(PathBuf),
}

/// What the root planner reads of the target repository: main's tip, never a work tree
/// (which may be dirty). Every part is bounded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepoSnapshot {
    /// The commit read (empty for a repository without commits).
    pub commit: String,
    /// Every file path at that commit, sorted (at most [`RepoSnapshot::MAX_FILES`]).
    pub files: Vec<String>,
    /// Files left out of `files` past the cap.
    pub files_omitted: usize,
    /// The planning documents that exist (SPEC.md, FEATURES.json, AGENTS.md,
    /// DECISIONS.md), each as (name, text), the text cut at [`RepoSnapshot::MAX_DOC_BYTES`].
    pub docs: Vec<(String, String)>,
    /// The last commits, newest first, as "abcdef1 subject".
    pub recent_commits: Vec<String>,
}

impl RepoSnapshot {
    pub const DOCS: [&'static str; 4] = ["SPEC.md", "FEATURES.json", "AGENTS.md", "DECISIONS.md"];
    pub const MAX_FILES: usize = 5_000;
    pub const MAX_DOC_BYTES: usize = 32 * 1024;
    pub const RECENT_COMMITS: usize = 40;

    pub fn doc(&self, name: &str) -> Option<&str> {
        self.docs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, text)| text.as_str())
    }
}

/// The target repository, read side: what workers changed and where `main` is. Moving
/// `main` is the merge queue's alone and is not on this port.
pub trait Repo: Send + Sync + 'static {
    /// The commit `main` points at.
    fn main_tip(&self) -> BoxFuture<'static, Result<String, RepoError>>;
    /// What the planner reads: files, planning documents and recent commits at main's tip.
    fn snapshot(&self) -> BoxFuture<'static, Result<RepoSnapshot, RepoError>>;
    /// Repo-relative paths changed on `branch` since it left `base`: for scope enforcement.
    fn changed_paths(
        &self,
        branch: String,
        base: String,
    ) -> BoxFuture<'static, Result<Vec<String>, RepoError>>;
}
