//! The `flotilla` commands. Library errors are typed; here, at the edge, they become an
//! `error:` line, a `Caused by:` line per cause and a `hint:`, and an exit code (see
//! [`error::Exit`]). No stack traces.
//!
//! - [`args`]: the command line (clap). [`commands`]: one file per command.
//! - [`client`]: the HTTP client (the daemon's Unix socket, or loopback TCP with its token).
//! - [`render`]: how events, status and lists print. [`error`]: what a failure says.
//!
//! A closed stdout ends a command quietly; Ctrl-C while following a run stops following
//! (exit 130) and says how to resume (`tail RUN --since SEQ`); API errors get hints.
//!
//! Talks to the daemon over HTTP only, with the wire types of `api`: nothing here reaches
//! into the daemon's state (starting one, `flotilla daemon`, is the exception).

pub mod args;
pub mod client;
pub mod commands;
pub mod error;
pub mod render;

use error::CliError;

/// Writes to stdout. A closed pipe (the reader went away, as in `flotilla tail RUN | head`)
/// ends the command quietly instead of panicking, as `println!` would.
pub(crate) fn emit(text: &str) -> Result<(), CliError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(CliError::output_closed()),
        Err(e) => Err(CliError::internal("cannot write the output").because(e)),
    }
}

/// Writes a note to stderr; a closed stderr is not worth failing for.
pub(crate) fn note(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}
