//! A finished run's thread (ADR-014) and what the run left: the thread is stopped once the
//! run's actors have stopped (or after [`RETIRE_LIMIT`]), and the run's worktrees are swept
//! and the checkout of its target healed (ADR-021). At the daemon's stop every run's thread
//! is stopped and joined.

use std::time::Duration;

use actix::prelude::*;
use flotilla_actors::ports::{Journal, JournalError, SweepKeep, Worktrees};
use flotilla_actors::protocol::{CheckoutSync, Event, RunId};
use flotilla_actors::recovery::failed_attempts;
use tracing::{info, warn};

use super::memory::give_memory_back;
use super::{Life, Retiring, RunEntry, RunThreadCount, RunThreads, Supervisor};
use crate::git::target::TargetBranch;
use crate::git::worktrees::GitWorktrees;

/// How long a finished run's actors get to stop before their thread is stopped under them.
const RETIRE_LIMIT: Duration = Duration::from_secs(30);

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(Duration::from_millis(500), |act, _| act.reap_threads());
    }
}

impl Supervisor {
    /// Stops the threads of finished runs whose actors have all stopped (or that had
    /// [`RETIRE_LIMIT`] to do so).
    fn reap_threads(&mut self) {
        let before = self.retiring.len();
        self.retiring.retain(|r| {
            let keep = r.members.any_alive() && r.since.elapsed() < RETIRE_LIMIT;
            if !keep {
                r.thread.stop();
            }
            keep
        });
        if self.retiring.len() < before {
            give_memory_back();
        }
    }
}

/// At the daemon's stop the supervisor's thread ends and the Supervisor is dropped: every
/// run's thread is stopped and joined, so none outlives the daemon (and its state lock).
impl Drop for Supervisor {
    fn drop(&mut self) {
        let live = self
            .runs
            .values()
            .filter(|e| matches!(e.life, Life::Live(_)))
            .count();
        if live > 0 {
            info!(
                runs = live,
                "supervisor stopped with live runs; they resume at the next start"
            );
        }
        let threads = self
            .runs
            .values_mut()
            .filter_map(|e| e.thread.take())
            .chain(self.retiring.drain(..).map(|r| r.thread));
        for thread in threads.collect::<Vec<_>>() {
            thread.stop();
            if thread.join().is_err() {
                warn!("a run's thread did not end cleanly");
            }
        }
    }
}

/// After a run ended: removes its worktrees (and the branches of attempts that never
/// delivered; delivered work stays on its branch), and asks glibc to return the run's freed
/// memory to the system, so that a long-lived daemon's footprint follows its live runs.
pub(super) fn clean_up_after(
    worktrees: GitWorktrees,
    target: Option<TargetBranch>,
    run: RunId,
    journal: Option<futures::future::BoxFuture<'static, Result<Vec<Event>, JournalError>>>,
) {
    actix::spawn(async move {
        // Let the run's actors finish stopping first: their memory is what is given back,
        // and their Workers release their own worktrees as they stop.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let kept_failed = match journal {
            Some(read) => match read.await {
                Ok(events) => failed_attempts(run, events.iter().map(|e| &e.kind)),
                Err(e) => {
                    warn!(%run, error = %e, "cannot read which attempts failed; their worktrees stay for gc");
                    return;
                }
            },
            None => Vec::new(),
        };
        let run_over = SweepKeep {
            worktrees: kept_failed,
            closing: true,
            ..SweepKeep::default()
        };
        if let Err(e) = worktrees.sweep(run_over).await {
            warn!(error = %e, "cannot remove a finished run's worktrees");
        }
        // A landing interrupted in the user's checkout (a kill, then a cancel) is healed
        // when the run ends, not left for a queue that will not start again (ADR-021).
        let healed = match target {
            Some(target) => {
                crate::git::checkout::heal_repository(worktrees.repository().to_path_buf(), target)
                    .await
            }
            None => Ok(None),
        };
        match healed {
            Ok(Some(CheckoutSync::Behind { at, paths })) => {
                warn!(%run, %at, ?paths, "the checkout of the target branch is behind it with changes of its own: left as it is")
            }
            Ok(_) => {}
            Err(e) => warn!(%run, error = %e, "cannot heal the checkout of the target branch"),
        }
        info!(%run, "cleaned up after the run");
        let _ = tokio::task::spawn_blocking(|| {
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            // SAFETY: malloc_trim only releases free memory of the allocator's own heaps.
            unsafe {
                libc::malloc_trim(0);
            }
        })
        .await;
    });
}

impl Handler<RunThreads> for Supervisor {
    type Result = RunThreadCount;

    fn handle(&mut self, _: RunThreads, _: &mut Context<Self>) -> Self::Result {
        RunThreadCount {
            live: self.runs.values().filter(|e| e.thread.is_some()).count(),
            retiring: self.retiring.len(),
        }
    }
}

impl Supervisor {
    /// A run ended (its `RunFinished` is journaled): its actors are asked to stop, its thread
    /// retires once they have, and what it left is swept.
    pub(super) fn retire(&mut self, run: RunId, mut entry: RunEntry) {
        let thread = entry.thread.take();
        match (std::mem::replace(&mut entry.life, Life::Restarting), thread) {
            (Life::Live(members), Some(thread)) => {
                members.stop_all();
                self.retiring.push(Retiring {
                    members,
                    thread,
                    since: std::time::Instant::now(),
                });
            }
            (Life::Live(members), None) => members.stop_all(),
            (_, Some(thread)) => {
                thread.stop();
            }
            (_, None) => {}
        }
        // With keep_failed, the failed attempts' worktrees outlive the run.
        let journal = entry
            .config
            .worktrees
            .keep_failed
            .then(|| self.journal.read(run, 0));
        // A config whose branch does not pass never started: nothing of it to heal.
        let target = entry.config.target_branch().ok();
        clean_up_after(
            GitWorktrees::new(
                entry.repo.clone(),
                run,
                self.worktrees.join(run.to_string()),
                target.clone().unwrap_or_else(TargetBranch::legacy),
            ),
            target,
            run,
            journal,
        );
    }
}
