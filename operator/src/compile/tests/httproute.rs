//! HTTPRoutes: attachment to listeners, precedence, and every part of a rule (backends,
//! filters, timeouts, retries, session persistence, mirrors, CORS).

use super::fixtures::*;
use crate::compile::status::ConditionStatus;
use coxswain_api::snapshot as snap;

#[test]
fn parent_refs_must_name_an_existing_section_and_port() {
    let gw = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: web}
spec:
  gatewayClassName: coxswain
  listeners: [{name: http, port: 80, protocol: HTTP}]
"#;
    let wrong_section = route(
        "wrong-section",
        "  parentRefs: [{name: edge, sectionName: nope}]\n",
    );
    let wrong_port = route("wrong-port", "  parentRefs: [{name: edge, port: 81}]\n");
    let right = route(
        "right",
        "  parentRefs: [{name: edge, sectionName: http, port: 80}]\n",
    );
    let c = compile_yaml(&[BASE, gw, &wrong_section, &wrong_port, &right]);
    assert_eq!(
        route_condition(&c, "wrong-section", "Accepted").reason,
        "NoMatchingParent"
    );
    assert_eq!(
        route_condition(&c, "wrong-port", "Accepted").reason,
        "NoMatchingParent"
    );
    assert!(route_condition(&c, "right", "Accepted").is_true());
    // A rule with no backendRefs and no redirect answers 500.
    let r = &shared(&c).listeners[0].virtual_hosts[0].routes[0];
    assert_eq!(r.direct_status, 500);
}

#[test]
fn route_hostnames_intersect_listener_hostnames() {
    // HTTPRoute.spec.hostnames and Listener.hostname intersect; no intersection with any
    // listener gives NoMatchingListenerHostname.
    let gw = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: web}
spec:
  gatewayClassName: coxswain
  listeners: [{name: http, port: 80, protocol: HTTP, hostname: "*.example.com"}]
"#;
    let narrow = route(
        "narrow",
        "  parentRefs: [{name: edge}]\n  hostnames: [a.example.com, other.org]\n  rules: [{backendRefs: [{name: echo, port: 8080}]}]\n",
    );
    let broad = route(
        "broad",
        "  parentRefs: [{name: edge}]\n  rules: [{backendRefs: [{name: echo, port: 8080}]}]\n",
    );
    let none = route(
        "none",
        "  parentRefs: [{name: edge}]\n  hostnames: [other.org]\n",
    );
    let c = compile_yaml(&[BASE, gw, &narrow, &broad, &none]);
    assert_eq!(
        route_condition(&c, "none", "Accepted").reason,
        "NoMatchingListenerHostname"
    );
    let hosts: Vec<&str> = shared(&c).listeners[0]
        .virtual_hosts
        .iter()
        .map(|v| v.hostname.as_str())
        .collect();
    assert_eq!(hosts, ["*.example.com", "a.example.com"]);
    // a.example.com: the narrow route first, then the broad one (same listener).
    assert_eq!(
        routes_for(shared(&c), 80, "a.example.com"),
        ["narrow/0", "broad/0"]
    );
    assert_eq!(routes_for(shared(&c), 80, "b.example.com"), ["broad/0"]);
    assert!(routes_for(shared(&c), 80, "other.org").is_empty());
}

#[test]
fn listener_isolation_keeps_requests_on_the_most_specific_listener() {
    // GEP-1713 / HTTPListenerIsolation: a request is matched only against routes of the most
    // specific listener whose hostname matches it.
    let gw = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: web}
spec:
  gatewayClassName: coxswain
  listeners:
  - {name: any, port: 80, protocol: HTTP}
  - {name: wild, port: 80, protocol: HTTP, hostname: "*.example.com"}
  - {name: exact, port: 80, protocol: HTTP, hostname: a.example.com}
"#;
    let mk = |name: &str, section: &str| {
        route(
            name,
            &format!(
                "  parentRefs: [{{name: edge, sectionName: {section}}}]\n  rules: [{{backendRefs: [{{name: echo, port: 8080}}]}}]\n"
            ),
        )
    };
    let (any, wild, exact) = (mk("any", "any"), mk("wild", "wild"), mk("exact", "exact"));
    let c = compile_yaml(&[BASE, gw, &any, &wild, &exact]);
    let s = shared(&c);
    assert_eq!(routes_for(s, 80, "a.example.com"), ["exact/0"]);
    assert_eq!(routes_for(s, 80, "b.example.com"), ["wild/0"]);
    assert_eq!(routes_for(s, 80, "example.org"), ["any/0"]);
}

#[test]
fn rule_precedence_across_routes() {
    // HTTPRouteRule precedence: exact path, longest prefix, method, most headers, most query
    // params, then the oldest route, then namespace/name.
    let a = route(
        "a",
        r#"  parentRefs: [{name: edge}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /}}]
  - matches: [{path: {type: PathPrefix, value: /foo}}]
  - matches: [{path: {type: Exact, value: /foo}}]
  - matches: [{path: {type: PathPrefix, value: /foo}, method: GET}]
  - matches: [{path: {type: PathPrefix, value: /foo}, headers: [{name: X-A, value: "1"}]}]
  - matches: [{path: {type: PathPrefix, value: /foo}, headers: [{name: x-a, value: "1"}, {name: x-b, value: "2"}]}]
  - matches: [{path: {type: PathPrefix, value: /foo}, queryParams: [{name: q, value: "1"}]}]
"#,
    );
    let older = route("z-older", "  parentRefs: [{name: edge}]\n  rules: [{matches: [{path: {type: PathPrefix, value: /foo/bar}}]}]\n")
        .replace("generation: 3}", "generation: 3, creationTimestamp: \"2020-01-01T00:00:00Z\"}");
    let newer = route("b-newer", "  parentRefs: [{name: edge}]\n  rules: [{matches: [{path: {type: PathPrefix, value: /foo/bar}}]}]\n")
        .replace("generation: 3}", "generation: 3, creationTimestamp: \"2024-01-01T00:00:00Z\"}");
    let c = compile_yaml(&[BASE, GATEWAY, &a, &newer, &older]);
    assert_eq!(
        routes_for(shared(&c), 80, "any.host"),
        [
            "a/2",
            "z-older/0",
            "b-newer/0",
            "a/3",
            "a/5",
            "a/4",
            "a/6",
            "a/1",
            "a/0"
        ]
    );
}

#[test]
fn backend_refs_resolve_or_say_why_not() {
    // HTTPRoute ResolvedRefs reasons: BackendNotFound, InvalidKind, RefNotPermitted.
    let missing = route(
        "missing",
        "  parentRefs: [{name: edge}]\n  rules: [{backendRefs: [{name: nope, port: 80}]}]\n",
    );
    let kind = route(
        "kind",
        "  parentRefs: [{name: edge}]\n  rules: [{backendRefs: [{group: example.com, kind: Bucket, name: b}]}]\n",
    );
    let cross = route(
        "cross",
        "  parentRefs: [{name: edge}]\n  rules: [{backendRefs: [{name: api, namespace: other, port: 80}]}]\n",
    );
    let mixed = route(
        "mixed",
        "  parentRefs: [{name: edge}]\n  hostnames: [mixed.example]\n  rules: [{backendRefs: [{name: echo, port: 8080, weight: 3}, {name: nope, port: 80, weight: 1}]}]\n",
    );
    let api = r#"
apiVersion: v1
kind: Service
metadata: {name: api, namespace: other}
spec: {ports: [{port: 80}]}
"#;
    let c = compile_yaml(&[BASE, GATEWAY, &missing, &kind, &cross, &mixed, api]);
    for (r, reason) in [
        ("missing", "BackendNotFound"),
        ("kind", "InvalidKind"),
        ("cross", "RefNotPermitted"),
        ("mixed", "BackendNotFound"),
    ] {
        let cond = route_condition(&c, r, "ResolvedRefs");
        assert_eq!(
            (cond.status, cond.reason),
            (ConditionStatus::False, reason),
            "{r}"
        );
        // An unresolved backend does not make the route unacceptable.
        assert!(route_condition(&c, r, "Accepted").is_true(), "{r}");
    }
    let s = shared(&c);
    let vhost = s.listeners[0]
        .virtual_hosts
        .iter()
        .find(|v| v.hostname == "mixed.example")
        .unwrap();
    let r = &vhost.routes[0];
    // The invalid backend keeps its share of requests (answered 500 by the proxy).
    assert_eq!(r.direct_status, 0);
    assert_eq!(
        r.backends
            .iter()
            .map(|b| (b.cluster.as_str(), b.weight))
            .collect::<Vec<_>>(),
        [("web/echo:8080", 3), ("", 1)]
    );
    let cluster = &s.clusters[0];
    assert_eq!(cluster.name, "web/echo:8080");
    let eps: Vec<_> = cluster
        .endpoints
        .iter()
        .map(|e| (e.address.as_str(), e.port, e.ready, e.terminating))
        .collect();
    assert_eq!(
        eps,
        [
            ("10.1.0.1", 3000, false, true),
            ("10.1.0.2", 3000, true, false)
        ]
    );

    // With a ReferenceGrant the cross-namespace backend resolves.
    let grant = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: ReferenceGrant
metadata: {name: web-routes, namespace: other}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: web}]
  to: [{group: "", kind: Service, name: api}]
"#;
    let c = compile_yaml(&[BASE, GATEWAY, &cross, api, grant]);
    assert!(route_condition(&c, "cross", "ResolvedRefs").is_true());
}

#[test]
fn filters_compile_and_unsupported_ones_make_the_route_unacceptable() {
    let filtered = route(
        "filtered",
        r#"  parentRefs: [{name: edge}]
  rules:
  - filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: X-Set, value: a}], add: [{name: X-Add, value: b}], remove: [X-Remove]}
    - type: URLRewrite
      urlRewrite: {hostname: internal, path: {type: ReplacePrefixMatch, replacePrefixMatch: /v2}}
    - type: RequestMirror
      requestMirror: {backendRef: {name: echo, port: 8080}, percent: 25}
    backendRefs: [{name: echo, port: 8080}]
    timeouts: {request: 10s, backendRequest: 500ms}
  - matches: [{path: {type: Exact, value: /old}}]
    filters:
    - type: RequestRedirect
      requestRedirect: {scheme: https, statusCode: 301}
"#,
    );
    let extension = route(
        "extension",
        "  parentRefs: [{name: edge}]\n  rules: [{filters: [{type: ExtensionRef, extensionRef: {group: example.com, kind: Thing, name: t}}], backendRefs: [{name: echo, port: 8080}]}]\n",
    );
    let c = compile_yaml(&[BASE, GATEWAY, &filtered, &extension]);
    let cond = route_condition(&c, "extension", "Accepted");
    assert_eq!(
        (cond.status, cond.reason),
        (ConditionStatus::False, "UnsupportedValue")
    );
    assert!(route_condition(&c, "filtered", "Accepted").is_true());
    let routes = &shared(&c).listeners[0].virtual_hosts[0].routes;
    let redirect = routes
        .iter()
        .find(|r| r.source.as_ref().unwrap().rule == 1)
        .unwrap();
    assert_eq!(redirect.direct_status, 0, "a redirect answers by itself");
    let json = serde_json::to_value(routes).unwrap().to_string();
    for needle in [
        r#""requestHeaderModifier""#,
        r#""remove":["x-remove"]"#,
        r#""replacePrefixMatch":"/v2""#,
        r#""denominator":100,"numerator":25"#,
        r#""backendRequestMs":500,"#,
        r#""requestMs":10000"#,
        r#""statusCode":301"#,
    ] {
        assert!(json.contains(needle), "{needle} not in {json}");
    }
}

#[test]
fn rule_timeouts_compile_and_zero_disables() {
    // HTTPRouteTimeouts: request bounds the whole request, backendRequest each attempt to a
    // backend; "0s" turns a timeout off (0 in the snapshot), and a value that is not a
    // GEP-2257 duration makes the route unacceptable.
    let timed = route(
        "timed",
        r#"  parentRefs: [{name: edge}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /request}}]
    backendRefs: [{name: echo, port: 8080}]
    timeouts: {request: 500ms}
  - matches: [{path: {type: PathPrefix, value: /backend}}]
    backendRefs: [{name: echo, port: 8080}]
    timeouts: {request: 1m, backendRequest: 1s}
  - matches: [{path: {type: PathPrefix, value: /off}}]
    backendRefs: [{name: echo, port: 8080}]
    timeouts: {request: 0s}
"#,
    );
    let broken = route(
        "broken",
        "  parentRefs: [{name: edge}]\n  rules: [{backendRefs: [{name: echo, port: 8080}], timeouts: {request: 1.5s}}]\n",
    );
    let c = compile_yaml(&[BASE, GATEWAY, &timed, &broken]);
    assert!(route_condition(&c, "timed", "Accepted").is_true());
    let cond = route_condition(&c, "broken", "Accepted");
    assert_eq!(
        (cond.status, cond.reason),
        (ConditionStatus::False, "UnsupportedValue")
    );
    let routes = &shared(&c).listeners[0].virtual_hosts[0].routes;
    let timeouts = |rule: u32| {
        routes
            .iter()
            .find(|r| r.source.as_ref().unwrap().rule == rule)
            .and_then(|r| r.timeouts)
            .map(|t| (t.request_ms, t.backend_request_ms))
    };
    assert_eq!(timeouts(0), Some((500, 0)));
    assert_eq!(timeouts(1), Some((60_000, 1_000)));
    assert_eq!(timeouts(2), Some((0, 0)), "0s disables");
}

#[test]
fn rule_retries_compile_and_bad_values_make_the_route_unacceptable() {
    // HTTPRouteRetry (GEP-1731, the experimental channel's field).
    let retried = route(
        "retried",
        r#"  parentRefs: [{name: edge}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /full}}]
    backendRefs: [{name: echo, port: 8080}]
    retry: {codes: [503, 500, 503], attempts: 3, backoff: 100ms}
  - matches: [{path: {type: PathPrefix, value: /defaults}}]
    backendRefs: [{name: echo, port: 8080}]
    retry: {}
  - matches: [{path: {type: PathPrefix, value: /none}}]
    backendRefs: [{name: echo, port: 8080}]
"#,
    );
    let too_many = route(
        "too-many",
        "  parentRefs: [{name: edge}]
  rules: [{backendRefs: [{name: echo, port: 8080}], retry: {attempts: 11}}]
",
    );
    let bad_code = route(
        "bad-code",
        "  parentRefs: [{name: edge}]
  rules: [{backendRefs: [{name: echo, port: 8080}], retry: {codes: [200]}}]
",
    );
    let c = compile_yaml(&[BASE, GATEWAY, &retried, &too_many, &bad_code]);
    assert!(route_condition(&c, "retried", "Accepted").is_true());
    for (name, says) in [
        ("too-many", "retry.attempts 11"),
        ("bad-code", "retry.codes: 200"),
    ] {
        let cond = route_condition(&c, name, "Accepted");
        assert_eq!(
            (cond.status, cond.reason),
            (ConditionStatus::False, "UnsupportedValue"),
            "{name}"
        );
        assert!(cond.message.contains(says), "{name}: {}", cond.message);
    }
    let routes = &shared(&c).listeners[0].virtual_hosts[0].routes;
    let retry = |rule: u32| {
        routes
            .iter()
            .find(|r| {
                r.source.as_ref().unwrap().rule == rule
                    && r.source.as_ref().unwrap().name == "retried"
            })
            .and_then(|r| r.retry.clone())
            .map(|r| (r.codes, r.attempts, r.backoff_ms, r.non_idempotent))
    };
    assert_eq!(retry(0), Some((vec![500, 503], 3, 100, false)));
    assert_eq!(
        retry(1),
        Some((
            vec![],
            crate::compile::rules::DEFAULT_RETRY_ATTEMPTS,
            0,
            false
        ))
    );
    assert_eq!(retry(2), None);
}

#[test]
fn session_persistence_compiles_and_unsupported_fields_are_refused() {
    // HTTPRoute rules[].sessionPersistence (GEP-1619, the experimental channel's field).
    let sticky = route(
        "sticky",
        r#"  parentRefs: [{name: edge}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /cart}}]
    backendRefs: [{name: echo, port: 8080}]
    sessionPersistence: {sessionName: shop, absoluteTimeout: 1h, cookieConfig: {lifetimeType: Permanent}}
  - matches: [{path: {type: PathPrefix, value: /api}}, {path: {type: PathPrefix, value: /v2}}]
    backendRefs: [{name: echo, port: 8080}]
    sessionPersistence: {type: Header, sessionName: X-Session}
  - matches: [{path: {type: PathPrefix, value: /browser}}]
    backendRefs: [{name: echo, port: 8080}]
    sessionPersistence: {absoluteTimeout: 10m, cookieConfig: {lifetimeType: Session}}
"#,
    );
    let idle = route(
        "idle",
        "  parentRefs: [{name: edge}]
  rules: [{backendRefs: [{name: echo, port: 8080}], sessionPersistence: {idleTimeout: 30m}}]
",
    );
    let bad_name = route(
        "bad-name",
        "  parentRefs: [{name: edge}]
  rules: [{backendRefs: [{name: echo, port: 8080}], sessionPersistence: {sessionName: \"a b\"}}]
",
    );
    let c = compile_yaml(&[BASE, GATEWAY, &sticky, &idle, &bad_name]);
    assert!(route_condition(&c, "sticky", "Accepted").is_true());
    for (name, says) in [("idle", "idleTimeout"), ("bad-name", "sessionName")] {
        let cond = route_condition(&c, name, "Accepted");
        assert_eq!(
            (cond.status, cond.reason),
            (ConditionStatus::False, "UnsupportedValue"),
            "{name}"
        );
        assert!(cond.message.contains(says), "{name}: {}", cond.message);
    }
    let routes = &shared(&c).listeners[0].virtual_hosts[0].routes;
    let session = |rule: u32| {
        routes
            .iter()
            .find(|r| {
                r.source.as_ref().unwrap().rule == rule
                    && r.source.as_ref().unwrap().name == "sticky"
            })
            .and_then(|r| r.session_persistence.clone())
            .map(|s| (s.kind, s.name, s.max_age_s, s.path))
    };
    let cookie = snap::session_persistence::Kind::Cookie as i32;
    let header = snap::session_persistence::Kind::Header as i32;
    assert_eq!(
        session(0),
        Some((cookie, "shop".into(), 3600, "/cart".into()))
    );
    // Two path matches: the cookie is not narrowed to one of them.
    assert_eq!(
        session(1),
        Some((header, "X-Session".into(), 0, String::new()))
    );
    // A session cookie has no Max-Age; the name defaults.
    assert_eq!(
        session(2),
        Some((
            cookie,
            crate::compile::rules::DEFAULT_SESSION_NAME.into(),
            0,
            "/browser".into()
        ))
    );
}

#[test]
fn request_mirrors_compile_with_their_share() {
    // HTTPRequestMirrorFilter: several mirrors per rule; percent and fraction (denominator
    // defaulting to 100) become a fraction, neither means every request; a mirror backend that
    // does not resolve is a ResolvedRefs problem, not a reason to drop the rule.
    let mirrored = route(
        "mirrored",
        r#"  parentRefs: [{name: edge}]
  rules:
  - filters:
    - {type: RequestMirror, requestMirror: {backendRef: {name: echo, port: 8080}}}
    - {type: RequestMirror, requestMirror: {backendRef: {name: echo, port: 8080}, fraction: {numerator: 25, denominator: 50}}}
    - {type: RequestMirror, requestMirror: {backendRef: {name: echo, port: 8080}, fraction: {numerator: 3}}}
    - {type: RequestMirror, requestMirror: {backendRef: {name: missing, port: 8080}, percent: 35}}
    backendRefs: [{name: echo, port: 8080}]
"#,
    );
    let c = compile_yaml(&[BASE, GATEWAY, &mirrored]);
    assert!(route_condition(&c, "mirrored", "Accepted").is_true());
    let resolved = route_condition(&c, "mirrored", "ResolvedRefs");
    assert_eq!(
        (resolved.status, resolved.reason),
        (ConditionStatus::False, "BackendNotFound")
    );
    let r = &shared(&c).listeners[0].virtual_hosts[0].routes[0];
    let mirrors: Vec<(&str, u32, u32)> = r
        .filters
        .iter()
        .filter_map(|f| match &f.kind {
            Some(snap::filter::Kind::RequestMirror(m)) => {
                Some((m.cluster.as_str(), m.numerator, m.denominator))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        mirrors,
        [
            ("web/echo:8080", 1, 1),
            ("web/echo:8080", 25, 50),
            ("web/echo:8080", 3, 100),
            ("", 35, 100),
        ]
    );
}

#[test]
fn cors_filters_compile_for_the_proxy_to_answer() {
    // HTTPCORSFilter: origins lower-cased, lists kept, maxAge defaulting to 5 seconds as the
    // API server does, and the origin echoed rather than "*" (what Gateway API clients expect).
    let cors = route(
        "cors",
        r#"  parentRefs: [{name: edge}]
  rules:
  - filters:
    - type: CORS
      cors:
        allowOrigins: ["https://WWW.foo.com", "https://*.bar.com"]
        allowMethods: [GET, OPTIONS]
        allowHeaders: [x-header-1]
        exposeHeaders: [x-header-3]
        allowCredentials: true
        maxAge: 3600
    backendRefs: [{name: echo, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /any}}]
    filters: [{type: CORS, cors: {allowOrigins: ["*"]}}]
    backendRefs: [{name: echo, port: 8080}]
"#,
    );
    let c = compile_yaml(&[BASE, GATEWAY, &cors]);
    assert!(route_condition(&c, "cors", "Accepted").is_true());
    let routes = &shared(&c).listeners[0].virtual_hosts[0].routes;
    let cors_of = |rule: u32| {
        let r = routes
            .iter()
            .find(|r| r.source.as_ref().unwrap().rule == rule)
            .unwrap();
        match &r.filters[0].kind {
            Some(snap::filter::Kind::Cors(c)) => c.clone(),
            other => panic!("not CORS: {other:?}"),
        }
    };
    let full = cors_of(0);
    assert_eq!(
        full.allow_origins,
        ["https://www.foo.com", "https://*.bar.com"]
    );
    assert_eq!(full.allow_methods, ["GET", "OPTIONS"]);
    assert_eq!(full.expose_headers, ["x-header-3"]);
    assert!(full.allow_credentials && full.echo_origin);
    assert_eq!(full.max_age_seconds, 3600);
    let any = cors_of(1);
    assert_eq!((any.max_age_seconds, any.allow_credentials), (5, false));
}

#[test]
fn invalid_regular_expressions_make_the_route_unacceptable() {
    // HTTPRoute: an implementation that cannot honour a match sets Accepted=False with
    // UnsupportedValue rather than serving something else.
    let bad = route(
        "bad-regex",
        "  parentRefs: [{name: edge}]\n  rules: [{matches: [{path: {type: RegularExpression, value: \"/(unclosed\"}}]}]\n",
    );
    let c = compile_yaml(&[BASE, GATEWAY, &bad]);
    let cond = route_condition(&c, "bad-regex", "Accepted");
    assert_eq!(
        (cond.status, cond.reason),
        (ConditionStatus::False, "UnsupportedValue")
    );
    assert!(
        cond.message.contains("regular expression"),
        "{}",
        cond.message
    );
    assert!(routes_for(shared(&c), 80, "any").is_empty());
}

#[test]
fn external_auth_filters_become_the_routes_authorization_service() {
    // GEP-1494: the service is a backendRef (resolved like any other, its cluster shipped with
    // the snapshot); HTTP prefixes the request's path, an empty allowedResponseHeaders copies
    // every field; GRPC with no allowedHeaders sends them all. A failure is refused (fail
    // closed), forwardBody is refused outright since the body is never sent, and a service
    // that does not resolve is a ResolvedRefs problem the proxy answers 503 for.
    let authed = route(
        "authed",
        r#"  parentRefs: [{name: edge}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /http}}]
    filters:
    - type: ExternalAuth
      externalAuth:
        protocol: HTTP
        backendRef: {name: echo, port: 8080}
        http: {path: /check, allowedHeaders: [X-Tenant], allowedResponseHeaders: [X-User]}
    backendRefs: [{name: echo, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /grpc}}]
    filters:
    - {type: ExternalAuth, externalAuth: {protocol: GRPC, backendRef: {name: echo, port: 8080}}}
    backendRefs: [{name: echo, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /missing}}]
    filters:
    - {type: ExternalAuth, externalAuth: {protocol: HTTP, backendRef: {name: nowhere, port: 80}}}
    backendRefs: [{name: echo, port: 8080}]
"#,
    );
    let body = route(
        "body",
        r#"  parentRefs: [{name: edge}]
  rules:
  - filters:
    - {type: ExternalAuth, externalAuth: {protocol: HTTP, backendRef: {name: echo, port: 8080}, forwardBody: {maxSize: 1024}}}
    backendRefs: [{name: echo, port: 8080}]
"#,
    );
    let c = compile_yaml(&[BASE, GATEWAY, &authed, &body]);
    assert!(route_condition(&c, "authed", "Accepted").is_true());
    let resolved = route_condition(&c, "authed", "ResolvedRefs");
    assert_eq!(
        (resolved.status, resolved.reason),
        (ConditionStatus::False, "BackendNotFound")
    );
    let refused = route_condition(&c, "body", "Accepted");
    assert_eq!(
        (refused.status, refused.reason),
        (ConditionStatus::False, "UnsupportedValue")
    );
    assert!(
        refused.message.contains("forwardBody"),
        "{}",
        refused.message
    );
    let s = shared(&c);
    assert_eq!(s.requires, [snap::feature::EXTERNAL_AUTH]);
    let auth_of = |rule: u32| {
        s.listeners[0].virtual_hosts[0]
            .routes
            .iter()
            .find(|r| {
                let src = r.source.as_ref().unwrap();
                src.name == "authed" && src.rule == rule
            })
            .and_then(|r| r.external_auth.clone())
            .unwrap()
    };
    let http = auth_of(0);
    assert_eq!(http.protocol, snap::external_auth::Protocol::Http as i32);
    assert_eq!(http.cluster, "web/echo:8080");
    assert_eq!((http.path.as_str(), http.path_is_prefix), ("/check", true));
    assert_eq!(http.request_fields, ["x-tenant"]);
    assert_eq!(http.response_fields, ["x-user"]);
    assert!(!http.all_response_fields && !http.all_request_fields);
    assert_eq!(http.failure_status, 503);
    let grpc = auth_of(1);
    assert_eq!(grpc.protocol, snap::external_auth::Protocol::Grpc as i32);
    assert!(grpc.all_request_fields);
    let missing = auth_of(2);
    assert_eq!(
        missing.cluster, "",
        "nothing to ask: the proxy refuses with 503"
    );
    assert!(s.clusters.iter().any(|c| c.name == "web/echo:8080"));
}
