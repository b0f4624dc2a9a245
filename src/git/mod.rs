//! Everything flotilla does to a git repository, on git2: reading the target branch
//! ([`reader`]), attempt worktrees ([`worktrees`]), merging and the merge gate's scratch
//! checkouts ([`merge`]), moving main and keeping the user's checkout whole ([`checkout`]),
//! and the records that let a killed daemon's ref locks be healed ([`ref_lock`]).
//!
//! It implements the actors' git ports; it must not know the actors, the daemon, the
//! journal or the CLI.

pub mod checkout;
pub mod merge;
pub mod reader;
pub mod ref_lock;
pub mod worktrees;
