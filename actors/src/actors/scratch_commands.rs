//! Running configured commands (the merge gate, the Reconciler's sweeps) at one commit: in
//! the slot's warm tree, a persistent checkout with a real `.git` brought to the commit by a
//! sandboxed `git checkout` (ADR-042), or, when warm trees are off or the update fails, in a
//! scratch checkout made for them and removed after, whatever happened (ADR-011). Every
//! command has a wall-time limit and capped output; none sees the target repository's own
//! work tree.
//!
//! [`ScratchRun`] is the entry point.
//!
//! It sits among the actors because only two of them use it, the MergeQueue (the merge gate)
//! and the Reconciler (the sweeps), and both run it the same way. It is no port: it is a
//! procedure over two ports (`MergeGit` for the scratch checkout, `ProcessRunner` for the
//! commands) with nothing to fake of its own, and it knows no actor, message or event.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use std::path::Path;

use crate::ports::{CommandSpec, Exit, MergeGit, ProcessRunner, RepoError, WarmSlot, WarmTree};

/// How much of a failed command's output an event or a fix task carries.
pub const OUTPUT_TAIL_CHARS: usize = 2_000;

/// One configured command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedCommand {
    /// What it checks (`gate`, `build`, `typecheck`, `test`).
    pub name: String,
    /// A shell line (`sh -c`).
    pub line: String,
}

/// How one command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandResult {
    pub name: String,
    pub line: String,
    pub passed: bool,
    /// It ran past its time limit and was killed (its output is what it printed so far).
    pub timed_out: bool,
    /// How it ended, in words ("exit code 1", "timed out after 600 s").
    pub exit: String,
    /// stdout then stderr, as captured (capped by the runner).
    pub output: String,
    /// The directory it ran in (to make paths in its output repo-relative).
    pub dir: String,
}

impl CommandResult {
    /// The end of the output, for events.
    pub fn tail(&self) -> String {
        let count = self.output.chars().count();
        self.output
            .chars()
            .skip(count.saturating_sub(OUTPUT_TAIL_CHARS))
            .collect()
    }
}

/// What to run, and how.
#[derive(Clone)]
pub struct ScratchRun {
    pub git: Arc<dyn MergeGit>,
    pub runner: Arc<dyn ProcessRunner>,
    pub timeout: Duration,
    /// Stop at the first failure (the gate) or run them all (a sweep, which wants every
    /// class of failure it can find).
    pub stop_at_first_failure: bool,
    /// Whose warm tree the commands run in.
    pub slot: WarmSlot,
}

impl ScratchRun {
    /// Runs `commands` at `commit`: in the slot's warm tree when there is one and it could
    /// be brought to `commit`, else in a scratch checkout. `Err` when no checkout could be
    /// made (nothing ran): [`RepoError::Storage`] when flotilla's own storage refused it
    /// (disk full, read-only), which is nobody's failure (ADR-024).
    pub async fn run(
        &self,
        commit: String,
        label: String,
        commands: Vec<NamedCommand>,
        cancel: CancellationToken,
    ) -> Result<Vec<CommandResult>, RepoError> {
        match self.git.warm(commit.clone(), self.slot).await {
            Ok(Some(tree)) => match self.update(&tree, cancel.clone()).await {
                Ok(()) => {
                    let results = self.run_in(&tree.path, commands, cancel).await;
                    if let Err(e) = self.git.settle_warm(tree, true).await {
                        tracing::warn!(error = %e, "the warm tree could not be measured");
                    }
                    return Ok(results);
                }
                Err(why) => {
                    // A tree that would not update is thrown away; this run takes a scratch
                    // checkout, and the next one starts a new warm tree.
                    tracing::warn!(slot = tree.slot.name(), %why, "the warm tree would not update");
                    if let Err(e) = self.git.settle_warm(tree, false).await {
                        tracing::warn!(error = %e, "the warm tree could not be removed");
                    }
                }
            },
            Ok(None) => {}
            Err(e @ RepoError::Storage(_)) => return Err(e),
            Err(e) => tracing::warn!(error = %e, "no warm tree: a scratch checkout instead"),
        }
        let tree = self.git.scratch(commit, label).await?;
        let results = self.run_in(&tree.path, commands, cancel).await;
        // A checkout left behind is disk, not correctness: the run's end sweeps scratch
        // directories too.
        if let Err(e) = self.git.remove_scratch(tree).await {
            tracing::warn!(error = %e, "a scratch checkout could not be removed");
        }
        Ok(results)
    }

    /// Brings a warm tree to its commit, in the sandbox like any command: what the previous
    /// run left there is the untrusted gate's.
    async fn update(&self, tree: &WarmTree, cancel: CancellationToken) -> Result<(), String> {
        let mut spec = CommandSpec::shell(tree.update.clone(), tree.path.clone());
        spec.limits.wall = self.timeout;
        let out = self
            .runner
            .run(spec, cancel, None)
            .await
            .map_err(|e| e.to_string())?;
        if !out.exit.success() {
            return Err(format!(
                "{}: {}{}",
                out.exit, out.stdout.text, out.stderr.text
            ));
        }
        self.git.warm_updated(tree).await.map_err(|e| e.to_string())
    }

    async fn run_in(
        &self,
        path: &Path,
        commands: Vec<NamedCommand>,
        cancel: CancellationToken,
    ) -> Vec<CommandResult> {
        let mut results = Vec::new();
        for command in commands {
            let mut spec = CommandSpec::shell(command.line.clone(), path.to_path_buf());
            spec.limits.wall = self.timeout;
            let dir = path.to_string_lossy().into_owned();
            let result = match self.runner.run(spec, cancel.clone(), None).await {
                Ok(out) => CommandResult {
                    name: command.name,
                    line: command.line,
                    passed: out.exit.success(),
                    timed_out: out.exit == Exit::TimedOut,
                    exit: match out.exit {
                        Exit::TimedOut => format!("timed out after {} s", self.timeout.as_secs()),
                        exit => exit.to_string(),
                    },
                    output: format!("{}{}", out.stdout.text, out.stderr.text),
                    dir,
                },
                Err(e) => CommandResult {
                    name: command.name,
                    line: command.line,
                    passed: false,
                    timed_out: false,
                    exit: "did not run".into(),
                    output: e.to_string(),
                    dir,
                },
            };
            let failed = !result.passed;
            results.push(result);
            if failed && self.stop_at_first_failure {
                break;
            }
        }
        results
    }
}
