//! Request semantics: what a request means, decided once, for both HTTP engines.
//!
//! The proxy moves bytes with two engines, the fast path (`fastpath`) and Pingora
//! (`handler`). Neither decides anything about a request on its own: each hands the head it
//! parsed to [`check`] (reject what must be rejected, normalise the target), then to
//! [`route`] and [`decide`] (which route, which policy answer, which backend). So one
//! request cannot be routed two ways, and a filter or policy added here works on both.
//!
//! The target is normalised before routing, and the backend receives the normalised form
//! (docs/request-normalization.md lists the rules):
//! 1. the fragment (`#...`) is dropped;
//! 2. percent-encoded unreserved characters (`A-Z a-z 0-9 - . _ ~`) are decoded, other
//!    percent-encodings keep their meaning and get upper-case hex digits (`%2f` -> `%2F`);
//! 3. runs of slashes become one (`//admin` -> `/admin`);
//! 4. dot segments are resolved (`/a/./b/../c` -> `/a/c`, never above the root);
//!
//! and the query string is left as it came.

use crate::balance::{self, HashSource};
use crate::forwarded::Forwarded;
pub use crate::head::{Head, Version};
use crate::limits::Limits;
pub use crate::policy::{BROKEN_RESENDS, idempotent};
use crate::policy::{RoutePolicy, SessionKind, SessionPolicy};
use crate::router::{CompiledRoute, Pick, Request as RouteQuery, ResolvedBackend};
use crate::table::Table;
use crate::upstream::ClusterState;
use coxswain_api::snapshot::filter;
use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// Why a request head is refused before routing. The connection closes after the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// 400: malformed, ambiguous framing, missing or repeated Host, bad target.
    BadRequest(&'static str),
    /// 431: more header fields, or more header bytes, than the proxy's limits.
    HeadTooLarge,
    /// 405: CONNECT; a gateway does not open tunnels.
    MethodNotAllowed,
}

impl Reject {
    pub fn status(&self) -> u16 {
        match self {
            Self::BadRequest(_) => 400,
            Self::HeadTooLarge => 431,
            Self::MethodNotAllowed => 405,
        }
    }

    pub fn reason(&self) -> &'static str {
        match self {
            Self::BadRequest(why) => why,
            Self::HeadTooLarge => "request head over the proxy's limits",
            Self::MethodNotAllowed => "CONNECT is not served",
        }
    }
}

/// How the request's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    None,
    Length(u64),
    Chunked,
}

/// A head that passed [`check`]: the host to route on and the normalised target.
#[derive(Debug)]
pub struct Checked<'a> {
    /// From an absolute-form target, else the Host header ("" for none, HTTP/1.0 only).
    pub host: &'a str,
    /// Normalised path, then "?" and the query as received.
    pub path_and_query: Cow<'a, str>,
    pub body: Body,
}

impl Checked<'_> {
    /// The path without the query.
    pub fn path(&self) -> &str {
        let p: &str = &self.path_and_query;
        p.split_once('?').map_or(p, |(p, _)| p)
    }

    /// Whether the backend gets a target other than the one received (normalised, or a
    /// fragment dropped).
    pub fn rewritten(&self) -> bool {
        matches!(self.path_and_query, Cow::Owned(_))
    }
}

/// Validates a request head and normalises its target.
pub fn check<'a, H: Head + ?Sized>(head: &'a H, limits: &Limits) -> Result<Checked<'a>, Reject> {
    let method = head.method();
    if method.eq_ignore_ascii_case("CONNECT") {
        return Err(Reject::MethodNotAllowed);
    }
    let mut count = 0usize;
    let mut bytes = 0usize;
    let mut hosts = 0usize;
    let mut host: &[u8] = b"";
    let mut length: Option<u64> = None;
    let mut length_bad = false;
    let mut te_seen = false;
    let mut te_last_chunked = false;
    head.each_header(&mut |name, value| {
        count += 1;
        bytes += name.len() + value.len() + 4;
        if name.eq_ignore_ascii_case(b"host") {
            hosts += 1;
            host = value;
        } else if name.eq_ignore_ascii_case(b"content-length") {
            // "42" or a list of one repeated value ("42, 42"); anything else is ambiguous.
            for v in value.split(|b| *b == b',') {
                match parse_length(v.trim_ascii()) {
                    Some(n) if length.is_none_or(|l| l == n) => length = Some(n),
                    _ => length_bad = true,
                }
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            te_seen = true;
            for coding in value.split(|b| *b == b',') {
                let coding = coding.trim_ascii();
                if !coding.is_empty() {
                    te_last_chunked = coding.eq_ignore_ascii_case(b"chunked");
                }
            }
        }
    });
    if count > limits.max_request_headers || bytes > limits.max_request_head_bytes {
        return Err(Reject::HeadTooLarge);
    }
    // Transfer-Encoding overrides Content-Length (RFC 9112 6.3): the length is then ignored
    // and removed on the way, and the connection closes after the answer (Pingora does so).
    let body = if te_seen {
        if head.version() == Version::Http10 {
            return Err(Reject::BadRequest(
                "Transfer-Encoding in an HTTP/1.0 request",
            ));
        }
        if !te_last_chunked {
            return Err(Reject::BadRequest(
                "Transfer-Encoding does not end in chunked",
            ));
        }
        Body::Chunked
    } else if length_bad {
        return Err(Reject::BadRequest("invalid Content-Length"));
    } else {
        match length {
            Some(0) | None => Body::None,
            Some(n) => Body::Length(n),
        }
    };
    if hosts > 1 {
        return Err(Reject::BadRequest("more than one Host header"));
    }
    let (authority, path) = split_target(head.target())?;
    let host = match authority.or_else(|| head.authority()) {
        Some(a) => a,
        None if hosts == 1 => host,
        None if head.version() == Version::Http11 => {
            return Err(Reject::BadRequest("HTTP/1.1 request without Host"));
        }
        None => b"",
    };
    let host = valid_host(host).ok_or(Reject::BadRequest("invalid host"))?;
    Ok(Checked {
        host,
        path_and_query: normalize(path)?,
        body,
    })
}

/// A Content-Length value: digits only (no sign, no space inside), no overflow.
fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// (authority of an absolute-form target, the origin-form part).
fn split_target(target: &[u8]) -> Result<(Option<&[u8]>, &[u8]), Reject> {
    if target.first() == Some(&b'/') {
        return Ok((None, target));
    }
    let rest = strip_prefix_ignore_case(target, b"http://")
        .or_else(|| strip_prefix_ignore_case(target, b"https://"))
        .ok_or(Reject::BadRequest(
            "request target is not a path or an absolute URI",
        ))?;
    let end = rest
        .iter()
        .position(|b| matches!(b, b'/' | b'?' | b'#'))
        .unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.contains(&b'@') {
        return Err(Reject::BadRequest("user information in the request target"));
    }
    let path: &[u8] = match path.first() {
        Some(b'/') => path,
        // "http://host?x" and "http://host": the root.
        _ => b"/",
    };
    Ok((Some(authority), path))
}

fn strip_prefix_ignore_case<'a>(s: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    (s.len() >= prefix.len() && s[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &s[prefix.len()..])
}

/// A host with an optional port: a name, an IPv4 address or a bracketed IPv6 address.
fn valid_host(host: &[u8]) -> Option<&str> {
    let ok = if let Some(rest) = host.strip_prefix(b"[") {
        let close = rest.iter().position(|b| *b == b']')?;
        let (inside, after) = rest.split_at(close);
        inside
            .iter()
            .all(|b| b.is_ascii_hexdigit() || *b == b':' || *b == b'.')
            && valid_port(&after[1..])
    } else {
        let colon = host.iter().rposition(|b| *b == b':');
        let (name, port) = match colon {
            Some(i) => (&host[..i], &host[i..]),
            None => (host, &b""[..]),
        };
        name.iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
            && valid_port(port)
    };
    if ok {
        std::str::from_utf8(host).ok()
    } else {
        None
    }
}

/// "" or ":digits" (":" alone is allowed by RFC 3986).
fn valid_port(p: &[u8]) -> bool {
    p.is_empty() || (p[0] == b':' && p.len() <= 6 && p[1..].iter().all(u8::is_ascii_digit))
}

/// Characters a path may carry as they are (RFC 3986 pchar and "/", without "%").
fn path_char(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
                | b'/'
        )
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// The normalised origin-form target (see the module's rules). Borrowed when nothing
/// changes, which is the usual case.
pub fn normalize(target: &[u8]) -> Result<Cow<'_, str>, Reject> {
    // A fragment is never sent on; dropping it changes the target, so it is owned then.
    let fragment = target.iter().position(|b| *b == b'#');
    let target = match fragment {
        Some(i) => &target[..i],
        None => target,
    };
    let split = target.iter().position(|b| *b == b'?');
    let (path, query) = match split {
        Some(i) => (&target[..i], &target[i..]),
        None => (target, &b""[..]),
    };
    if path.first() != Some(&b'/') {
        return Err(Reject::BadRequest("request path does not start with /"));
    }
    // The query is forwarded as it came; it must still be visible ASCII.
    if !query.iter().all(|b| (0x21..0x7f).contains(b)) {
        return Err(Reject::BadRequest("invalid character in the query"));
    }
    let mut plain = true;
    for &b in path {
        if b == b'%' {
            plain = false;
        } else if !path_char(b) {
            return Err(Reject::BadRequest("invalid character in the path"));
        }
    }
    let full = std::str::from_utf8(target).map_err(|_| Reject::BadRequest("invalid target"))?;
    if plain && !needs_segment_work(path) {
        return Ok(match fragment {
            None => Cow::Borrowed(full),
            Some(_) => Cow::Owned(full.to_owned()),
        });
    }
    // Decode unreserved characters first, so "%2e%2e" is a dot segment like "..".
    let mut decoded = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        if b == b'%' {
            let (Some(h), Some(l)) = (
                path.get(i + 1).and_then(|c| hex(*c)),
                path.get(i + 2).and_then(|c| hex(*c)),
            ) else {
                return Err(Reject::BadRequest("invalid percent-encoding in the path"));
            };
            let c = h << 4 | l;
            if unreserved(c) {
                decoded.push(c);
            } else {
                decoded.push(b'%');
                decoded.push(HEX_UPPER[usize::from(h)]);
                decoded.push(HEX_UPPER[usize::from(l)]);
            }
            i += 3;
        } else {
            decoded.push(b);
            i += 1;
        }
    }
    let mut out = String::with_capacity(decoded.len() + query.len());
    resolve_segments(&decoded, &mut out);
    // Only ASCII went in.
    out.push_str(std::str::from_utf8(query).unwrap_or_default());
    if out == full && fragment.is_none() {
        Ok(Cow::Borrowed(full))
    } else {
        Ok(Cow::Owned(out))
    }
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Whether a path has an empty, "." or ".." segment (besides the root and a trailing slash).
fn needs_segment_work(path: &[u8]) -> bool {
    let mut segments = path[1..].split(|b| *b == b'/').peekable();
    while let Some(s) = segments.next() {
        let last = segments.peek().is_none();
        if (s.is_empty() && !last) || s == b"." || s == b".." {
            return true;
        }
    }
    false
}

/// RFC 3986 5.2.4 on a path that starts with "/", with empty segments dropped too. A path
/// ending in "/", "/." or "/.." keeps a trailing slash.
fn resolve_segments(path: &[u8], out: &mut String) {
    let mut kept: Vec<&[u8]> = Vec::new();
    let mut trailing_slash = false;
    let mut segments = path[1..].split(|b| *b == b'/').peekable();
    while let Some(s) = segments.next() {
        let last = segments.peek().is_none();
        match s {
            b"" | b"." => trailing_slash = last,
            b".." => {
                kept.pop();
                trailing_slash = last;
            }
            _ => {
                kept.push(s);
                trailing_slash = false;
            }
        }
    }
    for s in &kept {
        out.push('/');
        // Only ASCII path characters reach here.
        out.push_str(std::str::from_utf8(s).unwrap_or_default());
    }
    if kept.is_empty() || trailing_slash {
        out.push('/');
    }
}

/// The route serving a checked request on `port`.
pub fn route<'t, H: Head + ?Sized>(
    table: &'t Table,
    port: u16,
    head: &H,
    checked: &Checked<'_>,
) -> Option<&'t CompiledRoute> {
    table.router.route(
        port,
        &RouteQuery {
            host: checked.host,
            path_and_query: &checked.path_and_query,
            method: head.method(),
            headers: head,
        },
    )
}

/// Whether the request's Host belongs to another listener of its port than the TLS
/// connection's SNI (see `PortRouter::misdirected`): answered 421 so the client opens a
/// connection of its own for that host.
pub fn misdirected(table: &Table, port: u16, sni: Option<&str>, checked: &Checked<'_>) -> bool {
    match (sni, table.router.port(port)) {
        (Some(sni), Some(p)) => p.misdirected(sni, checked.host),
        _ => false,
    }
}

/// The connection the request came on.
#[derive(Debug, Clone, Copy)]
pub struct Arrival<'a> {
    /// The port the client addressed (a redirect keeps it).
    pub port: u16,
    pub https: bool,
    /// The client as [`forwarded`] decided it: the peer, or what trusted proxies say.
    pub client: Option<IpAddr>,
    /// The route policy whose services (global rate limit, authorization) let the request
    /// through ([`Decision::Consult`]): when it is still the route's, the limits and access
    /// checks are done and counted, and [`decide`] goes on from there. (A snapshot swapped in
    /// meanwhile may have given the route another policy.)
    pub consulted: Option<&'a RoutePolicy>,
}

/// Who the client is and what the backend is told about it (see `forwarded`). `peer`: the
/// connection's peer, or the PROXY protocol header's source.
pub fn forwarded<'h, H: Head + ?Sized>(
    head: &'h H,
    checked: &Checked<'h>,
    peer: Option<IpAddr>,
    port: u16,
    https: bool,
    limits: &Limits,
) -> Forwarded<'h> {
    let mut forwarded = Forwarded::resolve(
        head,
        peer,
        checked.host,
        https,
        port,
        &limits.client_address,
    );
    // The request's trace context, sent upstream with the forwarded fields (`trace`).
    if let Some(tracer) = &limits.tracer {
        forwarded.trace = Some(tracer.begin(crate::forwarded::traceparent(head)));
    }
    forwarded
}

/// What to do with a routed request.
#[derive(Debug)]
pub enum Decision<'t> {
    /// No route: 404.
    NotFound,
    /// Answer with this status and no body (403, 413, 500, 503, a direct response).
    Status(u16),
    Redirect {
        status: u16,
        location: String,
    },
    /// A CORS preflight the route's policy answers.
    Preflight(&'t Arc<RoutePolicy>),
    /// 401 with this `WWW-Authenticate` challenge.
    Unauthorized(&'t str),
    /// 429: over the route's rate limit; `Retry-After` in seconds.
    Limited {
        retry_after: u64,
    },
    /// Ask the route's services first (see [`Consult`]); if they let the request through,
    /// call [`decide`] again with `Arrival::consulted` set to the policy.
    Consult(Consult<'t>),
    Forward(Forward<'t>),
}

/// A request going upstream.
#[derive(Debug)]
pub struct Forward<'t> {
    pub route: &'t CompiledRoute,
    pub addr: SocketAddr,
    /// `addr`'s index in `cluster`, to record how the request went.
    pub endpoint: usize,
    pub backend: &'t ResolvedBackend,
    pub cluster: &'t Arc<ClusterState>,
    /// Mirror targets this request was sampled for, with their verified TLS if any.
    pub mirrors: Vec<(SocketAddr, Option<crate::mirror::TlsTo>)>,
    /// Session persistence: the answer names this endpoint to the client (None when the
    /// request already named it, or the route has no persistence).
    pub session: Option<(&'t crate::policy::SessionPolicy, u64)>,
    /// Held until the request ends when the route limits requests in progress.
    pub slots: Vec<crate::ratelimit::Slot>,
    /// Fields a verified JWT sets on the request (none on a fast-path route).
    pub edits: crate::external_auth::Edits,
}

/// Applies the route's policies and picks the backend. Counts toward the route's
/// round robin and mirror shares: call it once per request, from the engine that serves it
/// (twice when it answers [`Decision::Consult`] and the services let the request through).
pub fn decide<'t, H: Head + ?Sized>(
    route: Option<&'t CompiledRoute>,
    head: &H,
    checked: &Checked<'_>,
    arrival: &Arrival,
) -> Decision<'t> {
    let Some(route) = route else {
        return Decision::NotFound;
    };
    let policy = &route.policy;
    // As nginx orders its phases: limits count every request, then access control decides,
    // the external service last (it is the costly one).
    let mut slots = Vec::new();
    let mut edits = crate::external_auth::Edits::default();
    let consulted = arrival
        .consulted
        .is_some_and(|p| std::ptr::eq(&**policy, p));
    if !consulted {
        for limiter in &policy.rate_limits {
            let key = limiter
                .header()
                .and_then(|h| head.get(h))
                .map(str::as_bytes);
            match limiter.admit(arrival.client, key) {
                Ok(slot) => slots.extend(slot),
                Err(limited) => {
                    return Decision::Limited {
                        retry_after: limited.retry_after_secs(),
                    };
                }
            }
        }
        if let Some(list) = &policy.allowlist
            && !arrival.client.is_some_and(|ip| list.allows(ip))
        {
            return Decision::Status(403);
        }
        if let Some(auth) = &policy.basic_auth
            && !auth.allows(head.get("authorization").map(str::as_bytes))
        {
            return Decision::Unauthorized(&auth.challenge);
        }
        if let Some(jwt) = &policy.jwt {
            match jwt.verify(head.get("authorization"), crate::jwt::unix_now()) {
                Ok(fields) => {
                    // A claim's field is always the token's: the client's own never passes.
                    edits.remove = fields.iter().map(|(n, _)| n.clone()).collect();
                    edits.add = fields;
                }
                Err(why) => {
                    tracing::debug!(reason = %why, "JWT refused");
                    return Decision::Unauthorized(&jwt.challenge);
                }
            }
        }
        // The services last: they are the costly checks, and a request refused above is
        // never counted against the shared limit.
        let limit = policy.global_limit.as_ref().and_then(|g| {
            g.request(
                |name| head.get(name),
                crate::ratelimit::global::Described {
                    client: arrival.client,
                    method: head.method(),
                    path: checked.path(),
                },
            )
        });
        let authorize = policy.external_auth.is_some();
        if limit.is_some() || authorize {
            return Decision::Consult(Consult {
                policy,
                limit,
                authorize,
                slots,
                edits,
            });
        }
    }
    let redirect = route.route.filters.iter().find_map(|f| match &f.kind {
        Some(filter::Kind::RequestRedirect(r)) => Some(r),
        _ => None,
    });
    if let Some(r) = redirect {
        let location = crate::filters::redirect_location(
            &crate::filters::RedirectRequest {
                scheme: if arrival.https { "https" } else { "http" },
                host: crate::router::strip_port(checked.host),
                listener_port: arrival.port,
                path_and_query: &checked.path_and_query,
                matched_prefix: route.matched_prefix(),
            },
            r,
        );
        return Decision::Redirect {
            status: u16::try_from(r.status_code).unwrap_or(302),
            location,
        };
    }
    if route.route.direct_status != 0 {
        return Decision::Status(u16::try_from(route.route.direct_status).unwrap_or(500));
    }
    if policy.cors.is_some() && is_preflight(head) {
        return Decision::Preflight(policy);
    }
    if policy.max_body_bytes > 0
        && matches!(checked.body, Body::Length(n) if n > policy.max_body_bytes)
    {
        return Decision::Status(413);
    }
    let mut mirrors = Vec::new();
    for m in &route.mirrors {
        let Some(cluster) = m.cluster.as_ref() else {
            continue;
        };
        // Verified TLS or nothing: a Service under a BackendTLSPolicy gets no mirror in clear.
        let tls = match &cluster.backend_tls {
            None => None,
            Some(t) => match &t.mirror {
                Some(tls) => Some(tls.clone()),
                None => {
                    tracing::debug!(cluster = %cluster.name, "mirror skipped: its TLS cannot be verified here");
                    continue;
                }
            },
        };
        if m.sampled()
            && let Some(target) = cluster.pick()
        {
            mirrors.push((target, tls));
        }
    }
    // A session the request names goes back to its endpoint while that endpoint is in one
    // of the route's backends and takes requests; otherwise the balancer picks, and the
    // answer names the new endpoint.
    if let Some(session) = &policy.session
        && let Some(id) = session_requested(session, head)
    {
        for backend in &route.backends {
            if let Some(cluster) = &backend.cluster
                && let Some(endpoint) = cluster.session_endpoint(id)
            {
                if cluster.backend_tls.as_ref().is_some_and(|t| t.refuse) {
                    return Decision::Status(502);
                }
                return Decision::Forward(Forward {
                    route,
                    addr: cluster.addr(endpoint),
                    endpoint,
                    backend,
                    cluster,
                    mirrors,
                    session: None,
                    slots,
                    edits,
                });
            }
        }
    }
    let mut key = |source: &HashSource| match source {
        HashSource::Header(name) => head.get(name).map(|v| balance::key_hash(v.as_bytes())),
        HashSource::Cookie(name) => {
            let mut hash = None;
            head.each_header(&mut |n, v| {
                if hash.is_none()
                    && n.eq_ignore_ascii_case(b"cookie")
                    && let Some(value) = balance::cookie_value(v, name)
                {
                    hash = Some(balance::key_hash(value));
                }
            });
            hash
        }
        HashSource::ClientAddress => arrival.client.map(balance::address_hash),
    };
    match route.pick(&mut key) {
        Pick::Endpoint {
            addr,
            endpoint,
            backend,
            cluster,
        } => {
            // A BackendTLSPolicy without a usable CA: never send unverified.
            if cluster.backend_tls.as_ref().is_some_and(|t| t.refuse) {
                return Decision::Status(502);
            }
            Decision::Forward(Forward {
                route,
                addr,
                endpoint,
                backend,
                cluster,
                mirrors,
                session: policy
                    .session
                    .as_ref()
                    .map(|s| (s, cluster.endpoint_id(endpoint))),
                slots,
                edits,
            })
        }
        Pick::InvalidBackend => Decision::Status(500),
        Pick::NoEndpoints => Decision::Status(503),
    }
}

/// The endpoint a request's session cookie or header names, if any.
fn session_requested<H: Head + ?Sized>(session: &SessionPolicy, head: &H) -> Option<u64> {
    let mut found = None;
    head.each_header(&mut |name, value| {
        if found.is_some() {
            return;
        }
        found = match session.kind {
            SessionKind::Header if name.eq_ignore_ascii_case(session.name.as_bytes()) => {
                Some(value.trim_ascii())
            }
            SessionKind::Cookie if name.eq_ignore_ascii_case(b"cookie") => {
                balance::cookie_value(value, &session.name)
            }
            _ => None,
        };
    });
    SessionPolicy::endpoint_named(found?)
}

/// A CORS preflight: OPTIONS naming the method it asks about, from a page with an Origin.
pub fn is_preflight<H: Head + ?Sized>(head: &H) -> bool {
    head.method() == "OPTIONS"
        && head.get("origin").is_some()
        && head.get("access-control-request-method").is_some()
}

/// What a request's Connection field asks of the client connection, when it asks nothing
/// else: only the `close` and `keep-alive` options (RFC 9112 section 9). Both are about this
/// hop, so neither engine forwards such a field: the connection to the backend is the
/// proxy's own and stays pooled (RFC 9110 section 7.6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionOption {
    KeepAlive,
    /// The client closes after this request: the answer says `connection: close` and the
    /// proxy closes its side once it is sent.
    Close,
}

/// The options of one Connection field value, or None when it names anything besides
/// `close` and `keep-alive` (an upgrade, a hop-by-hop field): such a request goes on as
/// it came, to Pingora. An empty value (or one of only commas) names nothing.
pub fn connection_option(value: &[u8]) -> Option<ConnectionOption> {
    let mut option = ConnectionOption::KeepAlive;
    for token in value.split(|b| *b == b',') {
        let token = token.trim_ascii();
        if token.eq_ignore_ascii_case(b"close") {
            option = ConnectionOption::Close;
        } else if !(token.is_empty() || token.eq_ignore_ascii_case(b"keep-alive")) {
            return None;
        }
    }
    Some(option)
}

mod consult;
pub use consult::{Consult, auth_request};

#[cfg(test)]
mod tests;
