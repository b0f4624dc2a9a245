//! The end of a sandboxed command's pid namespace. bwrap's exit does not say it: bwrap
//! returns as soon as the command itself exits (its init reports that exit at once), while
//! the init still waits for whatever the command left behind (a `setsid` daemon); and a
//! command stopped by flotilla (its time, its silence, a cancel) has bwrap killed first.
//! Either way the namespace's init dies of bwrap's death (`--die-with-parent`, or the
//! group's kill), and the kernel completes its exit only once it has ended every other
//! process there, a moment after bwrap is reaped. The runner waits for that moment, through
//! a pidfd of the init that bwrap names (`--info-fd`), so that nothing a command started
//! can still write when its run returns (the seal relies on it, ADR-046). Where that end
//! cannot be seen (no pidfds on an old kernel or under a seccomp filter, bwrap's info
//! missing, an init that outlives the wait), the daemon stops trusting any seal for the
//! rest of its life: [`every_end_seen`].

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::sync::oneshot;
use tracing::warn;

/// How long a run waits for its namespace's init to be named, then for it to end.
const WAIT: Duration = Duration::from_secs(5);

/// Set, for good, the first time a sandboxed command's namespace could not be seen ending.
static AN_END_UNSEEN: AtomicBool = AtomicBool::new(false);

/// Whether every sandboxed command this daemon has run so far was seen to end with all it
/// started (its pid namespace gone) before its run returned. Read when a sealed workspace
/// is released: once false, no seal is trusted again (the reset walks, ADR-046).
pub fn every_end_seen() -> bool {
    !AN_END_UNSEEN.load(Ordering::SeqCst)
}

/// The namespace's init, as bwrap named it.
pub(super) enum Init {
    /// A pidfd of it.
    Open(OwnedFd),
    /// Already gone when it was named (so is its namespace).
    Gone,
}

/// Waits until the namespace of a sandboxed command (`init` from [`namespace_init`]; None
/// for an unsandboxed one: nothing to wait for) has ended; if that cannot be seen, says so
/// for the rest of the daemon's life ([`every_end_seen`]). Set before the run returns, so
/// before any seal of what the command touched.
pub(super) async fn wait_for_end(init: Option<oneshot::Receiver<Init>>) {
    let Some(init) = init else {
        return;
    };
    let seen = match tokio::time::timeout(WAIT, init).await {
        Ok(Ok(Init::Open(pidfd))) => ended(pidfd, WAIT).await,
        Ok(Ok(Init::Gone)) => true,
        // Not named in time, or bwrap's info never came (or had no pid).
        Ok(Err(_)) | Err(_) => false,
    };
    if !seen && !AN_END_UNSEEN.swap(true, Ordering::SeqCst) {
        warn!(
            "a sandboxed command's processes could not be seen ending (no pidfd, or bwrap \
             named no init): from now on every reused workspace is walked again before reuse"
        );
    }
}

/// A pipe for bwrap's `--info-fd`: (read end, write end), both close-on-exec (the write end
/// is handed to bwrap alone, between fork and exec).
pub(super) fn info_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into the array we pass.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both were just opened and are owned by nothing else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stdio(read)?, above_stdio(write)?))
}

/// `fd`, or a copy of it numbered 3 or more: a daemon (or a test harness) may run with
/// its standard descriptors closed, and a pipe given 1 would become the child's stdout.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: fcntl on a descriptor we own; the copy is new and ours.
    let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if copy < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just made, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}

/// Lets the child keep `fd` across exec. Runs between fork and exec: fcntl only.
pub(super) fn inherit(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor of this process, integers only.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends the init of the namespace bwrap made, as a pidfd, from what bwrap writes to its
/// info pipe (`{"child-pid": N, ...}`): opened as soon as it is named, while bwrap, its
/// parent, still lives to reap it (so the pid is still its own). Then reads the pipe to its
/// end: bwrap writes more, and a pipe closed under it would end it (SIGPIPE).
pub(super) async fn namespace_init(read: OwnedFd, init: oneshot::Sender<Init>) {
    let Ok(mut pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd(read) else {
        return;
    };
    let mut info = Vec::new();
    let mut init = Some(init);
    let mut chunk = [0u8; 256];
    loop {
        if let Some(pid) = child_pid(&info)
            && let Some(init) = init.take()
        {
            // SAFETY: pidfd_open takes integers; its result is a new descriptor we own.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
            match RawFd::try_from(fd).ok().filter(|fd| *fd >= 0) {
                // SAFETY: just opened, owned by nothing else.
                Some(fd) => {
                    let _ = init.send(Init::Open(unsafe { OwnedFd::from_raw_fd(fd) }));
                }
                // No such process: its namespace is gone too. Any other failure (no pidfds
                // here) sends nothing, and the end goes unseen.
                None if io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) => {
                    let _ = init.send(Init::Gone);
                }
                None => {}
            }
        }
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) if init.is_some() && info.len() < 64 * 1024 => {
                info.extend_from_slice(&chunk[..n]);
            }
            Ok(_) => {}
        }
    }
}

/// The pid after `"child-pid":` once its digits are whole (a character follows them).
fn child_pid(info: &[u8]) -> Option<libc::pid_t> {
    let key = b"\"child-pid\":";
    let at = info.windows(key.len()).position(|w| w == key)? + key.len();
    let rest = &info[at..];
    let start = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    let digits = rest[start..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    if digits == 0 || start + digits >= rest.len() {
        return None;
    }
    std::str::from_utf8(&rest[start..start + digits])
        .ok()?
        .parse()
        .ok()
        .filter(|pid| *pid > 0)
}

/// Waits, at most `limit`, until the process behind `pidfd` has exited (a pidfd reads
/// ready then; for a namespace's init, only after every other process in it has ended).
/// Whether it did.
pub(super) async fn ended(pidfd: OwnedFd, limit: Duration) -> bool {
    // SAFETY: an OwnedFd stays open, and is the same descriptor, for as long as the
    // AsyncFd owns it.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
    };
    let Ok(fd) = registered else {
        return false;
    };
    tokio::time::timeout(limit, async {
        loop {
            let Ok(mut ready) = fd.readable().await else {
                return;
            };
            let mut poll = libc::pollfd {
                fd: fd.get_ref().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd we own, no wait.
            if unsafe { libc::poll(&mut poll, 1, 0) } == 1 {
                return;
            }
            ready.clear_ready();
        }
    })
    .await
    .is_ok()
}

#[cfg(test)]
mod tests {
    use super::{Init, child_pid, every_end_seen, wait_for_end};

    #[tokio::test]
    async fn an_init_bwrap_never_named_leaves_every_later_end_unseen() {
        // Unsandboxed: nothing to wait for, nothing doubted.
        wait_for_end(None).await;
        // Named as gone already: seen.
        let (send, init) = tokio::sync::oneshot::channel();
        let _ = send.send(Init::Gone);
        wait_for_end(Some(init)).await;
        assert!(every_end_seen());
        // bwrap's info ended without a pid (or no pidfd here): unseen, for good.
        let (send, init) = tokio::sync::oneshot::channel::<Init>();
        drop(send);
        wait_for_end(Some(init)).await;
        assert!(!every_end_seen());
        let (send, init) = tokio::sync::oneshot::channel();
        let _ = send.send(Init::Gone);
        wait_for_end(Some(init)).await;
        assert!(!every_end_seen(), "never trusted again");
    }

    #[test]
    fn the_pid_is_read_once_bwrap_has_written_all_of_it() {
        assert_eq!(child_pid(b"{\n    \"child-pid\": 4321,\n"), Some(4321));
        assert_eq!(child_pid(b"{\n    \"child-pid\": 4321\n}"), Some(4321));
        assert_eq!(
            child_pid(b"{\n    \"child-pid\": 43"),
            None,
            "not whole yet"
        );
        assert_eq!(child_pid(b"{\n    \"child-pid\": x}"), None);
        assert_eq!(child_pid(b"{}"), None);
    }
}
