//! Route timeouts through real sockets, on both engines and over HTTP/1.1 and HTTP/2: the
//! request timeout bounds the whole exchange (answered 504), the backend request timeout each
//! attempt, the Ingress read timeout each read, and 0 turns the first two off. The fast path
//! serves every request here but the streamed body, which it leaves to Pingora.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use std::time::{Duration, Instant};
use support::http2::h2c;
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
    - source: {kind: Ingress, namespace: t, name: read, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /read}}
      timeouts: {readMs: 300, sendMs: 300, connectMs: 1000}
      backends: [{cluster: "t/a:80", weight: 1}]
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

async fn start(fast_path: bool) -> (Proxy, u16) {
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
    let limits = coxswain_proxy::limits::Limits {
        fast_path,
        ..Default::default()
    };
    (Proxy::start_with(&snap, limits).await, port)
}

/// One HTTP/2 GET on its own h2c connection: its status (0: the stream failed), the body
/// bytes that came, and how long it took.
async fn h2_get(port: u16, path: &str) -> (u16, usize, Duration) {
    let started = Instant::now();
    let mut h2 = h2c(port).await;
    let req = hyper::Request::get(format!("http://t.example{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let Ok(resp) = h2.send_request(req).await else {
        return (0, 0, started.elapsed());
    };
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    let mut got = 0;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => got += f.data_ref().map_or(0, |d| d.len()),
            // Cut off: what came is what counts.
            Err(_) => return (status, got, started.elapsed()),
        }
    }
    (status, got, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_backend_and_read_timeouts_on_both_engines() {
    for (fast_path, engine) in engines() {
        let (proxy, port) = start(fast_path).await;
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
        assert_eq!(r.unwrap().status, 504, "{engine}");
        assert!(
            took >= Duration::from_millis(450) && took < Duration::from_millis(900),
            "{engine}: {took:?}"
        );

        // Backend request timeout: each attempt gets 300 ms.
        let r = get(&url("/backend?delay_ms=100"), &[]).await.unwrap();
        assert_eq!(r.status, 200, "{engine}");
        let (r, took) = timed("/backend?delay_ms=1000").await;
        assert_eq!(r.unwrap().status, 504, "{engine}");
        assert!(took < Duration::from_millis(800), "{engine}: {took:?}");

        // 0 disables both.
        let r = get(&url("/disabled?delay_ms=1000"), &[]).await.unwrap();
        assert_eq!(
            (r.status, r.header("x-backend")),
            (200, Some("a")),
            "{engine}"
        );

        // The Ingress read timeout bounds each read: 300 ms.
        let r = get(&url("/read?delay_ms=50"), &[]).await.unwrap();
        assert_eq!(r.status, 200, "{engine}");
        let (r, took) = timed("/read?delay_ms=1000").await;
        assert_eq!(r.unwrap().status, 504, "{engine}");
        assert!(took < Duration::from_millis(800), "{engine}: {took:?}");

        // The request timeout covers the whole response, not each read: a body still
        // streaming at the deadline is cut (the status went out already, so the body fails).
        let (r, took) = timed("/drip").await;
        assert!(
            r.as_ref().map_or(true, |r| r.body.len() < 40),
            "{engine}: a full body arrived: {:?}",
            r.map(|r| r.body)
        );
        assert!(took < Duration::from_millis(900), "{engine}: {took:?}");

        // A body whose arrival outlasts the request timeout: 504 once it came (the fast path
        // reads it whole first) or at its next piece (Pingora), not at the backend's answer.
        let started = Instant::now();
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let head = "POST /request/slow-body?delay_ms=1000 HTTP/1.1\r\nhost: t.example\r\ncontent-length: 10\r\n\r\nhello";
        s.write_all(head.as_bytes()).await.unwrap();
        // The client is slow on purpose: the rest of its body comes past the deadline.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let _ = s.write_all(b"world").await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 504"), "{engine}: {answer}");
        let took = started.elapsed();
        assert!(took < Duration::from_millis(950), "{engine}: {took:?}");

        // Over HTTP/2 the same bounds hold, stream by stream.
        let (status, _, took) = h2_get(port, "/request?delay_ms=1000").await;
        assert_eq!(status, 504, "{engine}: h2");
        assert!(took < Duration::from_millis(900), "{engine}: h2 {took:?}");
        let (status, _, _) = h2_get(port, "/backend?delay_ms=100").await;
        assert_eq!(status, 200, "{engine}: h2");
        let (status, _, took) = h2_get(port, "/read?delay_ms=1000").await;
        assert_eq!(status, 504, "{engine}: h2");
        assert!(took < Duration::from_millis(800), "{engine}: h2 {took:?}");
        let (status, got, took) = h2_get(port, "/drip").await;
        assert_eq!(status, 200, "{engine}: h2");
        assert!(got < 40, "{engine}: h2, a full body arrived ({got} bytes)");
        assert!(took < Duration::from_millis(900), "{engine}: h2 {took:?}");

        // Which engine served them: on the fast path every HTTP/1 request and HTTP/2 stream
        // above stayed there.
        let to_pingora = proxy
            .metric("coxswain_proxy_http1_requests_pingora_total")
            .await;
        let streams_to_pingora = proxy
            .metric("coxswain_proxy_http2_streams_pingora_total")
            .await;
        if fast_path {
            assert_eq!((to_pingora, streams_to_pingora), (0, 0), "{engine}");
        } else {
            // The nine HTTP/1 requests above, each handed over.
            assert_eq!(to_pingora, 9, "{engine}");
            assert_eq!(streams_to_pingora, 4, "{engine}");
        }

        // A body that would stream (over 64 KiB) on a route with a request timeout is
        // Pingora's, which bounds it as it arrives.
        let big = vec![b'x'; 100 * 1024];
        let r = post(&url("/request/big"), big).await;
        assert_eq!(r.status, 200, "{engine}");
        let after = proxy
            .metric("coxswain_proxy_http1_requests_pingora_total")
            .await;
        assert_eq!(after, to_pingora + 1, "{engine}");

        proxy.stop().await;
    }
}

/// One HTTP/1.1 POST with a Content-Length body.
async fn post(url: &str, body: Vec<u8>) -> Reply {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    request_with_body(&client, "POST", url, body).await.unwrap()
}
