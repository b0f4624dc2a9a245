//! Warm trees (ADR-042): the persistent checkouts the merge gate and the Reconciler's sweeps
//! run their commands in, one per [`WarmSlot`], under the run's scratch directory.
//!
//! Each is a standalone repository, not a linked worktree of the target: its `.git` borrows
//! the target's objects through `objects/info/alternates` and has no remote and no branch,
//! so nothing run there can name, let alone move, the target's refs; under the sandbox the
//! target's `.git` is read-only and the tree's own directory the only writable place.
//!
//! What the daemon does here never trusts what a gate left:
//! - the tree's `.git` is made anew before every run (a gate may have pointed it, or its
//!   `core.worktree`, anywhere); only the index is carried over, and only the copy the
//!   daemon took right after the last update, kept outside the tree (so a gate can neither
//!   forge the stat data that makes git skip a file nor see the copy);
//! - the daemon writes no file inside the work tree: the update to a commit is a
//!   `git checkout --force` plus `git clean` the caller runs in the sandbox, so a link the
//!   gate planted leads nowhere the sandbox does not already allow;
//! - measuring the tree never follows links, and removing it never does either.
//!
//! What carries over between runs is every ignored file (`target/`, `node_modules/`,
//! `.venv`); tracked files are rewritten only where they differ; untracked, not ignored
//! files are removed. A tree over the budget is thrown away whole.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flotilla_actors::ports::{RepoError, WarmSlot, WarmTree};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::{git, io};

/// The run's warm trees: where they live, the disk they may hold, and one lease per slot.
pub struct WarmTrees {
    root: PathBuf,
    budget_bytes: u64,
    gate: Arc<tokio::sync::Mutex<()>>,
    sweep: Arc<tokio::sync::Mutex<()>>,
}

/// What `status` shows of a warm tree, as the last run that used it left it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmUsage {
    /// Disk the tree held after its last run (0 after it was thrown away).
    pub bytes: u64,
    pub budget_bytes: u64,
    /// The commit its last run was at.
    pub commit: String,
    /// How often it was thrown away (over the budget, or an update that failed).
    pub thrown_away: u64,
}

impl WarmTrees {
    /// Warm trees under `root` (the run's scratch directory), holding at most `budget_mb`
    /// MiB together.
    pub fn new(root: impl Into<PathBuf>, budget_mb: u64) -> Self {
        WarmTrees {
            root: root.into(),
            budget_bytes: budget_mb.saturating_mul(1024 * 1024),
            gate: Arc::default(),
            sweep: Arc::default(),
        }
    }

    /// Waits for the slot's lease, then readies its tree for `commit` in the target
    /// repository at `repo` ([`MergeGit::warm`]).
    ///
    /// [`MergeGit::warm`]: flotilla_actors::ports::MergeGit::warm
    pub fn take(
        self: Arc<Self>,
        repo: PathBuf,
        commit: String,
        slot: WarmSlot,
    ) -> BoxFuture<'static, Result<Option<WarmTree>, RepoError>> {
        Box::pin(async move {
            let lease = match slot {
                WarmSlot::Gate => self.gate.clone().lock_owned().await,
                WarmSlot::Sweep => self.sweep.clone().lock_owned().await,
            };
            tokio::task::spawn_blocking(move || {
                let target = git2::Repository::open(&repo)
                    .map_err(|_| RepoError::NotARepository(repo.clone()))?;
                prepare(&target, &self.root, slot, &commit, Box::new(lease))
                    .map(Some)
                    .map_err(RepoError::storage_or_self)
            })
            .await
            .map_err(|e| RepoError::Git(format!("the git thread failed: {e}")))?
        })
    }

    /// Keeps the index the update wrote ([`MergeGit::warm_updated`]).
    ///
    /// [`MergeGit::warm_updated`]: flotilla_actors::ports::MergeGit::warm_updated
    pub fn updated(&self, tree: &WarmTree) -> BoxFuture<'static, Result<(), RepoError>> {
        let root = self.root.clone();
        let (path, commit, slot) = (tree.path.clone(), tree.commit.clone(), tree.slot);
        Box::pin(async move {
            tokio::task::spawn_blocking(move || updated(&root, &path, &commit, slot))
                .await
                .map_err(|e| RepoError::Git(format!("the git thread failed: {e}")))?
        })
    }

    /// Measures the tree and ends its lease ([`MergeGit::settle_warm`]).
    ///
    /// [`MergeGit::settle_warm`]: flotilla_actors::ports::MergeGit::settle_warm
    pub fn settle(
        self: Arc<Self>,
        tree: WarmTree,
        keep: bool,
    ) -> BoxFuture<'static, Result<(), RepoError>> {
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let settled = settle(&self.root, self.budget_bytes, &tree, keep);
                // The lease goes only once the tree is measured or gone.
                drop(tree);
                settled.map(|_| ())
            })
            .await
            .map_err(|e| RepoError::Git(format!("the git thread failed: {e}")))?
        })
    }
}

/// The slot's work tree.
pub fn tree_dir(root: &Path, slot: WarmSlot) -> PathBuf {
    root.join(format!("warm-{}", slot.name()))
}

/// The daemon's copy of the tree's index after its last update, beside the tree.
fn index_copy(root: &Path, slot: WarmSlot) -> PathBuf {
    root.join(format!("warm-{}.index", slot.name()))
}

/// The commit that index is of.
fn head_file(root: &Path, slot: WarmSlot) -> PathBuf {
    root.join(format!("warm-{}.head", slot.name()))
}

fn usage_file(root: &Path, slot: WarmSlot) -> PathBuf {
    root.join(format!("warm-{}.usage", slot.name()))
}

/// The shell line that brings a prepared tree to `commit` (a full hex id, checked by the
/// caller): tracked files where they differ, untracked files removed, ignored ones kept.
fn update_line(commit: &str) -> String {
    format!("git checkout --quiet --force --detach {commit} && git clean -ffdq")
}

/// Removes whatever is at `path` (a directory, a file or a link), never following a link.
fn remove_any(path: &Path) -> Result<(), RepoError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => remove_dir(path),
        Ok(_) => std::fs::remove_file(path).map_err(|e| io("cannot remove", path, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io("cannot read", path, e)),
    }
}

/// A directory at `path`: what else is there (a file, a link) is removed first.
fn ensure_dir(path: &Path) -> Result<(), RepoError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => return Ok(()),
        Ok(_) => remove_any(path)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("cannot read", path, e)),
    }
    std::fs::create_dir(path).map_err(|e| io("cannot create", path, e))
}

/// The id in the daemon's head file, when it names a commit the target has.
fn recorded_head(target: &git2::Repository, root: &Path, slot: WarmSlot) -> Option<git2::Oid> {
    let text = std::fs::read_to_string(head_file(root, slot)).ok()?;
    let id = git2::Oid::from_str(text.trim()).ok()?;
    target.find_commit(id).ok().map(|c| c.id())
}

/// Readies the slot's tree for the update to `commit` (the caller holds the lease): a new
/// `.git` borrowing the target's objects, with HEAD and index as the last update left them.
pub fn prepare(
    target: &git2::Repository,
    root: &Path,
    slot: WarmSlot,
    commit: &str,
    lease: Box<dyn std::any::Any + Send + Sync>,
) -> Result<WarmTree, RepoError> {
    let id = git2::Oid::from_str(commit)
        .map_err(|_| RepoError::Git(format!("{commit:?} is not a commit id")))?;
    let commit = target
        .find_commit(id)
        .map_err(|e| RepoError::Git(format!("commit {commit}: {}", e.message())))?;
    let objects = target.commondir().join("objects");
    let objects = std::fs::canonicalize(&objects).map_err(|e| io("cannot read", &objects, e))?;
    std::fs::create_dir_all(root).map_err(|e| io("cannot create", root, e))?;
    let dir = tree_dir(root, slot);
    ensure_dir(&dir)?;
    let git_dir = dir.join(".git");
    remove_any(&git_dir)?;
    git2::Repository::init(&dir).map_err(git)?;
    let alternates = git_dir.join("objects").join("info").join("alternates");
    std::fs::write(&alternates, format!("{}\n", objects.display()))
        .map_err(|e| io("cannot write", &alternates, e))?;
    let copy = index_copy(root, slot);
    if let Some(head) = recorded_head(target, root, slot)
        && copy.is_file()
    {
        let index = git_dir.join("index");
        std::fs::copy(&copy, &index).map_err(|e| io("cannot write", &index, e))?;
        let head_path = git_dir.join("HEAD");
        std::fs::write(&head_path, format!("{head}\n"))
            .map_err(|e| io("cannot write", &head_path, e))?;
    }
    let commit = commit.id().to_string();
    Ok(WarmTree {
        update: update_line(&commit),
        path: dir,
        commit,
        slot,
        lease,
    })
}

/// Keeps the index the update just wrote, and the commit it is of, outside the tree.
pub fn updated(root: &Path, tree: &Path, commit: &str, slot: WarmSlot) -> Result<(), RepoError> {
    let index = tree.join(".git").join("index");
    let copy = index_copy(root, slot);
    let head = head_file(root, slot);
    match std::fs::symlink_metadata(&index) {
        Ok(meta) if meta.is_file() => {
            std::fs::copy(&index, &copy).map_err(|e| io("cannot write", &copy, e))?;
        }
        // An empty commit's checkout has no index; nothing else leaves none.
        _ => remove_any(&copy)?,
    }
    std::fs::write(&head, format!("{commit}\n")).map_err(|e| io("cannot write", &head, e))
}

/// Ends a run in the tree: throws it away when `keep` is false or the run's warm trees
/// hold more than the budget, and records what `status` shows.
pub fn settle(
    root: &Path,
    budget_bytes: u64,
    tree: &WarmTree,
    keep: bool,
) -> Result<WarmUsage, RepoError> {
    let mut usage = read_usage(root, tree.slot).unwrap_or_default();
    usage.budget_bytes = budget_bytes;
    usage.commit = tree.commit.clone();
    usage.bytes = if keep { disk_usage(&tree.path) } else { 0 };
    let others: u64 = [WarmSlot::Gate, WarmSlot::Sweep]
        .into_iter()
        .filter(|s| *s != tree.slot)
        .filter_map(|s| read_usage(root, s))
        .map(|u| u.bytes)
        .sum();
    if !keep || usage.bytes.saturating_add(others) > budget_bytes {
        throw_away(root, tree.slot)?;
        usage.bytes = 0;
        usage.thrown_away = usage.thrown_away.saturating_add(1);
    }
    let path = usage_file(root, tree.slot);
    let text = serde_json::to_string(&usage)
        .map_err(|e| RepoError::Git(format!("the warm tree's usage: {e}")))?;
    std::fs::write(&path, text).map_err(|e| io("cannot write", &path, e))?;
    Ok(usage)
}

/// Removes the slot's tree and the daemon's notes of its index.
fn throw_away(root: &Path, slot: WarmSlot) -> Result<(), RepoError> {
    remove_any(&tree_dir(root, slot))?;
    remove_any(&index_copy(root, slot))?;
    remove_any(&head_file(root, slot))
}

fn read_usage(root: &Path, slot: WarmSlot) -> Option<WarmUsage> {
    let text = std::fs::read_to_string(usage_file(root, slot)).ok()?;
    serde_json::from_str(&text).ok()
}

/// The disk the files under `path` take (allocated blocks), links not followed.
pub fn disk_usage(path: &Path) -> u64 {
    let mut total: u64 = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            total = total.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    total
}

/// One line for `status`: each warm tree's size and commit, against the budget; `None`
/// when no warm tree was used yet.
pub fn describe(root: &Path) -> Option<String> {
    let mut parts = Vec::new();
    let mut budget = 0;
    let mut thrown = 0;
    for slot in [WarmSlot::Gate, WarmSlot::Sweep] {
        if let Some(usage) = read_usage(root, slot) {
            budget = budget.max(usage.budget_bytes);
            thrown += usage.thrown_away;
            let at: String = usage.commit.chars().take(7).collect();
            parts.push(format!("{} {} at {at}", slot.name(), mib(usage.bytes)));
        }
    }
    if parts.is_empty() {
        return None;
    }
    let mut line = format!("{} of {}", parts.join(", "), mib(budget));
    if thrown > 0 {
        line.push_str(&format!(", thrown away {thrown}×"));
    }
    Some(line)
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes.div_ceil(1024 * 1024))
}

/// Removes a directory, making what a command left read-only writable first if it must.
/// (Scratch checkouts are removed by it too.)
pub(super) fn remove_dir(path: &Path) -> Result<(), RepoError> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            make_writable(path);
            match std::fs::remove_dir_all(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(io("cannot remove", path, e))
                }
                _ => Ok(()),
            }
        }
    }
}

fn make_writable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut dirs = vec![path.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        // Links are never followed: only what is inside the scratch directory changes.
        let Ok(meta) = std::fs::symlink_metadata(&dir) else {
            continue;
        };
        if !meta.is_dir() {
            continue;
        }
        let mut perms = meta.permissions();
        perms.set_mode(perms.mode() | 0o700);
        let _ = std::fs::set_permissions(&dir, perms);
        if let Ok(entries) = std::fs::read_dir(&dir) {
            dirs.extend(entries.flatten().map(|e| e.path()));
        }
    }
}
