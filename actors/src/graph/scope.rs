//! The lock table Dispatch uses so that two running tasks never share a file: a lock on a
//! [`ScopePath`] conflicts with the same path, the paths below it and the directories above it.

use std::collections::BTreeMap;

use crate::protocol::ScopePath;

/// The scope locks held by running tasks. Checking a scope costs O(paths × depth + matches),
/// independent of how many locks are held.
#[derive(Debug, Default)]
pub struct ScopeLocks {
    held: BTreeMap<String, u32>,
}

impl ScopeLocks {
    /// Whether any path of `scope` overlaps a held lock.
    pub fn conflicts(&self, scope: &[ScopePath]) -> bool {
        scope.iter().any(|p| {
            p.self_and_ancestors().any(|a| self.held.contains_key(a))
                || self
                    .held
                    .range(format!("{}/", p.as_str())..format!("{}0", p.as_str()))
                    .next()
                    .is_some()
        })
    }

    pub fn acquire(&mut self, scope: &[ScopePath]) {
        for p in scope {
            *self.held.entry(p.as_str().to_string()).or_default() += 1;
        }
    }

    pub fn release(&mut self, scope: &[ScopePath]) {
        for p in scope {
            if let Some(n) = self.held.get_mut(p.as_str()) {
                *n -= 1;
                if *n == 0 {
                    self.held.remove(p.as_str());
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> ScopePath {
        ScopePath::parse(s, 1024).unwrap()
    }

    #[test]
    fn locks_detect_ancestors_descendants_and_equals_only() {
        let mut locks = ScopeLocks::default();
        locks.acquire(&[p("src/net")]);
        assert!(locks.conflicts(&[p("src/net/tcp.rs")]));
        assert!(locks.conflicts(&[p("src")]));
        assert!(locks.conflicts(&[p("src/net")]));
        assert!(!locks.conflicts(&[p("src/netx")]));
        assert!(!locks.conflicts(&[p("src/lib.rs")]));
        locks.release(&[p("src/net")]);
        assert!(locks.is_empty());
        assert!(!locks.conflicts(&[p("src")]));
    }
}
