//! Where flotilla keeps its state: `$FLOTILLA_STATE_DIR`, else `$XDG_STATE_HOME/flotilla`,
//! else `~/.local/state/flotilla` (the XDG part through `etcetera`). The directory is private
//! (0700): it holds the journal, the daemon's socket and its bearer token, the lock that makes
//! one daemon its only owner, and the marker that says a journal existed here.

use std::path::{Path, PathBuf};

use etcetera::base_strategy::{BaseStrategy, Xdg};

/// The state directory when `--state-dir`/`$FLOTILLA_STATE_DIR` names none: XDG's state home
/// (`$XDG_STATE_HOME` when absolute, else `~/.local/state`) on every platform, so that a
/// state directory never moves with the OS's conventions; `./.local/state` without a home.
pub fn default_state_dir() -> PathBuf {
    Xdg::new()
        .ok()
        .and_then(|xdg| xdg.state_dir())
        .unwrap_or_else(|| PathBuf::from(".local/state"))
        .join("flotilla")
}

pub fn journal_path(state_dir: &Path) -> PathBuf {
    state_dir.join("journal.sqlite")
}

pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join("daemon.sock")
}

pub fn token_path(state_dir: &Path) -> PathBuf {
    state_dir.join("token")
}

/// Held (an exclusive `flock`) by the daemon for its whole life; holds its PID.
pub fn lock_path(state_dir: &Path) -> PathBuf {
    state_dir.join("daemon.lock")
}

/// The mark every command of this state directory's daemons carries (random, made once):
/// what the next daemon ends if one dies with commands running (`process::left_behind`).
pub fn daemon_mark_path(state_dir: &Path) -> PathBuf {
    state_dir.join("daemon.mark")
}

/// Written once the journal exists: a journal that later goes missing or empty is then a
/// loss to report, not a first start.
pub fn journal_marker_path(state_dir: &Path) -> PathBuf {
    state_dir.join("journal.marker")
}

/// The git worktrees of agent attempts, one directory per run (`worktrees/<run>/<task>-a<n>`).
pub fn worktrees_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("worktrees")
}

/// Attempts' transcripts, one directory per run (`transcripts/<run>/<task>-a<n>.jsonl`).
pub fn transcripts_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("transcripts")
}

/// Creates the state directory with mode 0700 (and tightens an existing one).
pub fn ensure_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}
