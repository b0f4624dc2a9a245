//! The built-in agent's tools: what a model may do in its worktree, and nothing else.
//!
//! Every argument is the model's and untrusted: parsed into a typed struct (an unknown
//! field, a wrong type or a missing one is an error the model reads and may correct), every
//! path confined to the worktree ([`confine`]), every output bounded. A tool that fails
//! answers with the reason; only `finish` ends the loop.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use flotilla_actors::ports::AgentReport;
use flotilla_actors::ports::{
    CommandLimits, CommandSpec, ProcessError, ProcessRunner, Sandbox, ToolCall, ToolSpec,
};
use flotilla_actors::protocol::{
    DecompositionReason, Handoff, HandoffMetrics, HandoffStatus, ProposedSubplan, StopCondition,
    SubtaskProposal, TaskId,
};
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::confine::{Access, PathRefused, confine, open_confined};

/// What the tools may do, and how much of it.
#[derive(Debug, Clone)]
pub struct ToolLimits {
    /// The most of a file `read_file` returns.
    pub read_bytes: usize,
    /// The largest file `write_file` or `edit_file` writes.
    pub write_bytes: usize,
    pub list_entries: usize,
    pub search_matches: usize,
    /// Files larger than this are not searched.
    pub search_file_bytes: u64,
    /// A command's limits (its output cap is what the model reads of each stream).
    pub command: CommandLimits,
    pub sandbox: Sandbox,
}

impl Default for ToolLimits {
    fn default() -> Self {
        ToolLimits {
            read_bytes: 64 * 1024,
            write_bytes: 1024 * 1024,
            list_entries: 500,
            search_matches: 200,
            search_file_bytes: 1024 * 1024,
            command: CommandLimits {
                wall: std::time::Duration::from_secs(300),
                stall: None,
                output_bytes: 16 * 1024,
            },
            sandbox: Sandbox::Bwrap,
        }
    }
}

/// Where the tools work.
#[derive(Clone)]
pub struct ToolContext {
    pub root: PathBuf,
    pub runner: Arc<dyn ProcessRunner>,
    pub cancel: CancellationToken,
    pub limits: ToolLimits,
    /// The commands' environment (scrubbed: see `scrubbed_env`).
    pub env: Vec<(String, String)>,
}

/// What the model handed over with `finish`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinishArgs {
    pub status: HandoffStatus,
    pub summary: String,
    #[serde(default)]
    pub concerns: Vec<String>,
    #[serde(default)]
    pub suggestions: Vec<String>,
    #[serde(default)]
    pub files_changed: Vec<String>,
    #[serde(default)]
    pub subplan: Option<SubplanArgs>,
}

/// The most of the model's words a handoff keeps.
const MAX_SUMMARY_CHARS: usize = 4_000;
const MAX_NOTES: usize = 20;
const MAX_NOTE_CHARS: usize = 1_000;

impl FinishArgs {
    /// The attempt's report: the model's words bounded, `concern` (flotilla's) first among
    /// the concerns, a subplan's parent the task flotilla assigned (never the model's).
    pub fn into_report(
        self,
        task: &TaskId,
        metrics: HandoffMetrics,
        concern: Option<String>,
    ) -> AgentReport {
        let notes = |items: Vec<String>| -> Vec<String> {
            items
                .into_iter()
                .take(MAX_NOTES)
                .map(|n| n.chars().take(MAX_NOTE_CHARS).collect())
                .collect()
        };
        let mut concerns = notes(self.concerns);
        if let Some(concern) = concern {
            concerns.insert(0, concern);
            concerns.truncate(MAX_NOTES);
        }
        let subplan = self.subplan.map(|plan| ProposedSubplan {
            parent: task.clone(),
            reason: plan.reason,
            subtasks: plan.subtasks,
            stop_when: plan.stop_when,
        });
        AgentReport {
            handoff: Some(Handoff {
                status: self.status,
                summary: self.summary.chars().take(MAX_SUMMARY_CHARS).collect(),
                files_changed: notes(self.files_changed),
                concerns,
                suggestions: notes(self.suggestions),
                metrics,
                build_exit_code: None,
                work: None,
                findings: Vec::new(),
            }),
            artifacts: Vec::new(),
            subplan,
        }
    }
}

/// A subplan as the model writes it; flotilla adds the parent (the task it works on).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubplanArgs {
    #[serde(default = "too_large")]
    pub reason: DecompositionReason,
    #[serde(default)]
    pub stop_when: StopCondition,
    pub subtasks: Vec<SubtaskProposal>,
}

fn too_large() -> DecompositionReason {
    DecompositionReason::TooLarge
}

/// A tool call's outcome: text for the model, or the end of the loop.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolOutcome {
    Output(String),
    Finish(Box<FinishArgs>),
}

/// The tools, as the model sees them.
pub fn specs() -> Vec<ToolSpec> {
    let spec = |name: &str, description: &str, parameters: serde_json::Value| ToolSpec {
        name: name.into(),
        description: description.into(),
        parameters,
    };
    let path = json!({"type": "string", "description": "relative to the repository root"});
    vec![
        spec(
            "read_file",
            "Read a text file. Long files are cut; ask for a later part with offset (in bytes).",
            json!({"type": "object", "properties": {"path": path, "offset": {"type": "integer", "minimum": 0}}, "required": ["path"], "additionalProperties": false}),
        ),
        spec(
            "write_file",
            "Create or replace a file with the given content (directories are made).",
            json!({"type": "object", "properties": {"path": path, "content": {"type": "string"}}, "required": ["path", "content"], "additionalProperties": false}),
        ),
        spec(
            "edit_file",
            "Replace the one exact occurrence of old_text in a file with new_text.",
            json!({"type": "object", "properties": {"path": path, "old_text": {"type": "string"}, "new_text": {"type": "string"}}, "required": ["path", "old_text", "new_text"], "additionalProperties": false}),
        ),
        spec(
            "list_dir",
            "List a directory (the repository root if no path); directories end with /.",
            json!({"type": "object", "properties": {"path": path}, "additionalProperties": false}),
        ),
        spec(
            "search",
            "Search file contents with a regular expression; answers path:line: text.",
            json!({"type": "object", "properties": {"pattern": {"type": "string"}, "path": path}, "required": ["pattern"], "additionalProperties": false}),
        ),
        spec(
            "run_command",
            "Run a shell command in the repository root (build, test), in the run's sandbox (your instructions say what it allows), never with secrets in its environment. It is killed at its time limit.",
            json!({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"], "additionalProperties": false}),
        ),
        spec(
            "finish",
            "End the task with your handoff. status: complete, partial (say what is missing in concerns), blocked (say why) or failed. With subplan instead of (or besides) the work: split a task too big for you.",
            json!({"type": "object", "properties": {
                "status": {"type": "string", "enum": ["complete", "partial", "blocked", "failed"]},
                "summary": {"type": "string"},
                "concerns": {"type": "array", "items": {"type": "string"}},
                "suggestions": {"type": "array", "items": {"type": "string"}},
                "files_changed": {"type": "array", "items": {"type": "string"}},
                "subplan": {"type": "object", "properties": {
                    "reason": {"type": "string", "enum": ["too_large", "missing_info", "dependency_discovered", "ambiguity", "external_tool_required"]},
                    "subtasks": {"type": "array", "items": {"type": "object", "properties": {
                        "description": {"type": "string"},
                        "scope": {"type": "array", "items": {"type": "string"}},
                        "acceptance": {"type": "string"},
                        "depends_on": {"type": "array", "items": {"type": "integer"}}
                    }, "required": ["description", "scope"]}}
                }, "required": ["subtasks"]}
            }, "required": ["status", "summary"], "additionalProperties": false}),
        ),
    ]
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    path: String,
    #[serde(default)]
    offset: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    content: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EditArgs {
    path: String,
    old_text: String,
    new_text: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    #[serde(default)]
    path: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandArgs {
    command: String,
}

/// Why a tool call did nothing: the model reads it as the call's output (`error: …`), so
/// every message says what to do differently.
#[derive(Debug, thiserror::Error)]
enum ToolError {
    #[error("the arguments of {tool} are not valid: {source}")]
    BadArguments {
        tool: String,
        source: serde_json::Error,
    },
    #[error(
        "there is no tool {0:?}; the tools are read_file, write_file, edit_file, list_dir, search, run_command and finish"
    )]
    NoSuchTool(String),
    #[error(transparent)]
    Refused(#[from] PathRefused),
    #[error("the path could not be checked: {0}")]
    PathCheck(tokio::task::JoinError),
    #[error("the file could not be opened: {0}")]
    Open(tokio::task::JoinError),
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    ReadStopped {
        path: String,
        source: tokio::task::JoinError,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{bytes} bytes is more than the {limit} a file may have")]
    TooLarge { bytes: usize, limit: usize },
    #[error("old_text is empty: say which text to replace")]
    EmptyOldText,
    #[error("{path} is {len} bytes, more than the {limit} a file edited here may have")]
    TooLargeToEdit {
        path: String,
        len: u64,
        limit: usize,
    },
    #[error("old_text does not occur in {path}: read the file and copy the text exactly")]
    OldTextMissing { path: String },
    #[error("the edited file would be {bytes} bytes, more than the {limit} a file may have")]
    EditedTooLarge { bytes: usize, limit: usize },
    #[error(
        "old_text occurs {count} times in {path}: include more of the text around it so it occurs once"
    )]
    OldTextAmbiguous { path: String, count: usize },
    /// The worktree's root itself could not be resolved.
    #[error(transparent)]
    Root(std::io::Error),
    #[error("cannot list {path}: {source}")]
    List {
        path: String,
        source: std::io::Error,
    },
    #[error("not a regular expression: {0}")]
    BadPattern(#[from] regex::Error),
    #[error("the search failed: {0}")]
    Search(tokio::task::JoinError),
    #[error("the command is empty")]
    EmptyCommand,
    #[error(transparent)]
    Process(#[from] ProcessError),
}

fn parse<'a, T: Deserialize<'a>>(call: &'a ToolCall) -> Result<T, ToolError> {
    // An empty argument string is an empty object (some models send nothing for no
    // arguments).
    let text = if call.arguments.trim().is_empty() {
        "{}"
    } else {
        call.arguments.as_str()
    };
    serde_json::from_str(text).map_err(|source| ToolError::BadArguments {
        tool: call.name.clone(),
        source,
    })
}

/// Runs one tool call. Errors are the model's to read (`Output("error: …")`).
pub async fn execute(call: &ToolCall, ctx: &ToolContext) -> ToolOutcome {
    let result = match call.name.as_str() {
        "read_file" => match parse::<ReadArgs>(call) {
            Ok(args) => read_file(ctx, &args.path, args.offset).await,
            Err(e) => Err(e),
        },
        "write_file" => match parse::<WriteArgs>(call) {
            Ok(args) => write_file(ctx, &args.path, &args.content).await,
            Err(e) => Err(e),
        },
        "edit_file" => match parse::<EditArgs>(call) {
            Ok(args) => edit_file(ctx, &args.path, &args.old_text, &args.new_text).await,
            Err(e) => Err(e),
        },
        "list_dir" => match parse::<ListArgs>(call) {
            Ok(args) => list_dir(ctx, args.path.as_deref()).await,
            Err(e) => Err(e),
        },
        "search" => match parse::<SearchArgs>(call) {
            Ok(args) => search(ctx, &args.pattern, args.path.as_deref()).await,
            Err(e) => Err(e),
        },
        "run_command" => match parse::<CommandArgs>(call) {
            Ok(args) => run_command(ctx, &args.command).await,
            Err(e) => Err(e),
        },
        "finish" => match parse::<FinishArgs>(call) {
            Ok(args) => return ToolOutcome::Finish(Box::new(args)),
            Err(e) => Err(e),
        },
        other => Err(ToolError::NoSuchTool(other.chars().take(100).collect())),
    };
    ToolOutcome::Output(result.unwrap_or_else(|e| format!("error: {e}")))
}

/// A call in a few words, for the live line: the tool and what it works on.
pub fn describe(call: &ToolCall) -> String {
    let args: serde_json::Value = serde_json::from_str(&call.arguments).unwrap_or_default();
    let what = ["path", "command", "pattern", "status"]
        .iter()
        .find_map(|key| args.get(key).and_then(|v| v.as_str()))
        .unwrap_or("");
    let what: String = what.chars().take(120).collect();
    format!("{} {what}", call.name.chars().take(40).collect::<String>())
        .trim_end()
        .to_string()
}

/// `path` confined to the worktree, resolved on a blocking thread (it follows links on the
/// file system, which the actor's thread must not wait for).
async fn place(ctx: &ToolContext, path: &str) -> Result<PathBuf, ToolError> {
    let (root, path) = (ctx.root.clone(), path.to_string());
    Ok(tokio::task::spawn_blocking(move || confine(&root, &path))
        .await
        .map_err(ToolError::PathCheck)??)
}

/// `text` cut to `max` bytes on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Opens the file `path` names in the worktree for `access`, on a blocking thread: confined,
/// walked without following links, and checked by its descriptor (a regular file, not a
/// FIFO that would hold a thread forever, not a device, not a hard link: ADR-016).
async fn open(ctx: &ToolContext, path: &str, access: Access) -> Result<std::fs::File, ToolError> {
    let (root, path) = (ctx.root.clone(), path.to_string());
    Ok(
        tokio::task::spawn_blocking(move || open_confined(&root, &path, access))
            .await
            .map_err(ToolError::Open)??,
    )
}

/// Opens a regular file of the worktree for reading, and says how long it is.
async fn open_regular(ctx: &ToolContext, path: &str) -> Result<(tokio::fs::File, u64), ToolError> {
    let file = tokio::fs::File::from_std(open(ctx, path, Access::Read).await?);
    let len = file
        .metadata()
        .await
        .map_err(|source| read_failed(path, source))?
        .len();
    Ok((file, len))
}

fn read_failed(path: &str, source: std::io::Error) -> ToolError {
    ToolError::Read {
        path: path.to_string(),
        source,
    }
}

async fn read_file(ctx: &ToolContext, path: &str, offset: u64) -> Result<String, ToolError> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let (mut file, len) = open_regular(ctx, path).await?;
    let start = offset.min(len);
    file.seek(std::io::SeekFrom::Start(start))
        .await
        .map_err(|source| read_failed(path, source))?;
    // Only the part shown is read (a few bytes more, to end on a whole character).
    let mut bytes = Vec::new();
    file.take(ctx.limits.read_bytes as u64 + 3)
        .read_to_end(&mut bytes)
        .await
        .map_err(|source| read_failed(path, source))?;
    let text = String::from_utf8_lossy(&bytes);
    let part = cut(&text, ctx.limits.read_bytes);
    // Where the part ends in the file (exact for UTF-8 text; near enough for anything
    // else, whose undecodable bytes are shown as U+FFFD).
    let end = start + part.len().min(bytes.len()) as u64;
    if end < len {
        Ok(format!(
            "{part}\n[… the file is {len} bytes; this is bytes {start}..{end}: read on with offset {end}]"
        ))
    } else {
        Ok(part.to_string())
    }
}

/// Replaces the whole content of `file` (opened and checked by [`open`]) with `content`.
async fn rewrite(file: std::fs::File, path: &str, content: String) -> Result<(), ToolError> {
    use tokio::io::{AsyncSeekExt, AsyncWriteExt};
    let mut file = tokio::fs::File::from_std(file);
    let failed = |source: std::io::Error| ToolError::Write {
        path: path.to_string(),
        source,
    };
    file.set_len(0).await.map_err(failed)?;
    file.seek(std::io::SeekFrom::Start(0))
        .await
        .map_err(failed)?;
    file.write_all(content.as_bytes()).await.map_err(failed)?;
    file.flush().await.map_err(failed)
}

async fn write_file(ctx: &ToolContext, path: &str, content: &str) -> Result<String, ToolError> {
    if content.len() > ctx.limits.write_bytes {
        return Err(ToolError::TooLarge {
            bytes: content.len(),
            limit: ctx.limits.write_bytes,
        });
    }
    // Opened (directories made) and checked before anything is cut: a hard link to a file
    // outside is refused with its content intact.
    let file = open(ctx, path, Access::Write).await?;
    rewrite(file, path, content.to_string()).await?;
    Ok(format!("wrote {path} ({} bytes)", content.len()))
}

async fn edit_file(
    ctx: &ToolContext,
    path: &str,
    old: &str,
    new: &str,
) -> Result<String, ToolError> {
    use std::io::Read;
    if old.is_empty() {
        return Err(ToolError::EmptyOldText);
    }
    let mut file = open(ctx, path, Access::Edit).await?;
    let limit = ctx.limits.write_bytes;
    // One descriptor from the check to the write: what is read is what is rewritten.
    let (file, text) = tokio::task::spawn_blocking(move || {
        let len = file.metadata()?.len();
        let mut text = String::new();
        if len <= limit as u64 {
            (&mut file).take(limit as u64).read_to_string(&mut text)?;
        }
        Ok::<_, std::io::Error>((file, (len, text)))
    })
    .await
    .map_err(|source| ToolError::ReadStopped {
        path: path.to_string(),
        source,
    })?
    .map_err(|source| read_failed(path, source))?;
    let (len, text) = text;
    if len > limit as u64 {
        return Err(ToolError::TooLargeToEdit {
            path: path.to_string(),
            len,
            limit,
        });
    }
    match text.matches(old).count() {
        0 => Err(ToolError::OldTextMissing {
            path: path.to_string(),
        }),
        1 => {
            let edited = text.replacen(old, new, 1);
            if edited.len() > limit {
                return Err(ToolError::EditedTooLarge {
                    bytes: edited.len(),
                    limit,
                });
            }
            rewrite(file, path, edited).await?;
            Ok(format!("edited {path}"))
        }
        count => Err(ToolError::OldTextAmbiguous {
            path: path.to_string(),
            count,
        }),
    }
}

async fn list_dir(ctx: &ToolContext, path: Option<&str>) -> Result<String, ToolError> {
    let dir = match path {
        Some(p) if !p.trim().is_empty() && p.trim() != "." => place(ctx, p).await?,
        _ => std::fs::canonicalize(&ctx.root).map_err(ToolError::Root)?,
    };
    let mut entries = tokio::fs::read_dir(&dir)
        .await
        .map_err(|source| ToolError::List {
            path: path.unwrap_or(".").to_string(),
            source,
        })?;
    let mut names = Vec::new();
    while let Ok(Some(entry)) = entries.next_entry().await {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == ".git" {
            continue;
        }
        let is_dir = entry.file_type().await.is_ok_and(|t| t.is_dir());
        names.push(if is_dir { format!("{name}/") } else { name });
    }
    names.sort();
    let total = names.len();
    names.truncate(ctx.limits.list_entries);
    let mut out = names.join("\n");
    if total > names.len() {
        out.push_str(&format!("\n[… {} more]", total - names.len()));
    }
    if out.is_empty() {
        out = "(empty)".into();
    }
    Ok(out)
}

async fn search(ctx: &ToolContext, pattern: &str, path: Option<&str>) -> Result<String, ToolError> {
    let regex = regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()?;
    let root = std::fs::canonicalize(&ctx.root).map_err(ToolError::Root)?;
    let start = match path {
        Some(p) if !p.trim().is_empty() && p.trim() != "." => place(ctx, p).await?,
        _ => root.clone(),
    };
    let limits = ctx.limits.clone();
    tokio::task::spawn_blocking(move || search_blocking(&root, &start, &regex, &limits))
        .await
        .map_err(ToolError::Search)
}

fn search_blocking(root: &Path, start: &Path, regex: &regex::Regex, limits: &ToolLimits) -> String {
    let mut matches = Vec::new();
    let mut more = false;
    // The walk honours .gitignore and skips hidden files (and so .git); links are not
    // followed, so a search never leaves the worktree.
    let walk = ignore::WalkBuilder::new(start)
        .follow_links(false)
        .require_git(false)
        .build();
    'files: for entry in walk.flatten() {
        if !entry.file_type().is_some_and(|t| t.is_file()) {
            continue;
        }
        if entry
            .metadata()
            .is_ok_and(|m| m.len() > limits.search_file_bytes)
        {
            continue;
        }
        let Ok(relative) = entry.path().strip_prefix(root) else {
            continue;
        };
        let shown = relative.to_string_lossy().into_owned();
        // Opened as the other tools open a file: a hard link (a name for a file that may be
        // outside) or a link that appeared since the walk saw the name is skipped (ADR-016).
        let Ok(mut file) = open_confined(root, &shown, Access::Read) else {
            continue;
        };
        let mut text = String::new();
        if std::io::Read::read_to_string(&mut file, &mut text).is_err() {
            continue; // binary or unreadable
        }
        for (n, line) in text.lines().enumerate() {
            if regex.is_match(line) {
                if matches.len() == limits.search_matches {
                    more = true;
                    break 'files;
                }
                matches.push(format!("{shown}:{}: {}", n + 1, cut(line, 300)));
            }
        }
    }
    if matches.is_empty() {
        return "no matches".into();
    }
    let mut out = matches.join("\n");
    if more {
        out.push_str(&format!(
            "\n[… stopped at {} matches: narrow the pattern or the path]",
            limits.search_matches
        ));
    }
    out
}

async fn run_command(ctx: &ToolContext, command: &str) -> Result<String, ToolError> {
    if command.trim().is_empty() {
        return Err(ToolError::EmptyCommand);
    }
    let spec = CommandSpec {
        program: "sh".into(),
        args: vec!["-c".into(), command.to_string()],
        cwd: ctx.root.clone(),
        stdin: None,
        env: ctx.env.clone(),
        limits: ctx.limits.command,
        sandbox: ctx.limits.sandbox,
    };
    let output = ctx.runner.run(spec, ctx.cancel.clone(), None).await?;
    let mut out = format!("{}\n", output.exit);
    if !output.stdout.text.is_empty() {
        out.push_str(&format!("stdout:\n{}\n", output.stdout.text));
    }
    if !output.stderr.text.is_empty() {
        out.push_str(&format!("stderr:\n{}\n", output.stderr.text));
    }
    Ok(out)
}
