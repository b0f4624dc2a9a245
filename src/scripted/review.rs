//! The scripted provider's reviewer answers (ADR-038): by task, attempt and call, so a
//! scenario scripts an attempt's verdict (or a hostile answer) and CI tests the reviewer.

use std::collections::BTreeMap;

use flotilla_actors::ports::LlmCall;
use serde::{Deserialize, Serialize};

use super::{PlannerFault, PlannerStep, ScriptedToolCall};

/// A task's reviewer answers, attempt by attempt.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReviewerScript {
    #[serde(default)]
    pub attempts: Vec<ReviewerAttempt>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReviewerAttempt {
    #[serde(default)]
    pub answers: Vec<ReviewStep>,
}

/// One reviewer answer: a verdict with comments (written as the JSON answer), or the raw
/// answer text (`content`, to send what no reviewer should), or a fault.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReviewStep {
    #[serde(default)]
    pub verdict: Option<String>,
    #[serde(default)]
    pub comments: Vec<String>,
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub delay_ms: u64,
    #[serde(default)]
    pub fault: Option<PlannerFault>,
    /// Read-only tools the reviewer calls in this answer (ADR-037's, at the sealed branch).
    #[serde(default)]
    pub tool_calls: Vec<ScriptedToolCall>,
}

impl ReviewStep {
    fn into_step(self) -> PlannerStep {
        if !self.tool_calls.is_empty() {
            return PlannerStep {
                content: self.content,
                delay_ms: self.delay_ms,
                tool_calls: self.tool_calls,
                ..PlannerStep::default()
            };
        }
        let content = self.content.unwrap_or_else(|| {
            serde_json::json!({
                "verdict": self.verdict.as_deref().unwrap_or("approve"),
                "comments": self.comments,
            })
            .to_string()
        });
        PlannerStep {
            content: Some(content),
            delay_ms: self.delay_ms,
            fault: self.fault,
            ..PlannerStep::default()
        }
    }
}

/// What the reviewer's `call`-th call (of its attempt, `LlmCall::attempt`) about a task
/// gets: the scripted answer, or past the lists "approve".
pub(super) fn answer(
    scripts: &BTreeMap<String, ReviewerScript>,
    call_context: &LlmCall,
    call: usize,
) -> PlannerStep {
    call_context
        .task
        .as_ref()
        .and_then(|task| scripts.get(&task.to_string()))
        .and_then(|script| {
            let attempt = call_context.attempt?.checked_sub(1)? as usize;
            script.attempts.get(attempt)?.answers.get(call).cloned()
        })
        .unwrap_or_default()
        .into_step()
}
