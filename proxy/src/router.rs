//! The routing table: built once per snapshot, read by every request.
//!
//! Building does all the work that does not depend on the request: hosts go into hash maps
//! (exact names, wildcard suffixes), regexes are compiled, header names lower-cased, routes
//! already sit in precedence order (the compiler sorted them). A lookup is then a host lookup
//! (one hash probe per label at most) and a scan of that host's routes, with no allocation
//! unless the Host header has upper-case letters.

use crate::upstream::ClusterState;
use coxswain_api::snapshot::outline::Outline;
use coxswain_api::snapshot::{self as snap, Sealed};
use regex::Regex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Why a snapshot cannot be turned into a routing table. The proxy then keeps the table it has.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("listener port {0} is out of range")]
    Port(u32),
    /// Bytes the sender sealed but that are not a snapshot's (the outline checked out; what it
    /// left encoded did not).
    #[error("the snapshot does not decode: {what}: {source}")]
    Decode {
        what: String,
        #[source]
        source: prost::DecodeError,
    },
    #[error("route {route}: invalid {what} regular expression {pattern:?}: {source}")]
    Regex {
        route: String,
        what: &'static str,
        pattern: String,
        #[source]
        source: regex::Error,
    },
}

/// Routing for every port of a snapshot.
#[derive(Debug, Default)]
pub struct Router {
    ports: HashMap<u16, PortRouter>,
    clusters: HashMap<Box<str>, Arc<ClusterState>>,
    version: String,
}

/// A backend of a route with its cluster looked up.
#[derive(Debug)]
pub struct ResolvedBackend {
    /// None: the backend ref did not resolve; requests sent to it get 500.
    pub cluster: Option<Arc<ClusterState>>,
    pub weight: u32,
    pub filters: Vec<snap::Filter>,
    /// The rule's ResponseHeaderModifiers, then this backend's, in the order they apply
    /// (None when there are none): the fast path edits a response head with these.
    pub response_edits: Option<Arc<[snap::HeaderModifier]>>,
}

/// Which upstream a request goes to.
#[derive(Debug)]
pub enum Pick<'a> {
    Endpoint {
        addr: SocketAddr,
        /// The endpoint's index in its cluster (to record how the request went).
        endpoint: usize,
        backend: &'a ResolvedBackend,
        cluster: &'a Arc<ClusterState>,
    },
    /// The weighted choice fell on a backend that did not resolve, or nothing has weight.
    InvalidBackend,
    /// The chosen backend has no endpoint that takes traffic.
    NoEndpoints,
}

/// What the proxy does with a request, decided from the table alone (no upstream I/O): the
/// answer `coxswain snapshot match` prints and the proxy's first step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// No route: 404.
    NotFound,
    /// Answer without forwarding: a redirect, or 500 for a rule without valid backends.
    Respond(u16),
    /// Forward to one of the route's backends (those with a cluster and weight > 0).
    Forward,
    /// Backends resolve, but none has an endpoint that can take traffic: 503.
    Unavailable,
}

impl Outcome {
    /// The status the proxy answers (200 standing for "forwarded").
    pub fn status(&self) -> u16 {
        match self {
            Self::NotFound => 404,
            Self::Respond(s) => *s,
            Self::Forward => 200,
            Self::Unavailable => 503,
        }
    }
}

/// What a listening socket is bound for: a change of either binds the port again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    pub protocol: snap::Protocol,
    /// See [`PortRouter::public_port`].
    pub public_port: u16,
}

/// Routing for one port.
#[derive(Debug, Default)]
pub struct PortRouter {
    /// Host names -> indexes into `hosts`. Shared with the previous table while the port's
    /// hosts keep their names and places, as they do when a route of theirs changes.
    index: Arc<HostIndex>,
    /// Host index -> its routes. A host the next snapshot leaves as it is goes to the next
    /// table as it is: one pointer, instead of its routes compiled again, and no allocation
    /// made while the old table still serves and freed a swap later (which left the
    /// allocator's pages part-used after every swap: `make bench-memory`).
    hosts: Vec<Arc<[CompiledRoute]>>,
    /// Per host (as `hosts`), the encoding it was built from: slices of this table's
    /// snapshot, so a table keeps one snapshot's bytes, its own.
    encoded: Vec<bytes::Bytes>,
    /// TLS ports: per host (as `hosts`), whether TLS ends here before the relay.
    terminates_tls: Vec<bool>,
    pub protocol: snap::Protocol,
    /// The port clients addressed (redirects, X-Forwarded-Port): this one, or the listener
    /// port a shared-pool Gateway's Service maps to it.
    pub public_port: u16,
    /// HTTPS: the Gateway listeners' hostnames, to tell a misdirected request.
    listeners: ListenerNames,
}

/// Where a port's hosts are, by name. Names are shared (`Arc<str>`), so the next table's index
/// can start as a copy of this one for the price of the counts.
#[derive(Debug, Default, Clone)]
struct HostIndex {
    exact: HashMap<Arc<str>, usize>,
    /// Keyed by the suffix after "*.": Gateway API wildcards, one or more labels.
    wildcard: HashMap<Arc<str>, usize>,
    /// Keyed by the suffix after "*.": Ingress wildcards, exactly one label.
    single_label: HashMap<Arc<str>, usize>,
    any: Option<usize>,
}

/// The hostnames of a port's Gateway listeners: which listener a name selects (exact, then
/// the longest wildcard suffix, then the one without a hostname), as the Gateway API picks
/// a listener for a connection's SNI and for a request's Host.
#[derive(Debug, Default)]
struct ListenerNames {
    exact: HashMap<Box<str>, usize>,
    /// (".suffix", listener), longest suffix first.
    wildcards: Vec<(Box<str>, usize)>,
    any: Option<usize>,
}

impl ListenerNames {
    fn new(names: &[String]) -> Self {
        let mut out = Self::default();
        for (i, name) in names.iter().enumerate() {
            let name = name.to_ascii_lowercase();
            if name.is_empty() {
                out.any = Some(i);
            } else if let Some(suffix) = name.strip_prefix('*') {
                out.wildcards.push((suffix.into(), i));
            } else {
                out.exact.insert(name.into(), i);
            }
        }
        out.wildcards
            .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        out
    }

    fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcards.is_empty() && self.any.is_none()
    }

    /// `name` is lowercase, without port or trailing dot.
    fn select(&self, name: &str) -> Option<usize> {
        if let Some(i) = self.exact.get(name) {
            return Some(*i);
        }
        self.wildcards
            .iter()
            .find(|(suffix, _)| name.len() > suffix.len() && name.ends_with(&**suffix))
            .map(|(_, i)| *i)
            .or(self.any)
    }
}

/// A route with its matchers compiled. The action is shared: several hosts may list the same
/// route.
#[derive(Debug)]
pub struct CompiledRoute {
    path: PathMatcher,
    headers: Vec<ValueMatcher>,
    query_params: Vec<ValueMatcher>,
    method: Option<Box<str>>,
    pub route: Arc<snap::Route>,
    pub backends: Vec<ResolvedBackend>,
    /// This rule's request counters (shared across tables: swaps do not reset them).
    pub counters: Arc<crate::metrics::RouteCounters>,
    /// Allowlist, CORS, body limit, rewrite template and the like, compiled.
    pub policy: Arc<crate::policy::RoutePolicy>,
    /// The backends' weights divided by their greatest common divisor, summed: the length of
    /// one round of picks.
    total_weight: u64,
    weight_divisor: u32,
    /// Step through a round's positions (see `pick`).
    stride: u64,
    next: AtomicUsize,
    /// The rule's RequestMirror filters, in order.
    pub mirrors: Vec<Mirror>,
    /// Requests only need forwarding, with at most plain header field edits, URL rewrites,
    /// timeouts, retries and the request layer's policies (see `compile_route`): no other
    /// filter, no mirror or outside service, and every backend an HTTP/1 cluster with
    /// endpoints.
    pub passthrough: bool,
}

/// A RequestMirror filter with its cluster looked up and a sampling counter of its own, so
/// several mirrors on one rule each get their exact share.
#[derive(Debug)]
pub struct Mirror {
    /// None: the mirror's backend ref did not resolve; nothing is sent.
    pub cluster: Option<Arc<ClusterState>>,
    /// The share copied, reduced by its common divisor (20/100 is 1/5).
    numerator: u64,
    denominator: u64,
    /// Spreads the copied requests over each round, as `CompiledRoute::pick` does.
    stride: u64,
    seq: AtomicUsize,
}

impl Mirror {
    fn new(m: &snap::RequestMirror, clusters: &HashMap<Box<str>, Arc<ClusterState>>) -> Self {
        let (numerator, denominator) = (u64::from(m.numerator), u64::from(m.denominator));
        let divisor = gcd(numerator, denominator).max(1);
        let denominator = denominator / divisor;
        Self {
            cluster: clusters.get(m.cluster.as_str()).cloned(),
            numerator: numerator / divisor,
            denominator,
            stride: interleaving_stride(denominator),
            seq: AtomicUsize::new(0),
        }
    }

    /// Whether this request is one of the `numerator` in every `denominator` this mirror
    /// copies (a rotating counter: exact shares, no randomness, no lock). The copies are
    /// spread over the round, not the first `numerator` of it: any run of requests, and each
    /// proxy's part of them when several share the traffic, is copied at the share asked.
    pub fn sampled(&self) -> bool {
        if self.denominator == 0 || self.numerator == 0 {
            return false;
        }
        let n = self.seq.fetch_add(1, Ordering::Relaxed) as u64 % self.denominator;
        let position = u128::from(n) * u128::from(self.stride) % u128::from(self.denominator);
        position < u128::from(self.numerator)
    }
}

impl CompiledRoute {
    /// Weighted choice among the backends (a rotating counter over the cumulative weights:
    /// exact shares, no randomness, no lock), then an endpoint of that backend by its
    /// cluster's load balancer; `key` hashes the request's key for a consistent-hash cluster.
    pub fn pick(
        &self,
        key: &mut dyn FnMut(&crate::balance::HashSource) -> Option<u64>,
    ) -> Pick<'_> {
        if self.total_weight == 0 {
            return Pick::InvalidBackend;
        }
        // The n-th pick takes the backend whose share of the round holds position
        // n * stride (mod the round): the stride spreads consecutive picks over the whole
        // round, so weights 70:30 go 1,2,1,1,2,... and never 70 in a row to one backend.
        // Any run of picks then splits as the weights say to within a few, also when
        // several proxies each see part of the requests.
        let n = self.next.fetch_add(1, Ordering::Relaxed) as u64 % self.total_weight;
        let position = u128::from(n) * u128::from(self.stride) % u128::from(self.total_weight);
        let position = u64::try_from(position).unwrap_or(0);
        let mut acc = 0u64;
        for b in &self.backends {
            acc += u64::from(b.weight / self.weight_divisor);
            if position < acc {
                let Some(cluster) = &b.cluster else {
                    return Pick::InvalidBackend;
                };
                return match cluster.pick_for(key) {
                    Some(endpoint) => Pick::Endpoint {
                        addr: cluster.addr(endpoint),
                        endpoint,
                        backend: b,
                        cluster,
                    },
                    None => Pick::NoEndpoints,
                };
            }
        }
        Pick::InvalidBackend
    }

    /// The path and query after the route's regex rewrite template, if it has one: `$n` are
    /// the capture groups of its regex path match against `path_and_query`'s path.
    pub fn regex_rewrite(&self, path_and_query: &str) -> Option<String> {
        let template = self.policy.rewrite.as_ref()?;
        let (path, query) = match path_and_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path_and_query, None),
        };
        let captures = match &self.path {
            PathMatcher::Regex(r) => r.captures(path),
            _ => None,
        };
        Some(template.render(
            |n| captures.as_ref().and_then(|c| c.get(n)).map(|m| m.as_str()),
            query,
        ))
    }

    /// The path prefix this route matched on, for URL rewrites of the prefix.
    pub fn matched_prefix(&self) -> Option<&str> {
        match &self.path {
            PathMatcher::Prefix(p) => Some(p),
            _ => None,
        }
    }
}

#[derive(Debug)]
enum PathMatcher {
    Exact(Box<str>),
    /// Element-wise prefix; "/" (stored as "") matches everything.
    Prefix(Box<str>),
    Regex(Regex),
}

#[derive(Debug)]
struct ValueMatcher {
    name: Box<str>,
    value: StrMatcher,
}

#[derive(Debug)]
enum StrMatcher {
    Exact(Box<str>),
    Regex(Regex),
}

impl StrMatcher {
    fn matches(&self, v: &str) -> bool {
        match self {
            Self::Exact(e) => **e == *v,
            Self::Regex(r) => r.is_match(v),
        }
    }
}

/// Request headers, however the caller stores them.
pub trait Headers {
    /// The first value of a header; `name` is lower-case.
    fn get(&self, name: &str) -> Option<&str>;
}

impl Headers for [(String, String)] {
    fn get(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What the router needs to know about a request.
pub struct Request<'a, H: Headers + ?Sized> {
    /// Host header or :authority, possibly with a port.
    pub host: &'a str,
    /// The request target's path and query ("/a/b?x=1").
    pub path_and_query: &'a str,
    pub method: &'a str,
    pub headers: &'a H,
}

impl Router {
    /// Builds the table. Fails on a regex that does not compile (the compiler checks regexes
    /// too; this guards against a snapshot from elsewhere). Only a sealed snapshot is built:
    /// its version names exactly what is served.
    pub fn build(snapshot: &Sealed) -> Result<Self, BuildError> {
        Self::build_with_metrics(snapshot, &crate::metrics::Metrics::default())
    }

    /// Builds the table, taking each rule's counters from `metrics`.
    pub fn build_with_metrics(
        snapshot: &Sealed,
        metrics: &crate::metrics::Metrics,
    ) -> Result<Self, BuildError> {
        let outline = Outline::of(snapshot).map_err(|source| BuildError::Decode {
            what: "outline".into(),
            source,
        })?;
        Self::build_after(&outline, metrics, &Self::default())
    }

    pub fn cluster(&self, name: &str) -> Option<&Arc<ClusterState>> {
        self.clusters.get(name)
    }

    /// What happens to a request that `route` (None: no route) serves.
    pub fn outcome(&self, route: Option<&CompiledRoute>) -> Outcome {
        let Some(route) = route else {
            return Outcome::NotFound;
        };
        let r = &route.route;
        if let Some(code) = r.filters.iter().find_map(|f| match &f.kind {
            Some(snap::filter::Kind::RequestRedirect(rr)) => Some(rr.status_code),
            _ => None,
        }) {
            return Outcome::Respond(u16::try_from(code).unwrap_or(302));
        }
        if r.direct_status != 0 {
            return Outcome::Respond(u16::try_from(r.direct_status).unwrap_or(500));
        }
        let mut valid = route
            .backends
            .iter()
            .filter(|b| b.weight > 0 && b.cluster.is_some())
            .peekable();
        if valid.peek().is_none() {
            return Outcome::Respond(500);
        }
        // Ready endpoints take traffic; serving-but-terminating ones only when nothing is ready.
        let usable = valid.any(|b| b.cluster.as_ref().is_some_and(|c| c.has_endpoints()));
        if usable {
            Outcome::Forward
        } else {
            Outcome::Unavailable
        }
    }

    pub fn version(&self) -> &str {
        &self.version
    }

    pub fn port(&self, port: u16) -> Option<&PortRouter> {
        self.ports.get(&port)
    }

    /// Ports the snapshot asks the proxy to listen on, and how.
    pub fn ports(&self) -> impl Iterator<Item = (u16, Binding)> + '_ {
        self.ports.iter().map(|(p, r)| {
            (
                *p,
                Binding {
                    protocol: r.protocol,
                    public_port: r.public_port,
                },
            )
        })
    }

    /// The route serving a request on `port`, if any.
    pub fn route<H: Headers + ?Sized>(
        &self,
        port: u16,
        req: &Request<'_, H>,
    ) -> Option<&CompiledRoute> {
        self.ports.get(&port)?.route(req)
    }
}

impl PortRouter {
    pub fn route<H: Headers + ?Sized>(&self, req: &Request<'_, H>) -> Option<&CompiledRoute> {
        let routes = self.host_routes(self.host_index(req.host)?);
        let (path, query) = match req.path_and_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (req.path_and_query, None),
        };
        routes.iter().find(|r| r.matches(path, query, req))
    }

    /// Whether a request for `host` on a connection whose SNI was `sni` belongs to another of
    /// this port's listeners than the connection's (RFC 9110 15.5.20: 421 Misdirected
    /// Request). Only when both select a listener: a name no listener takes is a plain 404.
    pub fn misdirected(&self, sni: &str, host: &str) -> bool {
        if self.listeners.is_empty() {
            return false;
        }
        let host = strip_port(host);
        let host = host.strip_suffix('.').unwrap_or(host);
        let lowered;
        let host = if host.bytes().any(|b| b.is_ascii_uppercase()) {
            lowered = host.to_ascii_lowercase();
            lowered.as_str()
        } else {
            host
        };
        match (self.listeners.select(sni), self.listeners.select(host)) {
            (Some(a), Some(b)) => a != b,
            _ => false,
        }
    }

    /// The first route of the host a name lands on, and whether that host ends TLS here: what
    /// a relayed connection goes by (a TLS port has only the ClientHello's SNI; a TCP port, no
    /// name at all: "").
    pub fn relay_route(&self, host: &str) -> Option<(&CompiledRoute, bool)> {
        let i = self.host_index(host)?;
        let terminates = self.terminates_tls.get(i).copied().unwrap_or(false);
        Some((self.host_routes(i).first()?, terminates))
    }

    /// The host a snapshot's (lowercased) hostname was filed under, as the build files it.
    fn named_host(&self, name: &str, single_label: bool) -> Option<usize> {
        let index = &self.index;
        if name.is_empty() {
            return index.any;
        }
        match name.strip_prefix("*.") {
            Some(suffix) if single_label => index.single_label.get(suffix).copied(),
            Some(suffix) => index.wildcard.get(suffix).copied(),
            None => index.exact.get(name).copied(),
        }
    }

    fn host_routes(&self, host: usize) -> &[CompiledRoute] {
        self.hosts.get(host).map(|r| &r[..]).unwrap_or_default()
    }

    /// The most specific host: exact name, then the longest wildcard suffix, then any. A
    /// single-label (Ingress) wildcard covers only a host one label above its suffix, and
    /// comes before the multi-label one of the same suffix there (the compiler put every
    /// route of that name in it); a deeper host skips it.
    fn host_index(&self, host: &str) -> Option<usize> {
        let host = strip_port(host);
        let host = host.strip_suffix('.').unwrap_or(host);
        let lowered;
        let host = if host.bytes().any(|b| b.is_ascii_uppercase()) {
            lowered = host.to_ascii_lowercase();
            lowered.as_str()
        } else {
            host
        };
        let index = &*self.index;
        if let Some(i) = index.exact.get(host) {
            return Some(*i);
        }
        if !index.single_label.is_empty()
            && let Some((label, parent)) = host.split_once('.')
            && !label.is_empty()
            && let Some(i) = index.single_label.get(parent)
        {
            return Some(*i);
        }
        if !index.wildcard.is_empty() {
            let mut rest = host;
            while let Some((_, parent)) = rest.split_once('.') {
                if let Some(i) = index.wildcard.get(parent) {
                    return Some(*i);
                }
                rest = parent;
            }
        }
        index.any
    }
}

/// "example.com:8080" -> "example.com"; "[::1]:80" -> "[::1]".
pub fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host
            .split_once(']')
            .map_or(host, |(h, _)| &host[..=h.len()]);
    }
    match host.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

impl CompiledRoute {
    fn matches<H: Headers + ?Sized>(
        &self,
        path: &str,
        query: Option<&str>,
        req: &Request<'_, H>,
    ) -> bool {
        let path_ok = match &self.path {
            PathMatcher::Exact(p) => **p == *path,
            PathMatcher::Prefix(p) => {
                p.is_empty()
                    || (path.starts_with(&**p)
                        && (path.len() == p.len() || path.as_bytes()[p.len()] == b'/'))
            }
            PathMatcher::Regex(r) => r.is_match(path),
        };
        path_ok
            && self.method.as_deref().is_none_or(|m| m == req.method)
            && self
                .headers
                .iter()
                .all(|h| req.headers.get(&h.name).is_some_and(|v| h.value.matches(v)))
            && self
                .query_params
                .iter()
                .all(|q| query_param(query, &q.name).is_some_and(|v| q.value.matches(v)))
    }
}

/// The first value of a query parameter (names are case-sensitive).
fn query_param<'q>(query: Option<&'q str>, name: &str) -> Option<&'q str> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then_some(v)
    })
}

mod build;
mod compile;
use compile::{gcd, interleaving_stride};

#[cfg(test)]
mod tests;
