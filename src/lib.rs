//! flotilla: the daemon and CLI around [`flotilla_actors`].
//!
//! The library half of the `flotilla` binary, so that integration tests can drive the same
//! code the binary runs.

pub use flotilla_actors as actors;
