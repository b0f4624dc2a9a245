//! Claude Code's `--output-format stream-json` events: one JSON object a line. Only what
//! flotilla reads is typed; other events and fields are passed over.
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    Assistant {
        message: Message,
    },
    /// The last event of a session: its outcome, final text, usage and cost.
    Result(ResultEvent),
    /// `system` (init), `user` (tool results) and whatever a later version adds.
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
pub struct Message {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub content: Vec<Block>,
    #[serde(default)]
    pub usage: Option<Usage>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text {
        text: String,
    },
    ToolUse {
        #[serde(default)]
        id: Option<String>,
        name: String,
        /// Each tool's own arguments: free-form by nature.
        #[serde(default)]
        input: serde_json::Map<String, serde_json::Value>,
    },
    /// `thinking` and the rest.
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub cache_creation_input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
}

/// `subtype` is `success` or an error's kind (`error_max_turns`,
/// `error_during_execution`, …); `is_error` is set on every failure, a failed API
/// call included (whose subtype may still say `success`). Both are required: a result
/// event without them is not one.
#[derive(Debug, Clone, Deserialize)]
pub struct ResultEvent {
    pub subtype: String,
    pub is_error: bool,
    #[serde(default)]
    pub result: Option<String>,
    #[serde(default)]
    pub usage: Option<Usage>,
    #[serde(default)]
    pub total_cost_usd: Option<f64>,
}

#[cfg(test)]
#[path = "claude_tests.rs"]
mod tests;
