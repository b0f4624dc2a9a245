//! flotilla's integration tests: one binary, one shared harness.

mod big_run;
mod budgets;
mod cli;
mod crash;
mod daemon;
mod daemon_env;
mod dispatch;
mod harness;
mod pipeline;
mod planner;
mod subplan_rules;
mod supervision;
mod task_graph;
mod worker;
