//! TCP and UDP listeners with TCPRoutes and UDPRoutes: no names to go by, so a port serves its
//! route's backends as connections (or UDP flows) come.

use super::fixtures::*;
use crate::compile::status::ConditionStatus;
use coxswain_api::snapshot as snap;

const TCP_GATEWAY: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: l4, namespace: web, generation: 1}
spec:
  gatewayClassName: coxswain
  listeners:
  - {name: db, port: 5432, protocol: TCP, hostname: ignored.example.com}
  - {name: http, port: 80, protocol: HTTP}
---
apiVersion: v1
kind: Service
metadata: {name: replica, namespace: web}
spec:
  ports: [{name: pg, port: 5432, targetPort: 5432}]
"#;

#[test]
fn a_tcp_route_serves_its_port_with_weighted_backends() {
    let route = r#"
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: {name: db, namespace: web, generation: 4}
spec:
  parentRefs: [{name: l4, sectionName: db}]
  rules:
  - backendRefs: [{name: echo, port: 8080, weight: 3}, {name: replica, port: 5432, weight: 1}]
"#;
    let c = compile_yaml(&[BASE, TCP_GATEWAY, route]);
    let status = &c.status.gateways[&key("web", "l4")];
    let db = status.listeners.iter().find(|l| l.name == "db").unwrap();
    assert_eq!(
        db.supported_kinds
            .iter()
            .map(|k| k.kind.as_str())
            .collect::<Vec<_>>(),
        ["TCPRoute"]
    );
    assert_eq!(db.attached_routes, 1);
    let parents = &c.status.tcp_routes[&key("web", "db")];
    for type_ in ["Accepted", "ResolvedRefs"] {
        let cond = find(&parents[0].conditions, type_);
        assert_eq!(
            (cond.status, cond.observed_generation),
            (ConditionStatus::True, 4),
            "{cond:?}"
        );
    }

    let l = shared(&c)
        .listeners
        .iter()
        .find(|l| l.port == 5432)
        .unwrap();
    assert_eq!(l.protocol, snap::Protocol::Tcp as i32);
    assert!(l.certificates.is_empty());
    // The listener's hostname does not narrow a TCP port: one host, "", holds the route.
    assert_eq!(l.virtual_hosts.len(), 1);
    assert_eq!(l.virtual_hosts[0].hostname, "");
    let r = &l.virtual_hosts[0].routes[0];
    assert_eq!(r.source.as_ref().unwrap().kind, "TCPRoute");
    assert_eq!(
        r.backends
            .iter()
            .map(|b| (b.cluster.as_str(), b.weight))
            .collect::<Vec<_>>(),
        [("web/echo:8080", 3), ("web/replica:5432", 1)]
    );
}

#[test]
fn tcp_routes_and_http_routes_keep_to_listeners_of_their_protocol() {
    let routes = r#"
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: {name: on-http, namespace: web}
spec:
  parentRefs: [{name: l4, sectionName: http}]
  rules: [{backendRefs: [{name: echo, port: 8080}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: on-tcp, namespace: web}
spec:
  parentRefs: [{name: l4, sectionName: db}]
  rules: [{backendRefs: [{name: echo, port: 8080}]}]
"#;
    let c = compile_yaml(&[BASE, TCP_GATEWAY, routes]);
    let tcp = find(
        &c.status.tcp_routes[&key("web", "on-http")][0].conditions,
        "Accepted",
    );
    assert_eq!(
        (tcp.status, tcp.reason),
        (ConditionStatus::False, "NotAllowedByListeners")
    );
    let http = route_condition(&c, "on-tcp", "Accepted");
    assert_eq!(
        (http.status, http.reason),
        (ConditionStatus::False, "NotAllowedByListeners")
    );
}

#[test]
fn tcp_listeners_on_one_port_conflict_whatever_their_hostnames() {
    let gateway = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: twice, namespace: web}
spec:
  gatewayClassName: coxswain
  listeners:
  - {name: a, port: 9000, protocol: TCP, hostname: a.example.com}
  - {name: b, port: 9000, protocol: TCP, hostname: b.example.com}
"#;
    let c = compile_yaml(&[BASE, gateway]);
    for listener in ["a", "b"] {
        let conflicted = listener_condition(&c, "twice", listener, "Conflicted");
        assert_eq!(
            (conflicted.status, conflicted.reason),
            (ConditionStatus::True, "HostnameConflict"),
            "{listener}: {conflicted:?}"
        );
    }
    assert!(shared(&c).listeners.iter().all(|l| l.port != 9000));
}

#[test]
fn a_tcp_route_to_a_missing_service_reports_backend_not_found() {
    let route = r#"
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: {name: lost, namespace: web}
spec:
  parentRefs: [{name: l4}]
  rules: [{backendRefs: [{name: nowhere, port: 5432}]}]
"#;
    let c = compile_yaml(&[BASE, TCP_GATEWAY, route]);
    let parents = &c.status.tcp_routes[&key("web", "lost")];
    let resolved = find(&parents[0].conditions, "ResolvedRefs");
    assert_eq!(
        (resolved.status, resolved.reason),
        (ConditionStatus::False, "BackendNotFound")
    );
}

#[test]
fn a_udp_route_serves_its_port_and_udp_cannot_share_a_port_with_tcp() {
    let docs = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: dns, namespace: web, generation: 1}
spec:
  gatewayClassName: coxswain
  listeners:
  - {name: udp, port: 5353, protocol: UDP}
  - {name: clash-udp, port: 6000, protocol: UDP}
  - {name: clash-tcp, port: 6000, protocol: TCP}
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: UDPRoute
metadata: {name: resolver, namespace: web, generation: 2}
spec:
  parentRefs: [{name: dns, sectionName: udp}]
  rules: [{backendRefs: [{name: echo, port: 8080}]}]
"#;
    let c = compile_yaml(&[BASE, docs]);
    let parents = &c.status.udp_routes[&key("web", "resolver")];
    for type_ in ["Accepted", "ResolvedRefs"] {
        let cond = find(&parents[0].conditions, type_);
        assert_eq!(cond.status, ConditionStatus::True, "{cond:?}");
    }
    let l = shared(&c)
        .listeners
        .iter()
        .find(|l| l.port == 5353)
        .unwrap();
    assert_eq!(l.protocol, snap::Protocol::Udp as i32);
    assert_eq!(l.virtual_hosts.len(), 1);
    assert_eq!(l.virtual_hosts[0].hostname, "");
    assert_eq!(
        l.virtual_hosts[0].routes[0].source.as_ref().unwrap().kind,
        "UDPRoute"
    );
    // One port, one protocol: TCP and UDP on 6000 conflict.
    for listener in ["clash-udp", "clash-tcp"] {
        let conflicted = listener_condition(&c, "dns", listener, "Conflicted");
        assert_eq!(
            (conflicted.status, conflicted.reason),
            (ConditionStatus::True, "ProtocolConflict"),
            "{listener}"
        );
    }
    assert!(shared(&c).listeners.iter().all(|l| l.port != 6000));
}
