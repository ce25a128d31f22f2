//! GRPCRoutes: method paths, HTTP/2 backends, listener kinds, ReferenceGrants, precedence, and
//! hostnames shared with HTTPRoutes.

use super::fixtures::*;
use crate::compile::status::ConditionStatus;
use crate::compile::*;
use coxswain_api::snapshot::{self as snap, path_match};

const GRPC_ROUTE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: rpc, namespace: web, generation: 4}
spec:
  parentRefs: [{name: edge}]
  hostnames: [grpc.example.com]
  rules:
  - name: echo
    matches: [{method: {service: pkg.Echo, method: Say}}]
    backendRefs: [{name: echo, port: 8080}]
  - matches: [{headers: [{name: Version, value: two}]}]
    filters:
    - type: ResponseHeaderModifier
      responseHeaderModifier: {set: [{name: x-via, value: coxswain}]}
    backendRefs: [{name: echo, port: 8080}]
"#;

#[test]
fn grpc_routes_compile_to_http2_routes_on_the_method_path() {
    // GRPCRoute: a method match is the path /service/method, backends speak HTTP/2.
    let c = compile_yaml(&[BASE, GATEWAY, GRPC_ROUTE]);
    let parents = &c.status.grpc_routes[&key("web", "rpc")];
    assert_eq!(parents.len(), 1, "{parents:?}");
    for type_ in ["Accepted", "ResolvedRefs"] {
        let cond = find(&parents[0].conditions, type_);
        assert_eq!(cond.status, ConditionStatus::True, "{cond:?}");
        assert_eq!(cond.observed_generation, 4);
    }
    assert!(c.status.http_routes.is_empty());
    // Counted with the listener's attached routes like any route.
    let listener = &c.status.gateways[&key("web", "edge")].listeners[0];
    assert_eq!(listener.attached_routes, 1);

    let s = shared(&c);
    let l = s.listeners.iter().find(|l| l.port == 80).unwrap();
    let vhost = l
        .virtual_hosts
        .iter()
        .find(|v| v.hostname == "grpc.example.com")
        .unwrap();
    let exact = vhost
        .routes
        .iter()
        .find(|r| r.source.as_ref().unwrap().rule == 0)
        .unwrap();
    let source = exact.source.as_ref().unwrap();
    assert_eq!(
        (source.kind.as_str(), source.rule_name.as_str()),
        ("GRPCRoute", "echo")
    );
    let path = exact.r#match.as_ref().unwrap().path.as_ref().unwrap();
    assert_eq!(path.kind, path_match::Kind::Exact as i32);
    assert_eq!(path.value, "/pkg.Echo/Say");
    let by_header = vhost
        .routes
        .iter()
        .find(|r| r.source.as_ref().unwrap().rule == 1)
        .unwrap();
    let m = by_header.r#match.as_ref().unwrap();
    assert_eq!(m.headers[0].name, "version");
    assert_eq!(m.path.as_ref().unwrap().value, "/");
    assert_eq!(by_header.filters.len(), 1);

    // The Service port has no appProtocol: the GRPCRoute's cluster is HTTP/2 all the same.
    let cluster = &exact.backends[0].cluster;
    assert_eq!(cluster, "web/echo:8080/h2c");
    let c = s.clusters.iter().find(|c| &c.name == cluster).unwrap();
    assert_eq!(c.app_protocol, snap::AppProtocol::H2c as i32);
}

#[test]
fn an_http_route_to_the_same_port_keeps_http1() {
    let http = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: web}
spec:
  parentRefs: [{name: edge}]
  hostnames: [www.example.com]
  rules: [{backendRefs: [{name: echo, port: 8080}]}]
"#;
    let c = compile_yaml(&[BASE, GATEWAY, GRPC_ROUTE, http]);
    let protocols: Vec<(String, i32)> = shared(&c)
        .clusters
        .iter()
        .map(|c| (c.name.clone(), c.app_protocol))
        .collect();
    assert_eq!(
        protocols,
        vec![
            ("web/echo:8080".to_owned(), snap::AppProtocol::Http1 as i32),
            (
                "web/echo:8080/h2c".to_owned(),
                snap::AppProtocol::H2c as i32
            ),
        ]
    );
    assert_eq!(
        c.status.gateways[&key("web", "edge")].listeners[0].attached_routes,
        2
    );
}

#[test]
fn listeners_admit_grpc_routes_only_when_their_kinds_allow() {
    // Listener allowedRoutes.kinds narrows what attaches; supportedKinds lists both by default.
    let gateway = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: web, generation: 2}
spec:
  gatewayClassName: coxswain
  listeners:
  - {name: http, port: 80, protocol: HTTP, allowedRoutes: {kinds: [{kind: HTTPRoute}]}}
  - {name: both, port: 8080, protocol: HTTP}
"#;
    let only_http = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: rpc, namespace: web}
spec:
  parentRefs: [{name: edge, sectionName: http}]
  rules: [{backendRefs: [{name: echo, port: 8080}]}]
"#;
    let c = compile_yaml(&[BASE, gateway, only_http]);
    let status = &c.status.gateways[&key("web", "edge")];
    let kinds = |name: &str| -> Vec<String> {
        status
            .listeners
            .iter()
            .find(|l| l.name == name)
            .unwrap()
            .supported_kinds
            .iter()
            .map(|k| k.kind.clone())
            .collect()
    };
    assert_eq!(kinds("http"), ["HTTPRoute"]);
    assert_eq!(kinds("both"), ["HTTPRoute", "GRPCRoute"]);
    let accepted = find(
        &c.status.grpc_routes[&key("web", "rpc")][0].conditions,
        "Accepted",
    );
    assert_eq!(
        (accepted.status, accepted.reason),
        (ConditionStatus::False, "NotAllowedByListeners")
    );
    assert!(
        accepted.message.contains("GRPCRoutes"),
        "{}",
        accepted.message
    );
}

#[test]
fn grpc_routes_need_a_reference_grant_for_their_own_kind() {
    // ReferenceGrant: a grant from HTTPRoute does not admit a GRPCRoute.
    let cross = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: rpc, namespace: other}
spec:
  parentRefs: [{name: edge, namespace: web}]
  rules: [{backendRefs: [{name: echo, namespace: web, port: 8080}]}]
"#;
    let gateway = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: web}
spec:
  gatewayClassName: coxswain
  listeners: [{name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}]
"#;
    let grant = |kind: &str| {
        format!(
            r#"
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {{name: allow, namespace: web}}
spec:
  from: [{{group: gateway.networking.k8s.io, kind: {kind}, namespace: other}}]
  to: [{{group: "", kind: Service}}]
"#
        )
    };
    let resolved = |c: &Compiled| {
        let cond = find(
            &c.status.grpc_routes[&key("other", "rpc")][0].conditions,
            "ResolvedRefs",
        );
        (cond.status, cond.reason)
    };
    let http_grant = grant("HTTPRoute");
    let c = compile_yaml(&[BASE, gateway, cross, &http_grant]);
    assert_eq!(resolved(&c), (ConditionStatus::False, "RefNotPermitted"));
    let grpc_grant = grant("GRPCRoute");
    let c = compile_yaml(&[BASE, gateway, cross, &grpc_grant]);
    assert_eq!(resolved(&c), (ConditionStatus::True, "ResolvedRefs"));
}

#[test]
fn an_invalid_grpc_method_pattern_makes_the_route_unacceptable() {
    let bad = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: rpc, namespace: web}
spec:
  parentRefs: [{name: edge}]
  rules:
  - matches: [{method: {type: RegularExpression, method: "Say("}}]
    backendRefs: [{name: echo, port: 8080}]
"#;
    let c = compile_yaml(&[BASE, GATEWAY, bad]);
    let accepted = find(
        &c.status.grpc_routes[&key("web", "rpc")][0].conditions,
        "Accepted",
    );
    assert_eq!(
        (accepted.status, accepted.reason),
        (ConditionStatus::False, "UnsupportedValue")
    );
    assert!(
        shared(&c).listeners[0]
            .virtual_hosts
            .iter()
            .all(|v| v.routes.is_empty())
    );
}

#[test]
fn an_http_route_and_a_grpc_route_never_share_a_hostname_on_a_listener() {
    // GRPCRoute spec: of an HTTPRoute and a GRPCRoute on one listener with intersecting
    // hostnames, exactly one is accepted: the oldest, then the first by namespace/name.
    let route = |kind: &str, name: &str, created: &str, hosts: &str| {
        format!(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: {kind}
metadata: {{name: {name}, namespace: web, creationTimestamp: "{created}"}}
spec:
  parentRefs: [{{name: edge}}]
  hostnames: {hosts}
  rules: [{{backendRefs: [{{name: echo, port: 8080}}]}}]
"#
        )
    };
    let grpc = route(
        "GRPCRoute",
        "rpc",
        "2026-01-01T00:00:00Z",
        "[api.example.com]",
    );
    let wild = route(
        "HTTPRoute",
        "wild",
        "2026-02-01T00:00:00Z",
        "['*.example.com']",
    );
    let other = route(
        "HTTPRoute",
        "other",
        "2026-02-01T00:00:00Z",
        "[www.example.com]",
    );
    let c = compile_yaml(&[BASE, GATEWAY, &grpc, &wild, &other]);
    let accepted = |map: &status::StatusMap, name: &str| {
        let cond = find(&map[&key("web", name)][0].conditions, "Accepted");
        (cond.status, cond.reason, cond.message.clone())
    };
    assert_eq!(
        accepted(&c.status.grpc_routes, "rpc").0,
        ConditionStatus::True
    );
    let (status, reason, message) = accepted(&c.status.http_routes, "wild");
    assert_eq!(
        (status, reason),
        (ConditionStatus::False, "NotAllowedByListeners")
    );
    assert!(message.contains("GRPCRoute web/rpc"), "{message}");
    // No shared hostname: both kinds live side by side.
    assert_eq!(
        accepted(&c.status.http_routes, "other").0,
        ConditionStatus::True
    );
    assert_eq!(
        c.status.gateways[&key("web", "edge")].listeners[0].attached_routes,
        2
    );
    assert!(routes_for(shared(&c), 80, "x.example.com").is_empty());

    // The older one wins whatever its kind.
    let older_http = route(
        "HTTPRoute",
        "wild",
        "2025-12-01T00:00:00Z",
        "['*.example.com']",
    );
    let c = compile_yaml(&[BASE, GATEWAY, &grpc, &older_http]);
    assert_eq!(
        accepted(&c.status.http_routes, "wild").0,
        ConditionStatus::True
    );
    assert_eq!(
        accepted(&c.status.grpc_routes, "rpc").1,
        "NotAllowedByListeners"
    );
}

#[test]
fn grpc_rules_rank_by_service_then_method_then_headers() {
    // GRPCRoute precedence: a match naming the service outranks one naming only the method,
    // which outranks one with only headers, whatever the rule order.
    let route = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: rpc, namespace: web}
spec:
  parentRefs: [{name: edge}]
  rules:
  - matches: [{headers: [{name: a, value: "1"}, {name: b, value: "2"}]}]
    backendRefs: [{name: echo, port: 8080}]
  - matches: [{method: {method: Say}}]
    backendRefs: [{name: echo, port: 8080}]
  - matches: [{method: {type: RegularExpression, service: "pkg\\..*"}}]
    backendRefs: [{name: echo, port: 8080}]
  - matches: [{method: {service: pkg.Echo, method: Say}}]
    backendRefs: [{name: echo, port: 8080}]
"#;
    let c = compile_yaml(&[BASE, GATEWAY, route]);
    let l = &shared(&c).listeners[0];
    let order: Vec<u32> = l.virtual_hosts[0]
        .routes
        .iter()
        .map(|r| r.source.as_ref().unwrap().rule)
        .collect();
    assert_eq!(order, [3, 2, 1, 0]);
}
