//! Memory given back to the system (ADR-013): once a run's thread has stopped its memory
//! is free, and glibc is asked to return what it can (`malloc_trim`), so that a long-lived
//! daemon's resident set follows its live runs instead of staying at its peak. The same once
//! the last open event stream ends (`api/events.rs`: replays of finished runs allocate a
//! page at a time, and their freed pages stayed the daemon's). It must not know runs or
//! actors.

/// A collection point (ADR-013): a run's thread has stopped and its memory is free; glibc is
/// asked to return what it can to the system (`malloc_trim`), so the daemon's resident set
/// goes back down after each run instead of staying at its peak.
pub(crate) fn give_memory_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the system; no pointer is involved.
    unsafe {
        libc::malloc_trim(0);
    }
}
