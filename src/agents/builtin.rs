//! The built-in agent: a tool-using loop over any `Llm` (the `worker` role's model), in the
//! attempt's worktree.
//!
//! The model is asked, call after call, with the conversation so far and the tools
//! ([`tools::specs`]); each tool call it makes is run and its result goes back; `finish`
//! ends the loop with the handoff (or a subplan). Whatever the model does, the loop ends:
//! - at `max_tool_calls` tool calls, or when the task's token budget is spent, with a
//!   `failed` handoff that says which limit it reached (the Worker's wall-time limit and the
//!   graph's budget checks bind as well);
//! - after `max_idle_answers` answers in a row that call no tool and hold no handoff;
//! - on a final model error, or when the attempt is called off.
//!
//! Each request is bounded (ADR-030): past `max_context_bytes` or `max_context_tokens`,
//! the oldest tool outputs become a line with their size and head, the model's old words an
//! excerpt, then whole old turns are dropped ([`compact_turns`]); the system prompt and the
//! task message are never cut. A context-length refusal halves the limit and asks again,
//! at most `MAX_COMPACTIONS` times.

use std::sync::{Arc, Mutex};

use flotilla_actors::llm::conversation::{ContextBudget, MAX_COMPACTIONS, compact_turns, halved};
use flotilla_actors::llm::output::parse_json_answer;
use flotilla_actors::ports::{
    Agent, AgentError, AgentReport, AgentSession, AttemptContext, ChatMessage, EnvPolicy, Llm,
    LlmCall, LlmError, LlmRequest, ProcessRunner, Role, Sandbox, TranscriptKind, Workspace,
    scrubbed_env,
};
use flotilla_actors::protocol::{
    Assignment, Budget, Handoff, HandoffMetrics, HandoffStatus, RejectionReason, SubtaskResult,
    TaskId,
};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::tools::{self, FinishArgs, ToolContext, ToolLimits, ToolOutcome};

/// `[builtin_agent]` in flotilla.toml.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BuiltinConfig {
    /// Tool calls per attempt (a revision or a synthesis continues the count).
    pub max_tool_calls: u32,
    /// Answers in a row that call no tool and hold no handoff before the attempt fails.
    pub max_idle_answers: u32,
    /// The conversation's size past which old tool outputs are compacted.
    pub max_context_bytes: usize,
    /// The same in approximate tokens (four bytes a token at most): what the model's
    /// context can take besides its answer.
    pub max_context_tokens: u64,
    /// Tool outputs kept whole however large the conversation (the most recent).
    pub keep_recent_outputs: usize,
    /// The most output tokens one model call may produce.
    pub max_output_tokens: u32,
    pub command_timeout_secs: u64,
    /// What the model reads of a command's stdout and of its stderr.
    pub command_output_bytes: usize,
    /// Commands always run in the run's sandbox (`[sandbox]`, ADR-015); `"network"` gives
    /// them the host's network, `"bwrap"` (the default) none.
    pub sandbox: Sandbox,
}

impl Default for BuiltinConfig {
    fn default() -> Self {
        BuiltinConfig {
            max_tool_calls: 60,
            max_idle_answers: 3,
            max_context_bytes: 200_000,
            max_context_tokens: 50_000,
            keep_recent_outputs: 4,
            max_output_tokens: 4_096,
            command_timeout_secs: 300,
            command_output_bytes: 16 * 1024,
            sandbox: Sandbox::Bwrap,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuiltinConfigError {
    #[error("builtin_agent.{0} = 0: it must be at least 1")]
    Zero(&'static str),
}

impl BuiltinConfig {
    pub fn validate(&self) -> Result<(), BuiltinConfigError> {
        let zero = [
            ("max_tool_calls", self.max_tool_calls == 0),
            ("max_idle_answers", self.max_idle_answers == 0),
            ("max_context_bytes", self.max_context_bytes == 0),
            ("max_context_tokens", self.max_context_tokens == 0),
            ("max_output_tokens", self.max_output_tokens == 0),
            ("command_timeout_secs", self.command_timeout_secs == 0),
            ("command_output_bytes", self.command_output_bytes == 0),
        ];
        match zero.iter().find(|(_, zero)| *zero) {
            Some((name, _)) => Err(BuiltinConfigError::Zero(name)),
            None => Ok(()),
        }
    }

    fn context_budget(&self) -> ContextBudget {
        ContextBudget {
            max_bytes: self.max_context_bytes,
            max_tokens: self.max_context_tokens,
            keep_recent: self.keep_recent_outputs,
        }
    }

    fn tool_limits(&self) -> ToolLimits {
        let mut limits = ToolLimits::default();
        limits.command.wall = std::time::Duration::from_secs(self.command_timeout_secs);
        limits.command.output_bytes = self.command_output_bytes;
        limits.sandbox = self.sandbox;
        limits
    }
}

pub struct BuiltinAgent {
    shared: Arc<Shared>,
}

struct Shared {
    llm: Arc<dyn Llm>,
    runner: Arc<dyn ProcessRunner>,
    system: String,
    config: BuiltinConfig,
}

impl BuiltinAgent {
    /// `system` is the worker's system prompt.
    pub fn new(
        llm: Arc<dyn Llm>,
        runner: Arc<dyn ProcessRunner>,
        system: String,
        config: BuiltinConfig,
    ) -> Self {
        BuiltinAgent {
            shared: Arc::new(Shared {
                llm,
                runner,
                system,
                config,
            }),
        }
    }
}

impl Agent for BuiltinAgent {
    fn open(&self, workspace: Workspace, attempt: AttemptContext) -> Box<dyn AgentSession> {
        Box::new(BuiltinSession {
            shared: self.shared.clone(),
            workspace,
            attempt,
            state: Arc::new(Mutex::new(State::default())),
        })
    }
}

/// What a session's calls share.
#[derive(Default)]
struct State {
    messages: Vec<ChatMessage>,
    /// Answers so far: the next call's place in the conversation.
    turn: u32,
    /// Context-length refusals so far.
    compactions: u32,
    /// What a request may carry since the last refusal: half the refused one's size.
    ceiling: Option<usize>,
    /// The size of the last request sent.
    last_request_bytes: usize,
    /// Old turns dropped from the conversation so far.
    dropped: u32,
    tool_calls: u32,
    tokens: u64,
    tokens_in: u64,
    tokens_out: u64,
}

struct BuiltinSession {
    shared: Arc<Shared>,
    workspace: Workspace,
    attempt: AttemptContext,
    state: Arc<Mutex<State>>,
}

fn task_message(assignment: &Assignment) -> String {
    format!(
        "{}\nWork with the tools, then call finish.\n",
        super::task_text(assignment)
    )
}

impl BuiltinSession {
    /// Adds `user` to the conversation (after the system prompt, for a new one) and runs
    /// the loop until it ends.
    fn converse(
        &self,
        task: TaskId,
        user: String,
        budget: Budget,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>> {
        {
            let mut state = lock(&self.state);
            if state.messages.is_empty() {
                self.attempt
                    .transcript
                    .record(TranscriptKind::Prompt, &self.shared.system);
                state
                    .messages
                    .push(ChatMessage::system(self.shared.system.clone()));
            }
            self.attempt
                .transcript
                .record(TranscriptKind::Prompt, &user);
            state.messages.push(ChatMessage::user(user));
        }
        let ctx = ToolContext {
            root: self.workspace.path.clone(),
            runner: self.shared.runner.clone(),
            cancel: self.attempt.cancel.clone(),
            limits: self.shared.config.tool_limits(),
            env: scrubbed_env(
                std::env::vars(),
                &EnvPolicy::default(),
                &[("TERM".to_string(), "dumb".to_string())],
            ),
        };
        let turns = Turns {
            shared: self.shared.clone(),
            attempt: self.attempt.clone(),
            state: self.state.clone(),
            ctx,
            task,
            budget,
        };
        Box::pin(turns.run())
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One run of the loop.
struct Turns {
    shared: Arc<Shared>,
    attempt: AttemptContext,
    state: Arc<Mutex<State>>,
    ctx: ToolContext,
    task: TaskId,
    budget: Budget,
}

impl Turns {
    async fn run(self) -> Result<AgentReport, AgentError> {
        let config = &self.shared.config;
        let mut idle = 0u32;
        loop {
            if self.attempt.cancel.is_cancelled() {
                return Err(AgentError::Cancelled);
            }
            let request = {
                let mut state = lock(&self.state);
                if state.tool_calls >= config.max_tool_calls {
                    return Ok(self.stopped(
                        &state,
                        format!(
                            "used all {} tool calls without finishing",
                            config.max_tool_calls
                        ),
                    ));
                }
                if self.budget.tokens > 0 && state.tokens >= self.budget.tokens {
                    return Ok(self.stopped(
                        &state,
                        format!("spent its {} tokens without finishing", self.budget.tokens),
                    ));
                }
                let tools = tools::specs();
                // The tool definitions go with every request: they take their room first.
                let tools_bytes = serde_json::to_string(&tools).map_or(0, |t| t.len());
                let limit = config
                    .context_budget()
                    .limit()
                    .min(state.ceiling.unwrap_or(usize::MAX))
                    .saturating_sub(tools_bytes);
                let State {
                    messages, dropped, ..
                } = &mut *state;
                compact_turns(
                    messages,
                    FIXED_MESSAGES,
                    limit,
                    config.keep_recent_outputs,
                    dropped,
                );
                state.last_request_bytes = tools_bytes.saturating_add(
                    state
                        .messages
                        .iter()
                        .map(|m| m.content.len())
                        .sum::<usize>(),
                );
                let mut request =
                    LlmRequest::chat(Role::Worker, state.messages.clone()).with_tools(tools);
                request.max_output_tokens = Some(config.max_output_tokens);
                (request, state.turn)
            };
            let (request, turn) = request;
            // A long rate-limit pause shows on the live line as the agent's activity.
            let activity = self.attempt.activity.clone();
            let call = LlmCall::new(self.attempt.cancel.clone())
                .for_task(self.task.clone())
                .in_turn(turn)
                .on_pause(move |pause| {
                    activity.report(&format!(
                        "waiting {} s: provider {} is rate limiting",
                        pause.wait_ms / 1000,
                        pause.provider
                    ))
                });
            let response = match self.shared.llm.complete(request, call).await {
                Ok(response) => response,
                Err(LlmError::Cancelled) => return Err(AgentError::Cancelled),
                // Too long for the model's context: compacted harder and asked again.
                Err(e) if e.is_context_too_long() => {
                    let mut state = lock(&self.state);
                    if state.compactions >= MAX_COMPACTIONS {
                        return Err(AgentError::Crashed(format!(
                            "the model's context is too small even after compacting the conversation {MAX_COMPACTIONS} times: {e}"
                        )));
                    }
                    state.compactions += 1;
                    state.ceiling = Some(halved(
                        state.ceiling.unwrap_or(usize::MAX),
                        state.last_request_bytes,
                    ));
                    continue;
                }
                Err(e) => return Err(AgentError::Crashed(format!("the model failed: {e}"))),
            };
            self.attempt.spend.report(response.usage.spent());
            if !response.content.is_empty() {
                self.attempt
                    .transcript
                    .record(TranscriptKind::Assistant, &response.content);
            }
            {
                let mut state = lock(&self.state);
                state.turn = state.turn.saturating_add(1);
                let usage = &response.usage;
                state.tokens = state
                    .tokens
                    .saturating_add(usage.tokens_in.saturating_add(usage.tokens_out));
                state.tokens_in = state.tokens_in.saturating_add(usage.tokens_in);
                state.tokens_out = state.tokens_out.saturating_add(usage.tokens_out);
            }
            if response.tool_calls.is_empty() {
                // A model without tool support may answer with the handoff as text.
                if let Some(args) = finish_from_text(&response.content) {
                    return Ok(self.finished(args));
                }
                idle += 1;
                if idle >= config.max_idle_answers {
                    let said: String = response.content.chars().take(300).collect();
                    return Err(AgentError::Malformed(format!(
                        "the model answered {idle} times without calling a tool or finishing; last: {said:?}"
                    )));
                }
                let mut state = lock(&self.state);
                state
                    .messages
                    .push(ChatMessage::assistant(response.content));
                let nudge = "Use the tools to do the task, then call finish with your handoff.";
                self.attempt
                    .transcript
                    .record(TranscriptKind::Prompt, nudge);
                state.messages.push(ChatMessage::user(nudge));
                continue;
            }
            idle = 0;
            lock(&self.state)
                .messages
                .push(ChatMessage::assistant_calls(
                    response.content.clone(),
                    response.tool_calls.clone(),
                ));
            for call in &response.tool_calls {
                {
                    let mut state = lock(&self.state);
                    if state.tool_calls >= config.max_tool_calls {
                        // Every call asked for gets an answer, so the conversation stays
                        // well formed for the provider.
                        state.messages.push(ChatMessage::tool_result(
                            call.id.clone(),
                            "error: the tool-call limit is reached",
                        ));
                        continue;
                    }
                    state.tool_calls += 1;
                }
                self.attempt.activity.report(&tools::describe(call));
                let transcript = &self.attempt.transcript;
                transcript.record(
                    TranscriptKind::ToolCall,
                    &format!("{} {}", call.name, call.arguments),
                );
                match tools::execute(call, &self.ctx).await {
                    ToolOutcome::Finish(args) => return Ok(self.finished(*args)),
                    ToolOutcome::Output(text) => {
                        transcript.record(TranscriptKind::ToolResult, &text);
                        lock(&self.state)
                            .messages
                            .push(ChatMessage::tool_result(call.id.clone(), text))
                    }
                }
            }
        }
    }

    fn metrics(&self, state: &State) -> HandoffMetrics {
        HandoffMetrics {
            tokens_in: state.tokens_in,
            tokens_out: state.tokens_out,
            tool_calls: u64::from(state.tool_calls),
            ..HandoffMetrics::default()
        }
    }

    /// The loop reached a limit: the attempt failed, and says which limit.
    fn stopped(&self, state: &State, why: String) -> AgentReport {
        AgentReport {
            handoff: Some(Handoff {
                status: HandoffStatus::Failed,
                metrics: self.metrics(state),
                ..Handoff::complete(format!("The built-in agent stopped: it {why}."))
            }),
            ..AgentReport::default()
        }
    }

    fn finished(&self, args: FinishArgs) -> AgentReport {
        let metrics = self.metrics(&lock(&self.state));
        args.into_report(&self.task, metrics, None)
    }
}

/// A handoff written as text (`{"status": …, "summary": …}`), for models that answer
/// without calling `finish`.
fn finish_from_text(text: &str) -> Option<FinishArgs> {
    parse_json_answer(text, 256 * 1024).ok()
}

/// The system prompt and the task message: never cut.
const FIXED_MESSAGES: usize = 2;

/// Shrinks the conversation below `max_bytes`, oldest first, without dropping turns that
/// fit: tool outputs before the `keep_recent` newest become a line that says how long they
/// were (and how they began), and long tool-call arguments a small JSON object that says
/// the same ([`compact_turns`]). The system prompt and the task are never cut.
pub fn compact(messages: &mut Vec<ChatMessage>, max_bytes: usize, keep_recent: usize) {
    compact_turns(messages, FIXED_MESSAGES, max_bytes, keep_recent, &mut 0);
}

impl AgentSession for BuiltinSession {
    fn run(
        &mut self,
        assignment: Assignment,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>> {
        let message = task_message(&assignment);
        self.converse(
            assignment.task.task.clone(),
            message,
            assignment.task.budget,
        )
    }

    fn revise(
        &mut self,
        assignment: Assignment,
        rejection: RejectionReason,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>> {
        let message = format!(
            "flotilla refused your subplan: {rejection}. Propose a different one with finish, or do the task yourself and finish with your handoff."
        );
        self.converse(
            assignment.task.task.clone(),
            message,
            assignment.task.budget,
        )
    }

    fn synthesize(
        &mut self,
        parent: TaskId,
        results: Vec<SubtaskResult>,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>> {
        let message =
            super::synthesis_text(&parent, "call finish with the task's handoff", &results);
        self.converse(parent, message, Budget::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compaction_cuts_the_oldest_tool_outputs_first_and_keeps_the_recent_ones() {
        let mut messages = vec![
            ChatMessage::system("s"),
            ChatMessage::user("task"),
            ChatMessage::tool_result("1", "a".repeat(1000)),
            ChatMessage::tool_result("2", "b".repeat(1000)),
            ChatMessage::tool_result("3", "c".repeat(1000)),
        ];
        compact(&mut messages, 2_200, 1);
        assert!(messages[2].content.starts_with("[compacted: 1000 bytes"));
        assert_eq!(
            messages[3].content,
            "b".repeat(1000),
            "under the cap already"
        );
        assert_eq!(messages[4].content, "c".repeat(1000));
        compact(&mut messages, 100, 1);
        assert!(messages[3].content.starts_with("[compacted"));
        assert_eq!(
            messages[4].content.len(),
            1000,
            "the most recent stays whole"
        );
        assert_eq!(messages[1].content, "task");
    }

    #[test]
    fn compaction_also_shortens_old_tool_call_arguments() {
        use flotilla_actors::ports::ToolCall;
        let write = |id: &str| ToolCall {
            id: id.into(),
            name: "write_file".into(),
            arguments: format!("{{\"path\":\"a\",\"content\":\"{}\"}}", "y".repeat(2_000)),
        };
        let mut messages = vec![
            ChatMessage::system("s"),
            ChatMessage::user("task"),
            ChatMessage::assistant_calls("", vec![write("1")]),
            ChatMessage::tool_result("1", "wrote a"),
            ChatMessage::assistant_calls("", vec![write("2")]),
            ChatMessage::tool_result("2", "wrote a"),
        ];
        compact(&mut messages, 2_500, 1);
        assert!(
            messages[2].tool_calls[0]
                .arguments
                .starts_with("{\"compacted\":\"2"),
            "{}",
            messages[2].tool_calls[0].arguments
        );
        serde_json::from_str::<serde_json::Value>(&messages[2].tool_calls[0].arguments)
            .expect("still JSON for the provider");
        assert!(
            messages[4].tool_calls[0].arguments.len() > 2_000,
            "the call the kept output answers stays whole"
        );
    }

    #[test]
    fn a_handoff_written_as_text_is_a_finish() {
        let args = finish_from_text(
            "Done!\n```json\n{\"status\": \"partial\", \"summary\": \"half\", \"concerns\": [\"x\"]}\n```",
        )
        .unwrap();
        assert_eq!(args.status, HandoffStatus::Partial);
        assert_eq!(args.concerns, ["x"]);
        assert!(finish_from_text("I will now edit the file.").is_none());
        assert!(finish_from_text("{\"status\": \"great\", \"summary\": \"\"}").is_none());
    }

    #[test]
    fn impossible_settings_are_refused_by_name() {
        assert!(BuiltinConfig::default().validate().is_ok());
        let none = BuiltinConfig {
            max_tool_calls: 0,
            ..BuiltinConfig::default()
        };
        assert_eq!(
            none.validate(),
            Err(BuiltinConfigError::Zero("max_tool_calls"))
        );
    }
}
