//! Times the merge queue's git steps alone, per landing, on a generated repository with a
//! checkout (ADR-045): building a one-branch candidate, moving main with the user's
//! checkout, and the checkout sync after it. No daemon, no workers, no agents.
//!
//! `cargo run --release --example landing_steps -- FILES TASKS [rebase|squash|merge]`
//! prints the median and total milliseconds of each step.

// A measurement tool: a failed unwrap is a failed measurement (the lint policy, ADR-027).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Instant;

use flotilla::bench::landing_repo::{checkout_copy, template};
use flotilla::git::merge::GitMerge;
use flotilla::git::reader::GitRepo;
use flotilla::git::target::TargetBranch;
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
        let at = Instant::now();
        main.compare_and_swap(tip.clone(), candidate.clone())
            .await
            .unwrap();
        moved.push(at.elapsed().as_secs_f64() * 1e3);
        let at = Instant::now();
        merge.sync_checkout(tip, candidate).await.unwrap();
        synced.push(at.elapsed().as_secs_f64() * 1e3);
    }
    for (name, v) in [
        ("build", &mut build),
        ("move main", &mut moved),
        ("sync", &mut synced),
    ] {
        let total: f64 = v.iter().sum();
        println!(
            "{files} files {mode:?}: {name:<9} median {:7.2} ms  total {:8.1} ms",
            median(v),
            total
        );
    }
}
