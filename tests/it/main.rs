//! flotilla's integration tests: one binary, one shared harness. Tests that need only
//! `flotilla-actors` (no daemon, git, SQLite or HTTP) are that crate's: `actors/tests/it`.

// Test code: a failed unwrap is a failed test (the lint policy, ADR-027).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod api_limits;
mod bench;
mod big_run;
mod boundary;
mod budgets;
mod builtin_agent;
mod checkout;
mod cli;
mod cli_setup;
mod cli_snapshots;
mod codex_real;
mod command_agent;
mod crash;
mod daemon;
mod daemon_env;
mod demo;
mod escapes;
mod eval;
mod finished_runs;
mod fuzz_regressions;
mod gc;
mod guides;
// The actor-only harness lives with the actor tests (actors/tests/it) and is shared from there;
// this binary uses only part of it, so what only the actor tests use may go unused here.
#[allow(dead_code)]
#[path = "../../actors/tests/it/harness.rs"]
mod harness;
mod journal_fixture;
mod landing_soak;
mod layout;
mod merge_example;
mod merge_git;
mod merge_queue;
mod notify;
mod page;
mod planner;
mod planner_tools;
mod process;
mod providers;
mod ref_locks;
mod retries;
mod retry_in_place;
mod reviewer;
mod run_report;
mod scratch_kit;
mod slots;
mod storage;
mod subplanner;
mod supervision;
mod target_branch;
mod transcripts;
mod warm_gate;
mod warm_repository;
mod worker;
mod worktrees;

/// A test file this binary does not name as a module is never compiled, so its tests
/// silently never run: every `.rs` file beside this one must be a `mod` here (issue 21,
/// item 4).
#[test]
fn every_test_file_is_a_module_of_this_binary() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it");
    let declared: std::collections::BTreeSet<String> = include_str!("main.rs")
        .lines()
        .filter_map(|line| line.strip_prefix("mod ")?.strip_suffix(';'))
        .map(String::from)
        .collect();
    let mut forgotten = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("tests/it is readable") {
        let path = entry.expect("a directory entry").path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.extension().is_some_and(|e| e == "rs") && stem != "main" && !declared.contains(stem)
        {
            forgotten.push(stem.to_string());
        }
    }
    assert!(
        forgotten.is_empty(),
        "tests/it files that are no module of tests/it/main.rs (their tests never run): {forgotten:?}"
    );
}
