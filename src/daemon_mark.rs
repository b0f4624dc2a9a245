//! The mark every command a daemon starts carries (ADR-050): a random id kept in the state
//! directory, put in bwrap's environment (or an unsandboxed command's), by which the next
//! daemon on the directory finds what a dead one left running (`process::left_behind`).
//! A leaf: the sandbox policy holds it, the process runner puts it on commands.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The variable that carries the mark.
pub const MARK_VARIABLE: &str = "FLOTILLA_DAEMON_MARK";

/// The mark of one state directory's daemons: a random id made once and kept in the state
/// directory (`daemon.mark`), so that it is the directory's however its path is spelled, and
/// two state directories never end each other's commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonMark(String);

impl DaemonMark {
    /// The mark of the state directory `state_dir`, made (and kept) if it has none or a
    /// damaged one. Call with the state lock held (or in a test's own directory).
    pub fn of(state_dir: &Path) -> io::Result<Self> {
        let path = crate::paths::daemon_mark_path(state_dir);
        if let Ok(kept) = fs::read_to_string(&path)
            && let Some(mark) = Self::parse(kept.trim())
        {
            return Ok(mark);
        }
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|e| io::Error::other(e.to_string()))?;
        let mark = DaemonMark(bytes.iter().map(|b| format!("{b:02x}")).collect());
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)?;
        file.write_all(mark.0.as_bytes())?;
        file.sync_all()?;
        Ok(mark)
    }

    fn parse(text: &str) -> Option<Self> {
        (text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| DaemonMark(text.to_string()))
    }

    /// The variable and value to put in the environment of a command started for the
    /// daemon marked so.
    pub fn variable(&self) -> (OsString, OsString) {
        (MARK_VARIABLE.into(), self.0.clone().into())
    }

    /// The whole `NAME=value` entry, as it appears in an environment block.
    pub(crate) fn entry(&self) -> Vec<u8> {
        format!("{MARK_VARIABLE}={}", self.0).into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_directory_keeps_its_mark_and_another_has_another() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let mark = DaemonMark::of(a.path()).unwrap();
        assert_eq!(mark, DaemonMark::of(a.path()).unwrap());
        assert_ne!(mark, DaemonMark::of(b.path()).unwrap());
        // However the directory is named.
        let link = b.path().join("link");
        std::os::unix::fs::symlink(a.path(), &link).unwrap();
        assert_eq!(mark, DaemonMark::of(&link).unwrap());
        // A damaged one is made again.
        fs::write(crate::paths::daemon_mark_path(a.path()), "not a mark").unwrap();
        let again = DaemonMark::of(a.path()).unwrap();
        assert_ne!(again, mark);
        assert_eq!(again, DaemonMark::of(a.path()).unwrap());
    }
}
