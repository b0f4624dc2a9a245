//! flotilla's integration tests: one binary, one shared harness.

mod api_limits;
mod big_run;
mod budgets;
mod builtin_agent;
mod cli;
mod command_agent;
mod crash;
mod daemon;
mod daemon_env;
mod dispatch;
mod fuzz_regressions;
mod harness;
mod landing;
mod merge_git;
mod merge_queue;
mod pipeline;
mod planner;
mod process;
mod providers;
mod reconciler;
mod subplan_rules;
mod subplanner;
mod supervision;
mod task_graph;
mod worker;
mod worktrees;
