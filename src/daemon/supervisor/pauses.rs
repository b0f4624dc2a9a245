//! Runs paused for reasons outside them (ADR-024): flotilla's own storage refusing a write
//! (the run's actors stop until a test write goes through, then it restarts from the
//! journal), and a provider's long rate-limit pause (journaled while it lasts, so `status`
//! shows it, and its end journaled when due). Backoff and deadlines are timers, never loops;
//! it must not know the providers' wire formats.

use std::collections::HashMap;
use std::time::Duration;

use actix::prelude::*;
use flotilla_actors::protocol::{Event, EventKind, RunId};
use tracing::{info, warn};

use super::{Life, RunProblem, Supervisor};

/// First wait before looking whether storage that refused a write takes writes again;
/// doubles up to [`STORAGE_RETRY_MAX`].
const STORAGE_RETRY_FIRST: Duration = Duration::from_secs(1);
const STORAGE_RETRY_MAX: Duration = Duration::from_secs(60);

impl Supervisor {
    /// flotilla's own storage refused a write for a live run (a worktree or a scratch
    /// checkout: disk full, read-only; ADR-024): the run pauses as for an unwritable
    /// journal. Its actors stop (attempts in flight are interrupted at the restart, never
    /// charged), `status` says why, and once a test write under the run's directory goes
    /// through the run is restarted from its journal.
    pub(super) fn storage_pause(&mut self, run: RunId, error: String, ctx: &mut Context<Self>) {
        let Some(entry) = self.runs.get_mut(&run) else {
            return;
        };
        let Life::Live(members) = &entry.life else {
            return; // already paused (or restarting)
        };
        members.stop_all();
        entry.life = Life::Restarting;
        let problem = format!("flotilla's storage refused a write: {error}");
        warn!(%run, %problem, "run paused");
        entry.problem = Some(RunProblem::Paused(problem));
        self.retry_storage_later(run, ctx);
    }

    fn retry_storage_later(&mut self, run: RunId, ctx: &mut Context<Self>) {
        let Some(entry) = self.runs.get_mut(&run) else {
            return;
        };
        let delay = STORAGE_RETRY_FIRST
            .saturating_mul(1u32 << entry.storage_pauses.min(16))
            .min(STORAGE_RETRY_MAX);
        entry.storage_pauses = entry.storage_pauses.saturating_add(1);
        let probe = self.worktrees.join(run.to_string());
        ctx.run_later(delay, move |act, ctx| {
            // A cancel journaled meanwhile needs no storage: the next life carries it out
            // (it dispatches nothing) and the run ends.
            if act
                .runs
                .get(&run)
                .is_some_and(|entry| entry.cancel_journaled.is_some())
            {
                info!(%run, "a cancel waits: the paused run restarts to carry it out");
                if let Some(entry) = act.runs.get_mut(&run) {
                    entry.problem = None;
                }
                act.restart(run, ctx);
                return;
            }
            let write = tokio::task::spawn_blocking(move || storage_takes_writes(&probe));
            ctx.spawn(write.into_actor(act).map(move |result, act, ctx| {
                let error = match result {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(e) => Some(e.to_string()),
                };
                match error {
                    None => {
                        info!(%run, "flotilla's storage takes writes again: the run resumes");
                        if let Some(entry) = act.runs.get_mut(&run) {
                            entry.problem = None;
                        }
                        act.restart(run, ctx);
                    }
                    Some(e) => {
                        warn!(%run, error = %e, "flotilla's storage still refuses writes");
                        if let Some(entry) = act.runs.get_mut(&run) {
                            entry.problem = Some(RunProblem::Paused(format!(
                                "flotilla's storage refused a write: {e}"
                            )));
                        }
                        act.retry_storage_later(run, ctx);
                    }
                }
            }));
        });
    }
}

/// Whether a file can be written (and synced) under `dir`: what a worktree or a scratch
/// checkout needs first. The file is removed after.
fn storage_takes_writes(dir: &std::path::Path) -> std::io::Result<()> {
    use std::io::Write as _;
    std::fs::create_dir_all(dir)?;
    let probe = dir.join(".flotilla-storage-probe");
    let written = std::fs::File::create(&probe).and_then(|mut f| {
        f.write_all(&[0u8; 4096])?;
        f.sync_all()
    });
    let _ = std::fs::remove_file(&probe);
    written
}

/// A journaled pause is said again only when a new one reaches this much further.
const PAUSE_EXTENSION_SAID_MS: u64 = 1_000;

impl Supervisor {
    /// A provider's long rate-limit pause (a live notice from a call) is journaled as
    /// `ProviderPauseStarted`, so that `status` shows it while it lasts, once per pause
    /// (calls of every role hear the same one), and again only when it reaches further;
    /// `ProviderResumed` is journaled when it is over (ADR-024). Whether it is journaled.
    pub(super) fn journal_provider_pause(
        &mut self,
        notice: &Event,
        ctx: &mut Context<Self>,
    ) -> bool {
        let EventKind::ProviderPaused {
            role,
            task,
            provider,
            wait_ms,
        } = &notice.kind
        else {
            return false;
        };
        let run = notice.run;
        let Some(entry) = self.runs.get_mut(&run) else {
            return false;
        };
        if !matches!(entry.life, Life::Live(_)) {
            return false;
        }
        let until_ms = notice.at_ms.saturating_add(*wait_ms);
        let known = entry.provider_pauses.get(provider).copied().unwrap_or(0);
        if until_ms <= known.saturating_add(PAUSE_EXTENSION_SAID_MS) {
            return false;
        }
        entry.provider_pauses.insert(provider.clone(), until_ms);
        let started = EventKind::ProviderPauseStarted {
            provider: provider.clone(),
            role: *role,
            task: task.clone(),
            until_ms,
            why: "rate limited: the provider answered 429 and asked to wait".into(),
        };
        self.record(run, started, ctx, |_, _| {});
        self.resume_provider_at(run, provider.clone(), until_ms, ctx);
        true
    }

    /// At `until_ms`, journals that `provider`'s pause is over, unless a longer one was
    /// journaled since (its own timer says it) or the run ended.
    fn resume_provider_at(
        &self,
        run: RunId,
        provider: String,
        until_ms: u64,
        ctx: &mut Context<Self>,
    ) {
        let wait = Duration::from_millis(until_ms.saturating_sub(self.clock.now_ms()));
        ctx.run_later(wait, move |act, ctx| {
            let Some(entry) = act.runs.get_mut(&run) else {
                return;
            };
            if entry.provider_pauses.get(&provider) != Some(&until_ms) {
                return;
            }
            entry.provider_pauses.remove(&provider);
            act.record(run, EventKind::ProviderResumed { provider }, ctx, |_, _| {});
        });
    }

    /// The pauses a run's journal has open (a daemon stopped during one): their ends are
    /// journaled when due, at once if past.
    pub(super) fn resume_journaled_pauses(
        &mut self,
        run: RunId,
        open: HashMap<String, u64>,
        ctx: &mut Context<Self>,
    ) {
        let Some(entry) = self.runs.get_mut(&run) else {
            return;
        };
        entry.provider_pauses.extend(open.clone());
        for (provider, until_ms) in open {
            self.resume_provider_at(run, provider, until_ms, ctx);
        }
    }
}
