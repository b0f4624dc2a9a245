//! flotilla: the daemon and CLI around [`flotilla_actors`] (the protocol, the task graph and
//! the seven actors). This crate is the edge: it implements the actors' ports and serves them.
//! Every module, by what it is (ARCHITECTURE.md has the rules between them; `tests/it/layout.rs`
//! checks that no two import each other in a circle):
//!
//! The two programs
//! - [`daemon`]: the long-running process: state lock, HTTP API, the run `Supervisor`.
//! - [`cli`]: the commands, the HTTP client they use, and how they print.
//! - [`api`]: the HTTP wire types both sides share (serde only).
//!
//! Ports, implemented
//! - [`journal`]: the SQLite journal (the `Journal` port).
//! - [`git`]: everything flotilla does to a git repository (reader, worktrees, merge, checkout).
//! - [`process`]: commands in their own process group, output bounded; [`sandbox`]: the
//!   bwrap and Landlock policy they run under; [`confine`]: paths an agent names, kept in its
//!   worktree.
//! - [`providers`]: LLMs over HTTP (OpenAI, Anthropic), one retry layer per endpoint;
//!   [`sse`]: the server-sent-events parser both they and the CLI use.
//! - [`agents`]: the built-in tool-using agent and external agent CLIs.
//! - [`scripted`]: the scripted LLM provider and agent that replay a scenario file (the demo,
//!   the tests).
//!
//! Configuration and state
//! - [`config`]: `flotilla.toml` and the per-run configuration; [`prompts`]: each role's
//!   system prompt; [`paths`]: the state directory; [`keys`]: the daemon's credentials, taken
//!   out of its environment at start.
//!
//! Leaves anything may use
//! - [`text_file`]: reading the text files others write, and where their TOML is wrong.
//! - [`text_safety`]: escaping for the terminal and JSON; [`logging`]: the daemon's log,
//!   escaped; [`graph_export`]: DOT and Mermaid.
//! - [`bench`]: `flotilla bench`.

pub mod agents;
pub mod api;
pub mod bench;
pub mod cli;
pub mod config;
pub mod confine;
pub mod daemon;
pub mod daemon_mark;
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
