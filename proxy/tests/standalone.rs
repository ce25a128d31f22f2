//! The proxy with real sockets: echo backends, the proxy in standalone mode on a snapshot
//! file, real HTTP requests.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use support::*;

const ROUTES: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: exact, rule: 0}
      match: {path: {kind: KIND_EXACT, value: /exact}}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: headers, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /headers}}
      filters:
      - kind: {requestHeaderModifier: {set: [{name: x-set, value: set}], add: [{name: x-add, value: added}], remove: [x-remove]}}
      - kind: {responseHeaderModifier: {set: [{name: x-response, value: yes}], remove: [x-backend]}}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: rewrite, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /old}}
      filters:
      - kind: {urlRewrite: {hostname: internal.example, path: {kind: {replacePrefixMatch: /new}}}}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: redirect, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /moved}}
      filters:
      - kind: {requestRedirect: {scheme: https, hostname: secure.example, statusCode: 301}}
    - source: {kind: HTTPRoute, namespace: t, name: split, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /split}}
      backends: [{cluster: "t/a:80", weight: 3}, {cluster: "t/b:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: invalid, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /invalid}}
      directStatus: 500
    - source: {kind: HTTPRoute, namespace: t, name: down, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /down}}
      backends: [{cluster: "t/down:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: method, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /method}, method: POST}
      backends: [{cluster: "t/b:80", weight: 1}]
  - hostname: "*.wild.example"
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: wild, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /}}
      backends: [{cluster: "t/b:80", weight: 1}]
clusters:
- name: t/a:80
  endpoints: [{address: 127.0.0.1, port: {A}, ready: true, serving: true}]
- name: t/b:80
  endpoints: [{address: 127.0.0.1, port: {B}, ready: true, serving: true}]
- name: t/down:80
  endpoints: [{address: 127.0.0.1, port: {A}, ready: false, serving: false, terminating: true}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_filters_and_error_statuses() {
    let a = echo_backend("a").await;
    let b = echo_backend("b").await;
    let port = free_port();
    let snap = snapshot(
        ROUTES,
        &[
            ("PORT", port.to_string()),
            ("A", a.port().to_string()),
            ("B", b.port().to_string()),
        ],
    );
    let proxy = Proxy::start(&snap).await;
    let url = |p: &str| format!("http://127.0.0.1:{port}{p}");

    let r = get(&url("/exact"), &[]).await.unwrap();
    assert_eq!((r.status, r.header("x-backend")), (200, Some("a")));
    assert_eq!(
        get(&url("/exact/more"), &[]).await.unwrap().status,
        404,
        "Exact is exact"
    );

    let r = get(
        &url("/headers"),
        &[("x-remove", "1"), ("x-add", "orig"), ("x-set", "orig")],
    )
    .await
    .unwrap();
    let seen = r.json()["headers"].clone();
    assert_eq!(seen["x-set"], "set");
    assert_eq!(seen["x-add"], "orig, added", "add appends: {seen}");
    assert!(seen.get("x-remove").is_none(), "{seen}");
    assert_eq!(r.header("x-response"), Some("yes"));
    assert_eq!(r.header("x-backend"), None, "response header removed");

    let r = get(&url("/old/path?q=1"), &[]).await.unwrap();
    let seen = r.json();
    assert_eq!(seen["path"], "/new/path?q=1");
    assert_eq!(seen["headers"]["host"], "internal.example");

    let r = get(&url("/moved/x"), &[]).await.unwrap();
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("https://secure.example/moved/x"));

    assert_eq!(get(&url("/invalid"), &[]).await.unwrap().status, 500);
    assert_eq!(get(&url("/down"), &[]).await.unwrap().status, 503);
    assert_eq!(
        get(&url("/method"), &[]).await.unwrap().status,
        404,
        "GET is not POST"
    );
    let client = shared_client();
    let r = request(&client, "POST", &url("/method"), &[])
        .await
        .unwrap();
    assert_eq!(r.header("x-backend"), Some("b"));

    let r = get(&url("/"), &[("host", "deep.host.wild.example:8080")])
        .await
        .unwrap();
    assert_eq!(r.header("x-backend"), Some("b"), "wildcard host");
    assert_eq!(
        get(&url("/"), &[("host", "wild.example")])
            .await
            .unwrap()
            .status,
        404
    );

    // Metrics: requests by route rule and status class, unrouted ones, upstream latency.
    // Requests are counted in their log phase, just after the response went out: poll.
    let want = [
        r#"coxswain_proxy_requests_total{route="HTTPRoute/t/exact",rule="0",code="2xx"} 1"#,
        r#"coxswain_proxy_requests_total{route="HTTPRoute/t/redirect",rule="0",code="3xx"} 1"#,
        r#"coxswain_proxy_requests_total{route="HTTPRoute/t/down",rule="0",code="5xx"} 1"#,
        r#"coxswain_proxy_requests_total{route="",rule="",code="4xx"} 3"#,
    ];
    let mut metrics = String::new();
    for _ in 0..100 {
        metrics = get(&format!("http://{}/metrics", proxy.admin), &[])
            .await
            .unwrap()
            .body;
        if want.iter().all(|l| metrics.contains(l)) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    for line in want {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    assert!(
        metrics.contains("coxswain_proxy_upstream_response_seconds_count"),
        "{metrics}"
    );

    // Weighted split: exact 3:1 shares from the rotating counter.
    let mut counts = std::collections::HashMap::new();
    for _ in 0..400 {
        let r = request(&client, "GET", &url("/split"), &[]).await.unwrap();
        *counts
            .entry(r.header("x-backend").unwrap().to_owned())
            .or_insert(0) += 1;
    }
    assert_eq!((counts["a"], counts["b"]), (300, 100));

    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_swaps_under_load_lose_no_request() {
    let a = echo_backend("a").await;
    let b = echo_backend("b").await;
    let port = free_port();
    let template = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: moving, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /}}
      backends: [{cluster: "{TARGET}", weight: 1}]
clusters:
- name: t/a:80
  endpoints: [{address: 127.0.0.1, port: {A}, ready: true, serving: true}]
- name: t/b:80
  endpoints: [{address: 127.0.0.1, port: {B}, ready: true, serving: true}]
"#;
    let snap = |target: &str| {
        snapshot(
            template,
            &[
                ("PORT", port.to_string()),
                ("A", a.port().to_string()),
                ("B", b.port().to_string()),
                ("TARGET", target.to_owned()),
            ],
        )
    };
    let proxy = Proxy::start(&snap("t/a:80")).await;
    let url = format!("http://127.0.0.1:{port}/");

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        let url = url.clone();
        tokio::spawn(async move {
            let client = shared_client();
            let (mut ok, mut failed, mut seen) =
                (0u32, Vec::new(), std::collections::BTreeSet::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match request(&client, "GET", &url, &[]).await {
                    Ok(r) if r.status == 200 => {
                        ok += 1;
                        seen.insert(r.header("x-backend").unwrap_or("?").to_owned());
                    }
                    Ok(r) => failed.push(format!("status {}", r.status)),
                    Err(e) => failed.push(e),
                }
            }
            (ok, failed, seen)
        })
    };
    for i in 0..50 {
        let target = if i % 2 == 0 { "t/b:80" } else { "t/a:80" };
        let s = snap(target);
        proxy.update(&s);
        proxy.wait_ready(&s.version).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed, seen) = load.await.unwrap();
    assert!(
        failed.is_empty(),
        "{} failed requests: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(ok > 50, "only {ok} requests went through");
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["a", "b"]);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_follow_the_snapshot_and_bad_snapshots_keep_the_old_table() {
    let a = echo_backend("a").await;
    let (p1, p2) = (free_port(), free_port());
    let template = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: r, rule: 0}
      backends: [{cluster: "t/a:80", weight: 1}]
clusters:
- name: t/a:80
  endpoints: [{address: 127.0.0.1, port: {A}, ready: true, serving: true}]
"#;
    let on = |port: u16| {
        snapshot(
            template,
            &[("PORT", port.to_string()), ("A", a.port().to_string())],
        )
    };
    let proxy = Proxy::start(&on(p1)).await;
    assert_eq!(
        get(&format!("http://127.0.0.1:{p1}/"), &[])
            .await
            .unwrap()
            .status,
        200
    );

    let moved = on(p2);
    proxy.update(&moved);
    proxy.wait_ready(&moved.version).await;
    assert_eq!(
        get(&format!("http://127.0.0.1:{p2}/"), &[])
            .await
            .unwrap()
            .status,
        200
    );
    assert!(
        get(&format!("http://127.0.0.1:{p1}/"), &[]).await.is_err(),
        "old port released"
    );

    // A tampered file (version does not match content) is refused and counted; the proxy
    // keeps serving.
    let mut tampered = moved.clone();
    tampered.listeners[0].port = u32::from(p1);
    write_snapshot(&proxy.file, &tampered);
    proxy
        .metric_eventually("coxswain_proxy_snapshots_rejected_total", |n| n == 1)
        .await;
    assert_eq!(
        get(&format!("http://127.0.0.1:{p2}/"), &[])
            .await
            .unwrap()
            .status,
        200
    );
    let metrics = get(&format!("http://{}/metrics", proxy.admin), &[])
        .await
        .unwrap()
        .body;
    assert!(metrics.contains(&moved.version), "{metrics}");
    let ready = get(&format!("http://{}/readyz", proxy.admin), &[])
        .await
        .unwrap();
    assert_eq!(ready.status, 200);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_in_use_is_reported_and_served_once_it_is_free() {
    let a = echo_backend("a").await;
    let b = echo_backend("b").await;
    let port = free_port();
    // Another process's listener on the port, as when a proxy before this one still drains.
    let squatter = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let snap = snapshot(
        ROUTES,
        &[
            ("PORT", port.to_string()),
            ("A", a.port().to_string()),
            ("B", b.port().to_string()),
        ],
    );
    let proxy = Proxy::launch(&snap, Default::default()).await;
    assert_eq!(proxy.metric("coxswain_proxy_listeners_unbound").await, 1);

    drop(squatter);
    proxy
        .metric_eventually("coxswain_proxy_listeners_unbound", |n| n == 0)
        .await;
    let r = get(&format!("http://127.0.0.1:{port}/exact"), &[])
        .await
        .unwrap();
    assert_eq!((r.status, r.header("x-backend")), (200, Some("a")));
    proxy.stop().await;
}

/// A backend that accepts an Upgrade: websocket request and then echoes raw bytes, as a
/// WebSocket echo server does with frames.
async fn upgrade_echo_backend() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
                if !head.contains("upgrade: websocket") {
                    let _ = s
                        .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                        .await;
                    return;
                }
                // Pingora 0.9.1 tears an upgrade down when the upstream's 101 arrives before the
                // proxy has consumed the request's empty body (cloudflare/pingora#946, open):
                // a backend answering within microseconds on loopback hits that race about
                // one time in twenty. 20 ms stands for a real backend's round trip; the known
                // limitation is in the README.
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                let _ = s
                    .write_all(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\r\n")
                    .await;
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrades_pass_through() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let backend = upgrade_echo_backend().await;
    let port = free_port();
    let snap = snapshot(
        r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: ws, rule: 0}
      backends: [{cluster: "t/ws:80", weight: 1}]
clusters:
- name: t/ws:80
  appProtocol: APP_PROTOCOL_WS
  endpoints: [{address: 127.0.0.1, port: {B}, ready: true}]
"#,
        &[
            ("PORT", port.to_string()),
            ("B", backend.port().to_string()),
        ],
    );
    let proxy = Proxy::start(&snap).await;
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(
        b"GET /chat HTTP/1.1\r\nhost: ws.example\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            s.read(&mut byte).await.unwrap(),
            1,
            "connection closed: {head:?}"
        );
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    for message in [&b"hello"[..], b"\x81\x05frame", b"third"] {
        s.write_all(message).await.unwrap();
        let mut back = vec![0u8; message.len()];
        s.read_exact(&mut back).await.unwrap();
        assert_eq!(back, message);
    }
    drop(s);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_mirror_copies_a_share_of_requests() {
    let (primary, primary_hits) = echo_backend_with_hits("primary").await;
    let (mirror, mirror_hits) = echo_backend_with_hits("mirror").await;
    let port = free_port();
    let snap = snapshot(
        r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: all, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /all}}
      filters: [{kind: {requestMirror: {cluster: "t/mirror:80", numerator: 1, denominator: 1}}}]
      backends: [{cluster: "t/primary:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: quarter, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /quarter}}
      filters: [{kind: {requestMirror: {cluster: "t/mirror:80", numerator: 25, denominator: 100}}}]
      backends: [{cluster: "t/primary:80", weight: 1}]
clusters:
- name: t/primary:80
  endpoints: [{address: 127.0.0.1, port: {P}, ready: true}]
- name: t/mirror:80
  endpoints: [{address: 127.0.0.1, port: {M}, ready: true}]
"#,
        &[
            ("PORT", port.to_string()),
            ("P", primary.port().to_string()),
            ("M", mirror.port().to_string()),
        ],
    );
    let proxy = Proxy::start(&snap).await;
    let client = shared_client();
    for _ in 0..10 {
        let r = request(&client, "GET", &format!("http://127.0.0.1:{port}/all"), &[])
            .await
            .unwrap();
        assert_eq!(
            r.header("x-backend"),
            Some("primary"),
            "the client sees the primary only"
        );
    }
    for _ in 0..100 {
        request(
            &client,
            "GET",
            &format!("http://127.0.0.1:{port}/quarter"),
            &[],
        )
        .await
        .unwrap();
    }
    let ordering = std::sync::atomic::Ordering::Relaxed;
    // Copies are not awaited: give them a moment to land.
    for _ in 0..100 {
        if mirror_hits.load(ordering) >= 35 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(primary_hits.load(ordering), 110);
    assert_eq!(mirror_hits.load(ordering), 10 + 25);
    proxy.stop().await;
}
