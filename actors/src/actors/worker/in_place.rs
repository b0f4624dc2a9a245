//! A retry in place (`[worktrees] retry_in_place`, ADR-031): where an attempt's branch
//! starts, and what its task message is told of it. The decision is recomputed from what
//! the journal folds to (the previous attempt's number and failure) and the option, so a
//! retry resumed after a restart starts from the same place; the branch name is always
//! flotilla's (`branch_name`), never an agent's or a model's.

use std::sync::Arc;

use crate::ports::{Workspace, WorktreeStart};
use crate::protocol::{FixOf, RetryStart, branch_name};

use super::Job;

/// Where a new branch for `job` starts: a conflict fix from main with the conflicting
/// branch merged in; with `retry_in_place`, a retry whose previous attempt's failure allows
/// it at that attempt's tip; everything else from main's tip.
pub(super) fn worktree_start(job: &Job, retry_in_place: bool) -> WorktreeStart {
    let Job::Run(a) = job else {
        return WorktreeStart::Main;
    };
    if let Some(FixOf::Conflict { branch, .. }) = &a.task.fix {
        return WorktreeStart::ConflictFix {
            branch: branch.clone(),
        };
    }
    match &a.task.previous {
        Some(previous) if retry_in_place && previous.continuable() => WorktreeStart::Continue {
            branch: branch_name(a.run, &a.task.task, previous.attempt()),
        },
        _ => WorktreeStart::Main,
    }
}

/// Once the worktree is made: with `retry_in_place`, the retry's task message says whether
/// it continues the failed attempt's work or starts again from main (its branch was gone,
/// or the failure does not allow continuing). With `keep_failed`, the continued branch
/// stays for inspection rather than going with this workspace.
pub(super) fn started(
    job: &mut Job,
    workspace: &mut Workspace,
    retry_in_place: bool,
    keep_failed: bool,
) {
    if let Job::Run(a) = job
        && retry_in_place
        && let Some(previous) = &a.task.previous
    {
        let start = if workspace.continued_from.is_some() {
            RetryStart::Continued
        } else {
            RetryStart::FromMain
        };
        a.task.previous = Some(Arc::new((**previous).clone().starting(start)));
    }
    if keep_failed {
        workspace.continued_from = None;
    }
}
