//! What one attempt's set-up costs with each sandbox choice (ADR-015, issue 19 point 3):
//!
//! - `worktree`: a worktree for the attempt on its new branch, then its removal (what every
//!   attempt pays whatever the sandbox);
//! - `worktree+unsandboxed_true`: the same, and one command (`true`) spawned as before the
//!   sandbox (`[sandbox] mode = "none"`: own process group, limits, no bwrap);
//! - `worktree+bwrap_true`: the same, the command wrapped in the run's bubblewrap sandbox
//!   (the default), with the state directory and the checkout hidden as in a run;
//! - `worktree+bwrap_landlock_true`: and with a TCP port allow-list (Landlock), the
//!   command given the network.
//!
//! Each on a small repository (20 files) and a medium one (2,000 files, 8 MB): a
//! worktree's cost grows with the checkout, the sandbox's does not.
//!
//! `cargo bench --bench attempt` (an interleaved comparison first, then criterion's cases;
//! times per attempt).

// Test code: a failed unwrap is a failed test (the lint policy, ADR-027).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group};
use flotilla::git::target::TargetBranch;
use flotilla::git::worktrees::GitWorktrees;
use flotilla::process::ConfinedRunner;
use flotilla::sandbox::{SandboxConfig, SandboxMode, SandboxPolicy};
use flotilla_actors::ports::{
    BranchFate, CommandSpec, ProcessRunner, Sandbox, WorktreeRequest, WorktreeStart, Worktrees,
};
use flotilla_actors::protocol::{RunId, TaskId, branch_name};
use tokio_util::sync::CancellationToken;

/// A repository on `main` with `files` files of `bytes` bytes each, in directories of 50.
fn repository(dir: &Path, files: usize, bytes: usize) {
    let repo =
        git2::Repository::init_opts(dir, git2::RepositoryInitOptions::new().initial_head("main"))
            .unwrap();
    let mut index = repo.index().unwrap();
    let line = "let x = 1; // some source text of a plausible width.....\n";
    let body: String = line.repeat(bytes / line.len() + 1)[..bytes].to_string();
    for n in 0..files {
        let path = format!("src/m{:03}/f{n:05}.rs", n / 50);
        std::fs::create_dir_all(dir.join(&path).parent().unwrap()).unwrap();
        std::fs::write(dir.join(&path), format!("// {n}\n{body}")).unwrap();
        index.add_path(Path::new(&path)).unwrap();
    }
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let sig = git2::Signature::now("bench", "bench@example.com").unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "start", &tree, &[])
        .unwrap();
}

struct Setup {
    _tmp: tempfile::TempDir,
    worktrees: GitWorktrees,
    run: RunId,
    state: PathBuf,
    repo: PathBuf,
}

fn setup(files: usize, bytes: usize) -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::create_dir_all(&state).unwrap();
    repository(&repo, files, bytes);
    let (repo, state) = (repo.canonicalize().unwrap(), state.canonicalize().unwrap());
    let run = RunId::generate();
    let worktrees = GitWorktrees::new(
        &repo,
        run,
        state.join("worktrees").join(run.to_string()),
        TargetBranch::new("main").unwrap(),
    );
    Setup {
        _tmp: tmp,
        worktrees,
        run,
        state,
        repo,
    }
}

/// How the attempt's one command runs, if it runs one.
#[derive(Clone, Copy)]
enum Spawn {
    Nothing,
    Unsandboxed,
    Bwrap,
    BwrapLandlock,
}

impl Spawn {
    fn name(self) -> &'static str {
        match self {
            Spawn::Nothing => "worktree",
            Spawn::Unsandboxed => "worktree+unsandboxed_true",
            Spawn::Bwrap => "worktree+bwrap_true",
            Spawn::BwrapLandlock => "worktree+bwrap_landlock_true",
        }
    }

    fn runner(self, s: &Setup) -> Option<ConfinedRunner> {
        let config = match self {
            Spawn::Nothing => return None,
            Spawn::Unsandboxed => SandboxConfig {
                mode: SandboxMode::None,
                ..SandboxConfig::default()
            },
            Spawn::Bwrap => SandboxConfig::default(),
            Spawn::BwrapLandlock => SandboxConfig {
                allow_tcp_ports: Some(vec![443]),
                ..SandboxConfig::default()
            },
        };
        Some(ConfinedRunner::new(SandboxPolicy::for_run(
            &config,
            std::slice::from_ref(&s.state),
            &s.repo,
        )))
    }
}

/// One attempt: its worktree, its command (if any), the worktree's removal.
async fn attempt(s: &Setup, runner: Option<&ConfinedRunner>, n: u32, network: bool) {
    let task = TaskId::root(n);
    let workspace = s
        .worktrees
        .prepare(WorktreeRequest {
            task: task.clone(),
            attempt: 1,
            branch: branch_name(s.run, &task, 1),
            start: WorktreeStart::Main,
        })
        .await
        .unwrap();
    if let Some(runner) = runner {
        let mut spec = CommandSpec::shell("true", &workspace.path);
        spec.program = "true".into();
        spec.args.clear();
        if network {
            spec.sandbox = Sandbox::Network;
        }
        let out = runner
            .run(spec, CancellationToken::new(), None)
            .await
            .unwrap();
        assert!(out.exit.success(), "{out:?}");
    }
    s.worktrees
        .release(workspace, BranchFate::Delete)
        .await
        .unwrap();
}

fn attempts(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("attempt_setup");
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(10));
    for (size, files, bytes) in [("small", 20, 1024), ("medium", 2000, 4096)] {
        let s = setup(files, bytes);
        let n = AtomicU32::new(1);
        for spawn in [
            Spawn::Nothing,
            Spawn::Unsandboxed,
            Spawn::Bwrap,
            Spawn::BwrapLandlock,
        ] {
            let runner = spawn.runner(&s);
            let network = matches!(spawn, Spawn::BwrapLandlock);
            group.bench_function(BenchmarkId::new(spawn.name(), size), |b| {
                b.iter(|| {
                    let task = n.fetch_add(1, Ordering::Relaxed);
                    rt.block_on(attempt(&s, runner.as_ref(), task, network))
                })
            });
        }
    }
    group.finish();
}

/// The same four set-ups, interleaved: each round runs every variant once (in an order
/// that rotates), and each variant's time is compared with the plain worktree's of the same
/// round. On a shared machine whose load drifts, criterion's one-case-after-another
/// medians can differ several-fold between runs; the paired ratios hardly move. Printed as
/// a table before criterion's cases.
fn interleaved() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let spawns = [
        Spawn::Nothing,
        Spawn::Unsandboxed,
        Spawn::Bwrap,
        Spawn::BwrapLandlock,
    ];
    println!("interleaved: median ms per attempt, and median of the per-round ratio to `worktree`");
    for (size, files, bytes, rounds) in [("small", 20, 1024, 60), ("medium", 2000, 4096, 12)] {
        let s = setup(files, bytes);
        let runners: Vec<Option<ConfinedRunner>> = spawns.iter().map(|sp| sp.runner(&s)).collect();
        let mut n = 1_000_000;
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); spawns.len()];
        // One untimed round first: bwrap's one-time probe, caches.
        for round in 0..=rounds {
            for k in 0..spawns.len() {
                let i = (k + round) % spawns.len();
                n += 1;
                let network = matches!(spawns[i], Spawn::BwrapLandlock);
                let started = std::time::Instant::now();
                rt.block_on(attempt(&s, runners[i].as_ref(), n, network));
                if round > 0 {
                    times[i].push(started.elapsed().as_secs_f64() * 1000.0);
                }
            }
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(|a, b| a.total_cmp(b));
            v[v.len() / 2]
        };
        for (i, spawn) in spawns.iter().enumerate() {
            let ratios: Vec<f64> = times[i].iter().zip(&times[0]).map(|(t, w)| t / w).collect();
            println!(
                "  {size:<6} {:<30} median {:>8.1} ms   ratio {:>5.2}x",
                spawn.name(),
                median(times[i].clone()),
                median(ratios)
            );
        }
    }
}

criterion_group!(benches, attempts);

fn main() {
    interleaved();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
