//! Basic authentication and rate limits on Ingresses: the annotations (ours, and
//! ingress-nginx's under compatibility) and the htpasswd Secret, compiled from the YAML a user
//! would apply.

use super::fixtures::{APR1_LINE, compile_with};
use crate::compile::*;
use coxswain_api::snapshot as snap;

/// Our IngressClass, Service "app" in namespace web, and Secrets: `basic-auth` holds an
/// htpasswd file with user foo (as `htpasswd -c auth foo` writes it), `with-des` adds a DES
/// line, `as-map` is an auth-map, `elsewhere/basic-auth` is in another namespace.
const BASE: &str = r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: coxswain}
spec: {controller: coxswain-labs.dev/gateway-controller}
---
apiVersion: v1
kind: Service
metadata: {name: app, namespace: web}
spec:
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: Secret
metadata: {name: basic-auth, namespace: web}
type: Opaque
data: {auth: Zm9vOiRhcHIxJHIzMUp6cTNVJG9yaWlhUzMxQVBhdEx3dlRCS0UzRC4K}
---
apiVersion: v1
kind: Secret
metadata: {name: with-des, namespace: web}
type: Opaque
data: {auth: Zm9vOiRhcHIxJHIzMUp6cTNVJG9yaWlhUzMxQVBhdEx3dlRCS0UzRC4Kb2xkOmFiSm5nZ3hoQi95V0kK}
---
apiVersion: v1
kind: Secret
metadata: {name: as-map, namespace: web}
type: Opaque
data: {foo: JGFwcjEkcjMxSnpxM1Ukb3JpaWFTMzFBUGF0THd2VEJLRTNELg==}
---
apiVersion: v1
kind: Secret
metadata: {name: basic-auth, namespace: elsewhere}
type: Opaque
data: {auth: Zm9vOiRhcHIxJHIzMUp6cTNVJG9yaWlhUzMxQVBhdEx3dlRCS0UzRC4K}
"#;

/// An Ingress "site" for foo.bar.com with these annotations (a YAML map), TLS when `tls`.
fn ingress(annotations: &str, tls: bool) -> String {
    let tls = if tls {
        "tls: [{hosts: [foo.bar.com], secretName: site-tls}]"
    } else {
        ""
    };
    format!(
        r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: site
  namespace: web
  annotations: {annotations}
spec:
  ingressClassName: coxswain
  {tls}
  rules:
  - host: foo.bar.com
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: app, port: {{number: 80}}}}}}}}
"#
    )
}

/// The routes of the shared snapshot's port, for host foo.bar.com.
fn routes(c: &Compiled, port: u32) -> Vec<snap::Route> {
    c.snapshots[&ScopeKey::SharedPool]
        .listeners
        .iter()
        .filter(|l| l.port == port)
        .flat_map(|l| &l.virtual_hosts)
        .filter(|v| v.hostname == "foo.bar.com")
        .flat_map(|v| v.routes.clone())
        .collect()
}

fn only_route(c: &Compiled) -> snap::Route {
    let r = routes(c, 80);
    assert_eq!(r.len(), 1, "{r:?}");
    r.into_iter().next().unwrap_or_default()
}

fn status(c: &Compiled) -> &crate::compile::status::IngressStatus {
    &c.status.ingresses[&ObjectKey::new("web", "site")]
}

const NGINX_AUTH: &str = r#"{nginx.ingress.kubernetes.io/auth-type: basic, nginx.ingress.kubernetes.io/auth-secret: basic-auth, nginx.ingress.kubernetes.io/auth-realm: "Authentication Required - foo"}"#;

#[test]
fn ingress_nginx_basic_auth_ingress_compiles_to_the_secret_users_under_compat() {
    let c = compile_with(true, &[BASE, &ingress(NGINX_AUTH, false)]);
    let route = only_route(&c);
    assert_eq!(
        route.basic_auth,
        Some(snap::BasicAuth {
            realm: "Authentication Required - foo".into(),
            users: vec![APR1_LINE.into()],
        })
    );
    assert_eq!(route.direct_status, 0);
    let s = status(&c);
    assert!(s.problems.is_empty() && s.warnings.is_empty(), "{s:?}");
    let snapshot = &c.snapshots[&ScopeKey::SharedPool];
    assert_eq!(
        snapshot.requires,
        vec![snap::feature::BASIC_AUTH.to_owned()]
    );

    // Without compatibility ingress-nginx's names mean nothing (documented), and the
    // snapshot requires nothing.
    let c = compile_with(false, &[BASE, &ingress(NGINX_AUTH, false)]);
    assert_eq!(only_route(&c).basic_auth, None);
    assert!(c.snapshots[&ScopeKey::SharedPool].requires.is_empty());
}

#[test]
fn our_annotations_read_an_auth_map_and_the_default_realm() {
    let c = compile_with(
        false,
        &[
            BASE,
            &ingress(
                "{ingress.coxswain-labs.dev/auth-type: basic, ingress.coxswain-labs.dev/auth-secret: web/as-map, ingress.coxswain-labs.dev/auth-secret-type: auth-map}",
                false,
            ),
        ],
    );
    let auth = only_route(&c).basic_auth.expect("basic auth");
    assert_eq!(auth.realm, "Authentication Required");
    assert_eq!(auth.users, vec![APR1_LINE.to_owned()]);
}

#[test]
fn a_missing_or_foreign_secret_answers_503_and_says_why() {
    for (secret, why) in [
        (
            "nothing-here",
            "Basic-auth Secret web/nothing-here not found",
        ),
        (
            "elsewhere/basic-auth",
            "only Secrets in the Ingress's own namespace",
        ),
    ] {
        let annotations = format!(
            "{{ingress.coxswain-labs.dev/auth-type: basic, ingress.coxswain-labs.dev/auth-secret: {secret}}}"
        );
        let c = compile_with(false, &[BASE, &ingress(&annotations, false)]);
        let route = only_route(&c);
        assert_eq!(route.direct_status, 503, "{secret}");
        assert!(route.backends.is_empty(), "{secret}: never forwarded");
        let problems = &status(&c).problems;
        assert!(
            problems
                .iter()
                .any(|p| p.contains(why) && p.contains("503")),
            "{secret}: {problems:?}"
        );
    }
}

#[test]
fn an_unusable_line_keeps_out_its_user_only_and_is_reported_without_its_hash() {
    let c = compile_with(
        false,
        &[
            BASE,
            &ingress(
                "{ingress.coxswain-labs.dev/auth-type: basic, ingress.coxswain-labs.dev/auth-secret: with-des}",
                false,
            ),
        ],
    );
    let auth = only_route(&c).basic_auth.expect("basic auth");
    assert_eq!(auth.users, vec![APR1_LINE.to_owned()]);
    let warnings = &status(&c).warnings;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let w = &warnings[0];
    assert!(
        w.reason.contains("line 2") && w.reason.contains("\"old\""),
        "{w:?}"
    );
    assert!(w.reason.contains("DES"), "{w:?}");
    assert!(
        !w.reason.contains("abJnggxhB"),
        "the hash must not be shown: {w:?}"
    );
    assert!(!w.fail_closed);
}

#[test]
fn bad_auth_annotations_fail_closed_with_403() {
    for annotations in [
        "{ingress.coxswain-labs.dev/auth-type: digest, ingress.coxswain-labs.dev/auth-secret: basic-auth}",
        "{ingress.coxswain-labs.dev/auth-type: basic}",
        "{ingress.coxswain-labs.dev/auth-type: basic, ingress.coxswain-labs.dev/auth-secret: Not_A_Name}",
        "{ingress.coxswain-labs.dev/auth-type: basic, ingress.coxswain-labs.dev/auth-secret: basic-auth, ingress.coxswain-labs.dev/auth-secret-type: ldap}",
        // Client certificates are not implemented yet: under compatibility they must deny.
        "{nginx.ingress.kubernetes.io/auth-tls-verify-client: \"on\"}",
        "{nginx.ingress.kubernetes.io/auth-url: ftp://auth.example/check}",
        "{ingress.coxswain-labs.dev/auth-url: \"http://auth.example/check?u=$remote_user\"}",
        "{ingress.coxswain-labs.dev/auth-url: http://auth.example/, ingress.coxswain-labs.dev/auth-signin: \"https://login.example/?n=$arg_n\"}",
        "{ingress.coxswain-labs.dev/auth-url: http://auth.example/, ingress.coxswain-labs.dev/auth-response-headers: \"X-Ok, Bad@Name\"}",
    ] {
        let c = compile_with(true, &[BASE, &ingress(annotations, false)]);
        let route = only_route(&c);
        assert_eq!(route.direct_status, 403, "{annotations}");
        assert!(
            status(&c).warnings.iter().any(|w| w.fail_closed),
            "{annotations}: {:?}",
            status(&c).warnings
        );
    }
}

#[test]
fn an_https_redirect_asks_for_no_password_and_the_https_route_does() {
    let tls_secret = r#"
apiVersion: v1
kind: Secret
metadata: {name: site-tls, namespace: web}
type: kubernetes.io/tls
data:
  tls.crt: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
  tls.key: LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCg==
"#;
    let c = compile_with(true, &[BASE, tls_secret, &ingress(NGINX_AUTH, true)]);
    let http = routes(&c, 80);
    assert_eq!(http.len(), 1);
    assert!(
        http[0].basic_auth.is_none(),
        "redirect first: {:?}",
        http[0]
    );
    assert!(!http[0].filters.is_empty(), "the HTTP route redirects");
    let https = routes(&c, 443);
    assert_eq!(https.len(), 1, "{:?}", status(&c));
    assert!(https[0].basic_auth.is_some());
}

#[test]
fn ingress_nginx_rate_limits_become_per_ingress_limits_with_nginx_bursts() {
    let c = compile_with(
        true,
        &[
            BASE,
            &ingress(
                r#"{nginx.ingress.kubernetes.io/limit-rps: "10", nginx.ingress.kubernetes.io/limit-rpm: "300", nginx.ingress.kubernetes.io/limit-connections: "3", nginx.ingress.kubernetes.io/limit-whitelist: "10.0.0.0/8, 192.168.1.7"}"#,
                false,
            ),
        ],
    );
    let exempt = vec![
        snap::Cidr {
            address: "10.0.0.0".into(),
            prefix_len: 8,
        },
        snap::Cidr {
            address: "192.168.1.7".into(),
            prefix_len: 32,
        },
    ];
    let route = only_route(&c);
    assert_eq!(
        route.rate_limits,
        vec![
            snap::RateLimit {
                id: "Ingress/web/site/connections".into(),
                max_in_flight: 3,
                exempt: exempt.clone(),
                ..Default::default()
            },
            snap::RateLimit {
                id: "Ingress/web/site/rpm".into(),
                requests: 300,
                period_ms: 60_000,
                burst: 1500,
                exempt: exempt.clone(),
                ..Default::default()
            },
            snap::RateLimit {
                id: "Ingress/web/site/rps".into(),
                requests: 10,
                period_ms: 1000,
                burst: 50,
                exempt,
                ..Default::default()
            },
        ]
    );
    assert!(status(&c).warnings.is_empty(), "{:?}", status(&c).warnings);
    assert_eq!(
        c.snapshots[&ScopeKey::SharedPool].requires,
        vec![snap::feature::RATE_LIMIT.to_owned()]
    );
}

#[test]
fn our_rate_limit_annotations_set_burst_and_key() {
    let c = compile_with(
        false,
        &[
            BASE,
            &ingress(
                r#"{ingress.coxswain-labs.dev/rate-limit-rps: "10", ingress.coxswain-labs.dev/rate-limit-burst: "0", ingress.coxswain-labs.dev/rate-limit-key: "header:X-Api-Key"}"#,
                false,
            ),
        ],
    );
    let limits = only_route(&c).rate_limits;
    assert_eq!(limits.len(), 1);
    assert_eq!(limits[0].burst, 0);
    assert_eq!(limits[0].key, snap::rate_limit::Key::Header as i32);
    assert_eq!(limits[0].header, "x-api-key");

    // Bad values fail open with a warning each; 0 turns a limit off.
    let c = compile_with(
        false,
        &[
            BASE,
            &ingress(
                r#"{ingress.coxswain-labs.dev/rate-limit-rps: "lots", ingress.coxswain-labs.dev/rate-limit-rpm: "0", ingress.coxswain-labs.dev/rate-limit-burst: "3"}"#,
                false,
            ),
        ],
    );
    assert!(only_route(&c).rate_limits.is_empty());
    let warnings: Vec<&str> = status(&c)
        .warnings
        .iter()
        .map(|w| w.annotation.as_str())
        .collect();
    assert_eq!(
        warnings,
        vec![
            "ingress.coxswain-labs.dev/rate-limit-rps",
            "ingress.coxswain-labs.dev/rate-limit-burst"
        ]
    );
}

#[test]
fn auth_url_compiles_to_an_external_authorization_service_as_nginx_asks_it() {
    let c = compile_with(
        true,
        &[
            BASE,
            &ingress(
                "{nginx.ingress.kubernetes.io/auth-url: \"https://$host/oauth2/auth\", nginx.ingress.kubernetes.io/auth-signin: \"https://$host/oauth2/start?rd=$escaped_request_uri\", nginx.ingress.kubernetes.io/auth-response-headers: \"X-Auth-Request-User, X-Auth-Request-Email\", nginx.ingress.kubernetes.io/auth-method: post}",
                false,
            ),
        ],
    );
    assert!(status(&c).warnings.is_empty(), "{:?}", status(&c).warnings);
    let route = only_route(&c);
    assert_eq!(route.direct_status, 0);
    let auth = route.external_auth.expect("external auth");
    assert_eq!(
        auth,
        snap::ExternalAuth {
            protocol: snap::external_auth::Protocol::Http as i32,
            cluster: String::new(),
            address: "$host:443".into(),
            tls_hostname: "$host".into(),
            path: "/oauth2/auth".into(),
            path_is_prefix: false,
            method: "POST".into(),
            host: "$host".into(),
            request_fields: Vec::new(),
            all_request_fields: true,
            response_fields: vec!["x-auth-request-email".into(), "x-auth-request-user".into()],
            all_response_fields: false,
            deny_401_403_only: true,
            original_fields: true,
            signin_url: "https://$host/oauth2/start?rd=$escaped_request_uri".into(),
            failure_status: 500,
            timeout_ms: 0,
        }
    );
    let snapshot = c.snapshots.values().next().expect("a snapshot");
    assert!(
        snapshot
            .requires
            .contains(&snap::feature::EXTERNAL_AUTH.to_owned())
    );
}
