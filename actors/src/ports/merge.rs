//! What the MergeQueue and the Reconciler need of git (M6, ADR-011), beside [`MainRef`]
//! (the compare-and-swap of main) and [`RepoReader`] (main's tip):
//! - [`MergeGit::build`]: a candidate commit made in memory on main's tip from one or more
//!   task branches (replayed, merged or squashed), or the conflict that stops it;
//! - [`MergeGit::find_on_main`]: which of the commits the journal named ahead of a
//!   compare-and-swap main already holds, so a restart never lands a task twice (ADR-018:
//!   trailer text is never read back as evidence);
//! - scratch checkouts at a commit, where the gate and the sweeps run commands, and the warm
//!   trees that replace them when `[merge] warm_gate` is on (ADR-042);
//! - conflict markers at a commit; deleting landed branches; keeping the user's own checkout
//!   of main consistent when main moves under it.
//!
//! None of it writes `refs/heads/main`: only [`MainRef`] does, and only the MergeQueue
//! holds that.
//!
//! [`MainRef`]: super::MainRef
//! [`RepoReader`]: super::RepoReader
//!
//! Types: `LandItem`, `LandMode`, `BuildOutcome`, `CheckoutSync`.

use std::path::PathBuf;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::RepoError;
pub use crate::protocol::CheckoutSync;
use crate::protocol::TaskId;

/// How a branch's work becomes commits on main.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LandMode {
    /// Each of the branch's commits (since it left main) is replayed on the candidate, in
    /// order: main stays linear and keeps the agent's commits.
    #[default]
    Rebase,
    /// One merge commit with the candidate and the branch's tip as parents.
    Merge,
    /// One commit holding the branch's whole change.
    Squash,
}

/// One task branch to build into a candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LandItem {
    pub task: TaskId,
    /// The branch flotilla named for the attempt.
    pub branch: String,
    /// The commit the handoff recorded as the branch's tip: the branch must still point at
    /// it (anything else is refused as a `RepoError`).
    pub head: String,
    /// The subject of a squash or merge commit (already one line, without control
    /// characters).
    pub subject: String,
    /// Added as the last line of every commit made for this item (`Flotilla-Task: …`), for
    /// people reading main's history; any such line the branch's own messages carry is
    /// stripped (an agent may have written it for another task).
    pub trailer: String,
    /// Overrides the mode for this item: conflict-fix branches are always squashed, since
    /// their first commit holds conflict markers.
    pub squash: bool,
}

/// What building a candidate gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildOutcome {
    /// Every item applied: `tip` is the candidate (a descendant of `onto`); `commits[i]` is
    /// the last commit made for item `i`.
    Built { tip: String, commits: Vec<String> },
    /// Item `index` does not apply on what precedes it.
    Conflict {
        index: usize,
        /// The paths git could not merge, sorted.
        files: Vec<String>,
        /// Main's commits since the branch left it that touched those paths, newest first,
        /// as "abc1234 subject" (at most 20).
        clashing: Vec<String>,
        /// Whether main moved since the branch left it (a rebase onto the new tip is then
        /// worth one more try; a conflict on an unmoved main is the branch's own).
        main_moved: bool,
    },
    /// Item `index`'s branch cannot be built: it is gone, or not where its handoff left it.
    /// That item alone is at fault; the others may be built without it.
    Unusable { index: usize, detail: String },
}

/// A detached checkout of one commit, outside the target repository's work tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScratchTree {
    pub path: PathBuf,
    pub commit: String,
}

/// Which warm tree a command run uses (ADR-042). The gate's and the sweeps' are two trees,
/// so that the merge queue never waits behind a sweep's test suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WarmSlot {
    Gate,
    Sweep,
}

impl WarmSlot {
    pub fn name(self) -> &'static str {
        match self {
            WarmSlot::Gate => "gate",
            WarmSlot::Sweep => "sweep",
        }
    }
}

/// A persistent checkout with a real `.git` (ADR-042), leased to one command run: nothing
/// else uses the slot's tree until the lease is dropped. Its files are not yet at `commit`:
/// `update` (a shell line, run in the sandbox in `path`) brings them there, keeping the
/// ignored files (build outputs) the previous run left.
pub struct WarmTree {
    pub path: PathBuf,
    pub commit: String,
    pub slot: WarmSlot,
    pub update: String,
    /// Held until the run is over.
    pub lease: Box<dyn std::any::Any + Send + Sync>,
}

impl std::fmt::Debug for WarmTree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmTree")
            .field("path", &self.path)
            .field("commit", &self.commit)
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

/// A conflict marker found in a file at a commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkerHit {
    pub path: String,
    /// 1-based.
    pub line: u32,
}

/// The git side of the MergeQueue and the Reconciler. Implementations do git work on
/// blocking threads and serialize what they change in `.git` with the worktrees.
pub trait MergeGit: Send + Sync + 'static {
    /// Builds `items`, in order, on `onto` (main's tip), in memory: objects are written,
    /// no reference moves and no work tree is touched.
    fn build(
        &self,
        onto: String,
        items: Vec<LandItem>,
        mode: LandMode,
    ) -> BoxFuture<'static, Result<BuildOutcome, RepoError>>;

    /// For each list of candidate commits, the first of them that is on main's first-parent
    /// history from `tip`, if any. At most `MAX_LANDED_WALK` commits are read.
    fn find_on_main(
        &self,
        tip: String,
        candidates: Vec<Vec<String>>,
    ) -> BoxFuture<'static, Result<Vec<Option<String>>, RepoError>>;

    /// Whether `tip` is `ancestor` or descends from it (main still holds what flotilla
    /// wrote there).
    fn contains(
        &self,
        tip: String,
        ancestor: String,
    ) -> BoxFuture<'static, Result<bool, RepoError>>;

    /// A fresh detached checkout of `commit` for commands to run in (`label` names its
    /// directory).
    fn scratch(
        &self,
        commit: String,
        label: String,
    ) -> BoxFuture<'static, Result<ScratchTree, RepoError>>;

    /// Removes a scratch checkout (and git's record of it).
    fn remove_scratch(&self, tree: ScratchTree) -> BoxFuture<'static, Result<(), RepoError>>;

    /// The slot's warm tree, leased, ready for its `update` to `commit` (ADR-042); `None`
    /// when warm trees are off (`[merge] warm_gate = false`): the caller takes a scratch
    /// checkout instead.
    fn warm(
        &self,
        _commit: String,
        _slot: WarmSlot,
    ) -> BoxFuture<'static, Result<Option<WarmTree>, RepoError>> {
        Box::pin(async { Ok(None) })
    }

    /// Called once `tree.update` succeeded, before any configured command runs there:
    /// records what git knows of the tree's files at that moment, so that nothing a
    /// command changes later can pass for the checked-out state.
    fn warm_updated(&self, _tree: &WarmTree) -> BoxFuture<'static, Result<(), RepoError>> {
        Box::pin(async { Ok(()) })
    }

    /// Ends a warm tree's lease: measures its disk use against the budget and throws the
    /// tree away when over it, or when `keep` is false (its update failed).
    fn settle_warm(
        &self,
        _tree: WarmTree,
        _keep: bool,
    ) -> BoxFuture<'static, Result<(), RepoError>> {
        Box::pin(async { Ok(()) })
    }

    /// Conflict markers (`<<<<<<< `, `=======`, `>>>>>>> ` at a line's start, as a set) in
    /// the files at `commit`: every text file when `paths` is `None`. Bounded: files over
    /// 1 MiB and binary files are skipped, at most 100 hits.
    fn conflict_markers(
        &self,
        commit: String,
        paths: Option<Vec<String>>,
    ) -> BoxFuture<'static, Result<Vec<MarkerHit>, RepoError>>;

    /// Deletes a landed task branch (a missing one is fine).
    fn delete_branch(&self, branch: String) -> BoxFuture<'static, Result<(), RepoError>>;

    /// Deletes a landed batch's branches in one step (missing ones are fine): what each
    /// could not delete, with why. By default one by one through [`MergeGit::delete_branch`];
    /// git's takes the repository's lock once for all of them.
    fn delete_branches(
        &self,
        branches: Vec<String>,
    ) -> BoxFuture<'static, Vec<(String, RepoError)>> {
        let each: Vec<_> = branches
            .into_iter()
            .map(|branch| {
                let deleting = self.delete_branch(branch.clone());
                async move { deleting.await.err().map(|e| (branch, e)) }
            })
            .collect();
        Box::pin(async move {
            let mut failed = Vec::new();
            for deleting in each {
                failed.extend(deleting.await);
            }
            failed
        })
    }

    /// Called right after main moved from `old` to `new`, and with `old == new` when a
    /// queue starts: keeps the target repository's own checkout consistent (ADR-011). A
    /// checkout left on an older commit of main (a crash after main moved and before this
    /// ran) is brought along from that commit.
    fn sync_checkout(
        &self,
        old: String,
        new: String,
    ) -> BoxFuture<'static, Result<CheckoutSync, RepoError>>;
}

/// How far back [`MergeGit::landed`] looks.
pub const MAX_LANDED_WALK: usize = 10_000;
