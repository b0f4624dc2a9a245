//! `flotilla doctor`: whether this machine and repository can run flotilla, one line per
//! thing checked: the sandbox (bwrap, tried for real, as submit does), git, the state
//! directory (writable), the repository's config, each configured model (called once, as
//! `providers check` does) and each `[agents.NAME]` CLI (on `PATH`). Exits 0 only if
//! nothing failed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cli::emit;
use crate::cli::error::{CliError, Exit};
use crate::config::RunConfig;
use crate::providers::ProviderRegistry;
use crate::providers::settings::ProviderSettings;
use crate::sandbox::SandboxPolicy;
use crate::text_safety::terminal_safe;

/// One checked thing.
struct Line {
    state: State,
    what: String,
    detail: String,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Ok,
    Failed,
    /// Not checked, for a reason that is no fault (no config yet, no models configured).
    Skipped,
}

impl Line {
    fn new(state: State, what: impl Into<String>, detail: impl Into<String>) -> Self {
        Line {
            state,
            what: what.into(),
            detail: detail.into(),
        }
    }

    fn text(&self) -> String {
        let state = match self.state {
            State::Ok => "ok",
            State::Failed => "FAIL",
            State::Skipped => "-",
        };
        // Details hold other programs' words (bwrap's, a provider's): escaped, one line.
        let detail = terminal_safe(&self.detail).replace('\n', " ");
        format!("{state:<5}{:<22}{detail}\n", terminal_safe(&self.what))
    }
}

pub async fn run(
    state_dir: &Path,
    repo: &Path,
    config: Option<&Path>,
    timeout: u64,
) -> Result<Exit, CliError> {
    let config_path = config
        .map(Path::to_path_buf)
        .unwrap_or_else(|| repo.join(super::init::CONFIG_FILE));
    let mut failed = false;
    let mut say = |line: Line| -> Result<(), CliError> {
        failed |= line.state == State::Failed;
        emit(&line.text())
    };

    let (loaded, config_line) = if config_path.exists() {
        match RunConfig::load(&config_path) {
            Ok(c) => (
                Some(c),
                Line::new(State::Ok, "config", config_path.display().to_string()),
            ),
            Err(e) => (
                None,
                Line::new(
                    State::Failed,
                    "config",
                    format!("{e} (`flotilla config check` says more)"),
                ),
            ),
        }
    } else {
        (
            None,
            Line::new(
                State::Skipped,
                "config",
                format!("no {} (`flotilla init` writes one)", config_path.display()),
            ),
        )
    };

    // The sandbox this repository's runs would get (the default one without a config).
    let policy = match &loaded {
        Some(c) => SandboxPolicy::for_run(&c.sandbox, &[state_dir.to_path_buf()], repo),
        None => SandboxPolicy::default(),
    };
    say(match crate::process::probe(&policy).await {
        Ok(described) => Line::new(State::Ok, "sandbox", described),
        Err(e) => Line::new(State::Failed, "sandbox", e.to_string()),
    })?;
    say(git().await)?;
    say(state_dir_line(state_dir).await)?;
    say(config_line)?;

    let models = match &loaded {
        Some(c) => Some(c.models.clone()),
        // A config that fails for another reason may still name its models.
        None if config_path.exists() => RunConfig::load_models(&config_path).ok(),
        None => None,
    };
    if let Some(models) = models {
        for line in providers(&models, timeout).await? {
            say(line)?;
        }
    }
    if let Some(config) = &loaded {
        for (name, agent) in &config.agents {
            let what = format!("agent {name}");
            say(match agent.resolved() {
                Ok(resolved) => match find_program(&resolved.program, repo) {
                    Some(found) => Line::new(State::Ok, what, found.display().to_string()),
                    None => Line::new(
                        State::Failed,
                        what,
                        format!("{} is not on PATH", resolved.program),
                    ),
                },
                Err(e) => Line::new(State::Failed, what, e.to_string()),
            })?;
        }
    }
    Ok(if failed { Exit::Failure } else { Exit::Ok })
}

async fn git() -> Line {
    match tokio::process::Command::new("git")
        .arg("--version")
        .kill_on_drop(true)
        .output()
        .await
    {
        Ok(out) if out.status.success() => Line::new(
            State::Ok,
            "git",
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        ),
        Ok(out) => Line::new(
            State::Failed,
            "git",
            format!("`git --version` failed: {}", out.status),
        ),
        Err(e) => Line::new(State::Failed, "git", format!("cannot run git: {e}")),
    }
}

/// The state directory exists (or can be made) and takes a file.
async fn state_dir_line(dir: &Path) -> Line {
    let dir = dir.to_path_buf();
    let what = "state directory";
    let probe = dir.join(format!(".doctor-{}", std::process::id()));
    let result = tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&dir)?;
        std::fs::write(&probe, b"")?;
        std::fs::remove_file(&probe)?;
        Ok::<_, std::io::Error>(dir)
    })
    .await;
    match result {
        Ok(Ok(dir)) => Line::new(State::Ok, what, format!("{} is writable", dir.display())),
        Ok(Err(e)) => Line::new(State::Failed, what, format!("not writable: {e}")),
        Err(e) => Line::new(State::Failed, what, format!("the check failed: {e}")),
    }
}

async fn providers(models: &ProviderSettings, timeout: u64) -> Result<Vec<Line>, CliError> {
    if models.roles == Default::default() {
        return Ok(vec![Line::new(
            State::Skipped,
            "providers",
            "no [roles]: every role is scripted",
        )]);
    }
    let registry = ProviderRegistry::new()
        .map_err(|e| CliError::internal("cannot set up the HTTP client").because(e))?;
    let results = registry
        .check(models, Duration::from_secs(timeout.max(1)))
        .await;
    Ok(results
        .into_iter()
        .map(|r| {
            let what = format!("provider {}", r.role);
            if r.reachable {
                Line::new(
                    State::Ok,
                    what,
                    format!("{} reachable ({} ms)", r.model, r.latency_ms),
                )
            } else {
                Line::new(
                    State::Failed,
                    what,
                    format!("{} unreachable: {}", r.model, r.error.unwrap_or_default()),
                )
            }
        })
        .collect())
}

/// Where `program` is: a path (relative to the repository), or the first executable of
/// that name on this shell's `PATH` (the daemon is started from one like it).
fn find_program(program: &str, repo: &Path) -> Option<PathBuf> {
    if program.contains('/') {
        let path = repo.join(program);
        return is_executable(&path).then_some(path);
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .filter(|dir| !dir.as_os_str().is_empty())
            .map(|dir| dir.join(program))
            .find(|p| is_executable(p))
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
