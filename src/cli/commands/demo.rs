//! `flotilla demo`: a whole run, offline, with nothing to set up (ADR-033). It writes a tiny
//! shell project (`docs/examples/demo/`, embedded in the binary) into a new temporary git
//! repository, starts a daemon in this process on a socket and state directory of its own,
//! submits the scenario's request, and follows the run with the code `submit` uses. Then it
//! prints the task graph, the run's report and where everything is; `--keep` leaves the
//! daemon serving until Ctrl-C so that `status`, `tail` and `report` can be tried on it.

use std::path::{Path, PathBuf};

use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use crate::cli::args::GraphFormat;
use crate::cli::client::{Client, Endpoint};
use crate::cli::error::{CliError, ErrorKind, Exit};
use crate::cli::{emit, note};
use crate::daemon::{self, Bound, DaemonOptions, Listen};
use crate::journal::JournalSync;
use crate::paths;
use crate::text_safety::terminal_safe;

use super::{graph, submit, tail};

/// What the demo asks for (the scenario answers it).
pub const REQUEST: &str = "Add the commands in the backlog to wordtool";

/// The demo's repository, file by file: the project (wordtool: `sh build.sh` and
/// `sh test.sh` really run), its `flotilla.toml` and the scenario the scripted provider
/// replays. The same files are readable in `docs/examples/demo/`.
const FILES: &[(&str, &str)] = &[
    (
        "README.md",
        include_str!("../../../docs/examples/demo/project/README.md"),
    ),
    (
        "bin/wordtool",
        include_str!("../../../docs/examples/demo/project/bin/wordtool"),
    ),
    (
        "build.sh",
        include_str!("../../../docs/examples/demo/project/build.sh"),
    ),
    (
        "test.sh",
        include_str!("../../../docs/examples/demo/project/test.sh"),
    ),
    (
        "lib/text.sh",
        include_str!("../../../docs/examples/demo/project/lib/text.sh"),
    ),
    (
        "lib/echo.sh",
        include_str!("../../../docs/examples/demo/project/lib/echo.sh"),
    ),
    (
        "tests/echo.sh",
        include_str!("../../../docs/examples/demo/project/tests/echo.sh"),
    ),
    (
        "flotilla.toml",
        include_str!("../../../docs/examples/demo/flotilla.toml"),
    ),
    (
        "scenario.toml",
        include_str!("../../../docs/examples/demo/scenario.toml"),
    ),
];

/// Where the demo keeps things: `DIR/repo` (the repository), `DIR/state` (the daemon's
/// journal, socket and worktrees), `DIR/daemon.log`.
struct DemoDir {
    root: PathBuf,
}

impl DemoDir {
    fn repo(&self) -> PathBuf {
        self.root.join("repo")
    }
    fn state(&self) -> PathBuf {
        self.root.join("state")
    }
    fn log(&self) -> PathBuf {
        self.root.join("daemon.log")
    }
}

/// Runs the demo; called by `main` outside any runtime, as `daemon` is (the in-process
/// daemon needs an actix `System`). Exits 0 only if the run completed.
pub fn run(json: bool, keep: bool) -> Result<Exit, CliError> {
    let dir = DemoDir {
        root: tempfile::Builder::new()
            .prefix("flotilla-demo-")
            .tempdir()
            .map_err(|e| CliError::internal("cannot make the demo's directory").because(e))?
            // Kept: the repository is the demo's result, and the journal lets
            // `flotilla --state-dir DIR/state daemon` show the run again later.
            .keep(),
    };
    write_repository(&dir.repo())?;
    init_logging(&dir.log())?;
    let say = |text: &str| -> Result<(), CliError> {
        if json {
            note(text);
            Ok(())
        } else {
            emit(&format!("{text}\n"))
        }
    };
    say(&format!(
        "demo: wordtool, a tiny shell project, in {} (its daemon logs to {})",
        shown(&dir.repo()),
        shown(&dir.log())
    ))?;
    let socket = paths::socket_path(&dir.state());
    let options = DaemonOptions {
        state_dir: dir.state(),
        listen: Listen::Unix(socket.clone()),
        #[cfg(feature = "testing")]
        journal_faults: None,
        server: Default::default(),
        journal_sync: JournalSync::Normal,
    };
    let system = actix_rt::System::new();
    system.block_on(async move {
        let shutdown = CancellationToken::new();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let server = actix_rt::spawn(daemon::serve(options, shutdown.clone(), Some(ready_tx)));
        let outcome = match ready_rx.await {
            Ok(Bound::Unix(_)) | Ok(Bound::Tcp { .. }) => {
                let client = Client::new(Endpoint::Unix(socket.clone()));
                demo_run(&client, &dir, &socket, json, keep, &say).await
            }
            // The daemon ended before it listened: its error says why (below).
            Err(_) => Ok(Exit::Failure),
        };
        shutdown.cancel();
        let served = match server.await {
            Ok(served) => served,
            Err(e) => Err(anyhow::anyhow!("the demo's daemon stopped abnormally: {e}")),
        };
        match (outcome, served) {
            (Err(e), _) => Err(e),
            (Ok(_), Err(e)) => Err(CliError::wrap(ErrorKind::Internal, e)
                .hint(format!("its log: {}", dir.log().display()))),
            (Ok(exit), Ok(())) => Ok(exit),
        }
    })
}

/// Submits the demo's request, follows the run to its end, and prints the graph, the
/// report and where things are; with `keep`, then waits for Ctrl-C.
async fn demo_run(
    client: &Client,
    dir: &DemoDir,
    socket: &Path,
    json: bool,
    keep: bool,
    say: &dyn Fn(&str) -> Result<(), CliError>,
) -> Result<Exit, CliError> {
    let repo = dir.repo();
    // How the user reaches this binary again (`cargo run` puts it in target/).
    let exe = std::env::current_exe()
        .map(|p| shown(&p))
        .unwrap_or_else(|_| "flotilla".into());
    let created = submit::start(client, REQUEST, &repo, None).await?.created;
    let run = created.id.clone();
    note(&format!(
        "run {} submitted{}; following it (Ctrl-C stops the demo)",
        terminal_safe(&run),
        submit::landing_note(&created)
    ));
    let outcome = match tail::follow(client, &run, None, json).await {
        Ok(outcome) => outcome,
        Err(e) => {
            if e.exit() == Exit::Interrupted {
                note(&format!(
                    "the demo's daemon stops with it; the run resumes when a daemon serves \
                     {state} again (`{exe} --state-dir {state} daemon`)",
                    state = shown(&dir.state()),
                ));
            }
            return Err(e);
        }
    };
    if !json {
        emit("\nThe task graph (Mermaid: paste it into a Markdown file or mermaid.live):\n\n")?;
        graph::run(client, &run, GraphFormat::Mermaid).await?;
        submit::print_report(client, &run).await?;
        emit("\n")?;
    }
    let repo_shown = shown(&repo);
    say(&format!(
        "The demo's repository: {repo_shown}\n  main has the landed work: \
         `cd {repo_shown} && git log --oneline && sh build.sh && sh test.sh`"
    ))?;
    if keep {
        let stop = StopSignals::new()?;
        say(&format!(
            "The demo's daemon keeps serving on {} until Ctrl-C. In another terminal:\n  \
             export FLOTILLA_STATE_DIR={}\n  \
             {exe} status {run}\n  {exe} tail {run}\n  {exe} report {run}\n  \
             {exe} graph {run} --format mermaid",
            shown(socket),
            shown(&dir.state()),
            run = terminal_safe(&run),
        ))?;
        stop.wait().await;
        note("stopping the demo's daemon");
    } else {
        say(&format!(
            "  the run's journal: {state} (`{exe} --state-dir {state} daemon` serves it again)",
            state = shown(&dir.state()),
        ))?;
    }
    Ok(tail::exit_for(outcome))
}

/// Ctrl-C (SIGINT) and SIGTERM, listened for from creation on: made before the demo says
/// how to stop it, so that a signal sent as soon as that is read is not missed.
struct StopSignals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn new() -> Result<Self, CliError> {
        use tokio::signal::unix::{SignalKind, signal};
        let listen = |kind| {
            signal(kind).map_err(|e| CliError::internal("cannot listen for Ctrl-C").because(e))
        };
        Ok(StopSignals {
            int: listen(SignalKind::interrupt())?,
            term: listen(SignalKind::terminate())?,
        })
    }

    async fn wait(mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

/// Writes the demo's files into a new repository at `repo` and commits them on `main`
/// (task branches start from main's tip). `main` stays checked out: flotilla brings it
/// along as the run lands work, so `git log` there shows the result.
fn write_repository(repo: &Path) -> Result<(), CliError> {
    let failed =
        |what: &str| CliError::internal(format!("cannot make the demo's repository: {what}"));
    for (name, text) in FILES {
        let path = repo.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| failed("a directory").because(e))?;
        }
        std::fs::write(&path, text).map_err(|e| failed(name).because(e))?;
    }
    let mut options = git2::RepositoryInitOptions::new();
    options.initial_head("main");
    let commit = || -> Result<(), git2::Error> {
        let git = git2::Repository::init_opts(repo, &options)?;
        let mut index = git.index()?;
        index.add_all(["*"], git2::IndexAddOption::DEFAULT, None)?;
        index.write()?;
        let tree = git.find_tree(index.write_tree()?)?;
        let who = git2::Signature::now("flotilla demo", "demo@localhost")?;
        git.commit(
            Some("HEAD"),
            &who,
            &who,
            "wordtool: echo, build and tests",
            &tree,
            &[],
        )?;
        Ok(())
    };
    commit().map_err(|e| failed("git").because(e))
}

/// The in-process daemon logs to `log` (FLOTILLA_LOG sets the level, as for `daemon`), so
/// that the terminal shows the run, not the daemon's log.
fn init_logging(log: &Path) -> Result<(), CliError> {
    let file = std::fs::File::create(log)
        .map_err(|e| CliError::internal("cannot create the demo's daemon log").because(e))?;
    let filter = std::env::var("FLOTILLA_LOG")
        .ok()
        .and_then(|spec| EnvFilter::try_new(spec).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    use tracing_subscriber::util::SubscriberInitExt;
    crate::logging::human(std::sync::Mutex::new(file), filter, false).init();
    Ok(())
}

/// A path as the terminal may show it.
fn shown(path: &Path) -> String {
    terminal_safe(&path.display().to_string()).into_owned()
}
