//! What a planner's read-only tools did in one round of a planning call (ADR-037): the calls
//! the model asked for and what each returned, journaled (`ToolsRan`) so that a resumed
//! call replays them instead of reading again.

use serde::{Deserialize, Serialize};

use super::handoff::Usage;
use super::ids::TaskId;
use super::work::Role;

/// One tool call and what it returned (the text the model was shown, bounded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolRun {
    /// The provider's id pairing the call with its result.
    pub id: String,
    pub name: String,
    /// The model's raw arguments (untrusted; cut to a bound before they are kept).
    pub arguments: String,
    pub result: String,
}

/// One round of tools in one planning call: the model's turn that asked for them and
/// their results, read at `commit` (the call's pinned tip of main).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolRound {
    /// `Planner` or `Subplanner`.
    pub role: Role,
    /// The Subplanner's task (none for the root planner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskId>,
    /// The Subplanner's attempt at the task (0 for the root planner).
    #[serde(default)]
    pub attempt: u32,
    /// The planning call (its place in the conversation) the round belongs to.
    pub call: u32,
    /// The round's place in the call (0 first).
    pub round: u32,
    pub commit: String,
    /// What the model said beside its calls.
    #[serde(default)]
    pub content: String,
    pub runs: Vec<ToolRun>,
    /// What the model call that asked for the tools used: charged with the call's answer.
    #[serde(default)]
    pub usage: Usage,
}

impl ToolRound {
    /// Whether the round belongs to the conversation `role`/`task`/`attempt`.
    pub fn of(&self, role: Role, task: Option<&TaskId>, attempt: u32) -> bool {
        self.role == role && self.task.as_ref() == task && self.attempt == attempt
    }
}
