//! The CLI's HTTP client: one HTTP/1.1 request per connection, over the daemon's Unix socket
//! or loopback TCP with the bearer token. Failures are typed so that the CLI can print one
//! clear line (`DaemonNotRunning` says how to start it).

use std::net::SocketAddr;
use std::path::PathBuf;

use eventsource_stream::Eventsource;
use flotilla_actors::protocol::Event;
use futures::{Stream, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;

#[derive(Debug, Clone)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp { addr: SocketAddr, token: String },
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the flotilla daemon is not running (nothing answers on {endpoint})")]
    DaemonNotRunning { endpoint: String },
    #[error("{message}")]
    Api { status: StatusCode, message: String },
    #[error("talking to the daemon failed: {0}")]
    Transport(String),
    #[error("the daemon answered something unexpected: {0}")]
    Decode(String),
}

/// One HTTP/1.1 request on a fresh connection.
async fn exchange<S>(
    stream: S,
    request: Request<Full<Bytes>>,
) -> Result<hyper::Response<Body>, ClientError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let transport = |e: hyper::Error| ClientError::Transport(e.to_string());
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(transport)?;
    tokio::spawn(conn);
    sender.send_request(request).await.map_err(transport)
}

#[derive(Debug, Clone)]
pub struct Client {
    endpoint: Endpoint,
}

type Body = hyper::body::Incoming;

impl Client {
    pub fn new(endpoint: Endpoint) -> Self {
        Client { endpoint }
    }

    pub fn endpoint_label(&self) -> String {
        match &self.endpoint {
            Endpoint::Unix(p) => p.display().to_string(),
            Endpoint::Tcp { addr, .. } => addr.to_string(),
        }
    }

    async fn send(
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
            _ => {
                ClientError::Transport(format!("cannot connect to {}: {e}", self.endpoint_label()))
            }
        };
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
            .map_err(|e| ClientError::Transport(e.to_string()))?;
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
            .map_err(|e| ClientError::Transport(e.to_string()))?
            .to_bytes();
        Ok((status, body))
    }

    fn api_error(status: StatusCode, body: &[u8]) -> ClientError {
        let message = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
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
        let (status, bytes) = Self::read(self.send(method, path, body, &[]).await?).await?;
        Ok((status, bytes.to_vec()))
    }

    /// A request whose answer is text (graph exports).
    pub async fn text(&self, method: Method, path: &str) -> Result<String, ClientError> {
        let (status, body) = Self::read(self.send(method, path, None, &[]).await?).await?;
        if !status.is_success() {
            return Err(Self::api_error(status, &body));
        }
        String::from_utf8(body.to_vec()).map_err(|e| ClientError::Decode(e.to_string()))
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
            .map_err(|e| ClientError::Decode(e.to_string()))?;
        let (status, bytes) = Self::read(self.send(method, path, body, &[]).await?).await?;
        if !status.is_success() {
            return Err(Self::api_error(status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode(e.to_string()))
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.json(Method::GET, path, None::<&()>).await
    }

    /// The run's events after `since`, as a stream that ends after `run_finished`.
    pub async fn events(
        &self,
        run: &str,
        since: Option<u64>,
    ) -> Result<impl Stream<Item = Result<Event, ClientError>> + use<>, ClientError> {
        let headers: Vec<(&str, String)> = since
            .map(|s| ("last-event-id", s.to_string()))
            .into_iter()
            .collect();
        let response = self
            .send(
                Method::GET,
                &format!("/v1/runs/{run}/events"),
                None,
                &headers,
            )
            .await?;
        if !response.status().is_success() {
            let (status, body) = Self::read(response).await?;
            return Err(Self::api_error(status, &body));
        }
        let frames = response.into_body().into_data_stream();
        Ok(frames.eventsource().map(|item| match item {
            Ok(sse) => serde_json::from_str::<Event>(&sse.data)
                .map_err(|e| ClientError::Decode(e.to_string())),
            Err(e) => Err(ClientError::Transport(e.to_string())),
        }))
    }
}
