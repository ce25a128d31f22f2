//! The discovery stream over real mutual TLS and gRPC on loopback: who may subscribe to what,
//! and the snapshot / ack / bound-listener exchange.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

use coxswain_api::discovery::discovery_client::DiscoveryClient;
use coxswain_api::discovery::{
    Ack, BoundListener, NodeStatus, ProxyMessage, Subscribe, WIRE_VERSION, controller_message,
    proxy_message,
};
use coxswain_api::names::SpiffeId;
use coxswain_api::snapshot::{self as snap, Snapshot};
use coxswain_operator::compile::ScopeKey;
use coxswain_operator::compile::status::ObjectKey;
use coxswain_operator::discovery::{DiscoveryService, Hub};
use coxswain_operator::identity::Ca;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use time::OffsetDateTime;
use tokio::sync::mpsc;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

struct Controller {
    ca: Arc<Ca>,
    hub: Arc<Hub>,
    leader: Arc<AtomicBool>,
    port: u16,
}

fn snapshot(port: u32) -> Snapshot {
    Snapshot {
        scope: Some(snap::Scope {
            kind: Some(snap::scope::Kind::SharedPool(snap::SharedPool {})),
        }),
        listeners: vec![snap::Listener {
            port,
            protocol: snap::Protocol::Http as i32,
            ..Default::default()
        }],
        ..Default::default()
    }
    .seal()
}

async fn controller() -> Controller {
    let now = OffsetDateTime::now_utc();
    let ca = Arc::new(Ca::generate("cluster.local", now).unwrap());
    let (cert, key) = ca
        .sign_server(&["localhost".into()], now, Duration::from_secs(3600))
        .unwrap();
    let hub = Arc::new(Hub::default());
    hub.allow(ScopeKey::SharedPool, "coxswain-system", "coxswain-proxy");
    hub.allow(
        ScopeKey::Gateway(ObjectKey::new("web", "edge")),
        "web",
        "edge-coxswain",
    );
    hub.publish(ScopeKey::SharedPool, snapshot(80));
    let leader = Arc::new(AtomicBool::new(true));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let service = DiscoveryService {
        hub: hub.clone(),
        leader: leader.clone(),
    };
    let ca_pem = ca.cert_pem().to_owned();
    tokio::spawn(async move {
        coxswain_operator::discovery::serve(
            listener,
            &cert,
            &key,
            &ca_pem,
            service,
            std::future::pending(),
        )
        .await
        .unwrap();
    });
    Controller {
        ca,
        hub,
        leader,
        port,
    }
}

/// An SVID for ns/sa from `ca`, valid from `now - 5 min` for `lifetime` after `issued`.
fn svid(
    ca: &Ca,
    ns: &str,
    sa: &str,
    issued: OffsetDateTime,
    lifetime: Duration,
) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let csr = rcgen::CertificateParams::default()
        .serialize_request(&key)
        .unwrap()
        .pem()
        .unwrap();
    let (chain, _) = ca
        .sign_svid(
            &csr,
            &SpiffeId::new("cluster.local", ns, sa),
            issued,
            lifetime,
        )
        .unwrap();
    (chain, key.serialize_pem())
}

async fn client(
    c: &Controller,
    identity: Option<(String, String)>,
) -> Result<DiscoveryClient<Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(c.ca.cert_pem()))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let channel = Channel::from_shared(format!("https://localhost:{}", c.port))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(DiscoveryClient::new(channel))
}

fn subscribe(scope: ScopeKey, wire_version: u32) -> ProxyMessage {
    let kind = match scope {
        ScopeKey::SharedPool => snap::scope::Kind::SharedPool(snap::SharedPool {}),
        ScopeKey::Gateway(k) => snap::scope::Kind::Gateway(snap::ObjectRef {
            namespace: k.namespace,
            name: k.name,
        }),
    };
    ProxyMessage {
        kind: Some(proxy_message::Kind::Subscribe(Subscribe {
            node_id: "proxy-0".into(),
            wire_version,
            scope: Some(snap::Scope { kind: Some(kind) }),
        })),
    }
}

/// Opens a stream and subscribes; returns the sender for later messages and the response.
async fn open(
    client: &mut DiscoveryClient<Channel>,
    first: ProxyMessage,
) -> (
    mpsc::Sender<ProxyMessage>,
    Result<tonic::Streaming<coxswain_api::discovery::ControllerMessage>, tonic::Status>,
) {
    let (tx, rx) = mpsc::channel(8);
    tx.send(first).await.unwrap();
    let resp = client
        .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map(|r| r.into_inner());
    (tx, resp)
}

#[tokio::test]
async fn the_shared_proxy_subscribes_receives_acks_and_reports_listeners() {
    let c = controller().await;
    let id = svid(
        &c.ca,
        "coxswain-system",
        "coxswain-proxy",
        OffsetDateTime::now_utc(),
        Duration::from_secs(3600),
    );
    let mut client = client(&c, Some(id)).await.unwrap();
    let (tx, resp) = open(&mut client, subscribe(ScopeKey::SharedPool, WIRE_VERSION)).await;
    let mut pushes = resp.unwrap();

    let first = pushes.message().await.unwrap().unwrap();
    let Some(controller_message::Kind::Snapshot(push)) = first.kind else {
        panic!("{first:?}")
    };
    let version = push.snapshot.as_ref().unwrap().version.clone();
    assert_eq!(version, snapshot(80).version);
    assert!(push.snapshot.unwrap().is_sealed());
    tx.send(ProxyMessage {
        kind: Some(proxy_message::Kind::Ack(Ack {
            version: version.clone(),
            nonce: push.nonce,
        })),
    })
    .await
    .unwrap();
    tx.send(ProxyMessage {
        kind: Some(proxy_message::Kind::NodeStatus(NodeStatus {
            snapshot_version: version.clone(),
            listeners: vec![BoundListener {
                port: 80,
                bound: true,
                error: String::new(),
            }],
        })),
    })
    .await
    .unwrap();
    let mut served = false;
    for _ in 0..100 {
        served = c.hub.serving(&ScopeKey::SharedPool, &version, 80);
        if served {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served, "{:?}", c.hub.proxies(&ScopeKey::SharedPool));
    assert!(
        !c.hub.serving(&ScopeKey::SharedPool, &version, 443),
        "443 was never bound"
    );

    // A new snapshot reaches the subscribed proxy.
    c.hub.publish(ScopeKey::SharedPool, snapshot(8080));
    let next = pushes.message().await.unwrap().unwrap();
    let Some(controller_message::Kind::Snapshot(push)) = next.kind else {
        panic!("{next:?}")
    };
    assert_eq!(push.snapshot.unwrap().listeners[0].port, 8080);

    // Disconnecting forgets the proxy.
    drop(tx);
    drop(pushes);
    for _ in 0..100 {
        if c.hub.proxies(&ScopeKey::SharedPool).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(c.hub.proxies(&ScopeKey::SharedPool).is_empty());
}

/// Whatever layer refuses (TLS handshake or gRPC), no snapshot may arrive.
async fn refused(
    c: &Controller,
    identity: Option<(String, String)>,
    first: ProxyMessage,
) -> Option<tonic::Status> {
    let Ok(mut client) = client(c, identity).await else {
        return None; // refused at the TLS handshake
    };
    let (_tx, resp) = open(&mut client, first).await;
    match resp {
        Err(status) => Some(status),
        Ok(mut pushes) => match pushes.message().await {
            Ok(Some(m)) => panic!("a refused peer received {m:?}"),
            Ok(None) => None,
            Err(status) => Some(status),
        },
    }
}

/// Refused by TLS: the handshake fails (no client), or the call fails as unavailable /
/// unauthenticated; `refused` already checked that no snapshot arrived.
fn assert_transport_refused(status: Option<&tonic::Status>) {
    use tonic::Code::{Internal, Unauthenticated, Unavailable, Unknown};
    assert!(
        status
            .is_none_or(|s| matches!(s.code(), Unavailable | Unknown | Unauthenticated | Internal)),
        "{status:?}"
    );
}

#[tokio::test]
async fn peers_without_a_valid_svid_are_refused() {
    let c = controller().await;
    let now = OffsetDateTime::now_utc();
    // No client certificate.
    let status = refused(&c, None, subscribe(ScopeKey::SharedPool, WIRE_VERSION)).await;
    assert_transport_refused(status.as_ref());
    // A certificate from another CA, for the right identity.
    let other_ca = Ca::generate("cluster.local", now).unwrap();
    let forged = svid(
        &other_ca,
        "coxswain-system",
        "coxswain-proxy",
        now,
        Duration::from_secs(3600),
    );
    let status = refused(
        &c,
        Some(forged),
        subscribe(ScopeKey::SharedPool, WIRE_VERSION),
    )
    .await;
    assert_transport_refused(status.as_ref());
    // An expired SVID from the right CA.
    let two_days_ago = now - Duration::from_secs(2 * 24 * 3600);
    let expired = svid(
        &c.ca,
        "coxswain-system",
        "coxswain-proxy",
        two_days_ago,
        Duration::from_secs(24 * 3600),
    );
    let status = refused(
        &c,
        Some(expired),
        subscribe(ScopeKey::SharedPool, WIRE_VERSION),
    )
    .await;
    assert_transport_refused(status.as_ref());
    assert!(c.hub.proxies(&ScopeKey::SharedPool).is_empty());
}

#[tokio::test]
async fn scopes_wire_versions_and_leadership_are_enforced() {
    let c = controller().await;
    let now = OffsetDateTime::now_utc();
    let shared = || {
        svid(
            &c.ca,
            "coxswain-system",
            "coxswain-proxy",
            now,
            Duration::from_secs(3600),
        )
    };
    let edge = ScopeKey::Gateway(ObjectKey::new("web", "edge"));

    // A dedicated Gateway's scope asked by the shared proxy's identity.
    let status = refused(&c, Some(shared()), subscribe(edge.clone(), WIRE_VERSION))
        .await
        .unwrap();
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status}");
    // ... and by another Gateway's proxy.
    let other = svid(
        &c.ca,
        "web",
        "other-coxswain",
        now,
        Duration::from_secs(3600),
    );
    let status = refused(&c, Some(other), subscribe(edge.clone(), WIRE_VERSION))
        .await
        .unwrap();
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    // The dedicated proxy's own identity is allowed (it waits for a first snapshot).
    let own = svid(
        &c.ca,
        "web",
        "edge-coxswain",
        now,
        Duration::from_secs(3600),
    );
    let mut client_edge = client(&c, Some(own)).await.unwrap();
    let (_tx, resp) = open(&mut client_edge, subscribe(edge.clone(), WIRE_VERSION)).await;
    assert!(resp.is_ok(), "{:?}", resp.err());

    // A wrong wire version names both versions.
    let status = refused(
        &c,
        Some(shared()),
        subscribe(ScopeKey::SharedPool, WIRE_VERSION + 1),
    )
    .await
    .unwrap();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains(&format!("{}", WIRE_VERSION + 1))
            && status.message().contains(&WIRE_VERSION.to_string()),
        "{status}"
    );

    // A replica that is not the leader refuses streams.
    c.leader.store(false, std::sync::atomic::Ordering::Release);
    let status = refused(
        &c,
        Some(shared()),
        subscribe(ScopeKey::SharedPool, WIRE_VERSION),
    )
    .await
    .unwrap();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(status.message().contains("not the leader"), "{status}");
}
