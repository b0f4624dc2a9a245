//! The actors, one per file. Each owns its state and accepts one inbox enum from
//! [`crate::protocol::messages`].

pub mod dispatch;
pub mod task_graph;

pub use dispatch::{Dispatch, WorkerProfile, best_profile};
pub use task_graph::TaskGraph;
