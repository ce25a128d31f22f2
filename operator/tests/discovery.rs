//! The discovery stream over real mutual TLS and gRPC on loopback: who may subscribe to what,
//! and the snapshot / ack / bound-listener exchange.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

use coxswain_api::discovery::discovery_client::DiscoveryClient;
use coxswain_api::discovery::{
    Ack, BoundListener, Liveness, NodeStatus, ProxyMessage, Subscribe, WIRE_VERSION,
    controller_message, proxy_message,
};
use coxswain_api::names::SpiffeId;
use coxswain_api::snapshot::{self as snap, Sealed, Snapshot};
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

#[path = "support/silence.rs"]
#[allow(dead_code)]
mod silence;

struct Controller {
    ca: Arc<Ca>,
    hub: Arc<Hub>,
    leader: Arc<AtomicBool>,
    port: u16,
}

fn snapshot(port: u32) -> Sealed {
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
    controller_with(Liveness::default()).await
}

async fn controller_with(liveness: Liveness) -> Controller {
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
            liveness,
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

/// An SVID for ns/sa issued to Pod `proxy-0` from `ca`, valid from `now - 5 min` for
/// `lifetime` after `issued`.
fn svid(
    ca: &Ca,
    ns: &str,
    sa: &str,
    issued: OffsetDateTime,
    lifetime: Duration,
) -> (String, String) {
    svid_for_pod(ca, ns, sa, "proxy-0", issued, lifetime)
}

fn svid_for_pod(
    ca: &Ca,
    ns: &str,
    sa: &str,
    pod: &str,
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
            pod,
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
    client_at(c, c.port, identity).await
}

/// A client of `c` that connects to `port` (a relay in front of it).
async fn client_at(
    c: &Controller,
    port: u16,
    identity: Option<(String, String)>,
) -> Result<DiscoveryClient<Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(c.ca.cert_pem()))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let channel = Channel::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(DiscoveryClient::new(channel))
}

fn subscribe(scope: ScopeKey, wire_version: u32) -> ProxyMessage {
    subscribe_as(scope, wire_version, "proxy-0")
}

fn subscribe_as(scope: ScopeKey, wire_version: u32, node_id: &str) -> ProxyMessage {
    let kind = match scope {
        ScopeKey::SharedPool => snap::scope::Kind::SharedPool(snap::SharedPool {}),
        ScopeKey::Gateway(k) => snap::scope::Kind::Gateway(snap::ObjectRef {
            namespace: k.namespace,
            name: k.name,
        }),
    };
    ProxyMessage {
        kind: Some(proxy_message::Kind::Subscribe(Subscribe {
            node_id: node_id.into(),
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
    let version = decoded(&push).version;
    assert_eq!(version, snapshot(80).version);
    assert!(decoded(&push).is_sealed());
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
    assert_eq!(decoded(&push).listeners[0].port, 8080);

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

fn ack(version: &str, nonce: &str) -> ProxyMessage {
    ProxyMessage {
        kind: Some(proxy_message::Kind::Ack(Ack {
            version: version.into(),
            nonce: nonce.into(),
        })),
    }
}

fn bound(version: &str, ports: &[u32]) -> ProxyMessage {
    ProxyMessage {
        kind: Some(proxy_message::Kind::NodeStatus(NodeStatus {
            snapshot_version: version.into(),
            listeners: ports
                .iter()
                .map(|&port| BoundListener {
                    port,
                    bound: true,
                    error: String::new(),
                })
                .collect(),
        })),
    }
}

/// The first push of a stream: (version, nonce).
async fn first_push(
    pushes: &mut tonic::Streaming<coxswain_api::discovery::ControllerMessage>,
) -> (String, String) {
    let msg = pushes.message().await.unwrap().unwrap();
    let Some(controller_message::Kind::Snapshot(push)) = msg.kind else {
        panic!("{msg:?}")
    };
    (decoded(&push).version, push.nonce)
}

/// The snapshot a push carries, encoded.
fn decoded(push: &coxswain_api::discovery::SnapshotPush) -> Snapshot {
    prost::Message::decode(push.snapshot.clone()).expect("a push carries an encoded Snapshot")
}

/// Waits (2 s at most) until the shared pool's proxies are exactly `want`.
async fn proxies_become(c: &Controller, want: &[(&str, Option<&str>, &[u32])]) {
    let want: Vec<(String, Option<String>, Vec<u32>)> = want
        .iter()
        .map(|(n, v, p)| (n.to_string(), v.map(str::to_owned), p.to_vec()))
        .collect();
    let now = || -> Vec<(String, Option<String>, Vec<u32>)> {
        let mut list: Vec<_> = c
            .hub
            .proxies(&ScopeKey::SharedPool)
            .into_iter()
            .map(|(n, st)| (n, st.acked_version, st.bound_ports))
            .collect();
        list.sort();
        list
    };
    for _ in 0..100 {
        if now() == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(now(), want);
}

#[tokio::test]
async fn replicas_sharing_a_service_account_cannot_touch_each_others_reports() {
    let c = controller().await;
    let now = OffsetDateTime::now_utc();
    let hour = Duration::from_secs(3600);
    let replica =
        |pod: &str| svid_for_pod(&c.ca, "coxswain-system", "coxswain-proxy", pod, now, hour);

    // Replica a: acks the snapshot and binds port 80. The node id it sends is its Pod's.
    let mut client_a = client(&c, Some(replica("proxy-a"))).await.unwrap();
    let (tx_a, resp) = open(
        &mut client_a,
        subscribe_as(ScopeKey::SharedPool, WIRE_VERSION, "proxy-a"),
    )
    .await;
    let mut pushes_a = resp.unwrap();
    let (version, nonce) = first_push(&mut pushes_a).await;
    tx_a.send(ack(&version, &nonce)).await.unwrap();
    tx_a.send(bound(&version, &[80])).await.unwrap();
    proxies_become(&c, &[("proxy-a", Some(&version), &[80])]).await;
    assert!(c.hub.serving(&ScopeKey::SharedPool, &version, 80));

    // Replica b, a valid SVID of the same scope, claims to be a: refused before any snapshot.
    let status = refused(
        &c,
        Some(replica("proxy-b")),
        subscribe_as(ScopeKey::SharedPool, WIRE_VERSION, "proxy-a"),
    )
    .await
    .unwrap();
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status}");
    assert!(
        status.message().contains("proxy-a") && status.message().contains("proxy-b"),
        "the refusal names both: {status}"
    );

    // Sending no node id, b is itself: what it acks and binds is its own record, not a's.
    let mut client_b = client(&c, Some(replica("proxy-b"))).await.unwrap();
    let (tx_b, resp) = open(
        &mut client_b,
        subscribe_as(ScopeKey::SharedPool, WIRE_VERSION, ""),
    )
    .await;
    let mut pushes_b = resp.unwrap();
    let (_, nonce_b) = first_push(&mut pushes_b).await;
    tx_b.send(ack("forged-version", &nonce_b)).await.unwrap();
    tx_b.send(bound("forged-version", &[])).await.unwrap();
    proxies_become(
        &c,
        &[
            ("proxy-a", Some(&version), &[80]),
            ("proxy-b", Some("forged-version"), &[]),
        ],
    )
    .await;
    assert!(
        !c.hub.serving(&ScopeKey::SharedPool, &version, 80),
        "Programmed waits for every replica"
    );

    // b leaving forgets b only.
    drop(tx_b);
    drop(pushes_b);
    proxies_become(&c, &[("proxy-a", Some(&version), &[80])]).await;

    // a reconnecting replaces its own record; the old stream can no longer write it, and its
    // end does not forget the new one.
    let mut client_a2 = client(&c, Some(replica("proxy-a"))).await.unwrap();
    let (tx_a2, resp) = open(
        &mut client_a2,
        subscribe_as(ScopeKey::SharedPool, WIRE_VERSION, "proxy-a"),
    )
    .await;
    let mut pushes_a2 = resp.unwrap();
    let (_, nonce2) = first_push(&mut pushes_a2).await;
    proxies_become(&c, &[("proxy-a", None, &[])]).await;
    // The old stream's last words, then its end (once its pushes end, the server has handled
    // both): neither touches the new record.
    tx_a.send(ack("from-the-old-stream", &nonce)).await.unwrap();
    drop(tx_a);
    while let Ok(Some(_)) = pushes_a.message().await {}
    proxies_become(&c, &[("proxy-a", None, &[])]).await;
    tx_a2.send(ack(&version, &nonce2)).await.unwrap();
    tx_a2.send(bound(&version, &[80])).await.unwrap();
    proxies_become(&c, &[("proxy-a", Some(&version), &[80])]).await;
    drop(tx_a2);
}

#[tokio::test]
async fn an_svid_that_names_no_pod_is_refused() {
    let c = controller().await;
    // An SVID as an earlier controller issued them: the SPIFFE ID only, no subject.
    let key = rcgen::KeyPair::generate().unwrap();
    let issuer_key = rcgen::KeyPair::from_pem(c.ca.key_pem()).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(c.ca.cert_pem(), issuer_key).unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.subject_alt_names = vec![rcgen::SanType::URI(
        "spiffe://cluster.local/ns/coxswain-system/sa/coxswain-proxy"
            .try_into()
            .unwrap(),
    )];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &issuer).unwrap();
    let status = refused(
        &c,
        Some((cert.pem(), key.serialize_pem())),
        subscribe_as(ScopeKey::SharedPool, WIRE_VERSION, "proxy-0"),
    )
    .await
    .unwrap();
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status}");
    assert!(status.message().contains("names no Pod"), "{status}");
    assert!(c.hub.proxies(&ScopeKey::SharedPool).is_empty());
}

/// The shared pool's SVID for Pod `proxy-0`.
fn shared_svid(c: &Controller) -> (String, String) {
    svid(
        &c.ca,
        "coxswain-system",
        "coxswain-proxy",
        OffsetDateTime::now_utc(),
        Duration::from_secs(3600),
    )
}

#[tokio::test]
async fn a_replica_that_loses_the_lease_ends_its_streams() {
    let c = controller().await;
    let mut client = client(&c, Some(shared_svid(&c))).await.unwrap();
    let (tx, resp) = open(&mut client, subscribe(ScopeKey::SharedPool, WIRE_VERSION)).await;
    let mut pushes = resp.unwrap();
    let (version, nonce) = first_push(&mut pushes).await;
    tx.send(ack(&version, &nonce)).await.unwrap();
    proxies_become(&c, &[("proxy-0", Some(&version), &[])]).await;

    // It would push nothing more (the new leader does): the proxy is sent on, with the answer
    // a standby gives, which the proxy retries soon at its next endpoint.
    c.leader.store(false, std::sync::atomic::Ordering::Release);
    let ended = tokio::time::timeout(Duration::from_secs(10), pushes.message())
        .await
        .expect("the stream stayed open after the replica lost the lease");
    let status = ended.expect_err("the stream ended without saying why");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status}");
    assert!(status.message().contains("not the leader"), "{status}");
    proxies_become(&c, &[]).await;
}

#[tokio::test]
async fn a_proxy_that_stops_answering_is_forgotten() {
    let liveness = Liveness {
        ping_every: Duration::from_secs(1),
        answer_within: Duration::from_secs(1),
    };
    let c = controller_with(liveness).await;
    let relay = silence::SilenceRelay::start(c.port).await;
    let mut client = client_at(&c, relay.port, Some(shared_svid(&c)))
        .await
        .unwrap();
    let (tx, resp) = open(&mut client, subscribe(ScopeKey::SharedPool, WIRE_VERSION)).await;
    let mut pushes = resp.unwrap();
    let (version, nonce) = first_push(&mut pushes).await;
    tx.send(ack(&version, &nonce)).await.unwrap();
    tx.send(bound(&version, &[80])).await.unwrap();
    proxies_become(&c, &[("proxy-0", Some(&version), &[80])]).await;
    assert!(c.hub.serving(&ScopeKey::SharedPool, &version, 80));

    // The proxy's network goes away under the open connection: no FIN, no reset. Unanswered
    // pings close it, and a proxy that is gone no longer counts among those that must ack.
    relay.silence();
    let mut forgotten = false;
    for _ in 0..500 {
        forgotten = c.hub.proxies(&ScopeKey::SharedPool).is_empty();
        if forgotten {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        forgotten,
        "a silent proxy is still counted: {:?}",
        c.hub.proxies(&ScopeKey::SharedPool)
    );
    assert_eq!(
        relay.silenced(),
        1,
        "the connection was closed, not silenced"
    );
}
