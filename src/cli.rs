//! The `flotilla` commands. Library errors are typed; here, at the edge, they become one
//! `error:` line with a `hint:` and an exit code (see [`Exit`]). No stack traces.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use flotilla_actors::protocol::{EventKind, RunOutcome};
use futures::StreamExt;
use hyper::Method;

use crate::client::{Client, ClientError, Endpoint};
use crate::config::RunConfig;
use crate::daemon::api::{Created, RunSummary};
use crate::daemon::report::RunStatus;
use crate::paths;
use crate::render::{self, Style, Tally};

/// flotilla orchestrates many LLM coding agents on one git repository.
///
/// Start the daemon once with `flotilla daemon`, then submit requests with
/// `flotilla submit "<request>" --repo .` and watch them run.
#[derive(Debug, Parser)]
#[command(name = "flotilla", version, about, long_about)]
pub struct Cli {
    /// State directory (journal, socket, token). Default: $XDG_STATE_HOME/flotilla or
    /// ~/.local/state/flotilla.
    #[arg(long, global = true, env = "FLOTILLA_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// The daemon's Unix socket. Default: <state-dir>/daemon.sock.
    #[arg(long, global = true, env = "FLOTILLA_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Talk to a daemon on loopback TCP instead (it was started with --listen); the bearer
    /// token is read from <state-dir>/token.
    #[arg(long, global = true, env = "FLOTILLA_CONNECT", value_name = "ADDR")]
    pub connect: Option<SocketAddr>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon in the foreground: it resumes unfinished runs and serves the API.
    Daemon {
        /// Serve on loopback TCP (e.g. 127.0.0.1:7070) with a bearer token instead of the
        /// Unix socket. Non-loopback addresses are refused.
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// Log format on stderr.
        #[arg(long, value_enum, default_value_t = LogFormat::Human)]
        log_format: LogFormat,
    },
    /// Start a run and follow it until it ends. Exits 0 only if the run completed.
    Submit {
        /// What to build, in words.
        request: String,
        /// The git repository to work on.
        #[arg(long, default_value = ".")]
        repo: PathBuf,
        /// The run's config file. Default: <repo>/flotilla.toml.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Print the run id and return instead of following the run.
        #[arg(long)]
        detach: bool,
        /// One JSON event per line.
        #[arg(long)]
        json: bool,
    },
    /// Follow a run's events until it ends.
    Tail {
        /// Run id or unique prefix.
        run: String,
        /// One JSON event per line.
        #[arg(long)]
        json: bool,
        /// Only events after this journal sequence number.
        #[arg(long, value_name = "SEQ")]
        since: Option<u64>,
    },
    /// Show a run (state, task tree, spending), or the unfinished runs.
    Status {
        /// Run id or unique prefix.
        run: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Export a run's task graph.
    Graph {
        /// Run id or unique prefix.
        run: String,
        #[arg(long, value_enum, default_value_t = GraphFormat::Mermaid)]
        format: GraphFormat,
    },
    /// Cancel a run.
    Cancel {
        /// Run id or unique prefix.
        run: String,
    },
    /// List all runs, oldest first.
    Runs {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GraphFormat {
    Mermaid,
    Dot,
    Json,
}

/// Exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Ok = 0,
    /// The run failed or was cancelled.
    RunUnsuccessful = 1,
    /// Bad usage or input (clap uses 2 too).
    Usage = 2,
    DaemonNotRunning = 3,
    /// Anything else.
    Failure = 4,
}

/// A user-facing error: what went wrong, and what to do about it.
#[derive(Debug)]
pub struct CliError {
    pub message: String,
    pub hint: Option<String>,
    pub exit: Exit,
}

impl CliError {
    fn usage(message: impl Into<String>, hint: Option<&str>) -> Self {
        CliError {
            message: message.into(),
            hint: hint.map(str::to_owned),
            exit: Exit::Usage,
        }
    }
}

impl From<ClientError> for CliError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::DaemonNotRunning { .. } => CliError {
                message: e.to_string(),
                hint: Some(
                    "start it with `flotilla daemon` (in another terminal, or in the background)"
                        .into(),
                ),
                exit: Exit::DaemonNotRunning,
            },
            ClientError::Api { status, .. } if status.is_client_error() => CliError {
                message: e.to_string(),
                hint: None,
                exit: Exit::Usage,
            },
            other => CliError {
                message: other.to_string(),
                hint: None,
                exit: Exit::Failure,
            },
        }
    }
}

impl Cli {
    pub fn state_dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(paths::default_state_dir)
    }

    pub fn endpoint(&self) -> Result<Endpoint, CliError> {
        let state_dir = self.state_dir();
        if let Some(addr) = self.connect {
            let token_file = paths::token_path(&state_dir);
            let token = std::fs::read_to_string(&token_file).map_err(|e| CliError {
                message: format!(
                    "cannot read the daemon's token {}: {e}",
                    token_file.display()
                ),
                hint: Some("use the same --state-dir as the daemon started with --listen".into()),
                exit: Exit::Usage,
            })?;
            return Ok(Endpoint::Tcp {
                addr,
                token: token.trim().to_string(),
            });
        }
        Ok(Endpoint::Unix(
            self.socket
                .clone()
                .unwrap_or_else(|| paths::socket_path(&state_dir)),
        ))
    }
}

/// Runs a client command (everything but `daemon`).
pub async fn run_client(cli: &Cli) -> Result<Exit, CliError> {
    let client = Client::new(cli.endpoint()?);
    match &cli.command {
        Command::Daemon { .. } => unreachable!("the daemon is started by main"),
        Command::Submit {
            request,
            repo,
            config,
            detach,
            json,
        } => submit(&client, request, repo, config.as_deref(), *detach, *json).await,
        Command::Tail { run, json, since } => {
            let outcome = follow(&client, run, *since, *json).await?;
            Ok(exit_for(outcome))
        }
        Command::Status {
            run: Some(run),
            json,
        } => {
            let status: RunStatus = client.get(&format!("/v1/runs/{run}")).await?;
            if *json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&status).unwrap_or_default()
                );
            } else {
                print_status(&status, &Style::detect());
            }
            Ok(Exit::Ok)
        }
        Command::Status { run: None, json } => {
            let runs: Vec<RunSummary> = client.get("/v1/runs").await?;
            let running: Vec<&RunSummary> = runs.iter().filter(|r| r.state == "running").collect();
            if *json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({
                        "daemon": client.endpoint_label(), "runs": runs.len(), "running": running,
                    }))
                    .unwrap_or_default()
                );
            } else {
                println!("daemon: listening on {}", client.endpoint_label());
                println!("runs: {} in total, {} running", runs.len(), running.len());
                for r in running {
                    println!("  {}  {}", &r.id[..8], shorten(&r.request, 70));
                }
            }
            Ok(Exit::Ok)
        }
        Command::Graph { run, format } => {
            let format = match format {
                GraphFormat::Mermaid => "mermaid",
                GraphFormat::Dot => "dot",
                GraphFormat::Json => "json",
            };
            print!(
                "{}",
                client
                    .text(
                        Method::GET,
                        &format!("/v1/runs/{run}/graph?format={format}")
                    )
                    .await?
            );
            Ok(Exit::Ok)
        }
        Command::Cancel { run } => {
            let answer: serde_json::Value = client
                .json(Method::POST, &format!("/v1/runs/{run}/cancel"), None::<&()>)
                .await?;
            println!("cancelling run {}", answer["id"].as_str().unwrap_or(run));
            Ok(Exit::Ok)
        }
        Command::Runs { json } => {
            let runs: Vec<RunSummary> = client.get("/v1/runs").await?;
            if *json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&runs).unwrap_or_default()
                );
            } else if runs.is_empty() {
                println!("no runs yet; start one with `flotilla submit \"<request>\" --repo .`");
            } else {
                for r in &runs {
                    println!(
                        "{}  {:<9}  {}  {}",
                        &r.id[..8],
                        r.state,
                        render::clock(r.created_ms),
                        shorten(&r.request, 70)
                    );
                }
            }
            Ok(Exit::Ok)
        }
    }
}

fn shorten(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or("");
    if line.chars().count() <= max {
        line.to_string()
    } else {
        format!("{}…", line.chars().take(max - 1).collect::<String>())
    }
}

fn exit_for(outcome: Option<RunOutcome>) -> Exit {
    match outcome {
        Some(RunOutcome::Completed) => Exit::Ok,
        Some(_) => Exit::RunUnsuccessful,
        None => Exit::Failure,
    }
}

async fn submit(
    client: &Client,
    request: &str,
    repo: &Path,
    config: Option<&Path>,
    detach: bool,
    json: bool,
) -> Result<Exit, CliError> {
    let repo = std::fs::canonicalize(repo).map_err(|e| {
        CliError::usage(
            format!("repository {}: {e}", repo.display()),
            Some("pass --repo PATH"),
        )
    })?;
    let config_path = config
        .map(Path::to_path_buf)
        .unwrap_or_else(|| repo.join("flotilla.toml"));
    let run_config = RunConfig::load(&config_path).map_err(|e| {
        CliError::usage(
            e.to_string(),
            Some(
                "see docs/scenarios.md for the config and scenario formats, or pass --config FILE",
            ),
        )
    })?;
    let body = serde_json::json!({ "request": request, "repo": repo, "config": run_config });
    let created: Created = client.json(Method::POST, "/v1/runs", Some(&body)).await?;
    if detach {
        println!("{}", created.id);
        return Ok(Exit::Ok);
    }
    if !json {
        eprintln!(
            "run {} submitted; following it (Ctrl-C stops following, not the run)",
            created.id
        );
    }
    let outcome = follow(client, &created.id, None, json).await?;
    Ok(exit_for(outcome))
}

/// Prints a run's events until `run_finished`, reconnecting (from the last seq) if the
/// daemon restarts meanwhile. Returns the outcome.
pub async fn follow(
    client: &Client,
    run: &str,
    since: Option<u64>,
    json: bool,
) -> Result<Option<RunOutcome>, CliError> {
    let style = Style::detect();
    let live = style.live && !json;
    let mut tally = Tally::default();
    let mut last = since;
    // When the daemon goes away mid-run, keep trying for a minute: it resumes the run.
    let mut lost_at: Option<std::time::Instant> = None;
    loop {
        let mut stream = match client.events(run, last).await {
            Ok(stream) => {
                lost_at = None;
                stream
            }
            Err(ClientError::DaemonNotRunning { .. })
                if lost_at.is_some_and(|t| t.elapsed() < Duration::from_secs(60)) =>
            {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        // On a terminal the summary's clock ticks between events too.
        let mut ticker = tokio::time::interval(Duration::from_secs(1));
        loop {
            let item = tokio::select! {
                item = stream.next() => item,
                _ = ticker.tick(), if live && tally.started() => {
                    print!("\r\x1b[2K{}", style.dim(&tally.summary(now_ms())));
                    use std::io::Write;
                    let _ = std::io::stdout().flush();
                    continue;
                }
            };
            let event = match item {
                Some(Ok(event)) => event,
                _ => break,
            };
            // Notices (seq 0) are not in the journal: resuming from them would replay all.
            if event.seq > 0 {
                last = Some(event.seq);
            }
            if json {
                println!("{}", serde_json::to_string(&event).unwrap_or_default());
            } else {
                tally.observe(&event);
                if live {
                    print!("\r\x1b[2K");
                }
                println!("{}", render::event_line(&event, &style));
                if live {
                    print!("{}", style.dim(&tally.summary(now_ms())));
                    use std::io::Write;
                    let _ = std::io::stdout().flush();
                }
            }
            if let EventKind::RunFinished { outcome, .. } = event.kind {
                if live {
                    println!();
                }
                return Ok(Some(outcome));
            }
        }
        // The stream ended without the run ending: the daemon went away. Try again.
        if !json {
            eprintln!("{}", style.dim("lost the daemon; reconnecting…"));
        }
        lost_at.get_or_insert_with(std::time::Instant::now);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn print_status(status: &RunStatus, style: &Style) {
    let state = match status.state.as_str() {
        "completed" => style.good(&status.state),
        "running" => status.state.clone(),
        _ => style.bad(&status.state),
    };
    println!("run {}  {state}", style.bold(&status.id));
    println!("request: {}", shorten(&status.request, 100));
    println!("repo:    {}", status.repo);
    let c = &status.counts;
    println!(
        "tasks:   {} total · {} completed · {} running · {} waiting · {} pending · {} failed · {} cancelled",
        c.total, c.completed, c.running, c.waiting, c.pending, c.failed, c.cancelled
    );
    println!(
        "spent:   {} tokens in · {} tokens out · ${:.4}",
        status.tokens_in, status.tokens_out, status.cost_usd
    );
    for t in &status.graph.tasks {
        let indent = "  ".repeat(t.id.depth() as usize - 1);
        let summary = t
            .summary
            .as_deref()
            .map(|s| format!(" — {}", shorten(s, 60)))
            .unwrap_or_default();
        println!(
            "  {indent}{} [{}] {}{summary}",
            t.id,
            t.state,
            shorten(&t.description, 60)
        );
    }
}
