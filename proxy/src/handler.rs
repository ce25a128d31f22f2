//! The Pingora engine: Pingora's per-request hooks for one listener port. Everything about
//! what a request means comes from `request`; this module moves it through Pingora (headers,
//! bodies, upstream peers, timeouts, mirrors) and answers what `request` decided.

use crate::access_log::{AccessLine, access_line};
use crate::filters;
use crate::forwarded;
use crate::head::PingoraHead;
use crate::limits::Limits;
use crate::mirror;
use crate::policy::RoutePolicy;
use crate::request::{self, Decision};
use crate::router::Headers;
use crate::table::SharedTable;
use crate::workers;
use answers::{content_length, respond, respond_preflight};
use async_trait::async_trait;
use consult::Consulting;
use coxswain_api::snapshot::{self as snap, filter};
use edits::{apply_request_filter, feed_mirrors};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::{HttpPeer, ProxyHttp, Session};
use pingora::protocols::ALPN;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// The Pingora proxy logic for one listener port.
pub struct Gateway {
    /// The port this proxy listens on, which routes the request.
    pub port: u16,
    /// The port the client addressed (redirects, X-Forwarded-Port); see `router::Binding`.
    pub public_port: u16,
    pub https: bool,
    pub table: SharedTable,
    pub limits: Arc<Limits>,
}

/// What `request_filter` answers, owned so the table guard can be dropped before writing.
enum Answer {
    Forward,
    Status(u16),
    /// A status with one header field of its own (401 with its challenge, 429 with
    /// Retry-After).
    StatusWith(u16, &'static str, String),
    Redirect(u16, String),
    /// A CORS preflight answered here, with the request's Origin.
    Preflight(Arc<RoutePolicy>, Option<String>),
    /// Ask the route's services (global rate limit, authorization) about this request, then
    /// decide again.
    Consult(Box<Consulting>),
}

/// A route's services are asked again at most this often for one request (only a snapshot
/// swapped in meanwhile, giving the route another policy, asks twice).
const CONSULT_ROUNDS: usize = 3;

impl Gateway {
    /// Fills the context of a request going upstream.
    fn prepare(&self, ctx: &mut Ctx, f: &request::Forward<'_>, checked: &request::Checked<'_>) {
        let route = f.route;
        let policy = &route.policy;
        ctx.mirror_targets = f.mirrors.clone();
        ctx.policy = Some(policy.clone());
        ctx.matched_prefix = route.matched_prefix().map(Into::into);
        ctx.regex_rewrite = route.regex_rewrite(&checked.path_and_query);
        ctx.backend_filters = f.backend.filters.clone();
        ctx.upstream = Some(f.addr);
        ctx.endpoint = f.endpoint;
        ctx.cluster = Some(f.cluster.clone());
        ctx.session_named = f.session.is_none().then_some(f.endpoint);
        let tls;
        (tls, ctx.h2c) = match policy.upstream_protocol {
            snap::UpstreamProtocol::Unspecified => {
                (false, f.cluster.app_protocol == snap::AppProtocol::H2c)
            }
            snap::UpstreamProtocol::Http1 => (false, false),
            snap::UpstreamProtocol::H2c => (false, true),
            snap::UpstreamProtocol::Tls => (true, false),
            snap::UpstreamProtocol::TlsH2 => (true, true),
        };
        ctx.tls = tls.then(|| f.cluster.tls_name.clone());
        ctx.backend_tls = f.cluster.backend_tls.clone();
        ctx.deadline = route
            .route
            .timeouts
            .filter(|t| t.request_ms > 0)
            .and_then(|t| {
                ctx.started?
                    .checked_add(Duration::from_millis(t.request_ms))
            });
    }
}

/// Whether a deadline has passed; no deadline never passes.
fn past(deadline: Option<std::time::Instant>) -> bool {
    deadline.is_some_and(|d| std::time::Instant::now() >= d)
}

/// A request or backend request timeout: 504, as the Gateway API asks.
fn timed_out() -> Box<pingora::Error> {
    pingora::Error::explain(
        pingora::ErrorType::HTTPStatus(504),
        "route timeout exceeded",
    )
}

/// Per-request state: what `request_filter` decided, for the later phases.
#[derive(Default)]
pub struct Ctx {
    route: Option<Arc<snap::Route>>,
    policy: Option<Arc<RoutePolicy>>,
    matched_prefix: Option<Box<str>>,
    /// The path and query a regex rewrite produced, computed while the route was at hand.
    regex_rewrite: Option<String>,
    backend_filters: Vec<snap::Filter>,
    upstream: Option<SocketAddr>,
    /// The upstream's cluster, where another endpoint comes from when connecting fails.
    cluster: Option<Arc<crate::upstream::ClusterState>>,
    /// `upstream`'s index in `cluster`.
    endpoint: usize,
    /// The attempt under way, while its cluster balances by least request.
    in_flight: Option<crate::upstream::InFlight>,
    /// The request counted against its route's limit on requests in progress.
    slots: Vec<crate::ratelimit::Slot>,
    /// Session persistence: the endpoint the request named and was sent to (the answer
    /// names the endpoint again only when it served from another one).
    session_named: Option<usize>,
    /// Endpoints (indices) this request was sent to, or could not be sent to.
    tried: Vec<usize>,
    /// Connections to the backend that could not be opened, for this request.
    connect_failures: usize,
    /// Those of them that were not refused at once (timed out, unreachable).
    slow_connect_failures: usize,
    /// Retries under the route's retry policy so far (answers, timeouts, broken connections).
    policy_retries: u32,
    /// Without a policy: times the request went again after a connection broke
    /// (`policy::BROKEN_RESENDS` at most).
    resent: u8,
    /// An answer's head went to the client: nothing can be retried any more.
    answer_started: bool,
    /// The next attempt starts no earlier than this (the retry policy's backoff).
    retry_not_before: Option<std::time::Instant>,
    h2c: bool,
    /// Some: TLS to the backend, with this SNI name.
    tls: Option<Box<str>>,
    /// A BackendTLSPolicy's verified TLS (overrides `tls`).
    backend_tls: Option<Arc<crate::upstream::BackendTls>>,
    counters: Option<Arc<crate::metrics::RouteCounters>>,
    upstream_sent: Option<std::time::Instant>,
    started: Option<std::time::Instant>,
    /// Request body bytes seen so far (the furthest any attempt got), against the route's limit.
    body_bytes: u64,
    /// The route's request timeout, from the proxy receiving the request: covers every
    /// attempt to the backend and the whole response.
    deadline: Option<std::time::Instant>,
    /// The current attempt's end: the backend request timeout, within `deadline`.
    attempt_deadline: Option<std::time::Instant>,
    /// Mirror endpoints this request was sampled for, started with the first attempt.
    mirror_targets: Vec<(SocketAddr, Option<mirror::TlsTo>)>,
    /// Body feeds of the mirrors in flight.
    mirror_taps: Vec<mirror::Tap>,
    /// Request body bytes already fed to the mirrors; a retry replays the body from 0.
    mirror_fed: u64,
    /// Position in the request body during the current attempt.
    body_pos: u64,
    access_log_off: bool,
    /// The client as `request::forwarded` decided it.
    client: Option<std::net::IpAddr>,
    /// The forwarded fields to send upstream, and whether a received `Forwarded` is kept.
    forwarded: Vec<(&'static str, String)>,
    keep_forwarded: bool,
    /// What the route's authorization service asked to change in the request.
    auth_edits: crate::external_auth::Edits,
    /// Some when tracing is on and the request sampled.
    span: Option<crate::trace::RequestSpan>,
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx::default()
    }

    /// No downstream modules. Pingora's default is a compression module at level 0, which
    /// changes nothing but still costs every request a few allocations and dynamic calls.
    fn init_downstream_modules(&self, _modules: &mut pingora::modules::http::HttpModules) {}

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> pingora::Result<bool> {
        ctx.started = Some(std::time::Instant::now());
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        ctx.client = peer;
        // The route policy whose services let this request through (`Decision::Consult`).
        let mut consulted: Option<Arc<RoutePolicy>> = None;
        for _ in 0..CONSULT_ROUNDS {
            let first_round = consulted.is_none();
            // Decide everything from one load of the table; nothing after this reads it again
            // (but for a second round, after an authorization service allowed the request).
            let (answer, normalized) = {
                let head = PingoraHead(session.req_header());
                let checked = match request::check(&head, &self.limits) {
                    Ok(c) => c,
                    Err(reject) => {
                        tracing::debug!(reason = reject.reason(), "request refused");
                        crate::metrics::Metrics::count(&self.table.metrics().requests_refused);
                        session.set_keepalive(None);
                        return respond(session, reject.status(), None).await;
                    }
                };
                let forwarded = request::forwarded(
                    &head,
                    &checked,
                    peer,
                    self.public_port,
                    self.https,
                    &self.limits,
                );
                if first_round {
                    ctx.client = forwarded.client;
                    ctx.keep_forwarded = forwarded.trusted_peer;
                    forwarded.each(&mut |name, parts| ctx.forwarded.push((name, parts.concat())));
                }
                let arrival = request::Arrival {
                    port: self.public_port,
                    https: self.https,
                    client: forwarded.client,
                    consulted: consulted.as_deref(),
                };
                let table = self.table.load();
                let tls = session
                    .digest()
                    .and_then(|d| d.ssl_digest.as_ref())
                    .and_then(|t| t.extension.get::<crate::tls::ConnectionTls>());
                if tls.is_some_and(|t| t.client_cert_refused) {
                    // A resumed session that the port's current CAs would not let in.
                    return respond(session, 403, None).await;
                }
                let sni = tls.and_then(|t| t.sni.as_deref());
                if self.https && request::misdirected(&table, self.port, sni, &checked) {
                    crate::metrics::Metrics::count(&self.table.metrics().misdirected);
                    return respond(session, 421, None).await;
                }
                let route = request::route(&table, self.port, &head, &checked);
                if let Some(route) = route {
                    ctx.counters = Some(route.counters.clone());
                    ctx.route = Some(route.route.clone());
                    ctx.access_log_off = !route.policy.access_log;
                }
                // The first round's trace context is the one sent upstream (`ctx.forwarded`).
                if first_round {
                    ctx.span = crate::request_trace::span(
                        &self.limits,
                        &forwarded,
                        &head,
                        &checked,
                        &arrival,
                        route,
                    );
                }
                let answer = match request::decide(route, &head, &checked, &arrival) {
                    Decision::NotFound => Answer::Status(404),
                    Decision::Status(code) => Answer::Status(code),
                    Decision::Redirect { status, location } => Answer::Redirect(status, location),
                    Decision::Preflight(policy) => {
                        Answer::Preflight(policy.clone(), head.get("origin").map(str::to_owned))
                    }
                    Decision::Unauthorized(challenge) => {
                        crate::metrics::Metrics::count(&self.table.metrics().auth_refused);
                        Answer::StatusWith(401, "www-authenticate", challenge.to_owned())
                    }
                    Decision::Limited { retry_after } => {
                        crate::metrics::Metrics::count(&self.table.metrics().rate_limited);
                        Answer::StatusWith(429, "retry-after", retry_after.to_string())
                    }
                    Decision::Consult(c) => {
                        ctx.slots = c.slots;
                        ctx.auth_edits = c.edits;
                        let authorize =
                            c.policy.external_auth.as_ref().filter(|_| c.authorize).map(
                                |service| {
                                    let asked =
                                        request::auth_request(&head, &checked, &arrival, sni);
                                    (service.clone(), asked)
                                },
                            );
                        Answer::Consult(Box::new(Consulting {
                            policy: c.policy.clone(),
                            limit: c.limit,
                            authorize,
                        }))
                    }
                    Decision::Forward(mut f) => {
                        ctx.slots.append(&mut f.slots);
                        if consulted.is_none() {
                            ctx.auth_edits = std::mem::take(&mut f.edits);
                        }
                        self.prepare(ctx, &f, &checked);
                        Answer::Forward
                    }
                };
                let normalized = checked
                    .rewritten()
                    .then(|| checked.path_and_query.clone().into_owned());
                (answer, normalized)
            };
            // The backend, the filters, mirrors and the access log all see the normalised target.
            if let Some(target) = normalized {
                let req = session.req_header();
                let http2 = req.version == pingora::http::Version::HTTP_2;
                match with_target(&req.uri, &target, http2) {
                    Ok(uri) => session.req_header_mut().set_uri(uri),
                    Err(e) => {
                        tracing::debug!(error = %e, "normalised target is not a URI");
                        session.set_keepalive(None);
                        return respond(session, 400, None).await;
                    }
                }
            }
            return match answer {
                Answer::Forward => Ok(false),
                Answer::Status(code) => respond(session, code, None).await,
                Answer::StatusWith(code, name, value) => {
                    respond(session, code, Some((name, &value))).await
                }
                Answer::Redirect(code, location) => {
                    respond(session, code, Some(("location", &location))).await
                }
                Answer::Preflight(policy, origin) => match &policy.cors {
                    Some(cors) => respond_preflight(session, cors, origin.as_deref()).await,
                    None => respond(session, 204, None).await,
                },
                Answer::Consult(c) => {
                    let policy = c.policy.clone();
                    if let Some(answered) =
                        consult::ask(session, ctx, *c, self.table.metrics()).await
                    {
                        return answered;
                    }
                    consulted = Some(policy);
                    continue;
                }
            };
        }
        tracing::warn!(
            "the route's policy kept changing while its services were asked; request refused"
        );
        respond(session, 503, None).await
    }

    /// Counts a streamed body against the route's limit; past it, the request fails with 413
    /// (Pingora answers it when no response has started).
    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut Ctx,
    ) -> pingora::Result<()> {
        if past(ctx.deadline) {
            return Err(timed_out());
        }
        let start = ctx.body_pos;
        ctx.body_pos += body.as_ref().map_or(0, |b| b.len() as u64);
        // A retry replays the body from 0: those bytes were counted already.
        ctx.body_bytes = ctx.body_bytes.max(ctx.body_pos);
        let limit = ctx.policy.as_ref().map_or(0, |p| p.max_body_bytes);
        if limit > 0 && ctx.body_bytes > limit {
            return Err(pingora::Error::explain(
                pingora::ErrorType::HTTPStatus(413),
                "request body larger than the route's limit",
            ));
        }
        if !ctx.mirror_taps.is_empty() {
            feed_mirrors(ctx, start, body.as_ref(), end_of_stream);
        }
        // Pingora writes an empty last piece to an HTTP/1 backend as a chunk of size 0, which
        // ends a chunked body, and then the real end after it: an HTTP/2 client that ends its
        // stream with an empty DATA frame would send the backend a stray "0\r\n\r\n". Only
        // the last piece: None before the end ends the body there.
        if end_of_stream && body.as_ref().is_some_and(bytes::Bytes::is_empty) {
            *body = None;
        }
        Ok(())
    }

    /// Pingora's default answer to a failed proxy attempt, except that a backend that timed out
    /// gets 504 (as NGINX and the Gateway API answer it) rather than 502.
    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &pingora::Error,
        _ctx: &mut Ctx,
    ) -> pingora::proxy::FailToProxy {
        use pingora::ErrorType::{
            ConnectTimedout, ConnectionClosed, HTTPStatus, ReadError, ReadTimedout, WriteError,
            WriteTimedout,
        };
        let code = match (e.etype(), e.esource()) {
            (HTTPStatus(code), _) => *code,
            (ConnectTimedout | ReadTimedout | WriteTimedout, pingora::ErrorSource::Upstream) => 504,
            (_, pingora::ErrorSource::Upstream) => 502,
            // The client is gone: nobody to answer.
            (WriteError | ReadError | ConnectionClosed, pingora::ErrorSource::Downstream) => 0,
            (_, pingora::ErrorSource::Downstream) => 400,
            _ => 500,
        };
        if code > 0
            && let Err(err) = session.respond_error(code).await
        {
            tracing::debug!(error = %err, "could not send the error response");
        }
        pingora::proxy::FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    /// Whether a failed attempt is sent again: `retries`.
    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<pingora::Error>,
        ctx: &mut Ctx,
        client_reused: bool,
    ) -> Box<pingora::Error> {
        self.attempt_error(peer, session, e, ctx, client_reused)
    }

    /// A client that goes away mid-request is routine, not an error to log at ERROR.
    fn suppress_error_log(&self, _session: &Session, _ctx: &Ctx, error: &pingora::Error) -> bool {
        matches!(error.esource(), pingora::ErrorSource::Downstream)
    }

    async fn logging(&self, session: &mut Session, e: Option<&pingora::Error>, ctx: &mut Ctx) {
        if let Some(e) = e {
            use pingora::ErrorType::{ReadTimedout, WriteTimedout};
            let metrics = self.table.metrics();
            match (e.esource(), e.etype()) {
                (pingora::ErrorSource::Upstream, ReadTimedout | WriteTimedout) => {
                    crate::metrics::Metrics::count(&metrics.upstream_timeouts);
                }
                // An HTTP/2 stream's send timeout (HTTP/1's is counted by `conn::Buffered`).
                (pingora::ErrorSource::Downstream, WriteTimedout) => {
                    crate::metrics::Metrics::count(&metrics.client_send_timeouts);
                }
                _ => {}
            }
        }
        self.record(session, ctx);
        if !ctx.access_log_off {
            access_log(session, ctx);
        }
    }

    /// Where a request whose connection could not be opened goes next: `retries`.
    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut Ctx,
        e: Box<pingora::Error>,
    ) -> Box<pingora::Error> {
        self.connect_failure(ctx, e)
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
    ) -> pingora::Result<Box<HttpPeer>> {
        let Some(addr) = ctx.upstream else {
            return Err(pingora::Error::new_str("no upstream chosen"));
        };
        // Each attempt (retries too) counts as busy on its own endpoint.
        ctx.in_flight = None;
        ctx.in_flight = ctx.cluster.as_ref().and_then(|c| c.start(ctx.endpoint));
        // A retry's backoff, cut short by the request's deadline (checked below).
        if let Some(at) = ctx.retry_not_before.take() {
            let wake = ctx.deadline.map_or(at, |d| d.min(at));
            tokio::time::sleep_until(wake.into()).await;
        }
        let mut peer = match &ctx.backend_tls {
            // BackendTLSPolicy: verified against its CAs, for its hostname or subjectAltNames.
            Some(t) => t.peer(addr, ctx.h2c),
            None => {
                // TLS backends without a policy are not verified, as ingress-nginx does by
                // default: they are addressed by Pod IP and usually present a certificate of
                // their own making.
                let mut peer = HttpPeer::new(
                    addr,
                    ctx.tls.is_some(),
                    ctx.tls.as_deref().unwrap_or_default().to_owned(),
                );
                if ctx.tls.is_some() {
                    peer.options.verify_cert = false;
                    peer.options.verify_hostname = false;
                }
                peer
            }
        };
        if ctx.h2c {
            peer.options.alpn = ALPN::H2;
        }
        // Pooled connections idle no longer than the fast path's.
        peer.options.idle_timeout = Some(self.limits.upstream_idle);
        // Pooled upstream connections stay with the worker that opened them, and ones verified
        // against a policy's CAs serve only peers asking for the same CAs.
        peer.group_key = match &ctx.backend_tls {
            None => workers::index() as u64,
            Some(t) => {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                (workers::index(), t.pool_key).hash(&mut h);
                h.finish()
            }
        };
        self.bound_attempt(&mut peer, ctx, session.is_upgrade_req())?;
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> pingora::Result<()> {
        ctx.upstream_sent = Some(std::time::Instant::now());
        ctx.body_pos = 0;
        // Pingora's default request policy has already taken the hop-by-hop fields off,
        // Connection and the fields it names included (RFC 9110 section 7.6.1), as the fast
        // path does; an upgrade to WebSocket keeps `Connection: Upgrade`.
        // Before the route's filters, so a header modifier can still override them.
        for name in forwarded::FIELDS {
            if !(ctx.keep_forwarded && name == "forwarded") {
                upstream.remove_header(name);
            }
        }
        for (name, value) in &ctx.forwarded {
            upstream.insert_header(*name, value.as_str())?;
        }
        // HTTP/2 cookie crumbs as one field, as the fast path sends them.
        if let Some(cookie) = crate::head::joined_cookies(&PingoraHead(session.req_header())) {
            upstream.insert_header("cookie", cookie)?;
        }
        // The authorization service's fields, before the route's filters as Envoy orders them.
        for name in &ctx.auth_edits.remove {
            upstream.remove_header(name.as_str());
        }
        for (name, value) in &ctx.auth_edits.add {
            upstream.append_header(name.clone(), value.as_str())?;
        }
        let Some(route) = ctx.route.clone() else {
            return Ok(());
        };
        for f in &route.filters {
            apply_request_filter(f, upstream, ctx)?;
        }
        // Mirrors get the request as the rule's filters leave it; backend filters are the
        // main backend's own.
        if !ctx.mirror_targets.is_empty() {
            let framing = if session.is_body_empty() {
                mirror::Framing::Empty
            } else {
                content_length(session.req_header())
                    .map_or(mirror::Framing::Chunked, mirror::Framing::Length)
            };
            for (target, tls) in std::mem::take(&mut ctx.mirror_targets) {
                if let Some(tap) = mirror::start(target, tls, upstream, framing) {
                    ctx.mirror_taps.push(tap);
                }
            }
        }
        let backend_filters = std::mem::take(&mut ctx.backend_filters);
        for f in &backend_filters {
            apply_request_filter(f, upstream, ctx)?;
        }
        ctx.backend_filters = backend_filters;
        Ok(())
    }

    /// Ends a response that is still streaming when the attempt's or the request's time is up
    /// (the status has gone out by then: the client sees the connection close).
    fn upstream_response_body_filter(
        &self,
        _session: &mut Session,
        _body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut Ctx,
    ) -> pingora::Result<Option<Duration>> {
        if !end_of_stream && (past(ctx.attempt_deadline) || past(ctx.deadline)) {
            return Err(timed_out());
        }
        if end_of_stream {
            // The backend is done: the client's next request, which may come as soon as
            // this reaches it, must not find this one in flight (least request).
            ctx.in_flight = None;
        }
        Ok(None)
    }

    /// Only unambiguous response framing passes (the same rules as the fast path's); a
    /// connection that broke them is not used again, as with any error.
    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> pingora::Result<()> {
        // A 5xx answer counts toward the endpoint's ejection; anything else clears its streak
        // (1xx heads are interim: the final one decides).
        let status = response.status.as_u16();
        if let Some(cluster) = &ctx.cluster
            && status >= 200
        {
            cluster.record(ctx.endpoint, status >= 500, &self.limits.outlier);
        }
        // The route's retry policy: this answer is dropped (nothing of it went out) and the
        // request goes to another endpoint, while attempts remain.
        if ctx
            .policy
            .as_ref()
            .and_then(|p| p.retry.as_ref())
            .is_some_and(|r| r.retries(status))
            && self.send_again(ctx, Some(session.req_header().method.as_str()))
        {
            let mut e = pingora::Error::explain(
                pingora::ErrorType::HTTPStatus(status),
                "the backend's answer is retried",
            );
            e.set_retry(true);
            return Err(e);
        }
        ctx.answer_started = true;
        // A final answer without a body ends the backend's part here (see the body filter).
        let bodyless = status == 204
            || status == 304
            || session.req_header().method.as_str() == "HEAD"
            || response
                .headers
                .get("content-length")
                .is_some_and(|v| v.as_bytes() == b"0");
        if bodyless && status >= 200 {
            ctx.in_flight = None;
        }
        // The client hears this proxy's version, as on the fast path (RFC 9110 6.2).
        if response.version == pingora::http::Version::HTTP_10 {
            response.set_version(pingora::http::Version::HTTP_11);
        }
        let fields = crate::http1::framing_fields(
            response
                .headers
                .iter()
                .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())),
        );
        match fields {
            Ok(_) => Ok(()),
            Err(e) => Err(pingora::Error::explain(
                pingora::ErrorType::HTTPStatus(502),
                e.to_string(),
            )),
        }
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> pingora::Result<()> {
        if let Some(sent) = ctx.upstream_sent.take() {
            self.table.metrics().upstream_latency(sent.elapsed());
        }
        if let Some(cors) = ctx.policy.as_ref().and_then(|p| p.cors.as_ref()) {
            let origin = session.req_header().headers.get("origin");
            let mut fields = Vec::new();
            cors.answer_fields(origin.and_then(|o| o.to_str().ok()), &mut fields);
            answers::add_fields(response, fields)?;
        }
        if let Some(session) = ctx.policy.as_ref().and_then(|p| p.session.as_ref())
            && ctx.session_named != Some(ctx.endpoint)
            && let Some(cluster) = &ctx.cluster
        {
            answers::add_fields(
                response,
                vec![session.answer(cluster.endpoint_id(ctx.endpoint))],
            )?;
        }
        let Some(route) = ctx.route.clone() else {
            return Ok(());
        };
        for f in route.filters.iter().chain(ctx.backend_filters.iter()) {
            if let Some(filter::Kind::ResponseHeaderModifier(m)) = &f.kind {
                filters::modify_headers(response, m);
            }
        }
        Ok(())
    }
}

impl Gateway {
    /// Counts the request by its status, and ends its span.
    fn record(&self, session: &Session, ctx: &Ctx) {
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        match &ctx.counters {
            Some(c) => c.record(status),
            None => self.table.metrics().unrouted(status),
        }
        if let Some(span) = &ctx.span {
            span.finish(status, ctx.upstream);
        }
    }
}

/// One access log line per request, on its own target so it can be filtered or routed
/// separately; with `--log-format json` each is a JSON object.
fn access_log(session: &Session, ctx: &Ctx) {
    let req = session.req_header();
    let status = session.response_written().map_or(0, |r| r.status.as_u16());
    access_line(&AccessLine {
        client: ctx.client,
        method: req.method.as_str(),
        host: req
            .uri
            .authority()
            .map(|a| a.as_str())
            .or_else(|| req.headers.get("host").and_then(|h| h.to_str().ok()))
            .unwrap_or(""),
        path: req.uri.path(),
        status,
        route: ctx.route.as_ref().and_then(|r| r.source.as_ref()),
        upstream: ctx.upstream,
        duration_ms: ctx.started.map_or(0, |s| s.elapsed().as_millis() as u64),
    });
}

/// The request's URI with `target` as its path and query. An HTTP/2 request keeps its scheme
/// and :authority, which become the Host an HTTP/1 backend gets (a bare path would give it an
/// empty one); an HTTP/1 request's target goes upstream in origin-form, as the path alone.
fn with_target(
    uri: &hyper::Uri,
    target: &str,
    http2: bool,
) -> Result<hyper::Uri, hyper::http::Error> {
    let path: hyper::http::uri::PathAndQuery = target.parse()?;
    match (uri.scheme(), uri.authority()) {
        (Some(scheme), Some(authority)) if http2 => Ok(hyper::Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query(path)
            .build()?),
        _ => Ok(hyper::Uri::from(path)),
    }
}

mod answers;
mod consult;
mod edits;
mod retries;
mod timeouts;
