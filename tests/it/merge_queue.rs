//! The MergeQueue actor on a real repository (GitMerge, GitRepo, real gate commands), with
//! a probe in the TaskGraph's place: what it lands, in what order, and what it never does.

use std::path::Path;
use std::sync::{Arc, Mutex};

use actix::{Actor, Context, Handler};
use flotilla::git::merge::GitMerge;
use flotilla::git::reader::GitRepo;
use flotilla::process::TokioProcessRunner;
use flotilla_actors::actors::{MergeConfig, MergeKit, MergeQueue};
use flotilla_actors::ports::{
    BuildOutcome, LandItem, LandMode, MainRef, MainRefError, MarkerHit, MergeGit, RepoError,
    ScratchTree,
};
use flotilla_actors::protocol::*;
use futures::future::BoxFuture;

use crate::daemon_env::{commit_files, init_repo, main_branch};
use crate::harness::{Inbox, probe, task};

/// Landing intents as journaled: (from, to, what each task's commit is).
type Intents = Arc<Mutex<Vec<(String, String, Vec<IntendedLanding>)>>>;

struct Fixture {
    _dir: tempfile::TempDir,
    repo_path: std::path::PathBuf,
    run: RunId,
    base: git2::Oid,
    /// Every landing intent the queues of this fixture had journaled, in order.
    intents: Intents,
    /// `[worktrees] retry_in_place` for the queues it makes.
    retry_in_place: bool,
}

/// Stands in for the TaskGraph's journal of landing intents: records each one and says it
/// is committed.
struct Ledger(Intents);

impl Actor for Ledger {
    type Context = Context<Self>;
}

impl Handler<IntendLanding> for Ledger {
    type Result = Result<(), IntentNotJournaled>;

    fn handle(&mut self, msg: IntendLanding, _: &mut Context<Self>) -> Self::Result {
        self.0.lock().unwrap().push((msg.from, msg.to, msg.landed));
        Ok(())
    }
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let repo_path = dir.path().join("repo");
        std::fs::create_dir_all(&repo_path).unwrap();
        init_repo(&repo_path);
        let repo = git2::Repository::open(&repo_path).unwrap();
        let base = commit_files(&repo, &[("README.md", "# project\n")], "start");
        // The user works elsewhere: main is not checked out.
        repo.set_head_detached(base).unwrap();
        Fixture {
            _dir: dir,
            repo_path,
            run: RunId::generate(),
            base,
            intents: Arc::default(),
            retry_in_place: false,
        }
    }

    fn repo(&self) -> git2::Repository {
        git2::Repository::open(&self.repo_path).unwrap()
    }

    /// A task branch off `base` adding `files`, as a worker would leave it.
    fn branch(&self, id: &str, files: &[(&str, &str)]) -> LandRequest {
        self.branch_from(id, self.base, files)
    }

    /// A task branch off `from` adding `files`.
    fn branch_from(&self, id: &str, from: git2::Oid, files: &[(&str, &str)]) -> LandRequest {
        let repo = self.repo();
        let base = repo.find_commit(from).unwrap();
        let mut index = git2::Index::new().unwrap();
        let tree = base.tree().unwrap();
        index.read_tree(&tree).unwrap();
        for (path, text) in files {
            let blob = repo.blob(text.as_bytes()).unwrap();
            let mut entry = index_entry(path, blob, text.len());
            entry.path = path.as_bytes().to_vec();
            index.add(&entry).unwrap();
        }
        let tree = repo.find_tree(index.write_tree_to(&repo).unwrap()).unwrap();
        let sig = git2::Signature::now("agent", "agent@example.com").unwrap();
        let head = repo
            .commit(None, &sig, &sig, &format!("{id}: work"), &tree, &[&base])
            .unwrap();
        let t = task(id);
        let branch = branch_name(self.run, &t, 1);
        repo.branch(&branch, &repo.find_commit(head).unwrap(), false)
            .unwrap();
        LandRequest {
            task: t,
            attempt: 1,
            branch,
            head: head.to_string(),
            subject: format!("{id}: work"),
            fix: None,
            retries: 0,
            urgency: Urgency::default(),
            recovered: false,
            intended: Vec::new(),
        }
    }

    /// The commits journaled as holding `id`'s work, oldest first.
    fn intended(&self, id: &str) -> Vec<String> {
        self.intents
            .lock()
            .unwrap()
            .iter()
            .flat_map(|(_, _, landed)| landed.iter())
            .filter(|l| l.task == task(id))
            .map(|l| l.commit.clone())
            .collect()
    }

    fn queue(&self, gate: &[&str]) -> (actix::Addr<MergeQueue>, Inbox<FromMerging>) {
        let main = Arc::new(GitRepo::new(self.repo_path.clone(), main_branch()));
        self.queue_with_main(gate, main)
    }

    fn git(&self) -> GitMerge {
        GitMerge::new(
            self.repo_path.clone(),
            self.repo_path.parent().unwrap().join("scratch"),
            main_branch(),
        )
    }

    /// A queue whose compare-and-swap goes through `main`.
    fn queue_with_main(
        &self,
        gate: &[&str],
        main: Arc<dyn MainRef>,
    ) -> (actix::Addr<MergeQueue>, Inbox<FromMerging>) {
        self.queue_with(gate, main, Arc::new(self.git()), None)
    }

    /// A queue on `git`, telling `notices` what the supervisor would hear.
    fn queue_with(
        &self,
        gate: &[&str],
        main: Arc<dyn MainRef>,
        git: Arc<dyn MergeGit>,
        notices: Option<actix::Recipient<Published>>,
    ) -> (actix::Addr<MergeQueue>, Inbox<FromMerging>) {
        let config = MergeConfig {
            gate: gate.iter().map(|s| s.to_string()).collect(),
            ..MergeConfig::default()
        };
        self.queue_configured(config, main, git, notices)
    }

    /// A queue with `config`, on `git`.
    fn queue_configured(
        &self,
        config: MergeConfig,
        main: Arc<dyn MainRef>,
        git: Arc<dyn MergeGit>,
        notices: Option<actix::Recipient<Published>>,
    ) -> (actix::Addr<MergeQueue>, Inbox<FromMerging>) {
        let (graph, inbox) = probe::<FromMerging>("graph");
        let reader = Arc::new(GitRepo::new(self.repo_path.clone(), main_branch()));
        let kit = MergeKit {
            git,
            main,
            reader,
            runner: Arc::new(TokioProcessRunner),
            config,
            retry_in_place: self.retry_in_place,
        };
        let ledger = Ledger(self.intents.clone()).start().recipient();
        let mut queue = MergeQueue::new(self.run, kit, graph, ledger);
        if let Some(notices) = notices {
            queue = queue.with_notices(notices);
        }
        (queue.start(), inbox)
    }

    fn main_tip(&self) -> git2::Oid {
        self.repo().refname_to_id("refs/heads/main").unwrap()
    }

    /// main's first-parent history back to `base`, newest first.
    fn history(&self) -> Vec<git2::Oid> {
        let repo = self.repo();
        let mut out = Vec::new();
        let mut c = repo.find_commit(self.main_tip()).unwrap();
        while c.id() != self.base {
            out.push(c.id());
            assert_eq!(c.parent_count(), 1, "main stays linear");
            c = c.parent(0).unwrap();
        }
        out
    }
}

fn index_entry(path: &str, blob: git2::Oid, len: usize) -> git2::IndexEntry {
    git2::IndexEntry {
        ctime: git2::IndexTime::new(0, 0),
        mtime: git2::IndexTime::new(0, 0),
        dev: 0,
        ino: 0,
        mode: 0o100644,
        uid: 0,
        gid: 0,
        file_size: len as u32,
        id: blob,
        flags: 0,
        flags_extended: 0,
        path: path.as_bytes().to_vec(),
    }
}

/// Collects what the queue says until every task in `tasks` has a verdict.
async fn verdicts(inbox: &mut Inbox<FromMerging>, tasks: usize) -> Vec<FromMerging> {
    let mut seen = Vec::new();
    let mut decided = 0;
    while decided < tasks {
        let m = inbox.expect().await;
        decided += match &m {
            FromMerging::MainMoved { landed, .. } => landed.len(),
            FromMerging::Failed { .. } | FromMerging::Conflict { .. } => 1,
            FromMerging::FoundOnMain { .. } => 1,
            _ => 0,
        };
        seen.push(m);
    }
    seen
}

fn file_at(repo: &git2::Repository, commit: git2::Oid, path: &str) -> Option<String> {
    let tree = repo.find_commit(commit).ok()?.tree().ok()?;
    let entry = tree.get_path(Path::new(path)).ok()?;
    let blob = repo.find_blob(entry.id()).ok()?;
    Some(String::from_utf8_lossy(blob.content()).into_owned())
}

#[actix::test]
async fn parallel_branches_land_in_order_on_a_linear_main_with_their_trailers() {
    let f = Fixture::new();
    let requests: Vec<LandRequest> = (1..=3)
        .map(|n| {
            f.branch(
                &format!("t{n}"),
                &[(&format!("src/m{n}.txt"), &format!("{n}\n"))],
            )
        })
        .collect();
    let (queue, mut inbox) = f.queue(&["test -f README.md"]);
    for r in &requests {
        queue.do_send(ToMergeQueue::Enqueue(Box::new(r.clone())));
    }
    let seen = verdicts(&mut inbox, 3).await;
    let landed: Vec<TaskId> = seen
        .iter()
        .flat_map(|m| match m {
            FromMerging::MainMoved { landed, .. } => {
                landed.iter().map(|(t, _, _)| t.clone()).collect::<Vec<_>>()
            }
            other => panic!("nothing but landings expected, got {other:?}"),
        })
        .collect();
    assert_eq!(
        landed,
        vec![task("t1"), task("t2"), task("t3")],
        "equal urgency: oldest first, then by id"
    );
    let history = f.history();
    assert_eq!(history.len(), 3);
    let repo = f.repo();
    for (commit, n) in history.iter().rev().zip(1..) {
        let message = repo
            .find_commit(*commit)
            .unwrap()
            .message()
            .unwrap()
            .to_string();
        assert!(
            message
                .trim_end()
                .ends_with(&format!("Flotilla-Task: {}/t{n}", f.run)),
            "{message}"
        );
    }
    for n in 1..=3 {
        assert_eq!(
            file_at(&repo, f.main_tip(), &format!("src/m{n}.txt")).as_deref(),
            Some(&*format!("{n}\n"))
        );
        assert!(
            repo.find_branch(&requests[n - 1].branch, git2::BranchType::Local)
                .is_err(),
            "landed branches are deleted"
        );
    }
}

#[actix::test]
async fn a_failing_gate_never_moves_main_and_bisection_finds_the_culprit_in_four() {
    let f = Fixture::new();
    let requests = vec![
        f.branch("t1", &[("a.txt", "a\n")]),
        f.branch("t2", &[("b.txt", "b\n")]),
        f.branch("t3", &[("bad.txt", "breaks the build\n")]),
        f.branch("t4", &[("d.txt", "d\n")]),
    ];
    let (queue, mut inbox) =
        f.queue(&["test ! -e bad.txt || { echo 'bad.txt: the build is broken'; exit 1; }"]);
    for r in &requests {
        queue.do_send(ToMergeQueue::Enqueue(Box::new(r.clone())));
    }
    let seen = verdicts(&mut inbox, 4).await;
    // The whole batch failed, was tested once more, then bisected.
    let FromMerging::Note(note) = &seen[0] else {
        panic!("first the batch's gate failure: {seen:?}");
    };
    let EventKind::MergeGateFailed {
        tasks,
        flaky_retry: true,
        output_tail,
        ..
    } = &**note
    else {
        panic!("first the batch's gate failure, tested once more: {seen:?}");
    };
    assert_eq!(tasks.len(), 4);
    assert!(output_tail.contains("the build is broken"));
    let failed: Vec<&FromMerging> = seen
        .iter()
        .filter(|m| matches!(m, FromMerging::Failed { .. }))
        .collect();
    assert_eq!(failed.len(), 1, "{seen:?}");
    assert!(matches!(
        failed[0],
        FromMerging::Failed { task: t, failure: LandingFailure::GateFailed { output_tail, .. }, .. }
            if *t == task("t3") && output_tail.contains("the build is broken")
    ));
    let mut landed: Vec<TaskId> = seen
        .iter()
        .flat_map(|m| match m {
            FromMerging::MainMoved { landed, .. } => {
                landed.iter().map(|(t, _, _)| t.clone()).collect()
            }
            _ => Vec::new(),
        })
        .collect();
    landed.sort();
    assert_eq!(landed, vec![task("t1"), task("t2"), task("t4")]);
    // main never held the culprit's tree, at any commit.
    let repo = f.repo();
    for commit in f.history() {
        assert_eq!(
            file_at(&repo, commit, "bad.txt"),
            None,
            "main moved to an ungated tree"
        );
    }
    assert!(
        repo.find_branch(&requests[2].branch, git2::BranchType::Local)
            .is_err(),
        "the culprit's attempt branch goes"
    );
}

/// With `retry_in_place` (ADR-031) a gate-failed attempt's branch stays for its retry to
/// continue from; its batch-mate landed after it, so the queue is past the deletion.
#[actix::test]
async fn with_retry_in_place_a_gate_failed_branch_is_spared_for_its_retry() {
    let mut f = Fixture::new();
    f.retry_in_place = true;
    let bad = f.branch("t1", &[("bad.txt", "breaks the build\n")]);
    let good = f.branch("t2", &[("b.txt", "b\n")]);
    let (queue, mut inbox) = f.queue(&["test ! -e bad.txt"]);
    queue.do_send(ToMergeQueue::Enqueue(Box::new(bad.clone())));
    queue.do_send(ToMergeQueue::Enqueue(Box::new(good.clone())));
    let seen = verdicts(&mut inbox, 2).await;
    assert!(
        seen.iter().any(|m| matches!(
            m,
            FromMerging::Failed { task: t, failure: LandingFailure::GateFailed { .. }, .. }
                if *t == task("t1")
        )),
        "{seen:?}"
    );
    let repo = f.repo();
    assert!(
        repo.find_branch(&bad.branch, git2::BranchType::Local)
            .is_ok(),
        "the failed attempt's branch stays for the retry"
    );
    assert!(
        repo.find_branch(&good.branch, git2::BranchType::Local)
            .is_err(),
        "a landed branch goes as always"
    );
}

#[actix::test]
async fn a_conflict_on_a_moved_main_is_retried_once_then_reported_with_its_files() {
    let f = Fixture::new();
    let one = f.branch("t1", &[("shared.txt", "one\n")]);
    let two = f.branch("t2", &[("shared.txt", "two\n")]);
    let (queue, mut inbox) = f.queue(&[]);
    queue.do_send(ToMergeQueue::Enqueue(Box::new(one)));
    queue.do_send(ToMergeQueue::Enqueue(Box::new(two)));
    let seen = verdicts(&mut inbox, 2).await;
    let retried = seen
        .iter()
        .filter(|m| {
            matches!(
                m,
                FromMerging::Note(note) if matches!(**note, EventKind::MergeConflict { retrying: true, .. })
            )
        })
        .count();
    assert_eq!(retried, 1, "{seen:?}");
    let conflict = seen.iter().find_map(|m| match m {
        FromMerging::Conflict {
            task,
            files,
            clashing,
            ..
        } => Some((task.clone(), files.clone(), clashing.clone())),
        _ => None,
    });
    let (t, files, clashing) = conflict.expect("reported to the graph");
    assert_eq!(t, task("t2"));
    assert_eq!(files, vec!["shared.txt".to_string()]);
    assert_eq!(clashing.len(), 1, "t1's landed commit: {clashing:?}");
    assert_eq!(
        file_at(&f.repo(), f.main_tip(), "shared.txt").as_deref(),
        Some("one\n")
    );
}

/// Two branches adding one file, built in one batch: the second clashes with the first,
/// which is not on main yet. The first lands on its own, and the conflict is reported
/// against main with the first on it, so that its fix has both sides to keep. Reported
/// from inside the batch, the fix started from a main without the first side, found
/// nothing to resolve, and a second fix was made for the same conflict (the soak's).
#[actix::test]
async fn a_conflict_with_a_batch_mate_is_reported_only_once_the_batch_mate_is_on_main() {
    let f = Fixture::new();
    let three = f.branch("t3", &[("three.txt", "three\n")]);
    let one = f.branch("t1", &[("shared.txt", "one\n")]);
    let two = f.branch("t2", &[("shared.txt", "two\n")]);
    let (queue, mut inbox) = f.queue(&[]);
    // t3 keeps the queue busy while t1 and t2 wait: they are built in one batch.
    for r in [three, one, two] {
        queue.do_send(ToMergeQueue::Enqueue(Box::new(r)));
    }
    let seen = verdicts(&mut inbox, 3).await;
    let landed_at = |t: &str| {
        seen.iter().position(|m| {
            matches!(m, FromMerging::MainMoved { landed, .. } if landed.iter().any(|l| l.0 == task(t)))
        })
    };
    let conflict_at = seen
        .iter()
        .position(|m| matches!(m, FromMerging::Conflict { task: t, .. } if *t == task("t2")));
    let (Some(one_landed), Some(conflict)) = (landed_at("t1"), conflict_at) else {
        panic!("t1 lands and t2 conflicts: {seen:?}");
    };
    assert!(
        one_landed < conflict,
        "t2's conflict is reported once t1 is on main: {seen:?}"
    );
}

#[actix::test]
async fn after_a_restart_work_already_on_main_is_reported_not_landed_twice() {
    let f = Fixture::new();
    let request = f.branch("t1", &[("a.txt", "a\n")]);
    let (queue, mut inbox) = f.queue(&[]);
    queue.do_send(ToMergeQueue::Enqueue(Box::new(request.clone())));
    verdicts(&mut inbox, 1).await;
    let tip = f.main_tip();
    // Written ahead of the move: the commit that holds t1's work.
    assert_eq!(f.intended("t1"), vec![tip.to_string()]);
    // A crash before `TaskLanded` was journaled: the restarted run enqueues it again, with
    // the journaled intent; its branch is gone already.
    let (queue, mut inbox) = f.queue(&[]);
    let again = LandRequest {
        recovered: true,
        intended: f.intended("t1"),
        ..request
    };
    queue.do_send(ToMergeQueue::Enqueue(Box::new(again)));
    let seen = verdicts(&mut inbox, 1).await;
    assert!(
        matches!(&seen[0], FromMerging::FoundOnMain { task: t, commit, .. } if *t == task("t1") && *commit == tip.to_string()),
        "{seen:?}"
    );
    assert_eq!(f.main_tip(), tip, "main did not move twice");
}

/// A kill after a landing's compare-and-swap, before its branch was deleted: the restart
/// finds the work on main, and the branch is gone by the time the graph hears. Deleted
/// after the graph heard, a second kill in between left it for good (the graph no longer
/// has the task `Landing`, so nothing enqueues it again): the soak's leftover branch.
#[actix::test]
async fn work_found_on_main_after_a_restart_has_its_branch_deleted_before_the_graph_hears() {
    let f = Fixture::new();
    let request = f.branch("t1", &[("a.txt", "a\n")]);
    let (queue, mut inbox) = f.queue(&[]);
    queue.do_send(ToMergeQueue::Enqueue(Box::new(request.clone())));
    verdicts(&mut inbox, 1).await;
    // The branch as the crash left it (the landing deleted it; put back where it was).
    let repo = f.repo();
    repo.branch(&request.branch, &repo.find_commit(f.base).unwrap(), true)
        .unwrap();
    let (queue, mut inbox) = f.queue(&[]);
    let again = LandRequest {
        recovered: true,
        intended: f.intended("t1"),
        ..request.clone()
    };
    queue.do_send(ToMergeQueue::Enqueue(Box::new(again)));
    let seen = verdicts(&mut inbox, 1).await;
    assert!(
        matches!(&seen[0], FromMerging::FoundOnMain { task: t, .. } if *t == task("t1")),
        "{seen:?}"
    );
    assert!(
        repo.find_branch(&request.branch, git2::BranchType::Local)
            .is_err(),
        "{} is deleted before the graph hears that the work landed",
        request.branch
    );
}

/// Commits `message` on main (with a file, so it is not empty), as someone other than
/// flotilla would.
fn commit_on_main(f: &Fixture, path: &str, message: &str) -> git2::Oid {
    let repo = f.repo();
    let tip = repo.find_commit(f.main_tip()).unwrap();
    let mut index = git2::Index::new().unwrap();
    index.read_tree(&tip.tree().unwrap()).unwrap();
    let blob = repo.blob(b"x\n").unwrap();
    index.add(&index_entry(path, blob, 2)).unwrap();
    let tree = repo.find_tree(index.write_tree_to(&repo).unwrap()).unwrap();
    let sig = git2::Signature::now("someone", "someone@example.com").unwrap();
    let id = repo
        .commit(None, &sig, &sig, message, &tree, &[&tip])
        .unwrap();
    repo.reference("refs/heads/main", id, true, "someone")
        .unwrap();
    id
}

#[actix::test]
async fn a_forged_trailer_on_main_is_not_taken_for_landed_work_after_a_restart() {
    let f = Fixture::new();
    let request = f.branch("t2", &[("b.txt", "b\n")]);
    // Someone (an agent with write access, say) put t2's trailer on main, without its work.
    let forged = commit_on_main(
        &f,
        "noise.txt",
        &format!("noise\n\nFlotilla-Task: {}/t2\n", f.run),
    );
    // The restarted run enqueues t2 again; the journal never named a commit for it.
    let (queue, mut inbox) = f.queue(&[]);
    let again = LandRequest {
        recovered: true,
        ..request
    };
    queue.do_send(ToMergeQueue::Enqueue(Box::new(again)));
    let seen = verdicts(&mut inbox, 1).await;
    let FromMerging::MainMoved { landed, .. } = &seen[0] else {
        panic!("t2 is landed, not found on main: {seen:?}");
    };
    assert_eq!(landed.len(), 1);
    assert_eq!(landed[0].0, task("t2"));
    assert_ne!(landed[0].2, forged.to_string());
    let tip = f.main_tip();
    assert_eq!(
        file_at(&f.repo(), tip, "b.txt").as_deref(),
        Some("b\n"),
        "t2's work is on main"
    );
}

#[actix::test]
async fn trailers_an_agent_wrote_for_other_tasks_never_reach_main() {
    let f = Fixture::new();
    let repo = f.repo();
    let mut request = f.branch("t1", &[("a.txt", "a\n")]);
    // The agent's own commit on its branch forges trailers for t2 and t3.
    let head = repo.find_commit(request.head.parse().unwrap()).unwrap();
    let sig = git2::Signature::now("agent", "agent@example.com").unwrap();
    let message = format!(
        "t1: work\n\nFlotilla-Task: {run}/t2\nflotilla-task: {run}/t3\n",
        run = f.run
    );
    let parent = head.parent(0).unwrap();
    let forged = repo
        .commit(
            None,
            &sig,
            &sig,
            &message,
            &head.tree().unwrap(),
            &[&parent],
        )
        .unwrap();
    repo.reference(
        &format!("refs/heads/{}", request.branch),
        forged,
        true,
        "agent",
    )
    .unwrap();
    request.head = forged.to_string();
    let (queue, mut inbox) = f.queue(&[]);
    queue.do_send(ToMergeQueue::Enqueue(Box::new(request)));
    verdicts(&mut inbox, 1).await;
    let history = f.history();
    assert_eq!(history.len(), 1);
    let landed = repo.find_commit(history[0]).unwrap();
    let lines: Vec<String> = landed
        .message()
        .unwrap()
        .lines()
        .filter(|l| l.to_ascii_lowercase().contains("flotilla-task"))
        .map(str::to_string)
        .collect();
    assert_eq!(lines, vec![format!("Flotilla-Task: {}/t1", f.run)]);
}

#[actix::test]
async fn a_batch_mates_missing_branch_fails_that_entry_alone() {
    let f = Fixture::new();
    let one = f.branch("t1", &[("a.txt", "a\n")]);
    let two = f.branch("t2", &[("b.txt", "b\n")]);
    let three = f.branch("t3", &[("c.txt", "c\n")]);
    // t2's branch went (a conflict fix that landed deleted it, say).
    f.repo()
        .find_branch(&two.branch, git2::BranchType::Local)
        .unwrap()
        .delete()
        .unwrap();
    let (queue, mut inbox) = f.queue(&[]);
    for r in [one, two, three] {
        queue.do_send(ToMergeQueue::Enqueue(Box::new(r)));
    }
    let seen = verdicts(&mut inbox, 3).await;
    let failed: Vec<(TaskId, String)> = seen
        .iter()
        .filter_map(|m| match m {
            FromMerging::Failed {
                task,
                failure: LandingFailure::Git { detail },
                ..
            } => Some((task.clone(), detail.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 1, "{seen:?}");
    assert_eq!(failed[0].0, task("t2"));
    assert!(failed[0].1.contains("does not exist"), "{}", failed[0].1);
    let mut landed: Vec<TaskId> = seen
        .iter()
        .flat_map(|m| match m {
            FromMerging::MainMoved { landed, .. } => {
                landed.iter().map(|(t, _, _)| t.clone()).collect()
            }
            _ => Vec::new(),
        })
        .collect();
    landed.sort();
    assert_eq!(landed, vec![task("t1"), task("t3")]);
}

/// main's ref as another writer contends for it: the first `busy` compare-and-swaps find
/// it locked; then the real one.
struct Contended {
    real: GitRepo,
    busy: Mutex<u32>,
}

impl MainRef for Contended {
    fn compare_and_swap(
        &self,
        expected: String,
        new: String,
    ) -> BoxFuture<'static, Result<(), MainRefError>> {
        let mut busy = self.busy.lock().unwrap();
        if *busy > 0 {
            *busy -= 1;
            return Box::pin(async {
                Err(MainRefError::Busy {
                    detail: "failed to lock file 'refs/heads/main.lock'".into(),
                })
            });
        }
        self.real.compare_and_swap(expected, new)
    }
}

#[actix::test]
async fn a_locked_main_is_waited_for_and_the_batch_lands_uncharged() {
    let f = Fixture::new();
    let one = f.branch("t1", &[("a.txt", "a\n")]);
    let two = f.branch("t2", &[("b.txt", "b\n")]);
    let main = Arc::new(Contended {
        real: GitRepo::new(f.repo_path.clone(), main_branch()),
        busy: Mutex::new(3),
    });
    let (queue, mut inbox) = f.queue_with_main(&[], main.clone());
    queue.do_send(ToMergeQueue::Enqueue(Box::new(one)));
    queue.do_send(ToMergeQueue::Enqueue(Box::new(two)));
    let seen = verdicts(&mut inbox, 2).await;
    assert!(
        seen.iter()
            .all(|m| matches!(m, FromMerging::MainMoved { .. })),
        "contention is nobody's failure: {seen:?}"
    );
    assert_eq!(*main.busy.lock().unwrap(), 0, "it was locked three times");
    assert_eq!(f.history().len(), 2);
}

#[actix::test]
async fn a_users_commit_on_main_is_kept_and_a_reset_of_main_pauses_landing_without_replaying() {
    let f = Fixture::new();
    let (queue, mut inbox) = f.queue(&[]);
    queue.do_send(ToMergeQueue::Enqueue(Box::new(
        f.branch("t1", &[("a.txt", "a\n")]),
    )));
    verdicts(&mut inbox, 1).await;
    let landed_t1 = f.main_tip();
    // The user commits on main: kept, and t2 lands on top of it.
    let users = commit_on_main(&f, "mine.txt", "my own change\n");
    queue.do_send(ToMergeQueue::Enqueue(Box::new(
        f.branch("t2", &[("b.txt", "b\n")]),
    )));
    let seen = verdicts(&mut inbox, 1).await;
    assert!(
        matches!(&seen[0], FromMerging::MainMoved { from, .. } if *from == users.to_string()),
        "{seen:?}"
    );
    let history = f.history();
    assert_eq!(history.len(), 3);
    assert_eq!(history[1], users, "the user's commit stays, under t2's");
    let landed_t2 = f.main_tip();

    // Now someone resets main to before t1 (t1, the user's commit and t2 dropped).
    f.repo()
        .reference("refs/heads/main", f.base, true, "reset")
        .unwrap();
    queue.do_send(ToMergeQueue::Enqueue(Box::new(
        f.branch("t3", &[("c.txt", "c\n")]),
    )));
    let note = inbox.expect().await;
    let FromMerging::Note(note) = note else {
        panic!("a pause, said: {note:?}");
    };
    assert_eq!(
        *note,
        EventKind::MainDiverged {
            expected: landed_t2.to_string(),
            actual: f.base.to_string(),
        }
    );
    inbox.expect_none().await;
    assert_eq!(f.main_tip(), f.base, "nothing replayed, nothing landed");
    assert_ne!(landed_t1, landed_t2);

    // The user puts main back: the next branch lands t3 (and t4) on top.
    f.repo()
        .reference("refs/heads/main", landed_t2, true, "restore")
        .unwrap();
    queue.do_send(ToMergeQueue::Enqueue(Box::new(
        f.branch("t4", &[("d.txt", "d\n")]),
    )));
    let seen = verdicts(&mut inbox, 2).await;
    let mut landed: Vec<TaskId> = seen
        .iter()
        .flat_map(|m| match m {
            FromMerging::MainMoved { landed, .. } => {
                landed.iter().map(|(t, _, _)| t.clone()).collect::<Vec<_>>()
            }
            other => panic!("only landings: {other:?}"),
        })
        .collect();
    landed.sort();
    assert_eq!(landed, vec![task("t3"), task("t4")]);
    assert_eq!(f.history().len(), 4 + 1);
}

#[actix::test]
async fn an_adopted_main_is_landed_on_and_what_it_dropped_is_named_never_replayed() {
    let f = Fixture::new();
    let (queue, mut inbox) = f.queue(&[]);
    queue.do_send(ToMergeQueue::Enqueue(Box::new(
        f.branch("t1", &[("a.txt", "a\n")]),
    )));
    let landed_t1 = match verdicts(&mut inbox, 1).await.remove(0) {
        FromMerging::MainMoved { landed, .. } => landed[0].2.clone(),
        other => panic!("{other:?}"),
    };
    queue.do_send(ToMergeQueue::Enqueue(Box::new(
        f.branch("t2", &[("b.txt", "b\n")]),
    )));
    let landed_t2 = match verdicts(&mut inbox, 1).await.remove(0) {
        FromMerging::MainMoved { landed, .. } => landed[0].2.clone(),
        other => panic!("{other:?}"),
    };
    let dropped_commit = landed_t2.clone();
    let expected = f.main_tip();
    // t5 started from main as it was then: its branch holds t2's landed work.
    let stale = f.branch_from("t5", landed_t2.parse().unwrap(), &[("e.txt", "e\n")]);

    // The user resets main to t1's landing and commits on it: t2's work is dropped.
    f.repo()
        .reference("refs/heads/main", landed_t1.parse().unwrap(), true, "reset")
        .unwrap();
    let users = commit_on_main(&f, "mine.txt", "the user's own\n");
    queue.do_send(ToMergeQueue::Enqueue(Box::new(
        f.branch("t3", &[("c.txt", "c\n")]),
    )));
    match inbox.expect().await {
        FromMerging::Note(note) => {
            assert!(matches!(*note, EventKind::MainDiverged { .. }), "{note:?}")
        }
        other => panic!("a pause: {other:?}"),
    }

    // The user adopts main as it is: the queue names what main no longer holds.
    queue.do_send(ToMergeQueue::AdoptMain {
        expected: expected.to_string(),
        landed: vec![(task("t1"), landed_t1), (task("t2"), landed_t2)],
    });
    let (adopted_expected, tip) = match inbox.expect().await {
        FromMerging::MainAdopted {
            expected,
            tip,
            dropped,
        } => {
            assert_eq!(dropped, vec![task("t2")], "t1 is still on main, t2 is not");
            (expected, tip)
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(tip, users.to_string());
    inbox.expect_none().await;
    assert_eq!(
        f.main_tip(),
        users,
        "nothing lands before the adoption is journaled"
    );

    // Journaled (the graph's `Adopted`): t3 lands on top of the user's main, and t2's work
    // is not replayed.
    queue.do_send(ToMergeQueue::Adopted {
        expected: adopted_expected,
        tip: tip.clone(),
        dropped: vec![dropped_commit.clone()],
    });
    let seen = verdicts(&mut inbox, 1).await;
    assert!(
        matches!(&seen[0], FromMerging::MainMoved { from, landed, .. }
            if *from == tip && landed[0].0 == task("t3")),
        "{seen:?}"
    );
    // A branch started before the reset would bring t2's work back: it does not land, and
    // its task is tried again from main as it is.
    queue.do_send(ToMergeQueue::Enqueue(Box::new(stale)));
    match inbox.expect().await {
        FromMerging::Failed {
            task: t,
            failure: LandingFailure::StaleBase { detail },
            ..
        } => {
            assert_eq!(t, task("t5"));
            assert!(detail.contains("the adopted main dropped"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    let repo = f.repo();
    let main = f.main_tip();
    assert_eq!(file_at(&repo, main, "e.txt"), None);
    assert_eq!(file_at(&repo, main, "c.txt").as_deref(), Some("c\n"));
    assert_eq!(
        file_at(&repo, main, "mine.txt").as_deref(),
        Some("x\n"),
        "the user's commit stays"
    );
    assert_eq!(file_at(&repo, main, "b.txt"), None, "t2 is not replayed");
}

/// git whose scratch checkouts the storage refuses `refusals` times first (a full disk, a
/// read-only state directory); everything else is the real thing.
struct FullScratch {
    real: GitMerge,
    refusals: Mutex<u32>,
}

impl MergeGit for FullScratch {
    fn build(
        &self,
        onto: String,
        items: Vec<LandItem>,
        mode: LandMode,
    ) -> BoxFuture<'static, Result<BuildOutcome, RepoError>> {
        self.real.build(onto, items, mode)
    }
    fn find_on_main(
        &self,
        tip: String,
        candidates: Vec<Vec<String>>,
    ) -> BoxFuture<'static, Result<Vec<Option<String>>, RepoError>> {
        self.real.find_on_main(tip, candidates)
    }
    fn contains(
        &self,
        tip: String,
        ancestor: String,
    ) -> BoxFuture<'static, Result<bool, RepoError>> {
        self.real.contains(tip, ancestor)
    }
    fn scratch(
        &self,
        commit: String,
        label: String,
    ) -> BoxFuture<'static, Result<ScratchTree, RepoError>> {
        let mut refusals = self.refusals.lock().unwrap();
        if *refusals > 0 {
            *refusals -= 1;
            return Box::pin(async {
                Err(RepoError::Storage(
                    "cannot create /state/worktrees/r/scratch/gate: No space left on device".into(),
                ))
            });
        }
        self.real.scratch(commit, label)
    }
    fn remove_scratch(&self, tree: ScratchTree) -> BoxFuture<'static, Result<(), RepoError>> {
        self.real.remove_scratch(tree)
    }
    fn conflict_markers(
        &self,
        commit: String,
        paths: Option<Vec<String>>,
    ) -> BoxFuture<'static, Result<Vec<MarkerHit>, RepoError>> {
        self.real.conflict_markers(commit, paths)
    }
    fn delete_branch(&self, branch: String) -> BoxFuture<'static, Result<(), RepoError>> {
        self.real.delete_branch(branch)
    }
    fn sync_checkout(
        &self,
        old: String,
        new: String,
    ) -> BoxFuture<'static, Result<CheckoutSync, RepoError>> {
        self.real.sync_checkout(old, new)
    }
}

#[actix::test]
async fn a_gate_whose_scratch_checkout_the_storage_refuses_fails_nobody_and_lands_once_it_clears() {
    let f = Fixture::new();
    let git = Arc::new(FullScratch {
        real: f.git(),
        refusals: Mutex::new(2),
    });
    let (notices, mut heard) = probe::<Published>("supervisor");
    let (queue, mut inbox) = f.queue_with(
        &["true"],
        Arc::new(GitRepo::new(f.repo_path.clone(), main_branch())),
        git.clone(),
        Some(notices),
    );
    queue.do_send(ToMergeQueue::Enqueue(Box::new(
        f.branch("t1", &[("a.txt", "a\n")]),
    )));
    queue.do_send(ToMergeQueue::Enqueue(Box::new(
        f.branch("t2", &[("b.txt", "b\n")]),
    )));
    // Each refusal is said (the supervisor pauses the run on it); nobody is judged.
    for _ in 0..2 {
        match heard.expect().await.0.kind {
            EventKind::StorageUnavailable { error, .. } => {
                assert!(error.contains("No space left on device"), "{error}");
            }
            other => panic!("{other:?}"),
        }
    }
    let seen = verdicts(&mut inbox, 2).await;
    assert!(
        seen.iter()
            .all(|m| matches!(m, FromMerging::MainMoved { .. })),
        "storage is nobody's failure: {seen:?}"
    );
    assert_eq!(*git.refusals.lock().unwrap(), 0);
    assert_eq!(f.history().len(), 2);
}

/// ADR-032: while a landing is in flight, branches arrive in an order that is not their
/// urgency; the queue lands fix tasks first, then by priority, then by critical path (what
/// a longer chain of dependents waits for first), then by age, a retry counted younger,
/// exactly as Dispatch orders ready tasks, and a withdrawn branch never lands.
#[actix::test]
async fn landings_go_fix_first_then_by_priority_then_by_critical_path_as_dispatch_orders() {
    let f = Fixture::new();
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let (release, release_rx) = tokio::sync::oneshot::channel();
    let git = Arc::new(NumberedBuilds::new(f.git()).holding(1, (started_tx, release_rx)));
    let config = MergeConfig {
        gate: vec!["test -f README.md".into()],
        batch_max: Some(1),
        ..MergeConfig::default()
    };
    let main = Arc::new(GitRepo::new(f.repo_path.clone(), main_branch()));
    let (queue, mut inbox) = f.queue_configured(config, main, git, None);
    // (id, priority, critical path, created, retries, a sweep fix)
    let arrivals: [(&str, u8, u32, u64, u32, bool); 7] = [
        ("t1", 5, 1, 1, 0, false),
        ("t2", 2, 1, 2, 0, false),
        ("t3", 5, 4, 3, 0, false),
        ("t4", 2, 3, 4, 0, false),
        ("t6", 5, 1, 0, 1, false),
        ("f1", 9, 1, 5, 0, true),
        ("t7", 1, 9, 6, 0, false),
    ];
    let request = |id: &str, priority: u8, critical_path: u32, created: u64, retries, fix| {
        let mut r = f.branch(id, &[(&format!("src/{id}.txt"), &format!("{id}\n"))]);
        r.urgency = Urgency {
            priority: Priority::new(priority).unwrap(),
            critical_path,
            created,
        };
        r.retries = retries;
        if fix {
            r.fix = Some(FixOf::Sweep {
                signature: "build: E0412".into(),
                class: "build".into(),
            });
        }
        r
    };
    queue.do_send(ToMergeQueue::Enqueue(Box::new(request(
        "t9", 10, 1, 0, 0, false,
    ))));
    // t9's landing is in flight: everything else waits in the queue.
    started.await.unwrap();
    for (id, priority, critical_path, created, retries, fix) in arrivals {
        queue
            .send(ToMergeQueue::Enqueue(Box::new(request(
                id,
                priority,
                critical_path,
                created,
                retries,
                fix,
            ))))
            .await
            .unwrap();
    }
    queue
        .send(ToMergeQueue::Withdraw { task: task("t7") })
        .await
        .unwrap();
    release.send(()).unwrap();
    let landed: Vec<String> = verdicts(&mut inbox, 7)
        .await
        .iter()
        .flat_map(|m| match m {
            FromMerging::MainMoved { landed, .. } => landed
                .iter()
                .map(|(t, _, _)| t.to_string())
                .collect::<Vec<_>>(),
            other => panic!("nothing but landings expected, got {other:?}"),
        })
        .collect();
    assert_eq!(
        landed,
        ["t9", "f1", "t4", "t2", "t3", "t1", "t6"],
        "the fix first; then priority 2 by critical path; then priority 5 by critical \
         path, then age (t6's retry counts it as made after t1)"
    );
    // Dispatch would hand the same tasks out in the same order: one ordering, shared.
    let mut by_dispatch: Vec<(WorkOrder, &str)> = arrivals
        .iter()
        .filter(|a| !a.5 && a.0 != "t7")
        .map(|&(id, priority, critical_path, created, retries, _)| {
            let urgency = Urgency {
                priority: Priority::new(priority).unwrap(),
                critical_path,
                created: created + 4 * u64::from(retries),
            };
            (urgency.order(&task(id)), id)
        })
        .collect();
    by_dispatch.sort();
    let by_dispatch: Vec<&str> = by_dispatch.into_iter().map(|(_, id)| id).collect();
    assert_eq!(by_dispatch, landed[2..]);
    assert_eq!(
        f.history().len(),
        7,
        "one commit a landing; t7 never landed"
    );
    assert_eq!(file_at(&f.repo(), f.main_tip(), "src/t7.txt"), None);
}

/// ADR-041 (amended): with `batch_max` left out, a queue without a gate takes every branch
/// waiting into one landing (each main move's fixed cost is shared); with a gate it takes
/// four (a failing batch is bisected); a `batch_max` given is kept either way.
#[actix::test]
async fn without_a_gate_a_batch_takes_every_branch_waiting_unless_batch_max_says_otherwise() {
    // (case, gate, batch_max, the batches' sizes)
    type Case = (&'static str, Vec<String>, Option<usize>, Vec<usize>);
    let cases: [Case; 3] = [
        ("no gate, batch_max left out", Vec::new(), None, vec![1, 6]),
        (
            "a gate, batch_max left out",
            vec!["test -f README.md".into()],
            None,
            vec![1, 4, 2],
        ),
        (
            "no gate, batch_max = 2",
            Vec::new(),
            Some(2),
            vec![1, 2, 2, 2],
        ),
    ];
    for (case, gate, batch_max, expected) in cases {
        let f = Fixture::new();
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let (release, release_rx) = tokio::sync::oneshot::channel();
        let git = Arc::new(NumberedBuilds::new(f.git()).holding(1, (started_tx, release_rx)));
        let config = MergeConfig {
            gate,
            batch_max,
            ..MergeConfig::default()
        };
        config.validate().unwrap();
        let main = Arc::new(GitRepo::new(f.repo_path.clone(), main_branch()));
        let (queue, mut inbox) = f.queue_configured(config, main, git, None);
        let request = |id: &str| f.branch(id, &[(&format!("src/{id}.txt"), &format!("{id}\n"))]);
        queue.do_send(ToMergeQueue::Enqueue(Box::new(request("t7"))));
        // t7's landing is in flight: the six behind it wait together.
        started.await.unwrap();
        for n in 1..=6 {
            queue
                .send(ToMergeQueue::Enqueue(Box::new(request(&format!("t{n}")))))
                .await
                .unwrap();
        }
        release.send(()).unwrap();
        let batches: Vec<Vec<String>> = verdicts(&mut inbox, 7)
            .await
            .iter()
            .filter_map(|m| match m {
                FromMerging::MainMoved { landed, .. } => {
                    Some(landed.iter().map(|(t, _, _)| t.to_string()).collect())
                }
                FromMerging::Note(_) => None,
                other => panic!("{case}: nothing but landings expected, got {other:?}"),
            })
            .collect();
        let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
        assert_eq!(sizes, expected, "{case}: {batches:?}");
        let order: Vec<String> = batches.concat();
        let arrived: Vec<String> = [7, 1, 2, 3, 4, 5, 6]
            .iter()
            .map(|n| format!("t{n}"))
            .collect();
        assert_eq!(order, arrived, "{case}: in their order");
        assert_eq!(f.history().len(), 7, "{case}: one commit a landing");
    }
}

/// ADR-041 ("the queue pipelined"): while one batch's compare-and-swap runs, the next is
/// built on the candidate main is moving to; it lands after, in order, each intent
/// journaled before its move and naming the tip the one before left. When that
/// compare-and-swap fails (someone else moved main meanwhile), the batch built ahead is
/// discarded and built again on what main then is: never landed on a stale base.
#[actix::test]
async fn the_next_batch_is_built_while_main_moves_and_lands_after_it_never_on_a_stale_base() {
    for cas_fails in [false, true] {
        let case = if cas_fails {
            "the swap fails"
        } else {
            "the swap succeeds"
        };
        let f = Fixture::new();
        let (build_started_tx, build_started) = tokio::sync::oneshot::channel();
        let (build_release, build_release_rx) = tokio::sync::oneshot::channel();
        let (second_tx, second) = tokio::sync::oneshot::channel();
        // The second build is only said, not held.
        let (second_release, second_release_rx) = tokio::sync::oneshot::channel();
        second_release.send(()).unwrap();
        let git = Arc::new(
            NumberedBuilds::new(f.git())
                .holding(1, (build_started_tx, build_release_rx))
                .holding(2, (second_tx, second_release_rx)),
        );
        let (swap_started_tx, swap_started) = tokio::sync::oneshot::channel();
        let (swap_release, swap_release_rx) = tokio::sync::oneshot::channel();
        let main = Arc::new(
            NumberedSwaps::new(GitRepo::new(f.repo_path.clone(), main_branch()))
                .holding(1, (swap_started_tx, swap_release_rx)),
        );
        let (queue, mut inbox) =
            f.queue_configured(MergeConfig::default(), main, git.clone(), None);
        let request = |id: &str| f.branch(id, &[(&format!("src/{id}.txt"), &format!("{id}\n"))]);
        queue.do_send(ToMergeQueue::Enqueue(Box::new(request("t1"))));
        // t1 is being built: t2 and t3 arrive behind it.
        build_started.await.unwrap();
        for id in ["t2", "t3"] {
            queue
                .send(ToMergeQueue::Enqueue(Box::new(request(id))))
                .await
                .unwrap();
        }
        build_release.send(()).unwrap();
        // t1's compare-and-swap is held: its intent is journaled, main has not moved, and
        // t2 and t3 are being built on the candidate main is moving to.
        swap_started.await.unwrap();
        second.await.unwrap();
        let first_intent = f.intents.lock().unwrap()[0].clone();
        assert_eq!(first_intent.0, f.base.to_string(), "{case}");
        let c1 = first_intent.1.clone();
        assert_eq!(
            f.main_tip(),
            f.base,
            "{case}: main moves only through the swap"
        );
        assert_eq!(
            git.builds.lock().unwrap()[1],
            (c1.clone(), vec!["t2".to_string(), "t3".to_string()]),
            "{case}: the next batch is built on t1's candidate"
        );
        // t4 arrives while main moves: it joins the batch built ahead, built on top.
        queue
            .send(ToMergeQueue::Enqueue(Box::new(request("t4"))))
            .await
            .unwrap();
        let user_tip = cas_fails.then(|| {
            // Someone else moves main meanwhile: t1's swap fails.
            let repo = f.repo();
            let base = repo.find_commit(f.base).unwrap();
            let sig = git2::Signature::now("user", "user@example.com").unwrap();
            repo.commit(
                Some("refs/heads/main"),
                &sig,
                &sig,
                "the user's own commit",
                &base.tree().unwrap(),
                &[&base],
            )
            .unwrap()
        });
        swap_release.send(()).unwrap();

        let seen = verdicts(&mut inbox, 4).await;
        let moves: Vec<(String, String, Vec<String>)> = seen
            .iter()
            .filter_map(|m| match m {
                FromMerging::MainMoved {
                    from, to, landed, ..
                } => Some((
                    from.clone(),
                    to.clone(),
                    landed.iter().map(|(t, _, _)| t.to_string()).collect(),
                )),
                FromMerging::Note(_) => None,
                other => panic!("{case}: nothing but landings expected, got {other:?}"),
            })
            .collect();
        let batches: Vec<&[String]> = moves.iter().map(|(_, _, l)| l.as_slice()).collect();
        assert_eq!(
            batches,
            [&["t1"][..], &["t2", "t3", "t4"][..]],
            "{case}: in order"
        );
        // Each move starts where the one before ended, and each was journaled first.
        assert_eq!(moves[1].0, moves[0].1, "{case}");
        let intents: Vec<(String, String, Vec<String>)> = f
            .intents
            .lock()
            .unwrap()
            .iter()
            .map(|(from, to, landed)| {
                let tasks = landed.iter().map(|l| l.task.to_string()).collect();
                (from.clone(), to.clone(), tasks)
            })
            .collect();
        let builds = git.builds.lock().unwrap().clone();
        let three: Vec<String> = ["t2", "t3", "t4"].map(String::from).to_vec();
        match user_tip {
            None => {
                assert_eq!(moves[0].1, c1, "{case}");
                assert_eq!(intents.len(), 2, "{case}: {intents:?}");
                assert_eq!(
                    intents[1],
                    (c1.clone(), moves[1].1.clone(), three),
                    "{case}"
                );
                // What was built ahead landed; only t4 was built after, on its candidate.
                assert_eq!(builds.len(), 3, "{case}: {builds:?}");
                assert_eq!(builds[2].1, ["t4"], "{case}");
                assert_ne!(builds[2].0, c1, "{case}");
                assert_eq!(f.history().len(), 4, "{case}");
            }
            Some(user) => {
                // t1 built again on the user's commit and landed there; the batch built
                // on the candidate that never became main was discarded and built again.
                let c1_again = moves[0].1.clone();
                assert_ne!(c1_again, c1, "{case}");
                assert_eq!(moves[0].0, user.to_string(), "{case}");
                assert_eq!(intents.len(), 3, "{case}: {intents:?}");
                assert_eq!(intents[1].0, user.to_string(), "{case}");
                assert_eq!(
                    intents[2],
                    (c1_again.clone(), moves[1].1.clone(), three.clone()),
                    "{case}"
                );
                assert_eq!(builds.len(), 4, "{case}: {builds:?}");
                assert_eq!(builds[3], (c1_again, three), "{case}");
                let history = f.history();
                assert_eq!(history.len(), 5, "{case}");
                assert!(
                    !history.contains(&git2::Oid::from_str(&c1).unwrap()),
                    "{case}"
                );
            }
        }
        assert_eq!(f.main_tip().to_string(), moves[1].1, "{case}");
    }
}

type Hold = (
    tokio::sync::oneshot::Sender<()>,
    tokio::sync::oneshot::Receiver<()>,
);

/// A hold on the `n`th call (1-based): says when the call started, waits to be let go.
fn hold() -> (
    Hold,
    tokio::sync::oneshot::Receiver<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let (release, release_rx) = tokio::sync::oneshot::channel();
    ((started_tx, release_rx), started, release)
}

/// git whose builds are numbered (1-based): a build with a hold waits to be let go, and a
/// build with a `done` says when the real build returned; everything else is the real thing.
struct NumberedBuilds {
    real: Arc<GitMerge>,
    /// Every build, in order: onto what, which tasks.
    builds: Mutex<Vec<(String, Vec<String>)>>,
    holds: Mutex<std::collections::HashMap<usize, Hold>>,
    done: Mutex<std::collections::HashMap<usize, tokio::sync::oneshot::Sender<()>>>,
}

impl NumberedBuilds {
    fn new(real: GitMerge) -> Self {
        NumberedBuilds {
            real: Arc::new(real),
            builds: Mutex::default(),
            holds: Mutex::default(),
            done: Mutex::default(),
        }
    }

    /// The `n`th build says when it starts, then waits to be let go.
    fn holding(self, n: usize, hold: Hold) -> Self {
        self.holds.lock().unwrap().insert(n, hold);
        self
    }

    /// The `n`th build says when the real build returned.
    fn saying_done(self, n: usize, done: tokio::sync::oneshot::Sender<()>) -> Self {
        self.done.lock().unwrap().insert(n, done);
        self
    }
}

impl MergeGit for NumberedBuilds {
    fn build(
        &self,
        onto: String,
        items: Vec<LandItem>,
        mode: LandMode,
    ) -> BoxFuture<'static, Result<BuildOutcome, RepoError>> {
        let n = {
            let mut builds = self.builds.lock().unwrap();
            let tasks = items.iter().map(|i| i.task.to_string()).collect();
            builds.push((onto.clone(), tasks));
            builds.len()
        };
        let held = self.holds.lock().unwrap().remove(&n);
        let done = self.done.lock().unwrap().remove(&n);
        let real = self.real.clone();
        Box::pin(async move {
            if let Some((started, release)) = held {
                let _ = started.send(());
                let _ = release.await;
            }
            let built = real.build(onto, items, mode).await;
            if let Some(done) = done {
                let _ = done.send(());
            }
            built
        })
    }
    fn find_on_main(
        &self,
        tip: String,
        candidates: Vec<Vec<String>>,
    ) -> BoxFuture<'static, Result<Vec<Option<String>>, RepoError>> {
        self.real.find_on_main(tip, candidates)
    }
    fn contains(
        &self,
        tip: String,
        ancestor: String,
    ) -> BoxFuture<'static, Result<bool, RepoError>> {
        self.real.contains(tip, ancestor)
    }
    fn scratch(
        &self,
        commit: String,
        label: String,
    ) -> BoxFuture<'static, Result<ScratchTree, RepoError>> {
        self.real.scratch(commit, label)
    }
    fn remove_scratch(&self, tree: ScratchTree) -> BoxFuture<'static, Result<(), RepoError>> {
        self.real.remove_scratch(tree)
    }
    fn conflict_markers(
        &self,
        commit: String,
        paths: Option<Vec<String>>,
    ) -> BoxFuture<'static, Result<Vec<MarkerHit>, RepoError>> {
        self.real.conflict_markers(commit, paths)
    }
    fn delete_branch(&self, branch: String) -> BoxFuture<'static, Result<(), RepoError>> {
        self.real.delete_branch(branch)
    }
    fn sync_checkout(
        &self,
        old: String,
        new: String,
    ) -> BoxFuture<'static, Result<CheckoutSync, RepoError>> {
        self.real.sync_checkout(old, new)
    }
}

/// main's ref whose compare-and-swaps are numbered (1-based); one with a hold waits to be
/// let go; then the real one.
struct NumberedSwaps {
    real: Arc<GitRepo>,
    count: Mutex<usize>,
    holds: Mutex<std::collections::HashMap<usize, Hold>>,
}

impl NumberedSwaps {
    fn new(real: GitRepo) -> Self {
        NumberedSwaps {
            real: Arc::new(real),
            count: Mutex::new(0),
            holds: Mutex::default(),
        }
    }

    /// The `n`th compare-and-swap says when it starts, then waits to be let go.
    fn holding(self, n: usize, hold: Hold) -> Self {
        self.holds.lock().unwrap().insert(n, hold);
        self
    }
}

impl MainRef for NumberedSwaps {
    fn compare_and_swap(
        &self,
        expected: String,
        new: String,
    ) -> BoxFuture<'static, Result<(), MainRefError>> {
        let n = {
            let mut count = self.count.lock().unwrap();
            *count += 1;
            *count
        };
        let held = self.holds.lock().unwrap().remove(&n);
        let real = self.real.clone();
        Box::pin(async move {
            if let Some((started, release)) = held {
                let _ = started.send(());
                let _ = release.await;
            }
            real.compare_and_swap(expected, new).await
        })
    }
}

/// A review's scenario: a batch built ahead is dropped (its task withdrawn) while its build
/// runs; the cycle in flight finds main moved by the user, builds again and starts a second
/// batch ahead on its new candidate; the first build answers late. Its answer must never be
/// taken for the second batch's (it once was: both were numbered by the cycle), which landed
/// the withdrawn task on a candidate from before the user's commit, moving main off it.
#[actix::test]
async fn a_late_answer_of_a_dropped_batch_built_ahead_is_never_taken_for_the_next_one() {
    let f = Fixture::new();
    let (build1, build1_started, build1_release) = hold();
    let (build2, build2_started, build2_release) = hold();
    let (done2_tx, done2) = tokio::sync::oneshot::channel();
    let (done4_tx, done4) = tokio::sync::oneshot::channel();
    let git = Arc::new(
        NumberedBuilds::new(f.git())
            .holding(1, build1)
            .holding(2, build2)
            .saying_done(2, done2_tx)
            .saying_done(4, done4_tx),
    );
    let (swap1, swap1_started, swap1_release) = hold();
    let (swap2, swap2_started, swap2_release) = hold();
    let main = Arc::new(
        NumberedSwaps::new(GitRepo::new(f.repo_path.clone(), main_branch()))
            .holding(1, swap1)
            .holding(2, swap2),
    );
    let (queue, mut inbox) = f.queue_configured(MergeConfig::default(), main, git.clone(), None);
    let request = |id: &str| f.branch(id, &[(&format!("src/{id}.txt"), &format!("{id}\n"))]);

    // t1 is being built; t2 waits behind it, and is built ahead on t1's candidate.
    queue.do_send(ToMergeQueue::Enqueue(Box::new(request("t1"))));
    build1_started.await.unwrap();
    queue
        .send(ToMergeQueue::Enqueue(Box::new(request("t2"))))
        .await
        .unwrap();
    build1_release.send(()).unwrap();
    build2_started.await.unwrap();
    swap1_started.await.unwrap();
    // t2 is withdrawn (its task cancelled) while its build runs; t3 arrives.
    queue
        .send(ToMergeQueue::Withdraw { task: task("t2") })
        .await
        .unwrap();
    queue
        .send(ToMergeQueue::Enqueue(Box::new(request("t3"))))
        .await
        .unwrap();
    // The user commits on main: t1's swap fails, t1 is built again on the user's commit
    // (build 3), and t3 is built ahead on that candidate (build 4), which returns.
    let user_tip = {
        let repo = f.repo();
        let base = repo.find_commit(f.base).unwrap();
        let sig = git2::Signature::now("user", "user@example.com").unwrap();
        let mut index = repo.index().unwrap();
        let blob = repo.blob(b"the user's\n").unwrap();
        index.read_tree(&base.tree().unwrap()).unwrap();
        index
            .add(&git2::IndexEntry {
                ctime: git2::IndexTime::new(0, 0),
                mtime: git2::IndexTime::new(0, 0),
                dev: 0,
                ino: 0,
                mode: 0o100644,
                uid: 0,
                gid: 0,
                file_size: 0,
                id: blob,
                flags: 0,
                flags_extended: 0,
                path: b"USER.md".to_vec(),
            })
            .unwrap();
        let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
        repo.commit(
            Some("refs/heads/main"),
            &sig,
            &sig,
            "the user's own commit",
            &tree,
            &[&base],
        )
        .unwrap()
    };
    swap1_release.send(()).unwrap();
    swap2_started.await.unwrap();
    done4.await.unwrap();
    // Now t2's build answers, late, while t3's batch is the one built ahead.
    build2_release.send(()).unwrap();
    done2.await.unwrap();
    // A round trip: the queue has taken the late answer in before t1's swap goes on.
    queue
        .send(ToMergeQueue::Enqueue(Box::new(request("t4"))))
        .await
        .unwrap();
    swap2_release.send(()).unwrap();

    let seen = verdicts(&mut inbox, 3).await;
    let landed: Vec<Vec<String>> = seen
        .iter()
        .filter_map(|m| match m {
            FromMerging::MainMoved { landed, .. } => {
                Some(landed.iter().map(|(t, _, _)| t.to_string()).collect())
            }
            _ => None,
        })
        .collect();
    assert!(
        !landed.concat().contains(&"t2".to_string()),
        "the withdrawn task never lands: {landed:?}"
    );
    let repo = f.repo();
    let tip = f.main_tip();
    assert!(
        tip == user_tip || repo.graph_descendant_of(tip, user_tip).unwrap(),
        "main keeps the user's commit: {landed:?}"
    );
    for (path, text) in [
        ("USER.md", "the user's\n"),
        ("src/t1.txt", "t1\n"),
        ("src/t3.txt", "t3\n"),
        ("src/t4.txt", "t4\n"),
    ] {
        assert_eq!(
            file_at(&repo, tip, path).as_deref(),
            Some(text),
            "{path}: {landed:?}"
        );
    }
    assert_eq!(file_at(&repo, tip, "src/t2.txt"), None, "{landed:?}");
}
