//! flotilla-actors: the protocol, the task graph and the actors of flotilla.
//!
//! - [`protocol`]: every id, payload, message and event, in one place.
//! - [`config`]: the run's limits with their defaults.
//! - [`graph`]: the task graph as plain data (a fold of events) and subplan validation.
//! - [`llm_output`]: parsing untrusted LLM answers into typed structs; [`llm_progress`]: live
//!   progress notices of streaming calls.
//! - [`planner_context`], [`subplanner_context`]: what the planners tell their models, and
//!   the Subplanner's aggregation of handoffs (pure functions).
//! - [`ports`]: traits for side effects (journal, LLM, agent, repo, clock) and in-memory fakes.
//! - [`actors`]: TaskGraph, Dispatch, Planner, Subplanner, WorkerPool and Worker, one actor
//!   per file.
//! - [`work_check`]: handoffs from git truth: what a branch changed, checked against the
//!   task's scope and the run's `[checks]` (pure).
//! - [`supervision`]: how actors report that they ended (`Lifeline`), and `StopMember`.
//! - `testing` (feature `testing`, tests only): `eventually`, the one wait helper.
//!
//! See ARCHITECTURE.md for the map and the invariants.

pub mod actors;
pub mod backoff;
pub mod config;
pub mod failures;
pub mod graph;
pub mod llm_output;
pub mod llm_progress;
pub mod planner_context;
pub mod ports;
pub mod protocol;
pub mod scratch_commands;
pub mod subplanner_context;
pub mod supervision;
#[cfg(feature = "testing")]
pub mod testing;
pub mod work_check;
