//! Route entries and the order they are tried in.

use super::encode::{EncodedRoute, HasRoute};
use super::hostname;
use super::route::RouteKind;
use super::status::{ObjectKey, ScopeKey};
use coxswain_api::snapshot::{Protocol, RouteMatch, path_match};
use std::cmp::{Ordering, Reverse};
use std::sync::Arc;

/// One (route, rule, match) on one listener hostname, before virtual hosts are assembled.
#[derive(Debug, Clone)]
pub struct Entry {
    pub scope: ScopeKey,
    pub port: u32,
    pub protocol: Protocol,
    /// Hostname of the listener the route attached through (None: any).
    pub listener_hostname: Option<String>,
    /// The hostname the entry serves: route and listener hostnames intersected ("" = any).
    pub vhost: String,
    /// A "*.suffix" vhost that covers exactly one label (Ingress hosts) instead of one or
    /// more (Gateway API hostnames).
    pub single_label: bool,
    pub key: PrecedenceKey,
    /// The route, encoded once where it was compiled: entries are kept between passes
    /// ([`super::incremental`]) at a fraction of a decoded route's size, and the assembler
    /// copies the bytes into the snapshot.
    pub route: EncodedRoute,
    /// The Gateway API route kind and rule name the entry came from (None: Ingress), which
    /// access policies target.
    pub origin: Option<(RouteKind, String)>,
    /// The Gateway and listener name a Gateway API route attached through (None: Ingress), for
    /// policies attached to Gateways. One copy for every entry through that listener
    /// ([`super::memo::RouteMemo`] shares it).
    pub parent: Option<Arc<(super::status::ObjectKey, String)>>,
    /// Its place among the entries of the object it came from (a route's part, or every
    /// Ingress's entries of the pass): with the kind, the order of entries whose precedence is
    /// equal (see [`Entry::place`]).
    pub ordinal: u32,
}

impl HasRoute for Entry {
    fn route(&self) -> &EncodedRoute {
        &self.route
    }
}

/// Gateway API HTTPRoute precedence (HTTPRouteRule "matches" documentation), in order:
/// 1. the more specific hostname (exact, then longer wildcard),
/// 2. Exact path, then the longest prefix (regular expressions after prefixes: their
///    precedence is implementation-specific; Coxswain orders them by pattern length),
/// 3. a method match,
/// 4. more header matches,
/// 5. more query parameter matches,
///
/// then the oldest route, then namespace/name, then rule and match order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrecedenceKey {
    path_rank: u8,
    path_len: Reverse<usize>,
    no_method: bool,
    headers: Reverse<usize>,
    query_params: Reverse<usize>,
    /// None sorts last: objects from files without a creationTimestamp.
    created: Option<(i64, i32)>,
    route: ObjectKey,
    rule: u32,
    match_index: u32,
}

impl PrecedenceKey {
    /// The route the entry came from.
    pub fn route(&self) -> &ObjectKey {
        &self.route
    }

    pub fn new(
        m: &RouteMatch,
        created: Option<jiff_like::Timestamp>,
        route: &ObjectKey,
        rule: u32,
        match_index: u32,
    ) -> Self {
        let (path_rank, path_len) = match &m.path {
            None => (1, 1),
            Some(p) => match path_match::Kind::try_from(p.kind) {
                Ok(path_match::Kind::Exact) => (0, p.value.len()),
                Ok(path_match::Kind::Prefix) => (1, p.value.len()),
                _ => (2, p.value.len()),
            },
        };
        Self {
            path_rank,
            path_len: Reverse(path_len),
            no_method: m.method.is_empty(),
            headers: Reverse(m.headers.len()),
            query_params: Reverse(m.query_params.len()),
            created: created.map(|t| (t.as_second(), t.subsec_nanosecond())),
            route: route.clone(),
            rule,
            match_index,
        }
    }
}

impl PrecedenceKey {
    /// GRPCRoute precedence (GRPCRouteRule "matches"): after the hostname, a match naming the
    /// service, then one naming the method, then more header matches. `m` is the path match
    /// as the GRPCRoute conversion wrote it: Exact "/s/m", PathPrefix "/s", "/[^/]+/m" for a
    /// method alone, "/(?:S)/(?:M)" for patterns ("(?:[^/]+)" standing for an absent part).
    pub fn grpc(mut self, m: &RouteMatch) -> Self {
        const ANY: &str = "(?:[^/]+)";
        let (service, method) = match &m.path {
            None => (false, false),
            Some(p) => match path_match::Kind::try_from(p.kind) {
                Ok(path_match::Kind::Exact) => (true, true),
                Ok(path_match::Kind::Prefix) => (p.value != "/", false),
                _ if p.value.starts_with("/[^/]+/") => (false, true),
                _ => (
                    !p.value.starts_with(&format!("/{ANY}/")),
                    !p.value.ends_with(&format!("/{ANY}")),
                ),
            },
        };
        self.path_rank = match (service, method) {
            (true, true) => 0,
            (true, false) => 1,
            (false, true) => 2,
            (false, false) => 3,
        };
        self
    }
}

impl Entry {
    /// Where the entry stands in a full compile's list of entries, as far as entries of equal
    /// precedence are concerned: those share their object's key, so they are told apart by
    /// the object's kind (routes by kind, then Ingresses) and their ordinal within it.
    pub fn place(&self) -> (u8, u32) {
        let kind = match &self.origin {
            Some((kind, _)) => *kind as u8,
            None => u8::MAX,
        };
        (kind, self.ordinal)
    }

    /// Gateway API precedence between two entries: the more specific hostname (the entry's
    /// own), then their keys, then the hostnames by name.
    pub fn precedence(&self, other: &Self) -> Ordering {
        hostname::specificity(&self.vhost, &other.vhost)
            .then_with(|| self.key.cmp(&other.key))
            .then_with(|| self.vhost.cmp(&other.vhost))
    }
}

/// The order of keys of entries on one hostname (see [`Entry::precedence`] for the rest).
impl Ord for PrecedenceKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.path_rank
            .cmp(&other.path_rank)
            .then_with(|| self.path_len.cmp(&other.path_len))
            .then_with(|| self.no_method.cmp(&other.no_method))
            .then_with(|| self.headers.cmp(&other.headers))
            .then_with(|| self.query_params.cmp(&other.query_params))
            .then_with(|| match (self.created, other.created) {
                (Some(a), Some(b)) => a.cmp(&b),
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => Ordering::Equal,
            })
            .then_with(|| self.route.cmp(&other.route))
            .then_with(|| self.rule.cmp(&other.rule))
            .then_with(|| self.match_index.cmp(&other.match_index))
    }
}

impl PartialOrd for PrecedenceKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// k8s-openapi's Time wraps a jiff Timestamp; named here so the key does not care which.
pub mod jiff_like {
    pub type Timestamp = k8s_openapi::jiff::Timestamp;
}
