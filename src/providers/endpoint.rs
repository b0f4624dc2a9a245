//! One provider endpoint, shared by every run and actor that uses it: its HTTP client, its
//! concurrency cap, its rate-limit pause, and the one retry layer.
//!
//! A call goes: wait out the endpoint's pause (a 429 paused it for everyone), take a
//! concurrency permit, make one HTTP exchange (bounded in time, bytes and stalls), and on a
//! failure another try may fix (429, 5xx, transport, timeout, stall, an empty body) wait
//! (exponential backoff with jitter, at least what `Retry-After` asked) and try again, at
//! most `max_retries` times. Refusals (other 4xx) are final at once. Cancelling the call's
//! token drops the HTTP request wherever it is.
//!
//! The shared state is `EndpointState`; JSON mode steps down when a server refuses it; size
//! caps bound every answer.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use flotilla_actors::ports::{
    AnswerFormat, LlmCall, LlmError, LlmPause, LlmProgress, LlmRequest, approximate_tokens,
};
use futures::StreamExt;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::settings::{ProviderKind, ProviderSpec};
use super::wire::{JsonMode, Outgoing, WireFormat, error_message, mentions_context_length};
use super::{Parsed, anthropic, openai};
use crate::keys::{Keys, Secret};
use crate::sse::{self, SseError};

/// The longest a provider's `Retry-After` is honoured for, unless the provider's own
/// `backoff_max_ms` is longer: untrusted input, which once held a call back for 15 minutes
/// (and could have for 12 hours) saying nothing (issue 20).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// A rate-limit pause this long or longer is said (a `provider_paused` notice).
pub const LONG_PAUSE: Duration = Duration::from_secs(10);
/// The most bytes of an answer (a body, or a stream's text and tool arguments together).
pub const MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;
/// What every run using one endpoint (same kind, URL and key variable) shares: its rate
/// limit pause, its concurrency cap, what it was found to support.
pub struct EndpointState {
    permits: Semaphore,
    /// Permits the semaphore is meant to hold (the latest configured `max_concurrency`).
    capacity: Mutex<usize>,
    /// No request is sent before this instant: a 429 paused the endpoint for every caller.
    paused_until: Mutex<Option<Instant>>,
    /// The most JSON output mode the server accepts (a [`JsonMode`]); lowered for good each
    /// time it refuses one.
    json_mode: AtomicU8,
    /// The server was found not to stream answers to requests with tools (llama-cpp-python:
    /// "Automatic streaming tool choice is not supported"): such requests are sent whole.
    no_streamed_tools: AtomicBool,
}

impl EndpointState {
    pub fn new(spec: &ProviderSpec) -> Self {
        let capacity = spec.max_concurrency.max(1);
        EndpointState {
            permits: Semaphore::new(capacity),
            capacity: Mutex::new(capacity),
            paused_until: Mutex::new(None),
            json_mode: AtomicU8::new(JsonMode::Schema as u8),
            no_streamed_tools: AtomicBool::new(false),
        }
    }

    /// Makes the concurrency cap `capacity` (a later run's config changed it). Fewer
    /// permits take effect as calls in flight end.
    pub fn resize(self: &std::sync::Arc<Self>, capacity: usize) {
        let capacity = capacity.max(1);
        let Ok(mut current) = self.capacity.lock() else {
            return;
        };
        if capacity > *current {
            self.permits.add_permits(capacity - *current);
        } else if capacity < *current {
            let surplus = u32::try_from(*current - capacity).unwrap_or(u32::MAX);
            let state = self.clone();
            tokio::spawn(async move {
                if let Ok(permits) = state.permits.acquire_many(surplus).await {
                    permits.forget();
                }
            });
        }
        *current = capacity;
    }

    /// When the endpoint is paused until, if it is.
    pub fn paused_until(&self) -> Option<Instant> {
        self.paused_until
            .lock()
            .ok()
            .and_then(|p| *p)
            .filter(|&until| until > Instant::now())
    }

    /// Pauses the endpoint for every caller until `wait` from now (never shortens a pause).
    fn pause_for(&self, wait: Duration) {
        let until = Instant::now() + wait;
        if let Ok(mut paused) = self.paused_until.lock()
            && paused.is_none_or(|p| p < until)
        {
            *paused = Some(until);
        }
    }
}

/// An endpoint's key, as the daemon's credentials had it when the endpoint was built.
enum EndpointKey {
    /// The provider names no key variable: requests go without one.
    None,
    Held(Secret),
    /// The variable the config names, which the daemon's environment did not have: each
    /// call fails with `MissingKey`, sending nothing.
    Missing(String),
}

/// One configured endpoint, as a run sees it: its settings, and the state it shares with
/// every other run that uses the same server.
pub struct Endpoint {
    /// The provider's name in `[providers]`, for messages.
    name: String,
    format: WireFormat,
    base_url: String,
    /// The key sent with every request, taken from the daemon's credentials when the
    /// endpoint was built.
    key: EndpointKey,
    spec: ProviderSpec,
    http: reqwest::Client,
    shared: std::sync::Arc<EndpointState>,
}

/// A failed exchange: the error, and how long the server asked us to wait.
struct Failure {
    error: LlmError,
    retry_after: Option<Duration>,
    /// The server refused the JSON output mode sent: asking again with less may succeed.
    json_mode_refused: Option<JsonMode>,
    /// The server cannot stream an answer to a request with tools: asking again without
    /// streaming may succeed.
    stream_refused: bool,
}

impl From<LlmError> for Failure {
    fn from(error: LlmError) -> Self {
        Failure {
            error,
            retry_after: None,
            json_mode_refused: None,
            stream_refused: false,
        }
    }
}

impl Endpoint {
    /// An endpoint for `spec` (already validated), sharing `shared` with every other user
    /// of the same server. `http` is the daemon's client (one connection pool); `keys` the
    /// daemon's credentials, of which it takes the one `api_key_env` names.
    pub fn new(
        name: &str,
        spec: &ProviderSpec,
        http: reqwest::Client,
        shared: std::sync::Arc<EndpointState>,
        keys: &Keys,
    ) -> Self {
        let format = match spec.kind {
            ProviderKind::Anthropic => WireFormat::Anthropic,
            ProviderKind::Openai | ProviderKind::Scripted => WireFormat::OpenAi,
        };
        Endpoint {
            name: name.to_string(),
            format,
            base_url: spec
                .base_url
                .clone()
                .unwrap_or_default()
                .trim_end_matches('/')
                .to_string(),
            key: match &spec.api_key_env {
                Some(env) => keys
                    .get(env)
                    .cloned()
                    .map_or_else(|| EndpointKey::Missing(env.clone()), EndpointKey::Held),
                None => EndpointKey::None,
            },
            spec: spec.clone(),
            http,
            shared,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// When the endpoint is paused until, if it is.
    pub fn paused_until(&self) -> Option<Instant> {
        self.shared.paused_until()
    }

    /// Asks `model`, retrying what another try may fix.
    pub async fn complete(
        &self,
        model: &str,
        request: &LlmRequest,
        call: &LlmCall,
    ) -> Result<Parsed, LlmError> {
        let mut delays = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(self.spec.backoff_min_ms))
            .with_max_delay(Duration::from_millis(self.spec.backoff_max_ms))
            .with_max_times(self.spec.max_retries as usize)
            .with_jitter()
            .build();
        // The most JSON output mode this call may still ask with: lowered when the server
        // refuses one, so a call steps down at most twice.
        let mut json_cap = JsonMode::Schema;
        loop {
            let failure = match self.attempt(model, request, call, json_cap).await {
                Ok(parsed) => return Ok(parsed),
                Err(failure) => failure,
            };
            if failure.stream_refused {
                // Not a retry either: this request cannot be streamed by this server, and
                // the same request sent whole can be answered. Said once per endpoint.
                if !self.shared.no_streamed_tools.swap(true, Ordering::SeqCst) {
                    warn!(
                        endpoint = %self.name,
                        error = %failure.error,
                        "the server does not stream answers to requests with tools; sending \
                         those whole (stream = false) from now on"
                    );
                }
                continue;
            }
            if let Some(refused) = failure.json_mode_refused {
                // Not a retry: the request was wrong for this server, and now it is not.
                // Every call that was in flight with that mode gets this refusal and asks
                // again one step down, not only the one that lowers the endpoint's mode.
                json_cap = refused.below();
                let before = self
                    .shared
                    .json_mode
                    .fetch_min(json_cap as u8, Ordering::SeqCst);
                if before > json_cap as u8 {
                    warn!(endpoint = %self.name, ?refused, now = ?json_cap, "the server refuses this JSON output mode; asking with less from now on");
                }
                continue;
            }
            let cap = MAX_RETRY_AFTER.max(Duration::from_millis(self.spec.backoff_max_ms));
            let retry_after = failure.retry_after.map(|d| d.min(cap));
            if let (LlmError::RateLimited { .. }, Some(wait)) = (&failure.error, retry_after) {
                self.shared.pause_for(wait);
            }
            if !failure.error.is_retryable() {
                return Err(failure.error);
            }
            let Some(backoff) = delays.next() else {
                return Err(failure.error);
            };
            let wait = backoff.max(retry_after.unwrap_or_default());
            debug!(endpoint = %self.name, error = %failure.error, ?wait, "retrying");
            if matches!(failure.error, LlmError::RateLimited { .. }) && wait >= LONG_PAUSE {
                warn!(endpoint = %self.name, wait_secs = wait.as_secs(), "rate limited: the call waits");
                call.paused(LlmPause {
                    provider: self.name.clone(),
                    wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                });
            }
            tokio::select! {
                _ = call.cancel.cancelled() => return Err(LlmError::Cancelled),
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One exchange: waits out the pause, takes a permit, sends, reads the answer.
    async fn attempt(
        &self,
        model: &str,
        request: &LlmRequest,
        call: &LlmCall,
        json_cap: JsonMode,
    ) -> Result<Parsed, Failure> {
        // Waiting out a pause: another caller's 429 may extend it meanwhile.
        while let Some(until) = self.paused_until() {
            tokio::select! {
                _ = call.cancel.cancelled() => return Err(LlmError::Cancelled.into()),
                _ = tokio::time::sleep_until(until) => {}
            }
        }
        let _permit = tokio::select! {
            _ = call.cancel.cancelled() => return Err(LlmError::Cancelled.into()),
            permit = self.shared.permits.acquire() => permit.map_err(|_| LlmError::Cancelled)?,
        };
        let exchange = self.exchange(model, request, call, json_cap);
        tokio::select! {
            _ = call.cancel.cancelled() => Err(LlmError::Cancelled.into()),
            result = tokio::time::timeout(self.spec.request_timeout(), exchange) => {
                result.unwrap_or(Err(LlmError::Timeout.into()))
            }
        }
    }

    async fn exchange(
        &self,
        model: &str,
        request: &LlmRequest,
        call: &LlmCall,
        json_cap: JsonMode,
    ) -> Result<Parsed, Failure> {
        // The key goes into the request's header and nowhere else.
        let key = match &self.key {
            EndpointKey::Held(key) => Some(key.expose()),
            EndpointKey::None => None,
            EndpointKey::Missing(env) => {
                return Err(LlmError::MissingKey { env: env.clone() }.into());
            }
        };
        let json_mode = if request.format == AnswerFormat::JsonObject && self.spec.json_mode {
            let level = JsonMode::from_u8(self.shared.json_mode.load(Ordering::SeqCst));
            match level.min(json_cap) {
                // Without a schema to send, the most is plain JSON mode.
                JsonMode::Schema if request.schema.is_none() => JsonMode::Object,
                mode => mode,
            }
        } else {
            JsonMode::Off
        };
        let has_tools = !request.tools.is_empty();
        let stream = self.spec.stream
            && !(has_tools && self.shared.no_streamed_tools.load(Ordering::SeqCst));
        let outgoing = Outgoing {
            model,
            request,
            stream,
            json_mode,
            max_output_tokens: request.max_output_tokens.or(self.spec.max_output_tokens),
        };
        let builder = match self.format {
            WireFormat::OpenAi => openai::build(&self.http, &self.base_url, key, &outgoing),
            WireFormat::Anthropic => anthropic::build(&self.http, &self.base_url, key, &outgoing),
        };
        let response = builder
            .send()
            .await
            .map_err(|e| LlmError::Transport(transport_message(&e)))?;
        let status = response.status();
        if !status.is_success() {
            let headers = response.headers().clone();
            let body = read_bounded(response, self.spec.stall_timeout())
                .await
                .unwrap_or_default();
            return Err(failure_for(status, &headers, &body, json_mode));
        }
        // A server that ignores `stream: true` answers a whole JSON body, and says so.
        let parsed = if stream && !declares_json(response.headers()) {
            let streamed = self.read_stream(response, call).await;
            // llama-cpp-python answers 200 to a streamed request with tools and then fails
            // inside the stream: an error event, or a stream cut off (or ended) with nothing
            // in it. The same request sent whole works.
            let refused = match &streamed {
                Ok(s) => s.parsed.is_empty(),
                Err(LlmError::Server {
                    status: 200,
                    message,
                }) => message.to_ascii_lowercase().contains("stream"),
                Err(_) => false,
            };
            if has_tools && refused {
                let error = match streamed {
                    Err(error) => error,
                    Ok(_) => LlmError::Server {
                        status: status.as_u16(),
                        message: "the streamed answer holds no text and no tool call".into(),
                    },
                };
                return Err(Failure {
                    stream_refused: true,
                    ..error.into()
                });
            }
            streamed?.complete()?
        } else {
            let body = read_bounded(response, self.spec.stall_timeout()).await?;
            if body.trim().is_empty() {
                return Err(LlmError::Server {
                    status: status.as_u16(),
                    message: "the answer's body is empty".into(),
                }
                .into());
            }
            parse_whole_body(self.format, &body)?
        };
        if parsed.is_empty() {
            // Nothing at all came back: as with an empty body, the server failed.
            return Err(LlmError::Server {
                status: status.as_u16(),
                message: "the answer holds no text and no tool call".into(),
            }
            .into());
        }
        Ok(parsed)
    }

    async fn read_stream(
        &self,
        response: reqwest::Response,
        call: &LlmCall,
    ) -> Result<Streamed, LlmError> {
        let stall = self.spec.stall_timeout();
        let stall_ms = u64::try_from(stall.as_millis()).unwrap_or(u64::MAX);
        // The stall timeout counts bytes, not events: keep-alive comments keep a stream
        // alive, as they are meant to.
        let chunks =
            tokio_stream::StreamExt::timeout(response.bytes_stream(), stall).map(
                |item| match item {
                    Ok(Ok(bytes)) => Ok(bytes),
                    Ok(Err(e)) => Err(ChunkError::Transport(transport_message(&e))),
                    Err(_) => Err(ChunkError::Stalled),
                },
            );
        assemble_stream(self.format, chunks, stall_ms, call).await
    }
}

/// A streamed answer as far as it came, and whether it came to its end.
#[derive(Debug)]
struct Streamed {
    parsed: Parsed,
    /// The stream said it was done (OpenAI's `[DONE]` or a finish reason, Anthropic's
    /// `message_stop`).
    ended: bool,
}

impl Streamed {
    /// The answer, if the stream came to its end: one cut off before its end marker may
    /// lack the rest of its text or a tool call, so it is a failure to retry, never an
    /// answer.
    fn complete(self) -> Result<Parsed, LlmError> {
        // A stream that ended with nothing in it is an empty answer (the caller's
        // `Server` error), whatever marker it lacked.
        if self.ended || self.parsed.is_empty() {
            Ok(self.parsed)
        } else {
            Err(LlmError::Transport(
                "the answer's stream ended before its end marker".into(),
            ))
        }
    }
}

/// Assembles a streamed answer from its body's chunks, however they are split: SSE frames,
/// then the format's events, within [`MAX_ANSWER_BYTES`], reporting progress as it goes.
/// A chunk error ends it (a stall as [`LlmError::Stalled`] of `stall_ms`).
async fn assemble_stream<S, B>(
    format: WireFormat,
    chunks: S,
    stall_ms: u64,
    call: &LlmCall,
) -> Result<Streamed, LlmError>
where
    S: futures::Stream<Item = Result<B, ChunkError>> + Send,
    B: AsRef<[u8]> + Send,
{
    // An event that never ends counts against the answer's bound like one that does.
    let mut frames = std::pin::pin!(sse::frames(chunks, MAX_ANSWER_BYTES));
    let mut state = match format {
        WireFormat::OpenAi => StreamState::OpenAi(openai::StreamAssembler::default()),
        WireFormat::Anthropic => StreamState::Anthropic(anthropic::StreamAssembler::default()),
    };
    let mut reported = 0u64;
    let mut ended = false;
    while let Some(frame) = frames.next().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(SseError::Transport(ChunkError::Stalled)) => {
                return Err(LlmError::Stalled { after_ms: stall_ms });
            }
            Err(SseError::Transport(ChunkError::Transport(e))) => {
                return Err(LlmError::Transport(e));
            }
            Err(SseError::TooLarge { .. }) => {
                return Err(LlmError::Malformed(format!(
                    "the answer passed {MAX_ANSWER_BYTES} bytes (in an event that had not ended)"
                )));
            }
            Err(e) => return Err(LlmError::Malformed(format!("the event stream: {e}"))),
        };
        let done = match &mut state {
            StreamState::OpenAi(s) => s.push(&frame)?,
            StreamState::Anthropic(s) => s.push(&frame)?,
        };
        let so_far = match &state {
            StreamState::OpenAi(s) => s.bytes_so_far(),
            StreamState::Anthropic(s) => s.bytes_so_far(),
        };
        if so_far > MAX_ANSWER_BYTES {
            return Err(LlmError::Malformed(format!(
                "the answer passed {MAX_ANSWER_BYTES} bytes"
            )));
        }
        let tokens = (so_far as u64).div_ceil(4);
        if tokens != reported {
            reported = tokens;
            call.progress(LlmProgress { tokens_out: tokens });
        }
        if done {
            ended = true;
            break;
        }
    }
    let (parsed, ended) = match state {
        // Some OpenAI-compatible servers end with the finish reason and no `[DONE]`.
        StreamState::OpenAi(s) => {
            let finished = s.finish_reason_seen();
            (s.finish()?, ended || finished)
        }
        StreamState::Anthropic(s) => (s.finish()?, ended),
    };
    Ok(Streamed { parsed, ended })
}

/// What the endpoint makes of a streamed body that arrived as `chunks`, without the
/// network: for the fuzzer (fuzz/fuzz_targets/provider_stream.rs) and tests.
pub fn parse_stream_chunks(format: WireFormat, chunks: Vec<Vec<u8>>) -> Result<Parsed, LlmError> {
    let chunks = futures::stream::iter(chunks.into_iter().map(Ok::<_, ChunkError>));
    futures::executor::block_on(assemble_stream(format, chunks, 0, &LlmCall::default()))?.complete()
}

/// What the endpoint makes of a whole (non-streamed) body.
pub fn parse_whole_body(format: WireFormat, body: &str) -> Result<Parsed, LlmError> {
    match format {
        WireFormat::OpenAi => openai::parse_body(body),
        WireFormat::Anthropic => anthropic::parse_body(body),
    }
}

enum StreamState {
    OpenAi(openai::StreamAssembler),
    Anthropic(anthropic::StreamAssembler),
}

#[derive(Debug, thiserror::Error)]
enum ChunkError {
    #[error("{0}")]
    Transport(String),
    #[error("the stream stalled")]
    Stalled,
}

/// A transport error in words, with its causes (reqwest's own message is often just "error
/// sending request").
fn transport_message(e: &reqwest::Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// Reads a whole body, at most [`MAX_ANSWER_BYTES`], each chunk within `stall`.
async fn read_bounded(response: reqwest::Response, stall: Duration) -> Result<String, LlmError> {
    let mut body = Vec::new();
    let mut chunks = std::pin::pin!(response.bytes_stream());
    loop {
        let chunk = match tokio::time::timeout(stall, chunks.next()).await {
            Err(_) => {
                return Err(LlmError::Stalled {
                    after_ms: u64::try_from(stall.as_millis()).unwrap_or(u64::MAX),
                });
            }
            Ok(None) => break,
            Ok(Some(chunk)) => chunk.map_err(|e| LlmError::Transport(transport_message(&e)))?,
        };
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(LlmError::Malformed(format!(
                "the answer is larger than {MAX_ANSWER_BYTES} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The answer's `Content-Type` is JSON (`application/json`, `application/problem+json`, …),
/// not an event stream.
fn declares_json(headers: &HeaderMap) -> bool {
    headers
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|mime| mime.trim().to_ascii_lowercase())
        .is_some_and(|mime| mime == "application/json" || mime.ends_with("+json"))
}

/// What a non-success status means.
fn failure_for(
    status: StatusCode,
    headers: &HeaderMap,
    body: &str,
    json_mode: JsonMode,
) -> Failure {
    let message = error_message(body);
    let code = status.as_u16();
    let retry_after = retry_after(headers);
    // Servers that do not know `response_format` say so with a 400, a 422, or (llama.cpp
    // and others) a 500 with a plain-text body.
    let json_mode_refused = (json_mode != JsonMode::Off
        && (status.is_client_error() || status.is_server_error())
        && status != StatusCode::TOO_MANY_REQUESTS
        && mentions_json_mode(body))
    .then_some(json_mode);
    let error = match status {
        // Before the status classes: llama.cpp has answered a prompt past its context
        // with a 500 as well as a 400, and a 413 is a body too large for the server.
        s if s != StatusCode::TOO_MANY_REQUESTS
            && (s == StatusCode::PAYLOAD_TOO_LARGE || mentions_context_length(body)) =>
        {
            LlmError::ContextTooLong {
                status: code,
                message,
            }
        }
        StatusCode::TOO_MANY_REQUESTS => LlmError::RateLimited {
            retry_after_ms: retry_after
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        },
        StatusCode::REQUEST_TIMEOUT => LlmError::Timeout,
        // 529: Anthropic's "overloaded".
        s if s.is_server_error() || code == 529 => LlmError::Server {
            status: code,
            message,
        },
        _ => LlmError::Refused {
            status: code,
            message,
        },
    };
    Failure {
        error,
        retry_after,
        json_mode_refused,
        stream_refused: false,
    }
}

fn mentions_json_mode(body: &str) -> bool {
    let lower = body.to_ascii_lowercase();
    ["response_format", "json_object", "json mode", "grammar"]
        .iter()
        .any(|needle| lower.contains(needle))
}

/// `retry-after-ms` (OpenAI), else `retry-after` in seconds (fractions allowed). The
/// HTTP-date form counts as none: the backoff applies.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let header = |name: &str| headers.get(name)?.to_str().ok().map(str::trim);
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return seconds(ms / 1000.0);
    }
    header("retry-after")
        .and_then(|v| v.parse::<f64>().ok())
        .and_then(seconds)
}

fn seconds(value: f64) -> Option<Duration> {
    // Bounded here only so that the conversion cannot overflow; the wait is capped where it
    // is used (`MAX_RETRY_AFTER`, or the provider's longer `backoff_max_ms`).
    (value.is_finite() && value >= 0.0)
        .then(|| Duration::from_secs_f64(value.min(MAX_HEADER_WAIT.as_secs_f64())))
}

/// The most a `Retry-After` header is read as (a day), before any cap applies.
const MAX_HEADER_WAIT: Duration = Duration::from_secs(24 * 3600);

/// A prompt's size in estimated tokens, when a provider reports no usage.
pub fn approximate_prompt_tokens(request: &LlmRequest) -> u64 {
    let messages: u64 = request
        .messages
        .iter()
        .map(|m| {
            approximate_tokens(&m.content)
                + m.tool_calls
                    .iter()
                    .map(|c| approximate_tokens(&c.arguments) + approximate_tokens(&c.name))
                    .sum::<u64>()
        })
        .fold(0u64, u64::saturating_add);
    let tools: u64 = request
        .tools
        .iter()
        .map(|t| approximate_tokens(&t.description) + approximate_tokens(&t.parameters.to_string()))
        .fold(0u64, u64::saturating_add);
    messages.saturating_add(tools)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_bodies_are_told_from_event_streams() {
        let with = |content_type: &str| {
            let mut h = HeaderMap::new();
            h.insert(reqwest::header::CONTENT_TYPE, content_type.parse().unwrap());
            declares_json(&h)
        };
        assert!(with("application/json"));
        assert!(with("Application/JSON; charset=utf-8"));
        assert!(with("application/problem+json"));
        assert!(!with("text/event-stream"));
        assert!(!with("text/event-stream; charset=utf-8"));
        assert!(!with("text/plain"));
        assert!(!declares_json(&HeaderMap::new()));
    }

    /// ADR-030: each server's way of saying a prompt is past the model's context is a typed
    /// `ContextTooLong`, whatever the status; other refusals stay `Refused`.
    #[test]
    fn context_length_refusals_are_told_from_other_refusals() {
        let classify = |status: u16, body: &str| {
            failure_for(
                StatusCode::from_u16(status).unwrap(),
                &HeaderMap::new(),
                body,
                JsonMode::Off,
            )
            .error
        };
        let too_long = [
            (
                400,
                r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
            ),
            (
                400,
                r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}"#,
            ),
            (500, "prompt too long"),
            (
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
            ),
            (
                413,
                r#"{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum allowed number of bytes."}}"#,
            ),
        ];
        for (status, body) in too_long {
            let error = classify(status, body);
            assert!(error.is_context_too_long(), "{status} {body}: {error:?}");
            assert!(
                !error.is_retryable(),
                "the same request is not retried as it is"
            );
        }
        assert!(matches!(
            classify(401, r#"{"error":{"message":"invalid api key"}}"#),
            LlmError::Refused { status: 401, .. }
        ));
        assert!(matches!(
            classify(429, "prompt too long for your rate limit"),
            LlmError::RateLimited { .. }
        ));
        assert!(matches!(
            classify(500, "internal error"),
            LlmError::Server { status: 500, .. }
        ));
    }

    #[test]
    fn retry_after_is_read_and_bounded() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", "2".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", "250".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_millis(250)));
        let mut h = HeaderMap::new();
        h.insert("retry-after", "99999999999999".parse().unwrap());
        assert_eq!(retry_after(&h), Some(MAX_HEADER_WAIT));
        h.insert("retry-after", "-1".parse().unwrap());
        assert_eq!(retry_after(&h), None);
        h.insert(
            "retry-after",
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&h), None);
    }
}
