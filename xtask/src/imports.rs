//! `xtask imports`: fails when the library's modules import each other in a circle.
//!
//! Every `use` and every qualified path (`crate::…`, `super::…`, `self::…`) outside
//! `#[cfg(test)]` code is an edge from the file that names it to the file that defines
//! what it names; re-exports (`pub use`) are followed to their source. The graph is then
//! checked at every folder level: among a folder's children (its files and subfolders,
//! a subfolder standing for everything under it), the edges must form no cycle. A
//! folder's `mod.rs` (and the crate's `lib.rs`) is its face, declaring and re-exporting
//! its children, so it is left out of its own folder's graph; what it defines counts
//! as its folder's from outside.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A module's path from the crate root (`["runtime", "server"]`).
type ModPath = Vec<String>;

/// One source file: its module path and its text.
struct SourceFile {
    module: ModPath,
    text: String,
}

/// Checks `src` (a crate's source folder); `Err` lists every cycle found.
pub fn check(src: &Path) -> Result<usize, String> {
    let files = collect(src)?;
    let modules: BTreeSet<ModPath> = files.iter().map(|f| f.module.clone()).collect();
    let mut reexports: BTreeMap<ModPath, BTreeMap<String, ModPath>> = BTreeMap::new();
    let mut references: Vec<(ModPath, Vec<ModPath>)> = Vec::new();
    for file in &files {
        let syntax = syn::parse_file(&file.text)
            .map_err(|e| format!("parsing {}: {e}", file.module.join("::")))?;
        let mut visitor = Paths {
            module: file.module.clone(),
            is_face: file_is_face(&files, &file.module),
            paths: Vec::new(),
            reexports: BTreeMap::new(),
        };
        visitor.visit_file(&syntax);
        reexports.insert(file.module.clone(), visitor.reexports);
        references.push((file.module.clone(), visitor.paths));
    }
    let mut edges: BTreeSet<(ModPath, ModPath)> = BTreeSet::new();
    for (from, paths) in &references {
        for path in paths {
            if let Some(to) = resolve(path, &modules, &reexports, 0)
                && &to != from
            {
                edges.insert((from.clone(), to));
            }
        }
    }
    let cycles = cycles_by_folder(&modules, &edges);
    if cycles.is_empty() {
        Ok(edges.len())
    } else {
        Err(cycles.join("\n"))
    }
}

/// Every `.rs` file under `src` with its module path.
fn collect(src: &Path) -> Result<Vec<SourceFile>, String> {
    crate::rust_files(src)?
        .into_iter()
        .map(|path| {
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(SourceFile {
                module: module_path(src, &path),
                text,
            })
        })
        .collect()
}

fn module_path(src: &Path, file: &Path) -> ModPath {
    let relative: PathBuf = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: ModPath = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// A module with children (a `mod.rs`, or the crate root) is a folder's face.
fn file_is_face(files: &[SourceFile], module: &ModPath) -> bool {
    files
        .iter()
        .any(|f| f.module.len() == module.len() + 1 && f.module.starts_with(module))
}

/// Collects the absolute paths a file names, and its re-exports.
struct Paths {
    module: ModPath,
    is_face: bool,
    paths: Vec<ModPath>,
    reexports: BTreeMap<String, ModPath>,
}

impl Paths {
    /// `crate::a::b` → `[a, b]`; `super::x` and `self::x` relative to this file.
    fn absolute(&self, segments: &[String]) -> Option<ModPath> {
        let (first, rest) = segments.split_first()?;
        // A face's `self` is its folder; a plain file's `super` is its folder too.
        let mut base = self.module.clone();
        match first.as_str() {
            "crate" => base.clear(),
            "self" => {}
            "super" => {
                base.pop();
            }
            _ => return None,
        }
        let mut rest = rest.iter().peekable();
        while rest.peek().is_some_and(|s| s.as_str() == "super") {
            base.pop();
            rest.next();
        }
        base.extend(rest.cloned());
        Some(base)
    }

    /// A `use` tree's leaves with their names; child modules named bare from a face
    /// (`pub use child::Item`) count as `self::child`.
    fn use_tree(&mut self, tree: &syn::UseTree, prefix: &mut Vec<String>, public: bool) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix, public);
                prefix.pop();
            }
            syn::UseTree::Group(g) => {
                for item in &g.items {
                    self.use_tree(item, prefix, public);
                }
            }
            syn::UseTree::Name(n) => self.use_leaf(prefix, &n.ident.to_string(), None, public),
            syn::UseTree::Rename(r) => self.use_leaf(
                prefix,
                &r.ident.to_string(),
                Some(r.rename.to_string()),
                public,
            ),
            syn::UseTree::Glob(_) => self.use_leaf(prefix, "*", None, public),
        }
    }

    fn use_leaf(&mut self, prefix: &[String], name: &str, rename: Option<String>, public: bool) {
        let mut segments = prefix.to_vec();
        if name != "self" {
            segments.push(name.to_string());
        }
        let starts_local = segments
            .first()
            .is_some_and(|s| matches!(s.as_str(), "crate" | "self" | "super"));
        let absolute = if starts_local {
            self.absolute(&segments)
        } else if self.is_face || self.module.is_empty() {
            // A face's bare `child::Item` is its own child (edition 2018 paths).
            let mut own = self.module.clone();
            own.extend(segments.iter().cloned());
            Some(own)
        } else {
            None
        };
        let Some(mut absolute) = absolute else { return };
        if name == "*" {
            absolute.pop();
        }
        if public && name != "*" {
            let alias = rename.unwrap_or_else(|| {
                if name == "self" {
                    prefix.last().cloned().unwrap_or_default()
                } else {
                    name.to_string()
                }
            });
            self.reexports.insert(alias, absolute.clone());
        }
        self.paths.push(absolute);
    }
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        // Inline modules are test modules here; their `super` is this file.
        if !is_test_only(&item.attrs) && item.content.is_none() {
            syn::visit::visit_item_mod(self, item);
        }
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if !is_test_only(&item.attrs) {
            syn::visit::visit_item_fn(self, item);
        }
    }

    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        if !is_test_only(&item.attrs) {
            syn::visit::visit_item_impl(self, item);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if is_test_only(&item.attrs) {
            return;
        }
        let public = !matches!(item.vis, syn::Visibility::Inherited);
        self.use_tree(&item.tree, &mut Vec::new(), public);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if let Some(absolute) = self.absolute(&segments) {
            self.paths.push(absolute);
        }
        syn::visit::visit_path(self, path);
    }
}

/// The file that defines what `path` names, following re-exports.
fn resolve(
    path: &[String],
    modules: &BTreeSet<ModPath>,
    reexports: &BTreeMap<ModPath, BTreeMap<String, ModPath>>,
    depth: usize,
) -> Option<ModPath> {
    let len = (0..=path.len())
        .rev()
        .find(|&n| modules.contains(&path[..n].to_vec()))?;
    let module = path[..len].to_vec();
    if depth < 16
        && let Some(name) = path.get(len)
        && let Some(target) = reexports.get(&module).and_then(|r| r.get(name))
        && target.as_slice() != path
    {
        let mut next = target.clone();
        next.extend(path[len + 1..].iter().cloned());
        return resolve(&next, modules, reexports, depth + 1).or(Some(module));
    }
    Some(module)
}

/// Cycles among each folder's children, one line per cycle.
fn cycles_by_folder(
    modules: &BTreeSet<ModPath>,
    edges: &BTreeSet<(ModPath, ModPath)>,
) -> Vec<String> {
    let folders: BTreeSet<ModPath> = modules
        .iter()
        .filter(|m| {
            modules
                .iter()
                .any(|c| c.len() == m.len() + 1 && c.starts_with(m))
        })
        .cloned()
        .collect();
    let mut found = Vec::new();
    for folder in &folders {
        let child = |m: &ModPath| -> Option<String> {
            (m.len() > folder.len() && m.starts_with(folder)).then(|| m[folder.len()].clone())
        };
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, to) in edges {
            if let (Some(a), Some(b)) = (child(from), child(to))
                && a != b
            {
                graph.entry(a).or_default().insert(b);
            }
        }
        for component in strongly_connected(&graph) {
            let mut names: Vec<&String> = component.iter().collect();
            names.sort();
            let witness = witness_edges(&component, folder, edges);
            found.push(format!(
                "cycle in {}/: {} ({})",
                if folder.is_empty() {
                    "src".into()
                } else {
                    folder.join("/")
                },
                names
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(" ⇄ "),
                witness
            ));
        }
    }
    found
}

/// The file-level edges inside one cycle, so the report says where to cut.
fn witness_edges(
    component: &BTreeSet<String>,
    folder: &ModPath,
    edges: &BTreeSet<(ModPath, ModPath)>,
) -> String {
    edges
        .iter()
        .filter(|(from, to)| {
            let inside = |m: &ModPath| {
                m.len() > folder.len()
                    && m.starts_with(folder)
                    && component.contains(&m[folder.len()])
            };
            inside(from) && inside(to) && from[folder.len()] != to[folder.len()]
        })
        .map(|(from, to)| format!("{} → {}", from.join("::"), to.join("::")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Tarjan's strongly connected components with more than one member.
fn strongly_connected(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct State<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, node: &'g str) {
        let i = s.index.len();
        s.index.insert(node, i);
        s.low.insert(node, i);
        s.stack.push(node);
        s.on_stack.insert(node);
        for next in s.graph.get(node).into_iter().flatten() {
            let next = next.as_str();
            if !s.index.contains_key(next) {
                visit(s, next);
                let low = s.low[node].min(s.low[next]);
                s.low.insert(node, low);
            } else if s.on_stack.contains(next) {
                let low = s.low[node].min(s.index[next]);
                s.low.insert(node, low);
            }
        }
        if s.low[node] == s.index[node] {
            let mut component = BTreeSet::new();
            while let Some(top) = s.stack.pop() {
                s.on_stack.remove(top);
                component.insert(top.to_string());
                if top == node {
                    break;
                }
            }
            if component.len() > 1 {
                s.out.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node.as_str()) {
            visit(&mut state, node);
        }
    }
    state.out
}

#[cfg(test)]
mod tests {
    use super::check;

    /// A crate tree in a temporary folder: `(path, text)` pairs.
    fn tree(files: &[(&str, &str)]) -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!(
            "xtask-imports-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&root);
        for (path, text) in files {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        root
    }

    #[test]
    fn a_circle_between_folders_is_found_through_a_reexport() {
        let root = tree(&[
            ("lib.rs", "pub mod a;\npub mod b;\n"),
            ("a/mod.rs", "mod x;\npub use x::X;\n"),
            ("a/x.rs", "pub struct X(crate::b::Y);\n"),
            ("b/mod.rs", "mod y;\npub use y::Y;\n"),
            ("b/y.rs", "pub struct Y;\nfn f(_: crate::a::X) {}\n"),
        ]);
        let err = check(&root).expect_err("a ⇄ b");
        assert!(err.contains("cycle in src/: a ⇄ b"), "{err}");
        assert!(
            err.contains("a::x → b::y") && err.contains("b::y → a::x"),
            "{err}"
        );
    }

    #[test]
    fn one_way_imports_and_test_code_pass() {
        let root = tree(&[
            ("lib.rs", "pub mod a;\npub mod b;\n"),
            ("a/mod.rs", "mod x;\npub use x::X;\n"),
            ("a/x.rs", "pub struct X(crate::b::Y);\n"),
            ("b/mod.rs", "mod y;\npub use y::Y;\n"),
            (
                "b/y.rs",
                "pub struct Y;\n#[cfg(test)]\nmod tests { use crate::a::X; }\n",
            ),
        ]);
        assert!(check(&root).is_ok());
    }

    #[test]
    fn siblings_in_a_folder_are_checked_too() {
        let root = tree(&[
            ("lib.rs", "mod r;\n"),
            ("r/mod.rs", "mod p;\nmod q;\n"),
            ("r/p.rs", "use super::q::Q;\npub struct P;\n"),
            ("r/q.rs", "pub struct Q;\nfn f(_: super::p::P) {}\n"),
        ]);
        let err = check(&root).expect_err("p ⇄ q");
        assert!(err.contains("cycle in r/: p ⇄ q"), "{err}");
    }
}
