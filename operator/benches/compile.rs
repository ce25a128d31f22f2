//! Full compile of a large cluster: 10,000 HTTPRoutes over 1,000 hostnames on one Gateway,
//! 100 Services. `make bench` runs it; it is a benchmark, not a test.

use coxswain_operator::compile::{self, Store};
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use std::path::Path;

/// The controller's allocator (operator/src/main.rs): glibc's spends a quarter of a large
/// compile consolidating and unlinking chunks, which the controller never pays.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn large_store(routes: usize, hosts: usize, services: usize) -> Store {
    let mut yaml = String::from(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: coxswain}\n\
         spec: {controllerName: coxswain-labs.dev/gateway-controller}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: edge, namespace: bench}\n\
         spec: {gatewayClassName: coxswain, listeners: [{name: http, port: 80, protocol: HTTP}]}\n",
    );
    for s in 0..services {
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc{s}, namespace: bench}}\n\
             spec: {{ports: [{{name: http, port: 80}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: svc{s}-a, namespace: bench, labels: {{kubernetes.io/service-name: svc{s}}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: 8080}}]\n\
             endpoints: [{{addresses: [10.0.{}.{}]}}, {{addresses: [10.1.{}.{}]}}]\n",
            s / 250,
            s % 250,
            s / 250,
            s % 250
        ));
    }
    for r in 0..routes {
        let host = r % hosts;
        let svc = r % services;
        yaml.push_str(&[
            "---".to_owned(),
            "apiVersion: gateway.networking.k8s.io/v1".to_owned(),
            "kind: HTTPRoute".to_owned(),
            format!("metadata: {{name: r{r}, namespace: bench}}"),
            "spec:".to_owned(),
            "  parentRefs: [{name: edge}]".to_owned(),
            format!("  hostnames: [h{host}.example.com]"),
            "  rules:".to_owned(),
            format!("  - matches: [{{path: {{type: PathPrefix, value: /api/{r}}}}}, {{path: {{type: Exact, value: /x/{r}}}, headers: [{{name: x-v, value: \"{r}\"}}]}}]"),
            format!("    backendRefs: [{{name: svc{svc}, port: 80}}]\n"),
        ]
        .join("\n"));
    }
    let mut store = Store::default();
    let mut errors = Vec::new();
    store.load_yaml(Path::new("bench.yaml"), &yaml, &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(store.http_routes.len(), routes);
    store
}

fn env_count(name: &str) -> Option<usize> {
    std::env::var(name).ok()?.parse().ok()
}

fn bench(c: &mut Criterion) {
    // COXSWAIN_BENCH_ROUTES=N: N routes, one hostname each, a Service per 10 (the shape
    // `make bench-propagation` creates), instead of the default 10,000 over 1,000 hostnames.
    if let Some(routes) = env_count("COXSWAIN_BENCH_ROUTES") {
        let store = large_store(routes, routes, (routes / 10).max(1));
        let config = compile::Config::default();
        let snapshot = &compile::compile(&store, &config).snapshots[&compile::ScopeKey::SharedPool];
        eprintln!(
            "{routes} routes: the shared pool's snapshot encodes to {} bytes",
            snapshot.encoded().len()
        );
        let mut group = c.benchmark_group("compile");
        group.sample_size(10);
        group.bench_function(format!("{routes}_httproutes_one_host_each"), |b| {
            b.iter(|| compile::compile(black_box(&store), black_box(&config)))
        });
        // What the controller does per route change: one route is a new object (as a watch
        // event makes it); the incremental compiler compiles it and reuses the others.
        let mut store = store;
        let mut compiler = compile::Compiler::default();
        compiler.compile(&store, &config);
        let mut next = 0;
        group.bench_function(
            format!("{routes}_httproutes_one_changed_incremental"),
            |b| {
                b.iter(|| {
                    let route = &mut store.http_routes[next % routes];
                    *route = std::sync::Arc::new((**route).clone());
                    next += 1;
                    compiler.compile(black_box(&store), black_box(&config))
                })
            },
        );
        group.finish();
        let reuse = compiler.reuse();
        eprintln!(
            "incremental: {} routes compiled, {} reused",
            reuse.compiled, reuse.reused
        );
        return;
    }
    let store = large_store(10_000, 1_000, 100);
    let config = compile::Config::default();
    let compiled = compile::compile(&store, &config);
    let vhosts = compiled.snapshots[&compile::ScopeKey::SharedPool].listeners[0]
        .virtual_hosts
        .len();
    assert_eq!(
        vhosts, 1_001,
        "1,000 hostnames and the listener's catch-all"
    );
    let mut group = c.benchmark_group("compile");
    group.sample_size(10);
    group.bench_function("10k_httproutes_1k_hosts", |b| {
        b.iter(|| compile::compile(black_box(&store), black_box(&config)))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
