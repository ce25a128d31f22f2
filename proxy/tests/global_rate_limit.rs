//! Global rate limits on both engines: two proxy replicas (one asked over HTTP, the other over
//! HTTPS) share one count kept by a real gRPC rate limit service speaking Envoy's
//! `envoy.service.ratelimit.v3` (an in-process stand-in for envoyproxy/ratelimit).
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

#[path = "../../test/ratelimit_service.rs"]
mod ratelimit_service;
mod support;

use bytes::Bytes;
use coxswain_api::ratelimit as pb;
use coxswain_proxy::limits::Limits;
use ratelimit_service::RateLimitService;
use std::time::Duration;
use support::*;

const SNAPSHOT: &str = r#"
listeners:
- port: {HTTP}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes: &routes
    - source: {kind: HTTPRoute, namespace: t, name: global, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /global}}
      globalRateLimit:
        cluster: "t/ratelimit:8081"
        domain: coxswain
        descriptors:
        - entries:
          - {key: coxswain_policy, value: t/global}
          - {key: remote_address, source: CLIENT_ADDRESS}
          requests: 10
          unitSeconds: 1
        exempt: [{address: 127.0.0.9, prefixLen: 32}]
      backends: [{cluster: "t/app:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: tenant, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /tenant}}
      globalRateLimit:
        cluster: "t/ratelimit:8081"
        domain: coxswain
        descriptors:
        - entries:
          - {key: coxswain_policy, value: t/tenant}
          - {key: tenant, source: HEADER, value: x-tenant}
          requests: 1
          unitSeconds: 60
      backends: [{cluster: "t/app:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: closed, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /closed}}
      globalRateLimit: &down
        cluster: "t/down:8081"
        domain: coxswain
        timeoutMs: 500
        descriptors: [{entries: [{key: route, value: closed}], requests: 1, unitSeconds: 1}]
      backends: [{cluster: "t/app:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: open, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /open}}
      globalRateLimit:
        cluster: "t/down:8081"
        domain: coxswain
        timeoutMs: 500
        failOpen: true
        descriptors: [{entries: [{key: route, value: open}], requests: 1, unitSeconds: 1}]
      backends: [{cluster: "t/app:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: missing, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /missing}}
      globalRateLimit:
        cluster: "t/not-in-snapshot:8081"
        descriptors: [{entries: [{key: route, value: missing}]}]
      backends: [{cluster: "t/app:80", weight: 1}]
- port: {HTTPS}
  protocol: PROTOCOL_HTTPS
  certificates:
  - {sni: "", certificate: t/cert}
  virtualHosts:
  - hostname: ""
    routes: *routes
clusters:
- name: t/app:80
  endpoints: [{address: 127.0.0.1, port: {BACKEND}, ready: true}]
- name: t/ratelimit:8081
  endpoints: [{address: 127.0.0.1, port: {SERVICE}, ready: true}]
- name: t/down:8081
  endpoints: [{address: 127.0.0.1, port: {CLOSED}, ready: true}]
certificates:
- {name: t/cert, certChainPem: "{CERT}", privateKeyPem: "{KEY}"}
requires: [global-rate-limit]
"#;

/// A proxy replica and its ports.
struct Replica {
    proxy: Proxy,
    http: u16,
    https: u16,
}

async fn replica(fast_path: bool, backend: u16, service: u16, closed: u16) -> Replica {
    let (http, https) = (free_port(), free_port());
    let c = cert("gw.example");
    let snap = snapshot(
        SNAPSHOT,
        &[
            ("HTTP", http.to_string()),
            ("HTTPS", https.to_string()),
            ("BACKEND", backend.to_string()),
            ("SERVICE", service.to_string()),
            ("CLOSED", closed.to_string()),
            ("CERT", yaml_escape(&c.pem)),
            ("KEY", yaml_escape(&c.key)),
        ],
    );
    let limits = Limits {
        fast_path,
        ..Limits::default()
    };
    Replica {
        proxy: Proxy::start_with(&snap, limits).await,
        http,
        https,
    }
}

fn entries(r: &pb::RateLimitRequest) -> Vec<(String, String)> {
    r.descriptors
        .iter()
        .flat_map(|d| &d.entries)
        .map(|e| (e.key.clone(), e.value.clone()))
        .collect()
}

/// The must-show: 10 a second across two replicas, a client sending 50 a second for 5 s to
/// both in turn (one over HTTP, the other over HTTPS) gets 45-55 through, not 10 a second
/// from each replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_limit_kept_by_the_service() {
    let (backend, hits) = echo_backend_with_hits("app").await;
    let (service, service_addr) = RateLimitService::start().await;
    let closed = free_port();
    for (fast_path, engine) in engines() {
        service.reset();
        let a = replica(fast_path, backend.port(), service_addr.port(), closed).await;
        let b = replica(fast_path, backend.port(), service_addr.port(), closed).await;
        let mut to_a = Conn::connect([127, 0, 0, 2], a.http, false).await;
        let mut to_b = Conn::connect([127, 0, 0, 2], b.https, true).await;
        let hits_before = hits.load(std::sync::atomic::Ordering::Relaxed);
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let (mut accepted, mut refused) = (0, 0);
        for i in 0..250 {
            tick.tick().await;
            let c = if i % 2 == 0 { &mut to_a } else { &mut to_b };
            let answer = c.get("/global", &[]).await;
            match answer.status {
                200 => accepted += 1,
                429 => {
                    refused += 1;
                    let retry: u64 = answer
                        .header("retry-after")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or_else(|| panic!("{engine}: 429 without Retry-After"));
                    assert_eq!(retry, 1, "{engine}: the window ends within the second");
                    assert_eq!(
                        answer.header("x-ratelimit-limit"),
                        Some("10"),
                        "{engine}: the service's field reaches the client"
                    );
                }
                other => panic!("{engine}: status {other}"),
            }
        }
        eprintln!(
            "{engine}: global 10 rps over two replicas, 250 requests at 50 rps: {accepted} \
             accepted, {refused} refused"
        );
        assert!(
            (45..=55).contains(&accepted),
            "{engine}: {accepted} accepted"
        );
        assert_eq!(
            hits.load(std::sync::atomic::Ordering::Relaxed) - hits_before,
            accepted,
            "{engine}: only accepted requests reach the backend"
        );
        let asked = service.asked();
        assert_eq!(asked.len(), 250, "{engine}: every request was counted");
        for r in &asked {
            assert_eq!(r.domain, "coxswain");
            assert_eq!(
                entries(r),
                [
                    ("coxswain_policy".to_owned(), "t/global".to_owned()),
                    ("remote_address".to_owned(), "127.0.0.2".to_owned()),
                ]
            );
            let limit = r.descriptors[0].limit.unwrap();
            assert_eq!(
                (limit.requests_per_unit, limit.unit),
                (10, pb::Unit::Second as i32)
            );
        }
        let over = a
            .proxy
            .metric("coxswain_proxy_global_rate_limit_over_total")
            .await
            + b.proxy
                .metric("coxswain_proxy_global_rate_limit_over_total")
                .await;
        assert_eq!(over as usize, refused, "{engine}");
        a.proxy.stop().await;
        b.proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exempt_clients_and_requests_without_the_keyed_field_are_not_counted() {
    let (backend, _) = echo_backend_with_hits("app").await;
    let (service, service_addr) = RateLimitService::start().await;
    for (fast_path, engine) in engines() {
        service.reset();
        let r = replica(fast_path, backend.port(), service_addr.port(), free_port()).await;
        let mut exempt = Conn::connect([127, 0, 0, 9], r.http, false).await;
        for _ in 0..30 {
            assert_eq!(exempt.get("/global", &[]).await.status, 200, "{engine}");
        }
        let mut c = Conn::connect([127, 0, 0, 3], r.https, true).await;
        for _ in 0..5 {
            assert_eq!(c.get("/tenant", &[]).await.status, 200, "{engine}");
        }
        assert!(
            service.asked().is_empty(),
            "{engine}: the service was asked about requests it must not count"
        );
        // 1 a minute per tenant: the second of a tenant waits for the window's end.
        let blue = [("x-tenant", "blue")];
        assert_eq!(c.get("/tenant", &blue).await.status, 200, "{engine}");
        let second = c.get("/tenant", &blue).await;
        assert_eq!(second.status, 429, "{engine}");
        let retry: u64 = second.header("retry-after").unwrap().parse().unwrap();
        assert!((50..=60).contains(&retry), "{engine}: Retry-After {retry}");
        assert_eq!(
            c.get("/tenant", &[("x-tenant", "green")]).await.status,
            200,
            "{engine}: another tenant has its own count"
        );
        assert_eq!(
            entries(&service.asked()[0]),
            [
                ("coxswain_policy".to_owned(), "t/tenant".to_owned()),
                ("tenant".to_owned(), "blue".to_owned()),
            ]
        );
        r.proxy.stop().await;
    }
}

/// A service that cannot answer: the route's failure mode decides, and the body of a request
/// let through still reaches the backend whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_service_fails_closed_unless_the_route_fails_open() {
    let (backend, mut seen) = recording_backend().await;
    let (_service, service_addr) = RateLimitService::start().await;
    for (fast_path, engine) in engines() {
        let r = replica(fast_path, backend.port(), service_addr.port(), free_port()).await;
        for tls in [false, true] {
            let port = if tls { r.https } else { r.http };
            let what = format!("{engine}, tls {tls}");
            let mut c = Conn::connect([127, 0, 0, 4], port, tls).await;
            assert_eq!(c.get("/closed", &[]).await.status, 503, "{what}");
            assert_eq!(c.get("/missing", &[]).await.status, 503, "{what}");
            let body = Bytes::from(vec![b'x'; 100_000]);
            let answer = c.send("POST", "/open", &[], body.clone()).await;
            assert_eq!(answer.status, 200, "{what}: fail open lets it through");
            let got = seen.recv().await.unwrap();
            assert_eq!(got.path, "/open", "{what}");
            assert_eq!(got.body, body, "{what}: the body arrives whole");
            let answer = c.send("POST", "/global", &[], body.clone()).await;
            assert_eq!(answer.status, 200, "{what}");
            assert_eq!(seen.recv().await.unwrap().body, body, "{what}");
        }
        let errors = r
            .proxy
            .metric("coxswain_proxy_global_rate_limit_errors_total")
            .await;
        assert_eq!(errors, 6, "{engine}: closed, missing and open, twice");
        r.proxy.stop().await;
    }
}
