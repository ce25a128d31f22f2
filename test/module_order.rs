//! The module-order guard, shared by the proxy's and the compiler's tests (each includes this
//! file with `#[path]`, so neither crate depends on the other's test tooling).
//!
//! A tree of modules has a load-bearing order when no top-level module imports one that
//! (directly or not) imports it back, and no source file outgrows what a reader can hold.
//! Both are read from the source itself: imports through the tree's own path (`crate::` for a
//! crate root, `crate::compile::` for the compiler) and through as many `super::` as reach the
//! tree's root.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The tree below `root` (its root file is `lib.rs` or `mod.rs`), named `prefix` in imports.
pub struct Tree<'a> {
    pub root: PathBuf,
    /// "crate::" or "crate::compile::".
    pub prefix: &'a str,
    pub max_lines: usize,
    /// Files allowed over the limit for now, each with why.
    pub exempt: &'a [(&'a str, &'a str)],
}

impl Tree<'_> {
    /// The import graph of the top-level modules. Panics, naming the culprits, on a file over
    /// the limit or on an import cycle.
    pub fn check(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut files = Vec::new();
        sources(&self.root, &self.root, &mut files);
        files.retain(|f| !is_test_file(f));
        let modules: BTreeSet<String> = files
            .iter()
            .filter_map(|f| module_path(f).first().cloned())
            .collect();
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut too_long = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(self.root.join(file))
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let lines = without_tests(&text).lines().count();
            let exempt = self.exempt.iter().any(|(f, _)| file == Path::new(f));
            if lines > self.max_lines && !exempt {
                too_long.push(format!("{} ({lines} lines)", file.display()));
            }
            let path = module_path(file);
            // The root declares every module and is imported by all: no node.
            let Some(module) = path.first().cloned() else {
                continue;
            };
            let deps = graph.entry(module.clone()).or_default();
            for dep in imports(&code_of(&text), &path, self.prefix) {
                if dep != module && modules.contains(&dep) {
                    deps.insert(dep);
                }
            }
        }
        assert!(
            too_long.is_empty(),
            "over {} lines: {too_long:?}",
            self.max_lines
        );
        for (file, why) in self.exempt {
            assert!(
                self.root.join(file).exists(),
                "{file} is exempt ({why}) but gone: remove it from the exemptions"
            );
        }
        if let Some(cycle) = find_cycle(&graph) {
            panic!("import cycle: {}", cycle.join(" -> "));
        }
        graph
    }
}

/// A test module: `tests.rs`, `*_tests.rs` (declared `#[cfg(test)] mod x_tests;`), or anything
/// under a `tests` directory.
pub fn is_test_file(path: &Path) -> bool {
    path.components().any(|c| c.as_os_str() == "tests")
        || path
            .file_stem()
            .is_some_and(|s| s == "tests" || s.to_string_lossy().ends_with("_tests"))
}

/// Every .rs file under `dir`, relative to `root`.
fn sources(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && let Ok(rel) = path.strip_prefix(root)
        {
            out.push(rel.to_path_buf());
        }
    }
}

/// The module path of a file below the root: `router.rs` is ["router"], `handler/answers.rs`
/// ["handler", "answers"], `lib.rs` and `mod.rs` [] (the root).
pub fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().unwrap_or_default();
    let is_root = parts.is_empty() && (file == "lib.rs" || file == "mod.rs");
    if !is_root && file != "mod.rs" {
        parts.push(file.trim_end_matches(".rs").to_owned());
    }
    parts
}

/// The code before an inline `#[cfg(test)] mod tests`.
fn without_tests(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests {")
        .map_or(text, |i| &text[..i])
}

/// The code before an inline test module, without comment lines (doc links name modules
/// without importing them).
pub fn code_of(text: &str) -> String {
    without_tests(text)
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The first names of the paths after a prefix: `a` for `a::b`, `a` and `b` for `{a, b::c}`.
fn first_names(rest: &str) -> Vec<String> {
    let names: Vec<String> = match rest.strip_prefix('{') {
        Some(group) => {
            let end = group.find('}').unwrap_or(group.len());
            group[..end]
                .split(',')
                .map(|item| ident(item.trim()))
                .collect()
        }
        None => vec![ident(rest)],
    };
    names.into_iter().filter(|n| !n.is_empty()).collect()
}

/// Modules of the tree that the code of the file at `path` (its module path) names: through
/// `prefix`, or through as many `super::` as reach the tree's root. A `super::` that stays
/// inside the file's own top-level module is not a dependency.
pub fn imports(code: &str, path: &[String], prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        let preceded_by_path = at > 0
            && (bytes[at - 1] == b':'
                || bytes[at - 1].is_ascii_alphanumeric()
                || bytes[at - 1] == b'_');
        if !preceded_by_path && rest.starts_with(prefix) {
            out.extend(first_names(&rest[prefix.len()..]));
            at += prefix.len();
        } else if !preceded_by_path && rest.starts_with("super::") {
            let mut ups = 0;
            let mut tail = rest;
            while let Some(t) = tail.strip_prefix("super::") {
                ups += 1;
                tail = t;
            }
            // A file's own module is its parent for `super`: from x.rs `super` is the root,
            // from x/y.rs it is x.
            if ups == path.len() {
                out.extend(first_names(tail));
            }
            at += rest.len() - tail.len();
        } else {
            at += rest.chars().next().map_or(1, char::len_utf8);
        }
    }
    out
}

/// A cycle of the graph, if it has one: a module met again while still on the search path.
pub fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Result<(), Vec<String>> {
        if done.contains(m) {
            return Ok(());
        }
        if let Some(at) = path.iter().position(|p| p == m) {
            let mut cycle = path[at..].to_vec();
            cycle.push(m.to_owned());
            return Err(cycle);
        }
        path.push(m.to_owned());
        for dep in graph.get(m).into_iter().flatten() {
            visit(dep, graph, path, done)?;
        }
        path.pop();
        done.insert(m.to_owned());
        Ok(())
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(m, graph, &mut Vec::new(), &mut done).err())
}
