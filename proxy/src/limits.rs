//! Deadlines and caps that keep slow or greedy clients from holding the proxy's resources,
//! and what the proxy believes about who a client is. Every wait on a client is one of these
//! deadlines; none restarts when a byte arrives.

use std::time::Duration;

/// The proxy's limits on client connections, with production defaults.
#[derive(Debug, Clone)]
pub struct Limits {
    /// A request head must arrive whole within this, counted from its first byte (from
    /// accept for a connection's first request): a client sending one header line now and
    /// then does not keep a request open.
    pub request_head: Duration,
    /// A keep-alive connection may wait this long for its next request.
    pub keepalive_idle: Duration,
    /// A TLS handshake must finish within this, counted from accept.
    pub tls_handshake: Duration,
    /// A relayed TCP or TLS connection (TCPRoute, TLSRoute) is closed once no byte has moved
    /// either way for this long: there are no requests to time out, and a peer that goes
    /// silent would otherwise hold its connection and backend socket forever.
    pub relay_idle: Duration,
    /// Client connections open at once; past it, new ones wait in the listen backlog and
    /// `coxswain_proxy_connection_limit_waits_total` counts each time it was hit.
    pub max_connections: usize,
    /// Header fields one request may have (431 past it).
    pub max_request_headers: usize,
    /// Bytes of header fields one request may have (431 past it).
    pub max_request_head_bytes: usize,
    /// An idle pooled connection to a backend is closed after this long (the fast path's
    /// pool is swept, so sockets to Pods that went away do not stay open).
    pub upstream_idle: Duration,
    /// A write to a client may wait this long for the client to take any of its bytes; then
    /// the connection ends. Unlike the deadlines above it restarts with progress, as nginx's
    /// `send_timeout` does: a large download to a slow client is not cut, one to a client
    /// that stopped reading (its receive window shut) is.
    pub client_send: Duration,
    /// Each read from a backend (the answer's head, each part of its body) and each write to
    /// it may wait this long, unless the route sets timeouts of its own (Gateway API
    /// `timeouts`, Ingress `proxy-read-timeout`/`proxy-send-timeout`). Past it, a request
    /// whose answer has not begun gets 504; one whose answer was streaming ends its
    /// connection. A backend that accepts and then says nothing otherwise holds the request,
    /// its client and a backend connection for as long as TCP keeps the socket.
    pub upstream_timeout: Duration,
    /// Opening a connection to a backend may take this long, unless the route says otherwise
    /// (Ingress proxy-connect-timeout): a vanished Pod's address can swallow connection
    /// attempts for minutes, and the request should move to another endpoint instead.
    pub upstream_connect: Duration,
    /// Each HTTP/2 stream's receive window: how much of a request's body a client may send
    /// ahead of its backend taking it. One upload moves at most this much per round trip.
    pub http2_stream_window: u32,
    /// An HTTP/2 connection's receive window: the most request body of all its streams
    /// together that the proxy holds for backends that have not taken it yet, so a client's
    /// connection costs at most this much memory for uploads however many streams it
    /// opens. The same bounds apply to answers relayed from Pingora that wait for the
    /// client's windows.
    pub http2_connection_window: u32,
    /// Plain HTTP/1.1 requests on routes that only forward take the fast path; off, every
    /// request goes through Pingora (for comparing the two, and as an escape hatch).
    pub fast_path: bool,
    /// Which peers may say who the client is, and whether connections start with a PROXY
    /// protocol header (`forwarded`).
    pub client_address: crate::forwarded::ClientAddress,
    /// When a failing backend endpoint is taken out of rotation (`outlier`).
    pub outlier: crate::outlier::Settings,
    /// Records request spans and sends `traceparent` upstream; None: tracing is off
    /// (`trace`).
    pub tracer: Option<std::sync::Arc<crate::trace::Tracer>>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            request_head: Duration::from_secs(30),
            keepalive_idle: Duration::from_secs(60),
            tls_handshake: Duration::from_secs(10),
            relay_idle: Duration::from_secs(3600),
            max_connections: 16_384,
            max_request_headers: 100,
            max_request_head_bytes: 32 * 1024,
            upstream_idle: Duration::from_secs(60),
            upstream_connect: Duration::from_secs(5),
            client_send: Duration::from_secs(60),
            upstream_timeout: Duration::from_secs(60),
            http2_stream_window: 256 << 10,
            http2_connection_window: 1 << 20,
            fast_path: true,
            client_address: crate::forwarded::ClientAddress::default(),
            outlier: crate::outlier::Settings::default(),
            tracer: None,
        }
    }
}
