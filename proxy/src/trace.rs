//! OpenTelemetry traces: W3C trace context (`traceparent`) carried to backends, and spans
//! exported to a collector over OTLP/gRPC.
//!
//! Tracing is off unless an exporter endpoint is configured; then there is no [`Tracer`], each
//! engine takes one branch per request, and a request's `traceparent` reaches the backend as
//! it came.
//!
//! With a tracer, [`Tracer::begin`] gives every request a trace context when its head
//! arrives: a child of a valid incoming `traceparent` (the same trace, the caller's span as
//! parent, the caller's sampling decision), otherwise the root of a new trace, sampled at the
//! configured ratio. The backend receives a `traceparent` naming this proxy's span (sampled
//! or not, so the trace stays whole downstream); `tracestate` passes as it came. A sampled
//! request's span is finished once its status is known and handed to a bounded queue without
//! waiting; a thread of its own batches that queue and exports it (`export`). A full queue
//! drops the span, and a failed export drops its batch, each counted: tracing never slows or
//! fails a request.
//!
//! This module knows nothing of requests or engines (`request_trace` fills a request's span
//! for both), so the controller uses it too, for its own passes ([`Span`]).

use coxswain_api::snapshot as snap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::mpsc;

mod export;
mod ids;

/// The W3C trace context header.
pub const TRACEPARENT: &str = "traceparent";

/// Where spans go, and how many.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The collector's OTLP/gRPC endpoint, `http://host:port`.
    pub endpoint: String,
    /// Share of new traces recorded, 0 to 1. A request that continues a trace follows its
    /// caller's decision instead (the sampled flag of its `traceparent`).
    pub sampling_ratio: f64,
    /// `service.name` of every span.
    pub service_name: String,
    /// Resource attributes besides `service.name` and `service.version`: what names this
    /// process (`service.instance.id`, the Gateway a dedicated proxy serves).
    pub resource: Vec<(&'static str, String)>,
    /// Finished spans waiting for export; a span finished while it is full is dropped.
    pub queue: usize,
    /// Spans sent in one export call at most.
    pub batch: usize,
    /// A batch that is not full is sent this long after its first span.
    pub delay: Duration,
    /// One export call (connecting included) may take this long.
    pub timeout: Duration,
}

impl Settings {
    /// The OpenTelemetry SDK's batching defaults (2048 queued, 512 per call, 5 s).
    pub fn new(endpoint: &str, sampling_ratio: f64, service_name: &str) -> Self {
        Self {
            endpoint: endpoint.to_owned(),
            sampling_ratio,
            service_name: service_name.to_owned(),
            resource: Vec::new(),
            queue: 2048,
            batch: 512,
            delay: Duration::from_secs(5),
            timeout: Duration::from_secs(10),
        }
    }

    pub fn check(&self) -> Result<(), SettingsError> {
        check_endpoint(&self.endpoint)?;
        check_ratio(self.sampling_ratio)
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SettingsError {
    #[error("OTLP endpoint {endpoint:?}: {reason}")]
    Endpoint {
        endpoint: String,
        reason: &'static str,
    },
    #[error("sampling ratio {0} is not between 0 and 1")]
    Ratio(f64),
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error("starting the span exporter thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// An OTLP/gRPC endpoint this exporter can use: `http://host:port`, nothing after the port.
pub fn check_endpoint(endpoint: &str) -> Result<(), SettingsError> {
    let bad = |reason| SettingsError::Endpoint {
        endpoint: endpoint.to_owned(),
        reason,
    };
    let uri: tonic::transport::Uri = endpoint
        .parse()
        .map_err(|_| bad("not a URL; write http://host:port"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(bad(
                "TLS to the collector is not supported; use http:// to a collector (or agent) \
                 inside the cluster",
            ));
        }
        _ => return Err(bad("the scheme must be http://")),
    }
    let authority = uri.authority().map_or("", |a| a.as_str());
    if authority.contains('@') {
        return Err(bad("user information is not allowed"));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if uri.port_u16().is_none() {
        return Err(bad("no port (collectors take OTLP/gRPC on 4317)"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(bad(
            "a path is not allowed: OTLP/gRPC has a fixed one; give only http://host:port",
        ));
    }
    Ok(())
}

pub fn check_ratio(ratio: f64) -> Result<(), SettingsError> {
    if (0.0..=1.0).contains(&ratio) {
        Ok(())
    } else {
        Err(SettingsError::Ratio(ratio))
    }
}

/// Spans exported and dropped, for `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    /// Spans the collector accepted.
    pub exported: AtomicU64,
    /// Spans dropped because the export queue was full.
    pub queue_full: AtomicU64,
    /// Spans dropped because their export failed or the collector rejected them.
    pub export_failed: AtomicU64,
}

impl Counters {
    /// Prometheus text, the families named `{prefix}_trace_spans_*`.
    pub fn render(&self, prefix: &str, out: &mut String) {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP {prefix}_trace_spans_exported_total Spans the OTLP collector accepted."
        );
        let _ = writeln!(out, "# TYPE {prefix}_trace_spans_exported_total counter");
        let _ = writeln!(
            out,
            "{prefix}_trace_spans_exported_total {}",
            load(&self.exported)
        );
        let _ = writeln!(
            out,
            "# HELP {prefix}_trace_spans_dropped_total Spans not exported: queue_full (finished \
             while the export queue was full), export_failed (the collector could not be \
             reached or refused them)."
        );
        let _ = writeln!(out, "# TYPE {prefix}_trace_spans_dropped_total counter");
        for (reason, counter) in [
            ("queue_full", &self.queue_full),
            ("export_failed", &self.export_failed),
        ] {
            let _ = writeln!(
                out,
                "{prefix}_trace_spans_dropped_total{{reason=\"{reason}\"}} {}",
                load(counter)
            );
        }
    }
}

/// Which new traces are recorded: those whose trace id falls below a threshold, so the
/// decision is the same wherever the id is looked at (as OpenTelemetry's ratio sampler).
#[derive(Debug, Clone, Copy)]
enum Sampler {
    Never,
    Always,
    Below(u64),
}

impl Sampler {
    fn new(ratio: f64) -> Self {
        if ratio.is_nan() || ratio <= 0.0 {
            Self::Never
        } else if ratio >= 1.0 {
            Self::Always
        } else {
            // Below 1, so the product is below 2^64 and the cast saturates at worst.
            Self::Below((ratio * 18_446_744_073_709_551_616.0) as u64)
        }
    }

    fn samples(self, trace_id: &[u8; 16]) -> bool {
        match self {
            Self::Never => false,
            Self::Always => true,
            Self::Below(threshold) => {
                let mut low = [0u8; 8];
                low.copy_from_slice(&trace_id[8..]);
                u64::from_be_bytes(low) < threshold
            }
        }
    }
}

/// One span's place in a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Context {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// The caller's span when this one continues a trace from elsewhere.
    pub parent: Option<[u8; 8]>,
    pub sampled: bool,
}

impl Context {
    /// The `traceparent` this span's callees receive: this span is their parent.
    pub fn traceparent(&self) -> Traceparent {
        let mut out = [0u8; 55];
        out[..3].copy_from_slice(b"00-");
        hex_into(&self.trace_id, &mut out[3..35]);
        out[35] = b'-';
        hex_into(&self.span_id, &mut out[36..52]);
        out[52] = b'-';
        out[53] = b'0';
        out[54] = if self.sampled { b'1' } else { b'0' };
        Traceparent(out)
    }
}

/// A `traceparent` value, on the stack.
#[derive(Clone, Copy)]
pub struct Traceparent([u8; 55]);

impl Traceparent {
    pub fn as_str(&self) -> &str {
        // Only ASCII hex digits and dashes are written into it.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::fmt::Debug for Traceparent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn hex_into(bytes: &[u8], out: &mut [u8]) {
    for (i, b) in bytes.iter().enumerate() {
        out[2 * i] = HEX[usize::from(b >> 4)];
        out[2 * i + 1] = HEX[usize::from(b & 0xf)];
    }
}

/// Lower-case hex only, as the W3C format requires.
fn unhex(text: &[u8], out: &mut [u8]) -> Option<()> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    if text.len() != 2 * out.len() {
        return None;
    }
    for (i, pair) in text.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(())
}

/// A caller's context from its `traceparent` value: (trace id, its span id, sampled). None
/// for anything the W3C Trace Context format does not accept, and then a new trace starts.
pub fn parse_traceparent(value: &[u8]) -> Option<([u8; 16], [u8; 8], bool)> {
    let v = value.trim_ascii();
    // version "-" trace-id "-" parent-id "-" flags: 2 + 1 + 32 + 1 + 16 + 1 + 2.
    if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let mut version = [0u8; 1];
    unhex(&v[..2], &mut version)?;
    match version[0] {
        0xff => return None,
        // Version 00 is exactly this long; a later version may add fields after a dash.
        0 if v.len() != 55 => return None,
        _ if v.len() > 55 && v[55] != b'-' => return None,
        _ => {}
    }
    let mut trace_id = [0u8; 16];
    let mut span_id = [0u8; 8];
    let mut flags = [0u8; 1];
    unhex(&v[3..35], &mut trace_id)?;
    unhex(&v[36..52], &mut span_id)?;
    unhex(&v[53..55], &mut flags)?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some((trace_id, span_id, flags[0] & 1 == 1))
}

/// A span's trace context and when it started.
#[derive(Debug, Clone, Copy)]
pub struct Begun {
    pub context: Context,
    unix_nanos: u64,
    at: Instant,
}

impl Begun {
    fn now(context: Context) -> Self {
        let unix_nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        Self {
            context,
            unix_nanos,
            at: Instant::now(),
        }
    }

    /// Its start plus the time elapsed since (the wall clock may step meanwhile).
    fn end_unix_nanos(&self) -> u64 {
        let elapsed = u64::try_from(self.at.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.unix_nanos.saturating_add(elapsed)
    }
}

/// Records spans and hands them to the exporter thread. One per process.
pub struct Tracer {
    sampler: Sampler,
    queue: mpsc::Sender<Finished>,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("sampler", &self.sampler)
            .finish_non_exhaustive()
    }
}

impl Tracer {
    /// Checks `settings` and starts the exporter thread. Nothing connects yet: the collector
    /// may come up later (until then, exports fail and are counted).
    pub fn start(settings: Settings) -> Result<Arc<Self>, TraceError> {
        settings.check()?;
        let (queue, spans) = mpsc::channel(settings.queue.max(1));
        let counters = Arc::new(Counters::default());
        let sampler = Sampler::new(settings.sampling_ratio);
        export::spawn(settings, spans, counters.clone()).map_err(TraceError::Thread)?;
        Ok(Arc::new(Self {
            sampler,
            queue,
            counters,
        }))
    }

    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// The context of a request whose head just arrived, given its one `traceparent` value
    /// (None when it has none, or more than one).
    pub fn begin(&self, traceparent: Option<&[u8]>) -> Begun {
        let context = match traceparent.and_then(parse_traceparent) {
            Some((trace_id, parent, sampled)) => Context {
                trace_id,
                span_id: ids::span_id(),
                parent: Some(parent),
                sampled,
            },
            None => self.root_context(),
        };
        Begun::now(context)
    }

    fn root_context(&self) -> Context {
        let trace_id = ids::trace_id();
        Context {
            trace_id,
            span_id: ids::span_id(),
            parent: None,
            sampled: self.sampler.samples(&trace_id),
        }
    }

    /// Hands a finished span to the exporter, or drops and counts it when the queue is full.
    fn record(&self, span: Finished) {
        if self.queue.try_send(span).is_err() {
            self.counters.queue_full.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A request's span, when the request is sampled (`fields` is not called otherwise).
    pub fn request_span(
        self: &Arc<Self>,
        begun: &Begun,
        fields: impl FnOnce() -> RequestFields,
    ) -> Option<RequestSpan> {
        begun.context.sampled.then(|| RequestSpan {
            tracer: self.clone(),
            start: Arc::new(RequestStart {
                begun: *begun,
                fields: fields(),
            }),
        })
    }
}

/// What a request's span says besides its outcome, known once it is routed.
#[derive(Debug)]
pub struct RequestFields {
    /// One of the methods of RFC 9110 and PATCH, else "_OTHER" (as OpenTelemetry names it).
    pub method: &'static str,
    pub https: bool,
    pub path: String,
    /// The listener port the request came on.
    pub port: u16,
    pub client: Option<IpAddr>,
    /// The route rule serving it, as the snapshot names it.
    pub route: Option<Arc<snap::Route>>,
}

/// The `http.request.method` of a method: known ones as they are, others "_OTHER".
pub fn known_method(method: &str) -> &'static str {
    const KNOWN: [&str; 9] = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
    ];
    KNOWN.into_iter().find(|m| *m == method).unwrap_or("_OTHER")
}

#[derive(Debug)]
struct RequestStart {
    begun: Begun,
    fields: RequestFields,
}

/// A sampled request's span, from its head to its status.
#[derive(Debug)]
pub struct RequestSpan {
    tracer: Arc<Tracer>,
    start: Arc<RequestStart>,
}

impl RequestSpan {
    /// The request ended with `status` (0: no response was sent), served by `upstream`.
    pub fn finish(&self, status: u16, upstream: Option<SocketAddr>) {
        self.tracer.record(Finished::Request {
            end_unix_nanos: self.start.begun.end_unix_nanos(),
            start: self.start.clone(),
            status,
            upstream,
        });
    }
}

/// An attribute value of a [`Span`].
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Self::Str(v.to_owned())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Self::Str(v)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}

impl From<usize> for Value {
    fn from(v: usize) -> Self {
        Self::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Self::Bool(v)
    }
}

/// A span of a process's own work (an internal span: the controller's passes). Without a
/// tracer, or when its trace is not sampled, every method does nothing.
#[derive(Debug)]
pub struct Span {
    recording: Option<(Arc<Tracer>, Box<Recorded>)>,
}

#[derive(Debug)]
struct Recorded {
    begun: Begun,
    name: &'static str,
    attributes: Vec<(&'static str, Value)>,
    error: Option<String>,
}

impl Span {
    /// The first span of a new trace, sampled at the tracer's ratio.
    pub fn root(tracer: Option<&Arc<Tracer>>, name: &'static str) -> Self {
        let recording = tracer.and_then(|t| {
            let context = t.root_context();
            context
                .sampled
                .then(|| (t.clone(), Recorded::new(Begun::now(context), name)))
        });
        Self { recording }
    }

    /// A span of this one's trace, with this one as parent.
    pub fn child(&self, name: &'static str) -> Self {
        let recording = self.recording.as_ref().map(|(tracer, parent)| {
            let context = Context {
                trace_id: parent.begun.context.trace_id,
                span_id: ids::span_id(),
                parent: Some(parent.begun.context.span_id),
                sampled: true,
            };
            (tracer.clone(), Recorded::new(Begun::now(context), name))
        });
        Self { recording }
    }

    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        if let Some((_, r)) = &mut self.recording {
            r.attributes.push((key, value.into()));
        }
    }

    /// Marks the span failed (its status is Error, with this message).
    pub fn fail(&mut self, message: impl std::fmt::Display) {
        if let Some((_, r)) = &mut self.recording {
            r.error = Some(message.to_string());
        }
    }

    /// The span's context, when it records.
    pub fn context(&self) -> Option<Context> {
        self.recording.as_ref().map(|(_, r)| r.begun.context)
    }

    /// Ends the span and hands it to the exporter.
    pub fn end(self) {
        if let Some((tracer, recorded)) = self.recording {
            let end_unix_nanos = recorded.begun.end_unix_nanos();
            tracer.record(Finished::Internal {
                recorded,
                end_unix_nanos,
            });
        }
    }
}

impl Recorded {
    fn new(begun: Begun, name: &'static str) -> Box<Self> {
        Box::new(Self {
            begun,
            name,
            attributes: Vec::new(),
            error: None,
        })
    }
}

/// A span waiting for export.
#[derive(Debug)]
enum Finished {
    Request {
        start: Arc<RequestStart>,
        status: u16,
        upstream: Option<SocketAddr>,
        end_unix_nanos: u64,
    },
    Internal {
        recorded: Box<Recorded>,
        end_unix_nanos: u64,
    },
}

#[cfg(test)]
mod tests;
