//! The OpenAI chat-completions wire format, which OpenAI, OpenRouter, vLLM, Ollama and the
//! llama.cpp server all speak: the request body, a whole answer, and a streamed answer
//! assembled from its chunks (text deltas, tool calls in fragments, usage in the last
//! chunk when `stream_options.include_usage` is honoured).

use std::collections::BTreeMap;

use flotilla_actors::ports::{ChatRole, FinishReason, LlmError, ToolCall};
use serde::Deserialize;
use serde_json::{Value, json};

use super::wire::{JsonMode, MAX_TOOL_CALLS, Outgoing, error_message};
use super::{Parsed, parse_lenient};
use crate::sse::SseFrame;

/// The HTTP request for `outgoing`.
pub fn build(
    http: &reqwest::Client,
    base_url: &str,
    key: Option<&str>,
    outgoing: &Outgoing<'_>,
) -> reqwest::RequestBuilder {
    let request = outgoing.request;
    let messages: Vec<Value> = request
        .messages
        .iter()
        .map(|m| {
            let role = match m.role {
                ChatRole::System => "system",
                ChatRole::User => "user",
                ChatRole::Assistant => "assistant",
                ChatRole::Tool => "tool",
            };
            let mut message = json!({ "role": role, "content": m.content });
            if !m.tool_calls.is_empty() {
                message["tool_calls"] = m
                    .tool_calls
                    .iter()
                    .map(|c| {
                        json!({
                            "id": c.id,
                            "type": "function",
                            "function": { "name": c.name, "arguments": c.arguments },
                        })
                    })
                    .collect();
                // An assistant turn that only calls tools keeps `""` as its content: OpenAI
                // takes it, and servers that validate with the SDK's types (llama-cpp-python)
                // refuse `null` there.
            }
            if let Some(id) = &m.tool_call_id {
                message["tool_call_id"] = json!(id);
            }
            message
        })
        .collect();
    let mut body = json!({
        "model": outgoing.model,
        "messages": messages,
        "stream": outgoing.stream,
    });
    if outgoing.stream {
        body["stream_options"] = json!({ "include_usage": true });
    }
    if !request.tools.is_empty() {
        body["tools"] = request
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                })
            })
            .collect();
        // OpenAI's default when tools are given, said explicitly: some servers (llama.cpp's
        // function-calling formats) call no tool unless asked to choose.
        body["tool_choice"] = json!("auto");
    }
    match (outgoing.json_mode, &request.schema) {
        // The llama.cpp family's form: JSON mode constrained to a schema.
        (JsonMode::Schema, Some(schema)) => {
            body["response_format"] = json!({ "type": "json_object", "schema": schema });
        }
        (JsonMode::Schema | JsonMode::Object, _) => {
            body["response_format"] = json!({ "type": "json_object" });
        }
        (JsonMode::Off, _) => {}
    }
    if let Some(max) = outgoing.max_output_tokens {
        body["max_tokens"] = json!(max);
    }
    let mut builder = http
        .post(format!("{base_url}/chat/completions"))
        .header(
            reqwest::header::ACCEPT,
            if outgoing.stream {
                "text/event-stream"
            } else {
                "application/json"
            },
        )
        .json(&body);
    if let Some(key) = key {
        builder = builder.bearer_auth(key);
    }
    builder
}

#[derive(Debug, Default, Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

impl WireUsage {
    fn pair(&self) -> Option<(u64, u64)> {
        match (self.prompt_tokens, self.completion_tokens) {
            (None, None) => None,
            (i, o) => Some((i.unwrap_or(0), o.unwrap_or(0))),
        }
    }
}

#[derive(Debug, Deserialize)]
struct WireFunction {
    #[serde(default)]
    name: Option<String>,
    /// A string of JSON, as the spec says; some servers send the object itself.
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct WireToolCall {
    #[serde(default)]
    index: Option<usize>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<WireFunction>,
}

#[derive(Debug, Default, Deserialize)]
struct WireMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Debug, Deserialize)]
struct WireChoice {
    #[serde(default)]
    message: Option<WireMessage>,
    #[serde(default)]
    delta: Option<WireMessage>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireAnswer {
    #[serde(default)]
    choices: Vec<WireChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "stop" | "end_turn" => FinishReason::Stop,
        "length" => FinishReason::Length,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "content_filter" => FinishReason::ContentFilter,
        _ => FinishReason::Other,
    }
}

fn arguments_text(arguments: Option<Value>) -> String {
    match arguments {
        Some(Value::String(text)) => text,
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

/// An error the server put in a 200 answer or in a stream.
fn embedded_error(error: &Value) -> LlmError {
    let body = json!({ "error": error }).to_string();
    let message = error_message(&body);
    if super::wire::mentions_context_length(&body) {
        return LlmError::ContextTooLong {
            status: 200,
            message,
        };
    }
    LlmError::Server {
        status: 200,
        message,
    }
}

/// A whole (non-streamed) answer.
pub fn parse_body(body: &str) -> Result<Parsed, LlmError> {
    let answer: WireAnswer = parse_lenient(body)
        .map_err(|e| LlmError::Malformed(format!("the answer is not chat-completion JSON: {e}")))?;
    if let Some(error) = &answer.error {
        return Err(embedded_error(error));
    }
    let Some(choice) = answer.choices.into_iter().next() else {
        return Err(LlmError::Malformed("the answer has no choices".into()));
    };
    let message = choice.message.unwrap_or_default();
    let tool_calls = message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, call)| {
            let function = call.function.unwrap_or(WireFunction {
                name: None,
                arguments: None,
            });
            ToolCall {
                id: call.id.unwrap_or_else(|| format!("call_{i}")),
                name: function.name.unwrap_or_default(),
                arguments: arguments_text(function.arguments),
            }
        })
        .collect();
    Ok(Parsed {
        content: message.content.unwrap_or_default(),
        tool_calls,
        usage: answer.usage.as_ref().and_then(WireUsage::pair),
        finish: choice
            .finish_reason
            .as_deref()
            .map_or(FinishReason::Other, finish_reason),
    })
}

/// A tool call being streamed in fragments.
#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// Assembles a streamed answer, chunk by chunk.
#[derive(Debug, Default)]
pub struct StreamAssembler {
    content: String,
    /// By the `index` the server gives each call.
    calls: BTreeMap<usize, PartialCall>,
    usage: Option<(u64, u64)>,
    finish: Option<FinishReason>,
    bytes: usize,
}

impl StreamAssembler {
    /// Takes one SSE event; `true` once the stream says it is done (`[DONE]`).
    pub fn push(&mut self, frame: &SseFrame) -> Result<bool, LlmError> {
        let data = frame.data.trim();
        if data == "[DONE]" {
            return Ok(true);
        }
        if data.is_empty() {
            return Ok(false);
        }
        let chunk: WireAnswer = parse_lenient(data).map_err(|e| {
            LlmError::Malformed(format!("a streamed chunk is not chat-completion JSON: {e}"))
        })?;
        if let Some(error) = &chunk.error {
            return Err(embedded_error(error));
        }
        if let Some(usage) = chunk.usage.as_ref().and_then(WireUsage::pair) {
            self.usage = Some(usage);
        }
        for choice in chunk.choices {
            if let Some(reason) = &choice.finish_reason {
                self.finish = Some(finish_reason(reason));
            }
            let Some(delta) = choice.delta.or(choice.message) else {
                continue;
            };
            if let Some(text) = delta.content {
                self.bytes = self.bytes.saturating_add(text.len());
                self.content.push_str(&text);
            }
            for (position, fragment) in delta.tool_calls.unwrap_or_default().into_iter().enumerate()
            {
                let index = match fragment.index {
                    Some(index) => index,
                    // Servers that omit the index: a new id starts a new call; anything else
                    // continues the last one.
                    None => match self.calls.last_key_value() {
                        Some((&last, call)) => match &fragment.id {
                            // The index is the server's: it may already be the largest.
                            Some(id) if !id.is_empty() && call.id != *id => {
                                last.checked_add(1).ok_or_else(|| {
                                    LlmError::Malformed(format!(
                                        "a tool call comes after one at index {last}, the largest there is"
                                    ))
                                })?
                            }
                            _ => last,
                        },
                        None => position,
                    },
                };
                if !self.calls.contains_key(&index) && self.calls.len() >= MAX_TOOL_CALLS {
                    return Err(LlmError::Malformed(format!(
                        "the answer asks for more than {MAX_TOOL_CALLS} tool calls"
                    )));
                }
                let call = self.calls.entry(index).or_default();
                if let Some(id) = fragment.id.filter(|id| !id.is_empty()) {
                    // Some servers repeat the id in every chunk: it names the call, once.
                    if call.id.is_empty() {
                        call.id = id;
                    }
                }
                if let Some(function) = fragment.function {
                    if let Some(name) = function.name.filter(|n| !n.is_empty()) {
                        // Repeated whole in every chunk by some servers; in fragments by
                        // others.
                        if call.name != name {
                            self.bytes = self.bytes.saturating_add(name.len());
                            call.name.push_str(&name);
                        }
                    }
                    let arguments = arguments_text(function.arguments);
                    self.bytes = self.bytes.saturating_add(arguments.len());
                    call.arguments.push_str(&arguments);
                }
            }
        }
        Ok(false)
    }

    /// Bytes of text and tool calls so far (for the size cap and progress).
    pub fn bytes_so_far(&self) -> usize {
        self.bytes
    }

    /// A choice said why it finished: the answer is whole even without `[DONE]`.
    pub fn finish_reason_seen(&self) -> bool {
        self.finish.is_some()
    }

    pub fn finish(self) -> Result<Parsed, LlmError> {
        let tool_calls = self
            .calls
            .into_iter()
            .map(|(index, call)| ToolCall {
                id: if call.id.is_empty() {
                    format!("call_{index}")
                } else {
                    call.id
                },
                name: call.name,
                arguments: call.arguments,
            })
            .collect();
        Ok(Parsed {
            content: self.content,
            tool_calls,
            usage: self.usage,
            finish: self.finish.unwrap_or(FinishReason::Other),
        })
    }
}
