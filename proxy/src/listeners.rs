//! Listeners that follow the snapshot: one accept loop per port, and what serves each
//! accepted connection.
//!
//! Pingora's `Server` binds its listeners once at start-up, but a snapshot can add or drop
//! ports at any time. So the proxy runs its own accept loops (started and stopped as
//! snapshots change), caps the connections open at once, and serves each connection by its
//! port's protocol: relayed (TLS routed by SNI, passed through or terminated; TCP), or HTTP
//! over TLS or in clear. HTTP/2 (by ALPN or prior
//! knowledge) is Pingora's; on HTTP/1 connections every request head is read here under the
//! head deadline and then served by the fast path or Pingora.

use crate::conn::Buffered;
use crate::fastpath::{self, Next};
use crate::handler::Gateway;
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::router::Binding;
use crate::table::SharedTable;
use crate::workers::Workers;
use coxswain_api::snapshot as snap;
use pingora::apps::{HttpServerApp, HttpServerOptions, ServerApp};
use pingora::listeners::tls::Acceptor;
use pingora::protocols::http::ServerSession;
use pingora::protocols::{ALPN, Ssl};
use pingora::proxy::HttpProxy;
use pingora::server::configuration::ServerConf;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinHandle;

/// Counts a connection while it lives, and holds its place under the connection limit.
struct ActiveGuard {
    active: Arc<AtomicUsize>,
    _permit: OwnedSemaphorePermit,
}

impl ActiveGuard {
    fn new(active: Arc<AtomicUsize>, permit: OwnedSemaphorePermit) -> Self {
        active.fetch_add(1, Ordering::Relaxed);
        Self {
            active,
            _permit: permit,
        }
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.active.fetch_sub(1, Ordering::Relaxed);
    }
}

fn table_active(table: &SharedTable) -> Arc<AtomicUsize> {
    table.metrics().active_connections.clone()
}

struct Running {
    binding: Binding,
    /// The accept loops (one per connection worker), or a UDP port's receive loop (which
    /// holds its flows).
    accept: Vec<JoinHandle<()>>,
    /// None on UDP ports.
    proxy: Option<Arc<HttpProxy<Gateway>>>,
    /// Tells fast-path connections idling between requests to close.
    closing: watch::Sender<bool>,
}

impl Running {
    /// Stops accepting, and wakes connections idling between keep-alive requests so they
    /// close; requests in flight finish. A UDP port's flows end at once.
    async fn stop(self) {
        for task in &self.accept {
            task.abort();
        }
        // The socket closes when the aborted tasks are dropped, which their runtimes do later:
        // wait for it, or a snapshot that gives the port back at once (a Gateway's internal
        // port freed and allocated again) finds it still in use and cannot bind it.
        for task in self.accept {
            let _ = task.await;
        }
        let _ = self.closing.send(true);
        if let Some(proxy) = self.proxy {
            proxy.cleanup().await;
        }
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
    limits: Arc<Limits>,
    /// One per connection open, shared by every port.
    permits: Arc<Semaphore>,
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
            conf: Arc::new(pingora_conf()),
            running: HashMap::new(),
            shutdown,
            workers: None,
            limits: Arc::new(Limits::default()),
            permits: Arc::new(Semaphore::new(Limits::default().max_connections)),
        }
    }

    /// Serves connections under these limits (call before the first `sync`).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
        if let Some(tracer) = &limits.tracer {
            let _ = self.table.metrics().trace.set(tracer.counters().clone());
        }
        self.limits = Arc::new(limits);
        self
    }

    /// Accepts and runs connections on these workers rather than on the caller's runtime.
    pub fn with_workers(mut self, workers: Workers) -> Self {
        self.workers = Some(workers);
        self
    }

    /// Connections open right now (for draining).
    pub fn active_connections(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Binds ports the current table has and this set does not, and closes ports it dropped.
    /// Returns the errors of ports that could not be bound (also counted in the
    /// `listeners_unbound` gauge); the others are served regardless, and the next `sync`
    /// tries the failed ones again.
    pub async fn sync(&mut self) -> Vec<ListenError> {
        let wanted: HashMap<u16, Binding> = self.table.load().router.ports().collect();
        // Ports no longer asked for, and ports bound for something else now (bound again
        // below).
        let dropped: Vec<u16> = self
            .running
            .iter()
            .filter(|(p, r)| wanted.get(p) != Some(&r.binding))
            .map(|(p, _)| *p)
            .collect();
        for port in dropped {
            if let Some(r) = self.running.remove(&port) {
                r.stop().await;
                tracing::info!(port, "listener closed");
            }
        }
        let mut errors = Vec::new();
        for (port, binding) in wanted {
            if self.running.contains_key(&port) {
                continue;
            }
            let protocol = binding.protocol;
            let addr = SocketAddr::new(self.bind_ip, port);
            if protocol == snap::Protocol::Udp {
                match tokio::net::UdpSocket::bind(addr).await {
                    Ok(socket) => {
                        let (closing, _) = watch::channel(false);
                        let receive = tokio::spawn(crate::relay::udp::serve(
                            socket,
                            self.table.clone(),
                            port,
                        ));
                        tracing::info!(port, ?protocol, "listener bound");
                        self.running.insert(
                            port,
                            Running {
                                binding,
                                accept: vec![receive],
                                proxy: None,
                                closing,
                            },
                        );
                    }
                    Err(source) => errors.push(ListenError::Bind { addr, source }),
                }
                continue;
            }
            match TcpListener::bind(addr).await {
                Ok(listener) => {
                    let https = protocol == snap::Protocol::Https;
                    let relay = match protocol {
                        snap::Protocol::Tls => Some(crate::relay::Relay::Tls(Arc::new(
                            crate::relay::Terminator {
                                acceptor: self.acceptor(port, false),
                                handshake: self.limits.tls_handshake,
                            },
                        ))),
                        snap::Protocol::Tcp => Some(crate::relay::Relay::Tcp),
                        _ => None,
                    };
                    let proxy = self.proxy_for(port, binding.public_port, https);
                    let (closing, closed) = watch::channel(false);
                    let template = Connection {
                        proxy: proxy.clone(),
                        tls: https.then(|| self.acceptor(port, true)),
                        relay,
                        table: self.table.clone(),
                        limits: self.limits.clone(),
                        port,
                        public_port: binding.public_port,
                        shutdown: self.shutdown.clone(),
                        closing: closed,
                        peer: SocketAddr::new(self.bind_ip, 0),
                        _guard: None,
                    };
                    let admission = Admission {
                        active: self.active.clone(),
                        permits: self.permits.clone(),
                        metrics: self.table.metrics().clone(),
                    };
                    let accept = match &self.workers {
                        None => vec![tokio::spawn(accept_loop(listener, template, admission))],
                        Some(workers) => match listener.into_std() {
                            Ok(shared) => {
                                accept_on_workers(workers, &shared, &template, &admission)
                            }
                            Err(source) => {
                                errors.push(ListenError::Bind { addr, source });
                                continue;
                            }
                        },
                    };
                    tracing::info!(port, ?protocol, "listener bound");
                    self.running.insert(
                        port,
                        Running {
                            binding,
                            accept,
                            proxy: Some(proxy),
                            closing,
                        },
                    );
                }
                Err(source) => errors.push(ListenError::Bind { addr, source }),
            }
        }
        self.table
            .metrics()
            .listeners_unbound
            .store(errors.len(), Ordering::Relaxed);
        errors
    }

    /// Ports the table asks for that the last `sync` could not bind.
    pub fn unbound(&self) -> usize {
        self.table
            .metrics()
            .listeners_unbound
            .load(Ordering::Relaxed)
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

    fn proxy_for(&self, port: u16, public_port: u16, https: bool) -> Arc<HttpProxy<Gateway>> {
        let mut proxy = pingora::proxy::http_proxy(
            &self.conf,
            Gateway {
                port,
                public_port,
                https,
                table: self.table.clone(),
                limits: self.limits.clone(),
            },
        );
        let mut options = HttpServerOptions::default();
        // Plaintext HTTP/2 with prior knowledge, detected from the connection preface.
        options.h2c = true;
        proxy.server_options = Some(options);
        Arc::new(proxy)
    }

    /// The TLS acceptor of `port`; `http` offers HTTP/2 and HTTP/1.1 by ALPN.
    fn acceptor(&self, port: u16, http: bool) -> Arc<Acceptor> {
        // Pingora's settings (TLS 1.2 and 1.3, ring) with our certificate resolver, and a
        // callback that keeps the connection's SNI for the HTTP layer (misdirected requests).
        let mut settings = pingora::listeners::tls::TlsSettings::with_callbacks(Box::new(
            crate::tls_accept::KeepSni {
                port,
                table: self.table.clone(),
            },
        ))
        .unwrap_or_else(|e| panic!("TLS settings without files cannot fail: {e}"));
        settings.set_cert_resolver(Arc::new(SniResolver {
            port,
            table: self.table.clone(),
        }));
        // Client certificates as the current snapshot asks for them on this port (none, valid
        // only, or with insecure fallback): decided at each handshake.
        settings.set_client_cert_verifier(Arc::new(crate::tls_accept::PortVerifier {
            port,
            table: self.table.clone(),
        }));
        if http {
            settings.set_alpn(ALPN::H2H1);
        }
        Arc::new(settings.build())
    }
}

/// Idle upstream connections Pingora keeps per listener port, over all backends and workers.
/// Its default of 128 is less than one HTTP/2 client can have in flight (100 streams), so
/// under HTTP/2 load most connections to the backend were closed after one response and
/// another opened for the next request.
const PINGORA_IDLE_UPSTREAMS: usize = 1024;

/// Pingora's settings: its defaults but for the upstream keep-alive pool.
fn pingora_conf() -> ServerConf {
    ServerConf {
        upstream_keepalive_pool_size: PINGORA_IDLE_UPSTREAMS,
        ..ServerConf::default()
    }
}

/// What a connection needs to be let in: a permit under the connection limit, and a place
/// in the active count.
#[derive(Clone)]
struct Admission {
    active: Arc<AtomicUsize>,
    permits: Arc<Semaphore>,
    metrics: Arc<Metrics>,
}

impl Admission {
    /// A permit, waiting (and counting the wait) when the limit is reached.
    async fn permit(&self) -> Option<OwnedSemaphorePermit> {
        match self.permits.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                Metrics::count(&self.metrics.connection_limit_waits);
                tracing::warn!("connection limit reached; new connections wait");
                self.permits.clone().acquire_owned().await.ok()
            }
        }
    }
}

/// Each worker accepts on the port for itself, from its own registration of the one
/// listening socket, and serves what it accepts: a connection starts on the thread that
/// will serve it. Accepted on one thread and handed to another, each new connection cost two
/// more epoll_ctl calls, an eventfd write and a wake-up of the other thread; with one request
/// per connection (new TLS clients) the handover's latency left a third of the worker idle.
fn accept_on_workers(
    workers: &Workers,
    shared: &std::net::TcpListener,
    template: &Connection,
    admission: &Admission,
) -> Vec<JoinHandle<()>> {
    workers.spawn_on_each(|| {
        let listener = shared.try_clone();
        let (template, admission) = (template.clone(), admission.clone());
        async move {
            let registered = listener.and_then(TcpListener::from_std);
            match registered {
                Ok(listener) => accept_loop(listener, template, admission).await,
                Err(e) => tracing::error!(error = %e, "a worker cannot accept on the port"),
            }
        }
    })
}

/// Accepts connections and serves them on the runtime that accepts them; `template` is what
/// each one is served with.
async fn accept_loop(listener: TcpListener, template: Connection, admission: Admission) {
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
        // At the limit, this connection waits unserved and no other is accepted on this
        // port: the rest stay in the kernel's backlog. (A permit is not held across the
        // accept, so idle ports do not use up the limit.)
        let Some(permit) = admission.permit().await else {
            return;
        };
        let _ = tcp.set_nodelay(true);
        let conn = Connection {
            peer,
            _guard: Some(Arc::new(ActiveGuard::new(admission.active.clone(), permit))),
            ..template.clone()
        };
        tokio::spawn(conn.serve(tcp));
    }
}

/// One accepted connection and what serves it.
#[derive(Clone)]
struct Connection {
    proxy: Arc<HttpProxy<Gateway>>,
    tls: Option<Arc<Acceptor>>,
    /// TLS and TCP ports: connections are relayed to a backend, not read as HTTP (see
    /// `relay`).
    relay: Option<crate::relay::Relay>,
    table: SharedTable,
    limits: Arc<Limits>,
    port: u16,
    /// The port clients addressed (see `router::Binding`).
    public_port: u16,
    shutdown: watch::Receiver<bool>,
    closing: watch::Receiver<bool>,
    peer: SocketAddr,
    /// Counts the connection while it lives (None in the accept loop's template).
    _guard: Option<Arc<ActiveGuard>>,
}

impl Connection {
    /// A connection's task holds this future, as large as its largest state, for as long as
    /// the connection lives. The one-off steps with large states (PROXY header, passthrough
    /// relay, TLS handshake) are boxed, so an idle keep-alive connection does not carry them.
    async fn serve(mut self, mut tcp: tokio::net::TcpStream) {
        if self.limits.client_address.proxy_protocol {
            // The load balancer's header names the client; without it, the connection's
            // peer would be mistaken for one.
            let header = tokio::time::timeout(
                self.limits.request_head,
                Box::pin(crate::proxy_protocol::read(&mut tcp)),
            )
            .await;
            match header {
                Ok(Ok(h)) => self.peer = h.client(self.peer),
                Ok(Err(e)) => {
                    Metrics::count(&self.table.metrics().proxy_protocol_refused);
                    tracing::debug!(peer = %self.peer, error = %e, "connection closed");
                    return;
                }
                Err(_) => {
                    Metrics::count(&self.table.metrics().proxy_protocol_refused);
                    tracing::debug!(peer = %self.peer, "PROXY protocol header deadline passed");
                    return;
                }
            }
        }
        if let Some(relay) = &self.relay {
            Box::pin(crate::relay::serve(
                tcp,
                &self.table,
                self.port,
                self.peer,
                relay,
                self.limits.relay_idle,
            ))
            .await;
            return;
        }
        match self.tls.clone() {
            None => {
                let conn = Buffered::new(tcp, self.peer)
                    .bounding_sends(self.limits.client_send, self.table.metrics().clone());
                self.serve_http1(conn).await;
            }
            Some(acceptor) => {
                let handshake =
                    Box::pin(acceptor.tls_handshake(crate::conn::l4_stream(tcp, self.peer)));
                // Boxed at once: a future keeps room for a local that was ever borrowed, even
                // after it moved, and this one is 4.7 KB.
                let stream = match tokio::time::timeout(self.limits.tls_handshake, handshake).await
                {
                    Ok(Ok(s)) => Box::new(s),
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        Metrics::count(&self.table.metrics().tls_handshake_timeouts);
                        tracing::debug!(peer = %self.peer, "TLS handshake deadline passed");
                        return;
                    }
                };
                if matches!(stream.selected_alpn_proto(), Some(ALPN::H2)) {
                    self.serve_h2(stream).await;
                } else {
                    let conn = Buffered::tls(stream)
                        .bounding_sends(self.limits.client_send, self.table.metrics().clone());
                    self.serve_http1(conn).await;
                }
            }
        }
    }

    /// HTTP/1, cleartext or over TLS: each request head is read by `fastpath`, which serves it
    /// or hands that one request to Pingora; the connection then comes back for the next head.
    async fn serve_http1(&mut self, mut conn: Buffered) {
        // What the TLS handshake told (`tls_accept::KeepSni`): the name the client asked for,
        // and whether its session lacks a client certificate the port now requires.
        let digest = conn.get_ssl_digest();
        let tls = digest
            .as_ref()
            .and_then(|d| d.extension.get::<crate::tls::ConnectionTls>());
        let sni = tls.and_then(|t| t.sni.as_deref());
        let client_cert_refused = tls.is_some_and(|t| t.client_cert_refused);
        let https = self.tls.is_some();
        let mut first = true;
        loop {
            let next = {
                let mut env = fastpath::Env {
                    table: &self.table,
                    limits: &self.limits,
                    port: self.port,
                    public_port: self.public_port,
                    peer: self.peer,
                    https,
                    sni,
                    client_cert_refused,
                    closing: &mut self.closing,
                    shutdown: &self.shutdown,
                };
                fastpath::serve(&mut conn, &mut env, first).await
            };
            first = false;
            match next {
                Next::Closed => return,
                Next::H2c => {
                    // HTTP/2 with prior knowledge (its preface put back).
                    self.serve_h2(Box::new(conn)).await;
                    return;
                }
                Next::Pingora => {
                    // One request through Pingora; the connection comes back for the next.
                    let mut abandoned = conn.lend();
                    let mut session = ServerSession::new_http1(Box::new(conn));
                    if !*self.shutdown.borrow() {
                        session.set_keepalive(Some(self.limits.keepalive_idle.as_secs().max(1)));
                    }
                    let Some(reused) = self.proxy.process_new_http(session, &self.shutdown).await
                    else {
                        // Pingora ended the connection, its client perhaps still sending.
                        if let Ok(io) = abandoned.try_recv() {
                            io.close().await;
                        }
                        return;
                    };
                    let (stream, _) = reused.consume();
                    match stream.into_any().downcast::<Buffered>() {
                        Ok(b) => {
                            conn = *b;
                            conn.returned();
                        }
                        Err(_) => return,
                    }
                }
            }
        }
    }
}

impl Connection {
    /// HTTP/2, over TLS or with prior knowledge: `fastpath::h2` reads every stream and
    /// forwards it or hands it to Pingora.
    async fn serve_h2(&mut self, io: pingora::protocols::Stream) {
        let digest = io.get_ssl_digest();
        let tls = digest
            .as_ref()
            .and_then(|d| d.extension.get::<crate::tls::ConnectionTls>());
        let env = fastpath::Env {
            table: &self.table,
            limits: &self.limits,
            port: self.port,
            public_port: self.public_port,
            peer: self.peer,
            https: self.tls.is_some(),
            sni: tls.and_then(|t| t.sni.as_deref()),
            client_cert_refused: tls.is_some_and(|t| t.client_cert_refused),
            closing: &mut self.closing,
            shutdown: &self.shutdown,
        };
        // Boxed: an HTTP/2 connection's state is not carried by every HTTP/1 one.
        Box::pin(fastpath::h2::serve(io, &env, &self.proxy)).await;
    }
}

/// rustls' certificate callback for one listener port, reading the current table.
#[derive(Debug)]
struct SniResolver {
    port: u16,
    table: SharedTable,
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let table = self.table.load();
        table.tls.port(self.port)?.resolve(hello.server_name())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion
    use super::*;
    use crate::table::Table;
    use coxswain_api::snapshot::{Listener, Snapshot};

    fn table_with(table: &SharedTable, ports: &[u16]) {
        let snapshot = Snapshot {
            listeners: ports
                .iter()
                .map(|&p| Listener {
                    port: u32::from(p),
                    protocol: snap::Protocol::Http as i32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
        .seal();
        table.store(Table::build(&snapshot, table.metrics()).unwrap());
    }

    #[tokio::test]
    async fn a_port_dropped_and_asked_for_again_at_once_is_bound_again() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let (_stop, shutdown) = watch::channel(false);
        let table = SharedTable::default();
        let mut listeners = Listeners::new(table.clone(), [127, 0, 0, 1].into(), shutdown);
        table_with(&table, &[port]);
        assert!(listeners.sync().await.is_empty());
        table_with(&table, &[]);
        assert!(listeners.sync().await.is_empty());
        assert!(listeners.ports().is_empty());
        table_with(&table, &[port]);
        let errors = listeners.sync().await;
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(listeners.ports(), vec![port]);
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
    }
}
