//! `flotilla config check [FILE]`: loads a config exactly as `submit` does
//! ([`RunConfig::load`]: the file, the scenario it names, its prompts, every check) and says
//! whether it would be accepted. A file that does not parse is named by line, column and,
//! where the line has one, its key.

use std::path::Path;

use crate::cli::emit;
use crate::cli::error::{CliError, ErrorKind, Exit};
use crate::config::{ConfigError, RunConfig};

pub fn run(file: Option<&Path>, repo: &Path) -> Result<Exit, CliError> {
    let path = file
        .map(Path::to_path_buf)
        .unwrap_or_else(|| repo.join(super::init::CONFIG_FILE));
    match RunConfig::load(&path) {
        Ok(config) => {
            let roles = config.models.roles.clone();
            let real = [
                ("planner", &roles.planner),
                ("subplanner", &roles.subplanner),
                ("worker", &roles.worker),
                ("reconciler", &roles.reconciler),
                ("reviewer", &roles.reviewer),
            ]
            .into_iter()
            .filter(|(_, models)| models.is_some())
            .map(|(role, _)| role)
            .collect::<Vec<_>>();
            let models = if real.is_empty() {
                "every role scripted".to_string()
            } else {
                format!("models for {}", real.join(", "))
            };
            // Said either way: a reviewer changes what lands (ADR-038).
            let reviewer = if config.reviewer.enabled {
                "reviewer on: work lands only once approved"
            } else {
                "reviewer off"
            };
            emit(&format!("{}: ok ({models}; {reviewer})\n", path.display()))?;
            Ok(Exit::Ok)
        }
        Err(e) => {
            let hint = e.hint();
            let error = match &e {
                ConfigError::Invalid { path, problem } => {
                    let key = std::fs::read_to_string(path)
                        .ok()
                        .and_then(|text| key_at(&text, problem.line));
                    let at = match key {
                        Some(key) => format!("key `{key}`, line {}", problem.line),
                        None => format!("line {}", problem.line),
                    };
                    CliError::config(format!(
                        "{}: {at}, column {}: {}",
                        path.display(),
                        problem.column,
                        problem.problem
                    ))
                }
                _ => CliError::wrap(ErrorKind::Config, e),
            };
            Err(error.hint(hint))
        }
    }
}

/// The key a TOML line sets (`max_workers = 0` → `max_workers`), with the table it is in
/// (`limits.max_workers`); or the table a header line opens. The text is the user's: it is
/// escaped when printed, and cut short.
pub fn key_at(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let here = lines.get(line.checked_sub(1)?)?.trim();
    let table = |upto: usize| {
        lines[..upto].iter().rev().find_map(|l| {
            let l = l.trim();
            l.strip_prefix('[').map(|h| {
                h.trim_start_matches('[')
                    .trim_end_matches(']')
                    .trim()
                    .to_string()
            })
        })
    };
    let key: String = if here.starts_with('[') {
        here.trim_matches(|c| c == '[' || c == ']')
            .trim()
            .to_string()
    } else {
        let (key, _) = here.split_once('=')?;
        let key = key.trim();
        match table(line - 1) {
            Some(table) => format!("{table}.{key}"),
            None => key.to_string(),
        }
    };
    (!key.is_empty()).then(|| key.chars().take(100).collect())
}
