//! The LLM provider clients (`src/providers/`) against servers that speak the real wire
//! formats: OpenAI chat completions (`POST {base}/chat/completions`, SSE `data:` chunks ending
//! with `data: [DONE]`) and Anthropic Messages (`POST {base}/v1/messages`, typed SSE events).
//!
//! Everything goes through the public API a run uses: `ProviderSettings` →
//! `ProviderRegistry::llm_for` → `Llm::complete`. The servers are wiremock mocks, or a raw TCP
//! server on 127.0.0.1 where the test must control how the bytes are split or withheld.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla::providers::ProviderRegistry;
use flotilla::providers::settings::{
    ModelList, Price, ProviderKind, ProviderSettings, ProviderSpec, RoleModels,
};
use flotilla_actors::ports::{
    ChatMessage, FinishReason, Llm, LlmCall, LlmError, LlmRequest, LlmResponse, Role, ToolCall,
    ToolSpec, approximate_tokens,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

// ---------------------------------------------------------------------------------------------
// Settings and calls
// ---------------------------------------------------------------------------------------------

/// The two wire formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    OpenAi,
    Anthropic,
}

impl Format {
    fn kind(self) -> ProviderKind {
        match self {
            Format::OpenAi => ProviderKind::Openai,
            Format::Anthropic => ProviderKind::Anthropic,
        }
    }

    /// The configured `base_url` for a server at `uri` (OpenAI's includes `/v1`).
    fn base(self, uri: &str) -> String {
        match self {
            Format::OpenAi => format!("{uri}/v1"),
            Format::Anthropic => uri.to_string(),
        }
    }

    /// The path the client posts to.
    pub(crate) fn path(self) -> &'static str {
        match self {
            Format::OpenAi => "/v1/chat/completions",
            Format::Anthropic => "/v1/messages",
        }
    }
}

/// A provider spec of `format` at the server `uri`, with retries fast enough for a test:
/// 10–50 ms backoff, two retries, a 1 s stall timeout.
fn fast_spec(format: Format, uri: &str) -> ProviderSpec {
    let mut spec = ProviderSpec::new(format.kind(), format.base(uri));
    spec.backoff_min_ms = 10;
    spec.backoff_max_ms = 50;
    spec.max_retries = 2;
    spec.stall_timeout_secs = 1;
    spec.request_timeout_secs = 30;
    spec
}

/// Settings from `(name, spec)` providers, the planner served by `planner` (in failover
/// order); checked the way a loaded `flotilla.toml` is.
fn settings_with(providers: Vec<(&str, ProviderSpec)>, planner: &[&str]) -> ProviderSettings {
    let settings = ProviderSettings {
        providers: providers
            .into_iter()
            .map(|(name, spec)| (name.to_string(), spec))
            .collect(),
        roles: RoleModels {
            planner: Some(ModelList::Many(
                planner.iter().map(|m| m.to_string()).collect(),
            )),
            ..RoleModels::default()
        },
        prices: Default::default(),
    };
    settings.validate().expect("the test's settings are valid");
    settings
}

/// Provider `p` (model `m`, so `p/m` answers) of `format` at `uri`, adjusted by `adjust`.
fn settings(format: Format, uri: &str, adjust: impl FnOnce(&mut ProviderSpec)) -> ProviderSettings {
    let mut spec = fast_spec(format, uri);
    adjust(&mut spec);
    settings_with(vec![("p", spec)], &["p/m"])
}

/// The smallest planner request.
fn hi() -> LlmRequest {
    LlmRequest::chat(Role::Planner, vec![ChatMessage::user("hi")])
}

/// One call of `request` through a fresh registry, as a run would make it.
async fn ask_with(
    settings: &ProviderSettings,
    request: LlmRequest,
) -> Result<LlmResponse, LlmError> {
    let registry = ProviderRegistry::new().unwrap();
    let llm = registry.llm_for(settings, None);
    llm.complete(request, LlmCall::default()).await
}

/// `hi()` through a fresh registry.
async fn ask(settings: &ProviderSettings) -> Result<LlmResponse, LlmError> {
    ask_with(settings, hi()).await
}

/// A tool with a JSON Schema, as the built-in agent declares them.
fn read_file_tool() -> ToolSpec {
    ToolSpec {
        name: "read_file".into(),
        description: "Reads a file of the workspace".into(),
        parameters: read_file_schema(),
    }
}

fn read_file_schema() -> Value {
    json!({
        "type": "object",
        "properties": { "path": { "type": "string" } },
        "required": ["path"],
    })
}

/// The arguments of `call` as JSON (the tests compare values, not spacing).
fn arguments(call: &ToolCall) -> Value {
    serde_json::from_str(&call.arguments)
        .unwrap_or_else(|e| panic!("{:?} is not JSON: {e}", call.arguments))
}

// ---------------------------------------------------------------------------------------------
// Bodies in the providers' shapes
// ---------------------------------------------------------------------------------------------

/// An OpenAI streamed chunk with one choice.
fn oa_chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "m",
        "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
    })
}

/// The last OpenAI chunk when `stream_options.include_usage` is honoured: no choices.
fn oa_usage_chunk(tokens_in: u64, tokens_out: u64) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "m",
        "choices": [],
        "usage": {
            "prompt_tokens": tokens_in,
            "completion_tokens": tokens_out,
            "total_tokens": tokens_in + tokens_out,
        },
    })
}

/// An OpenAI event stream: each chunk as `data: {json}`, then `data: [DONE]`.
fn oa_sse(chunks: &[Value]) -> String {
    let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    body
}

/// An Anthropic event stream: each event as `event: {type}` and `data: {json}`.
fn an_sse(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
        .collect()
}

fn an_message_start(usage: Option<(u64, u64)>) -> Value {
    let mut message = json!({
        "id": "msg_01", "type": "message", "role": "assistant", "model": "m",
        "content": [], "stop_reason": null, "stop_sequence": null,
    });
    if let Some((tokens_in, tokens_out)) = usage {
        message["usage"] = json!({ "input_tokens": tokens_in, "output_tokens": tokens_out });
    }
    json!({ "type": "message_start", "message": message })
}

fn an_text_delta(index: usize, text: &str) -> Value {
    json!({
        "type": "content_block_delta", "index": index,
        "delta": { "type": "text_delta", "text": text },
    })
}

fn an_json_delta(index: usize, partial: &str) -> Value {
    json!({
        "type": "content_block_delta", "index": index,
        "delta": { "type": "input_json_delta", "partial_json": partial },
    })
}

fn an_message_delta(stop_reason: &str, tokens_out: Option<u64>) -> Value {
    let mut event = json!({
        "type": "message_delta",
        "delta": { "stop_reason": stop_reason, "stop_sequence": null },
    });
    if let Some(tokens_out) = tokens_out {
        event["usage"] = json!({ "output_tokens": tokens_out });
    }
    event
}

/// A plain streamed answer: `pieces` of text, then usage `(in, out)` if any.
pub(crate) fn streamed_text(format: Format, pieces: &[&str], usage: Option<(u64, u64)>) -> String {
    match format {
        Format::OpenAi => {
            let mut chunks = vec![oa_chunk(
                json!({ "role": "assistant", "content": "" }),
                None,
            )];
            chunks.extend(
                pieces
                    .iter()
                    .map(|p| oa_chunk(json!({ "content": p }), None)),
            );
            chunks.push(oa_chunk(json!({}), Some("stop")));
            if let Some((tokens_in, tokens_out)) = usage {
                chunks.push(oa_usage_chunk(tokens_in, tokens_out));
            }
            oa_sse(&chunks)
        }
        Format::Anthropic => {
            let mut events = vec![
                an_message_start(usage.map(|(tokens_in, _)| (tokens_in, 1))),
                json!({
                    "type": "content_block_start", "index": 0,
                    "content_block": { "type": "text", "text": "" },
                }),
                json!({ "type": "ping" }),
            ];
            events.extend(pieces.iter().map(|p| an_text_delta(0, p)));
            events.push(json!({ "type": "content_block_stop", "index": 0 }));
            events.push(an_message_delta("end_turn", usage.map(|(_, o)| o)));
            events.push(json!({ "type": "message_stop" }));
            an_sse(&events)
        }
    }
}

/// A whole (non-streamed) plain answer.
fn whole_text(format: Format, text: &str, (tokens_in, tokens_out): (u64, u64)) -> Value {
    match format {
        Format::OpenAi => json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "m",
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": text },
                "finish_reason": "stop",
            }],
            "usage": {
                "prompt_tokens": tokens_in,
                "completion_tokens": tokens_out,
                "total_tokens": tokens_in + tokens_out,
            },
        }),
        Format::Anthropic => json!({
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": "m",
            "content": [{ "type": "text", "text": text }],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            "usage": { "input_tokens": tokens_in, "output_tokens": tokens_out },
        }),
    }
}

/// An error body as the provider shapes it.
fn error_body(format: Format, kind: &str, message: &str) -> Value {
    match format {
        Format::OpenAi => json!({
            "error": { "message": message, "type": kind, "param": null, "code": null },
        }),
        Format::Anthropic => json!({
            "type": "error",
            "error": { "type": kind, "message": message },
        }),
    }
}

/// A 200 `text/event-stream` answer.
pub(crate) fn sse(body: impl Into<String>) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_raw(body.into().into_bytes(), "text/event-stream")
}

/// A 200 JSON answer, sent as raw bytes (which may break the JSON grammar on purpose).
fn raw_json(body: impl Into<String>) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_raw(body.into().into_bytes(), "application/json")
}

// ---------------------------------------------------------------------------------------------
// Servers
// ---------------------------------------------------------------------------------------------

/// Answers the n-th request with the n-th answer (the last answer from then on), and records
/// when each request arrived.
#[derive(Clone)]
struct Script {
    answers: Arc<Vec<ResponseTemplate>>,
    arrivals: Arc<Mutex<Vec<Instant>>>,
}

impl Script {
    fn new(answers: Vec<ResponseTemplate>) -> Self {
        assert!(!answers.is_empty());
        Script {
            answers: Arc::new(answers),
            arrivals: Arc::default(),
        }
    }

    fn arrivals(&self) -> Vec<Instant> {
        self.arrivals.lock().unwrap().clone()
    }
}

impl Respond for Script {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        let mut arrivals = self.arrivals.lock().unwrap();
        arrivals.push(Instant::now());
        let n = (arrivals.len() - 1).min(self.answers.len() - 1);
        self.answers[n].clone()
    }
}

/// A mock server of `format` answering its endpoint's path with `responder`.
async fn server(format: Format, responder: impl Respond + 'static) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(format.path()))
        .respond_with(responder)
        .mount(&server)
        .await;
    server
}

/// Every request `server` received, as JSON bodies.
async fn bodies(server: &MockServer) -> Vec<Value> {
    server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| r.body_json().expect("the client sends JSON"))
        .collect()
}

async fn request_count(server: &MockServer) -> usize {
    server.received_requests().await.unwrap().len()
}

/// How a raw server frames the body it dribbles out.
#[derive(Debug, Clone, Copy)]
enum Framing {
    Chunked,
    ContentLength,
}

/// A 200 answer that a raw server writes piece by piece: each piece flushed on its own
/// (and, chunked, as its own HTTP chunk) after a short pause, so that the client reads it
/// apart from its neighbours.
#[derive(Debug, Clone)]
struct Dribble {
    framing: Framing,
    pieces: Vec<Vec<u8>>,
    /// After the pieces, say nothing more and keep the connection open (a stalled stream)
    /// until the client hangs up.
    stall: bool,
}

/// The pause between two pieces.
const DRIBBLE_GAP: Duration = Duration::from_millis(20);
/// A raw server serves at most this many connections.
const MAX_RAW_CONNECTIONS: usize = 8;

/// `body` cut at each offset of `cuts`.
fn cut(body: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut cuts = cuts.to_vec();
    cuts.sort_unstable();
    cuts.dedup();
    let mut pieces = Vec::new();
    let mut start = 0;
    for &at in cuts.iter().filter(|&&at| at > 0 && at < body.len()) {
        pieces.push(body[start..at].to_vec());
        start = at;
    }
    pieces.push(body[start..].to_vec());
    pieces
}

/// The byte offset of `needle` in `haystack`.
fn offset(haystack: &str, needle: &str) -> usize {
    haystack
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in the body"))
}

/// A loopback HTTP/1.1 server answering every request with `dribble`. Returns the server's
/// `http://127.0.0.1:PORT` and the number of requests it has read.
async fn raw_server(dribble: Dribble) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri = format!("http://{}", listener.local_addr().unwrap());
    let requests = Arc::new(AtomicUsize::new(0));
    let counter = requests.clone();
    tokio::spawn(async move {
        for _ in 0..MAX_RAW_CONNECTIONS {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let (dribble, counter) = (dribble.clone(), counter.clone());
            tokio::spawn(async move {
                let _ = serve_raw(socket, &dribble, &counter).await;
            });
        }
    });
    (uri, requests)
}

async fn serve_raw(
    mut socket: TcpStream,
    dribble: &Dribble,
    requests: &AtomicUsize,
) -> std::io::Result<()> {
    socket.set_nodelay(true)?;
    tokio::time::timeout(Duration::from_secs(5), read_request(&mut socket))
        .await
        .map_err(|_| std::io::Error::other("the request took too long"))??;
    requests.fetch_add(1, Ordering::SeqCst);
    let framing = match dribble.framing {
        Framing::Chunked => "Transfer-Encoding: chunked".to_string(),
        Framing::ContentLength => format!(
            "Content-Length: {}",
            dribble.pieces.iter().map(Vec::len).sum::<usize>()
        ),
    };
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n{framing}\r\nConnection: close\r\n\r\n"
    );
    socket.write_all(head.as_bytes()).await?;
    socket.flush().await?;
    for piece in &dribble.pieces {
        tokio::time::sleep(DRIBBLE_GAP).await;
        match dribble.framing {
            Framing::Chunked => {
                socket
                    .write_all(format!("{:x}\r\n", piece.len()).as_bytes())
                    .await?;
                socket.write_all(piece).await?;
                socket.write_all(b"\r\n").await?;
            }
            Framing::ContentLength => socket.write_all(piece).await?,
        }
        socket.flush().await?;
    }
    if dribble.stall {
        // Silence until the client hangs up (a read sees the end), at most 10 s.
        let mut buf = [0u8; 256];
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            while let Ok(n) = socket.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
        return Ok(());
    }
    if let Framing::Chunked = dribble.framing {
        socket.write_all(b"0\r\n\r\n").await?;
    }
    socket.flush().await?;
    socket.shutdown().await
}

/// Reads one request: its head, then as many body bytes as its `Content-Length` says.
async fn read_request(socket: &mut TcpStream) -> std::io::Result<()> {
    const MAX_REQUEST: usize = 1 << 20;
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    while data.len() <= MAX_REQUEST {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if data.len() >= end + 4 + length {
                return Ok(());
            }
        }
        let n = socket.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::Error::other("the client hung up mid-request"));
        }
        data.extend_from_slice(&buf[..n]);
    }
    Err(std::io::Error::other("the request is too large"))
}

/// Sets an environment variable that only the calling test reads.
fn set_test_key(name: &str, value: &str) {
    // SAFETY: edition 2024 marks `set_var` unsafe because C code calling `getenv` on
    // another thread could read the environment while it changes. Rust code cannot race
    // it: `std::env::var` and `set_var` share std's environment lock, and every read of this
    // variable (the provider's, at call time) goes through `std::env::var`. The name is
    // unique to one test, set once, and never removed. What is left is a C-level reader in
    // another test at that instant, a risk a test can accept: nothing a user runs depends
    // on it.
    unsafe { std::env::set_var(name, value) }
}

// ---------------------------------------------------------------------------------------------
// 1. Plain answers
// ---------------------------------------------------------------------------------------------

/// A streamed plain answer: text from the deltas, the provider's usage (not an estimate),
/// `provider/model`, the finish reason. The request asks for a stream, and OpenAI's asks for
/// usage in it (`stream_options.include_usage`).
async fn streamed_plain_answer(format: Format) {
    let server = server(
        format,
        sse(streamed_text(
            format,
            &["Hel", "lo, ", "world"],
            Some((12, 3)),
        )),
    )
    .await;
    let answer = ask(&settings(format, &server.uri(), |_| {})).await.unwrap();
    assert_eq!(answer.content, "Hello, world");
    assert!(answer.tool_calls.is_empty());
    assert_eq!((answer.usage.tokens_in, answer.usage.tokens_out), (12, 3));
    assert!(!answer.usage_approximate);
    assert_eq!(answer.model, "p/m");
    assert_eq!(answer.finish, FinishReason::Stop);

    let sent = bodies(&server).await;
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["model"], "m");
    assert_eq!(sent[0]["stream"], true);
    match format {
        Format::OpenAi => {
            assert_eq!(sent[0]["stream_options"]["include_usage"], true);
            assert_eq!(
                sent[0]["messages"][0],
                json!({ "role": "user", "content": "hi" })
            );
        }
        Format::Anthropic => {
            assert!(sent[0]["max_tokens"].as_u64().unwrap() > 0);
            assert_eq!(sent[0]["messages"][0]["content"][0]["text"], "hi");
        }
    }
}

/// A whole (non-streamed) plain answer: text, the provider's usage, model, finish.
async fn whole_plain_answer(format: Format) {
    let server = server(
        format,
        ResponseTemplate::new(200).set_body_json(whole_text(format, "Hello, world", (20, 4))),
    )
    .await;
    let settings = settings(format, &server.uri(), |s| s.stream = false);
    let answer = ask(&settings).await.unwrap();
    assert_eq!(answer.content, "Hello, world");
    assert_eq!((answer.usage.tokens_in, answer.usage.tokens_out), (20, 4));
    assert!(!answer.usage_approximate);
    assert_eq!(answer.model, "p/m");
    assert_eq!(answer.finish, FinishReason::Stop);
    let sent = bodies(&server).await;
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["stream"], false);
    assert!(sent[0].get("stream_options").is_none());
}

#[tokio::test]
async fn openai_streamed_answer_has_text_usage_model_and_finish() {
    streamed_plain_answer(Format::OpenAi).await;
}

#[tokio::test]
async fn anthropic_streamed_answer_has_text_usage_model_and_finish() {
    streamed_plain_answer(Format::Anthropic).await;
}

#[tokio::test]
async fn openai_whole_answer_has_text_usage_model_and_finish() {
    whole_plain_answer(Format::OpenAi).await;
}

#[tokio::test]
async fn anthropic_whole_answer_has_text_usage_model_and_finish() {
    whole_plain_answer(Format::Anthropic).await;
}

/// A finish reason other than a normal stop is reported: OpenAI's `length`, Anthropic's
/// `max_tokens` (the answer is cut off).
#[tokio::test]
async fn a_cut_off_answer_says_so_in_both_formats() {
    let openai = oa_sse(&[
        oa_chunk(json!({ "content": "partial" }), None),
        oa_chunk(json!({}), Some("length")),
        oa_usage_chunk(5, 7),
    ]);
    let anthropic = an_sse(&[
        an_message_start(Some((5, 1))),
        json!({ "type": "content_block_start", "index": 0, "content_block": { "type": "text", "text": "" } }),
        an_text_delta(0, "partial"),
        json!({ "type": "content_block_stop", "index": 0 }),
        an_message_delta("max_tokens", Some(7)),
        json!({ "type": "message_stop" }),
    ]);
    for (format, body) in [(Format::OpenAi, openai), (Format::Anthropic, anthropic)] {
        let server = server(format, sse(body)).await;
        let answer = ask(&settings(format, &server.uri(), |_| {})).await.unwrap();
        assert_eq!(answer.content, "partial", "{format:?}");
        assert_eq!(answer.finish, FinishReason::Length, "{format:?}");
        assert_eq!((answer.usage.tokens_in, answer.usage.tokens_out), (5, 7));
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Tool calls
// ---------------------------------------------------------------------------------------------

/// OpenAI: the tools go out as `tools[].function` with their schema; two tool calls streamed
/// the standard way (id and name in the first fragment, arguments in pieces, by `index`) come
/// back whole, in order.
#[tokio::test]
async fn openai_streamed_tool_calls_are_assembled_from_fragments() {
    let call = |index: usize, function: Value, id: Option<&str>| {
        let mut fragment = json!({ "index": index, "function": function });
        if let Some(id) = id {
            fragment["id"] = json!(id);
            fragment["type"] = json!("function");
        }
        oa_chunk(json!({ "tool_calls": [fragment] }), None)
    };
    let body = oa_sse(&[
        oa_chunk(json!({ "role": "assistant", "content": null }), None),
        call(
            0,
            json!({ "name": "read_file", "arguments": "" }),
            Some("call_a"),
        ),
        call(0, json!({ "arguments": "{\"pa" }), None),
        call(0, json!({ "arguments": "th\": \"src/" }), None),
        call(0, json!({ "arguments": "main.rs\"}" }), None),
        call(
            1,
            json!({ "name": "read_file", "arguments": "" }),
            Some("call_b"),
        ),
        call(1, json!({ "arguments": "{\"path\":" }), None),
        call(1, json!({ "arguments": " \"Cargo.toml\"}" }), None),
        oa_chunk(json!({}), Some("tool_calls")),
        oa_usage_chunk(40, 30),
    ]);
    let server = server(Format::OpenAi, sse(body)).await;
    let request = hi().with_tools(vec![read_file_tool()]);
    let answer = ask_with(&settings(Format::OpenAi, &server.uri(), |_| {}), request)
        .await
        .unwrap();

    assert_eq!(answer.finish, FinishReason::ToolCalls);
    assert_eq!(answer.tool_calls.len(), 2, "{:?}", answer.tool_calls);
    let (a, b) = (&answer.tool_calls[0], &answer.tool_calls[1]);
    assert_eq!((a.id.as_str(), a.name.as_str()), ("call_a", "read_file"));
    assert_eq!(arguments(a), json!({ "path": "src/main.rs" }));
    assert_eq!((b.id.as_str(), b.name.as_str()), ("call_b", "read_file"));
    assert_eq!(arguments(b), json!({ "path": "Cargo.toml" }));

    let sent = bodies(&server).await;
    let tools = sent[0]["tools"].as_array().expect("tools are sent");
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0]["type"], "function");
    assert_eq!(tools[0]["function"]["name"], "read_file");
    assert_eq!(tools[0]["function"]["parameters"], read_file_schema());
    assert_eq!(
        sent[0]["tool_choice"], "auto",
        "said explicitly: llama.cpp's function-calling formats call no tool otherwise"
    );
}

/// OpenAI: the built-in agent's next call carries its earlier turn's tool calls (content
/// `""`, not `null`: llama-cpp-python's validation refuses `null` there) and each result with
/// the id of the call it answers.
#[tokio::test]
async fn openai_a_conversation_with_tool_results_goes_out_in_the_wire_format() {
    let body = oa_sse(&[
        oa_chunk(
            json!({ "role": "assistant", "content": "done" }),
            Some("stop"),
        ),
        oa_usage_chunk(10, 1),
    ]);
    let server = server(Format::OpenAi, sse(body)).await;
    let call = ToolCall {
        id: "call_1".into(),
        name: "read_file".into(),
        arguments: "{\"path\":\"a.rs\"}".into(),
    };
    let request = LlmRequest::chat(
        Role::Planner,
        vec![
            ChatMessage::user("do it"),
            ChatMessage::assistant_calls("", vec![call]),
            ChatMessage::tool_result("call_1", "fn a() {}"),
        ],
    )
    .with_tools(vec![read_file_tool()]);
    ask_with(&settings(Format::OpenAi, &server.uri(), |_| {}), request)
        .await
        .unwrap();
    let sent = &bodies(&server).await[0]["messages"];
    assert_eq!(sent[1]["role"], "assistant");
    assert_eq!(sent[1]["content"], "");
    assert_eq!(sent[1]["tool_calls"][0]["id"], "call_1");
    assert_eq!(sent[1]["tool_calls"][0]["function"]["name"], "read_file");
    assert_eq!(
        sent[1]["tool_calls"][0]["function"]["arguments"],
        "{\"path\":\"a.rs\"}"
    );
    assert_eq!(
        sent[2],
        json!({ "role": "tool", "content": "fn a() {}", "tool_call_id": "call_1" })
    );
}

/// OpenAI: some servers repeat the call's id and whole name in every chunk (with or without
/// an `index`): that is still one call, named once, its arguments concatenated.
#[tokio::test]
async fn openai_tool_call_repeating_its_name_and_id_in_every_chunk_is_one_call() {
    for with_index in [true, false] {
        let fragment = |arguments: &str| {
            let mut call = json!({
                "id": "call_x",
                "type": "function",
                "function": { "name": "read_file", "arguments": arguments },
            });
            if with_index {
                call["index"] = json!(0);
            }
            oa_chunk(json!({ "tool_calls": [call] }), None)
        };
        let body = oa_sse(&[
            fragment("{\"path\""),
            fragment(": \"src/"),
            fragment("lib.rs\"}"),
            oa_chunk(json!({}), Some("tool_calls")),
            oa_usage_chunk(10, 10),
        ]);
        let server = server(Format::OpenAi, sse(body)).await;
        let request = hi().with_tools(vec![read_file_tool()]);
        let answer = ask_with(&settings(Format::OpenAi, &server.uri(), |_| {}), request)
            .await
            .unwrap();
        assert_eq!(
            answer.tool_calls,
            vec![ToolCall {
                id: "call_x".into(),
                name: "read_file".into(),
                arguments: "{\"path\": \"src/lib.rs\"}".into(),
            }],
            "with index: {with_index}"
        );
    }
}

/// OpenAI: tool calls in a whole answer (arguments as a JSON string).
#[tokio::test]
async fn openai_whole_answer_tool_calls_are_read() {
    let body = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant",
                "content": null,
                "tool_calls": [{
                    "id": "call_a", "type": "function",
                    "function": { "name": "read_file", "arguments": "{\"path\":\"src/main.rs\"}" },
                }],
            },
            "finish_reason": "tool_calls",
        }],
        "usage": { "prompt_tokens": 9, "completion_tokens": 8, "total_tokens": 17 },
    });
    let server = server(
        Format::OpenAi,
        ResponseTemplate::new(200).set_body_json(body),
    )
    .await;
    let settings = settings(Format::OpenAi, &server.uri(), |s| s.stream = false);
    let answer = ask_with(&settings, hi().with_tools(vec![read_file_tool()]))
        .await
        .unwrap();
    assert_eq!(answer.finish, FinishReason::ToolCalls);
    assert_eq!(answer.tool_calls.len(), 1);
    assert_eq!(answer.tool_calls[0].id, "call_a");
    assert_eq!(answer.tool_calls[0].name, "read_file");
    assert_eq!(
        arguments(&answer.tool_calls[0]),
        json!({ "path": "src/main.rs" })
    );
    assert_eq!(
        bodies(&server).await[0]["tools"][0]["function"]["name"],
        "read_file"
    );
}

/// Anthropic: the tools go out with their `input_schema`; a text block then a `tool_use`
/// block whose input arrives as `input_json_delta` fragments come back as the text and one
/// whole call.
#[tokio::test]
async fn anthropic_streamed_tool_use_is_assembled_from_input_json_deltas() {
    let body = an_sse(&[
        an_message_start(Some((50, 1))),
        json!({ "type": "content_block_start", "index": 0, "content_block": { "type": "text", "text": "" } }),
        an_text_delta(0, "Let me look."),
        json!({ "type": "content_block_stop", "index": 0 }),
        json!({
            "type": "content_block_start", "index": 1,
            "content_block": { "type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {} },
        }),
        an_json_delta(1, ""),
        an_json_delta(1, "{\"path\": \"sr"),
        json!({ "type": "ping" }),
        an_json_delta(1, "c/main.rs\"}"),
        json!({ "type": "content_block_stop", "index": 1 }),
        an_message_delta("tool_use", Some(25)),
        json!({ "type": "message_stop" }),
    ]);
    let server = server(Format::Anthropic, sse(body)).await;
    let request = hi().with_tools(vec![read_file_tool()]);
    let answer = ask_with(&settings(Format::Anthropic, &server.uri(), |_| {}), request)
        .await
        .unwrap();

    assert_eq!(answer.content, "Let me look.");
    assert_eq!(answer.finish, FinishReason::ToolCalls);
    assert_eq!((answer.usage.tokens_in, answer.usage.tokens_out), (50, 25));
    assert_eq!(answer.tool_calls.len(), 1, "{:?}", answer.tool_calls);
    assert_eq!(answer.tool_calls[0].id, "toolu_01");
    assert_eq!(answer.tool_calls[0].name, "read_file");
    assert_eq!(
        arguments(&answer.tool_calls[0]),
        json!({ "path": "src/main.rs" })
    );

    let sent = bodies(&server).await;
    let tools = sent[0]["tools"].as_array().expect("tools are sent");
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0]["name"], "read_file");
    assert_eq!(tools[0]["input_schema"], read_file_schema());
}

/// Anthropic: a `tool_use` block in a whole answer (its input an object).
#[tokio::test]
async fn anthropic_whole_answer_tool_use_is_read() {
    let body = json!({
        "id": "msg_01", "type": "message", "role": "assistant", "model": "m",
        "content": [
            { "type": "text", "text": "Reading." },
            { "type": "tool_use", "id": "toolu_01", "name": "read_file", "input": { "path": "src/main.rs" } },
        ],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": { "input_tokens": 30, "output_tokens": 20 },
    });
    let server = server(
        Format::Anthropic,
        ResponseTemplate::new(200).set_body_json(body),
    )
    .await;
    let settings = settings(Format::Anthropic, &server.uri(), |s| s.stream = false);
    let answer = ask_with(&settings, hi().with_tools(vec![read_file_tool()]))
        .await
        .unwrap();
    assert_eq!(answer.content, "Reading.");
    assert_eq!(answer.finish, FinishReason::ToolCalls);
    assert_eq!(answer.tool_calls.len(), 1);
    assert_eq!(answer.tool_calls[0].id, "toolu_01");
    assert_eq!(
        arguments(&answer.tool_calls[0]),
        json!({ "path": "src/main.rs" })
    );
    assert_eq!(
        bodies(&server).await[0]["tools"][0]["input_schema"],
        read_file_schema()
    );
}

// ---------------------------------------------------------------------------------------------
// 3. JSON output
// ---------------------------------------------------------------------------------------------

/// Refuses every request that asks for `response_format` with `refusal`; answers the others.
struct RefusesJsonMode {
    refusal: ResponseTemplate,
    answer: ResponseTemplate,
}

impl Respond for RefusesJsonMode {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: Value = request.body_json().unwrap_or_default();
        if body.get("response_format").is_some() {
            self.refusal.clone()
        } else {
            self.answer.clone()
        }
    }
}

/// OpenAI: a JSON request asks for `response_format: {"type": "json_object"}`; a plain one
/// does not.
#[tokio::test]
async fn openai_json_request_sends_response_format() {
    let server = server(
        Format::OpenAi,
        sse(streamed_text(
            Format::OpenAi,
            &["{\"ok\": true}"],
            Some((3, 3)),
        )),
    )
    .await;
    let settings = settings(Format::OpenAi, &server.uri(), |_| {});
    let answer = ask_with(&settings, hi().json()).await.unwrap();
    assert_eq!(answer.content, "{\"ok\": true}");
    ask(&settings).await.unwrap();
    let sent = bodies(&server).await;
    assert_eq!(sent[0]["response_format"], json!({ "type": "json_object" }));
    assert!(sent[1].get("response_format").is_none(), "{}", sent[1]);
}

/// Anthropic has no `response_format`: a JSON request is sent without one.
#[tokio::test]
async fn anthropic_json_request_sends_no_response_format() {
    let server = server(
        Format::Anthropic,
        sse(streamed_text(
            Format::Anthropic,
            &["{\"ok\": true}"],
            Some((3, 3)),
        )),
    )
    .await;
    let answer = ask_with(
        &settings(Format::Anthropic, &server.uri(), |_| {}),
        hi().json(),
    )
    .await
    .unwrap();
    assert_eq!(answer.content, "{\"ok\": true}");
    assert!(bodies(&server).await[0].get("response_format").is_none());
}

/// A server that refuses `response_format` with `refusal`: the call is asked again without
/// it and succeeds (one extra request, not a retry), and a later run's call to the same
/// endpoint (same registry) no longer sends it.
async fn json_mode_refusal_is_remembered(refusal: ResponseTemplate) {
    let answer = ResponseTemplate::new(200).set_body_json(whole_text(
        Format::OpenAi,
        "{\"ok\": true}",
        (5, 4),
    ));
    let server = server(Format::OpenAi, RefusesJsonMode { refusal, answer }).await;
    // No retries at all: the second request must not be one.
    let settings = settings(Format::OpenAi, &server.uri(), |s| {
        s.stream = false;
        s.max_retries = 0;
    });
    let registry = ProviderRegistry::new().unwrap();
    let first = registry
        .llm_for(&settings, None)
        .complete(hi().json(), LlmCall::default())
        .await
        .unwrap();
    assert_eq!(first.content, "{\"ok\": true}");
    let later = registry
        .llm_for(&settings, None)
        .complete(hi().json(), LlmCall::default())
        .await
        .unwrap();
    assert_eq!(later.content, "{\"ok\": true}");

    let sent = bodies(&server).await;
    assert_eq!(sent.len(), 3, "refused, asked again, later call: {sent:?}");
    assert_eq!(sent[0]["response_format"], json!({ "type": "json_object" }));
    assert!(sent[1].get("response_format").is_none());
    assert!(sent[2].get("response_format").is_none());
}

#[tokio::test]
async fn openai_json_mode_refused_with_a_400_is_dropped_for_the_endpoint() {
    json_mode_refusal_is_remembered(ResponseTemplate::new(400).set_body_json(error_body(
        Format::OpenAi,
        "invalid_request_error",
        "Invalid parameter: 'response_format' of type 'json_object' is not supported with this model.",
    )))
    .await;
}

#[tokio::test]
async fn openai_json_mode_refused_with_a_plain_text_500_is_dropped_for_the_endpoint() {
    json_mode_refusal_is_remembered(ResponseTemplate::new(500).set_body_raw(
        "unsupported parameter: response_format".as_bytes(),
        "text/plain",
    ))
    .await;
}

/// Two JSON calls in flight when the server refuses `response_format` (400): both are asked
/// again without it and succeed, not only the one that turned JSON mode off (the other one
/// used to fail with the 400 as a final refusal).
#[tokio::test]
async fn openai_json_mode_refused_to_two_calls_in_flight_is_dropped_for_both() {
    let format = Format::OpenAi;
    let refusal = ResponseTemplate::new(400)
        .set_body_json(error_body(
            format,
            "invalid_request_error",
            "Invalid parameter: 'response_format' is not supported with this model.",
        ))
        .set_delay(Duration::from_millis(200));
    let answer = ResponseTemplate::new(200).set_body_json(whole_text(format, "{}", (1, 1)));
    let server = server(format, RefusesJsonMode { refusal, answer }).await;
    let settings = settings(format, &server.uri(), |s| {
        s.stream = false;
        s.max_retries = 0;
    });
    let registry = ProviderRegistry::new().unwrap();
    let (run_a, run_b) = (
        registry.llm_for(&settings, None),
        registry.llm_for(&settings, None),
    );
    let (a, b) = tokio::join!(
        run_a.complete(hi().json(), LlmCall::default()),
        run_b.complete(hi().json(), LlmCall::default()),
    );
    assert_eq!(a.unwrap().content, "{}");
    assert_eq!(b.unwrap().content, "{}");
}

// ---------------------------------------------------------------------------------------------
// 4–5. Usage and misbehaving servers
// ---------------------------------------------------------------------------------------------

/// SSE comment lines (`: keep-alive`, as OpenRouter sends) between events are ignored.
async fn keep_alive_comments_are_ignored(format: Format) {
    let body = streamed_text(format, &["one ", "two"], Some((4, 2)));
    let with_comments: String = body
        .split_inclusive("\n\n")
        .map(|event| format!(": keep-alive\n\n{event}: OPENROUTER PROCESSING\n"))
        .collect();
    let server = server(format, sse(with_comments)).await;
    let answer = ask(&settings(format, &server.uri(), |_| {})).await.unwrap();
    assert_eq!(answer.content, "one two");
    assert_eq!((answer.usage.tokens_in, answer.usage.tokens_out), (4, 2));
    assert_eq!(answer.finish, FinishReason::Stop);
}

#[tokio::test]
async fn openai_keep_alive_comments_are_ignored() {
    keep_alive_comments_are_ignored(Format::OpenAi).await;
}

#[tokio::test]
async fn anthropic_keep_alive_comments_are_ignored() {
    keep_alive_comments_are_ignored(Format::Anthropic).await;
}

/// A stream without usage: the answer is kept, its usage estimated from the text (about
/// four characters a token) and marked approximate.
async fn stream_without_usage_is_estimated(format: Format) {
    let text = "An answer of some forty characters long.";
    let server = server(format, sse(streamed_text(format, &[text], None))).await;
    let answer = ask(&settings(format, &server.uri(), |_| {})).await.unwrap();
    assert_eq!(answer.content, text);
    assert!(answer.usage_approximate);
    assert!(answer.usage.tokens_in > 0);
    assert_eq!(answer.usage.tokens_out, approximate_tokens(text));
    assert!(answer.usage.tokens_out > 0);
}

#[tokio::test]
async fn openai_stream_without_usage_is_estimated() {
    stream_without_usage_is_estimated(Format::OpenAi).await;
}

#[tokio::test]
async fn anthropic_stream_without_usage_is_estimated() {
    stream_without_usage_is_estimated(Format::Anthropic).await;
}

/// A 500 with a plain-text body (as some servers answer a bad request): retried
/// `max_retries` times, then a server error quoting the text.
async fn plain_text_500_is_retried_then_a_server_error(format: Format) {
    let text = "Internal Server Error: failed to parse the request: messages[0] is invalid";
    let server = server(
        format,
        ResponseTemplate::new(500).set_body_raw(text.as_bytes(), "text/plain"),
    )
    .await;
    let error = ask(&settings(format, &server.uri(), |s| s.max_retries = 3))
        .await
        .unwrap_err();
    match &error {
        LlmError::Server { status, message } => {
            assert_eq!(*status, 500);
            assert!(message.contains(text), "{message}");
        }
        other => panic!("expected a server error, got {other:?}"),
    }
    assert!(error.is_retryable());
    assert_eq!(request_count(&server).await, 4, "one try and three retries");
}

#[tokio::test]
async fn openai_plain_text_500_is_retried_then_a_server_error() {
    plain_text_500_is_retried_then_a_server_error(Format::OpenAi).await;
}

#[tokio::test]
async fn anthropic_plain_text_500_is_retried_then_a_server_error() {
    plain_text_500_is_retried_then_a_server_error(Format::Anthropic).await;
}

/// A whole answer with raw control characters (a literal newline and tab) inside a JSON
/// string, which the grammar forbids: read anyway, the characters kept.
async fn raw_controls_in_a_whole_body_are_tolerated(format: Format) {
    let body = match format {
        Format::OpenAi => concat!(
            "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"model\":\"m\",\"choices\":[",
            "{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"line one\nline\ttwo\"},",
            "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}"
        ),
        Format::Anthropic => concat!(
            "{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\",",
            "\"content\":[{\"type\":\"text\",\"text\":\"line one\nline\ttwo\"}],",
            "\"stop_reason\":\"end_turn\",\"usage\":{\"input_tokens\":3,\"output_tokens\":4}}"
        ),
    };
    assert!(
        serde_json::from_str::<Value>(body).is_err(),
        "the body is not strict JSON"
    );
    let server = server(format, raw_json(body)).await;
    let settings = settings(format, &server.uri(), |s| s.stream = false);
    let answer = ask(&settings).await.unwrap();
    assert_eq!(answer.content, "line one\nline\ttwo");
    assert_eq!((answer.usage.tokens_in, answer.usage.tokens_out), (3, 4));
    assert_eq!(request_count(&server).await, 1);
}

#[tokio::test]
async fn openai_raw_control_characters_in_a_whole_body_are_tolerated() {
    raw_controls_in_a_whole_body_are_tolerated(Format::OpenAi).await;
}

#[tokio::test]
async fn anthropic_raw_control_characters_in_a_whole_body_are_tolerated() {
    raw_controls_in_a_whole_body_are_tolerated(Format::Anthropic).await;
}

/// A streamed chunk with a raw tab (and another control character) inside a JSON string:
/// read anyway. (A raw newline cannot occur there: it would end the `data:` line.)
async fn raw_controls_in_a_stream_chunk_are_tolerated(format: Format) {
    let body = match format {
        Format::OpenAi => {
            let mut body = format!("data: {}\n\n", oa_chunk(json!({ "content": "a" }), None));
            body.push_str(
                "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"col1\tcol2\u{1}\"},\"finish_reason\":null}]}\n\n",
            );
            body.push_str(&oa_sse(&[
                oa_chunk(json!({}), Some("stop")),
                oa_usage_chunk(2, 3),
            ]));
            body
        }
        Format::Anthropic => {
            let mut body = an_sse(&[
                an_message_start(Some((2, 1))),
                json!({ "type": "content_block_start", "index": 0, "content_block": { "type": "text", "text": "" } }),
                an_text_delta(0, "a"),
            ]);
            body.push_str(
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"col1\tcol2\u{1}\"}}\n\n",
            );
            body.push_str(&an_sse(&[
                json!({ "type": "content_block_stop", "index": 0 }),
                an_message_delta("end_turn", Some(3)),
                json!({ "type": "message_stop" }),
            ]));
            body
        }
    };
    let server = server(format, sse(body)).await;
    let answer = ask(&settings(format, &server.uri(), |_| {})).await.unwrap();
    assert_eq!(answer.content, "acol1\tcol2\u{1}");
    assert_eq!((answer.usage.tokens_in, answer.usage.tokens_out), (2, 3));
}

#[tokio::test]
async fn openai_raw_control_characters_in_a_stream_chunk_are_tolerated() {
    raw_controls_in_a_stream_chunk_are_tolerated(Format::OpenAi).await;
}

#[tokio::test]
async fn anthropic_raw_control_characters_in_a_stream_chunk_are_tolerated() {
    raw_controls_in_a_stream_chunk_are_tolerated(Format::Anthropic).await;
}

/// A server that ignores `stream: true` and answers a whole `application/json` body: the
/// body is read as a whole answer (it used to be parsed as an event stream, found empty,
/// and every retry failed the same way).
async fn whole_answer_to_a_stream_request_is_read(format: Format) {
    let server = server(
        format,
        ResponseTemplate::new(200).set_body_json(whole_text(format, "whole", (7, 2))),
    )
    .await;
    let answer = ask(&settings(format, &server.uri(), |_| {})).await.unwrap();
    assert_eq!(answer.content, "whole");
    assert_eq!((answer.usage.tokens_in, answer.usage.tokens_out), (7, 2));
    assert_eq!(answer.finish, FinishReason::Stop);
    assert_eq!(
        bodies(&server).await[0]["stream"],
        true,
        "a stream was asked for"
    );
}

#[tokio::test]
async fn openai_whole_answer_to_a_stream_request_is_read() {
    whole_answer_to_a_stream_request_is_read(Format::OpenAi).await;
}

#[tokio::test]
async fn anthropic_whole_answer_to_a_stream_request_is_read() {
    whole_answer_to_a_stream_request_is_read(Format::Anthropic).await;
}

/// An error the server puts inside a stream (OpenAI-compatible servers: a chunk with an
/// `error` object; Anthropic: an `error` event, e.g. `overloaded_error`) is a server failure:
/// retried, and the next answer is used; when every try fails, the error carries the
/// server's message.
async fn error_inside_a_stream_is_retried(format: Format) {
    let failing = match format {
        Format::OpenAi => format!(
            "data: {}\n\ndata: {}\n\n",
            oa_chunk(json!({ "content": "Hel" }), None),
            json!({ "error": { "message": "upstream provider overloaded", "code": 502 } }),
        ),
        Format::Anthropic => an_sse(&[
            an_message_start(Some((3, 1))),
            json!({ "type": "content_block_start", "index": 0, "content_block": { "type": "text", "text": "" } }),
            an_text_delta(0, "Hel"),
            json!({ "type": "error", "error": { "type": "overloaded_error", "message": "Overloaded" } }),
        ]),
    };
    let expected_status = match format {
        Format::OpenAi => 200,
        Format::Anthropic => 529,
    };
    let message = match format {
        Format::OpenAi => "upstream provider overloaded",
        Format::Anthropic => "Overloaded",
    };

    let script = Script::new(vec![
        sse(failing.clone()),
        sse(streamed_text(format, &["Hello"], Some((3, 2)))),
    ]);
    let flaky = server(format, script).await;
    let answer = ask(&settings(format, &flaky.uri(), |_| {})).await.unwrap();
    assert_eq!(
        answer.content, "Hello",
        "the failed stream's text is not kept"
    );
    assert_eq!(request_count(&flaky).await, 2);

    let broken = server(format, sse(failing)).await;
    let error = ask(&settings(format, &broken.uri(), |s| s.max_retries = 1))
        .await
        .unwrap_err();
    assert_eq!(
        error,
        LlmError::Server {
            status: expected_status,
            message: message.to_string(),
        }
    );
    assert_eq!(request_count(&broken).await, 2, "one try, one retry");
}

#[tokio::test]
async fn openai_error_inside_a_stream_is_retried() {
    error_inside_a_stream_is_retried(Format::OpenAi).await;
}

#[tokio::test]
async fn anthropic_error_event_is_retried() {
    error_inside_a_stream_is_retried(Format::Anthropic).await;
}

/// An empty 200 body, whole or streamed, is the server failing: retried, then a server
/// error.
async fn empty_200_is_retried_then_a_server_error(format: Format) {
    for stream in [false, true] {
        let server = server(format, ResponseTemplate::new(200)).await;
        let settings = settings(format, &server.uri(), |s| {
            s.stream = stream;
            s.max_retries = 2;
        });
        let error = ask(&settings).await.unwrap_err();
        assert!(
            matches!(error, LlmError::Server { status: 200, .. }),
            "stream {stream}: {error:?}"
        );
        assert!(error.is_retryable());
        assert_eq!(
            request_count(&server).await,
            3,
            "stream {stream}: one try, two retries"
        );
    }
}

#[tokio::test]
async fn openai_empty_200_body_is_retried_then_a_server_error() {
    empty_200_is_retried_then_a_server_error(Format::OpenAi).await;
}

#[tokio::test]
async fn anthropic_empty_200_body_is_retried_then_a_server_error() {
    empty_200_is_retried_then_a_server_error(Format::Anthropic).await;
}

/// A stream that arrives in awkward pieces: `data:` lines split across TCP reads (and HTTP
/// chunks), multi-byte UTF-8 characters (`日`, `本`, `é`) split between two pieces, an event's
/// blank line split from it. The answer is whole and exact.
async fn split_reads_and_split_characters_are_reassembled(format: Format, framing: Framing) {
    let body = streamed_text(format, &["Hello, 日本", " café!"], Some((6, 5)));
    let mut cuts = vec![3, offset(&body, "\n\n") + 1, body.len() - 4];
    cuts.push(offset(&body, "日") + 1);
    cuts.push(offset(&body, "本") + 2);
    cuts.push(offset(&body, "é") + 1);
    // A cut inside every JSON object, too.
    let mut from = 0;
    while let Some(at) = body[from..].find("data: {") {
        cuts.push(from + at + 9);
        from += at + 1;
    }
    let pieces = cut(body.as_bytes(), &cuts);
    assert!(pieces.len() > 8, "{} pieces", pieces.len());
    assert!(
        pieces.iter().any(|p| std::str::from_utf8(p).is_err()),
        "some piece ends inside a character"
    );
    let (uri, requests) = raw_server(Dribble {
        framing,
        pieces,
        stall: false,
    })
    .await;
    let answer = ask(&settings(format, &uri, |_| {})).await.unwrap();
    assert_eq!(answer.content, "Hello, 日本 café!");
    assert_eq!((answer.usage.tokens_in, answer.usage.tokens_out), (6, 5));
    assert_eq!(answer.finish, FinishReason::Stop);
    assert_eq!(requests.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn openai_split_reads_and_split_characters_are_reassembled() {
    split_reads_and_split_characters_are_reassembled(Format::OpenAi, Framing::Chunked).await;
}

#[tokio::test]
async fn anthropic_split_reads_and_split_characters_are_reassembled() {
    split_reads_and_split_characters_are_reassembled(Format::Anthropic, Framing::ContentLength)
        .await;
}

// ---------------------------------------------------------------------------------------------
// 6. Retries and the shared pause
// ---------------------------------------------------------------------------------------------

/// A 429 with `Retry-After: 1`, then a 500, then an answer: the answer arrives after three
/// requests, the second at least a second after the first (the server's wait, not the
/// 10–50 ms backoff).
async fn rate_limit_then_server_error_then_success(format: Format) {
    let script = Script::new(vec![
        ResponseTemplate::new(429)
            .insert_header("retry-after", "1")
            .set_body_json(error_body(format, "rate_limit_error", "slow down")),
        ResponseTemplate::new(500).set_body_raw("upstream hiccup".as_bytes(), "text/plain"),
        sse(streamed_text(format, &["finally"], Some((1, 1)))),
    ]);
    let server = server(format, script.clone()).await;
    let started = Instant::now();
    let answer = ask(&settings(format, &server.uri(), |s| s.max_retries = 3))
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(answer.content, "finally");
    let arrivals = script.arrivals();
    assert_eq!(arrivals.len(), 3);
    assert!(
        arrivals[1] - arrivals[0] >= Duration::from_millis(990),
        "the retry came {:?} after the 429",
        arrivals[1] - arrivals[0]
    );
    assert!(elapsed >= Duration::from_millis(990), "{elapsed:?}");
}

#[tokio::test]
async fn openai_429_then_500_then_success_honours_retry_after() {
    rate_limit_then_server_error_then_success(Format::OpenAi).await;
}

#[tokio::test]
async fn anthropic_429_then_500_then_success_honours_retry_after() {
    rate_limit_then_server_error_then_success(Format::Anthropic).await;
}

/// A 429 pauses the endpoint for every caller: two runs share the registry; the first's
/// call gets a 429 with `Retry-After: 1`; the second run's call, made during that pause,
/// does not reach the server before the pause ends.
#[tokio::test]
async fn a_429_pauses_the_endpoint_for_every_run() {
    let format = Format::OpenAi;
    let script = Script::new(vec![
        ResponseTemplate::new(429)
            .insert_header("retry-after", "1")
            .set_body_json(error_body(format, "rate_limit_error", "slow down")),
        ResponseTemplate::new(200).set_body_json(whole_text(format, "ok", (1, 1))),
    ]);
    let server = server(format, script.clone()).await;
    let settings = settings(format, &server.uri(), |s| s.stream = false);
    let spec = settings.providers["p"].clone();
    let registry = ProviderRegistry::new().unwrap();
    let (run_a, run_b) = (
        registry.llm_for(&settings, None),
        registry.llm_for(&settings, None),
    );

    let a = tokio::spawn(run_a.complete(hi(), LlmCall::default()));
    // Until the client has seen the 429 and paused the endpoint.
    let paused = flotilla_actors::testing::within(flotilla_actors::testing::PATIENCE, || async {
        registry.endpoint("p", &spec).paused_until()
    })
    .await;
    let paused_until = paused.expect("the 429 paused the endpoint");
    let b_started = Instant::now();
    assert!(
        b_started < paused_until,
        "the second call starts inside the pause"
    );
    let b = run_b.complete(hi(), LlmCall::default()).await.unwrap();
    let a = a.await.unwrap().unwrap();
    assert_eq!((a.content.as_str(), b.content.as_str()), ("ok", "ok"));

    let arrivals = script.arrivals();
    assert_eq!(arrivals.len(), 3, "the 429, then one request per run");
    for later in &arrivals[1..] {
        assert!(
            *later >= paused_until,
            "a request reached the server {:?} before the pause ended",
            paused_until - *later
        );
        assert!(*later - arrivals[0] >= Duration::from_millis(990));
    }
}

// ---------------------------------------------------------------------------------------------
// 7. Final errors
// ---------------------------------------------------------------------------------------------

/// A refusal (`status` with the provider's error body) is final: one request, no retry, the
/// server's own message in the error.
async fn refusal_is_final(format: Format, status: u16, kind: &str, message: &str) {
    let server = server(
        format,
        ResponseTemplate::new(status).set_body_json(error_body(format, kind, message)),
    )
    .await;
    let error = ask(&settings(format, &server.uri(), |s| s.max_retries = 3))
        .await
        .unwrap_err();
    assert_eq!(
        error,
        LlmError::Refused {
            status,
            message: message.to_string(),
        }
    );
    assert!(!error.is_retryable());
    assert_eq!(request_count(&server).await, 1, "a refusal is not retried");
}

#[tokio::test]
async fn openai_401_bad_key_is_refused_at_once() {
    refusal_is_final(
        Format::OpenAi,
        401,
        "invalid_request_error",
        "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.",
    )
    .await;
}

#[tokio::test]
async fn anthropic_401_bad_key_is_refused_at_once() {
    refusal_is_final(
        Format::Anthropic,
        401,
        "authentication_error",
        "invalid x-api-key",
    )
    .await;
}

#[tokio::test]
async fn openai_404_unknown_model_is_refused_at_once() {
    refusal_is_final(
        Format::OpenAi,
        404,
        "invalid_request_error",
        "The model `m` does not exist or you do not have access to it.",
    )
    .await;
}

#[tokio::test]
async fn anthropic_404_unknown_model_is_refused_at_once() {
    refusal_is_final(Format::Anthropic, 404, "not_found_error", "model: m").await;
}

// ---------------------------------------------------------------------------------------------
// 8. Stalls and cancellation
// ---------------------------------------------------------------------------------------------

/// A stream that sends its headers and one chunk, then nothing, is cut at the stall timeout
/// (1 s), well before the request timeout (30 s).
async fn stalled_stream_is_cut(format: Format) {
    let first = match format {
        Format::OpenAi => format!("data: {}\n\n", oa_chunk(json!({ "content": "Hel" }), None)),
        Format::Anthropic => an_sse(&[an_message_start(Some((1, 1)))]),
    };
    let (uri, requests) = raw_server(Dribble {
        framing: Framing::Chunked,
        pieces: vec![first.into_bytes()],
        stall: true,
    })
    .await;
    let started = Instant::now();
    let error = ask(&settings(format, &uri, |s| s.max_retries = 0))
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    assert_eq!(error, LlmError::Stalled { after_ms: 1000 });
    assert!(error.is_retryable());
    assert!(elapsed >= Duration::from_secs(1), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    assert_eq!(requests.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn openai_stalled_stream_is_cut_at_the_stall_timeout() {
    stalled_stream_is_cut(Format::OpenAi).await;
}

#[tokio::test]
async fn anthropic_stalled_stream_is_cut_at_the_stall_timeout() {
    stalled_stream_is_cut(Format::Anthropic).await;
}

/// Cancelling a call's token while the server holds its answer (10 s) ends the call at
/// once with `Cancelled`.
async fn cancelled_call_returns_promptly(format: Format) {
    let server = server(
        format,
        sse(streamed_text(format, &["too late"], Some((1, 1)))).set_delay(Duration::from_secs(10)),
    )
    .await;
    let settings = settings(format, &server.uri(), |_| {});
    let registry = ProviderRegistry::new().unwrap();
    let llm = registry.llm_for(&settings, None);
    let token = CancellationToken::new();
    let canceller = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        canceller.cancel();
    });
    let started = Instant::now();
    let error = llm.complete(hi(), LlmCall::new(token)).await.unwrap_err();
    let elapsed = started.elapsed();
    assert_eq!(error, LlmError::Cancelled);
    assert!(!error.is_retryable());
    assert!(elapsed >= Duration::from_millis(200), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    assert_eq!(
        request_count(&server).await,
        1,
        "the call was cut mid-exchange"
    );
}

#[tokio::test]
async fn openai_cancelled_call_returns_promptly() {
    cancelled_call_returns_promptly(Format::OpenAi).await;
}

#[tokio::test]
async fn anthropic_cancelled_call_returns_promptly() {
    cancelled_call_returns_promptly(Format::Anthropic).await;
}

// ---------------------------------------------------------------------------------------------
// 9. Keys
// ---------------------------------------------------------------------------------------------

/// The key goes in the format's header (OpenAI `Authorization: Bearer`, Anthropic
/// `x-api-key`) and nowhere else: not in the answer, not in an error.
async fn key_goes_in_the_header_only(format: Format, variable: &str) {
    let key = format!("sk-test-{}-{variable}", std::process::id()).to_ascii_lowercase();
    set_test_key(variable, &key);
    let script = Script::new(vec![
        sse(streamed_text(format, &["hello"], Some((1, 1)))),
        ResponseTemplate::new(401).set_body_json(error_body(
            format,
            "authentication_error",
            "invalid key",
        )),
    ]);
    let server = server(format, script).await;
    let settings = settings(format, &server.uri(), |s| {
        s.api_key_env = Some(variable.to_string());
    });
    let registry = ProviderRegistry::new().unwrap();
    let llm = registry.llm_for(&settings, None);
    let answer = llm.complete(hi(), LlmCall::default()).await.unwrap();
    let error = llm.complete(hi(), LlmCall::default()).await.unwrap_err();
    assert!(
        matches!(error, LlmError::Refused { status: 401, .. }),
        "{error:?}"
    );
    for shown in [
        format!("{answer:?}"),
        format!("{error:?}"),
        error.to_string(),
    ] {
        assert!(!shown.contains(&key), "the key leaked into {shown}");
    }

    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2);
    for request in &requests {
        let header = |name: &str| {
            request
                .headers
                .get(name)
                .map(|v| v.to_str().unwrap().to_string())
        };
        match format {
            Format::OpenAi => {
                assert_eq!(header("authorization"), Some(format!("Bearer {key}")));
                assert_eq!(header("x-api-key"), None);
            }
            Format::Anthropic => {
                assert_eq!(header("x-api-key"), Some(key.clone()));
                assert_eq!(header("authorization"), None);
                assert_eq!(header("anthropic-version").as_deref(), Some("2023-06-01"));
            }
        }
        assert!(!request.url.as_str().contains(&key));
        assert!(!String::from_utf8_lossy(&request.body).contains(&key));
    }
}

#[tokio::test]
async fn openai_key_goes_in_the_bearer_header_only() {
    key_goes_in_the_header_only(Format::OpenAi, "FLOTILLA_TEST_PROVIDERS_OPENAI_KEY").await;
}

#[tokio::test]
async fn anthropic_key_goes_in_the_x_api_key_header_only() {
    key_goes_in_the_header_only(Format::Anthropic, "FLOTILLA_TEST_PROVIDERS_ANTHROPIC_KEY").await;
}

/// A key variable that is not set: `MissingKey` naming it, final, and nothing is sent.
async fn missing_key_sends_nothing(format: Format, variable: &str) {
    assert!(
        std::env::var_os(variable).is_none(),
        "{variable} must not be set"
    );
    let server = server(format, sse(streamed_text(format, &["hello"], Some((1, 1))))).await;
    let settings = settings(format, &server.uri(), |s| {
        s.api_key_env = Some(variable.to_string());
    });
    let error = ask(&settings).await.unwrap_err();
    assert_eq!(
        error,
        LlmError::MissingKey {
            env: variable.to_string()
        }
    );
    assert!(!error.is_retryable());
    assert_eq!(request_count(&server).await, 0);
}

#[tokio::test]
async fn openai_missing_key_sends_nothing() {
    missing_key_sends_nothing(Format::OpenAi, "FLOTILLA_TEST_PROVIDERS_UNSET_OPENAI_KEY").await;
}

#[tokio::test]
async fn anthropic_missing_key_sends_nothing() {
    missing_key_sends_nothing(
        Format::Anthropic,
        "FLOTILLA_TEST_PROVIDERS_UNSET_ANTHROPIC_KEY",
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// 10–12. Failover, pricing, the concurrency cap
// ---------------------------------------------------------------------------------------------

/// A role with two models: the first endpoint refuses (401), the second answers, and the
/// answer says it came from the second.
#[tokio::test]
async fn failover_goes_to_the_next_model_after_a_refusal() {
    let bad = server(
        Format::OpenAi,
        ResponseTemplate::new(401).set_body_json(error_body(
            Format::OpenAi,
            "invalid_request_error",
            "Incorrect API key provided.",
        )),
    )
    .await;
    let good = server(
        Format::Anthropic,
        sse(streamed_text(
            Format::Anthropic,
            &["from the second"],
            Some((2, 3)),
        )),
    )
    .await;
    let settings = settings_with(
        vec![
            ("bad", fast_spec(Format::OpenAi, &bad.uri())),
            ("good", fast_spec(Format::Anthropic, &good.uri())),
        ],
        &["bad/m1", "good/m2"],
    );
    let answer = ask(&settings).await.unwrap();
    assert_eq!(answer.content, "from the second");
    assert_eq!(answer.model, "good/m2");
    assert_eq!(request_count(&bad).await, 1, "a refusal is not retried");
    assert_eq!(request_count(&good).await, 1);
    assert_eq!(bodies(&good).await[0]["model"], "m2");
}

/// `[prices."p/m"] input = 3.0, output = 15.0` (USD per million tokens) and a usage of
/// 1000 in, 100 out: 3000 + 1500 micro-dollars.
#[tokio::test]
async fn usage_is_priced_from_the_price_table() {
    for format in [Format::OpenAi, Format::Anthropic] {
        let server = server(
            format,
            sse(streamed_text(format, &["priced"], Some((1000, 100)))),
        )
        .await;
        let mut settings = settings(format, &server.uri(), |_| {});
        settings.prices.insert(
            "p/m".into(),
            Price {
                input: 3.0,
                output: 15.0,
            },
        );
        settings.validate().unwrap();
        let answer = ask(&settings).await.unwrap();
        assert_eq!(
            (answer.usage.tokens_in, answer.usage.tokens_out),
            (1000, 100)
        );
        assert!(!answer.usage_approximate);
        assert_eq!(answer.usage.cost_usd.micros(), 3000 + 1500, "{format:?}");
    }
}

/// `max_concurrency = 1`, shared by two runs of one registry: two calls at once against a
/// server that takes 300 ms each; the server never has two in flight (the second arrives
/// only after the first was answered).
#[tokio::test]
async fn concurrency_cap_holds_across_runs() {
    let format = Format::OpenAi;
    let script = Script::new(vec![
        ResponseTemplate::new(200)
            .set_body_json(whole_text(format, "slow", (1, 1)))
            .set_delay(Duration::from_millis(300)),
    ]);
    let server = server(format, script.clone()).await;
    let settings = settings(format, &server.uri(), |s| {
        s.stream = false;
        s.max_concurrency = 1;
    });
    let registry = ProviderRegistry::new().unwrap();
    let (run_a, run_b) = (
        registry.llm_for(&settings, None),
        registry.llm_for(&settings, None),
    );
    let (a, b) = tokio::join!(
        run_a.complete(hi(), LlmCall::default()),
        run_b.complete(hi(), LlmCall::default()),
    );
    assert_eq!(a.unwrap().content, "slow");
    assert_eq!(b.unwrap().content, "slow");
    let arrivals = script.arrivals();
    assert_eq!(arrivals.len(), 2);
    let gap = arrivals[1] - arrivals[0];
    assert!(
        gap >= Duration::from_millis(300),
        "the second request arrived {gap:?} after the first, while it was in flight"
    );
}

/// A server that refuses a schema in `response_format` (400 naming it) but takes plain JSON
/// mode, as OpenAI does with the llama.cpp form.
struct RefusesSchemas {
    answer: ResponseTemplate,
}

impl Respond for RefusesSchemas {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: Value = request.body_json().unwrap_or_default();
        if body["response_format"].get("schema").is_some() {
            ResponseTemplate::new(400).set_body_json(error_body(
                Format::OpenAi,
                "invalid_request_error",
                "Unrecognized request argument supplied: response_format.schema",
            ))
        } else {
            self.answer.clone()
        }
    }
}

/// A JSON request with a schema asks for it (`{"type": "json_object", "schema": …}`, which
/// the llama.cpp family constrains its output to); a server that refuses the schema is
/// asked again at once with plain JSON mode, and the endpoint does not send the schema
/// again. One step down, not two: JSON mode itself stays.
#[tokio::test]
async fn a_refused_schema_steps_down_to_plain_json_mode_not_to_none() {
    let answer = ResponseTemplate::new(200).set_body_json(whole_text(
        Format::OpenAi,
        "{\"tasks\": []}",
        (5, 4),
    ));
    let server = server(Format::OpenAi, RefusesSchemas { answer }).await;
    let settings = settings(Format::OpenAi, &server.uri(), |s| {
        s.stream = false;
        s.max_retries = 0;
    });
    let schema = json!({"type": "object", "required": ["tasks"]});
    let registry = ProviderRegistry::new().unwrap();
    for _ in 0..2 {
        let answer = registry
            .llm_for(&settings, None)
            .complete(hi().json_schema(schema.clone()), LlmCall::default())
            .await
            .unwrap();
        assert_eq!(answer.content, "{\"tasks\": []}");
    }
    let sent = bodies(&server).await;
    assert_eq!(sent.len(), 3, "refused, asked again, later call: {sent:?}");
    assert_eq!(
        sent[0]["response_format"],
        json!({ "type": "json_object", "schema": schema })
    );
    assert_eq!(sent[1]["response_format"], json!({ "type": "json_object" }));
    assert_eq!(sent[2]["response_format"], json!({ "type": "json_object" }));
}

/// Answers each planner call with the next of `answers` (then the last again), as whole
/// OpenAI chat completions.
struct PlannerAnswers(std::sync::Mutex<std::collections::VecDeque<String>>);

impl Respond for PlannerAnswers {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        let mut answers = self.0.lock().unwrap();
        let next = if answers.len() > 1 {
            answers.pop_front().unwrap()
        } else {
            answers.front().cloned().unwrap()
        };
        ResponseTemplate::new(200).set_body_json(whole_text(Format::OpenAi, &next, (10, 10)))
    }
}

/// The root planner on a real provider whose model answers badly: a fenced answer is used;
/// a truncated one, one of the wrong types and a 5 MB one are each recorded as unusable with
/// a clear reason, backed off and counted, until the planner gives up; nothing panics.
#[actix::test]
async fn the_planner_survives_what_a_real_model_answers() {
    use actix::Actor;
    use flotilla_actors::actors::{Planner, PlannerConfig};
    use flotilla_actors::protocol::{RunId, ToPlanner, ToTaskGraph};

    let answers = [
        "Here is the plan:\n```json\n{\"scratchpad\": \"s\", \"tasks\": [{\"description\": \"d\", \"scope\": [\"a.rs\"], \"acceptance\": \"x\"}]}\n```".to_string(),
        "{\"scratchpad\": \"s\", \"tasks\": [{\"description\": \"d\", \"sco".to_string(),
        "{\"scratchpad\": 5, \"tasks\": {\"description\": [1, 2]}}".to_string(),
        format!("{{\"scratchpad\": \"{}\", \"tasks\": []}}", "x".repeat(5 * 1024 * 1024)),
    ];
    let server = server(
        Format::OpenAi,
        PlannerAnswers(std::sync::Mutex::new(answers.into())),
    )
    .await;
    let settings = settings(Format::OpenAi, &server.uri(), |s| {
        s.stream = false;
        s.max_retries = 0;
    });
    let llm = Arc::new(ProviderRegistry::new().unwrap().llm_for(&settings, None));
    let (graph, mut inbox) = crate::harness::probe::<ToTaskGraph>("task graph");
    let config = PlannerConfig {
        backoff_base_ms: 10,
        backoff_max_ms: 20,
        max_consecutive_errors: 3,
        ..PlannerConfig::default()
    };
    let planner = Planner::new(
        RunId::generate(),
        "r".into(),
        "S".into(),
        llm,
        graph,
        config,
    )
    .start();
    planner.do_send(ToPlanner::Start);
    let mut outcomes = Vec::new();
    let gave_up = loop {
        match inbox.expect().await {
            ToTaskGraph::PlannerAnswered(answer) => {
                let fenced_ok = answer.tasks.as_ref().is_ok_and(|t| t.len() == 1);
                outcomes.push(answer.tasks.map(|_| ()));
                if fenced_ok {
                    planner.do_send(ToPlanner::BatchAccepted { ready: 0 });
                    planner.do_send(ToPlanner::Quiescent);
                }
            }
            ToTaskGraph::PlannerGaveUp { error } => break error,
            _ => {}
        }
    };
    assert_eq!(outcomes.len(), 4, "{outcomes:?}");
    assert!(outcomes[0].is_ok(), "the fenced answer is used");
    let errors: Vec<String> = outcomes[1..]
        .iter()
        .map(|o| o.clone().unwrap_err())
        .collect();
    assert!(
        errors[0].contains("no JSON object"),
        "truncated: {}",
        errors[0]
    );
    assert!(
        errors[1].contains("not valid"),
        "wrong types: {}",
        errors[1]
    );
    assert!(errors[2].contains("at most"), "5 MB: {}", errors[2]);
    assert!(
        gave_up.contains("3 consecutive planner errors"),
        "{gave_up}"
    );
}

/// A planner wired to `llm` and a probe graph, with fast backoff; returns the probe's inbox.
fn planner_on(
    llm: Arc<dyn flotilla_actors::ports::Llm>,
    request: String,
    config: flotilla_actors::actors::PlannerConfig,
) -> (
    actix::Addr<flotilla_actors::actors::Planner>,
    crate::harness::Inbox<flotilla_actors::protocol::ToTaskGraph>,
) {
    use actix::Actor;
    use flotilla_actors::actors::Planner;
    use flotilla_actors::protocol::{RunId, ToPlanner, ToTaskGraph};
    let (graph, inbox) = crate::harness::probe::<ToTaskGraph>("task graph");
    let planner = Planner::new(RunId::generate(), request, "S".into(), llm, graph, config).start();
    planner.do_send(ToPlanner::Start);
    (planner, inbox)
}

/// ADR-030, the hostile case of issue 22: a provider whose every answer is 5 MiB of junk
/// drove each request past the sum of all earlier answers (88 MB by the tenth call), since
/// unusable answers were kept and sent again whole. Now each is an excerpt with its reason,
/// in the request and in what the journal records, and the largest request stays under a
/// fixed size however many answers came before.
#[actix::test]
async fn hostile_answers_do_not_grow_the_planners_requests() {
    use flotilla_actors::actors::PlannerConfig;
    use flotilla_actors::protocol::ToTaskGraph;

    let junk = "x".repeat(5 * 1024 * 1024);
    let server = server(
        Format::OpenAi,
        PlannerAnswers(std::sync::Mutex::new([junk].into())),
    )
    .await;
    let settings = settings(Format::OpenAi, &server.uri(), |s| {
        s.stream = false;
        s.max_retries = 0;
    });
    let llm = Arc::new(ProviderRegistry::new().unwrap().llm_for(&settings, None));
    let config = PlannerConfig {
        backoff_base_ms: 1,
        backoff_max_ms: 2,
        max_consecutive_errors: 10,
        ..PlannerConfig::default()
    };
    let (_planner, mut inbox) = planner_on(llm, "r".into(), config);
    let mut recorded = Vec::new();
    let gave_up = loop {
        match inbox.expect().await {
            ToTaskGraph::PlannerAnswered(answer) => recorded.push(answer.content.len()),
            ToTaskGraph::PlannerGaveUp { error } => break error,
            _ => {}
        }
    };
    assert!(
        gave_up.contains("10 consecutive planner errors"),
        "{gave_up}"
    );
    assert_eq!(recorded.len(), 10);
    assert!(
        recorded.iter().all(|&n| n <= 2 * 1024),
        "the journal records excerpts: {recorded:?}"
    );
    let sizes: Vec<usize> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| r.body.len())
        .collect();
    let largest = *sizes.iter().max().unwrap();
    eprintln!("request sizes against 5 MiB junk answers: {sizes:?}");
    assert_eq!(sizes.len(), 10);
    assert!(largest <= 32 * 1024, "largest request {largest} bytes");
}

/// Answers like llama.cpp's server with a context of `limit` bytes: a request body larger
/// than that is refused with its 400 `exceed_context_size_error`; others get one task.
struct SmallContext {
    limit: usize,
}

impl Respond for SmallContext {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        if request.body.len() > self.limit {
            return ResponseTemplate::new(400).set_body_json(json!({
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size, try increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": request.body.len() / 4,
                    "n_ctx": self.limit / 4,
                }
            }));
        }
        let answer = "{\"scratchpad\": \"s\", \"tasks\": [{\"description\": \"d\", \"scope\": [\"a.rs\"], \"acceptance\": \"x\"}]}";
        ResponseTemplate::new(200).set_body_json(whole_text(Format::OpenAi, answer, (10, 10)))
    }
}

/// ADR-030: "prompt too long" used to end planning at once. Now the planner compacts (halves
/// what a request may carry, cutting its largest parts to excerpts) and asks again at once,
/// until the request fits: the run goes on, and nothing counts as an error.
#[actix::test]
async fn a_context_length_refusal_compacts_the_request_and_asks_again() {
    use flotilla_actors::actors::PlannerConfig;
    use flotilla_actors::protocol::ToTaskGraph;

    let server = server(Format::OpenAi, SmallContext { limit: 30_000 }).await;
    let settings = settings(Format::OpenAi, &server.uri(), |s| {
        s.stream = false;
        s.max_retries = 0;
    });
    let llm = Arc::new(ProviderRegistry::new().unwrap().llm_for(&settings, None));
    // The request alone (a long specification) is larger than the server's context.
    let request = format!("build this: {}", "spec ".repeat(12_000));
    let (_planner, mut inbox) = planner_on(llm, request, PlannerConfig::default());
    let answer = loop {
        match inbox.expect().await {
            ToTaskGraph::PlannerAnswered(answer) => break answer,
            ToTaskGraph::PlannerGaveUp { error } => panic!("gave up: {error}"),
            _ => {}
        }
    };
    assert_eq!(answer.call, 0);
    assert_eq!(answer.tasks.as_ref().map(Vec::len), Ok(1));
    assert!(
        answer.prompt.contains("bytes omitted"),
        "the prompt as sent (and journaled) was cut"
    );
    let sizes: Vec<usize> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| r.body.len())
        .collect();
    assert!(sizes.len() >= 2, "{sizes:?}");
    assert!(
        sizes[..sizes.len() - 1].iter().all(|&n| n > 30_000),
        "{sizes:?}"
    );
    assert!(*sizes.last().unwrap() <= 30_000, "{sizes:?}");
    assert!(
        sizes.windows(2).all(|w| w[1] < w[0]),
        "each try is smaller: {sizes:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Hostile and half-broken servers (issue 20, M8c)
// ---------------------------------------------------------------------------------------------

/// Issue 20: a stream cut off before its end marker (OpenAI's `[DONE]` or finish reason,
/// Anthropic's `message_stop`) was taken as a complete answer. It is retried.
#[tokio::test]
async fn a_stream_cut_off_before_its_end_marker_is_retried_not_taken() {
    let openai_cut: String = [
        oa_chunk(json!({ "role": "assistant", "content": "" }), None),
        oa_chunk(json!({ "content": "the first half" }), None),
    ]
    .iter()
    .map(|c| format!("data: {c}\n\n"))
    .collect();
    let anthropic_cut = an_sse(&[
        an_message_start(Some((5, 1))),
        json!({ "type": "content_block_start", "index": 0, "content_block": { "type": "text", "text": "" } }),
        an_text_delta(0, "the first half"),
        json!({ "type": "content_block_stop", "index": 0 }),
        an_message_delta("end_turn", Some(7)),
    ]);
    for (format, cut) in [
        (Format::OpenAi, openai_cut),
        (Format::Anthropic, anthropic_cut),
    ] {
        let whole = streamed_text(format, &["the whole answer"], Some((5, 7)));
        let retried = server(format, Script::new(vec![sse(cut.clone()), sse(whole)])).await;
        let answer = ask(&settings(format, &retried.uri(), |_| {}))
            .await
            .unwrap();
        assert_eq!(answer.content, "the whole answer", "{format:?}");
        assert_eq!(request_count(&retried).await, 2, "{format:?}");

        // Always cut off: the call fails, saying why, after its retries.
        let always = server(format, sse(cut)).await;
        let error = ask(&settings(format, &always.uri(), |_| {}))
            .await
            .unwrap_err();
        assert!(
            error.to_string().contains("ended before its end marker"),
            "{format:?}: {error}"
        );
        assert_eq!(request_count(&always).await, 3, "{format:?}: two retries");
    }
    // An OpenAI-compatible stream that ends with its finish reason but no `[DONE]` is whole.
    let body: String = [
        oa_chunk(json!({ "content": "done" }), None),
        oa_chunk(json!({}), Some("stop")),
    ]
    .iter()
    .map(|c| format!("data: {c}\n\n"))
    .collect();
    let no_done = server(Format::OpenAi, sse(body)).await;
    let answer = ask(&settings(Format::OpenAi, &no_done.uri(), |_| {}))
        .await
        .unwrap();
    assert_eq!(answer.content, "done");
    assert_eq!(request_count(&no_done).await, 1);
}

/// Issue 20: a whole JSON answer that starts with a UTF-8 byte-order mark was refused as
/// malformed.
#[tokio::test]
async fn a_whole_answer_starting_with_a_byte_order_mark_is_read() {
    for format in [Format::OpenAi, Format::Anthropic] {
        let body = format!("\u{feff}{}", whole_text(format, "hello", (3, 1)));
        let server = server(format, raw_json(body)).await;
        let answer = ask(&settings(format, &server.uri(), |s| s.stream = false))
            .await
            .unwrap();
        assert_eq!(answer.content, "hello", "{format:?}");
    }
}

/// A streamed request with tools, as the built-in agent sends them.
fn tool_request() -> LlmRequest {
    hi().with_tools(vec![read_file_tool()])
}

/// Answers a streamed request as `streamed` and a whole one with a tool call, counting
/// each kind.
#[derive(Clone)]
struct StreamRefuser {
    streamed: ResponseTemplate,
    streamed_seen: Arc<AtomicUsize>,
    whole_seen: Arc<AtomicUsize>,
}

impl Respond for StreamRefuser {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: Value = request.body_json().unwrap();
        if body["stream"] == json!(true) {
            self.streamed_seen.fetch_add(1, Ordering::SeqCst);
            return self.streamed.clone();
        }
        self.whole_seen.fetch_add(1, Ordering::SeqCst);
        ResponseTemplate::new(200).set_body_json(json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "m",
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": null,
                    "tool_calls": [{
                        "id": "call_1",
                        "type": "function",
                        "function": { "name": "read_file", "arguments": "{\"path\": \"a\"}" },
                    }],
                },
                "finish_reason": "tool_calls",
            }],
            "usage": { "prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13 },
        }))
    }
}

/// M8c item 3: llama-cpp-python answers a streamed request with `tool_choice: "auto"` with
/// 200 and then fails inside the stream ("Automatic streaming tool choice is not
/// supported"), or sends a stream with neither text nor a tool call. flotilla sends such
/// requests whole from then on, for that endpoint, at once (not after five tries); requests
/// without tools still stream.
#[tokio::test]
async fn a_server_that_cannot_stream_tool_calls_gets_them_asked_whole() {
    let error_event = format!(
        "data: {}\n\n",
        json!({ "error": { "message": "Automatic streaming tool choice is not supported", "type": "internal_server_error", "param": null, "code": null } })
    );
    // The stream sse-starlette leaves when the generator raises before its first chunk:
    // nothing at all; and a completion with only empty deltas.
    let empty = String::new();
    let empty_deltas = oa_sse(&[
        oa_chunk(json!({ "role": "assistant", "content": null }), None),
        oa_chunk(json!({}), Some("stop")),
    ]);
    for streamed in [error_event, empty, empty_deltas] {
        let refuser = StreamRefuser {
            streamed: sse(streamed.clone()),
            streamed_seen: Arc::default(),
            whole_seen: Arc::default(),
        };
        let server = server(Format::OpenAi, refuser.clone()).await;
        let settings = settings(Format::OpenAi, &server.uri(), |_| {});
        let registry = ProviderRegistry::new().unwrap();
        let llm = registry.llm_for(&settings, None);
        for _ in 0..3 {
            let answer = llm
                .complete(tool_request(), LlmCall::default())
                .await
                .unwrap_or_else(|e| panic!("{streamed:?}: {e}"));
            assert_eq!(answer.tool_calls.len(), 1, "{streamed:?}");
            assert_eq!(answer.tool_calls[0].name, "read_file");
        }
        assert_eq!(
            refuser.streamed_seen.load(Ordering::SeqCst),
            1,
            "{streamed:?}: one streamed try, then whole for good"
        );
        assert_eq!(refuser.whole_seen.load(Ordering::SeqCst), 3, "{streamed:?}");
    }
}

/// Issue 20: a 429 with an absurd `Retry-After` (12 hours) paused the call silently for as
/// long as flotilla's old 15-minute cap allowed. The wait is capped at a minute (or the
/// provider's longer `backoff_max_ms`), and a long pause is said to whoever follows the call.
#[tokio::test]
async fn an_absurd_retry_after_is_capped_and_a_long_pause_is_said() {
    let format = Format::OpenAi;
    let script = Script::new(vec![
        ResponseTemplate::new(429)
            .insert_header("retry-after", "43200")
            .set_body_json(error_body(format, "rate_limit_error", "slow down")),
    ]);
    let server = server(format, script.clone()).await;
    let settings = settings(format, &server.uri(), |s| s.stream = false);
    let spec = settings.providers["p"].clone();
    let registry = ProviderRegistry::new().unwrap();
    let llm = registry.llm_for(&settings, None);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    let call = LlmCall::new(cancel.clone()).on_pause(move |pause| {
        let _ = tx.send(pause);
    });
    let asked = Instant::now();
    let pending = tokio::spawn(llm.complete(hi(), call));
    let pause = rx.recv().await.expect("the pause is said");
    assert_eq!(pause.provider, "p");
    assert_eq!(pause.wait_ms, 60_000, "capped at a minute");
    let until = registry
        .endpoint("p", &spec)
        .paused_until()
        .expect("the endpoint is paused");
    assert!(
        until <= asked + Duration::from_secs(61),
        "paused past the cap"
    );
    cancel.cancel();
    assert_eq!(pending.await.unwrap().unwrap_err(), LlmError::Cancelled);
    assert_eq!(script.arrivals().len(), 1);
}
