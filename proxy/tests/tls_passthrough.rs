//! TLS passthrough: the proxy holds no certificate for these names. It reads the SNI, relays
//! the connection to the backend of the name's route, and the client completes its handshake
//! with that backend, verifying the backend's own certificate.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

const ROUTES: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_TLS_PASSTHROUGH
  virtualHosts:
  - hostname: a.example
    routes:
    - source: {kind: TLSRoute, namespace: t, name: a, rule: 0}
      backends: [{cluster: "t/a:443", weight: 1}]
  - hostname: "*.wild.example"
    routes:
    - source: {kind: TLSRoute, namespace: t, name: wild, rule: 0}
      backends: [{cluster: "t/b:443", weight: 1}]
  - hostname: down.example
    routes:
    - source: {kind: TLSRoute, namespace: t, name: down, rule: 0}
      backends: [{cluster: "t/down:443", weight: 1}]
clusters:
- name: t/a:443
  endpoints: [{address: 127.0.0.1, port: {A}, ready: true, serving: true}]
- name: t/b:443
  endpoints: [{address: 127.0.0.1, port: {B}, ready: true, serving: true}]
- name: t/down:443
  endpoints: []
"#;

struct Identity {
    der: CertificateDer<'static>,
    key: Vec<u8>,
}

fn identity(names: &[&str]) -> Identity {
    let c = rcgen::generate_simple_self_signed(
        names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>(),
    )
    .unwrap();
    Identity {
        der: c.cert.der().clone(),
        key: c.signing_key.serialize_der(),
    }
}

/// A TLS server with its own certificate that answers "<name> <bytes it got>" once per
/// connection.
async fn tls_backend(name: &'static str, id: &Identity) -> SocketAddr {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![id.der.clone()],
            PrivateKeyDer::try_from(id.key.clone()).unwrap(),
        )
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = [0u8; 64];
                let Ok(n) = tls.read(&mut buf).await else {
                    return;
                };
                let answer = format!("{name} {}", String::from_utf8_lossy(&buf[..n]));
                let _ = tls.write_all(answer.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    addr
}

/// A client that trusts exactly `roots`.
fn connector(roots: &[&Identity]) -> TlsConnector {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(r.der.clone()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

async fn exchange(connector: &TlsConnector, port: u16, sni: &str) -> Result<String, String> {
    let tcp = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(sni.to_owned()).unwrap();
    let mut tls = tokio::time::timeout(Duration::from_secs(5), connector.connect(name, tcp))
        .await
        .map_err(|_| "handshake timed out".to_owned())?
        .map_err(|e| format!("handshake: {e}"))?;
    tls.write_all(b"hello").await.map_err(|e| e.to_string())?;
    let mut answer = String::new();
    tls.read_to_string(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    Ok(answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_reach_the_backend_their_sni_names() {
    let a_id = identity(&["a.example"]);
    let b_id = identity(&["x.wild.example", "y.wild.example"]);
    let (a, b) = (tls_backend("a", &a_id).await, tls_backend("b", &b_id).await);
    let port = free_port();
    let snap = snapshot(
        ROUTES,
        &[
            ("PORT", port.to_string()),
            ("A", a.port().to_string()),
            ("B", b.port().to_string()),
        ],
    );
    let proxy = Proxy::start(&snap).await;
    let client = connector(&[&a_id, &b_id]);

    // The handshake verifies the backend's certificate for the name: the proxy only relays.
    assert_eq!(
        exchange(&client, port, "a.example").await.unwrap(),
        "a hello"
    );
    assert_eq!(
        exchange(&client, port, "x.wild.example").await.unwrap(),
        "b hello"
    );
    assert_eq!(
        exchange(&client, port, "y.wild.example").await.unwrap(),
        "b hello"
    );
    // A client that trusts only a's certificate fails against b: nothing was terminated or
    // re-signed on the way.
    let only_a = connector(&[&a_id]);
    assert!(exchange(&only_a, port, "x.wild.example").await.is_err());

    // No route for the name, or no endpoint: the connection is closed without a handshake.
    for sni in ["other.example", "down.example"] {
        let err = exchange(&client, port, sni).await.unwrap_err();
        assert!(!err.contains("timed out"), "{sni}: {err}");
    }
    // Not TLS at all: closed.
    let mut plain = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    plain
        .write_all(b"GET / HTTP/1.1\r\nhost: a.example\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut rest)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?} {rest:?}");

    let metrics = get(&format!("http://{}/metrics", proxy.admin), &[])
        .await
        .unwrap()
        .body;
    // Each connection is one request of its route: relayed 2xx (three to b, the last one
    // failing its handshake at the client), no endpoint 5xx.
    for line in [
        r#"route="TLSRoute/t/wild",rule="0",code="2xx"} 3"#,
        r#"route="TLSRoute/t/a",rule="0",code="2xx"} 1"#,
        r#"route="TLSRoute/t/down",rule="0",code="5xx"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }
    proxy.stop().await;
}
