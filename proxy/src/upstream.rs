//! Upstreams: clusters with their endpoints, TLS to backends, and the fast path's pool of
//! idle upstream connections.

use crate::balance::{self, Balance, HashSource};
use crate::outlier::{self, ClusterHealth, EndpointHealth};
use crate::upstream_tls::Connect;
use coxswain_api::snapshot as snap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A cluster with its endpoints parsed and split by whether they take new requests.
#[derive(Debug)]
pub struct ClusterState {
    pub name: Box<str>,
    pub app_protocol: snap::AppProtocol,
    /// SNI for TLS to this cluster: the Service's DNS name ("svc.ns.svc") for a
    /// "ns/svc:port" cluster.
    pub tls_name: Box<str>,
    endpoints: Vec<SocketAddr>,
    /// Each endpoint's outlier record, by the same index.
    health: Vec<Arc<EndpointHealth>>,
    /// Indices of ready endpoints.
    ready: Vec<usize>,
    /// Serving but terminating: used only when nothing is ready (EndpointSlice semantics).
    fallback: Vec<usize>,
    next: AtomicUsize,
    outliers: Arc<ClusterHealth>,
    /// Round robin, least request or a hash ring (the cluster's load balancer).
    balance: Balance,
    /// Each endpoint's stable name (`balance::endpoint_id`), for session persistence.
    ids: Vec<u64>,
    /// BackendTLSPolicy: verified TLS to this cluster.
    pub backend_tls: Option<Arc<BackendTls>>,
    /// The cluster's encoding it was built from (a copy: a slice would keep the whole
    /// snapshot it came in alive for as long as tables keep this state), to tell whether the
    /// next snapshot's cluster is the same without decoding it.
    encoded: Box<[u8]>,
    /// The cluster names a client certificate, which lives outside the cluster.
    names_client_certificate: bool,
}

/// TLS to a backend as a BackendTLSPolicy asks: certificates verified for `hostname`, or for
/// one of the policy's subjectAltNames.
#[derive(Debug)]
pub struct BackendTls {
    pub hostname: Box<str>,
    /// None: the proxy's built-in roots.
    pub ca: Option<Arc<pingora::protocols::tls::CaType>>,
    /// Requests are refused (the policy has no usable CA, or its CA did not parse here).
    pub refuse: bool,
    /// Tells pooled connections verified against one set of CAs from another's: Pingora's
    /// pool key covers the address, SNI and whether to verify, but not what against.
    pub pool_key: u64,
    /// For request mirrors, which do not go through Pingora: the same verification. None
    /// (built-in roots, or refused): mirrors to this cluster are not sent.
    pub mirror: Option<crate::mirror::TlsTo>,
    /// subjectAltNames: Pingora gets a connection the proxy opened and verified itself
    /// (`upstream_tls`), as its own connector checks only the SNI's name.
    /// (HTTP/1.1, h2).
    pub connect: Option<(Arc<Connect>, Arc<Connect>)>,
    /// Presented when the backend asks for a client certificate (already part of `connect`'s
    /// and `mirror`'s configs; Pingora's connector gets it with each peer).
    pub client: Option<Arc<ClientCert>>,
}

/// The key pair a proxy presents to backends that ask for a client certificate (the Gateway's
/// `spec.tls.backend.clientCertificateRef`), parsed once per snapshot for every way TLS to a
/// backend is opened: Pingora's connector, the proxy's own (subjectAltNames) and mirrors.
#[derive(Debug)]
pub struct ClientCert {
    pub name: Box<str>,
    /// For Pingora's connector (`HttpPeer::client_cert_key`).
    cert_key: Arc<pingora::utils::tls::CertKey>,
    chain: Vec<rustls_pki_types::CertificateDer<'static>>,
    key: rustls_pki_types::PrivateKeyDer<'static>,
}

impl ClientCert {
    /// Parses a snapshot certificate. Everything Pingora would parse again (and panic on) is
    /// checked here first.
    pub fn parse(c: &snap::Certificate) -> Result<Self, String> {
        use rustls_pki_types::pem::PemObject;
        let chain = rustls_pki_types::CertificateDer::pem_slice_iter(c.cert_chain_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("certificate chain: {e}"))?;
        if chain.is_empty() {
            return Err("no certificate in the chain".into());
        }
        if chain
            .iter()
            .any(|d| x509_parser::parse_x509_certificate(d).is_err())
        {
            return Err("a certificate is not valid X.509".into());
        }
        let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(c.private_key_pem.as_bytes())
            .map_err(|e| format!("private key: {e}"))?;
        let key_der = key.secret_der().to_vec();
        // Pingora turns these bytes back into a key and unwraps the result.
        rustls_pki_types::PrivateKeyDer::try_from(key_der.clone())
            .map_err(|e| format!("private key: {e}"))?;
        rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| format!("private key: {e}"))?;
        let cert_key = Arc::new(pingora::utils::tls::CertKey::new(
            chain.iter().map(|d| d.to_vec()).collect(),
            key_der,
        ));
        Ok(Self {
            name: c.name.as_str().into(),
            cert_key,
            chain,
            key,
        })
    }

    /// The client config's last step: present this key pair.
    fn finish(
        &self,
        builder: rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>,
    ) -> Result<rustls::ClientConfig, String> {
        builder
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| format!("client certificate {}: {e}", self.name))
    }
}

/// A client config's last step: the Gateway's client certificate, or none.
fn client_auth(
    builder: rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>,
    client: Option<&ClientCert>,
) -> Result<rustls::ClientConfig, String> {
    match client {
        Some(c) => c.finish(builder),
        None => Ok(builder.with_no_client_auth()),
    }
}

/// The snapshot's client certificates that clusters name, parsed (or why not).
pub type ClientCerts = std::collections::HashMap<Box<str>, Result<Arc<ClientCert>, String>>;

/// Parses the certificates `clusters` present to their backends (the snapshot's clusters that
/// are built anew: one that names a certificate always is).
pub fn client_certs(clusters: &[snap::Cluster], certificates: &[snap::Certificate]) -> ClientCerts {
    let named: std::collections::HashSet<&str> = clusters
        .iter()
        .filter_map(|c| c.tls.as_ref())
        .map(|t| t.client_certificate.as_str())
        .filter(|n| !n.is_empty())
        .collect();
    if named.is_empty() {
        return ClientCerts::new();
    }
    certificates
        .iter()
        .filter(|c| named.contains(c.name.as_str()))
        .map(|c| (c.name.as_str().into(), ClientCert::parse(c).map(Arc::new)))
        .collect()
}

impl BackendTls {
    fn new(t: &snap::BackendTls, clients: &ClientCerts) -> Self {
        use coxswain_api::snapshot::subject_alt_name::Kind;
        let pool_key = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (&t.ca_pem, t.system_roots, &t.client_certificate).hash(&mut h);
            for san in &t.subject_alt_names {
                match &san.kind {
                    Some(Kind::Hostname(n)) => (1u8, n).hash(&mut h),
                    Some(Kind::Uri(u)) => (2u8, u).hash(&mut h),
                    None => 0u8.hash(&mut h),
                }
            }
            h.finish()
        };
        let refused = Self {
            hostname: t.hostname.as_str().into(),
            ca: None,
            refuse: true,
            pool_key,
            mirror: None,
            connect: None,
            client: None,
        };
        let refuse = |why: &str| {
            tracing::warn!(hostname = %t.hostname, why, "backend TLS settings unusable; requests are refused");
            Self {
                hostname: t.hostname.as_str().into(),
                ca: None,
                refuse: true,
                pool_key,
                mirror: None,
                connect: None,
                client: None,
            }
        };
        // With subjectAltNames, `refuse` is only there for proxies that do not know them.
        if t.refuse && t.subject_alt_names.is_empty() {
            return refused;
        }
        if t.hostname.is_empty() {
            return refuse("no hostname to verify");
        }
        let client = match clients.get(t.client_certificate.as_str()) {
            _ if t.client_certificate.is_empty() => None,
            Some(Ok(c)) => Some(c.clone()),
            Some(Err(why)) => return refuse(&format!("client certificate: {why}")),
            None => return refuse("the client certificate is not in the snapshot"),
        };
        if t.system_roots && t.subject_alt_names.is_empty() {
            return Self {
                hostname: t.hostname.as_str().into(),
                ca: None,
                refuse: false,
                pool_key,
                mirror: None,
                connect: None,
                client,
            };
        }
        let (roots, certs) = if t.system_roots {
            (crate::upstream_tls::system_store(), Vec::new())
        } else {
            match ca_roots(&t.ca_pem) {
                Ok(found) => found,
                Err(why) => return refuse(why),
            }
        };
        let Ok(name) = rustls_pki_types::ServerName::try_from(t.hostname.clone()) else {
            return refuse("the hostname is not a DNS name");
        };
        if !t.subject_alt_names.is_empty() {
            let config = crate::upstream_tls::names(&t.subject_alt_names)
                .and_then(|names| crate::upstream_tls::SanVerifier::new(roots, names))
                .map_err(|e| e.to_string())
                .and_then(|v| {
                    let builder =
                        crate::upstream_tls::client_config_builder(v).map_err(|e| e.to_string())?;
                    client_auth(builder, client.as_deref()).map(Arc::new)
                });
            return match config {
                Ok(config) => Self {
                    hostname: t.hostname.as_str().into(),
                    ca: None,
                    refuse: false,
                    pool_key,
                    connect: Some((
                        Arc::new(Connect::new(&config, name.clone(), false)),
                        Arc::new(Connect::new(&config, name.clone(), true)),
                    )),
                    mirror: Some((config, name)),
                    client,
                },
                Err(why) => refuse(&why),
            };
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())
        .and_then(|b| client_auth(b.with_root_certificates(roots), client.as_deref()))
        .map(Arc::new);
        Self {
            hostname: t.hostname.as_str().into(),
            ca: Some(Arc::from(certs.into_boxed_slice())),
            refuse: false,
            pool_key,
            mirror: config.ok().map(|config| (config, name)),
            connect: None,
            client,
        }
    }

    /// The Pingora peer for a request to `addr` (`h2`: the caller sets ALPN h2 on it).
    pub fn peer(&self, addr: SocketAddr, h2: bool) -> pingora::upstreams::peer::HttpPeer {
        use pingora::upstreams::peer::HttpPeer;
        match &self.connect {
            // A stream already verified: cleartext HTTP over it, as far as Pingora knows.
            Some((h1_connect, h2_connect)) => {
                let mut peer = HttpPeer::new(addr, false, String::new());
                let connect = if h2 { h2_connect } else { h1_connect };
                peer.options.custom_l4 = Some(connect.clone());
                peer
            }
            // The certificate must chain to the policy's CA (or the built-in roots) and be
            // valid for its hostname, which is also the SNI.
            None => {
                let mut peer = HttpPeer::new(addr, true, self.hostname.to_string());
                peer.options.ca = self.ca.clone();
                peer.client_cert_key = self.client.as_ref().map(|c| c.cert_key.clone());
                peer
            }
        }
    }
}

/// The trust anchors of a PEM bundle, for rustls and for Pingora.
fn ca_roots(
    pem: &str,
) -> Result<(rustls::RootCertStore, Vec<pingora::utils::tls::WrappedX509>), &'static str> {
    use rustls_pki_types::pem::PemObject;
    let mut certs = Vec::new();
    let mut roots = rustls::RootCertStore::empty();
    for der in rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let Ok(der) = der else {
            return Err("a CA certificate is not valid PEM");
        };
        // Pingora parses these again and panics on bad DER: only well-formed ones pass.
        if x509_parser::parse_x509_certificate(&der).is_err() {
            return Err("a CA certificate is not valid X.509");
        }
        certs.push(pingora::utils::tls::WrappedX509::new(
            der.to_vec(),
            pingora::utils::tls::parse_x509,
        ));
        if roots.add(der).is_err() {
            return Err("a CA certificate is not usable as a trust anchor");
        }
    }
    if certs.is_empty() {
        return Err("no CA certificate");
    }
    Ok((roots, certs))
}

/// Attempts a request gets when connecting to its backend fails slowly (timed out,
/// unreachable); no byte was sent, so another endpoint is always safe to try. As
/// ingress-nginx's proxy-next-upstream-tries.
pub const CONNECT_ATTEMPTS: usize = 3;
/// Attempts a request gets when its connections are refused at once, which costs nothing:
/// after a scale-down, most endpoints may refuse until the next snapshot drops them, and
/// three picks could all land on those.
pub const REFUSED_ATTEMPTS: usize = 16;

/// Whether a request whose `failed` connect attempts include `slow` that failed slowly may
/// try another endpoint.
pub fn may_connect_again(failed: usize, slow: usize) -> bool {
    failed < REFUSED_ATTEMPTS && slow < CONNECT_ATTEMPTS
}

impl ClusterState {
    pub(crate) fn new(
        c: &snap::Cluster,
        encoded: &[u8],
        registry: &outlier::Registry,
        clients: &ClientCerts,
    ) -> Self {
        let outliers = registry.cluster(&c.name);
        let mut endpoints = Vec::new();
        let mut ready = Vec::new();
        let mut fallback = Vec::new();
        for e in &c.endpoints {
            let Ok(ip) = e.address.parse::<IpAddr>() else {
                continue;
            };
            let Ok(port) = u16::try_from(e.port) else {
                continue;
            };
            if e.ready {
                ready.push(endpoints.len());
            } else if e.serving {
                fallback.push(endpoints.len());
            } else {
                continue;
            }
            endpoints.push(SocketAddr::new(ip, port));
        }
        let health: Vec<Arc<EndpointHealth>> =
            endpoints.iter().map(|a| outliers.endpoint(*a)).collect();
        outliers.settle(&health);
        let pool = if ready.is_empty() { &fallback } else { &ready };
        let balance = Balance::new(c.load_balancer.as_ref(), &endpoints, pool);
        let ids = endpoints.iter().map(|a| balance::endpoint_id(*a)).collect();
        Self {
            name: c.name.as_str().into(),
            app_protocol: snap::AppProtocol::try_from(c.app_protocol).unwrap_or_default(),
            tls_name: c
                .name
                .split_once('/')
                .and_then(|(ns, rest)| {
                    let svc = rest.split_once(':').map_or(rest, |(s, _)| s);
                    (!ns.is_empty() && !svc.is_empty()).then(|| format!("{svc}.{ns}.svc"))
                })
                .unwrap_or_else(|| "backend".to_owned())
                .into(),
            endpoints,
            health,
            ready,
            fallback,
            next: AtomicUsize::new(0),
            outliers,
            balance,
            ids,
            backend_tls: c
                .tls
                .as_ref()
                .map(|t| Arc::new(BackendTls::new(t, clients))),
            encoded: encoded.into(),
            names_client_certificate: c
                .tls
                .as_ref()
                .is_some_and(|t| !t.client_certificate.is_empty()),
        }
    }

    /// Whether this state serves the cluster `encoded` as one built from it would: the same
    /// bytes, and no client certificate, which lives outside the cluster and may have changed.
    /// A table keeps such a state, with its rotation and the routes that send to it.
    pub(crate) fn serves(&self, encoded: &[u8]) -> bool {
        *self.encoded == *encoded && !self.names_client_certificate
    }

    /// Ready endpoints, else serving ones.
    fn pool(&self) -> &[usize] {
        if self.ready.is_empty() {
            &self.fallback
        } else {
            &self.ready
        }
    }

    /// Round robin over ready endpoints, else over serving ones.
    pub fn pick(&self) -> Option<SocketAddr> {
        self.pick_endpoint().map(|i| self.endpoints[i])
    }

    /// As [`ClusterState::pick`], as an index for [`ClusterState::addr`] and
    /// [`ClusterState::record`]. Ejected endpoints are passed over; if every candidate is
    /// ejected, the rotation's own pick is served anyway.
    pub fn pick_endpoint(&self) -> Option<usize> {
        let pool = self.pool();
        if pool.is_empty() {
            return None;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        if !self.outliers.any_ejected() {
            return Some(pool[start % pool.len()]);
        }
        let now = outlier::now_ms();
        let first = pool[start % pool.len()];
        if self.outliers.available(&self.health[first], now) {
            return Some(first);
        }
        // The rotation fell on an ejected endpoint: its turns are spread over the available
        // ones (taking the next one each time would give it all of them).
        let available = || {
            pool.iter()
                .copied()
                .filter(move |&i| self.outliers.available(&self.health[i], now))
        };
        let count = available().count();
        if count == 0 {
            return Some(first);
        }
        available()
            .nth((start / pool.len()) % count)
            .or(Some(first))
    }

    /// The cluster's load balancer's pick. `key` gives a consistent-hash cluster the hash of
    /// the request's key (None: the request has none, and round robin serves it).
    pub fn pick_for(&self, key: &mut dyn FnMut(&HashSource) -> Option<u64>) -> Option<usize> {
        match &self.balance {
            Balance::RoundRobin => self.pick_endpoint(),
            Balance::LeastRequest(active) => {
                let pool = self.pool();
                if pool.len() < 2 {
                    return self.pick_endpoint();
                }
                let now = outlier::now_ms();
                let usable = |i: usize| {
                    !self.outliers.any_ejected() || self.outliers.available(&self.health[i], now)
                };
                let (a, b) = balance::two_choices(pool.len());
                let (a, b) = (pool[a], pool[b]);
                match (usable(a), usable(b)) {
                    (true, true) => {
                        let load = |i: usize| active[i].load(Ordering::Relaxed);
                        Some(if load(b) < load(a) { b } else { a })
                    }
                    (true, false) => Some(a),
                    (false, true) => Some(b),
                    (false, false) => self.pick_endpoint(),
                }
            }
            Balance::ConsistentHash { source, ring } => match key(source) {
                Some(hash) => {
                    let now = outlier::now_ms();
                    ring.find(hash, |i| {
                        !self.outliers.any_ejected()
                            || self.outliers.available(&self.health[i], now)
                    })
                }
                None => self.pick_endpoint(),
            },
        }
    }

    /// Counts a request to `endpoint` as in flight until the guard is dropped (least request
    /// only: other clusters pay nothing).
    pub fn start(self: &Arc<Self>, endpoint: usize) -> Option<InFlight> {
        let Balance::LeastRequest(active) = &self.balance else {
            return None;
        };
        active.get(endpoint)?.fetch_add(1, Ordering::Relaxed);
        Some(InFlight::new(self.clone(), endpoint))
    }

    pub(crate) fn finished(&self, endpoint: usize) {
        if let Balance::LeastRequest(active) = &self.balance
            && let Some(n) = active.get(endpoint)
        {
            n.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The endpoint a session named `id` belongs to, if it still takes requests here.
    pub fn session_endpoint(&self, id: u64) -> Option<usize> {
        let now = outlier::now_ms();
        self.pool().iter().copied().find(|&i| {
            self.ids[i] == id
                && (!self.outliers.any_ejected() || self.outliers.available(&self.health[i], now))
        })
    }

    /// `endpoint`'s stable name, as session persistence gives it to clients.
    pub fn endpoint_id(&self, endpoint: usize) -> u64 {
        self.ids.get(endpoint).copied().unwrap_or_default()
    }

    pub fn addr(&self, endpoint: usize) -> SocketAddr {
        self.endpoints[endpoint]
    }

    /// The next endpoint in the rotation after the last one in `tried`, not in `tried` and
    /// not ejected (a retry after a connection failed goes elsewhere); None when every
    /// endpoint was tried. The shared rotation is not advanced, so an endpoint that refuses
    /// does not shift the others' shares.
    pub fn pick_excluding(&self, tried: &[usize]) -> Option<usize> {
        let pool = self.pool();
        let start = tried
            .last()
            .and_then(|t| pool.iter().position(|i| i == t))
            .map_or(0, |i| i + 1);
        let now = outlier::now_ms();
        let untried = |i: &usize| !tried.contains(i);
        let candidates = || (0..pool.len()).map(|k| pool[(start + k) % pool.len()]);
        candidates()
            .filter(untried)
            .find(|&i| self.outliers.available(&self.health[i], now))
            .or_else(|| candidates().find(untried))
    }

    /// Where a request whose connect failed picks its next endpoint: this cluster as the
    /// current table holds it (`newest`), when a snapshot replaced it since the request began.
    /// A connect can wait seconds on a Pod that went away (no route to host, or silence until
    /// the connect limit) while the snapshot without it arrives; the request's own copy would
    /// offer the other vanished Pods next (scaling 10 -> 2 replicas: 8 of 10). The endpoints
    /// in `tried` are carried over by address; those gone from `newest` drop out.
    pub fn newest(
        self: &Arc<Self>,
        newest: Option<&Arc<Self>>,
        tried: &mut Vec<usize>,
    ) -> Arc<Self> {
        let Some(newest) = newest.filter(|n| !Arc::ptr_eq(n, self)) else {
            return Arc::clone(self);
        };
        let addresses: Vec<SocketAddr> = tried
            .iter()
            .filter_map(|&i| self.endpoints.get(i).copied())
            .collect();
        tried.clear();
        tried.extend(
            addresses
                .iter()
                .filter_map(|a| newest.endpoints.iter().position(|e| e == a)),
        );
        Arc::clone(newest)
    }

    /// How a request to `endpoint` went: a refused connection or a 5xx answer is a failure,
    /// and enough of them in a row eject it (see `outlier`).
    pub fn record(&self, endpoint: usize, failed: bool, settings: &outlier::Settings) {
        let Some(h) = self.health.get(endpoint) else {
            return;
        };
        if self.outliers.record(h, failed, &self.health, settings) {
            tracing::warn!(
                cluster = %self.name,
                endpoint = %self.endpoints[endpoint],
                "endpoint ejected after consecutive failures"
            );
        }
    }

    pub fn has_endpoints(&self) -> bool {
        !self.ready.is_empty() || !self.fallback.is_empty()
    }
}

/// A request in flight to an endpoint of a least-request cluster; dropping it ends it.
#[derive(Debug)]
pub struct InFlight {
    cluster: Arc<ClusterState>,
    endpoint: usize,
}

impl InFlight {
    fn new(cluster: Arc<ClusterState>, endpoint: usize) -> Self {
        Self { cluster, endpoint }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.cluster.finished(self.endpoint);
    }
}

/// The fast path's idle upstream connections: per worker thread, so a pooled socket is
/// always driven by the reactor of the thread that uses it, and without locks.
pub mod pool {
    use std::cell::{Cell, RefCell};
    use std::collections::HashMap;
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};
    use tokio::net::TcpStream;

    /// Idle upstream connections kept per backend address and worker: as many as Pingora's
    /// pool keeps, so the answers to one HTTP/2 client's hundreds of concurrent streams do
    /// not close most of the connections they came on.
    const PER_ADDR: usize = 1024;
    /// How often a worker's pool is swept of expired and closed connections, at most.
    const SWEEP: Duration = Duration::from_secs(5);

    thread_local! {
        /// Idle upstream connections of this worker, by backend address, most recent last,
        /// each with the time it expires.
        static POOL: RefCell<HashMap<SocketAddr, Vec<(TcpStream, Instant)>>> =
            RefCell::new(HashMap::new());
        /// A sweeper task runs on this worker.
        static SWEEPING: Cell<bool> = const { Cell::new(false) };
    }

    /// Whether an idle connection is still usable: not expired, and not readable (readable
    /// while idle means closed, or a backend talking out of turn). Without a readiness
    /// event the probe costs no syscall.
    fn usable(up: &TcpStream, expires: Instant, now: Instant) -> bool {
        if now >= expires {
            return false;
        }
        let mut probe = [0u8; 1];
        matches!(up.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }

    /// The most recently used idle connection to `addr` that still looks open.
    pub fn take(addr: SocketAddr) -> Option<TcpStream> {
        POOL.with(|pool| {
            let mut pool = pool.borrow_mut();
            let idle = pool.get_mut(&addr)?;
            let now = Instant::now();
            while let Some((up, expires)) = idle.pop() {
                if usable(&up, expires, now) {
                    return Some(up);
                }
            }
            None
        })
    }

    /// Keeps a connection whose last response ended cleanly for the next request, for at
    /// most `idle`.
    pub fn put(addr: SocketAddr, up: TcpStream, idle_for: Duration) {
        POOL.with(|pool| {
            let mut pool = pool.borrow_mut();
            let kept = pool.entry(addr).or_default();
            if kept.len() >= PER_ADDR {
                kept.remove(0);
            }
            kept.push((up, Instant::now() + idle_for));
        });
        start_sweeper(idle_for.min(SWEEP));
    }

    /// Idle connections this worker holds.
    pub fn idle() -> usize {
        POOL.with(|pool| pool.borrow().values().map(Vec::len).sum())
    }

    /// Drops expired and closed connections, and addresses with none left.
    pub fn sweep() {
        POOL.with(|pool| {
            let now = Instant::now();
            pool.borrow_mut().retain(|_, idle| {
                idle.retain(|(up, expires)| usable(up, *expires, now));
                !idle.is_empty()
            });
        });
    }

    /// Sweeps this worker's pool every few seconds while it holds connections, so sockets
    /// to backends that went away (a Pod deleted) do not stay open.
    fn start_sweeper(every: Duration) {
        if SWEEPING.with(Cell::get) || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        SWEEPING.with(|s| s.set(true));
        // Workers run current-thread runtimes, so this task stays on this thread's pool.
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                sweep();
                if idle() == 0 {
                    SWEEPING.with(|s| s.set(false));
                    return;
                }
            }
        });
    }
}
