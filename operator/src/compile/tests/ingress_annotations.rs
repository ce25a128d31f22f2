//! Ingress annotations compiled into routes, IngressClass parameters, canaries and
//! ingress-nginx compatibility.

use super::fixtures::*;
use coxswain_api::snapshot::{self as snap, Route, Snapshot, path_match};

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
    let c = compile_with(false, &docs);
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
    let c = compile_with(true, &docs);
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
    let c = compile_with(true, &[BASE, INGRESS_CLASS, SHOP_TLS, NGINX_STYLE]);
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
    let c = compile_with(false, &[BASE, INGRESS_CLASS, SHOP_TLS, NGINX_STYLE]);
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
