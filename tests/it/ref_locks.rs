//! What a kill inside git2's update or deletion of a ref leaves (`<ref>.lock`, and
//! `packed-refs.lock` when the ref is packed), or while it makes a worktree (its record,
//! half made), and how the next deletion of a branch heals it: only a lock a record of a
//! process that is gone names, only records of the branch's run (ADR-021, `git::ref_lock`).

use std::path::Path;

use flotilla::git::merge::GitMerge;
use flotilla_actors::ports::MergeGit;

use crate::daemon_env::{commit_files, init_repo, main_branch};

/// What a kill inside git2's deletion of a ref leaves beside its lock: the record written
/// just before, by a process that is gone (a child that exited and was reaped).
fn plant_dead_record(gitdir: &Path, lock: &str) {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i128;
    let record = flotilla::git::ref_lock::Record {
        lock: lock.into(),
        pid,
        start_time: 1,
        at_ms,
        value: None,
    };
    std::fs::write(
        gitdir.join(format!("{}{pid}.0", flotilla::git::ref_lock::RECORD_PREFIX)),
        serde_json::to_vec(&record).unwrap(),
    )
    .unwrap();
}

/// A kill inside the deletion of a landed task's branch left git's lock on it: the branch
/// is deleted only once, so it stayed for good (the soak's "no branch is left"). The next
/// deletion heals a lock a record names and deletes; a lock no record names stays, and so
/// does the branch. A packed task branch (a user's `git pack-refs`) the same, with
/// `packed-refs.lock`, which failed every later deletion of a packed ref, the user's too.
#[tokio::test]
async fn a_lock_a_killed_deletion_left_is_healed_by_the_next_deletion() {
    let repo = tempfile::tempdir().unwrap();
    init_repo(repo.path());
    let git = git2::Repository::open(repo.path()).unwrap();
    commit_files(&git, &[("a.txt", "a\n")], "files");
    let scratch = tempfile::tempdir().unwrap();
    let merge = GitMerge::new(repo.path(), scratch.path().join("scratch"), main_branch());
    let gitdir = repo.path().join(".git");
    let branch = |name: &str| {
        let tip = git.head().unwrap().peel_to_commit().unwrap();
        git.branch(name, &tip, false).unwrap();
    };
    let tip = |name: &str| {
        git2::Repository::open(repo.path())
            .unwrap()
            .find_branch(name, git2::BranchType::Local)
            .ok()
            .map(|b| b.get().target().unwrap())
    };
    branch("flotilla/r/t1");
    let lock = gitdir.join("refs/heads/flotilla/r/t1.lock");
    std::fs::write(&lock, "").unwrap();
    assert!(merge.delete_branch("flotilla/r/t1".into()).await.is_err());
    assert!(lock.exists(), "a lock no record names is someone else's");
    plant_dead_record(&gitdir, "refs/heads/flotilla/r/t1.lock");
    merge.delete_branch("flotilla/r/t1".into()).await.unwrap();
    assert!(!lock.exists());
    assert_eq!(tip("flotilla/r/t1"), None);

    branch("flotilla/r/t2");
    let packed = std::process::Command::new("git")
        .args(["pack-refs", "--all"])
        .current_dir(repo.path())
        .status()
        .unwrap();
    assert!(packed.success());
    assert!(!gitdir.join("refs/heads/flotilla/r/t2").exists(), "packed");
    let lock = gitdir.join("packed-refs.lock");
    std::fs::write(&lock, "").unwrap();
    assert!(merge.delete_branch("flotilla/r/t2".into()).await.is_err());
    assert!(lock.exists(), "a lock no record names is someone else's");
    plant_dead_record(&gitdir, "packed-refs.lock");
    merge.delete_branch("flotilla/r/t2".into()).await.unwrap();
    assert!(!lock.exists());
    assert_eq!(tip("flotilla/r/t2"), None);
    let records = std::fs::read_dir(&gitdir)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .contains("flotilla-ref-update")
        })
        .count();
    assert_eq!(records, 0, "no record is left");
}

/// Half-made worktree records of a run (a kill while libgit2 made them) made libgit2 refuse
/// to delete any branch ("the current HEAD of a linked repository"): a landed task's branch,
/// deleted once, stayed for good. The deletion removes them (they are the branch's run's)
/// and deletes.
#[tokio::test]
async fn half_made_worktree_records_of_the_run_do_not_keep_a_landed_branch() {
    let repo = tempfile::tempdir().unwrap();
    init_repo(repo.path());
    let git = git2::Repository::open(repo.path()).unwrap();
    commit_files(&git, &[("a.txt", "a\n")], "files");
    let scratch = tempfile::tempdir().unwrap();
    let merge = GitMerge::new(repo.path(), scratch.path().join("scratch"), main_branch());
    let run = "0123456789abcdef0123456789abcdef";
    let branch = format!("flotilla/{run}/t1");
    let tip = git.head().unwrap().peel_to_commit().unwrap();
    git.branch(&branch, &tip, false).unwrap();
    for task in ["t2-a1", "t3-a1"] {
        let record = repo
            .path()
            .join(".git/worktrees")
            .join(format!("flotilla-{run}-{task}"));
        std::fs::create_dir_all(&record).unwrap();
        std::fs::write(record.join("locked"), "").unwrap();
    }
    merge.delete_branch(branch.clone()).await.unwrap();
    assert!(git.find_branch(&branch, git2::BranchType::Local).is_err());
    assert!(
        std::fs::read_dir(repo.path().join(".git/worktrees"))
            .unwrap()
            .next()
            .is_none()
    );
}
