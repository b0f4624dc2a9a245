//! What a worker reports when it stops: a structured handoff and the artifacts it produced.
//! The status is the worker's own word and is honoured (the systems flotilla replaces
//! recorded every handoff as "complete").
//!
//! Also what git says an attempt's branch changed (`BranchWork`, `FileChange`) and what
//! flotilla found in it (`Finding`).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::task::{ArtifactKind, Budget, Usd};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HandoffStatus {
    /// Done as specified.
    Complete,
    /// Some of it done; the concerns say what is missing. Counts as completed so the planner
    /// can plan the rest.
    Partial,
    /// Cannot proceed (missing information, access, a decision). Fails without retry.
    Blocked,
    /// Tried and failed. Retried if the task has attempts left.
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Handoff {
    pub status: HandoffStatus,
    pub summary: String,
    #[serde(default)]
    pub files_changed: Vec<String>,
    #[serde(default)]
    pub concerns: Vec<String>,
    #[serde(default)]
    pub suggestions: Vec<String>,
    #[serde(default)]
    pub metrics: HandoffMetrics,
    /// Exit code of the build/test command the worker ran last, if it ran one (replaced by
    /// the verification command's, when the run configures one).
    #[serde(default)]
    pub build_exit_code: Option<i32>,
    /// What git says the attempt changed, read by flotilla from the task branch after the
    /// agent stopped (never taken from the agent). `None` for a handoff that no worktree
    /// backs (a Subplanner's aggregate, a journal written before M5).
    /// (Boxed: a handoff travels inside many messages and events.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work: Option<Box<BranchWork>>,
    /// What flotilla noticed about the work that the planner must know (an empty diff, edits
    /// outside the scope, deleted tests, …). The agent's own concerns stay in `concerns`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
}

impl Handoff {
    pub fn complete(summary: impl Into<String>) -> Self {
        Handoff {
            status: HandoffStatus::Complete,
            summary: summary.into(),
            files_changed: Vec::new(),
            concerns: Vec::new(),
            suggestions: Vec::new(),
            metrics: HandoffMetrics::default(),
            build_exit_code: None,
            work: None,
            findings: Vec::new(),
        }
    }
}

/// A task branch's work, as git has it: the commit it left from, the commit it ended at, and
/// the files between them (`git diff --stat base head`, renames detected).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BranchWork {
    pub branch: String,
    /// main's tip when the attempt's worktree was made.
    pub base: String,
    /// The branch's last commit when the attempt ended.
    pub head: String,
    /// The changed files, sorted by path (in a handoff, at most [`BranchWork::MAX_FILES`];
    /// checks read them all first).
    pub files: Vec<FileChange>,
    /// Changed files left out of `files` past the cap; the totals count them.
    #[serde(default)]
    pub files_omitted: u64,
    pub lines_added: u64,
    pub lines_removed: u64,
    /// flotilla committed what the agent left uncommitted (the safety-net commit).
    #[serde(default)]
    pub committed_for_agent: bool,
    /// Symbolic links the branch adds or changes that point outside the repository (an
    /// absolute target, or one that climbs above the root): a later build or checkout that
    /// follows them reads or writes elsewhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links_outside: Vec<String>,
}

impl BranchWork {
    /// The most files a handoff lists: a worker that rewrote a generated tree must not make
    /// one event megabytes long.
    pub const MAX_FILES: usize = 1_000;

    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.files_omitted == 0
    }

    /// The listed paths, old and new (a rename touches both).
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.files
            .iter()
            .flat_map(|f| std::iter::once(f.path.as_str()).chain(f.old_path.as_deref()))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChange {
    /// Repo-relative, with `/` separators (the new path of a rename).
    pub path: String,
    /// The path it had at the base, for a rename or a copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_path: Option<String>,
    pub change: ChangeKind,
    pub lines_added: u64,
    pub lines_removed: u64,
    /// git counts no lines in a binary file.
    #[serde(default)]
    pub binary: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
    Renamed,
    Copied,
    /// A file became a symlink or the other way round.
    TypeChanged,
}

/// Something flotilla found in a worker's work, from git, that the planner must hear.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "finding", rename_all = "snake_case")]
pub enum Finding {
    /// The handoff says complete, and the branch changes nothing.
    EmptyDiff,
    /// Files changed outside the task's scope (the run flags them instead of failing).
    OutOfScope { paths: Vec<String> },
    /// Test files deleted (matched by the run's test patterns).
    DeletedTests { paths: Vec<String> },
    /// Files the agent said it changed that the branch does not change.
    ClaimedNotChanged { paths: Vec<String> },
    /// Symbolic links that point outside the repository, and hard links (the run flags
    /// them instead of failing).
    LinksOutside { paths: Vec<String> },
    /// Files of flotilla's own configuration changed (`flotilla.toml`, the scenario and
    /// prompts the run was loaded from, files its commands name: ADR-016). Unless
    /// `allowed` (`[checks] config_edits = "allow"`), the work waits for the user's
    /// `flotilla decide` before it lands.
    ConfigChanged {
        paths: Vec<String>,
        #[serde(default)]
        allowed: bool,
    },
    /// The run's verification command did not pass on the branch.
    VerificationFailed {
        command: String,
        /// How it ended (`exit code 1`, `killed at its time limit`).
        exit: String,
        /// The end of its output.
        output_tail: String,
    },
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoffMetrics {
    pub lines_added: u64,
    pub lines_removed: u64,
    pub files_created: u64,
    pub files_modified: u64,
    #[serde(default)]
    pub files_deleted: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub tool_calls: u64,
    pub duration_ms: u64,
    #[serde(default)]
    pub cost_usd: Usd,
}

/// At most 5 paths, then how many more: a finding's line stays short in a prompt or a tail.
fn some_paths(paths: &[String]) -> String {
    let shown: Vec<&str> = paths.iter().take(5).map(String::as_str).collect();
    match paths.len().saturating_sub(shown.len()) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::EmptyDiff => f.write_str("reported complete, but the branch changes nothing"),
            Finding::OutOfScope { paths } => {
                write!(f, "changed files outside its scope: {}", some_paths(paths))
            }
            Finding::DeletedTests { paths } => {
                write!(f, "deleted tests: {}", some_paths(paths))
            }
            Finding::ClaimedNotChanged { paths } => write!(
                f,
                "said it changed files the branch does not change: {}",
                some_paths(paths)
            ),
            Finding::LinksOutside { paths } => write!(
                f,
                "added links that point outside the repository: {}",
                some_paths(paths)
            ),
            Finding::ConfigChanged { paths, allowed } => write!(
                f,
                "changed flotilla's own configuration{}: {}",
                if *allowed {
                    " (allowed by the run)"
                } else {
                    ""
                },
                some_paths(paths)
            ),
            Finding::VerificationFailed { command, exit, .. } => {
                let command: String = command.chars().take(80).collect();
                write!(f, "verification `{command}` failed: {exit}")
            }
        }
    }
}

impl HandoffMetrics {
    /// What this work consumed, in budget terms.
    pub fn spent(&self) -> Budget {
        Budget::new(
            self.tokens_in.saturating_add(self.tokens_out),
            self.cost_usd,
            self.duration_ms,
        )
    }
}

/// Tokens and money one LLM call or one task consumed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub tokens_in: u64,
    pub tokens_out: u64,
    #[serde(default)]
    pub cost_usd: Usd,
}

impl Usage {
    /// This and `other` together (saturating: a model's figures are untrusted).
    pub fn saturating_add(&self, other: &Usage) -> Usage {
        Usage {
            tokens_in: self.tokens_in.saturating_add(other.tokens_in),
            tokens_out: self.tokens_out.saturating_add(other.tokens_out),
            cost_usd: self.cost_usd.saturating_add(other.cost_usd),
        }
    }

    /// What this usage costs in budget terms: its tokens (in and out) and its money.
    pub fn spent(&self) -> Budget {
        Budget::new(
            self.tokens_in.saturating_add(self.tokens_out),
            self.cost_usd,
            0,
        )
    }
}

/// A typed output (ADR-008). The locator is interpreted by the kind: a commit sha, a
/// repo-relative path, a report's text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactRef {
    pub kind: ArtifactKind,
    pub locator: String,
}
