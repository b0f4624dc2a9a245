//! flotilla's integration tests: one binary, one shared harness.

mod dispatch;
mod harness;
mod pipeline;
mod subplan_rules;
mod task_graph;
