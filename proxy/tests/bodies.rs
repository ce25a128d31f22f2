//! Request bodies on both engines: Content-Length bodies up to 64 KiB are read whole by the
//! fast path and sent with the head; larger ones stream after it (`streamed_bodies.rs`).
//! Either way the backend gets every byte, a body that an answer (401) refuses is consumed so
//! the next request on the connection is read from the right place (or, when too large to
//! read here, the connection ends), and pipelined requests after a body are answered in order.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_proxy::limits::Limits;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ROUTES: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: Ingress, namespace: t, name: auth, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /auth}}
      basicAuth: {realm: bodies, users: ["u:{PLAIN}pw"]}
      backends: [{cluster: "t/rec:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: up, rule: 0}
      backends: [{cluster: "t/rec:80", weight: 1}]
clusters:
- name: t/rec:80
  endpoints: [{address: 127.0.0.1, port: {REC}, ready: true, serving: true}]
requires: [basic-auth]
"#;

/// Reads one response with a Content-Length body: (status, body).
async fn response(s: &mut TcpStream, buf: &mut Vec<u8>) -> (u16, Vec<u8>) {
    try_response(s, buf)
        .await
        .expect("closed before a response head")
}

/// The same; None when the connection closes before a response starts.
async fn try_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(u16, Vec<u8>)> {
    let fill = async |s: &mut TcpStream, buf: &mut Vec<u8>| {
        let mut chunk = [0u8; 8192];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk))
            .await
            .expect("an answer in time")
            .unwrap();
        buf.extend_from_slice(&chunk[..n]);
        n
    };
    let end = loop {
        if let Some(e) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break e + 4;
        }
        if fill(s, buf).await == 0 {
            assert!(buf.is_empty(), "closed inside a response head");
            return None;
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    buf.drain(..end);
    let status = head[9..12].parse().unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    while buf.len() < length {
        assert!(fill(s, buf).await > 0, "closed inside a body");
    }
    Some((status, buf.drain(..length).collect()))
}

fn post(path: &str, body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: a.example\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}

/// A body of `n` bytes that shows where each byte belongs.
fn body(n: usize) -> Vec<u8> {
    (0..n).map(|i| b'a' + (i % 26) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_reach_the_backend_whole_and_the_connection_stays_in_step() {
    for (fast_path, engine) in engines() {
        let (rec, mut seen) = recording_backend().await;
        let port = free_port();
        let snap = snapshot(
            ROUTES,
            &[("PORT", port.to_string()), ("REC", rec.port().to_string())],
        );
        let proxy = Proxy::start_with(
            &snap,
            Limits {
                fast_path,
                ..Limits::default()
            },
        )
        .await;
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut buf = Vec::new();

        // 1 KiB in one write, then 64 KiB (the largest the fast path reads whole) in pieces,
        // then one byte more than that, which streams.
        for size in [1024, 64 * 1024, 64 * 1024 + 1] {
            let sent = body(size);
            eprintln!("{engine}: POST of {size}");
            let req = post("/up", &sent);
            for piece in req.chunks(10_000) {
                s.write_all(piece).await.unwrap();
                s.flush().await.unwrap();
                tokio::task::yield_now().await;
            }
            assert_eq!(
                response(&mut s, &mut buf).await,
                (200, b"ok".to_vec()),
                "{engine}"
            );
            let got = seen.recv().await.unwrap();
            assert_eq!(got.method, "POST", "{engine}");
            assert_eq!(got.body.len(), size, "{engine}: body of {size}");
            assert!(
                got.body == sent,
                "{engine}: body of {size} changed on the way"
            );
        }

        // A refused request's body is never read as a request: the fast path consumes it and
        // answers the GET pipelined right after it; Pingora closes the connection after the
        // 401, and the client sends the GET again on a new one. Either way the backend gets a
        // GET with no body.
        let get = b"GET /after HTTP/1.1\r\nHost: a.example\r\n\r\n";
        let mut req = post("/auth", &body(300));
        req.extend_from_slice(get);
        s.write_all(&req).await.unwrap();
        assert_eq!(response(&mut s, &mut buf).await.0, 401, "{engine}");
        let after = match try_response(&mut s, &mut buf).await {
            Some(answer) => answer,
            None => {
                assert!(
                    !fast_path,
                    "the fast path closed the connection after a 401"
                );
                s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
                buf.clear();
                s.write_all(get).await.unwrap();
                response(&mut s, &mut buf).await
            }
        };
        assert_eq!(after, (200, b"ok".to_vec()), "{engine}");
        let got = seen.recv().await.unwrap();
        assert_eq!(
            (got.method.as_str(), got.path.as_str()),
            ("GET", "/after"),
            "{engine}"
        );
        assert!(got.body.is_empty(), "{engine}");

        // A POST and a GET in one write: both forwarded, in order.
        let mut req = post("/one", b"first");
        req.extend_from_slice(b"GET /two HTTP/1.1\r\nHost: a.example\r\n\r\n");
        s.write_all(&req).await.unwrap();
        for _ in 0..2 {
            assert_eq!(response(&mut s, &mut buf).await.0, 200, "{engine}");
        }
        let first = seen.recv().await.unwrap();
        assert_eq!(
            (first.path.as_str(), &first.body[..]),
            ("/one", &b"first"[..]),
            "{engine}"
        );
        let second = seen.recv().await.unwrap();
        assert_eq!(second.path, "/two", "{engine}");
        proxy.stop().await;
    }
}

/// The fast path waits for a body at most the head deadline: a client that stops halfway
/// gets 408 and the connection closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_halfway_is_answered_408_by_the_fast_path() {
    let (rec, _seen) = recording_backend().await;
    let port = free_port();
    let snap = snapshot(
        ROUTES,
        &[("PORT", port.to_string()), ("REC", rec.port().to_string())],
    );
    let proxy = Proxy::start_with(
        &snap,
        Limits {
            request_head: Duration::from_millis(300),
            ..Limits::default()
        },
    )
    .await;
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(b"POST /up HTTP/1.1\r\nHost: a.example\r\nContent-Length: 10\r\n\r\nhalf.")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer))
        .await
        .expect("the proxy closes the connection")
        .unwrap();
    assert_eq!(
        status_of(&answer),
        Some(408),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    proxy.stop().await;
}

/// A request refused (401) with a body larger than the fast path reads whole: the answer
/// comes before the body is sent, and the connection ends after it on both engines, so the
/// body is never read as a request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_with_a_large_body_ends_its_connection() {
    for (fast_path, engine) in engines() {
        let (rec, mut seen) = recording_backend().await;
        let port = free_port();
        let snap = snapshot(
            ROUTES,
            &[("PORT", port.to_string()), ("REC", rec.port().to_string())],
        );
        let proxy = Proxy::start_with(
            &snap,
            Limits {
                fast_path,
                ..Limits::default()
            },
        )
        .await;
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        // The head and a first part of a 1 MiB body; the rest never comes.
        let mut req = post("/auth", &body(1 << 20));
        req.truncate(req.len() - (1 << 19));
        s.write_all(&req).await.unwrap();
        let mut buf = Vec::new();
        assert_eq!(response(&mut s, &mut buf).await.0, 401, "{engine}");
        assert!(
            try_response(&mut s, &mut buf).await.is_none(),
            "{engine}: the connection stayed open"
        );
        assert!(
            seen.try_recv().is_err(),
            "{engine}: a request went upstream"
        );
        proxy.stop().await;
    }
}
