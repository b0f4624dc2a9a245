//! `GitWorktrees` against temporary git repositories: one worktree per attempt from main's
//! tip, the safety-net commit, what a branch changed (checked against the git CLI when it is
//! installed), release and sweep, and the user's checkout never touched.

use std::path::Path;
use std::process::Command;

use flotilla::git::FLOTILLA_EMAIL;
use flotilla::git::worktrees::{GitWorktrees, MAX_COMMITTED_FILE_BYTES};
use flotilla_actors::ports::{
    BranchFate, SweepKeep, Workspace, WorktreeRequest, WorktreeStart, Worktrees,
};
use flotilla_actors::protocol::{ChangeKind, RunId, TaskId, branch_name};

use flotilla_actors::testing::{PATIENCE, within};

use crate::daemon_env::{commit_files, init_repo, main_branch};
use crate::supervision::assert_checkout_untouched;

struct Fixture {
    repo: tempfile::TempDir,
    state: tempfile::TempDir,
    run: RunId,
    worktrees: GitWorktrees,
}

fn fixture() -> Fixture {
    let repo = tempfile::tempdir().unwrap();
    init_repo(repo.path());
    let git = git2::Repository::open(repo.path()).unwrap();
    commit_files(
        &git,
        &[
            ("src/lib.rs", "pub fn a() {}\npub fn b() {}\n"),
            ("src/old.rs", "one\ntwo\nthree\nfour\nfive\n"),
            ("tests/lib.rs", "#[test]\nfn t() {}\n"),
        ],
        "code",
    );
    let state = tempfile::tempdir().unwrap();
    let run = RunId::generate();
    let worktrees = GitWorktrees::new(
        repo.path(),
        run,
        state.path().join(run.to_string()),
        main_branch(),
    );
    Fixture {
        repo,
        state,
        run,
        worktrees,
    }
}

impl Fixture {
    fn request(&self, task: &str, attempt: u32) -> WorktreeRequest {
        let task: TaskId = task.parse().unwrap();
        WorktreeRequest {
            branch: branch_name(self.run, &task, attempt),
            task,
            attempt,
            start: WorktreeStart::Main,
        }
    }

    fn main_tip(&self) -> String {
        git2::Repository::open(self.repo.path())
            .unwrap()
            .refname_to_id("refs/heads/main")
            .unwrap()
            .to_string()
    }

    fn branch_tip(&self, branch: &str) -> Option<String> {
        git2::Repository::open(self.repo.path())
            .unwrap()
            .find_branch(branch, git2::BranchType::Local)
            .ok()
            .map(|b| b.get().target().unwrap().to_string())
    }
}

/// `git diff --numstat base head` as (path, added, removed): the numbers `git diff --stat`
/// shows, per file (git's default rename detection, as flotilla's). git is on every machine
/// that cloned this repository.
fn git_cli_numstat(repo: &Path, base: &str, head: &str) -> Option<Vec<(String, u64, u64)>> {
    let out = Command::new("git")
        .args(["diff", "--numstat", base, head])
        .current_dir(repo)
        .output()
        .expect("the git command line is installed");
    assert!(out.status.success(), "{out:?}");
    let mut rows: Vec<(String, u64, u64)> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let mut parts = line.splitn(3, '\t');
            let added = parts.next().unwrap().parse().unwrap_or(0);
            let removed = parts.next().unwrap().parse().unwrap_or(0);
            (parts.next().unwrap().to_string(), added, removed)
        })
        .collect();
    rows.sort();
    Some(rows)
}

#[tokio::test]
async fn an_attempt_works_on_its_own_branch_from_main_and_the_handoff_is_what_git_says() {
    let f = fixture();
    let main = f.main_tip();
    let request = f.request("t1", 1);
    let ws = f.worktrees.prepare(request.clone()).await.unwrap();
    assert_eq!(ws.base, main);
    assert_eq!(ws.branch, request.branch);
    assert!(ws.path.starts_with(f.state.path()), "{}", ws.path.display());
    assert_eq!(f.branch_tip(&ws.branch), Some(main.clone()));
    assert!(
        ws.path.join("src/lib.rs").exists(),
        "main's files are checked out"
    );

    // The agent's work: a new file, an edit, a deletion, a rename, and an uncommitted mess.
    std::fs::write(ws.path.join("src/new.rs"), "a\nb\nc\n").unwrap();
    std::fs::write(
        ws.path.join("src/lib.rs"),
        "pub fn a() {}\npub fn c() {}\npub fn d() {}\n",
    )
    .unwrap();
    std::fs::remove_file(ws.path.join("tests/lib.rs")).unwrap();
    std::fs::rename(ws.path.join("src/old.rs"), ws.path.join("src/moved.rs")).unwrap();
    let work = f
        .worktrees
        .seal(ws.clone(), "t1: the work".into())
        .await
        .unwrap();

    assert!(work.committed_for_agent);
    assert_eq!(work.base, main);
    assert_eq!(f.branch_tip(&ws.branch), Some(work.head.clone()));
    // The commit says what it is for, in the task's words: it is what lands on main.
    let repo = git2::Repository::open(f.repo.path()).unwrap();
    let made = repo
        .find_commit(git2::Oid::from_str(&work.head).unwrap())
        .unwrap();
    assert_eq!(made.summary().unwrap(), Some("t1: the work"));
    assert!(
        made.message().unwrap().contains(&ws.branch),
        "{:?}",
        made.message()
    );
    let files: Vec<(&str, ChangeKind, u64, u64)> = work
        .files
        .iter()
        .map(|c| (c.path.as_str(), c.change, c.lines_added, c.lines_removed))
        .collect();
    assert_eq!(
        files,
        [
            ("src/lib.rs", ChangeKind::Modified, 2, 1),
            ("src/moved.rs", ChangeKind::Renamed, 0, 0),
            ("src/new.rs", ChangeKind::Added, 3, 0),
            ("tests/lib.rs", ChangeKind::Deleted, 0, 2),
        ]
    );
    assert_eq!(work.files[1].old_path.as_deref(), Some("src/old.rs"));
    assert_eq!((work.lines_added, work.lines_removed), (5, 3));
    if let Some(cli) = git_cli_numstat(f.repo.path(), &work.base, &work.head) {
        let ours: Vec<(String, u64, u64)> = work
            .files
            .iter()
            .map(|c| {
                let path = match &c.old_path {
                    Some(old) => format!("{{{} => {}}}", old, c.path)
                        .replace("{src/old.rs => src/moved.rs}", "src/{old.rs => moved.rs}"),
                    None => c.path.clone(),
                };
                (path, c.lines_added, c.lines_removed)
            })
            .collect();
        let mut ours = ours;
        ours.sort();
        assert_eq!(ours, cli, "the handoff's numbers are git's");
    }

    // The safety-net commit is flotilla's, never a person's.
    let git = git2::Repository::open(f.repo.path()).unwrap();
    let head = git
        .find_commit(git2::Oid::from_str(&work.head).unwrap())
        .unwrap();
    assert_eq!(head.author().email().unwrap(), FLOTILLA_EMAIL);
    assert_eq!(head.parent_id(0).unwrap().to_string(), main);

    // Sealing again with nothing new commits nothing and reads the same.
    let again = f
        .worktrees
        .seal(ws.clone(), "t1: the work".into())
        .await
        .unwrap();
    assert!(!again.committed_for_agent);
    assert_eq!(again.files, work.files);

    // Delivered: the worktree goes, the branch stays; main and the checkout never moved.
    f.worktrees
        .release(ws.clone(), BranchFate::Keep)
        .await
        .unwrap();
    assert!(!ws.path.exists());
    assert_eq!(f.branch_tip(&ws.branch), Some(work.head));
    assert_eq!(f.main_tip(), main);
    assert_checkout_untouched(f.repo.path());
}

/// The handoff's line counts honour the diff attributes git reads (the work tree's
/// `.gitattributes`, `info/attributes`) and read no index: the user's index is not the
/// handoff's business, and reading it whole cost every seal (ADR-046).
#[tokio::test]
async fn the_handoff_honours_binary_and_no_diff_attributes_without_reading_the_users_index() {
    let f = fixture();
    let git = git2::Repository::open(f.repo.path()).unwrap();
    commit_files(
        &git,
        &[(".gitattributes", "*.dat binary\n*.gen -diff\n")],
        "attributes",
    );
    std::fs::create_dir_all(f.repo.path().join(".git/info")).unwrap();
    std::fs::write(f.repo.path().join(".git/info/attributes"), "*.raw binary\n").unwrap();
    let ws = f.worktrees.prepare(f.request("t1", 1)).await.unwrap();
    for name in ["data.dat", "out.gen", "sub/dump.raw", "plain.txt"] {
        let full = ws.path.join(name);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, "one\ntwo\n").unwrap();
    }
    // A user's index libgit2 cannot read: reading it failed the seal.
    let index = f.repo.path().join(".git/index");
    let garbage = b"DIRC not an index at all".to_vec();
    std::fs::write(&index, &garbage).unwrap();
    let work = f.worktrees.seal(ws, "t1: data".into()).await.unwrap();
    let files: Vec<(&str, bool, u64)> = work
        .files
        .iter()
        .map(|c| (c.path.as_str(), c.binary, c.lines_added))
        .collect();
    assert_eq!(
        files,
        [
            ("data.dat", true, 0),
            ("out.gen", true, 0),
            ("plain.txt", false, 2),
            ("sub/dump.raw", true, 0),
        ]
    );
    assert_eq!(
        std::fs::read(&index).unwrap(),
        garbage,
        "the index is the user's"
    );
    if let Some(cli) = git_cli_numstat(f.repo.path(), &work.base, &work.head) {
        let ours: Vec<(String, u64, u64)> = work
            .files
            .iter()
            .map(|c| (c.path.clone(), c.lines_added, c.lines_removed))
            .collect();
        assert_eq!(ours, cli, "the handoff's numbers are git's");
    }
}

/// A fresh workspace's files go through git's conversions wherever the repository asks for
/// any (attributes in the tree or `info/attributes`, `core.autocrlf`); only a repository
/// that asks for none is written without them (ADR-046, "the fresh checkout").
#[tokio::test]
async fn a_fresh_workspace_gets_the_files_converted_where_attributes_or_config_ask() {
    // `.gitattributes` in the tree.
    let f = fixture();
    let git = git2::Repository::open(f.repo.path()).unwrap();
    commit_files(
        &git,
        &[
            (".gitattributes", "*.txt text eol=crlf\n"),
            ("notes.txt", "one\ntwo\n"),
        ],
        "attributes",
    );
    let ws = f.worktrees.prepare(f.request("t1", 1)).await.unwrap();
    assert_eq!(
        std::fs::read(ws.path.join("notes.txt")).unwrap(),
        b"one\r\ntwo\r\n"
    );
    assert_eq!(
        std::fs::read(ws.path.join("src/old.rs")).unwrap(),
        b"one\ntwo\nthree\nfour\nfive\n"
    );

    // `info/attributes`, nothing in the tree.
    let f = fixture();
    std::fs::create_dir_all(f.repo.path().join(".git/info")).unwrap();
    std::fs::write(
        f.repo.path().join(".git/info/attributes"),
        "*.rs text eol=crlf\n",
    )
    .unwrap();
    let ws = f.worktrees.prepare(f.request("t1", 1)).await.unwrap();
    assert_eq!(
        std::fs::read(ws.path.join("src/old.rs")).unwrap(),
        b"one\r\ntwo\r\nthree\r\nfour\r\nfive\r\n"
    );

    // `core.autocrlf`, nothing in the tree.
    let f = fixture();
    let git = git2::Repository::open(f.repo.path()).unwrap();
    git.config()
        .unwrap()
        .set_bool("core.autocrlf", true)
        .unwrap();
    let ws = f.worktrees.prepare(f.request("t1", 1)).await.unwrap();
    assert_eq!(
        std::fs::read(ws.path.join("src/old.rs")).unwrap(),
        b"one\r\ntwo\r\nthree\r\nfour\r\nfive\r\n"
    );

    // None of it: the blobs' bytes.
    let f = fixture();
    let ws = f.worktrees.prepare(f.request("t1", 1)).await.unwrap();
    assert_eq!(
        std::fs::read(ws.path.join("src/old.rs")).unwrap(),
        b"one\ntwo\nthree\nfour\nfive\n"
    );
}

/// flotilla writes an attempt's worktree record itself (not with `git_worktree_add`, which
/// opens every worktree under the repository's lock: ADR-041): git must read it as its own.
/// And, as git would, it refuses a branch some other checkout has, leaving no record.
#[tokio::test]
async fn git_reads_an_attempts_worktree_as_its_own_and_a_branch_checked_out_elsewhere_is_refused() {
    let f = fixture();
    let ws = f.worktrees.prepare(f.request("t1", 1)).await.unwrap();
    let git_cli = |dir: &Path, args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .expect("git runs");
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let listed = git_cli(f.repo.path(), &["worktree", "list", "--porcelain"]);
    let real = std::fs::canonicalize(&ws.path).unwrap();
    assert!(
        listed.contains(&format!(
            "worktree {}\nHEAD {}\nbranch refs/heads/{}\n",
            real.display(),
            f.main_tip(),
            ws.branch
        )),
        "{listed}"
    );
    assert!(!listed.contains("locked"), "unlocked once filled: {listed}");
    assert_eq!(
        git_cli(&ws.path, &["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        ws.branch
    );
    assert_eq!(git_cli(&ws.path, &["status", "--porcelain"]), "");
    assert_eq!(
        git_cli(&ws.path, &["rev-parse", "--git-common-dir"]).trim(),
        std::fs::canonicalize(f.repo.path().join(".git"))
            .unwrap()
            .display()
            .to_string()
    );

    // The next attempt's branch, checked out by hand in a worktree of the user's.
    let request = f.request("t2", 1);
    let git = git2::Repository::open(f.repo.path()).unwrap();
    let main = git.head().unwrap().peel_to_commit().unwrap();
    let branch = git.branch(&request.branch, &main, false).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    git.worktree(
        "users",
        &elsewhere.path().join("users"),
        Some(git2::WorktreeAddOptions::new().reference(Some(branch.get()))),
    )
    .unwrap();
    let e = f.worktrees.prepare(request).await.unwrap_err();
    assert!(e.to_string().contains("already checked out"), "{e}");
    let records: Vec<String> = std::fs::read_dir(f.repo.path().join(".git/worktrees"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        records.len(),
        2,
        "the first attempt's and the user's only: {records:?}"
    );
    assert!(records.contains(&"users".to_string()), "{records:?}");
    let dir = f.state.path().join(f.run.to_string()).join("t2-a1");
    assert!(!dir.exists(), "no directory left: {}", dir.display());
    assert!(
        f.state
            .path()
            .join(f.run.to_string())
            .join("t1-a1")
            .exists(),
        "the first attempt's stays"
    );
}

#[tokio::test]
async fn a_retry_starts_fresh_from_main_and_a_failed_attempt_leaves_nothing() {
    let f = fixture();
    let first = f.worktrees.prepare(f.request("t2", 1)).await.unwrap();
    std::fs::write(first.path.join("src/bad.rs"), "broken\n").unwrap();
    f.worktrees
        .seal(first.clone(), "t1: the work".into())
        .await
        .unwrap();
    f.worktrees
        .release(first.clone(), BranchFate::Delete)
        .await
        .unwrap();
    assert_eq!(
        f.branch_tip(&first.branch),
        None,
        "a failed attempt's branch goes"
    );
    assert!(!first.path.exists());

    let second = f.worktrees.prepare(f.request("t2", 2)).await.unwrap();
    assert_ne!(second.path, first.path);
    assert_ne!(second.branch, first.branch);
    assert!(second.branch.ends_with("/t2-a2"), "{}", second.branch);
    assert!(
        !second.path.join("src/bad.rs").exists(),
        "nothing of the failed attempt"
    );
    assert_eq!(second.base, f.main_tip());
    f.worktrees
        .release(second, BranchFate::Delete)
        .await
        .unwrap();
    assert_checkout_untouched(f.repo.path());
}

#[tokio::test]
async fn a_synthesis_reopens_its_parents_worktree_and_a_lost_one_is_made_again_from_the_branch() {
    let f = fixture();
    let request = f.request("t3", 1);
    let ws = f.worktrees.prepare(request.clone()).await.unwrap();
    std::fs::write(ws.path.join("src/part.rs"), "partial\n").unwrap();
    let partial = f
        .worktrees
        .seal(ws.clone(), "t1: the work".into())
        .await
        .unwrap();

    // Reopened while it is there: the same worktree, the work in it.
    let reopened = f.worktrees.prepare(request.clone()).await.unwrap();
    assert_eq!(reopened, ws);
    assert!(reopened.path.join("src/part.rs").exists());

    // Lost (a crash, a hand): made again on the branch, whose commits hold the work; the
    // base is still where the branch left main.
    std::fs::remove_dir_all(&ws.path).unwrap();
    let remade = f.worktrees.prepare(request).await.unwrap();
    assert!(remade.path.join("src/part.rs").exists());
    assert_eq!(remade.base, partial.base);
    let work = f
        .worktrees
        .seal(remade.clone(), "t1: the work".into())
        .await
        .unwrap();
    assert_eq!(work.files.len(), 1);
    assert_eq!(work.head, partial.head);
    f.worktrees.release(remade, BranchFate::Keep).await.unwrap();
    assert_checkout_untouched(f.repo.path());
}

#[tokio::test]
async fn a_sweep_removes_every_worktree_but_the_kept_and_keeps_delivered_branches() {
    let f = fixture();
    let delivered = f.worktrees.prepare(f.request("t1", 1)).await.unwrap();
    std::fs::write(delivered.path.join("src/a.rs"), "a\n").unwrap();
    f.worktrees
        .seal(delivered.clone(), "t1: the work".into())
        .await
        .unwrap();
    f.worktrees
        .release(delivered.clone(), BranchFate::Keep)
        .await
        .unwrap();
    let interrupted = f.worktrees.prepare(f.request("t2", 1)).await.unwrap();
    let waiting = f.worktrees.prepare(f.request("t3", 1)).await.unwrap();
    // A directory git never registered (a crash mid-way).
    let stray = f.state.path().join(f.run.to_string()).join("t9-a1");
    std::fs::create_dir_all(&stray).unwrap();
    // Released as delivered, but the crash came before its report was journaled.
    let unreported = f.worktrees.prepare(f.request("t4", 1)).await.unwrap();
    f.worktrees
        .release(unreported.clone(), BranchFate::Keep)
        .await
        .unwrap();

    // A restart: the journal says t1 was delivered and t3 waits to synthesize.
    let swept = f
        .worktrees
        .sweep(SweepKeep {
            worktrees: vec![waiting.branch.clone()],
            delivered: Some(vec![delivered.branch.clone()]),
            closing: false,
            ..SweepKeep::default()
        })
        .await
        .unwrap();
    assert!(swept.worktrees.contains(&interrupted.path));
    assert!(swept.worktrees.contains(&stray));
    let mut gone = swept.branches.clone();
    gone.sort();
    let mut expected = vec![interrupted.branch.clone(), unreported.branch.clone()];
    expected.sort();
    assert_eq!(
        gone, expected,
        "interrupted and unreported attempts' branches go"
    );
    assert!(!interrupted.path.exists() && !stray.exists());
    assert!(
        waiting.path.exists(),
        "a parent waiting to synthesize keeps it"
    );
    assert!(f.branch_tip(&delivered.branch).is_some());
    assert!(f.branch_tip(&waiting.branch).is_some());

    // The end of the run: nothing is kept but delivered work.
    f.worktrees
        .sweep(SweepKeep {
            closing: true,
            ..SweepKeep::default()
        })
        .await
        .unwrap();
    assert!(!waiting.path.exists());
    assert_eq!(f.branch_tip(&waiting.branch), None);
    assert!(f.branch_tip(&delivered.branch).is_some());
    assert!(!f.state.path().join(f.run.to_string()).exists());
    assert_checkout_untouched(f.repo.path());
}

#[tokio::test]
async fn the_safety_net_leaves_out_huge_files_and_says_so() {
    let f = fixture();
    let ws = f.worktrees.prepare(f.request("t1", 1)).await.unwrap();
    let huge = std::fs::File::create(ws.path.join("dump.bin")).unwrap();
    huge.set_len(MAX_COMMITTED_FILE_BYTES + 1).unwrap();
    std::fs::write(ws.path.join("src/ok.rs"), "ok\n").unwrap();
    let work = f
        .worktrees
        .seal(ws.clone(), "t1: the work".into())
        .await
        .unwrap();
    let paths: Vec<&str> = work.files.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(paths, ["src/ok.rs"]);
    let git = git2::Repository::open(f.repo.path()).unwrap();
    let message = git
        .find_commit(git2::Oid::from_str(&work.head).unwrap())
        .unwrap()
        .message()
        .unwrap()
        .to_string();
    assert!(message.contains("dump.bin"), "{message}");
    f.worktrees.release(ws, BranchFate::Delete).await.unwrap();
}

#[tokio::test]
async fn a_repository_without_commits_has_no_base_to_start_from() {
    let repo = tempfile::tempdir().unwrap();
    git2::Repository::init(repo.path()).unwrap();
    let state = tempfile::tempdir().unwrap();
    let run = RunId::generate();
    let worktrees = GitWorktrees::new(repo.path(), run, state.path().join("w"), main_branch());
    let task: TaskId = "t1".parse().unwrap();
    let error = worktrees
        .prepare(WorktreeRequest {
            branch: branch_name(run, &task, 1),
            task,
            attempt: 1,
            start: WorktreeStart::Main,
        })
        .await
        .unwrap_err();
    assert!(error.to_string().contains("no commits"), "{error}");
    let _ = Workspace::scratch(state.path().into());
}

/// The acceptance scenario in small: four tasks that write real files under the daemon, one
/// that strays out of its scope, one that crashes; every handoff's files and lines are what
/// git says of its branch, and the user's checkout is untouched.
#[tokio::test]
async fn a_scripted_run_makes_real_commits_on_real_branches_and_handoffs_match_git() {
    use crate::daemon_env::{InProcessDaemon, follow_to_end, outcome, run_config, submit};
    use flotilla_actors::protocol::{AttemptFailure, EventKind, Finding, RunOutcome};

    let repo = tempfile::tempdir().unwrap();
    init_repo(repo.path());
    let git = git2::Repository::open(repo.path()).unwrap();
    commit_files(
        &git,
        &[
            ("src/lib.rs", "// empty\n"),
            ("tests/lib.rs", "#[test]\nfn t() {}\n"),
        ],
        "code",
    );
    let main = git.refname_to_id("refs/heads/main").unwrap();
    let scenario = r##"
[[planner.answers]]
tasks = [
  { description = "lexer", scope = ["src/lex.rs"] },
  { description = "parser", scope = ["src/parse.rs"] },
  { description = "docs", scope = ["docs"] },
  { description = "wire up", scope = ["src/lib.rs", "tests"] },
]

[tasks.t1]
writes = { "src/lex.rs" = "pub fn lex() {}\n" }

[tasks.t2]
attempts = [
  { writes = { "src/parse.rs" = "pub fn parse() {}\n", "Cargo.toml" = "[package]\n" } },
  { writes = { "src/parse.rs" = "pub fn parse() {}\n" } },
]

[tasks.t3]
attempts = [
  { outcome = "crash", writes = { "docs/half.md" = "half\n" } },
  { writes = { "docs/grammar.md" = "# Grammar\n\nexpr := term\n" } },
]

[tasks.t4]
writes = { "src/lib.rs" = "pub mod lex;\npub mod parse;\n" }
deletes = ["tests/lib.rs"]
run = "test -f src/lib.rs && test ! -e tests/lib.rs"
"##;
    let daemon = InProcessDaemon::start(false);
    let run = submit(&daemon.client, repo.path(), run_config(scenario, 2)).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed), "{events:#?}");

    let retried: Vec<(String, AttemptFailure)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TaskRetried { task, failure, .. } => {
                Some((task.to_string(), failure.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(retried.len(), 2, "{retried:?}");
    assert!(retried.contains(&(
        "t2".into(),
        AttemptFailure::OutOfScope {
            paths: vec!["Cargo.toml".into()]
        }
    )));
    assert!(
        retried
            .iter()
            .any(|(t, f)| t == "t3" && matches!(f, AttemptFailure::Crashed { .. }))
    );

    let git = git2::Repository::open(repo.path()).unwrap();
    let mut handoffs = std::collections::BTreeMap::new();
    for e in &events {
        let (EventKind::TaskCompleted { task, handoff, .. }
        | EventKind::TaskLanding { task, handoff, .. }) = &e.kind
        else {
            continue;
        };
        let h = handoff.clone().expect("a worker's handoff");
        let work = h.work.clone().expect("git truth");
        // From main's tip when it started: the first commit, or a later main that held
        // what had landed by then.
        let base = git2::Oid::from_str(&work.base).unwrap();
        let final_main = git.refname_to_id("refs/heads/main").unwrap();
        assert!(
            base == main || git.graph_descendant_of(final_main, base).unwrap(),
            "{task} started from main"
        );
        // It landed: the branch is gone and main holds the commit the handoff names.
        assert!(
            git.find_branch(&work.branch, git2::BranchType::Local)
                .is_err()
        );
        let tip = git
            .find_commit(git2::Oid::from_str(&work.head).unwrap())
            .unwrap()
            .id();
        assert!(tip == git2::Oid::from_str(&work.head).unwrap());
        assert!(
            landed_on_main(&git, &task.to_string()),
            "{task}: main holds its work"
        );
        let paths: Vec<&str> = work.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(h.files_changed, paths);
        if let Some(cli) = git_cli_numstat(repo.path(), &work.base, &work.head) {
            let ours: Vec<(String, u64, u64)> = work
                .files
                .iter()
                .map(|f| (f.path.clone(), f.lines_added, f.lines_removed))
                .collect();
            assert_eq!(ours, cli, "{task}: the handoff is `git diff --numstat`");
        }
        handoffs.insert(task.to_string(), h);
    }
    assert_eq!(handoffs["t1"].files_changed, ["src/lex.rs"]);
    assert_eq!(handoffs["t2"].files_changed, ["src/parse.rs"]);
    assert_eq!(
        handoffs["t3"].files_changed,
        ["docs/grammar.md"],
        "the retry ran on a fresh worktree"
    );
    assert_eq!(handoffs["t4"].files_changed, ["src/lib.rs", "tests/lib.rs"]);
    assert_eq!(
        handoffs["t4"].findings,
        [Finding::DeletedTests {
            paths: vec!["tests/lib.rs".into()]
        }]
    );
    assert_eq!(handoffs["t4"].build_exit_code, Some(0), "its command ran");
    assert_eq!(
        (
            handoffs["t4"].metrics.lines_added,
            handoffs["t4"].metrics.lines_removed
        ),
        (2, 3)
    );

    let mut branches: Vec<String> = git
        .branches(Some(git2::BranchType::Local))
        .unwrap()
        .map(|b| b.unwrap().0.name().unwrap().unwrap().to_string())
        .filter(|n| n.starts_with("flotilla/"))
        .map(|n| n.rsplit('/').next().unwrap().to_string())
        .collect();
    branches.sort();
    // Every delivered attempt landed on main (one commit each, with its trailer) and its
    // branch went; the user's clean checkout of main was brought along, nothing else.
    assert!(branches.is_empty(), "{branches:?}");
    for task in ["t1", "t2", "t3", "t4"] {
        assert!(landed_on_main(&git, task), "{task}");
    }
    assert_ne!(git.refname_to_id("refs/heads/main").unwrap(), main);
    assert_checkout_untouched(repo.path());
    let run_dir = daemon.state_dir().join("worktrees").join(&run);
    within(PATIENCE, || async { (!run_dir.exists()).then_some(()) }).await;
    assert!(!run_dir.exists(), "the run's worktrees are gone");
}

/// The calculator walkthrough (docs/features.md), as a new user runs it (the example files
/// copied into a fresh repository with one commit): it completes, and every worker's work
/// is a commit on its own branch.
#[tokio::test]
async fn the_readme_demo_completes_with_a_commit_on_every_workers_branch() {
    use crate::daemon_env::{InProcessDaemon, follow_to_end, outcome, submit};
    use flotilla_actors::protocol::{EventKind, RunOutcome};

    let repo = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/examples");
    let read = |file: &str| std::fs::read_to_string(examples.join(file)).unwrap();
    let (config, scenario) = (read("flotilla.toml"), read("calculator.toml"));
    let git = git2::Repository::init_opts(
        repo.path(),
        git2::RepositoryInitOptions::new().initial_head("main"),
    )
    .unwrap();
    commit_files(
        &git,
        &[("flotilla.toml", &config), ("calculator.toml", &scenario)],
        "the demo's config",
    );

    let daemon = InProcessDaemon::start(false);
    let run = submit(&daemon.client, repo.path(), serde_json::Value::Null).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    let git = git2::Repository::open(repo.path()).unwrap();
    let mut delivered: Vec<(String, Vec<String>)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TaskCompleted {
                task,
                handoff: Some(h),
                ..
            }
            | EventKind::TaskLanding {
                task,
                handoff: Some(h),
                ..
            } if h.work.is_some() => Some((task.to_string(), h.clone())),
            _ => None,
        })
        .map(|(task, h)| {
            // Each was a commit on its own branch, as the handoff says, and it landed.
            let work = h.work.unwrap();
            assert!(
                git.find_commit(git2::Oid::from_str(&work.head).unwrap())
                    .is_ok()
            );
            assert!(landed_on_main(&git, &task), "{task} is on main");
            assert_ne!(work.head, work.base, "{task} committed something");
            (task, h.files_changed)
        })
        .collect();
    delivered.sort();
    assert_eq!(
        delivered,
        [
            ("t1", vec!["src/lex.rs"]),
            ("t2", vec!["src/parse.rs"]),
            ("t3", vec!["docs/grammar.md"]),
            ("t4.1", vec!["src/args.rs", "src/cli.rs"]),
            ("t4.2", vec!["src/out.rs"]),
            ("t4.3", vec!["src/main.rs"]),
        ]
        .map(|(t, f)| (t.to_string(), f.into_iter().map(String::from).collect()))
    );
    assert_checkout_clean(repo.path());
}

/// Cancelling a run while its agents run commands: the commands' process groups die, the
/// worktrees go, the cancelled attempts' branches go, the checkout is untouched.
#[tokio::test]
async fn a_cancelled_run_leaves_no_process_worktree_or_branch_behind() {
    use crate::daemon_env::{InProcessDaemon, follow_to_end, outcome, run_config, submit};
    use flotilla_actors::protocol::{EventKind, RunOutcome};

    let repo = tempfile::tempdir().unwrap();
    init_repo(repo.path());
    let pids = tempfile::tempdir().unwrap();
    let pid = |task: &str| pids.path().join(task);
    let scenario = format!(
        r#"
[[planner.answers]]
tasks = [
  {{ description = "one", scope = ["src/a.rs"] }},
  {{ description = "two", scope = ["src/b.rs"] }},
]
[tasks.t1]
writes = {{ "src/a.rs" = "half done\n" }}
run = "sleep 300 & echo $! > {}; wait"
[tasks.t2]
run = "sleep 300 & echo $! > {}; wait"
"#,
        pid("t1").display(),
        pid("t2").display()
    );
    let daemon = InProcessDaemon::start(false);
    // The commands report their host pids through files outside their worktrees, which a
    // sandbox hides (the sandboxed case: tests/it/escapes.rs).
    let mut config = run_config(&scenario, 2);
    config["sandbox"] = serde_json::json!("none");
    let run = submit(&daemon.client, repo.path(), config).await;
    let mut children = Vec::new();
    for task in ["t1", "t2"] {
        let found = within(PATIENCE, || async {
            std::fs::read_to_string(pid(task))
                .ok()
                .and_then(|t| t.trim().parse::<i32>().ok())
        })
        .await;
        children.push(found.unwrap_or_else(|| panic!("{task}'s command never started")));
    }
    let (status, body) = daemon
        .client
        .raw(hyper::Method::POST, &format!("/v1/runs/{run}/cancel"), None)
        .await
        .unwrap();
    assert!(status.is_success(), "{}", String::from_utf8_lossy(&body));
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Cancelled));
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.kind, EventKind::TaskCompleted { .. }))
    );

    for child in children {
        let dead = within(PATIENCE, || async {
            // SAFETY: signal 0 only checks whether the process exists.
            (unsafe { libc::kill(child, 0) } != 0).then_some(())
        })
        .await;
        assert!(dead.is_some(), "process {child} survived the cancelled run");
    }
    let run_dir = daemon.state_dir().join("worktrees").join(&run);
    let git = git2::Repository::open(repo.path()).unwrap();
    let flotilla_branches = || -> Vec<String> {
        git.branches(Some(git2::BranchType::Local))
            .unwrap()
            .map(|b| b.unwrap().0.name().unwrap().unwrap().to_string())
            .filter(|n| n.starts_with("flotilla/"))
            .collect()
    };
    within(PATIENCE, || async {
        (flotilla_branches().is_empty() && !run_dir.exists()).then_some(())
    })
    .await;
    let leftovers = flotilla_branches();
    assert!(leftovers.is_empty(), "branches left: {leftovers:?}");
    assert!(!run_dir.exists(), "worktrees left in {}", run_dir.display());
    assert_checkout_untouched(repo.path());
}

/// docs/examples/workers, as its README runs it: nine tasks with real commits, a crash
/// retried on a fresh worktree, an out-of-scope edit that fails an attempt, a verification
/// finding; every handoff is what git says.
#[tokio::test]
async fn the_workers_example_runs_as_documented() {
    use crate::daemon_env::{InProcessDaemon, follow_to_end, outcome, submit};
    use flotilla_actors::protocol::{AttemptFailure, EventKind, Finding, RunOutcome};

    let repo = tempfile::tempdir().unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/examples/workers");
    let read = |file: &str| std::fs::read_to_string(example.join(file)).unwrap();
    let (config, scenario) = (read("flotilla.toml"), read("scenario.toml"));
    let git = git2::Repository::init_opts(
        repo.path(),
        git2::RepositoryInitOptions::new().initial_head("main"),
    )
    .unwrap();
    commit_files(
        &git,
        &[("flotilla.toml", &config), ("scenario.toml", &scenario)],
        "start",
    );
    let daemon = InProcessDaemon::start(false);
    let run = submit(&daemon.client, repo.path(), serde_json::Value::Null).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));

    let mut retried: Vec<(String, AttemptFailure)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TaskRetried { task, failure, .. } => {
                Some((task.to_string(), failure.clone()))
            }
            _ => None,
        })
        .collect();
    retried.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(retried.len(), 2, "{retried:?}");
    assert!(matches!(&retried[0], (t, AttemptFailure::Crashed { .. }) if t == "t3"));
    assert_eq!(
        retried[1],
        (
            "t4".to_string(),
            AttemptFailure::OutOfScope {
                paths: vec!["Cargo.toml".into()]
            }
        )
    );
    let mut delivered = 0;
    for e in &events {
        let (EventKind::TaskCompleted {
            task,
            handoff: Some(h),
            ..
        }
        | EventKind::TaskLanding {
            task,
            handoff: Some(h),
            ..
        }) = &e.kind
        else {
            continue;
        };
        delivered += 1;
        let work = h.work.as_ref().unwrap();
        assert_eq!(work.files.len(), 1, "{task}: one file each");
        if let Some(cli) = git_cli_numstat(repo.path(), &work.base, &work.head) {
            let ours: Vec<(String, u64, u64)> = work
                .files
                .iter()
                .map(|f| (f.path.clone(), f.lines_added, f.lines_removed))
                .collect();
            assert_eq!(ours, cli, "{task}");
        }
        let verification_failed = h
            .findings
            .iter()
            .any(|f| matches!(f, Finding::VerificationFailed { .. }));
        assert_eq!(
            verification_failed,
            task.to_string() == "t8",
            "{task}: {:?}",
            h.findings
        );
        assert_eq!(
            h.build_exit_code,
            Some(if task.to_string() == "t8" { 1 } else { 0 })
        );
    }
    assert_eq!(delivered, 9);
    assert_checkout_clean(repo.path());
}

/// A checkout with nothing modified or untracked and no worktree registered (for
/// repositories made from the examples, whose files are not the test fixture's README).
fn assert_checkout_clean(path: &Path) {
    let repo = git2::Repository::open(path).unwrap();
    let statuses = repo
        .statuses(Some(git2::StatusOptions::new().include_untracked(true)))
        .unwrap();
    assert!(statuses.is_empty(), "the checkout was touched");
    assert_eq!(repo.worktrees().unwrap().len(), 0);
}

/// One run, two kinds of agent: a profile per kind, and the task that needs the `cli`
/// capability goes to the external CLI (a fake one here) while the other stays scripted.
#[tokio::test]
async fn one_run_mixes_agent_kinds_by_worker_profile() {
    use crate::daemon_env::{InProcessDaemon, follow_to_end, outcome, run_config, submit};
    use flotilla_actors::protocol::{EventKind, RunOutcome};

    let repo = tempfile::tempdir().unwrap();
    init_repo(repo.path());
    let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake-agent.sh");
    let scenario = r#"
[[planner.answers]]
tasks = [
  { description = "scripted work", scope = ["docs"] },
  { description = "work for the CLI", scope = ["src"], capabilities = ["cli"] },
]
[tasks.t1]
writes = { "docs/a.md" = "scripted\n" }
"#;
    let mut config = run_config(scenario, 2);
    config["workers"] = serde_json::json!([
        { "name": "general", "agent": "scripted" },
        { "name": "cli", "capabilities": ["cli"], "cost": 5, "agent": "fake" },
    ]);
    config["agents"] = serde_json::json!({
        "fake": {
            "program": "sh",
            "args": [fake.to_string_lossy(), "envelope", "{prompt_file}"],
            "prompt": "file",
        }
    });
    // The fake CLI lives in the source tree, which may be under /tmp (a CI clone): the
    // sandbox's /tmp is private, so the tree is shown read-only, as a user would show a tool
    // kept there (docs/security.md).
    config["sandbox"] = serde_json::json!({
        "read_only": [fake.parent().unwrap().to_string_lossy()]
    });
    let daemon = InProcessDaemon::start(false);
    let run = submit(&daemon.client, repo.path(), config).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed), "{events:#?}");
    let summaries: Vec<(String, String, Vec<String>)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TaskCompleted {
                task,
                handoff: Some(h),
                ..
            }
            | EventKind::TaskLanding {
                task,
                handoff: Some(h),
                ..
            } => Some((task.to_string(), h.summary.clone(), h.files_changed.clone())),
            _ => None,
        })
        .collect();
    assert!(
        summaries.contains(&("t2".into(), "wrote a".into(), vec!["src/a.rs".to_string()])),
        "the CLI's envelope, and git's files: {summaries:?}"
    );
    assert!(
        summaries
            .iter()
            .any(|(t, _, files)| t == "t1" && files == &["docs/a.md".to_string()])
    );
    let dispatched: Vec<(String, String)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TaskDispatched { task, profile, .. } => {
                Some((task.to_string(), profile.clone()))
            }
            _ => None,
        })
        .collect();
    assert!(
        dispatched.contains(&("t2".into(), "cli".into())),
        "{dispatched:?}"
    );
    assert_checkout_clean(repo.path());
}

/// What a branch holds at `path`, as text.
/// Whether a commit on main's first-parent history carries `task`'s trailer.
fn landed_on_main(repo: &git2::Repository, task: &str) -> bool {
    let mut commit = repo
        .find_commit(repo.refname_to_id("refs/heads/main").unwrap())
        .unwrap();
    loop {
        let message = commit.message().unwrap_or_default();
        if message
            .lines()
            .any(|l| l.starts_with("Flotilla-Task:") && l.ends_with(&format!("/{task}")))
        {
            return true;
        }
        match commit.parent(0) {
            Ok(parent) => commit = parent,
            Err(_) => return false,
        }
    }
}

/// The text of `path` at `rev` (a branch or a commit).
fn blob_at(repo: &git2::Repository, rev: &str, path: &str) -> Option<String> {
    let tip = repo.revparse_single(rev).ok()?.peel_to_commit().ok()?;
    let entry = tip.tree().ok()?.get_path(Path::new(path)).ok()?;
    let blob = entry.to_object(repo).ok()?.peel_to_blob().ok()?;
    Some(String::from_utf8_lossy(blob.content()).into_owned())
}

/// A real daemon process with credentials in its environment: a worker's command sees
/// none of them (its `env` is committed on the branch for the test to read).
#[tokio::test]
async fn a_workers_commands_never_see_the_daemons_secrets() {
    use crate::daemon_env::{DaemonProcess, follow_to_end, outcome, run_config, submit};
    use flotilla_actors::protocol::{EventKind, RunOutcome};

    let state = tempfile::tempdir().unwrap();
    let repo = tempfile::tempdir().unwrap();
    init_repo(repo.path());
    let daemon = DaemonProcess::start_with_env(
        state.path(),
        &[
            ("OPENAI_API_KEY", "sk-flotilla-test-secret-1"),
            ("ANTHROPIC_API_KEY", "sk-ant-flotilla-test-secret-2"),
            ("GITHUB_TOKEN", "ghp_flotilla_test_secret_3"),
            ("FLOTILLA_LOG", "info"),
        ],
    );
    let client = DaemonProcess::client(state.path());
    let scenario = r#"
[[planner.answers]]
tasks = [{ description = "look around", scope = ["env.txt"] }]
[tasks.t1]
run = "env > env.txt"
"#;
    let run = submit(&client, repo.path(), run_config(scenario, 1)).await;
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    let branch = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::TaskCompleted {
                handoff: Some(h), ..
            }
            | EventKind::TaskLanding {
                handoff: Some(h), ..
            } => h.work.as_ref().map(|w| w.head.clone()),
            _ => None,
        })
        .unwrap();
    let git = git2::Repository::open(repo.path()).unwrap();
    let env = blob_at(&git, &branch, "env.txt").expect("the command's env is in the commit");
    assert!(env.contains("PATH="), "{env}");
    for secret in ["secret", "OPENAI", "ANTHROPIC", "GITHUB_TOKEN", "FLOTILLA"] {
        assert!(
            !env.contains(secret),
            "{secret} reached a worker's command:\n{env}"
        );
    }
    drop(daemon);
}

/// A worker that splits its task hands back its partial work with the subplan; the
/// synthesis reopens the same worktree on the same branch, so the parent's handoff is the
/// partial work and the synthesis's, from git.
#[tokio::test]
async fn a_workers_own_subplan_is_synthesized_in_the_worktree_it_started() {
    use crate::daemon_env::{InProcessDaemon, follow_to_end, outcome, run_config, submit};
    use flotilla_actors::protocol::{EventKind, RunOutcome};

    let repo = tempfile::tempdir().unwrap();
    init_repo(repo.path());
    let scenario = r#"
[[planner.answers]]
tasks = [{ description = "the parser", scope = ["src"] }]

[tasks.t1]
outcome = "subplan"
writes = { "src/part.rs" = "// what the worker did before splitting\n" }
[tasks.t1.subplan]
subtasks = [{ description = "the tokens", scope = ["src/sub"] }]

[tasks."t1.1"]
writes = { "src/sub/tokens.rs" = "pub enum Token {}\n" }

[tasks.t1.synthesis]
summary = "parser assembled"
writes = { "src/final.rs" = "pub mod part;\npub mod sub;\n" }
"#;
    let daemon = InProcessDaemon::start(false);
    let run = submit(&daemon.client, repo.path(), run_config(scenario, 2)).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed), "{events:#?}");
    let handoffs: std::collections::BTreeMap<String, flotilla_actors::protocol::Handoff> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TaskCompleted {
                task,
                handoff: Some(h),
                ..
            }
            | EventKind::TaskLanding {
                task,
                handoff: Some(h),
                ..
            } => Some((task.to_string(), h.clone())),
            _ => None,
        })
        .collect();
    let parent = &handoffs["t1"];
    assert_eq!(parent.summary, "parser assembled");
    assert_eq!(parent.files_changed, ["src/final.rs", "src/part.rs"]);
    let work = parent.work.as_ref().unwrap();
    assert!(work.branch.ends_with("/t1"), "{}", work.branch);
    assert_eq!(handoffs["t1.1"].files_changed, ["src/sub/tokens.rs"]);
    let git = git2::Repository::open(repo.path()).unwrap();
    assert!(blob_at(&git, &work.head, "src/part.rs").is_some());
    assert!(blob_at(&git, &work.head, "src/final.rs").is_some());
    assert_checkout_clean(repo.path());
}

/// An agent rewrites its worktree's `.git` file to name the user's repository: flotilla
/// still commits to the task branch only, and the user's index, checkout and main never
/// move.
#[tokio::test]
async fn a_worktree_pointed_at_the_users_repository_cannot_make_flotilla_write_there() {
    let f = fixture();
    let main = f.main_tip();
    let index_before = std::fs::read(f.repo.path().join(".git/index")).unwrap();
    let ws = f.worktrees.prepare(f.request("t1", 1)).await.unwrap();
    std::fs::write(
        ws.path.join(".git"),
        format!("gitdir: {}\n", f.repo.path().join(".git").display()),
    )
    .unwrap();
    std::fs::write(ws.path.join("src/a.rs"), "pub fn a() {}\n").unwrap();
    let work = f
        .worktrees
        .seal(ws.clone(), "t1: the work".into())
        .await
        .unwrap();
    assert_eq!(f.main_tip(), main, "main did not move");
    assert_eq!(
        std::fs::read(f.repo.path().join(".git/index")).unwrap(),
        index_before,
        "the user's index is untouched"
    );
    assert_checkout_untouched_with_code(f.repo.path());
    assert_eq!(f.branch_tip(&ws.branch), Some(work.head.clone()));
    let paths: Vec<&str> = work.files.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(paths, ["src/a.rs"]);
    f.worktrees.release(ws, BranchFate::Keep).await.unwrap();
}

/// An agent that switches its worktree to a branch of its own: the work still lands on the
/// branch flotilla named, and a sweep deletes that branch, never the one the agent made up.
#[tokio::test]
async fn an_agent_that_switches_branches_still_delivers_on_the_branch_flotilla_named() {
    let f = fixture();
    let ws = f.worktrees.prepare(f.request("t1", 1)).await.unwrap();
    let status = Command::new("git")
        .args(["checkout", "-q", "-b", "main-but-mine"])
        .current_dir(&ws.path)
        .status()
        .expect("git is installed");
    assert!(status.success());
    std::fs::write(ws.path.join("src/b.rs"), "pub fn b() {}\n").unwrap();
    let work = f
        .worktrees
        .seal(ws.clone(), "t1: the work".into())
        .await
        .unwrap();
    assert_eq!(f.branch_tip(&ws.branch), Some(work.head.clone()));
    assert_eq!(work.files.len(), 1);
    f.worktrees
        .sweep(SweepKeep {
            closing: true,
            ..SweepKeep::default()
        })
        .await
        .unwrap();
    assert_eq!(
        f.branch_tip(&ws.branch),
        None,
        "its undelivered branch went"
    );
    assert!(
        f.branch_tip("main-but-mine").is_some(),
        "a branch flotilla did not name is not flotilla's to delete"
    );
    // The run is over: no worktree is made for it again.
    let refused = f.worktrees.prepare(f.request("t2", 1)).await.unwrap_err();
    assert!(refused.to_string().contains("run has ended"), "{refused}");
}

/// The fixture's checkout: `main`, its files as committed, nothing else.
fn assert_checkout_untouched_with_code(path: &Path) {
    let repo = git2::Repository::open(path).unwrap();
    let statuses = repo
        .statuses(Some(git2::StatusOptions::new().include_untracked(true)))
        .unwrap();
    assert!(statuses.is_empty(), "the user's checkout was touched");
    assert_eq!(repo.head().unwrap().shorthand().unwrap(), "main");
}

/// `[worktrees] keep_failed`: a failed attempt's worktree and branch outlive the run, for
/// someone to look at, until `flotilla gc` removes them; delivered work is untouched.
#[tokio::test]
async fn failed_attempts_can_be_kept_for_inspection_until_gc() {
    use crate::daemon_env::{InProcessDaemon, follow_to_end, outcome, run_config, submit};
    use flotilla_actors::protocol::RunOutcome;

    let repo = tempfile::tempdir().unwrap();
    init_repo(repo.path());
    let scenario = r#"
[[planner.answers]]
tasks = [
  { description = "flaky", scope = ["src/a.rs"] },
  { description = "fine", scope = ["src/b.rs"] },
]
[tasks.t1]
outcome = "crash"
writes = { "src/a.rs" = "what went wrong\n" }
[tasks.t2]
writes = { "src/b.rs" = "fine\n" }
"#;
    let mut config = run_config(scenario, 2);
    config["worktrees"] = serde_json::json!({ "keep_failed": true });
    let daemon = InProcessDaemon::start(false);
    let run = submit(&daemon.client, repo.path(), config).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Failed));
    let run_dir = daemon.state_dir().join("worktrees").join(&run);
    // Past the run's end and its sweep, both failed attempts are there to look at.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    for attempt in ["t1-a1", "t1-a2"] {
        let left = run_dir.join(attempt).join("src/a.rs");
        assert_eq!(
            std::fs::read_to_string(&left).unwrap_or_default(),
            "what went wrong\n",
            "{attempt} was kept"
        );
    }
    let git = git2::Repository::open(repo.path()).unwrap();
    let branches = || -> Vec<String> {
        let mut names: Vec<String> = git
            .branches(Some(git2::BranchType::Local))
            .unwrap()
            .map(|b| b.unwrap().0.name().unwrap().unwrap().to_string())
            .filter(|n| n.starts_with("flotilla/"))
            .map(|n| n.rsplit('/').next().unwrap().to_string())
            .collect();
        names.sort();
        names
    };
    // The failed attempts stay for inspection; t2's branch landed and was deleted.
    assert_eq!(branches(), ["t1", "t1-a2"]);

    let report: serde_json::Value = daemon
        .client
        .json(hyper::Method::POST, "/v1/gc", None::<&()>)
        .await
        .unwrap();
    assert_eq!(report["worktrees"].as_array().unwrap().len(), 2, "{report}");
    assert!(!run_dir.exists());
    let none: [&str; 0] = [];
    assert_eq!(
        branches(),
        none,
        "failed attempts go; landed work is on main"
    );
    assert_checkout_clean(repo.path());
}

/// A SIGKILL in the middle of making a worktree can leave git's record of it half written
/// (a HEAD naming the branch, no gitdir): git cannot open it, yet it holds the branch as
/// checked out. Preparing the same attempt again, and sweeping, both clear it.
#[tokio::test]
async fn a_half_written_worktree_record_does_not_block_the_attempt_or_the_sweep() {
    let f = fixture();
    let request = f.request("t4", 4);
    let git = git2::Repository::open(f.repo.path()).unwrap();
    let main = git
        .find_commit(git2::Oid::from_str(&f.main_tip()).unwrap())
        .unwrap();
    git.branch(&request.branch, &main, false).unwrap();
    let record = f
        .repo
        .path()
        .join(".git/worktrees")
        .join(format!("flotilla-{}-t4-a4", f.run.as_uuid().simple()));
    std::fs::create_dir_all(&record).unwrap();
    std::fs::write(
        record.join("HEAD"),
        format!("ref: refs/heads/{}\n", request.branch),
    )
    .unwrap();

    let ws = f.worktrees.prepare(request.clone()).await.unwrap();
    assert!(ws.path.join("src/lib.rs").exists(), "made again, whole");

    // And a half-written record left beside a sweep is cleared with its branch.
    let other = f.request("t5", 3);
    git.branch(&other.branch, &main, false).unwrap();
    let record = f
        .repo
        .path()
        .join(".git/worktrees")
        .join(format!("flotilla-{}-t5-a3", f.run.as_uuid().simple()));
    std::fs::create_dir_all(&record).unwrap();
    std::fs::write(
        record.join("HEAD"),
        format!("ref: refs/heads/{}\n", other.branch),
    )
    .unwrap();
    let swept = f
        .worktrees
        .sweep(SweepKeep {
            delivered: Some(Vec::new()),
            ..SweepKeep::default()
        })
        .await
        .unwrap();
    assert!(!record.exists());
    assert!(swept.branches.contains(&other.branch), "{swept:?}");
    assert_eq!(f.branch_tip(&other.branch), None);
    assert_eq!(f.branch_tip(&ws.branch), None);
    assert_checkout_untouched_with_code(f.repo.path());
}

/// A kill while libgit2 makes worktrees leaves their records half made (a directory under
/// `.git/worktrees`, without its `HEAD`). With two of them libgit2 took every branch for
/// checked out: every attempt failed ("reference … is already checked out"), and the
/// restart's sweep stopped at its first branch deletion, leaving them (the soak: every task
/// failed after a kill with four worktrees being made).
#[tokio::test]
async fn half_made_worktree_records_block_neither_an_attempt_nor_the_sweep() {
    let f = fixture();
    let git = git2::Repository::open(f.repo.path()).unwrap();
    let main = git
        .find_commit(git2::Oid::from_str(&f.main_tip()).unwrap())
        .unwrap();
    let half_made = |tasks: &[&str]| {
        for task in tasks {
            let request = f.request(task, 1);
            git.branch(&request.branch, &main, false).unwrap();
            let record = f
                .repo
                .path()
                .join(".git/worktrees")
                .join(format!("flotilla-{}-{task}-a1", f.run.as_uuid().simple()));
            std::fs::create_dir_all(&record).unwrap();
            std::fs::write(record.join("locked"), "").unwrap();
        }
    };
    half_made(&["t7", "t8"]);
    let ws = f.worktrees.prepare(f.request("t9", 1)).await.unwrap();
    assert!(ws.path.join("src/lib.rs").exists());

    half_made(&["t10", "t11", "t12"]);
    let swept = f
        .worktrees
        .sweep(SweepKeep {
            delivered: Some(Vec::new()),
            ..SweepKeep::default()
        })
        .await
        .unwrap();
    let records: Vec<_> = std::fs::read_dir(f.repo.path().join(".git/worktrees"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert_eq!(records, Vec::<std::ffi::OsString>::new());
    for task in ["t7", "t8", "t9", "t10", "t11", "t12"] {
        let branch = f.request(task, 1).branch;
        assert_eq!(f.branch_tip(&branch), None, "{branch}");
        assert!(swept.branches.contains(&branch), "{branch}: {swept:?}");
    }
}

/// A kill inside a seal's ref update leaves `<branch>.lock` beside a worktree git still
/// records. The sweep after the restart removed the stale lock only after it had pruned
/// the worktrees and deleted their branches: the deletion failed on the lock, and the
/// whole sweep with it (nothing after it ran; the run's worktrees and branches stayed).
#[tokio::test]
async fn a_stale_lock_on_a_recorded_worktrees_branch_does_not_stop_the_sweep() {
    let f = fixture();
    let ws = f.worktrees.prepare(f.request("t6", 1)).await.unwrap();
    let lock = f
        .repo
        .path()
        .join(".git/refs/heads")
        .join(format!("{}.lock", ws.branch));
    std::fs::write(&lock, format!("{}\n", f.main_tip())).unwrap();
    let swept = f
        .worktrees
        .sweep(SweepKeep {
            delivered: Some(Vec::new()),
            ..SweepKeep::default()
        })
        .await
        .unwrap();
    assert!(!lock.exists(), "the stale lock goes");
    assert!(swept.worktrees.contains(&ws.path), "{swept:?}");
    assert!(swept.branches.contains(&ws.branch), "{swept:?}");
    assert_eq!(f.branch_tip(&ws.branch), None);
    assert!(!ws.path.exists());
}

/// M12 item 4 (ADR-041): a worker's checkout and seal run without the repository's lock,
/// so the merge queue's steps that need it (main's compare-and-swap with the user's
/// checkout, a batch's branch deletion, the checkout sync) go through while a worker is
/// held inside either. The hook holds the worker there until the queue's steps are done:
/// were the lock held across them, those steps would never end (a hang guard reports it).
#[tokio::test]
async fn the_merge_queue_lands_while_a_worker_is_inside_its_checkout_or_its_seal() {
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};

    use flotilla::git::merge::GitMerge;
    use flotilla::git::reader::GitRepo;
    use flotilla::git::worktrees::Unlocked;
    use flotilla_actors::ports::{MainRef, MergeGit};

    // Ends a step that waits for a lock it should not: the test fails, not hangs.
    async fn hang_guard<T>(step: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(PATIENCE, step)
            .await
            .expect("a step waited for the repository's lock a worker holds")
    }
    let f = fixture();
    // The worker stops in the part named by `hold`, says so, and waits for `go`.
    let (inside_tx, inside_rx) = mpsc::channel::<Unlocked>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go_rx = Arc::new(Mutex::new(go_rx));
    let worktrees = GitWorktrees::new(
        f.repo.path(),
        f.run,
        f.state.path().join(f.run.to_string()),
        main_branch(),
    )
    .with_unlocked_hook(Arc::new(move |part| {
        inside_tx.send(part).unwrap();
        go_rx.lock().unwrap().recv().unwrap();
    }));
    let queue_git = GitMerge::new(f.repo.path(), f.state.path().join("scratch"), main_branch());
    let main_ref = GitRepo::new(f.repo.path(), main_branch());
    let git = git2::Repository::open(f.repo.path()).unwrap();

    // What the queue does once a candidate passed: main moves (the user's checkout with
    // it), the landed branches go, the checkout is synced.
    let land = |n: usize| {
        let sig = git2::Signature::now("test", "test@example.com").unwrap();
        let tip = git.head().unwrap().peel_to_commit().unwrap();
        let mut index = git2::Index::new().unwrap();
        index.read_tree(&tip.tree().unwrap()).unwrap();
        let blob = git.blob(format!("landed {n}\n").as_bytes()).unwrap();
        let mut entry = index.get_path(Path::new("src/lib.rs"), 0).unwrap();
        entry.id = blob;
        entry.path = format!("landed{n}.txt").into_bytes();
        index.add(&entry).unwrap();
        let tree = git.find_tree(index.write_tree_to(&git).unwrap()).unwrap();
        let candidate = git
            .commit(None, &sig, &sig, &format!("landed {n}"), &tree, &[&tip])
            .unwrap();
        let landed: Vec<String> = (0..2)
            .map(|i| {
                let name = format!("flotilla/{}/landed-{n}-{i}", f.run);
                git.branch(&name, &tip, false).unwrap();
                name
            })
            .collect();
        (tip.id().to_string(), candidate.to_string(), landed)
    };
    let queue_lands = |(from, to, branches): (String, String, Vec<String>)| {
        let (main_ref, queue_git) = (&main_ref, &queue_git);
        async move {
            main_ref
                .compare_and_swap(from.clone(), to.clone())
                .await
                .unwrap();
            assert!(queue_git.delete_branches(branches).await.is_empty());
            queue_git.sync_checkout(from, to).await.unwrap();
        }
    };

    // Held inside the checkout of a new worktree.
    let request = f.request("t1", 1);
    let preparing = tokio::spawn(worktrees.prepare(request.clone()));
    let part = tokio::task::spawn_blocking(move || {
        let part = inside_rx.recv().unwrap();
        (part, inside_rx)
    })
    .await
    .unwrap();
    let (part, inside_rx) = part;
    assert_eq!(part, Unlocked::Checkout);
    let landing = land(1);
    let landed_tip = landing.1.clone();
    hang_guard(queue_lands(landing)).await;
    assert_eq!(
        f.main_tip(),
        landed_tip,
        "main moved while the worker checked out"
    );
    assert_eq!(
        std::fs::read_to_string(f.repo.path().join("landed1.txt")).unwrap(),
        "landed 1\n",
        "and the user's checkout with it"
    );
    go_tx.send(()).unwrap();
    let ws = hang_guard(preparing).await.unwrap().unwrap();
    // The worktree started from main as it was when its branch was made.
    assert!(ws.path.join("src/lib.rs").exists());
    assert!(!ws.path.join("landed1.txt").exists());

    // Held inside the seal, before the branch moves.
    std::fs::write(ws.path.join("src/new.rs"), "new\n").unwrap();
    let sealing = tokio::spawn(worktrees.seal(ws.clone(), "t1: new".into()));
    let (part, _inside_rx) = tokio::task::spawn_blocking(move || {
        let part = inside_rx.recv().unwrap();
        (part, inside_rx)
    })
    .await
    .unwrap();
    assert_eq!(part, Unlocked::Seal);
    let landing = land(2);
    let landed_tip = landing.1.clone();
    hang_guard(queue_lands(landing)).await;
    assert_eq!(
        f.main_tip(),
        landed_tip,
        "main moved while the worker sealed"
    );
    go_tx.send(()).unwrap();
    let work = hang_guard(sealing).await.unwrap().unwrap();
    assert!(work.committed_for_agent);
    let paths: Vec<&str> = work.files.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(
        paths,
        ["src/new.rs"],
        "the seal saw the worker's file, only it"
    );
    assert_eq!(f.branch_tip(&ws.branch), Some(work.head.clone()));
    drop(go_tx);
    worktrees
        .release(ws.clone(), BranchFate::Delete)
        .await
        .unwrap();
    assert!(!ws.path.exists());
    assert_eq!(f.branch_tip(&ws.branch), None);
}

/// ADR-041: the seal borrows stat data from the worktree's index to hash only what changed;
/// an edit that keeps a file's size, made right after the checkout (in the same clock tick
/// as the index, as a fast agent would), is still seen, and so is one made after the
/// agent's own `git add` refreshed the index.
#[tokio::test]
async fn the_seal_sees_same_size_edits_made_at_once_after_the_checkout() {
    let f = fixture();
    let ws = f.worktrees.prepare(f.request("t1", 1)).await.unwrap();
    // Same length as "pub fn a() {}\npub fn b() {}\n".
    std::fs::write(ws.path.join("src/lib.rs"), "pub fn x() {}\npub fn y() {}\n").unwrap();
    let work = f
        .worktrees
        .seal(ws.clone(), "t1: same size".into())
        .await
        .unwrap();
    let paths: Vec<&str> = work.files.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(paths, ["src/lib.rs"]);
    let main = git2::Repository::open(f.repo.path()).unwrap();
    assert_eq!(
        blob_at(&main, &work.head, "src/lib.rs").as_deref(),
        Some("pub fn x() {}\npub fn y() {}\n")
    );

    // The agent refreshes its index (as `git add` would), then edits again, same size.
    let wt = git2::Repository::open(&ws.path).unwrap();
    let mut index = wt.index().unwrap();
    index.add_path(Path::new("tests/lib.rs")).unwrap();
    index.write().unwrap();
    std::fs::write(ws.path.join("tests/lib.rs"), "#[test]\nfn u() {}\n").unwrap();
    let again = f
        .worktrees
        .seal(ws.clone(), "t1: again".into())
        .await
        .unwrap();
    assert!(again.committed_for_agent);
    assert_eq!(
        blob_at(&main, &again.head, "tests/lib.rs").as_deref(),
        Some("#[test]\nfn u() {}\n")
    );
}

/// A tree whose entries are out of git's order (an agent can write one: `git hash-object
/// -t tree --literally`) still shows every change in the handoff: libgit2's diff limited to
/// the changed paths walks trees once, in the order it assumes, and would lose a path the
/// walk has passed (a link pointing out of the repository among them).
#[test]
fn a_tree_out_of_gits_order_hides_no_change_from_the_handoff() {
    use flotilla::git::worktrees::branch_work;
    let dir = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init(dir.path()).unwrap();
    let blob = |text: &str| repo.blob(text.as_bytes()).unwrap();
    let (keep, x, extra) = (blob("keep\n"), blob("x\n"), blob("one\ntwo\n"));
    let link = blob("/etc");
    let mut src = repo.treebuilder(None).unwrap();
    src.insert("x.rs", x, 0o100644).unwrap();
    let src = src.write().unwrap();
    let mut base = repo.treebuilder(None).unwrap();
    base.insert("b0", keep, 0o100644).unwrap();
    base.insert("keep.txt", keep, 0o100644).unwrap();
    base.insert("src", src, 0o040000).unwrap();
    let base_tree = base.write().unwrap();
    // The head adds `a-added.txt` and `a-link` after `src/`: out of order.
    let mut raw = Vec::new();
    for (mode, name, id) in [
        ("100644", "b0", keep),
        ("100644", "keep.txt", keep),
        ("40000", "src", src),
        ("100644", "a-added.txt", extra),
        ("120000", "a-link", link),
    ] {
        raw.extend_from_slice(format!("{mode} {name}\0").as_bytes());
        raw.extend_from_slice(id.as_bytes());
    }
    let head_tree = repo
        .odb()
        .unwrap()
        .write(git2::ObjectType::Tree, &raw)
        .unwrap();
    let sig = git2::Signature::now("t", "t@example.com").unwrap();
    let commit = |tree, parents: &[&git2::Commit<'_>]| {
        let tree = repo.find_tree(tree).unwrap();
        repo.commit(None, &sig, &sig, "c", &tree, parents).unwrap()
    };
    let base = commit(base_tree, &[]);
    let head = commit(head_tree, &[&repo.find_commit(base).unwrap()]);
    let work = branch_work(&repo, "b", base, head).unwrap();
    let paths: Vec<&str> = work.files.iter().map(|f| f.path.as_str()).collect();
    assert!(paths.contains(&"a-added.txt"), "{paths:?}");
    assert!(paths.contains(&"a-link"), "{paths:?}");
    assert_eq!(work.links_outside, vec!["a-link".to_string()]);
    assert_eq!(work.lines_added, 2 + 1, "{work:?}");
}
