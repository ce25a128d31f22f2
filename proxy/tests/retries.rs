//! Retries on both engines: a request whose backend connection cannot be opened has sent
//! nothing, so it goes to another endpoint, whatever its method.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_proxy::limits::Limits;
use std::sync::atomic::Ordering;
use support::*;

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
        // The closed endpoint kept its share of picks and each was retried elsewhere.
        assert!(
            (250..=420).contains(&retries),
            "{engine}: {retries} retries"
        );
        assert!(a_n > 300 && b_n > 300, "{engine}: a {a_n}, b {b_n}");
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
