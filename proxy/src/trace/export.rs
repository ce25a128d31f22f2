//! The exporter: a thread of its own (with a one-thread runtime) that batches finished spans
//! and sends them with OTLP/gRPC's `TraceService/Export`. It shares nothing with the request
//! path but the bounded queue, so a slow or absent collector costs requests nothing: spans
//! that do not fit are dropped when recorded, and a batch that cannot be sent is dropped
//! here. Both are counted; failures are logged at most once a minute.

use super::{Counters, Finished, RequestStart, Settings, Value};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    ResourceSpans, ScopeSpans, Span, Status, span, status,
};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

/// How often a collector that keeps failing is reported in the log.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// The W3C sampled flag, and OTLP's flags saying whether the parent is remote.
const FLAG_SAMPLED: u32 = 0x01;
const FLAG_HAS_IS_REMOTE: u32 = 0x100;
const FLAG_IS_REMOTE: u32 = 0x200;

pub(super) fn spawn(
    settings: Settings,
    spans: mpsc::Receiver<Finished>,
    counters: Arc<Counters>,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("otlp-export".into())
        .spawn(move || runtime.block_on(run(settings, spans, counters)))?;
    Ok(())
}

/// Batches and exports until every sender is gone, then sends what is left.
async fn run(settings: Settings, mut spans: mpsc::Receiver<Finished>, counters: Arc<Counters>) {
    // Checked in `Tracer::start`; a lazy channel connects (and reconnects) on use.
    let endpoint = match Endpoint::from_shared(settings.endpoint.clone()) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(endpoint = %settings.endpoint, error = %e, "OTLP endpoint unusable; no spans are exported");
            return;
        }
    };
    let channel = endpoint
        .connect_timeout(settings.timeout)
        .timeout(settings.timeout)
        .connect_lazy();
    let mut exporter = Exporter {
        client: TraceServiceClient::new(channel),
        resource: resource(&settings),
        counters,
        log: FailureLog::default(),
        endpoint: settings.endpoint.clone(),
    };
    let max = settings.batch.max(1);
    let mut batch = Vec::with_capacity(max);
    loop {
        if spans.recv_many(&mut batch, max).await == 0 {
            return;
        }
        let deadline = tokio::time::Instant::now() + settings.delay;
        let mut closed = false;
        while batch.len() < max {
            let room = max - batch.len();
            match tokio::time::timeout_at(deadline, spans.recv_many(&mut batch, room)).await {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        exporter.export(&mut batch).await;
        if closed {
            return;
        }
    }
}

struct Exporter {
    client: TraceServiceClient<Channel>,
    resource: Resource,
    counters: Arc<Counters>,
    log: FailureLog,
    endpoint: String,
}

impl Exporter {
    async fn export(&mut self, batch: &mut Vec<Finished>) {
        let n = batch.len() as u64;
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "coxswain".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    spans: batch.drain(..).map(otlp_span).collect(),
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        };
        match self.client.export(request).await {
            Ok(response) => {
                let partial = response.into_inner().partial_success;
                let rejected = partial
                    .as_ref()
                    .map_or(0, |p| u64::try_from(p.rejected_spans).unwrap_or(0))
                    .min(n);
                self.counters
                    .exported
                    .fetch_add(n - rejected, Ordering::Relaxed);
                if rejected > 0 {
                    self.counters
                        .export_failed
                        .fetch_add(rejected, Ordering::Relaxed);
                    let why = partial.map(|p| p.error_message).unwrap_or_default();
                    self.log.failed(
                        &self.endpoint,
                        &format!("collector rejected {rejected} span(s): {why}"),
                    );
                } else {
                    self.log.succeeded(&self.endpoint);
                }
            }
            Err(status) => {
                self.counters.export_failed.fetch_add(n, Ordering::Relaxed);
                self.log.failed(&self.endpoint, &status.to_string());
            }
        }
    }
}

/// Logs the first failure, then at most one line a minute while failures go on, and one
/// line when exports work again.
#[derive(Default)]
struct FailureLog {
    last: Option<Instant>,
    /// Failed exports not logged yet.
    unlogged: u64,
    failing: bool,
}

impl FailureLog {
    fn failed(&mut self, endpoint: &str, error: &str) {
        self.failing = true;
        self.unlogged += 1;
        if self.last.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            tracing::warn!(
                %endpoint,
                error,
                failed_exports = self.unlogged,
                "exporting spans failed; they are dropped (counted in *_trace_spans_dropped_total)"
            );
            self.last = Some(Instant::now());
            self.unlogged = 0;
        }
    }

    fn succeeded(&mut self, endpoint: &str) {
        if self.failing {
            tracing::info!(%endpoint, "exporting spans again");
            self.failing = false;
            self.last = None;
            self.unlogged = 0;
        }
    }
}

fn resource(settings: &Settings) -> Resource {
    let mut attributes = vec![
        attribute("service.name", Value::Str(settings.service_name.clone())),
        attribute(
            "service.version",
            Value::Str(env!("CARGO_PKG_VERSION").into()),
        ),
    ];
    for (key, value) in &settings.resource {
        attributes.push(attribute(key, Value::Str(value.clone())));
    }
    Resource {
        attributes,
        ..Default::default()
    }
}

fn attribute(key: &str, value: Value) -> KeyValue {
    let value = match value {
        Value::Str(s) => any_value::Value::StringValue(s),
        Value::Int(i) => any_value::Value::IntValue(i),
        Value::Bool(b) => any_value::Value::BoolValue(b),
    };
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn otlp_span(finished: Finished) -> Span {
    match finished {
        Finished::Request {
            start,
            status,
            upstream,
            end_unix_nanos,
        } => request_span(&start, status, upstream, end_unix_nanos),
        Finished::Internal {
            recorded,
            end_unix_nanos,
        } => {
            let context = recorded.begun.context;
            Span {
                trace_id: context.trace_id.to_vec(),
                span_id: context.span_id.to_vec(),
                parent_span_id: context.parent.map(|p| p.to_vec()).unwrap_or_default(),
                flags: FLAG_SAMPLED | FLAG_HAS_IS_REMOTE,
                name: recorded.name.into(),
                kind: span::SpanKind::Internal.into(),
                start_time_unix_nano: recorded.begun.unix_nanos,
                end_time_unix_nano: end_unix_nanos,
                attributes: recorded
                    .attributes
                    .into_iter()
                    .map(|(k, v)| attribute(k, v))
                    .collect(),
                status: recorded.error.map(|message| Status {
                    message,
                    code: status::StatusCode::Error.into(),
                }),
                ..Default::default()
            }
        }
    }
}

/// A request's server span, with OpenTelemetry's HTTP attribute names where one fits and
/// `coxswain.*` for the route and the upstream (one span covers both sides of the proxy, and
/// the conventions' `server.*` and `network.peer.*` already describe the client's side).
fn request_span(
    start: &RequestStart,
    status: u16,
    upstream: Option<std::net::SocketAddr>,
    end_unix_nanos: u64,
) -> Span {
    let f = &start.fields;
    let context = start.begun.context;
    let mut attributes = vec![
        attribute("http.request.method", Value::Str(f.method.into())),
        attribute(
            "url.scheme",
            Value::Str(if f.https { "https" } else { "http" }.into()),
        ),
        attribute("url.path", Value::Str(f.path.clone())),
        attribute("server.port", Value::Int(i64::from(f.port))),
    ];
    if status > 0 {
        attributes.push(attribute(
            "http.response.status_code",
            Value::Int(i64::from(status)),
        ));
    }
    if let Some(client) = f.client {
        attributes.push(attribute("client.address", Value::Str(client.to_string())));
    }
    if let Some(source) = f.route.as_ref().and_then(|r| r.source.as_ref()) {
        attributes.push(attribute(
            "coxswain.route",
            Value::Str(format!(
                "{}/{}/{}",
                source.kind, source.namespace, source.name
            )),
        ));
        attributes.push(attribute(
            "coxswain.route.kind",
            Value::Str(source.kind.clone()),
        ));
        attributes.push(attribute(
            "coxswain.route.namespace",
            Value::Str(source.namespace.clone()),
        ));
        attributes.push(attribute(
            "coxswain.route.name",
            Value::Str(source.name.clone()),
        ));
        attributes.push(attribute(
            "coxswain.route.rule",
            Value::Int(i64::from(source.rule)),
        ));
        if !source.rule_name.is_empty() {
            attributes.push(attribute(
                "coxswain.route.rule_name",
                Value::Str(source.rule_name.clone()),
            ));
        }
    }
    if let Some(upstream) = upstream {
        attributes.push(attribute(
            "coxswain.upstream.address",
            Value::Str(upstream.to_string()),
        ));
    }
    // Server spans are errors for 5xx only (a 4xx is the client's); no answer at all is one.
    let error = match status {
        0 => Some("no response was sent".to_owned()),
        500.. => Some(format!("answered {status}")),
        _ => None,
    };
    let remote = context.parent.map_or(0, |_| FLAG_IS_REMOTE);
    Span {
        trace_id: context.trace_id.to_vec(),
        span_id: context.span_id.to_vec(),
        parent_span_id: context.parent.map(|p| p.to_vec()).unwrap_or_default(),
        flags: FLAG_SAMPLED | FLAG_HAS_IS_REMOTE | remote,
        name: f.method.into(),
        kind: span::SpanKind::Server.into(),
        start_time_unix_nano: start.begun.unix_nanos,
        end_time_unix_nano: end_unix_nanos,
        attributes,
        status: error.map(|message| Status {
            message,
            code: status::StatusCode::Error.into(),
        }),
        ..Default::default()
    }
}
