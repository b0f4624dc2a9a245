//! The Worker actor: runs ONE attempt of one task through the `Agent` port, in the attempt's
//! own git worktree, reports, and ends. The run's
//! [`WorkerPool`](super::worker_pool::WorkerPool) starts one per attempt (and one per
//! synthesis) and watches it through a [`Lifeline`]: a panic in one agent call kills only
//! its own Worker, and the pool turns that into a failed attempt.
//!
//! The attempt, in order:
//! 1. `TaskStarted`; the attempt's worktree is made from main's tip on the branch flotilla
//!    named (`Worktrees::prepare`; a synthesis reopens its parent's).
//! 2. An agent session is opened on it (`Agent::open`) and runs the assignment, bounded by
//!    the wall time the task has left (the assignment's budget: the graph subtracts what
//!    earlier attempts spent). Spend the agent reports while it works goes to the TaskGraph
//!    as `SpendReported`.
//! 3. Git truth (`work_check`): whatever the agent left uncommitted is committed
//!    (`Worktrees::seal`), the run's verification command runs on it, and the handoff is
//!    built from git's files and lines and the agent's own words. Edits outside the scope
//!    fail the attempt (or are flagged, by the run's `[checks]`). With `[reviewer]` on, the
//!    reviewer then reads delivered work (`review.rs`, ADR-038): only approved work goes on.
//! 4. The report becomes a `TaskCompleted` carrying the task id and attempt *it* was given
//!    (the agent never names ids). A report with a subplan keeps the Worker and its session
//!    alive for the decision: a rejection asks the same session to revise, in the same
//!    worktree; an acceptance ends the attempt and leaves the worktree for the synthesis.
//! 5. When the Worker stops, the worktree goes: its branch stays when it holds delivered
//!    work, and is deleted when the attempt failed or was called off.
//!
//! Cancel, timeout and stop all go through one cancellation token that the agent honours.
//! The Worker charges the agent's time: when an agent call (run, revise, synthesis) ends,
//! whether with a report, a failure, a timeout or a cancel, it reports the call's elapsed
//! wall time as `SpendReported { spent: Budget { wall_time_ms, .. } }` *before* the report or
//! failure, so the TaskGraph charges it first (a task whose time is used up is not retried).
//! Agents report tokens and money; wall time is measured here, on tokio's clock.
//!
//! Called off, the agent gets [`CALL_OFF_GRACE`]. Wall time is charged for each agent call
//! before its outcome. [`WorkerKit`] is what a run's Workers share (agent, worktrees, process
//! runner, checks).

pub mod check;
mod in_place;
pub mod review;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::future::BoxFuture;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::ports::{
    ActivityReporter, Agent, AgentError, AgentReport, AgentSession, AttemptContext, BranchFate,
    Clock, CommandSpec, ProcessRunner, RepoError, SpendReporter, SystemClock, TranscriptSink,
    Transcripts, Workspace, WorktreeRequest, Worktrees,
};
use crate::protocol::{
    Assignment, AttemptFailure, Budget, Event, EventKind, Finding, HandoffStatus, Published, RunId,
    SubtasksCompleted, TaskCompleted, TaskId, ToAgent, ToTaskGraph, commit_subject,
};
use crate::supervision::{Lifeline, StopCause, StopMember};
use check::{Checks, check_work, tail};
use review::{ReviewStep, Reviewer, reviewable};

/// How long an agent that was called off (cancel, timeout) gets to stop what it started
/// before the Worker stops waiting for it.
pub const CALL_OFF_GRACE: Duration = Duration::from_secs(5);

/// The longest making (or reopening) a worktree may take.
pub const PREPARE_LIMIT: Duration = Duration::from_secs(300);

/// How long an attempt first waits when flotilla's storage refuses to make its worktree,
/// and at most (doubling in between).
pub const STORAGE_RETRY_FIRST: Duration = Duration::from_secs(1);
pub const STORAGE_RETRY_MAX: Duration = Duration::from_secs(60);

type ReleaseResult = Result<(), RepoError>;

/// What a Worker was started for.
#[derive(Debug, Clone)]
pub enum Job {
    /// Work on an assignment (one attempt).
    Run(Assignment),
    /// Merge the results of a decomposed task's subtasks, on the parent's branch.
    Synthesize {
        run: RunId,
        done: SubtasksCompleted,
        branch: String,
    },
}

/// The agents of a run, by worker profile: one run can mix agent kinds.
#[derive(Clone)]
pub struct AgentSet {
    default: Arc<dyn Agent>,
    by_profile: HashMap<String, Arc<dyn Agent>>,
}

impl AgentSet {
    /// One agent for every profile.
    pub fn one(agent: Arc<dyn Agent>) -> Self {
        AgentSet {
            default: agent,
            by_profile: HashMap::new(),
        }
    }

    /// `agent` serves `profile`; other profiles keep the default.
    pub fn with(mut self, profile: impl Into<String>, agent: Arc<dyn Agent>) -> Self {
        self.by_profile.insert(profile.into(), agent);
        self
    }

    pub fn for_profile(&self, profile: &str) -> Arc<dyn Agent> {
        self.by_profile
            .get(profile)
            .unwrap_or(&self.default)
            .clone()
    }
}

/// What every Worker of a run shares.
#[derive(Clone)]
pub struct WorkerKit {
    pub agents: AgentSet,
    pub worktrees: Arc<dyn Worktrees>,
    /// Runs the verification command.
    pub runner: Arc<dyn ProcessRunner>,
    pub checks: Arc<Checks>,
    /// Where agents' activity goes as live notices (the run's supervisor), if anywhere.
    pub notices: Option<Recipient<Published>>,
    /// `[worktrees] keep_failed`: a failed attempt's worktree and branch stay for
    /// inspection (the run's sweeps keep them; `flotilla gc` removes them).
    pub keep_failed: bool,
    /// `[worktrees] retry_in_place`: a retry continues the failed attempt's branch
    /// (ADR-031), which the attempt therefore keeps.
    pub retry_in_place: bool,
    /// Where each attempt's transcript goes (`flotilla log`), if anywhere.
    pub transcripts: Transcripts,
    /// The run's reviewer (ADR-038), when `[reviewer] enabled`: delivered work lands only
    /// after it approved. `None`: no review, no reviewer call.
    pub reviewer: Option<Arc<Reviewer>>,
}

/// The least time between two activity notices of one attempt: an external agent may
/// report dozens of steps a second, and the live line only needs the latest.
pub const ACTIVITY_EVERY: Duration = Duration::from_millis(250);

/// What becomes of the worktree when the Worker stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterAttempt {
    /// Removed; the branch stays or goes.
    Release(BranchFate),
    /// Left as it is: for the synthesis of the accepted subplan, or, with
    /// `keep_failed`, for someone to look at a failed attempt (until `flotilla gc`).
    Keep,
}

/// An agent call's outcome, after git truth.
struct Finished {
    report: AgentReport,
    out_of_scope: Vec<String>,
    links_outside: Vec<String>,
    /// The workspace is as the seal found it: nothing (no verification) ran in it since.
    as_sealed: bool,
}

pub struct Worker {
    kit: WorkerKit,
    graph: Recipient<ToTaskGraph>,
    job: Job,
    /// For activity notices.
    run: RunId,
    task: TaskId,
    attempt: u32,
    /// The worker profile: which agent does the work.
    profile: String,
    branch: String,
    scope: Vec<String>,
    /// The first line of the commit flotilla makes of what the agent left uncommitted.
    subject: String,
    limit: Duration,
    workspace: Option<Workspace>,
    /// Nothing ran in the workspace since its last seal, which began after every command
    /// before it returned: its release may trust the seal's walk (ADR-046).
    as_sealed: bool,
    session: Option<Box<dyn AgentSession>>,
    after: AfterAttempt,
    cancel: CancellationToken,
    in_flight: Option<SpawnHandle>,
    /// When the agent call in flight started; taken when its time is charged.
    call_started: Option<Instant>,
    /// Agent time this attempt's calls used so far: a revision gets what the first call
    /// left of `limit`, not a fresh `limit`.
    used: Duration,
    /// Cancelled: the agent's answer, when it comes, is not reported.
    called_off: bool,
    /// Times in a row the worktree could not be made for want of storage.
    storage_retries: u32,
    lifeline: Option<Lifeline>,
    /// The attempt's transcript; ended when the Worker stops.
    transcript: TranscriptSink,
}

impl Worker {
    /// `limit` bounds the agent calls of the attempt together (a revision gets what the
    /// earlier calls left).
    pub fn new(kit: WorkerKit, graph: Recipient<ToTaskGraph>, job: Job, limit: Duration) -> Self {
        let (task, attempt, profile, branch, scope, subject) = match &job {
            Job::Run(a) => (
                a.task.task.clone(),
                a.task.attempt,
                a.profile.clone(),
                a.branch.clone(),
                a.task.spec.scope.clone(),
                commit_subject(&a.task.task, &a.task.spec.description),
            ),
            Job::Synthesize { done, branch, .. } => (
                done.parent.clone(),
                done.attempt,
                done.profile.clone(),
                branch.clone(),
                done.scope.clone(),
                format!("{}: merge the results of its subtasks", done.parent),
            ),
        };
        let run = match &job {
            Job::Run(a) => a.run,
            Job::Synthesize { run, .. } => *run,
        };
        let transcript = kit.transcripts.open(run, &task, attempt);
        Worker {
            transcript,
            kit,
            graph,
            run,
            job,
            task,
            attempt,
            profile,
            branch,
            scope,
            subject,
            limit,
            workspace: None,
            as_sealed: false,
            session: None,
            after: AfterAttempt::Release(BranchFate::Delete),
            cancel: CancellationToken::new(),
            in_flight: None,
            call_started: None,
            used: Duration::ZERO,
            called_off: false,
            storage_retries: 0,
            lifeline: None,
        }
    }

    /// Reports to the watcher when this Worker ends, however it ends.
    pub fn watched(mut self, lifeline: Lifeline) -> Self {
        self.lifeline = Some(lifeline);
        self
    }

    fn activity(&self) -> ActivityReporter {
        let Some(notices) = self.kit.notices.clone() else {
            return ActivityReporter::none();
        };
        let run = self.run;
        let (task, attempt) = (self.task.clone(), self.attempt);
        let last_sent = std::sync::Mutex::new(None::<std::time::Instant>);
        ActivityReporter::new(move |activity| {
            let now = std::time::Instant::now();
            let Ok(mut last) = last_sent.lock() else {
                return;
            };
            if last.is_some_and(|at| now.duration_since(at) < ACTIVITY_EVERY) {
                return;
            }
            *last = Some(now);
            notices.do_send(Published(Event {
                seq: 0,
                run,
                at_ms: SystemClock.now_ms(),
                kind: EventKind::AgentActivity {
                    task: task.clone(),
                    attempt,
                    activity,
                },
            }));
        })
    }

    fn context(&self) -> AttemptContext {
        let graph = self.graph.clone();
        let (task, attempt) = (self.task.clone(), self.attempt);
        AttemptContext {
            activity: self.activity(),
            transcript: self.transcript.clone(),
            cancel: self.cancel.clone(),
            spend: SpendReporter::new(move |spent| {
                graph.do_send(ToTaskGraph::SpendReported {
                    task: task.clone(),
                    attempt,
                    spent,
                })
            }),
        }
    }

    /// Charges the wall time of the agent call that just ended (once per call; nothing for a
    /// call that took no measurable time).
    fn charge_time(&mut self) {
        let Some(started) = self.call_started.take() else {
            return;
        };
        let elapsed = started.elapsed();
        self.used = self.used.saturating_add(elapsed);
        let elapsed = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        if elapsed > 0 {
            self.graph.do_send(ToTaskGraph::SpendReported {
                task: self.task.clone(),
                attempt: self.attempt,
                spent: Budget {
                    wall_time_ms: elapsed,
                    ..Budget::default()
                },
            });
        }
    }

    /// Makes (or reopens) the worktree, then opens the session and starts the job's first
    /// call in it.
    fn prepare(&mut self, ctx: &mut Context<Self>) {
        let request = WorktreeRequest {
            task: self.task.clone(),
            attempt: self.attempt,
            branch: self.branch.clone(),
            start: in_place::worktree_start(&self.job, self.kit.retry_in_place),
        };
        let prepare = self.kit.worktrees.prepare(request);
        let bounded = async move {
            match tokio::time::timeout(PREPARE_LIMIT, prepare).await {
                Ok(Err(RepoError::Storage(detail))) => Err(Err(detail)),
                Ok(result) => result.map_err(|e| Ok(e.to_string())),
                Err(_) => Err(Ok(format!(
                    "making the worktree took longer than {} s",
                    PREPARE_LIMIT.as_secs()
                ))),
            }
        };
        let handle = ctx.spawn(bounded.into_actor(self).map(|result, act, ctx| {
            act.in_flight = None;
            let workspace = match result {
                Ok(mut workspace) => {
                    let (in_place, keep) = (act.kit.retry_in_place, act.kit.keep_failed);
                    in_place::started(&mut act.job, &mut workspace, in_place, keep);
                    workspace
                }
                // flotilla's own storage failed (disk full, read-only): not the task's
                // doing. The attempt waits, says so, and tries again (ADR-021).
                Err(Err(detail)) => {
                    if act.called_off {
                        act.finish(ctx);
                        return;
                    }
                    act.storage_paused(detail, ctx);
                    return;
                }
                Err(Ok(detail)) => {
                    if !act.called_off {
                        act.graph.do_send(ToTaskGraph::TaskFailed {
                            task: act.task.clone(),
                            attempt: act.attempt,
                            failure: AttemptFailure::Workspace { detail },
                        });
                    }
                    act.finish(ctx);
                    return;
                }
            };
            act.workspace = Some(workspace.clone());
            if act.called_off {
                act.finish(ctx);
                return;
            }
            let agent = act.kit.agents.for_profile(&act.profile);
            let mut session = agent.open(workspace, act.context());
            let call = match &act.job {
                Job::Run(assignment) => session.run(assignment.clone()),
                Job::Synthesize { done, .. } => {
                    session.synthesize(done.parent.clone(), done.results.clone())
                }
            };
            act.session = Some(session);
            act.drive(call, ctx);
        }));
        self.in_flight = Some(handle);
    }

    /// The worktree could not be made because flotilla's storage refused a write: a live
    /// notice and a log line, then `prepare` again after a backoff (doubling up to
    /// [`STORAGE_RETRY_MAX`]), until the storage takes writes again or the attempt is
    /// called off. Nothing is charged to the task.
    fn storage_paused(&mut self, detail: String, ctx: &mut Context<Self>) {
        let delay = STORAGE_RETRY_FIRST
            .saturating_mul(1u32 << self.storage_retries.min(16))
            .min(STORAGE_RETRY_MAX);
        self.storage_retries = self.storage_retries.saturating_add(1);
        warn!(
            run = %self.run, task = %self.task, attempt = self.attempt, %detail,
            retry_in_ms = delay.as_millis() as u64,
            "flotilla's storage refused a write: the attempt waits"
        );
        if let Some(notices) = &self.kit.notices {
            notices.do_send(Published(Event {
                seq: 0,
                run: self.run,
                at_ms: SystemClock.now_ms(),
                kind: EventKind::StorageUnavailable {
                    task: self.task.clone(),
                    error: detail,
                },
            }));
        }
        ctx.run_later(delay, |act, ctx| act.prepare(ctx));
    }

    /// After an agent call: commits what it left, reads the branch, runs the verification
    /// command and builds the handoff from git truth. A report without a handoff (a subplan
    /// only) is sealed too, so that its partial work is on the branch for the synthesis.
    fn git_truth(
        &self,
    ) -> impl FnOnce(AgentReport) -> BoxFuture<'static, Result<Finished, AttemptFailure>> + use<>
    {
        let worktrees = self.kit.worktrees.clone();
        let runner = self.kit.runner.clone();
        let checks = self.kit.checks.clone();
        let workspace = self.workspace.clone();
        let scope = self.scope.clone();
        let subject = self.subject.clone();
        let cancel = self.cancel.clone();
        move |mut report: AgentReport| {
            Box::pin(async move {
                let Some(workspace) = workspace else {
                    return Err(AttemptFailure::Workspace {
                        detail: "the attempt has no worktree".into(),
                    });
                };
                let path = workspace.path.clone();
                let work = worktrees.seal(workspace, subject).await.map_err(|e| {
                    AttemptFailure::Workspace {
                        detail: format!("reading the branch: {e}"),
                    }
                })?;
                let Some(handoff) = report.handoff.take() else {
                    return Ok(Finished {
                        report,
                        out_of_scope: Vec::new(),
                        links_outside: Vec::new(),
                        as_sealed: true,
                    });
                };
                let mut checked = check_work(handoff, work, &scope, &checks);
                // With a subplan the worktree stays for the synthesis: whatever a build
                // leaves in it would be committed then. The synthesis verifies the whole.
                let verify = checks
                    .config
                    .verify
                    .clone()
                    .filter(|_| report.subplan.is_none());
                let as_sealed = verify.is_none();
                if let Some(command) = verify {
                    let mut spec = CommandSpec::shell(command.clone(), path);
                    spec.limits.wall = Duration::from_secs(checks.config.verify_timeout_secs);
                    let (exit_code, failure) = match runner.run(spec, cancel, None).await {
                        Ok(out) if out.exit.success() => (out.exit.code(), None),
                        Ok(out) => {
                            let both = format!("{}{}", out.stdout.text, out.stderr.text);
                            (out.exit.code(), Some((out.exit.to_string(), tail(&both))))
                        }
                        Err(e) => (None, Some((e.to_string(), String::new()))),
                    };
                    checked.handoff.build_exit_code = exit_code;
                    if let Some((exit, output_tail)) = failure {
                        checked.handoff.findings.push(Finding::VerificationFailed {
                            command,
                            exit,
                            output_tail,
                        });
                    }
                }
                report.handoff = Some(checked.handoff);
                Ok(Finished {
                    report,
                    out_of_scope: checked.out_of_scope,
                    links_outside: checked.links_outside,
                    as_sealed,
                })
            })
        }
    }

    /// The review step of this job's attempts (ADR-038), when the run has a reviewer and
    /// the job is work (a synthesis merges subtasks whose work each was reviewed).
    fn review_step(&self) -> Option<ReviewStep> {
        let reviewer = self.kit.reviewer.clone().filter(|r| r.config.enabled)?;
        let Job::Run(assignment) = &self.job else {
            return None;
        };
        Some(ReviewStep {
            reviewer,
            spec: assignment.task.spec.clone(),
            worktrees: self.kit.worktrees.clone(),
            workspace: self.workspace.clone()?,
            graph: self.graph.clone(),
            task: self.task.clone(),
            attempt: self.attempt,
            cancel: self.cancel.clone(),
            transcript: self.transcript.clone(),
        })
    }

    /// Runs one agent call, then git truth, and reports the outcome, after the time it took.
    fn drive(
        &mut self,
        call: BoxFuture<'static, Result<AgentReport, AgentError>>,
        ctx: &mut Context<Self>,
    ) {
        // A call replaced before it ended still used the agent's time.
        self.charge_time();
        self.as_sealed = false;
        self.call_started = Some(Instant::now());
        let limit = self
            .limit
            .saturating_sub(self.used)
            .max(Duration::from_millis(1));
        let cancel = self.cancel.clone();
        let whole_limit = self.limit;
        let git_truth = self.git_truth();
        let review = self.review_step();
        let work = async move {
            let report = call.await.map_err(|e| failure_of(e, whole_limit))?;
            let finished = git_truth(report).await?;
            let failing = !finished.out_of_scope.is_empty() || !finished.links_outside.is_empty();
            if let (Some(review), Some((handoff, work))) =
                (review, reviewable(&finished.report, failing))
            {
                review.run(handoff, work).await?;
            }
            Ok(finished)
        };
        let bounded = async move {
            let mut work = std::pin::pin!(work);
            tokio::select! {
                result = &mut work => result,
                _ = tokio::time::sleep(limit) => {
                    // Call the agent off and give it a moment to stop what it started;
                    // its answer no longer matters.
                    cancel.cancel();
                    let _ = tokio::time::timeout(CALL_OFF_GRACE, work).await;
                    Err(failure_of(AgentError::Timeout, whole_limit))
                }
            }
        };
        let handle = ctx.spawn(bounded.into_actor(self).map(|result, act, ctx| {
            act.in_flight = None;
            act.charge_time();
            if act.called_off {
                act.finish(ctx);
                return;
            }
            act.report(result, ctx);
        }));
        if let Some(previous) = self.in_flight.replace(handle) {
            ctx.cancel_future(previous);
        }
    }

    /// Tells the TaskGraph how the call ended and decides what becomes of the worktree. A
    /// worktree the attempt is done with is released *before* the TaskGraph hears: once a
    /// run can end, none of its delivered work still sits in a worktree that a sweep would
    /// take for an interrupted attempt's.
    fn report(&mut self, result: Result<Finished, AttemptFailure>, ctx: &mut Context<Self>) {
        let (task, attempt) = (self.task.clone(), self.attempt);
        let failed = |failure| ToTaskGraph::TaskFailed {
            task: task.clone(),
            attempt,
            failure,
        };
        self.as_sealed = matches!(&result, Ok(finished) if finished.as_sealed);
        let (message, proposes) = match result {
            Err(failure) => {
                self.after = self.after_failure(failure.continues_in_place());
                (failed(failure), false)
            }
            Ok(finished) if !finished.out_of_scope.is_empty() => {
                self.after = self.after_failure(true);
                (
                    failed(AttemptFailure::OutOfScope {
                        paths: finished.out_of_scope,
                    }),
                    false,
                )
            }
            Ok(finished) if !finished.links_outside.is_empty() => {
                self.after = self.after_failure(true);
                (
                    failed(AttemptFailure::LinksOutside {
                        paths: finished.links_outside,
                    }),
                    false,
                )
            }
            Ok(Finished { report, .. }) => {
                let delivered = report.handoff.as_ref().is_some_and(|h| {
                    matches!(h.status, HandoffStatus::Complete | HandoffStatus::Partial)
                });
                let proposes = report.subplan.is_some();
                // A delivery without commits has nothing to land: its branch would only be
                // left behind (ADR-021).
                let changed = report
                    .handoff
                    .as_ref()
                    .and_then(|h| h.work.as_ref())
                    .is_none_or(|w| w.head != w.base);
                self.after = if proposes {
                    AfterAttempt::Keep
                } else if delivered && changed {
                    AfterAttempt::Release(BranchFate::Keep)
                } else if delivered {
                    AfterAttempt::Release(BranchFate::Delete)
                } else {
                    self.after_failure(true)
                };
                let message = ToTaskGraph::TaskCompleted(Box::new(TaskCompleted {
                    task: task.clone(),
                    attempt,
                    handoff: report.handoff,
                    artifacts: report.artifacts,
                    subplan: report.subplan,
                }));
                (message, proposes)
            }
        };
        if proposes {
            // The worktree stays for a revision or the synthesis; the decision comes back.
            self.graph.do_send(message);
            return;
        }
        let AfterAttempt::Release(fate) = self.after else {
            // A failed attempt kept for inspection: nothing to release.
            self.graph.do_send(message);
            return self.finish(ctx);
        };
        let release = self
            .workspace
            .take()
            .map(|workspace| (workspace.path.clone(), self.release(workspace, fate)));
        let released = async move {
            if let Some((path, release)) = release
                && let Err(e) = release.await
            {
                // The run's sweep (at its end, or at a restart) removes what is left.
                warn!(workspace = %path.display(), error = %e, "cannot remove an attempt's worktree");
            }
        };
        let handle = ctx.spawn(released.into_actor(self).map(move |(), act, ctx| {
            act.in_flight = None;
            if !act.called_off {
                act.graph.do_send(message);
            }
            act.finish(ctx);
        }));
        self.in_flight = Some(handle);
    }

    /// Releases the workspace; sealed when nothing ran in it since its last seal.
    fn release(&self, workspace: Workspace, fate: BranchFate) -> BoxFuture<'static, ReleaseResult> {
        match self.as_sealed {
            true => self.kit.worktrees.release_sealed(workspace, fate),
            false => self.kit.worktrees.release(workspace, fate),
        }
    }

    /// What a failed attempt leaves: nothing, (`keep_failed`) its worktree and branch, or
    /// (`retry_in_place`, a failure its retry may continue from) its branch.
    fn after_failure(&self, continuable: bool) -> AfterAttempt {
        if self.kit.keep_failed {
            AfterAttempt::Keep
        } else if continuable && self.kit.retry_in_place {
            AfterAttempt::Release(BranchFate::Keep)
        } else {
            AfterAttempt::Release(BranchFate::Delete)
        }
    }

    fn finish(&mut self, ctx: &mut Context<Self>) {
        if let Some(lifeline) = &mut self.lifeline {
            lifeline.set_cause(StopCause::Finished);
        }
        ctx.stop();
    }
}

/// The typed failure the TaskGraph sees: it retries a crash or a timeout, not a budget stop
/// or an agent that cannot start.
fn failure_of(error: AgentError, limit: Duration) -> AttemptFailure {
    match error {
        AgentError::Crashed(detail) => AttemptFailure::Crashed { detail },
        AgentError::Malformed(detail) => AttemptFailure::Malformed { detail },
        AgentError::Timeout => AttemptFailure::TimedOut {
            limit_ms: u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
        },
        AgentError::Cancelled => AttemptFailure::Cancelled,
        AgentError::CannotStart(detail) => AttemptFailure::CannotStart { detail },
    }
}

impl Actor for Worker {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if matches!(self.job, Job::Run(_)) {
            self.graph.do_send(ToTaskGraph::TaskStarted {
                task: self.task.clone(),
                attempt: self.attempt,
            });
        }
        self.prepare(ctx);
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        // Whatever the agent started ends with the attempt, and the time it took is charged
        // (a call cut short by a cancel's grace or a stop ends here).
        self.cancel.cancel();
        self.charge_time();
        self.session = None;
        self.transcript.end();
        let (Some(workspace), AfterAttempt::Release(fate)) = (self.workspace.take(), self.after)
        else {
            return;
        };
        let release = self.release(workspace.clone(), fate);
        actix::spawn(async move {
            if let Err(e) = release.await {
                // The run's sweep (at its end, or at a restart) removes what is left.
                warn!(workspace = %workspace.path.display(), error = %e, "cannot remove an attempt's worktree");
            }
        });
    }
}

impl Handler<ToAgent> for Worker {
    type Result = ();

    fn handle(&mut self, msg: ToAgent, ctx: &mut Context<Self>) {
        match msg {
            ToAgent::DecompositionAccepted(accepted) => {
                debug!(parent = %accepted.parent, subtasks = accepted.subtasks.len(), "subplan accepted; attempt done");
                self.after = AfterAttempt::Keep;
                self.finish(ctx);
            }
            ToAgent::DecompositionRejected(rejected) => match (&self.job, &mut self.session) {
                (Job::Run(assignment), Some(session)) => {
                    let call = session.revise(assignment.clone(), rejected.reason);
                    self.drive(call, ctx);
                }
                _ => warn!(task = %self.task, "a rejection reached a worker with no proposal"),
            },
            ToAgent::SubtasksCompleted(_) => {
                warn!(task = %self.task, "a synthesis reached a running worker; the pool starts those");
            }
            ToAgent::Cancel { task, reason } => {
                debug!(%task, %reason, "attempt called off");
                // The agent hears it through its token and gets a moment to stop; nothing
                // it answers is reported (the TaskGraph already settled the task).
                self.cancel.cancel();
                self.called_off = true;
                self.after = AfterAttempt::Release(BranchFate::Delete);
                if self.in_flight.is_none() {
                    self.finish(ctx);
                } else {
                    ctx.run_later(CALL_OFF_GRACE, |act, ctx| act.finish(ctx));
                }
            }
            ToAgent::Assign(a) => {
                warn!(task = %a.task.task, "an assignment reached a running worker; the pool routes those");
            }
            ToAgent::SubtaskEnded(_) | ToAgent::Resume(_) | ToAgent::DecompositionClosed { .. } => {
                warn!(task = %self.task, "a Subplanner message reached a worker");
            }
        }
    }
}

impl Handler<StopMember> for Worker {
    type Result = ();

    fn handle(&mut self, _: StopMember, ctx: &mut Context<Self>) {
        // A run stopping (to restart from its journal, or for good) decides nothing about
        // the task: the branch this attempt continued stays for the one after (ADR-031).
        if let Some(workspace) = &mut self.workspace {
            workspace.continued_from = None;
        }
        self.cancel.cancel();
        self.finish(ctx);
    }
}
