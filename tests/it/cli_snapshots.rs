//! The CLI's output pinned (issue 21 item 7): `tail`, `status` and `runs`, as text and as
//! `--json`, of one finished run of a real daemon on the scripted provider, compared with the
//! reviewed snapshots in `tests/it/snapshots/` (insta). Ids, times, commits and temporary
//! paths differ from run to run; filters replace them with placeholders, nothing else.
//!
//! A change to what these commands print fails here: review the new output
//! (`cargo insta review`, or the `.snap.new` files beside the old ones) and commit it with
//! the change that made it. CI never writes snapshots (`INSTA_UPDATE=no` in `.ci/run`).

use crate::daemon_env::*;

/// Two tasks, the second after the first and blocked: a dependency, a completion and a
/// failure to show. One after the other, so that the journal's order is the same every
/// time (independent tasks would interleave as the machine schedules them).
///
/// The agent takes a while (`delay_ms`), so every attempt is charged its wall time: an
/// attempt done within the millisecond would have no such charge, and the journal one
/// event less.
const SCENARIO: &str = r#"
[agent]
delay_ms = 30

[[planner.answers]]
tasks = [
  { description = "write the lexer", scope = ["src/lex.rs"] },
  { description = "write the parser", scope = ["src/parse.rs"], dependencies = [0] },
]
[tasks.t1]
summary = "wrote the lexer"
[tasks.t2]
outcome = "blocked"
summary = "no grammar given"
"#;

/// The command's standard output; it must exit with `code`.
fn output(state: &std::path::Path, args: &[&str], code: i32) -> String {
    let out = flotilla(state)
        .args(args)
        .timeout(std::time::Duration::from_secs(120))
        .assert()
        .code(code);
    String::from_utf8(out.get_output().stdout.clone()).unwrap()
}

/// Placeholders for what differs between two runs of the same scenario.
fn settings(run: &str) -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    settings.set_prepend_module_to_snapshot(true);
    settings.add_filter(&regex::escape(run), "[run]");
    // Branch names hold the id without its dashes.
    settings.add_filter(&run.replace('-', ""), "[run-hex]");
    settings.add_filter(&regex::escape(&run[..8]), "[run-prefix]");
    settings.add_filter(
        r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        "[uuid]",
    );
    settings.add_filter(r"\b[0-9a-f]{40}\b", "[commit]");
    // The test repository's first commit (its hash has the time in it).
    settings.add_filter(r"(\b|\\n)[0-9a-f]{7}\b", "$1[short]");
    settings.add_filter(r"bubblewrap [0-9][0-9.]*", "bubblewrap [version]");
    // Times of day, durations.
    settings.add_filter(r"\b\d\d:\d\d:\d\d\b", "[time]");
    settings.add_filter(r"\b\d+ ms\b", "[n] ms");
    // The disk the repository's pool takes differs by file system (ADR-052).
    settings.add_filter(r"next run, \d+ MiB", "next run, [n] MiB");
    settings.add_filter(r"\b\d+\.\ds (agent time|elapsed)", "[n]s $1");
    let tmp = std::env::temp_dir();
    let tmp = regex::escape(tmp.to_string_lossy().trim_end_matches('/'));
    settings.add_filter(&format!(r"{tmp}/\.tmp[A-Za-z0-9]+"), "[tmp]");
    // Times since the epoch, in every field that holds one.
    settings.add_filter(r#""(\w+_ms)":(\s*)\d+"#, r#""$1":$2[ms]"#);
    settings
}

#[test]
fn tail_status_and_runs_print_what_their_snapshots_hold() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    std::fs::write(
        repo.path().join("flotilla.toml"),
        "[provider]\nscenario = \"scenario.toml\"\n",
    )
    .unwrap();
    std::fs::write(repo.path().join("scenario.toml"), SCENARIO).unwrap();
    let _daemon = DaemonProcess::start(state.path());
    let submitted = flotilla(state.path())
        .args(["submit", "build a parser", "--detach", "--repo"])
        .arg(repo.path())
        .assert()
        .success();
    let run = String::from_utf8(submitted.get_output().stdout.clone())
        .unwrap()
        .trim()
        .to_string();
    // Followed to its end: a blocked task fails the run (exit code 1).
    let tail = output(state.path(), &["tail", &run], 1);
    let s = state.path();
    // The run's clean-up leaves its workspace in the repository's pool (ADR-052), which
    // `status` shows: asked for once that is done, whatever the machine's speed.
    let pool = flotilla::git::slots::repository_pool(&s.join("worktrees"), repo.path()).unwrap();
    let waited = std::time::Instant::now();
    while !std::fs::read_dir(&pool).is_ok_and(|mut e| {
        e.any(|e| e.is_ok_and(|e| !e.file_name().to_string_lossy().starts_with('.')))
    }) {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(60),
            "no pool"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    settings(&run).bind(|| {
        insta::assert_snapshot!("tail", tail);
        insta::assert_snapshot!("tail_json", output(s, &["tail", &run, "--json"], 1));
        insta::assert_snapshot!("status", output(s, &["status", &run], 0));
        insta::assert_snapshot!("status_json", output(s, &["status", &run, "--json"], 0));
        insta::assert_snapshot!("runs", output(s, &["runs"], 0));
        insta::assert_snapshot!("runs_json", output(s, &["runs", "--json"], 0));
    });
}
