//! A branch's patch text, bounded (ADR-038): `git diff base head` file by file, whole files
//! while they fit in the bytes asked for, the others named. The reviewer reads it. Each
//! file's patch size is known before its text is made, so a huge file is never printed
//! only to be dropped.

use std::path::Path;

use flotilla_actors::ports::{DiffText, RepoError};

use super::git;

/// The patch text of `base..head` in `repo`, at most `max_bytes` (see [`DiffText`]).
pub fn patch_text(
    repo: &Path,
    base: &str,
    head: &str,
    max_bytes: usize,
) -> Result<DiffText, RepoError> {
    let repo =
        git2::Repository::open(repo).map_err(|_| RepoError::NotARepository(repo.to_path_buf()))?;
    let tree = |id: &str| {
        let oid = git2::Oid::from_str(id).map_err(git)?;
        repo.find_commit(oid).and_then(|c| c.tree()).map_err(git)
    };
    let (old, new) = (tree(base)?, tree(head)?);
    let mut diff = repo
        .diff_tree_to_tree(Some(&old), Some(&new), None)
        .map_err(git)?;
    diff.find_similar(Some(
        git2::DiffFindOptions::new()
            .renames(true)
            .rename_limit(1000),
    ))
    .map_err(git)?;
    let mut out = DiffText::default();
    for (i, delta) in diff.deltas().enumerate() {
        let path = delta
            .new_file()
            .path()
            .or_else(|| delta.old_file().path())
            .map(|p| p.to_string_lossy().replace('\\', "/"))
            .unwrap_or_default();
        let room = max_bytes.saturating_sub(out.text.len());
        let Some(mut patch) = git2::Patch::from_diff(&diff, i).map_err(git)? else {
            // No text patch (git decided so): named, as a binary file is.
            let line = format!("diff --git a/{path} b/{path}\n(binary or unreadable)\n");
            if line.len() <= room {
                out.text.push_str(&line);
            } else {
                out.left_out.push(path);
            }
            continue;
        };
        if patch.size(true, true, true) > room {
            out.left_out.push(path);
            continue;
        }
        let buf = patch.to_buf().map_err(git)?;
        let text = String::from_utf8_lossy(&buf);
        if text.len() <= room {
            out.text.push_str(&text);
        } else {
            out.left_out.push(path);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(
        repo: &git2::Repository,
        files: &[(&str, &str)],
        parent: Option<git2::Oid>,
    ) -> git2::Oid {
        let mut index = repo.index().unwrap();
        for (path, text) in files {
            let full = repo.workdir().unwrap().join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(&full, text).unwrap();
            index.add_path(Path::new(path)).unwrap();
        }
        index.write().unwrap();
        let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
        let sig = git2::Signature::now("t", "t@t").unwrap();
        let parents: Vec<git2::Commit<'_>> = parent
            .map(|p| repo.find_commit(p).unwrap())
            .into_iter()
            .collect();
        let parents: Vec<&git2::Commit<'_>> = parents.iter().collect();
        repo.commit(None, &sig, &sig, "c", &tree, &parents).unwrap()
    }

    #[test]
    fn whole_files_fit_and_the_ones_that_do_not_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init(dir.path()).unwrap();
        let base = commit(&repo, &[("README.md", "hi\n")], None);
        let big = "x\n".repeat(5_000);
        let head = commit(
            &repo,
            &[
                ("src/a.rs", "fn a() {}\n"),
                ("src/big.rs", &big),
                ("z.txt", "z\n"),
            ],
            Some(base),
        );
        let diff = patch_text(dir.path(), &base.to_string(), &head.to_string(), 1_000).unwrap();
        assert!(diff.text.contains("+++ b/src/a.rs"), "{}", diff.text);
        assert!(diff.text.contains("+fn a() {}"));
        assert!(
            diff.text.contains("+++ b/z.txt"),
            "a later file that fits is shown"
        );
        assert_eq!(diff.left_out, ["src/big.rs"]);
        assert!(diff.text.len() <= 1_000);
        let all = patch_text(dir.path(), &base.to_string(), &head.to_string(), 1 << 20).unwrap();
        assert!(all.left_out.is_empty());
        assert!(patch_text(dir.path(), "nope", &head.to_string(), 10).is_err());
    }
}
