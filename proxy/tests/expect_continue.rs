//! `Expect: 100-continue` on both engines. A client that asks for it holds its body back
//! until it hears 100 Continue (curl does so for uploads, waiting a second before it gives
//! up and sends anyway): the proxy forwards the head at once, relays the backend's 100, and
//! the body then reaches the backend whole, with a Content-Length or chunked, the connection
//! staying usable (on the fast path; Pingora closes it after such an exchange). An answer the
//! request layer gives before the body (a 401) comes at once and closes the connection, since
//! the client may never send the body. On the fast path none of these go to Pingora, and a
//! client that stops after the 100 gets 408 without the backend being blamed for the wait.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use bytes::Bytes;
use coxswain_proxy::limits::Limits;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::net::SocketAddr;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const ROUTES: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: Ingress, namespace: t, name: auth, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /auth}}
      basicAuth: {realm: up, users: ["u:{PLAIN}pw"]}
      backends: [{cluster: "t/b:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: up, rule: 0}
      backends: [{cluster: "t/b:80", weight: 1}]
clusters:
- name: t/b:80
  endpoints: [{address: 127.0.0.1, port: {B}, ready: true}]
requires: [basic-auth]
"#;

/// How long a step may take before the test fails: far past what any of them needs, and
/// below curl's one second, after which a client sends its body without the 100.
const STEP: Duration = Duration::from_millis(900);

/// A backend that reads each request's body (hyper answers `Expect: 100-continue` with 100
/// Continue as the body is first read) and answers with its length and the Expect it saw.
async fn reading_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let expect = req
                        .headers()
                        .get("expect")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("none")
                        .to_owned();
                    let body = req.into_body().collect().await?.to_bytes();
                    let text = format!("{} bytes, expect {expect}", body.len());
                    Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from(text))))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// Reads one response head, and its Content-Length body, from `conn`; `buf` keeps what
/// came after. Fails the test when it does not come within `STEP`.
async fn read_answer(conn: &mut TcpStream, buf: &mut Vec<u8>) -> (String, String) {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end + 4]).into_owned();
            let length = head
                .lines()
                .find_map(|l| {
                    let (n, v) = l.split_once(':')?;
                    n.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + length]).into_owned();
                buf.drain(..end + 4 + length);
                return (head, body);
            }
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(STEP, conn.read(&mut chunk))
            .await
            .unwrap_or_else(|_| panic!("no answer in time; read so far: {buf:?}"))
            .unwrap();
        assert!(n > 0, "the proxy closed; read so far: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn start(fast_path: bool) -> (Proxy, u16) {
    let backend = reading_backend().await;
    let port = free_port();
    let snap = snapshot(
        ROUTES,
        &[
            ("PORT", port.to_string()),
            ("B", backend.port().to_string()),
        ],
    );
    let limits = Limits {
        fast_path,
        ..Limits::default()
    };
    (Proxy::start_with(&snap, limits).await, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_back_body_goes_up_after_the_backends_100_continue() {
    for (fast_path, engine) in engines() {
        let (proxy, port) = start(fast_path).await;
        let mut conn = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut buf = Vec::new();
        let body = vec![b'x'; 3000];
        let chunked = b"7d0\r\n"
            .iter()
            .chain(&body[..2000])
            .chain(b"\r\n0\r\n\r\n")
            .copied()
            .collect::<Vec<u8>>();
        let framings: [(&str, &[u8], usize); 2] = [
            ("content-length: 3000", &body, 3000),
            ("transfer-encoding: chunked", &chunked, 2000),
        ];
        // Twice each, on one connection on the fast path: it stays in step after each.
        for (framing, sent, length) in framings.iter().chain(&framings) {
            // Pingora 0.9.1 closes a connection after an exchange that expected 100 Continue.
            if !fast_path {
                conn = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
                buf.clear();
            }
            let head = format!(
                "POST /upload HTTP/1.1\r\nhost: gw.example\r\n{framing}\r\nexpect: 100-continue\r\n\r\n"
            );
            conn.write_all(head.as_bytes()).await.unwrap();
            let (interim, _) = read_answer(&mut conn, &mut buf).await;
            assert!(
                interim.starts_with("HTTP/1.1 100 "),
                "{engine}, {framing}: {interim}"
            );
            conn.write_all(sent).await.unwrap();
            let (head, answer) = read_answer(&mut conn, &mut buf).await;
            assert!(
                head.starts_with("HTTP/1.1 200 "),
                "{engine}, {framing}: {head}"
            );
            assert_eq!(
                answer,
                format!("{length} bytes, expect 100-continue"),
                "{engine}, {framing}"
            );
        }
        // A client that did not wait sends its body with the head: the same answer.
        if !fast_path {
            conn = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            buf.clear();
        }
        let whole = b"POST /upload HTTP/1.1\r\nhost: gw.example\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\nhello".to_vec();
        conn.write_all(&whole[..]).await.unwrap();
        let (first, _) = read_answer(&mut conn, &mut buf).await;
        let (last, answer) = if first.starts_with("HTTP/1.1 100 ") {
            read_answer(&mut conn, &mut buf).await
        } else {
            (first, String::new())
        };
        assert!(last.starts_with("HTTP/1.1 200 "), "{engine}: {last}");
        assert_eq!(answer, "5 bytes, expect 100-continue", "{engine}");
        let handed = proxy
            .metric("coxswain_proxy_http1_requests_pingora_total")
            .await;
        if fast_path {
            assert_eq!(
                handed, 0,
                "requests expecting 100 Continue left the fast path"
            );
        } else {
            assert_eq!(handed, 5, "{engine}");
        }
        proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_before_the_body_comes_at_once_and_closes_the_connection() {
    for (fast_path, engine) in engines() {
        let (proxy, port) = start(fast_path).await;
        let mut conn = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut buf = Vec::new();
        conn.write_all(
            b"POST /auth HTTP/1.1\r\nhost: gw.example\r\ncontent-length: 3000\r\nexpect: 100-continue\r\n\r\n",
        )
        .await
        .unwrap();
        // No credentials: 401 without the body, and no 100 before it.
        let (head, _) = read_answer(&mut conn, &mut buf).await;
        assert!(head.starts_with("HTTP/1.1 401 "), "{engine}: {head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("www-authenticate: basic"),
            "{engine}: {head}"
        );
        if fast_path {
            // The client may never send the body: the connection cannot go on.
            assert!(
                head.to_ascii_lowercase().contains("connection: close"),
                "{engine}: {head}"
            );
            let mut rest = [0u8; 64];
            let n = tokio::time::timeout(STEP * 5, conn.read(&mut rest))
                .await
                .expect("the connection was left open")
                .unwrap_or(0);
            assert_eq!(n, 0, "{engine}: more after the answer");
            let handed = proxy
                .metric("coxswain_proxy_http1_requests_pingora_total")
                .await;
            assert_eq!(handed, 0, "{engine}");
        }
        proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_silent_after_the_100_gets_408_and_the_backend_is_not_blamed() {
    let backend = reading_backend().await;
    let port = free_port();
    let snap = snapshot(
        ROUTES,
        &[
            ("PORT", port.to_string()),
            ("B", backend.port().to_string()),
        ],
    );
    // A short wait for each read of a body, so the test does not sit out the default.
    let limits = Limits {
        request_head: Duration::from_millis(300),
        ..Limits::default()
    };
    let proxy = Proxy::start_with(&snap, limits).await;
    let mut conn = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut buf = Vec::new();
    conn.write_all(
        b"POST /upload HTTP/1.1\r\nhost: gw.example\r\ncontent-length: 1000\r\nexpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    let (interim, _) = read_answer(&mut conn, &mut buf).await;
    assert!(interim.starts_with("HTTP/1.1 100 "), "{interim}");
    // The body never comes: the client is told so once the body's wait ran out.
    let (head, _) = read_answer(&mut conn, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 408 "), "{head}");
    let timeouts = proxy.metric("coxswain_proxy_upstream_timeouts_total").await;
    assert_eq!(
        timeouts, 0,
        "the backend waiting for the body was counted as slow"
    );
    let handed = proxy
        .metric("coxswain_proxy_http1_requests_pingora_total")
        .await;
    assert_eq!(handed, 0);
    proxy.stop().await;
}
