//! What every actor that calls a model shares: parsing its untrusted answers ([`output`]),
//! live progress notices of streaming calls ([`progress`]) and the wait after a failed call
//! ([`backoff`]). No actor lives here, and nothing here knows which actor calls it.

pub mod backoff;
pub mod output;
pub mod progress;
