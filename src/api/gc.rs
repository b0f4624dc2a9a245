//! `POST /v1/gc[?dry_run=true]`: what the collection of finished runs' leftovers did.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcReport {
    /// Worktrees removed (or, in a dry run, that would be): attempt worktrees and the
    /// other directories of finished runs (their scratch checkouts).
    pub worktrees: Vec<String>,
    /// Task branches of finished runs deleted.
    pub branches: Vec<String>,
    /// Stale ref locks (`.git/refs/heads/flotilla/<run>/….lock`) removed.
    #[serde(default)]
    pub locks: Vec<String>,
    /// Directories of runs the journal does not know (or whose repository is gone),
    /// removed whole.
    pub unknown: Vec<String>,
    /// Transcript directories of finished runs (`<state-dir>/transcripts/<run>`) removed.
    #[serde(default)]
    pub transcripts: Vec<String>,
    /// Runs whose leftovers could not be removed, and why (the rest were).
    pub errors: Vec<String>,
    pub dry_run: bool,
}
