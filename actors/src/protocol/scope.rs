//! Scope paths: parsing LLM-written paths into normalized repo-relative form and the "covers"
//! relation between them. A path covers itself and, when it names a directory, everything below
//! it. Part of the protocol because tasks, subplans, fix tasks and work checks all carry it;
//! the lock table built on it (`ScopeLocks`) is Dispatch's and lives in `graph::scope`.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::subplan::PathProblem;

/// A normalized repo-relative path: `/`-separated, no `.`/`..`/empty components, no leading
/// or trailing slash, no whitespace around a component, nothing under `.git`. Parsing is
/// idempotent: the stored form parses to itself, so what was validated is what is replayed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ScopePath(String);

impl ScopePath {
    pub fn parse(raw: &str, max_bytes: usize) -> Result<ScopePath, PathProblem> {
        // Whitespace is trimmed around every component, not only around the whole string:
        // `"s /"` must be `"s"`, and `".git /"` must be refused as `.git`, here and on replay.
        let raw = raw.trim();
        if raw.len() > max_bytes {
            return Err(PathProblem::TooLong);
        }
        if raw.contains('\\') || raw.chars().any(char::is_control) {
            return Err(PathProblem::BadCharacter);
        }
        if raw.starts_with('/') || looks_rooted(raw) {
            return Err(PathProblem::Absolute);
        }
        let mut parts = Vec::new();
        for part in raw.split('/') {
            match part.trim() {
                "" | "." => continue,
                ".." => return Err(PathProblem::ParentTraversal),
                // In any letter case: on a case-insensitive file system (macOS, Windows)
                // `.GIT/config` is the repository's own config. Trailing dots too, which
                // Windows drops from a name.
                p if p.trim_end_matches('.').eq_ignore_ascii_case(".git") => {
                    return Err(PathProblem::GitDirectory);
                }
                p => parts.push(p),
            }
        }
        match parts.first() {
            None => Err(PathProblem::Empty),
            // `./~/x` must not be stored as `~/x`, which would not parse back.
            Some(first) if looks_rooted(first) => Err(PathProblem::Absolute),
            Some(_) => Ok(ScopePath(parts.join("/"))),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `self` is `other` or a directory above it.
    pub fn covers(&self, other: &ScopePath) -> bool {
        other.0 == self.0
            || (other.0.len() > self.0.len()
                && other.0.starts_with(&self.0)
                && other.0.as_bytes()[self.0.len()] == b'/')
    }

    pub fn overlaps(&self, other: &ScopePath) -> bool {
        self.covers(other) || other.covers(self)
    }

    /// `a/b/c` yields `a`, `a/b`, `a/b/c`.
    pub fn self_and_ancestors(&self) -> impl Iterator<Item = &str> {
        self.0
            .match_indices('/')
            .map(|(i, _)| &self.0[..i])
            .chain(std::iter::once(self.0.as_str()))
    }
}

/// A home-relative (`~`) or drive-letter (`C:`) start: absolute in effect.
fn looks_rooted(path: &str) -> bool {
    let b = path.as_bytes();
    path.starts_with('~') || (b.len() >= 2 && b[1] == b':' && b[0].is_ascii_alphabetic())
}

impl fmt::Display for ScopePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> ScopePath {
        ScopePath::parse(s, 1024).unwrap()
    }

    #[test]
    fn paths_are_normalized() {
        assert_eq!(p("./src//lib.rs").as_str(), "src/lib.rs");
        assert_eq!(p("src/").as_str(), "src");
        assert_eq!(p(" docs/a.md ").as_str(), "docs/a.md");
    }

    #[test]
    fn whitespace_around_components_is_trimmed_before_the_checks() {
        assert_eq!(p("s /").as_str(), "s");
        assert_eq!(p("src/a /").as_str(), "src/a");
        assert_eq!(p(" src / a b .rs ").as_str(), "src/a b .rs");
        assert_eq!(p("src/ . /x").as_str(), "src/x");
        assert_eq!(
            ScopePath::parse(".git /", 1024),
            Err(PathProblem::GitDirectory)
        );
        assert_eq!(
            ScopePath::parse("..  /", 1024),
            Err(PathProblem::ParentTraversal)
        );
        assert_eq!(
            ScopePath::parse("src/ .. /x", 1024),
            Err(PathProblem::ParentTraversal)
        );
        assert_eq!(ScopePath::parse("  . /  ", 1024), Err(PathProblem::Empty));
        // What would look absolute once `./` is dropped is refused, not stored as `~` or `C:`.
        assert_eq!(ScopePath::parse("./~/x", 1024), Err(PathProblem::Absolute));
        assert_eq!(
            ScopePath::parse(". /C:/x", 1024),
            Err(PathProblem::Absolute)
        );
    }

    /// Every string over a small alphabet of troublemakers, up to six characters: whatever
    /// parses, parses again to itself.
    #[test]
    fn normalization_is_idempotent() {
        const ALPHABET: [char; 9] = [' ', '/', '.', 'g', 'i', 't', '~', ':', '\u{a0}'];
        let mut inputs = vec![String::new()];
        let mut frontier = vec![String::new()];
        for _ in 0..6 {
            let mut next = Vec::new();
            for s in &frontier {
                for c in ALPHABET {
                    let mut t = s.clone();
                    t.push(c);
                    next.push(t);
                }
            }
            inputs.extend(next.iter().cloned());
            frontier = next;
        }
        let mut parsed = 0;
        for raw in &inputs {
            let Ok(once) = ScopePath::parse(raw, 1024) else {
                continue;
            };
            parsed += 1;
            assert_eq!(
                ScopePath::parse(once.as_str(), 1024).as_ref(),
                Ok(&once),
                "{raw:?} normalized to {once:?}, which does not parse to itself"
            );
            for part in once.as_str().split('/') {
                assert_eq!(part, part.trim(), "{raw:?} -> {once:?}");
                assert!(
                    !matches!(part, "" | "." | ".." | ".git"),
                    "{raw:?} -> {once:?}"
                );
            }
        }
        assert!(parsed > 1_000, "the alphabet must exercise the parser");
    }

    #[test]
    fn escaping_and_malformed_paths_are_rejected() {
        let cases = [
            ("", PathProblem::Empty),
            ("./", PathProblem::Empty),
            ("/etc/passwd", PathProblem::Absolute),
            ("C:/x", PathProblem::Absolute),
            ("~/.ssh", PathProblem::Absolute),
            ("src/../../x", PathProblem::ParentTraversal),
            (".git/config", PathProblem::GitDirectory),
            ("vendor/.git/HEAD", PathProblem::GitDirectory),
            ("a\\b", PathProblem::BadCharacter),
            ("a\nb", PathProblem::BadCharacter),
        ];
        for (raw, want) in cases {
            assert_eq!(ScopePath::parse(raw, 1024), Err(want), "{raw:?}");
        }
        assert_eq!(
            ScopePath::parse(&"a".repeat(20), 10),
            Err(PathProblem::TooLong)
        );
    }

    #[test]
    fn covers_respects_component_boundaries() {
        assert!(p("src").covers(&p("src/lib.rs")));
        assert!(p("src/lib.rs").covers(&p("src/lib.rs")));
        assert!(!p("src").covers(&p("srcx/lib.rs")));
        assert!(!p("src/lib.rs").covers(&p("src")));
        assert!(p("src/lib.rs").overlaps(&p("src")));
    }
}
