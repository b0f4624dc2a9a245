//! Merge bases and ancestry on the history landing makes, without libgit2's walk by commit
//! time (ADR-053).
//!
//! libgit2 finds a merge base (and whether one commit descends from another) by walking both
//! histories newest first by commit time, and stops only once a commit older than the rest
//! is seen. Commits of the same second tie, so it reads every commit of that second and of
//! those around it: a run landing 100 tasks a second made each merge base read 100–200
//! commits (2 ms of CPU on 10 files, 10 ms where the whole history shares one second), three
//! times a landed task, on the one landing cycle that everything waits for (M12 item 4).
//!
//! What landing asks is nearly always about straight lines: a branch of one or two commits
//! off a main whose last commits have one parent each. Along such lines the answer is found
//! by walking first parents, a commit at a time, from both ends at once: the first commit
//! one walk reaches that the other has reached is the merge base (why: [`merge_base`]). A
//! merge commit before the meeting point, a root, or more than [`MAX_STEPS`] steps, and
//! libgit2 answers instead, as before: the fast path decides nothing it cannot prove.

use std::collections::HashSet;

use git2::{Oid, Repository};

/// The most commits the two walks read together before libgit2 takes over. A landing's merge
/// base is a few commits back (main's moves since the branch left it); anything farther is
/// rare enough to pay libgit2's walk. A walk that cannot answer costs up to this many reads
/// more than libgit2's alone (a branch that left main before a merge commit on it, until
/// it lands).
pub const MAX_STEPS: usize = 512;

/// The most commits [`descends`] reads along the line before libgit2 decides. What landing
/// asks (a candidate holding main's tip, main holding what flotilla last wrote) is a few
/// commits back, and a false answer (nearly never asked of it) reads the whole bound first.
pub const MAX_DESCENDS_STEPS: usize = 64;

/// One first-parent walk: where it is, and what it has read.
struct Line {
    at: Option<Oid>,
    seen: HashSet<Oid>,
    /// Met a commit with more than one parent: its ancestry is not a line any more.
    branched: bool,
}

impl Line {
    fn new(start: Oid) -> Self {
        Line {
            at: Some(start),
            seen: HashSet::new(),
            branched: false,
        }
    }

    /// Reads the commit it is at and moves to its parent; the commit read, if any.
    fn step(&mut self, repo: &Repository) -> Result<Option<Oid>, git2::Error> {
        let Some(id) = self.at.take() else {
            return Ok(None);
        };
        self.seen.insert(id);
        let commit = repo.find_commit(id)?;
        match commit.parent_count() {
            1 => self.at = Some(commit.parent_id(0)?),
            0 => {}
            _ => self.branched = true,
        }
        Ok(Some(id))
    }
}

/// The merge base of `a` and `b`, as `git2::Repository::merge_base` gives it.
///
/// Two first-parent walks take a step each in turn. Say the first commit on `a`'s line that
/// is also on `b`'s is `x`. Every commit before `x` on either line has one parent, or the
/// walk that read it would have stopped. So each side's ancestors are its line before `x`
/// plus `x`'s ancestors; the two lines before `x` share no commit (one shared would make the
/// lines one from there on, `x` after it); so the common ancestors are exactly `x`'s, and
/// `x` is the only best one. The walks meet first at `x`: whatever else both reach comes
/// after `x` on both lines. A line that reaches a merge commit or a root stops there (the
/// other walk goes on); if they never meet within the step bound, libgit2 answers.
pub fn merge_base(repo: &Repository, a: Oid, b: Oid) -> Result<Oid, git2::Error> {
    match on_lines(repo, a, b)? {
        Some(base) => Ok(base),
        None => repo.merge_base(a, b),
    }
}

/// [`merge_base`] found by the two first-parent walks, or `None` when they cannot prove it.
fn on_lines(repo: &Repository, a: Oid, b: Oid) -> Result<Option<Oid>, git2::Error> {
    if a == b {
        return Ok(Some(a));
    }
    let (mut left, mut right) = (Line::new(a), Line::new(b));
    for _ in 0..MAX_STEPS / 2 {
        if let Some(id) = left.step(repo)?
            && right.seen.contains(&id)
        {
            return Ok(Some(id));
        }
        if let Some(id) = right.step(repo)?
            && left.seen.contains(&id)
        {
            return Ok(Some(id));
        }
        // A line stops at its root or at a merge commit (whose parents it does not follow);
        // the other may still reach a commit it read, which is then the meeting point.
        if left.at.is_none() && right.at.is_none() {
            break;
        }
    }
    Ok(None)
}

/// Whether `tip` descends from `ancestor` (or is it), as `graph_descendant_of` says, `tip`
/// included: `ancestor` on `tip`'s first-parent line is proof. Not found there within
/// [`MAX_DESCENDS_STEPS`]: libgit2 decides, unless the line ran to its root through commits
/// of one parent (then the line is all of `tip`'s history, and `ancestor` is not in it).
pub fn descends(repo: &Repository, tip: Oid, ancestor: Oid) -> Result<bool, git2::Error> {
    match on_line(repo, tip, ancestor)? {
        Some(answer) => Ok(answer),
        None => Ok(tip == ancestor || repo.graph_descendant_of(tip, ancestor)?),
    }
}

/// [`descends`] read off `tip`'s first-parent line, or `None` when the line cannot tell.
fn on_line(repo: &Repository, tip: Oid, ancestor: Oid) -> Result<Option<bool>, git2::Error> {
    let mut line = Line::new(tip);
    for _ in 0..MAX_DESCENDS_STEPS {
        match line.step(repo)? {
            Some(id) if id == ancestor => return Ok(Some(true)),
            Some(_) if line.branched => break,
            Some(_) => {}
            None => return Ok(Some(false)),
        }
    }
    Ok(None)
}

/// The first `limit` commits of `tip`'s first-parent line that `base` does not reach, newest
/// first: what a revwalk from `tip` hiding `base` with `simplify_first_parent` gives. Read off the line
/// when `base` is on it (a branch replayed onto main: `base` is where it left): each commit
/// before `base` descends from it, so none is reachable from it. libgit2's walk otherwise
/// (its hide reads commits by time, the same ties as [`merge_base`]).
pub fn first_parent_since(
    repo: &Repository,
    tip: Oid,
    base: Oid,
    limit: usize,
) -> Result<Vec<Oid>, git2::Error> {
    if let Some(mut since) = line_to(repo, tip, base)? {
        since.truncate(limit);
        return Ok(since);
    }
    let mut walk = repo.revwalk()?;
    walk.set_sorting(git2::Sort::TOPOLOGICAL)?;
    walk.push(tip)?;
    walk.hide(base)?;
    walk.simplify_first_parent()?;
    walk.take(limit).collect()
}

/// `tip`'s first-parent line down to `base` (left out), or `None` when `base` is not on it
/// within [`MAX_STEPS`] commits.
fn line_to(repo: &Repository, tip: Oid, base: Oid) -> Result<Option<Vec<Oid>>, git2::Error> {
    let mut line = Line::new(tip);
    let mut since = Vec::new();
    for _ in 0..MAX_STEPS {
        let at = line.at;
        match at {
            Some(id) if id == base => return Ok(Some(since)),
            Some(id) => {
                since.push(id);
                // A merge commit's first parent: the line goes on through it.
                let commit = repo.find_commit(id)?;
                line.at = commit.parent_ids().next();
            }
            None => break,
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A repository whose commits all carry one time (what a fast run makes), and a helper
    /// to commit onto given parents.
    struct Repo {
        _dir: tempfile::TempDir,
        repo: Repository,
        n: u32,
    }

    impl Repo {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let repo = Repository::init(dir.path()).unwrap();
            Repo {
                _dir: dir,
                repo,
                n: 0,
            }
        }

        fn commit(&mut self, parents: &[Oid]) -> Oid {
            self.n += 1;
            let sig = git2::Signature::new("t", "t@localhost", &git2::Time::new(1_700_000_000, 0))
                .unwrap();
            let blob = self.repo.blob(self.n.to_string().as_bytes()).unwrap();
            let mut tree = self.repo.treebuilder(None).unwrap();
            tree.insert("f", blob, 0o100644).unwrap();
            let tree = self.repo.find_tree(tree.write().unwrap()).unwrap();
            let parents: Vec<_> = parents
                .iter()
                .map(|p| self.repo.find_commit(*p).unwrap())
                .collect();
            let parents: Vec<_> = parents.iter().collect();
            self.repo
                .commit(None, &sig, &sig, &self.n.to_string(), &tree, &parents)
                .unwrap()
        }

        fn line(&mut self, from: Option<Oid>, n: usize) -> Vec<Oid> {
            let mut out = Vec::new();
            let mut at = from;
            for _ in 0..n {
                let id = self.commit(at.as_slice());
                out.push(id);
                at = Some(id);
            }
            out
        }

        /// Both functions against libgit2's own answers. Where two commits have several best
        /// merge bases (criss-cross merges), libgit2 names one, which one depending on the
        /// order it is asked in; the walks never answer then.
        fn agree(&self, a: Oid, b: Oid) -> bool {
            let all = self
                .repo
                .merge_bases(a, b)
                .map(|bases| bases.iter().copied().collect::<Vec<_>>())
                .unwrap_or_default();
            for (x, y) in [(a, b), (b, a)] {
                let ours = merge_base(&self.repo, x, y).ok();
                assert_eq!(
                    ours,
                    self.repo.merge_base(x, y).ok(),
                    "merge base of {x} and {y}"
                );
                if let Some(found) = on_lines(&self.repo, x, y).unwrap() {
                    assert_eq!(all, vec![found], "the walks claim the only best merge base");
                }
            }
            for (x, y) in [(a, b), (b, a)] {
                let ours = descends(&self.repo, x, y).unwrap();
                let theirs = x == y || self.repo.graph_descendant_of(x, y).unwrap();
                assert_eq!(ours, theirs, "does {x} descend from {y}");
            }
            on_lines(&self.repo, a, b).unwrap().is_some()
        }
    }

    #[test]
    fn a_branch_off_a_straight_main_meets_it_where_it_left() {
        let mut r = Repo::new();
        let main = r.line(None, 40);
        let branch = r.line(Some(main[30]), 2);
        assert_eq!(merge_base(&r.repo, main[39], branch[1]).unwrap(), main[30]);
        r.agree(main[39], branch[1]);
        r.agree(main[30], branch[1]);
        r.agree(main[39], main[10]);
        r.agree(main[0], main[39]);
        assert!(descends(&r.repo, main[39], main[0]).unwrap());
        assert!(!descends(&r.repo, main[0], main[39]).unwrap());
        assert!(!descends(&r.repo, branch[1], main[31]).unwrap());
        // Found by the walks, not handed to libgit2.
        assert_eq!(
            on_lines(&r.repo, main[39], branch[1]).unwrap(),
            Some(main[30])
        );
        assert_eq!(on_line(&r.repo, main[39], main[30]).unwrap(), Some(true));
        assert_eq!(on_line(&r.repo, main[30], main[39]).unwrap(), Some(false));
    }

    #[test]
    fn merges_and_unrelated_histories_get_libgit2s_answer() {
        let mut r = Repo::new();
        let main = r.line(None, 20);
        let branch = r.line(Some(main[5]), 3);
        // The branch took main in since: its merge base with main is main[15] now, which a
        // walk of first parents alone would miss.
        let merged = r.commit(&[branch[2], main[15]]);
        let after = r.line(Some(merged), 2);
        assert_eq!(merge_base(&r.repo, main[19], after[1]).unwrap(), main[15]);
        assert_eq!(on_lines(&r.repo, main[19], after[1]).unwrap(), None);
        r.agree(main[19], after[1]);
        r.agree(main[19], merged);
        // main merged a branch: its second parent's commits are main's ancestors too.
        let side = r.line(Some(main[3]), 2);
        let main_merge = r.commit(&[main[19], side[1]]);
        assert_eq!(on_line(&r.repo, main_merge, side[1]).unwrap(), None);
        r.agree(main_merge, side[1]);
        r.agree(main_merge, side[0]);
        let on_side = r.line(Some(side[0]), 1);
        r.agree(main_merge, on_side[0]);
        // Unrelated histories: no merge base, an error as from libgit2.
        let other = r.line(None, 3);
        assert!(merge_base(&r.repo, main[19], other[2]).is_err());
        r.agree(main[19], other[2]);
    }

    /// [`first_parent_since`] against the revwalk it stands for.
    fn walked(repo: &Repository, tip: Oid, base: Oid) -> Vec<Oid> {
        let mut walk = repo.revwalk().unwrap();
        walk.set_sorting(git2::Sort::TOPOLOGICAL).unwrap();
        walk.push(tip).unwrap();
        walk.hide(base).unwrap();
        walk.simplify_first_parent().unwrap();
        walk.collect::<Result<_, _>>().unwrap()
    }

    #[test]
    fn a_branchs_line_since_its_base_is_the_revwalks() {
        let mut r = Repo::new();
        let main = r.line(None, 30);
        let branch = r.line(Some(main[20]), 3);
        let merged = r.commit(&[branch[2], main[25]]);
        let after = r.line(Some(merged), 1);
        for (tip, base) in [
            (branch[2], main[20]),
            (after[0], main[20]),
            (after[0], main[25]),
            (main[29], main[29]),
            (main[29], branch[1]),
            (branch[0], main[29]),
        ] {
            assert_eq!(
                first_parent_since(&r.repo, tip, base, usize::MAX).unwrap(),
                walked(&r.repo, tip, base),
                "{tip} since {base}"
            );
        }
        assert_eq!(
            first_parent_since(&r.repo, after[0], main[20], usize::MAX).unwrap(),
            vec![after[0], merged, branch[2], branch[1], branch[0]]
        );
        assert_eq!(
            first_parent_since(&r.repo, after[0], main[20], 2).unwrap(),
            vec![after[0], merged]
        );
        // Read off the line where `base` is on it; the revwalk where it is not.
        assert!(line_to(&r.repo, after[0], main[20]).unwrap().is_some());
        assert!(line_to(&r.repo, after[0], main[25]).unwrap().is_none());
        assert_eq!(
            first_parent_since(&r.repo, after[0], branch[1], 2).unwrap(),
            walked(&r.repo, after[0], branch[1])[..2]
        );
    }

    #[test]
    fn past_the_step_bound_libgit2_answers() {
        let mut r = Repo::new();
        let main = r.line(None, MAX_STEPS + 20);
        let branch = r.line(Some(main[2]), 1);
        let tip = *main.last().unwrap();
        assert_eq!(merge_base(&r.repo, tip, branch[0]).unwrap(), main[2]);
        assert!(descends(&r.repo, tip, main[0]).unwrap());
        r.agree(tip, branch[0]);
        assert_eq!(
            first_parent_since(&r.repo, tip, main[1], usize::MAX).unwrap(),
            walked(&r.repo, tip, main[1])
        );
    }

    #[test]
    fn random_histories_get_libgit2s_answers() {
        use rand::{Rng, SeedableRng};
        let (mut decided, mut asked, mut lined, mut lines) = (0, 0, 0, 0);
        for seed in 0..3u64 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let mut r = Repo::new();
            let mut ids: Vec<Oid> = Vec::new();
            for i in 0..40usize {
                // Mostly a parent or two among the last few, sometimes a new root.
                let parents: Vec<Oid> = if i == 0 || rng.gen_ratio(1, 20) {
                    Vec::new()
                } else {
                    let n = if rng.gen_ratio(1, 5) { 2 } else { 1 };
                    (0..n)
                        .map(|_| ids[rng.gen_range(i.saturating_sub(6)..i)])
                        .collect::<HashSet<_>>()
                        .into_iter()
                        .collect()
                };
                ids.push(r.commit(&parents));
            }
            for &a in &ids {
                for &b in ids.iter().step_by(4) {
                    decided += usize::from(r.agree(a, b));
                    asked += 1;
                    // The rebase asks for the line since a merge base.
                    if let Ok(base) = r.repo.merge_base(a, b) {
                        assert_eq!(
                            first_parent_since(&r.repo, a, base, usize::MAX).unwrap(),
                            walked(&r.repo, a, base),
                            "{a} since {base}"
                        );
                        lined += usize::from(line_to(&r.repo, a, base).unwrap().is_some());
                        lines += 1;
                    }
                }
            }
        }
        // Both ways of answering were tried.
        assert!(
            decided > asked / 10 && decided < asked,
            "{decided} of {asked}"
        );
        assert!(lined > lines / 10 && lined < lines, "{lined} of {lines}");
    }
}
