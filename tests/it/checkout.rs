//! The user's checkout of main (ADR-021): main moves under it only together with its index
//! and work tree, under git's index lock, carrying the user's own changes when they do not
//! touch the landing's files and waiting (nothing moved) when they do; HEAD is never
//! detached; a crash inside the move is healed at the next start.

use std::path::Path;
use std::time::Duration;

use flotilla::git::merge::GitMerge;
use flotilla::git::reader::GitRepo;
use flotilla_actors::ports::{CheckoutSync, MainRef, MainRefError, MergeGit};
use flotilla_actors::protocol::{EventKind, RunOutcome};
use flotilla_actors::testing::eventually_blocking;

use crate::daemon_env::*;

fn git(path: &Path) -> git2::Repository {
    git2::Repository::open(path).unwrap()
}

/// A repository on main (checked out, clean) with three files.
fn repository() -> tempfile::TempDir {
    let repo = git_repo();
    commit_files(
        &git(repo.path()),
        &[
            ("a.txt", "a1\na2\na3\n"),
            ("b.txt", "b1\nb2\nb3\n"),
            ("f.txt", "one\n"),
        ],
        "files",
    );
    repo
}

fn main_tip(path: &Path) -> String {
    git(path)
        .refname_to_id("refs/heads/main")
        .unwrap()
        .to_string()
}

/// A commit on main's tip (not moving any ref) the way the merge queue builds one: `Some`
/// writes a file, `None` deletes it.
fn landing(path: &Path, files: &[(&str, Option<&str>)]) -> String {
    let repo = git(path);
    let parent = repo
        .find_reference("refs/heads/main")
        .unwrap()
        .peel_to_commit()
        .unwrap();
    let sig = git2::Signature::now("flotilla", "flotilla@localhost").unwrap();
    let mode = git2::FileMode::Blob;
    commit_tree_update(&repo, &parent, files, mode, &sig, "landed", None)
}

fn the_landing(path: &Path) -> String {
    landing(
        path,
        &[
            ("a.txt", Some("a1\nLANDED\na3\n")),
            ("dir/landed.txt", Some("landed\n")),
            ("b.txt", None),
        ],
    )
}

fn read(path: &Path, file: &str) -> Option<String> {
    std::fs::read_to_string(path.join(file)).ok()
}

/// `git status`: (path, status) of everything not clean, untracked files included.
fn status(path: &Path) -> Vec<(String, git2::Status)> {
    git(path)
        .statuses(Some(git2::StatusOptions::new().include_untracked(true)))
        .unwrap()
        .iter()
        .map(|s| (s.path().unwrap().to_string(), s.status()))
        .collect()
}

fn assert_head_on_main(path: &Path) {
    let repo = git(path);
    assert_eq!(
        repo.find_reference("HEAD")
            .unwrap()
            .symbolic_target()
            .unwrap(),
        Some("refs/heads/main"),
        "HEAD stays on main, never detached"
    );
}

fn no_lock_left(path: &Path) {
    assert!(!path.join(".git/index.lock").exists(), "index.lock left");
    assert!(
        !path.join(".git/flotilla-checkout").exists(),
        "the move's record left"
    );
    assert!(!path.join(".git/flotilla-index").exists(), "new index left");
    assert!(
        !path.join(".git/flotilla-index.lock").exists(),
        "the new index's lock left"
    );
}

#[tokio::test]
async fn a_clean_checkout_moves_with_main_in_one_step() {
    let repo = repository();
    let path = repo.path();
    std::fs::write(path.join("notes.txt"), "mine\n").unwrap();
    let (old, new) = (main_tip(path), the_landing(path));
    GitRepo::new(path, main_branch())
        .compare_and_swap(old, new.clone())
        .await
        .unwrap();
    assert_eq!(main_tip(path), new);
    assert_head_on_main(path);
    assert_eq!(read(path, "a.txt").as_deref(), Some("a1\nLANDED\na3\n"));
    assert_eq!(read(path, "dir/landed.txt").as_deref(), Some("landed\n"));
    assert_eq!(read(path, "b.txt"), None);
    assert_eq!(
        status(path),
        [("notes.txt".to_string(), git2::Status::WT_NEW)],
        "the index and the work tree are main's tip; the untracked file stays"
    );
    no_lock_left(path);
    // The queue's sync after the move has nothing left to do.
    let merge = GitMerge::new(path, path.join("scratch"), main_branch());
    assert_eq!(
        merge.sync_checkout(new.clone(), new).await.unwrap(),
        CheckoutSync::FastForwarded
    );
}

#[tokio::test]
async fn the_users_changes_elsewhere_are_carried_over_like_git_switch_does() {
    let repo = repository();
    let path = repo.path();
    // Edited, and a staged new file: neither is a file the landing changes.
    std::fs::write(path.join("f.txt"), "one\nmine\n").unwrap();
    std::fs::write(path.join("staged.txt"), "staged\n").unwrap();
    let g = git(path);
    let mut index = g.index().unwrap();
    index.add_path(Path::new("staged.txt")).unwrap();
    index.write().unwrap();
    let (old, new) = (main_tip(path), the_landing(path));
    GitRepo::new(path, main_branch())
        .compare_and_swap(old, new.clone())
        .await
        .unwrap();
    assert_eq!(main_tip(path), new);
    assert_head_on_main(path);
    assert_eq!(read(path, "f.txt").as_deref(), Some("one\nmine\n"));
    assert_eq!(read(path, "a.txt").as_deref(), Some("a1\nLANDED\na3\n"));
    assert_eq!(
        status(path),
        [
            ("f.txt".to_string(), git2::Status::WT_MODIFIED),
            ("staged.txt".to_string(), git2::Status::INDEX_NEW),
        ],
        "only the user's own changes show: nothing of the landing looks reverted"
    );
    no_lock_left(path);
}

#[tokio::test]
async fn a_change_of_the_users_to_a_landed_file_keeps_main_where_it_is_until_it_is_gone() {
    let repo = repository();
    let path = repo.path();
    let (old, new) = (main_tip(path), the_landing(path));
    let main = GitRepo::new(path, main_branch());
    for (file, text) in [
        ("a.txt", Some("a1\nmy change\na3\n")),
        ("b.txt", None),
        ("dir/landed.txt", Some("my own file in the way\n")),
    ] {
        match text {
            Some(text) => {
                std::fs::create_dir_all(path.join(file).parent().unwrap()).unwrap();
                std::fs::write(path.join(file), text).unwrap();
            }
            None => std::fs::remove_file(path.join(file)).unwrap(),
        }
        let before = status(path);
        let refused = main.compare_and_swap(old.clone(), new.clone()).await;
        match refused {
            Err(MainRefError::CheckoutBusy { detail }) => {
                assert!(detail.contains(file), "{file}: {detail}")
            }
            other => panic!("{file}: {other:?}"),
        }
        assert_eq!(main_tip(path), old, "{file}: main did not move");
        assert_head_on_main(path);
        assert_eq!(
            status(path),
            before,
            "{file}: nothing of the user's touched"
        );
        no_lock_left(path);
        // The user puts it back: the landing goes through.
        let _ = std::fs::remove_dir_all(path.join("dir"));
        git2::Repository::open(path)
            .unwrap()
            .checkout_head(Some(git2::build::CheckoutBuilder::new().force()))
            .unwrap();
    }
    // A staged change of a landed file counts the same.
    std::fs::write(path.join("a.txt"), "staged\n").unwrap();
    let g = git(path);
    let mut index = g.index().unwrap();
    index.add_path(Path::new("a.txt")).unwrap();
    index.write().unwrap();
    std::fs::write(path.join("a.txt"), "a1\na2\na3\n").unwrap();
    assert!(matches!(
        main.compare_and_swap(old.clone(), new.clone()).await,
        Err(MainRefError::CheckoutBusy { .. })
    ));
    g.checkout_head(Some(git2::build::CheckoutBuilder::new().force()))
        .unwrap();
    let mut index = g.index().unwrap();
    index
        .read_tree(&g.head().unwrap().peel_to_tree().unwrap())
        .unwrap();
    index.write().unwrap();
    main.compare_and_swap(old, new.clone()).await.unwrap();
    assert_eq!(main_tip(path), new);
    assert_eq!(status(path), []);
}

#[tokio::test]
async fn another_git_command_holding_the_index_lock_makes_the_landing_wait() {
    let repo = repository();
    let path = repo.path();
    let (old, new) = (main_tip(path), the_landing(path));
    std::fs::write(path.join(".git/index.lock"), "").unwrap();
    let main = GitRepo::new(path, main_branch());
    assert!(matches!(
        main.compare_and_swap(old.clone(), new.clone()).await,
        Err(MainRefError::CheckoutBusy { .. })
    ));
    assert_eq!(main_tip(path), old);
    assert!(
        path.join(".git/index.lock").exists(),
        "someone else's lock is theirs"
    );
    std::fs::remove_file(path.join(".git/index.lock")).unwrap();
    main.compare_and_swap(old, new.clone()).await.unwrap();
    assert_eq!(main_tip(path), new);
}

/// The record of an interrupted move beside an `index.lock` that is not the file the move
/// took (another git command's, taken since the kill): the heal leaves it to its owner and
/// the landing waits. The heal once removed it from under that command (a lock built to be
/// compared was dropped, and dropping one removes its file).
#[tokio::test]
async fn another_git_commands_index_lock_beside_an_interrupted_moves_record_is_left_alone() {
    let repo = repository();
    let path = repo.path();
    let (old, new) = (main_tip(path), the_landing(path));
    std::fs::write(path.join(".git/index.lock"), "").unwrap();
    let record = serde_json::json!({
        "from": old, "to": new, "lock_dev": 0, "lock_ino": 0, "branch": "main"
    });
    std::fs::write(path.join(".git/flotilla-checkout"), record.to_string()).unwrap();
    let main = GitRepo::new(path, main_branch());
    assert!(matches!(
        main.compare_and_swap(old.clone(), new.clone()).await,
        Err(MainRefError::CheckoutBusy { .. })
    ));
    assert!(
        path.join(".git/index.lock").exists(),
        "someone else's lock is theirs"
    );
    assert_eq!(main_tip(path), old);
    // That command done, the heal and then the landing go through.
    std::fs::remove_file(path.join(".git/index.lock")).unwrap();
    main.compare_and_swap(old, new.clone()).await.unwrap();
    assert_eq!(main_tip(path), new);
    no_lock_left(path);
    assert_eq!(status(path), []);
}

/// A record that outlived its lock (a kill after the lock went) names an inode the file
/// system may give to the next file made: another git command's `index.lock` made on it is
/// not the move's (its mtime says so), and is left to its owner.
#[tokio::test]
async fn an_index_lock_made_on_the_inode_a_record_names_is_not_taken_for_the_moves() {
    use std::os::unix::fs::MetadataExt;
    let repo = repository();
    let path = repo.path();
    let (old, new) = (main_tip(path), the_landing(path));
    std::fs::write(path.join(".git/index.lock"), "").unwrap();
    let meta = std::fs::metadata(path.join(".git/index.lock")).unwrap();
    let made_ns = i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
    let record = serde_json::json!({
        "from": old, "to": new, "lock_dev": meta.dev(), "lock_ino": meta.ino(),
        "lock_mtime_ns": made_ns - 1_000_000_000, "branch": "main"
    });
    std::fs::write(path.join(".git/flotilla-checkout"), record.to_string()).unwrap();
    let main = GitRepo::new(path, main_branch());
    assert!(matches!(
        main.compare_and_swap(old.clone(), new.clone()).await,
        Err(MainRefError::CheckoutBusy { .. })
    ));
    assert!(
        path.join(".git/index.lock").exists(),
        "someone else's lock is theirs"
    );
    assert_eq!(main_tip(path), old);
    std::fs::remove_file(path.join(".git/index.lock")).unwrap();
    main.compare_and_swap(old, new.clone()).await.unwrap();
    assert_eq!(main_tip(path), new);
    no_lock_left(path);
    assert_eq!(status(path), []);
}

#[tokio::test]
async fn a_users_commit_on_main_wins_the_race_and_is_kept() {
    let repo = repository();
    let path = repo.path();
    let (old, new) = (main_tip(path), the_landing(path));
    // The user commits on main after the candidate was built on `old`.
    let mine = commit_files(&git(path), &[("mine.txt", "my commit\n")], "the user's");
    let refused = GitRepo::new(path, main_branch())
        .compare_and_swap(old.clone(), new.clone())
        .await;
    assert_eq!(
        refused,
        Err(MainRefError::Moved {
            expected: old,
            actual: mine.to_string()
        })
    );
    assert_eq!(main_tip(path), mine.to_string(), "the user's commit stays");
    assert_head_on_main(path);
    assert_eq!(status(path), []);
    no_lock_left(path);
}

#[tokio::test]
async fn main_checked_out_in_a_linked_worktree_moves_with_it() {
    let repo = repository();
    let path = repo.path();
    let g = git(path);
    // The repository's own work tree is on another branch; main is checked out elsewhere.
    let head = g.head().unwrap().peel_to_commit().unwrap();
    g.branch("side", &head, false).unwrap();
    g.set_head("refs/heads/side").unwrap();
    let place = tempfile::tempdir().unwrap();
    let linked = place.path().join("main-tree");
    let main_ref = g.find_reference("refs/heads/main").unwrap();
    g.worktree(
        "users-main",
        &linked,
        Some(git2::WorktreeAddOptions::new().reference(Some(&main_ref))),
    )
    .unwrap();
    let (old, new) = (main_tip(path), the_landing(path));
    GitRepo::new(path, main_branch())
        .compare_and_swap(old, new.clone())
        .await
        .unwrap();
    assert_eq!(main_tip(path), new);
    assert_eq!(read(&linked, "a.txt").as_deref(), Some("a1\nLANDED\na3\n"));
    assert_eq!(status(&linked), []);
    assert_eq!(read(path, "a.txt").as_deref(), Some("a1\na2\na3\n"));
}

#[tokio::test]
async fn a_checkout_behind_main_with_no_changes_of_its_own_is_brought_along() {
    let repo = repository();
    let path = repo.path();
    let new = the_landing(path);
    // main moved by the ref alone (another tool, or an older flotilla's crash).
    git(path)
        .reference(
            "refs/heads/main",
            git2::Oid::from_str(&new).unwrap(),
            true,
            "t",
        )
        .unwrap();
    let merge = GitMerge::new(path, path.join("scratch"), main_branch());
    assert_eq!(
        merge.sync_checkout(new.clone(), new.clone()).await.unwrap(),
        CheckoutSync::FastForwarded
    );
    assert_head_on_main(path);
    assert_eq!(status(path), []);
    assert_eq!(read(path, "dir/landed.txt").as_deref(), Some("landed\n"));
    no_lock_left(path);
}

#[tokio::test]
async fn a_checkout_behind_main_with_changes_in_moved_files_is_left_as_it_is_on_main() {
    let repo = repository();
    let path = repo.path();
    let old = main_tip(path);
    let new = the_landing(path);
    git(path)
        .reference(
            "refs/heads/main",
            git2::Oid::from_str(&new).unwrap(),
            true,
            "t",
        )
        .unwrap();
    std::fs::write(path.join("a.txt"), "mine\n").unwrap();
    let merge = GitMerge::new(path, path.join("scratch"), main_branch());
    assert_eq!(
        merge.sync_checkout(new.clone(), new).await.unwrap(),
        CheckoutSync::Behind {
            at: old,
            paths: vec!["a.txt".into()]
        }
    );
    assert_head_on_main(path);
    assert_eq!(read(path, "a.txt").as_deref(), Some("mine\n"));
    no_lock_left(path);
}

// ---------------------------------------------------------------------------------------
// kills inside the move, through a real daemon

/// Three tasks writing a file each, landed without a gate.
fn scenario() -> String {
    let mut s = String::from("[agent]\ndelay_ms = 50\n\n[[planner.answers]]\ntasks = [\n");
    for n in 1..=3 {
        s.push_str(&format!(
            "  {{ description = \"write file {n}\", scope = [\"src/f{n}.txt\"] }},\n"
        ));
    }
    s.push_str("]\n");
    for n in 1..=3 {
        s.push_str(&format!(
            "\n[tasks.t{n}]\nwrites = {{ \"src/f{n}.txt\" = \"work {n}\\n\" }}\n"
        ));
    }
    s
}

/// After the run: the user's checkout is on main, at its tip, clean, with nothing of the
/// move left in `.git`, and every task's file there.
fn assert_checkout_healed(path: &Path, context: &str) {
    assert_head_on_main(path);
    no_lock_left(path);
    assert_eq!(status(path), [], "{context}: the checkout is main's tip");
    for n in 1..=3 {
        assert_eq!(
            read(path, &format!("src/f{n}.txt")),
            Some(format!("work {n}\n")),
            "{context}"
        );
    }
}

/// The daemon kills itself at `point` inside the first landing's checkout sync; restarted
/// without fail points, the run completes and the checkout is whole.
async fn kill_inside_the_checkout_sync(point: &str) {
    kill_inside_the_checkout_sync_then(point, |_| {}).await;
}

/// [`kill_inside_the_checkout_sync`], with `left` adding to what the kill left in the
/// repository before the restart.
async fn kill_inside_the_checkout_sync_then(point: &str, left: impl FnOnce(&Path)) {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let failpoints = format!("{point}=return");
    let mut daemon =
        DaemonProcess::start_with_env(state.path(), &[("FAILPOINTS", failpoints.as_str())]);
    let client = DaemonProcess::client(state.path());
    let run = submit(&client, repo.path(), run_config(&scenario(), 3)).await;
    let status = daemon.exited_within(Duration::from_secs(90)).await;
    assert!(
        status.is_some(),
        "{point}: the daemon did not reach the point; log:\n{}",
        daemon.log()
    );
    // Killed holding git's index lock, with the move's record beside it.
    assert!(repo.path().join(".git/index.lock").exists(), "{point}");
    assert!(
        repo.path().join(".git/flotilla-checkout").exists(),
        "{point}"
    );
    drop(daemon);
    left(repo.path());
    let daemon = DaemonProcess::start(state.path());
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(
        outcome(&events),
        Some(RunOutcome::Completed),
        "{point}: {}",
        daemon.log()
    );
    assert_checkout_healed(repo.path(), point);
    let detached = events.iter().any(|e| {
        matches!(
            &e.kind,
            EventKind::MainMoved {
                checkout: CheckoutSync::Detached { .. } | CheckoutSync::Behind { .. },
                ..
            }
        )
    });
    assert!(!detached, "{point}: a landing left the checkout behind");
}

/// The first moment `index.lock` is ours: a kill there once left a lock no record named,
/// which every later landing took for another git command's (the run never ended).
#[tokio::test]
async fn a_kill_the_moment_the_index_lock_is_taken_is_healed() {
    kill_inside_the_checkout_sync("checkout::lock-taken").await;
}

/// A kill while a file of the checkout is being written: it once left half a file, which
/// the heal took for the user's own change and kept, and every later landing of that file
/// waited for the user for ever.
#[tokio::test]
async fn a_kill_while_a_file_of_the_checkout_is_half_written_is_healed() {
    kill_inside_the_checkout_sync("checkout::mid-write").await;
}

/// A kill inside libgit2's write of the new index leaves its lock (`flotilla-index.lock`,
/// made and renamed inside one call, where no fail point reaches): it once failed every
/// later write of the new index, the heal's too, and every landing after it.
#[tokio::test]
async fn a_kill_while_the_new_index_is_written_is_healed() {
    kill_inside_the_checkout_sync_then("checkout::after-worktree", |repo| {
        std::fs::write(repo.join(".git/flotilla-index.lock"), "").unwrap();
    })
    .await;
}

/// A kill between the new index's rename onto `index` and the lock's release. Committed as
/// git does (the new index into the lock, the lock onto `index`), a kill between those two
/// renames left an `index.lock` that was no longer the file the record named: the heal took
/// it for another git command's, and the run never ended.
#[tokio::test]
async fn a_kill_as_the_new_index_is_committed_is_healed() {
    kill_inside_the_checkout_sync("checkout::mid-commit").await;
}

/// A landing refused by the user's own files releases git's lock, then its record: a kill
/// between them (the other way round) once left an `index.lock` no record named, which
/// every later landing took for another git command's and the user's own git refused.
#[tokio::test]
async fn a_kill_as_a_refused_landing_lets_go_of_the_index_lock_leaves_no_lock() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let path = repo.path();
    // The user's own files where every task adds one: every landing is refused.
    std::fs::create_dir_all(path.join("src")).unwrap();
    for n in 1..=3 {
        std::fs::write(path.join(format!("src/f{n}.txt")), "the user's own\n").unwrap();
    }
    let mut daemon =
        DaemonProcess::start_with_env(state.path(), &[("FAILPOINTS", "checkout::released=return")]);
    let client = DaemonProcess::client(state.path());
    let run = submit(&client, path, run_config(&scenario(), 3)).await;
    let status = daemon.exited_within(Duration::from_secs(90)).await;
    assert!(
        status.is_some(),
        "the daemon did not reach the point; log:\n{}",
        daemon.log()
    );
    assert!(
        !path.join(".git/index.lock").exists(),
        "killed as the refused landing let go: an index.lock no record names"
    );
    drop(daemon);
    // The user takes their files away; the run lands.
    for n in 1..=3 {
        std::fs::remove_file(path.join(format!("src/f{n}.txt"))).unwrap();
    }
    let daemon = DaemonProcess::start(state.path());
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(
        outcome(&events),
        Some(RunOutcome::Completed),
        "{}",
        daemon.log()
    );
    assert_checkout_healed(path, "checkout::released");
}

#[tokio::test]
async fn a_kill_with_the_index_locked_before_anything_moved_is_healed() {
    kill_inside_the_checkout_sync("checkout::locked").await;
}

#[tokio::test]
async fn a_kill_after_the_work_tree_was_written_before_main_moved_is_healed() {
    kill_inside_the_checkout_sync("checkout::after-worktree").await;
}

#[tokio::test]
async fn a_kill_after_main_moved_before_the_index_followed_is_healed() {
    kill_inside_the_checkout_sync("checkout::after-ref").await;
}

/// A cancel while a landing is inside the checkout sync, then a kill: main has moved, the
/// index has not followed, git's lock is held. The restarted daemon heals it (the run's
/// end, or the start-up collection): nothing shows as deleted, HEAD on main.
#[tokio::test]
async fn a_cancel_then_a_kill_inside_the_checkout_sync_leaves_the_checkout_whole() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let daemon = DaemonProcess::start_with_env(
        state.path(),
        &[
            ("FAILPOINTS", "checkout::after-ref=sleep(600000)"),
            ("FLOTILLA_LOG", "info,flotilla::git::checkout=debug"),
        ],
    );
    let client = DaemonProcess::client(state.path());
    let run = submit(&client, repo.path(), run_config(&scenario(), 3)).await;
    assert!(
        daemon
            .logged_within("its checkout's index follows", Duration::from_secs(90))
            .await,
        "{}",
        daemon.log()
    );
    let _: serde_json::Value = client
        .json(
            hyper::Method::POST,
            &format!("/v1/runs/{run}/cancel"),
            None::<&()>,
        )
        .await
        .unwrap();
    daemon.kill();
    let path = repo.path();
    assert!(path.join(".git/index.lock").exists());
    // What the user would see now: main holds landed work the index does not.
    let g = git(path);
    let landed_main = g.head().unwrap().peel_to_tree().unwrap();
    assert!(landed_main.get_path(Path::new("src")).is_ok());

    let daemon = DaemonProcess::start(state.path());
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Cancelled));
    assert!(
        daemon
            .logged_within("healed the checkout of main", Duration::from_secs(30))
            .await,
        "{}",
        daemon.log()
    );
    assert_head_on_main(path);
    no_lock_left(path);
    assert_eq!(
        status(path),
        [],
        "nothing staged as deleted, nothing reverted"
    );
    drop(daemon);
}

/// A commit the user makes by hand on main while a run lands: kept, never reverted, HEAD
/// never detached, and the run's work lands on top of it.
#[tokio::test]
async fn a_users_commit_during_a_run_is_kept_and_the_run_lands_on_top_of_it() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let daemon = DaemonProcess::start(state.path());
    let client = DaemonProcess::client(state.path());
    let slow = scenario().replace("delay_ms = 50", "delay_ms = 400");
    let run = submit(&client, repo.path(), run_config(&slow, 1)).await;
    // After the first landing, the user commits by hand in their checkout of main.
    let mut stream = client.events(&run, None).await.unwrap();
    while let Some(Ok(event)) = futures::StreamExt::next(&mut stream).await {
        if matches!(event.kind, EventKind::MainMoved { .. }) {
            break;
        }
    }
    let mine = commit_by_hand(repo.path());
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(
        outcome(&events),
        Some(RunOutcome::Completed),
        "{}",
        daemon.log()
    );
    let path = repo.path();
    let g = git(path);
    let tip = g.head().unwrap().peel_to_commit().unwrap();
    assert!(
        tip.id() == mine || g.graph_descendant_of(tip.id(), mine).unwrap(),
        "the user's commit is in main's history"
    );
    assert_eq!(read(path, "mine.txt").as_deref(), Some("my commit\n"));
    assert_checkout_healed(path, "after a user's commit");
    let tree = tip.tree().unwrap();
    assert!(
        tree.get_path(Path::new("mine.txt")).is_ok(),
        "never reverted"
    );
    drop(daemon);
}

/// `git commit` as a user runs it: retried while another git command (flotilla's move of
/// main) holds the index lock, as a user would.
fn commit_by_hand(path: &Path) -> git2::Oid {
    std::fs::write(path.join("mine.txt"), "my commit\n").unwrap();
    eventually_blocking("the user's commit to get the index lock", || {
        let g = git(path);
        let attempt = (|| -> Result<git2::Oid, git2::Error> {
            let mut index = g.index()?;
            index.add_path(Path::new("mine.txt"))?;
            index.write()?;
            let tree = g.find_tree(index.write_tree()?)?;
            let parent = g.head()?.peel_to_commit()?;
            let sig = git2::Signature::now("user", "user@example.com")?;
            g.commit(Some("HEAD"), &sig, &sig, "the user's", &tree, &[&parent])
        })();
        attempt.ok()
    })
}

/// A user's hard reset of main during a run: landing pauses with `MainDiverged` (status
/// says so), `flotilla decide RUN --adopt-main` lands the rest on main as it is, names the
/// task whose landed work the reset dropped, and never replays it (ADR-024).
#[tokio::test]
async fn a_reset_of_main_pauses_the_run_until_the_user_adopts_main_and_nothing_dropped_comes_back()
{
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let start = git(repo.path())
        .head()
        .unwrap()
        .peel_to_commit()
        .unwrap()
        .id();
    let daemon = DaemonProcess::start(state.path());
    let client = DaemonProcess::client(state.path());
    // Two workers: t1 and t2 both start from the first main; t2 takes long enough for
    // the user to reset main after t1 landed.
    let scenario = "[agent]\ndelay_ms = 50\n\n[[planner.answers]]\ntasks = [\n\
        { description = \"write file 1\", scope = [\"src/f1.txt\"] },\n\
        { description = \"write file 2\", scope = [\"src/f2.txt\"] },\n]\n\n\
        [tasks.t1]\nwrites = { \"src/f1.txt\" = \"work 1\\n\" }\n\n\
        [tasks.t2]\ndelay_ms = 5000\nwrites = { \"src/f2.txt\" = \"work 2\\n\" }\n";
    let run = submit(&client, repo.path(), run_config(scenario, 2)).await;
    let mut stream = client.events(&run, None).await.unwrap();
    saw(&mut stream, |k| matches!(k, EventKind::MainMoved { .. })).await;
    // The user resets main (and their checkout) to where it started: t1's work is gone.
    reset_by_hand(repo.path(), start);
    saw(&mut stream, |k| matches!(k, EventKind::MainDiverged { .. })).await;
    let paused: serde_json::Value = client
        .json(hyper::Method::GET, &format!("/v1/runs/{run}"), None::<&()>)
        .await
        .unwrap();
    assert_eq!(
        paused["main_diverged"]["actual"],
        start.to_string(),
        "{paused}"
    );
    let shown = assert_cmd::Command::cargo_bin("flotilla")
        .unwrap()
        .args(["status", "--state-dir"])
        .arg(state.path())
        .arg(&run)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains("landing paused: main is at") && shown.contains("--adopt-main"),
        "{shown}"
    );

    let decided = assert_cmd::Command::cargo_bin("flotilla")
        .unwrap()
        .args(["decide", "--state-dir"])
        .arg(state.path())
        .args([run.as_str(), "--adopt-main"])
        .output()
        .unwrap();
    assert!(
        decided.status.success(),
        "{}",
        String::from_utf8_lossy(&decided.stderr)
    );
    let adopted = saw(&mut stream, |k| matches!(k, EventKind::MainAdopted { .. })).await;
    let EventKind::MainAdopted { tip, dropped, .. } = adopted.kind else {
        unreachable!()
    };
    assert_eq!(tip, start.to_string());
    assert_eq!(
        dropped,
        vec!["t1".parse().unwrap()],
        "t1's landed work is named"
    );

    let events = follow_to_end(&client, &run, Some(adopted.seq)).await;
    assert_eq!(
        outcome(&events),
        Some(RunOutcome::Completed),
        "{}",
        daemon.log()
    );
    let path = repo.path();
    assert_head_on_main(path);
    let g = git(path);
    let tip = g.head().unwrap().peel_to_commit().unwrap();
    assert!(
        g.graph_descendant_of(tip.id(), start).unwrap(),
        "t2 landed on top"
    );
    assert_eq!(read(path, "src/f2.txt").as_deref(), Some("work 2\n"));
    assert!(
        tip.tree()
            .unwrap()
            .get_path(Path::new("src/f1.txt"))
            .is_err(),
        "t1's dropped work is not replayed"
    );
    assert_eq!(status(path), [], "the checkout is main's tip");
    drop(daemon);
}

/// The next event of `stream` that `want` picks.
async fn saw<S, E>(stream: &mut S, want: fn(&EventKind) -> bool) -> flotilla_actors::protocol::Event
where
    S: futures::Stream<Item = Result<flotilla_actors::protocol::Event, E>> + Unpin,
{
    while let Some(Ok(event)) = futures::StreamExt::next(stream).await {
        if want(&event.kind) {
            return event;
        }
    }
    panic!("the stream ended first");
}

/// `git reset --hard <commit>` on main, as a user runs it: retried while flotilla's move of
/// main holds the index lock.
fn reset_by_hand(path: &Path, to: git2::Oid) {
    eventually_blocking("the user's reset to get the index lock", || {
        let g = git(path);
        let target = g.find_object(to, None).unwrap();
        g.reset(&target, git2::ResetType::Hard, None).ok()
    })
}

/// A daemon killed inside git2's move of main's ref (no fail point can stop it there) left
/// `refs/heads/main.lock` and the record written just before the move: the next daemon
/// removes that lock, the run lands, and no record is left (issue 20).
#[tokio::test]
async fn a_ref_lock_a_killed_daemon_left_inside_the_ref_update_is_removed() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let gitdir = repo.path().join(".git");
    let lock = gitdir.join("refs/heads/main.lock");
    std::fs::write(&lock, format!("{}\n", main_tip(repo.path()))).unwrap();
    // A process that is gone: a child that exited and was reaped.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i128;
    let record = flotilla::git::ref_lock::Record {
        lock: "refs/heads/main.lock".into(),
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
    let daemon = DaemonProcess::start(state.path());
    let client = DaemonProcess::client(state.path());
    let run = submit(&client, repo.path(), run_config(&scenario(), 3)).await;
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(
        outcome(&events),
        Some(RunOutcome::Completed),
        "{}",
        daemon.log()
    );
    assert!(!lock.exists());
    assert_checkout_healed(repo.path(), "after a stale ref lock");
    let records = std::fs::read_dir(&gitdir)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .contains("flotilla-ref-update")
        })
        .count();
    assert_eq!(records, 0, "no record of a ref update is left");
    drop(daemon);
}

/// (inode, modification time in ns) of a file.
fn identity(path: &Path, file: &str) -> (u64, i128) {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path.join(file)).unwrap();
    (
        meta.ino(),
        i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
    )
}

#[tokio::test]
async fn a_landing_writes_only_its_own_files_in_the_users_checkout() {
    // ADR-045: the move and the sync that follows it write the landing's paths, nothing
    // else: an untouched file keeps its inode and its modification time.
    let repo = repository();
    let path = repo.path();
    let (a, f) = (identity(path, "a.txt"), identity(path, "f.txt"));
    let old = main_tip(path);
    let new = landing(path, &[("b.txt", Some("b1\nLANDED\nb3\n"))]);
    GitRepo::new(path, main_branch())
        .compare_and_swap(old.clone(), new.clone())
        .await
        .unwrap();
    let merge = GitMerge::new(path, path.join("scratch"), main_branch());
    assert_eq!(
        merge.sync_checkout(old, new.clone()).await.unwrap(),
        CheckoutSync::FastForwarded
    );
    assert_eq!(read(path, "b.txt").as_deref(), Some("b1\nLANDED\nb3\n"));
    assert_eq!(status(path), []);
    assert_eq!(identity(path, "a.txt"), a, "a.txt was rewritten");
    assert_eq!(identity(path, "f.txt"), f, "f.txt was rewritten");
    no_lock_left(path);
}

#[test]
fn the_sync_after_a_move_compares_no_index_with_a_tree() {
    use flotilla::git::checkout::{index_compares, move_main, sync};
    let repo = repository();
    let path = repo.path();
    let handle = git(path);
    let target = main_branch();
    let moved = |handle: &git2::Repository, from: &str, to: &str| {
        move_main(handle, &target, from, to, || {
            handle
                .reference_matching(
                    "refs/heads/main",
                    git2::Oid::from_str(to).unwrap(),
                    true,
                    git2::Oid::from_str(from).unwrap(),
                    "t",
                )
                .unwrap();
            Ok(())
        })
        .unwrap()
    };
    // A move leaves the index at main's tip: the sync after it reads the index file's
    // checksum, not the index against the tree.
    let (old, new) = (main_tip(path), the_landing(path));
    moved(&handle, &old, &new);
    let before = index_compares();
    assert_eq!(sync(&handle, &target).unwrap(), CheckoutSync::FastForwarded);
    assert_eq!(index_compares(), before, "the sync compared the index");
    // main moved by its ref alone: the checkout is behind, and the sync brings it along.
    let newer = landing(path, &[("a.txt", Some("a1\nAGAIN\na3\n"))]);
    handle
        .reference(
            "refs/heads/main",
            git2::Oid::from_str(&newer).unwrap(),
            true,
            "t",
        )
        .unwrap();
    let before = index_compares();
    assert_eq!(sync(&handle, &target).unwrap(), CheckoutSync::FastForwarded);
    assert!(
        index_compares() > before,
        "a checkout behind is found by comparing"
    );
    assert_eq!(read(path, "a.txt").as_deref(), Some("a1\nAGAIN\na3\n"));
    assert_eq!(status(path), []);
    let before = index_compares();
    assert_eq!(sync(&handle, &target).unwrap(), CheckoutSync::FastForwarded);
    assert_eq!(
        index_compares(),
        before,
        "the sync's own index is remembered"
    );
    // The user stages something of their own: the next sync looks (and changes nothing),
    // the one after it does not need to.
    std::fs::write(path.join("f.txt"), "mine\n").unwrap();
    let mut index = handle.index().unwrap();
    index.add_path(Path::new("f.txt")).unwrap();
    index.write().unwrap();
    let before = index_compares();
    assert_eq!(sync(&handle, &target).unwrap(), CheckoutSync::FastForwarded);
    assert!(index_compares() > before, "a changed index is compared");
    let before = index_compares();
    assert_eq!(sync(&handle, &target).unwrap(), CheckoutSync::FastForwarded);
    assert_eq!(index_compares(), before);
    assert_eq!(read(path, "f.txt").as_deref(), Some("mine\n"));
    assert_eq!(
        status(path),
        [("f.txt".to_string(), git2::Status::INDEX_MODIFIED)]
    );
    no_lock_left(path);
}

/// A kill while a landed file was half written, then the user switches to another branch
/// (removing the stale lock by hand, as git tells them to): the heal leaves that checkout as
/// it is, but not the half-written file under flotilla's staged name, which `git add -A`
/// would commit.
#[tokio::test]
async fn a_half_written_file_is_removed_even_from_a_checkout_that_left_main() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let mut daemon = DaemonProcess::start_with_env(
        state.path(),
        &[("FAILPOINTS", "checkout::mid-write=return")],
    );
    let client = DaemonProcess::client(state.path());
    let run = submit(&client, repo.path(), run_config(&scenario(), 3)).await;
    assert!(
        daemon
            .exited_within(Duration::from_secs(90))
            .await
            .is_some(),
        "the daemon did not reach the point; log:\n{}",
        daemon.log()
    );
    drop(daemon);
    let staged: Vec<_> = ["src", "."]
        .iter()
        .map(|d| repo.path().join(d).join(".flotilla-landing-new"))
        .filter(|p| p.exists())
        .collect();
    assert_eq!(
        staged.len(),
        1,
        "the kill left half a file under the staged name"
    );
    // The user gives up on main's checkout: lock removed by hand, another branch checked out.
    std::fs::remove_file(repo.path().join(".git/index.lock")).unwrap();
    let switched = std::process::Command::new("git")
        .args(["switch", "-q", "-c", "elsewhere"])
        .current_dir(repo.path())
        .output()
        .unwrap();
    assert!(switched.status.success(), "{switched:?}");
    let daemon = DaemonProcess::start(state.path());
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(
        outcome(&events),
        Some(RunOutcome::Completed),
        "{}",
        daemon.log()
    );
    assert!(!staged[0].exists(), "the half-written file is gone");
    assert_eq!(
        git(repo.path())
            .find_reference("HEAD")
            .unwrap()
            .symbolic_target()
            .unwrap(),
        Some("refs/heads/elsewhere"),
        "the user's checkout is left where they put it"
    );
}

/// A move starts from the index the last move committed, parsed, while the file is still
/// the one it became; anything that writes the index in between (the user's `git add`) is
/// seen, and the next move reads the file again (ADR-045).
#[test]
fn a_move_reuses_the_index_it_wrote_and_sees_a_git_add_in_between() {
    use flotilla::git::checkout::move_main;
    use flotilla::git::index_lock::index_reads;
    let repo = repository();
    let path = repo.path();
    let target = main_branch();
    let moved = |from: &str, to: &str| {
        // A fresh handle each time, as the merge queue's.
        let handle = git(path);
        move_main(&handle, &target, from, to, || {
            handle
                .reference_matching(
                    "refs/heads/main",
                    git2::Oid::from_str(to).unwrap(),
                    true,
                    git2::Oid::from_str(from).unwrap(),
                    "t",
                )
                .unwrap();
            Ok(())
        })
        .unwrap()
    };
    let (old, new) = (main_tip(path), the_landing(path));
    moved(&old, &new);
    let next = landing(path, &[("one.txt", Some("one\n"))]);
    let before = index_reads();
    moved(&new, &next);
    assert_eq!(
        index_reads(),
        before,
        "the index flotilla wrote was read again"
    );
    assert_eq!(status(path), []);

    // The user stages a file of their own with git itself.
    std::fs::write(path.join("mine.txt"), "mine\n").unwrap();
    let added = std::process::Command::new("git")
        .args(["add", "mine.txt"])
        .current_dir(path)
        .output()
        .expect("the git command line is installed");
    assert!(added.status.success(), "{added:?}");
    let after = landing(path, &[("two.txt", Some("two\n"))]);
    let before = index_reads();
    moved(&next, &after);
    assert_eq!(index_reads(), before + 1, "a changed index is read");
    assert_eq!(
        status(path),
        [("mine.txt".to_string(), git2::Status::INDEX_NEW)],
        "the user's staging is carried"
    );
    assert_eq!(read(path, "two.txt").as_deref(), Some("two\n"));

    // Then the user unstages it again, the same size and the same second as before: still
    // another file, read again.
    let reset = std::process::Command::new("git")
        .args(["reset", "-q", "mine.txt"])
        .current_dir(path)
        .output()
        .unwrap();
    assert!(reset.status.success(), "{reset:?}");
    let last = landing(path, &[("three.txt", Some("three\n"))]);
    let before = index_reads();
    moved(&after, &last);
    assert_eq!(index_reads(), before + 1);
    assert_eq!(
        status(path),
        [("mine.txt".to_string(), git2::Status::WT_NEW)]
    );
    // And the landed files are in the index as on main: git itself finds nothing staged.
    let cached = std::process::Command::new("git")
        .args(["diff", "--cached", "--name-only"])
        .current_dir(path)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&cached.stdout), "");
    no_lock_left(path);
}
