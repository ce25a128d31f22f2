//! The proxy's side of discovery: bootstrap an SVID with the projected token, then hold the
//! mutual-TLS stream to the controller, applying each snapshot all-or-nothing.
//!
//! The private key is generated here and never leaves the process. Tables are never cleared
//! when the controller goes away: the proxy keeps serving its last good snapshot and reconnects
//! with jittered exponential backoff. With a cache directory, each applied snapshot is also
//! written to disk and served from there when the process starts again (`snapshot_cache`).

use crate::listeners::Listeners;
use crate::snapshot_cache::SnapshotCache;
use crate::table::SharedTable;
use coxswain_api::discovery::discovery_client::DiscoveryClient;
use coxswain_api::discovery::identity_client::IdentityClient;
use coxswain_api::discovery::{
    Ack, BootstrapRequest, BoundListener, Liveness, Nack, NodeStatus, ProxyMessage, Subscribe,
    WIRE_VERSION, controller_message, proxy_message,
};
use coxswain_api::snapshot::Scope;
use coxswain_api::snapshot::outline::Outline;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

#[derive(Debug, Clone)]
pub struct DiscoveryConfig {
    /// Stream endpoints (`https://host:port`), tried in turn.
    pub endpoints: Vec<String>,
    pub bootstrap_endpoint: String,
    /// The projected ServiceAccount token (audience coxswain-discovery).
    pub token_path: PathBuf,
    /// CA certificates that sign the controller's listeners (the published trust bundle).
    pub trust_bundle_path: PathBuf,
    pub scope: Scope,
    pub node_id: String,
    /// Connection worker threads (see `workers`); 0 serves connections on the caller's runtime.
    pub workers: usize,
    /// Deadlines and caps on client connections.
    pub limits: crate::limits::Limits,
    /// How a controller that went silent is told from one with nothing to push.
    pub liveness: Liveness,
}

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("endpoint {endpoint}: {message}")]
    Endpoint { endpoint: String, message: String },
    #[error("bootstrap refused: {0}")]
    Bootstrap(tonic::Status),
    #[error("stream refused: {0}")]
    Stream(tonic::Status),
    #[error("connecting: {0}")]
    Connect(String),
    #[error("generating a key: {0}")]
    Key(String),
}

impl DiscoveryError {
    /// A standby controller answered: retry soon, the leader is about to be reachable.
    fn is_not_leader(&self) -> bool {
        matches!(self, Self::Stream(s) if s.code() == tonic::Code::FailedPrecondition && s.message().contains("not the leader"))
    }
}

/// An SVID and its key, held in memory only.
#[derive(Clone)]
pub struct Svid {
    pub chain_pem: String,
    pub key_pem: String,
    pub trust_bundle_pem: String,
    pub spiffe_id: String,
    pub not_after: i64,
    /// Half-way through its life: when to get a new one.
    pub renew_at: i64,
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn read(path: &PathBuf) -> Result<String, DiscoveryError> {
    std::fs::read_to_string(path).map_err(|source| DiscoveryError::Read {
        path: path.clone(),
        source,
    })
}

/// HTTP/2 flow-control window of the discovery connection and its stream.
const SNAPSHOT_WINDOW: u32 = 16 << 20;
/// The largest snapshot a proxy accepts. gRPC's default of 4 MiB refused the snapshot of a
/// cluster past about 23,000 HTTPRoutes.
const MAX_SNAPSHOT_BYTES: usize = 256 << 20;
/// How often ports that could not be bound (a process before this one still holding them) are
/// tried again between snapshots.
const UNBOUND_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

async fn channel(
    endpoint: &str,
    ca_pem: &str,
    identity: Option<&Svid>,
    liveness: Liveness,
) -> Result<Channel, DiscoveryError> {
    let err = |message: String| DiscoveryError::Endpoint {
        endpoint: endpoint.to_owned(),
        message,
    };
    let uri: tonic::transport::Uri = endpoint.parse().map_err(|e| err(format!("{e}")))?;
    let host = uri.host().ok_or_else(|| err("no host".into()))?.to_owned();
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name(host);
    if let Some(svid) = identity {
        tls = tls.identity(Identity::from_pem(&svid.chain_pem, &svid.key_pem));
    }
    Channel::builder(uri)
        .tls_config(tls)
        .map_err(|e| err(e.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        // Pushes come only when something changed, so a quiet stream is normal. Pings tell a
        // quiet controller from a vanished one (the open stream keeps them going).
        .http2_keep_alive_interval(liveness.ping_every)
        .keep_alive_timeout(liveness.answer_within)
        // A snapshot is one message: 0.5 MB at 3,000 routes, 3.5 MB at 20,000. One window holds
        // it whole instead of HTTP/2's default 64 KiB, which took dozens of window updates.
        .initial_stream_window_size(SNAPSHOT_WINDOW)
        .initial_connection_window_size(SNAPSHOT_WINDOW)
        .connect()
        .await
        .map_err(|e| DiscoveryError::Connect(format!("{endpoint}: {e}")))
}

/// Trades the token and a fresh CSR for an SVID.
pub async fn bootstrap(config: &DiscoveryConfig) -> Result<Svid, DiscoveryError> {
    let token = read(&config.token_path)?.trim().to_owned();
    let trust = read(&config.trust_bundle_path)?;
    let key = rcgen::KeyPair::generate().map_err(|e| DiscoveryError::Key(e.to_string()))?;
    let csr = rcgen::CertificateParams::default()
        .serialize_request(&key)
        .and_then(|r| r.pem())
        .map_err(|e| DiscoveryError::Key(e.to_string()))?;
    let mut client = IdentityClient::new(
        channel(&config.bootstrap_endpoint, &trust, None, config.liveness).await?,
    );
    let resp = client
        .bootstrap(BootstrapRequest {
            token,
            csr_pem: csr,
        })
        .await
        .map_err(DiscoveryError::Bootstrap)?
        .into_inner();
    tracing::info!(spiffe_id = %resp.spiffe_id, not_after = resp.not_after, "SVID issued");
    let now = unix_now();
    Ok(Svid {
        renew_at: now + (resp.not_after - now).max(0) / 2,
        chain_pem: resp.certificate_chain_pem,
        key_pem: key.serialize_pem(),
        trust_bundle_pem: resp.trust_bundle_pem,
        spiffe_id: resp.spiffe_id,
        not_after: resp.not_after,
    })
}

/// One stream session: subscribe, then apply pushes until the stream ends. `heard` is set
/// once a push arrived: the controller was the leader, whatever ended the stream later.
async fn session(
    config: &DiscoveryConfig,
    endpoint: &str,
    svid: &Svid,
    table: &SharedTable,
    listeners: &mut Listeners,
    cache: Option<&SnapshotCache>,
    heard: &mut bool,
) -> Result<(), DiscoveryError> {
    let mut client = DiscoveryClient::new(
        channel(
            endpoint,
            &svid.trust_bundle_pem,
            Some(svid),
            config.liveness,
        )
        .await?,
    )
    .max_decoding_message_size(MAX_SNAPSHOT_BYTES);
    let (tx, rx) = mpsc::channel(8);
    let send = |kind| ProxyMessage { kind: Some(kind) };
    let _ = tx
        .send(send(proxy_message::Kind::Subscribe(Subscribe {
            node_id: config.node_id.clone(),
            wire_version: WIRE_VERSION,
            scope: Some(config.scope.clone()),
        })))
        .await;
    let mut pushes = client
        .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(DiscoveryError::Stream)?
        .into_inner();
    tracing::info!(%endpoint, "discovery stream open");
    // The version applied last, which a later report of the listeners is about.
    let mut applied: Option<String> = None;
    let mut retry = tokio::time::interval(UNBOUND_RETRY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let msg = tokio::select! {
            msg = pushes.message() => msg.map_err(DiscoveryError::Stream)?,
            _ = retry.tick(), if listeners.unbound() > 0 => {
                // Ports bound since are reported, so the controller can program them.
                let before = listeners.unbound();
                let errors = listeners.sync().await;
                if let Some(version) = &applied
                    && listeners.unbound() < before
                {
                    tracing::info!(ports = ?listeners.ports(), "listener bound on a later try");
                    let _ = tx.send(node_status(version, listeners, &errors)).await;
                }
                continue;
            }
        };
        let Some(msg) = msg else { break };
        let Some(controller_message::Kind::Snapshot(push)) = msg.kind else {
            continue;
        };
        *heard = true;
        if push.snapshot.is_empty() {
            continue;
        }
        // Checked over the bytes as they came: the table is built from exactly what the
        // controller sealed, and the cache gets those bytes, never a second encoding. Only the
        // outline is decoded here; the table decodes the hosts and clusters that changed.
        let received = std::time::Instant::now();
        let encoded = push.snapshot.clone();
        let snapshot = match Outline::verify(push.snapshot) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "snapshot refused; still serving the previous one");
                let _ = tx
                    .send(send(proxy_message::Kind::Nack(Nack {
                        version: String::new(),
                        nonce: push.nonce,
                        error: format!("the snapshot is not sealed: {e}"),
                    })))
                    .await;
                continue;
            }
        };
        let version = snapshot.version.clone();
        tracing::debug!(%version, "snapshot received");
        let started = std::time::Instant::now();
        let decode_us = started.duration_since(received).as_micros();
        // All or nothing: a snapshot that does not build leaves the current table serving.
        match table.build(&snapshot) {
            Ok(t) => {
                table.store(t);
                let build_us = started.elapsed().as_micros();
                let errors = listeners.sync().await;
                for e in &errors {
                    tracing::error!(error = %e, "listener not bound");
                }
                table.mark_applied();
                let _ = tx
                    .send(send(proxy_message::Kind::Ack(Ack {
                        version: version.clone(),
                        nonce: push.nonce,
                    })))
                    .await;
                let _ = tx.send(node_status(&version, listeners, &errors)).await;
                tracing::info!(%version, decode_us, build_us, ports = ?listeners.ports(), "snapshot applied");
                applied = Some(version.clone());
                table.forget_unused();
                // After the ack: the controller learns the proxy serves it without waiting for
                // a disk write.
                if let Some(cache) = cache {
                    persist(cache, &version, &encoded);
                }
            }
            Err(e) => {
                tracing::error!(%version, error = %e, "snapshot refused; still serving the previous one");
                let _ = tx
                    .send(send(proxy_message::Kind::Nack(Nack {
                        version,
                        nonce: push.nonce,
                        error: e.to_string(),
                    })))
                    .await;
            }
        }
    }
    Ok(())
}

/// The report of the listeners serving `version`: the ports bound, and each failure.
fn node_status(
    version: &str,
    listeners: &Listeners,
    errors: &[crate::listeners::ListenError],
) -> ProxyMessage {
    let mut bound: Vec<BoundListener> = listeners
        .ports()
        .into_iter()
        .map(|p| BoundListener {
            port: u32::from(p),
            bound: true,
            error: String::new(),
        })
        .collect();
    bound.extend(errors.iter().map(|e| BoundListener {
        port: 0,
        bound: false,
        error: e.to_string(),
    }));
    ProxyMessage {
        kind: Some(proxy_message::Kind::NodeStatus(NodeStatus {
            snapshot_version: version.to_owned(),
            listeners: bound,
        })),
    }
}

/// Writes an applied snapshot to the cache. A failure costs only the next restart's head
/// start, so it is logged, not fatal.
fn persist(cache: &SnapshotCache, version: &str, encoded: &[u8]) {
    match cache.store(encoded) {
        Ok(()) => {
            tracing::debug!(%version, path = %cache.path().display(), "snapshot cached");
        }
        Err(e) => {
            tracing::warn!(error = %e, "snapshot not cached; a restart waits for the controller")
        }
    }
}

/// Serves the cached snapshot, if a valid one exists, before the controller is reached.
/// Returns whether it did.
async fn serve_cached(
    cache: &SnapshotCache,
    table: &SharedTable,
    listeners: &mut Listeners,
) -> bool {
    let cached = match cache.load() {
        Ok(Some(c)) => c,
        Ok(None) => {
            tracing::info!(path = %cache.path().display(), "no cached snapshot; waiting for the controller");
            return false;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cached snapshot ignored, not served; waiting for the controller");
            return false;
        }
    };
    let version = cached.snapshot.version.clone();
    let outline = match Outline::of(&cached.snapshot) {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(error = %e, "cached snapshot ignored, not served; waiting for the controller");
            return false;
        }
    };
    match table.build(&outline) {
        Ok(t) => {
            table.store(t);
            for e in listeners.sync().await {
                tracing::error!(error = %e, "listener not bound");
            }
            table.mark_applied();
            table.forget_unused();
            tracing::info!(
                %version,
                age_seconds = cached.age.map(|a| a.as_secs()),
                ports = ?listeners.ports(),
                "serving the cached snapshot until the controller answers"
            );
            true
        }
        Err(e) => {
            tracing::warn!(%version, error = %e, "cached snapshot ignored, not served; waiting for the controller");
            false
        }
    }
}

/// Keeps the proxy connected until `stop` completes. Bootstraps first, renews the SVID at half
/// its life, and re-bootstraps after repeated failures.
pub async fn run(
    config: DiscoveryConfig,
    table: SharedTable,
    listeners: &mut Listeners,
    cache: Option<&SnapshotCache>,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut svid: Option<Svid> = None;
    let mut failures: u32 = 0;
    let mut endpoint_index = 0usize;
    loop {
        let renew = failures >= 3 || svid.as_ref().is_none_or(|s| unix_now() >= s.renew_at);
        if renew {
            // Under `stop` too: with the controller away, a connect attempt can take seconds.
            let issued = tokio::select! {
                r = bootstrap(&config) => r,
                () = &mut stop => return,
            };
            match issued {
                Ok(s) => {
                    svid = Some(s);
                    failures = 0;
                }
                Err(e) => tracing::warn!(error = %e, "bootstrap failed"),
            }
        }
        let mut heard = false;
        let result = match &svid {
            Some(s) => {
                let endpoint =
                    config.endpoints[endpoint_index % config.endpoints.len().max(1)].clone();
                tokio::select! {
                    r = session(&config, &endpoint, s, &table, listeners, cache, &mut heard) => r,
                    () = &mut stop => return,
                }
            }
            None => Err(DiscoveryError::Connect("no SVID".into())),
        };
        // A stream that carried snapshots proves the SVID and the endpoint good: however it
        // ended (a lost connection after days), that is not a streak of failures that calls
        // for a new SVID.
        if heard {
            failures = 0;
        }
        let delay = match &result {
            Ok(()) => {
                tracing::info!("the controller ended the discovery stream; reconnecting");
                failures = 0;
                Duration::from_millis(250)
            }
            Err(e) if e.is_not_leader() => {
                if heard {
                    tracing::info!("the controller stopped leading; looking for the new leader");
                }
                endpoint_index += 1;
                Duration::from_millis(250 + jitter(250))
            }
            Err(e) => {
                tracing::warn!(error = %e, failures, "discovery stream lost; serving the last snapshot");
                failures += 1;
                endpoint_index += 1;
                let base = 250u64
                    .saturating_mul(1 << failures.min(7))
                    .min(MAX_RETRY_MS);
                Duration::from_millis(base / 2 + jitter(base / 2))
            }
        };
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = &mut stop => return,
        }
    }
}

/// The longest wait between two attempts to reach a controller. A proxy keeps serving its
/// last snapshot meanwhile; a longer wait would only delay its first routes after the
/// controller comes back (a restart, a new leader), and a connection refused costs nothing.
const MAX_RETRY_MS: u64 = 5_000;

/// A cheap jitter source: the clock's sub-second nanoseconds.
fn jitter(max_ms: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()));
    if max_ms == 0 { 0 } else { nanos % max_ms }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Admin(#[from] crate::admin::AdminError),
    #[error("starting connection workers: {0}")]
    Workers(#[source] std::io::Error),
}

/// How a cluster-mode proxy process runs, beyond what discovery needs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub bind_ip: std::net::IpAddr,
    pub admin_addr: std::net::SocketAddr,
    /// After `stop`: how long in-flight requests may take.
    pub drain: Duration,
    /// Where applied snapshots are kept across container restarts; `None` keeps none.
    pub snapshot_cache_dir: Option<PathBuf>,
}

/// The proxy process in cluster mode: admin endpoints, listeners that follow the pushed
/// snapshots, and a drain on `stop`.
pub async fn serve(
    config: DiscoveryConfig,
    bind_ip: std::net::IpAddr,
    admin_addr: std::net::SocketAddr,
    drain: Duration,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    let options = ServeOptions {
        bind_ip,
        admin_addr,
        drain,
        snapshot_cache_dir: None,
    };
    serve_with(config, options, std::future::pending(), stop).await
}

/// [`serve`] with a snapshot cache and a shutdown in two steps: once `terminating` completes
/// readiness fails while connections are still accepted; once `stop` completes the listeners
/// close and in-flight requests drain.
pub async fn serve_with(
    config: DiscoveryConfig,
    options: ServeOptions,
    terminating: impl std::future::Future<Output = ()>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    let table = SharedTable::default();
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let mut listeners = Listeners::new(table.clone(), options.bind_ip, shutdown_rx)
        .with_limits(config.limits.clone());
    if config.workers > 0 {
        let workers =
            crate::workers::Workers::start(config.workers).map_err(ServeError::Workers)?;
        listeners = listeners.with_workers(workers);
    }
    let flag = crate::admin::Terminating::default();
    let admin = crate::admin::serve_with(options.admin_addr, table.clone(), flag.clone()).await?;
    tracing::info!(addr = %admin, "admin endpoints listening");
    let cache = options
        .snapshot_cache_dir
        .as_deref()
        .map(|dir| SnapshotCache::new(dir, config.scope.clone()));
    if let Some(cache) = &cache {
        serve_cached(cache, &table, &mut listeners).await;
    }
    let mark_terminating = async {
        terminating.await;
        flag.set();
        tracing::info!("terminating: readiness fails from now on");
        std::future::pending::<()>().await;
    };
    tokio::select! {
        () = run(config, table, &mut listeners, cache.as_ref(), stop) => {}
        () = mark_terminating => {}
    }
    listeners.drain(&shutdown_tx, options.drain).await;
    Ok(())
}
