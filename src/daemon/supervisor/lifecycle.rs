//! A run's life in the Supervisor: its start from the journal (new, restarted, resumed at
//! the daemon's start), its restart when a member died, its pause while the journal refuses
//! writes, its failure, and its end; and the handlers that drive them (start, damage,
//! member stopped, cancel, decisions, live notices). How the actors are built is
//! `wiring.rs`'s; what becomes of a finished run's thread is `retire.rs`'s. It must not
//! decide task states (the replayed `RunGraph` does) or block its thread.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use actix::prelude::*;
use flotilla_actors::actors;
use flotilla_actors::graph::RunGraph;
use flotilla_actors::ports::{Journal, Transcripts};
use flotilla_actors::protocol::{Event, EventKind, Published, RunId, RunOutcome, ToTaskGraph};
use flotilla_actors::recovery::run_recovery;
use flotilla_actors::supervision::StopCause;
use tracing::{error, info, warn};

use super::wiring;
use super::{
    AdoptMain, CancelAnswer, CancelRun, DecideTask, GetRunMembers, Life, MemberStopped, RunDamaged,
    RunEntry, RunMembers, RunProblem, RunProblems, StartError, StartRun, Supervisor,
};
use crate::config::RunConfig;

/// First wait before retrying a run whose journal could not be written; doubles up to
/// [`JOURNAL_RETRY_MAX`].
const JOURNAL_RETRY_FIRST: Duration = Duration::from_millis(500);
const JOURNAL_RETRY_MAX: Duration = Duration::from_secs(30);
/// Wait before restarting a run whose member died: enough to let its old actors go.
const RESTART_DELAY: Duration = Duration::from_millis(50);

impl Supervisor {
    /// Replays `journal` and starts the run's actors. Marks the run damaged if the journal
    /// does not replay.
    fn start_members(
        &mut self,
        run: RunId,
        journal: &[Event],
        ctx: &mut Context<Self>,
    ) -> Result<(), StartError> {
        let Some(entry) = self.runs.get_mut(&run) else {
            return Err(StartError::Unknown(run));
        };
        let config = entry.config.clone();
        let impossible = config
            .validate()
            .and_then(|()| Ok(config.target_branch()?))
            .map_err(StartError::Config);
        let target = match impossible {
            Ok(target) => target,
            Err(reason) => {
                entry.problem = Some(RunProblem::Damaged(reason.to_string()));
                entry.life = Life::Damaged;
                if let Some(thread) = entry.thread.take() {
                    thread.stop();
                }
                return Err(reason);
            }
        };
        let graph_state = match RunGraph::new(config.limits.clone())
            .merging()
            .replayed(journal.iter().map(|e| &e.kind))
        {
            Ok(graph) => graph,
            Err(e) => {
                let reason = StartError::Replay(e);
                error!(%run, %reason, "run damaged");
                entry.problem = Some(RunProblem::Damaged(reason.to_string()));
                entry.life = Life::Damaged;
                if let Some(thread) = entry.thread.take() {
                    thread.stop();
                }
                return Err(reason);
            }
        };
        if graph_state.outcome().is_some() {
            if let Some(thread) = self.runs.remove(&run).and_then(|e| e.thread) {
                thread.stop();
            }
            return Ok(());
        }
        let recovered = run_recovery(run, &graph_state, journal, self.clock.now_ms());
        entry.restarts = recovered.restarts;
        let pauses = recovered.provider_pauses.clone();
        // The run's actors all start on the run's own thread (ADR-014).
        let thread = entry.thread.get_or_insert_with(Arbiter::new).handle();
        entry.generation += 1;
        let generation = entry.generation;
        let recovering = recovered.resume.is_some();
        let (request, repo) = (entry.request.clone(), entry.repo.clone());
        let daemon = wiring::Daemon {
            journal: self.journal_port.clone(),
            providers: &self.providers,
            worktrees: &self.worktrees,
            daemon_paths: &self.daemon_paths,
            mark: self.mark.as_ref(),
            notices: ctx.address().recipient(),
            transcripts: self
                .transcripts
                .as_ref()
                .map_or_else(Transcripts::none, |t| t.transcripts()),
        };
        let to_start = wiring::Run {
            run,
            request,
            repo: &repo,
            config: &config,
            target,
            graph: graph_state,
            recovered,
        };
        let members = wiring::start_run(daemon, to_start, &thread, |member| {
            self.lifeline(run, generation, member, ctx)
        })?;
        self.resume_journaled_pauses(run, pauses, ctx);
        info!(%run, recovering, generation, "run started");
        if let Some(entry) = self.runs.get_mut(&run) {
            entry.life_read_upto = journal.last().map_or(0, |e| e.seq);
            entry.life = Life::Live(members);
        }
        self.cancel_between_lives(run);
        Ok(())
    }

    /// A cancel journaled while the run had no actors reaches a life that read its journal
    /// before it (a restart's read raced the append); a life that read it carries it out
    /// itself (`RunGraph::carry_out_journaled_cancel`).
    fn cancel_between_lives(&mut self, run: RunId) {
        let Some(entry) = self.runs.get(&run) else {
            return;
        };
        let (Some((seq, reason)), Life::Live(members)) = (&entry.cancel_journaled, &entry.life)
        else {
            return;
        };
        if entry.life_read_upto < *seq {
            members.task_graph.do_send(actors::CancelRun {
                reason: reason.clone(),
            });
        }
    }

    /// Reads the run's journal again and starts it from there (or journals its failure).
    pub(super) fn restart(&mut self, run: RunId, ctx: &mut Context<Self>) {
        let Some(entry) = self.runs.get(&run) else {
            return;
        };
        // A timer of an earlier pause may fire after another one restarted the run: one
        // life at a time.
        if !matches!(entry.life, Life::Restarting) {
            return;
        }
        if let Some(reason) = entry.failing.clone() {
            self.journal_failure(run, reason, ctx);
            return;
        }
        let read = self.journal.read(run, 0);
        ctx.spawn(
            read.into_actor(self)
                .map(move |result, act, ctx| match result {
                    Ok(events) => {
                        if let Err(e) = act.start_members(run, &events, ctx) {
                            warn!(%run, error = %e, "cannot restart the run");
                        }
                    }
                    Err(e) => {
                        act.retry_later(run, format!("the journal could not be read: {e}"), ctx)
                    }
                }),
        );
    }

    /// The journal refused a write (or a read): say so, and try again later.
    fn retry_later(&mut self, run: RunId, problem: String, ctx: &mut Context<Self>) {
        let Some(entry) = self.runs.get_mut(&run) else {
            return;
        };
        entry.life = Life::Restarting;
        let delay = JOURNAL_RETRY_FIRST
            .saturating_mul(1u32 << entry.journal_retries.min(16))
            .min(JOURNAL_RETRY_MAX);
        entry.journal_retries = entry.journal_retries.saturating_add(1);
        warn!(%run, %problem, retry_in_ms = delay.as_millis() as u64, "run paused");
        entry.problem = Some(RunProblem::Paused(problem.clone()));
        self.notice(run, EventKind::JournalUnavailable { error: problem });
        ctx.run_later(delay, move |act, ctx| act.restart(run, ctx));
    }

    /// Ends the run `Failed` with `reason`, once the journal takes it.
    fn journal_failure(&mut self, run: RunId, reason: String, ctx: &mut Context<Self>) {
        if let Some(entry) = self.runs.get_mut(&run) {
            entry.failing = Some(reason.clone());
            entry.life = Life::Restarting;
        }
        let finished = EventKind::RunFinished {
            outcome: RunOutcome::Failed,
            reason: Some(reason),
        };
        self.record(run, finished, ctx, |_, _| {});
    }

    /// Journals one of the supervisor's own records for `run`, publishes it and then runs
    /// `then`; a journal that refuses it pauses the run (`retry_later`) instead.
    pub(super) fn record(
        &mut self,
        run: RunId,
        kind: EventKind,
        ctx: &mut Context<Self>,
        then: impl FnOnce(&mut Self, &mut Context<Self>) + 'static,
    ) {
        let append = self.journal.append(run, vec![kind]);
        ctx.spawn(
            append
                .into_actor(self)
                .map(move |result, act, ctx| match result {
                    Ok(events) => {
                        for event in events {
                            act.publish(event, ctx);
                        }
                        then(act, ctx);
                    }
                    Err(e) => {
                        act.retry_later(run, format!("the journal could not be written: {e}"), ctx)
                    }
                }),
        );
    }

    /// A journaled event on its way to the streams; a finished run's actors are stopped.
    fn publish(&mut self, event: Event, ctx: &mut Context<Self>) {
        if let EventKind::RunFinished { outcome, .. } = &event.kind {
            info!(run = %event.run, ?outcome, "run finished");
            if let Some(entry) = self.runs.remove(&event.run) {
                self.retire(event.run, entry, ctx);
            }
        } else if event.seq > 0
            && let Some(entry) = self.runs.get_mut(&event.run)
        {
            // An append went through: whatever kept the journal from being written is over.
            // (A notice, seq 0, was not appended: it proves nothing.)
            if matches!(entry.life, Life::Live(_)) && entry.journal_retries > 0 {
                entry.journal_retries = 0;
                entry.problem = None;
            }
            // Work went through the storage again (a delivery needs a worktree, a landing
            // its gate's scratch): the next refusal waits from the start again.
            if matches!(
                event.kind,
                EventKind::TaskCompleted { .. }
                    | EventKind::TaskLanding { .. }
                    | EventKind::MainMoved { .. }
            ) {
                entry.storage_pauses = 0;
            }
        }
        // No subscriber is not an error: nobody is tailing.
        let _ = self.hub.send(event);
    }
}

impl Handler<StartRun> for Supervisor {
    type Result = Result<(), StartError>;

    fn handle(&mut self, msg: StartRun, ctx: &mut Context<Self>) -> Self::Result {
        let StartRun {
            run,
            request,
            repo,
            config,
            journal,
        } = msg;
        if let Some(Life::Live(_)) = self.runs.get(&run).map(|e| &e.life) {
            return Err(StartError::AlreadyLive(run));
        }
        self.runs.insert(
            run,
            RunEntry {
                request,
                repo,
                config,
                generation: 0,
                life: Life::Restarting,
                restarts: 0,
                journal_retries: 0,
                storage_pauses: 0,
                problem: None,
                failing: None,
                cancel_journaled: None,
                life_read_upto: 0,
                thread: None,
                provider_pauses: HashMap::new(),
            },
        );
        self.start_members(run, &journal, ctx)
    }
}

impl Handler<RunDamaged> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: RunDamaged, _: &mut Context<Self>) {
        error!(run = %msg.run, reason = %msg.reason, "run damaged");
        self.runs.insert(
            msg.run,
            RunEntry {
                request: String::new(),
                repo: PathBuf::new(),
                config: RunConfig::default(),
                generation: 0,
                problem: Some(RunProblem::Damaged(msg.reason.clone())),
                life: Life::Damaged,
                restarts: 0,
                journal_retries: 0,
                storage_pauses: 0,
                failing: None,
                cancel_journaled: None,
                life_read_upto: 0,
                thread: None,
                provider_pauses: HashMap::new(),
            },
        );
    }
}

impl Handler<MemberStopped> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: MemberStopped, ctx: &mut Context<Self>) {
        if self.member_of_retiring_stopped(&msg) {
            return; // its run is over
        }
        let run = msg.run;
        let max_restarts = {
            let Some(entry) = self.runs.get_mut(&run) else {
                return;
            };
            if entry.generation != msg.generation {
                return; // an actor of an earlier life, stopped on purpose
            }
            let Life::Live(members) = &entry.life else {
                return;
            };
            // The others must not act on a run whose actors no longer agree.
            members.stop_all();
            entry.life = Life::Restarting;
            entry.config.limits.max_run_restarts
        };
        warn!(%run, member = ?msg.member, cause = %msg.cause, "a run actor stopped");
        match msg.cause {
            StopCause::JournalUnwritable(e) => {
                self.retry_later(run, format!("the journal could not be written: {e}"), ctx)
            }
            cause => {
                let Some(entry) = self.runs.get_mut(&run) else {
                    return;
                };
                let restart = entry.restarts.saturating_add(1);
                let reason = format!("the run's {:?} actor {cause}", msg.member);
                if restart > max_restarts {
                    let reason = format!(
                        "{reason}; the run was already restarted {} times (max_run_restarts = {max_restarts})",
                        entry.restarts
                    );
                    self.journal_failure(run, reason, ctx);
                    return;
                }
                entry.problem = Some(RunProblem::Restarting(reason.clone()));
                let restarted = EventKind::RunRestarted { restart, reason };
                self.record(run, restarted, ctx, move |_, ctx| {
                    ctx.run_later(RESTART_DELAY, move |act, ctx| act.restart(run, ctx));
                });
            }
        }
    }
}

impl Handler<CancelRun> for Supervisor {
    type Result = ResponseActFuture<Self, CancelAnswer>;

    fn handle(&mut self, msg: CancelRun, _: &mut Context<Self>) -> Self::Result {
        let Some(entry) = self.runs.get(&msg.run) else {
            return Box::pin(fut::ready(CancelAnswer::NotLive));
        };
        match &entry.life {
            Life::Live(members) => {
                let asked = members
                    .task_graph
                    .send(actors::CancelRun { reason: msg.reason });
                Box::pin(asked.into_actor(self).map(|answer, _, _| match answer {
                    Ok(Ok(())) => CancelAnswer::Journaled,
                    Ok(Err(e)) => CancelAnswer::Unavailable(e.to_string()),
                    Err(_) => CancelAnswer::Unavailable(
                        "the run's task graph stopped; it is being restarted".into(),
                    ),
                }))
            }
            Life::Restarting if entry.failing.is_some() => {
                Box::pin(fut::ready(CancelAnswer::Unavailable(
                    "the run is ending (failed); its end is being journaled".into(),
                )))
            }
            Life::Restarting if entry.cancel_journaled.is_some() => {
                Box::pin(fut::ready(CancelAnswer::Journaled))
            }
            Life::Restarting => {
                // No actors to ask (paused, or between two lives): the cancel is journaled
                // here, and the run's next life carries it out; a run paused for refused
                // storage gets that next life at its pause's next look (pauses.rs).
                let run = msg.run;
                let reason = msg.reason;
                let request = EventKind::RunCancelRequested {
                    reason: reason.clone(),
                };
                // Through the actors' port, as a live cancel is journaled (a fault there
                // refuses it the same way).
                let append = self.journal_port.append(run, vec![request]);
                Box::pin(
                    append
                        .into_actor(self)
                        .map(move |result, act, ctx| match result {
                            Ok(events) => {
                                let seq = events.last().map_or(0, |e| e.seq);
                                for event in events {
                                    act.publish(event, ctx);
                                }
                                if let Some(entry) = act.runs.get_mut(&run) {
                                    entry.cancel_journaled = Some((seq, reason));
                                }
                                act.cancel_between_lives(run);
                                CancelAnswer::Journaled
                            }
                            Err(e) => CancelAnswer::Unavailable(format!(
                                "the journal could not be written: {e}"
                            )),
                        }),
                )
            }
            Life::Damaged => {
                // A damaged run has no actors: its end is journaled directly.
                let run = msg.run;
                let append = self.journal.append(
                    run,
                    vec![EventKind::RunFinished {
                        outcome: RunOutcome::Cancelled,
                        reason: Some(msg.reason),
                    }],
                );
                Box::pin(
                    append
                        .into_actor(self)
                        .map(move |result, act, ctx| match result {
                            Ok(events) => {
                                for event in events {
                                    act.publish(event, ctx);
                                }
                                CancelAnswer::Journaled
                            }
                            Err(e) => CancelAnswer::Unavailable(format!(
                                "the journal could not be written: {e}"
                            )),
                        }),
                )
            }
        }
    }
}

impl Handler<RunProblems> for Supervisor {
    type Result = MessageResult<RunProblems>;

    fn handle(&mut self, _: RunProblems, _: &mut Context<Self>) -> Self::Result {
        MessageResult(
            self.runs
                .iter()
                .filter_map(|(run, e)| e.problem.clone().map(|p| (*run, p)))
                .collect(),
        )
    }
}

impl Handler<GetRunMembers> for Supervisor {
    type Result = Option<RunMembers>;

    fn handle(&mut self, GetRunMembers(run): GetRunMembers, _: &mut Context<Self>) -> Self::Result {
        match self.runs.get(&run).map(|e| &e.life) {
            Some(Life::Live(members)) => Some(members.clone()),
            _ => None,
        }
    }
}

impl Handler<Published> for Supervisor {
    type Result = ();

    fn handle(&mut self, Published(event): Published, ctx: &mut Context<Self>) {
        if let (0, EventKind::ProviderPaused { .. }) = (event.seq, &event.kind)
            && self.journal_provider_pause(&event, ctx)
        {
            return; // said by the journaled event
        }
        if let (0, EventKind::StorageUnavailable { error, .. }) = (event.seq, &event.kind) {
            self.storage_pause(event.run, error.clone(), ctx);
        }
        self.publish(event, ctx);
    }
}

impl Handler<DecideTask> for Supervisor {
    type Result = bool;

    fn handle(&mut self, msg: DecideTask, _: &mut Context<Self>) -> bool {
        match self.runs.get(&msg.run).map(|e| &e.life) {
            Some(Life::Live(members)) => {
                members.task_graph.do_send(ToTaskGraph::UserDecision {
                    task: msg.task,
                    decision: msg.decision,
                });
                true
            }
            _ => false,
        }
    }
}

impl Handler<AdoptMain> for Supervisor {
    type Result = bool;

    fn handle(&mut self, msg: AdoptMain, _: &mut Context<Self>) -> bool {
        match self.runs.get(&msg.run).map(|e| &e.life) {
            Some(Life::Live(members)) => {
                members.task_graph.do_send(ToTaskGraph::AdoptMain);
                true
            }
            _ => false,
        }
    }
}
