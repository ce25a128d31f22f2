//! HTTPRoutes, GRPCRoutes and TLSRoutes: attachment to Gateway listeners, rules to snapshot
//! routes, and the `status.parents` entries this controller owns. Every route arrives in the
//! shared form ([`super::route`]; the compiler's root converts GRPCRoutes and TLSRoutes with
//! [`super::grpcroute`] and [`super::l4route`]), so one code compiles all three kinds and
//! depends on none of the converters.

use super::Config;
use super::backend::Referrer;
use super::encode::EncodedRoute;
use super::entries::{Entry, PrecedenceKey};
use super::gateway::ServedGateway;
use super::hostname;
use super::listeners::AcceptedListener;
use super::memo::{
    AddressHasher, Attachment, Kept, Read, ReadInputs, Rejection, RouteMemo, RoutePart,
};
use super::refs::{GATEWAY_GROUP, Index};
use super::route::{RouteForm, RouteKind, StoredRef, StoredRoute};
use super::rules::compile_rules;
use super::status::{
    Condition, ObjectKey, ParentRef, Problem, RouteParentStatus, StatusMap, reason,
};
use super::store::Store;
use coxswain_api::snapshot::{self as snap, RouteSource};
use gateway_api::apis::experimental::httproutes::{HttpRoute, HttpRouteParentRefs};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// What the routes give a pass besides the totals the memo keeps ([`RouteMemo::totals`]).
pub struct RouteOutput {
    /// The entries gone and new since the memo's last pass; None when the memo starts afresh
    /// (then [`RouteMemo::entries`] lists them all).
    pub changed: Option<EntryChanges>,
    /// Per route kind ([`RouteKind`] order): each route's `status.parents`, a copy of the
    /// memo's map (constant time: the maps are persistent).
    pub status: [StatusMap; 5],
    /// (gateway, owning ListenerSet, listener name) -> number of attached routes
    pub attached: BTreeMap<Attachment, i32>,
    /// One per cluster name.
    pub clusters: Vec<Arc<snap::Cluster>>,
}

/// Entries gone, entries new.
pub type EntryChanges = (Vec<Arc<Entry>>, Vec<Arc<Entry>>);

type BuildByAddress = std::hash::BuildHasherDefault<AddressHasher>;

/// What every route's compilation reads.
struct Inputs<'a> {
    store: &'a Store,
    index: &'a Index<'a>,
    served: &'a BTreeMap<ObjectKey, ServedGateway>,
    config: &'a Config,
}

/// Compiles every route into `memo`. A route whose stored object, the listeners it was turned
/// away from and resolved references are the same as at the memo's last pass is not compiled
/// again: its kept part stays, and an object the last pass met at the same place is known by
/// its address alone. `read` puts a stored route into the shared form (the root's
/// conversions). The caller clears `memo` when the Gateways or the configuration changed; a
/// full compile passes an empty one.
pub fn compile<'a>(
    routes: &[StoredRoute<'a>],
    read: impl Fn(StoredRoute<'a>) -> RouteForm<'a>,
    store: &Store,
    index: &Index<'_>,
    served: &BTreeMap<ObjectKey, ServedGateway>,
    config: &Config,
    memo: &mut RouteMemo,
) -> RouteOutput {
    let inputs = Inputs {
        store,
        index,
        served,
        config,
    };
    let has = |k: RouteKind| routes.iter().any(|r| r.kind() == k);
    // Only HTTPRoutes and GRPCRoutes contend for a listener's hostnames: every route is read
    // for that only when both kinds are there.
    let rejected = if has(RouteKind::Http) && has(RouteKind::Grpc) {
        let forms: Vec<RouteForm<'a>> = routes.iter().map(|r| read(*r)).collect();
        cross_kind_conflicts(&inputs, &forms)
    } else {
        Rejections::new()
    };
    let turned_away = rejected_by_route(&rejected);
    let turned_for = |kind: RouteKind, key: &ObjectKey| -> &[Rejection] {
        if turned_away.is_empty() {
            return &[];
        }
        turned_away
            .get(&(kind, key.clone()))
            .map_or(&[][..], Vec::as_slice)
    };
    // Routes that read the same share one copy of their reads: looked up once per pass,
    // unless a ReferenceGrant's answer depends on the route's own namespace.
    let mut reads_unchanged: HashMap<usize, bool, BuildByAddress> = HashMap::default();
    // Nothing the reads read changed since the last pass: every read holds.
    let inputs_same = memo.read_inputs.as_ref().is_some_and(|r| r.same(store));
    memo.read_inputs = Some(ReadInputs::of(store));
    let mut reads_hold = |kept: &Kept| {
        if inputs_same {
            return true;
        }
        let look = || {
            kept.reads
                .iter()
                .all(|r| r.unchanged(store, index, kept.id.0, &kept.id.1.namespace))
        };
        if kept.reads_grant {
            return look();
        }
        *reads_unchanged
            .entry(Arc::as_ptr(&kept.reads).addr())
            .or_insert_with(look)
    };
    memo.pass += 1;
    let pass = memo.pass;
    let (mut removed, mut added) = (Vec::new(), Vec::new());
    let previous = std::mem::take(&mut memo.order);
    let mut order = Vec::with_capacity(routes.len());
    // Where in the last pass's order the next route is expected.
    let mut next = 0;
    for &stored in routes {
        let address = stored.address();
        if let Some(&(was, slot)) = previous.get(next)
            && was == address
            && let Some(kept) = memo.slot_mut(slot)
            && kept.met_as(address)
            && kept.turned_away == turned_for(kept.id.0, &kept.id.1)
            && reads_hold(kept)
        {
            kept.pass = pass;
            kept.at = order.len();
            memo.reused += 1;
            order.push((address, slot));
            next += 1;
            continue;
        }
        let form = read(stored);
        let stored_ref = form
            .stored
            .clone()
            .unwrap_or_else(|| StoredRef::Object(stored.pin()));
        let id = (form.kind, form.key());
        let turned = turned_for(id.0, &id.1);
        let found = memo.find(&id);
        if let Some(slot) = found
            && let Some(kept) = memo.slot_mut(slot)
        {
            // The routes after it are expected after its place in the last pass.
            next = kept.at + 1;
            if stored_ref.same(&kept.stored) && kept.turned_away == turned && reads_hold(kept) {
                // The same route in a new object (its status or metadata changed).
                kept.object = stored.pin();
                kept.pass = pass;
                kept.at = order.len();
                memo.reused += 1;
                order.push((address, slot));
                continue;
            }
        }
        memo.compiled += 1;
        let reads = RefCell::new(Vec::new());
        let part = compile_route(&inputs, &form, &rejected, &reads).map(|p| memo.keep(p));
        let mut reads = reads.into_inner();
        reads.shrink_to_fit();
        let reads_grant = reads.iter().any(|r| matches!(r, Read::Grant { .. }));
        if let Some(old) = found.and_then(|slot| memo.slot(slot)?.part.as_ref()) {
            removed.extend(old.entries.iter().cloned());
        }
        if let Some(new) = &part {
            added.extend(new.entries.iter().cloned());
        }
        let fresh = Kept {
            stored: stored_ref.keep(),
            object: stored.pin(),
            turned_away: turned.to_vec(),
            reads: memo.reads.share(reads),
            reads_grant,
            part,
            pass,
            at: order.len(),
            id: (id.0, Arc::new(id.1)),
        };
        order.push((address, memo.put(found, fresh)));
    }
    // Routes gone from the store are dropped with what they held.
    if memo.len() != order.len() {
        removed.extend(memo.drop_unseen(pass));
    }
    memo.order = order;
    RouteOutput {
        changed: std::mem::replace(&mut memo.continuous, true).then_some((removed, added)),
        status: memo.totals.status.clone(),
        attached: memo.totals.attached.clone(),
        clusters: memo.totals.clusters(),
    }
}

fn rejected_by_route(rejected: &Rejections) -> HashMap<(RouteKind, ObjectKey), Vec<Rejection>> {
    let mut out: HashMap<_, Vec<_>> = HashMap::new();
    for ((kind, route, gw, owner, listener), other) in rejected {
        out.entry((*kind, route.clone())).or_default().push((
            gw.clone(),
            owner.clone(),
            listener.clone(),
            other.clone(),
        ));
    }
    out
}

/// (route kind, route, Gateway, listener name) -> the route of the other kind that keeps the
/// hostnames they share on that listener.
/// (kind, route, Gateway, owning ListenerSet, listener) -> the route that keeps the slot.
type Rejections = BTreeMap<(RouteKind, ObjectKey, ObjectKey, Option<ObjectKey>, String), String>;

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
fn cross_kind_conflicts(inputs: &Inputs<'_>, routes: &[RouteForm<'_>]) -> Rejections {
    let mut rejected = Rejections::new();
    let has = |k: RouteKind| routes.iter().any(|r| r.kind == k);
    if !has(RouteKind::Http) || !has(RouteKind::Grpc) {
        return rejected;
    }
    let mut order: Vec<(RouteKind, &HttpRoute, ObjectKey)> = routes
        .iter()
        .filter(|r| r.problem.is_none())
        .map(|r| (r.kind, &*r.route, r.key()))
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

/// One route of any kind; None when it names no parent of ours. Its `problem` is a reason it
/// cannot be accepted that was found before compiling it (a GRPCRoute that has no HTTPRoute
/// equivalent).
fn compile_route(
    inputs: &Inputs<'_>,
    form: &RouteForm<'_>,
    rejected: &Rejections,
    reads: &RefCell<Vec<Read>>,
) -> Option<RoutePart> {
    let Inputs {
        store,
        index,
        served,
        config,
    } = *inputs;
    let (kind, route) = (form.kind, &*form.route);
    let problem = form.problem.clone();
    let key = form.key();
    let generation = route.metadata.generation.unwrap_or(0);
    let ours = served_parents(route, &key, served);
    if ours.is_empty() {
        return None;
    }

    let mut out = RoutePart::default();
    let from = Referrer {
        store,
        index,
        kind,
        route: &key,
        reads,
    };
    let (rules, resolved, rules_problem) = compile_rules(&from, route, &mut out.clusters);
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
                Some((listener, other)) if kept.is_empty() => Err(Problem::new(
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
            (Some(p), _) | (None, Err(p)) => p.condition(reason::ACCEPTED, generation),
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
            Err(p) => p.condition(reason::RESOLVED_REFS, generation),
        };
        if let (None, Ok(attachments)) = (&route_problem, attach) {
            for rule in &rules {
                for b in rule.backends.iter().filter(|b| !b.cluster.is_empty()) {
                    // Cluster names are "<namespace>/<service>:<port>[/h2c]".
                    if let Some((ns, rest)) = b.cluster.split_once('/') {
                        let svc = rest.split(':').next().unwrap_or(rest);
                        out.service_gateways
                            .push(((ns.to_owned(), svc.to_owned()), gw.key.clone()));
                    }
                }
            }
            for (listener, hosts) in attachments {
                out.attached
                    .push((gw.key.clone(), owner.clone(), listener.name.clone()));
                if !listener.programmable {
                    continue;
                }
                for host in hosts {
                    for rule in &rules {
                        for (match_index, m) in rule.matches.iter().enumerate() {
                            out.entries.push(Arc::new(Entry {
                                scope: gw.scope.clone(),
                                port: listener.bind_port,
                                protocol: listener.protocol,
                                listener_hostname: listener.hostname.clone(),
                                vhost: host.clone(),
                                single_label: false,
                                key: {
                                    let k = PrecedenceKey::new(
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
                                route: EncodedRoute::new(&snap::Route {
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
                                    external_auth: rule.external_auth.clone(),
                                    ..Default::default()
                                }),
                                origin: Some((kind, rule.name.clone())),
                                // A ListenerSet's listener is not one of the Gateway's own
                                // (section) names.
                                parent: Some(Arc::new((
                                    gw.key.clone(),
                                    if owner.is_none() {
                                        listener.name.clone()
                                    } else {
                                        String::new()
                                    },
                                ))),
                                // Set where the part is kept (`RouteMemo::keep`).
                                ordinal: 0,
                            }));
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
    out.service_gateways.sort();
    out.service_gateways.dedup();
    out.parents = parents;
    Some(out)
}

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
                return Err(Problem::new(
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
        return Err(Problem::new(
            reason::NO_MATCHING_PARENT,
            format!("{what} has no listener named {s}"),
        ));
    }
    if let Some(p) = port
        && !u32::try_from(p).is_ok_and(|p| ports.contains(&p))
    {
        return Err(Problem::new(
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
        return Err(Problem::new(
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
        return Err(Problem::new(
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
        return Err(Problem::new(
            reason::NO_MATCHING_LISTENER_HOSTNAME,
            "no hostname of the route matches a listener hostname".into(),
        ));
    }
    Ok(result)
}
