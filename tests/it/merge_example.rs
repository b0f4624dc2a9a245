//! The merge example as a user runs it (`docs/examples/merge/`): `setup.sh DIR` makes the
//! repository, a real `flotilla daemon` runs, and `flotilla submit "…" --repo DIR` lands 20
//! scripted tasks on main through the merge queue. Two true conflicts and one build break
//! are planted; the run must end completed with main green, every task landed exactly once,
//! and exactly one fix task per planted problem.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use flotilla_actors::protocol::{EventKind, FixOf, RunOutcome, TaskId};

use crate::daemon_env::{DaemonProcess, follow_to_end, outcome};

fn example_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/examples/merge")
}

fn sh(dir: &Path, script: &str) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// `git` in `dir`, its stdout; the test fails with its stderr if it fails.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn the_merge_example_lands_twenty_tasks_and_heals_two_conflicts_and_a_build_break() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("wordtool");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&state).unwrap();

    let setup = Command::new("sh")
        .arg(example_dir().join("setup.sh"))
        .arg(&repo)
        .output()
        .unwrap();
    assert!(
        setup.status.success(),
        "setup.sh failed: {}{}",
        String::from_utf8_lossy(&setup.stdout),
        String::from_utf8_lossy(&setup.stderr)
    );
    let start = git(&repo, &["rev-parse", "main"]).trim().to_string();

    let daemon = DaemonProcess::start(&state);
    let submitted = tokio::task::spawn_blocking({
        let (repo, state) = (repo.clone(), state.clone());
        move || {
            Command::new(env!("CARGO_BIN_EXE_flotilla"))
                .arg("--state-dir")
                .arg(&state)
                .args([
                    "submit",
                    "Add the commands in the backlog to wordtool",
                    "--repo",
                ])
                .arg(&repo)
                .env("NO_COLOR", "1")
                .env_remove("FLOTILLA_SOCKET")
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let tail = String::from_utf8_lossy(&submitted.stdout).to_string();
    assert!(
        submitted.status.success(),
        "submit exits 0 only for a completed run; its output:\n{tail}\n{}\ndaemon log:\n{}",
        String::from_utf8_lossy(&submitted.stderr),
        daemon.log()
    );
    let said = format!("{}{tail}", String::from_utf8_lossy(&submitted.stderr));
    let run = said
        .lines()
        .find_map(|l| l.strip_prefix("run ")?.split_whitespace().next())
        .expect("submit names the run")
        .to_string();

    // `submit` ends with the run's report; before it, the tail's last line says what
    // reached main.
    let (followed, report) = tail
        .split_once("\n\nRun ")
        .unwrap_or_else(|| panic!("no report at the end of:\n{tail}"));
    // The report counts what the tail showed: twenty tasks and three fixes landed, two of
    // the tasks through their conflict fixes, one red sweep that made the third fix.
    for said in [
        "Tasks: 23 (3 fix tasks) · 23 completed, 21 first try",
        "Merges: 23 queued, 21 landed, 2 through a conflict fix (100% of queued branches landed)",
        "2 conflict fixes (2 completed)",
        "(1 red, 1 sweep fix)",
        "Left for you: nothing.",
    ] {
        assert!(
            report.contains(said),
            "{said:?} not in the report:\nRun {report}"
        );
    }
    let last = followed.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(&format!("main {} → ", &start[..7]))
            && last
                .contains(" · 23 tasks landed · fix tasks: 2 for conflicts, 1 for a red main · ")
            && last.ends_with(", the last green"),
        "{last}"
    );

    let client = DaemonProcess::client(&state);
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed), "{tail}");

    // Exactly one fix per planted problem: a conflict fix each for t2 (README.md) and t4
    // (CHANGELOG.md), and one sweep fix for the build break, in lib/shout.sh.
    let mut fixes: BTreeMap<TaskId, FixOf> = BTreeMap::new();
    let mut landed: BTreeMap<TaskId, Vec<Option<TaskId>>> = BTreeMap::new();
    for e in &events {
        match &e.kind {
            EventKind::FixTaskAdded { task, fix, .. } => {
                fixes.insert(task.clone(), fix.clone());
            }
            EventKind::TaskLanded { task, via, .. } => {
                landed.entry(task.clone()).or_default().push(via.clone());
            }
            _ => {}
        }
    }
    // Which task of a pair conflicts depends on which lands first: either may.
    let described: Vec<String> = fixes
        .iter()
        .map(|(id, fix)| match fix {
            FixOf::Conflict { task, files, .. } => {
                let pair = match task.to_string().as_str() {
                    "t1" | "t2" => "t1/t2",
                    "t3" | "t4" => "t3/t4",
                    other => other,
                }
                .to_string();
                format!("conflict of {pair} in {files:?}")
            }
            FixOf::Sweep { class, .. } => format!("{id}: sweep ({class})"),
        })
        .collect();
    let mut conflicts: Vec<&String> = described.iter().take(2).collect();
    conflicts.sort();
    assert_eq!(
        conflicts,
        [
            r#"conflict of t1/t2 in ["README.md"]"#,
            r#"conflict of t3/t4 in ["CHANGELOG.md"]"#,
        ],
        "{tail}"
    );
    assert_eq!(fixes.len(), 3, "{described:?}");
    assert_eq!(described[2], "f3: sweep (build failure)", "{tail}");
    let f3_scope = events.iter().find_map(|e| match &e.kind {
        EventKind::FixTaskAdded { task, spec, .. } if task.to_string() == "f3" => {
            Some(spec.scope.clone())
        }
        _ => None,
    });
    assert_eq!(f3_scope, Some(vec!["lib/shout.sh".to_string()]));

    // Every task landed exactly once; t2 and t4 through their conflict fixes.
    let mut expected: Vec<String> = (1..=20).map(|i| format!("t{i}")).collect();
    expected.extend(["f1", "f2", "f3"].map(String::from));
    expected.sort();
    let mut got: Vec<String> = landed.keys().map(|t| t.to_string()).collect();
    got.sort();
    assert_eq!(got, expected, "every task lands, none is lost");
    for (task, vias) in &landed {
        assert_eq!(vias.len(), 1, "{task} landed more than once: {vias:?}");
    }
    // The conflicting task of each pair landed through its fix, and only then.
    let through_fix: BTreeMap<String, String> = fixes
        .iter()
        .filter_map(|(id, fix)| match fix {
            FixOf::Conflict { task, .. } => Some((task.to_string(), id.to_string())),
            FixOf::Sweep { .. } => None,
        })
        .collect();
    for (task, vias) in &landed {
        let via = vias[0].as_ref().map(|v| v.to_string());
        assert_eq!(via.as_ref(), through_fix.get(&task.to_string()), "{task}");
    }

    // main: linear, one commit per landing, each task's trailer exactly once.
    let log = git(
        &repo,
        &[
            "log",
            "--first-parent",
            "--format=%H %P%n%B%x00",
            &format!("{start}..main"),
        ],
    );
    let commits: Vec<&str> = log
        .split('\0')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    for c in &commits {
        let parents = c.lines().next().unwrap().split_whitespace().count() - 1;
        assert_eq!(parents, 1, "main stays linear: {c}");
    }
    let trailer_count = |t: &str| {
        let line = format!("Flotilla-Task: {run}/{t}");
        commits
            .iter()
            .filter(|c| c.lines().any(|l| l.trim() == line))
            .count()
    };
    // A task that landed through its conflict fix has no commit of its own: its work is in
    // the fix's commit.
    for t in &expected {
        let want = usize::from(!through_fix.contains_key(t));
        assert_eq!(trailer_count(t), want, "{t}'s trailer on main");
    }
    assert_eq!(
        commits.len(),
        21,
        "20 tasks - 2 landed through fixes + 3 fixes"
    );

    // The user's checkout of main was brought along, clean, and main is green.
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");
    assert_eq!(
        git(&repo, &["rev-parse", "HEAD"]),
        git(&repo, &["rev-parse", "main"])
    );
    let green = sh(&repo, "sh build.sh && sh test.sh");
    assert!(
        green.status.success(),
        "main is green: {}",
        String::from_utf8_lossy(&green.stdout)
    );
    // Both sides of each conflict survived, with no marker left.
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    assert!(readme.contains("- `upper WORD...`") && readme.contains("- `lower WORD...`"));
    let changelog = std::fs::read_to_string(repo.join("CHANGELOG.md")).unwrap();
    assert!(changelog.contains("- `reverse`") && changelog.contains("- `count`"));
    for text in [&readme, &changelog] {
        assert!(
            !text.contains("<<<<<<<") && !text.contains(">>>>>>>"),
            "{text}"
        );
    }
    // No task branch is left: landed branches are deleted.
    assert_eq!(git(&repo, &["branch", "--list", "flotilla/*"]), "");
    drop(daemon);
}
