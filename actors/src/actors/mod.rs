//! The actors, one per file or folder (an actor's pure helpers sit beside it: `planner/context`,
//! `subplanner/context`, `worker/check`). Each owns its state and accepts one inbox enum from
//! [`crate::protocol::messages`]. `scratch_commands` is no actor: it runs the configured commands
//! of the two actors that check a commit (MergeQueue, Reconciler).

pub mod dispatch;
pub mod merge_queue;
pub mod planner;
pub mod reconciler;
pub mod scratch_commands;
pub mod subplanner;
pub mod task_graph;
pub mod worker;
pub mod worker_pool;

pub use dispatch::{Dispatch, DispatchOrder, WorkerProfile, best_profile, dispatch_order};
pub use merge_queue::{MergeConfig, MergeConfigError, MergeKit, MergeQueue};
pub use planner::{Exchange, Planner, PlannerConfig, PlannerConfigError};
pub use reconciler::{
    FixWriter, Reconciler, ReconcilerConfig, ReconcilerConfigError, ReconcilerKit, WordingError,
};
pub use subplanner::{RecordedExchange, Subplanner, SubplannerConfig, SubplannerConfigError};
pub use task_graph::{CancelRun, Recovery, TaskGraph};
pub use worker::{AgentSet, Job, Worker, WorkerKit};
pub use worker_pool::WorkerPool;
