//! Gateway API route timeouts through real sockets: the request timeout bounds the whole
//! exchange (answered 504), the backend request timeout each attempt, and 0 turns either off.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use std::time::{Duration, Instant};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ROUTES: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: request, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /request}}
      timeouts: {requestMs: 500}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: backend, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /backend}}
      timeouts: {backendRequestMs: 300}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: disabled, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /disabled}}
      timeouts: {requestMs: 0, backendRequestMs: 0}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: drip, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /drip}}
      timeouts: {requestMs: 500}
      backends: [{cluster: "t/drip:80", weight: 1}]
clusters:
- name: t/a:80
  endpoints: [{address: 127.0.0.1, port: {A}, ready: true}]
- name: t/drip:80
  endpoints: [{address: 127.0.0.1, port: {DRIP}, ready: true}]
"#;

/// A backend that answers at once and then sends its body a chunk every 100 ms for a second:
/// each read is quick, only the whole exchange is slow.
async fn drip_backend() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = 0;
                while !buf[..got].windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf[got..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got += n,
                    }
                }
                let head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
                if s.write_all(head).await.is_err() {
                    return;
                }
                for _ in 0..10 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if s.write_all(b"4\r\ndrip\r\n").await.is_err() {
                        return;
                    }
                }
                let _ = s.write_all(b"0\r\n\r\n").await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_and_backend_timeouts() {
    let a = echo_backend("a").await;
    let drip = drip_backend().await;
    let port = free_port();
    let snap = snapshot(
        ROUTES,
        &[
            ("PORT", port.to_string()),
            ("A", a.port().to_string()),
            ("DRIP", drip.port().to_string()),
        ],
    );
    let proxy = Proxy::start(&snap).await;
    let url = |p: &str| format!("http://127.0.0.1:{port}{p}");
    let timed = |path: &'static str| {
        let u = url(path);
        async move {
            let started = Instant::now();
            let r = get(&u, &[]).await;
            (r, started.elapsed())
        }
    };

    // Request timeout: fast answers pass, a slow backend is cut at the deadline with 504.
    assert_eq!(get(&url("/request"), &[]).await.unwrap().status, 200);
    let (r, took) = timed("/request?delay_ms=1000").await;
    assert_eq!(r.unwrap().status, 504);
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_millis(900),
        "{took:?}"
    );

    // Backend request timeout: each attempt gets 300 ms.
    assert_eq!(
        get(&url("/backend?delay_ms=100"), &[])
            .await
            .unwrap()
            .status,
        200
    );
    let (r, took) = timed("/backend?delay_ms=1000").await;
    assert_eq!(r.unwrap().status, 504);
    assert!(took < Duration::from_millis(800), "{took:?}");

    // 0 disables both.
    let r = get(&url("/disabled?delay_ms=1000"), &[]).await.unwrap();
    assert_eq!((r.status, r.header("x-backend")), (200, Some("a")));

    // The request timeout covers the whole response, not each read: a body still streaming
    // at the deadline is cut (the status went out already, so the body fails).
    let (r, took) = timed("/drip").await;
    assert!(
        r.as_ref().map_or(true, |r| r.body.len() < 40),
        "a full body arrived: {:?}",
        r.map(|r| r.body)
    );
    assert!(took < Duration::from_millis(900), "{took:?}");

    proxy.stop().await;
}
