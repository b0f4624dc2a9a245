//! The conversation limits `[planner]` and `[subplanner]` share: what one request may carry
//! (ADR-030) and what one call's read-only tools may do (ADR-037). Each section keeps the
//! six fields flat in its own TOML table (serde cannot flatten into a `deny_unknown_fields`
//! table); this is where their defaults, their checks and what they turn into live once.

use crate::llm::conversation::ContextBudget;
use crate::llm::tool_loop::ToolLimits;

/// A planner role's conversation limits: each field means what the `[planner]` and
/// `[subplanner]` field of the same name means (documented there, once per section).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConversationLimits {
    pub max_context_bytes: usize,
    pub max_context_tokens: u64,
    pub keep_exchanges: usize,
    pub max_tool_rounds: u32,
    pub max_tool_result_bytes: usize,
    pub max_tool_bytes: usize,
}

impl ConversationLimits {
    /// Both planner roles' defaults.
    pub const DEFAULT: ConversationLimits = ConversationLimits {
        max_context_bytes: 256 * 1024,
        max_context_tokens: 32_000,
        keep_exchanges: 4,
        max_tool_rounds: 8,
        max_tool_result_bytes: 16 * 1024,
        max_tool_bytes: 64 * 1024,
    };

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

    /// The first field that is 0 and must be at least 1 (`keep_exchanges` and
    /// `max_tool_rounds` may be 0), in the order a config's checks name them.
    pub fn zero_field(&self) -> Option<&'static str> {
        [
            ("max_context_bytes", self.max_context_bytes as u64),
            ("max_context_tokens", self.max_context_tokens),
            ("max_tool_result_bytes", self.max_tool_result_bytes as u64),
            ("max_tool_bytes", self.max_tool_bytes as u64),
        ]
        .into_iter()
        .find(|(_, value)| *value == 0)
        .map(|(field, _)| field)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_fields_are_named_in_order_and_the_optional_ones_may_be_zero() {
        let limits = ConversationLimits {
            keep_exchanges: 0,
            max_tool_rounds: 0,
            ..ConversationLimits::DEFAULT
        };
        assert_eq!(limits.zero_field(), None);
        let zero = ConversationLimits {
            max_context_tokens: 0,
            max_tool_bytes: 0,
            ..ConversationLimits::DEFAULT
        };
        assert_eq!(zero.zero_field(), Some("max_context_tokens"));
        assert_eq!(zero.context_budget().max_tokens, 0);
        assert_eq!(zero.tool_limits().max_call_bytes, 0);
    }
}
