//! What a branch changed, for the handoff (`BranchWork`): its files, line counts and links
//! that point out of the repository, from the diff of its base and head trees limited to
//! the paths that differ (ADR-046). Read by the seal; it must not know the worktree
//! records, the journal or the actors.

use std::collections::HashSet;

use flotilla_actors::ports::RepoError;
use flotilla_actors::protocol::{BranchWork, ChangeKind, FileChange};

use super::git;

fn change_kind(status: git2::Delta) -> ChangeKind {
    match status {
        git2::Delta::Added | git2::Delta::Untracked => ChangeKind::Added,
        git2::Delta::Deleted => ChangeKind::Deleted,
        git2::Delta::Renamed => ChangeKind::Renamed,
        git2::Delta::Copied => ChangeKind::Copied,
        git2::Delta::Typechange => ChangeKind::TypeChanged,
        _ => ChangeKind::Modified,
    }
}

/// The most changed files a seal reads one by one; past it the rest are only counted (and
/// the scope cannot be checked on them, which fails the attempt).
pub const MAX_SEALED_FILES: usize = 100_000;

/// Whether `diff` (before renames are found) has every change of `changed`: each old path
/// among its old sides, each new path among its new sides.
fn covers(diff: &git2::Diff<'_>, changed: &[super::tree_delta::PathChange]) -> bool {
    let (mut old, mut new) = (HashSet::new(), HashSet::new());
    for delta in diff.deltas() {
        if delta.status() != git2::Delta::Added {
            old.extend(delta.old_file().path_bytes());
        }
        if delta.status() != git2::Delta::Deleted {
            new.extend(delta.new_file().path_bytes());
        }
    }
    changed.iter().all(|c| {
        (c.before.is_none() || old.contains(c.path.as_slice()))
            && (c.after.is_none() || new.contains(c.path.as_slice()))
    })
}

/// What the branch changed between `base` and `head`: `git diff --stat base head` (renames
/// detected as git does by default, with git's rename limit).
pub fn branch_work(
    repo: &git2::Repository,
    branch: &str,
    base: git2::Oid,
    head: git2::Oid,
) -> Result<BranchWork, RepoError> {
    let tree = |id| repo.find_commit(id).and_then(|c| c.tree()).map_err(git);
    let (old, new) = (tree(base)?, tree(head)?);
    // libgit2's diff of the two trees, limited to the paths that differ (found with equal
    // subtrees skipped by id): its iterators then read only the directories on those
    // paths, and its deltas, renames and line counts are those of the whole diff.
    let changed = super::tree_delta::changed_paths(repo, &old, &new).map_err(git)?;
    let mut options = git2::DiffOptions::new();
    options.disable_pathspec_match(true);
    for change in &changed {
        options.pathspec(change.path.as_slice());
    }
    let mut files = Vec::new();
    let mut links_outside = Vec::new();
    let (mut added, mut removed, mut omitted) = (0u64, 0u64, 0u64);
    let work = |files, links_outside, added, removed, omitted| BranchWork {
        branch: branch.to_string(),
        base: base.to_string(),
        head: head.to_string(),
        files,
        files_omitted: omitted,
        lines_added: added,
        lines_removed: removed,
        committed_for_agent: false,
        links_outside,
    };
    if changed.is_empty() {
        // An empty path list would mean every path to libgit2.
        return Ok(work(files, links_outside, added, removed, omitted));
    }
    let mut diff = repo
        .diff_tree_to_tree(Some(&old), Some(&new), Some(&mut options))
        .map_err(git)?;
    if !covers(&diff, &changed) {
        // The limited walk lost a path: a tree out of git's order (an agent can write one;
        // libgit2's one-pass match assumes the order) or a submodule's path it reads as a
        // pattern (`#x`). The whole diff, as before, lists everything.
        diff = repo
            .diff_tree_to_tree(Some(&old), Some(&new), None)
            .map_err(git)?;
    }
    super::diff::find_renames(&mut diff)?;
    let path_of =
        |file: git2::DiffFile<'_>| file.path().map(|p| p.to_string_lossy().replace('\\', "/"));
    for (i, delta) in diff.deltas().enumerate() {
        if files.len() >= MAX_SEALED_FILES {
            omitted += 1;
            continue;
        }
        let patch = git2::Patch::from_diff(&diff, i).map_err(git)?;
        let (binary, lines_added, lines_removed) = match &patch {
            Some(p) if !delta.flags().is_binary() => {
                let (_, plus, minus) = p.line_stats().map_err(git)?;
                (false, plus as u64, minus as u64)
            }
            _ => (true, 0, 0),
        };
        added = added.saturating_add(lines_added);
        removed = removed.saturating_add(lines_removed);
        let change = change_kind(delta.status());
        let new_path = path_of(delta.new_file());
        let old_path = path_of(delta.old_file());
        let (path, old_path) = match change {
            ChangeKind::Deleted => (old_path.unwrap_or_default(), None),
            ChangeKind::Renamed | ChangeKind::Copied => (new_path.unwrap_or_default(), old_path),
            _ => (new_path.or(old_path).unwrap_or_default(), None),
        };
        let new_file = delta.new_file();
        if change != ChangeKind::Deleted
            && super::diff::file_mode(&new_file) == git2::FileMode::Link
            && repo
                .find_blob(new_file.id())
                .is_ok_and(|target| link_leaves(&path, target.content()))
        {
            links_outside.push(path.clone());
        }
        files.push(FileChange {
            path,
            old_path,
            change,
            lines_added,
            lines_removed,
            binary,
        });
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    links_outside.sort();
    Ok(work(files, links_outside, added, removed, omitted))
}

/// A link at `path` (repo-relative) whose `target` is absolute or climbs above the
/// repository's root.
fn link_leaves(path: &str, target: &[u8]) -> bool {
    let target = String::from_utf8_lossy(target);
    if target.starts_with('/') || target.starts_with('~') {
        return true;
    }
    // How deep the link sits, then follow the target's components from there.
    let mut depth = path.split('/').count() as i64 - 1;
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                depth -= 1;
                if depth < 0 {
                    return true;
                }
            }
            _ => depth += 1,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::{branch_work, link_leaves};

    #[test]
    fn a_tree_with_modes_git2_has_no_name_for_is_read_not_panicked_on() {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init_bare(dir.path()).unwrap();
        let file = repo.blob(b"text\n").unwrap();
        let target = repo.blob(b"/etc").unwrap();
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        let commit = |tree: git2::Oid, parents: &[&git2::Commit<'_>]| {
            let tree = repo.find_tree(tree).unwrap();
            repo.commit(None, &sig, &sig, "c", &tree, parents).unwrap()
        };
        let base = commit(repo.treebuilder(None).unwrap().write().unwrap(), &[]);
        // Written raw, as an agent can: a file of mode 100600 and a link of mode 120755
        // (git checks it out as a link).
        let tree = crate::git::tree_delta::raw_tree(
            &repo,
            &[("100600", b"f.txt", file), ("120755", b"l", target)],
        );
        let head = commit(tree, &[&repo.find_commit(base).unwrap()]);
        let work = branch_work(&repo, "b", base, head).unwrap();
        let paths: Vec<&str> = work.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["f.txt", "l"]);
        assert_eq!(work.links_outside, ["l"], "the link to /etc is seen as one");
    }

    #[test]
    fn links_that_leave_the_repository_are_told_from_those_that_stay() {
        assert!(link_leaves("src/etc", b"/etc"));
        assert!(link_leaves("a", b"~/x"));
        assert!(link_leaves("src/x", b"../../outside"));
        assert!(link_leaves("x", b"../x"));
        assert!(!link_leaves("src/x", b"../lib.rs"));
        assert!(!link_leaves("src/x", b"./y/../z"));
        assert!(!link_leaves("a/b/c", b"../../d"));
        assert!(link_leaves("a/b/c", b"../../../d"));
    }
}
