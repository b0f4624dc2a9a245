//! Landing (M6, ADR-011): a completed task's branch goes through the merge queue before the
//! task is `Completed`; conflicts become conflict fixes (never a fix for a fix); a red main
//! becomes sweep fixes; and a run ends only when a sweep of main is green (finalization).
//!
//! The one readiness rule stays in `settle`: a dependent becomes ready when its
//! dependencies are `Completed`, and with merging on, `Completed` means "on main".
//!
//! On only when `RunGraph::merging()`. Sweep fixes are deduplicated by failure signature and
//! capped; conflict fixes are `f<n>` tasks, capped; finalization rounds repeat until a green
//! sweep of main's current tip.

use std::collections::VecDeque;

use super::{Emitted, GraphError, RunGraph};
use crate::protocol::ScopePath;
use crate::protocol::{
    AttemptFailure, Budget, CheckoutSync, EventKind, FailureReason, FixOf, Handoff,
    IntendedLanding, LandRequest, LandingFailure, Priority, RunOutcome, SweepReport, TaskId,
    TaskSpec, TaskState, Urgency, commit_subject,
};

/// How many of main's clashing commits a conflict fix's description lists.
const CLASHING_SHOWN: usize = 10;

impl RunGraph {
    /// The branch and tip a completion must land, when merging is on and the handoff's
    /// branch has commits. An attempt without commits has nothing to land.
    pub(super) fn lands(&self, handoff: Option<&Handoff>) -> Option<(String, String)> {
        if !self.merging {
            return None;
        }
        let work = handoff?.work.as_deref()?;
        (!work.head.is_empty() && work.head != work.base && !work.branch.is_empty())
            .then(|| (work.branch.clone(), work.head.clone()))
    }

    /// What the MergeQueue needs to land `task` (which must be `Landing`).
    pub fn land_request(&self, task: &TaskId, recovered: bool) -> Option<LandRequest> {
        let node = self.task(task)?;
        // A held landing waits for the user's decision (ADR-016).
        if node.state != TaskState::Landing || node.landing_held {
            return None;
        }
        let (branch, head) = node.landing.as_deref()?.clone();
        Some(LandRequest {
            task: task.clone(),
            attempt: node.attempt,
            branch,
            head,
            subject: commit_subject(task, &node.spec.description),
            fix: node.fix.as_deref().cloned(),
            retries: node.attempt.saturating_sub(1),
            urgency: Urgency {
                priority: node.spec.priority,
                critical_path: node.critical_path,
                created: node.created,
            },
            recovered,
            intended: self.intents.get(task).cloned().unwrap_or_default(),
        })
    }

    /// The merge queue is about to move main from `from` to `to` (ADR-018): journaled
    /// before the compare-and-swap, so that after a crash the commits named here, and only
    /// these, can say that a task's work reached main.
    pub fn landing_intended(
        &mut self,
        from: String,
        to: String,
        landed: Vec<IntendedLanding>,
    ) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        self.emit(&mut out, EventKind::LandingIntended { from, to, landed })?;
        Ok(out)
    }

    /// After a restart, the merge queue found `commit` on main's first-parent history for
    /// `task`. It counts only when the journal named that commit ahead of a
    /// compare-and-swap for this task: anything else (a trailer an agent wrote, a commit
    /// someone else made) is not evidence, and the task stays where it is.
    pub fn found_on_main(
        &mut self,
        task: &TaskId,
        attempt: u32,
        commit: &str,
    ) -> Result<Emitted, GraphError> {
        let intended = self
            .intents
            .get(task)
            .is_some_and(|commits| commits.iter().any(|c| c == commit));
        if !intended {
            let mut out = Vec::new();
            self.ignore(
                &mut out,
                Some(task),
                "FoundOnMain",
                format!("{commit} was never journaled as holding this task's work"),
            );
            return Ok(out);
        }
        let mut out = Vec::new();
        // The compare-and-swap of the last intent happened: main was moved to its tip by
        // flotilla, which `MainMoved` never said (the crash came first). Said now, so that
        // "the tip flotilla last wrote" stays true for the main-moved check and the
        // finalization's sweep.
        if let Some(intent) = self.last_intent.as_deref()
            && intent.1.iter().any(|c| c == commit)
            && self.main_tip.as_deref() != Some(intent.0.as_str())
        {
            let moved = EventKind::MainMoved {
                from: self.main_tip.clone().unwrap_or_default(),
                to: intent.0.clone(),
                tasks: vec![task.clone()],
                checkout: CheckoutSync::NotCheckedOut,
            };
            self.emit(&mut out, moved)?;
        }
        out.extend(self.landed(task, attempt, commit)?);
        Ok(out)
    }

    /// The tasks whose branches wait in the merge queue, for a restart to enqueue again:
    /// every `Landing` task except those waiting for their conflict fix (their branch lands
    /// through the fix, or fails with it; enqueued again it would conflict again and ask
    /// for a second fix, and the fix's landing would delete the branch under it).
    pub fn landing_tasks(&self) -> Vec<TaskId> {
        self.tasks_in(TaskState::Landing)
            .into_iter()
            .filter(|t| !self.waits_for_its_fix(t))
            .collect()
    }

    /// `task` is `Landing` and a conflict fix made for it has not ended.
    pub fn waits_for_its_fix(&self, task: &TaskId) -> bool {
        let Some(node) = self.task(task) else {
            return false;
        };
        node.state == TaskState::Landing
            && node
                .fixed_by
                .is_some_and(|fix| !self.dag[fix].state.is_terminal())
    }

    /// The merge queue put `task`'s work on main in `commit`. A conflict fix lands the task
    /// it fixes with it.
    pub fn landed(
        &mut self,
        task: &TaskId,
        attempt: u32,
        commit: &str,
    ) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        let Some(ix) = self.current(&mut out, task, attempt, "TaskLanded", &[TaskState::Landing])
        else {
            return Ok(out);
        };
        self.emit(
            &mut out,
            EventKind::TaskLanded {
                task: task.clone(),
                commit: commit.into(),
                via: None,
            },
        )?;
        let mut work = VecDeque::from([ix]);
        if let Some(FixOf::Conflict { task: of, .. }) = self.dag[ix].fix.as_deref().cloned() {
            let of_ix = self.ix(&of)?;
            if self.dag[of_ix].state == TaskState::Landing {
                self.emit(
                    &mut out,
                    EventKind::TaskLanded {
                        task: of,
                        commit: commit.into(),
                        via: Some(task.clone()),
                    },
                )?;
                work.push_back(of_ix);
            }
        }
        self.settle(&mut out, work)?;
        Ok(out)
    }

    /// `task`'s branch conflicts with main. A conflict fix carries both intents, unless the
    /// task is a fix itself (no fix for a fix: the cascade the anchor suffered) or the run's
    /// conflict fixes are used up; then the task fails with the files.
    pub fn landing_conflict(
        &mut self,
        task: &TaskId,
        attempt: u32,
        files: Vec<String>,
        clashing: Vec<String>,
    ) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        let Some(ix) = self.current(
            &mut out,
            task,
            attempt,
            "LandingConflict",
            &[TaskState::Landing],
        ) else {
            return Ok(out);
        };
        self.emit(
            &mut out,
            EventKind::MergeConflict {
                task: task.clone(),
                files: files.clone(),
                clashing: clashing.clone(),
                retrying: false,
            },
        )?;
        if self.dag[ix].fix.is_some() {
            let why = LandingFailure::Conflict { files };
            self.fail_and_settle(&mut out, ix, FailureReason::NotLanded { why })?;
            return Ok(out);
        }
        if self.conflict_fixes >= self.limits.max_conflict_fixes {
            let why = LandingFailure::ConflictFixCap {
                files,
                cap: self.limits.max_conflict_fixes,
            };
            self.fail_and_settle(&mut out, ix, FailureReason::NotLanded { why })?;
            return Ok(out);
        }
        let node = &self.dag[ix];
        let Some((branch, _)) = node.landing.as_deref().cloned() else {
            let why = LandingFailure::Git {
                detail: "the task has no branch to fix".into(),
            };
            self.fail_and_settle(&mut out, ix, FailureReason::NotLanded { why })?;
            return Ok(out);
        };
        // Validated as any task's scope (git's file names come from the branch, which an
        // agent wrote): a conflict no task may hold fails its task with the reason.
        let scope = match conflict_fix_scope(
            &files,
            self.limits.max_scope_paths,
            self.limits.max_path_bytes,
        ) {
            Ok(scope) => scope,
            Err(why) => {
                let files = files.iter().take(CLASHING_SHOWN).cloned().collect();
                let why = LandingFailure::ConflictUnfixable {
                    files,
                    why: why.to_string(),
                };
                self.fail_and_settle(&mut out, ix, FailureReason::NotLanded { why })?;
                return Ok(out);
            }
        };
        let mut description = format!(
            "Resolve the merge conflict between {task} and main, keeping both intents.\n\n\
             Your worktree holds main with {task}'s work merged in; git could not merge these \
             files, which now hold conflict markers: {}.\n\n{task}'s task was:\n{}\n\n\
             main's commits it clashes with:\n",
            files.join(", "),
            node.spec.description
        );
        for c in clashing.iter().take(CLASHING_SHOWN) {
            description.push_str(&format!("- {c}\n"));
        }
        description.push_str(
            "\nRemove every conflict marker, keep what each side meant, and change nothing else.",
        );
        let spec = TaskSpec {
            priority: Priority::MOST_URGENT,
            acceptance: "No conflict markers remain; the build and tests pass.".into(),
            ..TaskSpec::new(cut(description, self.limits.max_description_bytes), &[])
        };
        let fix = FixOf::Conflict {
            task: task.clone(),
            branch,
            files,
        };
        self.add_fix(&mut out, spec, scope, fix)?;
        Ok(out)
    }

    /// The merge queue gave up on `task`'s branch. A gate failure is the attempt's: the
    /// task is tried again while it has attempts left (a parent, whose subtasks are spent,
    /// is not). Anything else fails the task.
    pub fn landing_failed(
        &mut self,
        task: &TaskId,
        attempt: u32,
        failure: LandingFailure,
    ) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        let Some(ix) = self.current(
            &mut out,
            task,
            attempt,
            "LandingFailed",
            &[TaskState::Landing],
        ) else {
            return Ok(out);
        };
        match failure {
            LandingFailure::GateFailed {
                command,
                output_tail,
            } => {
                let failure = AttemptFailure::GateFailed {
                    command,
                    output_tail,
                };
                // What the delivery's checks found (a failed verification) goes to the
                // retry with the gate's output (ADR-031).
                let findings = self.dag[ix]
                    .handoff
                    .as_ref()
                    .map(|h| h.findings.clone())
                    .unwrap_or_default();
                self.fail_attempt_with(&mut out, ix, attempt, failure, findings)?;
            }
            // Its work is redone from main as it is (ADR-024).
            LandingFailure::StaleBase { detail } => {
                let failure = AttemptFailure::Workspace { detail };
                self.fail_attempt(&mut out, ix, attempt, failure)?;
            }
            why => self.fail_and_settle(&mut out, ix, FailureReason::NotLanded { why })?,
        }
        Ok(out)
    }

    /// A note from the merge queue that changes no task (a conflict it retries, a failed
    /// gate run, main moving): journaled for the tail. Other kinds are refused.
    pub fn merge_noted(&mut self, note: EventKind) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        match note {
            EventKind::MergeConflict { .. }
            | EventKind::MergeGateFailed { .. }
            | EventKind::MainMoved { .. }
            | EventKind::MainDiverged { .. } => self.emit(&mut out, note)?,
            other => self.ignore(
                &mut out,
                None,
                "MergeNote",
                format!("{} is not a merge note", other.name()),
            ),
        }
        Ok(out)
    }

    /// A sweep of main ended. Red: a fix task for each group no open fix covers (within the
    /// caps). A finalization round's answer decides the run when nothing is left to do.
    pub fn sweep_finished(&mut self, report: SweepReport) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        if self.outcome.is_some() {
            self.ignore(
                &mut out,
                None,
                "SweepFinished",
                "the run has already finished".into(),
            );
            return Ok(out);
        }
        let fixes = report.fixes.clone();
        let green = report.green;
        let finalization = report.finalization;
        self.emit(&mut out, EventKind::SweepFinished { report })?;
        let mut added = 0u32;
        if !green {
            for fix in fixes
                .into_iter()
                .take(self.limits.max_fix_tasks_per_sweep as usize)
            {
                if self.open_sweep_fixes.contains_key(&fix.signature)
                    || self.sweep_fixes >= self.limits.max_sweep_fixes
                {
                    continue;
                }
                // Validated as any task's scope: the sweep's output is untrusted.
                let scope = match crate::failures::fix_scope(
                    &fix.scope,
                    self.limits.max_scope_paths,
                    self.limits.max_path_bytes,
                ) {
                    Ok(scope) => scope,
                    Err(why) => {
                        let why = format!("no fix task for \"{}\": {why}", fix.title);
                        self.ignore(&mut out, None, "SweepFix", why);
                        continue;
                    }
                };
                // The `reconciler` role's words lead when a model wrote them (ADR-032); what
                // the sweep found stays in, as flotilla read it.
                let (worded, acceptance) = match &fix.worded {
                    Some(w) => (
                        format!("{}\n\n", w.description),
                        (!w.acceptance.trim().is_empty()).then(|| w.acceptance.clone()),
                    ),
                    None => (String::new(), None),
                };
                let description = format!(
                    "main is red: {}\n\n{worded}The Reconciler's sweep of main found:\n{}\n\n\
                     Fix these failures at their cause; do not disable or delete tests.",
                    fix.title, fix.description
                );
                let spec = TaskSpec {
                    priority: Priority::MOST_URGENT,
                    acceptance: acceptance.unwrap_or_else(|| {
                        "The sweep's build, type check and tests pass for these files.".into()
                    }),
                    ..TaskSpec::new(cut(description, self.limits.max_description_bytes), &[])
                };
                let of = FixOf::Sweep {
                    signature: fix.signature,
                    class: fix.class,
                };
                self.add_fix(&mut out, spec, scope, of)?;
                added += 1;
            }
        }
        if self.planning_finished && self.live == 0 && self.outcome.is_none() {
            let stuck = !green && added == 0 && finalization.is_some();
            if stuck {
                let why = format!(
                    "main is red and no fix task can be made for it (the run's {} sweep \
                     fixes are used up, every problem already had one, or none could be \
                     scoped): {}",
                    self.limits.max_sweep_fixes,
                    self.last_red.clone().unwrap_or_default()
                );
                self.emit(
                    &mut out,
                    EventKind::RunFinished {
                        outcome: RunOutcome::Failed,
                        reason: Some(why),
                    },
                )?;
            } else {
                self.settle(&mut out, VecDeque::new())?;
            }
        }
        Ok(out)
    }

    /// A sweep was discarded because main moved while it ran.
    pub fn sweep_stale(&mut self, sweep: u32, commit: &str) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        self.emit(
            &mut out,
            EventKind::SweepStale {
                sweep,
                commit: commit.into(),
            },
        )?;
        Ok(out)
    }

    /// The end of a run whose tasks all ended well, with merging on: a green sweep after
    /// the last landing finishes it; otherwise another finalization round, up to the cap.
    pub(super) fn finalize(&mut self, out: &mut Emitted) -> Result<(), GraphError> {
        if self.awaiting_sweep {
            return Ok(());
        }
        if self.finalization > 0 && self.last_sweep_green == Some(true) {
            return self.emit(
                out,
                EventKind::RunFinished {
                    outcome: RunOutcome::Completed,
                    reason: None,
                },
            );
        }
        if self.finalization < self.limits.max_finalization_attempts {
            let attempt = self.finalization.saturating_add(1);
            return self.emit(out, EventKind::FinalizationStarted { attempt });
        }
        let why = format!(
            "main is still red after {} finalization rounds: {}",
            self.finalization,
            self.last_red
                .clone()
                .unwrap_or_else(|| "no sweep answered".into())
        );
        self.emit(
            out,
            EventKind::RunFinished {
                outcome: RunOutcome::Failed,
                reason: Some(why),
            },
        )
    }

    /// The user adopts main's `tip` in place of `expected` after main diverged (ADR-024).
    /// Only while landing is paused on that divergence: `tip` becomes the tip flotilla last
    /// wrote, and `dropped` (landed tasks whose commits `tip` lacks) is said, not replayed.
    pub fn main_adopted(
        &mut self,
        expected: String,
        tip: String,
        dropped: Vec<TaskId>,
    ) -> Result<Emitted, GraphError> {
        let mut out = Vec::new();
        let paused_on = self.diverged.as_deref().map(|(e, _)| e.as_str());
        if self.outcome.is_some() || paused_on != Some(expected.as_str()) {
            let why = match paused_on {
                _ if self.outcome.is_some() => "the run has already finished".to_string(),
                Some(other) => format!("landing paused on {other}, not on {expected}"),
                None => "main has not diverged: landing is not paused".to_string(),
            };
            self.ignore(&mut out, None, "AdoptMain", why);
            return Ok(out);
        }
        self.emit(
            &mut out,
            EventKind::MainAdopted {
                expected,
                tip,
                dropped,
            },
        )?;
        Ok(out)
    }

    /// The user asks to adopt main (ADR-024): the tip landing paused on and every landed
    /// task's commit, for the merge queue to check against main; or, when landing is not
    /// paused on a divergence, the `MessageIgnored` that says so.
    pub fn adopt_main_asked(&self) -> Result<(String, Vec<(TaskId, String)>), Emitted> {
        match self.diverged.as_deref() {
            Some((expected, _)) if self.outcome.is_none() => {
                Ok((expected.clone(), self.landed_commits.clone()))
            }
            _ => {
                let mut out = Vec::new();
                let why = if self.outcome.is_some() {
                    "the run has already finished"
                } else {
                    "main has not diverged: landing is not paused"
                };
                self.ignore(&mut out, None, "AdoptMain", why.into());
                Err(out)
            }
        }
    }

    /// Where landing paused: (the tip flotilla last wrote, main's tip that does not contain
    /// it), while main has diverged and the user has not acted.
    pub fn diverged(&self) -> Option<(&str, &str)> {
        self.diverged
            .as_deref()
            .map(|(expected, actual)| (expected.as_str(), actual.as_str()))
    }

    /// The commits of landed work that an adopted main dropped (ADR-024).
    pub fn dropped_commits(&self) -> &[String] {
        &self.dropped_commits
    }

    /// Every landed task with the commit that holds its work, in landing order.
    pub fn landed_commits(&self) -> &[(TaskId, String)] {
        &self.landed_commits
    }

    /// The tip flotilla last moved main to (journaled by `MainMoved`), if it moved it.
    pub fn main_tip(&self) -> Option<String> {
        self.main_tip.clone()
    }

    /// Whether a finalization round waits for its sweep (for a restart to ask again).
    pub fn awaiting_final_sweep(&self) -> Option<u32> {
        (self.awaiting_sweep && self.outcome.is_none()).then_some(self.finalization)
    }

    /// A conflict fix that completed without landing (its diff was empty: nothing was left
    /// to resolve, because what its task clashed with had not landed when the fix started)
    /// sends its task's own branch back to the queue, which lands it or reports a conflict
    /// again. Without this the task would stay `Landing` for ever.
    pub(super) fn fix_landed_nothing(
        &mut self,
        out: &mut Emitted,
        fix: petgraph::graph::NodeIndex,
    ) -> Result<(), GraphError> {
        let Some(FixOf::Conflict { task, .. }) = self.dag[fix].fix.as_deref().cloned() else {
            return Ok(());
        };
        let of = self.ix(&task)?;
        if self.dag[of].state != TaskState::Landing || self.dag[of].fixed_by != Some(fix) {
            return Ok(());
        }
        let fix = self.dag[fix].id.clone();
        self.emit(out, EventKind::LandingRequeued { task, fix })
    }

    /// A conflict fix that did not complete takes the task it was fixing down with it.
    pub(super) fn fix_ended_badly(
        &mut self,
        out: &mut Emitted,
        fix: petgraph::graph::NodeIndex,
        work: &mut VecDeque<petgraph::graph::NodeIndex>,
    ) -> Result<(), GraphError> {
        let Some(FixOf::Conflict { task, .. }) = self.dag[fix].fix.as_deref().cloned() else {
            return Ok(());
        };
        let of = self.ix(&task)?;
        if self.dag[of].state != TaskState::Landing {
            return Ok(());
        }
        let fix_node = &self.dag[fix];
        let reason = match fix_node.failure.as_deref() {
            Some(f) => f.to_string(),
            None => format!("it is {}", fix_node.state),
        };
        let why = LandingFailure::FixFailed {
            fix: fix_node.id.clone(),
            reason,
        };
        let event = EventKind::TaskFailed {
            task,
            attempt: self.dag[of].attempt,
            reason: FailureReason::NotLanded { why },
        };
        self.emit(out, event)?;
        work.push_back(of);
        Ok(())
    }

    fn add_fix(
        &mut self,
        out: &mut Emitted,
        spec: TaskSpec,
        scope: Vec<String>,
        fix: FixOf,
    ) -> Result<(), GraphError> {
        let id = TaskId::fix(self.next_fix);
        let spec = TaskSpec { scope, ..spec };
        let budget = self
            .limits
            .default_budget
            .min_each(&self.limits.max_task_budget);
        self.emit(
            out,
            EventKind::FixTaskAdded {
                task: id.clone(),
                spec,
                budget,
                fix,
            },
        )?;
        let mut work = VecDeque::new();
        self.settle_new(out, &id, &mut work)?;
        Ok(())
    }
}

/// The paths of `files` a task's scope can hold (repo-relative, no `..`, within the size
/// cap), normalized; the rest are left out.
fn valid_scope(files: &[String], max_path_bytes: usize) -> Vec<String> {
    let mut scope: Vec<String> = files
        .iter()
        .filter_map(|f| ScopePath::parse(f, max_path_bytes).ok())
        .map(|p| p.to_string())
        .collect();
    scope.sort();
    scope.dedup();
    scope
}

/// A conflict fix's scope, checked as any task's (ADR-024): the conflicting files a scope
/// may hold ([`valid_scope`]), at least one and at most `max_paths`. `Err` says why no fix
/// task can be made.
fn conflict_fix_scope(
    files: &[String],
    max_paths: usize,
    max_path_bytes: usize,
) -> Result<Vec<String>, ConflictScopeError> {
    let scope = valid_scope(files, max_path_bytes);
    if scope.is_empty() {
        return Err(if files.is_empty() {
            ConflictScopeError::NoFile
        } else {
            ConflictScopeError::NoneAllowed {
                conflicting: files.len(),
            }
        });
    }
    if scope.len() > max_paths {
        return Err(ConflictScopeError::TooMany {
            files: scope.len(),
            max_paths,
        });
    }
    Ok(scope)
}

/// Why no conflict fix can be made ([`conflict_fix_scope`]). Its text is the `why` of the
/// journaled [`LandingFailure::ConflictUnfixable`] (the journal's format: a string).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum ConflictScopeError {
    #[error(
        "git named no conflicting file, and a fix task with an empty scope could change \
         any file without holding a lock"
    )]
    NoFile,
    #[error(
        "none of the {conflicting} conflicting files may be in a task's scope (absolute, \
         outside the repository or inside .git)"
    )]
    NoneAllowed { conflicting: usize },
    #[error(
        "{files} files conflict, more than a task's scope may hold ({max_paths}, \
         limits.max_scope_paths)"
    )]
    TooMany { files: usize, max_paths: usize },
}

/// `text` cut to at most `max` bytes on a character boundary.
fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

impl Budget {
    /// The smaller of each dimension.
    fn min_each(&self, other: &Budget) -> Budget {
        Budget::new(
            self.tokens.min(other.tokens),
            self.cost_usd.min(other.cost_usd),
            self.wall_time_ms.min(other.wall_time_ms),
        )
    }
}
