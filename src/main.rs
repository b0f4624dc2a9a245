//! The `flotilla` binary: parses the command line, runs the daemon inside an actix System or
//! a client command on a small tokio runtime, and prints what failed (`cli::error`).
//!
//! Provider keys are taken out of the environment first (`keys.rs`); errors end in an
//! `error:` line, `Caused by:` lines and a `hint:` (`cli::error`), and the command's exit
//! code. The commands themselves are in `cli::commands`.

use std::process::ExitCode;

use clap::Parser;
use flotilla::cli::args::{Cli, Command};
use flotilla::cli::commands;
use flotilla::cli::error::CliError;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Daemon {
            listen,
            log_format,
            journal_sync,
            ..
        } => {
            // SAFETY: the process has one thread here: nothing before this (argument
            // parsing) starts one, and the tracing subscriber, the actix System and tokio's
            // runtimes all start later. Removing variables then races no reader of the
            // environment.
            let held = unsafe { flotilla::keys::take_daemon_keys() };
            match harden() {
                Ok(()) => {
                    tune_malloc();
                    commands::daemon::run(&cli, &held, *listen, *log_format, *journal_sync)
                }
                Err(e) => Err(CliError::internal("cannot harden the daemon").because(e)),
            }
        }
        Command::Demo { json, keep, pause } => {
            // The demo runs a daemon in this process: hardened as `daemon` is, and for the
            // same reason before any thread starts (ADR-033).
            // SAFETY: as for `daemon` above: one thread here.
            let _held = unsafe { flotilla::keys::take_daemon_keys() };
            match harden() {
                Ok(()) => commands::demo::run(commands::demo::Options {
                    json: *json,
                    keep: *keep,
                    pause: *pause,
                }),
                Err(e) => Err(CliError::internal("cannot harden the daemon").because(e)),
            }
        }
        command @ Command::Bench { .. } => {
            tune_malloc();
            commands::bench::run_bench(command)
        }
        _ => match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt.block_on(commands::run_client(&cli)),
            Err(e) => Err(CliError::internal("cannot start").because(e)),
        },
    };
    match result {
        Ok(exit) => ExitCode::from(exit as u8),
        Err(e) => {
            if !e.is_quiet() {
                use std::io::Write;
                let _ = std::io::stderr().lock().write_all(e.report().as_bytes());
            }
            ExitCode::from(e.exit() as u8)
        }
    }
}

/// Before anything else of the daemon but taking its keys (ADR-015): no core dumps, and not
/// dumpable, so that a process of the same user (an unsandboxed command) can neither ptrace
/// the daemon nor read its memory, where the keys are, or its `/proc/PID/environ`, which
/// still shows the environment it was started with.
fn harden() -> std::io::Result<()> {
    let none = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on integers and a struct we own.
    unsafe {
        if libc::setrlimit(libc::RLIMIT_CORE, &none) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Makes glibc give back the memory a finished run freed (ADR-013).
/// - Arenas: glibc gives every thread that allocates its own malloc arena (up to 8 per
///   core), and the daemon's blocking threads (SQLite, files) come and go: memory a
///   finished run freed then sits in arenas nobody reuses. Measured on 5,000-task scripted
///   runs, one after another: with the default the daemon's RSS grew by about 30 MB per run
///   (420 MB after 12 runs); with two arenas it stays between 75 and 120 MB.
/// - The mmap threshold: glibc raises it each time a large block is freed (up to 32 MiB),
///   so a big run's large buffers (event batches, graph vectors) end up inside the heap,
///   where a few small live blocks keep the pages from going back. Fixed at 128 KiB (which
///   also stops it moving), they are mapped and unmapped on their own. `flotilla bench`'s
///   memory rows, 10k-task runs: 9.8 MB above idle after each run with the default, 3.6 MB
///   with this.
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it is called before any other thread
    // exists, and a refusal (return 0) leaves the default in place, which is harmless.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}
