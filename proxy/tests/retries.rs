//! Retries and outlier ejection on both engines: a request whose backend connection cannot be
//! opened has sent nothing, so it goes to another endpoint, whatever its method; an endpoint
//! that keeps failing is taken out of rotation for a while. A route's retry policy (answers,
//! timeouts, broken connections) is applied by both engines alike; the fast path keeps such
//! routes unless a body streams.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_proxy::limits::Limits;
use std::sync::atomic::Ordering;
use support::*;

/// On the fast path, a test's requests all stayed there (retry routes included).
async fn assert_fast_path_kept_all(proxy: &Proxy, fast_path: bool) {
    if fast_path {
        let handed = proxy
            .metric("coxswain_proxy_http1_requests_pingora_total")
            .await;
        assert_eq!(handed, 0, "fast path: requests handed to Pingora");
    }
}

/// One route on `port` to one cluster whose endpoints are these 127.0.0.1 ports, all ready.
fn one_route_snapshot(port: u16, endpoints: &[u16]) -> coxswain_api::snapshot::Snapshot {
    let endpoints: String = endpoints
        .iter()
        .map(|p| format!("  - {{address: 127.0.0.1, port: {p}, ready: true}}\n"))
        .collect();
    snapshot(
        &format!(
            r#"
listeners:
- port: {port}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {{kind: HTTPRoute, namespace: t, name: app, rule: 0}}
      backends: [{{cluster: "t/app:80", weight: 1}}]
clusters:
- name: t/app:80
  endpoints:
{endpoints}"#
        ),
        &[],
    )
}

const SNAPSHOT: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: three, rule: 0}
      backends: [{cluster: "t/three:80", weight: 1}]
clusters:
- name: t/three:80
  endpoints:
  - {address: 127.0.0.1, port: {A}, ready: true}
  - {address: 127.0.0.1, port: {CLOSED}, ready: true}
  - {address: 127.0.0.1, port: {B}, ready: true}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_whose_port_is_closed_fails_no_request() {
    for fast_path in [true, false] {
        let engine = if fast_path { "fast path" } else { "pingora" };
        let (a, a_hits) = echo_backend_with_hits("a").await;
        let (b, b_hits) = echo_backend_with_hits("b").await;
        let port = free_port();
        let snap = snapshot(
            SNAPSHOT,
            &[
                ("PORT", port.to_string()),
                ("A", a.port().to_string()),
                ("B", b.port().to_string()),
                // Bound and released: nothing listens there, connecting is refused.
                ("CLOSED", free_port().to_string()),
            ],
        );
        let proxy = Proxy::start_with(
            &snap,
            Limits {
                fast_path,
                ..Limits::default()
            },
        )
        .await;
        let client = shared_client();
        let url = format!("http://127.0.0.1:{port}/");
        let mut failed = 0;
        for i in 0..1000 {
            // Every tenth a POST with a body: connecting failed before anything was sent, so
            // retrying it elsewhere is as safe as for a GET.
            let method = if i % 10 == 0 { "POST" } else { "GET" };
            match request(&client, method, &url, &[]).await {
                Ok(r) if r.status == 200 => {}
                _ => failed += 1,
            }
        }
        let (a_n, b_n) = (
            a_hits.load(Ordering::Relaxed),
            b_hits.load(Ordering::Relaxed),
        );
        let retries = proxy
            .metric("coxswain_proxy_upstream_connect_retries_total")
            .await;
        eprintln!("{engine}: {failed} of 1000 failed; a {a_n}, b {b_n}, {retries} connect retries");
        assert_eq!(failed, 0, "{engine}");
        assert_eq!(a_n + b_n, 1000, "{engine}");
        // Each pick of the closed endpoint was retried elsewhere until five refusals in a row
        // ejected it (see `outlier`); then the two others shared the load.
        assert!((5..50).contains(&retries), "{engine}: {retries} retries");
        assert!(a_n > 400 && b_n > 400, "{engine}: a {a_n}, b {b_n}");
        proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_endpoint_refuses_the_answer_is_502_after_each_was_tried_once() {
    const ALL_CLOSED: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: none, rule: 0}
      backends: [{cluster: "t/closed:80", weight: 1}]
clusters:
- name: t/closed:80
  endpoints:
  - {address: 127.0.0.1, port: {X}, ready: true}
  - {address: 127.0.0.1, port: {Y}, ready: true}
"#;
    for fast_path in [true, false] {
        let port = free_port();
        let snap = snapshot(
            ALL_CLOSED,
            &[
                ("PORT", port.to_string()),
                ("X", free_port().to_string()),
                ("Y", free_port().to_string()),
            ],
        );
        let proxy = Proxy::start_with(
            &snap,
            Limits {
                fast_path,
                ..Limits::default()
            },
        )
        .await;
        let r = get(&format!("http://127.0.0.1:{port}/"), &[])
            .await
            .unwrap();
        assert_eq!(r.status, 502, "fast path {fast_path}");
        // Two endpoints: one retry, never a second try of the same one.
        assert_eq!(
            proxy
                .metric("coxswain_proxy_upstream_connect_retries_total")
                .await,
            1,
            "fast path {fast_path}"
        );
        proxy.stop().await;
    }
}

/// A backend that answers every request 500, and how many it got.
async fn failing_backend() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = hits.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req| {
                    counter.fetch_add(1, Ordering::Relaxed);
                    async {
                        Ok::<_, std::convert::Infallible>(
                            hyper::Response::builder()
                                .status(500)
                                .body(http_body_util::Full::new(bytes::Bytes::from_static(
                                    b"broken",
                                )))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, hits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_answering_500s_is_ejected_then_tried_again_after_the_back_off() {
    for fast_path in [true, false] {
        let engine = if fast_path { "fast path" } else { "pingora" };
        let (a, _) = echo_backend_with_hits("a").await;
        let (b, _) = echo_backend_with_hits("b").await;
        let (bad, bad_hits) = failing_backend().await;
        let port = free_port();
        let snap = snapshot(
            SNAPSHOT,
            &[
                ("PORT", port.to_string()),
                ("A", a.port().to_string()),
                ("B", b.port().to_string()),
                ("CLOSED", bad.port().to_string()),
            ],
        );
        let proxy = Proxy::start_with(
            &snap,
            Limits {
                fast_path,
                outlier: coxswain_proxy::outlier::Settings {
                    consecutive_failures: 5,
                    base_ejection: std::time::Duration::from_secs(2),
                    max_ejected_percent: 50,
                },
                ..Limits::default()
            },
        )
        .await;
        let client = shared_client();
        let url = format!("http://127.0.0.1:{port}/");
        let ejections = || async {
            let r = get(&format!("http://{}/metrics", proxy.admin), &[])
                .await
                .unwrap();
            r.body
                .lines()
                .find(|l| {
                    l.starts_with("coxswain_proxy_upstream_ejections_total{cluster=\"t/three:80\"}")
                })
                .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // Until the bad endpoint has failed five times in a row, it gets its third.
        let mut sent = 0;
        while ejections().await == 0 {
            request(&client, "GET", &url, &[]).await.unwrap();
            sent += 1;
            assert!(sent < 100, "{engine}: not ejected after {sent} requests");
        }
        let before = bad_hits.load(Ordering::Relaxed);
        let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
        for _ in 0..1000 {
            let r = request(&client, "GET", &url, &[]).await.unwrap();
            *statuses.entry(r.status).or_default() += 1;
        }
        let during = bad_hits.load(Ordering::Relaxed) - before;
        eprintln!(
            "{engine}: ejected after {sent} requests; then the ejected endpoint got {during} of 1000 ({statuses:?})"
        );
        assert!(
            during < 50,
            "{engine}: {during} of 1000 reached the ejected endpoint"
        );
        // After the back-off it is tried again (and, still failing, ejected again).
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        let seen = bad_hits.load(Ordering::Relaxed);
        while bad_hits.load(Ordering::Relaxed) == seen {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{engine}: never tried again"
            );
            request(&client, "GET", &url, &[]).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        while ejections().await < 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{engine}: not ejected again"
            );
            request(&client, "GET", &url, &[]).await.unwrap();
        }
        // The gauge shows it out of rotation (on a loaded machine an ejection may already have
        // run out by now; requests to it eject it again).
        loop {
            let metrics = get(&format!("http://{}/metrics", proxy.admin), &[])
                .await
                .unwrap()
                .body;
            if metrics
                .contains("coxswain_proxy_upstream_ejected_endpoints{cluster=\"t/three:80\"} 1")
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{engine}: the ejected-endpoints gauge never showed it"
            );
            request(&client, "GET", &url, &[]).await.unwrap();
        }
        proxy.stop().await;
    }
}

const RETRIED: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: retried, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /retried}}
      retry: {codes: [503], attempts: 2, backoffMs: 10}
      backends: [{cluster: "t/mixed:80", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: posts, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /posts}}
      retry: {codes: [503], attempts: 2, nonIdempotent: true}
      backends: [{cluster: "t/mixed:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: plain, rule: 0}
      backends: [{cluster: "t/mixed:80", weight: 1}]
clusters:
- name: t/mixed:80
  endpoints:
  - {address: 127.0.0.1, port: {GOOD}, ready: true}
  - {address: 127.0.0.1, port: {BAD}, ready: true}
"#;

/// A backend that answers every request 503, and how many it got.
async fn unavailable_backend() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (addr, _seen, _) = raw_backend(move |_r| {
        let _ = tx.send(());
        RawAnswer::Send(
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy".to_vec(),
        )
    })
    .await;
    let counter = hits.clone();
    tokio::spawn(async move {
        while rx.recv().await.is_some() {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    });
    (addr, hits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_the_route_retries_go_to_another_endpoint_and_posts_only_when_allowed() {
    for fast_path in [true, false] {
        let engine = if fast_path { "fast path" } else { "pingora" };
        let (good, good_hits) = echo_backend_with_hits("good").await;
        let (bad, bad_hits) = unavailable_backend().await;
        let port = free_port();
        let snap = snapshot(
            RETRIED,
            &[
                ("PORT", port.to_string()),
                ("GOOD", good.port().to_string()),
                ("BAD", bad.port().to_string()),
            ],
        );
        let proxy = Proxy::start_with(
            &snap,
            Limits {
                fast_path,
                // Ejection would hide the retries this test counts.
                outlier: coxswain_proxy::outlier::Settings {
                    consecutive_failures: 0,
                    ..Default::default()
                },
                ..Limits::default()
            },
        )
        .await;
        let client = shared_client();
        let base = format!("http://127.0.0.1:{port}");
        let count = |path: &'static str, method: &'static str| {
            let client = client.clone();
            let base = base.clone();
            async move {
                let mut failed = 0;
                for _ in 0..200 {
                    let r = request(&client, method, &format!("{base}{path}"), &[])
                        .await
                        .unwrap();
                    if r.status != 200 {
                        failed += 1;
                    }
                }
                failed
            }
        };
        // Half the picks land on the 503 endpoint; each is retried on the other.
        let before = bad_hits.load(Ordering::Relaxed);
        assert_eq!(
            count("/retried", "GET").await,
            0,
            "{engine}: GET with a retry policy"
        );
        assert!(bad_hits.load(Ordering::Relaxed) - before >= 50, "{engine}");
        // POST is not idempotent: not retried unless the policy says so.
        let posts_failed = count("/retried", "POST").await;
        assert!(
            (50..=150).contains(&posts_failed),
            "{engine}: {posts_failed} of 200 POSTs failed; the 503s must reach the client"
        );
        assert_eq!(
            count("/posts", "POST").await,
            0,
            "{engine}: POST allowed by policy"
        );
        // Without a policy, a 503 is the answer.
        let plain_failed = count("/plain", "GET").await;
        assert!(
            (50..=150).contains(&plain_failed),
            "{engine}: {plain_failed}"
        );
        let retries = proxy.metric("coxswain_proxy_upstream_retries_total").await;
        assert!(retries >= 100, "{engine}: {retries}");
        assert_fast_path_kept_all(&proxy, fast_path).await;
        eprintln!(
            "{engine}: good {} bad {} retries {retries}; POST without policy: {posts_failed} of 200 failed",
            good_hits.load(Ordering::Relaxed),
            bad_hits.load(Ordering::Relaxed)
        );
        proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_is_retried_only_while_it_fits_the_retry_buffer() {
    // Pingora keeps the first 64 KiB of a request body for a retry
    // (`policy::RETRY_BODY_LIMIT`); a larger body was streamed on and cannot be sent again,
    // so the backend's answer stands even where the policy would retry it.
    for fast_path in [true, false] {
        let engine = if fast_path { "fast path" } else { "pingora" };
        let (good, _) = echo_backend_with_hits("good").await;
        let (bad, _) = unavailable_backend().await;
        let port = free_port();
        let snap = snapshot(
            RETRIED,
            &[
                ("PORT", port.to_string()),
                ("GOOD", good.port().to_string()),
                ("BAD", bad.port().to_string()),
            ],
        );
        let proxy = Proxy::start_with(
            &snap,
            Limits {
                fast_path,
                outlier: coxswain_proxy::outlier::Settings {
                    consecutive_failures: 0,
                    ..Default::default()
                },
                ..Limits::default()
            },
        )
        .await;
        let client = shared_client();
        let url = format!("http://127.0.0.1:{port}/posts");
        let mut failed = [0usize; 2];
        for (i, size) in [
            1024usize,
            coxswain_proxy::policy::RETRY_BODY_LIMIT + 36 * 1024,
        ]
        .into_iter()
        .enumerate()
        {
            for _ in 0..40 {
                match request_with_body(&client, "POST", &url, vec![b'x'; size]).await {
                    Ok(r) if r.status == 200 => {}
                    _ => failed[i] += 1,
                }
            }
        }
        eprintln!("{engine}: failed small {} large {}", failed[0], failed[1]);
        assert_eq!(failed[0], 0, "{engine}: 1 KiB bodies are retried");
        // Round robin over the two endpoints: about half land on the 503 one first.
        assert!(
            (10..=30).contains(&failed[1]),
            "{engine}: {} of 40 large bodies failed",
            failed[1]
        );
        proxy.stop().await;
    }
}

/// A backend that answers 503 after `delay`.
async fn slow_unavailable_backend(delay: std::time::Duration) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req| async move {
                    tokio::time::sleep(delay).await;
                    hyper::Response::builder()
                        .status(503)
                        .body(http_body_util::Full::new(bytes::Bytes::from_static(
                            b"busy",
                        )))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_retry_starts_after_the_retry_timeout() {
    // ingress-nginx's proxy-next-upstream-timeout: an answer that came back after the bound
    // is the client's answer, not a reason to try again.
    const TIMED: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: Ingress, namespace: t, name: bounded, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /bounded}}
      retry: {codes: [503], attempts: 2, timeoutMs: 100}
      backends: [{cluster: "t/mixed:80", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: unbounded, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /unbounded}}
      retry: {codes: [503], attempts: 2}
      backends: [{cluster: "t/mixed:80", weight: 1}]
clusters:
- name: t/mixed:80
  endpoints:
  - {address: 127.0.0.1, port: {GOOD}, ready: true}
  - {address: 127.0.0.1, port: {SLOW}, ready: true}
"#;
    for fast_path in [true, false] {
        let engine = if fast_path { "fast path" } else { "pingora" };
        let good = echo_backend("good").await;
        let slow = slow_unavailable_backend(std::time::Duration::from_millis(300)).await;
        let port = free_port();
        let snap = snapshot(
            TIMED,
            &[
                ("PORT", port.to_string()),
                ("GOOD", good.port().to_string()),
                ("SLOW", slow.port().to_string()),
            ],
        );
        let proxy = Proxy::start_with(
            &snap,
            Limits {
                fast_path,
                outlier: coxswain_proxy::outlier::Settings {
                    consecutive_failures: 0,
                    ..Default::default()
                },
                ..Limits::default()
            },
        )
        .await;
        let client = shared_client();
        let mut failed = std::collections::HashMap::new();
        for path in ["/bounded", "/unbounded"] {
            let url = format!("http://127.0.0.1:{port}{path}");
            for _ in 0..10 {
                let r = request(&client, "GET", &url, &[]).await.unwrap();
                if r.status != 200 {
                    assert_eq!(r.status, 503, "{engine} {path}");
                    *failed.entry(path).or_insert(0) += 1;
                }
            }
        }
        eprintln!("{engine}: {failed:?}");
        // Round robin: half the requests reach the slow endpoint first.
        assert_eq!(failed.get("/bounded"), Some(&5), "{engine}");
        assert_eq!(failed.get("/unbounded"), None, "{engine}");
        assert_fast_path_kept_all(&proxy, fast_path).await;
        proxy.stop().await;
    }
}

/// A backend that, while `failures` is above zero, takes one off and answers 500 only after
/// `delay`; otherwise it answers 200 at once. Returns its address and how many requests it got.
async fn backend_slow_while_failing(
    failures: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    delay: std::time::Duration,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = hits.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (failures, counter) = (failures.clone(), counter.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let failing = failures
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                    async move {
                        if failing {
                            tokio::time::sleep(delay).await;
                        }
                        hyper::Response::builder()
                            .status(if failing { 500 } else { 200 })
                            .body(http_body_util::Full::new(bytes::Bytes::from_static(
                                b"done",
                            )))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            });
        }
    });
    (addr, hits)
}

/// Ejection off: these tests count every attempt on a single endpoint.
fn no_ejection(fast_path: bool) -> Limits {
    Limits {
        fast_path,
        outlier: coxswain_proxy::outlier::Settings {
            consecutive_failures: 0,
            ..Default::default()
        },
        ..Limits::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_request_timeout_is_retried_within_the_attempts() {
    // GEP-1731 (HTTPRouteRetryBackendTimeout): an attempt that outlasts
    // timeouts.backendRequest is cancelled and tried again, counted against the same
    // attempts as retried answers; when they are used up the client gets the timeout's 504.
    const RETRIED_TIMEOUT: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: retried, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /retried}}
      timeouts: {backendRequestMs: 200}
      retry: {codes: [503], attempts: 3}
      backends: [{cluster: "t/slow:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: once, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /once}}
      timeouts: {backendRequestMs: 200}
      backends: [{cluster: "t/slow:80", weight: 1}]
clusters:
- name: t/slow:80
  endpoints:
  - {address: 127.0.0.1, port: {SLOW}, ready: true}
"#;
    for fast_path in [true, false] {
        let engine = if fast_path { "fast path" } else { "pingora" };
        let failures = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (slow, hits) =
            backend_slow_while_failing(failures.clone(), std::time::Duration::from_millis(600))
                .await;
        let port = free_port();
        let snap = snapshot(
            RETRIED_TIMEOUT,
            &[
                ("PORT", port.to_string()),
                ("SLOW", slow.port().to_string()),
            ],
        );
        let proxy = Proxy::start_with(&snap, no_ejection(fast_path)).await;
        let client = shared_client();
        let base = format!("http://127.0.0.1:{port}");
        // (path, method, attempts that time out, answer, requests the backend gets)
        let cases = [
            ("/retried", "GET", 2, 200, 3),
            ("/retried", "GET", 4, 504, 4),
            // POST is not resent by a policy that does not say so.
            ("/retried", "POST", 1, 504, 1),
            ("/once", "GET", 1, 504, 1),
        ];
        for (path, method, slow_attempts, want, want_hits) in cases {
            failures.store(slow_attempts, Ordering::SeqCst);
            let before = hits.load(Ordering::SeqCst);
            let r = request(&client, method, &format!("{base}{path}"), &[])
                .await
                .unwrap();
            let got = hits.load(Ordering::SeqCst) - before;
            assert_eq!(
                (r.status, got),
                (want, want_hits),
                "{engine}: {method} {path} with {slow_attempts} slow attempts: status and backend requests"
            );
        }
        let retries = proxy.metric("coxswain_proxy_upstream_retries_total").await;
        assert_eq!(retries, 5, "{engine}: retries counted");
        assert_fast_path_kept_all(&proxy, fast_path).await;
        proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_breaks_before_the_answer_is_retried_within_the_attempts() {
    // GEP-1731 (HTTPRouteRetryConnectionError): a retry stanza without codes still retries
    // a backend that closes the connection instead of answering, at most `attempts` times.
    // An answer already under way is never retried: its head went to the client.
    const RETRIED_RESET: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: retried, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /retried}}
      retry: {attempts: 3}
      backends: [{cluster: "t/flaky:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: once, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /once}}
      backends: [{cluster: "t/flaky:80", weight: 1}]
clusters:
- name: t/flaky:80
  endpoints:
  - {address: 127.0.0.1, port: {FLAKY}, ready: true}
"#;
    for fast_path in [true, false] {
        let engine = if fast_path { "fast path" } else { "pingora" };
        let resets = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let truncate = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flaky, mut seen, _) = {
            let (resets, truncate) = (resets.clone(), truncate.clone());
            raw_backend(move |_r| {
                if truncate.load(Ordering::SeqCst) {
                    return RawAnswer::SendClose(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial".to_vec(),
                    );
                }
                match resets.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                {
                    Ok(_) => RawAnswer::Close,
                    Err(_) => {
                        RawAnswer::Send(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec())
                    }
                }
            })
            .await
        };
        let port = free_port();
        let snap = snapshot(
            RETRIED_RESET,
            &[
                ("PORT", port.to_string()),
                ("FLAKY", flaky.port().to_string()),
            ],
        );
        let proxy = Proxy::start_with(&snap, no_ejection(fast_path)).await;
        let client = shared_client();
        let base = format!("http://127.0.0.1:{port}");
        let mut drain = || {
            let mut n = 0;
            while seen.try_recv().is_ok() {
                n += 1;
            }
            n
        };
        // (path, method, connections closed unanswered, answer, requests the backend gets)
        let cases = [
            ("/retried", "GET", 2, 200, 3),
            ("/retried", "GET", 4, 502, 4),
            ("/retried", "POST", 1, 502, 1),
            ("/once", "GET", 1, 502, 1),
        ];
        for (path, method, closed, want, want_seen) in cases {
            resets.store(closed, Ordering::SeqCst);
            drain();
            let r = request(&client, method, &format!("{base}{path}"), &[])
                .await
                .unwrap();
            assert_eq!(
                (r.status, drain()),
                (want, want_seen),
                "{engine}: {method} {path} with {closed} connections closed unanswered: status and backend requests"
            );
        }
        // A response cut short after its head: the client sees it fail, and it is not resent.
        truncate.store(true, Ordering::SeqCst);
        drain();
        let r = request(&client, "GET", &format!("{base}/retried"), &[]).await;
        assert!(
            r.is_err(),
            "{engine}: a truncated answer must fail, got {:?}",
            r.as_ref().ok().map(|r| (r.status, r.body.clone()))
        );
        assert_eq!(drain(), 1, "{engine}: a truncated answer is not retried");
        assert_fast_path_kept_all(&proxy, fast_path).await;
        proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_drops_requests_unanswered_is_ejected() {
    // A backend that accepts and then closes without answering fails like one that refuses:
    // both engines count it toward ejection, so it stops getting a third of the requests.
    for fast_path in [true, false] {
        let engine = if fast_path { "fast path" } else { "pingora" };
        let (a, _) = echo_backend_with_hits("a").await;
        let (b, _) = echo_backend_with_hits("b").await;
        let (dropper, mut seen, _) = raw_backend(|_r| RawAnswer::Close).await;
        let port = free_port();
        let snap = snapshot(
            SNAPSHOT,
            &[
                ("PORT", port.to_string()),
                ("A", a.port().to_string()),
                ("B", b.port().to_string()),
                ("CLOSED", dropper.port().to_string()),
            ],
        );
        let proxy = Proxy::start_with(
            &snap,
            Limits {
                fast_path,
                outlier: coxswain_proxy::outlier::Settings {
                    consecutive_failures: 5,
                    base_ejection: std::time::Duration::from_secs(60),
                    max_ejected_percent: 50,
                },
                ..Limits::default()
            },
        )
        .await;
        let client = shared_client();
        let url = format!("http://127.0.0.1:{port}/");
        let ejected = || async {
            get(&format!("http://{}/metrics", proxy.admin), &[])
                .await
                .unwrap()
                .body
                .contains("coxswain_proxy_upstream_ejected_endpoints{cluster=\"t/three:80\"} 1")
        };
        let mut sent = 0;
        while !ejected().await {
            request(&client, "GET", &url, &[]).await.unwrap();
            sent += 1;
            assert!(sent < 100, "{engine}: not ejected after {sent} requests");
        }
        while seen.try_recv().is_ok() {}
        let mut failed = 0;
        for _ in 0..300 {
            if request(&client, "GET", &url, &[]).await.unwrap().status != 200 {
                failed += 1;
            }
        }
        let mut reached = 0;
        while seen.try_recv().is_ok() {
            reached += 1;
        }
        eprintln!("{engine}: ejected after {sent} requests; then {reached} of 300 reached it");
        assert_eq!(
            (reached, failed),
            (0, 0),
            "{engine}: the ejected endpoint got requests"
        );
        proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_move_on_until_an_endpoint_answers() {
    // After a scale-down from 10 to 2, eight endpoints refuse until the next snapshot drops
    // them. Refusals cost nothing, so a request keeps moving past them (three slow failures
    // would end it, not three refusals).
    let mut endpoints = String::new();
    for fast_path in [true, false] {
        let engine = if fast_path { "fast path" } else { "pingora" };
        let (a, _) = echo_backend_with_hits("a").await;
        let (b, _) = echo_backend_with_hits("b").await;
        endpoints.clear();
        for _ in 0..8 {
            // Bound and released: nothing listens there, connecting is refused.
            endpoints.push_str(&format!(
                "  - {{address: 127.0.0.1, port: {}, ready: true}}\n",
                free_port()
            ));
        }
        for live in [a, b] {
            endpoints.push_str(&format!(
                "  - {{address: 127.0.0.1, port: {}, ready: true}}\n",
                live.port()
            ));
        }
        let port = free_port();
        let snap = snapshot(
            &format!(
                r#"
listeners:
- port: {{PORT}}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {{kind: HTTPRoute, namespace: t, name: scaled, rule: 0}}
      backends: [{{cluster: "t/scaled:80", weight: 1}}]
clusters:
- name: t/scaled:80
  endpoints:
{endpoints}"#
            ),
            &[("PORT", port.to_string())],
        );
        let proxy = Proxy::start_with(&snap, no_ejection(fast_path)).await;
        let client = shared_client();
        let url = format!("http://127.0.0.1:{port}/");
        let mut failed = 0;
        for _ in 0..300 {
            match request(&client, "GET", &url, &[]).await {
                Ok(r) if r.status == 200 => {}
                _ => failed += 1,
            }
        }
        assert_eq!(
            failed, 0,
            "{engine}: requests failed behind 8 refusing endpoints"
        );
        proxy.stop().await;
    }
}

/// An address whose connections are never accepted: a listener with a full accept queue,
/// where the kernel drops further SYNs and connecting hangs, as to a vanished Pod's address.
async fn blackhole() -> (std::net::SocketAddr, Vec<tokio::net::TcpStream>) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    // Fill the queue: connections complete until it is full, then one hangs.
    let mut held = Vec::new();
    loop {
        match tokio::time::timeout(
            std::time::Duration::from_millis(200),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            Ok(Ok(s)) => held.push(s),
            Ok(Err(e)) => panic!("connecting to the blackhole: {e}"),
            Err(_) => break,
        }
        assert!(held.len() < 64, "the accept queue never filled");
    }
    std::mem::forget(listener);
    (addr, held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_never_accepted_times_out_and_the_request_moves_on() {
    let (hole, _held) = blackhole().await;
    for fast_path in [true, false] {
        let engine = if fast_path { "fast path" } else { "pingora" };
        let (good, good_hits) = echo_backend_with_hits("good").await;
        let port = free_port();
        let snap = one_route_snapshot(port, &[hole.port(), good.port()]);
        let limit = std::time::Duration::from_millis(300);
        let proxy = Proxy::start_with(
            &snap,
            Limits {
                upstream_connect: limit,
                ..no_ejection(fast_path)
            },
        )
        .await;
        let client = shared_client();
        let url = format!("http://127.0.0.1:{port}/");
        let mut slowest = std::time::Duration::ZERO;
        for _ in 0..6 {
            let started = std::time::Instant::now();
            let r = request(&client, "GET", &url, &[]).await.unwrap();
            slowest = slowest.max(started.elapsed());
            assert_eq!(r.status, 200, "{engine}");
        }
        // Round robin: half the picks hit the blackhole first and waited out the limit; the
        // kernel alone would have kept them for minutes.
        assert_eq!(good_hits.load(Ordering::Relaxed), 6, "{engine}");
        assert!(
            slowest >= limit && slowest < limit * 10,
            "{engine}: the slowest request took {slowest:?} with a {limit:?} connect limit"
        );
        proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_failed_connect_picks_from_the_newest_endpoints() {
    // Three endpoints that never accept, as Pods gone during a scale-down, then a snapshot
    // that has only the Pod still running.
    let holes = [blackhole().await, blackhole().await, blackhole().await];
    for fast_path in [true, false] {
        let engine = if fast_path { "fast path" } else { "pingora" };
        let (good, good_hits) = echo_backend_with_hits("good").await;
        let port = free_port();
        let hole_ports: Vec<u16> = holes.iter().map(|(hole, _)| hole.port()).collect();
        let before = one_route_snapshot(port, &hole_ports);
        let after = one_route_snapshot(port, &[good.port()]);
        let limit = std::time::Duration::from_millis(1500);
        let proxy = Proxy::start_with(
            &before,
            Limits {
                upstream_connect: limit,
                ..no_ejection(fast_path)
            },
        )
        .await;
        let url = format!("http://127.0.0.1:{port}/");
        let started = std::time::Instant::now();
        let sent = tokio::spawn(async move {
            let client = shared_client();
            request(&client, "GET", &url, &[]).await
        });
        // The request is on its first connect (it waits `limit` there) when the snapshot
        // without the vanished endpoints arrives.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        proxy.update(&after);
        proxy.wait_ready(&after.version).await;
        let answer = sent.await.unwrap().unwrap();
        let took = started.elapsed();
        assert!(
            took >= limit,
            "{engine}: answered after {took:?}, before the first connect could time out: the \
             request did not start on the old endpoints, so this run tested nothing"
        );
        // Its own copy of the cluster would have sent it to the two other holes: 502 after
        // three slow connects.
        assert_eq!(answer.status, 200, "{engine}: after {took:?}");
        assert_eq!(good_hits.load(Ordering::Relaxed), 1, "{engine}");
        assert!(took < limit * 2, "{engine}: took {took:?}");
        proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_request_whose_new_connection_broke_goes_again_to_other_endpoints() {
    // Pods shutting down accept and reset in the moment before their EndpointSlice says so,
    // and a scale-down stops several at once. Without a retry policy, GET goes again,
    // elsewhere, up to twice; POST may have been acted on.
    for fast_path in [true, false] {
        let engine = if fast_path { "fast path" } else { "pingora" };
        let (good, good_hits) = echo_backend_with_hits("good").await;
        // A request that met both droppers is counted twice.
        let (dropper, mut dropped, _) = raw_backend(|_r| RawAnswer::Close).await;
        let (dropper2, mut dropped2, _) = raw_backend(|_r| RawAnswer::Close).await;
        let port = free_port();
        let snap = one_route_snapshot(port, &[dropper.port(), dropper2.port(), good.port()]);
        let proxy = Proxy::start_with(&snap, no_ejection(fast_path)).await;
        let client = shared_client();
        let url = format!("http://127.0.0.1:{port}/");
        let mut drain = || {
            let mut n = 0;
            while dropped.try_recv().is_ok() {
                n += 1;
            }
            while dropped2.try_recv().is_ok() {
                n += 1;
            }
            n
        };
        for i in 0..20 {
            let r = request(&client, "GET", &url, &[]).await.unwrap();
            assert_eq!(r.status, 200, "{engine}: GET {i}");
        }
        let resent = drain();
        assert!(
            resent > 0,
            "{engine}: round robin never picked the dropping endpoint"
        );
        assert_eq!(good_hits.load(Ordering::Relaxed), 20, "{engine}");
        assert_eq!(
            proxy
                .metric("coxswain_proxy_upstream_broken_resends_total")
                .await,
            resent as u64,
            "{engine}"
        );
        // POST is not idempotent: the one that reached the dropper fails, and only it saw it.
        let mut failed = 0;
        for _ in 0..4 {
            let r = request(&client, "POST", &url, &[]).await.unwrap();
            if r.status == 502 {
                failed += 1;
            } else {
                assert_eq!(r.status, 200, "{engine}");
            }
        }
        assert!(
            failed > 0,
            "{engine}: no POST reached the dropping endpoint"
        );
        assert_eq!(drain(), failed, "{engine}: a POST was sent twice");
        proxy.stop().await;
    }
}

#[tokio::test]
async fn a_request_whose_connections_keep_breaking_is_sent_three_times_at_most() {
    // Four endpoints that reset every connection: a GET tries three of them (two resends),
    // then answers 502.
    for fast_path in [true, false] {
        let engine = if fast_path { "fast path" } else { "pingora" };
        let mut droppers = Vec::new();
        let mut seen = Vec::new();
        for _ in 0..4 {
            let (addr, rx, _) = raw_backend(|_r| RawAnswer::Close).await;
            droppers.push(addr);
            seen.push(rx);
        }
        let port = free_port();
        let ports: Vec<u16> = droppers.iter().map(|d| d.port()).collect();
        let snap = one_route_snapshot(port, &ports);
        let proxy = Proxy::start_with(&snap, no_ejection(fast_path)).await;
        let client = shared_client();
        let url = format!("http://127.0.0.1:{port}/");
        for i in 0..4 {
            let r = request(&client, "GET", &url, &[]).await.unwrap();
            assert_eq!(r.status, 502, "{engine}: GET {i}");
            let mut sent = 0;
            for rx in &mut seen {
                while rx.try_recv().is_ok() {
                    sent += 1;
                }
            }
            assert_eq!(sent, 3, "{engine}: GET {i} went to {sent} endpoints");
        }
        assert_eq!(
            proxy
                .metric("coxswain_proxy_upstream_broken_resends_total")
                .await,
            8,
            "{engine}"
        );
        proxy.stop().await;
    }
}
