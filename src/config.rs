//! Configuration: `flotilla.toml` in the target repository (or `--config FILE`), and the
//! `RunConfig` the CLI sends with a run and the daemon stores in the journal, so that a run
//! resumes after a restart with exactly the configuration it started with.
//!
//! Secrets never live here: provider keys come from the environment (later issues).

use std::path::{Path, PathBuf};

use flotilla_actors::actors::{PlannerConfig, WorkerProfile};
use flotilla_actors::config::Limits;
use serde::{Deserialize, Serialize};

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
    /// Worker profiles; one general profile if none are given.
    #[serde(default)]
    pub workers: Vec<WorkerProfile>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// `scripted` is the only provider so far.
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
    pub workers: Vec<WorkerProfile>,
    #[serde(default)]
    pub scenario: Scenario,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a valid flotilla config: {message}")]
    Invalid { path: PathBuf, message: String },
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

impl RunConfig {
    /// Loads `flotilla.toml` and the scenario it names.
    pub fn load(path: &Path) -> Result<RunConfig, ConfigError> {
        let text = read(path)?;
        let file: FileConfig = toml::from_str(&text).map_err(|e| ConfigError::Invalid {
            path: path.into(),
            message: e.to_string(),
        })?;
        let scenario_path = match &file.provider.scenario {
            Some(rel) => path.parent().unwrap_or(Path::new(".")).join(rel),
            None => return Err(ConfigError::NoScenario { path: path.into() }),
        };
        let scenario = Scenario::from_toml(&read(&scenario_path)?).map_err(|source| {
            ConfigError::Scenario {
                path: scenario_path,
                source,
            }
        })?;
        Ok(RunConfig {
            limits: file.limits,
            planner: file.planner,
            workers: file.workers,
            scenario,
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

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.into(),
        source,
    })
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
}
