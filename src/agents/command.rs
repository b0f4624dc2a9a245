//! External coding-agent CLIs as workers (the `command` agent kind): Claude Code, Codex,
//! aider, or any program that works in a directory and says what it did.
//!
//! Every call of a session (`run`, `revise`, `synthesize`) is one process, started through
//! the [`ProcessRunner`] in the attempt's worktree: in its own process group, with a scrubbed
//! environment (the CLI's own API key is passed only because the config names it), killed
//! when it writes nothing for `stall_secs` or when the attempt is called off. The prompt (the
//! worker's system prompt, the task, how to hand back) goes to it on stdin, in a file or as
//! its last argument; its output is read line by line as it arrives, for the live activity
//! line and for the spend it reports (so that budgets bind while it works); what it hands
//! back is the result envelope, the same JSON object the built-in agent's `finish` carries
//! ([`FinishArgs`]), printed last or written to `FLOTILLA_RESULT.json`.
//!
//! A CLI keeps no memory between processes: a revision gets the whole task again with the
//! reason its subplan was refused, in the same worktree (what it changed is still there).
//!
//! The files flotilla writes into the worktree for the CLI (`FLOTILLA_TASK.md`,
//! `FLOTILLA_RESULT.json`) are removed before a call returns, however the process ended:
//! the Worker commits whatever is left in the worktree, and they are not the task's work.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_actors::llm_output::parse_json_answer;
use flotilla_actors::ports::{
    Agent, AgentError, AgentReport, AgentSession, AttemptContext, CommandLimits, CommandOutput,
    CommandSpec, EnvPolicy, Exit, LineSink, ProcessRunner, Sandbox, Stream, Workspace,
    scrubbed_env,
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
/// The result file, in the worktree's root, for `result = "file"`.
pub const RESULT_FILE: &str = "FLOTILLA_RESULT.json";

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
/// overridden. The flags are the CLIs' best-known non-interactive ones; they grant the CLI no
/// permission beyond its own defaults (allowing edits or commands without asking, such as
/// Claude Code's `--permission-mode` or Codex's `--full-auto`, is the user's decision, made
/// in `args`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// `claude -p --output-format stream-json --verbose`, the prompt on stdin, its JSON
    /// events parsed; passes `ANTHROPIC_API_KEY`.
    ClaudeCode,
    /// `codex exec --json -`, the prompt on stdin, its JSON events parsed; passes
    /// `OPENAI_API_KEY`.
    Codex,
    /// `aider --yes-always --no-auto-commits --message-file {prompt_file}`, its output read
    /// as text; passes `OPENAI_API_KEY` and `ANTHROPIC_API_KEY`.
    Aider,
}

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

/// Where the CLI leaves its result envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultVia {
    /// The last JSON object of its final text (see [`OutputFormat`]).
    Stdout,
    /// `FLOTILLA_RESULT.json` in the worktree (`{result_file}` in `args` is its path).
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
    /// the prompt and result files. Replaces the preset's arguments whole.
    pub args: Option<Vec<String>>,
    /// `stdin` (without a preset), `file` or `arg`.
    pub prompt: Option<PromptVia>,
    /// `text` (without a preset), `claude_stream_json` or `codex_json`.
    pub output: Option<OutputFormat>,
    /// `stdout` (without a preset) or `file`.
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
}

/// What a preset fills in.
struct PresetDefaults {
    program: &'static str,
    args: &'static [&'static str],
    prompt: PromptVia,
    output: OutputFormat,
    result: ResultVia,
    secrets: &'static [&'static str],
}

impl Preset {
    fn defaults(self) -> PresetDefaults {
        match self {
            Preset::ClaudeCode => PresetDefaults {
                program: "claude",
                args: &["-p", "--output-format", "stream-json", "--verbose"],
                prompt: PromptVia::Stdin,
                output: OutputFormat::ClaudeStreamJson,
                result: ResultVia::Stdout,
                secrets: &["ANTHROPIC_API_KEY"],
            },
            Preset::Codex => PresetDefaults {
                program: "codex",
                args: &["exec", "--json", "-"],
                prompt: PromptVia::Stdin,
                output: OutputFormat::CodexJson,
                result: ResultVia::Stdout,
                secrets: &["OPENAI_API_KEY"],
            },
            Preset::Aider => PresetDefaults {
                program: "aider",
                args: &[
                    "--yes-always",
                    "--no-auto-commits",
                    "--message-file",
                    "{prompt_file}",
                ],
                prompt: PromptVia::File,
                output: OutputFormat::Text,
                result: ResultVia::Stdout,
                secrets: &["OPENAI_API_KEY", "ANTHROPIC_API_KEY"],
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
        let args = self.args.clone().unwrap_or_else(|| {
            preset
                .as_ref()
                .map(|p| p.args.iter().map(|a| a.to_string()).collect())
                .unwrap_or_default()
        });
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
            .unwrap_or(ResultVia::Stdout);
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
        ResultVia::Stdout => text.push_str(
            "When you are done, print it as one JSON object, the last thing you write, with nothing after it.\n",
        ),
        ResultVia::File => text.push_str(&format!(
            "When you are done, write it, as one JSON object and nothing else, to {RESULT_FILE} in the repository root ({}).\n",
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

/// The files flotilla puts in the worktree for the CLI. Removed before a call returns; if
/// the call's future is dropped first (the Worker gave up waiting), removed on drop.
struct ScratchFiles {
    root: PathBuf,
    armed: bool,
}

impl ScratchFiles {
    fn new(root: &Path) -> Self {
        ScratchFiles {
            root: root.to_path_buf(),
            armed: true,
        }
    }

    fn prompt(&self) -> PathBuf {
        self.root.join(PROMPT_FILE)
    }

    fn result(&self) -> PathBuf {
        self.root.join(RESULT_FILE)
    }

    /// Removes both (whatever the CLI made of them: a directory goes too).
    async fn clear(&mut self) -> Result<(), AgentError> {
        for path in [self.prompt(), self.result()] {
            let removed = match tokio::fs::symlink_metadata(&path).await {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
                Ok(meta) if meta.is_dir() => tokio::fs::remove_dir_all(&path).await,
                Ok(_) => tokio::fs::remove_file(&path).await,
            };
            removed.map_err(|e| {
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
            for path in [self.prompt(), self.result()] {
                let _ = std::fs::remove_file(&path).or_else(|_| std::fs::remove_dir_all(&path));
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
    fn who(&self) -> String {
        format!(
            "the {} agent ({})",
            self.shared.name, self.shared.command.program
        )
    }

    async fn run(self) -> Result<AgentReport, AgentError> {
        if self.attempt.cancel.is_cancelled() {
            return Err(AgentError::Cancelled);
        }
        let command = &self.shared.command;
        let mut scratch = ScratchFiles::new(&self.workspace.path);
        // A result left by an earlier call must not pass for this one's.
        scratch.clear().await?;
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
                    .map_err(|e| AgentError::Crashed(format!("cannot write {PROMPT_FILE}: {e}")))?;
            }
        }
        let spec = CommandSpec {
            program: command.program.clone(),
            args,
            cwd: self.workspace.path.clone(),
            stdin,
            env: scrubbed_env(
                std::env::vars(),
                &command.env,
                &[
                    ("TERM".to_string(), "dumb".to_string()),
                    ("FLOTILLA_TASK".to_string(), self.task.to_string()),
                    ("FLOTILLA_BRANCH".to_string(), self.branch.clone()),
                ],
            ),
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

        let output =
            ran.map_err(|e| AgentError::Crashed(format!("{} could not run: {e}", self.who())))?;
        if output.exit == Exit::Cancelled || self.attempt.cancel.is_cancelled() {
            return Err(AgentError::Cancelled);
        }
        let stream = std::mem::replace(
            &mut *lock(&stream),
            EventStream::new(command.output, Vec::new()),
        );
        self.conclude(output, stream, result_file).await
    }

    /// How the process ended and what it handed back, as the attempt's outcome.
    async fn conclude(
        &self,
        output: CommandOutput,
        stream: EventStream,
        result_file: Option<Result<String, String>>,
    ) -> Result<AgentReport, AgentError> {
        let tail = last_output(&output.stdout.text, &output.stderr.text);
        match output.exit {
            Exit::Stalled => {
                return Err(AgentError::Crashed(format!(
                    "{} stalled: it wrote nothing for {}s and was killed; last output: {tail}",
                    self.who(),
                    self.shared
                        .command
                        .limits
                        .stall
                        .map_or(0, |stall| stall.as_secs())
                )));
            }
            Exit::TimedOut => return Err(AgentError::Timeout),
            _ => {}
        }
        let envelope = match result_file {
            Some(file) => file
                .and_then(|text| parse_json_answer::<FinishArgs>(&text, MAX_ENVELOPE_BYTES))
                .map_err(|why| format!("wrote no result envelope to {RESULT_FILE} ({why})")),
            None => {
                let text = match self.shared.command.output {
                    OutputFormat::Text => Some(output.stdout.text.clone()),
                    _ => stream.final_text().map(String::from),
                };
                // Looking for the envelope may parse hundreds of candidates in output a
                // CLI filled with braces: on a blocking thread, never the actors' one.
                let found = match text {
                    Some(text) => tokio::task::spawn_blocking(move || envelope_in(&text))
                        .await
                        .ok()
                        .flatten(),
                    None => None,
                };
                found.ok_or_else(|| "printed no result envelope".to_string())
            }
        };
        match (envelope, output.exit) {
            (Ok(args), Exit::Code { code: 0 }) => Ok(self.finished(args, &stream, None)),
            (Ok(args), exit) => {
                let how = match exit {
                    Exit::Signal { signal } => format!("was killed by signal {signal}"),
                    exit => format!("ended with {exit}"),
                };
                let concern = format!(
                    "{} {how} after handing back its result: its work may be unfinished",
                    self.shared.command.program
                );
                Ok(self.finished(args, &stream, Some(concern)))
            }
            (Err(why), Exit::Code { code: 0 }) => Err(AgentError::Malformed(format!(
                "{} {why}; last output: {tail}",
                self.who()
            ))),
            (Err(_), Exit::Code { code }) => Err(AgentError::Crashed(format!(
                "{} exited with code {code}; last output: {tail}",
                self.who()
            ))),
            (Err(_), exit) => Err(AgentError::Crashed(format!(
                "{} {exit}; last output: {tail}",
                self.who()
            ))),
        }
    }

    /// The envelope as the attempt's report, its text bounded as the built-in agent's.
    fn finished(
        &self,
        args: FinishArgs,
        stream: &EventStream,
        concern: Option<String>,
    ) -> AgentReport {
        let tokens = stream.tokens();
        // What this process spent, which is what it reported as it went.
        let metrics = HandoffMetrics {
            tokens_in: tokens.input,
            tokens_out: tokens.output,
            tool_calls: stream.tool_calls,
            cost_usd: stream.cost,
            ..HandoffMetrics::default()
        };
        args.into_report(&self.task, metrics, concern)
    }
}

/// The result file's text: only a regular file (not a link out of the worktree), and only
/// as much as a handoff may be.
async fn read_result_file(path: &Path) -> Result<String, String> {
    let meta = match tokio::fs::symlink_metadata(path).await {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err("the file is missing".into());
        }
        Err(e) => return Err(e.to_string()),
    };
    if !meta.is_file() {
        return Err("it is not a regular file".into());
    }
    if meta.len() > MAX_ENVELOPE_BYTES as u64 {
        return Err(format!(
            "it is {} bytes; at most {MAX_ENVELOPE_BYTES} are read",
            meta.len()
        ));
    }
    let bytes = tokio::fs::read(path).await.map_err(|e| e.to_string())?;
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

/// The CLI's stdout, read line by line: its live activity, what it spent (reported once:
/// every stream's usage is turned into running totals, and only their growth is
/// reported), the tools it called, and its final text. Lines that are not the events
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
    final_text: Option<String>,
    last_message: Option<String>,
}

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
            final_text: None,
            last_message: None,
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
            OutputFormat::ClaudeStreamJson | OutputFormat::CodexJson => {
                if let Ok(event) = serde_json::from_str::<Value>(line.trim()) {
                    if self.format == OutputFormat::ClaudeStreamJson {
                        self.claude(&event, &mut heard);
                    } else {
                        self.codex(&event, &mut heard);
                    }
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

    /// The text the envelope is looked for in.
    fn final_text(&self) -> Option<&str> {
        self.final_text.as_deref().or(self.last_message.as_deref())
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
    /// message's usage), then one `result` (the final text, the session's usage and cost).
    fn claude(&mut self, event: &Value, heard: &mut Heard) {
        match event["type"].as_str() {
            Some("assistant") => {
                let message = &event["message"];
                if let Some(usage) = message.get("usage") {
                    let tokens = claude_tokens(usage);
                    match message["id"].as_str() {
                        Some(id) => {
                            let seen = self.messages.entry(id.to_string()).or_default();
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
                for block in message["content"].as_array().into_iter().flatten() {
                    match block["type"].as_str() {
                        Some("text") => {
                            let text = block["text"].as_str().unwrap_or("");
                            if !text.trim().is_empty() {
                                heard.activities.push(one_line(text, GIST_CHARS));
                                self.last_message = Some(text.to_string());
                            }
                        }
                        Some("tool_use") if self.first_sight(block["id"].as_str()) => {
                            self.tool_calls += 1;
                            let name = block["name"].as_str().unwrap_or("tool");
                            heard
                                .activities
                                .push(self.describe_tool(name, &block["input"]));
                        }
                        _ => {}
                    }
                }
            }
            Some("result") => {
                if let Some(text) = event["result"].as_str() {
                    self.final_text = Some(text.to_string());
                }
                if let Some(usage) = event.get("usage") {
                    self.totals = self.totals.max(claude_tokens(usage));
                }
                if let Some(cost) = event["total_cost_usd"]
                    .as_f64()
                    .and_then(|d| Usd::from_dollars(d).ok())
                {
                    self.cost = self.cost.max(cost);
                }
            }
            _ => {}
        }
    }

    /// A Claude Code tool call in a few words: `bash: cargo test`, `Edit src/a.rs`.
    fn describe_tool(&self, name: &str, input: &Value) -> String {
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
    /// commands, file changes, tool calls) and `turn.completed` with the session's usage.
    fn codex(&mut self, event: &Value, heard: &mut Heard) {
        match event["type"].as_str() {
            Some(kind @ ("item.started" | "item.updated" | "item.completed")) => {
                let item = &event["item"];
                let completed = kind == "item.completed";
                // Early versions of `exec --json` called the type `item_type`.
                let item_type = item["type"].as_str().or(item["item_type"].as_str());
                let id = item["id"].as_str();
                match item_type {
                    Some("agent_message" | "assistant_message") if completed => {
                        let text = item["text"].as_str().unwrap_or("");
                        if !text.trim().is_empty() {
                            heard.activities.push(one_line(text, GIST_CHARS));
                            self.final_text = Some(text.to_string());
                        }
                    }
                    Some("command_execution") if self.first_sight(id) => {
                        self.tool_calls += 1;
                        let command = item["command"].as_str().unwrap_or("");
                        heard
                            .activities
                            .push(format!("bash: {}", one_line(command, DETAIL_CHARS)));
                    }
                    Some("file_change") if self.first_sight(id) => {
                        self.tool_calls += 1;
                        let paths: Vec<String> = item["changes"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|c| c["path"].as_str())
                            .map(|p| self.relative(p))
                            .collect();
                        heard.activities.push(format!(
                            "edit {}",
                            one_line(&paths.join(", "), DETAIL_CHARS)
                        ));
                    }
                    Some("mcp_tool_call") if self.first_sight(id) => {
                        self.tool_calls += 1;
                        let server = item["server"].as_str().unwrap_or("mcp");
                        let tool = item["tool"].as_str().unwrap_or("tool");
                        heard.activities.push(format!("{server}.{tool}"));
                    }
                    Some("web_search") if self.first_sight(id) => {
                        self.tool_calls += 1;
                        let query = item["query"].as_str().unwrap_or("");
                        heard
                            .activities
                            .push(format!("search: {}", one_line(query, DETAIL_CHARS)));
                    }
                    Some("error") if completed => {
                        let message = item["message"].as_str().unwrap_or("");
                        heard
                            .activities
                            .push(format!("error: {}", one_line(message, DETAIL_CHARS)));
                    }
                    _ => {}
                }
            }
            Some("turn.completed") => {
                let usage = &event["usage"];
                // The session's running totals (cached input is part of the input).
                let tokens = Tokens {
                    input: usage["input_tokens"].as_u64().unwrap_or(0),
                    output: usage["output_tokens"].as_u64().unwrap_or(0),
                };
                self.totals = self.totals.max(tokens);
            }
            Some("turn.failed") => {
                let message = event["error"]["message"].as_str().unwrap_or("");
                heard
                    .activities
                    .push(format!("turn failed: {}", one_line(message, DETAIL_CHARS)));
            }
            Some("error") => {
                let message = event["message"].as_str().unwrap_or("");
                heard
                    .activities
                    .push(format!("error: {}", one_line(message, DETAIL_CHARS)));
            }
            _ => {}
        }
    }
}

/// A Claude usage object's tokens. Cache writes are input the model processed; cache reads
/// are left out: Claude Code re-reads its whole context from the cache on every turn, and
/// counting that would spend a token budget many times over on tokens billed at a tenth
/// (their money is in the cost).
fn claude_tokens(usage: &Value) -> Tokens {
    let n = |key: &str| usage[key].as_u64().unwrap_or(0);
    Tokens {
        input: n("input_tokens").saturating_add(n("cache_creation_input_tokens")),
        output: n("output_tokens"),
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
        assert_eq!(claude.result, ResultVia::Stdout);
        assert_eq!(claude.env.secrets, ["ANTHROPIC_API_KEY"]);
        assert_eq!(claude.limits.stall, Some(Duration::from_secs(300)));
        assert_eq!(claude.limits.output_bytes, 64 * 1024);
        assert!(claude.limits.wall >= Duration::from_secs(3600));

        let codex = config("preset = \"codex\"").resolved().unwrap();
        assert_eq!(
            (codex.program.as_str(), codex.args.clone()),
            ("codex", vec!["exec".into(), "--json".into(), "-".into()])
        );
        assert_eq!(codex.output, OutputFormat::CodexJson);
        assert_eq!(codex.env.secrets, ["OPENAI_API_KEY"]);

        let aider = config("preset = \"aider\"").resolved().unwrap();
        assert_eq!(aider.prompt, PromptVia::File);
        assert_eq!(aider.args.last().unwrap(), "{prompt_file}");
        assert_eq!(aider.output, OutputFormat::Text);
        assert_eq!(aider.env.secrets, ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"]);

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
            (PromptVia::Stdin, OutputFormat::Text, ResultVia::Stdout)
        );
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
            config("program = \"a\"\nargs = [\"--out={result_file}\"]").validate(),
            Err(CommandAgentConfigError::PlaceholderWithoutFile {
                placeholder: "{result_file}",
                field: "result"
            })
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
            s.final_text(),
            Some("Done. {\"status\":\"complete\",\"summary\":\"s\"}")
        );
        // A result event repeated reports nothing new.
        let again = s.line(r#"{"type":"result","result":"x","usage":{"input_tokens":400,"output_tokens":40},"total_cost_usd":0.25}"#);
        assert_eq!(again.spent, None);
    }

    #[test]
    fn without_a_result_event_the_last_message_is_the_final_text() {
        let mut s = EventStream::new(OutputFormat::ClaudeStreamJson, roots());
        s.line(r#"{"type":"assistant","message":{"content":[{"type":"text","text":"first"}]}}"#);
        s.line(r#"{"type":"assistant","message":{"content":[{"type":"text","text":"second"}]}}"#);
        assert_eq!(s.final_text(), Some("second"));
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
                r#"{"type":"item.completed","item":{"id":"i5","item_type":"assistant_message","text":"{\"status\":\"partial\",\"summary\":\"s\"}"}}"#,
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
            s.final_text(),
            Some("{\"status\":\"partial\",\"summary\":\"s\"}")
        );
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
        assert_eq!(s.final_text(), None);
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
