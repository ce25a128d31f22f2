//! The compiler: Kubernetes objects in, routing snapshots per proxy scope and status decisions
//! out. A pure function of its input: no I/O, no clock, and the same objects in any order give
//! byte-identical snapshots.
//!
//! Pipeline: GatewayClasses and Gateways ([`gateway`]) decide which listeners exist;
//! BackendTLSPolicies ([`backendtls`]) which Service ports get verified TLS and
//! CoxswainBackendPolicies ([`backendpolicy`]) which load balancer they get; HTTPRoutes,
//! GRPCRoutes and TLSRoutes ([`httproute`], read in the shared [`route`] form that
//! [`grpcroute`] and [`l4route`] convert to) and Ingresses ([`ingress`]) become route
//! [`entries`] on those listeners; [`assemble`] groups entries into
//! virtual hosts in precedence order per port and scope, and seals each snapshot with its
//! content hash.

pub mod accesspolicy;
pub mod annotations;
pub mod assemble;
pub mod backend;
pub mod backend_clients;
pub mod backendpolicy;
pub mod backendtls;
pub mod clusters;
pub mod encode;
pub mod entries;
pub mod filters;
pub mod gateway;
pub mod gateway_services;
pub mod gateway_tls;
pub mod global_limit;
pub mod grpcroute;
pub mod hostname;
pub mod htpasswd;
pub mod httproute;
pub mod incremental;
pub mod ingress;
pub mod jwks;
pub mod l4route;
pub mod listener_set;
pub mod listeners;
pub mod memo;
pub mod proxies;
pub mod refs;
pub mod route;
pub mod rules;
pub mod status;
pub mod store;
#[cfg(test)]
mod tests;
pub mod totals;

use coxswain_api::names;
use coxswain_api::snapshot::{self as snap, Sealed};
pub use incremental::Compiler;
use proxies::{ProxyAccounts, ProxyNames};
pub use status::ScopeKey;
use status::{ObjectKey, StatusDecisions};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
pub use store::{JwksSource, Store};

/// What the compiler needs besides the objects.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// GatewayClass / IngressClass `spec.controller` this controller serves.
    pub controller_name: String,
    /// Ports the shared pool serves Ingresses on.
    pub ingress_http_port: u32,
    pub ingress_https_port: u32,
    /// The installed Gateway API release (the CRDs' `gateway.networking.k8s.io/bundle-version`
    /// annotation), when known: GatewayClasses then carry `SupportedVersion`.
    pub gateway_api_version: Option<String>,
    /// Read `nginx.ingress.kubernetes.io/` annotations as their Coxswain equivalents
    /// (`--ingress-nginx-compat`).
    pub ingress_nginx_compat: bool,
    /// The shared proxy pool's ServiceAccount: the identity that may serve the shared pool.
    /// Its namespace is the controller's, where shared Gateways' Services live.
    pub shared_proxy_account: ObjectKey,
    /// Internal ports for shared Gateways' own Services ([`gateway_services`]). None: shared
    /// Gateways are served on their listener ports themselves, all behind one address (the
    /// proxies bind them directly: host networking, tests without a Service network).
    pub shared_gateway_ports: Option<gateway_services::PortRange>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            controller_name: names::CONTROLLER_NAME.to_owned(),
            ingress_http_port: 80,
            ingress_https_port: 443,
            gateway_api_version: None,
            ingress_nginx_compat: false,
            shared_proxy_account: ObjectKey::new(
                names::DEFAULT_NAMESPACE,
                names::SHARED_PROXY_SERVICE_ACCOUNT,
            ),
            shared_gateway_ports: None,
        }
    }
}

/// The compiler's output.
#[derive(Debug, Clone, Default)]
pub struct Compiled {
    /// One sealed snapshot per scope, with the encoding its version was taken over (what the
    /// discovery hub sends). The shared pool always has one (possibly empty), so shared
    /// proxies have something to serve.
    pub snapshots: BTreeMap<ScopeKey, Sealed>,
    /// Each snapshot's version, which stays when the controller hands the snapshots to the
    /// hub: status waits for the proxies to serve it.
    pub versions: BTreeMap<ScopeKey, String>,
    /// How many routes the snapshots list in all (a route under two hosts counts twice).
    pub routes: usize,
    pub status: StatusDecisions,
    /// The dedicated Gateways' proxies' names, assigned over all of them at once.
    pub proxy_names: ProxyNames,
    /// Which ServiceAccount's proxies may serve each scope: the bootstrap allowlist and the
    /// discovery hub's, as they are.
    pub proxy_accounts: ProxyAccounts,
    /// Shared Gateways' own Services and their internal ports (empty without
    /// `Config::shared_gateway_ports`).
    pub gateway_services: gateway_services::Allocation,
}

/// Every route of every kind, as stored: HTTPRoutes, GRPCRoutes, TLSRoutes, TCPRoutes,
/// UDPRoutes, each kind in the store's order.
fn stored_routes(store: &Store) -> Vec<route::StoredRoute<'_>> {
    use route::StoredRoute;
    let http = store.http_routes.iter().map(StoredRoute::Http);
    let grpc = store.grpc_routes.iter().map(StoredRoute::Grpc);
    let tls = store.tls_routes.iter().map(StoredRoute::Tls);
    let tcp = store.tcp_routes.iter().map(StoredRoute::Tcp);
    let udp = store.udp_routes.iter().map(StoredRoute::Udp);
    http.chain(grpc).chain(tls).chain(tcp).chain(udp).collect()
}

/// A stored route in the shared form. The conversions run here, at the root, so the route
/// compiler and the converters depend on the shared form and not on each other.
fn route_form(stored: route::StoredRoute<'_>) -> route::RouteForm<'_> {
    use route::{RouteForm, StoredRoute};
    match stored {
        StoredRoute::Http(r) => RouteForm::http(r).read_from(r),
        StoredRoute::Grpc(r) => grpcroute::as_route_form(r).read_from(r),
        StoredRoute::Tls(r) => l4route::tls_route_form(r).read_from(r),
        StoredRoute::Tcp(r) => l4route::tcp_route_form(r).read_from(r),
        StoredRoute::Udp(r) => l4route::udp_route_form(r).read_from(r),
    }
}

/// Compiles everything from scratch. [`Compiler`] gives the same output, compiling again only
/// the routes whose input changed since its last pass.
pub fn compile(store: &Store, config: &Config) -> Compiled {
    compile_with(store, config, None)
}

fn compile_with(store: &Store, config: &Config, kept: Option<&mut Compiler>) -> Compiled {
    let index = refs::Index::new(store);
    let mut gateways = gateway::compile(store, &index, config);
    let gateway_services = match config.shared_gateway_ports {
        Some(range) => {
            let allocation = gateway_services::allocate(
                store,
                &config.shared_proxy_account.namespace,
                range,
                &[config.ingress_http_port, config.ingress_https_port],
                &gateways.served,
                |key| {
                    gateways
                        .gateway_status
                        .get(key)
                        .map(|s| s.requested_addresses.clone())
                        .unwrap_or_default()
                },
            );
            // Each shared Gateway's listeners move to its internal ports; one without a port
            // serves nothing rather than share a port with every other Gateway.
            for gw in gateways.served.values_mut() {
                if gw.scope != ScopeKey::SharedPool {
                    continue;
                }
                let service = allocation.services.get(&gw.key);
                for l in &mut gw.listeners {
                    match service.and_then(|s| s.internal(l.port, l.protocol)) {
                        Some(internal) => l.bind_port = internal,
                        None => l.programmable = false,
                    }
                }
            }
            allocation
        }
        None => gateway_services::Allocation::default(),
    };
    // A full compile is an incremental one from nothing: both run the same code.
    let mut fresh = (memo::RouteMemo::default(), assemble::Assembly::default());
    let (memo, assembly) = match kept {
        Some(k) => k.kept_for(&gateways.served, config),
        None => (&mut fresh.0, &mut fresh.1),
    };
    let routes = httproute::compile(
        &stored_routes(store),
        route_form,
        store,
        &index,
        &gateways.served,
        config,
        memo,
    );
    let totals = &memo.totals;
    let mut ingresses = ingress::compile(store, &index, config);
    for (i, e) in ingresses.entries.iter_mut().enumerate() {
        Arc::make_mut(e).ordinal = u32::try_from(i).unwrap_or(u32::MAX);
    }

    let backend_tls_policies = index
        .backend_tls
        .decided
        .iter()
        .filter_map(|(policy, decided)| {
            let gateways: BTreeSet<&ObjectKey> = decided
                .services
                .iter()
                .flat_map(|s| totals.gateways_of(s))
                .collect();
            let ancestors: Vec<status::RouteParentStatus> = gateways
                .into_iter()
                .map(|gw| status::RouteParentStatus {
                    parent_ref: status::ParentRef {
                        group: refs::GATEWAY_GROUP.into(),
                        kind: "Gateway".into(),
                        namespace: gw.namespace.clone(),
                        name: gw.name.clone(),
                        section_name: None,
                        port: None,
                    },
                    controller_name: config.controller_name.clone(),
                    conditions: decided.conditions.clone(),
                })
                .collect();
            (!ancestors.is_empty()).then(|| (policy.clone(), ancestors))
        })
        .collect();
    let backend_policies = backend_policy_ancestors(
        &index.backend_policy,
        totals,
        &ingresses.service_classes,
        config,
    );
    let mut access = accesspolicy::compile(store, &index);
    // Without policies that rewrite entries, the assembler is given the routes' entries as the
    // route compiler keeps them, and then only what changed since the last pass.
    let routes_as_kept = !access.rewrites_entries() && gateways.shared_backend_clients.is_empty();
    let changed = routes
        .changed
        .filter(|_| routes_as_kept && assembly.takes_changes());
    // Every entry: the routes' in the order the pass met them, then the Ingresses'.
    let listed = || {
        let mut all = memo.entries();
        all.extend(ingresses.entries.iter().cloned());
        all
    };
    let mut entries = Vec::new();
    if changed.is_none() {
        entries = listed();
        accesspolicy::apply(&mut access, &mut entries);
    }
    let access_policies = accesspolicy::ancestors(&access, &config.controller_name);
    let [http_status, grpc_status, tls_status, tcp_status, udp_status] = routes.status;
    let mut status = StatusDecisions {
        gateway_classes: gateways.class_status,
        gateways: gateways.gateway_status,
        listener_sets: gateways.listener_set_status,
        http_routes: http_status,
        grpc_routes: grpc_status,
        tls_routes: tls_status,
        tcp_routes: tcp_status,
        udp_routes: udp_status,
        backend_tls_policies,
        backend_policies,
        access_policies,
        ingresses: ingresses.status,
        ingress_classes: ingresses.class_problems,
    };
    for ((gw, owner, listener), count) in &routes.attached {
        let listeners = match owner {
            None => status.gateways.get_mut(gw).map(|g| &mut g.listeners),
            Some(ls) => status.listener_sets.get_mut(ls).map(|s| &mut s.listeners),
        };
        if let Some(l) = listeners.and_then(|ls| ls.iter_mut().find(|l| &l.name == listener)) {
            l.attached_routes = *count;
        }
    }

    // Every listener becomes a slot on its port, even with no routes: a request for its
    // hostname must not fall through to a less specific listener (listener isolation).
    let mut slots: Vec<Slot> = Vec::new();
    for gw in gateways.served.values() {
        for l in gw.listeners.iter().filter(|l| l.programmable) {
            slots.push(Slot {
                scope: gw.scope.clone(),
                port: l.bind_port,
                public_port: if l.bind_port == l.port { 0 } else { l.port },
                protocol: l.protocol,
                hostname: l.hostname.clone(),
                source: match &l.owner {
                    Some(ls) => format!("ListenerSet/{ls}/{}", l.name),
                    None => format!("Gateway/{}/{}", gw.key, l.name),
                },
                certificate: l
                    .certificate
                    .clone()
                    .map(|c| (l.hostname.clone().unwrap_or_default(), c)),
                client_validation: l.client_validation.clone(),
                terminate_tls: l.terminate_tls,
            });
        }
    }
    slots.extend(ingresses.slots);

    let mut certificates = gateways.certificates;
    certificates.extend(ingresses.certificates);
    let mut clusters = routes.clusters;
    clusters.extend(ingresses.clusters.into_iter().map(Arc::new));
    clusters.extend(access.clusters.drain(..).map(Arc::new));
    // One cluster per Service port, whichever route sends to it: a policy's choice, else the
    // Ingress annotations'. Copied only where that changes it.
    for c in &mut clusters {
        let load_balancer = match index.backend_policy.for_cluster(&c.name) {
            Some((_, lb)) => Some(lb.clone()),
            None => ingresses
                .load_balancers
                .get(
                    c.name
                        .strip_suffix(refs::H2C_CLUSTER_SUFFIX)
                        .unwrap_or(&c.name),
                )
                .cloned(),
        };
        if c.load_balancer != load_balancer {
            Arc::make_mut(c).load_balancer = load_balancer;
        }
    }

    backend_clients::give_own_clusters(
        &mut entries,
        &mut clusters,
        &gateways.shared_backend_clients,
    );
    let inputs = assemble::Inputs {
        slots,
        clusters,
        certificates: &certificates,
        served: &gateways.served,
        backend_clients: &gateways.backend_clients,
    };
    let entries = match changed {
        Some((removed, added)) => assemble::Entries::Changes {
            removed,
            added,
            others: ingresses.entries.clone(),
            all: &listed,
        },
        None => assemble::Entries::Full {
            routes: entries.len() - ingresses.entries.len(),
            all: entries,
        },
    };
    let assembled = assembly.assemble(entries, routes_as_kept, inputs);
    // Dedicated Gateways' proxies are named in one assignment over all of them (two can want
    // the same name), and those names are the identities that may serve their scopes.
    let proxy_names = proxies::assign(store, |key| {
        status.gateways.get(key).is_some_and(|s| s.dedicated)
    });
    let proxy_accounts = ProxyAccounts::new(config.shared_proxy_account.clone(), &proxy_names);
    let versions = assembled
        .snapshots
        .iter()
        .map(|(scope, s)| (scope.clone(), s.version().to_owned()))
        .collect();
    Compiled {
        snapshots: assembled.snapshots,
        routes: assembled.routes,
        versions,
        status,
        proxy_names,
        proxy_accounts,
        gateway_services,
    }
}

/// `status.ancestors` of every CoxswainBackendPolicy: the Gateways and IngressClasses whose
/// routes send to a Service it targets; while there is none, the first targeted Service, so a
/// policy with a typo in its target still hears about it.
fn backend_policy_ancestors(
    policies: &backendpolicy::Output,
    routes: &totals::Totals,
    service_classes: &BTreeMap<(String, String), BTreeSet<String>>,
    config: &Config,
) -> BTreeMap<ObjectKey, Vec<status::PolicyAncestorStatus>> {
    let mut out = BTreeMap::new();
    for (policy, decided) in &policies.decided {
        let mut found: BTreeSet<status::AncestorRef> = BTreeSet::new();
        for service in &decided.services {
            for gw in routes.gateways_of(service) {
                found.insert(status::AncestorRef {
                    group: refs::GATEWAY_GROUP.into(),
                    kind: "Gateway".into(),
                    namespace: Some(gw.namespace.clone()),
                    name: gw.name.clone(),
                });
            }
            for class in service_classes.get(service).into_iter().flatten() {
                found.insert(status::AncestorRef {
                    group: "networking.k8s.io".into(),
                    kind: "IngressClass".into(),
                    namespace: None,
                    name: class.clone(),
                });
            }
        }
        let mut found: Vec<status::AncestorRef> = found.into_iter().collect();
        if found.is_empty() {
            found.extend(decided.first_target.clone());
        }
        // The CRD keeps at most 16 entries; the sorted first ones are written.
        found.truncate(16);
        let ancestors = found
            .into_iter()
            .map(|ancestor_ref| status::PolicyAncestorStatus {
                ancestor_ref,
                controller_name: config.controller_name.clone(),
                conditions: decided.conditions.clone(),
            })
            .collect();
        out.insert(policy.clone(), ancestors);
    }
    out
}

/// A listener as the assembler sees it.
#[derive(Debug, Clone)]
pub struct Slot {
    pub scope: ScopeKey,
    /// The port the proxies listen on.
    pub port: u32,
    /// The port clients addressed, when a Service maps it to another `port`; 0: the same.
    pub public_port: u32,
    pub protocol: snap::Protocol,
    pub hostname: Option<String>,
    pub source: String,
    /// HTTPS, TLS terminated here: (SNI name, "" for the default; certificate name).
    pub certificate: Option<(String, String)>,
    /// HTTPS, TLS terminated here: client certificates verified on this port (one dedicated
    /// Gateway's setting).
    pub client_validation: Option<snap::ClientValidation>,
    /// TLS: the hosts this listener owns end TLS at the proxy (tls.mode Terminate).
    pub terminate_tls: bool,
}
