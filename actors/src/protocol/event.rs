//! The run-level event. Every state change of a run is one `EventKind`; the journal stores
//! them (it assigns `seq` and `at_ms`), the in-memory task graph is a fold over them, the API
//! streams them and `flotilla tail` prints them. One type for all four, so they cannot drift.
//! Why a task failed is `super::failure`. A notice that is not journaled (`JournalUnavailable`,
//! `LlmProgress`) has seq 0.

use serde::{Deserialize, Serialize};

use super::failure::{AttemptFailure, FailureReason};
use super::handoff::{ArtifactRef, Finding, Handoff, Usage};
use super::ids::{RunId, TaskId};
use super::merge::{CheckoutSync, FixOf, IntendedLanding, SweepReport};
use super::review::ReviewVerdict;
use super::subplan::{DecompositionReason, RejectionReason, StopCondition};
use super::task::{Budget, TaskSpec, TaskState};
use super::tools::{ToolRound, ToolRun};
use super::work::{Role, Route};

/// A journaled event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Monotonic per journal; the SSE `id:`.
    pub seq: u64,
    pub run: RunId,
    /// Milliseconds since the Unix epoch, from the journal's clock.
    pub at_ms: u64,
    #[serde(flatten)]
    pub kind: EventKind,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "data", rename_all = "snake_case")]
pub enum EventKind {
    RunStarted {
        request: String,
        /// The sandbox every command of the run is in (ADR-015), as the daemon found it at
        /// submit; absent in journals written before sandboxes were reported.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sandbox: Option<String>,
    },
    /// One root-planner LLM call, recorded before its tasks are submitted, so that recovery
    /// rebuilds the conversation instead of asking again. `error` is set when the answer
    /// could not be used (its tasks, if any, were not submitted).
    PlannerResponded {
        call: u32,
        prompt: String,
        content: String,
        usage: Usage,
        error: Option<String>,
    },
    /// One round of a planner's (or the Subplanner's) read-only tools within a call, before
    /// the call's answer: a resumed call replays it instead of reading again (ADR-037).
    ToolsRan {
        tools: ToolRound,
    },
    /// The planner stopped after too many consecutive errors; the run will fail.
    PlannerGaveUp {
        error: String,
    },
    /// A task entered the graph. `spec` is normalized; `depends_on` are resolved ids.
    TaskAdded {
        task: TaskId,
        spec: TaskSpec,
        budget: Budget,
        depends_on: Vec<TaskId>,
    },
    /// A planner batch was refused as a whole; nothing was inserted.
    TasksRejected {
        reason: RejectionReason,
    },
    TaskReady {
        task: TaskId,
    },
    TaskDispatched {
        task: TaskId,
        attempt: u32,
        profile: String,
        route: Route,
    },
    TaskStarted {
        task: TaskId,
        attempt: u32,
    },
    /// The attempt failed and the task goes back to Ready as attempt `attempt + 1`.
    /// `findings` are those of the failed handoff (a failed verification): with `failure`
    /// they are what the retry is told (`PreviousAttempt`, ADR-031).
    TaskRetried {
        task: TaskId,
        attempt: u32,
        failure: AttemptFailure,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        findings: Vec<Finding>,
    },
    /// The daemon stopped while the attempt was in flight; the task goes back to Ready as
    /// attempt `attempt + 1` without being charged a retry.
    TaskInterrupted {
        task: TaskId,
        attempt: u32,
    },
    /// The run's reviewer read attempt `attempt`'s sealed work (ADR-038): approved (it goes
    /// on to land), changes requested (the attempt fails and its retry is told the
    /// comments), or no usable verdict (the attempt fails). `calls` model calls, costing
    /// `usage` (charged to the task as the attempt's spend).
    ReviewVerdict {
        task: TaskId,
        attempt: u32,
        review: ReviewVerdict,
        calls: u32,
        usage: Usage,
    },
    TaskCompleted {
        task: TaskId,
        attempt: u32,
        handoff: Option<Handoff>,
        artifacts: Vec<ArtifactRef>,
    },
    TaskFailed {
        task: TaskId,
        attempt: u32,
        reason: FailureReason,
    },
    TaskCancelled {
        task: TaskId,
        was: TaskState,
        reason: String,
    },
    /// The parent's subplan was inserted (its `TaskAdded` events precede this one); the
    /// parent now waits for them.
    DecompositionAccepted {
        parent: TaskId,
        attempt: u32,
        reason: DecompositionReason,
        stop_when: StopCondition,
        subtasks: Vec<TaskId>,
        /// Partial work delivered together with the proposal.
        handoff: Option<Handoff>,
        artifacts: Vec<ArtifactRef>,
        /// The Subplanner's decomposition (ADR-008): open for more batches
        /// (`SubtasksAdded`) until `DecompositionClosed`; a subtask's failure does not fail
        /// the parent, and the parent's result is the subtasks' aggregate. `false` for an
        /// agent's subplan (and in journals written before M4).
        #[serde(default)]
        subplanner: bool,
    },
    /// A further batch of the Subplanner's open decomposition was inserted (its `TaskAdded`
    /// events precede this one).
    SubtasksAdded {
        parent: TaskId,
        attempt: u32,
        subtasks: Vec<TaskId>,
    },
    /// The Subplanner will add no more subtasks to `parent`: it said the work is done, or
    /// it reached its iteration or error cap (`reason`). The parent's result is aggregated
    /// once every subtask has ended.
    DecompositionClosed {
        parent: TaskId,
        attempt: u32,
        reason: String,
    },
    /// One Subplanner LLM call about `task`, recorded before anything is done with its
    /// answer, so that recovery rebuilds the conversation instead of asking again. Its usage
    /// is charged to the task and the run here, once. `reported` are the subtasks whose
    /// handoffs the prompt carried; `error` is set when the answer could not be used.
    SubplannerResponded {
        task: TaskId,
        attempt: u32,
        call: u32,
        prompt: String,
        content: String,
        usage: Usage,
        #[serde(default)]
        reported: Vec<TaskId>,
        error: Option<String>,
    },
    /// The Subplanner found the task atomic (its first answer had no subtasks, or it could
    /// not produce a valid one): the task goes back to Ready as attempt `attempt + 1`, for a
    /// worker, without being charged a retry.
    TaskAtomic {
        task: TaskId,
        attempt: u32,
        reason: String,
    },
    DecompositionRejected {
        parent: TaskId,
        attempt: u32,
        reason: RejectionReason,
    },
    /// The task's attempt proposed too many rejected subplans (`max_subplan_rejections`, or
    /// past `max_proposals_per_attempt`): its agent is stopped, and the task completes with
    /// the last report's handoff if it was usable, or fails with `ProposalLoop` (that event
    /// follows).
    ProposalsStopped {
        task: TaskId,
        attempt: u32,
        rejections: u32,
    },
    /// The stop condition holds; the parent's agent is synthesizing.
    SubtasksCompleted {
        parent: TaskId,
    },
    /// A human must decide (`flotilla decide` sends a `UserDecision`): every subtask of
    /// `parent` ended under `StopCondition::UserDecision`, or `parent` is a `Landing` task
    /// whose work changes flotilla's own configuration and is held until the user lets it
    /// land (`LandingAllowed`) or fails it (ADR-016).
    AwaitingUserDecision {
        parent: TaskId,
    },
    /// The user let a held `Landing` task's work go to the merge queue.
    LandingAllowed {
        task: TaskId,
    },
    /// The task's work is done and its branch waits in the merge queue (M6): the task is
    /// `Landing`, and becomes `Completed` (its dependents ready) only once the branch is on
    /// main (`TaskLanded`). Carries what `TaskCompleted` would.
    TaskLanding {
        task: TaskId,
        attempt: u32,
        handoff: Option<Handoff>,
        artifacts: Vec<ArtifactRef>,
        branch: String,
        head: String,
    },
    /// The task's work is on main, in `commit` (through the conflict fix `via`, when its own
    /// branch conflicted): the task is `Completed`.
    TaskLanded {
        task: TaskId,
        commit: String,
        #[serde(default)]
        via: Option<TaskId>,
    },
    /// flotilla made a fix task (`f<n>`) itself: a conflict fix, or a fix for a red main.
    FixTaskAdded {
        task: TaskId,
        spec: TaskSpec,
        budget: Budget,
        fix: FixOf,
    },
    /// The merge queue could not build `task`'s branch on main: it conflicts in `files`
    /// with main's `clashing` commits. `retrying`: main moved since the branch left it,
    /// and it gets one more try later in the queue; otherwise a conflict fix follows (or
    /// the task fails, as its `TaskFailed` says).
    MergeConflict {
        task: TaskId,
        files: Vec<String>,
        clashing: Vec<String>,
        retrying: bool,
    },
    /// The merge gate failed on a candidate built from `tasks`. `bisecting`: the batch is
    /// split to find the culprit; `flaky_retry`: the same candidate is tested once more
    /// before anyone is blamed.
    MergeGateFailed {
        tasks: Vec<TaskId>,
        command: String,
        output_tail: String,
        #[serde(default)]
        bisecting: bool,
        #[serde(default)]
        flaky_retry: bool,
    },
    /// main moved from `from` to `to` with the work of `tasks` (their `TaskLanded` follow).
    /// `checkout`: what became of the target repository's own checkout of main.
    MainMoved {
        from: String,
        to: String,
        tasks: Vec<TaskId>,
        checkout: CheckoutSync,
    },
    /// Written ahead of the compare-and-swap that moves main from `from` to `to` (ADR-018):
    /// the commit flotilla built for each task's work. After a crash, work is recognized as
    /// landed only from these commits found on main's first-parent history, never from the
    /// `Flotilla-Task` trailer text of a commit (an agent can write that).
    LandingIntended {
        from: String,
        to: String,
        landed: Vec<IntendedLanding>,
    },
    /// `task`'s conflict fix `fix` completed without landing anything (it had nothing to
    /// resolve: the branch it clashed with had not landed yet when the fix started). The
    /// task's own branch goes back to the merge queue; it stays `Landing`.
    LandingRequeued {
        task: TaskId,
        fix: TaskId,
    },
    /// main no longer contains `expected`, the tip flotilla last moved it to: someone reset
    /// it, force-pushed, or moved it with `update-ref` (ADR-018). The merge queue stops
    /// landing (it never replays what was dropped) until main contains `expected` again;
    /// its branches wait.
    MainDiverged {
        expected: String,
        actual: String,
    },
    /// One sweep of main by the Reconciler. When red, fix tasks for its `fixes` follow
    /// (`FixTaskAdded`), except those an open fix already covers.
    SweepFinished {
        report: SweepReport,
    },
    /// A sweep was discarded: main moved from `commit` while it ran.
    SweepStale {
        sweep: u32,
        commit: String,
    },
    /// Every task has ended and planning is over: the run drains the merge queue and asks
    /// for a sweep of main (attempt `attempt` of `max_finalization_attempts`). It ends
    /// `Completed` only on a green sweep.
    FinalizationStarted {
        attempt: u32,
    },
    /// A message that could not apply (late, stale attempt, unknown task). Nothing changed.
    MessageIgnored {
        task: Option<TaskId>,
        message: String,
        why: String,
    },
    PlanningFinished,
    /// The whole run is being cancelled; the cancellations of its tasks follow.
    RunCancelRequested {
        reason: String,
    },
    /// Spend charged to `task` (and to the run): reported by a running attempt
    /// (`SpendReported`), or what a report's handoff metrics add beyond what that attempt had
    /// already reported. `attempt` is the attempt that spent it, possibly an earlier one.
    SpendCharged {
        task: TaskId,
        attempt: u32,
        spent: Budget,
    },
    /// The run spent more than its run budget: nothing more is planned or dispatched, every
    /// live task is cancelled (the cancellations follow) and the run ends `Failed`.
    RunBudgetExhausted {
        spent: Budget,
        budget: Budget,
    },
    RunFinished {
        outcome: RunOutcome,
        /// Why the run ended as it did, in words (e.g. "budget exhausted: …"); `None` in
        /// journals written before M3 and when there is nothing to add to the outcome.
        #[serde(default)]
        reason: Option<String>,
    },
    /// One of the run's actors died (a panic, a broken invariant) and the supervisor
    /// restarted the run from the journal; `restart` counts them (ADR-006). Journaled by the
    /// supervisor, so the cap on restarts holds across daemon restarts.
    RunRestarted {
        restart: u32,
        reason: String,
    },
    /// A notice for live streams, never journaled (its `seq` is 0): the journal refused a
    /// write, the run is paused and retries.
    JournalUnavailable {
        error: String,
    },
    /// A notice for live streams, never journaled (its `seq` is 0): flotilla's own storage
    /// refused a write (disk full, read-only) making `task`'s worktree; the attempt waits
    /// and tries again, nothing is charged to the task (ADR-021).
    StorageUnavailable {
        task: TaskId,
        error: String,
    },
    /// A notice for live streams, never journaled (its `seq` is 0): an LLM call is
    /// streaming its answer. The call's final usage is journaled with its answer.
    LlmProgress {
        role: Role,
        #[serde(default)]
        task: Option<TaskId>,
        tokens_out: u64,
    },
    /// A notice for live streams, never journaled (its `seq` is 0): a provider's rate limit
    /// (a 429) holds an LLM call back for `wait_ms` (capped by flotilla; only long pauses
    /// are said).
    ProviderPaused {
        role: Role,
        #[serde(default)]
        task: Option<TaskId>,
        provider: String,
        wait_ms: u64,
    },
    /// A notice for live streams, never journaled (its `seq` is 0): what an attempt's agent
    /// is doing (a tool it called, a step an external agent reported). Its text is the
    /// agent's, cut short.
    AgentActivity {
        task: TaskId,
        attempt: u32,
        activity: String,
    },
    /// The user adopted main as it is after it diverged (`flotilla decide RUN
    /// --adopt-main`, ADR-024): `tip` replaces `expected` as the tip flotilla last wrote,
    /// and the merge queue lands on top of it. `dropped`: tasks recorded landed whose
    /// commits main no longer contains. They stay `Completed` as journaled, and nothing
    /// of theirs is replayed; their work is in the commits of their `TaskLanded`.
    MainAdopted {
        expected: String,
        tip: String,
        dropped: Vec<TaskId>,
    },
    /// A provider's long rate-limit pause, journaled by the supervisor so that `status`
    /// shows it while it lasts (ADR-024): `provider` holds calls back until `until_ms`
    /// (milliseconds since the Unix epoch) because of `why`; `role` and `task` are the call
    /// that heard it first. Cleared by `ProviderResumed`.
    ProviderPauseStarted {
        provider: String,
        role: Role,
        #[serde(default)]
        task: Option<TaskId>,
        until_ms: u64,
        why: String,
    },
    /// The provider's pause is over: its calls go on.
    ProviderResumed {
        provider: String,
    },
}

impl EventKind {
    /// One event of every kind about `task`, with the awkward values (the largest numbers,
    /// text that needs escaping): for round-trip tests of the journal's encoding and for
    /// fuzzing. The protocol's unit test fails to compile when a kind has no sample here.
    pub fn samples(task: &TaskId) -> Vec<EventKind> {
        use crate::protocol::{ArtifactKind, DecompositionReason, Route, StopCondition, Usd};
        let most = Budget::new(u64::MAX, Usd::from_micros(u64::MAX), u64::MAX);
        let handoff = Some(Handoff::complete("done \"quoted\" \u{1b}[2J\n"));
        let artifacts = vec![ArtifactRef {
            kind: ArtifactKind::Commit,
            locator: "abc123".into(),
        }];
        let reason = RejectionReason::TaskBudgetTooLarge {
            subtask: usize::MAX,
            asked: most,
            max: Budget::default(),
        };
        let t = || task.clone();
        vec![
            EventKind::RunStarted {
                request: "fix \u{0}it".into(),
                sandbox: Some("bwrap".into()),
            },
            EventKind::PlannerResponded {
                call: u32::MAX,
                prompt: "p".into(),
                content: "c".into(),
                usage: Usage {
                    tokens_in: u64::MAX,
                    tokens_out: u64::MAX,
                    cost_usd: Usd::from_micros(1),
                },
                error: Some("bad".into()),
            },
            EventKind::ToolsRan {
                tools: ToolRound {
                    role: Role::Subplanner,
                    task: Some(t()),
                    attempt: u32::MAX,
                    call: u32::MAX,
                    round: u32::MAX,
                    commit: "abc".into(),
                    content: "looking \u{1b}[2J".into(),
                    runs: vec![ToolRun {
                        id: "call_0".into(),
                        name: "read_file".into(),
                        arguments: "{\"path\": \"../x\"}".into(),
                        result: "refused \u{0}".into(),
                    }],
                    usage: Usage {
                        tokens_in: u64::MAX,
                        tokens_out: 1,
                        cost_usd: Usd::from_micros(u64::MAX),
                    },
                },
            },
            EventKind::PlannerGaveUp { error: "e".into() },
            EventKind::TaskAdded {
                task: t(),
                spec: TaskSpec::new("d", &["src/a b"]),
                budget: most,
                depends_on: vec![TaskId::root(1)],
            },
            EventKind::TasksRejected {
                reason: reason.clone(),
            },
            EventKind::TaskReady { task: t() },
            EventKind::TaskDispatched {
                task: t(),
                attempt: u32::MAX,
                profile: "w".into(),
                route: Route::Subplanner,
            },
            EventKind::TaskStarted {
                task: t(),
                attempt: 1,
            },
            EventKind::TaskRetried {
                task: t(),
                attempt: 1,
                failure: AttemptFailure::TimedOut { limit_ms: u64::MAX },
                findings: Vec::new(),
            },
            EventKind::TaskInterrupted {
                task: t(),
                attempt: 1,
            },
            EventKind::ReviewVerdict {
                task: t(),
                attempt: u32::MAX,
                review: ReviewVerdict::ChangesRequested {
                    comments: vec!["name it \u{1b}[2J parse".to_string()].into(),
                },
                calls: u32::MAX,
                usage: Usage {
                    tokens_in: u64::MAX,
                    tokens_out: 1,
                    cost_usd: Usd::from_micros(u64::MAX),
                },
            },
            EventKind::TaskCompleted {
                task: t(),
                attempt: 1,
                handoff: handoff.clone(),
                artifacts: artifacts.clone(),
            },
            EventKind::TaskFailed {
                task: t(),
                attempt: 1,
                reason: FailureReason::BudgetExceeded {
                    spent: most,
                    budget: most,
                },
            },
            EventKind::TaskCancelled {
                task: t(),
                was: TaskState::Synthesizing,
                reason: "r".into(),
            },
            EventKind::DecompositionAccepted {
                parent: t(),
                attempt: 1,
                reason: DecompositionReason::ExternalToolRequired,
                stop_when: StopCondition::UserDecision,
                subtasks: vec![t()],
                handoff,
                artifacts,
                subplanner: true,
            },
            EventKind::SubtasksAdded {
                parent: t(),
                attempt: u32::MAX,
                subtasks: vec![t()],
            },
            EventKind::DecompositionClosed {
                parent: t(),
                attempt: 1,
                reason: "20 calls \u{7}".into(),
            },
            EventKind::SubplannerResponded {
                task: t(),
                attempt: 1,
                call: u32::MAX,
                prompt: "p\u{1b}".into(),
                content: "{\"tasks\": []}".into(),
                usage: Usage {
                    tokens_in: u64::MAX,
                    tokens_out: 1,
                    cost_usd: Usd::from_micros(u64::MAX),
                },
                reported: vec![t()],
                error: None,
            },
            EventKind::TaskAtomic {
                task: t(),
                attempt: 1,
                reason: "no subtasks".into(),
            },
            EventKind::DecompositionRejected {
                parent: t(),
                attempt: 1,
                reason,
            },
            EventKind::SpendCharged {
                task: t(),
                attempt: 1,
                spent: most,
            },
            EventKind::ProposalsStopped {
                task: t(),
                attempt: 1,
                rejections: u32::MAX,
            },
            EventKind::SubtasksCompleted { parent: t() },
            EventKind::AwaitingUserDecision { parent: t() },
            EventKind::LandingAllowed { task: t() },
            EventKind::TaskLanding {
                task: t(),
                attempt: u32::MAX,
                handoff: Some(Handoff::complete("landing \u{1b}")),
                artifacts: Vec::new(),
                branch: "flotilla/x/t1".into(),
                head: "abc".into(),
            },
            EventKind::TaskLanded {
                task: t(),
                commit: "def".into(),
                via: Some(TaskId::fix(u32::MAX)),
            },
            EventKind::FixTaskAdded {
                task: TaskId::fix(1),
                spec: TaskSpec::new("fix \u{0}", &["src/a"]),
                budget: most,
                fix: FixOf::Conflict {
                    task: t(),
                    branch: "flotilla/x/t1".into(),
                    files: vec!["src/a".into()],
                },
            },
            EventKind::MergeConflict {
                task: t(),
                files: vec!["a\u{1b}".into()],
                clashing: vec!["abc1234 subject".into()],
                retrying: true,
            },
            EventKind::MergeGateFailed {
                tasks: vec![t()],
                command: "sh test.sh".into(),
                output_tail: "FAIL \u{7}".into(),
                bisecting: true,
                flaky_retry: false,
            },
            EventKind::MainMoved {
                from: "a".into(),
                to: "b".into(),
                tasks: vec![t()],
                checkout: CheckoutSync::Detached { at: "a".into() },
            },
            EventKind::LandingIntended {
                from: "a".into(),
                to: "b".into(),
                landed: vec![IntendedLanding {
                    task: t(),
                    attempt: u32::MAX,
                    commit: "b\u{1b}".into(),
                }],
            },
            EventKind::LandingRequeued {
                task: t(),
                fix: t(),
            },
            EventKind::MainDiverged {
                expected: "a".into(),
                actual: "b\u{1b}".into(),
            },
            EventKind::SweepFinished {
                report: SweepReport {
                    sweep: u32::MAX,
                    commit: "c".into(),
                    green: false,
                    class: Some("compile error".into()),
                    failures: usize::MAX,
                    fixes: vec![crate::protocol::SweepFix {
                        title: "t".into(),
                        description: "d\u{1b}".into(),
                        scope: vec!["src/a.rs".into()],
                        signature: "s".into(),
                        class: "compile error".into(),
                        worded: None,
                    }],
                    duration_ms: u64::MAX,
                    finalization: Some(u32::MAX),
                    wording: None,
                },
            },
            EventKind::SweepStale {
                sweep: 1,
                commit: "c".into(),
            },
            EventKind::FinalizationStarted { attempt: u32::MAX },
            EventKind::MessageIgnored {
                task: None,
                message: "m".into(),
                why: "w".into(),
            },
            EventKind::PlanningFinished,
            EventKind::RunCancelRequested { reason: "r".into() },
            EventKind::RunBudgetExhausted {
                spent: most,
                budget: most,
            },
            EventKind::RunFinished {
                outcome: RunOutcome::Failed,
                reason: Some("budget exhausted".into()),
            },
            EventKind::RunRestarted {
                restart: u32::MAX,
                reason: "the run's TaskGraph actor stopped unexpectedly".into(),
            },
            EventKind::JournalUnavailable {
                error: "disk full".into(),
            },
            EventKind::StorageUnavailable {
                task: TaskId::root(1),
                error: "Read-only file system".into(),
            },
            EventKind::LlmProgress {
                role: Role::Subplanner,
                task: Some(TaskId::root(1).child(2)),
                tokens_out: u64::MAX,
            },
            EventKind::ProviderPaused {
                role: Role::Worker,
                task: Some(t()),
                provider: "local\u{1b}]0;x\u{7}".into(),
                wait_ms: u64::MAX,
            },
            EventKind::AgentActivity {
                task: t(),
                attempt: u32::MAX,
                activity: "run_command \u{1b}[2J\u{202e}".into(),
            },
            EventKind::MainAdopted {
                expected: "abc".into(),
                tip: "def".into(),
                dropped: vec![t()],
            },
            EventKind::ProviderPauseStarted {
                provider: "local\u{1b}]0;x\u{7}".into(),
                role: Role::Planner,
                task: Some(t()),
                until_ms: u64::MAX,
                why: "rate limited (HTTP 429)\r".into(),
            },
            EventKind::ProviderResumed {
                provider: "local\u{202e}".into(),
            },
        ]
    }

    /// The snake_case name used as the journal's `kind` column and the SSE `event:` field.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::RunStarted { .. } => "run_started",
            EventKind::PlannerResponded { .. } => "planner_responded",
            EventKind::PlannerGaveUp { .. } => "planner_gave_up",
            EventKind::ToolsRan { .. } => "tools_ran",
            EventKind::TaskInterrupted { .. } => "task_interrupted",
            EventKind::TaskAdded { .. } => "task_added",
            EventKind::TasksRejected { .. } => "tasks_rejected",
            EventKind::TaskReady { .. } => "task_ready",
            EventKind::TaskDispatched { .. } => "task_dispatched",
            EventKind::TaskStarted { .. } => "task_started",
            EventKind::TaskRetried { .. } => "task_retried",
            EventKind::ReviewVerdict { .. } => "review_verdict",
            EventKind::TaskCompleted { .. } => "task_completed",
            EventKind::TaskFailed { .. } => "task_failed",
            EventKind::TaskCancelled { .. } => "task_cancelled",
            EventKind::DecompositionAccepted { .. } => "decomposition_accepted",
            EventKind::DecompositionRejected { .. } => "decomposition_rejected",
            EventKind::SubtasksAdded { .. } => "subtasks_added",
            EventKind::DecompositionClosed { .. } => "decomposition_closed",
            EventKind::SubplannerResponded { .. } => "subplanner_responded",
            EventKind::TaskAtomic { .. } => "task_atomic",
            EventKind::SubtasksCompleted { .. } => "subtasks_completed",
            EventKind::AwaitingUserDecision { .. } => "awaiting_user_decision",
            EventKind::LandingAllowed { .. } => "landing_allowed",
            EventKind::TaskLanding { .. } => "task_landing",
            EventKind::TaskLanded { .. } => "task_landed",
            EventKind::FixTaskAdded { .. } => "fix_task_added",
            EventKind::MergeConflict { .. } => "merge_conflict",
            EventKind::MergeGateFailed { .. } => "merge_gate_failed",
            EventKind::MainMoved { .. } => "main_moved",
            EventKind::LandingIntended { .. } => "landing_intended",
            EventKind::LandingRequeued { .. } => "landing_requeued",
            EventKind::MainDiverged { .. } => "main_diverged",
            EventKind::SweepFinished { .. } => "sweep_finished",
            EventKind::SweepStale { .. } => "sweep_stale",
            EventKind::FinalizationStarted { .. } => "finalization_started",
            EventKind::MessageIgnored { .. } => "message_ignored",
            EventKind::PlanningFinished => "planning_finished",
            EventKind::RunCancelRequested { .. } => "run_cancel_requested",
            EventKind::SpendCharged { .. } => "spend_charged",
            EventKind::ProposalsStopped { .. } => "proposals_stopped",
            EventKind::RunBudgetExhausted { .. } => "run_budget_exhausted",
            EventKind::RunFinished { .. } => "run_finished",
            EventKind::RunRestarted { .. } => "run_restarted",
            EventKind::JournalUnavailable { .. } => "journal_unavailable",
            EventKind::StorageUnavailable { .. } => "storage_unavailable",
            EventKind::LlmProgress { .. } => "llm_progress",
            EventKind::ProviderPaused { .. } => "provider_paused",
            EventKind::AgentActivity { .. } => "agent_activity",
            EventKind::MainAdopted { .. } => "main_adopted",
            EventKind::ProviderPauseStarted { .. } => "provider_pause_started",
            EventKind::ProviderResumed { .. } => "provider_resumed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    Completed,
    Failed,
    Cancelled,
}

#[cfg(test)]
#[path = "event_tests.rs"]
mod tests;
