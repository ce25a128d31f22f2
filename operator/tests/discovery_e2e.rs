//! A proxy with no Kubernetes credentials gets everything over discovery: it bootstraps an SVID
//! with a real TokenRequest token (TokenReview by the local API server), subscribes over mTLS,
//! applies the pushed snapshot, acks, reports its bound port and serves real HTTP; it keeps
//! serving while the controller is gone and picks up a change when it is back, and it leaves a
//! controller that went silent without closing the stream.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_api::discovery::Liveness;
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
        let _ = coxswain_operator::discovery::serve(
            listener,
            &cert,
            &key,
            &ca_pem,
            service,
            Default::default(),
            async {
                let _ = rx.await;
            },
        )
        .await;
    });
    tx
}

/// A controller's two listeners on loopback (bootstrap with TokenReview against the real API
/// server, discovery with `hub`), and the files a proxy Pod would have mounted.
struct Controller {
    ca: Arc<Ca>,
    hub: Arc<Hub>,
    id_port: u16,
    disc_port: u16,
    stop_discovery: tokio::sync::oneshot::Sender<()>,
    files: tempfile::TempDir,
    _env: TestEnv,
}

impl Controller {
    async fn start() -> Self {
        let env = TestEnv::new().await;
        let now = time::OffsetDateTime::now_utc();
        let ca = Arc::new(Ca::generate("cluster.local", now).unwrap());
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
        let hub = Arc::new(Hub::default());
        hub.allow(ScopeKey::SharedPool, &env.namespace, "coxswain-proxy");
        let disc_port = free_port();
        let stop_discovery = discovery(disc_port, &ca, hub.clone()).await;
        let token = pod_token(&env, "coxswain-proxy", "proxy-0", "coxswain-discovery").await;
        let files = tempfile::tempdir().unwrap();
        std::fs::write(files.path().join("token"), token).unwrap();
        std::fs::write(files.path().join("ca.crt"), ca.cert_pem()).unwrap();
        Self {
            ca,
            hub,
            id_port,
            disc_port,
            stop_discovery,
            files,
            _env: env,
        }
    }

    /// Pod `proxy-0` of the shared pool, streaming from `stream_port`.
    fn proxy_config(&self, stream_port: u16, liveness: Liveness) -> DiscoveryConfig {
        DiscoveryConfig {
            endpoints: vec![format!("https://localhost:{stream_port}")],
            bootstrap_endpoint: format!("https://localhost:{}", self.id_port),
            token_path: self.files.path().join("token"),
            trust_bundle_path: self.files.path().join("ca.crt"),
            scope: snap::Scope {
                kind: Some(snap::scope::Kind::SharedPool(snap::SharedPool {})),
            },
            node_id: "proxy-0".into(),
            workers: 2,
            limits: Default::default(),
            liveness,
        }
    }
}

/// Runs a proxy until the returned sender is dropped or sent to.
fn run_proxy(
    config: DiscoveryConfig,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), coxswain_proxy::discovery::ServeError>>,
) {
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(coxswain_proxy::discovery::serve(
        config,
        "127.0.0.1".parse().unwrap(),
        admin,
        Duration::from_secs(2),
        async {
            let _ = stopped.await;
        },
    ));
    (stop, task)
}

/// Waits (15 s at most) until `listen` answers 200 with a body ending in `name`.
async fn serves(listen: u16, name: &str) -> bool {
    for _ in 0..300 {
        if let Ok(r) = get(listen, "/").await
            && r.starts_with("HTTP/1.1 200")
            && r.ends_with(name)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_bootstraps_subscribes_serves_and_survives_the_controller() {
    let c = Controller::start().await;
    let config = c.proxy_config(c.disc_port, Liveness::default());
    let (listen, first_backend) = (free_port(), backend("first", Duration::ZERO));
    let snapshot = compiled_snapshot(listen, first_backend);
    c.hub.publish(ScopeKey::SharedPool, snapshot.clone());
    let Controller {
        ca,
        hub,
        disc_port,
        stop_discovery,
        ..
    } = c;
    let (stop_proxy, proxy) = run_proxy(config);

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_leaves_a_controller_that_went_silent() {
    let c = Controller::start().await;
    let relay = support::silence::SilenceRelay::start(c.disc_port).await;
    let liveness = Liveness {
        ping_every: Duration::from_secs(1),
        answer_within: Duration::from_secs(1),
    };
    let listen = free_port();
    c.hub.publish(
        ScopeKey::SharedPool,
        compiled_snapshot(listen, backend("first", Duration::ZERO)),
    );
    let (stop_proxy, proxy) = run_proxy(c.proxy_config(relay.port, liveness));
    assert!(serves(listen, "first").await, "no route served");
    let connections = relay.accepted();

    // The controller's network goes away under the open stream: no FIN, no reset, and the
    // change published next never arrives on it. The unanswered pings end the stream; the
    // proxy reconnects (this time the path works) and gets the change.
    relay.silence();
    c.hub.publish(
        ScopeKey::SharedPool,
        compiled_snapshot(listen, backend("second", Duration::ZERO)),
    );
    assert!(
        serves(listen, "second").await,
        "the proxy still waits on the silent stream ({} connections made)",
        relay.accepted()
    );
    assert!(
        relay.accepted() > connections,
        "served without reconnecting"
    );
    assert_eq!(relay.silenced(), 1);

    let _ = stop_proxy.send(());
    proxy.await.unwrap().unwrap();
    drop(c.stop_discovery);
}
