//! BackendTLSPolicies: verified TLS to backends, which policy wins, and refused traffic
//! without a usable CA.

use super::fixtures::*;
use crate::compile::status::ConditionStatus;
use crate::compile::*;

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
}

#[test]
fn subject_alt_names_replace_the_hostname_for_verification() {
    use coxswain_api::snapshot::subject_alt_name::Kind;
    let san = backend_tls_policy(
        "p",
        "2026-01-01T00:00:00Z",
        "{group: '', kind: Service, name: echo}",
        "{hostname: a.internal, wellKnownCACertificates: System, subjectAltNames: [{type: Hostname, hostname: b.internal}, {type: URI, uri: 'spiffe://td/ns/web/sa/echo'}]}",
    );
    let c = compile_yaml(&[BASE, GATEWAY, ECHO_ROUTE, &san]);
    assert_eq!(
        policy_condition(&c, "p", "Accepted"),
        (ConditionStatus::True, "Accepted")
    );
    let tls = shared(&c).clusters[0].tls.clone().unwrap();
    assert_eq!(tls.hostname, "a.internal", "still the SNI");
    assert!(tls.system_roots);
    let names: Vec<Option<Kind>> = tls.subject_alt_names.into_iter().map(|s| s.kind).collect();
    assert_eq!(
        names,
        [
            Some(Kind::Hostname("b.internal".into())),
            Some(Kind::Uri("spiffe://td/ns/web/sa/echo".into()))
        ]
    );
    // Set with the names: a proxy that does not know them refuses instead of checking the
    // hostname the policy says not to trust.
    assert!(tls.refuse);

    // Without a usable CA the names go: refused is refused, whatever the proxy knows.
    let no_ca = backend_tls_policy(
        "p",
        "2026-01-01T00:00:00Z",
        "{group: '', kind: Service, name: echo}",
        "{hostname: a.internal, caCertificateRefs: [{group: '', kind: ConfigMap, name: missing}], subjectAltNames: [{type: Hostname, hostname: b.internal}]}",
    );
    let c = compile_yaml(&[BASE, GATEWAY, ECHO_ROUTE, &no_ca]);
    assert_eq!(
        policy_condition(&c, "p", "Accepted").0,
        ConditionStatus::False
    );
    let tls = shared(&c).clusters[0].tls.clone().unwrap();
    assert!(tls.refuse && tls.subject_alt_names.is_empty());

    // A name of type URI without its uri (the CRD forbids it; a file may not): Invalid.
    let empty = backend_tls_policy(
        "p",
        "2026-01-01T00:00:00Z",
        "{group: '', kind: Service, name: echo}",
        "{hostname: a.internal, wellKnownCACertificates: System, subjectAltNames: [{type: URI, hostname: b.internal}]}",
    );
    let c = compile_yaml(&[BASE, GATEWAY, ECHO_ROUTE, &empty]);
    assert_eq!(
        policy_condition(&c, "p", "Accepted"),
        (ConditionStatus::False, "Invalid")
    );
    let tls = shared(&c).clusters[0].tls.clone().unwrap();
    assert!(tls.refuse && tls.subject_alt_names.is_empty());
}
