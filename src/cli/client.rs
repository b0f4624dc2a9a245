//! The CLI's HTTP client: one HTTP/1.1 request per connection, over the daemon's Unix socket
//! or loopback TCP with the bearer token. Failures are typed so that the CLI can print one
//! clear line (`DaemonNotRunning` says how to start it).
//!
//! Nothing waits forever: connecting and getting an answer is bounded by the request
//! timeout, and an event stream, which is long-lived by design, is given up when the daemon
//! sends nothing (not even its periodic keep-alive) for [`Client::stream_silence`].
//!
//! Submit sends an `Idempotency-Key` and retries a bounded number of times; a 503's
//! `retry-after` is waited out, bounded; the bearer token goes to loopback only.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use flotilla_actors::protocol::Event;
use futures::{Stream, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::IDEMPOTENCY_KEY;
use crate::api::runs::Created;
use crate::api::sse::{EventFrame, LAST_EVENT_ID, MAX_EVENT_BYTES};

/// How long a request may take, from connecting to the end of the answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an event stream may stay silent before the daemon counts as gone. The daemon
/// sends a keep-alive every [`crate::api::sse::KEEP_ALIVE`], far more often.
pub const STREAM_SILENCE: Duration = Duration::from_secs(60);
/// How many times `submit` sends the same run (with the same idempotency key) when the
/// answer is lost.
pub const SUBMIT_ATTEMPTS: u32 = 4;
/// How many times a request that is safe to repeat (a GET, a submit with its idempotency
/// key) is sent to a daemon that answers 503 (too many connections) before giving up.
pub const BUSY_ATTEMPTS: u32 = 5;
/// The longest wait between two of those attempts, whatever `retry-after` asks: the whole
/// retry stays within a few seconds.
pub const BUSY_WAIT_MAX: Duration = Duration::from_secs(3);
/// The wait when a 503 names none.
const BUSY_WAIT_DEFAULT: Duration = Duration::from_secs(1);

/// `text` as one URL path segment: everything but unreserved characters percent-encoded, so
/// that whatever a user typed as a run id reaches the daemon as typed (and is refused there
/// with a clear error) instead of breaking the request.
pub fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[derive(Debug, Clone)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp { addr: SocketAddr, token: String },
}

/// Why a request failed underneath: the transport's or the decoder's own error, or for what
/// flotilla itself refused or noticed (a silent stream), its words.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Connecting to the daemon failed for another reason than nothing listening.
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to {endpoint}")]
pub struct ConnectError {
    endpoint: String,
    #[source]
    source: std::io::Error,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the flotilla daemon is not running (nothing answers on {endpoint})")]
    DaemonNotRunning { endpoint: String },
    #[error("{message}")]
    Api { status: StatusCode, message: String },
    /// Connecting, sending or reading failed: the cause says which and why.
    #[error("talking to the daemon failed")]
    Transport(#[source] Cause),
    /// The answer is not what the API says it is (not JSON, not the type, not UTF-8).
    #[error("the daemon answered something unexpected")]
    Decode(#[source] Cause),
    #[error("the daemon at {endpoint} did not answer within {} s", after.as_secs_f32())]
    TimedOut { endpoint: String, after: Duration },
}

impl ClientError {
    /// Whether the request may not have reached the daemon, or its answer was lost: sending
    /// it again (idempotently) may succeed.
    fn answer_lost(&self) -> bool {
        match self {
            ClientError::Transport(_) | ClientError::TimedOut { .. } => true,
            // A busy daemon (503) was already waited for by `request_patiently`.
            ClientError::Api { .. }
            | ClientError::DaemonNotRunning { .. }
            | ClientError::Decode(_) => false,
        }
    }
}

/// One HTTP/1.1 request on a fresh connection.
async fn exchange<S>(
    stream: S,
    request: Request<Full<Bytes>>,
) -> Result<hyper::Response<Body>, ClientError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let transport = |e: hyper::Error| ClientError::Transport(e.into());
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(transport)?;
    tokio::spawn(conn);
    sender.send_request(request).await.map_err(transport)
}

/// The wait a `retry-after: SECONDS` header asks for (the HTTP-date form is not used by
/// the daemon and counts as none).
fn retry_after(response: &hyper::Response<Body>) -> Option<Duration> {
    response
        .headers()
        .get(hyper::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

#[derive(Debug, Clone)]
pub struct Client {
    endpoint: Endpoint,
    request_timeout: Duration,
    stream_silence: Duration,
}

type Body = hyper::body::Incoming;

impl Client {
    pub fn new(endpoint: Endpoint) -> Self {
        Client {
            endpoint,
            request_timeout: REQUEST_TIMEOUT,
            stream_silence: STREAM_SILENCE,
        }
    }

    /// Other limits than [`REQUEST_TIMEOUT`] and [`STREAM_SILENCE`] (tests use short ones).
    pub fn with_timeouts(mut self, request: Duration, stream_silence: Duration) -> Self {
        self.request_timeout = request;
        self.stream_silence = stream_silence;
        self
    }

    pub fn stream_silence(&self) -> Duration {
        self.stream_silence
    }

    pub fn endpoint_label(&self) -> String {
        match &self.endpoint {
            Endpoint::Unix(p) => p.display().to_string(),
            Endpoint::Tcp { addr, .. } => addr.to_string(),
        }
    }

    /// Connects and sends one request; returns when the answer's head has arrived, within
    /// the request timeout.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        headers: &[(&str, String)],
    ) -> Result<hyper::Response<Body>, ClientError> {
        tokio::time::timeout(
            self.request_timeout,
            self.send_unbounded(method, path, body, headers),
        )
        .await
        .map_err(|_| self.timed_out())?
    }

    fn timed_out(&self) -> ClientError {
        ClientError::TimedOut {
            endpoint: self.endpoint_label(),
            after: self.request_timeout,
        }
    }

    /// One whole exchange (connect, send, read the full answer) within the request timeout.
    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        headers: &[(&str, String)],
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let (status, _, body) = self.request_once(method, path, body, headers).await?;
        Ok((status, body))
    }

    /// [`Client::request`], also returning how long a 503 asked to wait (`retry-after`).
    async fn request_once(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        headers: &[(&str, String)],
    ) -> Result<(StatusCode, Option<Duration>, Bytes), ClientError> {
        tokio::time::timeout(self.request_timeout, async {
            let response = self.send_unbounded(method, path, body, headers).await?;
            let wait = retry_after(&response);
            let (status, body) = Self::read(response).await?;
            Ok((status, wait, body))
        })
        .await
        .map_err(|_| self.timed_out())?
    }

    /// [`Client::request`] for a request that is safe to send again: a daemon answering 503
    /// (too many connections right now) is asked again after the wait it names (capped at
    /// [`BUSY_WAIT_MAX`]), at most [`BUSY_ATTEMPTS`] times; then its last answer stands.
    async fn request_patiently(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        headers: &[(&str, String)],
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let mut attempt = 1;
        loop {
            let (status, wait, bytes) = self
                .request_once(method.clone(), path, body.clone(), headers)
                .await?;
            if status != StatusCode::SERVICE_UNAVAILABLE || attempt >= BUSY_ATTEMPTS {
                return Ok((status, bytes));
            }
            tokio::time::sleep(wait.unwrap_or(BUSY_WAIT_DEFAULT).min(BUSY_WAIT_MAX)).await;
            attempt += 1;
        }
    }

    async fn send_unbounded(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        headers: &[(&str, String)],
    ) -> Result<hyper::Response<Body>, ClientError> {
        let not_running = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                ClientError::DaemonNotRunning {
                    endpoint: self.endpoint_label(),
                }
            }
            _ => ClientError::Transport(
                ConnectError {
                    endpoint: self.endpoint_label(),
                    source: e,
                }
                .into(),
            ),
        };
        if let Endpoint::Tcp { addr, .. } = &self.endpoint
            && !addr.ip().is_loopback()
        {
            // The token goes in cleartext; the daemon only ever listens on loopback.
            return Err(ClientError::Transport(
                format!(
                    "refusing to send the bearer token to {addr}, which is not a loopback address"
                )
                .into(),
            ));
        }
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "flotilla");
        for (k, v) in headers {
            builder = builder.header(*k, v);
        }
        if let Endpoint::Tcp { token, .. } = &self.endpoint {
            builder = builder.header("authorization", format!("Bearer {token}"));
        }
        let has_body = body.is_some();
        if has_body {
            builder = builder.header("content-type", "application/json");
        }
        let request = builder
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| ClientError::Transport(e.into()))?;
        match &self.endpoint {
            Endpoint::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(not_running)?;
                exchange(stream, request).await
            }
            Endpoint::Tcp { addr, .. } => {
                let stream = tokio::net::TcpStream::connect(addr)
                    .await
                    .map_err(not_running)?;
                exchange(stream, request).await
            }
        }
    }

    async fn read(response: hyper::Response<Body>) -> Result<(StatusCode, Bytes), ClientError> {
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError::Transport(e.into()))?
            .to_bytes();
        Ok((status, body))
    }

    /// The daemon's `{"error": …}`, or, for an answer that is not one (an empty body, a
    /// proxy's page, something else on the port), the status and what came with it, so that
    /// there is always a message to print.
    fn api_error(status: StatusCode, body: &[u8]) -> ClientError {
        const SHOWN: usize = 200;
        let message = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
            .filter(|m| !m.trim().is_empty())
            .unwrap_or_else(|| {
                let head = format!(
                    "the daemon answered {} {}",
                    status.as_u16(),
                    status.canonical_reason().unwrap_or("(unknown status)")
                );
                let text = String::from_utf8_lossy(body);
                let text = text.trim();
                if text.is_empty() {
                    head
                } else {
                    let shown: String = text.chars().take(SHOWN).collect();
                    let more = if text.chars().count() > SHOWN {
                        "…"
                    } else {
                        ""
                    };
                    format!("{head}: {shown}{more}")
                }
            });
        ClientError::Api { status, message }
    }

    /// Sends raw bytes and returns the status and body as they came: for tests and tools
    /// that need to see errors unparsed.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Vec<u8>), ClientError> {
        self.raw_with_headers(method, path, body, &[]).await
    }

    /// [`Client::raw`] with extra headers.
    pub async fn raw_with_headers(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        headers: &[(&str, String)],
    ) -> Result<(StatusCode, Vec<u8>), ClientError> {
        let (status, bytes) = self.request(method, path, body, headers).await?;
        Ok((status, bytes.to_vec()))
    }

    /// A request whose answer is text (graph exports).
    pub async fn text(&self, method: Method, path: &str) -> Result<String, ClientError> {
        let (status, body) = if method == Method::GET {
            self.request_patiently(method, path, None, &[]).await?
        } else {
            self.request(method, path, None, &[]).await?
        };
        if !status.is_success() {
            return Err(Self::api_error(status, &body));
        }
        String::from_utf8(body.to_vec()).map_err(|e| ClientError::Decode(e.into()))
    }

    pub async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, ClientError> {
        let body = body
            .map(|b| serde_json::to_vec(b))
            .transpose()
            .map_err(|e| ClientError::Decode(e.into()))?;
        // Only a GET is safe to repeat: a POST's first attempt may have been acted on.
        let (status, bytes) = if method == Method::GET {
            self.request_patiently(method, path, body, &[]).await?
        } else {
            self.request(method, path, body, &[]).await?
        };
        if !status.is_success() {
            return Err(Self::api_error(status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode(e.into()))
    }

    /// Creates a run (`POST /v1/runs`) exactly once, however often the answer is lost: the
    /// body goes with a fresh idempotency key, and a lost answer (a transport error, a
    /// timeout, a busy daemon) is retried a bounded number of times with the same key, for
    /// which the daemon answers with the run it already created.
    pub async fn submit(&self, body: &impl Serialize) -> Result<Created, ClientError> {
        let key = uuid::Uuid::now_v7().to_string();
        self.submit_with_key(body, &key).await
    }

    /// [`Client::submit`] with a given key (for tests of the retry itself).
    pub async fn submit_with_key(
        &self,
        body: &impl Serialize,
        key: &str,
    ) -> Result<Created, ClientError> {
        let body = serde_json::to_vec(body).map_err(|e| ClientError::Decode(e.into()))?;
        let headers = [(IDEMPOTENCY_KEY, key.to_string())];
        let mut attempt = 1;
        loop {
            let error = match self
                .request_patiently(Method::POST, "/v1/runs", Some(body.clone()), &headers)
                .await
            {
                Ok((status, bytes)) if status.is_success() => {
                    return serde_json::from_slice(&bytes)
                        .map_err(|e| ClientError::Decode(e.into()));
                }
                Ok((status, bytes)) => Self::api_error(status, &bytes),
                Err(e) => e,
            };
            // A daemon restarting between attempts refuses connections for a moment.
            let restarting = attempt > 1 && matches!(error, ClientError::DaemonNotRunning { .. });
            if attempt >= SUBMIT_ATTEMPTS || !(error.answer_lost() || restarting) {
                return Err(error);
            }
            tokio::time::sleep(Duration::from_millis(250 << attempt)).await;
            attempt += 1;
        }
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.json(Method::GET, path, None::<&()>).await
    }

    /// The run's report (`GET /v1/runs/{id}/report`).
    pub async fn report(&self, run: &str) -> Result<crate::api::report::RunReport, ClientError> {
        self.get(&format!("/v1/runs/{}/report", segment(run))).await
    }

    /// An attempt's transcript from byte `from` on (`GET …/tasks/{task}/transcript`); with
    /// `wait`, the daemon holds an answer with nothing new (a long poll, below the request
    /// timeout).
    pub async fn transcript(
        &self,
        run: &str,
        task: &str,
        attempt: Option<u32>,
        from: u64,
        wait: bool,
    ) -> Result<crate::api::transcript::Transcript, ClientError> {
        let mut path = format!(
            "/v1/runs/{}/tasks/{}/transcript?from={from}&wait={wait}",
            segment(run),
            segment(task)
        );
        if let Some(n) = attempt {
            path.push_str(&format!("&attempt={n}"));
        }
        self.get(&path).await
    }

    /// The run's events after `since`, as a stream that ends after `run_finished`.
    pub async fn events(
        &self,
        run: &str,
        since: Option<u64>,
    ) -> Result<impl Stream<Item = Result<Event, ClientError>> + use<>, ClientError> {
        let headers: Vec<(&str, String)> = since
            .map(|s| (LAST_EVENT_ID, s.to_string()))
            .into_iter()
            .collect();
        let path = format!("/v1/runs/{}/events", segment(run));
        let mut attempt = 1;
        let response = loop {
            let response = self.send(Method::GET, &path, None, &headers).await?;
            if response.status().is_success() {
                break response;
            }
            // A busy daemon: wait as it asks (bounded), like `request_patiently`.
            let wait = retry_after(&response);
            let (status, body) = Self::read(response).await?;
            if status != StatusCode::SERVICE_UNAVAILABLE || attempt >= BUSY_ATTEMPTS {
                return Err(Self::api_error(status, &body));
            }
            tokio::time::sleep(wait.unwrap_or(BUSY_WAIT_DEFAULT).min(BUSY_WAIT_MAX)).await;
            attempt += 1;
        };
        // The stream is long-lived by design, so the request timeout does not apply to it;
        // silence does: the daemon sends a keep-alive comment regularly, and a daemon that
        // sends nothing at all for `stream_silence` is gone (stopped, or the link is dead).
        let silence = self.stream_silence;
        let frames = response.into_body().into_data_stream();
        let frames = futures::stream::unfold(Some(frames), move |frames| async move {
            let mut frames = frames?;
            match tokio::time::timeout(silence, frames.next()).await {
                Ok(Some(Ok(bytes))) => Some((Ok(bytes), Some(frames))),
                Ok(Some(Err(e))) => Some((Err(e.to_string()), None)),
                Ok(None) => None,
                Err(_) => Some((
                    Err(format!(
                        "the daemon sent nothing for {} s",
                        silence.as_secs_f32()
                    )),
                    None,
                )),
            }
        });
        Ok(parse_events(frames))
    }
}

/// Parses a `text/event-stream` body, however it is split into chunks, into the run's
/// events. `chunks` are the body's bytes as they arrive, or a transport error (which ends
/// the parsed stream with [`ClientError::Transport`]); every SSE event's `data` must be one
/// JSON [`Event`] ([`ClientError::Decode`] otherwise). Comments (the daemon's keep-alives)
/// and events without data yield nothing. A leading byte-order mark is dropped (see
/// [`crate::sse::frames`]).
pub fn parse_events<S, B, E>(chunks: S) -> impl Stream<Item = Result<Event, ClientError>> + Send
where
    S: Stream<Item = Result<B, E>> + Send,
    B: AsRef<[u8]> + Send,
    E: std::fmt::Display + Send,
{
    crate::sse::frames(chunks, MAX_EVENT_BYTES).map(|item| match item {
        Ok(sse) => EventFrame::parse(&sse.data).map_err(|e| ClientError::Decode(e.into())),
        Err(e) => Err(ClientError::Transport(e.to_string().into())),
    })
}
