//! `[subplanner]`: the Subplanner's limits, checked before a run starts.

use serde::{Deserialize, Serialize};

use crate::llm::conversation::ContextBudget;
use crate::llm::tool_loop::ToolLimits;

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
        SubplannerConfig {
            max_consecutive_errors: 5,
            max_answer_bytes: 256 * 1024,
            backoff_base_ms: 1_000,
            backoff_max_ms: 60_000,
            max_context_bytes: 256 * 1024,
            max_context_tokens: 32_000,
            keep_exchanges: 4,
            max_tool_rounds: 8,
            max_tool_result_bytes: 16 * 1024,
            max_tool_bytes: 64 * 1024,
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
        if self.max_context_bytes == 0 {
            return Err(SubplannerConfigError::Zero("max_context_bytes"));
        }
        if self.max_context_tokens == 0 {
            return Err(SubplannerConfigError::Zero("max_context_tokens"));
        }
        if self.max_tool_result_bytes == 0 {
            return Err(SubplannerConfigError::Zero("max_tool_result_bytes"));
        }
        if self.max_tool_bytes == 0 {
            return Err(SubplannerConfigError::Zero("max_tool_bytes"));
        }
        Ok(())
    }

    /// What one request may carry.
    pub fn context_budget(&self) -> ContextBudget {
        ContextBudget {
            max_bytes: self.max_context_bytes,
            max_tokens: self.max_context_tokens,
            keep_recent: self.keep_exchanges,
        }
    }

    /// What one call's read-only tools may do.
    pub fn tool_limits(&self) -> ToolLimits {
        ToolLimits {
            max_rounds: self.max_tool_rounds,
            max_result_bytes: self.max_tool_result_bytes,
            max_call_bytes: self.max_tool_bytes,
        }
    }
}
