//! The `ProcessRunner` port on `tokio::process`: every command in its own process group, with
//! an environment built from nothing but `spec.env`, its output read as it arrives (line by
//! line to the caller's sink, and into a capture that keeps its first and last halves), and
//! the whole group killed when the command ends, however it ends.
//!
//! Nothing here blocks the caller's thread: spawning, reading, waiting and the bwrap lookup
//! are all asynchronous.
//!
//! `TokioProcessRunner` runs; `ConfinedRunner` applies a run's sandbox policy to it; wall and
//! stall limits, output capped, the group killed on a limit or a cancel and after the command
//! exits; `bwrap` where configured.

use std::ffi::OsString;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use flotilla_actors::ports::{
    CommandOutput, CommandSpec, Exit, LineSink, ProcessError, ProcessRunner, Sandbox, Stream,
};
use futures::future::BoxFuture;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

pub mod left_behind;
mod namespace;

pub use namespace::every_end_seen;
mod output;

use output::Pipe;
#[cfg(test)]
use output::{Kept, Lines};

use crate::sandbox::{INSTALL_HINT, SandboxMode, SandboxPolicy, restrict_self};

/// How long a command gets between SIGTERM and SIGKILL: enough to flush and remove its
/// temporary files, not enough to hold up a cancelled task.
const TERM_GRACE: Duration = Duration::from_secs(2);

/// How long the pipes are still read once the command has ended. The group is dead by then,
/// so this only bounds the wait for a process that left the group (its own session) while
/// holding a pipe open.
const DRAIN: Duration = Duration::from_millis(500);

/// How long to wait for the kernel to hand back a child that was sent SIGKILL. Only a child
/// stuck in the kernel takes longer; `kill_on_drop` and tokio's reaper see to it then.
const REAP: Duration = Duration::from_secs(5);

/// Runs commands as child processes of the daemon, each in the default sandbox
/// ([`SandboxPolicy::default`]: bwrap, the home directory hidden). A run's commands go
/// through a [`ConfinedRunner`] with the run's policy instead.
#[derive(Debug, Default, Clone, Copy)]
pub struct TokioProcessRunner;

impl ProcessRunner for TokioProcessRunner {
    fn run(
        &self,
        command: CommandSpec,
        cancel: CancellationToken,
        lines: Option<LineSink>,
    ) -> BoxFuture<'static, Result<CommandOutput, ProcessError>> {
        static DEFAULT: std::sync::OnceLock<Arc<SandboxPolicy>> = std::sync::OnceLock::new();
        let policy = DEFAULT
            .get_or_init(|| Arc::new(SandboxPolicy::default()))
            .clone();
        Box::pin(run(command, policy, cancel, lines))
    }
}

/// Runs commands under one sandbox policy: a run's (ADR-015).
#[derive(Debug, Clone)]
pub struct ConfinedRunner {
    policy: Arc<SandboxPolicy>,
}

impl ConfinedRunner {
    pub fn new(policy: SandboxPolicy) -> Self {
        ConfinedRunner {
            policy: Arc::new(policy),
        }
    }

    pub fn policy(&self) -> &SandboxPolicy {
        &self.policy
    }
}

impl ProcessRunner for ConfinedRunner {
    fn run(
        &self,
        command: CommandSpec,
        cancel: CancellationToken,
        lines: Option<LineSink>,
    ) -> BoxFuture<'static, Result<CommandOutput, ProcessError>> {
        Box::pin(run(command, self.policy.clone(), cancel, lines))
    }
}

/// Whether `policy`'s sandbox can be set up here: `Ok` with what is in force (for `status`
/// and the run's first event), or why not and what to install. bwrap is tried once per
/// daemon (a real sandbox around `true`), and the answer kept.
pub async fn probe(policy: &SandboxPolicy) -> Result<String, ProcessError> {
    // A port allow-list Landlock cannot enforce is refused, as a missing bwrap is: never a
    // command let through to every port.
    policy.tcp_ruleset()?;
    if policy.mode == SandboxMode::None {
        return Ok(policy.describe());
    }
    // The answer kept: the version, or the port's error (its text says what to install).
    static PROBED: tokio::sync::OnceCell<Result<String, ProcessError>> =
        tokio::sync::OnceCell::const_new();
    let probed = PROBED
        .get_or_init(|| async {
            let probe_dir = std::env::temp_dir();
            let spec = CommandSpec {
                program: "true".into(),
                args: Vec::new(),
                cwd: probe_dir,
                stdin: None,
                env: vec![(
                    "PATH".into(),
                    std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
                )],
                limits: flotilla_actors::ports::CommandLimits {
                    wall: Duration::from_secs(30),
                    stall: None,
                    output_bytes: 4096,
                },
                sandbox: Sandbox::Bwrap,
            };
            let (program, args) = invocation(&spec, &SandboxPolicy::default()).await?;
            let out = Command::new(&program)
                .args(&args)
                .env_clear()
                .envs(spec.env.iter().map(|(k, v)| (k, v)))
                .current_dir(&spec.cwd)
                .stdin(Stdio::null())
                .output();
            match timeout(spec.limits.wall, out).await {
                Ok(Ok(out)) if out.status.success() => {
                    let version = Command::new(&program).arg("--version").output().await;
                    Ok(version
                        .ok()
                        .map(|v| String::from_utf8_lossy(&v.stdout).trim().to_string())
                        .filter(|v| !v.is_empty())
                        .unwrap_or_else(|| "bwrap".into()))
                }
                Ok(Ok(out)) => Err(format!(
                    "bwrap cannot set up a sandbox here ({}: {}); {INSTALL_HINT}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )),
                Ok(Err(e)) => Err(format!("bwrap cannot start ({e}); {INSTALL_HINT}")),
                Err(_) => Err(format!("bwrap did not answer; {INSTALL_HINT}")),
            }
            .map_err(ProcessError::SandboxUnavailable)
        })
        .await;
    match probed {
        Ok(version) => Ok(format!("{version} — {}", policy.describe())),
        Err(e) => Err(e.clone()),
    }
}

/// How the wait for the command ended, before the group is cleaned up.
enum Ended {
    /// The direct child exited by itself.
    Exited(io::Result<ExitStatus>),
    /// A limit or the caller stopped it; the group still has to be killed.
    Stopped(Exit),
}

async fn run(
    mut spec: CommandSpec,
    policy: Arc<SandboxPolicy>,
    cancel: CancellationToken,
    lines: Option<LineSink>,
) -> Result<CommandOutput, ProcessError> {
    if policy.mode == SandboxMode::Bwrap {
        // A machine without a working bwrap refuses every command with what to install,
        // rather than failing each one with bwrap's own message.
        probe(&policy).await?;
    }
    // A missing working directory fails the spawn with the same "No such file or directory"
    // as a missing program; say which it was.
    let cwd_is_dir = tokio::fs::metadata(&spec.cwd)
        .await
        .map(|m| m.is_dir())
        .unwrap_or(false);
    if !cwd_is_dir {
        return Err(ProcessError::Spawn {
            program: spec.program,
            detail: format!(
                "the working directory {} does not exist",
                spec.cwd.display()
            ),
        });
    }
    let (program, mut args) = invocation(&spec, &policy).await?;
    // bwrap names its namespace's init, whose end every sandboxed command's run waits for.
    let info = match policy.mode {
        SandboxMode::Bwrap => {
            Some(namespace::info_pipe().map_err(|e| io_error(&spec.program, &e.to_string()))?)
        }
        SandboxMode::None => None,
    };
    let info_fd = info.as_ref().map(|(_, write)| write.as_raw_fd());
    if let Some(fd) = info_fd {
        args.splice(0..0, ["--info-fd".into(), fd.to_string().into()]);
    }
    // The daemon's mark, for the next daemon to end what a dead one left (left_behind.rs):
    // in bwrap's environment, which its namespace's init keeps, and not in the command's.
    let mark = policy
        .mark
        .as_ref()
        .map(crate::daemon_mark::DaemonMark::variable);
    if mark.is_some() && policy.mode == SandboxMode::Bwrap {
        args.splice(
            0..0,
            ["--unsetenv".into(), left_behind::MARK_VARIABLE.into()],
        );
    }
    // A command with the host's network gets the port allow-list, if there is one: a
    // Landlock domain it enters before exec, so bwrap and everything inside inherit it.
    let tcp_ruleset = if policy.gives_network(spec.sandbox == Sandbox::Network) {
        policy.tcp_ruleset()?
    } else {
        None
    };
    let tcp_fd = tcp_ruleset.as_ref().map(|fd| fd.as_raw_fd());

    let mut command = Command::new(&program);
    command
        .args(&args)
        .env_clear()
        .envs(spec.env.iter().map(|(name, value)| (name, value)))
        .envs(mark)
        .current_dir(&spec.cwd)
        .stdin(if spec.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        // The last resort, for the direct child only; `Group` covers the rest.
        .kill_on_drop(true);
    let limits = policy.limits;
    let unsandboxed = policy.mode == SandboxMode::None;
    let daemon = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
    // SAFETY: the closure runs between fork and exec and makes only async-signal-safe
    // calls (setrlimit, getrlimit, prctl, getppid, landlock_restrict_self), touching no
    // memory shared with the parent's other threads. The ruleset's descriptor stays open
    // in the parent until the spawn returns (`tcp_ruleset` lives past it).
    unsafe {
        command.pre_exec(move || {
            limits.apply()?;
            if let Some(fd) = tcp_fd {
                restrict_self(fd)?;
            }
            if let Some(fd) = info_fd {
                namespace::inherit(fd)?;
            }
            if unsandboxed {
                // bwrap's --die-with-parent does this for sandboxed commands: a daemon
                // killed with SIGKILL takes its commands with it.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The daemon died before the prctl: nobody would reap or stop us.
                if libc::getppid() != daemon {
                    return Err(io::Error::other("the daemon is gone"));
                }
            }
            Ok(())
        });
    }

    let start = Instant::now();
    let mut child = command.spawn().map_err(|e| match e.kind() {
        // The working directory was checked above: it is the program that is missing (or,
        // sandboxed, the bwrap found a moment ago).
        io::ErrorKind::NotFound if unsandboxed => not_found(&spec.program),
        io::ErrorKind::NotFound => {
            ProcessError::SandboxUnavailable(format!("bwrap is not installed; {INSTALL_HINT}"))
        }
        _ => ProcessError::Spawn {
            program: spec.program.clone(),
            // The OS's reason only: neither the environment nor stdin goes into the message.
            detail: e.to_string(),
        },
    })?;
    drop(tcp_ruleset);
    let (init, info_reader) = match info {
        Some((read, write)) => {
            drop(write);
            let (send, init) = tokio::sync::oneshot::channel();
            let reader = tokio::spawn(namespace::namespace_init(read, send));
            (Some(init), Some(reader))
        }
        None => (None, None),
    };
    // `process_group(0)` made the child the leader of a new group whose id is its pid.
    let Some(pgid) = child.id().and_then(|id| libc::pid_t::try_from(id).ok()) else {
        return Err(io_error(&spec.program, "the child has no process id"));
    };
    let mut group = Group { pgid, armed: true };

    // Written from inside the loops below rather than a task of its own, so that it ends
    // with this call; dropping it closes the pipe, which is how the command sees the end.
    let mut feed: Option<BoxFuture<'static, ()>> = match (spec.stdin.take(), child.stdin.take()) {
        (Some(bytes), Some(mut pipe)) => Some(Box::pin(async move {
            // A command that exits without reading all of it is not an error of ours.
            let _ = pipe.write_all(&bytes).await;
        })),
        _ => None,
    };

    let cap = spec.limits.output_bytes;
    let mut out = Pipe::new(Stream::Stdout, child.stdout.take(), cap, lines.clone());
    let mut err = Pipe::new(Stream::Stderr, child.stderr.take(), cap, lines);

    let wall_at = later(start, spec.limits.wall);
    let mut last_output = start;
    let ended = loop {
        let stall_at = spec.limits.stall.map(|stall| later(last_output, stall));
        tokio::select! {
            biased;
            () = cancel.cancelled() => break Ended::Stopped(Exit::Cancelled),
            () = sleep_until(wall_at) => break Ended::Stopped(Exit::TimedOut),
            () = sleep_until(stall_at.unwrap_or(wall_at)), if stall_at.is_some() => {
                break Ended::Stopped(Exit::Stalled)
            }
            status = child.wait() => break Ended::Exited(status),
            got = out.pump(), if out.open() => {
                if got {
                    last_output = Instant::now();
                }
            }
            got = err.pump(), if err.open() => {
                if got {
                    last_output = Instant::now();
                }
            }
            () = async {
                if let Some(writing) = feed.as_mut() {
                    writing.await
                }
            }, if feed.is_some() => feed = None,
        }
    };
    drop(feed);

    let exit = match ended {
        Ended::Exited(status) => {
            // The child is gone, but what it started in the background is still in its
            // group (`sleep 1000 &`), and would hold the pipes open.
            group.kill();
            // bwrap returns as soon as the command itself exits, while its namespace's init
            // still waits for what the command left (a `setsid` daemon): those end only
            // once the init dies of bwrap's death. Nothing of the command may still write
            // once this returns (ADR-046).
            namespace::wait_for_end(init).await;
            let status = status.map_err(|e| io_error(&spec.program, &e.to_string()))?;
            exit_of(status, !unsandboxed)
                .ok_or_else(|| io_error(&spec.program, "it ended with an unknown status"))?
        }
        Ended::Stopped(exit) => {
            group.signal(libc::SIGTERM);
            let grace_until = Instant::now() + TERM_GRACE;
            // Keep reading: a command blocked on a full pipe could not act on SIGTERM.
            let exited = loop {
                tokio::select! {
                    biased;
                    _ = child.wait() => break true,
                    () = sleep_until(grace_until) => break false,
                    _ = out.pump(), if out.open() => {}
                    _ = err.pump(), if err.open() => {}
                }
            };
            // Whether or not the child went quietly, whatever ignored SIGTERM goes now.
            group.kill();
            if !exited {
                let _ = timeout(REAP, child.wait()).await;
            }
            // bwrap went first: its namespace's processes end a moment later. Nothing of
            // the command may still write once this returns (ADR-046).
            namespace::wait_for_end(init).await;
            exit
        }
    };
    if let Some(reader) = info_reader {
        reader.abort();
    }

    let drain_until = Instant::now() + DRAIN;
    while out.open() || err.open() {
        tokio::select! {
            () = sleep_until(drain_until) => break,
            _ = out.pump(), if out.open() => {}
            _ = err.pump(), if err.open() => {}
        }
    }

    let output = CommandOutput {
        exit,
        stdout: out.finish(),
        stderr: err.finish(),
        elapsed: start.elapsed(),
    };
    if !unsandboxed && bwrap_found_no_program(&spec.program, &output) {
        let host = host_view(&spec).await;
        return Err(ProcessError::NotFound {
            program: spec.program,
            detail: format!(
                "inside the sandbox: {host}; the sandbox hides /tmp, the home directory and \
                 the state directory: show the directory that holds it with [sandbox] read_only"
            ),
        });
    }
    Ok(output)
}

/// Where the host has the program, through its links, and the interpreter its `#!` line
/// names (a venv's python is often a link into a hidden home): what the sandbox must show.
async fn host_view(spec: &CommandSpec) -> String {
    let path = spec
        .env
        .iter()
        .find(|(name, _)| name == "PATH")
        .map(|(_, value)| OsString::from(value));
    let found = if spec.program.contains('/') {
        Some(spec.cwd.join(&spec.program))
    } else {
        find_on_path(&spec.program, path).await
    };
    let Some(found) = found else {
        return "it is no longer on the daemon's PATH".into();
    };
    let real = tokio::fs::canonicalize(&found)
        .await
        .unwrap_or(found.clone());
    let mut seen = format!("the host has {}", found.display());
    if real != found {
        seen.push_str(&format!(" (a link to {})", real.display()));
    }
    let mut head = [0u8; 256];
    let read = match tokio::fs::File::open(&real).await {
        Ok(mut file) => file.read(&mut head).await.unwrap_or(0),
        Err(_) => 0,
    };
    if let Some(line) = head[..read]
        .strip_prefix(b"#!")
        .and_then(|rest| rest.split(|&b| b == b'\n').next())
        .and_then(|line| std::str::from_utf8(line).ok())
        .and_then(|line| line.split_whitespace().next())
    {
        let interpreter = PathBuf::from(line);
        let real = tokio::fs::canonicalize(&interpreter)
            .await
            .unwrap_or(interpreter.clone());
        seen.push_str(&format!(", run by {}", interpreter.display()));
        if real != interpreter {
            seen.push_str(&format!(" (a link to {})", real.display()));
        }
    }
    seen
}

/// A program found neither at its path nor on `PATH`.
fn not_found(program: &str) -> ProcessError {
    ProcessError::NotFound {
        program: program.to_string(),
        detail: if program.contains('/') {
            "at that path".into()
        } else {
            "on PATH".into()
        },
    }
}

/// Whether bwrap itself failed to start the program (the host had it, the sandbox's view
/// does not): bwrap then exits 1 having printed only `bwrap: execvp PROGRAM: No such file
/// or directory`. A command could print the same and exit 1; it would only fail its own
/// task sooner.
fn bwrap_found_no_program(program: &str, output: &CommandOutput) -> bool {
    output.exit == Exit::Code { code: 1 }
        && output.stdout.text.is_empty()
        && output.stderr.text.trim_end()
            == format!("bwrap: execvp {program}: No such file or directory")
}

/// `at + after`, or a time far enough away to never come when that does not fit.
fn later(at: Instant, after: Duration) -> Instant {
    at.checked_add(after)
        .unwrap_or_else(|| at + Duration::from_secs(100 * 365 * 24 * 3600))
}

fn io_error(program: &str, detail: &str) -> ProcessError {
    ProcessError::Io {
        program: program.to_string(),
        detail: detail.to_string(),
    }
}

/// An exit code when it exited, the signal when one ended it (one flotilla did not send: a
/// stop of ours is reported as the limit or the cancel that caused it). bwrap exits with
/// 128 + the signal that ended its command, as shells do: read back as that signal.
fn exit_of(status: ExitStatus, sandboxed: bool) -> Option<Exit> {
    status
        .code()
        .map(|code| match code {
            129..=192 if sandboxed => Exit::Signal { signal: code - 128 },
            code => Exit::Code { code },
        })
        .or_else(|| status.signal().map(|signal| Exit::Signal { signal }))
}

/// The program and arguments actually started: the command itself, or bwrap around it.
async fn invocation(
    spec: &CommandSpec,
    policy: &SandboxPolicy,
) -> Result<(OsString, Vec<OsString>), ProcessError> {
    match policy.mode {
        SandboxMode::None => Ok((
            spec.program.clone().into(),
            spec.args.iter().map(OsString::from).collect(),
        )),
        SandboxMode::Bwrap => {
            // The PATH the command will see, so that a sandbox is found exactly where the
            // command's own tools are; the daemon's PATH when the caller gave none.
            let path = spec
                .env
                .iter()
                .find(|(name, _)| name == "PATH")
                .map(|(_, value)| OsString::from(value))
                .or_else(|| std::env::var_os("PATH"));
            let Some(bwrap) = find_sandbox(path.clone(), &spec.cwd, policy).await else {
                return Err(ProcessError::SandboxUnavailable(format!(
                    "bwrap is not installed; {INSTALL_HINT}"
                )));
            };
            // A program that is not there fails here as it would unsandboxed, rather than
            // as bwrap's exit status.
            let found = if spec.program.contains('/') {
                let candidate = spec.cwd.join(&spec.program);
                tokio::fs::metadata(&candidate)
                    .await
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            } else {
                find_on_path(&spec.program, path).await.is_some()
            };
            if !found {
                return Err(not_found(&spec.program));
            }
            // bwrap binds paths as given; a relative or symlinked cwd would bind elsewhere.
            let cwd =
                tokio::fs::canonicalize(&spec.cwd)
                    .await
                    .map_err(|e| ProcessError::Spawn {
                        program: spec.program.clone(),
                        detail: format!("the working directory {}: {e}", spec.cwd.display()),
                    })?;
            let mut args = policy
                .bwrap_args(&cwd, &spec.program, spec.sandbox == Sandbox::Network)
                .await;
            args.push(spec.program.clone().into());
            args.extend(spec.args.iter().map(OsString::from));
            Ok((bwrap.into_os_string(), args))
        }
    }
}

/// The bwrap to start, from `path`'s absolute directories, as its real path: never one a
/// sandboxed command could have put there, for this run or an earlier one. Passed over: a
/// relative entry (`.`, `bin`: found from the daemon's directory but started from the
/// command's, its workspace); a PATH directory or a real path inside the command's
/// directory, a writable one or a hidden one (the state directory, home, the checkout:
/// another run may show them writable), which also catches a link planted in a writable
/// directory and pointing anywhere; and, for a daemon not run by root, a file its own user
/// owns (an agent writes as that user).
async fn find_sandbox(
    path: Option<OsString>,
    cwd: &Path,
    policy: &SandboxPolicy,
) -> Option<PathBuf> {
    let path = path?;
    let mut untrusted = Vec::new();
    for dir in std::iter::once(cwd).chain(policy.not_trusted_for_programs()) {
        untrusted.push(dir.to_path_buf());
        if let Ok(real) = tokio::fs::canonicalize(dir).await {
            untrusted.push(real);
        }
    }
    let inside = |p: &Path| untrusted.iter().any(|u| p.starts_with(u));
    // SAFETY: geteuid has no arguments and cannot fail.
    let user = unsafe { libc::geteuid() };
    for dir in std::env::split_paths(&path) {
        if !dir.is_absolute() || inside(&dir) {
            continue;
        }
        let real_dir = tokio::fs::canonicalize(&dir)
            .await
            .unwrap_or_else(|_| dir.clone());
        let Ok(real) = tokio::fs::canonicalize(dir.join("bwrap")).await else {
            continue;
        };
        if inside(&real_dir) || inside(&real) {
            continue;
        }
        if let Ok(meta) = tokio::fs::metadata(&real).await
            && meta.is_file()
            && meta.permissions().mode() & 0o111 != 0
            && (user == 0 || meta.uid() != user)
        {
            return Some(real);
        }
    }
    None
}

/// The first executable file called `name` in `path`'s directories.
async fn find_on_path(name: &str, path: Option<OsString>) -> Option<PathBuf> {
    let path = path?;
    for dir in std::env::split_paths(&path) {
        // An empty entry means the current directory, which is never where a sandbox
        // should come from.
        if dir.as_os_str().is_empty() {
            continue;
        }
        let candidate = dir.join(name);
        if let Ok(meta) = tokio::fs::metadata(&candidate).await
            && meta.is_file()
            && meta.permissions().mode() & 0o111 != 0
        {
            return Some(candidate);
        }
    }
    None
}

/// The command's process group. Dropped before it was killed (the caller dropped the
/// `run` future), it kills the group, so nothing a command started outlives `run` even
/// then.
struct Group {
    pgid: libc::pid_t,
    armed: bool,
}

impl Group {
    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) takes plain integers and touches no memory of ours. A group that
        // is already gone gives ESRCH, which is what we want anyway.
        unsafe {
            libc::kill(-self.pgid, signal);
        }
    }

    /// SIGKILL for the whole group, once: after this the group id may be reused.
    fn kill(&mut self) {
        if self.armed {
            self.signal(libc::SIGKILL);
            self.armed = false;
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capture_within_the_cap_is_all_of_it() {
        let mut kept = Kept::new(10);
        kept.push(b"hello");
        kept.push(b"world");
        let captured = kept.captured();
        assert_eq!(captured.text, "helloworld");
        assert!(!captured.truncated());
    }

    #[test]
    fn a_capture_past_the_cap_keeps_both_ends_and_says_how_much_was_cut() {
        let mut kept = Kept::new(100);
        kept.push(&[b'a'; 60]);
        for _ in 0..1000 {
            kept.push(b"0123456789");
        }
        kept.push(&[b'z'; 50]);
        let captured = kept.captured();
        assert_eq!(captured.total_bytes, 10_110);
        assert!(captured.text.starts_with(&"a".repeat(50)));
        assert!(captured.text.ends_with(&"z".repeat(50)));
        assert!(captured.text.contains("\n[… 10010 bytes cut …]\n"));
        assert!(captured.truncated());
    }

    #[test]
    fn a_stream_just_over_the_cap_still_reads_as_truncated() {
        let mut kept = Kept::new(100);
        kept.push(&[b'x'; 101]);
        let captured = kept.captured();
        assert!(captured.truncated(), "{:?}", captured.text);
        assert!(captured.text.len() <= 100 + 40);
    }

    #[test]
    fn cuts_fall_on_character_boundaries() {
        let mut kept = Kept::new(9);
        kept.push("ééééééééééé".as_bytes());
        let captured = kept.captured();
        assert!(!captured.text.contains('\u{FFFD}'), "{:?}", captured.text);
        assert!(captured.truncated());
    }

    #[test]
    fn binary_output_never_grows_past_the_cap() {
        let mut kept = Kept::new(64);
        kept.push(&[0xFF; 60]);
        let captured = kept.captured();
        assert!(captured.text.len() <= 64 + 40, "{}", captured.text.len());
    }

    #[test]
    fn an_overlong_line_arrives_cut_and_its_rest_is_skipped() {
        let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = {
            let got = got.clone();
            LineSink::new(move |_, line| got.lock().unwrap().push(line.to_string()))
        };
        let mut lines = Lines::new(Stream::Stdout, sink, 4);
        lines.push(b"ab\nabcdefgh");
        lines.push(b"ij\nxy");
        lines.finish();
        assert_eq!(*got.lock().unwrap(), ["ab", "abcd", "xy"]);
    }
}
