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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::protocol::{
        Assignment, AttemptFailure, PreviousAttempt, ReadyTask, Route, RunId, TaskSpec,
    };

    fn retry(failure: AttemptFailure) -> Job {
        let run = RunId::generate();
        let task = "t1".parse().unwrap();
        Job::Run(Assignment {
            run,
            branch: branch_name(run, &task, 2),
            task: ReadyTask {
                task,
                attempt: 2,
                spec: Arc::new(TaskSpec::new("write a", &["src"])),
                critical_path: 1,
                created: 0,
                budget: Default::default(),
                atomic: false,
                fix: None,
                previous: Some(Arc::new(PreviousAttempt::new(1, &failure, &[]))),
            },
            profile: "general".into(),
            route: Route::Worker,
        })
    }

    fn gate() -> AttemptFailure {
        AttemptFailure::GateFailed {
            command: "make test".into(),
            output_tail: "FAIL".into(),
        }
    }

    #[test]
    fn a_retry_continues_only_with_the_option_and_a_failure_that_allows_it() {
        let job = retry(gate());
        let Job::Run(a) = &job else { unreachable!() };
        assert_eq!(
            worktree_start(&job, true),
            WorktreeStart::Continue {
                branch: branch_name(a.run, &a.task.task, 1)
            },
            "attempt 1's branch, named by flotilla"
        );
        assert_eq!(worktree_start(&job, false), WorktreeStart::Main);
        // A stale base (and any workspace failure) starts again from main.
        let stale = retry(AttemptFailure::Workspace {
            detail: "holds dropped work".into(),
        });
        assert_eq!(worktree_start(&stale, true), WorktreeStart::Main);
    }

    #[test]
    fn the_retry_is_told_where_its_branch_started() {
        let told = |continued: Option<&str>, in_place: bool| {
            let mut job = retry(gate());
            let mut workspace = Workspace::scratch(PathBuf::from("/w"));
            workspace.continued_from = continued.map(String::from);
            started(&mut job, &mut workspace, in_place, false);
            let Job::Run(a) = job else { unreachable!() };
            a.task.previous.unwrap().start()
        };
        assert_eq!(told(Some("b"), true), Some(RetryStart::Continued));
        assert_eq!(told(None, true), Some(RetryStart::FromMain));
        assert_eq!(told(None, false), None, "off: the section is as before");
        // With keep_failed the continued branch stays for inspection.
        let mut job = retry(gate());
        let mut workspace = Workspace::scratch(PathBuf::from("/w"));
        workspace.continued_from = Some("b".into());
        started(&mut job, &mut workspace, true, true);
        assert_eq!(workspace.continued_from, None);
    }
}
