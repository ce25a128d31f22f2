//! The compiler's modules (`src/compile`) form a load-bearing order: no module imports one that
//! (directly or not) imports it back, and no source file outgrows what a reader can hold (800
//! lines, tests aside). Incremental compilation will reshape these modules; this keeps the
//! reshaping from tangling them. Read from the source itself, so a new cycle or an overgrown
//! file fails here.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

#[path = "../../test/module_order.rs"]
mod module_order;

use module_order::{Tree, code_of, imports};
use std::path::Path;

fn compile_tree() -> Tree<'static> {
    Tree {
        root: Path::new(env!("CARGO_MANIFEST_DIR")).join("src/compile"),
        prefix: "crate::compile::",
        max_lines: 800,
        exempt: &[],
    }
}

#[test]
fn compile_modules_have_no_import_cycle_and_no_file_over_800_lines() {
    let graph = compile_tree().check();
    assert!(graph.len() > 10, "the modules were found: {graph:?}");
    assert!(
        graph["httproute"].contains("route") && graph["gateway"].contains("listeners"),
        "the imports were read: {graph:?}"
    );
}

/// The route kinds meet in the shared route form (route.rs) and nowhere else: the converters
/// read only it, the route compiler does not call the converters (the root does), and the
/// Gateway compiler knows no route module. Incremental compile will recompile one route of
/// any kind; a converter that reached back into the route compiler would drag it along.
#[test]
fn route_kinds_meet_only_in_the_shared_route_form() {
    let graph = compile_tree().check();
    let route_modules = ["httproute", "grpcroute", "l4route"];
    for converter in ["grpcroute", "l4route"] {
        assert!(graph[converter].contains("route"), "{converter}: {graph:?}");
    }
    for module in route_modules.iter().chain(&["gateway"]) {
        let crossing: Vec<&&str> = route_modules
            .iter()
            .filter(|other| *other != module && graph[*module].contains(**other))
            .collect();
        assert!(
            crossing.is_empty(),
            "{module} imports {crossing:?}; route kinds should meet in route.rs only"
        );
    }
}

#[test]
fn the_import_reader_sees_grouped_nested_and_crate_paths() {
    let top = vec!["a".to_owned()];
    let found = imports(
        "use super::{b, c::d};\nfn f() { super::e::g(); crate::compile::h::i(); }",
        &top,
        "crate::compile::",
    );
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        vec!["b", "c", "e", "h"],
        "a cycle hidden in a grouped import would go unseen otherwise"
    );
    // From compile/a/x.rs, `super::` is module a itself and `super::super::` the root.
    let nested = vec!["a".to_owned(), "x".to_owned()];
    let found = imports(
        "use super::y;\nuse super::super::{b, c};",
        &nested,
        "crate::compile::",
    );
    assert_eq!(found.into_iter().collect::<Vec<_>>(), vec!["b", "c"]);
    // Doc links are not imports.
    assert!(
        code_of("//! see [`super::b`]\nfn f() {}")
            .find("super::")
            .is_none()
    );
}
