//! Reading a `flotilla.toml` and what it names (the scenario, the `prompts_dir`) into a
//! [`RunConfig`]: the only part of the configuration that touches the file system, through
//! [`crate::text_file`].

use std::path::Path;

use super::{ConfigError, FileConfig, FileProblem, RunConfig};
use crate::prompts::{self, PromptOverrides};
use crate::providers::settings::ProviderSettings;
use crate::scripted::Scenario;
use crate::text_file::{FileError, read};

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
        // A scenario is needed only when something is scripted: a planning role without a
        // model, or a worker profile whose agent is the scripted one (checked below).
        let scenario_path = file
            .provider
            .scenario
            .as_ref()
            .map(|rel| path.parent().unwrap_or(Path::new(".")).join(rel));
        let scenario = match &scenario_path {
            Some(scenario_path) => {
                Scenario::from_toml(&read(scenario_path)?).map_err(|source| {
                    ConfigError::Scenario {
                        path: scenario_path.clone(),
                        source,
                    }
                })?
            }
            None => Scenario::default(),
        };
        let models = file.models();
        let prompts = match &file.prompts_dir {
            Some(dir) => load_overrides(&path.parent().unwrap_or(Path::new(".")).join(dir))?,
            None => PromptOverrides::new(),
        };
        let base = path.parent().unwrap_or(Path::new("."));
        let sources = std::iter::once(path.to_path_buf())
            .chain(scenario_path.clone())
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
            reviewer: file.reviewer,
            agents: file.agents,
            workers: file.workers,
            scenario,
            models,
            prompts,
            sandbox: file.sandbox,
            notify: file.notify,
        };
        if scenario_path.is_none()
            && let Some(scripted) = config.scripted_part()
        {
            return Err(ConfigError::NoScenario {
                path: path.into(),
                scripted,
            });
        }
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

/// Reads the overrides in `dir`: each built-in prompt's file name that exists there. Files
/// are read as configs are (regular files only, size-capped) and checked.
pub(super) fn load_overrides(dir: &Path) -> Result<PromptOverrides, ConfigError> {
    let mut overrides = PromptOverrides::new();
    if !dir.is_dir() {
        return Err(FileError::NotAFile { path: dir.into() }.into());
    }
    for (_, file, _) in prompts::BUILT_IN {
        let path = dir.join(file);
        if !path.exists() {
            continue;
        }
        let text = read(&path)?;
        prompts::check(&text, &path.display().to_string()).map_err(|source| {
            ConfigError::Prompt {
                path: path.clone(),
                source,
            }
        })?;
        overrides.insert(file.to_string(), text);
    }
    Ok(overrides)
}
