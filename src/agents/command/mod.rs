//! External coding-agent CLIs as workers (the `command` agent kind): Claude Code, Codex,
//! aider, or any program that works in a directory and says what it did.
//!
//! Every call of a session (`run`, `revise`, `synthesize`) is one process, started through
//! the [`ProcessRunner`](flotilla_actors::ports::ProcessRunner) in the attempt's worktree: in its own process group, with a scrubbed
//! environment (the CLI's own API key is passed only because the config names it), killed
//! when it writes nothing for `stall_secs` or when the attempt is called off. The prompt (the
//! worker's system prompt, the task, how to hand back) goes to it on stdin, in a file or as
//! its last argument; its output is read line by line as it arrives, for the live activity
//! line and for the spend it reports (so that budgets bind while it works).
//!
//! What it hands back is the result envelope, the same JSON object the built-in agent's
//! `finish` carries ([`FinishArgs`](crate::agents::tools::FinishArgs)), through a channel flotilla owns (ADR-017), never
//! "the last JSON object printed": a CLI's stdout mixes its own words with whatever its
//! tools printed (a repository file it `cat`ed, its own prompt echoed).
//! - `result = "file"`: `FLOTILLA_RESULT.json` in the worktree's root, its path in
//!   `FLOTILLA_RESULT_FILE`; read once, only as a regular file with one link, not followed
//!   if a link, bounded; removed before the work is committed.
//! - `result = "stream"`: the final event of a structured stream, parsed into typed events:
//!   Claude Code's `result` event (`is_error`, `subtype`) or the last agent message of the
//!   Codex turn that ended with `turn.completed` (`turn.failed` is a failure with its
//!   message). Plain text output has no such event and cannot use it.
//!
//! A non-zero exit is a failure whatever was handed back; an envelope that is the prompt's
//! own example is refused as an echo.
//!
//! A CLI keeps no memory between processes: a revision gets the whole task again with the
//! reason its subplan was refused, in the same worktree (what it changed is still there).
//!
//! The files flotilla writes into the worktree for the CLI (`FLOTILLA_TASK.md`,
//! `FLOTILLA_RESULT.json`) and the caches a preset's CLI is known to leave there (aider's
//! tag cache) are removed before a call returns, however the process ended: the Worker
//! commits whatever is left in the worktree, and they are not the task's work.
//!
//! Configured as `[agents.NAME]`, with presets for Claude Code, Codex and aider (`extra_args`
//! adds to a preset); the envelope comes from `$FLOTILLA_RESULT_FILE` (no link, one link,
//! bounded) or the stream's final event (Claude's `result`, Codex's completed turn); a
//! non-zero exit or an echoed example is a failure.
//!
//! The files: `config` (`[agents.NAME]` and the presets), `session` (running the CLI),
//! `envelope` (the handoff it writes), `stream` (its output read line by line) over the
//! typed events of `claude` and `codex`, and `text` (cutting its words down). The module's
//! API is what is re-exported here; the files are private to it, and none imports this one.

mod aider;
mod claude;
mod codex;
mod config;
mod envelope;
mod session;
mod stream;
mod text;

pub use config::{
    AIDER_ARGS, CommandAgentConfig, CommandAgentConfigError, OutputFormat, Preset, PromptVia,
    ResolvedCommand, ResultVia,
};
pub use envelope::{PROMPT_FILE, RESULT_FILE, RESULT_FILE_VAR};
pub use session::CommandAgent;
