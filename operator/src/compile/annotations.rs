//! Ingress annotations as typed values.
//!
//! Every `ingress.coxswain-labs.dev/` annotation is parsed here into plain data; nothing is
//! passed through to the proxy as text. With `ingress-nginx` compatibility on, the same parsers
//! read the `nginx.ingress.kubernetes.io/` equivalents, so an Ingress written for ingress-nginx
//! keeps its meaning. Snippets (raw NGINX configuration) are never used.
//!
//! Precedence, per annotation: the Ingress's own value, then the IngressClass's
//! `defaultAnnotations`, then the built-in default. Within one of those sources the Coxswain key
//! wins over its nginx equivalent. An invalid value is reported and ignored (the next source
//! applies), except for access control: an invalid or unsupported one denies every request of
//! the Ingress (`deny_all`) rather than open paths up.

pub use access::{AuthUrl, BasicAuth, ExternalAuth, RateKey, RateLimits, SecretFormat, SecretRef};

use super::status::AnnotationWarning;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

pub const PREFIX: &str = "ingress.coxswain-labs.dev/";
pub const NGINX_PREFIX: &str = "nginx.ingress.kubernetes.io/";

/// Our annotations (without prefix) and their ingress-nginx names, first match wins.
const KNOWN: &[(&str, &[&str])] = &[
    ("rewrite-target", &["rewrite-target"]),
    ("use-regex", &["use-regex"]),
    ("ssl-redirect", &["ssl-redirect"]),
    ("force-ssl-redirect", &["force-ssl-redirect"]),
    ("permanent-redirect", &["permanent-redirect"]),
    ("permanent-redirect-code", &["permanent-redirect-code"]),
    ("temporal-redirect", &["temporal-redirect"]),
    ("temporal-redirect-code", &["temporal-redirect-code"]),
    ("request-header-set", &[]),
    ("request-header-add", &[]),
    ("request-header-remove", &[]),
    ("response-header-set", &[]),
    ("response-header-add", &[]),
    ("response-header-remove", &[]),
    ("connect-timeout", &["proxy-connect-timeout"]),
    ("read-timeout", &["proxy-read-timeout"]),
    ("send-timeout", &["proxy-send-timeout"]),
    ("backend-protocol", &["backend-protocol"]),
    ("max-body-size", &["proxy-body-size"]),
    (
        "allowlist-source-range",
        &["allowlist-source-range", "whitelist-source-range"],
    ),
    ("enable-cors", &["enable-cors"]),
    ("cors-allow-origin", &["cors-allow-origin"]),
    ("cors-allow-methods", &["cors-allow-methods"]),
    ("cors-allow-headers", &["cors-allow-headers"]),
    ("cors-expose-headers", &["cors-expose-headers"]),
    ("cors-allow-credentials", &["cors-allow-credentials"]),
    ("cors-max-age", &["cors-max-age"]),
    ("canary", &["canary"]),
    ("canary-weight", &["canary-weight"]),
    ("canary-weight-total", &["canary-weight-total"]),
    ("canary-by-header", &["canary-by-header"]),
    ("canary-by-header-value", &["canary-by-header-value"]),
    ("access-log", &[]),
    ("retry-on", &["proxy-next-upstream"]),
    ("retry-tries", &["proxy-next-upstream-tries"]),
    ("retry-timeout", &["proxy-next-upstream-timeout"]),
    ("load-balance", &["load-balance"]),
    ("upstream-hash-by", &["upstream-hash-by"]),
    ("affinity", &["affinity"]),
    ("session-cookie-name", &["session-cookie-name"]),
    // ingress-nginx sets both Expires and Max-Age from these; Max-Age alone means the same.
    (
        "session-cookie-max-age",
        &["session-cookie-max-age", "session-cookie-expires"],
    ),
    ("session-cookie-path", &["session-cookie-path"]),
    ("auth-type", &["auth-type"]),
    ("auth-secret", &["auth-secret"]),
    ("auth-secret-type", &["auth-secret-type"]),
    ("auth-realm", &["auth-realm"]),
    ("auth-url", &["auth-url"]),
    ("auth-method", &["auth-method"]),
    ("auth-signin", &["auth-signin"]),
    ("auth-response-headers", &["auth-response-headers"]),
    ("rate-limit-rps", &["limit-rps"]),
    ("rate-limit-rpm", &["limit-rpm"]),
    ("rate-limit-connections", &["limit-connections"]),
    ("rate-limit-burst", &[]),
    ("rate-limit-burst-multiplier", &["limit-burst-multiplier"]),
    ("rate-limit-key", &[]),
    (
        "rate-limit-allowlist",
        &["limit-allowlist", "limit-whitelist"],
    ),
];

/// ingress-nginx's access-log switch: a boolean where ours accepts only "off".
const NGINX_ACCESS_LOG: &str = "enable-access-log";

/// ingress-nginx access control Coxswain does not implement (external auth, client
/// certificates, ...). Ignoring one would serve what ingress-nginx protected, so under
/// compatibility they deny instead.
fn nginx_access_control(name: &str) -> bool {
    let implemented = KNOWN.iter().any(|(_, aliases)| aliases.contains(&name));
    !implemented
        && ((name.starts_with("auth-") && !is_snippet(name)) || name == "denylist-source-range")
}

fn is_snippet(name: &str) -> bool {
    name.ends_with("-snippet") || name == "snippet"
}

/// ingress-nginx's CORS defaults, which Coxswain keeps so a migrated Ingress answers the same.
pub const DEFAULT_CORS_METHODS: &[&str] = &["GET", "PUT", "POST", "DELETE", "PATCH", "OPTIONS"];
pub const DEFAULT_CORS_HEADERS: &[&str] = &[
    "DNT",
    "Keep-Alive",
    "User-Agent",
    "X-Requested-With",
    "If-Modified-Since",
    "Cache-Control",
    "Content-Type",
    "Range",
    "Authorization",
];
pub const DEFAULT_CORS_MAX_AGE: Duration = Duration::from_secs(1_728_000);
pub const DEFAULT_PERMANENT_CODE: u16 = 301;
pub const DEFAULT_TEMPORAL_CODE: u16 = 302;
pub const DEFAULT_CANARY_TOTAL: u32 = 100;
/// Longest accepted timeout: anything longer is almost certainly a unit mistake.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// ingress-nginx's affinity cookie name.
pub const DEFAULT_SESSION_COOKIE: &str = "INGRESSCOOKIE";

/// An Ingress's annotations, typed. `Default` is "no annotations": the built-in defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngressAnnotations {
    /// The path sent upstream; `$1`..`$9` are the capture groups of a regex path.
    pub rewrite_target: Option<RewriteTarget>,
    /// ImplementationSpecific paths are (case-insensitive, start-anchored) regular expressions.
    pub use_regex: bool,
    /// None: not set anywhere; the compiler applies its built-in default.
    pub ssl_redirect: Option<bool>,
    pub force_ssl_redirect: bool,
    pub redirect: Option<Redirect>,
    pub request_headers: HeaderEdits,
    pub response_headers: HeaderEdits,
    pub connect_timeout: Option<Duration>,
    pub read_timeout: Option<Duration>,
    pub send_timeout: Option<Duration>,
    pub backend_protocol: Option<BackendProtocol>,
    /// Largest request body in bytes; None or 0: no limit.
    pub max_body_size: Option<u64>,
    /// Client addresses allowed; None: everyone.
    pub allowlist: Option<Vec<Cidr>>,
    /// Some when enable-cors is true.
    pub cors: Option<Cors>,
    /// Some when canary is true: this Ingress takes a share of another's traffic.
    pub canary: Option<Canary>,
    pub access_log: bool,
    /// Answers retried on another endpoint (retry-on, retry-tries).
    pub retry: Option<Retry>,
    /// How the Services this Ingress sends to pick an endpoint (load-balance,
    /// upstream-hash-by); None: not set, the Service's policy or round robin applies.
    pub load_balance: Option<LoadBalance>,
    /// Some with affinity: cookie.
    pub affinity: Option<CookieAffinity>,
    /// auth-type: basic, with its Secret (resolved by the Ingress compiler).
    pub basic_auth: Option<access::BasicAuth>,
    /// auth-url and its companions: an authorization service asked before each request.
    pub external_auth: Option<access::ExternalAuth>,
    /// limit-rps, limit-rpm, limit-connections.
    pub rate_limits: Option<access::RateLimits>,
    /// An access-control annotation was invalid or is unsupported: every path answers 403.
    pub deny_all: bool,
}

impl Default for IngressAnnotations {
    fn default() -> Self {
        Self {
            rewrite_target: None,
            use_regex: false,
            ssl_redirect: None,
            force_ssl_redirect: false,
            redirect: None,
            request_headers: HeaderEdits::default(),
            response_headers: HeaderEdits::default(),
            connect_timeout: None,
            read_timeout: None,
            send_timeout: None,
            backend_protocol: None,
            max_body_size: None,
            allowlist: None,
            cors: None,
            canary: None,
            access_log: true,
            retry: None,
            load_balance: None,
            affinity: None,
            basic_auth: None,
            external_auth: None,
            rate_limits: None,
            deny_all: false,
        }
    }
}

impl IngressAnnotations {
    /// Whether ImplementationSpecific paths are regular expressions: use-regex, or a
    /// rewrite-target (ingress-nginx enforces regex paths whenever rewrite-target is set).
    pub fn regex_paths(&self) -> bool {
        self.use_regex || self.rewrite_target.is_some()
    }
}

/// A rewrite target, checked: starts with "/" or a capture group, no spaces or controls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RewriteTarget(pub String);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// Absolute http(s) URL or absolute path, sent as the Location unchanged.
    pub location: String,
    pub code: u16,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderEdits {
    pub set: Vec<(String, String)>,
    pub add: Vec<(String, String)>,
    /// Lower-case names.
    pub remove: Vec<String>,
}

impl HeaderEdits {
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendProtocol {
    Http,
    Https,
    H2c,
    Grpc,
    Grpcs,
}

/// An address block. Host bits are cleared when parsed ("10.0.0.7/8" is 10.0.0.0/8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cors {
    /// "*" or origins ("https://a.example", "https://*.example.com", with optional port).
    pub allow_origins: Vec<String>,
    pub allow_methods: Vec<String>,
    pub allow_headers: Vec<String>,
    pub expose_headers: Vec<String>,
    pub allow_credentials: bool,
    pub max_age: Duration,
}

/// What `retry-on` (ingress-nginx's `proxy-next-upstream`) lists, and `retry-tries`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// From `http_NNN` conditions, ascending.
    pub codes: Vec<u16>,
    /// `non_idempotent`: POST, PATCH and the like are retried too.
    pub non_idempotent: bool,
    /// Tries in all, the first included (ingress-nginx's meaning); 0: as many as allowed.
    pub tries: u32,
    /// retry-timeout: no retry starts later than this after the request arrived.
    pub timeout: Option<Duration>,
}

/// An endpoint-choosing algorithm asked for by annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadBalance {
    RoundRobin,
    /// `ewma` under ingress-nginx: the nearest algorithm the proxy has.
    LeastRequest,
    /// upstream-hash-by: a hash ring on this key.
    Hash(HashKey),
}

/// What upstream-hash-by hashes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKey {
    ClientAddress,
    /// A lower-case header name.
    Header(String),
    Cookie(String),
}

/// affinity: cookie. The proxy names the endpoint in this cookie and sends the client back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CookieAffinity {
    pub name: String,
    /// Seconds; None: a session cookie.
    pub max_age: Option<u64>,
    /// None: "/".
    pub path: Option<String>,
}

/// ingress-nginx's default for proxy-next-upstream-tries.
pub const DEFAULT_RETRY_TRIES: u32 = 3;
/// Most tries a request gets (0, "unlimited" for ingress-nginx, means this).
pub const MAX_RETRY_TRIES: u32 = 11;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canary {
    /// Share of traffic: weight out of total.
    pub weight: u32,
    pub total: u32,
    /// Requests whose header is "always" go to the canary, "never" to the primary.
    pub by_header: Option<String>,
    /// With by_header: this value (instead of "always") sends a request to the canary.
    pub by_header_value: Option<String>,
}

/// Parses an Ingress's annotations over its class's defaults. `compat` reads ingress-nginx's
/// annotations too. Returns the typed values and one warning per refused or ignored annotation.
pub fn parse(
    own: &BTreeMap<String, String>,
    class_defaults: &BTreeMap<String, String>,
    compat: bool,
) -> (IngressAnnotations, Vec<AnnotationWarning>) {
    let mut r = Reader {
        layers: [(own, false), (class_defaults, true)],
        compat,
        warnings: Vec::new(),
    };
    r.check_keys();
    let mut a = IngressAnnotations {
        rewrite_target: r.get("rewrite-target", parse_rewrite_target),
        use_regex: r.get("use-regex", parse_bool).unwrap_or(false),
        ssl_redirect: r.get("ssl-redirect", parse_bool),
        force_ssl_redirect: r.get("force-ssl-redirect", parse_bool).unwrap_or(false),
        ..Default::default()
    };

    let permanent = r.get("permanent-redirect", parse_location);
    let temporal = r.get("temporal-redirect", parse_location);
    a.redirect = match (permanent, temporal) {
        (Some(location), other) => {
            if other.is_some() {
                r.note(
                    "temporal-redirect",
                    "permanent-redirect is set too and wins; ignored",
                );
            }
            let code = r
                .get("permanent-redirect-code", parse_redirect_code)
                .unwrap_or(DEFAULT_PERMANENT_CODE);
            Some(Redirect { location, code })
        }
        (None, Some(location)) => {
            let code = r
                .get("temporal-redirect-code", parse_redirect_code)
                .unwrap_or(DEFAULT_TEMPORAL_CODE);
            Some(Redirect { location, code })
        }
        (None, None) => None,
    };

    a.request_headers = HeaderEdits {
        set: r
            .get("request-header-set", parse_header_lines)
            .unwrap_or_default(),
        add: r
            .get("request-header-add", parse_header_lines)
            .unwrap_or_default(),
        remove: r
            .get("request-header-remove", parse_header_names)
            .unwrap_or_default(),
    };
    a.response_headers = HeaderEdits {
        set: r
            .get("response-header-set", parse_header_lines)
            .unwrap_or_default(),
        add: r
            .get("response-header-add", parse_header_lines)
            .unwrap_or_default(),
        remove: r
            .get("response-header-remove", parse_header_names)
            .unwrap_or_default(),
    };

    a.connect_timeout = r.get("connect-timeout", parse_timeout);
    a.read_timeout = r.get("read-timeout", parse_timeout);
    a.send_timeout = r.get("send-timeout", parse_timeout);
    a.backend_protocol = r.get("backend-protocol", parse_backend_protocol);
    a.max_body_size = r.get("max-body-size", parse_size);

    match r.get_or_deny("allowlist-source-range", parse_cidrs) {
        Access::Unset => {}
        Access::Allow(list) => a.allowlist = Some(list),
        Access::Deny => a.deny_all = true,
    }
    match access::basic_auth(&mut r) {
        Access::Unset => {}
        Access::Allow(auth) => a.basic_auth = Some(auth),
        Access::Deny => a.deny_all = true,
    }
    match access::external_auth(&mut r) {
        Access::Unset => {}
        Access::Allow(auth) => a.external_auth = Some(auth),
        Access::Deny => a.deny_all = true,
    }
    a.rate_limits = access::rate_limits(&mut r);

    if r.get("enable-cors", parse_bool).unwrap_or(false) {
        a.cors = Some(Cors {
            allow_origins: r
                .get("cors-allow-origin", parse_origins)
                .unwrap_or_else(|| vec!["*".into()]),
            allow_methods: r
                .get("cors-allow-methods", parse_methods)
                .unwrap_or_else(|| owned(DEFAULT_CORS_METHODS)),
            allow_headers: r
                .get("cors-allow-headers", parse_cors_headers)
                .unwrap_or_else(|| owned(DEFAULT_CORS_HEADERS)),
            expose_headers: r
                .get("cors-expose-headers", parse_cors_headers)
                .unwrap_or_default(),
            allow_credentials: r.get("cors-allow-credentials", parse_bool).unwrap_or(true),
            max_age: r
                .get("cors-max-age", parse_max_age)
                .unwrap_or(DEFAULT_CORS_MAX_AGE),
        });
    }

    if r.get("canary", parse_bool).unwrap_or(false) {
        let total = r
            .get("canary-weight-total", parse_canary_total)
            .unwrap_or(DEFAULT_CANARY_TOTAL);
        let weight = r
            .get("canary-weight", |v| parse_canary_weight(v, total))
            .unwrap_or(0);
        let by_header = r.get("canary-by-header", parse_header_name);
        let by_header_value = r.get("canary-by-header-value", parse_header_value);
        a.canary = Some(Canary {
            weight,
            total,
            by_header,
            by_header_value,
        });
    }

    if let Some((codes, non_idempotent)) = r.get("retry-on", parse_retry_on) {
        let tries = r
            .get("retry-tries", parse_retry_tries)
            .unwrap_or(DEFAULT_RETRY_TRIES);
        let timeout = r.get("retry-timeout", parse_retry_timeout).flatten();
        a.retry = (!codes.is_empty() || non_idempotent).then_some(Retry {
            codes,
            non_idempotent,
            tries,
            timeout,
        });
    } else {
        // Tries or a time bound alone change nothing: refused connections are retried up to 3
        // tries anyway, and at once.
        let tries = r.get("retry-tries", parse_retry_tries).is_some();
        let timeout = r.get("retry-timeout", parse_retry_timeout).is_some();
        for (name, given) in [("retry-tries", tries), ("retry-timeout", timeout)] {
            if given {
                r.note(
                    name,
                    "has no effect without retry-on listing http_NNN codes or non_idempotent",
                );
            }
        }
    }

    let hash = r.get("upstream-hash-by", parse_hash_by);
    let algorithm = r.get("load-balance", parse_load_balance);
    a.load_balance = match (hash, algorithm) {
        (Some(key), other) => {
            if other.is_some() {
                // ingress-nginx does the same: a hash replaces the balancing algorithm.
                r.note(
                    "load-balance",
                    "upstream-hash-by is set too and wins; ignored",
                );
            }
            Some(LoadBalance::Hash(key))
        }
        (None, other) => other,
    };

    if r.get("affinity", parse_affinity).is_some() {
        a.affinity = Some(CookieAffinity {
            name: r
                .get("session-cookie-name", parse_cookie_name)
                .unwrap_or_else(|| DEFAULT_SESSION_COOKIE.to_owned()),
            max_age: r.get("session-cookie-max-age", parse_cookie_max_age),
            path: r.get("session-cookie-path", parse_cookie_path),
        });
    } else {
        for name in [
            "session-cookie-name",
            "session-cookie-max-age",
            "session-cookie-path",
        ] {
            r.note(name, "has no effect without affinity: cookie");
        }
    }

    a.access_log = r.get("access-log", parse_access_log).unwrap_or(true);
    if a.access_log && r.compat {
        a.access_log = r
            .get_nginx_only(NGINX_ACCESS_LOG, parse_bool)
            .unwrap_or(true);
    }

    a.deny_all |= r.warnings.iter().any(|w| w.fail_closed);
    (a, r.warnings)
}

fn owned(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// One value found for an annotation.
struct Candidate<'a> {
    key: String,
    value: &'a str,
    from_class: bool,
}

enum Access<T> {
    Unset,
    Allow(T),
    Deny,
}

struct Reader<'a> {
    /// Highest precedence first; the flag says "from the class defaults".
    layers: [(&'a BTreeMap<String, String>, bool); 2],
    compat: bool,
    warnings: Vec<AnnotationWarning>,
}

impl<'a> Reader<'a> {
    /// Values for an annotation, highest precedence first: per source, our key, else (compat)
    /// the first ingress-nginx name present.
    fn candidates(&self, name: &str) -> Vec<Candidate<'a>> {
        let aliases = KNOWN
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(&[][..], |(_, a)| *a);
        let mut out = Vec::new();
        for (map, from_class) in self.layers {
            let ours = format!("{PREFIX}{name}");
            if let Some(v) = map.get(&ours) {
                out.push(Candidate {
                    key: ours,
                    value: v,
                    from_class,
                });
                continue;
            }
            if !self.compat {
                continue;
            }
            for alias in aliases {
                let key = format!("{NGINX_PREFIX}{alias}");
                if let Some(v) = map.get(&key) {
                    out.push(Candidate {
                        key,
                        value: v,
                        from_class,
                    });
                    break;
                }
            }
        }
        out
    }

    /// The first value that parses. Values that do not are reported and ignored.
    fn get<T>(&mut self, name: &str, parse: impl Fn(&str) -> Result<T, String>) -> Option<T> {
        for c in self.candidates(name) {
            match parse(c.value) {
                Ok(v) => return Some(v),
                Err(reason) => self.refuse(&c, &reason, false),
            }
        }
        None
    }

    /// Access control: the highest-precedence value decides; an invalid one denies.
    fn get_or_deny<T>(
        &mut self,
        name: &str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Access<T> {
        let Some(c) = self.candidates(name).into_iter().next() else {
            return Access::Unset;
        };
        match parse(c.value) {
            Ok(v) => Access::Allow(v),
            Err(reason) => {
                self.refuse(&c, &reason, true);
                Access::Deny
            }
        }
    }

    /// An ingress-nginx annotation with no Coxswain key of the same meaning.
    fn get_nginx_only<T>(
        &mut self,
        name: &str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Option<T> {
        let key = format!("{NGINX_PREFIX}{name}");
        for (map, from_class) in self.layers {
            if let Some(v) = map.get(&key) {
                let c = Candidate {
                    key: key.clone(),
                    value: v,
                    from_class,
                };
                match parse(v) {
                    Ok(v) => return Some(v),
                    Err(reason) => self.refuse(&c, &reason, false),
                }
            }
        }
        None
    }

    fn refuse(&mut self, c: &Candidate<'_>, reason: &str, fail_closed: bool) {
        let source = if c.from_class {
            " (IngressClass default)"
        } else {
            ""
        };
        let outcome = if fail_closed {
            "every path of the Ingress answers 403 until it is fixed"
        } else {
            "ignored"
        };
        self.warnings.push(AnnotationWarning {
            annotation: c.key.clone(),
            reason: format!("invalid value {:?}{source}: {reason}; {outcome}", c.value),
            fail_closed,
        });
    }

    /// Access control that cannot be honoured: every path denies.
    fn deny(&mut self, name: &str, reason: &str) {
        if let Some(c) = self.candidates(name).into_iter().next() {
            self.warnings.push(AnnotationWarning {
                annotation: c.key,
                reason: reason.into(),
                fail_closed: true,
            });
        }
    }

    /// A warning about a value that is valid but not used.
    fn note(&mut self, name: &str, reason: &str) {
        if let Some(c) = self.candidates(name).into_iter().next() {
            self.warnings.push(AnnotationWarning {
                annotation: c.key,
                reason: reason.into(),
                fail_closed: false,
            });
        }
    }

    /// Keys that are not annotations we read: snippets, unknown names under our prefix, and
    /// (with compat) ingress-nginx annotations Coxswain has no equivalent for.
    fn check_keys(&mut self) {
        let layers = self.layers;
        let keys: BTreeSet<&'a String> = layers.iter().flat_map(|(m, _)| m.keys()).collect();
        for key in keys {
            let warning = if let Some(name) = key.strip_prefix(PREFIX) {
                if is_snippet(name) {
                    Some(snippet_warning(key))
                } else if !KNOWN.iter().any(|(n, _)| *n == name) {
                    Some((
                        "unknown Coxswain annotation; ignored (see docs/ingress-annotations.md)"
                            .to_owned(),
                        false,
                    ))
                } else {
                    None
                }
            } else if let Some(name) = key.strip_prefix(NGINX_PREFIX) {
                if is_snippet(name) {
                    Some(snippet_warning(key))
                } else if !self.compat {
                    None
                } else if nginx_access_control(name) {
                    Some((
                        "ingress-nginx access control Coxswain does not implement; every path \
                         of the Ingress answers 403 rather than serve without it"
                            .to_owned(),
                        true,
                    ))
                } else if let Some((ours, _)) =
                    KNOWN.iter().find(|(_, aliases)| aliases.contains(&name))
                {
                    layers
                        .iter()
                        .any(|(m, _)| {
                            m.contains_key(key) && m.contains_key(&format!("{PREFIX}{ours}"))
                        })
                        .then(|| {
                            (
                                format!("{PREFIX}{ours} is set too and wins; ignored"),
                                false,
                            )
                        })
                } else if name == NGINX_ACCESS_LOG {
                    None
                } else {
                    Some((
                        "ingress-nginx annotation Coxswain has no equivalent for; ignored"
                            .to_owned(),
                        false,
                    ))
                }
            } else {
                None
            };
            if let Some((reason, fail_closed)) = warning {
                self.warnings.push(AnnotationWarning {
                    annotation: key.clone(),
                    reason,
                    fail_closed,
                });
            }
        }
    }
}

fn snippet_warning(key: &str) -> (String, bool) {
    (
        format!(
            "{key} is raw NGINX configuration and is never used; use typed annotations \
             instead: {PREFIX}request-header-set / response-header-set for headers, \
             rewrite-target for rewrites, permanent-redirect / temporal-redirect for \
             redirects, allowlist-source-range for access, or an HTTPRoute"
        ),
        false,
    )
}

mod values;
pub use values::*;

mod access;

#[cfg(test)]
mod tests;
