//! The target repository, as three ports with three owners:
//! - [`RepoReader`]: reading main (the planners, the Subplanner);
//! - [`Worktrees`]: one git worktree per attempt, on a branch flotilla named, and what git
//!   says the attempt changed (the Worker);
//! - [`MainRef`]: moving `refs/heads/main` with a compare-and-swap, given only to the
//!   MergeQueue (M6). No other port can write main.
//!
//! "main" is the run's target branch (`[merge] branch`, ADR-022), whatever its name.
//!
//! None of them touches the target repository's own work tree or index.
//!
//! `Worktrees` can `prepare` an attempt's worktree from main's tip, `seal` it into a
//! `BranchWork`, `release` it keeping or deleting its branch, and `sweep` what interrupted
//! attempts left. `ScratchWorktrees` (plain directories, the `testing` feature) is the fake for
//! actor tests.

use std::path::PathBuf;

use futures::future::BoxFuture;

use super::{
    CommitLog, CommitShown, GrepQuery, GrepReport, ReadBounds, TreeItem, TreePath, Workspace,
};
use crate::protocol::{BranchWork, TaskId};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepoError {
    #[error("git: {0}")]
    Git(String),
    #[error("{0} is not a git repository")]
    NotARepository(PathBuf),
    /// flotilla's own storage refused a write (disk full, a read-only file system, a
    /// quota): infrastructure, never a task's failure. The run waits and tries again
    /// (ADR-021).
    #[error("storage: {0}")]
    Storage(String),
}

/// The operating system's words for storage that cannot take a write, as git and the
/// standard library print them.
const STORAGE_FAILURES: [&str; 4] = [
    "No space left on device",
    "Read-only file system",
    "Disk quota exceeded",
    "File too large",
];

impl RepoError {
    /// `self` as [`RepoError::Storage`] when its text is one of the operating system's
    /// storage failures (git2 reports them as text only).
    pub fn storage_or_self(self) -> RepoError {
        match self {
            RepoError::Git(text) if STORAGE_FAILURES.iter().any(|f| text.contains(f)) => {
                RepoError::Storage(text)
            }
            other => other,
        }
    }
}

/// What the root planner reads of the target repository: main's tip, never a work tree
/// (which may be dirty). Every part is bounded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepoSnapshot {
    /// The commit read (empty for a repository without commits).
    pub commit: String,
    /// Every file path at that commit, sorted (at most [`RepoSnapshot::MAX_FILES`]).
    pub files: Vec<String>,
    /// Files left out of `files` past the cap.
    pub files_omitted: usize,
    /// The planning documents that exist (SPEC.md, FEATURES.json, AGENTS.md,
    /// DECISIONS.md), each as (name, text), the text cut at [`RepoSnapshot::MAX_DOC_BYTES`].
    pub docs: Vec<(String, String)>,
    /// The last commits, newest first, as "abcdef1 subject".
    pub recent_commits: Vec<String>,
}

impl RepoSnapshot {
    pub const DOCS: [&'static str; 4] = ["SPEC.md", "FEATURES.json", "AGENTS.md", "DECISIONS.md"];
    pub const MAX_FILES: usize = 5_000;
    pub const MAX_DOC_BYTES: usize = 32 * 1024;
    pub const RECENT_COMMITS: usize = 40;

    pub fn doc(&self, name: &str) -> Option<&str> {
        self.docs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, text)| text.as_str())
    }
}

/// The target repository, read side: what workers changed and where `main` is.
pub trait RepoReader: Send + Sync + 'static {
    /// The commit `main` points at.
    fn main_tip(&self) -> BoxFuture<'static, Result<String, RepoError>>;
    /// What the planner reads: files, planning documents and recent commits at main's tip.
    fn snapshot(&self) -> BoxFuture<'static, Result<RepoSnapshot, RepoError>>;
    /// Repo-relative paths changed on `branch` since it left `base`: for scope enforcement.
    fn changed_paths(
        &self,
        branch: String,
        base: String,
    ) -> BoxFuture<'static, Result<Vec<String>, RepoError>>;
    /// What `path` is in the tree of `commit` (a tip read before: the planners pin one per
    /// call, ADR-037), read within `bounds`. Never a work tree; links are not followed.
    fn read_path(
        &self,
        commit: String,
        path: TreePath,
        bounds: ReadBounds,
    ) -> BoxFuture<'static, Result<TreeItem, RepoError>>;
    /// The lines of `commit`'s text files that match `query`, within its bounds.
    fn grep(
        &self,
        commit: String,
        query: GrepQuery,
    ) -> BoxFuture<'static, Result<GrepReport, RepoError>>;
    /// `commit` and its ancestors, newest first, at most `max_count`; with `path`, only the
    /// commits that changed it (against their first parent).
    fn log(
        &self,
        commit: String,
        path: Option<TreePath>,
        max_count: usize,
    ) -> BoxFuture<'static, Result<CommitLog, RepoError>>;
    /// The commit `name` ([`commit_name`](super::commit_name): a hex id or `HEAD`, which is
    /// `commit`) with its patch cut at `max_patch_bytes`; `None` unless it is `commit` or
    /// one of its ancestors.
    fn show_commit(
        &self,
        commit: String,
        name: String,
        max_patch_bytes: usize,
    ) -> BoxFuture<'static, Result<Option<CommitShown>, RepoError>>;
}

/// One attempt's worktree: which task and attempt, and the branch flotilla named for it
/// (`branch_name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorktreeRequest {
    pub task: TaskId,
    pub attempt: u32,
    pub branch: String,
    /// Where a new branch starts (an existing branch is reused as it is).
    pub start: WorktreeStart,
}

/// Where an attempt's new branch starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum WorktreeStart {
    /// main's tip.
    #[default]
    Main,
    /// A conflict fix (ADR-011): main's tip plus one flotilla commit that merges the work of
    /// the task branch `branch` into it, conflict markers left in the files that clash.
    /// The workspace's `base` is that commit, so the fix's diff (and its scope check) is
    /// the resolution alone; after a restart the reused branch's base is found again (the
    /// first commit after the branch left main).
    ConflictFix { branch: String },
    /// A retry that continues a failed attempt's work (`[worktrees] retry_in_place`,
    /// ADR-031): the new branch starts at the tip of `branch` (that attempt's, named by
    /// flotilla), and the workspace's `base` is where `branch` left main, so the scope check
    /// and the handoff's files cover both attempts' work. A missing `branch` starts from
    /// main's tip ([`Workspace::continued_from`] says which it was).
    Continue { branch: String },
}

/// What becomes of an attempt's branch when its worktree goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchFate {
    /// Its work was delivered: the merge queue lands it (and deletes it then).
    Keep,
    /// The attempt failed or was called off: its commits can never land.
    Delete,
}

/// What a sweep keeps of a run, and whether the run is over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepKeep {
    /// Branches whose worktree stays (parents waiting to synthesize).
    pub worktrees: Vec<String>,
    /// The branches the journal records as delivered: every other branch of the run goes
    /// too (a crash between releasing a delivered worktree and journaling its report leaves
    /// one). `None`: every branch without a worktree stays (the journal was not read).
    pub delivered: Option<Vec<String>>,
    /// Branches that stay without their worktree: failed attempts' that a pending retry
    /// continues from (`[worktrees] retry_in_place`, ADR-031).
    pub branches: Vec<String>,
    /// The run is over: no worktree may be made for it after this sweep (an attempt's
    /// `prepare` still queued behind it is refused rather than leaked).
    pub closing: bool,
}

/// What a sweep removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swept {
    pub worktrees: Vec<PathBuf>,
    pub branches: Vec<String>,
}

/// What a branch changed, as patch text for a reader (the reviewer, ADR-038): whole files'
/// patches of `git diff base head`, at most the bytes asked for; the files whose patch did
/// not fit are named in `left_out` (with "(too large to show, N bytes)" when a blob alone is
/// larger than the room left, so it was never diffed), so a cut is always said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiffText {
    pub text: String,
    pub left_out: Vec<String>,
}

/// One run's attempt worktrees in the target repository. Implementations serialize what
/// they change in the repository's `.git` and do git work on blocking threads.
pub trait Worktrees: Send + Sync + 'static {
    /// A worktree for the attempt on its branch. A new branch starts at main's tip; when the
    /// branch exists already (a synthesis on its parent's branch, a restart) the worktree is
    /// reused if it is there and made again on the branch if it is not.
    fn prepare(&self, request: WorktreeRequest)
    -> BoxFuture<'static, Result<Workspace, RepoError>>;
    /// Commits whatever the agent left uncommitted (as flotilla, never as a person, with
    /// `subject` as the commit's first line) and reads what the branch changed since its
    /// base.
    fn seal(
        &self,
        workspace: Workspace,
        subject: String,
    ) -> BoxFuture<'static, Result<BranchWork, RepoError>>;
    /// The patch text of what `work` (a seal of `workspace`) changed, at most `max_bytes`
    /// (see [`DiffText`]). A port that keeps no file text (a benchmark's) shows none and
    /// names every file as left out.
    fn diff(
        &self,
        workspace: &Workspace,
        work: &BranchWork,
        max_bytes: usize,
    ) -> BoxFuture<'static, Result<DiffText, RepoError>> {
        let _ = (workspace, max_bytes);
        let left_out = work.files.iter().map(|f| f.path.clone()).collect();
        Box::pin(async move {
            Ok(DiffText {
                text: String::new(),
                left_out,
            })
        })
    }
    /// Removes the worktree; the branch stays or goes by `fate`.
    fn release(
        &self,
        workspace: Workspace,
        fate: BranchFate,
    ) -> BoxFuture<'static, Result<(), RepoError>>;
    /// [`Worktrees::release`] of a workspace that is as its last seal found it: the
    /// caller's word that nothing ran in it since that seal began (no agent call, no
    /// verification) and that the seal began after every command before it had returned.
    /// An implementation may then let the seal's walk stand for the next reset's
    /// (ADR-046); by default it is a plain release.
    fn release_sealed(
        &self,
        workspace: Workspace,
        fate: BranchFate,
    ) -> BoxFuture<'static, Result<(), RepoError>> {
        self.release(workspace, fate)
    }
    /// Removes every worktree of the run except those on `keep.worktrees` (parents waiting
    /// to synthesize), deleting their branches with them: an attempt that still has its
    /// worktree never delivered (a Worker releases the worktree of delivered work before it
    /// reports). Branches without a worktree stay unless `keep.delivered` lists what the
    /// journal says was delivered. For a restart (before any attempt starts), the end of a
    /// run (`closing`), and `flotilla gc`.
    fn sweep(&self, keep: SweepKeep) -> BoxFuture<'static, Result<Swept, RepoError>>;
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MainRefError {
    /// main is not where the caller built on: it must rebuild on the new tip.
    // Said after the branch's name ("moving master: it moved meanwhile: …"), as are the others.
    #[error("it moved meanwhile: expected {expected}, found {actual}")]
    Moved { expected: String, actual: String },
    /// main is checked out, and its checkout cannot follow now (the user's changes in the
    /// files the move changes, a merge in progress, another git command holding the index
    /// lock): nothing moved; the same move may succeed later (ADR-021).
    #[error("its checkout cannot follow now: {detail}")]
    CheckoutBusy { detail: String },
    /// main's ref is locked by another writer (git's `main.lock`: another flotilla run, a
    /// user's git command): contention, not failure; worth waiting for.
    #[error("it is locked by another writer: {detail}")]
    Busy { detail: String },
    #[error(transparent)]
    Repo(#[from] RepoError),
}

/// Moving main: the MergeQueue's alone (ARCHITECTURE.md invariant "only the merge queue
/// moves main"). A compare-and-swap: main moves from `expected` to `new` or not at all.
pub trait MainRef: Send + Sync + 'static {
    fn compare_and_swap(
        &self,
        expected: String,
        new: String,
    ) -> BoxFuture<'static, Result<(), MainRefError>>;
}

/// Worktrees without git, for actor tests: each attempt gets a plain directory under
/// `root`, and sealing reports every file in it as added (with its lines counted), at an
/// empty base. Removing it removes the directory; there are no branches to keep. A test seam
/// (the `testing` feature, ADR-027).
#[cfg(feature = "testing")]
pub struct ScratchWorktrees {
    root: PathBuf,
}

#[cfg(feature = "testing")]
impl ScratchWorktrees {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ScratchWorktrees { root: root.into() }
    }

    /// Where an attempt's directory is.
    pub fn path_of(&self, task: &TaskId, attempt: u32) -> PathBuf {
        self.root.join(format!("{task}-a{attempt}"))
    }
}

#[cfg(feature = "testing")]
fn io(e: std::io::Error) -> RepoError {
    RepoError::Git(format!("scratch workspace: {e}"))
}

#[cfg(feature = "testing")]
fn scratch_files(root: &std::path::Path) -> Result<Vec<crate::protocol::FileChange>, RepoError> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let kind = entry.file_type().map_err(io)?;
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                let text = std::fs::read(entry.path()).map_err(io)?;
                let path = entry
                    .path()
                    .strip_prefix(root)
                    .map_err(|e| RepoError::Git(e.to_string()))?
                    .to_string_lossy()
                    .replace('\\', "/");
                files.push(crate::protocol::FileChange {
                    path,
                    old_path: None,
                    change: crate::protocol::ChangeKind::Added,
                    lines_added: text.iter().filter(|b| **b == b'\n').count() as u64,
                    lines_removed: 0,
                    binary: false,
                });
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

#[cfg(feature = "testing")]
impl Worktrees for ScratchWorktrees {
    fn prepare(
        &self,
        request: WorktreeRequest,
    ) -> BoxFuture<'static, Result<Workspace, RepoError>> {
        let path = self.path_of(&request.task, request.attempt);
        Box::pin(async move {
            tokio::fs::create_dir_all(&path).await.map_err(io)?;
            Ok(Workspace {
                path,
                branch: request.branch,
                base: String::new(),
                continued_from: None,
            })
        })
    }

    fn seal(
        &self,
        workspace: Workspace,
        _subject: String,
    ) -> BoxFuture<'static, Result<BranchWork, RepoError>> {
        Box::pin(async move {
            let path = workspace.path.clone();
            let files = tokio::task::spawn_blocking(move || scratch_files(&path))
                .await
                .map_err(|e| RepoError::Git(e.to_string()))??;
            Ok(BranchWork {
                branch: workspace.branch,
                base: workspace.base,
                head: String::new(),
                lines_added: files.iter().map(|f| f.lines_added).sum(),
                lines_removed: 0,
                files,
                files_omitted: 0,
                committed_for_agent: false,
                links_outside: Vec::new(),
            })
        })
    }

    /// Every file in the directory, as a new file's patch, whole files while they fit.
    fn diff(
        &self,
        workspace: &Workspace,
        _work: &BranchWork,
        max_bytes: usize,
    ) -> BoxFuture<'static, Result<DiffText, RepoError>> {
        let root = workspace.path.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let mut diff = DiffText::default();
                for file in scratch_files(&root)? {
                    let text = std::fs::read(root.join(&file.path)).map_err(io)?;
                    let text = String::from_utf8_lossy(&text);
                    let mut patch = format!(
                        "diff --git a/{0} b/{0}\nnew file\n--- /dev/null\n+++ b/{0}\n",
                        file.path
                    );
                    for line in text.lines() {
                        patch.push('+');
                        patch.push_str(line);
                        patch.push('\n');
                    }
                    if diff.text.len().saturating_add(patch.len()) <= max_bytes {
                        diff.text.push_str(&patch);
                    } else {
                        diff.left_out.push(file.path);
                    }
                }
                Ok(diff)
            })
            .await
            .map_err(|e| RepoError::Git(e.to_string()))?
        })
    }

    fn release(
        &self,
        workspace: Workspace,
        _: BranchFate,
    ) -> BoxFuture<'static, Result<(), RepoError>> {
        Box::pin(async move {
            match tokio::fs::remove_dir_all(&workspace.path).await {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(e)),
                _ => Ok(()),
            }
        })
    }

    fn sweep(&self, _: SweepKeep) -> BoxFuture<'static, Result<Swept, RepoError>> {
        let root = self.root.clone();
        Box::pin(async move {
            let mut swept = Swept::default();
            let Ok(mut entries) = tokio::fs::read_dir(&root).await else {
                return Ok(swept);
            };
            while let Ok(Some(entry)) = entries.next_entry().await {
                tokio::fs::remove_dir_all(entry.path()).await.map_err(io)?;
                swept.worktrees.push(entry.path());
            }
            Ok(swept)
        })
    }
}
