//! CoxswainAccessPolicies: Basic authentication, JWT validation and rate limits (per proxy and
//! global) for HTTPRoute and GRPCRoute rules, and each policy's Accepted condition.
//!
//! Policies are taken oldest first (then by namespace/name). A policy whose target (a route,
//! one named rule of it, a Gateway, or one named listener) an older policy already
//! holds is Conflicted and holds nothing. Each feature of a rule comes from the most specific
//! policy that sets it: the rule's, the route's, the listener's, then the Gateway's.
//!
//! Access control fails closed: a policy whose Secret is missing, or lists no user the proxy
//! can check (or whose JWT providers have no key the proxy can use, or only a URL not fetched
//! yet), still holds its targets, and their rules answer 503 until it is fixed.

use super::encode::EncodedRoute;
use super::entries::Entry;
use super::global_limit;
use super::htpasswd;
use super::refs::Index;
use super::route::RouteKind;
use super::status::{
    AncestorRef, Condition, ObjectKey, PolicyAncestorStatus, Problem, Verdict, reason,
};
use super::store::Store;
use coxswain_api::crd::accesspolicy::{
    CoxswainAccessPolicy, Jwt, RateLimit, RateLimitKeyType, RateUnit,
};
use coxswain_api::snapshot as snap;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";
const DEFAULT_REALM: &str = "Authentication Required";
/// Leeway for a token's `exp` and `nbf` when a provider names none.
pub const DEFAULT_CLOCK_SKEW_SECONDS: u32 = 60;

/// (namespace, kind, name, section name or "").
type Target = (String, String, String, String);

/// What a policy asks of the rules it holds.
#[derive(Debug, Clone)]
struct Held {
    policy: ObjectKey,
    /// None: not set by this policy. Some(None): set, but its Secret cannot be used (503).
    basic_auth: Option<Option<snap::BasicAuth>>,
    /// As `basic_auth`: Some(None) when no provider has a usable key.
    jwt: Option<Option<snap::JwtAuth>>,
    rate_limit: Option<snap::RateLimit>,
    global_rate_limit: Option<snap::GlobalRateLimit>,
}

#[derive(Debug, Default)]
pub struct Output {
    held: BTreeMap<Target, Held>,
    /// The rate limit services of the policies that hold targets.
    pub clusters: Vec<snap::Cluster>,
    /// Per policy: its conditions and where it took effect.
    pub decided: BTreeMap<ObjectKey, Decided>,
}

#[derive(Debug, Clone, Default)]
pub struct Decided {
    pub conditions: Vec<Condition>,
    /// The first targetRef, the ancestor reported while no rule uses the policy.
    pub first_target: Option<AncestorRef>,
    /// Gateways whose rules the policy applies to (filled by [`apply`]).
    pub gateways: BTreeSet<ObjectKey>,
}

pub fn compile(store: &Store, index: &Index<'_>) -> Output {
    let mut out = Output::default();
    let mut policies: Vec<&CoxswainAccessPolicy> =
        store.access_policies.iter().map(|p| &**p).collect();
    policies.sort_by(|a, b| {
        let key =
            |p: &CoxswainAccessPolicy| (p.metadata.namespace.clone(), p.metadata.name.clone());
        super::store::oldest_first(&a.metadata, &b.metadata).then_with(|| key(a).cmp(&key(b)))
    });
    for policy in policies {
        let ns = policy.metadata.namespace.clone().unwrap_or_default();
        let name = policy.metadata.name.clone().unwrap_or_default();
        let me = ObjectKey::new(&ns, &name);
        let generation = policy.metadata.generation.unwrap_or(0);
        let first_target = policy.spec.target_refs.first().map(|t| AncestorRef {
            group: t.group.clone(),
            kind: t.kind.clone(),
            namespace: Some(ns.clone()),
            name: t.name.clone(),
        });
        let verdict = decide(
            store,
            index,
            policy,
            (&ns, &me),
            &mut out.held,
            &mut out.clusters,
        );
        out.decided.insert(
            me,
            Decided {
                conditions: vec![verdict.condition(reason::ACCEPTED, generation)],
                first_target,
                gateways: BTreeSet::new(),
            },
        );
    }
    out
}

/// Whether one policy is accepted; records what it holds.
fn decide(
    store: &Store,
    index: &Index<'_>,
    policy: &CoxswainAccessPolicy,
    (ns, me): (&str, &ObjectKey),
    held: &mut BTreeMap<Target, Held>,
    clusters: &mut Vec<snap::Cluster>,
) -> Verdict {
    let rate_limit = match policy.spec.rate_limit.as_ref().map(|r| rate_limit(r, me)) {
        Some(Err(why)) => return Problem::new(reason::INVALID, why).into(),
        Some(Ok(r)) => Some(r),
        None => None,
    };
    let global = policy
        .spec
        .global_rate_limit
        .as_ref()
        .map(|g| global_limit::compile(g, index, me));
    let global = match global {
        Some(Err(why)) => return Problem::new(reason::INVALID, why).into(),
        Some(Ok(g)) => Some(g),
        None => None,
    };
    let mut problems = Vec::new();
    let global_unusable = global.as_ref().is_some_and(|g| g.problem.is_some());
    problems.extend(global.as_ref().and_then(|g| g.problem.clone()));
    let basic_auth = policy.spec.basic_auth.as_ref().map(|b| {
        let secret = &b.secret_ref.name;
        let what = format!("Basic-auth Secret {ns}/{secret}");
        let users = index
            .secret(ns, secret)
            .ok_or_else(|| format!("{what} not found"))
            .and_then(|s| htpasswd::users(s, htpasswd::Format::File, &what));
        match users {
            Ok(users) => {
                problems.extend(
                    users
                        .refused
                        .iter()
                        .map(|e| format!("{what}: {e}; that user cannot sign in")),
                );
                Some(snap::BasicAuth {
                    realm: b.realm.clone().unwrap_or_else(|| DEFAULT_REALM.to_owned()),
                    users: users.lines,
                })
            }
            Err(why) => {
                problems.push(format!(
                    "{why}; the targeted rules answer 503 until it is fixed"
                ));
                None
            }
        }
    });
    let jwt = policy
        .spec
        .jwt
        .as_ref()
        .map(|j| jwt_auth(store, ns, j, &mut problems));
    let mut targets: BTreeSet<Target> = BTreeSet::new();
    let mut missing = Vec::new();
    for t in &policy.spec.target_refs {
        let section = t.section_name.clone().unwrap_or_default();
        match target_problem(store, ns, &t.kind, &t.name, &section) {
            Some(why) => missing.push(why),
            None => {
                targets.insert((ns.to_owned(), t.kind.clone(), t.name.clone(), section));
            }
        }
    }
    if let Some(((_, kind, name, section), older)) = targets
        .iter()
        .find_map(|t| held.get(t).map(|h| (t, &h.policy)))
    {
        let what = if section.is_empty() {
            format!("{kind} {name}")
        } else {
            format!("{section} of {kind} {name}")
        };
        return Problem::new(
            reason::CONFLICTED,
            format!(
                "CoxswainAccessPolicy {} is older and already targets {what}; this one is not \
                 applied",
                older.name
            ),
        )
        .into();
    }
    for t in &targets {
        held.insert(
            t.clone(),
            Held {
                policy: me.clone(),
                basic_auth: basic_auth.clone(),
                jwt: jwt.clone(),
                rate_limit: rate_limit.clone(),
                global_rate_limit: global.as_ref().map(|g| g.limit.clone()),
            },
        );
    }
    if !targets.is_empty() {
        clusters.extend(global.and_then(|g| g.cluster));
    }
    if !missing.is_empty() {
        let applied = if targets.is_empty() {
            ""
        } else {
            "; applied to the other targets"
        };
        return Problem::new(
            reason::TARGET_NOT_FOUND,
            format!("{}{applied}", missing.join("; ")),
        )
        .into();
    }
    if basic_auth.as_ref().is_some_and(Option::is_none)
        || jwt.as_ref().is_some_and(Option::is_none)
        || global_unusable
    {
        return Problem::new(reason::INVALID, problems.join("; ")).into();
    }
    Verdict::holds(reason::ACCEPTED, problems.join("; "))
}

/// The providers whose keys the proxy can use; a provider without any is reported in
/// `problems`. None: no provider is usable, and the targeted rules answer 503.
fn jwt_auth(
    store: &Store,
    ns: &str,
    jwt: &Jwt,
    problems: &mut Vec<String>,
) -> Option<snap::JwtAuth> {
    let mut providers = Vec::new();
    for p in &jwt.providers {
        let (source, document) = super::jwks::document(store, ns, &p.jwks);
        let what = format!("JWT provider {:?}: {source}", p.name);
        let document = match document {
            Ok(d) => d,
            Err(why) => {
                problems.push(format!("{what}: {why}"));
                continue;
            }
        };
        if coxswain_proxy::jwt::usable_keys(&document) == 0 {
            problems.push(format!(
                "{what} holds no signing key the proxy can use (RSA, EC P-256/P-384 or Ed25519 \
                 in a JWKS document {{\"keys\": [...]}})"
            ));
            continue;
        }
        let mut audiences = p.audiences.clone();
        audiences.sort();
        audiences.dedup();
        providers.push(snap::JwtProvider {
            name: p.name.clone(),
            issuer: p.issuer.clone().unwrap_or_default(),
            audiences,
            jwks: document,
            claims_to_headers: p
                .claims_to_headers
                .iter()
                .map(|c| snap::ClaimToHeader {
                    claim: c.claim.clone(),
                    header: c.header.to_ascii_lowercase(),
                })
                .collect(),
            clock_skew_seconds: p.clock_skew_seconds.unwrap_or(DEFAULT_CLOCK_SKEW_SECONDS),
        });
    }
    providers.sort_by(|a, b| a.name.cmp(&b.name));
    if providers.is_empty() {
        problems
            .push("no JWT provider is usable; the targeted rules answer 503 until one is".into());
        return None;
    }
    Some(snap::JwtAuth { providers })
}

fn rate_limit(r: &RateLimit, me: &ObjectKey) -> Result<snap::RateLimit, String> {
    let mut exempt = Vec::new();
    for block in &r.exempt {
        let cidr = super::annotations::parse_cidr(block.trim())
            .map_err(|why| format!("rateLimit.exempt: {why}"))?;
        exempt.push(snap::Cidr {
            address: cidr.addr.to_string(),
            prefix_len: u32::from(cidr.prefix),
        });
    }
    exempt.sort_by(|a, b| (&a.address, a.prefix_len).cmp(&(&b.address, b.prefix_len)));
    exempt.dedup();
    let (key, header) = match &r.key {
        None => (snap::rate_limit::Key::ClientAddress, String::new()),
        Some(k) => match k.type_ {
            RateLimitKeyType::ClientAddress => {
                (snap::rate_limit::Key::ClientAddress, String::new())
            }
            RateLimitKeyType::Route => (snap::rate_limit::Key::Route, String::new()),
            RateLimitKeyType::Header => (
                snap::rate_limit::Key::Header,
                k.header
                    .as_deref()
                    .map(str::to_ascii_lowercase)
                    .ok_or("rateLimit.key: type Header needs header")?,
            ),
        },
    };
    Ok(snap::RateLimit {
        id: format!("CoxswainAccessPolicy/{}/{}", me.namespace, me.name),
        requests: r.requests.unwrap_or(0),
        period_ms: r
            .requests
            .map_or(0, |_| r.unit.unwrap_or(RateUnit::Second).millis()),
        burst: r.burst.unwrap_or(0),
        key: key as i32,
        header,
        exempt,
        max_in_flight: r.max_in_progress.unwrap_or(0),
    })
}

/// Why a target does not exist, if it does not.
fn target_problem(
    store: &Store,
    ns: &str,
    kind: &str,
    name: &str,
    section: &str,
) -> Option<String> {
    let here = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        m.namespace.as_deref() == Some(ns) && m.name.as_deref() == Some(name)
    };
    match kind {
        "HTTPRoute" => {
            let Some(route) = store.http_routes.iter().find(|r| here(&r.metadata)) else {
                return Some(format!("HTTPRoute {ns}/{name} not found"));
            };
            let named = |r: &&gateway_api::apis::experimental::httproutes::HttpRouteRules| {
                r.name.as_deref() == Some(section)
            };
            (!section.is_empty() && !route.spec.rules.iter().flatten().any(|r| named(&r)))
                .then(|| format!("HTTPRoute {ns}/{name} has no rule named {section:?}"))
        }
        "GRPCRoute" => {
            let Some(route) = store.grpc_routes.iter().find(|r| here(&r.metadata)) else {
                return Some(format!("GRPCRoute {ns}/{name} not found"));
            };
            let named = route
                .spec
                .rules
                .iter()
                .flatten()
                .any(|r| r.name.as_deref() == Some(section));
            (!section.is_empty() && !named)
                .then(|| format!("GRPCRoute {ns}/{name} has no rule named {section:?}"))
        }
        "Gateway" => {
            let Some(gateway) = store.gateways.iter().find(|g| here(&g.metadata)) else {
                return Some(format!("Gateway {ns}/{name} not found"));
            };
            (!section.is_empty() && !gateway.spec.listeners.iter().any(|l| l.name == section))
                .then(|| format!("Gateway {ns}/{name} has no listener named {section:?}"))
        }
        other => Some(format!(
            "{other} cannot be targeted (HTTPRoute or Gateway only)"
        )),
    }
}

/// Gives each HTTPRoute and GRPCRoute rule the features of the most specific policy setting them, and
/// records under which Gateways each policy took effect.
impl Output {
    /// Whether [`apply`] rewrites any entry: whether a policy holds a target.
    pub fn rewrites_entries(&self) -> bool {
        !self.held.is_empty()
    }
}

pub fn apply(out: &mut Output, entries: &mut [Arc<Entry>]) {
    if out.held.is_empty() {
        return;
    }
    for entry in entries.iter_mut() {
        let Some((kind @ (RouteKind::Http | RouteKind::Grpc), rule_name)) = &entry.origin else {
            continue;
        };
        let kind = kind.name().to_owned();
        let route_key = entry.key.route();
        let ns = route_key.namespace.clone();
        let mut candidates: Vec<Target> = Vec::with_capacity(4);
        if !rule_name.is_empty() {
            candidates.push((
                ns.clone(),
                kind.clone(),
                route_key.name.clone(),
                rule_name.clone(),
            ));
        }
        candidates.push((ns.clone(), kind, route_key.name.clone(), String::new()));
        if let Some((gateway, listener)) = entry.parent.as_deref()
            && gateway.namespace == ns
        {
            candidates.push((
                ns.clone(),
                "Gateway".into(),
                gateway.name.clone(),
                listener.clone(),
            ));
            candidates.push((
                ns.clone(),
                "Gateway".into(),
                gateway.name.clone(),
                String::new(),
            ));
        }
        let holders: Vec<&Held> = candidates.iter().filter_map(|c| out.held.get(c)).collect();
        if holders.is_empty() {
            continue;
        }
        // Entries are shared with the incremental compiler's last pass: copied only when
        // a policy changes them.
        let entry = Arc::make_mut(entry);
        let auth = holders.iter().find(|h| h.basic_auth.is_some());
        let jwt = holders.iter().find(|h| h.jwt.is_some());
        let limit = holders.iter().find(|h| h.rate_limit.is_some());
        let global = holders.iter().find(|h| h.global_rate_limit.is_some());
        for h in auth
            .iter()
            .chain(jwt.iter())
            .chain(limit.iter())
            .chain(global.iter())
        {
            if let (Some(d), Some((gateway, _))) =
                (out.decided.get_mut(&h.policy), entry.parent.as_deref())
            {
                d.gateways.insert(gateway.clone());
            }
        }
        let mut route = entry.route.decode();
        let route = &mut route;
        if let Some(limit) = limit.and_then(|h| h.rate_limit.clone()) {
            route.rate_limits.retain(|l| l.id != limit.id);
            route.rate_limits.push(limit);
            route.rate_limits.sort_by(|a, b| a.id.cmp(&b.id));
        }
        if let Some(global) = global.and_then(|h| h.global_rate_limit.clone()) {
            route.global_rate_limit = Some(global);
        }
        // A rule that only redirects answers before anyone signs in, so an HTTP listener's
        // redirect to HTTPS never asks for a password in clear.
        let redirects = route
            .filters
            .iter()
            .any(|f| matches!(f.kind, Some(snap::filter::Kind::RequestRedirect(_))));
        match auth.and_then(|h| h.basic_auth.clone()) {
            Some(Some(users)) if !redirects => route.basic_auth = Some(users),
            Some(None) if !redirects => {
                route.direct_status = 503;
                route.backends.clear();
            }
            _ => {}
        }
        match jwt.and_then(|h| h.jwt.clone()) {
            Some(Some(jwt)) if !redirects => route.jwt = Some(jwt),
            Some(None) if !redirects => {
                route.direct_status = 503;
                route.backends.clear();
            }
            _ => {}
        }
        entry.route = EncodedRoute::new(route);
    }
}

/// `status.ancestors` of every policy: each Gateway it took effect under, else its first
/// target, so a policy with a typo in its target still hears about it.
pub fn ancestors(
    out: &Output,
    controller_name: &str,
) -> BTreeMap<ObjectKey, Vec<PolicyAncestorStatus>> {
    out.decided
        .iter()
        .map(|(key, d)| {
            let mut refs: Vec<AncestorRef> = d
                .gateways
                .iter()
                .map(|g| AncestorRef {
                    group: GATEWAY_GROUP.into(),
                    kind: "Gateway".into(),
                    namespace: Some(g.namespace.clone()),
                    name: g.name.clone(),
                })
                .collect();
            if refs.is_empty() {
                refs.extend(d.first_target.clone());
            }
            // The CRD keeps at most 16 entries; the sorted first ones are written.
            refs.truncate(16);
            let statuses = refs
                .into_iter()
                .map(|ancestor_ref| PolicyAncestorStatus {
                    ancestor_ref,
                    controller_name: controller_name.to_owned(),
                    conditions: d.conditions.clone(),
                })
                .collect();
            (key.clone(), statuses)
        })
        .collect()
}
