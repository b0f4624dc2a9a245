//! The HTTP API's wire types: what the daemon answers and the CLI reads (and sends), with
//! serde and nothing else. Both sides depend on this module; it knows neither: no axum,
//! hyper or reqwest here, no actor, no rendering. The routes are listed in
//! `daemon/api/mod.rs`.
//!
//! - [`runs`]: creating a run, the run list, a decision about a whole run.
//! - [`status`]: a run's status (counts, graph, problems) and a task's story.
//! - [`report`]: a run's report (what happened, cost, time, what is left).
//! - [`gc`]: what `POST /v1/gc` removed.
//! - [`sse`]: how a run's events travel as server-sent events.
//! - [`ui`]: the link to the live page (`flotilla ui`).
//! - [`transcript`]: an attempt's transcript (`flotilla log`).

pub mod gc;
pub mod report;
pub mod runs;
pub mod sse;
pub mod status;
pub mod transcript;
pub mod ui;

/// The header carrying a submission's idempotency key (`POST /v1/runs`).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
