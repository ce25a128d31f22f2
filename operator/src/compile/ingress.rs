//! Ingresses of our IngressClass(es): rules to routes on the shared pool's HTTP and HTTPS ports.
//!
//! pathType ImplementationSpecific is treated as Prefix (element-wise), the same as Prefix.
//! Host wildcards (`*.example.com`) follow the Gateway API rule (one or more labels), which is
//! wider than Ingress's single label.
//!
//! The load-balance and upstream-hash-by annotations choose for the Service ports an Ingress
//! sends to, not for the Ingress: the proxy has one cluster per Service port. Where Ingresses
//! disagree the oldest (creationTimestamp, then namespace/name) decides, and a
//! CoxswainBackendPolicy on the Service port decides over every annotation.

use super::annotations::{self, Canary, IngressAnnotations};
use super::encode::EncodedRoute;
use super::entries::{Entry, PrecedenceKey};
use super::gateway::ScopeKey;
use super::refs::{self, Index};
use super::status::{AnnotationWarning, IngressStatus, ObjectKey};
use super::store::Store;
use super::{Config, Slot};
use coxswain_api::CoxswainIngressClassParameters;
use coxswain_api::snapshot::{self as snap, Protocol};
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend, IngressClass};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

mod policy;

use policy::RoutePolicy;

const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";

pub struct IngressOutput {
    pub entries: Vec<Arc<Entry>>,
    pub slots: Vec<Slot>,
    pub clusters: Vec<snap::Cluster>,
    pub certificates: BTreeMap<String, (String, String)>,
    pub status: BTreeMap<ObjectKey, IngressStatus>,
    /// IngressClass name -> why its parameters reference is not used.
    pub class_problems: BTreeMap<String, String>,
    /// Cluster name -> the algorithm Ingress annotations chose for it (Service ports a
    /// CoxswainBackendPolicy holds are not here).
    pub load_balancers: BTreeMap<String, snap::LoadBalancer>,
    /// (namespace, Service) -> our IngressClasses whose Ingresses send to it.
    pub service_classes: BTreeMap<(String, String), BTreeSet<String>>,
}

/// The IngressClass an Ingress belongs to, if it is one of ours.
fn our_class<'a>(ingress: &Ingress, ours: &[&'a IngressClass]) -> Option<&'a IngressClass> {
    let by_name = |name: &str| {
        ours.iter()
            .copied()
            .find(|c| c.metadata.name.as_deref() == Some(name))
    };
    let spec_class = ingress
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref());
    let legacy = ingress
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LEGACY_CLASS_ANNOTATION))
        .map(String::as_str);
    match spec_class.or(legacy) {
        Some(name) => by_name(name),
        // No class at all: ours if one of our classes is the cluster default.
        None => ours.iter().copied().find(|c| {
            c.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
                .is_some_and(|v| v == "true")
        }),
    }
}

/// The CoxswainIngressClassParameters an IngressClass points at. Ok(None): the class has no
/// parameters. Err: the reference is wrong or dangling; the class's defaults are then not
/// applied and the reason is reported on the IngressClass.
pub fn class_parameters<'s>(
    store: &'s Store,
    class: &IngressClass,
) -> Result<Option<&'s CoxswainIngressClassParameters>, String> {
    let Some(p) = class.spec.as_ref().and_then(|s| s.parameters.as_ref()) else {
        return Ok(None);
    };
    let group = p.api_group.as_deref().unwrap_or("");
    if group != coxswain_api::names::INGRESS_GROUP || p.kind != "CoxswainIngressClassParameters" {
        return Err(format!(
            "spec.parameters refers to {}/{} {:?}; Coxswain reads only {}/CoxswainIngressClassParameters, so no class defaults apply",
            if group.is_empty() { "core" } else { group },
            p.kind,
            p.name,
            coxswain_api::names::INGRESS_GROUP,
        ));
    }
    // CoxswainIngressClassParameters are namespaced: the reference needs scope Namespace.
    let namespace = match (p.scope.as_deref(), p.namespace.as_deref()) {
        (Some("Namespace"), Some(ns)) if !ns.is_empty() => ns,
        _ => {
            return Err(format!(
                "spec.parameters {:?} needs scope: Namespace and a namespace (CoxswainIngressClassParameters are namespaced); no class defaults apply",
                p.name
            ));
        }
    };
    store
        .ingress_class_parameters
        .iter()
        .find(|c| {
            c.metadata.name.as_deref() == Some(p.name.as_str())
                && c.metadata.namespace.as_deref() == Some(namespace)
        })
        .map(|c| Some(&**c))
        .ok_or_else(|| {
            format!(
                "CoxswainIngressClassParameters {namespace}/{} not found; no class defaults apply",
                p.name
            )
        })
}

/// An Ingress's annotations with its class's defaultAnnotations underneath: the Ingress's own
/// value wins for every key it sets.
pub fn effective_annotations(
    store: &Store,
    class: &IngressClass,
    ingress: &Ingress,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Ok(Some(params)) = class_parameters(store, class) {
        out.extend(params.spec.default_annotations.clone());
    }
    out.extend(ingress.metadata.annotations.clone().unwrap_or_default());
    out
}

/// One path of an Ingress, before it becomes routes.
struct PathRoute {
    host: String,
    m: snap::RouteMatch,
    backend: Result<String, String>,
    rule: u32,
}

/// An Ingress of ours, parsed.
struct Prepared {
    key: ObjectKey,
    class: String,
    created: Option<super::entries::jiff_like::Timestamp>,
    annotations: IngressAnnotations,
    /// The class's parameters say accessLog: false.
    class_access_log_off: bool,
    has_tls: bool,
    paths: Vec<PathRoute>,
    status: IngressStatus,
}

/// Where a canary attaches: host and path match.
type PathKey = (String, i32, String);

fn path_key(p: &PathRoute) -> PathKey {
    let path = p.m.path.clone().unwrap_or_default();
    (p.host.clone(), path.kind, path.value)
}

/// A canary Ingress's backend for one path.
struct CanaryBackend {
    cluster: String,
    canary: Canary,
    from: ObjectKey,
}

pub fn compile(store: &Store, index: &Index<'_>, config: &Config) -> IngressOutput {
    let mut out = IngressOutput {
        entries: Vec::new(),
        slots: Vec::new(),
        clusters: Vec::new(),
        certificates: BTreeMap::new(),
        status: BTreeMap::new(),
        class_problems: BTreeMap::new(),
        load_balancers: BTreeMap::new(),
        service_classes: BTreeMap::new(),
    };
    let ours: Vec<&IngressClass> = store
        .ingress_classes
        .iter()
        .filter(|c| {
            c.spec.as_ref().and_then(|s| s.controller.as_deref())
                == Some(config.controller_name.as_str())
        })
        .map(|c| &**c)
        .collect();
    let empty = BTreeMap::new();
    let mut any_http = false;
    let mut tls_hosts: Vec<(String, String)> = Vec::new();
    let mut prepared: Vec<Prepared> = Vec::new();
    for ingress in &store.ingresses {
        let Some(class) = our_class(ingress, &ours) else {
            continue;
        };
        let key = ObjectKey::new(
            ingress.metadata.namespace.as_deref().unwrap_or("default"),
            ingress.metadata.name.as_deref().unwrap_or_default(),
        );
        let params = match class_parameters(store, class) {
            Ok(p) => p,
            Err(problem) => {
                let class_name = class.metadata.name.clone().unwrap_or_default();
                out.class_problems.entry(class_name).or_insert(problem);
                None
            }
        };
        let (annotations, warnings) = annotations::parse(
            ingress.metadata.annotations.as_ref().unwrap_or(&empty),
            params.map_or(&empty, |p| &p.spec.default_annotations),
            config.ingress_nginx_compat,
        );
        let mut status = IngressStatus {
            warnings,
            ..Default::default()
        };
        let Some(spec) = &ingress.spec else {
            status.problems.push("no spec".into());
            out.status.insert(key, status);
            continue;
        };
        let created = ingress.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let canary = annotations.canary.is_some();

        // TLS: a certificate per listed host (or the default when hosts is empty). A canary's
        // TLS is its primary's business.
        let mut has_tls = false;
        for tls in spec.tls.iter().flatten().filter(|_| !canary) {
            let Some(secret_name) = &tls.secret_name else {
                continue;
            };
            match index
                .secret(&key.namespace, secret_name)
                .ok_or_else(|| format!("TLS Secret {}/{secret_name} not found", key.namespace))
                .and_then(|s| {
                    refs::tls_key_pair(s)
                        .map_err(|m| format!("TLS Secret {}/{secret_name}: {m}", key.namespace))
                }) {
                Ok(pair) => {
                    let cert = format!("{}/{secret_name}", key.namespace);
                    out.certificates.insert(cert.clone(), pair);
                    has_tls = true;
                    let hosts = tls.hosts.clone().unwrap_or_default();
                    if hosts.is_empty() {
                        tls_hosts.push((String::new(), cert.clone()));
                    }
                    for h in hosts {
                        tls_hosts.push((h.to_ascii_lowercase(), cert.clone()));
                    }
                }
                Err(p) => status.problems.push(p),
            }
        }

        let mut paths: Vec<PathRoute> = Vec::new();
        for (ri, rule) in spec.rules.iter().flatten().enumerate() {
            let host = rule.host.clone().unwrap_or_default().to_ascii_lowercase();
            for (pi, path) in rule.http.iter().flat_map(|h| h.paths.iter()).enumerate() {
                let value = path.path.clone().unwrap_or_else(|| "/".into());
                if !value.starts_with('/') {
                    status
                        .problems
                        .push(format!("path {value:?} must start with /"));
                    continue;
                }
                let (kind, value) = match path.path_type.as_str() {
                    "Exact" => (snap::path_match::Kind::Exact, value),
                    "ImplementationSpecific" if annotations.regex_paths() => {
                        // NGINX regex locations: case-insensitive, anchored at the start only.
                        let pattern = format!("(?i:{value}).*");
                        if let Err(e) = regex::Regex::new(&format!("^(?:{pattern})$")) {
                            status.problems.push(format!(
                                "path {value:?} is not a valid regular expression: {e}"
                            ));
                            continue;
                        }
                        (snap::path_match::Kind::Regex, pattern)
                    }
                    _ if value.len() > 1 => (
                        snap::path_match::Kind::Prefix,
                        value.trim_end_matches('/').to_owned(),
                    ),
                    _ => (snap::path_match::Kind::Prefix, value),
                };
                let m = snap::RouteMatch {
                    path: Some(snap::PathMatch {
                        kind: kind as i32,
                        value,
                    }),
                    ..Default::default()
                };
                let backend = resolve(index, &key.namespace, &path.backend, &mut out.clusters);
                paths.push(PathRoute {
                    host: host.clone(),
                    m,
                    backend,
                    rule: (ri * 1000 + pi) as u32,
                });
            }
        }
        if let Some(default) = spec.default_backend.as_ref().filter(|_| !canary) {
            let backend = resolve(index, &key.namespace, default, &mut out.clusters);
            let m = snap::RouteMatch {
                path: Some(snap::PathMatch {
                    kind: snap::path_match::Kind::Prefix as i32,
                    value: "/".into(),
                }),
                ..Default::default()
            };
            // The default backend answers what no rule matches. On the catch-all host it also
            // follows every host's own rules (hosts inherit catch-all routes), and it sorts last
            // there because no path is shorter than "/".
            paths.push(PathRoute {
                host: String::new(),
                m,
                backend,
                rule: u32::MAX,
            });
        }
        for p in &paths {
            if let Err(problem) = &p.backend
                && !status.problems.contains(problem)
            {
                status.problems.push(problem.clone());
            }
        }
        prepared.push(Prepared {
            key,
            class: class.metadata.name.clone().unwrap_or_default(),
            created,
            class_access_log_off: params.is_some_and(|p| p.spec.access_log == Some(false)),
            annotations,
            has_tls,
            paths,
            status,
        });
    }

    // Canaries attach to the primary serving the same host and path; the first canary (in
    // namespace/name order) for a path wins, as ingress-nginx allows one per path.
    let mut canaries: BTreeMap<PathKey, CanaryBackend> = BTreeMap::new();
    for p in prepared.iter_mut() {
        let Some(canary) = p.annotations.canary.clone() else {
            continue;
        };
        for path in &p.paths {
            let Ok(cluster) = &path.backend else {
                continue;
            };
            let k = path_key(path);
            if let Some(existing) = canaries.get(&k) {
                p.status.warnings.push(AnnotationWarning {
                    annotation: format!("{}canary", annotations::PREFIX),
                    reason: format!(
                        "Ingress {} is already the canary for host {:?} path {:?}; this one is \
                         not served there",
                        existing.from, k.0, k.2
                    ),
                    fail_closed: false,
                });
                continue;
            }
            canaries.insert(
                k,
                CanaryBackend {
                    cluster: cluster.clone(),
                    canary: canary.clone(),
                    from: p.key.clone(),
                },
            );
        }
    }
    let primary_paths: std::collections::BTreeSet<PathKey> = prepared
        .iter()
        .filter(|p| p.annotations.canary.is_none())
        .flat_map(|p| p.paths.iter().map(path_key))
        .collect();
    for p in prepared.iter_mut() {
        if p.annotations.canary.is_none() {
            continue;
        }
        for path in &p.paths {
            let k = path_key(path);
            if !primary_paths.contains(&k) && canaries.get(&k).is_some_and(|c| c.from == p.key) {
                p.status.warnings.push(AnnotationWarning {
                    annotation: format!("{}canary", annotations::PREFIX),
                    reason: format!(
                        "no Ingress without canary serves host {:?} path {:?}; the canary is not served there",
                        k.0, path.m.path.as_ref().map_or("", |m| m.value.as_str())
                    ),
                    fail_closed: false,
                });
            }
        }
    }

    for p in &prepared {
        for cluster in p.paths.iter().filter_map(|path| path.backend.as_ref().ok()) {
            if let Some(service) = service_of(cluster) {
                out.service_classes
                    .entry(service)
                    .or_default()
                    .insert(p.class.clone());
            }
        }
    }
    choose_load_balancers(index, &mut prepared, &mut out.load_balancers);

    for p in prepared {
        let Prepared {
            key,
            class: _,
            created,
            annotations: a,
            class_access_log_off,
            has_tls,
            paths,
            mut status,
        } = p;
        if a.canary.is_some() {
            out.status.insert(key, status);
            continue;
        }
        any_http |= !paths.is_empty();
        let ports: Vec<(u32, Protocol)> = if has_tls {
            vec![
                (config.ingress_http_port, Protocol::Http),
                (config.ingress_https_port, Protocol::Https),
            ]
        } else {
            vec![(config.ingress_http_port, Protocol::Http)]
        };
        // ingress-nginx redirects TLS Ingresses to HTTPS unless told not to; Coxswain only
        // when asked, or under compatibility, where a migrated Ingress keeps that default.
        let ssl_redirect = a.force_ssl_redirect
            || (has_tls && a.ssl_redirect.unwrap_or(config.ingress_nginx_compat));
        let policy = RoutePolicy::new(
            &a,
            class_access_log_off,
            &key,
            index,
            &mut out.clusters,
            &mut status,
        );
        for path in paths {
            let canary = canaries.get(&path_key(&path));
            for (port, protocol) in &ports {
                let https_redirect = ssl_redirect && *protocol == Protocol::Http;
                for (m, backends, direct_status) in variants(&path, canary) {
                    let mut route = snap::Route {
                        source: Some(snap::RouteSource {
                            kind: "Ingress".into(),
                            namespace: key.namespace.clone(),
                            name: key.name.clone(),
                            rule: path.rule,
                            rule_name: String::new(),
                        }),
                        r#match: Some(m.clone()),
                        ..Default::default()
                    };
                    policy.apply(&mut route, https_redirect, backends, direct_status);
                    out.entries.push(Arc::new(Entry {
                        scope: ScopeKey::SharedPool,
                        port: *port,
                        protocol: *protocol,
                        listener_hostname: None,
                        vhost: path.host.clone(),
                        // Ingress: "a wildcard host matches exactly one DNS label".
                        single_label: path.host.starts_with("*."),
                        key: PrecedenceKey::new(&m, created, &key, path.rule, 0),
                        route: EncodedRoute::new(&route),
                        origin: None,
                        parent: None,
                        ordinal: 0,
                    }));
                }
            }
        }
        out.status.insert(key, status);
    }
    if any_http {
        out.slots.push(Slot {
            scope: ScopeKey::SharedPool,
            port: config.ingress_http_port,
            public_port: 0,
            protocol: Protocol::Http,
            hostname: None,
            source: "Ingress".into(),
            certificate: None,
            client_validation: None,
            terminate_tls: false,
        });
    }
    // One HTTPS slot per TLS host so each SNI name gets its certificate; for a host listed
    // by several Ingresses the first in name order wins. Routing on the port stays
    // host-agnostic (hostname None), like the HTTP port.
    tls_hosts.sort();
    tls_hosts.dedup_by(|a, b| a.0 == b.0);
    for (host, cert) in tls_hosts {
        out.slots.push(Slot {
            scope: ScopeKey::SharedPool,
            port: config.ingress_https_port,
            public_port: 0,
            protocol: Protocol::Https,
            hostname: None,
            source: "Ingress".into(),
            certificate: Some((host, cert)),
            client_validation: None,
            terminate_tls: false,
        });
    }
    out
}

/// The routes one Ingress path becomes: normally one; with a canary, the weighted split plus
/// header routes (a header match ranks above none, so they are tried first).
fn variants(
    path: &PathRoute,
    canary: Option<&CanaryBackend>,
) -> Vec<(snap::RouteMatch, Vec<snap::WeightedBackend>, u32)> {
    let backend = |cluster: &str, weight: u32| snap::WeightedBackend {
        cluster: cluster.to_owned(),
        weight,
        filters: vec![],
    };
    let primary = match &path.backend {
        Ok(c) => c,
        // Like Gateway API's invalid backend: answer 500 rather than fall through.
        Err(_) => return vec![(path.m.clone(), vec![], 500)],
    };
    let Some(c) = canary else {
        return vec![(path.m.clone(), vec![backend(primary, 1)], 0)];
    };
    let mut out = Vec::new();
    if let Some(header) = &c.canary.by_header {
        let with = |value: &str| {
            let mut m = path.m.clone();
            m.headers.push(snap::HeaderMatch {
                kind: snap::header_match::Kind::Exact as i32,
                name: header.clone(),
                value: value.to_owned(),
            });
            m
        };
        match &c.canary.by_header_value {
            Some(v) => out.push((with(v), vec![backend(&c.cluster, 1)], 0)),
            None => {
                out.push((with("always"), vec![backend(&c.cluster, 1)], 0));
                out.push((with("never"), vec![backend(primary, 1)], 0));
            }
        }
    }
    out.push((
        path.m.clone(),
        vec![
            backend(primary, c.canary.total - c.canary.weight),
            backend(&c.cluster, c.canary.weight),
        ],
        0,
    ));
    out
}

/// (namespace, Service) of a cluster name "<namespace>/<service>:<port>[/h2c]".
pub fn service_of(cluster: &str) -> Option<(String, String)> {
    let base = cluster
        .strip_suffix(refs::H2C_CLUSTER_SUFFIX)
        .unwrap_or(cluster);
    let (service, _port) = base.rsplit_once(':')?;
    let (ns, name) = service.split_once('/')?;
    Some((ns.to_owned(), name.to_owned()))
}

/// The annotation algorithm for every cluster the Ingresses send to: the oldest Ingress that
/// sets one decides, so the choice does not flip as Ingresses come and go in between. An
/// Ingress whose choice is not used (a policy holds the port, an older Ingress chose
/// otherwise) is told so.
fn choose_load_balancers(
    index: &Index<'_>,
    prepared: &mut [Prepared],
    chosen: &mut BTreeMap<String, snap::LoadBalancer>,
) {
    let mut order: Vec<usize> = (0..prepared.len())
        .filter(|&i| prepared[i].annotations.canary.is_none())
        .filter(|&i| prepared[i].annotations.load_balance.is_some())
        .collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&prepared[a], &prepared[b]);
        let age = |p: &Prepared| (p.created.is_none(), p.created);
        age(a).cmp(&age(b)).then_with(|| a.key.cmp(&b.key))
    });
    // Cluster -> the Ingress whose choice it got.
    let mut owner: BTreeMap<String, ObjectKey> = BTreeMap::new();
    for i in order {
        let p = &mut prepared[i];
        let Some(choice) = p.annotations.load_balance.as_ref().map(load_balancer) else {
            continue;
        };
        let clusters: BTreeSet<String> = p
            .paths
            .iter()
            .filter_map(|path| path.backend.clone().ok())
            .collect();
        let mut warnings = Vec::new();
        for cluster in clusters {
            if let Some((policy, _)) = index.backend_policy.for_cluster(&cluster) {
                warnings.push(format!(
                    "CoxswainBackendPolicy {policy} sets the load balancer of {cluster}; the \
                     annotation is not applied there"
                ));
                continue;
            }
            match chosen.get(&cluster) {
                None => {
                    chosen.insert(cluster.clone(), choice.clone());
                    owner.insert(cluster, p.key.clone());
                }
                Some(existing) if *existing == choice => {}
                Some(_) => {
                    let older = owner.get(&cluster).map(ToString::to_string);
                    warnings.push(format!(
                        "Ingress {} is older and chose another load balancer for {cluster}; \
                         this one is not applied there",
                        older.unwrap_or_default()
                    ));
                }
            }
        }
        // Said under the key that was set: upstream-hash-by when it decided, else load-balance.
        let name = match p.annotations.load_balance {
            Some(annotations::LoadBalance::Hash(_)) => "upstream-hash-by",
            _ => "load-balance",
        };
        for reason in warnings {
            p.status.warnings.push(AnnotationWarning {
                annotation: format!("{}{name}", annotations::PREFIX),
                reason,
                fail_closed: false,
            });
        }
    }
}

fn load_balancer(choice: &annotations::LoadBalance) -> snap::LoadBalancer {
    use annotations::{HashKey, LoadBalance};
    use snap::hash_key::Source;
    use snap::load_balancer::Algorithm;
    let (algorithm, hash) = match choice {
        LoadBalance::RoundRobin => (Algorithm::RoundRobin, None),
        LoadBalance::LeastRequest => (Algorithm::LeastRequest, None),
        LoadBalance::Hash(key) => (
            Algorithm::ConsistentHash,
            Some(snap::HashKey {
                source: Some(match key {
                    HashKey::ClientAddress => Source::ClientAddress(true),
                    HashKey::Header(h) => Source::Header(h.clone()),
                    HashKey::Cookie(c) => Source::Cookie(c.clone()),
                }),
            }),
        ),
    };
    snap::LoadBalancer {
        algorithm: algorithm as i32,
        hash,
    }
}

fn resolve(
    index: &Index<'_>,
    namespace: &str,
    backend: &IngressBackend,
    clusters: &mut Vec<snap::Cluster>,
) -> Result<String, String> {
    let Some(svc) = &backend.service else {
        return Err("resource backends are not supported; use a Service backend".into());
    };
    let Some(service) = index.service(namespace, &svc.name) else {
        return Err(format!("Service {namespace}/{} not found", svc.name));
    };
    let port = svc.port.as_ref();
    let number = match (
        port.and_then(|p| p.number),
        port.and_then(|p| p.name.as_deref()),
    ) {
        (Some(n), _) => n,
        (None, Some(name)) => service
            .spec
            .as_ref()
            .and_then(|s| {
                s.ports
                    .iter()
                    .flatten()
                    .find(|p| p.name.as_deref() == Some(name))
            })
            .map(|p| p.port)
            .ok_or_else(|| format!("Service {namespace}/{} has no port named {name}", svc.name))?,
        (None, None) => {
            return Err(format!(
                "backend Service {namespace}/{} needs a port",
                svc.name
            ));
        }
    };
    let cluster = index
        .cluster(namespace, &svc.name, number)
        .ok_or_else(|| format!("Service {namespace}/{} has no port {number}", svc.name))?;
    let name = cluster.name.clone();
    clusters.push(cluster);
    Ok(name)
}
