//! `[subplanner]`: the Subplanner's limits, checked before a run starts.

use serde::{Deserialize, Serialize};

use crate::llm::limits::ConversationLimits;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubplannerConfig {
    /// Unusable answers, refused batches and failed calls in a row before the Subplanner
    /// stops planning a task (the seed's 5).
    pub max_consecutive_errors: u32,
    pub max_answer_bytes: usize,
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
    /// Bytes one request may carry, the system prompt included (ADR-030).
    pub max_context_bytes: usize,
    /// Approximate tokens one request may carry (four bytes a token at most).
    pub max_context_tokens: u64,
    /// Earlier exchanges a request carries whole, the newest, if they fit.
    pub keep_exchanges: usize,
    /// Rounds of read-only tool calls one call may make (ADR-037); 0: no tools.
    pub max_tool_rounds: u32,
    /// Bytes of one tool result shown to the model.
    pub max_tool_result_bytes: usize,
    /// Bytes of all the tool results of one call.
    pub max_tool_bytes: usize,
}

impl Default for SubplannerConfig {
    fn default() -> Self {
        let shared = ConversationLimits::DEFAULT;
        SubplannerConfig {
            max_consecutive_errors: 5,
            max_answer_bytes: 256 * 1024,
            backoff_base_ms: 1_000,
            backoff_max_ms: 60_000,
            max_context_bytes: shared.max_context_bytes,
            max_context_tokens: shared.max_context_tokens,
            keep_exchanges: shared.keep_exchanges,
            max_tool_rounds: shared.max_tool_rounds,
            max_tool_result_bytes: shared.max_tool_result_bytes,
            max_tool_bytes: shared.max_tool_bytes,
        }
    }
}

/// A `SubplannerConfig` that cannot plan, naming the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubplannerConfigError {
    #[error("subplanner.max_consecutive_errors = 0: it must be at least 1")]
    NoErrorsAllowed,
    #[error("subplanner.max_answer_bytes = {value}: it must be at least {min}")]
    AnswerTooSmall { value: usize, min: usize },
    #[error("subplanner.backoff_base_ms ({base}) is larger than subplanner.backoff_max_ms ({max})")]
    BackoffBaseAboveMax { base: u64, max: u64 },
    #[error("subplanner.{0} = 0: it must be at least 1")]
    Zero(&'static str),
}

impl SubplannerConfig {
    pub fn validate(&self) -> Result<(), SubplannerConfigError> {
        if self.max_consecutive_errors == 0 {
            return Err(SubplannerConfigError::NoErrorsAllowed);
        }
        let min = crate::actors::planner::MIN_ANSWER_BYTES;
        if self.max_answer_bytes < min {
            return Err(SubplannerConfigError::AnswerTooSmall {
                value: self.max_answer_bytes,
                min,
            });
        }
        if self.backoff_base_ms > self.backoff_max_ms {
            return Err(SubplannerConfigError::BackoffBaseAboveMax {
                base: self.backoff_base_ms,
                max: self.backoff_max_ms,
            });
        }
        if let Some(field) = self.conversation().zero_field() {
            return Err(SubplannerConfigError::Zero(field));
        }
        Ok(())
    }

    /// Its conversation limits (see [`ConversationLimits`]).
    pub fn conversation(&self) -> ConversationLimits {
        ConversationLimits {
            max_context_bytes: self.max_context_bytes,
            max_context_tokens: self.max_context_tokens,
            keep_exchanges: self.keep_exchanges,
            max_tool_rounds: self.max_tool_rounds,
            max_tool_result_bytes: self.max_tool_result_bytes,
            max_tool_bytes: self.max_tool_bytes,
        }
    }
}
