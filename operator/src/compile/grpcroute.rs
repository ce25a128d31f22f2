//! GRPCRoutes, read as the HTTPRoutes they are equivalent to. A gRPC call is an HTTP/2 POST to
//! `/<service>/<method>` with its metadata as headers, so a method match is a path match and a
//! header match is a header match; filters and backendRefs have the HTTPRoute shapes already.
//! What stays gRPC-specific — HTTP/2 to the backends, the kind in status and ReferenceGrants —
//! is decided by the route compiler from [`RouteKind::Grpc`].

use super::route::{RouteForm, RouteKind, header_modifier_as, request_mirror_as};
use super::status::{Problem, reason};
use gateway_api::apis::experimental::httproutes as http;
use gateway_api::apis::standard::grpcroutes as grpc;
use gateway_api::apis::standard::grpcroutes::{
    GrpcRoute, GrpcRouteRules, GrpcRouteRulesMatches, GrpcRouteRulesMatchesMethodType,
};

/// `route` in the shared form, and a problem when part of it has no HTTPRoute equivalent (the
/// route is then not accepted; the rules that converted still get status).
pub fn as_route_form<'a>(route: &GrpcRoute) -> RouteForm<'a> {
    let mut problem = None;
    let rules = route.spec.rules.as_ref().map(|rules| {
        rules
            .iter()
            .filter_map(|rule| match rule_as_http(rule) {
                Ok(r) => Some(r),
                Err(p) => {
                    problem.get_or_insert(p);
                    None
                }
            })
            .collect()
    });
    let spec = http::HttpRouteSpec {
        parent_refs: route
            .spec
            .parent_refs
            .as_ref()
            .map(|refs| refs.iter().map(parent_ref).collect()),
        hostnames: route.spec.hostnames.clone(),
        rules,
        ..Default::default()
    };
    RouteForm::equivalent(RouteKind::Grpc, &route.metadata, spec, problem)
}

fn parent_ref(p: &grpc::GrpcRouteParentRefs) -> http::HttpRouteParentRefs {
    http::HttpRouteParentRefs {
        group: p.group.clone(),
        kind: p.kind.clone(),
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        port: p.port,
        section_name: p.section_name.clone(),
    }
}

fn rule_as_http(rule: &GrpcRouteRules) -> Result<http::HttpRouteRules, Problem> {
    let matches = rule
        .matches
        .as_ref()
        .map(|ms| ms.iter().map(match_as_http).collect::<Result<Vec<_>, _>>())
        .transpose()?;
    Ok(http::HttpRouteRules {
        name: rule.name.clone(),
        matches,
        filters: rule
            .filters
            .as_ref()
            .map(|fs| fs.iter().map(filter_as_http).collect()),
        backend_refs: rule
            .backend_refs
            .as_ref()
            .map(|bs| bs.iter().map(backend_as_http).collect()),
        ..Default::default()
    })
}

/// A path match of `type` and `value`.
fn path(
    r#type: http::HttpRouteRulesMatchesPathType,
    value: String,
) -> Option<http::HttpRouteRulesMatchesPath> {
    Some(http::HttpRouteRulesMatchesPath {
        r#type: Some(r#type),
        value: Some(value),
    })
}

/// Gateway API: an absent method matches every method; with type Exact (the default) a
/// service and a method match `/<service>/<method>`, a service alone every method of it, a
/// method alone that method of any service; with RegularExpression each part is a pattern.
fn match_as_http(m: &GrpcRouteRulesMatches) -> Result<http::HttpRouteRulesMatches, Problem> {
    use http::HttpRouteRulesMatchesPathType as PathType;
    let path = match &m.method {
        None => None,
        Some(method) => {
            let service = method.service.as_deref().filter(|s| !s.is_empty());
            let name = method.method.as_deref().filter(|s| !s.is_empty());
            match method.r#type {
                None | Some(GrpcRouteRulesMatchesMethodType::Exact) => {
                    for part in [service, name].into_iter().flatten() {
                        if part.contains('/') {
                            return Err(Problem::new(
                                reason::UNSUPPORTED_VALUE,
                                format!("method match {part:?} contains a '/'"),
                            ));
                        }
                    }
                    match (service, name) {
                        (Some(s), Some(n)) => path(PathType::Exact, format!("/{s}/{n}")),
                        (Some(s), None) => path(PathType::PathPrefix, format!("/{s}")),
                        (None, Some(n)) => path(
                            PathType::RegularExpression,
                            format!("/[^/]+/{}", regex::escape(n)),
                        ),
                        (None, None) => None,
                    }
                }
                Some(GrpcRouteRulesMatchesMethodType::RegularExpression) => {
                    let pattern = |p: Option<&str>, what: &str| -> Result<String, Problem> {
                        let p = p.unwrap_or("[^/]+");
                        regex::Regex::new(p).map_err(|e| {
                            Problem::new(
                                reason::UNSUPPORTED_VALUE,
                                format!("{what} regular expression {p:?}: {e}"),
                            )
                        })?;
                        Ok(format!("(?:{p})"))
                    };
                    let value = format!(
                        "/{}/{}",
                        pattern(service, "service")?,
                        pattern(name, "method")?
                    );
                    path(PathType::RegularExpression, value)
                }
            }
        }
    };
    let headers = m.headers.as_ref().map(|hs| {
        hs.iter()
            .map(|h| http::HttpRouteRulesMatchesHeaders {
                name: h.name.clone(),
                value: h.value.clone(),
                r#type: h.r#type.as_ref().map(|t| match t {
                    grpc::GrpcRouteRulesMatchesHeadersType::Exact => {
                        http::HttpRouteRulesMatchesHeadersType::Exact
                    }
                    grpc::GrpcRouteRulesMatchesHeadersType::RegularExpression => {
                        http::HttpRouteRulesMatchesHeadersType::RegularExpression
                    }
                }),
            })
            .collect()
    });
    Ok(http::HttpRouteRulesMatches {
        headers,
        path,
        ..Default::default()
    })
}

/// A rule filter. GRPCRoute filters are a subset of HTTPRoute's, field for field.
fn filter_as_http(f: &grpc::GrpcRouteRulesFilters) -> http::HttpRouteRulesFilters {
    use grpc::GrpcRouteRulesFiltersType as Grpc;
    use http::HttpRouteRulesFiltersType as Http;
    http::HttpRouteRulesFilters {
        r#type: match f.r#type {
            Grpc::ResponseHeaderModifier => Http::ResponseHeaderModifier,
            Grpc::RequestHeaderModifier => Http::RequestHeaderModifier,
            Grpc::RequestMirror => Http::RequestMirror,
            Grpc::ExtensionRef => Http::ExtensionRef,
        },
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
        extension_ref: f
            .extension_ref
            .as_ref()
            .map(|e| http::HttpRouteRulesFiltersExtensionRef {
                group: e.group.clone(),
                kind: e.kind.clone(),
                name: e.name.clone(),
            }),
        ..Default::default()
    }
}

fn backend_as_http(b: &grpc::GrpcRouteRulesBackendRefs) -> http::HttpRouteRulesBackendRefs {
    http::HttpRouteRulesBackendRefs {
        filters: b
            .filters
            .as_ref()
            .map(|fs| fs.iter().map(backend_filter_as_http).collect()),
        group: b.group.clone(),
        kind: b.kind.clone(),
        name: b.name.clone(),
        namespace: b.namespace.clone(),
        port: b.port,
        weight: b.weight,
    }
}

/// A backendRef's filter: the rule filter's shape under the backendRef's type names.
fn backend_filter_as_http(
    f: &grpc::GrpcRouteRulesBackendRefsFilters,
) -> http::HttpRouteRulesBackendRefsFilters {
    use grpc::GrpcRouteRulesBackendRefsFiltersType as Grpc;
    use http::HttpRouteRulesBackendRefsFiltersType as Http;
    http::HttpRouteRulesBackendRefsFilters {
        r#type: match f.r#type {
            Grpc::ResponseHeaderModifier => Http::ResponseHeaderModifier,
            Grpc::RequestHeaderModifier => Http::RequestHeaderModifier,
            Grpc::RequestMirror => Http::RequestMirror,
            Grpc::ExtensionRef => Http::ExtensionRef,
        },
        request_header_modifier: f.request_header_modifier.as_ref().map(|m| {
            header_modifier_as!(m => HttpRouteRulesBackendRefsFiltersRequestHeaderModifier {
                add: HttpRouteRulesBackendRefsFiltersRequestHeaderModifierAdd,
                set: HttpRouteRulesBackendRefsFiltersRequestHeaderModifierSet,
            })
        }),
        response_header_modifier: f.response_header_modifier.as_ref().map(|m| {
            header_modifier_as!(m => HttpRouteRulesBackendRefsFiltersResponseHeaderModifier {
                add: HttpRouteRulesBackendRefsFiltersResponseHeaderModifierAdd,
                set: HttpRouteRulesBackendRefsFiltersResponseHeaderModifierSet,
            })
        }),
        request_mirror: f.request_mirror.as_ref().map(|m| {
            request_mirror_as!(m => HttpRouteRulesBackendRefsFiltersRequestMirror {
                backend_ref: HttpRouteRulesBackendRefsFiltersRequestMirrorBackendRef,
                fraction: HttpRouteRulesBackendRefsFiltersRequestMirrorFraction,
            })
        }),
        extension_ref: f.extension_ref.as_ref().map(|e| {
            http::HttpRouteRulesBackendRefsFiltersExtensionRef {
                group: e.group.clone(),
                kind: e.kind.clone(),
                name: e.name.clone(),
            }
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_api::apis::experimental::httproutes::HttpRoute;

    fn grpc(yaml: &str) -> GrpcRoute {
        serde_yaml::from_str(yaml).expect("GRPCRoute fixture")
    }

    fn paths(route: &HttpRoute) -> Vec<(String, String)> {
        route
            .spec
            .rules
            .iter()
            .flatten()
            .flat_map(|r| r.matches.iter().flatten())
            .map(|m| {
                let p = m.path.as_ref().expect("a path match");
                (
                    serde_json::to_value(&p.r#type)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                    p.value.clone().unwrap_or_default(),
                )
            })
            .collect()
    }

    #[test]
    fn method_matches_become_path_matches() {
        let route = grpc(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: r, namespace: ns}
spec:
  parentRefs: [{name: gw}]
  rules:
  - name: both
    matches:
    - method: {service: pkg.Echo, method: Say}
    - method: {service: pkg.Echo}
    - method: {method: Say.Hi}
    - method: {type: RegularExpression, service: "pkg\\..*", method: "S.y"}
    - method: {type: RegularExpression, method: "Say"}
    backendRefs: [{name: svc, port: 9000}]
"#,
        );
        let RouteForm {
            route: http,
            problem,
            ..
        } = as_route_form(&route);
        assert_eq!(problem, None);
        let expected = [
            ("Exact", "/pkg.Echo/Say"),
            ("PathPrefix", "/pkg.Echo"),
            ("RegularExpression", r"/[^/]+/Say\.Hi"),
            ("RegularExpression", r"/(?:pkg\..*)/(?:S.y)"),
            ("RegularExpression", "/(?:[^/]+)/(?:Say)"),
        ];
        assert_eq!(
            paths(&http),
            expected
                .iter()
                .map(|(t, v)| ((*t).to_owned(), (*v).to_owned()))
                .collect::<Vec<_>>()
        );
        let rule = &http.spec.rules.as_ref().expect("rules")[0];
        assert_eq!(rule.name.as_deref(), Some("both"));
        let backend = &rule.backend_refs.as_ref().expect("backends")[0];
        assert_eq!((backend.name.as_str(), backend.port), ("svc", Some(9000)));
        assert_eq!(http.metadata.name.as_deref(), Some("r"));
        assert_eq!(http.spec.parent_refs.as_ref().map(Vec::len), Some(1));
    }

    #[test]
    fn headers_and_filters_carry_over() {
        let route = grpc(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: r, namespace: ns}
spec:
  parentRefs: [{name: gw}]
  hostnames: [grpc.example.com]
  rules:
  - matches:
    - headers: [{name: Version, value: two}, {type: RegularExpression, name: color, value: "o.*"}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: x-a, value: b}]}
    - type: RequestMirror
      requestMirror: {backendRef: {name: shadow, port: 9000}, percent: 10}
    backendRefs: [{name: svc, port: 9000, weight: 3}]
"#,
        );
        let RouteForm {
            route: http,
            problem,
            ..
        } = as_route_form(&route);
        assert_eq!(problem, None);
        assert_eq!(
            http.spec.hostnames.as_deref(),
            Some(&["grpc.example.com".to_owned()][..])
        );
        let rule = &http.spec.rules.as_ref().expect("rules")[0];
        let m = &rule.matches.as_ref().expect("matches")[0];
        // No method: every path.
        assert!(m.path.is_none());
        let headers = m.headers.as_ref().expect("headers");
        assert_eq!(headers.len(), 2);
        assert_eq!(
            (headers[1].name.as_str(), headers[1].value.as_str()),
            ("color", "o.*")
        );
        let filters = rule.filters.as_ref().expect("filters");
        assert!(filters[0].request_header_modifier.is_some());
        let mirror = filters[1].request_mirror.as_ref().expect("mirror");
        assert_eq!(
            (mirror.backend_ref.name.as_str(), mirror.percent),
            ("shadow", Some(10))
        );
        assert_eq!(
            rule.backend_refs.as_ref().expect("backends")[0].weight,
            Some(3)
        );
    }

    #[test]
    fn a_bad_method_pattern_is_a_problem_not_a_panic() {
        let route = grpc(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: r, namespace: ns}
spec:
  parentRefs: [{name: gw}]
  rules:
  - matches: [{method: {type: RegularExpression, service: "(unclosed"}}]
    backendRefs: [{name: svc, port: 9000}]
  - backendRefs: [{name: svc, port: 9000}]
"#,
        );
        let RouteForm {
            route: http,
            problem,
            ..
        } = as_route_form(&route);
        let Problem { reason, message } = problem.expect("a problem");
        assert_eq!(reason, reason::UNSUPPORTED_VALUE);
        assert!(message.contains("(unclosed"), "{message}");
        // The parents stay, so the route can be told why.
        assert_eq!(http.spec.parent_refs.as_ref().map(Vec::len), Some(1));
    }
}
