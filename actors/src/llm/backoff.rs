//! The wait after an error, shared by every actor that retries a model (the Planner and the
//! Subplanner): exponential from `base_ms`, capped at `max_ms`, and never shorter than what
//! a provider asked for (`Retry-After`), which is untrusted input too and honoured only up to
//! [`MAX_RETRY_AFTER_MS`].

/// The longest "retry after" a provider can make an actor wait (15 minutes).
pub const MAX_RETRY_AFTER_MS: u64 = 15 * 60 * 1000;

/// The wait after the `errors`-th error in a row (1 for the first).
pub fn delay_ms(base_ms: u64, max_ms: u64, errors: u32, retry_after_ms: Option<u64>) -> u64 {
    let exp = base_ms.saturating_mul(1 << errors.saturating_sub(1).min(20));
    let asked = retry_after_ms.unwrap_or(0).min(MAX_RETRY_AFTER_MS);
    exp.min(max_ms).max(asked)
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
}
