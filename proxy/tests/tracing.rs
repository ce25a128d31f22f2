//! OpenTelemetry tracing on both engines, against an OTLP/gRPC collector running in this
//! process (a tonic server of `TraceService/Export`): a request through the proxy produces a
//! span naming its route, status and upstream; the backend receives a `traceparent` of the
//! same trace whose parent is that span; an incoming `traceparent` is continued; and with the
//! collector down, requests still succeed while the dropped-span counter rises.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_proxy::limits::Limits;
use coxswain_proxy::trace::{Settings, Tracer};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::*;

const SNAPSHOT: &str = r#"
listeners:
- port: {HTTP}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: shop, name: checkout, rule: 0}
      backends: [{cluster: "shop/api:80", weight: 1}]
clusters:
- name: shop/api:80
  endpoints: [{address: 127.0.0.1, port: {BACKEND}, ready: true}]
"#;

/// The caller's context in the requests that continue a trace.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// Every span exported to it, with the `service.name` of its resource.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| text(a.value.as_ref()?.value.as_ref()?))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                spans.extend(scope.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    /// Serves OTLP/gRPC on a loopback port of its own.
    async fn start() -> (Self, SocketAddr) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let collector = Self::default();
        let service = TraceServiceServer::new(collector.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        (collector, addr)
    }

    /// The first span of `trace_id` (hex), waiting for it at most 10 s.
    async fn span_of(&self, trace_id: &str) -> (String, Span) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let found = self
                .spans
                .lock()
                .unwrap()
                .iter()
                .find(|(_, s)| hex(&s.trace_id) == trace_id)
                .cloned();
            if let Some(found) = found {
                return found;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no span of trace {trace_id} exported"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn has_trace(&self, trace_id: &str) -> bool {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .any(|(_, s)| hex(&s.trace_id) == trace_id)
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A span attribute as text (strings as they are, integers in decimal).
fn attribute(span: &Span, key: &str) -> Option<String> {
    let value = span
        .attributes
        .iter()
        .find(|a| a.key == key)?
        .value
        .as_ref()?;
    match value.value.as_ref()? {
        Value::IntValue(i) => Some(i.to_string()),
        other => text(other),
    }
}

/// A tracer exporting to `endpoint` quickly (batches go out 50 ms after their first span).
fn tracer(endpoint: SocketAddr, ratio: f64) -> Arc<Tracer> {
    let mut settings = Settings::new(&format!("http://{endpoint}"), ratio, "edge-proxy");
    settings.delay = Duration::from_millis(50);
    settings.timeout = Duration::from_secs(2);
    Tracer::start(settings).unwrap()
}

struct Setup {
    proxy: Proxy,
    port: u16,
    backend: SocketAddr,
    seen: tokio::sync::mpsc::UnboundedReceiver<Recorded>,
}

async fn start(fast_path: bool, tracer: Option<Arc<Tracer>>) -> Setup {
    let (backend, seen) = recording_backend().await;
    let port = free_port();
    let snap = snapshot(
        SNAPSHOT,
        &[
            ("HTTP", port.to_string()),
            ("BACKEND", backend.port().to_string()),
        ],
    );
    let limits = Limits {
        fast_path,
        tracer,
        ..Limits::default()
    };
    Setup {
        proxy: Proxy::start_with(&snap, limits).await,
        port,
        backend,
        seen,
    }
}

impl Setup {
    /// One request; returns the headers the backend received.
    async fn send(&mut self, headers: &[(&str, &str)]) -> hyper::HeaderMap {
        let url = format!("http://127.0.0.1:{}/cart?id=7", self.port);
        let mut all = vec![("host", "shop.example")];
        all.extend_from_slice(headers);
        let reply = get(&url, &all).await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.body);
        tokio::time::timeout(Duration::from_secs(5), self.seen.recv())
            .await
            .unwrap()
            .unwrap()
            .headers
    }
}

/// (trace id, parent id, flags) of a `traceparent` the backend received.
fn traceparent(headers: &hyper::HeaderMap) -> (String, String, String) {
    let all: Vec<_> = headers.get_all("traceparent").iter().collect();
    assert_eq!(all.len(), 1, "one traceparent: {headers:?}");
    let value = all[0].to_str().unwrap();
    let parts: Vec<&str> = value.split('-').collect();
    assert_eq!(parts.len(), 4, "{value}");
    assert_eq!(parts[0], "00", "{value}");
    (parts[1].into(), parts[2].into(), parts[3].into())
}

async fn spans_follow_requests(fast_path: bool) {
    let (collector, endpoint) = Collector::start().await;
    let mut s = start(fast_path, Some(tracer(endpoint, 1.0))).await;

    // No context from the client: a new trace, whose root is the proxy's span.
    let headers = s.send(&[]).await;
    let (trace_id, parent, flags) = traceparent(&headers);
    assert_eq!(flags, "01");
    let (service, span) = collector.span_of(&trace_id).await;
    assert_eq!(service, "edge-proxy");
    assert_eq!(
        hex(&span.span_id),
        parent,
        "the backend's parent is the proxy's span"
    );
    assert!(span.parent_span_id.is_empty(), "a root span");
    assert_eq!(span.kind, SpanKind::Server as i32);
    assert_eq!(span.name, "GET");
    assert!(span.end_time_unix_nano >= span.start_time_unix_nano);
    let expect = [
        ("coxswain.route", "HTTPRoute/shop/checkout".to_owned()),
        ("coxswain.route.namespace", "shop".into()),
        ("coxswain.route.name", "checkout".into()),
        ("http.request.method", "GET".into()),
        ("http.response.status_code", "200".into()),
        ("coxswain.upstream.address", s.backend.to_string()),
        ("server.port", s.port.to_string()),
        ("url.path", "/cart".into()),
        ("client.address", "127.0.0.1".into()),
    ];
    for (key, value) in expect {
        assert_eq!(
            attribute(&span, key).as_deref(),
            Some(value.as_str()),
            "{key} of {span:?}"
        );
    }

    // An unsampled caller: the trace goes on downstream, unsampled, and nothing is exported.
    let quiet = "5bf92f3577b34da6a3ce929d0e0e4736";
    let headers = s
        .send(&[("traceparent", &format!("00-{quiet}-{CALLER_SPAN}-00"))])
        .await;
    let (trace_id, parent, flags) = traceparent(&headers);
    assert_eq!((trace_id.as_str(), flags.as_str()), (quiet, "00"));
    assert_ne!(parent, CALLER_SPAN, "the proxy's own span is the parent");

    // A sampled caller: continued, the incoming traceparent replaced, tracestate passed on.
    let headers = s
        .send(&[
            ("traceparent", &format!("00-{TRACE}-{CALLER_SPAN}-01")),
            ("tracestate", "vendor=opaque"),
        ])
        .await;
    let (trace_id, parent, flags) = traceparent(&headers);
    assert_eq!((trace_id.as_str(), flags.as_str()), (TRACE, "01"));
    assert_eq!(headers.get("tracestate").unwrap(), "vendor=opaque");
    let (_, span) = collector.span_of(TRACE).await;
    assert_eq!(hex(&span.parent_span_id), CALLER_SPAN);
    assert_eq!(hex(&span.span_id), parent);
    // Spans leave in the order requests end: the unsampled one would be there by now.
    assert!(
        !collector.has_trace(quiet),
        "an unsampled request was exported"
    );
    s.proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_path_requests_are_traced() {
    spans_follow_requests(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pingora_requests_are_traced() {
    spans_follow_requests(false).await;
}

/// `coxswain_proxy_trace_spans_dropped_total{reason}` from the proxy's /metrics.
async fn dropped(proxy: &Proxy, reason: &str) -> u64 {
    let text = get(&format!("http://{}/metrics", proxy.admin), &[])
        .await
        .unwrap()
        .body;
    let series = format!("coxswain_proxy_trace_spans_dropped_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

async fn collector_down(fast_path: bool) {
    // A port nobody listens on.
    let endpoint = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut s = start(fast_path, Some(tracer(endpoint, 1.0))).await;
    assert_eq!(dropped(&s.proxy, "export_failed").await, 0);
    for _ in 0..20 {
        let headers = s.send(&[]).await;
        assert_eq!(traceparent(&headers).2, "01");
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while dropped(&s.proxy, "export_failed").await < 20 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the failed exports were not counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        s.proxy
            .metric("coxswain_proxy_trace_spans_exported_total")
            .await,
        0
    );
    s.proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_path_requests_succeed_with_the_collector_down() {
    collector_down(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pingora_requests_succeed_with_the_collector_down() {
    collector_down(false).await;
}

/// Tracing off: the proxy adds no traceparent and passes the client's as it came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_tracer_traceparent_passes_untouched() {
    for fast_path in [true, false] {
        let mut s = start(fast_path, None).await;
        let headers = s.send(&[]).await;
        assert!(headers.get("traceparent").is_none(), "{headers:?}");
        let theirs = format!("00-{TRACE}-{CALLER_SPAN}-01");
        let headers = s.send(&[("traceparent", &theirs)]).await;
        assert_eq!(headers.get("traceparent").unwrap(), theirs.as_str());
        let text = get(&format!("http://{}/metrics", s.proxy.admin), &[])
            .await
            .unwrap()
            .body;
        assert!(
            text.contains("coxswain_proxy_trace_spans_exported_total 0"),
            "{text}"
        );
        s.proxy.stop().await;
    }
}
