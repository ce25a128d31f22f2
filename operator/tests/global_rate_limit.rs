//! A CoxswainAccessPolicy's global rate limit end to end without a cluster: the YAML a user
//! applies, compiled by the real compiler; its shared-pool snapshot served by two proxy
//! replicas in standalone mode; requests through real sockets; the count kept by a real gRPC
//! rate limit service (an in-process stand-in for envoyproxy/ratelimit).
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

#[path = "../../test/ratelimit_service.rs"]
mod ratelimit_service;
mod support;

use coxswain_operator::compile::{self, Config, Store};
use coxswain_proxy::standalone::{self, StandaloneConfig};
use ratelimit_service::RateLimitService;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Gateway `web/edge` on `listen` and HTTPRoute `app` to a backend on `backend`
/// (`support::app_manifests`), Service `ratelimit` (the service on `service`), and the policy
/// limiting the route to 10 requests a second per client across every replica.
fn manifests(listen: u16, backend: u16, service: u16) -> String {
    format!(
        r#"{app}
---
apiVersion: v1
kind: Service
metadata: {{name: ratelimit, namespace: web}}
spec: {{ports: [{{name: p, port: {service}}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: ratelimit-1, namespace: web, labels: {{kubernetes.io/service-name: ratelimit}}}}
addressType: IPv4
ports: [{{name: p, port: {service}}}]
endpoints: [{{addresses: [127.0.0.1], conditions: {{ready: true}}}}]
---
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainAccessPolicy
metadata: {{name: shared, namespace: web}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, name: app}}]
  globalRateLimit:
    service: {{name: ratelimit, port: {service}}}
    requests: 10
    unit: Second
    failureMode: Closed
"#,
        app = support::app_manifests(listen, backend),
    )
}

/// A proxy replica serving `snapshot` on its ports; stops when the returned sender is dropped.
async fn replica(
    snapshot: &coxswain_api::snapshot::Snapshot,
    listen: u16,
) -> (tokio::sync::oneshot::Sender<()>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("snapshot.json");
    std::fs::write(&file, serde_json::to_vec(snapshot).unwrap()).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(standalone::serve(
        StandaloneConfig {
            snapshot_file: file,
            bind_ip: "127.0.0.1".parse().unwrap(),
            admin_addr: SocketAddr::from(([127, 0, 0, 1], support::free_port())),
            poll: Duration::from_millis(20),
            drain: Duration::from_secs(1),
            threads: 2,
            limits: Default::default(),
        },
        async {
            let _ = stopped.await;
        },
    ));
    for _ in 0..250 {
        if TcpStream::connect(("127.0.0.1", listen)).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (stop, dir)
}

/// The status code of one request on a kept connection.
async fn status(conn: &mut TcpStream) -> u16 {
    conn.write_all(b"GET /orders HTTP/1.1\r\nhost: shop.example\r\n\r\n")
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(conn.read(&mut byte).await.unwrap(), 1, "connection closed");
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let length: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body).await.unwrap();
    text[9..12].parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_global_limit_is_shared_by_two_replicas() {
    let (service, service_addr) = RateLimitService::start().await;
    let app = support::backend("ok", Duration::ZERO);
    // Each replica listens on its own port: two snapshots of the same objects.
    let (listen_a, listen_b) = (support::free_port(), support::free_port());
    let mut replicas = Vec::new();
    for listen in [listen_a, listen_b] {
        let mut store = Store::default();
        let mut errors = Vec::new();
        let yaml = manifests(listen, app, service_addr.port());
        store.load_yaml(Path::new("test.yaml"), &yaml, &mut errors);
        assert!(errors.is_empty(), "{errors:?}");
        let compiled = compile::compile(&store, &Config::default());
        let snapshot = &compiled.snapshots[&compile::ScopeKey::SharedPool];
        assert!(
            snapshot
                .requires
                .contains(&coxswain_api::snapshot::feature::GLOBAL_RATE_LIMIT.to_owned())
        );
        replicas.push(replica(snapshot, listen).await);
    }
    let mut a = TcpStream::connect(("127.0.0.1", listen_a)).await.unwrap();
    let mut b = TcpStream::connect(("127.0.0.1", listen_b)).await.unwrap();
    // 50 a second for 2 s, alternating replicas: 10 a second in all get through.
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let mut accepted = 0;
    for i in 0..100 {
        tick.tick().await;
        let code = status(if i % 2 == 0 { &mut a } else { &mut b }).await;
        match code {
            200 => accepted += 1,
            429 => {}
            other => panic!("status {other}"),
        }
    }
    eprintln!("global 10 rps over two replicas, 100 requests at 50 rps: {accepted} accepted");
    assert!((18..=22).contains(&accepted), "{accepted} accepted");
    let asked = service.asked();
    assert_eq!(asked.len(), 100);
    let entries: Vec<(String, String)> = asked[0].descriptors[0]
        .entries
        .iter()
        .map(|e| (e.key.clone(), e.value.clone()))
        .collect();
    assert_eq!(
        entries,
        [
            ("coxswain_policy".to_owned(), "web/shared".to_owned()),
            ("remote_address".to_owned(), "127.0.0.1".to_owned()),
        ]
    );
    drop(replicas);
}
