//! The `flotilla` commands. Library errors are typed; here, at the edge, they become one
//! `error:` line with a `hint:` and an exit code (see [`Exit`]). No stack traces.
//!
//! Commands: `daemon`, `submit`, `tail`, `status`, `graph`, `cancel`, `runs`, `decide`,
//! `providers check`, `gc`. A closed stdout ends a command quietly; Ctrl-C while following a
//! run stops following (exit 130) and says how to resume (`tail RUN --since SEQ`); API errors
//! get hints.

pub mod client;
pub mod render;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use flotilla_actors::protocol::{EventKind, RunOutcome, TaskId, UserDecision};
use futures::StreamExt;
use hyper::Method;

use crate::api::gc::GcReport;
use crate::api::runs::{CreateRun, RunSummary};
use crate::api::status::{RunStatus, TaskStory};
use crate::config::RunConfig;
use crate::journal::JournalSync;
use crate::paths;
use crate::providers::ProviderRegistry;
use crate::text_safety;
use client::{Client, ClientError, Endpoint, segment};
use render::live::LiveLine;
use render::style::{CLEAR_LINE, Style};

/// flotilla orchestrates many LLM coding agents on one git repository.
///
/// Start the daemon once with `flotilla daemon`, then submit requests with
/// `flotilla submit "<request>" --repo .` and watch them run.
#[derive(Debug, Parser)]
#[command(name = "flotilla", version, about, long_about)]
pub struct Cli {
    /// Where the daemon is (also accepted after the subcommand that talks to it).
    #[command(flatten)]
    pub address: ClientAddress,
    #[command(subcommand)]
    pub command: Command,
}

/// Where the daemon keeps its state and serves: for `daemon` and the commands that talk to
/// it, and nowhere else (`bench` and `providers check` need no daemon).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DaemonAddress {
    /// State directory (journal, socket, token). Default: $XDG_STATE_HOME/flotilla or
    /// ~/.local/state/flotilla.
    #[arg(long, env = "FLOTILLA_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// The daemon's Unix socket. Default: <state-dir>/daemon.sock.
    #[arg(long, env = "FLOTILLA_SOCKET")]
    pub socket: Option<PathBuf>,
}

/// [`DaemonAddress`], and for the commands that talk to a daemon, loopback TCP.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientAddress {
    #[command(flatten)]
    pub daemon: DaemonAddress,
    /// Talk to a daemon on loopback TCP instead (it was started with --listen); the bearer
    /// token is read from <state-dir>/token.
    #[arg(long, env = "FLOTILLA_CONNECT", value_name = "ADDR")]
    pub connect: Option<SocketAddr>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon in the foreground: it resumes unfinished runs and serves the API.
    ///
    /// It logs to stderr (set the level with FLOTILLA_LOG, e.g. FLOTILLA_LOG=debug; redirect
    /// stderr to keep it out of your terminal, e.g. `flotilla daemon 2>daemon.log &`). Stop
    /// it with Ctrl-C or SIGTERM: runs resume when it starts again. While it runs, its PID is
    /// in <state-dir>/daemon.lock.
    Daemon {
        #[command(flatten)]
        address: DaemonAddress,
        /// Serve on loopback TCP (e.g. 127.0.0.1:7070) with a bearer token instead of the
        /// Unix socket. Non-loopback addresses are refused.
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// Log format on stderr.
        #[arg(long, value_enum, default_value_t = LogFormat::Human)]
        log_format: LogFormat,
        /// How far each journal commit goes before the run acts on it: `normal` survives a
        /// crash of the daemon (kill -9, a panic); `full` also survives an OS crash or power
        /// loss, at the cost of an fsync per commit.
        #[arg(long, value_enum, default_value_t = JournalSync::Normal)]
        journal_sync: JournalSync,
    },
    /// Start a run and follow it until it ends. Exits 0 only if the run completed.
    Submit {
        #[command(flatten)]
        address: ClientAddress,
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
        #[command(flatten)]
        address: ClientAddress,
        /// Run id or unique prefix.
        run: String,
        /// One JSON event per line.
        #[arg(long)]
        json: bool,
        /// Only events after this journal sequence number.
        #[arg(long, value_name = "SEQ")]
        since: Option<u64>,
    },
    /// Show a run (state, task tree, spending), or the unfinished runs; with a task, that
    /// task's whole story: its attempts, why each failed (in full), its handoff, findings,
    /// branch and landing, and the fixes made for it.
    ///
    /// Examples: `flotilla status`, `flotilla status 01a2`, `flotilla status 01a2 t4`.
    Status {
        #[command(flatten)]
        address: ClientAddress,
        /// Run id or unique prefix.
        run: Option<String>,
        /// A task of the run (e.g. t4, t4.2, f1).
        task: Option<String>,
        /// Print the status as JSON (the API's answer) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Export a run's task graph.
    Graph {
        #[command(flatten)]
        address: ClientAddress,
        /// Run id or unique prefix.
        run: String,
        /// Mermaid (paste into a Markdown file), Graphviz DOT (`| dot -Tsvg`), or the JSON
        /// task list.
        #[arg(long, value_enum, default_value_t = GraphFormat::Mermaid)]
        format: GraphFormat,
    },
    /// Cancel a run.
    Cancel {
        #[command(flatten)]
        address: ClientAddress,
        /// Run id or unique prefix.
        run: String,
    },
    /// Remove what runs that are no longer running left behind: their attempts' worktrees
    /// (under <state-dir>/worktrees) and the branches of attempts that never delivered.
    ///
    /// Branches holding delivered work stay (`git branch --list 'flotilla/*'` in the
    /// repository lists them). The daemon does this by itself at every start; this is for
    /// when you want it now.
    Gc {
        #[command(flatten)]
        address: ClientAddress,
        /// Only say what would be removed.
        #[arg(long)]
        dry_run: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Decide for a task that waits for you: its subplan stops on `user_decision`, and
    /// every subtask has ended, or its work changes flotilla's own configuration and waits
    /// to land (`tail` shows "t4 waits for your decision"). Or, for a run whose landing
    /// paused because main no longer holds what it landed (`tail` shows "main was moved"),
    /// adopt main as it is (`--adopt-main`) or end the run (`--cancel`).
    ///
    /// Examples: `flotilla decide 01a2 t4 --accept t4.2`, `flotilla decide 01a2 t4 --fail`,
    /// `flotilla decide 01a2 --adopt-main`.
    #[command(group(clap::ArgGroup::new("decision").required(true).multiple(false)))]
    Decide {
        #[command(flatten)]
        address: ClientAddress,
        /// Run id or unique prefix.
        run: String,
        /// The waiting task (e.g. t4); none for a decision about the whole run.
        #[arg(required_unless_present_any = ["adopt_main", "cancel"], conflicts_with_all = ["adopt_main", "cancel"])]
        task: Option<String>,
        /// Complete the task with this completed subtask's result as its own (no synthesis).
        #[arg(long, value_name = "SUBTASK", group = "decision")]
        accept: Option<String>,
        /// Complete the task by synthesizing its subtasks' results, as if its stop condition
        /// had held.
        #[arg(long, group = "decision")]
        complete: bool,
        /// Fail the task (declined by the user).
        #[arg(long, group = "decision")]
        fail: bool,
        /// Let a task whose work changes flotilla's own configuration land (it waits for
        /// this: `[checks] config_edits`).
        #[arg(long, group = "decision")]
        land: bool,
        /// The run's landing paused because main was reset or moved aside: land on main as
        /// it is now. Tasks whose landed work main no longer holds are named, and stay
        /// dropped (nothing is replayed).
        #[arg(long, group = "decision")]
        adopt_main: bool,
        /// End the run instead (as `flotilla cancel`).
        #[arg(long, group = "decision")]
        cancel: bool,
    },
    /// List all runs, oldest first.
    Runs {
        #[command(flatten)]
        address: ClientAddress,
        /// Print the runs as JSON (the API's answer) instead of one line each.
        #[arg(long)]
        json: bool,
    },
    /// The LLM providers configured in flotilla.toml ([providers], [roles]).
    Providers {
        #[command(subcommand)]
        action: ProvidersAction,
    },
    /// Measure flotilla here, without a daemon: throughput, dispatch latency and memory of
    /// the actor pipeline, how the cost per task scales, and dispatch policies' makespan.
    ///
    /// Throughput runs push instant tasks (the scripted agent, no git) through TaskGraph,
    /// Dispatch and the workers of one run, with the SQLite journal in a temporary
    /// directory (synchronous=NORMAL) and again with a journal in memory, so the journal's
    /// cost shows. "ready→assigned" is from when a task could be assigned (ready, with a
    /// slot free) to its dispatch. The makespan rows simulate random DAGs on virtual time
    /// with critical-path-first and FIFO dispatch. Build with --release for numbers worth
    /// quoting; on a busy machine, compare medians of several runs.
    ///
    /// Example: `flotilla bench --tasks 500 --chain 100 --scaling 500,5000 --json`.
    Bench {
        /// Independent instant tasks per throughput run.
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        tasks: u64,
        /// Tasks in the chain run (each depends on the one before); 0 leaves it out.
        #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
        chain: u64,
        /// Sizes of the scaling runs, comma-separated; `none` leaves them out.
        #[arg(long, default_value = "1000,10000,50000", value_name = "N,N,...")]
        scaling: String,
        /// Worker slots (attempts at once) in the throughput runs.
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
        workers: u64,
        /// Leave out the makespan simulations.
        #[arg(long)]
        no_makespan: bool,
        /// Runs of --tasks tasks one after another, with the resident set after each
        /// (after a collection point) against the idle one; 0 leaves them out.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=1_000))]
        memory_runs: u64,
        /// One JSON object per measurement, one per line.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ProvidersAction {
    /// Call every model of every configured role once, with a one-line prompt and no
    /// retries, and print per role whether it answered, the model, the latency and the
    /// error. Exits 0 only if every one answered.
    ///
    /// It runs here, not in the daemon: keys are read from this shell's environment
    /// (api_key_env), as the daemon reads them from its own; start the daemon from a shell
    /// where the same variables are set.
    Check {
        /// The config file. Default: <repo>/flotilla.toml.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The repository whose flotilla.toml to read.
        #[arg(long, default_value = ".")]
        repo: PathBuf,
        /// Seconds each call may take.
        #[arg(long, default_value_t = 60, value_name = "SECS")]
        timeout: u64,
        /// One JSON object per model.
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
    /// Stopped by Ctrl-C (128 + SIGINT, as shells report it).
    Interrupted = 130,
}

/// A user-facing error: what went wrong, and what to do about it.
#[derive(Debug)]
pub struct CliError {
    pub message: String,
    pub hint: Option<String>,
    pub exit: Exit,
}

impl CliError {
    /// Standard output was closed by its reader: stop, print nothing, exit 0.
    pub fn output_closed() -> Self {
        CliError {
            message: String::new(),
            hint: None,
            exit: Exit::Ok,
        }
    }

    /// Whether there is nothing to report (see [`CliError::output_closed`]).
    pub fn is_quiet(&self) -> bool {
        self.message.is_empty()
    }

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
            ClientError::Api {
                status,
                ref message,
            } => {
                let hint = api_hint(status, message).map(str::to_owned);
                CliError {
                    message: e.to_string(),
                    hint,
                    exit: if status.is_client_error() {
                        Exit::Usage
                    } else {
                        Exit::Failure
                    },
                }
            }
            other => CliError {
                message: other.to_string(),
                hint: None,
                exit: Exit::Failure,
            },
        }
    }
}

/// What to do about a common API error, when there is something to say.
fn api_hint(status: hyper::StatusCode, message: &str) -> Option<&'static str> {
    use hyper::StatusCode as S;
    match status {
        S::NOT_FOUND if message.starts_with("no run matches") => {
            Some("see `flotilla runs` for the runs this daemon knows")
        }
        S::BAD_REQUEST if message.contains("is not a run id") => Some(
            "a run id is what `submit --detach` printed (or any unique prefix of it); see `flotilla runs`",
        ),
        S::CONFLICT if message.contains("matches") && message.contains("runs:") => {
            Some("give more of the id; `flotilla runs` prints prefixes that are unique")
        }
        S::UNAUTHORIZED => {
            Some("the token is read from <state-dir>/token: use the same --state-dir as the daemon")
        }
        S::SERVICE_UNAVAILABLE => Some("the daemon is busy or restarting a run; try again shortly"),
        _ => None,
    }
}

impl Command {
    /// Where this command finds the daemon, when it talks to one.
    fn client_address(&self) -> Option<&ClientAddress> {
        match self {
            Command::Submit { address, .. }
            | Command::Tail { address, .. }
            | Command::Status { address, .. }
            | Command::Graph { address, .. }
            | Command::Cancel { address, .. }
            | Command::Gc { address, .. }
            | Command::Decide { address, .. }
            | Command::Runs { address, .. } => Some(address),
            Command::Daemon { .. } | Command::Providers { .. } | Command::Bench { .. } => None,
        }
    }

    fn daemon_address(&self) -> Option<&DaemonAddress> {
        match self {
            Command::Daemon { address, .. } => Some(address),
            other => other.client_address().map(|a| &a.daemon),
        }
    }
}

impl Cli {
    /// The state directory: given after the subcommand, before it, or the default.
    pub fn state_dir(&self) -> PathBuf {
        self.command
            .daemon_address()
            .and_then(|a| a.state_dir.clone())
            .or_else(|| self.address.daemon.state_dir.clone())
            .unwrap_or_else(paths::default_state_dir)
    }

    /// The Unix socket given after the subcommand or before it, if any.
    pub fn socket(&self) -> Option<PathBuf> {
        self.command
            .daemon_address()
            .and_then(|a| a.socket.clone())
            .or_else(|| self.address.daemon.socket.clone())
    }

    fn connect(&self) -> Option<SocketAddr> {
        self.command
            .client_address()
            .and_then(|a| a.connect)
            .or(self.address.connect)
    }

    pub fn endpoint(&self) -> Result<Endpoint, CliError> {
        let state_dir = self.state_dir();
        if let Some(addr) = self.connect() {
            // The bearer token travels in cleartext: it may only go to this machine, as the
            // daemon only listens there.
            if !addr.ip().is_loopback() {
                return Err(CliError::usage(
                    format!(
                        "--connect {addr} is not a loopback address; the bearer token would \
                         cross the network in cleartext"
                    ),
                    Some(
                        "the daemon listens only on loopback (e.g. --connect 127.0.0.1:7070); \
                         reach another machine through an SSH tunnel",
                    ),
                ));
            }
            let token_file = paths::token_path(&state_dir);
            let token = crate::config::read(&token_file).map_err(|e| CliError {
                message: format!("the daemon's token: {e}"),
                hint: Some("use the same --state-dir as the daemon started with --listen".into()),
                exit: Exit::Usage,
            })?;
            return Ok(Endpoint::Tcp {
                addr,
                token: token.trim().to_string(),
            });
        }
        Ok(Endpoint::Unix(
            self.socket()
                .unwrap_or_else(|| paths::socket_path(&state_dir)),
        ))
    }
}

/// Runs a client command (everything but `daemon`).
pub async fn run_client(cli: &Cli) -> Result<Exit, CliError> {
    // Checking providers needs no daemon.
    if let Command::Providers {
        action:
            ProvidersAction::Check {
                config,
                repo,
                timeout,
                json,
            },
    } = &cli.command
    {
        return check_providers(config.as_deref(), repo, *timeout, *json).await;
    }
    let client = Client::new(cli.endpoint()?);
    match &cli.command {
        Command::Daemon { .. } => unreachable!("the daemon is started by main"),
        Command::Bench { .. } => unreachable!("the bench is run by main, outside any runtime"),
        Command::Submit {
            request,
            repo,
            config,
            detach,
            json,
            ..
        } => submit(&client, request, repo, config.as_deref(), *detach, *json).await,
        Command::Tail {
            run, json, since, ..
        } => {
            let outcome = follow(&client, run, *since, *json).await?;
            Ok(exit_for(outcome))
        }
        Command::Status {
            run: Some(run),
            task: Some(task),
            json,
            ..
        } => {
            let story: TaskStory = client
                .get(&format!(
                    "/v1/runs/{}/tasks/{}",
                    segment(run),
                    segment(task)
                ))
                .await?;
            if *json {
                emit(&format!("{}\n", text_safety::json_pretty(&story)))?;
            } else {
                emit(&render::status::task_story_text(&story, &Style::detect()))?;
            }
            Ok(Exit::Ok)
        }
        Command::Status {
            run: Some(run),
            task: None,
            json,
            ..
        } => {
            let status: RunStatus = client.get(&format!("/v1/runs/{}", segment(run))).await?;
            if *json {
                emit(&format!("{}\n", text_safety::json_pretty(&status)))?;
            } else {
                emit(&render::status::status_text(&status, &Style::detect()))?;
            }
            Ok(Exit::Ok)
        }
        Command::Status {
            run: None, json, ..
        } => {
            let runs: Vec<RunSummary> = client.get("/v1/runs").await?;
            if *json {
                let running: Vec<&RunSummary> =
                    runs.iter().filter(|r| r.state == "running").collect();
                // Damaged and paused runs need the user's attention as much as running ones.
                let attention: Vec<&RunSummary> = runs
                    .iter()
                    .filter(|r| r.state != "running" && render::lists::needs_listing(r))
                    .collect();
                emit(&format!(
                    "{}\n",
                    text_safety::json_pretty(&serde_json::json!({
                        "daemon": client.endpoint_label(), "runs": runs.len(), "running": running,
                        "needs_attention": attention,
                    }))
                ))?;
            } else {
                emit(&render::lists::daemon_text(&client.endpoint_label(), &runs))?;
            }
            Ok(Exit::Ok)
        }
        Command::Graph { run, format, .. } => {
            let name = match format {
                GraphFormat::Mermaid => "mermaid",
                GraphFormat::Dot => "dot",
                GraphFormat::Json => "json",
            };
            let text = client
                .text(
                    Method::GET,
                    &format!("/v1/runs/{}/graph?format={name}", segment(run)),
                )
                .await?;
            match format {
                GraphFormat::Json => emit(&text_safety::json_safe(&text))?,
                GraphFormat::Mermaid | GraphFormat::Dot => {
                    emit(&text_safety::terminal_safe_lines(&text))?
                }
            }
            Ok(Exit::Ok)
        }
        Command::Cancel { run, .. } => {
            let answer: serde_json::Value = client
                .json(
                    Method::POST,
                    &format!("/v1/runs/{}/cancel", segment(run)),
                    None::<&()>,
                )
                .await?;
            let id = answer["id"].as_str().unwrap_or(run);
            emit(&format!(
                "cancelling run {}\n",
                text_safety::terminal_safe(id)
            ))?;
            Ok(Exit::Ok)
        }
        Command::Gc { dry_run, json, .. } => {
            let path = if *dry_run {
                "/v1/gc?dry_run=true"
            } else {
                "/v1/gc"
            };
            let report: GcReport = client.json(Method::POST, path, None::<&()>).await?;
            if *json {
                emit(&format!(
                    "{}\n",
                    text_safety::json_safe(&serde_json::to_string(&report).unwrap_or_default())
                ))?;
                return Ok(Exit::Ok);
            }
            let verb = if report.dry_run {
                "would remove"
            } else {
                "removed"
            };
            if report.worktrees.is_empty()
                && report.unknown.is_empty()
                && report.branches.is_empty()
                && report.locks.is_empty()
            {
                emit("nothing to collect\n")?;
            } else {
                emit(&format!(
                    "{verb} {} worktree(s), {} branch(es) and {} stale ref lock(s) of finished runs, {} unknown director(ies)\n",
                    report.worktrees.len(),
                    report.branches.len(),
                    report.locks.len(),
                    report.unknown.len()
                ))?;
                for line in report
                    .worktrees
                    .iter()
                    .chain(&report.branches)
                    .chain(&report.locks)
                    .chain(&report.unknown)
                {
                    emit(&format!("  {}\n", text_safety::terminal_safe(line)))?;
                }
            }
            for error in &report.errors {
                emit(&format!(
                    "could not collect: {}\n",
                    text_safety::terminal_safe(error)
                ))?;
            }
            Ok(if report.errors.is_empty() {
                Exit::Ok
            } else {
                Exit::Failure
            })
        }
        Command::Decide {
            run, adopt_main, ..
        } if *adopt_main => {
            let answer: serde_json::Value = client
                .json(
                    Method::POST,
                    &format!("/v1/runs/{}/decision", segment(run)),
                    Some(&serde_json::json!({"decision": "adopt_main"})),
                )
                .await?;
            let actual = answer["actual"].as_str().unwrap_or_default();
            emit(&format!(
                "decided: landing goes on on main as it is ({}); `tail` names the tasks whose \
                 landed work main no longer holds\n",
                text_safety::terminal_safe(actual.get(..12).unwrap_or(actual))
            ))?;
            Ok(Exit::Ok)
        }
        Command::Decide { run, cancel, .. } if *cancel => {
            let answer: serde_json::Value = client
                .json(
                    Method::POST,
                    &format!("/v1/runs/{}/cancel", segment(run)),
                    None::<&()>,
                )
                .await?;
            let id = answer["id"].as_str().unwrap_or(run);
            emit(&format!(
                "decided: run {} is cancelled\n",
                text_safety::terminal_safe(id)
            ))?;
            Ok(Exit::Ok)
        }
        Command::Decide {
            run,
            task,
            accept,
            complete: _,
            fail,
            land,
            ..
        } => {
            // clap requires a task unless the decision is about the whole run.
            let task = task.as_deref().unwrap_or_default();
            let (decision, words) = match (accept, fail) {
                _ if *land => (
                    UserDecision::Land,
                    format!("{task} lands its change to flotilla's configuration"),
                ),
                (Some(subtask), _) => {
                    let subtask: TaskId = subtask.parse().map_err(|_| {
                        CliError::usage(
                            format!("{subtask:?} is not a task id"),
                            Some("task ids look like t4 or t4.2"),
                        )
                    })?;
                    let words = format!("{task} completes with {subtask}'s result");
                    (UserDecision::Accept { subtask }, words)
                }
                (None, true) => (UserDecision::Fail, format!("{task} fails")),
                // clap requires exactly one of the three.
                (None, false) => (
                    UserDecision::Complete,
                    format!("{task} synthesizes its subtasks' results"),
                ),
            };
            client
                .json::<serde_json::Value>(
                    Method::POST,
                    &format!("/v1/runs/{}/tasks/{}/decision", segment(run), segment(task)),
                    Some(&decision),
                )
                .await?;
            emit(&format!(
                "decided: {}\n",
                text_safety::terminal_safe(&words)
            ))?;
            Ok(Exit::Ok)
        }
        Command::Providers { .. } => unreachable!("answered above, without the daemon"),
        Command::Runs { json, .. } => {
            let runs: Vec<RunSummary> = client.get("/v1/runs").await?;
            if *json {
                emit(&format!("{}\n", text_safety::json_pretty(&runs)))?;
            } else if runs.is_empty() {
                emit("no runs yet; start one with `flotilla submit \"<request>\" --repo .`\n")?;
            } else {
                emit(&render::lists::runs_text(&runs))?;
            }
            Ok(Exit::Ok)
        }
    }
}

async fn check_providers(
    config: Option<&Path>,
    repo: &Path,
    timeout: u64,
    json: bool,
) -> Result<Exit, CliError> {
    let path = config
        .map(Path::to_path_buf)
        .unwrap_or_else(|| repo.join("flotilla.toml"));
    let models = RunConfig::load_models(&path).map_err(|e| {
        CliError::usage(
            e.to_string(),
            Some("see docs/configuration.md for [providers] and [roles]"),
        )
    })?;
    if models.roles == Default::default() {
        return Err(CliError::usage(
            format!(
                "{} configures no [roles]: every role is scripted",
                path.display()
            ),
            Some("see docs/configuration.md for [providers] and [roles]"),
        ));
    }
    let registry = ProviderRegistry::new().map_err(|e| CliError {
        message: format!("cannot set up the HTTP client: {e}"),
        hint: None,
        exit: Exit::Failure,
    })?;
    let results = registry
        .check(&models, Duration::from_secs(timeout.max(1)))
        .await;
    if json {
        for result in &results {
            emit(&format!("{}\n", text_safety::json_line(result)))?;
        }
    } else {
        emit(&render::lists::provider_checks_text(&results))?;
    }
    Ok(if results.iter().all(|r| r.reachable) {
        Exit::Ok
    } else {
        Exit::Failure
    })
}

/// Writes to stdout. A closed pipe (the reader went away, as in `flotilla tail RUN | head`)
/// ends the command quietly instead of panicking, as `println!` would.
fn emit(text: &str) -> Result<(), CliError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(CliError::output_closed()),
        Err(e) => Err(CliError {
            message: format!("cannot write the output: {e}"),
            hint: None,
            exit: Exit::Failure,
        }),
    }
}

/// Writes a note to stderr; a closed stderr is not worth failing for.
fn note(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{text}");
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
    let run_config = RunConfig::load(&config_path)
        .map_err(|e| CliError::usage(e.to_string(), Some(e.hint())))?;
    let body = CreateRun {
        request: request.to_string(),
        repo,
        config: Some(run_config),
    };
    let created = client.submit(&body).await?;
    // The branch the run lands on (ADR-022), said where the user reads.
    let landing = created
        .branch
        .as_deref()
        .map(|b| format!(", landing on {}", text_safety::terminal_safe(b)))
        .unwrap_or_default();
    if detach {
        emit(&format!("{}\n", text_safety::terminal_safe(&created.id)))?;
        if !json && !landing.is_empty() {
            note(&format!(
                "run {} submitted{landing}",
                text_safety::terminal_safe(&created.id)
            ));
        }
        return Ok(Exit::Ok);
    }
    if !json {
        note(&format!(
            "run {} submitted{landing}; following it (Ctrl-C stops following, not the run)",
            text_safety::terminal_safe(&created.id)
        ));
    }
    let outcome = follow(client, &created.id, None, json).await?;
    Ok(exit_for(outcome))
}

/// The outcome of a run that has finished, from its status; `None` while it runs.
async fn finished_outcome(client: &Client, run: &str) -> Result<Option<RunOutcome>, CliError> {
    let status: RunStatus = client.get(&format!("/v1/runs/{}", segment(run))).await?;
    Ok(match status.state.as_str() {
        "completed" => Some(RunOutcome::Completed),
        "failed" => Some(RunOutcome::Failed),
        "cancelled" => Some(RunOutcome::Cancelled),
        _ => None,
    })
}

/// Prints a run's events until `run_finished`, reconnecting (from the last seq) if the
/// daemon restarts meanwhile. Returns the outcome. Ctrl-C stops following (not the run) and
/// says how to follow it again from where it stopped.
pub async fn follow(
    client: &Client,
    run: &str,
    since: Option<u64>,
    json: bool,
) -> Result<Option<RunOutcome>, CliError> {
    let style = Style::detect();
    let live = style.live && !json;
    let last = std::cell::Cell::new(since);
    tokio::select! {
        outcome = follow_from(client, run, &last, json, style) => outcome,
        _ = tokio::signal::ctrl_c() => {
            if live {
                // End the live summary line.
                let _ = emit("\n");
            }
            let since = last
                .get()
                .map(|seq| format!(" --since {seq}"))
                .unwrap_or_default();
            note(&format!(
                "stopped following; run {} goes on in the daemon. Follow it again with \
                 `flotilla tail {}{since}`",
                text_safety::terminal_safe(run),
                text_safety::terminal_safe(run)
            ));
            Err(CliError {
                message: String::new(),
                hint: None,
                exit: Exit::Interrupted,
            })
        }
    }
}

/// [`follow`]'s work; `last` is the seq of the last event printed.
async fn follow_from(
    client: &Client,
    run: &str,
    last: &std::cell::Cell<Option<u64>>,
    json: bool,
    style: Style,
) -> Result<Option<RunOutcome>, CliError> {
    let live = style.live && !json;
    let whole_run = last.get().is_none();
    // Events up to here were printed before (`tail --since`): on a terminal they are still
    // read, from the run's start, and folded into the live line (whose counts are the
    // run's graph), but not printed again.
    let printed_before = last.get().unwrap_or(0);
    // The seq of the last event folded into the live line.
    let mut folded: Option<u64> = None;
    // Whether a live line is on the screen (it ends with a line break when following ends).
    let mut drawn = false;
    let mut status_line = LiveLine::default();
    let mut spend = render::events::SpendFold::default();
    if live {
        // The live line shows spending against the run's budget; without it, spending alone.
        if let Ok(status) = client
            .get::<RunStatus>(&format!("/v1/runs/{}", segment(run)))
            .await
        {
            status_line.set_budget(status.graph.run_budget);
            status_line.set_created(status.created_ms);
        }
    }
    // When the daemon goes away mid-run, keep trying for a minute: it resumes the run.
    let mut lost_at: Option<std::time::Instant> = None;
    loop {
        let from = if live { folded } else { last.get() };
        let mut stream = match client.events(run, from).await {
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
                _ = ticker.tick(), if live && status_line.started() => {
                    drawn = true;
                    emit(&format!(
                        "{CLEAR_LINE}{}",
                        style.dim(&status_line.live_line(now_ms(), render::live::terminal_columns()))
                    ))?;
                    continue;
                }
            };
            let event = match item {
                Some(Ok(event)) => event,
                _ => break,
            };
            if live && event.seq > 0 {
                folded = Some(event.seq);
                if event.seq <= printed_before {
                    status_line.observe(&event);
                    continue;
                }
            }
            // Notices (seq 0) are not in the journal: resuming from them would replay all.
            if event.seq > 0 {
                last.set(Some(event.seq));
            }
            if json {
                emit(&format!("{}\n", text_safety::json_line(&event)))?;
            } else {
                status_line.observe(&event);
                let mut text = String::new();
                if live {
                    text.push_str(CLEAR_LINE);
                }
                // A streaming call's progress and an agent's activity update the live line
                // only; without one (a pipe, a log) they are left out: what they led to
                // comes with the answer or the handoff.
                // Charges are summed per attempt and said when it ends (`SpendFold`).
                if spend.absorb(&event.kind)
                    || matches!(
                        event.kind,
                        EventKind::LlmProgress { .. } | EventKind::AgentActivity { .. }
                    )
                {
                    if !live {
                        continue;
                    }
                } else {
                    text.push_str(&render::events::event_line(&event, &style));
                    text.push('\n');
                    for line in spend.ended(&event.kind) {
                        text.push_str(&render::events::folded_line(&line, event.at_ms, &style));
                        text.push('\n');
                    }
                }
                if live {
                    drawn = true;
                    // As of this event: a replayed backlog shows the time it happened at.
                    text.push_str(&style.dim(
                        &status_line.live_line(event.at_ms, render::live::terminal_columns()),
                    ));
                }
                emit(&text)?;
            }
            if let EventKind::RunFinished { outcome, .. } = event.kind {
                if live {
                    emit("\n")?;
                }
                // The whole run was followed: its totals, and what reached main. (Live,
                // the totals are the line just ended.)
                if !json && whole_run {
                    if !live {
                        emit(&format!("{}\n", status_line.summary(event.at_ms)))?;
                    }
                    if let Some(landing) = status_line.landing_summary() {
                        emit(&format!("{}\n", style.dim(&landing)))?;
                    }
                }
                return Ok(Some(outcome));
            }
        }
        // The stream ended before `run_finished`. Either there was nothing after `since` in a
        // run that had already finished (its outcome says so), or the daemon went away.
        if let Ok(Some(outcome)) = finished_outcome(client, run).await {
            if live && drawn {
                emit("\n")?;
            }
            return Ok(Some(outcome));
        }
        if !json {
            note(&style.dim("lost the daemon; reconnecting…"));
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

/// `flotilla bench`: runs on the calling thread, outside any async runtime (each run has
/// an actix system of its own).
pub fn run_bench(command: &Command) -> Result<Exit, CliError> {
    let Command::Bench {
        tasks,
        chain,
        scaling,
        workers,
        no_makespan,
        memory_runs,
        json,
    } = command
    else {
        unreachable!("run_bench is called for `flotilla bench` only");
    };
    let scaling = parse_sizes(scaling).map_err(|e| {
        CliError::usage(
            e,
            Some("e.g. --scaling 1000,10000,50000, or --scaling none"),
        )
    })?;
    let options = crate::bench::BenchOptions {
        tasks: *tasks as usize,
        chain: *chain as usize,
        scaling,
        workers: *workers as usize,
        makespan: !no_makespan,
        memory_runs: *memory_runs as usize,
        json: *json,
    };
    let mut out = std::io::stdout().lock();
    crate::bench::run(&options, &mut out).map_err(|message| CliError {
        message: format!("the bench failed: {message}"),
        hint: None,
        exit: Exit::Failure,
    })?;
    Ok(Exit::Ok)
}

/// "1000,10000" → [1000, 10000]; "none" or "" → [].
fn parse_sizes(text: &str) -> Result<Vec<usize>, String> {
    let text = text.trim();
    if text.is_empty() || text == "none" {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|part| {
            let part = part.trim();
            match part.parse::<usize>() {
                Ok(n) if (1..=1_000_000).contains(&n) => Ok(n),
                _ => Err(format!(
                    "--scaling: {:?} is not a number of tasks from 1 to 1000000",
                    text_safety::terminal_safe(part)
                )),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use hyper::StatusCode;

    use super::*;

    #[test]
    fn a_wrong_token_or_a_busy_daemon_says_what_to_do() {
        let hint = |status, message: &str| {
            CliError::from(ClientError::Api {
                status,
                message: message.into(),
            })
            .hint
            .unwrap_or_default()
        };
        assert!(
            hint(StatusCode::UNAUTHORIZED, "missing or wrong bearer token")
                .contains("same --state-dir as the daemon")
        );
        assert!(
            hint(StatusCode::SERVICE_UNAVAILABLE, "too many connections")
                .contains("try again shortly")
        );
    }
}
