//! The run-level event. Every state change of a run is one `EventKind`; the journal stores
//! them (it assigns `seq` and `at_ms`), the in-memory task graph is a fold over them, the API
//! streams them and `flotilla tail` prints them. One type for all four, so they cannot drift.
//!
//! `FailureReason` and the typed `AttemptFailure` (crashed, malformed, timed out, runner died,
//! reported, cancelled) live here; `AttemptFailure::is_retryable` says which are retried.
//! `CannotStart` (an agent program gone missing after submit, Codex's 404 on a server without
//! `/v1/responses`) never is (ADR-017). A notice that is not journaled (`JournalUnavailable`,
//! `LlmProgress`) has seq 0.

use serde::{Deserialize, Serialize};

use super::handoff::{ArtifactRef, Handoff, Usage};
use super::ids::{RunId, TaskId};
use super::merge::{CheckoutSync, FixOf, IntendedLanding, LandingFailure, SweepReport};
use super::subplan::{DecompositionReason, RejectionReason, StopCondition};
use super::task::{Budget, TaskSpec, TaskState};
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
    TaskRetried {
        task: TaskId,
        attempt: u32,
        failure: AttemptFailure,
    },
    /// The daemon stopped while the attempt was in flight; the task goes back to Ready as
    /// attempt `attempt + 1` without being charged a retry.
    TaskInterrupted {
        task: TaskId,
        attempt: u32,
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
            },
            EventKind::TaskInterrupted {
                task: t(),
                attempt: 1,
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
                    }],
                    duration_ms: u64::MAX,
                    finalization: Some(u32::MAX),
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
            EventKind::TaskInterrupted { .. } => "task_interrupted",
            EventKind::TaskAdded { .. } => "task_added",
            EventKind::TasksRejected { .. } => "tasks_rejected",
            EventKind::TaskReady { .. } => "task_ready",
            EventKind::TaskDispatched { .. } => "task_dispatched",
            EventKind::TaskStarted { .. } => "task_started",
            EventKind::TaskRetried { .. } => "task_retried",
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

/// Why a task failed. Only [`FailureReason::AgentFailed`] with a retryable
/// [`AttemptFailure`] is ever retried (as `TaskRetried`, while attempts remain); every other
/// reason is final: retrying would hit the same wall (a budget, a human's answer, a deadline).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "cause", rename_all = "snake_case")]
pub enum FailureReason {
    /// The agent's attempt failed and the task has no attempts left (or the failure is not
    /// retryable).
    #[error("{failure}")]
    AgentFailed { failure: AttemptFailure },
    /// The worker's handoff said `blocked`; retrying would not help.
    #[error("blocked: {summary}")]
    Blocked { summary: String },
    /// A subtask failed under `AllSubtasksComplete`.
    #[error("subtask {subtask} did not complete")]
    SubtaskFailed { subtask: TaskId },
    /// Every subtask ended under `FirstSuccess` and none completed.
    #[error("no subtask succeeded")]
    NoSubtaskSucceeded,
    /// The subtasks were not all finished within the decomposition deadline.
    #[error("the subtasks did not finish within the {deadline_ms} ms deadline")]
    DecompositionDeadline { deadline_ms: u64 },
    /// A human declined to proceed after the subtasks ended.
    #[error("declined by the user")]
    UserDeclined,
    /// No worker profile offers the capabilities the task needs.
    #[error("no worker can run it: {reason}")]
    Undispatchable { reason: String },
    /// The task spent more than its budget (charged as reported); its agent was stopped.
    #[error("over budget: spent {spent} of {budget}")]
    BudgetExceeded { spent: Budget, budget: Budget },
    /// The agent kept proposing subplans the graph rejected (the per-attempt proposal cap or
    /// `max_subplan_rejections` was reached) and had no usable result; its agent was stopped.
    #[error("stopped after {rejections} rejected subplans")]
    ProposalLoop { rejections: u32 },
    /// Its work was done but could not land on main (M6).
    #[error("not landed: {why}")]
    NotLanded { why: LandingFailure },
}

/// Why one attempt of a task failed, as the attempt's runner saw it. Typed so that the graph
/// can tell a timeout from a crash: see [`AttemptFailure::is_retryable`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AttemptFailure {
    /// The agent process or call failed.
    #[error("the agent crashed: {detail}")]
    Crashed { detail: String },
    /// The agent's output could not be parsed or used.
    #[error("the agent's output could not be used: {detail}")]
    Malformed { detail: String },
    /// The attempt ran past its wall-time limit.
    #[error("the attempt exceeded its time limit of {limit_ms} ms")]
    TimedOut { limit_ms: u64 },
    /// The attempt's runner actor panicked or stopped without reporting.
    #[error("the attempt's runner died without reporting: {detail}")]
    RunnerDied { detail: String },
    /// The agent's own handoff said `failed`.
    #[error("the agent reported failure: {summary}")]
    Reported { summary: String },
    /// The attempt was called off (by flotilla, not by the agent).
    #[error("the attempt was cancelled")]
    Cancelled,
    /// The branch changes files outside the task's scope (the run's policy fails such
    /// work rather than flag it). A fresh attempt may keep to its scope.
    #[error("changed files outside the task's scope: {}", list_paths(paths))]
    OutOfScope { paths: Vec<String> },
    /// The branch adds links that point outside the repository, or hard links (the run's
    /// policy fails such work: ADR-016).
    #[error(
        "added links that point outside the repository (or hard links): {}",
        list_paths(paths)
    )]
    LinksOutside { paths: Vec<String> },
    /// The merge gate failed on main with this attempt's work (M6): the next attempt starts
    /// again from main, told what failed.
    #[error("the merge gate failed ({command}): {output_tail}")]
    GateFailed {
        command: String,
        output_tail: String,
    },
    /// The attempt's git worktree could not be made or read.
    #[error("the workspace failed: {detail}")]
    Workspace { detail: String },
    /// The agent cannot start on this machine: its program went missing after submit (or
    /// the sandbox hides it), or the sandbox became unavailable. Not retried: every attempt
    /// would fail the same way. `detail` starts with the agent's name and the cause.
    #[error("{detail}")]
    CannotStart { detail: String },
}

/// At most 10 paths, then how many more.
fn list_paths(paths: &[String]) -> String {
    let shown: Vec<&str> = paths.iter().take(10).map(String::as_str).collect();
    match paths.len().saturating_sub(shown.len()) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

impl AttemptFailure {
    /// Whether another attempt may help. A crash, unusable output, a timeout, a dead runner or
    /// a failure the agent reported may be transient; a cancelled attempt was stopped on
    /// purpose and must not come back; an agent that cannot start here would not start on
    /// the next attempt either.
    pub fn is_retryable(&self) -> bool {
        !matches!(
            self,
            AttemptFailure::Cancelled | AttemptFailure::CannotStart { .. }
        )
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
mod tests {
    use super::*;

    #[test]
    fn events_serialize_with_kind_and_data_and_round_trip() {
        let e = Event {
            seq: 7,
            run: RunId::generate(),
            at_ms: 1,
            kind: EventKind::TaskReady {
                task: TaskId::root(1),
            },
        };
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["kind"], "task_ready");
        assert_eq!(json["data"]["task"], "t1");
        assert_eq!(json["kind"], e.kind.name());
        let back: Event = serde_json::from_value(json).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn attempt_failures_are_tagged_by_kind_and_say_what_happened() {
        let f = AttemptFailure::TimedOut { limit_ms: 5_000 };
        let json = serde_json::to_value(&f).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"kind": "timed_out", "limit_ms": 5000})
        );
        assert_eq!(serde_json::from_value::<AttemptFailure>(json).unwrap(), f);
        assert_eq!(
            f.to_string(),
            "the attempt exceeded its time limit of 5000 ms"
        );
        let reason = FailureReason::AgentFailed {
            failure: AttemptFailure::Crashed {
                detail: "exit 1".into(),
            },
        };
        assert_eq!(reason.to_string(), "the agent crashed: exit 1");
        assert!(f.is_retryable());
        assert!(!AttemptFailure::Cancelled.is_retryable());
        let missing = AttemptFailure::CannotStart {
            detail: "codex: program not found on PATH".into(),
        };
        assert!(!missing.is_retryable());
        assert_eq!(
            FailureReason::AgentFailed { failure: missing }.to_string(),
            "codex: program not found on PATH",
            "cause first, with nothing before the agent's name"
        );
    }

    #[test]
    fn run_finished_without_a_reason_still_parses() {
        let old: EventKind =
            serde_json::from_str(r#"{"kind": "run_finished", "data": {"outcome": "failed"}}"#)
                .unwrap();
        assert_eq!(
            old,
            EventKind::RunFinished {
                outcome: RunOutcome::Failed,
                reason: None
            }
        );
    }

    /// One event of every kind about the deepest task id.
    fn one_of_each() -> Vec<EventKind> {
        use crate::protocol::MAX_TASK_DEPTH;
        let mut deep = TaskId::root(u32::MAX);
        while deep.depth() < MAX_TASK_DEPTH {
            deep = deep.child(u32::MAX);
        }
        EventKind::samples(&deep)
    }

    /// Fails to compile when a kind is added without a sample in `one_of_each`.
    fn sampled(kind: &EventKind) -> bool {
        match kind {
            EventKind::RunStarted { .. }
            | EventKind::PlannerResponded { .. }
            | EventKind::PlannerGaveUp { .. }
            | EventKind::TaskAdded { .. }
            | EventKind::TasksRejected { .. }
            | EventKind::TaskReady { .. }
            | EventKind::TaskDispatched { .. }
            | EventKind::TaskStarted { .. }
            | EventKind::TaskRetried { .. }
            | EventKind::TaskInterrupted { .. }
            | EventKind::TaskCompleted { .. }
            | EventKind::TaskFailed { .. }
            | EventKind::TaskCancelled { .. }
            | EventKind::DecompositionAccepted { .. }
            | EventKind::DecompositionRejected { .. }
            | EventKind::SubtasksAdded { .. }
            | EventKind::DecompositionClosed { .. }
            | EventKind::SubplannerResponded { .. }
            | EventKind::TaskAtomic { .. }
            | EventKind::SpendCharged { .. }
            | EventKind::ProposalsStopped { .. }
            | EventKind::SubtasksCompleted { .. }
            | EventKind::AwaitingUserDecision { .. }
            | EventKind::LandingAllowed { .. }
            | EventKind::MessageIgnored { .. }
            | EventKind::TaskLanding { .. }
            | EventKind::TaskLanded { .. }
            | EventKind::FixTaskAdded { .. }
            | EventKind::MergeConflict { .. }
            | EventKind::MergeGateFailed { .. }
            | EventKind::MainMoved { .. }
            | EventKind::LandingIntended { .. }
            | EventKind::LandingRequeued { .. }
            | EventKind::MainDiverged { .. }
            | EventKind::SweepFinished { .. }
            | EventKind::SweepStale { .. }
            | EventKind::FinalizationStarted { .. }
            | EventKind::PlanningFinished
            | EventKind::RunCancelRequested { .. }
            | EventKind::RunBudgetExhausted { .. }
            | EventKind::RunFinished { .. }
            | EventKind::RunRestarted { .. }
            | EventKind::JournalUnavailable { .. }
            | EventKind::StorageUnavailable { .. }
            | EventKind::LlmProgress { .. }
            | EventKind::ProviderPaused { .. }
            | EventKind::AgentActivity { .. }
            | EventKind::MainAdopted { .. }
            | EventKind::ProviderPauseStarted { .. }
            | EventKind::ProviderResumed { .. } => true,
        }
    }

    #[test]
    fn every_event_kind_round_trips_through_json() {
        let all = one_of_each();
        let names: std::collections::BTreeSet<&str> = all.iter().map(EventKind::name).collect();
        assert_eq!(names.len(), all.len(), "one sample per kind");
        for kind in all {
            assert!(sampled(&kind));
            let json = serde_json::to_string(&kind).unwrap();
            let back: EventKind = serde_json::from_str(&json)
                .unwrap_or_else(|e| panic!("{} does not read back: {e}\n{json}", kind.name()));
            assert_eq!(back, kind);
            let value: serde_json::Value = serde_json::from_str(&json).unwrap();
            assert_eq!(value["kind"], kind.name());
        }
    }
}
