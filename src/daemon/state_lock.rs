//! One daemon per state directory. The daemon takes an exclusive lock on
//! `<state-dir>/daemon.lock` before it opens the journal for writing or resumes anything,
//! and holds it for its whole life; the kernel releases it when the process ends, however it
//! ends (a SIGKILL included), so a lock is never stale.
//!
//! A second daemon on the same directory fails at once, naming the PID that holds the lock,
//! and writes nothing: without this, two daemons would resume the same runs and complete
//! tasks twice (with `--listen` nothing else stops them). Only when that PID is gone (a
//! child of a killed daemon, between its fork and exec, still holds the descriptor) does it
//! wait, at most [`HANDOVER`].
//!
//! The lock is [`StateLock`].

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::paths;

/// The held lock. Dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct StateLock {
    file: File,
    path: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "another flotilla daemon (PID {pid}) holds the state directory {dir}",
        pid = holder.map_or_else(|| "unknown".to_string(), |p| p.to_string()),
        dir = dir.display()
    )]
    Held { dir: PathBuf, holder: Option<u32> },
    #[error("cannot lock {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl StateLock {
    /// Takes the lock or fails at once; never waits.
    pub fn acquire(state_dir: &Path) -> Result<StateLock, LockError> {
        let path = paths::lock_path(state_dir);
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        // Not truncated on open: the PID inside belongs to the holder until we hold the lock.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let holder: Option<u32> = (&file)
                    .take(32)
                    .read_to_string(&mut text)
                    .ok()
                    .and_then(|_| text.trim().parse().ok());
                // The daemon that took it is gone, yet the lock is held: a child it was
                // forking when it was killed holds the file's descriptor until it execs
                // (closing it) or dies, a moment (the soak, under load: a restart right
                // after a kill failed). That moment is waited for, never a live daemon.
                let gone = holder.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
                if !(gone && handed_over(&file, HANDOVER).map_err(io)?) {
                    return Err(LockError::Held {
                        dir: state_dir.to_path_buf(),
                        holder,
                    });
                }
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(StateLock { file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// How long a lock whose daemon is gone is waited for (see [`StateLock::acquire`]).
const HANDOVER: std::time::Duration = std::time::Duration::from_secs(5);

/// Takes the lock on `file`, waiting at most `limit`: whether it was taken. The wait is a
/// blocking lock on a thread of its own (a duplicate of the descriptor: the same lock),
/// left behind if it does not end in time; the daemon then stops anyway.
fn handed_over(file: &File, limit: std::time::Duration) -> std::io::Result<bool> {
    let waiting = file.try_clone()?;
    let (taken, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = taken.send(waiting.lock().map(|()| waiting));
    });
    match done.recv_timeout(limit) {
        Ok(Ok(_waiting)) => Ok(true),
        Ok(Err(e)) => Err(e),
        Err(_) => Ok(false),
    }
}

impl Drop for StateLock {
    /// A stopped daemon leaves no PID behind: `kill $(cat daemon.lock)` must not reach a
    /// process that reused it. (After a SIGKILL the PID stays, but the lock is free, and
    /// the next daemon overwrites it.)
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_directory_is_refused_with_the_holders_pid() {
        let dir = tempfile::tempdir().unwrap();
        let held = StateLock::acquire(dir.path()).unwrap();
        let err = StateLock::acquire(dir.path()).unwrap_err();
        assert!(
            matches!(err, LockError::Held { holder: Some(pid), .. } if pid == std::process::id()),
            "{err:?}"
        );
        assert!(err.to_string().contains(&std::process::id().to_string()));
        drop(held);
        let text = std::fs::read_to_string(paths::lock_path(dir.path())).unwrap();
        assert_eq!(text, "", "a released lock names no PID");
        StateLock::acquire(dir.path()).expect("released when dropped");
    }

    /// The lock held, the daemon the file names gone (a child of a killed daemon still
    /// holds the descriptor for a moment): taken once released, not refused.
    #[test]
    fn a_lock_its_gone_daemons_child_still_holds_is_taken_once_it_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = paths::lock_path(dir.path());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let inherited = File::create(&path).unwrap();
        inherited.try_lock().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        std::fs::write(&path, format!("{gone}\n")).unwrap();
        // Let go a little later (the child's exec); whenever it comes, the lock is taken.
        let holder = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            drop(inherited);
        });
        let lock = StateLock::acquire(dir.path()).expect("taken once the child let go");
        holder.join().unwrap();
        drop(lock);
    }
}
