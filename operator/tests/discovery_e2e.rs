//! A proxy with no Kubernetes credentials gets everything over discovery: it bootstraps an SVID
//! with a real TokenRequest token (TokenReview by the local API server), subscribes over mTLS,
//! applies the pushed snapshot, acks, reports its bound port and serves real HTTP; it keeps
//! serving while the controller is gone and picks up a change when it is back.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_api::snapshot::{self as snap, Sealed};
use coxswain_operator::compile::{self, ScopeKey, Store};
use coxswain_operator::discovery::{DiscoveryService, Hub};
use coxswain_operator::identity::server::{IdentityService, KubeTokenReviewer};
use coxswain_operator::identity::{Allowlist, Ca};
use coxswain_proxy::discovery::DiscoveryConfig;
use coxswain_testenv::TestEnv;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use support::{backend, free_port, get, pod_token};

fn compiled_snapshot(listen: u16, backend: u16) -> Sealed {
    let yaml = support::app_manifests(listen, backend);
    let mut store = Store::default();
    let mut errors = Vec::new();
    store.load_yaml(Path::new("app.yaml"), &yaml, &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    compile::compile(&store, &compile::Config::default()).snapshots[&ScopeKey::SharedPool].clone()
}

/// Starts the discovery server on `port`; dropping the returned sender stops it.
async fn discovery(port: u16, ca: &Ca, hub: Arc<Hub>) -> tokio::sync::oneshot::Sender<()> {
    let now = time::OffsetDateTime::now_utc();
    let (cert, key) = ca
        .sign_server(&["localhost".into()], now, Duration::from_secs(3600))
        .unwrap();
    let ca_pem = ca.cert_pem().to_owned();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let service = DiscoveryService {
        hub,
        leader: Arc::new(AtomicBool::new(true)),
    };
    tokio::spawn(async move {
        let _ =
            coxswain_operator::discovery::serve(listener, &cert, &key, &ca_pem, service, async {
                let _ = rx.await;
            })
            .await;
    });
    tx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_bootstraps_subscribes_serves_and_survives_the_controller() {
    let env = TestEnv::new().await;
    let now = time::OffsetDateTime::now_utc();
    let ca = Arc::new(Ca::generate("cluster.local", now).unwrap());

    // The bootstrap listener, with TokenReview against the real API server.
    let (cert, key) = ca
        .sign_server(&["localhost".into()], now, Duration::from_secs(3600))
        .unwrap();
    let identity = IdentityService {
        ca: ca.clone(),
        reviewer: KubeTokenReviewer {
            client: env.client.clone(),
        },
        allowlist: Arc::new(RwLock::new(Allowlist::new((
            &env.namespace,
            "coxswain-proxy",
        )))),
        trust_domain: "cluster.local".into(),
        limiter: coxswain_operator::identity::ratelimit::RateLimiter::new(Default::default()),
        admin: Arc::new(coxswain_operator::admin::State::default()),
    };
    let id_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let id_port = id_listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        coxswain_operator::identity::server::serve(
            id_listener,
            &cert,
            &key,
            identity,
            std::future::pending(),
        )
        .await
        .unwrap();
    });

    // The discovery listener, with the shared pool's snapshot.
    let (listen, first_backend) = (free_port(), backend("first", Duration::ZERO));
    let hub = Arc::new(Hub::default());
    hub.allow(ScopeKey::SharedPool, &env.namespace, "coxswain-proxy");
    let snapshot = compiled_snapshot(listen, first_backend);
    hub.publish(ScopeKey::SharedPool, snapshot.clone());
    let disc_port = free_port();
    let stop_discovery = discovery(disc_port, &ca, hub.clone()).await;

    // The proxy's mounted files: the projected token and the trust bundle.
    let token = pod_token(&env, "coxswain-proxy", "proxy-0", "coxswain-discovery").await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), token).unwrap();
    std::fs::write(dir.path().join("ca.crt"), ca.cert_pem()).unwrap();

    let config = DiscoveryConfig {
        endpoints: vec![format!("https://localhost:{disc_port}")],
        bootstrap_endpoint: format!("https://localhost:{id_port}"),
        token_path: dir.path().join("token"),
        trust_bundle_path: dir.path().join("ca.crt"),
        scope: snap::Scope {
            kind: Some(snap::scope::Kind::SharedPool(snap::SharedPool {})),
        },
        node_id: "proxy-0".into(),
        workers: 2,
        limits: Default::default(),
    };
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let (stop_proxy, proxy_stopped) = tokio::sync::oneshot::channel::<()>();
    let proxy = tokio::spawn(coxswain_proxy::discovery::serve(
        config,
        "127.0.0.1".parse().unwrap(),
        admin,
        Duration::from_secs(2),
        async {
            let _ = proxy_stopped.await;
        },
    ));

    // 1. Bootstrapped, subscribed, applied, acked, reported the bound port, serving.
    let mut body = String::new();
    for _ in 0..200 {
        if let Ok(r) = get(listen, "/").await
            && r.starts_with("HTTP/1.1 200")
        {
            body = r;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(body.ends_with("first"), "no route served: {body:?}");
    let mut acked = false;
    for _ in 0..100 {
        acked = hub.serving(&ScopeKey::SharedPool, &snapshot.version, u32::from(listen));
        if acked {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(acked, "{:?}", hub.proxies(&ScopeKey::SharedPool));

    // 3. The controller goes away: the proxy keeps serving its last snapshot.
    drop(stop_discovery);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..50 {
        let r = get(listen, "/").await.unwrap();
        assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("first"), "{r}");
    }
    // A change made meanwhile is picked up when it is back.
    let second_backend = backend("second", Duration::ZERO);
    let changed = compiled_snapshot(listen, second_backend);
    hub.publish(ScopeKey::SharedPool, changed.clone());
    let _restarted = discovery(disc_port, &ca, hub.clone()).await;
    let mut switched = false;
    for _ in 0..300 {
        let r = get(listen, "/").await.unwrap();
        assert!(
            r.starts_with("HTTP/1.1 200"),
            "a request failed during reconnect: {r}"
        );
        if r.ends_with("second") {
            switched = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(switched, "the proxy never picked up the change");

    // 4. A snapshot past gRPC's default 4 MiB message limit (a cluster of some 25,000 routes)
    // is received and served too.
    let third_backend = backend("third", Duration::ZERO);
    let mut large = compiled_snapshot(listen, third_backend).into_snapshot();
    let padding: Vec<snap::VirtualHost> = (0..40_000)
        .map(|i| snap::VirtualHost {
            hostname: format!("pad{i}.{}.{}.example", "a".repeat(60), "b".repeat(60)),
            ..Default::default()
        })
        .collect();
    large.listeners[0].virtual_hosts.extend(padding);
    let large = large.seal();
    let size = large.encoded().len();
    assert!(size > 4 << 20, "only {size} bytes");
    hub.publish(ScopeKey::SharedPool, large);
    let mut served = false;
    for _ in 0..300 {
        let r = get(listen, "/").await.unwrap();
        if r.ends_with("third") {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served, "the proxy never served the {size}-byte snapshot");

    let _ = stop_proxy.send(());
    proxy.await.unwrap().unwrap();
}
