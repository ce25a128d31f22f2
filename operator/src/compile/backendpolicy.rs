//! CoxswainBackendPolicies: which load-balancing algorithm each Service port's clusters get,
//! and each policy's Accepted condition.
//!
//! Policies are taken oldest first (then by namespace/name), as BackendTLSPolicies are. A
//! policy whose target (a Service, or one named port of it) an older policy already holds is
//! Conflicted and holds nothing. A policy naming a port outranks one naming the whole Service
//! for that port. An Invalid policy holds nothing either, so what would apply without it
//! (Ingress annotations, round robin) still does. Targets that do not exist are reported as
//! TargetNotFound; the policy still holds the ones that do.

use super::status::{AncestorRef, Condition, ObjectKey, reason};
use super::store::Store;
use coxswain_api::snapshot as snap;
use coxswain_api::{CoxswainBackendPolicy, LoadBalancer, LoadBalancerType};
use std::collections::{BTreeMap, BTreeSet};

/// (Service, port name or "" for every port), in the policy's namespace.
type Target = (String, String);

#[derive(Debug, Default)]
pub struct Output {
    /// Cluster name (without the h2c suffix) -> the policy holding it and its algorithm.
    clusters: BTreeMap<String, (ObjectKey, snap::LoadBalancer)>,
    /// Per policy: its conditions, the same under every ancestor, and what it targets.
    pub decided: BTreeMap<ObjectKey, Decided>,
}

#[derive(Debug, Clone)]
pub struct Decided {
    pub conditions: Vec<Condition>,
    /// (namespace, Service) of every Service target, existing or not, in spec order.
    pub services: Vec<(String, String)>,
    /// The first targetRef, the ancestor reported while no route uses a target.
    pub first_target: Option<AncestorRef>,
}

impl Output {
    /// The policy holding a cluster and the algorithm it asks for. h2c variants of a cluster
    /// are the same Service port.
    pub fn for_cluster(&self, cluster: &str) -> Option<&(ObjectKey, snap::LoadBalancer)> {
        let base = cluster
            .strip_suffix(super::clusters::H2C_CLUSTER_SUFFIX)
            .unwrap_or(cluster);
        self.clusters.get(base)
    }
}

pub fn compile(store: &Store) -> Output {
    let mut out = Output::default();
    let mut policies: Vec<&CoxswainBackendPolicy> =
        store.backend_policies.iter().map(|p| &**p).collect();
    policies.sort_by(|a, b| {
        let key =
            |p: &CoxswainBackendPolicy| (p.metadata.namespace.clone(), p.metadata.name.clone());
        super::store::oldest_first(&a.metadata, &b.metadata).then_with(|| key(a).cmp(&key(b)))
    });
    // (namespace, target) -> (policy, algorithm), decided in age order.
    // A policy without loadBalancer still holds its targets: another policy on them conflicts.
    let mut held: BTreeMap<(String, Target), (ObjectKey, Option<snap::LoadBalancer>)> =
        BTreeMap::new();
    for policy in policies {
        let ns = policy.metadata.namespace.clone().unwrap_or_default();
        let name = policy.metadata.name.clone().unwrap_or_default();
        let me = ObjectKey::new(&ns, &name);
        let generation = policy.metadata.generation.unwrap_or(0);
        let services: Vec<(String, String)> = policy
            .spec
            .target_refs
            .iter()
            .filter(|t| t.group.is_empty() && t.kind == "Service")
            .map(|t| (ns.clone(), t.name.clone()))
            .collect();

        let verdict = match validate(policy) {
            Err(why) => (false, reason::INVALID, why),
            Ok(lb) => {
                let mut targets: BTreeSet<Target> = BTreeSet::new();
                let mut missing = Vec::new();
                for t in &policy.spec.target_refs {
                    let section = t.section_name.clone().unwrap_or_default();
                    match target_problem(store, &ns, &t.name, &section) {
                        Some(why) => missing.push(why),
                        None => {
                            targets.insert((t.name.clone(), section));
                        }
                    }
                }
                let taken = targets
                    .iter()
                    .find_map(|t| held.get(&(ns.clone(), t.clone())).map(|h| (t, &h.0)));
                match taken {
                    Some(((svc, section), older)) => (
                        false,
                        reason::CONFLICTED,
                        if section.is_empty() {
                            format!(
                                "CoxswainBackendPolicy {} is older and already targets Service \
                                 {svc}; this one is not applied",
                                older.name
                            )
                        } else {
                            format!(
                                "CoxswainBackendPolicy {} is older and already targets port \
                                 {section} of Service {svc}; this one is not applied",
                                older.name
                            )
                        },
                    ),
                    None => {
                        for t in &targets {
                            held.insert((ns.clone(), t.clone()), (me.clone(), lb.clone()));
                        }
                        if missing.is_empty() {
                            (true, reason::ACCEPTED, String::new())
                        } else {
                            let applied = if targets.is_empty() {
                                String::new()
                            } else {
                                "; applied to the other targets".to_owned()
                            };
                            (
                                false,
                                reason::TARGET_NOT_FOUND,
                                format!("{}{applied}", missing.join("; ")),
                            )
                        }
                    }
                }
            }
        };
        out.decided.insert(
            me,
            Decided {
                conditions: vec![Condition::new(
                    reason::ACCEPTED,
                    verdict.0,
                    verdict.1,
                    verdict.2,
                    generation,
                )],
                services,
                first_target: policy.spec.target_refs.first().map(|t| AncestorRef {
                    group: t.group.clone(),
                    kind: t.kind.clone(),
                    namespace: Some(ns.clone()),
                    name: t.name.clone(),
                }),
            },
        );
    }

    // Whole-Service targets first, so a policy naming the port overwrites them there.
    let mut ordered: Vec<_> = held.into_iter().collect();
    ordered.sort_by_key(|((_, (_, section)), _)| !section.is_empty());
    for ((ns, (svc, section)), (policy, lb)) in ordered {
        let Some(lb) = lb else {
            continue;
        };
        let Some(service) = store.services.iter().find(|s| {
            s.metadata.namespace.as_deref() == Some(ns.as_str())
                && s.metadata.name.as_deref() == Some(svc.as_str())
        }) else {
            continue;
        };
        for port in service
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .into_iter()
            .flatten()
            .filter(|p| section.is_empty() || p.name.as_deref() == Some(section.as_str()))
        {
            out.clusters.insert(
                super::clusters::cluster_name(&ns, &svc, port.port),
                (policy.clone(), lb.clone()),
            );
        }
    }
    out
}

/// Why a target cannot be used: the Service or its named port does not exist.
fn target_problem(store: &Store, ns: &str, svc: &str, section: &str) -> Option<String> {
    let Some(service) = store.services.iter().find(|s| {
        s.metadata.namespace.as_deref() == Some(ns) && s.metadata.name.as_deref() == Some(svc)
    }) else {
        return Some(format!("Service {svc} not found in namespace {ns}"));
    };
    let has_port = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .any(|p| p.name.as_deref() == Some(section));
    (!section.is_empty() && !has_port).then(|| format!("Service {svc} has no port named {section}"))
}

/// The algorithm a policy asks for (None: it sets none), or why it cannot be applied. The CRD's schema refuses
/// most of these already; objects read from files or stored under an older schema are not
/// checked by it.
fn validate(policy: &CoxswainBackendPolicy) -> Result<Option<snap::LoadBalancer>, String> {
    use snap::hash_key::Source;
    use snap::load_balancer::Algorithm;
    for t in &policy.spec.target_refs {
        if !t.group.is_empty() || t.kind != "Service" {
            let group = if t.group.is_empty() { "core" } else { &t.group };
            return Err(format!(
                "targetRef {group}/{} {}: only Services (group \"\", kind Service) can be targeted",
                t.kind, t.name
            ));
        }
    }
    if policy.spec.target_refs.is_empty() {
        return Err("targetRefs is empty: the policy targets nothing".into());
    }
    let Some(LoadBalancer {
        type_,
        consistent_hash,
    }) = &policy.spec.load_balancer
    else {
        return Ok(None);
    };
    let algorithm = match type_ {
        LoadBalancerType::RoundRobin => Algorithm::RoundRobin,
        LoadBalancerType::LeastRequest => Algorithm::LeastRequest,
        LoadBalancerType::ConsistentHash => Algorithm::ConsistentHash,
    };
    let hash = match (type_, consistent_hash) {
        (LoadBalancerType::ConsistentHash, None) => {
            return Err(
                "loadBalancer.type ConsistentHash needs consistentHash with one of header, \
                 cookie or sourceIP"
                    .into(),
            );
        }
        (LoadBalancerType::ConsistentHash, Some(h)) => {
            let mut keys = Vec::new();
            if let Some(header) = &h.header {
                keys.push(Source::Header(checked_name("header", &header.name)?));
            }
            if let Some(cookie) = &h.cookie {
                keys.push(Source::Cookie(checked_name("cookie", &cookie.name)?));
            }
            if h.source_ip.is_some() {
                keys.push(Source::ClientAddress(true));
            }
            match keys.len() {
                1 => keys.pop().map(|source| snap::HashKey {
                    source: Some(source),
                }),
                0 => {
                    return Err(
                        "loadBalancer.consistentHash names no key; set one of header, cookie or \
                         sourceIP"
                            .into(),
                    );
                }
                _ => {
                    return Err(
                        "loadBalancer.consistentHash names more than one key; set exactly one of \
                         header, cookie or sourceIP"
                            .into(),
                    );
                }
            }
        }
        (other, Some(_)) => {
            return Err(format!(
                "loadBalancer.consistentHash is only used with type ConsistentHash, not {}",
                other.as_str()
            ));
        }
        (_, None) => None,
    };
    Ok(Some(snap::LoadBalancer {
        algorithm: algorithm as i32,
        hash,
    }))
}

/// A header or cookie name: an HTTP token.
fn checked_name(what: &str, name: &str) -> Result<String, String> {
    let token = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if token {
        Ok(name.to_owned())
    } else {
        Err(format!(
            "consistentHash {what} name {name:?} is not a valid {what} name (an HTTP token)"
        ))
    }
}
