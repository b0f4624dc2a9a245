//! The MergeQueue actor (M6, ADR-011): the only code that moves main.
//!
//! Branches of `Landing` tasks wait in priority order: fix tasks first, then by age, a
//! retried task a little later for each retry (a fixed penalty, so nothing starves). One
//! landing cycle runs at a time, off the actor's thread:
//! 1. main is searched first for the commits the journal named for a task ahead of an
//!    earlier compare-and-swap (ADR-018): work a crash left on main without its
//!    `TaskLanded` is reported, never landed twice. Trailer text is never evidence.
//! 2. Up to `batch_max` branches are built on main's tip in memory ([`MergeGit::build`]).
//!    A conflict on a main that moved since the branch left it gets one more try later in
//!    the queue; a second conflict (or one on an unmoved main) goes to the TaskGraph, which
//!    makes a conflict fix or fails the task.
//! 3. The gate runs on the candidate in a scratch checkout. A failing batch is tested once
//!    more (a flaky gate blames nobody), then bisected: halves that pass land, a single
//!    branch that fails is the culprit and gets the gate's output.
//! 4. The TaskGraph journals the landing's intent (`LandingIntended`: each task's commit);
//!    then main moves by compare-and-swap from the tip the candidate was built on; a main that
//!    moved meanwhile (someone else wrote it) means building again, a bounded number of
//!    times. Nothing ungated ever reaches main.
//! 5. The TaskGraph hears `MainMoved` with each task's commit; landed branches are deleted;
//!    the Reconciler hears that main moved; the user's checkout is kept consistent.
//!
//! Four fail points (`merge::after-build`, `merge::after-gate`, `merge::after-cas`,
//! `merge::before-event`) let the crash tests kill the daemon between these steps, the way
//! `kill -9` would; see [`crash_here`] and ADR-011, "Crash points and how they are tested".
//!
//! Also: `MergeHealth` goes to the planner after each cycle. ADR-018: it pauses with
//! `MainDiverged` when main no longer holds the tip it last wrote, waits out a locked main
//! (`MainRefError::Busy`) with bounded backoff, and fails only the entry whose branch is gone
//! (`BuildOutcome::Unusable`). ADR-024: `AdoptMain` reads which landed commits main dropped and
//! answers `MainAdopted`; it lands on the adopted tip only after `Adopted`; a branch holding
//! dropped work fails `StaleBase`; a gate scratch refused by storage sends the batch back and
//! says `StorageUnavailable`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::ports::{
    BuildOutcome, Clock, LandItem, LandMode, MainRef, MainRefError, MergeGit, ProcessRunner,
    RepoError, RepoReader, SystemClock,
};
use crate::protocol::{
    CheckoutSync, Event, EventKind, FixOf, FromMerging, IntendLanding, IntendedLanding,
    LandRequest, LandingFailure, MergeHealth, Published, RunId, TaskId, ToMergeQueue, ToPlanner,
    ToReconciler,
};
use crate::scratch_commands::{NamedCommand, ScratchRun};
use crate::supervision::{Lifeline, StopCause, StopMember};

/// `[merge]` in flotilla.toml.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MergeConfig {
    /// How a branch becomes commits on main.
    pub mode: LandMode,
    /// Commands a candidate must pass before main moves to it (build, test), run in order
    /// in a scratch checkout of the candidate. Empty: no gate.
    pub gate: Vec<String>,
    /// Wall-time limit of each gate command.
    pub gate_timeout_secs: u64,
    /// Branches tested together at most.
    pub batch_max: usize,
    /// The branch work lands on ("main" in the actors' words; ADR-022). Left out, submit
    /// fills in the branch the repository's HEAD names, so that the journaled config says
    /// which one and a restart lands on the same. Checked against git's rules by the daemon.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
}

impl Default for MergeConfig {
    fn default() -> Self {
        MergeConfig {
            mode: LandMode::Rebase,
            gate: Vec::new(),
            gate_timeout_secs: 600,
            batch_max: 4,
            branch: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeConfigError {
    #[error("merge.batch_max = 0: at least one branch must fit in a batch")]
    ZeroBatch,
    #[error("merge.batch_max = {0}: at most 64 branches are tested together")]
    BatchTooLarge(usize),
    #[error("merge.gate_timeout_secs = 0: the gate needs some time")]
    ZeroTimeout,
    #[error("merge.gate has an empty command: leave it out")]
    EmptyCommand,
}

impl MergeConfig {
    /// The target branch's name, for people: `main` for a run from before ADR-022.
    pub fn branch_name(&self) -> &str {
        self.branch.as_deref().unwrap_or("main")
    }

    pub fn validate(&self) -> Result<(), MergeConfigError> {
        if self.batch_max == 0 {
            return Err(MergeConfigError::ZeroBatch);
        }
        if self.batch_max > 64 {
            return Err(MergeConfigError::BatchTooLarge(self.batch_max));
        }
        if self.gate_timeout_secs == 0 {
            return Err(MergeConfigError::ZeroTimeout);
        }
        if self.gate.iter().any(|c| c.trim().is_empty()) {
            return Err(MergeConfigError::EmptyCommand);
        }
        Ok(())
    }
}

/// How far back in the queue each retry puts a task (in enqueue positions).
const RETRY_PENALTY: u64 = 4;
/// Compare-and-swaps that may find main moved by someone else, in a row, before the batch's
/// tasks fail.
const MAX_MAIN_RACES: u32 = 10;
/// Waits for main's lock (held by another writer) in one round before the batch goes back
/// to the queue: about 10 s in all.
const MAX_LOCK_WAITS: u32 = 8;

/// The wait before the `n`-th try after finding main locked: 40 ms doubling, at most 4 s.
fn lock_backoff(n: u32) -> Duration {
    Duration::from_millis(40u64.saturating_mul(1 << n.min(7)).min(4_000))
}

/// Landings the median wait is taken over.
const WAITS_KEPT: usize = 64;

/// What the queue needs of the world.
#[derive(Clone)]
pub struct MergeKit {
    pub git: Arc<dyn MergeGit>,
    pub main: Arc<dyn MainRef>,
    pub reader: Arc<dyn RepoReader>,
    pub runner: Arc<dyn ProcessRunner>,
    pub config: MergeConfig,
}

/// A branch waiting, with what the queue keeps about it.
#[derive(Debug, Clone)]
struct Queued {
    request: LandRequest,
    enqueued: Instant,
    /// Already had its one retry after a conflict on a main that moved.
    conflict_retried: bool,
}

/// Fix tasks first (0), then the rest (1); within each, enqueue position plus the retry
/// penalty.
type QueueKey = (u8, u64);

pub struct MergeQueue {
    run: RunId,
    kit: MergeKit,
    graph: Recipient<FromMerging>,
    /// Where a landing's intent is journaled before main moves (the TaskGraph).
    intents: Recipient<IntendLanding>,
    reconciler: Option<Recipient<ToReconciler>>,
    planner: Option<Recipient<ToPlanner>>,
    waiting: BTreeMap<QueueKey, Queued>,
    next_position: u64,
    /// A landing cycle is in flight.
    busy: bool,
    /// The user's checkout is being brought to main's tip at the queue's start; cycles wait.
    catching_up: bool,
    /// The tip this queue (or the run's earlier life, from the journal) last moved main to:
    /// main must still contain it before each landing (ADR-018).
    written: Option<String>,
    /// main no longer contains `written` (it was reset): landing is paused; this is the tip
    /// found, said once. A new branch (or a restart) looks again.
    diverged: Option<String>,
    /// Commits of landed work an adopted main dropped: a branch holding one does not land.
    dropped: Arc<Vec<String>>,
    landed: u64,
    failed: u64,
    waits_ms: Vec<u64>,
    cancel: CancellationToken,
    lifeline: Option<Lifeline>,
    /// Where notices go (the supervisor): storage that refused a write pauses the run.
    notices: Option<Recipient<Published>>,
    /// Waiting for storage that refused a scratch checkout: cycles wait.
    storage_wait: bool,
    /// Scratch checkouts refused in a row (the backoff's exponent).
    storage_refusals: u32,
}

/// What one cycle did, for the actor to count and requeue.
struct CycleEnd {
    requeue: Vec<Queued>,
    landed: Vec<Duration>,
    failed: u64,
    /// The tip the cycle last moved main to.
    written: Option<String>,
    /// main no longer contains what flotilla wrote: this is where it is.
    diverged: Option<String>,
    /// flotilla's storage refused a scratch checkout: the batch waits (ADR-024).
    storage: Option<String>,
}

impl MergeQueue {
    pub fn new(
        run: RunId,
        kit: MergeKit,
        graph: Recipient<FromMerging>,
        intents: Recipient<IntendLanding>,
    ) -> Self {
        MergeQueue {
            run,
            kit,
            graph,
            intents,
            reconciler: None,
            planner: None,
            waiting: BTreeMap::new(),
            next_position: 0,
            busy: false,
            catching_up: false,
            written: None,
            diverged: None,
            dropped: Arc::default(),
            landed: 0,
            failed: 0,
            waits_ms: Vec::new(),
            cancel: CancellationToken::new(),
            lifeline: None,
            notices: None,
            storage_wait: false,
            storage_refusals: 0,
        }
    }

    /// Where to say that flotilla's storage refused a write (the supervisor, which pauses
    /// the run).
    pub fn with_notices(mut self, notices: Recipient<Published>) -> Self {
        self.notices = Some(notices);
        self
    }

    /// The tip the run last moved main to, from its journal (a restarted run).
    pub fn with_written(mut self, tip: Option<String>) -> Self {
        self.written = tip;
        self
    }

    /// The commits of landed work an adopted main dropped, from the journal (ADR-024).
    pub fn with_dropped(mut self, dropped: Vec<String>) -> Self {
        self.dropped = Arc::new(dropped);
        self
    }

    pub fn with_reconciler(mut self, reconciler: Recipient<ToReconciler>) -> Self {
        self.reconciler = Some(reconciler);
        self
    }

    pub fn with_planner(mut self, planner: Recipient<ToPlanner>) -> Self {
        self.planner = Some(planner);
        self
    }

    pub fn watched(mut self, lifeline: Lifeline) -> Self {
        self.lifeline = Some(lifeline);
        self
    }

    fn key(&mut self, request: &LandRequest) -> QueueKey {
        let class = u8::from(request.fix.is_none());
        let position = self.next_position;
        self.next_position += 1;
        let penalty = RETRY_PENALTY.saturating_mul(u64::from(request.retries));
        (class, position.saturating_add(penalty))
    }

    fn health(&self) -> MergeHealth {
        let mut waits = self.waits_ms.clone();
        waits.sort_unstable();
        MergeHealth {
            queued: self.waiting.len() + usize::from(self.busy),
            landed: self.landed,
            failed: self.failed,
            median_wait_ms: waits.get(waits.len() / 2).copied().unwrap_or(0),
        }
    }

    /// Starts a landing cycle when none is in flight and a branch waits.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        if self.busy || self.catching_up || self.storage_wait || self.waiting.is_empty() {
            return;
        }
        let mut batch = Vec::new();
        while batch.len() < self.kit.config.batch_max {
            let Some((_, queued)) = self.waiting.pop_first() else {
                break;
            };
            batch.push(queued);
        }
        self.busy = true;
        let cycle = Cycle {
            written: self.written.clone(),
            dropped: self.dropped.clone(),
            kit: self.kit.clone(),
            graph: self.graph.clone(),
            intents: self.intents.clone(),
            reconciler: self.reconciler.clone(),
            cancel: self.cancel.clone(),
            run: self.run,
        };
        ctx.spawn(
            async move { cycle.land(batch).await }
                .into_actor(self)
                .map(|end, act, ctx| {
                    act.busy = false;
                    if let Some(tip) = end.written.clone() {
                        act.written = Some(tip);
                    }
                    let diverged = end.diverged.clone();
                    let first_task = end.requeue.first().map(|q| q.request.task.clone());
                    let landed_some = !end.landed.is_empty();
                    for queued in end.requeue {
                        let key = if queued.conflict_retried {
                            // Its second try goes behind what waits now.
                            act.key(&queued.request)
                        } else {
                            (u8::from(queued.request.fix.is_none()), 0)
                        };
                        act.insert(key, queued);
                    }
                    act.landed += end.landed.len() as u64;
                    act.failed += end.failed;
                    for wait in end.landed {
                        act.waits_ms.push(wait.as_millis() as u64);
                    }
                    let excess = act.waits_ms.len().saturating_sub(WAITS_KEPT);
                    act.waits_ms.drain(..excess);
                    if let Some(planner) = &act.planner {
                        planner.do_send(ToPlanner::MergeHealth(act.health()));
                    }
                    if let Some(actual) = diverged {
                        // Paused: said once per tip found; the next branch looks again.
                        if act.diverged.as_ref() != Some(&actual) {
                            act.graph.do_send(FromMerging::Note(Box::new(
                                EventKind::MainDiverged {
                                    expected: act.written.clone().unwrap_or_default(),
                                    actual: actual.clone(),
                                },
                            )));
                        }
                        act.diverged = Some(actual);
                        return;
                    }
                    act.diverged = None;
                    if let Some(error) = end.storage {
                        act.wait_for_storage(first_task, error, ctx);
                        return;
                    }
                    if landed_some {
                        act.storage_refusals = 0;
                    }
                    act.pump(ctx);
                }),
        );
    }

    /// The user adopts main as it is (ADR-024): reads main's tip and which of `landed`'s
    /// commits it no longer contains, and tells the graph, which journals `MainAdopted`;
    /// landing resumes only when it hears back (`Adopted`). Nothing is replayed.
    fn adopt(&mut self, expected: String, landed: Vec<(TaskId, String)>, ctx: &mut Context<Self>) {
        let (reader, git, graph, run) = (
            self.kit.reader.clone(),
            self.kit.git.clone(),
            self.graph.clone(),
            self.run,
        );
        ctx.spawn(
            async move {
                let tip = match reader.main_tip().await {
                    Ok(tip) => tip,
                    Err(e) => {
                        warn!(%run, error = %e, "reading main's tip to adopt it; decide again");
                        return;
                    }
                };
                let mut dropped = Vec::new();
                for (task, commit) in landed {
                    match git.contains(tip.clone(), commit.clone()).await {
                        Ok(true) => {}
                        Ok(false) => dropped.push(task),
                        // A commit git cannot find is not on main either.
                        Err(e) => {
                            warn!(%run, %task, %commit, error = %e, "looking for a landed commit on main");
                            dropped.push(task);
                        }
                    }
                }
                graph.do_send(FromMerging::MainAdopted {
                    expected,
                    tip,
                    dropped,
                });
            }
            .into_actor(self),
        );
    }

    /// flotilla's storage refused a scratch checkout: says so (the supervisor pauses the
    /// run) and tries again after a backoff. Nothing is charged to the batch.
    fn wait_for_storage(&mut self, task: Option<TaskId>, error: String, ctx: &mut Context<Self>) {
        let wait = STORAGE_WAIT_FIRST
            .saturating_mul(1u32 << self.storage_refusals.min(16))
            .min(STORAGE_WAIT_MAX);
        self.storage_refusals = self.storage_refusals.saturating_add(1);
        warn!(run = %self.run, %error, retry_in_ms = wait.as_millis() as u64,
            "flotilla's storage refused the gate's scratch checkout: the batch waits");
        if let (Some(notices), Some(task)) = (&self.notices, task) {
            notices.do_send(Published(Event {
                seq: 0,
                run: self.run,
                at_ms: SystemClock.now_ms(),
                kind: EventKind::StorageUnavailable { task, error },
            }));
        }
        self.storage_wait = true;
        ctx.run_later(wait, |act, ctx| {
            act.storage_wait = false;
            act.pump(ctx);
        });
    }

    /// Inserts at `key`, or just after it when taken (requeued items keep their order).
    fn insert(&mut self, mut key: QueueKey, queued: Queued) {
        while self.waiting.contains_key(&key) {
            key.1 = key.1.saturating_add(1);
        }
        self.waiting.insert(key, queued);
    }
}

/// One landing cycle's world, moved off the actor.
struct Cycle {
    /// The tip main must still contain (the last one flotilla wrote).
    written: Option<String>,
    /// Commits an adopted main dropped: never landed again through a branch that holds them.
    dropped: Arc<Vec<String>>,
    kit: MergeKit,
    graph: Recipient<FromMerging>,
    intents: Recipient<IntendLanding>,
    reconciler: Option<Recipient<ToReconciler>>,
    cancel: CancellationToken,
    run: RunId,
}

/// Why a build-and-gate round stopped.
enum Round {
    /// Landed (main moved).
    Landed,
    /// The gate failed with this command's output.
    GateFailed { command: String, tail: String },
    /// The batch must be tried again (main moved, a conflict between batch members).
    Again,
}

impl Cycle {
    async fn land(self, batch: Vec<Queued>) -> CycleEnd {
        let mut end = CycleEnd {
            requeue: Vec::new(),
            landed: Vec::new(),
            failed: 0,
            written: None,
            diverged: None,
            storage: None,
        };
        let batch = self.already_landed(batch, &mut end).await;
        if batch.is_empty() {
            return end;
        }
        // Flaky check: a failing batch is tested once more before anyone is blamed.
        if let Round::GateFailed { command, tail } = self.round(&batch, &mut end, true).await {
            self.bisect(batch, (command, tail), &mut end).await;
        }
        end
    }

    /// What main already holds is reported, not landed again: a crash after the
    /// compare-and-swap and before `TaskLanded` leaves the work there. The evidence is the
    /// commit journaled ahead of the move (`LandRequest::intended`, ADR-018) found on main's
    /// first-parent history; a commit's trailer text is never evidence (an agent can write
    /// one for any task).
    async fn already_landed(&self, batch: Vec<Queued>, end: &mut CycleEnd) -> Vec<Queued> {
        if batch.iter().all(|q| q.request.intended.is_empty()) {
            return batch;
        }
        let tip = match self.kit.reader.main_tip().await {
            Ok(tip) => tip,
            Err(e) => {
                warn!(run = %self.run, error = %e, "reading main's tip");
                return batch;
            }
        };
        let intended = batch.iter().map(|q| q.request.intended.clone()).collect();
        let found = match self.kit.git.find_on_main(tip, intended).await {
            Ok(found) => found,
            Err(e) => {
                warn!(run = %self.run, error = %e, "looking for landed work on main");
                return batch;
            }
        };
        let mut rest = Vec::new();
        for (queued, commit) in batch.into_iter().zip(found) {
            match commit {
                Some(commit) => {
                    let r = &queued.request;
                    // Branches go before the graph hears, as after a landing: once the task
                    // is landed nothing enqueues it again, so a kill between the two would
                    // leave its branch (and a fixed task's) for good.
                    self.delete_branches(r).await;
                    self.graph.do_send(FromMerging::FoundOnMain {
                        task: r.task.clone(),
                        attempt: r.attempt,
                        commit,
                    });
                    end.landed.push(queued.enqueued.elapsed());
                }
                None => rest.push(queued),
            }
        }
        rest
    }

    /// Bisects a batch whose gate failed (`failure`): halves are built and gated on main's
    /// tip in turn, those that pass land, and a single branch that fails is a culprit and
    /// gets the gate's output. Every branch gets a verdict or goes back to the queue.
    async fn bisect(&self, batch: Vec<Queued>, failure: (String, String), end: &mut CycleEnd) {
        let mut pending = vec![(batch, Some(failure))];
        while let Some((mut items, known)) = pending.pop() {
            let verdict = match known {
                Some((command, tail)) => Round::GateFailed { command, tail },
                None => self.round(&items, end, false).await,
            };
            match verdict {
                Round::Landed | Round::Again => {}
                Round::GateFailed { command, tail } if items.len() == 1 => {
                    let r = &items[0].request;
                    self.graph.do_send(FromMerging::Failed {
                        task: r.task.clone(),
                        attempt: r.attempt,
                        failure: LandingFailure::GateFailed {
                            command,
                            output_tail: tail,
                        },
                    });
                    self.delete_branches_of_attempt(r).await;
                    end.failed += 1;
                }
                Round::GateFailed { .. } => {
                    let right = items.split_off(items.len() / 2);
                    // Popped last-in first: the left half is tried first.
                    pending.push((right, None));
                    pending.push((items, None));
                }
            }
        }
    }

    /// Builds `items` on main's tip, gates the candidate and moves main to it.
    async fn round(&self, items: &[Queued], end: &mut CycleEnd, flaky_retry: bool) -> Round {
        let mut items = items;
        let mut races = 0;
        let mut lock_waits = 0;
        loop {
            let tip = match self.kit.reader.main_tip().await {
                Ok(tip) => tip,
                Err(e) => {
                    self.fail_all(
                        items,
                        format!("reading {}: {e}", self.kit.config.branch_name()),
                        end,
                    );
                    return Round::Again;
                }
            };
            // main must still hold what flotilla last wrote there. Moved forward (a user's
            // commit, another run's landing): the batch is built on top. Reset, force-pushed
            // or moved aside: landing stops, and nothing dropped is replayed.
            let written = end.written.as_ref().or(self.written.as_ref());
            if let Some(written) = written.filter(|w| **w != tip) {
                match self.kit.git.contains(tip.clone(), written.clone()).await {
                    Ok(true) => {}
                    Ok(false) => {
                        end.requeue.extend(items.iter().cloned());
                        end.diverged = Some(tip);
                        return Round::Again;
                    }
                    Err(e) => {
                        warn!(run = %self.run, error = %e, "checking that main holds what was landed");
                        end.requeue.extend(items.iter().cloned());
                        end.diverged = Some(tip);
                        return Round::Again;
                    }
                }
            }
            // A branch started from main before it was reset holds the work the adoption
            // dropped: landing it would replay that work (ADR-024). Its task is tried again
            // from main as it is; its batch-mates go back first in line.
            if let Some((index, detail)) = self.holds_dropped_work(items).await {
                for (i, q) in items.iter().enumerate() {
                    if i == index {
                        self.graph.do_send(FromMerging::Failed {
                            task: q.request.task.clone(),
                            attempt: q.request.attempt,
                            failure: LandingFailure::StaleBase {
                                detail: detail.clone(),
                            },
                        });
                        self.delete_branches_of_attempt(&q.request).await;
                        end.failed += 1;
                    } else {
                        end.requeue.push(q.clone());
                    }
                }
                return Round::Again;
            }
            let lands: Vec<LandItem> = items
                .iter()
                .map(|q| land_item(self.run, &q.request))
                .collect();
            let built = self
                .kit
                .git
                .build(tip.clone(), lands, self.kit.config.mode)
                .await;
            let (candidate, commits) = match built {
                Ok(BuildOutcome::Built { tip, commits }) => {
                    // Crash point: a candidate exists (commits written, no ref moved) and is
                    // ungated. A restart must build and gate it again, never land it as is.
                    fail::fail_point!("merge::after-build", |_| crash_here("merge::after-build"));
                    (tip, commits)
                }
                Ok(BuildOutcome::Conflict {
                    index,
                    files,
                    clashing,
                    main_moved,
                }) if index > 0 => {
                    // The clash may be with a batch-mate ahead, which is not on main: judged
                    // now, its fix would start from a main without that side (nothing to
                    // resolve, an empty fix, then a second fix for the same conflict). Those
                    // ahead built cleanly and go on alone; the rest go back, to be built on
                    // what they land.
                    debug!(run = %self.run, task = %items[index].request.task, ?files, ?clashing, main_moved, "a conflict inside a batch: the branches ahead of it go on alone");
                    end.requeue.extend(items[index..].iter().cloned());
                    items = &items[..index];
                    continue;
                }
                Ok(BuildOutcome::Conflict {
                    index,
                    files,
                    clashing,
                    main_moved,
                }) => {
                    self.conflict(items, index, files, clashing, main_moved, end);
                    return Round::Again;
                }
                Ok(BuildOutcome::Unusable { index, detail }) => {
                    // Only that branch is at fault (gone, or moved since its handoff): it
                    // fails, and its batch-mates go back first in line.
                    for (i, q) in items.iter().enumerate() {
                        if i == index {
                            self.fail_one(q, detail.clone(), end);
                        } else {
                            end.requeue.push(q.clone());
                        }
                    }
                    return Round::Again;
                }
                Err(e) => {
                    self.fail_all(items, e.to_string(), end);
                    return Round::Again;
                }
            };
            let gate = match self.gate(&candidate, items).await {
                None => None,
                Some(GateStop::Failed(command, tail)) => Some((command, tail)),
                Some(GateStop::Storage(error)) => return self.storage_refused(items, error, end),
            };
            if let Some((command, tail)) = gate {
                let tasks: Vec<TaskId> = items.iter().map(|q| q.request.task.clone()).collect();
                let retry = flaky_retry;
                self.graph
                    .do_send(FromMerging::Note(Box::new(EventKind::MergeGateFailed {
                        tasks,
                        command: command.clone(),
                        output_tail: tail.clone(),
                        bisecting: !retry && items.len() > 1,
                        flaky_retry: retry,
                    })));
                if retry {
                    // Once more on the same candidate: a flaky gate blames nobody.
                    match self.gate(&candidate, items).await {
                        None => {}
                        Some(GateStop::Failed(command, tail)) => {
                            return Round::GateFailed { command, tail };
                        }
                        Some(GateStop::Storage(error)) => {
                            return self.storage_refused(items, error, end);
                        }
                    }
                } else {
                    return Round::GateFailed { command, tail };
                }
            }
            // Crash point: the candidate passed its gate, main has not moved. The verdict is
            // kept nowhere: a restart gates again before main moves.
            fail::fail_point!("merge::after-gate", |_| crash_here("merge::after-gate"));
            // Written ahead: the journal names the commits that will hold each task's work
            // before main moves, so that a restart can tell them on main (ADR-018).
            let intent = IntendLanding {
                from: tip.clone(),
                to: candidate.clone(),
                landed: items
                    .iter()
                    .zip(&commits)
                    .map(|(q, commit)| IntendedLanding {
                        task: q.request.task.clone(),
                        attempt: q.request.attempt,
                        commit: commit.clone(),
                    })
                    .collect(),
            };
            let journaled = match self.intents.send(intent).await {
                Ok(result) => result,
                Err(e) => Err(format!("the task graph is gone: {e}")),
            };
            if let Err(e) = journaled {
                // Nobody is to blame: main stays, the batch waits for the restart that a
                // journal failure brings.
                warn!(run = %self.run, error = %e, "main does not move: its intent is not journaled");
                end.requeue.extend(items.iter().cloned());
                return Round::Again;
            }
            // The move waits while the user's checkout of main cannot follow (ADR-021).
            let Some(moved) = self.move_main(&tip, &candidate).await else {
                end.requeue.extend(items.iter().cloned());
                return Round::Again; // the queue is stopping
            };
            match moved {
                Ok(()) => {
                    // Crash point: main holds the work, nothing else knows (no checkout sync,
                    // branches still there, no event). A restart must find the intended
                    // commits on main and report them, not land the tasks a second time.
                    fail::fail_point!("merge::after-cas", |_| crash_here("merge::after-cas"));
                    end.written = Some(candidate.clone());
                    self.landed(items, &tip, &candidate, commits, end).await;
                    return Round::Landed;
                }
                Err(MainRefError::Moved { .. }) if races < MAX_MAIN_RACES => {
                    races += 1;
                    continue;
                }
                Err(MainRefError::Busy { detail }) => {
                    // Another writer holds main's lock: contention, never the batch's
                    // fault. Wait (exponentially, bounded) and build again on whatever main
                    // is then; past the bound the batch goes back to the queue unjudged.
                    if lock_waits >= MAX_LOCK_WAITS {
                        warn!(run = %self.run, %detail, "main stayed locked; the batch waits in the queue");
                        end.requeue.extend(items.iter().cloned());
                        return Round::Again;
                    }
                    let wait = lock_backoff(lock_waits);
                    lock_waits += 1;
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = self.cancel.cancelled() => {
                            end.requeue.extend(items.iter().cloned());
                            return Round::Again;
                        }
                    }
                    continue;
                }
                Err(e) => {
                    self.fail_all(
                        items,
                        format!("moving {}: {e}", self.kit.config.branch_name()),
                        end,
                    );
                    return Round::Again;
                }
            }
        }
    }

    /// The compare-and-swap of main, waiting while the user's checkout of main cannot follow
    /// (ADR-021: their changes in the landing's files, a merge in progress, another git
    /// command at work): nothing moved then, and the gated candidate stays good. `None`
    /// when the queue stops meanwhile.
    async fn move_main(&self, tip: &str, candidate: &str) -> Option<Result<(), MainRefError>> {
        let mut wait = CHECKOUT_WAIT_FIRST;
        loop {
            match self
                .kit
                .main
                .compare_and_swap(tip.to_string(), candidate.to_string())
                .await
            {
                Err(MainRefError::CheckoutBusy { detail }) => {
                    warn!(run = %self.run, %detail, retry_in_s = wait.as_secs(), "landing waits for the user's checkout of main");
                    tokio::select! {
                        _ = self.cancel.cancelled() => return None,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    wait = (wait * 2).min(CHECKOUT_WAIT_MAX);
                }
                other => return Some(other),
            }
        }
    }

    /// Runs the gate on `candidate`: `None` when it passed, else the failing command and
    /// its output's tail, or flotilla's storage refusing the scratch checkout (nobody's
    /// failure). A conflict fix must leave no conflict marker in its files.
    async fn gate(&self, candidate: &str, items: &[Queued]) -> Option<GateStop> {
        let marked: Vec<String> = items
            .iter()
            .filter_map(|q| match &q.request.fix {
                Some(FixOf::Conflict { files, .. }) => Some(files.clone()),
                _ => None,
            })
            .flatten()
            .collect();
        if !marked.is_empty() {
            match self
                .kit
                .git
                .conflict_markers(candidate.to_string(), Some(marked))
                .await
            {
                Ok(hits) if !hits.is_empty() => {
                    let at: Vec<String> = hits
                        .iter()
                        .map(|h| format!("{}:{}", h.path, h.line))
                        .collect();
                    return Some(GateStop::Failed(
                        "conflict marker check".into(),
                        format!("conflict markers remain at {}", at.join(", ")),
                    ));
                }
                Ok(_) => {}
                Err(e) => {
                    return Some(GateStop::Failed(
                        "conflict marker check".into(),
                        e.to_string(),
                    ));
                }
            }
        }
        if self.kit.config.gate.is_empty() {
            return None;
        }
        let scratch = ScratchRun {
            git: self.kit.git.clone(),
            runner: self.kit.runner.clone(),
            timeout: Duration::from_secs(self.kit.config.gate_timeout_secs),
            stop_at_first_failure: true,
        };
        let commands = self
            .kit
            .config
            .gate
            .iter()
            .map(|line| NamedCommand {
                name: "gate".into(),
                line: line.clone(),
            })
            .collect();
        let label = format!("gate-{}", short(candidate));
        match scratch
            .run(candidate.to_string(), label, commands, self.cancel.clone())
            .await
        {
            Ok(results) => results
                .into_iter()
                .find(|r| !r.passed)
                .map(|r| GateStop::Failed(format!("{} ({})", r.line, r.exit), r.tail())),
            Err(RepoError::Storage(e)) => Some(GateStop::Storage(format!(
                "making the gate's scratch checkout: {e}"
            ))),
            Err(e) => Some(GateStop::Failed(
                "scratch checkout".into(),
                format!("making a scratch checkout: {e}"),
            )),
        }
    }

    async fn landed(
        &self,
        items: &[Queued],
        from: &str,
        to: &str,
        commits: Vec<String>,
        end: &mut CycleEnd,
    ) {
        let checkout = match self
            .kit
            .git
            .sync_checkout(from.to_string(), to.to_string())
            .await
        {
            Ok(sync) => sync,
            Err(e) => {
                warn!(run = %self.run, error = %e, "keeping the user's checkout in step");
                CheckoutSync::NotCheckedOut
            }
        };
        // Branches go before the graph hears: a crash in between is healed by the restart's
        // look for the intended commits on main, which comes before any build.
        for q in items {
            self.delete_branches(&q.request).await;
            end.landed.push(q.enqueued.elapsed());
        }
        // Crash point: main moved and the branches are gone, the graph has not heard. A
        // restart must take the work from the journaled intent, since the branches cannot.
        fail::fail_point!("merge::before-event", |_| crash_here("merge::before-event"));
        let landed = items
            .iter()
            .zip(commits)
            .map(|(q, commit)| (q.request.task.clone(), q.request.attempt, commit))
            .collect();
        self.graph.do_send(FromMerging::MainMoved {
            from: from.to_string(),
            to: to.to_string(),
            landed,
            checkout,
        });
        if let Some(reconciler) = &self.reconciler {
            reconciler.do_send(ToReconciler::MainMoved {
                tip: to.to_string(),
            });
        }
    }

    /// A conflict at `index` (0 from `round`: a conflict further in a batch lets the
    /// branches ahead land first): one more try later when main moved since the branch
    /// left it and it has not had it; otherwise the TaskGraph decides. The others go back
    /// first in line.
    fn conflict(
        &self,
        items: &[Queued],
        index: usize,
        files: Vec<String>,
        clashing: Vec<String>,
        main_moved: bool,
        end: &mut CycleEnd,
    ) {
        for (i, q) in items.iter().enumerate() {
            if i != index {
                end.requeue.push(q.clone());
                continue;
            }
            let r = &q.request;
            // In a batch, the clash may be with a branch ahead of it that has not landed.
            let retry = (main_moved || index > 0) && !q.conflict_retried;
            if retry {
                self.graph
                    .do_send(FromMerging::Note(Box::new(EventKind::MergeConflict {
                        task: r.task.clone(),
                        files: files.clone(),
                        clashing: clashing.clone(),
                        retrying: true,
                    })));
                let mut again = q.clone();
                again.conflict_retried = true;
                end.requeue.push(again);
            } else {
                self.graph.do_send(FromMerging::Conflict {
                    task: r.task.clone(),
                    attempt: r.attempt,
                    files: files.clone(),
                    clashing: clashing.clone(),
                });
                end.failed += 1;
            }
        }
    }

    /// The first of `items` whose branch holds a commit an adopted main dropped, and why.
    async fn holds_dropped_work(&self, items: &[Queued]) -> Option<(usize, String)> {
        if self.dropped.is_empty() {
            return None;
        }
        for (index, q) in items.iter().enumerate() {
            for commit in self.dropped.iter() {
                let holds = self
                    .kit
                    .git
                    .contains(q.request.head.clone(), commit.clone())
                    .await
                    .unwrap_or(false);
                if holds {
                    let detail = format!(
                        "its branch was started from main before main was reset, and holds \
                         {}, work the adopted main dropped: landing it would bring that work \
                         back, so it is done again from main as it is",
                        short(commit)
                    );
                    return Some((index, detail));
                }
            }
        }
        None
    }

    /// flotilla's storage refused the gate's scratch checkout: the batch goes back to the
    /// queue unjudged, and the queue waits for the storage (ADR-024).
    fn storage_refused(&self, items: &[Queued], error: String, end: &mut CycleEnd) -> Round {
        end.requeue.extend(items.iter().cloned());
        end.storage = Some(error);
        Round::Again
    }

    fn fail_all(&self, items: &[Queued], detail: String, end: &mut CycleEnd) {
        for q in items {
            self.fail_one(q, detail.clone(), end);
        }
    }

    fn fail_one(&self, q: &Queued, detail: String, end: &mut CycleEnd) {
        self.graph.do_send(FromMerging::Failed {
            task: q.request.task.clone(),
            attempt: q.request.attempt,
            failure: LandingFailure::Git { detail },
        });
        end.failed += 1;
    }

    /// A landed branch goes, and with a conflict fix the branch it fixed.
    async fn delete_branches(&self, request: &LandRequest) {
        self.delete_branches_of_attempt(request).await;
        if let Some(FixOf::Conflict { branch, .. }) = &request.fix
            && let Err(e) = self.kit.git.delete_branch(branch.clone()).await
        {
            warn!(run = %self.run, %branch, error = %e, "deleting a fixed branch");
        }
    }

    async fn delete_branches_of_attempt(&self, request: &LandRequest) {
        if let Err(e) = self.kit.git.delete_branch(request.branch.clone()).await {
            warn!(run = %self.run, branch = %request.branch, error = %e, "deleting a branch");
        }
    }
}

/// Why a gate did not pass.
enum GateStop {
    /// This command failed, with its output's tail.
    Failed(String, String),
    /// flotilla's storage refused the scratch checkout: nobody's failure.
    Storage(String),
}

/// How long the queue first waits for storage that refused a scratch checkout, and at most
/// (doubling in between); the supervisor pauses the run meanwhile when it hears of it.
const STORAGE_WAIT_FIRST: Duration = Duration::from_secs(1);
const STORAGE_WAIT_MAX: Duration = Duration::from_secs(60);

/// How long a landing first waits for a user's checkout of main that cannot follow, and at
/// most (doubling in between).
const CHECKOUT_WAIT_FIRST: Duration = Duration::from_secs(1);
const CHECKOUT_WAIT_MAX: Duration = Duration::from_secs(30);

/// The line every commit landed for a task carries, for people reading main's history.
/// flotilla never reads it back (ADR-018): agents can write such lines too, and those are
/// stripped from every message flotilla writes to main.
pub fn trailer(run: RunId, request: &LandRequest) -> String {
    format!("Flotilla-Task: {}/{}", run, request.task)
}

fn land_item(run: RunId, request: &LandRequest) -> LandItem {
    LandItem {
        task: request.task.clone(),
        branch: request.branch.clone(),
        head: request.head.clone(),
        subject: request.subject.clone(),
        trailer: trailer(run, request),
        squash: matches!(request.fix, Some(FixOf::Conflict { .. })),
    }
}

/// What an armed fail point of the landing cycle does (`FAILPOINTS="merge::after-gate=return"`,
/// set by the crash tests only): the daemon dies at once, as with `kill -9`. No destructor,
/// no flush, no journal write: SIGKILL on itself (abort, should that ever return). Only with
/// the `failpoints` feature (ADR-027): without it `fail_point!` compiles to nothing.
#[cfg(feature = "failpoints")]
fn crash_here(point: &str) -> ! {
    tracing::error!(
        point,
        "fail point reached: the daemon kills itself (SIGKILL)"
    );
    // SAFETY: getpid and kill have no preconditions; SIGKILL cannot be caught.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}

fn short(commit: &str) -> &str {
    commit.get(..7).unwrap_or(commit)
}

impl Actor for MergeQueue {
    type Context = Context<Self>;

    /// Brings the user's checkout to main's tip before any landing: a crash after main
    /// moved and before the checkout followed left it on an older commit of main, where
    /// `git status` would show the landed work reversed.
    fn started(&mut self, ctx: &mut Context<Self>) {
        self.catching_up = true;
        let (reader, git, run) = (self.kit.reader.clone(), self.kit.git.clone(), self.run);
        ctx.spawn(
            async move {
                let tip = reader.main_tip().await.map_err(|e| e.to_string())?;
                git.sync_checkout(tip.clone(), tip)
                    .await
                    .map_err(|e| e.to_string())
            }
            .into_actor(self)
            .map(move |synced, act, ctx| {
                match synced {
                    Ok(CheckoutSync::Behind { at, paths }) => warn!(
                        %run, %at, ?paths,
                        "the checkout of main is behind main with changes of its own in files main changed: left as it is"
                    ),
                    Ok(_) => {}
                    Err(e) => warn!(%run, error = %e, "bringing the user's checkout to main"),
                }
                act.catching_up = false;
                act.pump(ctx);
            }),
        );
    }

    fn stopping(&mut self, _: &mut Context<Self>) -> Running {
        self.cancel.cancel();
        Running::Stop
    }
}

impl Handler<ToMergeQueue> for MergeQueue {
    type Result = ();

    fn handle(&mut self, msg: ToMergeQueue, ctx: &mut Context<Self>) {
        match msg {
            ToMergeQueue::Enqueue(request) => {
                if self
                    .waiting
                    .values()
                    .any(|q| q.request.task == request.task)
                {
                    return;
                }
                let key = self.key(&request);
                self.insert(
                    key,
                    Queued {
                        request: *request,
                        enqueued: Instant::now(),
                        conflict_retried: false,
                    },
                );
                if let Some(planner) = &self.planner {
                    planner.do_send(ToPlanner::MergeHealth(self.health()));
                }
                // Not at once: branches already in the mailbox join this batch.
                ctx.notify(Pump);
            }
            ToMergeQueue::Withdraw { task } => {
                self.waiting.retain(|_, q| q.request.task != task);
            }
            ToMergeQueue::AdoptMain { expected, landed } => self.adopt(expected, landed, ctx),
            ToMergeQueue::Adopted {
                expected,
                tip,
                dropped,
            } => {
                self.dropped = Arc::new(dropped);
                // A landing since (main was put back meanwhile) wrote a newer tip: that
                // one stands, and the graph ignores the adoption.
                if self.written.as_deref() == Some(expected.as_str()) {
                    self.written = Some(tip);
                    self.diverged = None;
                    self.pump(ctx);
                }
            }
        }
    }
}

/// Start a landing cycle if none runs (sent to itself, so that it comes after the
/// enqueues already waiting in the mailbox).
#[derive(Message)]
#[rtype(result = "()")]
struct Pump;

impl Handler<Pump> for MergeQueue {
    type Result = ();

    fn handle(&mut self, _: Pump, ctx: &mut Context<Self>) {
        self.pump(ctx);
    }
}

impl Handler<StopMember> for MergeQueue {
    type Result = ();

    fn handle(&mut self, _: StopMember, ctx: &mut Context<Self>) {
        if let Some(lifeline) = &mut self.lifeline {
            lifeline.set_cause(StopCause::Finished);
        }
        ctx.stop();
    }
}
