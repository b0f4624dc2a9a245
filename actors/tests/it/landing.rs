//! The graph's side of M6 (ADR-011), without actors: landing as a state, conflict fixes that
//! never cascade, sweep fixes, and finalization to Completed or Failed.

use flotilla_actors::config::Limits;
use flotilla_actors::graph::RunGraph;
use flotilla_actors::protocol::*;

use crate::harness::{spec, task};

fn merging() -> RunGraph {
    RunGraph::new(Limits::default()).merging()
}

fn work(task: &str) -> Handoff {
    let mut h = Handoff::complete("done");
    h.work = Some(Box::new(BranchWork {
        branch: format!("flotilla/run/{task}"),
        base: "base".into(),
        head: format!("head-{task}"),
        files: Vec::new(),
        files_omitted: 0,
        lines_added: 1,
        lines_removed: 0,
        committed_for_agent: false,
        links_outside: Vec::new(),
    }));
    h
}

/// Runs `id` to the end of its attempt with work on its branch.
fn finish(g: &mut RunGraph, id: &str) -> Vec<EventKind> {
    run_to_landing(g, id).1
}

/// Every event of running `id` to its report: (dispatch and start, the report's).
fn run_to_landing(g: &mut RunGraph, id: &str) -> (Vec<EventKind>, Vec<EventKind>) {
    let t = task(id);
    let attempt = g.task(&t).unwrap().attempt;
    let mut before = g.dispatched(&t, attempt, "general", Route::Worker).unwrap();
    before.extend(g.started(&t, attempt).unwrap());
    let report = g
        .complete(TaskCompleted {
            task: t,
            attempt,
            handoff: Some(work(id)),
            artifacts: Vec::new(),
            subplan: None,
        })
        .unwrap();
    (before, report)
}

fn kinds(events: &[EventKind]) -> Vec<&'static str> {
    events.iter().map(EventKind::name).collect()
}

fn report(
    sweep: u32,
    commit: &str,
    fixes: Vec<SweepFix>,
    finalization: Option<u32>,
) -> SweepReport {
    SweepReport {
        sweep,
        commit: commit.into(),
        green: fixes.is_empty(),
        class: (!fixes.is_empty()).then(|| "compile error".into()),
        failures: fixes.len(),
        fixes,
        duration_ms: 1,
        finalization,
        wording: None,
    }
}

fn fix(signature: &str, file: &str) -> SweepFix {
    SweepFix {
        title: format!("fix {file}"),
        description: format!("{file}:1:1: error"),
        scope: vec![file.into()],
        signature: signature.into(),
        class: "compile error".into(),
        worded: None,
    }
}

#[test]
fn dependents_wait_until_their_dependency_has_landed() {
    let mut g = merging();
    let mut b = spec("b", &["b"]);
    b.dependencies = vec![DependencyRef::Batch(0)];
    g.submit(vec![spec("a", &["a"]), b]).unwrap();
    let events = finish(&mut g, "t1");
    assert_eq!(kinds(&events), ["task_landing"]);
    assert_eq!(g.task(&task("t1")).unwrap().state, TaskState::Landing);
    assert_eq!(
        g.task(&task("t2")).unwrap().state,
        TaskState::Pending,
        "not before landing"
    );
    let request = g.land_request(&task("t1"), false).unwrap();
    assert_eq!(
        (request.branch.as_str(), request.head.as_str()),
        ("flotilla/run/t1", "head-t1")
    );

    let events = g.landed(&task("t1"), 1, "c1").unwrap();
    assert_eq!(kinds(&events), ["task_landed", "task_ready"]);
    assert_eq!(g.task(&task("t1")).unwrap().state, TaskState::Completed);
    assert_eq!(g.task(&task("t2")).unwrap().state, TaskState::Ready);
}

#[test]
fn work_without_commits_completes_at_once_and_a_late_landing_is_ignored() {
    let mut g = merging();
    g.submit(vec![spec("a", &["a"])]).unwrap();
    let t = task("t1");
    g.dispatched(&t, 1, "general", Route::Worker).unwrap();
    let events = g
        .complete(TaskCompleted {
            task: t.clone(),
            attempt: 1,
            handoff: Some(Handoff::complete("nothing to commit")),
            artifacts: Vec::new(),
            subplan: None,
        })
        .unwrap();
    assert!(kinds(&events).contains(&"task_completed"), "{events:?}");
    let late = g.landed(&t, 1, "c").unwrap();
    assert_eq!(kinds(&late), ["message_ignored"]);
}

#[test]
fn a_conflict_makes_one_fix_whose_landing_lands_the_task_too() {
    let mut g = merging();
    g.submit(vec![spec("a", &["src/a.rs"])]).unwrap();
    finish(&mut g, "t1");
    let events = g
        .landing_conflict(
            &task("t1"),
            1,
            vec!["src/shared.rs".into()],
            vec!["abc1234 t9: rename".into()],
        )
        .unwrap();
    assert_eq!(
        kinds(&events),
        ["merge_conflict", "fix_task_added", "task_ready"]
    );
    let EventKind::FixTaskAdded {
        task: f, spec, fix, ..
    } = &events[1]
    else {
        unreachable!()
    };
    assert_eq!(f.to_string(), "f1");
    assert_eq!(spec.scope, vec!["src/shared.rs".to_string()]);
    assert!(
        spec.description.contains("t1's task was:\na"),
        "{}",
        spec.description
    );
    assert!(spec.description.contains("abc1234 t9: rename"));
    assert!(
        matches!(fix, FixOf::Conflict { task, branch, .. } if *task == self::task("t1") && branch == "flotilla/run/t1")
    );
    let ready = g.ready_task(f).unwrap();
    assert!(
        matches!(ready.fix, Some(FixOf::Conflict { .. })),
        "the worker learns where to start"
    );

    finish(&mut g, "f1");
    let events = g.landed(&task("f1"), 1, "c2").unwrap();
    assert_eq!(kinds(&events), ["task_landed", "task_landed"]);
    assert!(
        matches!(&events[1], EventKind::TaskLanded { task: t, via: Some(v), .. } if *t == task("t1") && *v == task("f1"))
    );
    assert_eq!(g.task(&task("t1")).unwrap().state, TaskState::Completed);
}

#[test]
fn a_conflict_on_a_fix_fails_it_and_its_task_without_another_fix() {
    let mut g = merging();
    g.submit(vec![spec("a", &["a"])]).unwrap();
    finish(&mut g, "t1");
    g.landing_conflict(&task("t1"), 1, vec!["a".into()], Vec::new())
        .unwrap();
    finish(&mut g, "f1");
    let before = g.snapshot().tasks.len();
    let events = g
        .landing_conflict(&task("f1"), 1, vec!["a".into()], Vec::new())
        .unwrap();
    assert!(!kinds(&events).contains(&"fix_task_added"), "{events:?}");
    assert_eq!(g.snapshot().tasks.len(), before, "no task was added");
    let failed: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            EventKind::TaskFailed { task, reason, .. } => {
                Some((task.to_string(), reason.to_string()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert_eq!(failed[0].0, "f1");
    assert!(
        failed[0].1.contains("conflicts with main in a"),
        "{failed:?}"
    );
    assert_eq!(failed[1].0, "t1");
    assert!(
        failed[1].1.contains("its conflict fix f1 did not complete"),
        "{failed:?}"
    );
}

#[test]
fn conflict_fixes_are_capped_per_run() {
    let mut g = RunGraph::new(Limits {
        max_conflict_fixes: 1,
        ..Limits::default()
    })
    .merging();
    g.submit(vec![spec("a", &["a"]), spec("b", &["b"])])
        .unwrap();
    finish(&mut g, "t1");
    finish(&mut g, "t2");
    g.landing_conflict(&task("t1"), 1, vec!["x".into()], Vec::new())
        .unwrap();
    let events = g
        .landing_conflict(&task("t2"), 1, vec!["x".into()], Vec::new())
        .unwrap();
    assert!(!kinds(&events).contains(&"fix_task_added"));
    let node = g.task(&task("t2")).unwrap();
    assert_eq!(node.state, TaskState::Failed);
    assert!(
        node.failure
            .as_ref()
            .unwrap()
            .to_string()
            .contains("1 conflict fixes are used up")
    );
}

#[test]
fn a_gate_failure_retries_the_task_from_main_then_fails_it() {
    let mut g = merging();
    g.submit(vec![spec("a", &["a"])]).unwrap();
    finish(&mut g, "t1");
    let gate = |output: &str| LandingFailure::GateFailed {
        command: "sh test.sh".into(),
        output_tail: output.into(),
    };
    let events = g.landing_failed(&task("t1"), 1, gate("FAIL 1")).unwrap();
    assert_eq!(kinds(&events), ["task_retried"]);
    let node = g.task(&task("t1")).unwrap();
    assert_eq!((node.state, node.attempt), (TaskState::Ready, 2));
    finish(&mut g, "t1");
    let events = g.landing_failed(&task("t1"), 2, gate("FAIL 2")).unwrap();
    assert!(kinds(&events).contains(&"task_failed"), "{events:?}");
    assert!(
        g.task(&task("t1"))
            .unwrap()
            .failure
            .as_ref()
            .unwrap()
            .to_string()
            .contains("FAIL 2")
    );
}

/// `[worktrees] retry_in_place` (ADR-031): a gate failure's retry may continue the failed
/// branch; a stale base's never does (that branch holds work an adopted main dropped).
#[test]
fn a_stale_base_is_never_continued_in_place_a_gate_failure_is() {
    let mut g = RunGraph::new(Limits {
        max_attempts: 3,
        ..Limits::default()
    })
    .merging();
    g.submit(vec![spec("a", &["a"])]).unwrap();
    finish(&mut g, "t1");
    let gate = LandingFailure::GateFailed {
        command: "sh test.sh".into(),
        output_tail: "FAIL".into(),
    };
    g.landing_failed(&task("t1"), 1, gate).unwrap();
    let previous = g.task(&task("t1")).unwrap().previous.clone().unwrap();
    assert!(
        previous.continuable(),
        "a gate failure's branch may be continued"
    );
    finish(&mut g, "t1");
    let stale = LandingFailure::StaleBase {
        detail: "holds dropped work".into(),
    };
    g.landing_failed(&task("t1"), 2, stale).unwrap();
    let previous = g.task(&task("t1")).unwrap().previous.clone().unwrap();
    assert_eq!(previous.attempt(), 2);
    assert!(!previous.continuable(), "the retry starts again from main");
}

#[test]
fn finalization_completes_only_on_a_green_sweep_after_the_last_landing() {
    let mut g = merging();
    g.submit(vec![spec("a", &["a"])]).unwrap();
    g.planning_finished().unwrap();
    finish(&mut g, "t1");
    let events = g.landed(&task("t1"), 1, "c1").unwrap();
    assert_eq!(kinds(&events), ["task_landed", "finalization_started"]);
    assert_eq!(g.outcome(), None, "not before main is known green");
    // Red: one fix per problem, and the same problem again makes no second fix.
    let events = g
        .sweep_finished(report(
            1,
            "c1",
            vec![fix("sig-a", "src/a.rs"), fix("sig-a", "src/a.rs")],
            Some(1),
        ))
        .unwrap();
    assert_eq!(
        kinds(&events),
        ["sweep_finished", "fix_task_added", "task_ready"]
    );
    let events = g
        .sweep_finished(report(2, "c1", vec![fix("sig-a", "src/a.rs")], None))
        .unwrap();
    assert_eq!(kinds(&events), ["sweep_finished"], "an open fix covers it");
    finish(&mut g, "f1");
    let events = g.landed(&task("f1"), 1, "c2").unwrap();
    assert_eq!(kinds(&events), ["task_landed", "finalization_started"]);
    // A green sweep of a main that moved on since says nothing.
    g.merge_noted(EventKind::MainMoved {
        from: "c1".into(),
        to: "c2".into(),
        tasks: vec![task("f1")],
        checkout: CheckoutSync::NotCheckedOut,
    })
    .unwrap();
    let events = g
        .sweep_finished(report(3, "c2", Vec::new(), Some(2)))
        .unwrap();
    assert_eq!(kinds(&events), ["sweep_finished", "run_finished"]);
    assert_eq!(g.outcome(), Some(RunOutcome::Completed));
}

#[test]
fn finalization_fails_when_main_stays_red() {
    let mut g = RunGraph::new(Limits {
        max_finalization_attempts: 2,
        ..Limits::default()
    })
    .merging();
    g.submit(vec![spec("a", &["a"])]).unwrap();
    g.planning_finished().unwrap();
    finish(&mut g, "t1");
    g.landed(&task("t1"), 1, "c1").unwrap();
    for (round, sig, fix_id) in [(1, "s1", "f1"), (2, "s2", "f2")] {
        g.sweep_finished(report(round, "c1", vec![fix(sig, "src/a.rs")], Some(round)))
            .unwrap();
        // The fix gives up without landing anything.
        let f = task(fix_id);
        g.dispatched(&f, 1, "general", Route::Worker).unwrap();
        g.failed(&f, 1, AttemptFailure::Cancelled).unwrap();
    }
    assert_eq!(g.outcome(), Some(RunOutcome::Failed));
    let snapshot = g.snapshot();
    assert!(snapshot.tasks.iter().any(|t| t.id == task("f2")));
    let why = g.finish_reason().unwrap();
    assert!(
        why.contains("main is still red after 2 finalization rounds"),
        "{why}"
    );
    assert!(why.contains("compile error"), "{why}");
}

#[test]
fn a_replayed_merging_graph_is_the_same_graph() {
    let mut g = merging();
    let mut all = Vec::new();
    all.extend(
        g.submit(vec![spec("a", &["a"]), spec("b", &["b"])])
            .unwrap(),
    );
    for id in ["t1", "t2"] {
        let (before, report) = run_to_landing(&mut g, id);
        all.extend(before);
        all.extend(report);
    }
    all.extend(
        g.landing_conflict(&task("t2"), 1, vec!["b".into()], Vec::new())
            .unwrap(),
    );
    all.extend(g.landed(&task("t1"), 1, "c1").unwrap());
    let replayed = RunGraph::new(Limits::default())
        .merging()
        .replayed(all.iter())
        .unwrap();
    assert_eq!(replayed.snapshot(), g.snapshot());
    // t2 is `Landing` but waits for its conflict fix f1: a restart must not put its branch
    // back in the queue (M8b: a second conflict, a second fix, a deleted branch under it).
    assert!(replayed.waits_for_its_fix(&task("t2")));
    assert_eq!(replayed.landing_tasks(), Vec::<TaskId>::new());
    assert_eq!(replayed.tasks_in(TaskState::Landing), vec![task("t2")]);
}

#[test]
fn only_a_journaled_intent_says_that_work_is_on_main_after_a_restart() {
    let mut g = merging();
    let mut journal: Vec<EventKind> = g
        .submit(vec![spec("a", &["a"]), spec("b", &["b"])])
        .unwrap();
    for id in ["t1", "t2"] {
        let (before, report) = run_to_landing(&mut g, id);
        journal.extend(before);
        journal.extend(report);
    }
    // The queue is about to move main with t1's work in c1 (t2 is not in this batch).
    journal.extend(
        g.landing_intended(
            "m0".into(),
            "c1".into(),
            vec![IntendedLanding {
                task: task("t1"),
                attempt: 1,
                commit: "c1".into(),
            }],
        )
        .unwrap(),
    );
    // A crash: the restart rebuilds the graph from the journal.
    let mut g = RunGraph::new(Limits::default())
        .merging()
        .replayed(&journal)
        .unwrap();
    assert_eq!(
        g.land_request(&task("t1"), true).unwrap().intended,
        vec!["c1".to_string()]
    );
    assert!(
        g.land_request(&task("t2"), true)
            .unwrap()
            .intended
            .is_empty()
    );
    // A commit carrying t2's trailer (an agent's forgery) is not evidence of anything.
    let events = g.found_on_main(&task("t2"), 1, "forged").unwrap();
    assert_eq!(kinds(&events), ["message_ignored"]);
    assert_eq!(g.task(&task("t2")).unwrap().state, TaskState::Landing);
    let events = g.found_on_main(&task("t2"), 1, "c1").unwrap();
    assert_eq!(kinds(&events), ["message_ignored"], "c1 holds t1's work");
    // The journaled commit is.
    let events = g.found_on_main(&task("t1"), 1, "c1").unwrap();
    // main's move to c1 was never journaled: it is now, before the landing.
    assert_eq!(kinds(&events), ["main_moved", "task_landed"]);
    assert_eq!(g.main_tip().as_deref(), Some("c1"));
    assert_eq!(g.task(&task("t1")).unwrap().state, TaskState::Completed);
}

/// t1 decomposed into two subtasks that both completed: t1 is `Synthesizing`.
fn synthesizing() -> RunGraph {
    let mut g = RunGraph::new(Limits::default());
    g.submit(vec![spec("wide", &["a", "b"])]).unwrap();
    let t1 = task("t1");
    g.dispatched(&t1, 1, "general", Route::Worker).unwrap();
    g.started(&t1, 1).unwrap();
    let plan = |subtasks| ProposedSubplan {
        parent: task("t1"),
        reason: DecompositionReason::TooLarge,
        subtasks,
        stop_when: StopCondition::AllSubtasksComplete,
    };
    g.complete(TaskCompleted {
        task: t1.clone(),
        attempt: 1,
        handoff: None,
        artifacts: Vec::new(),
        subplan: Some(plan(vec![
            SubtaskProposal::new("part a", &["a"]),
            SubtaskProposal::new("part b", &["b"]),
        ])),
    })
    .unwrap();
    for id in ["t1.1", "t1.2"] {
        let t = task(id);
        g.dispatched(&t, 1, "general", Route::Worker).unwrap();
        g.started(&t, 1).unwrap();
        g.complete(TaskCompleted {
            task: t,
            attempt: 1,
            handoff: Some(Handoff::complete("done")),
            artifacts: Vec::new(),
            subplan: None,
        })
        .unwrap();
    }
    assert_eq!(g.task(&t1).unwrap().state, TaskState::Synthesizing);
    g
}

fn another_subplan() -> ProposedSubplan {
    ProposedSubplan {
        parent: task("t1"),
        reason: DecompositionReason::TooLarge,
        subtasks: vec![SubtaskProposal::new("more", &["a"])],
        stop_when: StopCondition::AllSubtasksComplete,
    }
}

#[test]
fn a_subplan_handed_back_by_a_synthesis_is_refused_and_the_task_ends() {
    // Only a subplan: the synthesis failed, with the reason.
    let mut g = synthesizing();
    let events = g
        .complete(TaskCompleted {
            task: task("t1"),
            attempt: 1,
            handoff: None,
            artifacts: Vec::new(),
            subplan: Some(another_subplan()),
        })
        .unwrap();
    assert_eq!(g.task(&task("t1")).unwrap().state, TaskState::Failed);
    let reason = events
        .iter()
        .find_map(|e| match e {
            EventKind::TaskFailed { reason, .. } => Some(reason.to_string()),
            _ => None,
        })
        .unwrap();
    assert!(
        reason.contains("a synthesis handed back a subplan"),
        "{reason}"
    );
    assert!(!kinds(&events).contains(&"task_added"), "{events:?}");

    // A subplan beside a result: the result is the synthesis, the subplan is refused.
    let mut g = synthesizing();
    let events = g
        .complete(TaskCompleted {
            task: task("t1"),
            attempt: 1,
            handoff: Some(Handoff::complete("put together")),
            artifacts: Vec::new(),
            subplan: Some(another_subplan()),
        })
        .unwrap();
    assert_eq!(kinds(&events)[..2], ["message_ignored", "task_completed"]);
    assert_eq!(g.task(&task("t1")).unwrap().state, TaskState::Completed);
}

#[test]
fn a_conflict_fix_with_nothing_to_resolve_sends_its_task_back_to_the_queue() {
    let mut g = merging();
    g.submit(vec![spec("a", &["src/a.rs"])]).unwrap();
    finish(&mut g, "t1");
    g.landing_conflict(&task("t1"), 1, vec!["src/a.rs".into()], Vec::new())
        .unwrap();
    assert!(g.waits_for_its_fix(&task("t1")));
    assert!(
        g.landing_tasks().is_empty(),
        "t1 waits for f1, not in the queue"
    );
    // f1's diff is empty: its completion has nothing to land.
    let f1 = task("f1");
    g.dispatched(&f1, 1, "general", Route::Worker).unwrap();
    g.started(&f1, 1).unwrap();
    let mut empty = Handoff::complete("nothing to resolve");
    empty.work = Some(Box::new(BranchWork {
        branch: "flotilla/run/f1".into(),
        base: "m".into(),
        head: "m".into(),
        files: Vec::new(),
        files_omitted: 0,
        lines_added: 0,
        lines_removed: 0,
        committed_for_agent: false,
        links_outside: Vec::new(),
    }));
    let events = g
        .complete(TaskCompleted {
            task: f1,
            attempt: 1,
            handoff: Some(empty),
            artifacts: Vec::new(),
            subplan: None,
        })
        .unwrap();
    assert_eq!(kinds(&events), ["task_completed", "landing_requeued"]);
    assert_eq!(g.task(&task("t1")).unwrap().state, TaskState::Landing);
    assert_eq!(g.landing_tasks(), vec![task("t1")]);
    let request = g.land_request(&task("t1"), false).unwrap();
    assert_eq!(request.branch, "flotilla/run/t1");
    // It lands by itself.
    let events = g.landed(&task("t1"), 1, "c1").unwrap();
    assert_eq!(kinds(&events)[0], "task_landed");
    assert_eq!(g.task(&task("t1")).unwrap().state, TaskState::Completed);
}

/// Issue 20: fix tasks from a sweep's output got scopes no task may have (`.GIT/config`,
/// 853 paths, none at all). They are checked as any task's scope: paths no task may hold
/// are left out, and a fix with no path left or more than `max_scope_paths` is not made,
/// the reason said in a `message_ignored` event; the run then ends failed, saying so.
#[test]
fn sweep_fixes_get_only_scopes_a_task_may_have() {
    let mut g = merging();
    g.submit(vec![spec("a", &["a"])]).unwrap();
    g.planning_finished().unwrap();
    finish(&mut g, "t1");
    g.landed(&task("t1"), 1, "c1").unwrap();
    let mut mixed = fix("sig-mixed", "src/ok.rs");
    mixed.scope.extend([
        ".GIT/config".into(),
        "src/.Git/hooks/pre-commit".into(),
        "/etc/passwd".into(),
        "../outside.rs".into(),
    ]);
    let mut git_only = fix("sig-git", ".GIT/config");
    git_only.scope.push(".git./HEAD".into());
    let mut empty = fix("sig-empty", "x");
    empty.scope.clear();
    let mut huge = fix("sig-huge", "x");
    huge.scope = (0..853).map(|i| format!("src/f{i}.rs")).collect();
    let events = g
        .sweep_finished(report(1, "c1", vec![git_only, empty, huge, mixed], None))
        .unwrap();
    assert_eq!(
        kinds(&events),
        [
            "sweep_finished",
            "message_ignored",
            "message_ignored",
            "message_ignored",
            "fix_task_added",
            "task_ready"
        ]
    );
    let whys: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            EventKind::MessageIgnored { why, .. } => Some(why.as_str()),
            _ => None,
        })
        .collect();
    assert!(whys[0].contains("inside .git"), "{}", whys[0]);
    assert!(whys[1].contains("empty scope"), "{}", whys[1]);
    assert!(
        whys[2].contains("853 files") && whys[2].contains("64"),
        "{}",
        whys[2]
    );
    let added = events.iter().find_map(|e| match e {
        EventKind::FixTaskAdded { spec, .. } => Some(spec.scope.clone()),
        _ => None,
    });
    assert_eq!(added, Some(vec!["src/ok.rs".to_string()]));

    // With only unscopable fixes at finalization, the run fails and says why.
    let mut g = merging();
    g.submit(vec![spec("a", &["a"])]).unwrap();
    g.planning_finished().unwrap();
    finish(&mut g, "t1");
    g.landed(&task("t1"), 1, "c1").unwrap();
    let mut empty = fix("sig-empty", "x");
    empty.scope.clear();
    let events = g
        .sweep_finished(report(1, "c1", vec![empty], Some(1)))
        .unwrap();
    assert_eq!(
        kinds(&events),
        ["sweep_finished", "message_ignored", "run_finished"]
    );
    assert_eq!(g.outcome(), Some(RunOutcome::Failed));
    assert!(g.finish_reason().unwrap().contains("none could be scoped"));
}

#[test]
fn a_conflict_no_task_scope_may_hold_fails_its_task_with_the_reason_and_makes_no_fix() {
    // More files than a scope may hold, only paths no task may have, or none at all: each
    // ends the task (the run goes on to its end), and no fix task is made.
    let too_many: Vec<String> = (0..853).map(|n| format!("src/m{n}.rs")).collect();
    let cases: [(Vec<String>, &str); 3] = [
        (
            too_many,
            "853 files conflict, more than a task's scope may hold (64",
        ),
        (
            vec![".GIT/config".into(), "/etc/passwd".into(), "../x".into()],
            "none of the 3 conflicting files may be in a task's scope",
        ),
        (Vec::new(), "git named no conflicting file"),
    ];
    for (files, why) in cases {
        let mut g = merging();
        g.submit(vec![spec("a", &["src/a.rs"])]).unwrap();
        finish(&mut g, "t1");
        let events = g
            .landing_conflict(&task("t1"), 1, files.clone(), Vec::new())
            .unwrap();
        assert!(!kinds(&events).contains(&"fix_task_added"), "{events:?}");
        let reason = events
            .iter()
            .find_map(|e| match e {
                EventKind::TaskFailed { task, reason, .. } if *task == self::task("t1") => {
                    Some(reason.to_string())
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("t1 fails: {events:?}"));
        assert!(reason.contains(why), "{reason}");
        assert!(
            reason.len() < 1_000,
            "at most 10 files are listed: {reason}"
        );
        assert_eq!(g.task(&task("t1")).unwrap().state, TaskState::Failed);
        assert_eq!(g.snapshot().tasks.len(), 1, "no fix task");
    }
    // Within the rules, the fix's scope is the normalized paths a scope may hold.
    let mut g = merging();
    g.submit(vec![spec("a", &["src/a.rs"])]).unwrap();
    finish(&mut g, "t1");
    let events = g
        .landing_conflict(
            &task("t1"),
            1,
            vec!["./src/b.rs".into(), ".git/config".into(), "src/b.rs".into()],
            Vec::new(),
        )
        .unwrap();
    let scope = events
        .iter()
        .find_map(|e| match e {
            EventKind::FixTaskAdded { spec, .. } => Some(spec.scope.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(scope, vec!["src/b.rs".to_string()]);
}

/// ADR-032: a fix the `reconciler` role's model worded carries its words ahead of what the
/// sweep found (which stays), its acceptance, and the call's cost in the run's spending;
/// the journal replays to the same graph, so a resumed run never asks the model again.
#[test]
fn a_worded_sweep_fix_leads_with_the_models_words_and_keeps_the_facts() {
    let mut g = merging();
    let mut worded = fix("sig-a", "src/a.rs");
    worded.worded = Some(FixWording {
        description: "Rename Config to Settings in src/a.rs.".into(),
        acceptance: "`cargo build` exits 0.".into(),
    });
    let mut red = report(1, "c1", vec![worded, fix("sig-b", "src/b.rs")], None);
    red.wording = Some(WordingCall {
        usage: Usage {
            tokens_in: 300,
            tokens_out: 40,
            cost_usd: Usd::ZERO,
        },
        fallback: None,
    });
    let before = g.snapshot().run_spent.tokens;
    let events = g.sweep_finished(red).unwrap();
    let specs: Vec<&TaskSpec> = events
        .iter()
        .filter_map(|e| match e {
            EventKind::FixTaskAdded { spec, .. } => Some(spec),
            _ => None,
        })
        .collect();
    assert_eq!(specs.len(), 2, "{events:?}");
    assert!(
        specs[0].description.starts_with(
            "main is red: fix src/a.rs\n\nRename Config to Settings in src/a.rs.\n\nThe \
             Reconciler's sweep of main found:\nsrc/a.rs:1:1: error"
        ),
        "{}",
        specs[0].description
    );
    assert_eq!(specs[0].acceptance, "`cargo build` exits 0.");
    // Not worded: flotilla's own words.
    assert!(
        specs[1]
            .description
            .starts_with("main is red: fix src/b.rs\n\nThe Reconciler's sweep of main found:"),
        "{}",
        specs[1].description
    );
    assert_eq!(
        specs[1].acceptance,
        "The sweep's build, type check and tests pass for these files."
    );
    assert_eq!(g.snapshot().run_spent.tokens, before + 340);
    let replayed = RunGraph::new(Limits::default())
        .merging()
        .replayed(events.iter())
        .unwrap();
    assert_eq!(replayed.snapshot(), g.snapshot());
}
