//! Running configured commands (the merge gate, the Reconciler's sweeps) at one commit, in a
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

use crate::ports::{CommandSpec, Exit, MergeGit, ProcessRunner, RepoError};

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
}

impl ScratchRun {
    /// Runs `commands` in a scratch checkout of `commit`. `Err` when the checkout could not
    /// be made (nothing ran): [`RepoError::Storage`] when flotilla's own storage refused it
    /// (disk full, read-only), which is nobody's failure (ADR-024).
    pub async fn run(
        &self,
        commit: String,
        label: String,
        commands: Vec<NamedCommand>,
        cancel: CancellationToken,
    ) -> Result<Vec<CommandResult>, RepoError> {
        let tree = self.git.scratch(commit, label).await?;
        let mut results = Vec::new();
        for command in commands {
            let mut spec = CommandSpec::shell(command.line.clone(), tree.path.clone());
            spec.limits.wall = self.timeout;
            let dir = tree.path.to_string_lossy().into_owned();
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
        // A checkout left behind is disk, not correctness: the run's end sweeps scratch
        // directories too.
        if let Err(e) = self.git.remove_scratch(tree).await {
            tracing::warn!(error = %e, "a scratch checkout could not be removed");
        }
        Ok(results)
    }
}
