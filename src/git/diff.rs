//! A branch's patch text, bounded (ADR-038): `git diff base head` file by file, whole files
//! while they fit in the bytes asked for, the others named. The reviewer reads it. Each
//! file's blob sizes are read from the object headers before any patch is made: a file
//! whose old or new blob alone is larger than the room left is named with its size and
//! never diffed (a 50 MB blob would otherwise be loaded and diffed in memory only to be
//! dropped). Then each patch's size is known before its text is made, so a patch that does
//! not fit is never printed either.

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
    patch_text_with(repo, base, head, max_bytes, |diff, i| {
        git2::Patch::from_diff(diff, i)
    })
}

/// [`patch_text`] with the patch maker passed in: the one seam a test uses to see which
/// files were diffed at all.
fn patch_text_with(
    repo: &Path,
    base: &str,
    head: &str,
    max_bytes: usize,
    mut make_patch: impl for<'r> FnMut(
        &git2::Diff<'r>,
        usize,
    ) -> Result<Option<git2::Patch<'r>>, git2::Error>,
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
    find_renames(&mut diff)?;
    let odb = repo.odb().map_err(git)?;
    let mut out = DiffText::default();
    for (i, delta) in diff.deltas().enumerate() {
        let path = delta
            .new_file()
            .path()
            .or_else(|| delta.old_file().path())
            .map(|p| p.to_string_lossy().replace('\\', "/"))
            .unwrap_or_default();
        let room = max_bytes.saturating_sub(out.text.len());
        let largest = blob_size(&odb, &delta.old_file())?.max(blob_size(&odb, &delta.new_file())?);
        if largest > room {
            out.left_out
                .push(format!("{path} (too large to show, {largest} bytes)"));
            continue;
        }
        let Some(mut patch) = make_patch(&diff, i).map_err(git)? else {
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

/// Pairs deletions with additions of similar content as renames (at most 1,000 files
/// compared): how the handoff and the reviewer's diff both read a branch's change.
pub(super) fn find_renames(diff: &mut git2::Diff<'_>) -> Result<(), RepoError> {
    diff.find_similar(Some(
        git2::DiffFindOptions::new()
            .renames(true)
            .rename_limit(1000),
    ))
    .map_err(git)
}

/// A diff side's mode as git reads it (`canon_mode`: by its type bits; a file executable
/// when its owner may run it), never a panic: libgit2 passes a tree's raw modes through,
/// `DiffFile::mode` panics on one it has no name for, and a tree an agent wrote can hold
/// `100600`, or `120755`, which git checks out as a link.
pub(super) fn file_mode(file: &git2::DiffFile<'_>) -> git2::FileMode {
    use git2::Binding;
    // SAFETY: `raw()` points at the diff's file, alive as long as `file`; `mode` is plain
    // data.
    let raw = u32::from(unsafe { (*file.raw()).mode });
    match raw & 0o170000 {
        0 => git2::FileMode::Unreadable,
        0o040000 => git2::FileMode::Tree,
        0o120000 => git2::FileMode::Link,
        0o100000 if raw & 0o100 != 0 => git2::FileMode::BlobExecutable,
        0o100000 => git2::FileMode::Blob,
        _ => git2::FileMode::Commit,
    }
}

/// The size of one side's blob, read from its object header (the blob is not loaded); 0
/// for a side that does not exist (an added or deleted file) or is not a blob here (a
/// submodule's commit lives in another repository).
fn blob_size(odb: &git2::Odb<'_>, file: &git2::DiffFile<'_>) -> Result<usize, RepoError> {
    let is_blob = matches!(
        file_mode(file),
        git2::FileMode::Blob | git2::FileMode::BlobExecutable | git2::FileMode::Link
    );
    if !is_blob || file.id().is_zero() {
        return Ok(0);
    }
    odb.read_header(file.id())
        .map(|(size, _)| size)
        .map_err(git)
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
        // Its blob (800 bytes) fits in the room left, its patch (1,200+ bytes) does not.
        let big = "x\n".repeat(400);
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

    /// A commit whose tree is `base`'s with `files` written as blobs straight into the object
    /// database (no work tree: a 50 MB file is not written to disk twice).
    fn commit_blobs(
        repo: &git2::Repository,
        files: &[(&str, &[u8])],
        parent: Option<git2::Oid>,
    ) -> git2::Oid {
        let parent = parent.map(|p| repo.find_commit(p).unwrap());
        let base_tree = parent.as_ref().map(|c| c.tree().unwrap());
        let mut builder = repo.treebuilder(base_tree.as_ref()).unwrap();
        for (path, bytes) in files {
            let blob = repo.blob(bytes).unwrap();
            builder.insert(path, blob, 0o100644).unwrap();
        }
        let tree = repo.find_tree(builder.write().unwrap()).unwrap();
        let sig = git2::Signature::now("t", "t@t").unwrap();
        let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
        repo.commit(None, &sig, &sig, "c", &tree, &parents).unwrap()
    }

    #[test]
    fn a_file_too_large_for_the_room_is_named_with_its_size_and_never_diffed() {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init(dir.path()).unwrap();
        let base = commit_blobs(&repo, &[("README.md", b"hi\n")], None);
        const BIG: usize = 50 * 1024 * 1024;
        let big = vec![b'x'; BIG];
        let head = commit_blobs(
            &repo,
            &[("big.txt", &big), ("small.rs", b"fn small() {}\n")],
            Some(base),
        );
        let diffed = |from: git2::Oid, to: git2::Oid| {
            let mut patched = Vec::new();
            let text = patch_text_with(
                dir.path(),
                &from.to_string(),
                &to.to_string(),
                64 * 1024,
                |diff, i| {
                    let delta = diff.get_delta(i).unwrap();
                    patched.push(delta.new_file().path().unwrap().to_owned());
                    git2::Patch::from_diff(diff, i)
                },
            )
            .unwrap();
            (text, patched)
        };
        let (added, patched) = diffed(base, head);
        assert!(added.text.contains("+++ b/small.rs"), "{}", added.text);
        assert!(added.text.contains("+fn small() {}"));
        assert_eq!(
            added.left_out,
            [format!("big.txt (too large to show, {BIG} bytes)")]
        );
        assert_eq!(patched, [Path::new("small.rs")], "no patch for big.txt");
        // The old side counts too: shrinking the big file still names it.
        let shrunk = commit_blobs(&repo, &[("big.txt", b"x\n")], Some(head));
        let (shrinking, patched) = diffed(head, shrunk);
        assert_eq!(
            shrinking.left_out,
            [format!("big.txt (too large to show, {BIG} bytes)")]
        );
        assert!(patched.is_empty(), "{patched:?}");
        assert!(shrinking.text.is_empty());
        // The public entry point behaves the same.
        let public = patch_text(dir.path(), &base.to_string(), &head.to_string(), 64 * 1024);
        assert_eq!(public.unwrap(), added);
    }
}
