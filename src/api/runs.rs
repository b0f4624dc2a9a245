//! Runs: `POST /v1/runs` (create), `GET /v1/runs` (the list), `POST /v1/runs/{id}/decision`.

use std::path::PathBuf;

use flotilla_actors::protocol::RunOutcome;
use serde::{Deserialize, Serialize};

use crate::config::RunConfig;

/// `POST /v1/runs`: what to build, where, and with which configuration (absent: the
/// daemon reads `<repo>/flotilla.toml`).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRun {
    pub request: String,
    pub repo: PathBuf,
    #[serde(default)]
    pub config: Option<RunConfig>,
}

/// The answer to `POST /v1/runs`: 201 for a new run, 200 for a retry with the same
/// idempotency key.
#[derive(Debug, Serialize, Deserialize)]
pub struct Created {
    pub id: String,
    /// The branch the run lands on (ADR-022); absent from a daemon before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
}

/// One run of `GET /v1/runs`.
#[derive(Debug, Serialize, Deserialize)]
pub struct RunSummary {
    pub id: String,
    pub request: String,
    pub repo: String,
    pub created_ms: u64,
    /// `running`, `damaged`, or the outcome.
    pub state: String,
    /// What is wrong with the run right now (damaged, paused on the journal, restarting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// A decision about a whole run (`POST /v1/runs/{id}/decision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum RunDecision {
    /// Landing paused because main no longer holds what the run landed: main as it is now
    /// becomes the base the merge queue lands on; what it dropped is reported, not replayed.
    AdoptMain,
}

/// A run's `state` on the wire: `running` until it has an outcome.
pub fn state_name(outcome: Option<RunOutcome>) -> &'static str {
    match outcome {
        None => "running",
        Some(RunOutcome::Completed) => "completed",
        Some(RunOutcome::Failed) => "failed",
        Some(RunOutcome::Cancelled) => "cancelled",
    }
}
