//! `serve controller`: the reflector feeds the compiler; compiled snapshots go to the
//! discovery hub; the identity and discovery listeners serve proxies.
//!
//! With a Lease configured, only the leader writes status and serves discovery streams; every
//! replica serves bootstrap. The provisioning operator (dedicated proxies) runs beside them.

use crate::compile::{self, ScopeKey};
use crate::discovery::{DiscoveryService, Hub};
use crate::identity::Allowlist;
use crate::identity::server::{IdentityService, KubeTokenReviewer};
use crate::identity::store::{self, CaMode};
use crate::reflector::Reflector;
use coxswain_proxy::trace::Span;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ControllerConfig {
    pub namespace: String,
    pub controller_name: String,
    pub trust_domain: String,
    pub ca_mode: CaMode,
    pub discovery_addr: SocketAddr,
    pub bootstrap_addr: SocketAddr,
    /// DNS names on the listeners' certificate (the Services' names, and localhost).
    pub server_names: Vec<String>,
    /// The shared proxy pool's ServiceAccount in `namespace`.
    pub shared_proxy_service_account: String,
    /// Leader election; None: this replica always leads (single-replica setups and tests).
    pub lease: Option<crate::leader::LeaseConfig>,
    /// Image of dedicated proxies when no CoxswainGatewayParameters sets one; None: this
    /// binary's release image.
    pub proxy_image: Option<String>,
    /// Ports the shared pool serves Ingresses on (HTTP, HTTPS).
    pub ingress_ports: (u16, u16),
    /// Internal ports for shared Gateways' own Services; None: shared Gateways are served on
    /// their listener ports (see `compile::Config::shared_gateway_ports`).
    pub shared_gateway_ports: Option<compile::gateway_services::PortRange>,
    /// Read ingress-nginx's annotations too (`--ingress-nginx-compat`).
    pub ingress_nginx_compat: bool,
    /// Bootstrap calls per source address.
    pub bootstrap_rate_limit: crate::identity::ratelimit::RateLimit,
    /// Records a span per reconcile pass (`--otlp-endpoint`); None: tracing is off.
    pub tracer: Option<Arc<coxswain_proxy::trace::Tracer>>,
    /// `/healthz` and `/readyz` (and `/metrics`); None: not served.
    pub health_addr: Option<SocketAddr>,
    /// `/metrics` (and the health endpoints); None or the same as `health_addr`: one listener.
    pub metrics_addr: Option<SocketAddr>,
    /// How remote JWKS documents are fetched.
    pub jwks: crate::jwks::Settings,
}

/// The release image of this build, the dedicated proxies' default.
pub fn release_image() -> String {
    format!(
        "ghcr.io/coxswain-labs/coxswain:v{}",
        env!("CARGO_PKG_VERSION")
    )
}

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error(transparent)]
    Ca(#[from] store::CaStoreError),
    #[error("issuing the listeners' certificate: {0}")]
    ServerCert(#[source] crate::identity::CaError),
    #[error(transparent)]
    Admin(#[from] coxswain_proxy::admin::AdminError),
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The listeners' certificate lives a year; it is issued at start (not rotated while running).
const SERVER_CERT_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// How often the installed Gateway API release is looked up again.
const VERSION_RECHECK: Duration = Duration::from_secs(30);

/// The `gateway.networking.k8s.io/bundle-version` of the installed GatewayClass CRD; None when
/// the CRD is absent or unreadable (then no SupportedVersion claim is made).
async fn gateway_api_version(client: &kube::Client) -> Option<String> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: kube::Api<CustomResourceDefinition> = kube::Api::all(client.clone());
    match crds
        .get_opt("gatewayclasses.gateway.networking.k8s.io")
        .await
    {
        Ok(crd) => crd?
            .metadata
            .annotations?
            .get("gateway.networking.k8s.io/bundle-version")
            .cloned(),
        Err(e) => {
            tracing::debug!(error = %e, "Gateway API version not readable");
            None
        }
    }
}

/// A compile span's attributes: what went in (objects by kind) and what came out.
fn describe_compile(
    span: &mut Span,
    counts: &std::collections::BTreeMap<&'static str, usize>,
    compiled: &compile::Compiled,
) {
    const INPUTS: [(&str, &str); 8] = [
        ("Gateway", "coxswain.input.gateways"),
        ("HTTPRoute", "coxswain.input.httproutes"),
        ("GRPCRoute", "coxswain.input.grpcroutes"),
        ("TLSRoute", "coxswain.input.tlsroutes"),
        ("TCPRoute", "coxswain.input.tcproutes"),
        ("UDPRoute", "coxswain.input.udproutes"),
        ("Ingress", "coxswain.input.ingresses"),
        ("Service", "coxswain.input.services"),
    ];
    if span.context().is_none() {
        return;
    }
    for (kind, key) in INPUTS {
        span.set(key, counts.get(kind).copied().unwrap_or(0));
    }
    span.set("coxswain.snapshots", compiled.snapshots.len());
    span.set("coxswain.routes", compiled.routes);
}

/// A change that comes while passes follow each other (the rest of a `kubectl apply`, whose
/// objects arrive a few milliseconds apart, or an EndpointSlice storm) is compiled once no
/// other has come for this long. One that comes after a quiet spell as long is compiled at
/// once: a lone edit waits for nothing.
const QUIET: Duration = Duration::from_millis(3);
/// A stream of changes (an EndpointSlice storm) is compiled at least this often.
const COALESCE_AT_MOST: Duration = Duration::from_millis(50);
/// Status is written once no pass has come for this long: a status a person reads need not
/// follow every intermediate pass, and each write is an API round trip per object.
const STATUS_SETTLE: Duration = Duration::from_millis(50);
/// Under a stream of passes, status is still written at least this often.
const STATUS_SETTLE_AT_MOST: Duration = Duration::from_secs(1);
/// How long provisioning may take to finish its reconciles in flight at shutdown.
const PROVISIONING_STOP: Duration = Duration::from_secs(5);

/// Waits until `changed` has been quiet for `QUIET`, or `COALESCE_AT_MOST` has passed.
async fn coalesce(changed: &tokio::sync::Notify) {
    let until = tokio::time::Instant::now() + COALESCE_AT_MOST;
    while tokio::time::Instant::now() < until {
        let quiet = tokio::time::sleep(QUIET.min(until - tokio::time::Instant::now()));
        tokio::select! {
            () = changed.notified() => {}
            () = quiet => return,
        }
    }
}

/// What one compile pass produced, for the status writer.
struct Pass {
    /// The pass's objects, except that the status task swaps in the cache's copy of each
    /// object whose status alone has changed since ([`Reflector::with_current_status`]).
    /// Status writes change no spec and so start no pass: without the swap, the last pass
    /// keeps every route it wrote status for alive twice, its copy from before the write
    /// beside the cache's from after, until the next pass (up to 45 MiB at 20,000 routes,
    /// when one change rewrites every route's status).
    store: std::sync::Mutex<Arc<compile::Store>>,
    /// Without its snapshots, which went to the hub; their versions stay.
    compiled: compile::Compiled,
    names: Arc<crate::provision::ProxyNames>,
}

/// Writes status from the newest pass, and again when proxies connect or acknowledge.
struct StatusTask {
    status: crate::status::StatusWriter,
    parameters_status: crate::parameters_status::ParametersStatusWriter,
    hub: Arc<Hub>,
    admin: Arc<crate::admin::State>,
    leader: Arc<AtomicBool>,
    tracer: Option<Arc<coxswain_proxy::trace::Tracer>>,
    /// For the objects' current status (the compile loop does not wake for status alone).
    reflector: Reflector,
}

impl StatusTask {
    async fn run(mut self, mut passes: tokio::sync::watch::Receiver<Option<Arc<Pass>>>) {
        loop {
            tokio::select! {
                changed = passes.changed() => if changed.is_err() { return },
                () = self.hub.changed.notified() => {}
                () = self.reflector.status_changed.notified() => {}
            }
            // Let the passes settle: status is written from the pass after which none came
            // for `STATUS_SETTLE`, so the objects of one apply are reported together.
            let until = tokio::time::Instant::now() + STATUS_SETTLE_AT_MOST;
            loop {
                let now = tokio::time::Instant::now();
                if now >= until {
                    break;
                }
                tokio::select! {
                    changed = passes.changed() => if changed.is_err() { break },
                    () = tokio::time::sleep(STATUS_SETTLE.min(until - now)) => break,
                }
            }
            self.admin.set_connected_proxies(self.hub.connected());
            let Some(pass) = passes.borrow_and_update().clone() else {
                continue;
            };
            let mut span = Span::root(self.tracer.as_ref(), "status");
            let store = {
                let mut kept = pass.store.lock().unwrap_or_else(PoisonError::into_inner);
                // A copy swapped in differs from the pass's in status (and resourceVersion)
                // alone: same spec, same generation, so the pass's decisions still fit it.
                *kept = Arc::new(self.reflector.with_current_status(&kept));
                Arc::clone(&kept)
            };
            self.status
                .write(&store, &pass.compiled, &self.hub, &pass.names)
                .await;
            self.parameters_status.write(&store).await;
            span.set(
                "coxswain.leader",
                self.leader.load(std::sync::atomic::Ordering::Acquire),
            );
            span.set("coxswain.connected_proxies", self.hub.connected());
            span.end();
        }
    }
}

pub async fn run(
    client: kube::Client,
    config: ControllerConfig,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), ControllerError> {
    let ca = Arc::new(
        store::load_or_create(
            &client,
            &config.namespace,
            &config.trust_domain,
            config.ca_mode,
        )
        .await?,
    );
    store::publish_trust_bundle(&client, &config.namespace, &ca).await?;
    let (cert, key) = ca
        .sign_server(
            &config.server_names,
            time::OffsetDateTime::now_utc(),
            SERVER_CERT_LIFETIME,
        )
        .map_err(ControllerError::ServerCert)?;

    let leader = Arc::new(AtomicBool::new(config.lease.is_none()));
    let admin = Arc::new(crate::admin::State::new(leader.clone()));
    if let Some(tracer) = &config.tracer {
        let _ = admin.trace.set(tracer.counters().clone());
    }
    for addr in [config.health_addr, config.metrics_addr]
        .into_iter()
        .flatten()
        .collect::<std::collections::BTreeSet<_>>()
    {
        let bound = crate::admin::serve(addr, admin.clone()).await?;
        tracing::info!(admin = %bound, "health and metrics endpoints listening");
    }
    let (stop_election, election_stopped) = tokio::sync::oneshot::channel::<()>();
    let election = config.lease.clone().map(|lease| {
        tokio::spawn(crate::leader::run(
            client.clone(),
            lease,
            leader.clone(),
            async {
                let _ = election_stopped.await;
            },
        ))
    });
    let hub = Arc::new(Hub::default());
    hub.allow(
        ScopeKey::SharedPool,
        &config.namespace,
        &config.shared_proxy_service_account,
    );
    let allowlist = Arc::new(RwLock::new(Allowlist::new((
        &config.namespace,
        &config.shared_proxy_service_account,
    ))));
    let bind = |addr: SocketAddr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ControllerError::Bind { addr, source })
    };
    let (bootstrap, discovery) = (
        bind(config.bootstrap_addr).await?,
        bind(config.discovery_addr).await?,
    );
    let identity = IdentityService {
        ca: ca.clone(),
        reviewer: KubeTokenReviewer {
            client: client.clone(),
        },
        allowlist: allowlist.clone(),
        trust_domain: config.trust_domain.clone(),
        limiter: crate::identity::ratelimit::RateLimiter::new(config.bootstrap_rate_limit),
        admin: admin.clone(),
    };
    let (c, k) = (cert.clone(), key.clone());
    let health = admin.clone();
    tokio::spawn(async move {
        let result =
            crate::identity::server::serve(bootstrap, &c, &k, identity, std::future::pending())
                .await;
        let error = result.err().map(|e| e.to_string()).unwrap_or_default();
        tracing::error!(%error, "bootstrap listener stopped");
        health.listener_failed("bootstrap", &error);
    });
    let service = DiscoveryService {
        hub: hub.clone(),
        leader: leader.clone(),
    };
    let ca_pem = ca.cert_pem().to_owned();
    let health = admin.clone();
    tokio::spawn(async move {
        let result = crate::discovery::serve(
            discovery,
            &cert,
            &key,
            &ca_pem,
            service,
            Default::default(),
            std::future::pending(),
        )
        .await;
        let error = result.err().map(|e| e.to_string()).unwrap_or_default();
        tracing::error!(%error, "discovery listener stopped");
        health.listener_failed("discovery", &error);
    });
    admin.listeners_bound();
    tracing::info!(discovery = %config.discovery_addr, bootstrap = %config.bootstrap_addr, "controller listening");

    let (stop_provisioning, provisioning_stopped) = tokio::sync::oneshot::channel::<()>();
    let (proxy_names, proxy_names_rx) =
        tokio::sync::watch::channel(Arc::new(crate::provision::ProxyNames::default()));
    let provisioning = tokio::spawn(crate::provision::run(
        Arc::new(
            crate::provision::Context::new(
                client.clone(),
                config.controller_name.clone(),
                config.namespace.clone(),
                config.proxy_image.clone().unwrap_or_else(release_image),
                ca.cert_pem().to_owned(),
                leader.clone(),
                config.lease.as_ref().map(|l| l.identity.clone()),
            )
            .with_proxy_names(proxy_names_rx),
        ),
        async {
            let _ = provisioning_stopped.await;
        },
    ));

    let reflector = Reflector::start(&client);
    let status = crate::status::StatusWriter::new(
        client.clone(),
        config.controller_name.clone(),
        config.namespace.clone(),
        leader.clone(),
        admin.clone(),
        config.lease.as_ref().map(|l| l.identity.clone()),
    )
    .with_shared_gateway_ports(config.shared_gateway_ports.is_some());
    let mut gateway_services = crate::provision::gateway_services::ServiceWriter::new(
        client.clone(),
        config.namespace.clone(),
        config.controller_name.clone(),
        leader.clone(),
    );
    let parameters_status = crate::parameters_status::ParametersStatusWriter::new(
        client.clone(),
        config.controller_name.clone(),
        config.ingress_nginx_compat,
        leader.clone(),
        admin.clone(),
        config.lease.as_ref().map(|l| l.identity.clone()),
    );
    let mut compile_config = compile::Config {
        controller_name: config.controller_name.clone(),
        ingress_http_port: config.ingress_ports.0.into(),
        ingress_https_port: config.ingress_ports.1.into(),
        ingress_nginx_compat: config.ingress_nginx_compat,
        shared_gateway_ports: config.shared_gateway_ports,
        shared_proxy_account: compile::status::ObjectKey::new(
            &config.namespace,
            &config.shared_proxy_service_account,
        ),
        ..Default::default()
    };
    let jwks = crate::jwks::Fetcher::new(config.jwks.clone(), admin.clone());
    let mut version_checked: Option<std::time::Instant> = None;
    // Keeps each route's compiled part between passes: a pass compiles again only the routes
    // whose input changed.
    let mut compiler = compile::Compiler::default();
    let mut last_pass = tokio::time::Instant::now();
    // Status is written by a task of its own, from the newest pass, so API round trips never
    // hold back the next compile.
    let (passes, passes_rx) = tokio::sync::watch::channel(None);
    let status_task = tokio::spawn(
        StatusTask {
            status,
            parameters_status,
            hub: hub.clone(),
            admin: admin.clone(),
            leader: leader.clone(),
            tracer: config.tracer.clone(),
            reflector: reflector.clone(),
        }
        .run(passes_rx),
    );
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = reflector.changed.notified() => {}
            () = jwks.changed.notified() => {}
            () = &mut stop => break,
        }
        let woke = std::time::Instant::now();
        if last_pass.elapsed() < QUIET {
            coalesce(&reflector.changed).await;
        }
        let unsynced = reflector.unsynced();
        if !unsynced.is_empty() {
            tracing::debug!(waiting_for = ?unsynced, "caches still listing; not compiling yet");
            admin.set_unsynced(unsynced);
            last_pass = tokio::time::Instant::now();
            continue;
        }
        admin.set_unsynced(Vec::new());
        // The installed Gateway API release, for GatewayClass SupportedVersion; re-read now
        // and then, since CRDs are upgraded under a running controller.
        if version_checked.is_none_or(|at| at.elapsed() > VERSION_RECHECK) {
            compile_config.gateway_api_version = gateway_api_version(&client).await;
            version_checked = Some(std::time::Instant::now());
        }
        // One trace per pass: compiling, then publishing.
        let mut pass = Span::root(config.tracer.as_ref(), "reconcile");
        let copying = std::time::Instant::now();
        let mut store = reflector.snapshot();
        let copied = copying.elapsed();
        // The policies say which URLs to fetch; what was fetched so far is compiled now, and
        // each new document wakes this loop again.
        jwks.want(compile::jwks::sources(&store));
        store.remote_jwks = jwks.documents();
        let mut compiling = pass.child("compile");
        let started = std::time::Instant::now();
        let mut compiled = compiler.compile(&store, &compile_config);
        let compiled_at = started.elapsed();
        let reuse = compiler.reuse();
        admin.route_reuse(reuse.compiled, reuse.reused);
        let counts = store.counts();
        describe_compile(&mut compiling, &counts, &compiled);
        compiling.end();
        admin.compiled(started.elapsed(), counts);
        // The compiler names the dedicated proxies and says which ServiceAccount may serve
        // each scope: those may bootstrap and subscribe. Replaced, not added to: a name freed
        // by a deleted Gateway may go to another Gateway's proxy, which must not read the
        // deleted one's last snapshot.
        let names = Arc::new(compiled.proxy_names.clone());
        let accounts = &compiled.proxy_accounts;
        *allowlist.write().unwrap_or_else(|p| p.into_inner()) = accounts
            .iter()
            .map(|(_, sa)| (sa.namespace.as_str(), sa.name.as_str()))
            .collect();
        hub.allow_only(
            accounts
                .iter()
                .map(|(scope, sa)| (scope.clone(), (sa.namespace.clone(), sa.name.clone()))),
        );
        proxy_names.send_if_modified(|current| {
            if **current == *names {
                return false;
            }
            *current = names.clone();
            true
        });
        let publishing = pass.child("publish");
        // Each snapshot moves to the hub rather than being copied (tens of MB at 20,000
        // routes); status needs only its version, in `compiled.versions`.
        for (scope, snapshot) in std::mem::take(&mut compiled.snapshots) {
            tracing::debug!(?scope, version = snapshot.version(), "publishing snapshot");
            hub.publish(scope, snapshot);
        }
        publishing.end();
        tracing::debug!(
            since_woken_us = woke.elapsed().as_micros(),
            compile_us = started.elapsed().as_micros(),
            compiler_us = compiled_at.as_micros(),
            store_us = copied.as_micros(),
            "snapshots published"
        );
        // Shared Gateways' Services right away, as their internal ports are allocated: the
        // allocation lives in the Services, so the next pass must find them there.
        gateway_services
            .sync(&store, &compiled.gateway_services)
            .await;
        pass.set(
            "coxswain.leader",
            leader.load(std::sync::atomic::Ordering::Acquire),
        );
        pass.end();
        passes.send_replace(Some(Arc::new(Pass {
            store: std::sync::Mutex::new(Arc::new(store)),
            compiled,
            names,
        })));
        last_pass = tokio::time::Instant::now();
    }
    // The status task ends when it sees the sender gone, after the write in progress.
    drop(passes);
    if tokio::time::timeout(PROVISIONING_STOP, status_task)
        .await
        .is_err()
    {
        tracing::warn!("status writes did not finish in time; abandoning them");
    }
    let _ = stop_provisioning.send(());
    // kube-runtime waits for reconciles in flight, and one blocked on an API request would
    // hold the shutdown for the client's read timeout (minutes). Reconciles are idempotent
    // server-side applies: one cut short is redone by the next leader.
    let mut provisioning = provisioning;
    if tokio::time::timeout(PROVISIONING_STOP, &mut provisioning)
        .await
        .is_err()
    {
        tracing::warn!(
            grace = ?PROVISIONING_STOP,
            "provisioning did not stop in time; abandoning its reconciles in flight"
        );
        provisioning.abort();
    }
    // Hand the Lease over at once instead of letting a standby wait for it to expire.
    let _ = stop_election.send(());
    if let Some(e) = election {
        let _ = e.await;
    }
    Ok(())
}
