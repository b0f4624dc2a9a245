//! `flotilla gc` (and the daemon's start-up collection): what finished runs left in every
//! repository the journal knows and under the state directory, found by name, removed or,
//! in a dry run, listed (ADR-021). It must not know live runs beyond their ids.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use actix::prelude::*;
use flotilla_actors::ports::{JournalError, RepoError};
use flotilla_actors::protocol::{CheckoutSync, RunId};
use tracing::{info, warn};

use super::{CollectGarbage, GcReport, Supervisor};
use crate::git::target::TargetBranch;

/// A directory under the worktrees root that no run of the journal accounts for is only
/// removed once its run id (a UUIDv7, a timestamp first) is this old: a run being
/// submitted right now has an id, and soon a directory, before the journal lists it.
const UNKNOWN_RUN_MIN_AGE_MS: u64 = 10 * 60 * 1000;

/// Why a collection stopped before it began removing (what it could not remove in one
/// repository is in the report's `errors`, and the others are still collected).
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    #[error("cannot read the runs: {0}")]
    ReadRuns(#[source] JournalError),
    #[error("the git thread failed: {0}")]
    GitThread(#[from] tokio::task::JoinError),
}

/// Not atomic: the collection works on a snapshot (the runs live and the runs finished
/// when it started) and runs off the Supervisor, so runs start and end meanwhile. A run
/// that finishes meanwhile is swept by its own end.
impl Handler<CollectGarbage> for Supervisor {
    type Result = ResponseFuture<Result<GcReport, GcError>>;

    fn handle(&mut self, msg: CollectGarbage, _: &mut Context<Self>) -> Self::Result {
        let live: HashSet<RunId> = self.runs.keys().copied().collect();
        // Without their configs (ADR-040): only the branch each lands on is read out of it.
        let records = self.journal.run_list_with_branches();
        let root = self.worktrees.clone();
        let transcripts = self.transcripts.as_ref().map(|t| t.root().to_path_buf());
        Box::pin(async move {
            let records = records.await.map_err(GcError::ReadRuns)?;
            let dry_run = msg.dry_run;
            let with_transcripts = msg.transcripts;
            // Known runs, and whether each is over (finished and not live).
            let runs: HashMap<RunId, bool> = records
                .iter()
                .map(|(r, _)| (r.id, r.outcome.is_some() && !live.contains(&r.id)))
                .collect();
            let mut report = collect_garbage(live, records, root, msg).await?;
            if let Some(transcripts) = transcripts.filter(|_| with_transcripts) {
                collect_transcripts(&transcripts, &runs, dry_run, &mut report).await;
            }
            Ok(report)
        })
    }
}

async fn collect_garbage(
    live: HashSet<RunId>,
    records: Vec<crate::journal::RunWithBranch>,
    root: PathBuf,
    msg: CollectGarbage,
) -> Result<GcReport, GcError> {
    let (records, branches): (Vec<_>, Vec<_>) = records.into_iter().unzip();
    let started_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let known: HashMap<RunId, &crate::journal::RunRecord> =
        records.iter().map(|r| (r.id, r)).collect();
    let over: HashSet<RunId> = records
        .iter()
        .filter(|r| r.outcome.is_some() && !live.contains(&r.id))
        .map(|r| r.id)
        .collect();
    let mut repos: Vec<PathBuf> = records.iter().map(|r| r.repo.clone()).collect();
    repos.sort();
    repos.dedup();
    // The branches each repository's runs land on (ADR-022): their checkouts are healed.
    let mut targets: HashMap<&std::path::Path, std::collections::BTreeSet<TargetBranch>> =
        HashMap::new();
    for (record, branch) in records.iter().zip(&branches) {
        if let Ok(target) = TargetBranch::of_run(branch.as_deref()) {
            targets.entry(&record.repo).or_default().insert(target);
        }
    }
    let mut report = GcReport {
        dry_run: msg.dry_run,
        ..GcReport::default()
    };
    if msg.progress {
        info!(
            finished_runs = over.len(),
            repositories = repos.len(),
            "collecting what finished runs left behind"
        );
    }
    // Repository by repository: locks, worktrees, branches of the finished runs.
    let mut gone: HashSet<PathBuf> = HashSet::new();
    // Repositories whose leftovers could not be read or removed: their runs' directories
    // stay until a collection succeeds (a worktree's directory goes with its record).
    let mut failed: HashSet<PathBuf> = HashSet::new();
    let mut planned_dirs: HashSet<PathBuf> = HashSet::new();
    for (done, repo) in repos.iter().enumerate() {
        let over = over.clone();
        let (path, root_dir, dry_run) = (repo.clone(), root.clone(), msg.dry_run);
        let found = tokio::task::spawn_blocking(move || {
            let found = crate::git::leftovers::leftovers(&path, &root_dir, &over)?;
            if dry_run {
                Ok(found)
            } else {
                crate::git::leftovers::remove_leftovers(&path, &found)
            }
        })
        .await?;
        let found = match found {
            Ok(found) => found,
            Err(RepoError::NotARepository(_)) => {
                gone.insert(repo.clone());
                continue;
            }
            Err(e) => {
                report.errors.push(format!("{}: {e}", repo.display()));
                failed.insert(repo.clone());
                continue;
            }
        };
        if !msg.dry_run {
            for target in targets.get(repo.as_path()).into_iter().flatten() {
                match crate::git::checkout::heal_repository(repo.clone(), target.clone()).await {
                    Ok(Some(CheckoutSync::Behind { at, paths })) => warn!(
                        repo = %repo.display(), %target, %at, ?paths,
                        "the checkout of the target branch is behind it with changes of its own: left as it is"
                    ),
                    Ok(_) => {}
                    Err(e) => report.errors.push(format!(
                        "{}: healing the checkout of {target}: {e}",
                        repo.display()
                    )),
                }
            }
        }
        if msg.progress && !found.is_empty() {
            info!(
                repo = %repo.display(),
                done = done + 1,
                of = repos.len(),
                worktrees = found.worktrees.len(),
                branches = found.branches.len(),
                locks = found.locks.len(),
                "collected a repository's leftovers"
            );
        }
        for (_, path) in found.worktrees {
            planned_dirs.insert(path.clone());
            report.worktrees.push(path.display().to_string());
        }
        report.branches.extend(found.branches);
        report
            .locks
            .extend(found.locks.iter().map(|p| p.display().to_string()));
    }
    // The state directory: finished runs' directories (what is left in them), and
    // directories no run accounts for.
    let Ok(mut entries) = tokio::fs::read_dir(&root).await else {
        return Ok(report); // nothing was ever made
    };
    let mut doomed: Vec<PathBuf> = Vec::new();
    // The repositories' pools of parked directories (ADR-052): only those of repositories
    // that are gone.
    // Their warm trees (ADR-055) likewise.
    let (pools, remove_pools) = (root.clone(), !msg.dry_run);
    if let Ok(stale) = tokio::task::spawn_blocking(move || {
        let mut stale = crate::git::slots::stale_pools(&pools, remove_pools);
        stale.extend(crate::git::slots::stale_repository_dirs(
            &pools,
            crate::git::warm::WARM_DIR,
            remove_pools,
        ));
        stale
    })
    .await
    {
        report
            .unknown
            .extend(stale.iter().map(|p| p.display().to_string()));
    }
    while let Ok(Some(entry)) = entries.next_entry().await {
        let dir = entry.path();
        if entry.file_name() == crate::git::slots::POOL_DIR
            || entry.file_name() == crate::git::warm::WARM_DIR
        {
            continue;
        }
        let uuid = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<uuid::Uuid>().ok());
        let run = uuid.map(RunId::from_uuid);
        match run.and_then(|run| known.get(&run)) {
            Some(record) if failed.contains(&record.repo) => {}
            Some(record) if over.contains(&record.id) && !gone.contains(&record.repo) => {
                if let Ok(mut inside) = tokio::fs::read_dir(&dir).await {
                    while let Ok(Some(item)) = inside.next_entry().await {
                        // Parked directories and snapshots (ADR-044) are no worktree.
                        if !planned_dirs.contains(&item.path())
                            && !crate::git::slots::is_slot_entry(&item.file_name())
                        {
                            report.worktrees.push(item.path().display().to_string());
                        }
                    }
                }
                doomed.push(dir);
            }
            Some(record) if over.contains(&record.id) => {
                report.unknown.push(dir.display().to_string());
                doomed.push(dir);
            }
            Some(_) => {} // live, unfinished, or its repository failed
            None => {
                let created_ms = uuid
                    .and_then(|u| u.get_timestamp())
                    .map(|t| {
                        let (secs, nanos) = t.to_unix();
                        secs * 1000 + u64::from(nanos) / 1_000_000
                    })
                    .unwrap_or(0);
                if started_ms.saturating_sub(created_ms) >= UNKNOWN_RUN_MIN_AGE_MS {
                    report.unknown.push(dir.display().to_string());
                    doomed.push(dir);
                }
            }
        }
    }
    if !msg.dry_run {
        for dir in doomed {
            match tokio::fs::remove_dir_all(&dir).await {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    report.errors.push(format!("{}: {e}", dir.display()))
                }
                _ => {}
            }
        }
    }
    report.worktrees.sort();
    report.worktrees.dedup();
    report.unknown.sort();
    if msg.progress {
        info!(
            worktrees = report.worktrees.len(),
            branches = report.branches.len(),
            locks = report.locks.len(),
            unknown = report.unknown.len(),
            errors = report.errors.len(),
            "collection done"
        );
    }
    Ok(report)
}

/// Removes the transcripts of runs that are over (ADR-036), and of runs the journal does not
/// know once their id is old enough (as for worktrees).
async fn collect_transcripts(
    root: &std::path::Path,
    runs: &HashMap<RunId, bool>,
    dry_run: bool,
    report: &mut GcReport,
) {
    let Ok(mut entries) = tokio::fs::read_dir(root).await else {
        return; // none was ever written
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    while let Ok(Some(entry)) = entries.next_entry().await {
        let dir = entry.path();
        let uuid = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<uuid::Uuid>().ok());
        let doomed = match uuid.map(RunId::from_uuid).and_then(|run| runs.get(&run)) {
            Some(over) => *over,
            None => {
                let created_ms = uuid
                    .and_then(|u| u.get_timestamp())
                    .map(|t| {
                        let (secs, nanos) = t.to_unix();
                        secs * 1000 + u64::from(nanos) / 1_000_000
                    })
                    .unwrap_or(0);
                now_ms.saturating_sub(created_ms) >= UNKNOWN_RUN_MIN_AGE_MS
            }
        };
        if !doomed {
            continue;
        }
        report.transcripts.push(dir.display().to_string());
        if !dry_run
            && let Err(e) = tokio::fs::remove_dir_all(&dir).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            report.errors.push(format!("{}: {e}", dir.display()));
        }
    }
    report.transcripts.sort();
}
