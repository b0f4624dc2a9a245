use super::*;

#[test]
fn events_serialize_with_kind_and_data_and_round_trip() {
    let e = Event {
        seq: 7,
        run: RunId::generate(),
        at_ms: 1,
        kind: EventKind::TaskReady {
            task: TaskId::root(1),
        },
    };
    let json = serde_json::to_value(&e).unwrap();
    assert_eq!(json["kind"], "task_ready");
    assert_eq!(json["data"]["task"], "t1");
    assert_eq!(json["kind"], e.kind.name());
    let back: Event = serde_json::from_value(json).unwrap();
    assert_eq!(back, e);
}

#[test]
fn run_finished_without_a_reason_still_parses() {
    let old: EventKind =
        serde_json::from_str(r#"{"kind": "run_finished", "data": {"outcome": "failed"}}"#).unwrap();
    assert_eq!(
        old,
        EventKind::RunFinished {
            outcome: RunOutcome::Failed,
            reason: None
        }
    );
}

/// One event of every kind about the deepest task id.
fn one_of_each() -> Vec<EventKind> {
    use crate::protocol::MAX_TASK_DEPTH;
    let mut deep = TaskId::root(u32::MAX);
    while deep.depth() < MAX_TASK_DEPTH {
        deep = deep.child(u32::MAX);
    }
    EventKind::samples(&deep)
}

/// Fails to compile when a kind is added without a sample in `one_of_each`.
fn sampled(kind: &EventKind) -> bool {
    match kind {
        EventKind::RunStarted { .. }
        | EventKind::PlannerResponded { .. }
        | EventKind::PlannerGaveUp { .. }
        | EventKind::ToolsRan { .. }
        | EventKind::TaskAdded { .. }
        | EventKind::TasksRejected { .. }
        | EventKind::TaskReady { .. }
        | EventKind::TaskDispatched { .. }
        | EventKind::TaskStarted { .. }
        | EventKind::TaskRetried { .. }
        | EventKind::TaskInterrupted { .. }
        | EventKind::ReviewVerdict { .. }
        | EventKind::TaskCompleted { .. }
        | EventKind::TaskFailed { .. }
        | EventKind::TaskCancelled { .. }
        | EventKind::DecompositionAccepted { .. }
        | EventKind::DecompositionRejected { .. }
        | EventKind::SubtasksAdded { .. }
        | EventKind::DecompositionClosed { .. }
        | EventKind::SubplannerResponded { .. }
        | EventKind::TaskAtomic { .. }
        | EventKind::SpendCharged { .. }
        | EventKind::ProposalsStopped { .. }
        | EventKind::SubtasksCompleted { .. }
        | EventKind::AwaitingUserDecision { .. }
        | EventKind::LandingAllowed { .. }
        | EventKind::MessageIgnored { .. }
        | EventKind::TaskLanding { .. }
        | EventKind::TaskLanded { .. }
        | EventKind::FixTaskAdded { .. }
        | EventKind::MergeConflict { .. }
        | EventKind::MergeGateFailed { .. }
        | EventKind::MainMoved { .. }
        | EventKind::LandingIntended { .. }
        | EventKind::LandingRequeued { .. }
        | EventKind::MainDiverged { .. }
        | EventKind::SweepFinished { .. }
        | EventKind::SweepStale { .. }
        | EventKind::FinalizationStarted { .. }
        | EventKind::PlanningFinished
        | EventKind::RunCancelRequested { .. }
        | EventKind::RunBudgetExhausted { .. }
        | EventKind::RunFinished { .. }
        | EventKind::RunRestarted { .. }
        | EventKind::JournalUnavailable { .. }
        | EventKind::StorageUnavailable { .. }
        | EventKind::LlmProgress { .. }
        | EventKind::ProviderPaused { .. }
        | EventKind::AgentActivity { .. }
        | EventKind::MainAdopted { .. }
        | EventKind::ProviderPauseStarted { .. }
        | EventKind::ProviderResumed { .. } => true,
    }
}

#[test]
fn every_event_kind_round_trips_through_json() {
    let all = one_of_each();
    let names: std::collections::BTreeSet<&str> = all.iter().map(EventKind::name).collect();
    assert_eq!(names.len(), all.len(), "one sample per kind");
    for kind in all {
        assert!(sampled(&kind));
        let json = serde_json::to_string(&kind).unwrap();
        let back: EventKind = serde_json::from_str(&json)
            .unwrap_or_else(|e| panic!("{} does not read back: {e}\n{json}", kind.name()));
        assert_eq!(back, kind);
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["kind"], kind.name());
    }
}
