//! TLS listeners and TLSRoutes: passthrough and termination by SNI, route kinds per protocol,
//! both TLS modes on one port.

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

/// A certificate "cert" in namespace web (PEM blocks the compiler passes on unparsed).
const CERT: &str = r#"
apiVersion: v1
kind: Secret
metadata: {name: cert, namespace: web}
type: kubernetes.io/tls
data:
  tls.crt: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=
  tls.key: LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCk1JSUUKLS0tLS1FTkQgUFJJVkFURSBLRVktLS0tLQo=
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
    let c = compile_yaml(&[BASE, CERT, TLS_GATEWAY, route]);
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
    // The terminating listener serves TLSRoutes too; no hostname of this route is its own.
    let terminate = listener("terminate");
    assert_eq!(
        terminate
            .supported_kinds
            .iter()
            .map(|k| k.kind.as_str())
            .collect::<Vec<_>>(),
        ["TLSRoute"]
    );
    assert_eq!(terminate.attached_routes, 0);
    for type_ in ["Accepted", "ResolvedRefs"] {
        let cond = find(&terminate.conditions, type_);
        assert_eq!(cond.status, ConditionStatus::True, "{cond:?}");
    }

    let parents = &c.status.tls_routes[&key("web", "db")];
    let accepted = find(&parents[0].conditions, "Accepted");
    assert_eq!(
        (accepted.status, accepted.observed_generation),
        (ConditionStatus::True, 3)
    );

    let snapshot = &c.snapshots[&ScopeKey::SharedPool];
    let l = snapshot.listeners.iter().find(|l| l.port == 443).unwrap();
    assert_eq!(l.protocol, snap::Protocol::Tls as i32);
    assert!(l.certificates.is_empty());
    // Only the hostname inside the listener's *.example.com is served.
    let hosts: Vec<&str> = l
        .virtual_hosts
        .iter()
        .map(|v| v.hostname.as_str())
        .collect();
    assert_eq!(hosts, ["*.example.com", "db.example.com"]);
    assert!(l.virtual_hosts.iter().all(|v| !v.terminate_tls));
    let db = &l.virtual_hosts[1].routes[0];
    assert_eq!(db.source.as_ref().unwrap().kind, "TLSRoute");
    assert_eq!(db.backends[0].cluster, "web/echo:8080");
    // The terminating port holds its listener's host, with the certificate to end TLS with.
    let t = snapshot.listeners.iter().find(|l| l.port == 8443).unwrap();
    assert_eq!(t.protocol, snap::Protocol::Tls as i32);
    assert_eq!(
        t.virtual_hosts
            .iter()
            .map(|v| (v.hostname.as_str(), v.terminate_tls))
            .collect::<Vec<_>>(),
        [("t.example.com", true)]
    );
    assert_eq!(
        t.certificates
            .iter()
            .map(|c| c.sni.as_str())
            .collect::<Vec<_>>(),
        ["t.example.com"]
    );
    assert_eq!(snapshot.requires, [snap::feature::TLS_TERMINATE]);
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
fn terminating_and_passthrough_tls_listeners_share_a_port_by_hostname() {
    let gateway = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: mixed, namespace: web}
spec:
  gatewayClassName: coxswain
  listeners:
  - {name: terminate, port: 8443, protocol: TLS, hostname: t.example.com, tls: {mode: Terminate, certificateRefs: [{name: cert}]}}
  - {name: pass, port: 8443, protocol: TLS, hostname: "*.example.com", tls: {mode: Passthrough}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {name: both, namespace: web}
spec:
  parentRefs: [{name: mixed}]
  hostnames: [t.example.com, p.example.com]
  rules: [{backendRefs: [{name: echo, port: 8080}]}]
"#;
    let c = compile_yaml(&[BASE, CERT, gateway]);
    for listener in ["terminate", "pass"] {
        for (type_, status) in [
            ("Accepted", ConditionStatus::True),
            ("ResolvedRefs", ConditionStatus::True),
            ("Conflicted", ConditionStatus::False),
        ] {
            let cond = listener_condition(&c, "mixed", listener, type_);
            assert_eq!(cond.status, status, "{listener}: {cond:?}");
        }
    }
    let l = shared(&c)
        .listeners
        .iter()
        .find(|l| l.port == 8443)
        .unwrap();
    // t.example.com belongs to the more specific terminating listener, even though the
    // passthrough wildcard covers it too; p.example.com is passed through.
    assert_eq!(
        l.virtual_hosts
            .iter()
            .map(|v| (v.hostname.as_str(), v.terminate_tls, v.routes.len()))
            .collect::<Vec<_>>(),
        [
            ("*.example.com", false, 0),
            ("p.example.com", false, 1),
            ("t.example.com", true, 1)
        ]
    );
    assert_eq!(
        l.certificates
            .iter()
            .map(|c| c.sni.as_str())
            .collect::<Vec<_>>(),
        ["t.example.com"]
    );
}

#[test]
fn tls_listeners_on_one_port_still_conflict_by_hostname_and_with_https() {
    let gateway = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: mixed, namespace: web}
spec:
  gatewayClassName: coxswain
  listeners:
  - {name: terminate, port: 8443, protocol: TLS, hostname: t.example.com, tls: {mode: Terminate, certificateRefs: [{name: cert}]}}
  - {name: pass, port: 8443, protocol: TLS, hostname: t.example.com, tls: {mode: Passthrough}}
  - {name: tls, port: 9443, protocol: TLS, hostname: a.example.com, tls: {mode: Terminate, certificateRefs: [{name: cert}]}}
  - {name: https, port: 9443, protocol: HTTPS, hostname: b.example.com, tls: {certificateRefs: [{name: cert}]}}
"#;
    let c = compile_yaml(&[BASE, CERT, gateway]);
    for (listener, reason) in [
        ("terminate", "HostnameConflict"),
        ("pass", "HostnameConflict"),
        ("tls", "ProtocolConflict"),
        ("https", "ProtocolConflict"),
    ] {
        let conflicted = listener_condition(&c, "mixed", listener, "Conflicted");
        assert_eq!(
            (conflicted.status, conflicted.reason),
            (ConditionStatus::True, reason),
            "{listener}: {conflicted:?}"
        );
    }
    assert!(
        shared(&c)
            .listeners
            .iter()
            .all(|l| l.port != 8443 && l.port != 9443)
    );
}

#[test]
fn a_terminating_tls_listener_without_a_certificate_is_not_programmed() {
    let gateway = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: nocert, namespace: web}
spec:
  gatewayClassName: coxswain
  listeners:
  - {name: terminate, port: 8443, protocol: TLS, hostname: t.example.com}
"#;
    let c = compile_yaml(&[BASE, gateway]);
    let resolved = listener_condition(&c, "nocert", "terminate", "ResolvedRefs");
    assert_eq!(
        (resolved.status, resolved.reason),
        (ConditionStatus::False, "InvalidCertificateRef")
    );
    assert!(
        resolved.message.contains("tls.certificateRefs"),
        "{resolved:?}"
    );
    let programmed = listener_condition(&c, "nocert", "terminate", "Programmed");
    assert_eq!(programmed.status, ConditionStatus::False);
    assert!(shared(&c).listeners.iter().all(|l| l.port != 8443));
}
