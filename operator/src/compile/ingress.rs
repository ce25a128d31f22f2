//! Ingresses of our IngressClass(es): rules to routes on the shared pool's HTTP and HTTPS ports.
//!
//! pathType ImplementationSpecific is treated as Prefix (element-wise), the same as Prefix.
//! Host wildcards (`*.example.com`) follow the Gateway API rule (one or more labels), which is
//! wider than Ingress's single label.

use super::entries::{Entry, PrecedenceKey};
use super::gateway::ScopeKey;
use super::refs::{self, Index};
use super::status::{IngressStatus, ObjectKey};
use super::store::Store;
use super::{Config, Slot};
use coxswain_api::snapshot::{self as snap, Protocol};
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend, IngressClass};
use std::collections::BTreeMap;

const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";

pub struct IngressOutput {
    pub entries: Vec<Entry>,
    pub slots: Vec<Slot>,
    pub clusters: Vec<snap::Cluster>,
    pub certificates: BTreeMap<String, (String, String)>,
    pub status: BTreeMap<ObjectKey, IngressStatus>,
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

/// An Ingress's annotations with its class's defaultAnnotations underneath: the Ingress's own
/// value wins for every key it sets.
pub fn effective_annotations(
    store: &Store,
    class: &IngressClass,
    ingress: &Ingress,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(p) = class.spec.as_ref().and_then(|s| s.parameters.as_ref())
        && p.api_group.as_deref() == Some(coxswain_api::names::INGRESS_GROUP)
        && p.kind == "CoxswainIngressClassParameters"
        && let Some(params) = store.ingress_class_parameters.iter().find(|c| {
            c.metadata.name.as_deref() == Some(p.name.as_str())
                && c.metadata.namespace.as_deref() == p.namespace.as_deref()
        })
    {
        out.extend(params.spec.default_annotations.clone());
    }
    out.extend(ingress.metadata.annotations.clone().unwrap_or_default());
    out
}

pub fn compile(store: &Store, index: &Index<'_>, config: &Config) -> IngressOutput {
    let mut out = IngressOutput {
        entries: Vec::new(),
        slots: Vec::new(),
        clusters: Vec::new(),
        certificates: BTreeMap::new(),
        status: BTreeMap::new(),
    };
    let ours: Vec<&IngressClass> = store
        .ingress_classes
        .iter()
        .filter(|c| {
            c.spec.as_ref().and_then(|s| s.controller.as_deref())
                == Some(config.controller_name.as_str())
        })
        .collect();
    let mut any_http = false;
    let mut tls_hosts: Vec<(String, String)> = Vec::new();
    for ingress in &store.ingresses {
        if our_class(ingress, &ours).is_none() {
            continue;
        }
        let key = ObjectKey::new(
            ingress.metadata.namespace.as_deref().unwrap_or("default"),
            ingress.metadata.name.as_deref().unwrap_or_default(),
        );
        let mut problems = Vec::new();
        let Some(spec) = &ingress.spec else {
            out.status.insert(
                key,
                IngressStatus {
                    problems: vec!["no spec".into()],
                    ..Default::default()
                },
            );
            continue;
        };
        let created = ingress.metadata.creation_timestamp.as_ref().map(|t| t.0);

        // TLS: a certificate per listed host (or the default when hosts is empty).
        let mut has_tls = false;
        for tls in spec.tls.iter().flatten() {
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
                Err(p) => problems.push(p),
            }
        }

        let mut routes: Vec<(String, snap::RouteMatch, Result<String, String>, u32)> = Vec::new();
        for (ri, rule) in spec.rules.iter().flatten().enumerate() {
            let host = rule.host.clone().unwrap_or_default().to_ascii_lowercase();
            for (pi, path) in rule.http.iter().flat_map(|h| h.paths.iter()).enumerate() {
                let value = path.path.clone().unwrap_or_else(|| "/".into());
                let kind = match path.path_type.as_str() {
                    "Exact" => snap::path_match::Kind::Exact,
                    _ => snap::path_match::Kind::Prefix,
                };
                if !value.starts_with('/') {
                    problems.push(format!("path {value:?} must start with /"));
                    continue;
                }
                let value = if kind == snap::path_match::Kind::Prefix && value.len() > 1 {
                    value.trim_end_matches('/').to_owned()
                } else {
                    value
                };
                let m = snap::RouteMatch {
                    path: Some(snap::PathMatch {
                        kind: kind as i32,
                        value,
                    }),
                    ..Default::default()
                };
                let backend = resolve(index, &key.namespace, &path.backend, &mut out.clusters);
                routes.push((host.clone(), m, backend, (ri * 1000 + pi) as u32));
            }
        }
        if let Some(default) = &spec.default_backend {
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
            routes.push((String::new(), m, backend, u32::MAX));
        }
        for (_, _, backend, _) in &routes {
            if let Err(p) = backend
                && !problems.contains(p)
            {
                problems.push(p.clone());
            }
        }
        any_http |= !routes.is_empty();
        let ports: Vec<(u32, Protocol)> = if has_tls {
            vec![
                (config.ingress_http_port, Protocol::Http),
                (config.ingress_https_port, Protocol::Https),
            ]
        } else {
            vec![(config.ingress_http_port, Protocol::Http)]
        };
        for (host, m, backend, rule) in routes {
            let (backends, direct_status) = match backend {
                Ok(cluster) => (
                    vec![snap::WeightedBackend {
                        cluster,
                        weight: 1,
                        filters: vec![],
                    }],
                    0,
                ),
                // Like Gateway API's invalid backend: answer 500 rather than fall through.
                Err(_) => (vec![], 500),
            };
            for (port, protocol) in &ports {
                out.entries.push(Entry {
                    scope: ScopeKey::SharedPool,
                    port: *port,
                    protocol: *protocol,
                    listener_hostname: None,
                    vhost: host.clone(),
                    key: PrecedenceKey::new(&host, &m, created, &key, rule, 0),
                    route: snap::Route {
                        source: Some(snap::RouteSource {
                            kind: "Ingress".into(),
                            namespace: key.namespace.clone(),
                            name: key.name.clone(),
                            rule,
                            rule_name: String::new(),
                        }),
                        r#match: Some(m.clone()),
                        filters: vec![],
                        backends: backends.clone(),
                        timeouts: None,
                        direct_status,
                        ..Default::default()
                    },
                });
            }
        }
        out.status.insert(
            key,
            IngressStatus {
                problems,
                ..Default::default()
            },
        );
    }
    if any_http {
        out.slots.push(Slot {
            scope: ScopeKey::SharedPool,
            port: config.ingress_http_port,
            protocol: Protocol::Http,
            hostname: None,
            source: "Ingress".into(),
            certificate: None,
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
            protocol: Protocol::Https,
            hostname: None,
            source: "Ingress".into(),
            certificate: Some((host, cert)),
        });
    }
    out
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
