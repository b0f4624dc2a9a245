//! The branch names flotilla deals with: the target branch a run lands on ([`TargetBranch`],
//! validated, ADR-022), how it is picked at submit ([`resolve_target`]), and flotilla's own
//! namespace of task branches ([`TASK_BRANCH_PREFIX`]). It must not know worktrees, merging
//! or the checkout.

use std::fmt;

/// The prefix of every branch flotilla names (`branch_name`): the only branches
/// [`MergeGit::delete_branch`](flotilla_actors::ports::MergeGit::delete_branch) deletes.
pub const TASK_BRANCH_PREFIX: &str = "flotilla/";

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
}
