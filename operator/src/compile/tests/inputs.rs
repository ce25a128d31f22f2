//! The input as a whole: malformed objects are reported and skipped, and the order objects
//! arrive in changes nothing.

use super::fixtures::*;
use crate::compile::*;
use std::path::Path;

#[test]
fn snapshots_do_not_depend_on_input_order() {
    let r1 = route(
        "r1",
        "  parentRefs: [{name: edge}]\n  hostnames: [a.example]\n  rules: [{backendRefs: [{name: echo, port: 8080}]}]\n",
    );
    let r2 = route(
        "r2",
        "  parentRefs: [{name: edge}]\n  rules: [{matches: [{path: {value: /x}}], backendRefs: [{name: echo, port: 8080}]}]\n",
    );
    let forward = compile_yaml(&[BASE, GATEWAY, &r1, &r2]);
    let backward = compile_yaml(&[&r2, &r1, GATEWAY, BASE]);
    use prost::Message;
    assert_eq!(
        shared(&forward).encode_to_vec(),
        shared(&backward).encode_to_vec()
    );
    assert_eq!(shared(&forward).version, shared(&backward).version);
    assert_eq!(forward.status, backward.status);
}

#[test]
fn malformed_objects_are_reported_and_the_rest_compiles() {
    let bad = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: broken, namespace: web}
spec: {rules: "not a list"}
---
: not yaml [
"#;
    let mut store = Store::default();
    let mut errors = Vec::new();
    for d in [BASE, GATEWAY, bad] {
        store.load_yaml(Path::new("input.yaml"), d, &mut errors);
    }
    let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    assert!(
        text.iter()
            .any(|e| e.starts_with("input.yaml: HTTPRoute broken:")),
        "{text:?}"
    );
    let c = compile(&store, &Config::default());
    assert_eq!(shared(&c).listeners.len(), 1);
}
