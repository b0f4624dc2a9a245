//! Helpers for tests of both crates (the `testing` feature, never in a release build:
//! ADR-027).
//!
//! [`eventually`] is the one way a test waits for something another process or thread does
//! (a daemon writing a file, a child exiting, a log line): it asks again with growing pauses
//! until the answer comes or [`PATIENCE`] is spent, and then fails the test naming what it
//! waited for. The patience bounds a hang; it is no timing assertion, so it is generous.
//! Waiting on an event (a message, a journal stream) is better where one exists; this is for
//! what only shows by looking.
//!
//! Must not know: the daemon, git, or any actor.

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

/// How long [`eventually`] keeps asking, in real time (a paused tokio clock does not shorten
/// it): long enough for a loaded CI machine, short enough that a hang fails the test.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// The first pause between two questions; each pause doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_millis(250);

fn next_pause(pause: Duration) -> Duration {
    (pause * 2).min(MAX_PAUSE)
}

/// Asks `check` until it answers `Some`, for at most [`PATIENCE`]; panics naming `what` if it
/// never does.
pub async fn eventually<T, F, Fut>(what: impl Display, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match within(PATIENCE, check).await {
        Some(answer) => answer,
        None => panic!("gave up after {PATIENCE:?} waiting for {what}"),
    }
}

/// Asks `check` until it answers `Some`, for at most `patience`: the answer, or `None` if it
/// never came (for a test that reports the failure itself, with a log, say).
pub async fn within<T, F, Fut>(patience: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + patience;
    let mut pause = FIRST_PAUSE;
    loop {
        if let Some(answer) = check().await {
            return Some(answer);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(pause).await;
        pause = next_pause(pause);
    }
}

/// [`eventually`] for a test on a plain thread (no runtime): the pauses block the thread.
pub fn eventually_blocking<T>(what: impl Display, check: impl FnMut() -> Option<T>) -> T {
    match blocking_within(PATIENCE, check) {
        Some(answer) => answer,
        None => panic!("gave up after {PATIENCE:?} waiting for {what}"),
    }
}

/// [`within`] for a plain thread.
pub fn blocking_within<T>(patience: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + patience;
    let mut pause = FIRST_PAUSE;
    loop {
        if let Some(answer) = check() {
            return Some(answer);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(pause);
        pause = next_pause(pause);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn eventually_returns_the_first_answer() {
        let asked = AtomicU32::new(0);
        let answer = eventually("the third question", || {
            let n = asked.fetch_add(1, Ordering::SeqCst) + 1;
            async move { (n == 3).then_some(n) }
        })
        .await;
        assert_eq!(answer, 3);
        assert_eq!(asked.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn within_gives_up_with_none() {
        let answer: Option<()> = within(Duration::ZERO, || async { None }).await;
        assert_eq!(answer, None);
    }

    #[test]
    fn blocking_returns_the_first_answer_or_gives_up() {
        let mut asked = 0;
        let answer = eventually_blocking("the second question", || {
            asked += 1;
            (asked == 2).then_some("yes")
        });
        assert_eq!((answer, asked), ("yes", 2));
        assert_eq!(blocking_within(Duration::ZERO, || None::<()>), None);
    }

    #[test]
    fn pauses_grow_to_a_cap() {
        let mut pause = FIRST_PAUSE;
        for _ in 0..20 {
            pause = next_pause(pause);
        }
        assert_eq!(pause, MAX_PAUSE);
    }
}
