//! GatewayClasses, Gateways and their listeners: acceptance, addresses, conflicts,
//! certificates and the routes each listener admits.

use super::fixtures::*;
use crate::compile::status::ConditionStatus;
use crate::compile::*;

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
    let store = load(&[BASE]);
    let with = |version: &str| {
        let config = Config {
            gateway_api_version: Some(version.to_owned()),
            ..Config::default()
        };
        compile(&store, &config).status.gateway_classes["coxswain"].clone()
    };
    // The release conformance runs on, and the one before it (clusters upgrade CRDs later).
    for version in ["v1.6.3", "v1.5.1"] {
        let ok = with(version);
        assert!(find(&ok, "SupportedVersion").is_true(), "{version}");
        assert!(find(&ok, "Accepted").is_true(), "{version}");
    }
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
    assert!(crate::compile::gateway::supported_gateway_api(
        "v1.4.0-rc.1"
    ));
    assert!(!crate::compile::gateway::supported_gateway_api("garbage"));
    // A newer minor may change what fields mean; it is not claimed until tested.
    assert!(!crate::compile::gateway::supported_gateway_api("v1.7.0"));
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
        ("shared", "needs a Service of the Gateway's own"),
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
  - {name: sctp, port: 9000, protocol: SCTP}
  - name: kinds
    port: 80
    protocol: HTTP
    allowedRoutes: {kinds: [{kind: HTTPRoute}, {kind: TCPRoute}]}
"#;
    let c = compile_yaml(&[BASE, gw]);
    let sctp = listener_condition(&c, "edge", "sctp", "Accepted");
    assert_eq!(
        (sctp.status, sctp.reason),
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
