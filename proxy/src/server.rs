//! The data plane: listeners that follow the snapshot, and the Pingora proxy logic.
//!
//! Pingora's `Server` binds its listeners once at start-up, but a snapshot can add or drop
//! ports at any time. So the proxy runs its own accept loops (one per port, started and
//! stopped as snapshots change) and hands each connection to a Pingora `HttpProxy`, which does
//! the HTTP work: parsing, upstream connection pooling, h2, forwarding.

use crate::filters::{self, EditHeaders, RedirectRequest};
use crate::router::{Pick, Request};
use crate::table::SharedTable;
use crate::tls::SniResolver;
use async_trait::async_trait;
use coxswain_api::snapshot::{self as snap, filter};
use pingora::apps::HttpServerOptions;
use pingora::apps::ServerApp;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::listeners::tls::Acceptor;
use pingora::prelude::{HttpPeer, ProxyHttp, Session};
use pingora::protocols::ALPN;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::server::configuration::ServerConf;
use pingora_proxy_alias::HttpProxy;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

mod mirror {
    //! RequestMirror: a copy of the request (headers, no body) sent to another backend; the
    //! answer is read and dropped, and nobody waits for it.

    use pingora::http::RequestHeader;
    use std::fmt::Write as _;
    use std::net::SocketAddr;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    pub fn send(target: SocketAddr, req: &RequestHeader) {
        let mut head = String::with_capacity(256);
        let path = req.uri.path_and_query().map_or("/", |p| p.as_str());
        let _ = write!(head, "{} {path} HTTP/1.1\r\n", req.method);
        for (name, value) in &req.headers {
            if name == "connection" || name == "content-length" || name == "transfer-encoding" {
                continue;
            }
            if let Ok(v) = value.to_str() {
                let _ = write!(head, "{name}: {v}\r\n");
            }
        }
        if req.headers.get("host").is_none()
            && let Some(a) = req.uri.authority()
        {
            let _ = write!(head, "host: {a}\r\n");
        }
        head.push_str("content-length: 0\r\nconnection: close\r\n\r\n");
        tokio::spawn(async move {
            let copy = async {
                let mut s = tokio::net::TcpStream::connect(target).await?;
                s.write_all(head.as_bytes()).await?;
                let mut sink = [0u8; 4096];
                while s.read(&mut sink).await? > 0 {}
                Ok::<_, std::io::Error>(())
            };
            if let Err(e) = tokio::time::timeout(Duration::from_secs(10), copy)
                .await
                .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
            {
                tracing::debug!(%target, error = %e, "mirror request failed");
            }
        });
    }
}

mod pingora_proxy_alias {
    pub use pingora::proxy::HttpProxy;
}

/// Per-request state: what `request_filter` decided, for the later phases.
#[derive(Default)]
pub struct Ctx {
    route: Option<Arc<snap::Route>>,
    matched_prefix: Option<Box<str>>,
    backend_filters: Vec<snap::Filter>,
    upstream: Option<SocketAddr>,
    h2c: bool,
    counters: Option<Arc<crate::metrics::RouteCounters>>,
    upstream_sent: Option<std::time::Instant>,
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
        // Decide everything from one load of the table; nothing after this reads it again.
        let decision = {
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
                    let redirect = route.route.filters.iter().find_map(|f| match &f.kind {
                        Some(filter::Kind::RequestRedirect(r)) => Some(r.clone()),
                        _ => None,
                    });
                    if let Some(r) = redirect {
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
                    } else {
                        for f in &route.route.filters {
                            if let Some(filter::Kind::RequestMirror(m)) = &f.kind
                                && route.mirror_sampled(m.numerator, m.denominator)
                                && let Some(target) =
                                    table.router.cluster(&m.cluster).and_then(|c| c.pick())
                            {
                                mirror::send(target, req);
                            }
                        }
                        match route.pick() {
                            Pick::Endpoint {
                                addr,
                                backend,
                                cluster,
                            } => {
                                ctx.route = Some(route.route.clone());
                                ctx.matched_prefix = route.matched_prefix().map(Into::into);
                                ctx.backend_filters = backend.filters.clone();
                                ctx.upstream = Some(addr);
                                ctx.h2c = cluster.app_protocol == snap::AppProtocol::H2c;
                                Decision::Forward
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
        }
    }

    /// A client that goes away mid-request is routine, not an error to log at ERROR.
    fn suppress_error_log(&self, _session: &Session, _ctx: &Ctx, error: &pingora::Error) -> bool {
        matches!(error.esource(), pingora::ErrorSource::Downstream)
    }

    async fn logging(&self, session: &mut Session, _e: Option<&pingora::Error>, ctx: &mut Ctx) {
        self.record(session, ctx);
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut Ctx,
    ) -> pingora::Result<Box<HttpPeer>> {
        let Some(addr) = ctx.upstream else {
            return Err(pingora::Error::new_str("no upstream chosen"));
        };
        let mut peer = HttpPeer::new(addr, false, String::new());
        if ctx.h2c {
            peer.options.alpn = ALPN::H2;
        }
        if let Some(t) = ctx.route.as_ref().and_then(|r| r.timeouts) {
            let backend = [t.backend_request_ms, t.request_ms]
                .into_iter()
                .filter(|ms| *ms > 0)
                .min();
            if let Some(ms) = backend {
                let d = Duration::from_millis(ms);
                peer.options.read_timeout = Some(d);
                peer.options.total_connection_timeout = Some(d);
            }
        }
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> pingora::Result<()> {
        ctx.upstream_sent = Some(std::time::Instant::now());
        let Some(route) = ctx.route.clone() else {
            return Ok(());
        };
        for f in route.filters.iter().chain(ctx.backend_filters.iter()) {
            match &f.kind {
                Some(filter::Kind::RequestHeaderModifier(m)) => {
                    filters::modify_headers(upstream, m)
                }
                Some(filter::Kind::UrlRewrite(r)) => {
                    if !r.hostname.is_empty() {
                        upstream.insert_header("host", r.hostname.as_str())?;
                    }
                    if let Some(m) = &r.path {
                        let current = upstream
                            .uri
                            .path_and_query()
                            .map_or("/", |p| p.as_str())
                            .to_owned();
                        let new = filters::rewrite_path(&current, ctx.matched_prefix.as_deref(), m);
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
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> pingora::Result<()> {
        if let Some(sent) = ctx.upstream_sent.take() {
            self.table.metrics().upstream_latency(sent.elapsed());
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
}

fn table_active(table: &SharedTable) -> Arc<AtomicUsize> {
    table.metrics().active_connections.clone()
}

struct Running {
    accept: JoinHandle<()>,
    proxy: Arc<HttpProxy<Gateway>>,
}

impl Running {
    /// Stops accepting, and wakes connections idling between keep-alive requests so they
    /// close; requests in flight finish.
    async fn stop(self) {
        self.accept.abort();
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
        }
    }

    /// Connections open right now (for draining).
    pub fn active_connections(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Binds ports the current table has and this set does not, and closes ports it dropped.
    /// Returns the errors of ports that could not be bound; the others are served regardless.
    pub async fn sync(&mut self) -> Vec<ListenError> {
        let wanted: HashMap<u16, snap::Protocol> = self.table.load().router.ports().collect();
        let dropped: Vec<u16> = self
            .running
            .keys()
            .filter(|p| !wanted.contains_key(p))
            .copied()
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
                    let proxy = self.proxy_for(port, https);
                    let accept = tokio::spawn(accept_loop(
                        listener,
                        proxy.clone(),
                        https.then(|| self.acceptor(port)),
                        self.shutdown.clone(),
                        self.active.clone(),
                    ));
                    tracing::info!(port, https, "listener bound");
                    self.running.insert(port, Running { accept, proxy });
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

async fn accept_loop(
    listener: TcpListener,
    proxy: Arc<HttpProxy<Gateway>>,
    tls: Option<Arc<Acceptor>>,
    shutdown: watch::Receiver<bool>,
    active: Arc<AtomicUsize>,
) {
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let proxy = proxy.clone();
        let tls = tls.clone();
        let shutdown = shutdown.clone();
        let guard = ActiveGuard::new(active.clone());
        tokio::spawn(async move {
            let _guard = guard;
            let stream = L4Stream::from(tcp);
            let stream: pingora::protocols::Stream = match tls {
                None => Box::new(stream),
                Some(acceptor) => match acceptor.tls_handshake(stream).await {
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
                next = proxy.process_new(s, &shutdown).await;
            }
        });
    }
}
