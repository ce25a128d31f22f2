//! `coxswain serve proxy --shared` as real processes, across restarts and shutdowns:
//!
//! - a proxy with `--snapshot-cache-dir` keeps the snapshot it applied; killed (SIGKILL) and
//!   started again with the controller unreachable, it serves that snapshot within 2 s, while
//!   a tampered cache file is never served;
//! - a port another process holds when the snapshot comes is bound once it is free, and the
//!   controller is told;
//! - on SIGTERM `/readyz` fails at once while new connections are still served during the
//!   shutdown delay, and a second signal ends the delay.
//!
//! The controller side (bootstrap and discovery) runs in this process; TokenReview is answered
//! by a fixed reviewer, since no API server is needed to exercise the proxy's restart.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_api::snapshot::{self as snap, Sealed};
use coxswain_operator::compile::{self, ScopeKey, Store};
use coxswain_operator::discovery::{DiscoveryService, Hub};
use coxswain_operator::identity::server::{IdentityService, Review, TokenReviewer};
use coxswain_operator::identity::{Allowlist, Ca};
use coxswain_proxy::snapshot_cache::SnapshotCache;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use support::{backend, free_port, http_get};

const NAMESPACE: &str = "coxswain-system";
const SERVICE_ACCOUNT: &str = "coxswain-proxy";
const TOKEN: &str = "a-projected-token";

/// Accepts `TOKEN` only, as the shared pool's ServiceAccount bound to Pod `proxy-0`.
struct FixedReviewer;

#[tonic::async_trait]
impl TokenReviewer for FixedReviewer {
    async fn review(&self, token: &str, _audience: &str) -> Result<Review, String> {
        Ok(if token == TOKEN {
            Review::Authenticated {
                username: format!("system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"),
                pod: Some("proxy-0".into()),
            }
        } else {
            Review::Rejected {
                reason: "unknown token".into(),
            }
        })
    }
}

fn shared_scope() -> snap::Scope {
    snap::Scope {
        kind: Some(snap::scope::Kind::SharedPool(snap::SharedPool {})),
    }
}

fn compiled_snapshot(listen: u16, backend: u16) -> Sealed {
    let yaml = support::app_manifests(listen, backend);
    let mut store = Store::default();
    let mut errors = Vec::new();
    store.load_yaml(Path::new("app.yaml"), &yaml, &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    compile::compile(&store, &compile::Config::default()).snapshots[&ScopeKey::SharedPool].clone()
}

/// The bootstrap and discovery listeners of a controller that serves `snapshot` to the shared
/// pool; returns their ports. They live as long as the test's runtime.
async fn controller(ca: &Arc<Ca>, snapshot: Sealed) -> (u16, u16) {
    controller_and_hub(ca, snapshot).await.0
}

/// `controller`, with the hub that holds what its proxies report.
async fn controller_and_hub(ca: &Arc<Ca>, snapshot: Sealed) -> ((u16, u16), Arc<Hub>) {
    let now = time::OffsetDateTime::now_utc();
    let (cert, key) = ca
        .sign_server(&["localhost".into()], now, Duration::from_secs(3600))
        .unwrap();
    let identity = IdentityService {
        ca: ca.clone(),
        reviewer: FixedReviewer,
        allowlist: Arc::new(RwLock::new(Allowlist::new((NAMESPACE, SERVICE_ACCOUNT)))),
        trust_domain: "cluster.local".into(),
        limiter: coxswain_operator::identity::ratelimit::RateLimiter::new(Default::default()),
        admin: Arc::new(coxswain_operator::admin::State::default()),
    };
    let id_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let id_port = id_listener.local_addr().unwrap().port();
    let (id_cert, id_key) = (cert.clone(), key.clone());
    tokio::spawn(async move {
        coxswain_operator::identity::server::serve(
            id_listener,
            &id_cert,
            &id_key,
            identity,
            std::future::pending(),
        )
        .await
        .unwrap();
    });

    let hub = Arc::new(Hub::default());
    hub.allow(ScopeKey::SharedPool, NAMESPACE, SERVICE_ACCOUNT);
    hub.publish(ScopeKey::SharedPool, snapshot);
    let service = DiscoveryService {
        hub: hub.clone(),
        leader: Arc::new(AtomicBool::new(true)),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let disc_port = listener.local_addr().unwrap().port();
    let ca_pem = ca.cert_pem().to_owned();
    tokio::spawn(async move {
        coxswain_operator::discovery::serve(
            listener,
            &cert,
            &key,
            &ca_pem,
            service,
            Default::default(),
            std::future::pending(),
        )
        .await
        .unwrap();
    });
    ((disc_port, id_port), hub)
}

/// A shared-pool proxy process. `files` holds its token and trust bundle; its log goes to
/// `files/<log>`.
struct Proxy {
    child: Child,
    admin: u16,
    log: std::path::PathBuf,
}

impl Proxy {
    fn start(
        files: &Path,
        cache: &Path,
        (discovery, bootstrap): (u16, u16),
        extra: &[&str],
        log: &str,
    ) -> Self {
        let admin = free_port();
        let log = files.join(log);
        let child = Command::new(env!("CARGO_BIN_EXE_coxswain"))
            .args(["serve", "proxy", "--shared", "--bind-address", "127.0.0.1"])
            .args(["--threads", "1", "--node-id", "proxy-0"])
            .args([
                "--discovery-endpoint",
                &format!("https://localhost:{discovery}"),
            ])
            .args([
                "--discovery-bootstrap-endpoint",
                &format!("https://localhost:{bootstrap}"),
            ])
            .arg("--discovery-trust-bundle")
            .arg(files.join("ca.crt"))
            .arg("--token-path")
            .arg(files.join("token"))
            .arg("--snapshot-cache-dir")
            .arg(cache)
            .args(["--health-addr", &format!("127.0.0.1:{admin}")])
            .args(extra)
            .env("COXSWAIN_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Self { child, admin, log }
    }

    fn readyz(&self) -> Option<String> {
        http_get(self.admin, "/readyz", "test").ok()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit, `within` at most.
    fn exited_within(&mut self, within: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < within {
            if self.child.try_wait().unwrap().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` every 10 ms until it holds or `within` passes; the time it took.
fn wait_until(within: Duration, mut check: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if check() {
            return Some(start.elapsed());
        }
        if start.elapsed() > within {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn served(listen: u16, body: &str) -> bool {
    http_get(listen, "/", "app.example")
        .is_ok_and(|r| r.starts_with("HTTP/1.1 200") && r.ends_with(body))
}

/// The token and trust bundle a proxy Pod would have mounted.
fn mounted_files(ca: &Ca) -> tempfile::TempDir {
    let files = tempfile::tempdir().unwrap();
    std::fs::write(files.path().join("token"), TOKEN).unwrap();
    std::fs::write(files.path().join("ca.crt"), ca.cert_pem()).unwrap();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_proxy_serves_its_cached_snapshot_without_the_controller() {
    let ca = Arc::new(Ca::generate("cluster.local", time::OffsetDateTime::now_utc()).unwrap());
    let (listen, app) = (free_port(), backend("first", Duration::ZERO));
    let snapshot = compiled_snapshot(listen, app);
    let controller = controller(&ca, snapshot.clone()).await;
    let files = mounted_files(&ca);
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = SnapshotCache::new(cache_dir.path(), shared_scope());

    tokio::task::spawn_blocking(move || {
        // 1. Connected: the pushed snapshot is served and written to the cache.
        let mut first = Proxy::start(files.path(), cache_dir.path(), controller, &[], "1.log");
        assert!(
            wait_until(Duration::from_secs(20), || served(listen, "first")).is_some(),
            "the pushed snapshot was never served:\n{}",
            first.log()
        );
        let cached = wait_until(Duration::from_secs(5), || {
            cache
                .load()
                .ok()
                .flatten()
                .is_some_and(|c| c.snapshot.version == snapshot.version)
        });
        assert!(cached.is_some(), "never cached:\n{}", first.log());

        // 2. Killed outright, then started again with nothing listening where the controller
        // was: it serves the cached snapshot at once.
        first.child.kill().unwrap();
        first.child.wait().unwrap();
        let unreachable = (free_port(), free_port());
        let started = Instant::now();
        let second = Proxy::start(files.path(), cache_dir.path(), unreachable, &[], "2.log");
        let took = wait_until(Duration::from_secs(10), || served(listen, "first"))
            .map(|_| started.elapsed());
        let took = took.unwrap_or_else(|| {
            panic!("the cached snapshot was not served:\n{}", second.log())
        });
        println!(
            "restarted proxy served its cached snapshot {:.1} ms after starting (controller unreachable)",
            took.as_secs_f64() * 1000.0
        );
        assert!(took < Duration::from_secs(2), "{took:?}");
        // Ready and logged just after the listeners are bound, so possibly after the first
        // answer.
        let logged = wait_until(Duration::from_secs(5), || {
            second
                .readyz()
                .is_some_and(|r| r.starts_with("HTTP/1.1 200"))
                && second.log().contains("serving the cached snapshot")
        });
        assert!(logged.is_some(), "{}", second.log());
        drop(second);

        // 3. A tampered file (one bit flipped, the recorded hash left as it was) is refused:
        // the proxy binds nothing and stays unready.
        let mut bytes = std::fs::read(cache.path()).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x01;
        std::fs::write(cache.path(), &bytes).unwrap();
        let third = Proxy::start(files.path(), cache_dir.path(), unreachable, &[], "3.log");
        let refused = wait_until(Duration::from_secs(10), || {
            third.log().contains("cached snapshot ignored, not served")
        });
        assert!(refused.is_some(), "no refusal logged:\n{}", third.log());
        assert!(
            third
                .readyz()
                .is_some_and(|r| r.starts_with("HTTP/1.1 503")),
            "{:?}",
            third.readyz()
        );
        assert!(
            http_get(listen, "/", "app.example").is_err(),
            "a tampered snapshot's listener was bound"
        );
        println!(
            "tampered cache file refused: {}",
            third
                .log()
                .lines()
                .find(|l| l.contains("cached snapshot ignored"))
                .unwrap_or_default()
        );
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_held_by_another_process_is_bound_once_free_and_reported() {
    let ca = Arc::new(Ca::generate("cluster.local", time::OffsetDateTime::now_utc()).unwrap());
    let (listen, app) = (free_port(), backend("held", Duration::ZERO));
    let snapshot = compiled_snapshot(listen, app);
    let version = snapshot.version.clone();
    let (controller, hub) = controller_and_hub(&ca, snapshot).await;
    let files = mounted_files(&ca);
    let cache_dir = tempfile::tempdir().unwrap();
    // Another process's socket on the port, as a proxy still draining it would hold it.
    let holder = std::net::TcpListener::bind(("127.0.0.1", listen)).unwrap();
    let reports = move || -> Vec<(Option<String>, Vec<u32>)> {
        hub.proxies(&ScopeKey::SharedPool)
            .into_iter()
            .map(|(_, st)| (st.acked_version, st.bound_ports))
            .collect()
    };

    tokio::task::spawn_blocking(move || {
        let proxy = Proxy::start(files.path(), cache_dir.path(), controller, &[], "held.log");
        // What the controller heard is `ports` bound for the version, within `secs`.
        let reported = |secs, ports: Vec<u32>| {
            let want = vec![(Some(version.clone()), ports)];
            let heard = wait_until(Duration::from_secs(secs), || reports() == want);
            assert!(heard.is_some(), "{:?}\n{}", reports(), proxy.log());
        };
        // The snapshot is applied and acked, its port reported as not bound.
        reported(20, vec![]);
        // Freed: the proxy binds it on a later try, serves it and says so, with no new
        // snapshot from the controller.
        drop(holder);
        let served_after = wait_until(Duration::from_secs(10), || served(listen, "held"));
        assert!(served_after.is_some(), "never served:\n{}", proxy.log());
        reported(5, vec![u32::from(listen)]);
        assert!(proxy.log().contains("listener bound on a later try"));
    })
    .await
    .unwrap();
}

#[test]
fn readiness_fails_at_sigterm_while_the_shutdown_delay_still_serves() {
    let (listen, app) = (free_port(), backend("app", Duration::ZERO));
    // Started from a cache the test writes, with no controller at all.
    let cache_dir = tempfile::tempdir().unwrap();
    SnapshotCache::new(cache_dir.path(), shared_scope())
        .store(compiled_snapshot(listen, app).encoded())
        .unwrap();
    let ca = Ca::generate("cluster.local", time::OffsetDateTime::now_utc()).unwrap();
    let files = mounted_files(&ca);
    let mut proxy = Proxy::start(
        files.path(),
        cache_dir.path(),
        (free_port(), free_port()),
        &["--shutdown-delay-seconds", "60", "--drain-seconds", "5"],
        "proxy.log",
    );
    support::wait_proxy_ready(proxy.admin, &mut proxy.child);
    assert!(served(listen, "app"));

    proxy.signal("TERM");
    let signalled = Instant::now();
    let unready = wait_until(Duration::from_secs(2), || {
        proxy
            .readyz()
            .is_some_and(|r| r.starts_with("HTTP/1.1 503"))
    });
    let unready = unready.unwrap_or_else(|| panic!("still ready after SIGTERM:\n{}", proxy.log()));
    println!(
        "/readyz answered 503 {:.1} ms after SIGTERM",
        unready.as_secs_f64() * 1000.0
    );
    assert!(unready < Duration::from_secs(1), "{unready:?}");

    // During the delay: still unready, and every new connection is accepted and served.
    for _ in 0..20 {
        assert!(served(listen, "app"), "refused during the shutdown delay");
    }
    assert!(
        proxy
            .readyz()
            .is_some_and(|r| r.starts_with("HTTP/1.1 503"))
    );
    assert!(proxy.child.try_wait().unwrap().is_none());
    assert!(signalled.elapsed() < Duration::from_secs(60));

    // A second signal ends the delay: listeners close and the process exits.
    proxy.signal("TERM");
    assert!(
        proxy.exited_within(Duration::from_secs(10)),
        "{}",
        proxy.log()
    );
    assert!(http_get(listen, "/", "app.example").is_err());
}
