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

/// How long, over a whole sweep, processes caught in the middle of an exec (their
/// environment not yet readable) are looked at again before they are passed by. An exec
/// takes well under a millisecond, but a loaded machine may not run the process for a
/// while; the wait costs only when one is met.
const MID_EXEC_WAIT: Duration = Duration::from_secs(2);

/// The least a pass waits on a process in an exec, the sweep's deadline passed or not.
const MIN_PASS_WAIT: Duration = Duration::from_millis(50);

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
    let mut sweep = Sweep::new();
    for _ in 0..MAX_PASSES {
        let before = result.killed.len();
        one_pass(&entry, &mut sweep, &mut result);
        if result.killed.len() == before {
            break;
        }
    }
    result
}

/// What the passes of one sweep share.
struct Sweep {
    /// Whether this kernel's `/proc/<pid>/stat` shows where an environment ends (gVisor
    /// shows 0 for every process): without it no process is taken to be in an exec.
    sees_execs: bool,
    /// The end of the waits on processes in an exec, from the first one met.
    mid_exec_deadline: Option<Instant>,
    /// Processes passed to be ended: not read again (one can still be dying, readable).
    ended: Vec<libc::pid_t>,
    /// Processes still in an exec when a wait ended: read again, not waited for again.
    given_up: Vec<libc::pid_t>,
}

impl Sweep {
    fn new() -> Self {
        Sweep {
            sees_execs: environment_end(std::process::id() as libc::pid_t)
                .is_some_and(|end| end > 0),
            mid_exec_deadline: None,
            ended: Vec::new(),
            given_up: Vec::new(),
        }
    }

    /// How long this pass waits on processes in an exec: to the sweep's deadline, and at
    /// least [`MIN_PASS_WAIT`], so that a pass that met a stuck exec leaves the next one
    /// room for a process that is only slow.
    fn wait_until(&mut self) -> Instant {
        let now = Instant::now();
        let deadline = *self.mid_exec_deadline.get_or_insert(now + MID_EXEC_WAIT);
        deadline.max(now + MIN_PASS_WAIT)
    }
}

fn one_pass(entry: &[u8], sweep: &mut Sweep, result: &mut LeftBehind) {
    for_each_carrying(entry, sweep, |pid, pidfd| match pidfd {
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
/// (what the next daemon would end; nothing is signalled). A process caught in the middle
/// of an exec is waited for, up to [`MID_EXEC_WAIT`].
pub fn carrying(mark: &DaemonMark) -> Vec<libc::pid_t> {
    let mut found = Vec::new();
    for_each_carrying(&mark.entry(), &mut Sweep::new(), |pid, _| found.push(pid));
    found
}

/// Calls `each` with every process of this user, other than this one and the sweep's
/// skipped ones, whose environment holds `entry`, and a pidfd of it taken before the
/// environment was read (None without pidfds). Each one passed to `each`, or given up on
/// in an exec, is skipped by the sweep's later passes.
fn for_each_carrying(
    entry: &[u8],
    sweep: &mut Sweep,
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
            || sweep.ended.contains(&pid)
            || !process.metadata().is_ok_and(|meta| meta.uid() == user)
        {
            continue;
        }
        let pidfd = pidfd_open(pid);
        match carries(pid, entry, sweep.sees_execs) {
            Carries::Yes => {
                sweep.ended.push(pid);
                each(pid, pidfd);
            }
            Carries::No => {}
            Carries::NotYetKnown if sweep.given_up.contains(&pid) => {}
            Carries::NotYetKnown => mid_exec.push((pid, pidfd)),
        }
    }
    if mid_exec.is_empty() {
        return;
    }
    // A process in the middle of an exec shows an empty environment until the kernel has
    // laid out the new program's: looked at again, briefly, instead of passed by.
    let until = sweep.wait_until();
    while !mid_exec.is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
        let mut still = Vec::new();
        for (pid, pidfd) in mid_exec {
            match carries(pid, entry, sweep.sees_execs) {
                Carries::Yes => {
                    sweep.ended.push(pid);
                    each(pid, pidfd);
                }
                Carries::No => {}
                Carries::NotYetKnown => still.push((pid, pidfd)),
            }
        }
        mid_exec = still;
    }
    sweep
        .given_up
        .extend(mid_exec.into_iter().map(|(pid, _)| pid));
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
    /// Empty, from a process in the middle of an exec, whose new environment the kernel
    /// has not placed yet ([`in_an_exec`]).
    NotYetKnown,
}

/// Whether `pid`'s environment holds exactly `entry` (`NAME=value`) as one of its entries.
/// `sees_execs`: whether this kernel shows an exec in progress (see [`Sweep`]).
fn carries(pid: libc::pid_t, entry: &[u8], sees_execs: bool) -> Carries {
    let Some(environ) = environment(pid) else {
        return Carries::No;
    };
    let environ = if environ.is_empty() {
        if sees_execs && in_an_exec(pid) {
            return Carries::NotYetKnown;
        }
        // Placed by now: empty for good, or an exec that ended between the two reads, or
        // one whose environment the kernel is copying in (it says where it ends only once
        // all of it is in): read again a moment later.
        std::thread::sleep(Duration::from_millis(1));
        match environment(pid) {
            Some(environ) => environ,
            None => return Carries::No,
        }
    } else {
        environ
    };
    if environ.split(|b| *b == 0).any(|one| one == entry) {
        Carries::Yes
    } else {
        Carries::No
    }
}

/// `pid`'s environment as `/proc` shows it (at most [`ENVIRON_CAP`]); None if unreadable.
fn environment(pid: libc::pid_t) -> Option<Vec<u8>> {
    let file = fs::File::open(format!("/proc/{pid}/environ")).ok()?;
    let mut environ = Vec::new();
    file.take(ENVIRON_CAP).read_to_end(&mut environ).ok()?;
    Some(environ)
}

/// Whether `pid`, whose environment read empty, is in the middle of an exec: it has a
/// memory map (not a zombie, not a kernel thread) in which the kernel has not yet placed
/// an environment. From `/proc/<pid>/stat`: the virtual size (23rd field) and the end of
/// the environment (51st, shown to whoever may read the environment), counted after the
/// command name's closing parenthesis, which the name itself may hold. A process whose
/// environment is empty by its own doing (`env -i`) has it placed, at an address.
fn in_an_exec(pid: libc::pid_t) -> bool {
    matches!(
        stat_numbers(pid, [VSIZE_FIELD, ENV_END_FIELD]),
        Some([vsize, 0]) if vsize > 0
    )
}

/// Where `pid`'s environment ends, as its `/proc/<pid>/stat` says.
fn environment_end(pid: libc::pid_t) -> Option<u64> {
    stat_numbers(pid, [ENV_END_FIELD]).map(|[end]| end)
}

/// `/proc/<pid>/stat`'s fields (numbered from 1, as proc(5) numbers them) that hold a
/// virtual memory size and where the environment ends.
const VSIZE_FIELD: usize = 23;
const ENV_END_FIELD: usize = 51;

/// The numbers in `/proc/<pid>/stat`'s fields `wanted` (numbered from 1; each past the
/// command name, the second), counted after the name's closing parenthesis, which the name
/// itself may hold, with bytes that are not UTF-8. None if any is missing.
fn stat_numbers<const N: usize>(pid: libc::pid_t, wanted: [usize; N]) -> Option<[u64; N]> {
    let stat = fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|b| *b == b')')?;
    let fields: Vec<&[u8]> = stat[close + 1..]
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty())
        .collect();
    let mut numbers = [0; N];
    for (number, field) in numbers.iter_mut().zip(wanted) {
        let text = fields.get(field.checked_sub(3)?)?;
        *number = std::str::from_utf8(text).ok()?.parse().ok()?;
    }
    Some(numbers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;
    use std::process::{Command, Stdio};

    /// A `sleep 300` with `env` added to this process's environment.
    fn sleeper(env: Option<(OsString, OsString)>) -> std::process::Child {
        Command::new("sleep")
            .arg("300")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .envs(env)
            .spawn()
            .unwrap()
    }

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
        let mut marked = sleeper(Some(ours.variable()));
        let mut other = sleeper(Some(theirs.variable()));
        let mut unmarked = sleeper(None);
        // A mark that only starts with ours is another mark.
        let (name, value) = ours.variable();
        let mut longer = sleeper(Some((name, format!("{}0", value.to_str().unwrap()).into())));

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
            let mut child = sleeper(Some(ours.variable()));
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
        let mut caught_in_exec = 0;
        for _ in 0..200 {
            let mut child = sleeper(Some(ours.variable()));
            let pid = child.id() as libc::pid_t;
            // Read at once: usually still in the exec, its environment not yet readable.
            let first = carries(pid, &entry, true);
            let _ = child.kill();
            let _ = child.wait();
            assert!(
                matches!(first, Carries::Yes | Carries::NotYetKnown),
                "a marked process read in its exec was taken for an unmarked one"
            );
            caught_in_exec += usize::from(matches!(first, Carries::NotYetKnown));
        }
        // The exec check itself (not only the read again a millisecond later) saw some:
        // right after spawn most reads here find the child in its exec.
        assert!(
            caught_in_exec > 0,
            "no read of 200 found a child in its exec"
        );
        // This process's own environment is placed: not in an exec, and its end is shown.
        let own = std::process::id() as libc::pid_t;
        assert!(!in_an_exec(own));
        assert!(environment_end(own).is_some_and(|end| end > 0));
        // An environment empty by the process's own doing is not waited for.
        let mut bare = Command::new("env")
            .args(["-i", "sleep", "300"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !fs::read(format!("/proc/{}/cmdline", bare.id()))
            .is_ok_and(|c| c.starts_with(b"sleep"))
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        let bare_pid = bare.id() as libc::pid_t;
        let judged = carries(bare_pid, &entry, true);
        let _ = bare.kill();
        let _ = bare.wait();
        assert!(
            matches!(judged, Carries::No),
            "an empty environment of its own"
        );
        // A zombie's environment is empty for good.
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id() as libc::pid_t;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !gone(child.id()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(matches!(carries(pid, &entry, true), Carries::No));
        let _ = child.wait();
    }
}
