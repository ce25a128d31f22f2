//! What the reflector's snapshot costs per compile pass at 20,000 HTTPRoutes, 20,000 Services
//! and 20,000 EndpointSlices: copying the three lists as `Vec<K>` (a deep clone of every
//! object, as the reflector did before its caches held `Arc<K>`), as `Vec<Arc<K>>` (a
//! reference count bump per object, as it did until its caches kept persistent vectors) and
//! as the persistent vectors a store holds now (`compile::store::Objects`: a copy in constant
//! time). Each timed iteration builds the copy and frees it, as a pass does. Only these lists are measured: not the cache's lock, not the
//! other kinds, not the compile. Objects look like a cluster's after the reflector stripped
//! managedFields and kubectl's last-applied annotation: uid, resourceVersion, labels, a
//! route status, Endpoints with conditions and target references.
//!
//! Before the timings it prints how much resident memory one copy of each sort adds (read
//! from /proc/self/statm, so approximate, Linux only).
//! `cargo bench -p coxswain-operator --bench snapshot_copy`.

use coxswain_operator::compile::Store;
use coxswain_operator::compile::store::Objects;
use criterion::{Criterion, criterion_group, criterion_main};
use gateway_api::apis::experimental::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;

const OBJECTS: usize = 20_000;

/// Metadata as the apiserver returns it, less what the reflector strips.
fn metadata(name: &str, i: usize, labels: &str) -> String {
    format!(
        "metadata:\n  name: {name}\n  namespace: bench-{ns}\n  uid: 6f1c2a4e-0000-4000-8000-{i:012}\n  \
         resourceVersion: \"{rv}\"\n  generation: 1\n  creationTimestamp: \"2026-01-01T00:00:00Z\"\n  \
         labels: {{app.kubernetes.io/name: app{i}, app.kubernetes.io/part-of: bench{labels}}}\n",
        ns = i % 50,
        rv = 100_000 + i,
    )
}

fn cluster() -> Store {
    let mut yaml = String::new();
    for i in 0..OBJECTS {
        yaml.push_str(&format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n{meta}\
             spec:\n  parentRefs: [{{name: edge, namespace: infra}}]\n  hostnames: [app{i}.example.com]\n  \
             rules:\n  - matches: [{{path: {{type: PathPrefix, value: /api}}}}, \
             {{path: {{type: Exact, value: /health}}, headers: [{{name: x-canary, value: \"true\"}}]}}]\n    \
             backendRefs: [{{name: svc{i}, port: 80}}]\n\
             status:\n  parents:\n  - parentRef: {{name: edge, namespace: infra}}\n    \
             controllerName: coxswain-labs.dev/gateway-controller\n    conditions:\n    \
             - {{type: Accepted, status: \"True\", reason: Accepted, message: Accepted, observedGeneration: 1, \
             lastTransitionTime: \"2026-01-01T00:00:01Z\"}}\n    \
             - {{type: ResolvedRefs, status: \"True\", reason: ResolvedRefs, message: Resolved, observedGeneration: 1, \
             lastTransitionTime: \"2026-01-01T00:00:01Z\"}}\n",
            meta = metadata(&format!("r{i}"), i, ""),
        ));
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\n{meta}\
             spec:\n  type: ClusterIP\n  clusterIP: 10.96.{a}.{b}\n  clusterIPs: [10.96.{a}.{b}]\n  \
             ipFamilies: [IPv4]\n  ipFamilyPolicy: SingleStack\n  sessionAffinity: None\n  \
             internalTrafficPolicy: Cluster\n  selector: {{app.kubernetes.io/name: app{i}}}\n  \
             ports: [{{name: http, port: 80, protocol: TCP, targetPort: 8080}}]\n",
            meta = metadata(&format!("svc{i}"), i, ""),
            a = i / 250,
            b = i % 250,
        ));
        let endpoints: Vec<String> = (0..3)
            .map(|e| {
                format!(
                    "{{addresses: [10.{e}.{a}.{b}], conditions: {{ready: true, serving: true, terminating: false}}, \
                     nodeName: node-{e}, targetRef: {{kind: Pod, name: app{i}-{e}, namespace: bench-{ns}, \
                     uid: 0b7d0c3e-0000-4000-8000-{i:012}}}}}",
                    a = i / 250,
                    b = i % 250,
                    ns = i % 50,
                )
            })
            .collect();
        yaml.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n{meta}\
             addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints: [{}]\n",
            endpoints.join(", "),
            meta = metadata(
                &format!("svc{i}-x7k2p"),
                i,
                &format!(", kubernetes.io/service-name: svc{i}"),
            ),
        ));
    }
    let mut store = Store::default();
    let mut errors = Vec::new();
    store.load_yaml(Path::new("bench.yaml"), &yaml, &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(store.http_routes.len(), OBJECTS);
    assert_eq!(store.services.len(), OBJECTS);
    assert_eq!(store.endpoint_slices.len(), OBJECTS);
    store
}

/// The three lists as the reflector copied them before: every object cloned.
struct Deep {
    http_routes: Vec<HttpRoute>,
    services: Vec<Service>,
    endpoint_slices: Vec<EndpointSlice>,
}

fn deep(store: &Store) -> Deep {
    fn clone<K: Clone>(list: &Objects<K>) -> Vec<K> {
        list.iter().map(|k| K::clone(k)).collect()
    }
    Deep {
        http_routes: clone(&store.http_routes),
        services: clone(&store.services),
        endpoint_slices: clone(&store.endpoint_slices),
    }
}

/// The three lists as the reflector copied them until its caches kept persistent vectors: one
/// pointer per object.
struct Shared {
    http_routes: Vec<Arc<HttpRoute>>,
    services: Vec<Arc<Service>>,
    endpoint_slices: Vec<Arc<EndpointSlice>>,
}

fn shared(store: &Store) -> Shared {
    Shared {
        http_routes: store.http_routes.iter().cloned().collect(),
        services: store.services.iter().cloned().collect(),
        endpoint_slices: store.endpoint_slices.iter().cloned().collect(),
    }
}

/// The three lists as the reflector copies them now.
fn persistent(store: &Store) -> (Objects<HttpRoute>, Objects<Service>, Objects<EndpointSlice>) {
    (
        store.http_routes.clone(),
        store.services.clone(),
        store.endpoint_slices.clone(),
    )
}

/// Resident bytes of this process, or 0 where /proc is missing.
fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn bench(c: &mut Criterion) {
    let store = cluster();
    // The small copy first: a freed deep copy's pages would otherwise be reused unseen.
    let before = resident();
    let one_shared = black_box(shared(&store));
    let after_shared = resident();
    let one_deep = black_box(deep(&store));
    let after_deep = resident();
    let mb = |bytes: u64| bytes as f64 / 1e6;
    println!(
        "resident memory one copy adds, {OBJECTS} each of HTTPRoute, Service, EndpointSlice: \
         Vec<K> {:.1} MB, Vec<Arc<K>> {:.1} MB",
        mb(after_deep.saturating_sub(after_shared)),
        mb(after_shared.saturating_sub(before)),
    );
    assert_eq!(one_deep.http_routes.len(), one_shared.http_routes.len());
    assert_eq!(one_deep.services.len(), one_shared.services.len());
    assert_eq!(
        one_deep.endpoint_slices.len(),
        one_shared.endpoint_slices.len()
    );
    drop((one_deep, one_shared));

    let mut group = c.benchmark_group("snapshot_copy_20k_routes_services_slices");
    group.sample_size(20);
    group.bench_function("vec_k_deep_clone", |b| b.iter(|| deep(black_box(&store))));
    group.bench_function("vec_arc_k", |b| b.iter(|| shared(black_box(&store))));
    group.bench_function("persistent", |b| b.iter(|| persistent(black_box(&store))));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
