//! HTTPRoute rules (the shared form's, so GRPCRoute and TLSRoute rules too) to what the
//! snapshot's routes carry: matches, filters, backends, timeouts, retries and session
//! persistence.

use super::backend::Referrer;
use super::filters::{backend_filter_as_rule, compile_filter, external_auth};
use super::status::{Problem, reason};
use coxswain_api::snapshot::{
    self as snap, Filter, HeaderMatch, PathMatch, QueryParamMatch, RouteMatch, WeightedBackend,
    filter,
};
use gateway_api::apis::experimental::httproutes::{
    HttpRoute, HttpRouteRules, HttpRouteRulesMatches, HttpRouteRulesMatchesHeadersType,
    HttpRouteRulesMatchesMethod, HttpRouteRulesMatchesPathType,
    HttpRouteRulesMatchesQueryParamsType,
};

/// A rule compiled once, shared by every listener the route attaches to.
pub(super) struct CompiledRule {
    pub index: u32,
    pub name: String,
    pub matches: Vec<RouteMatch>,
    pub filters: Vec<Filter>,
    pub backends: Vec<WeightedBackend>,
    pub timeouts: Option<snap::Timeouts>,
    pub retry: Option<snap::Retry>,
    pub session_persistence: Option<snap::SessionPersistence>,
    pub direct_status: u32,
    pub external_auth: Option<snap::ExternalAuth>,
}

/// Compiles the rules once. Returns the rules, the route's ResolvedRefs verdict, and a problem
/// that makes the whole route unacceptable (UnsupportedValue).
pub(super) fn compile_rules(
    from: &Referrer<'_>,
    route: &HttpRoute,
    clusters: &mut Vec<snap::Cluster>,
) -> (Vec<CompiledRule>, Result<(), Problem>, Option<Problem>) {
    let mut rules = Vec::new();
    let mut resolved: Result<(), Problem> = Ok(());
    let mut problem = None;
    // The API server defaults an absent rules list to one rule matching every path; objects
    // read from files get the same default here.
    let default_rules = [HttpRouteRules::default()];
    let spec_rules = route.spec.rules.as_deref().unwrap_or(&default_rules);
    for (i, rule) in spec_rules.iter().enumerate() {
        let index_u32 = i as u32;
        match compile_rule(from, rule, clusters) {
            Ok(RuleParts {
                matches: compiled_matches,
                filters,
                backends,
                timeouts,
                retry,
                session_persistence,
                direct_status,
                external_auth,
                resolved: rule_resolved,
            }) => {
                if let (Ok(()), Err(e)) = (&resolved, rule_resolved) {
                    resolved = Err(e);
                }
                rules.push(CompiledRule {
                    index: index_u32,
                    name: rule.name.clone().unwrap_or_default(),
                    matches: compiled_matches,
                    filters,
                    backends,
                    timeouts,
                    retry,
                    session_persistence,
                    direct_status,
                    external_auth,
                });
            }
            Err(p) => {
                problem.get_or_insert(p);
            }
        }
    }
    (rules, resolved, problem)
}

/// One rule, compiled.
struct RuleParts {
    matches: Vec<RouteMatch>,
    filters: Vec<Filter>,
    backends: Vec<WeightedBackend>,
    timeouts: Option<snap::Timeouts>,
    retry: Option<snap::Retry>,
    session_persistence: Option<snap::SessionPersistence>,
    direct_status: u32,
    external_auth: Option<snap::ExternalAuth>,
    resolved: Result<(), Problem>,
}

/// Retries a rule asks for at most (GEP-1731 leaves the bound to implementations); more
/// would multiply load on a failing backend.
pub const MAX_RETRY_ATTEMPTS: i64 = 10;
/// Retries when `retry` gives no `attempts` (ingress-nginx's 3 tries in all).
pub const DEFAULT_RETRY_ATTEMPTS: u32 = 2;

/// rules[].retry (GEP-1731): idempotent requests answered with one of `codes` are sent to
/// another endpoint, at most `attempts` times, `backoff` apart.
fn compile_retry(
    r: &gateway_api::apis::experimental::httproutes::HttpRouteRulesRetry,
) -> Result<snap::Retry, Problem> {
    let attempts = match r.attempts {
        None => DEFAULT_RETRY_ATTEMPTS,
        Some(n) if (0..=MAX_RETRY_ATTEMPTS).contains(&n) => n as u32,
        Some(n) => {
            return Err(Problem::new(
                reason::UNSUPPORTED_VALUE,
                format!("retry.attempts {n} is outside 0-{MAX_RETRY_ATTEMPTS}"),
            ));
        }
    };
    let mut codes = Vec::new();
    for c in r.codes.iter().flatten() {
        match u32::try_from(*c) {
            Ok(c) if (400..=599).contains(&c) => codes.push(c),
            _ => {
                return Err(Problem::new(
                    reason::UNSUPPORTED_VALUE,
                    format!("retry.codes: {c} is not an HTTP status from 400 to 599"),
                ));
            }
        }
    }
    codes.sort_unstable();
    codes.dedup();
    let backoff_ms = match r.backoff.as_deref() {
        None => 0,
        Some(b) => parse_duration_ms(b).ok_or_else(|| {
            Problem::new(
                reason::UNSUPPORTED_VALUE,
                format!("retry.backoff: {b:?} is not a Gateway API duration"),
            )
        })?,
    };
    Ok(snap::Retry {
        codes,
        attempts,
        backoff_ms,
        non_idempotent: false,
        // GEP-1731 bounds each try (timeouts.backendRequest), not the retries as a whole.
        timeout_ms: 0,
    })
}

/// The session name when sessionPersistence gives none.
pub const DEFAULT_SESSION_NAME: &str = "coxswain-session";

/// rules[].sessionPersistence (GEP-1619): the proxy names the endpoint that served a client
/// in a cookie (or header) and keeps sending that client there. The cookie's Path is the
/// rule's path when it has one path match, so a browser sends it only where it matters.
fn compile_session_persistence(
    s: &gateway_api::apis::experimental::httproutes::HttpRouteRulesSessionPersistence,
    matches: &[RouteMatch],
) -> Result<snap::SessionPersistence, Problem> {
    use gateway_api::apis::experimental::httproutes::{
        HttpRouteRulesSessionPersistenceCookieConfigLifetimeType as Lifetime,
        HttpRouteRulesSessionPersistenceType as Type,
    };
    let unsupported = |m: String| Problem::new(reason::UNSUPPORTED_VALUE, m);
    if s.idle_timeout.is_some() {
        // Would need per-session state in every replica; the cookie carries none.
        return Err(unsupported(
            "sessionPersistence.idleTimeout is not supported; use absoluteTimeout".into(),
        ));
    }
    let name = s
        .session_name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| DEFAULT_SESSION_NAME.to_owned());
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(unsupported(format!(
            "sessionPersistence.sessionName {name:?}: letters, digits, '-', '_' and '.' only"
        )));
    }
    let kind = match s.r#type {
        Some(Type::Header) => snap::session_persistence::Kind::Header,
        _ => snap::session_persistence::Kind::Cookie,
    };
    let absolute_ms = match s.absolute_timeout.as_deref() {
        None => 0,
        Some(t) => parse_duration_ms(t).ok_or_else(|| {
            unsupported(format!(
                "sessionPersistence.absoluteTimeout: {t:?} is not a Gateway API duration"
            ))
        })?,
    };
    let session_cookie = s
        .cookie_config
        .as_ref()
        .and_then(|c| c.lifetime_type.as_ref())
        .is_some_and(|l| matches!(l, Lifetime::Session));
    let path = match matches {
        [m] => m
            .path
            .as_ref()
            .filter(|p| p.kind != snap::path_match::Kind::Regex as i32)
            .map(|p| p.value.clone())
            .unwrap_or_default(),
        _ => String::new(),
    };
    Ok(snap::SessionPersistence {
        kind: kind as i32,
        name,
        // Rounded up: a timeout under a second still gets a cookie that lasts.
        max_age_s: if session_cookie {
            0
        } else {
            absolute_ms.div_ceil(1000)
        },
        path,
    })
}

fn compile_rule(
    from: &Referrer<'_>,
    rule: &HttpRouteRules,
    clusters: &mut Vec<snap::Cluster>,
) -> Result<RuleParts, Problem> {
    let matches: Vec<RouteMatch> = match rule.matches.as_deref() {
        None | Some([]) => vec![default_match()],
        Some(ms) => ms.iter().map(compile_match).collect::<Result<_, _>>()?,
    };
    let mut resolved = Ok(());
    let mut filters = Vec::new();
    let mut auth = None;
    for f in rule.filters.iter().flatten() {
        match &f.external_auth {
            Some(e) if auth.is_none() => {
                auth = Some(external_auth(from, e, clusters, &mut resolved)?);
            }
            Some(_) => {
                return Err(Problem::new(
                    reason::UNSUPPORTED_VALUE,
                    "a rule has at most one ExternalAuth filter".into(),
                ));
            }
            None => filters.push(compile_filter(from, f, clusters, &mut resolved)?),
        }
    }
    let mut backends = Vec::new();
    for b in rule.backend_refs.iter().flatten() {
        let weight = u32::try_from(b.weight.unwrap_or(1)).unwrap_or(0);
        let target = from.resolve(b.into(), clusters);
        let cluster = match target {
            Ok(name) => name,
            Err(p) => {
                if resolved.is_ok() {
                    resolved = Err(p);
                }
                String::new()
            }
        };
        let mut backend_filters = Vec::new();
        for f in b.filters.iter().flatten() {
            let as_rule = backend_filter_as_rule(f);
            backend_filters.push(compile_filter(from, &as_rule, clusters, &mut resolved)?);
        }
        backends.push(WeightedBackend {
            cluster,
            weight,
            filters: backend_filters,
        });
    }
    let answers_itself = filters
        .iter()
        .any(|f| matches!(f.kind, Some(filter::Kind::RequestRedirect(_))));
    let has_valid_backend = backends
        .iter()
        .any(|b| !b.cluster.is_empty() && b.weight > 0);
    // Gateway API: a rule whose backends are all invalid (or that has none and no filter that
    // answers) gets 500s.
    let direct_status = if answers_itself || has_valid_backend {
        0
    } else {
        500
    };
    let timeouts = match &rule.timeouts {
        None => None,
        Some(t) => {
            let parse = |v: &Option<String>, field: &str| -> Result<u64, Problem> {
                v.as_deref().map_or(Ok(0), |s| {
                    parse_duration_ms(s).ok_or_else(|| {
                        Problem::new(
                            reason::UNSUPPORTED_VALUE,
                            format!("timeouts.{field}: {s:?} is not a Gateway API duration"),
                        )
                    })
                })
            };
            Some(snap::Timeouts {
                request_ms: parse(&t.request, "request")?,
                backend_request_ms: parse(&t.backend_request, "backendRequest")?,
                ..Default::default()
            })
        }
    };
    let retry = rule.retry.as_ref().map(compile_retry).transpose()?;
    let session_persistence = rule
        .session_persistence
        .as_ref()
        .map(|s| compile_session_persistence(s, &matches))
        .transpose()?;
    Ok(RuleParts {
        matches,
        filters,
        backends,
        timeouts,
        retry,
        session_persistence,
        direct_status,
        external_auth: auth,
        resolved,
    })
}

fn default_match() -> RouteMatch {
    RouteMatch {
        path: Some(PathMatch {
            kind: snap::path_match::Kind::Prefix as i32,
            value: "/".into(),
        }),
        ..Default::default()
    }
}

fn compile_match(m: &HttpRouteRulesMatches) -> Result<RouteMatch, Problem> {
    let path = match &m.path {
        None => default_match().path,
        Some(p) => {
            let value = p.value.clone().unwrap_or_else(|| "/".into());
            let kind = match p.r#type {
                None | Some(HttpRouteRulesMatchesPathType::PathPrefix) => {
                    snap::path_match::Kind::Prefix
                }
                Some(HttpRouteRulesMatchesPathType::Exact) => snap::path_match::Kind::Exact,
                Some(HttpRouteRulesMatchesPathType::RegularExpression) => {
                    check_regex(&value, "path")?;
                    snap::path_match::Kind::Regex
                }
            };
            if kind != snap::path_match::Kind::Regex && !value.starts_with('/') {
                return Err(Problem::new(
                    reason::UNSUPPORTED_VALUE,
                    format!("path {value:?} must start with /"),
                ));
            }
            // A trailing slash on a prefix does not change what it matches ("/foo/" == "/foo").
            let value = if kind == snap::path_match::Kind::Prefix && value.len() > 1 {
                value.trim_end_matches('/').to_owned()
            } else {
                value
            };
            Some(PathMatch {
                kind: kind as i32,
                value,
            })
        }
    };
    let mut headers = Vec::new();
    for h in m.headers.iter().flatten() {
        let kind = match h.r#type {
            None | Some(HttpRouteRulesMatchesHeadersType::Exact) => snap::header_match::Kind::Exact,
            Some(HttpRouteRulesMatchesHeadersType::RegularExpression) => {
                check_regex(&h.value, "header")?;
                snap::header_match::Kind::Regex
            }
        };
        headers.push(HeaderMatch {
            kind: kind as i32,
            name: h.name.to_ascii_lowercase(),
            value: h.value.clone(),
        });
    }
    // Gateway API: when a header name repeats, only the first match counts.
    let mut seen = std::collections::BTreeSet::new();
    headers.retain(|h| seen.insert(h.name.clone()));
    let mut query_params = Vec::new();
    for q in m.query_params.iter().flatten() {
        let kind = match q.r#type {
            None | Some(HttpRouteRulesMatchesQueryParamsType::Exact) => {
                snap::query_param_match::Kind::Exact
            }
            Some(HttpRouteRulesMatchesQueryParamsType::RegularExpression) => {
                check_regex(&q.value, "query parameter")?;
                snap::query_param_match::Kind::Regex
            }
        };
        query_params.push(QueryParamMatch {
            kind: kind as i32,
            name: q.name.clone(),
            value: q.value.clone(),
        });
    }
    let method = match &m.method {
        None => "",
        Some(HttpRouteRulesMatchesMethod::Get) => "GET",
        Some(HttpRouteRulesMatchesMethod::Head) => "HEAD",
        Some(HttpRouteRulesMatchesMethod::Post) => "POST",
        Some(HttpRouteRulesMatchesMethod::Put) => "PUT",
        Some(HttpRouteRulesMatchesMethod::Delete) => "DELETE",
        Some(HttpRouteRulesMatchesMethod::Connect) => "CONNECT",
        Some(HttpRouteRulesMatchesMethod::Options) => "OPTIONS",
        Some(HttpRouteRulesMatchesMethod::Trace) => "TRACE",
        Some(HttpRouteRulesMatchesMethod::Patch) => "PATCH",
    }
    .to_owned();
    Ok(RouteMatch {
        path,
        headers,
        query_params,
        method,
    })
}

fn check_regex(value: &str, what: &str) -> Result<(), Problem> {
    regex::Regex::new(value).map(|_| ()).map_err(|e| {
        Problem::new(
            reason::UNSUPPORTED_VALUE,
            format!("{what} regular expression {value:?}: {e}"),
        )
    })
}

/// Gateway API durations (GEP-2257): one or more `<number><unit>` with units h, m, s, ms.
pub fn parse_duration_ms(s: &str) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit_ms, len) = if rest.starts_with("ms") {
            (1, 2)
        } else if rest.starts_with('h') {
            (3_600_000, 1)
        } else if rest.starts_with('m') {
            (60_000, 1)
        } else if rest.starts_with('s') {
            (1_000, 1)
        } else {
            return None;
        };
        total = total.checked_add(n.checked_mul(unit_ms)?)?;
        rest = &rest[len..];
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::parse_duration_ms;

    // GEP-2257: "1h", "30m", "10s", "500ms" and combinations such as "1h30m".
    #[test]
    fn gateway_api_durations() {
        assert_eq!(parse_duration_ms("10s"), Some(10_000));
        assert_eq!(parse_duration_ms("500ms"), Some(500));
        assert_eq!(parse_duration_ms("1h30m"), Some(5_400_000));
        assert_eq!(parse_duration_ms("0s"), Some(0));
        assert_eq!(parse_duration_ms("1.5s"), None);
        assert_eq!(parse_duration_ms("10"), None);
        assert_eq!(parse_duration_ms(""), None);
    }
}
