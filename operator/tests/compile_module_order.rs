//! The compiler's modules (`src/compile`) form a load-bearing order: no module imports one that
//! (directly or not) imports it back, and no source file outgrows what a reader can hold (800
//! lines, tests aside). Incremental compilation will reshape these modules; this keeps the
//! reshaping from tangling them. Read from the source itself, so a new cycle or an overgrown
//! file fails here.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 800;

/// Files over the limit that another change is reworking; each names why it may wait. Remove
/// an entry when its file fits.
const NOT_YET_SPLIT: &[(&str, &str)] = &[];

/// A test module: `tests.rs`, `*_tests.rs` (declared `#[cfg(test)] mod x_tests;`), or anything
/// under a `tests` directory.
fn is_test_file(path: &Path) -> bool {
    path.components().any(|c| c.as_os_str() == "tests")
        || path
            .file_stem()
            .is_some_and(|s| s == "tests" || s.to_string_lossy().ends_with("_tests"))
}

/// Every .rs file under `dir`, relative to `root`.
fn sources(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.strip_prefix(root).unwrap().to_path_buf());
        }
    }
}

/// The module path of a file below `src/compile`: `httproute.rs` is ["httproute"],
/// `ingress/policy.rs` ["ingress", "policy"], `mod.rs` [] (the compiler's root).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().unwrap();
    if file != "mod.rs" {
        parts.push(file.trim_end_matches(".rs").to_owned());
    }
    parts
}

/// The code before an inline `#[cfg(test)]` module, without comment lines (doc links name
/// modules without importing them).
fn code_of(text: &str) -> String {
    let code = text
        .find("#[cfg(test)]\nmod tests {")
        .map_or(text, |i| &text[..i]);
    code.lines()
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
    match rest.strip_prefix('{') {
        Some(group) => {
            let end = group.find('}').unwrap_or(group.len());
            group[..end]
                .split(',')
                .map(|item| ident(item.trim()))
                .filter(|n| !n.is_empty())
                .collect()
        }
        None => vec![ident(rest)]
            .into_iter()
            .filter(|n| !n.is_empty())
            .collect(),
    }
}

/// Compiler modules the code of the file at `path` (its module path) names: through
/// `crate::compile::`, or through as many `super::` as reach the compiler's root. A `super::`
/// that stays inside the file's own top-level module is not a dependency.
fn imports(code: &str, path: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        let preceded_by_path = at > 0
            && (bytes[at - 1] == b':'
                || bytes[at - 1].is_ascii_alphanumeric()
                || bytes[at - 1] == b'_');
        if !preceded_by_path && rest.starts_with("crate::compile::") {
            out.extend(first_names(&rest["crate::compile::".len()..]));
            at += "crate::compile::".len();
        } else if !preceded_by_path && rest.starts_with("super::") {
            let mut ups = 0;
            let mut tail = rest;
            while let Some(t) = tail.strip_prefix("super::") {
                ups += 1;
                tail = t;
            }
            // The file's own module is its parent for `super`, so `super` from
            // compile/x.rs is the root, and from compile/x/y.rs is x.
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

#[test]
fn compile_modules_have_no_import_cycle_and_no_file_over_800_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/compile");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    files.retain(|f| !is_test_file(f));
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_path(f).first().cloned())
        .collect();

    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut too_long = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let lines = text
            .find("#[cfg(test)]\nmod tests {")
            .map_or(text.as_str(), |i| &text[..i])
            .lines()
            .count();
        let exempt = NOT_YET_SPLIT.iter().any(|(f, _)| file == Path::new(f));
        if lines > MAX_LINES && !exempt {
            too_long.push(format!("{} ({lines} lines)", file.display()));
        }
        let path = module_path(file);
        // The root declares every module and is imported by all; like lib.rs it is no node.
        let Some(module) = path.first().cloned() else {
            continue;
        };
        let deps = graph.entry(module.clone()).or_default();
        for dep in imports(&code_of(&text), &path) {
            if dep != module && modules.contains(&dep) {
                deps.insert(dep);
            }
        }
    }
    assert!(too_long.is_empty(), "over {MAX_LINES} lines: {too_long:?}");
    for (file, why) in NOT_YET_SPLIT {
        assert!(
            root.join(file).exists(),
            "{file} is exempt ({why}) but gone: remove it from NOT_YET_SPLIT"
        );
    }
    assert!(graph.len() > 10, "the modules were found: {graph:?}");
    assert!(
        graph["httproute"].contains("route") && graph["gateway"].contains("listeners"),
        "the imports were read: {graph:?}"
    );

    // Depth-first search; a module met again while still on the path closes a cycle.
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
    for m in graph.keys() {
        if let Err(cycle) = visit(m, &graph, &mut Vec::new(), &mut done) {
            panic!("import cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_import_reader_sees_grouped_nested_and_crate_paths() {
    let top = vec!["a".to_owned()];
    let found = imports(
        "use super::{b, c::d};\nfn f() { super::e::g(); crate::compile::h::i(); }",
        &top,
    );
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        vec!["b", "c", "e", "h"],
        "a cycle hidden in a grouped import would go unseen otherwise"
    );
    // From compile/a/x.rs, `super::` is module a itself and `super::super::` the root.
    let nested = vec!["a".to_owned(), "x".to_owned()];
    let found = imports("use super::y;\nuse super::super::{b, c};", &nested);
    assert_eq!(found.into_iter().collect::<Vec<_>>(), vec!["b", "c"]);
    // Doc links are not imports.
    assert!(
        code_of("//! see [`super::b`]\nfn f() {}")
            .find("super::")
            .is_none()
    );
}
