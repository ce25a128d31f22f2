//! Ingresses: our class, class defaults, TLS hosts, and Ingress wildcards beside Gateway API
//! ones on one port.

use super::fixtures::*;
use crate::compile::*;
use coxswain_api::snapshot::{self as snap, path_match};

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
    let store = load(&[BASE, INGRESS_CLASS, params, &ing]);
    let effective =
        ingress::effective_annotations(&store, &store.ingress_classes[0], &store.ingresses[0]);
    assert_eq!(effective["ingress.coxswain-labs.dev/read-timeout"], "5s");
    assert_eq!(effective["ingress.coxswain-labs.dev/ssl-redirect"], "true");
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
