//! Forwarded headers and the PROXY protocol, on both engines: the backend is told who the
//! client is (X-Forwarded-For, -Proto, -Host, -Port, X-Real-IP), a client cannot choose that
//! address unless it is a trusted proxy, and the address a PROXY protocol header names is the
//! client's for the backend and for allowlists.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use bytes::Bytes;
use coxswain_proxy::forwarded::ClientAddress;
use coxswain_proxy::limits::Limits;
use coxswain_proxy::policy::AddressSet;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SNAPSHOT: &str = r#"
listeners:
- port: {HTTP}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: Ingress, namespace: t, name: internal, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /internal}}
      clientAllowlist: {cidrs: [{address: 10.0.0.0, prefixLen: 8}]}
      backends: [{cluster: "t/echo:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: any, rule: 0}
      backends: [{cluster: "t/echo:80", weight: 1}]
- port: {HTTPS}
  protocol: PROTOCOL_HTTPS
  certificates:
  - {sni: "", certificate: t/cert}
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: tls, rule: 0}
      backends: [{cluster: "t/echo:80", weight: 1}]
clusters:
- name: t/echo:80
  endpoints: [{address: 127.0.0.1, port: {BACKEND}, ready: true}]
certificates:
- {name: t/cert, certChainPem: "{CERT}", privateKeyPem: "{KEY}"}
"#;

struct Setup {
    proxy: Proxy,
    http: u16,
    https: u16,
}

async fn start(limits: Limits) -> Setup {
    let backend = echo_backend("echo").await;
    let (http, https) = (free_port(), free_port());
    let c = cert("gw.example");
    let snap = snapshot(
        SNAPSHOT,
        &[
            ("HTTP", http.to_string()),
            ("HTTPS", https.to_string()),
            ("BACKEND", backend.port().to_string()),
            ("CERT", yaml_escape(&c.pem)),
            ("KEY", yaml_escape(&c.key)),
        ],
    );
    Setup {
        proxy: Proxy::start_with(&snap, limits).await,
        http,
        https,
    }
}

fn limits(fast_path: bool, trusted: &[&str], proxy_protocol: bool) -> Limits {
    Limits {
        fast_path,
        client_address: ClientAddress {
            trusted: AddressSet::parse(trusted).unwrap(),
            proxy_protocol,
        },
        ..Limits::default()
    }
}

/// What the echo backend saw of the forwarded fields.
fn fields(seen: &serde_json::Value) -> [String; 6] {
    let h = |n: &str| seen["headers"][n].as_str().unwrap_or("<none>").to_owned();
    [
        h("x-forwarded-for"),
        h("x-real-ip"),
        h("x-forwarded-proto"),
        h("x-forwarded-host"),
        h("x-forwarded-port"),
        h("forwarded"),
    ]
}

/// One request over a connection that may start with `prefix` (a PROXY protocol header);
/// `tls`: the request goes over TLS after the prefix.
async fn exchange(
    port: u16,
    prefix: &[u8],
    tls: bool,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, serde_json::Value) {
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    tcp.write_all(prefix).await.unwrap();
    let mut req = hyper::Request::get(path).header("host", "gw.example");
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let req = req.body(Full::<Bytes>::default()).unwrap();
    let resp = if tls {
        let stream = connector(&[b"http/1.1"])
            .connect(ServerName::try_from("gw.example").unwrap(), tcp)
            .await
            .unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        sender.send_request(req).await.unwrap()
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        sender.send_request(req).await.unwrap()
    };
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_is_told_the_real_client_and_untrusted_fields_are_replaced() {
    for fast_path in [true, false] {
        let s = start(limits(fast_path, &[], false)).await;
        let engine = if fast_path { "fast path" } else { "pingora" };
        for (port, tls, proto) in [(s.http, false, "http"), (s.https, true, "https")] {
            let (status, seen) = exchange(port, b"", tls, "/", &[]).await;
            assert_eq!(status, 200, "{engine} {proto}");
            assert_eq!(
                fields(&seen),
                [
                    "127.0.0.1".into(),
                    "127.0.0.1".into(),
                    proto.into(),
                    "gw.example".into(),
                    port.to_string(),
                    "<none>".into()
                ],
                "{engine} {proto}"
            );
            // A client that claims to be someone else is not believed.
            let spoof = [
                ("x-forwarded-for", "6.6.6.6"),
                ("x-real-ip", "6.6.6.6"),
                ("x-forwarded-proto", "gopher"),
                ("x-forwarded-host", "evil.example"),
                ("x-forwarded-port", "1"),
                ("forwarded", "for=6.6.6.6"),
            ];
            let (status, seen) = exchange(port, b"", tls, "/", &spoof).await;
            assert_eq!(status, 200);
            assert_eq!(
                fields(&seen),
                [
                    "127.0.0.1".into(),
                    "127.0.0.1".into(),
                    proto.into(),
                    "gw.example".into(),
                    port.to_string(),
                    "<none>".into()
                ],
                "{engine} {proto}: spoofed fields reached the backend"
            );
        }
        // Nor does a forwarded address open an allowlist.
        let (status, _) = exchange(
            s.http,
            b"",
            false,
            "/internal",
            &[("x-forwarded-for", "10.1.2.3")],
        )
        .await;
        assert_eq!(status, 403, "{engine}");
        s.proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_proxy_is_appended_to_and_names_the_client() {
    for fast_path in [true, false] {
        let s = start(limits(fast_path, &["127.0.0.0/8"], false)).await;
        let engine = if fast_path { "fast path" } else { "pingora" };
        for (port, tls) in [(s.http, false), (s.https, true)] {
            let from_lb = [
                ("x-forwarded-for", "203.0.113.7, 127.0.0.9"),
                ("x-real-ip", "1.1.1.1"),
                ("x-forwarded-proto", "https"),
                ("x-forwarded-host", "shop.example"),
                ("x-forwarded-port", "443"),
                ("forwarded", "for=203.0.113.7"),
            ];
            let (status, seen) = exchange(port, b"", tls, "/", &from_lb).await;
            assert_eq!(status, 200);
            assert_eq!(
                fields(&seen),
                [
                    "203.0.113.7, 127.0.0.9, 127.0.0.1",
                    "203.0.113.7",
                    "https",
                    "shop.example",
                    "443",
                    "for=203.0.113.7"
                ]
                .map(String::from),
                "{engine} tls={tls}"
            );
        }
        // The client a trusted proxy names is what the allowlist checks.
        let inside = [("x-forwarded-for", "10.1.2.3")];
        let (status, seen) = exchange(s.http, b"", false, "/internal", &inside).await;
        assert_eq!(status, 200, "{engine}");
        assert_eq!(seen["headers"]["x-real-ip"], "10.1.2.3");
        let outside = [("x-forwarded-for", "10.1.2.3, 192.0.2.1")];
        let (status, _) = exchange(s.http, b"", false, "/internal", &outside).await;
        assert_eq!(
            status, 403,
            "{engine}: the right-most untrusted address is the client"
        );
        s.proxy.stop().await;
    }
}

/// A PROXY protocol v2 header for a TCP/IPv4 client.
fn v2_header(src: [u8; 4], sport: u16) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n\x21\x11\x00\x0c".to_vec();
    h.extend_from_slice(&src);
    h.extend_from_slice(&[127, 0, 0, 1]);
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&80u16.to_be_bytes());
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_protocol_headers_name_the_client() {
    for fast_path in [true, false] {
        let s = start(limits(fast_path, &[], true)).await;
        let engine = if fast_path { "fast path" } else { "pingora" };
        for (port, tls) in [(s.http, false), (s.https, true)] {
            let v1 = b"PROXY TCP4 198.51.100.4 127.0.0.1 40000 80\r\n";
            let (status, seen) = exchange(port, v1, tls, "/", &[]).await;
            assert_eq!(status, 200, "{engine} tls={tls}");
            assert_eq!(seen["headers"]["x-forwarded-for"], "198.51.100.4");
            assert_eq!(seen["headers"]["x-real-ip"], "198.51.100.4");
            let v1 = b"PROXY TCP6 2001:db8::4 ::1 40000 80\r\n";
            let (_, seen) = exchange(port, v1, tls, "/", &[]).await;
            assert_eq!(seen["headers"]["x-real-ip"], "2001:db8::4", "{engine}");
            let (_, seen) = exchange(port, &v2_header([192, 0, 2, 44], 5555), tls, "/", &[]).await;
            assert_eq!(seen["headers"]["x-real-ip"], "192.0.2.44", "{engine}");
            // LOCAL (a load balancer's health check): the connection's peer.
            let local = b"\r\n\r\n\0\r\nQUIT\n\x20\x00\x00\x00";
            let (status, seen) = exchange(port, local, tls, "/", &[]).await;
            assert_eq!(status, 200);
            assert_eq!(seen["headers"]["x-real-ip"], "127.0.0.1");
        }
        // The header's client is the one allowlists check.
        let v1 = b"PROXY TCP4 10.9.8.7 127.0.0.1 40000 80\r\n";
        let (status, _) = exchange(s.http, v1, false, "/internal", &[]).await;
        assert_eq!(status, 200, "{engine}");

        // Missing or malformed: closed without an answer, and counted.
        let before = s
            .proxy
            .metric("coxswain_proxy_proxy_protocol_refused_total")
            .await;
        for garbage in [
            &b"GET / HTTP/1.1\r\nHost: gw.example\r\n\r\n"[..],
            b"PROXY TCP4 999.1.1.1 127.0.0.1 1 2\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
            b"\r\n\r\n\0\r\nQUIT\n\x21\x41\x00\x00GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        ] {
            let (answer, closed) = raw_exchange(s.http, garbage, Duration::from_secs(5)).await;
            assert!(closed && answer.is_empty(), "{engine}: {answer:?}");
        }
        // A TLS ClientHello without a header is refused the same way.
        let mut tcp = TcpStream::connect(("127.0.0.1", s.https)).await.unwrap();
        let tls = connector(&[b"http/1.1"])
            .connect(ServerName::try_from("gw.example").unwrap(), &mut tcp)
            .await;
        assert!(
            tls.is_err(),
            "{engine}: TLS without a PROXY header was served"
        );
        let mut rest = Vec::new();
        let _ = tcp.read_to_end(&mut rest).await;
        let after = s
            .proxy
            .metric("coxswain_proxy_proxy_protocol_refused_total")
            .await;
        assert_eq!(after - before, 4, "{engine}");
        s.proxy.stop().await;
    }
}

/// A port the proxy listens on for a port clients know by another number (a shared-pool
/// Gateway's Service maps its listener port 8080 to this internal port).
const BEHIND_A_SERVICE: &str = r#"
listeners:
- port: {INTERNAL}
  publicPort: 8080
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: moved, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /moved}}
      filters:
      - kind: {requestRedirect: {hostname: new.example, statusCode: 302}}
    - source: {kind: HTTPRoute, namespace: t, name: any, rule: 0}
      backends: [{cluster: "t/echo:80", weight: 1}]
clusters:
- name: t/echo:80
  endpoints: [{address: 127.0.0.1, port: {BACKEND}, ready: true}]
requires: [public-port]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_behind_a_service_tells_clients_and_backends_the_port_they_addressed() {
    let backend = echo_backend("echo").await;
    let internal = free_port();
    let snap = snapshot(
        BEHIND_A_SERVICE,
        &[
            ("INTERNAL", internal.to_string()),
            ("BACKEND", backend.port().to_string()),
        ],
    );
    for fast_path in [true, false] {
        let engine = if fast_path { "fast path" } else { "pingora" };
        let proxy = Proxy::start_with(&snap, limits(fast_path, &[], false)).await;
        let url = |path: &str| format!("http://127.0.0.1:{internal}{path}");
        let seen = get(&url("/"), &[("host", "gw.example")]).await.unwrap();
        assert_eq!(seen.status, 200, "{engine}");
        assert_eq!(
            seen.json()["headers"]["x-forwarded-port"],
            "8080",
            "{engine}: the backend is told the port the client addressed"
        );
        // A redirect that keeps the port keeps the one the client knows.
        let moved = get(&url("/moved/x"), &[("host", "gw.example")])
            .await
            .unwrap();
        assert_eq!(moved.status, 302, "{engine}");
        assert_eq!(
            moved.header("location"),
            Some("http://new.example:8080/moved/x"),
            "{engine}"
        );
        proxy.stop().await;
    }
}
