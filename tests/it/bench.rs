//! `flotilla bench` through the built binary: it runs, prints one JSON object per
//! measurement with the documented fields, and its numbers are sane. Never whether they
//! are fast: that is the bench's own job, on a quiet machine.

use std::collections::BTreeSet;

use assert_cmd::Command;
use serde_json::Value;

fn bench(args: &[&str]) -> Vec<Value> {
    let output = Command::cargo_bin("flotilla")
        .unwrap()
        .arg("bench")
        .args(args)
        .env("NO_COLOR", "1")
        .timeout(std::time::Duration::from_secs(300))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "flotilla bench {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: not JSON: {l}")))
        .collect()
}

fn number(m: &Value, field: &str) -> f64 {
    m[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} is not a number in {m}"))
}

#[test]
fn bench_with_500_tasks_runs_and_reports_sane_numbers_as_json() {
    let rows = bench(&[
        "--tasks",
        "500",
        "--chain",
        "50",
        "--scaling",
        "100,300",
        "--memory-runs",
        "2",
        "--json",
    ]);
    for m in &rows {
        for field in [
            "name",
            "tasks",
            "journal",
            "tasks_per_s",
            "events_per_s",
            "dispatch_p50_us",
            "dispatch_p99_us",
            "dispatch_max_us",
            "peak_rss_bytes",
        ] {
            assert!(m.get(field).is_some(), "{field} missing in {m}");
        }
    }
    let names: BTreeSet<(String, String)> = rows
        .iter()
        .filter(|m| !m["name"].as_str().unwrap().starts_with("makespan/"))
        .filter(|m| !m["name"].as_str().unwrap().starts_with("requests/"))
        .map(|m| {
            (
                m["name"].as_str().unwrap().to_string(),
                m["journal"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: BTreeSet<(String, String)> = [
        ("throughput/independent", "sqlite"),
        ("throughput/independent", "memory"),
        ("throughput/chain", "sqlite"),
        ("throughput/chain", "memory"),
        ("scaling/100", "sqlite"),
        ("scaling/300", "sqlite"),
        ("memory/after-run-1", "sqlite"),
        ("memory/after-run-2", "sqlite"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(names, expected);

    for m in rows
        .iter()
        .filter(|m| !m["name"].as_str().unwrap().starts_with("makespan/"))
        .filter(|m| !m["name"].as_str().unwrap().starts_with("requests/"))
    {
        let tasks = m["tasks"].as_u64().unwrap();
        let want = match m["name"].as_str().unwrap() {
            "throughput/independent" => 500,
            "throughput/chain" => 50,
            "scaling/100" => 100,
            "scaling/300" => 300,
            _ => 500,
        };
        assert_eq!(tasks, want, "{m}");
        let (tps, eps) = (number(m, "tasks_per_s"), number(m, "events_per_s"));
        assert!(tps > 0.0 && tps.is_finite(), "{m}");
        // Each task is at least added, ready, dispatched, started and completed.
        assert!(eps >= 5.0 * tps * 0.99, "{m}");
        let (p50, p99, max) = (
            number(m, "dispatch_p50_us"),
            number(m, "dispatch_p99_us"),
            number(m, "dispatch_max_us"),
        );
        assert!(0.0 <= p50 && p50 <= p99 && p99 <= max, "{m}");
        // A dispatch never takes as long as a minute.
        assert!(max < 60e6, "{m}");
        let rss = m["peak_rss_bytes"].as_u64().unwrap();
        assert!((1 << 20..1 << 34).contains(&rss), "{m}");
    }

    // The memory rows: the resident set after each run, and how far above idle.
    for m in rows
        .iter()
        .filter(|m| m["name"].as_str().unwrap().starts_with("memory/"))
    {
        let rss = m["rss_bytes"].as_u64().unwrap();
        assert!((1 << 20..1 << 34).contains(&rss), "{m}");
        let above = m["rss_above_idle_bytes"].as_i64().unwrap();
        assert!(above.unsigned_abs() < rss, "{m}");
    }

    // ADR-030: the planner's largest request, on by default. The 1,000-task run sends
    // every sprint within the default budget (128,000 bytes of messages: 32,000 tokens);
    // junk answers of 5 MiB each never reach the next request whole.
    let requests: Vec<(&str, u64, u64)> = rows
        .iter()
        .filter(|m| m["name"].as_str().unwrap().starts_with("requests/"))
        .map(|m| {
            (
                m["name"].as_str().unwrap(),
                m["requests"].as_u64().unwrap(),
                m["largest_request_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        requests.iter().map(|r| r.0).collect::<Vec<_>>(),
        ["requests/planner-run", "requests/hostile-planner"]
    );
    let (_, calls, largest) = requests[0];
    assert!(calls > 20, "one call per sprint at least: {calls}");
    assert!((10_000..=140_000).contains(&largest), "{largest}");
    let (_, calls, largest) = requests[1];
    assert_eq!(calls, 10, "it gives up after 10 errors in a row");
    assert!(largest <= 64 * 1024, "{largest}");

    let makespan: Vec<&Value> = rows
        .iter()
        .filter(|m| m["name"].as_str().unwrap().starts_with("makespan/"))
        .collect();
    assert!(
        !makespan.is_empty(),
        "the makespan rows are there by default"
    );
    let policies: BTreeSet<&str> = makespan
        .iter()
        .map(|m| m["policy"].as_str().unwrap())
        .collect();
    assert_eq!(policies, BTreeSet::from(["critical_path", "fifo"]));
    for m in makespan {
        let ratio = number(m, "makespan_over_lower_bound");
        assert!((1.0..10.0).contains(&ratio), "{m}");
        assert!((200..=2_000).contains(&m["tasks"].as_u64().unwrap()), "{m}");
    }
}

#[test]
fn bench_refuses_bad_sizes_with_a_hint() {
    let out = Command::cargo_bin("flotilla")
        .unwrap()
        .args(["bench", "--scaling", "10,lots"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"lots\" is not a number of tasks"), "{err}");
    assert!(err.contains("hint:"), "{err}");
    let out = Command::cargo_bin("flotilla")
        .unwrap()
        .args(["bench", "--tasks", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// `flotilla bench --landing` end to end with tiny sizes: two repository sizes, a gate,
/// every task landed, each row's fields there and consistent with each other. Never how
/// fast (M12 item 6).
#[test]
fn bench_landing_lands_every_task_on_each_size_and_reports_its_fields() {
    let dir = tempfile::tempdir().unwrap();
    let rows = bench(&[
        "--landing",
        "--landing-files",
        "30,120",
        "--landing-tasks",
        "6",
        "--landing-workers",
        "2",
        "--landing-gate",
        "test -f README.md",
        "--landing-dir",
        dir.path().to_str().unwrap(),
        "--json",
    ]);
    let names: Vec<&str> = rows.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["landing/30-files", "landing/120-files"]);
    for (m, files) in rows.iter().zip([30, 120]) {
        assert_eq!(m["files"].as_u64(), Some(files), "{m}");
        assert_eq!(m["tasks"].as_u64(), Some(6), "{m}");
        assert_eq!(m["landed"].as_u64(), Some(6), "{m}");
        assert_eq!(m["workers"].as_u64(), Some(2), "{m}");
        assert_eq!(m["gate"].as_str(), Some("test -f README.md"), "{m}");
        assert!(number(m, "landed_per_s") > 0.0, "{m}");
        assert!(number(m, "cpu_ms_per_task") >= 0.0, "{m}");
        let (p50, p99) = (
            number(m, "dispatch_landed_p50_ms"),
            number(m, "dispatch_landed_p99_ms"),
        );
        assert!(p50 <= p99, "{m}");
        // Each task's started→landing is within its dispatch→landed, so are their medians.
        assert!(number(m, "started_landing_p50_ms") <= p50, "{m}");
        // So are the phases around it.
        assert!(number(m, "dispatched_started_p50_ms") <= p50, "{m}");
        assert!(number(m, "landing_landed_p50_ms") <= p50, "{m}");
        // The queue's part, split at the journaled intent: both halves within it.
        assert!(
            number(m, "landing_intended_p50_ms") <= number(m, "landing_landed_p50_ms"),
            "{m}"
        );
        assert!(
            number(m, "intended_landed_p50_ms") <= number(m, "landing_landed_p50_ms"),
            "{m}"
        );
        // Before the dispatch: the wait for a slot, there for every row.
        assert!(number(m, "ready_dispatched_p50_ms") >= 0.0, "{m}");
        assert!(m["peak_rss_bytes"].as_u64().unwrap() > 1 << 20, "{m}");
        assert!(m["disk_bytes"].as_u64().unwrap() > 0, "{m}");
    }
    // The generated repositories are cached for the next bench; the cases are gone.
    let left: BTreeSet<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        left,
        BTreeSet::from([
            "template-30-files-v1.git".to_string(),
            "template-120-files-v1.git".to_string()
        ])
    );
}

/// `--landing-next-run`: each case's next run on the same repository, after a daemon
/// restart, is measured and named apart; both land every task.
#[test]
fn bench_landing_measures_the_next_run_of_each_repository_apart() {
    let dir = tempfile::tempdir().unwrap();
    let rows = bench(&[
        "--landing",
        "--landing-files",
        "30",
        "--landing-tasks",
        "6",
        "--landing-workers",
        "2",
        "--landing-next-run",
        "--landing-dir",
        dir.path().to_str().unwrap(),
        "--json",
    ]);
    let names: Vec<&str> = rows.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["landing/30-files", "landing/30-files/next-run"]);
    for m in &rows {
        assert_eq!(m["landed"].as_u64(), Some(6), "{m}");
        assert!(number(m, "cpu_ms_per_task") >= 0.0, "{m}");
    }
}

/// `flotilla bench --gate-timing PATH` end to end on a tiny project with a gate that only
/// looks at the candidate: each mode gates every candidate, the report is one JSON object
/// with both modes' times, their later medians and the ratio, and nothing is left behind.
/// Never how fast (M12 items 6 and 7).
#[test]
fn bench_gate_timing_gates_each_candidate_cold_and_warm_and_reports_both() {
    let project = crate::daemon_env::git_repo();
    let repo = git2::Repository::open(project.path()).unwrap();
    crate::daemon_env::commit_files(&repo, &[("src/lib.rs", "pub fn f() {}\n")], "lib");
    let dir = tempfile::tempdir().unwrap();
    let rows = bench(&[
        "--gate-timing",
        project.path().to_str().unwrap(),
        "--gate-candidates",
        "3",
        "--gate-command",
        "grep -q 'candidate' src/lib.rs",
        "--landing-dir",
        dir.path().to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let report = &rows[0];
    assert_eq!(report["changed_file"], "src/lib.rs", "{report}");
    assert_eq!(report["command"], "grep -q 'candidate' src/lib.rs");
    let head = repo
        .head()
        .unwrap()
        .peel_to_commit()
        .unwrap()
        .id()
        .to_string();
    assert_eq!(report["commit"].as_str(), Some(head.as_str()));
    for mode in ["cold_ms", "warm_ms"] {
        assert_eq!(report[mode].as_array().unwrap().len(), 3, "{report}");
    }
    assert!(report["cold_later_median_ms"].is_u64(), "{report}");
    assert!(report["warm_later_median_ms"].is_u64(), "{report}");
    assert!(number(report, "speed_up") > 0.0, "{report}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
