//! The live page on the demo's own run (issue 23 item 3): `flotilla demo --json --keep
//! --pause` as a user runs it, `flotilla ui` against its daemon, and headless Chromium. The
//! demo's t4 waits for a decision (`--pause`) while the rest of the run goes on; once
//! nothing else moves, the page must draw every task of the run (the Subplanner's and the
//! worker's subtasks, both fix tasks) with t4 waiting, and after `flotilla decide RUN t4
//! --complete` follow the same run to completed. Both moments are captured as screenshots
//! (`demo-in-progress.png`, `demo-finished.png`, beside the other test's, paths printed).
//!
//! Every wait is on something that happens: a line the demo prints, an event it streams,
//! or a render of the page (`flotilla.until`); the time limits only turn a hang into a
//! failure that says what was awaited.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use flotilla_actors::protocol::{Event, EventKind, RunOutcome, TaskId};

use super::{Browser, chromium, shown, task_ids, ui_link};
use crate::daemon_env::DaemonProcess;

/// Every task of the demo's run, sorted as [`shown`] sorts: the five of sprint 1, the
/// Subplanner's split of t3, t4's worker subplan, sprint 2's t6 and t7, the conflict fix f1
/// and the Reconciler's build fix f2 (`demo::the_demo_ends_with_the_graph_the_report_and_the_repository`
/// counts the same 14).
const DEMO_TASKS: [&str; 14] = [
    "f1", "f2", "t1", "t2", "t3", "t3.1", "t3.2", "t4", "t4.1", "t4.2", "t4.3", "t5", "t6", "t7",
];

/// How long any one awaited thing may take before the test fails saying what it awaited
/// (the whole demo takes a few seconds).
const PATIENCE: Duration = Duration::from_secs(120);

/// `flotilla demo ARGS` running, its stdout (one event a line with `--json`) and stderr
/// read line by line as they come. Killed if the test ends before it does.
struct RunningDemo {
    child: Child,
    events: mpsc::Receiver<String>,
    said: mpsc::Receiver<String>,
    /// Everything read so far, for failure messages.
    transcript: String,
}

/// Sends each line `from` gives to a new channel.
fn lines_of(from: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

impl RunningDemo {
    fn start(tmp: &Path, args: &[&str]) -> RunningDemo {
        let mut child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .arg("demo")
            .args(args)
            .env("TMPDIR", tmp)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let events = lines_of(child.stdout.take().unwrap());
        let said = lines_of(child.stderr.take().unwrap());
        RunningDemo {
            child,
            events,
            said,
            transcript: String::new(),
        }
    }

    /// Reads stderr until a line `wanted` picks something from.
    fn said_until<T>(&mut self, what: &str, wanted: impl Fn(&str) -> Option<T>) -> T {
        loop {
            let line = self
                .said
                .recv_timeout(PATIENCE)
                .unwrap_or_else(|_| panic!("the demo did not say {what}:\n{}", self.transcript));
            self.transcript.push_str(&line);
            self.transcript.push('\n');
            if let Some(found) = wanted(&line) {
                return found;
            }
        }
    }

    /// The next event the demo streams.
    fn next_event(&mut self, awaiting: &str) -> Event {
        let line = self.events.recv_timeout(PATIENCE).unwrap_or_else(|_| {
            panic!(
                "the demo streamed no more events while {awaiting} was awaited:\n{}",
                self.transcript
            )
        });
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    /// Ctrl-C, as the demo tells the user to stop it; its exit status.
    fn interrupt(mut self) -> std::process::ExitStatus {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: a signal to the child this test started and has not reaped.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
        self.child.wait().unwrap()
    }
}

impl Drop for RunningDemo {
    fn drop(&mut self) {
        // Only if the test failed first: `--keep` would serve forever.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn id(text: &str) -> TaskId {
    text.parse().unwrap()
}

/// `flotilla ARGS` against the demo's daemon, as its instructions say: the state directory
/// from the environment.
fn flotilla_on(state_dir: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .env("FLOTILLA_STATE_DIR", state_dir)
        .env_remove("FLOTILLA_SOCKET")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "flotilla {args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The page's nodes and their states, as `[[task, state], …]` sorted by task.
const NODE_STATES: &str = "Array.from(document.querySelectorAll('g.node'), \
     g => [g.dataset.task, g.dataset.state]).sort()";

#[tokio::test]
async fn the_live_page_shows_every_task_of_the_demos_run_in_progress_and_finished_in_chromium() {
    let Some(program) = chromium() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut demo = RunningDemo::start(tmp.path(), &["--json", "--keep", "--pause"]);

    // What `--pause` tells the user, before the run gets anywhere: where its daemon is, the
    // page's command and the decision that lets the run finish.
    let state_dir = demo.said_until("where its daemon is", |line| {
        line.trim()
            .strip_prefix("export FLOTILLA_STATE_DIR=")
            .map(PathBuf::from)
    });
    assert!(state_dir.starts_with(tmp.path()), "{}", state_dir.display());
    let run = demo.said_until("the `ui` command", |line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [_, "ui", run] => Some(run.to_string()),
            _ => None,
        }
    });
    let decide = demo.said_until("the `decide` command", |line| {
        line.contains(" decide ").then(|| line.trim().to_string())
    });
    assert!(
        decide.ends_with(&format!(" decide {run} t4 --complete")),
        "{decide}"
    );

    // The run goes on without t4: it waits for the decision, and once f2 (the last fix)
    // landed a sweep finds main green. Nothing moves after that until the user decides.
    let (mut asked, mut f2_landed, mut green_after_f2) = (false, false, None);
    while !(asked && green_after_f2.is_some()) {
        let event = demo.next_event("t4's decision and a green main after f2");
        match event.kind {
            EventKind::AwaitingUserDecision { parent } => {
                assert_eq!(parent, id("t4"), "only t4 asks");
                asked = true;
            }
            EventKind::TaskLanded { task, .. } if task == id("f2") => f2_landed = true,
            EventKind::SweepFinished { report } if f2_landed && report.green => {
                green_after_f2 = Some(report.sweep);
            }
            EventKind::RunFinished { outcome, .. } => {
                panic!("the run ended ({outcome:?}) before anyone decided for t4")
            }
            _ => {}
        }
    }
    let sweep = green_after_f2.unwrap();

    // `flotilla ui RUN` against the demo's daemon, then the page in Chromium.
    let link = ui_link(&state_dir, &run);
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("page-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let mut browser = Browser::start(&program);
    browser.open(&link);

    // In progress: the run still runs, every task of it is drawn, t4 waits for the user and
    // the other thirteen are done, main is green as of that last sweep.
    let drawn = browser.eval(&format!(
        "flotilla.until(() => document.body.dataset.runState === 'running' \
           && flotilla.tasksShown().length === {count} \
           && document.querySelector('g.node.awaiting[data-task=\"t4\"]') !== null \
           && Array.from(document.querySelectorAll('g.node')) \
                .every(g => g.dataset.task === 't4' || g.dataset.state === 'completed') \
           && document.getElementById('main-health').textContent.startsWith('green') \
           && document.getElementById('main-health').textContent.includes('(sweep {sweep})')) \
         .then(() => flotilla.tasksShown())",
        count = DEMO_TASKS.len()
    ));
    let client = DaemonProcess::client(&state_dir);
    assert_eq!(shown(drawn), DEMO_TASKS, "every task of the demo's run");
    assert_eq!(
        task_ids(&client, &run).await,
        DEMO_TASKS,
        "as the API has them"
    );
    let states = browser.eval(NODE_STATES);
    assert!(
        states
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s[0] == "t4" && s[1] == "waiting_for_subtasks"),
        "{states}"
    );
    let counts = browser.eval("document.getElementById('counts').textContent");
    assert!(
        counts
            .as_str()
            .unwrap()
            .starts_with("14 tasks: 13 completed"),
        "{counts}"
    );
    // t4 on click: its worker's subplan, accepted, in its one attempt.
    let story = browser.eval(
        "document.querySelector('g.node[data-task=\"t4\"]').dispatchEvent(new MouseEvent('click')); \
         flotilla.until(() => document.getElementById('task-body').textContent.includes('decomposition_accepted')) \
         .then(() => [document.getElementById('task-title').textContent, \
                      document.getElementById('task-body').textContent])",
    );
    assert_eq!(story[0], "t4: waiting for subtasks", "{story}");
    assert!(story[1].as_str().unwrap().contains("attempt 1"), "{story}");
    browser.screenshot(&shots.join("demo-in-progress.png"));

    // The user decides, as the demo said; the same page follows the run to its end.
    let decided = flotilla_on(&state_dir, &["decide", &run, "t4", "--complete"]);
    assert!(decided.starts_with("decided: t4"), "{decided}");
    let finished = browser.eval(
        "flotilla.until(() => document.body.dataset.runState === 'completed') \
         .then(() => [flotilla.tasksShown(), document.getElementById('main-health').textContent])",
    );
    assert_eq!(
        shown(finished[0].clone()),
        DEMO_TASKS,
        "every task of the demo's run, finished"
    );
    assert_eq!(task_ids(&client, &run).await, DEMO_TASKS);
    let states = browser.eval(NODE_STATES);
    assert!(
        states
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s[1] == "completed"),
        "{states}"
    );
    assert!(
        finished[1].as_str().unwrap().starts_with("green"),
        "{finished}"
    );
    // The Reconciler's fix on click: its handoff.
    let fix = browser.eval(
        "document.querySelector('g.node[data-task=\"f2\"]').dispatchEvent(new MouseEvent('click')); \
         flotilla.until(() => document.getElementById('task-body').textContent.includes('shout calls w_line')) \
         .then(() => document.getElementById('task-title').textContent)",
    );
    assert_eq!(fix, "f2: completed");
    browser.screenshot(&shots.join("demo-finished.png"));
    drop(browser);

    // The demo saw the same end, and keeps its daemon until Ctrl-C.
    loop {
        if let EventKind::RunFinished { outcome, .. } = demo.next_event("the run's end").kind {
            assert_eq!(outcome, RunOutcome::Completed);
            break;
        }
    }
    demo.said_until("that its daemon keeps serving", |line| {
        line.contains("keeps serving").then_some(())
    });
    let exit = demo.interrupt();
    assert!(exit.success(), "{exit:?}");
}
