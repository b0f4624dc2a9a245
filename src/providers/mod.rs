//! LLM providers behind the `Llm` port: OpenAI-compatible chat completions and Anthropic
//! Messages over HTTP (reqwest, rustls), and the scripted provider for unconfigured roles.
//!
//! - [`settings`]: `[providers.NAME]`, `[roles]`, `[prices]` in `flotilla.toml`.
//! - [`endpoint`]: one endpoint: the retry layer (backoff with jitter, `Retry-After`), the
//!   rate-limit pause and concurrency cap it shares with every run, timeouts, stall cuts.
//! - [`openai`], [`anthropic`]: the wire formats, whole and streamed.
//! - [`ProviderRegistry`]: the daemon's endpoints, one state per server, shared by every
//!   run; [`RoutedLlm`]: a run's `Llm`, each role to its models in failover order, each
//!   answer's usage priced.
//!
//! Keys are the daemon's credentials ([`crate::keys`]), taken out of its environment once at
//! start; an endpoint takes the one its `api_key_env` names, and it goes into the request's
//! header only: never into a config, the journal, an event, a log line or argv.
//!
//! `ProviderRegistry::check` serves `flotilla providers check`. Hostile and half-broken
//! servers (ADR-019): checked indices, streams without their end marker retried, streamed
//! tool calls falling back to whole requests, `Retry-After` capped and long pauses said.

pub mod anthropic;
pub mod endpoint;
pub mod openai;
pub mod settings;
pub mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_actors::ports::{
    ChatMessage, FinishReason, Llm, LlmCall, LlmError, LlmRequest, LlmResponse, Role, ToolCall,
    approximate_tokens,
};
use flotilla_actors::protocol::Usage;
use futures::future::BoxFuture;
use tracing::warn;

use self::endpoint::{Endpoint, EndpointState, approximate_prompt_tokens};
use self::settings::{Price, ProviderKind, ProviderSettings, ProviderSpec, split_model};
use crate::keys::Keys;

/// An answer as a wire format parsed it, before accounting.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parsed {
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    /// `(input, output)` tokens, if the provider said.
    pub usage: Option<(u64, u64)>,
    pub finish: FinishReason,
}

impl Parsed {
    /// No text and no tool call: nothing to use.
    pub fn is_empty(&self) -> bool {
        self.content.trim().is_empty() && self.tool_calls.is_empty()
    }
}

/// Parses JSON from a provider, forgiving raw control characters inside strings (one
/// implementation, shared with the planners' answer parser).
pub use flotilla_actors::llm::output::parse_lenient;

/// Key of an endpoint's shared state: the same server, reached with the same key.
type EndpointKey = (ProviderKind, String, Option<String>);

/// The daemon's providers: one HTTP client (connection pool) and one state per endpoint,
/// shared by every run, so that rate limits and concurrency caps hold across runs.
pub struct ProviderRegistry {
    http: reqwest::Client,
    states: Mutex<HashMap<EndpointKey, Arc<EndpointState>>>,
    /// The credentials endpoints take their keys from.
    keys: Arc<Keys>,
}

/// Connecting to a provider may take this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

impl ProviderRegistry {
    /// A registry whose endpoints take their keys from [`crate::keys::daemon_keys`]: the
    /// daemon's, taken at start (or, outside the daemon, the environment's now).
    pub fn new() -> Result<Self, reqwest::Error> {
        ProviderRegistry::with_keys(crate::keys::daemon_keys())
    }

    /// A registry whose endpoints take their keys from `keys`.
    pub fn with_keys(keys: Arc<Keys>) -> Result<Self, reqwest::Error> {
        // reqwest is built without a TLS crypto provider of its own (ring, not aws-lc:
        // ADR-027); the process-wide default must be in place before a client is built. An
        // error only says one is installed already (another registry, a test): kept.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            // A redirect could carry the request (and its key) somewhere unconfigured.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("flotilla/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(ProviderRegistry {
            http,
            states: Mutex::new(HashMap::new()),
            keys,
        })
    }

    /// The endpoint for provider `name`, sharing its state with every other user of the
    /// same server. The latest `max_concurrency` configured for a server holds.
    pub fn endpoint(&self, name: &str, spec: &ProviderSpec) -> Arc<Endpoint> {
        let base = spec
            .base_url
            .as_deref()
            .unwrap_or_default()
            .trim_end_matches('/')
            .to_string();
        let key = (spec.kind, base, spec.api_key_env.clone());
        let state = {
            let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
            match states.get(&key) {
                Some(state) => {
                    state.resize(spec.max_concurrency);
                    state.clone()
                }
                None => {
                    let state = Arc::new(EndpointState::new(spec));
                    states.insert(key, state.clone());
                    state
                }
            }
        };
        Arc::new(Endpoint::new(
            name,
            spec,
            self.http.clone(),
            state,
            &self.keys,
        ))
    }

    /// A run's `Llm`: every role configured in `settings` goes to its models; the others to
    /// `scripted` (the run's scenario), if there is one.
    pub fn llm_for(
        &self,
        settings: &ProviderSettings,
        scripted: Option<Arc<dyn Llm>>,
    ) -> RoutedLlm {
        let mut routes = HashMap::new();
        for role in Role::ALL {
            let Some(models) = settings.roles.get(role) else {
                continue;
            };
            let targets: Vec<Target> = models
                .names()
                .iter()
                .filter_map(|full| {
                    let (provider, model) = split_model(full)?;
                    let spec = settings.providers.get(provider)?;
                    let endpoint = match spec.kind {
                        ProviderKind::Scripted => None,
                        _ => Some(self.endpoint(provider, spec)),
                    };
                    Some(Target {
                        full: full.clone(),
                        model: model.to_string(),
                        endpoint,
                        price: settings.price(full),
                    })
                })
                .collect();
            routes.insert(role, Arc::new(targets));
        }
        RoutedLlm { routes, scripted }
    }
}

/// What `flotilla providers check` found for one model of one role.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CheckResult {
    pub role: Role,
    /// `provider/model`.
    pub model: String,
    /// The call got an answer.
    pub reachable: bool,
    pub latency_ms: u64,
    /// Why not, in words (the provider's own message where it gave one).
    pub error: Option<String>,
}

/// The one-line prompt `providers check` sends.
const CHECK_PROMPT: &str = "Reply with the single word: ok";

impl ProviderRegistry {
    /// Calls every model of every configured role once, in order, without retries (a check
    /// says how the endpoint is now), each within `timeout`.
    pub async fn check(&self, settings: &ProviderSettings, timeout: Duration) -> Vec<CheckResult> {
        let mut results = Vec::new();
        for role in Role::ALL {
            let Some(models) = settings.roles.get(role) else {
                continue;
            };
            for full in models.names() {
                let started = tokio::time::Instant::now();
                let outcome = match split_model(full).and_then(|(provider, model)| {
                    Some((provider, model, settings.providers.get(provider)?))
                }) {
                    None => Err(format!("{full:?} names no configured provider")),
                    Some((_, _, spec)) if spec.kind == ProviderKind::Scripted => Ok(()),
                    Some((provider, model, spec)) => {
                        let spec = ProviderSpec {
                            max_retries: 0,
                            request_timeout_secs: timeout.as_secs().max(1),
                            ..spec.clone()
                        };
                        let endpoint = self.endpoint(provider, &spec);
                        let request = LlmRequest {
                            max_output_tokens: Some(16),
                            ..LlmRequest::chat(role, vec![ChatMessage::user(CHECK_PROMPT)])
                        };
                        endpoint
                            .complete(model, &request, &LlmCall::default())
                            .await
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    }
                };
                results.push(CheckResult {
                    role,
                    model: full.clone(),
                    reachable: outcome.is_ok(),
                    latency_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                    error: outcome.err(),
                });
            }
        }
        results
    }
}

/// One model a role may use.
struct Target {
    /// `provider/model`, as configured.
    full: String,
    model: String,
    /// `None`: the scripted provider.
    endpoint: Option<Arc<Endpoint>>,
    price: Price,
}

/// A run's `Llm`: routes each call by role, fails over in order, prices the usage.
pub struct RoutedLlm {
    routes: HashMap<Role, Arc<Vec<Target>>>,
    scripted: Option<Arc<dyn Llm>>,
}

impl RoutedLlm {
    /// The `provider/model` names configured for `role`, in failover order.
    pub fn models(&self, role: Role) -> Vec<String> {
        self.routes
            .get(&role)
            .map(|targets| targets.iter().map(|t| t.full.clone()).collect())
            .unwrap_or_default()
    }
}

impl Llm for RoutedLlm {
    fn complete(
        &self,
        request: LlmRequest,
        call: LlmCall,
    ) -> BoxFuture<'static, Result<LlmResponse, LlmError>> {
        let targets = self.routes.get(&request.role).cloned();
        let scripted = self.scripted.clone();
        Box::pin(async move {
            let Some(targets) = targets else {
                return match scripted {
                    Some(llm) => llm.complete(request, call).await,
                    None => Err(LlmError::NotConfigured(request.role)),
                };
            };
            let mut last = LlmError::NotConfigured(request.role);
            for (i, target) in targets.iter().enumerate() {
                if call.cancel.is_cancelled() {
                    return Err(LlmError::Cancelled);
                }
                let result = match &target.endpoint {
                    Some(endpoint) => endpoint
                        .complete(&target.model, &request, &call)
                        .await
                        .map(|parsed| priced(parsed, &request, target)),
                    None => match &scripted {
                        Some(llm) => llm.complete(request.clone(), call.clone()).await,
                        None => Err(LlmError::NotConfigured(request.role)),
                    },
                };
                match result {
                    Ok(response) => return Ok(response),
                    Err(LlmError::Cancelled) => return Err(LlmError::Cancelled),
                    Err(error) => {
                        if i + 1 < targets.len() {
                            warn!(role = %request.role, model = %target.full, %error, "failing over to the next model");
                        }
                        last = error;
                    }
                }
            }
            Err(last)
        })
    }
}

/// The response for `parsed`: usage as measured (or estimated, and marked so), priced.
fn priced(parsed: Parsed, request: &LlmRequest, target: &Target) -> LlmResponse {
    let (tokens_in, tokens_out, approximate) = match parsed.usage {
        Some((i, o)) => (i, o, false),
        None => {
            let out = approximate_tokens(&parsed.content).saturating_add(
                parsed
                    .tool_calls
                    .iter()
                    .map(|c| approximate_tokens(&c.arguments))
                    .fold(0, u64::saturating_add),
            );
            (approximate_prompt_tokens(request), out, true)
        }
    };
    let mut usage = Usage {
        tokens_in,
        tokens_out,
        ..Usage::default()
    };
    target.price.charge(&mut usage);
    LlmResponse {
        content: parsed.content,
        tool_calls: parsed.tool_calls,
        usage,
        usage_approximate: approximate,
        model: target.full.clone(),
        finish: parsed.finish,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 20: a JSON body starting with a byte-order mark was refused as malformed.
    #[test]
    fn a_leading_byte_order_mark_is_skipped() {
        let value: serde_json::Value = parse_lenient("\u{feff}{\"a\": 1}").unwrap();
        assert_eq!(value["a"], 1);
        let answer = openai::parse_body(
            "\u{feff}{\"choices\":[{\"message\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}",
        )
        .unwrap();
        assert_eq!(answer.content, "hi");
        // Only one, and only at the start.
        assert!(parse_lenient::<serde_json::Value>("\u{feff}\u{feff}{}").is_err());
        assert!(parse_lenient::<serde_json::Value>("{\"a\": 1}\u{feff}").is_err());
    }
}
