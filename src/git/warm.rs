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

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use flotilla_actors::ports::{RepoError, WarmSlot, WarmTree};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::{git, io};

/// The worktrees directory's warm trees, one directory per repository
/// (`<worktrees>/.warm/<key>/warm-gate`, [`slots::repository_dir`]), so that a
/// repository's next run starts warm too (ADR-055).
///
/// [`slots::repository_dir`]: super::slots::repository_dir
pub const WARM_DIR: &str = ".warm";
/// At most this many submodules, nested ones included, are borrowed into a warm tree.
const MAX_MODULES: usize = 256;
/// How deep submodules nest, and how many directories a submodule's name spans, at most.
const MAX_MODULE_DEPTH: usize = 16;
/// At most this many refs of a submodule are copied (what makes its commits reachable).
const MAX_MODULE_REFS: usize = 65_536;

/// A repository's (or a run's) warm trees: where they live, the disk they may hold, and
/// one lease per slot.
pub struct WarmTrees {
    root: PathBuf,
    /// The repository's own warm trees ([`WARM_DIR`]): the root is made with the
    /// repository's path in it, for gc.
    per_repository: bool,
    budget_bytes: u64,
    gate: Arc<tokio::sync::Mutex<()>>,
    sweep: Arc<tokio::sync::Mutex<()>>,
}

/// The slots' leases of the warm trees under `root`, one pair per root in the daemon: two
/// runs of one repository share its trees, never at once.
fn leases(root: &Path) -> (Arc<tokio::sync::Mutex<()>>, Arc<tokio::sync::Mutex<()>>) {
    type Leases = HashMap<PathBuf, (Arc<tokio::sync::Mutex<()>>, Arc<tokio::sync::Mutex<()>>)>;
    static LEASES: OnceLock<std::sync::Mutex<Leases>> = OnceLock::new();
    let mut leases = LEASES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    leases.entry(root.to_path_buf()).or_default().clone()
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
        let root = root.into();
        let (gate, sweep) = leases(&root);
        WarmTrees {
            root,
            per_repository: false,
            budget_bytes: budget_mb.saturating_mul(1024 * 1024),
            gate,
            sweep,
        }
    }

    /// The warm trees of the repository at `repo`, kept in the worktrees directory
    /// `worktrees` from one of its runs to the next, holding at most `budget_mb` MiB
    /// together; `None` when the repository's path cannot be resolved.
    pub fn for_repository(worktrees: &Path, repo: &Path, budget_mb: u64) -> Option<Self> {
        let root = super::slots::repository_dir(worktrees, WARM_DIR, repo)?;
        Some(WarmTrees {
            per_repository: true,
            ..WarmTrees::new(root, budget_mb)
        })
    }

    /// Where the trees are.
    pub fn root(&self) -> &Path {
        &self.root
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
                if self.per_repository && !super::slots::make_pool(&self.root, &repo) {
                    return Err(io(
                        "cannot create",
                        &self.root,
                        std::io::Error::other("the repository's warm trees' directory"),
                    ));
                }
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

/// The daemon's copies of the tree's submodules' indexes, and the list of the submodules
/// the last prepare borrowed (`list`: their git directories, relative to the tree's `.git`).
fn modules_dir(root: &Path, slot: WarmSlot) -> PathBuf {
    root.join(format!("warm-{}.modules", slot.name()))
}

/// The daemon's copy of the index of the submodule whose git directory is `module` (relative
/// to the tree's `.git`, e.g. `modules/vendor/lib`), named by the hex of that path.
fn module_index_copy(root: &Path, slot: WarmSlot, module: &str) -> PathBuf {
    let name: String = module.bytes().map(|b| format!("{b:02x}")).collect();
    modules_dir(root, slot).join(name)
}

/// The shell line that brings a prepared tree to `commit` (a full hex id, checked by the
/// caller): tracked files where they differ, untracked files removed, ignored ones kept;
/// with `modules`, the same in every submodule the tree borrowed, at the commit the
/// candidate records for it. Only submodules the daemon configured are updated (no
/// `--init`): a URL the candidate's `.gitmodules` names is never fetched.
fn update_line(commit: &str, modules: bool) -> String {
    let mut line = format!("git checkout --quiet --force --detach {commit} && git clean -ffdq");
    if modules {
        line.push_str(
            " && git submodule update --quiet --recursive --force \
             && git submodule foreach --quiet --recursive 'git clean -ffdq'",
        );
    }
    line
}

/// Whether `git-lfs` is on the daemon's `PATH` (and so in the sandbox, which shows the
/// host's system directories): the warm trees then smudge LFS files from the target's
/// LFS objects.
fn git_lfs_installed() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        std::env::var_os("PATH").is_some_and(|path| {
            std::env::split_paths(&path).any(|dir| {
                std::fs::metadata(dir.join("git-lfs"))
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })
        })
    })
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
    let mut modules = Vec::new();
    let lfs = git_lfs_installed();
    borrow(
        &Borrowing { root, slot, lfs },
        &objects,
        target.commondir(),
        &git_dir,
        "",
        &mut modules,
    )?;
    let kept = modules_dir(root, slot);
    ensure_dir(&kept)?;
    let list = kept.join("list");
    std::fs::write(&list, modules.join("\n")).map_err(|e| io("cannot write", &list, e))?;
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
        update: update_line(&commit, !modules.is_empty()),
        path: dir,
        commit,
        slot,
        lease,
    })
}

/// What [`borrow`] needs of the tree it borrows for.
struct Borrowing<'a> {
    root: &'a Path,
    slot: WarmSlot,
    /// Whether the git directories get `git-lfs`'s filter.
    lfs: bool,
}

/// Makes the new git directory `git_dir` (at `at` under the tree's `.git`: "" for the
/// `.git` itself, `modules/<name>/` for a submodule's) borrow the objects in `objects`
/// (the canonical objects directory of the target's git directory `source`), and borrows
/// each submodule `source` holds, recursively: a git directory of its own under
/// `git_dir/modules/<name>`, borrowing the target's; the target's refs copied (so that
/// `git submodule update` finds the recorded commit reachable and fetches nothing), the
/// index the daemon kept, and `submodule.<name>.url` naming the target's git directory
/// (read-only in the sandbox; a commit it lacks is fetched from there, never from the URL
/// the candidate's `.gitmodules` names). Each git directory borrowed is pushed onto
/// `modules`; nothing past [`MAX_MODULES`] or [`MAX_MODULE_DEPTH`].
fn borrow(
    on: &Borrowing<'_>,
    objects: &Path,
    source: &Path,
    git_dir: &Path,
    at: &str,
    modules: &mut Vec<String>,
) -> Result<(), RepoError> {
    let alternates = git_dir.join("objects").join("info").join("alternates");
    std::fs::write(&alternates, format!("{}\n", objects.display()))
        .map_err(|e| io("cannot write", &alternates, e))?;
    let repo = git2::Repository::open(git_dir).map_err(git)?;
    let mut config = repo.config().map_err(git)?;
    if on.lfs {
        for (key, value) in [
            ("filter.lfs.process", "git-lfs filter-process"),
            ("filter.lfs.smudge", "git-lfs smudge -- %f"),
            ("filter.lfs.clean", "git-lfs clean -- %f"),
            ("filter.lfs.required", "true"),
        ] {
            config.set_str(key, value).map_err(git)?;
        }
    }
    let depth = at.matches("modules/").count();
    if depth >= MAX_MODULE_DEPTH {
        return Ok(());
    }
    for name in module_names(source, MAX_MODULES.saturating_sub(modules.len())) {
        let module_source = source.join("modules").join(&name);
        let Ok(module_objects) = std::fs::canonicalize(module_source.join("objects")) else {
            continue;
        };
        let module_git = git_dir.join("modules").join(&name);
        if let Some(parent) = module_git.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io("cannot create", parent, e))?;
        }
        let module = git2::Repository::init_bare(&module_git).map_err(git)?;
        module
            .config()
            .and_then(|mut c| c.set_bool("core.bare", false))
            .map_err(git)?;
        copy_refs(&module_source, &module_git)?;
        // A HEAD at a commit: `git submodule update` reads it in a submodule already checked
        // out, before `--force` checks the recorded commit out whatever HEAD is.
        if let Some(head) = git2::Repository::open(&module_source)
            .ok()
            .and_then(|r| r.head().ok()?.peel_to_commit().ok().map(|c| c.id()))
        {
            let path = module_git.join("HEAD");
            std::fs::write(&path, format!("{head}\n")).map_err(|e| io("cannot write", &path, e))?;
        }
        let at_module = format!("{at}modules/{name}");
        let copy = module_index_copy(on.root, on.slot, &at_module);
        if copy.is_file() {
            let index = module_git.join("index");
            std::fs::copy(&copy, &index).map_err(|e| io("cannot write", &index, e))?;
        }
        let url = std::fs::canonicalize(&module_source)
            .map_err(|e| io("cannot read", &module_source, e))?;
        config
            .set_str(&format!("submodule.{name}.url"), &url.to_string_lossy())
            .map_err(git)?;
        // The fetch of a commit the copied refs do not reach is from a path.
        config
            .set_str("protocol.file.allow", "always")
            .map_err(git)?;
        modules.push(at_module.clone());
        borrow(
            on,
            &module_objects,
            &module_source,
            &module_git,
            &format!("{at_module}/"),
            modules,
        )?;
    }
    Ok(())
}

/// The submodules the git directory `source` holds (`modules/<name>`), at most `most`: a
/// directory there holding `HEAD` is one, any other is part of a name (git's names may hold
/// `/`). Names that are not UTF-8 are passed over.
fn module_names(source: &Path, most: usize) -> Vec<String> {
    let mut names = Vec::new();
    let mut stack = vec![(source.join("modules"), String::new(), 0usize)];
    while let Some((dir, name, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            // Not following a link: what the user's git made is directories.
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let Some(part) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let full = if name.is_empty() {
                part
            } else {
                format!("{name}/{part}")
            };
            if entry.path().join("HEAD").is_file() {
                if names.len() >= most {
                    break;
                }
                names.push(full);
            } else if depth + 1 < MAX_MODULE_DEPTH {
                stack.push((entry.path(), full, depth + 1));
            }
        }
    }
    names.sort();
    names
}

/// Writes the refs of the git directory `source` into `git_dir`'s `packed-refs` (at most
/// [`MAX_MODULE_REFS`]), so that what is reachable in the target's submodule is there too.
fn copy_refs(source: &Path, git_dir: &Path) -> Result<(), RepoError> {
    let repo = git2::Repository::open(source).map_err(git)?;
    let mut text = String::new();
    for reference in repo
        .references()
        .map_err(git)?
        .flatten()
        .take(MAX_MODULE_REFS)
    {
        if let (Ok(name), Some(id)) = (reference.name(), reference.target())
            && name.starts_with("refs/")
            && !name.contains(|c: char| c.is_whitespace() || c.is_control())
        {
            text.push_str(&format!("{id} {name}\n"));
        }
    }
    let path = git_dir.join("packed-refs");
    std::fs::write(&path, text).map_err(|e| io("cannot write", &path, e))
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
    // The submodules' indexes, as git just wrote them (nothing but git ran since the
    // prepare made their git directories).
    let list = std::fs::read_to_string(modules_dir(root, slot).join("list")).unwrap_or_default();
    for module in list.lines().filter(|l| !l.is_empty()) {
        let index = tree.join(".git").join(module).join("index");
        let copy = module_index_copy(root, slot, module);
        match std::fs::symlink_metadata(&index) {
            Ok(meta) if meta.is_file() => {
                std::fs::copy(&index, &copy).map_err(|e| io("cannot write", &copy, e))?;
            }
            _ => remove_any(&copy)?,
        }
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
    remove_any(&modules_dir(root, slot))?;
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
