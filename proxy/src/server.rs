//! The data plane: listeners that follow the snapshot, and the Pingora proxy logic.
//!
//! Pingora's `Server` binds its listeners once at start-up, but a snapshot can add or drop
//! ports at any time. So the proxy runs its own accept loops (one per port, started and
//! stopped as snapshots change) and hands each connection to a Pingora `HttpProxy`, which does
//! the HTTP work: parsing, upstream connection pooling, h2, forwarding.

use crate::filters::{self, EditHeaders, RedirectRequest};
use crate::policy::{CorsPolicy, RoutePolicy};
use crate::router::{Pick, Request};
use crate::table::SharedTable;
use crate::tls::SniResolver;
use crate::workers::{self, Workers};
use async_trait::async_trait;
use coxswain_api::snapshot::{self as snap, filter};
use pingora::apps::HttpServerOptions;
use pingora::apps::ServerApp;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::listeners::tls::Acceptor;
use pingora::prelude::{HttpPeer, ProxyHttp, Session};
use pingora::protocols::ALPN;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::{GetSocketDigest, SocketDigest};
use pingora::server::configuration::ServerConf;
use pingora_proxy_alias::HttpProxy;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::io::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub(crate) mod mirror {
    //! RequestMirror: the request as the rule's filters leave it, body included, sent to a
    //! mirror backend over a connection of its own; the answer is read and dropped. The main
    //! request never waits for a mirror: body chunks are handed over without blocking, and a
    //! mirror that falls behind (or whose request ends early) is abandoned.

    use bytes::Bytes;
    use pingora::http::RequestHeader;
    use std::net::SocketAddr;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::mpsc;

    /// Chunks a mirror may lag behind the main request before it is dropped.
    const BACKLOG: usize = 64;
    /// A mirror that has not finished by then is given up.
    const DEADLINE: Duration = Duration::from_secs(10);

    /// How the mirrored request frames its body.
    #[derive(Clone, Copy)]
    pub enum Framing {
        Empty,
        Length(u64),
        Chunked,
    }

    /// The body feed of one mirror: `Some(chunk)`, then `None` at the end. A feed dropped
    /// without `None` aborts the mirrored request, so a backend never takes a cut body as whole.
    pub type Tap = mpsc::Sender<Option<Bytes>>;

    /// Verified TLS to a mirror's backend (BackendTLSPolicy), with the name to verify.
    pub type TlsTo = (
        std::sync::Arc<rustls::ClientConfig>,
        rustls_pki_types::ServerName<'static>,
    );

    /// Starts a copy of `req` to `target`; returns the feed for its body (none when empty).
    pub fn start(
        target: SocketAddr,
        tls: Option<TlsTo>,
        req: &RequestHeader,
        framing: Framing,
    ) -> Option<Tap> {
        let head = head(req, framing);
        let (tap, body) = match framing {
            Framing::Empty => (None, None),
            _ => {
                let (tx, rx) = mpsc::channel(BACKLOG);
                (Some(tx), Some(rx))
            }
        };
        tokio::spawn(async move {
            let copy = send(target, tls, head, body, matches!(framing, Framing::Chunked));
            let result = tokio::time::timeout(DEADLINE, copy)
                .await
                .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()));
            if let Err(e) = result {
                tracing::debug!(%target, error = %e, "mirror request failed");
            }
        });
        tap
    }

    async fn send(
        target: SocketAddr,
        tls: Option<TlsTo>,
        head: Vec<u8>,
        body: Option<mpsc::Receiver<Option<Bytes>>>,
        chunked: bool,
    ) -> std::io::Result<()> {
        let tcp = tokio::net::TcpStream::connect(target).await?;
        tcp.set_nodelay(true)?;
        match tls {
            None => copy(tcp, head, body, chunked).await,
            Some((config, name)) => {
                let s = tokio_rustls::TlsConnector::from(config)
                    .connect(name, tcp)
                    .await?;
                copy(s, head, body, chunked).await
            }
        }
    }

    async fn copy<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
        mut s: S,
        head: Vec<u8>,
        body: Option<mpsc::Receiver<Option<Bytes>>>,
        chunked: bool,
    ) -> std::io::Result<()> {
        s.write_all(&head).await?;
        if let Some(mut body) = body {
            loop {
                match body.recv().await {
                    Some(Some(chunk)) if chunked => {
                        // An empty chunk would end the body early.
                        if !chunk.is_empty() {
                            s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                                .await?;
                            s.write_all(&chunk).await?;
                            s.write_all(b"\r\n").await?;
                        }
                    }
                    Some(Some(chunk)) => s.write_all(&chunk).await?,
                    Some(None) => {
                        if chunked {
                            s.write_all(b"0\r\n\r\n").await?;
                        }
                        break;
                    }
                    None => {
                        return Err(std::io::Error::other("the request body was cut short"));
                    }
                }
            }
        }
        let mut sink = [0u8; 4096];
        while s.read(&mut sink).await? > 0 {}
        Ok(())
    }

    /// The HTTP/1.1 request head: the request's headers minus hop-by-hop ones, then framing
    /// of our own and `connection: close`.
    fn head(req: &RequestHeader, framing: Framing) -> Vec<u8> {
        let mut head = Vec::with_capacity(512);
        let path = req.uri.path_and_query().map_or("/", |p| p.as_str());
        head.extend_from_slice(req.method.as_str().as_bytes());
        head.push(b' ');
        head.extend_from_slice(path.as_bytes());
        head.extend_from_slice(b" HTTP/1.1\r\n");
        for (name, value) in &req.headers {
            if matches!(
                name.as_str(),
                "connection"
                    | "content-length"
                    | "transfer-encoding"
                    | "keep-alive"
                    | "proxy-connection"
                    | "te"
                    | "upgrade"
            ) {
                continue;
            }
            head.extend_from_slice(name.as_str().as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        if req.headers.get("host").is_none()
            && let Some(a) = req.uri.authority()
        {
            head.extend_from_slice(b"host: ");
            head.extend_from_slice(a.as_str().as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        match framing {
            Framing::Empty => head.extend_from_slice(b"content-length: 0\r\n"),
            Framing::Length(n) => {
                head.extend_from_slice(format!("content-length: {n}\r\n").as_bytes())
            }
            Framing::Chunked => head.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        }
        head.extend_from_slice(b"connection: close\r\n\r\n");
        head
    }
}

mod pingora_proxy_alias {
    pub use pingora::proxy::HttpProxy;
}

/// A rule or backend filter's edits to the request sent upstream.
fn apply_request_filter(
    f: &snap::Filter,
    upstream: &mut RequestHeader,
    ctx: &mut Ctx,
) -> pingora::Result<()> {
    match &f.kind {
        Some(filter::Kind::RequestHeaderModifier(m)) => filters::modify_headers(upstream, m),
        Some(filter::Kind::UrlRewrite(r)) => {
            if !r.hostname.is_empty() {
                upstream.insert_header("host", r.hostname.as_str())?;
            }
            let regex = matches!(
                r.path.as_ref().and_then(|p| p.kind.as_ref()),
                Some(snap::path_modifier::Kind::ReplaceRegexMatch(_))
            );
            let new = if regex {
                // Cloned, not taken: a retry starts again from the client's request.
                ctx.regex_rewrite.clone()
            } else {
                r.path.as_ref().map(|m| {
                    let current = upstream.uri.path_and_query().map_or("/", |p| p.as_str());
                    filters::rewrite_path(current, ctx.matched_prefix.as_deref(), m)
                })
            };
            if let Some(new) = new {
                match new.parse() {
                    Ok(uri) => upstream.set_uri(uri),
                    Err(e) => {
                        tracing::warn!(path = %new, error = %e, "rewritten path is not a valid URI")
                    }
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// Hands a request body chunk to every mirror without waiting: a mirror whose backlog is full
/// is dropped (its request aborts). Bytes a retry replays are not fed twice.
fn feed_mirrors(ctx: &mut Ctx, start: u64, body: Option<&bytes::Bytes>, end_of_stream: bool) {
    // `body_pos` already counts this chunk; only what no attempt fed before goes out.
    if let Some(b) = body
        && ctx.body_pos > ctx.mirror_fed
    {
        let skip = usize::try_from(ctx.mirror_fed.saturating_sub(start)).unwrap_or(0);
        let fresh = b.slice(skip.min(b.len())..);
        ctx.mirror_fed = ctx.body_pos;
        ctx.mirror_taps
            .retain(|tap| tap.try_send(Some(fresh.clone())).is_ok());
    }
    if end_of_stream {
        for tap in ctx.mirror_taps.drain(..) {
            let _ = tap.try_send(None);
        }
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
    h2c: bool,
    /// Some: TLS to the backend, with this SNI name.
    tls: Option<Box<str>>,
    /// A BackendTLSPolicy's verified TLS (overrides `tls`).
    backend_tls: Option<Arc<crate::router::BackendTls>>,
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
}

/// The Pingora proxy logic for one listener port.
pub struct Gateway {
    pub port: u16,
    pub https: bool,
    pub table: SharedTable,
}

struct ReqHeaders<'a>(&'a RequestHeader);

impl crate::router::Headers for ReqHeaders<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.0.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl EditHeaders for RequestHeader {
    fn set(&mut self, name: &str, value: &str) {
        let _ = self.insert_header(name.to_owned(), value);
    }
    fn add(&mut self, name: &str, value: &str) {
        let _ = self.append_header(name.to_owned(), value);
    }
    fn remove(&mut self, name: &str) {
        let _ = self.remove_header(name);
    }
}

impl EditHeaders for ResponseHeader {
    fn set(&mut self, name: &str, value: &str) {
        let _ = self.insert_header(name.to_owned(), value);
    }
    fn add(&mut self, name: &str, value: &str) {
        let _ = self.append_header(name.to_owned(), value);
    }
    fn remove(&mut self, name: &str) {
        let _ = self.remove_header(name);
    }
}

fn request_host(req: &RequestHeader) -> &str {
    req.uri
        .authority()
        .map(|a| a.as_str())
        .or_else(|| req.headers.get("host").and_then(|h| h.to_str().ok()))
        .unwrap_or("")
}

fn host_without_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host
            .split_once(']')
            .map_or(host, |(h, _)| &host[..=h.len()]);
    }
    host.rsplit_once(':').map_or(host, |(h, p)| {
        if p.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            host
        }
    })
}

/// A CORS preflight: OPTIONS naming the method it asks about, from a page with an Origin.
fn is_preflight(req: &RequestHeader) -> bool {
    req.method == pingora::http::Method::OPTIONS
        && req.headers.contains_key("origin")
        && req.headers.contains_key("access-control-request-method")
}

/// The answer to a preflight: 204, with the Access-Control-* headers when the origin is
/// allowed and without them otherwise (the browser then refuses the real request).
async fn respond_preflight(
    session: &mut Session,
    cors: &CorsPolicy,
    origin: Option<&str>,
) -> pingora::Result<bool> {
    let mut resp = ResponseHeader::build(204, Some(8))?;
    if let Some(allowed) = origin.and_then(|o| cors.allow_origin(o)) {
        let req = session.req_header();
        let asked = |name: &str| req.headers.get(name).and_then(|v| v.to_str().ok());
        resp.insert_header("access-control-allow-origin", allowed)?;
        if allowed != "*" {
            resp.append_header("vary", "Origin")?;
        }
        if cors.allow_credentials {
            resp.insert_header("access-control-allow-credentials", "true")?;
        }
        let methods = cors.preflight_methods(asked("access-control-request-method"));
        if !methods.is_empty() {
            resp.insert_header("access-control-allow-methods", methods)?;
        }
        let headers = cors.preflight_headers(asked("access-control-request-headers"));
        if !headers.is_empty() {
            resp.insert_header("access-control-allow-headers", headers)?;
        }
        if !cors.expose_headers.is_empty() {
            resp.insert_header("access-control-expose-headers", &*cors.expose_headers)?;
        }
        if !cors.max_age.is_empty() {
            resp.insert_header("access-control-max-age", &*cors.max_age)?;
        }
    }
    resp.insert_header("content-length", "0")?;
    session.write_response_header(Box::new(resp), true).await?;
    Ok(true)
}

/// Content-Length, when present and a number.
fn content_length(req: &RequestHeader) -> Option<u64> {
    req.headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// "Kind/namespace/name" for log lines, without building a String.
struct SourceName<'a>(Option<&'a snap::RouteSource>);

impl std::fmt::Display for SourceName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(s) => write!(f, "{}/{}/{}", s.kind, s.namespace, s.name),
            None => Ok(()),
        }
    }
}

async fn respond(
    session: &mut Session,
    status: u16,
    location: Option<&str>,
) -> pingora::Result<bool> {
    let mut resp = ResponseHeader::build(status, Some(2))?;
    if let Some(l) = location {
        resp.insert_header("location", l)?;
    }
    resp.insert_header("content-length", "0")?;
    session.write_response_header(Box::new(resp), true).await?;
    Ok(true)
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> pingora::Result<bool> {
        ctx.started = Some(std::time::Instant::now());
        // Decide everything from one load of the table; nothing after this reads it again.
        let decision = {
            let client_ip = session
                .client_addr()
                .and_then(|a| a.as_inet())
                .map(|a| a.ip());
            let table = self.table.load();
            let req = session.req_header();
            let path_and_query = req.uri.path_and_query().map_or("/", |p| p.as_str());
            let request = Request {
                host: request_host(req),
                path_and_query,
                method: req.method.as_str(),
                headers: &ReqHeaders(req),
            };
            match table.router.route(self.port, &request) {
                None => Decision::Status(404),
                Some(route) => {
                    ctx.counters = Some(route.counters.clone());
                    ctx.route = Some(route.route.clone());
                    let policy = &route.policy;
                    ctx.access_log_off = !policy.access_log;
                    let redirect = route.route.filters.iter().find_map(|f| match &f.kind {
                        Some(filter::Kind::RequestRedirect(r)) => Some(r.clone()),
                        _ => None,
                    });
                    if let Some(list) = &policy.allowlist
                        && !client_ip.is_some_and(|ip| list.allows(ip))
                    {
                        Decision::Status(403)
                    } else if let Some(r) = redirect {
                        let location = filters::redirect_location(
                            &RedirectRequest {
                                scheme: if self.https { "https" } else { "http" },
                                host: host_without_port(request_host(req)),
                                listener_port: self.port,
                                path_and_query,
                                matched_prefix: route.matched_prefix(),
                            },
                            &r,
                        );
                        Decision::Redirect(u16::try_from(r.status_code).unwrap_or(302), location)
                    } else if route.route.direct_status != 0 {
                        Decision::Status(u16::try_from(route.route.direct_status).unwrap_or(500))
                    } else if policy.cors.is_some() && is_preflight(req) {
                        Decision::Preflight(
                            policy.clone(),
                            req.headers
                                .get("origin")
                                .and_then(|o| o.to_str().ok())
                                .map(str::to_owned),
                        )
                    } else if policy.max_body_bytes > 0
                        && content_length(req).is_some_and(|n| n > policy.max_body_bytes)
                    {
                        Decision::Status(413)
                    } else {
                        // Sampled here, from this table; sent once the request goes upstream.
                        for m in &route.mirrors {
                            let Some(cluster) = m.cluster.as_ref() else {
                                continue;
                            };
                            // Verified TLS or nothing: a Service under a BackendTLSPolicy
                            // gets no mirror in clear.
                            let tls = match &cluster.backend_tls {
                                None => None,
                                Some(t) => match &t.mirror {
                                    Some(tls) => Some(tls.clone()),
                                    None => {
                                        tracing::debug!(cluster = %cluster.name, "mirror skipped: its TLS cannot be verified here");
                                        continue;
                                    }
                                },
                            };
                            if m.sampled()
                                && let Some(target) = cluster.pick()
                            {
                                ctx.mirror_targets.push((target, tls));
                            }
                        }
                        match route.pick() {
                            Pick::Endpoint {
                                addr,
                                backend,
                                cluster,
                            } => {
                                ctx.policy = Some(policy.clone());
                                ctx.matched_prefix = route.matched_prefix().map(Into::into);
                                ctx.regex_rewrite = route.regex_rewrite(path_and_query);
                                ctx.backend_filters = backend.filters.clone();
                                ctx.upstream = Some(addr);
                                let tls;
                                (tls, ctx.h2c) = match policy.upstream_protocol {
                                    snap::UpstreamProtocol::Unspecified => {
                                        (false, cluster.app_protocol == snap::AppProtocol::H2c)
                                    }
                                    snap::UpstreamProtocol::Http1 => (false, false),
                                    snap::UpstreamProtocol::H2c => (false, true),
                                    snap::UpstreamProtocol::Tls => (true, false),
                                    snap::UpstreamProtocol::TlsH2 => (true, true),
                                };
                                ctx.tls = tls.then(|| cluster.tls_name.clone());
                                ctx.backend_tls = cluster.backend_tls.clone();
                                ctx.deadline =
                                    route.route.timeouts.filter(|t| t.request_ms > 0).and_then(
                                        |t| {
                                            ctx.started?
                                                .checked_add(Duration::from_millis(t.request_ms))
                                        },
                                    );
                                // A policy without a usable CA: never send unverified.
                                if ctx.backend_tls.as_ref().is_some_and(|t| t.refuse) {
                                    Decision::Status(502)
                                } else {
                                    Decision::Forward
                                }
                            }
                            Pick::InvalidBackend => Decision::Status(500),
                            Pick::NoEndpoints => Decision::Status(503),
                        }
                    }
                }
            }
        };
        match decision {
            Decision::Forward => Ok(false),
            Decision::Status(code) => respond(session, code, None).await,
            Decision::Redirect(code, location) => respond(session, code, Some(&location)).await,
            Decision::Preflight(policy, origin) => match &policy.cors {
                Some(cors) => respond_preflight(session, cors, origin.as_deref()).await,
                None => respond(session, 204, None).await,
            },
        }
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

    /// A client that goes away mid-request is routine, not an error to log at ERROR.
    fn suppress_error_log(&self, _session: &Session, _ctx: &Ctx, error: &pingora::Error) -> bool {
        matches!(error.esource(), pingora::ErrorSource::Downstream)
    }

    async fn logging(&self, session: &mut Session, _e: Option<&pingora::Error>, ctx: &mut Ctx) {
        self.record(session, ctx);
        if !ctx.access_log_off {
            access_log(session, ctx);
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut Ctx,
    ) -> pingora::Result<Box<HttpPeer>> {
        let Some(addr) = ctx.upstream else {
            return Err(pingora::Error::new_str("no upstream chosen"));
        };
        let mut peer = match &ctx.backend_tls {
            // BackendTLSPolicy: the certificate must chain to the policy's CA (or the built-in
            // roots) and be valid for its hostname, which is also the SNI.
            Some(t) => {
                let mut peer = HttpPeer::new(addr, true, t.hostname.to_string());
                peer.options.ca = t.ca.clone();
                peer
            }
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
        // Gateway API timeouts: the request timeout bounds every attempt by what is left of
        // it; the backend request timeout bounds each attempt. Pingora has no whole-exchange
        // timer, so the budget caps connecting and each read and write, and the body filters
        // end a response still streaming at the deadline.
        let now = std::time::Instant::now();
        let mut budget = match ctx.deadline {
            Some(d) if d <= now => return Err(timed_out()),
            Some(d) => Some(d - now),
            None => None,
        };
        let timeouts = ctx.route.as_ref().and_then(|r| r.timeouts);
        if let Some(ms) = timeouts.map(|t| t.backend_request_ms).filter(|ms| *ms > 0) {
            let d = Duration::from_millis(ms);
            budget = Some(budget.map_or(d, |b| b.min(d)));
        }
        ctx.attempt_deadline = budget.and_then(|b| now.checked_add(b));
        if let Some(b) = budget {
            peer.options.read_timeout = Some(b);
            peer.options.write_timeout = Some(b);
            peer.options.total_connection_timeout = Some(b);
        }
        if let Some(t) = timeouts {
            // The Ingress timeouts: connect, and each read and write.
            let at_most = |a: Option<Duration>, ms: u64| match (a, ms) {
                (a, 0) => a,
                (None, ms) => Some(Duration::from_millis(ms)),
                (Some(a), ms) => Some(a.min(Duration::from_millis(ms))),
            };
            if t.connect_ms > 0 {
                peer.options.connection_timeout = Some(Duration::from_millis(t.connect_ms));
                peer.options.total_connection_timeout =
                    at_most(peer.options.total_connection_timeout, t.connect_ms);
            }
            peer.options.read_timeout = at_most(peer.options.read_timeout, t.read_ms);
            peer.options.write_timeout = at_most(peer.options.write_timeout, t.send_ms);
        }
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
        Ok(None)
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
        if let Some(cors) = ctx.policy.as_ref().and_then(|p| p.cors.as_ref())
            && let Some(origin) = session
                .req_header()
                .headers
                .get("origin")
                .and_then(|o| o.to_str().ok())
            && let Some(allowed) = cors.allow_origin(origin)
        {
            response.insert_header("access-control-allow-origin", allowed)?;
            if allowed != "*" {
                response.append_header("vary", "Origin")?;
            }
            if cors.allow_credentials {
                response.insert_header("access-control-allow-credentials", "true")?;
            }
            if !cors.expose_headers.is_empty() {
                response.insert_header("access-control-expose-headers", &*cors.expose_headers)?;
            }
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

/// Counts a connection while it lives.
struct ActiveGuard(Arc<AtomicUsize>);

impl ActiveGuard {
    fn new(counter: Arc<AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Self(counter)
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Gateway {
    fn record(&self, session: &Session, ctx: &Ctx) {
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        match &ctx.counters {
            Some(c) => c.record(status),
            None => self.table.metrics().unrouted(status),
        }
    }
}

enum Decision {
    Forward,
    Status(u16),
    Redirect(u16, String),
    /// A CORS preflight answered here, with the request's Origin.
    Preflight(Arc<RoutePolicy>, Option<String>),
}

/// One access log line per request, on its own target so it can be filtered or routed
/// separately; with `--log-format json` each is a JSON object.
fn access_log(session: &Session, ctx: &Ctx) {
    let req = session.req_header();
    let status = session.response_written().map_or(0, |r| r.status.as_u16());
    let client = session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip());
    access_line(&AccessLine {
        client,
        method: req.method.as_str(),
        host: request_host(req),
        path: req.uri.path(),
        status,
        route: ctx.route.as_ref().and_then(|r| r.source.as_ref()),
        upstream: ctx.upstream,
        duration_ms: ctx.started.map_or(0, |s| s.elapsed().as_millis() as u64),
    });
}

/// The fields of one access log line, whichever path served the request.
pub(crate) struct AccessLine<'a> {
    pub client: Option<std::net::IpAddr>,
    pub method: &'a str,
    pub host: &'a str,
    pub path: &'a str,
    pub status: u16,
    pub route: Option<&'a snap::RouteSource>,
    pub upstream: Option<SocketAddr>,
    pub duration_ms: u64,
}

pub(crate) fn access_line(line: &AccessLine<'_>) {
    tracing::info!(
        target: "coxswain::access",
        client = line.client.map(tracing::field::display),
        method = line.method,
        host = line.host,
        path = line.path,
        status = line.status,
        route = %SourceName(line.route),
        upstream = line.upstream.map(tracing::field::display),
        duration_ms = line.duration_ms,
        "request"
    );
}

fn table_active(table: &SharedTable) -> Arc<AtomicUsize> {
    table.metrics().active_connections.clone()
}

struct Running {
    protocol: snap::Protocol,
    accept: JoinHandle<()>,
    proxy: Arc<HttpProxy<Gateway>>,
    /// Tells fast-path connections idling between requests to close.
    closing: watch::Sender<bool>,
}

impl Running {
    /// Stops accepting, and wakes connections idling between keep-alive requests so they
    /// close; requests in flight finish.
    async fn stop(self) {
        self.accept.abort();
        let _ = self.closing.send(true);
        self.proxy.cleanup().await;
    }
}

/// Listeners that follow the table: one accept loop per port the snapshot asks for.
pub struct Listeners {
    table: SharedTable,
    bind_ip: std::net::IpAddr,
    conf: Arc<ServerConf>,
    running: HashMap<u16, Running>,
    shutdown: watch::Receiver<bool>,
    active: Arc<AtomicUsize>,
    workers: Option<Workers>,
}

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

impl Listeners {
    pub fn new(
        table: SharedTable,
        bind_ip: std::net::IpAddr,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Self {
            active: table_active(&table),
            table,
            bind_ip,
            conf: Arc::new(ServerConf::default()),
            running: HashMap::new(),
            shutdown,
            workers: None,
        }
    }

    /// Runs connections on these workers rather than on the runtime that accepts them.
    pub fn with_workers(mut self, workers: Workers) -> Self {
        self.workers = Some(workers);
        self
    }

    /// Connections open right now (for draining).
    pub fn active_connections(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Binds ports the current table has and this set does not, and closes ports it dropped.
    /// Returns the errors of ports that could not be bound; the others are served regardless.
    pub async fn sync(&mut self) -> Vec<ListenError> {
        let wanted: HashMap<u16, snap::Protocol> = self.table.load().router.ports().collect();
        // Ports no longer asked for, and ports whose protocol changed (bound again below).
        let dropped: Vec<u16> = self
            .running
            .iter()
            .filter(|(p, r)| wanted.get(p) != Some(&r.protocol))
            .map(|(p, _)| *p)
            .collect();
        for port in dropped {
            if let Some(r) = self.running.remove(&port) {
                r.stop().await;
                tracing::info!(port, "listener closed");
            }
        }
        let mut errors = Vec::new();
        for (port, protocol) in wanted {
            if self.running.contains_key(&port) {
                continue;
            }
            let addr = SocketAddr::new(self.bind_ip, port);
            match TcpListener::bind(addr).await {
                Ok(listener) => {
                    let https = protocol == snap::Protocol::Https;
                    let tls_passthrough = protocol == snap::Protocol::TlsPassthrough;
                    let proxy = self.proxy_for(port, https);
                    let (closing, closed) = watch::channel(false);
                    let accept = tokio::spawn(accept_loop(
                        listener,
                        Connection {
                            proxy: proxy.clone(),
                            tls: https.then(|| self.acceptor(port)),
                            tls_passthrough,
                            table: self.table.clone(),
                            port,
                            shutdown: self.shutdown.clone(),
                            closing: closed,
                            peer: SocketAddr::new(self.bind_ip, 0),
                            _guard: None,
                        },
                        self.active.clone(),
                        self.workers.clone(),
                    ));
                    tracing::info!(port, ?protocol, "listener bound");
                    self.running.insert(
                        port,
                        Running {
                            protocol,
                            accept,
                            proxy,
                            closing,
                        },
                    );
                }
                Err(source) => errors.push(ListenError::Bind { addr, source }),
            }
        }
        errors
    }

    pub fn ports(&self) -> Vec<u16> {
        let mut p: Vec<u16> = self.running.keys().copied().collect();
        p.sort_unstable();
        p
    }

    /// Stops accepting, tells connections to finish, and waits up to `grace` for them.
    pub async fn drain(&mut self, shutdown: &watch::Sender<bool>, grace: Duration) {
        tracing::info!(?grace, "stopping: no new connections, draining");
        self.close_all().await;
        let _ = shutdown.send(true);
        let deadline = tokio::time::Instant::now() + grace;
        while self.active_connections() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let left = self.active_connections();
        if left > 0 {
            tracing::warn!(
                connections = left,
                "drain period over; closing what is left"
            );
        }
    }

    /// Stops accepting on every port and closes idle keep-alive connections.
    pub async fn close_all(&mut self) {
        for (_, r) in self.running.drain() {
            r.stop().await;
        }
    }

    fn proxy_for(&self, port: u16, https: bool) -> Arc<HttpProxy<Gateway>> {
        let mut proxy = pingora::proxy::http_proxy(
            &self.conf,
            Gateway {
                port,
                https,
                table: self.table.clone(),
            },
        );
        let mut options = HttpServerOptions::default();
        // Plaintext HTTP/2 with prior knowledge, detected from the connection preface.
        options.h2c = true;
        proxy.server_options = Some(options);
        Arc::new(proxy)
    }

    fn acceptor(&self, port: u16) -> Arc<Acceptor> {
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map(|b| {
            b.with_no_client_auth()
                .with_cert_resolver(Arc::new(SniResolver {
                    port,
                    table: self.table.clone(),
                }))
        })
        .unwrap_or_else(|e| panic!("ring supports the default TLS versions: {e}"));
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(Acceptor::from_server_config(Arc::new(config)))
    }
}

/// A connection for the TLS acceptor, which takes Pingora's own stream type (rustls then
/// batches writes into records, so it needs no buffer under it).
fn l4_stream(tcp: tokio::net::TcpStream, peer: SocketAddr) -> L4Stream {
    let mut stream = L4Stream::from(tcp);
    // The client address, for allowlists and access logs.
    let digest = SocketDigest::from_raw_fd(stream.as_raw_fd());
    let _ = digest.peer_addr.set(Some(peer.into()));
    stream.set_socket_digest(digest);
    stream
}

/// Accepts connections; `template` is what each one is served with.
async fn accept_loop(
    listener: TcpListener,
    template: Connection,
    active: Arc<AtomicUsize>,
    workers: Option<Workers>,
) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let conn = Connection {
            peer,
            _guard: Some(Arc::new(ActiveGuard::new(active.clone()))),
            ..template.clone()
        };
        match &workers {
            None => {
                tokio::spawn(conn.serve(tcp));
            }
            // The socket moves to the worker's reactor: registered there, driven there.
            Some(workers) => match tcp.into_std() {
                Ok(std) => workers.spawn(async move {
                    match tokio::net::TcpStream::from_std(std) {
                        Ok(tcp) => conn.serve(tcp).await,
                        Err(e) => tracing::warn!(error = %e, "connection not registered"),
                    }
                }),
                Err(e) => tracing::warn!(error = %e, "connection not handed to a worker"),
            },
        }
    }
}

/// One accepted connection and what serves it.
#[derive(Clone)]
struct Connection {
    proxy: Arc<HttpProxy<Gateway>>,
    tls: Option<Arc<Acceptor>>,
    /// TLS is relayed to the backend chosen by SNI, not terminated (see `tls_passthrough`).
    tls_passthrough: bool,
    table: SharedTable,
    port: u16,
    shutdown: watch::Receiver<bool>,
    closing: watch::Receiver<bool>,
    peer: SocketAddr,
    /// Counts the connection while it lives (None in the accept loop's template).
    _guard: Option<Arc<ActiveGuard>>,
}

impl Connection {
    /// TLS if the port has it, then Pingora's keep-alive loop.
    async fn serve(mut self, tcp: tokio::net::TcpStream) {
        if self.tls_passthrough {
            crate::tls_passthrough::serve(tcp, &self.table, self.port, self.peer).await;
            return;
        }
        let stream: pingora::protocols::Stream = match &self.tls {
            None => {
                let mut conn = crate::conn::Buffered::new(tcp, self.peer);
                let next = crate::passthrough::serve(
                    &mut conn,
                    &self.table,
                    self.port,
                    self.peer,
                    &mut self.closing,
                    &self.shutdown,
                )
                .await;
                match next {
                    crate::passthrough::Next::Closed => return,
                    crate::passthrough::Next::Pingora => Box::new(conn),
                }
            }
            Some(acceptor) => match acceptor.tls_handshake(l4_stream(tcp, self.peer)).await {
                Ok(s) => Box::new(s),
                Err(e) => {
                    tracing::debug!(error = %e, "TLS handshake failed");
                    return;
                }
            },
        };
        // Pingora runs the keep-alive loop itself; `cleanup()` ends idle connections.
        let mut next = Some(stream);
        while let Some(s) = next.take() {
            next = self.proxy.process_new(s, &self.shutdown).await;
        }
    }
}
