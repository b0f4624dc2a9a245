//! The command line (clap): the commands, their flags, and where the daemon is.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use super::client::Endpoint;
use super::error::CliError;
use crate::journal::JournalSync;
use crate::paths;

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
    /// Summarize a run from its journal: tasks landed first try, retries, conflicts and
    /// their fixes, empty diffs, gate failures and sweeps, the merge success rate, tokens and
    /// cost, time per task (p50/p90) and per top-level task, the makespan against a lower
    /// bound, and what is left for you.
    ///
    /// Example: `flotilla report 01a2`.
    Report {
        #[command(flatten)]
        address: ClientAddress,
        /// Run id or unique prefix.
        run: String,
        /// Print the report as JSON (the API's answer) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show what the agent of a task's attempt did: the model's messages, its tool calls
    /// and their results, or a command agent's output (kept bounded under the state
    /// directory; `gc` removes them with their run). The latest attempt unless `--attempt`.
    ///
    /// Example: `flotilla log 01a2 t4 --follow`.
    Log {
        #[command(flatten)]
        address: ClientAddress,
        /// Run id or unique prefix.
        run: String,
        /// A task of the run (e.g. t4, t4.2, f1).
        task: String,
        /// Which attempt (1 is the first).
        #[arg(long, value_name = "N")]
        attempt: Option<u32>,
        /// Keep showing new entries until the attempt ends.
        #[arg(long)]
        follow: bool,
        /// One JSON entry per line.
        #[arg(long)]
        json: bool,
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
    /// when you want it now. Finished runs' transcripts (`flotilla log`) go only here: a
    /// daemon's start keeps them.
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
    /// Print a link to the live page: a run's task graph as it changes, its tasks' handoffs,
    /// findings and attempts, the merge queue, main's health and the spend. The link holds a
    /// one-time code; open it in a browser on this machine.
    Ui {
        #[command(flatten)]
        address: ClientAddress,
        /// Run id or unique prefix; default: the latest running run.
        run: Option<String>,
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
        /// Leave out the planner's largest-request measurements.
        #[arg(long)]
        no_requests: bool,
        /// Runs of --tasks tasks one after another, with the resident set after each
        /// (after a collection point) against the idle one; 0 leaves them out.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=1_000))]
        memory_runs: u64,
        /// One JSON object per measurement, one per line.
        #[arg(long)]
        json: bool,
        /// Measure landing instead (and nothing else): through a `flotilla daemon` child,
        /// tasks whose scripted agents each write one file, so every task makes a
        /// workspace, a commit and a landing through the merge queue, on generated
        /// repositories (--landing-files). Reports landed/s, the daemon's CPU per landed
        /// task, dispatch→landed p50/p99, started→landing p50, peak RSS and disk.
        #[arg(long)]
        landing: bool,
        /// Files on main in the landing runs, comma-separated (50000 takes a while).
        #[arg(long, default_value = "1000,10000", value_name = "N,N,...")]
        landing_files: String,
        /// Tasks per landing run, comma-separated (the defaults take under a minute on two
        /// cores; most of it is checking out the 10,000-file repository).
        #[arg(long, default_value = "40", value_name = "N,N,...")]
        landing_tasks: String,
        /// Worker slots in the landing runs.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=256))]
        landing_workers: u64,
        /// A gate command every landing candidate must pass (`sh -c`); none by default.
        #[arg(long, value_name = "COMMAND")]
        landing_gate: Option<String>,
        /// Runs of each landing case (report the median of several).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100))]
        landing_repeat: u64,
        /// Also measure each case's next run: once the first run has ended, the daemon is
        /// stopped (its clean-up leaves the run's workspaces in the repository's pool,
        /// `[worktrees] pool_budget_mb`), started again, and the same run submitted on the
        /// same repository; reported as `landing/<N>-files/next-run`.
        #[arg(long)]
        landing_next_run: bool,
        /// Where generated repositories are cached and cases run [default: a
        /// `flotilla-bench-landing` directory in the system's temporary directory].
        #[arg(long, value_name = "DIR")]
        landing_dir: Option<PathBuf>,
        /// Time a real project's build as the merge gate instead (and nothing else): the
        /// git repository at PATH (default: the one this is run from) cloned at its HEAD,
        /// a chain of candidates each changing one Rust file, gated cold (a fresh scratch
        /// checkout each, `warm_gate = false`) and warm (the warm gate tree, ADR-042), in
        /// the run's default sandbox. Clones and trees go under --landing-dir.
        #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = ".")]
        gate_timing: Option<PathBuf>,
        /// Candidates gated in each mode of --gate-timing.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=100))]
        gate_candidates: u64,
        /// The gate --gate-timing runs (`sh -c`, offline: the cargo registry is shared
        /// read-only).
        #[arg(long, default_value = crate::bench::gate_timing::DEFAULT_COMMAND, value_name = "COMMAND")]
        gate_command: String,
    },
    /// Print a shell completion script to stdout.
    ///
    /// Examples: `flotilla completions bash > ~/.local/share/bash-completion/completions/flotilla`,
    /// `flotilla completions zsh > ~/.zfunc/_flotilla`,
    /// `flotilla completions fish > ~/.config/fish/completions/flotilla.fish`.
    Completions {
        /// The shell to complete in.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) to stdout, or write one page per command to a directory.
    ///
    /// Examples: `flotilla man | man -l -`, `flotilla man --out ~/.local/share/man/man1`.
    Man {
        /// Write flotilla.1 and flotilla-COMMAND.1 for every command into this directory
        /// instead.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Write a commented flotilla.toml for a repository: the gate and the Reconciler's
    /// sweeps from its project type (Cargo.toml, package.json, pyproject.toml, go.mod),
    /// commented provider and agent blocks, limits and budgets.
    Init {
        /// The repository.
        #[arg(long, default_value = ".")]
        repo: PathBuf,
        /// Replace an existing flotilla.toml.
        #[arg(long)]
        force: bool,
    },
    /// Check a configuration file.
    Config {
        #[command(subcommand)]
        action: ConfigAction,
    },
    /// Check this machine and repository, one line each: the sandbox (bwrap), git, the
    /// state directory, the config, every configured model (called once) and every agent
    /// CLI (on PATH). Exits 0 only if nothing failed.
    Doctor {
        #[command(flatten)]
        address: DaemonAddress,
        /// The repository whose flotilla.toml to read.
        #[arg(long, default_value = ".")]
        repo: PathBuf,
        /// The config file. Default: <repo>/flotilla.toml.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Seconds each model call may take.
        #[arg(long, default_value_t = 60, value_name = "SECS")]
        timeout: u64,
    },
    /// Run flotilla on each project of an evaluation folder (evals/ in flotilla's
    /// repository) through the daemon, then its acceptance tests (which the agents never
    /// see) on what landed on main, and print a table per project and in total: tests
    /// passed, tasks landed first try, retries, fix tasks, tokens, wall time, the largest
    /// planner prompt. Exits 0 when every project ran (whatever its tests say).
    ///
    /// Examples: `flotilla eval evals --models my-models.toml`, `flotilla eval evals
    /// --scripted` (each project's scripted solution: the harness's own check), `flotilla
    /// eval evals --scripted-plan` (scripted plans, real workers).
    Eval {
        #[command(flatten)]
        address: ClientAddress,
        /// The folder of projects (each a folder with an eval.toml).
        #[arg(default_value = "evals")]
        dir: PathBuf,
        /// Only this project (repeatable).
        #[arg(long, value_name = "NAME")]
        project: Vec<String>,
        /// A file whose [providers], [roles] and [prices] replace each project's.
        #[arg(long, value_name = "FILE", conflicts_with = "scripted")]
        models: Option<PathBuf>,
        /// Play every role from each project's scripted.toml (offline).
        #[arg(long)]
        scripted: bool,
        /// Plan from each project's scripted.toml (the root planner and the Subplanner);
        /// the workers keep their models, so a model too small to plan is still measured
        /// as a worker.
        #[arg(long, conflicts_with = "scripted")]
        scripted_plan: bool,
        /// Where the runs' repositories go (kept). Default: a new temporary directory.
        #[arg(long, value_name = "DIR")]
        work: Option<PathBuf>,
        /// One JSON object per project.
        #[arg(long)]
        json: bool,
    },
    /// A whole run, offline, in a new temporary repository: a tiny shell project, the
    /// scripted provider, and a daemon of its own (its own socket and state directory).
    /// Prints the run, its task graph and its report, and where the repository is.
    Demo {
        /// One JSON event per line (what `tail --json` prints); the rest goes to stderr.
        #[arg(long)]
        json: bool,
        /// Keep the demo's daemon running after the run, until Ctrl-C, to try `status`,
        /// `tail`, `report`, `graph` and `ui` on it.
        #[arg(long)]
        keep: bool,
        /// Stop the run at a decision, to watch it on the live page before it ends: t4's
        /// subplan waits for you once its subtasks are done, instead of finishing at once
        /// (the rest of the run goes on, then waits for t4). The demo prints the commands:
        /// `flotilla ui RUN` (a link to the page) and `flotilla decide RUN t4 --complete`
        /// (lets the run finish). With --keep the page stays up after the run.
        #[arg(long)]
        pause: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigAction {
    /// Load a config as `submit` would (the file, its scenario, its prompts, every check)
    /// and say whether it is accepted; an error names its key and line. Exits 0 on a good
    /// file, 2 otherwise.
    Check {
        /// The config file. Default: <repo>/flotilla.toml.
        file: Option<PathBuf>,
        /// The repository whose flotilla.toml to check.
        #[arg(long, default_value = ".")]
        repo: PathBuf,
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

impl Command {
    /// Where this command finds the daemon, when it talks to one.
    fn client_address(&self) -> Option<&ClientAddress> {
        match self {
            Command::Submit { address, .. }
            | Command::Tail { address, .. }
            | Command::Status { address, .. }
            | Command::Graph { address, .. }
            | Command::Report { address, .. }
            | Command::Log { address, .. }
            | Command::Cancel { address, .. }
            | Command::Gc { address, .. }
            | Command::Decide { address, .. }
            | Command::Eval { address, .. }
            | Command::Runs { address, .. }
            | Command::Ui { address, .. } => Some(address),
            Command::Daemon { .. }
            | Command::Providers { .. }
            | Command::Bench { .. }
            | Command::Completions { .. }
            | Command::Man { .. }
            | Command::Init { .. }
            | Command::Config { .. }
            | Command::Doctor { .. }
            | Command::Demo { .. } => None,
        }
    }

    fn daemon_address(&self) -> Option<&DaemonAddress> {
        match self {
            Command::Daemon { address, .. } | Command::Doctor { address, .. } => Some(address),
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
                return Err(CliError::user(format!(
                    "--connect {addr} is not a loopback address; the bearer token would \
                     cross the network in cleartext"
                ))
                .hint(
                    "the daemon listens only on loopback (e.g. --connect 127.0.0.1:7070); \
                     reach another machine through an SSH tunnel",
                ));
            }
            let token_file = paths::token_path(&state_dir);
            let token = crate::text_file::read(&token_file).map_err(|e| {
                CliError::config("the daemon's token")
                    .because(e)
                    .hint("use the same --state-dir as the daemon started with --listen")
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
