//! Times the merge queue's git steps alone, per landing, on a generated repository with a
//! checkout (ADR-045): building a one-branch candidate, moving main with the user's
//! checkout, and the checkout sync after it. No daemon, no workers, no agents.
//!
//! `cargo run --release --example landing_steps -- FILES TASKS [rebase|squash|merge]`
//! prints the median and total milliseconds of each step, and, on the same trees, libgit2's
//! whole-tree calls the landing made before ADR-045 beside the calls it makes now.

// A measurement tool: a failed unwrap is a failed measurement (the lint policy, ADR-027).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Instant;

use flotilla::bench::landing_repo::{checkout_copy, template};
use flotilla::git::merge::GitMerge;
use flotilla::git::reader::GitRepo;
use flotilla::git::target::TargetBranch;
use flotilla::git::tree_delta;
use flotilla_actors::ports::{BuildOutcome, LandItem, LandMode, MainRef, MergeGit};
use flotilla_actors::protocol::TaskId;

fn branch_adding(repo: &git2::Repository, from: git2::Oid, name: &str, path: &str) -> git2::Oid {
    let base = repo.find_commit(from).unwrap();
    let blob = repo
        .blob(format!("the work of {name}\n").as_bytes())
        .unwrap();
    let mut update = git2::build::TreeUpdateBuilder::new();
    update.upsert(path, blob, git2::FileMode::Blob);
    let tree = update.create_updated(repo, &base.tree().unwrap()).unwrap();
    let tree = repo.find_tree(tree).unwrap();
    let sig = git2::Signature::now("agent", "agent@localhost").unwrap();
    let commit = repo
        .commit(None, &sig, &sig, &format!("add {path}"), &tree, &[&base])
        .unwrap();
    repo.branch(name, &repo.find_commit(commit).unwrap(), true)
        .unwrap();
    commit
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let files: usize = args.get(1).map_or(1000, |a| a.parse().unwrap());
    let tasks: usize = args.get(2).map_or(20, |a| a.parse().unwrap());
    let mode = match args.get(3).map(String::as_str) {
        Some("squash") => LandMode::Squash,
        Some("merge") => LandMode::Merge,
        _ => LandMode::Rebase,
    };
    let cache = Path::new("/tmp/landing-steps-cache");
    let tpl = template(cache, files).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let repo_path = dir.path().join("repo");
    checkout_copy(&tpl, &repo_path).unwrap();
    let repo = git2::Repository::open(&repo_path).unwrap();
    let start = repo.refname_to_id("refs/heads/main").unwrap();
    // Every branch leaves main's first commit, as tasks dispatched together do.
    let heads: Vec<(String, git2::Oid)> = (0..tasks)
        .map(|i| {
            let name = format!("flotilla/steps-t{i}");
            let head = branch_adding(&repo, start, &name, &format!("bench/t{i}.txt"));
            (name, head)
        })
        .collect();
    let target = TargetBranch::new("main").unwrap();
    let merge = GitMerge::new(&repo_path, dir.path().join("scratch"), target.clone());
    let main = GitRepo::new(&repo_path, target);
    let (mut build, mut moved, mut synced) = (Vec::new(), Vec::new(), Vec::new());
    let (mut old_merge, mut new_merge) = (Vec::new(), Vec::new());
    let (mut old_diff, mut new_diff, mut old_index) = (Vec::new(), Vec::new(), Vec::new());
    let ms = |at: Instant| at.elapsed().as_secs_f64() * 1e3;
    for (i, (branch, head)) in heads.iter().enumerate() {
        let tip = repo.refname_to_id("refs/heads/main").unwrap().to_string();
        let item = LandItem {
            task: TaskId::root(i as u32 + 1),
            branch: branch.clone(),
            head: head.to_string(),
            subject: format!("task t{i}"),
            trailer: format!("Flotilla-Task: steps/t{i}"),
            squash: false,
        };
        let at = Instant::now();
        let built = merge.build(tip.clone(), vec![item], mode).await.unwrap();
        build.push(at.elapsed().as_secs_f64() * 1e3);
        let BuildOutcome::Built { tip: candidate, .. } = built else {
            panic!("{built:?}");
        };
        // The pick's merge, whole (before) and by difference (now), on the same trees.
        let tip_tree = repo
            .find_commit(git2::Oid::from_str(&tip).unwrap())
            .unwrap()
            .tree()
            .unwrap();
        let commit = repo.find_commit(*head).unwrap();
        let parent_tree = commit.parent(0).unwrap().tree().unwrap();
        let commit_tree = commit.tree().unwrap();
        let at = Instant::now();
        let mut index = repo
            .merge_trees(&parent_tree, &tip_tree, &commit_tree, None)
            .unwrap();
        let whole = index.write_tree_to(&repo).unwrap();
        old_merge.push(ms(at));
        let at = Instant::now();
        let tree_delta::Merged::Clean(by_difference) =
            tree_delta::merge_trees(&repo, &parent_tree, &tip_tree, &commit_tree).unwrap()
        else {
            panic!("a conflict");
        };
        new_merge.push(ms(at));
        assert_eq!(whole, by_difference);
        let cand_tree = repo
            .find_commit(git2::Oid::from_str(&candidate).unwrap())
            .unwrap()
            .tree()
            .unwrap();
        let at = Instant::now();
        let n = repo
            .diff_tree_to_tree(Some(&tip_tree), Some(&cand_tree), None)
            .unwrap()
            .deltas()
            .len();
        old_diff.push(ms(at));
        let at = Instant::now();
        assert_eq!(
            tree_delta::changed_paths(&repo, &tip_tree, &cand_tree)
                .unwrap()
                .len(),
            n
        );
        new_diff.push(ms(at));
        let at = Instant::now();
        main.compare_and_swap(tip.clone(), candidate.clone())
            .await
            .unwrap();
        moved.push(at.elapsed().as_secs_f64() * 1e3);
        let at = Instant::now();
        merge.sync_checkout(tip, candidate).await.unwrap();
        synced.push(at.elapsed().as_secs_f64() * 1e3);
        // The sync's look before: the whole index against the whole tip tree.
        let at = Instant::now();
        let index = git2::Repository::open(&repo_path).unwrap().index().unwrap();
        let same = repo
            .diff_tree_to_index(Some(&cand_tree), Some(&index), None)
            .unwrap()
            .deltas()
            .len();
        old_index.push(ms(at));
        assert_eq!(same, 0);
    }
    for (name, v) in [
        ("build", &mut build),
        ("move main", &mut moved),
        ("sync", &mut synced),
        ("merge, whole (before)", &mut old_merge),
        ("merge, by difference", &mut new_merge),
        ("tree diff, whole (before)", &mut old_diff),
        ("tree diff, by difference", &mut new_diff),
        ("sync's index look (before)", &mut old_index),
    ] {
        let total: f64 = v.iter().sum();
        println!(
            "{files} files {mode:?}: {name:<27} median {:7.2} ms  total {:8.1} ms",
            median(v),
            total
        );
    }
}
