//! Peers that stop moving bytes, on both engines: a backend that accepts and never answers,
//! one that stops halfway through a body, and clients that stop reading an answer, over
//! HTTP/1 (in clear and over TLS) and HTTP/2. Each holds the proxy only as long as its limit
//! (`Limits::upstream_timeout`, `Limits::client_send`) allows.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use bytes::Bytes;
use coxswain_proxy::limits::Limits;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use std::sync::Arc;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const ROUTES: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: r, rule: 0}
      backends: [{cluster: "t/a:80", weight: 1}]
- port: {TLS_PORT}
  protocol: PROTOCOL_HTTPS
  certificates: [{sni: "", certificate: t/self}]
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: tls, rule: 0}
      backends: [{cluster: "t/a:80", weight: 1}]
clusters:
- name: t/a:80
  endpoints: [{address: 127.0.0.1, port: {A}, ready: true}]
certificates:
- {name: t/self, certChainPem: "{CERT}", privateKeyPem: "{KEY}"}
"#;

/// Far more than the socket buffers between the proxy and a client that reads nothing.
const BIG: usize = 16 * 1024 * 1024;
/// Announced by `/half`, which sends only `HALF_SENT` bytes of it.
const HALF: usize = 100_000;
const HALF_SENT: usize = 1_000;

/// A backend that answers by path: `/silent` never (the connection stays open), `/half`
/// with a head and the first bytes of its body and then nothing, `/big` with `BIG` bytes.
/// Returns its address and what it saw.
async fn backend() -> (
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<RawSeen>,
) {
    let big: Arc<Vec<u8>> = Arc::new(
        [
            format!("HTTP/1.1 200 OK\r\ncontent-length: {BIG}\r\n\r\n").into_bytes(),
            vec![b'b'; BIG],
        ]
        .concat(),
    );
    // Never notified: the second part never goes.
    let never = Arc::new(tokio::sync::Notify::new());
    let (addr, seen, _) = raw_backend(move |r| match r.path.as_str() {
        "/silent" => RawAnswer::Stream(Vec::new(), never.clone(), Vec::new()),
        "/half" => RawAnswer::Stream(
            [
                format!("HTTP/1.1 200 OK\r\ncontent-length: {HALF}\r\n\r\n").into_bytes(),
                vec![b'h'; HALF_SENT],
            ]
            .concat(),
            never.clone(),
            Vec::new(),
        ),
        _ => RawAnswer::Send(big.to_vec()),
    })
    .await;
    (addr, seen)
}

struct Setup {
    proxy: Proxy,
    port: u16,
    tls_port: u16,
}

async fn setup(backend: std::net::SocketAddr, fast_path: bool) -> Setup {
    let port = free_port();
    let tls_port = free_port();
    let c = cert("gw.example");
    let snap = snapshot(
        ROUTES,
        &[
            ("PORT", port.to_string()),
            ("TLS_PORT", tls_port.to_string()),
            ("A", backend.port().to_string()),
            ("CERT", yaml_escape(&c.pem)),
            ("KEY", yaml_escape(&c.key)),
        ],
    );
    let limits = Limits {
        upstream_timeout: Duration::from_millis(400),
        client_send: Duration::from_millis(400),
        fast_path,
        ..Limits::default()
    };
    Setup {
        proxy: Proxy::start_with(&snap, limits).await,
        port,
        tls_port,
    }
}

/// A client connection whose receive buffer stays small, so a client that reads nothing
/// fills it at once.
async fn small_window(port: u16) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    socket
        .connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .unwrap()
}

/// Reads until the proxy ends the connection (EOF or reset), within 10 s; what came.
async fn read_until_closed<S: AsyncRead + Unpin>(s: &mut S, what: &str) -> Vec<u8> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut buf = vec![0u8; 64 * 1024];
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return got,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => panic!("{what}: the proxy kept the connection open"),
        }
    }
}

/// Sends one HTTP/1.1 request for `path` on `s` without reading anything back.
async fn ask<S: AsyncWrite + Unpin>(s: &mut S, path: &str) {
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: gw.example\r\n\r\n").as_bytes())
        .await
        .unwrap();
    s.flush().await.unwrap();
}

/// An HTTP/2 connection with prior knowledge whose streams open with a 64 KiB window and
/// get no more unless their body is read.
async fn h2_client(port: u16) -> hyper::client::conn::http2::SendRequest<Empty<Bytes>> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(64 * 1024)
        .handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

fn h2_get(path: &str) -> hyper::Request<Empty<Bytes>> {
    hyper::Request::get(format!("http://gw.example{path}"))
        .body(Empty::new())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_goes_silent_holds_a_request_only_as_long_as_the_upstream_timeout() {
    let (backend, mut seen) = backend().await;
    for (fast_path, engine) in engines() {
        let s = setup(backend, fast_path).await;
        let wait = Duration::from_secs(10);
        let mut silent_seen = || {
            let mut silent = 0;
            while let Ok(r) = seen.try_recv() {
                silent += usize::from(r.path == "/silent");
            }
            silent
        };
        silent_seen();

        // No answer at all: 504, and the request went to the backend once (it may be at work
        // on it, so it is not sent again).
        let (resp, _) = raw_exchange(
            s.port,
            b"GET /silent HTTP/1.1\r\nHost: gw.example\r\nConnection: close\r\n\r\n",
            wait,
        )
        .await;
        assert_eq!(status_of(&resp), Some(504), "{engine}: {resp:?}");
        assert_eq!(
            silent_seen(),
            1,
            "{engine}: a request that timed out is not resent"
        );
        s.proxy
            .metric_eventually("coxswain_proxy_upstream_timeouts_total", |v| v == 1)
            .await;

        // Half a body, then nothing: the client gets the half and the connection ends, so it
        // cannot take the body for whole.
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
            .await
            .unwrap();
        ask(&mut c, "/half").await;
        let got = read_until_closed(&mut c, engine).await;
        // The fast path passes on each read as it comes; Pingora holds a Content-Length
        // answer's first bytes in the connection's write buffer until it has more, and drops
        // them with the connection.
        if fast_path || !got.is_empty() {
            assert_eq!(status_of(&got), Some(200), "{engine}");
            let head = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            assert_eq!(
                got.len() - head,
                HALF_SENT,
                "{engine}: the bytes that came, and no more"
            );
        }
        s.proxy
            .metric_eventually("coxswain_proxy_upstream_timeouts_total", |v| v == 2)
            .await;

        // The same over HTTP/2: 504 for the silent one; the half one's stream is reset.
        let mut h2 = h2_client(s.port).await;
        let resp = h2.send_request(h2_get("/silent")).await.unwrap();
        assert_eq!(resp.status(), 504, "{engine}: HTTP/2");
        assert_eq!(silent_seen(), 1, "{engine}: HTTP/2, not resent");
        let resp = h2.send_request(h2_get("/half")).await.unwrap();
        assert_eq!(resp.status(), 200, "{engine}: HTTP/2");
        let body = tokio::time::timeout(wait, resp.into_body().collect())
            .await
            .expect("the stream ends");
        assert!(body.is_err(), "{engine}: a cut-off body is an error");
        s.proxy
            .metric_eventually("coxswain_proxy_upstream_timeouts_total", |v| v == 4)
            .await;
        s.proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_at_the_send_timeout() {
    let (backend, _seen) = backend().await;
    for (fast_path, engine) in engines() {
        let s = setup(backend, fast_path).await;
        let timeouts = "coxswain_proxy_client_send_timeouts_total";

        // In clear: the connection is ended once the proxy's writes wait too long on it.
        let mut c = small_window(s.port).await;
        ask(&mut c, "/big").await;
        s.proxy.metric_eventually(timeouts, |v| v == 1).await;
        let got = read_until_closed(&mut c, engine).await;
        assert_eq!(status_of(&got), Some(200), "{engine}");
        assert!(got.len() < BIG, "{engine}: cut before the end");

        // Over TLS.
        let tcp = small_window(s.tls_port).await;
        let mut tls = connector(&[b"http/1.1"])
            .connect(ServerName::try_from("gw.example").unwrap(), tcp)
            .await
            .unwrap();
        ask(&mut tls, "/big").await;
        s.proxy.metric_eventually(timeouts, |v| v == 2).await;
        let got = read_until_closed(&mut tls, engine).await;
        assert_eq!(status_of(&got), Some(200), "{engine}: TLS");
        assert!(got.len() < BIG, "{engine}: TLS, cut before the end");

        // HTTP/2: a stream whose window stays shut is reset; the connection may go on.
        let mut h2 = h2_client(s.port).await;
        let resp = h2.send_request(h2_get("/big")).await.unwrap();
        assert_eq!(resp.status(), 200, "{engine}: HTTP/2");
        s.proxy.metric_eventually(timeouts, |v| v == 3).await;
        let body = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect())
            .await
            .expect("the stream ends");
        assert!(body.is_err(), "{engine}: a reset stream is an error");
        s.proxy.stop().await;
    }
}
