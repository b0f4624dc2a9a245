//! Landing work on main and keeping main green (M6, ADR-011): what the TaskGraph, the
//! MergeQueue and the Reconciler tell each other, and what their events carry.

use serde::{Deserialize, Serialize};

use super::handoff::Usage;
use super::ids::TaskId;
use super::task::Urgency;

/// Why flotilla made a fix task (`f<n>`) itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FixOf {
    /// `task`'s branch conflicts with main: the fix starts from main with the branch's work
    /// merged in and conflict markers left in `files` (its scope); when the fix lands,
    /// `task` has landed through it.
    Conflict {
        task: TaskId,
        branch: String,
        files: Vec<String>,
    },
    /// A sweep found main red: the fix makes the failures of one group pass again.
    /// `signature` identifies the problem, so a later sweep that finds it again while this
    /// fix is open does not make another one.
    Sweep { signature: String, class: String },
}

/// A commit subject for `task`'s work: `t5: ` and the first line of its description,
/// without control characters, at most 72 characters of it. Used for the commit flotilla
/// makes of what an agent left uncommitted, and for squash and merge commits on main, so
/// main's history says what each commit is for.
pub fn commit_subject(task: &TaskId, description: &str) -> String {
    const MAX_CHARS: usize = 72;
    let line: Vec<char> = description
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    if line.len() <= MAX_CHARS {
        return format!("{task}: {}", line.iter().collect::<String>());
    }
    // Cut at the last word that fits, and say that it was cut.
    let kept = &line[..MAX_CHARS - 1];
    let cut = kept
        .iter()
        .rposition(|c| c.is_whitespace())
        .filter(|&at| at > MAX_CHARS / 2)
        .unwrap_or(kept.len());
    let head: String = kept[..cut].iter().collect();
    format!("{task}: {}…", head.trim_end())
}

/// TaskGraph → MergeQueue: a task's branch is waiting to land.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandRequest {
    pub task: TaskId,
    pub attempt: u32,
    /// The attempt's branch (flotilla named it).
    pub branch: String,
    /// The commit the handoff recorded as the branch's tip.
    pub head: String,
    /// One line for squash and merge commits (the task's description, cleaned).
    pub subject: String,
    /// A fix task: lands before ordinary work; a conflict fix is squashed.
    pub fix: Option<FixOf>,
    /// Attempts before this one: each one counts the task as made a little later, so a task
    /// that keeps failing does not crowd out its equals (see the MergeQueue's ordering).
    pub retries: u32,
    /// How urgent the task is: the MergeQueue lands in Dispatch's order (ADR-032).
    #[serde(default)]
    pub urgency: Urgency,
    /// Sent again after a restart: main may hold its work already (look before building).
    pub recovered: bool,
    /// The commits a journaled `LandingIntended` said would hold this attempt's work
    /// (ADR-018): the queue looks for these on main's first-parent history before building,
    /// and only these say that the work landed (never a trailer's text).
    #[serde(default)]
    pub intended: Vec<String>,
}

/// One task's part of a landing written ahead of the compare-and-swap (ADR-018): the
/// commit flotilla built that holds `task`'s work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntendedLanding {
    pub task: TaskId,
    pub attempt: u32,
    pub commit: String,
}

/// Why a branch could not land (the MergeQueue's verdict; the graph decides what follows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LandingFailure {
    /// The gate's commands failed on the candidate built with this branch (alone, or found
    /// by bisecting a batch). The task gets another attempt while it has attempts left.
    #[error("the merge gate failed ({command}): {output_tail}")]
    GateFailed {
        command: String,
        output_tail: String,
    },
    /// The branch conflicts with main and no fix task may be made for it (it is a fix
    /// itself, or the run's conflict-fix cap is reached).
    #[error("conflicts with main in {}", files.join(", "))]
    Conflict { files: Vec<String> },
    /// The branch conflicts with main and the run has made its `cap` conflict fixes.
    #[error("conflicts with main in {} (the run's {cap} conflict fixes are used up)", files.join(", "))]
    ConflictFixCap { files: Vec<String>, cap: u32 },
    /// The branch conflicts with main in files no task's scope may hold (none a task may
    /// have, or more than `max_scope_paths`): no conflict fix can be made (ADR-024).
    /// `files` lists at most the first 10 of them.
    #[error("conflicts with main in {}; no conflict fix can be made: {why}", files.join(", "))]
    ConflictUnfixable { files: Vec<String>, why: String },
    /// The branch holds work a diverged main dropped and the user's adoption left dropped
    /// (it was started from main before the reset: ADR-024). Landing it would bring that
    /// work back, so it does not land; the task gets another attempt, from main as it is.
    #[error("{detail}")]
    StaleBase { detail: String },
    /// The conflict fix made for it did not complete.
    #[error("its conflict fix {fix} did not complete: {reason}")]
    FixFailed { fix: TaskId, reason: String },
    /// git could not read or build the branch.
    #[error("the branch could not be landed: {detail}")]
    Git { detail: String },
}

/// The merge queue's health, for the planner's follow-up messages.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeHealth {
    /// Branches waiting or being landed.
    pub queued: usize,
    pub landed: u64,
    /// Branches that conflicted or failed the gate.
    pub failed: u64,
    /// Median wait from enqueue to landing over the last landings, in milliseconds.
    pub median_wait_ms: u64,
}

impl MergeHealth {
    /// Landed over all verdicts, in percent (100 before the first verdict).
    pub fn success_percent(&self) -> u64 {
        let total = self.landed.saturating_add(self.failed);
        self.landed
            .saturating_mul(100)
            .checked_div(total)
            .unwrap_or(100)
    }
}

/// One fix a sweep asks for: a group of related failures of the highest class found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepFix {
    /// One line.
    pub title: String,
    /// What failed, deterministic and bounded (file:line:col code message …).
    pub description: String,
    /// The files involved; empty when the failure names none (the fix may touch anything).
    pub scope: Vec<String>,
    pub signature: String,
    pub class: String,
    /// The `reconciler` role's words for the fix task, when a model wrote them (ADR-032):
    /// bounded, without control characters; the facts above stay flotilla's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worded: Option<FixWording>,
}

/// What the `reconciler` role's model wrote for one fix task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FixWording {
    pub description: String,
    /// Empty: flotilla's default acceptance.
    #[serde(default)]
    pub acceptance: String,
}

/// The `reconciler` role's call for a sweep's fixes: what it cost, and why its words were
/// not used, if they were not (flotilla's own wording stands then).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WordingCall {
    pub usage: Usage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
}

/// Reconciler → TaskGraph: what one sweep of main found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepReport {
    /// Numbered by the Reconciler from 1 in each life of the run.
    pub sweep: u32,
    /// The commit swept.
    pub commit: String,
    pub green: bool,
    /// The class the fixes are for (the highest found), when red.
    pub class: Option<String>,
    /// Every failure found, of every class.
    pub failures: usize,
    /// At most `max_fix_tasks`, of the highest class only.
    pub fixes: Vec<SweepFix>,
    /// Wall time the sweep's commands took.
    pub duration_ms: u64,
    /// The finalization attempt this sweep answers, if it was asked for one.
    pub finalization: Option<u32>,
    /// The `reconciler` role's model was asked to word the fixes (journaled with the
    /// sweep, so a replay never asks again; its usage is charged to the run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wording: Option<WordingCall>,
}

/// What became of the user's own checkout when main moved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckoutSync {
    /// The repository does not have main checked out (or is bare): nothing to do.
    NotCheckedOut,
    /// It had main checked out, clean: its work tree and index now match the new tip.
    FastForwarded,
    /// Journals of older flotillas only (ADR-021 ended it): HEAD was detached at the commit
    /// the work tree was built from.
    Detached { at: String },
    /// Its index stands on `at`, an older commit of main, and the user has changes of their
    /// own in `paths`, which main changed since (or another git command held the index
    /// lock, `paths` empty): nothing was touched, HEAD stays on main (ADR-021).
    Behind { at: String, paths: Vec<String> },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_subject_is_the_first_line_cleaned_and_cut_at_a_word() {
        let t: TaskId = "t4.3".parse().unwrap();
        assert_eq!(
            commit_subject(&t, "  Write the lexer \nand more"),
            "t4.3: Write the lexer"
        );
        assert_eq!(
            commit_subject(&t, "bell\u{7}ring\u{1b}[31m"),
            "t4.3: bellring[31m"
        );
        let long = "main(): read the expression with the argument parser, evaluate it, print it with the formatter";
        let subject = commit_subject(&t, long);
        assert_eq!(
            subject,
            "t4.3: main(): read the expression with the argument parser, evaluate it,…"
        );
        assert!(subject.chars().count() <= "t4.3: ".len() + 72);
        let unbroken = "x".repeat(100);
        assert_eq!(
            commit_subject(&t, &unbroken).chars().count(),
            "t4.3: ".len() + 72
        );
        assert_eq!(commit_subject(&t, ""), "t4.3: ");
    }
}
