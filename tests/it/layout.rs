//! The module layout's rules, checked from the source (issue 21; ARCHITECTURE.md, "Layout"):
//! no import cycle between the modules of one folder (top-level modules of `src/` and
//! `actors/src/` included), the daemon knows nothing of the CLI, and the wire types know
//! nothing of either. A child using its parent's shared helpers (`super::x` in a file of
//! `git/`) is not a cycle: only siblings are compared.
//!
//! Paths are read with `syn` from every `use` and every path expression, so a reference
//! written inline (`crate::cli::render::x(..)`) counts as much as a `use`. Test modules
//! (`#[cfg(test)]`) are skipped: a test may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A module's path from its crate's root: `["git", "merge"]` for `src/git/merge.rs`.
type ModPath = Vec<String>;

/// Every module file under `root` and the absolute module paths it references.
fn references(root: &Path) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let mut out = BTreeMap::new();
    for file in rust_files(root) {
        let module = module_of(root, &file);
        let text = std::fs::read_to_string(&file).expect("a source file is readable");
        let parsed = syn::parse_file(&text).expect("a source file parses");
        let mut seen = Collector {
            module: module.clone(),
            found: BTreeSet::new(),
        };
        seen.visit_file(&parsed);
        out.insert(module, seen.found);
    }
    out
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("a source folder is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// `lib.rs`, `main.rs` and `mod.rs` are their folder's module; a file `#[path]`-included as
/// tests (`*_tests.rs`) is read like any other, which is harmless: its uses are the
/// tested module's.
fn is_mod_rs(root: &Path, file: &Path) -> bool {
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name == "mod.rs" || (file.parent() == Some(root) && (name == "lib.rs" || name == "main.rs"))
}

fn module_of(root: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(root).expect("under the root");
    let mut parts: ModPath = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if is_mod_rs(root, file) {
        parts.pop();
    }
    parts
}

struct Collector {
    module: ModPath,
    found: BTreeSet<ModPath>,
}

impl Collector {
    /// The module `self` names in this file: a `mod.rs` is its folder, any other file is
    /// itself.
    fn this(&self) -> ModPath {
        self.module.clone()
    }

    /// Resolves a path's leading `crate`/`super`/`self` to an absolute module path; `None`
    /// for paths into other crates or plain local names.
    fn absolute(&self, segments: &[String]) -> Option<ModPath> {
        let mut here = self.this();
        let mut rest = segments;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                here.clear();
                rest = &rest[1..];
            }
            Some("super") => {
                while rest.first().map(String::as_str) == Some("super") {
                    here.pop()?;
                    rest = &rest[1..];
                }
            }
            Some("self") => rest = &rest[1..],
            _ => return None,
        }
        here.extend(rest.iter().cloned());
        Some(here)
    }

    fn add(&mut self, segments: Vec<String>) {
        if let Some(path) = self.absolute(&segments) {
            self.found.insert(path);
        }
    }

    fn use_tree(&mut self, prefix: Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                let mut next = prefix;
                next.push(p.ident.to_string());
                self.use_tree(next, &p.tree);
            }
            syn::UseTree::Name(n) => {
                let mut next = prefix;
                if n.ident != "self" {
                    next.push(n.ident.to_string());
                }
                self.add(next);
            }
            syn::UseTree::Rename(r) => {
                let mut next = prefix;
                if r.ident != "self" {
                    next.push(r.ident.to_string());
                }
                self.add(next);
            }
            syn::UseTree::Glob(_) => self.add(prefix),
            syn::UseTree::Group(g) => {
                for item in &g.items {
                    self.use_tree(prefix.clone(), item);
                }
            }
        }
    }
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_cfg_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_cfg_test(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if !is_cfg_test(&u.attrs) {
            self.use_tree(Vec::new(), &u.tree);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        self.add(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, p);
    }
}

/// For each folder (module) P, the graph between its child modules: a reference from
/// anywhere inside child `a` to anywhere inside sibling `b` is an edge a → b.
fn sibling_graphs(
    refs: &BTreeMap<ModPath, BTreeSet<ModPath>>,
) -> BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> {
    let modules: BTreeSet<&ModPath> = refs.keys().collect();
    let mut graphs: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (from, targets) in refs {
        for to in targets {
            let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
            if from.len() <= common || to.len() <= common {
                continue; // a parent and its child, or the same module
            }
            let parent: ModPath = from[..common].to_vec();
            let mut sibling = parent.clone();
            sibling.push(to[common].clone());
            if !modules.contains(&sibling) {
                continue; // an item defined in the parent, not a module
            }
            graphs
                .entry(parent)
                .or_default()
                .entry(from[common].clone())
                .or_default()
                .insert(to[common].clone());
        }
    }
    graphs
}

/// The groups of modules that import each other in a circle (strongly connected components
/// of more than one module), each sorted by name.
fn cycles_in(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let mut g = petgraph::graph::DiGraph::<&str, ()>::new();
    let mut index = BTreeMap::new();
    for (from, tos) in graph {
        for name in std::iter::once(from).chain(tos) {
            index
                .entry(name.as_str())
                .or_insert_with(|| g.add_node(name.as_str()));
        }
    }
    for (from, tos) in graph {
        for to in tos {
            g.add_edge(index[from.as_str()], index[to.as_str()], ());
        }
    }
    petgraph::algo::tarjan_scc(&g)
        .into_iter()
        .filter(|scc| scc.len() > 1)
        .map(|scc| {
            let mut names: Vec<String> = scc.iter().map(|n| g[*n].to_string()).collect();
            names.sort();
            names
        })
        .collect()
}

fn cycles_under(root: &Path) -> Vec<String> {
    let graphs = sibling_graphs(&references(root));
    graphs
        .iter()
        .flat_map(|(parent, graph)| {
            let place = if parent.is_empty() {
                "(top level)".to_string()
            } else {
                parent.join("::")
            };
            cycles_in(graph).into_iter().map(move |names| {
                format!(
                    "{} in {place}: {} import each other",
                    root.display(),
                    names.join(", ")
                )
            })
        })
        .collect()
}

fn crate_root(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

#[test]
fn no_import_cycle_between_sibling_modules_of_either_crate() {
    let mut cycles = cycles_under(&crate_root("src"));
    cycles.extend(cycles_under(&crate_root("actors/src")));
    assert!(
        cycles.is_empty(),
        "import cycles between sibling modules (move what both need down into a leaf or \
         their parent):\n{}",
        cycles.join("\n")
    );
}

/// The daemon is a server of the wire types: it must not know the CLI that calls it, its
/// client or how it prints (all under `cli/`); the wire types know neither; the text leaves
/// (`text_safety`, `text_file`) that both sides use name nothing of the crate.
#[test]
fn the_daemon_knows_no_cli_the_wire_types_neither_and_the_leaves_nothing() {
    let refs = references(&crate_root("src"));
    let mut wrong = Vec::new();
    for (from, targets) in &refs {
        // The leaves name no other module of the crate at all.
        let leaf = |_: &str| true;
        let not_cli = |t: &str| t == "cli";
        let not_cli_nor_daemon = |t: &str| t == "cli" || t == "daemon";
        let forbidden: &dyn Fn(&str) -> bool = match from.first().map(String::as_str) {
            Some("daemon") => &not_cli,
            Some("api") => &not_cli_nor_daemon,
            Some("text_safety" | "text_file") => &leaf,
            _ => continue,
        };
        for to in targets {
            let Some(top) = to.first() else { continue };
            if top != &from[0] && forbidden(top) {
                wrong.push(format!("{} uses {}", from.join("::"), to.join("::")));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The check finds what it is meant to find: a planted two-file cycle, and a parent/child
/// pair that is not one.
#[test]
fn the_cycle_check_finds_a_planted_cycle_and_ignores_parent_helpers() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let src = dir.path();
    std::fs::create_dir_all(src.join("git")).expect("mkdir");
    std::fs::write(src.join("lib.rs"), "pub mod a; pub mod b; pub mod git;").expect("write");
    std::fs::write(src.join("a.rs"), "use crate::b::Thing; pub struct Other;").expect("write");
    std::fs::write(
        src.join("b.rs"),
        "pub struct Thing; fn f() -> crate::a::Other { crate::a::Other }",
    )
    .expect("write");
    std::fs::write(
        src.join("git/mod.rs"),
        "pub mod merge; pub fn lock() { merge::x(); }",
    )
    .expect("write");
    std::fs::write(src.join("git/merge.rs"), "pub fn x() { super::lock(); }").expect("write");
    let cycles = cycles_under(src);
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(cycles[0].contains(": a, b import"), "{cycles:?}");
}
