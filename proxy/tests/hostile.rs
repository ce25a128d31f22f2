//! Hostile clients and odd backends, through real sockets, on both engines: every test runs
//! with the fast path on and with every request sent through Pingora, and both must answer
//! the same.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_proxy::limits::Limits;
use std::sync::Arc;
use std::sync::atomic::Ordering;
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
    - source: {kind: Ingress, namespace: t, name: admin, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /admin}}
      clientAllowlist: {cidrs: [{address: 10.0.0.0, prefixLen: 8}]}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: public, rule: 0}
      backends: [{cluster: "t/a:80", weight: 1}]
- port: {TLS_PORT}
  protocol: PROTOCOL_HTTPS
  certificates: [{sni: "", certificate: t/self}]
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: Ingress, namespace: t, name: tls, rule: 0}
      backends: [{cluster: "t/a:80", weight: 1}]
clusters:
- name: t/a:80
  endpoints: [{address: 127.0.0.1, port: {A}, ready: true}]
certificates:
- {name: t/self, certChainPem: "{CERT}", privateKeyPem: "{KEY}"}
"#;

struct Setup {
    proxy: Proxy,
    port: u16,
    tls_port: u16,
}

async fn setup(backend: std::net::SocketAddr, limits: Limits) -> Setup {
    let port = free_port();
    let tls_port = free_port();
    let c = rcgen::generate_simple_self_signed(vec!["proxy.example".to_owned()]).unwrap();
    let snap = snapshot(
        ROUTES,
        &[
            ("PORT", port.to_string()),
            ("TLS_PORT", tls_port.to_string()),
            ("A", backend.port().to_string()),
            ("CERT", c.cert.pem().replace('\n', "\\n")),
            ("KEY", c.signing_key.serialize_pem().replace('\n', "\\n")),
        ],
    );
    Setup {
        proxy: Proxy::start_with(&snap, limits).await,
        port,
        tls_port,
    }
}

fn engines() -> [(&'static str, Limits); 2] {
    [
        ("fast path", Limits::default()),
        (
            "pingora",
            Limits {
                fast_path: false,
                ..Limits::default()
            },
        ),
    ]
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

/// Accepts any server certificate: these tests are about timing, not trust.
#[derive(Debug)]
struct AnyCert;

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &rustls_pki_types::CertificateDer<'_>,
        _: &[rustls_pki_types::CertificateDer<'_>],
        _: &rustls_pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls_pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls_pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A TLS client connection (HTTP/1.1 by ALPN) to the proxy's HTTPS port.
async fn tls_client(port: u16) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .dangerous()
    .with_custom_certificate_verifier(Arc::new(AnyCert))
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(
            rustls_pki_types::ServerName::try_from("proxy.example").unwrap(),
            tcp,
        )
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_bypasses_get_the_allowlisted_routes_answer() {
    let (backend, mut seen, _) = raw_backend(|_| RawAnswer::Send(OK.to_vec())).await;
    for (engine, limits) in engines() {
        let s = setup(backend, limits).await;
        for target in [
            "/admin",
            "/admin#x",
            "/x/../admin",
            "/%61dmin",
            "//admin",
            "/%2e%2e/admin",
            "/public/./../admin/",
            "/ADMIN/../admin",
        ] {
            for connection in ["keep-alive", "close"] {
                let req = format!(
                    "GET {target} HTTP/1.1\r\nHost: a.example\r\nConnection: {connection}\r\n\r\n"
                );
                let (resp, _) =
                    raw_exchange(s.port, req.as_bytes(), Duration::from_millis(500)).await;
                assert_eq!(
                    status_of(&resp),
                    Some(403),
                    "{engine}: {target} ({connection}): {}",
                    String::from_utf8_lossy(&resp)
                );
            }
        }
        assert!(
            seen.try_recv().is_err(),
            "{engine}: nothing reached the backend"
        );
        // The backend receives the normalised target.
        for (target, want) in [("/a//b/./c/../d?q=%2e#f", "/a/b/d?q=%2e"), ("/%7eu", "/~u")] {
            let req = format!("GET {target} HTTP/1.1\r\nHost: a.example\r\n\r\n");
            let (resp, _) = raw_exchange(s.port, req.as_bytes(), Duration::from_millis(500)).await;
            assert_eq!(status_of(&resp), Some(200), "{engine}: {target}");
            let got = seen.recv().await.unwrap();
            assert_eq!(got.path, want, "{engine}: {target}");
        }
        s.proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leading_empty_lines_never_reach_the_backend_nor_another_client() {
    // The backend answers with the path it was asked for, and answers a bare empty line with
    // a keep-alive 400 of its own: forwarded, that line would leave a stray response on a
    // pooled connection for the next client.
    let (backend, mut seen, _) = raw_backend(|r| {
        let body = r.path.clone();
        RawAnswer::Send(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes(),
        )
    })
    .await;
    for (engine, limits) in engines() {
        let s = setup(backend, limits).await;
        for i in 0..20 {
            let a =
                format!("\r\n\r\n\r\nGET /a{i} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let (resp, _) = raw_exchange(s.port, a.as_bytes(), Duration::from_secs(2)).await;
            assert!(
                resp.ends_with(format!("/a{i}").as_bytes()),
                "{engine}: {}",
                String::from_utf8_lossy(&resp)
            );
            let b = format!("GET /b{i} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let (resp, _) = raw_exchange(s.port, b.as_bytes(), Duration::from_secs(2)).await;
            assert!(
                resp.ends_with(format!("/b{i}").as_bytes()),
                "{engine}: client B got {}",
                String::from_utf8_lossy(&resp)
            );
        }
        while let Ok(r) = seen.try_recv() {
            assert!(r.head.starts_with(b"GET /"), "{engine}: {:?}", r.head);
        }
        s.proxy.stop().await;
    }
}

/// Limits with deadlines short enough to watch them pass.
fn short(fast_path: bool) -> Limits {
    Limits {
        request_head: Duration::from_millis(800),
        keepalive_idle: Duration::from_millis(800),
        tls_handshake: Duration::from_millis(800),
        fast_path,
        ..Limits::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_wait_ends_at_its_deadline() {
    let (backend, _seen, _) = raw_backend(|_| RawAnswer::Send(OK.to_vec())).await;
    for fast_path in [true, false] {
        let engine = if fast_path { "fast path" } else { "pingora" };
        let s = setup(backend, short(fast_path)).await;
        let wait = Duration::from_secs(5);

        // Shorter than the HTTP/2 preface: answered, not held for 24 bytes.
        let started = Instant::now();
        let (resp, closed) = raw_exchange(s.port, b"GET / HTTP/1.0\r\n\r\n", wait).await;
        assert_eq!(status_of(&resp), Some(200), "{engine}");
        assert!(closed, "{engine}: HTTP/1.0 without keep-alive closes");
        // Closed after the answer, not by the (0.8 s) idle limit.
        assert!(
            started.elapsed() < Duration::from_millis(600),
            "{engine}: HTTP/1.0 closed after {:?}",
            started.elapsed()
        );
        // HTTP/1.1 without Host: refused at once.
        let (resp, closed) = raw_exchange(s.port, b"GET / HTTP/1.1\r\n\r\n", wait).await;
        assert_eq!(status_of(&resp), Some(400), "{engine}");
        assert!(closed, "{engine}");

        // One NUL byte, then nothing: closed at the head deadline.
        let started = Instant::now();
        let (_, closed) = raw_exchange(s.port, b"\0", wait).await;
        assert!(closed, "{engine}: a lone NUL byte is not held open");
        assert!(started.elapsed() < Duration::from_secs(3), "{engine}");

        // A head sent one line at a time: the deadline counts from the first byte.
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
            .await
            .unwrap();
        let started = Instant::now();
        c.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let mut cut = false;
        for i in 0..20 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if c.write_all(format!("x-{i}: y\r\n").as_bytes())
                .await
                .is_err()
            {
                cut = true;
                break;
            }
        }
        let mut rest = Vec::new();
        let read = tokio::time::timeout(wait, c.read_to_end(&mut rest)).await;
        assert!(
            cut || matches!(read, Ok(Ok(_))),
            "{engine}: a dribbled head is cut"
        );
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{engine}: cut near the deadline, not after the whole dribble"
        );
        if !rest.is_empty() {
            assert_eq!(status_of(&rest), Some(408), "{engine}");
        }

        // An idle keep-alive connection is closed after the idle time.
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
            .await
            .unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
        let mut first = Vec::new();
        while !first.ends_with(b"ok") {
            let mut buf = [0u8; 512];
            let n = c.read(&mut buf).await.unwrap();
            assert!(n > 0, "{engine}");
            first.extend_from_slice(&buf[..n]);
        }
        let started = Instant::now();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(wait, c.read_to_end(&mut rest)).await;
        assert!(
            matches!(read, Ok(Ok(0))),
            "{engine}: idle connection closed: {read:?} {:?}",
            String::from_utf8_lossy(&rest)
        );
        assert!(started.elapsed() >= Duration::from_millis(700), "{engine}");

        // A TLS client that never finishes its handshake.
        let started = Instant::now();
        let (_, closed) = raw_exchange(s.tls_port, b"\x16\x03\x01", wait).await;
        assert!(closed, "{engine}: an unfinished TLS handshake is cut");
        assert!(started.elapsed() < Duration::from_secs(3), "{engine}");

        // Over TLS: dribbled lines are cut at the deadline too.
        let mut tls = tls_client(s.tls_port).await;
        let started = Instant::now();
        tls.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        tls.flush().await.unwrap();
        let mut cut = false;
        for i in 0..20 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let line = format!("x-{i}: y\r\n");
            if tls.write_all(line.as_bytes()).await.is_err() || tls.flush().await.is_err() {
                cut = true;
                break;
            }
        }
        let mut rest = Vec::new();
        let read = tokio::time::timeout(wait, tls.read_to_end(&mut rest)).await;
        assert!(
            cut || read.is_ok(),
            "{engine}: a dribbled head over TLS is cut"
        );
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{engine}: over TLS, cut near the deadline, not after the whole dribble"
        );
        // A whole request over TLS is still served.
        let mut tls = tls_client(s.tls_port).await;
        tls.write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        tls.flush().await.unwrap();
        let mut resp = Vec::new();
        let _ = tokio::time::timeout(wait, tls.read_to_end(&mut resp)).await;
        assert_eq!(status_of(&resp), Some(200), "{engine}");

        assert!(
            s.proxy
                .metric("coxswain_proxy_tls_handshake_timeouts_total")
                .await
                >= 1
        );
        for counter in [
            "coxswain_proxy_request_head_timeouts_total",
            "coxswain_proxy_requests_refused_total",
        ] {
            assert!(s.proxy.metric(counter).await >= 1, "{engine}: {counter}");
        }
        s.proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connections_end_at_their_deadlines() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let (backend, _seen, _) = raw_backend(|_| RawAnswer::Send(OK.to_vec())).await;
    for fast_path in [true, false] {
        let engine = if fast_path { "fast path" } else { "pingora" };
        let s = setup(backend, short(fast_path)).await;
        let wait = Duration::from_secs(5);

        // The HTTP/2 preface, then no SETTINGS: closed at the head deadline, not held.
        let started = Instant::now();
        let (_, closed) = raw_exchange(s.port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", wait).await;
        assert!(closed, "{engine}: a stalled HTTP/2 handshake is cut");
        assert!(started.elapsed() < Duration::from_secs(3), "{engine}");

        // A connection idle after its one request: closed after the idle time.
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
            .await
            .unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                .await
                .unwrap();
        let conn = tokio::spawn(conn);
        let req = hyper::Request::get("http://a/")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200, "{engine}");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body.as_ref(), b"ok", "{engine}");
        let started = Instant::now();
        let ended = tokio::time::timeout(wait, conn).await;
        assert!(
            ended.is_ok(),
            "{engine}: an idle HTTP/2 connection is closed"
        );
        assert!(
            started.elapsed() >= Duration::from_millis(700),
            "{engine}: closed after {:?}, before the idle time",
            started.elapsed()
        );
        assert!(sender.is_closed(), "{engine}");
        s.proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_wait_and_are_counted() {
    let (backend, _seen, _) = raw_backend(|_| RawAnswer::Send(OK.to_vec())).await;
    let limits = Limits {
        max_connections: 2,
        ..Limits::default()
    };
    let s = setup(backend, limits).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
            .await
            .unwrap();
        // A request begun: the proxy holds the connection.
        c.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        held.push(c);
    }
    let third = tokio::spawn(raw_exchange(
        s.port,
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        Duration::from_secs(10),
    ));
    let mut waited = 0;
    for _ in 0..250 {
        waited = s
            .proxy
            .metric("coxswain_proxy_connection_limit_waits_total")
            .await;
        if waited > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(waited >= 1, "the limit was hit and counted");
    assert!(!third.is_finished(), "the third connection waits");
    // One held connection finishes its request: the third is let in and answered.
    let mut c = held.pop().unwrap();
    c.write_all(b"Host: a\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut resp = Vec::new();
    c.read_to_end(&mut resp).await.unwrap();
    assert_eq!(status_of(&resp), Some(200));
    let (resp, closed) = third.await.unwrap();
    assert_eq!(
        status_of(&resp),
        Some(200),
        "{closed} {:?}",
        String::from_utf8_lossy(&resp)
    );
    s.proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_is_never_replayed_by_the_proxy() {
    // Each backend connection answers its first request and drops the second unanswered,
    // as a backend closing an idle connection just as a request arrives would.
    let (backend, mut seen, _) = raw_backend(|r| {
        if r.path.starts_with("/warm") || r.path.starts_with("/fresh") {
            RawAnswer::Send(OK.to_vec())
        } else {
            RawAnswer::Close
        }
    })
    .await;
    for (engine, limits) in engines() {
        let s = setup(backend, limits).await;
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
            .await
            .unwrap();
        let send = async |c: &mut tokio::net::TcpStream, req: &str| {
            c.write_all(req.as_bytes()).await.unwrap();
            let mut buf = vec![0u8; 1024];
            let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
                .await
                .unwrap()
                .unwrap();
            buf.truncate(n);
            buf
        };
        // A pooled connection, then a POST that lands on it and fails.
        let warm = send(&mut c, "GET /warm HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(status_of(&warm), Some(200), "{engine}");
        let post = send(
            &mut c,
            "POST /post HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
        )
        .await;
        assert_eq!(status_of(&post), Some(502), "{engine}");
        let mut posts = 0;
        while let Ok(r) = seen.try_recv() {
            posts += usize::from(r.method == "POST");
        }
        assert_eq!(posts, 1, "{engine}: the POST reached the backend once");
        s.proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_is_sent_again_on_a_fresh_connection() {
    let (backend, mut seen, _) = raw_backend(|r| {
        if r.path == "/again" && r.conn % 2 == 0 {
            RawAnswer::Close
        } else {
            RawAnswer::Send(OK.to_vec())
        }
    })
    .await;
    let s = setup(backend, Limits::default()).await;
    // The first connection carries /warm and is pooled; /again lands on it (even: dropped)
    // and is sent again on a new connection (odd: answered).
    let mut c = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
        .await
        .unwrap();
    c.write_all(b"GET /warm HTTP/1.1\r\nHost: a\r\n\r\nGET /again HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut resp = Vec::new();
    while resp.windows(8).filter(|w| w == b"HTTP/1.1").count() < 2 || !resp.ends_with(b"ok") {
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0);
        resp.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&resp);
    assert_eq!(text.matches("HTTP/1.1 200").count(), 2, "{text}");
    let again: Vec<usize> = std::iter::from_fn(|| seen.try_recv().ok())
        .filter(|r| r.path == "/again")
        .map(|r| r.conn)
        .collect();
    assert_eq!(
        again,
        vec![0, 1],
        "dropped on the pooled one, answered on a new one"
    );
    s.proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_backend_responses_are_served_or_refused_as_specified() {
    let events = Arc::new(tokio::sync::Notify::new());
    let go = events.clone();
    let (backend, mut seen, _) = raw_backend(move |r| match r.path.as_str() {
        "/http10" => RawAnswer::SendClose(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec()),
        "/http10-close" => RawAnswer::SendClose(b"HTTP/1.0 200 OK\r\n\r\nuntil close".to_vec()),
        "/gzip-chunked" => RawAnswer::Send(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                .to_vec(),
        ),
        "/cl-te" => RawAnswer::Send(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                .to_vec(),
        ),
        "/plus" => RawAnswer::Send(b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok".to_vec()),
        "/hex" => RawAnswer::Send(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n"
                .to_vec(),
        ),
        "/sse" => RawAnswer::Stream(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n".to_vec(),
            go.clone(),
            b"9\r\ndata: 2\n\n\r\n0\r\n\r\n".to_vec(),
        ),
        _ => RawAnswer::Send(OK.to_vec()),
    })
    .await;
    for (engine, limits) in engines() {
        let s = setup(backend, limits).await;
        let wait = Duration::from_secs(5);
        let get = |p: &str| format!("GET {p} HTTP/1.1\r\nHost: a\r\n\r\n").into_bytes();

        let (resp, _) = raw_exchange(s.port, &get("/http10"), wait).await;
        assert_eq!(
            status_of(&resp),
            Some(200),
            "{engine}: {:?}",
            String::from_utf8_lossy(&resp)
        );
        assert!(resp.ends_with(b"ok"), "{engine}");
        // Close-delimited: the fast path closes after it, Pingora re-frames it as chunked.
        let (resp, _) = raw_exchange(s.port, &get("/http10-close"), Duration::from_secs(1)).await;
        assert_eq!(status_of(&resp), Some(200), "{engine}");
        assert!(resp.windows(11).any(|w| w == b"until close"), "{engine}");

        // A keep-alive backend with codings ending in chunked: the client gets the whole
        // body and its connection stays usable.
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
            .await
            .unwrap();
        c.write_all(&get("/gzip-chunked")).await.unwrap();
        let mut got = Vec::new();
        while !got.ends_with(b"0\r\n\r\n") {
            let mut buf = [0u8; 1024];
            let n = tokio::time::timeout(wait, c.read(&mut buf))
                .await
                .expect("the chunked body ends; the client is not left hanging")
                .unwrap();
            assert!(n > 0, "{engine}");
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got.windows(5).any(|w| w == b"hello"), "{engine}");

        // Content-Length beside Transfer-Encoding: the coding frames the body, the length
        // is not passed on.
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
            .await
            .unwrap();
        c.write_all(&get("/cl-te")).await.unwrap();
        let mut got = Vec::new();
        while !got.ends_with(b"0\r\n\r\n") {
            let mut buf = [0u8; 1024];
            let n = tokio::time::timeout(wait, c.read(&mut buf))
                .await
                .unwrap()
                .unwrap();
            assert!(n > 0, "{engine}");
            got.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
        assert!(text.starts_with("http/1.1 200"), "{engine}: {text}");
        assert!(!text.contains("content-length"), "{engine}: {text}");
        drop(c);

        // An invalid length: 502, and that backend connection is not used again.
        for bad in ["/plus"] {
            let (resp, _) = raw_exchange(s.port, &get(bad), wait).await;
            assert_eq!(status_of(&resp), Some(502), "{engine}: {bad}");
            let bad_conn = std::iter::from_fn(|| seen.try_recv().ok())
                .filter(|r| r.path == bad)
                .map(|r| r.conn)
                .last()
                .unwrap();
            let (resp, _) = raw_exchange(s.port, &get("/after"), wait).await;
            assert_eq!(status_of(&resp), Some(200), "{engine}");
            let after = seen.recv().await.unwrap();
            assert_ne!(after.conn, bad_conn, "{engine}: {bad} connection reused");
        }
        // A malformed chunk size: the head may have gone out, the body never completes.
        let (resp, closed) = raw_exchange(s.port, &get("/hex"), wait).await;
        assert!(closed, "{engine}");
        assert!(!resp.ends_with(b"0\r\n\r\n"), "{engine}: {resp:?}");
        assert!(!resp.windows(5).any(|w| w == b"hello"), "{engine}");

        // Server-sent events: the first event reaches the client while the backend still
        // holds the second.
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
            .await
            .unwrap();
        let started = Instant::now();
        c.write_all(&get("/sse")).await.unwrap();
        let mut got = Vec::new();
        while !got.windows(7).any(|w| w == b"data: 1") {
            let mut buf = [0u8; 1024];
            let n = tokio::time::timeout(wait, c.read(&mut buf))
                .await
                .expect("the first event is flushed as it arrives")
                .unwrap();
            assert!(n > 0, "{engine}");
            got.extend_from_slice(&buf[..n]);
        }
        eprintln!("{engine}: first event after {:?}", started.elapsed());
        events.notify_one();
        let mut rest = Vec::new();
        tokio::time::timeout(wait, async {
            while !rest.windows(7).any(|w| w == b"data: 2") {
                let mut buf = [0u8; 1024];
                let n = c.read(&mut buf).await.unwrap();
                assert!(n > 0);
                rest.extend_from_slice(&buf[..n]);
            }
        })
        .await
        .unwrap();
        s.proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_pooled_connections_are_closed_by_the_sweeper() {
    let (backend, _seen, closed) = raw_backend(|_| RawAnswer::Send(OK.to_vec())).await;
    let limits = Limits {
        upstream_idle: Duration::from_millis(300),
        ..Limits::default()
    };
    let s = setup(backend, limits).await;
    let (resp, _) = raw_exchange(
        s.port,
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\n\r\n",
        Duration::from_millis(300),
    )
    .await;
    assert_eq!(status_of(&resp), Some(200));
    // No request follows: only the sweeper can close the pooled connection.
    for _ in 0..250 {
        if closed.load(Ordering::SeqCst) >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        closed.load(Ordering::SeqCst) >= 1,
        "the idle upstream connection was closed"
    );
    s.proxy.stop().await;
}
