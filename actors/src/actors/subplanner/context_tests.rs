use super::*;
use crate::protocol::{ArtifactKind, Budget, FailureReason, Usd};

const MAX_PATH: usize = 4096;

fn id(s: &str) -> TaskId {
    s.parse().unwrap()
}

fn handoff(status: HandoffStatus, summary: &str) -> Handoff {
    Handoff {
        status,
        ..Handoff::complete(summary)
    }
}

fn result(task: &str, state: TaskState, handoff: Option<Handoff>) -> SubtaskResult {
    SubtaskResult {
        task: id(task),
        state,
        handoff,
        failure: None,
    }
}

fn failed_because(task: &str, failure: FailureReason) -> SubtaskResult {
    SubtaskResult {
        failure: Some(failure),
        ..result(task, TaskState::Failed, None)
    }
}

fn done(task: &str, summary: &str) -> SubtaskResult {
    result(
        task,
        TaskState::Completed,
        Some(handoff(HandoffStatus::Complete, summary)),
    )
}

fn failed(task: &str, summary: &str) -> SubtaskResult {
    result(
        task,
        TaskState::Failed,
        Some(handoff(HandoffStatus::Failed, summary)),
    )
}

fn scope(paths: &[&str]) -> Vec<String> {
    paths.iter().map(|p| p.to_string()).collect()
}

fn spec_after(description: &str, paths: &[&str], deps: &[usize]) -> TaskSpec {
    TaskSpec {
        dependencies: deps.iter().map(|&j| DependencyRef::Batch(j)).collect(),
        ..TaskSpec::new(description, paths)
    }
}

fn descriptions(proposals: &[SubtaskProposal]) -> Vec<&str> {
    proposals.iter().map(|p| p.description.as_str()).collect()
}

// ---- aggregate: status ----

#[test]
fn aggregate_all_complete_is_complete() {
    let h = aggregate("p", &[done("t1.1", "a"), done("t1.2", "b")]);
    assert_eq!(h.status, HandoffStatus::Complete);
}

#[test]
fn aggregate_completed_without_handoff_counts_as_complete() {
    let h = aggregate("p", &[result("t1.1", TaskState::Completed, None)]);
    assert_eq!(h.status, HandoffStatus::Complete);
    assert_eq!(
        h.summary,
        "Decomposed \"p\" into 1 subtasks: 1 complete, 0 failed, 0 other.\n[t1.1] (complete): completed"
    );
}

#[test]
fn aggregate_all_failed_is_failed() {
    let h = aggregate(
        "p",
        &[
            failed("t1.1", "a"),
            result("t1.2", TaskState::Failed, None),
            // A failed subtask whose handoff claims partial work still failed.
            result(
                "t1.3",
                TaskState::Failed,
                Some(handoff(HandoffStatus::Partial, "c")),
            ),
        ],
    );
    assert_eq!(h.status, HandoffStatus::Failed);
}

#[test]
fn aggregate_mixed_complete_and_failed_is_partial() {
    let h = aggregate("p", &[done("t1.1", "a"), failed("t1.2", "b")]);
    assert_eq!(h.status, HandoffStatus::Partial);
}

#[test]
fn aggregate_completed_subtask_with_partial_handoff_makes_parent_partial() {
    let h = aggregate(
        "p",
        &[
            done("t1.1", "a"),
            result(
                "t1.2",
                TaskState::Completed,
                Some(handoff(HandoffStatus::Partial, "half")),
            ),
        ],
    );
    assert_eq!(h.status, HandoffStatus::Partial);
    assert!(
        h.summary.contains("\n[t1.2] (partial): half"),
        "{}",
        h.summary
    );
    assert!(
        h.summary.contains(": 1 complete, 0 failed, 1 other."),
        "{}",
        h.summary
    );
}

#[test]
fn aggregate_only_cancelled_is_blocked() {
    let h = aggregate(
        "p",
        &[
            result("t1.1", TaskState::Cancelled, None),
            result("t1.2", TaskState::Cancelled, None),
        ],
    );
    assert_eq!(h.status, HandoffStatus::Blocked);
    assert_eq!(
        h.summary,
        "Decomposed \"p\" into 2 subtasks: 0 complete, 0 failed, 2 other.\n\
         [t1.1] (blocked): cancelled\n\
         [t1.2] (blocked): cancelled"
    );
}

#[test]
fn aggregate_cancelled_and_complete_is_partial() {
    let h = aggregate(
        "p",
        &[
            done("t1.1", "a"),
            result("t1.2", TaskState::Cancelled, None),
        ],
    );
    assert_eq!(h.status, HandoffStatus::Partial);
}

#[test]
fn aggregate_failed_subtask_whose_handoff_says_blocked_counts_as_blocked() {
    let blocked = result(
        "t1.2",
        TaskState::Failed,
        Some(handoff(HandoffStatus::Blocked, "need a key")),
    );
    // Not every subtask failed, and none did any work: blocked, not failed.
    let h = aggregate("p", &[failed("t1.1", "a"), blocked.clone()]);
    assert_eq!(h.status, HandoffStatus::Blocked);
    assert!(
        h.summary
            .starts_with("Decomposed \"p\" into 2 subtasks: 0 complete, 1 failed, 1 other."),
        "{}",
        h.summary
    );
    assert!(h.summary.contains("\n[t1.2] (blocked): need a key"));
    // With completed work beside it, the parent is partial.
    let h = aggregate("p", &[done("t1.1", "a"), blocked]);
    assert_eq!(h.status, HandoffStatus::Partial);
}

#[test]
fn aggregate_failed_subtask_whose_failure_says_blocked_counts_as_blocked() {
    // A failed task keeps no handoff: the blocked worker's word is in its failure.
    let blocked = failed_because(
        "t1.2",
        FailureReason::Blocked {
            summary: "need a key".into(),
        },
    );
    let h = aggregate("p", &[failed("t1.1", "a"), blocked.clone()]);
    assert_eq!(h.status, HandoffStatus::Blocked);
    assert_eq!(
        h.summary,
        "Decomposed \"p\" into 2 subtasks: 0 complete, 1 failed, 1 other.\n\
         [t1.1] (failed): a\n\
         [t1.2] (blocked): failed: blocked: need a key"
    );
    let h = aggregate("p", &[blocked]);
    assert_eq!(h.status, HandoffStatus::Blocked);
    // Any other failure reason is a failure.
    let h = aggregate(
        "p",
        &[
            failed("t1.1", "a"),
            failed_because("t1.2", FailureReason::NoSubtaskSucceeded),
        ],
    );
    assert_eq!(h.status, HandoffStatus::Failed);
    assert!(
        h.summary
            .ends_with("\n[t1.2] (failed): failed: no subtask succeeded"),
        "{}",
        h.summary
    );
}

#[test]
fn aggregate_failed_and_cancelled_is_blocked() {
    let h = aggregate(
        "p",
        &[
            failed("t1.1", "a"),
            result("t1.2", TaskState::Cancelled, None),
        ],
    );
    assert_eq!(h.status, HandoffStatus::Blocked);
}

#[test]
fn aggregate_of_nothing_is_blocked() {
    let h = aggregate("p", &[]);
    assert_eq!(h.status, HandoffStatus::Blocked);
    assert_eq!(
        h.summary,
        "Decomposed \"p\" into 0 subtasks: 0 complete, 0 failed, 0 other."
    );
    assert!(h.files_changed.is_empty());
    assert_eq!(h.metrics, HandoffMetrics::default());
    assert_eq!(h.build_exit_code, None);
}

// ---- aggregate: contents ----

#[test]
fn aggregate_unions_files_in_first_seen_order_and_prefixes_notes() {
    let mut a = handoff(HandoffStatus::Complete, "did a");
    a.files_changed = scope(&["src/b.rs", "src/a.rs", "src/b.rs"]);
    a.concerns = scope(&["slow"]);
    a.suggestions = scope(&["cache it"]);
    let mut b = handoff(HandoffStatus::Complete, "did b");
    b.files_changed = scope(&["src/c.rs", "src/a.rs", "src/d.rs"]);
    b.concerns = scope(&["flaky", "untested"]);
    let h = aggregate(
        "add caching",
        &[
            result("t1.1", TaskState::Completed, Some(a)),
            result("t1.2", TaskState::Completed, Some(b)),
        ],
    );
    assert_eq!(
        h.files_changed,
        scope(&["src/b.rs", "src/a.rs", "src/c.rs", "src/d.rs"])
    );
    assert_eq!(
        h.concerns,
        scope(&["[t1.1] slow", "[t1.2] flaky", "[t1.2] untested"])
    );
    assert_eq!(h.suggestions, scope(&["[t1.1] cache it"]));
    assert_eq!(
        h.summary,
        "Decomposed \"add caching\" into 2 subtasks: 2 complete, 0 failed, 0 other.\n\
         [t1.1] (complete): did a\n\
         [t1.2] (complete): did b"
    );
}

#[test]
fn aggregate_summary_has_one_line_per_subtask() {
    let h = aggregate(
        "parent work",
        &[
            done("t1.1", "one"),
            failed("t1.2", "two"),
            result("t1.3", TaskState::Cancelled, None),
        ],
    );
    let lines: Vec<&str> = h.summary.lines().collect();
    assert_eq!(
        lines,
        vec![
            "Decomposed \"parent work\" into 3 subtasks: 1 complete, 1 failed, 1 other.",
            "[t1.1] (complete): one",
            "[t1.2] (failed): two",
            "[t1.3] (blocked): cancelled",
        ]
    );
}

#[test]
fn aggregate_sums_metrics_and_takes_the_longest_duration() {
    let mut a = handoff(HandoffStatus::Complete, "a");
    a.metrics = HandoffMetrics {
        lines_added: 10,
        lines_removed: 2,
        files_created: 1,
        files_modified: 3,
        files_deleted: 1,
        tokens_in: 1_000,
        tokens_out: 200,
        tool_calls: 7,
        duration_ms: 5_000,
        cost_usd: Usd::from_micros(1_500),
    };
    let mut b = handoff(HandoffStatus::Complete, "b");
    b.metrics = HandoffMetrics {
        lines_added: 5,
        lines_removed: 8,
        files_created: 0,
        files_modified: 2,
        files_deleted: 1,
        tokens_in: 300,
        tokens_out: 50,
        tool_calls: 4,
        duration_ms: 9_000,
        cost_usd: Usd::from_micros(500),
    };
    let mut c = handoff(HandoffStatus::Complete, "c");
    c.metrics.duration_ms = 1;
    let h = aggregate(
        "p",
        &[
            result("t1.1", TaskState::Completed, Some(a)),
            result("t1.2", TaskState::Completed, Some(b)),
            result("t1.3", TaskState::Completed, Some(c)),
            result("t1.4", TaskState::Cancelled, None),
        ],
    );
    assert_eq!(
        h.metrics,
        HandoffMetrics {
            lines_added: 15,
            lines_removed: 10,
            files_created: 1,
            files_modified: 5,
            files_deleted: 2,
            tokens_in: 1_300,
            tokens_out: 250,
            tool_calls: 11,
            duration_ms: 9_000,
            cost_usd: Usd::from_micros(2_000),
        }
    );
}

#[test]
fn aggregate_saturates_huge_metrics() {
    let huge = HandoffMetrics {
        lines_added: u64::MAX,
        lines_removed: u64::MAX,
        files_created: u64::MAX,
        files_modified: u64::MAX,
        files_deleted: u64::MAX,
        tokens_in: u64::MAX,
        tokens_out: u64::MAX,
        tool_calls: u64::MAX,
        duration_ms: u64::MAX,
        cost_usd: Usd::from_micros(u64::MAX),
    };
    let mut a = handoff(HandoffStatus::Complete, "a");
    a.metrics = huge;
    let mut b = handoff(HandoffStatus::Complete, "b");
    b.metrics = huge;
    let mut c = handoff(HandoffStatus::Complete, "c");
    c.metrics = HandoffMetrics {
        lines_added: 1,
        tokens_in: 1,
        duration_ms: 1,
        cost_usd: Usd::from_micros(1),
        ..HandoffMetrics::default()
    };
    let h = aggregate(
        "p",
        &[
            result("t1.1", TaskState::Completed, Some(a)),
            result("t1.2", TaskState::Completed, Some(b)),
            result("t1.3", TaskState::Completed, Some(c)),
        ],
    );
    assert_eq!(
        h.metrics,
        HandoffMetrics {
            lines_added: u64::MAX,
            lines_removed: u64::MAX,
            files_created: u64::MAX,
            files_modified: u64::MAX,
            files_deleted: u64::MAX,
            tokens_in: u64::MAX,
            tokens_out: u64::MAX,
            tool_calls: u64::MAX,
            duration_ms: u64::MAX,
            cost_usd: Usd::MAX,
        }
    );
}

fn with_exit(task: &str, code: Option<i32>) -> SubtaskResult {
    let mut h = handoff(HandoffStatus::Complete, "x");
    h.build_exit_code = code;
    result(task, TaskState::Completed, Some(h))
}

#[test]
fn aggregate_build_exit_code_is_the_first_failure() {
    let code = |codes: &[Option<i32>]| {
        let results: Vec<SubtaskResult> = codes
            .iter()
            .enumerate()
            .map(|(i, c)| with_exit(&format!("t1.{}", i + 1), *c))
            .collect();
        aggregate("p", &results).build_exit_code
    };
    assert_eq!(code(&[]), None);
    assert_eq!(code(&[None, None]), None);
    assert_eq!(code(&[None, Some(0)]), Some(0));
    assert_eq!(code(&[Some(0), Some(0)]), Some(0));
    assert_eq!(code(&[Some(0), Some(2), Some(3)]), Some(2));
    assert_eq!(code(&[Some(101), Some(0), Some(1)]), Some(101));
    assert_eq!(code(&[None, Some(-1), None]), Some(-1));
    // A subtask without a handoff reports no code.
    let results = [
        result("t1.1", TaskState::Cancelled, None),
        with_exit("t1.2", Some(4)),
    ];
    assert_eq!(aggregate("p", &results).build_exit_code, Some(4));
}

// ---- proposals_from ----

#[test]
fn proposals_remove_paths_outside_the_parent_scope() {
    let tasks = vec![TaskSpec::new("a", &["src/a.rs", "docs/x.md", "src/b.rs"])];
    let (props, notes) = proposals_from(tasks, &scope(&["src/a.rs", "src/b.rs"]), MAX_PATH);
    assert_eq!(props.len(), 1);
    assert_eq!(props[0].scope, scope(&["src/a.rs", "src/b.rs"]));
    assert_eq!(
        notes,
        vec!["Task 0: removed paths outside the parent's scope: \"docs/x.md\".".to_string()]
    );
}

#[test]
fn proposals_drop_a_task_left_without_paths() {
    let tasks = vec![
        TaskSpec::new("outside", &["docs/x.md", "README.md"]),
        TaskSpec::new("inside", &["src/a.rs"]),
    ];
    let (props, notes) = proposals_from(tasks, &scope(&["src"]), MAX_PATH);
    assert_eq!(descriptions(&props), vec!["inside"]);
    assert_eq!(
        notes,
        vec![
            "Task 0: removed paths outside the parent's scope: \"docs/x.md\", \"README.md\"."
                .to_string(),
            "Task 0 was dropped: none of its paths is inside the parent's scope.".to_string(),
        ]
    );
}

#[test]
fn proposals_drop_a_task_with_an_empty_scope() {
    let tasks = vec![TaskSpec::new("nothing", &[])];
    let (props, notes) = proposals_from(tasks, &scope(&["src"]), MAX_PATH);
    assert!(props.is_empty());
    assert_eq!(
        notes,
        vec!["Task 0 was dropped: none of its paths is inside the parent's scope.".to_string()]
    );
}

#[test]
fn proposals_a_directory_parent_scope_covers_files_under_it() {
    let tasks = vec![TaskSpec::new(
        "http",
        &[
            "src/http/server.rs",
            "src/http",
            "src/http/a/b.rs",
            "src/httpd.rs",
            "src",
        ],
    )];
    let (props, notes) = proposals_from(tasks, &scope(&["src/http"]), MAX_PATH);
    assert_eq!(
        props[0].scope,
        scope(&["src/http/server.rs", "src/http", "src/http/a/b.rs"])
    );
    assert_eq!(
        notes,
        vec![
            "Task 0: removed paths outside the parent's scope: \"src/httpd.rs\", \"src\"."
                .to_string()
        ]
    );
}

#[test]
fn proposals_treat_invalid_paths_as_outside() {
    let tasks = vec![TaskSpec::new(
        "sneaky",
        &[
            "src/../x",
            "../x",
            "/etc/passwd",
            ".git/config",
            "src/ok.rs",
        ],
    )];
    // Even a parent that covers everything under "src" and the root-level files.
    let (props, notes) = proposals_from(tasks, &scope(&["src", "x"]), MAX_PATH);
    assert_eq!(props[0].scope, scope(&["src/ok.rs"]));
    assert_eq!(
        notes,
        vec![
            "Task 0: removed paths outside the parent's scope: \"src/../x\", \"../x\", \
             \"/etc/passwd\", \".git/config\"."
                .to_string()
        ]
    );
}

#[test]
fn proposals_quote_a_huge_removed_path_cut_short() {
    let huge = "x".repeat(100_000);
    let task = TaskSpec::new("a", &["src/a.rs", &huge]);
    let (_, notes) = proposals_from(vec![task], &["src".to_string()], 4096);
    assert!(notes[0].len() < 300, "{} bytes", notes[0].len());
    assert!(notes[0].contains(&"x".repeat(MAX_PATH_SHOWN)));
}

#[test]
fn proposals_name_at_most_ten_removed_paths() {
    let outside: Vec<String> = (0..12).map(|i| format!("docs/{i}.md")).collect();
    let mut paths: Vec<&str> = outside.iter().map(String::as_str).collect();
    paths.push("src/a.rs");
    let (props, notes) =
        proposals_from(vec![TaskSpec::new("t", &paths)], &scope(&["src"]), MAX_PATH);
    assert_eq!(props[0].scope, scope(&["src/a.rs"]));
    assert_eq!(notes.len(), 1);
    assert!(notes[0].contains("\"docs/9.md\"."), "{}", notes[0]);
    assert!(!notes[0].contains("docs/10.md"), "{}", notes[0]);
}

#[test]
fn proposals_invalid_parent_paths_cover_nothing() {
    let tasks = vec![TaskSpec::new("t", &["etc/passwd"])];
    let (props, notes) = proposals_from(tasks, &scope(&["/etc", "../etc"]), MAX_PATH);
    assert!(props.is_empty());
    assert_eq!(notes.len(), 2);
}

#[test]
fn proposals_drop_a_task_that_depends_on_a_task_by_id() {
    let tasks = vec![
        TaskSpec::new("first", &["src/a.rs"]),
        TaskSpec {
            dependencies: vec![DependencyRef::Batch(0), DependencyRef::Task(id("t1.1"))],
            ..TaskSpec::new("by id", &["src/b.rs"])
        },
        spec_after("after first", &["src/c.rs"], &[0]),
    ];
    let (props, notes) = proposals_from(tasks, &scope(&["src"]), MAX_PATH);
    assert_eq!(descriptions(&props), vec!["first", "after first"]);
    assert_eq!(props[1].depends_on, vec![0]);
    assert_eq!(notes.len(), 1);
    assert!(
        notes[0].starts_with("Task 1 was dropped: it depends on a task by id."),
        "{}",
        notes[0]
    );
}

#[test]
fn proposals_drop_dependents_of_dropped_tasks_and_renumber() {
    // A, B (dropped: outside), C after A, D after C.
    let tasks = vec![
        TaskSpec::new("A", &["src/a.rs"]),
        TaskSpec::new("B", &["docs/b.md"]),
        spec_after("C", &["src/c.rs"], &[0]),
        spec_after("D", &["src/d.rs"], &[2]),
    ];
    let (props, notes) = proposals_from(tasks, &scope(&["src"]), MAX_PATH);
    assert_eq!(descriptions(&props), vec!["A", "C", "D"]);
    assert_eq!(props[0].depends_on, Vec::<usize>::new());
    assert_eq!(props[1].depends_on, vec![0]);
    assert_eq!(props[2].depends_on, vec![1]);
    assert_eq!(notes.len(), 2);
}

#[test]
fn proposals_drop_dependents_transitively() {
    // 0 after 2, 2 after 3, 3 after 1 (dropped): 0, 2 and 3 all go; only 4 stays.
    let tasks = vec![
        spec_after("zero", &["src/0.rs"], &[2]),
        TaskSpec::new("one", &["docs/1.md"]),
        spec_after("two", &["src/2.rs"], &[3]),
        spec_after("three", &["src/3.rs"], &[1]),
        TaskSpec::new("four", &["src/4.rs"]),
        spec_after("five", &["src/5.rs"], &[4]),
    ];
    let (props, notes) = proposals_from(tasks, &scope(&["src"]), MAX_PATH);
    assert_eq!(descriptions(&props), vec!["four", "five"]);
    assert_eq!(props[1].depends_on, vec![0]);
    for expected in [
        "Task 1 was dropped: none of its paths is inside the parent's scope.",
        "Task 3 was dropped: it depends on task 1, which was dropped.",
        "Task 2 was dropped: it depends on task 3, which was dropped.",
        "Task 0 was dropped: it depends on task 2, which was dropped.",
    ] {
        assert!(
            notes.iter().any(|n| n == expected),
            "{expected:?} in {notes:?}"
        );
    }
    assert_eq!(notes.len(), 5, "{notes:?}");
}

#[test]
fn proposals_keep_out_of_range_indexes_for_the_graph_to_refuse() {
    let tasks = vec![
        TaskSpec::new("dropped", &["docs/x.md"]),
        TaskSpec::new("A", &["src/a.rs"]),
        spec_after("B", &["src/b.rs"], &[1, 9]),
        // A self-dependency is renumbered like any other, for the graph to refuse.
        spec_after("C", &["src/c.rs"], &[3]),
    ];
    let (props, _) = proposals_from(tasks, &scope(&["src"]), MAX_PATH);
    assert_eq!(descriptions(&props), vec!["A", "B", "C"]);
    assert_eq!(props[1].depends_on, vec![0, 9]);
    assert_eq!(props[2].depends_on, vec![2]);
}

#[test]
fn proposals_keep_explicit_priority_and_carry_the_rest_over() {
    let budget = Budget::new(10_000, Usd::from_micros(250_000), 60_000);
    let explicit = TaskSpec {
        priority: Priority::new(2).unwrap(),
        budget: Some(budget),
        acceptance: "tests pass".into(),
        capabilities: ["rust".to_string()].into_iter().collect(),
        expected_outputs: vec![ArtifactKind::Commit, ArtifactKind::Report],
        ..TaskSpec::new("urgent", &["src/a.rs"])
    };
    let least = TaskSpec {
        priority: Priority::LEAST_URGENT,
        ..TaskSpec::new("later", &["src/b.rs"])
    };
    let default = TaskSpec::new("plain", &["src/c.rs"]);
    let (props, notes) = proposals_from(vec![explicit, least, default], &scope(&["src"]), MAX_PATH);
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(
        props[0],
        SubtaskProposal {
            description: "urgent".into(),
            scope: scope(&["src/a.rs"]),
            acceptance: "tests pass".into(),
            capabilities: ["rust".to_string()].into_iter().collect(),
            depends_on: vec![],
            budget_cap: Some(budget),
            expected_outputs: vec![ArtifactKind::Commit, ArtifactKind::Report],
            priority: Some(Priority::new(2).unwrap()),
        }
    );
    assert_eq!(props[1].priority, Some(Priority::LEAST_URGENT));
    assert_eq!(props[1].budget_cap, None);
    assert_eq!(props[2].priority, None);
    assert_eq!(props[2], SubtaskProposal::new("plain", &["src/c.rs"]));
}

// ---- initial_message ----

#[test]
fn initial_message_describes_the_parent_task() {
    let spec = TaskSpec {
        acceptance: "all tests pass".into(),
        priority: Priority::new(3).unwrap(),
        ..TaskSpec::new("Add HTTP caching", &["src/http", "src/cache.rs"])
    };
    let repo = "## Repository\nREPO-TEXT-MARKER\n\n";
    let msg = initial_message(&id("t1.2"), &spec, repo);
    assert!(
        msg.starts_with(
            "## Parent task\n\
         - ID: t1.2\n\
         - Description: Add HTTP caching\n\
         - Scope: src/http, src/cache.rs\n\
         - Acceptance: all tests pass\n\
         - Priority: 3\n\
         - Decomposition depth: 2\n\n\
         ## Repository\nREPO-TEXT-MARKER\n\n"
        ),
        "{msg}"
    );
    assert!(msg.contains("This is the first planning call for this task."));

    let msg = initial_message(&id("t1"), &TaskSpec::new("root", &["a"]), "");
    assert!(msg.contains("- Decomposition depth: 1\n"), "{msg}");
    assert!(msg.contains("- Priority: 5\n"), "{msg}");
}

// ---- follow_up_message ----

#[test]
fn follow_up_lists_ended_subtasks_with_their_handoffs() {
    let files: Vec<String> = (0..12).map(|i| format!("src/f{i}.rs")).collect();
    let mut h = handoff(HandoffStatus::Partial, "did half");
    h.files_changed = files.clone();
    h.concerns = scope(&["slow", "ugly"]);
    h.suggestions = scope(&["cache", "retry"]);
    let ended = vec![
        result("t1.1", TaskState::Completed, Some(h)),
        failed("t1.2", "broke"),
        result("t1.3", TaskState::Cancelled, None),
    ];
    let active = BTreeMap::new();
    let msg = follow_up_message(
        "REPO\n\n",
        &FollowUp {
            ended: &ended,
            active: &active,
            notes: &[],
        },
    );
    let listed = files[..10].join(", ");
    let expected = format!(
        "REPO\n\n\
         ## Subtask handoffs since your last plan (3)\n\
         ### t1.1 (completed, partial)\n\
         summary: did half\n\
         files changed: {listed}\n\
         concerns: slow; ugly\n\
         suggestions: cache; retry\n\n\
         ### t1.2 (failed, failed)\n\
         summary: broke\n\n\
         ### t1.3 (cancelled, blocked)\n\n\
         ## Active subtasks\nnone\n\n"
    );
    assert!(msg.starts_with(&expected), "{msg}");
    assert!(!msg.contains("src/f10.rs"));
    assert!(!msg.contains("## About your last answer"));
}

#[test]
fn follow_up_says_why_a_subtask_without_handoff_failed() {
    let ended = vec![
        failed_because(
            "t1.1",
            FailureReason::Blocked {
                summary: "need a key".into(),
            },
        ),
        failed_because("t1.2", FailureReason::UserDeclined),
    ];
    let active = BTreeMap::new();
    let msg = follow_up_message(
        "",
        &FollowUp {
            ended: &ended,
            active: &active,
            notes: &[],
        },
    );
    assert!(
        msg.starts_with(
            "## Subtask handoffs since your last plan (2)\n\
             ### t1.1 (failed, blocked)\nwhy: blocked: need a key\n\n\
             ### t1.2 (failed, failed)\nwhy: declined by the user\n\n"
        ),
        "{msg}"
    );
}

#[test]
fn follow_up_lists_active_subtasks_with_short_descriptions() {
    let long = "x".repeat(200);
    let active: BTreeMap<TaskId, String> = [
        (id("t1.10"), "later".to_string()),
        (id("t1.2"), long.clone()),
    ]
    .into_iter()
    .collect();
    let msg = follow_up_message(
        "",
        &FollowUp {
            ended: &[],
            active: &active,
            notes: &[],
        },
    );
    let expected = format!(
        "## Active subtasks (2)\n- t1.2: {}\n- t1.10: later\n\n",
        "x".repeat(120)
    );
    assert!(msg.starts_with(&expected), "{msg}");
    assert!(!msg.contains(&"x".repeat(121)));
    assert!(!msg.contains("## Subtask handoffs"));
    assert!(!msg.contains("none\n"));
    assert!(
        msg.ends_with(
            "Answer with an empty tasks array when the parent task needs nothing more.\n"
        )
    );
}

#[test]
fn follow_up_cuts_descriptions_by_characters_not_bytes() {
    let active: BTreeMap<TaskId, String> = [(id("t1.1"), "é".repeat(150))].into_iter().collect();
    let msg = follow_up_message(
        "",
        &FollowUp {
            ended: &[],
            active: &active,
            notes: &[],
        },
    );
    assert!(
        msg.contains(&format!("- t1.1: {}\n", "é".repeat(120))),
        "{msg}"
    );
}

#[test]
fn follow_up_includes_every_note() {
    let notes = vec![
        "Task 0 was dropped: reason one.".to_string(),
        "Your answer was not JSON.".to_string(),
    ];
    let active = BTreeMap::new();
    let msg = follow_up_message(
        "REPO\n",
        &FollowUp {
            ended: &[],
            active: &active,
            notes: &notes,
        },
    );
    assert!(
        msg.starts_with(
            "REPO\n\
         ## About your last answer\nTask 0 was dropped: reason one.\n\n\
         ## About your last answer\nYour answer was not JSON.\n\n\
         ## Active subtasks\nnone\n\n"
        ),
        "{msg}"
    );
}

#[test]
fn follow_up_cuts_long_summaries() {
    let long = format!("{}{}", "a".repeat(MAX_SUMMARY_CHARS), "TAIL");
    let ended = vec![done("t1.1", &long)];
    let active = BTreeMap::new();
    let msg = follow_up_message(
        "",
        &FollowUp {
            ended: &ended,
            active: &active,
            notes: &[],
        },
    );
    assert!(
        msg.contains(&format!("summary: {}\n", "a".repeat(MAX_SUMMARY_CHARS))),
        "{msg}"
    );
    assert!(!msg.contains("TAIL"));
    // Exactly at the limit, nothing is cut.
    let exact = "b".repeat(MAX_SUMMARY_CHARS);
    let ended = vec![done("t1.1", &exact)];
    let msg = follow_up_message(
        "",
        &FollowUp {
            ended: &ended,
            active: &active,
            notes: &[],
        },
    );
    assert!(msg.contains(&format!("summary: {exact}\n")));
}
