//! Reused attempt directories (ADR-044) against real repositories: a released attempt's
//! directory is what the next attempt gets, reset to its start with only what differs
//! written; nothing an earlier agent left (untracked, ignored, a forged tracked file, links,
//! modes, a rewritten `.git`) reaches it; a reset cut short is never handed out; and sweeps
//! leave nothing of the pool.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use flotilla::git::worktrees::{GitWorktrees, Unlocked};
use flotilla_actors::ports::{
    BranchFate, SweepKeep, Workspace, WorktreeRequest, WorktreeStart, Worktrees,
};
use flotilla_actors::protocol::{RunId, TaskId, branch_name};

use crate::daemon_env::{commit_files, init_repo, main_branch};
use crate::supervision::assert_checkout_untouched;

const MANY: usize = 2000;
/// The disk budget of the repository's pool in these runs (`[worktrees] pool_budget_mb`'s
/// default).
const POOL_MB: u64 = 2048;

struct Fixture {
    repo: Arc<tempfile::TempDir>,
    _state: Arc<tempfile::TempDir>,
    root: PathBuf,
    run: RunId,
    worktrees: GitWorktrees,
    /// While set, the worker's checkout panics as it starts (a kill mid-reset).
    crash: Arc<AtomicBool>,
}

fn fixture() -> Fixture {
    fixture_with(false)
}

/// `trust_seals`: the run's sandbox ends every process with its command (bwrap), so a
/// release the Worker calls sealed may park the seal's walk record (ADR-046).
fn fixture_with(trust_seals: bool) -> Fixture {
    let repo = tempfile::tempdir().unwrap();
    init_repo(repo.path());
    let git = git2::Repository::open(repo.path()).unwrap();
    commit_files(
        &git,
        &[
            (".gitignore", "target/\n"),
            ("src/lib.rs", "pub fn a() {}\npub fn b() {}\n"),
            ("src/old.rs", "one\ntwo\nthree\n"),
            ("tests/lib.rs", "#[test]\nfn t() {}\n"),
            ("docs/deep/notes.md", "notes\n"),
        ],
        "code",
    );
    // Enough files that a checkout spans more than one tick of the file system's clock:
    // those written in the snapshot's own tick are never trusted (racily clean), the
    // earlier ones are.
    let many: Vec<(String, String)> = (0..MANY)
        .map(|i| (format!("many/f{i:04}.txt"), format!("file {i}\n")))
        .collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
    commit_files(&git, &many, "many files");
    let state = tempfile::tempdir().unwrap();
    let run = RunId::generate();
    let root = state.path().join(run.to_string());
    let crash = Arc::new(AtomicBool::new(false));
    let armed = crash.clone();
    let worktrees = GitWorktrees::new(repo.path(), run, root.clone(), main_branch())
        .with_unlocked_hook(Arc::new(move |part| {
            if part == Unlocked::Checkout && armed.load(Ordering::SeqCst) {
                panic!("killed in the middle of making a workspace");
            }
        }))
        .trusting_seals(trust_seals, || true)
        .leaving_for_next_run(POOL_MB, || true);
    Fixture {
        repo: Arc::new(repo),
        _state: Arc::new(state),
        root,
        run,
        worktrees,
        crash,
    }
}

impl Fixture {
    /// The next run of the same repository, in the same state directory.
    fn next_run(&self) -> Fixture {
        self.next_run_leaving(POOL_MB)
    }

    /// [`Fixture::next_run`], leaving at most `budget_mb` MiB for the run after it.
    fn next_run_leaving(&self, budget_mb: u64) -> Fixture {
        let run = RunId::generate();
        let root = self._state.path().join(run.to_string());
        Fixture {
            repo: self.repo.clone(),
            _state: self._state.clone(),
            worktrees: GitWorktrees::new(self.repo.path(), run, root.clone(), main_branch())
                .trusting_seals(true, || true)
                .leaving_for_next_run(budget_mb, || true),
            root,
            run,
            crash: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The directories in the repository's pool (ADR-052): what a next run may reuse.
    fn pooled(&self) -> Vec<PathBuf> {
        let pool =
            flotilla::git::slots::repository_pool(self._state.path(), self.repo.path()).unwrap();
        let mut found: Vec<PathBuf> = std::fs::read_dir(&pool)
            .map(|e| {
                e.flatten()
                    .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default();
        found.sort();
        found
    }

    async fn close(&self) {
        self.worktrees
            .sweep(SweepKeep {
                closing: true,
                ..SweepKeep::default()
            })
            .await
            .unwrap();
    }

    fn request(&self, task: &str) -> WorktreeRequest {
        let task: TaskId = task.parse().unwrap();
        WorktreeRequest {
            branch: branch_name(self.run, &task, 1),
            task,
            attempt: 1,
            start: WorktreeStart::Main,
        }
    }

    async fn prepare(&self, task: &str) -> Workspace {
        self.worktrees.prepare(self.request(task)).await.unwrap()
    }

    async fn release(&self, ws: &Workspace) {
        self.worktrees
            .release(ws.clone(), BranchFate::Delete)
            .await
            .unwrap();
    }

    async fn seal(&self, ws: &Workspace) {
        self.worktrees
            .seal(ws.clone(), "the work".into())
            .await
            .unwrap();
    }

    /// Seals `ws` as the Worker does: what it reports, the repository, and its commit's tree.
    async fn seal_for_its_tree(
        &self,
        ws: &Workspace,
    ) -> (
        flotilla_actors::protocol::BranchWork,
        git2::Repository,
        git2::Oid,
    ) {
        let work = self
            .worktrees
            .seal(ws.clone(), "t2: the work".into())
            .await
            .unwrap();
        let git = git2::Repository::open(self.repo.path()).unwrap();
        let tree = git
            .find_commit(git2::Oid::from_str(&work.head).unwrap())
            .unwrap()
            .tree_id();
        (work, git, tree)
    }

    /// The release the Worker makes when nothing ran in the workspace since its seal.
    async fn release_sealed(&self, ws: &Workspace) {
        self.worktrees
            .release_sealed(ws.clone(), BranchFate::Delete)
            .await
            .unwrap();
    }

    /// The seal's walk record parked with `ws`'s directory, if any.
    fn parked_walk(&self, ws: &Workspace) -> Option<PathBuf> {
        let walk = self
            .root
            .join(".parked")
            .join(ws.path.file_name().unwrap())
            .join("walk");
        walk.exists().then_some(walk)
    }

    fn commit_on_main(&self, files: &[(&str, &str)]) -> git2::Oid {
        let git = git2::Repository::open(self.repo.path()).unwrap();
        commit_files(&git, files, "main moves")
    }

    fn main_tree(&self) -> Files {
        let git = git2::Repository::open(self.repo.path()).unwrap();
        let tree = git
            .find_reference("refs/heads/main")
            .unwrap()
            .peel_to_tree()
            .unwrap();
        let mut files = BTreeMap::new();
        tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
            if entry.kind() == Some(git2::ObjectType::Blob) {
                let blob = git.find_blob(entry.id()).unwrap();
                files.insert(
                    format!("{dir}{}", entry.name().unwrap()),
                    (entry.filemode() as u32, blob.content().to_vec()),
                );
            }
            git2::TreeWalkResult::Ok
        })
        .unwrap();
        files
    }
}

fn ino(path: &Path) -> u64 {
    std::fs::symlink_metadata(path).unwrap().ino()
}

/// Everything in the workspace but its `.git` file, links not followed: each file as git
/// would record it (mode, content), each directory with its mode.
/// Path → (git mode, content).
type Files = BTreeMap<String, (u32, Vec<u8>)>;

fn listing(root: &Path) -> (Files, BTreeMap<String, u32>) {
    let (mut files, mut dirs) = (BTreeMap::new(), BTreeMap::new());
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if rel == ".git" {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                dirs.insert(rel, meta.mode() & 0o7777);
                stack.push(path);
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                files.insert(
                    rel,
                    (0o120000, target.to_string_lossy().as_bytes().to_vec()),
                );
            } else {
                assert!(meta.is_file(), "{rel} is neither file, link nor directory");
                assert_eq!(meta.nlink(), 1, "{rel} is a hard link");
                assert_eq!(meta.mode() & 0o7000, 0, "{rel} has a set-id or sticky bit");
                let exec = meta.mode() & 0o100 != 0;
                let mode = if exec { 0o100755 } else { 0o100644 };
                files.insert(rel, (mode, std::fs::read(&path).unwrap()));
            }
        }
    }
    (files, dirs)
}

/// The workspace holds exactly main's tree: no file more or less, every byte and mode as
/// committed, no directory the tree does not need, none writable by others or set-id, and a
/// `.git` file that points at the attempt's own record.
fn assert_exactly_main(f: &Fixture, ws: &Workspace) {
    let (files, dirs) = listing(&ws.path);
    let main = f.main_tree();
    let differ: Vec<&String> = files
        .keys()
        .chain(main.keys())
        .filter(|p| files.get(*p) != main.get(*p))
        .collect();
    assert!(differ.is_empty(), "not as on main: {differ:?}");
    for (dir, mode) in &dirs {
        assert!(
            files.keys().any(|p| p.starts_with(&format!("{dir}/"))),
            "{dir} is no directory of the tree"
        );
        assert_eq!(mode & 0o7022, 0, "{dir} has mode {mode:o}");
    }
    let dot_git = std::fs::read_to_string(ws.path.join(".git")).unwrap();
    let dir_name = ws.path.file_name().unwrap().to_string_lossy();
    assert!(
        dot_git.trim_end().trim_end_matches('/').ends_with(&format!(
            "worktrees/flotilla-{}-{dir_name}",
            f.run.as_uuid().simple()
        )),
        "{dot_git}"
    );
    let opened = git2::Repository::open(&ws.path).unwrap();
    assert_eq!(
        opened.head().unwrap().name().unwrap(),
        format!("refs/heads/{}", ws.branch)
    );
    let statuses = opened
        .statuses(Some(
            git2::StatusOptions::new()
                .include_untracked(true)
                .include_ignored(true)
                .recurse_untracked_dirs(true),
        ))
        .unwrap();
    let dirty: Vec<String> = statuses
        .iter()
        .map(|s| format!("{} {:?}", s.path().unwrap_or("?"), s.status()))
        .collect();
    assert!(dirty.is_empty(), "git sees {dirty:?}");
}

#[tokio::test]
async fn the_next_attempt_gets_the_released_directory_with_only_what_differs_written() {
    let f = fixture();
    let first = f.prepare("t1").await;
    let root_ino = ino(&first.path);
    let inodes = |root: &Path| -> Vec<u64> {
        (0..MANY)
            .map(|i| ino(&root.join(format!("many/f{i:04}.txt"))))
            .collect()
    };
    let before = inodes(&first.path);
    std::fs::write(first.path.join("src/a.rs"), "pub fn a2() {}\n").unwrap();
    f.worktrees
        .seal(first.clone(), "t1: the work".into())
        .await
        .unwrap();
    f.release(&first).await;
    assert!(!first.path.exists());
    // main moves on meanwhile: one file changes, one is new.
    f.commit_on_main(&[("src/lib.rs", "pub fn c() {}\n"), ("src/new.rs", "new\n")]);

    let second = f.prepare("t2").await;
    assert_ne!(
        second.path, first.path,
        "its own path, named for its attempt"
    );
    assert_eq!(
        ino(&second.path),
        root_ino,
        "the released directory, reused"
    );
    let kept = before
        .iter()
        .zip(inodes(&second.path))
        .filter(|(a, b)| **a == *b)
        .count();
    assert!(
        kept > 0,
        "files the new start did not change are not written again"
    );
    assert_exactly_main(&f, &second);

    // The reused directory works as a fresh one: the seal sees exactly the new work.
    std::fs::write(second.path.join("tests/more.rs"), "// more\n").unwrap();
    let work = f
        .worktrees
        .seal(second.clone(), "t2: more".into())
        .await
        .unwrap();
    let paths: Vec<&str> = work.files.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(paths, ["tests/more.rs"]);
    f.release(&second).await;
    assert_checkout_untouched(f.repo.path());
}

/// An earlier agent is an attacker: whatever it leaves in its directory, the next attempt's
/// workspace holds main's tree and nothing else.
#[tokio::test]
async fn nothing_an_earlier_agent_left_reaches_the_next_attempt() {
    let f = fixture();
    let first = f.prepare("t1").await;
    let root_ino = ino(&first.path);
    let p = |rel: &str| first.path.join(rel);
    // Untracked, and ignored (a build output).
    std::fs::write(p("evil.txt"), "untracked\n").unwrap();
    std::fs::create_dir_all(p("target/debug")).unwrap();
    std::fs::write(p("target/debug/build-script"), "#!/bin/sh\nsteal\n").unwrap();
    // A tracked file changed to the same size, its mtime put back: stat-equal to the eye
    // of git's own checkout (mtime and size).
    let lib = p("src/lib.rs");
    let mtime = std::fs::metadata(&lib).unwrap().modified().unwrap();
    std::fs::write(&lib, "pub fn x() {}\npub fn y() {}\n").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&lib)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    // A tracked file turned into a link out of the workspace, and a directory into a link
    // to the user's checkout.
    std::fs::remove_file(p("src/old.rs")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", p("src/old.rs")).unwrap();
    std::fs::remove_dir_all(p("docs")).unwrap();
    std::os::unix::fs::symlink(f.repo.path(), p("docs")).unwrap();
    // Odd modes: a set-uid tracked file, a world-writable directory, an unreadable one.
    std::fs::set_permissions(p("tests/lib.rs"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::fs::set_permissions(p("tests"), std::fs::Permissions::from_mode(0o3777)).unwrap();
    std::fs::create_dir_all(p("src/locked/inner")).unwrap();
    std::fs::write(p("src/locked/inner/x"), "x").unwrap();
    std::fs::set_permissions(p("src/locked"), std::fs::Permissions::from_mode(0o000)).unwrap();
    // A hard link, a fifo, a nested repository.
    std::fs::hard_link(p(".gitignore"), p("linked")).unwrap();
    let fifo = std::ffi::CString::new(p("pipe").to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    git2::Repository::init(p("nested")).unwrap();
    // `.git` pointed at the user's repository.
    std::fs::write(
        p(".git"),
        format!("gitdir: {}\n", f.repo.path().join(".git").display()),
    )
    .unwrap();
    f.release(&first).await;

    let second = f.prepare("t2").await;
    assert_eq!(ino(&second.path), root_ino, "the same directory, reused");
    assert_exactly_main(&f, &second);
    assert_eq!(
        std::fs::read_to_string(second.path.join("src/lib.rs")).unwrap(),
        "pub fn a() {}\npub fn b() {}\n"
    );
    assert!(f.repo.path().join("docs/deep/notes.md").exists());
    f.release(&second).await;
    assert_checkout_untouched(f.repo.path());
}

/// A kill in the middle of resetting a parked directory (here: a panic as the reset starts,
/// the earlier agent's files still in it) leaves a locked worktree: no later attempt gets
/// it, the same attempt is made again clean, and the sweep removes what is left.
#[tokio::test]
async fn a_reset_cut_short_is_never_handed_out_as_clean() {
    let f = fixture();
    let first = f.prepare("t1").await;
    let root_ino = ino(&first.path);
    std::fs::write(first.path.join("evil.txt"), "left behind\n").unwrap();
    f.release(&first).await;

    f.crash.store(true, Ordering::SeqCst);
    let cut = f.worktrees.prepare(f.request("t2")).await;
    f.crash.store(false, Ordering::SeqCst);
    assert!(cut.is_err(), "{cut:?}");
    let half = f.root.join("t2-a1");
    assert_eq!(
        ino(&half),
        root_ino,
        "the reset had taken the parked directory"
    );
    assert!(half.join("evil.txt").exists(), "and had not cleaned it yet");

    let other = f.prepare("t3").await;
    assert_ne!(
        ino(&other.path),
        root_ino,
        "a half reset directory is not reused"
    );
    assert_exactly_main(&f, &other);

    let again = f.prepare("t2").await;
    assert_eq!(again.path, half);
    assert_exactly_main(&f, &again);

    // Cut short again, then a restart's sweep: the half reset directory goes.
    f.release(&other).await;
    f.crash.store(true, Ordering::SeqCst);
    assert!(f.worktrees.prepare(f.request("t4")).await.is_err());
    f.crash.store(false, Ordering::SeqCst);
    let swept = f
        .worktrees
        .sweep(SweepKeep {
            worktrees: vec![again.branch.clone()],
            delivered: None,
            branches: Vec::new(),
            closing: false,
        })
        .await
        .unwrap();
    assert!(swept.worktrees.contains(&f.root.join("t4-a1")), "{swept:?}");
    assert!(!f.root.join("t4-a1").exists());
    assert!(again.path.exists(), "a kept worktree stays");
    // The kept one still parks when released, and the next attempt reuses it.
    let kept_ino = ino(&again.path);
    f.release(&again).await;
    let next = f.prepare("t5").await;
    assert_eq!(ino(&next.path), kept_ino);
    assert_exactly_main(&f, &next);
}

#[tokio::test]
async fn the_end_of_the_run_leaves_no_parked_directory() {
    let f = fixture();
    let a = f.prepare("t1").await;
    let b = f.prepare("t2").await;
    let live = f.prepare("t3").await;
    f.release(&a).await;
    f.release(&b).await;
    let parked = std::fs::read_dir(f.root.join(".parked")).unwrap().count();
    assert_eq!(
        parked, 2,
        "both released directories wait for a next attempt"
    );

    let swept = f
        .worktrees
        .sweep(SweepKeep {
            closing: true,
            ..SweepKeep::default()
        })
        .await
        .unwrap();
    assert_eq!(swept.worktrees, std::slice::from_ref(&live.path));
    assert!(!f.root.exists(), "nothing of the run is left");
    assert!(f.worktrees.prepare(f.request("t4")).await.is_err());
    assert_checkout_untouched(f.repo.path());
}

/// A run's parked directories wait for the next run of the repository (ADR-052, decision 3):
/// its first attempts reuse them, reset to main as it is then, whatever an agent left.
#[tokio::test]
async fn a_finished_runs_directories_wait_for_the_next_run_of_the_repository() {
    let f = fixture();
    let a = f.prepare("t1").await;
    let b = f.prepare("t2").await;
    let inodes = [ino(&a.path), ino(&b.path)];
    std::fs::write(a.path.join("src/lib.rs"), "pub fn forged() {}\n").unwrap();
    std::fs::write(a.path.join("left.txt"), "an agent's\n").unwrap();
    f.seal(&a).await;
    f.release(&a).await;
    f.release(&b).await;
    f.close().await;
    assert!(
        !f.root.exists(),
        "nothing of the run is left in its own directory"
    );
    assert_eq!(f.pooled().len(), 2, "both wait for the next run");
    f.commit_on_main(&[("src/lib.rs", "pub fn c() {}\n"), ("src/new.rs", "new\n")]);

    let g = f.next_run();
    let first = g.prepare("t1").await;
    assert!(
        inodes.contains(&ino(&first.path)),
        "a directory of the last run"
    );
    assert_exactly_main(&g, &first);
    assert_eq!(g.pooled().len(), 1);
    let second = g.prepare("t2").await;
    assert!(inodes.contains(&ino(&second.path)));
    assert_exactly_main(&g, &second);
    assert!(g.pooled().is_empty());
    // The pool holds at most MAX_POOLED between runs.
    let more: Vec<Workspace> = futures::future::join_all(
        (3..10).map(|n| g.worktrees.prepare(g.request(&format!("t{n}")))),
    )
    .await
    .into_iter()
    .map(Result::unwrap)
    .collect();
    for ws in more.iter().chain([&first, &second]) {
        g.release(ws).await;
    }
    g.close().await;
    assert_eq!(g.pooled().len(), flotilla::git::slots::MAX_POOLED);
    assert_checkout_untouched(f.repo.path());
}

/// A pooled directory whose tree the repository no longer has (cloned anew at the same
/// path) is not used, and gc removes the pool of a repository that is gone.
#[tokio::test]
async fn a_pooled_directory_the_repository_cannot_reset_is_not_used() {
    let f = fixture();
    let a = f.prepare("t1").await;
    let pooled_ino = ino(&a.path);
    f.release(&a).await;
    f.close().await;
    assert_eq!(f.pooled().len(), 1);
    // The repository made anew at its path: other objects, other history.
    std::fs::remove_dir_all(f.repo.path().join(".git")).unwrap();
    init_repo(f.repo.path());
    let git = git2::Repository::open(f.repo.path()).unwrap();
    commit_files(&git, &[("other.txt", "another project\n")], "anew");
    for entry in std::fs::read_dir(f.repo.path()).unwrap().flatten() {
        let name = entry.file_name();
        if name != ".git" && name != "other.txt" {
            let _ = std::fs::remove_dir_all(entry.path());
            let _ = std::fs::remove_file(entry.path());
        }
    }

    let g = f.next_run();
    let ws = g.prepare("t1").await;
    assert_ne!(ino(&ws.path), pooled_ino, "written fresh");
    assert_exactly_main(&g, &ws);
    assert!(g.pooled().is_empty(), "the useless one is gone");
    g.release(&ws).await;
    g.close().await;
    assert_eq!(g.pooled().len(), 1);

    // gc: a live repository's pool stays; a gone one's goes.
    let worktrees = f._state.path();
    assert!(flotilla::git::slots::stale_pools(worktrees, true).is_empty());
    assert_eq!(g.pooled().len(), 1);
    std::fs::remove_dir_all(f.repo.path().join(".git")).unwrap();
    let stale = flotilla::git::slots::stale_pools(worktrees, true);
    assert_eq!(stale.len(), 1);
    assert!(!stale[0].exists());
}

/// A pooled directory's seal lends no trust to the next run (ADR-052): whatever wrote into
/// it between the runs (a process of a run without a sandbox that ends them, the user) is
/// found by the reset's walk, not kept because the last seal's record did not list it.
#[tokio::test]
async fn the_next_run_walks_a_pooled_directory_whatever_its_last_seal_said() {
    let f = fixture_with(true);
    let ws = f.prepare("t1").await;
    f.seal(&ws).await;
    f.release_sealed(&ws).await;
    assert!(f.parked_walk(&ws).is_some(), "trusted within its run");
    f.close().await;
    let pooled = f.pooled();
    assert_eq!(pooled.len(), 1);
    let tree = pooled[0].join("tree");
    std::fs::write(tree.join("src/lib.rs"), "pub fn forged() {}\n").unwrap();
    std::fs::write(tree.join("many/planted.txt"), "planted\n").unwrap();

    let pooled_ino = ino(&tree);
    let g = f.next_run();
    let next = g.prepare("t1").await;
    assert_eq!(ino(&next.path), pooled_ino, "the pooled directory, reused");
    assert!(!next.path.join("many/planted.txt").exists());
    assert_exactly_main(&g, &next);
}

/// The pool keeps within its disk budget (`[worktrees] pool_budget_mb`), counting what it
/// holds already: a directory that would take it over is removed with its run, 0 leaves
/// none and empties the pool, and `status`'s line says what is kept against the budget.
#[tokio::test]
async fn the_pool_keeps_within_its_disk_budget() {
    let f = fixture();
    let describe = || flotilla::git::slots::describe_pool(f._state.path(), f.repo.path());
    // Each directory holds MANY files, over 1 MiB of disk.
    let g = f.next_run_leaving(1);
    let a = g.prepare("t1").await;
    g.release(&a).await;
    g.close().await;
    assert!(g.pooled().is_empty(), "over the budget");
    assert_eq!(describe(), None);

    let g = f.next_run();
    // A run that ends after g, its directories made while g's were in use.
    let late = f.next_run();
    let c = late.prepare("t1").await;
    let d = late.prepare("t2").await;
    let a = g.prepare("t1").await;
    let b = g.prepare("t2").await;
    g.release(&a).await;
    g.release(&b).await;
    g.close().await;
    assert_eq!(g.pooled().len(), 2);
    let line = describe().unwrap();
    assert!(
        line.starts_with("2 workspaces kept for the repository's next run, ")
            && line.ends_with(" MiB of 2048 MiB"),
        "{line}"
    );
    // What they took as they were pooled (each over 8 MiB) binds the next run to end: with
    // room for about these two, it leaves none of its own beside them.
    let mib: u64 = line
        .split(", ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    let Fixture {
        repo,
        _state,
        root,
        run,
        worktrees,
        crash,
    } = late;
    let late = Fixture {
        worktrees: worktrees.leaving_for_next_run(mib + 1, || true),
        repo,
        _state,
        root,
        run,
        crash,
    };
    late.release(&c).await;
    late.release(&d).await;
    late.close().await;
    assert_eq!(late.pooled().len(), 2, "the two it found, none of its own");

    let h = f.next_run_leaving(0);
    let e = h.prepare("t1").await;
    h.release(&e).await;
    h.close().await;
    assert!(h.pooled().is_empty(), "0 leaves none and empties the pool");
    assert_eq!(describe(), None);
}

/// What an agent left in its directory goes before it is pooled (ADR-052): a file it added
/// under a directory it made unreadable is neither kept nor a way past the budget, and the
/// directory gets a plain mode back.
#[tokio::test]
async fn a_directory_is_pooled_holding_only_what_flotilla_checked_out() {
    use std::os::unix::fs::PermissionsExt;
    let f = fixture();
    let a = f.prepare("t1").await;
    std::fs::write(a.path.join("many/big.bin"), vec![7u8; 24 << 20]).unwrap();
    std::fs::write(a.path.join("src/lib.rs"), "pub fn forged() {}\n").unwrap();
    std::fs::set_permissions(a.path.join("many"), std::fs::Permissions::from_mode(0o000)).unwrap();
    f.release(&a).await;
    f.close().await;
    let pooled = f.pooled();
    assert_eq!(pooled.len(), 1);
    let tree = pooled[0].join("tree");
    let mode = std::fs::metadata(tree.join("many"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode & 0o700, 0o700, "a plain mode again: {mode:o}");
    assert!(!tree.join("many/big.bin").exists());
    assert!(
        !tree.join("src/lib.rs").exists(),
        "changed: gone, written again by the reset"
    );
    let bytes: u64 = std::fs::read_to_string(pooled[0].join("bytes"))
        .unwrap()
        .parse()
        .unwrap();
    // MANY small files, about 8 MiB; never the 24 MiB the agent added.
    assert!(bytes > (MANY as u64) * 10 && bytes < 16 << 20, "{bytes}");
    // The clean's walk measured the tree: what a walk of its own finds now, or (a
    // directory the clean emptied and removed still counted) a little more.
    let walked = disk_below(&pooled[0]) - disk_of(&pooled[0].join("bytes"));
    assert!(
        bytes >= walked && bytes <= walked + (64 << 10),
        "{bytes} against {walked}"
    );

    let g = f.next_run();
    let next = g.prepare("t1").await;
    assert_exactly_main(&g, &next);
}

/// The disk a file takes (allocated blocks), the link itself for a link.
fn disk_of(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).unwrap().blocks() * 512
}

/// The disk everything below `path` takes, links not followed.
fn disk_below(path: &std::path::Path) -> u64 {
    std::fs::read_dir(path)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap().path();
            let below = if entry.symlink_metadata().unwrap().is_dir() {
                disk_below(&entry)
            } else {
                0
            };
            disk_of(&entry) + below
        })
        .sum()
}

/// Where the tree's watch saw nothing written since its seal, the pooled directory is
/// cleaned by the seal's walk record and its disk counted from the snapshot (ADR-054):
/// what the agent added or changed is gone, and every other file of main is there (a walk
/// also deletes those of the checkout's last tick, which no stat can trust: the checkout of
/// MANY files spans several), and the measure is the snapshot's sizes rounded up to the
/// block, with the directories' own.
#[tokio::test]
async fn a_pooled_directory_sealed_and_untouched_since_is_cleaned_by_its_record() {
    let f = fixture_with(true);
    let ws = f.prepare("t1").await;
    std::fs::write(ws.path.join("many/big.bin"), vec![7u8; 24 << 20]).unwrap();
    std::fs::write(ws.path.join("src/lib.rs"), "pub fn changed() {}\n").unwrap();
    f.seal(&ws).await;
    f.release_sealed(&ws).await;
    assert!(f.parked_walk(&ws).is_some(), "trusted within its run");
    f.close().await;
    let pooled = f.pooled();
    assert_eq!(pooled.len(), 1);
    assert!(
        flotilla::git::slots::pooled_by_record(pooled[0].file_name().unwrap()),
        "cleaned by the record, not a walk"
    );
    let tree = pooled[0].join("tree");
    assert!(!tree.join("many/big.bin").exists());
    assert!(!tree.join("src/lib.rs").exists(), "changed: gone");
    let block = std::fs::symlink_metadata(&tree).unwrap().blksize();
    let mut expected = disk_of(&tree) + disk_of(&pooled[0].join("index"));
    for (file, _) in f.main_tree() {
        let path = tree.join(&file);
        if file == "src/lib.rs" {
            continue;
        }
        let size = std::fs::symlink_metadata(&path)
            .unwrap_or_else(|e| panic!("{file}: {e}"))
            .len();
        expected += size.div_ceil(block) * block;
    }
    for dir in ["src", "tests", "docs", "docs/deep", "many"] {
        expected += disk_of(&tree.join(dir));
    }
    let bytes: u64 = std::fs::read_to_string(pooled[0].join("bytes"))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(bytes, expected);

    let g = f.next_run();
    let next = g.prepare("t1").await;
    assert_exactly_main(&g, &next);
}

/// A pooled directory git cannot reset any more (an object of its old tree pruned since)
/// is made fresh instead of failing the attempt.
#[tokio::test]
async fn a_pooled_directory_whose_old_tree_is_partly_pruned_is_made_fresh() {
    let f = fixture();
    let a = f.prepare("t1").await;
    let written = |ws: &Workspace| {
        std::fs::symlink_metadata(ws.path.join("many/f0000.txt"))
            .unwrap()
            .modified()
            .unwrap()
    };
    let first_write = written(&a);
    f.release(&a).await;
    f.close().await;
    assert_eq!(f.pooled().len(), 1);
    // main drops `docs/`; the object of the old `docs/deep` tree is then pruned.
    let git = git2::Repository::open(f.repo.path()).unwrap();
    let old = git.head().unwrap().peel_to_tree().unwrap();
    let deep = old
        .get_path(Path::new("docs/deep"))
        .unwrap()
        .id()
        .to_string();
    let mut index = git.index().unwrap();
    index.remove_dir(Path::new("docs"), 0).unwrap();
    let tree = git.find_tree(index.write_tree().unwrap()).unwrap();
    let sig = git2::Signature::now("t", "t@example.com").unwrap();
    let parent = git.head().unwrap().peel_to_commit().unwrap();
    git.commit(Some("HEAD"), &sig, &sig, "no docs", &tree, &[&parent])
        .unwrap();
    let loose = f
        .repo
        .path()
        .join(".git/objects")
        .join(&deep[..2])
        .join(&deep[2..]);
    std::fs::remove_file(&loose).unwrap();

    let g = f.next_run();
    let next = g.prepare("t1").await;
    // A reset keeps a file it need not write; a fresh checkout writes every one again.
    assert_ne!(written(&next), first_write, "made fresh");
    assert!(g.pooled().is_empty(), "the broken one is gone");
    assert_exactly_main(&g, &next);
}

fn git_cli(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The reset writes the worktree's index itself (ADR-046): git's own CLI reads the reused
/// workspace as clean, then sees an agent's same-size edit made at once.
#[tokio::test]
async fn git_reads_a_reused_workspace_as_clean_and_then_sees_the_agents_edit() {
    let f = fixture();
    let first = f.prepare("t1").await;
    std::fs::write(
        first.path.join("src/lib.rs"),
        "changed by the first agent\n",
    )
    .unwrap();
    f.release(&first).await;
    f.commit_on_main(&[("src/new.rs", "new\n"), ("many/f0003.txt", "moved on\n")]);

    let ws = f.prepare("t2").await;
    let status = ["status", "--porcelain=v1", "--untracked-files=all"];
    assert_eq!(git_cli(&ws.path, &status), "");
    assert_eq!(git_cli(&ws.path, &["diff", "--stat"]), "");
    // Same size as "one\ntwo\nthree\n".
    std::fs::write(ws.path.join("src/old.rs"), "ONE\ntwo\nthree\n").unwrap();
    assert_eq!(git_cli(&ws.path, &status), " M src/old.rs\n");
}

/// The seal's one walk judges each file by the snapshot's stat (ADR-046): an agent that
/// hides an edit from it (same size, mtime put back), changes only a mode, replaces a file
/// by a directory or adds links still has all of it committed, exactly as git's own
/// `add -A` takes the workspace; ignored output stays out and a hard link is never read.
#[tokio::test]
async fn the_seal_finds_every_change_an_agent_hides_from_its_one_walk() {
    let f = fixture();
    let first = f.prepare("t1").await;
    f.release(&first).await;
    // Reused: its snapshot is the reset's, not a fresh checkout's.
    let ws = f.prepare("t2").await;
    let p = |rel: &str| ws.path.join(rel);
    let lib = p("src/lib.rs");
    let mtime = std::fs::metadata(&lib).unwrap().modified().unwrap();
    std::fs::write(&lib, "pub fn x() {}\npub fn y() {}\n").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&lib)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    std::fs::set_permissions(p("tests/lib.rs"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::remove_file(p("src/old.rs")).unwrap();
    std::fs::remove_dir_all(p("docs")).unwrap();
    std::fs::remove_file(p("many/f0001.txt")).unwrap();
    std::fs::create_dir(p("many/f0001.txt")).unwrap();
    std::fs::write(p("many/f0001.txt/inner"), "inner\n").unwrap();
    std::fs::create_dir_all(p("new/deep")).unwrap();
    std::fs::write(p("new/deep/x.rs"), "x\n").unwrap();
    std::fs::create_dir_all(p("target/debug")).unwrap();
    std::fs::write(p("target/debug/out"), "built\n").unwrap();
    std::os::unix::fs::symlink("lib.rs", p("src/link")).unwrap();
    let outside = f._state.path().join("secret");
    std::fs::write(&outside, "secret\n").unwrap();
    std::fs::hard_link(&outside, p("stolen")).unwrap();

    let (work, git, tree) = f.seal_for_its_tree(&ws).await;
    let tree = git.find_tree(tree).unwrap();
    let at = |rel: &str| {
        tree.get_path(Path::new(rel)).ok().map(|e| {
            let blob = git.find_blob(e.id()).unwrap();
            (
                e.filemode(),
                String::from_utf8(blob.content().to_vec()).unwrap(),
            )
        })
    };
    assert_eq!(
        at("src/lib.rs"),
        Some((0o100644, "pub fn x() {}\npub fn y() {}\n".into()))
    );
    assert_eq!(at("tests/lib.rs").map(|e| e.0), Some(0o100755));
    assert_eq!(at("src/old.rs"), None);
    assert_eq!(at("docs/deep/notes.md"), None);
    assert_eq!(
        at("many/f0001.txt/inner"),
        Some((0o100644, "inner\n".into()))
    );
    assert_eq!(at("many/f0002.txt"), Some((0o100644, "file 2\n".into())));
    assert_eq!(at("new/deep/x.rs"), Some((0o100644, "x\n".into())));
    assert_eq!(at("src/link"), Some((0o120000, "lib.rs".into())));
    assert_eq!(at("target/debug/out"), None, "ignored output stays out");
    assert_eq!(at("stolen"), None, "a hard link is never read");
    assert!(work.links_outside.contains(&"stolen".to_string()));

    // Without the hard link, git's own add of everything makes the very same tree.
    std::fs::remove_file(p("stolen")).unwrap();
    git_cli(&ws.path, &["add", "-A"]);
    assert_eq!(
        git_cli(&ws.path, &["write-tree"]).trim(),
        tree.id().to_string()
    );
}

/// What the one walk leaves to libgit2's whole add (here a fifo the agent left) still
/// seals: the agent's other changes are all committed.
#[tokio::test]
async fn a_seal_the_walk_leaves_to_the_whole_add_still_commits_everything() {
    let f = fixture();
    let ws = f.prepare("t1").await;
    std::fs::write(ws.path.join("src/lib.rs"), "pub fn z() {}\n").unwrap();
    std::fs::remove_file(ws.path.join("src/old.rs")).unwrap();
    std::fs::create_dir_all(ws.path.join("new")).unwrap();
    std::fs::write(ws.path.join("new/file.rs"), "new\n").unwrap();
    let fifo = std::ffi::CString::new(ws.path.join("pipe").to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let work = f
        .worktrees
        .seal(ws.clone(), "t1: the work".into())
        .await
        .unwrap();
    let git = git2::Repository::open(f.repo.path()).unwrap();
    let tree = git
        .find_commit(git2::Oid::from_str(&work.head).unwrap())
        .unwrap()
        .tree()
        .unwrap();
    let lib = tree.get_path(Path::new("src/lib.rs")).unwrap();
    assert_eq!(
        git.find_blob(lib.id()).unwrap().content(),
        b"pub fn z() {}\n"
    );
    assert!(tree.get_path(Path::new("src/old.rs")).is_err());
    assert!(tree.get_path(Path::new("new/file.rs")).is_ok());
    assert!(tree.get_path(Path::new("pipe")).is_err());
    assert!(tree.get_path(Path::new("many/f0007.txt")).is_ok());
}

/// A parked directory whose snapshot cannot be read (damaged, or written by another
/// version) is never reused: the next attempt checks out whole.
#[tokio::test]
async fn a_parked_directory_with_an_unreadable_snapshot_is_not_reused() {
    let f = fixture();
    let first = f.prepare("t1").await;
    let root_ino = ino(&first.path);
    f.release(&first).await;
    let parked = std::fs::read_dir(f.root.join(".parked"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::write(parked.join("index"), b"DIRC not ours").unwrap();
    let second = f.prepare("t2").await;
    assert_ne!(ino(&second.path), root_ino);
    assert_exactly_main(&f, &second);
}

/// Commits `files` (names as git's bytes, which need not be UTF-8; `None` removes) on main.
fn commit_named_bytes(repo: &Path, files: &[(&[u8], Option<&str>)]) {
    let git = git2::Repository::open(repo).unwrap();
    let head = git
        .find_reference("refs/heads/main")
        .unwrap()
        .peel_to_commit()
        .unwrap();
    let mut tree = git.treebuilder(Some(&head.tree().unwrap())).unwrap();
    for (name, content) in files {
        match content {
            Some(text) => {
                let blob = git.blob(text.as_bytes()).unwrap();
                tree.insert(name.to_vec(), blob, 0o100644).unwrap();
            }
            None => tree.remove(name.to_vec()).unwrap(),
        }
    }
    let tree = git.find_tree(tree.write().unwrap()).unwrap();
    let sig = git2::Signature::now("t", "t@example.com").unwrap();
    git.commit(
        Some("refs/heads/main"),
        &sig,
        &sig,
        "bytes",
        &tree,
        &[&head],
    )
    .unwrap();
}

/// git's names need not be UTF-8. The reset of a reused directory writes what the new
/// start changes by the names' bytes: a file changed on main under such a name holds the
/// new start's content, a new one is written, a removed one goes, and the seal then sees
/// only the agent's work (a name read through a lossy string once kept the old content
/// under HEAD's new one, which the next landing would have reverted).
#[tokio::test]
async fn a_reused_directory_is_reset_by_the_bytes_of_names_that_are_not_utf8() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let f = fixture();
    let (changed, added, removed): (&[u8], &[u8], &[u8]) =
        (b"caf\xe9.txt", b"na\xefve.txt", b"old\xff.txt");
    commit_named_bytes(
        f.repo.path(),
        &[(changed, Some("v1\n")), (removed, Some("going\n"))],
    );
    let first = f.prepare("t1").await;
    let on_disk =
        |ws: &Workspace, name: &[u8]| std::fs::read(ws.path.join(OsStr::from_bytes(name))).ok();
    assert_eq!(on_disk(&first, changed).as_deref(), Some(&b"v1\n"[..]));
    let root_ino = ino(&first.path);
    f.release(&first).await;
    commit_named_bytes(
        f.repo.path(),
        &[
            (changed, Some("v2\n")),
            (added, Some("new\n")),
            (removed, None),
        ],
    );

    let second = f.prepare("t2").await;
    assert_eq!(
        ino(&second.path),
        root_ino,
        "the released directory, reused"
    );
    assert_eq!(
        on_disk(&second, changed).as_deref(),
        Some(&b"v2\n"[..]),
        "the new start's content"
    );
    assert_eq!(
        on_disk(&second, added).as_deref(),
        Some(&b"new\n"[..]),
        "the new file written"
    );
    assert_eq!(on_disk(&second, removed), None, "the removed file gone");
    assert_eq!(
        git_cli(&second.path, &["status", "--porcelain"]),
        "",
        "git reads it as clean"
    );
    std::fs::write(second.path.join("src/more.rs"), "// more\n").unwrap();
    let work = f
        .worktrees
        .seal(second.clone(), "t2: more".into())
        .await
        .unwrap();
    let paths: Vec<&str> = work.files.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(paths, ["src/more.rs"], "only the agent's work");
    f.release(&second).await;
}

/// The reset that trusts the seal's walk (ADR-046 step a) undoes all an earlier agent did
/// that the walk saw: whatever it left, the next attempt's workspace holds main's tree and
/// nothing else, and nothing outside the workspace is touched through its links.
#[tokio::test]
async fn a_reset_that_trusts_the_seals_walk_undoes_everything_the_agent_left() {
    let f = fixture_with(true);
    let first = f.prepare("t1").await;
    let root_ino = ino(&first.path);
    let p = |rel: &str| first.path.join(rel);
    std::fs::write(p("evil.txt"), "untracked\n").unwrap();
    std::fs::create_dir_all(p("target/debug")).unwrap();
    std::fs::write(p("target/debug/build-script"), "#!/bin/sh\nsteal\n").unwrap();
    std::fs::create_dir_all(p("empty/deeper")).unwrap();
    let lib = p("src/lib.rs");
    let mtime = std::fs::metadata(&lib).unwrap().modified().unwrap();
    std::fs::write(&lib, "pub fn x() {}\npub fn y() {}\n").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&lib)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    std::fs::remove_file(p("src/old.rs")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", p("src/old.rs")).unwrap();
    std::fs::remove_dir_all(p("docs")).unwrap();
    std::os::unix::fs::symlink(f.repo.path(), p("docs")).unwrap();
    std::fs::set_permissions(p("tests/lib.rs"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::fs::set_permissions(p("tests"), std::fs::Permissions::from_mode(0o3777)).unwrap();
    std::fs::set_permissions(p("many"), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::hard_link(p(".gitignore"), p("linked")).unwrap();
    std::fs::remove_file(p("many/f0001.txt")).unwrap();
    std::fs::create_dir(p("many/f0001.txt")).unwrap();
    std::fs::write(p("many/f0001.txt/inner"), "inner\n").unwrap();
    std::fs::remove_file(p("many/f0002.txt")).unwrap();
    std::fs::write(
        p(".git"),
        format!("gitdir: {}\n", f.repo.path().join(".git").display()),
    )
    .unwrap();
    f.seal(&first).await;
    f.release_sealed(&first).await;
    assert!(
        f.parked_walk(&first).is_some(),
        "the walk's record is parked"
    );

    let second = f.prepare("t2").await;
    assert_eq!(ino(&second.path), root_ino, "the same directory, reused");
    assert_exactly_main(&f, &second);
    assert!(f.repo.path().join("docs/deep/notes.md").exists());
    assert_eq!(
        std::fs::read_to_string(f.repo.path().join("src/lib.rs")).unwrap(),
        "pub fn a() {}\npub fn b() {}\n"
    );
    f.release(&second).await;
    assert_checkout_untouched(f.repo.path());
}

/// What the trusting reset relies on: nothing writes into a directory between its seal's
/// walk and its park. Every way that could fail drops the record, and the reset walks:
/// a plain release (the Worker ran something after the seal), a run whose sandbox lets a
/// process outlive its command, a later seal (its own record), a record of another
/// directory or another snapshot, a damaged one, and one that leads through a link.
#[tokio::test]
async fn a_record_that_may_not_be_the_directorys_state_is_never_trusted() {
    let late = |ws: &Workspace| {
        std::fs::write(ws.path.join("late.txt"), "written after the seal\n").unwrap();
        std::fs::write(ws.path.join("src/lib.rs"), "late\n").unwrap();
    };
    let check = |f: &Fixture, ws: &Workspace, why: &str| {
        assert!(!ws.path.join("late.txt").exists(), "{why}");
        assert_exactly_main(f, ws);
    };

    // What the trust means, and why it needs all the rest: a sealed release under a
    // sandbox that ends every process parks the record, and without a watch of the tree
    // (a daemon restarted since its reset) the reset does not walk (a write nothing in
    // flotilla lets happen after a seal goes unseen).
    let f = fixture_with(true);
    let ws = f.prepare("t1").await;
    f.seal(&ws).await;
    flotilla::git::slots::forget_watch(&ws.path);
    late(&ws);
    f.release_sealed(&ws).await;
    assert!(f.parked_walk(&ws).is_some());
    let next = f.prepare("t2").await;
    assert!(
        next.path.join("late.txt").exists(),
        "the trusted reset did not walk"
    );
    f.release(&next).await;

    // With the tree's watch (ADR-052), the same late write is seen, and the reset walks.
    let f = fixture_with(true);
    let ws = f.prepare("t1").await;
    f.seal(&ws).await;
    late(&ws);
    f.release_sealed(&ws).await;
    assert!(f.parked_walk(&ws).is_some());
    let next = f.prepare("t2").await;
    check(&f, &next, "a write after the seal, which the watch saw");

    // The Worker ran something after the seal: a plain release.
    let f = fixture_with(true);
    let ws = f.prepare("t1").await;
    f.seal(&ws).await;
    late(&ws);
    f.release(&ws).await;
    assert!(f.parked_walk(&ws).is_none());
    let next = f.prepare("t2").await;
    check(&f, &next, "a plain release is walked");

    // `[sandbox] mode = "none"`: a process may outlive its command.
    let f = fixture_with(false);
    let ws = f.prepare("t1").await;
    f.seal(&ws).await;
    late(&ws);
    f.release_sealed(&ws).await;
    assert!(f.parked_walk(&ws).is_none());
    let next = f.prepare("t2").await;
    check(&f, &next, "without a sandbox that ends every process");

    // Sealed again after the write (a revision): that seal's record saw it.
    let f = fixture_with(true);
    let ws = f.prepare("t1").await;
    f.seal(&ws).await;
    late(&ws);
    f.seal(&ws).await;
    f.release_sealed(&ws).await;
    let next = f.prepare("t2").await;
    check(&f, &next, "the last seal's record");

    // Another directory's record, of another snapshot, in its place.
    let f = fixture_with(true);
    let a = f.prepare("t1").await;
    let b = f.prepare("t2").await;
    f.seal(&a).await;
    f.seal(&b).await;
    late(&b);
    let snap = f.root.join(".snap");
    std::fs::copy(snap.join("t1-a1.walk"), snap.join("t2-a1.walk")).unwrap();
    f.release(&a).await;
    f.release_sealed(&b).await;
    let c = f.prepare("t3").await;
    let d = f.prepare("t4").await;
    check(&f, &c, "a foreign record");
    check(&f, &d, "a foreign record");

    // A damaged record.
    let f = fixture_with(true);
    let ws = f.prepare("t1").await;
    f.seal(&ws).await;
    late(&ws);
    f.release_sealed(&ws).await;
    let walk = f.parked_walk(&ws).unwrap();
    let bytes = std::fs::read(&walk).unwrap();
    std::fs::write(&walk, &bytes[..bytes.len() - 2]).unwrap();
    let next = f.prepare("t2").await;
    check(&f, &next, "a damaged record");
}

/// A record is never followed through a link: one that names a path under a directory
/// that is now a link (to the user's checkout) is not the directory's state, and the reset
/// walks instead, touching nothing outside.
#[tokio::test]
async fn a_record_is_never_followed_through_a_link() {
    use flotilla::git::walk_record::WalkRecord;
    let f = fixture_with(true);
    let ws = f.prepare("t1").await;
    f.seal(&ws).await;
    f.release_sealed(&ws).await;
    let walk = f.parked_walk(&ws).unwrap();
    let tree = walk.with_file_name("tree");
    std::fs::remove_dir_all(tree.join("docs")).unwrap();
    std::os::unix::fs::symlink(f.repo.path(), tree.join("docs")).unwrap();
    let mut record = WalkRecord::read(&walk).unwrap();
    record.remove.push(b"docs/src/lib.rs".to_vec());
    record.missing.push(b"docs/deep/notes.md".to_vec());
    record.modes.push(b"docs/src".to_vec());
    record.write(&walk).unwrap();
    let next = f.prepare("t2").await;
    assert_exactly_main(&f, &next);
    assert!(f.repo.path().join("src/lib.rs").exists());
    assert!(f.repo.path().join("docs/deep/notes.md").exists());
    f.release(&next).await;
    assert_checkout_untouched(f.repo.path());
}

/// A command in `ws` that leaves a process of its own session behind, holding the fifo
/// `go` (in `fifos`) open for reading: once told (a line on `go`), it writes `late.txt`
/// into its working directory and says `done`. The command returns once that process is
/// up. The process holds none of the command's pipes: the runner's wait for them to close
/// must not be what ends it.
fn leaves_a_writer_behind(ws: &Workspace, fifos: &Path) -> flotilla_actors::ports::CommandSpec {
    for name in ["go", "ready", "done"] {
        let fifo = std::ffi::CString::new(fifos.join(name).to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    }
    let f = fifos.display();
    flotilla_actors::ports::CommandSpec::shell(
        format!(
            "setsid sh -c 'exec 3<>{f}/go; echo up > {f}/ready; read x <&3; \
             echo late > late.txt; echo done > {f}/done' </dev/null >/dev/null 2>&1 & \
             read x < {f}/ready"
        ),
        &ws.path,
    )
}

/// Whether some process has `fifo` open for reading (the writer left behind is alive).
fn has_reader(fifo: &Path) -> bool {
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(fifo)
        .is_ok()
}

/// Under bwrap (the default) every process a command started has ended when the command
/// returns, one in a session of its own included: the pid namespace's init exits with the
/// command, and the kernel ends the rest before bwrap can. So nothing can write into the
/// workspace after its seal, and the reset may trust the seal's walk.
#[tokio::test]
async fn under_bwrap_no_process_of_a_command_outlives_it_so_the_seal_is_trusted() {
    use flotilla::process::ConfinedRunner;
    use flotilla::sandbox::{SandboxConfig, SandboxPolicy};
    use flotilla_actors::ports::ProcessRunner;
    let f = fixture_with(true);
    let ws = f.prepare("t1").await;
    let fifos = tempfile::tempdir().unwrap();
    let config = SandboxConfig {
        writable: vec![fifos.path().display().to_string()],
        ..SandboxConfig::default()
    };
    let runner = ConfinedRunner::new(SandboxPolicy::for_run(&config, &[], f.repo.path()));
    let spec = leaves_a_writer_behind(&ws, fifos.path());
    let out = match runner
        .run(spec, tokio_util::sync::CancellationToken::new(), None)
        .await
    {
        Err(flotilla_actors::ports::ProcessError::SandboxUnavailable(_)) => {
            eprintln!("bwrap is not installed here: nothing to check");
            return;
        }
        out => out.unwrap(),
    };
    assert!(out.exit.success(), "{out:?}");
    assert!(
        !has_reader(&fifos.path().join("go")),
        "the process left behind is gone the moment the command returned"
    );
    f.seal(&ws).await;
    f.release_sealed(&ws).await;
    assert!(f.parked_walk(&ws).is_some(), "its walk is trusted");
    let next = f.prepare("t2").await;
    assert_exactly_main(&f, &next);
}

/// With `[sandbox] mode = "none"` a process that left its group outlives the command and
/// writes after the seal: the seal's walk is never trusted there, and the next reset
/// walks and undoes the late write.
#[tokio::test]
async fn without_a_sandbox_a_process_outlives_its_command_and_the_reset_walks() {
    use crate::process::unsandboxed;
    use flotilla::sandbox::SandboxMode;
    use flotilla_actors::ports::ProcessRunner;
    let runner = unsandboxed();
    // As the daemon wires it: trusted only where no process outlives its command.
    let f = fixture_with(runner.policy().mode == SandboxMode::Bwrap);
    let ws = f.prepare("t1").await;
    let fifos = tempfile::tempdir().unwrap();
    let spec = leaves_a_writer_behind(&ws, fifos.path());
    let out = runner
        .run(spec, tokio_util::sync::CancellationToken::new(), None)
        .await
        .unwrap();
    assert!(out.exit.success(), "{out:?}");
    assert!(
        has_reader(&fifos.path().join("go")),
        "it outlived the command"
    );
    f.seal(&ws).await;
    f.release_sealed(&ws).await;
    assert!(
        f.parked_walk(&ws).is_none(),
        "no record without a pid sandbox"
    );
    // It writes now, into the parked directory (its working directory moved with it).
    std::fs::write(fifos.path().join("go"), "go\n").unwrap();
    assert_eq!(
        std::fs::read_to_string(fifos.path().join("done")).unwrap(),
        "done\n"
    );
    let next = f.prepare("t2").await;
    assert!(!next.path.join("late.txt").exists());
    assert_exactly_main(&f, &next);
}

/// A command flotilla stops (a cancel; a time or silence limit) has bwrap killed first, and
/// the processes of its namespace end a moment later: its run returns only once they have,
/// so nothing a tool command started can write into the workspace after an agent's call
/// returned and its seal began.
#[tokio::test]
async fn under_bwrap_a_stopped_commands_processes_have_ended_when_its_run_returns() {
    use flotilla::sandbox::{SandboxConfig, SandboxPolicy};
    use flotilla_actors::ports::{Exit, ProcessRunner};
    let dir = tempfile::tempdir().unwrap();
    let fifos = tempfile::tempdir().unwrap();
    for name in ["go", "ready"] {
        let fifo = std::ffi::CString::new(fifos.path().join(name).to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    }
    let config = SandboxConfig {
        writable: vec![fifos.path().display().to_string()],
        ..SandboxConfig::default()
    };
    let policy = SandboxPolicy::for_run(&config, &[], Path::new("/nonexistent"));
    if flotilla::process::probe(&policy).await.is_err() {
        eprintln!("bwrap is not installed here: nothing to check");
        return;
    }
    let runner = flotilla::process::ConfinedRunner::new(policy);
    let f = fifos.path().display();
    let spec = flotilla_actors::ports::CommandSpec::shell(
        format!(
            "setsid sh -c 'exec 3<>{f}/go; echo up > {f}/ready; read x <&3; echo late > late.txt' & \
             exec sleep 100000"
        ),
        dir.path(),
    );
    // Opened before the command starts (never blocking): its first line says the process
    // left behind is up; the command ending first is a failure, not a wait.
    let mut ready = tokio::net::unix::pipe::OpenOptions::new()
        .read_write(true)
        .open_receiver(fifos.path().join("ready"))
        .unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    let mut running = tokio::spawn({
        let cancel = cancel.clone();
        async move { runner.run(spec, cancel, None).await }
    });
    let mut up = [0u8; 3];
    tokio::select! {
        read = tokio::io::AsyncReadExt::read_exact(&mut ready, &mut up) => {
            read.unwrap();
        }
        out = &mut running => panic!("the command ended first: {out:?}"),
    }
    assert_eq!(&up, b"up\n");
    assert!(has_reader(&fifos.path().join("go")), "it is up");
    cancel.cancel();
    let out = running.await.unwrap().unwrap();
    assert_eq!(out.exit, Exit::Cancelled);
    assert!(
        !has_reader(&fifos.path().join("go")),
        "every process of the namespace ended before the run returned"
    );
}

/// A watch on every directory and file of `ws`'s workspace, as its snapshot lists them
/// (ADR-052), with what was queued before discarded.
fn watch_workspace(f: &Fixture, ws: &Workspace) -> flotilla::git::watch::WorkspaceWatch {
    let snap = f.root.join(".snap").join(ws.path.file_name().unwrap());
    let snapshot = flotilla::git::snapshot::Snapshot::read(&snap).unwrap();
    let mut watch = flotilla::git::watch::WorkspaceWatch::new().unwrap();
    watch.watch(&ws.path, b"", true);
    for dir in snapshot.dirs() {
        watch.watch(&ws.path, dir, true);
    }
    for entry in &snapshot.entries {
        watch.watch(&ws.path, &entry.path, false);
    }
    assert!(watch.take().is_some(), "{:?}", watch.broken());
    watch
}

/// The seal of `ws` twice: by the one walk, and from what `watch` named. Both must find the
/// same tree, the same files left out, the same deletions and modes; the walk may list
/// more to remove (files written in the snapshot's own tick, never trusted by a stat),
/// never fewer, and each of those extra ones is exactly the snapshot's file.
fn both_seals_agree(
    f: &Fixture,
    ws: &Workspace,
    watch: &mut flotilla::git::watch::WorkspaceWatch,
) -> SealedBy {
    use flotilla::git::seal_walk::{seal_tree, seal_tree_with};
    use std::os::unix::ffi::OsStrExt;
    let snap = f.root.join(".snap").join(ws.path.file_name().unwrap());
    // The events first: the walk's own reads (each file it hashes) must not be among them.
    let changes = watch.take();
    let worktree = git2::Repository::open(&ws.path).unwrap();
    let tip = worktree.head().unwrap().peel_to_tree().unwrap();
    let walked = seal_tree(&worktree, &ws.path, &snap, &tip, 1 << 20).unwrap();
    let by_events = match &changes {
        Some(changes) => {
            seal_tree_with(&worktree, &ws.path, &snap, &tip, 1 << 20, Some(changes)).unwrap()
        }
        None => None,
    };
    let sorted = |mut v: Vec<Vec<u8>>| {
        v.sort();
        v.dedup();
        v
    };
    match (walked, by_events) {
        (Some(walked), Some(events)) => {
            assert_eq!(walked.tree, events.tree, "the trees differ: {changes:?}");
            assert_eq!(
                sorted_strings(walked.too_large),
                sorted_strings(events.too_large)
            );
            assert_eq!(
                sorted_strings(walked.hard_links),
                sorted_strings(events.hard_links)
            );
            assert_eq!(sorted(walked.walk.missing), sorted(events.walk.missing));
            assert_eq!(sorted(walked.walk.modes), sorted(events.walk.modes));
            let walk_remove = sorted(walked.walk.remove);
            let event_remove = sorted(events.walk.remove);
            for path in &event_remove {
                assert!(
                    walk_remove.contains(path),
                    "only the events remove {}",
                    String::from_utf8_lossy(path)
                );
            }
            let snapshot = flotilla::git::snapshot::Snapshot::read(&snap).unwrap();
            for path in walk_remove.iter().filter(|p| !event_remove.contains(p)) {
                let i = snapshot.find(path).unwrap_or_else(|| {
                    panic!("only the walk removes {}", String::from_utf8_lossy(path))
                });
                // A link's blob is its target (the walk may take a link whose stat the
                // reset changed, as it takes a file: its bytes must still be the
                // snapshot's).
                let full = ws.path.join(std::ffi::OsStr::from_bytes(path));
                let on_disk = match std::fs::symlink_metadata(&full).unwrap().is_symlink() {
                    true => std::fs::read_link(&full)
                        .unwrap()
                        .into_os_string()
                        .into_vec(),
                    false => std::fs::read(&full).unwrap(),
                };
                let id = git2::Oid::hash_object(git2::ObjectType::Blob, &on_disk).unwrap();
                assert_eq!(
                    id,
                    snapshot.entries[i].id,
                    "{}",
                    String::from_utf8_lossy(path)
                );
            }
            SealedBy::Both
        }
        // The walk itself leaves it to the whole add: so must the events.
        (None, events) => {
            assert!(events.is_none(), "only the events took it");
            SealedBy::Neither
        }
        (Some(_), None) => {
            assert!(
                changes.is_none(),
                "the events left to the whole add what the walk took"
            );
            SealedBy::WalkOnly
        }
    }
}

/// How a case was sealed, by the walk and from the events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SealedBy {
    Both,
    /// The watch broke (a directory moved): the seal walks.
    WalkOnly,
    /// Both leave it to the whole add.
    Neither,
}

fn sorted_strings(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[tokio::test]
async fn the_seal_from_a_watchs_events_finds_what_the_walk_finds() {
    let f = fixture();
    // Each case: what an agent does in a fresh workspace, by a shell script.
    let cases: &[(&str, &str, SealedBy)] = &[
        ("an edit", "echo changed >> src/lib.rs", SealedBy::Both),
        ("a mode", "chmod +x src/old.rs", SealedBy::Both),
        ("deletions", "rm src/old.rs && rm -r docs", SealedBy::Both),
        (
            "new files",
            "echo n > src/new.rs && mkdir -p a/b/c && echo d > a/b/c/deep.txt",
            SealedBy::Both,
        ),
        (
            "a hard link written through, then removed",
            "mkdir side && ln src/lib.rs side/l && echo via-link >> side/l && rm -r side",
            SealedBy::Both,
        ),
        (
            "a hard link kept",
            "ln tests/lib.rs tests/twin.rs",
            SealedBy::Both,
        ),
        (
            "a file made a link, a directory made a file",
            "rm src/old.rs && ln -s lib.rs src/old.rs && rm -r docs && echo file > docs",
            SealedBy::Both,
        ),
        (
            "a directory removed and made again",
            "rm -r many && mkdir many && echo again > many/f0001.txt",
            SealedBy::Both,
        ),
        (
            "ignored work",
            "mkdir -p target/debug && echo bin > target/debug/x && echo junk > src/x.o",
            SealedBy::Both,
        ),
        ("a rename", "mv src/old.rs src/renamed.rs", SealedBy::Both),
        (
            "the same size and an old mtime",
            "printf 'ONE\\nTWO\\nTHREE\\n' > src/old.rs && touch -d 2001-01-01 src/old.rs",
            SealedBy::Both,
        ),
        ("a directory's mode", "chmod 0777 docs/deep", SealedBy::Both),
        ("a truncation", "truncate -s 0 tests/lib.rs", SealedBy::Both),
        ("a directory moved", "mv docs documents", SealedBy::WalkOnly),
        (
            "a nested repository",
            "mkdir sub && git -C sub init -q",
            SealedBy::Neither,
        ),
        (
            "a write through a mapping",
            "python3 -c \"import mmap;f=open('src/lib.rs','r+b');m=mmap.mmap(f.fileno(),0);m[0:3]=b'PUB';m.close();f.close()\"",
            SealedBy::Both,
        ),
        (
            "a write through a mapping whose descriptor outlives its process",
            "python3 -c \"import mmap,socket,array;f=open('src/lib.rs','r+b');m=mmap.mmap(f.fileno(),0);m[0:3]=b'PUB';a,b=socket.socketpair();a.sendmsg([b'x'],[(socket.SOL_SOCKET,socket.SCM_RIGHTS,array.array('i',[f.fileno(),a.fileno(),b.fileno()]))])\"",
            SealedBy::Both,
        ),
        (
            "a directory made unreadable after an edit in it",
            "echo x >> docs/deep/notes.md && chmod 000 docs",
            SealedBy::Both,
        ),
    ];
    for (i, (case, script, expected)) in cases.iter().enumerate() {
        let ws = f.prepare(&format!("t{}", i + 1)).await;
        let mut watch = watch_workspace(&f, &ws);
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(&ws.path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{case}: {out:?}");
        let sealed = both_seals_agree(&f, &ws, &mut watch);
        // As root the permission case reads through; without root both leave it to the
        // whole add.
        let unprivileged = case.contains("unreadable") && sealed == SealedBy::Neither;
        assert!(sealed == *expected || unprivileged, "{case}: {sealed:?}");
        // Readable again, for the release.
        let _ = std::process::Command::new("chmod")
            .args(["-R", "u+rwx", "."])
            .current_dir(&ws.path)
            .status();
        f.release(&ws).await;
    }
}

/// Links main holds (ADR-052's "to add"): to a directory, to a file, to a path outside the
/// workspace. What an agent does through them or to them is sealed alike by the events and
/// by the walk (a directory's watch is on the directory, never through a link to it).
#[tokio::test]
async fn checked_out_links_are_sealed_alike_by_the_events_and_by_the_walk() {
    let f = fixture();
    let outside = f._state.path().join("outside.txt");
    std::fs::write(&outside, "not the workspace's\n").unwrap();
    let repo = f.repo.path();
    std::os::unix::fs::symlink("docs/deep", repo.join("linkdir")).unwrap();
    std::os::unix::fs::symlink("../src/lib.rs", repo.join("tests/linkfile")).unwrap();
    std::os::unix::fs::symlink(&outside, repo.join("linkout")).unwrap();
    git_cli(repo, &["add", "linkdir", "tests/linkfile", "linkout"]);
    git_cli(
        repo,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "commit",
            "-qm",
            "links",
        ],
    );
    let cases: &[(&str, &str)] = &[
        (
            "a write through a link to a directory",
            "echo via >> linkdir/notes.md",
        ),
        (
            "a new file through a link to a directory",
            "echo n > linkdir/new.md",
        ),
        (
            "a write through a link to a file",
            "echo via >> tests/linkfile",
        ),
        ("a link retargeted", "ln -sfn src linkdir"),
        (
            "a link to outside made a file",
            "rm linkout && echo mine > linkout",
        ),
        ("a write through a link to outside", "echo x >> linkout"),
        (
            "a link made a directory",
            "rm tests/linkfile && mkdir tests/linkfile && echo x > tests/linkfile/a",
        ),
    ];
    for (i, (case, script)) in cases.iter().enumerate() {
        let ws = f.prepare(&format!("t{}", i + 1)).await;
        assert_exactly_main(&f, &ws);
        let mut watch = watch_workspace(&f, &ws);
        let out = std::process::Command::new("sh")
            .args(["-c", script])
            .current_dir(&ws.path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{case}: {out:?}");
        assert_eq!(
            both_seals_agree(&f, &ws, &mut watch),
            SealedBy::Both,
            "{case}"
        );
        // And both are what git's own add of everything makes.
        let snap = f.root.join(".snap").join(ws.path.file_name().unwrap());
        let worktree = git2::Repository::open(&ws.path).unwrap();
        let tip = worktree.head().unwrap().peel_to_tree().unwrap();
        let walked = flotilla::git::seal_walk::seal_tree(&worktree, &ws.path, &snap, &tip, 1 << 20)
            .unwrap()
            .expect("sealed");
        git_cli(&ws.path, &["add", "-A"]);
        assert_eq!(
            git_cli(&ws.path, &["write-tree"]).trim(),
            walked.tree.to_string(),
            "{case}"
        );
        f.release(&ws).await;
    }
    // The one write through it went outside (no sandbox here); no reset wrote there.
    assert_eq!(
        std::fs::read_to_string(&outside).unwrap(),
        "not the workspace's\nx\n"
    );
}

/// An agent swaps two directories: the watch's map from watch to path is stale, so it
/// breaks and that seal walks; the next attempt in the same directory is reset over the
/// swapped directories and watched anew, and its seal names its work by the right paths
/// (a stale map would name `src`'s events as `tests/...`).
#[tokio::test]
async fn after_a_directory_swap_the_next_attempt_is_watched_by_the_right_paths() {
    let f = fixture_with(true);
    let first = f.prepare("t1").await;
    f.release_sealed(&first).await;
    let sh = |dir: &Path, script: &str| {
        let out = std::process::Command::new("sh")
            .args(["-c", script])
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{script}: {out:?}");
    };
    let ws = f.prepare("t2").await;
    let reused = ino(&ws.path);
    assert!(
        flotilla::git::slots::changes_for_seal(&ws.path).is_some(),
        "reused and watched"
    );
    sh(&ws.path, "mv src swap && mv tests src && mv swap tests");
    assert!(
        flotilla::git::slots::changes_for_seal(&ws.path).is_none(),
        "a directory moved: the watch is broken"
    );
    let (_, git, tree) = f.seal_for_its_tree(&ws).await;
    git_cli(&ws.path, &["add", "-A"]);
    assert_eq!(git_cli(&ws.path, &["write-tree"]).trim(), tree.to_string());
    assert!(
        git.find_tree(tree)
            .unwrap()
            .get_path(Path::new("src/swap"))
            .is_err()
    );
    f.release_sealed(&ws).await;

    let next = f.prepare("t3").await;
    assert_eq!(ino(&next.path), reused, "the swapped directory, reset");
    assert_exactly_main(&f, &next);
    sh(
        &next.path,
        "echo more >> src/lib.rs && echo t >> tests/lib.rs",
    );
    let named = flotilla::git::slots::changes_for_seal(&next.path).expect("watched anew");
    let named: Vec<String> = named
        .paths
        .iter()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    for path in ["src/lib.rs", "tests/lib.rs"] {
        assert!(named.contains(&path.to_string()), "{path} in {named:?}");
    }
    let (_, git, tree) = f.seal_for_its_tree(&next).await;
    git_cli(&next.path, &["add", "-A"]);
    assert_eq!(
        git_cli(&next.path, &["write-tree"]).trim(),
        tree.to_string()
    );
    let tree = git.find_tree(tree).unwrap();
    let lib = git
        .find_blob(tree.get_path(Path::new("src/lib.rs")).unwrap().id())
        .unwrap();
    assert!(String::from_utf8_lossy(lib.content()).ends_with("more\n"));
    f.release_sealed(&next).await;
}

/// Through the worker's own calls, under a sandbox that ends every process (ADR-052): the
/// seal takes the watch's events, commits what the agent did (a file changed through a
/// hard link since removed included), and the reused directory the next attempt gets is
/// exactly main's, by the record that seal wrote.
#[tokio::test]
async fn a_seal_by_events_commits_the_agents_work_and_the_next_reset_undoes_it() {
    let f = fixture_with(true);
    let first = f.prepare("t1").await;
    f.release_sealed(&first).await;
    // Reused and watched: its watch followed the reset.
    let ws = f.prepare("t2").await;
    let script = "mkdir side && ln src/lib.rs side/l && echo via-link >> side/l && rm -r side \
                  && echo new > src/new.rs && rm -r docs && mkdir -p a/b && echo d > a/b/c.txt";
    let out = std::process::Command::new("sh")
        .args(["-c", script])
        .current_dir(&ws.path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let named = flotilla::git::slots::changes_for_seal(&ws.path).expect("the tree is watched");
    let named: Vec<String> = named
        .paths
        .iter()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    for path in ["src/lib.rs", "src/new.rs", "docs", "a"] {
        assert!(named.contains(&path.to_string()), "{path} in {named:?}");
    }
    assert!(
        !named.iter().any(|p| p.starts_with("many/")),
        "only what changed is named: {named:?}"
    );
    let (_, git, tree) = f.seal_for_its_tree(&ws).await;
    let tree = git.find_tree(tree).unwrap();
    // git's own add of everything makes the very same tree.
    git_cli(&ws.path, &["add", "-A"]);
    assert_eq!(
        git_cli(&ws.path, &["write-tree"]).trim(),
        tree.id().to_string()
    );
    let lib = tree.get_path(Path::new("src/lib.rs")).unwrap();
    let lib = git.find_blob(lib.id()).unwrap();
    assert!(String::from_utf8_lossy(lib.content()).ends_with("via-link\n"));
    assert!(tree.get_path(Path::new("docs/deep/notes.md")).is_err());
    f.release_sealed(&ws).await;
    assert!(f.parked_walk(&ws).is_some());
    let next = f.prepare("t3").await;
    assert_exactly_main(&f, &next);
}
