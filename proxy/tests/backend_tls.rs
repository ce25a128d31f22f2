//! BackendTLSPolicy in the proxy: a cluster with backend TLS is reached over TLS with the
//! policy's hostname as SNI, and its certificate must chain to the policy's CA and carry that
//! hostname; otherwise the request fails (502) instead of going out unverified. With
//! subjectAltNames, the certificate must carry one of them, and the hostname is only the SNI.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_proxy::limits::Limits;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::net::SocketAddr;
use std::sync::Arc;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

struct Ca {
    pem: String,
    issuer_der: Vec<u8>,
    issuer: Issuer<'static, KeyPair>,
}

fn ca() -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer_der: cert.der().to_vec(),
        issuer: Issuer::new(params, key),
    }
}

type Seen = Arc<std::sync::Mutex<Vec<String>>>;

/// An HTTPS backend whose certificate `ca` issued for `names`; it answers with the SNI it got
/// and records the request lines it served.
async fn tls_backend(ca: &Ca, names: &[&str]) -> (SocketAddr, Seen) {
    let params =
        CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
    tls_backend_with(ca, params).await
}

/// As [`tls_backend`], with the certificate's parameters (its subjectAltNames) given.
async fn tls_backend_with(ca: &Ca, params: CertificateParams) -> (SocketAddr, Seen) {
    tls_backend_asking(ca, params, None).await
}

/// As [`tls_backend_with`]; with `clients`, only clients presenting a certificate that CA
/// issued get through the handshake, and each request line is recorded with the presented
/// certificate (`client=<hex DER>`).
async fn tls_backend_asking(
    ca: &Ca,
    params: CertificateParams,
    clients: Option<&Ca>,
) -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    let builder = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap();
    let builder = match clients {
        None => builder.with_no_client_auth(),
        Some(clients) => {
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(CertificateDer::from(clients.issuer_der.clone()))
                .unwrap();
            builder.with_client_cert_verifier(
                rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    Arc::new(rustls::crypto::ring::default_provider()),
                )
                .build()
                .unwrap(),
            )
        }
    };
    let config = builder
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let record = record.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let sni = tls.get_ref().1.server_name().unwrap_or("").to_owned();
                let client = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|c| c.iter().map(|b| format!("{b:02x}")).collect::<String>());
                // Keep-alive, so the proxy pools the connection.
                let mut pending = Vec::new();
                let mut buf = [0u8; 1024];
                loop {
                    while !pending.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => pending.extend_from_slice(&buf[..n]),
                        }
                    }
                    let line = String::from_utf8_lossy(&pending);
                    let line = line.lines().next().unwrap_or("").to_owned();
                    let line = match &client {
                        Some(der) => format!("{line} client={der}"),
                        None => line,
                    };
                    record.lock().unwrap().push(line);
                    pending.clear();
                    let body = format!("sni={sni}");
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if tls.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_under_a_policy_are_verified_against_its_ca_and_hostname() {
    let (good_ca, other_ca) = (ca(), ca());
    let (good, good_seen) = tls_backend(&good_ca, &["backend.example"]).await;
    let (foreign, foreign_seen) = tls_backend(&other_ca, &["backend.example"]).await;
    let port = free_port();
    // Four clusters: verified and right; a hostname the certificate lacks; a certificate
    // from another CA; a policy the controller found unusable.
    let yaml = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: good, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /good}}
      backends: [{cluster: "t/good:443", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: wrong-name, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /wrong-name}}
      backends: [{cluster: "t/wrong-name:443", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: foreign, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /foreign}}
      backends: [{cluster: "t/foreign:443", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: other-ca, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /other-ca}}
      backends: [{cluster: "t/other-ca:443", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: mirrored, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /mirrored}}
      filters:
      - kind: {requestMirror: {cluster: "t/good:443", numerator: 1, denominator: 1}}
      - kind: {requestMirror: {cluster: "t/foreign:443", numerator: 1, denominator: 1}}
      backends: [{cluster: "t/good:443", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: refused, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /refused}}
      backends: [{cluster: "t/refused:443", weight: 1}]
clusters:
- name: t/good:443
  endpoints: [{address: 127.0.0.1, port: {GOOD}, ready: true, serving: true}]
  tls: {hostname: backend.example, caPem: "{CA}"}
- name: t/wrong-name:443
  endpoints: [{address: 127.0.0.1, port: {GOOD}, ready: true, serving: true}]
  tls: {hostname: other.example, caPem: "{CA}"}
- name: t/foreign:443
  endpoints: [{address: 127.0.0.1, port: {FOREIGN}, ready: true, serving: true}]
  tls: {hostname: backend.example, caPem: "{CA}"}
- name: t/other-ca:443
  endpoints: [{address: 127.0.0.1, port: {GOOD}, ready: true, serving: true}]
  tls: {hostname: backend.example, caPem: "{OTHER_CA}"}
- name: t/refused:443
  endpoints: [{address: 127.0.0.1, port: {GOOD}, ready: true, serving: true}]
  tls: {hostname: backend.example, refuse: true}
"#;
    let snap = snapshot(
        yaml,
        &[
            ("PORT", port.to_string()),
            ("GOOD", good.port().to_string()),
            ("FOREIGN", foreign.port().to_string()),
            ("CA", good_ca.pem.replace('\n', "\\n")),
            ("OTHER_CA", other_ca.pem.replace('\n', "\\n")),
        ],
    );
    let proxy = Proxy::start(&snap).await;
    let base = format!("http://127.0.0.1:{port}");

    let ok = get(&format!("{base}/good"), &[]).await.unwrap();
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.body, "sni=backend.example");
    // The same endpoint and name under a policy with another CA: connections the good
    // requests left in the pool (one per worker) were verified against a different CA and
    // must not be reused for it.
    for _ in 0..6 {
        let ok = get(&format!("{base}/good"), &[]).await.unwrap();
        assert_eq!(ok.status, 200, "{}", ok.body);
        let other = get(&format!("{base}/other-ca"), &[]).await.unwrap();
        assert_eq!(
            other.status, 502,
            "a pooled connection crossed CAs: {}",
            other.body
        );
    }
    for path in ["/wrong-name", "/foreign", "/refused"] {
        let r = get(&format!("{base}{path}"), &[]).await.unwrap();
        assert_eq!(r.status, 502, "{path}: {}", r.body);
    }

    // Mirrors speak the same verified TLS: the copy reaches the backend the policy's CA
    // vouches for, and not the one it does not.
    let r = get(&format!("{base}/mirrored"), &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let mirrored = |seen: &Seen| {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with("GET /mirrored"))
            .count()
    };
    for _ in 0..100 {
        if mirrored(&good_seen) == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(mirrored(&good_seen), 2, "the request and its mirror");
    assert_eq!(
        mirrored(&foreign_seen),
        0,
        "a mirror crossed to an unverified backend"
    );
    proxy.stop().await;
}

/// What the conformance suite's SAN backend presents: a DNS name and a SPIFFE ID.
fn san_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.subject_alt_names = vec![
        SanType::DnsName("abc.example.com".try_into().unwrap()),
        SanType::URI("spiffe://abc.example.com/test-identity".try_into().unwrap()),
    ];
    params
}

const SAN_SNAPSHOT: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: dns, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /dns}}
      backends: [{cluster: "t/dns:443", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: dns-mismatch, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /dns-mismatch}}
      backends: [{cluster: "t/dns-mismatch:443", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: uri, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /uri}}
      backends: [{cluster: "t/uri:443", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: uri-mismatch, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /uri-mismatch}}
      backends: [{cluster: "t/uri-mismatch:443", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: multiple, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /multiple}}
      backends: [{cluster: "t/multiple:443", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: multiple-mismatch, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /multiple-mismatch}}
      backends: [{cluster: "t/multiple-mismatch:443", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: other-ca, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /other-ca}}
      backends: [{cluster: "t/other-ca:443", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: foreign, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /foreign}}
      backends: [{cluster: "t/foreign:443", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: mirrored, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /mirrored}}
      filters:
      - kind: {requestMirror: {cluster: "t/mirror-good:443", numerator: 1, denominator: 1}}
      - kind: {requestMirror: {cluster: "t/mirror-mismatch:443", numerator: 1, denominator: 1}}
      backends: [{cluster: "t/dns:443", weight: 1}]
clusters:
# The certificate carries abc.example.com and spiffe://abc.example.com/test-identity.
- name: t/dns:443
  endpoints: [{address: 127.0.0.1, port: {SAN}, ready: true, serving: true}]
  tls: {hostname: abc.example.com, caPem: "{CA}", refuse: true, subjectAltNames: [{kind: {hostname: abc.example.com}}]}
# The hostname alone would pass: the names decide.
- name: t/dns-mismatch:443
  endpoints: [{address: 127.0.0.1, port: {SAN}, ready: true, serving: true}]
  tls: {hostname: abc.example.com, caPem: "{CA}", refuse: true, subjectAltNames: [{kind: {hostname: dce.example.com}}]}
# A hostname the certificate lacks is still the SNI, and not checked.
- name: t/uri:443
  endpoints: [{address: 127.0.0.1, port: {SAN}, ready: true, serving: true}]
  tls: {hostname: sni.example, caPem: "{CA}", refuse: true, subjectAltNames: [{kind: {uri: "spiffe://abc.example.com/test-identity"}}]}
- name: t/uri-mismatch:443
  endpoints: [{address: 127.0.0.1, port: {SAN}, ready: true, serving: true}]
  tls: {hostname: abc.example.com, caPem: "{CA}", refuse: true, subjectAltNames: [{kind: {uri: "spiffe://def.example.com/test-identity"}}]}
- name: t/multiple:443
  endpoints: [{address: 127.0.0.1, port: {SAN}, ready: true, serving: true}]
  tls: {hostname: abc.example.com, caPem: "{CA}", refuse: true, subjectAltNames: [{kind: {uri: "spiffe://def.example.com/test-identity"}}, {kind: {hostname: abc.example.com}}]}
- name: t/multiple-mismatch:443
  endpoints: [{address: 127.0.0.1, port: {SAN}, ready: true, serving: true}]
  tls: {hostname: abc.example.com, caPem: "{CA}", refuse: true, subjectAltNames: [{kind: {uri: "spiffe://def.example.com/test-identity"}}, {kind: {hostname: def.example.com}}]}
# The right names under a CA that did not issue the certificate.
- name: t/other-ca:443
  endpoints: [{address: 127.0.0.1, port: {SAN}, ready: true, serving: true}]
  tls: {hostname: abc.example.com, caPem: "{OTHER_CA}", refuse: true, subjectAltNames: [{kind: {hostname: abc.example.com}}]}
# A backend with the same names from another CA.
- name: t/foreign:443
  endpoints: [{address: 127.0.0.1, port: {FOREIGN}, ready: true, serving: true}]
  tls: {hostname: abc.example.com, caPem: "{CA}", refuse: true, subjectAltNames: [{kind: {hostname: abc.example.com}}]}
- name: t/mirror-good:443
  endpoints: [{address: 127.0.0.1, port: {MIRROR_GOOD}, ready: true, serving: true}]
  tls: {hostname: abc.example.com, caPem: "{CA}", refuse: true, subjectAltNames: [{kind: {uri: "spiffe://abc.example.com/test-identity"}}]}
- name: t/mirror-mismatch:443
  endpoints: [{address: 127.0.0.1, port: {MIRROR_BAD}, ready: true, serving: true}]
  tls: {hostname: abc.example.com, caPem: "{CA}", refuse: true, subjectAltNames: [{kind: {hostname: dce.example.com}}]}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subject_alt_names_decide_and_the_hostname_is_only_the_sni() {
    let (good_ca, other_ca) = (ca(), ca());
    let (san, _) = tls_backend_with(&good_ca, san_params()).await;
    let (foreign, _) = tls_backend_with(&other_ca, san_params()).await;
    let (mirror_good, good_seen) = tls_backend_with(&good_ca, san_params()).await;
    let (mirror_bad, bad_seen) = tls_backend_with(&good_ca, san_params()).await;
    for (fast_path, engine) in engines() {
        let port = free_port();
        let snap = snapshot(
            SAN_SNAPSHOT,
            &[
                ("PORT", port.to_string()),
                ("SAN", san.port().to_string()),
                ("FOREIGN", foreign.port().to_string()),
                ("MIRROR_GOOD", mirror_good.port().to_string()),
                ("MIRROR_BAD", mirror_bad.port().to_string()),
                ("CA", good_ca.pem.replace('\n', "\\n")),
                ("OTHER_CA", other_ca.pem.replace('\n', "\\n")),
            ],
        );
        let limits = Limits {
            fast_path,
            ..Limits::default()
        };
        let proxy = Proxy::start_with(&snap, limits).await;
        let base = format!("http://127.0.0.1:{port}");
        let status = |path: &'static str| {
            let url = format!("{base}{path}");
            async move {
                let r = get(&url, &[]).await.unwrap();
                (r.status, r.body)
            }
        };
        for (path, sni) in [
            ("/dns", "abc.example.com"),
            ("/uri", "sni.example"),
            ("/multiple", "abc.example.com"),
        ] {
            assert_eq!(
                status(path).await,
                (200, format!("sni={sni}")),
                "{engine}: {path}"
            );
        }
        for path in [
            "/dns-mismatch",
            "/uri-mismatch",
            "/multiple-mismatch",
            "/other-ca",
            "/foreign",
        ] {
            assert_eq!(status(path).await.0, 502, "{engine}: {path}");
        }
        // One endpoint, two policies: a connection pooled after a good request was verified
        // for other names and must not serve the mismatched policy.
        for _ in 0..6 {
            assert_eq!(status("/dns").await.0, 200, "{engine}");
            assert_eq!(
                status("/dns-mismatch").await.0,
                502,
                "{engine}: a pooled connection crossed policies"
            );
        }

        // Mirrors verify the names too: the copy reaches the backend whose policy names
        // match, and not the other.
        let mirrored = |seen: &Seen| {
            seen.lock()
                .unwrap()
                .iter()
                .filter(|l| l.starts_with("GET /mirrored"))
                .count()
        };
        let before = mirrored(&good_seen);
        assert_eq!(status("/mirrored").await.0, 200, "{engine}");
        for _ in 0..100 {
            if mirrored(&good_seen) > before {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(mirrored(&good_seen), before + 1, "{engine}: the mirror");
        assert_eq!(
            mirrored(&bad_seen),
            0,
            "{engine}: a mirror crossed to a backend its names do not match"
        );
        proxy.stop().await;
    }
}

/// An HTTPS backend speaking HTTP/1.1 or h2 (by ALPN) with `san_params`' certificate from `ca`;
/// it answers with the HTTP version the request came in.
async fn versioned_tls_backend(ca: &Ca) -> SocketAddr {
    use http_body_util::Full;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let key = KeyPair::generate().unwrap();
    let cert = san_params().signed_by(&key, &ca.issuer).unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from(cert.der().to_vec())],
        PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
    )
    .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(|req: hyper::Request<_>| async move {
                    let body = format!("{:?}", req.version());
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                        bytes::Bytes::from(body),
                    )))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    addr
}

// HTTP/2 over TLS (a GRPCS or TLS_H2 backend) under names: the proxy's own TLS offers h2 and
// Pingora speaks HTTP/2 over it; a mismatched name still fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_over_tls_is_verified_against_the_names_too() {
    let ca = ca();
    let backend = versioned_tls_backend(&ca).await;
    let port = free_port();
    let yaml = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: Ingress, namespace: t, name: h2, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /h2}}
      upstreamProtocol: UPSTREAM_PROTOCOL_TLS_H2
      backends: [{cluster: "t/named:443", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: h1, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /h1}}
      backends: [{cluster: "t/named:443", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: h2-mismatch, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /mismatch}}
      upstreamProtocol: UPSTREAM_PROTOCOL_TLS_H2
      backends: [{cluster: "t/mismatch:443", weight: 1}]
clusters:
- name: t/named:443
  endpoints: [{address: 127.0.0.1, port: {BACKEND}, ready: true, serving: true}]
  tls: {hostname: abc.example.com, caPem: "{CA}", refuse: true, subjectAltNames: [{kind: {uri: "spiffe://abc.example.com/test-identity"}}]}
- name: t/mismatch:443
  endpoints: [{address: 127.0.0.1, port: {BACKEND}, ready: true, serving: true}]
  tls: {hostname: abc.example.com, caPem: "{CA}", refuse: true, subjectAltNames: [{kind: {hostname: dce.example.com}}]}
"#;
    let snap = snapshot(
        yaml,
        &[
            ("PORT", port.to_string()),
            ("BACKEND", backend.port().to_string()),
            ("CA", ca.pem.replace('\n', "\\n")),
        ],
    );
    let proxy = Proxy::start(&snap).await;
    let base = format!("http://127.0.0.1:{port}");
    // Alternating, so pooled HTTP/1.1 and HTTP/2 connections to one endpoint stay apart.
    for _ in 0..3 {
        let h2 = get(&format!("{base}/h2"), &[]).await.unwrap();
        assert_eq!((h2.status, h2.body.as_str()), (200, "HTTP/2.0"));
        let h1 = get(&format!("{base}/h1"), &[]).await.unwrap();
        assert_eq!((h1.status, h1.body.as_str()), (200, "HTTP/1.1"));
    }
    let r = get(&format!("{base}/mismatch"), &[]).await.unwrap();
    assert_eq!(r.status, 502, "{}", r.body);
    proxy.stop().await;
}

const CLIENT_CERT_SNAPSHOT: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: with, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /with}}
      backends: [{cluster: "t/with:443", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: without, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /without}}
      backends: [{cluster: "t/without:443", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: san, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /san}}
      backends: [{cluster: "t/san:443", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: unusable, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /unusable}}
      backends: [{cluster: "t/unusable:443", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: mirrored, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /mirrored}}
      filters:
      - kind: {requestMirror: {cluster: "t/mirror:443", numerator: 1, denominator: 1}}
      backends: [{cluster: "t/with:443", weight: 1}]
clusters:
- name: t/with:443
  endpoints: [{address: 127.0.0.1, port: {MTLS}, ready: true, serving: true}]
  tls: {hostname: backend.example, caPem: "{CA}", clientCertificate: t/client}
- name: t/without:443
  endpoints: [{address: 127.0.0.1, port: {MTLS}, ready: true, serving: true}]
  tls: {hostname: backend.example, caPem: "{CA}"}
- name: t/san:443
  endpoints: [{address: 127.0.0.1, port: {MTLS_SAN}, ready: true, serving: true}]
  tls: {hostname: abc.example.com, caPem: "{CA}", refuse: true, subjectAltNames: [{kind: {uri: "spiffe://abc.example.com/test-identity"}}], clientCertificate: t/client}
- name: t/unusable:443
  endpoints: [{address: 127.0.0.1, port: {MTLS}, ready: true, serving: true}]
  tls: {hostname: backend.example, caPem: "{CA}", clientCertificate: t/missing}
- name: t/mirror:443
  endpoints: [{address: 127.0.0.1, port: {MIRROR}, ready: true, serving: true}]
  tls: {hostname: backend.example, caPem: "{CA}", clientCertificate: t/client}
certificates:
- {name: t/client, certChainPem: "{CLIENT_CERT}", privateKeyPem: "{CLIENT_KEY}"}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_asks_for_a_client_certificate_gets_the_gateway_s() {
    let (server_ca, client_ca, stranger_ca) = (ca(), ca(), ca());
    let names = || CertificateParams::new(vec!["backend.example".to_owned()]).unwrap();
    let (mtls, mtls_seen) = tls_backend_asking(&server_ca, names(), Some(&client_ca)).await;
    let (mtls_san, _) = tls_backend_asking(&server_ca, san_params(), Some(&client_ca)).await;
    let (mirror, mirror_seen) = tls_backend_asking(&server_ca, names(), Some(&client_ca)).await;
    // The key pair the Gateway's clientCertificateRef names, issued by the CA the backends
    // trust for clients.
    let client_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["gateway.example".to_owned()]).unwrap();
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let client_cert = params.signed_by(&client_key, &client_ca.issuer).unwrap();
    let ours: String = client_cert
        .der()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    // The same certificate signed by a CA the backends do not trust.
    let stranger_key = KeyPair::generate().unwrap();
    let stranger = CertificateParams::new(vec!["gateway.example".to_owned()])
        .unwrap()
        .signed_by(&stranger_key, &stranger_ca.issuer)
        .unwrap();
    for (client_pem, client_key_pem, trusted) in [
        (client_cert.pem(), client_key.serialize_pem(), true),
        (stranger.pem(), stranger_key.serialize_pem(), false),
    ] {
        for (fast_path, engine) in engines() {
            let port = free_port();
            let snap = snapshot(
                CLIENT_CERT_SNAPSHOT,
                &[
                    ("PORT", port.to_string()),
                    ("MTLS", mtls.port().to_string()),
                    ("MTLS_SAN", mtls_san.port().to_string()),
                    ("MIRROR", mirror.port().to_string()),
                    ("CA", server_ca.pem.replace('\n', "\\n")),
                    ("CLIENT_CERT", client_pem.replace('\n', "\\n")),
                    ("CLIENT_KEY", client_key_pem.replace('\n', "\\n")),
                ],
            );
            let limits = Limits {
                fast_path,
                ..Limits::default()
            };
            let proxy = Proxy::start_with(&snap, limits).await;
            let base = format!("http://127.0.0.1:{port}");
            let status = |path: &'static str| {
                let url = format!("{base}{path}");
                async move { get(&url, &[]).await.unwrap().status }
            };
            let expected = if trusted { 200 } else { 502 };
            // Pingora's connector (hostname verification) and the proxy's own (subjectAltNames)
            // both present the certificate.
            assert_eq!(
                status("/with").await,
                expected,
                "{engine}, trusted {trusted}"
            );
            assert_eq!(
                status("/san").await,
                expected,
                "{engine}, trusted {trusted}"
            );
            // Without one, the backend refuses the handshake: 502, never a cleartext retry.
            assert_eq!(status("/without").await, 502, "{engine}");
            // A certificate the snapshot does not carry: refused here, not sent without.
            assert_eq!(status("/unusable").await, 502, "{engine}");
            if trusted {
                let presented = mtls_seen.lock().unwrap().clone();
                assert!(
                    presented
                        .iter()
                        .filter(|l| l.starts_with("GET /with"))
                        .all(|l| l.ends_with(&format!("client={ours}"))),
                    "{presented:?}"
                );
                // Mirrors present it too.
                let mirrored = || {
                    mirror_seen
                        .lock()
                        .unwrap()
                        .iter()
                        .filter(|l| l.starts_with("GET /mirrored"))
                        .count()
                };
                let before = mirrored();
                assert_eq!(status("/mirrored").await, 200, "{engine}");
                for _ in 0..100 {
                    if mirrored() > before {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                assert!(
                    mirrored() > before,
                    "{engine}: the mirror did not get through"
                );
            }
            proxy.stop().await;
        }
    }
}
