//! Gateway `spec.tls` (GEP-91): client certificate validation on HTTPS listeners and the
//! client certificate presented to TLS backends, compiled from the YAML a user would apply.

use super::fixtures::{ca_pem, compile_yaml};
use crate::compile::status::{Condition, ConditionStatus, ObjectKey, reason};
use crate::compile::*;
use coxswain_api::snapshot as snap;

/// Our classes (`coxswain`: shared pool; `dedicated`: a proxy per Gateway), the TLS Secret
/// `cert` and a Service `echo` with one endpoint, all in namespace web.
const BASE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: coxswain, generation: 1}
spec: {controllerName: coxswain-labs.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: dedicated, generation: 1}
spec:
  controllerName: coxswain-labs.dev/gateway-controller
  parametersRef: {group: gateway.coxswain-labs.dev, kind: CoxswainGatewayParameters, name: p, namespace: web}
---
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainGatewayParameters
metadata: {name: p, namespace: web}
spec: {}
---
apiVersion: v1
kind: Namespace
metadata: {name: web}
---
apiVersion: v1
kind: Secret
metadata: {name: cert, namespace: web}
type: kubernetes.io/tls
data:
  tls.crt: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=
  tls.key: LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCk1JSUUKLS0tLS1FTkQgUFJJVkFURSBLRVktLS0tLQo=
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: web}
spec:
  ports: [{name: https, port: 443}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: echo-1
  namespace: web
  labels: {kubernetes.io/service-name: echo}
addressType: IPv4
ports: [{name: https, port: 8443}]
endpoints:
- addresses: [10.1.0.2]
  conditions: {ready: true}
"#;

fn config_map(ns: &str, name: &str, pem: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: {ns}}}\ndata:\n  ca.crt: {}\n",
        serde_json::to_string(pem).unwrap()
    )
}

/// Gateway `edge` of `class` with HTTPS listeners on 443 and 8443, an HTTP one on 80, and
/// this `spec.tls` (a YAML map).
fn gateway(class: &str, tls: &str) -> String {
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: web, generation: 3}}
spec:
  gatewayClassName: {class}
  tls: {tls}
  listeners:
  - {{name: https, port: 443, protocol: HTTPS, tls: {{certificateRefs: [{{name: cert}}]}}}}
  - {{name: https-alt, port: 8443, hostname: alt.example, protocol: HTTPS, tls: {{certificateRefs: [{{name: cert}}]}}}}
  - {{name: http, port: 80, protocol: HTTP}}
"#
    )
}

const ROUTE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: app, namespace: web}
spec:
  parentRefs: [{name: edge}]
  rules: [{backendRefs: [{name: echo, port: 443}]}]
"#;

const POLICY: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: echo-tls, namespace: web}
spec:
  targetRefs: [{group: '', kind: Service, name: echo}]
  validation: {hostname: echo.internal, caCertificateRefs: [{group: '', kind: ConfigMap, name: backend-ca}]}
"#;

/// `BASE`, then `docs`.
fn compile_docs(docs: &[&str]) -> Compiled {
    let all: Vec<&str> = std::iter::once(BASE).chain(docs.iter().copied()).collect();
    compile_yaml(&all)
}

fn edge() -> ObjectKey {
    ObjectKey::new("web", "edge")
}

fn dedicated(c: &Compiled) -> &snap::Snapshot {
    &c.snapshots[&ScopeKey::Gateway(edge())]
}

fn listener_conditions<'a>(c: &'a Compiled, name: &str) -> &'a [Condition] {
    &c.status.gateways[&edge()]
        .listeners
        .iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no listener {name}"))
        .conditions
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

fn assert_condition(conditions: &[Condition], type_: &str, ok: bool, why: &str) {
    let c = condition(conditions, type_).unwrap_or_else(|| panic!("no {type_} in {conditions:?}"));
    let status = if ok {
        ConditionStatus::True
    } else {
        ConditionStatus::False
    };
    assert_eq!((c.status, c.reason), (status, why), "{c:?}");
}

fn port(s: &snap::Snapshot, port: u32) -> Option<&snap::Listener> {
    s.listeners.iter().find(|l| l.port == port)
}

#[test]
fn default_and_per_port_cas_reach_their_ports_and_the_snapshot_requires_them() {
    let (default_ca, port_ca) = (ca_pem(), ca_pem());
    let tls = "{frontend: {default: {validation: {caCertificateRefs: [{group: '', kind: ConfigMap, name: default-ca}]}}, \
               perPort: [{port: 8443, tls: {validation: {caCertificateRefs: [{group: '', kind: ConfigMap, name: port-ca}]}}}, \
                         {port: 80, tls: {validation: {caCertificateRefs: [{group: '', kind: ConfigMap, name: port-ca}]}}}]}}";
    let c = compile_docs(&[
        &gateway("dedicated", tls),
        &config_map("web", "default-ca", &default_ca),
        &config_map("web", "port-ca", &port_ca),
    ]);
    let s = dedicated(&c);
    let v443 = port(s, 443).unwrap().client_validation.as_ref().unwrap();
    assert_eq!(v443.ca_pem, default_ca);
    assert!(
        !v443.allow_insecure_fallback,
        "AllowValidOnly is the default"
    );
    let v8443 = port(s, 8443).unwrap().client_validation.as_ref().unwrap();
    assert_eq!(v8443.ca_pem, port_ca);
    // A perPort entry for a cleartext port changes nothing there.
    assert_eq!(port(s, 80).unwrap().client_validation, None);
    assert_eq!(
        s.requires,
        vec![snap::feature::FRONTEND_CLIENT_VALIDATION.to_owned()]
    );
    for l in ["https", "https-alt", "http"] {
        let conditions = listener_conditions(&c, l);
        assert_condition(conditions, reason::ACCEPTED, true, reason::ACCEPTED);
        assert_condition(
            conditions,
            reason::RESOLVED_REFS,
            true,
            reason::RESOLVED_REFS,
        );
    }
    let gw = &c.status.gateways[&edge()].conditions;
    assert!(condition(gw, reason::INSECURE_FRONTEND_VALIDATION_MODE).is_none());
    assert!(
        condition(gw, reason::RESOLVED_REFS).is_none(),
        "no spec.tls.backend"
    );
}

#[test]
fn insecure_fallback_is_in_the_snapshot_and_said_on_the_gateway() {
    let tls = "{frontend: {default: {validation: {mode: AllowInsecureFallback, caCertificateRefs: [{group: '', kind: ConfigMap, name: ca}]}}}}";
    let c = compile_docs(&[
        &gateway("dedicated", tls),
        &config_map("web", "ca", &ca_pem()),
    ]);
    let v = port(dedicated(&c), 443)
        .unwrap()
        .client_validation
        .clone()
        .unwrap();
    assert!(v.allow_insecure_fallback);
    let gw = &c.status.gateways[&edge()].conditions;
    assert_condition(
        gw,
        reason::INSECURE_FRONTEND_VALIDATION_MODE,
        true,
        reason::CONFIGURATION_CHANGED,
    );
    assert_eq!(
        condition(gw, reason::INSECURE_FRONTEND_VALIDATION_MODE)
            .unwrap()
            .observed_generation,
        3
    );
}

#[test]
fn a_port_without_a_usable_ca_is_not_accepted_and_not_served() {
    // The conformance suite's cases: a missing ConfigMap, a kind that holds no CA, and a
    // ConfigMap in another namespace without a ReferenceGrant.
    let cases = [
        (
            "{group: '', kind: ConfigMap, name: missing}",
            reason::INVALID_CA_CERTIFICATE_REF,
        ),
        (
            "{group: '', kind: Service, name: echo}",
            reason::INVALID_CA_CERTIFICATE_KIND,
        ),
        (
            "{group: '', kind: ConfigMap, name: ca, namespace: other}",
            reason::REF_NOT_PERMITTED,
        ),
        (
            "{group: '', kind: ConfigMap, name: not-a-cert}",
            reason::INVALID_CA_CERTIFICATE_REF,
        ),
    ];
    for (r, why) in cases {
        let tls = format!(
            "{{frontend: {{default: {{validation: {{caCertificateRefs: [{{group: '', kind: ConfigMap, name: ca}}]}}}}, \
               perPort: [{{port: 8443, tls: {{validation: {{caCertificateRefs: [{r}]}}}}}}]}}}}"
        );
        let c = compile_docs(&[
            &gateway("dedicated", &tls),
            &config_map("web", "ca", &ca_pem()),
            &config_map("other", "ca", &ca_pem()),
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: not-a-cert, namespace: web}\ndata: {ca.crt: hello}\n",
        ]);
        let bad = listener_conditions(&c, "https-alt");
        assert_condition(bad, reason::RESOLVED_REFS, false, why);
        assert_condition(
            bad,
            reason::ACCEPTED,
            false,
            reason::NO_VALID_CA_CERTIFICATE,
        );
        assert_condition(bad, reason::PROGRAMMED, false, reason::INVALID);
        // Never served without the verification it asked for.
        assert!(port(dedicated(&c), 8443).is_none(), "{r}");
        // The other listeners keep theirs.
        let good = listener_conditions(&c, "https");
        assert_condition(good, reason::ACCEPTED, true, reason::ACCEPTED);
        assert_condition(good, reason::RESOLVED_REFS, true, reason::RESOLVED_REFS);
        assert!(
            port(dedicated(&c), 443)
                .unwrap()
                .client_validation
                .is_some()
        );
        let gw = &c.status.gateways[&edge()].conditions;
        assert_condition(gw, reason::ACCEPTED, true, reason::LISTENERS_NOT_VALID);
    }
}

#[test]
fn a_reference_grant_lets_a_gateway_use_another_namespace_s_ca() {
    let grant = r#"
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: cas, namespace: other}
spec:
  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: web}]
  to: [{group: '', kind: ConfigMap, name: ca}]
"#;
    let pem = ca_pem();
    let tls = "{frontend: {default: {validation: {caCertificateRefs: [{group: '', kind: ConfigMap, name: ca, namespace: other}]}}}}";
    let c = compile_docs(&[
        &gateway("dedicated", tls),
        &config_map("other", "ca", &pem),
        grant,
    ]);
    assert_eq!(
        port(dedicated(&c), 443)
            .unwrap()
            .client_validation
            .as_ref()
            .unwrap()
            .ca_pem,
        pem
    );
}

#[test]
fn one_bad_reference_among_good_ones_is_reported_and_the_good_ones_verify() {
    let pem = ca_pem();
    let tls = "{frontend: {default: {validation: {caCertificateRefs: [{group: '', kind: ConfigMap, name: ca}, {group: '', kind: ConfigMap, name: missing}]}}}}";
    let c = compile_docs(&[&gateway("dedicated", tls), &config_map("web", "ca", &pem)]);
    let conditions = listener_conditions(&c, "https");
    assert_condition(conditions, reason::ACCEPTED, true, reason::ACCEPTED);
    assert_condition(
        conditions,
        reason::RESOLVED_REFS,
        false,
        reason::INVALID_CA_CERTIFICATE_REF,
    );
}

#[test]
fn the_shared_pool_refuses_client_validation_instead_of_ignoring_it() {
    let tls = "{frontend: {default: {validation: {caCertificateRefs: [{group: '', kind: ConfigMap, name: ca}]}}}}";
    let c = compile_docs(&[
        &gateway("coxswain", tls),
        &config_map("web", "ca", &ca_pem()),
    ]);
    let conditions = listener_conditions(&c, "https");
    assert_condition(
        conditions,
        reason::ACCEPTED,
        false,
        reason::UNSUPPORTED_VALUE,
    );
    let shared = &c.snapshots[&ScopeKey::SharedPool];
    assert!(port(shared, 443).is_none() && port(shared, 8443).is_none());
    assert!(
        port(shared, 80).is_some(),
        "cleartext listeners are not affected"
    );
}

#[test]
fn the_backend_client_certificate_goes_to_every_tls_cluster_of_the_gateway() {
    let tls = "{backend: {clientCertificateRef: {group: '', kind: Secret, name: cert}}}";
    let c = compile_docs(&[
        &gateway("dedicated", tls),
        ROUTE,
        POLICY,
        &config_map("web", "backend-ca", &ca_pem()),
    ]);
    let gw = &c.status.gateways[&edge()].conditions;
    assert_condition(gw, reason::RESOLVED_REFS, true, reason::RESOLVED_REFS);
    assert_condition(gw, reason::ACCEPTED, true, reason::ACCEPTED);
    let s = dedicated(&c);
    let cluster = s
        .clusters
        .iter()
        .find(|c| c.name == "web/echo:443")
        .unwrap();
    assert_eq!(cluster.tls.as_ref().unwrap().client_certificate, "web/cert");
    assert!(s.certificates.iter().any(|c| c.name == "web/cert"));
    assert!(s.requires.is_empty(), "presenting nothing is not unsafe");
}

#[test]
fn a_backend_client_certificate_that_does_not_resolve_says_why_and_keeps_the_gateway() {
    let opaque = r#"
apiVersion: v1
kind: Secret
metadata: {name: opaque, namespace: web}
type: Opaque
data: {}
"#;
    let cases = [
        (
            "{group: '', kind: Secret, name: missing}",
            reason::INVALID_CLIENT_CERTIFICATE_REF,
        ),
        (
            "{group: wrong.group.io, kind: Secret, name: cert}",
            reason::INVALID_CLIENT_CERTIFICATE_REF,
        ),
        (
            "{group: '', kind: WrongKind, name: cert}",
            reason::INVALID_CLIENT_CERTIFICATE_REF,
        ),
        (
            "{group: '', kind: Secret, name: opaque}",
            reason::INVALID_CLIENT_CERTIFICATE_REF,
        ),
        (
            "{group: '', kind: Secret, name: cert, namespace: other}",
            reason::REF_NOT_PERMITTED,
        ),
    ];
    for (r, why) in cases {
        let tls = format!("{{backend: {{clientCertificateRef: {r}}}}}");
        let c = compile_docs(&[
            &gateway("dedicated", &tls),
            opaque,
            ROUTE,
            POLICY,
            &config_map("web", "backend-ca", &ca_pem()),
        ]);
        let gw = &c.status.gateways[&edge()].conditions;
        assert_condition(gw, reason::RESOLVED_REFS, false, why);
        assert_condition(gw, reason::ACCEPTED, true, reason::ACCEPTED);
        let cluster = dedicated(&c)
            .clusters
            .iter()
            .find(|c| c.name == "web/echo:443")
            .unwrap();
        assert_eq!(cluster.tls.as_ref().unwrap().client_certificate, "", "{r}");
    }
}

#[test]
fn a_shared_gateway_presents_its_client_certificate_on_clusters_of_its_own() {
    let tls = "{backend: {clientCertificateRef: {group: '', kind: Secret, name: cert}}}";
    // Another shared Gateway's route to the same TLS Service presents nothing.
    let other = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: plain, namespace: web}
spec:
  gatewayClassName: coxswain
  listeners: [{name: http, port: 81, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: plain, namespace: web}
spec:
  parentRefs: [{name: plain}]
  rules: [{backendRefs: [{name: echo, port: 443}]}]
"#;
    let c = compile_docs(&[
        &gateway("coxswain", tls),
        ROUTE,
        other,
        POLICY,
        &config_map("web", "backend-ca", &ca_pem()),
    ]);
    let gw = &c.status.gateways[&edge()].conditions;
    assert_condition(gw, reason::RESOLVED_REFS, true, reason::RESOLVED_REFS);
    let shared = &c.snapshots[&ScopeKey::SharedPool];
    let cluster_of = |port: u32| {
        let l = shared.listeners.iter().find(|l| l.port == port).unwrap();
        l.virtual_hosts[0].routes[0].backends[0].cluster.clone()
    };
    let find = |name: &str| shared.clusters.iter().find(|c| c.name == name).unwrap();
    let own = cluster_of(80);
    assert_eq!(own, "web/echo:443#client:web/edge");
    let own = find(&own);
    assert_eq!(own.tls.as_ref().unwrap().client_certificate, "web/cert");
    let base = find("web/echo:443");
    assert_eq!(
        own.endpoints, base.endpoints,
        "the same backend under another name"
    );
    assert_eq!(
        own.tls.as_ref().unwrap().hostname,
        base.tls.as_ref().unwrap().hostname
    );
    assert_eq!(
        cluster_of(81),
        "web/echo:443",
        "Gateway plain keeps the shared cluster"
    );
    assert_eq!(base.tls.as_ref().unwrap().client_certificate, "");
    assert!(shared.certificates.iter().any(|c| c.name == "web/cert"));
}
