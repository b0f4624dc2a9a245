//! flotilla: the daemon and CLI around [`flotilla_actors`].
//!
//! - [`daemon`]: the long-running process: journal, run supervisor, HTTP API.
//! - [`journal`]: the SQLite journal (the `Journal` port).
//! - [`scripted`]: the scripted LLM provider and agent that replay a scenario file.
//! - [`git`]: everything flotilla does to a git repository (reader, worktrees, merge, checkout).
//! - [`config`]: `flotilla.toml` and the per-run configuration.
//! - [`text_file`]: reading the text files others write, and where their TOML is wrong.
//! - [`api`]: the HTTP wire types, shared by the daemon and the CLI.
//! - [`cli`]: the commands, the HTTP client they use, and how they print.
//! - [`text_safety`]: escaping for the terminal and JSON (a leaf); [`graph_export`]: DOT
//!   and Mermaid.
//! - [`paths`]: the state directory and the files in it.
//! - [`keys`]: the daemon's credentials, taken out of its environment at start.

pub mod agents;
pub mod api;
pub mod bench;
pub mod cli;
pub mod config;
pub mod confine;
pub mod daemon;
pub mod git;
pub mod graph_export;
pub mod journal;
pub mod keys;
pub mod logging;
pub mod paths;
pub mod process;
pub mod prompts;
pub mod providers;
pub mod sandbox;
pub mod scripted;
pub mod sse;
pub mod text_file;
pub mod text_safety;

pub use flotilla_actors as actors;
