//! The proxy's modules form a load-bearing order: no module imports one that (directly or
//! not) imports it back, and no source file outgrows what a reader can hold (800 lines,
//! tests aside). Read from the source itself, so a new cycle or an overgrown file fails here.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

#[path = "../../test/module_order.rs"]
mod module_order;

use module_order::{Tree, find_cycle, imports};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

#[test]
fn proxy_modules_have_no_import_cycle_and_no_file_over_800_lines() {
    let graph = Tree {
        root: Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        prefix: "crate::",
        max_lines: 800,
        exempt: &[],
    }
    .check();
    assert!(graph.len() > 10, "the modules were found: {graph:?}");
    assert!(
        graph["fastpath"].contains("request") && graph["handler"].contains("request"),
        "the imports were read: {graph:?}"
    );
}

#[test]
fn the_import_reader_sees_grouped_and_nested_paths() {
    let found = imports(
        "use crate::{a, b::c};\nfn f() { crate::d::e(); }",
        &["x".to_owned()],
        "crate::",
    );
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        vec!["a", "b", "d"],
        "a cycle hidden in a grouped import would go unseen otherwise"
    );
}

#[test]
fn a_cycle_is_found_and_named() {
    let edge = |a: &str, b: &str| (a.to_owned(), BTreeSet::from([b.to_owned()]));
    let graph: BTreeMap<String, BTreeSet<String>> =
        [edge("a", "b"), edge("b", "c"), edge("c", "a")].into();
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let acyclic: BTreeMap<String, BTreeSet<String>> = [edge("a", "b"), edge("b", "c")].into();
    assert_eq!(find_cycle(&acyclic), None);
}
