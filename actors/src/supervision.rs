//! How actors report that they ended.
//!
//! An actix actor that panics is dropped without a word to anyone, and an actor that stops
//! itself (a failed journal append, a broken invariant) is silent too: before M3 a run then
//! showed `running` forever. Here every supervised actor holds a [`Lifeline`]: a value whose
//! `Drop` sends one notice to whoever watches the actor. Dropping is the one thing that
//! happens to an actor however it ends (a clean stop, a stop on error, or a panic unwinding
//! out of a handler, after which the runtime drops the actor), so the watcher always learns
//! of it, and learns why when the actor could say.
//!
//! Two watchers use it: the daemon's run supervisor (one lifeline per run member: TaskGraph,
//! Dispatch, Planner, WorkerPool) and the WorkerPool (one per attempt runner).
//!
//! [`StopMember`] is the other direction: the watcher asks an actor to stop, when its run
//! ended or is being restarted. Actors of a run hold each other's addresses, so they would
//! otherwise keep each other alive forever.

use std::fmt;

use actix::Message;

/// Why an actor ended, as far as it knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopCause {
    /// It finished its work and stopped on purpose (or was asked to).
    Finished,
    /// A journal append failed: the actor's memory is ahead of the journal.
    JournalUnwritable(String),
    /// A bug: an invariant did not hold.
    InvariantBroken(String),
    /// Dropped without a word: a panic, most likely.
    Unexplained,
}

impl fmt::Display for StopCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopCause::Finished => f.write_str("finished"),
            StopCause::JournalUnwritable(e) => write!(f, "the journal could not be written: {e}"),
            StopCause::InvariantBroken(e) => write!(f, "an invariant broke: {e}"),
            StopCause::Unexplained => f.write_str("stopped unexpectedly (a panic?)"),
        }
    }
}

/// Held by a watched actor; reports once, when dropped, with the cause last set.
pub struct Lifeline {
    report: Option<Box<dyn FnOnce(StopCause) + Send>>,
    cause: StopCause,
}

impl Lifeline {
    /// `report` runs exactly once, when the lifeline is dropped. It must not block or panic
    /// (it runs while an actor is being torn down): sending a message is what it is for.
    pub fn new(report: impl FnOnce(StopCause) + Send + 'static) -> Self {
        Lifeline {
            report: Some(Box::new(report)),
            cause: StopCause::Unexplained,
        }
    }

    /// Records why the actor is about to stop; the last cause set is reported.
    pub fn set_cause(&mut self, cause: StopCause) {
        self.cause = cause;
    }
}

impl Drop for Lifeline {
    fn drop(&mut self) {
        if let Some(report) = self.report.take() {
            report(std::mem::replace(&mut self.cause, StopCause::Unexplained));
        }
    }
}

impl fmt::Debug for Lifeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lifeline")
            .field("cause", &self.cause)
            .finish()
    }
}

/// Asks a supervised actor to stop now; pending messages are dropped.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct StopMember;

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn a_lifeline_reports_once_with_the_last_cause() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let mut line = Lifeline::new(move |cause| sink.lock().unwrap().push(cause));
        line.set_cause(StopCause::JournalUnwritable("disk full".into()));
        drop(line);
        assert_eq!(
            *seen.lock().unwrap(),
            vec![StopCause::JournalUnwritable("disk full".into())]
        );
    }

    #[test]
    fn a_lifeline_dropped_by_a_panic_reports_unexplained() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let result = std::panic::catch_unwind(move || {
            let _line = Lifeline::new(move |cause| sink.lock().unwrap().push(cause));
            panic!("an agent call went wrong");
        });
        assert!(result.is_err());
        assert_eq!(*seen.lock().unwrap(), vec![StopCause::Unexplained]);
    }
}
