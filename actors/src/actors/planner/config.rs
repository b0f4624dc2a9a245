//! `[planner]`: the root planner's limits, checked before a run starts.

use serde::{Deserialize, Serialize};

use crate::llm::limits::ConversationLimits;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlannerConfig {
    pub max_iterations: u32,
    pub min_handoffs_for_replan: usize,
    pub max_consecutive_errors: u32,
    pub max_answer_bytes: usize,
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
    /// Characters of each handoff summary shown to the planner.
    pub max_summary_chars: usize,
    /// Bytes one request may carry, the system prompt included (ADR-030).
    pub max_context_bytes: usize,
    /// Approximate tokens one request may carry (four bytes a token at most).
    pub max_context_tokens: u64,
    /// Earlier exchanges a request carries whole, the newest, if they fit.
    pub keep_exchanges: usize,
    /// Rounds of read-only tool calls one planning call may make (ADR-037); 0: no tools.
    pub max_tool_rounds: u32,
    /// Bytes of one tool result shown to the model.
    pub max_tool_result_bytes: usize,
    /// Bytes of all the tool results of one planning call.
    pub max_tool_bytes: usize,
}

impl Default for PlannerConfig {
    fn default() -> Self {
        let shared = ConversationLimits::DEFAULT;
        PlannerConfig {
            max_iterations: 50,
            min_handoffs_for_replan: 3,
            max_consecutive_errors: 10,
            max_answer_bytes: 256 * 1024,
            backoff_base_ms: 1_000,
            backoff_max_ms: 60_000,
            max_summary_chars: 2_000,
            max_context_bytes: shared.max_context_bytes,
            max_context_tokens: shared.max_context_tokens,
            keep_exchanges: shared.keep_exchanges,
            max_tool_rounds: shared.max_tool_rounds,
            max_tool_result_bytes: shared.max_tool_result_bytes,
            max_tool_bytes: shared.max_tool_bytes,
        }
    }
}

/// The smallest `max_answer_bytes` accepted: below it, no batch of tasks fits in an answer.
pub const MIN_ANSWER_BYTES: usize = 1024;

/// A `PlannerConfig` that cannot plan, naming the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlannerConfigError {
    #[error("planner.{field} = 0: it must be at least 1")]
    Zero { field: &'static str },
    #[error("planner.max_answer_bytes = {value}: it must be at least {MIN_ANSWER_BYTES}")]
    AnswerTooSmall { value: usize },
    #[error("planner.backoff_base_ms ({base}) is larger than planner.backoff_max_ms ({max})")]
    BackoffBaseAboveMax { base: u64, max: u64 },
}

impl PlannerConfig {
    /// Checks that the planner can plan. With `max_iterations = 0` a run would "complete"
    /// without a single planner call; with `max_consecutive_errors = 0` the first error
    /// would fail it; answers too small to hold a batch are always refused.
    pub fn validate(&self) -> Result<(), PlannerConfigError> {
        let at_least_one: [(&'static str, u64); 4] = [
            ("max_iterations", self.max_iterations.into()),
            ("max_consecutive_errors", self.max_consecutive_errors.into()),
            (
                "min_handoffs_for_replan",
                self.min_handoffs_for_replan as u64,
            ),
            ("max_summary_chars", self.max_summary_chars as u64),
        ];
        let zero = at_least_one.iter().find(|(_, v)| *v == 0).map(|(f, _)| *f);
        if let Some(field) = zero.or_else(|| self.conversation().zero_field()) {
            return Err(PlannerConfigError::Zero { field });
        }
        if self.max_answer_bytes < MIN_ANSWER_BYTES {
            return Err(PlannerConfigError::AnswerTooSmall {
                value: self.max_answer_bytes,
            });
        }
        if self.backoff_base_ms > self.backoff_max_ms {
            return Err(PlannerConfigError::BackoffBaseAboveMax {
                base: self.backoff_base_ms,
                max: self.backoff_max_ms,
            });
        }
        Ok(())
    }
}

impl PlannerConfig {
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
