//! A connection closed while its client is still sending: the answer must reach the client.
//! Closing with bytes unread makes the kernel answer with a TCP reset, and a client whose
//! writes fail does not read what came before (RFC 9112 section 9.6). Each test writes 8 MiB,
//! more than the socket buffers take (about 4 MiB here), after what makes the proxy close,
//! on both engines: the fast path's own closes and Pingora's.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_proxy::limits::Limits;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ROUTES: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: Ingress, namespace: t, name: small, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /small}}
      maxRequestBodyBytes: 1024
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: gone, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /gone}}
      backends: [{cluster: "t/gone:80", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: public, rule: 0}
      backends: [{cluster: "t/a:80", weight: 1}]
- port: {TLS_PORT}
  protocol: PROTOCOL_HTTPS
  certificates: [{sni: "", certificate: t/self}]
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: Ingress, namespace: t, name: small-tls, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /small}}
      maxRequestBodyBytes: 1024
      backends: [{cluster: "t/a:80", weight: 1}]
clusters:
- name: t/a:80
  endpoints: [{address: 127.0.0.1, port: {A}, ready: true}]
- name: t/gone:80
  endpoints: [{address: 127.0.0.1, port: {GONE}, ready: true}]
certificates:
- {name: t/self, certChainPem: "{CERT}", privateKeyPem: "{KEY}"}
"#;

/// Sends `head`, then 8 MiB of `filler` (each write must succeed), then reads the answer to
/// its end: the status the client got.
async fn status_while_sending(port: u16, head: &[u8], filler: &[u8], engine: &str) -> u16 {
    let c = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    status_over(c, head, filler, engine).await
}

async fn status_over<S>(mut c: S, head: &[u8], filler: &[u8], engine: &str) -> u16
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    c.write_all(head).await.unwrap();
    for i in 0..(8 << 20) / filler.len() {
        if let Err(e) = c.write_all(filler).await {
            panic!("{engine}: write {i} failed: {e}");
        }
    }
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut answer)).await;
    assert!(matches!(read, Ok(Ok(_))), "{engine}: {read:?}");
    status_of(&answer).unwrap_or_else(|| {
        panic!(
            "{engine}: no status in {:?}",
            String::from_utf8_lossy(&answer)
        )
    })
}

struct Ports {
    http: u16,
    https: u16,
}

async fn proxy(limits: Limits) -> (Proxy, Ports) {
    let (port, tls_port) = (free_port(), free_port());
    let c = cert("proxy.example");
    let backend = echo_backend("a").await;
    // A port nothing listens on: connecting to it is refused.
    let gone = free_port();
    let snap = snapshot(
        ROUTES,
        &[
            ("PORT", port.to_string()),
            ("A", backend.port().to_string()),
            ("GONE", gone.to_string()),
            ("TLS_PORT", tls_port.to_string()),
            ("CERT", yaml_escape(&c.pem)),
            ("KEY", yaml_escape(&c.key)),
        ],
    );
    let ports = Ports {
        http: port,
        https: tls_port,
    };
    (Proxy::start_with(&snap, limits).await, ports)
}

/// A head far past the limit: refused with 431 before its end was read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_still_sending_a_refused_head_reads_the_refusal() {
    for (fast_path, engine) in engines() {
        let (proxy, ports) = proxy(Limits {
            fast_path,
            ..Limits::default()
        })
        .await;
        let head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ";
        let status = status_while_sending(ports.http, head, &[b'a'; 64 << 10], engine).await;
        assert_eq!(status, 431, "{engine}");
        proxy.stop().await;
    }
}

/// A chunked body past its route's limit: Pingora counts it as it streams and answers 413
/// with the rest unread. The backend waits before it answers: the echo backend answers
/// without reading a body, and its 200 could otherwise reach the client first (a CI run saw
/// that over TLS), which is a proxy relaying an early answer, not the close under test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_still_sending_a_body_past_the_limit_reads_the_413() {
    let chunk = [b"10000\r\n".as_slice(), &[b'b'; 0x10000], b"\r\n"].concat();
    for (fast_path, engine) in engines() {
        let (proxy, ports) = proxy(Limits {
            fast_path,
            ..Limits::default()
        })
        .await;
        let head =
            b"POST /small?delay_ms=5000 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
        let status = status_while_sending(ports.http, head, &chunk, engine).await;
        assert_eq!(status, 413, "{engine}");
        proxy.stop().await;
    }
}

/// The same over TLS: what is left unread is records. The backend waits as above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_still_sending_a_body_past_the_limit_reads_the_413() {
    let chunk = [b"10000\r\n".as_slice(), &[b'b'; 0x10000], b"\r\n"].concat();
    for (fast_path, engine) in engines() {
        let (proxy, ports) = proxy(Limits {
            fast_path,
            ..Limits::default()
        })
        .await;
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", ports.https))
            .await
            .unwrap();
        let name = rustls::pki_types::ServerName::try_from("proxy.example").unwrap();
        let tls = connector(&[b"http/1.1"]).connect(name, tcp).await.unwrap();
        let head =
            b"POST /small?delay_ms=5000 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
        let status = status_over(tls, head, &chunk, engine).await;
        assert_eq!(status, 413, "{engine}");
        proxy.stop().await;
    }
}

/// A backend that refuses the connection while the client is still uploading: 502, the
/// body unread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_still_sending_when_the_backend_refuses_reads_the_502() {
    let chunk = [b"10000\r\n".as_slice(), &[b'b'; 0x10000], b"\r\n"].concat();
    for (fast_path, engine) in engines() {
        let (proxy, ports) = proxy(Limits {
            fast_path,
            ..Limits::default()
        })
        .await;
        let head = b"POST /gone HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
        let status = status_while_sending(ports.http, head, &chunk, engine).await;
        assert_eq!(status, 502, "{engine}");
        proxy.stop().await;
    }
}

/// A lingering close still holds its place under the connection limit, as the connection it
/// was: closes cannot pile up outside the limit faster than they end. With a limit of one,
/// a client that read its 413 but has not closed keeps the next client waiting until it
/// does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lingering_close_counts_against_the_connection_limit() {
    let limits = Limits {
        max_connections: 1,
        ..Limits::default()
    };
    let (proxy, ports) = proxy(limits).await;
    let mut first = tokio::net::TcpStream::connect(("127.0.0.1", ports.http))
        .await
        .unwrap();
    // A length over the route's limit: refused from the head alone, whatever the backend
    // would answer (a chunked body raced the backend's own answer to the head).
    first
        .write_all(b"POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: 2048\r\n\r\n")
        .await
        .unwrap();
    first.write_all(&[b'b'; 2048]).await.unwrap();
    // The 413 and the proxy's FIN; the proxy now waits for ours.
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), first.read_to_end(&mut answer));
    assert!(matches!(read.await, Ok(Ok(_))));
    assert_eq!(status_of(&answer), Some(413));

    let second = tokio::spawn(raw_exchange(
        ports.http,
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        Duration::from_secs(10),
    ));
    let waited = proxy
        .metric_eventually("coxswain_proxy_connection_limit_waits_total", |n| n > 0)
        .await;
    assert!(waited >= 1, "the second connection waited for the limit");
    assert!(!second.is_finished(), "the second connection waits");
    // Our FIN ends the lingering close: the second connection is let in and answered.
    drop(first);
    let (bytes, closed) = second.await.unwrap();
    assert!(closed, "{}", String::from_utf8_lossy(&bytes));
    assert_eq!(status_of(&bytes), Some(200));
    proxy.stop().await;
}
