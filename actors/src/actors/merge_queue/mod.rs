//! The MergeQueue actor (M6, ADR-011): the only code that moves main.
//!
//! Branches of `Landing` tasks wait in the order Dispatch hands work out (ADR-032): fix tasks
//! first, then by priority, then by critical path (dependents start only once a task is on
//! main, so what a long chain waits for lands first), then by age, a retried task counted a
//! little younger for each retry. One landing cycle runs at a time, off the actor's thread:
//! 1. main is searched first for the commits the journal named for a task ahead of an
//!    earlier compare-and-swap (ADR-018): work a crash left on main without its
//!    `TaskLanded` is reported, never landed twice. Trailer text is never evidence.
//! 2. Up to `batch_max` branches are built on main's tip in memory ([`MergeGit::build`]);
//!    left out, 4 with a gate and every branch waiting (up to 64) without one (ADR-041).
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
//!
//! This file is the actor (its queue, its messages, the health it reports); the cycle itself is
//! `cycle.rs`.

mod cycle;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::actors::scratch_commands::{NamedCommand, ScratchRun};
use crate::ports::{
    BuildOutcome, Clock, LandItem, LandMode, MainRef, MainRefError, MergeGit, ProcessRunner,
    RepoError, RepoReader, SystemClock, WarmSlot,
};
use crate::protocol::{
    CheckoutSync, Event, EventKind, FixOf, FromMerging, IntendLanding, IntendedLanding,
    IntentNotJournaled, LandRequest, LandingFailure, MergeHealth, Published, RunId, TaskId,
    ToMergeQueue, ToPlanner, ToReconciler, WorkOrder,
};
use crate::supervision::{Lifeline, StopCause, StopMember};
use cycle::{Cycle, Prebuilt};

/// `[merge]` in flotilla.toml.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MergeConfig {
    /// How a branch becomes commits on main.
    pub mode: LandMode,
    /// Commands a candidate must pass before main moves to it (build, test), run in order
    /// in the gate's warm tree at the candidate (or a scratch checkout). Empty: no gate.
    pub gate: Vec<String>,
    /// Wall-time limit of each gate command.
    pub gate_timeout_secs: u64,
    /// Gate candidates and run sweeps in warm trees: persistent checkouts with a real `.git`
    /// whose build outputs carry over (ADR-042). `false`: a fresh scratch checkout each time.
    pub warm_gate: bool,
    /// The most disk the run's warm trees (the gate's and the sweeps' together) may hold, in
    /// MiB: a tree found over it after a run is thrown away (it starts cold next time).
    pub warm_budget_mb: u64,
    /// Branches landed (and tested) together at most. Left out: [`GATED_BATCH`] with a gate
    /// (a failing batch is bisected, so a small one costs little to blame) and
    /// [`MAX_BATCH`] without one, where nothing is tested and each main move's fixed cost
    /// (the intent's journal write, the compare-and-swap with the user's checkout, its
    /// sync, the branch deletions) is shared by every branch waiting (ADR-041).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_max: Option<usize>,
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
            warm_gate: true,
            warm_budget_mb: 20 * 1024,
            batch_max: None,
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
    #[error("merge.warm_budget_mb = 0: a warm tree needs some disk (or set warm_gate = false)")]
    ZeroWarmBudget,
    #[error("merge.gate has an empty command: leave it out")]
    EmptyCommand,
}

/// A batch's size with a gate when `batch_max` is left out.
pub const GATED_BATCH: usize = 4;
/// The most branches a batch may hold (and its size without a gate when `batch_max` is
/// left out).
pub const MAX_BATCH: usize = 64;

impl MergeConfig {
    /// The most branches one landing cycle takes: `batch_max`, or its default.
    pub fn batch_limit(&self) -> usize {
        self.batch_max.unwrap_or(if self.gate.is_empty() {
            MAX_BATCH
        } else {
            GATED_BATCH
        })
    }

    /// The target branch's name, for people: `main` for a run from before ADR-022.
    pub fn branch_name(&self) -> &str {
        self.branch.as_deref().unwrap_or("main")
    }

    pub fn validate(&self) -> Result<(), MergeConfigError> {
        match self.batch_max {
            Some(0) => return Err(MergeConfigError::ZeroBatch),
            Some(n) if n > MAX_BATCH => return Err(MergeConfigError::BatchTooLarge(n)),
            _ => {}
        }
        if self.gate_timeout_secs == 0 {
            return Err(MergeConfigError::ZeroTimeout);
        }
        if self.warm_gate && self.warm_budget_mb == 0 {
            return Err(MergeConfigError::ZeroWarmBudget);
        }
        if self.gate.iter().any(|c| c.trim().is_empty()) {
            return Err(MergeConfigError::EmptyCommand);
        }
        Ok(())
    }
}

/// How much younger each retry counts a task among its equals (in tasks created).
const RETRY_PENALTY: u64 = 4;
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
    /// `[worktrees] retry_in_place` (ADR-031): a gate-failed attempt's branch stays for
    /// its retry to continue (the run's sweeps remove it if none does).
    pub retry_in_place: bool,
}

/// A branch waiting, with what the queue keeps about it.
#[derive(Debug, Clone)]
struct Queued {
    request: LandRequest,
    enqueued: Instant,
    /// Already had its one retry after a conflict on a main that moved.
    conflict_retried: bool,
}

/// Where a branch waits, smallest first: fix tasks (0), then the rest (1); within each, first
/// tries before a conflict's second try, then [`Urgency::order`] (Dispatch's order, with
/// the retry penalty added to the age); the arrival number keeps keys unique.
type QueueKey = (u8, bool, WorkOrder, u64);

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
    /// The cycle in flight's number (each cycle says it with [`Committing`]).
    cycle: u64,
    /// The next batch, taken from `waiting` and being built (or built) on the candidate
    /// the cycle in flight is moving main to (ADR-041, "the queue pipelined").
    ahead: Option<Ahead>,
    /// The last number given to a batch built ahead.
    ahead_numbers: u64,
}

/// A batch built ahead of its cycle.
struct Ahead {
    /// This batch's own number: a build answers only the batch it was started for. (Numbered
    /// by the cycle, a batch dropped by a withdrawal and a second one started by the same
    /// cycle's retry shared a number, and the first build's late answer was taken for the
    /// second's: a review found it could move main onto a stale candidate.)
    number: u64,
    /// The candidate main is moving to, which the batch is built on.
    base: String,
    /// The branches with the keys they waited under (they go back under them).
    batch: Vec<(QueueKey, Queued)>,
    /// The build's outcome, once there.
    built: Option<Result<BuildOutcome, RepoError>>,
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
            cycle: 0,
            ahead: None,
            ahead_numbers: 0,
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

    /// `second_try`: a conflict's one more try goes behind the first tries of its class.
    fn key(&mut self, request: &LandRequest, second_try: bool) -> QueueKey {
        let class = u8::from(request.fix.is_none());
        let arrival = self.next_position;
        self.next_position = self.next_position.saturating_add(1);
        let mut urgency = request.urgency;
        let penalty = RETRY_PENALTY.saturating_mul(u64::from(request.retries));
        urgency.created = urgency.created.saturating_add(penalty);
        (class, second_try, urgency.order(&request.task), arrival)
    }

    fn health(&self) -> MergeHealth {
        let mut waits = self.waits_ms.clone();
        waits.sort_unstable();
        let ahead = self.ahead.as_ref().map_or(0, |a| a.batch.len());
        MergeHealth {
            queued: self.waiting.len() + ahead + usize::from(self.busy),
            landed: self.landed,
            failed: self.failed,
            median_wait_ms: waits.get(waits.len() / 2).copied().unwrap_or(0),
        }
    }

    /// Starts a landing cycle when none is in flight and a branch waits.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        if self.busy || self.catching_up || self.storage_wait {
            return;
        }
        let prebuilt = match self.ahead.take() {
            // Its build answers, then pumps.
            Some(ahead) if ahead.built.is_none() => {
                self.ahead = Some(ahead);
                return;
            }
            // Built on where main now is (the cycle before landed there): this batch goes
            // next, with what was built; the cycle still checks main's tip before using it.
            Some(Ahead {
                base,
                batch,
                built: Some(Ok(outcome)),
                ..
            }) if self.written.as_deref() == Some(base.as_str()) => {
                let heads = batch
                    .iter()
                    .map(|(_, q)| (q.request.task.clone(), q.request.head.clone()))
                    .collect();
                // Topped up with what arrived since, built on its candidate: a batch
                // still takes what waits, as without building ahead.
                let room = self.kit.config.batch_limit().saturating_sub(batch.len());
                let more: Vec<_> = std::iter::from_fn(|| self.waiting.pop_first())
                    .take(room)
                    .collect();
                let batch: Vec<Queued> = batch.into_iter().chain(more).map(|(_, q)| q).collect();
                Some((
                    batch,
                    Prebuilt {
                        base,
                        heads,
                        outcome,
                    },
                ))
            }
            // main went elsewhere, or the build failed: built again in its turn.
            Some(ahead) => {
                self.waiting.extend(ahead.batch);
                None
            }
            None => None,
        };
        let (batch, prebuilt) = match prebuilt {
            Some((batch, prebuilt)) => (batch, Some(prebuilt)),
            None => {
                if self.waiting.is_empty() {
                    return;
                }
                (
                    self.take_batch().into_iter().map(|(_, q)| q).collect(),
                    None,
                )
            }
        };
        self.busy = true;
        self.cycle = self.cycle.wrapping_add(1);
        let cycle = Cycle {
            written: self.written.clone(),
            dropped: self.dropped.clone(),
            kit: self.kit.clone(),
            graph: self.graph.clone(),
            intents: self.intents.clone(),
            reconciler: self.reconciler.clone(),
            cancel: self.cancel.clone(),
            run: self.run,
            committing: ctx.address().recipient(),
            number: self.cycle,
        };
        ctx.spawn(
            async move { cycle.land(batch, prebuilt).await }
                .into_actor(self)
                .map(|end, act, ctx| {
                    act.busy = false;
                    if let Some(tip) = end.written.clone() {
                        act.written = Some(tip);
                    }
                    let diverged = end.diverged.clone();
                    let first_task = end.requeue.first().map(|q| q.request.task.clone());
                    let landed_some = !end.landed.is_empty();
                    if !end.requeue.is_empty() {
                        // What goes back may be more urgent than the batch built ahead,
                        // which was taken after it: both wait in their order again.
                        act.drop_ahead();
                    }
                    for queued in end.requeue {
                        // Back in its place by urgency; a conflict's second try goes behind
                        // the first tries.
                        let key = act.key(&queued.request, queued.conflict_retried);
                        act.waiting.insert(key, queued);
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
                        act.drop_ahead();
                        return;
                    }
                    act.diverged = None;
                    if let Some(error) = end.storage {
                        act.drop_ahead();
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

    /// Up to a batch's worth of what waits, most urgent first, with their keys.
    fn take_batch(&mut self) -> Vec<(QueueKey, Queued)> {
        let limit = self.kit.config.batch_limit();
        let mut batch = Vec::new();
        while batch.len() < limit {
            let Some(entry) = self.waiting.pop_first() else {
                break;
            };
            batch.push(entry);
        }
        batch
    }

    /// The cycle in flight is about to move main to `base` (after its gate, before its
    /// intent is journaled): the next batch is built on `base` meanwhile, off the actor.
    /// Only the build: its gate, intent and compare-and-swap wait for its own cycle, after
    /// this one's end, so main still moves one batch at a time and the journal's order of
    /// events is as without it.
    fn build_ahead(&mut self, cycle: u64, base: String, ctx: &mut Context<Self>) {
        if !self.busy
            || cycle != self.cycle
            || self.ahead.is_some()
            || self.catching_up
            || self.storage_wait
            || self.waiting.is_empty()
        {
            return;
        }
        let batch = self.take_batch();
        let lands = batch
            .iter()
            .map(|(_, q)| cycle::land_item(self.run, &q.request))
            .collect();
        self.ahead_numbers = self.ahead_numbers.wrapping_add(1);
        let number = self.ahead_numbers;
        let building = self
            .kit
            .git
            .build(base.clone(), lands, self.kit.config.mode);
        self.ahead = Some(Ahead {
            number,
            base,
            batch,
            built: None,
        });
        ctx.spawn(building.into_actor(self).map(move |built, act, ctx| {
            let Some(ahead) = act.ahead.as_mut().filter(|a| a.number == number) else {
                return; // discarded meanwhile: its branches are back in the queue
            };
            ahead.built = Some(built);
            act.pump(ctx);
        }));
    }

    /// The batch built ahead goes back to the queue, under its keys; a build still running
    /// is not waited for.
    fn drop_ahead(&mut self) {
        if let Some(ahead) = self.ahead.take() {
            self.waiting.extend(ahead.batch);
        }
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
}

/// How long the queue first waits for storage that refused a scratch checkout, and at most
/// (doubling in between); the supervisor pauses the run meanwhile when it hears of it.
const STORAGE_WAIT_FIRST: Duration = Duration::from_secs(1);
const STORAGE_WAIT_MAX: Duration = Duration::from_secs(60);

/// The line every commit landed for a task carries, for people reading main's history.
/// flotilla never reads it back (ADR-018): agents can write such lines too, and those are
/// stripped from every message flotilla writes to main.
pub fn trailer(run: RunId, request: &LandRequest) -> String {
    format!("Flotilla-Task: {}/{}", run, request.task)
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
                let ahead = self.ahead.iter().flat_map(|a| a.batch.iter());
                if self
                    .waiting
                    .values()
                    .chain(ahead.map(|(_, q)| q))
                    .any(|q| q.request.task == request.task)
                {
                    return;
                }
                let key = self.key(&request, false);
                self.waiting.insert(
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
                let ahead = self.ahead.iter().flat_map(|a| a.batch.iter());
                if ahead.map(|(_, q)| q).any(|q| q.request.task == task) {
                    // Not landed with the rest: they are built again without it.
                    self.drop_ahead();
                }
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

/// From the cycle in flight (its number): main is about to move to `base`.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Committing {
    pub(super) cycle: u64,
    pub(super) base: String,
}

impl Handler<Committing> for MergeQueue {
    type Result = ();

    fn handle(&mut self, msg: Committing, ctx: &mut Context<Self>) {
        self.build_ahead(msg.cycle, msg.base, ctx);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_max_left_out_is_four_with_a_gate_and_the_most_without() {
        let ungated = MergeConfig::default();
        assert_eq!(ungated.batch_limit(), MAX_BATCH);
        let gated = MergeConfig {
            gate: vec!["make test".into()],
            ..MergeConfig::default()
        };
        assert_eq!(gated.batch_limit(), GATED_BATCH);
        let given = MergeConfig {
            batch_max: Some(1),
            ..MergeConfig::default()
        };
        assert_eq!(given.batch_limit(), 1);
        assert_eq!(
            MergeConfig {
                batch_max: Some(0),
                ..MergeConfig::default()
            }
            .validate(),
            Err(MergeConfigError::ZeroBatch)
        );
        assert_eq!(
            MergeConfig {
                batch_max: Some(65),
                ..MergeConfig::default()
            }
            .validate(),
            Err(MergeConfigError::BatchTooLarge(65))
        );
        // Left out, it stays out of the journaled config; an older run's number still reads.
        let text = serde_json::to_value(&ungated).unwrap();
        assert!(text.get("batch_max").is_none(), "{text}");
        let old: MergeConfig = serde_json::from_str(r#"{"batch_max": 4}"#).unwrap();
        assert_eq!(old.batch_limit(), 4);
    }
}
