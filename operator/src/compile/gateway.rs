//! GatewayClasses and Gateways: acceptance, listener validation and conflicts.

use super::Config;
use super::refs::{self, GATEWAY_GROUP, Index};
use super::route::RouteKind;
use super::status::ListenerSetStatus;
use super::status::{Condition, GatewayStatus, ListenerStatus, ObjectKey, RouteGroupKind, reason};
use super::store::Store;
use coxswain_api::snapshot::Protocol;
use gateway_api::apis::standard::gateways::{
    Gateway, GatewayAllowedListenersNamespacesFrom, GatewayListeners,
    GatewayListenersAllowedRoutesNamespacesFrom, GatewayListenersTlsMode,
};
use gateway_api::apis::standard::listenersets::ListenerSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::{BTreeMap, BTreeSet};

// Where it always lived: the Ingress compiler names it through this module.
pub use super::scope::ScopeKey;

/// A listener that passed validation, as routes see it.
#[derive(Debug, Clone)]
pub struct AcceptedListener {
    pub name: String,
    pub port: u32,
    pub protocol: Protocol,
    pub hostname: Option<String>,
    pub allowed_namespaces: AllowedNamespaces,
    /// The route kinds that may attach (allowedRoutes.kinds, narrowed to what we serve).
    pub route_kinds: Vec<RouteKind>,
    /// HTTPS: the certificate's name in the snapshot.
    pub certificate: Option<String>,
    /// False for a listener whose only problem is an unresolved reference (a missing or
    /// unreadable certificate): routes still attach to it and are counted in attachedRoutes,
    /// as the spec asks, but it serves nothing.
    pub programmable: bool,
    /// The ListenerSet that adds this listener to the Gateway; None: the Gateway's own.
    /// Routes reach a listener only through a parentRef to its owner.
    pub owner: Option<ObjectKey>,
}

impl AcceptedListener {
    /// The namespace `allowedRoutes.namespaces.from: Same` means: the owner's.
    pub fn owner_namespace<'a>(&'a self, gateway: &'a ObjectKey) -> &'a str {
        self.owner
            .as_ref()
            .map_or(&gateway.namespace, |o| &o.namespace)
    }
}

/// The listener names and ports of one accepted ListenerSet, so a parentRef's sectionName or
/// port can be told apart from one that does not exist.
#[derive(Debug, Clone, Default)]
pub struct ListenerNames {
    pub names: BTreeSet<String>,
    pub ports: BTreeSet<u32>,
}

#[derive(Debug, Clone)]
pub enum AllowedNamespaces {
    Same,
    All,
    /// A label selector, already evaluated: the namespaces it selects.
    Selected(BTreeSet<String>),
}

/// A Gateway this controller serves.
#[derive(Debug, Clone)]
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
        let mut gateway_problem: Option<(&'static str, String)> = None;
        if !class_accepted {
            gateway_problem = Some((
                reason::INVALID,
                format!("GatewayClass {class} is not accepted"),
            ));
        } else if let Some(p) = infra_ref {
            if !is_our_params_ref(&p.group, &p.kind) {
                gateway_problem = Some((
                    reason::INVALID_PARAMETERS,
                    format!(
                        "infrastructure.parametersRef must be gateway.coxswain-labs.dev/CoxswainGatewayParameters, not {}/{}",
                        p.group, p.kind
                    ),
                ));
            } else if !params_exist(store, &key.namespace, &p.name) {
                gateway_problem = Some((
                    reason::INVALID_PARAMETERS,
                    format!(
                        "CoxswainGatewayParameters {}/{} not found",
                        key.namespace, p.name
                    ),
                ));
            }
        }
        let requested_addresses = match requested_addresses(gateway, dedicated) {
            Ok(addresses) => addresses,
            Err(problem) => {
                if gateway_problem.is_none() {
                    gateway_problem = Some((reason::UNSUPPORTED_ADDRESS, problem));
                }
                Vec::new()
            }
        };

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
        );
        let valid = accepted.iter().filter(|l| l.programmable).count();
        let total = gateway.spec.listeners.len();
        let (accepted_cond, programmed_cond) = match &gateway_problem {
            Some((r, msg)) => (
                Condition::new(reason::ACCEPTED, false, r, msg.clone(), generation),
                Condition::new(
                    reason::PROGRAMMED,
                    false,
                    reason::INVALID,
                    msg.clone(),
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

        // ListenerSets after the Gateway's own listeners, oldest first: each listener that
        // conflicts with one taken before it is the one turned away.
        let mut sets: Vec<&ListenerSet> = store
            .listener_sets
            .iter()
            .filter(|ls| listener_set_parent(ls) == key)
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
            let listeners: Result<Vec<GatewayListeners>, _> = ls
                .spec
                .listeners
                .iter()
                .map(|l| serde_json::to_value(l).and_then(serde_json::from_value))
                .collect();
            let Ok(listeners) = listeners else {
                out.listener_set_status.insert(
                    ls_key,
                    refused(reason::INVALID, "its listeners cannot be read".into()),
                );
                continue;
            };
            let (statuses, ls_accepted) = compile_listeners(
                store,
                index,
                &listeners,
                &key,
                Some(&ls_key),
                ls_generation,
                &mut taken,
                &mut out.certificates,
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
            .and_then(|s| serde_json::to_value(s).ok())
            .and_then(|s| serde_json::from_value::<LabelSelector>(s).ok())
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
/// address, which the Service gets anyway. The shared pool's Service belongs to every shared
/// Gateway, so only a dedicated proxy can take a Gateway's own address.
pub fn requested_addresses(
    gateway: &Gateway,
    dedicated: bool,
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
        if !dedicated {
            return Err(format!(
                "address {value} needs a dedicated proxy: Gateways on the shared pool share its \
                 Service's address; give the Gateway or its class a CoxswainGatewayParameters \
                 parametersRef, or remove spec.addresses"
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

/// The route kinds a listener of `protocol` serves, in the order supportedKinds lists them.
fn served_kinds(protocol: Option<Protocol>) -> &'static [RouteKind] {
    match protocol {
        Some(Protocol::Http | Protocol::Https) => &[RouteKind::Http, RouteKind::Grpc],
        Some(Protocol::TlsPassthrough) => &[RouteKind::Tls],
        _ => &[],
    }
}

fn route_group_kind(kind: RouteKind) -> RouteGroupKind {
    RouteGroupKind {
        group: GATEWAY_GROUP.into(),
        kind: kind.name().into(),
    }
}

/// Validates each listener and finds conflicts between them (Gateway API: listeners on one
/// port must agree on protocol, and HTTP(S) listeners sharing a port need distinct hostnames).
/// A listener that holds its port and hostname, for the conflict checks of the ListenerSets
/// after it.
pub struct Taken {
    port: i32,
    protocol: (String, Option<GatewayListenersTlsMode>),
    hostname: String,
    /// "listener N of Gateway/ListenerSet ns/name", for messages.
    what: String,
}

/// `(protocol, TLS mode)` as conflicts compare them.
fn protocol_of(l: &GatewayListeners) -> (String, Option<GatewayListenersTlsMode>) {
    (
        normalized_protocol(&l.protocol),
        l.tls.as_ref().and_then(|t| t.mode.clone()),
    )
}

/// Why two listeners on one port cannot both be served, if they cannot: another protocol
/// (TLS listeners that terminate and TLS listeners that pass through cannot share a port
/// either: the first bytes of a connection cannot tell them apart), or the same hostname.
fn conflict_between(
    a: (&(String, Option<GatewayListenersTlsMode>), &str),
    b: (&(String, Option<GatewayListenersTlsMode>), &str),
) -> Option<&'static str> {
    let (pa, ha) = a;
    let (pb, hb) = b;
    let tls_modes_differ = pa.0 == "TLS" && pb.0 == "TLS" && pa.1 != pb.1;
    if pa.0 != pb.0 || tls_modes_differ {
        Some(reason::PROTOCOL_CONFLICT)
    } else if ha == hb {
        Some(reason::HOSTNAME_CONFLICT)
    } else {
        None
    }
}

/// Validates `listeners`: a Gateway's own (`owner` None) or one ListenerSet's. A ListenerSet's
/// listener that conflicts with one in `taken` (the Gateway's, then older ListenerSets') is
/// refused; those it keeps are added to `taken`.
#[allow(clippy::too_many_arguments)]
fn compile_listeners(
    store: &Store,
    index: &Index<'_>,
    listeners: &[GatewayListeners],
    key: &ObjectKey,
    owner: Option<&ObjectKey>,
    generation: i64,
    taken: &mut Vec<Taken>,
    certificates: &mut BTreeMap<String, (String, String)>,
) -> (Vec<ListenerStatus>, Vec<AcceptedListener>) {
    // A ListenerSet's listener that collides with one taken before it.
    let mut refused: BTreeMap<&str, (&'static str, String)> = BTreeMap::new();
    if owner.is_some() {
        for l in listeners {
            let mine = protocol_of(l);
            let host = l.hostname.as_deref().unwrap_or("");
            if let Some((why, t)) = taken.iter().filter(|t| t.port == l.port).find_map(|t| {
                conflict_between((&mine, host), (&t.protocol, &t.hostname)).map(|why| (why, t))
            }) {
                let message = if why == reason::PROTOCOL_CONFLICT {
                    format!(
                        "port {} is already used by {} with protocol {}",
                        l.port, t.what, t.protocol.0
                    )
                } else {
                    format!(
                        "port {} and hostname {host:?} are already used by {}",
                        l.port, t.what
                    )
                };
                refused.insert(&l.name, (why, message));
            }
        }
    }
    // Conflicts first: they depend on all listeners together.
    let mut conflicts: BTreeMap<&str, (&'static str, String)> = BTreeMap::new();
    for (i, a) in listeners.iter().enumerate() {
        for (j, b) in listeners.iter().enumerate() {
            // Listeners already turned away take no part.
            if i == j
                || a.port != b.port
                || refused.contains_key(a.name.as_str())
                || refused.contains_key(b.name.as_str())
            {
                continue;
            }
            // TLS listeners that terminate and TLS listeners that pass through cannot share a
            // port either: the first bytes of a connection cannot tell them apart.
            let pa = (
                normalized_protocol(&a.protocol),
                a.tls.as_ref().and_then(|t| t.mode.clone()),
            );
            let pb = (
                normalized_protocol(&b.protocol),
                b.tls.as_ref().and_then(|t| t.mode.clone()),
            );
            let tls_modes_differ = pa.0 == "TLS" && pb.0 == "TLS" && pa.1 != pb.1;
            if pa.0 != pb.0 || tls_modes_differ {
                conflicts.entry(&a.name).or_insert((
                    reason::PROTOCOL_CONFLICT,
                    if tls_modes_differ {
                        format!(
                            "port {} is also used by listener {} with TLS mode {}",
                            a.port,
                            b.name,
                            if pb.1 == Some(GatewayListenersTlsMode::Passthrough) {
                                "Passthrough"
                            } else {
                                "Terminate"
                            }
                        )
                    } else {
                        format!(
                            "port {} is also used by listener {} with protocol {}",
                            a.port, b.name, b.protocol
                        )
                    },
                ));
            } else if a.hostname.as_deref().unwrap_or("") == b.hostname.as_deref().unwrap_or("") {
                conflicts.entry(&a.name).or_insert((
                    reason::HOSTNAME_CONFLICT,
                    format!(
                        "listener {} uses the same port {} and hostname {:?}",
                        b.name,
                        b.port,
                        b.hostname.as_deref().unwrap_or("")
                    ),
                ));
            }
        }
    }

    let mut statuses = Vec::new();
    let mut accepted = Vec::new();
    for l in listeners {
        let mut conditions = Vec::new();
        let tls_mode = l.tls.as_ref().and_then(|t| t.mode.clone());
        let passthrough = tls_mode == Some(GatewayListenersTlsMode::Passthrough);
        let protocol = match normalized_protocol(&l.protocol).as_str() {
            "HTTP" => Some(Protocol::Http),
            "HTTPS" if !passthrough => Some(Protocol::Https),
            // TLS terminated here and then relayed (TLSRoute mode Terminate) is not served.
            "TLS" if passthrough => Some(Protocol::TlsPassthrough),
            _ => None,
        };
        let (supported_kinds, kinds_ok) = supported_kinds(l, protocol);
        let route_kinds: Vec<RouteKind> = supported_kinds
            .iter()
            .filter_map(|k| RouteKind::from_name(&k.kind))
            .collect();
        let port = u32::try_from(l.port)
            .ok()
            .filter(|p| (1..=65535).contains(p));

        let mut accepted_problem: Option<(&'static str, String)> = None;
        match normalized_protocol(&l.protocol).as_str() {
            "HTTPS" if passthrough => {
                accepted_problem = Some((
                    reason::UNSUPPORTED_VALUE,
                    "HTTPS listeners terminate TLS; tls.mode Passthrough needs protocol TLS".into(),
                ));
            }
            "TLS" if !passthrough => {
                accepted_problem = Some((
                    reason::UNSUPPORTED_VALUE,
                    "TLS listeners pass TLS through to the backend (tls.mode Passthrough); \
                     mode Terminate is not supported, use protocol HTTPS to terminate TLS"
                        .into(),
                ));
            }
            _ if protocol.is_none() => {
                accepted_problem = Some((
                    reason::UNSUPPORTED_PROTOCOL,
                    format!(
                        "protocol {} is not supported; use HTTP, HTTPS or TLS",
                        l.protocol
                    ),
                ));
            }
            _ if port.is_none() => {
                accepted_problem = Some((
                    reason::UNSUPPORTED_VALUE,
                    format!("port {} is out of range", l.port),
                ));
            }
            _ => {}
        }

        // A listener whose port another listener claims with another protocol generates no
        // configuration: not accepted, whatever else is wrong with it.
        if let Some((reason::PROTOCOL_CONFLICT, message)) = conflicts.get(l.name.as_str()) {
            accepted_problem = Some((reason::PROTOCOL_CONFLICT, message.clone()));
        }
        // A ListenerSet's listener turned away by an earlier one is not accepted either.
        let turned_away = refused.get(l.name.as_str());
        if let Some((why, message)) = turned_away {
            accepted_problem = Some((why, message.clone()));
        }

        // ResolvedRefs: route kinds and certificates.
        let mut resolved_problem: Option<(&'static str, String)> = None;
        if !kinds_ok {
            resolved_problem = Some((
                reason::INVALID_ROUTE_KINDS,
                format!(
                    "allowedRoutes.kinds lists a kind this listener cannot serve; it serves {}",
                    served_kinds(protocol)
                        .iter()
                        .map(|k| k.name())
                        .collect::<Vec<_>>()
                        .join(" and ")
                ),
            ));
        }
        let mut certificate = None;
        if protocol == Some(Protocol::Https) && accepted_problem.is_none() {
            let from = match owner {
                Some(ls) => (ls, "ListenerSet"),
                None => (key, "Gateway"),
            };
            match resolve_certificate(store, index, l, from) {
                Ok((name, pair)) => {
                    certificates.insert(name.clone(), pair);
                    certificate = Some(name);
                }
                Err(problem) => resolved_problem = resolved_problem.or(Some(problem)),
            }
        }

        let conflict = turned_away.or(conflicts.get(l.name.as_str()));
        conditions.push(match &accepted_problem {
            Some((r, m)) => Condition::new(reason::ACCEPTED, false, r, m.clone(), generation),
            None => Condition::new(reason::ACCEPTED, true, reason::ACCEPTED, "", generation),
        });
        conditions.push(match &resolved_problem {
            Some((r, m)) => Condition::new(reason::RESOLVED_REFS, false, r, m.clone(), generation),
            None => Condition::new(
                reason::RESOLVED_REFS,
                true,
                reason::RESOLVED_REFS,
                "",
                generation,
            ),
        });
        conditions.push(match conflict {
            Some((r, m)) => Condition::new(reason::CONFLICTED, true, r, m.clone(), generation),
            None => Condition::new(
                reason::CONFLICTED,
                false,
                reason::NO_CONFLICTS,
                "",
                generation,
            ),
        });
        let usable = accepted_problem.is_none() && resolved_problem.is_none() && conflict.is_none();
        conditions.push(if usable {
            Condition::new(
                reason::PROGRAMMED,
                false,
                reason::PENDING,
                "waiting for a proxy to bind the port",
                generation,
            )
        } else if let Some((why, message)) = turned_away {
            Condition::new(reason::PROGRAMMED, false, why, message.clone(), generation)
        } else {
            Condition::new(
                reason::PROGRAMMED,
                false,
                reason::INVALID,
                "the listener is not valid",
                generation,
            )
        });
        statuses.push(ListenerStatus {
            name: l.name.clone(),
            supported_kinds,
            attached_routes: 0,
            conditions,
        });
        let attachable = usable || (kinds_ok && accepted_problem.is_none() && conflict.is_none());
        if let (true, Some(port), Some(protocol)) = (attachable, port, protocol) {
            accepted.push(AcceptedListener {
                name: l.name.clone(),
                port,
                protocol,
                hostname: l.hostname.clone().filter(|h| !h.is_empty()),
                allowed_namespaces: allowed_namespaces(store, l),
                route_kinds,
                certificate,
                programmable: usable,
                owner: owner.cloned(),
            });
        }
        // The Gateway's listeners all hold their place; a ListenerSet's only when kept.
        if owner.is_none() || conflict.is_none() {
            taken.push(Taken {
                port: l.port,
                protocol: protocol_of(l),
                hostname: l.hostname.clone().unwrap_or_default(),
                what: match owner {
                    Some(ls) => format!("listener {} of ListenerSet {ls}", l.name),
                    None => format!("listener {} of Gateway {key}", l.name),
                },
            });
        }
    }
    (statuses, accepted)
}

fn normalized_protocol(p: &str) -> String {
    p.to_ascii_uppercase()
}

/// supportedKinds and whether every listed kind is one we serve.
fn supported_kinds(
    l: &GatewayListeners,
    protocol: Option<Protocol>,
) -> (Vec<RouteGroupKind>, bool) {
    let served = served_kinds(protocol);
    let all = || -> Vec<RouteGroupKind> { served.iter().map(|k| route_group_kind(*k)).collect() };
    let listed = l.allowed_routes.as_ref().and_then(|a| a.kinds.as_ref());
    match listed {
        None => (all(), true),
        Some(kinds) if kinds.is_empty() => (all(), true),
        Some(kinds) => {
            let mut supported = Vec::new();
            let mut all_ok = true;
            for k in kinds {
                let group = k.group.as_deref().unwrap_or(GATEWAY_GROUP);
                match RouteKind::from_name(&k.kind) {
                    Some(kind) if group == GATEWAY_GROUP && served.contains(&kind) => {
                        let gk = route_group_kind(kind);
                        if !supported.contains(&gk) {
                            supported.push(gk);
                        }
                    }
                    _ => all_ok = false,
                }
            }
            (supported, all_ok)
        }
    }
}

fn allowed_namespaces(store: &Store, l: &GatewayListeners) -> AllowedNamespaces {
    let Some(ns) = l
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref())
    else {
        return AllowedNamespaces::Same;
    };
    match ns.from {
        None | Some(GatewayListenersAllowedRoutesNamespacesFrom::Same) => AllowedNamespaces::Same,
        Some(GatewayListenersAllowedRoutesNamespacesFrom::All) => AllowedNamespaces::All,
        Some(GatewayListenersAllowedRoutesNamespacesFrom::Selector) => {
            let selector = ns.selector.as_ref();
            let selected = store
                .namespaces
                .iter()
                .filter(|n| {
                    let labels = n.metadata.labels.clone().unwrap_or_default();
                    selector.is_some_and(|s| {
                        s.match_labels
                            .iter()
                            .flatten()
                            .all(|(k, v)| labels.get(k) == Some(v))
                            && s.match_expressions.iter().flatten().all(|e| {
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
                    })
                })
                .filter_map(|n| n.metadata.name.clone())
                .collect();
            AllowedNamespaces::Selected(selected)
        }
    }
}

impl AllowedNamespaces {
    pub fn allows(&self, gateway_ns: &str, route_ns: &str) -> bool {
        match self {
            Self::Same => gateway_ns == route_ns,
            Self::All => true,
            Self::Selected(set) => set.contains(route_ns),
        }
    }
}

/// A certificate chain and private key, PEM.
type KeyPair = (String, String);

/// The first certificateRef of an HTTPS listener, resolved to a key pair.
/// `from`: the object whose listener it is (a Gateway or a ListenerSet) and its kind, which
/// ReferenceGrants name.
fn resolve_certificate(
    store: &Store,
    index: &Index<'_>,
    l: &GatewayListeners,
    from: (&ObjectKey, &str),
) -> Result<(String, KeyPair), (&'static str, String)> {
    let (gateway, from_kind) = from;
    let refs = l.tls.as_ref().and_then(|t| t.certificate_refs.as_ref());
    let Some(r) = refs.and_then(|r| r.first()) else {
        return Err((
            reason::INVALID_CERTIFICATE_REF,
            "an HTTPS listener needs tls.certificateRefs".into(),
        ));
    };
    let group = r.group.as_deref().unwrap_or("");
    let kind = r.kind.as_deref().unwrap_or("Secret");
    if !group.is_empty() || kind != "Secret" {
        return Err((
            reason::INVALID_CERTIFICATE_REF,
            format!(
                "certificateRef {group}/{kind} {} is not a core Secret",
                r.name
            ),
        ));
    }
    let ns = r.namespace.as_deref().unwrap_or(&gateway.namespace);
    if !refs::permitted(
        store,
        GATEWAY_GROUP,
        from_kind,
        &gateway.namespace,
        "",
        "Secret",
        ns,
        &r.name,
    ) {
        return Err((
            reason::REF_NOT_PERMITTED,
            format!(
                "no ReferenceGrant in {ns} allows {from_kind}s in {} to use Secret {}",
                gateway.namespace, r.name
            ),
        ));
    }
    let Some(secret) = index.secret(ns, &r.name) else {
        return Err((
            reason::INVALID_CERTIFICATE_REF,
            format!("Secret {ns}/{} not found", r.name),
        ));
    };
    let pair = refs::tls_key_pair(secret).map_err(|m| {
        (
            reason::INVALID_CERTIFICATE_REF,
            format!("Secret {ns}/{}: {m}", r.name),
        )
    })?;
    Ok((format!("{ns}/{}", r.name), pair))
}

/// Gateway API releases whose CRDs this controller is built and tested against.
const SUPPORTED_GATEWAY_API: &str = "v1.4.x and v1.5.x";

/// `vMAJOR.MINOR.PATCH[-pre]` within the supported range.
pub(crate) fn supported_gateway_api(version: &str) -> bool {
    let mut parts = version.trim_start_matches('v').split(['.', '-']);
    let major = parts.next().and_then(|p| p.parse::<u32>().ok());
    let minor = parts.next().and_then(|p| p.parse::<u32>().ok());
    matches!((major, minor), (Some(1), Some(4 | 5)))
}
