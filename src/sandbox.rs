//! The run's sandbox (ADR-015): one policy, taken from `[sandbox]` in the run's
//! configuration, that the process runner applies to every command it starts for a task —
//! agent CLIs, the built-in agent's `run_command`, scripted `run` steps, verification
//! commands, the merge gate and the Reconciler's sweeps.
//!
//! With `mode = "bwrap"` (the default) a command runs under bubblewrap: the root file
//! system read-only; the daemon's state directory (journal, socket, token, every attempt's
//! workspace), the user's checkout, `$HOME`, `/run` and `/tmp` hidden behind empty tmpfs;
//! the user's `.git` shown back read-only (so git in a linked worktree reads); the command's
//! own working directory bound back writable; its own user, PID, IPC, UTS and (unless it
//! asked for it) network namespaces; killed with its runner; and resource limits set
//! before it starts. With `mode = "none"` commands run as the daemon's user, which the
//! configuration has to say on purpose.
//!
//! `allow_tcp_ports` narrows the network of a command that has it (an agent with
//! `sandbox = "network"`, or every command under `mode = "none"`) to TCP connections to the
//! listed ports: a Landlock ruleset (ABI 4, Linux 6.7+) the child enters before exec. By
//! port only, loopback included; refused, not skipped, where Landlock cannot enforce it.
//!
//! `SandboxConfig` resolves to a `SandboxPolicy`: the bwrap profile, the rlimits every command
//! of a run gets, and the Landlock TCP port allow-list.

use std::ffi::OsString;
use std::fmt;
use std::os::fd::{OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::daemon_mark::DaemonMark;

/// What to install when no sandbox can be set up.
pub const INSTALL_HINT: &str = "install bubblewrap (`apt-get install bubblewrap`), or set \
     [sandbox] mode = \"none\" in flotilla.toml to run agents and gate commands unsandboxed \
     on purpose (docs/security.md)";

/// `[sandbox]`: the run's sandbox. Also accepted as a plain string, `sandbox = "none"`
/// (or `"bwrap"`), for the mode with the default limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SandboxConfig {
    pub mode: SandboxMode,
    /// Host paths shown read-only inside (absolute, or `~/…`): what an agent CLI needs of
    /// the hidden home directory, say `~/.claude`.
    pub read_only: Vec<String>,
    /// Host paths shown writable inside (absolute, or `~/…`). Everything listed here is
    /// within reach of every agent: list as little as possible.
    pub writable: Vec<String>,
    /// Host paths hidden inside behind an empty directory (absolute, or `~/…`), besides
    /// the ones always hidden: what no command of the run may read, say an evaluation's
    /// acceptance tests or a directory of secrets outside the home directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hidden: Vec<String>,
    /// The most processes a command may have at once (`RLIMIT_NPROC`, counted inside the
    /// sandbox's own user namespace).
    pub max_processes: u64,
    /// The most private memory one process may map, in MiB (`RLIMIT_DATA`).
    pub max_memory_mb: u64,
    /// The largest file a command may write, in MiB (`RLIMIT_FSIZE`).
    pub max_file_mb: u64,
    /// The most CPU time one process may use, in seconds (`RLIMIT_CPU`).
    pub max_cpu_secs: u64,
    /// The TCP ports a command with the host's network (an agent with
    /// `sandbox = "network"`; every command under `mode = "none"`) may connect to, on any
    /// host, loopback included; `None`: every port. Enforced by Landlock (Linux 6.7 or
    /// later); where Landlock cannot, such a command is refused rather than let through.
    /// By port only: host names cannot be told apart (a proxy can: docs/security.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_tcp_ports: Option<Vec<u16>>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            mode: SandboxMode::Bwrap,
            read_only: Vec::new(),
            writable: Vec::new(),
            hidden: Vec::new(),
            max_processes: 2048,
            max_memory_mb: 16 * 1024,
            max_file_mb: 16 * 1024,
            max_cpu_secs: 4 * 3600,
            allow_tcp_ports: None,
        }
    }
}

/// The table form, as written.
#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct SandboxTable {
    mode: SandboxMode,
    read_only: Vec<String>,
    writable: Vec<String>,
    hidden: Vec<String>,
    max_processes: u64,
    max_memory_mb: u64,
    max_file_mb: u64,
    max_cpu_secs: u64,
    allow_tcp_ports: Option<Vec<u16>>,
}

impl Default for SandboxTable {
    fn default() -> Self {
        let d = SandboxConfig::default();
        SandboxTable {
            mode: d.mode,
            read_only: d.read_only,
            writable: d.writable,
            hidden: d.hidden,
            max_processes: d.max_processes,
            max_memory_mb: d.max_memory_mb,
            max_file_mb: d.max_file_mb,
            max_cpu_secs: d.max_cpu_secs,
            allow_tcp_ports: d.allow_tcp_ports,
        }
    }
}

impl<'de> Deserialize<'de> for SandboxConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = SandboxConfig;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a [sandbox] table, or \"bwrap\" or \"none\"")
            }

            fn visit_str<E: serde::de::Error>(self, mode: &str) -> Result<Self::Value, E> {
                let mode = SandboxMode::deserialize(serde::de::value::StrDeserializer::new(mode))?;
                Ok(SandboxConfig {
                    mode,
                    ..SandboxConfig::default()
                })
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                let t =
                    SandboxTable::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(SandboxConfig {
                    mode: t.mode,
                    read_only: t.read_only,
                    writable: t.writable,
                    hidden: t.hidden,
                    max_processes: t.max_processes,
                    max_memory_mb: t.max_memory_mb,
                    max_file_mb: t.max_file_mb,
                    max_cpu_secs: t.max_cpu_secs,
                    allow_tcp_ports: t.allow_tcp_ports,
                })
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxMode {
    /// bubblewrap; refused where it is missing or cannot set up its namespaces.
    #[default]
    Bwrap,
    /// No sandbox: every command sees what the daemon's user sees.
    None,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxConfigError {
    #[error("sandbox.{0} = 0: it must be at least 1")]
    Zero(&'static str),
    #[error("sandbox.{field} names {path:?}: give an absolute path or one starting with ~/")]
    RelativePath { field: &'static str, path: String },
    #[error("sandbox.{field} names {path:?}: the whole file system cannot be exposed")]
    Root { field: &'static str, path: String },
    #[error("sandbox.allow_tcp_ports names port 0: no connection goes to port 0")]
    PortZero,
}

impl SandboxConfig {
    pub fn validate(&self) -> Result<(), SandboxConfigError> {
        for (name, value) in [
            ("max_processes", self.max_processes),
            ("max_memory_mb", self.max_memory_mb),
            ("max_file_mb", self.max_file_mb),
            ("max_cpu_secs", self.max_cpu_secs),
        ] {
            if value == 0 {
                return Err(SandboxConfigError::Zero(name));
            }
        }
        if self.allow_tcp_ports.iter().flatten().any(|&port| port == 0) {
            return Err(SandboxConfigError::PortZero);
        }
        for (field, paths) in [
            ("read_only", &self.read_only),
            ("writable", &self.writable),
            ("hidden", &self.hidden),
        ] {
            for path in paths {
                if !(path.starts_with('/') || path.starts_with("~/")) {
                    return Err(SandboxConfigError::RelativePath {
                        field,
                        path: path.clone(),
                    });
                }
                if Path::new(path) == Path::new("/") {
                    return Err(SandboxConfigError::Root {
                        field,
                        path: path.clone(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// The limits set on every command (before bwrap starts, so they hold for all it runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceLimits {
    pub processes: u64,
    pub memory_bytes: u64,
    pub file_bytes: u64,
    pub cpu_secs: u64,
}

impl ResourceLimits {
    fn of(config: &SandboxConfig) -> Self {
        let mib = |n: u64| n.saturating_mul(1024 * 1024);
        ResourceLimits {
            processes: config.max_processes,
            memory_bytes: mib(config.max_memory_mb),
            file_bytes: mib(config.max_file_mb),
            cpu_secs: config.max_cpu_secs,
        }
    }

    /// Applies the limits to the calling process. Runs between fork and exec: only
    /// async-signal-safe calls (setrlimit, prctl).
    pub(crate) fn apply(&self) -> std::io::Result<()> {
        set_rlimit(libc::RLIMIT_CORE, 0)?;
        set_rlimit(libc::RLIMIT_NPROC, self.processes)?;
        set_rlimit(libc::RLIMIT_DATA, self.memory_bytes)?;
        set_rlimit(libc::RLIMIT_FSIZE, self.file_bytes)?;
        set_rlimit(libc::RLIMIT_CPU, self.cpu_secs)?;
        Ok(())
    }
}

/// Lowers a limit (soft and hard) to `value`, never raising one that is already lower.
fn set_rlimit(resource: libc::__rlimit_resource_t, value: u64) -> std::io::Result<()> {
    let mut current = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write and read only the struct we pass.
    unsafe {
        if libc::getrlimit(resource, &mut current) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let value = value as libc::rlim_t;
        let new = libc::rlimit {
            rlim_cur: value.min(current.rlim_max),
            rlim_max: value.min(current.rlim_max),
        };
        if libc::setrlimit(resource, &new) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The policy a runner applies to each command: the configuration, resolved against the
/// run's state directory, repository and the daemon's home.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPolicy {
    pub mode: SandboxMode,
    /// Hidden behind an empty tmpfs, shallowest first.
    hide: Vec<PathBuf>,
    /// The home directory: its tmpfs stays writable (a scratch home); the other hidden
    /// directories' are made read-only once what is shown through them is bound, so that
    /// a write into the user's checkout fails instead of vanishing.
    home: Option<PathBuf>,
    /// Shown back read-only after the hiding.
    read_only: Vec<PathBuf>,
    /// Shown back writable after that.
    writable: Vec<PathBuf>,
    /// `[sandbox] hidden`: hidden again after everything is shown, so that what the user
    /// hid stays hidden under a path shown read-only or writable.
    hidden: Vec<PathBuf>,
    /// What the run hides whatever the configuration shows: the daemon's paths and the
    /// user's checkout, and the checkout's `.git`, shown read-only. Hidden (and `.git`
    /// shown read-only) again after a `writable` path that holds one of them.
    run_hidden: Vec<PathBuf>,
    repo_git: Option<PathBuf>,
    pub limits: ResourceLimits,
    /// The only TCP ports a command with the host's network may connect to (`None`: all).
    pub allow_tcp_ports: Option<Vec<u16>>,
    /// Python virtual environments whose `bin` is on the daemon's `PATH` under the home
    /// directory: shown read-only when they hold a `pyvenv.cfg` (their `lib` is where their
    /// tools' code is; showing only `bin` starts a CLI that cannot import itself).
    venvs: Vec<PathBuf>,
    /// The daemon's mark, put in bwrap's environment (not the command's) or, unsandboxed,
    /// the command's: what the next daemon ends if this one dies (`process::left_behind`).
    pub mark: Option<DaemonMark>,
}

impl Default for SandboxPolicy {
    /// bwrap with the default limits, hiding the home directory: a runner that knows no
    /// run (tests, benches) still confines its commands.
    fn default() -> Self {
        SandboxPolicy::new(&SandboxConfig::default(), &[], None)
    }
}

impl SandboxPolicy {
    /// A run's policy: hides `daemon_paths` (the state directory, the socket) and `repo`'s
    /// work tree besides the defaults.
    pub fn for_run(config: &SandboxConfig, daemon_paths: &[PathBuf], repo: &Path) -> Self {
        SandboxPolicy::new(config, daemon_paths, Some(repo))
    }

    fn new(config: &SandboxConfig, daemon_paths: &[PathBuf], repo: Option<&Path>) -> Self {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|h| h.is_absolute() && h != Path::new("/"));
        let mut hide: Vec<PathBuf> = Vec::new();
        let mut read_only: Vec<PathBuf> = Vec::new();
        // `/run` holds other users' and services' sockets (the user's ssh and gpg agents,
        // docker's): a socket on a read-only mount still accepts connections.
        hide.push("/run".into());
        read_only.push("/run/systemd/resolve".into());
        if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
            hide.push(runtime);
        }
        let mut venvs = Vec::new();
        if let Some(home) = &home {
            hide.push(home.clone());
            read_only.extend(toolchain_dirs(home));
            if let Some(path) = std::env::var_os("PATH") {
                venvs = venv_candidates(home, &path);
            }
        }
        hide.extend(daemon_paths.iter().cloned());
        let mut run_hidden: Vec<PathBuf> = daemon_paths.to_vec();
        if let Some(repo) = repo {
            hide.push(repo.to_path_buf());
            read_only.push(repo.join(".git"));
            run_hidden.push(repo.to_path_buf());
        }
        run_hidden.retain(|p| p.is_absolute() && p != Path::new("/"));
        let expand = |p: &String| match (p.strip_prefix("~/"), &home) {
            (Some(rest), Some(home)) => Some(home.join(rest)),
            (Some(_), None) => None,
            (None, _) => Some(PathBuf::from(p)),
        };
        let hidden: Vec<PathBuf> = config
            .hidden
            .iter()
            .filter_map(expand)
            .filter(|p| p.is_absolute() && p != Path::new("/"))
            .collect();
        hide.extend(hidden.iter().cloned());
        hide.retain(|p| p.is_absolute() && p != Path::new("/"));
        hide.sort_by_key(|p| p.components().count());
        hide.dedup();
        read_only.extend(config.read_only.iter().filter_map(expand));
        let writable = config.writable.iter().filter_map(expand).collect();
        SandboxPolicy {
            mode: config.mode,
            hide,
            home,
            read_only,
            writable,
            hidden,
            limits: ResourceLimits::of(config),
            allow_tcp_ports: config.allow_tcp_ports.clone().map(|mut ports| {
                ports.sort_unstable();
                ports.dedup();
                ports
            }),
            venvs,
            mark: None,
            run_hidden,
            repo_git: repo.map(|repo| repo.join(".git")),
        }
    }

    /// Where a sandboxed command could have put a file on the host, besides its own
    /// directory: what the policy shows writable (`[sandbox] writable`), and what it hides
    /// (the state directory with every workspace and tree, the home directory, `/run`, the
    /// user's checkout), which other runs, with other settings, may show writable.
    pub(crate) fn not_trusted_for_programs(&self) -> impl Iterator<Item = &Path> {
        // `/run` is hidden for its sockets, and no command can write it; a system's own
        // programs may be found through it (NixOS's `/run/current-system/sw/bin`).
        self.writable
            .iter()
            .chain(
                self.hide
                    .iter()
                    .filter(|p| p.as_path() != Path::new("/run")),
            )
            .chain(&self.hidden)
            .map(PathBuf::as_path)
    }

    /// The same policy, its commands carrying `mark` (the daemon's state directory's).
    pub fn marked(mut self, mark: DaemonMark) -> Self {
        self.mark = Some(mark);
        self
    }

    /// One line for `status` and the run's first event.
    pub fn describe(&self) -> String {
        let ports = match &self.allow_tcp_ports {
            None => String::new(),
            Some(ports) => format!(
                "; with the network, TCP connections only to port{} {} (Landlock)",
                if ports.len() == 1 { "" } else { "s" },
                if ports.is_empty() {
                    "none".to_string()
                } else {
                    ports
                        .iter()
                        .map(u16::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
        };
        let mode = match self.mode {
            SandboxMode::None => {
                "none: [sandbox] mode = \"none\", commands run as the daemon's user".into()
            }
            SandboxMode::Bwrap => format!(
                "bwrap: workspace writable, the rest read-only; state directory, checkout, \
                 home and /run hidden; own pid/user/ipc/uts namespaces, no network unless an \
                 agent asks; at most {} processes, {} MiB of memory per process, {} MiB per \
                 file, {} s of CPU per process",
                self.limits.processes,
                self.limits.memory_bytes / (1024 * 1024),
                self.limits.file_bytes / (1024 * 1024),
                self.limits.cpu_secs
            ),
        };
        mode + &ports
    }

    /// Whether a command that asked for the host's network (`network`) has it under this
    /// policy: every command does without the sandbox.
    pub(crate) fn gives_network(&self, network: bool) -> bool {
        network || self.mode == SandboxMode::None
    }

    /// What an agent's commands get under this policy (`asks`: the agent's
    /// `sandbox = "network"`), as its prompt says it (ADR-032).
    pub fn for_agent(&self, asks: bool) -> AgentSandbox {
        let network = match (self.gives_network(asks), &self.allow_tcp_ports) {
            (false, _) => NetworkAccess::Off,
            (true, Some(ports)) => NetworkAccess::Ports(ports.clone()),
            (true, None) => NetworkAccess::On,
        };
        AgentSandbox {
            confined: self.mode == SandboxMode::Bwrap,
            network,
        }
    }

    /// The Landlock ruleset that lets a command connect over TCP only to the allowed ports,
    /// if the policy has an allow-list: created here, in the daemon, and put in force by
    /// the child between fork and exec ([`restrict_self`]), where nothing may allocate.
    /// `Err` says why Landlock cannot do it here.
    pub(crate) fn tcp_ruleset(&self) -> Result<Option<OwnedFd>, TcpRulesetError> {
        let Some(ports) = &self.allow_tcp_ports else {
            return Ok(None);
        };
        tcp_ruleset(ports).map(Some)
    }
}

/// What an agent's commands get under the run's sandbox: what the worker's prompt says of
/// it (`{{sandbox}}`), so that it promises no confinement and no "without network access"
/// the sandbox does not give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSandbox {
    /// In bubblewrap: home hidden, all but the workspace read-only.
    pub confined: bool,
    pub network: NetworkAccess,
}

impl AgentSandbox {
    /// The words the worker's prompt says it in.
    pub fn phrase(&self) -> String {
        if self.confined {
            format!(
                "{}, with your home directory hidden and everything outside your worktree \
                 read-only",
                self.network.phrase()
            )
        } else {
            format!(
                "none ([sandbox] mode = \"none\"): commands run as the daemon's user, {}",
                self.network.phrase()
            )
        }
    }
}

/// An agent's network under the run's sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkAccess {
    Off,
    /// TCP connections to these ports only (Landlock).
    Ports(Vec<u16>),
    On,
}

impl NetworkAccess {
    pub fn phrase(&self) -> String {
        match self {
            NetworkAccess::Off => "without network access".into(),
            NetworkAccess::Ports(ports) if ports.is_empty() => {
                "with the network, but no TCP port may be connected to".into()
            }
            NetworkAccess::Ports(ports) => format!(
                "with the network, TCP connections only to port{} {}",
                if ports.len() == 1 { "" } else { "s" },
                ports
                    .iter()
                    .map(u16::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            NetworkAccess::On => "with the host's network".into(),
        }
    }
}

/// What to do where Landlock cannot filter TCP connections.
pub const LANDLOCK_HINT: &str = "sandbox.allow_tcp_ports needs Landlock's TCP rules      (Linux 6.7 or later, with Landlock among the kernel's LSMs: see `lsm=` on the kernel's      command line); on this machine, remove allow_tcp_ports to give agents that ask for the      network all of it (docs/security.md)";

/// Why Landlock cannot restrict a command's TCP connections to the allowed ports here: such
/// a command is refused (each says what to do about it).
#[derive(Debug, thiserror::Error)]
pub enum TcpRulesetError {
    #[error("Landlock cannot filter TCP connections here ({0}); {hint}", hint = LANDLOCK_HINT)]
    Refused(#[source] landlock::RulesetError),
    #[error("Landlock is not supported by this kernel; {hint}", hint = LANDLOCK_HINT)]
    Unsupported,
}

/// The process port's error is the actors crate's, which knows no Landlock: its text is what
/// it carries, into the task's failure reason and the journal.
impl From<TcpRulesetError> for flotilla_actors::ports::ProcessError {
    fn from(e: TcpRulesetError) -> Self {
        flotilla_actors::ports::ProcessError::SandboxUnavailable(e.to_string())
    }
}

/// A Landlock ruleset that handles TCP connect and allows it to `ports` only. Hard
/// requirement: a kernel that cannot enforce it is an error, never a ruleset that lets
/// everything through.
fn tcp_ruleset(ports: &[u16]) -> Result<OwnedFd, TcpRulesetError> {
    use landlock::{
        AccessNet, CompatLevel, Compatible, NetPort, Ruleset, RulesetAttr, RulesetCreatedAttr,
    };
    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessNet::ConnectTcp)
        .and_then(|r| r.create())
        .and_then(|r| {
            r.add_rules(
                ports
                    .iter()
                    .map(|&port| Ok(NetPort::new(port, AccessNet::ConnectTcp))),
            )
        })
        .map_err(TcpRulesetError::Refused)?;
    Option::<OwnedFd>::from(ruleset).ok_or(TcpRulesetError::Unsupported)
}

/// Puts the ruleset `fd` in force for the calling process and everything it starts.
/// Runs between fork and exec: two system calls, nothing allocated. `no_new_privs` is what
/// an unprivileged process needs to restrict itself (bwrap sets it anyway).
pub(crate) fn restrict_self(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: prctl and the landlock_restrict_self system call take integers only.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::syscall(libc::SYS_landlock_restrict_self, fd, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

impl SandboxPolicy {
    /// bwrap's arguments up to and including `--`, for a command in `cwd` (canonical).
    /// Paths that do not exist are left out (there is nothing to hide or show). Async: it
    /// looks at the file system.
    pub(crate) async fn bwrap_args(
        &self,
        cwd: &Path,
        program: &str,
        network: bool,
    ) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        let mut push = |parts: &[&std::ffi::OsStr]| args.extend(parts.iter().map(OsString::from));
        push(&[
            "--ro-bind".as_ref(),
            "/".as_ref(),
            "/".as_ref(),
            "--dev".as_ref(),
            "/dev".as_ref(),
            "--proc".as_ref(),
            "/proc".as_ref(),
            "--tmpfs".as_ref(),
            "/tmp".as_ref(),
        ]);
        for path in &self.hide {
            if let Some(path) = existing(path).await {
                let is_dir = tokio::fs::metadata(&path)
                    .await
                    .map(|m| m.is_dir())
                    .unwrap_or(false);
                if is_dir {
                    push(&["--tmpfs".as_ref(), path.as_os_str()]);
                } else {
                    // A socket stays connectable on a read-only mount: cover it.
                    push(&["--ro-bind".as_ref(), "/dev/null".as_ref(), path.as_os_str()]);
                }
            }
        }
        // What the run hides whatever is shown (the state directory, the checkout), real
        // paths, shallowest first; and the checkout's `.git`.
        let mut run_hidden = Vec::new();
        for path in &self.run_hidden {
            if let Some(path) = existing(path).await {
                run_hidden.push(path);
            }
        }
        run_hidden.sort_by_key(|p| p.components().count());
        let repo_git = match &self.repo_git {
            Some(git) => existing(git).await,
            None => None,
        };
        // Every path shown, read-only or writable: one that holds what the run hides shows
        // it again (a socket on a read-only mount still accepts connections).
        let mut shown = Vec::new();
        for path in &self.read_only {
            if let Some(path) = existing(path).await {
                push(&["--ro-bind".as_ref(), path.as_os_str(), path.as_os_str()]);
                shown.push(path);
            }
        }
        // A virtualenv is shown only strictly inside the home directory, as it really is
        // (a link to `~` or `/` is no virtualenv to show), and never around something the
        // policy hides (the state directory with its token and socket, the checkout): a
        // bind made now would show them again.
        let real_home = match &self.home {
            Some(home) if !self.venvs.is_empty() => existing(home).await,
            _ => None,
        };
        let mut hidden_inside = Vec::new();
        for path in self
            .hide
            .iter()
            .filter(|p| real_home.is_some() && Some(*p) != self.home.as_ref())
        {
            hidden_inside.push(existing(path).await.unwrap_or_else(|| path.clone()));
        }
        for venv in &self.venvs {
            if let (Some(home), Some(path)) = (&real_home, existing(venv).await)
                && path.starts_with(home)
                && path != *home
                && !hidden_inside.iter().any(|hidden| hidden.starts_with(&path))
                && tokio::fs::symlink_metadata(path.join("pyvenv.cfg"))
                    .await
                    .is_ok_and(|m| m.is_file())
            {
                push(&["--ro-bind".as_ref(), path.as_os_str(), path.as_os_str()]);
            }
        }
        // The program flotilla was told to run (an agent CLI by its path) stays runnable
        // wherever it lives, read-only.
        if program.starts_with('/')
            && let Some(path) = existing(Path::new(program)).await
        {
            push(&["--ro-bind".as_ref(), path.as_os_str(), path.as_os_str()]);
        }
        for path in &self.writable {
            let Some(path) = existing(path).await else {
                continue;
            };
            // Never `/` (however spelled), nor anything inside what the run hides or the
            // checkout's `.git`: those stay as the run's profile has them.
            if path == Path::new("/")
                || run_hidden
                    .iter()
                    .chain(&repo_git)
                    .any(|p| path.starts_with(p))
            {
                tracing::warn!(
                    path = %path.display(),
                    "a [sandbox] writable path inside the state directory, the checkout or its \
                     .git (or the root) is not shown"
                );
                continue;
            }
            push(&["--bind".as_ref(), path.as_os_str(), path.as_os_str()]);
            shown.push(path);
        }
        // A path shown that holds the state directory or the user's checkout (`~`,
        // `~/code`, `~/.local`) would show them again, `.git` writable with them: hidden
        // again, and `.git` read-only again, before the command's own directory is shown.
        let mut hid_again = false;
        for path in &run_hidden {
            if shown.iter().any(|shown| path.starts_with(shown)) {
                if tokio::fs::metadata(&path).await.is_ok_and(|m| m.is_dir()) {
                    push(&["--tmpfs".as_ref(), path.as_os_str()]);
                } else {
                    push(&["--ro-bind".as_ref(), "/dev/null".as_ref(), path.as_os_str()]);
                }
                hid_again = true;
            }
        }
        if hid_again && let Some(git) = &repo_git {
            push(&["--ro-bind".as_ref(), git.as_os_str(), git.as_os_str()]);
        }
        push(&["--bind".as_ref(), cwd.as_os_str(), cwd.as_os_str()]);
        // What the user hid stays hidden even under a directory shown above (not the
        // command's own directory, which it needs).
        for path in &self.hidden {
            if let Some(path) = existing(path).await
                && !cwd.starts_with(&path)
            {
                if tokio::fs::metadata(&path).await.is_ok_and(|m| m.is_dir()) {
                    push(&["--tmpfs".as_ref(), path.as_os_str()]);
                } else {
                    push(&["--ro-bind".as_ref(), "/dev/null".as_ref(), path.as_os_str()]);
                }
            }
        }
        let home = match &self.home {
            Some(home) => existing(home).await,
            None => None,
        };
        for path in &self.hide {
            if let Some(path) = existing(path).await
                && Some(&path) != home.as_ref()
                && path != cwd
                && tokio::fs::metadata(&path).await.is_ok_and(|m| m.is_dir())
            {
                push(&["--remount-ro".as_ref(), path.as_os_str()]);
            }
        }
        // Its own user namespace, as an unprivileged id: RLIMIT_NPROC is then counted for
        // the sandbox alone and enforced even when the daemon runs as root.
        let uid = match unsafe { libc::getuid() } {
            0 => 65534,
            uid => uid,
        };
        let gid = match unsafe { libc::getgid() } {
            0 => 65534,
            gid => gid,
        };
        args.extend(
            [
                "--unshare-user".to_string(),
                "--uid".into(),
                uid.to_string(),
                "--gid".into(),
                gid.to_string(),
            ]
            .map(OsString::from),
        );
        args.extend(
            [
                "--unshare-pid",
                "--unshare-ipc",
                "--unshare-uts",
                "--die-with-parent",
                "--new-session",
            ]
            .map(OsString::from),
        );
        if !network {
            args.push("--unshare-net".into());
        }
        args.push("--chdir".into());
        args.push(cwd.as_os_str().to_owned());
        args.push("--".into());
        args
    }
}

/// The toolchains under the home directory that commands need to build (rustup's
/// toolchains, cargo's binaries and package caches; not cargo's credentials), and the
/// directories of `PATH` that lie under it (where CLIs such as `claude` install).
fn toolchain_dirs(home: &Path) -> Vec<PathBuf> {
    let env_dir = |name: &str, default: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join(default))
    };
    let cargo = env_dir("CARGO_HOME", ".cargo");
    let mut dirs = vec![
        env_dir("RUSTUP_HOME", ".rustup"),
        cargo.join("bin"),
        cargo.join("registry"),
        cargo.join("git"),
    ];
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(shown_path_dirs(home, &path));
    }
    dirs.retain(|d| d != home);
    dirs.sort();
    dirs.dedup();
    dirs
}

/// The directories of `path` (a `PATH` value) under `home` that a command must see to run
/// what they hold.
fn shown_path_dirs(home: &Path, path: &std::ffi::OsStr) -> Vec<PathBuf> {
    std::env::split_paths(path)
        .filter(|d| d.is_absolute() && d.starts_with(home))
        .map(|dir| {
            // A version manager's shim (`~/.pyenv/shims/python3`) runs the manager, which
            // finds the real tool elsewhere under its root: show the whole root, or the
            // shim fails inside (exit 127) where the system's tool would have worked.
            VERSION_MANAGERS
                .iter()
                .map(|root| home.join(root))
                .find(|root| dir.starts_with(root))
                .unwrap_or(dir)
        })
        .collect()
}

/// The directories of `path` under `home` called `bin` (outside a version manager's root,
/// shown whole already), whose parent may be a Python virtual environment (`pyvenv.cfg`,
/// looked for when a command starts): `~/.venvs/aider/bin` gives `~/.venvs/aider`.
fn venv_candidates(home: &Path, path: &std::ffi::OsStr) -> Vec<PathBuf> {
    let mut venvs: Vec<PathBuf> = std::env::split_paths(path)
        .filter(|d| d.is_absolute() && d.starts_with(home) && d.file_name() == Some("bin".as_ref()))
        .filter(|d| {
            !VERSION_MANAGERS
                .iter()
                .any(|root| d.starts_with(home.join(root)))
        })
        .filter_map(|d| d.parent().map(Path::to_path_buf))
        .filter(|venv| venv != home)
        .collect();
    venvs.sort();
    venvs.dedup();
    venvs
}

/// Version managers whose commands on `PATH` need their whole root: toolchains, no
/// credentials.
const VERSION_MANAGERS: &[&str] = &[
    ".pyenv", ".rbenv", ".nodenv", ".goenv", ".asdf", ".nvm", ".volta", ".sdkman",
];

async fn existing(path: &Path) -> Option<PathBuf> {
    tokio::fs::canonicalize(path).await.ok()
}

impl fmt::Display for SandboxMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SandboxMode::Bwrap => "bwrap",
            SandboxMode::None => "none",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        sandbox: SandboxConfig,
    }

    fn parse(text: &str) -> Result<SandboxConfig, String> {
        toml::from_str::<File>(text)
            .map(|f| f.sandbox)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_sandbox_is_on_unless_the_config_says_none() {
        assert_eq!(parse("").unwrap().mode, SandboxMode::Bwrap);
        assert_eq!(parse("sandbox = \"none\"").unwrap().mode, SandboxMode::None);
        let table =
            parse("[sandbox]\nmode = \"none\"\nmax_processes = 10\nread_only = [\"~/.claude\"]")
                .unwrap();
        assert_eq!(table.mode, SandboxMode::None);
        assert_eq!(table.max_processes, 10);
        assert_eq!(table.max_cpu_secs, SandboxConfig::default().max_cpu_secs);
        assert!(parse("sandbox = \"off\"").is_err());
        let unknown = parse("[sandbox]\nnetwork = true").unwrap_err();
        assert!(unknown.contains("network"), "{unknown}");
        // What the journal keeps reads back the same.
        let json = serde_json::to_string(&table).unwrap();
        assert_eq!(serde_json::from_str::<SandboxConfig>(&json).unwrap(), table);
    }

    #[test]
    fn a_port_allow_list_is_read_checked_and_said() {
        let table = parse("[sandbox]\nallow_tcp_ports = [8765, 443, 443]").unwrap();
        assert_eq!(table.allow_tcp_ports, Some(vec![8765, 443, 443]));
        assert_eq!(table.validate(), Ok(()));
        let json = serde_json::to_string(&table).unwrap();
        assert_eq!(serde_json::from_str::<SandboxConfig>(&json).unwrap(), table);
        // Absent: every port, and a journal written before the key reads back the same.
        assert_eq!(parse("").unwrap().allow_tcp_ports, None);
        let before = serde_json::to_string(&SandboxConfig::default()).unwrap();
        assert!(!before.contains("allow_tcp_ports"), "{before}");
        assert!(parse("[sandbox]\nallow_tcp_ports = [70000]").is_err());
        let zero = parse("[sandbox]\nallow_tcp_ports = [0]").unwrap();
        assert_eq!(zero.validate(), Err(SandboxConfigError::PortZero));
        let policy = SandboxPolicy::for_run(&table, &[], Path::new("/nonexistent"));
        assert_eq!(policy.allow_tcp_ports, Some(vec![443, 8765]));
        assert!(
            policy
                .describe()
                .ends_with("TCP connections only to ports 443, 8765 (Landlock)"),
            "{}",
            policy.describe()
        );
        assert!(!SandboxPolicy::default().describe().contains("Landlock"));
        assert!(policy.gives_network(true) && !policy.gives_network(false));
    }

    #[test]
    fn impossible_settings_are_refused() {
        let zero = SandboxConfig {
            max_file_mb: 0,
            ..SandboxConfig::default()
        };
        assert_eq!(
            zero.validate(),
            Err(SandboxConfigError::Zero("max_file_mb"))
        );
        let relative = SandboxConfig {
            writable: vec!["cache".into()],
            ..SandboxConfig::default()
        };
        assert!(matches!(
            relative.validate(),
            Err(SandboxConfigError::RelativePath { .. })
        ));
        let root = SandboxConfig {
            read_only: vec!["/".into()],
            ..SandboxConfig::default()
        };
        assert!(matches!(
            root.validate(),
            Err(SandboxConfigError::Root { .. })
        ));
        assert_eq!(SandboxConfig::default().validate(), Ok(()));
    }

    #[test]
    fn the_old_per_agent_none_is_refused_naming_the_run_level_switch() {
        use flotilla_actors::ports::Sandbox;
        let none = Sandbox::try_from("none".to_string()).unwrap_err();
        assert!(
            none.contains("[sandbox]") && none.contains("mode = \"none\""),
            "{none}"
        );
        assert_eq!(
            Sandbox::try_from("network".to_string()),
            Ok(Sandbox::Network)
        );
        assert_eq!(Sandbox::default(), Sandbox::Bwrap);
    }

    #[tokio::test]
    async fn a_hidden_path_stays_hidden_under_a_path_shown_read_only() {
        let tmp = tempfile::tempdir().unwrap();
        let shown = tmp.path().canonicalize().unwrap();
        let secret = shown.join("acceptance");
        let cwd = shown.join("work");
        std::fs::create_dir_all(&secret).unwrap();
        std::fs::create_dir_all(&cwd).unwrap();
        let config = SandboxConfig {
            read_only: vec![shown.display().to_string()],
            hidden: vec![secret.display().to_string()],
            ..SandboxConfig::default()
        };
        let policy = SandboxPolicy::for_run(&config, &[], Path::new("/nonexistent"));
        let args: Vec<String> = policy
            .bwrap_args(&cwd, "sh", false)
            .await
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let last = |flag: &str, path: &Path| {
            args.windows(2)
                .rposition(|w| w[0] == flag && w[1] == path.to_string_lossy())
                .unwrap_or_else(|| panic!("no {flag} {}: {args:?}", path.display()))
        };
        assert!(
            last("--ro-bind", &shown) < last("--tmpfs", &secret),
            "{args:?}"
        );
    }

    #[test]
    fn a_virtualenvs_bin_on_path_under_home_is_a_candidate_and_home_itself_never() {
        let home = Path::new("/home/u");
        let path = std::ffi::OsString::from(
            "/home/u/.venvs/aider/bin:/home/u/bin:/usr/bin:/home/u/.pyenv/versions/3.11/bin:/home/u/.local/bin:/opt/v/bin",
        );
        assert_eq!(
            venv_candidates(home, &path),
            [
                PathBuf::from("/home/u/.local"),
                PathBuf::from("/home/u/.venvs/aider"),
            ]
        );
    }

    #[tokio::test]
    async fn a_virtualenv_on_path_is_shown_whole_read_only_and_only_if_it_is_one() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let venv = root.join("venvs/aider");
        let not_venv = root.join("local");
        let cwd = root.join("work");
        for dir in [
            venv.join("bin"),
            venv.join("lib"),
            not_venv.join("bin"),
            cwd.clone(),
        ] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(venv.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        // One holding what the policy hides (a state directory), and a link to the home
        // directory itself: neither is shown.
        let around_state = root.join("dotlocal");
        std::fs::create_dir_all(around_state.join("state/flotilla")).unwrap();
        std::fs::write(around_state.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        std::fs::write(root.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        let to_home = root.join("venvs/linked");
        std::os::unix::fs::symlink(&root, &to_home).unwrap();
        let policy = SandboxPolicy {
            venvs: vec![
                venv.clone(),
                not_venv.clone(),
                around_state.clone(),
                to_home.clone(),
            ],
            home: Some(root.clone()),
            hide: vec![root.clone(), around_state.join("state/flotilla")],
            ..SandboxPolicy::default()
        };
        let args: Vec<String> = policy
            .bwrap_args(&cwd, "aider", false)
            .await
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let bound = |path: &Path| {
            args.windows(3).any(|w| {
                w[0] == "--ro-bind"
                    && w[1] == path.to_string_lossy()
                    && w[2] == path.to_string_lossy()
            })
        };
        assert!(bound(&venv), "{args:?}");
        assert!(!bound(&not_venv), "{args:?}");
        assert!(!bound(&around_state), "{args:?}");
        assert!(!bound(&root), "{args:?}");
    }

    #[test]
    fn a_version_managers_shims_on_path_show_its_whole_root() {
        let home = Path::new("/home/u");
        let path = std::ffi::OsString::from(
            "/home/u/.pyenv/shims:/home/u/.pyenv/bin:/usr/bin:/home/u/bin:/home/u/.nvm/versions/node/v20/bin",
        );
        assert_eq!(
            shown_path_dirs(home, &path),
            [
                PathBuf::from("/home/u/.pyenv"),
                PathBuf::from("/home/u/.pyenv"),
                PathBuf::from("/home/u/bin"),
                PathBuf::from("/home/u/.nvm"),
            ]
        );
    }

    /// A run's places under one temporary directory: (it, the state directory, the
    /// checkout with its `.git`, an attempt's directory in the state directory), real paths.
    fn run_places() -> (tempfile::TempDir, [PathBuf; 4]) {
        let tmp = tempfile::tempdir().unwrap();
        let cwd = tmp.path().join("state/worktrees/run/t1-a1");
        std::fs::create_dir_all(&cwd).unwrap();
        std::fs::create_dir_all(tmp.path().join("repo/.git")).unwrap();
        let real = |p: &Path| p.canonicalize().unwrap();
        let places = [
            real(tmp.path()),
            real(&tmp.path().join("state")),
            real(&tmp.path().join("repo")),
            real(&cwd),
        ];
        (tmp, places)
    }

    /// The bwrap arguments of `config`'s policy for a run on `repo` with the state
    /// directory `state`, for a command in `cwd`.
    async fn run_args(
        config: &SandboxConfig,
        state: &Path,
        repo: &Path,
        cwd: &Path,
    ) -> Vec<String> {
        SandboxPolicy::for_run(config, &[state.to_path_buf()], repo)
            .bwrap_args(cwd, "sh", false)
            .await
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    /// Where `flag path` last comes in `args`.
    fn last_position(args: &[String], flag: &str, path: &Path) -> usize {
        args.windows(2)
            .rposition(|w| w[0] == flag && w[1] == path.to_string_lossy())
            .unwrap_or_else(|| panic!("no {flag} {}: {args:?}", path.display()))
    }

    #[tokio::test]
    async fn a_runs_profile_hides_the_state_dir_and_checkout_and_shows_git_read_only() {
        let (_tmp, [_, state, repo, cwd]) = run_places();
        let policy = SandboxPolicy::for_run(
            &SandboxConfig::default(),
            std::slice::from_ref(&state),
            &repo,
        );
        let args = run_args(&SandboxConfig::default(), &state, &repo, &cwd).await;
        let at = |flag: &str, path: &Path| {
            args.windows(2)
                .position(|w| w[0] == flag && w[1] == path.to_string_lossy())
                .unwrap_or_else(|| panic!("no {flag} {}: {args:?}", path.display()))
        };
        let hide_state = at("--tmpfs", &state);
        let hide_repo = at("--tmpfs", &repo);
        let git = at("--ro-bind", &repo.join(".git"));
        let own = at("--bind", &cwd);
        assert!(hide_state < own && hide_repo < git && git < own, "{args:?}");
        assert!(at("--remount-ro", &repo) > own);
        for flag in [
            "--unshare-net",
            "--unshare-pid",
            "--unshare-user",
            "--die-with-parent",
        ] {
            assert!(args.iter().any(|a| a == flag), "{flag}: {args:?}");
        }
        let networked = policy.bwrap_args(&cwd, "sh", true).await;
        assert!(!networked.iter().any(|a| a == "--unshare-net"));
    }

    /// A `writable` path holding the state directory and the checkout (their parent) does
    /// not show them: both hidden again after it, `.git` read-only again, and then the
    /// command's own directory.
    #[tokio::test]
    async fn a_writable_path_over_the_state_dir_and_checkout_does_not_show_them() {
        let (_tmp, [parent, state, repo, cwd]) = run_places();
        let config = SandboxConfig {
            writable: vec![parent.to_string_lossy().into_owned()],
            ..SandboxConfig::default()
        };
        let args = run_args(&config, &state, &repo, &cwd).await;
        let last = |flag: &str, path: &Path| last_position(&args, flag, path);
        let shown = last("--bind", &parent);
        let (state_again, repo_again) = (last("--tmpfs", &state), last("--tmpfs", &repo));
        let git_again = last("--ro-bind", &repo.join(".git"));
        let own = last("--bind", &cwd);
        assert!(shown < state_again && shown < repo_again, "{args:?}");
        assert!(
            repo_again < git_again && git_again < own && state_again < own,
            "{args:?}"
        );

        // A writable path beside them changes nothing of theirs.
        let beside = parent.join("cache");
        std::fs::create_dir_all(&beside).unwrap();
        let config = SandboxConfig {
            writable: vec![beside.to_string_lossy().into_owned()],
            ..SandboxConfig::default()
        };
        let args = run_args(&config, &state, &repo, &cwd).await;
        let tmpfs_state = args
            .windows(2)
            .filter(|w| w[0] == "--tmpfs" && w[1] == state.to_string_lossy())
            .count();
        assert_eq!(tmpfs_state, 1, "{args:?}");
    }

    /// A `read_only` path holding the state directory (its socket accepts connections on
    /// a read-only mount) hides it again as a writable one does; a `writable` path inside
    /// what the run hides, inside `.git`, or `/` however spelled, is not shown at all.
    #[tokio::test]
    async fn read_only_over_the_state_dir_and_writable_inside_what_is_hidden_show_nothing() {
        let (_tmp, [parent, state, repo, cwd]) = run_places();
        let config = SandboxConfig {
            read_only: vec![parent.to_string_lossy().into_owned()],
            ..SandboxConfig::default()
        };
        let args = run_args(&config, &state, &repo, &cwd).await;
        let last = |flag: &str, path: &Path| last_position(&args, flag, path);
        let shown = last("--ro-bind", &parent);
        assert!(shown < last("--tmpfs", &state) && last("--tmpfs", &state) < last("--bind", &cwd));
        assert!(shown < last("--tmpfs", &repo), "{args:?}");

        std::fs::create_dir_all(repo.join(".git/objects")).unwrap();
        let inside = [
            repo.join(".git/objects"),
            repo.join(".git"),
            state.join("worktrees"),
            PathBuf::from("/.."),
        ];
        let config = SandboxConfig {
            writable: inside
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect(),
            ..SandboxConfig::default()
        };
        let args = run_args(&config, &state, &repo, &cwd).await;
        let binds: Vec<&String> = args
            .windows(2)
            .filter(|w| w[0] == "--bind")
            .map(|w| &w[1])
            .collect();
        assert_eq!(binds, [&cwd.to_string_lossy().into_owned()], "{args:?}");
    }
}
