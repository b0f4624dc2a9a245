//! The CLI's errors: what went wrong ([`ErrorKind`], which decides the exit code), the
//! message, the chain of causes underneath it, and what to do about it (the hint). Printed
//! by [`CliError::report`] as `error: …`, one `Caused by: …` line per cause, then `hint: …`,
//! every line escaped (the daemon's messages and the causes are not flotilla's text).

use std::error::Error;
use std::fmt;
use std::fmt::Write as _;

use super::client::ClientError;
use crate::text_safety::terminal_safe;

/// Exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Ok = 0,
    /// The run failed or was cancelled.
    RunUnsuccessful = 1,
    /// Bad usage or input (clap uses 2 too).
    Usage = 2,
    DaemonNotRunning = 3,
    /// Anything else.
    Failure = 4,
    /// Stopped by Ctrl-C (128 + SIGINT, as shells report it).
    Interrupted = 130,
}

/// What kind of failure an error is: it decides the exit code and whether anything is said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad usage or input: a flag, an id, a request the daemon refused (exit 2).
    User,
    /// A configuration file or the daemon's token that does not load (exit 2).
    Config,
    /// No daemon answers where it was looked for (exit 3).
    DaemonUnreachable,
    /// Anything else: the daemon failed, the transport broke, output could not be written
    /// (exit 4).
    Internal,
    /// Stopped by Ctrl-C, which was already said (exit 130, nothing printed).
    Interrupted,
    /// Standard output was closed by its reader: stop, print nothing, exit 0.
    OutputClosed,
}

impl ErrorKind {
    pub fn exit(self) -> Exit {
        match self {
            ErrorKind::User | ErrorKind::Config => Exit::Usage,
            ErrorKind::DaemonUnreachable => Exit::DaemonNotRunning,
            ErrorKind::Internal => Exit::Failure,
            ErrorKind::Interrupted => Exit::Interrupted,
            ErrorKind::OutputClosed => Exit::Ok,
        }
    }
}

type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// Where the causes come from.
#[derive(Debug)]
enum Cause {
    None,
    /// The first cause under the message.
    Source(BoxError),
    /// The error itself: its text is the message, its sources are the causes.
    Whole(BoxError),
}

/// A user-facing error: its kind, what went wrong, why, and what to do about it.
#[derive(Debug)]
pub struct CliError {
    kind: ErrorKind,
    message: String,
    cause: Cause,
    hint: Option<String>,
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for CliError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match &self.cause {
            Cause::None => None,
            Cause::Source(e) => Some(e.as_ref()),
            Cause::Whole(e) => e.source(),
        }
    }
}

impl CliError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        CliError {
            kind,
            message: message.into(),
            cause: Cause::None,
            hint: None,
        }
    }

    pub fn user(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::User, message)
    }

    pub fn config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Config, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// An error whose own text is the message and whose sources are the causes.
    pub fn wrap(kind: ErrorKind, error: impl Into<BoxError>) -> Self {
        let error = error.into();
        CliError {
            kind,
            message: error.to_string(),
            cause: Cause::Whole(error),
            hint: None,
        }
    }

    /// Standard output was closed by its reader: stop, print nothing, exit 0.
    pub fn output_closed() -> Self {
        Self::new(ErrorKind::OutputClosed, "")
    }

    /// Following was stopped by Ctrl-C (which said so itself).
    pub fn interrupted() -> Self {
        Self::new(ErrorKind::Interrupted, "")
    }

    /// `error` is why this happened.
    pub fn because(mut self, error: impl Into<BoxError>) -> Self {
        self.cause = Cause::Source(error.into());
        self
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn hint_text(&self) -> Option<&str> {
        self.hint.as_deref()
    }

    pub fn exit(&self) -> Exit {
        self.kind.exit()
    }

    /// Whether there is nothing to report (closed output, Ctrl-C).
    pub fn is_quiet(&self) -> bool {
        matches!(self.kind, ErrorKind::OutputClosed | ErrorKind::Interrupted)
    }

    /// The causes under the message, outermost first. Many errors say their source in
    /// their own text as well (`cannot read {path}: {source}`): a cause the line above
    /// already says is not said again.
    pub fn causes(&self) -> Vec<String> {
        let mut causes = Vec::new();
        let mut above = self.message.clone();
        let mut next = self.source();
        while let Some(cause) = next {
            let text = cause.to_string();
            if !above.contains(&text) {
                causes.push(text.clone());
            }
            above = text;
            next = cause.source();
        }
        causes
    }

    /// What the CLI prints: `error: …`, a `Caused by: …` line per cause, `hint: …`; each
    /// one line, escaped.
    pub fn report(&self) -> String {
        let mut out = format!("error: {}\n", terminal_safe(&self.message));
        for cause in self.causes() {
            let _ = writeln!(out, "Caused by: {}", terminal_safe(&cause));
        }
        if let Some(hint) = &self.hint {
            let _ = writeln!(out, "hint: {}", terminal_safe(hint));
        }
        out
    }
}

impl From<ClientError> for CliError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::DaemonNotRunning { .. } => CliError::wrap(ErrorKind::DaemonUnreachable, e)
                .hint(
                    "start it with `flotilla daemon` (in another terminal, or in the background)",
                ),
            ClientError::Api {
                status,
                ref message,
            } => {
                let hint = api_hint(status, message);
                let kind = if status.is_client_error() {
                    ErrorKind::User
                } else {
                    ErrorKind::Internal
                };
                let error = CliError::wrap(kind, e);
                match hint {
                    Some(hint) => error.hint(hint),
                    None => error,
                }
            }
            other => CliError::wrap(ErrorKind::Internal, other),
        }
    }
}

/// What to do about a common API error, when there is something to say.
fn api_hint(status: hyper::StatusCode, message: &str) -> Option<&'static str> {
    use hyper::StatusCode as S;
    match status {
        S::NOT_FOUND if message.starts_with("no run matches") => {
            Some("see `flotilla runs` for the runs this daemon knows")
        }
        S::BAD_REQUEST if message.contains("is not a run id") => Some(
            "a run id is what `submit --detach` printed (or any unique prefix of it); see `flotilla runs`",
        ),
        S::CONFLICT if message.contains("matches") && message.contains("runs:") => {
            Some("give more of the id; `flotilla runs` prints prefixes that are unique")
        }
        S::UNAUTHORIZED => {
            Some("the token is read from <state-dir>/token: use the same --state-dir as the daemon")
        }
        S::SERVICE_UNAVAILABLE => Some("the daemon is busy or restarting a run; try again shortly"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use hyper::StatusCode;

    use super::*;
    use crate::cli::render::test_support::{HOSTILE, assert_safe};

    #[test]
    fn a_wrong_token_or_a_busy_daemon_says_what_to_do() {
        let hint = |status, message: &str| {
            CliError::from(ClientError::Api {
                status,
                message: message.into(),
            })
            .hint_text()
            .unwrap_or_default()
            .to_string()
        };
        assert!(
            hint(StatusCode::UNAUTHORIZED, "missing or wrong bearer token")
                .contains("same --state-dir as the daemon")
        );
        assert!(
            hint(StatusCode::SERVICE_UNAVAILABLE, "too many connections")
                .contains("try again shortly")
        );
    }

    #[test]
    fn error_lines_escape_the_daemons_message_and_stay_two_lines() {
        let text = CliError::user(format!("{HOSTILE}\nhint: forged"))
            .hint(HOSTILE)
            .report();
        assert_safe(&text, true);
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(text.starts_with("error: ok"));
    }

    #[derive(Debug, thiserror::Error)]
    #[error("reading {path}")]
    struct Reading {
        path: &'static str,
        #[source]
        source: std::io::Error,
    }

    /// Issue 21 item 6: the cause chain survives to the report, a line per cause, escaped,
    /// and the kind keeps the exit code.
    #[test]
    fn every_cause_gets_its_line_and_the_kind_its_exit_code() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, format!("gone {HOSTILE}"));
        let error = CliError::config("the run's config does not load")
            .because(Reading {
                path: "flotilla.toml",
                source: io,
            })
            .hint("pass --config");
        assert_eq!(error.exit(), Exit::Usage);
        assert_eq!(
            error.causes(),
            vec![
                "reading flotilla.toml".to_string(),
                format!("gone {HOSTILE}")
            ]
        );
        let text = error.report();
        assert_safe(&text, true);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(lines[0], "error: the run's config does not load");
        assert_eq!(lines[1], "Caused by: reading flotilla.toml");
        assert!(
            lines[2].starts_with("Caused by: gone ok\\x1b]0;pwned"),
            "{text}"
        );
        assert_eq!(lines[3], "hint: pass --config");
        // A wrapped error is the message itself: its sources are the causes.
        let wrapped = CliError::wrap(
            ErrorKind::Internal,
            Reading {
                path: "x",
                source: std::io::Error::other("disk"),
            },
        );
        assert_eq!(wrapped.report(), "error: reading x\nCaused by: disk\n");
        assert_eq!(wrapped.exit(), Exit::Failure);
        for (kind, exit) in [
            (ErrorKind::User, Exit::Usage),
            (ErrorKind::DaemonUnreachable, Exit::DaemonNotRunning),
            (ErrorKind::Interrupted, Exit::Interrupted),
            (ErrorKind::OutputClosed, Exit::Ok),
        ] {
            assert_eq!(kind.exit(), exit);
        }
        assert!(CliError::output_closed().is_quiet() && CliError::interrupted().is_quiet());
    }

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read {path}: {source}")]
    struct SaysItsSource {
        path: &'static str,
        #[source]
        source: std::io::Error,
    }

    /// An error that says its source in its own text does not get it said twice.
    #[test]
    fn a_cause_the_line_above_says_is_not_repeated() {
        let error = CliError::wrap(
            ErrorKind::Config,
            SaysItsSource {
                path: "flotilla.toml",
                source: std::io::Error::other("disk on fire"),
            },
        );
        assert!(error.causes().is_empty());
        assert_eq!(
            error.report(),
            "error: cannot read flotilla.toml: disk on fire\n"
        );
    }
}
