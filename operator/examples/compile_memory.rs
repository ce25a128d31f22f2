//! What the compiler keeps in memory at N routes (the shape `make bench-propagation` creates:
//! one hostname per route, a Service with one endpoint per 10 routes, one Gateway): the
//! process's VmRSS with the objects loaded, then with one of
//! - `full`: a full compile's output kept (what the controller holds between passes);
//! - `memo`: the incremental compiler after one pass over every route, its output dropped
//!   (the memo alone);
//! - `memo-bulk`: the same routes arriving 50 at a time, a pass after each batch (a bulk
//!   create as the controller sees it).
//!
//! Each mode runs in its own process, with jemalloc returning freed pages at once, so VmRSS
//! counts what is live plus the pages fragmentation pins:
//!
//! ```text
//! cargo build --release -p coxswain-operator --example compile_memory
//! for mode in objects full memo memo-bulk; do
//!   _RJEM_MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0 \
//!     target/release/examples/compile_memory $mode 20000
//! done
//! ```

use coxswain_operator::compile::{self, Store};
use std::path::Path;

/// The controller's allocator (operator/src/main.rs).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn objects(routes: usize) -> Store {
    let mut yaml = String::from(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: coxswain}\n\
         spec: {controllerName: coxswain-labs.dev/gateway-controller}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n\
         metadata: {name: bench, namespace: bench}\n\
         spec: {gatewayClassName: coxswain, listeners: [{name: http, port: 80, protocol: HTTP}]}\n",
    );
    for s in 0..routes.div_ceil(10) {
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc{s}, namespace: bench}}\n\
             spec: {{ports: [{{name: http, port: 8080}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: svc{s}-a, namespace: bench, \
             labels: {{kubernetes.io/service-name: svc{s}}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: 8080}}]\n\
             endpoints: [{{addresses: [10.0.{}.{}]}}]\n",
            s / 250,
            s % 250
        ));
    }
    for r in 0..routes {
        yaml.push_str(&format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
             metadata: {{name: r{r}, namespace: bench, generation: 1, \
             creationTimestamp: '2026-01-01T00:00:00Z'}}\n\
             spec: {{parentRefs: [{{name: bench}}], hostnames: [r{r}.bench.example], \
             rules: [{{backendRefs: [{{name: svc{}, port: 8080}}]}}]}}\n",
            r / 10
        ));
    }
    let mut store = Store::default();
    let mut errors = Vec::new();
    store.load_yaml(Path::new("bench.yaml"), &yaml, &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    store
}

fn vm_rss() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .map_or_else(|| "unknown".to_owned(), |v| v.trim().to_owned())
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "objects".to_owned());
    let routes: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(20_000);
    let mut store = objects(routes);
    let config = compile::Config::default();
    let mut compiler = compile::Compiler::default();
    // Held until the process ends, so VmRSS counts it.
    let mut kept = None;
    match mode.as_str() {
        "objects" => {}
        "full" => kept = Some(compile::compile(&store, &config)),
        "memo" => drop(compiler.compile(&store, &config)),
        "memo-bulk" => {
            let all: Vec<_> = std::mem::take(&mut store.http_routes).into_iter().collect();
            for batch in all.chunks(50) {
                store.http_routes.extend(batch.iter().cloned());
                drop(compiler.compile(&store, &config));
            }
        }
        other => {
            eprintln!("unknown mode {other}: objects, full, memo or memo-bulk");
            std::process::exit(2);
        }
    }
    println!(
        "{mode} at {routes} routes: VmRSS {} (routes kept by the memo: {}, full output kept: {})",
        vm_rss(),
        compiler.kept_routes(),
        kept.is_some()
    );
}
