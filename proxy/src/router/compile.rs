//! Compiling a snapshot's route into what a lookup reads, sharing what the previous table has
//! of it.

use super::{
    BuildError, CompiledRoute, Mirror, PathMatcher, ResolvedBackend, StrMatcher, ValueMatcher,
};
use crate::upstream::ClusterState;
use coxswain_api::snapshot::{self as snap, header_match, path_match, query_param_match};
use regex::Regex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

/// The route of the previous table's host to share with `r`: the next one in `earlier` if it
/// is equal, or the one after it (one route removed, or changed). `earlier` moves past what
/// was taken, so a route added in between finds the rest of them still next.
pub(super) fn reusable<'t>(
    earlier: &mut &'t [CompiledRoute],
    r: &snap::Route,
) -> Option<&'t CompiledRoute> {
    let skip = earlier.iter().take(2).position(|c| *c.route == *r)?;
    let rest = *earlier;
    *earlier = rest.get(skip + 1..).unwrap_or_default();
    rest.get(skip)
}

/// Whether a host compiled for the previous table, from the same encoding as this one's,
/// serves it exactly as compiling it again would: each route sends to the clusters this table
/// has (shared states, so the same), and none reaches another service through a policy
/// (external authorization, a global rate limit), whose client `compile_route` builds anew.
/// `clusters_same`: every cluster state is the previous table's, none added or removed, so
/// each route still sends where it did.
pub(super) fn unchanged(
    host: &[CompiledRoute],
    clusters: &HashMap<Box<str>, Arc<ClusterState>>,
    clusters_same: bool,
) -> bool {
    let own_clients =
        |c: &CompiledRoute| c.policy.external_auth.is_some() || c.policy.global_limit.is_some();
    if clusters_same {
        return !host.iter().any(own_clients);
    }
    let same_cluster =
        |held: Option<&Arc<ClusterState>>, name: &str| match (held, clusters.get(name)) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
    // The kept copy of each route is the route the same bytes decode to.
    host.iter().all(|c| {
        !own_clients(c)
            && c.backends.len() == c.route.backends.len()
            && c.backends
                .iter()
                .zip(&c.route.backends)
                .all(|(b, s)| same_cluster(b.cluster.as_ref(), &s.cluster))
            && c.mirrors
                .iter()
                .zip(mirror_clusters(&c.route))
                .all(|(m, name)| same_cluster(m.cluster.as_ref(), name))
    })
}

/// The clusters of a route's request mirrors, in the order `compile_route` makes them.
fn mirror_clusters(r: &snap::Route) -> impl Iterator<Item = &str> {
    r.filters.iter().filter_map(|f| match &f.kind {
        Some(snap::filter::Kind::RequestMirror(m)) => Some(m.cluster.as_str()),
        _ => None,
    })
}

/// Compiles `r`; `same` is a route of the previous table with the same content, whose copy of
/// it, counters and policy this one shares.
pub(super) fn compile_route(
    r: &snap::Route,
    same: Option<&CompiledRoute>,
    clusters: &HashMap<Box<str>, Arc<ClusterState>>,
    metrics: &crate::metrics::Metrics,
) -> Result<CompiledRoute, BuildError> {
    let describe = || {
        r.source
            .as_ref()
            .map(|s| format!("{}/{}/{}#{}", s.kind, s.namespace, s.name, s.rule))
            .unwrap_or_default()
    };
    let regex = |what: &'static str, pattern: &str| {
        // Gateway API regex matches are full matches.
        Regex::new(&format!("^(?:{pattern})$")).map_err(|source| BuildError::Regex {
            route: describe(),
            what,
            pattern: pattern.to_owned(),
            source,
        })
    };
    let no_match = snap::RouteMatch::default();
    let m = r.r#match.as_ref().unwrap_or(&no_match);
    let path = match &m.path {
        None => PathMatcher::Prefix("".into()),
        Some(p) => match path_match::Kind::try_from(p.kind) {
            Ok(path_match::Kind::Exact) => PathMatcher::Exact(p.value.as_str().into()),
            Ok(path_match::Kind::Regex) => PathMatcher::Regex(regex("path", &p.value)?),
            _ => PathMatcher::Prefix(p.value.trim_end_matches('/').into()),
        },
    };
    let mut headers = Vec::new();
    for h in &m.headers {
        let value = match header_match::Kind::try_from(h.kind) {
            Ok(header_match::Kind::Regex) => StrMatcher::Regex(regex("header", &h.value)?),
            _ => StrMatcher::Exact(h.value.as_str().into()),
        };
        headers.push(ValueMatcher {
            name: h.name.to_ascii_lowercase().into(),
            value,
        });
    }
    let mut query_params = Vec::new();
    for q in &m.query_params {
        let value = match query_param_match::Kind::try_from(q.kind) {
            Ok(query_param_match::Kind::Regex) => {
                StrMatcher::Regex(regex("query parameter", &q.value)?)
            }
            _ => StrMatcher::Exact(q.value.as_str().into()),
        };
        query_params.push(ValueMatcher {
            name: q.name.as_str().into(),
            value,
        });
    }
    let response_modifiers = |filters: &[snap::Filter]| {
        filters
            .iter()
            .filter_map(|f| match &f.kind {
                Some(snap::filter::Kind::ResponseHeaderModifier(m)) => Some(m.clone()),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let rule_response_edits = response_modifiers(&r.filters);
    let weight_divisor = r
        .backends
        .iter()
        .fold(0, |g, b| gcd(g, u64::from(b.weight)));
    let weight_divisor = u32::try_from(weight_divisor).unwrap_or(1).max(1);
    let total_weight: u64 = r
        .backends
        .iter()
        .map(|b| u64::from(b.weight / weight_divisor))
        .sum();
    let backends: Vec<ResolvedBackend> = r
        .backends
        .iter()
        .map(|b| {
            let mut edits = rule_response_edits.clone();
            edits.extend(response_modifiers(&b.filters));
            ResolvedBackend {
                cluster: clusters.get(b.cluster.as_str()).cloned(),
                weight: b.weight,
                filters: b.filters.clone(),
                response_edits: (!edits.is_empty()).then(|| edits.into()),
            }
        })
        .collect();
    // A policy depends on the route alone, its rate limiters being the registry's for the
    // same settings, except for an authorization or rate limit service, which it reaches
    // through this table's clusters.
    let policy = match same {
        Some(c) if c.policy.external_auth.is_none() && c.policy.global_limit.is_none() => {
            Arc::clone(&c.policy)
        }
        _ => Arc::new(crate::policy::RoutePolicy::new(
            r,
            &metrics.rate_limits,
            clusters,
        )),
    };
    let plain_http1 = |c: &ClusterState| match policy.upstream_protocol {
        snap::UpstreamProtocol::Unspecified => c.app_protocol != snap::AppProtocol::H2c,
        snap::UpstreamProtocol::Http1 => true,
        _ => false,
    };
    // Rate limits and Basic authentication stay on the fast path: `request::decide` decides
    // them for both engines, and the fast path writes their 401 and 429 itself. So do header
    // modifiers that only edit plain fields and URL rewrites, which the fast path applies as
    // it writes the head, and timeouts, which bound its waits (`fastpath::backend::Bounds`).
    // External authorization and global rate limits wait on another service (and
    // authorization edits the request, as a JWT whose claims become fields does): Pingora
    // serves those.
    // A client allowlist's 403 is the request layer's too. A route that only answers, with a
    // redirect (its one filter) or a fixed status, is answered by `decide` before any backend
    // matters: the fast path writes that answer as it writes a 401. Session persistence is
    // `decide`'s too (the endpoint a request names); the fast path names the endpoint that
    // served in the answer. A retry policy is applied there as well (`fastpath::retry`).
    let services = policy.external_auth.is_none()
        && policy.global_limit.is_none()
        && policy.jwt.as_ref().is_none_or(|j| !j.sets_fields());
    let answers = match r.filters.as_slice() {
        [f] => matches!(f.kind, Some(snap::filter::Kind::RequestRedirect(_))),
        [] => r.direct_status != 0,
        _ => false,
    };
    let forwards = r.filters.iter().all(crate::filters::fast_path_filter)
        && r.direct_status == 0
        && !backends.is_empty()
        && backends.iter().all(|b| {
            b.filters.iter().all(crate::filters::fast_path_filter)
                && b.cluster
                    .as_deref()
                    .is_some_and(|c| c.has_endpoints() && c.backend_tls.is_none() && plain_http1(c))
        })
        && r.backends.iter().any(|b| b.weight > 0);
    let passthrough = services && (answers || forwards);
    Ok(CompiledRoute {
        path,
        headers,
        query_params,
        method: (!m.method.is_empty()).then(|| m.method.as_str().into()),
        route: same.map_or_else(|| Arc::new(r.clone()), |c| Arc::clone(&c.route)),
        backends,
        counters: match same {
            // The same source, so the same counters, which the registry keeps while a table
            // has them: no name to format and look up.
            Some(c) => Arc::clone(&c.counters),
            None => {
                let (route, rule) = r.source.as_ref().map_or((String::new(), 0), |s| {
                    (format!("{}/{}/{}", s.kind, s.namespace, s.name), s.rule)
                });
                metrics.route(&route, rule)
            }
        },
        policy,
        total_weight,
        weight_divisor,
        stride: interleaving_stride(total_weight),
        next: AtomicUsize::new(0),
        mirrors: r
            .filters
            .iter()
            .filter_map(|f| match &f.kind {
                Some(snap::filter::Kind::RequestMirror(m)) => Some(Mirror::new(m, clusters)),
                _ => None,
            })
            .collect(),
        passthrough,
    })
}

pub(super) fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// A step through `total` positions that visits each once per round and spreads consecutive
/// steps evenly: about `total` divided by the golden ratio (the most even spread), moved up to
/// the next number coprime with `total` so no position is skipped.
pub(super) fn interleaving_stride(total: u64) -> u64 {
    if total <= 2 {
        return 1;
    }
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let mut stride = ((total as f64) * 0.618_033_988_749_895).round() as u64;
    stride = stride.clamp(1, total - 1);
    // Ends at total - 1 at the latest, which is coprime with total.
    while gcd(stride, total) != 1 {
        stride += 1;
    }
    stride
}
