//! ADR-009 subplan validation, one test per rule. Each rejection test proves three things:
//! the typed rejection reached the proposer's probe, the graph did not change, and Dispatch
//! heard nothing (no subtask leaked into the frontier).

use flotilla_actors::config::Limits;
use flotilla_actors::protocol::*;

use crate::harness::*;

/// A harness with root task t1 (scope `scope`) running on the probe agent.
async fn running_parent(limits: Limits, scope: &[&str], budget: Option<Budget>) -> GraphHarness {
    virtual_time();
    let mut h = GraphHarness::start(limits);
    let mut parent = spec("the parent task", scope);
    parent.budget = budget;
    h.submit(vec![parent]).await;
    h.start_task("t1", 1);
    h
}

/// Proposes `subtasks` for t1 and returns the rejection, after checking that the graph and
/// Dispatch saw no change.
async fn expect_rejection(h: &mut GraphHarness, subtasks: Vec<SubtaskProposal>) -> RejectionReason {
    let before = h.snapshot().await;
    h.dispatch.drain();
    h.propose("t1", 1, subtasks, StopCondition::AllSubtasksComplete);
    let rejection = match h.expect_decision().await {
        Err(r) => r,
        Ok(a) => panic!("expected a rejection, the subplan was accepted: {a:?}"),
    };
    assert_eq!(rejection.parent, task("t1"));
    let journaled = h.events.expect_kind("decomposition_rejected").await;
    assert!(
        matches!(journaled, EventKind::DecompositionRejected { reason, .. } if reason == rejection.reason)
    );
    assert_eq!(
        h.snapshot().await,
        before,
        "a rejected subplan must leave the graph unchanged"
    );
    h.dispatch.expect_none().await;
    rejection.reason
}

fn sub(description: &str, scope: &[&str]) -> SubtaskProposal {
    SubtaskProposal::new(description, scope)
}

#[actix::test]
async fn a_valid_subplan_is_inserted_atomically_with_its_edges() {
    let mut h = running_parent(Limits::default(), &["src"], None).await;
    // Overlapping scopes are fine when one subtask depends on the other; a dependency on a
    // later sibling is fine too.
    h.propose(
        "t1",
        1,
        vec![
            sub("api", &["src/api.rs"]).after(&[1]),
            sub("core", &["src/api.rs", "src/core.rs"]),
        ],
        StopCondition::AllSubtasksComplete,
    );
    let accepted = h.expect_decision().await.unwrap();
    assert_eq!(accepted.subtasks, vec![task("t1.1"), task("t1.2")]);
    assert_eq!(h.expect_ready().await, vec![task("t1.2")]);
    let snap = h.snapshot().await;
    let api = snap.tasks.iter().find(|t| t.id == task("t1.1")).unwrap();
    assert_eq!(api.depends_on, vec![task("t1.2")]);
    assert_eq!(api.parent, Some(task("t1")));
    assert_eq!(h.state_of("t1").await, TaskState::WaitingForSubtasks);
}

#[actix::test]
async fn rule_a_too_many_subtasks() {
    let mut h = running_parent(
        Limits {
            max_subtasks: 3,
            ..Limits::default()
        },
        &["src"],
        None,
    )
    .await;
    let subs = (0..4)
        .map(|i| sub(&format!("part {i}"), &[&format!("src/{i}.rs")]))
        .collect();
    assert_eq!(
        expect_rejection(&mut h, subs).await,
        RejectionReason::TooManySubtasks {
            proposed: 4,
            max: 3
        }
    );
}

#[actix::test]
async fn rule_b_depth_beyond_the_maximum() {
    let mut h = running_parent(
        Limits {
            max_depth: 1,
            ..Limits::default()
        },
        &["src"],
        None,
    )
    .await;
    assert_eq!(
        expect_rejection(&mut h, vec![sub("part", &["src/a.rs"])]).await,
        RejectionReason::DepthExceeded { depth: 2, max: 1 }
    );
}

#[actix::test]
async fn rule_c_node_limit_of_the_run() {
    let mut h = running_parent(
        Limits {
            max_nodes: 3,
            ..Limits::default()
        },
        &["src"],
        None,
    )
    .await;
    let subs = vec![
        sub("a", &["src/a"]),
        sub("b", &["src/b"]),
        sub("c", &["src/c"]),
    ];
    assert_eq!(
        expect_rejection(&mut h, subs).await,
        RejectionReason::NodeLimitExceeded {
            would_hold: 4,
            max: 3
        }
    );
}

#[actix::test]
async fn rule_d_budget_caps_exceed_what_the_parent_has_left() {
    let parent_budget = Budget::new(1_000, Usd::from_dollars(1.0).unwrap(), 60_000);
    let mut h = running_parent(Limits::default(), &["src"], Some(parent_budget)).await;
    let mut a = sub("a", &["src/a"]);
    a.budget_cap = Some(Budget::new(600, Usd::from_dollars(0.1).unwrap(), 1_000));
    let mut b = sub("b", &["src/b"]);
    b.budget_cap = Some(Budget::new(600, Usd::from_dollars(0.1).unwrap(), 1_000));
    let reason = expect_rejection(&mut h, vec![a, b]).await;
    assert!(
        matches!(reason, RejectionReason::BudgetExceeded { needed, remaining } if needed.tokens == 1_200 && remaining.tokens == 1_000),
        "{reason:?}"
    );
}

#[actix::test]
async fn rule_d_uncapped_subtasks_share_what_is_left() {
    let parent_budget = Budget::new(1_000, Usd::from_dollars(1.0).unwrap(), 60_000);
    let mut h = running_parent(Limits::default(), &["src"], Some(parent_budget)).await;
    let mut a = sub("a", &["src/a"]);
    a.budget_cap = Some(Budget::new(400, Usd::from_dollars(0.5).unwrap(), 1_000));
    h.propose(
        "t1",
        1,
        vec![a, sub("b", &["src/b"]), sub("c", &["src/c"])],
        StopCondition::AllSubtasksComplete,
    );
    h.expect_decision().await.unwrap();
    let snap = h.snapshot().await;
    let budgets: Vec<_> = snap.tasks[1..]
        .iter()
        .map(|t| (t.budget.tokens, t.budget.cost_usd))
        .collect();
    let (quarter, half) = (
        Usd::from_dollars(0.25).unwrap(),
        Usd::from_dollars(0.5).unwrap(),
    );
    assert_eq!(budgets, [(400, half), (300, quarter), (300, quarter)]);
}

#[actix::test]
async fn rule_e_dependency_index_out_of_range() {
    let mut h = running_parent(Limits::default(), &["src"], None).await;
    let reason = expect_rejection(&mut h, vec![sub("a", &["src/a"]).after(&[5])]).await;
    assert_eq!(
        reason,
        RejectionReason::DependencyOutOfRange {
            subtask: 0,
            dependency: 5
        }
    );
}

#[actix::test]
async fn rule_e_self_dependency() {
    let mut h = running_parent(Limits::default(), &["src"], None).await;
    let reason = expect_rejection(
        &mut h,
        vec![sub("a", &["src/a"]), sub("b", &["src/b"]).after(&[1])],
    )
    .await;
    assert_eq!(reason, RejectionReason::SelfDependency { subtask: 1 });
}

#[actix::test]
async fn rule_e_dependency_cycle() {
    let mut h = running_parent(Limits::default(), &["src"], None).await;
    let subs = vec![
        sub("a", &["src/a"]).after(&[2]),
        sub("b", &["src/b"]),
        sub("c", &["src/c"]).after(&[0]),
    ];
    assert_eq!(
        expect_rejection(&mut h, subs).await,
        RejectionReason::DependencyCycle { cycle: vec![0, 2] }
    );
}

#[actix::test]
async fn rule_f_scope_outside_the_parent() {
    let mut h = running_parent(Limits::default(), &["src/net"], None).await;
    let reason = expect_rejection(
        &mut h,
        vec![sub("a", &["src/net/tcp.rs"]), sub("b", &["src/network.rs"])],
    )
    .await;
    assert_eq!(
        reason,
        RejectionReason::ScopeOutsideParent {
            subtask: 1,
            path: "src/network.rs".into()
        }
    );
}

#[actix::test]
async fn rule_f_overlapping_scopes_without_a_dependency() {
    let mut h = running_parent(Limits::default(), &["src"], None).await;
    let reason = expect_rejection(
        &mut h,
        vec![sub("a", &["src/net"]), sub("b", &["src/net/tcp.rs"])],
    )
    .await;
    assert_eq!(
        reason,
        RejectionReason::ScopeOverlap {
            first: 0,
            second: 1,
            path: "src/net/tcp.rs".into()
        }
    );
}

#[actix::test]
async fn rule_g_paths_that_escape_or_touch_git() {
    for (path, problem) in [
        ("src/../../etc/passwd", PathProblem::ParentTraversal),
        ("/etc/passwd", PathProblem::Absolute),
        (".git/hooks/pre-commit", PathProblem::GitDirectory),
    ] {
        let mut h = running_parent(Limits::default(), &["src", ".github"], None).await;
        let reason =
            expect_rejection(&mut h, vec![sub("a", &["src/a"]), sub("evil", &[path])]).await;
        assert_eq!(
            reason,
            RejectionReason::InvalidPath {
                subtask: 1,
                path: path.into(),
                problem
            }
        );
    }
}

#[actix::test]
async fn rule_g_empty_scope() {
    let mut h = running_parent(Limits::default(), &["src"], None).await;
    assert_eq!(
        expect_rejection(&mut h, vec![sub("a", &[])]).await,
        RejectionReason::EmptyScope { subtask: 0 }
    );
}

#[actix::test]
async fn rule_h_duplicate_of_a_task_in_the_frontier() {
    virtual_time();
    let mut h = GraphHarness::start(Limits::default());
    h.submit(vec![
        spec("the parent task", &["src"]),
        spec("Write  the Lexer", &["src/lex.rs"]),
    ])
    .await;
    h.start_task("t1", 1);
    let reason = expect_rejection(
        &mut h,
        vec![
            sub("parser", &["src/parse.rs"]),
            sub("write the lexer", &["./src/lex.rs"]),
        ],
    )
    .await;
    assert_eq!(
        reason,
        RejectionReason::DuplicateTask {
            subtask: 1,
            existing: "t2".into()
        }
    );
}

#[actix::test]
async fn rule_i_decomposition_cap_per_attempt() {
    let mut h = running_parent(
        Limits {
            max_proposals_per_attempt: 1,
            ..Limits::default()
        },
        &["src"],
        None,
    )
    .await;
    // The first proposal is refused for another reason; it still counts against the cap.
    assert_eq!(
        expect_rejection(&mut h, vec![]).await,
        RejectionReason::NoSubtasks
    );
    // A proposal past the cap is refused, and the attempt is over: the agent is stopped
    // instead of being invited to revise again (issue 6, point 5).
    h.propose(
        "t1",
        1,
        vec![sub("a", &["src/a"])],
        StopCondition::AllSubtasksComplete,
    );
    let rejected = h.events.expect_kind("decomposition_rejected").await;
    assert!(
        matches!(
            &rejected,
            EventKind::DecompositionRejected {
                reason: RejectionReason::AttemptDecompositionCap { max: 1 },
                ..
            }
        ),
        "{rejected:?}"
    );
    let kinds = h.events.next_kinds(2).await;
    assert_eq!(kinds, ["proposals_stopped", "task_failed"]);
    assert!(matches!(
        h.agent_inbox.expect().await,
        ToAgent::Cancel { task, .. } if task == self::task("t1")
    ));
    assert_eq!(h.state_of("t1").await, TaskState::Failed);
}

#[actix::test]
async fn rule_i_decomposition_cap_per_run() {
    virtual_time();
    let mut h = GraphHarness::start(Limits {
        max_decompositions_per_run: 1,
        ..Limits::default()
    });
    h.submit(vec![
        spec("other", &["lib"]),
        spec("the parent task", &["src"]),
    ])
    .await;
    h.start_task("t1", 1);
    h.propose(
        "t1",
        1,
        vec![sub("lib a", &["lib/a"])],
        StopCondition::AllSubtasksComplete,
    );
    h.expect_decision().await.unwrap();
    h.expect_ready().await;
    // t2 is now the proposer; reuse the t1 helper by swapping roles explicitly.
    h.start_task("t2", 1);
    let before = h.snapshot().await;
    h.propose(
        "t2",
        1,
        vec![sub("a", &["src/a"])],
        StopCondition::AllSubtasksComplete,
    );
    let rejection = h.expect_decision().await.unwrap_err();
    assert_eq!(
        rejection,
        TaskDecompositionRejected {
            parent: task("t2"),
            reason: RejectionReason::RunDecompositionCap { max: 1 }
        }
    );
    assert_eq!(h.snapshot().await, before);
    h.dispatch.expect_none().await;
}

#[actix::test]
async fn a_proposal_naming_another_parent_is_rejected() {
    let mut h = running_parent(Limits::default(), &["src"], None).await;
    let before = h.snapshot().await;
    let plan = ProposedSubplan {
        parent: task("t7"),
        reason: DecompositionReason::TooLarge,
        subtasks: vec![sub("a", &["src/a"])],
        stop_when: StopCondition::AllSubtasksComplete,
    };
    h.report("t1", 1, None, Some(plan));
    let rejection = h.expect_decision().await.unwrap_err();
    assert_eq!(
        rejection.reason,
        RejectionReason::ParentMismatch {
            named: task("t7"),
            actual: task("t1")
        }
    );
    assert_eq!(h.snapshot().await, before);
}

#[actix::test]
async fn oversize_descriptions_are_rejected() {
    let mut h = running_parent(
        Limits {
            max_description_bytes: 64,
            ..Limits::default()
        },
        &["src"],
        None,
    )
    .await;
    let reason = expect_rejection(&mut h, vec![sub(&"x".repeat(65), &["src/a"])]).await;
    assert_eq!(
        reason,
        RejectionReason::PayloadTooLarge {
            subtask: 0,
            field: "description".into(),
            size: 65,
            max: 64
        }
    );
}

#[test]
fn malformed_subplan_json_is_a_typed_error() {
    let err = serde_json::from_str::<ProposedSubplan>(
        r#"{"parent":"main","reason":"too_large","subtasks":[]}"#,
    )
    .unwrap_err();
    assert!(err.to_string().contains("malformed task id"), "{err}");
    let err = serde_json::from_str::<ProposedSubplan>(
        r#"{"parent":"t1","reason":"because","subtasks":[]}"#,
    )
    .unwrap_err();
    assert!(err.to_string().contains("unknown variant"), "{err}");
}

// ---- Loops end: an agent that keeps proposing invalid subplans is stopped. ----

/// An agent that answers every rejection with the same invalid subplan, as a confused model
/// would. It gives up by itself after 50 rejections so that a regression fails the test
/// instead of spinning forever; it reports how many rejections and cancels it received.
struct Reproposer {
    graph: actix::Recipient<ToTaskGraph>,
    rejections: u32,
    seen: tokio::sync::mpsc::UnboundedSender<ToAgent>,
}

impl Reproposer {
    fn propose(&self) {
        let invalid = ProposedSubplan {
            parent: task("t1"),
            reason: DecompositionReason::TooLarge,
            subtasks: vec![sub("outside", &["elsewhere/x"])],
            stop_when: StopCondition::AllSubtasksComplete,
        };
        self.graph
            .do_send(ToTaskGraph::TaskCompleted(Box::new(TaskCompleted {
                task: task("t1"),
                attempt: 1,
                handoff: None,
                artifacts: Vec::new(),
                subplan: Some(invalid),
            })));
    }
}

impl actix::Actor for Reproposer {
    type Context = actix::Context<Self>;
}

impl actix::Handler<ToAgent> for Reproposer {
    type Result = ();
    fn handle(&mut self, msg: ToAgent, _: &mut actix::Context<Self>) {
        if let ToAgent::DecompositionRejected(_) = &msg {
            self.rejections += 1;
            if self.rejections < 50 {
                self.propose();
            }
        }
        let _ = self.seen.send(msg);
    }
}

#[actix::test]
async fn an_agent_that_keeps_proposing_invalid_subplans_is_stopped_after_k_rejections() {
    use actix::Actor;
    virtual_time();
    let limits = Limits {
        max_subplan_rejections: 3,
        max_proposals_per_attempt: 10,
        ..Limits::default()
    };
    let mut h = GraphHarness::start(limits);
    h.submit(vec![spec("the parent task", &["src"])]).await;
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let agent = Reproposer {
        graph: h.graph.clone().recipient(),
        rejections: 0,
        seen: tx,
    }
    .start();
    h.send(ToTaskGraph::TaskDispatched {
        task: task("t1"),
        attempt: 1,
        profile: "default".into(),
        route: Route::Worker,
        agent: agent.clone().recipient(),
    });
    h.send(ToTaskGraph::TaskStarted {
        task: task("t1"),
        attempt: 1,
    });
    agent.do_send(ToAgent::DecompositionRejected(TaskDecompositionRejected {
        parent: task("t1"),
        reason: RejectionReason::NoSubtasks,
    }));

    let failed = h.events.expect_kind("task_failed").await;
    assert_eq!(
        failed,
        EventKind::TaskFailed {
            task: task("t1"),
            attempt: 1,
            reason: FailureReason::ProposalLoop { rejections: 3 }
        }
    );
    h.events.expect_none().await;
    // What the agent heard, in order: the kick-off, two rejections it answered, then Cancel
    // (the third rejection is not sent: the attempt is over).
    let mut heard = Vec::new();
    while let Ok(m) = seen.try_recv() {
        heard.push(m);
    }
    assert_eq!(heard.len(), 4, "{heard:?}");
    assert!(
        heard[..3]
            .iter()
            .all(|m| matches!(m, ToAgent::DecompositionRejected(_)))
    );
    assert!(
        matches!(&heard[3], ToAgent::Cancel { task, reason } if *task == self::task("t1") && reason == "stopped after 3 rejected subplans")
    );
    // The journal stays small: the loop does not grow it.
    let kinds: Vec<&str> = h.journal.all().iter().map(|e| e.kind.name()).collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "decomposition_rejected")
            .count(),
        3
    );
    assert!(kinds.len() <= 10, "{kinds:?}");
}

/// A graph with t1 running (scope `src`) and `k` rejections allowed per attempt, and the
/// events that built it.
fn graph_with_running_parent(k: u32) -> (flotilla_actors::graph::RunGraph, Vec<EventKind>) {
    let mut g = flotilla_actors::graph::RunGraph::new(limits_with_k(k));
    let mut events = g.submit(vec![spec("the parent task", &["src"])]).unwrap();
    events.extend(g.dispatched(&task("t1"), 1, "w", Route::Worker).unwrap());
    events.extend(g.started(&task("t1"), 1).unwrap());
    (g, events)
}

fn limits_with_k(k: u32) -> Limits {
    Limits {
        max_subplan_rejections: k,
        ..Limits::default()
    }
}

fn invalid_report(handoff: Option<Handoff>) -> TaskCompleted {
    TaskCompleted {
        task: task("t1"),
        attempt: 1,
        handoff,
        artifacts: vec![ArtifactRef {
            kind: ArtifactKind::Report,
            locator: "notes".into(),
        }],
        subplan: Some(ProposedSubplan {
            parent: task("t1"),
            reason: DecompositionReason::TooLarge,
            subtasks: Vec::new(),
            stop_when: StopCondition::AllSubtasksComplete,
        }),
    }
}

#[test]
fn a_stopped_proposer_with_usable_work_completes_with_its_last_handoff() {
    let (mut g, _) = graph_with_running_parent(2);
    let first = g.complete(invalid_report(None)).unwrap();
    assert_eq!(first.len(), 1, "one rejection, nothing else: {first:?}");
    let mut partial = Handoff::complete("half of it, done properly");
    partial.status = HandoffStatus::Partial;
    let events = g.complete(invalid_report(Some(partial.clone()))).unwrap();
    let kinds: Vec<&str> = events.iter().map(EventKind::name).collect();
    assert_eq!(
        kinds,
        [
            "decomposition_rejected",
            "proposals_stopped",
            "task_completed"
        ]
    );
    let t1 = g.task(&task("t1")).unwrap();
    assert_eq!(t1.state, TaskState::Completed);
    assert_eq!(t1.handoff.as_deref(), Some(&partial));
    assert_eq!(t1.artifacts.len(), 1);
}

#[test]
fn a_stopped_proposer_without_usable_work_fails_and_is_not_retried() {
    let (mut g, mut journal) = graph_with_running_parent(2);
    journal.extend(g.complete(invalid_report(None)).unwrap());
    let mut blocked = Handoff::complete("cannot split it");
    blocked.status = HandoffStatus::Blocked;
    let events = g.complete(invalid_report(Some(blocked))).unwrap();
    assert!(
        matches!(
            events.last(),
            Some(EventKind::TaskFailed {
                reason: FailureReason::ProposalLoop { rejections: 2 },
                ..
            })
        ),
        "{events:?}"
    );
    assert_eq!(g.task(&task("t1")).unwrap().attempt, 1);
    // The new event replays: the journal rebuilds the same graph.
    journal.extend(events);
    let replayed = flotilla_actors::graph::RunGraph::replay(limits_with_k(2), &journal).unwrap();
    assert_eq!(replayed.snapshot(), g.snapshot());
}

// ---- Found by fuzzing (issue 11, point 4). ----

#[actix::test]
async fn a_trailing_space_does_not_hide_an_overlap() {
    let mut h = running_parent(Limits::default(), &["src"], None).await;
    let reason = expect_rejection(
        &mut h,
        vec![sub("one", &["src/a /"]), sub("two", &["src/a"])],
    )
    .await;
    assert_eq!(
        reason,
        RejectionReason::ScopeOverlap {
            first: 0,
            second: 1,
            path: "src/a".into()
        }
    );
}

#[actix::test]
async fn paths_that_only_look_harmless_with_a_trailing_space_are_refused() {
    let mut h = running_parent(Limits::default(), &["src"], None).await;
    for (raw, problem) in [
        ("src/.git /", PathProblem::GitDirectory),
        ("src/..  /x", PathProblem::ParentTraversal),
    ] {
        let reason = expect_rejection(&mut h, vec![sub("x", &[raw])]).await;
        assert_eq!(
            reason,
            RejectionReason::InvalidPath {
                subtask: 0,
                path: raw.into(),
                problem
            }
        );
    }
}

#[actix::test]
async fn stored_scopes_are_normalized_and_survive_replay() {
    let mut h = running_parent(Limits::default(), &["src"], None).await;
    h.propose(
        "t1",
        1,
        vec![sub("spaced", &[" src / a b /"])],
        StopCondition::AllSubtasksComplete,
    );
    h.expect_decision().await.unwrap();
    let added = h
        .events
        .fish_for("t1.1 added", |Published(e)| match &e.kind {
            EventKind::TaskAdded { task: t, spec, .. } if *t == task("t1.1") => {
                Some(spec.scope.clone())
            }
            _ => None,
        })
        .await;
    assert_eq!(added, ["src/a b"]);
    let journal: Vec<EventKind> = h.journal.all().into_iter().map(|e| e.kind).collect();
    let replayed = flotilla_actors::graph::RunGraph::replay(Limits::default(), &journal).unwrap();
    let child = replayed.task(&task("t1.1")).unwrap();
    assert_eq!(child.scope.len(), 1, "no path may be dropped on replay");
    assert_eq!(child.scope[0].as_str(), "src/a b");
}

#[actix::test]
async fn an_empty_or_blank_description_is_refused() {
    let mut h = running_parent(Limits::default(), &["src"], None).await;
    let reason = expect_rejection(
        &mut h,
        vec![sub("fine", &["src/a"]), sub(" \t ", &["src/b"])],
    )
    .await;
    assert_eq!(reason, RejectionReason::EmptyDescription { subtask: 1 });

    let mut g = flotilla_actors::graph::RunGraph::new(Limits::default());
    let events = g.submit(vec![spec("", &["a"])]).unwrap();
    assert_eq!(
        events,
        vec![EventKind::TasksRejected {
            reason: RejectionReason::EmptyDescription { subtask: 0 }
        }]
    );
    assert!(g.is_empty());
}

#[test]
fn depth_never_exceeds_what_task_ids_can_hold_even_with_unvalidated_limits() {
    use flotilla_actors::graph::RunGraph;
    let limits = Limits {
        max_depth: 40,
        max_subplan_rejections: 1,
        ..Limits::default()
    };
    assert!(limits.validate().is_err(), "validate refuses this depth");
    let mut g = RunGraph::new(limits.clone());
    let mut journal = g.submit(vec![spec("deep", &["d"])]).unwrap();
    let mut current = task("t1");
    loop {
        journal.extend(g.dispatched(&current, 1, "w", Route::Worker).unwrap());
        journal.extend(g.started(&current, 1).unwrap());
        let events = g
            .complete(TaskCompleted {
                task: current.clone(),
                attempt: 1,
                handoff: None,
                artifacts: Vec::new(),
                subplan: Some(ProposedSubplan {
                    parent: current.clone(),
                    reason: DecompositionReason::TooLarge,
                    subtasks: vec![sub(&format!("level {}", current.depth() + 1), &["d"])],
                    stop_when: StopCondition::AllSubtasksComplete,
                }),
            })
            .unwrap();
        journal.extend(events.iter().cloned());
        if let Some(reason) = events.iter().find_map(|e| match e {
            EventKind::DecompositionRejected { reason, .. } => Some(reason.clone()),
            _ => None,
        }) {
            assert_eq!(
                reason,
                RejectionReason::DepthExceeded {
                    depth: MAX_TASK_DEPTH + 1,
                    max: MAX_TASK_DEPTH
                }
            );
            break;
        }
        current = current.child(1);
    }
    assert_eq!(current.depth(), MAX_TASK_DEPTH);
    // Every journaled event reads back, so the run replays.
    let json: Vec<String> = journal
        .iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect();
    let back: Vec<EventKind> = json
        .iter()
        .map(|j| serde_json::from_str(j).unwrap())
        .collect();
    assert_eq!(back, journal);
    let replayed = RunGraph::replay(limits, &back).unwrap();
    assert_eq!(replayed.snapshot(), g.snapshot());
}

/// A refused planner batch and a refused subplan name the offending item the same way
/// ("proposed task N"); the batch used to say "subtask 0", the subplan "item 0".
#[test]
fn a_refused_batch_and_a_refused_subplan_name_their_items_alike() {
    let (mut g, _) = graph_with_running_parent(3);
    let batch = g.submit(vec![spec("escapes", &["../x"])]).unwrap();
    let batch_reason = batch
        .iter()
        .find_map(|e| match e {
            EventKind::TasksRejected { reason } => Some(reason.to_string()),
            _ => None,
        })
        .expect("the batch is refused");
    let mut report = invalid_report(None);
    report.subplan.as_mut().unwrap().subtasks = vec![sub("escapes", &["src/../x"])];
    let subplan = g.complete(report).unwrap();
    let subplan_reason = subplan
        .iter()
        .find_map(|e| match e {
            EventKind::DecompositionRejected { reason, .. } => Some(reason.to_string()),
            _ => None,
        })
        .expect("the subplan is refused");
    assert_eq!(
        batch_reason,
        r#"proposed task 0's path "../x" is invalid: the path climbs out with '..'"#
    );
    assert_eq!(
        subplan_reason,
        r#"proposed task 0's path "src/../x" is invalid: the path climbs out with '..'"#
    );
}
