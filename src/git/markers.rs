//! The sweep's and the gate's search for conflict markers left on a commit (ADR-011):
//! `<<<<<<<` lines in regular text files. A search of a whole commit reads only files
//! under trees not already found clean (ADR-045). It must not know the queue or checkouts.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::sync::Mutex;

use flotilla_actors::ports::{MarkerHit, RepoError};

use super::git;

/// Files over this size are not searched for conflict markers.
pub const MAX_MARKER_FILE_BYTES: usize = 1024 * 1024;

/// At most this many conflict markers are reported.
pub const MAX_MARKER_HITS: usize = 100;

/// The markers in one text: the line (1-based) of every `<<<<<<<`, when the text also has
/// a `>>>>>>>` line (a lone `=======` is a Markdown heading's underline, not a conflict).
pub fn markers_in(text: &[u8]) -> Vec<u32> {
    let is = |line: &[u8], marker: &[u8]| {
        line.starts_with(marker) && (line.len() == marker.len() || line[marker.len()] == b' ')
    };
    let mut opens = Vec::new();
    let mut closes = false;
    for (n, line) in text.split(|b| *b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if is(line, b"<<<<<<<") {
            opens.push(n as u32 + 1);
        } else if is(line, b">>>>>>>") {
            closes = true;
        }
    }
    if closes { opens } else { Vec::new() }
}

/// Trees known to hold no conflict marker (ADR-045): a tree's id is its content, so one
/// found clean is clean in every later commit, and a sweep of main reads only the files
/// under trees that changed since. Forgotten whole past [`MAX_MARKER_FREE_TREES`].
pub type MarkerFreeTrees = Mutex<HashSet<git2::Oid>>;

/// At most this many marker-free tree ids are kept (about 40 bytes each).
pub const MAX_MARKER_FREE_TREES: usize = 200_000;

fn is_regular(mode: i32) -> bool {
    mode == 0o100644 || mode == 0o100755
}

/// Every regular file under `tree` (at `prefix`) but those under trees in `free`; each
/// tree read is added to `seen` with its prefix.
fn files_outside(
    repo: &git2::Repository,
    tree: &git2::Tree<'_>,
    prefix: &str,
    free: &HashSet<git2::Oid>,
    files: &mut Vec<(String, git2::Oid)>,
    seen: &mut Vec<(String, git2::Oid)>,
) -> Result<(), RepoError> {
    seen.push((prefix.to_string(), tree.id()));
    for entry in tree.iter() {
        let path = format!("{prefix}{}", String::from_utf8_lossy(entry.name_bytes()));
        match entry.kind() {
            Some(git2::ObjectType::Tree) if !free.contains(&entry.id()) => {
                let sub = repo.find_tree(entry.id()).map_err(git)?;
                files_outside(repo, &sub, &format!("{path}/"), free, files, seen)?;
            }
            Some(git2::ObjectType::Blob) if is_regular(entry.filemode()) => {
                files.push((path, entry.id()));
            }
            _ => {}
        }
    }
    Ok(())
}

pub(super) fn conflict_markers(
    repo: &git2::Repository,
    commit: &str,
    paths: Option<&[String]>,
    free: &MarkerFreeTrees,
) -> Result<Vec<MarkerHit>, RepoError> {
    let id = git2::Oid::from_str(commit)
        .map_err(|_| RepoError::Git(format!("{commit:?} is not a commit id")))?;
    let tree = repo
        .find_commit(id)
        .map_err(|e| RepoError::Git(format!("commit {commit}: {}", e.message())))?
        .tree()
        .map_err(git)?;
    let odb = repo.odb().map_err(git)?;
    // (path, blob) of every regular file to read.
    let mut files: Vec<(String, git2::Oid)> = Vec::new();
    // The trees read, when the whole commit is searched: those without a hit are clean.
    let mut seen: Vec<(String, git2::Oid)> = Vec::new();
    match paths {
        None => {
            let known = free.lock().unwrap_or_else(|p| p.into_inner());
            if !known.contains(&tree.id()) {
                files_outside(repo, &tree, "", &known, &mut files, &mut seen)?;
            }
        }
        Some(paths) => {
            let wanted: BTreeSet<&String> = paths.iter().collect();
            for path in wanted {
                if let Ok(entry) = tree.get_path(Path::new(path))
                    && entry.kind() == Some(git2::ObjectType::Blob)
                    && is_regular(entry.filemode())
                {
                    files.push((path.clone(), entry.id()));
                }
            }
        }
    }
    files.sort();
    let mut hits = Vec::new();
    for (path, id) in files {
        let (size, _) = odb.read_header(id).map_err(git)?;
        if size > MAX_MARKER_FILE_BYTES {
            continue;
        }
        let blob = repo.find_blob(id).map_err(git)?;
        if blob.is_binary() {
            continue;
        }
        for line in markers_in(blob.content()) {
            if hits.len() >= MAX_MARKER_HITS {
                return Ok(hits);
            }
            hits.push(MarkerHit {
                path: path.clone(),
                line,
            });
        }
    }
    // Every file under the trees read was read: those without a hit are clean.
    if !seen.is_empty() {
        let mut known = free.lock().unwrap_or_else(|p| p.into_inner());
        if known.len().saturating_add(seen.len()) > MAX_MARKER_FREE_TREES {
            known.clear();
        }
        for (prefix, id) in seen {
            if !hits.iter().any(|hit| hit.path.starts_with(&prefix)) {
                known.insert(id);
            }
        }
    }
    Ok(hits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_need_both_ends_and_a_lone_rule_is_not_one() {
        let text = b"a\n<<<<<<< main\nx\n=======\ny\n>>>>>>> b\nz\n<<<<<<<\n>>>>>>>\n";
        assert_eq!(markers_in(text), vec![2, 8]);
        assert!(markers_in(b"Title\n=======\n\ntext\n").is_empty());
        assert!(markers_in(b"<<<<<<< only the start\n").is_empty());
        assert!(markers_in(b"<<<<<<<< eight\n>>>>>>>> eight\n").is_empty());
        assert_eq!(markers_in(b"<<<<<<< a\r\n>>>>>>> b\r\n"), vec![1]);
    }
}
