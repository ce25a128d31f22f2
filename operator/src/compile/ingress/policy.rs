//! An Ingress's annotations as route fields: filters, timeouts, retries, access control and
//! limits, built once per Ingress and applied to each of its routes.

use super::super::annotations::{self, BackendProtocol, IngressAnnotations};
use super::super::htpasswd;
use super::super::refs::Index;
use super::super::status::{AnnotationWarning, IngressStatus, ObjectKey};
use coxswain_api::snapshot as snap;

/// An Ingress's annotations as route fields, built once per Ingress.
pub(super) struct RoutePolicy {
    filters: Vec<snap::Filter>,
    redirect: Option<snap::Filter>,
    timeouts: Option<snap::Timeouts>,
    allowlist: Option<snap::ClientAllowlist>,
    max_body: u64,
    upstream_protocol: snap::UpstreamProtocol,
    access_log_off: bool,
    retry: Option<snap::Retry>,
    session_persistence: Option<snap::SessionPersistence>,
    rate_limits: Vec<snap::RateLimit>,
    basic_auth: Option<snap::BasicAuth>,
    external_auth: Option<snap::ExternalAuth>,
    /// auth-type: basic whose Secret cannot be used: every path answers 503 (fail closed).
    auth_unavailable: bool,
    deny_all: bool,
}

impl RoutePolicy {
    pub(super) fn new(
        a: &IngressAnnotations,
        class_access_log_off: bool,
        key: &ObjectKey,
        index: &Index<'_>,
        clusters: &mut Vec<snap::Cluster>,
        status: &mut IngressStatus,
    ) -> Self {
        use snap::filter::Kind;
        let modifier = |e: &annotations::HeaderEdits| snap::HeaderModifier {
            set: e
                .set
                .iter()
                .map(|(name, value)| snap::Header {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect(),
            add: e
                .add
                .iter()
                .map(|(name, value)| snap::Header {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect(),
            remove: e.remove.clone(),
        };
        let mut filters = Vec::new();
        if !a.request_headers.is_empty() {
            filters.push(Kind::RequestHeaderModifier(modifier(&a.request_headers)));
        }
        if !a.response_headers.is_empty() {
            filters.push(Kind::ResponseHeaderModifier(modifier(&a.response_headers)));
        }
        if let Some(t) = &a.rewrite_target {
            filters.push(Kind::UrlRewrite(snap::UrlRewrite {
                hostname: String::new(),
                path: Some(snap::PathModifier {
                    kind: Some(snap::path_modifier::Kind::ReplaceRegexMatch(t.0.clone())),
                }),
            }));
        }
        if let Some(c) = &a.cors {
            filters.push(Kind::Cors(snap::Cors {
                allow_origins: c.allow_origins.clone(),
                allow_methods: c.allow_methods.clone(),
                allow_headers: c.allow_headers.clone(),
                expose_headers: c.expose_headers.clone(),
                allow_credentials: c.allow_credentials,
                max_age_seconds: c.max_age.as_secs(),
                // ingress-nginx answers "*" when any origin is allowed without credentials.
                echo_origin: false,
            }));
        }
        let ms = |d: Option<std::time::Duration>| {
            d.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        };
        let timeouts =
            (a.connect_timeout.is_some() || a.read_timeout.is_some() || a.send_timeout.is_some())
                .then(|| snap::Timeouts {
                    connect_ms: ms(a.connect_timeout),
                    read_ms: ms(a.read_timeout),
                    send_ms: ms(a.send_timeout),
                    ..Default::default()
                });
        let (basic_auth, auth_unavailable) = match &a.basic_auth {
            None => (None, false),
            Some(auth) => match basic_auth_users(auth, key, index, status) {
                Ok(users) => (
                    Some(snap::BasicAuth {
                        realm: auth.realm.clone(),
                        users,
                    }),
                    false,
                ),
                Err(problem) => {
                    status.problems.push(format!(
                        "{problem}; every path of the Ingress answers 503 until it is fixed"
                    ));
                    (None, true)
                }
            },
        };
        Self {
            filters: filters
                .into_iter()
                .map(|k| snap::Filter { kind: Some(k) })
                .collect(),
            redirect: a.redirect.as_ref().map(|r| snap::Filter {
                kind: Some(Kind::RequestRedirect(snap::RequestRedirect {
                    location: r.location.clone(),
                    status_code: u32::from(r.code),
                    ..Default::default()
                })),
            }),
            timeouts,
            allowlist: a.allowlist.as_ref().map(|list| snap::ClientAllowlist {
                cidrs: list
                    .iter()
                    .map(|c| snap::Cidr {
                        address: c.addr.to_string(),
                        prefix_len: u32::from(c.prefix),
                    })
                    .collect(),
            }),
            max_body: a.max_body_size.unwrap_or(0),
            upstream_protocol: match a.backend_protocol {
                None => snap::UpstreamProtocol::Unspecified,
                Some(BackendProtocol::Http) => snap::UpstreamProtocol::Http1,
                Some(BackendProtocol::H2c | BackendProtocol::Grpc) => snap::UpstreamProtocol::H2c,
                Some(BackendProtocol::Https) => snap::UpstreamProtocol::Tls,
                Some(BackendProtocol::Grpcs) => snap::UpstreamProtocol::TlsH2,
            },
            access_log_off: class_access_log_off || !a.access_log,
            retry: a.retry.as_ref().map(|r| snap::Retry {
                codes: r.codes.iter().map(|c| u32::from(*c)).collect(),
                attempts: r.tries.saturating_sub(1),
                backoff_ms: 0,
                non_idempotent: r.non_idempotent,
                timeout_ms: r
                    .timeout
                    .map_or(0, |t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            }),
            session_persistence: a.affinity.as_ref().map(|c| snap::SessionPersistence {
                kind: snap::session_persistence::Kind::Cookie as i32,
                name: c.name.clone(),
                max_age_s: c.max_age.unwrap_or(0),
                path: c.path.clone().unwrap_or_default(),
            }),
            rate_limits: a
                .rate_limits
                .as_ref()
                .map(|l| rate_limits(l, key))
                .unwrap_or_default(),
            basic_auth,
            external_auth: a
                .external_auth
                .as_ref()
                .map(|e| external_auth(e, index, clusters)),
            auth_unavailable,
            deny_all: a.deny_all,
        }
    }

    /// Fills a route: access denied, then the HTTPS redirect (HTTP port only), then a fixed
    /// redirect, then an invalid backend's status, else forwarding with every policy.
    pub(super) fn apply(
        &self,
        route: &mut snap::Route,
        https_redirect: bool,
        backends: Vec<snap::WeightedBackend>,
        direct_status: u32,
    ) {
        route.access_log_off = self.access_log_off;
        if self.deny_all {
            route.direct_status = 403;
            return;
        }
        if self.auth_unavailable {
            route.direct_status = 503;
            return;
        }
        route.client_allowlist = self.allowlist.clone();
        if https_redirect {
            route.filters = vec![snap::Filter {
                kind: Some(snap::filter::Kind::RequestRedirect(snap::RequestRedirect {
                    scheme: "https".into(),
                    status_code: 308,
                    ..Default::default()
                })),
            }];
            return;
        }
        if let Some(r) = &self.redirect {
            route.filters = vec![r.clone()];
            return;
        }
        if direct_status != 0 {
            route.direct_status = direct_status;
            return;
        }
        route.filters = self.filters.clone();
        route.backends = backends;
        route.timeouts = self.timeouts;
        route.max_request_body_bytes = self.max_body;
        route.upstream_protocol = self.upstream_protocol as i32;
        route.retry = self.retry.clone();
        route.session_persistence = self.session_persistence.clone();
        // Only on forwarding routes, as in ingress-nginx, where redirects answer before its
        // access phase: an HTTP route that redirects to HTTPS never asks for a password in
        // clear.
        route.rate_limits = self.rate_limits.clone();
        route.basic_auth = self.basic_auth.clone();
        route.external_auth = self.external_auth.clone();
    }
}

/// What nginx answers when its auth subrequest fails (unreachable, 5xx, other statuses).
pub const EXTERNAL_AUTH_FAILURE_STATUS: u32 = 500;

/// auth-url as ingress-nginx's auth_request does it: GET (or auth-method) to the URL with every
/// field of the request and X-Original-*, no body; 2xx allows, 401 and 403 go back to the
/// client, anything else is a 500. An in-cluster Service name is sent to the Service's
/// endpoints (no DNS on the proxy) unless TLS would go unverified: https to a Service is only
/// sent that way when a BackendTLSPolicy says how to verify it; otherwise the proxy resolves
/// the name and verifies against its system CAs.
fn external_auth(
    e: &annotations::ExternalAuth,
    index: &Index<'_>,
    clusters: &mut Vec<snap::Cluster>,
) -> snap::ExternalAuth {
    let cluster = e
        .url
        .service()
        .and_then(|(namespace, name)| index.cluster(namespace, name, i32::from(e.url.port)))
        .filter(|c| !e.url.tls || c.tls.is_some())
        .map(|c| {
            let name = c.name.clone();
            clusters.push(c);
            name
        });
    let mut response_fields = e.response_headers.clone();
    response_fields.sort();
    response_fields.dedup();
    snap::ExternalAuth {
        protocol: snap::external_auth::Protocol::Http as i32,
        address: if cluster.is_none() {
            e.url.address()
        } else {
            String::new()
        },
        cluster: cluster.unwrap_or_default(),
        tls_hostname: if e.url.tls {
            e.url.host.clone()
        } else {
            String::new()
        },
        path: e.url.path_and_query.clone(),
        path_is_prefix: false,
        method: e.method.clone().unwrap_or_else(|| "GET".into()),
        host: e.url.authority(),
        request_fields: Vec::new(),
        all_request_fields: true,
        response_fields,
        all_response_fields: false,
        deny_401_403_only: true,
        original_fields: true,
        signin_url: e.signin.clone().unwrap_or_default(),
        failure_status: EXTERNAL_AUTH_FAILURE_STATUS,
        timeout_ms: 0,
    }
}

/// The limits of an Ingress: one per rate and one for requests in progress, shared by every
/// path of the Ingress (ids per Ingress, as ingress-nginx keeps a zone per Ingress).
fn rate_limits(l: &annotations::RateLimits, key: &ObjectKey) -> Vec<snap::RateLimit> {
    let (key_kind, header) = match &l.key {
        annotations::RateKey::ClientAddress => (snap::rate_limit::Key::ClientAddress, ""),
        annotations::RateKey::Header(h) => (snap::rate_limit::Key::Header, h.as_str()),
        annotations::RateKey::Route => (snap::rate_limit::Key::Route, ""),
    };
    let exempt: Vec<snap::Cidr> = l
        .exempt
        .iter()
        .map(|c| snap::Cidr {
            address: c.addr.to_string(),
            prefix_len: u32::from(c.prefix),
        })
        .collect();
    let limit = |what: &str| snap::RateLimit {
        id: format!("Ingress/{}/{}/{what}", key.namespace, key.name),
        key: key_kind as i32,
        header: header.to_owned(),
        exempt: exempt.clone(),
        ..Default::default()
    };
    let mut out = Vec::new();
    if l.connections > 0 {
        out.push(snap::RateLimit {
            max_in_flight: l.connections,
            ..limit("connections")
        });
    }
    for (what, rate, period_ms) in [("rpm", l.per_minute, 60_000), ("rps", l.per_second, 1_000)] {
        if rate > 0 {
            out.push(snap::RateLimit {
                requests: rate,
                period_ms,
                burst: l.burst_for(rate),
                ..limit(what)
            });
        }
    }
    out
}

/// The htpasswd lines of an Ingress's Basic-auth Secret, sorted by user; lines the proxy
/// could not check are left out with a warning each. Err: why no user can get in.
fn basic_auth_users(
    auth: &annotations::BasicAuth,
    key: &ObjectKey,
    index: &Index<'_>,
    status: &mut IngressStatus,
) -> Result<Vec<String>, String> {
    if let Some(ns) = auth
        .secret
        .namespace
        .as_deref()
        .filter(|ns| *ns != key.namespace)
    {
        return Err(format!(
            "auth-secret names a Secret in namespace {ns:?}: only Secrets in the Ingress's own \
             namespace are read"
        ));
    }
    let name = &auth.secret.name;
    let secret = index
        .secret(&key.namespace, name)
        .ok_or_else(|| format!("Basic-auth Secret {}/{name} not found", key.namespace))?;
    let format = match auth.format {
        annotations::SecretFormat::AuthFile => htpasswd::Format::File,
        annotations::SecretFormat::AuthMap => htpasswd::Format::Map,
    };
    let what = format!("Basic-auth Secret {}/{name}", key.namespace);
    let users = htpasswd::users(secret, format, &what)?;
    for e in users.refused {
        status.warnings.push(AnnotationWarning {
            annotation: format!("{}auth-secret", annotations::PREFIX),
            // The error names the line, the user and the format, never the hash.
            reason: format!("{what}: {e}; that user cannot sign in"),
            fail_closed: false,
        });
    }
    Ok(users.lines)
}
