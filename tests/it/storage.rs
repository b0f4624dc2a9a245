//! flotilla's own storage failing (ADR-021): a worktree that cannot be made for want of
//! space or a writable state directory is infrastructure, never the task's failure. The
//! attempt waits with a live notice, tries again, and goes on once the storage takes writes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use actix::prelude::*;
use flotilla::scripted::{Scenario, ScriptedAgent};
use flotilla_actors::actors::WorkerPool;
use flotilla_actors::ports::{
    BranchFate, RepoError, ScratchWorktrees, SweepKeep, Swept, Workspace, WorktreeRequest,
    Worktrees,
};
use flotilla_actors::protocol::*;
use futures::future::BoxFuture;

use crate::harness::*;
use crate::scratch_kit::scratch_kit;

/// Worktrees whose storage refuses the first `failures` writes, as a full disk or a
/// read-only state directory would.
struct FullDisk {
    inner: ScratchWorktrees,
    failures: AtomicU32,
    tried: Arc<AtomicU32>,
}

impl Worktrees for FullDisk {
    fn prepare(
        &self,
        request: WorktreeRequest,
    ) -> BoxFuture<'static, Result<Workspace, RepoError>> {
        self.tried.fetch_add(1, Ordering::SeqCst);
        let left = self.failures.load(Ordering::SeqCst);
        if left > 0 {
            self.failures.store(left - 1, Ordering::SeqCst);
            return Box::pin(async {
                Err(RepoError::Storage(
                    "cannot create /state/worktrees/r/t1-a1: Read-only file system (os error 30)"
                        .into(),
                ))
            });
        }
        self.inner.prepare(request)
    }

    fn seal(
        &self,
        workspace: Workspace,
        subject: String,
    ) -> BoxFuture<'static, Result<BranchWork, RepoError>> {
        self.inner.seal(workspace, subject)
    }

    fn release(
        &self,
        workspace: Workspace,
        fate: BranchFate,
    ) -> BoxFuture<'static, Result<(), RepoError>> {
        self.inner.release(workspace, fate)
    }

    fn sweep(&self, keep: SweepKeep) -> BoxFuture<'static, Result<Swept, RepoError>> {
        self.inner.sweep(keep)
    }
}

fn assign(id: &str) -> ToAgent {
    let mut task = ready(id, spec("work", &["a.rs"]), 1, 1);
    task.budget = Budget::new(1_000_000, Usd::ZERO, 600_000);
    ToAgent::Assign(Assignment {
        run: RunId::generate(),
        task,
        profile: "general".into(),
        route: Route::Worker,
        branch: "b".into(),
    })
}

#[actix::test]
async fn a_worktree_refused_by_full_storage_waits_and_is_never_charged_to_the_task() {
    virtual_time();
    let dir = tempfile::tempdir().unwrap();
    let agent = Arc::new(ScriptedAgent::new(
        Scenario::from_toml("[tasks.t1]\nwrites = { \"a.rs\" = \"fn a() {}\\n\" }\n").unwrap(),
    ));
    let (graph, mut inbox) = probe::<ToTaskGraph>("task graph");
    let (notices, mut published) = probe::<Published>("supervisor");
    let tried = Arc::new(AtomicU32::new(0));
    let mut kit = scratch_kit(agent, dir.path());
    kit.worktrees = Arc::new(FullDisk {
        inner: ScratchWorktrees::new(dir.path()),
        failures: AtomicU32::new(3),
        tried: tried.clone(),
    });
    kit.notices = Some(notices);
    let pool = WorkerPool::new(RunId::generate(), kit, graph, Duration::from_secs(60)).start();
    pool.do_send(assign("t1"));

    // Each refusal says so, live; none reaches the TaskGraph as a failure.
    for _ in 0..3 {
        match published.expect_kind("storage_unavailable").await {
            EventKind::StorageUnavailable { task, error } => {
                assert_eq!(task, self::task("t1"));
                assert!(error.contains("Read-only file system"), "{error}");
            }
            other => panic!("{other:?}"),
        }
    }
    // The storage takes writes again: the same attempt goes on and completes.
    loop {
        match inbox.expect().await {
            ToTaskGraph::SpendReported { .. } | ToTaskGraph::TaskStarted { .. } => continue,
            ToTaskGraph::TaskCompleted(done) => {
                assert_eq!((done.task.clone(), done.attempt), (task("t1"), 1));
                let work = done.handoff.unwrap().work.unwrap();
                assert!(work.files.iter().any(|f| f.path == "a.rs"));
                break;
            }
            other => panic!("the task was charged: {other:?}"),
        }
    }
    assert_eq!(tried.load(Ordering::SeqCst), 4, "three refusals, then made");
}

#[test]
fn the_operating_systems_storage_failures_are_told_from_other_git_errors() {
    for text in [
        "could not create directory '/s/worktrees/x': Read-only file system",
        "failed to write: No space left on device (os error 28)",
        "Disk quota exceeded",
    ] {
        assert!(
            matches!(
                RepoError::Git(text.into()).storage_or_self(),
                RepoError::Storage(_)
            ),
            "{text}"
        );
    }
    assert!(matches!(
        RepoError::Git("reference 'refs/heads/x' not found".into()).storage_or_self(),
        RepoError::Git(_)
    ));
}
