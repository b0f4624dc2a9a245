//! `[agents.NAME]`: what a command agent runs and how, with the presets for Claude Code,
//! Codex and aider. Pure data and its checks: nothing here starts a process or reads a file.

use std::time::Duration;

use flotilla_actors::ports::{CommandLimits, EnvPolicy, Sandbox};
use serde::{Deserialize, Serialize};

/// A CLI's wall-time cap. Only a backstop: the Worker's wall-time budget for the attempt
/// calls the CLI off (through the attempt's token) long before.
const WALL_CAP: Duration = Duration::from_secs(24 * 60 * 60);

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
    /// Plain text: every line is shown as activity; the final text is all of stdout. A
    /// line in aider's usage form (`Tokens: 2.3k sent, 215 received. Cost: …`) is charged.
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

pub(super) const PROMPT_PLACEHOLDER: &str = "{prompt_file}";
pub(super) const RESULT_PLACEHOLDER: &str = "{result_file}";

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

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
