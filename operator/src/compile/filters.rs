//! HTTPRoute filters, of a rule or of a backendRef, to snapshot filters.

use super::backend::Referrer;
use super::status::{Problem, reason};
use coxswain_api::snapshot::{self as snap, Filter, filter};
use gateway_api::apis::experimental::httproutes::{
    HttpRouteRulesFilters, HttpRouteRulesFiltersExternalAuth,
    HttpRouteRulesFiltersExternalAuthProtocol,
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
        .map_err(|e| Problem::new(reason::UNSUPPORTED_VALUE, format!("header modifier: {e}")))?;
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
            return Err(Problem::new(
                reason::UNSUPPORTED_VALUE,
                "a path modifier sets exactly one of replaceFullPath and replacePrefixMatch".into(),
            ));
        }
    };
    Ok(snap::PathModifier { kind: Some(kind) })
}
