//! Per-route request policy, compiled once per snapshot: client allowlists, CORS, body limits,
//! regex rewrite templates, upstream protocol and access logging. Everything a request checks
//! is precomputed here (masks, joined header values), so the checks only compare.

pub use crate::addresses::{AddressSet, BadCidr};
use coxswain_api::snapshot::{self as snap, filter, path_modifier};
use std::borrow::Cow;

/// What a route asks of each request beyond matching and forwarding.
#[derive(Debug)]
pub struct RoutePolicy {
    /// Some: only these clients are served.
    pub allowlist: Option<AddressSet>,
    /// 0: no limit.
    pub max_body_bytes: u64,
    pub cors: Option<CorsPolicy>,
    /// From a UrlRewrite with replace_regex_match.
    pub rewrite: Option<Template>,
    pub access_log: bool,
    pub upstream_protocol: snap::UpstreamProtocol,
    /// Answers retried on another endpoint.
    pub retry: Option<RetryPolicy>,
    /// Some: a client's requests stay on one endpoint.
    pub session: Option<SessionPolicy>,
    /// Requests over any of these are answered 429.
    pub rate_limits: Vec<std::sync::Arc<crate::ratelimit::Limiter>>,
    /// Some: requests need a user and password of this list.
    pub basic_auth: Option<crate::auth::BasicAuth>,
    /// Some: requests need a JSON Web Token one of its providers signed.
    pub jwt: Option<crate::jwt::JwtAuth>,
    /// Some: an authorization service decides each request before it is forwarded.
    pub external_auth: Option<std::sync::Arc<crate::external_auth::ExternalAuth>>,
    /// Some: a rate limit service shared by all replicas counts each request.
    pub global_limit: Option<crate::ratelimit::global::GlobalLimit>,
}

/// Session persistence (GEP-1619, Ingress cookie affinity): the answer names its endpoint in a
/// cookie or header; a request bringing that name back goes to the same endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPolicy {
    pub kind: SessionKind,
    /// The cookie's name, or the header's in lowercase.
    pub name: Box<str>,
    /// What follows the cookie's value: "; Path=/; HttpOnly" and Max-Age when it has one.
    cookie_attributes: Box<str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionKind {
    Cookie,
    Header,
}

impl SessionPolicy {
    fn new(s: &snap::SessionPersistence) -> Option<Self> {
        if s.name.is_empty() {
            return None;
        }
        let kind = match snap::session_persistence::Kind::try_from(s.kind) {
            Ok(snap::session_persistence::Kind::Header) => SessionKind::Header,
            _ => SessionKind::Cookie,
        };
        let path = if s.path.is_empty() { "/" } else { &s.path };
        let mut cookie_attributes = format!("; Path={path}; HttpOnly");
        if s.max_age_s > 0 {
            cookie_attributes.push_str(&format!("; Max-Age={}", s.max_age_s));
        }
        Some(Self {
            kind,
            name: match kind {
                SessionKind::Header => s.name.to_ascii_lowercase().into(),
                SessionKind::Cookie => s.name.as_str().into(),
            },
            cookie_attributes: cookie_attributes.into(),
        })
    }

    /// The endpoint name in a request's cookie value or header value (16 hex digits, as
    /// `answer` writes them).
    pub fn endpoint_named(value: &[u8]) -> Option<u64> {
        if value.len() != 16 {
            return None;
        }
        u64::from_str_radix(std::str::from_utf8(value).ok()?, 16).ok()
    }

    /// The response field that names endpoint `id` to the client, added beside the
    /// backend's own (a Set-Cookie of the application's stays).
    pub fn answer(&self, id: u64) -> PolicyField {
        match self.kind {
            SessionKind::Cookie => (
                Cow::Borrowed("set-cookie"),
                format!("{}={id:016x}{}", self.name, self.cookie_attributes),
                FieldOp::Add,
            ),
            SessionKind::Header => (
                Cow::Owned(self.name.to_string()),
                format!("{id:016x}"),
                FieldOp::Add,
            ),
        }
    }
}

/// RFC 9110 9.2.2: a proxy may send these again on its own after a connection failed.
pub fn idempotent(method: &str) -> bool {
    matches!(
        method,
        "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE"
    )
}

/// Without a retry policy, how many times an idempotent request is sent again after a
/// connection broke before any of the answer came. A scale-down stops many Pods at once, and
/// each may reset connections in the moment before its EndpointSlice says so: one resend was
/// seen to meet a second such Pod. Three tries in all, as ingress-nginx's
/// `proxy-next-upstream-tries`.
pub const BROKEN_RESENDS: u8 = 2;

/// Request body bytes kept for sending again: a request whose body is larger is not retried
/// once any of it went upstream (Pingora's retry buffer holds this much).
pub const RETRY_BODY_LIMIT: usize = 64 * 1024;

/// A route's retries on backend answers (GEP-1731, Ingress retry annotations).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Ascending.
    pub codes: Vec<u16>,
    pub attempts: u32,
    pub backoff: std::time::Duration,
    /// Methods that are not idempotent are retried too.
    pub non_idempotent: bool,
    /// No retry starts later than this after the request arrived.
    pub timeout: Option<std::time::Duration>,
}

impl RetryPolicy {
    fn new(r: &snap::Retry) -> Self {
        Self {
            codes: r
                .codes
                .iter()
                .filter_map(|c| u16::try_from(*c).ok())
                .collect(),
            attempts: r.attempts,
            backoff: std::time::Duration::from_millis(r.backoff_ms),
            non_idempotent: r.non_idempotent,
            timeout: (r.timeout_ms > 0).then(|| std::time::Duration::from_millis(r.timeout_ms)),
        }
    }

    /// Whether a retry may still start, for a request that arrived at `started`.
    pub fn in_time(&self, started: Option<std::time::Instant>) -> bool {
        match (self.timeout, started) {
            (Some(limit), Some(at)) => at.elapsed() < limit,
            _ => true,
        }
    }

    /// Whether an answer with `status` is retried.
    pub fn retries(&self, status: u16) -> bool {
        self.codes.binary_search(&status).is_ok()
    }

    /// Whether a request of `method` may be sent again at all.
    pub fn allows(&self, method: &str) -> bool {
        self.non_idempotent || idempotent(method)
    }
}

impl RoutePolicy {
    /// `limits`: where rate-limit buckets outlive this table; `clusters`: where an
    /// authorization service's endpoints are.
    pub fn new(
        route: &snap::Route,
        limits: &crate::ratelimit::Registry,
        clusters: &std::collections::HashMap<
            Box<str>,
            std::sync::Arc<crate::upstream::ClusterState>,
        >,
    ) -> Self {
        let mut cors = None;
        let mut rewrite = None;
        for f in &route.filters {
            match &f.kind {
                Some(filter::Kind::Cors(c)) => cors = Some(CorsPolicy::new(c)),
                Some(filter::Kind::UrlRewrite(u)) => {
                    if let Some(snap::PathModifier {
                        kind: Some(path_modifier::Kind::ReplaceRegexMatch(t)),
                    }) = &u.path
                    {
                        rewrite = Some(Template::parse(t));
                    }
                }
                _ => {}
            }
        }
        Self {
            allowlist: route.client_allowlist.as_ref().map(AddressSet::new),
            max_body_bytes: route.max_request_body_bytes,
            cors,
            rewrite,
            access_log: !route.access_log_off,
            upstream_protocol: snap::UpstreamProtocol::try_from(route.upstream_protocol)
                .unwrap_or_default(),
            retry: route.retry.as_ref().map(RetryPolicy::new),
            session: route
                .session_persistence
                .as_ref()
                .and_then(SessionPolicy::new),
            rate_limits: route
                .rate_limits
                .iter()
                .filter_map(|r| limits.limiter(r))
                .collect(),
            basic_auth: route
                .basic_auth
                .as_ref()
                .map(|b| crate::auth::BasicAuth::new(&b.realm, &b.users)),
            jwt: route.jwt.as_ref().map(crate::jwt::JwtAuth::new),
            external_auth: route
                .external_auth
                .as_ref()
                .map(|e| std::sync::Arc::new(crate::external_auth::ExternalAuth::new(e, clusters))),
            global_limit: route
                .global_rate_limit
                .as_ref()
                .map(|g| crate::ratelimit::global::GlobalLimit::new(g, clusters)),
        }
    }
}

/// A CORS filter with its header values joined once.
#[derive(Debug)]
pub struct CorsPolicy {
    any_origin: bool,
    /// Answer an allowed origin with itself, never "*".
    echo_origin: bool,
    /// "*" in the methods or headers: a preflight gets what it asked for.
    any_method: bool,
    any_header: bool,
    exact: Vec<Box<str>>,
    /// ("https://", ".example.com:8443") for "https://*.example.com:8443".
    wildcard: Vec<(Box<str>, Box<str>)>,
    pub allow_credentials: bool,
    pub allow_methods: Box<str>,
    pub allow_headers: Box<str>,
    pub expose_headers: Box<str>,
    /// Empty: no Access-Control-Max-Age.
    pub max_age: Box<str>,
}

impl CorsPolicy {
    pub fn new(c: &snap::Cors) -> Self {
        let mut exact = Vec::new();
        let mut wildcard = Vec::new();
        let mut any_origin = false;
        for o in &c.allow_origins {
            let o = o.to_ascii_lowercase();
            if o == "*" {
                any_origin = true;
            } else if let Some((scheme, suffix)) = o.split_once("://*") {
                wildcard.push((format!("{scheme}://").into(), suffix.into()));
            } else {
                exact.push(o.into());
            }
        }
        Self {
            any_origin,
            echo_origin: c.echo_origin,
            any_method: c.allow_methods.iter().any(|m| m == "*"),
            any_header: c.allow_headers.iter().any(|h| h == "*"),
            exact,
            wildcard,
            allow_credentials: c.allow_credentials,
            allow_methods: c.allow_methods.join(", ").into(),
            allow_headers: c.allow_headers.join(", ").into(),
            expose_headers: c.expose_headers.join(", ").into(),
            max_age: if c.max_age_seconds > 0 {
                c.max_age_seconds.to_string().into()
            } else {
                "".into()
            },
        }
    }

    /// The Access-Control-Allow-Origin value for a request's Origin, if it is allowed: the
    /// origin itself, or "*" when any origin is allowed without credentials (browsers reject
    /// "*" with credentials).
    pub fn allow_origin<'o>(&self, origin: &'o str) -> Option<&'o str> {
        if self.any_origin {
            return Some(if self.allow_credentials || self.echo_origin {
                origin
            } else {
                "*"
            });
        }
        let exact = self.exact.iter().any(|e| e.eq_ignore_ascii_case(origin));
        let wild = || {
            self.wildcard.iter().any(|(scheme, suffix)| {
                origin.len() > scheme.len() + suffix.len()
                    && origin
                        .get(..scheme.len())
                        .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
                    && origin
                        .get(origin.len() - suffix.len()..)
                        .is_some_and(|s| s.eq_ignore_ascii_case(suffix))
                    // Only host labels in between: no path or userinfo smuggled in.
                    && origin[scheme.len()..origin.len() - suffix.len()]
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            })
        };
        (exact || wild()).then_some(origin)
    }
}

/// How a field a policy adds joins the answer's: `Set` replaces the fields of its name, `Add`
/// goes beside them (Pingora's `insert_header` and `append_header`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldOp {
    Set,
    Add,
}

/// A field a route policy adds to an answer: name (lowercase), value, and how it joins.
pub type PolicyField = (Cow<'static, str>, String, FieldOp);

impl CorsPolicy {
    /// The fields the answer to a request (not a preflight) from `origin` gets, in the order
    /// both engines add them: none when the origin is not allowed.
    pub fn answer_fields(&self, origin: Option<&str>, out: &mut Vec<PolicyField>) {
        let Some(allowed) = origin.and_then(|o| self.allow_origin(o)) else {
            return;
        };
        let mut push = |name, value, op| out.push((Cow::Borrowed(name), value, op));
        push(
            "access-control-allow-origin",
            allowed.to_owned(),
            FieldOp::Set,
        );
        if allowed != "*" {
            push("vary", "Origin".to_owned(), FieldOp::Add);
        }
        if self.allow_credentials {
            push(
                "access-control-allow-credentials",
                "true".to_owned(),
                FieldOp::Set,
            );
        }
        if !self.expose_headers.is_empty() {
            push(
                "access-control-expose-headers",
                self.expose_headers.to_string(),
                FieldOp::Set,
            );
        }
    }

    /// The fields of the answer to a preflight (204, no body) from `origin` asking for
    /// `method` and `headers`: an answer's fields and what the preflight was asking about, or
    /// none for an origin not allowed, so the browser refuses the real request.
    pub fn preflight_fields(
        &self,
        origin: Option<&str>,
        method: Option<&str>,
        headers: Option<&str>,
    ) -> Vec<PolicyField> {
        let mut out = Vec::new();
        self.answer_fields(origin, &mut out);
        if out.is_empty() {
            return out;
        }
        let asked = [
            (
                "access-control-allow-methods",
                self.preflight_methods(method),
            ),
            (
                "access-control-allow-headers",
                self.preflight_headers(headers),
            ),
            ("access-control-max-age", &self.max_age),
        ];
        for (name, value) in asked {
            if !value.is_empty() {
                out.push((name.into(), value.to_owned(), FieldOp::Set));
            }
        }
        out
    }

    /// Access-Control-Allow-Methods for a preflight asking for `requested`: the configured
    /// list, or the requested method when the list allows any (a literal "*" does not cover
    /// credentialed requests in browsers).
    pub fn preflight_methods<'a>(&'a self, requested: Option<&'a str>) -> &'a str {
        match requested {
            Some(m) if self.any_method => m,
            _ => &self.allow_methods,
        }
    }

    /// Access-Control-Allow-Headers for a preflight asking for `requested`, likewise.
    pub fn preflight_headers<'a>(&'a self, requested: Option<&'a str>) -> &'a str {
        match requested {
            Some(h) if self.any_header => h,
            _ => &self.allow_headers,
        }
    }
}

/// A rewrite template: literal text and capture group references.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(Vec<Part>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(Box<str>),
    Group(usize),
}

impl Template {
    /// "$1".."$9" are groups; any other "$" is literal.
    pub fn parse(t: &str) -> Self {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = t.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '$'
                && let Some(d) = chars.peek().and_then(|d| d.to_digit(10)).filter(|d| *d > 0)
            {
                chars.next();
                if !literal.is_empty() {
                    parts.push(Part::Literal(std::mem::take(&mut literal).into()));
                }
                parts.push(Part::Group(d as usize));
                continue;
            }
            literal.push(c);
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal.into()));
        }
        Self(parts)
    }

    /// The new path and query: the template with `group(n)` filled in, then the request's
    /// query (after the template's own, if it has one), with a leading "/" guaranteed.
    pub fn render<'a>(
        &self,
        group: impl Fn(usize) -> Option<&'a str>,
        query: Option<&str>,
    ) -> String {
        let mut out = String::with_capacity(64);
        for p in &self.0 {
            match p {
                Part::Literal(l) => out.push_str(l),
                Part::Group(n) => out.push_str(group(*n).unwrap_or("")),
            }
        }
        if !out.starts_with('/') {
            out.insert(0, '/');
        }
        if let Some(q) = query.filter(|q| !q.is_empty()) {
            out.push(if out.contains('?') { '&' } else { '?' });
            out.push_str(q);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(a: &str, p: u32) -> snap::Cidr {
        snap::Cidr {
            address: a.into(),
            prefix_len: p,
        }
    }

    #[test]
    fn allowlists_match_v4_v6_and_mapped_addresses() {
        let list = AddressSet::new(&snap::ClientAllowlist {
            cidrs: vec![
                cidr("10.0.0.0", 8),
                cidr("192.168.1.7", 32),
                cidr("2001:db8::", 32),
                cidr("not an address", 0),
                cidr("10.0.0.0", 40),
            ],
        });
        let ok = |s: &str| list.allows(s.parse().unwrap());
        assert!(ok("10.255.0.1"));
        assert!(ok("192.168.1.7"));
        assert!(!ok("192.168.1.8"));
        assert!(ok("2001:db8:1::5"));
        assert!(!ok("2001:db9::1"));
        assert!(ok("::ffff:10.1.2.3"), "v4-mapped");
        assert!(!ok("127.0.0.1"), "broken entries allow nothing");
        let empty = AddressSet::new(&snap::ClientAllowlist::default());
        assert!(
            !empty.allows("127.0.0.1".parse().unwrap()),
            "empty denies all"
        );
        let all = AddressSet::new(&snap::ClientAllowlist {
            cidrs: vec![cidr("0.0.0.0", 0), cidr("::", 0)],
        });
        assert!(all.allows("8.8.8.8".parse().unwrap()));
        assert!(all.allows("::1".parse().unwrap()));
    }

    fn cors(origins: &[&str], credentials: bool) -> CorsPolicy {
        CorsPolicy::new(&snap::Cors {
            allow_origins: origins.iter().map(|o| (*o).to_owned()).collect(),
            allow_credentials: credentials,
            ..Default::default()
        })
    }

    #[test]
    fn cors_origins_exact_wildcard_and_any() {
        let c = cors(&["https://app.example", "https://*.example.com"], true);
        assert_eq!(
            c.allow_origin("https://App.Example"),
            Some("https://App.Example")
        );
        assert_eq!(
            c.allow_origin("https://a.b.example.com"),
            Some("https://a.b.example.com")
        );
        assert_eq!(
            c.allow_origin("https://example.com"),
            None,
            "needs a subdomain"
        );
        assert_eq!(
            c.allow_origin("http://a.example.com"),
            None,
            "scheme matters"
        );
        assert_eq!(
            c.allow_origin("https://a.example.com:8443"),
            None,
            "port matters"
        );
        assert_eq!(c.allow_origin("https://evil.com/.example.com"), None);
        assert_eq!(c.allow_origin("https://evilexample.com"), None);
        assert_eq!(cors(&["*"], false).allow_origin("https://x"), Some("*"));
        assert_eq!(
            cors(&["*"], true).allow_origin("https://x"),
            Some("https://x"),
            "credentials need the origin echoed"
        );
    }

    // Gateway API CORS: any origin is answered with the origin itself, and "*" methods and
    // headers echo what the preflight asked for.
    #[test]
    fn gateway_cors_echoes_origin_methods_and_headers() {
        let c = CorsPolicy::new(&snap::Cors {
            allow_origins: vec!["*".into()],
            allow_methods: vec!["*".into()],
            allow_headers: vec!["*".into()],
            echo_origin: true,
            ..Default::default()
        });
        assert_eq!(c.allow_origin("https://x:1"), Some("https://x:1"));
        assert_eq!(c.preflight_methods(Some("PUT")), "PUT");
        assert_eq!(c.preflight_headers(Some("x-a, x-b")), "x-a, x-b");
        assert_eq!(c.preflight_methods(None), "*");
        let listed = cors(&["https://a"], false);
        assert_eq!(listed.preflight_methods(Some("PUT")), "");
    }

    #[test]
    fn templates_fill_groups_and_keep_the_query() {
        let t = Template::parse("/$2/x$1$0$");
        let groups = ["all", "one", "two"];
        let g = |n: usize| groups.get(n).copied();
        assert_eq!(t.render(g, None), "/two/xone$0$");
        assert_eq!(Template::parse("$1").render(g, Some("a=1")), "/one?a=1");
        assert_eq!(
            Template::parse("/n?x=1").render(g, Some("a=1")),
            "/n?x=1&a=1"
        );
        assert_eq!(Template::parse("/$9").render(g, Some("")), "/");
    }
}
