//! Route policies through real sockets: client allowlists, regex rewrites, fixed redirects,
//! CORS, body limits, backend timeouts and upstream protocols (the snapshot features the
//! Ingress annotations compile to).
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

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
    - source: {kind: Ingress, namespace: t, name: elsewhere, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /elsewhere}}
      clientAllowlist: {cidrs: [{address: 10.0.0.0, prefixLen: 8}, {address: "2001:db8::", prefixLen: 32}]}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: local, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /local}}
      clientAllowlist: {cidrs: [{address: 127.0.0.0, prefixLen: 8}]}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: nobody, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /nobody}}
      clientAllowlist: {cidrs: []}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: closed, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /closed}}
      directStatus: 403
    - source: {kind: Ingress, namespace: t, name: moved, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /moved}}
      filters:
      - kind: {requestRedirect: {location: "https://new.example/landing", statusCode: 308}}
    - source: {kind: Ingress, namespace: t, name: cors, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /cors}}
      filters:
      - kind: {cors: {allowOrigins: ["https://app.example", "https://*.example.com"], allowMethods: [GET, POST], allowHeaders: [X-Token], exposeHeaders: [X-Backend], allowCredentials: true, maxAgeSeconds: 600}}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: gateway-cors, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /gw-cors}}
      filters:
      - kind: {cors: {allowOrigins: ["*"], allowMethods: ["*"], allowHeaders: ["*"], echoOrigin: true, maxAgeSeconds: 5}}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: small, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /small}}
      maxRequestBodyBytes: 10
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: impatient, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /slow}}
      timeouts: {readMs: 200}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: h2c, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /h2c}}
      upstreamProtocol: UPSTREAM_PROTOCOL_H2C
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: h1, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /h1}}
      upstreamProtocol: UPSTREAM_PROTOCOL_HTTP1
      backends: [{cluster: "t/h2c:80", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: tls, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /tls}}
      upstreamProtocol: UPSTREAM_PROTOCOL_TLS
      backends: [{cluster: "t/tls:443", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: regex, rule: 0}
      match: {path: {kind: KIND_REGEX, value: "(?i:/api(/|$)(.*)).*"}}
      filters:
      - kind: {urlRewrite: {path: {kind: {replaceRegexMatch: "/$2"}}}}
      backends: [{cluster: "t/a:80", weight: 1}]
- port: {TLS_PORT}
  protocol: PROTOCOL_HTTPS
  certificates: [{sni: "", certificate: t/self}]
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: Ingress, namespace: t, name: behind-tls, rule: 0}
      backends: [{cluster: "t/b:80", weight: 1}]
clusters:
- name: t/a:80
  endpoints: [{address: 127.0.0.1, port: {A}, ready: true}]
- name: t/b:80
  endpoints: [{address: 127.0.0.1, port: {B}, ready: true}]
- name: t/h2c:80
  appProtocol: APP_PROTOCOL_H2C
  endpoints: [{address: 127.0.0.1, port: {A}, ready: true}]
- name: t/tls:443
  endpoints: [{address: 127.0.0.1, port: {TLS_PORT}, ready: true}]
certificates:
- {name: t/self, certChainPem: "{CERT}", privateKeyPem: "{KEY}"}
"#;

/// Sends raw bytes and returns the response's status code.
async fn raw_status(port: u16, request: &[u8]) -> u16 {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(request).await.unwrap();
    let mut buf = vec![0u8; 1024];
    let mut got = 0;
    // The status line is all we need.
    while !buf[..got].windows(2).any(|w| w == b"\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf[got..]))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "connection closed before a status line");
        got += n;
    }
    let line = String::from_utf8_lossy(&buf[..got]);
    line.split(' ').nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_policies_apply_to_real_traffic() {
    let a = echo_backend("a").await;
    let b = echo_backend("b").await;
    let port = free_port();
    let tls_port = free_port();
    let c = rcgen::generate_simple_self_signed(vec!["backend.example".to_owned()]).unwrap();
    let snap = snapshot(
        ROUTES,
        &[
            ("PORT", port.to_string()),
            ("TLS_PORT", tls_port.to_string()),
            ("A", a.port().to_string()),
            ("B", b.port().to_string()),
            ("CERT", c.cert.pem().replace('\n', "\\n")),
            ("KEY", c.signing_key.serialize_pem().replace('\n', "\\n")),
        ],
    );
    let proxy = Proxy::start(&snap).await;
    let url = |p: &str| format!("http://127.0.0.1:{port}{p}");

    // Allowlists: the test client is 127.0.0.1.
    assert_eq!(get(&url("/elsewhere"), &[]).await.unwrap().status, 403);
    let r = get(&url("/local"), &[]).await.unwrap();
    assert_eq!((r.status, r.header("x-backend")), (200, Some("a")));
    assert_eq!(get(&url("/nobody"), &[]).await.unwrap().status, 403);
    assert_eq!(get(&url("/closed/x"), &[]).await.unwrap().status, 403);

    // A fixed Location, the request's path not appended.
    let r = get(&url("/moved/deep?q=1"), &[]).await.unwrap();
    assert_eq!(r.status, 308);
    assert_eq!(r.header("location"), Some("https://new.example/landing"));

    // Regex path with capture groups, case-insensitive, rewritten; the query is kept.
    let r = get(&url("/API/v1/items?x=1"), &[]).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["path"], "/v1/items?x=1");
    assert_eq!(get(&url("/api"), &[]).await.unwrap().json()["path"], "/");

    // CORS: a preflight is answered by the proxy, never reaching the backend.
    let client = shared_client();
    let preflight = |origin: &'static str| {
        let client = client.clone();
        let u = url("/cors/thing");
        async move {
            request(
                &client,
                "OPTIONS",
                &u,
                &[
                    ("origin", origin),
                    ("access-control-request-method", "POST"),
                ],
            )
            .await
            .unwrap()
        }
    };
    let r = preflight("https://app.example").await;
    assert_eq!(r.status, 204);
    assert_eq!(r.header("x-backend"), None, "answered by the proxy");
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(r.header("access-control-allow-methods"), Some("GET, POST"));
    assert_eq!(r.header("access-control-allow-headers"), Some("X-Token"));
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(r.header("access-control-max-age"), Some("600"));
    let r = preflight("https://team.example.com").await;
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://team.example.com")
    );
    let r = preflight("https://evil.example").await;
    assert_eq!(r.status, 204);
    assert_eq!(r.header("access-control-allow-origin"), None);
    // A normal request gets the origin back on the backend's answer.
    let r = get(&url("/cors/thing"), &[("origin", "https://app.example")])
        .await
        .unwrap();
    assert_eq!(r.header("x-backend"), Some("a"));
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(r.header("access-control-expose-headers"), Some("X-Backend"));
    assert_eq!(r.header("vary"), Some("Origin"));
    let r = get(&url("/cors/thing"), &[("origin", "https://evil.example")])
        .await
        .unwrap();
    assert_eq!(r.header("access-control-allow-origin"), None);
    // An OPTIONS that is not a preflight goes to the backend.
    let r = request(&client, "OPTIONS", &url("/cors/thing"), &[])
        .await
        .unwrap();
    assert_eq!(r.header("x-backend"), Some("a"));

    // Gateway API CORS: any origin is answered with itself, "*" methods and headers with
    // what the preflight asked for.
    let r = request(
        &client,
        "OPTIONS",
        &url("/gw-cors"),
        &[
            ("origin", "https://other.foo.com:8443"),
            ("access-control-request-method", "PUT"),
            ("access-control-request-headers", "x-header-1, x-header-2"),
        ],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 204);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://other.foo.com:8443")
    );
    assert_eq!(r.header("access-control-allow-methods"), Some("PUT"));
    assert_eq!(
        r.header("access-control-allow-headers"),
        Some("x-header-1, x-header-2")
    );
    assert_eq!(r.header("access-control-allow-credentials"), None);
    assert_eq!(r.header("access-control-max-age"), Some("5"));
    let r = get(
        &url("/gw-cors"),
        &[("origin", "https://other.foo.com"), ("cookie", "a=b")],
    )
    .await
    .unwrap();
    assert_eq!(
        (
            r.header("x-backend"),
            r.header("access-control-allow-origin")
        ),
        (Some("a"), Some("https://other.foo.com"))
    );

    // Body limit: by Content-Length up front, and while a chunked body streams.
    let small = b"POST /small HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello";
    assert_eq!(raw_status(port, small).await, 200);
    let large = b"POST /small HTTP/1.1\r\nhost: x\r\ncontent-length: 11\r\n\r\nhello world";
    assert_eq!(raw_status(port, large).await, 413);
    let chunked = b"POST /small HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n\
        8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n";
    assert_eq!(raw_status(port, chunked).await, 413);
    let chunked_ok = b"POST /small HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n\
        4\r\n1234\r\n0\r\n\r\n";
    assert_eq!(raw_status(port, chunked_ok).await, 200);

    // Read timeout: the backend's /slow takes a second.
    let started = std::time::Instant::now();
    let r = get(&url("/slow"), &[]).await.unwrap();
    assert_eq!(r.status, 504);
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "timed out early"
    );

    // Upstream protocols: forced h2c, forced HTTP/1.1 over an h2c cluster, and TLS (here the
    // proxy's own HTTPS port, which forwards to backend b).
    let r = get(&url("/h2c"), &[]).await.unwrap();
    assert_eq!(r.json()["version"], "HTTP/2.0");
    let r = get(&url("/h1"), &[]).await.unwrap();
    assert_eq!(r.json()["version"], "HTTP/1.1");
    let r = get(&url("/tls/x"), &[]).await.unwrap();
    assert_eq!((r.status, r.header("x-backend")), (200, Some("b")));

    proxy.stop().await;
}
