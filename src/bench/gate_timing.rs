//! `flotilla bench --gate-timing [PATH]`: a real project's build as the merge gate, cold
//! against warm (issue 24 items 6 and 7, ADR-041, ADR-042). The project (by default the git
//! repository the bench is run from: flotilla's own, run from its checkout) is cloned at its
//! HEAD, and a chain of candidates is made on it, each a commit that appends a comment line
//! to one Rust file (`src/lib.rs`, `src/main.rs`, or the first `.rs` file), as a task's
//! landing would change a file. Each candidate is gated the way the merge queue gates it:
//! [`ScratchRun`] on [`GitMerge`] with the run's default sandbox ([`ConfinedRunner`]), once
//! with `[merge] warm_gate` off (cold: each candidate in a fresh scratch checkout, nothing
//! carried over) and once on (warm: ADR-042's gate tree, brought to each candidate by git).
//! The time of each gate is the whole `ScratchRun::run`: checkout or update, then the
//! command. Nothing here starts a daemon: what is timed is the gate, not the queue.
//!
//! The default command, `cargo check --offline --quiet`, needs nothing from the network:
//! the sandbox shows the user's cargo registry read-only, so it is shared and never fetched
//! again, and a dependency missing from it fails the gate (and the bench, saying so).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_actors::actors::scratch_commands::{NamedCommand, ScratchRun};
use flotilla_actors::ports::WarmSlot;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::git::merge::GitMerge;
use crate::git::target::TargetBranch;
use crate::process::ConfinedRunner;
use crate::sandbox::{SandboxConfig, SandboxPolicy};
use crate::text_safety::terminal_safe;

/// The gate `--gate-timing` runs unless told otherwise.
pub const DEFAULT_COMMAND: &str = "cargo check --offline --quiet";
/// How long one gate may take (a cold build of a big project on a busy machine).
const GATE_TIMEOUT: Duration = Duration::from_secs(3600);
/// The warm trees' disk budget: `[merge] warm_budget_mb`'s default.
const WARM_BUDGET_MB: u64 = 20 * 1024;
/// Bytes of a failed gate's output shown in the error.
const OUTPUT_TAIL: usize = 2000;

/// What `--gate-timing` measures.
#[derive(Debug, Clone)]
pub struct GateTimingOptions {
    /// A git repository (its work tree or `.git`); its HEAD commit is what is cloned.
    pub project: PathBuf,
    /// Candidates gated per mode (the first builds everything in either mode).
    pub candidates: usize,
    /// The gate (`sh -c`), run at the top of the candidate's tree.
    pub command: String,
    /// Where the clones and the gate trees are made (and removed after).
    pub dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum GateTimingError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("git, {what}: {source}")]
    Git {
        what: String,
        #[source]
        source: git2::Error,
    },
    #[error("{0} has no Rust file to change (no src/lib.rs, src/main.rs or other .rs file)")]
    NoRustFile(PathBuf),
    #[error("no checkout could be made for candidate {candidate}: {reason}")]
    Checkout { candidate: usize, reason: String },
    #[error("the gate failed on candidate {candidate} ({mode}): {exit}\n{output}")]
    GateFailed {
        candidate: usize,
        mode: &'static str,
        exit: String,
        output: String,
    },
    #[error("candidate {candidate} was not gated in a warm tree (it would not update?)")]
    NotWarm { candidate: usize },
}

fn git_error(what: impl Into<String>) -> impl FnOnce(git2::Error) -> GateTimingError {
    let what = what.into();
    move |source| GateTimingError::Git { what, source }
}

/// Both modes' gate times, in milliseconds, candidate by candidate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GateTimingReport {
    pub project: String,
    pub commit: String,
    pub command: String,
    /// The file each candidate changes.
    pub changed_file: String,
    pub cold_ms: Vec<u64>,
    pub warm_ms: Vec<u64>,
}

impl GateTimingReport {
    /// The median of the candidates after the first (the first, if it is the only one);
    /// of an even count, the mean of the middle two.
    pub fn later_median(times: &[u64]) -> Option<u64> {
        let later = if times.len() > 1 { &times[1..] } else { times };
        let mut sorted = later.to_vec();
        sorted.sort_unstable();
        let low = *sorted.get(sorted.len().checked_sub(1)? / 2)?;
        let high = *sorted.get(sorted.len() / 2)?;
        Some(low / 2 + high / 2 + (low % 2 + high % 2) / 2)
    }

    /// How many times faster the warm gate is than the cold one on later candidates
    /// (issue 24 item 7's target: at least 5).
    pub fn speed_up(&self) -> Option<f64> {
        let cold = Self::later_median(&self.cold_ms)?;
        let warm = Self::later_median(&self.warm_ms)?;
        Some(cold as f64 / (warm.max(1)) as f64)
    }

    /// The report for people.
    pub fn text(&self) -> String {
        let secs = |ms: u64| format!("{:.1} s", ms as f64 / 1000.0);
        let row = |name: &str, times: &[u64]| {
            let each: Vec<String> = times.iter().map(|&t| secs(t)).collect();
            format!(
                "  {name}: first {}, later median {} (each: {})\n",
                times.first().map_or("-".into(), |&t| secs(t)),
                Self::later_median(times).map_or("-".into(), secs),
                each.join(", ")
            )
        };
        let mut text = format!(
            "gate timing: `{}` on {} at {}, {} candidates each changing {}\n",
            terminal_safe(&self.command),
            terminal_safe(&self.project),
            &self.commit[..self.commit.len().min(12)],
            self.cold_ms.len(),
            terminal_safe(&self.changed_file),
        );
        text.push_str(&row("cold (warm_gate = false)", &self.cold_ms));
        text.push_str(&row("warm (warm_gate = true) ", &self.warm_ms));
        if let Some(x) = self.speed_up() {
            text.push_str(&format!(
                "  later candidates: warm {x:.1}x faster than cold (target: at least 5x)\n"
            ));
        }
        text
    }
}

/// Measures `options` cold, then warm. Each mode has a clone and a state directory of its
/// own under `options.dir`, removed when it is done (a cold build's outputs are gigabytes).
pub async fn measure(options: &GateTimingOptions) -> Result<GateTimingReport, GateTimingError> {
    let source = git2::Repository::discover(&options.project)
        .map_err(git_error(format!("opening {}", options.project.display())))?;
    let head = source
        .head()
        .and_then(|h| h.peel_to_commit())
        .map_err(git_error("reading the project's HEAD"))?;
    let changed_file = rust_file(&head.tree().map_err(git_error("reading HEAD's tree"))?)
        .ok_or_else(|| GateTimingError::NoRustFile(options.project.clone()))?;
    let project = source
        .workdir()
        .unwrap_or_else(|| source.path())
        .to_path_buf();
    let commit = head.id().to_string();
    std::fs::create_dir_all(&options.dir).map_err(|source| GateTimingError::Io {
        path: options.dir.clone(),
        source,
    })?;
    let mut report = GateTimingReport {
        project: project.display().to_string(),
        commit,
        command: options.command.clone(),
        changed_file,
        cold_ms: Vec::new(),
        warm_ms: Vec::new(),
    };
    report.cold_ms = one_mode(options, &project, &report, false).await?;
    report.warm_ms = one_mode(options, &project, &report, true).await?;
    Ok(report)
}

async fn one_mode(
    options: &GateTimingOptions,
    project: &Path,
    report: &GateTimingReport,
    warm: bool,
) -> Result<Vec<u64>, GateTimingError> {
    let mode = if warm { "warm" } else { "cold" };
    let work = tempfile::Builder::new()
        .prefix(&format!("gate-{mode}-"))
        .tempdir_in(&options.dir)
        .map_err(|source| GateTimingError::Io {
            path: options.dir.clone(),
            source,
        })?;
    let repo = work.path().join("repo");
    let state = work.path().join("state");
    let candidates = {
        let (project, repo) = (project.to_path_buf(), repo.clone());
        let (commit, file) = (report.commit.clone(), report.changed_file.clone());
        let count = options.candidates;
        tokio::task::spawn_blocking(move || {
            clone_with_candidates(&project, &repo, &commit, &file, count)
        })
        .await
        .map_err(|e| GateTimingError::Checkout {
            candidate: 0,
            reason: format!("the git thread failed: {e}"),
        })??
    };
    let scratch = state.join("scratch");
    let target = TargetBranch::new("main").map_err(|e| GateTimingError::Checkout {
        candidate: 0,
        reason: e.to_string(),
    })?;
    let mut merge = GitMerge::new(&repo, &scratch, target);
    if warm {
        merge = merge.with_warm(WARM_BUDGET_MB);
    }
    // The daemon's own sandbox for a run: its state hidden, the repository's work tree
    // hidden and its `.git` read-only.
    let policy = SandboxPolicy::for_run(
        &SandboxConfig::default(),
        std::slice::from_ref(&state),
        &repo,
    );
    let run = ScratchRun {
        git: Arc::new(merge),
        runner: Arc::new(ConfinedRunner::new(policy)),
        timeout: GATE_TIMEOUT,
        stop_at_first_failure: true,
        slot: WarmSlot::Gate,
    };
    let mut times = Vec::with_capacity(candidates.len());
    for (i, candidate) in candidates.into_iter().enumerate() {
        let number = i + 1;
        let command = NamedCommand {
            name: "gate".into(),
            line: options.command.clone(),
        };
        let started = Instant::now();
        let results = run
            .run(
                candidate,
                "gate".into(),
                vec![command],
                CancellationToken::new(),
            )
            .await
            .map_err(|e| GateTimingError::Checkout {
                candidate: number,
                reason: e.to_string(),
            })?;
        times.push(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
        if let Some(failed) = results.iter().find(|r| !r.passed) {
            let output = &failed.output;
            let mut from = output.len().saturating_sub(OUTPUT_TAIL);
            while !output.is_char_boundary(from) {
                from += 1;
            }
            return Err(GateTimingError::GateFailed {
                candidate: number,
                mode,
                exit: failed.exit.clone(),
                output: terminal_safe(&output[from..]).into_owned(),
            });
        }
        if warm && !crate::git::warm::tree_dir(&scratch, WarmSlot::Gate).is_dir() {
            return Err(GateTimingError::NotWarm { candidate: number });
        }
    }
    Ok(times)
}

/// The Rust file the candidates change: `src/lib.rs`, else `src/main.rs`, else the first
/// `.rs` file of the tree.
fn rust_file(tree: &git2::Tree<'_>) -> Option<String> {
    for name in ["src/lib.rs", "src/main.rs"] {
        if tree
            .get_path(Path::new(name))
            .is_ok_and(|e| e.kind() == Some(git2::ObjectType::Blob))
        {
            return Some(name.to_string());
        }
    }
    let mut found = None;
    let _ = tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
        let name = entry.name().unwrap_or_default();
        if entry.kind() == Some(git2::ObjectType::Blob) && name.ends_with(".rs") {
            found = Some(format!("{dir}{name}"));
            return git2::TreeWalkResult::Abort;
        }
        git2::TreeWalkResult::Ok
    });
    found
}

/// Clones `project` into `dest` with `main` at `commit` checked out, then makes `count`
/// candidates on it, a chain (each on the one before, as a queue's batches land), each
/// appending a comment line to `file`. Their ids, in order; no ref moves to them.
pub fn clone_with_candidates(
    project: &Path,
    dest: &Path,
    commit: &str,
    file: &str,
    count: usize,
) -> Result<Vec<String>, GateTimingError> {
    let url = project.to_string_lossy().into_owned();
    let repo = git2::build::RepoBuilder::new()
        .clone(&url, dest)
        .map_err(git_error(format!("cloning {url}")))?;
    let oid = git2::Oid::from_str(commit).map_err(git_error("the project's HEAD"))?;
    let start = repo
        .find_commit(oid)
        .map_err(git_error("HEAD in the clone"))?;
    let on_main = repo
        .head()
        .ok()
        .is_some_and(|h| h.shorthand().ok() == Some("main"));
    if !on_main {
        repo.branch("main", &start, true)
            .map_err(git_error("making main"))?;
        repo.set_head("refs/heads/main")
            .map_err(git_error("checking out main"))?;
    }
    repo.checkout_head(Some(git2::build::CheckoutBuilder::new().force()))
        .map_err(git_error("checking out main"))?;
    let sig = git2::Signature::now("flotilla bench", "bench@flotilla.invalid")
        .map_err(git_error("a signature"))?;
    let mut parent = start;
    let mut ids = Vec::with_capacity(count);
    for n in 1..=count {
        let tree = parent.tree().map_err(git_error("a candidate's tree"))?;
        let entry = tree
            .get_path(Path::new(file))
            .map_err(git_error(format!("{file} in a candidate")))?;
        let blob = repo
            .find_blob(entry.id())
            .map_err(git_error(format!("{file}'s blob")))?;
        let mut text = blob.content().to_vec();
        if !text.is_empty() && !text.ends_with(b"\n") {
            text.push(b'\n');
        }
        text.extend_from_slice(
            format!("// flotilla bench --gate-timing: candidate {n}\n").as_bytes(),
        );
        let new_blob = repo.blob(&text).map_err(git_error("a candidate's blob"))?;
        let mut update = git2::build::TreeUpdateBuilder::new();
        update.upsert(file, new_blob, git2::FileMode::Blob);
        let new_tree = update
            .create_updated(&repo, &tree)
            .map_err(git_error("a candidate's tree"))?;
        let new_tree = repo
            .find_tree(new_tree)
            .map_err(git_error("a candidate's tree"))?;
        let id = repo
            .commit(
                None,
                &sig,
                &sig,
                &format!("candidate {n}"),
                &new_tree,
                &[&parent],
            )
            .map_err(git_error("a candidate"))?;
        ids.push(id.to_string());
        parent = repo.find_commit(id).map_err(git_error("a candidate"))?;
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn project(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init_opts(
            dir.path(),
            git2::RepositoryInitOptions::new().initial_head("trunk"),
        )
        .unwrap();
        let mut index = repo.index().unwrap();
        for (path, text) in files {
            let full = dir.path().join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(&full, text).unwrap();
            index.add_path(Path::new(path)).unwrap();
        }
        let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
        let sig = git2::Signature::now("t", "t@t").unwrap();
        repo.commit(Some("HEAD"), &sig, &sig, "start", &tree, &[])
            .unwrap();
        dir
    }

    #[test]
    fn the_file_to_change_is_lib_then_main_then_any_rust_file() {
        let find = |files: &[(&str, &str)]| {
            let dir = project(files);
            let repo = git2::Repository::open(dir.path()).unwrap();
            let tree = repo.head().unwrap().peel_to_tree().unwrap();
            rust_file(&tree)
        };
        let both = [("src/main.rs", "fn main() {}\n"), ("src/lib.rs", "\n")];
        assert_eq!(find(&both).as_deref(), Some("src/lib.rs"));
        let main = [("src/main.rs", "fn main() {}\n"), ("README", "r\n")];
        assert_eq!(find(&main).as_deref(), Some("src/main.rs"));
        let nested = [("crates/a/src/x.rs", "\n"), ("README", "r\n")];
        assert_eq!(find(&nested).as_deref(), Some("crates/a/src/x.rs"));
        assert_eq!(find(&[("README", "r\n")]), None);
    }

    #[test]
    fn candidates_are_a_chain_each_adding_one_comment_line_on_a_clone_s_main() {
        let source = project(&[
            ("src/lib.rs", "pub fn f() {}"),
            ("Cargo.toml", "[package]\n"),
        ]);
        let head = git2::Repository::open(source.path())
            .unwrap()
            .head()
            .unwrap()
            .peel_to_commit()
            .unwrap()
            .id()
            .to_string();
        let dest = tempfile::tempdir().unwrap();
        let clone = dest.path().join("repo");
        let ids = clone_with_candidates(source.path(), &clone, &head, "src/lib.rs", 3).unwrap();
        assert_eq!(ids.len(), 3);
        let repo = git2::Repository::open(&clone).unwrap();
        assert_eq!(repo.head().unwrap().shorthand().unwrap(), "main");
        assert_eq!(
            repo.head()
                .unwrap()
                .peel_to_commit()
                .unwrap()
                .id()
                .to_string(),
            head
        );
        assert!(clone.join("src/lib.rs").is_file(), "main is checked out");
        let mut parent = head;
        for (n, id) in ids.iter().enumerate() {
            let commit = repo.find_commit(git2::Oid::from_str(id).unwrap()).unwrap();
            assert_eq!(commit.parent_id(0).unwrap().to_string(), parent);
            let entry = commit
                .tree()
                .unwrap()
                .get_path(Path::new("src/lib.rs"))
                .unwrap();
            let text =
                String::from_utf8(repo.find_blob(entry.id()).unwrap().content().to_vec()).unwrap();
            let comments: Vec<&str> = text.lines().skip(1).collect();
            let expected: Vec<String> = (1..=n + 1)
                .map(|k| format!("// flotilla bench --gate-timing: candidate {k}"))
                .collect();
            assert_eq!(text.lines().next(), Some("pub fn f() {}"));
            assert_eq!(comments, expected);
            parent = id.clone();
        }
    }

    #[test]
    fn the_later_median_leaves_out_the_first_candidate() {
        assert_eq!(GateTimingReport::later_median(&[900, 10, 30, 20]), Some(20));
        assert_eq!(GateTimingReport::later_median(&[900, 10, 30]), Some(20));
        assert_eq!(
            GateTimingReport::later_median(&[0, u64::MAX, u64::MAX]),
            Some(u64::MAX)
        );
        assert_eq!(GateTimingReport::later_median(&[900]), Some(900));
        assert_eq!(GateTimingReport::later_median(&[]), None);
        let report = GateTimingReport {
            project: "p".into(),
            commit: "0123456789abcdef".into(),
            command: "cargo check".into(),
            changed_file: "src/lib.rs".into(),
            cold_ms: vec![60_000, 50_000, 40_000],
            warm_ms: vec![61_000, 2_000, 4_000],
        };
        assert_eq!(report.speed_up(), Some(15.0));
        let text = report.text();
        assert!(
            text.contains("cold (warm_gate = false): first 60.0 s, later median 45.0 s"),
            "{text}"
        );
        assert!(text.contains("warm 15.0x faster"), "{text}");
    }

    #[tokio::test]
    async fn both_modes_gate_every_candidate_and_a_failing_gate_is_named() {
        let source = project(&[
            ("src/lib.rs", "pub fn f() {}\n"),
            (".gitignore", "target/\n"),
        ]);
        let dir = tempfile::tempdir().unwrap();
        let options = GateTimingOptions {
            // Found from inside the project, as `--gate-timing` with no path is.
            project: source.path().join("src"),
            candidates: 2,
            command: "grep -q 'candidate' src/lib.rs && mkdir -p target && touch target/built"
                .into(),
            dir: dir.path().to_path_buf(),
        };
        let report = measure(&options).await.unwrap();
        assert_eq!(report.cold_ms.len(), 2);
        assert_eq!(report.warm_ms.len(), 2);
        assert_eq!(report.changed_file, "src/lib.rs");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "each mode's clone and trees are removed"
        );
        let failing = GateTimingOptions {
            command: "echo broken; exit 3".into(),
            ..options
        };
        match measure(&failing).await {
            Err(GateTimingError::GateFailed {
                candidate: 1,
                mode: "cold",
                output,
                ..
            }) => assert!(output.contains("broken"), "{output}"),
            other => panic!("{other:?}"),
        }
    }
}
