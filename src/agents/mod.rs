//! The agents a worker profile can run (ADR-009): the built-in tool-using agent over any
//! provider ([`builtin`]), with its tools ([`tools`]), and external agent CLIs
//! ([`command`]); what they tell an agent about its task is here, the same for all. The
//! scripted agent lives with the scripted provider (the crate's `scripted` module).

pub mod builtin;
pub mod command;
pub mod tools;

use flotilla_actors::protocol::{Assignment, SubtaskResult, TaskId};

/// The task as every agent reads it: what to do, the scope it may change, when it is done,
/// and the branch it works on.
pub fn task_text(assignment: &Assignment) -> String {
    let spec = &assignment.task.spec;
    let mut text = format!(
        "## Your task ({})\n{}\n\nscope (the only files you may change): {}\n",
        assignment.task.task,
        spec.description,
        spec.scope.join(", ")
    );
    if !spec.acceptance.is_empty() {
        text.push_str(&format!("acceptance: {}\n", spec.acceptance));
    }
    text.push_str(&format!(
        "branch: {} (the worktree is your current directory)\n",
        assignment.branch
    ));
    text
}

/// What a synthesis is asked: the subtasks' results, each cut to 500 characters, after
/// `ask` (how this agent hands back).
pub fn synthesis_text(parent: &TaskId, ask: &str, results: &[SubtaskResult]) -> String {
    let mut text = format!(
        "## The subtasks of {parent} ended\nCheck that together they do the task, finish what is missing inside your scope, and {ask}.\n"
    );
    for r in results {
        let what = r.handoff.as_ref().map_or_else(
            || r.state.to_string(),
            |h| h.summary.chars().take(500).collect(),
        );
        text.push_str(&format!("- {} ({}): {what}\n", r.task, r.state));
    }
    text
}
