//! Shared Gateways with Services of their own (`--shared-gateway-ports`): each gets internal
//! ports on the shared proxies, so Gateways on one listener port stay apart.

use super::fixtures::*;
use crate::compile::gateway_services::{PortRange, Transport};
use crate::compile::*;
use coxswain_api::snapshot as snap;

fn compile_ports(range: (u16, u16), docs: &[&str]) -> Compiled {
    let config = Config {
        shared_gateway_ports: Some(PortRange {
            first: range.0,
            last: range.1,
        }),
        ..Config::default()
    };
    compile(&load(docs), &config)
}

/// A shared Gateway `name` with an HTTP listener on port 80 for `app.example`, and an
/// HTTPRoute of the same name sending `/` to echo.
fn gateway_and_route(name: &str) -> String {
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: {name}, namespace: web, generation: 1}}
spec:
  gatewayClassName: coxswain
  listeners:
  - {{name: http, port: 80, protocol: HTTP, hostname: app.example}}
  - {{name: dns, port: 53, protocol: UDP}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: web, generation: 1}}
spec:
  parentRefs: [{{name: {name}}}]
  rules: [{{backendRefs: [{{name: echo, port: 8080}}]}}]
"#
    )
}

/// A Service the controller made for Gateway web/`gateway`, holding `internal` for port 80.
fn existing_service(gateway: &str, internal: u16) -> String {
    format!(
        r#"
apiVersion: v1
kind: Service
metadata:
  name: {gateway}-web-00000000
  namespace: coxswain-system
  labels: {{app.kubernetes.io/component: gateway-service}}
  annotations: {{gateway.coxswain-labs.dev/gateway: web/{gateway}}}
spec:
  ports: [{{name: tcp-80, port: 80, targetPort: {internal}, protocol: TCP}}]
"#
    )
}

fn listener(s: &snap::Snapshot, port: u32) -> &snap::Listener {
    s.listeners
        .iter()
        .find(|l| l.port == port)
        .unwrap_or_else(|| panic!("no listener on {port}: {:?}", s.listeners))
}

#[test]
fn two_shared_gateways_on_port_80_with_one_hostname_get_ports_of_their_own() {
    let (a, b) = (gateway_and_route("a"), gateway_and_route("b"));
    let c = compile_ports((20000, 20009), &[BASE, &a, &b]);
    let sa = &c.gateway_services.services[&key("web", "a")];
    let sb = &c.gateway_services.services[&key("web", "b")];
    assert_eq!(
        sa.name,
        coxswain_api::names::shared_gateway_service_name("web", "a")
    );
    assert_ne!(sa.name, sb.name);
    let ports = |s: &gateway_services::GatewayService| {
        s.ports
            .iter()
            .map(|p| (p.port, p.transport, p.internal))
            .collect::<Vec<_>>()
    };
    // Gateways in key order, their ports in (port, transport) order.
    assert_eq!(
        ports(sa),
        [(53, Transport::Udp, 20000), (80, Transport::Tcp, 20001)]
    );
    assert_eq!(
        ports(sb),
        [(53, Transport::Udp, 20002), (80, Transport::Tcp, 20003)]
    );

    let s = shared(&c);
    assert!(
        s.listeners.iter().all(|l| l.port != 80 && l.port != 53),
        "no Gateway listens on the pool's own ports: {:?}",
        s.listeners.iter().map(|l| l.port).collect::<Vec<_>>()
    );
    for (port, route) in [(20001, "a/0"), (20003, "b/0")] {
        let l = listener(s, port);
        assert_eq!(l.public_port, 80, "clients know the port as 80");
        assert_eq!(routes_for(s, port, "app.example"), [route], "port {port}");
        assert_eq!(l.sources.len(), 1, "{:?}", l.sources);
    }
    assert_eq!(listener(s, 20000).public_port, 53);
    assert_eq!(
        listener(s, 20000).protocol,
        snap::Protocol::Udp as i32,
        "UDP keeps its protocol on its internal port"
    );
    assert!(
        s.requires.contains(&snap::feature::PUBLIC_PORT.to_owned()),
        "{:?}",
        s.requires
    );
}

#[test]
fn internal_ports_are_kept_and_a_deleted_gateways_port_is_not_reused_while_its_service_lives() {
    let (a, b) = (gateway_and_route("a"), gateway_and_route("b"));
    // Gateway b holds 20000 from an earlier compile; Gateway "gone" was deleted, but its
    // Service still holds 20001.
    let kept = existing_service("b", 20000);
    let gone = existing_service("gone", 20001);
    let c = compile_ports((20000, 20009), &[BASE, &a, &b, &kept, &gone]);
    let internal = |gw: &str, port: u32| {
        c.gateway_services.services[&key("web", gw)]
            .ports
            .iter()
            .find(|p| p.port == port)
            .map(|p| p.internal)
    };
    assert_eq!(internal("b", 80), Some(20000), "b keeps its port");
    assert_eq!(
        (internal("a", 53), internal("a", 80)),
        (Some(20002), Some(20003)),
        "a new pair takes the lowest port no Service holds"
    );
    assert_eq!(internal("b", 53), Some(20004));
    assert!(
        !c.gateway_services
            .services
            .contains_key(&key("web", "gone"))
    );

    // The same objects in another order give the same allocation and snapshot.
    let again = compile_ports((20000, 20009), &[&gone, &kept, &b, &a, BASE]);
    assert_eq!(shared(&again).version, shared(&c).version);
}

#[test]
fn a_full_range_leaves_the_gateway_unassigned_and_unserved_and_says_why() {
    let (a, b) = (gateway_and_route("a"), gateway_and_route("b"));
    let c = compile_ports((20000, 20002), &[BASE, &a, &b]);
    assert_eq!(c.gateway_services.services[&key("web", "a")].ports.len(), 2);
    let why = &c.gateway_services.unassigned[&key("web", "b")];
    assert!(
        why.contains("20000-20002") && why.contains("--shared-gateway-ports"),
        "{why}"
    );
    // b got one of its two ports; the other listener serves nothing rather than share.
    let b_service = &c.gateway_services.services[&key("web", "b")];
    assert_eq!(b_service.ports.len(), 1);
    let s = shared(&c);
    assert!(
        s.listeners
            .iter()
            .all(|l| l.sources.iter().all(|src| !src.contains("web/b/http"))),
        "b's HTTP listener has no internal port and is not served: {:?}",
        s.listeners.iter().map(|l| &l.sources).collect::<Vec<_>>()
    );
}

#[test]
fn the_ingress_ports_and_dedicated_gateways_stay_as_they_are() {
    let params = r#"
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainGatewayParameters
metadata: {name: own, namespace: web}
spec: {}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: dedicated, namespace: web, generation: 1}
spec:
  gatewayClassName: coxswain
  infrastructure: {parametersRef: {group: gateway.coxswain-labs.dev, kind: CoxswainGatewayParameters, name: own}}
  listeners: [{name: http, port: 8080, protocol: HTTP}]
"#;
    let ing = ingress(
        "site",
        "",
        "  ingressClassName: coxswain\n  rules: [{host: site.example, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: echo, port: {number: 8080}}}}]}}]",
    );
    let a = gateway_and_route("a");
    // An Ingress port inside the range is never handed to a Gateway.
    let config = Config {
        shared_gateway_ports: Some(PortRange {
            first: 20000,
            last: 20009,
        }),
        ingress_http_port: 20000,
        ..Config::default()
    };
    let c = compile(&load(&[BASE, INGRESS_CLASS, &ing, params, &a]), &config);
    assert!(
        !c.gateway_services
            .services
            .contains_key(&key("web", "dedicated"))
    );
    let s = shared(&c);
    assert_eq!(listener(s, 20000).sources, ["Ingress"]);
    assert_eq!(listener(s, 20000).public_port, 0);
    assert_eq!(
        c.gateway_services.services[&key("web", "a")].ports[0].internal,
        20001
    );
    let dedicated = &c.snapshots[&ScopeKey::Gateway(key("web", "dedicated"))];
    assert_eq!(listener(dedicated, 8080).public_port, 0);
    assert!(
        !dedicated
            .requires
            .contains(&snap::feature::PUBLIC_PORT.to_owned())
    );
}

#[test]
fn a_shared_gateway_with_its_own_service_may_ask_for_an_address() {
    let gw = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: fixed, namespace: web, generation: 1}
spec:
  gatewayClassName: coxswain
  addresses: [{value: 10.97.3.250}]
  infrastructure: {labels: {team: web}, annotations: {note: hello}}
  listeners: [{name: http, port: 80, protocol: HTTP}]
"#;
    let c = compile_ports((20000, 20009), &[BASE, gw]);
    let status = &c.status.gateways[&key("web", "fixed")];
    assert!(find(&status.conditions, "Accepted").is_true());
    let service = &c.gateway_services.services[&key("web", "fixed")];
    assert_eq!(
        service.addresses,
        ["10.97.3.250".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(service.labels["team"], "web");
    assert_eq!(service.annotations["note"], "hello");
}

#[test]
fn port_ranges_parse_or_say_what_is_wrong() {
    assert_eq!("20000-29999".parse::<PortRange>(), Ok(PortRange::DEFAULT));
    for bad in ["20000", "a-b", "80-90", "30000-20000", "20000-70000"] {
        let err = bad.parse::<PortRange>().unwrap_err().to_string();
        assert!(err.contains(bad), "{bad}: {err}");
    }
}

#[test]
fn two_services_claiming_one_port_leave_it_to_one_gateway_and_move_the_other() {
    // Gateway a's Service was applied holding 20000; before its watch event arrived, a pass
    // gave 20000 to b, and b's Service was applied too.
    let (a, b) = (gateway_and_route("a"), gateway_and_route("b"));
    let c = compile_ports(
        (20000, 20009),
        &[
            BASE,
            &a,
            &b,
            &existing_service("a", 20000),
            &existing_service("b", 20000),
        ],
    );
    let internal = |gw: &str| {
        c.gateway_services.services[&key("web", gw)]
            .ports
            .iter()
            .find(|p| p.port == 80)
            .map(|p| p.internal)
    };
    assert_eq!(
        internal("a"),
        Some(20000),
        "the first in key order keeps it"
    );
    let moved = internal("b").expect("b gets a port");
    assert_ne!(moved, 20000, "b is moved off the port a holds");
    // Both are served, each on a port of its own (`listener` fails on a missing one).
    listener(shared(&c), 20000);
    listener(shared(&c), moved);
}
