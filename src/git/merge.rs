//! The `MergeGit` port on git2 (M6, ADR-011): what the MergeQueue and the Reconciler do in
//! git besides moving main (`MainRef`, in `reader.rs`).
//!
//! - Candidates are built in memory: commits are replayed (`cherrypick_commit`'s merge),
//!   squashed or merged (`merge_trees`) on the three trees without what all three share, and
//!   the result grafted onto the candidate's tree (`tree_delta.rs`, ADR-045): objects are
//!   written, no reference moves, no work tree or index on disk is read or written.
//! - Scratch checkouts are plain directories under `scratch_root`, filled from a commit's
//!   tree by a checkout into a target directory through an in-memory index: git keeps no
//!   record of them (no worktree entry, no branch, no `.git` in them), so removing one is
//!   removing a directory, and a crash leaves nothing in the repository. Commands run there
//!   cannot use git on the checkout. With [`GitMerge::with_warm`] the gate and the sweeps
//!   run in warm trees instead (`warm.rs`, ADR-042), scratch checkouts being the fallback.
//! - The user's own checkout is touched by [`MergeGit::sync_checkout`] and by the move of
//!   main itself (`super::checkout`, ADR-021): under git's index lock, only files the user
//!   has not changed, HEAD never detached.
//!
//! Every call runs on a blocking thread and opens the repository there. What writes refs
//! (deleting a branch, the user's HEAD) takes the per-repository lock the worktrees take
//! ([`repo_lock`]).
//!
//! Every candidate commit carries its `Flotilla-Task:` trailer. A conflict fix's start is
//! built in `conflict_fix.rs`. It must not know attempt worktrees or the actors' state.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use flotilla_actors::ports::{
    BuildOutcome, CheckoutSync, LandItem, LandMode, MAX_LANDED_WALK, MarkerHit, MergeGit,
    RepoError, ScratchTree, WarmSlot, WarmTree,
};
use futures::future::BoxFuture;

use super::handles::RepoHandles;
pub use super::markers::{MAX_MARKER_FILE_BYTES, MAX_MARKER_HITS, markers_in};
use super::markers::{MarkerFreeTrees, conflict_markers};
use super::target::{TASK_BRANCH_PREFIX, TargetBranch};
use super::tree_delta::{Merged, merge_trees, pick_base};
use super::warm::{WarmTrees, remove_dir};
use super::{git, io, repo_lock, signature};

/// At most this many of main's commits are named as clashing with a conflict.
pub const MAX_CLASHING: usize = 20;

/// The longest label a scratch directory's name keeps.
pub const MAX_SCRATCH_LABEL: usize = 64;

pub struct GitMerge {
    repo: PathBuf,
    /// Opened handles kept between calls (ADR-041, "a cheaper cycle").
    handles: Arc<RepoHandles>,
    scratch_root: PathBuf,
    /// The branch work lands on (ADR-022): never deleted, and the one whose checkout
    /// [`MergeGit::sync_checkout`] brings along.
    target: TargetBranch,
    /// The gate's and the sweeps' warm trees, when `[merge] warm_gate` is on.
    warm: Option<Arc<WarmTrees>>,
    marker_free: Arc<MarkerFreeTrees>,
}

impl GitMerge {
    /// `repo` is the target repository, whose work lands on `target`; scratch checkouts
    /// are made under `scratch_root` (created when the first one is).
    pub fn new(
        repo: impl Into<PathBuf>,
        scratch_root: impl Into<PathBuf>,
        target: TargetBranch,
    ) -> Self {
        let repo = repo.into();
        GitMerge {
            handles: RepoHandles::shared(&repo),
            repo,
            scratch_root: scratch_root.into(),
            target,
            warm: None,
            marker_free: Arc::default(),
        }
    }

    /// Commands run in warm trees under the scratch root, holding at most `budget_mb` MiB
    /// together (ADR-042): they go with the scratch root.
    pub fn with_warm(mut self, budget_mb: u64) -> Self {
        self.warm = Some(Arc::new(WarmTrees::new(
            self.scratch_root.clone(),
            budget_mb,
        )));
        self
    }

    /// Commands run in the repository's warm trees, kept in the worktrees directory
    /// `worktrees` for its next run, holding at most `budget_mb` MiB together (ADR-055);
    /// under the scratch root when the repository's path cannot be resolved.
    pub fn with_repository_warm(mut self, worktrees: &Path, budget_mb: u64) -> Self {
        self.warm = Some(Arc::new(
            WarmTrees::for_repository(worktrees, &self.repo, budget_mb)
                .unwrap_or_else(|| WarmTrees::new(self.scratch_root.clone(), budget_mb)),
        ));
        self
    }

    /// Runs `work` on a blocking thread with a handle of the repository (kept between
    /// calls: [`RepoHandles`]); under the repository's lock when `locked` (anything that
    /// writes a ref or HEAD).
    fn blocking<T: Send + 'static>(
        &self,
        locked: bool,
        work: impl FnOnce(&git2::Repository, &Path) -> Result<T, RepoError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, RepoError>> {
        let handles = self.handles.clone();
        let scratch_root = self.scratch_root.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let lock = locked.then(|| repo_lock(handles.path()));
                let _held = lock
                    .as_ref()
                    .map(|l| l.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
                handles.with(|repo| work(repo, &scratch_root))?
            })
            .await
            .map_err(|e| RepoError::Git(format!("the git thread failed: {e}")))?
        })
    }
}

fn oid(s: &str) -> Result<git2::Oid, RepoError> {
    git2::Oid::from_str(s).map_err(|_| RepoError::Git(format!("{s:?} is not a commit id")))
}

fn find_commit<'r>(repo: &'r git2::Repository, id: &str) -> Result<git2::Commit<'r>, RepoError> {
    repo.find_commit(oid(id)?)
        .map_err(|e| RepoError::Git(format!("commit {id}: {}", e.message())))
}

/// "abc1234 subject".
fn short_line(commit: &git2::Commit<'_>) -> String {
    let id = commit.id().to_string();
    let subject: String = commit
        .summary_bytes()
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .unwrap_or_default()
        .chars()
        .take(200)
        .collect();
    format!("{} {subject}", &id[..7])
}

/// `message` with `trailer` as its last line (once): in the message's trailer block when
/// it ends with one (`Signed-off-by: …`), else after a blank line. Every `Flotilla-Task`
/// line the message had is dropped first, however it is spelled: only flotilla writes that
/// trailer on main (ADR-018), and an agent's line may name another task.
pub fn with_trailer(message: &str, trailer: &str) -> String {
    // Without those lines, and without the run of blank lines that leaves (git's own
    // clean-up collapses them too).
    let mut kept: Vec<&str> = Vec::new();
    for line in message.lines().filter(|line| !is_task_trailer(line)) {
        let blank = line.trim().is_empty();
        if !(blank && kept.last().is_some_and(|last| last.trim().is_empty())) {
            kept.push(line);
        }
    }
    let body = kept.join("\n");
    let body = body.trim_end();
    if body.is_empty() {
        return format!("{trailer}\n");
    }
    let in_block = match body.rsplit_once("\n\n") {
        Some((_, last)) => last.lines().all(is_trailer_line),
        None => false,
    };
    let separator = if in_block { "\n" } else { "\n\n" };
    format!("{body}{separator}{trailer}\n")
}

/// `Token: value`, as git's trailers are.
fn is_trailer_line(line: &str) -> bool {
    line.split_once(": ").is_some_and(|(token, _)| {
        !token.is_empty() && token.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    })
}

/// A `Flotilla-Task:` line in any case, with any blanks around the token.
fn is_task_trailer(line: &str) -> bool {
    line.split_once(':').is_some_and(|(token, _)| {
        token
            .trim_matches(|c: char| c.is_whitespace() || c.is_control())
            .eq_ignore_ascii_case("flotilla-task")
    })
}

// ---------------------------------------------------------------------------------------
// build

/// Where the building is: the candidate so far.
struct Builder<'r> {
    repo: &'r git2::Repository,
    onto: git2::Oid,
    candidate: git2::Commit<'r>,
    flotilla: git2::Signature<'static>,
}

enum Step<'r> {
    Made(git2::Commit<'r>),
    Conflict { files: Vec<String>, base: git2::Oid },
}

fn build(
    repo: &git2::Repository,
    target: &TargetBranch,
    onto: &str,
    items: &[LandItem],
    mode: LandMode,
) -> Result<BuildOutcome, RepoError> {
    let onto = find_commit(repo, onto)?;
    let mut builder = Builder {
        repo,
        onto: onto.id(),
        candidate: onto,
        flotilla: signature()?,
    };
    let mut commits = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let head = match branch_head(repo, item) {
            Ok(head) => head,
            Err(BranchHead::Unusable(detail)) => {
                return Ok(BuildOutcome::Unusable { index, detail });
            }
            Err(BranchHead::Repo(e)) => return Err(e),
        };
        let base =
            super::ancestry::merge_base(repo, builder.candidate.id(), head.id()).map_err(|e| {
                RepoError::Git(format!(
                    "branch {} shares no history with {target}: {}",
                    item.branch,
                    e.message()
                ))
            })?;
        let mode = if item.squash { LandMode::Squash } else { mode };
        let step = match mode {
            LandMode::Rebase => builder.rebase(item, &head, base)?,
            LandMode::Squash => builder.combine(item, &head, base, false)?,
            LandMode::Merge => builder.combine(item, &head, base, true)?,
        };
        match step {
            Step::Made(commit) => {
                commits.push(commit.id().to_string());
                builder.candidate = commit;
            }
            Step::Conflict { files, base } => {
                return Ok(BuildOutcome::Conflict {
                    index,
                    clashing: clashing(repo, builder.candidate.id(), base, &files)?,
                    // Whether main (`onto`) moved since the branch left it; the items before
                    // this one in the candidate are not main (yet).
                    main_moved: super::ancestry::merge_base(repo, builder.onto, head.id())
                        .map_err(git)?
                        != builder.onto,
                    files,
                });
            }
        }
    }
    Ok(BuildOutcome::Built {
        tip: builder.candidate.id().to_string(),
        commits,
    })
}

/// Why a branch's commit could not be had.
enum BranchHead {
    /// The branch is gone or moved: the item's own fault.
    Unusable(String),
    /// git failed.
    Repo(RepoError),
}

/// The branch's commit: it must still be where the handoff said.
fn branch_head<'r>(
    repo: &'r git2::Repository,
    item: &LandItem,
) -> Result<git2::Commit<'r>, BranchHead> {
    let name = format!("refs/heads/{}", item.branch);
    let reference = match repo.find_reference(&name) {
        Ok(r) => r,
        Err(e) if e.code() == git2::ErrorCode::NotFound => {
            return Err(BranchHead::Unusable(format!(
                "branch {} (task {}) does not exist",
                item.branch, item.task
            )));
        }
        Err(e) => return Err(BranchHead::Repo(git(e))),
    };
    let head = reference
        .peel_to_commit()
        .map_err(|e| BranchHead::Repo(git(e)))?;
    let expected = oid(&item.head).map_err(BranchHead::Repo)?;
    if head.id() != expected {
        return Err(BranchHead::Unusable(format!(
            "branch {} (task {}) is at {}, not at {} as its handoff recorded: it moved after \
             the handoff and is not landed",
            item.branch,
            item.task,
            head.id(),
            item.head
        )));
    }
    Ok(head)
}

/// A merge's whole index: its tree, or its conflicts.
fn in_full(repo: &git2::Repository, mut index: git2::Index) -> Result<Merged, RepoError> {
    if index.has_conflicts() {
        return Ok(Merged::Conflicts(index));
    }
    index.write_tree_to(repo).map(Merged::Clean).map_err(git)
}

/// The paths an index could not merge, sorted.
fn conflicted_paths(index: &git2::Index) -> Result<Vec<String>, RepoError> {
    let mut files = BTreeSet::new();
    for conflict in index.conflicts().map_err(git)? {
        let conflict = conflict.map_err(git)?;
        for entry in [&conflict.ancestor, &conflict.our, &conflict.their]
            .into_iter()
            .flatten()
        {
            files.insert(String::from_utf8_lossy(&entry.path).into_owned());
        }
    }
    Ok(files.into_iter().collect())
}

impl<'r> Builder<'r> {
    fn tree(&self, id: git2::Oid) -> Result<git2::Tree<'r>, RepoError> {
        self.repo.find_tree(id).map_err(git)
    }

    /// One commit on the candidate.
    fn commit(
        &self,
        author: &git2::Signature<'_>,
        message: &str,
        tree: git2::Oid,
        extra_parent: Option<&git2::Commit<'r>>,
    ) -> Result<git2::Commit<'r>, RepoError> {
        let tree = self.tree(tree)?;
        let mut parents = vec![&self.candidate];
        parents.extend(extra_parent);
        let id = self
            .repo
            .commit(None, author, &self.flotilla, message, &tree, &parents)
            .map_err(git)?;
        self.repo.find_commit(id).map_err(git)
    }

    /// Replays the branch's commits since `base` (its first-parent history, oldest first)
    /// on the candidate, each with the item's trailer; commits that change nothing there
    /// are left out, but the item always gets one commit.
    fn rebase(
        &mut self,
        item: &LandItem,
        head: &git2::Commit<'r>,
        base: git2::Oid,
    ) -> Result<Step<'r>, RepoError> {
        let mut ids = super::ancestry::first_parent_since(self.repo, head.id(), base, usize::MAX)
            .map_err(git)?;
        ids.reverse();
        let start = self.candidate.clone();
        let mut made = false;
        for id in ids {
            let commit = self.repo.find_commit(id).map_err(git)?;
            // A merge commit on the branch (main merged into it) is replayed as its change
            // against its first parent.
            let mainline = if commit.parent_count() > 1 { 1 } else { 0 };
            // `cherrypick_commit`'s merge, on only what differs (ADR-045).
            let merged = match pick_base(&commit, mainline).map_err(git)? {
                Some(parent) => merge_trees(
                    self.repo,
                    &parent,
                    &self.candidate.tree().map_err(git)?,
                    &commit.tree().map_err(git)?,
                )
                .map_err(git)?,
                // A root commit: libgit2's own pick, against no tree.
                None => {
                    let index = self
                        .repo
                        .cherrypick_commit(&commit, &self.candidate, mainline, None)
                        .map_err(git)?;
                    in_full(self.repo, index)?
                }
            };
            let tree = match merged {
                Merged::Clean(tree) => tree,
                Merged::Conflicts(index) => {
                    self.candidate = start;
                    return Ok(Step::Conflict {
                        files: conflicted_paths(&index)?,
                        base,
                    });
                }
            };
            if tree == self.candidate.tree_id() {
                continue;
            }
            let message = with_trailer(
                &String::from_utf8_lossy(commit.message_bytes()),
                &item.trailer,
            );
            self.candidate = self.commit(&commit.author(), &message, tree, None)?;
            made = true;
        }
        let last = if made {
            self.candidate.clone()
        } else {
            // Nothing of the branch is new here: one empty commit still says it landed.
            let message = with_trailer(&item.subject, &item.trailer);
            self.commit(&self.flotilla, &message, self.candidate.tree_id(), None)?
        };
        self.candidate = start;
        Ok(Step::Made(last))
    }

    /// One commit holding the branch's change since `base` merged into the candidate: a
    /// squash (the candidate its only parent) or a merge (the branch's head its second).
    fn combine(
        &self,
        item: &LandItem,
        head: &git2::Commit<'r>,
        base: git2::Oid,
        merge: bool,
    ) -> Result<Step<'r>, RepoError> {
        let ancestor = self
            .repo
            .find_commit(base)
            .map_err(git)?
            .tree()
            .map_err(git)?;
        let ours = self.candidate.tree().map_err(git)?;
        let theirs = head.tree().map_err(git)?;
        let tree = match merge_trees(self.repo, &ancestor, &ours, &theirs).map_err(git)? {
            Merged::Clean(tree) => tree,
            Merged::Conflicts(index) => {
                return Ok(Step::Conflict {
                    files: conflicted_paths(&index)?,
                    base,
                });
            }
        };
        let message = with_trailer(&item.subject, &item.trailer);
        // A branch the candidate already holds gets no merge: its head would be a parent
        // the candidate descends from already.
        let second = (merge && base != head.id()).then_some(head);
        self.commit(&self.flotilla, &message, tree, second)
            .map(Step::Made)
    }
}

/// The commits on `tip`'s first-parent history since `base` that touched `files`, newest
/// first, as "abc1234 subject" (at most [`MAX_CLASHING`], reading at most
/// [`MAX_LANDED_WALK`] commits).
fn clashing(
    repo: &git2::Repository,
    tip: git2::Oid,
    base: git2::Oid,
    files: &[String],
) -> Result<Vec<String>, RepoError> {
    let walk =
        super::ancestry::first_parent_since(repo, tip, base, MAX_LANDED_WALK).map_err(git)?;
    let mut options = git2::DiffOptions::new();
    options.disable_pathspec_match(true);
    for file in files {
        options.pathspec(file);
    }
    let mut found = Vec::new();
    for id in walk {
        let commit = repo.find_commit(id).map_err(git)?;
        let tree = commit.tree().map_err(git)?;
        let parent = match commit.parent(0) {
            Ok(parent) => Some(parent.tree().map_err(git)?),
            Err(_) => None,
        };
        let diff = repo
            .diff_tree_to_tree(parent.as_ref(), Some(&tree), Some(&mut options))
            .map_err(git)?;
        if diff.deltas().len() > 0 {
            found.push(short_line(&commit));
            if found.len() >= MAX_CLASHING {
                break;
            }
        }
    }
    Ok(found)
}

// ---------------------------------------------------------------------------------------
// landed

/// For each list of `candidates`, the first of them on main's first-parent history from
/// `tip` (at most [`MAX_LANDED_WALK`] commits read).
fn find_on_main(
    repo: &git2::Repository,
    tip: &str,
    candidates: &[Vec<String>],
) -> Result<Vec<Option<String>>, RepoError> {
    let mut found: Vec<Option<String>> = vec![None; candidates.len()];
    let mut missing = candidates.iter().filter(|c| !c.is_empty()).count();
    let mut current = Some(find_commit(repo, tip)?);
    let mut read = 0;
    while let Some(commit) = current {
        if missing == 0 || read >= MAX_LANDED_WALK {
            break;
        }
        read += 1;
        let id = commit.id().to_string();
        for (slot, wanted) in found.iter_mut().zip(candidates) {
            if slot.is_none() && wanted.contains(&id) {
                *slot = Some(id.clone());
                missing -= 1;
            }
        }
        current = commit.parent(0).ok();
    }
    Ok(found)
}

// ---------------------------------------------------------------------------------------
// scratch checkouts

/// `label` as a directory name: ASCII letters, digits, `-`, `_` and `.` (anything else
/// becomes `-`), at most [`MAX_SCRATCH_LABEL`] characters, never empty or dots only.
pub fn scratch_label(label: &str) -> String {
    let clean: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(MAX_SCRATCH_LABEL)
        .collect();
    if clean.chars().all(|c| c == '.') {
        "scratch".to_string()
    } else {
        clean
    }
}

fn scratch(
    repo: &git2::Repository,
    root: &Path,
    commit: &str,
    label: &str,
) -> Result<ScratchTree, RepoError> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let target = find_commit(repo, commit)?;
    std::fs::create_dir_all(root).map_err(|e| io("cannot create", root, e))?;
    let label = scratch_label(label);
    let path = loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = root.join(format!("{label}-{}-{n}", std::process::id()));
        match std::fs::create_dir(&path) {
            Ok(()) => break path,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io("cannot create", &path, e)),
        }
    };
    let filled = (|| {
        // An index of its own, in memory: the repository's (the user's) is neither read
        // nor written.
        let mut index = git2::Index::new().map_err(git)?;
        repo.set_index(&mut index).map_err(git)?;
        let mut checkout = git2::build::CheckoutBuilder::new();
        checkout
            .target_dir(&path)
            .force()
            .refresh(false)
            .update_index(false);
        repo.checkout_tree(target.as_object(), Some(&mut checkout))
            .map_err(git)
    })();
    if let Err(e) = filled {
        let _ = remove_dir(&path);
        return Err(e);
    }
    Ok(ScratchTree {
        path,
        commit: target.id().to_string(),
    })
}

fn remove_scratch(root: &Path, tree: &ScratchTree) -> Result<(), RepoError> {
    // Only a directory made under the scratch root (its direct child) is removed.
    let inside = match (
        tree.path.parent().map(std::fs::canonicalize),
        std::fs::canonicalize(root),
    ) {
        (Some(Ok(parent)), Ok(root)) => parent == root,
        // The root is gone, and with it the scratch checkout.
        (_, Err(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        _ => false,
    };
    let named = tree.path.file_name().is_some_and(|n| n != ".." && n != ".");
    if !inside || !named {
        return Err(RepoError::Git(format!(
            "{} is not a scratch checkout under {}",
            tree.path.display(),
            root.display()
        )));
    }
    remove_dir(&tree.path)
}

// ---------------------------------------------------------------------------------------
// branches and the user's checkout

fn delete_branch(
    repo: &git2::Repository,
    target: &TargetBranch,
    branch: &str,
) -> Result<(), RepoError> {
    if branch == target.name() || !branch.starts_with(TASK_BRANCH_PREFIX) {
        return Err(RepoError::Git(format!(
            "refusing to delete branch {branch:?}: only flotilla's task branches \
             ({TASK_BRANCH_PREFIX}…) are deleted"
        )));
    }
    super::delete_branch(repo, branch).map(|_| ())
}

/// The user's checkout of main brought to main's tip (`checkout::sync`, ADR-021); `old` and
/// `new` are what the caller saw, and only say whether anything is to be done: main's
/// actual tip is read from the ref.
fn sync_checkout(
    repo: &git2::Repository,
    target: &TargetBranch,
    _old: &str,
    _new: &str,
) -> Result<CheckoutSync, RepoError> {
    super::checkout::sync(repo, target)
}

impl MergeGit for GitMerge {
    fn build(
        &self,
        onto: String,
        items: Vec<LandItem>,
        mode: LandMode,
    ) -> BoxFuture<'static, Result<BuildOutcome, RepoError>> {
        let target = self.target.clone();
        self.blocking(false, move |repo, _| {
            build(repo, &target, &onto, &items, mode)
        })
    }

    fn find_on_main(
        &self,
        tip: String,
        candidates: Vec<Vec<String>>,
    ) -> BoxFuture<'static, Result<Vec<Option<String>>, RepoError>> {
        self.blocking(false, move |repo, _| find_on_main(repo, &tip, &candidates))
    }

    fn contains(
        &self,
        tip: String,
        ancestor: String,
    ) -> BoxFuture<'static, Result<bool, RepoError>> {
        self.blocking(false, move |repo, _| {
            let (tip, ancestor) = (oid(&tip)?, oid(&ancestor)?);
            super::ancestry::descends(repo, tip, ancestor).map_err(git)
        })
    }

    fn scratch(
        &self,
        commit: String,
        label: String,
    ) -> BoxFuture<'static, Result<ScratchTree, RepoError>> {
        // A scratch checkout flotilla's storage refuses is nobody's failure (ADR-024).
        // It sets an in-memory index on its handle: one of its own, never a kept one.
        let path = self.repo.clone();
        let root = self.scratch_root.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let repo = git2::Repository::open(&path)
                    .map_err(|_| RepoError::NotARepository(path.clone()))?;
                scratch(&repo, &root, &commit, &label).map_err(RepoError::storage_or_self)
            })
            .await
            .map_err(|e| RepoError::Git(format!("the git thread failed: {e}")))?
        })
    }

    fn remove_scratch(&self, tree: ScratchTree) -> BoxFuture<'static, Result<(), RepoError>> {
        let root = self.scratch_root.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || remove_scratch(&root, &tree))
                .await
                .map_err(|e| RepoError::Git(format!("the git thread failed: {e}")))?
        })
    }

    fn warm(
        &self,
        commit: String,
        slot: WarmSlot,
    ) -> BoxFuture<'static, Result<Option<WarmTree>, RepoError>> {
        match self.warm.clone() {
            Some(warm) => warm.take(self.repo.clone(), commit, slot),
            None => Box::pin(async { Ok(None) }),
        }
    }

    fn warm_updated(&self, tree: &WarmTree) -> BoxFuture<'static, Result<(), RepoError>> {
        match self.warm.clone() {
            Some(warm) => warm.updated(tree),
            None => Box::pin(async { Ok(()) }),
        }
    }

    fn settle_warm(&self, tree: WarmTree, keep: bool) -> BoxFuture<'static, Result<(), RepoError>> {
        match self.warm.clone() {
            Some(warm) => warm.settle(tree, keep),
            None => Box::pin(async { Ok(()) }),
        }
    }

    fn conflict_markers(
        &self,
        commit: String,
        paths: Option<Vec<String>>,
    ) -> BoxFuture<'static, Result<Vec<MarkerHit>, RepoError>> {
        let free = self.marker_free.clone();
        self.blocking(false, move |repo, _| {
            conflict_markers(repo, &commit, paths.as_deref(), &free)
        })
    }

    fn delete_branch(&self, branch: String) -> BoxFuture<'static, Result<(), RepoError>> {
        let target = self.target.clone();
        self.blocking(true, move |repo, _| delete_branch(repo, &target, &branch))
    }

    /// One blocking call, one open and one hold of the repository's lock for the batch.
    fn delete_branches(
        &self,
        branches: Vec<String>,
    ) -> BoxFuture<'static, Vec<(String, RepoError)>> {
        let target = self.target.clone();
        let all = branches.clone();
        let deleting = self.blocking(true, move |repo, _| {
            Ok(branches
                .into_iter()
                .filter_map(|branch| {
                    delete_branch(repo, &target, &branch)
                        .err()
                        .map(|e| (branch, e))
                })
                .collect::<Vec<_>>())
        });
        Box::pin(async move {
            match deleting.await {
                Ok(failed) => failed,
                // The repository could not be opened, or the thread died: none went.
                Err(e) => all.into_iter().map(|b| (b, e.clone())).collect(),
            }
        })
    }

    fn sync_checkout(
        &self,
        old: String,
        new: String,
    ) -> BoxFuture<'static, Result<CheckoutSync, RepoError>> {
        let target = self.target.clone();
        self.blocking(true, move |repo, _| {
            sync_checkout(repo, &target, &old, &new)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trailer_ends_the_message_once() {
        let t = "Flotilla-Task: t1";
        assert_eq!(with_trailer("add x\n", t), "add x\n\nFlotilla-Task: t1\n");
        assert_eq!(
            with_trailer("add x\n\nbody\n", t),
            "add x\n\nbody\n\nFlotilla-Task: t1\n"
        );
        assert_eq!(
            with_trailer("add x\n\nFlotilla-Task: t1\n", t),
            "add x\n\nFlotilla-Task: t1\n"
        );
        assert_eq!(
            with_trailer("add x\n\nFlotilla-Task: t1\n\nmore\n", t),
            "add x\n\nmore\n\nFlotilla-Task: t1\n"
        );
        assert_eq!(
            with_trailer("add x\n\nSigned-off-by: a <a@b>\n", t),
            "add x\n\nSigned-off-by: a <a@b>\nFlotilla-Task: t1\n"
        );
        // A subject that looks like a trailer is still the subject.
        assert_eq!(with_trailer("fix: y", t), "fix: y\n\nFlotilla-Task: t1\n");
        assert_eq!(with_trailer("", t), "Flotilla-Task: t1\n");
    }

    #[test]
    fn an_agents_task_trailers_never_reach_main() {
        let t = "Flotilla-Task: run/t1";
        let forged = "add x\n\nFlotilla-Task: run/t2\nflotilla-task:run/t3\n  FLOTILLA-TASK : run/t4\n\
                      Signed-off-by: a <a@b>\n";
        assert_eq!(
            with_trailer(forged, t),
            "add x\n\nSigned-off-by: a <a@b>\nFlotilla-Task: run/t1\n"
        );
        assert_eq!(
            with_trailer("Flotilla-Task: run/t9\n", t),
            "Flotilla-Task: run/t1\n"
        );
        // Other lines that mention it are kept.
        assert_eq!(
            with_trailer("about the Flotilla-Task trailer\n", t),
            "about the Flotilla-Task trailer\n\nFlotilla-Task: run/t1\n"
        );
    }

    #[test]
    fn scratch_labels_are_plain_names() {
        assert_eq!(scratch_label("gate t1/x y"), "gate-t1-x-y");
        assert_eq!(scratch_label(".."), "scratch");
        assert_eq!(scratch_label(""), "scratch");
        assert_eq!(scratch_label(&"a".repeat(100)).len(), MAX_SCRATCH_LABEL);
        assert_eq!(scratch_label("v1.2_rc-3"), "v1.2_rc-3");
    }
}
