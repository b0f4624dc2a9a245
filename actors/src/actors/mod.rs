//! The actors, one per file. Each owns its state and accepts one inbox enum from
//! [`crate::protocol::messages`].

pub mod dispatch;
pub mod planner;
pub mod subplanner;
pub mod task_graph;
pub mod worker;
pub mod worker_pool;

pub use dispatch::{Dispatch, WorkerProfile, best_profile};
pub use planner::{Exchange, Planner, PlannerConfig, PlannerConfigError};
pub use subplanner::{RecordedExchange, Subplanner, SubplannerConfig, SubplannerConfigError};
pub use task_graph::{CancelRun, Recovery, TaskGraph};
pub use worker::{AgentSet, Job, Worker, WorkerKit};
pub use worker_pool::WorkerPool;
