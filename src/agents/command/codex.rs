//! Codex's `codex exec --json` events (codex-rs `exec_events.rs`): one JSON object a line.
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
pub enum Event {
    #[serde(rename = "turn.started")]
    TurnStarted,
    /// The turn's usage: the session's running totals.
    #[serde(rename = "turn.completed")]
    TurnCompleted { usage: Usage },
    #[serde(rename = "turn.failed")]
    TurnFailed { error: ErrorMessage },
    #[serde(rename = "item.started")]
    ItemStarted { item: Item },
    #[serde(rename = "item.updated")]
    ItemUpdated { item: Item },
    #[serde(rename = "item.completed")]
    ItemCompleted { item: Item },
    /// An unrecoverable error of the stream.
    #[serde(rename = "error")]
    Error(ErrorMessage),
    /// `thread.started` and whatever a later version adds.
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ErrorMessage {
    pub message: String,
}

#[derive(Debug, Deserialize)]
pub struct Item {
    pub id: String,
    #[serde(flatten)]
    pub details: Details,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Details {
    AgentMessage {
        text: String,
    },
    CommandExecution {
        command: String,
    },
    FileChange {
        changes: Vec<FileChange>,
    },
    McpToolCall {
        server: String,
        tool: String,
    },
    WebSearch {
        query: String,
    },
    /// A non-fatal error.
    Error {
        message: String,
    },
    /// `reasoning`, `todo_list`, `plan` and whatever a later version adds.
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
pub struct FileChange {
    pub path: String,
}

#[cfg(test)]
#[path = "codex_tests.rs"]
mod tests;
