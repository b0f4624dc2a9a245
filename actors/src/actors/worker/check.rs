//! Handoffs from git truth (pure). After an agent stops, the Worker commits what it left and
//! reads what the branch changed (`Worktrees::seal`); [`check_work`] then builds the handoff
//! the planner reads from both: git's files and line counts, the agent's own status,
//! summary, concerns and suggestions (kept, never replaced), and what flotilla found: an
//! empty diff reported as complete, edits outside the task's scope, deleted tests, files the
//! agent claims and git does not show. Edits outside the scope fail the attempt unless the
//! run's `[checks] out_of_scope` says to flag them.
//!
//! Two more delivery checks (ADR-016): links that point outside the repository (and hard
//! links, which the seal reports with them) fail the attempt unless `[checks] links_outside`
//! says to flag them; a change to flotilla's own configuration (`flotilla.toml`, the
//! scenario and prompts the run was loaded from, files the run's commands name) is held for
//! the user's `flotilla decide` before it lands, unless `[checks] config_edits = "allow"`.

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::{Deserialize, Serialize};

use crate::protocol::ScopePath;

/// The most of a verification command's output a finding keeps (its end).
const VERIFY_TAIL_CHARS: usize = 2_000;

/// The last [`VERIFY_TAIL_CHARS`] characters (of a verification command's output).
pub(super) fn tail(text: &str) -> String {
    let count = text.chars().count();
    text.chars()
        .skip(count.saturating_sub(VERIFY_TAIL_CHARS))
        .collect()
}
use crate::protocol::{BranchWork, ChangeKind, Finding, Handoff, HandoffStatus};

/// What becomes of work that changes files outside its task's scope.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutOfScopePolicy {
    /// The attempt fails with the list of files (retried on a fresh worktree while the task
    /// has attempts left).
    #[default]
    Fail,
    /// The work is delivered with an `OutOfScope` finding.
    Flag,
}

/// What becomes of work that adds links pointing outside the repository.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinksOutsidePolicy {
    /// The attempt fails with the links (as an out-of-scope edit does by default).
    #[default]
    Fail,
    /// The work is delivered with a `LinksOutside` finding.
    Flag,
}

/// What becomes of work that changes flotilla's own configuration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfigEditPolicy {
    /// The work waits, before it lands, for the user's `flotilla decide RUN TASK --land`
    /// (or `--fail`).
    #[default]
    Hold,
    /// The work lands with a `ConfigChanged` finding.
    Allow,
}

/// `[checks]` in flotilla.toml: what flotilla checks in every worker's branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChecksConfig {
    pub out_of_scope: OutOfScopePolicy,
    /// Links that point outside the repository: fail the attempt, or flag them.
    pub links_outside: LinksOutsidePolicy,
    /// Changes to flotilla's own configuration: held for the user, or allowed.
    pub config_edits: ConfigEditPolicy,
    /// More repository paths (files, or directories and all below) that count as
    /// flotilla's configuration, besides `flotilla.toml`, the files the run was loaded from
    /// and those its commands name.
    pub config_paths: Vec<String>,
    /// Globs (`**` crosses directories) naming test files; deleting one is reported.
    pub test_patterns: Vec<String>,
    /// A shell command run in the worktree after the agent, on the committed work; its exit
    /// code becomes the handoff's `build_exit_code`. None: no verification.
    pub verify: Option<String>,
    pub verify_timeout_secs: u64,
}

impl Default for ChecksConfig {
    fn default() -> Self {
        ChecksConfig {
            out_of_scope: OutOfScopePolicy::Fail,
            links_outside: LinksOutsidePolicy::Fail,
            config_edits: ConfigEditPolicy::Hold,
            config_paths: Vec::new(),
            test_patterns: [
                "**/tests/**",
                "**/test/**",
                "**/__tests__/**",
                "**/*_test.*",
                "**/*.test.*",
                "**/*.spec.*",
                "**/test_*.py",
            ]
            .map(String::from)
            .to_vec(),
            verify: None,
            verify_timeout_secs: 600,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChecksConfigError {
    #[error("checks.test_patterns: {pattern:?} is not a glob: {problem}")]
    BadPattern { pattern: String, problem: String },
    #[error("checks.verify_timeout_secs = 0: the verification needs some time")]
    NoVerifyTime,
    #[error("checks.verify is empty: leave it out for no verification")]
    EmptyVerify,
    #[error(
        "checks.config_paths: {path:?} is not a path inside the repository (relative, no '..')"
    )]
    BadConfigPath { path: String },
}

impl ChecksConfig {
    pub fn validate(&self) -> Result<(), ChecksConfigError> {
        self.compile().map(|_| ())
    }

    /// The config with its globs compiled, once per run.
    pub fn compile(&self) -> Result<Checks, ChecksConfigError> {
        if self.verify_timeout_secs == 0 {
            return Err(ChecksConfigError::NoVerifyTime);
        }
        if self.verify.as_deref().is_some_and(|v| v.trim().is_empty()) {
            return Err(ChecksConfigError::EmptyVerify);
        }
        let mut tests = GlobSetBuilder::new();
        for pattern in &self.test_patterns {
            let glob = Glob::new(pattern).map_err(|e| ChecksConfigError::BadPattern {
                pattern: pattern.clone(),
                problem: e.kind().to_string(),
            })?;
            tests.add(glob);
        }
        let tests = tests.build().map_err(|e| ChecksConfigError::BadPattern {
            pattern: self.test_patterns.join(", "),
            problem: e.to_string(),
        })?;
        let mut protected = Vec::new();
        for path in
            std::iter::once("flotilla.toml").chain(self.config_paths.iter().map(String::as_str))
        {
            let parsed = ScopePath::parse(path, usize::MAX).map_err(|_| {
                ChecksConfigError::BadConfigPath {
                    path: path.chars().take(200).collect(),
                }
            })?;
            protected.push(parsed);
        }
        Ok(Checks {
            config: self.clone(),
            tests,
            protected,
        })
    }
}

/// A run's checks, ready to use.
#[derive(Debug, Clone)]
pub struct Checks {
    pub config: ChecksConfig,
    tests: GlobSet,
    /// flotilla's own configuration in the repository: a change there is held (ADR-016).
    protected: Vec<ScopePath>,
}

impl Default for Checks {
    fn default() -> Self {
        // The defaults are valid globs (a unit test says so).
        ChecksConfig::default()
            .compile()
            .unwrap_or_else(|_| Checks {
                config: ChecksConfig::default(),
                tests: GlobSet::empty(),
                protected: Vec::new(),
            })
    }
}

impl Checks {
    pub fn is_test(&self, path: &str) -> bool {
        self.tests.is_match(path)
    }

    /// These checks, with `paths` (repository-relative: the files the run's config was
    /// loaded from, the files its commands name) counted as flotilla's configuration too.
    /// A path that is not one inside the repository names nothing there and is skipped.
    pub fn protecting(mut self, paths: impl IntoIterator<Item = impl AsRef<str>>) -> Self {
        for path in paths {
            if let Ok(parsed) = ScopePath::parse(path.as_ref(), usize::MAX)
                && !self.protected.contains(&parsed)
            {
                self.protected.push(parsed);
            }
        }
        self
    }

    /// Whether `path` (repository-relative) is flotilla's configuration.
    pub fn is_config(&self, path: &str) -> bool {
        ScopePath::parse(path, usize::MAX)
            .is_ok_and(|p| self.protected.iter().any(|c| c.covers(&p)))
    }
}

/// The files a shell command line names in the repository, as far as its words tell: a
/// relative path with a directory (`scripts/check`, `./check.sh`) or a script's extension
/// (`check.sh`, `ci.py`). Changing one changes what flotilla runs, so it counts as
/// flotilla's configuration. Options, absolute paths, variables and plain program names
/// (`cargo`, `test`) are not.
pub fn command_files(command: &str) -> Vec<String> {
    const SCRIPTS: &[&str] = &[
        ".sh", ".bash", ".zsh", ".py", ".pl", ".rb", ".js", ".mjs", ".ts", ".mk",
    ];
    command
        .split(|c: char| c.is_whitespace() || ";&|()<>`".contains(c))
        .map(|word| word.trim_matches(|c| c == '\'' || c == '"'))
        .map(|word| word.split_once('=').map_or(word, |(_, value)| value))
        .filter(|word| {
            !word.is_empty()
                && !word.starts_with(['-', '/', '~', '$'])
                && !word.contains("://")
                && (word.contains('/') || SCRIPTS.iter().any(|ext| word.ends_with(ext)))
        })
        .map(|word| word.trim_start_matches("./").to_string())
        .filter(|word| ScopePath::parse(word, usize::MAX).is_ok())
        .collect()
}

/// The handoff built from the agent's and git's, and the files outside the scope when the
/// policy fails such work (the Worker then reports a failure instead).
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedWork {
    pub handoff: Handoff,
    pub out_of_scope: Vec<String>,
    /// Links out of the repository, when the policy fails such work.
    pub links_outside: Vec<String>,
}

/// The most claimed-but-unchanged paths reported, and how much of each.
const MAX_CLAIMS: usize = 20;
const MAX_CLAIM_CHARS: usize = 200;

/// Builds the handoff from the agent's own (`agent`) and what git says (`work`), for a
/// task whose scope is `scope` (raw, as in its spec; every path there parsed when it was
/// submitted).
pub fn check_work(
    agent: Handoff,
    work: BranchWork,
    scope: &[String],
    checks: &Checks,
) -> CheckedWork {
    let scope: Vec<ScopePath> = scope
        .iter()
        .filter_map(|p| ScopePath::parse(p, usize::MAX).ok())
        .collect();
    let in_scope = |path: &str| {
        ScopePath::parse(path, usize::MAX)
            .is_ok_and(|p| scope.iter().any(|allowed| allowed.covers(&p)))
    };
    let mut outside: Vec<String> = work
        .paths()
        .filter(|p| !in_scope(p))
        .map(String::from)
        .collect();
    outside.sort();
    outside.dedup();
    if work.files_omitted > 0 {
        // Files the seal only counted cannot be shown to be in the scope.
        outside.push(format!(
            "({} more changed files, too many to check)",
            work.files_omitted
        ));
    }

    // A test deleted, or moved to where it is no longer a test.
    let deleted_tests: Vec<String> = work
        .files
        .iter()
        .filter_map(|f| match (f.change, &f.old_path) {
            (ChangeKind::Deleted, _) if checks.is_test(&f.path) => Some(f.path.clone()),
            (ChangeKind::Renamed, Some(old)) if checks.is_test(old) && !checks.is_test(&f.path) => {
                Some(old.clone())
            }
            _ => None,
        })
        .collect();

    let claimed_not_changed: Vec<String> = agent
        .files_changed
        .iter()
        .filter(|claim| {
            let claim = ScopePath::parse(claim, usize::MAX);
            !claim.is_ok_and(|c| work.paths().any(|p| p == c.as_str()))
        })
        .take(MAX_CLAIMS)
        .map(|claim| claim.chars().take(MAX_CLAIM_CHARS).collect())
        .collect();

    let mut findings = agent.findings.clone();
    if agent.status == HandoffStatus::Complete && work.is_empty() {
        findings.push(Finding::EmptyDiff);
    }
    let out_of_scope = match checks.config.out_of_scope {
        OutOfScopePolicy::Fail => outside,
        OutOfScopePolicy::Flag => {
            if !outside.is_empty() {
                findings.push(Finding::OutOfScope { paths: outside });
            }
            Vec::new()
        }
    };
    if !deleted_tests.is_empty() {
        findings.push(Finding::DeletedTests {
            paths: deleted_tests,
        });
    }
    if !claimed_not_changed.is_empty() {
        findings.push(Finding::ClaimedNotChanged {
            paths: claimed_not_changed,
        });
    }
    let links_outside = match checks.config.links_outside {
        LinksOutsidePolicy::Fail => work.links_outside.clone(),
        LinksOutsidePolicy::Flag => {
            if !work.links_outside.is_empty() {
                findings.push(Finding::LinksOutside {
                    paths: work.links_outside.clone(),
                });
            }
            Vec::new()
        }
    };
    // flotilla's own configuration, changed (a rename away counts by its old path).
    let mut config: Vec<String> = work
        .paths()
        .filter(|p| checks.is_config(p))
        .map(String::from)
        .collect();
    config.sort();
    config.dedup();
    if !config.is_empty() {
        findings.push(Finding::ConfigChanged {
            paths: config,
            allowed: checks.config.config_edits == ConfigEditPolicy::Allow,
        });
    }

    let count = |kinds: &[ChangeKind]| {
        work.files
            .iter()
            .filter(|f| kinds.contains(&f.change))
            .count() as u64
    };
    let mut metrics = agent.metrics;
    metrics.lines_added = work.lines_added;
    metrics.lines_removed = work.lines_removed;
    metrics.files_created = count(&[ChangeKind::Added, ChangeKind::Copied]);
    metrics.files_modified = count(&[
        ChangeKind::Modified,
        ChangeKind::Renamed,
        ChangeKind::TypeChanged,
    ]);
    metrics.files_deleted = count(&[ChangeKind::Deleted]);

    // Everything above was checked on every file the seal read; the handoff lists the first
    // `BranchWork::MAX_FILES` of them.
    let mut work = work;
    if work.files.len() > BranchWork::MAX_FILES {
        let dropped = work.files.len() - BranchWork::MAX_FILES;
        work.files.truncate(BranchWork::MAX_FILES);
        work.files_omitted = work.files_omitted.saturating_add(dropped as u64);
    }
    let changed: Vec<String> = work.files.iter().map(|f| f.path.clone()).collect();

    CheckedWork {
        handoff: Handoff {
            files_changed: changed,
            metrics,
            work: Some(Box::new(work)),
            findings,
            ..agent
        },
        out_of_scope,
        links_outside,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::FileChange;

    fn change(path: &str, change: ChangeKind, added: u64, removed: u64) -> FileChange {
        FileChange {
            path: path.into(),
            old_path: None,
            change,
            lines_added: added,
            lines_removed: removed,
            binary: false,
        }
    }

    fn work(files: Vec<FileChange>) -> BranchWork {
        BranchWork {
            branch: "flotilla/r/t1".into(),
            base: "b".into(),
            head: "h".into(),
            lines_added: files.iter().map(|f| f.lines_added).sum(),
            lines_removed: files.iter().map(|f| f.lines_removed).sum(),
            files,
            files_omitted: 0,
            committed_for_agent: false,
            links_outside: Vec::new(),
        }
    }

    fn agent(status: HandoffStatus, claims: &[&str]) -> Handoff {
        Handoff {
            status,
            concerns: vec!["mine".into()],
            suggestions: vec!["next".into()],
            files_changed: claims.iter().map(|c| c.to_string()).collect(),
            ..Handoff::complete("did it")
        }
    }

    fn scope(paths: &[&str]) -> Vec<String> {
        paths.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn git_supplies_the_files_and_lines_and_the_agent_keeps_its_word() {
        let w = work(vec![
            change("src/a.rs", ChangeKind::Added, 10, 0),
            change("src/b.rs", ChangeKind::Modified, 3, 2),
            change("src/c.rs", ChangeKind::Deleted, 0, 7),
        ]);
        let checked = check_work(
            agent(HandoffStatus::Partial, &["src/a.rs"]),
            w.clone(),
            &scope(&["src"]),
            &Checks::default(),
        );
        let h = checked.handoff;
        assert!(checked.out_of_scope.is_empty());
        assert_eq!(h.status, HandoffStatus::Partial);
        assert_eq!(h.summary, "did it");
        assert_eq!(h.concerns, ["mine"]);
        assert_eq!(h.suggestions, ["next"]);
        assert_eq!(h.files_changed, ["src/a.rs", "src/b.rs", "src/c.rs"]);
        assert_eq!(
            (h.metrics.lines_added, h.metrics.lines_removed),
            (13, 9),
            "line counts come from git"
        );
        assert_eq!(
            (
                h.metrics.files_created,
                h.metrics.files_modified,
                h.metrics.files_deleted
            ),
            (1, 1, 1)
        );
        assert_eq!(h.work, Some(Box::new(w)));
        assert!(h.findings.is_empty(), "{:?}", h.findings);
    }

    #[test]
    fn an_empty_branch_reported_complete_is_a_finding_and_partial_is_not() {
        let checked = check_work(
            agent(HandoffStatus::Complete, &[]),
            work(vec![]),
            &scope(&["src"]),
            &Checks::default(),
        );
        assert_eq!(checked.handoff.findings, [Finding::EmptyDiff]);
        let checked = check_work(
            agent(HandoffStatus::Blocked, &[]),
            work(vec![]),
            &scope(&["src"]),
            &Checks::default(),
        );
        assert!(checked.handoff.findings.is_empty());
    }

    #[test]
    fn edits_outside_the_scope_fail_by_default_and_are_flagged_when_configured() {
        let mut renamed = change("lib/moved.rs", ChangeKind::Renamed, 0, 0);
        renamed.old_path = Some("src/moved.rs".into());
        let w = work(vec![
            change("src/ok.rs", ChangeKind::Modified, 1, 1),
            change("Cargo.toml", ChangeKind::Modified, 1, 0),
            renamed,
            change("src2/x.rs", ChangeKind::Added, 1, 0),
        ]);
        let checked = check_work(
            agent(HandoffStatus::Complete, &[]),
            w.clone(),
            &scope(&["src"]),
            &Checks::default(),
        );
        assert_eq!(
            checked.out_of_scope,
            ["Cargo.toml", "lib/moved.rs", "src2/x.rs"],
            "a rename out of the scope counts by its new path; `src` does not cover `src2`"
        );
        let flag = ChecksConfig {
            out_of_scope: OutOfScopePolicy::Flag,
            ..ChecksConfig::default()
        }
        .compile()
        .unwrap();
        let checked = check_work(
            agent(HandoffStatus::Complete, &[]),
            w,
            &scope(&["src"]),
            &flag,
        );
        assert!(checked.out_of_scope.is_empty());
        assert_eq!(
            checked.handoff.findings,
            [Finding::OutOfScope {
                paths: vec![
                    "Cargo.toml".into(),
                    "lib/moved.rs".into(),
                    "src2/x.rs".into()
                ]
            }]
        );
    }

    #[test]
    fn deleted_tests_and_claims_git_does_not_show_are_findings() {
        let w = work(vec![
            change("tests/parse.rs", ChangeKind::Deleted, 0, 40),
            change("src/lex_test.go", ChangeKind::Deleted, 0, 4),
            change("src/lex.rs", ChangeKind::Deleted, 0, 4),
            change("tests/new.rs", ChangeKind::Added, 4, 0),
        ]);
        let long = "x/".repeat(500);
        let checked = check_work(
            agent(
                HandoffStatus::Complete,
                &["src/lex.rs", "./src/gone.rs", &long],
            ),
            w,
            &scope(&["src", "tests"]),
            &Checks::default(),
        );
        let findings = checked.handoff.findings;
        assert_eq!(
            findings[0],
            Finding::DeletedTests {
                paths: vec!["tests/parse.rs".into(), "src/lex_test.go".into()]
            }
        );
        let Finding::ClaimedNotChanged { paths } = &findings[1] else {
            panic!("{findings:?}");
        };
        assert_eq!(paths[0], "./src/gone.rs");
        assert_eq!(paths[1].chars().count(), MAX_CLAIM_CHARS);
        assert_eq!(paths.len(), 2);
    }

    #[test]
    fn every_file_is_checked_before_the_list_is_cut_for_the_handoff() {
        let mut files: Vec<FileChange> = (0..1_500)
            .map(|i| change(&format!("src/f{i:04}.rs"), ChangeKind::Added, 1, 0))
            .collect();
        files.push(change("zz/late.rs", ChangeKind::Added, 1, 0));
        let checked = check_work(
            agent(HandoffStatus::Complete, &[]),
            work(files),
            &scope(&["src"]),
            &Checks::default(),
        );
        assert_eq!(
            checked.out_of_scope,
            ["zz/late.rs"],
            "found past the first 1000"
        );
        let w = checked.handoff.work.unwrap();
        assert_eq!(w.files.len(), BranchWork::MAX_FILES);
        assert_eq!(w.files_omitted, 501);
        assert_eq!(
            checked.handoff.metrics.files_created, 1_501,
            "counted over all"
        );
        assert_eq!(checked.handoff.files_changed.len(), BranchWork::MAX_FILES);

        let mut too_many = work(vec![change("src/a.rs", ChangeKind::Added, 1, 0)]);
        too_many.files_omitted = 7;
        let checked = check_work(
            agent(HandoffStatus::Complete, &[]),
            too_many,
            &scope(&["src"]),
            &Checks::default(),
        );
        assert_eq!(
            checked.out_of_scope,
            ["(7 more changed files, too many to check)"],
            "what the seal could not read cannot pass the scope check"
        );
    }

    #[test]
    fn a_test_moved_out_of_the_tests_counts_as_deleted() {
        let mut moved = change("src/old_test_helpers.rs", ChangeKind::Renamed, 0, 0);
        moved.old_path = Some("tests/helpers.rs".into());
        let mut renamed_within = change("tests/b.rs", ChangeKind::Renamed, 0, 0);
        renamed_within.old_path = Some("tests/a.rs".into());
        let checked = check_work(
            agent(HandoffStatus::Complete, &[]),
            work(vec![moved, renamed_within]),
            &scope(&["src", "tests"]),
            &Checks::default(),
        );
        assert_eq!(
            checked.handoff.findings,
            [Finding::DeletedTests {
                paths: vec!["tests/helpers.rs".into()]
            }]
        );
    }

    #[test]
    fn the_default_test_patterns_compile_and_bad_config_is_refused_by_field() {
        assert!(ChecksConfig::default().validate().is_ok());
        let checks = Checks::default();
        assert!(checks.is_test("tests/it/main.rs"));
        assert!(checks.is_test("web/src/app.test.ts"));
        assert!(!checks.is_test("src/testing.rs"));
        let bad = ChecksConfig {
            test_patterns: vec!["[".into()],
            ..ChecksConfig::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(ChecksConfigError::BadPattern { .. })
        ));
        let no_time = ChecksConfig {
            verify_timeout_secs: 0,
            ..ChecksConfig::default()
        };
        assert_eq!(no_time.validate(), Err(ChecksConfigError::NoVerifyTime));
    }

    #[test]
    fn links_outside_fail_the_work_by_default_and_are_flagged_when_configured() {
        let mut w = work(vec![change("src/etc", ChangeKind::Added, 0, 0)]);
        w.links_outside = vec!["src/etc".into()];
        let checked = check_work(
            agent(HandoffStatus::Complete, &[]),
            w.clone(),
            &scope(&["src"]),
            &Checks::default(),
        );
        assert_eq!(checked.links_outside, ["src/etc"]);
        let flag = ChecksConfig {
            links_outside: LinksOutsidePolicy::Flag,
            ..ChecksConfig::default()
        }
        .compile()
        .unwrap();
        let checked = check_work(
            agent(HandoffStatus::Complete, &[]),
            w,
            &scope(&["src"]),
            &flag,
        );
        assert!(checked.links_outside.is_empty());
        assert_eq!(
            checked.handoff.findings,
            [Finding::LinksOutside {
                paths: vec!["src/etc".into()]
            }]
        );
    }

    #[test]
    fn a_change_to_flotillas_own_configuration_is_a_finding_held_unless_allowed() {
        let mut renamed = change("old-prompts/worker.md", ChangeKind::Renamed, 0, 0);
        renamed.old_path = Some("prompts/worker.md".into());
        let w = work(vec![
            change("flotilla.toml", ChangeKind::Modified, 1, 1),
            change("ci/check.sh", ChangeKind::Modified, 1, 0),
            renamed,
            change("src/lib.rs", ChangeKind::Modified, 1, 0),
        ]);
        let checks = ChecksConfig {
            config_paths: vec!["prompts".into()],
            ..ChecksConfig::default()
        }
        .compile()
        .unwrap()
        .protecting(command_files("sh ./ci/check.sh && cargo test"));
        let checked = check_work(
            agent(HandoffStatus::Complete, &[]),
            w.clone(),
            &scope(&["flotilla.toml", "ci", "prompts", "old-prompts", "src"]),
            &checks,
        );
        assert_eq!(
            checked.handoff.findings,
            [Finding::ConfigChanged {
                paths: vec![
                    "ci/check.sh".into(),
                    "flotilla.toml".into(),
                    "prompts/worker.md".into()
                ],
                allowed: false,
            }],
            "a rename away from a protected path counts"
        );
        let allow = Checks {
            config: ChecksConfig {
                config_edits: ConfigEditPolicy::Allow,
                ..checks.config.clone()
            },
            ..checks
        };
        let checked = check_work(
            agent(HandoffStatus::Complete, &[]),
            w,
            &scope(&["flotilla.toml", "ci", "prompts", "old-prompts", "src"]),
            &allow,
        );
        assert!(matches!(
            checked.handoff.findings[..],
            [Finding::ConfigChanged { allowed: true, .. }]
        ));
        assert!(
            ChecksConfig {
                config_paths: vec!["../x".into()],
                ..ChecksConfig::default()
            }
            .validate()
            .is_err()
        );
    }

    #[test]
    fn the_files_a_command_names_are_its_paths_and_scripts_not_its_programs() {
        assert_eq!(
            command_files("sh ./ci/check.sh && cargo test --manifest-path sub/Cargo.toml"),
            ["ci/check.sh", "sub/Cargo.toml"]
        );
        assert_eq!(
            command_files("python3 'tools/gate.py' -v"),
            ["tools/gate.py"]
        );
        assert_eq!(command_files("bash check.sh"), ["check.sh"]);
        assert_eq!(command_files("FOO=scripts/env make test"), ["scripts/env"]);
        assert!(command_files("cargo test --workspace").is_empty());
        assert!(command_files("/usr/bin/env $HOME/x ~/y ../up.sh https://x/y").is_empty());
    }
}
