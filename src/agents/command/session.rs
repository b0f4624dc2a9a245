//! A command agent's session: each call (`run`, `revise`, `synthesize`) is one process of
//! the CLI, started through the [`ProcessRunner`] in the attempt's worktree, its stdout fed
//! to an [`EventStream`] as it arrives, the files flotilla put in the worktree for it removed
//! however it ended, and its exit and envelope turned into the attempt's outcome.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use flotilla_actors::llm::output::parse_json_answer;
use flotilla_actors::ports::{
    Agent, AgentError, AgentReport, AgentSession, AttemptContext, CommandOutput, CommandSpec, Exit,
    LineSink, ProcessError, ProcessRunner, Stream, TranscriptKind, Workspace, scrubbed_env,
};
use flotilla_actors::protocol::{
    Assignment, HandoffMetrics, RejectionReason, SubtaskResult, TaskId,
};
use futures::future::BoxFuture;

use super::config::{
    CommandAgentConfig, CommandAgentConfigError, PROMPT_PLACEHOLDER, PromptVia, RESULT_PLACEHOLDER,
    ResolvedCommand, ResultVia,
};
use super::envelope::{
    EnvelopeError, MAX_ENVELOPE_BYTES, PROMPT_FILE, RESULT_FILE, RESULT_FILE_VAR, ResultFileError,
    envelope_in, envelope_instructions, prompt_examples, read_result_file,
};
use super::stream::{EventStream, StreamEnd};
use super::text::{DETAIL_CHARS, last_output, one_line};
use crate::agents::tools::FinishArgs;
use crate::agents::{synthesis_text, task_text};

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
        let body = task_text(&assignment);
        self.call(assignment.task.task.clone(), assignment.branch, body)
    }

    fn revise(
        &mut self,
        assignment: Assignment,
        rejection: RejectionReason,
    ) -> BoxFuture<'static, Result<AgentReport, AgentError>> {
        let body = format!(
            "{}\n## Your subplan was refused\nflotilla refused the subplan you proposed for this task: {rejection}. Propose a different one, or do the task yourself and hand back your handoff. What you changed in this directory before is still here.\n",
            task_text(&assignment)
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
            synthesis_text(&parent, "hand back the task's handoff", &results),
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
                // Every line the agent wrote is its transcript (ADR-036); only stdout
                // carries its events.
                let kind = match from {
                    Stream::Stdout => TranscriptKind::Stdout,
                    Stream::Stderr => TranscriptKind::Stderr,
                };
                attempt.transcript.record(kind, line);
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
        result_file: Option<Result<String, ResultFileError>>,
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
                .and_then(|text| {
                    parse_json_answer::<FinishArgs>(&text, MAX_ENVELOPE_BYTES)
                        .map_err(ResultFileError::NotAnEnvelope)
                })
                .map_err(EnvelopeError::File),
            (ResultVia::File, None) => Err(EnvelopeError::NoFile),
            (ResultVia::Stream, _) => match final_text {
                // Looking for the envelope may parse hundreds of candidates in a message
                // full of braces: on a blocking thread, never the actors' one.
                Some(text) => tokio::task::spawn_blocking(move || envelope_in(&text))
                    .await
                    .ok()
                    .flatten()
                    .ok_or(EnvelopeError::NotInMessage),
                None => Err(EnvelopeError::NoFinalMessage),
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
