//! The Subplanner's pure parts (ADR-008): what it tells the model, how it turns the model's
//! answer into a batch the TaskGraph can validate, and how it aggregates the subtasks'
//! handoffs into the parent's. Plain data in, data out: no actor, no I/O.
//!
//! `proposals_from` filters the model's tasks to the parent's scope, with a note for every
//! removal; `aggregate` builds the parent's handoff from its subtasks' results by the seed's rule.

use std::collections::{BTreeMap, HashMap};

use crate::llm::conversation::excerpt;
use crate::protocol::ScopePath;
use crate::protocol::{
    DependencyRef, FailureReason, Handoff, HandoffMetrics, HandoffStatus, Priority,
    SubtaskProposal, SubtaskResult, TaskId, TaskSpec, TaskState,
};

/// Characters of a subtask's summary shown in a follow-up (descriptions: 120).
pub const MAX_SUMMARY_CHARS: usize = 2_000;
const MAX_DESCRIPTION_CHARS: usize = 120;
/// Characters of a removed path quoted back to the model.
const MAX_PATH_SHOWN: usize = 200;
/// Files of one handoff listed in a follow-up.
const MAX_FILES_LISTED: usize = 10;

/// Notes about one answer a prompt carries at most; the rest are counted (a hostile answer
/// of many tiny tasks outside the scope made a prompt 8.4 times its size).
pub const MAX_NOTES: usize = 20;
/// Bytes of one note at most.
const MAX_NOTE_BYTES: usize = 1024;

/// Adds `new` to `notes`, bounded: at most [`MAX_NOTES`], each cut to [`MAX_NOTE_BYTES`],
/// and one line counting those left out.
pub fn push_notes(notes: &mut Vec<String>, new: impl IntoIterator<Item = String>) {
    const MORE: &str = "… and ";
    let mut more: usize = notes
        .last()
        .filter(|n| n.starts_with(MORE))
        .and_then(|n| n[MORE.len()..].split(' ').next()?.parse().ok())
        .unwrap_or(0);
    if more > 0 {
        notes.pop();
    }
    for note in new {
        if notes.len() < MAX_NOTES - 1 {
            notes.push(excerpt(&note, MAX_NOTE_BYTES).into_owned());
        } else {
            more = more.saturating_add(1);
        }
    }
    if more > 0 {
        notes.push(format!("{MORE}{more} more notes like these, not shown."));
    }
}

/// The first message about a task: the parent task, then the repository as `repo` describes
/// it (the same text the root planner gets, from [`crate::actors::planner::context::RepoContext`]).
pub fn initial_message(task: &TaskId, spec: &TaskSpec, repo: &str) -> String {
    let mut msg = String::from("## Parent task\n");
    msg.push_str(&format!("- ID: {task}\n"));
    msg.push_str(&format!("- Description: {}\n", spec.description));
    msg.push_str(&format!("- Scope: {}\n", spec.scope.join(", ")));
    msg.push_str(&format!("- Acceptance: {}\n", spec.acceptance));
    msg.push_str(&format!("- Priority: {}\n", spec.priority.get()));
    msg.push_str(&format!("- Decomposition depth: {}\n\n", task.depth()));
    msg.push_str(repo);
    msg.push_str(
        "This is the first planning call for this task. Answer with a JSON object \
         {\"scratchpad\": \"...\", \"tasks\": [...]}: the first batch of subtasks, each \
         within the parent's scope. If the task is atomic, answer with an empty tasks array: \
         a worker then takes it as it is.\n",
    );
    msg
}

/// What a follow-up carries besides the repository's changes.
#[derive(Debug)]
pub struct FollowUp<'a> {
    /// Subtasks that ended since the last call.
    pub ended: &'a [SubtaskResult],
    /// Subtasks still running, with their descriptions.
    pub active: &'a BTreeMap<TaskId, String>,
    /// What the model must hear about its last answer: why it was unusable or refused, and
    /// what was filtered out of it.
    pub notes: &'a [String],
}

/// A follow-up message: only what changed since the last call.
pub fn follow_up_message(repo: &str, follow: &FollowUp<'_>) -> String {
    let mut msg = String::from(repo);
    for note in follow.notes {
        msg.push_str(&format!("## About your last answer\n{note}\n\n"));
    }
    if !follow.ended.is_empty() {
        msg.push_str(&format!(
            "## Subtask handoffs since your last plan ({})\n",
            follow.ended.len()
        ));
        for r in follow.ended {
            push_result(&mut msg, r);
        }
    }
    if follow.active.is_empty() {
        msg.push_str("## Active subtasks\nnone\n\n");
    } else {
        msg.push_str(&format!("## Active subtasks ({})\n", follow.active.len()));
        for (id, description) in follow.active {
            let short: String = description.chars().take(MAX_DESCRIPTION_CHARS).collect();
            msg.push_str(&format!("- {id}: {short}\n"));
        }
        msg.push('\n');
    }
    msg.push_str(
        "Continue planning. Review the new handoffs, rewrite your scratchpad and answer with \
         the next batch of subtasks as JSON. Answer with an empty tasks array when the parent \
         task needs nothing more.\n",
    );
    msg
}

fn push_result(msg: &mut String, r: &SubtaskResult) {
    let Some(h) = &r.handoff else {
        let why = r
            .failure
            .as_ref()
            .map(|f| format!("why: {f}\n"))
            .unwrap_or_default();
        msg.push_str(&format!(
            "### {} ({}, {})\n{why}\n",
            r.task,
            r.state,
            status_word(result_status(r))
        ));
        return;
    };
    let summary: String = h.summary.chars().take(MAX_SUMMARY_CHARS).collect();
    msg.push_str(&format!(
        "### {} ({}, {})\nsummary: {summary}\n",
        r.task,
        r.state,
        status_word(h.status)
    ));
    let files: Vec<&str> = h
        .files_changed
        .iter()
        .take(MAX_FILES_LISTED)
        .map(String::as_str)
        .collect();
    if !files.is_empty() {
        msg.push_str(&format!("files changed: {}\n", files.join(", ")));
    }
    if !h.concerns.is_empty() {
        msg.push_str(&format!("concerns: {}\n", h.concerns.join("; ")));
    }
    if !h.suggestions.is_empty() {
        msg.push_str(&format!("suggestions: {}\n", h.suggestions.join("; ")));
    }
    for f in &h.findings {
        msg.push_str(&format!("flotilla found: {f}\n"));
    }
    msg.push('\n');
}

fn status_word(status: HandoffStatus) -> &'static str {
    match status {
        HandoffStatus::Complete => "complete",
        HandoffStatus::Partial => "partial",
        HandoffStatus::Blocked => "blocked",
        HandoffStatus::Failed => "failed",
    }
}

/// The model's tasks as a batch of subtasks, with the seed's scope filtering: a path outside
/// the parent's scope (or not a valid repo path) is removed, and a task left with no path is
/// dropped, as is a task that depends on a dropped one or names a task by id (a subtask
/// may depend only on others in its own batch; dependent work is planned after its
/// foundation's handoff). Nothing is dropped silently: every removal is returned as a note
/// for the model's next message.
pub fn proposals_from(
    tasks: Vec<TaskSpec>,
    parent_scope: &[String],
    max_path_bytes: usize,
) -> (Vec<SubtaskProposal>, Vec<String>) {
    let parent: Vec<ScopePath> = parent_scope
        .iter()
        .filter_map(|p| ScopePath::parse(p, max_path_bytes).ok())
        .collect();
    let mut notes = Vec::new();
    // First pass: which tasks survive on their own, with their filtered scopes.
    let mut kept: Vec<Option<Vec<String>>> = Vec::with_capacity(tasks.len());
    for (i, task) in tasks.iter().enumerate() {
        let (inside, outside): (Vec<&String>, Vec<&String>) = task.scope.iter().partition(|raw| {
            ScopePath::parse(raw, max_path_bytes).is_ok_and(|p| parent.iter().any(|q| q.covers(&p)))
        });
        if !outside.is_empty() {
            // A model's path can be any text: each is shown cut, so a note stays short.
            let shown: Vec<String> = outside
                .iter()
                .take(10)
                .map(|p| format!("{:?}", p.chars().take(MAX_PATH_SHOWN).collect::<String>()))
                .collect();
            notes.push(format!(
                "Task {i}: removed paths outside the parent's scope: {}.",
                shown.join(", ")
            ));
        }
        if inside.is_empty() {
            notes.push(format!(
                "Task {i} was dropped: none of its paths is inside the parent's scope."
            ));
            kept.push(None);
            continue;
        }
        if task
            .dependencies
            .iter()
            .any(|d| matches!(d, DependencyRef::Task(_)))
        {
            notes.push(format!(
                "Task {i} was dropped: it depends on a task by id. A subtask may depend only on \
                 tasks of its own batch (by index); plan work that needs another subtask after \
                 that subtask's handoff."
            ));
            kept.push(None);
            continue;
        }
        kept.push(Some(inside.into_iter().cloned().collect()));
    }
    // Dependencies on dropped tasks drop their dependents too, until nothing changes (a
    // batch is at most a few dozen tasks; out-of-range indexes are left for the graph to
    // refuse with its own reason).
    loop {
        let mut changed = false;
        for i in 0..tasks.len() {
            if kept[i].is_none() {
                continue;
            }
            let dropped_dep = tasks[i].dependencies.iter().find_map(|d| match d {
                DependencyRef::Batch(j) if *j < kept.len() && kept[*j].is_none() => Some(*j),
                _ => None,
            });
            if let Some(j) = dropped_dep {
                notes.push(format!(
                    "Task {i} was dropped: it depends on task {j}, which was dropped."
                ));
                kept[i] = None;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let new_index: HashMap<usize, usize> = kept
        .iter()
        .enumerate()
        .filter(|(_, k)| k.is_some())
        .enumerate()
        .map(|(new, (old, _))| (old, new))
        .collect();
    let proposals = tasks
        .into_iter()
        .zip(kept)
        .filter_map(|(task, scope)| {
            let scope = scope?;
            let depends_on = task
                .dependencies
                .iter()
                .filter_map(|d| match d {
                    // An index past the batch stays past it, for the graph to refuse.
                    DependencyRef::Batch(j) => Some(new_index.get(j).copied().unwrap_or(*j)),
                    DependencyRef::Task(_) => None,
                })
                .collect();
            Some(SubtaskProposal {
                description: task.description,
                scope,
                acceptance: task.acceptance,
                capabilities: task.capabilities,
                depends_on,
                budget_cap: task.budget,
                expected_outputs: task.expected_outputs,
                // The seed inherits the parent's priority when the model names none.
                priority: (task.priority != Priority::default()).then_some(task.priority),
            })
        })
        .collect();
    (proposals, notes)
}

/// What a subtask's result counts as: its handoff's status when it completed, blocked when
/// its worker said so (or it was cancelled: it did nothing), failed otherwise.
fn result_status(r: &SubtaskResult) -> HandoffStatus {
    match (r.state, r.handoff.as_ref().map(|h| h.status), &r.failure) {
        (TaskState::Completed, Some(status), _) => status,
        (TaskState::Completed, None, _) => HandoffStatus::Complete,
        (TaskState::Failed, Some(HandoffStatus::Blocked), _)
        | (TaskState::Failed, _, Some(FailureReason::Blocked { .. })) => HandoffStatus::Blocked,
        (TaskState::Failed, _, _) => HandoffStatus::Failed,
        _ => HandoffStatus::Blocked,
    }
}

/// The parent's handoff, aggregated from its subtasks' results by the seed's rule:
/// complete if every subtask completed its work; failed if every one failed; partial if
/// some work was done; blocked otherwise. A subtask's own status counts (a completed task
/// whose handoff says `partial` did some of its work, not all of it); a subtask that was
/// cancelled did nothing. Files are unioned (in first-seen order), concerns and suggestions
/// prefixed with their subtask's id, metrics summed (saturating: a model's numbers must not
/// wrap) and the duration is the longest subtask's, since subtasks run side by side.
pub fn aggregate(parent_description: &str, results: &[SubtaskResult]) -> Handoff {
    let status_of = result_status;
    let total = results.len();
    let complete = results
        .iter()
        .filter(|r| status_of(r) == HandoffStatus::Complete)
        .count();
    let failed = results
        .iter()
        .filter(|r| status_of(r) == HandoffStatus::Failed)
        .count();
    let some_work = results.iter().any(|r| {
        matches!(
            status_of(r),
            HandoffStatus::Complete | HandoffStatus::Partial
        )
    });
    let status = if total > 0 && complete == total {
        HandoffStatus::Complete
    } else if total > 0 && failed == total {
        HandoffStatus::Failed
    } else if some_work {
        HandoffStatus::Partial
    } else {
        HandoffStatus::Blocked
    };
    let mut summary = format!(
        "Decomposed \"{parent_description}\" into {total} subtasks: {complete} complete, {failed} failed, {} other.",
        total - complete - failed
    );
    let mut files_changed: Vec<String> = Vec::new();
    let mut concerns = Vec::new();
    let mut suggestions = Vec::new();
    let mut metrics = HandoffMetrics::default();
    let mut build_exit_code = None;
    let mut findings = Vec::new();
    for r in results {
        let word = status_word(status_of(r));
        let Some(h) = &r.handoff else {
            let what = r
                .failure
                .as_ref()
                .map_or_else(|| r.state.to_string(), |f| format!("{}: {f}", r.state));
            summary.push_str(&format!("\n[{}] ({word}): {what}", r.task));
            continue;
        };
        summary.push_str(&format!("\n[{}] ({word}): {}", r.task, h.summary));
        for f in &h.files_changed {
            if !files_changed.contains(f) {
                files_changed.push(f.clone());
            }
        }
        concerns.extend(h.concerns.iter().map(|c| format!("[{}] {c}", r.task)));
        suggestions.extend(h.suggestions.iter().map(|s| format!("[{}] {s}", r.task)));
        let m = &h.metrics;
        metrics.lines_added = metrics.lines_added.saturating_add(m.lines_added);
        metrics.lines_removed = metrics.lines_removed.saturating_add(m.lines_removed);
        metrics.files_created = metrics.files_created.saturating_add(m.files_created);
        metrics.files_modified = metrics.files_modified.saturating_add(m.files_modified);
        metrics.files_deleted = metrics.files_deleted.saturating_add(m.files_deleted);
        metrics.tokens_in = metrics.tokens_in.saturating_add(m.tokens_in);
        metrics.tokens_out = metrics.tokens_out.saturating_add(m.tokens_out);
        metrics.tool_calls = metrics.tool_calls.saturating_add(m.tool_calls);
        metrics.cost_usd = metrics.cost_usd.saturating_add(m.cost_usd);
        metrics.duration_ms = metrics.duration_ms.max(m.duration_ms);
        // The worst build a subtask reported: any failure is the parent's failure.
        if let Some(code) = h.build_exit_code
            && build_exit_code.is_none_or(|worst| worst == 0)
        {
            build_exit_code = Some(code);
        }
        // What flotilla found in a subtask's branch is the parent's to report too.
        findings.extend(h.findings.iter().cloned());
    }
    Handoff {
        status,
        summary,
        files_changed,
        concerns,
        suggestions,
        metrics,
        build_exit_code,
        // A decomposed parent has no branch of its own: its subtasks' branches hold the work.
        work: None,
        findings,
    }
}

#[cfg(test)]
#[path = "context_tests.rs"]
mod tests;
