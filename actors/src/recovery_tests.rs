use super::*;
use crate::config::Limits;
use crate::protocol::{
    AttemptFailure, BranchWork, Handoff, Role, Route, TaskCompleted, TaskId, TaskSpec, Usage,
};

/// A run's journal, written as the graph emits it.
struct Journal {
    run: RunId,
    events: Vec<Event>,
}

impl Journal {
    fn new() -> Self {
        let mut journal = Journal {
            run: RunId::generate(),
            events: Vec::new(),
        };
        journal.push(vec![EventKind::RunStarted {
            request: "build it".into(),
            sandbox: None,
        }]);
        journal
    }

    fn push(&mut self, kinds: Vec<EventKind>) {
        for kind in kinds {
            let seq = self.events.len() as u64 + 1;
            self.events.push(Event {
                seq,
                run: self.run,
                at_ms: seq * 1_000,
                kind,
            });
        }
    }

    fn planner_answered(&mut self, prompt: &str, content: &str) {
        self.push(vec![EventKind::PlannerResponded {
            call: 1,
            prompt: prompt.into(),
            content: content.into(),
            usage: Usage::default(),
            error: None,
        }]);
    }
}

fn added(events: &[EventKind]) -> Vec<TaskId> {
    events
        .iter()
        .filter_map(|k| match k {
            EventKind::TaskAdded { task, .. } => Some(task.clone()),
            _ => None,
        })
        .collect()
}

fn with_branch(branch: &str) -> Handoff {
    let mut handoff = Handoff::complete("done");
    handoff.work = Some(Box::new(BranchWork {
        branch: branch.into(),
        base: "base".into(),
        head: "head".into(),
        files: Vec::new(),
        files_omitted: 0,
        lines_added: 1,
        lines_removed: 0,
        committed_for_agent: false,
        links_outside: Vec::new(),
    }));
    handoff
}

/// One attempt of `task`, dispatched and started.
fn start(graph: &mut RunGraph, journal: &mut Journal, task: &TaskId, attempt: u32) {
    let out = graph
        .dispatched(task, attempt, "general", Route::Worker)
        .unwrap();
    journal.push(out);
    let out = graph.started(task, attempt).unwrap();
    journal.push(out);
}

fn complete(graph: &mut RunGraph, journal: &mut Journal, task: &TaskId, attempt: u32) -> String {
    let branch = branch_name(journal.run, task, attempt);
    let out = graph
        .complete(TaskCompleted {
            task: task.clone(),
            attempt,
            handoff: Some(with_branch(&branch)),
            artifacts: Vec::new(),
            subplan: None,
        })
        .unwrap();
    journal.push(out);
    branch
}

#[test]
fn a_run_that_only_started_has_nothing_to_resume() {
    let journal = Journal::new();
    let graph = RunGraph::new(Limits::default());
    let recovered = run_recovery(journal.run, &graph, &journal.events, 0);
    assert!(
        recovered.resume.is_none(),
        "a fresh run is started, not resumed"
    );
    assert_eq!(recovered.restarts, 0);
    assert!(recovered.conversation.is_empty());
    assert!(recovered.subplanner_conversations.is_empty());
    assert!(recovered.synthesizing.is_empty());
    assert!(recovered.delivered.is_empty());
    assert!(recovered.failed_attempts.is_empty());
    assert!(recovered.provider_pauses.is_empty());
}

#[test]
fn a_resumed_run_gets_its_conversation_its_failed_and_delivered_branches_and_unread_handoffs() {
    let mut journal = Journal::new();
    let mut graph = RunGraph::new(Limits::default());
    journal.planner_answered("plan it", "two tasks");
    let out = graph
        .submit(vec![
            TaskSpec::new("first", &["src/a"]),
            TaskSpec::new("second", &["src/b"]),
        ])
        .unwrap();
    let tasks = added(&out);
    journal.push(out);
    let (first, second) = (&tasks[0], &tasks[1]);
    // The first attempt of the first task fails and is retried; its second delivers.
    start(&mut graph, &mut journal, first, 1);
    let out = graph
        .failed(
            first,
            1,
            AttemptFailure::Crashed {
                detail: "killed".into(),
            },
        )
        .unwrap();
    assert!(
        out.iter()
            .any(|k| matches!(k, EventKind::TaskRetried { .. })),
        "{out:?}"
    );
    journal.push(out);
    start(&mut graph, &mut journal, first, 2);
    let delivered = complete(&mut graph, &mut journal, first, 2);
    journal.push(vec![EventKind::RunRestarted {
        restart: 1,
        reason: "the run's Planner actor stopped unexpectedly".into(),
    }]);
    // The second is in flight when the daemon stops.
    start(&mut graph, &mut journal, second, 1);

    let recovered = run_recovery(journal.run, &graph, &journal.events, 60_000);
    assert_eq!(recovered.restarts, 1);
    assert_eq!(
        recovered.conversation,
        vec![Exchange {
            prompt: "plan it".into(),
            answer: "two tasks".into(),
            unused: None,
        }]
    );
    assert_eq!(
        recovered.failed_attempts,
        vec![branch_name(journal.run, first, 1)]
    );
    assert_eq!(recovered.delivered, vec![delivered]);
    assert!(recovered.synthesizing.is_empty());
    let resume = recovered.resume.expect("a run with events is resumed");
    let unread: Vec<&TaskId> = resume.unread_handoffs.iter().map(|h| &h.task).collect();
    assert_eq!(
        unread,
        vec![first],
        "the planner has not read the first task's handoff"
    );
    assert_eq!(resume.unread_handoffs[0].state, TaskState::Completed);
    assert_eq!(resume.unread_handoffs[0].description, "first");
    assert!(resume.deadlines_in_ms.is_empty());
}

/// `[worktrees] retry_in_place` (ADR-031): the branch a pending or interrupted retry
/// continues from is kept; not once the task delivered, nor after a failure (a workspace
/// one) that is never continued.
#[test]
fn a_pending_retry_keeps_the_branch_it_continues_from() {
    let mut journal = Journal::new();
    let limits = Limits {
        max_attempts: 3,
        ..Limits::default()
    };
    let mut graph = RunGraph::new(limits);
    let out = graph
        .submit(vec![
            TaskSpec::new("first", &["src/a"]),
            TaskSpec::new("second", &["src/b"]),
            TaskSpec::new("third", &["src/c"]),
        ])
        .unwrap();
    let tasks = added(&out);
    journal.push(out);
    let crashed = || AttemptFailure::Crashed {
        detail: "killed".into(),
    };
    // The first: failed, its retry in flight when the daemon stops.
    start(&mut graph, &mut journal, &tasks[0], 1);
    journal.push(graph.failed(&tasks[0], 1, crashed()).unwrap());
    start(&mut graph, &mut journal, &tasks[0], 2);
    // The second: failed, then delivered by its retry.
    start(&mut graph, &mut journal, &tasks[1], 1);
    journal.push(graph.failed(&tasks[1], 1, crashed()).unwrap());
    start(&mut graph, &mut journal, &tasks[1], 2);
    complete(&mut graph, &mut journal, &tasks[1], 2);
    // The third: its workspace failed; the retry waits but starts from main.
    start(&mut graph, &mut journal, &tasks[2], 1);
    let workspace = AttemptFailure::Workspace {
        detail: "stale".into(),
    };
    journal.push(graph.failed(&tasks[2], 1, workspace).unwrap());

    let recovered = run_recovery(journal.run, &graph, &journal.events, 0);
    assert_eq!(
        recovered.continued,
        vec![branch_name(journal.run, &tasks[0], 1)]
    );
}

#[test]
fn a_handoff_journaled_before_the_planners_last_answer_was_read() {
    let mut journal = Journal::new();
    let mut graph = RunGraph::new(Limits::default());
    let out = graph.submit(vec![TaskSpec::new("only", &["src"])]).unwrap();
    let task = added(&out).remove(0);
    journal.push(out);
    start(&mut graph, &mut journal, &task, 1);
    complete(&mut graph, &mut journal, &task, 1);
    journal.planner_answered("what next", "nothing");
    let resume = recovery(&graph, &journal.events, 0);
    assert!(resume.unread_handoffs.is_empty(), "{resume:?}");
}

#[test]
fn a_branch_handed_to_the_merge_queue_counts_as_delivered() {
    let mut journal = Journal::new();
    let mut graph = RunGraph::new(Limits::default()).merging();
    let out = graph.submit(vec![TaskSpec::new("only", &["src"])]).unwrap();
    let task = added(&out).remove(0);
    journal.push(out);
    start(&mut graph, &mut journal, &task, 1);
    let branch = complete(&mut graph, &mut journal, &task, 1);
    assert!(
        journal
            .events
            .iter()
            .any(|e| matches!(e.kind, EventKind::TaskLanding { .. })),
        "a merging run lands its work"
    );
    let recovered = run_recovery(journal.run, &graph, &journal.events, 0);
    assert_eq!(recovered.delivered, vec![branch]);
}

#[test]
fn failed_attempts_name_retried_and_failed_attempts_only() {
    let run = RunId::generate();
    let task: TaskId = "t1".parse().unwrap();
    let events = [
        EventKind::TaskRetried {
            task: task.clone(),
            attempt: 1,
            failure: AttemptFailure::TimedOut { limit_ms: 10 },
            findings: Vec::new(),
        },
        EventKind::TaskInterrupted {
            task: task.clone(),
            attempt: 2,
        },
        EventKind::TaskStarted {
            task: task.clone(),
            attempt: 3,
        },
    ];
    assert_eq!(
        failed_attempts(run, &events),
        vec![branch_name(run, &task, 1)],
        "an interrupted attempt is not a failed one"
    );
}

#[test]
fn a_pause_is_open_until_its_provider_resumes_and_the_last_start_wins() {
    let pause = |provider: &str, until_ms: u64| EventKind::ProviderPauseStarted {
        provider: provider.into(),
        role: Role::Planner,
        task: None,
        until_ms,
        why: "rate limited".into(),
    };
    let events = [
        pause("a", 10),
        pause("b", 20),
        EventKind::ProviderResumed {
            provider: "a".into(),
        },
        pause("b", 30),
    ];
    assert_eq!(
        open_provider_pauses(&events),
        HashMap::from([("b".to_string(), 30)])
    );
}

fn round(role: Role, task: Option<TaskId>, attempt: u32, call: u32) -> EventKind {
    EventKind::ToolsRan {
        tools: crate::protocol::ToolRound {
            role,
            task,
            attempt,
            call,
            round: 0,
            commit: "abc".into(),
            content: String::new(),
            runs: Vec::new(),
            usage: Usage::default(),
        },
    }
}

/// ADR-037: only the rounds of calls without a journaled answer are replayed; an answered
/// call's rounds are done with, whichever conversation they belong to.
#[test]
fn only_the_tool_rounds_of_unanswered_calls_are_handed_back() {
    let t1 = TaskId::root(1);
    let events = vec![
        round(Role::Planner, None, 0, 0),
        EventKind::PlannerResponded {
            call: 0,
            prompt: "p".into(),
            content: "c".into(),
            usage: Usage::default(),
            error: None,
        },
        round(Role::Subplanner, Some(t1.clone()), 1, 0),
        round(Role::Subplanner, Some(t1.clone()), 2, 0),
        EventKind::SubplannerResponded {
            task: t1.clone(),
            attempt: 1,
            call: 0,
            prompt: "p".into(),
            content: "c".into(),
            usage: Usage::default(),
            reported: Vec::new(),
            error: None,
        },
        round(Role::Planner, None, 0, 1),
    ];
    let left = unanswered_tool_rounds(&events);
    let kept: Vec<(Role, Option<TaskId>, u32, u32)> = left
        .iter()
        .map(|r| (r.role, r.task.clone(), r.attempt, r.call))
        .collect();
    assert_eq!(
        kept,
        [
            (Role::Subplanner, Some(t1), 2, 0),
            (Role::Planner, None, 0, 1)
        ]
    );
}
