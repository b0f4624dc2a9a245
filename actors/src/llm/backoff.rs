//! The wait after an error, shared by every actor that retries a model (the Planner and the
//! Subplanner): exponential from `base_ms`, capped at `max_ms`, and never shorter than what
//! a provider asked for (`Retry-After`), which is untrusted input too and honoured only up to
//! [`MAX_RETRY_AFTER_MS`].
//!
//! The doubling is `backon`'s `ExponentialBuilder` (the crate the providers' retries use), without
//! jitter: the wait stays a pure function of its inputs, so an actor's retries can be tested
//! with paused time. backon doubles in `f32` seconds, so its result is rounded to the nearest
//! millisecond: exact for every wait up to about 100 minutes (checked for bases up to 3 s);
//! beyond that, f32 precision may move a wait by a fraction of a per mille.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// The longest "retry after" a provider can make an actor wait (15 minutes).
pub const MAX_RETRY_AFTER_MS: u64 = 15 * 60 * 1000;

/// Doublings at most: later errors wait no longer than the 21st (`base_ms` × 2^20).
const MAX_DOUBLINGS: u32 = 20;

/// The wait after the `errors`-th error in a row (1 for the first).
pub fn delay_ms(base_ms: u64, max_ms: u64, errors: u32, retry_after_ms: Option<u64>) -> u64 {
    let doublings = errors.saturating_sub(1).min(MAX_DOUBLINGS) as usize;
    let exp = ExponentialBuilder::default()
        .with_factor(2.0)
        .with_min_delay(Duration::from_millis(base_ms))
        .with_max_delay(Duration::from_millis(max_ms))
        .without_max_times()
        .build()
        .nth(doublings)
        .map_or(max_ms, rounded_ms);
    let asked = retry_after_ms.unwrap_or(0).min(MAX_RETRY_AFTER_MS);
    exp.min(max_ms).max(asked)
}

/// A duration in whole milliseconds, rounded to the nearest, saturating at `u64::MAX`.
fn rounded_ms(d: Duration) -> u64 {
    let ms = d.as_millis() + u128::from(d.subsec_nanos() % 1_000_000 >= 500_000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_honours_a_bounded_retry_after() {
        let waits: Vec<u64> = (1..=5).map(|n| delay_ms(100, 1_000, n, None)).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1_000]);
        assert_eq!(delay_ms(100, 1_000, 1, Some(5_000)), 5_000);
        assert_eq!(delay_ms(100, 1_000, 1, Some(u64::MAX)), MAX_RETRY_AFTER_MS);
        assert_eq!(delay_ms(u64::MAX, u64::MAX, u32::MAX, None), u64::MAX);
        assert_eq!(delay_ms(100, 1_000, 0, None), 100);
    }

    /// The closed form the hand-written version computed, for the range flotilla's configs
    /// use (the defaults are 1 s and 60 s): backon gives the same millisecond.
    #[test]
    fn matches_the_closed_form_exactly() {
        let closed = |base: u64, max: u64, errors: u32| {
            base.saturating_mul(1 << errors.saturating_sub(1).min(20))
                .min(max)
        };
        for base in [
            1, 3, 7, 10, 99, 100, 250, 333, 700, 1_000, 1_337, 5_000, 60_000,
        ] {
            for max in [base, 1_000, 7_777, 60_000, 120_000, 300_000] {
                if max < base {
                    continue;
                }
                for errors in 0..=40 {
                    assert_eq!(
                        delay_ms(base, max, errors, None),
                        closed(base, max, errors),
                        "base {base}, max {max}, errors {errors}"
                    );
                }
            }
        }
    }
}
