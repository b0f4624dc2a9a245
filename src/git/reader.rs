//! The `RepoReader` port on git2: reads the run's target branch ("main" in the ports' and
//! actors' words: `[merge] branch`, ADR-022), its tip's tree, blobs and history, never the
//! work tree or index; and the `MainRef` port, the compare-and-swap of that branch's ref
//! that only the MergeQueue is given. Every call opens the repository on a blocking thread
//! (`git2::Repository` is not `Sync`, and git work blocks). It must not know worktrees or
//! the merge queue's candidates.

use std::path::PathBuf;
use std::sync::Arc;

use flotilla_actors::ports::{
    CommitLog, CommitShown, GrepQuery, GrepReport, MainRef, MainRefError, ReadBounds, RepoError,
    RepoReader, RepoSnapshot, TreeItem, TreePath,
};
use futures::future::BoxFuture;

use super::handles::RepoHandles;
use super::target::TargetBranch;
use super::{git, main_commit, repo_lock};

pub struct GitRepo {
    path: PathBuf,
    target: TargetBranch,
    /// Opened handles kept between calls (ADR-041, "a cheaper cycle").
    handles: Arc<RepoHandles>,
}

impl GitRepo {
    /// The repository at `path`, whose work lands on `target`.
    pub fn new(path: impl Into<PathBuf>, target: TargetBranch) -> Self {
        let path = path.into();
        GitRepo {
            handles: RepoHandles::shared(&path),
            path,
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
        let handles = self.handles.clone();
        let target = self.target.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || handles.with(|repo| work(repo, &target))?)
                .await
                .map_err(|e| RepoError::Git(format!("the git thread failed: {e}")))?
        })
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

    fn read_path(
        &self,
        commit: String,
        path: TreePath,
        bounds: ReadBounds,
    ) -> BoxFuture<'static, Result<TreeItem, RepoError>> {
        self.blocking(move |repo, _| super::tree_read::read_path(repo, &commit, &path, bounds))
    }

    fn grep(
        &self,
        commit: String,
        query: GrepQuery,
    ) -> BoxFuture<'static, Result<GrepReport, RepoError>> {
        self.blocking(move |repo, _| super::tree_read::grep(repo, &commit, &query))
    }

    fn log(
        &self,
        commit: String,
        path: Option<TreePath>,
        max_count: usize,
    ) -> BoxFuture<'static, Result<CommitLog, RepoError>> {
        self.blocking(move |repo, _| super::tree_read::log(repo, &commit, path.as_ref(), max_count))
    }

    fn show_commit(
        &self,
        commit: String,
        name: String,
        max_patch_bytes: usize,
    ) -> BoxFuture<'static, Result<Option<CommitShown>, RepoError>> {
        self.blocking(move |repo, _| {
            super::tree_read::show_commit(repo, &commit, &name, max_patch_bytes)
        })
    }
}

impl MainRef for GitRepo {
    fn compare_and_swap(
        &self,
        expected: String,
        new: String,
    ) -> BoxFuture<'static, Result<(), MainRefError>> {
        let (path, handles) = (self.path.clone(), self.handles.clone());
        let target = self.target.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                handles.with(|repo| {
                    let oid = |s: &str| {
                        git2::Oid::from_str(s).map_err(|e| RepoError::Git(git(e).to_string()))
                    };
                    let (from, to) = (oid(&expected)?, oid(&new)?);
                    let name = target.refname();
                    // A checked-out target moves only with its index and work tree (ADR-021),
                    // and what writes the user's checkout is serialized with the rest of `.git`.
                    let lock = repo_lock(&path);
                    let _held = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    let (from_text, to_text) = (expected.clone(), new.clone());
                    super::checkout::move_main(repo, &target, &from_text, &to_text, || {
                        // git2 checks the ref's value and moves it under git's own ref lock.
                        // A kill inside it leaves `<ref>.lock`: the record lets a later heal
                        // remove it (ref_lock).
                        let moved = super::ref_lock::guarded_to(repo, &name, to, || {
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
                })?
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
