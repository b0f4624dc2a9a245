//! `flotilla demo`: a whole run, offline, with nothing to set up (ADR-033). It writes a tiny
//! shell project (`docs/examples/demo/`, embedded in the binary) into a new temporary git
//! repository, starts a daemon in this process on a socket and state directory of its own,
//! submits the scenario's request, and follows the run with the code `submit` uses. Then it
//! prints the task graph, the run's report and where everything is; `--keep` leaves the
//! daemon serving until Ctrl-C so that `status`, `tail` and `report` can be tried on it, and
//! `--pause` stops the run at a user decision (t4) so that it can be watched on the live page
//! before it ends.

use std::path::{Path, PathBuf};

use flotilla_actors::protocol::StopCondition;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use crate::cli::args::GraphFormat;
use crate::cli::client::{Client, Endpoint};
use crate::cli::error::{CliError, ErrorKind, Exit};
use crate::cli::{emit, note};
use crate::daemon::{self, Bound, DaemonOptions, Listen};
use crate::journal::JournalSync;
use crate::paths;
use crate::scripted::Scenario;
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

/// The task `--pause` stops at: t4's worker proposes a subplan (accepted, three subtasks);
/// paused, the parent waits for the user's decision once they are done instead of being
/// synthesized at once. Nothing depends on t4, so the rest of the run goes on meanwhile and
/// then waits for it: every task of the run is on the page while it is still running.
const PAUSED_TASK: &str = "t4";

/// What the demo was asked for on the command line.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// One JSON event a line on stdout; the rest on stderr.
    pub json: bool,
    /// Serve until Ctrl-C after the run.
    pub keep: bool,
    /// Stop the run at a user decision ([`PAUSED_TASK`]).
    pub pause: bool,
}

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
pub fn run(options: Options) -> Result<Exit, CliError> {
    let Options { json, pause, .. } = options;
    let dir = DemoDir {
        root: tempfile::Builder::new()
            .prefix("flotilla-demo-")
            .tempdir()
            .map_err(|e| CliError::internal("cannot make the demo's directory").because(e))?
            // Kept: the repository is the demo's result, and the journal lets
            // `flotilla --state-dir DIR/state daemon` show the run again later.
            .keep(),
    };
    write_repository(&dir.repo(), pause)?;
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
    let daemon_options = DaemonOptions {
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
        let server = actix_rt::spawn(daemon::serve(
            daemon_options,
            shutdown.clone(),
            Some(ready_tx),
        ));
        let outcome = match ready_rx.await {
            Ok(Bound::Unix(_)) | Ok(Bound::Tcp { .. }) => {
                let client = Client::new(Endpoint::Unix(socket.clone()));
                demo_run(&client, &dir, &socket, options, &say).await
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
    options: Options,
    say: &dyn Fn(&str) -> Result<(), CliError>,
) -> Result<Exit, CliError> {
    let Options { json, keep, pause } = options;
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
    if pause {
        // Said before following, while there is time to open the page: the run reaches
        // the decision in a few seconds.
        say(&format!(
            "{PAUSED_TASK} will wait for your decision once its subtasks are done (--pause). \
             In another terminal, watch the run on the live page, then let it finish:\n  \
             export FLOTILLA_STATE_DIR={state}\n  \
             {exe} ui {run}\n  \
             {exe} decide {run} {PAUSED_TASK} --complete",
            state = shown(&dir.state()),
            run = terminal_safe(&run),
        ))?;
    }
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
             {exe} graph {run} --format mermaid\n  {exe} ui {run}",
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
/// along as the run lands work, so `git log` there shows the result. With `pause`, the
/// scenario is [`paused_scenario`]'s.
fn write_repository(repo: &Path, pause: bool) -> Result<(), CliError> {
    let failed =
        |what: &str| CliError::internal(format!("cannot make the demo's repository: {what}"));
    for (name, text) in FILES {
        let path = repo.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| failed("a directory").because(e))?;
        }
        let text = match *name {
            "scenario.toml" if pause => std::borrow::Cow::Owned(paused_scenario(text)?),
            _ => std::borrow::Cow::Borrowed(*text),
        };
        std::fs::write(&path, text.as_bytes()).map_err(|e| failed(name).because(e))?;
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

/// The scenario with [`PAUSED_TASK`]'s subplan stopping for the user's decision
/// (`stop_when = "user_decision"`) instead of at once. The line goes under the subplan's
/// table, and the result is read back as the daemon will read it, so that a change to the
/// scenario cannot make `--pause` run the demo without its pause.
fn paused_scenario(text: &str) -> Result<String, CliError> {
    let header = format!("[tasks.{PAUSED_TASK}.subplan]\n");
    let lost = |why: String| {
        CliError::internal(format!(
            "cannot make the demo's paused scenario: {why} (a bug in flotilla)"
        ))
    };
    let at = text
        .find(&header)
        .map(|i| i + header.len())
        .ok_or_else(|| lost(format!("it has no {}", header.trim_end())))?;
    let paused = format!(
        "{}stop_when = \"user_decision\"   # flotilla demo --pause\n{}",
        &text[..at],
        &text[at..]
    );
    let scenario = Scenario::from_toml(&paused).map_err(|e| lost(e.to_string()))?;
    let stops = scenario
        .tasks
        .get(PAUSED_TASK)
        .and_then(|t| t.step.subplan.as_ref())
        .map(|s| s.stop_when);
    match stops {
        Some(StopCondition::UserDecision) => Ok(paused),
        other => Err(lost(format!("{PAUSED_TASK}'s subplan stops {other:?}"))),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario() -> &'static str {
        FILES
            .iter()
            .find(|(name, _)| *name == "scenario.toml")
            .map(|(_, text)| *text)
            .unwrap()
    }

    #[test]
    fn the_paused_scenario_differs_only_in_t4s_stop_condition() {
        let plain = Scenario::from_toml(scenario()).unwrap();
        let mut paused = Scenario::from_toml(&paused_scenario(scenario()).unwrap()).unwrap();
        let subplan = |s: &Scenario| s.tasks["t4"].step.subplan.clone().unwrap();
        assert_eq!(
            subplan(&plain).stop_when,
            StopCondition::AllSubtasksComplete
        );
        assert_eq!(subplan(&paused).stop_when, StopCondition::UserDecision);
        if let Some(t4) = paused.tasks.get_mut("t4")
            && let Some(subplan) = t4.step.subplan.as_mut()
        {
            subplan.stop_when = StopCondition::AllSubtasksComplete;
        }
        assert_eq!(paused, plain, "nothing else changes");
    }

    #[test]
    fn a_scenario_without_t4s_subplan_cannot_be_paused() {
        let error = paused_scenario("[tasks.t1]\nsummary = \"x\"\n").unwrap_err();
        assert!(error.to_string().contains("[tasks.t4.subplan]"), "{error}");
    }
}
