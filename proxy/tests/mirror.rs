//! RequestMirror through real sockets: each mirror gets the request as the rule's filters
//! leave it, body included, in its own share; the client only ever sees the main backend, and
//! a mirror that is slow or down changes nothing for it.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use std::time::{Duration, Instant};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc::UnboundedReceiver;

const ROUTES: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: both, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /both}}
      filters:
      - kind: {requestHeaderModifier: {set: [{name: x-set, value: by-rule}], remove: [x-remove]}}
      - kind: {requestMirror: {cluster: "t/m1:80", numerator: 1, denominator: 1}}
      - kind: {requestMirror: {cluster: "t/m2:80", numerator: 1, denominator: 1}}
      backends:
      - cluster: "t/main:80"
        weight: 1
        filters: [{kind: {requestHeaderModifier: {set: [{name: x-main-only, value: "1"}]}}}]
    - source: {kind: HTTPRoute, namespace: t, name: halves, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /halves}}
      filters:
      - kind: {requestMirror: {cluster: "t/m1:80", numerator: 1, denominator: 2}}
      - kind: {requestMirror: {cluster: "t/m2:80", numerator: 1, denominator: 2}}
      backends: [{cluster: "t/main:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: broken, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /broken}}
      filters:
      - kind: {requestMirror: {cluster: "t/stuck:80", numerator: 1, denominator: 1}}
      - kind: {requestMirror: {cluster: "t/closed:80", numerator: 1, denominator: 1}}
      - kind: {requestMirror: {cluster: "t/unresolved:80", numerator: 1, denominator: 1}}
      backends: [{cluster: "t/main:80", weight: 1}]
clusters:
- name: t/main:80
  endpoints: [{address: 127.0.0.1, port: {MAIN}, ready: true}]
- name: t/m1:80
  endpoints: [{address: 127.0.0.1, port: {M1}, ready: true}]
- name: t/m2:80
  endpoints: [{address: 127.0.0.1, port: {M2}, ready: true}]
- name: t/stuck:80
  endpoints: [{address: 127.0.0.1, port: {STUCK}, ready: true}]
- name: t/closed:80
  endpoints: [{address: 127.0.0.1, port: {CLOSED}, ready: true}]
"#;

async fn next(rx: &mut UnboundedReceiver<Recorded>) -> Recorded {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("a mirrored request")
        .unwrap()
}

/// Sends raw bytes and reads the whole response (the proxy answers with close).
async fn raw(port: u16, request: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if out.windows(2).any(|w| w == b"ok") {
            break;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrors_get_the_filtered_request_with_its_body() {
    let (main, mut main_rx) = recording_backend().await;
    let (m1, mut m1_rx) = recording_backend().await;
    let (m2, mut m2_rx) = recording_backend().await;
    // Accepts and never reads or answers.
    let stuck = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = free_port();
    let snap = snapshot(
        ROUTES,
        &[
            ("PORT", port.to_string()),
            ("MAIN", main.port().to_string()),
            ("M1", m1.port().to_string()),
            ("M2", m2.port().to_string()),
            ("STUCK", stuck.local_addr().unwrap().port().to_string()),
            ("CLOSED", free_port().to_string()),
        ],
    );
    let proxy = Proxy::start(&snap).await;

    // Content-Length body: both mirrors get method, path, rule-filtered headers and body;
    // the backend's own filter stays with the main backend.
    let reply = raw(
        port,
        b"POST /both/x?q=1 HTTP/1.1\r\nhost: app.example\r\nx-remove: 1\r\ncontent-length: 12\r\nconnection: close\r\n\r\nhello mirror",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let seen = next(&mut main_rx).await;
    assert_eq!(seen.headers["x-main-only"], "1");
    for rx in [&mut m1_rx, &mut m2_rx] {
        let r = next(rx).await;
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("POST", "/both/x?q=1")
        );
        assert_eq!(r.body.as_ref(), b"hello mirror");
        assert_eq!(r.headers["host"], "app.example");
        assert_eq!(r.headers["x-set"], "by-rule");
        assert!(r.headers.get("x-remove").is_none());
        assert!(
            r.headers.get("x-main-only").is_none(),
            "backend filters are not mirrored"
        );
    }

    // A chunked body arrives whole.
    let reply = raw(
        port,
        b"PUT /both HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n\
          5\r\nhello\r\n7\r\n chunks\r\n0\r\n\r\n",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert_eq!(next(&mut main_rx).await.body.as_ref(), b"hello chunks");
    for rx in [&mut m1_rx, &mut m2_rx] {
        let r = next(rx).await;
        assert_eq!(
            (r.method.as_str(), r.body.as_ref()),
            ("PUT", &b"hello chunks"[..])
        );
    }

    // Two mirrors at 1/2 each: each counts its own share.
    let client = shared_client();
    for _ in 0..20 {
        let url = format!("http://127.0.0.1:{port}/halves");
        assert_eq!(
            request(&client, "GET", &url, &[]).await.unwrap().status,
            200
        );
    }
    for _ in 0..20 {
        next(&mut main_rx).await;
    }
    for rx in [&mut m1_rx, &mut m2_rx] {
        for _ in 0..10 {
            next(rx).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(rx.try_recv().is_err(), "more than half mirrored");
    }

    // Mirrors that hang, refuse connections or did not resolve do not delay the client.
    let started = Instant::now();
    for _ in 0..5 {
        let url = format!("http://127.0.0.1:{port}/broken");
        let r = request(&client, "POST", &url, &[]).await.unwrap();
        assert_eq!(r.status, 200);
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    proxy.stop().await;
}
