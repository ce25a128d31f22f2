//! CoxswainAccessPolicies compiled from the YAML a user would apply: which HTTPRoute rules get
//! Basic authentication and rate limits, precedence between rule, route, listener and Gateway
//! policies, conflicts, and the Accepted condition under each ancestor.

use super::fixtures::{APR1_LINE, compile_yaml, load};
use crate::compile::status::{ConditionStatus, ObjectKey, PolicyAncestorStatus};
use crate::compile::*;
use coxswain_api::snapshot as snap;

/// Our GatewayClass, Gateway "edge" (listeners "web" on 80 and "admin" on 8080) in namespace
/// shop, Service "app", the htpasswd Secret "users", and HTTPRoute "store" with rules "browse"
/// and "checkout" on both listeners, and a redirect-only HTTPRoute "old".
const BASE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: coxswain, generation: 1}
spec: {controllerName: coxswain-labs.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: shop, generation: 1}
spec:
  gatewayClassName: coxswain
  listeners:
  - {name: web, port: 80, protocol: HTTP}
  - {name: admin, port: 8080, protocol: HTTP}
---
apiVersion: v1
kind: Service
metadata: {name: app, namespace: shop}
spec:
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: Secret
metadata: {name: users, namespace: shop}
type: Opaque
stringData:
  auth: "foo:$apr1$r31Jzq3U$oriiaS31APatLwvTBKE3D.\n"
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: store, namespace: shop}
spec:
  parentRefs: [{name: edge}]
  rules:
  - name: browse
    matches: [{path: {type: PathPrefix, value: /browse}}]
    backendRefs: [{name: app, port: 80}]
  - name: checkout
    matches: [{path: {type: PathPrefix, value: /checkout}}]
    backendRefs: [{name: app, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: old, namespace: shop}
spec:
  parentRefs: [{name: edge, sectionName: web}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /old}}]
    filters: [{type: RequestRedirect, requestRedirect: {scheme: https, statusCode: 301}}]
"#;

fn policy(name: &str, created: &str, targets: &str, spec: &str) -> String {
    format!(
        r#"
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainAccessPolicy
metadata: {{name: {name}, namespace: shop, generation: 2, creationTimestamp: "{created}"}}
spec:
  targetRefs: {targets}
{spec}
"#
    )
}

const ROUTE: &str = "[{group: gateway.networking.k8s.io, kind: HTTPRoute, name: store}]";
const AUTH: &str = "  basicAuth: {secretRef: {name: users}, realm: Staff}";
const LIMIT: &str = "  rateLimit: {requests: 10, burst: 5}";

/// The route of `path` on `port`'s listener.
fn route(c: &Compiled, port: u32, path: &str) -> snap::Route {
    c.snapshots[&ScopeKey::SharedPool]
        .listeners
        .iter()
        .filter(|l| l.port == port)
        .flat_map(|l| &l.virtual_hosts)
        .flat_map(|v| &v.routes)
        .find(|r| {
            r.r#match
                .as_ref()
                .and_then(|m| m.path.as_ref())
                .is_some_and(|p| p.value == path)
        })
        .cloned()
        .unwrap_or_else(|| panic!("no route {path} on {port}"))
}

fn ancestors<'a>(c: &'a Compiled, name: &str) -> &'a [PolicyAncestorStatus] {
    c.status
        .access_policies
        .get(&ObjectKey::new("shop", name))
        .unwrap_or_else(|| panic!("no status for policy {name}"))
}

/// (status, reason, message) of the policy's Accepted condition under its first ancestor.
fn accepted(c: &Compiled, name: &str) -> (ConditionStatus, &'static str, String) {
    let cond = &ancestors(c, name)[0].conditions[0];
    assert_eq!(cond.type_, "Accepted");
    (cond.status, cond.reason, cond.message.clone())
}

fn realm(r: &snap::Route) -> Option<String> {
    r.basic_auth.as_ref().map(|a| a.realm.clone())
}

#[test]
fn a_route_policy_protects_every_rule_and_reports_its_gateway() {
    let c = compile_yaml(&[
        BASE,
        &policy(
            "guard",
            "2026-01-01T00:00:00Z",
            ROUTE,
            &format!("{AUTH}\n{LIMIT}"),
        ),
    ]);
    for (port, path) in [(80, "/browse"), (80, "/checkout"), (8080, "/checkout")] {
        let r = route(&c, port, path);
        assert_eq!(
            r.basic_auth,
            Some(snap::BasicAuth {
                realm: "Staff".into(),
                users: vec![APR1_LINE.into()]
            }),
            "{port} {path}"
        );
        assert_eq!(
            r.rate_limits,
            vec![snap::RateLimit {
                id: "CoxswainAccessPolicy/shop/guard".into(),
                requests: 10,
                period_ms: 1000,
                burst: 5,
                ..Default::default()
            }]
        );
    }
    assert!(route(&c, 80, "/old").basic_auth.is_none(), "another route");
    let (status, reason, message) = accepted(&c, "guard");
    assert_eq!(
        (status, reason),
        (ConditionStatus::True, "Accepted"),
        "{message}"
    );
    let a = ancestors(&c, "guard");
    assert_eq!(a.len(), 1);
    assert_eq!(
        (
            a[0].ancestor_ref.kind.as_str(),
            a[0].ancestor_ref.name.as_str()
        ),
        ("Gateway", "edge")
    );
    assert_eq!(a[0].conditions[0].observed_generation, 2);
    assert_eq!(
        c.snapshots[&ScopeKey::SharedPool].requires,
        vec!["basic-auth".to_owned(), "rate-limit".to_owned()]
    );
}

#[test]
fn the_most_specific_policy_sets_each_feature() {
    let gateway = policy(
        "everyone",
        "2026-01-01T00:00:00Z",
        "[{group: gateway.networking.k8s.io, kind: Gateway, name: edge}]",
        &format!("{AUTH}\n{LIMIT}"),
    );
    let admin = policy(
        "admin-port",
        "2026-01-02T00:00:00Z",
        "[{group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: admin}]",
        "  basicAuth: {secretRef: {name: users}, realm: Admin}",
    );
    let checkout = policy(
        "checkout",
        "2026-01-03T00:00:00Z",
        "[{group: gateway.networking.k8s.io, kind: HTTPRoute, name: store, sectionName: checkout}]",
        "  rateLimit: {requests: 1, unit: Minute}",
    );
    let c = compile_yaml(&[BASE, &gateway, &admin, &checkout]);
    let browse = route(&c, 80, "/browse");
    assert_eq!(realm(&browse).as_deref(), Some("Staff"), "the Gateway's");
    assert_eq!(
        browse.rate_limits[0].id,
        "CoxswainAccessPolicy/shop/everyone"
    );
    let admin_browse = route(&c, 8080, "/browse");
    assert_eq!(
        realm(&admin_browse).as_deref(),
        Some("Admin"),
        "the listener's"
    );
    let checkout = route(&c, 80, "/checkout");
    assert_eq!(
        realm(&checkout).as_deref(),
        Some("Staff"),
        "auth still from the Gateway"
    );
    assert_eq!(
        checkout.rate_limits.len(),
        1,
        "one limit: the rule's replaces the Gateway's"
    );
    assert_eq!(
        checkout.rate_limits[0].id,
        "CoxswainAccessPolicy/shop/checkout"
    );
    assert_eq!(checkout.rate_limits[0].period_ms, 60_000);
    // A redirect answers before anyone signs in; its limit still counts.
    let old = route(&c, 80, "/old");
    assert!(old.basic_auth.is_none());
    assert_eq!(old.rate_limits.len(), 1);
    for name in ["everyone", "admin-port", "checkout"] {
        assert_eq!(accepted(&c, name).0, ConditionStatus::True, "{name}");
    }
}

#[test]
fn of_two_policies_on_one_target_the_older_holds_it() {
    let older = policy("first", "2026-01-01T00:00:00Z", ROUTE, AUTH);
    let newer = policy("second", "2026-02-01T00:00:00Z", ROUTE, LIMIT);
    // Listed newest first: age decides, not order.
    let c = compile_yaml(&[BASE, &newer, &older]);
    assert!(route(&c, 80, "/browse").basic_auth.is_some());
    assert!(route(&c, 80, "/browse").rate_limits.is_empty());
    let (status, reason, message) = accepted(&c, "second");
    assert_eq!((status, reason), (ConditionStatus::False, "Conflicted"));
    assert!(
        message.contains("CoxswainAccessPolicy first is older"),
        "{message}"
    );
    // Nothing took effect: the ancestor is its target.
    assert_eq!(ancestors(&c, "second")[0].ancestor_ref.kind, "HTTPRoute");
}

#[test]
fn a_missing_secret_fails_closed_with_503_and_invalid() {
    let p = policy(
        "guard",
        "2026-01-01T00:00:00Z",
        ROUTE,
        "  basicAuth: {secretRef: {name: nobody}}",
    );
    let c = compile_yaml(&[BASE, &p]);
    let r = route(&c, 80, "/browse");
    assert_eq!(r.direct_status, 503);
    assert!(r.backends.is_empty(), "never forwarded");
    let (status, reason, message) = accepted(&c, "guard");
    assert_eq!((status, reason), (ConditionStatus::False, "Invalid"));
    assert!(
        message.contains("Basic-auth Secret shop/nobody not found"),
        "{message}"
    );
}

#[test]
fn missing_targets_and_bad_blocks_are_reported() {
    let p = policy(
        "typo",
        "2026-01-01T00:00:00Z",
        "[{group: gateway.networking.k8s.io, kind: HTTPRoute, name: stroe}, {group: gateway.networking.k8s.io, kind: HTTPRoute, name: store, sectionName: pay}]",
        LIMIT,
    );
    let c = compile_yaml(&[BASE, &p]);
    let (status, reason, message) = accepted(&c, "typo");
    assert_eq!((status, reason), (ConditionStatus::False, "TargetNotFound"));
    assert!(
        message.contains("HTTPRoute shop/stroe not found"),
        "{message}"
    );
    assert!(message.contains("no rule named \"pay\""), "{message}");
    assert_eq!(ancestors(&c, "typo")[0].ancestor_ref.name, "stroe");
    assert!(route(&c, 80, "/browse").rate_limits.is_empty());

    let p = policy(
        "bad-block",
        "2026-01-01T00:00:00Z",
        ROUTE,
        "  rateLimit: {requests: 5, exempt: [10.0.0.0/33]}",
    );
    let c = compile_yaml(&[BASE, &p]);
    let (status, reason, message) = accepted(&c, "bad-block");
    assert_eq!((status, reason), (ConditionStatus::False, "Invalid"));
    assert!(message.contains("rateLimit.exempt"), "{message}");
    assert!(route(&c, 80, "/browse").rate_limits.is_empty());
}

#[test]
fn grpcroute_rules_take_their_own_policy_and_the_gateways() {
    let grpc = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: rpc, namespace: shop}
spec:
  parentRefs: [{name: edge, sectionName: admin}]
  rules:
  - name: orders
    matches: [{method: {service: shop.Orders}}]
    backendRefs: [{name: app, port: 80}]
"#;
    let gateway = policy(
        "everyone",
        "2026-01-01T00:00:00Z",
        "[{group: gateway.networking.k8s.io, kind: Gateway, name: edge}]",
        AUTH,
    );
    let orders = policy(
        "orders",
        "2026-01-02T00:00:00Z",
        "[{group: gateway.networking.k8s.io, kind: GRPCRoute, name: rpc, sectionName: orders}]",
        LIMIT,
    );
    let c = compile_yaml(&[BASE, grpc, &gateway, &orders]);
    let rpc: Vec<snap::Route> = c.snapshots[&ScopeKey::SharedPool]
        .listeners
        .iter()
        .filter(|l| l.port == 8080)
        .flat_map(|l| &l.virtual_hosts)
        .flat_map(|v| &v.routes)
        .filter(|r| r.source.as_ref().is_some_and(|s| s.kind == "GRPCRoute"))
        .cloned()
        .collect();
    assert!(!rpc.is_empty());
    for r in &rpc {
        assert_eq!(realm(r).as_deref(), Some("Staff"), "the Gateway's auth");
        assert_eq!(r.rate_limits.len(), 1);
        assert_eq!(r.rate_limits[0].id, "CoxswainAccessPolicy/shop/orders");
    }
    assert_eq!(accepted(&c, "orders").0, ConditionStatus::True);

    let typo = policy(
        "typo",
        "2026-01-03T00:00:00Z",
        "[{group: gateway.networking.k8s.io, kind: GRPCRoute, name: rpc, sectionName: refunds}]",
        LIMIT,
    );
    let c = compile_yaml(&[BASE, grpc, &typo]);
    let (status, reason, message) = accepted(&c, "typo");
    assert_eq!((status, reason), (ConditionStatus::False, "TargetNotFound"));
    assert!(
        message.contains("GRPCRoute shop/rpc has no rule named \"refunds\""),
        "{message}"
    );
}

/// A ConfigMap holding a provider's JWKS, as `kubectl create configmap idp-keys
/// --from-file=jwks.json` makes it.
fn jwks_config_map(keys: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {{name: idp-keys, namespace: shop}}
data:
  jwks.json: {}
"#,
        serde_json::to_string(keys).unwrap()
    )
}

const JWT: &str = r#"  jwt:
    providers:
    - name: idp
      issuer: https://idp.example
      audiences: [shop, shop]
      jwks: {name: idp-keys}
      claimsToHeaders: [{claim: sub, header: X-User}]
    - {name: broken, jwks: {kind: Secret, name: nowhere}}"#;

#[test]
fn jwt_providers_ship_their_keys_and_a_new_jwks_is_a_new_snapshot() {
    let ed = r#"{"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "a", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#;
    let rotated = r#"{"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "b", "x": "GbUZ8ns9sNXYVMLAu5UQEW6RP9ScKx8JfsQ9ARKeM_8"}]}"#;
    let p = policy("tokens", "2026-01-01T00:00:00Z", ROUTE, JWT);
    let c = compile_yaml(&[BASE, &p, &jwks_config_map(ed)]);
    let r = route(&c, 80, "/browse");
    let jwt = r.jwt.expect("jwt");
    assert_eq!(jwt.providers.len(), 1, "the broken provider is left out");
    let idp = &jwt.providers[0];
    assert_eq!(idp.issuer, "https://idp.example");
    assert_eq!(idp.audiences, ["shop"]);
    assert_eq!(idp.jwks, ed);
    assert_eq!(idp.claims_to_headers[0].header, "x-user");
    assert_eq!(
        idp.clock_skew_seconds,
        accesspolicy::DEFAULT_CLOCK_SKEW_SECONDS
    );
    let (status, reason, message) = accepted(&c, "tokens");
    assert_eq!((status, reason), (ConditionStatus::True, "Accepted"));
    assert!(
        message.contains("\"broken\"") && message.contains("not found"),
        "{message}"
    );
    let shared = &c.snapshots[&ScopeKey::SharedPool];
    assert!(shared.requires.contains(&snap::feature::JWT.to_owned()));

    // Rotation: the ConfigMap's new document is the next snapshot's, nothing else to do.
    let c2 = compile_yaml(&[BASE, &p, &jwks_config_map(rotated)]);
    assert_eq!(
        route(&c2, 80, "/browse").jwt.unwrap().providers[0].jwks,
        rotated
    );
    assert_ne!(c2.snapshots[&ScopeKey::SharedPool].version, shared.version);

    // No usable provider: the rules answer 503 (fail closed), and the policy says why.
    let c3 = compile_yaml(&[BASE, &p, &jwks_config_map(r#"{"keys": []}"#)]);
    let r = route(&c3, 80, "/browse");
    assert_eq!((r.direct_status, r.jwt.is_none()), (503, true));
    let (status, reason, message) = accepted(&c3, "tokens");
    assert_eq!((status, reason), (ConditionStatus::False, "Invalid"));
    assert!(message.contains("no signing key"), "{message}");
}

const IDP_URI: &str = "https://idp.example/.well-known/jwks.json";
const ED_A: &str = r#"{"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "a", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#;

fn remote_jwt(extra: &str) -> String {
    format!(
        r#"  jwt:
    providers:
    - name: idp
      issuer: https://idp.example
      audiences: [shop]
      jwks: {{remote: {{uri: "{IDP_URI}"{extra}}}}}
      claimsToHeaders: [{{claim: sub, header: X-User}}]"#
    )
}

/// The policies and objects of `docs`, with what the controller fetched from IDP_URI (no CA
/// bundle), if anything.
fn compile_fetched(docs: &[&str], fetched: Option<Result<&str, &str>>) -> Compiled {
    let mut store = load(docs);
    if let Some(f) = fetched {
        let source = JwksSource {
            uri: IDP_URI.into(),
            ca_pem: None,
        };
        let f = f.map(str::to_owned).map_err(str::to_owned);
        store.remote_jwks.insert(source, f);
    }
    compile(&store, &Config::default())
}

#[test]
fn a_fetched_remote_jwks_compiles_like_a_config_map_one() {
    let p = policy(
        "tokens",
        "2026-01-01T00:00:00Z",
        ROUTE,
        &remote_jwt(", refreshSeconds: 60"),
    );
    // The policy names the URL: the controller is asked to fetch it, as often as it says.
    assert_eq!(
        jwks::sources(&load(&[BASE, &p])),
        BTreeMap::from([(
            JwksSource {
                uri: IDP_URI.into(),
                ca_pem: None
            },
            std::time::Duration::from_secs(60)
        )])
    );
    let c = compile_fetched(&[BASE, &p], Some(Ok(ED_A)));
    let (status, reason, message) = accepted(&c, "tokens");
    assert_eq!(
        (status, reason, message.as_str()),
        (ConditionStatus::True, "Accepted", "")
    );

    // The same provider reading the same document from a ConfigMap: the same route.
    let from_config_map = JWT.replace(
        "    - {name: broken, jwks: {kind: Secret, name: nowhere}}",
        "",
    );
    let p2 = policy("tokens", "2026-01-01T00:00:00Z", ROUTE, &from_config_map);
    let c2 = compile_yaml(&[BASE, &p2, &jwks_config_map(ED_A)]);
    let remote = route(&c, 80, "/browse");
    assert_eq!(remote.jwt.as_ref().unwrap().providers[0].jwks, ED_A);
    assert_eq!(remote, route(&c2, 80, "/browse"));
}

#[test]
fn a_remote_jwks_not_fetched_or_failing_fails_closed() {
    let p = policy("tokens", "2026-01-01T00:00:00Z", ROUTE, &remote_jwt(""));
    for (fetched, says) in [
        (None, "not fetched yet"),
        (
            Some(Err(
                "answered 503 Service Unavailable (redirects are not followed)",
            )),
            "fetching it failed: answered 503",
        ),
    ] {
        let c = compile_fetched(&[BASE, &p], fetched);
        let r = route(&c, 80, "/browse");
        assert_eq!((r.direct_status, r.jwt.is_none()), (503, true), "{says}");
        let (status, reason, message) = accepted(&c, "tokens");
        assert_eq!((status, reason), (ConditionStatus::False, "Invalid"));
        assert!(
            message.contains(&format!("JWT provider \"idp\": {IDP_URI}: {says}"))
                && message.contains("no JWT provider is usable"),
            "{message}"
        );
    }

    // Beside a usable ConfigMap provider, an unfetched one is only mentioned.
    let both = format!(
        "{}\n    - {{name: cm, jwks: {{name: idp-keys}}}}",
        remote_jwt("")
    );
    let p = policy("tokens", "2026-01-01T00:00:00Z", ROUTE, &both);
    let c = compile_fetched(&[BASE, &p, &jwks_config_map(ED_A)], None);
    let providers = route(&c, 80, "/browse").jwt.unwrap().providers;
    assert_eq!(providers.len(), 1);
    assert_eq!(providers[0].name, "cm");
    let (status, _, message) = accepted(&c, "tokens");
    assert_eq!(status, ConditionStatus::True);
    assert!(message.contains("not fetched yet"), "{message}");
}

#[test]
fn a_remote_jwks_with_a_ca_bundle_is_fetched_trusting_it() {
    let p = policy(
        "tokens",
        "2026-01-01T00:00:00Z",
        ROUTE,
        &remote_jwt(", caBundle: {name: idp-ca}"),
    );
    // Without its ConfigMap it is not fetched at all, and the policy says why.
    assert!(jwks::sources(&load(&[BASE, &p])).is_empty());
    let (_, _, message) = accepted(&compile_yaml(&[BASE, &p]), "tokens");
    assert!(
        message.contains("ConfigMap shop/idp-ca not found"),
        "{message}"
    );

    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let pem = params.self_signed(&key).unwrap().pem();
    let ca = format!(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {{name: idp-ca, namespace: shop}}
data:
  ca.crt: {}
"#,
        serde_json::to_string(&pem).unwrap()
    );
    let sources = jwks::sources(&load(&[BASE, &p, &ca]));
    let source = JwksSource {
        uri: IDP_URI.into(),
        ca_pem: Some(pem),
    };
    assert_eq!(
        sources.get(&source),
        Some(&std::time::Duration::from_secs(
            jwks::DEFAULT_REFRESH_SECONDS.into()
        ))
    );
}

/// The rate limit service of the global-limit tests: Service "ratelimit" port 8081.
const RATELIMIT_SERVICE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: ratelimit, namespace: shop}
spec:
  ports: [{name: grpc, port: 8081}]
"#;

#[test]
fn a_global_limit_describes_each_request_to_the_service_of_the_policy() {
    let p = policy(
        "shared",
        "2026-01-01T00:00:00Z",
        ROUTE,
        "  globalRateLimit:\n    service: {name: ratelimit, port: 8081}\n    requests: 100\n    \
         unit: Minute\n    exempt: [10.0.0.0/8]\n    failureMode: Closed\n    \
         timeoutMilliseconds: 250",
    );
    let c = compile_yaml(&[BASE, RATELIMIT_SERVICE, &p]);
    let g = route(&c, 80, "/checkout")
        .global_rate_limit
        .expect("the route has the policy's global limit");
    assert_eq!(g.cluster, "shop/ratelimit:8081");
    assert_eq!(g.domain, global_limit::DEFAULT_DOMAIN);
    assert!(!g.fail_open);
    assert_eq!(g.timeout_ms, 250);
    assert_eq!(g.exempt.len(), 1);
    let d = &g.descriptors[0];
    assert_eq!((d.requests, d.unit_seconds), (100, 60));
    let entries: Vec<(&str, i32, &str)> = d
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.source, e.value.as_str()))
        .collect();
    use snap::rate_limit_descriptor::entry::Source;
    assert_eq!(
        entries,
        [
            (
                global_limit::POLICY_KEY,
                Source::Value as i32,
                "shop/shared"
            ),
            (global_limit::CLIENT_KEY, Source::ClientAddress as i32, ""),
        ]
    );
    let shared = &c.snapshots[&ScopeKey::SharedPool];
    assert!(
        shared
            .clusters
            .iter()
            .any(|c| c.name == "shop/ratelimit:8081"),
        "the service's cluster ships with the routes that use it"
    );
    assert!(
        shared
            .requires
            .contains(&snap::feature::GLOBAL_RATE_LIMIT.to_owned())
    );
    // The redirect-only route is not a target: no limit, no requirement of its own.
    assert!(route(&c, 80, "/old").global_rate_limit.is_none());
    let (status, reason, _) = accepted(&c, "shared");
    assert_eq!((status, reason), (ConditionStatus::True, "Accepted"));
}

#[test]
fn a_header_keyed_global_limit_without_requests_leaves_the_limit_to_the_service() {
    let p = policy(
        "tenants",
        "2026-01-01T00:00:00Z",
        ROUTE,
        "  globalRateLimit:\n    service: {name: ratelimit, port: 8081}\n    domain: edge\n    \
         key: {type: Header, header: X-Tenant}",
    );
    let c = compile_yaml(&[BASE, RATELIMIT_SERVICE, &p]);
    let g = route(&c, 80, "/browse").global_rate_limit.unwrap();
    assert_eq!(g.domain, "edge");
    assert!(g.fail_open, "Open is the default failure mode");
    let d = &g.descriptors[0];
    assert_eq!((d.requests, d.unit_seconds), (0, 0), "no override");
    assert_eq!(d.entries[1].key, "x-tenant");
    assert_eq!(d.entries[1].value, "x-tenant");
}

#[test]
fn a_missing_rate_limit_service_is_reported_with_what_requests_get_meanwhile() {
    for (mode, meanwhile) in [("Closed", "answered 503"), ("Open", "go on uncounted")] {
        let p = policy(
            "shared",
            "2026-01-01T00:00:00Z",
            ROUTE,
            &format!(
                "  globalRateLimit:\n    service: {{name: nowhere, port: 8081}}\n    \
                 requests: 5\n    failureMode: {mode}"
            ),
        );
        let c = compile_yaml(&[BASE, &p]);
        let g = route(&c, 80, "/browse").global_rate_limit.unwrap();
        assert_eq!(
            g.cluster, "",
            "the proxy finds no service and applies the mode"
        );
        assert_eq!(g.fail_open, mode == "Open");
        let (status, reason, message) = accepted(&c, "shared");
        assert_eq!((status, reason), (ConditionStatus::False, "Invalid"));
        assert!(
            message.contains("rate limit Service shop/nowhere not found")
                && message.contains(meanwhile),
            "{message}"
        );
    }
    let wrong_port = policy(
        "shared",
        "2026-01-01T00:00:00Z",
        ROUTE,
        "  globalRateLimit:\n    service: {name: ratelimit, port: 9}",
    );
    let c = compile_yaml(&[BASE, RATELIMIT_SERVICE, &wrong_port]);
    let (_, _, message) = accepted(&c, "shared");
    assert!(message.contains("has no port 9"), "{message}");
}
