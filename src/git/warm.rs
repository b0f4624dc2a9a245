//! Warm trees (ADR-042, ADR-055): the persistent checkouts the merge gate and the
//! Reconciler's sweeps run their commands in, one per [`WarmSlot`], kept per repository
//! ([`WARM_DIR`]) from one of its runs to the next.
//!
//! Each is a standalone repository, not a linked worktree of the target: its `.git` borrows
//! the target's objects through `objects/info/alternates` and has no remote and no branch,
//! so nothing run there can name, let alone move, the target's refs; under the sandbox the
//! target's `.git` is read-only and the tree's own directory the only writable place.
//!
//! What the daemon does here never trusts what a gate left:
//! - the tree's `.git` is made anew before every run (a gate may have pointed it, or its
//!   `core.worktree`, anywhere), and each submodule's git directory in it, and the update
//!   writes each submodule's `.git` file anew; only the indexes are carried over, and only
//!   the copies the daemon took right after the last update, kept outside the tree (so a
//!   gate can neither forge the stat data that makes git skip a file nor see the copy);
//! - which submodules there are, where, and from where comes from the target's own
//!   `.git/modules`, never from the candidate's `.gitmodules`; no hook runs in an update;
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
/// The largest index the daemon copies out of a warm tree.
const MAX_INDEX_BYTES: u64 = 1 << 30;

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
    // A pair nobody holds any more (its runs are over) goes, so the map follows the live
    // runs' repositories.
    leases.retain(|_, (gate, sweep)| Arc::strong_count(gate) > 1 || Arc::strong_count(sweep) > 1);
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
/// the last prepare borrowed (`list`: their git directories, relative to the tree).
fn modules_dir(root: &Path, slot: WarmSlot) -> PathBuf {
    root.join(format!("warm-{}.modules", slot.name()))
}

/// The daemon's copy of the index of the submodule whose git directory is `module` (relative
/// to the tree, e.g. `.git/modules/vendor/lib`), named by the hex of that path.
fn module_index_copy(root: &Path, slot: WarmSlot, module: &str) -> PathBuf {
    let name: String = module.bytes().map(|b| format!("{b:02x}")).collect();
    modules_dir(root, slot).join(name)
}

/// The shell line that brings a prepared tree to `commit` (a full hex id, checked by the
/// caller): tracked files where they differ, untracked files removed, ignored ones kept;
/// then the same in each submodule of `modules`, at the commit recorded for it, through
/// the git directory the prepare made. The submodule's `.git` file is written anew first
/// (a gate may have put a git directory of its own there, hooks and all), and no hook or
/// fsmonitor runs. Not `git submodule update`: it would follow the candidate's
/// `.gitmodules` (`update = none`, a URL to fetch). The directories of submodules not
/// borrowed (`emptied`, the top's; each module's own) are emptied. Attributes come from
/// the commit checked out, not from a `.gitattributes` a gate left untracked in the work
/// tree (one naming `eol=crlf` or an encoding would have the checkout rewrite a tracked
/// file that `git status` then calls clean): `--attr-source` where git has it (2.40), a
/// clean of untracked and ignored `.gitattributes` files first where it does not.
fn update_line(commit: &str, emptied: &[String], modules: &[Module]) -> String {
    const SAFE: &str = "git -c core.hooksPath=/dev/null -c core.fsmonitor=false";
    let attrs = |commit: &str, on: &str| match git_has_attr_source() {
        true => (format!("{on} --attr-source={commit}"), String::new()),
        false => (
            on.to_string(),
            format!("{on} clean -ffdqx -- ':(glob)**/.gitattributes' && "),
        ),
    };
    let empty = |paths: &[String]| -> String {
        paths
            .iter()
            .map(|p| format!(" && rm -rf -- {0} && mkdir -p -- {0}", sh_quote(p)))
            .collect()
    };
    let (checkout, pre) = attrs(commit, SAFE);
    let mut line = format!(
        "{pre}{checkout} checkout --quiet --force --detach {commit} && {SAFE} clean -ffdq{}",
        empty(emptied)
    );
    for module in modules {
        let depth = module.work.split('/').count();
        let gitfile = format!("gitdir: {}{}", "../".repeat(depth), module.git_dir);
        let (work, git_dir) = (sh_quote(&module.work), sh_quote(&module.git_dir));
        let on = format!("{SAFE} --git-dir={git_dir} --work-tree={work}");
        let (checkout, pre) = attrs(&module.commit.to_string(), &on);
        line.push_str(&format!(
            " && rm -rf -- {work}/.git && mkdir -p -- {work} \
             && printf '%s\\n' {} > {work}/.git \
             && {pre}{checkout} checkout --quiet --force --detach {} && {on} clean -ffdq{}",
            sh_quote(&gitfile),
            module.commit,
            empty(&module.emptied),
        ));
    }
    line
}

/// Whether the host's `git` takes `--attr-source` (git 2.40 and later), asked once.
fn git_has_attr_source() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        std::process::Command::new("git")
            .args(["--attr-source=HEAD", "version"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// The submodule paths (gitlinks) `tree` records, at most [`MAX_GITLINKS`] (`None` past
/// it), each a path git would check out (no empty, `.`, `..` or `.git` component, no
/// control character).
fn gitlinks(tree: &git2::Tree<'_>) -> Option<Vec<String>> {
    let mut found = Vec::new();
    let mut over = false;
    let _ = tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
        if entry.filemode() == 0o160000
            && let Ok(name) = entry.name()
        {
            if found.len() >= MAX_GITLINKS {
                over = true;
                return git2::TreeWalkResult::Abort;
            }
            let path = format!("{dir}{name}");
            if plain_path(&path) {
                found.push(path);
            }
        }
        git2::TreeWalkResult::Ok
    });
    (!over).then_some(found)
}

/// A relative path with no empty, `.`, `..` or `.git` component and no control character.
fn plain_path(path: &str) -> bool {
    !path.chars().any(char::is_control)
        && path
            .split('/')
            .all(|part| !matches!(part, "" | "." | "..") && !part.eq_ignore_ascii_case(".git"))
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
    let on = Borrowing {
        root,
        slot,
        target_work: target.workdir().and_then(|w| std::fs::canonicalize(w).ok()),
        lfs: git_lfs_installed(),
    };
    let tree = commit.tree().map_err(git)?;
    let mut emptied = Vec::new();
    borrow(
        &on,
        &objects,
        target.commondir(),
        &git_dir,
        ".git",
        "",
        &tree,
        &mut modules,
        &mut emptied,
    )?;
    let kept = modules_dir(root, slot);
    ensure_dir(&kept)?;
    let list = kept.join("list");
    let names: Vec<&str> = modules.iter().map(|m| m.git_dir.as_str()).collect();
    std::fs::write(&list, names.join("\n")).map_err(|e| io("cannot write", &list, e))?;
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
        update: update_line(&commit, &emptied, &modules),
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
    /// The target's work tree, canonical (what an absolute `core.worktree` is under).
    target_work: Option<PathBuf>,
    /// Whether the git directories get `git-lfs`'s filter.
    lfs: bool,
}

/// A submodule the tree checks out (ADR-055).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Module {
    /// Its git directory, relative to the tree: `.git/modules/<name>`, a nested one's
    /// under its parent's.
    git_dir: String,
    /// Its work tree, relative to the tree, where the target's checkout has it.
    work: String,
    /// The commit the candidate (or, nested, its parent's commit) records there.
    commit: git2::Oid,
    /// The other submodules that commit records (none the tree borrows: never
    /// initialised, or at a commit the target's copy lacks), relative to the tree: emptied
    /// at each update, so that nothing a gate left there survives it.
    emptied: Vec<String>,
}

/// At most this many submodule paths a commit records are emptied at an update; a commit
/// recording more is gated in a scratch checkout.
const MAX_GITLINKS: usize = 4096;

/// Makes the new git directory `git_dir` (at `at`, relative to the tree: `.git`, or a
/// submodule's) borrow the objects in `objects` (the canonical objects directory of the
/// target's git directory `source`), with git-lfs's filter when it is installed; then, for
/// each submodule `source` holds whose path `recorded` (the tree the new git directory's
/// work tree is checked out at, under `work`) records a commit of, which the target's
/// copy has: a git directory of the tree's own under `git_dir/modules/<name>`, borrowing
/// the target's, HEAD at that commit and the index the daemon kept, recursively. Its path
/// is where the target's own checkout has it (its `core.worktree`, written by the user's
/// git), never what the candidate's `.gitmodules` says. Each is pushed onto `modules`,
/// a parent before its own; nothing past [`MAX_MODULES`] or [`MAX_MODULE_DEPTH`].
#[allow(clippy::too_many_arguments)]
fn borrow(
    on: &Borrowing<'_>,
    objects: &Path,
    source: &Path,
    git_dir: &Path,
    at: &str,
    work: &str,
    recorded: &git2::Tree<'_>,
    modules: &mut Vec<Module>,
    emptied: &mut Vec<String>,
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
            // An object the target lacks stays a pointer rather than failing the update
            // (which would throw the repository's tree away); and nothing is downloaded,
            // whatever URL a candidate's `.lfsconfig` names (local config comes first).
            ("lfs.skipdownloaderrors", "true"),
            ("lfs.url", "file:///dev/null"),
        ] {
            config.set_str(key, value).map_err(git)?;
        }
    }
    let within = |inside: &str| match work {
        "" => inside.to_string(),
        parent => format!("{parent}/{inside}"),
    };
    let recorded_links = gitlinks(recorded).ok_or_else(|| {
        RepoError::Git(format!(
            "the commit records more than {MAX_GITLINKS} submodules: not in a warm tree"
        ))
    })?;
    // Every submodule path it records is emptied at the update but those borrowed below.
    let mut borrowed: Vec<String> = Vec::new();
    let deep = at.matches("/modules/").count() >= MAX_MODULE_DEPTH;
    let names = match deep {
        true => Vec::new(),
        false => module_names(source, MAX_MODULES.saturating_sub(modules.len())),
    };
    for name in names {
        let module_source = source.join("modules").join(&name);
        let module_at = format!("{at}/modules/{name}");
        let Some(module_work) = module_work_path(on, &module_source, &module_at) else {
            continue;
        };
        // Its path inside its parent's work tree, where the parent's tree records it.
        let inside = match work {
            "" => Some(module_work.as_str()),
            parent => module_work
                .strip_prefix(parent)
                .and_then(|rest| rest.strip_prefix('/')),
        };
        let Some(commit) = inside.and_then(|inside| {
            recorded
                .get_path(Path::new(inside))
                .ok()
                .filter(|entry| entry.filemode() == 0o160000)
                .map(|entry| entry.id())
        }) else {
            continue;
        };
        let (Ok(module_objects), Ok(module_repo)) = (
            std::fs::canonicalize(module_source.join("objects")),
            git2::Repository::open(&module_source),
        ) else {
            continue;
        };
        let Ok(module_tree) = module_repo.find_commit(commit).and_then(|c| c.tree()) else {
            tracing::warn!(
                submodule = %name,
                %commit,
                "the candidate records a commit the repository's copy of the submodule does \
                 not have: not checked out in the warm tree"
            );
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
        let head = module_git.join("HEAD");
        std::fs::write(&head, format!("{commit}\n")).map_err(|e| io("cannot write", &head, e))?;
        let copy = module_index_copy(on.root, on.slot, &module_at);
        if copy.is_file() {
            let index = module_git.join("index");
            std::fs::copy(&copy, &index).map_err(|e| io("cannot write", &index, e))?;
        }
        // For `git submodule status` and the like in the gate; nothing here fetches.
        if let Ok(url) = std::fs::canonicalize(&module_source) {
            config
                .set_str(&format!("submodule.{name}.url"), &url.to_string_lossy())
                .map_err(git)?;
        }
        let index = modules.len();
        modules.push(Module {
            git_dir: module_at.clone(),
            work: module_work.clone(),
            commit,
            emptied: Vec::new(),
        });
        borrowed.push(module_work.clone());
        let mut its_emptied = Vec::new();
        borrow(
            on,
            &module_objects,
            &module_source,
            &module_git,
            &module_at,
            &module_work,
            &module_tree,
            modules,
            &mut its_emptied,
        )?;
        modules[index].emptied = its_emptied;
    }
    emptied.extend(
        recorded_links
            .iter()
            .map(|inside| within(inside))
            .filter(|path| !borrowed.contains(path)),
    );
    Ok(())
}

/// Where the submodule whose git directory in the target is `module_source` (at `at` in the
/// tree's layout, which mirrors the target's) has its work tree, relative to the top: its
/// `core.worktree` as the user's git wrote it, relative to the git directory or absolute
/// under the target's work tree. `None` when it is missing, leaves the top, or holds a
/// control character.
fn module_work_path(on: &Borrowing<'_>, module_source: &Path, at: &str) -> Option<String> {
    let config = git2::Config::open(&module_source.join("config")).ok()?;
    let worktree = config.get_string("core.worktree").ok()?;
    let joined = if Path::new(&worktree).is_absolute() {
        let under = on
            .target_work
            .as_deref()
            .and_then(|top| Path::new(&worktree).strip_prefix(top).ok());
        let Some(under) = under else {
            tracing::warn!(
                submodule = %module_source.display(),
                %worktree,
                "a submodule's work tree is not under the repository's: not in the warm tree"
            );
            return None;
        };
        under.to_str()?.to_string()
    } else {
        format!("{at}/{worktree}")
    };
    // Lexically, as git joins them.
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    let path = parts.join("/");
    plain_path(&path).then_some(path)
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

/// `text` quoted for `sh`.
fn sh_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// Copies the index git wrote at `index` (a path under `tree`) to `copy`, or removes the
/// copy when there is none. Every directory on the way must be one, not a link, and the
/// index at most [`MAX_INDEX_BYTES`]: the daemon reads it unsandboxed.
fn keep_index(tree: &Path, index: &Path, copy: &Path) -> Result<(), RepoError> {
    let real = index
        .strip_prefix(tree)
        .ok()
        .map(|rel| {
            let mut at = tree.to_path_buf();
            let mut dirs = rel.components().collect::<Vec<_>>();
            dirs.pop();
            dirs.into_iter().all(|part| {
                at.push(part);
                std::fs::symlink_metadata(&at).is_ok_and(|m| m.is_dir())
            })
        })
        .unwrap_or(false);
    match std::fs::symlink_metadata(index) {
        Ok(meta) if real && meta.is_file() && meta.len() <= MAX_INDEX_BYTES => {
            std::fs::copy(index, copy).map_err(|e| io("cannot write", copy, e))?;
            Ok(())
        }
        // An empty commit's checkout has no index; nothing else leaves none.
        _ => remove_any(copy),
    }
}

/// Keeps the indexes the update just wrote (the tree's and its submodules'), and the
/// commit they are of, outside the tree.
pub fn updated(root: &Path, tree: &Path, commit: &str, slot: WarmSlot) -> Result<(), RepoError> {
    keep_index(
        tree,
        &tree.join(".git").join("index"),
        &index_copy(root, slot),
    )?;
    let list = std::fs::read_to_string(modules_dir(root, slot).join("list")).unwrap_or_default();
    for module in list.lines().filter(|l| !l.is_empty()) {
        let copy = module_index_copy(root, slot, module);
        keep_index(tree, &tree.join(module).join("index"), &copy)?;
    }
    let head = head_file(root, slot);
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
