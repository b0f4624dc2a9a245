//! What `flotilla.toml` says about providers: `[providers.NAME]`, `[roles]` and `[prices]`.
//! Stored with each run (the journal holds the run's config), so it never holds a key: only
//! the name of the daemon's environment variable that does.
//!
//! Validated: key variables only by name, never plain http off the machine with a key.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use flotilla_actors::ports::Role;
use flotilla_actors::protocol::{Usage, Usd};
use serde::{Deserialize, Serialize};

/// `[providers.NAME]`: one endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSpec {
    pub kind: ProviderKind,
    /// Where the API lives, e.g. `http://127.0.0.1:8080/v1` (OpenAI-compatible: the path
    /// before `/chat/completions`) or `https://api.anthropic.com` (Anthropic: the part
    /// before `/v1/messages`). Not used by `scripted`.
    #[serde(default)]
    pub base_url: Option<String>,
    /// The daemon's environment variable that holds the API key; optional for local servers.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Calls in flight at once, across every run that uses this endpoint.
    #[serde(default = "defaults::max_concurrency")]
    pub max_concurrency: usize,
    /// Stream answers (SSE). Off: one JSON answer per call.
    #[serde(default = "defaults::stream")]
    pub stream: bool,
    /// Ask for JSON output (`response_format`) when a JSON answer is wanted. A server that
    /// refuses it is asked again without it, and not asked with it again.
    #[serde(default = "defaults::json_mode")]
    pub json_mode: bool,
    /// A whole call (one attempt), from sending to the last byte.
    #[serde(default = "defaults::request_timeout_secs")]
    pub request_timeout_secs: u64,
    /// A stream that sends no bytes for this long is cut.
    #[serde(default = "defaults::stall_timeout_secs")]
    pub stall_timeout_secs: u64,
    /// Retries of a call that failed in a way another try may fix (429, 5xx, transport).
    #[serde(default = "defaults::max_retries")]
    pub max_retries: u32,
    /// First wait before a retry; doubles, with jitter, up to `backoff_max_ms`.
    #[serde(default = "defaults::backoff_min_ms")]
    pub backoff_min_ms: u64,
    #[serde(default = "defaults::backoff_max_ms")]
    pub backoff_max_ms: u64,
    /// Output tokens asked for (Anthropic requires a number; OpenAI-compatible servers get
    /// it as `max_tokens` only when set).
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
}

mod defaults {
    pub fn max_concurrency() -> usize {
        4
    }
    pub fn stream() -> bool {
        true
    }
    pub fn json_mode() -> bool {
        true
    }
    pub fn request_timeout_secs() -> u64 {
        600
    }
    pub fn stall_timeout_secs() -> u64 {
        60
    }
    pub fn max_retries() -> u32 {
        4
    }
    pub fn backoff_min_ms() -> u64 {
        500
    }
    pub fn backoff_max_ms() -> u64 {
        30_000
    }
}

impl ProviderSpec {
    /// A spec of `kind` at `base_url` with every default.
    pub fn new(kind: ProviderKind, base_url: impl Into<String>) -> Self {
        ProviderSpec {
            kind,
            base_url: Some(base_url.into()),
            api_key_env: None,
            max_concurrency: defaults::max_concurrency(),
            stream: defaults::stream(),
            json_mode: defaults::json_mode(),
            request_timeout_secs: defaults::request_timeout_secs(),
            stall_timeout_secs: defaults::stall_timeout_secs(),
            max_retries: defaults::max_retries(),
            backoff_min_ms: defaults::backoff_min_ms(),
            backoff_max_ms: defaults::backoff_max_ms(),
            max_output_tokens: None,
        }
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs)
    }

    pub fn stall_timeout(&self) -> Duration {
        Duration::from_secs(self.stall_timeout_secs)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// OpenAI-compatible chat completions: OpenAI, OpenRouter, vLLM, Ollama, llama.cpp.
    Openai,
    /// Anthropic Messages.
    Anthropic,
    /// The run's scenario (`[provider] scenario`): no model is called.
    Scripted,
}

/// `[roles]`: which `provider/model` serves each role, or a list tried in order (failover).
/// A role left out is served by the scripted provider (the run's scenario).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleModels {
    #[serde(default)]
    pub planner: Option<ModelList>,
    #[serde(default)]
    pub subplanner: Option<ModelList>,
    #[serde(default)]
    pub worker: Option<ModelList>,
    #[serde(default)]
    pub reconciler: Option<ModelList>,
    /// Reads each attempt's sealed work before it lands, when `[reviewer] enabled`.
    #[serde(default)]
    pub reviewer: Option<ModelList>,
}

impl RoleModels {
    pub fn get(&self, role: Role) -> Option<&ModelList> {
        match role {
            Role::Planner => self.planner.as_ref(),
            Role::Subplanner => self.subplanner.as_ref(),
            Role::Worker => self.worker.as_ref(),
            Role::Reconciler => self.reconciler.as_ref(),
            Role::Reviewer => self.reviewer.as_ref(),
        }
    }
}

/// One `provider/model`, or several in failover order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ModelList {
    One(String),
    Many(Vec<String>),
}

impl ModelList {
    pub fn names(&self) -> &[String] {
        match self {
            ModelList::One(name) => std::slice::from_ref(name),
            ModelList::Many(names) => names,
        }
    }
}

/// `[prices."provider/model"]`: USD per million tokens. A model without a price is free.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    #[serde(default)]
    pub input: f64,
    #[serde(default)]
    pub output: f64,
}

/// The highest price accepted, in USD per million tokens: far above any real model, low
/// enough that no token count can overflow the cost.
pub const MAX_PRICE_PER_MILLION: f64 = 10_000.0;

impl Price {
    /// What `usage` costs. A price is USD per million tokens, so it is also micro-dollars
    /// per token; the product saturates.
    pub fn cost(&self, tokens_in: u64, tokens_out: u64) -> Usd {
        let micros = |tokens: u64, per_token: f64| -> u64 {
            let value = (tokens as f64) * per_token;
            if value.is_finite() && value > 0.0 {
                value.round().min(u64::MAX as f64) as u64
            } else {
                0
            }
        };
        Usd::from_micros(
            micros(tokens_in, self.input).saturating_add(micros(tokens_out, self.output)),
        )
    }

    /// `usage` with its cost filled in.
    pub fn charge(&self, usage: &mut Usage) {
        usage.cost_usd = self.cost(usage.tokens_in, usage.tokens_out);
    }
}

/// Why the provider settings cannot work, naming what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderSettingsError {
    #[error("providers.{name}: {problem}")]
    Provider {
        name: String,
        problem: ProviderSpecError,
    },
    #[error("roles.{role}: {problem}")]
    Role { role: Role, problem: String },
    #[error("prices.\"{model}\": {problem}")]
    Price { model: String, problem: String },
}

/// The whole of a run's provider settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSettings {
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderSpec>,
    #[serde(default)]
    pub roles: RoleModels,
    #[serde(default)]
    pub prices: BTreeMap<String, Price>,
}

impl ProviderSettings {
    /// Checks every provider, role and price: names resolve, URLs are http(s), a key is
    /// never sent in clear text to another machine, numbers are in range.
    pub fn validate(&self) -> Result<(), ProviderSettingsError> {
        for (name, spec) in &self.providers {
            validate_provider(name, spec).map_err(|problem| ProviderSettingsError::Provider {
                name: name.clone(),
                problem,
            })?;
        }
        for role in Role::ALL {
            let Some(models) = self.roles.get(role) else {
                continue;
            };
            let problem = |problem: String| ProviderSettingsError::Role { role, problem };
            if models.names().is_empty() {
                return Err(problem("the list of models is empty".into()));
            }
            for full in models.names() {
                let (provider, model) = split_model(full).ok_or_else(|| {
                    problem(format!("{full:?} is not of the form \"provider/model\""))
                })?;
                let Some(spec) = self.providers.get(provider) else {
                    return Err(problem(format!(
                        "{full:?} names provider {provider:?}, which [providers] does not define"
                    )));
                };
                if spec.kind != ProviderKind::Scripted && model.trim().is_empty() {
                    return Err(problem(format!("{full:?} names no model")));
                }
            }
        }
        for (model, price) in &self.prices {
            for (what, value) in [("input", price.input), ("output", price.output)] {
                if !(value.is_finite() && (0.0..=MAX_PRICE_PER_MILLION).contains(&value)) {
                    return Err(ProviderSettingsError::Price {
                        model: model.clone(),
                        problem: format!(
                            "{what} must be from 0 to {MAX_PRICE_PER_MILLION} (USD per million tokens)"
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// The price of `provider/model`; free if none is configured.
    pub fn price(&self, model: &str) -> Price {
        self.prices.get(model).copied().unwrap_or_default()
    }
}

/// `provider/model` split at its first `/` (model names may hold more slashes:
/// `openrouter/meta-llama/llama-3-70b`).
pub fn split_model(full: &str) -> Option<(&str, &str)> {
    let (provider, model) = full.split_once('/')?;
    (!provider.is_empty()).then_some((provider, model))
}

/// What is wrong with one `[providers.NAME]` table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderSpecError {
    #[error("a provider's name must be non-empty and hold no '/'")]
    BadName,
    #[error("base_url is required")]
    NoBaseUrl,
    #[error("base_url is not a URL: {0}")]
    BadUrl(#[from] url::ParseError),
    #[error("base_url must be http:// or https://")]
    NotHttp,
    #[error("base_url must not hold credentials; use api_key_env")]
    CredentialsInUrl,
    #[error(
        "api_key_env = {0:?}: name an environment variable that holds a key \
         (capital letters, digits and '_', ending in _KEY or _TOKEN)"
    )]
    NotAKeyVariable(String),
    #[error("a key is never sent over plain http to another machine: use https")]
    KeyInClear,
    #[error("{0} = 0: it must be at least 1")]
    Zero(&'static str),
    #[error("max_concurrency must be at most 1024")]
    TooConcurrent,
    #[error("max_retries must be at most 20")]
    TooManyRetries,
    #[error("timeouts must be at most a day (86400 s)")]
    TimeoutOverADay,
    #[error("backoff_min_ms must be at most backoff_max_ms, itself at most a day")]
    BadBackoff,
}

fn validate_provider(name: &str, spec: &ProviderSpec) -> Result<(), ProviderSpecError> {
    if name.is_empty() || name.contains('/') {
        return Err(ProviderSpecError::BadName);
    }
    if spec.kind == ProviderKind::Scripted {
        return Ok(());
    }
    let Some(base) = &spec.base_url else {
        return Err(ProviderSpecError::NoBaseUrl);
    };
    let url = reqwest::Url::parse(base)?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ProviderSpecError::NotHttp);
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ProviderSpecError::CredentialsInUrl);
    }
    if let Some(env) = &spec.api_key_env {
        if !is_key_variable(env) {
            return Err(ProviderSpecError::NotAKeyVariable(env.clone()));
        }
        if url.scheme() == "http" && !is_loopback(&url) {
            return Err(ProviderSpecError::KeyInClear);
        }
    }
    let numbers: [(&str, u64); 5] = [
        ("max_concurrency", spec.max_concurrency as u64),
        ("request_timeout_secs", spec.request_timeout_secs),
        ("stall_timeout_secs", spec.stall_timeout_secs),
        ("backoff_min_ms", spec.backoff_min_ms),
        ("backoff_max_ms", spec.backoff_max_ms),
    ];
    if let Some((field, _)) = numbers.iter().find(|(_, v)| *v == 0) {
        return Err(ProviderSpecError::Zero(field));
    }
    if spec.max_concurrency > 1024 {
        return Err(ProviderSpecError::TooConcurrent);
    }
    if spec.max_retries > 20 {
        return Err(ProviderSpecError::TooManyRetries);
    }
    // A day: anything longer is a mistake, and Duration arithmetic stays far from overflow.
    const DAY: u64 = 24 * 60 * 60;
    if spec.request_timeout_secs > DAY || spec.stall_timeout_secs > DAY {
        return Err(ProviderSpecError::TimeoutOverADay);
    }
    if spec.backoff_max_ms > DAY * 1000 || spec.backoff_min_ms > spec.backoff_max_ms {
        return Err(ProviderSpecError::BadBackoff);
    }
    Ok(())
}

/// Only variables that look like keys may be named, so that a submitted config cannot have
/// the daemon send, say, `$HOME` or `$PATH` to a server of its choosing.
fn is_key_variable(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        && (name.ends_with("_KEY") || name.ends_with("_TOKEN"))
}

fn is_loopback(url: &reqwest::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(domain)) => domain == "localhost",
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProviderKind::Openai => "openai",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Scripted => "scripted",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(text: &str) -> ProviderSettings {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn the_issues_example_is_valid() {
        let s = settings(
            r#"
            [providers.local]
            kind = "openai"
            base_url = "http://127.0.0.1:8080/v1"
            api_key_env = "OPENAI_API_KEY"
            max_concurrency = 4

            [roles]
            planner = "local/qwen2.5-coder"
            worker = ["local/qwen2.5-coder", "local/other"]

            [prices."local/qwen2.5-coder"]
            input = 0.0
            output = 0.0
            "#,
        );
        s.validate().unwrap();
        assert_eq!(s.roles.worker.as_ref().unwrap().names().len(), 2);
    }

    #[test]
    fn impossible_settings_are_refused_with_what_is_wrong() {
        let cases = [
            ("[providers.a]\nkind = \"openai\"\n", "base_url is required"),
            (
                "[providers.a]\nkind = \"openai\"\nbase_url = \"ftp://x\"\n",
                "http://",
            ),
            (
                "[providers.a]\nkind = \"openai\"\nbase_url = \"http://example.com/v1\"\napi_key_env = \"OPENAI_API_KEY\"\n",
                "plain http",
            ),
            (
                "[providers.a]\nkind = \"openai\"\nbase_url = \"https://x\"\napi_key_env = \"HOME\"\n",
                "api_key_env",
            ),
            (
                "[providers.a]\nkind = \"openai\"\nbase_url = \"https://x\"\nmax_concurrency = 0\n",
                "max_concurrency",
            ),
            ("[roles]\nplanner = \"nobody/m\"\n", "does not define"),
            ("[roles]\nplanner = \"no-slash\"\n", "provider/model"),
            ("[roles]\nplanner = []\n", "empty"),
            ("[prices.\"a/b\"]\ninput = -1.0\n", "input"),
            ("[prices.\"a/b\"]\noutput = 1e300\n", "output"),
        ];
        for (text, needle) in cases {
            let err = settings(text).validate().unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn costs_saturate_and_round() {
        let price = Price {
            input: 3.0,
            output: 15.0,
        };
        assert_eq!(price.cost(1_000_000, 0).micros(), 3_000_000);
        assert_eq!(price.cost(1, 1).micros(), 18);
        let most = Usd::from_micros(u64::MAX).micros();
        assert_eq!(
            price.cost(u64::MAX, u64::MAX).micros(),
            most,
            "saturates at Usd's cap"
        );
        assert_eq!(Price::default().cost(u64::MAX, 7).micros(), 0);
    }
}
