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
use std::collections::{BTreeMap, HashSet};

use git2::{Oid, Repository, Tree};

const TREE: i32 = 0o040000;

thread_local! {
    static SUBTREES_READ: Cell<u64> = const { Cell::new(0) };
    static ONE_SIDED: Cell<u64> = const { Cell::new(0) };
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

/// git's order of a tree's entries: by name, a directory's as if it ended in `/`.
fn git_order(a: &[u8], a_dir: bool, b: &[u8], b_dir: bool) -> std::cmp::Ordering {
    let n = a.len().min(b.len());
    let end = |name: &[u8], dir: bool| name.get(n).copied().unwrap_or(if dir { b'/' } else { 0 });
    a[..n]
        .cmp(&b[..n])
        .then(end(a, a_dir).cmp(&end(b, b_dir)))
        .then(a.len().cmp(&b.len()))
}

/// Two tree entries in git's order.
fn entry_order(a: &git2::TreeEntry<'_>, b: &git2::TreeEntry<'_>) -> std::cmp::Ordering {
    git_order(
        a.name_bytes(),
        a.filemode() == TREE,
        b.name_bytes(),
        b.filemode() == TREE,
    )
}

/// Every entry of `tree` strictly after the one before it in git's order (as git writes
/// trees; one written by other means need not be).
fn in_git_order(tree: &Tree<'_>) -> bool {
    let mut previous: Option<git2::TreeEntry<'_>> = None;
    for entry in tree.iter() {
        if let Some(previous) = &previous
            && entry_order(previous, &entry) != std::cmp::Ordering::Less
        {
            return false;
        }
        previous = Some(entry);
    }
    true
}

/// No name twice in `tree` (a file and a directory of one name are in git's order, but
/// libgit2's search finds one and its builder keeps the other). Names are compared by a
/// hash: a collision only sends the tree the slower, always right way.
fn names_once(tree: &Tree<'_>) -> bool {
    use std::hash::BuildHasher;
    let hasher = std::collections::hash_map::RandomState::new();
    let mut seen = std::collections::HashSet::with_capacity(tree.len());
    tree.iter()
        .all(|entry| seen.insert(hasher.hash_one(entry.name_bytes())))
}

fn walk(
    repo: &Repository,
    from: &Tree<'_>,
    to: &Tree<'_>,
    prefix: &[u8],
    out: &mut Vec<PathChange>,
) -> Result<(), git2::Error> {
    // Both in git's order: one pass over both trees' entries, side by side, copying none
    // (a directory of N files changed by one costs N comparisons, not 2N copies and a
    // sort: ADR-051). A name that is a file on one side and a directory on the other sits
    // at two places in that order and comes as two changes, which say what one would.
    if in_git_order(from) && in_git_order(to) {
        let (mut old, mut new) = (from.iter().peekable(), to.iter().peekable());
        loop {
            let order = match (old.peek(), new.peek()) {
                (None, None) => break,
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some(b), Some(a)) => entry_order(b, a),
            };
            let (b, a) = match order {
                std::cmp::Ordering::Less => (old.next(), None),
                std::cmp::Ordering::Greater => (None, new.next()),
                std::cmp::Ordering::Equal => (old.next(), new.next()),
            };
            let entry =
                |e: &Option<git2::TreeEntry<'_>>| e.as_ref().map(|e| (e.id(), e.filemode()));
            let (before, after) = (entry(&b), entry(&a));
            if before != after
                && let Some(named) = b.as_ref().or(a.as_ref())
            {
                differ(repo, prefix, named.name_bytes(), before, after, out)?;
            }
        }
        return Ok(());
    }
    // A tree out of git's order (an agent's): by name, whatever the order.
    let (old, new) = (entries(from), entries(to));
    let mut names: Vec<&Vec<u8>> = old.keys().chain(new.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        let (before, after) = (old.get(name).copied(), new.get(name).copied());
        if before != after {
            differ(repo, prefix, name, before, after, out)?;
        }
    }
    Ok(())
}

/// The files under `prefix` + `name`, whose entry is `before` in one tree and `after` in
/// the other (not the same).
fn differ(
    repo: &Repository,
    prefix: &[u8],
    name: &[u8],
    before: Option<Entry>,
    after: Option<Entry>,
    out: &mut Vec<PathChange>,
) -> Result<(), git2::Error> {
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
    let source = Source::of(base);
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
    let mut changes: BTreeMap<Vec<u8>, Option<Entry>> = BTreeMap::new();
    for (name, sub) in &nested {
        // A file written at the directory's own name wins (a disk holds one or the other).
        if matches!(direct.get(name), Some(Some(_))) {
            continue;
        }
        let sub_base = source
            .get(name)
            .filter(is_tree)
            .map(|e| read_tree(repo, e.0))
            .transpose()?;
        let sub = with_updates(repo, sub_base.as_ref(), sub)?;
        changes.insert(name.to_vec(), sub.map(|id| (id, TREE)));
    }
    for (name, entry) in direct {
        match entry {
            Some(entry) => {
                changes.insert(name.to_vec(), Some(entry));
            }
            // A removed file whose name is now a directory's keeps the directory.
            None if nested.contains_key(name) => {}
            None => {
                changes.insert(name.to_vec(), None);
            }
        }
    }
    apply(repo, &source, &changes)
}

/// A tree whose entries are looked up by name: through libgit2's search when the tree is
/// in git's order (as git writes trees), else through a map of all its entries (a tree an
/// agent wrote out of order or with a name twice, where that search can miss an entry).
struct Source<'t, 'r> {
    tree: Option<&'t Tree<'r>>,
    listed: Option<BTreeMap<Vec<u8>, Entry>>,
}

impl<'t, 'r> Source<'t, 'r> {
    fn of(tree: Option<&'t Tree<'r>>) -> Self {
        let listed = tree
            .filter(|t| !in_git_order(t) || !names_once(t))
            .map(entries);
        Source { tree, listed }
    }

    fn get(&self, name: &[u8]) -> Option<Entry> {
        match &self.listed {
            Some(listed) => listed.get(name).copied(),
            None => self
                .tree?
                .get_name_bytes(name)
                .map(|e| (e.id(), e.filemode())),
        }
    }
}

/// The source tree with `changes` (a name's new entry, or its removal) applied: the
/// source's own id when none changes anything, `None` when nothing is left. Only the
/// changed names are looked up and inserted or removed: libgit2 checks each inserted
/// entry's object exists (a read of its header: for a loose object, an open and an
/// inflate) but takes the source's entries as they are, so a directory of N files that
/// one task changed costs one check and no copy of its entries here, not N (ADR-051).
fn apply(
    repo: &Repository,
    source: &Source<'_, '_>,
    changes: &BTreeMap<Vec<u8>, Option<Entry>>,
) -> Result<Option<Oid>, git2::Error> {
    let mut changed = changes
        .iter()
        .filter(|(name, change)| source.get(name) != **change)
        .peekable();
    if changed.peek().is_none() {
        return Ok(source.tree.map(Tree::id));
    }
    if let Some(listed) = &source.listed {
        // A tree out of git's order, or with a name twice (an agent's): written whole,
        // every entry inserted and so checked, as before ADR-051 (libgit2's builder, started
        // from it, would carry a duplicate and leak the entry it replaces).
        let mut merged = listed.clone();
        for (name, change) in changed {
            match change {
                Some(entry) => merged.insert(name.clone(), *entry),
                None => merged.remove(name),
            };
        }
        if merged.is_empty() {
            return Ok(None);
        }
        return write(repo, &merged).map(Some);
    }
    let mut builder = repo.treebuilder(source.tree)?;
    for (name, change) in changed {
        match change {
            Some((id, mode)) => {
                builder.insert(name.as_slice(), *id, *mode)?;
            }
            None => builder.remove(name.as_slice())?,
        }
    }
    if builder.is_empty() {
        return Ok(None);
    }
    builder.write().map(Some)
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
    let source = Source::of(ours);
    let was = reduced_ours.map(entries).unwrap_or_default();
    let now = result.map(entries).unwrap_or_default();
    let mut changes: BTreeMap<Vec<u8>, Option<Entry>> = BTreeMap::new();
    let mut names: Vec<&Vec<u8>> = was.keys().chain(now.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        let (w, n) = (was.get(name), now.get(name));
        if w == n {
            continue;
        }
        let ours_dir = source.get(name).filter(is_tree);
        match (w, n) {
            (Some(w), n) if is_tree(w) && ours_dir.is_some() && n.is_none_or(is_tree) => {
                let sub_full = ours_dir.map(|e| read_tree(repo, e.0)).transpose()?;
                let sub_was = read_tree(repo, w.0)?;
                let sub_now = n.map(|e| read_tree(repo, e.0)).transpose()?;
                let sub = graft(repo, sub_full.as_ref(), Some(&sub_was), sub_now.as_ref())?;
                changes.insert(name.clone(), sub.map(|id| (id, TREE)));
            }
            (_, n) => {
                changes.insert(name.clone(), n.copied());
            }
        }
    }
    apply(repo, &source, &changes)
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
    if let Some(merged) = one_sided(repo, base, ours, theirs)? {
        return Ok(merged);
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

/// The merge when no path one side changed is a path the other changed, or a directory
/// above or below one: theirs' changes written onto ours (`None` otherwise). git's merge
/// gives the same, renames included: a rename pairs a removal and an addition of one side,
/// and only a change of the other side at one of those paths can meet it. The landing's
/// usual case (a branch adding or changing its own files): one tree written per changed
/// directory, where the merge wrote three reduced trees, its result and the graft (ADR-053).
fn one_sided(
    repo: &Repository,
    base: &Tree<'_>,
    ours: &Tree<'_>,
    theirs: &Tree<'_>,
) -> Result<Option<Merged>, git2::Error> {
    let mine = changed_paths(repo, base, ours)?;
    let (mut paths, mut dirs) = (HashSet::new(), HashSet::new());
    for change in &mine {
        paths.insert(change.path.as_slice());
        dirs.extend(parents(&change.path));
    }
    let brought = changed_paths(repo, base, theirs)?;
    let meets = |path: &[u8]| {
        paths.contains(path) || dirs.contains(path) || parents(path).any(|d| paths.contains(d))
    };
    if brought.iter().any(|change| meets(&change.path)) {
        return Ok(None);
    }
    ONE_SIDED.with(|n| n.set(n.get().saturating_add(1)));
    let updates: Vec<Update> = brought.into_iter().map(|c| (c.path, c.after)).collect();
    let tree = match with_updates(repo, Some(ours), &updates)? {
        Some(id) => id,
        None => repo.treebuilder(None)?.write()?,
    };
    Ok(Some(Merged::Clean(tree)))
}

/// The directories above `path` (`a/b/c`: `a`, `a/b`).
fn parents(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    path.iter()
        .enumerate()
        .filter(|(_, b)| **b == b'/')
        .map(move |(i, _)| &path[..i])
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

/// A tree written as given, in any order and with any modes, as no git writes one but an
/// agent can (`hash-object --literally`): `(mode, name, id)` each.
#[cfg(test)]
pub(crate) fn raw_tree(repo: &Repository, entries: &[(&str, &[u8], Oid)]) -> Oid {
    let mut raw = Vec::new();
    for (mode, name, id) in entries {
        raw.extend_from_slice(mode.as_bytes());
        raw.push(b' ');
        raw.extend_from_slice(name);
        raw.push(0);
        raw.extend_from_slice(id.as_bytes());
    }
    repo.odb()
        .and_then(|odb| odb.write(git2::ObjectType::Tree, &raw))
        .expect("a raw tree is written")
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
        let one_sided_before = ONE_SIDED.with(Cell::get);
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
        // Both outcomes were exercised, and both ways to a clean merge.
        let one_sided = ONE_SIDED.with(Cell::get) - one_sided_before;
        assert!(
            clean > 50 && conflicted > 50 && one_sided > 20 && one_sided + 20 < clean,
            "{clean} clean ({one_sided} one-sided), {conflicted} conflicted"
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
            assert_eq!(
                changed_paths(&repo, &from, &to).unwrap(),
                libgit2_changes(&repo, &from, &to)
            );
        }
    }

    /// What libgit2's diff of the two trees lists, as [`changed_paths`] says it.
    fn libgit2_changes(repo: &Repository, from: &Tree<'_>, to: &Tree<'_>) -> Vec<PathChange> {
        let mut options = git2::DiffOptions::new();
        options.include_typechange(true);
        let diff = repo
            .diff_tree_to_tree(Some(from), Some(to), Some(&mut options))
            .unwrap();
        let side =
            |f: git2::DiffFile<'_>| (!f.id().is_zero()).then(|| (f.id(), i32::from(f.mode())));
        diff.deltas()
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
            .collect()
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
        let raw_tree = |entries: &[(&[u8], Oid)]| {
            let entries: Vec<_> = entries.iter().map(|(n, id)| ("100644", *n, *id)).collect();
            repo.find_tree(raw_tree(&repo, &entries)).unwrap()
        };
        let change = |list: &[(&[u8], Option<Entry>)]| -> BTreeMap<Vec<u8>, Option<Entry>> {
            list.iter().map(|(n, e)| (n.to_vec(), *e)).collect()
        };
        let source = raw_tree(&[(b"a.txt", kept), (b"b.txt", kept)]);

        // b.txt changes, c.txt comes, a.txt goes: the same tree as written whole.
        let changes = change(&[
            (b"a.txt", None),
            (b"b.txt", Some((changed, 0o100644))),
            (b"c.txt", Some((kept, 0o100755))),
        ]);
        let over = apply(&repo, &Source::of(Some(&source)), &changes).unwrap();
        let mut now = entries(&source);
        now.remove(b"a.txt".as_slice());
        now.insert(b"b.txt".to_vec(), (changed, 0o100644));
        now.insert(b"c.txt".to_vec(), (kept, 0o100755));
        assert_eq!(over, Some(write(&repo, &now).unwrap()));
        // Nothing that changes anything: the source itself; everything gone: nothing.
        let same = change(&[(b"a.txt", Some((kept, 0o100644))), (b"z.txt", None)]);
        let gone = change(&[(b"a.txt", None), (b"b.txt", None)]);
        let source_of = || Source::of(Some(&source));
        assert_eq!(
            apply(&repo, &source_of(), &same).unwrap(),
            Some(source.id())
        );
        assert_eq!(apply(&repo, &source_of(), &gone).unwrap(), None);

        // An entry that changed is checked: one naming no object is refused.
        let bad = change(&[(b"d.txt", Some((missing, 0o100644)))]);
        assert!(apply(&repo, &source_of(), &bad).is_err());

        // An entry carried over from the source is taken as it is, not read again: a
        // source (written raw) whose a.txt names no object still takes a change to b.txt,
        // where writing every entry checks a.txt and fails.
        let odd = raw_tree(&[(b"a.txt", missing), (b"b.txt", kept)]);
        let changes = change(&[(b"b.txt", Some((changed, 0o100644)))]);
        let over = apply(&repo, &Source::of(Some(&odd)), &changes)
            .unwrap()
            .unwrap();
        let mut now = entries(&odd);
        now.insert(b"b.txt".to_vec(), (changed, 0o100644));
        assert_eq!(entries(&repo.find_tree(over).unwrap()), now);
        assert!(write(&repo, &now).is_err());

        // A source out of git's order (a.txt last): its entries are still found by name,
        // so a.txt's removal is not lost (libgit2's search alone misses it).
        let unordered = raw_tree(&[
            (b"b.txt", kept),
            (b"c.txt", kept),
            (b"d.txt", kept),
            (b"a.txt", kept),
        ]);
        assert!(!in_git_order(&unordered));
        assert!(unordered.get_name_bytes(b"a.txt").is_none());
        let drop_a = change(&[(b"a.txt", None)]);
        let over = apply(&repo, &Source::of(Some(&unordered)), &drop_a)
            .unwrap()
            .unwrap();
        let left = entries(&repo.find_tree(over).unwrap());
        let names: Vec<&[u8]> = left.keys().map(Vec::as_slice).collect();
        assert_eq!(names, [b"b.txt".as_slice(), b"c.txt", b"d.txt"]);
        // A file and a directory of one name (in git's order, but named twice): the
        // directory's files are found by name, not lost to libgit2's search finding the
        // file.
        let inner = raw_tree(&[(b"old.txt", kept)]);
        let twice = super::raw_tree(
            &repo,
            &[
                ("100644", b"0", kept),
                ("100644", b"1", kept),
                ("100644", b"a", kept),
                ("40000", b"a", inner.id()),
                ("100644", b"b", kept),
            ],
        );
        let twice = repo.find_tree(twice).unwrap();
        assert!(in_git_order(&twice) && !names_once(&twice));
        // libgit2's search finds the file.
        assert_eq!(twice.get_name("a").unwrap().filemode(), 0o100644);
        let added = with_updates(
            &repo,
            Some(&twice),
            &[(b"a/new.txt".to_vec(), Some((changed, 0o100644)))],
        )
        .unwrap()
        .unwrap();
        let a = repo.find_tree(added).unwrap().get_name("a").unwrap().id();
        let a = entries(&repo.find_tree(a).unwrap());
        let names: Vec<&[u8]> = a.keys().map(Vec::as_slice).collect();
        assert_eq!(names, [b"new.txt".as_slice(), b"old.txt"]);

        // And such a tree is written whole, every entry checked: one naming no object is
        // refused, as before.
        let unordered = raw_tree(&[(b"b.txt", missing), (b"a.txt", kept)]);
        assert!(apply(&repo, &Source::of(Some(&unordered)), &drop_a).is_err());
    }

    #[test]
    fn the_walk_in_gits_order_matches_libgit2_where_names_sort_apart_by_type() {
        // `a` as a directory sorts as `a/`: after `a-b` and `a.txt`, before `a0`; as a file,
        // before all three. Each side in turn: a file, a directory, gone.
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        let others = ["a-b", "a.txt", "a0", "b"];
        let shapes: [&[&str]; 3] = [&["a"], &["a/x", "a/y"], &[]];
        for from_shape in shapes {
            for to_shape in shapes {
                let files = |shape: &[&str], content: &[u8]| {
                    let mut files = Files::new();
                    for name in others {
                        files.insert(name.to_string(), (content.to_vec(), 0o100644));
                    }
                    for path in shape {
                        files.insert(path.to_string(), (b"in a\n".to_vec(), 0o100644));
                    }
                    files
                };
                let from = repo
                    .find_tree(tree_of(&repo, &files(from_shape, b"one\n")))
                    .unwrap();
                let to = repo
                    .find_tree(tree_of(&repo, &files(to_shape, b"two\n")))
                    .unwrap();
                assert!(in_git_order(&from) && in_git_order(&to));
                assert_eq!(
                    changed_paths(&repo, &from, &to).unwrap(),
                    libgit2_changes(&repo, &from, &to),
                    "{from_shape:?} -> {to_shape:?}"
                );
            }
        }
    }

    #[test]
    fn a_tree_out_of_gits_order_is_walked_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        let (one, two) = (repo.blob(b"1").unwrap(), repo.blob(b"2").unwrap());
        // Written raw: b.txt before a.txt, as no git writes a tree.
        let raw = |first: Oid, second: Oid| {
            let entries = [
                ("100644", b"b.txt".as_slice(), first),
                ("100644", b"a.txt", second),
            ];
            repo.find_tree(raw_tree(&repo, &entries)).unwrap()
        };
        let (from, to) = (raw(one, one), raw(one, two));
        assert!(!in_git_order(&to));
        let mut builder = repo.treebuilder(None).unwrap();
        builder.insert("a.txt", one, 0o100644).unwrap();
        builder.insert("b.txt", one, 0o100644).unwrap();
        let ordered = repo.find_tree(builder.write().unwrap()).unwrap();
        for from in [&from, &ordered] {
            assert_eq!(
                changed_paths(&repo, from, &to).unwrap(),
                vec![PathChange {
                    path: b"a.txt".to_vec(),
                    before: Some((one, 0o100644)),
                    after: Some((two, 0o100644)),
                }]
            );
        }
    }

    #[test]
    fn what_a_branch_brings_into_a_directory_all_three_share_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        let (one, two) = (repo.blob(b"1").unwrap(), repo.blob(b"2").unwrap());
        let missing = Oid::from_str("0123456789abcdef0123456789abcdef01234567").unwrap();
        let raw = |entries: &[(&[u8], Oid)]| {
            let entries: Vec<_> = entries.iter().map(|(n, id)| ("100644", *n, *id)).collect();
            raw_tree(&repo, &entries)
        };
        let root = |d: Oid| {
            let mut builder = repo.treebuilder(None).unwrap();
            builder.insert("d", d, 0o040000).unwrap();
            builder.insert("top.txt", one, 0o100644).unwrap();
            repo.find_tree(builder.write().unwrap()).unwrap()
        };
        let base = root(raw(&[(b"a.txt", one), (b"b.txt", one)]));
        let ours = root(raw(&[(b"a.txt", two), (b"b.txt", one)]));
        // What no git would write, brought by the branch beside files main also changed.
        for (name, id) in [(b"x.txt".as_slice(), missing), (b".git".as_slice(), one)] {
            let mut entries = vec![(b"a.txt".as_slice(), one), (b"b.txt".as_slice(), one)];
            entries.push((name, id));
            entries.sort();
            let theirs = root(raw(&entries));
            assert!(
                merge_trees(&repo, &base, &ours, &theirs).is_err(),
                "{}",
                String::from_utf8_lossy(name)
            );
        }
    }
}
