//! HTTPRoute filters, of a rule or of a backendRef, to snapshot filters.

use super::backend::Referrer;
use super::route::{header_modifier_as, request_mirror_as};
use super::status::{Problem, reason};
use coxswain_api::snapshot::{self as snap, Filter, filter};
use gateway_api::apis::experimental::httproutes::{
    self as http, HttpRouteRulesFilters, HttpRouteRulesFiltersExternalAuth,
    HttpRouteRulesFiltersExternalAuthProtocol, HttpRouteRulesFiltersRequestRedirectScheme,
};

/// One filter of a rule or of a backendRef. A mirror's backend that does not resolve leaves
/// its verdict in `resolved` (the first one wins) and mirrors nowhere.
pub(super) fn compile_filter(
    from: &Referrer<'_>,
    f: &HttpRouteRulesFilters,
    clusters: &mut Vec<snap::Cluster>,
    resolved: &mut Result<(), Problem>,
) -> Result<Filter, Problem> {
    let kind = if let Some(m) = &f.request_header_modifier {
        filter::Kind::RequestHeaderModifier(header_modifier(
            m.set.iter().flatten().map(|h| (&h.name, &h.value)),
            m.add.iter().flatten().map(|h| (&h.name, &h.value)),
            &m.remove,
        ))
    } else if let Some(m) = &f.response_header_modifier {
        filter::Kind::ResponseHeaderModifier(header_modifier(
            m.set.iter().flatten().map(|h| (&h.name, &h.value)),
            m.add.iter().flatten().map(|h| (&h.name, &h.value)),
            &m.remove,
        ))
    } else if let Some(r) = &f.request_redirect {
        let path = match &r.path {
            None => None,
            Some(p) => Some(path_modifier(
                p.replace_full_path.clone(),
                p.replace_prefix_match.clone(),
            )?),
        };
        let scheme = match r.scheme {
            None => "",
            Some(HttpRouteRulesFiltersRequestRedirectScheme::Http) => "http",
            Some(HttpRouteRulesFiltersRequestRedirectScheme::Https) => "https",
        };
        filter::Kind::RequestRedirect(snap::RequestRedirect {
            scheme: scheme.to_owned(),
            hostname: r.hostname.clone().unwrap_or_default(),
            path,
            port: r.port.and_then(|p| u32::try_from(p).ok()).unwrap_or(0),
            status_code: match r.status_code {
                None => 302,
                Some(c @ (301 | 302 | 303 | 307 | 308)) => c as u32,
                Some(c) => {
                    return Err(Problem::new(
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
        let cluster = match from.resolve((&m.backend_ref).into(), clusters) {
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
        return Err(Problem::new(
            reason::UNSUPPORTED_VALUE,
            "ExtensionRef filters are not supported".into(),
        ));
    } else if f.external_auth.is_some() {
        // A rule's ExternalAuth is taken by `external_auth` before this; here it is on a
        // backendRef, where it would authorize only some of a rule's requests.
        return Err(Problem::new(
            reason::UNSUPPORTED_VALUE,
            "an ExternalAuth filter belongs on the rule, not on a backendRef".into(),
        ));
    } else {
        return Err(Problem::new(
            reason::UNSUPPORTED_VALUE,
            "a filter of unknown type".into(),
        ));
    };
    Ok(Filter { kind: Some(kind) })
}

/// Answer when the authorization service cannot be asked (Gateway API: "MUST fail closed").
pub const EXTERNAL_AUTH_FAILURE_STATUS: u32 = 503;

/// A rule's ExternalAuth filter (GEP-1494) to the route's authorization service. A backendRef
/// that does not resolve leaves its verdict in `resolved`; the proxy then refuses every
/// request of the rule with 503, never serves it unchecked.
pub(super) fn external_auth(
    from: &Referrer<'_>,
    e: &HttpRouteRulesFiltersExternalAuth,
    clusters: &mut Vec<snap::Cluster>,
    resolved: &mut Result<(), Problem>,
) -> Result<snap::ExternalAuth, Problem> {
    if e.forward_body
        .as_ref()
        .and_then(|b| b.max_size)
        .is_some_and(|n| n > 0)
    {
        return Err(Problem::new(
            reason::UNSUPPORTED_VALUE,
            "ExternalAuth forwardBody is not supported: the request body is never sent to the \
             authorization service (remove forwardBody or set maxSize to 0)"
                .into(),
        ));
    }
    let cluster = match from.resolve((&e.backend_ref).into(), clusters) {
        Ok(c) => c,
        Err(p) => {
            if resolved.is_ok() {
                *resolved = Err(p);
            }
            String::new()
        }
    };
    let mut out = snap::ExternalAuth {
        cluster,
        failure_status: EXTERNAL_AUTH_FAILURE_STATUS,
        ..Default::default()
    };
    let lower = |names: &Option<Vec<String>>| -> Vec<String> {
        let mut v: Vec<String> = names
            .iter()
            .flatten()
            .map(|n| n.to_ascii_lowercase())
            .collect();
        v.sort();
        v.dedup();
        v
    };
    match e.protocol {
        HttpRouteRulesFiltersExternalAuthProtocol::Http => {
            out.protocol = snap::external_auth::Protocol::Http as i32;
            let http = e.http.clone().unwrap_or_default();
            let path = http.path.unwrap_or_default();
            if !path.is_empty() && !path.starts_with('/') {
                return Err(Problem::new(
                    reason::UNSUPPORTED_VALUE,
                    format!("ExternalAuth http.path {path:?} must start with /"),
                ));
            }
            out.path = path;
            out.path_is_prefix = true;
            out.request_fields = lower(&http.allowed_headers);
            out.response_fields = lower(&http.allowed_response_headers);
            // "If this list is empty, then all headers from the authorization server except
            // Authority or Host must be copied."
            out.all_response_fields = out.response_fields.is_empty();
        }
        HttpRouteRulesFiltersExternalAuthProtocol::Grpc => {
            out.protocol = snap::external_auth::Protocol::Grpc as i32;
            out.request_fields = lower(&e.grpc.as_ref().and_then(|g| g.allowed_headers.clone()));
            // "If this list is empty, then all headers must be sent."
            out.all_request_fields = out.request_fields.is_empty();
        }
    }
    Ok(out)
}

/// A header modifier from its set and add lists as (name, value) pairs: the generated types
/// give request and response modifiers, of rules and of backendRefs, distinct item types of
/// the same shape.
fn header_modifier<'a>(
    set: impl Iterator<Item = (&'a String, &'a String)>,
    add: impl Iterator<Item = (&'a String, &'a String)>,
    remove: &Option<Vec<String>>,
) -> snap::HeaderModifier {
    snap::HeaderModifier {
        set: headers(set),
        add: headers(add),
        // Header names compare case-insensitively; the proxy matches lower-case names.
        remove: remove
            .iter()
            .flatten()
            .map(|r| r.to_ascii_lowercase())
            .collect(),
    }
}

fn headers<'a>(list: impl Iterator<Item = (&'a String, &'a String)>) -> Vec<snap::Header> {
    list.map(|(name, value)| snap::Header {
        name: name.clone(),
        value: value.clone(),
    })
    .collect()
}

fn path_modifier(
    full: Option<String>,
    prefix: Option<String>,
) -> Result<snap::PathModifier, Problem> {
    let kind = match (full, prefix) {
        (Some(f), None) => snap::path_modifier::Kind::ReplaceFullPath(f),
        (None, Some(p)) => snap::path_modifier::Kind::ReplacePrefixMatch(p),
        _ => {
            return Err(Problem::new(
                reason::UNSUPPORTED_VALUE,
                "a path modifier sets exactly one of replaceFullPath and replacePrefixMatch".into(),
            ));
        }
    };
    Ok(snap::PathModifier { kind: Some(kind) })
}

/// A backendRef's filter as the rule filter it is field for field: the generated types repeat
/// every filter type under the backendRef's names. Struct literals without `..Default` so a
/// field added to the API is a compile error here, not a filter silently dropped.
pub(super) fn backend_filter_as_rule(
    f: &http::HttpRouteRulesBackendRefsFilters,
) -> HttpRouteRulesFilters {
    use http::HttpRouteRulesBackendRefsFiltersType as Backend;
    use http::HttpRouteRulesFiltersType as Rule;
    HttpRouteRulesFilters {
        r#type: match f.r#type {
            Backend::RequestHeaderModifier => Rule::RequestHeaderModifier,
            Backend::ResponseHeaderModifier => Rule::ResponseHeaderModifier,
            Backend::RequestMirror => Rule::RequestMirror,
            Backend::RequestRedirect => Rule::RequestRedirect,
            Backend::UrlRewrite => Rule::UrlRewrite,
            Backend::ExtensionRef => Rule::ExtensionRef,
            Backend::Cors => Rule::Cors,
            Backend::ExternalAuth => Rule::ExternalAuth,
        },
        cors: f.cors.as_ref().map(|c| http::HttpRouteRulesFiltersCors {
            allow_credentials: c.allow_credentials,
            allow_headers: c.allow_headers.clone(),
            allow_methods: c.allow_methods.clone(),
            allow_origins: c.allow_origins.clone(),
            expose_headers: c.expose_headers.clone(),
            max_age: c.max_age,
        }),
        extension_ref: f
            .extension_ref
            .as_ref()
            .map(|e| http::HttpRouteRulesFiltersExtensionRef {
                group: e.group.clone(),
                kind: e.kind.clone(),
                name: e.name.clone(),
            }),
        external_auth: f.external_auth.as_ref().map(backend_external_auth_as_rule),
        request_header_modifier: f.request_header_modifier.as_ref().map(|m| {
            header_modifier_as!(m => HttpRouteRulesFiltersRequestHeaderModifier {
                add: HttpRouteRulesFiltersRequestHeaderModifierAdd,
                set: HttpRouteRulesFiltersRequestHeaderModifierSet,
            })
        }),
        response_header_modifier: f.response_header_modifier.as_ref().map(|m| {
            header_modifier_as!(m => HttpRouteRulesFiltersResponseHeaderModifier {
                add: HttpRouteRulesFiltersResponseHeaderModifierAdd,
                set: HttpRouteRulesFiltersResponseHeaderModifierSet,
            })
        }),
        request_mirror: f.request_mirror.as_ref().map(|m| {
            request_mirror_as!(m => HttpRouteRulesFiltersRequestMirror {
                backend_ref: HttpRouteRulesFiltersRequestMirrorBackendRef,
                fraction: HttpRouteRulesFiltersRequestMirrorFraction,
            })
        }),
        request_redirect: f.request_redirect.as_ref().map(|r| {
            use http::HttpRouteRulesBackendRefsFiltersRequestRedirectPathType as BackendPath;
            use http::HttpRouteRulesBackendRefsFiltersRequestRedirectScheme as BackendScheme;
            use http::HttpRouteRulesFiltersRequestRedirectPathType as RulePath;
            http::HttpRouteRulesFiltersRequestRedirect {
                hostname: r.hostname.clone(),
                path: r
                    .path
                    .as_ref()
                    .map(|p| http::HttpRouteRulesFiltersRequestRedirectPath {
                        replace_full_path: p.replace_full_path.clone(),
                        replace_prefix_match: p.replace_prefix_match.clone(),
                        r#type: match p.r#type {
                            BackendPath::ReplaceFullPath => RulePath::ReplaceFullPath,
                            BackendPath::ReplacePrefixMatch => RulePath::ReplacePrefixMatch,
                        },
                    }),
                port: r.port,
                scheme: r.scheme.as_ref().map(|s| match s {
                    BackendScheme::Http => HttpRouteRulesFiltersRequestRedirectScheme::Http,
                    BackendScheme::Https => HttpRouteRulesFiltersRequestRedirectScheme::Https,
                }),
                status_code: r.status_code,
            }
        }),
        url_rewrite: f.url_rewrite.as_ref().map(|u| {
            use http::HttpRouteRulesBackendRefsFiltersUrlRewritePathType as BackendPath;
            use http::HttpRouteRulesFiltersUrlRewritePathType as RulePath;
            http::HttpRouteRulesFiltersUrlRewrite {
                hostname: u.hostname.clone(),
                path: u
                    .path
                    .as_ref()
                    .map(|p| http::HttpRouteRulesFiltersUrlRewritePath {
                        replace_full_path: p.replace_full_path.clone(),
                        replace_prefix_match: p.replace_prefix_match.clone(),
                        r#type: match p.r#type {
                            BackendPath::ReplaceFullPath => RulePath::ReplaceFullPath,
                            BackendPath::ReplacePrefixMatch => RulePath::ReplacePrefixMatch,
                        },
                    }),
            }
        }),
    }
}

fn backend_external_auth_as_rule(
    e: &http::HttpRouteRulesBackendRefsFiltersExternalAuth,
) -> HttpRouteRulesFiltersExternalAuth {
    use http::HttpRouteRulesBackendRefsFiltersExternalAuthProtocol as Backend;
    HttpRouteRulesFiltersExternalAuth {
        backend_ref: http::HttpRouteRulesFiltersExternalAuthBackendRef {
            group: e.backend_ref.group.clone(),
            kind: e.backend_ref.kind.clone(),
            name: e.backend_ref.name.clone(),
            namespace: e.backend_ref.namespace.clone(),
            port: e.backend_ref.port,
        },
        forward_body: e.forward_body.as_ref().map(|b| {
            http::HttpRouteRulesFiltersExternalAuthForwardBody {
                max_size: b.max_size,
            }
        }),
        grpc: e
            .grpc
            .as_ref()
            .map(|g| http::HttpRouteRulesFiltersExternalAuthGrpc {
                allowed_headers: g.allowed_headers.clone(),
            }),
        http: e
            .http
            .as_ref()
            .map(|h| http::HttpRouteRulesFiltersExternalAuthHttp {
                allowed_headers: h.allowed_headers.clone(),
                allowed_response_headers: h.allowed_response_headers.clone(),
                path: h.path.clone(),
            }),
        protocol: match e.protocol {
            Backend::Http => HttpRouteRulesFiltersExternalAuthProtocol::Http,
            Backend::Grpc => HttpRouteRulesFiltersExternalAuthProtocol::Grpc,
        },
    }
}
