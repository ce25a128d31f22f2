//! GatewayClasses and Gateways: acceptance, the ListenerSets they take, and the listeners
//! routes may attach to ([`super::listeners`] validates each listener).

use super::Config;
use super::gateway_tls::{FrontendTls, backend_client_certificate};
use super::listeners::{AcceptedListener, compile_listeners};
use super::refs::{GATEWAY_GROUP, Index};
use super::status::{Condition, GatewayStatus, ListenerSetStatus, ObjectKey, Problem, reason};
use super::store::Store;
use gateway_api::apis::standard::gateways::{
    Gateway, GatewayAllowedListenersNamespacesFrom, GatewayListeners,
};
use gateway_api::apis::standard::listenersets::ListenerSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::{BTreeMap, BTreeSet};

// Where it always lived: the Ingress compiler names it through this module.
pub use super::status::ScopeKey;

/// The listener names and ports of one accepted ListenerSet, so a parentRef's sectionName or
/// port can be told apart from one that does not exist.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListenerNames {
    pub names: BTreeSet<String>,
    pub ports: BTreeSet<u32>,
}

/// A Gateway this controller serves.
#[derive(Debug, Clone, PartialEq)]
pub struct ServedGateway {
    pub key: ObjectKey,
    pub scope: ScopeKey,
    pub generation: i64,
    pub listeners: Vec<AcceptedListener>,
    /// Every listener name, valid or not, so parentRef.sectionName can be told apart from
    /// a name that does not exist.
    pub all_listener_names: BTreeSet<String>,
    pub all_listener_ports: BTreeSet<u32>,
    /// The accepted ListenerSets attached to this Gateway.
    pub listener_sets: BTreeMap<ObjectKey, ListenerNames>,
    /// ListenerSets naming this Gateway that it does not take, with why: routes attached to
    /// them are told.
    pub refused_listener_sets: BTreeMap<ObjectKey, String>,
}

pub struct GatewayOutput {
    pub class_status: BTreeMap<String, Vec<Condition>>,
    pub gateway_status: BTreeMap<ObjectKey, GatewayStatus>,
    pub served: BTreeMap<ObjectKey, ServedGateway>,
    /// (name of the certificate, chain PEM, key PEM) for HTTPS listeners.
    pub certificates: BTreeMap<String, (String, String)>,
    /// Every ListenerSet whose parent is a Gateway of ours.
    pub listener_set_status: BTreeMap<ObjectKey, ListenerSetStatus>,
    /// Dedicated Gateways' spec.tls.backend.clientCertificateRef: the certificate's name (in
    /// `certificates`) their proxies present to TLS backends.
    pub backend_clients: BTreeMap<ScopeKey, String>,
    /// Shared Gateways' spec.tls.backend.clientCertificateRef: presented on clusters of
    /// their own (`backend_clients`).
    pub shared_backend_clients: BTreeMap<ObjectKey, String>,
}

fn is_our_params_ref(group: &str, kind: &str) -> bool {
    group == coxswain_api::names::GATEWAY_GROUP && kind == "CoxswainGatewayParameters"
}

pub fn compile(store: &Store, index: &Index<'_>, config: &Config) -> GatewayOutput {
    let mut out = GatewayOutput {
        class_status: BTreeMap::new(),
        gateway_status: BTreeMap::new(),
        served: BTreeMap::new(),
        certificates: BTreeMap::new(),
        listener_set_status: BTreeMap::new(),
        backend_clients: BTreeMap::new(),
        shared_backend_clients: BTreeMap::new(),
    };
    // GatewayClass: ours when spec.controllerName is our controller name.
    let mut accepted_classes: BTreeMap<&str, bool> = BTreeMap::new();
    for class in &store.gateway_classes {
        if class.spec.controller_name != config.controller_name {
            continue;
        }
        let name = class.metadata.name.as_deref().unwrap_or_default();
        let generation = class.metadata.generation.unwrap_or(0);
        let condition = match &class.spec.parameters_ref {
            None => Condition::new(reason::ACCEPTED, true, reason::ACCEPTED, "", generation),
            Some(p) if !is_our_params_ref(&p.group, &p.kind) => Condition::new(
                reason::ACCEPTED,
                false,
                reason::INVALID_PARAMETERS,
                format!(
                    "parametersRef must be gateway.coxswain-labs.dev/CoxswainGatewayParameters, not {}/{}",
                    p.group, p.kind
                ),
                generation,
            ),
            Some(p) => match p.namespace.as_deref() {
                None => Condition::new(
                    reason::ACCEPTED,
                    false,
                    reason::INVALID_PARAMETERS,
                    "parametersRef to CoxswainGatewayParameters needs a namespace (the kind is namespaced)",
                    generation,
                ),
                Some(ns) if !params_exist(store, ns, &p.name) => Condition::new(
                    reason::ACCEPTED,
                    false,
                    reason::INVALID_PARAMETERS,
                    format!("CoxswainGatewayParameters {ns}/{} not found", p.name),
                    generation,
                ),
                Some(_) => Condition::new(reason::ACCEPTED, true, reason::ACCEPTED, "", generation),
            },
        };
        let mut conditions = vec![condition];
        if let Some(version) = config.gateway_api_version.as_deref() {
            let supported = supported_gateway_api(version);
            let message = if supported {
                format!("Gateway API {version}")
            } else {
                format!(
                    "Gateway API {version} is installed; Coxswain supports {SUPPORTED_GATEWAY_API}"
                )
            };
            if !supported {
                // The spec: a class of an unsupported release is not accepted either.
                conditions[0] = Condition::new(
                    reason::ACCEPTED,
                    false,
                    reason::UNSUPPORTED_VERSION,
                    message.clone(),
                    generation,
                );
            }
            conditions.push(Condition::new(
                reason::SUPPORTED_VERSION,
                supported,
                if supported {
                    reason::SUPPORTED_VERSION
                } else {
                    reason::UNSUPPORTED_VERSION
                },
                message,
                generation,
            ));
        }
        accepted_classes.insert(name, conditions[0].is_true());
        out.class_status.insert(name.to_owned(), conditions);
    }
    let dedicated_classes: BTreeSet<&str> = store
        .gateway_classes
        .iter()
        .filter(|c| {
            c.spec.controller_name == config.controller_name
                && c.spec
                    .parameters_ref
                    .as_ref()
                    .is_some_and(|p| is_our_params_ref(&p.group, &p.kind))
        })
        .filter_map(|c| c.metadata.name.as_deref())
        .collect();

    for gateway in &store.gateways {
        let class = gateway.spec.gateway_class_name.as_str();
        let Some(&class_accepted) = accepted_classes.get(class) else {
            continue; // not ours
        };
        let key = ObjectKey::new(
            gateway.metadata.namespace.as_deref().unwrap_or("default"),
            gateway.metadata.name.as_deref().unwrap_or_default(),
        );
        let generation = gateway.metadata.generation.unwrap_or(0);
        let infra_ref = gateway
            .spec
            .infrastructure
            .as_ref()
            .and_then(|i| i.parameters_ref.as_ref());
        let dedicated = dedicated_classes.contains(class)
            || infra_ref.is_some_and(|p| is_our_params_ref(&p.group, &p.kind));
        let scope = if dedicated {
            ScopeKey::Gateway(key.clone())
        } else {
            ScopeKey::SharedPool
        };

        let mut gw_conditions = Vec::new();
        let mut gateway_problem: Option<Problem> = None;
        if !class_accepted {
            gateway_problem = Some(Problem::new(
                reason::INVALID,
                format!("GatewayClass {class} is not accepted"),
            ));
        } else if let Some(p) = infra_ref {
            if !is_our_params_ref(&p.group, &p.kind) {
                gateway_problem = Some(Problem::new(
                    reason::INVALID_PARAMETERS,
                    format!(
                        "infrastructure.parametersRef must be gateway.coxswain-labs.dev/CoxswainGatewayParameters, not {}/{}",
                        p.group, p.kind
                    ),
                ));
            } else if !params_exist(store, &key.namespace, &p.name) {
                gateway_problem = Some(Problem::new(
                    reason::INVALID_PARAMETERS,
                    format!(
                        "CoxswainGatewayParameters {}/{} not found",
                        key.namespace, p.name
                    ),
                ));
            }
        }
        // A dedicated proxy's ports and address are the Gateway's own, and so are a shared
        // Gateway's when it has a Service of its own (`gateway_services`).
        let own_service = dedicated || config.shared_gateway_ports.is_some();
        let requested_addresses = match requested_addresses(gateway, own_service) {
            Ok(addresses) => addresses,
            Err(problem) => {
                if gateway_problem.is_none() {
                    gateway_problem = Some(Problem::new(reason::UNSUPPORTED_ADDRESS, problem));
                }
                Vec::new()
            }
        };

        let frontend = FrontendTls::resolve(store, gateway, &key, own_service);
        let mut taken = Vec::new();
        let (listener_statuses, mut accepted) = compile_listeners(
            store,
            index,
            &gateway.spec.listeners,
            &key,
            None,
            generation,
            &mut taken,
            &mut out.certificates,
            &frontend,
        );
        let valid = accepted.iter().filter(|l| l.programmable).count();
        let total = gateway.spec.listeners.len();
        let (accepted_cond, programmed_cond) = match &gateway_problem {
            Some(p) => (
                p.condition(reason::ACCEPTED, generation),
                Condition::new(
                    reason::PROGRAMMED,
                    false,
                    reason::INVALID,
                    p.message.clone(),
                    generation,
                ),
            ),
            None if valid == 0 => (
                Condition::new(
                    reason::ACCEPTED,
                    false,
                    reason::LISTENERS_NOT_VALID,
                    "no listener is valid",
                    generation,
                ),
                Condition::new(
                    reason::PROGRAMMED,
                    false,
                    reason::INVALID,
                    "no listener is valid",
                    generation,
                ),
            ),
            None => (
                if valid < total {
                    Condition::new(
                        reason::ACCEPTED,
                        true,
                        reason::LISTENERS_NOT_VALID,
                        format!("{} of {total} listeners are not valid", total - valid),
                        generation,
                    )
                } else {
                    Condition::new(reason::ACCEPTED, true, reason::ACCEPTED, "", generation)
                },
                Condition::new(
                    reason::PROGRAMMED,
                    false,
                    reason::PENDING,
                    "waiting for a proxy to bind the listeners and acknowledge the configuration",
                    generation,
                ),
            ),
        };
        let gateway_accepted = accepted_cond.is_true();
        gw_conditions.push(accepted_cond);
        gw_conditions.push(programmed_cond);
        // spec.tls: ResolvedRefs only when the Gateway refers to something of its own.
        match backend_client_certificate(store, index, gateway, &key) {
            None => {}
            Some(Ok((name, pair))) => {
                gw_conditions.push(Condition::new(
                    reason::RESOLVED_REFS,
                    true,
                    reason::RESOLVED_REFS,
                    "",
                    generation,
                ));
                out.certificates.insert(name.clone(), pair);
                if dedicated {
                    out.backend_clients.insert(scope.clone(), name);
                } else {
                    out.shared_backend_clients.insert(key.clone(), name);
                }
            }
            Some(Err(p)) => gw_conditions.push(p.condition(reason::RESOLVED_REFS, generation)),
        }
        gw_conditions.extend(frontend.insecure_condition(generation));

        // ListenerSets after the Gateway's own listeners, oldest first: each listener that
        // conflicts with one taken before it is the one turned away.
        let mut sets: Vec<&ListenerSet> = store
            .listener_sets
            .iter()
            .filter(|ls| listener_set_parent(ls) == key)
            .map(|ls| &**ls)
            .collect();
        sets.sort_by(|a, b| {
            super::store::oldest_first(&a.metadata, &b.metadata)
                .then_with(|| listener_set_key(a).cmp(&listener_set_key(b)))
        });
        let mut listener_sets = BTreeMap::new();
        let mut refused_listener_sets = BTreeMap::new();
        for ls in sets {
            let ls_key = listener_set_key(ls);
            let ls_generation = ls.metadata.generation.unwrap_or(0);
            let refused = |why: &'static str, message: String| ListenerSetStatus {
                conditions: vec![
                    Condition::new(reason::ACCEPTED, false, why, message.clone(), ls_generation),
                    Condition::new(reason::PROGRAMMED, false, why, message, ls_generation),
                ],
                listeners: Vec::new(),
                gateway: key.clone(),
                scope: scope.clone(),
            };
            if !gateway_accepted {
                out.listener_set_status.insert(
                    ls_key,
                    refused(
                        reason::PARENT_NOT_ACCEPTED,
                        format!("Gateway {key} is not accepted"),
                    ),
                );
                continue;
            }
            if let Err(message) = listener_set_allowed(store, gateway, &key, &ls_key) {
                refused_listener_sets.insert(ls_key.clone(), message.clone());
                out.listener_set_status
                    .insert(ls_key, refused(reason::NOT_ALLOWED, message));
                continue;
            }
            let listeners: Vec<GatewayListeners> = ls
                .spec
                .listeners
                .iter()
                .map(super::listener_set::as_gateway_listener)
                .collect();
            let (statuses, ls_accepted) = compile_listeners(
                store,
                index,
                &listeners,
                &key,
                Some(&ls_key),
                ls_generation,
                &mut taken,
                &mut out.certificates,
                &frontend,
            );
            let valid = ls_accepted.iter().filter(|l| l.programmable).count();
            let total = listeners.len();
            let conditions = if valid == 0 {
                let message = "no listener is valid".to_owned();
                vec![
                    Condition::new(
                        reason::ACCEPTED,
                        false,
                        reason::LISTENERS_NOT_VALID,
                        message.clone(),
                        ls_generation,
                    ),
                    Condition::new(
                        reason::PROGRAMMED,
                        false,
                        reason::LISTENERS_NOT_VALID,
                        message,
                        ls_generation,
                    ),
                ]
            } else {
                vec![
                    if valid < total {
                        Condition::new(
                            reason::ACCEPTED,
                            true,
                            reason::LISTENERS_NOT_VALID,
                            format!("{} of {total} listeners are not valid", total - valid),
                            ls_generation,
                        )
                    } else {
                        Condition::new(reason::ACCEPTED, true, reason::ACCEPTED, "", ls_generation)
                    },
                    Condition::new(
                        reason::PROGRAMMED,
                        false,
                        reason::PENDING,
                        "waiting for a proxy to bind the listeners and acknowledge the configuration",
                        ls_generation,
                    ),
                ]
            };
            if valid > 0 {
                listener_sets.insert(
                    ls_key.clone(),
                    ListenerNames {
                        names: listeners.iter().map(|l| l.name.clone()).collect(),
                        ports: listeners
                            .iter()
                            .filter_map(|l| u32::try_from(l.port).ok())
                            .collect(),
                    },
                );
                accepted.extend(ls_accepted);
            } else {
                refused_listener_sets.insert(ls_key.clone(), "no listener is valid".into());
            }
            out.listener_set_status.insert(
                ls_key,
                ListenerSetStatus {
                    conditions,
                    listeners: statuses,
                    gateway: key.clone(),
                    scope: scope.clone(),
                },
            );
        }

        out.gateway_status.insert(
            key.clone(),
            GatewayStatus {
                conditions: gw_conditions,
                listeners: listener_statuses,
                dedicated,
                requested_addresses,
                attached_listener_sets: listener_sets.len() as i32,
            },
        );
        if gateway_problem.is_none() {
            out.served.insert(
                key.clone(),
                ServedGateway {
                    key,
                    scope,
                    generation,
                    listeners: accepted,
                    all_listener_names: gateway
                        .spec
                        .listeners
                        .iter()
                        .map(|l| l.name.clone())
                        .collect(),
                    all_listener_ports: gateway
                        .spec
                        .listeners
                        .iter()
                        .filter_map(|l| u32::try_from(l.port).ok())
                        .collect(),
                    listener_sets,
                    refused_listener_sets,
                },
            );
        }
    }
    out
}

/// namespace/name of a ListenerSet.
pub fn listener_set_key(ls: &ListenerSet) -> ObjectKey {
    ObjectKey::new(
        ls.metadata.namespace.as_deref().unwrap_or("default"),
        ls.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// The Gateway a ListenerSet names as its parent (the namespace defaults to its own).
fn listener_set_parent(ls: &ListenerSet) -> ObjectKey {
    let p = &ls.spec.parent_ref;
    let ns = ls.metadata.namespace.as_deref().unwrap_or("default");
    if p.group.as_deref().unwrap_or(GATEWAY_GROUP) != GATEWAY_GROUP
        || p.kind.as_deref().unwrap_or("Gateway") != "Gateway"
    {
        // Not a Gateway: no Gateway of ours is its parent.
        return ObjectKey::new("", "");
    }
    ObjectKey::new(p.namespace.as_deref().unwrap_or(ns), &p.name)
}

/// Gateway `spec.allowedListeners`: which namespaces' ListenerSets may attach (none by
/// default).
fn listener_set_allowed(
    store: &Store,
    gateway: &Gateway,
    gw: &ObjectKey,
    ls: &ObjectKey,
) -> Result<(), String> {
    let namespaces = gateway
        .spec
        .allowed_listeners
        .as_ref()
        .and_then(|a| a.namespaces.as_ref());
    let from = namespaces.and_then(|n| n.from.clone());
    let allowed = match from {
        None | Some(GatewayAllowedListenersNamespacesFrom::None) => {
            return Err(format!(
                "Gateway {gw} does not allow ListenerSets (spec.allowedListeners.namespaces.from \
                 is None, the default)"
            ));
        }
        Some(GatewayAllowedListenersNamespacesFrom::Same) => ls.namespace == gw.namespace,
        Some(GatewayAllowedListenersNamespacesFrom::All) => true,
        Some(GatewayAllowedListenersNamespacesFrom::Selector) => namespaces
            .and_then(|n| n.selector.as_ref())
            .map(super::listener_set::label_selector)
            .is_some_and(|s| namespace_selected(store, &ls.namespace, &s)),
    };
    if allowed {
        Ok(())
    } else {
        Err(format!(
            "Gateway {gw} does not allow ListenerSets from namespace {} \
             (spec.allowedListeners)",
            ls.namespace
        ))
    }
}

/// Whether the namespace's labels match a label selector.
fn namespace_selected(store: &Store, namespace: &str, selector: &LabelSelector) -> bool {
    store
        .namespaces
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(namespace))
        .is_some_and(|n| {
            let labels = n.metadata.labels.clone().unwrap_or_default();
            labels_match(selector, &labels)
        })
}

fn labels_match(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v))
        && selector.match_expressions.iter().flatten().all(|e| {
            let value = labels.get(&e.key);
            let values = e.values.clone().unwrap_or_default();
            match e.operator.as_str() {
                "In" => value.is_some_and(|v| values.contains(v)),
                "NotIn" => value.is_none_or(|v| !values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

/// The IP addresses a Gateway's `spec.addresses` asks for. Only IPAddress entries can be
/// asked of a Service (type omitted means IPAddress); an entry without a value asks for any
/// address, which the Service gets anyway. `own_service`: whether the Gateway has a Service of
/// its own (a dedicated proxy's, or its own on the shared pool); the shared pool's one Service
/// belongs to every Gateway on it, so it cannot take one Gateway's address.
pub fn requested_addresses(
    gateway: &Gateway,
    own_service: bool,
) -> Result<Vec<std::net::IpAddr>, String> {
    let mut out = Vec::new();
    for a in gateway.spec.addresses.iter().flatten() {
        let value = a.value.as_deref().unwrap_or_default();
        let type_ = a.r#type.as_deref().unwrap_or("IPAddress");
        if type_ != "IPAddress" {
            return Err(format!(
                "address {value:?} has type {type_:?}; Coxswain supports IPAddress addresses only"
            ));
        }
        if value.is_empty() {
            continue;
        }
        let ip: std::net::IpAddr = value
            .parse()
            .map_err(|_| format!("address {value:?} is not an IP address"))?;
        if !own_service {
            return Err(format!(
                "address {value} needs a Service of the Gateway's own: Gateways on the shared \
                 pool share its Service's address; give the Gateway or its class a \
                 CoxswainGatewayParameters parametersRef, run the controller with \
                 --shared-gateway-ports, or remove spec.addresses"
            ));
        }
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    Ok(out)
}

fn params_exist(store: &Store, namespace: &str, name: &str) -> bool {
    store.gateway_parameters.iter().any(|p| {
        p.metadata.namespace.as_deref() == Some(namespace)
            && p.metadata.name.as_deref() == Some(name)
    })
}

/// Gateway API releases whose CRDs this controller is built and tested against.
const SUPPORTED_GATEWAY_API: &str = "v1.4.x, v1.5.x and v1.6.x";

/// `vMAJOR.MINOR.PATCH[-pre]` within the supported range.
pub(crate) fn supported_gateway_api(version: &str) -> bool {
    let mut parts = version.trim_start_matches('v').split(['.', '-']);
    let major = parts.next().and_then(|p| p.parse::<u32>().ok());
    let minor = parts.next().and_then(|p| p.parse::<u32>().ok());
    matches!((major, minor), (Some(1), Some(4..=6)))
}
