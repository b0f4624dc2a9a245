//! git's index file, written by flotilla (format versions 2 and 3, no extensions): the
//! index of an attempt's workspace, from flotilla's snapshot ([`write_index`]), and the
//! index of the user's checkout after a move of main, from libgit2's in-memory index
//! ([`write_user_index`]).
//!
//! Why not libgit2's `git_index_write`: it hashes with SHA-1DC (collision detection), 4.5
//! times slower here than RustCrypto's `sha1` on the CPU's SHA extensions, and a
//! 10,000-file index is written whole at every landing (ADR-052, decision 3). The
//! extensions git and libgit2 keep are caches (`TREE`, `UNTR`) that git rebuilds when it
//! needs them; an index with anything this writer would lose (resolve-undo records,
//! conflicts, a version 4 index) is left to libgit2.
//!
//! It must not know the journal or the actors.

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use flotilla_actors::ports::RepoError;
use git2::Binding;

use super::snapshot::Entry;
use super::{git, io};

/// An entry's flags: assume-valid, the extended bit, its stage, its name's length.
const ASSUME_VALID: u16 = 0x8000;
const EXTENDED: u16 = 0x4000;
const STAGE_MASK: u16 = 0x3000;
const NAME_MASK: u16 = 0x0fff;
/// The extended flags git writes (intent-to-add, skip-worktree); the others are libgit2's
/// in memory only.
const EXTENDED_ON_DISK: u16 = 0x6000;

// libgit2's (include/git2/sys/index.h), which libgit2-sys does not declare: how many
// resolve-undo records the index holds, which only libgit2's write keeps.
unsafe extern "C" {
    fn git_index_reuc_entrycount(index: *mut libgit2_sys::git_index) -> libc::size_t;
}

/// One entry, as the file holds it.
struct DiskEntry<'e> {
    /// ctime s, ns; mtime s, ns; dev; ino; mode; uid; gid; size (git keeps 32 bits).
    stat: [u32; 10],
    id: &'e [u8],
    flags: u16,
    flags_extended: u16,
    path: &'e [u8],
}

/// How much of an index is built before it is hashed and written: a buffer that stays in
/// the cache, where the index whole (a MiB at 10,000 files) was a fresh allocation, its
/// pages faulted in, at every reset and every move of main.
const CHUNK: usize = 64 << 10;

/// Writes an index holding `entries` (sorted by path, then stage) to `out`, trailer
/// included: version 3 when an entry has extended flags (`extended`), else 2.
fn write_entries<'e>(
    out: &mut impl Write,
    extended: bool,
    entries: impl ExactSizeIterator<Item = DiskEntry<'e>>,
) -> std::io::Result<()> {
    use sha1::Digest;
    let count = u32::try_from(entries.len()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "too many files for a git index",
        )
    })?;
    let mut hasher = sha1::Sha1::new();
    let mut chunk = Vec::with_capacity(CHUNK + 8 + 62 + 2 + 4096);
    chunk.extend_from_slice(b"DIRC");
    chunk.extend_from_slice(&(if extended { 3u32 } else { 2 }).to_be_bytes());
    chunk.extend_from_slice(&count.to_be_bytes());
    for e in entries {
        // The fixed part built on the stack and copied at once (a capacity check per
        // field was a visible part of a reset).
        let mut fixed = [0u8; 62];
        for (i, field) in e.stat.iter().enumerate() {
            fixed[i * 4..i * 4 + 4].copy_from_slice(&field.to_be_bytes());
        }
        fixed[40..60].copy_from_slice(e.id);
        let extended_flags = e.flags_extended & EXTENDED_ON_DISK;
        let mut flags =
            (e.flags & (ASSUME_VALID | STAGE_MASK)) | e.path.len().min(NAME_MASK.into()) as u16;
        if extended_flags != 0 {
            flags |= EXTENDED;
        }
        fixed[60..62].copy_from_slice(&flags.to_be_bytes());
        chunk.extend_from_slice(&fixed);
        let mut len = 62 + e.path.len();
        if extended_flags != 0 {
            chunk.extend_from_slice(&extended_flags.to_be_bytes());
            len += 2;
        }
        chunk.extend_from_slice(e.path);
        // NUL-padded to a multiple of 8, at least one NUL.
        let padded = (len + 8) & !7;
        chunk.resize(chunk.len() + (padded - len), 0);
        if chunk.len() >= CHUNK {
            hasher.update(&chunk);
            out.write_all(&chunk)?;
            chunk.clear();
        }
    }
    hasher.update(&chunk);
    // git's trailer: the SHA-1 of everything before it.
    chunk.extend_from_slice(&hasher.finalize());
    out.write_all(&chunk)
}

/// Writes an index at `path` through git's own lock file (`<path>.lock`) and a rename, as
/// git does: `write` fills the lock file.
fn commit_with(
    path: &Path,
    write: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> Result<(), RepoError> {
    let mut lock = path.as_os_str().to_owned();
    lock.push(".lock");
    let lock = PathBuf::from(lock);
    match std::fs::remove_file(&lock) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io("cannot remove", &lock, e));
        }
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&lock)
        .map_err(|e| io("cannot write", &lock, e))?;
    let written = write(&mut file)
        .map_err(|e| io("cannot write", &lock, e))
        .and_then(|()| std::fs::rename(&lock, path).map_err(|e| io("cannot write", path, e)));
    if written.is_err() {
        // A lock left behind would keep git (the agent's, the user's) out of the index.
        let _ = std::fs::remove_file(&lock);
    }
    written
}

/// Writes `entries` (flotilla's snapshot of a workspace: sorted by path, stage 0) as the
/// git index at `path`.
pub fn write_index(path: &Path, entries: &[Entry]) -> Result<(), RepoError> {
    let disk = entries.iter().map(|e| DiskEntry {
        // git's index keeps the low 32 bits of each stat field.
        stat: [
            e.stat.ctime.0 as u32,
            e.stat.ctime.1,
            e.stat.mtime.0 as u32,
            e.stat.mtime.1,
            e.stat.dev as u32,
            e.stat.ino as u32,
            e.mode,
            e.stat.uid,
            e.stat.gid,
            e.stat.size as u32,
        ],
        id: e.id.as_bytes(),
        flags: 0,
        flags_extended: 0,
        path: &e.path,
    });
    commit_with(path, |file| write_entries(file, false, disk))
}

/// Writes libgit2's in-memory `index` of the checkout `repo` to the index's own file, as
/// `git_index_write` would but for its caches: the entries whose stat is as new as the
/// file it replaces (`racy_since`, that file's mtime) are compared with the work tree first
/// and, where they differ, written with size 0 (here and in memory), so that git looks at
/// them again (git's "racily clean" rule, as libgit2's write does it). An index this
/// writer cannot write whole (resolve-undo records, conflicts, version 4, entries out of
/// git's byte order) is written by libgit2.
pub fn write_user_index(
    repo: &git2::Repository,
    index: &mut git2::Index,
    racy_since: Option<(i64, u32)>,
) -> Result<(), RepoError> {
    let path = index
        .path()
        .ok_or_else(|| RepoError::Git("the index has no file".into()))?
        .to_path_buf();
    // SAFETY: `index.raw()` is the live index `index` owns; the call only reads it.
    let undo_records = unsafe { git_index_reuc_entrycount(index.raw()) };
    if undo_records != 0 || index.has_conflicts() || index.version() == 4 {
        return index.write().map_err(git);
    }
    let smudged = {
        let entries = borrowed_entries(index);
        // git's order, byte by byte (libgit2 sorts an index that ignores case otherwise,
        // and re-sorts it when it writes): anything else is left to libgit2.
        if entries.windows(2).any(|w| w[0].path >= w[1].path) {
            drop(entries);
            return index.write().map_err(git);
        }
        let smudged = racily_clean(repo, &entries, racy_since)?;
        let extended = entries
            .iter()
            .any(|e| e.raw.flags_extended & EXTENDED_ON_DISK != 0);
        let disk = entries.iter().zip(&smudged).map(|(e, &smudged)| {
            let raw = e.raw;
            DiskEntry {
                stat: [
                    raw.ctime.seconds as u32,
                    raw.ctime.nanoseconds,
                    raw.mtime.seconds as u32,
                    raw.mtime.nanoseconds,
                    raw.dev,
                    raw.ino,
                    raw.mode,
                    raw.uid,
                    raw.gid,
                    if smudged { 0 } else { raw.file_size },
                ],
                id: &raw.id.id,
                flags: raw.flags,
                flags_extended: raw.flags_extended,
                path: e.path,
            }
        });
        commit_with(&path, |file| write_entries(file, extended, disk))?;
        smudged
    };
    // The same in memory (few: only entries of the index's own second can be).
    for (i, _) in smudged.iter().enumerate().filter(|(_, s)| **s) {
        if let Some(mut entry) = index.get(i) {
            entry.file_size = 0;
            index.add(&entry).map_err(git)?;
        }
    }
    Ok(())
}

/// An entry of libgit2's in-memory index, read in place: git2's `IndexEntry` copies each
/// path, 10,000 allocations at every move of main for a 10,000-file checkout.
struct Borrowed<'i> {
    raw: &'i libgit2_sys::git_index_entry,
    path: &'i [u8],
}

/// Every entry of `index`, in its order. The borrow of `index` keeps it unchanged while
/// they are read.
fn borrowed_entries(index: &git2::Index) -> Vec<Borrowed<'_>> {
    (0..index.len())
        .filter_map(|i| {
            // SAFETY: `i` is below the entry count; the entry and its path live in the
            // index until it changes, which the shared borrow of `index` rules out.
            unsafe {
                let raw = libgit2_sys::git_index_get_byindex(index.raw(), i).as_ref()?;
                if raw.path.is_null() {
                    return None;
                }
                let path = std::ffi::CStr::from_ptr(raw.path).to_bytes();
                Some(Borrowed { raw, path })
            }
        })
        .collect()
}

/// Which of `entries` (the index's, in its order) are written with size 0: those at least
/// as new as `since` whose file differs from them (`None`: there was no file, every entry
/// is as new). As libgit2's own write decided it, to the nanosecond, with the seconds as
/// the file keeps them (32 bits). git built without `USE_NSEC` (Debian's) also compares
/// whole seconds: an older entry of `since`'s second is looked at again too, by its stat
/// alone (hashing every file landed in the last second at every landing cost 3 to 6 ms a
/// task). Whether an as-new entry differs is decided by hashing its file: a scratch index
/// of the racy entries, their mtime cleared, is compared with the work tree, never the
/// in-memory index, whose own idea of when it was written (libgit2's stamp: the time its
/// copy was made) would let libgit2 trust the very stat in question.
fn racily_clean(
    repo: &git2::Repository,
    entries: &[Borrowed<'_>],
    since: Option<(i64, u32)>,
) -> Result<Vec<bool>, RepoError> {
    let mut smudged = vec![false; entries.len()];
    // In `since`'s second or later: what git built without `USE_NSEC` (which also matches
    // stats by whole seconds) takes for racy only while the index is of that second.
    let same_second: Vec<usize> = (0..entries.len())
        .filter(|&i| {
            let e = entries[i].raw;
            e.mode != 0o160000 && since.is_none_or(|(s, _)| e.mtime.seconds as u32 >= s as u32)
        })
        .collect();
    let as_new = |e: &libgit2_sys::git_index_entry| {
        since.is_none_or(|(s, ns)| {
            let (es, ens) = (e.mtime.seconds as u32, e.mtime.nanoseconds);
            es > s as u32 || (es == s as u32 && ens >= ns)
        })
    };
    // Older than the index to the nanosecond, but of its second: a file whose stat is not
    // the entry's to the nanosecond changed since (a whole-second git would trust it once
    // the index is of a later second). Looked at again; no hashing needed.
    let (racy, older): (Vec<usize>, Vec<usize>) = same_second
        .into_iter()
        .partition(|&i| as_new(entries[i].raw));
    // Without a work tree (never a checkout's) there is nothing on disk to compare with.
    if let Some(workdir) = repo.workdir() {
        for i in older {
            let (e, rel) = (entries[i].raw, entries[i].path);
            let file = workdir.join(std::ffi::OsStr::from_bytes(rel));
            let same = std::fs::symlink_metadata(&file).is_ok_and(|m| {
                use std::os::unix::fs::MetadataExt;
                m.mtime() as u32 == e.mtime.seconds as u32
                    && m.mtime_nsec() as u32 == e.mtime.nanoseconds
                    && m.ctime() as u32 == e.ctime.seconds as u32
                    && m.ctime_nsec() as u32 == e.ctime.nanoseconds
                    && m.size() as u32 == e.file_size
                    && m.ino() as u32 == e.ino
            });
            smudged[i] = !same;
        }
    }
    if racy.is_empty() {
        return Ok(smudged);
    }
    let mut scratch = git2::Index::new().map_err(git)?;
    let mut opts = git2::DiffOptions::new();
    opts.include_typechange(true)
        .ignore_submodules(true)
        .disable_pathspec_match(true);
    for &i in &racy {
        let (e, rel) = (entries[i].raw, entries[i].path);
        let cleared = git2::IndexEntry {
            ctime: git2::IndexTime::new(e.ctime.seconds, e.ctime.nanoseconds),
            mtime: git2::IndexTime::new(0, 0),
            dev: e.dev,
            ino: e.ino,
            mode: e.mode,
            uid: e.uid,
            gid: e.gid,
            file_size: e.file_size,
            id: git2::Oid::from_bytes(&e.id.id).map_err(git)?,
            flags: e.flags,
            flags_extended: e.flags_extended,
            path: rel.to_vec(),
        };
        scratch.add(&cleared).map_err(git)?;
        opts.pathspec(rel);
    }
    let diff = repo
        .diff_index_to_workdir(Some(&scratch), Some(&mut opts))
        .map_err(git)?;
    let at: std::collections::HashMap<&[u8], usize> =
        racy.iter().map(|&i| (entries[i].path, i)).collect();
    for delta in diff.deltas() {
        // Stage 0 only: an index with conflicts is left to libgit2's write.
        if let Some(&i) = delta.old_file().path_bytes().and_then(|p| at.get(p)) {
            smudged[i] = true;
        }
    }
    Ok(smudged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::git::snapshot::tests::entry;

    #[test]
    fn the_index_written_is_one_libgit2_reads_entry_for_entry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index");
        let mut long = entry(&"x/".repeat(40), 3);
        long.mode = 0o100755;
        let entries = vec![entry("a", 1), long, entry("z", 2)];
        write_index(&path, &entries).unwrap();
        let index = git2::Index::open(&path).unwrap();
        let read: Vec<_> = index.iter().collect();
        assert_eq!(read.len(), 3);
        for (theirs, ours) in read.iter().zip(&entries) {
            assert_eq!(theirs.path, ours.path);
            assert_eq!(theirs.id, ours.id);
            assert_eq!(theirs.mode, ours.mode);
            assert_eq!(theirs.ino, ours.stat.ino as u32);
            assert_eq!(theirs.mtime.nanoseconds(), 7);
            assert_eq!(theirs.file_size, 12);
        }
        assert!(!dir.path().join("index.lock").exists());
    }

    /// git's own reading of the index at `index`.
    fn git_reads(repo: &Path, index: &Path, args: &[&str]) -> String {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(repo)
            .env("GIT_INDEX_FILE", index)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn repo_with(files: &[(&str, &str)]) -> (tempfile::TempDir, git2::Repository) {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init(dir.path()).unwrap();
        for (path, text) in files {
            let full = dir.path().join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(full, text).unwrap();
        }
        (dir, repo)
    }

    /// Whole seconds since the epoch, `n` seconds ago: older than any index a test writes.
    fn seconds_ago(n: u64) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            - n
    }

    /// The size `index` holds for `path`.
    /// `git status` of the repository at `repo`, nothing committed: `f.txt` staged and
    /// changed in the work tree since, `same.txt` staged as it is.
    fn assert_git_sees_only_f_changed(repo: &Path) {
        let status = git_reads(repo, &repo.join(".git/index"), &["status", "--porcelain"]);
        assert!(status.lines().any(|l| l == "AM f.txt"), "{status}");
        assert!(status.lines().any(|l| l == "A  same.txt"), "{status}");
    }

    fn size(index: &git2::Index, path: &str) -> u32 {
        index.get_path(Path::new(path), 0).unwrap().file_size
    }

    fn set_mtime(path: &Path, secs: u64) {
        set_mtime_ns(path, secs, 0);
    }

    fn set_mtime_ns(path: &Path, secs: u64, nanos: u32) {
        let at = std::time::UNIX_EPOCH + std::time::Duration::new(secs, nanos);
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_times(std::fs::FileTimes::new().set_modified(at))
            .unwrap();
    }

    #[test]
    fn the_users_index_reads_to_git_entry_for_entry_as_libgit2_wrote_it() {
        let (dir, repo) = repo_with(&[
            ("a.txt", "a\n"),
            ("bin/run", "#!/bin/sh\n"),
            ("deep/er/c.txt", "c\n"),
            ("later.txt", "l\n"),
        ]);
        std::fs::set_permissions(
            dir.path().join("bin/run"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink("a.txt", dir.path().join("link")).unwrap();
        // Older than any index written below, on any clock: no entry is racily clean, so
        // both writers keep every stat as it is.
        let old = seconds_ago(1000);
        for path in ["a.txt", "bin/run", "deep/er/c.txt", "later.txt"] {
            set_mtime(&dir.path().join(path), old);
        }
        let mut index = repo.index().unwrap();
        for path in ["a.txt", "bin/run", "deep/er/c.txt", "link", "later.txt"] {
            index.add_path(Path::new(path)).unwrap();
        }
        let long = "x/".repeat(2100) + "f";
        let mut entry = index.get_path(Path::new("a.txt"), 0).unwrap();
        entry.path = long.into_bytes();
        index.add(&entry).unwrap();
        // Flags git keeps: skip-worktree (extended: version 3), assume-valid, intent-to-add.
        let mut skip = index.get_path(Path::new("deep/er/c.txt"), 0).unwrap();
        skip.flags_extended |= 0x4000;
        index.add(&skip).unwrap();
        let mut valid = index.get_path(Path::new("bin/run"), 0).unwrap();
        valid.flags |= ASSUME_VALID;
        index.add(&valid).unwrap();
        let mut intent = index.get_path(Path::new("later.txt"), 0).unwrap();
        intent.flags_extended |= 0x2000;
        index.add(&intent).unwrap();
        index.write().unwrap();
        let theirs = dir.path().join(".git/index");
        let ours_path = dir.path().join(".git/ours");
        std::fs::copy(&theirs, &ours_path).unwrap();
        let mut ours = git2::Index::open(&ours_path).unwrap();
        // As a move calls it: the index it replaces is the one libgit2 wrote.
        let meta = std::fs::metadata(&theirs).unwrap();
        let since = {
            use std::os::unix::fs::MetadataExt;
            (meta.mtime(), meta.mtime_nsec() as u32)
        };
        write_user_index(&repo, &mut ours, Some(since)).unwrap();
        assert!(!dir.path().join(".git/ours.lock").exists());
        for args in [
            &["ls-files", "--stage", "--debug"][..],
            &["ls-files", "-t", "-v"][..],
        ] {
            assert_eq!(
                git_reads(dir.path(), &ours_path, args),
                git_reads(dir.path(), &theirs, args),
                "git {args:?}"
            );
        }
        // fsck checks the trailer and the order, which `ls-files` does not.
        git_reads(
            dir.path(),
            &ours_path,
            &["fsck", "--no-progress", "--no-dangling"],
        );
        let bytes = std::fs::read(&ours_path).unwrap();
        assert_eq!(&bytes[..8], b"DIRC\0\0\0\x03");
        let again: Vec<_> = git2::Index::open(&ours_path).unwrap().iter().collect();
        let before: Vec<_> = git2::Index::open(&theirs).unwrap().iter().collect();
        assert_eq!(again.len(), before.len());
        for (a, b) in again.iter().zip(&before) {
            assert_eq!(
                (&a.path, a.id, a.mode, a.file_size),
                (&b.path, b.id, b.mode, b.file_size)
            );
            assert_eq!((a.flags, a.flags_extended), (b.flags, b.flags_extended));
        }
    }

    #[test]
    fn an_entry_as_new_as_the_index_it_replaces_is_looked_at_again_where_it_changed() {
        let (dir, repo) =
            repo_with(&[("f.txt", "aaaa"), ("same.txt", "ssss"), ("old.txt", "oooo")]);
        let mut index = repo.index().unwrap();
        for path in ["f.txt", "same.txt", "old.txt"] {
            index.add_path(Path::new(path)).unwrap();
        }
        index.write().unwrap();
        // `f.txt` changed (same size) in the clock tick its stat was taken in, after it:
        // the entry's stat is the file's, its blob the old content. `same.txt` is as new
        // but unchanged. `old.txt`'s entry names another blob too, but is older than the
        // index it replaces: git trusts its stat, and so does the writer.
        // Times well before now, so that libgit2's own idea of the index's age (the file's
        // time) would trust every stat: only the writer's rule can catch `f.txt`.
        let racy_at = seconds_ago(1000);
        std::fs::write(dir.path().join("f.txt"), "bbbb").unwrap();
        set_mtime(&dir.path().join("f.txt"), racy_at);
        set_mtime(&dir.path().join("same.txt"), racy_at);
        set_mtime(&dir.path().join("old.txt"), racy_at - 10);
        let stale = index.get_path(Path::new("f.txt"), 0).unwrap().id;
        for path in ["f.txt", "same.txt", "old.txt"] {
            index.add_path(Path::new(path)).unwrap();
        }
        let mut entry = index.get_path(Path::new("f.txt"), 0).unwrap();
        entry.id = stale;
        index.add(&entry).unwrap();
        let mut old_entry = index.get_path(Path::new("old.txt"), 0).unwrap();
        old_entry.id = stale;
        index.add(&old_entry).unwrap();

        write_user_index(&repo, &mut index, Some((racy_at as i64, 0))).unwrap();
        // Looked at again: its size is 0 on disk and in memory, and git sees the change.
        assert_eq!(size(&index, "f.txt"), 0);
        let on_disk = git2::Index::open(&dir.path().join(".git/index")).unwrap();
        assert_eq!(size(&on_disk, "f.txt"), 0);
        assert_eq!(size(&on_disk, "same.txt"), 4);
        // Older than the index it replaces: git's rule trusts its stat, as it would have.
        assert_eq!(size(&on_disk, "old.txt"), 4);
        // Staged (no commit yet), and changed in the work tree: git hashed it again.
        assert_git_sees_only_f_changed(dir.path());
    }

    #[test]
    fn an_entry_of_the_replaced_indexs_second_whose_file_changed_is_looked_at_again() {
        let (dir, repo) = repo_with(&[("f.txt", "aaaa"), ("same.txt", "ssss")]);
        // git without USE_NSEC matches stats by whole seconds; without ctime too, only the
        // size and the mtime's second tell it a file changed.
        repo.config()
            .unwrap()
            .set_bool("core.trustctime", false)
            .unwrap();
        let second = seconds_ago(1000);
        for path in ["f.txt", "same.txt"] {
            set_mtime_ns(&dir.path().join(path), second, 100_000_000);
        }
        let mut index = repo.index().unwrap();
        for path in ["f.txt", "same.txt"] {
            index.add_path(Path::new(path)).unwrap();
        }
        index.write().unwrap();
        // The index it replaces was written at .3 of that second; `f.txt` changed at .4,
        // same size: the entry (.1) is older than that index, to the nanosecond.
        std::fs::write(dir.path().join("f.txt"), "bbbb").unwrap();
        set_mtime_ns(&dir.path().join("f.txt"), second, 400_000_000);
        write_user_index(&repo, &mut index, Some((second as i64, 300_000_000))).unwrap();
        let on_disk = git2::Index::open(&dir.path().join(".git/index")).unwrap();
        assert_eq!((size(&index, "f.txt"), size(&on_disk, "f.txt")), (0, 0));
        assert_eq!(
            size(&on_disk, "same.txt"),
            4,
            "its stat is the entry's: trusted"
        );
        assert_git_sees_only_f_changed(dir.path());
    }
}
