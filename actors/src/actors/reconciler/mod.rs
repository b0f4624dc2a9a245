//! The Reconciler actor (M6, ADR-011): keeps main green by sweeping it and asking for fix
//! tasks. It never writes code or main; it only reports (`FromMerging::Swept`), and the
//! TaskGraph makes the fix tasks.
//!
//! A sweep runs the configured build, typecheck and test commands on main's tip in a
//! scratch checkout, plus a scan for conflict markers. Failures are parsed and grouped
//! deterministically (`crate::failures`); only the highest class found produces fixes, at
//! most `max_fix_tasks_per_sweep` of them. Sweeps never overlap; a sweep whose main moved
//! while it ran is discarded as stale (and main is swept again).
//!
//! With a `reconciler` role in `[roles]`, its model words the fix tasks (`wording.rs`,
//! ADR-032) inside the sweep's future, never on the actor's thread; flotilla's deterministic
//! wording is kept when it fails or answers garbage, and whenever no role is configured.
//!
//! When: every `interval_secs` (5 min), every `red_interval_secs` (1 min) while red, back to
//! the slow interval after `green_streak` (3) green sweeps in a row; `debounce_secs` after
//! main moved; at once for a finalization round. Timers only, no polling.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::warn;

mod wording;

pub use wording::{FixWriter, WordingError, parse_answer, request_text};

use super::scratch_commands::{NamedCommand, ScratchRun};
use crate::failures::{self, CommandKind, Failure};
use crate::ports::{MergeGit, ProcessRunner, RepoReader, WarmSlot};
use crate::protocol::{FromMerging, RunId, SweepFix, SweepReport, ToReconciler, WordingCall};
use crate::supervision::{Lifeline, StopCause, StopMember};

/// `[reconciler]` in flotilla.toml.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReconcilerConfig {
    /// Shell lines run on main's tip by each sweep; any may be left out.
    pub build: Option<String>,
    pub typecheck: Option<String>,
    pub test: Option<String>,
    /// Wall-time limit of each command.
    pub timeout_secs: u64,
    /// Between sweeps while main is green.
    pub interval_secs: u64,
    /// Between sweeps while main is red (and until `green_streak` green sweeps).
    pub red_interval_secs: u64,
    pub green_streak: u32,
    /// How long after main moved a sweep starts (moves within it share one sweep).
    pub debounce_secs: u64,
}

impl Default for ReconcilerConfig {
    fn default() -> Self {
        ReconcilerConfig {
            build: None,
            typecheck: None,
            test: None,
            timeout_secs: 600,
            interval_secs: 300,
            red_interval_secs: 60,
            green_streak: 3,
            debounce_secs: 5,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReconcilerConfigError {
    #[error("reconciler.{0} = 0: it must be at least 1")]
    Zero(&'static str),
    #[error("reconciler.{0} is empty: leave it out to run no such command")]
    EmptyCommand(&'static str),
}

impl ReconcilerConfig {
    pub fn validate(&self) -> Result<(), ReconcilerConfigError> {
        for (field, value) in [
            ("timeout_secs", self.timeout_secs),
            ("interval_secs", self.interval_secs),
            ("red_interval_secs", self.red_interval_secs),
            ("green_streak", u64::from(self.green_streak)),
        ] {
            if value == 0 {
                return Err(ReconcilerConfigError::Zero(field));
            }
        }
        for (field, command) in [
            ("build", &self.build),
            ("typecheck", &self.typecheck),
            ("test", &self.test),
        ] {
            if command.as_deref().is_some_and(|c| c.trim().is_empty()) {
                return Err(ReconcilerConfigError::EmptyCommand(field));
            }
        }
        Ok(())
    }

    fn commands(&self) -> Vec<(CommandKind, NamedCommand)> {
        [
            (CommandKind::Build, "build", &self.build),
            (CommandKind::Typecheck, "typecheck", &self.typecheck),
            (CommandKind::Test, "test", &self.test),
        ]
        .into_iter()
        .filter_map(|(kind, name, line)| {
            line.clone().map(|line| {
                (
                    kind,
                    NamedCommand {
                        name: name.into(),
                        line,
                    },
                )
            })
        })
        .collect()
    }
}

/// What the Reconciler needs of the world.
#[derive(Clone)]
pub struct ReconcilerKit {
    pub git: Arc<dyn MergeGit>,
    pub reader: Arc<dyn RepoReader>,
    pub runner: Arc<dyn ProcessRunner>,
    pub config: ReconcilerConfig,
    /// Fix tasks one sweep asks for at most.
    pub max_fixes: usize,
}

pub struct Reconciler {
    run: RunId,
    kit: ReconcilerKit,
    graph: Recipient<FromMerging>,
    /// A sweep is in flight.
    sweeping: bool,
    /// A sweep was asked for while one ran: one more follows it.
    again: bool,
    /// A finalization round waits for the next sweep that is not stale.
    finalization: Option<u32>,
    /// The commit that round asked for: what the run last landed. It is swept as it is,
    /// never found stale: another run moving main on top of it says nothing about it.
    pinned: Option<String>,
    sweeps: u32,
    /// Red since the last green streak.
    red: bool,
    green_in_a_row: u32,
    /// The interval timer's generation: a newer schedule supersedes older timers.
    timer: u64,
    /// A debounce timer after main moved is pending.
    debouncing: bool,
    cancel: CancellationToken,
    lifeline: Option<Lifeline>,
    /// The `reconciler` role's model, which words the fix tasks; none: flotilla does.
    writer: Option<FixWriter>,
}

impl Reconciler {
    pub fn new(run: RunId, kit: ReconcilerKit, graph: Recipient<FromMerging>) -> Self {
        Reconciler {
            run,
            kit,
            graph,
            sweeping: false,
            again: false,
            finalization: None,
            pinned: None,
            sweeps: 0,
            red: false,
            green_in_a_row: 0,
            timer: 0,
            debouncing: false,
            cancel: CancellationToken::new(),
            lifeline: None,
            writer: None,
        }
    }

    /// Fix tasks are worded by this model (the `reconciler` role's), flotilla's wording the
    /// fallback (ADR-032).
    pub fn with_writer(mut self, writer: FixWriter) -> Self {
        self.writer = Some(writer);
        self
    }

    pub fn watched(mut self, lifeline: Lifeline) -> Self {
        self.lifeline = Some(lifeline);
        self
    }

    /// The wait before the next scheduled sweep: short while red or not yet green long
    /// enough, long otherwise.
    pub fn interval(&self) -> Duration {
        let c = &self.kit.config;
        if self.red {
            Duration::from_secs(c.red_interval_secs)
        } else {
            Duration::from_secs(c.interval_secs)
        }
    }

    fn schedule(&mut self, ctx: &mut Context<Self>) {
        let wait = self.interval();
        self.schedule_in(wait, ctx);
    }

    fn schedule_in(&mut self, wait: Duration, ctx: &mut Context<Self>) {
        self.timer += 1;
        let generation = self.timer;
        ctx.notify_later(ToReconciler::Tick { generation }, wait);
    }

    fn sweep(&mut self, ctx: &mut Context<Self>) {
        if self.sweeping {
            self.again = true;
            return;
        }
        // The pending interval timer is superseded: the next one is set when this sweep
        // ends, so a tick cannot ask for a second sweep of the same tip.
        self.timer += 1;
        self.sweeping = true;
        self.sweeps = self.sweeps.saturating_add(1);
        let sweep = Sweep {
            pinned: self.finalization.and(self.pinned.clone()),
            number: self.sweeps,
            kit: self.kit.clone(),
            cancel: self.cancel.clone(),
            run: self.run,
            writer: self.writer.clone(),
        };
        ctx.spawn(
            async move { sweep.run().await }
                .into_actor(self)
                .map(|outcome, act, ctx| {
                    act.sweeping = false;
                    match outcome {
                        SweepOutcome::Done(mut report) => {
                            if report.green {
                                act.green_in_a_row = act.green_in_a_row.saturating_add(1);
                                if act.green_in_a_row >= act.kit.config.green_streak {
                                    act.red = false;
                                }
                            } else {
                                act.red = true;
                                act.green_in_a_row = 0;
                            }
                            // Only a sweep of the commit the round asked for answers it.
                            if act.pinned.as_deref().is_none_or(|p| p == report.commit) {
                                report.finalization = act.finalization.take();
                                act.pinned = None;
                            } else if act.finalization.is_some() {
                                act.again = true;
                            }
                            act.graph.do_send(FromMerging::Swept(Box::new(report)));
                        }
                        SweepOutcome::Stale { sweep, commit } => {
                            act.graph.do_send(FromMerging::SweepStale { sweep, commit });
                            act.again = true;
                        }
                        SweepOutcome::Unreadable(e) => {
                            warn!(run = %act.run, error = %e, "a sweep could not read main");
                        }
                    }
                    // A finalization round waits for a sweep: after one that could not
                    // read main, try again soon rather than after the green interval.
                    let wait = if act.finalization.is_some() {
                        act.interval()
                            .min(Duration::from_secs(act.kit.config.red_interval_secs))
                    } else {
                        act.interval()
                    };
                    act.schedule_in(wait, ctx);
                    if std::mem::take(&mut act.again) {
                        act.sweep(ctx);
                    }
                }),
        );
    }
}

enum SweepOutcome {
    Done(SweepReport),
    Stale { sweep: u32, commit: String },
    Unreadable(String),
}

/// One sweep's world, off the actor's thread.
struct Sweep {
    /// Sweep this commit (a finalization's), not main's tip, and never call it stale.
    pinned: Option<String>,
    number: u32,
    kit: ReconcilerKit,
    cancel: CancellationToken,
    run: RunId,
    writer: Option<FixWriter>,
}

impl Sweep {
    async fn run(self) -> SweepOutcome {
        let started = Instant::now();
        let commit = match &self.pinned {
            Some(commit) => commit.clone(),
            None => match self.kit.reader.main_tip().await {
                Ok(tip) => tip,
                Err(e) => return SweepOutcome::Unreadable(e.to_string()),
            },
        };
        let mut found: Vec<Failure> = Vec::new();
        match self.kit.git.conflict_markers(commit.clone(), None).await {
            Ok(hits) => {
                let hits: Vec<(String, u32)> = hits.into_iter().map(|h| (h.path, h.line)).collect();
                found.extend(failures::markers_failures(&hits));
            }
            Err(e) => return SweepOutcome::Unreadable(e.to_string()),
        }
        let commands = self.kit.config.commands();
        if !commands.is_empty() {
            let scratch = ScratchRun {
                git: self.kit.git.clone(),
                runner: self.kit.runner.clone(),
                timeout: Duration::from_secs(self.kit.config.timeout_secs),
                stop_at_first_failure: false,
                slot: WarmSlot::Sweep,
            };
            let kinds: Vec<CommandKind> = commands.iter().map(|(k, _)| *k).collect();
            let named = commands.into_iter().map(|(_, c)| c).collect();
            let label = format!("sweep-{}-{}", self.run.short(), self.number);
            match scratch
                .run(commit.clone(), label, named, self.cancel.clone())
                .await
            {
                Ok(results) => {
                    for (kind, result) in kinds.into_iter().zip(results) {
                        if result.timed_out {
                            found.extend(failures::timed_out(
                                kind,
                                &result.line,
                                self.kit.config.timeout_secs,
                                &result.output,
                                Some(&result.dir),
                            ));
                        } else if !result.passed {
                            found.extend(failures::parse_output_in(
                                kind,
                                &result.output,
                                Some(&result.dir),
                            ));
                        }
                    }
                }
                // A scratch checkout flotilla's storage refused is not a red main either:
                // nothing is reported, and a later sweep tries again.
                Err(e) => {
                    return SweepOutcome::Unreadable(format!("making a scratch checkout: {e}"));
                }
            }
        }
        let groups = failures::classify_and_group(&found, self.kit.max_fixes);
        let class = groups.first().map(|g| g.class.to_string());
        let mut fixes: Vec<SweepFix> = groups
            .iter()
            .map(|g| SweepFix {
                title: g.title.clone(),
                description: failures::describe(g),
                scope: g.scope.clone(),
                signature: g.signature.clone(),
                class: g.class.to_string(),
                worded: None,
            })
            .collect();
        let wording = match &self.writer {
            Some(writer) if !fixes.is_empty() => {
                let (words, usage) = writer.word(&commit, &fixes, self.cancel.clone()).await;
                let fallback = match words {
                    Ok(words) => {
                        for (fix, words) in fixes.iter_mut().zip(words) {
                            fix.worded = Some(words);
                        }
                        None
                    }
                    Err(e) => {
                        warn!(run = %self.run, error = %e, "the fix tasks keep flotilla's wording");
                        Some(e.to_string())
                    }
                };
                Some(WordingCall { usage, fallback })
            }
            _ => None,
        };
        // main moved while the commands (or the model) ran: what they found may already be fixed. A
        // pinned commit is what it is, wherever main went.
        match self.kit.reader.main_tip().await {
            _ if self.pinned.is_some() => {}
            Ok(now) if now != commit => {
                return SweepOutcome::Stale {
                    sweep: self.number,
                    commit,
                };
            }
            Ok(_) => {}
            Err(e) => return SweepOutcome::Unreadable(e.to_string()),
        }
        SweepOutcome::Done(SweepReport {
            sweep: self.number,
            commit,
            green: found.is_empty(),
            class,
            failures: found.len(),
            fixes,
            duration_ms: started.elapsed().as_millis() as u64,
            finalization: None,
            wording,
        })
    }
}

impl Actor for Reconciler {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.schedule(ctx);
    }

    fn stopping(&mut self, _: &mut Context<Self>) -> Running {
        self.cancel.cancel();
        Running::Stop
    }
}

impl Handler<ToReconciler> for Reconciler {
    type Result = ();

    fn handle(&mut self, msg: ToReconciler, ctx: &mut Context<Self>) {
        match msg {
            ToReconciler::MainMoved { .. } => {
                if !self.debouncing {
                    self.debouncing = true;
                    let wait = Duration::from_secs(self.kit.config.debounce_secs);
                    ctx.run_later(wait, |act, ctx| {
                        act.debouncing = false;
                        act.sweep(ctx);
                    });
                }
            }
            ToReconciler::Finalize { attempt, commit } => {
                self.finalization = Some(attempt);
                self.pinned = commit;
                self.sweep(ctx);
            }
            ToReconciler::Tick { generation } => {
                if generation == self.timer {
                    self.sweep(ctx);
                }
            }
        }
    }
}

impl Handler<StopMember> for Reconciler {
    type Result = ();

    fn handle(&mut self, _: StopMember, ctx: &mut Context<Self>) {
        if let Some(lifeline) = &mut self.lifeline {
            lifeline.set_cause(StopCause::Finished);
        }
        ctx.stop();
    }
}
