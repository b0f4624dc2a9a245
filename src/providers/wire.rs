//! What the endpoint and the two wire formats (OpenAI, Anthropic) share: which format and
//! JSON mode a request uses, what one exchange may send, how an error body becomes a
//! bounded message, and the tool-call cap. A leaf of `providers`: the endpoint drives the
//! formats, the formats know only this.

use flotilla_actors::ports::LlmRequest;

/// The most tool calls (or, for Anthropic, content blocks) one answer may hold.
pub const MAX_TOOL_CALLS: usize = 128;

/// The most characters of an error body quoted in an error message.
const MAX_ERROR_CHARS: usize = 500;

/// Which wire format an endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireFormat {
    OpenAi,
    Anthropic,
}

/// How a request asks for JSON output. Servers differ in what they accept, so an endpoint
/// starts at the most it could use and steps down when a server refuses: a schema the
/// answer must follow (`{"type": "json_object", "schema": …}`, the llama.cpp family), then
/// plain JSON mode (`{"type": "json_object"}`, OpenAI and most others), then none (the
/// prompt alone asks for JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum JsonMode {
    Off = 0,
    Object = 1,
    Schema = 2,
}

impl JsonMode {
    pub(super) fn from_u8(level: u8) -> JsonMode {
        match level {
            0 => JsonMode::Off,
            1 => JsonMode::Object,
            _ => JsonMode::Schema,
        }
    }

    /// The next mode down (what to try after a refusal of this one).
    pub(super) fn below(self) -> JsonMode {
        match self {
            JsonMode::Schema => JsonMode::Object,
            JsonMode::Object | JsonMode::Off => JsonMode::Off,
        }
    }
}

/// What one HTTP exchange may send, for a format module to build its request from.
pub struct Outgoing<'a> {
    pub model: &'a str,
    pub request: &'a LlmRequest,
    pub stream: bool,
    /// How to ask for JSON output (`response_format`), where the format has it.
    pub json_mode: JsonMode,
    pub max_output_tokens: Option<u32>,
}

/// The error's message: `{"error": {"message": …}}` (OpenAI and Anthropic), `{"error": "…"}`,
/// `{"message": …}`, or the body's text; bounded, and never empty.
pub fn error_message(body: &str) -> String {
    let from_json = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            let text = |v: &serde_json::Value| v.as_str().map(str::to_string);
            v.pointer("/error/message")
                .and_then(text)
                .or_else(|| v.get("error").and_then(text))
                .or_else(|| v.get("message").and_then(text))
        });
    let message = from_json.unwrap_or_else(|| body.trim().to_string());
    let mut bounded: String = message.chars().take(MAX_ERROR_CHARS).collect();
    if bounded.len() < message.len() {
        bounded.push('…');
    }
    if bounded.is_empty() {
        bounded = "(no message)".into();
    }
    // The provider's text goes on into events, the journal and the daemon's log: nothing
    // in it may act on a terminal that shows any of them.
    crate::text_safety::terminal_safe(&bounded).into_owned()
}

/// The provider says the request does not fit the model's context. Each server words it
/// its own way: OpenAI (`context_length_exceeded`, "maximum context length"; vLLM too),
/// llama.cpp ("exceeds the available context size", `exceed_context_size_error`, older
/// builds "prompt too long"), Anthropic ("prompt is too long", `request_too_large`).
pub fn mentions_context_length(body: &str) -> bool {
    let lower = body.to_ascii_lowercase();
    [
        "context_length_exceeded",
        "maximum context length",
        "context length exceeded",
        "exceeds the available context size",
        "exceed_context_size",
        "prompt is too long",
        "prompt too long",
        "request_too_large",
    ]
    .iter()
    .any(|needle| lower.contains(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_are_found_and_bounded() {
        assert_eq!(
            error_message(r#"{"error": {"message": "invalid api key", "type": "x"}}"#),
            "invalid api key"
        );
        assert_eq!(
            error_message(r#"{"error": "model not found"}"#),
            "model not found"
        );
        assert_eq!(error_message("  plain text\n"), "plain text");
        assert_eq!(error_message(""), "(no message)");
        let long = error_message(&"x".repeat(10_000));
        assert_eq!(long.chars().count(), MAX_ERROR_CHARS + 1);
        // Issue 20: the daemon's log printed provider error text raw.
        assert_eq!(
            error_message(r#"{"error": {"message": "bad\u001b]0;pwned\u0007\u202e\r"}}"#),
            "bad\\x1b]0;pwned\\x07\\u{202e}\\x0d"
        );
        assert_eq!(error_message("a\u{e0041}b\n"), "a\\u{e0041}b");
    }
}
