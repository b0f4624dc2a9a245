//! `TokioProcessRunner`: exits, stdin, the wall and stall limits, cancel, the process group
//! (nothing a command started survives it), the output cap, lines as they arrive, the
//! scrubbed environment, spawn errors and the sandbox.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla::process::{ConfinedRunner, TokioProcessRunner};
use flotilla::sandbox::{SandboxConfig, SandboxMode, SandboxPolicy};
use flotilla_actors::ports::{
    CommandLimits, CommandSpec, EnvPolicy, Exit, LineSink, ProcessError, ProcessRunner, Sandbox,
    Stream, scrubbed_env,
};
use flotilla_actors::testing::{PATIENCE, eventually, within};
use tokio_util::sync::CancellationToken;

fn sh(line: &str, dir: &std::path::Path) -> CommandSpec {
    CommandSpec::shell(line, dir)
}

async fn run(spec: CommandSpec) -> flotilla_actors::ports::CommandOutput {
    TokioProcessRunner
        .run(spec, CancellationToken::new(), None)
        .await
        .unwrap()
}

/// A runner with `[sandbox] mode = "none"`: what the process-group tests below look at is
/// the host's pids, which a sandboxed command's pid namespace hides (the sandboxed case is
/// `a_sandboxed_command_leaves_nothing_behind`).
pub(crate) fn unsandboxed() -> ConfinedRunner {
    let config = SandboxConfig {
        mode: SandboxMode::None,
        ..SandboxConfig::default()
    };
    ConfinedRunner::new(SandboxPolicy::for_run(
        &config,
        &[],
        std::path::Path::new("/nonexistent"),
    ))
}

async fn run_unsandboxed(spec: CommandSpec) -> flotilla_actors::ports::CommandOutput {
    unsandboxed()
        .run(spec, CancellationToken::new(), None)
        .await
        .unwrap()
}

/// Whether no process on the host runs `sleep <token>` (a bounded wait for them to go). Also used by the escape tests.
pub(crate) async fn none_runs(token: &str) -> bool {
    let needle = format!("sleep\0{token}\0");
    within(PATIENCE, || async {
        let mut alive = false;
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let zombie = stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
            if !zombie && String::from_utf8_lossy(&cmdline).contains(&needle) {
                alive = true;
            }
        }
        (!alive).then_some(())
    })
    .await
    .is_some()
}

/// Whether the process with this pid is dead (a bounded wait for it to go). A zombie counts
/// as dead: an orphan is reaped by pid 1, which in some containers never reaps.
async fn gone(pid: i32) -> bool {
    within(PATIENCE, || async {
        // SAFETY: signal 0 only checks for existence.
        let exists = unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                stat.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            })
            .unwrap_or(false);
        (!exists || zombie).then_some(())
    })
    .await
    .is_some()
}

async fn pid_in(file: &std::path::Path) -> i32 {
    eventually(format!("a pid in {}", file.display()), || async {
        std::fs::read_to_string(file).ok()?.trim().parse().ok()
    })
    .await
}

#[tokio::test]
async fn exit_codes_output_and_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(sh("echo hello; echo oops >&2", dir.path())).await;
    assert_eq!(out.exit, Exit::Code { code: 0 });
    assert_eq!(out.stdout.text, "hello\n");
    assert_eq!(out.stderr.text, "oops\n");
    assert!(!out.stdout.truncated());
    assert_eq!(
        run(sh("exit 3", dir.path())).await.exit,
        Exit::Code { code: 3 }
    );
    let mut cat = sh("cat", dir.path());
    cat.stdin = Some(b"from stdin".to_vec());
    assert_eq!(run(cat).await.stdout.text, "from stdin");
    let killed = run(sh("kill -9 $$", dir.path())).await;
    assert_eq!(killed.exit, Exit::Signal { signal: 9 });
}

#[tokio::test]
async fn a_command_past_its_time_is_killed_with_everything_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let mut spec = sh("sleep 300 & echo $! > pid; sleep 300", dir.path());
    // Long enough for a loaded machine's shell to write the pid file before it is killed.
    spec.limits.wall = Duration::from_secs(2);
    let started = Instant::now();
    let out = run_unsandboxed(spec).await;
    assert_eq!(out.exit, Exit::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(
        gone(pid_in(&pidfile).await).await,
        "the background child survived"
    );
}

#[tokio::test]
async fn a_command_that_exits_leaves_no_background_child_behind() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let started = Instant::now();
    let out = run_unsandboxed(sh("sleep 300 & echo $! > pid; exit 0", dir.path())).await;
    assert_eq!(out.exit, Exit::Code { code: 0 });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the pipes it held did not hold us up"
    );
    assert!(
        gone(pid_in(&pidfile).await).await,
        "the background child survived"
    );
}

#[tokio::test]
async fn silence_past_the_stall_limit_kills_and_steady_output_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut quiet = sh("echo started; sleep 300", dir.path());
    // The stall clock starts before bwrap sets up its namespaces: long enough for a loaded
    // machine to print the first line.
    quiet.limits.stall = Some(Duration::from_secs(2));
    let out = run(quiet).await;
    assert_eq!(out.exit, Exit::Stalled);
    assert_eq!(out.stdout.text, "started\n");

    let mut steady = sh(
        "i=0; while [ $i -lt 10 ]; do echo tick; sleep 0.1; i=$((i+1)); done",
        dir.path(),
    );
    steady.limits.stall = Some(Duration::from_secs(3));
    let out = run(steady).await;
    assert_eq!(out.exit, Exit::Code { code: 0 });
    assert_eq!(out.stdout.text.lines().count(), 10);
}

#[tokio::test]
async fn a_cancel_kills_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let cancel = CancellationToken::new();
    let running = tokio::spawn(unsandboxed().run(
        sh("sleep 300 & echo $! > pid; sleep 300", dir.path()),
        cancel.clone(),
        None,
    ));
    let pid = pid_in(&pidfile).await;
    cancel.cancel();
    let out = running.await.unwrap().unwrap();
    assert_eq!(out.exit, Exit::Cancelled);
    assert!(gone(pid).await);
}

#[tokio::test]
async fn dropping_the_run_kills_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let running = tokio::spawn(unsandboxed().run(
        sh("sleep 300 & echo $! > pid; sleep 300", dir.path()),
        CancellationToken::new(),
        None,
    ));
    let pid = pid_in(&pidfile).await;
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());
    assert!(gone(pid).await, "the background child survived");
}

#[tokio::test]
async fn output_is_capped_head_and_tail_and_says_how_much_was_cut() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = sh(
        "printf 'HEAD'; head -c 1000000 /dev/zero | tr '\\0' a; printf 'TAIL'",
        dir.path(),
    );
    spec.limits = CommandLimits {
        output_bytes: 1024,
        ..CommandLimits::default()
    };
    let out = run(spec).await;
    assert_eq!(out.stdout.total_bytes, 1_000_008);
    assert!(out.stdout.truncated());
    assert!(
        out.stdout.text.len() <= 1024 + 64,
        "{}",
        out.stdout.text.len()
    );
    assert!(out.stdout.text.starts_with("HEADaaa"));
    assert!(out.stdout.text.ends_with("aaaTAIL"));
    assert!(out.stdout.text.contains("bytes cut"));
}

#[tokio::test]
async fn lines_arrive_in_order_tagged_by_stream() {
    let dir = tempfile::tempdir().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let seen = seen.clone();
        LineSink::new(move |stream, line| seen.lock().unwrap().push((stream, line.to_string())))
    };
    TokioProcessRunner
        .run(
            sh(
                "printf 'a\\nb\\n'; echo e >&2; sleep 0.2; printf c",
                dir.path(),
            ),
            CancellationToken::new(),
            Some(sink),
        )
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    let out: Vec<&str> = seen
        .iter()
        .filter(|(s, _)| *s == Stream::Stdout)
        .map(|(_, l)| l.as_str())
        .collect();
    assert_eq!(out, ["a", "b", "c"], "the last line without a newline too");
    assert!(seen.contains(&(Stream::Stderr, "e".to_string())));
}

#[tokio::test]
async fn lines_arrive_while_the_command_still_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let sink = LineSink::new(move |_, line| {
        let _ = tx.send(line.to_string());
    });
    // It waits for a file the test writes only once the first line has arrived.
    let running = tokio::spawn(TokioProcessRunner.run(
        sh(
            "echo first; while [ ! -e go ]; do sleep 0.05; done; echo second",
            dir.path(),
        ),
        CancellationToken::new(),
        Some(sink),
    ));
    let first = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("the first line came while the command waited");
    assert_eq!(first.as_deref(), Some("first"));
    assert!(!running.is_finished());
    std::fs::write(dir.path().join("go"), "").unwrap();
    let out = running.await.unwrap().unwrap();
    assert_eq!(out.exit, Exit::Code { code: 0 });
    assert_eq!(rx.recv().await.as_deref(), Some("second"));
}

#[tokio::test]
async fn an_overlong_line_reaches_the_sink_cut_at_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let seen = seen.clone();
        LineSink::new(move |_, line| seen.lock().unwrap().push(line.to_string()))
    };
    let mut spec = sh(
        "head -c 5000 /dev/zero | tr '\\0' b; echo; echo after",
        dir.path(),
    );
    spec.limits.output_bytes = 1024;
    TokioProcessRunner
        .run(spec, CancellationToken::new(), Some(sink))
        .await
        .unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        ["b".repeat(1024), "after".to_string()]
    );
}

#[tokio::test]
async fn the_environment_is_only_what_the_caller_built() {
    let dir = tempfile::tempdir().unwrap();
    let path = std::env::var("PATH").unwrap();
    let daemon = vec![
        ("PATH".to_string(), path),
        ("OPENAI_API_KEY".to_string(), "sk-test-secret".to_string()),
        ("FLOTILLA_TOKEN".to_string(), "flotilla-secret".to_string()),
        ("HOME".to_string(), "/home/someone".to_string()),
    ];
    let mut spec = sh("", dir.path());
    // `env` itself rather than a shell, which would add PWD and SHLVL of its own.
    spec.program = "env".into();
    spec.args.clear();
    spec.env = scrubbed_env(daemon, &EnvPolicy::default(), &[]);
    let expected: Vec<String> = spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let out = run(spec).await;
    let mut got: Vec<String> = out.stdout.text.lines().map(str::to_string).collect();
    got.sort();
    // bwrap sets PWD to the working directory it changed to; nothing else is added.
    let pwd = format!("PWD={}", dir.path().canonicalize().unwrap().display());
    got.retain(|line| *line != pwd);
    assert_eq!(got, expected, "exactly the caller's environment");
    assert!(!out.stdout.text.contains("secret"));
    // The test process's own variables (cargo sets this one) do not leak either.
    assert!(std::env::var("CARGO_MANIFEST_DIR").is_ok());
    assert!(!out.stdout.text.contains("CARGO_MANIFEST_DIR"));
}

#[tokio::test]
async fn a_program_that_cannot_start_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = sh("", dir.path());
    spec.program = "definitely-not-a-program-xyz".into();
    spec.args.clear();
    let error = TokioProcessRunner
        .run(spec, CancellationToken::new(), None)
        .await
        .unwrap_err();
    // Missing, as opposed to failing to start: a caller need not try it again.
    match &error {
        ProcessError::NotFound { program, detail } => {
            assert_eq!(program, "definitely-not-a-program-xyz");
            assert_eq!(detail, "on PATH");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        error.to_string(),
        "definitely-not-a-program-xyz: program not found on PATH"
    );
    let gone_dir = sh("true", &dir.path().join("missing"));
    let error = TokioProcessRunner
        .run(gone_dir, CancellationToken::new(), None)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("working directory"), "{error}");
}

#[tokio::test]
async fn the_sandbox_is_refused_where_bwrap_is_missing_and_confines_where_it_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = sh(
        "touch inside && touch /var/tmp/flotilla-sandbox-escape",
        dir.path(),
    );
    spec.sandbox = Sandbox::Bwrap;
    let result = TokioProcessRunner
        .run(spec, CancellationToken::new(), None)
        .await;
    match result {
        Err(ProcessError::SandboxUnavailable(_)) => {
            eprintln!("bwrap is not installed here: only the refusal is checked");
        }
        Ok(out) => {
            assert!(
                dir.path().join("inside").exists(),
                "the worktree is writable"
            );
            assert!(!out.exit.success(), "writing outside the worktree failed");
            assert!(!std::path::Path::new("/var/tmp/flotilla-sandbox-escape").exists());
        }
        Err(other) => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_sandboxed_command_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let token = |n: u32| format!("{}.{}", 3000 + n, std::process::id());
    // It exits with a background child, even one in a session of its own.
    let exits = token(1);
    let out = run(sh(
        &format!("sleep {exits} & setsid sleep {exits} & exit 0"),
        dir.path(),
    ))
    .await;
    assert_eq!(out.exit, Exit::Code { code: 0 });
    assert!(none_runs(&exits).await, "a background child survived");
    // It runs past its time.
    let late = token(2);
    let mut spec = sh(&format!("setsid sleep {late} & sleep {late}"), dir.path());
    spec.limits.wall = Duration::from_millis(300);
    assert_eq!(run(spec).await.exit, Exit::TimedOut);
    assert!(none_runs(&late).await, "a child survived the time limit");
    // It is cancelled, once it is surely running.
    let cancelled = token(3);
    let cancel = CancellationToken::new();
    let running = tokio::spawn(TokioProcessRunner.run(
        sh(
            &format!("setsid sleep {cancelled} & echo started > started; sleep {cancelled}"),
            dir.path(),
        ),
        cancel.clone(),
        None,
    ));
    written(&dir.path().join("started")).await;
    cancel.cancel();
    assert_eq!(running.await.unwrap().unwrap().exit, Exit::Cancelled);
    assert!(none_runs(&cancelled).await, "a child survived the cancel");
}

/// Waits (bounded) for a file to be written.
async fn written(file: &std::path::Path) {
    eventually(format!("{} to be written", file.display()), || async {
        tokio::fs::metadata(file).await.ok().map(drop)
    })
    .await
}

#[tokio::test]
async fn a_command_whose_path_has_no_bwrap_is_refused_with_what_to_install() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = sh("true", dir.path());
    spec.env = vec![("PATH".into(), "/nonexistent".into())];
    match TokioProcessRunner
        .run(spec, CancellationToken::new(), None)
        .await
    {
        Err(ProcessError::SandboxUnavailable(why)) => {
            assert!(why.contains("apt-get install bubblewrap"), "{why}");
            assert!(why.contains("mode = \"none\""), "{why}");
        }
        other => panic!("{other:?}"),
    }
}

/// An agent can write its workspace and the directories `[sandbox] writable` shows (say
/// `~/.cargo`, whose `bin` is on the PATH): a `bwrap` it puts there, or a link there to a
/// file of its own anywhere, must never be the one that starts a command, or that command,
/// and all after it, would run on the host unsandboxed. Nor one in a directory the run
/// hides (another run may show it writable), nor through a relative PATH entry (`.`,
/// `bin`), which is found from the daemon's directory but started from the workspace.
#[tokio::test]
async fn a_bwrap_an_agent_planted_on_the_path_is_never_started() {
    use std::os::unix::fs::PermissionsExt;
    let workspace = tempfile::tempdir().unwrap();
    let shown = tempfile::tempdir().unwrap();
    let hidden = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let linked = tempfile::tempdir().unwrap();
    let escaped = std::env::temp_dir().join(format!("flotilla-escaped.{}", std::process::id()));
    let _ = std::fs::remove_file(&escaped);
    let planted = format!("#!/bin/sh\ntouch {}\nexec \"$@\"\n", escaped.display());
    let plant = |file: &std::path::Path| {
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, &planted).unwrap();
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    plant(&workspace.path().join("bwrap"));
    plant(&workspace.path().join("bin/bwrap"));
    plant(&shown.path().join("bin/bwrap"));
    plant(&hidden.path().join("bin/bwrap"));
    // A link in the writable directory to a file outside every place the check knows.
    plant(&elsewhere.path().join("evil"));
    std::fs::create_dir_all(linked.path().join("bin")).unwrap();
    std::os::unix::fs::symlink(
        elsewhere.path().join("evil"),
        linked.path().join("bin/bwrap"),
    )
    .unwrap();
    let config = SandboxConfig {
        writable: vec![
            shown.path().display().to_string(),
            linked.path().display().to_string(),
        ],
        hidden: vec![hidden.path().display().to_string()],
        ..SandboxConfig::default()
    };
    let runner = ConfinedRunner::new(SandboxPolicy::for_run(
        &config,
        &[],
        std::path::Path::new("/nonexistent"),
    ));
    let system = std::env::var("PATH").unwrap();
    for path in [
        format!("{}:{system}", shown.path().join("bin").display()),
        format!("{}:{system}", linked.path().join("bin").display()),
        format!("{}:{system}", hidden.path().join("bin").display()),
        format!("{}:{system}", workspace.path().display()),
        format!(".:bin:{system}"),
    ] {
        let mut spec = sh("echo ran", workspace.path());
        spec.env = vec![("PATH".into(), path.clone())];
        let out = runner
            .run(spec, CancellationToken::new(), None)
            .await
            .unwrap();
        assert_eq!(out.exit, Exit::Code { code: 0 }, "PATH {path}: {out:?}");
        assert_eq!(out.stdout.text.trim(), "ran");
        assert!(
            !escaped.exists(),
            "PATH {path}: the planted bwrap was started"
        );
    }
}

/// `[sandbox] allow_tcp_ports`: a command with the host's network connects to an allowed
/// port and is refused on another (Landlock, put in force before exec, so bwrap and the
/// shell inside inherit it), with and without bwrap. Without the allow-list both connect:
/// the listeners are reachable, and the refusal is the allow-list's.
#[tokio::test]
async fn a_port_allow_list_lets_a_command_connect_to_its_ports_only() {
    use std::net::TcpListener;
    let dir = tempfile::tempdir().unwrap();
    let allowed = TcpListener::bind("127.0.0.1:0").unwrap();
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    for listener in [&allowed, &other] {
        listener.set_nonblocking(true).unwrap();
    }
    let (p1, p2) = (
        allowed.local_addr().unwrap().port(),
        other.local_addr().unwrap().port(),
    );
    // Whether a connection reached the listener (it waits in the backlog once made).
    let reached = |listener: &TcpListener| match listener.accept() {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(e) => panic!("{e}"),
    };
    let line = format!(
        "(exec 3<>/dev/tcp/127.0.0.1/{p1}) && echo p1-connected; \
         (exec 4<>/dev/tcp/127.0.0.1/{p2}) && echo p2-connected; true"
    );
    for mode in [SandboxMode::Bwrap, SandboxMode::None] {
        for ports in [Some(vec![p1]), None] {
            let config = SandboxConfig {
                mode,
                allow_tcp_ports: ports.clone(),
                ..SandboxConfig::default()
            };
            let runner = ConfinedRunner::new(SandboxPolicy::for_run(
                &config,
                &[],
                std::path::Path::new("/nonexistent"),
            ));
            let mut spec = sh(&line, dir.path());
            spec.program = "bash".into();
            spec.sandbox = Sandbox::Network;
            let out = runner
                .run(spec, CancellationToken::new(), None)
                .await
                .unwrap();
            let said = format!(
                "{mode:?} {ports:?}: {} {}",
                out.stdout.text, out.stderr.text
            );
            assert!(out.stdout.text.contains("p1-connected"), "{said}");
            assert!(reached(&allowed), "{said}");
            if ports.is_some() {
                assert!(!out.stdout.text.contains("p2-connected"), "{said}");
                assert!(out.stderr.text.contains("Permission denied"), "{said}");
                assert!(!reached(&other), "{said}");
                assert!(runner.policy().describe().contains(&format!("port {p1}")));
            } else {
                assert!(out.stdout.text.contains("p2-connected"), "{said}");
                assert!(reached(&other), "{said}");
            }
        }
    }
}

/// `[sandbox] hidden`: a path a run's commands must not read (an evaluation's acceptance
/// tests) is an empty directory inside the sandbox, while the rest of the file system
/// stays readable.
#[tokio::test]
async fn a_hidden_path_is_empty_inside_the_sandbox() {
    let outside = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let secret = outside.path().join("acceptance");
    std::fs::create_dir_all(&secret).unwrap();
    std::fs::write(secret.join("test.sh"), "expected answer\n").unwrap();
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    // Shown explicitly: the clone may live under /tmp, which every sandbox hides. What
    // is hidden stays hidden under a path shown read-only.
    let shown_dir = outside.path().display().to_string();
    let read = |hidden: Vec<String>| {
        let runner = ConfinedRunner::new(SandboxPolicy::for_run(
            &SandboxConfig {
                read_only: vec![shown_dir.clone()],
                hidden,
                ..SandboxConfig::default()
            },
            &[],
            std::path::Path::new("/nonexistent"),
        ));
        let line = format!(
            "cat {}/test.sh; ls -A {}",
            secret.display(),
            secret.display()
        );
        let spec = sh(&line, work.path());
        async move {
            runner
                .run(spec, CancellationToken::new(), None)
                .await
                .unwrap()
        }
    };
    let shown = read(Vec::new()).await;
    assert_eq!(shown.exit, Exit::Code { code: 0 }, "{shown:?}");
    assert!(shown.stdout.text.contains("expected answer"), "{shown:?}");
    let hidden = read(vec![secret.display().to_string()]).await;
    // `cat` finds no file, and `ls -A` an empty directory.
    assert_eq!(hidden.stdout.text, "", "{hidden:?}");
    assert!(
        hidden.stderr.text.contains("No such file or directory"),
        "{hidden:?}"
    );
}

/// A daemon killed outright can leave a sandbox's namespace running (bwrap's init asks for
/// its parent's death signal only a while after it was forked). Every command carries the
/// daemon's mark where bwrap and its namespace's init keep it, not where the command sees
/// it; and the next daemon's `end_left_behind` ends that namespace, with what the command
/// left in it, and nothing of another daemon's.
#[tokio::test]
async fn a_sandbox_carries_its_daemons_mark_and_the_next_daemon_ends_it() {
    use flotilla::process::left_behind::{DaemonMark, MARK_VARIABLE, carrying, end_left_behind};
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let mark = DaemonMark::of(state.path()).unwrap();
    let runner = ConfinedRunner::new(
        SandboxPolicy::for_run(
            &SandboxConfig::default(),
            &[],
            std::path::Path::new("/nonexistent"),
        )
        .marked(mark.clone()),
    );
    let token = format!("4001.{}", std::process::id());
    let spec = sh(
        &format!("env > seen; setsid sleep {token} & echo started > started; sleep {token}"),
        dir.path(),
    );
    let running =
        tokio::spawn(async move { runner.run(spec, CancellationToken::new(), None).await });
    written(&dir.path().join("started")).await;
    let seen = std::fs::read_to_string(dir.path().join("seen")).unwrap();
    assert!(
        !seen.contains(MARK_VARIABLE),
        "the command does not see the mark: {seen}"
    );
    // Another state directory's mark ends nothing of this one.
    let elsewhere = tempfile::tempdir().unwrap();
    let other = DaemonMark::of(elsewhere.path()).unwrap();
    assert!(end_left_behind(&other).killed.is_empty());

    // bwrap (the runner's child) and its namespace's init, its child, which outlives
    // bwrap when the daemon dies at the wrong moment: the one that matters.
    let marked = carrying(&mark);
    assert_eq!(marked.len(), 2, "carrying the mark: {marked:?}");
    let parent_of = |pid: i32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after = stat.rsplit_once(')').unwrap().1.to_string();
        after
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<i32>()
            .unwrap()
    };
    assert!(
        parent_of(marked[1]) == marked[0] || parent_of(marked[0]) == marked[1],
        "one is the other's child: {marked:?}"
    );
    let ended = end_left_behind(&mark);
    assert!(!ended.killed.is_empty());
    let out = within(PATIENCE, || async { running.is_finished().then_some(()) }).await;
    assert!(out.is_some(), "the run ended once its sandbox was ended");
    assert!(
        none_runs(&token).await,
        "what the command left in its namespace is gone"
    );
}

/// Unsandboxed, the command itself carries the mark, and so does what it starts, even in a
/// session of its own.
#[tokio::test]
async fn an_unsandboxed_command_and_its_children_carry_the_mark() {
    use flotilla::process::left_behind::{DaemonMark, end_left_behind};
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let mark = DaemonMark::of(state.path()).unwrap();
    let config = SandboxConfig {
        mode: SandboxMode::None,
        ..SandboxConfig::default()
    };
    let runner = ConfinedRunner::new(
        SandboxPolicy::for_run(&config, &[], std::path::Path::new("/nonexistent"))
            .marked(mark.clone()),
    );
    let token = format!("4002.{}", std::process::id());
    let spec = sh(
        &format!("setsid sleep {token} & echo $! > started; sleep {token}"),
        dir.path(),
    );
    let running =
        tokio::spawn(async move { runner.run(spec, CancellationToken::new(), None).await });
    let detached = pid_in(&dir.path().join("started")).await;
    let ended = end_left_behind(&mark);
    assert!(
        ended.killed.contains(&detached),
        "the child in its own session carries the mark: killed {:?}",
        ended.killed
    );
    assert!(
        within(PATIENCE, || async { running.is_finished().then_some(()) })
            .await
            .is_some()
    );
    assert!(none_runs(&token).await);
}
