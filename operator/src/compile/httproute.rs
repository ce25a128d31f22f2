//! HTTPRoutes and GRPCRoutes: attachment to Gateway listeners, rules to snapshot routes, and
//! the `status.parents` entries this controller owns. A GRPCRoute is first read as the
//! HTTPRoute it is equivalent to ([`super::grpcroute`]), then compiled by the same code.

use super::Config;
use super::entries::{Entry, PrecedenceKey};
use super::gateway::{AcceptedListener, ServedGateway};
use super::hostname;
use super::refs::{self, GATEWAY_GROUP, Index};
use super::status::{Condition, ObjectKey, ParentRef, RouteParentStatus, reason};
use super::store::Store;
use coxswain_api::snapshot::{
    self as snap, Filter, HeaderMatch, PathMatch, QueryParamMatch, RouteMatch, RouteSource,
    WeightedBackend, filter,
};
use gateway_api::apis::experimental::httproutes::{
    HttpRoute, HttpRouteParentRefs, HttpRouteRules, HttpRouteRulesFilters, HttpRouteRulesMatches,
    HttpRouteRulesMatchesHeadersType, HttpRouteRulesMatchesPathType,
    HttpRouteRulesMatchesQueryParamsType, HttpRouteSpec,
};
use std::collections::BTreeMap;

/// The route kinds compiled here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RouteKind {
    Http,
    Grpc,
    Tls,
}

impl RouteKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Http => "HTTPRoute",
            Self::Grpc => "GRPCRoute",
            Self::Tls => "TLSRoute",
        }
    }

    pub fn from_name(kind: &str) -> Option<Self> {
        match kind {
            "HTTPRoute" => Some(Self::Http),
            "GRPCRoute" => Some(Self::Grpc),
            "TLSRoute" => Some(Self::Tls),
            _ => None,
        }
    }
}

pub struct RouteOutput {
    pub entries: Vec<Entry>,
    pub status: BTreeMap<ObjectKey, Vec<RouteParentStatus>>,
    pub grpc_status: BTreeMap<ObjectKey, Vec<RouteParentStatus>>,
    pub tls_status: BTreeMap<ObjectKey, Vec<RouteParentStatus>>,
    /// (gateway, owning ListenerSet, listener name) -> number of attached routes
    pub attached: BTreeMap<(ObjectKey, Option<ObjectKey>, String), i32>,
    /// (namespace, Service) -> the Gateways whose accepted routes send to it: the ancestors
    /// of the BackendTLSPolicies targeting it.
    pub service_gateways: BTreeMap<(String, String), std::collections::BTreeSet<ObjectKey>>,
    pub clusters: Vec<snap::Cluster>,
}

/// A rule compiled once, shared by every listener the route attaches to.
struct CompiledRule {
    index: u32,
    name: String,
    matches: Vec<RouteMatch>,
    filters: Vec<Filter>,
    backends: Vec<WeightedBackend>,
    timeouts: Option<snap::Timeouts>,
    retry: Option<snap::Retry>,
    session_persistence: Option<snap::SessionPersistence>,
    direct_status: u32,
}

/// What every route's compilation reads.
struct Inputs<'a> {
    store: &'a Store,
    index: &'a Index<'a>,
    served: &'a BTreeMap<ObjectKey, ServedGateway>,
    config: &'a Config,
}

pub fn compile(
    store: &Store,
    index: &Index<'_>,
    served: &BTreeMap<ObjectKey, ServedGateway>,
    config: &Config,
) -> RouteOutput {
    let mut out = RouteOutput {
        entries: Vec::new(),
        status: BTreeMap::new(),
        grpc_status: BTreeMap::new(),
        tls_status: BTreeMap::new(),
        attached: BTreeMap::new(),
        service_gateways: BTreeMap::new(),
        clusters: Vec::new(),
    };
    let inputs = Inputs {
        store,
        index,
        served,
        config,
    };
    let grpc: Vec<(HttpRoute, Option<Problem>)> = store
        .grpc_routes
        .iter()
        .map(super::grpcroute::as_http_route)
        .collect();
    let tls: Vec<(HttpRoute, Option<Problem>)> = store
        .tls_routes
        .iter()
        .map(super::tlsroute::as_http_route)
        .collect();
    let routes: Vec<(RouteKind, &HttpRoute, Option<Problem>)> = store
        .http_routes
        .iter()
        .map(|r| (RouteKind::Http, r, None))
        .chain(grpc.iter().map(|(r, p)| (RouteKind::Grpc, r, p.clone())))
        .chain(tls.iter().map(|(r, p)| (RouteKind::Tls, r, p.clone())))
        .collect();
    let rejected = cross_kind_conflicts(&inputs, &routes);
    for (kind, route, problem) in routes {
        compile_route(&inputs, kind, route, problem, &rejected, &mut out);
    }
    out
}

/// The HTTPRoute a route of another kind is read as: its metadata, parentRefs and hostnames,
/// and `rules` already in HTTPRoute shape. If that does not read as an HTTPRoute spec, only
/// the parents are kept, so the route is still told why (the problem returned).
pub(super) fn equivalent_route(
    kind: &str,
    metadata: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    parent_refs: &impl serde::Serialize,
    hostnames: &impl serde::Serialize,
    rules: Option<Vec<serde_json::Value>>,
) -> (HttpRoute, Option<Problem>) {
    let spec = serde_json::json!({
        "parentRefs": parent_refs,
        "hostnames": hostnames,
        "rules": rules,
    });
    let (spec, problem) = match serde_json::from_value::<HttpRouteSpec>(spec) {
        Ok(spec) => (spec, None),
        Err(e) => (
            HttpRouteSpec {
                parent_refs: serde_json::to_value(parent_refs)
                    .and_then(serde_json::from_value)
                    .unwrap_or_default(),
                rules: Some(Vec::new()),
                ..Default::default()
            },
            Some((reason::UNSUPPORTED_VALUE, format!("{kind}: {e}"))),
        ),
    };
    let route = HttpRoute {
        metadata: metadata.clone(),
        spec,
        status: None,
    };
    (route, problem)
}

/// (route kind, route, Gateway, listener name) -> the route of the other kind that keeps the
/// hostnames they share on that listener.
/// (kind, route, Gateway, owning ListenerSet, listener) -> the route that keeps the slot.
type Rejections = BTreeMap<(RouteKind, ObjectKey, ObjectKey, Option<ObjectKey>, String), String>;

fn route_key(route: &HttpRoute) -> ObjectKey {
    ObjectKey::new(
        route.metadata.namespace.as_deref().unwrap_or("default"),
        route.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// The parentRefs of `route` that are Gateways this controller serves, or ListenerSets
/// accepted onto one (with the ListenerSet's key): only those are ours to report on.
fn served_parents<'r, 's>(
    route: &'r HttpRoute,
    key: &ObjectKey,
    served: &'s BTreeMap<ObjectKey, ServedGateway>,
) -> Vec<(
    &'r HttpRouteParentRefs,
    &'s ServedGateway,
    Option<ObjectKey>,
)> {
    route
        .spec
        .parent_refs
        .iter()
        .flatten()
        .filter_map(|p| {
            let group = p.group.as_deref().unwrap_or(GATEWAY_GROUP);
            let kind = p.kind.as_deref().unwrap_or("Gateway");
            let ns = p.namespace.as_deref().unwrap_or(&key.namespace);
            let target = ObjectKey::new(ns, &p.name);
            match (group, kind) {
                (GATEWAY_GROUP, "Gateway") => Some((p, served.get(&target)?, None)),
                // Refused ones too: the route is told why it does not attach.
                (GATEWAY_GROUP, "ListenerSet") => served
                    .values()
                    .find(|gw| {
                        gw.listener_sets.contains_key(&target)
                            || gw.refused_listener_sets.contains_key(&target)
                    })
                    .map(|gw| (p, gw, Some(target))),
                _ => None,
            }
        })
        .collect()
}

/// Gateway API (GRPCRoute hostnames): when an HTTPRoute and a GRPCRoute attached to one
/// listener share a hostname, exactly one is accepted there: the oldest, then the first by
/// namespace/name. Routes are taken in that order; each is turned away from a listener where
/// a route of the other kind taken before it serves an intersecting hostname.
fn cross_kind_conflicts(
    inputs: &Inputs<'_>,
    routes: &[(RouteKind, &HttpRoute, Option<Problem>)],
) -> Rejections {
    let mut rejected = Rejections::new();
    let has = |k: RouteKind| routes.iter().any(|r| r.0 == k);
    if !has(RouteKind::Http) || !has(RouteKind::Grpc) {
        return rejected;
    }
    let mut order: Vec<(RouteKind, &HttpRoute, ObjectKey)> = routes
        .iter()
        .filter(|r| r.2.is_none())
        .map(|(kind, route, _)| (*kind, *route, route_key(route)))
        .collect();
    order.sort_by(|a, b| {
        super::store::oldest_first(&a.1.metadata, &b.1.metadata).then_with(|| a.2.cmp(&b.2))
    });
    // (Gateway, ListenerSet, listener) -> the routes taken there: kind, "Kind ns/name",
    // hostnames.
    type Taken = Vec<(RouteKind, String, Vec<String>)>;
    let mut taken: BTreeMap<(ObjectKey, Option<ObjectKey>, String), Taken> = BTreeMap::new();
    for (kind, route, key) in order {
        let hostnames = route.spec.hostnames.clone().unwrap_or_default();
        for (p, gw, owner) in served_parents(route, &key, inputs.served) {
            let Ok(attachments) = attach(
                gw,
                owner.as_ref(),
                kind,
                p.section_name.as_deref(),
                p.port,
                &key.namespace,
                &hostnames,
            ) else {
                continue;
            };
            for (listener, hosts) in attachments {
                let slot = (gw.key.clone(), owner.clone(), listener.name.clone());
                let there = taken.entry(slot.clone()).or_default();
                let clash = there.iter().find(|(k, _, theirs)| {
                    matches!(
                        (*k, kind),
                        (RouteKind::Http, RouteKind::Grpc) | (RouteKind::Grpc, RouteKind::Http)
                    ) && theirs
                        .iter()
                        .any(|t| hosts.iter().any(|h| hostnames_intersect(t, h)))
                });
                if let Some((_, other, _)) = clash {
                    rejected.insert((kind, key.clone(), slot.0, slot.1, slot.2), other.clone());
                } else {
                    there.push((kind, format!("{} {key}", kind.name()), hosts));
                }
            }
        }
    }
    rejected
}

/// Hostnames as attachment leaves them: "" stands for every name.
fn hostnames_intersect(a: &str, b: &str) -> bool {
    a.is_empty() || b.is_empty() || hostname::intersect(Some(a), b).is_some()
}

/// One route of either kind. `problem` is a reason the route cannot be accepted that was found
/// before compiling it (a GRPCRoute that has no HTTPRoute equivalent).
fn compile_route(
    inputs: &Inputs<'_>,
    kind: RouteKind,
    route: &HttpRoute,
    problem: Option<Problem>,
    rejected: &Rejections,
    out: &mut RouteOutput,
) {
    let Inputs {
        store,
        index,
        served,
        config,
    } = *inputs;
    let key = route_key(route);
    let generation = route.metadata.generation.unwrap_or(0);
    let ours = served_parents(route, &key, served);
    if ours.is_empty() {
        return;
    }

    let (rules, resolved, rules_problem) =
        compile_rules(store, index, kind, route, &key, &mut out.clusters);
    let route_problem = problem.or(rules_problem);
    let hostnames = route.spec.hostnames.clone().unwrap_or_default();
    let mut parents = Vec::new();
    for (p, gw, owner) in ours {
        let parent = owner.as_ref().unwrap_or(&gw.key);
        let parent_ref = ParentRef {
            group: GATEWAY_GROUP.into(),
            kind: if owner.is_some() {
                "ListenerSet"
            } else {
                "Gateway"
            }
            .into(),
            namespace: parent.namespace.clone(),
            name: parent.name.clone(),
            section_name: p.section_name.clone(),
            port: p.port,
        };
        let attach = attach(
            gw,
            owner.as_ref(),
            kind,
            p.section_name.as_deref(),
            p.port,
            &key.namespace,
            &hostnames,
        )
        .and_then(|attachments| {
            let mut turned_away = None;
            let kept: Vec<_> = attachments
                .into_iter()
                .filter(|(l, _)| {
                    let slot = (
                        kind,
                        key.clone(),
                        gw.key.clone(),
                        owner.clone(),
                        l.name.clone(),
                    );
                    match rejected.get(&slot) {
                        Some(other) => {
                            turned_away.get_or_insert((l.name.clone(), other.clone()));
                            false
                        }
                        None => true,
                    }
                })
                .collect();
            match turned_away {
                Some((listener, other)) if kept.is_empty() => Err((
                    reason::NOT_ALLOWED_BY_LISTENERS,
                    format!(
                        "{other} serves a hostname of this route on listener {listener}: an \
                         HTTPRoute and a GRPCRoute cannot share a hostname on one listener, and \
                         the older one (then the first by namespace/name) keeps it"
                    ),
                )),
                _ => Ok(kept),
            }
        });
        let accepted = match (&route_problem, &attach) {
            (Some((r, m)), _) => Condition::new(reason::ACCEPTED, false, r, m.clone(), generation),
            (None, Err((r, m))) => {
                Condition::new(reason::ACCEPTED, false, r, m.clone(), generation)
            }
            (None, Ok(_)) => {
                Condition::new(reason::ACCEPTED, true, reason::ACCEPTED, "", generation)
            }
        };
        let resolved_cond = match &resolved {
            Ok(()) => Condition::new(
                reason::RESOLVED_REFS,
                true,
                reason::RESOLVED_REFS,
                "",
                generation,
            ),
            Err((r, m)) => Condition::new(reason::RESOLVED_REFS, false, r, m.clone(), generation),
        };
        if let (None, Ok(attachments)) = (&route_problem, attach) {
            for rule in &rules {
                for b in rule.backends.iter().filter(|b| !b.cluster.is_empty()) {
                    // Cluster names are "<namespace>/<service>:<port>[/h2c]".
                    if let Some((ns, rest)) = b.cluster.split_once('/') {
                        let svc = rest.split(':').next().unwrap_or(rest);
                        out.service_gateways
                            .entry((ns.to_owned(), svc.to_owned()))
                            .or_default()
                            .insert(gw.key.clone());
                    }
                }
            }
            for (listener, hosts) in attachments {
                *out.attached
                    .entry((gw.key.clone(), owner.clone(), listener.name.clone()))
                    .or_default() += 1;
                if !listener.programmable {
                    continue;
                }
                for host in hosts {
                    for rule in &rules {
                        for (match_index, m) in rule.matches.iter().enumerate() {
                            out.entries.push(Entry {
                                scope: gw.scope.clone(),
                                port: listener.port,
                                protocol: listener.protocol,
                                listener_hostname: listener.hostname.clone(),
                                vhost: host.clone(),
                                single_label: false,
                                key: {
                                    let k = PrecedenceKey::new(
                                        &host,
                                        m,
                                        route.metadata.creation_timestamp.as_ref().map(|t| t.0),
                                        &key,
                                        rule.index,
                                        match_index as u32,
                                    );
                                    if kind == RouteKind::Grpc {
                                        k.grpc(m)
                                    } else {
                                        k
                                    }
                                },
                                route: snap::Route {
                                    source: Some(RouteSource {
                                        kind: kind.name().into(),
                                        namespace: key.namespace.clone(),
                                        name: key.name.clone(),
                                        rule: rule.index,
                                        rule_name: rule.name.clone(),
                                    }),
                                    r#match: Some(m.clone()),
                                    filters: rule.filters.clone(),
                                    backends: rule.backends.clone(),
                                    timeouts: rule.timeouts,
                                    retry: rule.retry.clone(),
                                    session_persistence: rule.session_persistence.clone(),
                                    direct_status: rule.direct_status,
                                    ..Default::default()
                                },
                                // A ListenerSet's listener is not one of the Gateway's own
                                // (section) names.
                                parent: Some((
                                    gw.key.clone(),
                                    if owner.is_none() {
                                        listener.name.clone()
                                    } else {
                                        String::new()
                                    },
                                )),
                            });
                        }
                    }
                }
            }
        }
        parents.push(RouteParentStatus {
            parent_ref,
            controller_name: config.controller_name.clone(),
            conditions: vec![accepted, resolved_cond],
        });
    }
    parents.sort_by(|a, b| a.parent_ref.cmp(&b.parent_ref));
    match kind {
        RouteKind::Http => out.status.insert(key, parents),
        RouteKind::Grpc => out.grpc_status.insert(key, parents),
        RouteKind::Tls => out.tls_status.insert(key, parents),
    };
}

pub(super) type Problem = (&'static str, String);

/// The listeners of `gw` a route attaches to through one parentRef, with the hostnames it
/// serves on each (Gateway API: sectionName and port narrow the listeners; allowedRoutes and
/// hostname intersection decide).
/// The listeners a parentRef selects: the Gateway's own (`owner` None) or one ListenerSet's,
/// narrowed by sectionName and port.
fn attach<'g>(
    gw: &'g ServedGateway,
    owner: Option<&ObjectKey>,
    kind: RouteKind,
    section: Option<&str>,
    port: Option<i32>,
    route_ns: &str,
    hostnames: &[String],
) -> Result<Vec<(&'g AcceptedListener, Vec<String>)>, Problem> {
    let (what, names, ports) = match owner {
        None => (
            format!("Gateway {}", gw.key),
            &gw.all_listener_names,
            &gw.all_listener_ports,
        ),
        Some(ls) => {
            let Some(set) = gw.listener_sets.get(ls) else {
                let why = gw.refused_listener_sets.get(ls).map_or("", String::as_str);
                return Err((
                    reason::NO_MATCHING_PARENT,
                    format!(
                        "ListenerSet {ls} is not accepted by Gateway {}: {why}",
                        gw.key
                    ),
                ));
            };
            (format!("ListenerSet {ls}"), &set.names, &set.ports)
        }
    };
    if let Some(s) = section
        && !names.contains(s)
    {
        return Err((
            reason::NO_MATCHING_PARENT,
            format!("{what} has no listener named {s}"),
        ));
    }
    if let Some(p) = port
        && !u32::try_from(p).is_ok_and(|p| ports.contains(&p))
    {
        return Err((
            reason::NO_MATCHING_PARENT,
            format!("{what} has no listener on port {p}"),
        ));
    }
    let candidates: Vec<&AcceptedListener> = gw
        .listeners
        .iter()
        .filter(|l| l.owner.as_ref() == owner)
        .filter(|l| section.is_none_or(|s| l.name == s))
        .filter(|l| port.is_none_or(|p| i64::from(l.port) == i64::from(p)))
        .collect();
    if candidates.is_empty() {
        return Err((
            reason::NO_MATCHING_PARENT,
            format!("no valid listener of {what} matches the parentRef"),
        ));
    }
    let allowed: Vec<_> = candidates
        .into_iter()
        .filter(|l| {
            l.route_kinds.contains(&kind)
                && l.allowed_namespaces
                    .allows(l.owner_namespace(&gw.key), route_ns)
        })
        .collect();
    if allowed.is_empty() {
        return Err((
            reason::NOT_ALLOWED_BY_LISTENERS,
            format!(
                "the listeners of {what} do not allow {}s from namespace {route_ns}",
                kind.name()
            ),
        ));
    }
    let mut result = Vec::new();
    for l in allowed {
        let hosts: Vec<String> = if hostnames.is_empty() {
            vec![l.hostname.clone().unwrap_or_default()]
        } else {
            let mut h: Vec<String> = hostnames
                .iter()
                .filter_map(|r| hostname::intersect(l.hostname.as_deref(), r))
                .collect();
            h.sort();
            h.dedup();
            h
        };
        if !hosts.is_empty() {
            result.push((l, hosts));
        }
    }
    if result.is_empty() {
        return Err((
            reason::NO_MATCHING_LISTENER_HOSTNAME,
            "no hostname of the route matches a listener hostname".into(),
        ));
    }
    Ok(result)
}

/// Compiles the rules once. Returns the rules, the route's ResolvedRefs verdict, and a problem
/// that makes the whole route unacceptable (UnsupportedValue).
fn compile_rules(
    store: &Store,
    index: &Index<'_>,
    kind: RouteKind,
    route: &HttpRoute,
    key: &ObjectKey,
    clusters: &mut Vec<snap::Cluster>,
) -> (Vec<CompiledRule>, Result<(), Problem>, Option<Problem>) {
    let mut rules = Vec::new();
    let mut resolved: Result<(), Problem> = Ok(());
    let mut problem = None;
    // The API server defaults an absent rules list to one rule matching every path; objects
    // read from files get the same default here.
    let default_rules = [HttpRouteRules::default()];
    let spec_rules = route.spec.rules.as_deref().unwrap_or(&default_rules);
    for (i, rule) in spec_rules.iter().enumerate() {
        let index_u32 = i as u32;
        match compile_rule(store, index, kind, rule, key, clusters) {
            Ok(RuleParts {
                matches: compiled_matches,
                filters,
                backends,
                timeouts,
                retry,
                session_persistence,
                direct_status,
                resolved: rule_resolved,
            }) => {
                if let (Ok(()), Err(e)) = (&resolved, rule_resolved) {
                    resolved = Err(e);
                }
                rules.push(CompiledRule {
                    index: index_u32,
                    name: rule.name.clone().unwrap_or_default(),
                    matches: compiled_matches,
                    filters,
                    backends,
                    timeouts,
                    retry,
                    session_persistence,
                    direct_status,
                });
            }
            Err(p) => {
                problem.get_or_insert(p);
            }
        }
    }
    (rules, resolved, problem)
}

/// One rule, compiled.
struct RuleParts {
    matches: Vec<RouteMatch>,
    filters: Vec<Filter>,
    backends: Vec<WeightedBackend>,
    timeouts: Option<snap::Timeouts>,
    retry: Option<snap::Retry>,
    session_persistence: Option<snap::SessionPersistence>,
    direct_status: u32,
    resolved: Result<(), Problem>,
}

/// Retries a rule asks for at most (GEP-1731 leaves the bound to implementations); more
/// would multiply load on a failing backend.
pub const MAX_RETRY_ATTEMPTS: i64 = 10;
/// Retries when `retry` gives no `attempts` (ingress-nginx's 3 tries in all).
pub const DEFAULT_RETRY_ATTEMPTS: u32 = 2;

/// rules[].retry (GEP-1731): idempotent requests answered with one of `codes` are sent to
/// another endpoint, at most `attempts` times, `backoff` apart.
fn compile_retry(
    r: &gateway_api::apis::experimental::httproutes::HttpRouteRulesRetry,
) -> Result<snap::Retry, Problem> {
    let attempts = match r.attempts {
        None => DEFAULT_RETRY_ATTEMPTS,
        Some(n) if (0..=MAX_RETRY_ATTEMPTS).contains(&n) => n as u32,
        Some(n) => {
            return Err((
                reason::UNSUPPORTED_VALUE,
                format!("retry.attempts {n} is outside 0-{MAX_RETRY_ATTEMPTS}"),
            ));
        }
    };
    let mut codes = Vec::new();
    for c in r.codes.iter().flatten() {
        match u32::try_from(*c) {
            Ok(c) if (400..=599).contains(&c) => codes.push(c),
            _ => {
                return Err((
                    reason::UNSUPPORTED_VALUE,
                    format!("retry.codes: {c} is not an HTTP status from 400 to 599"),
                ));
            }
        }
    }
    codes.sort_unstable();
    codes.dedup();
    let backoff_ms = match r.backoff.as_deref() {
        None => 0,
        Some(b) => parse_duration_ms(b).ok_or_else(|| {
            (
                reason::UNSUPPORTED_VALUE,
                format!("retry.backoff: {b:?} is not a Gateway API duration"),
            )
        })?,
    };
    Ok(snap::Retry {
        codes,
        attempts,
        backoff_ms,
        non_idempotent: false,
        // GEP-1731 bounds each try (timeouts.backendRequest), not the retries as a whole.
        timeout_ms: 0,
    })
}

/// The session name when sessionPersistence gives none.
pub const DEFAULT_SESSION_NAME: &str = "coxswain-session";

/// rules[].sessionPersistence (GEP-1619): the proxy names the endpoint that served a client
/// in a cookie (or header) and keeps sending that client there. The cookie's Path is the
/// rule's path when it has one path match, so a browser sends it only where it matters.
fn compile_session_persistence(
    s: &gateway_api::apis::experimental::httproutes::HttpRouteRulesSessionPersistence,
    matches: &[RouteMatch],
) -> Result<snap::SessionPersistence, Problem> {
    use gateway_api::apis::experimental::httproutes::{
        HttpRouteRulesSessionPersistenceCookieConfigLifetimeType as Lifetime,
        HttpRouteRulesSessionPersistenceType as Type,
    };
    let unsupported = |m: String| (reason::UNSUPPORTED_VALUE, m);
    if s.idle_timeout.is_some() {
        // Would need per-session state in every replica; the cookie carries none.
        return Err(unsupported(
            "sessionPersistence.idleTimeout is not supported; use absoluteTimeout".into(),
        ));
    }
    let name = s
        .session_name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| DEFAULT_SESSION_NAME.to_owned());
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(unsupported(format!(
            "sessionPersistence.sessionName {name:?}: letters, digits, '-', '_' and '.' only"
        )));
    }
    let kind = match s.r#type {
        Some(Type::Header) => snap::session_persistence::Kind::Header,
        _ => snap::session_persistence::Kind::Cookie,
    };
    let absolute_ms = match s.absolute_timeout.as_deref() {
        None => 0,
        Some(t) => parse_duration_ms(t).ok_or_else(|| {
            unsupported(format!(
                "sessionPersistence.absoluteTimeout: {t:?} is not a Gateway API duration"
            ))
        })?,
    };
    let session_cookie = s
        .cookie_config
        .as_ref()
        .and_then(|c| c.lifetime_type.as_ref())
        .is_some_and(|l| matches!(l, Lifetime::Session));
    let path = match matches {
        [m] => m
            .path
            .as_ref()
            .filter(|p| p.kind != snap::path_match::Kind::Regex as i32)
            .map(|p| p.value.clone())
            .unwrap_or_default(),
        _ => String::new(),
    };
    Ok(snap::SessionPersistence {
        kind: kind as i32,
        name,
        // Rounded up: a timeout under a second still gets a cookie that lasts.
        max_age_s: if session_cookie {
            0
        } else {
            absolute_ms.div_ceil(1000)
        },
        path,
    })
}

fn compile_rule(
    store: &Store,
    index: &Index<'_>,
    kind: RouteKind,
    rule: &HttpRouteRules,
    key: &ObjectKey,
    clusters: &mut Vec<snap::Cluster>,
) -> Result<RuleParts, Problem> {
    let matches: Vec<RouteMatch> = match rule.matches.as_deref() {
        None | Some([]) => vec![default_match()],
        Some(ms) => ms.iter().map(compile_match).collect::<Result<_, _>>()?,
    };
    let mut resolved = Ok(());
    let mut filters = Vec::new();
    for f in rule.filters.iter().flatten() {
        filters.push(compile_filter(
            store,
            index,
            kind,
            f,
            key,
            clusters,
            &mut resolved,
        )?);
    }
    let mut backends = Vec::new();
    for b in rule.backend_refs.iter().flatten() {
        let weight = u32::try_from(b.weight.unwrap_or(1)).unwrap_or(0);
        let target = resolve_backend(
            store,
            index,
            kind,
            key,
            b.group.as_deref(),
            b.kind.as_deref(),
            b.namespace.as_deref(),
            &b.name,
            b.port,
            clusters,
        );
        let cluster = match target {
            Ok(name) => name,
            Err(p) => {
                if resolved.is_ok() {
                    resolved = Err(p);
                }
                String::new()
            }
        };
        let mut backend_filters = Vec::new();
        for f in b.filters.iter().flatten() {
            // The backend-level filter type has the same shape as the rule-level one.
            let as_rule: HttpRouteRulesFilters = serde_json::to_value(f)
                .and_then(serde_json::from_value)
                .map_err(|e| (reason::UNSUPPORTED_VALUE, format!("backendRef filter: {e}")))?;
            backend_filters.push(compile_filter(
                store,
                index,
                kind,
                &as_rule,
                key,
                clusters,
                &mut resolved,
            )?);
        }
        backends.push(WeightedBackend {
            cluster,
            weight,
            filters: backend_filters,
        });
    }
    let answers_itself = filters
        .iter()
        .any(|f| matches!(f.kind, Some(filter::Kind::RequestRedirect(_))));
    let has_valid_backend = backends
        .iter()
        .any(|b| !b.cluster.is_empty() && b.weight > 0);
    // Gateway API: a rule whose backends are all invalid (or that has none and no filter that
    // answers) gets 500s.
    let direct_status = if answers_itself || has_valid_backend {
        0
    } else {
        500
    };
    let timeouts = match &rule.timeouts {
        None => None,
        Some(t) => {
            let parse = |v: &Option<String>, field: &str| -> Result<u64, Problem> {
                v.as_deref().map_or(Ok(0), |s| {
                    parse_duration_ms(s).ok_or_else(|| {
                        (
                            reason::UNSUPPORTED_VALUE,
                            format!("timeouts.{field}: {s:?} is not a Gateway API duration"),
                        )
                    })
                })
            };
            Some(snap::Timeouts {
                request_ms: parse(&t.request, "request")?,
                backend_request_ms: parse(&t.backend_request, "backendRequest")?,
                ..Default::default()
            })
        }
    };
    let retry = rule.retry.as_ref().map(compile_retry).transpose()?;
    let session_persistence = rule
        .session_persistence
        .as_ref()
        .map(|s| compile_session_persistence(s, &matches))
        .transpose()?;
    Ok(RuleParts {
        matches,
        filters,
        backends,
        timeouts,
        retry,
        session_persistence,
        direct_status,
        resolved,
    })
}

fn default_match() -> RouteMatch {
    RouteMatch {
        path: Some(PathMatch {
            kind: snap::path_match::Kind::Prefix as i32,
            value: "/".into(),
        }),
        ..Default::default()
    }
}

fn compile_match(m: &HttpRouteRulesMatches) -> Result<RouteMatch, Problem> {
    let path = match &m.path {
        None => default_match().path,
        Some(p) => {
            let value = p.value.clone().unwrap_or_else(|| "/".into());
            let kind = match p.r#type {
                None | Some(HttpRouteRulesMatchesPathType::PathPrefix) => {
                    snap::path_match::Kind::Prefix
                }
                Some(HttpRouteRulesMatchesPathType::Exact) => snap::path_match::Kind::Exact,
                Some(HttpRouteRulesMatchesPathType::RegularExpression) => {
                    check_regex(&value, "path")?;
                    snap::path_match::Kind::Regex
                }
            };
            if kind != snap::path_match::Kind::Regex && !value.starts_with('/') {
                return Err((
                    reason::UNSUPPORTED_VALUE,
                    format!("path {value:?} must start with /"),
                ));
            }
            // A trailing slash on a prefix does not change what it matches ("/foo/" == "/foo").
            let value = if kind == snap::path_match::Kind::Prefix && value.len() > 1 {
                value.trim_end_matches('/').to_owned()
            } else {
                value
            };
            Some(PathMatch {
                kind: kind as i32,
                value,
            })
        }
    };
    let mut headers = Vec::new();
    for h in m.headers.iter().flatten() {
        let kind = match h.r#type {
            None | Some(HttpRouteRulesMatchesHeadersType::Exact) => snap::header_match::Kind::Exact,
            Some(HttpRouteRulesMatchesHeadersType::RegularExpression) => {
                check_regex(&h.value, "header")?;
                snap::header_match::Kind::Regex
            }
        };
        headers.push(HeaderMatch {
            kind: kind as i32,
            name: h.name.to_ascii_lowercase(),
            value: h.value.clone(),
        });
    }
    // Gateway API: when a header name repeats, only the first match counts.
    let mut seen = std::collections::BTreeSet::new();
    headers.retain(|h| seen.insert(h.name.clone()));
    let mut query_params = Vec::new();
    for q in m.query_params.iter().flatten() {
        let kind = match q.r#type {
            None | Some(HttpRouteRulesMatchesQueryParamsType::Exact) => {
                snap::query_param_match::Kind::Exact
            }
            Some(HttpRouteRulesMatchesQueryParamsType::RegularExpression) => {
                check_regex(&q.value, "query parameter")?;
                snap::query_param_match::Kind::Regex
            }
        };
        query_params.push(QueryParamMatch {
            kind: kind as i32,
            name: q.name.clone(),
            value: q.value.clone(),
        });
    }
    let method = match &m.method {
        None => String::new(),
        Some(method) => serde_json::to_value(method)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
    };
    Ok(RouteMatch {
        path,
        headers,
        query_params,
        method,
    })
}

fn check_regex(value: &str, what: &str) -> Result<(), Problem> {
    regex::Regex::new(value).map(|_| ()).map_err(|e| {
        (
            reason::UNSUPPORTED_VALUE,
            format!("{what} regular expression {value:?}: {e}"),
        )
    })
}

fn compile_filter(
    store: &Store,
    index: &Index<'_>,
    kind: RouteKind,
    f: &HttpRouteRulesFilters,
    key: &ObjectKey,
    clusters: &mut Vec<snap::Cluster>,
    resolved: &mut Result<(), Problem>,
) -> Result<Filter, Problem> {
    let kind = if let Some(m) = &f.request_header_modifier {
        filter::Kind::RequestHeaderModifier(header_modifier(m)?)
    } else if let Some(m) = &f.response_header_modifier {
        filter::Kind::ResponseHeaderModifier(header_modifier(m)?)
    } else if let Some(r) = &f.request_redirect {
        let path = match &r.path {
            None => None,
            Some(p) => Some(path_modifier(
                p.replace_full_path.clone(),
                p.replace_prefix_match.clone(),
            )?),
        };
        let scheme = r
            .scheme
            .as_ref()
            .and_then(|s| serde_json::to_value(s).ok())
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        filter::Kind::RequestRedirect(snap::RequestRedirect {
            scheme,
            hostname: r.hostname.clone().unwrap_or_default(),
            path,
            port: r.port.and_then(|p| u32::try_from(p).ok()).unwrap_or(0),
            status_code: match r.status_code {
                None => 302,
                Some(c @ (301 | 302 | 303 | 307 | 308)) => c as u32,
                Some(c) => {
                    return Err((
                        reason::UNSUPPORTED_VALUE,
                        format!("redirect status code {c} is not supported"),
                    ));
                }
            },
            location: String::new(),
        })
    } else if let Some(u) = &f.url_rewrite {
        let path = match &u.path {
            None => None,
            Some(p) => Some(path_modifier(
                p.replace_full_path.clone(),
                p.replace_prefix_match.clone(),
            )?),
        };
        filter::Kind::UrlRewrite(snap::UrlRewrite {
            hostname: u.hostname.clone().unwrap_or_default(),
            path,
        })
    } else if let Some(m) = &f.request_mirror {
        let b = &m.backend_ref;
        let cluster = match resolve_backend(
            store,
            index,
            kind,
            key,
            b.group.as_deref(),
            b.kind.as_deref(),
            b.namespace.as_deref(),
            &b.name,
            b.port,
            clusters,
        ) {
            Ok(c) => c,
            Err(p) => {
                if resolved.is_ok() {
                    *resolved = Err(p);
                }
                String::new()
            }
        };
        let (numerator, denominator) = match (&m.fraction, m.percent) {
            (Some(f), _) => (
                u32::try_from(f.numerator).unwrap_or(0),
                f.denominator
                    .and_then(|d| u32::try_from(d).ok())
                    .unwrap_or(100),
            ),
            (None, Some(p)) => (u32::try_from(p).unwrap_or(0), 100),
            (None, None) => (1, 1),
        };
        filter::Kind::RequestMirror(snap::RequestMirror {
            cluster,
            numerator,
            denominator,
        })
    } else if let Some(c) = &f.cors {
        let list = |v: &Option<Vec<String>>| v.clone().unwrap_or_default();
        filter::Kind::Cors(snap::Cors {
            // Origins compare case-insensitively; the proxy keeps them lower-case.
            allow_origins: list(&c.allow_origins)
                .into_iter()
                .map(|o| o.to_ascii_lowercase())
                .collect(),
            allow_methods: list(&c.allow_methods),
            allow_headers: list(&c.allow_headers),
            expose_headers: list(&c.expose_headers),
            allow_credentials: c.allow_credentials.unwrap_or(false),
            // The API server defaults maxAge to 5 seconds; files get the same default.
            max_age_seconds: c.max_age.map_or(5, |s| u64::try_from(s).unwrap_or(0)),
            echo_origin: true,
        })
    } else if f.extension_ref.is_some() {
        return Err((
            reason::UNSUPPORTED_VALUE,
            "ExtensionRef filters are not supported".into(),
        ));
    } else if f.external_auth.is_some() {
        return Err((
            reason::UNSUPPORTED_VALUE,
            "ExternalAuth filters are not supported yet".into(),
        ));
    } else {
        return Err((reason::UNSUPPORTED_VALUE, "a filter of unknown type".into()));
    };
    Ok(Filter { kind: Some(kind) })
}

/// The shape both header modifier filters share. The generated Gateway API types give request
/// and response modifiers distinct Rust types; reading either through this one keeps a single
/// conversion.
#[derive(serde::Deserialize)]
struct HeaderModifierSpec {
    #[serde(default)]
    set: Vec<HeaderSpec>,
    #[serde(default)]
    add: Vec<HeaderSpec>,
    #[serde(default)]
    remove: Vec<String>,
}

#[derive(serde::Deserialize)]
struct HeaderSpec {
    name: String,
    value: String,
}

fn header_modifier(m: &impl serde::Serialize) -> Result<snap::HeaderModifier, Problem> {
    let spec: HeaderModifierSpec = serde_json::to_value(m)
        .and_then(serde_json::from_value)
        .map_err(|e| (reason::UNSUPPORTED_VALUE, format!("header modifier: {e}")))?;
    let headers = |list: Vec<HeaderSpec>| {
        list.into_iter()
            .map(|h| snap::Header {
                name: h.name,
                value: h.value,
            })
            .collect()
    };
    Ok(snap::HeaderModifier {
        set: headers(spec.set),
        add: headers(spec.add),
        // Header names compare case-insensitively; the proxy matches lower-case names.
        remove: spec
            .remove
            .into_iter()
            .map(|r| r.to_ascii_lowercase())
            .collect(),
    })
}

fn path_modifier(
    full: Option<String>,
    prefix: Option<String>,
) -> Result<snap::PathModifier, Problem> {
    let kind = match (full, prefix) {
        (Some(f), None) => snap::path_modifier::Kind::ReplaceFullPath(f),
        (None, Some(p)) => snap::path_modifier::Kind::ReplacePrefixMatch(p),
        _ => {
            return Err((
                reason::UNSUPPORTED_VALUE,
                "a path modifier sets exactly one of replaceFullPath and replacePrefixMatch".into(),
            ));
        }
    };
    Ok(snap::PathModifier { kind: Some(kind) })
}

/// Resolves a backendRef (or mirror backendRef) to a cluster name, adding the cluster.
#[allow(clippy::too_many_arguments)]
fn resolve_backend(
    store: &Store,
    index: &Index<'_>,
    route_kind: RouteKind,
    route: &ObjectKey,
    group: Option<&str>,
    kind: Option<&str>,
    namespace: Option<&str>,
    name: &str,
    port: Option<i32>,
    clusters: &mut Vec<snap::Cluster>,
) -> Result<String, Problem> {
    let group = group.unwrap_or("");
    let kind = kind.unwrap_or("Service");
    if !group.is_empty() || kind != "Service" {
        return Err((
            reason::INVALID_KIND,
            format!("backendRef {group}/{kind} {name} is not a Service"),
        ));
    }
    let ns = namespace.unwrap_or(&route.namespace);
    if !refs::permitted(
        store,
        GATEWAY_GROUP,
        route_kind.name(),
        &route.namespace,
        "",
        "Service",
        ns,
        name,
    ) {
        return Err((
            reason::REF_NOT_PERMITTED,
            format!(
                "no ReferenceGrant in {ns} allows {}s in {} to use Service {name}",
                route_kind.name(),
                route.namespace
            ),
        ));
    }
    let Some(port) = port else {
        return Err((
            reason::UNSUPPORTED_VALUE,
            format!("backendRef to Service {ns}/{name} needs a port"),
        ));
    };
    if index.service(ns, name).is_none() {
        return Err((
            reason::BACKEND_NOT_FOUND,
            format!("Service {ns}/{name} not found"),
        ));
    }
    let Some(mut cluster) = index.cluster(ns, name, port) else {
        return Err((
            reason::BACKEND_NOT_FOUND,
            format!("Service {ns}/{name} has no port {port}"),
        ));
    };
    // gRPC is HTTP/2: a GRPCRoute's backends get cleartext HTTP/2 whatever the Service port's
    // appProtocol says, under a name of their own so an HTTPRoute to the same port keeps its
    // protocol.
    if route_kind == RouteKind::Grpc && cluster.app_protocol != snap::AppProtocol::H2c as i32 {
        cluster.app_protocol = snap::AppProtocol::H2c as i32;
        cluster.name.push_str(refs::H2C_CLUSTER_SUFFIX);
    }
    let name = cluster.name.clone();
    clusters.push(cluster);
    Ok(name)
}

/// Gateway API durations (GEP-2257): one or more `<number><unit>` with units h, m, s, ms.
pub fn parse_duration_ms(s: &str) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit_ms, len) = if rest.starts_with("ms") {
            (1, 2)
        } else if rest.starts_with('h') {
            (3_600_000, 1)
        } else if rest.starts_with('m') {
            (60_000, 1)
        } else if rest.starts_with('s') {
            (1_000, 1)
        } else {
            return None;
        };
        total = total.checked_add(n.checked_mul(unit_ms)?)?;
        rest = &rest[len..];
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::parse_duration_ms;

    // GEP-2257: "1h", "30m", "10s", "500ms" and combinations such as "1h30m".
    #[test]
    fn gateway_api_durations() {
        assert_eq!(parse_duration_ms("10s"), Some(10_000));
        assert_eq!(parse_duration_ms("500ms"), Some(500));
        assert_eq!(parse_duration_ms("1h30m"), Some(5_400_000));
        assert_eq!(parse_duration_ms("0s"), Some(0));
        assert_eq!(parse_duration_ms("1.5s"), None);
        assert_eq!(parse_duration_ms("10"), None);
        assert_eq!(parse_duration_ms(""), None);
    }
}
