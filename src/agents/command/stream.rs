//! A CLI's stdout read line by line: the typed events of Claude Code's `stream-json`
//! ([`claude`](super::claude)) and Codex's `exec --json` ([`codex`](super::codex)), or
//! plain text, turned into live activity, spend reported once as it grows, the tools it
//! called, and how the stream ended. A line that is not an event, or an event of a kind
//! flotilla does not read, is passed over (ADR-028). Knows nothing of processes.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use flotilla_actors::protocol::{Budget, Usd};
use serde_json::Value;

use super::config::OutputFormat;
use super::text::{DETAIL_CHARS, GIST_CHARS, one_line};
use super::{aider, claude, codex};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Tokens {
    pub(super) input: u64,
    pub(super) output: u64,
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
pub(super) struct Heard {
    pub(super) activities: Vec<String>,
    /// Spent since the previous report.
    pub(super) spent: Option<Budget>,
}

/// How a structured stream ended, when it did not end well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum StreamEnd {
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
pub(super) struct EventStream {
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
    pub(super) cost: Usd,
    reported_tokens: u64,
    reported_cost: Usd,
    pub(super) tool_calls: u64,
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
    pub(super) fn new(format: OutputFormat, roots: Vec<PathBuf>) -> Self {
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

    pub(super) fn line(&mut self, line: &str) -> Heard {
        let mut heard = Heard::default();
        match self.format {
            OutputFormat::Text => {
                let line = line.trim();
                if !line.is_empty() {
                    heard.activities.push(line.to_string());
                }
                // aider's usage report, one a message (ADR-048).
                if let Some(usage) = aider::usage_line(line) {
                    self.message_sum = self.message_sum.plus(Tokens {
                        input: usage.sent,
                        output: usage.received,
                    });
                    if let Some(cost) = usage.session_cost {
                        self.cost = self.cost.max(cost);
                    }
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
    pub(super) fn tokens(&self) -> Tokens {
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
    pub(super) fn verdict(&self) -> Result<Option<String>, StreamEnd> {
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
#[path = "stream_tests.rs"]
mod tests;
