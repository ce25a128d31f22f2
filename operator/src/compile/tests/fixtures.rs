//! Fixtures shared by the compiler's tests: the objects most tests start from, and readers
//! of compiled snapshots and status.

use crate::compile::status::{Condition, ObjectKey};
use crate::compile::*;
use coxswain_api::snapshot::{self as snap, Route, Snapshot};
use std::path::Path;

/// A GatewayClass of ours, and a Service "echo" (port 8080, two endpoints) in namespace web.
pub(super) const BASE: &str = r#"
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

pub(super) const GATEWAY: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: web, generation: 2}
spec:
  gatewayClassName: coxswain
  listeners:
  - {name: http, port: 80, protocol: HTTP}
"#;

/// An htpasswd line for user foo (apr1), as `htpasswd -c auth foo` writes it.
pub(super) const APR1_LINE: &str = "foo:$apr1$r31Jzq3U$oriiaS31APatLwvTBKE3D.";

/// A fresh self-signed CA certificate, PEM.
pub(super) fn ca_pem() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.self_signed(&key).unwrap().pem()
}

/// The objects of `docs`, each a YAML text of one or more documents; all must load.
pub(super) fn load(docs: &[&str]) -> Store {
    let mut store = Store::default();
    let mut errors = Vec::new();
    for d in docs {
        store.load_yaml(Path::new("fixture.yaml"), d, &mut errors);
    }
    assert!(errors.is_empty(), "{errors:?}");
    store
}

pub(super) fn compile_yaml(docs: &[&str]) -> Compiled {
    compile(&load(docs), &Config::default())
}

/// Compiles with ingress-nginx compatibility (`--ingress-nginx-compat`) on or off.
pub(super) fn compile_with(compat: bool, docs: &[&str]) -> Compiled {
    let config = Config {
        ingress_nginx_compat: compat,
        ..Config::default()
    };
    compile(&load(docs), &config)
}

pub(super) fn shared(c: &Compiled) -> &Snapshot {
    &c.snapshots[&ScopeKey::SharedPool]
}

pub(super) fn key(ns: &str, name: &str) -> ObjectKey {
    ObjectKey::new(ns, name)
}

pub(super) fn find<'a>(conditions: &'a [Condition], type_: &str) -> &'a Condition {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {conditions:?}"))
}

pub(super) fn route_condition<'a>(c: &'a Compiled, route: &str, type_: &str) -> &'a Condition {
    let parents = &c.status.http_routes[&key("web", route)];
    assert_eq!(parents.len(), 1, "{parents:?}");
    find(&parents[0].conditions, type_)
}

pub(super) fn listener_condition<'a>(
    c: &'a Compiled,
    gw: &str,
    listener: &str,
    type_: &str,
) -> &'a Condition {
    let status = &c.status.gateways[&key("web", gw)];
    let l = status
        .listeners
        .iter()
        .find(|l| l.name == listener)
        .unwrap();
    find(&l.conditions, type_)
}

/// Routes of the vhost a request for `host` lands on, on `port`, as "route/rule" strings.
pub(super) fn routes_for(s: &Snapshot, port: u32, host: &str) -> Vec<String> {
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

pub(super) fn describe(r: &Route) -> String {
    let s = r.source.as_ref().unwrap();
    format!("{}/{}", s.name, s.rule)
}

pub(super) fn route(name: &str, body: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: web, generation: 3}}\nspec:\n{body}"
    )
}

pub(super) const INGRESS_CLASS: &str = r#"
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

pub(super) fn ingress(name: &str, class: &str, spec: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: web{class}}}\nspec:\n{spec}"
    )
}
