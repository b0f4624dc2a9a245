//! The workers' git work at a lower CPU priority than the landing (ADR-049).
//!
//! Making, sealing and releasing attempt workspaces is parallel, per-worker work; landing
//! is one serial cycle at a time (the merge queue's builds, the move of main, the user's
//! checkout). On a busy machine the scheduler shared the cores evenly between the two, so
//! each landing cycle waited behind the workers' walks and the queue, not the workers, set
//! how long a finished task waited to land (M12 item 4). The workers' closures run here
//! instead of on tokio's shared blocking pool: in their own threads, each lowered once, as
//! it starts, to nice [`WORKSPACE_NICE`]. What the queue, the journal and the actors run
//! stays at the daemon's own priority. A lowered thread is never raised again (an
//! unprivileged process cannot), which is why these threads are never shared with them.
//!
//! The pool grows like tokio's own (one thread per closure in flight, idle ones kept a
//! while), so a closure that waits (for the repository's lock, a test's hook) holds up
//! no other; its size is bounded by the run's workers.

use std::sync::LazyLock;

use tokio::runtime::{Builder, Runtime};
use tokio::task::JoinHandle;
use tracing::debug;

/// How much lower than the daemon the workers' git work runs: 10 more `nice` gives a thread
/// about a ninth of the CPU a thread at the daemon's own priority gets when both want it,
/// and all of it when nothing else does.
pub const WORKSPACE_NICE: i32 = 10;

/// A runtime that is never driven: only its blocking pool runs (closures need no reactor).
static WORKSPACE_THREADS: LazyLock<Option<Runtime>> = LazyLock::new(|| {
    Builder::new_current_thread()
        .thread_name("flotilla-workspace")
        .on_thread_start(lower_this_thread)
        .build()
        .inspect_err(|e| debug!(error = %e, "no workspace threads: the shared pool is used"))
        .ok()
});

/// Runs `work` on a workspace thread (lowered priority), or where it is if that pool
/// could not be made. Called from tokio's shared blocking pool, whose thread waits (asleep)
/// for the answer: so the caller's runtime counts the work as its own blocking work, as
/// `spawn_blocking` always did (a test's paused clock does not jump past it), and a panic
/// reaches the caller's `JoinHandle` as before.
pub fn spawn<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
    tokio::task::spawn_blocking(move || {
        let Some(runtime) = WORKSPACE_THREADS.as_ref() else {
            return work();
        };
        let (answer, answered) = std::sync::mpsc::sync_channel(1);
        runtime.spawn_blocking(move || {
            let _ = answer.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)));
        });
        match answered.recv() {
            Ok(Ok(value)) => value,
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            // The closure is gone without an answer (the pool could not start a thread).
            Err(_) => std::panic::panic_any("a workspace thread ended without an answer"),
        }
    })
}

#[cfg(not(target_os = "linux"))]
fn lower_this_thread() {}

/// Where a workspace closure runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// An attempt's own work, below the landing's.
    Lowered,
    /// Work that holds the repository's lock for long (a sweep deletes whole trees under
    /// it): at the daemon's priority, so the merge queue never waits on a lowered holder.
    Daemon,
}

/// [`spawn`], or tokio's shared blocking pool for [`Priority::Daemon`].
pub fn spawn_at<T: Send + 'static>(
    priority: Priority,
    work: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    match priority {
        Priority::Lowered => spawn(work),
        Priority::Daemon => tokio::task::spawn_blocking(work),
    }
}

#[cfg(target_os = "linux")]
fn lower_this_thread() {
    // SAFETY: `gettid` and `__errno_location` have no preconditions; `getpriority` and
    // `setpriority` only read their arguments, and on Linux `PRIO_PROCESS` with a thread id
    // reads or changes that one thread (errno is cleared first: -1 is also a nice value).
    // Relative to the thread's own nice (the daemon's, which its threads inherit): a daemon
    // started with `nice` keeps its workers below itself, never above.
    let done = unsafe {
        let tid = libc::gettid() as libc::id_t;
        *libc::__errno_location() = 0;
        let own = libc::getpriority(libc::PRIO_PROCESS, tid);
        if own == -1 && *libc::__errno_location() != 0 {
            -1
        } else {
            libc::setpriority(libc::PRIO_PROCESS, tid, (own + WORKSPACE_NICE).min(19))
        }
    };
    if done != 0 {
        // Only speed is at stake: the thread keeps the daemon's priority.
        debug!(error = %std::io::Error::last_os_error(), "a workspace thread keeps its priority");
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn nice_of_this_thread() -> i32 {
        // SAFETY: as above; errno is cleared first because -1 is also a valid nice value.
        unsafe {
            *libc::__errno_location() = 0;
            libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t)
        }
    }

    #[tokio::test]
    async fn workspace_work_runs_lowered_and_the_shared_pool_does_not() {
        let shared = tokio::task::spawn_blocking(nice_of_this_thread)
            .await
            .expect("shared pool");
        let lowered = spawn(nice_of_this_thread).await.expect("workspace thread");
        assert_eq!(lowered, (shared + WORKSPACE_NICE).min(19));
        // A later closure on the same pool is lowered too, and the shared pool still is not.
        assert_eq!(spawn(nice_of_this_thread).await.expect("again"), lowered);
        assert_eq!(
            tokio::task::spawn_blocking(nice_of_this_thread)
                .await
                .expect("shared pool"),
            shared
        );
    }
}
