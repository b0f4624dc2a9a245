//! Ports: the side effects actors need, as small traits (the journal and the clock here;
//! the agent, the LLM, processes and the repository in their own files), so that every
//! actor runs against fakes in tests and against SQLite, git, HTTP providers and child
//! processes in the daemon.
//!
//! Every method returns a `'static` future. Implementations that block (SQLite, git2) must
//! move the work onto a blocking thread inside that future; an actor awaiting a port never
//! blocks its own thread (ARCHITECTURE.md, invariant 5).
//!
//! Fakes: `MemoryJournal` (also `flotilla bench`'s journal); behind the `testing` feature
//! (ADR-027), `ManualClock` and `FailingJournal` whose `JournalFaults` switch makes appends
//! fail or panic on demand.

#[cfg(feature = "testing")]
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;

mod agent;
mod llm;
mod merge;
mod process;
mod repo;
mod transcript;
mod tree;
pub use agent::*;
pub use llm::*;
pub use merge::*;
pub use process::*;
pub use repo::*;
pub use transcript::*;
pub use tree::*;

use crate::protocol::{Event, EventKind, RunId};

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
#[cfg(feature = "testing")]
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

#[cfg(feature = "testing")]
impl ManualClock {
    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst)
    }
}

#[cfg(feature = "testing")]
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
#[cfg(feature = "testing")]
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
#[cfg(feature = "testing")]
#[derive(Debug, Clone, Default)]
pub struct JournalFaults(Arc<AtomicU8>);

#[cfg(feature = "testing")]
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
#[cfg(feature = "testing")]
pub struct FailingJournal {
    inner: Arc<dyn Journal>,
    faults: JournalFaults,
}

#[cfg(feature = "testing")]
impl FailingJournal {
    pub fn new(inner: Arc<dyn Journal>, faults: JournalFaults) -> Self {
        FailingJournal { inner, faults }
    }
}

#[cfg(feature = "testing")]
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
