//! Fixture-driven tests of the compiler. Each fixture is the YAML a user would apply; each test
//! names the Gateway API (or Ingress) rule it checks.

use super::status::{Condition, ConditionStatus, ObjectKey};
use super::*;
use coxswain_api::snapshot::{self as snap, Route, Snapshot, path_match};
use std::path::Path;

/// A GatewayClass of ours, and a Service "echo" (port 8080, two endpoints) in namespace web.
const BASE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: coxswain, generation: 1}
spec: {controllerName: coxswain-labs.dev/gateway-controller}
---
apiVersion: v1
kind: Namespace
metadata: {name: web, labels: {team: web}}
---
apiVersion: v1
kind: Namespace
metadata: {name: other}
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: web}
spec:
  ports: [{name: http, port: 8080, targetPort: 3000}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: echo-1
  namespace: web
  labels: {kubernetes.io/service-name: echo}
addressType: IPv4
ports: [{name: http, port: 3000}]
endpoints:
- addresses: [10.1.0.2]
  conditions: {ready: true}
- addresses: [10.1.0.1]
  conditions: {ready: false, serving: true, terminating: true}
"#;

const GATEWAY: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: web, generation: 2}
spec:
  gatewayClassName: coxswain
  listeners:
  - {name: http, port: 80, protocol: HTTP}
"#;

fn compile_yaml(docs: &[&str]) -> Compiled {
    let mut store = Store::default();
    let mut errors = Vec::new();
    for d in docs {
        store.load_yaml(Path::new("fixture.yaml"), d, &mut errors);
    }
    assert!(errors.is_empty(), "{errors:?}");
    compile(&store, &Config::default())
}

fn shared(c: &Compiled) -> &Snapshot {
    &c.snapshots[&ScopeKey::SharedPool]
}

fn key(ns: &str, name: &str) -> ObjectKey {
    ObjectKey::new(ns, name)
}

fn find<'a>(conditions: &'a [Condition], type_: &str) -> &'a Condition {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {conditions:?}"))
}

fn route_condition<'a>(c: &'a Compiled, route: &str, type_: &str) -> &'a Condition {
    let parents = &c.status.http_routes[&key("web", route)];
    assert_eq!(parents.len(), 1, "{parents:?}");
    find(&parents[0].conditions, type_)
}

fn listener_condition<'a>(c: &'a Compiled, gw: &str, listener: &str, type_: &str) -> &'a Condition {
    let status = &c.status.gateways[&key("web", gw)];
    let l = status
        .listeners
        .iter()
        .find(|l| l.name == listener)
        .unwrap();
    find(&l.conditions, type_)
}

/// Routes of the vhost a request for `host` lands on, on `port`, as "route/rule" strings.
fn routes_for(s: &Snapshot, port: u32, host: &str) -> Vec<String> {
    let l = s.listeners.iter().find(|l| l.port == port).unwrap();
    // The proxy's choice (snapshot.proto, VirtualHost): exact, then the longest covering
    // wildcard (a single-label one only for a host one label above its suffix, and before the
    // multi-label one of the same name), then "".
    let one_label_above = |suffix: &str| {
        host.split_once('.')
            .is_some_and(|(_, parent)| parent.eq_ignore_ascii_case(suffix))
    };
    let mut candidates: Vec<&snap::VirtualHost> = l
        .virtual_hosts
        .iter()
        .filter(|v| match v.hostname.strip_prefix("*.") {
            Some(suffix) if v.single_label => one_label_above(suffix),
            _ => v.hostname.is_empty() || hostname::covers(&v.hostname, host),
        })
        .collect();
    candidates.sort_by(|a, b| {
        hostname::specificity(&a.hostname, &b.hostname).then(b.single_label.cmp(&a.single_label))
    });
    let Some(chosen) = candidates.first() else {
        return vec![];
    };
    chosen.routes.iter().map(describe).collect()
}

fn describe(r: &Route) -> String {
    let s = r.source.as_ref().unwrap();
    format!("{}/{}", s.name, s.rule)
}

fn route(name: &str, body: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: web, generation: 3}}\nspec:\n{body}"
    )
}

#[test]
fn gateway_class_acceptance_follows_controller_name() {
    // GatewayClass: a controller accepts only classes whose controllerName is its own.
    let other = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: someone-else}
spec: {controllerName: example.com/other}
"#;
    let c = compile_yaml(&[BASE, other]);
    assert!(find(&c.status.gateway_classes["coxswain"], "Accepted").is_true());
    assert!(!c.status.gateway_classes.contains_key("someone-else"));
}

#[test]
fn gateway_classes_report_the_installed_gateway_api_version() {
    let mut store = Store::default();
    let mut errors = Vec::new();
    store.load_yaml(Path::new("fixture.yaml"), BASE, &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    let with = |version: &str| {
        let config = Config {
            gateway_api_version: Some(version.to_owned()),
            ..Config::default()
        };
        compile(&store, &config).status.gateway_classes["coxswain"].clone()
    };
    let ok = with("v1.5.1");
    assert!(find(&ok, "SupportedVersion").is_true());
    assert!(find(&ok, "Accepted").is_true());
    let old = with("v1.2.0");
    let (supported, accepted) = (find(&old, "SupportedVersion"), find(&old, "Accepted"));
    assert_eq!(
        (supported.status, supported.reason),
        (ConditionStatus::False, "UnsupportedVersion")
    );
    assert_eq!(
        (accepted.status, accepted.reason),
        (ConditionStatus::False, "UnsupportedVersion")
    );
    assert!(
        supported.message.contains("v1.2.0"),
        "{}",
        supported.message
    );
    // Unknown (no CRD annotation read): no claim either way.
    let unknown = compile(&store, &Config::default()).status.gateway_classes["coxswain"].clone();
    assert!(unknown.iter().all(|c| c.type_ != "SupportedVersion"));
    assert!(super::gateway::supported_gateway_api("v1.4.0-rc.1"));
    assert!(!super::gateway::supported_gateway_api("garbage"));
}

#[test]
fn gateway_class_with_missing_parameters_is_not_accepted() {
    let class = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: dedicated}
spec:
  controllerName: coxswain-labs.dev/gateway-controller
  parametersRef: {group: gateway.coxswain-labs.dev, kind: CoxswainGatewayParameters, name: nope, namespace: web}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: web}
spec:
  gatewayClassName: dedicated
  listeners: [{name: http, port: 80, protocol: HTTP}]
"#;
    let c = compile_yaml(&[BASE, class]);
    let cond = find(&c.status.gateway_classes["dedicated"], "Accepted");
    assert_eq!(
        (cond.status, cond.reason),
        (ConditionStatus::False, "InvalidParameters")
    );
    assert!(cond.message.contains("web/nope"), "{}", cond.message);
    let gw = find(
        &c.status.gateways[&key("web", "edge")].conditions,
        "Accepted",
    );
    assert_eq!(gw.status, ConditionStatus::False);
}

#[test]
fn parameters_ref_gives_a_gateway_its_own_scope() {
    let yaml = r#"
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainGatewayParameters
metadata: {name: big, namespace: web}
spec: {replicas: 3}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: dedicated, namespace: web}
spec:
  gatewayClassName: coxswain
  infrastructure:
    parametersRef: {group: gateway.coxswain-labs.dev, kind: CoxswainGatewayParameters, name: big}
  listeners: [{name: http, port: 8080, protocol: HTTP}]
"#;
    let c = compile_yaml(&[BASE, GATEWAY, yaml]);
    let scope = ScopeKey::Gateway(key("web", "dedicated"));
    let dedicated = &c.snapshots[&scope];
    assert_eq!(
        dedicated
            .listeners
            .iter()
            .map(|l| l.port)
            .collect::<Vec<_>>(),
        [8080]
    );
    assert_eq!(
        shared(&c)
            .listeners
            .iter()
            .map(|l| l.port)
            .collect::<Vec<_>>(),
        [80]
    );
    assert!(c.status.gateways[&key("web", "dedicated")].dedicated);
    assert!(dedicated.is_sealed() && shared(&c).is_sealed());
}

fn dedicated_gateway_with_addresses(name: &str, addresses: &str) -> String {
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: {name}, namespace: web, generation: 4}}
spec:
  gatewayClassName: coxswain
  infrastructure:
    parametersRef: {{group: gateway.coxswain-labs.dev, kind: CoxswainGatewayParameters, name: big}}
  addresses: {addresses}
  listeners: [{{name: http, port: 8080, protocol: HTTP}}]
"#
    )
}

// Gateway API, GatewaySpec.addresses: an address of a type the implementation does not
// support makes the Gateway Accepted=False with reason UnsupportedAddress. Coxswain takes
// IPAddress entries, on a dedicated proxy only (the shared pool's address is everyone's).
#[test]
fn gateway_addresses_are_ip_addresses_on_a_dedicated_proxy() {
    let params = r#"
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainGatewayParameters
metadata: {name: big, namespace: web}
spec: {}
"#;
    let fixed = dedicated_gateway_with_addresses(
        "fixed",
        "[{type: IPAddress, value: 10.97.3.250}, {value: '2001:db8::1'}, {type: IPAddress}]",
    );
    let hostname =
        dedicated_gateway_with_addresses("hostname", "[{type: Hostname, value: lb.example}]");
    let fake = dedicated_gateway_with_addresses(
        "fake",
        "[{type: test/fake-invalid-type, value: 'fake address'}, {value: 10.97.3.250}]",
    );
    let not_ip = dedicated_gateway_with_addresses("not-ip", "[{value: 10.97.3.999}]");
    let shared_gw = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: shared, namespace: web, generation: 1}
spec:
  gatewayClassName: coxswain
  addresses: [{value: 10.97.3.250}]
  listeners: [{name: http, port: 80, protocol: HTTP}]
"#;
    let c = compile_yaml(&[BASE, params, &fixed, &hostname, &fake, &not_ip, shared_gw]);
    let status = &c.status.gateways[&key("web", "fixed")];
    assert!(find(&status.conditions, "Accepted").is_true());
    let programmed = find(&status.conditions, "Programmed");
    assert_eq!(programmed.reason, "Pending");
    assert_eq!(
        status.requested_addresses,
        [
            "10.97.3.250".parse::<std::net::IpAddr>().unwrap(),
            "2001:db8::1".parse().unwrap()
        ]
    );
    assert!(
        c.snapshots
            .contains_key(&ScopeKey::Gateway(key("web", "fixed")))
    );
    for (name, says) in [
        ("hostname", "type \"Hostname\""),
        ("fake", "type \"test/fake-invalid-type\""),
        ("not-ip", "not an IP address"),
        ("shared", "needs a dedicated proxy"),
    ] {
        let status = &c.status.gateways[&key("web", name)];
        let accepted = find(&status.conditions, "Accepted");
        assert_eq!(
            (accepted.status, accepted.reason),
            (ConditionStatus::False, "UnsupportedAddress"),
            "{name}"
        );
        assert!(
            accepted.message.contains(says),
            "{name}: {}",
            accepted.message
        );
        assert_eq!(
            accepted.observed_generation,
            if name == "shared" { 1 } else { 4 }
        );
        assert_eq!(
            find(&status.conditions, "Programmed").status,
            ConditionStatus::False
        );
        assert!(status.requested_addresses.is_empty());
    }
}

#[test]
fn listeners_sharing_a_port_conflict_on_protocol_or_hostname() {
    // Gateway API Listener: same port needs compatible protocols (ProtocolConflict) and
    // distinct hostnames (HostnameConflict).
    let gw = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: web}
spec:
  gatewayClassName: coxswain
  listeners:
  - {name: a, port: 80, protocol: HTTP, hostname: a.example.com}
  - {name: b, port: 80, protocol: HTTP, hostname: a.example.com}
  - {name: c, port: 443, protocol: HTTP}
  - {name: d, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: missing}]}}
  - {name: e, port: 80, protocol: HTTP, hostname: b.example.com}
"#;
    let c = compile_yaml(&[BASE, gw]);
    assert_eq!(
        listener_condition(&c, "edge", "a", "Conflicted").reason,
        "HostnameConflict"
    );
    assert_eq!(
        listener_condition(&c, "edge", "b", "Conflicted").reason,
        "HostnameConflict"
    );
    assert_eq!(
        listener_condition(&c, "edge", "c", "Conflicted").reason,
        "ProtocolConflict"
    );
    assert_eq!(
        listener_condition(&c, "edge", "d", "Conflicted").reason,
        "ProtocolConflict"
    );
    let e = listener_condition(&c, "edge", "e", "Conflicted");
    assert_eq!(
        (e.status, e.reason),
        (ConditionStatus::False, "NoConflicts")
    );
    let gw = find(
        &c.status.gateways[&key("web", "edge")].conditions,
        "Accepted",
    );
    assert_eq!(
        (gw.status, gw.reason),
        (ConditionStatus::True, "ListenersNotValid")
    );
    // Only the unconflicted listener is served.
    let l = &shared(&c).listeners;
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].sources, ["Gateway/web/edge/e"]);
}

#[test]
fn unsupported_protocols_and_route_kinds_are_reported_on_the_listener() {
    let gw = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: web}
spec:
  gatewayClassName: coxswain
  listeners:
  - {name: tcp, port: 9000, protocol: TCP}
  - name: kinds
    port: 80
    protocol: HTTP
    allowedRoutes: {kinds: [{kind: HTTPRoute}, {kind: TCPRoute}]}
"#;
    let c = compile_yaml(&[BASE, gw]);
    let tcp = listener_condition(&c, "edge", "tcp", "Accepted");
    assert_eq!(
        (tcp.status, tcp.reason),
        (ConditionStatus::False, "UnsupportedProtocol")
    );
    // ListenerConditionResolvedRefs: InvalidRouteKinds, and supportedKinds lists only the
    // kinds that are supported.
    let kinds = listener_condition(&c, "edge", "kinds", "ResolvedRefs");
    assert_eq!(
        (kinds.status, kinds.reason),
        (ConditionStatus::False, "InvalidRouteKinds")
    );
    let status = &c.status.gateways[&key("web", "edge")];
    let l = status.listeners.iter().find(|l| l.name == "kinds").unwrap();
    assert_eq!(l.supported_kinds.len(), 1);
    assert_eq!(l.supported_kinds[0].kind, "HTTPRoute");
    let gw = find(&status.conditions, "Accepted");
    assert_eq!(
        (gw.status, gw.reason),
        (ConditionStatus::False, "ListenersNotValid")
    );
}

const TLS_SECRET: &str = r#"
apiVersion: v1
kind: Secret
metadata: {name: cert, namespace: certs}
type: kubernetes.io/tls
stringData:
  tls.crt: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
  tls.key: "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"
"#;

fn https_gateway(cert_ns: &str) -> String {
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: secure, namespace: web}}
spec:
  gatewayClassName: coxswain
  listeners:
  - name: https
    port: 443
    protocol: HTTPS
    hostname: "*.example.com"
    tls: {{certificateRefs: [{{name: cert, namespace: {cert_ns}}}]}}
"#
    )
}

#[test]
fn routes_attach_to_a_listener_with_unresolved_certificates_but_are_not_served() {
    // The spec counts attachedRoutes regardless of the listener's own ResolvedRefs; such a
    // listener still serves nothing.
    let gw = https_gateway("web").replace("name: cert,", "name: does-not-exist,");
    let route = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: attached, namespace: web}
spec:
  parentRefs: [{name: secure, sectionName: https}]
  hostnames: [app.example.com]
  rules: [{backendRefs: [{name: missing, port: 8080}]}]
"#;
    let c = compile_yaml(&[BASE, &gw, route]);
    let resolved = listener_condition(&c, "secure", "https", "ResolvedRefs");
    assert_eq!(resolved.status, ConditionStatus::False);
    let programmed = listener_condition(&c, "secure", "https", "Programmed");
    assert_eq!(programmed.status, ConditionStatus::False);
    let listener = &c.status.gateways[&key("web", "secure")].listeners[0];
    assert_eq!(listener.attached_routes, 1);
    assert_eq!(
        route_condition(&c, "attached", "ResolvedRefs").status,
        ConditionStatus::False
    );
    assert!(
        shared(&c).listeners.is_empty(),
        "an unprogrammed listener gets no port"
    );
}

/// TLS_SECRET as the API server stores it: stringData, which kubectl accepts, becomes data.
fn tls_secret_as_stored() -> String {
    TLS_SECRET
        .replace("stringData:", "data:")
        .replace(
            "\"-----BEGIN CERTIFICATE-----\\nMIIB\\n-----END CERTIFICATE-----\\n\"",
            "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=",
        )
        .replace(
            "\"-----BEGIN PRIVATE KEY-----\\nMIIE\\n-----END PRIVATE KEY-----\\n\"",
            "LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCk1JSUUKLS0tLS1FTkQgUFJJVkFURSBLRVktLS0tLQo=",
        )
}

#[test]
fn https_certificate_refs_resolve_only_with_a_reference_grant() {
    let secret = tls_secret_as_stored();
    let gw = https_gateway("certs");
    // ReferenceGrant: a Gateway may use a Secret in another namespace only when a grant in the
    // Secret's namespace allows it.
    let c = compile_yaml(&[BASE, &gw, &secret]);
    let cond = listener_condition(&c, "secure", "https", "ResolvedRefs");
    assert_eq!(
        (cond.status, cond.reason),
        (ConditionStatus::False, "RefNotPermitted")
    );
    assert!(shared(&c).listeners.is_empty());

    let grant = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: ReferenceGrant
metadata: {name: gateways-may-use-certs, namespace: certs}
spec:
  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: web}]
  to: [{group: "", kind: Secret}]
"#;
    let c = compile_yaml(&[BASE, &gw, &secret, grant]);
    assert!(listener_condition(&c, "secure", "https", "ResolvedRefs").is_true());
    let s = shared(&c);
    assert_eq!(s.listeners[0].certificates.len(), 1);
    assert_eq!(s.listeners[0].certificates[0].sni, "*.example.com");
    assert_eq!(s.certificates[0].name, "certs/cert");
    assert!(
        s.certificates[0]
            .cert_chain_pem
            .contains("BEGIN CERTIFICATE")
    );

    // A missing Secret is an InvalidCertificateRef.
    let c = compile_yaml(&[BASE, &https_gateway("web")]);
    let cond = listener_condition(&c, "secure", "https", "ResolvedRefs");
    assert_eq!(cond.reason, "InvalidCertificateRef");
}

#[test]
fn https_ports_list_their_gateway_listeners_hostnames_for_misdirected_requests() {
    // Four listeners on 443 (as the conformance suite's misdirected-requests Gateway): the
    // proxy answers 421 when a request's Host selects another of them than its SNI did.
    let secret = tls_secret_as_stored().replace("namespace: certs", "namespace: web");
    let gw = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: secure, namespace: web}
spec:
  gatewayClassName: coxswain
  listeners:
  - {name: any, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: cert}]}}
  - {name: second, port: 443, protocol: HTTPS, hostname: second.example, tls: {certificateRefs: [{name: cert}]}}
  - {name: wild, port: 443, protocol: HTTPS, hostname: "*.wild.example", tls: {certificateRefs: [{name: cert}]}}
  - {name: plain, port: 80, protocol: HTTP}
"#;
    let c = compile_yaml(&[BASE, gw, &secret]);
    let s = shared(&c);
    let port = |p: u32| s.listeners.iter().find(|l| l.port == p).unwrap();
    assert_eq!(
        port(443).listener_hostnames,
        vec!["", "*.wild.example", "second.example"]
    );
    assert!(
        s.listeners
            .iter()
            .filter(|l| l.port != 443)
            .all(|l| l.listener_hostnames.is_empty()),
        "HTTP has no SNI"
    );
}

#[test]
fn allowed_routes_namespaces_same_all_and_selector() {
    let gw = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: other}
spec:
  gatewayClassName: coxswain
  listeners:
  - {name: same, port: 80, protocol: HTTP, hostname: same.example.com}
  - name: all
    port: 80
    protocol: HTTP
    hostname: all.example.com
    allowedRoutes: {namespaces: {from: All}}
  - name: selected
    port: 80
    protocol: HTTP
    hostname: selected.example.com
    allowedRoutes: {namespaces: {from: Selector, selector: {matchLabels: {team: web}}}}
  - name: not-selected
    port: 80
    protocol: HTTP
    hostname: nope.example.com
    allowedRoutes: {namespaces: {from: Selector, selector: {matchLabels: {team: ops}}}}
"#;
    let r = |section: &str| {
        route(
            &format!("r-{section}"),
            &format!(
                "  parentRefs: [{{name: edge, namespace: other, sectionName: {section}}}]\n  rules: [{{backendRefs: [{{name: echo, port: 8080}}]}}]\n"
            ),
        )
    };
    let (same, all, selected, not_selected) =
        (r("same"), r("all"), r("selected"), r("not-selected"));
    let c = compile_yaml(&[BASE, gw, &same, &all, &selected, &not_selected]);
    assert_eq!(
        route_condition(&c, "r-same", "Accepted").reason,
        "NotAllowedByListeners"
    );
    assert!(route_condition(&c, "r-all", "Accepted").is_true());
    assert!(route_condition(&c, "r-selected", "Accepted").is_true());
    assert_eq!(
        route_condition(&c, "r-not-selected", "Accepted").reason,
        "NotAllowedByListeners"
    );
    let listeners = &c.status.gateways[&key("other", "edge")].listeners;
    let attached: Vec<i32> = listeners.iter().map(|l| l.attached_routes).collect();
    assert_eq!(attached, [0, 1, 1, 0]);
}

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
        Some((vec![], super::rules::DEFAULT_RETRY_ATTEMPTS, 0, false))
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
            super::rules::DEFAULT_SESSION_NAME.into(),
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
fn snapshots_do_not_depend_on_input_order() {
    let r1 = route(
        "r1",
        "  parentRefs: [{name: edge}]\n  hostnames: [a.example]\n  rules: [{backendRefs: [{name: echo, port: 8080}]}]\n",
    );
    let r2 = route(
        "r2",
        "  parentRefs: [{name: edge}]\n  rules: [{matches: [{path: {value: /x}}], backendRefs: [{name: echo, port: 8080}]}]\n",
    );
    let forward = compile_yaml(&[BASE, GATEWAY, &r1, &r2]);
    let backward = compile_yaml(&[&r2, &r1, GATEWAY, BASE]);
    use prost::Message;
    assert_eq!(
        shared(&forward).encode_to_vec(),
        shared(&backward).encode_to_vec()
    );
    assert_eq!(shared(&forward).version, shared(&backward).version);
    assert_eq!(forward.status, backward.status);
}

const INGRESS_CLASS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: coxswain
  annotations: {ingressclass.kubernetes.io/is-default-class: "true"}
spec:
  controller: coxswain-labs.dev/gateway-controller
  parameters: {apiGroup: ingress.coxswain-labs.dev, kind: CoxswainIngressClassParameters, name: defaults, namespace: web, scope: Namespace}
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: nginx}
spec: {controller: k8s.io/ingress-nginx}
"#;

fn ingress(name: &str, class: &str, spec: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: web{class}}}\nspec:\n{spec}"
    )
}

#[test]
fn ingresses_of_our_class_become_routes() {
    let spec = r#"  rules:
  - host: shop.example
    http:
      paths:
      - {path: /cart, pathType: Exact, backend: {service: {name: echo, port: {name: http}}}}
      - {path: /, pathType: Prefix, backend: {service: {name: echo, port: {number: 8080}}}}
  defaultBackend: {service: {name: echo, port: {number: 8080}}}
"#;
    let by_name = ingress(
        "by-name",
        "",
        &format!("  ingressClassName: coxswain\n{spec}"),
    );
    let legacy = ingress(
        "legacy",
        ", annotations: {kubernetes.io/ingress.class: coxswain}",
        "  rules: [{host: legacy.example, http: {paths: [{path: /, pathType: ImplementationSpecific, backend: {service: {name: echo, port: {number: 8080}}}}]}}]\n",
    );
    let default = ingress(
        "default",
        "",
        "  rules: [{host: default.example, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: echo, port: {number: 8080}}}}]}}]\n",
    );
    let nginx = ingress(
        "nginx",
        "",
        "  ingressClassName: nginx\n  rules: [{host: nginx.example, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: echo, port: {number: 8080}}}}]}}]\n",
    );
    let broken = ingress(
        "broken",
        "",
        "  ingressClassName: coxswain\n  rules: [{host: broken.example, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: gone, port: {number: 80}}}}]}}]\n",
    );
    let c = compile_yaml(&[
        BASE,
        INGRESS_CLASS,
        &by_name,
        &legacy,
        &default,
        &nginx,
        &broken,
    ]);
    let s = shared(&c);
    assert_eq!(s.listeners.len(), 1);
    assert_eq!(s.listeners[0].port, 80);
    let hosts: Vec<&str> = s.listeners[0]
        .virtual_hosts
        .iter()
        .map(|v| v.hostname.as_str())
        .collect();
    assert_eq!(
        hosts,
        [
            "",
            "broken.example",
            "default.example",
            "legacy.example",
            "shop.example"
        ]
    );
    // Exact /cart before Prefix /, and the default backend last.
    let shop = routes_for(s, 80, "shop.example");
    assert_eq!(shop, ["by-name/0", "by-name/1", "by-name/4294967295"]);
    // Hosts without a rule of their own get the default backend.
    assert_eq!(routes_for(s, 80, "unknown.example"), ["by-name/4294967295"]);
    let vhost = s.listeners[0]
        .virtual_hosts
        .iter()
        .find(|v| v.hostname == "shop.example")
        .unwrap();
    let kinds: Vec<i32> = vhost
        .routes
        .iter()
        .map(|r| r.r#match.as_ref().unwrap().path.as_ref().unwrap().kind)
        .collect();
    assert_eq!(
        kinds,
        [
            path_match::Kind::Exact as i32,
            path_match::Kind::Prefix as i32,
            path_match::Kind::Prefix as i32
        ]
    );
    assert!(!c.status.ingresses.contains_key(&key("web", "nginx")));
    assert!(
        c.status.ingresses[&key("web", "by-name")]
            .problems
            .is_empty()
    );
    let problems = &c.status.ingresses[&key("web", "broken")].problems;
    assert_eq!(problems, &["Service web/gone not found"]);
    let broken_route = &s.listeners[0].virtual_hosts[1].routes[0];
    assert_eq!(broken_route.direct_status, 500);
}

#[test]
fn class_default_annotations_sit_under_the_ingress_own() {
    let params = r#"
apiVersion: ingress.coxswain-labs.dev/v1alpha1
kind: CoxswainIngressClassParameters
metadata: {name: defaults, namespace: web}
spec:
  defaultAnnotations: {ingress.coxswain-labs.dev/read-timeout: 30s, ingress.coxswain-labs.dev/ssl-redirect: "true"}
"#;
    let ing = ingress(
        "mine",
        ", annotations: {ingress.coxswain-labs.dev/read-timeout: 5s}",
        "  ingressClassName: coxswain\n",
    );
    let mut store = Store::default();
    let mut errors = Vec::new();
    for d in [BASE, INGRESS_CLASS, params, &ing] {
        store.load_yaml(Path::new("f.yaml"), d, &mut errors);
    }
    let effective =
        ingress::effective_annotations(&store, &store.ingress_classes[0], &store.ingresses[0]);
    assert_eq!(effective["ingress.coxswain-labs.dev/read-timeout"], "5s");
    assert_eq!(effective["ingress.coxswain-labs.dev/ssl-redirect"], "true");
}

#[test]
fn malformed_objects_are_reported_and_the_rest_compiles() {
    let bad = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: broken, namespace: web}
spec: {rules: "not a list"}
---
: not yaml [
"#;
    let mut store = Store::default();
    let mut errors = Vec::new();
    for d in [BASE, GATEWAY, bad] {
        store.load_yaml(Path::new("input.yaml"), d, &mut errors);
    }
    let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    assert!(
        text.iter()
            .any(|e| e.starts_with("input.yaml: HTTPRoute broken:")),
        "{text:?}"
    );
    let c = compile(&store, &Config::default());
    assert_eq!(shared(&c).listeners.len(), 1);
}

#[test]
fn ingress_tls_hosts_get_their_certificates_on_the_https_port() {
    let secret = r#"
apiVersion: v1
kind: Secret
metadata: {name: shop-tls, namespace: web}
type: kubernetes.io/tls
data:
  tls.crt: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=
  tls.key: LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCk1JSUUKLS0tLS1FTkQgUFJJVkFURSBLRVktLS0tLQo=
---
apiVersion: v1
kind: Secret
metadata: {name: opaque, namespace: web}
type: Opaque
"#;
    let tls = ingress(
        "tls",
        "",
        "  ingressClassName: coxswain\n  tls: [{hosts: [shop.example], secretName: shop-tls}, {hosts: [bad.example], secretName: opaque}]\n  rules: [{host: shop.example, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: echo, port: {number: 8080}}}}]}}]\n",
    );
    let c = compile_yaml(&[BASE, INGRESS_CLASS, secret, &tls]);
    let s = shared(&c);
    let ports: Vec<(u32, i32)> = s.listeners.iter().map(|l| (l.port, l.protocol)).collect();
    assert_eq!(
        ports,
        [
            (80, snap::Protocol::Http as i32),
            (443, snap::Protocol::Https as i32)
        ]
    );
    let https = &s.listeners[1];
    assert_eq!(https.certificates.len(), 1);
    assert_eq!(
        (
            https.certificates[0].sni.as_str(),
            https.certificates[0].certificate.as_str()
        ),
        ("shop.example", "web/shop-tls")
    );
    assert_eq!(routes_for(s, 443, "shop.example"), ["tls/0"]);
    let problems = &c.status.ingresses[&key("web", "tls")].problems;
    assert_eq!(problems.len(), 1);
    assert!(
        problems[0].contains("not kubernetes.io/tls"),
        "{problems:?}"
    );
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

// === Ingress annotations compiled into routes ===

// Ingress API, IngressRule.host: "*.foo.com" matches "bar.foo.com" because they share an
// identical suffix of one DNS label, but not "baz.bar.foo.com" (the Gateway API's wildcards
// cover one or more labels; an Ingress's exactly one).
#[test]
fn ingress_wildcard_host_matches_exactly_one_label() {
    let wild = ingress(
        "wild",
        "",
        "  ingressClassName: coxswain\n  rules: [{host: '*.foo.com', http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: echo, port: {number: 8080}}}}]}}]\n  defaultBackend: {service: {name: echo, port: {number: 8080}}}\n",
    );
    let deep = ingress(
        "deep",
        "",
        "  ingressClassName: coxswain\n  rules: [{host: baz.bar.foo.com, http: {paths: [{path: /deep, pathType: Prefix, backend: {service: {name: echo, port: {number: 8080}}}}]}}, {host: '*.bar.foo.com', http: {paths: [{path: /sub, pathType: Prefix, backend: {service: {name: echo, port: {number: 8080}}}}]}}]\n",
    );
    let c = compile_yaml(&[BASE, INGRESS_CLASS, &wild, &deep]);
    let s = shared(&c);
    assert_eq!(
        routes_for(s, 80, "bar.foo.com"),
        ["wild/0", "wild/4294967295"]
    );
    assert_eq!(
        routes_for(s, 80, "BAR.foo.com"),
        ["wild/0", "wild/4294967295"]
    );
    // Two labels above foo.com: not the wildcard's, so the default backend answers.
    assert_eq!(routes_for(s, 80, "qux.baz.foo.com"), ["wild/4294967295"]);
    assert_eq!(routes_for(s, 80, "foo.com"), ["wild/4294967295"]);
    // A host of its own, or under a deeper wildcard, does not inherit "*.foo.com" rules.
    assert_eq!(
        routes_for(s, 80, "baz.bar.foo.com"),
        ["deep/0", "deep/1000", "wild/4294967295"]
    );
    assert_eq!(
        routes_for(s, 80, "qux.bar.foo.com"),
        ["deep/1000", "wild/4294967295"]
    );
    assert_eq!(routes_for(s, 80, "a.qux.bar.foo.com"), ["wild/4294967295"]);
    let wildcards: Vec<(&str, bool)> = s.listeners[0]
        .virtual_hosts
        .iter()
        .filter(|v| v.hostname.starts_with("*."))
        .map(|v| (v.hostname.as_str(), v.single_label))
        .collect();
    assert_eq!(wildcards, [("*.bar.foo.com", true), ("*.foo.com", true)]);
}

// The shared pool's port 80 serves Ingresses and Gateways alike: on one wildcard name, an
// HTTPRoute keeps the Gateway API rule (one or more labels) while the Ingress beside it
// covers one label only.
#[test]
fn ingress_and_httproute_wildcards_on_one_port_keep_their_own_rules() {
    let wild = ingress(
        "wild",
        "",
        "  ingressClassName: coxswain\n  rules: [{host: '*.foo.com', http: {paths: [{path: /ing, pathType: Prefix, backend: {service: {name: echo, port: {number: 8080}}}}]}}]\n",
    );
    let r = route(
        "gw",
        "  parentRefs: [{name: edge}]\n  hostnames: ['*.foo.com']\n  rules:\n  - backendRefs: [{name: echo, port: 8080}]\n",
    );
    let c = compile_yaml(&[BASE, INGRESS_CLASS, GATEWAY, &wild, &r]);
    let s = shared(&c);
    assert_eq!(routes_for(s, 80, "bar.foo.com"), ["wild/0", "gw/0"]);
    assert_eq!(routes_for(s, 80, "baz.bar.foo.com"), ["gw/0"]);
    // Multi-label first: a router that ignores the flag keeps the last one, as before.
    let wildcards: Vec<(&str, bool)> = s.listeners[0]
        .virtual_hosts
        .iter()
        .filter(|v| v.hostname.starts_with("*."))
        .map(|v| (v.hostname.as_str(), v.single_label))
        .collect();
    assert_eq!(wildcards, [("*.foo.com", false), ("*.foo.com", true)]);
}

/// Compiles with ingress-nginx compatibility on or off.
fn compile_with(docs: &[&str], compat: bool) -> Compiled {
    let mut store = Store::default();
    let mut errors = Vec::new();
    for d in docs {
        store.load_yaml(Path::new("fixture.yaml"), d, &mut errors);
    }
    assert!(errors.is_empty(), "{errors:?}");
    let config = Config {
        ingress_nginx_compat: compat,
        ..Config::default()
    };
    compile(&store, &config)
}

/// The routes of the vhost `host` on `port`, in order.
fn vhost_routes<'a>(s: &'a Snapshot, port: u32, host: &str) -> &'a [Route] {
    let l = s.listeners.iter().find(|l| l.port == port).unwrap();
    &l.virtual_hosts
        .iter()
        .find(|v| v.hostname == host)
        .unwrap_or_else(|| panic!("no vhost {host} on {port}"))
        .routes
}

const SHOP_TLS: &str = r#"
apiVersion: v1
kind: Secret
metadata: {name: shop-tls, namespace: web}
type: kubernetes.io/tls
data:
  tls.crt: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=
  tls.key: LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCk1JSUUKLS0tLS1FTkQgUFJJVkFURSBLRVktLS0tLQo=
"#;

fn annotated(name: &str, host: &str, annotations: &str, paths: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: web\n  annotations:\n{annotations}\nspec:\n  ingressClassName: coxswain\n  rules:\n  - host: {host}\n    http:\n      paths:\n{paths}"
    )
}

const ECHO_PATH: &str =
    "      - {path: /, pathType: Prefix, backend: {service: {name: echo, port: {number: 8080}}}}\n";

#[test]
fn typed_annotations_become_route_fields() {
    let ing = annotated(
        "typed",
        "typed.example",
        r#"    ingress.coxswain-labs.dev/allowlist-source-range: "10.0.0.0/8, 2001:db8::/32"
    ingress.coxswain-labs.dev/connect-timeout: 2s
    ingress.coxswain-labs.dev/read-timeout: "60"
    ingress.coxswain-labs.dev/send-timeout: 500ms
    ingress.coxswain-labs.dev/request-header-set: "X-Env: prod"
    ingress.coxswain-labs.dev/response-header-remove: Server
    ingress.coxswain-labs.dev/max-body-size: 1m
    ingress.coxswain-labs.dev/backend-protocol: GRPC
    ingress.coxswain-labs.dev/enable-cors: "true"
    ingress.coxswain-labs.dev/cors-allow-origin: https://app.example
    ingress.coxswain-labs.dev/access-log: "off"
    ingress.coxswain-labs.dev/retry-on: error timeout http_503 non_idempotent
    ingress.coxswain-labs.dev/retry-tries: "4"
    ingress.coxswain-labs.dev/retry-timeout: 15s
    ingress.coxswain-labs.dev/rewrite-target: /$2"#,
        "      - {path: \"/api(/|$)(.*)\", pathType: ImplementationSpecific, backend: {service: {name: echo, port: {number: 8080}}}}\n      - {path: /exact, pathType: Exact, backend: {service: {name: echo, port: {number: 8080}}}}\n",
    );
    let c = compile_yaml(&[BASE, INGRESS_CLASS, &ing]);
    let status = &c.status.ingresses[&key("web", "typed")];
    assert!(status.warnings.is_empty(), "{status:?}");
    let routes = vhost_routes(shared(&c), 80, "typed.example");
    assert_eq!(routes.len(), 2);
    // Exact before regex.
    let exact = &routes[0];
    assert_eq!(
        exact.r#match.as_ref().unwrap().path.as_ref().unwrap().value,
        "/exact"
    );
    let r = &routes[1];
    let path = r.r#match.as_ref().unwrap().path.as_ref().unwrap();
    assert_eq!(path.kind, path_match::Kind::Regex as i32);
    assert_eq!(path.value, "(?i:/api(/|$)(.*)).*");
    let cidrs: Vec<(String, u32)> = r
        .client_allowlist
        .as_ref()
        .unwrap()
        .cidrs
        .iter()
        .map(|c| (c.address.clone(), c.prefix_len))
        .collect();
    assert_eq!(cidrs, [("10.0.0.0".into(), 8), ("2001:db8::".into(), 32)]);
    assert_eq!(
        r.timeouts,
        Some(snap::Timeouts {
            connect_ms: 2000,
            read_ms: 60_000,
            send_ms: 500,
            ..Default::default()
        })
    );
    assert_eq!(r.max_request_body_bytes, 1 << 20);
    assert_eq!(r.upstream_protocol, snap::UpstreamProtocol::H2c as i32);
    // Four tries in all: three retries.
    assert_eq!(
        r.retry,
        Some(snap::Retry {
            codes: vec![503],
            attempts: 3,
            backoff_ms: 0,
            non_idempotent: true,
            timeout_ms: 15_000,
        })
    );
    assert!(r.access_log_off);
    assert_eq!(r.backends.len(), 1);
    let kinds: Vec<&snap::filter::Kind> =
        r.filters.iter().filter_map(|f| f.kind.as_ref()).collect();
    assert!(
        matches!(kinds[0], snap::filter::Kind::RequestHeaderModifier(m) if m.set[0].name == "x-env" && m.set[0].value == "prod")
    );
    assert!(
        matches!(kinds[1], snap::filter::Kind::ResponseHeaderModifier(m) if m.remove == ["server"])
    );
    assert!(
        matches!(kinds[2], snap::filter::Kind::UrlRewrite(u) if u.path == Some(snap::PathModifier { kind: Some(snap::path_modifier::Kind::ReplaceRegexMatch("/$2".into())) }))
    );
    assert!(
        matches!(kinds[3], snap::filter::Kind::Cors(c) if c.allow_origins == ["https://app.example"] && c.allow_credentials && c.max_age_seconds == 1_728_000)
    );
}

#[test]
fn ssl_redirects_answer_the_http_port_only() {
    let tls = |name: &str, host: &str, annotations: &str| {
        format!(
            "{}\n  tls: [{{hosts: [{host}], secretName: shop-tls}}]\n",
            annotated(name, host, annotations, ECHO_PATH).trim_end()
        )
    };
    let on = tls(
        "on",
        "on.example",
        "    ingress.coxswain-labs.dev/ssl-redirect: \"true\"",
    );
    let plain = tls("plain", "plain.example", "    {}");
    let forced = annotated(
        "forced",
        "forced.example",
        "    ingress.coxswain-labs.dev/force-ssl-redirect: \"true\"",
        ECHO_PATH,
    );
    let docs = [BASE, INGRESS_CLASS, SHOP_TLS, &on, &plain, &forced];
    let c = compile_with(&docs, false);
    let s = shared(&c);
    let redirect_of = |r: &Route| match r.filters.first().and_then(|f| f.kind.as_ref()) {
        Some(snap::filter::Kind::RequestRedirect(rr)) => Some((rr.scheme.clone(), rr.status_code)),
        _ => None,
    };
    let http = &vhost_routes(s, 80, "on.example")[0];
    assert_eq!(redirect_of(http), Some(("https".into(), 308)));
    assert!(http.backends.is_empty());
    let https = &vhost_routes(s, 443, "on.example")[0];
    assert_eq!(redirect_of(https), None);
    assert_eq!(https.backends.len(), 1);
    // Built-in default: no redirect; force-ssl-redirect works without spec.tls.
    assert_eq!(redirect_of(&vhost_routes(s, 80, "plain.example")[0]), None);
    assert_eq!(
        redirect_of(&vhost_routes(s, 80, "forced.example")[0]),
        Some(("https".into(), 308))
    );
    // Under ingress-nginx compatibility, TLS Ingresses redirect by default, as there.
    let c = compile_with(&docs, true);
    assert_eq!(
        redirect_of(&vhost_routes(shared(&c), 80, "plain.example")[0]),
        Some(("https".into(), 308))
    );
}

#[test]
fn fixed_redirects_carry_their_location() {
    let ing = annotated(
        "moved",
        "moved.example",
        "    ingress.coxswain-labs.dev/permanent-redirect: https://new.example/\n    ingress.coxswain-labs.dev/permanent-redirect-code: \"308\"",
        ECHO_PATH,
    );
    let c = compile_yaml(&[BASE, INGRESS_CLASS, &ing]);
    let r = &vhost_routes(shared(&c), 80, "moved.example")[0];
    match r.filters[0].kind.as_ref() {
        Some(snap::filter::Kind::RequestRedirect(rr)) => {
            assert_eq!(
                (rr.location.as_str(), rr.status_code),
                ("https://new.example/", 308)
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(r.backends.is_empty());
}

#[test]
fn an_invalid_allowlist_fails_closed_and_other_invalid_values_fail_open() {
    let ing = annotated(
        "guarded",
        "guarded.example",
        "    ingress.coxswain-labs.dev/allowlist-source-range: 10.0.0.0/33\n    ingress.coxswain-labs.dev/read-timeout: soon",
        ECHO_PATH,
    );
    let c = compile_yaml(&[BASE, INGRESS_CLASS, &ing]);
    let r = &vhost_routes(shared(&c), 80, "guarded.example")[0];
    assert_eq!(r.direct_status, 403);
    assert!(r.backends.is_empty());
    let warnings = &c.status.ingresses[&key("web", "guarded")].warnings;
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    let allow = warnings
        .iter()
        .find(|w| w.annotation.ends_with("allowlist-source-range"))
        .unwrap();
    assert!(allow.fail_closed);
    let timeout = warnings
        .iter()
        .find(|w| w.annotation.ends_with("read-timeout"))
        .unwrap();
    assert!(!timeout.fail_closed && timeout.reason.contains("ignored"));

    // Without the bad allowlist, the bad timeout is ignored and the Ingress serves normally.
    let ing = annotated(
        "open",
        "open.example",
        "    ingress.coxswain-labs.dev/read-timeout: soon",
        ECHO_PATH,
    );
    let c = compile_yaml(&[BASE, INGRESS_CLASS, &ing]);
    let r = &vhost_routes(shared(&c), 80, "open.example")[0];
    assert_eq!(
        (r.direct_status, r.backends.len(), r.timeouts),
        (0, 1, None)
    );
}

const CLASSES_WITH_PARAMS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: quiet}
spec:
  controller: coxswain-labs.dev/gateway-controller
  parameters: {apiGroup: ingress.coxswain-labs.dev, kind: CoxswainIngressClassParameters, name: quiet-defaults, namespace: web, scope: Namespace}
---
apiVersion: ingress.coxswain-labs.dev/v1alpha1
kind: CoxswainIngressClassParameters
metadata: {name: quiet-defaults, namespace: web}
spec:
  accessLog: false
  defaultAnnotations: {ingress.coxswain-labs.dev/read-timeout: 30s}
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: loud}
spec: {controller: coxswain-labs.dev/gateway-controller}
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: misconfigured}
spec:
  controller: coxswain-labs.dev/gateway-controller
  parameters: {apiGroup: example.com, kind: Other, name: x}
"#;

fn with_class(name: &str, class: &str, annotations: &str) -> String {
    annotated(name, &format!("{name}.example"), annotations, ECHO_PATH).replace(
        "ingressClassName: coxswain",
        &format!("ingressClassName: {class}"),
    )
}

#[test]
fn class_parameters_give_defaults_and_switch_access_logs_off() {
    let defaulted = with_class("defaulted", "quiet", "    {}");
    let own = with_class(
        "own",
        "quiet",
        "    ingress.coxswain-labs.dev/read-timeout: 5s",
    );
    let loud = with_class("loud", "loud", "    {}");
    let odd = with_class("odd", "misconfigured", "    {}");
    let c = compile_yaml(&[BASE, CLASSES_WITH_PARAMS, &defaulted, &own, &loud, &odd]);
    let s = shared(&c);
    let first = |host: &str| vhost_routes(s, 80, host)[0].clone();
    let r = first("defaulted.example");
    assert_eq!(r.timeouts.map(|t| t.read_ms), Some(30_000), "class default");
    assert!(r.access_log_off);
    let r = first("own.example");
    assert_eq!(r.timeouts.map(|t| t.read_ms), Some(5_000), "Ingress wins");
    assert!(r.access_log_off, "accessLog: false covers the whole class");
    let r = first("loud.example");
    assert_eq!(r.timeouts, None);
    assert!(!r.access_log_off, "another class still logs");
    // A parameters reference Coxswain cannot use is reported on the class, and its Ingresses
    // are served without defaults.
    let problem = &c.status.ingress_classes["misconfigured"];
    assert!(problem.contains("example.com/Other"), "{problem}");
    assert!(!c.status.ingress_classes.contains_key("quiet"));
    assert_eq!(first("odd.example").direct_status, 0);
}

#[test]
fn class_parameters_references_are_checked() {
    let class = |parameters: &str| {
        format!(
            "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata: {{name: c}}\nspec:\n  controller: coxswain-labs.dev/gateway-controller\n  parameters: {parameters}\n"
        )
    };
    let cases = [
        (
            "{apiGroup: ingress.coxswain-labs.dev, kind: CoxswainIngressClassParameters, name: gone, namespace: web, scope: Namespace}",
            "not found",
        ),
        (
            "{apiGroup: ingress.coxswain-labs.dev, kind: CoxswainIngressClassParameters, name: quiet-defaults}",
            "scope: Namespace",
        ),
        ("{kind: ConfigMap, name: x}", "core/ConfigMap"),
    ];
    for (parameters, want) in cases {
        let ing = with_class("i", "c", "    {}");
        let c = compile_yaml(&[BASE, CLASSES_WITH_PARAMS, &class(parameters), &ing]);
        let problem = &c.status.ingress_classes["c"];
        assert!(problem.contains(want), "{parameters}: {problem}");
        assert!(problem.contains("no class defaults apply"), "{problem}");
    }
}

#[test]
fn canaries_take_a_weighted_share_and_header_routes() {
    let primary = annotated("primary", "shop.example", "    {}", ECHO_PATH);
    let canary = annotated(
        "primary-canary",
        "shop.example",
        "    ingress.coxswain-labs.dev/canary: \"true\"\n    ingress.coxswain-labs.dev/canary-weight: \"30\"\n    ingress.coxswain-labs.dev/canary-by-header: X-Canary",
        "      - {path: /, pathType: Prefix, backend: {service: {name: canary, port: {number: 8080}}}}\n",
    );
    let orphan = annotated(
        "orphan",
        "nowhere.example",
        "    ingress.coxswain-labs.dev/canary: \"true\"",
        "      - {path: /, pathType: Prefix, backend: {service: {name: canary, port: {number: 8080}}}}\n",
    );
    let canary_svc = r#"
apiVersion: v1
kind: Service
metadata: {name: canary, namespace: web}
spec:
  ports: [{name: http, port: 8080, targetPort: 3000}]
"#;
    let c = compile_yaml(&[BASE, INGRESS_CLASS, canary_svc, &primary, &canary, &orphan]);
    let s = shared(&c);
    let routes = vhost_routes(s, 80, "shop.example");
    // (header matches, backends with weights) per route, in order.
    type Summary = (Vec<String>, Vec<(String, u32)>);
    let summary: Vec<Summary> = routes
        .iter()
        .map(|r| {
            (
                r.r#match
                    .as_ref()
                    .unwrap()
                    .headers
                    .iter()
                    .map(|h| format!("{}={}", h.name, h.value))
                    .collect(),
                r.backends
                    .iter()
                    .map(|b| (b.cluster.clone(), b.weight))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                vec!["x-canary=always".to_owned()],
                vec![("web/canary:8080".to_owned(), 1)]
            ),
            (
                vec!["x-canary=never".to_owned()],
                vec![("web/echo:8080".to_owned(), 1)]
            ),
            (
                vec![],
                vec![
                    ("web/echo:8080".to_owned(), 70),
                    ("web/canary:8080".to_owned(), 30)
                ]
            ),
        ]
    );
    // Every route is the primary's; the canary Ingress has no route of its own.
    assert!(
        routes
            .iter()
            .all(|r| r.source.as_ref().unwrap().name == "primary")
    );
    assert!(
        !s.listeners[0]
            .virtual_hosts
            .iter()
            .any(|v| v.hostname == "nowhere.example")
    );
    let warnings = &c.status.ingresses[&key("web", "orphan")].warnings;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].reason.contains("not served"), "{warnings:?}");
    assert!(
        c.status.ingresses[&key("web", "primary-canary")]
            .warnings
            .is_empty()
    );
}

/// An Ingress as ingress-nginx users write it.
const NGINX_STYLE: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: legacy-app
  namespace: web
  annotations:
    nginx.ingress.kubernetes.io/rewrite-target: /$2
    nginx.ingress.kubernetes.io/ssl-redirect: "true"
    nginx.ingress.kubernetes.io/enable-cors: "true"
    nginx.ingress.kubernetes.io/cors-allow-origin: https://app.example
    nginx.ingress.kubernetes.io/configuration-snippet: |
      more_set_headers "X-Frame-Options: DENY";
spec:
  ingressClassName: coxswain
  tls: [{hosts: [legacy.example], secretName: shop-tls}]
  rules:
  - host: legacy.example
    http:
      paths:
      - path: /app(/|$)(.*)
        pathType: ImplementationSpecific
        backend: {service: {name: echo, port: {number: 8080}}}
"#;

#[test]
fn ingress_nginx_annotations_compile_under_compat_and_snippets_are_reported() {
    let c = compile_with(&[BASE, INGRESS_CLASS, SHOP_TLS, NGINX_STYLE], true);
    let s = shared(&c);
    let http = &vhost_routes(s, 80, "legacy.example")[0];
    assert!(matches!(
        http.filters[0].kind.as_ref(),
        Some(snap::filter::Kind::RequestRedirect(r)) if r.scheme == "https" && r.status_code == 308
    ));
    let https = &vhost_routes(s, 443, "legacy.example")[0];
    let path = https.r#match.as_ref().unwrap().path.as_ref().unwrap();
    assert_eq!(
        (path.kind, path.value.as_str()),
        (path_match::Kind::Regex as i32, "(?i:/app(/|$)(.*)).*")
    );
    let kinds: Vec<&snap::filter::Kind> = https
        .filters
        .iter()
        .filter_map(|f| f.kind.as_ref())
        .collect();
    assert!(matches!(kinds[0], snap::filter::Kind::UrlRewrite(_)));
    assert!(matches!(kinds[1], snap::filter::Kind::Cors(_)));
    let warnings = &c.status.ingresses[&key("web", "legacy-app")].warnings;
    assert_eq!(
        warnings.len(),
        1,
        "exactly one, for the snippet: {warnings:?}"
    );
    assert_eq!(
        warnings[0].annotation,
        "nginx.ingress.kubernetes.io/configuration-snippet"
    );

    // Compatibility off: the nginx annotations mean nothing; the snippet is still reported.
    let c = compile_with(&[BASE, INGRESS_CLASS, SHOP_TLS, NGINX_STYLE], false);
    let https = &vhost_routes(shared(&c), 443, "legacy.example")[0];
    assert!(https.filters.is_empty());
    assert_eq!(
        https.r#match.as_ref().unwrap().path.as_ref().unwrap().kind,
        path_match::Kind::Prefix as i32
    );
    assert_eq!(
        c.status.ingresses[&key("web", "legacy-app")].warnings.len(),
        1
    );
}

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
    let accepted = |map: &BTreeMap<ObjectKey, Vec<status::RouteParentStatus>>, name: &str| {
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

fn ca_pem() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.self_signed(&key).unwrap().pem()
}

fn backend_tls_policy(name: &str, created: &str, target: &str, validation: &str) -> String {
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {{name: {name}, namespace: web, generation: 2, creationTimestamp: "{created}"}}
spec:
  targetRefs: [{target}]
  validation: {validation}
"#
    )
}

const ECHO_ROUTE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: app, namespace: web}
spec:
  parentRefs: [{name: edge}]
  rules: [{backendRefs: [{name: echo, port: 8080}]}]
"#;

fn policy_condition(c: &Compiled, policy: &str, type_: &str) -> (ConditionStatus, &'static str) {
    let ancestors = &c.status.backend_tls_policies[&key("web", policy)];
    assert_eq!(ancestors.len(), 1, "{ancestors:?}");
    assert_eq!(
        (
            ancestors[0].parent_ref.kind.as_str(),
            ancestors[0].parent_ref.name.as_str()
        ),
        ("Gateway", "edge")
    );
    let cond = find(&ancestors[0].conditions, type_);
    (cond.status, cond.reason)
}

#[test]
fn backend_tls_policies_give_clusters_verified_tls() {
    // BackendTLSPolicy: the targeted Service's clusters carry its hostname and CA bundle; the
    // Gateways whose routes use the Service are the policy's ancestors.
    let pem = ca_pem();
    let config_map = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: ca, namespace: web}}\ndata:\n  ca.crt: {}\n",
        serde_json::to_string(&pem).unwrap()
    );
    let policy = backend_tls_policy(
        "echo-tls",
        "2026-01-01T00:00:00Z",
        "{group: '', kind: Service, name: echo, sectionName: http}",
        "{hostname: echo.internal, caCertificateRefs: [{group: '', kind: ConfigMap, name: ca}]}",
    );
    let c = compile_yaml(&[BASE, GATEWAY, ECHO_ROUTE, &config_map, &policy]);
    assert_eq!(
        policy_condition(&c, "echo-tls", "Accepted"),
        (ConditionStatus::True, "Accepted")
    );
    assert_eq!(
        policy_condition(&c, "echo-tls", "ResolvedRefs"),
        (ConditionStatus::True, "ResolvedRefs")
    );
    let cluster = &shared(&c).clusters[0];
    let tls = cluster.tls.as_ref().expect("the cluster gets TLS");
    assert_eq!(tls.hostname, "echo.internal");
    assert_eq!(tls.ca_pem, pem);
    assert!(!tls.refuse && !tls.system_roots);
}

#[test]
fn the_oldest_backend_tls_policy_wins_and_a_port_outranks_the_service() {
    let system = "{hostname: a.internal, wellKnownCACertificates: System}";
    let older = backend_tls_policy(
        "older",
        "2026-01-01T00:00:00Z",
        "{group: '', kind: Service, name: echo}",
        system,
    );
    let newer = backend_tls_policy(
        "newer",
        "2026-02-01T00:00:00Z",
        "{group: '', kind: Service, name: echo}",
        "{hostname: b.internal, wellKnownCACertificates: System}",
    );
    let port = backend_tls_policy(
        "port",
        "2026-03-01T00:00:00Z",
        "{group: '', kind: Service, name: echo, sectionName: http}",
        "{hostname: c.internal, wellKnownCACertificates: System}",
    );
    let c = compile_yaml(&[BASE, GATEWAY, ECHO_ROUTE, &newer, &older, &port]);
    assert_eq!(
        policy_condition(&c, "older", "Accepted"),
        (ConditionStatus::True, "Accepted")
    );
    assert_eq!(
        policy_condition(&c, "newer", "Accepted"),
        (ConditionStatus::False, "Conflicted")
    );
    assert_eq!(
        policy_condition(&c, "port", "Accepted"),
        (ConditionStatus::True, "Accepted")
    );
    let tls = shared(&c).clusters[0].tls.as_ref().unwrap();
    assert_eq!(
        (tls.hostname.as_str(), tls.system_roots),
        ("c.internal", true)
    );
}

#[test]
fn a_backend_tls_policy_without_a_usable_ca_refuses_traffic() {
    // NoValidCACertificate: the Service is not sent unverified or in clear; ResolvedRefs names
    // the bad reference.
    let cases = [
        (
            "{hostname: a.internal, caCertificateRefs: [{group: invalid.io, kind: InvalidKind, name: x}]}",
            "InvalidKind",
        ),
        (
            "{hostname: a.internal, caCertificateRefs: [{group: '', kind: ConfigMap, name: missing}]}",
            "InvalidCACertificateRef",
        ),
    ];
    for (validation, resolved) in cases {
        let policy = backend_tls_policy(
            "p",
            "2026-01-01T00:00:00Z",
            "{group: '', kind: Service, name: echo}",
            validation,
        );
        let c = compile_yaml(&[BASE, GATEWAY, ECHO_ROUTE, &policy]);
        assert_eq!(
            policy_condition(&c, "p", "Accepted"),
            (ConditionStatus::False, "NoValidCACertificate")
        );
        assert_eq!(
            policy_condition(&c, "p", "ResolvedRefs"),
            (ConditionStatus::False, resolved)
        );
        assert!(shared(&c).clusters[0].tls.as_ref().unwrap().refuse);
    }
    // A ConfigMap whose ca.crt is not a certificate is no better than a missing one.
    let bad = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ca, namespace: web}\ndata: {ca.crt: not a certificate}\n";
    let policy = backend_tls_policy(
        "p",
        "2026-01-01T00:00:00Z",
        "{group: '', kind: Service, name: echo}",
        "{hostname: a.internal, caCertificateRefs: [{group: '', kind: ConfigMap, name: ca}]}",
    );
    let c = compile_yaml(&[BASE, GATEWAY, ECHO_ROUTE, bad, &policy]);
    assert_eq!(
        policy_condition(&c, "p", "ResolvedRefs"),
        (ConditionStatus::False, "InvalidCACertificateRef")
    );
    // subjectAltNames are not verified here: refused rather than half-checked.
    let san = backend_tls_policy(
        "p",
        "2026-01-01T00:00:00Z",
        "{group: '', kind: Service, name: echo}",
        "{hostname: a.internal, wellKnownCACertificates: System, subjectAltNames: [{type: Hostname, hostname: b.internal}]}",
    );
    let c = compile_yaml(&[BASE, GATEWAY, ECHO_ROUTE, &san]);
    assert_eq!(
        policy_condition(&c, "p", "Accepted"),
        (ConditionStatus::False, "Invalid")
    );
    assert!(shared(&c).clusters[0].tls.as_ref().unwrap().refuse);
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

const LISTENER_SETS: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: parent, namespace: web, generation: 1}
spec:
  gatewayClassName: coxswain
  allowedListeners: {namespaces: {from: Selector, selector: {matchLabels: {team: web}}}}
  listeners:
  - {name: main, port: 80, protocol: HTTP, hostname: main.example, allowedRoutes: {namespaces: {from: All}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: extra, namespace: web, generation: 2, creationTimestamp: "2026-01-01T00:00:00Z"}
spec:
  parentRef: {name: parent}
  listeners:
  - {name: a, port: 80, protocol: HTTP, hostname: a.example}
  - {name: main, port: 80, protocol: HTTP, hostname: main.example}
  - {name: tcp, port: 80, protocol: TCP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: later, namespace: web, generation: 1, creationTimestamp: "2026-01-02T00:00:00Z"}
spec:
  parentRef: {name: parent}
  listeners:
  - {name: a, port: 80, protocol: HTTP, hostname: a.example}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: elsewhere, namespace: other, generation: 1}
spec:
  parentRef: {name: parent, namespace: web}
  listeners:
  - {name: b, port: 80, protocol: HTTP, hostname: b.example}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: on-set, namespace: web}
spec:
  parentRefs: [{kind: ListenerSet, name: extra}]
  rules: [{backendRefs: [{name: echo, port: 8080}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: on-gateway, namespace: web}
spec:
  parentRefs: [{name: parent}]
  rules: [{backendRefs: [{name: echo, port: 8080}]}]
"#;

fn set_listener_condition<'a>(
    listeners: &'a [super::status::ListenerStatus],
    name: &str,
    type_: &str,
) -> &'a Condition {
    let l = listeners
        .iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no listener {name}"));
    find(&l.conditions, type_)
}

// Gateway API ListenerSet (GEP-1713): a Gateway takes ListenerSets only from the namespaces
// its allowedListeners names; their listeners join its own, which win a conflict, then the
// older ListenerSet; routes reach a ListenerSet's listeners through a parentRef to it.
#[test]
fn listener_sets_add_listeners_to_their_gateway() {
    let c = compile_yaml(&[BASE, LISTENER_SETS]);
    let sets = &c.status.listener_sets;

    let refused = &sets[&key("other", "elsewhere")];
    let accepted = find(&refused.conditions, "Accepted");
    assert_eq!(
        (accepted.status, accepted.reason),
        (ConditionStatus::False, "NotAllowed")
    );
    assert!(
        accepted.message.contains("namespace other"),
        "{}",
        accepted.message
    );
    assert_eq!(find(&refused.conditions, "Programmed").reason, "NotAllowed");

    let extra = &sets[&key("web", "extra")];
    let accepted = find(&extra.conditions, "Accepted");
    assert_eq!(
        (
            accepted.status,
            accepted.reason,
            accepted.observed_generation
        ),
        (ConditionStatus::True, "ListenersNotValid", 2)
    );
    assert!(set_listener_condition(&extra.listeners, "a", "Accepted").is_true());
    for (name, why) in [("main", "HostnameConflict"), ("tcp", "ProtocolConflict")] {
        for type_ in ["Accepted", "Programmed"] {
            let cond = set_listener_condition(&extra.listeners, name, type_);
            assert_eq!(
                (cond.status, cond.reason),
                (ConditionStatus::False, why),
                "{name}"
            );
        }
        let conflicted = set_listener_condition(&extra.listeners, name, "Conflicted");
        assert_eq!(
            (conflicted.status, conflicted.reason),
            (ConditionStatus::True, why)
        );
    }
    // The Gateway's own listener keeps its place.
    let gw = &c.status.gateways[&key("web", "parent")];
    assert!(set_listener_condition(&gw.listeners, "main", "Accepted").is_true());
    assert_eq!(
        set_listener_condition(&gw.listeners, "main", "Conflicted").status,
        ConditionStatus::False
    );
    // The younger ListenerSet loses a.example to the older one.
    let later = &sets[&key("web", "later")];
    let accepted = find(&later.conditions, "Accepted");
    assert_eq!(
        (accepted.status, accepted.reason),
        (ConditionStatus::False, "ListenersNotValid")
    );
    assert_eq!(
        set_listener_condition(&later.listeners, "a", "Conflicted").reason,
        "HostnameConflict"
    );
    assert_eq!(gw.attached_listener_sets, 1);

    // Each route is served only on its parent's listeners, and reported against it.
    let s = shared(&c);
    assert_eq!(routes_for(s, 80, "a.example"), ["on-set/0"]);
    assert_eq!(routes_for(s, 80, "main.example"), ["on-gateway/0"]);
    let listener = s.listeners.iter().find(|l| l.port == 80).unwrap();
    assert!(
        listener
            .sources
            .contains(&"ListenerSet/web/extra/a".to_owned()),
        "{:?}",
        listener.sources
    );
    let parent = &c.status.http_routes[&key("web", "on-set")][0];
    assert_eq!(
        (
            parent.parent_ref.kind.as_str(),
            parent.parent_ref.name.as_str()
        ),
        ("ListenerSet", "extra")
    );
    assert!(find(&parent.conditions, "Accepted").is_true());
    assert_eq!(
        set_listener_condition(&extra.listeners, "a", "Accepted").observed_generation,
        2
    );
    assert_eq!(
        extra
            .listeners
            .iter()
            .find(|l| l.name == "a")
            .unwrap()
            .attached_routes,
        1
    );
    assert_eq!(gw.listeners[0].attached_routes, 1);
}

// A Gateway takes no ListenerSet unless spec.allowedListeners says so.
#[test]
fn listener_sets_are_refused_by_default() {
    let c = compile_yaml(&[
        BASE,
        GATEWAY,
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: extra, namespace: web}
spec:
  parentRef: {name: edge}
  listeners: [{name: a, port: 80, protocol: HTTP, hostname: a.example}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: on-refused, namespace: web}
spec:
  parentRefs: [{kind: ListenerSet, name: extra}]
  rules: [{backendRefs: [{name: echo, port: 8080}]}]
"#,
    ]);
    let status = &c.status.listener_sets[&key("web", "extra")];
    let accepted = find(&status.conditions, "Accepted");
    assert_eq!(
        (accepted.status, accepted.reason),
        (ConditionStatus::False, "NotAllowed")
    );
    assert!(
        accepted.message.contains("allowedListeners"),
        "{}",
        accepted.message
    );
    assert_eq!(
        c.status.gateways[&key("web", "edge")].attached_listener_sets,
        0
    );
    // A route attached to it is told, not left without a word.
    let parent = &c.status.http_routes[&key("web", "on-refused")][0];
    assert_eq!(parent.parent_ref.kind, "ListenerSet");
    let accepted = find(&parent.conditions, "Accepted");
    assert_eq!(
        (accepted.status, accepted.reason),
        (ConditionStatus::False, "NoMatchingParent")
    );
    assert!(
        accepted.message.contains("not accepted"),
        "{}",
        accepted.message
    );
}
