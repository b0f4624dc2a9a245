//! The live page (ADR-034): a run's task graph, updating from its event stream, served by
//! the daemon on loopback only. Its HTML, script and style are in the binary
//! (`include_str!`, `page/`); they read the API's own JSON and SSE, nothing else.
//!
//! - `POST /v1/ui` `{run?}` → `{url, expires_in_secs}`: a one-time link. A daemon on loopback
//!   TCP serves the page on that listener; one on a Unix socket opens a loopback listener on
//!   the first call (port chosen by the OS), which takes the same bearer token as
//!   `--listen` would (`<state-dir>/token`, 0600).
//! - `GET /ui/login?code=…[&run=…]`: spends the code (once, within [`CODE_LIFETIME`]), sets
//!   the session cookie and sends the browser to `/ui/`.
//! - `GET /ui/`, `/ui/page.js`, `/ui/page.css`: the page.
//!
//! The cookie is derived from the bearer token (an HMAC of it, so the token itself never
//! reaches the browser, and a restarted daemon with the same token still knows it) and is
//! accepted for GET and HEAD only, from a loopback `Host` (against DNS rebinding): the page
//! reads; it never decides or cancels. The page escapes everything it shows (text nodes,
//! never markup), and a strict Content-Security-Policy allows only its own script.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;

use super::{ApiError, ApiJson, AppState, ServerLimits, resolve};
use crate::api::ui::{OpenPage, PageLink};

/// How long a link from `flotilla ui` may wait to be opened.
pub const CODE_LIFETIME: Duration = Duration::from_secs(300);
/// Links minted and not yet opened, at most; the oldest goes first.
pub const MAX_OPEN_CODES: usize = 16;
/// The session cookie's name.
pub const COOKIE: &str = "flotilla_page";

const INDEX_HTML: &str = include_str!("page/index.html");
const PAGE_JS: &str = include_str!("page/page.js");
const PAGE_CSS: &str = include_str!("page/page.css");

/// Only the page's own files: no inline script, no other origin, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The page's share of the API's state: the one-time codes and where the page is served.
#[derive(Clone)]
pub struct PageState {
    codes: Arc<Mutex<Vec<(String, Instant)>>>,
    listen: PageListen,
}

#[derive(Clone)]
enum PageListen {
    /// This listener is loopback TCP at this address: the page is served here.
    Here(SocketAddr),
    /// The API is on a Unix socket: a loopback listener opens on the first `flotilla ui`.
    OnDemand(Arc<OnDemand>),
}

pub struct OnDemand {
    state_dir: PathBuf,
    limits: ServerLimits,
    bound: tokio::sync::Mutex<Option<SocketAddr>>,
    server: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl PageState {
    /// For a daemon whose API listens on loopback TCP at `addr`.
    pub fn tcp(addr: SocketAddr) -> Self {
        PageState {
            codes: Arc::default(),
            listen: PageListen::Here(addr),
        }
    }

    /// For a daemon on a Unix socket: the page's listener opens when first asked for.
    pub fn on_demand(state_dir: PathBuf, limits: ServerLimits) -> Self {
        PageState {
            codes: Arc::default(),
            listen: PageListen::OnDemand(Arc::new(OnDemand {
                state_dir,
                limits,
                bound: tokio::sync::Mutex::new(None),
                server: Mutex::new(None),
            })),
        }
    }

    /// The page's own listener, if one was opened, to wait for at shutdown.
    pub fn take_server(&self) -> Option<tokio::task::JoinHandle<()>> {
        match &self.listen {
            PageListen::OnDemand(d) => d.server.lock().ok()?.take(),
            PageListen::Here(_) => None,
        }
    }

    fn mint(&self) -> Result<String, ApiError> {
        let code = random_hex()?;
        let mut codes = self.codes.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        codes.retain(|(_, at)| now.duration_since(*at) < CODE_LIFETIME);
        if codes.len() >= MAX_OPEN_CODES {
            codes.remove(0);
        }
        codes.push((code.clone(), now));
        Ok(code)
    }

    /// Spends `code`: true once, within its lifetime.
    fn redeem(&self, code: &str) -> bool {
        let mut codes = self.codes.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        codes.retain(|(_, at)| now.duration_since(*at) < CODE_LIFETIME);
        // Every code compared in full (constant time), whichever matches.
        let mut found = None;
        for (i, (c, _)) in codes.iter().enumerate() {
            if super::constant_time_eq(c.as_bytes(), code.as_bytes()) {
                found = Some(i);
            }
        }
        match found {
            Some(i) => {
                codes.remove(i);
                true
            }
            None => false,
        }
    }
}

pub(super) fn routes() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/v1/ui", axum::routing::post(open))
        .route("/ui", get(|| async { redirect("/ui/", None) }))
        .route(
            "/ui/",
            get(|| async { asset(INDEX_HTML, "text/html; charset=utf-8") }),
        )
        .route(
            "/ui/page.js",
            get(|| async { asset(PAGE_JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/ui/page.css",
            get(|| async { asset(PAGE_CSS, "text/css; charset=utf-8") }),
        )
        .route("/ui/login", get(login))
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    secure(headers);
    response
}

fn secure(headers: &mut axum::http::HeaderMap) {
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

fn redirect(to: &'static str, cookie: Option<String>) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    let headers = response.headers_mut();
    headers.insert(header::LOCATION, HeaderValue::from_static(to));
    if let Some(cookie) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        headers.insert(header::SET_COOKIE, cookie);
    }
    secure(headers);
    response
}

/// `POST /v1/ui`.
async fn open(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<OpenPage>,
) -> Result<Json<PageLink>, ApiError> {
    let run = match body.run {
        Some(raw) => Some(resolve(&state, &raw).await?.id.to_string()),
        None => None,
    };
    let addr = match &state.page.listen {
        PageListen::Here(addr) => *addr,
        PageListen::OnDemand(on_demand) => open_listener(&state, on_demand).await?,
    };
    let code = state.page.mint()?;
    let run = run.map(|r| format!("&run={r}")).unwrap_or_default();
    Ok(Json(PageLink {
        url: format!("http://{addr}/ui/login?code={code}{run}"),
        expires_in_secs: CODE_LIFETIME.as_secs(),
    }))
}

/// The Unix-socket daemon's loopback listener for the page: opened once, on 127.0.0.1 with
/// a port the OS picks, serving the same API with the bearer token, until shutdown.
async fn open_listener(state: &AppState, on_demand: &OnDemand) -> Result<SocketAddr, ApiError> {
    let mut bound = on_demand.bound.lock().await;
    if let Some(addr) = *bound {
        return Ok(addr);
    }
    let internal = |what: &str, e: &dyn std::fmt::Display| {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("{what}: {e}"))
    };
    let token_file = crate::paths::token_path(&on_demand.state_dir);
    let token =
        tokio::task::spawn_blocking(move || super::super::load_or_create_token(&token_file))
            .await
            .map_err(|e| internal("the token", &e))?
            .map_err(|e| internal("the token", &e))?;
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .map_err(|e| internal("cannot open a loopback port for the page", &e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| internal("the page's port", &e))?;
    let served = AppState {
        token: Some(Arc::new(token)),
        page: PageState {
            codes: state.page.codes.clone(),
            listen: PageListen::Here(addr),
        },
        ..state.clone()
    };
    let app = super::router(served);
    let server = tokio::spawn(super::serve(
        listener,
        app,
        on_demand.limits.clone(),
        state.shutdown.clone(),
    ));
    if let Ok(mut slot) = on_demand.server.lock() {
        *slot = Some(server);
    }
    tracing::info!(%addr, "serving the live page on loopback");
    *bound = Some(addr);
    Ok(addr)
}

#[derive(Debug, Deserialize)]
struct LoginQuery {
    code: String,
    #[serde(default)]
    run: Option<String>,
}

/// `GET /ui/login`: the one-time code for the session cookie.
async fn login(State(state): State<AppState>, Query(q): Query<LoginQuery>) -> Response {
    let Some(token) = &state.token else {
        // The Unix socket needs no session; a browser never comes this way.
        return ApiError::new(StatusCode::NOT_FOUND, "the page is served on loopback TCP")
            .into_response();
    };
    if !state.page.redeem(&q.code) {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "this link was used already or has expired; run `flotilla ui` for a new one",
        )
        .into_response();
    }
    let cookie = format!(
        "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/",
        credential(token)
    );
    // The run's id goes back in the address only if it is one (hex and dashes).
    let run = q.run.filter(|r| {
        !r.is_empty() && r.len() <= 36 && r.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
    });
    match run {
        Some(run) => {
            let mut response = redirect("/ui/", Some(cookie));
            if let Ok(to) = HeaderValue::from_str(&format!("/ui/?run={run}")) {
                response.headers_mut().insert(header::LOCATION, to);
            }
            response
        }
        None => redirect("/ui/", Some(cookie)),
    }
}

/// Whether `req` carries the page's session cookie for `token`, is a read (GET or HEAD) and
/// names a loopback host.
pub(super) fn admits(req: &Request, token: &str) -> bool {
    if !matches!(*req.method(), Method::GET | Method::HEAD) || !loopback_host(req) {
        return false;
    }
    let expected = credential(token);
    req.headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .any(|value| super::constant_time_eq(value.as_bytes(), expected.as_bytes()))
}

/// The requests that need no credential: the login itself (it checks its code) and the
/// page's static files (they hold no data).
pub(super) fn is_open(req: &Request) -> bool {
    req.method() == Method::GET
        && matches!(
            req.uri().path(),
            "/ui/login" | "/ui" | "/ui/" | "/ui/page.js" | "/ui/page.css"
        )
}

/// A `Host` of 127.0.0.1, [::1] or localhost (any port): a name that DNS rebinding pointed
/// here is refused.
fn loopback_host(req: &Request) -> bool {
    let Some(host) = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
    else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The session cookie's value: HMAC-SHA256 of a fixed label under the bearer token.
pub fn credential(token: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, token.as_bytes());
    let tag = ring::hmac::sign(&key, b"flotilla live page session v1");
    tag.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn random_hex() -> Result<String, ApiError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the OS gave no random bytes: {e}"),
        )
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, host: &str, cookie: &str) -> Request {
        axum::http::Request::builder()
            .method(method)
            .uri("/v1/runs")
            .header(header::HOST, host)
            .header(header::COOKIE, cookie)
            .body(axum::body::Body::empty())
            .unwrap()
    }

    #[test]
    fn the_cookie_admits_reads_from_loopback_hosts_only() {
        let good = format!("a=b; {COOKIE}={}", credential("secret"));
        assert!(admits(
            &request(Method::GET, "127.0.0.1:7070", &good),
            "secret"
        ));
        assert!(admits(&request(Method::GET, "[::1]:7070", &good), "secret"));
        assert!(admits(
            &request(Method::GET, "localhost:1", &good),
            "secret"
        ));
        assert!(!admits(
            &request(Method::POST, "127.0.0.1:7070", &good),
            "secret"
        ));
        assert!(!admits(
            &request(Method::GET, "evil.example:7070", &good),
            "secret"
        ));
        assert!(!admits(
            &request(Method::GET, "127.0.0.1:7070", &good),
            "other"
        ));
        let wrong = format!("{COOKIE}={}", credential("other"));
        assert!(!admits(
            &request(Method::GET, "127.0.0.1:7070", &wrong),
            "secret"
        ));
        assert_ne!(
            credential("secret"),
            "secret",
            "the token never goes to the browser"
        );
    }

    #[test]
    fn a_code_opens_the_page_once() {
        let page = PageState::tcp(SocketAddr::from(([127, 0, 0, 1], 1)));
        let code = page.mint().unwrap();
        assert!(!page.redeem("0000"));
        assert!(page.redeem(&code));
        assert!(!page.redeem(&code), "spent");
        let codes: Vec<String> = (0..MAX_OPEN_CODES + 2)
            .map(|_| page.mint().unwrap())
            .collect();
        assert!(!page.redeem(&codes[0]), "the oldest went past the cap");
        assert!(page.redeem(&codes[MAX_OPEN_CODES + 1]));
    }

    #[test]
    fn the_script_listens_for_every_event_kind() {
        let task: flotilla_actors::protocol::TaskId = "t1".parse().unwrap();
        for kind in flotilla_actors::protocol::EventKind::samples(&task) {
            let name = kind.name();
            assert!(
                PAGE_JS.contains(&format!("\"{name}\"")),
                "page.js misses {name}"
            );
        }
        // Model text reaches the page only as text: no markup sink in the script.
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!PAGE_JS.contains(sink), "page.js uses {sink}");
        }
    }
}
