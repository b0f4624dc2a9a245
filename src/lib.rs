//! flotilla: the daemon and CLI around [`flotilla_actors`].
//!
//! - [`daemon`]: the long-running process: journal, run supervisor, HTTP API.
//! - [`journal`]: the SQLite journal (the `Journal` port).
//! - [`scripted`]: the scripted LLM provider and agent that replay a scenario file.
//! - [`git`]: everything flotilla does to a git repository (reader, worktrees, merge, checkout).
//! - [`config`]: `flotilla.toml` and the per-run configuration.
//! - [`client`]: the HTTP client the CLI uses (Unix socket or loopback TCP).
//! - [`cli`]: the commands and how they print.
//! - [`paths`]: the state directory and the files in it.
//! - [`keys`]: the daemon's credentials, taken out of its environment at start.

pub mod agents;
pub mod bench;
pub mod cli;
pub mod client;
pub mod config;
pub mod confine;
pub mod daemon;
pub mod git;
pub mod journal;
pub mod keys;
pub mod logging;
pub mod paths;
pub mod process;
pub mod prompts;
pub mod providers;
pub mod render;
pub mod sandbox;
pub mod scripted;
pub mod sse;

pub use flotilla_actors as actors;
