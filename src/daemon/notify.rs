//! Notifications (`[notify]`, ADR-034): when a run needs the user (a task waits for
//! `flotilla decide`, or landing paused because main was moved), completes or fails, a
//! desktop notification (`notify-send`, where installed) and a webhook (a JSON POST, retried
//! with backoff, each request with a timeout, the body bounded).
//!
//! It runs on tasks of its own on the API's thread, never on an actor's: one task only
//! filters the event hub (a `match`, nothing awaited but the hub), and hands the few events
//! that tell something to a second task, which reads the run's journaled config and starts a
//! delivery task per notification. A slow or dead webhook holds up nothing but its own
//! delivery. The hub can drop events for a receiver that falls behind: then the journal is
//! read again from each run's last told event, so that nothing is told twice or missed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use flotilla_actors::ports::Journal;
use flotilla_actors::protocol::{Event, EventKind, RunId, RunOutcome, TaskId};
use serde::Serialize;
use tokio::sync::{Semaphore, broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::{NotifyConfig, NotifyOn, RunConfig};
use crate::journal::SqliteJournal;

/// The most characters of the run's request, and of a message, a notification carries.
pub const MAX_TEXT_CHARS: usize = 500;
/// Deliveries under way at once; a notification past them is dropped with a warning.
pub const MAX_DELIVERIES: usize = 32;
/// How long `notify-send` may take.
pub const DESKTOP_TIMEOUT: Duration = Duration::from_secs(10);
/// The first wait between two webhook attempts; it doubles each time.
pub const WEBHOOK_BACKOFF: Duration = Duration::from_secs(1);

/// One thing to tell the user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Notification {
    /// `needs_decision`, `run_completed` or `run_failed`.
    pub event: &'static str,
    pub run: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// One line for a title.
    pub title: String,
    /// What happened and what to do, in words.
    pub message: String,
    /// The run's request, cut to [`MAX_TEXT_CHARS`].
    pub request: String,
    /// The event's journal seq and time (milliseconds since the Unix epoch).
    pub seq: u64,
    pub at_ms: u64,
}

/// What an event tells the user, if anything: the kind, the task, and the message.
pub fn classify(event: &Event) -> Option<(NotifyOn, Option<TaskId>, String)> {
    match &event.kind {
        EventKind::AwaitingUserDecision { parent } => Some((
            NotifyOn::NeedsDecision,
            Some(parent.clone()),
            format!("task {parent} waits for your decision (flotilla decide)"),
        )),
        EventKind::MainDiverged { .. } => Some((
            NotifyOn::NeedsDecision,
            None,
            "landing paused: main was moved; put it back or `flotilla decide RUN --adopt-main`"
                .into(),
        )),
        EventKind::RunFinished { outcome, reason } => {
            let what = match outcome {
                RunOutcome::Completed => NotifyOn::RunCompleted,
                RunOutcome::Failed => NotifyOn::RunFailed,
                RunOutcome::Cancelled => return None,
            };
            let message = match reason {
                Some(reason) => format!("the run {}: {}", outcome_word(*outcome), reason),
                None => format!("the run {}", outcome_word(*outcome)),
            };
            Some((what, None, message))
        }
        _ => None,
    }
}

fn outcome_word(outcome: RunOutcome) -> &'static str {
    match outcome {
        RunOutcome::Completed => "completed",
        RunOutcome::Failed => "failed",
        RunOutcome::Cancelled => "was cancelled",
    }
}

/// `text` cut to `max` characters, control characters (escape sequences, newlines) as
/// spaces: a notification is one short, inert text wherever it is shown.
pub fn plain(text: &str, max: usize) -> String {
    let mut out: String = text
        .chars()
        .take(max)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().nth(max).is_some() {
        out.push('…');
    }
    out
}

impl Notification {
    pub fn new(
        event: &Event,
        what: NotifyOn,
        task: Option<TaskId>,
        message: &str,
        request: &str,
    ) -> Self {
        let short = event.run.to_string().chars().take(8).collect::<String>();
        Notification {
            event: what.name(),
            run: event.run.to_string(),
            task: task.map(|t| t.to_string()),
            title: match what {
                NotifyOn::NeedsDecision => format!("flotilla: run {short} needs you"),
                NotifyOn::RunCompleted => format!("flotilla: run {short} completed"),
                NotifyOn::RunFailed => format!("flotilla: run {short} failed"),
            },
            message: plain(message, MAX_TEXT_CHARS),
            request: plain(request, MAX_TEXT_CHARS),
            seq: event.seq,
            at_ms: event.at_ms,
        }
    }
}

/// Where notifications go: the HTTP client for webhooks and `notify-send`, if found.
#[derive(Clone)]
pub struct Delivery {
    http: reqwest::Client,
    desktop: Option<PathBuf>,
    backoff: Duration,
}

impl Delivery {
    /// `desktop`: the `notify-send` to run ([`find_notify_send`]), if any.
    pub fn new(desktop: Option<PathBuf>) -> Result<Self, reqwest::Error> {
        // reqwest has no TLS provider of its own here (ADR-027); ring is the process's.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            // A redirect could carry the notification somewhere the user did not name.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("flotilla/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Delivery {
            http,
            desktop,
            backoff: WEBHOOK_BACKOFF,
        })
    }

    /// Another first wait between webhook attempts (tests).
    pub fn with_backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }

    /// Tells `note` as `config` says: the desktop and the webhook, concurrently.
    pub async fn deliver(&self, config: &NotifyConfig, note: &Notification) {
        let desktop = async {
            if !config.desktop {
                return;
            }
            match &self.desktop {
                Some(program) => {
                    if let Err(e) = desktop(program, note).await {
                        warn!(run = %note.run, error = %e, "the desktop notification failed");
                    }
                }
                None => debug!("no notify-send on PATH: desktop notification skipped"),
            }
        };
        let webhook = async {
            let Some(raw) = &config.webhook else { return };
            let url = match config.webhook_url(raw) {
                Ok(url) => url,
                Err(e) => return warn!(run = %note.run, error = %e, "webhook not sent"),
            };
            let timeout = Duration::from_secs(config.webhook_timeout_secs);
            if let Err(e) = webhook(
                &self.http,
                &url,
                note,
                timeout,
                config.webhook_attempts,
                self.backoff,
            )
            .await
            {
                warn!(run = %note.run, host = url.host_str().unwrap_or(""), error = %e,
                    "the webhook notification was not delivered");
            }
        };
        futures::join!(desktop, webhook);
    }
}

/// Why a notification was not delivered.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("notify-send: {0}")]
    Desktop(String),
    #[error("{attempts} attempts failed; the last: {last}")]
    Webhook { attempts: u32, last: String },
}

/// `notify-send` on the daemon's `PATH`, if there is one.
pub fn find_notify_send(path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    path.into_iter()
        .flat_map(std::env::split_paths)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join("notify-send"))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The variables a desktop notification needs to reach the session, and nothing else (no
/// key, no token: invariant 10).
const DESKTOP_ENV: [&str; 7] = [
    "PATH",
    "HOME",
    "LANG",
    "DBUS_SESSION_BUS_ADDRESS",
    "XDG_RUNTIME_DIR",
    "DISPLAY",
    "WAYLAND_DISPLAY",
];

/// Runs `program` (notify-send) once, bounded by [`DESKTOP_TIMEOUT`]. The body is markup
/// to some notification servers: `&`, `<` and `>` are escaped.
pub async fn desktop(program: &Path, note: &Notification) -> Result<(), NotifyError> {
    let body = format!("{}\n{}", note.message, note.request)
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    let mut command = tokio::process::Command::new(program);
    command
        .arg("--app-name=flotilla")
        .arg("--")
        .arg(&note.title)
        .arg(body)
        .env_clear()
        .envs(
            DESKTOP_ENV
                .iter()
                .filter_map(|k| Some((*k, std::env::var_os(k)?))),
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    let status = tokio::time::timeout(DESKTOP_TIMEOUT, async { command.status().await })
        .await
        .map_err(|_| {
            NotifyError::Desktop(format!("no answer within {} s", DESKTOP_TIMEOUT.as_secs()))
        })?
        .map_err(|e| NotifyError::Desktop(e.to_string()))?;
    if status.success() {
        Ok(())
    } else {
        Err(NotifyError::Desktop(status.to_string()))
    }
}

/// POSTs `note` as JSON to `url`, up to `attempts` times while it fails (no answer within
/// `timeout`, or a status other than 2xx), waiting `backoff`, then twice that, … between.
/// The answer's body is not read.
pub async fn webhook(
    http: &reqwest::Client,
    url: &url::Url,
    note: &Notification,
    timeout: Duration,
    attempts: u32,
    backoff: Duration,
) -> Result<(), NotifyError> {
    let body = serde_json::to_vec(note).map_err(|e| NotifyError::Webhook {
        attempts: 0,
        last: e.to_string(),
    })?;
    let mut wait = backoff;
    let mut last = String::new();
    for attempt in 1..=attempts.max(1) {
        let sent = http
            .post(url.clone())
            .timeout(timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(answer) if answer.status().is_success() => return Ok(()),
            Ok(answer) => last = format!("the webhook answered {}", answer.status()),
            // Without the URL: it may hold a secret.
            Err(e) => last = describe(&e, timeout),
        }
        if attempt < attempts {
            tokio::time::sleep(wait).await;
            wait = wait.saturating_mul(2);
        }
    }
    Err(NotifyError::Webhook { attempts, last })
}

fn describe(e: &reqwest::Error, timeout: Duration) -> String {
    if e.is_timeout() {
        format!("no answer within {} s", timeout.as_secs())
    } else if e.is_connect() {
        "cannot connect".into()
    } else {
        "the request failed".into()
    }
}

/// Starts the notifier: it follows `hub` until `shutdown`.
pub fn spawn(
    hub: &broadcast::Sender<Event>,
    journal: SqliteJournal,
    delivery: Delivery,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let live = hub.subscribe();
    let (tx, rx) = mpsc::channel(1024);
    let started_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    tokio::spawn(filter(live, tx, shutdown.clone()));
    tokio::spawn(tell(rx, journal, delivery, started_ms, shutdown))
}

/// What the filter hands on: an event that tells something, or word that some were lost.
enum Found {
    Event(Box<Event>),
    Lagged,
}

/// Receives every event and keeps the few that tell something. Awaits nothing but the hub
/// and a slot in the queue, so that it keeps up with the hub.
async fn filter(
    mut live: broadcast::Receiver<Event>,
    tx: mpsc::Sender<Found>,
    shutdown: CancellationToken,
) {
    loop {
        let received = tokio::select! {
            r = live.recv() => r,
            _ = shutdown.cancelled() => return,
        };
        let found = match received {
            Ok(e) if e.seq > 0 && classify(&e).is_some() => Found::Event(Box::new(e)),
            Ok(_) => continue,
            Err(broadcast::error::RecvError::Lagged(n)) => {
                warn!(
                    missed = n,
                    "notifications fell behind the events; reading the journal"
                );
                Found::Lagged
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if tx.send(found).await.is_err() {
            return;
        }
    }
}

/// Reads each run's `[notify]` (once) and starts a delivery per notification.
async fn tell(
    mut rx: mpsc::Receiver<Found>,
    journal: SqliteJournal,
    delivery: Delivery,
    started_ms: u64,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(MAX_DELIVERIES));
    // The seq of the last event told per run, and the run's config and request.
    let mut told: HashMap<RunId, u64> = HashMap::new();
    let mut configs: HashMap<RunId, Option<Arc<(NotifyConfig, String)>>> = HashMap::new();
    loop {
        let found = tokio::select! {
            f = rx.recv() => f,
            _ = shutdown.cancelled() => return,
        };
        let events = match found {
            None => return,
            Some(Found::Event(e)) => vec![*e],
            Some(Found::Lagged) => missed(&journal, &told, started_ms).await,
        };
        for event in events {
            let last = told.entry(event.run).or_insert(0);
            if event.seq <= *last {
                continue;
            }
            *last = event.seq;
            let Some((what, task, message)) = classify(&event) else {
                continue;
            };
            // A finished run tells nothing more: its config goes. Its last seq stays (a
            // number per run), so that reading the journal again never tells it twice.
            let finished = matches!(event.kind, EventKind::RunFinished { .. });
            let settings = match configs.get(&event.run) {
                Some(s) => s.clone(),
                None => {
                    let s = notify_config(&journal, event.run).await;
                    configs.insert(event.run, s.clone());
                    s
                }
            };
            if finished {
                configs.remove(&event.run);
            }
            let Some(settings) = settings else { continue };
            let (config, request) = &*settings;
            if !config.wants(what) {
                continue;
            }
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                warn!(run = %event.run, "too many notifications under way; one dropped");
                continue;
            };
            let note = Notification::new(&event, what, task, &message, request);
            info!(run = %event.run, event = note.event, "notifying");
            let delivery = delivery.clone();
            let config = config.clone();
            tokio::spawn(async move {
                delivery.deliver(&config, &note).await;
                drop(slot);
            });
        }
    }
}

/// A run's `[notify]` and request, from its journaled config; `None` when it tells nothing.
async fn notify_config(journal: &SqliteJournal, run: RunId) -> Option<Arc<(NotifyConfig, String)>> {
    let record = match journal.run(run).await {
        Ok(Some(record)) => record,
        Ok(None) => return None,
        Err(e) => {
            warn!(run = %run, error = %e, "cannot read the run's config; no notification");
            return None;
        }
    };
    let config: RunConfig = serde_json::from_value(record.config).ok()?;
    let notify = config.notify;
    (notify.desktop || notify.webhook.is_some()).then(|| Arc::new((notify, record.request)))
}

/// After the hub dropped events: what the journal holds that tells something and was not
/// told, for the runs told before (from their last told event) and the runs created since
/// the daemon started; never anything from before it started.
async fn missed(
    journal: &SqliteJournal,
    told: &HashMap<RunId, u64>,
    started_ms: u64,
) -> Vec<Event> {
    let runs = match journal.run_list().await {
        Ok(runs) => runs,
        Err(e) => {
            warn!(error = %e, "cannot list the runs; missed notifications are lost");
            return Vec::new();
        }
    };
    let mut found = Vec::new();
    for record in runs {
        let after = match told.get(&record.id) {
            Some(seq) => *seq,
            None if record.outcome.is_none() || record.created_ms >= started_ms => 0,
            None => continue,
        };
        match journal.read(record.id, after).await {
            Ok(events) => found.extend(
                events
                    .into_iter()
                    .filter(|e| e.at_ms >= started_ms && classify(e).is_some()),
            ),
            Err(e) => warn!(run = %record.id, error = %e, "cannot read the run's events"),
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind) -> Event {
        Event {
            seq: 3,
            run: RunId::generate(),
            at_ms: 5,
            kind,
        }
    }

    #[test]
    fn only_decisions_and_completed_or_failed_runs_tell_something() {
        let t1: TaskId = "t1".parse().unwrap();
        let asked = classify(&event(EventKind::AwaitingUserDecision {
            parent: t1.clone(),
        }));
        assert_eq!(
            asked.map(|(what, task, _)| (what, task)),
            Some((NotifyOn::NeedsDecision, Some(t1.clone())))
        );
        let diverged = event(EventKind::MainDiverged {
            expected: "a".into(),
            actual: "b".into(),
        });
        assert_eq!(
            classify(&diverged).map(|c| c.0),
            Some(NotifyOn::NeedsDecision)
        );
        let finished = |outcome| {
            classify(&event(EventKind::RunFinished {
                outcome,
                reason: Some("budget exhausted".into()),
            }))
        };
        assert_eq!(
            finished(RunOutcome::Completed).map(|c| c.0),
            Some(NotifyOn::RunCompleted)
        );
        let failed = finished(RunOutcome::Failed).unwrap();
        assert_eq!(failed.0, NotifyOn::RunFailed);
        assert!(failed.2.contains("budget exhausted"), "{}", failed.2);
        assert_eq!(
            finished(RunOutcome::Cancelled),
            None,
            "the user cancelled it"
        );
        assert_eq!(classify(&event(EventKind::TaskReady { task: t1 })), None);
    }

    #[test]
    fn notification_text_is_short_and_inert() {
        assert_eq!(plain("a\u{1b}[2J\nb", 100), "a [2J b");
        let long = "x".repeat(MAX_TEXT_CHARS + 10);
        let cut = plain(&long, MAX_TEXT_CHARS);
        assert_eq!(cut.chars().count(), MAX_TEXT_CHARS + 1);
        assert!(cut.ends_with('…'));
        let note = Notification::new(
            &event(EventKind::PlanningFinished),
            NotifyOn::RunFailed,
            None,
            "m",
            &long,
        );
        assert!(note.title.starts_with("flotilla: run ") && note.title.ends_with(" failed"));
        assert_eq!(note.request, cut);
        let json = serde_json::to_value(&note).unwrap();
        assert_eq!(json["event"], "run_failed");
        assert!(json.get("task").is_none());
    }
}
