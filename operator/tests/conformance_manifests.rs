//! The compiler over the Gateway API conformance suite's own manifests, at the pinned
//! Gateway API release (read from the Go module cache, as hack/cluster fetches it): every
//! HTTPRoute test manifest compiles cleanly, and the invalid cases get the conditions the
//! conformance tests expect.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

use coxswain_operator::compile::status::{ConditionStatus, ObjectKey};
use coxswain_operator::compile::{self, Compiled, ScopeKey, Store};
use std::path::{Path, PathBuf};
use std::process::Command;

const CLASS: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: coxswain}\nspec: {controllerName: coxswain-labs.dev/gateway-controller}\n";

/// The conformance module's directory, downloaded through the Go module proxy (cached).
fn conformance_dir() -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("bash")
        .arg("-c")
        .arg(
            "source hack/cluster/env.sh && cd / && \
             go mod download -json sigs.k8s.io/gateway-api/conformance@$GATEWAY_API_VERSION",
        )
        .current_dir(&repo)
        .output()
        .expect("running go (the conformance manifests come from the Go module proxy)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    PathBuf::from(info["Dir"].as_str().unwrap())
}

fn load(dir: &Path, test_file: &Path) -> Store {
    let mut store = Store::default();
    let mut errors = Vec::new();
    let class_name = |text: String| text.replace("{GATEWAY_CLASS_NAME}", "coxswain");
    let base = class_name(std::fs::read_to_string(dir.join("base/manifests.yaml")).unwrap());
    store.load_yaml(Path::new("base/manifests.yaml"), &base, &mut errors);
    store.load_yaml(Path::new("class.yaml"), CLASS, &mut errors);
    let text = class_name(std::fs::read_to_string(test_file).unwrap());
    store.load_yaml(test_file, &text, &mut errors);
    assert!(errors.is_empty(), "{}: {errors:?}", test_file.display());
    store
}

fn route_reasons(c: &Compiled, name: &str) -> Vec<(String, ConditionStatus, String)> {
    let key = ObjectKey::new("gateway-conformance-infra", name);
    let parents = c
        .status
        .http_routes
        .get(&key)
        .unwrap_or_else(|| panic!("no status for {key}"));
    parents
        .iter()
        .flat_map(|p| p.conditions.iter())
        .map(|c| (c.type_.to_owned(), c.status, c.reason.to_owned()))
        .collect()
}

#[test]
fn every_httproute_conformance_manifest_compiles() {
    let dir = conformance_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("tests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("httproute-") && name.ends_with(".yaml")
        })
        .collect();
    files.sort();
    assert!(
        files.len() >= 40,
        "only {} HTTPRoute manifests found",
        files.len()
    );
    let mut routes_seen = 0;
    for file in &files {
        let store = load(&dir, file);
        let compiled = compile::compile(&store, &compile::Config::default());
        for (scope, snapshot) in &compiled.snapshots {
            assert!(
                snapshot.is_sealed(),
                "{}: {scope:?} not sealed",
                file.display()
            );
            // What `coxswain snapshot compile -o json` prints reads back identically.
            let json = serde_json::to_string(snapshot.snapshot()).unwrap();
            let back: coxswain_api::snapshot::Snapshot = serde_json::from_str(&json).unwrap();
            assert_eq!(&back, snapshot.snapshot(), "{}", file.display());
        }
        // Every HTTPRoute whose parent is one of our Gateways gets a status.
        for route in &store.http_routes {
            let key = ObjectKey::new(
                route.metadata.namespace.clone().unwrap_or_default(),
                route.metadata.name.clone().unwrap_or_default(),
            );
            let ours = route.spec.parent_refs.iter().flatten().any(|p| {
                let ns = p.namespace.clone().unwrap_or(key.namespace.clone());
                compiled
                    .status
                    .gateways
                    .contains_key(&ObjectKey::new(ns, &p.name))
            });
            if ours {
                assert!(
                    compiled.status.http_routes.contains_key(&key),
                    "{}: {key}",
                    file.display()
                );
                routes_seen += 1;
            }
        }
        assert!(compiled.snapshots.contains_key(&ScopeKey::SharedPool));
    }
    assert!(
        routes_seen >= 60,
        "only {routes_seen} routes had our Gateway as parent"
    );
}

#[test]
fn invalid_conformance_cases_get_the_expected_conditions() {
    use ConditionStatus::{False, True};
    let dir = conformance_dir();
    let cases: &[(&str, &str, &str, ConditionStatus, &str)] = &[
        // (manifest, route, condition, status, reason), as the conformance tests assert them.
        (
            "httproute-invalid-cross-namespace-backend-ref",
            "invalid-cross-namespace-backend-ref",
            "ResolvedRefs",
            False,
            "RefNotPermitted",
        ),
        (
            "httproute-invalid-nonexistent-backendref",
            "invalid-nonexistent-backend-ref",
            "ResolvedRefs",
            False,
            "BackendNotFound",
        ),
        (
            "httproute-invalid-backendref-unknown-kind",
            "invalid-backend-ref-unknown-kind",
            "ResolvedRefs",
            False,
            "InvalidKind",
        ),
        (
            "httproute-invalid-parentref-not-matching-section-name",
            "httproute-listener-not-matching-section-name",
            "Accepted",
            False,
            "NoMatchingParent",
        ),
        (
            "httproute-invalid-parentref-not-matching-listener-port",
            "httproute-listener-not-matching-route-port",
            "Accepted",
            False,
            "NoMatchingParent",
        ),
        (
            "httproute-invalid-reference-grant",
            "reference-grant",
            "ResolvedRefs",
            False,
            "RefNotPermitted",
        ),
        (
            "httproute-hostname-intersection",
            "no-intersecting-hosts",
            "Accepted",
            False,
            "NoMatchingListenerHostname",
        ),
        (
            "httproute-hostname-intersection",
            "specific-host-matches-listener-wildcard-host",
            "Accepted",
            True,
            "Accepted",
        ),
        (
            "httproute-reference-grant",
            "reference-grant",
            "ResolvedRefs",
            True,
            "ResolvedRefs",
        ),
        (
            "httproute-simple-same-namespace",
            "gateway-conformance-infra-test",
            "Accepted",
            True,
            "Accepted",
        ),
    ];
    for (manifest, route, type_, status, reason) in cases {
        let store = load(&dir, &dir.join(format!("tests/{manifest}.yaml")));
        let compiled = compile::compile(&store, &compile::Config::default());
        let got = route_reasons(&compiled, route);
        assert!(
            got.iter()
                .any(|(t, s, r)| t == type_ && s == status && r == reason),
            "{manifest}: {route}: want {type_}={status:?}/{reason}, got {got:?}"
        );
    }

    // The cross-namespace parentRef case: the route lives in another namespace.
    let store = load(
        &dir,
        &dir.join("tests/httproute-invalid-cross-namespace-parent-ref.yaml"),
    );
    let compiled = compile::compile(&store, &compile::Config::default());
    let key = ObjectKey::new(
        "gateway-conformance-web-backend",
        "invalid-cross-namespace-parent-ref",
    );
    let conditions = &compiled.status.http_routes[&key][0].conditions;
    let accepted = conditions.iter().find(|c| c.type_ == "Accepted").unwrap();
    assert_eq!(
        (accepted.status, accepted.reason),
        (False, "NotAllowedByListeners")
    );
}
