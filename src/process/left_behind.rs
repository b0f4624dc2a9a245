//! What a daemon killed outright (SIGKILL, the OOM killer, a crash) may leave running, and
//! how the next daemon on the same state directory ends it (ADR-050).
//!
//! A sandboxed command's processes live in a pid namespace whose init bwrap forks; they end
//! with that init, and the init ends with bwrap (`--die-with-parent`), which ends with the
//! daemon. That chain has gaps: bwrap and its init each ask for their parent's death signal
//! only some time after they were forked, so a daemon that dies in that moment leaves the
//! init, and the command it goes on to start, running under the host's init with nobody to
//! stop them.
//!
//! So every command flotilla starts carries a mark in bwrap's environment (not the
//! command's: bwrap is told to unset it), a random id kept in the state directory: the
//! marked processes are bwrap and its namespace's init. Unsandboxed commands carry it
//! themselves, and so does what they start with the environment they were given. A daemon
//! starting on a state directory, once it holds the state lock (so no other daemon there is
//! alive), ends every process of its user that carries its mark: they were started for a
//! daemon that is gone. Ending a namespace's init ends every process in the namespace.
//!
//! The mark is read from `/proc/<pid>/environ`: the environment a process was started with.
//! Jenkins finds a build's processes the same way (its `BUILD_ID` mark).

use std::fs;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

pub use crate::daemon_mark::{DaemonMark, MARK_VARIABLE};

/// At most this much of a process's environment is read when looking for the mark (Linux
/// allows a few megabytes; what flotilla starts has a small one).
const ENVIRON_CAP: u64 = 4 * 1024 * 1024;

/// A process that forks as it is ended can leave a child the pass did not list: passes are
/// repeated until one ends nothing, at most this many.
const MAX_PASSES: usize = 5;

/// How long a process caught in the middle of an exec (its environment not yet readable) is
/// looked at again before it is passed by. An exec takes well under a millisecond, but a
/// loaded machine may not run the process for a while; the wait costs only when one is met.
const MID_EXEC_WAIT: Duration = Duration::from_secs(2);

/// A process with an empty environment forked longer ago than this is not in an exec the
/// sweep could wait out: its environment is empty for good (or the exec is stuck).
const RECENT_FORK: Duration = Duration::from_secs(10);

/// What [`end_left_behind`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LeftBehind {
    /// Processes carrying the mark, sent SIGKILL.
    pub killed: Vec<libc::pid_t>,
    /// Processes carrying the mark that could not be ended (no pidfds on this kernel).
    pub unended: Vec<libc::pid_t>,
}

/// Ends (SIGKILL) every process of this user that carries `mark`, other than this one:
/// processes started for a daemon on the same state directory that is no longer alive.
/// Call only while holding the state directory's lock, before any command of this daemon
/// has started. Each process is pinned (a pidfd) before its environment is read, so a pid
/// reused in between is never the one signalled.
pub fn end_left_behind(mark: &DaemonMark) -> LeftBehind {
    let entry = mark.entry();
    let mut result = LeftBehind::default();
    for _ in 0..MAX_PASSES {
        let before = result.killed.len();
        one_pass(&entry, &mut result);
        if result.killed.len() == before {
            break;
        }
    }
    result
}

fn one_pass(entry: &[u8], result: &mut LeftBehind) {
    for_each_carrying(entry, &result.killed.clone(), |pid, pidfd| match pidfd {
        Some(pidfd) if kill(&pidfd) => result.killed.push(pid),
        // Gone since it was read: nothing to end.
        Some(_) => {}
        None => {
            if !result.unended.contains(&pid) {
                result.unended.push(pid);
            }
        }
    });
}

/// The processes of this user, other than this one, that carry `mark`, as they are now
/// (what the next daemon would end; nothing is signalled).
pub fn carrying(mark: &DaemonMark) -> Vec<libc::pid_t> {
    let mut found = Vec::new();
    for_each_carrying(&mark.entry(), &[], |pid, _| found.push(pid));
    found
}

/// Calls `each` with every process of this user, other than this one and `skip`, whose
/// environment holds `entry`, and a pidfd of it taken before the environment was read
/// (None without pidfds).
fn for_each_carrying(
    entry: &[u8],
    skip: &[libc::pid_t],
    mut each: impl FnMut(libc::pid_t, Option<OwnedFd>),
) {
    let own = std::process::id();
    // SAFETY: geteuid has no arguments and cannot fail.
    let user = unsafe { libc::geteuid() };
    let Ok(entries) = fs::read_dir("/proc") else {
        return;
    };
    let mut mid_exec = Vec::new();
    for process in entries.flatten() {
        let Some(pid) = process
            .file_name()
            .to_str()
            .filter(|name| name.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|name| name.parse::<libc::pid_t>().ok())
            .filter(|pid| *pid > 0)
        else {
            continue;
        };
        // Only this user's: another's is not ours to end, and reading it could wait on a
        // process of anyone's (its environment is read under its memory's lock). One ended
        // in an earlier pass can still be dying (its environment still readable).
        if u32::try_from(pid).is_ok_and(|pid| pid == own)
            || skip.contains(&pid)
            || !process.metadata().is_ok_and(|meta| meta.uid() == user)
        {
            continue;
        }
        let pidfd = pidfd_open(pid);
        match carries(pid, entry) {
            Carries::Yes => each(pid, pidfd),
            Carries::No => {}
            Carries::NotYetKnown => mid_exec.push((pid, pidfd)),
        }
    }
    // A process in the middle of an exec shows an empty environment until the kernel has
    // laid out the new program's: looked at again, briefly, instead of passed by.
    let deadline = Instant::now() + MID_EXEC_WAIT;
    while !mid_exec.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
        let mut still = Vec::new();
        for (pid, pidfd) in mid_exec {
            match carries(pid, entry) {
                Carries::Yes => each(pid, pidfd),
                Carries::No => {}
                Carries::NotYetKnown => still.push((pid, pidfd)),
            }
        }
        mid_exec = still;
    }
}

fn pidfd_open(pid: libc::pid_t) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes integers; its result is a new descriptor we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = RawFd::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: just opened, owned by nothing else.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// SIGKILL to the process behind `pidfd`; whether it was sent.
fn kill(pidfd: &OwnedFd) -> bool {
    // SAFETY: pidfd_send_signal takes a descriptor we own, a signal, no siginfo, no flags.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        ) == 0
    }
}

/// What a process's environment says about the mark.
enum Carries {
    Yes,
    No,
    /// Empty, from a process that may be in the middle of an exec, whose new environment
    /// the kernel has not placed yet ([`may_be_in_an_exec`]).
    NotYetKnown,
}

/// Whether `pid`'s environment holds exactly `entry` (`NAME=value`) as one of its entries.
fn carries(pid: libc::pid_t, entry: &[u8]) -> Carries {
    let Ok(file) = fs::File::open(format!("/proc/{pid}/environ")) else {
        return Carries::No;
    };
    let mut environ = Vec::new();
    if file.take(ENVIRON_CAP).read_to_end(&mut environ).is_err() {
        return Carries::No;
    }
    if environ.is_empty() {
        return if may_be_in_an_exec(pid) {
            Carries::NotYetKnown
        } else {
            Carries::No
        };
    }
    if environ.split(|b| *b == 0).any(|one| one == entry) {
        Carries::Yes
    } else {
        Carries::No
    }
}

/// Whether `pid`, whose environment read empty, may be in the middle of an exec: neither a
/// kernel thread nor a zombie (empty for good), and forked in the last
/// [`RECENT_FORK`] (a process whose environment is empty by its own doing, such as an init
/// started without one, is not waited for at every daemon start). From `/proc/<pid>/stat`:
/// the state (third field), the flags (ninth) and the start time (22nd, in clock ticks
/// since boot), counted after the command name's closing parenthesis, which the name
/// itself may hold.
fn may_be_in_an_exec(pid: libc::pid_t) -> bool {
    /// The kernel's PF_KTHREAD flag (include/linux/sched.h).
    const KERNEL_THREAD: u64 = 0x0020_0000;
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let Some((_, after_name)) = stat.rsplit_once(')') else {
        return false;
    };
    let fields: Vec<&str> = after_name.split_ascii_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    let (Some(state), Some(flags), Some(started)) = (fields.first(), field(9), field(22)) else {
        return false;
    };
    if matches!(*state, "Z" | "X" | "x") || flags & KERNEL_THREAD != 0 {
        return false;
    }
    // SAFETY: sysconf takes an integer and returns one.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let uptime = fs::read_to_string("/proc/uptime").ok().and_then(|up| {
        up.split_ascii_whitespace()
            .next()
            .and_then(|secs| secs.parse::<f64>().ok())
    });
    match (u64::try_from(ticks).ok().filter(|t| *t > 0), uptime) {
        (Some(ticks), Some(uptime)) => {
            uptime - (started as f64 / ticks as f64) < RECENT_FORK.as_secs_f64()
        }
        // Cannot tell how old it is: looked at again, as if it were new.
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;
    use std::process::{Command, Stdio};

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
    fn only_processes_carrying_this_mark_are_ended() {
        let dirs = [(); 2].map(|()| tempfile::tempdir().unwrap());
        let ours = DaemonMark::of(dirs[0].path()).unwrap();
        let theirs = DaemonMark::of(dirs[1].path()).unwrap();
        let start = |env: Option<(OsString, OsString)>| {
            let mut command = Command::new("sleep");
            command
                .arg("300")
                .stdin(Stdio::null())
                .stdout(Stdio::null());
            command.envs(env);
            command.spawn().unwrap()
        };
        let mut marked = start(Some(ours.variable()));
        let mut other = start(Some(theirs.variable()));
        let mut unmarked = start(None);
        // A mark that only starts with ours is another mark.
        let (name, value) = ours.variable();
        let mut longer = start(Some((name, format!("{}0", value.to_str().unwrap()).into())));

        let ended = end_left_behind(&ours);
        assert_eq!(ended.killed, vec![marked.id() as libc::pid_t]);
        assert!(ended.unended.is_empty());
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

    #[test]
    fn processes_caught_in_the_middle_of_their_exec_are_ended_too() {
        // spawn returns once the child's exec has begun; until the kernel has laid out the
        // new program's environment, /proc/<pid>/environ reads empty. Swept at once, a
        // child is often caught there.
        let dir = tempfile::tempdir().unwrap();
        let ours = DaemonMark::of(dir.path()).unwrap();
        let mut missed = 0;
        for _ in 0..50 {
            let mut child = Command::new("sleep")
                .arg("300")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .envs(Some(ours.variable()))
                .spawn()
                .unwrap();
            let ended = end_left_behind(&ours);
            if ended.killed != vec![child.id() as libc::pid_t] {
                missed += 1;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        assert_eq!(missed, 0, "sweeps that passed a marked process by");
    }

    #[test]
    fn a_process_in_the_middle_of_its_exec_is_never_taken_for_an_unmarked_one() {
        let dir = tempfile::tempdir().unwrap();
        let ours = DaemonMark::of(dir.path()).unwrap();
        let entry = ours.entry();
        for _ in 0..200 {
            let mut child = Command::new("sleep")
                .arg("300")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .envs(Some(ours.variable()))
                .spawn()
                .unwrap();
            let pid = child.id() as libc::pid_t;
            // Read at once: usually still in the exec, its environment not yet readable.
            let first = carries(pid, &entry);
            let _ = child.kill();
            let _ = child.wait();
            assert!(
                matches!(first, Carries::Yes | Carries::NotYetKnown),
                "a marked process read in its exec was taken for an unmarked one"
            );
        }
        // The init, forked at boot, is never waited for, whatever its environment.
        if fs::read_to_string("/proc/uptime")
            .ok()
            .and_then(|up| up.split('.').next().and_then(|s| s.parse::<u64>().ok()))
            .is_some_and(|up| up > 60)
        {
            assert!(!may_be_in_an_exec(1));
        }
        // A zombie's environment is empty for good.
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id() as libc::pid_t;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !gone(child.id()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(matches!(carries(pid, &entry), Carries::No));
        let _ = child.wait();
    }
}
