//! Router tests over snapshot fixtures written as YAML (the form `coxswain snapshot compile`
//! prints).

use super::*;
use coxswain_api::snapshot::Snapshot;

const SNAPSHOT: &str = r#"
listeners:
- port: 80
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: web, name: any, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /}}
  - hostname: "*.example.com"
    routes:
    - source: {kind: HTTPRoute, namespace: web, name: wild, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /}}
  - hostname: "*.api.example.com"
    routes:
    - source: {kind: HTTPRoute, namespace: web, name: api-wild, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /}}
  - hostname: shop.example.com
    routes:
    - source: {kind: HTTPRoute, namespace: web, name: shop, rule: 0}
      match: {path: {kind: KIND_EXACT, value: /cart}}
    - source: {kind: HTTPRoute, namespace: web, name: shop, rule: 1}
      match:
        path: {kind: KIND_PREFIX, value: /v1}
        method: POST
    - source: {kind: HTTPRoute, namespace: web, name: shop, rule: 2}
      match:
        path: {kind: KIND_PREFIX, value: /v1}
        headers: [{kind: KIND_EXACT, name: x-version, value: "2"}, {kind: KIND_REGEX, name: x-user, value: "[a-z]+"}]
    - source: {kind: HTTPRoute, namespace: web, name: shop, rule: 3}
      match:
        path: {kind: KIND_PREFIX, value: /v1}
        queryParams: [{kind: KIND_EXACT, name: debug, value: "1"}]
    - source: {kind: HTTPRoute, namespace: web, name: shop, rule: 4}
      match: {path: {kind: KIND_PREFIX, value: /v1/}}
    - source: {kind: HTTPRoute, namespace: web, name: shop, rule: 5}
      match: {path: {kind: KIND_REGEX, value: "/items/[0-9]+"}}
- port: 8443
  protocol: PROTOCOL_HTTPS
  virtualHosts:
  - hostname: secure.example.com
    routes:
    - source: {kind: HTTPRoute, namespace: web, name: secure, rule: 0}
"#;

fn router() -> Router {
    let snapshot = Snapshot::from_yaml(SNAPSHOT).unwrap();
    Router::build(&snapshot.seal()).unwrap()
}

fn lookup(
    r: &Router,
    port: u16,
    host: &str,
    path: &str,
    method: &str,
    headers: &[(&str, &str)],
) -> Option<String> {
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let req = Request {
        host,
        path_and_query: path,
        method,
        headers: headers.as_slice(),
    };
    r.route(port, &req).map(|c| {
        let s = c.route.source.as_ref().unwrap();
        format!("{}/{}", s.name, s.rule)
    })
}

#[test]
fn hosts_pick_exact_then_longest_wildcard_then_any() {
    let r = router();
    let get = |host| lookup(&r, 80, host, "/", "GET", &[]);
    assert_eq!(get("a.example.com").as_deref(), Some("wild/0"));
    assert_eq!(
        get("deep.a.example.com").as_deref(),
        Some("wild/0"),
        "several labels"
    );
    assert_eq!(
        get("v1.api.example.com").as_deref(),
        Some("api-wild/0"),
        "longer suffix wins"
    );
    assert_eq!(
        get("example.com").as_deref(),
        Some("any/0"),
        "never the bare suffix"
    );
    assert_eq!(get("other.org").as_deref(), Some("any/0"));
    // Host headers carry ports and any case; a trailing dot is the same name.
    assert_eq!(get("A.Example.COM:8080").as_deref(), Some("wild/0"));
    assert_eq!(
        lookup(&r, 80, "shop.example.com.", "/cart", "GET", &[]).as_deref(),
        Some("shop/0")
    );
    assert_eq!(get("[::1]:80").as_deref(), Some("any/0"));
}

#[test]
fn paths_match_exactly_by_element_and_by_full_regex() {
    let r = router();
    let get = |path| lookup(&r, 80, "shop.example.com", path, "GET", &[]);
    assert_eq!(get("/cart").as_deref(), Some("shop/0"));
    assert_eq!(get("/cart/"), None, "Exact is exact");
    assert_eq!(
        get("/v1").as_deref(),
        Some("shop/4"),
        "a prefix's trailing slash is ignored"
    );
    assert_eq!(get("/v1/orders").as_deref(), Some("shop/4"));
    assert_eq!(get("/v1orders"), None, "prefixes match whole path elements");
    assert_eq!(get("/items/42").as_deref(), Some("shop/5"));
    assert_eq!(get("/items/42/x"), None, "regexes match the whole path");
    assert_eq!(
        get("/cart?x=1").as_deref(),
        Some("shop/0"),
        "the query is not the path"
    );
}

#[test]
fn methods_headers_and_query_parameters_narrow_a_route_and_order_decides() {
    let r = router();
    let at = |method, path, headers: &[(&str, &str)]| {
        lookup(&r, 80, "shop.example.com", path, method, headers)
    };
    assert_eq!(at("POST", "/v1/x", &[]).as_deref(), Some("shop/1"));
    let both = [("X-Version", "2"), ("x-user", "ann")];
    assert_eq!(at("GET", "/v1/x", &both).as_deref(), Some("shop/2"));
    let upper = [("x-version", "2"), ("x-user", "Ann")];
    assert_eq!(
        at("GET", "/v1/x", &upper).as_deref(),
        Some("shop/4"),
        "regex is case-sensitive"
    );
    let one = [("x-version", "2")];
    assert_eq!(
        at("GET", "/v1/x", &one).as_deref(),
        Some("shop/4"),
        "all headers must match"
    );
    assert_eq!(
        at("GET", "/v1/x?a=b&debug=1", &[]).as_deref(),
        Some("shop/3")
    );
    assert_eq!(
        at("GET", "/v1/x?Debug=1", &[]).as_deref(),
        Some("shop/4"),
        "names are case-sensitive"
    );
    assert_eq!(
        at("GET", "/v1/x?debug=1&debug=2", &[]).as_deref(),
        Some("shop/3"),
        "first value counts"
    );
}

#[test]
fn ports_are_separate_tables() {
    let r = router();
    let secure = lookup(&r, 8443, "secure.example.com", "/anything", "GET", &[]);
    assert_eq!(
        secure.as_deref(),
        Some("secure/0"),
        "no match clause means any path"
    );
    assert_eq!(lookup(&r, 8443, "other.example.com", "/", "GET", &[]), None);
    assert_eq!(
        lookup(&r, 9999, "secure.example.com", "/", "GET", &[]),
        None
    );
    let mut ports: Vec<_> = r
        .ports()
        .map(|(p, b)| (p, b.protocol, b.public_port))
        .collect();
    ports.sort();
    assert_eq!(
        ports,
        [
            (80, snap::Protocol::Http, 80),
            (8443, snap::Protocol::Https, 8443)
        ],
        "without public_port, clients address the port listened on"
    );
}

#[test]
fn unsealed_snapshots_and_bad_regexes_are_refused() {
    // A table is built from a Sealed only, and a snapshot whose version is not its content
    // never becomes one.
    let snapshot = Snapshot::from_yaml(SNAPSHOT).unwrap();
    assert!(Sealed::check(snapshot.clone()).is_err(), "no version");
    let mut tampered = snapshot.clone().seal().into_snapshot();
    tampered.listeners[0].port = 81;
    assert!(Sealed::check(tampered).is_err(), "changed after sealing");

    let bad = SNAPSHOT.replace("/items/[0-9]+", "/items/(");
    let snapshot = Snapshot::from_yaml(&bad).unwrap();
    let err = Router::build(&snapshot.seal()).unwrap_err();
    assert!(err.to_string().contains("HTTPRoute/web/shop#5"), "{err}");
}

#[test]
fn outcomes_follow_backends_and_filters() {
    let yaml = r#"
listeners:
- port: 80
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: web, name: up, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /up}}
      backends: [{cluster: "web/up:80", weight: 1}, {cluster: "", weight: 1}]
    - source: {kind: HTTPRoute, namespace: web, name: down, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /down}}
      backends: [{cluster: "web/down:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: web, name: broken, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /broken}}
      directStatus: 500
    - source: {kind: HTTPRoute, namespace: web, name: moved, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /moved}}
      filters: [{kind: {requestRedirect: {scheme: https, statusCode: 301}}}]
clusters:
- name: web/up:80
  endpoints: [{address: 10.0.0.1, port: 8080, ready: true, serving: true}]
- name: web/down:80
  endpoints: [{address: 10.0.0.2, port: 8080, ready: false, serving: false, terminating: true}]
"#;
    let snapshot = Snapshot::from_yaml(yaml).unwrap();
    let r = Router::build(&snapshot.seal()).unwrap();
    let no_headers: Vec<(String, String)> = vec![];
    let outcome = |path| {
        let req = Request {
            host: "h",
            path_and_query: path,
            method: "GET",
            headers: no_headers.as_slice(),
        };
        r.outcome(r.route(80, &req)).status()
    };
    assert_eq!(outcome("/up"), 200);
    assert_eq!(outcome("/down"), 503);
    assert_eq!(outcome("/broken"), 500);
    assert_eq!(outcome("/moved"), 301);
    assert_eq!(outcome("/nothing"), 404);
}

#[test]
fn plain_field_edits_keep_a_route_on_the_fast_path() {
    let yaml = r#"
listeners:
- port: 80
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: web, name: edits, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /edits}}
      filters:
      - kind: {requestHeaderModifier: {set: [{name: x-tenant, value: a}]}}
      - kind: {responseHeaderModifier: {set: [{name: x-rule, value: "1"}]}}
      backends:
      - cluster: "web/up:80"
        weight: 1
        filters: [{kind: {responseHeaderModifier: {add: [{name: x-backend, value: "2"}]}}}]
    - source: {kind: HTTPRoute, namespace: web, name: framing, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /framing}}
      filters: [{kind: {responseHeaderModifier: {set: [{name: Content-Length, value: "0"}]}}}]
      backends: [{cluster: "web/up:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: web, name: rewrite, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /rewrite}}
      filters: [{kind: {urlRewrite: {hostname: b.example}}}]
      backends: [{cluster: "web/up:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: web, name: moved, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /moved}}
      filters: [{kind: {requestRedirect: {scheme: https, statusCode: 301}}}]
    - source: {kind: HTTPRoute, namespace: web, name: moved-edited, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /moved-edited}}
      filters:
      - kind: {requestRedirect: {scheme: https, statusCode: 301}}
      - kind: {responseHeaderModifier: {set: [{name: x-rule, value: "1"}]}}
    - source: {kind: HTTPRoute, namespace: web, name: gone, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /gone}}
      directStatus: 410
    - source: {kind: Ingress, namespace: web, name: inside, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /inside}}
      clientAllowlist: {cidrs: [{address: 10.0.0.0, prefixLen: 8}]}
      backends: [{cluster: "web/up:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: web, name: cors, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /cors}}
      filters: [{kind: {cors: {allowOrigins: ["*"]}}}]
      backends: [{cluster: "web/up:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: web, name: sticky, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /sticky}}
      sessionPersistence: {kind: COOKIE, name: s}
      backends: [{cluster: "web/up:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: web, name: retried, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /retried}}
      retry: {codes: [503], attempts: 2}
      backends: [{cluster: "web/up:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: web, name: plain, rule: 0}
      backends: [{cluster: "web/up:80", weight: 1}]
clusters:
- name: web/up:80
  endpoints: [{address: 10.0.0.1, port: 8080, ready: true, serving: true}]
"#;
    let snapshot = Snapshot::from_yaml(yaml).unwrap();
    let r = Router::build(&snapshot.seal()).unwrap();
    let no_headers: Vec<(String, String)> = vec![];
    let route = |path| {
        let req = Request {
            host: "h",
            path_and_query: path,
            method: "GET",
            headers: no_headers.as_slice(),
        };
        r.route(80, &req).unwrap()
    };
    let edits = route("/edits");
    assert!(edits.passthrough);
    // The rule's response edits apply first, then the backend's.
    let response: Vec<_> = edits.backends[0]
        .response_edits
        .as_deref()
        .unwrap()
        .iter()
        .flat_map(|m| m.set.iter().chain(&m.add).map(|h| h.name.as_str()))
        .collect();
    assert_eq!(response, ["x-rule", "x-backend"]);
    assert!(!route("/framing").passthrough);
    // A URL rewrite is written into the head the fast path sends.
    assert!(route("/rewrite").passthrough);
    // Answers the request layer decides: a redirect, a fixed status, an allowlist's 403. A
    // redirect with other filters is Pingora's.
    assert!(route("/moved").passthrough);
    assert!(!route("/moved-edited").passthrough);
    assert!(route("/gone").passthrough);
    assert!(route("/inside").passthrough);
    assert!(route("/cors").passthrough);
    // The request layer picks a session's endpoint; the fast path holds a retried answer
    // back itself (an HTTP/2 stream or a streamed body there is left to Pingora per request).
    assert!(route("/sticky").passthrough);
    assert!(route("/retried").passthrough);
    let plain = route("/plain");
    assert!(plain.passthrough);
    assert!(plain.backends[0].response_edits.is_none());
}

// An Ingress "*.foo.com" (single label) and a Gateway API "*.foo.com" on one port, as the
// compiler emits them: the multi-label virtual host first, then the single-label one holding
// the routes of both. An Ingress-only "*.bar.org" has no multi-label twin.
const SINGLE_LABEL: &str = r#"
listeners:
- port: 80
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: Ingress, namespace: web, name: default, rule: 0}
  - hostname: "*.foo.com"
    routes:
    - source: {kind: HTTPRoute, namespace: web, name: gw, rule: 0}
  - hostname: "*.foo.com"
    singleLabel: true
    routes:
    - source: {kind: Ingress, namespace: web, name: ing, rule: 0}
    - source: {kind: HTTPRoute, namespace: web, name: gw, rule: 0}
  - hostname: "*.bar.org"
    singleLabel: true
    routes:
    - source: {kind: Ingress, namespace: web, name: bar, rule: 0}
  - hostname: "*.org"
    routes:
    - source: {kind: HTTPRoute, namespace: web, name: org, rule: 0}
"#;

#[test]
fn a_single_label_wildcard_covers_one_label_and_a_multi_label_one_the_rest() {
    let snapshot = Snapshot::from_yaml(SINGLE_LABEL).unwrap();
    let r = Router::build(&snapshot.seal()).unwrap();
    let get = |host| lookup(&r, 80, host, "/", "GET", &[]);
    // One label above foo.com: the single-label host, whose first route is the Ingress's.
    assert_eq!(get("bar.foo.com").as_deref(), Some("ing/0"));
    assert_eq!(get("BAR.Foo.com.:80").as_deref(), Some("ing/0"));
    // Deeper: only the Gateway API wildcard covers it.
    assert_eq!(get("baz.bar.foo.com").as_deref(), Some("gw/0"));
    assert_eq!(get("a.b.c.foo.com").as_deref(), Some("gw/0"));
    // Never the bare suffix, nor an empty label.
    assert_eq!(get("foo.com").as_deref(), Some("default/0"));
    assert_eq!(get(".foo.com").as_deref(), Some("gw/0"));
    // Without a multi-label twin, a deeper host looks at shorter suffixes, then "".
    assert_eq!(get("x.bar.org").as_deref(), Some("bar/0"));
    assert_eq!(get("y.x.bar.org").as_deref(), Some("org/0"));
    assert_eq!(get("bar.org").as_deref(), Some("org/0"));
    // TLS ports' choice by SNI (the first route of a name) follows the same rules.
    let port = r.port(80).unwrap();
    let first = |host| {
        port.relay_route(host)
            .map(|(c, _)| c.route.source.as_ref().unwrap().name.clone())
    };
    assert_eq!(first("bar.foo.com").as_deref(), Some("ing"));
    assert_eq!(first("baz.bar.foo.com").as_deref(), Some("gw"));
}

#[test]
fn a_router_keeps_both_wildcards_whatever_their_order() {
    // The single-label host listed first: the multi-label one must not replace it.
    let yaml = SINGLE_LABEL.replacen(
        "  - hostname: \"*.foo.com\"\n    routes:\n    - source: {kind: HTTPRoute, namespace: web, name: gw, rule: 0}\n",
        "",
        1,
    ) + "  - hostname: \"*.foo.com\"\n    routes:\n    - source: {kind: HTTPRoute, namespace: web, name: gw, rule: 0}\n";
    let snapshot = Snapshot::from_yaml(&yaml).unwrap();
    assert_eq!(snapshot.listeners[0].virtual_hosts.len(), 5, "{yaml}");
    let r = Router::build(&snapshot.seal()).unwrap();
    let get = |host| lookup(&r, 80, host, "/", "GET", &[]);
    assert_eq!(get("bar.foo.com").as_deref(), Some("ing/0"));
    assert_eq!(get("baz.bar.foo.com").as_deref(), Some("gw/0"));
}

/// The cluster each of `n` picks of the first route on port 80 went to.
fn picks(r: &Router, n: usize) -> Vec<String> {
    let route = r.port(80).unwrap().relay_route("").unwrap().0;
    (0..n)
        .map(|_| match route.pick(&mut |_| None) {
            Pick::Endpoint { cluster, .. } => cluster.name.to_string(),
            _ => panic!("no endpoint"),
        })
        .collect()
}

#[test]
fn weighted_picks_interleave_so_every_run_splits_as_the_weights_say() {
    let weighted = |a: u32, b: u32| {
        let yaml = format!(
            r#"
listeners:
- port: 80
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {{kind: HTTPRoute, namespace: web, name: split, rule: 0}}
      backends: [{{cluster: "web/a:80", weight: {a}}}, {{cluster: "web/b:80", weight: {b}}}]
clusters:
- name: web/a:80
  endpoints: [{{address: 10.0.0.1, port: 8080, ready: true, serving: true}}]
- name: web/b:80
  endpoints: [{{address: 10.0.0.2, port: 8080, ready: true, serving: true}}]
"#
        );
        Router::build(&Snapshot::from_yaml(&yaml).unwrap().seal()).unwrap()
    };
    let share = |run: &[String]| run.iter().filter(|c| *c == "web/a:80").count();

    // 70:30 is a round of 10: every 10 consecutive picks hold exactly 7 to a, and no run of
    // more than a few goes to one backend.
    let seq = picks(&weighted(70, 30), 1000);
    for start in 0..990 {
        assert_eq!(
            share(&seq[start..start + 10]),
            7,
            "picks {start}..+10: {seq:?}"
        );
    }
    let longest = seq
        .chunk_by(|x, y| x == y)
        .map(<[String]>::len)
        .max()
        .unwrap();
    assert!(longest <= 3, "a run of {longest} picks to one backend");
    // So does a run of any length at any start: a proxy of several (each with its own
    // count) that sees 50 requests of 100 sends 35 of them to a, not 50 or 20 as whole
    // blocks of 70 and 30 would.
    for start in 0..950 {
        assert_eq!(share(&seq[start..start + 50]), 35, "picks {start}..+50");
    }
    // Weights with no common divisor and a long round still split evenly over any 100.
    let seq = picks(&weighted(997, 3), 10_000);
    for start in (0..9_000).step_by(1000) {
        let a = share(&seq[start..start + 1000]);
        assert!((995..=999).contains(&a), "picks {start}..+1000: {a} to a");
    }
    // A zero weight is never picked.
    assert!(picks(&weighted(1, 0), 50).iter().all(|c| c == "web/a:80"));
}

#[test]
fn mirrored_requests_are_spread_over_the_round_so_every_run_gets_its_share() {
    let mirrored = |numerator: u32, denominator: u32| {
        let yaml = format!(
            r#"
listeners:
- port: 80
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {{kind: HTTPRoute, namespace: web, name: copy, rule: 0}}
      filters:
      - kind: {{requestMirror: {{cluster: "web/m:80", numerator: {numerator}, denominator: {denominator}}}}}
      backends: [{{cluster: "web/a:80", weight: 1}}]
clusters:
- name: web/a:80
  endpoints: [{{address: 10.0.0.1, port: 8080, ready: true, serving: true}}]
- name: web/m:80
  endpoints: [{{address: 10.0.0.2, port: 8080, ready: true, serving: true}}]
"#
        );
        let r = Router::build(&Snapshot::from_yaml(&yaml).unwrap().seal()).unwrap();
        let route = r.port(80).unwrap().relay_route("").unwrap().0;
        let mirror = &route.mirrors[0];
        (0..1000).map(|_| mirror.sampled()).collect::<Vec<bool>>()
    };
    let copies = |run: &[bool]| run.iter().filter(|s| **s).count();

    // 20 in 100 is one in five: every 5 consecutive requests hold exactly one copy. A proxy
    // of two that sees 250 of 500 requests copies 50 of them, not 60 (the first 20 of each
    // 100 would give 20 + 20 + 20).
    let seq = mirrored(20, 100);
    for start in 0..995 {
        assert_eq!(copies(&seq[start..start + 5]), 1, "requests {start}..+5");
    }
    assert_eq!(copies(&seq[..250]), 50);
    // A share with no common divisor: any 100 consecutive requests hold 33 copies, and any
    // 50 hold 16 or 17, never a block of 33 followed by none.
    let seq = mirrored(33, 100);
    for start in 0..900 {
        assert_eq!(
            copies(&seq[start..start + 100]),
            33,
            "requests {start}..+100"
        );
    }
    for start in 0..950 {
        let c = copies(&seq[start..start + 50]);
        assert!((15..=18).contains(&c), "requests {start}..+50: {c} copies");
    }
    assert!(mirrored(0, 100).iter().all(|s| !s));
    assert!(mirrored(1, 1).iter().all(|s| *s));
}

/// The routes a host name lands on at port 80.
fn routes_at<'r>(r: &'r Router, host: &str) -> &'r [CompiledRoute] {
    let port = r.port(80).unwrap();
    port.host_routes(port.host_index(host).unwrap())
}

#[test]
fn a_rebuild_shares_the_routes_that_did_not_change() {
    let before = router();
    let mut snapshot = Snapshot::from_yaml(SNAPSHOT).unwrap();
    let hosts = &mut snapshot.listeners[0].virtual_hosts;
    // shop: rule 1 changed, rule 3 removed; *.example.com: a route added before "wild".
    let shop = &mut hosts[3].routes;
    shop[1].r#match.as_mut().unwrap().method = "PUT".into();
    shop.remove(3);
    let mut added = hosts[1].routes[0].clone();
    added.source.as_mut().unwrap().name = "added".into();
    added.r#match.as_mut().unwrap().path.as_mut().unwrap().value = "/new".into();
    hosts[1].routes.insert(0, added);
    let after = Router::build_after(
        &outline(&snapshot),
        &crate::metrics::Metrics::default(),
        &before,
    )
    .unwrap();

    let shared = |old: &CompiledRoute, new: &CompiledRoute| {
        Arc::ptr_eq(&old.route, &new.route)
            && Arc::ptr_eq(&old.policy, &new.policy)
            && Arc::ptr_eq(&old.counters, &new.counters)
    };
    let (old, new) = (
        routes_at(&before, "shop.example.com"),
        routes_at(&after, "shop.example.com"),
    );
    assert_eq!(new.len(), 5);
    assert!(shared(&old[0], &new[0]));
    assert!(!Arc::ptr_eq(&old[1].route, &new[1].route), "changed");
    assert_eq!(new[1].method.as_deref(), Some("PUT"));
    assert!(shared(&old[2], &new[2]));
    assert!(
        shared(&old[4], &new[3]) && shared(&old[5], &new[4]),
        "after the removed one"
    );
    let (old, new) = (
        routes_at(&before, "a.example.com"),
        routes_at(&after, "a.example.com"),
    );
    assert!(!Arc::ptr_eq(&old[0].route, &new[0].route), "added");
    assert!(shared(&old[0], &new[1]));
    assert!(shared(
        &routes_at(&before, "other.test")[0],
        &routes_at(&after, "other.test")[0]
    ));

    // What it routes is what a table built afresh routes.
    let fresh = Router::build(&snapshot.seal()).unwrap();
    for (host, path, method) in [
        ("shop.example.com", "/v1/x", "PUT"),
        ("shop.example.com", "/v1?debug=1", "GET"),
        ("shop.example.com", "/items/7", "GET"),
        ("a.example.com", "/new", "GET"),
        ("a.example.com", "/", "GET"),
    ] {
        assert_eq!(
            lookup(&after, 80, host, path, method, &[]),
            lookup(&fresh, 80, host, path, method, &[]),
            "{host}{path}"
        );
    }
}

const THREE_HOSTS: &str = r#"
listeners:
- port: 80
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: a.test
    routes:
    - source: {kind: HTTPRoute, namespace: web, name: a, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /}}
      backends: [{cluster: web/a:80, weight: 1}]
  - hostname: b.test
    routes:
    - source: {kind: HTTPRoute, namespace: web, name: b, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /}}
      backends: [{cluster: web/b:80, weight: 1}]
  - hostname: c.test
    routes:
    - source: {kind: HTTPRoute, namespace: web, name: c, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /}}
      filters: [{kind: {requestMirror: {cluster: web/a:80, numerator: 1, denominator: 1}}}]
      backends: [{cluster: web/c:80, weight: 1}]
clusters:
- name: web/a:80
  endpoints: [{address: 10.0.0.1, port: 80, ready: true, serving: true}]
- name: web/b:80
  endpoints: [{address: 10.0.0.2, port: 80, ready: true, serving: true}]
- name: web/c:80
  endpoints: [{address: 10.0.0.3, port: 80, ready: true, serving: true}]
"#;

fn host_at(r: &Router, host: &str) -> Arc<[CompiledRoute]> {
    let port = r.port(80).unwrap();
    Arc::clone(&port.hosts[port.host_index(host).unwrap()])
}

#[test]
fn a_rebuild_keeps_the_hosts_and_clusters_that_did_not_change() {
    let metrics = crate::metrics::Metrics::default();
    let snapshot = Snapshot::from_yaml(THREE_HOSTS).unwrap();
    let before = Router::build_with_metrics(&snapshot.clone().seal(), &metrics).unwrap();

    // The same snapshot again: every host and cluster is the previous table's.
    let same = Router::build_after(&outline(&snapshot), &metrics, &before).unwrap();
    for host in ["a.test", "b.test", "c.test"] {
        assert!(
            Arc::ptr_eq(&host_at(&before, host), &host_at(&same, host)),
            "{host}"
        );
    }
    for c in ["web/a:80", "web/b:80", "web/c:80"] {
        assert!(
            Arc::ptr_eq(before.cluster(c).unwrap(), same.cluster(c).unwrap()),
            "{c}"
        );
    }

    // Cluster a gets another endpoint: a new state for it, and new hosts for what sends to it
    // (a.test's backend, c.test's mirror); b.test stays as it was.
    let mut moved = snapshot.clone();
    moved.clusters[0].endpoints[0].address = "10.0.0.9".into();
    let after = Router::build_after(&outline(&moved), &metrics, &same).unwrap();
    assert!(!Arc::ptr_eq(
        same.cluster("web/a:80").unwrap(),
        after.cluster("web/a:80").unwrap()
    ));
    assert!(Arc::ptr_eq(
        same.cluster("web/b:80").unwrap(),
        after.cluster("web/b:80").unwrap()
    ));
    assert!(Arc::ptr_eq(
        &host_at(&same, "b.test"),
        &host_at(&after, "b.test")
    ));
    for host in ["a.test", "c.test"] {
        assert!(
            !Arc::ptr_eq(&host_at(&same, host), &host_at(&after, host)),
            "{host}"
        );
    }
    let a = after.cluster("web/a:80").unwrap();
    assert_eq!(a.pick(), Some("10.0.0.9:80".parse().unwrap()));
    let routed = host_at(&after, "a.test");
    assert!(Arc::ptr_eq(
        routed[0].backends[0].cluster.as_ref().unwrap(),
        a
    ));
    let mirrored = host_at(&after, "c.test");
    assert!(Arc::ptr_eq(
        mirrored[0].mirrors[0].cluster.as_ref().unwrap(),
        a
    ));
    // The route itself did not change: its copy, counters and policy are still shared.
    assert!(Arc::ptr_eq(
        &host_at(&same, "a.test")[0].route,
        &routed[0].route
    ));

    // A route of b.test changes: only b.test is compiled again.
    let mut edited = moved.clone();
    edited.listeners[0].virtual_hosts[1].routes[0]
        .r#match
        .as_mut()
        .unwrap()
        .method = "PUT".into();
    let last = Router::build_after(&outline(&edited), &metrics, &after).unwrap();
    assert!(!Arc::ptr_eq(
        &host_at(&after, "b.test"),
        &host_at(&last, "b.test")
    ));
    for host in ["a.test", "c.test"] {
        assert!(
            Arc::ptr_eq(&host_at(&after, host), &host_at(&last, host)),
            "{host}"
        );
    }

    // And the table routes as one built afresh from its snapshot.
    let fresh = Router::build(&edited.seal()).unwrap();
    for (host, method) in [
        ("a.test", "GET"),
        ("b.test", "PUT"),
        ("b.test", "GET"),
        ("c.test", "GET"),
    ] {
        let endpoint = |r: &Router| {
            let no_headers: &[(String, String)] = &[];
            let req = Request {
                host,
                path_and_query: "/x",
                method,
                headers: no_headers,
            };
            r.route(80, &req)
                .and_then(|c| c.backends[0].cluster.as_ref()?.pick())
        };
        assert_eq!(
            lookup(&last, 80, host, "/x", method, &[]),
            lookup(&fresh, 80, host, "/x", method, &[]),
            "{method} {host}"
        );
        assert_eq!(endpoint(&last), endpoint(&fresh), "{method} {host}");
    }
}

#[test]
fn a_cluster_with_a_client_certificate_is_built_again_every_time() {
    // The certificate lives outside the cluster: an unchanged cluster may present a changed one.
    let mut snapshot = Snapshot::from_yaml(THREE_HOSTS).unwrap();
    snapshot.clusters[1].tls = Some(snap::BackendTls {
        hostname: "b.web.svc".into(),
        client_certificate: "client".into(),
        ..Default::default()
    });
    let metrics = crate::metrics::Metrics::default();
    let before = Router::build_with_metrics(&snapshot.clone().seal(), &metrics).unwrap();
    let after = Router::build_after(&outline(&snapshot), &metrics, &before).unwrap();
    assert!(!Arc::ptr_eq(
        before.cluster("web/b:80").unwrap(),
        after.cluster("web/b:80").unwrap()
    ));
    assert!(!Arc::ptr_eq(
        &host_at(&before, "b.test"),
        &host_at(&after, "b.test")
    ));
    assert!(Arc::ptr_eq(
        before.cluster("web/a:80").unwrap(),
        after.cluster("web/a:80").unwrap()
    ));
}

/// A snapshot's outline, as a proxy receives it.
fn outline(snapshot: &Snapshot) -> Outline {
    Outline::of(&snapshot.clone().seal()).unwrap()
}

#[test]
fn a_table_holds_its_own_snapshots_bytes_and_no_earlier_ones() {
    // Hosts kept from the previous table take this snapshot's slices of their bytes: a table
    // keeps one snapshot's encoding alive, whatever it shares with tables before it.
    let metrics = crate::metrics::Metrics::default();
    let snapshot = Snapshot::from_yaml(THREE_HOSTS).unwrap();
    let before = Router::build_after(&outline(&snapshot), &metrics, &Router::default()).unwrap();
    let again = snapshot.clone().seal();
    let after = Router::build_after(&Outline::of(&again).unwrap(), &metrics, &before).unwrap();
    assert!(Arc::ptr_eq(
        &host_at(&before, "a.test"),
        &host_at(&after, "a.test")
    ));
    let buffer = again.encoded().as_ptr_range();
    let port = after.port(80).unwrap();
    assert_eq!(port.encoded.len(), 3);
    assert!(port.encoded.iter().all(|b| buffer.contains(&b.as_ptr())));
}

#[test]
fn a_changed_host_that_does_not_decode_is_refused_not_a_panic() {
    // Sealed by a sender that hashed garbage: the outline checks out, the route does not.
    use prost::encoding;
    let mut host = Vec::new();
    encoding::string::encode(1, &"a.test".to_owned(), &mut host);
    encoding::bytes::encode(2, &vec![0xff, 0xff, 0xff], &mut host);
    let mut listener = Vec::new();
    encoding::uint32::encode(1, &80, &mut listener);
    encoding::bytes::encode(4, &host, &mut listener);
    let mut body = vec![0; Sealed::ROOM];
    encoding::bytes::encode(3, &listener, &mut body);
    let sealed = Sealed::from_encoding(body);
    let bad = Outline::verify(sealed.encoded().clone()).unwrap();
    let metrics = crate::metrics::Metrics::default();
    let good = Snapshot::from_yaml(THREE_HOSTS).unwrap();
    let before = Router::build_after(&outline(&good), &metrics, &Router::default()).unwrap();
    let err = Router::build_after(&bad, &metrics, &before).unwrap_err();
    assert!(
        matches!(&err, BuildError::Decode { what, .. } if what.contains("a.test")),
        "{err}"
    );
    // A cluster that does not decode is refused too.
    let mut body = vec![0; Sealed::ROOM];
    encoding::bytes::encode(4, &vec![0x0a, 0x05, b'a'], &mut body);
    let sealed = Sealed::from_encoding(body);
    let bad = Outline::verify(sealed.encoded().clone()).unwrap();
    assert!(matches!(
        Router::build_after(&bad, &metrics, &before),
        Err(BuildError::Decode { .. })
    ));
}

/// Port 80's index of host names.
fn index_of(r: &Router) -> &Arc<HostIndex> {
    &r.port(80).unwrap().index
}

#[test]
fn a_host_added_or_removed_shifts_the_rest_and_they_are_still_shared() {
    let metrics = crate::metrics::Metrics::default();
    let snapshot = Snapshot::from_yaml(THREE_HOSTS).unwrap();
    let before = Router::build_after(&outline(&snapshot), &metrics, &Router::default()).unwrap();

    // "a2.test" goes between a.test and b.test: every other host is the previous one.
    let mut added = snapshot.clone();
    let mut host = added.listeners[0].virtual_hosts[0].clone();
    host.hostname = "a2.test".into();
    host.routes[0].source.as_mut().unwrap().name = "a2".into();
    added.listeners[0].virtual_hosts.insert(1, host);
    let after = Router::build_after(&outline(&added), &metrics, &before).unwrap();
    for h in ["a.test", "b.test", "c.test"] {
        assert!(
            Arc::ptr_eq(&host_at(&before, h), &host_at(&after, h)),
            "{h}"
        );
    }
    assert!(!Arc::ptr_eq(index_of(&before), index_of(&after)));
    assert_eq!(
        lookup(&after, 80, "a2.test", "/", "GET", &[]).as_deref(),
        Some("a2/0")
    );

    // And removed again: the rest are still shared, and a2.test is gone.
    let removed = Router::build_after(&outline(&snapshot), &metrics, &after).unwrap();
    for h in ["a.test", "b.test", "c.test"] {
        assert!(
            Arc::ptr_eq(&host_at(&after, h), &host_at(&removed, h)),
            "{h}"
        );
    }
    assert_eq!(lookup(&removed, 80, "a2.test", "/", "GET", &[]), None);

    // A route changed in place keeps the index of names.
    let mut edited = snapshot.clone();
    edited.listeners[0].virtual_hosts[1].routes[0]
        .r#match
        .as_mut()
        .unwrap()
        .method = "PUT".into();
    let last = Router::build_after(&outline(&edited), &metrics, &removed).unwrap();
    assert!(Arc::ptr_eq(index_of(&removed), index_of(&last)));
    assert!(!Arc::ptr_eq(
        &host_at(&removed, "b.test"),
        &host_at(&last, "b.test")
    ));
    assert_eq!(lookup(&last, 80, "b.test", "/", "GET", &[]), None);
    assert_eq!(
        lookup(&last, 80, "b.test", "/", "PUT", &[]).as_deref(),
        Some("b/0")
    );
}

mod differential {
    //! Tables built one from another over random changes route as tables built afresh.
    use super::*;
    use proptest::prelude::*;

    const NAMES: [&str; 8] = [
        "", "a.test", "b.test", "c.test", "*.w.test", "x.w.test", "*.test", "d.test",
    ];

    #[derive(Debug, Clone)]
    enum Change {
        /// Host NAMES[i] with a route to path /p{path} and cluster c{cluster}.
        Put {
            host: usize,
            path: u8,
            cluster: u8,
        },
        Remove {
            host: usize,
        },
        /// Cluster c{cluster}'s endpoint moves to 10.0.0.{address}.
        Move {
            cluster: u8,
            address: u8,
        },
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            (0..NAMES.len(), 0..3u8, 0..3u8).prop_map(|(host, path, cluster)| Change::Put {
                host,
                path,
                cluster
            }),
            (0..NAMES.len()).prop_map(|host| Change::Remove { host }),
            (0..3u8, 1..4u8).prop_map(|(cluster, address)| Change::Move { cluster, address }),
        ]
    }

    #[derive(Default)]
    struct Model {
        hosts: std::collections::BTreeMap<usize, (u8, u8)>,
        clusters: [u8; 3],
    }

    impl Model {
        fn snapshot(&self) -> Snapshot {
            let mut virtual_hosts: Vec<snap::VirtualHost> = self
                .hosts
                .iter()
                .map(|(&h, &(path, cluster))| snap::VirtualHost {
                    hostname: NAMES[h].into(),
                    routes: vec![snap::Route {
                        source: Some(snap::RouteSource {
                            kind: "HTTPRoute".into(),
                            namespace: "web".into(),
                            name: format!("h{h}"),
                            ..Default::default()
                        }),
                        r#match: Some(snap::RouteMatch {
                            path: Some(snap::PathMatch {
                                kind: snap::path_match::Kind::Prefix as i32,
                                value: format!("/p{path}"),
                            }),
                            ..Default::default()
                        }),
                        backends: vec![snap::WeightedBackend {
                            cluster: format!("c{cluster}"),
                            weight: 1,
                            ..Default::default()
                        }],
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect();
            virtual_hosts.sort_by(|a, b| a.hostname.cmp(&b.hostname));
            Snapshot {
                listeners: vec![snap::Listener {
                    port: 80,
                    protocol: snap::Protocol::Http as i32,
                    virtual_hosts,
                    ..Default::default()
                }],
                clusters: self
                    .clusters
                    .iter()
                    .enumerate()
                    .map(|(i, &a)| snap::Cluster {
                        name: format!("c{i}"),
                        endpoints: vec![snap::Endpoint {
                            address: format!("10.0.0.{a}"),
                            port: 80,
                            ready: true,
                            serving: true,
                            terminating: false,
                        }],
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }
        }
    }

    /// What a request for `host` at `path` gets: the route and where it sends.
    fn answer(r: &Router, host: &str, path: &str) -> Option<(String, Option<String>)> {
        let no_headers: &[(String, String)] = &[];
        let req = Request {
            host,
            path_and_query: path,
            method: "GET",
            headers: no_headers,
        };
        r.route(80, &req).map(|c| {
            let source = c
                .route
                .source
                .as_ref()
                .map(|s| s.name.clone())
                .unwrap_or_default();
            let to = c.backends[0]
                .cluster
                .as_ref()
                .map(|cl| format!("{} {}", cl.name, cl.addr(0)));
            (source, to)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn a_table_built_from_the_previous_routes_as_one_built_afresh(
            changes in proptest::collection::vec(change(), 1..25)
        ) {
            let metrics = crate::metrics::Metrics::default();
            let mut model = Model { clusters: [1, 1, 1], ..Default::default() };
            let mut table = Router::default();
            for change in changes {
                match change {
                    Change::Put { host, path, cluster } => {
                        model.hosts.insert(host, (path, cluster));
                    }
                    Change::Remove { host } => {
                        model.hosts.remove(&host);
                    }
                    Change::Move { cluster, address } => {
                        model.clusters[usize::from(cluster)] = address;
                    }
                }
                let snapshot = model.snapshot();
                table = Router::build_after(&outline(&snapshot), &metrics, &table).unwrap();
                let fresh = Router::build(&snapshot.seal()).unwrap();
                for host in ["a.test", "b.test", "c.test", "d.test", "x.w.test", "y.w.test", "z.test", "other"] {
                    for path in ["/p0", "/p1/x", "/p2"] {
                        prop_assert_eq!(
                            answer(&table, host, path),
                            answer(&fresh, host, path),
                            "{} {}", host, path
                        );
                    }
                }
            }
        }
    }
}
