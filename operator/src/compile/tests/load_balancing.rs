//! Load balancing and session persistence: CoxswainBackendPolicies and the Ingress
//! annotations, compiled from the YAML a user would apply.

use super::fixtures::{compile_with, compile_yaml};
use crate::compile::status::{ConditionStatus, ObjectKey, PolicyAncestorStatus};
use crate::compile::*;
use coxswain_api::snapshot::{self as snap, hash_key::Source, load_balancer::Algorithm};

/// Our IngressClass and GatewayClass, a Gateway, and Service "app" in namespace web with two
/// named ports.
const BASE: &str = r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: coxswain}
spec: {controller: coxswain-labs.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: coxswain, generation: 1}
spec: {controllerName: coxswain-labs.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: web, generation: 1}
spec:
  gatewayClassName: coxswain
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: v1
kind: Service
metadata: {name: app, namespace: web}
spec:
  ports:
  - {name: http, port: 8080}
  - {name: admin, port: 9090}
"#;

/// Every cluster of that name in every snapshot, with its load balancer; they must agree.
fn lb_of(c: &Compiled, cluster: &str) -> Option<snap::LoadBalancer> {
    let found: Vec<Option<snap::LoadBalancer>> = c
        .snapshots
        .values()
        .flat_map(|s| s.clusters.iter())
        .filter(|cl| cl.name == cluster)
        .map(|cl| cl.load_balancer.clone())
        .collect();
    assert!(!found.is_empty(), "no cluster {cluster}");
    assert!(
        found.windows(2).all(|w| w[0] == w[1]),
        "{cluster} differs across snapshots: {found:?}"
    );
    found.into_iter().next().flatten()
}

fn lb(algorithm: Algorithm, source: Option<Source>) -> snap::LoadBalancer {
    snap::LoadBalancer {
        algorithm: algorithm as i32,
        hash: source.map(|s| snap::HashKey { source: Some(s) }),
    }
}

fn ancestors<'a>(c: &'a Compiled, name: &str) -> &'a [PolicyAncestorStatus] {
    c.status
        .backend_policies
        .get(&ObjectKey::new("web", name))
        .unwrap_or_else(|| panic!("no status for policy {name}"))
}

/// (status, reason, message) of the policy's Accepted condition under its first ancestor.
fn accepted(c: &Compiled, name: &str) -> (ConditionStatus, &'static str, String) {
    let a = &ancestors(c, name)[0];
    let cond = a
        .conditions
        .iter()
        .find(|c| c.type_ == "Accepted")
        .unwrap_or_else(|| panic!("no Accepted condition for {name}"));
    (cond.status, cond.reason, cond.message.clone())
}

fn policy(name: &str, created: &str, targets: &str, lb: &str) -> String {
    format!(
        r#"
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainBackendPolicy
metadata: {{name: {name}, namespace: web, generation: 3, creationTimestamp: "{created}"}}
spec:
  targetRefs: {targets}
  loadBalancer: {lb}
"#
    )
}

fn http_route(name: &str, backend: &str, port: u16) -> String {
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: web}}
spec:
  parentRefs: [{{name: edge}}]
  rules: [{{backendRefs: [{{name: {backend}, port: {port}}}]}}]
"#
    )
}

fn ingress(name: &str, created: &str, annotations: &str, port: u16) -> String {
    format!(
        r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: {name}
  namespace: web
  creationTimestamp: "{created}"
  annotations: {annotations}
spec:
  ingressClassName: coxswain
  rules:
  - host: {name}.example
    http:
      paths:
      - path: /
        pathType: Prefix
        backend: {{service: {{name: app, port: {{number: {port}}}}}}}
"#
    )
}

fn warnings_of(c: &Compiled, name: &str) -> Vec<(String, String)> {
    c.status.ingresses[&ObjectKey::new("web", name)]
        .warnings
        .iter()
        .map(|w| (w.annotation.clone(), w.reason.clone()))
        .collect()
}

#[test]
fn a_policy_sets_the_algorithm_of_every_port_of_its_service_and_reports_the_gateway() {
    let c = compile_yaml(&[
        BASE,
        &http_route("web", "app", 8080),
        &http_route("admin", "app", 9090),
        &policy(
            "sticky",
            "2026-01-01T00:00:00Z",
            "[{group: '', kind: Service, name: app}]",
            "{type: ConsistentHash, consistentHash: {header: {name: X-User}}}",
        ),
    ]);
    let want = lb(
        Algorithm::ConsistentHash,
        Some(Source::Header("X-User".into())),
    );
    assert_eq!(lb_of(&c, "web/app:8080"), Some(want.clone()));
    assert_eq!(lb_of(&c, "web/app:9090"), Some(want));
    let a = ancestors(&c, "sticky");
    assert_eq!(a.len(), 1);
    assert_eq!(
        (
            a[0].ancestor_ref.kind.as_str(),
            a[0].ancestor_ref.name.as_str()
        ),
        ("Gateway", "edge")
    );
    assert_eq!(a[0].controller_name, "coxswain-labs.dev/gateway-controller");
    assert_eq!(
        accepted(&c, "sticky"),
        (ConditionStatus::True, "Accepted", String::new())
    );
    assert_eq!(a[0].conditions[0].observed_generation, 3);
}

#[test]
fn a_section_name_limits_the_policy_to_one_port_and_outranks_a_whole_service_policy() {
    let c = compile_yaml(&[
        BASE,
        &http_route("web", "app", 8080),
        &http_route("admin", "app", 9090),
        // Younger, but it names the port: it holds port admin even so.
        &policy(
            "admin-only",
            "2026-02-01T00:00:00Z",
            "[{group: '', kind: Service, name: app, sectionName: admin}]",
            "{type: LeastRequest}",
        ),
        &policy(
            "whole",
            "2026-01-01T00:00:00Z",
            "[{group: '', kind: Service, name: app}]",
            "{type: ConsistentHash, consistentHash: {sourceIP: {}}}",
        ),
    ]);
    assert_eq!(
        lb_of(&c, "web/app:9090"),
        Some(lb(Algorithm::LeastRequest, None))
    );
    assert_eq!(
        lb_of(&c, "web/app:8080"),
        Some(lb(
            Algorithm::ConsistentHash,
            Some(Source::ClientAddress(true))
        ))
    );
    assert!(accepted(&c, "admin-only").0 == ConditionStatus::True);
    assert!(accepted(&c, "whole").0 == ConditionStatus::True);
}

#[test]
fn of_two_policies_on_one_target_the_older_wins_and_the_other_is_conflicted() {
    let docs = [
        BASE.to_owned(),
        http_route("web", "app", 8080),
        policy(
            "newer",
            "2026-03-01T00:00:00Z",
            "[{group: '', kind: Service, name: app}]",
            "{type: LeastRequest}",
        ),
        policy(
            "older",
            "2026-01-01T00:00:00Z",
            "[{group: '', kind: Service, name: app}]",
            "{type: RoundRobin}",
        ),
    ];
    let c = compile_yaml(&docs.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(
        lb_of(&c, "web/app:8080"),
        Some(lb(Algorithm::RoundRobin, None))
    );
    let (status, reason, message) = accepted(&c, "newer");
    assert_eq!((status, reason), (ConditionStatus::False, "Conflicted"));
    assert!(message.contains("older"), "{message}");
    assert_eq!(accepted(&c, "older").0, ConditionStatus::True);

    // Same age: namespace/name decides, whatever order the objects come in.
    let same_age = |first: &str, second: &str| {
        compile_yaml(&[
            BASE,
            &http_route("web", "app", 8080),
            &policy(
                first,
                "2026-01-01T00:00:00Z",
                "[{group: '', kind: Service, name: app}]",
                if first == "a" {
                    "{type: LeastRequest}"
                } else {
                    "{type: RoundRobin}"
                },
            ),
            &policy(
                second,
                "2026-01-01T00:00:00Z",
                "[{group: '', kind: Service, name: app}]",
                if second == "a" {
                    "{type: LeastRequest}"
                } else {
                    "{type: RoundRobin}"
                },
            ),
        ])
    };
    for c in [same_age("a", "b"), same_age("b", "a")] {
        assert_eq!(
            lb_of(&c, "web/app:8080"),
            Some(lb(Algorithm::LeastRequest, None))
        );
        assert_eq!(accepted(&c, "b").1, "Conflicted");
    }
}

#[test]
fn invalid_policies_hold_nothing_and_say_why() {
    let c = compile_yaml(&[
        BASE,
        &http_route("web", "app", 8080),
        &policy(
            "no-key",
            "2026-01-01T00:00:00Z",
            "[{group: '', kind: Service, name: app}]",
            "{type: ConsistentHash}",
        ),
        &policy(
            "two-keys",
            "2026-01-02T00:00:00Z",
            "[{group: '', kind: Service, name: app}]",
            "{type: ConsistentHash, consistentHash: {sourceIP: {}, cookie: {name: s}}}",
        ),
        &policy(
            "stray-key",
            "2026-01-03T00:00:00Z",
            "[{group: '', kind: Service, name: app}]",
            "{type: RoundRobin, consistentHash: {sourceIP: {}}}",
        ),
        &policy(
            "bad-header",
            "2026-01-04T00:00:00Z",
            "[{group: '', kind: Service, name: app}]",
            "{type: ConsistentHash, consistentHash: {header: {name: 'X User'}}}",
        ),
        &policy(
            "not-a-service",
            "2026-01-05T00:00:00Z",
            "[{group: apps, kind: Deployment, name: app}]",
            "{type: LeastRequest}",
        ),
    ]);
    for (name, says) in [
        ("no-key", "needs consistentHash"),
        ("two-keys", "more than one key"),
        ("stray-key", "only used with type ConsistentHash"),
        ("bad-header", "not a valid header name"),
        ("not-a-service", "only Services"),
    ] {
        let (status, reason, message) = accepted(&c, name);
        assert_eq!(
            (status, reason),
            (ConditionStatus::False, "Invalid"),
            "{name}"
        );
        assert!(message.contains(says), "{name}: {message}");
    }
    // Nothing valid holds the Service: no algorithm is set, and no policy is Conflicted.
    assert_eq!(lb_of(&c, "web/app:8080"), None);
    // A policy targeting no Service still reports, under its target.
    let a = &ancestors(&c, "not-a-service")[0];
    assert_eq!(
        (a.ancestor_ref.kind.as_str(), a.ancestor_ref.group.as_str()),
        ("Deployment", "apps")
    );
}

#[test]
fn missing_targets_are_reported_under_the_service_until_a_route_uses_it() {
    let c = compile_yaml(&[
        BASE,
        &policy(
            "typo",
            "2026-01-01T00:00:00Z",
            "[{group: '', kind: Service, name: ap}]",
            "{type: LeastRequest}",
        ),
        &policy(
            "bad-port",
            "2026-01-01T00:00:00Z",
            "[{group: '', kind: Service, name: app, sectionName: grpc}]",
            "{type: LeastRequest}",
        ),
    ]);
    let (status, reason, message) = accepted(&c, "typo");
    assert_eq!((status, reason), (ConditionStatus::False, "TargetNotFound"));
    assert_eq!(message, "Service ap not found in namespace web");
    let a = &ancestors(&c, "typo")[0];
    assert_eq!(
        (
            a.ancestor_ref.group.as_str(),
            a.ancestor_ref.kind.as_str(),
            a.ancestor_ref.namespace.as_deref(),
            a.ancestor_ref.name.as_str()
        ),
        ("", "Service", Some("web"), "ap")
    );
    let (_, reason, message) = accepted(&c, "bad-port");
    assert_eq!(reason, "TargetNotFound");
    assert_eq!(message, "Service app has no port named grpc");
}

#[test]
fn h2c_variants_of_a_cluster_get_the_same_algorithm() {
    let c = compile_yaml(&[
        BASE,
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: rpc, namespace: web}
spec:
  parentRefs: [{name: edge}]
  rules: [{backendRefs: [{name: app, port: 8080}]}]
"#,
        &policy(
            "lr",
            "2026-01-01T00:00:00Z",
            "[{group: '', kind: Service, name: app, sectionName: http}]",
            "{type: LeastRequest}",
        ),
    ]);
    assert_eq!(
        lb_of(&c, "web/app:8080/h2c"),
        Some(lb(Algorithm::LeastRequest, None))
    );
}

#[test]
fn ingress_annotations_choose_the_algorithm_of_the_services_they_send_to() {
    let c = compile_yaml(&[
        BASE,
        &ingress(
            "hash",
            "2026-01-01T00:00:00Z",
            "{ingress.coxswain-labs.dev/upstream-hash-by: $http_x_user_id}",
            8080,
        ),
        &ingress(
            "ewma",
            "2026-01-01T00:00:00Z",
            "{ingress.coxswain-labs.dev/load-balance: ewma}",
            9090,
        ),
    ]);
    assert_eq!(
        lb_of(&c, "web/app:8080"),
        Some(lb(
            Algorithm::ConsistentHash,
            Some(Source::Header("x-user-id".into()))
        ))
    );
    assert_eq!(
        lb_of(&c, "web/app:9090"),
        Some(lb(Algorithm::LeastRequest, None))
    );
    assert!(warnings_of(&c, "hash").is_empty());
}

#[test]
fn nginx_hash_variables_map_to_keys_under_compat() {
    for (value, want) in [
        ("$remote_addr", Source::ClientAddress(true)),
        ("$binary_remote_addr", Source::ClientAddress(true)),
        ("$cookie_session_id", Source::Cookie("session_id".into())),
        ("${http_x_tenant}", Source::Header("x-tenant".into())),
    ] {
        let c = compile_with(
            true,
            &[
                BASE,
                &ingress(
                    "shop",
                    "2026-01-01T00:00:00Z",
                    &format!("{{nginx.ingress.kubernetes.io/upstream-hash-by: '{value}'}}"),
                    8080,
                ),
            ],
        );
        assert_eq!(
            lb_of(&c, "web/app:8080"),
            Some(lb(Algorithm::ConsistentHash, Some(want))),
            "{value}"
        );
    }
    // A variable that names no key the proxy hashes on is refused, not guessed at.
    let c = compile_with(
        true,
        &[
            BASE,
            &ingress(
                "shop",
                "2026-01-01T00:00:00Z",
                "{nginx.ingress.kubernetes.io/upstream-hash-by: '$request_uri'}",
                8080,
            ),
        ],
    );
    assert_eq!(lb_of(&c, "web/app:8080"), None);
    let w = warnings_of(&c, "shop");
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].0, "nginx.ingress.kubernetes.io/upstream-hash-by");
    assert!(w[0].1.contains("$remote_addr"), "{}", w[0].1);
}

#[test]
fn the_oldest_ingress_decides_and_a_policy_decides_over_annotations() {
    let younger = ingress(
        "younger",
        "2026-02-01T00:00:00Z",
        "{ingress.coxswain-labs.dev/load-balance: round_robin}",
        8080,
    );
    let older = ingress(
        "older",
        "2026-01-01T00:00:00Z",
        "{ingress.coxswain-labs.dev/load-balance: least_request}",
        8080,
    );
    for docs in [[BASE, &younger, &older], [BASE, &older, &younger]] {
        let c = compile_yaml(&docs);
        assert_eq!(
            lb_of(&c, "web/app:8080"),
            Some(lb(Algorithm::LeastRequest, None))
        );
        let w = warnings_of(&c, "younger");
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].0, "ingress.coxswain-labs.dev/load-balance");
        assert!(w[0].1.contains("Ingress web/older is older"), "{}", w[0].1);
        assert!(warnings_of(&c, "older").is_empty());
    }

    let c = compile_yaml(&[
        BASE,
        &older,
        &policy(
            "rr",
            "2026-06-01T00:00:00Z",
            "[{group: '', kind: Service, name: app}]",
            "{type: RoundRobin}",
        ),
    ]);
    assert_eq!(
        lb_of(&c, "web/app:8080"),
        Some(lb(Algorithm::RoundRobin, None))
    );
    let w = warnings_of(&c, "older");
    assert!(
        w.len() == 1 && w[0].1.contains("CoxswainBackendPolicy web/rr"),
        "{w:?}"
    );
    // The policy is told about the IngressClass its Service is served under.
    let a = ancestors(&c, "rr");
    assert_eq!(
        (
            a[0].ancestor_ref.group.as_str(),
            a[0].ancestor_ref.kind.as_str(),
            a[0].ancestor_ref.namespace.as_deref(),
            a[0].ancestor_ref.name.as_str()
        ),
        ("networking.k8s.io", "IngressClass", None, "coxswain")
    );
}

#[test]
fn bad_load_balance_values_are_refused() {
    let c = compile_yaml(&[
        BASE,
        &ingress(
            "shop",
            "2026-01-01T00:00:00Z",
            "{ingress.coxswain-labs.dev/load-balance: random}",
            8080,
        ),
    ]);
    assert_eq!(lb_of(&c, "web/app:8080"), None);
    let w = warnings_of(&c, "shop");
    assert!(
        w.len() == 1 && w[0].1.contains("round_robin, least_request or ewma"),
        "{w:?}"
    );
}

fn session_of(c: &Compiled) -> Vec<Option<snap::SessionPersistence>> {
    c.snapshots[&ScopeKey::SharedPool]
        .listeners
        .iter()
        .flat_map(|l| l.virtual_hosts.iter())
        .flat_map(|v| v.routes.iter())
        .map(|r| r.session_persistence.clone())
        .collect()
}

#[test]
fn cookie_affinity_becomes_session_persistence_on_the_ingress_routes() {
    let c = compile_yaml(&[
        BASE,
        &ingress(
            "shop",
            "2026-01-01T00:00:00Z",
            r#"{ingress.coxswain-labs.dev/affinity: cookie,
                ingress.coxswain-labs.dev/session-cookie-name: route,
                ingress.coxswain-labs.dev/session-cookie-max-age: "3600",
                ingress.coxswain-labs.dev/session-cookie-path: /shop}"#,
            8080,
        ),
    ]);
    let want = snap::SessionPersistence {
        kind: snap::session_persistence::Kind::Cookie as i32,
        name: "route".into(),
        max_age_s: 3600,
        path: "/shop".into(),
    };
    let sessions = session_of(&c);
    assert!(!sessions.is_empty());
    assert!(
        sessions.iter().all(|s| s.as_ref() == Some(&want)),
        "{sessions:?}"
    );

    // ingress-nginx's defaults: cookie INGRESSCOOKIE, a session cookie, path "/".
    let c = compile_with(
        true,
        &[
            BASE,
            &ingress(
                "shop",
                "2026-01-01T00:00:00Z",
                "{nginx.ingress.kubernetes.io/affinity: cookie}",
                8080,
            ),
        ],
    );
    let want = snap::SessionPersistence {
        kind: snap::session_persistence::Kind::Cookie as i32,
        name: "INGRESSCOOKIE".into(),
        max_age_s: 0,
        path: String::new(),
    };
    assert!(session_of(&c).iter().all(|s| s.as_ref() == Some(&want)));
}

#[test]
fn unknown_affinity_is_refused_and_cookie_settings_alone_do_nothing() {
    let c = compile_yaml(&[
        BASE,
        &ingress(
            "shop",
            "2026-01-01T00:00:00Z",
            r#"{ingress.coxswain-labs.dev/affinity: ip,
                ingress.coxswain-labs.dev/session-cookie-name: route}"#,
            8080,
        ),
    ]);
    assert!(session_of(&c).iter().all(Option::is_none));
    let w = warnings_of(&c, "shop");
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w.iter()
            .any(|(k, r)| k == "ingress.coxswain-labs.dev/affinity" && r.contains("use cookie"))
    );
    assert!(w.iter().any(
        |(k, r)| k == "ingress.coxswain-labs.dev/session-cookie-name"
            && r.contains("without affinity: cookie")
    ));
}
