//! What a worker reports when it stops: a structured handoff and the artifacts it produced.
//! The status is the worker's own word and is honoured (the systems flotilla replaces
//! recorded every handoff as "complete").

use serde::{Deserialize, Serialize};

use super::task::{Budget, Usd};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HandoffStatus {
    /// Done as specified.
    Complete,
    /// Some of it done; the concerns say what is missing. Counts as completed so the planner
    /// can plan the rest.
    Partial,
    /// Cannot proceed (missing information, access, a decision). Fails without retry.
    Blocked,
    /// Tried and failed. Retried if the task has attempts left.
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Handoff {
    pub status: HandoffStatus,
    pub summary: String,
    #[serde(default)]
    pub files_changed: Vec<String>,
    #[serde(default)]
    pub concerns: Vec<String>,
    #[serde(default)]
    pub suggestions: Vec<String>,
    #[serde(default)]
    pub metrics: HandoffMetrics,
    /// Exit code of the build/test command the worker ran last, if it ran one.
    #[serde(default)]
    pub build_exit_code: Option<i32>,
}

impl Handoff {
    pub fn complete(summary: impl Into<String>) -> Self {
        Handoff {
            status: HandoffStatus::Complete,
            summary: summary.into(),
            files_changed: Vec::new(),
            concerns: Vec::new(),
            suggestions: Vec::new(),
            metrics: HandoffMetrics::default(),
            build_exit_code: None,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoffMetrics {
    pub lines_added: u64,
    pub lines_removed: u64,
    pub files_created: u64,
    pub files_modified: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub tool_calls: u64,
    pub duration_ms: u64,
    #[serde(default)]
    pub cost_usd: Usd,
}

impl HandoffMetrics {
    /// What this work consumed, in budget terms.
    pub fn spent(&self) -> Budget {
        Budget::new(
            self.tokens_in.saturating_add(self.tokens_out),
            self.cost_usd,
            self.duration_ms,
        )
    }
}

/// Tokens and money one LLM call or one task consumed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub tokens_in: u64,
    pub tokens_out: u64,
    #[serde(default)]
    pub cost_usd: Usd,
}

impl Usage {
    /// What this usage costs in budget terms: its tokens (in and out) and its money.
    pub fn spent(&self) -> Budget {
        Budget::new(
            self.tokens_in.saturating_add(self.tokens_out),
            self.cost_usd,
            0,
        )
    }
}

/// A typed output (ADR-008). The locator is interpreted by the kind: a commit sha, a
/// repo-relative path, a report's text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactRef {
    pub kind: ArtifactKind,
    pub locator: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArtifactKind {
    Commit,
    File,
    Report,
    TestResult,
}
