//! `[notify]`: who hears when a run needs the user (a task waits for a decision, landing
//! paused because main moved), completed, or failed. A desktop notification (`notify-send`,
//! where it is installed) and a webhook (a JSON POST). The daemon delivers them on a task of
//! its own (`daemon::notify`), from the run's journaled config, never the candidate's.

use serde::{Deserialize, Serialize};

/// The longest webhook URL accepted.
pub const MAX_WEBHOOK_URL_BYTES: usize = 2048;
/// The most seconds one webhook request may take.
pub const MAX_WEBHOOK_TIMEOUT_SECS: u64 = 120;
/// The most times one notification is sent to the webhook.
pub const MAX_WEBHOOK_ATTEMPTS: u32 = 10;

/// `[notify]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NotifyConfig {
    /// A desktop notification through `notify-send`; skipped (logged once) where it is not
    /// installed or no desktop session is reachable.
    pub desktop: bool,
    /// `http://` or `https://` URL that gets a JSON POST per notification. Kept in the run's
    /// journaled config and never logged (only its host is).
    pub webhook: Option<String>,
    /// Seconds each webhook request may take, connecting included.
    pub webhook_timeout_secs: u64,
    /// Times a notification is sent when the webhook fails (no answer, or not a 2xx),
    /// waiting 1 s, 2 s, 4 s, … between them.
    pub webhook_attempts: u32,
    /// Which happenings are told: `needs_decision`, `run_completed`, `run_failed`.
    pub on: Vec<NotifyOn>,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        NotifyConfig {
            desktop: false,
            webhook: None,
            webhook_timeout_secs: 10,
            webhook_attempts: 4,
            on: NotifyOn::ALL.to_vec(),
        }
    }
}

/// What a notification is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotifyOn {
    /// A task waits for `flotilla decide`, or landing paused because main was moved.
    NeedsDecision,
    RunCompleted,
    /// Failed (cancelled runs are the user's own doing: not told).
    RunFailed,
}

impl NotifyOn {
    pub const ALL: [NotifyOn; 3] = [
        NotifyOn::NeedsDecision,
        NotifyOn::RunCompleted,
        NotifyOn::RunFailed,
    ];

    /// The name on the wire and in the config.
    pub fn name(self) -> &'static str {
        match self {
            NotifyOn::NeedsDecision => "needs_decision",
            NotifyOn::RunCompleted => "run_completed",
            NotifyOn::RunFailed => "run_failed",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotifyConfigError {
    #[error("[notify] webhook is not a URL: {0}")]
    NotAUrl(String),
    #[error("[notify] webhook must be http:// or https://, not {0}://")]
    Scheme(String),
    #[error("[notify] webhook is {0} bytes long; at most {MAX_WEBHOOK_URL_BYTES}")]
    TooLong(usize),
    #[error("[notify] webhook_timeout_secs must be 1 to {MAX_WEBHOOK_TIMEOUT_SECS}, not {0}")]
    Timeout(u64),
    #[error("[notify] webhook_attempts must be 1 to {MAX_WEBHOOK_ATTEMPTS}, not {0}")]
    Attempts(u32),
}

impl NotifyConfig {
    pub fn validate(&self) -> Result<(), NotifyConfigError> {
        if !(1..=MAX_WEBHOOK_TIMEOUT_SECS).contains(&self.webhook_timeout_secs) {
            return Err(NotifyConfigError::Timeout(self.webhook_timeout_secs));
        }
        if !(1..=MAX_WEBHOOK_ATTEMPTS).contains(&self.webhook_attempts) {
            return Err(NotifyConfigError::Attempts(self.webhook_attempts));
        }
        if let Some(webhook) = &self.webhook {
            self.webhook_url(webhook)?;
        }
        Ok(())
    }

    /// The webhook's URL, checked.
    pub fn webhook_url(&self, raw: &str) -> Result<url::Url, NotifyConfigError> {
        if raw.len() > MAX_WEBHOOK_URL_BYTES {
            return Err(NotifyConfigError::TooLong(raw.len()));
        }
        // The error never quotes the URL: it may hold a secret (a Slack hook's path).
        let url = url::Url::parse(raw).map_err(|e| NotifyConfigError::NotAUrl(e.to_string()))?;
        match url.scheme() {
            "http" | "https" => Ok(url),
            other => Err(NotifyConfigError::Scheme(other.chars().take(20).collect())),
        }
    }

    /// Whether anything is to be told about `what` at all.
    pub fn wants(&self, what: NotifyOn) -> bool {
        (self.desktop || self.webhook.is_some()) && self.on.contains(&what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notify_section_parses_and_bad_values_are_named() {
        let config: NotifyConfig = toml::from_str(
            "desktop = true\nwebhook = \"https://hooks.example.com/x\"\non = [\"run_failed\"]\n",
        )
        .unwrap();
        config.validate().unwrap();
        assert!(config.wants(NotifyOn::RunFailed));
        assert!(!config.wants(NotifyOn::RunCompleted));
        assert!(
            !NotifyConfig::default().wants(NotifyOn::RunFailed),
            "off by default"
        );

        let bad = |f: fn(&mut NotifyConfig)| {
            let mut c = NotifyConfig::default();
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        assert!(bad(|c| c.webhook = Some("ftp://x/secret".into())).contains("http"));
        let not_a_url = bad(|c| c.webhook = Some("not a url with secret".into()));
        assert!(!not_a_url.contains("secret"), "{not_a_url}");
        assert!(bad(|c| c.webhook_timeout_secs = 0).contains("webhook_timeout_secs"));
        assert!(bad(|c| c.webhook_attempts = 11).contains("webhook_attempts"));
        assert!(toml::from_str::<NotifyConfig>("on = [\"sometimes\"]").is_err());
        assert!(toml::from_str::<NotifyConfig>("webhok = \"x\"").is_err());
    }
}
