//! `GitMerge` (the MergeQueue's and the Reconciler's git, M6) and the conflict-fix start of
//! `GitWorktrees`, against temporary git repositories: candidates built in memory (rebase,
//! squash, merge) with their trailers, conflicts and what they clash with, what main already
//! holds, scratch checkouts, conflict markers, branch deletion, and the user's checkout kept
//! consistent (or left alone) when main moves.

use std::path::Path;

use flotilla::git::merge::GitMerge;
use flotilla::git::worktrees::GitWorktrees;
use flotilla::git::{FLOTILLA_EMAIL, FLOTILLA_NAME};
use flotilla_actors::ports::{
    BranchFate, BuildOutcome, CheckoutSync, LandItem, LandMode, MarkerHit, MergeGit, ScratchTree,
    WorktreeRequest, WorktreeStart, Worktrees,
};
use flotilla_actors::protocol::{RunId, TaskId, branch_name};

use crate::daemon_env::{commit_files, commit_tree_update, init_repo, main_branch};
use crate::supervision::assert_checkout_untouched;

struct Fixture {
    repo: tempfile::TempDir,
    scratch: tempfile::TempDir,
    merge: GitMerge,
}

/// A repository on `main` (checked out, clean) with a README and two files.
fn fixture() -> Fixture {
    let repo = tempfile::tempdir().unwrap();
    init_repo(repo.path());
    commit_files(
        &git(repo.path()),
        &[
            ("a.txt", "a1\na2\na3\n"),
            ("b.txt", "b1\nb2\nb3\n"),
            ("f.txt", "one\nshared\nthree\n"),
        ],
        "files",
    );
    let scratch = tempfile::tempdir().unwrap();
    let merge = GitMerge::new(repo.path(), scratch.path().join("scratch"), main_branch());
    Fixture {
        repo,
        scratch,
        merge,
    }
}

fn git(path: &Path) -> git2::Repository {
    git2::Repository::open(path).unwrap()
}

fn oid(s: &str) -> git2::Oid {
    git2::Oid::from_str(s).unwrap()
}

impl Fixture {
    fn git(&self) -> git2::Repository {
        git(self.repo.path())
    }

    fn main_tip(&self) -> String {
        self.git()
            .refname_to_id("refs/heads/main")
            .unwrap()
            .to_string()
    }

    fn tip(&self, branch: &str) -> Option<String> {
        self.git()
            .find_branch(branch, git2::BranchType::Local)
            .ok()
            .map(|b| b.get().target().unwrap().to_string())
    }

    /// A branch at `at` (main's tip if `None`).
    fn branch(&self, name: &str, at: Option<&str>) -> String {
        let git = self.git();
        let at = match at {
            Some(at) => oid(at),
            None => git.refname_to_id("refs/heads/main").unwrap(),
        };
        git.branch(name, &git.find_commit(at).unwrap(), false)
            .unwrap();
        at.to_string()
    }

    /// Commits on `branch` without touching any work tree: `Some(text)` writes a file,
    /// `None` deletes it.
    fn commit_on(&self, branch: &str, files: &[(&str, Option<&str>)], message: &str) -> String {
        self.commit_with_mode(branch, files, git2::FileMode::Blob, message)
    }

    fn commit_with_mode(
        &self,
        branch: &str,
        files: &[(&str, Option<&str>)],
        mode: git2::FileMode,
        message: &str,
    ) -> String {
        let git = self.git();
        let name = format!("refs/heads/{branch}");
        let parent = git.find_reference(&name).unwrap().peel_to_commit().unwrap();
        let sig = git2::Signature::now("agent", "agent@example.com").unwrap();
        commit_tree_update(&git, &parent, files, mode, &sig, message, Some(&name))
    }

    /// Commits on main the way the user would: in the checked-out work tree.
    fn commit_on_main(&self, files: &[(&str, &str)], message: &str) -> String {
        commit_files(&self.git(), files, message).to_string()
    }

    fn file_at(&self, commit: &str, path: &str) -> Option<String> {
        let git = self.git();
        let tree = git.find_commit(oid(commit)).unwrap().tree().unwrap();
        let entry = tree.get_path(Path::new(path)).ok()?;
        let blob = git.find_blob(entry.id()).unwrap();
        Some(String::from_utf8(blob.content().to_vec()).unwrap())
    }

    /// The first-parent history from `tip` back to (not including) `until`, newest first.
    fn history(&self, tip: &str, until: &str) -> Vec<git2::Oid> {
        let git = self.git();
        let mut ids = Vec::new();
        let mut current = git.find_commit(oid(tip)).unwrap();
        while current.id() != oid(until) {
            ids.push(current.id());
            current = current.parent(0).unwrap();
        }
        ids
    }

    fn message(&self, commit: impl AsRef<str>) -> String {
        self.git()
            .find_commit(oid(commit.as_ref()))
            .unwrap()
            .message()
            .unwrap()
            .to_string()
    }
}

fn item(task: &str, branch: &str, head: &str) -> LandItem {
    LandItem {
        task: task.parse::<TaskId>().unwrap(),
        branch: branch.to_string(),
        head: head.to_string(),
        subject: format!("land {task}"),
        trailer: format!("Flotilla-Task: run1/{task}"),
        squash: false,
    }
}

fn built(outcome: BuildOutcome) -> (String, Vec<String>) {
    match outcome {
        BuildOutcome::Built { tip, commits } => (tip, commits),
        conflict => panic!("expected a candidate, got {conflict:?}"),
    }
}

#[tokio::test]
async fn parallel_branches_become_a_linear_candidate_each_commit_with_its_trailer() {
    let f = fixture();
    let left = f.main_tip();
    f.branch("flotilla/r/t1", None);
    f.commit_on(
        "flotilla/r/t1",
        &[("a.txt", Some("a1\nA2\na3\n"))],
        "t1: a2",
    );
    let head1 = f.commit_on("flotilla/r/t1", &[("new1.txt", Some("n1\n"))], "t1: new1");
    f.branch("flotilla/r/t2", None);
    let head2 = f.commit_on(
        "flotilla/r/t2",
        &[("b.txt", Some("b1\nb2\nB3\n")), ("f.txt", None)],
        "t2: b3, drop f",
    );
    // main moves on after the branches left it.
    let onto = f.commit_on_main(&[("c.txt", "c\n")], "main: c");

    let (tip, commits) = built(
        f.merge
            .build(
                onto.clone(),
                vec![
                    item("t1", "flotilla/r/t1", &head1),
                    item("t2", "flotilla/r/t2", &head2),
                ],
                LandMode::Rebase,
            )
            .await
            .unwrap(),
    );

    // Three commits on main's tip, one parent each, oldest first: t1's two, then t2's.
    let history = f.history(&tip, &onto);
    assert_eq!(history.len(), 3, "{history:?}");
    let git = f.git();
    let subjects: Vec<String> = history
        .iter()
        .rev()
        .map(|id| {
            let c = git.find_commit(*id).unwrap();
            assert_eq!(c.parent_count(), 1);
            assert_eq!(
                c.author().name().ok(),
                Some("agent"),
                "the agent stays the author"
            );
            assert_eq!(c.committer().name().ok(), Some(FLOTILLA_NAME));
            assert_eq!(c.committer().email().ok(), Some(FLOTILLA_EMAIL));
            c.summary().unwrap().unwrap().to_string()
        })
        .collect();
    assert_eq!(subjects, ["t1: a2", "t1: new1", "t2: b3, drop f"]);
    assert_eq!(
        f.message(history[2].to_string()),
        "t1: a2\n\nFlotilla-Task: run1/t1\n"
    );
    assert_eq!(
        f.message(history[1].to_string()),
        "t1: new1\n\nFlotilla-Task: run1/t1\n"
    );
    assert_eq!(
        f.message(history[0].to_string()),
        "t2: b3, drop f\n\nFlotilla-Task: run1/t2\n"
    );
    assert_eq!(commits, [history[1].to_string(), history[0].to_string()]);
    assert_eq!(commits[1], tip);

    // The candidate holds main's and both branches' work.
    assert_eq!(f.file_at(&tip, "c.txt").as_deref(), Some("c\n"));
    assert_eq!(f.file_at(&tip, "new1.txt").as_deref(), Some("n1\n"));
    assert_eq!(f.file_at(&tip, "b.txt").as_deref(), Some("b1\nb2\nB3\n"));
    assert_eq!(f.file_at(&tip, "a.txt").as_deref(), Some("a1\nA2\na3\n"));
    assert_eq!(f.file_at(&tip, "f.txt"), None, "t2 deleted it");
    // t1's last commit is t1's work alone on main's tip.
    assert_eq!(
        f.file_at(&commits[0], "b.txt").as_deref(),
        Some("b1\nb2\nb3\n")
    );
    assert!(f.file_at(&commits[0], "f.txt").is_some());

    // Nothing moved: main, the branches, the user's checkout.
    assert_eq!(f.main_tip(), onto);
    assert_eq!(f.tip("flotilla/r/t1"), Some(head1));
    assert_eq!(f.tip("flotilla/r/t2"), Some(head2));
    assert_ne!(left, onto);
    assert_checkout_untouched(f.repo.path());
}

#[tokio::test]
async fn a_trailer_already_in_a_message_is_kept_last_and_not_repeated() {
    let f = fixture();
    let onto = f.main_tip();
    f.branch("flotilla/r/t1", None);
    let head = f.commit_on(
        "flotilla/r/t1",
        &[("x.txt", Some("x\n"))],
        "t1: x\n\nFlotilla-Task: run1/t1\n\nwhy x\n",
    );
    let (tip, _) = built(
        f.merge
            .build(
                onto,
                vec![item("t1", "flotilla/r/t1", &head)],
                LandMode::Rebase,
            )
            .await
            .unwrap(),
    );
    assert_eq!(
        f.message(&tip),
        "t1: x\n\nwhy x\n\nFlotilla-Task: run1/t1\n"
    );
}

#[tokio::test]
async fn a_branch_whose_work_main_already_has_lands_as_one_empty_commit_with_its_trailer() {
    let f = fixture();
    f.branch("flotilla/r/t1", None);
    let head = f.commit_on("flotilla/r/t1", &[("c.txt", Some("c\n"))], "t1: c");
    // main got the very same change another way.
    let onto = f.commit_on_main(&[("c.txt", "c\n")], "main: c");
    let (tip, commits) = built(
        f.merge
            .build(
                onto.clone(),
                vec![item("t1", "flotilla/r/t1", &head)],
                LandMode::Rebase,
            )
            .await
            .unwrap(),
    );
    assert_eq!(commits, std::slice::from_ref(&tip));
    let git = f.git();
    let commit = git.find_commit(oid(&tip)).unwrap();
    assert_eq!(commit.parent_id(0).unwrap(), oid(&onto));
    assert_eq!(
        commit.tree_id(),
        git.find_commit(oid(&onto)).unwrap().tree_id()
    );
    assert_eq!(f.message(&tip), "land t1\n\nFlotilla-Task: run1/t1\n");
    assert_eq!(commit.author().email().ok(), Some(FLOTILLA_EMAIL));
}

#[tokio::test]
async fn a_true_conflict_names_the_file_and_mains_clashing_commit() {
    let f = fixture();
    f.branch("flotilla/r/t1", None);
    let head1 = f.commit_on("flotilla/r/t1", &[("b.txt", Some("b1\nB2\nb3\n"))], "t1: b");
    f.branch("flotilla/r/t2", None);
    f.commit_on("flotilla/r/t2", &[("new2.txt", Some("n\n"))], "t2: new");
    let head2 = f.commit_on(
        "flotilla/r/t2",
        &[("f.txt", Some("one\nfrom the branch\nthree\n"))],
        "t2: shared line",
    );
    let clash = f.commit_on_main(&[("f.txt", "one\nfrom main\nthree\n")], "main: shared line");
    let onto = f.commit_on_main(&[("c.txt", "c\n")], "main: unrelated");

    let outcome = f
        .merge
        .build(
            onto.clone(),
            vec![
                item("t1", "flotilla/r/t1", &head1),
                item("t2", "flotilla/r/t2", &head2),
            ],
            LandMode::Rebase,
        )
        .await
        .unwrap();
    assert_eq!(
        outcome,
        BuildOutcome::Conflict {
            index: 1,
            files: vec!["f.txt".into()],
            clashing: vec![format!("{} main: shared line", &clash[..7])],
            main_moved: true,
        }
    );
    // Squashed, the same.
    let outcome = f
        .merge
        .build(
            onto.clone(),
            vec![item("t2", "flotilla/r/t2", &head2)],
            LandMode::Squash,
        )
        .await
        .unwrap();
    assert!(
        matches!(&outcome, BuildOutcome::Conflict { index: 0, files, main_moved: true, .. } if files == &["f.txt"]),
        "{outcome:?}"
    );
    assert_eq!(f.main_tip(), onto);
    assert_checkout_untouched(f.repo.path());
}

#[tokio::test]
async fn two_branches_that_clash_with_each_other_conflict_on_an_unmoved_main() {
    let f = fixture();
    let onto = f.main_tip();
    f.branch("flotilla/r/t1", None);
    let head1 = f.commit_on(
        "flotilla/r/t1",
        &[("f.txt", Some("one\nt1\nthree\n"))],
        "t1: f",
    );
    f.branch("flotilla/r/t2", None);
    let head2 = f.commit_on(
        "flotilla/r/t2",
        &[("f.txt", Some("one\nt2\nthree\n"))],
        "t2: f",
    );
    let outcome = f
        .merge
        .build(
            onto,
            vec![
                item("t1", "flotilla/r/t1", &head1),
                item("t2", "flotilla/r/t2", &head2),
            ],
            LandMode::Rebase,
        )
        .await
        .unwrap();
    let BuildOutcome::Conflict {
        index,
        files,
        clashing,
        main_moved,
    } = outcome
    else {
        panic!("{outcome:?}");
    };
    assert_eq!((index, files), (1, vec!["f.txt".to_string()]));
    assert!(
        !main_moved,
        "main did not move: the clash is with t1, in the candidate"
    );
    // The clash named is t1's replayed commit (in the candidate, not on main yet).
    assert_eq!(clashing.len(), 1, "{clashing:?}");
    assert!(clashing[0].ends_with(" t1: f"), "{clashing:?}");
}

#[tokio::test]
async fn squash_makes_one_commit_of_the_branchs_whole_change() {
    let f = fixture();
    f.branch("flotilla/r/t1", None);
    f.commit_on("flotilla/r/t1", &[("a.txt", Some("a1\nA2\na3\n"))], "wip 1");
    let head = f.commit_on("flotilla/r/t1", &[("x.txt", Some("x\n"))], "wip 2");
    let onto = f.commit_on_main(&[("f.txt", "ONE\nshared\nthree\n")], "main: f");

    for (mode, squash) in [(LandMode::Squash, false), (LandMode::Rebase, true)] {
        let mut land = item("t1", "flotilla/r/t1", &head);
        land.squash = squash;
        let (tip, commits) = built(f.merge.build(onto.clone(), vec![land], mode).await.unwrap());
        assert_eq!(commits, std::slice::from_ref(&tip));
        assert_eq!(f.history(&tip, &onto).len(), 1);
        let git = f.git();
        let commit = git.find_commit(oid(&tip)).unwrap();
        assert_eq!(commit.parent_count(), 1);
        assert_eq!(commit.parent_id(0).unwrap(), oid(&onto));
        assert_eq!(f.message(&tip), "land t1\n\nFlotilla-Task: run1/t1\n");
        assert_eq!(commit.committer().email().ok(), Some(FLOTILLA_EMAIL));
        assert_eq!(f.file_at(&tip, "a.txt").as_deref(), Some("a1\nA2\na3\n"));
        assert_eq!(f.file_at(&tip, "x.txt").as_deref(), Some("x\n"));
        assert_eq!(
            f.file_at(&tip, "f.txt").as_deref(),
            Some("ONE\nshared\nthree\n"),
            "main's own change stays"
        );
    }
}

#[tokio::test]
async fn merge_makes_a_merge_commit_of_the_candidate_and_the_branch() {
    let f = fixture();
    f.branch("flotilla/r/t1", None);
    let head1 = f.commit_on("flotilla/r/t1", &[("x.txt", Some("x\n"))], "t1: x");
    f.branch("flotilla/r/t2", None);
    let head2 = f.commit_on("flotilla/r/t2", &[("y.txt", Some("y\n"))], "t2: y");
    let onto = f.commit_on_main(&[("c.txt", "c\n")], "main: c");
    let (tip, commits) = built(
        f.merge
            .build(
                onto.clone(),
                vec![
                    item("t1", "flotilla/r/t1", &head1),
                    item("t2", "flotilla/r/t2", &head2),
                ],
                LandMode::Merge,
            )
            .await
            .unwrap(),
    );
    let git = f.git();
    let first = git.find_commit(oid(&commits[0])).unwrap();
    let second = git.find_commit(oid(&commits[1])).unwrap();
    assert_eq!(commits[1], tip);
    assert_eq!(
        first.parent_ids().collect::<Vec<_>>(),
        [oid(&onto), oid(&head1)]
    );
    assert_eq!(
        second.parent_ids().collect::<Vec<_>>(),
        [first.id(), oid(&head2)]
    );
    assert_eq!(
        f.message(&commits[0]),
        "land t1\n\nFlotilla-Task: run1/t1\n"
    );
    assert_eq!(
        f.message(&commits[1]),
        "land t2\n\nFlotilla-Task: run1/t2\n"
    );
    for path in ["c.txt", "x.txt", "y.txt"] {
        assert!(f.file_at(&tip, path).is_some(), "{path}");
    }
}

#[tokio::test]
async fn build_refuses_a_branch_that_is_not_where_its_handoff_left_it() {
    let f = fixture();
    let onto = f.main_tip();
    f.branch("flotilla/r/t1", None);
    let head = f.commit_on("flotilla/r/t1", &[("x.txt", Some("x\n"))], "t1: x");
    let moved = f.commit_on("flotilla/r/t1", &[("y.txt", Some("y\n"))], "t1: later");
    let outcome = f
        .merge
        .build(
            onto.clone(),
            vec![item("t1", "flotilla/r/t1", &head)],
            LandMode::Rebase,
        )
        .await
        .unwrap();
    let BuildOutcome::Unusable {
        index: 0,
        detail: e,
    } = outcome
    else {
        panic!("{outcome:?}")
    };
    assert!(
        e.contains("flotilla/r/t1") && e.contains(&moved) && e.contains(&head),
        "{e}"
    );
    // The second item of a batch is gone: it alone is named.
    let outcome = f
        .merge
        .build(
            onto,
            vec![
                item("t1", "flotilla/r/t1", &moved),
                item("t2", "flotilla/r/t2", &head),
            ],
            LandMode::Rebase,
        )
        .await
        .unwrap();
    let BuildOutcome::Unusable {
        index: 1,
        detail: e,
    } = outcome
    else {
        panic!("{outcome:?}")
    };
    assert!(e.contains("flotilla/r/t2 (task t2) does not exist"), "{e}");
}

#[tokio::test]
async fn find_on_main_finds_journaled_commits_on_the_first_parent_history_only() {
    let f = fixture();
    let start = f.main_tip();
    f.branch("flotilla/r/t1", None);
    f.commit_on("flotilla/r/t1", &[("x.txt", Some("x\n"))], "t1: x");
    let head1 = f.commit_on("flotilla/r/t1", &[("x2.txt", Some("x\n"))], "t1: x2");
    f.branch("flotilla/r/t2", None);
    let head2 = f.commit_on("flotilla/r/t2", &[("y.txt", Some("y\n"))], "t2: y");
    let (tip, commits) = built(
        f.merge
            .build(
                start.clone(),
                vec![
                    item("t1", "flotilla/r/t1", &head1),
                    item("t2", "flotilla/r/t2", &head2),
                ],
                LandMode::Rebase,
            )
            .await
            .unwrap(),
    );
    let candidates = vec![
        // An older intent that never reached main, then the one that did.
        vec!["0".repeat(40), commits[0].clone()],
        vec![commits[1].clone()],
        // A task branch's own commit is not on main's first-parent history.
        vec![head1.clone()],
        Vec::new(),
    ];
    let found = f
        .merge
        .find_on_main(tip.clone(), candidates.clone())
        .await
        .unwrap();
    assert_eq!(
        found,
        [
            Some(commits[0].clone()),
            Some(commits[1].clone()),
            None,
            None
        ]
    );
    // From main's tip before the candidate: none of it is there.
    let found = f.merge.find_on_main(start, candidates).await.unwrap();
    assert_eq!(found, [None, None, None, None]);
}

#[tokio::test]
async fn a_scratch_checkout_holds_the_commits_files_and_leaves_no_trace_in_git() {
    let f = fixture();
    let old = f.main_tip();
    f.branch("flotilla/r/t1", None);
    f.commit_with_mode(
        "flotilla/r/t1",
        &[("bin/run.sh", Some("#!/bin/sh\necho hi\n"))],
        git2::FileMode::BlobExecutable,
        "t1: script",
    );
    let commit = f.commit_on("flotilla/r/t1", &[("a.txt", None)], "t1: drop a");
    // main moves past: its new file is not in the scratch checkout.
    f.commit_on_main(&[("later.txt", "later\n")], "main: later");
    let index_before = std::fs::read(f.repo.path().join(".git/index")).unwrap();
    let branches_before: Vec<String> = f
        .git()
        .branches(None)
        .unwrap()
        .map(|b| b.unwrap().0.name().unwrap().unwrap().to_string())
        .collect();

    let tree = f
        .merge
        .scratch(commit.clone(), "gate t1/a b".into())
        .await
        .unwrap();
    assert_eq!(tree.commit, commit);
    assert!(tree.path.starts_with(f.scratch.path().join("scratch")));
    let name = tree
        .path
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(name.starts_with("gate-t1-a-b-"), "{name}");
    let read = |p: &str| std::fs::read_to_string(tree.path.join(p)).ok();
    assert_eq!(read("b.txt").as_deref(), Some("b1\nb2\nb3\n"));
    assert_eq!(read("README.md").as_deref(), Some("a test repository\n"));
    assert_eq!(read("bin/run.sh").as_deref(), Some("#!/bin/sh\necho hi\n"));
    assert_eq!(read("a.txt"), None, "deleted at the commit");
    assert_eq!(
        read("later.txt"),
        None,
        "main's later file is not at the commit"
    );
    assert!(!tree.path.join(".git").exists());
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(tree.path.join("bin/run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o111, 0o111, "the executable bit: {mode:o}");
    }
    // Two scratch checkouts of one commit and label are two directories.
    let second = f
        .merge
        .scratch(old.clone(), "gate t1/a b".into())
        .await
        .unwrap();
    assert_ne!(second.path, tree.path);
    assert_eq!(
        std::fs::read_to_string(second.path.join("a.txt")).unwrap(),
        "a1\na2\na3\n"
    );

    // The repository: same index, no worktree, no new branch; the checkout untouched.
    assert_eq!(
        std::fs::read(f.repo.path().join(".git/index")).unwrap(),
        index_before
    );
    let branches_after: Vec<String> = f
        .git()
        .branches(None)
        .unwrap()
        .map(|b| b.unwrap().0.name().unwrap().unwrap().to_string())
        .collect();
    assert_eq!(branches_after, branches_before);
    assert_checkout_untouched(f.repo.path());

    // What a command made read-only still goes.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir(tree.path.join("ro")).unwrap();
        std::fs::write(tree.path.join("ro/f"), "x").unwrap();
        std::fs::set_permissions(tree.path.join("ro"), std::fs::Permissions::from_mode(0o500))
            .unwrap();
    }
    f.merge.remove_scratch(tree.clone()).await.unwrap();
    assert!(!tree.path.exists());
    f.merge.remove_scratch(tree.clone()).await.unwrap();
    f.merge.remove_scratch(second.clone()).await.unwrap();
    assert!(!second.path.exists());

    // Nothing outside the scratch root is removed.
    let outside = ScratchTree {
        path: f.repo.path().to_path_buf(),
        commit: commit.clone(),
    };
    assert!(f.merge.remove_scratch(outside).await.is_err());
    assert!(f.repo.path().join(".git").exists());
    let climbing = ScratchTree {
        path: f.scratch.path().join("scratch/.."),
        commit,
    };
    assert!(f.merge.remove_scratch(climbing).await.is_err());
    assert!(f.scratch.path().exists());
}

#[tokio::test]
async fn conflict_markers_are_found_and_a_lone_rule_or_a_binary_file_is_not_one() {
    let f = fixture();
    f.branch("flotilla/r/t1", None);
    let conflicted = "keep\n<<<<<<< main\nours\n=======\ntheirs\n>>>>>>> flotilla/r/t1\nend\n\
                      <<<<<<< main\nx\n=======\ny\n>>>>>>> flotilla/r/t1\n";
    f.commit_on(
        "flotilla/r/t1",
        &[
            ("src/conflicted.rs", Some(conflicted)),
            ("README.md", Some("Title\n=======\n\ntext\n")),
            ("half.txt", Some("<<<<<<< left alone\n")),
        ],
        "t1: markers",
    );
    // Binary (a NUL byte) and over 1 MiB: both skipped.
    let binary = "<<<<<<< a\n\0\n>>>>>>> b\n";
    let big = format!("<<<<<<< a\n=======\n>>>>>>> b\n{}", "x".repeat(1024 * 1024));
    let commit = f.commit_on(
        "flotilla/r/t1",
        &[("blob.bin", Some(binary)), ("big.txt", Some(&big))],
        "t1: skipped",
    );

    let all = f
        .merge
        .conflict_markers(commit.clone(), None)
        .await
        .unwrap();
    let hit = |path: &str, line| MarkerHit {
        path: path.into(),
        line,
    };
    assert_eq!(
        all,
        [hit("src/conflicted.rs", 2), hit("src/conflicted.rs", 8)]
    );
    let some = f
        .merge
        .conflict_markers(
            commit.clone(),
            Some(vec![
                "README.md".into(),
                "src/conflicted.rs".into(),
                "missing.txt".into(),
                "src".into(),
            ]),
        )
        .await
        .unwrap();
    assert_eq!(some, all);
    let none = f
        .merge
        .conflict_markers(commit, Some(vec!["README.md".into(), "blob.bin".into()]))
        .await
        .unwrap();
    assert!(none.is_empty(), "{none:?}");
}

#[tokio::test]
async fn sweeps_of_later_commits_find_the_same_markers_reading_only_what_changed() {
    // ADR-045: trees found clean are remembered by id; a tree with a marker never is.
    let f = fixture();
    f.branch("flotilla/r/t1", None);
    let marked = "<<<<<<< a\nx\n=======\ny\n>>>>>>> b\n";
    let hit = |path: &str| MarkerHit {
        path: path.into(),
        line: 1,
    };
    let first = f.commit_on(
        "flotilla/r/t1",
        &[("src/a.rs", Some("clean\n")), ("docs/b.md", Some(marked))],
        "t1: one marked file",
    );
    let markers = |commit: String| f.merge.conflict_markers(commit, None);
    assert_eq!(markers(first.clone()).await.unwrap(), [hit("docs/b.md")]);
    // Again, and after an unrelated change: still found.
    assert_eq!(markers(first).await.unwrap(), [hit("docs/b.md")]);
    let second = f.commit_on(
        "flotilla/r/t1",
        &[("src/a.rs", Some("still clean\n"))],
        "t1: a",
    );
    assert_eq!(markers(second).await.unwrap(), [hit("docs/b.md")]);
    // A marker in a tree found clean before is found in the new tree.
    let third = f.commit_on("flotilla/r/t1", &[("src/c.rs", Some(marked))], "t1: c");
    assert_eq!(
        markers(third).await.unwrap(),
        [hit("docs/b.md"), hit("src/c.rs")]
    );
    let fourth = f.commit_on(
        "flotilla/r/t1",
        &[
            ("docs/b.md", Some("fixed\n")),
            ("src/c.rs", Some("fixed\n")),
        ],
        "t1: fixed",
    );
    assert_eq!(markers(fourth.clone()).await.unwrap(), []);
    // Going back to a commit whose trees held markers finds them again.
    let fifth = f.commit_on(
        "flotilla/r/t1",
        &[("src/c.rs", Some(marked))],
        "t1: c again",
    );
    assert_eq!(markers(fifth).await.unwrap(), [hit("src/c.rs")]);
    assert_eq!(markers(fourth).await.unwrap(), []);
}

#[tokio::test]
async fn at_most_a_hundred_markers_are_reported() {
    let f = fixture();
    f.branch("flotilla/r/t1", None);
    let many = "<<<<<<< a\n=======\n>>>>>>> b\n".repeat(150);
    let commit = f.commit_on("flotilla/r/t1", &[("many.txt", Some(&many))], "t1: many");
    let hits = f.merge.conflict_markers(commit, None).await.unwrap();
    assert_eq!(hits.len(), 100);
    assert_eq!(hits[99].line, 99 * 3 + 1);
}

#[tokio::test]
async fn delete_branch_deletes_flotillas_branches_and_refuses_any_other() {
    let f = fixture();
    f.branch("flotilla/r/t1", None);
    f.branch("feature", None);
    f.merge.delete_branch("flotilla/r/t1".into()).await.unwrap();
    assert_eq!(f.tip("flotilla/r/t1"), None);
    // A missing one is fine.
    f.merge.delete_branch("flotilla/r/t1".into()).await.unwrap();
    for branch in ["main", "feature"] {
        let e = f.merge.delete_branch(branch.into()).await.unwrap_err();
        assert!(e.to_string().contains("refusing"), "{e}");
        assert!(f.tip(branch).is_some(), "{branch} stays");
    }
}

/// A branch some checkout has as its `HEAD` is not deleted, whichever checkout: a linked
/// worktree's or the repository's own (flotilla reads their `HEAD` files itself rather than
/// have libgit2 open every worktree, ADR-041). A worktree on another branch or detached does
/// not hold it, and once nothing has it checked out, it goes.
#[tokio::test]
async fn a_branch_checked_out_anywhere_is_not_deleted() {
    let f = fixture();
    let git = f.git();
    for branch in ["flotilla/r/t1", "flotilla/r/t2", "flotilla/r/t3"] {
        f.branch(branch, None);
    }
    let trees = tempfile::tempdir().unwrap();
    let worktree_on = |name: &str, branch: &str| {
        let reference = git.find_reference(&format!("refs/heads/{branch}")).unwrap();
        git.worktree(
            name,
            &trees.path().join(name),
            Some(git2::WorktreeAddOptions::new().reference(Some(&reference))),
        )
        .unwrap()
    };
    let holder = worktree_on("holder", "flotilla/r/t1");
    worktree_on("other", "flotilla/r/t3");
    // Detached: names no branch.
    let detached = worktree_on("detached", "flotilla/r/t2");
    git2::Repository::open(trees.path().join("detached"))
        .unwrap()
        .set_head_detached(oid(&f.main_tip()))
        .unwrap();
    let e = f
        .merge
        .delete_branch("flotilla/r/t1".into())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("worktree \"holder\""), "{e}");
    assert!(
        f.tip("flotilla/r/t1").is_some(),
        "the checked-out branch stays"
    );
    f.merge.delete_branch("flotilla/r/t2".into()).await.unwrap();
    assert_eq!(
        f.tip("flotilla/r/t2"),
        None,
        "a detached worktree holds nothing"
    );
    // The repository's own HEAD (git refuses that while a worktree has the branch).
    drop(detached);
    std::fs::remove_dir_all(trees.path().join("other")).unwrap();
    git.find_worktree("other")
        .unwrap()
        .prune(Some(git2::WorktreePruneOptions::new().valid(true)))
        .unwrap();
    git.set_head("refs/heads/flotilla/r/t3").unwrap();
    let e = f
        .merge
        .delete_branch("flotilla/r/t3".into())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("the repository"), "{e}");
    assert!(f.tip("flotilla/r/t3").is_some());
    git.set_head("refs/heads/main").unwrap();
    f.merge.delete_branch("flotilla/r/t3".into()).await.unwrap();
    assert_eq!(f.tip("flotilla/r/t3"), None);
    // Once its worktree is gone, the first one goes too.
    std::fs::remove_dir_all(holder.path()).unwrap();
    holder
        .prune(Some(git2::WorktreePruneOptions::new().valid(true)))
        .unwrap();
    f.merge.delete_branch("flotilla/r/t1".into()).await.unwrap();
    assert_eq!(f.tip("flotilla/r/t1"), None);
}

/// `git status` of the user's checkout: (path, status) of everything not clean, untracked
/// files included.
fn status(path: &Path) -> Vec<(String, git2::Status)> {
    let repo = git(path);
    let statuses = repo
        .statuses(Some(git2::StatusOptions::new().include_untracked(true)))
        .unwrap();
    statuses
        .iter()
        .map(|s| (s.path().unwrap().to_string(), s.status()))
        .collect()
}

/// main moves from `old` to `new` the way the MergeQueue moves it: the ref only.
fn land_on_main(f: &Fixture) -> (String, String) {
    let old = f.main_tip();
    let new = f.commit_on(
        "main",
        &[
            ("a.txt", Some("a1\nLANDED\na3\n")),
            ("landed.txt", Some("landed\n")),
            ("b.txt", None),
        ],
        "landed",
    );
    (old, new)
}

#[tokio::test]
async fn a_clean_checkout_of_main_follows_main() {
    let f = fixture();
    let (old, new) = land_on_main(&f);
    // Untracked files are the user's and stay.
    std::fs::write(f.repo.path().join("notes.txt"), "mine\n").unwrap();
    let sync = f.merge.sync_checkout(old, new.clone()).await.unwrap();
    assert_eq!(sync, CheckoutSync::FastForwarded);
    let git = f.git();
    let head = git.find_reference("HEAD").unwrap();
    assert_eq!(head.symbolic_target().unwrap(), Some("refs/heads/main"));
    assert_eq!(git.head().unwrap().target().unwrap(), oid(&new));
    let read = |p: &str| std::fs::read_to_string(f.repo.path().join(p)).ok();
    assert_eq!(read("a.txt").as_deref(), Some("a1\nLANDED\na3\n"));
    assert_eq!(read("landed.txt").as_deref(), Some("landed\n"));
    assert_eq!(read("b.txt"), None);
    assert_eq!(read("notes.txt").as_deref(), Some("mine\n"));
    assert_eq!(
        status(f.repo.path()),
        [("notes.txt".to_string(), git2::Status::WT_NEW)],
        "nothing but the user's untracked file differs from main"
    );
}

fn assert_head_on_main(f: &Fixture) {
    assert_eq!(
        f.git()
            .find_reference("HEAD")
            .unwrap()
            .symbolic_target()
            .unwrap(),
        Some("refs/heads/main"),
        "HEAD is never detached (ADR-021)"
    );
}

#[tokio::test]
async fn a_checkout_with_the_users_changes_in_moved_files_stays_on_main_untouched() {
    let f = fixture();
    let (old, new) = land_on_main(&f);
    // A change of the user's to a file flotilla's commit changes too.
    std::fs::write(f.repo.path().join("a.txt"), "a1\nmy change\na3\n").unwrap();
    let sync = f
        .merge
        .sync_checkout(old.clone(), new.clone())
        .await
        .unwrap();
    assert_eq!(
        sync,
        CheckoutSync::Behind {
            at: old.clone(),
            paths: vec!["a.txt".into()]
        }
    );
    assert_head_on_main(&f);
    assert_eq!(f.main_tip(), new);
    let read = |p: &str| std::fs::read_to_string(f.repo.path().join(p)).unwrap();
    assert_eq!(read("a.txt"), "a1\nmy change\na3\n");
    assert_eq!(
        read("b.txt"),
        "b1\nb2\nb3\n",
        "flotilla's deletion is not applied"
    );
    assert!(!f.repo.path().join("landed.txt").exists());
}

/// A crash after main moved from `behind` to `missed` and before the checkout followed:
/// the next move (`missed` → `newer`) finds the checkout on `behind`.
#[tokio::test]
async fn a_clean_checkout_left_behind_by_a_crash_is_brought_along_from_where_it_is() {
    let f = fixture();
    let (behind, missed) = land_on_main(&f);
    let (_, newer) = land_on_main_again(&f, &missed);
    let sync = f.merge.sync_checkout(missed, newer.clone()).await.unwrap();
    assert_eq!(sync, CheckoutSync::FastForwarded);
    let git = f.git();
    assert_eq!(
        git.find_reference("HEAD")
            .unwrap()
            .symbolic_target()
            .unwrap(),
        Some("refs/heads/main")
    );
    assert_eq!(git.head().unwrap().target().unwrap(), oid(&newer));
    assert_eq!(status(f.repo.path()), [], "nothing shows reversed");
    let read = |p: &str| std::fs::read_to_string(f.repo.path().join(p)).ok();
    assert_eq!(
        read("landed.txt").as_deref(),
        Some(
            "landed
"
        )
    );
    assert_eq!(read("again.txt").as_deref(), Some("again\n"));
    assert_ne!(behind, newer);
}

#[tokio::test]
async fn a_changed_checkout_left_behind_by_a_crash_stays_where_it_really_was_on_main() {
    let f = fixture();
    let (behind, missed) = land_on_main(&f);
    let (_, newer) = land_on_main_again(&f, &missed);
    std::fs::write(f.repo.path().join("a.txt"), "a1\nmy change\na3\n").unwrap();
    let sync = f.merge.sync_checkout(missed, newer).await.unwrap();
    // Its index stands on `behind`, not at `missed`, whose landed files the work tree never
    // had; the user changed a file main changed since: nothing is touched.
    assert_eq!(
        sync,
        CheckoutSync::Behind {
            at: behind.clone(),
            paths: vec!["a.txt".into()]
        }
    );
    assert_head_on_main(&f);
    assert_eq!(
        std::fs::read_to_string(f.repo.path().join("a.txt")).unwrap(),
        "a1\nmy change\na3\n"
    );
}

#[tokio::test]
async fn at_a_queues_start_a_checkout_behind_main_catches_up_and_one_on_the_tip_is_untouched() {
    let f = fixture();
    let (_, tip) = land_on_main(&f);
    // The start of a queue after a crash: main moved, the checkout did not.
    let sync = f
        .merge
        .sync_checkout(tip.clone(), tip.clone())
        .await
        .unwrap();
    assert_eq!(sync, CheckoutSync::FastForwarded);
    assert_eq!(status(f.repo.path()), []);
    assert_eq!(
        std::fs::read_to_string(f.repo.path().join("landed.txt")).unwrap(),
        "landed\n"
    );
    // On the tip with the user's edits: nothing is touched, HEAD stays on main.
    std::fs::write(f.repo.path().join("a.txt"), "mine\n").unwrap();
    let sync = f
        .merge
        .sync_checkout(tip.clone(), tip.clone())
        .await
        .unwrap();
    assert_eq!(sync, CheckoutSync::FastForwarded);
    let git = f.git();
    assert_eq!(
        git.find_reference("HEAD")
            .unwrap()
            .symbolic_target()
            .unwrap(),
        Some("refs/heads/main")
    );
    assert_eq!(
        status(f.repo.path()),
        [("a.txt".to_string(), git2::Status::WT_MODIFIED)]
    );
    assert_eq!(
        std::fs::read_to_string(f.repo.path().join("a.txt")).unwrap(),
        "mine\n"
    );
}

fn land_on_main_again(f: &Fixture, old: &str) -> (String, String) {
    let new = f.commit_on("main", &[("again.txt", Some("again\n"))], "again");
    (old.to_string(), new)
}

#[tokio::test]
async fn an_untracked_file_in_the_way_stops_the_fast_forward_and_stays() {
    let f = fixture();
    let (old, new) = land_on_main(&f);
    std::fs::write(f.repo.path().join("landed.txt"), "the user's own\n").unwrap();
    let sync = f
        .merge
        .sync_checkout(old.clone(), new.clone())
        .await
        .unwrap();
    assert_eq!(
        sync,
        CheckoutSync::Behind {
            at: old.clone(),
            paths: vec!["landed.txt".into()]
        }
    );
    assert_head_on_main(&f);
    assert_eq!(
        std::fs::read_to_string(f.repo.path().join("landed.txt")).unwrap(),
        "the user's own\n"
    );
    assert_eq!(
        std::fs::read_to_string(f.repo.path().join("a.txt")).unwrap(),
        "a1\na2\na3\n"
    );
}

#[tokio::test]
async fn a_checkout_of_another_branch_or_a_bare_repository_is_not_mains() {
    let f = fixture();
    f.branch("feature", None);
    f.git().set_head("refs/heads/feature").unwrap();
    let (old, new) = land_on_main(&f);
    assert_eq!(
        f.merge.sync_checkout(old, new).await.unwrap(),
        CheckoutSync::NotCheckedOut
    );
    assert_eq!(
        f.git()
            .find_reference("HEAD")
            .unwrap()
            .symbolic_target()
            .unwrap(),
        Some("refs/heads/feature")
    );

    let bare = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init_opts(
        bare.path(),
        git2::RepositoryInitOptions::new()
            .bare(true)
            .initial_head("main"),
    )
    .unwrap();
    let sig = git2::Signature::now("t", "t@example.com").unwrap();
    let tree = repo
        .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
        .unwrap();
    let first = repo
        .commit(Some("HEAD"), &sig, &sig, "first", &tree, &[])
        .unwrap();
    let second = repo
        .commit(
            Some("HEAD"),
            &sig,
            &sig,
            "second",
            &tree,
            &[&repo.find_commit(first).unwrap()],
        )
        .unwrap();
    let merge = GitMerge::new(bare.path(), bare.path().join("scratch"), main_branch());
    assert_eq!(
        merge
            .sync_checkout(first.to_string(), second.to_string())
            .await
            .unwrap(),
        CheckoutSync::NotCheckedOut
    );
}

#[tokio::test]
async fn a_conflict_fix_starts_from_mains_tip_with_the_branch_merged_and_conflicts_marked() {
    let f = fixture();
    let state = tempfile::tempdir().unwrap();
    let run = RunId::generate();
    let worktrees = GitWorktrees::new(
        f.repo.path(),
        run,
        state.path().join(run.to_string()),
        main_branch(),
    );
    // The task's branch: a clash on f.txt, a clean edit of b.txt, a new file.
    f.branch("flotilla/r/t1", None);
    let task_head = f.commit_on(
        "flotilla/r/t1",
        &[
            ("f.txt", Some("one\nfrom the branch\nthree\n")),
            ("b.txt", Some("b1\nb2\nB3\n")),
            ("new.txt", Some("new\n")),
        ],
        "t1: work",
    );
    let main = f.commit_on_main(
        &[
            ("f.txt", "one\nfrom main\nthree\n"),
            ("a.txt", "A1\na2\na3\n"),
        ],
        "main: moved",
    );

    let task: TaskId = "t1".parse().unwrap();
    let request = WorktreeRequest {
        branch: branch_name(run, &task, 2),
        task,
        attempt: 2,
        start: WorktreeStart::ConflictFix {
            branch: "flotilla/r/t1".into(),
        },
    };
    let ws = worktrees.prepare(request.clone()).await.unwrap();

    // The base is flotilla's commit K on main's tip; the fix's branch starts there.
    let k = f.tip(&request.branch).unwrap();
    assert_eq!(ws.base, k);
    let git = f.git();
    let commit = git.find_commit(oid(&k)).unwrap();
    assert_eq!(commit.parent_ids().collect::<Vec<_>>(), [oid(&main)]);
    assert_eq!(commit.author().email().ok(), Some(FLOTILLA_EMAIL));
    assert_eq!(commit.committer().email().ok(), Some(FLOTILLA_EMAIL));
    assert_eq!(
        commit.message().unwrap(),
        "flotilla: flotilla/r/t1 merged onto main; conflicts marked in: f.txt"
    );
    let read = |p: &str| std::fs::read_to_string(ws.path.join(p)).unwrap();
    assert_eq!(
        read("f.txt"),
        "one\n<<<<<<< main\nfrom main\n=======\nfrom the branch\n>>>>>>> flotilla/r/t1\nthree\n"
    );
    assert_eq!(
        read("b.txt"),
        "b1\nb2\nB3\n",
        "the branch's clean edit is in"
    );
    assert_eq!(read("new.txt"), "new\n");
    assert_eq!(read("a.txt"), "A1\na2\na3\n", "main's own change is in");
    // The markers are what the gate will look for.
    assert_eq!(
        f.merge.conflict_markers(k.clone(), None).await.unwrap(),
        [MarkerHit {
            path: "f.txt".into(),
            line: 2
        }]
    );
    assert_eq!(
        f.tip("flotilla/r/t1"),
        Some(task_head),
        "the task branch stays"
    );
    assert_eq!(f.main_tip(), main);

    // The fix: its diff is the resolution alone.
    std::fs::write(ws.path.join("f.txt"), "one\nfrom both\nthree\n").unwrap();
    let work = worktrees
        .seal(ws.clone(), "f1: resolve".into())
        .await
        .unwrap();
    assert_eq!(work.base, k);
    let files: Vec<&str> = work.files.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(files, ["f.txt"]);

    // A restart, after main moved on: the reused branch's base is K again.
    worktrees
        .release(ws.clone(), BranchFate::Keep)
        .await
        .unwrap();
    f.commit_on_main(&[("c.txt", "c\n")], "main: more");
    let again = worktrees.prepare(request.clone()).await.unwrap();
    assert_eq!(again.base, k);
    assert_eq!(read("f.txt"), "one\nfrom both\nthree\n");
    // Reused as it is.
    let same = worktrees.prepare(request).await.unwrap();
    assert_eq!(same, again);
    worktrees.release(again, BranchFate::Delete).await.unwrap();
    assert_checkout_untouched(f.repo.path());
}

#[tokio::test]
async fn a_conflict_fix_keeps_the_surviving_side_of_a_modify_delete() {
    let f = fixture();
    let state = tempfile::tempdir().unwrap();
    let run = RunId::generate();
    let worktrees = GitWorktrees::new(
        f.repo.path(),
        run,
        state.path().join(run.to_string()),
        main_branch(),
    );
    f.branch("flotilla/r/t1", None);
    f.commit_on(
        "flotilla/r/t1",
        &[("b.txt", Some("b1\nedited\nb3\n"))],
        "t1: b",
    );
    let main = f.commit_on("main", &[("b.txt", None)], "main: drop b");
    let task: TaskId = "t1".parse().unwrap();
    let ws = worktrees
        .prepare(WorktreeRequest {
            branch: branch_name(run, &task, 2),
            task,
            attempt: 2,
            start: WorktreeStart::ConflictFix {
                branch: "flotilla/r/t1".into(),
            },
        })
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(ws.path.join("b.txt")).unwrap(),
        "b1\nedited\nb3\n"
    );
    let git = f.git();
    let k = git.find_commit(oid(&ws.base)).unwrap();
    assert_eq!(k.parent_id(0).unwrap(), oid(&main));
    assert!(
        k.message().unwrap().ends_with("conflicts marked in: b.txt"),
        "{:?}",
        k.message()
    );
    // A missing task branch is refused.
    let task: TaskId = "t9".parse().unwrap();
    let e = worktrees
        .prepare(WorktreeRequest {
            branch: branch_name(run, &task, 2),
            task,
            attempt: 2,
            start: WorktreeStart::ConflictFix {
                branch: "flotilla/r/t9".into(),
            },
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
    assert_eq!(f.tip(&branch_name(run, &"t9".parse().unwrap(), 2)), None);
}

#[tokio::test]
async fn a_branch_that_merged_main_in_is_replayed_without_its_merge() {
    let f = fixture();
    f.branch("flotilla/r/t1", None);
    let x = f.commit_on("flotilla/r/t1", &[("x.txt", Some("x\n"))], "t1: x");
    let onto = f.commit_on_main(&[("c.txt", "c\n")], "main: c");
    // The agent merged main into its branch, then went on.
    let git = f.git();
    let ours = git.find_commit(oid(&x)).unwrap();
    let theirs = git.find_commit(oid(&onto)).unwrap();
    let mut index = git.merge_commits(&ours, &theirs, None).unwrap();
    let tree = git.find_tree(index.write_tree_to(&git).unwrap()).unwrap();
    let sig = git2::Signature::now("agent", "agent@example.com").unwrap();
    git.commit(
        Some("refs/heads/flotilla/r/t1"),
        &sig,
        &sig,
        "merge main",
        &tree,
        &[&ours, &theirs],
    )
    .unwrap();
    let head = f.commit_on("flotilla/r/t1", &[("y.txt", Some("y\n"))], "t1: y");

    let (tip, commits) = built(
        f.merge
            .build(
                onto.clone(),
                vec![item("t1", "flotilla/r/t1", &head)],
                LandMode::Rebase,
            )
            .await
            .unwrap(),
    );
    assert_eq!(commits, std::slice::from_ref(&tip));
    let subjects: Vec<String> = f
        .history(&tip, &onto)
        .iter()
        .map(|id| {
            git.find_commit(*id)
                .unwrap()
                .summary()
                .unwrap()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        subjects,
        ["t1: y", "t1: x"],
        "the merge of main changes nothing here"
    );
    for path in ["c.txt", "x.txt", "y.txt"] {
        assert!(f.file_at(&tip, path).is_some(), "{path}");
    }
}
