//! The proxy's limits on clients and backends as flags (`coxswain_proxy::limits::Limits`).

/// Deadlines and caps on client connections (`coxswain_proxy::limits::Limits`).
#[derive(Debug, Clone, clap::Args)]
pub struct ProxyLimitArgs {
    /// A request head must arrive whole within this many seconds (from its first byte).
    #[arg(
        long,
        env = "COXSWAIN_REQUEST_HEAD_TIMEOUT_SECONDS",
        default_value_t = 30
    )]
    pub request_head_timeout_seconds: u64,

    /// An idle keep-alive connection is closed after this many seconds.
    #[arg(long, env = "COXSWAIN_KEEPALIVE_TIMEOUT_SECONDS", default_value_t = 60)]
    pub keepalive_timeout_seconds: u64,

    /// A relayed TCP or TLS connection (TCPRoute, TLSRoute) is closed once no byte has moved
    /// either way for this many seconds.
    #[arg(
        long,
        env = "COXSWAIN_RELAY_IDLE_TIMEOUT_SECONDS",
        default_value_t = 3600
    )]
    pub relay_idle_timeout_seconds: u64,

    /// A write to a client may wait this many seconds for the client to take any byte of
    /// it; then the connection ends. Restarts with progress: a slow download is not cut, a
    /// client that stopped reading is.
    #[arg(
        long,
        env = "COXSWAIN_CLIENT_SEND_TIMEOUT_SECONDS",
        default_value_t = 60
    )]
    pub client_send_timeout_seconds: u64,

    /// Each read from and write to a backend may wait this many seconds, unless the route
    /// sets timeouts of its own: 504 before the answer began, the connection ended after.
    #[arg(long, env = "COXSWAIN_UPSTREAM_TIMEOUT_SECONDS", default_value_t = 60)]
    pub upstream_timeout_seconds: u64,

    /// Opening a connection to a backend may take this many milliseconds, unless the route
    /// sets its own connect timeout; then the request tries another endpoint.
    #[arg(
        long,
        env = "COXSWAIN_UPSTREAM_CONNECT_TIMEOUT_MS",
        default_value_t = 5000
    )]
    pub upstream_connect_timeout_ms: u64,

    /// A TLS handshake must finish within this many seconds of accept.
    #[arg(
        long,
        env = "COXSWAIN_TLS_HANDSHAKE_TIMEOUT_SECONDS",
        default_value_t = 10
    )]
    pub tls_handshake_timeout_seconds: u64,

    /// Client connections open at once; more wait in the listen backlog.
    #[arg(long, env = "COXSWAIN_MAX_CONNECTIONS", default_value_t = 16_384)]
    pub max_connections: usize,

    /// Header fields one request may carry (431 past it).
    #[arg(long, env = "COXSWAIN_MAX_REQUEST_HEADERS", default_value_t = 100)]
    pub max_request_headers: usize,

    /// Bytes of header fields one request may carry (431 past it).
    #[arg(long, env = "COXSWAIN_MAX_REQUEST_HEADER_BYTES", default_value_t = 32 * 1024)]
    pub max_request_header_bytes: usize,

    /// Each HTTP/2 stream's receive window in bytes: how much of a request body a client
    /// may send ahead of its backend. One upload moves at most this much per round trip.
    #[arg(
        long,
        env = "COXSWAIN_HTTP2_STREAM_WINDOW_BYTES",
        default_value_t = 256 << 10,
        value_parser = clap::value_parser!(u32).range(16_384..=i32::MAX as i64)
    )]
    pub http2_stream_window_bytes: u32,

    /// Each HTTP/2 connection's receive window in bytes: the most request body of all its
    /// streams the proxy holds at once, so the memory one connection's uploads can take.
    #[arg(
        long,
        env = "COXSWAIN_HTTP2_CONNECTION_WINDOW_BYTES",
        default_value_t = 1 << 20,
        value_parser = clap::value_parser!(u32).range(65_535..=i32::MAX as i64)
    )]
    pub http2_connection_window_bytes: u32,

    /// Serve every request through Pingora, never the fast path.
    #[arg(long, env = "COXSWAIN_NO_FAST_PATH")]
    pub no_fast_path: bool,

    /// Address blocks (comma-separated, e.g. 10.0.0.0/8,2001:db8::/32) of load balancers and
    /// proxies in front of this one whose X-Forwarded-For, -Proto, -Host and -Port are
    /// believed. From any other peer those fields are replaced. Default: none.
    #[arg(
        long,
        env = "COXSWAIN_TRUSTED_PROXIES",
        value_delimiter = ',',
        value_parser = parse_cidr
    )]
    pub trusted_proxies: Vec<String>,

    /// Every connection starts with a PROXY protocol v1 or v2 header (the listeners are
    /// behind an L4 load balancer that sends one); connections without one are closed.
    #[arg(long, env = "COXSWAIN_PROXY_PROTOCOL")]
    pub proxy_protocol: bool,

    /// A backend endpoint that fails this many requests in a row (refused connections, 5xx
    /// answers) is taken out of rotation; 0 turns ejection off.
    #[arg(
        long,
        env = "COXSWAIN_OUTLIER_CONSECUTIVE_FAILURES",
        default_value_t = 5
    )]
    pub outlier_consecutive_failures: u32,

    /// How long a first ejection lasts, in seconds; the n-th lasts n times as long (at most
    /// 10 times).
    #[arg(long, env = "COXSWAIN_OUTLIER_EJECTION_SECONDS", default_value_t = 30)]
    pub outlier_ejection_seconds: u64,

    /// At most this share of a backend's endpoints, in percent, is ejected at once (one at
    /// least, of two or more).
    #[arg(
        long,
        env = "COXSWAIN_OUTLIER_MAX_EJECTED_PERCENT",
        default_value_t = 50,
        value_parser = clap::value_parser!(u32).range(0..=100)
    )]
    pub outlier_max_ejected_percent: u32,
}

/// One address block, checked as `--trusted-proxies` parses it.
fn parse_cidr(s: &str) -> Result<String, String> {
    coxswain_proxy::policy::AddressSet::parse(&[s])
        .map(|_| s.trim().to_owned())
        .map_err(|e| e.to_string())
}

impl ProxyLimitArgs {
    pub fn limits(&self) -> coxswain_proxy::limits::Limits {
        use std::time::Duration;
        coxswain_proxy::limits::Limits {
            request_head: Duration::from_secs(self.request_head_timeout_seconds.max(1)),
            keepalive_idle: Duration::from_secs(self.keepalive_timeout_seconds.max(1)),
            tls_handshake: Duration::from_secs(self.tls_handshake_timeout_seconds.max(1)),
            relay_idle: Duration::from_secs(self.relay_idle_timeout_seconds.max(1)),
            max_connections: self.max_connections.max(1),
            max_request_headers: self.max_request_headers.max(1),
            max_request_head_bytes: self.max_request_header_bytes.max(1024),
            upstream_idle: Duration::from_secs(60),
            upstream_connect: Duration::from_millis(self.upstream_connect_timeout_ms.max(1)),
            client_send: Duration::from_secs(self.client_send_timeout_seconds.max(1)),
            upstream_timeout: Duration::from_secs(self.upstream_timeout_seconds.max(1)),
            http2_stream_window: self.http2_stream_window_bytes,
            http2_connection_window: self.http2_connection_window_bytes,
            fast_path: !self.no_fast_path,
            client_address: coxswain_proxy::forwarded::ClientAddress {
                // Each entry was checked by `parse_cidr`.
                trusted: coxswain_proxy::policy::AddressSet::parse(&self.trusted_proxies)
                    .unwrap_or_default(),
                proxy_protocol: self.proxy_protocol,
            },
            outlier: coxswain_proxy::outlier::Settings {
                consecutive_failures: self.outlier_consecutive_failures,
                base_ejection: Duration::from_secs(self.outlier_ejection_seconds.max(1)),
                max_ejected_percent: self.outlier_max_ejected_percent,
            },
            // Started once per process by the caller (`TracingArgs::tracer`).
            tracer: None,
        }
    }
}
