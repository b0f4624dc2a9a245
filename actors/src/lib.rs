//! flotilla-actors: the protocol, the task graph and the actors of flotilla.
//!
//! - [`protocol`]: every id, payload, message and event, in one place; a leaf that imports
//!   nothing else of this crate.
//! - [`config`]: the run's limits with their defaults.
//! - [`graph`]: the task graph as plain data (a fold of events), subplan validation and
//!   Dispatch's scope locks.
//! - [`llm`]: what every model-calling actor shares: parsing untrusted answers, live progress
//!   notices of streaming calls, the wait after a failed call.
//! - [`failures`]: the Reconciler's parsing and grouping of sweep output (pure).
//! - [`ports`]: traits for side effects (journal, LLM, agent, repo, clock) and in-memory fakes.
//! - [`actors`]: TaskGraph, Dispatch, Planner, Subplanner, WorkerPool, Worker, MergeQueue and
//!   Reconciler, one per file or folder, with their pure helpers beside them (what the
//!   planners tell their models, the Worker's checks of a branch) and the scratch commands
//!   the MergeQueue and the Reconciler run.
//! - [`recovery`]: what a run's journal says its actors pick up again at a (re)start (pure).
//! - [`supervision`]: how actors report that they ended (`Lifeline`), and `StopMember`.
//! - `testing` (feature `testing`, tests only): `eventually`, the one wait helper.
//!
//! See ARCHITECTURE.md for the map and the invariants.

pub mod actors;
pub mod config;
pub mod failures;
pub mod graph;
pub mod llm;
pub mod ports;
pub mod protocol;
pub mod recovery;
pub mod supervision;
#[cfg(feature = "testing")]
pub mod testing;
