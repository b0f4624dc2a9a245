//! `flotilla init`: writes a commented `flotilla.toml` for a repository, its gate and sweep
//! commands taken from the project type it finds there (Cargo.toml, package.json,
//! pyproject.toml, go.mod).
//!
//! The file holds every real model and agent CLI as a commented block (`# ` before each
//! line; explanations start with `##`), so that uncommenting one gives a valid config: a
//! test uncomments them all and loads the result with [`RunConfig::load`]. The loader
//! needs a scenario for the roles `[roles]` leaves out, so `init` also writes an empty one,
//! `flotilla-scenario.toml`, unless the repository already has that file.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::cli::emit;
use crate::cli::error::{CliError, Exit};

pub const CONFIG_FILE: &str = "flotilla.toml";
pub const SCENARIO_FILE: &str = "flotilla-scenario.toml";

/// What the project builds and tests with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProjectType {
    Cargo,
    Npm,
    Python,
    Go,
}

/// The project's commands: the merge gate, the Reconciler's sweeps, the verification.
struct Commands {
    gate: &'static [&'static str],
    build: Option<&'static str>,
    typecheck: Option<&'static str>,
    test: Option<&'static str>,
    verify: Option<&'static str>,
}

impl ProjectType {
    /// The marker file each type is known by, in the order they are looked for.
    const MARKERS: [(&'static str, ProjectType); 4] = [
        ("Cargo.toml", ProjectType::Cargo),
        ("package.json", ProjectType::Npm),
        ("pyproject.toml", ProjectType::Python),
        ("go.mod", ProjectType::Go),
    ];

    /// The project types whose marker file is in `repo`'s root, in [`Self::MARKERS`] order.
    pub fn detect(repo: &Path) -> Vec<(&'static str, ProjectType)> {
        Self::MARKERS
            .into_iter()
            .filter(|(file, _)| repo.join(file).is_file())
            .collect()
    }

    fn commands(self) -> Commands {
        match self {
            ProjectType::Cargo => Commands {
                gate: &["cargo build", "cargo test"],
                build: Some("cargo build --message-format=json"),
                typecheck: None,
                test: Some("cargo test"),
                verify: Some("cargo build --quiet"),
            },
            ProjectType::Npm => Commands {
                gate: &["npm ci", "npm test"],
                build: Some("npm ci"),
                typecheck: None,
                test: Some("npm test"),
                verify: None,
            },
            ProjectType::Python => Commands {
                gate: &["pytest"],
                build: None,
                typecheck: None,
                test: Some("pytest"),
                verify: None,
            },
            ProjectType::Go => Commands {
                gate: &["go build ./...", "go test ./..."],
                build: Some("go build ./..."),
                typecheck: Some("go vet ./..."),
                test: Some("go test ./..."),
                verify: Some("go build ./..."),
            },
        }
    }
}

/// Writes `<repo>/flotilla.toml` (and the empty scenario it names). An existing config is
/// kept unless `force`.
pub fn run(repo: &Path, force: bool) -> Result<Exit, CliError> {
    if !repo.is_dir() {
        return Err(
            CliError::user(format!("{} is not a directory", repo.display()))
                .hint("run it in the repository, or name it with --repo PATH"),
        );
    }
    let config = repo.join(CONFIG_FILE);
    if config.exists() && !force {
        return Err(
            CliError::user(format!("{} already exists", config.display()))
                .hint("`flotilla config check` validates it; `flotilla init --force` replaces it"),
        );
    }
    let detected = ProjectType::detect(repo);
    let text = render(&detected);
    write(&config, &text)?;
    let scenario = repo.join(SCENARIO_FILE);
    let mut note = String::new();
    if !scenario.exists() {
        write(&scenario, SCENARIO)?;
        let _ = writeln!(note, "wrote {}", scenario.display());
    }
    let _ = writeln!(note, "wrote {}", config.display());
    match detected.first() {
        Some((marker, _)) => {
            let _ = writeln!(note, "gate and sweeps: from {marker}");
        }
        None => {
            let _ = writeln!(
                note,
                "no Cargo.toml, package.json, pyproject.toml or go.mod: set [merge] gate \
                 and [reconciler] yourself"
            );
        }
    }
    let _ = writeln!(
        note,
        "next: uncomment a provider and [roles], then `flotilla config check` and \
         `flotilla providers check`"
    );
    emit(&note)?;
    Ok(Exit::Ok)
}

fn write(path: &PathBuf, text: &str) -> Result<(), CliError> {
    std::fs::write(path, text)
        .map_err(|e| CliError::user(format!("cannot write {}", path.display())).because(e))
}

const SCENARIO: &str = "\
## The scripted provider's answers (docs/scenarios.md). It serves every role that
## flotilla.toml's [roles] leaves out; with no answers, a scripted planner plans nothing.
## flotilla.toml names this file because the config loader needs one.
";

/// A TOML string (basic string, escaped).
fn quoted(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

/// The generated `flotilla.toml`.
pub fn render(detected: &[(&'static str, ProjectType)]) -> String {
    let mut out = String::new();
    out.push_str(HEADER);
    let found = detected.first();
    let commands = found.map(|(_, kind)| kind.commands());
    let _ = writeln!(
        out,
        "\n## The gate: run in order on every candidate before it lands on the branch."
    );
    match found {
        Some((marker, _)) => {
            let _ = writeln!(out, "## From {marker}.");
            for (other, _) in detected.iter().skip(1) {
                let _ = writeln!(
                    out,
                    "## {other} is here too: add its commands if it matters."
                );
            }
        }
        None => {
            let _ = writeln!(
                out,
                "## No Cargo.toml, package.json, pyproject.toml or go.mod: fill it in."
            );
        }
    }
    let _ = writeln!(
        out,
        "## Commands run in the sandbox, without the network: dependencies must already be\n\
         ## where the build finds them (or see [sandbox] in docs/configuration.md).\n\
         [merge]\n\
         mode = \"rebase\"          ## rebase | merge | squash\n\
         gate_timeout_secs = 600\n\
         ## batch_max = 4         ## branches landed together; default 4 with a gate, 64 without"
    );
    let gate: Vec<String> = commands
        .as_ref()
        .map(|c| c.gate.iter().map(|g| quoted(g)).collect())
        .unwrap_or_default();
    let _ = writeln!(out, "gate = [{}]", gate.join(", "));

    out.push_str("\n## The Reconciler sweeps main with these and turns failures into fix tasks.\n[reconciler]\n");
    let sweep = |name: &str, command: Option<&str>, out: &mut String| match command {
        Some(c) => {
            let _ = writeln!(out, "{name} = {}", quoted(c));
        }
        None => {
            let _ = writeln!(out, "## {name}: none known for this project");
        }
    };
    sweep("build", commands.as_ref().and_then(|c| c.build), &mut out);
    sweep(
        "typecheck",
        commands.as_ref().and_then(|c| c.typecheck),
        &mut out,
    );
    sweep("test", commands.as_ref().and_then(|c| c.test), &mut out);
    out.push_str("timeout_secs = 600\ninterval_secs = 300\n");

    out.push_str(
        "\n## What flotilla checks in every worker's branch.\n[checks]\n\
         out_of_scope = \"fail\"   ## or \"flag\"\n\
         config_edits = \"hold\"   ## changes to flotilla's own config wait for `flotilla decide`\n",
    );
    match commands.as_ref().and_then(|c| c.verify) {
        Some(v) => {
            let _ = writeln!(out, "verify = {}", quoted(v));
        }
        None => out.push_str("## verify: a command run on each attempt's committed work\n"),
    }
    out.push_str(REST);
    out
}

const HEADER: &str = "\
## flotilla's configuration for this repository, written by `flotilla init`.
## Every key: docs/configuration.md. Lines starting with `# ` are examples: uncomment one
## provider and [roles] to use real models, then check with
##   flotilla config check          # does this file load?
##   flotilla providers check       # do the models answer?

## The scripted provider answers every role [roles] leaves out (docs/scenarios.md).
[provider]
kind = \"scripted\"
scenario = \"flotilla-scenario.toml\"
";

const REST: &str = r#"
## The run's limits and budgets (every field: actors/src/config.rs). Past the run budget
## the run stops planning and dispatching and ends failed.
[limits]
max_workers = 4                  ## attempts at once
max_nodes = 100                  ## tasks in the run's graph
max_depth = 3
max_attempts = 2                 ## 2: one retry
default_budget = { tokens = 200000, cost_usd = 2.0, wall_time_ms = 1800000 }
max_task_budget = { tokens = 1000000, cost_usd = 10.0, wall_time_ms = 14400000 }
run_budget = { tokens = 10000000, cost_usd = 100.0, wall_time_ms = 172800000 }

## Real models. Keys come from the daemon's environment (api_key_env), never this file.

## OpenAI:
# [providers.openai]
# kind = "openai"
# base_url = "https://api.openai.com/v1"
# api_key_env = "OPENAI_API_KEY"

## Anthropic:
# [providers.anthropic]
# kind = "anthropic"
# base_url = "https://api.anthropic.com"
# api_key_env = "ANTHROPIC_API_KEY"

## Ollama, on this machine (OpenAI-compatible):
# [providers.ollama]
# kind = "openai"
# base_url = "http://127.0.0.1:11434/v1"
# max_concurrency = 1

## A llama.cpp server (`llama-server --port 8080`), on this machine:
# [providers.llamacpp]
# kind = "openai"
# base_url = "http://127.0.0.1:8080/v1"
# max_concurrency = 1
# stall_timeout_secs = 300       ## a CPU-only server reads a long prompt for minutes

## Which provider/model serves each role (a list fails over in order).
# [roles]
# planner = "anthropic/claude-sonnet-4-5"
# subplanner = "anthropic/claude-sonnet-4-5"
# worker = "openai/gpt-4.1"
# reconciler = "ollama/qwen2.5-coder"
# reviewer = "anthropic/claude-sonnet-4-5"   ## read only with [reviewer] enabled

## A reviewer reads each attempt's diff against its task before it may land; changes
## requested send the task back to a worker with the comments. Off by default.
# [reviewer]
# enabled = true

## USD per million tokens, for budgets and `status` (absent: free).
# [prices."openai/gpt-4.1"]
# input = 2.0
# output = 8.0

## Agent CLIs as workers (docs/configuration.md, "External agent CLIs"). They run in the
## sandbox; one that calls its model needs sandbox = "network".
# [agents.claude]
# preset = "claude-code"
# extra_args = ["--permission-mode", "acceptEdits"]
# sandbox = "network"

# [agents.codex]
# preset = "codex"
# extra_args = ["--sandbox", "workspace-write"]
# sandbox = "network"

# [agents.aider]
# preset = "aider"
# extra_args = ["--model", "openai/gpt-4.1"]
# sandbox = "network"

## Worker profiles: Dispatch picks the cheapest that offers a task's capabilities. Left
## out: one profile, the built-in agent when [roles] has a worker model.
# [[workers]]
# name = "claude"
# agent = "claude"
# cost = 2

# [[workers]]
# name = "builtin"
# agent = "builtin"
# cost = 1

## Notifications when a run needs you, completes or fails (`flotilla ui` shows it live).
# [notify]
# desktop = true
# webhook = "https://hooks.example.com/flotilla"
"#;
