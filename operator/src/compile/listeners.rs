//! Listeners, of a Gateway or of a ListenerSet: validation, conflicts between them, the route
//! kinds and namespaces they admit, and their certificates.

use super::gateway_tls::{FrontendTls, PortValidation};
use super::refs::{self, GATEWAY_GROUP, Index};
use super::route::RouteKind;
use super::status::{Condition, ListenerStatus, ObjectKey, Problem, RouteGroupKind, reason};
use super::store::Store;
use coxswain_api::snapshot::{ClientValidation, Protocol};
use gateway_api::apis::standard::gateways::{
    GatewayListeners, GatewayListenersAllowedRoutesNamespacesFrom, GatewayListenersTlsMode,
};
use std::collections::{BTreeMap, BTreeSet};

/// A listener that passed validation, as routes see it.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptedListener {
    pub name: String,
    /// The listener's port, as clients and parentRefs name it.
    pub port: u32,
    /// The port the proxies listen on for it: `port`, or a shared Gateway's internal port
    /// (see `gateway_services`).
    pub bind_port: u32,
    pub protocol: Protocol,
    pub hostname: Option<String>,
    pub allowed_namespaces: AllowedNamespaces,
    /// The route kinds that may attach (allowedRoutes.kinds, narrowed to what we serve).
    pub route_kinds: Vec<RouteKind>,
    /// HTTPS, or TLS with mode Terminate: the certificate's name in the snapshot.
    pub certificate: Option<String>,
    /// TLS with mode Terminate: the proxy ends TLS and relays the plaintext to the backend.
    pub terminate_tls: bool,
    /// HTTPS: the client certificates its port verifies (the Gateway's spec.tls.frontend).
    pub client_validation: Option<ClientValidation>,
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

#[derive(Debug, Clone, PartialEq)]
pub enum AllowedNamespaces {
    Same,
    All,
    /// A label selector, already evaluated: the namespaces it selects.
    Selected(BTreeSet<String>),
}

/// The route kinds a listener of `protocol` serves, in the order supportedKinds lists them.
fn served_kinds(protocol: Option<Protocol>) -> &'static [RouteKind] {
    match protocol {
        Some(Protocol::Http | Protocol::Https) => &[RouteKind::Http, RouteKind::Grpc],
        Some(Protocol::Tls) => &[RouteKind::Tls],
        Some(Protocol::Tcp) => &[RouteKind::Tcp],
        Some(Protocol::Udp) => &[RouteKind::Udp],
        _ => &[],
    }
}

fn route_group_kind(kind: RouteKind) -> RouteGroupKind {
    RouteGroupKind {
        group: GATEWAY_GROUP.into(),
        kind: kind.name().into(),
    }
}

/// A listener that holds its port and hostname, for the conflict checks of the ListenerSets
/// after it.
pub struct Taken {
    port: i32,
    protocol: String,
    hostname: String,
    /// "listener N of Gateway/ListenerSet ns/name", for messages.
    what: String,
}

/// Why two listeners on one port cannot both be served, if they cannot: another protocol, or
/// the same hostname. TLS listeners that terminate and TLS listeners that pass through may
/// share a port: the proxy reads the ClientHello's SNI before it decides (TLSRouteModeMixed).
fn conflict_between(a: (&str, &str), b: (&str, &str)) -> Option<&'static str> {
    let (pa, ha) = a;
    let (pb, hb) = b;
    if pa != pb {
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
pub(super) fn compile_listeners(
    store: &Store,
    index: &Index<'_>,
    listeners: &[GatewayListeners],
    key: &ObjectKey,
    owner: Option<&ObjectKey>,
    generation: i64,
    taken: &mut Vec<Taken>,
    certificates: &mut BTreeMap<String, (String, String)>,
    frontend: &FrontendTls,
) -> (Vec<ListenerStatus>, Vec<AcceptedListener>) {
    // A ListenerSet's listener that collides with one taken before it.
    let mut refused: BTreeMap<&str, Problem> = BTreeMap::new();
    if owner.is_some() {
        for l in listeners {
            let mine = normalized_protocol(&l.protocol);
            let host = routing_hostname(l);
            if let Some((why, t)) = taken.iter().filter(|t| t.port == l.port).find_map(|t| {
                conflict_between((&mine, host), (&t.protocol, &t.hostname)).map(|why| (why, t))
            }) {
                let message = if why == reason::PROTOCOL_CONFLICT {
                    format!(
                        "port {} is already used by {} with protocol {}",
                        l.port, t.what, t.protocol
                    )
                } else {
                    format!(
                        "port {} and hostname {host:?} are already used by {}",
                        l.port, t.what
                    )
                };
                refused.insert(&l.name, Problem::new(why, message));
            }
        }
    }
    // Conflicts first: they depend on all listeners together.
    let mut conflicts: BTreeMap<&str, Problem> = BTreeMap::new();
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
            if normalized_protocol(&a.protocol) != normalized_protocol(&b.protocol) {
                conflicts.entry(&a.name).or_insert(Problem::new(
                    reason::PROTOCOL_CONFLICT,
                    format!(
                        "port {} is also used by listener {} with protocol {}",
                        a.port, b.name, b.protocol
                    ),
                ));
            } else if routing_hostname(a) == routing_hostname(b) {
                conflicts.entry(&a.name).or_insert(Problem::new(
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
            "TLS" => Some(Protocol::Tls),
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            _ => None,
        };
        // Terminate is the default mode: TLS ends here and the plaintext goes to the backend.
        let terminate_tls = protocol == Some(Protocol::Tls) && !passthrough;
        let terminates = protocol == Some(Protocol::Https) || terminate_tls;
        let (supported_kinds, kinds_ok) = supported_kinds(l, protocol);
        let route_kinds: Vec<RouteKind> = supported_kinds
            .iter()
            .filter_map(|k| RouteKind::from_name(&k.kind))
            .collect();
        let port = u32::try_from(l.port)
            .ok()
            .filter(|p| (1..=65535).contains(p));

        let mut accepted_problem: Option<Problem> = None;
        match normalized_protocol(&l.protocol).as_str() {
            "HTTPS" if passthrough => {
                accepted_problem = Some(Problem::new(
                    reason::UNSUPPORTED_VALUE,
                    "HTTPS listeners terminate TLS; tls.mode Passthrough needs protocol TLS".into(),
                ));
            }
            _ if protocol.is_none() => {
                accepted_problem = Some(Problem::new(
                    reason::UNSUPPORTED_PROTOCOL,
                    format!(
                        "protocol {} is not supported; use HTTP, HTTPS, TLS, TCP or UDP",
                        l.protocol
                    ),
                ));
            }
            _ if port.is_none() => {
                accepted_problem = Some(Problem::new(
                    reason::UNSUPPORTED_VALUE,
                    format!("port {} is out of range", l.port),
                ));
            }
            _ => {}
        }

        // A listener whose port another listener claims with another protocol generates no
        // configuration: not accepted, whatever else is wrong with it.
        if let Some(
            p @ Problem {
                reason: reason::PROTOCOL_CONFLICT,
                ..
            },
        ) = conflicts.get(l.name.as_str())
        {
            accepted_problem = Some(p.clone());
        }
        // A ListenerSet's listener turned away by an earlier one is not accepted either.
        let turned_away = refused.get(l.name.as_str());
        if let Some(p) = turned_away {
            accepted_problem = Some(p.clone());
        }

        // ResolvedRefs: route kinds and certificates.
        let mut resolved_problem: Option<Problem> = None;
        if !kinds_ok {
            resolved_problem = Some(Problem::new(
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
        if terminates && accepted_problem.is_none() {
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
        // Client certificates (GEP-91): a port whose CAs all failed serves nothing rather than
        // let clients in unverified.
        let mut client_validation = None;
        if terminates && accepted_problem.is_none() {
            match frontend.for_port(l.port) {
                PortValidation::None => {}
                PortValidation::Valid {
                    validation,
                    partial,
                } => {
                    client_validation = Some(validation);
                    resolved_problem = resolved_problem.or(partial);
                }
                PortValidation::Invalid { accepted, resolved } => {
                    accepted_problem = Some(accepted);
                    resolved_problem = resolved_problem.or(resolved);
                }
            }
        }

        let conflict = turned_away.or(conflicts.get(l.name.as_str()));
        conditions.push(match &accepted_problem {
            Some(p) => p.condition(reason::ACCEPTED, generation),
            None => Condition::new(reason::ACCEPTED, true, reason::ACCEPTED, "", generation),
        });
        conditions.push(match &resolved_problem {
            Some(p) => p.condition(reason::RESOLVED_REFS, generation),
            None => Condition::new(
                reason::RESOLVED_REFS,
                true,
                reason::RESOLVED_REFS,
                "",
                generation,
            ),
        });
        conditions.push(match conflict {
            // Conflicted is the one condition whose True is the bad state.
            Some(p) => Condition::new(
                reason::CONFLICTED,
                true,
                p.reason,
                p.message.clone(),
                generation,
            ),
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
        } else if let Some(p) = turned_away {
            p.condition(reason::PROGRAMMED, generation)
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
                bind_port: port,
                protocol,
                hostname: Some(routing_hostname(l))
                    .filter(|h| !h.is_empty())
                    .map(str::to_owned),
                allowed_namespaces: allowed_namespaces(store, l),
                route_kinds,
                certificate,
                terminate_tls,
                client_validation,
                programmable: usable,
                owner: owner.cloned(),
            });
        }
        // The Gateway's listeners all hold their place; a ListenerSet's only when kept.
        if owner.is_none() || conflict.is_none() {
            taken.push(Taken {
                port: l.port,
                protocol: normalized_protocol(&l.protocol),
                hostname: routing_hostname(l).to_owned(),
                what: match owner {
                    Some(ls) => format!("listener {} of ListenerSet {ls}", l.name),
                    None => format!("listener {} of Gateway {key}", l.name),
                },
            });
        }
    }
    (statuses, accepted)
}

/// The hostname that tells a listener's connections apart from its port's other listeners':
/// none for TCP and UDP, whose traffic carries no name (the field is ignored, as the spec
/// allows).
fn routing_hostname(l: &GatewayListeners) -> &str {
    if matches!(normalized_protocol(&l.protocol).as_str(), "TCP" | "UDP") {
        ""
    } else {
        l.hostname.as_deref().unwrap_or("")
    }
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
) -> Result<(String, KeyPair), Problem> {
    let (gateway, from_kind) = from;
    let refs = l.tls.as_ref().and_then(|t| t.certificate_refs.as_ref());
    let Some(r) = refs.and_then(|r| r.first()) else {
        return Err(Problem::new(
            reason::INVALID_CERTIFICATE_REF,
            "a listener that terminates TLS needs tls.certificateRefs".into(),
        ));
    };
    let group = r.group.as_deref().unwrap_or("");
    let kind = r.kind.as_deref().unwrap_or("Secret");
    if !group.is_empty() || kind != "Secret" {
        return Err(Problem::new(
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
        return Err(Problem::new(
            reason::REF_NOT_PERMITTED,
            format!(
                "no ReferenceGrant in {ns} allows {from_kind}s in {} to use Secret {}",
                gateway.namespace, r.name
            ),
        ));
    }
    let Some(secret) = index.secret(ns, &r.name) else {
        return Err(Problem::new(
            reason::INVALID_CERTIFICATE_REF,
            format!("Secret {ns}/{} not found", r.name),
        ));
    };
    let pair = refs::tls_key_pair(secret).map_err(|m| {
        Problem::new(
            reason::INVALID_CERTIFICATE_REF,
            format!("Secret {ns}/{}: {m}", r.name),
        )
    })?;
    Ok((format!("{ns}/{}", r.name), pair))
}
