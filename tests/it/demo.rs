//! `flotilla demo` as a user runs it, through the built binary: one command, offline, a
//! temporary repository and a daemon of its own. `--json` streams the run's events; the
//! run must show every part of the system in a valid order (sprints, the Subplanner, a
//! worker's subplan accepted and another rejected, parallel sandboxed workers, a conflict
//! fixed, a red main fixed by the Reconciler, finalization on a green sweep), and the
//! demo's repository must end with main green: its build and tests pass.

use std::path::{Path, PathBuf};
use std::process::Command;

use flotilla_actors::protocol::{
    Event, EventKind, FixOf, HandoffStatus, RejectionReason, RunOutcome, TaskId,
};

/// `flotilla demo ARGS` with its temporary directory under `tmp`: (stdout, stderr, success).
fn demo(tmp: &Path, args: &[&str]) -> (String, String, bool) {
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .arg("demo")
        .args(args)
        .env("TMPDIR", tmp)
        .env("NO_COLOR", "1")
        // The demo's daemon is its own: whatever names another one must not matter.
        .env("FLOTILLA_STATE_DIR", tmp.join("not-the-demos"))
        .env("FLOTILLA_SOCKET", tmp.join("not-the-demos.sock"))
        .output()
        .unwrap();
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
        out.status.success(),
    )
}

/// The demo's repository, as its first line names it.
fn repository(said: &str) -> PathBuf {
    let line = said
        .lines()
        .find(|l| l.starts_with("demo: "))
        .unwrap_or_else(|| panic!("the demo names its repository:\n{said}"));
    let path = line
        .split(" in ")
        .nth(1)
        .and_then(|rest| rest.split(" (").next())
        .unwrap();
    PathBuf::from(path)
}

fn id(text: &str) -> TaskId {
    text.parse().unwrap()
}

/// The position of the first event that `matches`; the test fails naming `what` if none.
fn position(events: &[Event], what: &str, matches: impl Fn(&EventKind) -> bool) -> usize {
    events
        .iter()
        .position(|e| matches(&e.kind))
        .unwrap_or_else(|| panic!("no event: {what}"))
}

fn sh(dir: &Path, script: &str) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .unwrap()
}

#[test]
fn the_demo_streams_a_run_that_shows_every_part_and_ends_with_main_green() {
    let tmp = tempfile::tempdir().unwrap();
    let (stdout, stderr, success) = demo(tmp.path(), &["--json"]);
    assert!(
        success,
        "the demo exits 0\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // stdout is the event stream and nothing else: one JSON event a line.
    let events: Vec<Event> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    // The wire names, for the failure messages.
    let kinds: Vec<String> = stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["kind"].to_string())
        .collect();
    let at = |what: &str, matches: &dyn Fn(&EventKind) -> bool| position(&events, what, matches);

    // The run, from start to a completed end.
    assert!(
        matches!(events[0].kind, EventKind::RunStarted { .. }),
        "{kinds:?}"
    );
    assert!(
        matches!(
            events.last().unwrap().kind,
            EventKind::RunFinished {
                outcome: RunOutcome::Completed,
                ..
            }
        ),
        "{kinds:?}"
    );
    // Under the sandbox.
    let EventKind::RunStarted { sandbox, .. } = &events[0].kind else {
        unreachable!()
    };
    assert!(
        sandbox
            .as_deref()
            .is_some_and(|s| s.starts_with("bubblewrap")),
        "{sandbox:?}"
    );

    // Root-planner sprints: call 2 adds t6 and t7 after call 1's tasks, planning ends
    // after both. (`call` counts from 0; the tail says "planner call 1".)
    let call = |n: u32| {
        at(
            &format!("planner call {n}"),
            &move |k| matches!(k, EventKind::PlannerResponded { call, error: None, .. } if *call == n),
        )
    };
    let added = |task: &str| {
        let task = id(task);
        at(
            &format!("{task} added"),
            &move |k| matches!(k, EventKind::TaskAdded { task: t, .. } if *t == task),
        )
    };
    let planning_finished = at("planning finished", &|k| {
        matches!(k, EventKind::PlanningFinished)
    });
    assert!(call(0) < added("t1") && added("t5") < call(1), "{kinds:?}");
    assert!(call(1) < added("t6") && added("t7") < planning_finished);

    // The Subplanner decomposes t3 (four paths).
    let subplanner_t3 = at(
        "subplanner call about t3",
        &|k| matches!(k, EventKind::SubplannerResponded { task, .. } if *task == id("t3")),
    );
    let t3_split = at("t3 decomposed by the Subplanner", &|k| {
        matches!(k, EventKind::DecompositionAccepted { parent, subplanner: true, subtasks, .. }
            if *parent == id("t3") && subtasks.len() == 2)
    });
    assert!(subplanner_t3 < t3_split);

    // t4's worker proposes a subplan: accepted; its three subtasks land.
    let t4_split = at("t4's subplan accepted", &|k| {
        matches!(k, EventKind::DecompositionAccepted { parent, subplanner: false, subtasks, .. }
            if *parent == id("t4") && subtasks.len() == 3)
    });
    // t5's worker proposes one that is rejected, with the reason; it then does the work.
    let t5_rejected = at("t5's subplan rejected", &|k| {
        matches!(k, EventKind::DecompositionRejected {
            parent,
            reason: RejectionReason::ScopeOutsideParent { path, .. },
            ..
        } if *parent == id("t5") && path == "README.md")
    });
    let landed = |task: &str| {
        let task = id(task);
        at(
            &format!("{task} landed"),
            &move |k| matches!(k, EventKind::TaskLanded { task: t, .. } if *t == task),
        )
    };
    assert!(t5_rejected < landed("t5"));
    for sub in ["t4.1", "t4.2", "t4.3"] {
        assert!(t4_split < landed(sub), "{sub}");
    }
    assert!(!events.iter().any(|e| matches!(&e.kind,
        EventKind::DecompositionRejected { parent, .. } if *parent == id("t4"))));

    // Parallel workers, each on a branch of its own: several attempts run at once, and
    // each task's handoff reports its own commit; the tasks' tests ran (in the sandbox)
    // and passed.
    let mut running = 0usize;
    let mut most = 0usize;
    for e in &events {
        match &e.kind {
            EventKind::TaskStarted { .. } => {
                running += 1;
                most = most.max(running);
            }
            EventKind::TaskLanding { .. }
            | EventKind::TaskCompleted { .. }
            | EventKind::TaskFailed { .. }
            | EventKind::TaskRetried { .. }
            | EventKind::DecompositionAccepted { .. } => running = running.saturating_sub(1),
            _ => {}
        }
    }
    assert!(most >= 3, "at most {most} attempts ran at once");
    let mut branches = std::collections::BTreeSet::new();
    for e in &events {
        if let EventKind::TaskLanding {
            task,
            branch,
            handoff: Some(handoff),
            ..
        } = &e.kind
        {
            assert_eq!(handoff.status, HandoffStatus::Complete, "{task}");
            assert_eq!(handoff.build_exit_code, Some(0), "{task}'s command");
            assert!(branch.ends_with(&format!("/{task}")), "{task}: {branch}");
            branches.insert(branch.clone());
        }
    }
    assert!(branches.len() >= 12, "{branches:?}");

    // One conflict: t2 clashes with t1 in README.md, is retried once, and becomes the
    // conflict fix f1, which lands, and t2 with it.
    let retried = at("t2 conflicts, retrying", &|k| {
        matches!(k, EventKind::MergeConflict { task, retrying: true, files, .. }
            if *task == id("t2") && files == &["README.md".to_string()])
    });
    let conflict = at(
        "t2 conflicts again",
        &|k| matches!(k, EventKind::MergeConflict { task, retrying: false, .. } if *task == id("t2")),
    );
    let f1_added = at("f1 added for t2's conflict", &|k| {
        matches!(k, EventKind::FixTaskAdded { task, fix: FixOf::Conflict { task: of, .. }, .. }
            if *task == id("f1") && *of == id("t2"))
    });
    let t2_via_f1 = at("t2 landed through f1", &|k| {
        matches!(k, EventKind::TaskLanded { task, via: Some(via), .. }
            if *task == id("t2") && *via == id("f1"))
    });
    assert!(landed("t1") < retried && retried < conflict && conflict < f1_added);
    assert!(f1_added < landed("f1") && landed("f1") < t2_via_f1);

    // One build break: t6 and t7 both land; a sweep finds main red (build), and the
    // Reconciler's fix f2 for lib/shout.sh lands.
    let red = at("a red sweep", &|k| {
        matches!(k, EventKind::SweepFinished { report }
            if !report.green && report.class.as_deref() == Some("build failure"))
    });
    let f2_added = at("f2 added to fix main", &|k| {
        matches!(k, EventKind::FixTaskAdded { task, fix: FixOf::Sweep { class, .. }, spec, .. }
            if *task == id("f2") && class == "build failure"
                && spec.scope == ["lib/shout.sh".to_string()])
    });
    assert!(landed("t6") < red && landed("t7") < red && red < f2_added);
    assert!(f2_added < landed("f2"));

    // Finalization: the run completes only after a green sweep of main with f2 on it.
    let finalizing = at("finalization", &|k| {
        matches!(k, EventKind::FinalizationStarted { .. })
    });
    let green = events
        .iter()
        .rposition(|e| matches!(&e.kind, EventKind::SweepFinished { report } if report.green))
        .expect("a green sweep");
    assert!(planning_finished < finalizing && landed("f2") < green);
    assert!(
        !events[green..]
            .iter()
            .any(|e| matches!(e.kind, EventKind::MainMoved { .. })),
        "main does not move after the last, green sweep: {kinds:?}"
    );
    // Fixes: exactly one per planted problem.
    let fixes = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::FixTaskAdded { .. }))
        .count();
    assert_eq!(fixes, 2);

    // The repository: main holds the work, its build and tests pass, nothing is left over.
    let repo = repository(&stderr);
    let green = sh(&repo, "sh build.sh && sh test.sh");
    assert!(
        green.status.success(),
        "main is green in {}:\n{}",
        repo.display(),
        String::from_utf8_lossy(&green.stdout)
    );
    let tests = String::from_utf8_lossy(&green.stdout).to_string();
    for test in [
        "upper", "lower", "reverse", "title", "letters", "ends", "shout",
    ] {
        assert!(tests.contains(&format!("ok   tests/{test}.sh")), "{tests}");
    }
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    assert!(readme.contains("- `upper WORD...`") && readme.contains("- `lower WORD...`"));
    assert!(!readme.contains("<<<<<<<"), "{readme}");
    let state = sh(
        &repo,
        "git status --porcelain && git branch --list 'flotilla/*'",
    );
    assert_eq!(
        String::from_utf8_lossy(&state.stdout),
        "",
        "a clean checkout"
    );
}

/// Without `--json`: the run's lines, then the task graph, the report and where the
/// repository is.
#[test]
fn the_demo_ends_with_the_graph_the_report_and_the_repository() {
    let tmp = tempfile::tempdir().unwrap();
    let (stdout, stderr, success) = demo(tmp.path(), &[]);
    assert!(success, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let graph = stdout.find("\nflowchart LR\n").expect("the Mermaid graph");
    let report = stdout.find("\nRun ").expect("the report");
    let place = stdout.find("The demo's repository: ").expect("where it is");
    assert!(stdout.find("run finished: completed").unwrap() < graph);
    assert!(graph < report && report < place, "{stdout}");
    for said in [
        "  t3_1 -.-> t3",
        "  t4_2 --> t4_3",
        "Tasks: 14 (2 fix tasks) · 14 completed",
        "2 decomposed",
        "1 conflict fix (1 completed)",
        "1 sweep fix",
        "Left for you: nothing.",
    ] {
        assert!(stdout.contains(said), "{said:?} not in:\n{stdout}");
    }
    let repo = repository(&stdout);
    assert!(repo.join(".git").is_dir(), "{}", repo.display());
    assert!(repo.starts_with(tmp.path()), "{}", repo.display());
}

/// `--keep`: after the run the demo's daemon keeps serving, the demo says how to reach it,
/// other commands see the run there, and Ctrl-C (SIGINT) stops it cleanly.
#[test]
fn with_keep_the_demos_daemon_serves_until_ctrl_c() {
    use std::io::BufRead;
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["demo", "--keep"])
        .env("TMPDIR", tmp.path())
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut said = String::new();
    // Read until the demo names the state directory and the commands to try.
    let state_dir = loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("the demo ended without saying how to reach it:\n{said}"))
            .unwrap();
        said.push_str(&line);
        said.push('\n');
        if let Some(dir) = line.trim().strip_prefix("export FLOTILLA_STATE_DIR=") {
            break PathBuf::from(dir);
        }
    };
    let status_line = lines.next().unwrap().unwrap();
    let run = status_line
        .split_whitespace()
        .nth(2)
        .unwrap_or_else(|| panic!("{status_line}"))
        .to_string();
    assert!(
        status_line.trim().ends_with(&format!(" status {run}")),
        "{status_line}"
    );
    assert!(state_dir.starts_with(tmp.path()), "{}", state_dir.display());

    // Another command, as the user would run it, reaches the demo's daemon.
    let report = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["report", &run])
        .env("FLOTILLA_STATE_DIR", &state_dir)
        .env_remove("FLOTILLA_SOCKET")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(report.status.success(), "{text}");
    assert!(
        text.contains(" completed: Add the commands in the backlog to wordtool"),
        "{text}"
    );

    // Ctrl-C stops it; the run completed, so the demo exits 0.
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: a signal to the child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    drop(lines);
    let exit = child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
}
