//! What the root planner is told about the repository: the whole of it in the first
//! message, and only what changed in each follow-up (the seed's delta optimization). Plain
//! data in, text out: no actor, no I/O, so the sizes can be measured
//! (`cargo bench -p flotilla-actors --bench planner_messages`).
//!
//! `RepoContext` is used by the Planner and the Subplanner: planning documents, file tree and
//! recent commits first; then files added and removed, and FEATURES.json / DECISIONS.md only
//! when their text changed.

use std::collections::{HashMap, HashSet};

use crate::ports::{RepoError, RepoSnapshot};

/// Documents re-sent in a follow-up when their text changed (the others are read once).
pub const LIVE_DOCS: [&str; 2] = ["FEATURES.json", "DECISIONS.md"];

/// The repository as the last message described it.
#[derive(Debug, Clone, Default)]
struct Told {
    files: HashSet<String>,
    /// Planning documents by name, as last sent.
    docs: HashMap<String, String>,
}

/// Remembers what the planner was told, to send it only what changed.
#[derive(Debug, Clone, Default)]
pub struct RepoContext {
    /// `None` until a message carried the file tree (and after a restart: the next message
    /// then carries it whole again).
    told: Option<Told>,
}

impl RepoContext {
    /// The repository in full, for the first message: planning documents, file tree,
    /// recent commits.
    pub fn initial(&mut self, repo: Result<RepoSnapshot, RepoError>) -> String {
        let mut msg = String::new();
        let snapshot = match repo {
            Ok(snapshot) => snapshot,
            Err(e) => return format!("(The repository could not be read: {e}.)\n\n"),
        };
        for (name, text) in &snapshot.docs {
            let what = match name.as_str() {
                "SPEC.md" => " (product specification: binding)",
                "FEATURES.json" => " (binding)",
                "AGENTS.md" => " (coding conventions)",
                "DECISIONS.md" => " (architecture decisions)",
                _ => "",
            };
            msg.push_str(&format!("## {name}{what}\n{text}\n\n"));
        }
        push_file_tree(&mut msg, &snapshot, "");
        if !snapshot.recent_commits.is_empty() {
            msg.push_str("## Recent commits\n");
            for c in &snapshot.recent_commits {
                msg.push_str(&format!("{c}\n"));
            }
            msg.push('\n');
        }
        self.remember(snapshot);
        msg
    }

    /// What changed since the last message: files added and removed, the live documents
    /// whose text changed. Unchanged state is not sent again.
    pub fn follow_up(&mut self, repo: Result<RepoSnapshot, RepoError>) -> String {
        let mut msg = String::new();
        let snapshot = match repo {
            Ok(snapshot) => snapshot,
            Err(e) => return format!("(The repository could not be read: {e}.)\n\n"),
        };
        let Some(told) = &self.told else {
            // Nothing was sent in this life (a restart): send the tree whole once.
            push_file_tree(&mut msg, &snapshot, "; sent in full after a restart");
            self.remember(snapshot);
            return msg;
        };
        let current: HashSet<&str> = snapshot.files.iter().map(String::as_str).collect();
        let added: Vec<&str> = snapshot
            .files
            .iter()
            .map(String::as_str)
            .filter(|f| !told.files.contains(*f))
            .collect();
        let mut removed: Vec<&str> = told
            .files
            .iter()
            .map(String::as_str)
            .filter(|f| !current.contains(f))
            .collect();
        removed.sort_unstable();
        let total = snapshot.files.len() + snapshot.files_omitted;
        msg.push_str("## Updated repository state\n");
        if added.is_empty() && removed.is_empty() {
            msg.push_str(&format!("File tree: unchanged ({total} files).\n"));
        } else {
            msg.push_str(&format!("File tree ({total} files):\n"));
            if !added.is_empty() {
                msg.push_str(&format!("  New: {}\n", added.join(", ")));
            }
            if !removed.is_empty() {
                msg.push_str(&format!("  Removed: {}\n", removed.join(", ")));
            }
        }
        msg.push('\n');
        for name in LIVE_DOCS {
            let now = snapshot.doc(name);
            if now != told.docs.get(name).map(String::as_str) {
                match now {
                    Some(text) => msg.push_str(&format!("## {name} (changed)\n{text}\n\n")),
                    None => msg.push_str(&format!("## {name} was removed\n\n")),
                }
            }
        }
        self.remember(snapshot);
        msg
    }

    fn remember(&mut self, snapshot: RepoSnapshot) {
        self.told = Some(Told {
            files: snapshot.files.into_iter().collect(),
            docs: snapshot.docs.into_iter().collect(),
        });
    }
}

fn push_file_tree(msg: &mut String, snapshot: &RepoSnapshot, note: &str) {
    let total = snapshot.files.len() + snapshot.files_omitted;
    if total == 0 {
        msg.push_str("## Repository file tree\n(empty: nothing is committed on main yet)\n\n");
        return;
    }
    msg.push_str(&format!("## Repository file tree ({total} files{note})\n"));
    for f in &snapshot.files {
        msg.push_str(f);
        msg.push('\n');
    }
    if snapshot.files_omitted > 0 {
        msg.push_str(&format!("… and {} more\n", snapshot.files_omitted));
    }
    msg.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(files: &[&str]) -> RepoSnapshot {
        RepoSnapshot {
            files: files.iter().map(|f| f.to_string()).collect(),
            ..RepoSnapshot::default()
        }
    }

    #[test]
    fn after_a_restart_the_tree_is_sent_whole_once_then_deltas() {
        let mut context = RepoContext::default();
        let first = context.follow_up(Ok(snapshot(&["a", "b"])));
        assert!(first.contains("sent in full after a restart") && first.contains("a\nb\n"));
        let second = context.follow_up(Ok(snapshot(&["a", "c"])));
        assert!(
            second.contains("New: c") && second.contains("Removed: b"),
            "{second}"
        );
        let third = context.follow_up(Err(RepoError::Git("locked".into())));
        assert!(third.contains("could not be read: git: locked"), "{third}");
        // A failed read does not lose what was told: the next delta is against it.
        let fourth = context.follow_up(Ok(snapshot(&["a", "c"])));
        assert!(fourth.contains("unchanged (2 files)"), "{fourth}");
    }
}
