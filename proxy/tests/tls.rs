//! TLS termination: certificates chosen by SNI (exact, wildcard, default) and HTTP/2 over TLS
//! through ALPN; h2c to a backend whose appProtocol asks for it.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use support::*;
use tokio::net::TcpStream;

const SNAPSHOT: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTPS
  certificates:
  - {sni: "", certificate: t/default}
  - {sni: "*.wild.example", certificate: t/wild}
  - {sni: a.example, certificate: t/a}
  - {sni: b.example, certificate: t/b}
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: any, rule: 0}
      backends: [{cluster: "t/h1:80", weight: 1}]
  - hostname: h2c.example
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: grpcish, rule: 0}
      backends: [{cluster: "t/h2c:80", weight: 1}]
clusters:
- name: t/h1:80
  endpoints: [{address: 127.0.0.1, port: {BACKEND}, ready: true}]
- name: t/h2c:80
  appProtocol: APP_PROTOCOL_H2C
  endpoints: [{address: 127.0.0.1, port: {BACKEND}, ready: true}]
certificates:
- {name: t/a, certChainPem: "{A_CERT}", privateKeyPem: "{A_KEY}"}
- {name: t/b, certChainPem: "{B_CERT}", privateKeyPem: "{B_KEY}"}
- {name: t/default, certChainPem: "{D_CERT}", privateKeyPem: "{D_KEY}"}
- {name: t/wild, certChainPem: "{W_CERT}", privateKeyPem: "{W_KEY}"}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_picks_exact_then_wildcard_then_default_and_h2_works_over_tls() {
    let backend = echo_backend("tls-backend").await;
    let port = free_port();
    let (a, b, d, w) = (
        cert("a.example"),
        cert("b.example"),
        cert("default.example"),
        cert("x.wild.example"),
    );
    let snap = snapshot(
        SNAPSHOT,
        &[
            ("PORT", port.to_string()),
            ("BACKEND", backend.port().to_string()),
            ("A_CERT", yaml_escape(&a.pem)),
            ("A_KEY", yaml_escape(&a.key)),
            ("B_CERT", yaml_escape(&b.pem)),
            ("B_KEY", yaml_escape(&b.key)),
            ("D_CERT", yaml_escape(&d.pem)),
            ("D_KEY", yaml_escape(&d.key)),
            ("W_CERT", yaml_escape(&w.pem)),
            ("W_KEY", yaml_escape(&w.key)),
        ],
    );
    let proxy = Proxy::start(&snap).await;

    for (sni, expected) in [
        ("a.example", &a.der),
        ("b.example", &b.der),
        ("deep.x.wild.example", &w.der),
        ("unknown.example", &d.der),
    ] {
        let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let tls = connector(&[b"http/1.1"])
            .connect(ServerName::try_from(sni.to_owned()).unwrap(), tcp)
            .await
            .unwrap();
        let presented = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
        assert!(
            presented == *expected,
            "SNI {sni} got the wrong certificate"
        );

        // The connection carries HTTP through the proxy.
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(conn);
        let req = hyper::Request::get("/over-tls")
            .header("host", sni)
            .body(Full::default())
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200, "{sni}");
    }

    // HTTP/2 negotiated by ALPN; the h2c cluster gets HTTP/2 from the proxy too.
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let tls = connector(&[b"h2", b"http/1.1"])
        .connect(ServerName::try_from("h2c.example").unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, conn) = hyper::client::conn::http2::handshake::<_, _, Full<Bytes>>(
        TokioExecutor::new(),
        TokioIo::new(tls),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get("https://h2c.example/h2")
        .body(Full::default())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), hyper::Version::HTTP_2);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let seen: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(seen["version"], "HTTP/2.0", "h2c to the backend: {seen}");
    assert_eq!(seen["path"], "/h2");

    proxy.stop().await;
}

const LISTENERS: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTPS
  certificates:
  - {sni: "", certificate: t/default}
  listenerHostnames: ["", "*.wild.example", "fourth.wild.example", "second.example"]
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: any, rule: 0}
      backends: [{cluster: "t/h1:80", weight: 1}]
clusters:
- name: t/h1:80
  endpoints: [{address: 127.0.0.1, port: {BACKEND}, ready: true}]
certificates:
- {name: t/default, certChainPem: "{D_CERT}", privateKeyPem: "{D_KEY}"}
"#;

/// The status of one request for `host` on a new TLS connection to `sni`, over HTTP/1.1 or h2.
async fn status_over_tls(port: u16, sni: &str, host: &str, h2: bool) -> u16 {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
    let tls = connector(alpn)
        .connect(ServerName::try_from(sni.to_owned()).unwrap(), tcp)
        .await
        .unwrap();
    if h2 {
        let (mut sender, conn) = hyper::client::conn::http2::handshake::<_, _, Full<Bytes>>(
            TokioExecutor::new(),
            TokioIo::new(tls),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        let req = hyper::Request::get(format!("https://{host}/misdirected"))
            .body(Full::default())
            .unwrap();
        sender.send_request(req).await.unwrap().status().as_u16()
    } else {
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(conn);
        let req = hyper::Request::get("/misdirected")
            .header("host", host)
            .body(Full::default())
            .unwrap();
        sender.send_request(req).await.unwrap().status().as_u16()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_of_another_listener_than_the_sni_is_answered_421() {
    // The Gateway API's misdirected-request rule: the listener a connection's SNI selects
    // (exact, longest wildcard, then the one without a hostname) must be the one its Host
    // selects, else 421 and the client opens a connection for that host.
    let backend = echo_backend("tls-backend").await;
    let port = free_port();
    let d = cert("default.example");
    let snap = snapshot(
        LISTENERS,
        &[
            ("PORT", port.to_string()),
            ("BACKEND", backend.port().to_string()),
            ("D_CERT", yaml_escape(&d.pem)),
            ("D_KEY", yaml_escape(&d.key)),
        ],
    );
    let proxy = Proxy::start(&snap).await;
    let mut misdirected = 0;
    for (sni, host, status) in [
        ("example.org", "example.org", 200),
        ("example.org", "second.example", 421),
        ("example.org", "unknown.example:443", 200),
        ("second.example", "second.example", 200),
        ("second.example", "example.org", 421),
        ("SECOND.example", "Second.Example.", 200),
        ("a.wild.example", "b.wild.example", 200),
        ("a.wild.example", "fourth.wild.example", 421),
        ("fourth.wild.example", "b.wild.example", 421),
        ("fourth.wild.example", "fourth.wild.example", 200),
        ("unknown.example", "example.org", 200),
    ] {
        for h2 in [false, true] {
            assert_eq!(
                status_over_tls(port, sni, host, h2).await,
                status,
                "SNI {sni}, Host {host}, h2 {h2}"
            );
            if status == 421 {
                misdirected += 1;
            }
        }
    }
    assert_eq!(
        proxy
            .metric("coxswain_proxy_requests_misdirected_total")
            .await,
        misdirected
    );
    proxy.stop().await;
}
