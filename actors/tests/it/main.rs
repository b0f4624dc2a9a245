//! The actors' integration tests: one binary with one harness (probe actors standing in for
//! an actor's collaborators, `GraphHarness`, `PipelineHarness`). Everything here needs only
//! `flotilla-actors`: no git, SQLite, HTTP or daemon, so these tests build without them. Tests
//! that need the daemon's pieces are the top crate's (`tests/it`), which shares this harness.

// Test code: a failed unwrap is a failed test (the lint policy, ADR-027).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod budgets;
mod cancel_recovery;
mod dispatch;
mod harness;
mod landing;
mod landing_machine;
mod landing_recovery;
mod pipeline;
mod reconciler;
mod retries;
mod review;
mod subplan_rules;
mod task_graph;

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
        "actors/tests/it files that are no module of actors/tests/it/main.rs (their tests never run): {forgotten:?}"
    );
}
