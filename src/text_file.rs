//! The text files flotilla reads that someone else wrote (a config, a scenario, a prompt,
//! the daemon's token file): only regular files, at most [`MAX_FILE_BYTES`], UTF-8; and
//! where a TOML text is wrong, by line and column, without quoting it. A leaf: it knows
//! nothing of what the files mean (`config`, `scripted` and the CLI do).

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The largest config or scenario file read. Anything bigger is refused unread.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Where and why a TOML text does not parse or does not fit its format. It names the
/// position and the problem, never the text itself: the file may be anything (a path in a
/// config can name `/etc/shadow`), and the error goes back to whoever asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TomlProblem {
    pub line: usize,
    pub column: usize,
    pub problem: String,
}

impl TomlProblem {
    pub fn new(text: &str, error: &toml::de::Error) -> Self {
        let at = error.span().map_or(0, |span| span.start.min(text.len()));
        let before = text.get(..at).unwrap_or("");
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
        TomlProblem {
            line,
            column,
            problem: without_values(error.message()),
        }
    }
}

impl fmt::Display for TomlProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {}, column {}: {}",
            self.line, self.column, self.problem
        )
    }
}

/// A parser message without the values it quotes: serde's "invalid type: string \"…\",
/// expected u64" and "unknown variant `…`, expected one of …" carry text from the file.
/// Key names (unknown or missing fields) stay: they say what to fix.
fn without_values(message: &str) -> String {
    let message = message.trim();
    for (start, what) in [
        ("invalid type:", "wrong type"),
        ("invalid value:", "invalid value"),
        ("invalid length", "wrong number of items"),
        ("unknown variant", "unknown value"),
    ] {
        if message.starts_with(start) {
            return match message.split_once(", expected ") {
                Some((_, expected)) => format!("{what}, expected {expected}"),
                None => what.to_string(),
            };
        }
    }
    message.to_string()
}

/// Why a file was not read. Never quotes the file's contents.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a regular file; configs and scenarios must be")]
    NotAFile { path: PathBuf },
    #[error("{path} is larger than {MAX_FILE_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("{path} is not UTF-8 text")]
    NotText { path: PathBuf },
}

/// Reads a config or scenario file: only a regular file (not a device such as `/dev/zero`,
/// a FIFO or a directory), at most [`MAX_FILE_BYTES`], UTF-8.
pub fn read(path: &Path) -> Result<String, FileError> {
    let failed = |source| FileError::Read {
        path: path.into(),
        source,
    };
    let not_a_file = || FileError::NotAFile { path: path.into() };
    if !std::fs::metadata(path).map_err(failed)?.is_file() {
        return Err(not_a_file());
    }
    // Non-blocking, so that a FIFO put in the file's place since the check cannot park the
    // thread in open(); checked again on what was opened.
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(failed)?;
    if !file.metadata().map_err(failed)?.is_file() {
        return Err(not_a_file());
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(failed)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(FileError::TooLarge { path: path.into() });
    }
    String::from_utf8(bytes).map_err(|_| FileError::NotText { path: path.into() })
}
