//! External coding-agent CLIs as workers (the `command` agent kind): Claude Code, Codex,
//! aider, or any program that works in a directory and says what it did.
//!
//! Every call of a session (`run`, `revise`, `synthesize`) is one process, started through
//! the [`ProcessRunner`] in the attempt's worktree: in its own process group, with a scrubbed
//! environment (the CLI's own API key is passed only because the config names it), killed
//! when it writes nothing for `stall_secs` or when the attempt is called off. The prompt (the
//! worker's system prompt, the task, how to hand back) goes to it on stdin, in a file or as
//! its last argument; its output is read line by line as it arrives, for the live activity
//! line and for the spend it reports (so that budgets bind while it works).
//!
//! What it hands back is the result envelope, the same JSON object the built-in agent's
//! `finish` carries ([`FinishArgs`]), through a channel flotilla owns (ADR-017), never
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

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_actors::llm_output::parse_json_answer;
use flotilla_actors::ports::{
    Agent, AgentError, AgentReport, AgentSession, AttemptContext, CommandLimits, CommandOutput,
    CommandSpec, EnvPolicy, Exit, LineSink, ProcessError, ProcessRunner, Sandbox, Stream,
    Workspace, scrubbed_env,
};
use flotilla_actors::protocol::{
    Assignment, Budget, HandoffMetrics, RejectionReason, SubtaskResult, TaskId, Usd,
};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::tools::FinishArgs;

/// The prompt file, in the worktree's root, for `prompt = "file"`.
pub const PROMPT_FILE: &str = "FLOTILLA_TASK.md";
/// The result file, in the worktree's root, for `result = "file"`: inside the worktree
/// because it is the one place a sandboxed CLI may write.
pub const RESULT_FILE: &str = "FLOTILLA_RESULT.json";
/// The variable that gives the CLI the result file's absolute path.
pub const RESULT_FILE_VAR: &str = "FLOTILLA_RESULT_FILE";

/// A CLI's wall-time cap. Only a backstop: the Worker's wall-time budget for the attempt
/// calls the CLI off (through the attempt's token) long before.
const WALL_CAP: Duration = Duration::from_secs(24 * 60 * 60);

/// The most of a handoff's text read from the CLI (the result file, or the end of its
/// final text): the built-in agent's bound for a handoff written as text.
const MAX_ENVELOPE_BYTES: usize = 256 * 1024;

/// `{` positions tried, from the end, when looking for the envelope in a text: enough for
/// an envelope after pages of code, and a bound on the work a brace-filled output costs.
const MAX_ENVELOPE_TRIES: usize = 2_000;

/// What an error message shows of the CLI's last output (stderr and stdout together).
const TAIL_CHARS: usize = 2_000;

/// How much of a message or a command the live line shows.
const GIST_CHARS: usize = 80;
const DETAIL_CHARS: usize = 120;

/// The CLIs flotilla knows how to drive (`preset = "claude-code"`, `"codex"`, `"aider"`).
/// A preset only fills in the fields the config leaves out: every one of them can be
/// overridden, and `extra_args` adds to its arguments. The flags are the CLIs' documented
/// non-interactive ones; they grant the CLI no permission beyond its own defaults (allowing
/// edits or commands without asking, such as Claude Code's `--permission-mode` or Codex's
/// `--sandbox workspace-write`, is the user's decision, made in `extra_args`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// `claude -p --output-format stream-json --verbose`, the prompt on stdin, its JSON
    /// events parsed, its `result` event the result; passes `ANTHROPIC_API_KEY`.
    ClaudeCode,
    /// `codex exec --json`, the prompt on stdin, its JSON events parsed, the last agent
    /// message of its completed turn the result; passes `OPENAI_API_KEY`. Codex speaks only
    /// the Responses API (`/v1/responses`) to its model.
    Codex,
    /// `aider` with [`AIDER_ARGS`]: the prompt in a file, its output read as text, the
    /// result in `FLOTILLA_RESULT.json` (given to it with `--file`); nothing of aider's own
    /// left in the worktree; passes `OPENAI_API_KEY` and `ANTHROPIC_API_KEY`.
    Aider,
}

/// The aider preset's arguments (aider 0.86). Everything aider would write into the
/// repository besides the task's files goes elsewhere or nowhere: its chat and input
/// histories to `/dev/null` (writable in every sandbox, kept nowhere), no `.gitignore`
/// edit (`--no-gitignore`), no commits of its own (flotilla commits the work), no update
/// check, release notes or analytics (which would write under `~/.aider`). The repository
/// map is kept, at aider's default of 1024 tokens but at most twice that with no file in
/// the chat (aider's default multiplies it by 8, too much for a local model's context);
/// its tag cache, which aider always keeps in the repository's root, is one of the preset's
/// [leftovers](PresetDefaults::leftovers).
pub const AIDER_ARGS: &[&str] = &[
    "--yes-always",
    "--no-auto-commits",
    "--no-dirty-commits",
    "--no-gitignore",
    "--chat-history-file",
    "/dev/null",
    "--input-history-file",
    "/dev/null",
    "--no-restore-chat-history",
    "--map-tokens",
    "1024",
    "--map-multiplier-no-files",
    "2",
    "--no-check-update",
    "--no-show-release-notes",
    "--no-analytics",
    "--no-pretty",
    "--no-fancy-input",
    "--no-detect-urls",
    "--file",
    "{result_file}",
    "--message-file",
    "{prompt_file}",
];

/// How the CLI gets its prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptVia {
    /// Written to its stdin, which is then closed.
    Stdin,
    /// Written to `FLOTILLA_TASK.md` in the worktree (`{prompt_file}` in `args` is its path).
    File,
    /// Appended as its last argument (the system's limit on one argument, 128 KiB on
    /// Linux, bounds the prompt).
    Arg,
}

/// What the CLI prints on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    /// Plain text: every line is shown as activity; the final text is all of stdout.
    Text,
    /// Claude Code's `--output-format stream-json`: one JSON event a line; the final text
    /// is the `result` event's.
    ClaudeStreamJson,
    /// Codex's `exec --json`: one JSON event a line; the final text is the last agent
    /// message.
    CodexJson,
}

/// Where the CLI leaves its result envelope: a channel flotilla owns, never whatever JSON
/// its output happens to end with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultVia {
    /// The final event of its structured output: Claude Code's `result` event, or the last
    /// agent message of a Codex turn that completed; the envelope is the last JSON object
    /// of that text. Only with `output = "claude_stream_json"` or `"codex_json"`.
    /// (`"stdout"`, its old name, is still read.)
    #[serde(alias = "stdout")]
    Stream,
    /// `FLOTILLA_RESULT.json` in the worktree, its path in `FLOTILLA_RESULT_FILE`
    /// (`{result_file}` in `args` is its path too).
    File,
}

/// `[agents.NAME]` in flotilla.toml: an external CLI to run as a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CommandAgentConfig {
    /// Defaults for the fields below (which override it, field by field).
    pub preset: Option<Preset>,
    /// The program, found on the scrubbed `PATH`. Required unless a preset gives it.
    pub program: Option<String>,
    /// Its arguments. `{prompt_file}` and `{result_file}` are replaced by the paths of
    /// the prompt and result files. Replaces the preset's arguments whole: to add to them,
    /// use `extra_args`.
    pub args: Option<Vec<String>>,
    /// Arguments after `args` (the preset's or the config's): a model, a permission mode.
    pub extra_args: Vec<String>,
    /// `stdin` (without a preset), `file` or `arg`.
    pub prompt: Option<PromptVia>,
    /// `text` (without a preset), `claude_stream_json` or `codex_json`.
    pub output: Option<OutputFormat>,
    /// `stream` or `file`. Without a preset: `stream` for a structured output, `file` for
    /// plain text.
    pub result: Option<ResultVia>,
    /// The CLI is killed after this long without writing anything (a hung CLI, not a slow
    /// one: these CLIs print as they work).
    pub stall_secs: u64,
    /// Output kept per stream (its first and last halves) for the final text and for error
    /// messages; also the longest line parsed as an event.
    pub output_bytes: usize,
    /// Harmless variables of the daemon's environment to pass besides the usual ones
    /// (`PATH`, `HOME`, …). A name that looks like a secret is refused: name it in
    /// `secrets`.
    pub env_pass: Vec<String>,
    /// Variables holding credentials the CLI needs (its API key), passed on purpose. When
    /// empty, the preset's list; a non-empty list replaces it.
    pub secrets: Vec<String>,
    /// The CLI always runs in the run's sandbox (`[sandbox]`, ADR-015): `"bwrap"` (the
    /// default) without network, `"network"` with the host's network, which a CLI that calls
    /// its model over the network cannot work without.
    pub sandbox: Sandbox,
}

impl Default for CommandAgentConfig {
    fn default() -> Self {
        CommandAgentConfig {
            preset: None,
            program: None,
            args: None,
            extra_args: Vec::new(),
            prompt: None,
            output: None,
            result: None,
            stall_secs: 300,
            output_bytes: 64 * 1024,
            env_pass: Vec::new(),
            secrets: Vec::new(),
            sandbox: Sandbox::Bwrap,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandAgentConfigError {
    #[error("program is not set: name the CLI to run, or a preset that names it")]
    NoProgram,
    #[error("{0} = 0: it must be at least 1")]
    Zero(&'static str),
    #[error(
        "args use {placeholder}, but {field} is not \"file\": the file is only written with {field} = \"file\""
    )]
    PlaceholderWithoutFile {
        placeholder: &'static str,
        field: &'static str,
    },
    #[error(
        "env_pass names {0}, which looks like a secret: name it in secrets to pass it on purpose"
    )]
    SecretInEnvPass(String),
    #[error("{field} names {name:?}, which is not an environment variable's name")]
    BadVariable { field: &'static str, name: String },
    #[error(
        "result = \"stream\" needs a structured output (claude_stream_json or codex_json): plain text mixes the CLI's words with what its tools printed; use result = \"file\""
    )]
    StreamResultFromText,
}

/// A config with its preset applied: what is run, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedCommand {
    pub program: String,
    /// With the placeholders still in (they are replaced per call).
    pub args: Vec<String>,
    pub prompt: PromptVia,
    pub output: OutputFormat,
    pub result: ResultVia,
    pub limits: CommandLimits,
    pub env: EnvPolicy,
    pub sandbox: Sandbox,
    /// Paths (from the worktree's root) the CLI is known to leave behind for itself: each
    /// one a call creates is removed when the call ends.
    pub leftovers: Vec<String>,
    /// Variables the preset sets for the CLI (not secrets; set over the daemon's).
    pub set_env: Vec<(String, String)>,
}

/// What a preset fills in.
struct PresetDefaults {
    program: &'static str,
    args: &'static [&'static str],
    prompt: PromptVia,
    output: OutputFormat,
    result: ResultVia,
    secrets: &'static [&'static str],
    /// What the CLI keeps in the directory it works in whatever its flags say.
    leftovers: &'static [&'static str],
    /// Variables set for the CLI.
    set_env: &'static [(&'static str, &'static str)],
}

/// What the aider preset sets. A git identity, through git's environment config (git >=
/// 2.31), which `git config --get` reads before any file: aider 0.86 looks for `user.name` and
/// `user.email` when it starts and, without them, writes placeholders into the
/// repository's `.git/config`: read-only in the sandbox (it crashes with "Read-only file
/// system: .git/config.lock"), and the user's own configuration in the checkout were it
/// not. The sandbox hides `~/.gitconfig`, so without this every aider call failed on a
/// repository whose identity is set only globally. aider commits nothing with the preset's
/// flags: the identity is never written anywhere.
///
/// And litellm (aider's model client) reads its model price map from the package instead
/// of fetching it from GitHub at every start (a network call a local model does not need,
/// and a wait where there is no DNS).
const AIDER_ENV: &[(&str, &str)] = &[
    ("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
    ("GIT_CONFIG_COUNT", "2"),
    ("GIT_CONFIG_KEY_0", "user.name"),
    ("GIT_CONFIG_VALUE_0", crate::git::FLOTILLA_NAME),
    ("GIT_CONFIG_KEY_1", "user.email"),
    ("GIT_CONFIG_VALUE_1", crate::git::FLOTILLA_EMAIL),
];

impl Preset {
    fn defaults(self) -> PresetDefaults {
        match self {
            Preset::ClaudeCode => PresetDefaults {
                program: "claude",
                args: &["-p", "--output-format", "stream-json", "--verbose"],
                prompt: PromptVia::Stdin,
                output: OutputFormat::ClaudeStreamJson,
                result: ResultVia::Stream,
                secrets: &["ANTHROPIC_API_KEY"],
                leftovers: &[],
                set_env: &[],
            },
            // With no prompt argument, `codex exec` reads its prompt from stdin (an `-`
            // would do the same, but `extra_args` would then follow a positional).
            Preset::Codex => PresetDefaults {
                program: "codex",
                args: &["exec", "--json"],
                prompt: PromptVia::Stdin,
                output: OutputFormat::CodexJson,
                result: ResultVia::Stream,
                secrets: &["OPENAI_API_KEY"],
                leftovers: &[],
                set_env: &[],
            },
            Preset::Aider => PresetDefaults {
                program: "aider",
                args: AIDER_ARGS,
                prompt: PromptVia::File,
                output: OutputFormat::Text,
                result: ResultVia::File,
                secrets: &["OPENAI_API_KEY", "ANTHROPIC_API_KEY"],
                // The repository map's tag cache (v3 with aider's own tree-sitter
                // grammars, v4 with tree-sitter-language-pack).
                leftovers: &[".aider.tags.cache.v3", ".aider.tags.cache.v4"],
                set_env: AIDER_ENV,
            },
        }
    }
}

const PROMPT_PLACEHOLDER: &str = "{prompt_file}";
const RESULT_PLACEHOLDER: &str = "{result_file}";

fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl CommandAgentConfig {
    pub fn validate(&self) -> Result<(), CommandAgentConfigError> {
        self.resolved().map(|_| ())
    }

    /// The preset's defaults with this config's fields on top, checked.
    pub fn resolved(&self) -> Result<ResolvedCommand, CommandAgentConfigError> {
        let preset = self.preset.map(Preset::defaults);
        let program = self
            .program
            .clone()
            .or_else(|| preset.as_ref().map(|p| p.program.to_string()))
            .filter(|p| !p.trim().is_empty())
            .ok_or(CommandAgentConfigError::NoProgram)?;
        let mut args = self.args.clone().unwrap_or_else(|| {
            preset
                .as_ref()
                .map(|p| p.args.iter().map(|a| a.to_string()).collect())
                .unwrap_or_default()
        });
        args.extend(self.extra_args.iter().cloned());
        let prompt = self
            .prompt
            .or(preset.as_ref().map(|p| p.prompt))
            .unwrap_or(PromptVia::Stdin);
        let output = self
            .output
            .or(preset.as_ref().map(|p| p.output))
            .unwrap_or(OutputFormat::Text);
        let result = self
            .result
            .or(preset.as_ref().map(|p| p.result))
            .unwrap_or(match output {
                OutputFormat::Text => ResultVia::File,
                OutputFormat::ClaudeStreamJson | OutputFormat::CodexJson => ResultVia::Stream,
            });
        if result == ResultVia::Stream && output == OutputFormat::Text {
            return Err(CommandAgentConfigError::StreamResultFromText);
        }
        let secrets = if self.secrets.is_empty() {
            preset
                .as_ref()
                .map(|p| p.secrets.iter().map(|s| s.to_string()).collect())
                .unwrap_or_default()
        } else {
            self.secrets.clone()
        };

        if self.stall_secs == 0 {
            return Err(CommandAgentConfigError::Zero("stall_secs"));
        }
        if self.output_bytes == 0 {
            return Err(CommandAgentConfigError::Zero("output_bytes"));
        }
        let uses = |placeholder: &str| args.iter().any(|a| a.contains(placeholder));
        if uses(PROMPT_PLACEHOLDER) && prompt != PromptVia::File {
            return Err(CommandAgentConfigError::PlaceholderWithoutFile {
                placeholder: PROMPT_PLACEHOLDER,
                field: "prompt",
            });
        }
        if uses(RESULT_PLACEHOLDER) && result != ResultVia::File {
            return Err(CommandAgentConfigError::PlaceholderWithoutFile {
                placeholder: RESULT_PLACEHOLDER,
                field: "result",
            });
        }
        for (field, names) in [("env_pass", &self.env_pass), ("secrets", &secrets)] {
            if let Some(bad) = names.iter().find(|n| !is_variable_name(n)) {
                return Err(CommandAgentConfigError::BadVariable {
                    field,
                    name: bad.clone(),
                });
            }
        }
        // `scrubbed_env` would drop it silently; say so instead.
        if let Some(secret) = self
            .env_pass
            .iter()
            .find(|n| flotilla_actors::ports::looks_secret(n))
        {
            return Err(CommandAgentConfigError::SecretInEnvPass(secret.clone()));
        }

        Ok(ResolvedCommand {
            program,
            args,
            prompt,
            output,
            result,
            limits: CommandLimits {
                wall: WALL_CAP,
                stall: Some(Duration::from_secs(self.stall_secs)),
                output_bytes: self.output_bytes,
            },
            env: EnvPolicy {
                pass: self.env_pass.clone(),
                secrets,
            },
            sandbox: self.sandbox,
            leftovers: preset
                .as_ref()
                .map(|p| p.leftovers.iter().map(|l| l.to_string()).collect())
                .unwrap_or_default(),
            set_env: preset
                .as_ref()
                .map(|p| {
                    p.set_env
                        .iter()
                        .map(|(name, value)| (name.to_string(), value.to_string()))
                        .collect()
                })
                .unwrap_or_default(),
        })
    }
}

/// An external CLI as a coding agent.
pub struct CommandAgent {
    shared: Arc<Shared>,
}

struct Shared {
    /// The agent's name in the config (`[agents.NAME]`), for messages.
    name: String,
    command: ResolvedCommand,
    runner: Arc<dyn ProcessRunner>,
    /// The worker's system prompt: the CLI's prompt starts with it.
    system: String,
    /// The example handoffs the prompt shows: an envelope that is one of them is the CLI
    /// echoing its prompt, not reporting its work.
    examples: Vec<FinishArgs>,
}

/// The handoffs shown as examples in a prompt: each fenced JSON block that is one.
fn prompt_examples(prompt: &str) -> Vec<FinishArgs> {
    prompt
        .split("```json")
        .skip(1)
        .filter_map(|after| after.split("```").next())
        .filter_map(|block| serde_json::from_str::<FinishArgs>(block.trim()).ok())
        .filter(|example| !example.summary.trim().is_empty())
        .collect()
}

impl CommandAgent {
    /// `system_prompt` is the worker's system prompt. Refuses a config that cannot run.
    pub fn new(
        name: String,
        config: CommandAgentConfig,
        runner: Arc<dyn ProcessRunner>,
        system_prompt: String,
    ) -> Result<Self, CommandAgentConfigError> {
        let command = config.resolved()?;
        Ok(CommandAgent {
            shared: Arc::new(Shared {
                name,
                command,
                runner,
                examples: prompt_examples(&system_prompt),
                system: system_prompt,
            }),
        })
    }
}

impl Agent for CommandAgent {
    fn open(&self, workspace: Workspace, attempt: AttemptContext) -> Box<dyn AgentSession> {
        Box::new(CommandSession {
            shared: self.shared.clone(),
            workspace,
            attempt,
        })
    }
}

struct CommandSession {
    shared: Arc<Shared>,
    workspace: Workspace,
    attempt: AttemptContext,
}

/// How to hand back, for a CLI: it has no `finish` tool.
fn envelope_instructions(result: ResultVia, root: &Path) -> String {
    let mut text = String::from(
        "## Handing back\nYou have no `finish` tool: your handoff is the JSON object described above (status, summary, files_changed, concerns, suggestions, and a subplan if you propose one). ",
    );
    match result {
        ResultVia::Stream => text.push_str(
            "When you are done, end your final message with it, as one JSON object, with nothing after it. Write your own: the example above is only its shape, and an envelope equal to it is refused.\n",
        ),
        ResultVia::File => text.push_str(&format!(
            "When you are done, write it, as one JSON object and nothing else, to the file {RESULT_FILE} in the repository root ({}; its path is also in ${RESULT_FILE_VAR}). Only that file counts: what you print is not read for it. Write your own: the example above is only its shape, and an envelope equal to it is refused.\n",
            root.join(RESULT_FILE).display()
        )),
    }
    text.push_str(&format!(
        "flotilla removes {PROMPT_FILE} and {RESULT_FILE} itself: never commit them. flotilla commits everything else you leave in the worktree.\n"
    ));
    text
}

impl CommandSession {
    fn call(
        &self,
        task: TaskId,
        branch: String,
        body: String,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>> {
        let prompt = format!(
            "{}\n\n{body}\n{}",
            self.shared.system.trim_end(),
            envelope_instructions(self.shared.command.result, &self.workspace.path)
        );
        let call = Call {
            shared: self.shared.clone(),
            workspace: self.workspace.clone(),
            attempt: self.attempt.clone(),
            task,
            branch,
            prompt,
        };
        Box::pin(call.run())
    }
}

impl AgentSession for CommandSession {
    fn run(
        &mut self,
        assignment: Assignment,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>> {
        let body = super::task_text(&assignment);
        self.call(assignment.task.task.clone(), assignment.branch, body)
    }

    fn revise(
        &mut self,
        assignment: Assignment,
        rejection: RejectionReason,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>> {
        let body = format!(
            "{}\n## Your subplan was refused\nflotilla refused the subplan you proposed for this task: {rejection}. Propose a different one, or do the task yourself and hand back your handoff. What you changed in this directory before is still here.\n",
            super::task_text(&assignment)
        );
        self.call(assignment.task.task.clone(), assignment.branch, body)
    }

    fn synthesize(
        &mut self,
        parent: TaskId,
        results: Vec<SubtaskResult>,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>> {
        let body = format!(
            "{}branch: {} (the worktree is your current directory)\n",
            super::synthesis_text(&parent, "hand back the task's handoff", &results),
            self.workspace.branch
        );
        let branch = self.workspace.branch.clone();
        self.call(parent, branch, body)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The files flotilla puts in the worktree for the CLI, and the leftovers of the CLI's own
/// that a call created. Removed before a call returns; if the call's future is dropped
/// first (the Worker gave up waiting), removed on drop.
struct ScratchFiles {
    root: PathBuf,
    /// Leftovers that were not there when the call started: the call's to remove.
    leftovers: Vec<PathBuf>,
    armed: bool,
}

/// Removes a file, a link (never what it points to) or a directory, if there.
async fn remove_path(path: &Path) -> std::io::Result<()> {
    match tokio::fs::symlink_metadata(path).await {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(meta) if meta.is_dir() => tokio::fs::remove_dir_all(path).await,
        Ok(_) => tokio::fs::remove_file(path).await,
    }
}

impl ScratchFiles {
    fn new(root: &Path) -> Self {
        ScratchFiles {
            root: root.to_path_buf(),
            leftovers: Vec::new(),
            armed: true,
        }
    }

    fn prompt(&self) -> PathBuf {
        self.root.join(PROMPT_FILE)
    }

    fn result(&self) -> PathBuf {
        self.root.join(RESULT_FILE)
    }

    /// Of the leftovers the CLI is known to make, the ones not there yet are this call's:
    /// one the repository itself holds is never touched.
    async fn watch(&mut self, names: &[String]) {
        for name in names {
            let path = self.root.join(name);
            if let Err(e) = tokio::fs::symlink_metadata(&path).await
                && e.kind() == std::io::ErrorKind::NotFound
            {
                self.leftovers.push(path);
            }
        }
    }

    fn paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.prompt(), self.result()];
        paths.extend(self.leftovers.iter().cloned());
        paths
    }

    /// Removes them all (whatever the CLI made of them: a directory goes too).
    async fn clear(&mut self) -> Result<(), AgentError> {
        for path in self.paths() {
            remove_path(&path).await.map_err(|e| {
                AgentError::Crashed(format!("cannot remove {}: {e}", path.display()))
            })?;
        }
        Ok(())
    }

    async fn done(mut self) -> Result<(), AgentError> {
        self.clear().await?;
        self.armed = false;
        Ok(())
    }
}

impl Drop for ScratchFiles {
    fn drop(&mut self) {
        if self.armed {
            for path in self.paths() {
                let is_dir = std::fs::symlink_metadata(&path).is_ok_and(|meta| meta.is_dir());
                let _ = if is_dir {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
            }
        }
    }
}

/// One process: one `run`, `revise` or `synthesize`.
struct Call {
    shared: Arc<Shared>,
    workspace: Workspace,
    attempt: AttemptContext,
    task: TaskId,
    branch: String,
    prompt: String,
}

impl Call {
    async fn run(self) -> Result<AgentReport, AgentError> {
        if self.attempt.cancel.is_cancelled() {
            return Err(AgentError::Cancelled);
        }
        let command = &self.shared.command;
        let name = &self.shared.name;
        let mut scratch = ScratchFiles::new(&self.workspace.path);
        // A result left by an earlier call must not pass for this one's.
        scratch.clear().await?;
        scratch.watch(&command.leftovers).await;
        let mut stdin = None;
        let mut args: Vec<String> = command
            .args
            .iter()
            .map(|a| {
                a.replace(PROMPT_PLACEHOLDER, &scratch.prompt().to_string_lossy())
                    .replace(RESULT_PLACEHOLDER, &scratch.result().to_string_lossy())
            })
            .collect();
        match command.prompt {
            PromptVia::Stdin => stdin = Some(self.prompt.clone().into_bytes()),
            PromptVia::Arg => args.push(self.prompt.clone()),
            PromptVia::File => {
                tokio::fs::write(scratch.prompt(), &self.prompt)
                    .await
                    .map_err(|e| {
                        AgentError::Crashed(format!("{name}: cannot write {PROMPT_FILE}: {e}"))
                    })?;
            }
        }
        let mut env = command.set_env.clone();
        env.extend([
            ("TERM".to_string(), "dumb".to_string()),
            ("FLOTILLA_TASK".to_string(), self.task.to_string()),
            ("FLOTILLA_BRANCH".to_string(), self.branch.clone()),
        ]);
        if command.result == ResultVia::File {
            env.push((
                RESULT_FILE_VAR.to_string(),
                scratch.result().to_string_lossy().into_owned(),
            ));
        }
        let spec = CommandSpec {
            program: command.program.clone(),
            args,
            cwd: self.workspace.path.clone(),
            stdin,
            // The daemon's credentials are held apart from its environment (ADR-015):
            // a key reaches the CLI only if `secrets` names it.
            env: scrubbed_env(crate::keys::command_environment(), &command.env, &env),
            limits: command.limits,
            sandbox: command.sandbox,
        };

        let mut roots = vec![self.workspace.path.clone()];
        if let Ok(canonical) = tokio::fs::canonicalize(&self.workspace.path).await
            && canonical != self.workspace.path
        {
            roots.push(canonical);
        }
        let stream = Arc::new(Mutex::new(EventStream::new(command.output, roots)));
        let sink = {
            let stream = stream.clone();
            let attempt = self.attempt.clone();
            LineSink::new(move |from, line| {
                if from != Stream::Stdout {
                    return;
                }
                let heard = lock(&stream).line(line);
                for activity in &heard.activities {
                    attempt.activity.report(activity);
                }
                if let Some(spent) = heard.spent {
                    attempt.spend.report(spent);
                }
            })
        };

        let ran = self
            .shared
            .runner
            .run(spec, self.attempt.cancel.clone(), Some(sink))
            .await;
        let result_file = match (&ran, command.result) {
            (Ok(_), ResultVia::File) => Some(read_result_file(&scratch.result()).await),
            _ => None,
        };
        scratch.done().await?;

        let output = ran.map_err(|e| start_failure(name, e))?;
        if output.exit == Exit::Cancelled || self.attempt.cancel.is_cancelled() {
            return Err(AgentError::Cancelled);
        }
        let stream = std::mem::replace(
            &mut *lock(&stream),
            EventStream::new(command.output, Vec::new()),
        );
        self.conclude(output, stream, result_file).await
    }

    /// How the process ended and what it handed back, as the attempt's outcome. Every
    /// failure reason starts with the agent's name and the cause (what the CLI itself said
    /// went wrong, when it said so), the end of its output last.
    async fn conclude(
        &self,
        output: CommandOutput,
        stream: EventStream,
        result_file: Option<Result<String, String>>,
    ) -> Result<AgentReport, AgentError> {
        let name = &self.shared.name;
        let tail = last_output(&output.stdout.text, &output.stderr.text);
        let exit_failure = match output.exit {
            Exit::Stalled => {
                return Err(AgentError::Crashed(format!(
                    "{name}: stalled: it wrote nothing for {}s and was killed; last output: {tail}",
                    self.shared
                        .command
                        .limits
                        .stall
                        .map_or(0, |stall| stall.as_secs())
                )));
            }
            Exit::TimedOut => return Err(AgentError::Timeout),
            Exit::Code { code: 0 } => None,
            Exit::Code { code } => Some(format!("exited with code {code}")),
            Exit::Signal { signal } => Some(format!("was killed by signal {signal}")),
            exit => Some(exit.to_string()),
        };
        let final_text = match (stream.verdict(), exit_failure) {
            // The CLI's own account of its failure is the cause; the exit code follows.
            (Err(StreamEnd::Failed(cause)), exit) => {
                let exit = exit.map(|e| format!(" ({e})")).unwrap_or_default();
                return Err(AgentError::Crashed(format!(
                    "{name}: {cause}{exit}; last output: {tail}"
                )));
            }
            // Codex's server has no Responses API: every attempt would get the same 404.
            (Err(StreamEnd::Unservable(cause)), exit) => {
                let exit = exit.map(|e| format!(" ({e})")).unwrap_or_default();
                return Err(AgentError::CannotStart(format!(
                    "{name}: {cause}{exit}; not retried: the model server has no Responses API \
                     (POST …/responses answered 404), which Codex needs; a server that speaks \
                     only chat completions cannot serve it: put a Responses API in front of it \
                     or give the task another agent; last output: {tail}"
                )));
            }
            // A non-zero exit is a failure whatever the CLI handed back.
            (_, Some(exit)) => {
                return Err(AgentError::Crashed(format!(
                    "{name}: {exit}; last output: {tail}"
                )));
            }
            (Err(StreamEnd::Unfinished(why)), None) => {
                return Err(AgentError::Malformed(format!(
                    "{name}: {why}; last output: {tail}"
                )));
            }
            (Ok(text), None) => text,
        };
        let envelope = match (self.shared.command.result, result_file) {
            (ResultVia::File, Some(file)) => file
                .and_then(|text| parse_json_answer::<FinishArgs>(&text, MAX_ENVELOPE_BYTES))
                .map_err(|why| format!("wrote no result envelope to {RESULT_FILE}: {why}")),
            (ResultVia::File, None) => Err(format!("wrote no result envelope to {RESULT_FILE}")),
            (ResultVia::Stream, _) => match final_text {
                // Looking for the envelope may parse hundreds of candidates in a message
                // full of braces: on a blocking thread, never the actors' one.
                Some(text) => tokio::task::spawn_blocking(move || envelope_in(&text))
                    .await
                    .ok()
                    .flatten()
                    .ok_or_else(|| "ended its final message with no result envelope".to_string()),
                None => Err("has no final message to read a result envelope from".to_string()),
            },
        };
        let args = envelope
            .map_err(|why| AgentError::Malformed(format!("{name}: {why}; last output: {tail}")))?;
        if self
            .shared
            .examples
            .iter()
            .any(|example| example.summary.trim() == args.summary.trim())
        {
            return Err(AgentError::Malformed(format!(
                "{name}: the agent echoed the prompt's example handoff (summary {:?}) instead of reporting its own work",
                one_line(&args.summary, DETAIL_CHARS)
            )));
        }
        Ok(self.finished(args, &stream))
    }

    /// The envelope as the attempt's report, its text bounded as the built-in agent's.
    fn finished(&self, args: FinishArgs, stream: &EventStream) -> AgentReport {
        let tokens = stream.tokens();
        // What this process spent, which is what it reported as it went.
        let metrics = HandoffMetrics {
            tokens_in: tokens.input,
            tokens_out: tokens.output,
            tool_calls: stream.tool_calls,
            cost_usd: stream.cost,
            ..HandoffMetrics::default()
        };
        args.into_report(&self.task, metrics, None)
    }
}

/// Why the CLI did not start, cause first. A program that is not there (removed from the
/// daemon's `PATH` after submit, or hidden by the sandbox) or a sandbox that cannot run
/// fails the task at once: another attempt would meet the same wall (issue 25).
fn start_failure(name: &str, error: ProcessError) -> AgentError {
    match error {
        ProcessError::NotFound { program, detail } => AgentError::CannotStart(format!(
            "{name}: program not found {detail} ({program:?}); not retried: install it (or \
             show it to the sandbox) and submit again"
        )),
        ProcessError::SandboxUnavailable(why) => {
            AgentError::CannotStart(format!("{name}: the sandbox is not available: {why}"))
        }
        // The program's path is what a start failure is about, so it is said there.
        error @ (ProcessError::Spawn { .. } | ProcessError::Io { .. }) => {
            AgentError::Crashed(format!("{name}: {error}"))
        }
    }
}

/// The result file's text, read through one descriptor so that what is checked is what
/// is read: not followed if it is a link (`O_NOFOLLOW`), never waited on if it is a FIFO
/// (`O_NONBLOCK`), only a regular file with a single link (a hard link would hand back a
/// file the CLI did not write: a repository file, one outside the worktree), and only as
/// much as a handoff may be.
async fn read_result_file(path: &Path) -> Result<String, String> {
    use tokio::io::AsyncReadExt;
    let file = match tokio::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .await
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err("the file is missing".into());
        }
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err("it is a symbolic link, not a file the agent wrote".into());
        }
        Err(e) => return Err(e.to_string()),
    };
    let meta = file.metadata().await.map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("it is not a regular file".into());
    }
    if meta.nlink() != 1 {
        return Err(format!(
            "it has {} hard links: a link to another file is not a result",
            meta.nlink()
        ));
    }
    if meta.len() > MAX_ENVELOPE_BYTES as u64 {
        return Err(format!(
            "it is {} bytes; at most {MAX_ENVELOPE_BYTES} are read",
            meta.len()
        ));
    }
    let mut bytes = Vec::new();
    // Bounded again in the read: the file may grow after the check.
    file.take(MAX_ENVELOPE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| e.to_string())?;
    if bytes.len() > MAX_ENVELOPE_BYTES {
        return Err(format!(
            "it grew past {MAX_ENVELOPE_BYTES} bytes while it was read"
        ));
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err("the file is empty".into());
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The envelope in a CLI's final text: the *last* JSON object in it that is one (a CLI's
/// text may show code full of braces, or echo the example envelope of its prompt, before
/// its own); failing that, whatever [`parse_json_answer`] finds.
fn envelope_in(text: &str) -> Option<FinishArgs> {
    let mut start = text.len().saturating_sub(MAX_ENVELOPE_BYTES);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let end = &text[start..];
    for (at, _) in end.rmatch_indices('{').take(MAX_ENVELOPE_TRIES) {
        let mut values = serde_json::Deserializer::from_str(&end[at..]).into_iter::<FinishArgs>();
        if let Some(Ok(args)) = values.next() {
            return Some(args);
        }
    }
    parse_json_answer(end, MAX_ENVELOPE_BYTES).ok()
}

/// The end of what the CLI wrote, for an error message: at most [`TAIL_CHARS`] of stderr
/// and stdout together, each getting half when both have more.
fn last_output(stdout: &str, stderr: &str) -> String {
    const ERR: &str = "[stderr] ";
    const OUT: &str = "\n[stdout] ";
    let (out, err) = (stdout.trim(), stderr.trim());
    match (out.is_empty(), err.is_empty()) {
        (true, true) => "(none)".into(),
        (false, true) => last_chars(out, TAIL_CHARS),
        (true, false) => last_chars(err, TAIL_CHARS),
        (false, false) => {
            let budget = TAIL_CHARS - ERR.len() - OUT.len();
            let (err_n, out_n) = (err.chars().count(), out.chars().count());
            let err_take = err_n.min((budget / 2).max(budget.saturating_sub(out_n)));
            let out_take = out_n.min(budget - err_take);
            format!(
                "{ERR}{}{OUT}{}",
                last_chars(err, err_take),
                last_chars(out, out_take)
            )
        }
    }
}

fn last_chars(text: &str, n: usize) -> String {
    let count = text.chars().count();
    text.chars().skip(count.saturating_sub(n)).collect()
}

/// `text` on one line, cut to `max` characters (with an ellipsis when cut).
fn one_line(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        flat
    } else {
        let mut cut: String = flat.chars().take(max).collect();
        cut.push('…');
        cut
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Tokens {
    input: u64,
    output: u64,
}

impl Tokens {
    fn max(self, other: Tokens) -> Tokens {
        Tokens {
            input: self.input.max(other.input),
            output: self.output.max(other.output),
        }
    }

    fn plus(self, other: Tokens) -> Tokens {
        Tokens {
            input: self.input.saturating_add(other.input),
            output: self.output.saturating_add(other.output),
        }
    }

    fn total(self) -> u64 {
        self.input.saturating_add(self.output)
    }
}

/// What one line of the CLI's output told flotilla.
#[derive(Debug, Default, PartialEq)]
struct Heard {
    activities: Vec<String>,
    /// Spent since the previous report.
    spent: Option<Budget>,
}

/// Claude Code's `--output-format stream-json` events: one JSON object a line. Only what
/// flotilla reads is typed; other events and fields are passed over.
mod claude {
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    pub enum Event {
        Assistant {
            message: Message,
        },
        /// The last event of a session: its outcome, final text, usage and cost.
        Result(ResultEvent),
        /// `system` (init), `user` (tool results) and whatever a later version adds.
        #[serde(other)]
        Other,
    }

    #[derive(Debug, Deserialize)]
    pub struct Message {
        #[serde(default)]
        pub id: Option<String>,
        #[serde(default)]
        pub content: Vec<Block>,
        #[serde(default)]
        pub usage: Option<Usage>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    pub enum Block {
        Text {
            text: String,
        },
        ToolUse {
            #[serde(default)]
            id: Option<String>,
            name: String,
            /// Each tool's own arguments: free-form by nature.
            #[serde(default)]
            input: serde_json::Map<String, serde_json::Value>,
        },
        /// `thinking` and the rest.
        #[serde(other)]
        Other,
    }

    #[derive(Debug, Clone, Copy, Default, Deserialize)]
    pub struct Usage {
        #[serde(default)]
        pub input_tokens: u64,
        #[serde(default)]
        pub cache_creation_input_tokens: u64,
        #[serde(default)]
        pub output_tokens: u64,
    }

    /// `subtype` is `success` or an error's kind (`error_max_turns`,
    /// `error_during_execution`, …); `is_error` is set on every failure, a failed API
    /// call included (whose subtype may still say `success`). Both are required: a result
    /// event without them is not one.
    #[derive(Debug, Clone, Deserialize)]
    pub struct ResultEvent {
        pub subtype: String,
        pub is_error: bool,
        #[serde(default)]
        pub result: Option<String>,
        #[serde(default)]
        pub usage: Option<Usage>,
        #[serde(default)]
        pub total_cost_usd: Option<f64>,
    }
}

/// Codex's `codex exec --json` events (codex-rs `exec_events.rs`): one JSON object a line.
mod codex {
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(tag = "type")]
    pub enum Event {
        #[serde(rename = "turn.started")]
        TurnStarted,
        /// The turn's usage: the session's running totals.
        #[serde(rename = "turn.completed")]
        TurnCompleted { usage: Usage },
        #[serde(rename = "turn.failed")]
        TurnFailed { error: ErrorMessage },
        #[serde(rename = "item.started")]
        ItemStarted { item: Item },
        #[serde(rename = "item.updated")]
        ItemUpdated { item: Item },
        #[serde(rename = "item.completed")]
        ItemCompleted { item: Item },
        /// An unrecoverable error of the stream.
        #[serde(rename = "error")]
        Error(ErrorMessage),
        /// `thread.started` and whatever a later version adds.
        #[serde(other)]
        Other,
    }

    #[derive(Debug, Clone, Copy, Default, Deserialize)]
    pub struct Usage {
        #[serde(default)]
        pub input_tokens: u64,
        #[serde(default)]
        pub output_tokens: u64,
    }

    #[derive(Debug, Clone, Deserialize)]
    pub struct ErrorMessage {
        pub message: String,
    }

    #[derive(Debug, Deserialize)]
    pub struct Item {
        pub id: String,
        #[serde(flatten)]
        pub details: Details,
    }

    #[derive(Debug, Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    pub enum Details {
        AgentMessage {
            text: String,
        },
        CommandExecution {
            command: String,
        },
        FileChange {
            changes: Vec<FileChange>,
        },
        McpToolCall {
            server: String,
            tool: String,
        },
        WebSearch {
            query: String,
        },
        /// A non-fatal error.
        Error {
            message: String,
        },
        /// `reasoning`, `todo_list`, `plan` and whatever a later version adds.
        #[serde(other)]
        Other,
    }

    #[derive(Debug, Deserialize)]
    pub struct FileChange {
        pub path: String,
    }
}

/// How a structured stream ended, when it did not end well.
#[derive(Debug, Clone, PartialEq, Eq)]
enum StreamEnd {
    /// The CLI said it failed (Claude's error result, Codex's `turn.failed` or `error`):
    /// the cause, in its words.
    Failed(String),
    /// It never said how it ended (no result event, no completed turn), or said it twice.
    Unfinished(String),
    /// The CLI said it failed in a way no other attempt escapes: Codex's model server has
    /// no Responses API (a server that speaks only chat completions answers its
    /// `POST …/responses` with 404, every time). The cause, in its words.
    Unservable(String),
}

/// Whether a Codex `turn.failed` message is its model server answering `POST …/responses`
/// with 404: the server does not speak the Responses API, which Codex 0.171 needs, so a
/// retry meets the same 404 (issue 25). Codex words it `unexpected status 404 Not Found:
/// …, url: http://…/v1/responses, …` after its own reconnects.
fn responses_api_missing(message: &str) -> bool {
    message.contains("404") && message.contains("/responses")
}

/// The CLI's stdout, read line by line: its live activity, what it spent (reported once:
/// every stream's usage is turned into running totals, and only their growth is
/// reported), the tools it called, and how it ended. Lines that are not the events
/// expected are passed over: a CLI may print a banner, and its events change between
/// versions.
struct EventStream {
    format: OutputFormat,
    /// The worktree (and its canonical path): tool paths are shown relative to it.
    roots: Vec<PathBuf>,
    /// Claude: the usage of each message, by id (a message's usage is repeated, and may
    /// grow, on every event of the message).
    messages: HashMap<String, Tokens>,
    /// The sum of `messages` and of the messages without an id, kept as they change: summed
    /// again on every line, a long session cost time quadratic in its messages (issue 20).
    message_sum: Tokens,
    /// Claude: the `result` event's totals. Codex: the latest `turn.completed` totals.
    totals: Tokens,
    cost: Usd,
    reported_tokens: u64,
    reported_cost: Usd,
    tool_calls: u64,
    /// Tool calls and items already counted, by id.
    seen: HashSet<String>,
    /// Claude: every `result` event (one is expected).
    results: Vec<claude::ResultEvent>,
    /// Codex: the last agent message of the turn under way.
    turn_message: Option<String>,
    /// Codex: the last agent message of the last completed turn, once one completed and
    /// none started after it.
    completed_message: Option<Option<String>>,
    /// Codex: the first `turn.failed` message, and the last `error` event's.
    turn_failed: Option<String>,
    /// Codex: that first `turn.failed` was its server's 404 on `/responses`.
    turn_unservable: bool,
    stream_error: Option<String>,
}

/// The most of a CLI's own failure message a reason keeps.
const CAUSE_CHARS: usize = 2_000;

impl EventStream {
    fn new(format: OutputFormat, roots: Vec<PathBuf>) -> Self {
        EventStream {
            format,
            roots,
            messages: HashMap::new(),
            message_sum: Tokens::default(),
            totals: Tokens::default(),
            cost: Usd::ZERO,
            reported_tokens: 0,
            reported_cost: Usd::ZERO,
            tool_calls: 0,
            seen: HashSet::new(),
            results: Vec::new(),
            turn_message: None,
            completed_message: None,
            turn_failed: None,
            turn_unservable: false,
            stream_error: None,
        }
    }

    fn line(&mut self, line: &str) -> Heard {
        let mut heard = Heard::default();
        match self.format {
            OutputFormat::Text => {
                let line = line.trim();
                if !line.is_empty() {
                    heard.activities.push(line.to_string());
                }
            }
            OutputFormat::ClaudeStreamJson => {
                if let Ok(event) = serde_json::from_str::<claude::Event>(line.trim()) {
                    self.claude(event, &mut heard);
                }
            }
            OutputFormat::CodexJson => {
                if let Ok(event) = serde_json::from_str::<codex::Event>(line.trim()) {
                    self.codex(event, &mut heard);
                }
            }
        }
        heard.spent = self.unreported();
        heard
    }

    /// The tokens known so far: a stream's totals, or the sum of its messages when those
    /// came first (or say more).
    fn tokens(&self) -> Tokens {
        self.totals.max(self.message_sum)
    }

    /// The growth of the running totals since the last report.
    fn unreported(&mut self) -> Option<Budget> {
        let tokens = self.tokens().total();
        let more_tokens = tokens.saturating_sub(self.reported_tokens);
        let more_cost = self.cost.saturating_sub(self.reported_cost);
        self.reported_tokens = self.reported_tokens.max(tokens);
        self.reported_cost = self.reported_cost.max(self.cost);
        (more_tokens > 0 || more_cost > Usd::ZERO).then(|| Budget::new(more_tokens, more_cost, 0))
    }

    /// How the stream ended: the final text its last event gave (none for plain text,
    /// which has no final event), or why there is none.
    fn verdict(&self) -> Result<Option<String>, StreamEnd> {
        match self.format {
            OutputFormat::Text => Ok(None),
            OutputFormat::ClaudeStreamJson => match self.results.as_slice() {
                [] => Err(StreamEnd::Unfinished(
                    "ended without its result event".into(),
                )),
                [result] if result.is_error || result.subtype != "success" => {
                    let said = result
                        .result
                        .as_deref()
                        .filter(|text| !text.trim().is_empty())
                        .map_or_else(|| "no message".to_string(), |t| one_line(t, CAUSE_CHARS));
                    Err(StreamEnd::Failed(format!(
                        "error result ({}): {said}",
                        one_line(&result.subtype, DETAIL_CHARS)
                    )))
                }
                [result] => Ok(result.result.clone()),
                more => Err(StreamEnd::Unfinished(format!(
                    "printed {} result events where a session has one",
                    more.len()
                ))),
            },
            OutputFormat::CodexJson => {
                if let Some(message) = &self.turn_failed {
                    let cause = format!("turn failed: {message}");
                    return Err(if self.turn_unservable {
                        StreamEnd::Unservable(cause)
                    } else {
                        StreamEnd::Failed(cause)
                    });
                }
                match &self.completed_message {
                    Some(message) => Ok(message.clone()),
                    None => match &self.stream_error {
                        Some(message) => Err(StreamEnd::Failed(format!("error: {message}"))),
                        None => Err(StreamEnd::Unfinished(
                            "ended without completing its turn".into(),
                        )),
                    },
                }
            }
        }
    }

    /// Counts a tool call once (by its id, when it has one); true the first time.
    fn first_sight(&mut self, id: Option<&str>) -> bool {
        match id {
            Some(id) => self.seen.insert(id.to_string()),
            None => true,
        }
    }

    fn relative(&self, path: &str) -> String {
        self.roots
            .iter()
            .find_map(|root| Path::new(path).strip_prefix(root).ok())
            .map_or_else(|| path.to_string(), |p| p.display().to_string())
    }

    /// Claude Code's `stream-json`: `assistant` events (text and `tool_use` blocks, the
    /// message's usage), then one `result` (the outcome, the final text, the session's
    /// usage and cost).
    fn claude(&mut self, event: claude::Event, heard: &mut Heard) {
        match event {
            claude::Event::Assistant { message } => {
                if let Some(usage) = message.usage {
                    let tokens = claude_tokens(usage);
                    match message.id {
                        Some(id) => {
                            // Linear in the messages: each message's growth is added
                            // to the running sum as it is seen.
                            let seen = self.messages.entry(id).or_default();
                            let grown = seen.max(tokens);
                            self.message_sum = self.message_sum.plus(Tokens {
                                input: grown.input - seen.input,
                                output: grown.output - seen.output,
                            });
                            *seen = grown;
                        }
                        None => self.message_sum = self.message_sum.plus(tokens),
                    }
                }
                for block in message.content {
                    match block {
                        claude::Block::Text { text } => {
                            if !text.trim().is_empty() {
                                heard.activities.push(one_line(&text, GIST_CHARS));
                            }
                        }
                        claude::Block::ToolUse { id, name, input } => {
                            if self.first_sight(id.as_deref()) {
                                self.tool_calls += 1;
                                heard.activities.push(self.describe_tool(&name, &input));
                            }
                        }
                        claude::Block::Other => {}
                    }
                }
            }
            claude::Event::Result(result) => {
                if let Some(usage) = result.usage {
                    self.totals = self.totals.max(claude_tokens(usage));
                }
                if let Some(cost) = result
                    .total_cost_usd
                    .and_then(|d| Usd::from_dollars(d).ok())
                {
                    self.cost = self.cost.max(cost);
                }
                if result.is_error {
                    let said = result.result.as_deref().unwrap_or(&result.subtype);
                    heard
                        .activities
                        .push(format!("error: {}", one_line(said, DETAIL_CHARS)));
                }
                self.results.push(result);
            }
            claude::Event::Other => {}
        }
    }

    /// A Claude Code tool call in a few words: `bash: cargo test`, `Edit src/a.rs`.
    fn describe_tool(&self, name: &str, input: &serde_json::Map<String, Value>) -> String {
        let arg = |key: &str| input.get(key).and_then(Value::as_str);
        if name == "Bash"
            && let Some(command) = arg("command")
        {
            return format!("bash: {}", one_line(command, DETAIL_CHARS));
        }
        if let Some(path) = ["file_path", "notebook_path", "path"]
            .iter()
            .find_map(|key| arg(key))
        {
            return format!("{name} {}", one_line(&self.relative(path), DETAIL_CHARS));
        }
        match ["pattern", "url", "query", "description", "command"]
            .iter()
            .find_map(|key| arg(key))
        {
            Some(what) => format!("{name} {}", one_line(what, DETAIL_CHARS)),
            None => name.to_string(),
        }
    }

    /// Codex's `exec --json`: `item.started` / `item.completed` events (agent messages,
    /// commands, file changes, tool calls), then the turn's end: `turn.completed` with the
    /// session's usage, or `turn.failed` with why.
    fn codex(&mut self, event: codex::Event, heard: &mut Heard) {
        use codex::{Details, Event};
        match event {
            Event::TurnStarted => {
                self.turn_message = None;
                self.completed_message = None;
            }
            Event::ItemStarted { item } | Event::ItemUpdated { item } => {
                self.codex_tool(item, heard);
            }
            Event::ItemCompleted { item } => match item.details {
                Details::AgentMessage { text } => {
                    if !text.trim().is_empty() {
                        heard.activities.push(one_line(&text, GIST_CHARS));
                        self.turn_message = Some(text);
                    }
                }
                Details::Error { message } => {
                    heard
                        .activities
                        .push(format!("error: {}", one_line(&message, DETAIL_CHARS)));
                }
                _ => self.codex_tool(item, heard),
            },
            Event::TurnCompleted { usage } => {
                // The session's running totals (cached input is part of the input).
                let tokens = Tokens {
                    input: usage.input_tokens,
                    output: usage.output_tokens,
                };
                self.totals = self.totals.max(tokens);
                self.completed_message = Some(self.turn_message.take());
            }
            Event::TurnFailed { error } => {
                heard.activities.push(format!(
                    "turn failed: {}",
                    one_line(&error.message, DETAIL_CHARS)
                ));
                if self.turn_failed.is_none() {
                    // Judged on the whole message: the URL may be past what is kept of it.
                    self.turn_unservable = responses_api_missing(&error.message);
                    self.turn_failed = Some(one_line(&error.message, CAUSE_CHARS));
                }
            }
            Event::Error(error) => {
                heard
                    .activities
                    .push(format!("error: {}", one_line(&error.message, DETAIL_CHARS)));
                self.stream_error = Some(one_line(&error.message, CAUSE_CHARS));
            }
            Event::Other => {}
        }
    }

    /// A Codex tool item, counted once however many events it has.
    fn codex_tool(&mut self, item: codex::Item, heard: &mut Heard) {
        use codex::Details;
        let activity = match &item.details {
            Details::CommandExecution { command } => {
                format!("bash: {}", one_line(command, DETAIL_CHARS))
            }
            Details::FileChange { changes } => {
                let paths: Vec<String> = changes.iter().map(|c| self.relative(&c.path)).collect();
                format!("edit {}", one_line(&paths.join(", "), DETAIL_CHARS))
            }
            Details::McpToolCall { server, tool } => format!("{server}.{tool}"),
            Details::WebSearch { query } => format!("search: {}", one_line(query, DETAIL_CHARS)),
            Details::AgentMessage { .. } | Details::Error { .. } | Details::Other => return,
        };
        if self.first_sight(Some(&item.id)) {
            self.tool_calls += 1;
            heard.activities.push(activity);
        }
    }
}

/// A Claude usage object's tokens. Cache writes are input the model processed; cache reads
/// are left out: Claude Code re-reads its whole context from the cache on every turn, and
/// counting that would spend a token budget many times over on tokens billed at a tenth
/// (their money is in the cost).
fn claude_tokens(usage: claude::Usage) -> Tokens {
    Tokens {
        input: usage
            .input_tokens
            .saturating_add(usage.cache_creation_input_tokens),
        output: usage.output_tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_actors::protocol::HandoffStatus;

    fn config(toml_text: &str) -> CommandAgentConfig {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn a_preset_fills_in_what_the_config_leaves_out_and_every_field_overrides_it() {
        let claude = config("preset = \"claude-code\"").resolved().unwrap();
        assert_eq!(claude.program, "claude");
        assert_eq!(
            claude.args,
            ["-p", "--output-format", "stream-json", "--verbose"]
        );
        assert_eq!(claude.prompt, PromptVia::Stdin);
        assert_eq!(claude.output, OutputFormat::ClaudeStreamJson);
        assert_eq!(claude.result, ResultVia::Stream);
        assert_eq!(claude.env.secrets, ["ANTHROPIC_API_KEY"]);
        assert_eq!(claude.limits.stall, Some(Duration::from_secs(300)));
        assert_eq!(claude.limits.output_bytes, 64 * 1024);
        assert!(claude.limits.wall >= Duration::from_secs(3600));

        let codex = config("preset = \"codex\"").resolved().unwrap();
        assert_eq!(
            (codex.program.as_str(), codex.args.clone()),
            ("codex", vec!["exec".into(), "--json".into()])
        );
        assert_eq!(codex.output, OutputFormat::CodexJson);
        assert_eq!(codex.result, ResultVia::Stream);
        assert_eq!(codex.env.secrets, ["OPENAI_API_KEY"]);

        let aider = config("preset = \"aider\"").resolved().unwrap();
        assert_eq!(aider.prompt, PromptVia::File);
        assert_eq!(aider.args.last().unwrap(), "{prompt_file}");
        assert_eq!(aider.output, OutputFormat::Text);
        assert_eq!(aider.result, ResultVia::File, "text has no final event");
        assert_eq!(aider.env.secrets, ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"]);
        assert_eq!(
            aider.leftovers,
            [".aider.tags.cache.v3", ".aider.tags.cache.v4"]
        );
        for flag in ["--no-gitignore", "--no-auto-commits", "--no-analytics"] {
            assert!(aider.args.iter().any(|a| a == flag), "{flag}");
        }
        let identity: Vec<&str> = aider.set_env.iter().map(|(n, _)| n.as_str()).collect();
        assert!(
            identity.contains(&"GIT_CONFIG_COUNT")
                && identity.contains(&"LITELLM_LOCAL_MODEL_COST_MAP"),
            "a git identity, no price-map fetch: {identity:?}"
        );
        assert!(codex.set_env.is_empty() && claude.set_env.is_empty());

        // extra_args add to the preset's arguments; args replace them.
        let more = config("preset = \"aider\"\nextra_args = [\"--model\", \"openai/qwen\"]")
            .resolved()
            .unwrap();
        assert_eq!(more.args.len(), AIDER_ARGS.len() + 2);
        assert_eq!(&more.args[..AIDER_ARGS.len()], AIDER_ARGS);
        assert_eq!(&more.args[AIDER_ARGS.len()..], ["--model", "openai/qwen"]);
        let replaced =
            config("preset = \"codex\"\nargs = [\"exec\"]\nextra_args = [\"--ephemeral\"]")
                .resolved()
                .unwrap();
        assert_eq!(replaced.args, ["exec", "--ephemeral"]);
        let old_name = config("preset = \"codex\"\nresult = \"stdout\"")
            .resolved()
            .unwrap();
        assert_eq!(
            old_name.result,
            ResultVia::Stream,
            "the old name still reads"
        );

        let mine = config(
            r#"
preset = "claude-code"
program = "/opt/claude/bin/claude"
args = ["-p", "--output-format", "stream-json", "--verbose", "--permission-mode", "acceptEdits"]
result = "file"
stall_secs = 60
output_bytes = 1024
secrets = ["MY_ANTHROPIC_KEY"]
env_pass = ["EDITOR"]
sandbox = "bwrap"
"#,
        )
        .resolved()
        .unwrap();
        assert_eq!(mine.program, "/opt/claude/bin/claude");
        assert_eq!(mine.args.len(), 6);
        assert_eq!(mine.output, OutputFormat::ClaudeStreamJson, "kept");
        assert_eq!(mine.result, ResultVia::File);
        assert_eq!(mine.limits.stall, Some(Duration::from_secs(60)));
        assert_eq!(mine.limits.output_bytes, 1024);
        assert_eq!(mine.env.secrets, ["MY_ANTHROPIC_KEY"]);
        assert_eq!(mine.env.pass, ["EDITOR"]);
        assert_eq!(mine.sandbox, Sandbox::Bwrap);

        let plain = config("program = \"my-agent\"").resolved().unwrap();
        assert!(plain.args.is_empty());
        assert_eq!(
            (plain.prompt, plain.output, plain.result),
            (PromptVia::Stdin, OutputFormat::Text, ResultVia::File)
        );
        assert!(plain.leftovers.is_empty());
        let structured = config("program = \"my-agent\"\noutput = \"codex_json\"")
            .resolved()
            .unwrap();
        assert_eq!(structured.result, ResultVia::Stream);
        assert!(plain.env.secrets.is_empty());
    }

    #[test]
    fn impossible_settings_are_refused_by_name() {
        assert!(toml::from_str::<CommandAgentConfig>("progam = \"x\"").is_err());
        assert!(toml::from_str::<CommandAgentConfig>("preset = \"cursor\"").is_err());
        assert_eq!(
            config("").validate(),
            Err(CommandAgentConfigError::NoProgram)
        );
        assert_eq!(
            config("program = \" \"").validate(),
            Err(CommandAgentConfigError::NoProgram)
        );
        assert_eq!(
            config("program = \"a\"\nstall_secs = 0").validate(),
            Err(CommandAgentConfigError::Zero("stall_secs"))
        );
        assert_eq!(
            config("program = \"a\"\noutput_bytes = 0").validate(),
            Err(CommandAgentConfigError::Zero("output_bytes"))
        );
        assert_eq!(
            config("program = \"a\"\nargs = [\"--in\", \"{prompt_file}\"]").validate(),
            Err(CommandAgentConfigError::PlaceholderWithoutFile {
                placeholder: "{prompt_file}",
                field: "prompt"
            })
        );
        assert_eq!(
            config("preset = \"aider\"\nprompt = \"stdin\"").validate(),
            Err(CommandAgentConfigError::PlaceholderWithoutFile {
                placeholder: "{prompt_file}",
                field: "prompt"
            }),
            "an override that contradicts the preset's arguments"
        );
        assert_eq!(
            config("program = \"a\"\noutput = \"codex_json\"\nargs = [\"--out={result_file}\"]")
                .validate(),
            Err(CommandAgentConfigError::PlaceholderWithoutFile {
                placeholder: "{result_file}",
                field: "result"
            })
        );
        assert_eq!(
            config("program = \"a\"\nresult = \"stdout\"").validate(),
            Err(CommandAgentConfigError::StreamResultFromText),
            "plain text has no channel of its own: the last JSON printed is not one"
        );
        assert_eq!(
            config("preset = \"aider\"\nresult = \"stream\"").validate(),
            Err(CommandAgentConfigError::StreamResultFromText)
        );
        assert!(
            config("program = \"a\"\nargs = [\"--out={result_file}\"]\nresult = \"file\"")
                .validate()
                .is_ok()
        );
        assert_eq!(
            config("program = \"a\"\nenv_pass = [\"GITHUB_TOKEN\"]").validate(),
            Err(CommandAgentConfigError::SecretInEnvPass(
                "GITHUB_TOKEN".into()
            ))
        );
        assert_eq!(
            config("program = \"a\"\nsecrets = [\"A=B\"]").validate(),
            Err(CommandAgentConfigError::BadVariable {
                field: "secrets",
                name: "A=B".into()
            })
        );
        assert!(
            CommandAgentConfigError::Zero("stall_secs")
                .to_string()
                .contains("stall_secs")
        );
    }

    fn roots() -> Vec<PathBuf> {
        vec![PathBuf::from("/w/t1-a1")]
    }

    fn feed(stream: &mut EventStream, lines: &[&str]) -> Vec<Heard> {
        lines.iter().map(|l| stream.line(l)).collect()
    }

    /// Issue 20: the running totals were summed over every message id on every line,
    /// quadratic in a session's messages. Kept as they change, each message counts once at
    /// its largest usage, and every line's report is the growth.
    #[test]
    fn claude_usage_over_many_messages_is_summed_as_it_changes() {
        let mut s = EventStream::new(OutputFormat::ClaudeStreamJson, roots());
        let messages = 20_000u64;
        let mut reported = 0u64;
        for i in 0..messages {
            for output in [1, 3, 2] {
                let line = format!(
                    r#"{{"type":"assistant","message":{{"id":"m{i}","content":[],"usage":{{"input_tokens":10,"output_tokens":{output}}}}}}}"#
                );
                reported += s.line(&line).spent.map_or(0, |b| b.tokens);
            }
        }
        let unnamed = r#"{"type":"assistant","message":{"content":[],"usage":{"input_tokens":7,"output_tokens":0}}}"#;
        reported += s.line(unnamed).spent.map_or(0, |b| b.tokens);
        assert_eq!(reported, messages * 13 + 7);
        assert_eq!(s.tokens().total(), messages * 13 + 7);
    }

    #[test]
    fn claude_events_give_activity_spend_once_and_the_final_text() {
        let mut s = EventStream::new(OutputFormat::ClaudeStreamJson, roots());
        let heard = feed(
            &mut s,
            &[
                r#"{"type":"system","subtype":"init","session_id":"s","model":"m"}"#,
                r#"{"type":"assistant","message":{"id":"m1","content":[{"type":"text","text":"Let me look\nat the   code first, then edit the module that holds the parser and its tests please"}],"usage":{"input_tokens":100,"cache_creation_input_tokens":50,"cache_read_input_tokens":9000,"output_tokens":5}}}"#,
                r#"{"type":"assistant","message":{"id":"m1","content":[{"type":"tool_use","id":"tu1","name":"Edit","input":{"file_path":"/w/t1-a1/src/a.rs","old_string":"a","new_string":"b"}}],"usage":{"input_tokens":100,"cache_creation_input_tokens":50,"output_tokens":20}}}"#,
                "not json at all",
                r#"{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"tu1","content":"ok"}]}}"#,
                r#"{"type":"assistant","message":{"id":"m2","content":[{"type":"tool_use","id":"tu2","name":"Bash","input":{"command":"cargo   test\n-q"}}],"usage":{"input_tokens":200,"output_tokens":10}}}"#,
                r#"{"type":"result","subtype":"success","is_error":false,"result":"Done. {\"status\":\"complete\",\"summary\":\"s\"}","usage":{"input_tokens":400,"cache_creation_input_tokens":50,"output_tokens":40},"total_cost_usd":0.25}"#,
            ],
        );
        let activities: Vec<&String> = heard.iter().flat_map(|h| &h.activities).collect();
        assert_eq!(
            activities,
            [
                "Let me look at the code first, then edit the module that holds the parser and it…",
                "Edit src/a.rs",
                "bash: cargo test -q",
            ]
        );
        let spent: Vec<Option<Budget>> = heard.iter().map(|h| h.spent).collect();
        assert_eq!(spent[0], None);
        assert_eq!(
            spent[1],
            Some(Budget::new(155, Usd::ZERO, 0)),
            "cache reads left out"
        );
        assert_eq!(
            spent[2],
            Some(Budget::new(15, Usd::ZERO, 0)),
            "the same message again: only its growth"
        );
        assert_eq!((spent[3], spent[4]), (None, None));
        assert_eq!(spent[5], Some(Budget::new(210, Usd::ZERO, 0)));
        assert_eq!(
            spent[6],
            Some(Budget::new(490 - 380, Usd::from_dollars(0.25).unwrap(), 0)),
            "the result's totals top up what the messages said"
        );
        assert_eq!(
            s.tokens(),
            Tokens {
                input: 450,
                output: 40
            }
        );
        assert_eq!(s.tool_calls, 2);
        assert_eq!(
            s.verdict(),
            Ok(Some(
                "Done. {\"status\":\"complete\",\"summary\":\"s\"}".to_string()
            ))
        );
        // A result event repeated reports nothing new, and makes the outcome ambiguous:
        // something other than Claude Code printed one of them.
        let again = s.line(r#"{"type":"result","subtype":"success","is_error":false,"result":"{\"status\":\"complete\",\"summary\":\"x\"}","usage":{"input_tokens":400,"output_tokens":40},"total_cost_usd":0.25}"#);
        assert_eq!(again.spent, None);
        assert_eq!(
            s.verdict(),
            Err(StreamEnd::Unfinished(
                "printed 2 result events where a session has one".into()
            ))
        );
    }

    #[test]
    fn a_claude_stream_ends_well_only_with_one_successful_result_event() {
        let mut s = EventStream::new(OutputFormat::ClaudeStreamJson, roots());
        s.line(r#"{"type":"assistant","message":{"content":[{"type":"text","text":"{\"status\":\"complete\",\"summary\":\"s\"}"}]}}"#);
        assert_eq!(
            s.verdict(),
            Err(StreamEnd::Unfinished(
                "ended without its result event".into()
            )),
            "a message is not the result, whatever it holds"
        );
        // A result without its outcome fields is not taken for one.
        s.line(r#"{"type":"result","result":"{\"status\":\"complete\",\"summary\":\"s\"}"}"#);
        assert!(matches!(s.verdict(), Err(StreamEnd::Unfinished(_))));

        let mut failed = EventStream::new(OutputFormat::ClaudeStreamJson, roots());
        let heard = failed.line(r#"{"type":"result","subtype":"success","is_error":true,"result":"Invalid API key · Please run /login"}"#);
        assert_eq!(
            heard.activities,
            ["error: Invalid API key · Please run /login"]
        );
        assert_eq!(
            failed.verdict(),
            Err(StreamEnd::Failed(
                "error result (success): Invalid API key · Please run /login".into()
            ))
        );
        let mut max_turns = EventStream::new(OutputFormat::ClaudeStreamJson, roots());
        max_turns.line(
            r#"{"type":"result","subtype":"error_max_turns","is_error":false,"num_turns":30}"#,
        );
        assert_eq!(
            max_turns.verdict(),
            Err(StreamEnd::Failed(
                "error result (error_max_turns): no message".into()
            ))
        );
    }

    /// Issue 25: a server without the Responses API answers Codex's every request with 404;
    /// that turn.failed is unservable (not retried), judged on the whole message even when
    /// the URL lies past what a reason keeps, and only the first turn.failed counts.
    #[test]
    fn codex_failing_on_a_404_from_responses_is_unservable() {
        let padding = "x".repeat(CAUSE_CHARS);
        let message =
            format!("unexpected status 404 Not Found: {padding}, url: http://h/v1/responses");
        let mut s = EventStream::new(OutputFormat::CodexJson, roots());
        s.line(r#"{"type":"turn.started"}"#);
        s.line(
            &serde_json::json!({ "type": "turn.failed", "error": { "message": message } })
                .to_string(),
        );
        s.line(r#"{"type":"turn.failed","error":{"message":"stream disconnected"}}"#);
        match s.verdict() {
            Err(StreamEnd::Unservable(cause)) => {
                assert!(
                    cause.starts_with("turn failed: unexpected status 404"),
                    "{cause}"
                )
            }
            other => panic!("expected unservable, got {other:?}"),
        }
        let mut other_404 = EventStream::new(OutputFormat::CodexJson, roots());
        other_404.line(r#"{"type":"turn.failed","error":{"message":"unexpected status 404 Not Found: model gone"}}"#);
        assert!(matches!(other_404.verdict(), Err(StreamEnd::Failed(_))));
        let mut later = EventStream::new(OutputFormat::CodexJson, roots());
        later.line(r#"{"type":"turn.failed","error":{"message":"stream disconnected"}}"#);
        later.line(r#"{"type":"turn.failed","error":{"message":"unexpected status 404 Not Found, url: http://h/v1/responses"}}"#);
        assert!(matches!(later.verdict(), Err(StreamEnd::Failed(_))));
    }

    #[test]
    fn a_codex_turn_that_failed_or_never_ended_has_no_result() {
        let mut failed = EventStream::new(OutputFormat::CodexJson, roots());
        feed(
            &mut failed,
            &[
                r#"{"type":"turn.started"}"#,
                r#"{"type":"item.completed","item":{"id":"i0","type":"agent_message","text":"{\"status\":\"complete\",\"summary\":\"s\"}"}}"#,
                r#"{"type":"error","message":"stream disconnected before completion"}"#,
                r#"{"type":"turn.failed","error":{"message":"unexpected status 500 Internal Server Error: /v1/responses"}}"#,
            ],
        );
        assert_eq!(
            failed.verdict(),
            Err(StreamEnd::Failed(
                "turn failed: unexpected status 500 Internal Server Error: /v1/responses".into()
            ))
        );
        let mut unfinished = EventStream::new(OutputFormat::CodexJson, roots());
        unfinished.line(r#"{"type":"turn.started"}"#);
        unfinished.line(r#"{"type":"item.completed","item":{"id":"i0","type":"agent_message","text":"{\"status\":\"complete\",\"summary\":\"s\"}"}}"#);
        assert_eq!(
            unfinished.verdict(),
            Err(StreamEnd::Unfinished(
                "ended without completing its turn".into()
            ))
        );
        unfinished.line(r#"{"type":"error","message":"Reconnecting... 5/5"}"#);
        assert_eq!(
            unfinished.verdict(),
            Err(StreamEnd::Failed("error: Reconnecting... 5/5".into()))
        );
        let mut silent = EventStream::new(OutputFormat::CodexJson, roots());
        silent.line(r#"{"type":"turn.started"}"#);
        silent.line(r#"{"type":"turn.completed","usage":{"input_tokens":1,"output_tokens":1}}"#);
        assert_eq!(silent.verdict(), Ok(None), "completed with nothing said");
    }

    #[test]
    fn codex_events_give_activity_spend_once_and_the_last_agent_message() {
        let mut s = EventStream::new(OutputFormat::CodexJson, roots());
        let heard = feed(
            &mut s,
            &[
                r#"{"type":"thread.started","thread_id":"th"}"#,
                r#"{"type":"turn.started"}"#,
                r#"{"type":"item.started","item":{"id":"i1","type":"command_execution","command":"bash -lc 'cargo test'","status":"in_progress"}}"#,
                r#"{"type":"item.completed","item":{"id":"i1","type":"command_execution","command":"bash -lc 'cargo test'","exit_code":0,"status":"completed"}}"#,
                r#"{"type":"item.completed","item":{"id":"i2","type":"file_change","changes":[{"path":"/w/t1-a1/src/b.rs","kind":"add"},{"path":"src/c.rs","kind":"update"}]}}"#,
                r#"{"type":"item.completed","item":{"id":"i3","type":"reasoning","text":"hmm"}}"#,
                r#"{"type":"item.completed","item":{"id":"i4","type":"agent_message","text":"first"}}"#,
                r#"{"type":"turn.completed","usage":{"input_tokens":1000,"cached_input_tokens":800,"output_tokens":50}}"#,
                r#"{"type":"item.completed","item":{"id":"i5","type":"agent_message","text":"{\"status\":\"partial\",\"summary\":\"s\"}"}}"#,
                r#"{"type":"turn.completed","usage":{"input_tokens":1500,"cached_input_tokens":900,"output_tokens":80}}"#,
            ],
        );
        let activities: Vec<&String> = heard.iter().flat_map(|h| &h.activities).collect();
        assert_eq!(
            activities,
            [
                "bash: bash -lc 'cargo test'",
                "edit src/b.rs, src/c.rs",
                "first",
                "{\"status\":\"partial\",\"summary\":\"s\"}",
            ]
        );
        let spent: Vec<Budget> = heard.iter().filter_map(|h| h.spent).collect();
        assert_eq!(
            spent,
            [
                Budget::new(1050, Usd::ZERO, 0),
                Budget::new(530, Usd::ZERO, 0)
            ],
            "running totals: only their growth"
        );
        assert_eq!(
            s.tool_calls, 2,
            "a command started and completed is one call"
        );
        assert_eq!(
            s.verdict(),
            Ok(Some(
                "{\"status\":\"partial\",\"summary\":\"s\"}".to_string()
            ))
        );
    }

    #[test]
    fn a_prompts_examples_are_its_fenced_handoffs() {
        let prompt = "Hand back:\n```json\n{\"status\": \"complete\", \"summary\": \"what you did\"}\n```\nNot this:\n```json\n{\"tasks\": []}\n```\nnor ```json\n{\"status\": \"failed\", \"summary\": \" \"}\n```";
        let examples = prompt_examples(prompt);
        assert_eq!(examples.len(), 1, "{examples:?}");
        assert_eq!(examples[0].summary, "what you did");
        let built_in = prompt_examples(include_str!("../../prompts/worker.md"));
        assert_eq!(built_in.len(), 1);
        assert_eq!(built_in[0].summary, "what you did, for the planner");
    }

    #[test]
    fn plain_text_lines_are_activity_and_spend_nothing() {
        let mut s = EventStream::new(OutputFormat::Text, roots());
        let heard = feed(
            &mut s,
            &["  Applied edit to src/a.rs ", "", "Tokens: 2k sent"],
        );
        let activities: Vec<&String> = heard.iter().flat_map(|h| &h.activities).collect();
        assert_eq!(activities, ["Applied edit to src/a.rs", "Tokens: 2k sent"]);
        assert!(heard.iter().all(|h| h.spent.is_none()));
        assert_eq!(s.verdict(), Ok(None));
    }

    #[test]
    fn the_envelope_is_the_last_json_object_that_is_one() {
        let text = r#"
Here is the example from my instructions:
```json
{"status": "complete", "summary": "what you did, for the planner"}
```
fn main() { let x = {1}; }
Done.
{"status": "partial", "summary": "half of it", "concerns": ["b"],
 "subplan": {"reason": "too_large", "subtasks": [{"description": "rest", "scope": ["src/b.rs"]}]}}
Bye {
"#;
        let args = envelope_in(text).unwrap();
        assert_eq!(args.status, HandoffStatus::Partial);
        assert_eq!(args.summary, "half of it");
        assert_eq!(args.subplan.unwrap().subtasks[0].scope, ["src/b.rs"]);
        assert!(envelope_in("no json {here}").is_none());
        assert!(envelope_in("{\"status\": \"great\", \"summary\": \"\"}").is_none());
        assert_eq!(
            envelope_in("```json\n{\"status\": \"failed\", \"summary\": \"x\"}\n```")
                .unwrap()
                .status,
            HandoffStatus::Failed
        );
    }

    #[test]
    fn the_last_output_is_bounded_and_keeps_both_streams() {
        assert_eq!(last_output("", " "), "(none)");
        assert_eq!(last_output("out\n", ""), "out");
        let long_out = "o".repeat(5_000);
        let long_err = "e".repeat(5_000);
        let both = last_output(&long_out, &long_err);
        assert!(both.chars().count() <= TAIL_CHARS, "{}", both.len());
        assert!(both.contains("[stderr] eee") && both.contains("[stdout] ooo"));
        let short_err = last_output(&long_out, "fatal: no key");
        assert!(short_err.starts_with("[stderr] fatal: no key\n[stdout] "));
        assert!(short_err.chars().count() <= TAIL_CHARS);
        assert!(
            short_err.chars().count() > TAIL_CHARS - 50,
            "stdout gets what stderr leaves"
        );
    }
}
