//! The incremental compiler against the full one: after every change of a random sequence
//! (routes of two kinds, Ingresses, Services, EndpointSlices, a ReferenceGrant, a
//! BackendTLSPolicy, the Gateway's listener), both give the same snapshots and statuses. Unchanged objects keep
//! their `Arc`s across changes, as the reflector's cache keeps them.

use super::fixtures::*;
use crate::compile::store::Objects;
use crate::compile::*;
use proptest::prelude::*;
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

thread_local! {
    /// Whether objects get a uid and a generation as the API server gives them (the
    /// controller's case) or come without, as from files (compared by identity then).
    static VERSIONED: Cell<bool> = const { Cell::new(false) };
}
static NEXT_UID: AtomicU64 = AtomicU64::new(1);

/// Replaces the objects of `into` named like those of `from`, adds the others. Versioned, a
/// replaced object keeps its uid and goes one generation up (every change here is to the
/// spec); a new one gets a new uid.
fn splice<T: kube::Resource + Clone>(into: &mut Objects<T>, from: Objects<T>) {
    for mut object in from {
        let named = |o: &Arc<T>| {
            o.meta().namespace == object.meta().namespace && o.meta().name == object.meta().name
        };
        let slot = into.iter_mut().find(|o| named(o));
        if VERSIONED.get() {
            let meta = Arc::make_mut(&mut object).meta_mut();
            match &slot {
                Some(old) => {
                    meta.uid = old.meta().uid.clone();
                    meta.generation = Some(old.meta().generation.unwrap_or(0) + 1);
                }
                None => {
                    let n = NEXT_UID.fetch_add(1, Ordering::Relaxed);
                    meta.uid = Some(format!("uid-{n}"));
                    meta.generation = Some(1);
                }
            }
        }
        match slot {
            Some(slot) => *slot = object,
            None => into.push_back(object),
        }
    }
}

fn drop_named<T: kube::Resource + Clone>(from: &mut Objects<T>, namespace: &str, name: &str) {
    from.retain(|o| {
        o.meta().namespace.as_deref() != Some(namespace) || o.meta().name.as_deref() != Some(name)
    });
}

/// Applies one object's YAML to `store` as a watch event would: a new object of that name,
/// every other object kept as it was.
fn put(store: &mut Store, yaml: &str) {
    let new = load(&[yaml]);
    splice(&mut store.gateways, new.gateways);
    splice(&mut store.http_routes, new.http_routes);
    splice(&mut store.grpc_routes, new.grpc_routes);
    splice(&mut store.services, new.services);
    splice(&mut store.endpoint_slices, new.endpoint_slices);
    splice(&mut store.reference_grants, new.reference_grants);
    splice(&mut store.backend_tls_policies, new.backend_tls_policies);
    splice(&mut store.ingresses, new.ingresses);
    splice(&mut store.ingress_classes, new.ingress_classes);
    splice(&mut store.access_policies, new.access_policies);
}

const SERVICES: [(&str, &str); 3] = [("web", "echo"), ("web", "alt"), ("other", "far")];
const HOSTS: [&str; 4] = ["a.example.com", "*.example.com", "b.test", "a.b.test"];

#[derive(Debug, Clone)]
struct Backend {
    service: usize,
    port: i32,
}

#[derive(Debug, Clone)]
enum Change {
    /// Route `n` of one kind (GRPCRoute when `grpc`) created or replaced, in `namespace`, or
    /// deleted (None).
    Route {
        n: usize,
        grpc: bool,
        spec: Option<(bool, Vec<usize>, Vec<Backend>, u8)>,
    },
    /// A Service's ports: 8080 and maybe 9090, or deleted.
    Service { n: usize, ports: Option<bool> },
    /// A Service's endpoints.
    Slice { n: usize, addresses: Vec<u8> },
    /// The ReferenceGrant letting routes in web use Services in other.
    Grant(bool),
    /// A BackendTLSPolicy on echo.
    BackendTls(bool),
    /// The Gateway's second listener: its hostname and whether it takes routes from every
    /// namespace.
    Listener { host: Option<usize>, all: bool },
    /// Ingress `n` (on the shared pool's port 80, beside the Gateway's routes) for a host of
    /// HOSTS, or every host (None), or deleted. A wildcard host is single-label.
    Ingress {
        n: usize,
        host: Option<Option<usize>>,
    },
    /// A CoxswainAccessPolicy rate-limiting route r0 in web, or none. It rewrites the
    /// entries it holds, so the assembler is given every entry instead of the changes.
    Access(bool),
}

fn route_yaml(
    n: usize,
    grpc: bool,
    (other_ns, hosts, backends, created): &(bool, Vec<usize>, Vec<Backend>, u8),
) -> String {
    let ns = if *other_ns { "other" } else { "web" };
    let hostnames: Vec<String> = hosts.iter().map(|h| format!("'{}'", HOSTS[*h])).collect();
    let refs: Vec<String> = backends
        .iter()
        .map(|b| {
            let (svc_ns, svc) = SERVICES[b.service];
            format!("{{name: {svc}, namespace: {svc_ns}, port: {}}}", b.port)
        })
        .collect();
    let (kind, rule) = if grpc {
        (
            "GRPCRoute",
            format!("{{backendRefs: [{}]}}", refs.join(", ")),
        )
    } else {
        (
            "HTTPRoute",
            format!(
                "{{matches: [{{path: {{type: PathPrefix, value: /p{n}}}}}], backendRefs: [{}]}}",
                refs.join(", ")
            ),
        )
    };
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: {kind}\nmetadata: {{name: r{n}, \
         namespace: {ns}, creationTimestamp: '2026-01-01T00:00:{created:02}Z'}}\nspec:\n  \
         parentRefs: [{{name: edge, namespace: web}}]\n  hostnames: [{}]\n  rules: [{rule}]\n",
        hostnames.join(", ")
    )
}

fn apply(store: &mut Store, change: &Change) {
    match change {
        Change::Route { n, grpc, spec } => match spec {
            Some(spec) => {
                // A route moving namespace is a delete and a create.
                let other = if spec.0 { "web" } else { "other" };
                let name = format!("r{n}");
                if *grpc {
                    drop_named(&mut store.grpc_routes, other, &name);
                } else {
                    drop_named(&mut store.http_routes, other, &name);
                }
                put(store, &route_yaml(*n, *grpc, spec));
            }
            None => {
                for ns in ["web", "other"] {
                    let name = format!("r{n}");
                    if *grpc {
                        drop_named(&mut store.grpc_routes, ns, &name);
                    } else {
                        drop_named(&mut store.http_routes, ns, &name);
                    }
                }
            }
        },
        Change::Service { n, ports } => {
            let (ns, name) = SERVICES[*n];
            match ports {
                None => drop_named(&mut store.services, ns, name),
                Some(two) => {
                    let extra = if *two {
                        ", {name: admin, port: 9090, targetPort: 4000}"
                    } else {
                        ""
                    };
                    put(
                        store,
                        &format!(
                            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: \
                             {ns}}}\nspec:\n  ports: [{{name: http, port: 8080, targetPort: \
                             3000}}{extra}]\n"
                        ),
                    );
                }
            }
        }
        Change::Slice { n, addresses } => {
            let (ns, name) = SERVICES[*n];
            let endpoints: Vec<String> = addresses
                .iter()
                .map(|a| format!("{{addresses: [10.2.{n}.{a}]}}"))
                .collect();
            put(
                store,
                &format!(
                    "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: \
                     {name}-1, namespace: {ns}, labels: {{kubernetes.io/service-name: {name}}}}}\n\
                     addressType: IPv4\nports: [{{name: http, port: 3000}}, {{name: admin, port: \
                     4000}}]\nendpoints: [{}]\n",
                    endpoints.join(", ")
                ),
            );
        }
        Change::Grant(false) => drop_named(&mut store.reference_grants, "other", "web-routes"),
        Change::Grant(true) => put(
            store,
            "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: \
             {name: web-routes, namespace: other}\nspec:\n  from: [{group: \
             gateway.networking.k8s.io, kind: HTTPRoute, namespace: web}, {group: \
             gateway.networking.k8s.io, kind: GRPCRoute, namespace: web}]\n  to: [{group: '', \
             kind: Service}]\n",
        ),
        Change::BackendTls(false) => drop_named(&mut store.backend_tls_policies, "web", "echo-tls"),
        Change::BackendTls(true) => put(
            store,
            "apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {name: \
             echo-tls, namespace: web}\nspec:\n  targetRefs: [{group: '', kind: Service, name: \
             echo}]\n  validation: {hostname: echo.internal, wellKnownCACertificates: System}\n",
        ),
        Change::Ingress { n, host: None } => {
            drop_named(&mut store.ingresses, "web", &format!("i{n}"))
        }
        Change::Ingress {
            n,
            host: Some(host),
        } => {
            let host = host.map_or(String::new(), |h| format!("host: '{}', ", HOSTS[h]));
            put(
                store,
                &format!(
                    "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: i{n}, \
                     namespace: web, creationTimestamp: '2026-01-01T00:00:0{n}Z'}}\nspec:\n  \
                     rules:\n  - {{{host}http: {{paths: [{{path: /i{n}, pathType: Prefix, \
                     backend: {{service: {{name: echo, port: {{number: 8080}}}}}}}}]}}}}\n"
                ),
            );
        }
        Change::Access(false) => drop_named(&mut store.access_policies, "web", "limit"),
        Change::Access(true) => put(
            store,
            "apiVersion: gateway.coxswain-labs.dev/v1alpha1\nkind: CoxswainAccessPolicy\n\
             metadata: {name: limit, namespace: web}\nspec:\n  targetRefs: [{group: \
             gateway.networking.k8s.io, kind: HTTPRoute, name: r0}]\n  rateLimit: {requests: \
             10, burst: 5}\n",
        ),
        Change::Listener { host, all } => {
            let hostname = host.map_or(String::new(), |h| format!(", hostname: '{}'", HOSTS[h]));
            let from = if *all { "All" } else { "Same" };
            put(
                store,
                &format!(
                    "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: \
                     edge, namespace: web}}\nspec:\n  gatewayClassName: coxswain\n  listeners:\n  \
                     - {{name: http, port: 80, protocol: HTTP, allowedRoutes: {{namespaces: \
                     {{from: All}}}}}}\n  - {{name: second, port: 8000, protocol: HTTP{hostname}, \
                     allowedRoutes: {{namespaces: {{from: {from}}}}}}}\n"
                ),
            );
        }
    }
}

fn change() -> impl Strategy<Value = Change> {
    let backend = (0..SERVICES.len(), prop_oneof![Just(8080), Just(9090)])
        .prop_map(|(service, port)| Backend { service, port });
    let spec = (
        any::<bool>(),
        prop::collection::vec(0..HOSTS.len(), 0..3),
        prop::collection::vec(backend, 1..3),
        0u8..4,
    );
    prop_oneof![
        6 => (0usize..5, any::<bool>(), prop::option::weighted(0.85, spec))
            .prop_map(|(n, grpc, spec)| Change::Route { n, grpc, spec }),
        1 => (0..SERVICES.len(), prop::option::weighted(0.8, any::<bool>()))
            .prop_map(|(n, ports)| Change::Service { n, ports }),
        3 => (0..SERVICES.len(), prop::collection::vec(1u8..6, 0..3))
            .prop_map(|(n, addresses)| Change::Slice { n, addresses }),
        1 => any::<bool>().prop_map(Change::Grant),
        1 => any::<bool>().prop_map(Change::BackendTls),
        1 => (prop::option::of(0..HOSTS.len()), any::<bool>())
            .prop_map(|(host, all)| Change::Listener { host, all }),
        2 => (0usize..3, prop::option::weighted(0.8, prop::option::of(0..HOSTS.len())))
            .prop_map(|(n, host)| Change::Ingress { n, host }),
        1 => any::<bool>().prop_map(Change::Access),
    ]
}

fn start() -> Store {
    let mut store = load(&[BASE, INGRESS_CLASS]);
    apply(
        &mut store,
        &Change::Listener {
            host: None,
            all: true,
        },
    );
    for n in 0..SERVICES.len() {
        apply(
            &mut store,
            &Change::Service {
                n,
                ports: Some(true),
            },
        );
        apply(
            &mut store,
            &Change::Slice {
                n,
                addresses: vec![1, 2],
            },
        );
    }
    store
}

fn assert_same(incremental: &Compiled, full: &Compiled, after: &[Change]) {
    assert_eq!(incremental.status, full.status, "status after {after:?}");
    assert_eq!(
        incremental.versions, full.versions,
        "versions after {after:?}"
    );
    let bytes = |c: &Compiled| -> Vec<(ScopeKey, bytes::Bytes)> {
        c.snapshots
            .iter()
            .map(|(scope, s)| (scope.clone(), s.encoded().clone()))
            .collect()
    };
    assert!(
        bytes(incremental) == bytes(full),
        "snapshots after {after:?}: {:#?} != {:#?}",
        incremental.snapshots,
        full.snapshots
    );
    assert_eq!(incremental.routes, full.routes);
    assert_eq!(incremental.proxy_names, full.proxy_names);
    assert_eq!(incremental.gateway_services, full.gateway_services);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn incremental_compiles_equal_full_compiles(
        changes in prop::collection::vec(change(), 1..30),
        internal_ports in any::<bool>(),
        versioned in any::<bool>(),
    ) {
        VERSIONED.set(versioned);
        // With internal ports, shared Gateways' listeners move before routes attach to them.
        let config = Config {
            shared_gateway_ports: internal_ports
                .then_some(gateway_services::PortRange::DEFAULT),
            ..Config::default()
        };
        let mut store = start();
        let mut compiler = Compiler::default();
        for (i, c) in changes.iter().enumerate() {
            apply(&mut store, c);
            let incremental = compiler.compile(&store, &config);
            let full = compile(&store, &config);
            assert_same(&incremental, &full, &changes[..=i]);
        }
    }
}

#[test]
fn a_pass_compiles_again_only_the_routes_whose_input_changed() {
    let config = Config::default();
    let mut store = start();
    let route = |n: usize, service: usize| Change::Route {
        n,
        grpc: false,
        spec: Some((
            false,
            vec![0],
            vec![Backend {
                service,
                port: 8080,
            }],
            0,
        )),
    };
    for n in 0..4 {
        apply(&mut store, &route(n, n % 2));
    }
    let mut compiler = Compiler::default();
    let mut pass = |store: &Store| {
        let before = compiler.reuse();
        let incremental = compiler.compile(store, &config);
        assert_same(&incremental, &compile(store, &config), &[]);
        let after = compiler.reuse();
        (
            after.compiled - before.compiled,
            after.reused - before.reused,
        )
    };
    assert_eq!(pass(&store), (4, 0), "the first pass compiles every route");
    assert_eq!(pass(&store), (0, 4), "nothing changed");
    apply(&mut store, &route(2, 1));
    assert_eq!(pass(&store), (1, 3), "one route replaced");
    // alt's endpoints: the routes sending to it (1, 2 and 3), not the one sending to echo.
    apply(
        &mut store,
        &Change::Slice {
            n: 1,
            addresses: vec![4],
        },
    );
    assert_eq!(pass(&store), (3, 1), "alt's endpoints changed");
    // echo's ports: the route sending to it (0), whichever list changed.
    apply(
        &mut store,
        &Change::Service {
            n: 0,
            ports: Some(false),
        },
    );
    assert_eq!(pass(&store), (1, 3), "echo's Service changed");
    apply(&mut store, &Change::Grant(true));
    assert_eq!(pass(&store), (0, 4), "no route reads across namespaces");
    apply(
        &mut store,
        &Change::Listener {
            host: Some(1),
            all: false,
        },
    );
    assert_eq!(
        pass(&store),
        (4, 0),
        "the Gateway changed: every route again"
    );
    apply(
        &mut store,
        &Change::Route {
            n: 0,
            grpc: false,
            spec: None,
        },
    );
    assert_eq!(pass(&store), (0, 3), "one route deleted");
    assert_eq!(
        compiler.kept_routes(),
        3,
        "the deleted route's part is dropped"
    );
}

/// The controller writes a route's status after compiling it, and the cache then holds a new
/// object with the same uid and generation: the next pass keeps the route as compiled. A
/// route from a file (no uid) is told by identity, so the new object is compiled again.
#[test]
fn a_status_write_compiles_nothing_again() {
    let config = Config::default();
    for (versioned, compiled_again) in [(true, 0), (false, 1)] {
        VERSIONED.set(versioned);
        let mut store = start();
        apply(
            &mut store,
            &Change::Route {
                n: 0,
                grpc: false,
                spec: Some((
                    false,
                    vec![0],
                    vec![Backend {
                        service: 0,
                        port: 8080,
                    }],
                    0,
                )),
            },
        );
        let mut compiler = Compiler::default();
        compiler.compile(&store, &config);
        let before = compiler.reuse();
        // The same route with a status, as the watch brings it back.
        let route = &mut store.http_routes[0];
        let mut written = (**route).clone();
        written.status = Some(Default::default());
        *route = Arc::new(written);
        let incremental = compiler.compile(&store, &config);
        assert_same(&incremental, &compile(&store, &config), &[]);
        assert_eq!(
            compiler.reuse().compiled - before.compiled,
            compiled_again,
            "versioned: {versioned}"
        );
    }
    VERSIONED.set(false);
}

#[test]
fn ingresses_share_the_port_with_the_gateways_routes() {
    // The proptest's Ingresses land beside its HTTPRoutes, a wildcard one as a single-label
    // host: what makes the assembler keep two virtual hosts for one name.
    let mut store = start();
    for c in [
        Change::Ingress {
            n: 0,
            host: Some(Some(1)),
        },
        Change::Route {
            n: 0,
            grpc: false,
            spec: Some((
                false,
                vec![1],
                vec![Backend {
                    service: 0,
                    port: 8080,
                }],
                0,
            )),
        },
    ] {
        apply(&mut store, &c);
    }
    let mut compiler = Compiler::default();
    let compiled = compiler.compile(&store, &Config::default());
    let shared = compiled.snapshots[&ScopeKey::SharedPool].snapshot();
    let port = shared.listeners.iter().find(|l| l.port == 80).unwrap();
    let wildcard: Vec<(bool, Vec<&str>)> = port
        .virtual_hosts
        .iter()
        .filter(|v| v.hostname == "*.example.com")
        .map(|v| {
            let kinds = v
                .routes
                .iter()
                .map(|r| r.source.as_ref().unwrap().kind.as_str());
            (v.single_label, kinds.collect())
        })
        .collect();
    assert_eq!(
        wildcard,
        [
            (false, vec!["HTTPRoute"]),
            (true, vec!["Ingress", "HTTPRoute"])
        ]
    );
}
