//! The `Worktrees` port on git2: one worktree per attempt, under the state directory
//! (`worktrees/<run>/<task>-a<attempt>`), on the branch flotilla named for the attempt. The
//! target repository's own work tree and index are never touched: a worktree has its own
//! index and `HEAD`, and git keeps its bookkeeping in `.git/worktrees/<name>`.
//!
//! Every call runs on a blocking thread (git2 blocks, and `Repository` is not `Sync`). What
//! updates a ref or a worktree record (`.git/worktrees`) is serialized per repository across
//! the whole daemon (`repo_lock`), and nothing else (ADR-041): a worker's checkout, its
//! seal's hashing and the removal of its files run outside the lock, so the merge queue,
//! which needs the lock to move main and delete branches, never waits behind them. A
//! worktree is recorded locked (git's `worktree lock`) and unlocked once its files are all
//! there: a locked one is never reused.
//!
//! Sealing commits what the agent left (the safety-net commit, as flotilla), hashing only
//! the files whose stat changed since the checkout; `branch_work` is the diff against the
//! base, renames detected; then release and sweep. It must not know merging beyond a
//! conflict fix's start, or the daemon's journal.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use flotilla_actors::ports::{
    BranchFate, DiffText, RepoError, SweepKeep, Swept, Workspace, WorktreeRequest, WorktreeStart,
    Worktrees,
};
use flotilla_actors::protocol::{
    BranchWork, ChangeKind, RunId, TaskId, branch_name, branch_prefix,
};
use futures::future::BoxFuture;

use super::ancestry;
use super::background::Priority;
pub use super::branch_work::{MAX_SEALED_FILES, branch_work};
use super::conflict_fix::{conflict_fix_base, conflict_fix_commit};
use super::handles::{KeptRepo, RepoHandles, with_own_index};
use super::leftovers::{
    forget, prune, recorded_worktrees, remove_incomplete_records, remove_run_ref_locks,
};
use super::target::TargetBranch;
use super::{branch_tip, delete_branch, git, io, main_commit, repo_lock, signature};

/// The largest file the safety-net commit takes: anything bigger stays out of the branch
/// (and out of git's object store) and is named in the commit message.
pub const MAX_COMMITTED_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// The directory of a run's root (`worktrees/<run>/scratch`) that holds the scratch
/// checkouts of its MergeQueue and Reconciler. No attempt is named so (task ids are `t…`,
/// `f…`). Only a sweep of a run that is over removes it: after a restart, the queue's gate
/// may already be running there while the WorkerPool sweeps.
pub const SCRATCH_DIR: &str = "scratch";

pub struct GitWorktrees {
    repo: PathBuf,
    /// Kept handles of `repo`, shared with its merge queue (ADR-051).
    handles: Arc<RepoHandles>,
    run: RunId,
    /// This run's worktrees: `<state>/worktrees/<run>`.
    root: PathBuf,
    /// The repository's pool of parked directories earlier runs left (ADR-052), beside it.
    pool: Option<PathBuf>,
    /// What this run's closing sweep leaves there: None, nothing (the pool as it is).
    leave: Option<Leave>,
    /// The branch the run lands on (ADR-022): where attempts start from.
    target: TargetBranch,
    hook: Option<UnlockedHook>,
    /// No process of a command outlives it (the run's sandbox is bwrap's): a seal's walk
    /// may stand for the next reset's (ADR-046 step a).
    trust_seals: Option<fn() -> bool>,
}

/// The long parts of a worker's git work, done without the repository's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unlocked {
    /// Filling a new worktree with the files of its branch.
    Checkout,
    /// Hashing what the agent changed and writing the seal's commit (before its ref moves).
    Seal,
}

/// Called as each [`Unlocked`] part starts (tests block in it to show what the lock is not
/// held across).
pub type UnlockedHook = Arc<dyn Fn(Unlocked) + Send + Sync>;

/// Runs `work` under `repo`'s lock: only ref and worktree-record updates do.
fn locked<T>(repo: &Path, work: impl FnOnce() -> T) -> T {
    let lock = repo_lock(repo);
    let _held = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    work()
}

impl GitWorktrees {
    /// `root` is the directory for this run's worktrees (created when the first one is);
    /// attempts start from `target`'s tip.
    pub fn new(
        repo: impl Into<PathBuf>,
        run: RunId,
        root: impl Into<PathBuf>,
        target: TargetBranch,
    ) -> Self {
        let repo = repo.into();
        let root = root.into();
        GitWorktrees {
            handles: RepoHandles::shared(&repo),
            pool: root
                .parent()
                .and_then(|worktrees| super::slots::repository_pool(worktrees, &repo)),
            leave: None,
            repo,
            run,
            root,
            target,
            hook: None,
            trust_seals: None,
        }
    }

    /// Whether every process of a command run in a workspace has ended when the command
    /// returns (bwrap's pid namespace; never with `[sandbox] mode = "none"`, where a
    /// process can leave its group and write later). Only then does a release the Worker
    /// calls sealed ([`Worktrees::release_sealed`]) let the next reset trust the seal's
    /// walk instead of walking again, and only while `still` says so, asked at each
    /// release (the daemon's: every sandboxed command seen to end, `process::every_end_seen`).
    /// Off unless set.
    pub fn trusting_seals(
        mut self,
        processes_end_with_commands: bool,
        still: fn() -> bool,
    ) -> Self {
        self.trust_seals = processes_end_with_commands.then_some(still);
        self
    }

    /// The directories parked when the run ends may wait for the repository's next run, in
    /// its pool, while they take at most `budget_mb` MiB of disk with what the pool holds
    /// (`[worktrees] pool_budget_mb`; ADR-052), and only while `still` says so as the
    /// closing sweep runs (the daemon's: every sandboxed command seen to end); 0 empties
    /// the pool. None are left unless set.
    pub fn leaving_for_next_run(mut self, budget_mb: u64, still: fn() -> bool) -> Self {
        self.leave = Some(Leave {
            budget_bytes: budget_mb.saturating_mul(1024 * 1024),
            still,
        });
        self
    }

    /// Calls `hook` as each part done without the lock starts (tests).
    #[cfg(any(test, feature = "testing"))]
    pub fn with_unlocked_hook(mut self, hook: UnlockedHook) -> Self {
        self.hook = Some(hook);
        self
    }

    /// The target repository.
    pub fn repository(&self) -> &Path {
        &self.repo
    }

    fn dir_name(task: &TaskId, attempt: u32) -> String {
        format!("{task}-a{attempt}")
    }

    fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Place) -> Result<T, RepoError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, RepoError>> {
        self.on(Priority::Lowered, work)
    }

    fn on<T: Send + 'static>(
        &self,
        priority: Priority,
        work: impl FnOnce(&Place) -> Result<T, RepoError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, RepoError>> {
        let place = Place {
            repo: self.repo.clone(),
            handles: self.handles.clone(),
            run: self.run,
            root: self.root.clone(),
            pool: self.pool.clone(),
            leave: self.leave,
            target: self.target.clone(),
            hook: self.hook.clone(),
            trust_seals: self.trust_seals,
        };
        Box::pin(async move {
            // Below the landing's priority, but a sweep (ADR-049): the queue never waits
            // behind a worker.
            super::background::spawn_at(priority, move || work(&place))
                .await
                .map_err(|e| RepoError::Git(format!("the git thread failed: {e}")))?
        })
    }
}

/// What a blocking call needs to know.
/// What a run's closing sweep leaves in its repository's pool
/// ([`GitWorktrees::leaving_for_next_run`]).
#[derive(Clone, Copy)]
struct Leave {
    /// The disk the directories may take with the others (0: none, and the pool emptied).
    budget_bytes: u64,
    /// Asked as the sweep runs: false, and the pool stays as it is.
    still: fn() -> bool,
}

struct Place {
    repo: PathBuf,
    handles: Arc<RepoHandles>,
    run: RunId,
    root: PathBuf,
    pool: Option<PathBuf>,
    leave: Option<Leave>,
    target: TargetBranch,
    hook: Option<UnlockedHook>,
    trust_seals: Option<fn() -> bool>,
}

impl Place {
    /// A kept handle of the repository (ADR-051), given back when dropped.
    fn open(&self) -> Result<KeptRepo, RepoError> {
        self.handles.open()
    }

    /// git's name for a worktree (`.git/worktrees/<name>`): unique per run and attempt.
    fn worktree_name(&self, dir_name: &str) -> String {
        format!("flotilla-{}-{dir_name}", self.run.as_uuid().simple())
    }

    fn name_prefix(&self) -> String {
        self.worktree_name("")
    }

    fn unlocked(&self, part: Unlocked) {
        if let Some(hook) = &self.hook {
            hook(part);
        }
    }
}

fn run_has_ended() -> RepoError {
    RepoError::Git("the run has ended: no worktree is made for it any more".into())
}

/// Runs whose worktrees were swept for good (the run ended): no worktree is made for them
/// again. Checked and set under the repository's lock, so a `prepare` queued behind the
/// final sweep is refused, never leaked.
fn closed_runs() -> &'static Mutex<HashSet<RunId>> {
    static CLOSED: OnceLock<Mutex<HashSet<RunId>>> = OnceLock::new();
    CLOSED.get_or_init(Default::default)
}

fn run_closed(run: RunId) -> bool {
    closed_runs()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .contains(&run)
}

/// The task and attempt a worktree's directory name (`<task>-a<attempt>`) stands for.
fn attempt_of(dir_name: &str) -> Option<(TaskId, u32)> {
    let (task, attempt) = dir_name.rsplit_once("-a")?;
    Some((task.parse().ok()?, attempt.parse().ok()?))
}

/// The worktree git registered as `name`, opened through the repository's own records
/// (`.git/worktrees/<name>`), never through the `.git` file in the worktree: an agent can
/// rewrite that file to point anywhere, the user's repository included. Its work tree must
/// be `path`.
fn open_worktree(
    repo: &git2::Repository,
    name: &str,
    path: &Path,
) -> Result<git2::Repository, RepoError> {
    let worktree = repo.find_worktree(name).map_err(git)?;
    worktree.validate().map_err(git)?;
    let opened = git2::Repository::open_from_worktree(&worktree).map_err(git)?;
    let same = |a: &Path, b: &Path| {
        std::fs::canonicalize(a)
            .ok()
            .is_some_and(|a| std::fs::canonicalize(b).ok() == Some(a))
    };
    match opened.workdir() {
        Some(workdir) if same(workdir, path) => Ok(opened),
        _ => Err(RepoError::Git(format!(
            "worktree {name} is not at {}",
            path.display()
        ))),
    }
}

/// `name` is a live worktree at `path` with `branch` checked out, its files all there (a
/// worktree stays locked until they are).
fn reusable(repo: &git2::Repository, name: &str, path: &Path, branch: &str) -> bool {
    let filled = repo
        .find_worktree(name)
        .and_then(|w| w.is_locked())
        .is_ok_and(|lock| matches!(lock, git2::WorktreeLockStatus::Unlocked));
    filled
        && open_worktree(repo, name, path)
            .ok()
            .and_then(|w| w.head().ok().and_then(|h| h.name().ok().map(String::from)))
            .is_some_and(|head| head == format!("refs/heads/{branch}"))
}

/// Reads and the conflict fix's start (objects, not refs) go without the lock; the branch
/// and the worktree's record under it; the files after it, then the worktree is unlocked.
fn prepare(place: &Place, request: &WorktreeRequest) -> Result<Workspace, RepoError> {
    if run_closed(place.run) {
        return Err(run_has_ended());
    }
    let repo = place.open()?;
    let dir_name = GitWorktrees::dir_name(&request.task, request.attempt);
    let name = place.worktree_name(&dir_name);
    let path = place.root.join(&dir_name);
    let main = main_commit(&repo, &place.target)?.ok_or_else(|| {
        RepoError::Git(format!(
            "branch {} has no commits (or does not exist): a task branch needs one to start from",
            place.target
        ))
    })?;
    let existing = branch_tip(&repo, &request.branch)?;
    // A retry in place continues the failed attempt's branch while it is there (ADR-031).
    let continued = match &request.start {
        WorktreeStart::Continue { branch } => branch_tip(&repo, branch)?.map(|tip| (branch, tip)),
        _ => None,
    };
    // Where the branch left main, and where a new one starts.
    let (base, start) = match (&existing, &request.start, &continued) {
        // A conflict fix's first commit is flotilla's merge of the task branch onto main:
        // the fix is what comes after it.
        (Some(tip), WorktreeStart::ConflictFix { .. }, _) => {
            (conflict_fix_base(&repo, main.id(), *tip)?, None)
        }
        // The branch left main where main and it last agreed.
        (Some(tip), WorktreeStart::Main | WorktreeStart::Continue { .. }, _) => (
            ancestry::merge_base(&repo, main.id(), *tip).map_err(git)?,
            None,
        ),
        // At the failed attempt's tip; its diff from where that branch left main holds
        // both attempts' work, so the scope check sees what the first one did too.
        (None, WorktreeStart::Continue { .. }, Some((_, tip))) => (
            ancestry::merge_base(&repo, main.id(), *tip).map_err(git)?,
            Some(*tip),
        ),
        (None, WorktreeStart::Main | WorktreeStart::Continue { .. }, _) => {
            (main.id(), Some(main.id()))
        }
        (None, WorktreeStart::ConflictFix { branch }, _) => {
            let merged = conflict_fix_commit(&repo, &place.target, &main, branch)?;
            (merged, Some(merged))
        }
    };
    let continued_from = continued.map(|(branch, _)| branch.clone());
    if existing.is_some() && reusable(&repo, &name, &path, &request.branch) {
        // Reopened (a synthesis, a restart): whatever its last seal's walk saw, it runs
        // again now.
        super::slots::forget_walk(&place.root, &path)?;
        return Ok(Workspace {
            path,
            branch: request.branch.clone(),
            base: base.to_string(),
            continued_from,
        });
    }
    let worktree = locked(&place.repo, || {
        // Checked again under the lock, which the run's final sweep takes to close it.
        if run_closed(place.run) {
            return Err(run_has_ended());
        }
        // Whatever is at the path (a crash mid-way, a stale entry) goes before a fresh
        // checkout, and so does any record of the run a kill left half made.
        remove_incomplete_records(&repo, &place.name_prefix())?;
        prune(&repo, &name, &path)?;
        if let Some(start) = start {
            let start = repo.find_commit(start).map_err(git)?;
            // Recorded: a kill inside it leaves the branch's lock (`ref_lock`).
            let refname = format!("refs/heads/{}", request.branch);
            super::ref_lock::guarded_to(&repo, &refname, start.id(), || {
                repo.branch(&request.branch, &start, false)
            })?
            .map_err(git)?;
        }
        std::fs::create_dir_all(&place.root).map_err(|e| io("cannot create", &place.root, e))?;
        add_record(&repo, &name, &path, &request.branch).inspect_err(|_| {
            // What was made before the failure (the record, half made) goes.
            let _ = prune(&repo, &name, &path);
        })
    })?;
    let filled = super::slots::materialize(
        &place.root,
        place.pool.as_deref(),
        &path,
        &|| open_worktree(&repo, &name, &path),
        &|| place.unlocked(Unlocked::Checkout),
        place.trust_seals.is_some(),
    )
    .map(|_| ());
    locked(&place.repo, || {
        let done = filled.and_then(|()| {
            if run_closed(place.run) {
                return Err(run_has_ended());
            }
            worktree.unlock().map_err(git)
        });
        if done.is_err() {
            // Half filled, or its run closed meanwhile: nothing of it stays.
            let _ = prune(&repo, &name, &path);
        }
        done
    })?;
    Ok(Workspace {
        path,
        branch: request.branch.clone(),
        base: base.to_string(),
        continued_from,
    })
}

/// Records worktree `name` at `path` on `branch`, locked, with nothing checked out: the
/// files `git_worktree_add` writes, in its order, so that a kill leaves the half-made
/// records [`remove_incomplete_records`] heals. Not libgit2's own call: it opens every
/// worktree's repository to see whether one has the branch checked out, then the new one
/// to check out nothing, all under the repository's lock, which the landing's move of main
/// waits for (ADR-041, stop 38's amendment). The check reads the `HEAD` files instead.
fn add_record(
    repo: &git2::Repository,
    name: &str,
    path: &Path,
    branch: &str,
) -> Result<git2::Worktree, RepoError> {
    use std::io::Write;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let refname = format!("refs/heads/{branch}");
    // The branch is there (the caller made it or found it): a `HEAD` never names nothing.
    repo.find_reference(&refname).map_err(git)?;
    if let Some(holder) =
        super::checked_out_in(repo.commondir(), refname.as_bytes()).map_err(git)?
    {
        return Err(RepoError::Git(format!(
            "reference {refname} is already checked out in {holder}"
        )));
    }
    let mkdir = |dir: &Path| std::fs::DirBuilder::new().mode(0o755).create(dir);
    // Each file in one write, as libgit2 writes them.
    let write_new = |file: &Path, parts: &[&[u8]]| {
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(file)
            .and_then(|mut f| f.write_all(&parts.concat()));
        written.map_err(|e| io("cannot write", file, e))
    };
    let real = |p: &Path| std::fs::canonicalize(p).map_err(|e| io("cannot resolve", p, e));
    let records = repo.commondir().join("worktrees");
    match mkdir(&records) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(io("cannot create", &records, e));
        }
        _ => {}
    }
    let record = records.join(name);
    mkdir(&record).map_err(|e| io("cannot create", &record, e))?;
    mkdir(path).map_err(|e| io("cannot create", path, e))?;
    let (record_real, path_real) = (real(&record)?, real(path)?);
    let common_real = real(repo.commondir())?;
    write_new(&record.join("locked"), &[])?;
    write_new(
        &path.join(".git"),
        &[b"gitdir: ", record_real.as_os_str().as_bytes(), b"/\n"],
    )?;
    write_new(
        &record.join("commondir"),
        &[common_real.as_os_str().as_bytes(), b"/\n"],
    )?;
    write_new(
        &record.join("gitdir"),
        &[path_real.as_os_str().as_bytes(), b"/.git\n"],
    )?;
    // Through `HEAD.lock`, as libgit2 writes it: a record a kill leaves has a whole `HEAD`
    // or none (and so is healed, `remove_incomplete_records`).
    let staged = record.join("HEAD.lock");
    write_new(&staged, &[b"ref: ", refname.as_bytes(), b"\n"])?;
    let head = record.join("HEAD");
    std::fs::rename(&staged, &head).map_err(|e| io("cannot write", &head, e))?;
    repo.find_worktree(name).map_err(git)
}

/// Commits what is in the worktree on top of the branch's tip (as flotilla), whatever the
/// worktree's HEAD and index say: an agent that switched branches or staged half its work
/// still gets all of it on the branch flotilla named. Files over
/// [`MAX_COMMITTED_FILE_BYTES`] stay out and are named in the message. Returns the branch's
/// tip after it, and whether a commit was made.
fn commit_leftovers(
    place: &Place,
    repo: &git2::Repository,
    worktree: &git2::Repository,
    workspace: &Workspace,
    subject: &str,
    hard_links: &mut Vec<String>,
) -> Result<(git2::Oid, bool), RepoError> {
    let reference = format!("refs/heads/{}", workspace.branch);
    let tip = repo
        .find_reference(&reference)
        .and_then(|r| r.peel_to_commit())
        .map_err(git)?;
    // One walk against flotilla's snapshot of the checkout (ADR-046); libgit2's whole add
    // where that walk meets what only it knows how to take.
    let snap = place
        .root
        .join(super::slots::SNAP_DIR)
        .join(dir_name_of(&workspace.path));
    let tip_tree = tip.tree().map_err(git)?;
    // What the workspace's watch named (ADR-052), where no process of a command outlives
    // it: the events are then complete when the seal reads them. Else the one walk.
    let changes = if place.trust_seals.is_some_and(|still| still()) {
        super::slots::changes_for_seal(&workspace.path)
    } else {
        None
    };
    let (tree_id, mut too_large) = match super::seal_walk::seal_tree_with(
        worktree,
        &workspace.path,
        &snap,
        &tip_tree,
        MAX_COMMITTED_FILE_BYTES,
        changes.as_ref(),
    )? {
        Some(sealed) => {
            // For the next reset, if nothing writes here before the release (ADR-046 a).
            if let Some(record) = super::slots::walk_record_path(&place.root, &workspace.path) {
                sealed.walk.write(&record)?;
            }
            hard_links.extend(sealed.hard_links);
            (sealed.tree, sealed.too_large)
        }
        None => super::seal_walk::whole_add(
            repo,
            worktree,
            &workspace.path,
            &tip_tree,
            MAX_COMMITTED_FILE_BYTES,
            hard_links,
        )?,
    };
    if tree_id == tip.tree_id() {
        return Ok((tip.id(), false));
    }
    let tree = repo.find_tree(tree_id).map_err(git)?;
    // The task's subject, so main's history says what the commit is for once it lands.
    let subject = match subject.trim() {
        "" => "flotilla: the work an agent left uncommitted",
        subject => subject,
    };
    let mut message = format!(
        "{subject}\n\nCommitted by flotilla: the agent left this work uncommitted on {}.",
        workspace.branch
    );
    if !too_large.is_empty() {
        too_large.sort();
        too_large.dedup();
        message.push_str(&format!(
            "\n\nLeft out (over {} MiB): {}",
            MAX_COMMITTED_FILE_BYTES / (1024 * 1024),
            too_large.join(", ")
        ));
    }
    let sig = signature()?;
    let commit = repo
        .commit(None, &sig, &sig, &message, &tree, &[&tip])
        .map_err(git)?;
    // Only this branch moves, and only from the tip just read; the one step under the lock.
    // A kill inside it leaves `<ref>.lock` on the attempt's branch: recorded for the heal
    // (ref_lock).
    locked(&place.repo, || {
        super::ref_lock::guarded_to(repo, &reference, commit, || {
            repo.reference_matching(
                &reference,
                commit,
                true,
                tip.id(),
                "flotilla: safety-net commit",
            )
        })
    })?
    .map_err(git)?;
    Ok((commit, true))
}

fn dir_name_of(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn seal(place: &Place, workspace: &Workspace, subject: &str) -> Result<BranchWork, RepoError> {
    let repo = place.open()?;
    let name = place.worktree_name(&dir_name_of(&workspace.path));
    let worktree = open_worktree(&repo, &name, &workspace.path)?;
    let mut hard_links = Vec::new();
    // An earlier seal's walk says nothing of what ran since; this one writes its own.
    super::slots::forget_walk(&place.root, &workspace.path)?;
    place.unlocked(Unlocked::Seal);
    let (head, committed) =
        commit_leftovers(place, &repo, &worktree, workspace, subject, &mut hard_links)?;
    let base = match git2::Oid::from_str(&workspace.base) {
        Ok(base) => base,
        Err(_) => {
            let main = main_commit(&repo, &place.target)?
                .ok_or_else(|| {
                    RepoError::Git(format!(
                        "branch {} has no commits (or does not exist)",
                        place.target
                    ))
                })?
                .id();
            ancestry::merge_base(&repo, main, head).map_err(git)?
        }
    };
    // The diff's attribute lookups (a file's `diff` driver: `binary`, `-diff`) read the
    // work tree's `.gitattributes`, `info/attributes` and the config's files; libgit2 also
    // loads the handle's index for them, which is the user's checkout's, read whole each
    // seal (a kept handle drops it when given back). An empty in-memory one instead
    // (ADR-046).
    let mut no_index = git2::Index::new().map_err(git)?;
    let mut work = with_own_index(&repo, &mut no_index, || {
        branch_work(&repo, &workspace.branch, base, head)
    })??;
    work.committed_for_agent = committed;
    // Hard links: those left out of the commit above, and those the agent committed itself
    // (git cannot tell them from files; the worktree can).
    for file in &work.files {
        use std::os::unix::fs::MetadataExt;
        if file.change != ChangeKind::Deleted
            && std::fs::symlink_metadata(workspace.path.join(&file.path))
                .is_ok_and(|m| m.is_file() && m.nlink() > 1)
        {
            hard_links.push(file.path.clone());
        }
    }
    if !hard_links.is_empty() {
        work.links_outside.extend(hard_links);
        work.links_outside.sort();
        work.links_outside.dedup();
    }
    Ok(work)
}

/// The worktree's record and (with its fate) its branch go under the lock; then its
/// directory is parked (renames, under the lock too) or deleted (after it, ADR-044). A
/// kill in between leaves a directory git no longer knows, which the next sweep removes.
/// `sealed`: the Worker's word that nothing ran in it since its seal's walk (ADR-046 a).
fn release(
    place: &Place,
    workspace: &Workspace,
    fate: BranchFate,
    sealed: bool,
) -> Result<(), RepoError> {
    let repo = place.open()?;
    let name = place.worktree_name(&dir_name_of(&workspace.path));
    locked(&place.repo, || {
        forget(&repo, &name)?;
        if fate == BranchFate::Delete {
            delete_branch(&repo, &workspace.branch)?;
        }
        // The failed attempt this one continued: its work is on this branch now.
        if let Some(continued) = &workspace.continued_from {
            delete_branch(&repo, continued)?;
        }
        Ok::<_, RepoError>(())
    })?;
    // Parked for a later attempt of the run (ADR-044), unless the run is over; else deleted.
    let parked = locked(&place.repo, || {
        let trusted = sealed && place.trust_seals.is_some_and(|still| still());
        !run_closed(place.run) && super::slots::park(&place.root, &workspace.path, trusted)
    });
    if parked {
        return Ok(());
    }
    super::slots::discard(&place.root, &workspace.path)
}

fn sweep(place: &Place, keep: &SweepKeep) -> Result<Swept, RepoError> {
    if keep.closing {
        // Before anything that may fail: the run's records kept in memory (ADR-052) go with
        // it, or an idle daemon would hold them.
        super::snapshot::forget_records_below(&place.root);
        // Under the repository's lock, like every prepare: none of this run's can follow.
        closed_runs()
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(place.run);
    }
    let repo = place.open()?;
    // Stale ref locks of the run's branches (a process killed while it moved one): a sweep
    // runs before any attempt of a restarted run, or after the run, when nothing of it
    // writes a ref; left there they would keep the branch from moving or going. First: a
    // branch deleted below with its lock still there failed the whole sweep.
    if keep.delivered.is_some() || keep.closing {
        remove_run_ref_locks(&repo, place.run)?;
    }
    let mut swept = Swept::default();
    let prefix = place.name_prefix();
    remove_incomplete_records(&repo, &prefix)?;
    let mut kept = Vec::new();
    // Deleted once every record is pruned: libgit2 refuses to delete a branch while a
    // record it cannot read is there (it takes it for the branch's checkout).
    let mut unrecorded = Vec::new();
    for name in recorded_worktrees(&repo, &prefix)? {
        let name = name.as_str();
        let Some(dir_name) = name.strip_prefix(&prefix) else {
            continue;
        };
        let path = place.root.join(dir_name);
        // The branch is the one flotilla named for the attempt, read from the worktree's
        // name, never from what the worktree has checked out (an agent may have switched).
        let branch =
            attempt_of(dir_name).map(|(task, attempt)| branch_name(place.run, &task, attempt));
        if branch.as_ref().is_some_and(|b| keep.worktrees.contains(b)) {
            kept.push(path);
            continue;
        }
        prune(&repo, name, &path)?;
        swept.worktrees.push(path);
        if let Some(branch) = branch
            && !keep.branches.contains(&branch)
        {
            unrecorded.push(branch);
        }
    }
    for branch in unrecorded {
        if delete_branch(&repo, &branch)? {
            swept.branches.push(branch);
        }
    }
    // Directories git no longer knows (a crash between making the directory and
    // registering it). The scratch checkouts' directory is in use while the run lives.
    // The pool of parked directories and what a crash left of parking or claiming.
    // Once the run is over no directory is parked again: every snapshot goes.
    // A run that is over leaves a few to the next run of the repository (ADR-052).
    let leave_for = match (place.pool.as_deref(), place.leave) {
        (Some(pool), Some(leave)) if keep.closing && leave.budget_bytes == 0 => {
            super::slots::empty_pool(pool);
            None
        }
        (Some(pool), Some(leave)) if keep.closing && (leave.still)() => {
            Some((pool, place.repo.as_path(), leave.budget_bytes))
        }
        _ => None,
    };
    super::slots::sweep(
        &place.root,
        if keep.closing { &[] } else { &kept },
        leave_for,
    )?;
    if let Ok(entries) = std::fs::read_dir(&place.root) {
        for entry in entries.flatten() {
            let path = entry.path();
            if super::slots::is_slot_entry(&entry.file_name()) {
                continue;
            }
            if !keep.closing && entry.file_name() == SCRATCH_DIR {
                kept.push(path);
                continue;
            }
            if !kept.contains(&path) && !swept.worktrees.contains(&path) {
                super::slots::remove_workspace(&path)?;
                swept.worktrees.push(path);
            }
        }
    }
    // Branches of attempts the journal does not record as delivered.
    if let Some(delivered) = &keep.delivered {
        let ours = branch_prefix(place.run);
        let mut doomed = Vec::new();
        for branch in repo.branches(Some(git2::BranchType::Local)).map_err(git)? {
            let (branch, _) = branch.map_err(git)?;
            if let Some(name) = branch.name().ok().flatten()
                && name.starts_with(&ours)
                && !delivered.iter().any(|d| d == name)
                && !keep.worktrees.iter().any(|k| k == name)
                && !keep.branches.iter().any(|k| k == name)
            {
                doomed.push(name.to_string());
            }
        }
        for name in doomed {
            if delete_branch(&repo, &name)? {
                swept.branches.push(name);
            }
        }
    }
    if keep.worktrees.is_empty() {
        // Nothing of the run is left in it (an error here only means something is).
        let _ = std::fs::remove_dir(&place.root);
    }
    Ok(swept)
}

impl Worktrees for GitWorktrees {
    fn prepare(
        &self,
        request: WorktreeRequest,
    ) -> BoxFuture<'static, Result<Workspace, RepoError>> {
        self.blocking(move |place| prepare(place, &request).map_err(RepoError::storage_or_self))
    }

    fn seal(
        &self,
        workspace: Workspace,
        subject: String,
    ) -> BoxFuture<'static, Result<BranchWork, RepoError>> {
        self.blocking(move |place| seal(place, &workspace, &subject))
    }

    /// Reads objects only: no repository lock (the seal made them; nothing rewrites them).
    fn diff(
        &self,
        _workspace: &Workspace,
        work: &BranchWork,
        max_bytes: usize,
    ) -> BoxFuture<'static, Result<DiffText, RepoError>> {
        let repo = self.repo.clone();
        let (base, head) = (work.base.clone(), work.head.clone());
        Box::pin(async move {
            super::background::spawn(move || {
                super::diff::patch_text(&repo, &base, &head, max_bytes)
            })
            .await
            .map_err(|e| RepoError::Git(format!("the git thread failed: {e}")))?
        })
    }

    fn release(
        &self,
        workspace: Workspace,
        fate: BranchFate,
    ) -> BoxFuture<'static, Result<(), RepoError>> {
        self.blocking(move |place| release(place, &workspace, fate, false))
    }

    fn release_sealed(
        &self,
        workspace: Workspace,
        fate: BranchFate,
    ) -> BoxFuture<'static, Result<(), RepoError>> {
        self.blocking(move |place| release(place, &workspace, fate, true))
    }

    fn sweep(&self, keep: SweepKeep) -> BoxFuture<'static, Result<Swept, RepoError>> {
        self.on(Priority::Daemon, move |place| {
            locked(&place.repo, || sweep(place, &keep))
        })
    }
}
