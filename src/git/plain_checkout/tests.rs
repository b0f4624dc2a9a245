use std::os::unix::fs::PermissionsExt;

use super::*;

fn commit(repo: &git2::Repository, files: &[(&str, &[u8], i32)]) -> git2::Oid {
    let mut index = git2::Index::new().unwrap();
    for (path, content, mode) in files {
        let id = repo.blob(content).unwrap();
        index
            .add(&git2::IndexEntry {
                ctime: git2::IndexTime::new(0, 0),
                mtime: git2::IndexTime::new(0, 0),
                dev: 0,
                ino: 0,
                mode: *mode as u32,
                uid: 0,
                gid: 0,
                file_size: 0,
                id,
                flags: 0,
                flags_extended: 0,
                path: path.as_bytes().to_vec(),
            })
            .unwrap();
    }
    let tree = repo.find_tree(index.write_tree_to(repo).unwrap()).unwrap();
    let sig = git2::Signature::now("t", "t@example.com").unwrap();
    let parent = repo.head().ok().and_then(|h| h.peel_to_commit().ok());
    let parents: Vec<&git2::Commit> = parent.iter().collect();
    repo.commit(Some("HEAD"), &sig, &sig, "files", &tree, &parents)
        .unwrap()
}

/// A repository with `files` committed, and a worktree of it emptied but for its `.git`
/// file (as flotilla's are before their checkout).
fn emptied_worktree(
    files: &[(&str, &[u8], i32)],
) -> (tempfile::TempDir, git2::Repository, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init(dir.path().join("repo")).unwrap();
    commit(&repo, files);
    let path = dir.path().join("empty");
    repo.worktree("empty", &path, None).unwrap();
    for entry in std::fs::read_dir(&path).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != ".git" {
            let p = entry.path();
            if p.is_dir() && !p.is_symlink() {
                std::fs::remove_dir_all(p).unwrap();
            } else {
                std::fs::remove_file(p).unwrap();
            }
        }
    }
    let _ = std::fs::remove_file(repo.path().join("worktrees/empty/index"));
    (dir, repo, path)
}

const FILES: &[(&str, &[u8], i32)] = &[
    ("a.txt", b"one\ntwo\n", FILE),
    ("crlf.txt", b"x\r\ny\r\n", FILE),
    ("bin/run.sh", b"#!/bin/sh\necho hi\n", EXECUTABLE),
    ("link", b"a.txt", LINK),
    ("dir/sub/deep.txt", b"deep\n", FILE),
    // Directories opened and closed in turn: a sibling of the same length, one deeper,
    // and a file back up in their parent.
    ("dir/sub/deeper/z.txt", b"z\n", FILE),
    ("dir/sup/other.txt", b"other\n", FILE),
    ("dir/top.txt", b"top\n", FILE),
    ("with space.md", b"# doc\n", FILE),
    (".gitignore", b"target/\n", FILE),
    (
        "a-b/c",
        b"sorted after a.txt in the tree, before it in the index\n",
        FILE,
    ),
];

#[test]
fn a_plain_checkout_writes_what_libgit2s_would_and_an_index_git_finds_clean() {
    let (dir, repo, path) = emptied_worktree(FILES);
    // libgit2's own checkout of the same commit, beside it.
    let theirs = dir.path().join("theirs");
    repo.worktree("theirs", &theirs, None).unwrap();

    let worktree = git2::Repository::open(&path).unwrap();
    let snapshot = checkout_plain(&worktree, &path).unwrap().expect("plain");
    assert_eq!(
        snapshot.tree,
        worktree.head().unwrap().peel_to_tree().unwrap().id()
    );

    for (file, _, _) in FILES {
        let (ours, theirs) = (path.join(file), theirs.join(file));
        let (m1, m2) = (
            std::fs::symlink_metadata(&ours).unwrap(),
            std::fs::symlink_metadata(&theirs).unwrap(),
        );
        assert_eq!(m1.file_type(), m2.file_type(), "{file}");
        assert_eq!(m1.permissions().mode(), m2.permissions().mode(), "{file}");
        if m1.file_type().is_symlink() {
            assert_eq!(
                std::fs::read_link(&ours).unwrap(),
                std::fs::read_link(&theirs).unwrap()
            );
        } else {
            assert_eq!(
                std::fs::read(&ours).unwrap(),
                std::fs::read(&theirs).unwrap(),
                "{file}"
            );
        }
    }
    for dir_name in ["bin", "dir", "dir/sub", "dir/sub/deeper", "dir/sup", "a-b"] {
        assert_eq!(
            std::fs::metadata(path.join(dir_name))
                .unwrap()
                .permissions()
                .mode(),
            std::fs::metadata(theirs.join(dir_name))
                .unwrap()
                .permissions()
                .mode(),
            "{dir_name}"
        );
    }

    // The index: libgit2's entries (path, blob, mode), in its order; the snapshot's stat
    // is each file's.
    let entries = |index: git2::Index| {
        index
            .iter()
            .map(|e| (e.path, e.id, e.mode))
            .collect::<Vec<_>>()
    };
    let ours_index = git2::Index::open(&worktree.path().join("index")).unwrap();
    let theirs_index = git2::Repository::open(&theirs).unwrap().index().unwrap();
    assert_eq!(entries(ours_index), entries(theirs_index));
    for entry in &snapshot.entries {
        let meta = std::fs::symlink_metadata(path.join(OsStr::from_bytes(&entry.path))).unwrap();
        assert_eq!(entry.stat, Stat::of(&meta));
    }
    // git finds nothing to report: the work tree, the index and HEAD agree.
    let statuses = worktree
        .statuses(Some(git2::StatusOptions::new().include_untracked(true)))
        .unwrap();
    let dirty: Vec<_> = statuses
        .iter()
        .map(|s| (s.path().map(str::to_owned), s.status()))
        .collect();
    assert!(dirty.is_empty(), "{dirty:?}");
}

/// A filter driver in the config (git-lfs's, as installing git-lfs writes it into the
/// system's config) applies to no path when no attribute names it: the checkout stays
/// plain, and writes what libgit2's does.
#[test]
fn a_filter_driver_no_attribute_names_leaves_the_checkout_plain() {
    let (_dir, repo, path) = emptied_worktree(FILES);
    {
        let mut config = repo.config().unwrap();
        config
            .set_str("filter.lfs.smudge", "git-lfs smudge -- %f")
            .unwrap();
        config
            .set_str("filter.lfs.process", "git-lfs filter-process")
            .unwrap();
        config.set_bool("filter.lfs.required", true).unwrap();
    }
    let worktree = git2::Repository::open(&path).unwrap();
    let snapshot = checkout_plain(&worktree, &path).unwrap();
    assert!(snapshot.is_some(), "plain, with a filter driver configured");
    for (name, bytes, mode) in FILES {
        if *mode != LINK {
            assert_eq!(std::fs::read(path.join(name)).unwrap(), *bytes, "{name}");
        }
    }
}

#[test]
fn an_attributes_file_or_a_conversion_in_the_config_leaves_the_checkout_to_libgit2() {
    let with = |extra: &[(&str, &[u8], i32)]| {
        let mut files = FILES.to_vec();
        files.extend_from_slice(extra);
        emptied_worktree(&files)
    };
    let untouched = |path: &Path| {
        let names: Vec<_> = std::fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [".git"], "nothing written");
    };
    // A `.gitattributes` anywhere in the tree.
    let (_dir, _repo, path) = with(&[("dir/.gitattributes", b"*.txt eol=crlf\n", FILE)]);
    let worktree = git2::Repository::open(&path).unwrap();
    assert!(checkout_plain(&worktree, &path).unwrap().is_none());
    untouched(&path);
    // A submodule.
    let gitlink = [("vendor/lib", b"" as &[u8], 0o160000)];
    let (_dir, repo, path) = emptied_worktree(&[FILES[0]]);
    {
        let mut index = git2::Index::new().unwrap();
        let tree = repo.head().unwrap().peel_to_tree().unwrap();
        index.read_tree(&tree).unwrap();
        let mut entry = index.get_path(Path::new("a.txt"), 0).unwrap();
        entry.mode = gitlink[0].2 as u32;
        entry.path = gitlink[0].0.as_bytes().to_vec();
        index.add(&entry).unwrap();
        let tree = repo.find_tree(index.write_tree_to(&repo).unwrap()).unwrap();
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        let head = repo.head().unwrap().peel_to_commit().unwrap();
        let id = repo
            .commit(None, &sig, &sig, "submodule", &tree, &[&head])
            .unwrap();
        let worktree = git2::Repository::open(&path).unwrap();
        worktree.set_head_detached(id).unwrap();
        assert!(checkout_plain(&worktree, &path).unwrap().is_none());
        untouched(&path);
    }
    // `info/attributes`, `core.autocrlf`, `core.eol`, a file already there.
    type Spoil = fn(&git2::Repository, &Path);
    let spoils: [(&str, Spoil); 4] = [
        ("info/attributes", |repo, _| {
            std::fs::create_dir_all(repo.path().join("info")).unwrap();
            std::fs::write(repo.path().join("info/attributes"), "*.txt text\n").unwrap();
        }),
        ("core.autocrlf", |repo, _| {
            repo.config()
                .unwrap()
                .set_bool("core.autocrlf", true)
                .unwrap();
        }),
        ("core.eol", |repo, _| {
            repo.config().unwrap().set_str("core.eol", "crlf").unwrap();
        }),
        ("a file", |_, path| {
            std::fs::write(path.join("left.txt"), "left\n").unwrap();
        }),
    ];
    for (what, spoil) in spoils {
        let (_dir, repo, path) = with(&[]);
        spoil(&repo, &path);
        let worktree = git2::Repository::open(&path).unwrap();
        assert!(
            checkout_plain(&worktree, &path).unwrap().is_none(),
            "{what}"
        );
        if what != "a file" {
            untouched(&path);
        }
    }
}

#[test]
fn names_libgit2_might_refuse_are_not_plain() {
    for name in [
        &b".git"[..],
        b".GIT",
        b"git~1",
        b"a.",
        b"a ",
        b"caf\xc3\xa9",
        b"a:b",
        b"a\\b",
        b"",
        b".",
        b"..",
        b"tab\there",
    ] {
        assert!(
            !plain_name(name, false),
            "{:?}",
            String::from_utf8_lossy(name)
        );
    }
    for name in [
        &b".gitignore"[..],
        b".github",
        b"with space",
        b"a.b",
        b"Makefile",
    ] {
        assert!(
            plain_name(name, false),
            "{:?}",
            String::from_utf8_lossy(name)
        );
    }
    assert!(
        !plain_name(b".gitmodules", true),
        "a link named like git's own file"
    );
    assert!(plain_name(b"lib", true));
}

#[test]
fn a_worktree_removed_before_its_checkout_is_not_made_again() {
    let (_dir, _repo, path) = emptied_worktree(FILES);
    let worktree = git2::Repository::open(&path).unwrap();
    std::fs::remove_dir_all(&path).unwrap();
    assert!(checkout_plain(&worktree, &path).unwrap().is_none());
    assert!(!path.exists());
}

#[test]
fn a_link_target_the_system_call_refuses_leaves_the_checkout_to_libgit2() {
    // libgit2 writes a target with a NUL cut short; `symlink` would refuse it.
    let (_dir, _repo, path) = emptied_worktree(&[("a.txt", b"x\n", FILE), ("l", b"a\0b", LINK)]);
    let worktree = git2::Repository::open(&path).unwrap();
    assert!(checkout_plain(&worktree, &path).unwrap().is_none());
    // Empty or too long: not plain either (libgit2 decides, and fails as it would).
    let long = vec![b'a'; 4096];
    for target in [&b""[..], &long] {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init(dir.path()).unwrap();
        let head = commit(&repo, &[("l", target, LINK)]);
        let tree = repo.find_commit(head).unwrap().tree().unwrap();
        let mut files = Vec::new();
        assert!(!plain_entries(&repo, &tree, &[], MAX_PLAIN_PATH, &mut files).unwrap());
    }
    let (_dir, _repo, path) = emptied_worktree(&[("a.txt", b"x\n", FILE), ("l", b"a.txt", LINK)]);
    let worktree = git2::Repository::open(&path).unwrap();
    assert!(checkout_plain(&worktree, &path).unwrap().is_some());
}

/// A tree deeper than [`MAX_PLAIN_DEPTH`] is libgit2's (each level holds a handle open
/// while its files are written), and a path too long for the worktree's place is too;
/// a tree at the depth limit is still written here.
#[test]
fn a_tree_too_deep_or_a_path_too_long_for_its_place_leaves_the_checkout_to_libgit2() {
    let deep = |levels: usize| format!("{}f.txt", "d/".repeat(levels));
    let at_limit = deep(MAX_PLAIN_DEPTH);
    let (_dir, _repo, path) = emptied_worktree(&[(at_limit.as_str(), b"x\n", FILE)]);
    let worktree = git2::Repository::open(&path).unwrap();
    assert!(checkout_plain(&worktree, &path).unwrap().is_some());
    assert_eq!(std::fs::read(path.join(&at_limit)).unwrap(), b"x\n");

    let too_deep = deep(MAX_PLAIN_DEPTH + 1);
    let (_dir, _repo, path) = emptied_worktree(&[(too_deep.as_str(), b"x\n", FILE)]);
    let worktree = git2::Repository::open(&path).unwrap();
    assert!(checkout_plain(&worktree, &path).unwrap().is_none());

    let dir = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init(dir.path()).unwrap();
    let head = commit(&repo, &[("abcdefgh.txt", b"x\n", FILE)]);
    let tree = repo.find_commit(head).unwrap().tree().unwrap();
    let mut files = Vec::new();
    assert!(plain_entries(&repo, &tree, &[], 12, &mut files).unwrap());
    assert!(!plain_entries(&repo, &tree, &[], 11, &mut files).unwrap());
}
