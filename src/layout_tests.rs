//! The crate's layout, checked from its source (issue 21 item 1): which top-level module of
//! `src/` uses which, read from the `crate::NAME` (and `super::…` up to the crate root)
//! paths in each file, comments and tests left out. Like the actors crate's check that
//! keeps actix out of the protocol, these fail when a dependency that the layout forbids
//! comes (back).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level module → the top-level modules its code names.
type Uses = BTreeMap<String, BTreeSet<String>>;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, recursively.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The file's module path under the crate root: `cli/render/mod.rs` → `[cli, render]`.
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
}

/// The code of a file without its comments and its tests (a sibling `_tests.rs` file is
/// left out by the caller; an inline `#[cfg(test)] mod …` runs to the end of the file).
fn code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            break;
        }
        let line = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn ident(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The top-level modules that `code`, in the module at `path`, names.
fn named(code: &str, path: &[String], top: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut note = |name: &str| {
        if top.contains(name) {
            found.insert(name.to_string());
        }
    };
    for (at, _) in code.match_indices("crate::") {
        // Not `flotilla_crate::` or the like: `crate` must start a path.
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a::x, b};`
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            for item in inner.split(',') {
                note(ident(item.trim()));
            }
        } else {
            note(ident(rest));
        }
    }
    for (at, _) in code.match_indices("super::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let mut rest = &code[at..];
        let mut up = 0;
        while let Some(next) = rest.strip_prefix("super::") {
            up += 1;
            rest = next;
        }
        if up == path.len() {
            note(ident(rest));
        }
    }
    found
}

/// Which top-level module uses which, over all of `src/` but `main.rs` (the binary, which
/// uses the library as `flotilla::`) and `lib.rs`.
fn uses() -> Uses {
    let root = src();
    let mut all = Vec::new();
    files(&root, &mut all);
    let top: BTreeSet<String> = all
        .iter()
        .filter_map(|p| module_path(p.strip_prefix(&root).ok()?).into_iter().next())
        .filter(|m| m != "lib" && m != "main")
        .collect();
    let mut uses = Uses::new();
    for path in &all {
        let relative = path.strip_prefix(&root).unwrap();
        let module = module_path(relative);
        let Some(first) = module.first().cloned() else {
            continue;
        };
        if !top.contains(&first) || path.to_string_lossy().ends_with("_tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(path).unwrap();
        let entry = uses.entry(first.clone()).or_default();
        for name in named(&code(&text), &module, &top) {
            if name != first {
                entry.insert(name);
            }
        }
    }
    uses
}

/// The cycles among the modules: for each strongly connected group of more than one
/// module, one cycle through it, as `a → b → a`, and the whole group when it is larger.
fn cycles(uses: &Uses) -> Vec<String> {
    // Tarjan's algorithm, recursive (a few dozen modules).
    struct Walk<'a> {
        uses: &'a Uses,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        groups: Vec<Vec<&'a str>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.uses.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    group.push(w);
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    self.groups.push(group);
                }
            }
        }
    }
    let mut walk = Walk {
        uses,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        groups: Vec::new(),
    };
    for v in uses.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.groups
        .iter()
        .map(|group| {
            // A shortest way back to the group's first module, inside the group.
            let start = group[0];
            let inside: BTreeSet<&str> = group.iter().copied().collect();
            let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([start]);
            let mut last = start;
            'search: while let Some(v) = queue.pop_front() {
                for w in uses.get(v).into_iter().flatten() {
                    let w = w.as_str();
                    if w == start {
                        last = v;
                        break 'search;
                    }
                    if inside.contains(w) && !came_from.contains_key(w) {
                        came_from.insert(w, v);
                        queue.push_back(w);
                    }
                }
            }
            let mut path = vec![start, last];
            while let Some(&before) = came_from.get(path[path.len() - 1]) {
                path.push(before);
            }
            path.reverse();
            let mut names: Vec<&str> = vec![start];
            names.extend(path.iter().copied().filter(|&m| m != start));
            names.push(start);
            if group.len() + 1 > names.len() {
                format!(
                    "{} (and {} in the same knot)",
                    names.join(" → "),
                    group.join(", ")
                )
            } else {
                names.join(" → ")
            }
        })
        .collect()
}

#[test]
fn the_daemon_knows_neither_the_cli_nor_its_client_or_rendering() {
    let uses = uses();
    let daemon = &uses["daemon"];
    assert!(
        !daemon.contains("cli"),
        "src/daemon uses crate::cli: {daemon:?}"
    );
    // The names they had before they moved under `cli/`: nothing may bring them back.
    for gone in ["client", "render"] {
        assert!(!daemon.contains(gone), "src/daemon uses crate::{gone}");
    }
    // The wire types know neither side; text safety is a leaf.
    let api = &uses["api"];
    for side in ["daemon", "cli"] {
        assert!(!api.contains(side), "src/api uses crate::{side}: {api:?}");
    }
    let leaf = uses.get("text_safety").cloned().unwrap_or_default();
    assert!(leaf.is_empty(), "text_safety is a leaf: {leaf:?}");
}

#[test]
fn the_reader_finds_the_paths_a_module_names() {
    let top: BTreeSet<String> = ["api", "cli", "daemon", "config"].map(String::from).into();
    let text = "use crate::{api::x, config};\n// crate::cli in a comment\nuse super::super::daemon::y;\nfn f() { crate::cli::g(); }\n#[cfg(test)]\nmod tests { use crate::daemon; }\n";
    let found = named(&code(text), &["a".into(), "b".into()], &top);
    assert_eq!(
        found,
        ["api", "cli", "config", "daemon"].map(String::from).into()
    );
    let found = named(&code("use super::daemon;"), &["a".into(), "b".into()], &top);
    assert!(
        found.is_empty(),
        "super:: of a nested module stays inside it"
    );
    let mut uses = Uses::new();
    uses.insert("a".into(), ["b".to_string()].into());
    uses.insert("b".into(), ["c".to_string()].into());
    uses.insert("c".into(), ["a".to_string(), "d".to_string()].into());
    uses.insert("d".into(), BTreeSet::new());
    assert_eq!(cycles(&uses), vec!["a → b → c → a".to_string()]);
}

#[test]
#[ignore = "M9: the cycles left are other helpers' areas (checkout, git_repo, merge_git, \
            worktrees, moving into src/git/; config, prompts, scripted); the lead un-ignores \
            this once their branches merge"]
fn no_cycle_between_the_top_level_modules() {
    let found = cycles(&uses());
    assert!(
        found.is_empty(),
        "import cycles between src/ modules: {found:#?}"
    );
}
