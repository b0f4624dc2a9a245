//! Configuration: `flotilla.toml` in the target repository (or `--config FILE`), and the
//! `RunConfig` the CLI sends with a run and the daemon stores in the journal, so that a run
//! resumes after a restart with exactly the configuration it started with.
//!
//! Secrets never live here: provider keys come from the environment (later issues).
//!
//! Files are read only if regular and at most 1 MiB, and errors never quote their contents.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use flotilla_actors::actors::{
    MergeConfig, MergeConfigError, PlannerConfig, PlannerConfigError, ReconcilerConfig,
    ReconcilerConfigError, SubplannerConfig, SubplannerConfigError, WorkerProfile,
};
use flotilla_actors::config::{Limits, LimitsError};
use flotilla_actors::work_check::{ChecksConfig, ChecksConfigError};

use crate::agents::builtin::{BuiltinConfig, BuiltinConfigError};
use crate::agents::command::{CommandAgentConfig, CommandAgentConfigError};
use crate::git::target::{TargetBranch, TargetBranchError};
use serde::{Deserialize, Serialize};

use crate::prompts::{PromptError, PromptOverrides, check_overrides, load_overrides};
use crate::providers::settings::{
    Price, ProviderSettings, ProviderSettingsError, ProviderSpec, RoleModels,
};
use crate::sandbox::{SandboxConfig, SandboxConfigError};
use crate::scripted::{Scenario, ScenarioError};

/// `flotilla.toml`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub provider: ProviderConfig,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub planner: PlannerConfig,
    #[serde(default)]
    pub subplanner: SubplannerConfig,
    /// What flotilla checks in every worker's branch (scope, deleted tests, verification).
    #[serde(default)]
    pub checks: ChecksConfig,
    /// The built-in agent's limits (tool calls, context, commands).
    #[serde(default)]
    pub builtin_agent: BuiltinConfig,
    /// What becomes of attempts' worktrees.
    #[serde(default)]
    pub worktrees: WorktreesConfig,
    /// How branches land on the target branch: which one (ADR-022), the mode, the gate,
    /// batching (ADR-011).
    #[serde(default)]
    pub merge: MergeConfig,
    /// The Reconciler's sweeps of main: commands and intervals (ADR-011).
    #[serde(default)]
    pub reconciler: ReconcilerConfig,
    /// External agent CLIs, by name (`[agents.claude]`): a worker profile names one with
    /// `agent = "claude"`.
    #[serde(default)]
    pub agents: BTreeMap<String, CommandAgentConfig>,
    /// Worker profiles; one general profile if none are given.
    #[serde(default)]
    pub workers: Vec<WorkerProfile>,
    /// Real models: `[providers.NAME]` endpoints (docs/configuration.md).
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderSpec>,
    /// Which `provider/model` serves each role; a role left out is scripted.
    #[serde(default)]
    pub roles: RoleModels,
    /// USD per million tokens, by `provider/model`.
    #[serde(default)]
    pub prices: BTreeMap<String, Price>,
    /// The sandbox of every command the run starts (ADR-015): `[sandbox]`, or
    /// `sandbox = "none"` to turn it off on purpose.
    #[serde(default)]
    pub sandbox: SandboxConfig,
    /// A directory (relative to this file) whose `root-planner.md`, `subplanner.md`,
    /// `worker.md` or `reconciler.md` replace the built-in prompts.
    #[serde(default)]
    pub prompts_dir: Option<PathBuf>,
}

/// `[provider]`: the scripted provider's scenario, which serves every role `[roles]` leaves
/// out, and the workers (until the built-in agent).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// `scripted` is the only kind here; real models are `[providers.NAME]`.
    #[serde(default)]
    pub kind: ProviderKind,
    /// The scenario file, relative to the config file.
    #[serde(default)]
    pub scenario: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    #[default]
    Scripted,
}

/// Everything a run needs, self-contained.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub planner: PlannerConfig,
    #[serde(default)]
    pub subplanner: SubplannerConfig,
    #[serde(default)]
    pub checks: ChecksConfig,
    #[serde(default)]
    pub builtin_agent: BuiltinConfig,
    #[serde(default)]
    pub worktrees: WorktreesConfig,
    #[serde(default)]
    pub merge: MergeConfig,
    #[serde(default)]
    pub reconciler: ReconcilerConfig,
    #[serde(default)]
    pub agents: BTreeMap<String, CommandAgentConfig>,
    #[serde(default)]
    pub workers: Vec<WorkerProfile>,
    #[serde(default)]
    pub scenario: Scenario,
    /// Real models for the roles (never keys: names of the daemon's environment variables).
    #[serde(default)]
    pub models: ProviderSettings,
    /// Prompts that replace built-in ones, by file name (read from `prompts_dir`).
    #[serde(default)]
    pub prompts: PromptOverrides,
    /// The sandbox of every command the run starts (ADR-015).
    #[serde(default)]
    pub sandbox: SandboxConfig,
    /// Where this config was read from: the config file, its scenario and its
    /// `prompts_dir`. Those inside the run's repository count as flotilla's configuration
    /// there: a task's change to them waits for the user (ADR-016).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<PathBuf>,
}

/// `[worktrees]`: what becomes of attempts' worktrees.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorktreesConfig {
    /// A failed attempt's worktree and branch stay, for someone to look at what the agent
    /// did, until `flotilla gc` (or the next daemon start) removes them. Off: they go as the
    /// attempt fails.
    pub keep_failed: bool,
}

/// The agents a worker profile may name.
pub const AGENT_KINDS: [&str; 2] = ["scripted", "builtin"];

/// Why a run's configuration cannot run, naming the part at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunConfigError {
    #[error("impossible limits: {0}")]
    Limits(#[from] LimitsError),
    #[error("impossible planner settings: {0}")]
    Planner(#[from] PlannerConfigError),
    #[error("impossible subplanner settings: {0}")]
    Subplanner(#[from] SubplannerConfigError),
    #[error("impossible checks: {0}")]
    Checks(#[from] ChecksConfigError),
    #[error("impossible built-in agent settings: {0}")]
    Builtin(#[from] BuiltinConfigError),
    #[error("impossible merge settings: {0}")]
    Merge(#[from] MergeConfigError),
    #[error("impossible merge settings: {0}")]
    TargetBranch(#[from] TargetBranchError),
    #[error("impossible reconciler settings: {0}")]
    Reconciler(#[from] ReconcilerConfigError),
    #[error(
        "worker profile {profile:?} names agent {agent:?}: the agents are \"scripted\", \"builtin\" and the [agents.NAME] tables"
    )]
    UnknownAgent { profile: String, agent: String },
    #[error(
        "worker profile {profile:?} uses the built-in agent, but no model serves the worker role: \
         add `worker = \"PROVIDER/MODEL\"` to [roles] (see docs/configuration.md)"
    )]
    BuiltinWithoutWorkerModel { profile: String },
    #[error("[agents.{name}]: {source}")]
    CommandAgent {
        name: String,
        source: CommandAgentConfigError,
    },
    #[error("[agents.{0}]: the name is the built-in agent kind's; choose another")]
    ReservedAgentName(String),
    #[error("impossible provider settings: {0}")]
    Models(#[from] ProviderSettingsError),
    #[error("the scenario: {0}")]
    Scenario(String),
    #[error("a prompt: {0}")]
    Prompt(#[from] PromptError),
    #[error("impossible sandbox settings: {0}")]
    Sandbox(#[from] SandboxConfigError),
}

/// The largest config or scenario file read. Anything bigger is refused unread.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Where and why a TOML text does not parse or does not fit its format. It names the
/// position and the problem, never the text itself: the file may be anything (a path in a
/// config can name `/etc/shadow`), and the error goes back to whoever asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TomlProblem {
    pub line: usize,
    pub column: usize,
    pub problem: String,
}

impl TomlProblem {
    pub fn new(text: &str, error: &toml::de::Error) -> Self {
        let at = error.span().map_or(0, |span| span.start.min(text.len()));
        let before = text.get(..at).unwrap_or("");
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
        TomlProblem {
            line,
            column,
            problem: without_values(error.message()),
        }
    }
}

impl fmt::Display for TomlProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {}, column {}: {}",
            self.line, self.column, self.problem
        )
    }
}

/// A parser message without the values it quotes: serde's "invalid type: string \"…\",
/// expected u64" and "unknown variant `…`, expected one of …" carry text from the file.
/// Key names (unknown or missing fields) stay: they say what to fix.
fn without_values(message: &str) -> String {
    let message = message.trim();
    for (start, what) in [
        ("invalid type:", "wrong type"),
        ("invalid value:", "invalid value"),
        ("invalid length", "wrong number of items"),
        ("unknown variant", "unknown value"),
    ] {
        if message.starts_with(start) {
            return match message.split_once(", expected ") {
                Some((_, expected)) => format!("{what}, expected {expected}"),
                None => what.to_string(),
            };
        }
    }
    message.to_string()
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a regular file; configs and scenarios must be")]
    NotAFile { path: PathBuf },
    #[error("{path} is larger than {MAX_FILE_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("{path} is not UTF-8 text")]
    NotText { path: PathBuf },
    #[error("{path} is not a valid flotilla config: {problem}")]
    Invalid { path: PathBuf, problem: TomlProblem },
    #[error("{path}: impossible limits: {source}")]
    Limits { path: PathBuf, source: LimitsError },
    #[error("{path}: impossible planner settings: {source}")]
    Planner {
        path: PathBuf,
        source: PlannerConfigError,
    },
    #[error("{path}: impossible subplanner settings: {source}")]
    Subplanner {
        path: PathBuf,
        source: SubplannerConfigError,
    },
    #[error("{path}: impossible checks: {source}")]
    Checks {
        path: PathBuf,
        source: ChecksConfigError,
    },
    #[error("{path}: {source}")]
    Run {
        path: PathBuf,
        source: RunConfigError,
    },
    #[error("{path}: impossible provider settings: {source}")]
    Models {
        path: PathBuf,
        source: ProviderSettingsError,
    },
    #[error("{path}: {source}")]
    Prompt { path: PathBuf, source: PromptError },
    #[error("{path}: {source}")]
    Scenario {
        path: PathBuf,
        source: ScenarioError,
    },
    #[error(
        "{path} names no scenario: the scripted provider needs `[provider] scenario = \"FILE\"`"
    )]
    NoScenario { path: PathBuf },
}

impl ConfigError {
    /// Where the user reads about what went wrong: the scenario guide for scenario files, the
    /// configuration reference for everything else.
    pub fn hint(&self) -> &'static str {
        match self {
            ConfigError::Scenario { .. } | ConfigError::NoScenario { .. } => {
                "see docs/scenarios.md for the scenario format, or pass --config FILE"
            }
            _ => "see docs/configuration.md for every key, or pass --config FILE",
        }
    }
}

/// Why the text of a `flotilla.toml` is refused (the caller adds the path).
#[derive(Debug, Clone, PartialEq)]
pub enum FileProblem {
    Invalid(TomlProblem),
    Limits(LimitsError),
    Models(ProviderSettingsError),
}

impl FileConfig {
    /// Parses the text of a `flotilla.toml` and checks its limits; the scenario it names is
    /// not read. [`RunConfig::load`] reads the file through this (and the fuzzer calls it).
    pub fn parse(text: &str) -> Result<FileConfig, FileProblem> {
        let file: FileConfig =
            toml::from_str(text).map_err(|e| FileProblem::Invalid(TomlProblem::new(text, &e)))?;
        file.limits.validate().map_err(FileProblem::Limits)?;
        file.models().validate().map_err(FileProblem::Models)?;
        Ok(file)
    }

    /// The provider settings (`[providers]`, `[roles]`, `[prices]`) of this file.
    pub fn models(&self) -> ProviderSettings {
        ProviderSettings {
            providers: self.providers.clone(),
            roles: self.roles.clone(),
            prices: self.prices.clone(),
        }
    }
}

impl RunConfig {
    /// Loads `flotilla.toml` and the scenario it names.
    pub fn load(path: &Path) -> Result<RunConfig, ConfigError> {
        let file = load_file(path)?;
        file.planner
            .validate()
            .map_err(|source| ConfigError::Planner {
                path: path.into(),
                source,
            })?;
        file.subplanner
            .validate()
            .map_err(|source| ConfigError::Subplanner {
                path: path.into(),
                source,
            })?;
        file.checks
            .validate()
            .map_err(|source| ConfigError::Checks {
                path: path.into(),
                source,
            })?;
        let scenario_path = match &file.provider.scenario {
            Some(rel) => path.parent().unwrap_or(Path::new(".")).join(rel),
            None => return Err(ConfigError::NoScenario { path: path.into() }),
        };
        let scenario = Scenario::from_toml(&read(&scenario_path)?).map_err(|source| {
            ConfigError::Scenario {
                path: scenario_path.clone(),
                source,
            }
        })?;
        let models = file.models();
        let prompts = match &file.prompts_dir {
            Some(dir) => load_overrides(&path.parent().unwrap_or(Path::new(".")).join(dir))?,
            None => PromptOverrides::new(),
        };
        let base = path.parent().unwrap_or(Path::new("."));
        let sources = std::iter::once(path.to_path_buf())
            .chain(Some(scenario_path.clone()))
            .chain(file.prompts_dir.as_ref().map(|dir| base.join(dir)))
            .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
            .collect();
        let config = RunConfig {
            sources,
            limits: file.limits,
            planner: file.planner,
            subplanner: file.subplanner,
            checks: file.checks,
            builtin_agent: file.builtin_agent,
            worktrees: file.worktrees,
            merge: file.merge,
            reconciler: file.reconciler,
            agents: file.agents,
            workers: file.workers,
            scenario,
            models,
            prompts,
            sandbox: file.sandbox,
        };
        // What the file-level checks above do not cover (the profiles' agents, …).
        config.validate().map_err(|source| ConfigError::Run {
            path: path.into(),
            source,
        })?;
        Ok(config)
    }

    /// Loads only the provider settings of a `flotilla.toml` (for `providers check`, which
    /// needs no scenario).
    pub fn load_models(path: &Path) -> Result<ProviderSettings, ConfigError> {
        Ok(load_file(path)?.models())
    }

    /// The branch the run lands on: `[merge] branch`, which submit always fills in, or
    /// `main` for a run journaled before ADR-022.
    pub fn target_branch(&self) -> Result<TargetBranch, TargetBranchError> {
        TargetBranch::of_run(self.merge.branch.as_deref())
    }

    /// Checks everything a run needs, as [`RunConfig::load`] does: for a config that came
    /// another way (in a request's body, or from the journal).
    pub fn validate(&self) -> Result<(), RunConfigError> {
        self.limits.validate()?;
        self.planner.validate()?;
        self.subplanner.validate()?;
        self.checks.validate()?;
        self.builtin_agent.validate()?;
        self.merge.validate()?;
        // Names only flotilla or the user write; git's rules decide (ADR-022).
        if let Some(branch) = &self.merge.branch {
            TargetBranch::new(branch)?;
        }
        self.reconciler.validate()?;
        self.sandbox.validate()?;
        for (name, agent) in &self.agents {
            if AGENT_KINDS.contains(&name.as_str()) {
                return Err(RunConfigError::ReservedAgentName(name.clone()));
            }
            agent
                .validate()
                .map_err(|source| RunConfigError::CommandAgent {
                    name: name.chars().take(100).collect(),
                    source,
                })?;
        }
        for profile in &self.workers {
            if let Some(agent) = &profile.agent
                && !AGENT_KINDS.contains(&agent.as_str())
                && !self.agents.contains_key(agent)
            {
                return Err(RunConfigError::UnknownAgent {
                    profile: profile.name.clone(),
                    agent: agent.chars().take(100).collect(),
                });
            }
            // Found now, not when every task of the run has failed for want of a model.
            if profile.agent.as_deref() == Some("builtin") && self.models.roles.worker.is_none() {
                return Err(RunConfigError::BuiltinWithoutWorkerModel {
                    profile: profile.name.chars().take(100).collect(),
                });
            }
        }
        self.models.validate()?;
        self.scenario
            .check()
            .map_err(|e| RunConfigError::Scenario(e.to_string()))?;
        check_overrides(&self.prompts)?;
        Ok(())
    }

    /// The agent CLIs a worker profile uses whose program cannot be started: not on `path`
    /// (the daemon's `PATH`, which the scrubbed environment passes on), or, for a program
    /// named by a path, not an executable file there (relative to `repo`, where the
    /// attempts' workspaces mirror it). Checked at submit so that a missing CLI is one
    /// clear refusal, not a failed attempt per task. Reads the file system: call it off
    /// any actor's thread.
    pub fn missing_programs(
        &self,
        path: Option<&std::ffi::OsStr>,
        repo: &Path,
    ) -> Vec<MissingProgram> {
        let mut missing = Vec::new();
        for profile in &self.workers {
            let Some(name) = &profile.agent else { continue };
            let Some(agent) = self.agents.get(name) else {
                continue;
            };
            let Ok(resolved) = agent.resolved() else {
                continue;
            };
            let program = resolved.program;
            let found = if program.contains('/') {
                is_executable(&repo.join(&program))
            } else {
                path.into_iter()
                    .flat_map(std::env::split_paths)
                    // An empty entry is the current directory: never where an agent's CLI is
                    // looked for.
                    .filter(|dir| !dir.as_os_str().is_empty())
                    .any(|dir| is_executable(&dir.join(&program)))
            };
            if !found && !missing.iter().any(|m: &MissingProgram| &m.agent == name) {
                missing.push(MissingProgram {
                    profile: profile.name.clone(),
                    agent: name.clone(),
                    program,
                });
            }
        }
        missing
    }

    /// flotilla's own configuration inside `repo`, as repository-relative paths: the files
    /// this config was read from, and the files its commands name (the gate, the sweeps,
    /// the verification, the agents' programs and arguments). A task's change to one waits
    /// for the user before it lands (ADR-016).
    pub fn protected_paths(&self, repo: &Path) -> Vec<String> {
        let repo = std::fs::canonicalize(repo).unwrap_or_else(|_| repo.to_path_buf());
        let mut paths: Vec<String> = self
            .sources
            .iter()
            .filter_map(|p| p.strip_prefix(&repo).ok())
            .map(|p| p.to_string_lossy().replace('\\', "/"))
            .filter(|p| !p.is_empty())
            .collect();
        let mut commands: Vec<String> = self.merge.gate.clone();
        commands.extend(
            [
                &self.reconciler.build,
                &self.reconciler.typecheck,
                &self.reconciler.test,
                &self.checks.verify,
            ]
            .into_iter()
            .flatten()
            .cloned(),
        );
        for agent in self.agents.values() {
            commands.extend(agent.program.clone());
            commands.extend(agent.args.iter().flatten().cloned());
        }
        for command in &commands {
            paths.extend(flotilla_actors::work_check::command_files(command));
        }
        paths.sort();
        paths.dedup();
        paths
    }

    /// The worker profiles to dispatch to: the configured ones, or one general profile.
    pub fn profiles(&self) -> Vec<WorkerProfile> {
        if self.workers.is_empty() {
            vec![WorkerProfile::new("general", &[], 1)]
        } else {
            self.workers.clone()
        }
    }
}

/// An agent CLI that cannot be started (see [`RunConfig::missing_programs`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingProgram {
    pub profile: String,
    pub agent: String,
    pub program: String,
}

impl fmt::Display for MissingProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (profile, agent): (String, String) = (
            self.profile.chars().take(100).collect(),
            self.agent.chars().take(100).collect(),
        );
        let program: String = self.program.chars().take(200).collect();
        if program.contains('/') {
            write!(
                f,
                "worker profile {profile:?} uses [agents.{agent}], whose program {program:?} is \
                 not an executable file"
            )
        } else {
            write!(
                f,
                "worker profile {profile:?} uses [agents.{agent}], whose program {program:?} is \
                 not on the daemon's PATH: install it, start the daemon with it on PATH, or set \
                 `program` in [agents.{agent}] to its full path"
            )
        }
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Reads and parses a `flotilla.toml`, its limits checked.
fn load_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = read(path)?;
    FileConfig::parse(&text).map_err(|problem| match problem {
        FileProblem::Invalid(problem) => ConfigError::Invalid {
            path: path.into(),
            problem,
        },
        FileProblem::Limits(source) => ConfigError::Limits {
            path: path.into(),
            source,
        },
        FileProblem::Models(source) => ConfigError::Models {
            path: path.into(),
            source,
        },
    })
}

/// Reads a config or scenario file: only a regular file (not a device such as `/dev/zero`,
/// a FIFO or a directory), at most [`MAX_FILE_BYTES`], UTF-8.
pub fn read(path: &Path) -> Result<String, ConfigError> {
    let failed = |source| ConfigError::Read {
        path: path.into(),
        source,
    };
    let not_a_file = || ConfigError::NotAFile { path: path.into() };
    if !std::fs::metadata(path).map_err(failed)?.is_file() {
        return Err(not_a_file());
    }
    // Non-blocking, so that a FIFO put in the file's place since the check cannot park the
    // thread in open(); checked again on what was opened.
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(failed)?;
    if !file.metadata().map_err(failed)?.is_file() {
        return Err(not_a_file());
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(failed)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(ConfigError::TooLarge { path: path.into() });
    }
    String::from_utf8(bytes).map_err(|_| ConfigError::NotText { path: path.into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_a_config_and_its_scenario() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("s.toml"),
            "[[planner.answers]]\ntasks = []\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("flotilla.toml"),
            "[provider]\nscenario = \"s.toml\"\n[limits]\nmax_workers = 2\n",
        )
        .unwrap();
        let config = RunConfig::load(&dir.path().join("flotilla.toml")).unwrap();
        assert_eq!(config.limits.max_workers, 2);
        assert_eq!(config.scenario.planner.answers.len(), 1);
    }

    #[test]
    fn unknown_keys_and_missing_scenarios_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flotilla.toml");
        std::fs::write(&path, "[limits]\nmax_wrokers = 2\n").unwrap();
        let err = RunConfig::load(&path).unwrap_err().to_string();
        assert!(err.contains("max_wrokers"), "{err}");
        std::fs::write(&path, "[limits]\n").unwrap();
        assert!(matches!(
            RunConfig::load(&path),
            Err(ConfigError::NoScenario { .. })
        ));
    }

    #[test]
    fn worker_profiles_name_agents_that_exist_and_agent_tables_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("s.toml"), "").unwrap();
        let path = dir.path().join("flotilla.toml");
        let load = |rest: &str| {
            std::fs::write(&path, format!("[provider]\nscenario = \"s.toml\"\n{rest}")).unwrap();
            RunConfig::load(&path)
        };
        let ok = load(
            "[agents.claude]\npreset = \"claude-code\"\n[[workers]]\nname = \"a\"\nagent = \"claude\"\n[[workers]]\nname = \"b\"\nagent = \"builtin\"\n\
             [providers.local]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\n[roles]\nworker = \"local/m\"\n",
        )
        .unwrap();
        assert_eq!(ok.agents.len(), 1);
        let err = load("[[workers]]\nname = \"a\"\nagent = \"cluade\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"cluade\"") && err.contains("[agents.NAME]"),
            "{err}"
        );
        let err = load("[agents.builtin]\nprogram = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("built-in agent kind"), "{err}");
        let err = load("[agents.cli]\nargs = [\"-p\"]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("[agents.cli]"), "{err}");
        let err = load("[[workers]]\nname = \"a\"\nagnet = \"builtin\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("agnet"),
            "a typo in a profile is refused: {err}"
        );
        let err = load("[builtin_agent]\nmax_tool_calls = 0\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_tool_calls"), "{err}");
    }

    /// A project whose scenario path is `scenario`.
    fn project(scenario: &Path) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flotilla.toml");
        std::fs::write(
            &path,
            format!(
                "[provider]\nscenario = {:?}\n",
                scenario.display().to_string()
            ),
        )
        .unwrap();
        (dir, path)
    }

    #[test]
    fn devices_fifos_and_directories_are_refused_unread() {
        let (_dir, path) = project(Path::new("/dev/zero"));
        assert!(
            matches!(RunConfig::load(&path), Err(ConfigError::NotAFile { .. })),
            "/dev/zero would be read forever"
        );
        let fifo_dir = tempfile::tempdir().unwrap();
        let fifo = fifo_dir.path().join("scenario.toml");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let (_dir, path) = project(&fifo);
        // Unchecked, this blocks forever in open(): nobody writes the FIFO. A thread and a
        // generous bound turn that into a failure instead of a hung test.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(matches!(
                RunConfig::load(&path),
                Err(ConfigError::NotAFile { .. })
            ));
        });
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(30)),
            Ok(true),
            "a FIFO must be refused, not waited on"
        );
        let (_dir, path) = project(fifo_dir.path());
        assert!(matches!(
            RunConfig::load(&path),
            Err(ConfigError::NotAFile { .. })
        ));
    }

    #[test]
    fn files_over_the_cap_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.toml");
        let line = "# padding padding padding padding padding padding padding padding\n";
        std::fs::write(&big, line.repeat(MAX_FILE_BYTES as usize / line.len() + 1)).unwrap();
        let (_dir, path) = project(&big);
        assert!(matches!(
            RunConfig::load(&path),
            Err(ConfigError::TooLarge { .. })
        ));
        std::fs::write(&big, line.repeat(MAX_FILE_BYTES as usize / line.len() - 1)).unwrap();
        assert!(RunConfig::load(&path).is_ok());
    }

    #[test]
    fn errors_name_the_position_and_problem_never_the_text() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("shadow");
        for text in [
            "root:$6$s3cr3tHash:19000:0:99999:7:::\n",
            "[limits]\nmax_workers = \"s3cr3tHash\"\n",
            "[agent]\noutcome = \"s3cr3tHash\"\n",
            "[[planner.answers]]\ndelay_ms = [\"s3cr3tHash\"]\n",
        ] {
            std::fs::write(&secret, text).unwrap();
            for path in [secret.clone(), project(&secret).1] {
                let err = RunConfig::load(&path).unwrap_err().to_string();
                assert!(!err.contains("s3cr3t"), "{err}");
                assert!(err.contains("shadow"), "names the file: {err}");
                assert!(err.contains("line "), "names the line: {err}");
            }
        }
    }

    #[test]
    fn unknown_scenario_keys_are_refused_with_the_key_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let scenario = dir.path().join("s.toml");
        std::fs::write(
            &scenario,
            "[agent]\ndelay_ms = 1\n\n[tasks.t1]\noutcom = \"blocked\"\n",
        )
        .unwrap();
        let (_dir, path) = project(&scenario);
        let err = RunConfig::load(&path).unwrap_err().to_string();
        assert!(err.contains("outcom") && err.contains("line 5"), "{err}");
        // The old docs' `[tasks.t1.2]` is a table `2` inside t1, not task t1.2.
        std::fs::write(&scenario, "[tasks.t1.2]\ndelay_ms = 5000\n").unwrap();
        let err = RunConfig::load(&path).unwrap_err().to_string();
        assert!(err.contains("`2`") && err.contains("line 1"), "{err}");
        std::fs::write(&scenario, "[tasks.\"t1.2\"]\ndelay_ms = 5000\n").unwrap();
        let config = RunConfig::load(&path).unwrap();
        assert_eq!(config.scenario.tasks["t1.2"].step.delay_ms, Some(5000));
    }

    #[test]
    fn the_builtin_agent_without_a_worker_model_is_refused_at_load() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("s.toml"), "").unwrap();
        let path = dir.path().join("flotilla.toml");
        let profile = "[[workers]]\nname = \"coder\"\nagent = \"builtin\"\n";
        std::fs::write(
            &path,
            format!("[provider]\nscenario = \"s.toml\"\n{profile}"),
        )
        .unwrap();
        let err = RunConfig::load(&path).unwrap_err();
        assert!(
            matches!(
                &err,
                ConfigError::Run {
                    source: RunConfigError::BuiltinWithoutWorkerModel { profile },
                    ..
                } if profile == "coder"
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains("[roles]"),
            "the fix is named: {err}"
        );
        // With a worker model it loads.
        std::fs::write(
            &path,
            format!(
                "[provider]\nscenario = \"s.toml\"\n{profile}\
                 [providers.local]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\n\
                 [roles]\nworker = \"local/m\"\n"
            ),
        )
        .unwrap();
        RunConfig::load(&path).unwrap();
    }

    #[test]
    fn impossible_limits_are_refused_at_load() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("s.toml"), "").unwrap();
        let path = dir.path().join("flotilla.toml");
        for (limit, field) in [
            ("max_workers = 0", "max_workers"),
            ("max_nodes = 0", "max_nodes"),
        ] {
            std::fs::write(
                &path,
                format!("[provider]\nscenario = \"s.toml\"\n[limits]\n{limit}\n"),
            )
            .unwrap();
            let err = RunConfig::load(&path).unwrap_err();
            assert!(matches!(err, ConfigError::Limits { .. }), "{err}");
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn a_prompts_dir_overrides_prompts_and_a_bad_placeholder_is_refused_at_load() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("s.toml"), "").unwrap();
        std::fs::create_dir(dir.path().join("mine")).unwrap();
        std::fs::write(
            dir.path().join("mine/root-planner.md"),
            "Plan at most {{max_subtasks}} things.",
        )
        .unwrap();
        let path = dir.path().join("flotilla.toml");
        std::fs::write(
            &path,
            "prompts_dir = \"mine\"\n[provider]\nscenario = \"s.toml\"\n",
        )
        .unwrap();
        let config = RunConfig::load(&path).unwrap();
        assert_eq!(
            crate::prompts::for_role(
                flotilla_actors::protocol::Role::Planner,
                &config.prompts,
                &config.limits
            ),
            "Plan at most 10 things."
        );
        config.validate().unwrap();
        std::fs::write(dir.path().join("mine/root-planner.md"), "{{max_subtask}}").unwrap();
        let err = RunConfig::load(&path).unwrap_err();
        assert!(matches!(err, ConfigError::Prompt { .. }), "{err}");
        assert!(err.to_string().contains("max_subtask"), "{err}");
    }

    #[test]
    fn impossible_planner_settings_are_refused_at_load() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("s.toml"), "").unwrap();
        let path = dir.path().join("flotilla.toml");
        for (setting, field) in [
            ("max_iterations = 0", "max_iterations"),
            ("max_consecutive_errors = 0", "max_consecutive_errors"),
            ("max_answer_bytes = 100", "max_answer_bytes"),
            ("backoff_base_ms = 10\nbackoff_max_ms = 5", "backoff_max_ms"),
        ] {
            std::fs::write(
                &path,
                format!("[provider]\nscenario = \"s.toml\"\n[planner]\n{setting}\n"),
            )
            .unwrap();
            let err = RunConfig::load(&path).unwrap_err();
            assert!(matches!(err, ConfigError::Planner { .. }), "{err}");
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn the_documented_examples_load() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
        RunConfig::load(&docs.join("examples/flotilla.toml")).unwrap();
        let local = RunConfig::load(&docs.join("examples/local-openai.toml")).unwrap();
        assert_eq!(
            local.models.roles.planner.as_ref().unwrap().names(),
            ["local/smollm2"]
        );
        // Every TOML block of the configuration guide is a valid part of a flotilla.toml.
        let guide = std::fs::read_to_string(docs.join("configuration.md")).unwrap();
        for block in guide.split("```toml\n").skip(1) {
            let block = block.split("```").next().unwrap();
            FileConfig::parse(block)
                .unwrap_or_else(|e| panic!("docs/configuration.md: {e:?}\n{block}"));
        }
        // And security.md's, which loosen the sandbox on purpose.
        let guide = std::fs::read_to_string(docs.join("security.md")).unwrap();
        for block in guide.split("```toml\n").skip(1) {
            let block = block.split("```").next().unwrap();
            let file = FileConfig::parse(block)
                .unwrap_or_else(|e| panic!("docs/security.md: {e:?}\n{block}"));
            file.sandbox.validate().unwrap();
        }
        let guide = std::fs::read_to_string(docs.join("scenarios.md")).unwrap();
        let blocks: Vec<&str> = guide
            .split("```toml\n")
            .skip(1)
            .map(|rest| rest.split("```").next().unwrap())
            .collect();
        assert!(blocks.len() >= 4);
        for block in blocks.iter().filter(|b| !b.contains("[provider]")) {
            if let Err(e) = Scenario::from_toml(block) {
                panic!("docs/scenarios.md example does not load: {e}\n{block}");
            }
        }
    }
}
