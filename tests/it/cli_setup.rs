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
