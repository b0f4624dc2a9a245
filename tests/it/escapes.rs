//! Escapes (M8, ADR-015): each test is an attacker inside an agent — a scripted agent's
//! `run` step, which goes through the same runner and sandbox as every command flotilla
//! runs for a task — trying what a confused or prompt-injected agent would. Each asserts
//! that the attack failed and that the run still ended as it should.

use std::path::{Path, PathBuf};
use std::process::Command;

use flotilla_actors::protocol::{Event, EventKind, RunOutcome};
use flotilla_actors::testing::{PATIENCE, within};

use crate::daemon_env::*;
use crate::process::none_runs;

/// A one-task scenario whose agent runs `script` (a shell script) in its worktree and
/// writes `out/done.txt`. Its scope is `out`, where it puts what it stole.
fn attacker(script: &str) -> String {
    format!(
        r#"
[[planner.answers]]
tasks = [{{ description = "attack", scope = ["out"] }}]

[tasks.t1]
writes = {{ "out/done.txt" = "done\n" }}
run = '''
mkdir -p out
{script}
true
'''
"#
    )
}

/// A file of main's tree, if it is there.
fn on_main(repo: &Path, path: &str) -> Option<String> {
    let repo = git2::Repository::open(repo).unwrap();
    let tree = repo
        .find_branch("main", git2::BranchType::Local)
        .unwrap()
        .get()
        .peel_to_tree()
        .unwrap();
    let entry = tree.get_path(Path::new(path)).ok()?;
    let blob = repo.find_blob(entry.id()).ok()?;
    Some(String::from_utf8_lossy(blob.content()).into_owned())
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every object in the repository, as text.
fn all_objects(repo: &Path) -> String {
    let out = Command::new("git")
        .args(["cat-file", "--batch-all-objects", "--batch"])
        .current_dir(repo)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn canonical(path: &Path) -> PathBuf {
    path.canonicalize().unwrap()
}

fn landed(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::TaskLanded { .. }))
        .count()
}

#[tokio::test]
async fn keys_in_the_daemons_environment_and_the_users_ssh_keys_stay_out_of_reach() {
    let (tmp, state, repo) = state_and_repo();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    let key = "sk-marker-5f1e0c9a2b7d";
    let ssh = "SSH-PRIVATE-MARKER-83c1d0";
    std::fs::write(home.join(".ssh/id_ed25519"), ssh).unwrap();
    let home_text = home.display().to_string();
    let daemon =
        DaemonProcess::start_with_env(&state, &[("OPENAI_API_KEY", key), ("HOME", &home_text)]);
    let config = run_config(
        &attacker(&format!(
            r#"
cat /proc/$PPID/environ > out/loot.txt 2>&1
for f in /proc/*/environ; do cat "$f"; echo; done >> out/loot.txt 2>&1
env >> out/loot.txt
cat ~/.ssh/id_ed25519 {home_text}/.ssh/id_ed25519 >> out/loot.txt 2>&1
ls -la ~ >> out/loot.txt 2>&1
"#
        )),
        1,
    );
    let client = DaemonProcess::client(&state);
    let run = submit(&client, &repo, config).await;
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    assert_eq!(landed(&events), 1);

    let loot = on_main(&repo, "out/loot.txt").expect("the attacker's loot landed");
    assert!(loot.contains("PATH="), "the attack ran: {loot}");
    for marker in [key, ssh] {
        assert!(!loot.contains(marker), "stolen: {loot}");
        assert!(!all_objects(&repo).contains(marker), "in git's objects");
        let journal = std::fs::read(state.join("journal.sqlite")).unwrap();
        assert!(
            !String::from_utf8_lossy(&journal).contains(marker),
            "in the journal"
        );
        assert!(!daemon.log().contains(marker), "in the daemon's log");
        let said =
            serde_json::to_string(&events.iter().map(|e| &e.kind).collect::<Vec<_>>()).unwrap();
        assert!(!said.contains(marker), "in the run's events");
    }
    drop(daemon);
}

#[tokio::test]
async fn the_daemons_socket_token_and_journal_are_hidden() {
    for tcp in [false, true] {
        let daemon = InProcessDaemon::start(tcp);
        let state = canonical(daemon.state_dir());
        let s = state.display();
        let repo = git_repo();
        let config = run_config(
            &attacker(&format!(
                r#"
ls -la {s} > out/loot.txt 2>&1
ls -R {s}/worktrees >> out/loot.txt 2>&1
cat {s}/token >> out/loot.txt 2>&1
[ -S {s}/daemon.sock ] && echo SOCKET-VISIBLE >> out/loot.txt
[ -e {s}/journal.sqlite ] && echo JOURNAL-VISIBLE >> out/loot.txt
"#
            )),
            1,
        );
        let run = submit(&daemon.client, repo.path(), config).await;
        let events = follow_to_end(&daemon.client, &run, None).await;
        assert_eq!(outcome(&events), Some(RunOutcome::Completed));
        let loot = on_main(repo.path(), "out/loot.txt").expect("the loot landed");
        assert!(loot.contains("worktrees"), "the attack ran: {loot}");
        assert!(!loot.contains("SOCKET-VISIBLE"), "{loot}");
        assert!(!loot.contains("JOURNAL-VISIBLE"), "{loot}");
        assert!(!loot.contains("daemon.lock"), "{loot}");
        if tcp {
            let token = std::fs::read_to_string(state.join("token")).unwrap();
            assert!(!loot.contains(token.trim()), "the token was read: {loot}");
        }
        daemon.stop();
    }
}

#[tokio::test]
async fn the_users_checkout_refs_config_and_hooks_are_read_only_to_agents() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let r = canonical(repo.path());
    let opened = git2::Repository::open(&r).unwrap();
    let first = opened.head().unwrap().peel_to_commit().unwrap().id();
    let second = commit_files(&opened, &[("second.txt", "two\n")], "second");
    let rd = r.display();
    let config = run_config(
        &attacker(&format!(
            r#"
echo pwned > {rd}/pwned.txt; echo "checkout $?" >> out/loot.txt
git config core.fsmonitor "touch /tmp/fsmonitor-ran"; echo "fsmonitor $?" >> out/loot.txt
git config --file {rd}/.git/config core.hooksPath /tmp; echo "hookspath $?" >> out/loot.txt
printf '#!/bin/sh\ntouch /tmp/hook-ran\n' > {rd}/.git/hooks/pre-commit; echo "hook $?" >> out/loot.txt
git update-ref refs/heads/main {first}; echo "update-ref $?" >> out/loot.txt
git commit --allow-empty -m forged; echo "commit $?" >> out/loot.txt
git status --short >> out/loot.txt 2>&1; echo "status $?" >> out/loot.txt
"#
        )),
        1,
    );
    let run = submit(&daemon.client, &r, config).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));

    let loot = on_main(&r, "out/loot.txt").expect("the loot landed");
    assert!(loot.contains("status 0"), "git still reads: {loot}");
    for refused in [
        "checkout",
        "fsmonitor",
        "hookspath",
        "hook",
        "update-ref",
        "commit",
    ] {
        assert!(
            !loot.contains(&format!("{refused} 0")),
            "{refused} succeeded: {loot}"
        );
    }
    assert!(!r.join("pwned.txt").exists());
    assert!(!r.join(".git/hooks/pre-commit").exists());
    let git_config = std::fs::read_to_string(r.join(".git/config")).unwrap();
    assert!(!git_config.contains("fsmonitor") && !git_config.contains("hooksPath"));
    // main moved only by flotilla's landing, on top of the user's second commit.
    let log = git(&r, &["log", "--format=%H %an", "main"]);
    assert!(log.contains(&second.to_string()), "{log}");
    assert!(!log.contains("forged"));
    assert_eq!(
        git(&r, &["rev-parse", "main~1"]).trim(),
        second.to_string(),
        "{log}"
    );
    assert!(on_main(&r, "out/done.txt").is_some());
    daemon.stop();
}

/// `[sandbox] writable` naming a directory that holds the checkout and the daemon's state
/// (here their common temporary directory) shows neither: the checkout, its `.git` and the
/// state directory stay as the run's profile has them.
#[tokio::test]
async fn a_writable_path_over_the_checkout_and_state_does_not_open_them() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let r = canonical(repo.path());
    let over = r.parent().unwrap().to_path_buf();
    let rd = r.display();
    let mut config = run_config(
        &attacker(&format!(
            r#"
echo pwned > {rd}/pwned.txt; echo "checkout $?" >> out/loot.txt
echo planted > {rd}/.git/objects/planted; echo "objects $?" >> out/loot.txt
printf '#!/bin/sh\ntouch /tmp/hook-ran\n' > {rd}/.git/hooks/pre-commit; echo "hook $?" >> out/loot.txt
ls {rd}/.git/HEAD > /dev/null; echo "git reads $?" >> out/loot.txt
"#
        )),
        1,
    );
    config["sandbox"]["writable"] = serde_json::json!([over.to_string_lossy()]);
    let run = submit(&daemon.client, &r, config).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));

    let loot = on_main(&r, "out/loot.txt").expect("the loot landed");
    assert!(loot.contains("git reads 0"), "{loot}");
    for refused in ["checkout", "objects", "hook"] {
        assert!(
            !loot.contains(&format!("{refused} 0")),
            "{refused} succeeded: {loot}"
        );
    }
    assert!(!r.join("pwned.txt").exists());
    assert!(!r.join(".git/objects/planted").exists());
    assert!(!r.join(".git/hooks/pre-commit").exists());
    daemon.stop();
}

#[tokio::test]
async fn a_sibling_attempts_workspace_is_out_of_reach() {
    let daemon = InProcessDaemon::start(false);
    let state = canonical(daemon.state_dir());
    let s = state.display();
    let repo = git_repo();
    let scenario = format!(
        r#"
[[planner.answers]]
tasks = [
  {{ description = "attack", scope = ["out1"] }},
  {{ description = "victim", scope = ["out2"] }},
]

[tasks.t1]
writes = {{ "out1/done.txt" = "done\n" }}
run = '''
ls -R {s}/worktrees > out1/loot.txt 2>&1
for d in {s}/worktrees/*/*; do
  [ "$d" = "$PWD" ] && continue
  mkdir -p "$d/out2" && echo injected > "$d/out2/injected.txt" && echo "HIT $d" >> out1/loot.txt
done
true
'''

[tasks.t2]
delay_ms = 300
writes = {{ "out2/victim.txt" = "mine\n" }}
"#
    );
    let run = submit(&daemon.client, repo.path(), run_config(&scenario, 2)).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    assert_eq!(landed(&events), 2);
    let loot = on_main(repo.path(), "out1/loot.txt").expect("the loot landed");
    assert!(!loot.contains("HIT"), "{loot}");
    assert!(
        !loot.contains("t2"),
        "another attempt's worktree is visible: {loot}"
    );
    assert!(on_main(repo.path(), "out2/injected.txt").is_none());
    assert_eq!(
        on_main(repo.path(), "out2/victim.txt").as_deref(),
        Some("mine\n")
    );
    daemon.stop();
}

#[tokio::test]
async fn a_command_left_running_dies_with_a_killed_daemon() {
    let (_tmp, state, repo) = state_and_repo();
    let token = format!("3456.{}", std::process::id());
    // The first attempt leaves a process in a session of its own and hangs; the attempt
    // after the restart completes.
    let scenario = format!(
        r#"
[[planner.answers]]
tasks = [{{ description = "linger", scope = ["out"] }}]

[[tasks.t1.attempts]]
writes = {{ "out/up.txt" = "up\n" }}
run = "setsid sleep {token} > /dev/null 2>&1 & nohup sleep {token} > /dev/null 2>&1 & touch out/started; sleep 600"

[[tasks.t1.attempts]]
writes = {{ "out/done.txt" = "done\n" }}
"#
    );
    let daemon = DaemonProcess::start(&state);
    let client = DaemonProcess::client(&state);
    let run = submit(&client, &repo, run_config(&scenario, 1)).await;
    // Once the background processes run (their worktree says so), the daemon is killed.
    let started = within(PATIENCE, || async {
        let pattern = state.join("worktrees").join(&run);
        std::fs::read_dir(&pattern)
            .into_iter()
            .flatten()
            .flatten()
            .any(|attempt| attempt.path().join("out/started").exists())
            .then_some(())
    })
    .await;
    assert!(started.is_some(), "the first attempt never ran its command");
    assert!(!none_runs_now(&token), "the lingering processes run");
    daemon.kill();
    assert!(
        none_runs(&token).await,
        "a process the agent started outlived the daemon"
    );

    let daemon = DaemonProcess::start(&state);
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    assert!(on_main(&repo, "out/done.txt").is_some());
    drop(daemon);
}

/// Whether some process runs `sleep <token>` right now.
fn none_runs_now(token: &str) -> bool {
    let needle = format!("sleep\0{token}\0");
    !std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        std::fs::read(entry.path().join("cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
    })
}

#[tokio::test]
async fn the_merge_gate_runs_an_agent_rewritten_script_in_the_sandbox() {
    let daemon = InProcessDaemon::start(false);
    let state = canonical(daemon.state_dir());
    let repo = git_repo();
    let r = canonical(repo.path());
    let opened = git2::Repository::open(&r).unwrap();
    commit_files(&opened, &[("check.sh", "exit 0\n")], "the gate");
    let escape = format!("/var/tmp/flotilla-gate-escape-{}", std::process::id());
    let (s, rd) = (state.display(), r.display());
    let scenario = format!(
        r#"
[[planner.answers]]
tasks = [{{ description = "rewrite the gate", scope = ["check.sh"] }}]

[tasks.t1]
writes = {{ "check.sh" = """
echo escaped > {rd}/gate-escape.txt
echo escaped > {escape}
echo escaped > $HOME/gate-escape.txt
ls {s}
cat {s}/journal.sqlite | head -c 64
exit 0
""" }}
"#
    );
    let mut config = run_config(&scenario, 1);
    config["merge"]["gate"] = serde_json::json!(["sh check.sh"]);
    // A change to the gate's own script is held for the user by default (ADR-016); here the
    // user allowed such changes, and the gate must still run the rewritten script only
    // inside the sandbox.
    config["checks"]["config_edits"] = serde_json::json!("allow");
    let run = submit(&daemon.client, &r, config).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    assert_eq!(landed(&events), 1, "the gate passed and the task landed");
    assert!(on_main(&r, "check.sh").unwrap().contains("gate-escape"));
    assert!(!r.join("gate-escape.txt").exists(), "wrote the checkout");
    assert!(
        !Path::new(&escape).exists(),
        "wrote outside the scratch dir"
    );
    let home = std::env::var("HOME").unwrap();
    assert!(!Path::new(&home).join("gate-escape.txt").exists());
    let said = serde_json::to_string(&events.iter().map(|e| &e.kind).collect::<Vec<_>>()).unwrap();
    assert!(!said.contains("SQLite format"), "read the journal: {said}");
    assert!(
        !said.contains("journal.sqlite"),
        "saw the state dir: {said}"
    );
    daemon.stop();
}

#[tokio::test]
async fn the_first_event_says_which_sandbox_is_in_force() {
    let daemon = InProcessDaemon::start(false);
    let repo = git_repo();
    let run = submit(&daemon.client, repo.path(), run_config(&attacker(""), 1)).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    match &events[0].kind {
        EventKind::RunStarted {
            sandbox: Some(sandbox),
            ..
        } => assert!(
            sandbox.contains("bwrap") && sandbox.contains("hidden"),
            "{sandbox}"
        ),
        other => panic!("{other:?}"),
    }
    let status: flotilla::api::status::RunStatus =
        daemon.client.get(&format!("/v1/runs/{run}")).await.unwrap();
    let said = flotilla::cli::render::status::status_text(
        &status,
        &flotilla::cli::render::style::Style::plain(),
    );
    assert!(said.contains("sandbox: bubblewrap"), "{said}");
    let mut config = run_config(&attacker(""), 1);
    config["sandbox"] = serde_json::json!({ "mode": "none" });
    let run = submit(&daemon.client, repo.path(), config).await;
    let events = follow_to_end(&daemon.client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    match &events[0].kind {
        EventKind::RunStarted {
            sandbox: Some(sandbox),
            ..
        } => assert!(sandbox.starts_with("none"), "{sandbox}"),
        other => panic!("{other:?}"),
    }
    daemon.stop();
}

#[tokio::test]
async fn without_bubblewrap_no_run_is_created_unless_the_config_says_none() {
    let (tmp, state, repo) = state_and_repo();
    // A PATH with the shell and git, and no bwrap.
    let bin = tmp.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for tool in ["sh", "git", "true", "mkdir", "cat"] {
        let found = String::from_utf8(
            Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        std::os::unix::fs::symlink(found.trim(), bin.join(tool)).unwrap();
    }
    let path = bin.display().to_string();
    let daemon = DaemonProcess::start_with_env(&state, &[("PATH", &path)]);
    let client = DaemonProcess::client(&state);
    let body = serde_json::json!({
        "request": "x", "repo": repo, "config": run_config(&attacker(""), 1),
    });
    let (status, answer) = client
        .raw(
            hyper::Method::POST,
            "/v1/runs",
            Some(serde_json::to_vec(&body).unwrap()),
        )
        .await
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).to_string();
    assert_eq!(status, hyper::StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert!(
        answer.contains("apt-get install bubblewrap") && answer.contains("mode"),
        "says what to install and how to opt out: {answer}"
    );
    let runs: Vec<serde_json::Value> = client.get("/v1/runs").await.unwrap();
    assert!(runs.is_empty(), "no run was created: {runs:?}");

    let mut config = run_config(&attacker(""), 1);
    config["sandbox"] = serde_json::json!("none");
    let run = submit(&client, &repo, config).await;
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(outcome(&events), Some(RunOutcome::Completed));
    drop(daemon);
}

#[tokio::test]
async fn the_builtin_agents_run_command_cannot_read_the_daemons_keys() {
    // The worker's model (a local fake of an OpenAI endpoint) answers with the attack, then
    // finishes. Its key is the marker: the daemon holds it, the agent must never see it.
    let server = fake_worker_model(
        tool_calls_answer(
            None,
            serde_json::json!([
                tool_call("a", "run_command", serde_json::json!({ "command":
                    "cat /proc/$PPID/environ; for f in /proc/*/environ; do cat $f; done; env" })),
                tool_call("b", "run_command", serde_json::json!({ "command":
                    "mkdir -p out && { for f in /proc/*/environ; do cat $f; echo; done; env; } > out/loot.txt 2>&1; true" })),
            ]),
        ),
        tool_calls_answer(
            None,
            serde_json::json!([tool_call(
                "c",
                "finish",
                serde_json::json!({ "status": "complete", "summary": "looked around" })
            )]),
        ),
    )
    .await;

    let (_tmp, state, repo) = state_and_repo();
    let key = "sk-builtin-marker-7a3c9e1f";
    let daemon = DaemonProcess::start_with_env(&state, &[("OPENAI_API_KEY", key)]);
    let scenario = r#"
[[planner.answers]]
tasks = [{ description = "attack", scope = ["out"] }]
"#;
    let mut config = run_config(scenario, 1);
    use_local_worker_model(&mut config, &server);
    let client = DaemonProcess::client(&state);
    let run = submit(&client, &repo, config).await;
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(
        outcome(&events),
        Some(RunOutcome::Completed),
        "{}",
        daemon.log()
    );
    let loot = on_main(&repo, "out/loot.txt").expect("the loot landed");
    assert!(loot.contains("PATH="), "the attack ran: {loot}");
    assert!(!loot.contains(key), "stolen: {loot}");
    assert!(!all_objects(&repo).contains(key), "in git's objects");
    let journal = std::fs::read(state.join("journal.sqlite")).unwrap();
    assert!(
        !String::from_utf8_lossy(&journal).contains(key),
        "in the journal"
    );
    assert!(!daemon.log().contains(key), "in the daemon's log");
    // What the model read back of its commands (the tool results it was sent).
    let sent: Vec<String> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    assert!(sent.len() >= 2, "the model saw the commands' results");
    // The key the daemon took out of its environment at start is the one its provider
    // client sends, in the header and nowhere else.
    let requests = server.received_requests().await.unwrap();
    for request in &requests {
        assert_eq!(
            request
                .headers
                .get("authorization")
                .map(|v| v.to_str().unwrap().to_string()),
            Some(format!("Bearer {key}")),
            "the provider got the daemon's key"
        );
    }
    assert!(
        sent[1].contains("PATH="),
        "the first command's result: {}",
        sent[1]
    );
    assert!(
        sent.iter().all(|body| !body.contains(key)),
        "a tool result held the key"
    );
    drop(daemon);
}

/// A command agent (an external CLI, here a shell script) run through the sandbox tries to
/// read the daemon's environment for its key, write the user's checkout and its `.git`,
/// move main with `git update-ref` (in its worktree and in the checkout), and write the
/// state directory and the journal. None of it works, and nothing of it lands: main moved
/// only by flotilla's landing of the attempt's own files.
#[tokio::test]
async fn a_command_agent_cli_cannot_read_keys_or_write_the_checkout_refs_or_state() {
    let (_tmp, state, repo) = state_and_repo();
    let (repo, state) = (canonical(&repo), canonical(&state));
    let opened = git2::Repository::open(&repo).unwrap();
    let first = opened.head().unwrap().peel_to_commit().unwrap().id();
    let second = commit_files(&opened, &[("second.txt", "two\n")], "second");
    let key = "sk-command-marker-2e9d4b7c";
    let daemon = DaemonProcess::start_with_env(&state, &[("ANTHROPIC_API_KEY", key)]);

    let cli = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/attacker-cli.sh");
    let scenario = r#"
[[planner.answers]]
tasks = [{ description = "attack", scope = ["out"] }]
"#;
    let mut config = run_config(scenario, 1);
    config["workers"] = serde_json::json!([{ "name": "cli", "agent": "attacker" }]);
    config["agents"] = serde_json::json!({
        "attacker": {
            "program": "sh",
            "args": [
                cli.to_string_lossy(),
                repo.to_string_lossy(),
                state.to_string_lossy(),
                first.to_string(),
                "{prompt_file}",
            ],
            "prompt": "file",
        }
    });
    // The script lives in the source tree, which may be under /tmp (a CI clone): shown
    // read-only, as docs/security.md says to show a tool kept there.
    config["sandbox"] = serde_json::json!({
        "read_only": [cli.parent().unwrap().to_string_lossy()]
    });
    let client = DaemonProcess::client(&state);
    let run = submit(&client, &repo, config).await;
    let events = follow_to_end(&client, &run, None).await;
    assert_eq!(
        outcome(&events),
        Some(RunOutcome::Completed),
        "{}",
        daemon.log()
    );
    assert_eq!(landed(&events), 1);

    let attempts = on_main(&repo, "out/attempts.txt").expect("the CLI's record landed");
    let loot = on_main(&repo, "out/loot.txt").expect("the CLI's loot landed");
    assert!(loot.contains("PATH="), "the attack ran: {loot}");
    for attack in [
        "parent-environ-key",
        "any-environ-key",
        "checkout-write",
        "checkout-git-write",
        "update-ref",
        "update-ref-in-checkout",
        "state-write",
        "journal-write",
    ] {
        let line = attempts
            .lines()
            .find(|l| l.split_once(' ').is_some_and(|(name, _)| name == attack))
            .unwrap_or_else(|| panic!("{attack} was not tried: {attempts}"));
        assert!(!line.ends_with(" 0"), "{attack} succeeded: {attempts}");
    }
    // The key: not read, and nowhere flotilla wrote.
    assert!(!loot.contains(key), "stolen: {loot}");
    assert!(!all_objects(&repo).contains(key), "in git's objects");
    let journal = std::fs::read(state.join("journal.sqlite")).unwrap();
    assert!(
        !String::from_utf8_lossy(&journal).contains(key),
        "in the journal"
    );
    assert!(
        !String::from_utf8_lossy(&journal).contains("pwned"),
        "the journal was written"
    );
    assert!(!daemon.log().contains(key), "in the daemon's log");
    // Nothing landed where it was aimed.
    assert!(!repo.join("PWNED.txt").exists());
    assert!(!repo.join(".git/PWNED").exists());
    assert!(!state.join("PWNED.txt").exists());
    // main moved only by flotilla's landing, on top of the user's second commit.
    let log = git(&repo, &["log", "--format=%H", "main"]);
    assert!(log.contains(&second.to_string()), "{log}");
    assert_eq!(
        git(&repo, &["rev-parse", "main~1"]).trim(),
        second.to_string(),
        "{log}"
    );
    drop(daemon);
}
