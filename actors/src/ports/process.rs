//! The `ProcessRunner` port: one way to run a command for everyone who needs one (the
//! built-in agent's `run_command`, external agent CLIs, a task's verification command, and
//! in M6 the merge gate and the Reconciler's sweeps).
//!
//! Every command runs in its own process group, with a wall-time limit, an optional stall
//! limit (no output for that long), a cap on the output kept, and an environment built from
//! scratch ([`scrubbed_env`]): nothing of the daemon's environment reaches a command unless
//! it is on the short list of harmless variables or named by the caller. When a limit is hit
//! or the caller cancels, the whole group is killed, so nothing a command started outlives
//! it. An exit status is not an error: [`Exit`] says how the command ended.
//!
//! Every command is sandboxed by its runner's policy (ADR-015): a [`CommandSpec`] only
//! says whether it needs the host's network ([`Sandbox`]).
//!
//! A [`CommandSpec`] holds program, cwd, stdin, the whole environment, `CommandLimits`
//! (wall, stall, output) and [`Sandbox`]; output is kept head and tail; a [`LineSink`] gets
//! output as it arrives.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// The daemon's variables that every command gets (when the daemon has them): what a
/// toolchain needs to be found and to behave, and nothing that could be a credential.
pub const PASSED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "CARGO_HOME",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
];

/// Names that look like they hold a secret. A variable with such a name is never passed,
/// even when a caller names it, unless the caller says so explicitly with
/// [`EnvPolicy::secrets`] (an external agent CLI needs its own API key).
pub fn looks_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    [
        "KEY",
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "AUTH",
        "COOKIE",
        "SESSION",
    ]
    .iter()
    .any(|word| upper.contains(word))
        || upper.starts_with("FLOTILLA")
}

/// Which of the daemon's variables a command gets besides [`PASSED_ENV`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvPolicy {
    /// Further harmless variables to pass through by name (refused if they look secret).
    #[serde(default)]
    pub pass: Vec<String>,
    /// Variables that hold a credential the command needs (an agent CLI's API key), passed
    /// through by name on purpose. Never used for the built-in agent's commands.
    #[serde(default)]
    pub secrets: Vec<String>,
}

/// The environment a command gets: [`PASSED_ENV`] and the policy's names, taken from
/// `daemon_env`; then `set` on top (flotilla's own values, such as `TERM=dumb`). A name in
/// `policy.pass` that [`looks_secret`] is dropped. Sorted by name.
pub fn scrubbed_env(
    daemon_env: impl IntoIterator<Item = (String, String)>,
    policy: &EnvPolicy,
    set: &[(String, String)],
) -> Vec<(String, String)> {
    let wanted = |name: &str| {
        PASSED_ENV.contains(&name)
            || (policy.pass.iter().any(|p| p == name) && !looks_secret(name))
            || policy.secrets.iter().any(|s| s == name)
    };
    let mut env: std::collections::BTreeMap<String, String> = daemon_env
        .into_iter()
        .filter(|(name, _)| wanted(name))
        .collect();
    for (name, value) in set {
        env.insert(name.clone(), value.clone());
    }
    env.into_iter().collect()
}

/// What one command asks of the sandbox its runner puts it in. Every command is confined
/// by the run's sandbox policy (the runner's: ADR-015); a command can only ask for the
/// host's network on top, which an agent CLI that calls its provider needs. Whether a
/// sandbox is used at all is the run's choice (`[sandbox] mode`), never a command's.
///
/// In an agent's configuration: `sandbox = "bwrap"` (the default) or
/// `sandbox = "network"`. The old `sandbox = "none"` is refused with a message that names
/// the run-level switch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", try_from = "String", into = "String")]
pub enum Sandbox {
    /// The run's sandbox, without network.
    #[default]
    Bwrap,
    /// The run's sandbox, with the host's network (the file system stays confined).
    Network,
}

impl TryFrom<String> for Sandbox {
    type Error = String;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        match name.as_str() {
            "bwrap" => Ok(Sandbox::Bwrap),
            "network" => Ok(Sandbox::Network),
            "none" => Err(
                "sandbox = \"none\" is no longer a per-agent setting: every command \
                 of a run is sandboxed by the run's [sandbox] table; set mode = \"none\" there \
                 to turn the sandbox off for the whole run (docs/security.md), or \
                 sandbox = \"network\" here to give this agent the host's network"
                    .into(),
            ),
            other => Err(format!(
                "unknown sandbox {other:?}: \"bwrap\" (the default) or \"network\""
            )),
        }
    }
}

impl From<Sandbox> for String {
    fn from(sandbox: Sandbox) -> String {
        match sandbox {
            Sandbox::Bwrap => "bwrap".into(),
            Sandbox::Network => "network".into(),
        }
    }
}

/// The limits of one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandLimits {
    /// The longest it may run.
    pub wall: Duration,
    /// The longest it may go without writing to stdout or stderr.
    pub stall: Option<Duration>,
    /// The most output kept, per stream: the first half and the last half of it.
    pub output_bytes: usize,
}

impl Default for CommandLimits {
    fn default() -> Self {
        CommandLimits {
            wall: Duration::from_secs(600),
            stall: None,
            output_bytes: 64 * 1024,
        }
    }
}

/// One command to run.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandSpec {
    /// The program, found on the scrubbed `PATH` (`sh` for a shell command line).
    pub program: String,
    pub args: Vec<String>,
    /// Where it runs (a worktree, for agents).
    pub cwd: PathBuf,
    /// Written to its stdin, which is then closed; `None` gives it an empty stdin.
    pub stdin: Option<Vec<u8>>,
    /// The whole environment: build it with [`scrubbed_env`].
    pub env: Vec<(String, String)>,
    pub limits: CommandLimits,
    pub sandbox: Sandbox,
}

impl CommandSpec {
    /// `sh -c line` in `cwd`, with the default environment policy and limits.
    pub fn shell(line: impl Into<String>, cwd: impl Into<PathBuf>) -> Self {
        CommandSpec {
            program: "sh".into(),
            args: vec!["-c".into(), line.into()],
            cwd: cwd.into(),
            stdin: None,
            env: scrubbed_env(std::env::vars(), &EnvPolicy::default(), &[]),
            limits: CommandLimits::default(),
            sandbox: Sandbox::Bwrap,
        }
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "how", rename_all = "snake_case")]
pub enum Exit {
    /// It exited by itself with this code.
    Code { code: i32 },
    /// A signal it did not get from flotilla ended it.
    Signal { signal: i32 },
    /// It ran past `limits.wall`; its process group was killed.
    TimedOut,
    /// It wrote nothing for `limits.stall`; its process group was killed.
    Stalled,
    /// The caller cancelled it; its process group was killed.
    Cancelled,
}

impl Exit {
    pub fn success(self) -> bool {
        self == Exit::Code { code: 0 }
    }

    /// The exit code, when it exited by itself.
    pub fn code(self) -> Option<i32> {
        match self {
            Exit::Code { code } => Some(code),
            _ => None,
        }
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Code { code } => write!(f, "exit code {code}"),
            Exit::Signal { signal } => write!(f, "killed by signal {signal}"),
            Exit::TimedOut => f.write_str("killed at its time limit"),
            Exit::Stalled => f.write_str("killed after writing nothing for too long"),
            Exit::Cancelled => f.write_str("cancelled"),
        }
    }
}

/// One stream's output as kept: all of it when it fit in the cap, or its first and last
/// halves around a line that says how much was cut.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// Lossy UTF-8.
    pub text: String,
    /// Bytes the stream really wrote.
    pub total_bytes: u64,
    /// Bytes of it `text` does not show (0: all of it is there).
    pub cut_bytes: u64,
}

impl Captured {
    pub fn truncated(&self) -> bool {
        self.cut_bytes > 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandOutput {
    pub exit: Exit,
    pub stdout: Captured,
    pub stderr: Captured,
    pub elapsed: Duration,
}

/// Which stream a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Receives the command's output line by line as it arrives (a line longer than the
/// output cap arrives cut): for agents whose output is a stream of events.
#[derive(Clone)]
pub struct LineSink(Arc<LineFn>);

type LineFn = dyn Fn(Stream, &str) + Send + Sync;

impl LineSink {
    pub fn new(sink: impl Fn(Stream, &str) + Send + Sync + 'static) -> Self {
        LineSink(Arc::new(sink))
    }

    pub fn line(&self, stream: Stream, line: &str) {
        (self.0)(stream, line)
    }
}

impl fmt::Debug for LineSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LineSink")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcessError {
    /// The program could not be started (not found, not executable, a bad working
    /// directory).
    #[error("cannot start {program}: {detail}")]
    Spawn { program: String, detail: String },
    /// The program is not there: not on the command's `PATH` (or not at the path given),
    /// or hidden by the sandbox. Unlike other start failures, trying again will not help
    /// until someone installs it or shows it to the sandbox; `detail` says which.
    #[error("{program}: program not found {detail}")]
    NotFound { program: String, detail: String },
    /// The run's sandbox cannot be set up on this machine (the message says what to
    /// install, or how to turn the sandbox off deliberately).
    #[error("the sandbox is not available on this machine: {0}")]
    SandboxUnavailable(String),
    #[error("while running {program}: {detail}")]
    Io { program: String, detail: String },
}

/// Runs commands. Implementations spawn asynchronously (never block the caller's thread),
/// put each command in its own process group and kill the group on a limit or a cancel.
pub trait ProcessRunner: Send + Sync + 'static {
    fn run(
        &self,
        command: CommandSpec,
        cancel: CancellationToken,
        lines: Option<LineSink>,
    ) -> BoxFuture<'static, Result<CommandOutput, ProcessError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_environment_is_built_from_an_allow_list_and_never_passes_secrets_by_accident() {
        let daemon = vars(&[
            ("PATH", "/usr/bin"),
            ("HOME", "/home/u"),
            ("OPENAI_API_KEY", "sk-1"),
            ("GITHUB_TOKEN", "ghp"),
            ("FLOTILLA_STATE_DIR", "/s"),
            ("EDITOR", "vi"),
            ("MY_SECRET", "x"),
        ]);
        let plain = scrubbed_env(daemon.clone(), &EnvPolicy::default(), &[]);
        assert_eq!(plain, vars(&[("HOME", "/home/u"), ("PATH", "/usr/bin")]));

        let policy = EnvPolicy {
            pass: vec!["EDITOR".into(), "MY_SECRET".into(), "GITHUB_TOKEN".into()],
            secrets: vec!["OPENAI_API_KEY".into()],
        };
        let env = scrubbed_env(daemon, &policy, &vars(&[("TERM", "dumb")]));
        assert_eq!(
            env,
            vars(&[
                ("EDITOR", "vi"),
                ("HOME", "/home/u"),
                ("OPENAI_API_KEY", "sk-1"),
                ("PATH", "/usr/bin"),
                ("TERM", "dumb"),
            ]),
            "a secret-looking name in `pass` is dropped; `secrets` passes on purpose"
        );
    }

    #[test]
    fn exits_say_how_the_command_ended() {
        assert!(Exit::Code { code: 0 }.success());
        assert!(!Exit::TimedOut.success());
        assert_eq!(Exit::Code { code: 3 }.code(), Some(3));
        assert_eq!(Exit::Stalled.code(), None);
        assert_eq!(Exit::Code { code: 2 }.to_string(), "exit code 2");
    }
}
