//! Relayed connections. TCP listeners send each connection to a backend of their one route,
//! by weight; UDP listeners do the same per client flow, which lasts until it is idle. TLS listeners route connections by the ClientHello's SNI. Passthrough: the proxy holds no
//! certificate for these names; it relays the connection to the backend of the name's route,
//! and the client completes its handshake with that backend, verifying the backend's own
//! certificate. Terminate: the proxy completes the handshake with the port's certificate
//! (verifying client certificates when the port asks) and relays the plaintext. Both on one
//! port (TLSRouteModeMixed).
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_api::snapshot::Snapshot;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use support::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

const ROUTES: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_TLS
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

/// Fails unless the proxy's /metrics holds every one of `lines`.
async fn assert_metrics(proxy: &Proxy, lines: &[&str]) {
    let metrics = get(&format!("http://{}/metrics", proxy.admin), &[])
        .await
        .unwrap()
        .body;
    for line in lines {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }
}

/// A client that trusts exactly `roots`.
fn connector(roots: &[&Identity]) -> TlsConnector {
    let ders: Vec<CertificateDer<'static>> = roots.iter().map(|r| r.der.clone()).collect();
    client_config(&ders, None, &[])
}

/// A client that trusts `roots`, presents `client` (chain PEM, key PEM) when asked, and offers
/// `alpn`.
fn client_config(
    roots: &[CertificateDer<'static>],
    client: Option<&(String, String)>,
    alpn: &[&[u8]],
) -> TlsConnector {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(r.clone()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store);
    let mut config = match client {
        None => builder.with_no_client_auth(),
        Some((chain, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(chain.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
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

    // Each connection is one request of its route: relayed 2xx (three to b, the last one
    // failing its handshake at the client), no endpoint 5xx.
    assert_metrics(
        &proxy,
        &[
            r#"route="TLSRoute/t/wild",rule="0",code="2xx"} 3"#,
            r#"route="TLSRoute/t/a",rule="0",code="2xx"} 1"#,
            r#"route="TLSRoute/t/down",rule="0",code="5xx"} 1"#,
        ],
    )
    .await;
    proxy.stop().await;
}

const MIXED: &str = r#"
listeners:
- port: {MIXED}
  protocol: PROTOCOL_TLS
  certificates: [{sni: t.example, certificate: t/term}]
  virtualHosts:
  - hostname: a.example
    routes:
    - source: {kind: TLSRoute, namespace: t, name: pass, rule: 0}
      backends: [{cluster: "t/a:443", weight: 1}]
  - hostname: t.example
    terminateTls: true
    routes:
    - source: {kind: TLSRoute, namespace: t, name: term, rule: 0}
      backends: [{cluster: "t/plain:3000", weight: 1}]
- port: {STRICT}
  protocol: PROTOCOL_TLS
  certificates: [{sni: "", certificate: t/term}]
  clientValidation: {caPem: "{CA}"}
  virtualHosts:
  - hostname: ""
    terminateTls: true
    routes:
    - source: {kind: TLSRoute, namespace: t, name: strict, rule: 0}
      backends: [{cluster: "t/plain:3000", weight: 1}]
clusters:
- name: t/a:443
  endpoints: [{address: 127.0.0.1, port: {A}, ready: true, serving: true}]
- name: t/plain:3000
  endpoints: [{address: 127.0.0.1, port: {PLAIN}, ready: true, serving: true}]
certificates:
- {name: t/term, certChainPem: "{CERT}", privateKeyPem: "{KEY}"}
requires: [frontend-client-validation, tls-terminate]
"#;

/// A plain TCP server that answers "plain <bytes it got>" once per connection, and counts the
/// connections that sent it anything.
async fn plain_backend() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let hits = counted.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                let Ok(n) = tcp.read(&mut buf).await else {
                    return;
                };
                if n > 0 {
                    hits.fetch_add(1, Ordering::Relaxed);
                }
                let answer = format!("plain {}", String::from_utf8_lossy(&buf[..n]));
                let _ = tcp.write_all(answer.as_bytes()).await;
                let _ = tcp.shutdown().await;
            });
        }
    });
    (addr, hits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_hosts_end_tls_here_and_share_a_port_with_passthrough() {
    let a_id = identity(&["a.example"]);
    let a = tls_backend("a", &a_id).await;
    let (plain, plain_hits) = plain_backend().await;
    let term = cert("t.example");
    let client_ca = ca();
    let (mixed, strict) = (free_port(), free_port());
    let snap = snapshot(
        MIXED,
        &[
            ("MIXED", mixed.to_string()),
            ("STRICT", strict.to_string()),
            ("A", a.port().to_string()),
            ("PLAIN", plain.port().to_string()),
            ("CERT", yaml_escape(&term.pem)),
            ("KEY", yaml_escape(&term.key)),
            ("CA", yaml_escape(&client_ca.pem)),
        ],
    );
    let proxy = Proxy::start(&snap).await;
    let term_root = CertificateDer::from(term.der.clone());
    let roots = [a_id.der.clone(), term_root.clone()];

    // One port, both modes: the backend behind t.example gets the plaintext, the one behind
    // a.example completes the handshake itself.
    let client = client_config(&roots, None, &[]);
    assert_eq!(
        exchange(&client, mixed, "t.example").await.unwrap(),
        "plain hello"
    );
    assert_eq!(
        exchange(&client, mixed, "a.example").await.unwrap(),
        "a hello"
    );
    // The proxy's certificate is the port's for t.example: a client that trusts only the
    // passthrough backend's refuses it.
    let only_a = connector(&[&a_id]);
    assert!(exchange(&only_a, mixed, "t.example").await.is_err());

    // The relay speaks no HTTP for the backend: ALPN is not agreed even when offered. (This
    // connection counts as relayed: 2 in all with the first, the refused one does not.)
    let tcp = TcpStream::connect(("127.0.0.1", mixed)).await.unwrap();
    let offering = client_config(&roots, None, &[b"h2", b"http/1.1"]);
    let tls = offering
        .connect(ServerName::try_from("t.example").unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), None);
    drop(tls);

    // A port that verifies clients: without a certificate, or with one from another CA, no
    // byte reaches the backend; with one its CA issued, the plaintext does.
    let before = plain_hits.load(Ordering::Relaxed);
    let stranger = client_of(&ca());
    for (who, client) in [
        ("no certificate", client_config(&roots, None, &[])),
        ("another CA", client_config(&roots, Some(&stranger), &[])),
    ] {
        let err = exchange(&client, strict, "t.example").await.unwrap_err();
        assert!(!err.contains("timed out"), "{who}: {err}");
    }
    assert_eq!(plain_hits.load(Ordering::Relaxed), before);
    let member = client_config(&roots, Some(&client_of(&client_ca)), &[]);
    assert_eq!(
        exchange(&member, strict, "t.example").await.unwrap(),
        "plain hello"
    );
    assert_eq!(plain_hits.load(Ordering::Relaxed), before + 1);

    assert_metrics(
        &proxy,
        &[
            r#"route="TLSRoute/t/term",rule="0",code="2xx"} 2"#,
            r#"route="TLSRoute/t/pass",rule="0",code="2xx"} 1"#,
            r#"route="TLSRoute/t/strict",rule="0",code="2xx"} 1"#,
        ],
    )
    .await;
    proxy.stop().await;
}

const TCP: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_TCP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: TCPRoute, namespace: t, name: db, rule: 0}
      backends: {BACKENDS}
clusters:
- name: t/a:5432
  endpoints: [{address: 127.0.0.1, port: {A}, ready: true, serving: true}]
- name: t/b:5432
  endpoints: [{address: 127.0.0.1, port: {B}, ready: true, serving: true}]
- name: t/c:5432
  endpoints: [{address: 127.0.0.1, port: {C}, ready: true, serving: true}]
"#;

/// A TCP server that answers every line with "<name> <line>", for as long as the connection
/// lasts.
async fn line_backend(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = tcp.into_split();
                let mut lines = BufReader::new(read).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let answer = format!("{name} {line}\n");
                    if write.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// One line sent and one read on an open relayed connection.
async fn ask(lines: &mut tokio::io::Lines<BufReader<TcpStream>>, line: &str) -> String {
    lines
        .get_mut()
        .get_mut()
        .write_all(format!("{line}\n").as_bytes())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), lines.next_line())
        .await
        .expect("an answer in time")
        .unwrap()
        .expect("an open connection")
}

async fn connect(port: u16) -> tokio::io::Lines<BufReader<TcpStream>> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    BufReader::new(tcp).lines()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_connections_split_by_weight_and_outlive_a_route_change() {
    let (a, b, c) = (
        line_backend("a").await,
        line_backend("b").await,
        line_backend("c").await,
    );
    let port = free_port();
    let vars = |backends: &str| {
        vec![
            ("PORT", port.to_string()),
            ("A", a.port().to_string()),
            ("B", b.port().to_string()),
            ("C", c.port().to_string()),
            ("BACKENDS", backends.to_owned()),
        ]
    };
    let split = snapshot(
        TCP,
        &vars(r#"[{cluster: "t/a:5432", weight: 3}, {cluster: "t/b:5432", weight: 1}]"#),
    );
    let proxy = Proxy::start(&split).await;

    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for i in 0..400 {
        let mut conn = connect(port).await;
        let answer = ask(&mut conn, &format!("n{i}")).await;
        let (name, echoed) = answer.split_once(' ').unwrap();
        assert_eq!(echoed, format!("n{i}"), "bytes arrive as sent");
        *counts.entry(name.to_owned()).or_default() += 1;
    }
    // 3:1 of 400; a random pick would stay within five standard deviations (about 43).
    let a_share = counts.get("a").copied().unwrap_or(0);
    assert!((257..=343).contains(&a_share), "{counts:?}");
    assert_eq!(a_share + counts.get("b").copied().unwrap_or(0), 400);

    // An established connection keeps its backend when the route changes; new ones follow the
    // change.
    let mut established = connect(port).await;
    let first = ask(&mut established, "before").await;
    let backend = first.split_once(' ').unwrap().0.to_owned();
    let moved = snapshot(TCP, &vars(r#"[{cluster: "t/c:5432", weight: 1}]"#));
    proxy.update(&moved);
    proxy.wait_ready(&moved.version).await;
    assert_eq!(
        ask(&mut established, "after").await,
        format!("{backend} after")
    );
    let mut fresh = connect(port).await;
    assert_eq!(ask(&mut fresh, "new").await, "c new");

    assert_metrics(
        &proxy,
        &[r#"route="TCPRoute/t/db",rule="0",code="2xx"} 402"#],
    )
    .await;
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_connection_lives_while_bytes_move_and_closes_once_idle() {
    let a = line_backend("a").await;
    let port = free_port();
    let snap = snapshot(
        TCP,
        &[
            ("PORT", port.to_string()),
            ("A", a.port().to_string()),
            ("B", a.port().to_string()),
            ("C", a.port().to_string()),
            (
                "BACKENDS",
                r#"[{cluster: "t/a:5432", weight: 1}]"#.to_owned(),
            ),
        ],
    );
    let idle = Duration::from_millis(400);
    let limits = coxswain_proxy::limits::Limits {
        relay_idle: idle,
        ..Default::default()
    };
    let proxy = Proxy::start_with(&snap, limits).await;
    let mut conn = connect(port).await;
    // A conversation that pauses less than the idle time keeps its connection, for longer
    // than the idle time in all.
    let talking = std::time::Instant::now();
    let mut i = 0;
    let mut sent = talking;
    while talking.elapsed() < idle * 3 {
        sent = std::time::Instant::now();
        assert_eq!(ask(&mut conn, &format!("n{i}")).await, format!("a n{i}"));
        tokio::time::sleep(idle / 4).await;
        i += 1;
    }
    // Then silence: the proxy closes the connection, and not before the idle time has passed
    // since the last line was sent (the proxy read it after that).
    let end = tokio::time::timeout(Duration::from_secs(10), conn.next_line())
        .await
        .expect("the idle connection is closed in time")
        .unwrap();
    assert_eq!(end, None, "closed, nothing more sent");
    assert!(
        sent.elapsed() >= idle,
        "closed {:?} after the last line",
        sent.elapsed()
    );
    assert_metrics(&proxy, &["coxswain_proxy_relay_idle_closed_total 1"]).await;
    proxy.stop().await;
}

const UDP: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_UDP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: UDPRoute, namespace: t, name: dns, rule: 0}
      backends: {BACKENDS}
clusters:
- name: t/a:53
  endpoints: [{address: 127.0.0.1, port: {A}, ready: true, serving: true}]
- name: t/b:53
  endpoints: [{address: 127.0.0.1, port: {B}, ready: true, serving: true}]
"#;

/// A UDP server that answers every datagram with "<name> <datagram>".
async fn udp_backend(name: &'static str) -> SocketAddr {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_535];
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            let answer = format!("{name} {}", String::from_utf8_lossy(&buf[..n]));
            let _ = socket.send_to(answer.as_bytes(), from).await;
        }
    });
    addr
}

/// A client socket of its own (a flow of its own at the proxy).
async fn udp_client() -> tokio::net::UdpSocket {
    tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap()
}

/// One datagram to `port` and the answer, if one comes within `wait`.
async fn udp_ask(
    client: &tokio::net::UdpSocket,
    port: u16,
    payload: &str,
    wait: Duration,
) -> Option<String> {
    client
        .send_to(payload.as_bytes(), ("127.0.0.1", port))
        .await
        .unwrap();
    let mut buf = vec![0u8; 65_535];
    let (n, _) = tokio::time::timeout(wait, client.recv_from(&mut buf))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

fn udp_snapshot(port: u16, a: SocketAddr, b: SocketAddr, backends: &str) -> Snapshot {
    snapshot(
        UDP,
        &[
            ("PORT", port.to_string()),
            ("A", a.port().to_string()),
            ("B", b.port().to_string()),
            ("BACKENDS", backends.to_owned()),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_flows_split_by_weight_keep_their_backend_and_outlive_a_route_change() {
    let (a, b) = (udp_backend("a").await, udp_backend("b").await);
    let port = free_port();
    let split = udp_snapshot(
        port,
        a,
        b,
        r#"[{cluster: "t/a:53", weight: 3}, {cluster: "t/b:53", weight: 1}]"#,
    );
    let proxy = Proxy::start(&split).await;
    let wait = Duration::from_secs(5);

    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    // Every client socket stays open to the end: a closed one's port could be handed to a
    // later client, which would then be the same flow to the proxy.
    let mut clients = Vec::new();
    for i in 0..400 {
        let client = udp_client().await;
        let answer = udp_ask(&client, port, &format!("q{i}"), wait)
            .await
            .unwrap_or_else(|| panic!("no answer to flow {i}"));
        let (name, echoed) = answer.split_once(' ').unwrap();
        assert_eq!(echoed, format!("q{i}"), "datagrams arrive as sent");
        *counts.entry(name.to_owned()).or_default() += 1;
        clients.push(client);
    }
    let a_share = counts.get("a").copied().unwrap_or(0);
    assert!((257..=343).contains(&a_share), "{counts:?}");

    // One client is one flow: every datagram goes to the backend its first one picked, and
    // keeps going there after the route changes; a new client follows the change.
    let kept = udp_client().await;
    let first = udp_ask(&kept, port, "1", wait).await.unwrap();
    let backend = first.split_once(' ').unwrap().0.to_owned();
    for i in 2..10 {
        assert_eq!(
            udp_ask(&kept, port, &i.to_string(), wait).await,
            Some(format!("{backend} {i}"))
        );
    }
    let other = if backend == "a" { "t/b:53" } else { "t/a:53" };
    let moved = udp_snapshot(
        port,
        a,
        b,
        &format!(r#"[{{cluster: "{other}", weight: 1}}]"#),
    );
    proxy.update(&moved);
    proxy.wait_ready(&moved.version).await;
    assert_eq!(
        udp_ask(&kept, port, "after", wait).await,
        Some(format!("{backend} after"))
    );
    let fresh = udp_client().await;
    let answer = udp_ask(&fresh, port, "new", wait).await.unwrap();
    assert_ne!(answer.split_once(' ').unwrap().0, backend, "{answer}");

    // 400 flows, the kept one and the fresh one.
    assert_metrics(
        &proxy,
        &[r#"route="UDPRoute/t/dns",rule="0",code="2xx"} 402"#],
    )
    .await;
    drop(clients);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_udp_flow_table_drops_new_clients_until_a_flow_is_idle() {
    use coxswain_proxy::table::{SharedTable, Table};
    let (a, b) = (udp_backend("a").await, udp_backend("b").await);
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let port = socket.local_addr().unwrap().port();
    let table = SharedTable::default();
    let to_a = udp_snapshot(port, a, b, r#"[{cluster: "t/a:53", weight: 1}]"#);
    table.store(Table::build(&to_a.seal(), table.metrics()).unwrap());
    let idle = Duration::from_millis(300);
    let relay = tokio::spawn(coxswain_proxy::relay::udp::serve_with(
        socket,
        table.clone(),
        port,
        idle,
        1,
    ));
    let wait = Duration::from_secs(5);

    let first = udp_client().await;
    assert_eq!(
        udp_ask(&first, port, "hi", wait).await.as_deref(),
        Some("a hi")
    );
    // The route moves to b; the one flow there is stays on a.
    let to_b = udp_snapshot(port, a, b, r#"[{cluster: "t/b:53", weight: 1}]"#);
    table.store(Table::build(&to_b.seal(), table.metrics()).unwrap());
    assert_eq!(
        udp_ask(&first, port, "again", wait).await.as_deref(),
        Some("a again")
    );
    let flow_started = std::time::Instant::now();
    // The table holds one flow: a second client is dropped, and counted.
    let second = udp_client().await;
    let refused = &table.metrics().udp_flows_refused;
    assert_eq!(
        udp_ask(&second, port, "me too", Duration::from_millis(200)).await,
        None
    );
    assert!(refused.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    // Once the first flow has been idle long enough it ends, and the second client gets in,
    // on the route as it is now.
    let answer = loop {
        if let Some(a) = udp_ask(&second, port, "me too", Duration::from_millis(100)).await {
            break a;
        }
        assert!(
            flow_started.elapsed() < Duration::from_secs(10),
            "the idle flow never ended"
        );
    };
    assert_eq!(answer, "b me too");
    assert!(
        flow_started.elapsed() >= idle,
        "a flow ended before it was idle: {:?}",
        flow_started.elapsed()
    );
    relay.abort();
}
