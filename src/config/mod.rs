//! Configuration: `flotilla.toml` in the target repository (or `--config FILE`), and the
//! `RunConfig` the CLI sends with a run and the daemon stores in the journal, so that a run
//! resumes after a restart with exactly the configuration it started with.
//!
//! Secrets never live here: provider keys come from the environment (later issues).
//!
//! Files are read only if regular and at most 1 MiB, and errors never quote their contents.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use flotilla_actors::actors::worker::check::{ChecksConfig, ChecksConfigError};
use flotilla_actors::actors::worker::review::{ReviewerConfig, ReviewerConfigError};
use flotilla_actors::actors::{
    MergeConfig, MergeConfigError, PlannerConfig, PlannerConfigError, ReconcilerConfig,
    ReconcilerConfigError, SubplannerConfig, SubplannerConfigError, WorkerProfile,
};
use flotilla_actors::config::{Limits, LimitsError};

use crate::agents::builtin::{BuiltinConfig, BuiltinConfigError};
use crate::agents::command::{CommandAgentConfig, CommandAgentConfigError};
use crate::git::target::{TargetBranch, TargetBranchError};
use serde::{Deserialize, Serialize};

use crate::prompts::{PromptError, PromptOverrides, check_overrides};
use crate::providers::settings::{
    Price, ProviderSettings, ProviderSettingsError, ProviderSpec, RoleModels,
};
use crate::sandbox::{SandboxConfig, SandboxConfigError};
use crate::scripted::{Scenario, ScenarioError};
use crate::text_file::{FileError, TomlProblem};

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
    /// The reviewer before landing (ADR-038): off unless `enabled`.
    #[serde(default)]
    pub reviewer: ReviewerConfig,
    /// External agent CLIs, by name (`[agents.claude]`): a worker profile names one with
    /// `agent = "claude"`.
    #[serde(default)]
    pub agents: BTreeMap<String, CommandAgentConfig>,
    /// Worker profiles; one general profile if none are given.
    #[serde(default, deserialize_with = "worker_profiles")]
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
    /// Who hears when a run needs the user, completed or failed (`[notify]`).
    #[serde(default)]
    pub notify: NotifyConfig,
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
    pub reviewer: ReviewerConfig,
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
    /// Desktop and webhook notifications (`daemon::notify`).
    #[serde(default)]
    pub notify: NotifyConfig,
    /// Where this config was read from: the config file, its scenario and its
    /// `prompts_dir`. Those inside the run's repository count as flotilla's configuration
    /// there: a task's change to them waits for the user (ADR-016).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<PathBuf>,
}

/// `[worktrees]`: what becomes of attempts' worktrees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorktreesConfig {
    /// A failed attempt's worktree and branch stay, for someone to look at what the agent
    /// did, until `flotilla gc` (or the next daemon start) removes them. Off: they go as the
    /// attempt fails.
    pub keep_failed: bool,
    /// A retry continues the failed attempt's work: its branch starts at that attempt's
    /// tip, and the scope check covers both attempts' changes (ADR-031). Off: every retry
    /// starts again from the target branch's tip.
    pub retry_in_place: bool,
    /// The disk (MiB) the workspaces a finished run leaves for the repository's next run
    /// may take, with those already waiting (at most eight): that run's first attempts
    /// reset one to their start instead of writing every file (ADR-052). 0: none are left.
    pub pool_budget_mb: u64,
}

impl Default for WorktreesConfig {
    fn default() -> Self {
        WorktreesConfig {
            keep_failed: false,
            retry_in_place: false,
            pool_budget_mb: 2048,
        }
    }
}

/// `workers`: the worker profiles, an array of tables (`[[workers]]`). A `[workers]` table
/// is refused with where a setting like the issue's `[workers] retry_in_place` lives.
fn worker_profiles<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<WorkerProfile>, D::Error> {
    use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
    struct Profiles;
    impl<'de> serde::de::Visitor<'de> for Profiles {
        type Value = Vec<WorkerProfile>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("worker profiles, each a `[[workers]]` table")
        }
        // Each profile's own errors (an unknown key, a wrong type) come through as they are.
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            Vec::deserialize(SeqAccessDeserializer::new(seq))
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            let table = toml::Table::deserialize(MapAccessDeserializer::new(map))?;
            Err(serde::de::Error::custom(workers_table_problem(&table)))
        }
    }
    deserializer.deserialize_any(Profiles)
}

/// What is wrong with a `[workers]` table (one `[`, not two).
fn workers_table_problem(table: &toml::Table) -> String {
    let mut problem = String::from(
        "`workers` is the list of worker profiles: write each as `[[workers]]` (two brackets), not `[workers]`",
    );
    if table.contains_key("retry_in_place") {
        problem.push_str(
            "; `retry_in_place` is a worktree setting: write `retry_in_place = true` under `[worktrees]`",
        );
    } else if table.contains_key("keep_failed") {
        problem.push_str("; `keep_failed` goes under `[worktrees]`");
    }
    problem
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
    #[error("impossible reviewer settings: {0}")]
    Reviewer(#[from] ReviewerConfigError),
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
    #[error("{0}")]
    Notify(#[from] NotifyConfigError),
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not read: missing, not a regular file, too large, not text.
    #[error(transparent)]
    File(#[from] FileError),
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
        "{path} names no scenario, and {scripted} is scripted: give it a model in [roles] (or \
         an agent in [[workers]]), or name a scenario with `[provider] scenario = \"FILE\"`"
    )]
    NoScenario { path: PathBuf, scripted: String },
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

/// Whether nothing tests main in a run with these sections: no `[merge] gate` and no
/// `[reconciler]` build, typecheck or test command, so main moves after a conflict-marker
/// check only. `submit` and `status` say so once (ADR-032).
pub fn main_untested(merge: &MergeConfig, reconciler: &ReconcilerConfig) -> bool {
    merge.gate.is_empty()
        && reconciler.build.is_none()
        && reconciler.typecheck.is_none()
        && reconciler.test.is_none()
}

impl RunConfig {
    /// See [`main_untested`].
    pub fn main_untested(&self) -> bool {
        main_untested(&self.merge, &self.reconciler)
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
        self.reviewer.validate()?;
        self.sandbox.validate()?;
        self.notify.validate()?;
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
            paths.extend(flotilla_actors::actors::worker::check::command_files(
                command,
            ));
        }
        paths.sort();
        paths.dedup();
        paths
    }

    /// The first part of the run the scripted provider would play, in words: a planning
    /// role with no model, or a worker profile whose agent is (or defaults to) the scripted
    /// one. `None`: everything has a model or an agent, and no scenario is needed.
    pub fn scripted_part(&self) -> Option<String> {
        let roles = &self.models.roles;
        if roles.planner.is_none() {
            return Some("the planner role".into());
        }
        if roles.subplanner.is_none() {
            return Some("the subplanner role".into());
        }
        if self.reviewer.enabled && roles.reviewer.is_none() {
            return Some("the reviewer role ([reviewer] enabled)".into());
        }
        self.profiles().into_iter().find_map(|profile| {
            let scripted = match profile.agent.as_deref() {
                Some(agent) => agent == "scripted",
                None => roles.worker.is_none(),
            };
            scripted.then(|| format!("worker profile {:?}", profile.name))
        })
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

mod load;
pub mod notify;

pub use notify::{NotifyConfig, NotifyConfigError, NotifyOn};

#[cfg(test)]
mod tests;
