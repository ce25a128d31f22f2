//! TLS listeners and TLSRoutes: passthrough by SNI, route kinds per protocol, TLS modes per
//! port.

use super::fixtures::*;
use crate::compile::status::{Condition, ConditionStatus};
use crate::compile::*;
use coxswain_api::snapshot as snap;

const TLS_GATEWAY: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: tls, namespace: web, generation: 1}
spec:
  gatewayClassName: coxswain
  listeners:
  - {name: pass, port: 443, protocol: TLS, hostname: "*.example.com", tls: {mode: Passthrough}}
  - {name: terminate, port: 8443, protocol: TLS, hostname: t.example.com, tls: {mode: Terminate, certificateRefs: [{name: cert}]}}
  - {name: http, port: 80, protocol: HTTP}
"#;

#[test]
fn tls_passthrough_listeners_serve_tls_routes_by_sni() {
    let route = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {name: db, namespace: web, generation: 3}
spec:
  parentRefs: [{name: tls}]
  hostnames: [db.example.com, db.other.org]
  rules: [{backendRefs: [{name: echo, port: 8080}]}]
"#;
    let c = compile_yaml(&[BASE, TLS_GATEWAY, route]);
    let status = &c.status.gateways[&key("web", "tls")];
    let listener = |name: &str| status.listeners.iter().find(|l| l.name == name).unwrap();
    // Passthrough: accepted, serves TLSRoutes only; the route attached there alone.
    let pass = listener("pass");
    assert_eq!(
        pass.supported_kinds
            .iter()
            .map(|k| k.kind.as_str())
            .collect::<Vec<_>>(),
        ["TLSRoute"]
    );
    assert_eq!(pass.attached_routes, 1);
    assert_eq!(listener("http").attached_routes, 0);
    // Terminating TLS listeners are not served: Accepted=False UnsupportedValue, no kinds.
    let terminate = find(&listener("terminate").conditions, "Accepted");
    assert_eq!(
        (terminate.status, terminate.reason),
        (ConditionStatus::False, "UnsupportedValue")
    );
    assert!(listener("terminate").supported_kinds.is_empty());

    let parents = &c.status.tls_routes[&key("web", "db")];
    let accepted = find(&parents[0].conditions, "Accepted");
    assert_eq!(
        (accepted.status, accepted.observed_generation),
        (ConditionStatus::True, 3)
    );

    let snapshot = &c.snapshots[&ScopeKey::SharedPool];
    let l = snapshot.listeners.iter().find(|l| l.port == 443).unwrap();
    assert_eq!(l.protocol, snap::Protocol::TlsPassthrough as i32);
    assert!(l.certificates.is_empty());
    // Only the hostname inside the listener's *.example.com is served.
    let hosts: Vec<&str> = l
        .virtual_hosts
        .iter()
        .map(|v| v.hostname.as_str())
        .collect();
    assert_eq!(hosts, ["*.example.com", "db.example.com"]);
    let db = &l.virtual_hosts[1].routes[0];
    assert_eq!(db.source.as_ref().unwrap().kind, "TLSRoute");
    assert_eq!(db.backends[0].cluster, "web/echo:8080");
    assert!(snapshot.listeners.iter().all(|l| l.port != 8443));
}

#[test]
fn route_kinds_stay_on_listeners_of_their_protocol() {
    let routes = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {name: on-http, namespace: web}
spec:
  parentRefs: [{name: tls, sectionName: http}]
  hostnames: [db.example.com]
  rules: [{backendRefs: [{name: echo, port: 8080}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: on-tls, namespace: web}
spec:
  parentRefs: [{name: tls, sectionName: pass}]
  rules: [{backendRefs: [{name: echo, port: 8080}]}]
"#;
    let c = compile_yaml(&[BASE, TLS_GATEWAY, routes]);
    let reason = |cond: &Condition| (cond.status, cond.reason);
    assert_eq!(
        reason(find(
            &c.status.tls_routes[&key("web", "on-http")][0].conditions,
            "Accepted"
        )),
        (ConditionStatus::False, "NotAllowedByListeners")
    );
    assert_eq!(
        reason(find(
            &c.status.http_routes[&key("web", "on-tls")][0].conditions,
            "Accepted"
        )),
        (ConditionStatus::False, "NotAllowedByListeners")
    );
}

#[test]
fn terminating_and_passthrough_tls_listeners_cannot_share_a_port() {
    let gateway = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: mixed, namespace: web}
spec:
  gatewayClassName: coxswain
  listeners:
  - {name: terminate, port: 8443, protocol: TLS, hostname: t.example.com, tls: {mode: Terminate, certificateRefs: [{name: cert}]}}
  - {name: pass, port: 8443, protocol: TLS, hostname: p.example.com, tls: {mode: Passthrough}}
"#;
    let c = compile_yaml(&[BASE, gateway]);
    for listener in ["terminate", "pass"] {
        let accepted = listener_condition(&c, "mixed", listener, "Accepted");
        assert_eq!(
            (accepted.status, accepted.reason),
            (ConditionStatus::False, "ProtocolConflict"),
            "{listener}: {accepted:?}"
        );
        let conflicted = listener_condition(&c, "mixed", listener, "Conflicted");
        assert_eq!(conflicted.status, ConditionStatus::True);
    }
    assert!(shared(&c).listeners.iter().all(|l| l.port != 8443));
}
