//! Opened handles of one repository, kept between blocking calls (ADR-041, "a cheaper
//! cycle"). Opening a repository costs about fifty system calls (the path made real
//! component by component, `.git` found, three config files read and parsed); a landing
//! cycle made about seven such opens on its serial path (main's tip, the build, the
//! compare-and-swap, the checkout sync, the deletions). A handle is taken for one call and
//! given back after it, so two calls at once each have their own (`git2::Repository` is
//! not `Sync`).
//!
//! A handle is reused only while the repository's config file is the one it read (device,
//! inode, size and modification time): a repository replaced at the same path, or a config
//! the user changed, gets a fresh open. Everything else libgit2 reads from disk each time
//! it is asked (refs, the packed-refs file when it changed, loose objects, new packs on a
//! miss), so a kept handle sees what other processes wrote. A call that changes the
//! handle's own state (an in-memory index set on it) must not use the pool.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use flotilla_actors::ports::RepoError;

/// Handles kept idle at most: the queue's calls overlap by two or three.
const MAX_IDLE: usize = 4;

/// What the config file was when a handle read it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

fn stamp(gitdir: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(gitdir.join("config")).ok()?;
    Some(Stamp {
        dev: meta.dev(),
        ino: meta.ino(),
        len: meta.len(),
        modified: meta.modified().ok(),
    })
}

pub struct RepoHandles {
    path: PathBuf,
    idle: Mutex<Vec<(git2::Repository, Stamp)>>,
}

impl RepoHandles {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        RepoHandles {
            path: path.into(),
            idle: Mutex::new(Vec::new()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `work` with a handle of the repository (blocking: call it on a blocking
    /// thread), kept or freshly opened, and keeps it afterwards.
    pub fn with<T>(&self, work: impl FnOnce(&git2::Repository) -> T) -> Result<T, RepoError> {
        let (repo, opened) = self.take()?;
        let result = work(&repo);
        if let Some(opened) = opened {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < MAX_IDLE {
                idle.push((repo, opened));
            }
        }
        Ok(result)
    }

    /// A kept handle whose config is unchanged, or a fresh open; with the stamp to keep it
    /// under (`None`: not kept, the config could not be read).
    fn take(&self) -> Result<(git2::Repository, Option<Stamp>), RepoError> {
        let kept = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        if let Some((repo, was)) = kept {
            let now = stamp(repo.path());
            if now.as_ref() == Some(&was) {
                return Ok((repo, now));
            }
            // Changed or gone: every other kept handle read the same file.
            self.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
        let repo = git2::Repository::open(&self.path)
            .map_err(|_| RepoError::NotARepository(self.path.clone()))?;
        let now = stamp(repo.path());
        Ok((repo, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_handle_is_reused_until_the_config_changes_or_the_repository_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        git2::Repository::init(dir.path()).unwrap();
        let handles = RepoHandles::new(dir.path());
        handles.with(|_| ()).unwrap();
        assert_eq!(handles.idle.lock().unwrap().len(), 1);
        // Nothing changed: the same handle (the one kept) serves the next call.
        let again = handles.with(|r| r.path().to_path_buf()).unwrap();
        assert_eq!(again, dir.path().join(".git/"));
        assert_eq!(handles.idle.lock().unwrap().len(), 1);

        // The user changes the config: the next call opens afresh and reads it.
        {
            let repo = git2::Repository::open(dir.path()).unwrap();
            let mut config = repo.config().unwrap();
            config
                .set_str("user.name", "someone else entirely")
                .unwrap();
        }
        let name = handles
            .with(|r| r.config().unwrap().get_string("user.name").unwrap())
            .unwrap();
        assert_eq!(name, "someone else entirely");

        // Replaced at the same path: a fresh open sees the new repository.
        std::fs::remove_dir_all(dir.path().join(".git")).unwrap();
        let fresh = git2::Repository::init(dir.path()).unwrap();
        let sig = git2::Signature::now("a", "a@example.com").unwrap();
        let tree = fresh
            .find_tree(fresh.index().unwrap().write_tree().unwrap())
            .unwrap();
        let made = fresh
            .commit(Some("HEAD"), &sig, &sig, "new", &tree, &[])
            .unwrap();
        let seen = handles
            .with(|r| r.head().unwrap().target().unwrap())
            .unwrap();
        assert_eq!(seen, made);

        // Gone: the same error as a failed open, nothing kept.
        std::fs::remove_dir_all(dir.path().join(".git")).unwrap();
        assert!(matches!(
            handles.with(|_| ()),
            Err(RepoError::NotARepository(_))
        ));
    }

    #[test]
    fn refs_written_by_another_handle_are_seen_by_a_kept_one() {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init(dir.path()).unwrap();
        let sig = git2::Signature::now("a", "a@example.com").unwrap();
        let tree = repo
            .find_tree(repo.index().unwrap().write_tree().unwrap())
            .unwrap();
        let one = repo
            .commit(Some("HEAD"), &sig, &sig, "one", &tree, &[])
            .unwrap();
        let handles = RepoHandles::new(dir.path());
        let head = |h: &RepoHandles| h.with(|r| r.head().unwrap().target().unwrap()).unwrap();
        assert_eq!(head(&handles), one);
        let parent = repo.find_commit(one).unwrap();
        let two = repo
            .commit(Some("HEAD"), &sig, &sig, "two", &tree, &[&parent])
            .unwrap();
        assert_eq!(
            head(&handles),
            two,
            "the kept handle reads the ref from disk"
        );
    }
}
