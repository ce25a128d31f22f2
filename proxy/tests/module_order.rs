//! The proxy's modules form a load-bearing order: no module imports one that (directly or
//! not) imports it back, and no source file outgrows what a reader can hold (800 lines,
//! tests aside). Read from the source itself, so a new cycle or an overgrown file fails here.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 800;

/// Every .rs file under `dir`, except test modules (`tests.rs`, `*/tests/*`).
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "tests") {
                sources(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to ("router" for src/router.rs and src/router/x.rs).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_owned()
}

/// The code before an inline `#[cfg(test)]` module.
fn without_tests(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests {")
        .map_or(text, |i| &text[..i])
}

/// Top-level modules named after `crate::` in `code`, including `use crate::{a, b::c}`.
fn imports(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

#[test]
fn proxy_modules_have_no_import_cycle_and_no_file_over_800_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut too_long = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let code = without_tests(&text);
        let lines = code.lines().count();
        if lines > MAX_LINES {
            too_long.push(format!("{} ({lines} lines)", file.display()));
        }
        let module = module_of(&src, file);
        if module == "lib" {
            continue;
        }
        let deps = graph.entry(module.clone()).or_default();
        for dep in imports(code) {
            if dep != module {
                deps.insert(dep);
            }
        }
    }
    assert!(too_long.is_empty(), "over {MAX_LINES} lines: {too_long:?}");
    assert!(graph.len() > 10, "the modules were found: {graph:?}");

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
fn the_import_reader_sees_grouped_and_nested_paths() {
    let found = imports("use crate::{a, b::c};\nfn f() { crate::d::e(); }");
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        vec!["a", "b", "d"],
        "a cycle hidden in a grouped import would go unseen otherwise"
    );
}
