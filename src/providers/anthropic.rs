//! The Anthropic Messages wire format: the request body (the system prompt apart, tool
//! calls and results as content blocks), a whole answer, and a streamed answer assembled
//! from its events (`message_start`, `content_block_start/delta/stop`, `message_delta`,
//! `message_stop`, `ping`, `error`).

use std::collections::BTreeMap;

use flotilla_actors::ports::{ChatRole, FinishReason, LlmError, ToolCall};
use serde::Deserialize;
use serde_json::{Value, json};

use super::wire::{MAX_TOOL_CALLS, Outgoing, error_message};
use super::{Parsed, parse_lenient};
use crate::sse::SseFrame;

/// The API version flotilla speaks.
pub const API_VERSION: &str = "2023-06-01";
/// Output tokens asked for when neither the request nor the provider names a number (the
/// Messages API requires one).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// The HTTP request for `outgoing`.
pub fn build(
    http: &reqwest::Client,
    base_url: &str,
    key: Option<&str>,
    outgoing: &Outgoing<'_>,
) -> reqwest::RequestBuilder {
    let request = outgoing.request;
    let system: Vec<&str> = request
        .messages
        .iter()
        .filter(|m| m.role == ChatRole::System)
        .map(|m| m.content.as_str())
        .collect();
    let mut messages: Vec<Value> = Vec::new();
    for m in request
        .messages
        .iter()
        .filter(|m| m.role != ChatRole::System)
    {
        let (role, blocks) = match m.role {
            ChatRole::Tool => (
                "user",
                vec![json!({
                    "type": "tool_result",
                    "tool_use_id": m.tool_call_id.clone().unwrap_or_default(),
                    "content": m.content,
                })],
            ),
            ChatRole::Assistant => {
                let mut blocks = Vec::new();
                if !m.content.is_empty() {
                    blocks.push(json!({ "type": "text", "text": m.content }));
                }
                for call in &m.tool_calls {
                    // The model's own arguments, as an object (they were checked as JSON by
                    // the tool that ran them; anything else is passed as a string value).
                    let input = serde_json::from_str::<Value>(&call.arguments)
                        .ok()
                        .filter(Value::is_object)
                        .unwrap_or_else(|| json!({ "arguments": call.arguments }));
                    blocks.push(json!({
                        "type": "tool_use", "id": call.id, "name": call.name, "input": input,
                    }));
                }
                ("assistant", blocks)
            }
            _ => ("user", vec![json!({ "type": "text", "text": m.content })]),
        };
        // The API wants roles to alternate: consecutive turns of one role are merged.
        match messages.last_mut() {
            Some(last) if last["role"] == role => {
                if let Some(content) = last["content"].as_array_mut() {
                    content.extend(blocks);
                }
            }
            _ => messages.push(json!({ "role": role, "content": blocks })),
        }
    }
    let mut body = json!({
        "model": outgoing.model,
        "messages": messages,
        "max_tokens": outgoing.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        "stream": outgoing.stream,
    });
    if !system.is_empty() {
        body["system"] = json!(system.join("\n\n"));
    }
    if !request.tools.is_empty() {
        body["tools"] = request
            .tools
            .iter()
            .map(|t| {
                json!({ "name": t.name, "description": t.description, "input_schema": t.parameters })
            })
            .collect();
    }
    let mut builder = http
        .post(format!("{base_url}/v1/messages"))
        .header("anthropic-version", API_VERSION)
        .json(&body);
    if let Some(key) = key {
        builder = builder.header("x-api-key", key);
    }
    builder
}

#[derive(Debug, Default, Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        #[serde(default)]
        id: String,
        #[serde(default)]
        name: String,
        #[serde(default)]
        input: Value,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
struct WireAnswer {
    #[serde(default)]
    content: Vec<Block>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "end_turn" | "stop_sequence" => FinishReason::Stop,
        "max_tokens" => FinishReason::Length,
        "tool_use" => FinishReason::ToolCalls,
        "refusal" => FinishReason::ContentFilter,
        _ => FinishReason::Other,
    }
}

fn input_text(input: &Value) -> String {
    match input {
        Value::Null => "{}".into(),
        other => other.to_string(),
    }
}

fn embedded_error(error: &Value) -> LlmError {
    let status = match error.get("type").and_then(Value::as_str) {
        Some("overloaded_error") => 529,
        Some("rate_limit_error") => 429,
        _ => 500,
    };
    let body = json!({ "error": error }).to_string();
    let message = error_message(&body);
    if super::wire::mentions_context_length(&body) {
        return LlmError::ContextTooLong { status, message };
    }
    LlmError::Server { status, message }
}

/// A whole (non-streamed) answer.
pub fn parse_body(body: &str) -> Result<Parsed, LlmError> {
    let answer: WireAnswer = parse_lenient(body)
        .map_err(|e| LlmError::Malformed(format!("the answer is not Messages JSON: {e}")))?;
    if let Some(error) = &answer.error {
        return Err(embedded_error(error));
    }
    let mut content = String::new();
    let mut tool_calls = Vec::new();
    for block in answer.content {
        match block {
            Block::Text { text } => content.push_str(&text),
            Block::ToolUse { id, name, input } => tool_calls.push(ToolCall {
                id,
                name,
                arguments: input_text(&input),
            }),
            Block::Other => {}
        }
    }
    let usage = answer
        .usage
        .filter(|u| u.input_tokens.is_some() || u.output_tokens.is_some())
        .map(|u| (u.input_tokens.unwrap_or(0), u.output_tokens.unwrap_or(0)));
    Ok(Parsed {
        content,
        tool_calls,
        usage,
        finish: answer
            .stop_reason
            .as_deref()
            .map_or(FinishReason::Other, finish_reason),
    })
}

/// One content block being streamed.
#[derive(Debug)]
enum PartialBlock {
    Text,
    ToolUse {
        id: String,
        name: String,
        json: String,
    },
}

#[derive(Debug, Deserialize)]
struct StreamEvent {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    index: Option<usize>,
    #[serde(default)]
    message: Option<StreamMessage>,
    #[serde(default)]
    content_block: Option<Value>,
    #[serde(default)]
    delta: Option<Value>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct StreamMessage {
    #[serde(default)]
    usage: Option<WireUsage>,
}

/// Assembles a streamed answer, event by event.
#[derive(Debug, Default)]
pub struct StreamAssembler {
    content: String,
    blocks: BTreeMap<usize, PartialBlock>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    finish: Option<FinishReason>,
    bytes: usize,
}

impl StreamAssembler {
    /// Takes one SSE event; `true` at `message_stop`.
    pub fn push(&mut self, frame: &SseFrame) -> Result<bool, LlmError> {
        let data = frame.data.trim();
        if data.is_empty() {
            return Ok(false);
        }
        let event: StreamEvent = parse_lenient(data).map_err(|e| {
            LlmError::Malformed(format!("a streamed event is not Messages JSON: {e}"))
        })?;
        let index = event.index.unwrap_or(0);
        match event.kind.as_str() {
            "message_start" => {
                if let Some(usage) = event.message.and_then(|m| m.usage) {
                    self.input_tokens = usage.input_tokens.or(self.input_tokens);
                    self.output_tokens = usage.output_tokens.or(self.output_tokens);
                }
            }
            "content_block_start" => {
                if !self.blocks.contains_key(&index) && self.blocks.len() >= MAX_TOOL_CALLS {
                    return Err(LlmError::Malformed(format!(
                        "the answer has more than {MAX_TOOL_CALLS} content blocks"
                    )));
                }
                let block = event.content_block.unwrap_or(Value::Null);
                let partial = match block.get("type").and_then(Value::as_str) {
                    Some("tool_use") => PartialBlock::ToolUse {
                        id: text_field(&block, "id"),
                        name: text_field(&block, "name"),
                        json: String::new(),
                    },
                    _ => {
                        let text = text_field(&block, "text");
                        self.bytes = self.bytes.saturating_add(text.len());
                        self.content.push_str(&text);
                        PartialBlock::Text
                    }
                };
                self.blocks.insert(index, partial);
            }
            "content_block_delta" => {
                let delta = event.delta.unwrap_or(Value::Null);
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => {
                        let text = text_field(&delta, "text");
                        self.bytes = self.bytes.saturating_add(text.len());
                        self.content.push_str(&text);
                    }
                    Some("input_json_delta") => {
                        let part = text_field(&delta, "partial_json");
                        self.bytes = self.bytes.saturating_add(part.len());
                        match self.blocks.get_mut(&index) {
                            Some(PartialBlock::ToolUse { json, .. }) => json.push_str(&part),
                            _ => {
                                return Err(LlmError::Malformed(format!(
                                    "tool input for block {index}, which is not a tool call"
                                )));
                            }
                        }
                    }
                    // Thinking and signature deltas carry nothing flotilla uses.
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = event
                    .delta
                    .as_ref()
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    self.finish = Some(finish_reason(reason));
                }
                if let Some(usage) = event.usage {
                    self.input_tokens = usage.input_tokens.or(self.input_tokens);
                    self.output_tokens = usage.output_tokens.or(self.output_tokens);
                }
            }
            "message_stop" => return Ok(true),
            "error" => {
                return Err(embedded_error(&event.error.unwrap_or(Value::Null)));
            }
            // ping, content_block_stop, and event types added later.
            _ => {}
        }
        Ok(false)
    }

    pub fn bytes_so_far(&self) -> usize {
        self.bytes
    }

    pub fn finish(self) -> Result<Parsed, LlmError> {
        let tool_calls = self
            .blocks
            .into_values()
            .filter_map(|block| match block {
                PartialBlock::ToolUse { id, name, json } => Some(ToolCall {
                    id,
                    name,
                    arguments: if json.trim().is_empty() {
                        "{}".into()
                    } else {
                        json
                    },
                }),
                PartialBlock::Text => None,
            })
            .collect();
        let usage = match (self.input_tokens, self.output_tokens) {
            (None, None) => None,
            (i, o) => Some((i.unwrap_or(0), o.unwrap_or(0))),
        };
        Ok(Parsed {
            content: self.content,
            tool_calls,
            usage,
            finish: self.finish.unwrap_or(FinishReason::Other),
        })
    }
}

fn text_field(value: &Value, field: &str) -> String {
    value
        .get(field)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}
