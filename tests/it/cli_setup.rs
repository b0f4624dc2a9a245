//! The commands that set flotilla up on a machine and in a repository, run through the
//! binary as a user runs them: `completions`, `man`, `init`, `config check`, `doctor`.

use assert_cmd::Command;
use clap::CommandFactory;

fn flotilla() -> Command {
    let mut cmd = Command::cargo_bin("flotilla").unwrap();
    cmd.env("NO_COLOR", "1").env_remove("FLOTILLA_SOCKET");
    cmd
}

fn stdout_of(args: &[&str]) -> String {
    let out = flotilla()
        .args(args)
        .assert()
        .success()
        .get_output()
        .clone();
    String::from_utf8(out.stdout).unwrap()
}

/// Every visible subcommand of the real command line, so that a new one cannot be left out
/// of the scripts and the page without a test noticing.
fn subcommands() -> Vec<String> {
    let names: Vec<String> = flotilla::cli::args::Cli::command()
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| c.get_name().to_string())
        .collect();
    assert!(names.len() >= 10, "{names:?}");
    names
}

#[test]
fn bash_completion_defines_its_function_names_every_subcommand_and_parses() {
    let script = stdout_of(&["completions", "bash"]);
    assert!(script.contains("_flotilla()"), "{script}");
    assert!(script.contains("complete -F _flotilla"), "{script}");
    for name in subcommands() {
        assert!(
            script.contains(&format!("flotilla,{name})")),
            "`{name}` is not completed:\n{script}"
        );
    }
    // bash itself accepts it (parse only, nothing runs).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flotilla.bash");
    std::fs::write(&file, &script).unwrap();
    let checked = std::process::Command::new("bash")
        .arg("-n")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&checked.stderr)
    );
}

#[test]
fn zsh_and_fish_completions_name_every_subcommand() {
    let zsh = stdout_of(&["completions", "zsh"]);
    assert!(zsh.starts_with("#compdef flotilla"), "{zsh}");
    let fish = stdout_of(&["completions", "fish"]);
    assert!(fish.contains("complete -c flotilla"), "{fish}");
    for name in subcommands() {
        assert!(zsh.contains(&format!("'{name}:")), "zsh misses `{name}`");
        assert!(
            fish.contains(&format!("-a \"{name}\"")),
            "fish misses `{name}`"
        );
    }
}

#[test]
fn an_unknown_shell_is_a_usage_error() {
    flotilla()
        .args(["completions", "tcsh"])
        .assert()
        .code(2)
        .stdout("");
}

#[test]
fn the_man_page_is_roff_and_names_every_subcommand() {
    let page = stdout_of(&["man"]);
    // clap_mangen opens with the two lines that define the quote string; then the title.
    let first_macro = page
        .lines()
        .find(|l| !l.starts_with(".ie") && !l.starts_with(".el"))
        .unwrap();
    assert!(first_macro.starts_with(".TH flotilla 1"), "{page}");
    assert!(page.contains(".SH SUBCOMMANDS"), "{page}");
    for name in subcommands() {
        assert!(
            page.contains(&format!("flotilla\\-{name}(1)")),
            "the page does not name `{name}`:\n{page}"
        );
    }
}

#[test]
fn man_out_writes_one_page_per_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("man1");
    flotilla()
        .args(["man", "--out"])
        .arg(&out)
        .assert()
        .success()
        .stdout("");
    let main = std::fs::read_to_string(out.join("flotilla.1")).unwrap();
    assert!(main.contains(".TH flotilla 1"));
    for name in subcommands() {
        let page = std::fs::read_to_string(out.join(format!("flotilla-{name}.1")))
            .unwrap_or_else(|e| panic!("flotilla-{name}.1: {e}"));
        assert!(page.contains(&format!(".TH flotilla-{name} 1")), "{page}");
    }
    // Nested commands get theirs too.
    assert!(out.join("flotilla-providers-check.1").is_file());
}

/// A repository holding `marker` (empty: no project type).
fn project(marker: &str, contents: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    if !marker.is_empty() {
        std::fs::write(dir.path().join(marker), contents).unwrap();
    }
    dir
}

fn init(repo: &std::path::Path) -> String {
    let out = flotilla()
        .arg("init")
        .arg("--repo")
        .arg(repo)
        .assert()
        .success()
        .get_output()
        .clone();
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn init_fills_the_gate_and_sweeps_from_the_project_type_and_the_file_loads() {
    let cases: [(&str, &str, &[&str], Option<&str>); 5] = [
        (
            "Cargo.toml",
            "[package]\nname = \"x\"\n",
            &["cargo build", "cargo test"],
            Some("cargo test"),
        ),
        (
            "package.json",
            "{}",
            &["npm ci", "npm test"],
            Some("npm test"),
        ),
        ("pyproject.toml", "", &["pytest"], Some("pytest")),
        (
            "go.mod",
            "module x\n",
            &["go build ./...", "go test ./..."],
            Some("go test ./..."),
        ),
        ("", "", &[], None),
    ];
    for (marker, contents, gate, test) in cases {
        let repo = project(marker, contents);
        let said = init(repo.path());
        let path = repo.path().join("flotilla.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(said.contains("wrote"), "{said}");
        // flotilla's own loader takes it, as submit would.
        let config = flotilla::config::RunConfig::load(&path)
            .unwrap_or_else(|e| panic!("{marker}: {e}\n{text}"));
        let expected: Vec<String> = gate.iter().map(|g| g.to_string()).collect();
        assert_eq!(config.merge.gate, expected, "{marker}");
        assert_eq!(config.reconciler.test.as_deref(), test, "{marker}");
        // And so does `config check`, through the binary.
        let checked = flotilla()
            .args(["config", "check"])
            .arg(&path)
            .assert()
            .success()
            .get_output()
            .clone();
        assert!(
            String::from_utf8_lossy(&checked.stdout).contains(": ok"),
            "{checked:?}"
        );
        // The commented blocks are there.
        for block in [
            "# [providers.openai]",
            "# [providers.anthropic]",
            "# [providers.ollama]",
            "# [providers.llamacpp]",
            "# [agents.claude]",
            "# [agents.codex]",
            "# [agents.aider]",
            "# [reviewer]",
            "run_budget = ",
        ] {
            assert!(text.contains(block), "{marker}: no {block}");
        }
    }
}

#[test]
fn every_commented_block_of_init_is_valid_when_uncommented() {
    let repo = project("Cargo.toml", "");
    init(repo.path());
    let path = repo.path().join("flotilla.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let uncommented: String = text
        .lines()
        .map(|l| l.strip_prefix("# ").unwrap_or(l))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(uncommented, text);
    let all = repo.path().join("all.toml");
    std::fs::write(&all, &uncommented).unwrap();
    let config = flotilla::config::RunConfig::load(&all).unwrap_or_else(|e| panic!("{e}"));
    for name in ["openai", "anthropic", "ollama", "llamacpp"] {
        assert!(config.models.providers.contains_key(name), "{name}");
    }
    for name in ["claude", "codex", "aider"] {
        assert!(config.agents.contains_key(name), "{name}");
    }
    assert!(config.models.roles.worker.is_some());
    assert_eq!(config.workers.len(), 2);
    assert!(config.notify.desktop && config.notify.webhook.is_some());
    assert!(config.reviewer.enabled && config.models.roles.reviewer.is_some());
}

#[test]
fn init_refuses_to_overwrite_without_force() {
    let repo = project("go.mod", "module x\n");
    let path = repo.path().join("flotilla.toml");
    std::fs::write(&path, "# mine\n").unwrap();
    flotilla()
        .arg("init")
        .arg("--repo")
        .arg(repo.path())
        .assert()
        .code(2)
        .stderr(predicates::str::contains("already exists"))
        .stderr(predicates::str::contains("--force"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "# mine\n");
    flotilla()
        .args(["init", "--force", "--repo"])
        .arg(repo.path())
        .assert()
        .success();
    assert!(
        std::fs::read_to_string(&path)
            .unwrap()
            .contains("\"go test ./...\"")
    );
}

#[test]
fn config_check_names_the_key_and_line_of_an_error() {
    let repo = project("", "");
    std::fs::write(repo.path().join("s.toml"), "").unwrap();
    let path = repo.path().join("flotilla.toml");
    std::fs::write(
        &path,
        "[provider]\nscenario = \"s.toml\"\n\n[limits]\nmax_workers = \"four\"\n",
    )
    .unwrap();
    let out = flotilla()
        .args(["config", "check", "--repo"])
        .arg(repo.path())
        .assert()
        .code(2)
        .get_output()
        .clone();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("key `limits.max_workers`, line 5"),
        "{stderr}"
    );
    // An unknown key too, and the value is never quoted back.
    std::fs::write(
        &path,
        "[provider]\nscenario = \"s.toml\"\n[merge]\ngaet = [\"make\"]\n",
    )
    .unwrap();
    let out = flotilla()
        .args(["config", "check"])
        .arg(&path)
        .assert()
        .code(2)
        .get_output()
        .clone();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("key `merge.gaet`, line 4"), "{stderr}");
    assert!(stderr.contains("unknown field"), "{stderr}");
    // A missing file is an error too, not a pass.
    flotilla()
        .args(["config", "check"])
        .arg(repo.path().join("nope.toml"))
        .assert()
        .code(2);
}

fn doctor(state_dir: &std::path::Path, repo: &std::path::Path) -> (Option<i32>, String) {
    let out = flotilla()
        .arg("--state-dir")
        .arg(state_dir)
        .args(["doctor", "--timeout", "5", "--repo"])
        .arg(repo)
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8(out.stdout).unwrap())
}

fn line<'a>(report: &'a str, what: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.get(5..).is_some_and(|rest| rest.starts_with(what)))
        .unwrap_or_else(|| panic!("no `{what}` line:\n{report}"))
}

#[test]
fn doctor_checks_each_thing_on_one_line_and_fails_on_what_is_missing() {
    let repo = project("", "");
    std::fs::write(repo.path().join("s.toml"), "").unwrap();
    // A provider on a port nothing listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // One agent CLI that is on PATH, one that is not.
    let bin = tempfile::tempdir().unwrap();
    let fake = bin.path().join("fake-agent");
    std::fs::write(&fake, "#!/bin/sh\nexit 0\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        repo.path().join("flotilla.toml"),
        format!(
            "[provider]\nscenario = \"s.toml\"\n\
             [providers.dead]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\n\
             max_retries = 0\n\
             [roles]\nplanner = \"dead/m\"\n\
             [agents.here]\nprogram = \"fake-agent\"\n\
             [agents.gone]\nprogram = \"no-such-agent-cli\"\n"
        ),
    )
    .unwrap();
    // A state directory that cannot be made: its parent is a file.
    let blocker = repo.path().join("not-a-dir");
    std::fs::write(&blocker, "").unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = flotilla()
        .env("PATH", path)
        .arg("--state-dir")
        .arg(blocker.join("state"))
        .args(["doctor", "--timeout", "5", "--repo"])
        .arg(repo.path())
        .output()
        .unwrap();
    let report = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(4), "{report}");
    line(&report, "sandbox");
    assert!(line(&report, "git").starts_with("ok"), "{report}");
    assert!(
        line(&report, "state directory").starts_with("FAIL"),
        "{report}"
    );
    assert!(line(&report, "config").starts_with("ok"), "{report}");
    let provider = line(&report, "provider planner");
    assert!(provider.starts_with("FAIL"), "{report}");
    assert!(provider.contains("dead/m unreachable"), "{report}");
    let here = line(&report, "agent here");
    assert!(
        here.starts_with("ok") && here.contains("fake-agent"),
        "{report}"
    );
    let gone = line(&report, "agent gone");
    assert!(
        gone.starts_with("FAIL") && gone.contains("no-such-agent-cli is not on PATH"),
        "{report}"
    );
}

#[test]
fn doctor_without_a_config_says_so_and_checks_the_machine() {
    let repo = project("", "");
    let state = tempfile::tempdir().unwrap();
    let (code, report) = doctor(&state.path().join("state"), repo.path());
    assert!(
        line(&report, "state directory").starts_with("ok"),
        "{report}"
    );
    assert!(state.path().join("state").is_dir());
    let config = line(&report, "config");
    assert!(
        config.starts_with('-') && config.contains("flotilla init"),
        "{report}"
    );
    // The machine's own lines decide the exit: 0 exactly when none of them failed.
    let failed = report.lines().any(|l| l.starts_with("FAIL"));
    assert_eq!(code, Some(if failed { 4 } else { 0 }), "{report}");
    assert!(!report.contains("provider "), "{report}");
}
