//! Tree work that follows the change, not the tree (ADR-045): what the landing path does
//! with whole trees, done by reading only the subtrees whose ids differ.
//!
//! - [`changed_paths`]: the files that differ between two trees (what libgit2's tree-to-tree
//!   diff lists, without rename detection), reading only the subtrees whose ids differ;
//!   libgit2's diff walks every entry of both trees.
//! - [`merge_trees`]: a three-way merge with libgit2's own `git_merge_trees` (its rules,
//!   renames and conflicts unchanged), run on the three trees without what all three hold
//!   alike, then grafted onto "ours": the merge reads, and the result writes, only what
//!   some side changed.
//!
//! Every subtree read is counted ([`subtrees_read`], per thread) so tests can show the
//! work does not grow with the tree. It must not know checkouts, refs or the queue.

use std::cell::Cell;
use std::collections::BTreeMap;

use git2::{Oid, Repository, Tree};

const TREE: i32 = 0o040000;

thread_local! {
    static SUBTREES_READ: Cell<u64> = const { Cell::new(0) };
}

/// How many trees this thread has read through this module: a counter for tests.
pub fn subtrees_read() -> u64 {
    SUBTREES_READ.with(Cell::get)
}

fn read_tree<'r>(repo: &'r Repository, id: Oid) -> Result<Tree<'r>, git2::Error> {
    SUBTREES_READ.with(|n| n.set(n.get().saturating_add(1)));
    repo.find_tree(id)
}

/// One entry of a tree: its id and mode.
pub type Entry = (Oid, i32);

/// One file (or link, or submodule) that differs: its path (git's bytes, which need not be
/// UTF-8) and its entry before and after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathChange {
    pub path: Vec<u8>,
    pub before: Option<Entry>,
    pub after: Option<Entry>,
}

fn is_tree(entry: &Entry) -> bool {
    entry.1 == TREE
}

/// A tree's entries by name (git keeps them sorted, but by its own order).
fn entries(tree: &Tree<'_>) -> BTreeMap<Vec<u8>, Entry> {
    tree.iter()
        .map(|e| (e.name_bytes().to_vec(), (e.id(), e.filemode())))
        .collect()
}

fn join(prefix: &[u8], name: &[u8]) -> Vec<u8> {
    [prefix, name].concat()
}

/// `path/`: the prefix of what a directory at `path` holds.
fn dir_of(path: &[u8]) -> Vec<u8> {
    [path, b"/"].concat()
}

/// Every file under the tree `id` at `prefix`, as added (`added`) or removed.
fn whole(
    repo: &Repository,
    id: Oid,
    prefix: &[u8],
    added: bool,
    out: &mut Vec<PathChange>,
) -> Result<(), git2::Error> {
    let tree = read_tree(repo, id)?;
    for (name, entry) in entries(&tree) {
        let path = join(prefix, &name);
        if is_tree(&entry) {
            whole(repo, entry.0, &dir_of(&path), added, out)?;
        } else if added {
            out.push(PathChange {
                path,
                before: None,
                after: Some(entry),
            });
        } else {
            out.push(PathChange {
                path,
                before: Some(entry),
                after: None,
            });
        }
    }
    Ok(())
}

fn walk(
    repo: &Repository,
    from: &Tree<'_>,
    to: &Tree<'_>,
    prefix: &[u8],
    out: &mut Vec<PathChange>,
) -> Result<(), git2::Error> {
    let (old, new) = (entries(from), entries(to));
    let mut names: Vec<&Vec<u8>> = old.keys().chain(new.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        let (before, after) = (old.get(name).copied(), new.get(name).copied());
        if before == after {
            continue;
        }
        let path = join(prefix, name);
        let dir = dir_of(&path);
        match (before, after) {
            (Some(b), Some(a)) if is_tree(&b) && is_tree(&a) => {
                let (b, a) = (read_tree(repo, b.0)?, read_tree(repo, a.0)?);
                walk(repo, &b, &a, &dir, out)?;
            }
            (b, a) => {
                // A directory on one side only, or replaced by a file (or the reverse):
                // its files go or come one by one, as git's diff lists them.
                let (b_file, a_file) = (b.filter(|e| !is_tree(e)), a.filter(|e| !is_tree(e)));
                if b_file.is_some() || a_file.is_some() {
                    out.push(PathChange {
                        path: path.clone(),
                        before: b_file,
                        after: a_file,
                    });
                }
                if let Some(b) = b.filter(is_tree) {
                    whole(repo, b.0, &dir, false, out)?;
                }
                if let Some(a) = a.filter(is_tree) {
                    whole(repo, a.0, &dir, true, out)?;
                }
            }
        }
    }
    Ok(())
}

/// The files that differ between `from` and `to`, sorted by path (as git's diff lists
/// them; a file replaced by a directory comes before the directory's files). A file whose
/// type changes (a file becoming a link) is one change, not a removal and an addition.
pub fn changed_paths(
    repo: &Repository,
    from: &Tree<'_>,
    to: &Tree<'_>,
) -> Result<Vec<PathChange>, git2::Error> {
    let mut out = Vec::new();
    if from.id() != to.id() {
        walk(repo, from, to, b"", &mut out)?;
    }
    // Stable: a file's removal stays ahead of an addition at the same path.
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// One file's new entry at a path, or its removal (`None`).
pub type Update = (Vec<u8>, Option<Entry>);

/// `base` with `updates` (paths relative to it, each at most once) applied: only the
/// directories on an updated path are read and written again. A file may replace a
/// directory and the reverse; a directory left empty goes. `None` when the result is
/// empty. The seal builds its commit so (ADR-046), not through an index of every file.
pub fn with_updates(
    repo: &Repository,
    base: Option<&Tree<'_>>,
    updates: &[Update],
) -> Result<Option<Oid>, git2::Error> {
    let full = base.map(entries).unwrap_or_default();
    let mut direct: BTreeMap<&[u8], Option<Entry>> = BTreeMap::new();
    let mut nested: BTreeMap<&[u8], Vec<Update>> = BTreeMap::new();
    for (path, entry) in updates {
        match path.iter().position(|b| *b == b'/') {
            Some(slash) => nested
                .entry(&path[..slash])
                .or_default()
                .push((path[slash + 1..].to_vec(), *entry)),
            None => {
                direct.insert(path.as_slice(), *entry);
            }
        }
    }
    let mut merged = full.clone();
    for (name, sub) in &nested {
        // A file written at the directory's own name wins (a disk holds one or the other).
        if matches!(direct.get(name), Some(Some(_))) {
            continue;
        }
        let sub_base = full
            .get(*name)
            .filter(|e| is_tree(e))
            .map(|e| read_tree(repo, e.0))
            .transpose()?;
        match with_updates(repo, sub_base.as_ref(), sub)? {
            Some(id) => merged.insert(name.to_vec(), (id, TREE)),
            None => merged.remove(*name),
        };
    }
    for (name, entry) in direct {
        match entry {
            Some(entry) => {
                merged.insert(name.to_vec(), entry);
            }
            // A removed file whose name is now a directory's keeps the directory.
            None if nested.contains_key(name) => {}
            None => {
                merged.remove(name);
            }
        }
    }
    if merged == full {
        return Ok(base.map(Tree::id));
    }
    if merged.is_empty() {
        return Ok(None);
    }
    write_over(repo, base, &full, &merged).map(Some)
}

// ---------------------------------------------------------------------------------------
// merging

fn write(repo: &Repository, entries: &BTreeMap<Vec<u8>, Entry>) -> Result<Oid, git2::Error> {
    let mut builder = repo.treebuilder(None)?;
    for (name, (id, mode)) in entries {
        builder.insert(name.as_slice(), *id, *mode)?;
    }
    builder.write()
}

/// `entries` written as a tree, starting from `source` (whose entries are `was`): only the
/// names that differ are inserted or removed. libgit2 checks each inserted entry's object
/// exists (a read of its header: for a loose object, an open and an inflate), but takes a
/// source tree's entries as they are, so a directory of N files that one task changed
/// costs one check, not N (ADR-051).
fn write_over(
    repo: &Repository,
    source: Option<&Tree<'_>>,
    was: &BTreeMap<Vec<u8>, Entry>,
    entries: &BTreeMap<Vec<u8>, Entry>,
) -> Result<Oid, git2::Error> {
    let Some(source) = source else {
        return write(repo, entries);
    };
    let mut builder = repo.treebuilder(Some(source))?;
    for name in was.keys() {
        if !entries.contains_key(name) {
            builder.remove(name.as_slice())?;
        }
    }
    for (name, entry) in entries {
        if was.get(name) != Some(entry) {
            builder.insert(name.as_slice(), entry.0, entry.1)?;
        }
    }
    builder.write()
}

/// The three trees without the entries all three hold alike, recursively where all three
/// hold a directory: (base, ours, theirs).
fn reduce(
    repo: &Repository,
    base: &Tree<'_>,
    ours: &Tree<'_>,
    theirs: &Tree<'_>,
) -> Result<(Oid, Oid, Oid), git2::Error> {
    let (b, o, t) = (entries(base), entries(ours), entries(theirs));
    let mut names: Vec<&Vec<u8>> = b.keys().chain(o.keys()).chain(t.keys()).collect();
    names.sort();
    names.dedup();
    let (mut rb, mut ro, mut rt) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    for name in names {
        let (eb, eo, et) = (b.get(name), o.get(name), t.get(name));
        match (eb, eo, et) {
            (Some(x), Some(y), Some(z)) if x == y && y == z => {}
            (Some(x), Some(y), Some(z)) if is_tree(x) && is_tree(y) && is_tree(z) => {
                let (sb, so, st) = reduce(
                    repo,
                    &read_tree(repo, x.0)?,
                    &read_tree(repo, y.0)?,
                    &read_tree(repo, z.0)?,
                )?;
                rb.insert(name.clone(), (sb, TREE));
                ro.insert(name.clone(), (so, TREE));
                rt.insert(name.clone(), (st, TREE));
            }
            _ => {
                for (side, entry) in [(&mut rb, eb), (&mut ro, eo), (&mut rt, et)] {
                    if let Some(entry) = entry {
                        side.insert(name.clone(), *entry);
                    }
                }
            }
        }
    }
    Ok((write(repo, &rb)?, write(repo, &ro)?, write(repo, &rt)?))
}

/// `ours` with what the merge of the reduced trees changed against reduced ours: `None`
/// when that leaves the tree empty. Where reduced ours has a directory, the result's
/// directory (or its absence: every differing file gone) is grafted into ours' own, which
/// also holds what the reduction left out.
fn graft(
    repo: &Repository,
    ours: Option<&Tree<'_>>,
    reduced_ours: Option<&Tree<'_>>,
    result: Option<&Tree<'_>>,
) -> Result<Option<Oid>, git2::Error> {
    let full = ours.map(entries).unwrap_or_default();
    let was = reduced_ours.map(entries).unwrap_or_default();
    let now = result.map(entries).unwrap_or_default();
    let mut merged = full.clone();
    let mut names: Vec<&Vec<u8>> = was.keys().chain(now.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        let (w, n) = (was.get(name), now.get(name));
        if w == n {
            continue;
        }
        let ours_dir = full.get(name).filter(|e| is_tree(e));
        match (w, n) {
            (Some(w), n) if is_tree(w) && ours_dir.is_some() && n.is_none_or(is_tree) => {
                let sub_full = ours_dir.map(|e| read_tree(repo, e.0)).transpose()?;
                let sub_was = read_tree(repo, w.0)?;
                let sub_now = n.map(|e| read_tree(repo, e.0)).transpose()?;
                match graft(repo, sub_full.as_ref(), Some(&sub_was), sub_now.as_ref())? {
                    Some(id) => merged.insert(name.clone(), (id, TREE)),
                    None => merged.remove(name),
                };
            }
            (_, Some(n)) => {
                merged.insert(name.clone(), *n);
            }
            (_, None) => {
                merged.remove(name);
            }
        }
    }
    if merged == full {
        return Ok(ours.map(Tree::id));
    }
    if merged.is_empty() {
        return Ok(None);
    }
    write_over(repo, ours, &full, &merged).map(Some)
}

/// What a three-way merge gave.
pub enum Merged {
    /// The merged tree.
    Clean(Oid),
    /// The merge's index, which has conflicts.
    Conflicts(git2::Index),
}

/// `git_merge_trees(base, ours, theirs)` with libgit2's default options, reading and
/// writing only the subtrees some side changed. The tree is the one the full merge's index
/// would write (for trees git made: with no empty directories); the conflicts are the same.
pub fn merge_trees(
    repo: &Repository,
    base: &Tree<'_>,
    ours: &Tree<'_>,
    theirs: &Tree<'_>,
) -> Result<Merged, git2::Error> {
    // One side left alone: the other side is the merge (as git's merge, for trees whose
    // paths git itself wrote).
    if base.id() == theirs.id() {
        return Ok(Merged::Clean(ours.id()));
    }
    let (rb, ro, rt) = reduce(repo, base, ours, theirs)?;
    let (rb, ro, rt) = (
        read_tree(repo, rb)?,
        read_tree(repo, ro)?,
        read_tree(repo, rt)?,
    );
    let mut index = repo.merge_trees(&rb, &ro, &rt, None)?;
    if index.has_conflicts() {
        return Ok(Merged::Conflicts(index));
    }
    let result = read_tree(repo, index.write_tree_to(repo)?)?;
    match graft(repo, Some(ours), Some(&ro), Some(&result))? {
        Some(id) => Ok(Merged::Clean(id)),
        None => repo.treebuilder(None)?.write().map(Merged::Clean),
    }
}

/// The tree of `commit`'s parent `mainline` (0: its only parent), as `cherrypick_commit`
/// takes it; `None` for a root commit.
pub fn pick_base<'r>(
    commit: &git2::Commit<'r>,
    mainline: u32,
) -> Result<Option<Tree<'r>>, git2::Error> {
    if commit.parent_count() == 0 {
        return Ok(None);
    }
    let parent = commit.parent(mainline.saturating_sub(1) as usize)?;
    parent.tree().map(Some)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;

    /// path → (content, mode)
    type Files = BTreeMap<String, (Vec<u8>, i32)>;

    const LINES: [&str; 6] = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"];

    fn tree_of(repo: &Repository, files: &Files) -> Oid {
        let mut index = git2::Index::new().unwrap();
        for (path, (content, mode)) in files {
            let id = repo.blob(content).unwrap();
            let entry = git2::IndexEntry {
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
            };
            index.add(&entry).unwrap();
        }
        index.write_tree_to(repo).unwrap()
    }

    fn content(rng: &mut ChaCha8Rng) -> Vec<u8> {
        (0..8)
            .map(|_| format!("{}\n", LINES[rng.gen_range(0..LINES.len())]))
            .collect::<String>()
            .into_bytes()
    }

    fn random_path(rng: &mut ChaCha8Rng) -> String {
        let depth = rng.gen_range(0..4);
        let mut parts: Vec<String> = (0..depth)
            .map(|_| format!("d{}", rng.gen_range(0..3)))
            .collect();
        parts.push(format!("f{}", rng.gen_range(0..4)));
        parts.join("/")
    }

    /// Puts `path` in, first removing what would clash with it as file against directory.
    fn put(files: &mut Files, path: String, entry: (Vec<u8>, i32)) {
        files.retain(|p, _| !p.starts_with(&format!("{path}/")));
        let mut dir = path.as_str();
        while let Some((parent, _)) = dir.rsplit_once('/') {
            files.remove(parent);
            dir = parent;
        }
        files.insert(path, entry);
    }

    fn base(rng: &mut ChaCha8Rng) -> Files {
        let mut files = Files::new();
        for _ in 0..rng.gen_range(5..30) {
            put(&mut files, random_path(rng), (content(rng), 0o100644));
        }
        files
    }

    /// A branch's changes: edits of one line, additions, removals, renames, mode and type
    /// changes, a file becoming a directory.
    fn mutate(rng: &mut ChaCha8Rng, files: &Files) -> Files {
        let mut out = files.clone();
        for _ in 0..rng.gen_range(1..5) {
            let paths: Vec<String> = out.keys().cloned().collect();
            let pick =
                |rng: &mut ChaCha8Rng| paths.get(rng.gen_range(0..paths.len().max(1))).cloned();
            match rng.gen_range(0..8) {
                0 | 1 => {
                    if let Some(p) = pick(rng) {
                        let (text, mode) = out[&p].clone();
                        let mut lines: Vec<String> = String::from_utf8(text)
                            .unwrap()
                            .lines()
                            .map(String::from)
                            .collect();
                        let at = rng.gen_range(0..lines.len());
                        lines[at] = format!("changed {}", rng.gen_range(0..3));
                        out.insert(p, (format!("{}\n", lines.join("\n")).into_bytes(), mode));
                    }
                }
                2 => put(&mut out, random_path(rng), (content(rng), 0o100644)),
                3 => {
                    if let Some(p) = pick(rng) {
                        out.remove(&p);
                    }
                }
                4 => {
                    if let Some(p) = pick(rng) {
                        let entry = out.remove(&p).unwrap();
                        put(&mut out, random_path(rng), entry);
                    }
                }
                5 => {
                    if let Some(p) = pick(rng) {
                        out.get_mut(&p).unwrap().1 = 0o100755;
                    }
                }
                6 => {
                    if let Some(p) = pick(rng) {
                        out.insert(p, (b"target".to_vec(), 0o120000));
                    }
                }
                _ => {
                    if let Some(p) = pick(rng) {
                        let entry = out.remove(&p).unwrap();
                        put(&mut out, format!("{p}/inner"), entry);
                    }
                }
            }
        }
        out
    }

    fn conflicts(index: &git2::Index) -> BTreeSet<String> {
        index
            .conflicts()
            .unwrap()
            .flat_map(|c| {
                let c = c.unwrap();
                [c.ancestor, c.our, c.their]
                    .into_iter()
                    .flatten()
                    .map(|e| String::from_utf8(e.path).unwrap())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn the_merge_of_only_what_differs_is_libgit2s_merge_of_the_whole_trees() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(45);
        let (mut clean, mut conflicted) = (0, 0);
        for _ in 0..400 {
            let b = base(&mut rng);
            let (o, t) = (mutate(&mut rng, &b), mutate(&mut rng, &b));
            let trees = [tree_of(&repo, &b), tree_of(&repo, &o), tree_of(&repo, &t)];
            let [b, o, t] = trees.map(|id| repo.find_tree(id).unwrap());
            let mut full = repo.merge_trees(&b, &o, &t, None).unwrap();
            match merge_trees(&repo, &b, &o, &t).unwrap() {
                Merged::Clean(tree) => {
                    assert!(
                        !full.has_conflicts(),
                        "libgit2 found conflicts: {:?}",
                        conflicts(&full)
                    );
                    assert_eq!(tree, full.write_tree_to(&repo).unwrap());
                    clean += 1;
                }
                Merged::Conflicts(index) => {
                    assert!(full.has_conflicts());
                    assert_eq!(conflicts(&index), conflicts(&full));
                    conflicted += 1;
                }
            }
        }
        // Both outcomes were exercised.
        assert!(
            clean > 50 && conflicted > 50,
            "{clean} clean, {conflicted} conflicted"
        );
    }

    #[test]
    fn the_changed_paths_are_libgit2s_diff() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for _ in 0..400 {
            let b = base(&mut rng);
            let o = mutate(&mut rng, &b);
            let (from, to) = (tree_of(&repo, &b), tree_of(&repo, &o));
            let (from, to) = (repo.find_tree(from).unwrap(), repo.find_tree(to).unwrap());
            let mut options = git2::DiffOptions::new();
            options.include_typechange(true);
            let diff = repo
                .diff_tree_to_tree(Some(&from), Some(&to), Some(&mut options))
                .unwrap();
            let side =
                |f: git2::DiffFile<'_>| (!f.id().is_zero()).then(|| (f.id(), i32::from(f.mode())));
            let want: Vec<PathChange> = diff
                .deltas()
                .map(|d| PathChange {
                    path: d
                        .new_file()
                        .path_bytes()
                        .or(d.old_file().path_bytes())
                        .unwrap()
                        .to_vec(),
                    before: side(d.old_file()),
                    after: side(d.new_file()),
                })
                .collect();
            assert_eq!(changed_paths(&repo, &from, &to).unwrap(), want);
        }
    }

    /// `dirs` directories of `per_dir` files each.
    fn wide(dirs: usize, per_dir: usize) -> Files {
        let mut files = Files::new();
        for d in 0..dirs {
            for f in 0..per_dir {
                files.insert(
                    format!("src/m{d}/f{f}.rs"),
                    (format!("{d} {f}\n").into_bytes(), 0o100644),
                );
            }
        }
        files
    }

    #[test]
    fn the_trees_read_follow_the_change_not_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        let mut reads = Vec::new();
        for dirs in [10, 80] {
            let b = wide(dirs, 50);
            let mut o = b.clone();
            o.insert("src/m1/f1.rs".into(), (b"ours\n".to_vec(), 0o100644));
            let mut t = b.clone();
            t.insert("bench/t1.txt".into(), (b"theirs\n".to_vec(), 0o100644));
            t.remove("src/m2/f3.rs");
            let trees = [tree_of(&repo, &b), tree_of(&repo, &o), tree_of(&repo, &t)];
            let [bt, ot, tt] = trees.map(|id| repo.find_tree(id).unwrap());
            let before = subtrees_read();
            let Merged::Clean(merged) = merge_trees(&repo, &bt, &ot, &tt).unwrap() else {
                panic!("a conflict");
            };
            let merge_reads = subtrees_read() - before;
            let mut expected = o.clone();
            expected.insert("bench/t1.txt".into(), (b"theirs\n".to_vec(), 0o100644));
            expected.remove("src/m2/f3.rs");
            assert_eq!(merged, tree_of(&repo, &expected));
            let before = subtrees_read();
            let changed = changed_paths(&repo, &bt, &repo.find_tree(merged).unwrap()).unwrap();
            let diff_reads = subtrees_read() - before;
            assert_eq!(changed.len(), 3);
            reads.push((merge_reads, diff_reads));
        }
        // Eight times the files, the same trees read.
        assert_eq!(reads[0], reads[1], "{reads:?}");
        assert!(reads[0].0 < 40 && reads[0].1 < 10, "{reads:?}");
    }

    #[test]
    fn a_tree_written_over_its_source_checks_only_the_entries_that_changed() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let kept = repo.blob(b"kept").unwrap();
        let changed = repo.blob(b"changed").unwrap();
        // A blob id no object has: libgit2's strict creation refuses an entry naming it.
        let missing = Oid::from_str("0123456789abcdef0123456789abcdef01234567").unwrap();
        let mut builder = repo.treebuilder(None).unwrap();
        builder.insert("a.txt", kept, 0o100644).unwrap();
        builder.insert("b.txt", kept, 0o100644).unwrap();
        let source = repo.find_tree(builder.write().unwrap()).unwrap();
        let was = entries(&source);

        // b.txt changes, c.txt comes, a.txt goes: the same tree as written whole.
        let mut now = was.clone();
        now.remove(b"a.txt".as_slice());
        now.insert(b"b.txt".to_vec(), (changed, 0o100644));
        now.insert(b"c.txt".to_vec(), (kept, 0o100755));
        let over = write_over(&repo, Some(&source), &was, &now).unwrap();
        assert_eq!(over, write(&repo, &now).unwrap());

        // An entry that changed is checked: one naming no object is refused.
        let mut bad = now.clone();
        bad.insert(b"d.txt".to_vec(), (missing, 0o100644));
        assert!(write_over(&repo, Some(&source), &was, &bad).is_err());
        assert!(write(&repo, &bad).is_err());

        // An entry carried over from the source is taken as it is, not read again: a
        // source (written raw) whose a.txt names no object still takes a change to b.txt,
        // where writing every entry checks a.txt and fails.
        let mut raw = b"100644 a.txt\0".to_vec();
        raw.extend_from_slice(missing.as_bytes());
        raw.extend_from_slice(b"100644 b.txt\0");
        raw.extend_from_slice(kept.as_bytes());
        let odd = repo
            .odb()
            .unwrap()
            .write(git2::ObjectType::Tree, &raw)
            .unwrap();
        let odd = repo.find_tree(odd).unwrap();
        let was = entries(&odd);
        let mut now = was.clone();
        now.insert(b"b.txt".to_vec(), (changed, 0o100644));
        let over = write_over(&repo, Some(&odd), &was, &now).unwrap();
        assert_eq!(entries(&repo.find_tree(over).unwrap()), now);
        assert!(write(&repo, &now).is_err());
    }
}
