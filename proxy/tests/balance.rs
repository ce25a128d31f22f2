//! Load-balancing choices and session persistence on both engines, with real backends: a
//! session cookie or header keeps a client on one endpoint, a consistent hash keeps a key on
//! its endpoint when another joins, least request steers around a busy endpoint.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_proxy::limits::Limits;
use std::collections::{HashMap, HashSet};
use support::*;

async fn backends(names: &[&'static str]) -> Vec<std::net::SocketAddr> {
    let mut out = Vec::new();
    for n in names {
        out.push(echo_backend(n).await);
    }
    out
}

fn engine(fast_path: bool) -> &'static str {
    if fast_path { "fast path" } else { "pingora" }
}

async fn start(yaml: &str, vars: &[(&str, String)], fast_path: bool) -> (Proxy, u16) {
    let port = free_port();
    let mut vars = vars.to_vec();
    vars.push(("PORT", port.to_string()));
    let snap = snapshot(yaml, &vars);
    let proxy = Proxy::start_with(
        &snap,
        Limits {
            fast_path,
            ..Limits::default()
        },
    )
    .await;
    (proxy, port)
}

fn backend_of(r: &Reply) -> String {
    r.headers
        .get("x-backend")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

const SESSIONS: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: cookie, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /cookie}}
      sessionPersistence: {kind: COOKIE, name: app-session, maxAgeS: 3600, path: /cookie}
      backends: [{cluster: "t/three:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: header, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /header}}
      sessionPersistence: {kind: HEADER, name: X-Session}
      backends: [{cluster: "t/three:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: moved, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /moved}}
      sessionPersistence: {kind: COOKIE, name: app-session}
      backends: [{cluster: "t/half:80", weight: 1}]
clusters:
- name: t/half:80
  endpoints:
  - {address: 127.0.0.1, port: {A}, ready: true}
  - {address: 127.0.0.1, port: {DEAD}, ready: true}
- name: t/three:80
  endpoints:
  - {address: 127.0.0.1, port: {A}, ready: true}
  - {address: 127.0.0.1, port: {B}, ready: true}
  - {address: 127.0.0.1, port: {C}, ready: true}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cookie_or_header_keeps_a_client_on_one_endpoint() {
    let addrs = backends(&["a", "b", "c"]).await;
    // Listed as ready, refuses every connection.
    let dead: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let vars = [
        ("A", addrs[0].port().to_string()),
        ("B", addrs[1].port().to_string()),
        ("C", addrs[2].port().to_string()),
        ("DEAD", dead.port().to_string()),
    ];
    for fast_path in [true, false] {
        let engine = engine(fast_path);
        let (proxy, port) = start(SESSIONS, &vars, fast_path).await;
        let client = shared_client();
        let url = format!("http://127.0.0.1:{port}/cookie");

        // Without the cookie, requests spread, and each answer names its endpoint.
        let mut spread = HashSet::new();
        let mut cookie = String::new();
        for _ in 0..30 {
            let r = request(&client, "GET", &url, &[]).await.unwrap();
            assert_eq!(r.status, 200, "{engine}");
            let set = r.headers.get("set-cookie").expect("a new session is named");
            let set = set.to_str().unwrap();
            assert!(
                set.starts_with("app-session=")
                    && set.contains("; Path=/cookie")
                    && set.contains("; HttpOnly")
                    && set.contains("; Max-Age=3600"),
                "{engine}: {set}"
            );
            cookie = set.split(';').next().unwrap().to_owned();
            spread.insert(backend_of(&r));
        }
        assert_eq!(spread.len(), 3, "{engine}: without the cookie: {spread:?}");

        // With it: 200 requests, one endpoint, and no new cookie.
        let mut seen = HashSet::new();
        for _ in 0..200 {
            let r = request(
                &client,
                "GET",
                &url,
                &[("cookie", &format!("x=1; {cookie}"))],
            )
            .await
            .unwrap();
            assert_eq!(r.status, 200, "{engine}");
            assert!(r.headers.get("set-cookie").is_none(), "{engine}: renamed");
            seen.insert(backend_of(&r));
        }
        assert_eq!(seen.len(), 1, "{engine}: with the cookie: {seen:?}");

        // A cookie naming no endpoint of this cluster is served and named anew.
        let r = request(
            &client,
            "GET",
            &url,
            &[("cookie", "app-session=00000000deadbeef")],
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{engine}");
        assert!(
            r.headers.get("set-cookie").is_some(),
            "{engine}: stale cookie kept"
        );

        // The header kind: the answer's X-Session, sent back, pins the endpoint too.
        let url = format!("http://127.0.0.1:{port}/header");
        let r = request(&client, "GET", &url, &[]).await.unwrap();
        let session = r.headers.get("x-session").expect("header session named");
        let session = session.to_str().unwrap().to_owned();
        let first = backend_of(&r);
        for _ in 0..50 {
            let r = request(&client, "GET", &url, &[("x-session", &session)])
                .await
                .unwrap();
            assert_eq!(backend_of(&r), first, "{engine}: header session moved");
        }

        // A session whose endpoint refuses connections moves to one that answers, and the
        // answer names the new endpoint, not the one the request named.
        let url = format!("http://127.0.0.1:{port}/moved");
        let named = coxswain_proxy::balance::endpoint_id(dead);
        let served = coxswain_proxy::balance::endpoint_id(addrs[0]);
        for _ in 0..3 {
            let r = request(
                &client,
                "GET",
                &url,
                &[("cookie", &format!("app-session={named:016x}"))],
            )
            .await
            .unwrap();
            assert_eq!(r.status, 200, "{engine}");
            assert_eq!(backend_of(&r), "a", "{engine}");
            let set = r
                .headers
                .get("set-cookie")
                .expect("the new endpoint is named");
            assert_eq!(
                set.to_str().unwrap(),
                format!("app-session={served:016x}; Path=/; HttpOnly"),
                "{engine}"
            );
        }
        // The fast path served every one of them itself.
        let handed = proxy
            .metric("coxswain_proxy_http1_requests_pingora_total")
            .await;
        if fast_path {
            assert_eq!(handed, 0, "session routes left the fast path");
        } else {
            assert_eq!(
                handed, 285,
                "the Pingora engine counts each request it serves"
            );
        }
        proxy.stop().await;
    }
}

const HASHED: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: hashed, rule: 0}
      backends: [{cluster: "t/hashed:80", weight: 1}]
clusters:
- name: t/hashed:80
  loadBalancer: {algorithm: CONSISTENT_HASH, hash: {source: {header: X-User}}}
  endpoints:
{ENDPOINTS}
"#;

fn endpoint_lines(addrs: &[std::net::SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| {
            format!(
                "  - {{address: 127.0.0.1, port: {}, ready: true}}\n",
                a.port()
            )
        })
        .collect()
}

/// Which backend each of `keys` reaches.
async fn owners(port: u16, keys: &[String]) -> HashMap<String, String> {
    let client = shared_client();
    let url = format!("http://127.0.0.1:{port}/");
    let mut out = HashMap::new();
    for k in keys {
        let r = request(&client, "GET", &url, &[("x-user", k)])
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        out.insert(k.clone(), backend_of(&r));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consistent_hash_moves_about_a_quarter_of_the_keys_when_a_fourth_endpoint_joins() {
    let addrs = backends(&["a", "b", "c", "d"]).await;
    let keys: Vec<String> = (0..1000).map(|i| format!("user-{i}")).collect();
    for fast_path in [true, false] {
        let engine = engine(fast_path);
        let three = [("ENDPOINTS", endpoint_lines(&addrs[..3]))];
        let (proxy, port) = start(HASHED, &three, fast_path).await;
        let before = owners(port, &keys).await;
        // Asked again, every key lands where it did.
        assert_eq!(
            owners(port, &keys[..200])
                .await
                .iter()
                .filter(|(k, v)| before[*k] != **v)
                .count(),
            0,
            "{engine}: unstable"
        );
        let used: HashSet<&String> = before.values().collect();
        assert_eq!(used.len(), 3, "{engine}: keys on {used:?}");

        let mut vars = three.to_vec();
        vars[0].1 = endpoint_lines(&addrs);
        vars.push(("PORT", port.to_string()));
        let four = snapshot(HASHED, &vars);
        proxy.update(&four);
        proxy.wait_ready(&four.version).await;
        let after = owners(port, &keys).await;
        let moved: Vec<&String> = keys.iter().filter(|k| before[*k] != after[*k]).collect();
        eprintln!(
            "{engine}: {} of 1000 keys moved to the fourth endpoint",
            moved.len()
        );
        assert!(
            moved.iter().all(|k| after[*k] == "d"),
            "{engine}: keys moved between the old endpoints"
        );
        assert!(
            (150..=340).contains(&moved.len()),
            "{engine}: {} of 1000 keys moved",
            moved.len()
        );
        // A request without the key is still served (round robin).
        assert_eq!(
            get(&format!("http://127.0.0.1:{port}/"), &[])
                .await
                .unwrap()
                .status,
            200
        );
        proxy.stop().await;
    }
}

const LEAST: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: least, rule: 0}
      backends: [{cluster: "t/least:80", weight: 1}]
clusters:
- name: t/least:80
  loadBalancer: {algorithm: LEAST_REQUEST}
  endpoints:
  - {address: 127.0.0.1, port: {A}, ready: true}
  - {address: 127.0.0.1, port: {B}, ready: true}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_request_sends_new_requests_past_a_busy_endpoint() {
    for fast_path in [true, false] {
        let engine = engine(fast_path);
        let (a, a_hits) = echo_backend_with_hits("a").await;
        let (b, b_hits) = echo_backend_with_hits("b").await;
        let vars = [("A", a.port().to_string()), ("B", b.port().to_string())];
        let (proxy, port) = start(LEAST, &vars, fast_path).await;
        let slow_url = format!("http://127.0.0.1:{port}/?delay_ms=5000");
        let slow = tokio::spawn(async move { get(&slow_url, &[]).await });
        // Wait until the slow request has reached its endpoint: it is then in flight there.
        let hits = || {
            (
                a_hits.load(std::sync::atomic::Ordering::Relaxed),
                b_hits.load(std::sync::atomic::Ordering::Relaxed),
            )
        };
        for _ in 0..500 {
            if hits().0 + hits().1 == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let busy_since = std::time::Instant::now();
        let busy = if hits().0 == 1 { "a" } else { "b" };
        assert_eq!(
            hits().0 + hits().1,
            1,
            "{engine}: the slow request did not arrive"
        );
        let client = shared_client();
        let url = format!("http://127.0.0.1:{port}/");
        let (mut to_busy, mut while_busy) = (0, 0);
        for _ in 0..50 {
            let r = request(&client, "GET", &url, &[]).await.unwrap();
            assert_eq!(r.status, 200, "{engine}");
            // Only a request answered well before the slow one's delay ends was balanced
            // against it: on a loaded machine the 50 may outlast the delay.
            if busy_since.elapsed() > std::time::Duration::from_secs(4) {
                break;
            }
            while_busy += 1;
            if backend_of(&r) == busy {
                to_busy += 1;
            }
        }
        assert!(
            while_busy >= 10,
            "{engine}: only {while_busy} requests while the endpoint was busy"
        );
        // Round robin would send half of them there.
        assert_eq!(
            to_busy, 0,
            "{engine}: {to_busy} of {while_busy} went to the busy endpoint"
        );
        assert_eq!(slow.await.unwrap().unwrap().status, 200, "{engine}");
        // Once it is idle again, both take requests.
        let mut seen = HashSet::new();
        for _ in 0..50 {
            seen.insert(backend_of(
                &request(&client, "GET", &url, &[]).await.unwrap(),
            ));
        }
        assert_eq!(seen.len(), 2, "{engine}: {seen:?}");
        proxy.stop().await;
    }
}
