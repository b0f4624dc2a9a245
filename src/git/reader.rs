//! The `RepoReader` port on git2: reads the run's target branch ("main" in the ports' and
//! actors' words: `[merge] branch`, ADR-022), its tip's tree, blobs and history, never the
//! work tree or index; and the `MainRef` port, the compare-and-swap of that branch's ref
//! that only the MergeQueue is given. Every call opens the repository on a blocking thread
//! (`git2::Repository` is not `Sync`, and git work blocks).
//!
//! [`TargetBranch`] is the validated name of a run's target, and [`resolve_target`] picks
//! it at submit.

use std::fmt;
use std::path::PathBuf;

use flotilla_actors::ports::{MainRef, MainRefError, RepoError, RepoReader, RepoSnapshot};
use futures::future::BoxFuture;

use crate::git::merge::TASK_BRANCH_PREFIX;

/// The branch a run lands its work on (ADR-022): a local branch name git accepts
/// (`refs/heads/NAME` is a valid ref name), not `HEAD`, not starting with `-`, and outside
/// flotilla's own `flotilla/` namespace. Only flotilla and the user's configuration name
/// it; a model never does.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TargetBranch(String);

/// The longest target branch name taken (git has no limit; a terminal line has).
pub const MAX_TARGET_BRANCH_BYTES: usize = 200;

/// Why a name cannot be a target branch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetBranchError {
    #[error("merge.branch is empty: name a branch, or leave it out to use the one HEAD names")]
    Empty,
    #[error("merge.branch is {len} bytes long: at most {MAX_TARGET_BRANCH_BYTES}")]
    TooLong { len: usize },
    #[error(
        "merge.branch = {0:?} is not a branch name git accepts (see `git check-ref-format --branch`)"
    )]
    Invalid(String),
    #[error(
        "merge.branch = {0:?} is in flotilla's own namespace ({TASK_BRANCH_PREFIX}…), where its task branches live: choose another"
    )]
    Reserved(String),
}

impl TargetBranch {
    pub fn new(name: &str) -> Result<Self, TargetBranchError> {
        if name.is_empty() {
            return Err(TargetBranchError::Empty);
        }
        if name.len() > MAX_TARGET_BRANCH_BYTES {
            return Err(TargetBranchError::TooLong { len: name.len() });
        }
        let shown = || name.chars().take(100).collect::<String>();
        // What `git branch` refuses besides git's ref rules: `HEAD`, and a leading dash
        // (an option to every git command); and `@`, which git reads as HEAD.
        if name == "HEAD"
            || name == "@"
            || name.starts_with('-')
            || !git2::Reference::is_valid_name(&format!("refs/heads/{name}"))
        {
            return Err(TargetBranchError::Invalid(shown()));
        }
        if name.starts_with(TASK_BRANCH_PREFIX) || name == TASK_BRANCH_PREFIX.trim_end_matches('/')
        {
            return Err(TargetBranchError::Reserved(shown()));
        }
        Ok(TargetBranch(name.to_string()))
    }

    /// The target of a run whose configuration names none: runs journaled before
    /// ADR-022, which always landed on `main`.
    pub fn legacy() -> Self {
        TargetBranch("main".into())
    }

    /// The target a run's configuration names (`[merge] branch`, set at submit), or
    /// [`TargetBranch::legacy`] for a run journaled before there was one.
    pub fn of_run(configured: Option<&str>) -> Result<Self, TargetBranchError> {
        configured.map_or_else(|| Ok(Self::legacy()), Self::new)
    }

    pub fn name(&self) -> &str {
        &self.0
    }

    /// `refs/heads/NAME`.
    pub fn refname(&self) -> String {
        format!("refs/heads/{}", self.0)
    }
}

impl fmt::Display for TargetBranch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why no target branch can be picked at submit: each says the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveTargetError {
    #[error(transparent)]
    Name(#[from] TargetBranchError),
    #[error(
        "merge.branch = {name:?}: the repository has no such branch{}; create it (git branch {name}) or set [merge] branch in flotilla.toml to an existing one",
        branches_hint(.branches)
    )]
    Missing { name: String, branches: Vec<String> },
    #[error(
        "HEAD names branch {name:?}, which has no commits yet: flotilla's task branches start from its tip, so commit something first (git add -A && git commit -m start)"
    )]
    Unborn { name: String },
    #[error(
        "HEAD names {name:?}, which cannot be the target branch ({reason}): set [merge] branch in flotilla.toml to the branch work lands on"
    )]
    HeadUnusable { name: String, reason: String },
    #[error(
        "HEAD is detached and the repository has no branch: create one (git branch main) or set [merge] branch in flotilla.toml"
    )]
    NoBranch,
    #[error(
        "HEAD is detached and the repository has {} branches{}: set [merge] branch = \"NAME\" in flotilla.toml to the one work lands on",
        .branches.len(),
        branches_hint(.branches)
    )]
    Ambiguous { branches: Vec<String> },
    #[error("reading the repository's branches: {0}")]
    Git(String),
}

/// How many of the repository's branches an error names.
const MAX_NAMED_BRANCHES: usize = 5;

fn branches_hint(branches: &[String]) -> String {
    if branches.is_empty() {
        return String::new();
    }
    let mut named: Vec<String> = branches
        .iter()
        .take(MAX_NAMED_BRANCHES)
        .map(|b| format!("{b:?}"))
        .collect();
    if branches.len() > MAX_NAMED_BRANCHES {
        named.push(format!("and {} more", branches.len() - MAX_NAMED_BRANCHES));
    }
    format!(" ({})", named.join(", "))
}

/// The repository's local branches that are not flotilla's task branches, sorted.
fn user_branches(repo: &git2::Repository) -> Result<Vec<String>, ResolveTargetError> {
    let failed = |e: git2::Error| ResolveTargetError::Git(e.message().to_string());
    let mut names = Vec::new();
    for branch in repo
        .branches(Some(git2::BranchType::Local))
        .map_err(failed)?
    {
        let (branch, _) = branch.map_err(failed)?;
        if let Ok(Some(name)) = branch.name()
            && !name.starts_with(TASK_BRANCH_PREFIX)
        {
            names.push(name.to_string());
        }
    }
    names.sort();
    Ok(names)
}

/// Whether `refs/heads/NAME` exists and holds a commit.
fn has_commit(repo: &git2::Repository, target: &TargetBranch) -> bool {
    repo.find_reference(&target.refname())
        .and_then(|r| r.peel_to_commit())
        .is_ok()
}

/// The branch a run lands on, picked once at submit (ADR-022): `configured` (`[merge]
/// branch`) when it exists; else the branch HEAD names, which must have a commit; else,
/// HEAD detached, the repository's only branch (flotilla's task branches aside). Anything
/// else is refused with the fix. Blocks (git2): call it off any async thread.
pub fn resolve_target(
    repo: &git2::Repository,
    configured: Option<&str>,
) -> Result<TargetBranch, ResolveTargetError> {
    if let Some(name) = configured {
        let target = TargetBranch::new(name)?;
        if !has_commit(repo, &target) {
            return Err(ResolveTargetError::Missing {
                name: target.name().to_string(),
                branches: user_branches(repo)?,
            });
        }
        return Ok(target);
    }
    let head = repo
        .find_reference("HEAD")
        .map_err(|e| ResolveTargetError::Git(e.message().to_string()))?;
    if let Some(bytes) = head.symbolic_target_bytes() {
        let Ok(symbolic) = std::str::from_utf8(bytes) else {
            return Err(ResolveTargetError::HeadUnusable {
                name: String::from_utf8_lossy(bytes).chars().take(100).collect(),
                reason: "the name is not UTF-8".into(),
            });
        };
        let Some(name) = symbolic.strip_prefix("refs/heads/") else {
            return Err(ResolveTargetError::HeadUnusable {
                name: symbolic.chars().take(100).collect(),
                reason: "not a local branch".into(),
            });
        };
        let target = TargetBranch::new(name).map_err(|e| ResolveTargetError::HeadUnusable {
            name: name.chars().take(100).collect(),
            reason: e.to_string(),
        })?;
        if !has_commit(repo, &target) {
            return Err(ResolveTargetError::Unborn {
                name: target.name().to_string(),
            });
        }
        return Ok(target);
    }
    // Detached: only a repository with one branch says which it is.
    let mut branches = user_branches(repo)?;
    match branches.len() {
        0 => Err(ResolveTargetError::NoBranch),
        1 => {
            let name = branches.remove(0);
            let target =
                TargetBranch::new(&name).map_err(|e| ResolveTargetError::HeadUnusable {
                    name: name.chars().take(100).collect(),
                    reason: e.to_string(),
                })?;
            if !has_commit(repo, &target) {
                return Err(ResolveTargetError::Unborn { name });
            }
            Ok(target)
        }
        _ => Err(ResolveTargetError::Ambiguous { branches }),
    }
}

pub struct GitRepo {
    path: PathBuf,
    target: TargetBranch,
}

impl GitRepo {
    /// The repository at `path`, whose work lands on `target`.
    pub fn new(path: impl Into<PathBuf>, target: TargetBranch) -> Self {
        GitRepo {
            path: path.into(),
            target,
        }
    }

    pub fn target(&self) -> &TargetBranch {
        &self.target
    }

    fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&git2::Repository, &TargetBranch) -> Result<T, RepoError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, RepoError>> {
        let path = self.path.clone();
        let target = self.target.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let repo = git2::Repository::open(&path)
                    .map_err(|_| RepoError::NotARepository(path.clone()))?;
                work(&repo, &target)
            })
            .await
            .map_err(|e| RepoError::Git(format!("the git thread failed: {e}")))?
        })
    }
}

fn git(e: git2::Error) -> RepoError {
    RepoError::Git(e.message().to_string())
}

/// The target branch's commit; none when the branch does not exist (an unborn branch:
/// `git init` and nothing committed yet). Never another branch's: the run lands on this
/// one, and reading HEAD instead would build on what the compare-and-swap then refuses.
pub(crate) fn main_commit<'r>(
    repo: &'r git2::Repository,
    target: &TargetBranch,
) -> Result<Option<git2::Commit<'r>>, RepoError> {
    match repo.find_reference(&target.refname()) {
        Ok(reference) => reference.peel_to_commit().map(Some).map_err(git),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
        Err(e) => Err(git(e)),
    }
}

/// A blob's text, cut at `max` bytes on a character boundary (with a note saying so).
fn bounded_text(bytes: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    if text.len() <= max {
        return text.into_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n[… cut: the file is {} bytes; the first {end} are shown]",
        &text[..end],
        bytes.len()
    )
}

fn snapshot(repo: &git2::Repository, target: &TargetBranch) -> Result<RepoSnapshot, RepoError> {
    let Some(commit) = main_commit(repo, target)? else {
        return Ok(RepoSnapshot::default());
    };
    let tree = commit.tree().map_err(git)?;
    let mut files = Vec::new();
    let mut omitted = 0usize;
    tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
        if entry.kind() == Some(git2::ObjectType::Blob) {
            if files.len() < RepoSnapshot::MAX_FILES {
                files.push(format!(
                    "{dir}{}",
                    String::from_utf8_lossy(entry.name_bytes())
                ));
            } else {
                omitted += 1;
            }
        }
        git2::TreeWalkResult::Ok
    })
    .map_err(git)?;
    files.sort();
    let mut docs = Vec::new();
    for name in RepoSnapshot::DOCS {
        let Ok(entry) = tree.get_path(std::path::Path::new(name)) else {
            continue;
        };
        if let Ok(blob) = entry.to_object(repo).and_then(|o| o.peel_to_blob()) {
            docs.push((
                name.to_string(),
                bounded_text(blob.content(), RepoSnapshot::MAX_DOC_BYTES),
            ));
        }
    }
    let mut walk = repo.revwalk().map_err(git)?;
    walk.push(commit.id()).map_err(git)?;
    let recent_commits = walk
        .take(RepoSnapshot::RECENT_COMMITS)
        .filter_map(|id| repo.find_commit(id.ok()?).ok())
        .map(|c| {
            let id = c.id().to_string();
            let subject: String = c
                .summary()
                .ok()
                .flatten()
                .unwrap_or("")
                .chars()
                .take(200)
                .collect();
            format!("{} {subject}", &id[..7.min(id.len())])
        })
        .collect();
    Ok(RepoSnapshot {
        commit: commit.id().to_string(),
        files,
        files_omitted: omitted,
        docs,
        recent_commits,
    })
}

impl RepoReader for GitRepo {
    fn main_tip(&self) -> BoxFuture<'static, Result<String, RepoError>> {
        self.blocking(|repo, target| {
            main_commit(repo, target)?
                .map(|c| c.id().to_string())
                .ok_or_else(|| {
                    RepoError::Git(format!(
                        "branch {target} has no commits (or does not exist)"
                    ))
                })
        })
    }

    fn snapshot(&self) -> BoxFuture<'static, Result<RepoSnapshot, RepoError>> {
        self.blocking(snapshot)
    }

    fn changed_paths(
        &self,
        branch: String,
        base: String,
    ) -> BoxFuture<'static, Result<Vec<String>, RepoError>> {
        self.blocking(move |repo, _| {
            let tree_of = |spec: &str| {
                repo.revparse_single(spec)
                    .and_then(|o| o.peel_to_tree())
                    .map_err(git)
            };
            let (old, new) = (tree_of(&base)?, tree_of(&branch)?);
            let diff = repo
                .diff_tree_to_tree(Some(&old), Some(&new), None)
                .map_err(git)?;
            let mut paths: Vec<String> = diff
                .deltas()
                .flat_map(|d| [d.old_file().path(), d.new_file().path()])
                .flatten()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            paths.sort();
            paths.dedup();
            Ok(paths)
        })
    }
}

impl MainRef for GitRepo {
    fn compare_and_swap(
        &self,
        expected: String,
        new: String,
    ) -> BoxFuture<'static, Result<(), MainRefError>> {
        let path = self.path.clone();
        let target = self.target.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let repo = git2::Repository::open(&path)
                    .map_err(|_| RepoError::NotARepository(path.clone()))?;
                let oid = |s: &str| {
                    git2::Oid::from_str(s).map_err(|e| RepoError::Git(git(e).to_string()))
                };
                let (from, to) = (oid(&expected)?, oid(&new)?);
                let name = target.refname();
                // A checked-out target moves only with its index and work tree (ADR-021),
                // and what writes the user's checkout is serialized with the rest of `.git`.
                let lock = crate::git::worktrees::repo_lock(&path);
                let _held = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                let (from_text, to_text) = (expected.clone(), new.clone());
                crate::git::checkout::move_main(&repo, &target, &from_text, &to_text, || {
                    // git2 checks the ref's value and moves it under git's own ref lock.
                    // A kill inside it leaves `<ref>.lock`: the record lets a later heal
                    // remove it (ref_lock).
                    let moved = crate::git::ref_lock::guarded(&repo, &name, || {
                        repo.reference_matching(&name, to, true, from, "flotilla: land")
                    })?;
                    match moved {
                        Ok(_) => Ok(()),
                        Err(e)
                            if e.code() == git2::ErrorCode::Modified
                                || e.code() == git2::ErrorCode::NotFound =>
                        {
                            let actual = repo
                                .refname_to_id(&name)
                                .map(|id| id.to_string())
                                .unwrap_or_default();
                            Err(MainRefError::Moved { expected, actual })
                        }
                        // Another writer holds `main.lock` (libgit2 says Locked; some
                        // versions only say so in the message): contention (ADR-018).
                        Err(e)
                            if e.code() == git2::ErrorCode::Locked
                                || e.message().contains(".lock") =>
                        {
                            Err(MainRefError::Busy {
                                detail: e.message().to_string(),
                            })
                        }
                        Err(e) => Err(MainRefError::Repo(git(e))),
                    }
                })
            })
            .await
            .map_err(|e| {
                MainRefError::Repo(RepoError::Git(format!("the git thread failed: {e}")))
            })?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(repo: &git2::Repository, files: &[(&str, &str)], message: &str) {
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        let mut index = repo.index().unwrap();
        for (path, text) in files {
            let full = repo.workdir().unwrap().join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(&full, text).unwrap();
            index.add_path(std::path::Path::new(path)).unwrap();
        }
        index.write().unwrap();
        let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
        let parents: Vec<git2::Commit> = repo
            .head()
            .ok()
            .and_then(|h| h.peel_to_commit().ok())
            .into_iter()
            .collect();
        let parents: Vec<&git2::Commit> = parents.iter().collect();
        repo.commit(Some("HEAD"), &sig, &sig, message, &tree, &parents)
            .unwrap();
    }

    #[tokio::test]
    async fn a_snapshot_reads_mains_tip_not_the_work_tree() {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init_opts(
            dir.path(),
            git2::RepositoryInitOptions::new().initial_head("main"),
        )
        .unwrap();
        let reader = GitRepo::new(dir.path(), TargetBranch::new("main").unwrap());
        assert_eq!(reader.snapshot().await.unwrap(), RepoSnapshot::default());
        commit(
            &repo,
            &[("SPEC.md", "# Spec\nadd numbers\n"), ("src/a.rs", "")],
            "first",
        );
        commit(&repo, &[("FEATURES.json", "{}")], "second");
        // Uncommitted and untracked changes are not main.
        std::fs::write(dir.path().join("SPEC.md"), "dirty").unwrap();
        std::fs::write(dir.path().join("untracked.rs"), "").unwrap();
        let snap = reader.snapshot().await.unwrap();
        assert_eq!(snap.files, ["FEATURES.json", "SPEC.md", "src/a.rs"]);
        assert_eq!(snap.doc("SPEC.md"), Some("# Spec\nadd numbers\n"));
        assert_eq!(snap.doc("AGENTS.md"), None);
        assert_eq!(snap.recent_commits.len(), 2);
        assert!(
            snap.recent_commits[0].ends_with(" second"),
            "{:?}",
            snap.recent_commits
        );
        assert_eq!(reader.main_tip().await.unwrap(), snap.commit);
    }

    #[tokio::test]
    async fn main_moves_only_from_the_tip_the_caller_built_on() {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init_opts(
            dir.path(),
            git2::RepositoryInitOptions::new().initial_head("main"),
        )
        .unwrap();
        commit(&repo, &[("a", "1")], "first");
        let first = repo.refname_to_id("refs/heads/main").unwrap().to_string();
        commit(&repo, &[("a", "2")], "second");
        let second = repo.refname_to_id("refs/heads/main").unwrap().to_string();
        let main = GitRepo::new(dir.path(), TargetBranch::new("main").unwrap());
        // Built on `first`, but main is at `second`: refused, and main stays.
        let refused = main.compare_and_swap(first.clone(), first.clone()).await;
        assert_eq!(
            refused,
            Err(MainRefError::Moved {
                expected: first.clone(),
                actual: second.clone()
            })
        );
        assert_eq!(main.main_tip().await.unwrap(), second);
        main.compare_and_swap(second.clone(), first.clone())
            .await
            .unwrap();
        assert_eq!(main.main_tip().await.unwrap(), first);
    }

    #[tokio::test]
    async fn a_locked_main_is_contention_not_failure() {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init_opts(
            dir.path(),
            git2::RepositoryInitOptions::new().initial_head("main"),
        )
        .unwrap();
        commit(&repo, &[("a.txt", "a\n")], "one");
        let one = repo.refname_to_id("refs/heads/main").unwrap();
        commit(&repo, &[("a.txt", "b\n")], "two");
        let two = repo.refname_to_id("refs/heads/main").unwrap();
        repo.reference("refs/heads/main", one, true, "back")
            .unwrap();
        // main not checked out (ADR-021's checkout rules are tested in tests/it/checkout.rs):
        // only the ref and its lock are in play here.
        repo.set_head_detached(two).unwrap();
        // Another writer is moving main right now.
        let lock = dir.path().join(".git/refs/heads/main.lock");
        std::fs::write(&lock, format!("{one}\n")).unwrap();
        let main = GitRepo::new(dir.path(), TargetBranch::new("main").unwrap());
        let busy = main
            .compare_and_swap(one.to_string(), two.to_string())
            .await
            .unwrap_err();
        assert!(matches!(busy, MainRefError::Busy { .. }), "{busy:?}");
        std::fs::remove_file(&lock).unwrap();
        main.compare_and_swap(one.to_string(), two.to_string())
            .await
            .unwrap();
        assert_eq!(repo.refname_to_id("refs/heads/main").unwrap(), two);
    }

    /// A repository with one commit on `head`'s branch, and `others` pointing at it too.
    fn repo_on(head: &str, others: &[&str]) -> (tempfile::TempDir, git2::Repository) {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init_opts(
            dir.path(),
            git2::RepositoryInitOptions::new().initial_head(head),
        )
        .unwrap();
        commit(&repo, &[("a", "1")], "first");
        {
            let tip = repo.head().unwrap().peel_to_commit().unwrap();
            for name in others {
                repo.branch(name, &tip, false).unwrap();
            }
        }
        (dir, repo)
    }

    fn resolved(repo: &git2::Repository, configured: Option<&str>) -> Result<String, String> {
        resolve_target(repo, configured)
            .map(|t| t.name().to_string())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn target_names_follow_gits_rules_and_stay_out_of_flotillas_namespace() {
        for good in ["main", "master", "release/2.0", "feature-x", "v1.2", "ü"] {
            assert_eq!(TargetBranch::new(good).unwrap().name(), good);
        }
        for bad in [
            "",
            "HEAD",
            "-x",
            "a..b",
            "a b",
            "a~1",
            "a^",
            "a:b",
            "a?",
            "a*",
            "a[",
            "a\\b",
            "/a",
            "a/",
            "a.lock",
            "a//b",
            "@{x}",
            "@",
            "a\u{1b}[31m",
            ".a",
            "a/.b",
        ] {
            assert!(TargetBranch::new(bad).is_err(), "{bad:?} was taken");
        }
        assert_eq!(
            TargetBranch::new("flotilla/x/t1"),
            Err(TargetBranchError::Reserved("flotilla/x/t1".into()))
        );
        assert!(TargetBranch::new("flotilla").is_err());
        assert!(matches!(
            TargetBranch::new(&"a".repeat(MAX_TARGET_BRANCH_BYTES + 1)),
            Err(TargetBranchError::TooLong { .. })
        ));
        assert_eq!(TargetBranch::of_run(None).unwrap().name(), "main");
        assert_eq!(
            TargetBranch::new("master").unwrap().refname(),
            "refs/heads/master"
        );
    }

    #[test]
    fn the_default_target_is_the_branch_head_names() {
        let (_dir, repo) = repo_on("master", &["other"]);
        assert_eq!(resolved(&repo, None), Ok("master".into()));
        let (_dir, repo) = repo_on("trunk", &[]);
        assert_eq!(resolved(&repo, None), Ok("trunk".into()));
    }

    #[test]
    fn a_configured_target_wins_over_head_and_must_exist() {
        let (_dir, repo) = repo_on("dev", &["release"]);
        assert_eq!(resolved(&repo, Some("release")), Ok("release".into()));
        let missing = resolved(&repo, Some("main")).unwrap_err();
        assert!(
            missing.contains("no such branch")
                && missing.contains("\"dev\"")
                && missing.contains("\"release\"")
                && missing.contains("git branch main"),
            "the fix and the branches there are: {missing}"
        );
        assert!(
            resolved(&repo, Some("a..b"))
                .unwrap_err()
                .contains("not a branch name git accepts")
        );
    }

    #[test]
    fn an_unborn_head_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init_opts(
            dir.path(),
            git2::RepositoryInitOptions::new().initial_head("master"),
        )
        .unwrap();
        let refused = resolved(&repo, None).unwrap_err();
        assert!(
            refused.contains("\"master\", which has no commits yet")
                && refused.contains("git commit"),
            "{refused}"
        );
        // Configured, the same branch is simply missing.
        assert!(
            resolved(&repo, Some("master"))
                .unwrap_err()
                .contains("no such branch")
        );
    }

    #[test]
    fn a_detached_head_takes_the_only_branch_and_refuses_to_guess_between_two() {
        let (_dir, repo) = repo_on("master", &[]);
        let tip = repo.head().unwrap().peel_to_commit().unwrap().id();
        repo.set_head_detached(tip).unwrap();
        assert_eq!(resolved(&repo, None), Ok("master".into()));
        // flotilla's own task branches are no candidates.
        let commit = repo.find_commit(tip).unwrap();
        repo.branch("flotilla/0123/t1-a1", &commit, false).unwrap();
        assert_eq!(resolved(&repo, None), Ok("master".into()));
        repo.branch("topic", &commit, false).unwrap();
        let refused = resolved(&repo, None).unwrap_err();
        assert!(
            refused.starts_with("HEAD is detached and the repository has 2 branches")
                && refused.contains("\"master\", \"topic\"")
                && refused.contains("set [merge] branch"),
            "{refused}"
        );
        assert!(!refused.contains('\n'), "one line: {refused}");
        assert_eq!(resolved(&repo, Some("topic")), Ok("topic".into()));
        // No branch at all.
        repo.find_branch("master", git2::BranchType::Local)
            .unwrap()
            .delete()
            .unwrap();
        repo.find_branch("topic", git2::BranchType::Local)
            .unwrap()
            .delete()
            .unwrap();
        assert!(resolved(&repo, None).unwrap_err().contains("has no branch"));
    }

    #[test]
    fn head_on_a_task_branch_is_no_target() {
        let (_dir, repo) = repo_on("main", &["flotilla/0123/t1-a1"]);
        repo.set_head("refs/heads/flotilla/0123/t1-a1").unwrap();
        let refused = resolved(&repo, None).unwrap_err();
        assert!(
            refused.contains("cannot be the target branch") && refused.contains("[merge] branch"),
            "{refused}"
        );
    }

    #[tokio::test]
    async fn another_branch_is_read_and_moved_and_main_is_not_looked_at() {
        let (dir, repo) = repo_on("master", &["main"]);
        let master = TargetBranch::new("master").unwrap();
        let first = repo.refname_to_id("refs/heads/master").unwrap().to_string();
        commit(&repo, &[("a", "2")], "second");
        let second = repo.refname_to_id("refs/heads/master").unwrap().to_string();
        // HEAD elsewhere: the target is read from its ref, not from HEAD.
        repo.set_head("refs/heads/main").unwrap();
        let git = GitRepo::new(dir.path(), master.clone());
        assert_eq!(git.main_tip().await.unwrap(), second);
        git.compare_and_swap(second.clone(), first.clone())
            .await
            .unwrap();
        assert_eq!(
            repo.refname_to_id("refs/heads/master").unwrap().to_string(),
            first
        );
        assert_eq!(
            repo.refname_to_id("refs/heads/main").unwrap().to_string(),
            first,
            "main was never written"
        );
        // A target that does not exist reads as none, never as HEAD's branch.
        let gone = GitRepo::new(dir.path(), TargetBranch::new("gone").unwrap());
        assert!(
            gone.main_tip()
                .await
                .unwrap_err()
                .to_string()
                .contains("gone")
        );
        assert!(matches!(
            gone.compare_and_swap(first.clone(), second.clone()).await,
            Err(MainRefError::Moved { .. })
        ));
    }

    #[test]
    fn long_documents_are_cut_on_a_character_boundary() {
        let text = "é".repeat(100);
        let cut = bounded_text(text.as_bytes(), 51);
        assert!(cut.starts_with(&"é".repeat(25)) && cut.contains("cut: the file is 200 bytes"));
        assert_eq!(bounded_text(b"short", 51), "short");
    }
}
