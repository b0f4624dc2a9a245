//! The top crate's part of the test kits: a WorkerPool's kit with the daemon's real process
//! runner. The actor-only harness (probes, `GraphHarness`, `PipelineHarness`) is the actors
//! crate's (`actors/tests/it/harness.rs`), compiled into this binary too.

/// What a WorkerPool needs, without git: plain directories under `dir` for worktrees, the
/// real process runner, the default checks.
pub fn scratch_kit(
    agent: std::sync::Arc<dyn flotilla_actors::ports::Agent>,
    dir: &std::path::Path,
) -> flotilla_actors::actors::WorkerKit {
    use std::sync::Arc;
    flotilla_actors::actors::WorkerKit {
        agents: flotilla_actors::actors::AgentSet::one(agent),
        worktrees: Arc::new(flotilla_actors::ports::ScratchWorktrees::new(dir)),
        runner: Arc::new(flotilla::process::TokioProcessRunner),
        checks: Arc::new(flotilla_actors::actors::worker::check::Checks::default()),
        notices: None,
        keep_failed: false,
        retry_in_place: false,
        transcripts: flotilla_actors::ports::Transcripts::none(),
        reviewer: None,
    }
}
