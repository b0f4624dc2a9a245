//! What a daemon killed outright (SIGKILL, the OOM killer, a crash) may leave running, and
//! how the next daemon on the same state directory ends it.
//!
//! A sandboxed command's processes live in a pid namespace whose init bwrap forks; they end
//! with that init, and the init ends with bwrap (`--die-with-parent`), which ends with the
//! daemon. That chain has a gap: the init asks for its parent's death signal only after it
//! was forked, so a bwrap killed in that moment (the daemon died just after starting a
//! command) leaves the init, and the command it goes on to start, running under the host's
//! init with nobody to stop them. Nothing in that namespace is then bounded by anything.
//!
//! So every command flotilla starts carries a mark in bwrap's environment (its own, not the
//! command's: bwrap is told to unset it), naming the daemon's state directory: the marked
//! processes are bwrap and that namespace's init. Unsandboxed commands, and whatever they
//! start, carry it too. A daemon starting on a state directory, once it holds the state
//! lock (so no other daemon there is alive), ends every process of this user that carries
//! its mark: they were started for a daemon that is gone. Ending a namespace's init ends
//! every process in the namespace (the kernel sees to it).
//!
//! The environment a process was started with is what `/proc/<pid>/environ` shows; a
//! process cannot take the mark out of it afterwards, only its children can start without
//! it, and a sandboxed command's children are in the init's namespace. The same way Jenkins
//! finds a build's processes (its `BUILD_ID` mark).

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The variable that carries the mark.
pub const MARK_VARIABLE: &str = "FLOTILLA_DAEMON_MARK";

/// At most this much of a process's environment is read when looking for the mark (Linux
/// allows a few megabytes; the mark comes early, as the environment is sorted by name).
const ENVIRON_CAP: u64 = 4 * 1024 * 1024;

/// The mark of one daemon's state directory: a digest of its absolute path, so that two
/// daemons on two state directories never end each other's commands, and the path itself
/// is not shown to an unsandboxed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonMark(String);

impl DaemonMark {
    /// The mark of the daemon whose state directory is `state_dir` (made absolute; the
    /// same directory always gives the same mark).
    pub fn of(state_dir: &Path) -> Self {
        let absolute = std::path::absolute(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
        let digest = ring::digest::digest(&ring::digest::SHA256, absolute.as_os_str().as_bytes());
        let hex: String = digest.as_ref()[..12]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        DaemonMark(hex)
    }

    /// The value the variable carries.
    pub fn value(&self) -> &str {
        &self.0
    }

    /// The whole `NAME=value` entry, as it appears in an environment block.
    fn entry(&self) -> Vec<u8> {
        format!("{MARK_VARIABLE}={}", self.0).into_bytes()
    }
}

/// What [`end_left_behind`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Ended {
    /// Processes carrying the mark, sent SIGKILL.
    pub killed: Vec<libc::pid_t>,
}

/// Ends (SIGKILL) every process that carries `mark`, other than this one: processes started
/// for a daemon on the same state directory that is no longer alive. Call only while
/// holding the state directory's lock, before any command of this daemon has started.
/// Processes of other users cannot be read, and are not ours: skipped.
pub fn end_left_behind(mark: &DaemonMark) -> Ended {
    let own = std::process::id();
    let entry = mark.entry();
    let mut ended = Ended::default();
    let Ok(entries) = fs::read_dir("/proc") else {
        return ended;
    };
    for process in entries.flatten() {
        let Some(pid) = pid_of(&process.file_name()) else {
            continue;
        };
        if u32::try_from(pid).is_ok_and(|pid| pid == own) {
            continue;
        }
        if carries(pid, &entry) {
            // SAFETY: kill(2) takes plain integers. A process gone since it was read gives
            // ESRCH; its pid cannot have been reused for another process carrying the mark
            // but one of ours, which is as good a target.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                ended.killed.push(pid);
            }
        }
    }
    ended
}

fn pid_of(name: &OsStr) -> Option<libc::pid_t> {
    let name = name.to_str()?;
    if !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok().filter(|pid| *pid > 0)
}

/// Whether `pid`'s environment holds exactly `entry` (`NAME=value`) as one of its entries.
fn carries(pid: libc::pid_t, entry: &[u8]) -> bool {
    let Ok(file) = fs::File::open(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let mut environ = Vec::new();
    if file.take(ENVIRON_CAP).read_to_end(&mut environ).is_err() {
        return false;
    }
    environ.split(|b| *b == 0).any(|one| one == entry)
}

/// The variable and value to put in the environment of a command started for the daemon
/// marked `mark`.
pub fn variable(mark: &DaemonMark) -> (OsString, OsString) {
    (MARK_VARIABLE.into(), mark.value().into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    fn gone(pid: u32) -> bool {
        // A killed child stays a zombie until reaped; reaped by the test below.
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.is_empty()
            || stat
                .rsplit(')')
                .next()
                .is_some_and(|s| s.trim_start().starts_with('Z'))
    }

    #[test]
    fn the_same_state_directory_gives_the_same_mark_and_another_does_not() {
        let a = DaemonMark::of(Path::new("/var/tmp/state-a"));
        assert_eq!(a, DaemonMark::of(Path::new("/var/tmp/state-a")));
        assert_ne!(a, DaemonMark::of(Path::new("/var/tmp/state-b")));
        assert_eq!(a.value().len(), 24);
        assert!(a.value().bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn only_processes_carrying_this_mark_are_ended() {
        let ours = DaemonMark::of(Path::new("/var/tmp/left-behind-test-ours"));
        let theirs = DaemonMark::of(Path::new("/var/tmp/left-behind-test-theirs"));
        let start = |mark: Option<&DaemonMark>| {
            let mut command = Command::new("sleep");
            command
                .arg("300")
                .stdin(Stdio::null())
                .stdout(Stdio::null());
            if let Some(mark) = mark {
                let (name, value) = variable(mark);
                command.env(name, value);
            }
            command.spawn().unwrap()
        };
        let mut marked = start(Some(&ours));
        let mut other = start(Some(&theirs));
        let mut unmarked = start(None);
        // A mark that only starts with ours is another mark.
        let mut longer = Command::new("sleep")
            .arg("300")
            .env(MARK_VARIABLE, format!("{}0", ours.value()))
            .spawn()
            .unwrap();

        let ended = end_left_behind(&ours);
        assert_eq!(ended.killed, vec![marked.id() as libc::pid_t]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !gone(marked.id()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(gone(marked.id()), "the marked process was ended");
        assert!(!gone(other.id()), "another daemon's process runs on");
        assert!(!gone(unmarked.id()), "an unmarked process runs on");
        assert!(!gone(longer.id()), "a process with a longer mark runs on");
        let _ = marked.wait();
        for child in [&mut other, &mut unmarked, &mut longer] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
