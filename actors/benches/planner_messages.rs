//! The size of the root planner's messages about the repository: the first one (the whole
//! repository) and the tenth (what changed since the ninth), on a synthetic 2,000-file
//! repository where 20 files change between calls (10 added, 10 removed), with a spec, a
//! FEATURES.json that changes every third call, and 40 commits. Sizes are exact, not
//! timings: the point is that a follow-up costs what changed, not what exists (the seed's
//! "delta optimization"). Prints the figures; fails if the tenth is not at least 10× smaller.
//!
//!     cargo bench -p flotilla-actors --bench planner_messages

// Test code: a failed unwrap is a failed test (the lint policy, ADR-027).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use flotilla_actors::actors::planner::context::RepoContext;
use flotilla_actors::ports::RepoSnapshot;

fn snapshot(call: usize) -> RepoSnapshot {
    // Call n has files n*10 .. n*10 + 2000: 10 new ones, 10 gone, each time.
    let mut files: Vec<String> = (call * 10..call * 10 + 2000)
        .map(|i| format!("crates/part{:02}/src/module_{i:05}.rs", i % 37))
        .collect();
    files.sort();
    RepoSnapshot {
        commit: format!("{call:040}"),
        files,
        files_omitted: 0,
        docs: vec![
            ("SPEC.md".into(), "A calculator with a REPL.\n".repeat(200)),
            (
                "FEATURES.json".into(),
                format!(
                    "{{\"done\": {}, \"features\": [\"add\", \"sub\"]}}",
                    call / 3
                ),
            ),
        ],
        recent_commits: (0..40)
            .map(|i| format!("{:07x} land task t{} of the calculator", i * 7919 + call, i))
            .collect(),
    }
}

fn main() {
    let mut context = RepoContext::default();
    let first = context.initial(Ok(snapshot(0))).chars().count();
    let mut sizes = vec![first];
    for call in 1..10 {
        sizes.push(context.follow_up(Ok(snapshot(call))).chars().count());
    }
    let tenth = sizes[9];
    println!("planner messages about a 2,000-file repository, 20 files changed between calls");
    println!("  1st message (whole repository): {first:>7} characters");
    println!("  10th message (changes only):    {tenth:>7} characters");
    println!(
        "  ratio: {:.1}x smaller; messages 2-10: {:?}",
        first as f64 / tenth as f64,
        &sizes[1..]
    );
    assert!(
        tenth * 10 <= first,
        "the follow-up must be at least 10x smaller than the first message"
    );
}
