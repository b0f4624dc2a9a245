//! A finished run's thread (ADR-014) and what the run left. When a run ends its actors are
//! asked to stop; each one's lifeline says when it has (`MemberStopped`), and on the last
//! of them the run's thread retires: it is stopped, the run's worktrees are swept, the
//! checkout of its target is healed (ADR-021) and memory is given back. Nothing waits on a
//! timer but the [`RETIRE_LIMIT`] deadline for actors that never stop. At the daemon's stop
//! every run's thread is stopped and joined, retired ones included, after the runs still
//! retiring have finished (for at most the stop's limit: [`FinishCleanUps`]). It must not
//! poll.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use flotilla_actors::ports::{Journal, JournalError, SweepKeep, Worktrees};
use flotilla_actors::protocol::{CheckoutSync, Event, RunId};
use flotilla_actors::recovery::{delivered_branches, failed_attempts};
use tracing::{info, warn};

use super::memory::give_memory_back;
use super::{
    FinishCleanUps, Life, Member, MemberStopped, Retiring, RunEntry, RunThreadCount, RunThreads,
    Supervisor,
};
use crate::git::target::TargetBranch;
use crate::git::worktrees::GitWorktrees;
use crate::journal::SqliteJournal;

/// How long a finished run's actors get to stop before their thread is stopped under them.
const RETIRE_LIMIT: Duration = Duration::from_secs(30);

/// Every member of a run: what a run that ended live waits for.
const MEMBERS: [Member; 7] = [
    Member::TaskGraph,
    Member::Dispatch,
    Member::Planner,
    Member::Subplanner,
    Member::Workers,
    Member::MergeQueue,
    Member::Reconciler,
];

impl Supervisor {
    /// A run ended (its `RunFinished` is journaled): its actors are asked to stop and its
    /// thread retires once the last of them has (at once when none was live).
    pub(super) fn retire(&mut self, run: RunId, mut entry: RunEntry, ctx: &mut Context<Self>) {
        let awaited = match std::mem::replace(&mut entry.life, Life::Restarting) {
            Life::Live(members) => {
                members.stop_all();
                MEMBERS.to_vec()
            }
            Life::Restarting | Life::Damaged => Vec::new(),
        };
        let budget = entry.config.worktrees.pool_budget_mb;
        let stopping = !awaited.is_empty();
        let retiring = Retiring {
            generation: entry.generation,
            awaited,
            thread: entry.thread.take(),
            repo: entry.repo,
            keep_failed: entry.config.worktrees.keep_failed,
            retry_in_place: entry.config.worktrees.retry_in_place,
            // Only where no process of the run can outlive it (bwrap's pid namespace), once
            // its actors have stopped (not when they were not awaited or did not stop in
            // time), may a directory wait for the next run (ADR-052); 0 empties the pool
            // whatever the run was.
            pool_budget_mb: if budget == 0 {
                Some(0)
            } else {
                (entry.config.sandbox.mode == crate::sandbox::SandboxMode::Bwrap && stopping)
                    .then_some(budget)
            },
            // A config whose branch does not pass never started: nothing of it to heal.
            target: entry.config.target_branch().ok(),
            cleaning: Cleaning::start(&self.cleaning),
        };
        if retiring.awaited.is_empty() {
            self.retired(run, retiring);
            return;
        }
        let generation = retiring.generation;
        self.retiring.insert(run, retiring);
        ctx.run_later(RETIRE_LIMIT, move |act, _| {
            if act.retiring.get(&run).map(|r| r.generation) == Some(generation)
                && let Some(mut retiring) = act.retiring.remove(&run)
            {
                warn!(%run, still = ?retiring.awaited, "a finished run's actors did not stop: their thread is stopped under them");
                if retiring.pool_budget_mb != Some(0) {
                    retiring.pool_budget_mb = None;
                }
                act.retired(run, retiring);
            }
        });
    }

    /// A member of a finished run stopped: on the last one, the run's thread retires.
    /// Whether `stopped` was of a retiring run.
    pub(super) fn member_of_retiring_stopped(&mut self, stopped: &MemberStopped) -> bool {
        let Some(retiring) = self.retiring.get_mut(&stopped.run) else {
            return false;
        };
        if retiring.generation == stopped.generation {
            retiring.awaited.retain(|m| *m != stopped.member);
        }
        if retiring.awaited.is_empty()
            && let Some(retiring) = self.retiring.remove(&stopped.run)
        {
            self.retired(stopped.run, retiring);
        }
        true
    }

    /// The run's actors have all stopped: its thread is stopped (and joined off the
    /// Supervisor's thread, then memory is given back), and what it left is swept.
    fn retired(&mut self, run: RunId, retiring: Retiring) {
        if let Some(thread) = retiring.thread {
            thread.stop();
            self.joining.retain(|joiner| !joiner.is_finished());
            let joiner = std::thread::Builder::new()
                .name(format!("flotilla-retire-{run}"))
                .spawn(move || {
                    if thread.join().is_err() {
                        warn!(%run, "a run's thread did not end cleanly");
                    }
                    give_memory_back();
                });
            match joiner {
                Ok(joiner) => self.joining.push(joiner),
                Err(e) => warn!(%run, error = %e, "cannot wait for a run's thread to end"),
            }
        }
        // With keep_failed, the failed attempts' worktrees outlive the run; with
        // retry_in_place, the journal says which kept branches were never delivered.
        let journal =
            (retiring.keep_failed || retiring.retry_in_place).then(|| self.journal.read(run, 0));
        let mut worktrees = GitWorktrees::new(
            retiring.repo,
            run,
            self.worktrees.join(run.to_string()),
            retiring.target.clone().unwrap_or_else(TargetBranch::legacy),
        );
        if let Some(budget) = retiring.pool_budget_mb {
            // Asked again as the sweep runs: a sandboxed command not seen to end since.
            worktrees = worktrees.leaving_for_next_run(budget, crate::process::every_end_seen);
        }
        clean_up_after(
            self.journal.clone(),
            worktrees,
            retiring.target,
            run,
            journal,
            (retiring.keep_failed, retiring.retry_in_place),
            retiring.cleaning,
        );
    }
}

/// One ended run in the supervisor's count of clean-ups not yet finished; it leaves the
/// count when dropped: at the clean-up's end, or when its task is dropped at the stop.
pub(super) struct Cleaning(Arc<tokio::sync::watch::Sender<usize>>);

impl Cleaning {
    fn start(count: &Arc<tokio::sync::watch::Sender<usize>>) -> Self {
        count.send_modify(|n| *n = n.saturating_add(1));
        Cleaning(count.clone())
    }
}

impl Drop for Cleaning {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Handler<FinishCleanUps> for Supervisor {
    type Result = ResponseFuture<usize>;

    fn handle(&mut self, msg: FinishCleanUps, _: &mut Context<Self>) -> Self::Result {
        let mut count = self.cleaning.subscribe();
        Box::pin(async move {
            // Waits on the count's changes (no polling); a deadline ends the wait.
            let finished = tokio::time::timeout(msg.within, count.wait_for(|n| *n == 0))
                .await
                .is_ok();
            if finished {
                return 0;
            }
            let left = *count.borrow();
            warn!(
                runs = left,
                "stopping before every ended run was cleaned up; the next start collects what they left"
            );
            left
        })
    }
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
            .chain(self.retiring.drain().filter_map(|(_, r)| r.thread));
        for thread in threads.collect::<Vec<_>>() {
            thread.stop();
            if thread.join().is_err() {
                warn!("a run's thread did not end cleanly");
            }
        }
        for joiner in self.joining.drain(..) {
            let _ = joiner.join();
        }
    }
}

/// After a run's thread retired: removes its worktrees (and the branches of attempts that
/// never delivered; delivered work stays on its branch), heals the checkout of its target,
/// stores its status, and gives the run's freed memory back to the system.
fn clean_up_after(
    summaries: SqliteJournal,
    worktrees: GitWorktrees,
    target: Option<TargetBranch>,
    run: RunId,
    journal: Option<futures::future::BoxFuture<'static, Result<Vec<Event>, JournalError>>>,
    (keep_failed, retry_in_place): (bool, bool),
    cleaning: Cleaning,
) {
    actix::spawn(async move {
        // Counted until this task ends, however it ends.
        let _cleaning = cleaning;
        let events = match journal {
            Some(read) => match read.await {
                Ok(events) => events,
                Err(e) => {
                    warn!(%run, error = %e, "cannot read which attempts failed; their worktrees stay for gc");
                    return;
                }
            },
            None => Vec::new(),
        };
        let kinds = || events.iter().map(|e| &e.kind);
        let run_over = SweepKeep {
            worktrees: if keep_failed {
                failed_attempts(run, kinds())
            } else {
                Vec::new()
            },
            // A branch kept for a retry that never came (the task failed for good, or the
            // run ended first) goes with the run, a gate-failed one too (ADR-031).
            delivered: retry_in_place.then(|| {
                let failed: HashSet<String> = failed_attempts(run, kinds()).into_iter().collect();
                let mut delivered = delivered_branches(kinds());
                delivered.retain(|branch| !failed.contains(branch));
                delivered
            }),
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
        // Its status, folded once now (ADR-040), before the memory the fold used goes back.
        crate::daemon::summary::fold_finished(&summaries, run).await;
        let _ = tokio::task::spawn_blocking(give_memory_back).await;
    });
}
