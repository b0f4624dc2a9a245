//! The scripted provider and agent: an LLM and a coding agent that replay a scenario file
//! instead of calling a model. Tests and the offline demo run on them. The format is
//! documented in docs/scenarios.md.
//!
//! Both are stateless with respect to restarts: the planner's n-th answer is chosen by the
//! number of assistant turns already in the conversation, and an agent's answer by task id
//! and attempt, so a recovered run gets exactly the answers it would have got. Both record
//! every request they receive, so tests can assert what each actor was asked.
//!
//! `ScriptedLlm` and `ScriptedAgent` (a session per attempt: reports spend as it starts,
//! writes and deletes files in its worktree, runs a command, honours its cancellation
//! token); unknown keys in a scenario are refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_actors::ports::{
    Agent, AgentError, AgentReport, AgentSession, AttemptContext, ChatRole, CommandSpec,
    FinishReason, Llm, LlmCall, LlmError, LlmRequest, LlmResponse, ProcessRunner, Role, ToolCall,
    TranscriptKind, Workspace,
};
use flotilla_actors::protocol::{
    Assignment, Budget, DecompositionReason, Handoff, HandoffMetrics, HandoffStatus,
    PreviousAttempt, ProposedSubplan, RejectionReason, StopCondition, SubtaskProposal,
    SubtaskResult, TaskId, Usage, Usd,
};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::agents::task_text;

mod review;
use crate::confine::{Access, confine, open_confined};
use crate::text_file::TomlProblem;
pub use review::{ReviewStep, ReviewerAttempt, ReviewerScript};

/// A whole scenario: what the planner answers, and what each task's agent does.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    #[serde(default)]
    pub planner: PlannerScript,
    /// The Subplanner's answers, per task id (`[[subplanner.t4.answers]]`): the n-th call
    /// about a task gets its n-th answer; calls beyond the list (and tasks not listed) get
    /// an empty task list, so an unlisted task is atomic and goes to a worker.
    #[serde(default)]
    pub subplanner: BTreeMap<String, PlannerScript>,
    /// The `worker` role's model, per task (`[[worker.t1.answers]]`): what the built-in
    /// agent's model answers, call by call (tool calls or text); past the list, nothing.
    #[serde(default)]
    pub worker: BTreeMap<String, PlannerScript>,
    /// The `reviewer` role's answers (ADR-038), per task id and attempt
    /// (`[[reviewer.t1.attempts]]`, each with its `answers`): an attempt's n-th review call
    /// gets its n-th answer; past the lists (and for tasks not listed), "approve".
    #[serde(default)]
    pub reviewer: BTreeMap<String, ReviewerScript>,
    /// What every task not listed under `tasks` does.
    #[serde(default)]
    pub agent: AgentStep,
    /// Per task id (`t1`, `t2.1`, …): ids are predictable because flotilla assigns them in
    /// submission order.
    #[serde(default)]
    pub tasks: BTreeMap<String, TaskScript>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlannerScript {
    /// One answer per planner call, in order. Calls beyond the list get an empty task list
    /// (the planner's "done").
    #[serde(default)]
    pub answers: Vec<PlannerStep>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlannerStep {
    /// The tasks to answer with (serialized as the planner's JSON answer).
    #[serde(default)]
    pub tasks: Option<Vec<serde_json::Value>>,
    /// Or the raw answer text, verbatim.
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub delay_ms: u64,
    #[serde(default)]
    pub fault: Option<PlannerFault>,
    /// The worker role's model: tools it calls in this answer.
    #[serde(default)]
    pub tool_calls: Vec<ScriptedToolCall>,
    /// The planners' read-only tools (ADR-037): the calls of each tool round of this
    /// planning call, in order. While a request offers tools and rounds are left, the n-th
    /// request of the call answers with round n's calls; then the answer above.
    #[serde(default)]
    pub tool_rounds: Vec<Vec<ScriptedToolCall>>,
    /// Tokens the answer reports (default: about four characters a token).
    #[serde(default)]
    pub tokens: Option<u64>,
}

/// A tool call in a scripted answer: the tool's name and its arguments, as a table (sent
/// as JSON) or as raw text (`raw_arguments`, to send what no JSON encoder would).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedToolCall {
    pub name: String,
    #[serde(default)]
    pub arguments: Option<serde_json::Value>,
    #[serde(default)]
    pub raw_arguments: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlannerFault {
    /// Answers text that is not the expected JSON.
    Malformed,
    /// The provider call fails (as a network error would).
    Error,
}

/// A task's script: a default step, optional per-attempt steps, and what to do after a
/// rejected subplan and when synthesizing.
///
/// Read through [`TaskScriptFile`]: serde's `flatten` (used to write the step's keys beside
/// the others) cannot refuse unknown keys, and a misspelt key (`outcom = "blocked"`) must
/// be an error, not a silently different scenario.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "TaskScriptFile")]
pub struct TaskScript {
    #[serde(flatten)]
    pub step: AgentStep,
    /// Steps for attempt 1, 2, …; attempts beyond the list use `step`.
    #[serde(default)]
    pub attempts: Vec<AgentStep>,
    #[serde(default)]
    pub on_rejection: Option<AgentStep>,
    #[serde(default)]
    pub synthesis: Option<AgentStep>,
}

/// A [`TaskScript`] as written: the step's keys and the task's own, every other key refused.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskScriptFile {
    #[serde(default)]
    outcome: Option<Outcome>,
    #[serde(default)]
    delay_ms: Option<u64>,
    #[serde(default)]
    summary: Option<String>,
    #[serde(default)]
    files_changed: Vec<String>,
    #[serde(default)]
    concerns: Vec<String>,
    #[serde(default)]
    suggestions: Vec<String>,
    #[serde(default)]
    tokens: Option<u64>,
    #[serde(default)]
    subplan: Option<ScriptedSubplan>,
    #[serde(default)]
    writes: BTreeMap<String, String>,
    #[serde(default)]
    deletes: Vec<String>,
    #[serde(default)]
    run: Option<String>,
    #[serde(default)]
    expect_in_task: Vec<String>,
    #[serde(default)]
    attempts: Vec<AgentStep>,
    #[serde(default)]
    on_rejection: Option<AgentStep>,
    #[serde(default)]
    synthesis: Option<AgentStep>,
}

impl From<TaskScriptFile> for TaskScript {
    fn from(file: TaskScriptFile) -> Self {
        TaskScript {
            step: AgentStep {
                outcome: file.outcome,
                delay_ms: file.delay_ms,
                summary: file.summary,
                files_changed: file.files_changed,
                concerns: file.concerns,
                suggestions: file.suggestions,
                tokens: file.tokens,
                subplan: file.subplan,
                writes: file.writes,
                deletes: file.deletes,
                run: file.run,
                expect_in_task: file.expect_in_task,
            },
            attempts: file.attempts,
            on_rejection: file.on_rejection,
            synthesis: file.synthesis,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentStep {
    #[serde(default)]
    pub outcome: Option<Outcome>,
    #[serde(default)]
    pub delay_ms: Option<u64>,
    #[serde(default)]
    pub summary: Option<String>,
    #[serde(default)]
    pub files_changed: Vec<String>,
    #[serde(default)]
    pub concerns: Vec<String>,
    #[serde(default)]
    pub suggestions: Vec<String>,
    /// Tokens the work "used", reported in the handoff's metrics.
    #[serde(default)]
    pub tokens: Option<u64>,
    #[serde(default)]
    pub subplan: Option<ScriptedSubplan>,
    /// Files the step writes into its worktree, by path (relative to the worktree, confined
    /// to it like any agent's): real work, which flotilla commits on the task branch.
    #[serde(default)]
    pub writes: BTreeMap<String, String>,
    /// Files the step deletes from its worktree.
    #[serde(default)]
    pub deletes: Vec<String>,
    /// A shell command the step runs in its worktree after writing (`cargo build`); its
    /// exit code is the handoff's `build_exit_code`.
    #[serde(default)]
    pub run: Option<String>,
    /// Texts the task message must contain (a retry's previous-attempt section, say); if
    /// one is missing the step crashes, saying which, before it does anything.
    #[serde(default)]
    pub expect_in_task: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Complete,
    Partial,
    Blocked,
    Failed,
    /// Propose `subplan` instead of a deliverable.
    Subplan,
    /// The agent process dies.
    Crash,
    /// The agent answers something unparseable.
    Malformed,
    /// The agent never answers (the worker's wall-time limit ends it).
    Hang,
    /// The agent call panics (a bug in an agent backend): only its own attempt may suffer.
    Panic,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedSubplan {
    #[serde(default = "too_large")]
    pub reason: DecompositionReason,
    #[serde(default)]
    pub stop_when: StopCondition,
    pub subtasks: Vec<SubtaskProposal>,
    /// Names a different parent than the task (to exercise the rejection).
    #[serde(default)]
    pub parent: Option<TaskId>,
}

fn too_large() -> DecompositionReason {
    DecompositionReason::TooLarge
}

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// Not TOML, or not the scenario format (an unknown key, a wrong type); the position
    /// and the problem, not the text.
    #[error("not a valid scenario: {0}")]
    Syntax(TomlProblem),
    #[error("the scenario names task {0:?}; task keys look like t1 or t2.1")]
    BadTaskKey(String),
    #[error("task {task}: outcome \"subplan\" needs a [tasks.{task}.subplan] table")]
    MissingSubplan { task: String },
}

impl Scenario {
    pub fn from_toml(text: &str) -> Result<Scenario, ScenarioError> {
        let scenario: Scenario =
            toml::from_str(text).map_err(|e| ScenarioError::Syntax(TomlProblem::new(text, &e)))?;
        scenario.check()?;
        Ok(scenario)
    }

    pub fn check(&self) -> Result<(), ScenarioError> {
        let keys = self.subplanner.keys().chain(self.worker.keys());
        for key in keys.chain(self.reviewer.keys()) {
            key.parse::<TaskId>()
                .map_err(|_| ScenarioError::BadTaskKey(key.clone()))?;
        }
        for (key, script) in &self.tasks {
            key.parse::<TaskId>()
                .map_err(|_| ScenarioError::BadTaskKey(key.clone()))?;
            let steps = std::iter::once(&script.step)
                .chain(&script.attempts)
                .chain(&script.on_rejection);
            for step in steps {
                if step.outcome == Some(Outcome::Subplan) && step.subplan.is_none() {
                    return Err(ScenarioError::MissingSubplan { task: key.clone() });
                }
            }
        }
        Ok(())
    }

    fn script(&self, task: &TaskId) -> Option<&TaskScript> {
        self.tasks.get(&task.to_string())
    }
}

/// Waits `ms`; no wait at all for 0. (tokio's timer has millisecond ticks: a zero sleep
/// would still wait for the next tick, capping an instant agent near 1,000 calls a second
/// per worker.)
async fn sleep_ms(ms: u64) {
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// The scripted LLM.
pub struct ScriptedLlm {
    scenario: Scenario,
    requests: Mutex<Vec<LlmRequest>>,
}

impl ScriptedLlm {
    pub fn new(scenario: Scenario) -> Self {
        ScriptedLlm {
            scenario,
            requests: Mutex::new(Vec::new()),
        }
    }

    /// Every request received, in order.
    pub fn requests(&self) -> Vec<LlmRequest> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Llm for ScriptedLlm {
    fn complete(
        &self,
        request: LlmRequest,
        call_context: LlmCall,
    ) -> BoxFuture<'static, Result<LlmResponse, LlmError>> {
        if let Ok(mut log) = self.requests.lock() {
            log.push(request.clone());
        }
        // The caller's count when it gives one: a bounded request (ADR-030) does not carry
        // every earlier answer.
        let call = call_context.turn.map_or_else(
            || {
                request
                    .messages
                    .iter()
                    .filter(|m| m.role == ChatRole::Assistant)
                    .count()
            },
            |turn| turn as usize,
        );
        let step = match request.role {
            Role::Planner => self.scenario.planner.answers.get(call).cloned(),
            Role::Subplanner => call_context
                .task
                .as_ref()
                .and_then(|task| self.scenario.subplanner.get(&task.to_string()))
                .and_then(|script| script.answers.get(call).cloned()),
            // A worker's script that has run out answers nothing: a model with nothing
            // more to say.
            Role::Worker => Some(
                call_context
                    .task
                    .as_ref()
                    .and_then(|task| self.scenario.worker.get(&task.to_string()))
                    .and_then(|script| script.answers.get(call).cloned())
                    .unwrap_or_else(|| PlannerStep {
                        content: Some(String::new()),
                        ..PlannerStep::default()
                    }),
            ),
            Role::Reviewer => Some(review::answer(&self.scenario.reviewer, &call_context, call)),
            _ => None,
        }
        .unwrap_or_default();
        // A planner's tool round: only while the request offers tools.
        let round = call_context.round.unwrap_or(0) as usize;
        let (scripted_calls, id_prefix) = match step.tool_rounds.get(round) {
            Some(calls) if !request.tools.is_empty() => (calls, format!("call_{call}_{round}")),
            _ => (&step.tool_calls, format!("call_{call}")),
        };
        let tool_calls: Vec<ToolCall> = scripted_calls
            .iter()
            .enumerate()
            .map(|(i, c)| ToolCall {
                id: format!("{id_prefix}_{i}"),
                name: c.name.clone(),
                arguments: match (&c.raw_arguments, &c.arguments) {
                    (Some(raw), _) => raw.clone(),
                    (None, Some(args)) => args.to_string(),
                    (None, None) => "{}".into(),
                },
            })
            .collect();
        let prompt_chars: usize = request.messages.iter().map(|m| m.content.len()).sum();
        Box::pin(async move {
            sleep_ms(step.delay_ms).await;
            let content = match step.fault {
                _ if !tool_calls.is_empty() => step.content.unwrap_or_default(),
                Some(PlannerFault::Error) => {
                    return Err(LlmError::Transport("scripted provider error".into()));
                }
                Some(PlannerFault::Malformed) => {
                    "I would suggest starting with the parser {".to_string()
                }
                None => match (step.content, step.tasks) {
                    (Some(content), _) => content,
                    (None, tasks) => serde_json::json!({
                        "scratchpad": format!("sprint {}", call + 1),
                        "tasks": tasks.unwrap_or_default(),
                    })
                    .to_string(),
                },
            };
            // Roughly four characters a token, like the real thing.
            let usage = match step.tokens {
                Some(tokens) => Usage {
                    tokens_in: tokens - tokens / 4,
                    tokens_out: tokens / 4,
                    ..Usage::default()
                },
                None => Usage {
                    tokens_in: (prompt_chars / 4) as u64,
                    tokens_out: (content.len() / 4) as u64,
                    ..Usage::default()
                },
            };
            let finish = if tool_calls.is_empty() {
                FinishReason::Stop
            } else {
                FinishReason::ToolCalls
            };
            Ok(LlmResponse {
                content,
                tool_calls,
                usage,
                model: "scripted".into(),
                finish,
                ..LlmResponse::default()
            })
        })
    }
}

/// One call the scripted agent received.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentCall {
    Run {
        task: TaskId,
        attempt: u32,
        /// Where it was told to work.
        workspace: PathBuf,
        /// Why the attempt before failed, as the assignment carried it (ADR-031).
        previous: Option<Arc<PreviousAttempt>>,
        /// The task message every agent reads (`agents::task_text`).
        task_text: String,
    },
    Revise {
        task: TaskId,
        reason: RejectionReason,
    },
    Synthesize {
        task: TaskId,
        subtasks: usize,
    },
}

/// The scripted coding agent.
pub struct ScriptedAgent {
    shared: Arc<Shared>,
}

struct Shared {
    scenario: Scenario,
    calls: Mutex<Vec<AgentCall>>,
    /// Runs a step's `run` command; without one such a step crashes.
    runner: Option<Arc<dyn ProcessRunner>>,
}

impl ScriptedAgent {
    pub fn new(scenario: Scenario) -> Self {
        ScriptedAgent {
            shared: Arc::new(Shared {
                scenario,
                calls: Mutex::new(Vec::new()),
                runner: None,
            }),
        }
    }

    /// Steps with `run` run their command through `runner`.
    pub fn with_runner(scenario: Scenario, runner: Arc<dyn ProcessRunner>) -> Self {
        ScriptedAgent {
            shared: Arc::new(Shared {
                scenario,
                calls: Mutex::new(Vec::new()),
                runner: Some(runner),
            }),
        }
    }

    pub fn calls(&self) -> Vec<AgentCall> {
        self.shared
            .calls
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default()
    }
}

impl Shared {
    fn record(&self, call: AgentCall) {
        if let Ok(mut log) = self.calls.lock() {
            log.push(call);
        }
    }
}

/// The longest a step's `run` command may take (the attempt's own limit still applies).
const STEP_COMMAND_LIMIT: Duration = Duration::from_secs(600);

/// Does a step's file work in the worktree: writes, then deletes, then its command.
/// Returns the command's exit code, if it ran one.
async fn work_in(
    workspace: &Path,
    step: &AgentStep,
    runner: Option<Arc<dyn ProcessRunner>>,
    cancel: CancellationToken,
) -> Result<Option<i32>, AgentError> {
    for (path, text) in &step.writes {
        // As the built-in agent's write_file: no link followed, no hard link written.
        let (root, name, text) = (workspace.to_path_buf(), path.clone(), text.clone());
        tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let mut file = open_confined(&root, &name, Access::Write)
                .map_err(|e| AgentError::Crashed(e.to_string()))?;
            file.set_len(0)
                .and_then(|()| file.write_all(text.as_bytes()))
                .map_err(|e| AgentError::Crashed(format!("cannot write {name}: {e}")))
        })
        .await
        .map_err(|e| AgentError::Crashed(format!("cannot write {path}: {e}")))??;
    }
    for path in &step.deletes {
        let full = confine(workspace, path).map_err(|e| AgentError::Crashed(e.to_string()))?;
        match tokio::fs::remove_file(&full).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(AgentError::Crashed(format!("cannot delete {path}: {e}")));
            }
            _ => {}
        }
    }
    let Some(line) = &step.run else {
        return Ok(None);
    };
    let runner = runner.ok_or_else(|| {
        AgentError::Crashed("the scripted step runs a command and no process runner is set".into())
    })?;
    let mut command = CommandSpec::shell(line.clone(), workspace.to_path_buf());
    command.limits.wall = STEP_COMMAND_LIMIT;
    let output = runner
        .run(command, cancel, None)
        .await
        .map_err(|e| AgentError::Crashed(e.to_string()))?;
    Ok(output.exit.code().or(Some(-1)))
}

/// What a step does, in words, for the attempt's transcript.
fn step_words(step: &AgentStep, outcome: Outcome, tokens: u64) -> String {
    let list = |paths: Vec<&String>| match paths.is_empty() {
        true => "nothing".to_string(),
        false => paths
            .iter()
            .map(|p| p.as_str())
            .collect::<Vec<_>>()
            .join(", "),
    };
    let runs = match &step.run {
        Some(command) => format!("; runs `{command}`"),
        None => String::new(),
    };
    format!(
        "scripted step: {outcome:?}, {tokens} tokens; writes {}; deletes {}{runs}",
        list(step.writes.keys().collect()),
        list(step.deletes.iter().collect()),
    )
}

/// One attempt's scripted session, in its workspace.
struct ScriptedSession {
    shared: Arc<Shared>,
    workspace: Workspace,
    attempt: AttemptContext,
}

impl ScriptedSession {
    /// Plays one step. Like a real agent it reports its spend through the attempt context
    /// as soon as it starts working (so budgets bind before the step ends), does the step's
    /// file work in its worktree, and stops as soon as the attempt is called off.
    fn play(
        &self,
        task: &TaskId,
        step: AgentStep,
        fallback_summary: String,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>> {
        let defaults = self.shared.scenario.agent.clone();
        let runner = self.shared.runner.clone();
        let task = task.clone();
        let attempt = self.attempt.clone();
        let workspace = self.workspace.path.clone();
        let cancel = attempt.cancel.clone();
        let work = async move {
            let outcome = step
                .outcome
                .or(defaults.outcome)
                .unwrap_or(Outcome::Complete);
            let tokens = step.tokens.or(defaults.tokens).unwrap_or(1_000);
            attempt
                .transcript
                .record(TranscriptKind::Step, &step_words(&step, outcome, tokens));
            if !matches!(outcome, Outcome::Crash | Outcome::Malformed) {
                attempt.spend.report(Budget::new(tokens, Usd::ZERO, 0));
            }
            let build_exit_code =
                work_in(&workspace, &step, runner, attempt.cancel.clone()).await?;
            sleep_ms(step.delay_ms.or(defaults.delay_ms).unwrap_or(0)).await;
            let status = match outcome {
                Outcome::Crash => {
                    return Err(AgentError::Crashed(format!("scripted crash of {task}")));
                }
                Outcome::Malformed => {
                    return Err(AgentError::Malformed(
                        "scripted agent answered garbage".into(),
                    ));
                }
                Outcome::Hang => futures::future::pending().await,
                Outcome::Panic => panic!("scripted panic in the agent call for {task}"),
                Outcome::Subplan => {
                    let plan = step
                        .subplan
                        .clone()
                        .ok_or_else(|| AgentError::Malformed("no subplan scripted".into()))?;
                    return Ok(AgentReport {
                        handoff: None,
                        artifacts: Vec::new(),
                        subplan: Some(ProposedSubplan {
                            parent: plan.parent.unwrap_or(task),
                            reason: plan.reason,
                            subtasks: plan.subtasks,
                            stop_when: plan.stop_when,
                        }),
                    });
                }
                Outcome::Complete => HandoffStatus::Complete,
                Outcome::Partial => HandoffStatus::Partial,
                Outcome::Blocked => HandoffStatus::Blocked,
                Outcome::Failed => HandoffStatus::Failed,
            };
            let summary = step
                .summary
                .or(defaults.summary)
                .unwrap_or(fallback_summary);
            attempt
                .transcript
                .record(TranscriptKind::Assistant, &summary);
            let handoff = Handoff {
                status,
                summary,
                files_changed: step.files_changed,
                concerns: step.concerns,
                suggestions: step.suggestions,
                metrics: HandoffMetrics {
                    tokens_in: tokens - tokens / 4,
                    tokens_out: tokens / 4,
                    tool_calls: 1,
                    ..HandoffMetrics::default()
                },
                build_exit_code: build_exit_code.or(Some(0)),
                work: None,
                findings: Vec::new(),
            };
            Ok(AgentReport {
                handoff: Some(handoff),
                artifacts: Vec::new(),
                subplan: None,
            })
        };
        Box::pin(async move {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => Err(AgentError::Cancelled),
                result = work => result,
            }
        })
    }
}

impl Agent for ScriptedAgent {
    fn open(&self, workspace: Workspace, attempt: AttemptContext) -> Box<dyn AgentSession> {
        Box::new(ScriptedSession {
            shared: self.shared.clone(),
            workspace,
            attempt,
        })
    }
}

impl AgentSession for ScriptedSession {
    fn run(
        &mut self,
        assignment: Assignment,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>> {
        let task = assignment.task.task.clone();
        let attempt = assignment.task.attempt;
        let task_text = task_text(&assignment);
        self.shared.record(AgentCall::Run {
            task: task.clone(),
            attempt,
            workspace: self.workspace.path.clone(),
            previous: assignment.task.previous.clone(),
            task_text: task_text.clone(),
        });
        let step = self
            .shared
            .scenario
            .script(&task)
            .map(|s| {
                s.attempts
                    .get(attempt as usize - 1)
                    .cloned()
                    .unwrap_or_else(|| s.step.clone())
            })
            .unwrap_or_default();
        self.attempt
            .transcript
            .record(TranscriptKind::Prompt, &task_text);
        if let Some(missing) = step.expect_in_task.iter().find(|e| !task_text.contains(*e)) {
            let detail = format!(
                "scripted expectation: the task message of {task} attempt {attempt} lacks {missing:?}; it was: {}",
                task_text.chars().take(2_000).collect::<String>()
            );
            return Box::pin(async move { Err(AgentError::Crashed(detail)) });
        }
        self.play(
            &task,
            step,
            format!("{task}: {}", assignment.task.spec.description),
        )
    }

    fn revise(
        &mut self,
        assignment: Assignment,
        rejection: RejectionReason,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>> {
        let task = assignment.task.task.clone();
        self.shared.record(AgentCall::Revise {
            task: task.clone(),
            reason: rejection.clone(),
        });
        let step = self
            .shared
            .scenario
            .script(&task)
            .and_then(|s| s.on_rejection.clone())
            .unwrap_or_default();
        self.play(
            &task,
            step,
            format!("{task}: finished as is after the subplan was refused ({rejection})"),
        )
    }

    fn synthesize(
        &mut self,
        parent: TaskId,
        results: Vec<SubtaskResult>,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>> {
        self.shared.record(AgentCall::Synthesize {
            task: parent.clone(),
            subtasks: results.len(),
        });
        let step = self
            .shared
            .scenario
            .script(&parent)
            .and_then(|s| s.synthesis.clone())
            .unwrap_or_default();
        let step = AgentStep {
            outcome: step.outcome.or(Some(Outcome::Complete)),
            ..step
        };
        self.play(
            &parent,
            step,
            format!("{parent}: merged {} subtasks", results.len()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_errors_are_typed() {
        assert!(matches!(
            Scenario::from_toml("[planner"),
            Err(ScenarioError::Syntax(_))
        ));
        assert!(matches!(
            Scenario::from_toml("[tasks.main]\noutcome = \"complete\""),
            Err(ScenarioError::BadTaskKey(_))
        ));
        assert!(matches!(
            Scenario::from_toml("[tasks.t1]\noutcome = \"subplan\""),
            Err(ScenarioError::MissingSubplan { .. })
        ));
        assert!(matches!(
            Scenario::from_toml("[planner]\nanswer = []"),
            Err(ScenarioError::Syntax(_))
        ));
    }

    #[tokio::test]
    async fn the_planner_answer_is_chosen_by_conversation_length() {
        let scenario = Scenario::from_toml(
            r#"
            [[planner.answers]]
            tasks = [{ description = "a", scope = ["a"] }]
            [[planner.answers]]
            fault = "malformed"
            "#,
        )
        .unwrap();
        let llm = ScriptedLlm::new(scenario);
        use flotilla_actors::ports::ChatMessage;
        let ask = |messages| {
            llm.complete(
                LlmRequest::chat(Role::Planner, messages),
                LlmCall::default(),
            )
        };
        let first = ask(vec![ChatMessage::user("go")]).await.unwrap();
        assert!(first.content.contains("\"description\":\"a\""));
        let second = ask(vec![
            ChatMessage::user("go"),
            ChatMessage::assistant(first.content.clone()),
            ChatMessage::user("next"),
        ])
        .await
        .unwrap();
        assert!(!second.content.trim_start().starts_with('{'));
        assert_eq!(llm.requests().len(), 2);
    }
}
