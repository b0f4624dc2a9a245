//! Opened handles of one repository, kept between blocking calls (ADR-041, "a cheaper
//! cycle"; ADR-051). Opening a repository costs about fifty system calls (the path made
//! real component by component, `.git` found, three config files read and parsed), and a
//! fresh handle starts with an empty object cache, so main's trees were inflated and
//! parsed again by every step of every task. One pool per repository path serves the
//! merge queue, the reader and every worker's steps ([`RepoHandles::shared`]); a handle is
//! taken for one call and given back after it, so two calls at once each have their own
//! (`git2::Repository` is not `Sync`).
//!
//! A handle is reused only while the repository's config file is the one it read (device,
//! inode, size and modification time): a repository replaced at the same path, or a config
//! the user changed, gets a fresh open. Everything else libgit2 reads from disk each time
//! it is asked (refs, the packed-refs file when it changed, loose objects, new packs on a
//! miss), so a kept handle sees what other processes wrote. What a handle keeps is
//! objects by id, which never change, the global and system config as first read (a
//! change there reaches kept handles only when the repository's own config changes), and
//! whatever index a call loaded onto it, which is dropped each time the handle is given
//! back. A call that sets an index of its own goes through [`with_own_index`].

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::SystemTime;

use flotilla_actors::ports::RepoError;

/// Handles kept idle at most: the queue's calls and the workers' steps overlap by a few.
const MAX_IDLE: usize = 8;

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

/// A handle taken from a pool; given back when dropped (if its config was readable).
pub struct KeptRepo {
    repo: ManuallyDrop<git2::Repository>,
    stamp: Option<Stamp>,
    pool: Arc<RepoHandles>,
}

impl Deref for KeptRepo {
    type Target = git2::Repository;

    fn deref(&self) -> &git2::Repository {
        &self.repo
    }
}

impl Drop for KeptRepo {
    fn drop(&mut self) {
        // SAFETY: `repo` is taken once, here, and never used again: `self` is being
        // dropped.
        let repo = unsafe { ManuallyDrop::take(&mut self.repo) };
        // A call that panicked may have left anything set on it: not kept.
        if let Some(stamp) = self.stamp.take()
            && !std::thread::panicking()
        {
            self.pool.give_back(repo, stamp);
        }
    }
}

/// Drops whatever index a handle holds in memory (libgit2 reads the file again when next
/// asked): an attribute lookup or a merge loads the repository's index onto the handle
/// whole, and a kept handle must not carry it, stale, to a later call.
fn forget_index(repo: &git2::Repository) {
    use git2::Binding;
    // SAFETY: a live repository, used by this thread alone; libgit2 takes NULL as "no
    // index set" (`set_index` in repository.c: the old one is released).
    unsafe { libgit2_sys::git_repository_set_index(repo.raw(), std::ptr::null_mut()) };
}

impl RepoHandles {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        RepoHandles {
            path: path.into(),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// The process's pool for the repository at `path` (as given: the daemon names a
    /// repository by one path), made on first use and dropped with its last user, so a
    /// finished run's handles and caches go with it.
    pub fn shared(path: &Path) -> Arc<RepoHandles> {
        static POOLS: OnceLock<Mutex<HashMap<PathBuf, Weak<RepoHandles>>>> = OnceLock::new();
        let mut pools = POOLS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(pool) = pools.get(path).and_then(Weak::upgrade) {
            return pool;
        }
        pools.retain(|_, pool| pool.strong_count() > 0);
        let pool = Arc::new(RepoHandles::new(path));
        pools.insert(path.to_path_buf(), Arc::downgrade(&pool));
        pool
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
            self.give_back(repo, opened);
        }
        Ok(result)
    }

    fn give_back(&self, repo: git2::Repository, stamp: Stamp) {
        forget_index(&repo);
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push((repo, stamp));
        }
    }

    /// A handle of the repository, kept or freshly opened, given back when dropped
    /// (blocking: use it on a blocking thread).
    pub fn open(self: &Arc<Self>) -> Result<KeptRepo, RepoError> {
        let (repo, stamp) = self.take()?;
        Ok(KeptRepo {
            repo: ManuallyDrop::new(repo),
            stamp,
            pool: self.clone(),
        })
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

/// Runs `work` with `index` as `repo`'s index, then gives the handle back its own (read
/// from disk again when next asked for), so a kept handle never carries it to another
/// call, a panicking `work` included.
pub fn with_own_index<T>(
    repo: &git2::Repository,
    index: &mut git2::Index,
    work: impl FnOnce() -> T,
) -> Result<T, RepoError> {
    struct Forget<'r>(&'r git2::Repository);
    impl Drop for Forget<'_> {
        fn drop(&mut self) {
            forget_index(self.0);
        }
    }
    repo.set_index(index).map_err(super::git)?;
    let _forget = Forget(repo);
    Ok(work())
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

    #[test]
    fn one_pool_per_repository_keeps_handles_given_back_and_an_own_index_never_stays() {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init(dir.path()).unwrap();
        let add = |repo: &git2::Repository, name: &str| {
            std::fs::write(dir.path().join(name), "x").unwrap();
            let mut index = repo.index().unwrap();
            index.add_path(Path::new(name)).unwrap();
            index.write().unwrap();
        };
        add(&repo, "on-disk.txt");

        let pool = RepoHandles::shared(dir.path());
        assert!(Arc::ptr_eq(&pool, &RepoHandles::shared(dir.path())));
        let other = tempfile::tempdir().unwrap();
        assert!(!Arc::ptr_eq(&pool, &RepoHandles::shared(other.path())));

        {
            let kept = pool.open().unwrap();
            let mut own = git2::Index::new().unwrap();
            let seen = with_own_index(&kept, &mut own, || kept.index().unwrap().len()).unwrap();
            assert_eq!(seen, 0, "the call sees the index it set");
        }
        assert_eq!(
            pool.idle.lock().unwrap().len(),
            1,
            "given back when dropped"
        );
        let kept = pool.open().unwrap();
        assert_eq!(
            pool.idle.lock().unwrap().len(),
            0,
            "the same handle taken again"
        );
        assert_eq!(
            kept.index().unwrap().len(),
            1,
            "the next call reads the repository's own index"
        );
        // An index a call loaded is not kept with the handle: a later call reads the file
        // as it is then.
        add(&git2::Repository::open(dir.path()).unwrap(), "second.txt");
        drop(kept);
        let kept = pool.open().unwrap();
        assert_eq!(
            kept.index().unwrap().len(),
            2,
            "the index file as it is now"
        );
        drop(kept);

        // Dropped with its last user: a later one starts a new pool.
        let weak = Arc::downgrade(&pool);
        drop(pool);
        assert!(weak.upgrade().is_none());
        assert_eq!(
            RepoHandles::shared(dir.path()).idle.lock().unwrap().len(),
            0
        );
    }
}
