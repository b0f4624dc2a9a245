//! A repository's warm trees (ADR-055), through `ScratchRun` as the merge gate runs it, with
//! the real git side and the real sandboxed runner: they outlive the run that made them, so
//! the repository's next run gates warm; submodules the user's checkout holds are checked
//! out there at the commit each candidate records, from the target's own git directory,
//! whatever the candidate's `.gitmodules` says and whatever a gate left in them;
//! LFS files are smudged from the target's LFS objects; gc keeps a live repository's trees
//! and removes those of a repository that is gone.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use flotilla::git::merge::GitMerge;
use flotilla::process::ConfinedRunner;
use flotilla::sandbox::{SandboxConfig, SandboxPolicy};
use flotilla_actors::actors::scratch_commands::{CommandResult, NamedCommand, ScratchRun};
use flotilla_actors::ports::WarmSlot;
use tokio_util::sync::CancellationToken;

use crate::daemon_env::{init_repo, main_branch};
use crate::supervision::assert_checkout_untouched;

/// `git` in `dir` as a test identity, with local paths allowed as submodule URLs; its
/// standard output, trimmed. Panics on failure.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args(["-c", "protocol.file.allow=always"])
        .args(args)
        .env("GIT_AUTHOR_NAME", "test")
        .env("GIT_AUTHOR_EMAIL", "test@example.com")
        .env("GIT_COMMITTER_NAME", "test")
        .env("GIT_COMMITTER_EMAIL", "test@example.com")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The gate of one run: its own `GitMerge`, the repository's warm trees in `worktrees`.
fn gate_run(repo: &Path, worktrees: &Path, run: &str) -> ScratchRun {
    let merge = GitMerge::new(repo, worktrees.join(run).join("scratch"), main_branch())
        .with_repository_warm(worktrees, 1024);
    let policy =
        SandboxPolicy::for_run(&SandboxConfig::default(), &[worktrees.to_path_buf()], repo);
    ScratchRun {
        git: Arc::new(merge),
        runner: Arc::new(ConfinedRunner::new(policy)),
        timeout: Duration::from_secs(300),
        stop_at_first_failure: false,
        slot: WarmSlot::Gate,
    }
}

async fn gate(run: &ScratchRun, commit: &str, lines: &[&str]) -> Vec<CommandResult> {
    let commands = lines
        .iter()
        .map(|line| NamedCommand {
            name: "gate".into(),
            line: line.to_string(),
        })
        .collect();
    run.run(
        commit.to_string(),
        "gate".into(),
        commands,
        CancellationToken::new(),
    )
    .await
    .unwrap()
}

/// A gate command checking that the submodule at `vendor/lib` is at `commit`.
fn lib_at(commit: &str) -> String {
    format!("test \"$(git -C vendor/lib rev-parse HEAD)\" = {commit}")
}

/// Runs `lines` as one gate at `commit`: each passes, and in `tree` (the repository's warm
/// tree, not a scratch checkout).
async fn gate_in(run: &ScratchRun, commit: &str, lines: &[&str], tree: &Path) {
    let results = gate(run, commit, lines).await;
    assert_all_passed(&results);
    assert_eq!(Path::new(&results[0].dir), tree);
}

fn assert_all_passed(results: &[CommandResult]) {
    assert!(!results.is_empty());
    for r in results {
        assert!(r.passed, "{} failed ({}): {}", r.line, r.exit, r.output);
    }
}

/// The repository's warm tree for the gate.
fn warm_tree(worktrees: &Path, repo: &Path) -> PathBuf {
    let root = flotilla::git::slots::repository_dir(worktrees, flotilla::git::warm::WARM_DIR, repo)
        .unwrap();
    flotilla::git::warm::tree_dir(&root, WarmSlot::Gate)
}

/// A commit on main's tip, with no ref moved, whose tree is main's with `entries`
/// (`mode,id,path`, as `git update-index --cacheinfo` takes them) put in.
fn candidate(repo: &Path, entries: &[String], message: &str) -> String {
    let index = tempfile::NamedTempFile::new().unwrap();
    let with_index = |args: &[&str]| {
        let out = Command::new("git")
            .current_dir(repo)
            .args(args)
            .env("GIT_INDEX_FILE", index.path())
            .env("GIT_AUTHOR_NAME", "agent")
            .env("GIT_AUTHOR_EMAIL", "agent@example.com")
            .env("GIT_COMMITTER_NAME", "agent")
            .env("GIT_COMMITTER_EMAIL", "agent@example.com")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    with_index(&["read-tree", "main"]);
    for entry in entries {
        with_index(&["update-index", "--add", "--cacheinfo", entry]);
    }
    let tree = with_index(&["write-tree"]);
    with_index(&["commit-tree", &tree, "-p", "main", "-m", message])
}

#[tokio::test]
async fn the_repositorys_next_run_gates_in_the_tree_the_last_run_left() {
    let tmp = tempfile::tempdir().unwrap();
    let (repo, worktrees) = (tmp.path().join("repo"), tmp.path().join("worktrees"));
    init_repo(&repo);
    std::fs::write(repo.join(".gitignore"), "target/\n").unwrap();
    git(&repo, &["add", ".gitignore"]);
    git(&repo, &["commit", "-qm", "ignore target"]);
    let blob = git(&repo, &["hash-object", "-w", "--stdin"]);
    let first = candidate(&repo, &[format!("100644,{blob},c.txt")], "first");

    gate_in(
        &gate_run(&repo, &worktrees, "run-1"),
        &first,
        &["mkdir -p target && echo built > target/out"],
        &warm_tree(&worktrees, &repo),
    )
    .await;

    // Another run of the repository: a GitMerge of its own, the first run's scratch gone.
    let _ = std::fs::remove_dir_all(worktrees.join("run-1"));
    let second = candidate(&repo, &[format!("100644,{blob},d.txt")], "second");
    gate_in(
        &gate_run(&repo, &worktrees, "run-2"),
        &second,
        &[
            "test \"$(cat target/out)\" = built",
            &format!("test \"$(git rev-parse HEAD)\" = {second}"),
            "test ! -e c.txt && test -e d.txt",
        ],
        &warm_tree(&worktrees, &repo),
    )
    .await;
    let root =
        flotilla::git::slots::repository_dir(&worktrees, flotilla::git::warm::WARM_DIR, &repo)
            .unwrap();
    let status = flotilla::git::warm::describe(&root).unwrap();
    assert!(status.contains(&second[..7]), "{status}");

    // gc keeps a live repository's warm trees and removes a gone one's.
    let kept = flotilla::git::slots::stale_repository_dirs(
        &worktrees,
        flotilla::git::warm::WARM_DIR,
        true,
    );
    assert!(kept.is_empty(), "{kept:?}");
    assert!(root.is_dir());
    std::fs::remove_dir_all(repo.join(".git")).unwrap();
    let stale = flotilla::git::slots::stale_repository_dirs(
        &worktrees,
        flotilla::git::warm::WARM_DIR,
        true,
    );
    assert_eq!(stale, vec![root.clone()]);
    assert!(
        !root.exists(),
        "the gone repository's warm trees are removed"
    );
}

/// A repository whose `vendor/lib` is a submodule the user's checkout holds, at `lib`'s
/// first commit; `lib`'s second commit is in the target's copy of it too.
struct WithSubmodule {
    _tmp: tempfile::TempDir,
    repo: PathBuf,
    worktrees: PathBuf,
    lib_first: String,
    lib_second: String,
}

fn with_submodule() -> WithSubmodule {
    let tmp = tempfile::tempdir().unwrap();
    let (lib, repo) = (tmp.path().join("lib"), tmp.path().join("repo"));
    std::fs::create_dir_all(&lib).unwrap();
    git(&lib, &["init", "-q", "-b", "main"]);
    std::fs::write(lib.join("l.txt"), "one\n").unwrap();
    std::fs::write(lib.join(".gitignore"), "build/\n").unwrap();
    git(&lib, &["add", "l.txt", ".gitignore"]);
    git(&lib, &["commit", "-qm", "one"]);
    let lib_first = git(&lib, &["rev-parse", "HEAD"]);
    std::fs::write(lib.join("l.txt"), "two\n").unwrap();
    git(&lib, &["commit", "-qam", "two"]);
    let lib_second = git(&lib, &["rev-parse", "HEAD"]);
    init_repo(&repo);
    git(
        &repo,
        &[
            "submodule",
            "add",
            "-q",
            lib.to_str().unwrap(),
            "vendor/lib",
        ],
    );
    git(&repo.join("vendor/lib"), &["checkout", "-q", &lib_first]);
    git(&repo, &["add", "vendor/lib"]);
    git(&repo, &["commit", "-qm", "vendor lib"]);
    // The library's own origin goes: the warm tree must need nothing but the target.
    std::fs::remove_dir_all(&lib).unwrap();
    let worktrees = tmp.path().join("worktrees");
    WithSubmodule {
        _tmp: tmp,
        repo,
        worktrees,
        lib_first,
        lib_second,
    }
}

#[tokio::test]
async fn submodules_are_checked_out_at_the_commit_each_candidate_records() {
    let s = with_submodule();
    let run = gate_run(&s.repo, &s.worktrees, "run");
    let blob = git(&s.repo, &["hash-object", "-w", "--stdin"]);
    let first = candidate(&s.repo, &[format!("100644,{blob},c.txt")], "first");
    gate_in(
        &run,
        &first,
        &[
            &lib_at(&s.lib_first),
            "test \"$(cat vendor/lib/l.txt)\" = one",
            "test -z \"$(git status --porcelain)\"",
            // What a gate leaves in the submodule: a changed file, an untracked one.
            "echo poisoned > vendor/lib/l.txt && echo junk > vendor/lib/junk",
        ],
        &warm_tree(&s.worktrees, &s.repo),
    )
    .await;

    // The next candidate moves the submodule to lib's second commit.
    let second = candidate(
        &s.repo,
        &[format!("160000,{},vendor/lib", s.lib_second)],
        "bump lib",
    );
    gate_in(
        &run,
        &second,
        &[
            &lib_at(&s.lib_second),
            "test \"$(cat vendor/lib/l.txt)\" = two",
            "test ! -e vendor/lib/junk",
            "test -z \"$(git status --porcelain)\"",
            "echo poisoned > vendor/lib/l.txt",
        ],
        &warm_tree(&s.worktrees, &s.repo),
    )
    .await;

    // Back at the first commit: the tracked file the gate changed is rewritten.
    gate_in(
        &run,
        &first,
        &[
            &lib_at(&s.lib_first),
            "test \"$(cat vendor/lib/l.txt)\" = one",
            "test -z \"$(git status --porcelain)\"",
            // Poisoned while the submodule's commit stays, and a build output kept.
            "echo poisoned > vendor/lib/l.txt",
            "mkdir -p vendor/lib/build && echo b > vendor/lib/build/out",
        ],
        &warm_tree(&s.worktrees, &s.repo),
    )
    .await;

    // The same candidate again: the submodule's tracked file is back, its ignored build
    // output still there.
    gate_in(
        &run,
        &first,
        &[
            "test \"$(cat vendor/lib/l.txt)\" = one",
            "test \"$(cat vendor/lib/build/out)\" = b",
            "test -z \"$(git -C vendor/lib status --porcelain)\"",
        ],
        &warm_tree(&s.worktrees, &s.repo),
    )
    .await;
    assert_checkout_untouched(&s.repo);
    assert_eq!(
        git(&s.repo.join("vendor/lib"), &["rev-parse", "HEAD"]),
        s.lib_first,
        "the user's submodule stays where it was"
    );
}

#[tokio::test]
async fn a_submodule_of_a_submodule_is_checked_out_too() {
    let tmp = tempfile::tempdir().unwrap();
    let (inner, lib, repo) = (
        tmp.path().join("inner"),
        tmp.path().join("lib"),
        tmp.path().join("repo"),
    );
    for (dir, file) in [(&inner, "i.txt"), (&lib, "l.txt")] {
        std::fs::create_dir_all(dir).unwrap();
        git(dir, &["init", "-q", "-b", "main"]);
        std::fs::write(dir.join(file), "content\n").unwrap();
        git(dir, &["add", file]);
        git(dir, &["commit", "-qm", "one"]);
    }
    git(
        &lib,
        &[
            "submodule",
            "add",
            "-q",
            inner.to_str().unwrap(),
            "deps/inner",
        ],
    );
    git(&lib, &["commit", "-qm", "inner"]);
    init_repo(&repo);
    git(
        &repo,
        &[
            "submodule",
            "add",
            "-q",
            lib.to_str().unwrap(),
            "vendor/lib",
        ],
    );
    git(
        &repo,
        &["submodule", "update", "-q", "--init", "--recursive"],
    );
    git(&repo, &["commit", "-qm", "vendor lib"]);
    std::fs::remove_dir_all(&inner).unwrap();
    std::fs::remove_dir_all(&lib).unwrap();
    let worktrees = tmp.path().join("worktrees");
    let blob = git(&repo, &["hash-object", "-w", "--stdin"]);
    let cand = candidate(&repo, &[format!("100644,{blob},c.txt")], "cand");
    gate_in(
        &gate_run(&repo, &worktrees, "run"),
        &cand,
        &[
            "test \"$(cat vendor/lib/deps/inner/i.txt)\" = content",
            "test -z \"$(git status --porcelain)\"",
        ],
        &warm_tree(&worktrees, &repo),
    )
    .await;
}

/// A gate that puts a git directory of its own, with a hook, in place of a submodule's
/// `.git` file: the next update runs no hook of it, and the submodule is the target's again.
#[tokio::test]
async fn a_git_directory_a_gate_plants_in_a_submodule_is_never_used() {
    let s = with_submodule();
    let run = gate_run(&s.repo, &s.worktrees, "run");
    let blob = git(&s.repo, &["hash-object", "-w", "--stdin"]);
    let cand = candidate(&s.repo, &[format!("100644,{blob},c.txt")], "cand");
    let hook = "#!/bin/sh\necho hooked > \"$GIT_WORK_TREE/../../hooked\"\necho poisoned > l.txt\n";
    let results = gate(
        &run,
        &cand,
        &[
            "rm vendor/lib/.git && git init -q vendor/lib/planted",
            "mv vendor/lib/planted/.git vendor/lib/.git && rmdir vendor/lib/planted",
            &format!("printf '%s' '{hook}' > vendor/lib/.git/hooks/post-checkout"),
            "chmod +x vendor/lib/.git/hooks/post-checkout",
            "git config -f vendor/lib/.git/config core.fsmonitor 'echo fsmonitored > ../../fsmonitored'",
            "git config -f vendor/lib/.git/config core.hooksPath .git/hooks",
        ],
    )
    .await;
    assert_all_passed(&results);
    gate_in(
        &run,
        &cand,
        &[
            "test ! -e hooked && test ! -e fsmonitored",
            "test \"$(cat vendor/lib/l.txt)\" = one",
            "test -f vendor/lib/.git",
            &lib_at(&s.lib_first),
        ],
        &warm_tree(&s.worktrees, &s.repo),
    )
    .await;
}

/// A `.gitattributes` a gate leaves untracked does not change how the next update writes
/// a tracked file: the file is the commit's bytes, and `git status` tells the truth.
#[tokio::test]
async fn an_attributes_file_a_gate_leaves_does_not_convert_tracked_files() {
    let tmp = tempfile::tempdir().unwrap();
    let (repo, worktrees) = (tmp.path().join("repo"), tmp.path().join("worktrees"));
    init_repo(&repo);
    std::fs::create_dir_all(repo.join("src")).unwrap();
    std::fs::write(repo.join("src/a.txt"), "one\ntwo\n").unwrap();
    git(&repo, &["add", "src/a.txt"]);
    git(&repo, &["commit", "-qm", "a"]);
    let blob = git(&repo, &["hash-object", "-w", "--stdin"]);
    let cand = candidate(&repo, &[format!("100644,{blob},c.txt")], "cand");
    let run = gate_run(&repo, &worktrees, "run");
    let results = gate(
        &run,
        &cand,
        &[
            "printf '*.txt eol=crlf\\n' > src/.gitattributes",
            "echo changed >> src/a.txt",
        ],
    )
    .await;
    assert_all_passed(&results);
    for _ in 0..2 {
        gate_in(
            &run,
            &cand,
            &[
                "test ! -e src/.gitattributes",
                "printf 'one\\ntwo\\n' | cmp - src/a.txt",
                "test -z \"$(git status --porcelain)\"",
            ],
            &warm_tree(&worktrees, &repo),
        )
        .await;
    }
}

/// What a candidate's `.gitmodules` says is not followed: a URL of its own, `update = none`
/// or `update = !command`, a second submodule nobody initialised.
#[tokio::test]
async fn a_candidates_gitmodules_is_not_followed() {
    let s = with_submodule();
    let elsewhere = s.worktrees.parent().unwrap().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    git(&elsewhere, &["init", "-q"]);
    let run = gate_run(&s.repo, &s.worktrees, "run");
    for (i, update) in ["none", "!touch commanded", "merge"]
        .into_iter()
        .enumerate()
    {
        let modules = format!(
            "[submodule \"vendor/lib\"]\n\tpath = vendor/lib\n\turl = {0}\n\tupdate = {update}\n\
             [submodule \"other\"]\n\tpath = other\n\turl = {0}\n",
            elsewhere.display()
        );
        let path = s
            .worktrees
            .parent()
            .unwrap()
            .join(format!("gitmodules-{i}"));
        std::fs::write(&path, modules).unwrap();
        let blob = git(&s.repo, &["hash-object", "-w", path.to_str().unwrap()]);
        // Each moves the submodule: to lib's second commit, back, and forth again.
        let (lib, text) = match i % 2 {
            0 => (&s.lib_second, "two"),
            _ => (&s.lib_first, "one"),
        };
        let cand = candidate(
            &s.repo,
            &[
                format!("100644,{blob},.gitmodules"),
                format!("160000,{lib},vendor/lib"),
                format!("160000,{},other", s.lib_second),
            ],
            "elsewhere",
        );
        gate_in(
            &run,
            &cand,
            &[
                // The target's copy of the library, at the recorded commit.
                &lib_at(lib),
                &format!("test \"$(cat vendor/lib/l.txt)\" = {text}"),
                "test ! -e commanded && test ! -e vendor/lib/commanded",
                // The submodule nobody initialised is empty: also of what the last gate
                // left there, a git directory with an fsmonitor among it.
                "test -d other && test -z \"$(ls -A other)\"",
                "echo evil > other/evil.sh && git init -q other",
                "git config -f other/.git/config core.fsmonitor 'echo ran > ../monitored'",
                "test ! -e monitored",
            ],
            &warm_tree(&s.worktrees, &s.repo),
        )
        .await;
    }
}

#[tokio::test]
async fn lfs_files_are_smudged_from_the_targets_lfs_objects() {
    assert!(
        Command::new("git-lfs").arg("version").output().is_ok(),
        "git-lfs is needed (apt-get install git-lfs; .ci/run installs it)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let (repo, worktrees) = (tmp.path().join("repo"), tmp.path().join("worktrees"));
    init_repo(&repo);
    git(&repo, &["lfs", "install", "--local"]);
    git(&repo, &["lfs", "track", "*.bin"]);
    std::fs::write(repo.join("data.bin"), "the large file's content\n").unwrap();
    git(&repo, &["add", ".gitattributes", "data.bin"]);
    git(&repo, &["commit", "-qm", "lfs"]);
    let stored = git(&repo, &["cat-file", "-p", "HEAD:data.bin"]);
    assert!(stored.starts_with("version https://git-lfs"), "{stored}");
    let blob = git(&repo, &["hash-object", "-w", "--stdin"]);
    let cand = candidate(&repo, &[format!("100644,{blob},c.txt")], "cand");
    let run = gate_run(&repo, &worktrees, "run");
    gate_in(
        &run,
        &cand,
        &[
            "test \"$(cat data.bin)\" = \"the large file's content\"",
            "test -z \"$(git status --porcelain)\"",
        ],
        &warm_tree(&worktrees, &repo),
    )
    .await;
    assert_checkout_untouched(&repo);

    // A pointer to an object the repository lacks, and a `.lfsconfig` naming a server: the
    // file stays a pointer, nothing is asked of that server, and the warm tree is kept.
    let pointer = "version https://git-lfs.github.com/spec/v1\n\
                   oid sha256:0000000000000000000000000000000000000000000000000000000000000001\n\
                   size 12\n";
    let path = tmp.path().join("pointer");
    std::fs::write(&path, pointer).unwrap();
    let missing = git(&repo, &["hash-object", "-w", path.to_str().unwrap()]);
    std::fs::write(&path, "[lfs]\n\turl = http://127.0.0.1:9/attacker\n").unwrap();
    let lfsconfig = git(&repo, &["hash-object", "-w", path.to_str().unwrap()]);
    let cand = candidate(
        &repo,
        &[
            format!("100644,{missing},missing.bin"),
            format!("100644,{lfsconfig},.lfsconfig"),
        ],
        "missing",
    );
    gate_in(
        &run,
        &cand,
        &[
            "head -1 missing.bin | grep -q '^version https://git-lfs'",
            "test \"$(cat data.bin)\" = \"the large file's content\"",
            "! grep -rqs attacker .git/lfs/logs",
        ],
        &warm_tree(&worktrees, &repo),
    )
    .await;
}
