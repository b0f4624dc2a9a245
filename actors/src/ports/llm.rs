//! The `Llm` port: one chat-completion interface for every role (root planner, subplanner,
//! worker agent, reconciler), whatever serves it (OpenAI-compatible servers, Anthropic, the
//! scripted provider).
//!
//! What crosses it is plain data: messages (with tool calls and tool results, for the
//! built-in agent), tool definitions, whether a JSON object is wanted, and back the text, the
//! tool calls the model asked for and the usage the provider measured. Everything in an
//! `LlmResponse` is untrusted model output: callers parse and bound it.
//!
//! Retries live in the provider (one retry layer): an `LlmError` that reaches a caller is
//! what is left after them, and [`LlmError::is_retryable`] says whether asking again later
//! could help.
//!
//! Beside an `LlmRequest` (with `AnswerFormat::JsonObject` for JSON mode) goes an `LlmCall`:
//! the cancellation token that drops the HTTP request, the task, live progress. An
//! `LlmResponse`'s usage is measured, or an estimate marked approximate; it names the model
//! that answered and the finish reason.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

pub use crate::protocol::Role;
use crate::protocol::{TaskId, Usage};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatRole {
    System,
    User,
    Assistant,
    /// The result of a tool call, answering the assistant message that asked for it.
    Tool,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: ChatRole,
    pub content: String,
    /// On an assistant message: the tools it asked to call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// On a tool message: which call this is the result of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    fn new(role: ChatRole, content: impl Into<String>) -> Self {
        ChatMessage {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    pub fn system(content: impl Into<String>) -> Self {
        Self::new(ChatRole::System, content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::new(ChatRole::User, content)
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(ChatRole::Assistant, content)
    }

    /// The model's turn that asked for tools.
    pub fn assistant_calls(content: impl Into<String>, calls: Vec<ToolCall>) -> Self {
        ChatMessage {
            tool_calls: calls,
            ..Self::new(ChatRole::Assistant, content)
        }
    }

    /// What a tool call returned.
    pub fn tool_result(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            tool_call_id: Some(call_id.into()),
            ..Self::new(ChatRole::Tool, content)
        }
    }
}

/// A tool the model may call: a name, what it does, and its arguments' JSON Schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: serde_json::Value,
}

/// A tool call the model asked for. `id` is the provider's (it pairs the call with its
/// result in the conversation, nothing more); `arguments` is the model's raw JSON text,
/// untrusted: the tool parses and checks it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// What kind of answer is asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerFormat {
    #[default]
    Text,
    /// One JSON object. Providers that support it are asked for JSON output
    /// (`response_format`); others get the instruction in the prompt only. The caller parses
    /// the answer either way.
    JsonObject,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmRequest {
    pub role: Role,
    pub messages: Vec<ChatMessage>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolSpec>,
    #[serde(default)]
    pub format: AnswerFormat,
    /// With `AnswerFormat::JsonObject`: the JSON Schema the object should follow. Servers
    /// that can constrain their output to it (the llama.cpp family) are asked to; the
    /// caller validates the answer either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<serde_json::Value>,
    /// The most output tokens the call may produce, if the caller bounds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
}

impl LlmRequest {
    /// A plain chat request.
    pub fn chat(role: Role, messages: Vec<ChatMessage>) -> Self {
        LlmRequest {
            role,
            messages,
            tools: Vec::new(),
            format: AnswerFormat::Text,
            schema: None,
            max_output_tokens: None,
        }
    }

    /// Asks for one JSON object as the answer.
    pub fn json(mut self) -> Self {
        self.format = AnswerFormat::JsonObject;
        self
    }

    /// Asks for one JSON object following `schema`.
    pub fn json_schema(mut self, schema: serde_json::Value) -> Self {
        self.format = AnswerFormat::JsonObject;
        self.schema = Some(schema);
        self
    }

    pub fn with_tools(mut self, tools: Vec<ToolSpec>) -> Self {
        self.tools = tools;
        self
    }
}

/// Why the model stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    #[default]
    Stop,
    /// It hit the output-token cap: the answer is cut off.
    Length,
    ToolCalls,
    /// The provider filtered the answer.
    ContentFilter,
    /// The provider said nothing, or something this version does not know.
    Other,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmResponse {
    pub content: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// As the provider measured it; `cost_usd` from the configured price table.
    pub usage: Usage,
    /// The provider sent no usage: `usage` is estimated from the text (about four characters
    /// a token).
    #[serde(default)]
    pub usage_approximate: bool,
    /// `provider/model` that answered (after failover, maybe not the first configured).
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub finish: FinishReason,
}

/// Progress of a call while it streams: live only, never journaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlmProgress {
    /// Output tokens streamed so far (estimated from the text while streaming).
    pub tokens_out: u64,
}

/// A provider's rate limit holds a call back for long enough to say so: a 429 asked it to
/// wait `wait_ms` (capped) before its next try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmPause {
    /// The provider's name in `[providers]`.
    pub provider: String,
    pub wait_ms: u64,
}

/// What a call gets besides its request: a way to call it off, and where to say how far it
/// got.
#[derive(Clone, Default)]
pub struct LlmCall {
    /// Cancelled when the run or task is called off: the provider drops the HTTP request.
    pub cancel: CancellationToken,
    /// The task the call works for, if any (for progress lines and accounting).
    pub task: Option<TaskId>,
    /// The call's place in its conversation (0 for the first call), when the caller counts
    /// them: a bounded request does not carry every earlier answer (ADR-030), so the
    /// scripted provider cannot count them in the messages.
    pub turn: Option<u32>,
    /// The call's tool round within its turn (0 for the first request of the turn), when
    /// the caller runs tools (ADR-037): a scripted provider answers round by round.
    pub round: Option<u32>,
    /// The task's attempt the call works for, when it works for one (the reviewer's:
    /// the scripted provider answers by it).
    pub attempt: Option<u32>,
    progress: Option<Arc<dyn Fn(LlmProgress) + Send + Sync>>,
    pause: Option<Arc<dyn Fn(LlmPause) + Send + Sync>>,
}

impl LlmCall {
    pub fn new(cancel: CancellationToken) -> Self {
        LlmCall {
            cancel,
            task: None,
            turn: None,
            round: None,
            attempt: None,
            progress: None,
            pause: None,
        }
    }

    /// Where to say that a long rate-limit pause holds the call back.
    pub fn on_pause(mut self, report: impl Fn(LlmPause) + Send + Sync + 'static) -> Self {
        self.pause = Some(Arc::new(report));
        self
    }

    pub fn paused(&self, pause: LlmPause) {
        if let Some(report) = &self.pause {
            report(pause)
        }
    }

    pub fn for_task(mut self, task: TaskId) -> Self {
        self.task = Some(task);
        self
    }

    pub fn for_attempt(mut self, attempt: u32) -> Self {
        self.attempt = Some(attempt);
        self
    }

    /// The call is the `turn`-th of its conversation (0 for the first).
    pub fn in_turn(mut self, turn: u32) -> Self {
        self.turn = Some(turn);
        self
    }

    /// The call is the `round`-th tool round of its turn (0 for the first).
    pub fn in_round(mut self, round: u32) -> Self {
        self.round = Some(round);
        self
    }

    pub fn on_progress(mut self, report: impl Fn(LlmProgress) + Send + Sync + 'static) -> Self {
        self.progress = Some(Arc::new(report));
        self
    }

    pub fn progress(&self, progress: LlmProgress) {
        if let Some(report) = &self.progress {
            report(progress)
        }
    }
}

impl fmt::Debug for LlmCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LlmCall")
            .field("cancelled", &self.cancel.is_cancelled())
            .field("task", &self.task)
            .field("turn", &self.turn)
            .field("round", &self.round)
            .finish_non_exhaustive()
    }
}

/// Why a call failed, after the provider's own retries.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LlmError {
    /// The provider could not be reached, or the connection broke.
    #[error("the provider could not be reached: {0}")]
    Transport(String),
    /// Rate limited past what the provider waited for.
    #[error("the provider is rate limiting; retry after {retry_after_ms} ms")]
    RateLimited { retry_after_ms: u64 },
    /// The provider failed on its side (5xx), or answered an empty body.
    #[error("the provider failed (HTTP {status}): {message}")]
    Server { status: u16, message: String },
    /// The request itself is refused (bad key, unknown model): asking again the same way
    /// cannot help.
    #[error("the provider refused the request (HTTP {status}): {message}")]
    Refused { status: u16, message: String },
    /// The request does not fit the model's context (OpenAI's `context_length_exceeded`,
    /// llama.cpp's "exceeds the available context size", Anthropic's "prompt is too long"):
    /// the same request will be refused again, a shorter one may not. Callers compact their
    /// conversation and ask again (ADR-030); it is never final by itself.
    #[error("the request is too long for the model's context (HTTP {status}): {message}")]
    ContextTooLong { status: u16, message: String },
    /// The answer did not follow the wire format.
    #[error("the provider answered with something unusable: {0}")]
    Malformed(String),
    #[error("the provider did not answer in time")]
    Timeout,
    /// A streamed answer stopped sending bytes for longer than the stall timeout.
    #[error("the provider's stream stalled: no bytes for {after_ms} ms")]
    Stalled { after_ms: u64 },
    /// The call was called off (its token was cancelled).
    #[error("the call was called off")]
    Cancelled,
    /// Nothing is configured to serve the role.
    #[error("no model is configured for the {0} role")]
    NotConfigured(Role),
    /// The provider's key is read from the calling process's environment when a call is
    /// made (a run's calls: the daemon's; `providers check`: the CLI's), and this variable is
    /// not set there.
    #[error(
        "{env} is not set in this process's environment (the provider's API key; a run reads the daemon's)"
    )]
    MissingKey { env: String },
}

impl LlmError {
    /// The request did not fit the model's context: compact and ask again.
    pub fn is_context_too_long(&self) -> bool {
        matches!(self, LlmError::ContextTooLong { .. })
    }

    /// Whether asking again later could help. Refusals, cancellations and missing
    /// configuration are final; an unusable answer may differ on the next try. A request
    /// too long for the context is not retried as it is, but a shorter one may be answered:
    /// see [`LlmError::is_context_too_long`].
    pub fn is_retryable(&self) -> bool {
        match self {
            LlmError::Transport(_)
            | LlmError::RateLimited { .. }
            | LlmError::Server { .. }
            | LlmError::Malformed(_)
            | LlmError::Timeout
            | LlmError::Stalled { .. } => true,
            LlmError::Refused { .. }
            | LlmError::ContextTooLong { .. }
            | LlmError::Cancelled
            | LlmError::NotConfigured(_)
            | LlmError::MissingKey { .. } => false,
        }
    }
}

/// Chat completion, for every role.
pub trait Llm: Send + Sync + 'static {
    fn complete(
        &self,
        request: LlmRequest,
        call: LlmCall,
    ) -> BoxFuture<'static, Result<LlmResponse, LlmError>>;
}

/// Estimated tokens of a text when a provider reports none: about four characters a token.
pub fn approximate_tokens(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4)
}
