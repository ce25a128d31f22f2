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

// Client certificates (Gateway spec.tls.frontend): a port's CAs, AllowValidOnly or
// AllowInsecureFallback, as the snapshot says at each handshake.

const CLIENT_AUTH: &str = r#"
listeners:
- port: {STRICT}
  protocol: PROTOCOL_HTTPS
  certificates: [{sni: "", certificate: t/default}]
  clientValidation: {caPem: "{STRICT_CA}"}
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: strict, rule: 0}
      backends: [{cluster: "t/h1:80", weight: 1}]
- port: {FALLBACK}
  protocol: PROTOCOL_HTTPS
  certificates: [{sni: "", certificate: t/default}]
  clientValidation: {caPem: "{CA}", allowInsecureFallback: true}
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: fallback, rule: 0}
      backends: [{cluster: "t/h1:80", weight: 1}]
- port: {OPEN}
  protocol: PROTOCOL_HTTPS
  certificates: [{sni: "", certificate: t/default}]
  {OPEN_VALIDATION}
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: open, rule: 0}
      backends: [{cluster: "t/h1:80", weight: 1}]
clusters:
- name: t/h1:80
  endpoints: [{address: 127.0.0.1, port: {BACKEND}, ready: true}]
certificates:
- {name: t/default, certChainPem: "{D_CERT}", privateKeyPem: "{D_KEY}"}
requires: [frontend-client-validation]
"#;

/// One request on a new TLS connection made by `connector` (HTTP/2 when ALPN picks it): its
/// status and whether the session was resumed, or why no answer came (a refused client
/// certificate fails the handshake or, in TLS 1.3, the first read).
async fn status_with(
    port: u16,
    connector: &tokio_rustls::TlsConnector,
) -> Result<(u16, bool), String> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let tls = connector
        .connect(ServerName::try_from("gw.example").unwrap(), tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let resumed = tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
    let h2 = tls.get_ref().1.alpn_protocol() == Some(&b"h2"[..]);
    let status = if h2 {
        let (mut sender, conn) = hyper::client::conn::http2::handshake::<_, _, Full<Bytes>>(
            TokioExecutor::new(),
            TokioIo::new(tls),
        )
        .await
        .map_err(|e| format!("h2: {e}"))?;
        tokio::spawn(conn);
        let req = hyper::Request::get("https://gw.example/mtls")
            .body(Full::default())
            .unwrap();
        sender.send_request(req).await.map_err(|e| e.to_string())?
    } else {
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(tls))
                .await
                .map_err(|e| format!("http/1.1: {e}"))?;
        tokio::spawn(conn);
        let req = hyper::Request::get("/mtls")
            .header("host", "gw.example")
            .body(Full::default())
            .unwrap();
        sender.send_request(req).await.map_err(|e| e.to_string())?
    };
    let status = status.status().as_u16();
    Ok((status, resumed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_verified_or_let_through_as_each_port_says() {
    let backend = echo_backend("mtls-backend").await;
    let (strict, fallback, open) = (free_port(), free_port(), free_port());
    let (good_ca, other_ca) = (ca(), ca());
    let server = cert("gw.example");
    let vars = |strict_ca: &Ca, open_validation: &str| {
        snapshot(
            CLIENT_AUTH,
            &[
                ("STRICT", strict.to_string()),
                ("FALLBACK", fallback.to_string()),
                ("OPEN", open.to_string()),
                ("BACKEND", backend.port().to_string()),
                ("STRICT_CA", yaml_escape(&strict_ca.pem)),
                ("CA", yaml_escape(&good_ca.pem)),
                ("OPEN_VALIDATION", open_validation.to_owned()),
                ("D_CERT", yaml_escape(&server.pem)),
                ("D_KEY", yaml_escape(&server.key)),
            ],
        )
    };
    let proxy = Proxy::start(&vars(&good_ca, "")).await;
    let (good_chain, good_key) = client_of(&good_ca);
    let (other_chain, other_key) = client_of(&other_ca);

    for alpn in [&[&b"http/1.1"[..]][..], &[&b"h2"[..]][..]] {
        let h2 = alpn == [&b"h2"[..]];
        let none = connector(alpn);
        let good = connector_with_client_cert(alpn, &good_chain, &good_key);
        let other = connector_with_client_cert(alpn, &other_chain, &other_key);
        // AllowValidOnly: only a certificate the port's CA issued gets in.
        assert_eq!(
            status_with(strict, &good).await,
            Ok((200, false)),
            "h2 {h2}"
        );
        for (who, c) in [("no certificate", &none), ("another CA", &other)] {
            let r = status_with(strict, c).await;
            assert!(r.is_err(), "{who} got in (h2 {h2}): {r:?}");
        }
        // AllowInsecureFallback: everyone gets in.
        for (who, c) in [
            ("valid", &good),
            ("no certificate", &none),
            ("another CA", &other),
        ] {
            assert_eq!(
                status_with(fallback, c).await.map(|r| r.0),
                Ok(200),
                "{who} (h2 {h2})"
            );
        }
        // No validation on the port: nobody is asked.
        for c in [&none, &good] {
            assert_eq!(status_with(open, c).await.map(|r| r.0), Ok(200));
        }
    }

    // A client that holds TLS sessions from when the open port asked for nothing (one per
    // resumption below: TLS 1.3 tickets are used once).
    let http1: &[&[u8]] = &[b"http/1.1"];
    let h2: &[&[u8]] = &[b"h2"];
    let resuming = [connector(http1), connector(h2)];
    for c in &resuming {
        assert_eq!(status_with(open, c).await, Ok((200, false)));
    }
    let none = connector(http1);
    let good = connector_with_client_cert(http1, &good_chain, &good_key);
    let other = connector_with_client_cert(http1, &other_chain, &other_key);

    // A new snapshot: the strict port trusts the other CA now, and the open port asks for
    // certificates. Listeners stay bound; the next handshakes follow the new CAs.
    let client_tls = format!(
        "clientValidation: {{caPem: \"{}\"}}",
        yaml_escape(&good_ca.pem)
    );
    let next = vars(&other_ca, &client_tls);
    proxy.update(&next);
    proxy.wait_ready(&next.version).await;
    assert_eq!(status_with(strict, &other).await, Ok((200, false)));
    assert!(status_with(strict, &good).await.is_err());
    assert_eq!(status_with(open, &good).await.map(|r| r.0), Ok(200));
    assert!(status_with(open, &none).await.is_err());
    // Resuming a session skips the certificate exchange, so the proxy checks the session
    // against the port's current CAs after the handshake and refuses its requests, on
    // HTTP/1.1 and HTTP/2.
    for c in &resuming {
        assert_eq!(
            status_with(open, c).await,
            Ok((403, true)),
            "a resumed session skipped the new CAs"
        );
    }
    proxy.stop().await;
}
