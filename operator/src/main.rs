//! `coxswain`: one binary, several roles. See `coxswain --help`.

use clap::Parser;
use coxswain_api::snapshot as snap;
use coxswain_operator::cli::{Cli, Command, ControllerArgs, ProxyArgs, ProxyMode, ServeRole};
use std::io::Write;
use std::process::ExitCode;

/// jemalloc, with a background thread that returns freed pages to the kernel within about a
/// second (settings in .cargo/config.toml). With glibc's malloc the proxy kept about half a
/// routing table resident for good after the first snapshot swaps (`make bench-memory`).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    // One process-wide crypto provider (ring), so no rustls user has to pick one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    coxswain_operator::telemetry::init(&cli.log);
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            // `{:#}` prints the whole context chain on one line.
            eprintln!("coxswain: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Crd(args) => {
            let out = coxswain_operator::manifests::crds(&args)?;
            if let Some(out) = out {
                std::io::stdout().lock().write_all(out.as_bytes())?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bundle(args) => {
            use coxswain_operator::bundle;
            let layout = bundle::Layout::new(&args.root);
            let generated = match (&args.as_version, &args.replaces) {
                (Some(version), Some(replaces)) => {
                    bundle::generate_rehearsal(&layout, bundle::Rehearsal { version, replaces })?
                }
                _ => bundle::generate(&layout)?,
            };
            let out = args.out_dir.as_ref().unwrap_or(&args.root);
            if args.check {
                generated.check(out)?;
            } else {
                generated.write(out)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Helm(args) => {
            use coxswain_operator::helm;
            let chart = helm::generate(&args.root)?;
            let dir = args.root.join(&args.out_dir);
            if args.check {
                chart.check(&dir)?;
            } else {
                chart.write(&dir)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Snapshot(args) => {
            let skipped = coxswain_operator::snapshot_cmd::run(&args.command)?;
            if skipped > 0 {
                eprintln!("coxswain: {skipped} object(s) could not be read; the rest was compiled");
                return Ok(ExitCode::FAILURE);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve(serve) => match serve.role {
            ServeRole::Controller(args) => serve_controller(args),
            ServeRole::Proxy(proxy) => match proxy.mode() {
                ProxyMode::Shared => {
                    serve_discovery(&proxy, snap::scope::Kind::SharedPool(snap::SharedPool {}))
                }
                ProxyMode::Dedicated { name, namespace } => serve_discovery(
                    &proxy,
                    snap::scope::Kind::Gateway(snap::ObjectRef { namespace, name }),
                ),
                ProxyMode::Standalone(path) => {
                    let limits = proxy_limits(&proxy, None)?;
                    coxswain_proxy::standalone::run(
                        coxswain_proxy::standalone::StandaloneConfig {
                            snapshot_file: path,
                            bind_ip: proxy.bind_address,
                            admin_addr: proxy.admin.health_addr,
                            poll: std::time::Duration::from_millis(200),
                            drain: std::time::Duration::from_secs(proxy.drain_seconds),
                            threads: proxy.threads.unwrap_or_else(|| {
                                std::thread::available_parallelism().map_or(1, |n| n.get())
                            }),
                            limits,
                        },
                    )?;
                    Ok(ExitCode::SUCCESS)
                }
            },
        },
    }
}

/// A proxy's limits, with its tracer when `--otlp-endpoint` is set. `gateway`: the one a
/// dedicated proxy serves (namespace, name), named on its spans.
fn proxy_limits(
    proxy: &ProxyArgs,
    gateway: Option<&snap::ObjectRef>,
) -> anyhow::Result<coxswain_proxy::limits::Limits> {
    let mut resource = Vec::new();
    if let Some(pod) = &proxy.node_id {
        resource.push(("service.instance.id", pod.clone()));
    }
    if let Some(gw) = gateway {
        resource.push(("coxswain.gateway.namespace", gw.namespace.clone()));
        resource.push(("coxswain.gateway.name", gw.name.clone()));
    }
    let mut limits = proxy.limits.limits();
    limits.tracer = proxy.tracing.tracer("coxswain-proxy", resource)?;
    Ok(limits)
}

/// `serve proxy --shared|--dedicated`: a data plane fed by the controller's discovery stream.
fn serve_discovery(proxy: &ProxyArgs, scope: snap::scope::Kind) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    let gateway = match &scope {
        snap::scope::Kind::Gateway(gw) => Some(gw),
        _ => None,
    };
    let limits = proxy_limits(proxy, gateway)?;
    let config = coxswain_proxy::discovery::DiscoveryConfig {
        endpoints: proxy.discovery_endpoint.clone(),
        bootstrap_endpoint: proxy.discovery_bootstrap_endpoint.clone(),
        token_path: proxy.token_path.clone(),
        trust_bundle_path: proxy.discovery_trust_bundle.clone(),
        scope: snap::Scope { kind: Some(scope) },
        // Empty: the controller takes the Pod name from the SVID (and refuses any other).
        node_id: proxy.node_id.clone().unwrap_or_default(),
        workers: proxy
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        limits,
        liveness: Default::default(),
    };
    // Connections run on the workers; this runtime holds the discovery stream, the accept
    // loops and the admin endpoints.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let delay = std::time::Duration::from_secs(proxy.shutdown_delay_seconds);
    let options = coxswain_proxy::discovery::ServeOptions {
        bind_ip: proxy.bind_address,
        admin_addr: proxy.admin.health_addr,
        drain: std::time::Duration::from_secs(proxy.drain_seconds),
        snapshot_cache_dir: proxy.snapshot_cache_dir.clone(),
    };
    runtime.block_on(async {
        let (terminating, stop) = proxy_shutdown(delay);
        coxswain_proxy::discovery::serve_with(config, options, terminating, stop).await
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Completes on SIGTERM (what the kubelet sends) or SIGINT.
async fn termination() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let interrupt = tokio::signal::ctrl_c();
    match term.as_mut() {
        Some(t) => {
            tokio::select! { _ = t.recv() => {}, _ = interrupt => {} }
        }
        None => {
            let _ = interrupt.await;
        }
    }
}

/// A proxy's two shutdown steps: the first future completes at SIGTERM or SIGINT (readiness
/// fails), the second `delay` later, or at the next signal if that comes first (accepting
/// ends). In between the proxy keeps serving new connections while its Pod leaves the
/// Service's endpoints. Watched by a task of its own, so a signal is seen at once whatever
/// the proxy is doing.
fn proxy_shutdown(
    delay: std::time::Duration,
) -> (
    impl std::future::Future<Output = ()>,
    impl std::future::Future<Output = ()>,
) {
    #[derive(Clone, Copy, PartialEq, PartialOrd)]
    enum Phase {
        Running,
        Terminating,
        Stopping,
    }
    let (tx, rx) = tokio::sync::watch::channel(Phase::Running);
    tokio::spawn(async move {
        termination().await;
        let _ = tx.send(Phase::Terminating);
        if !delay.is_zero() {
            tracing::info!(
                delay_seconds = delay.as_secs(),
                "termination signal: still accepting while endpoints update, then draining"
            );
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = termination() => {}
            }
        }
        let _ = tx.send(Phase::Stopping);
    });
    let reached = |phase: Phase| {
        let mut rx = rx.clone();
        async move {
            // A dropped sender (the task ended early) also means stop.
            let _ = rx.wait_for(|p| *p >= phase).await;
        }
    };
    (reached(Phase::Terminating), reached(Phase::Stopping))
}

/// `serve controller`: the only role with Kubernetes credentials.
fn serve_controller(args: ControllerArgs) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    use coxswain_api::names;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let mut resource = Vec::new();
    if let Some(pod) = &args.pod_name {
        resource.push(("service.instance.id", pod.clone()));
    }
    let tracer = args.tracing.tracer("coxswain-controller", resource)?;
    runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .context("connecting to the Kubernetes API (in-cluster config or KUBECONFIG)")?;
        let ns = &args.namespace;
        let mut server_names = vec!["localhost".to_owned()];
        for svc in [names::DISCOVERY_SERVICE, names::BOOTSTRAP_SERVICE] {
            server_names.push(format!("{svc}.{ns}.svc"));
            server_names.push(format!("{svc}.{ns}.svc.cluster.local"));
        }
        let config = coxswain_operator::controller::ControllerConfig {
            namespace: ns.clone(),
            controller_name: args.controller_name.clone(),
            trust_domain: args.trust_domain.clone(),
            ca_mode: args.ca_mode,
            discovery_addr: args.discovery_addr,
            bootstrap_addr: args.bootstrap_addr,
            server_names,
            shared_proxy_service_account: args.shared_proxy_service_account.clone(),
            proxy_image: args.proxy_image.clone(),
            ingress_ports: (args.ingress_http_port, args.ingress_https_port),
            shared_gateway_ports: args.shared_gateway_ports.0,
            ingress_nginx_compat: args.ingress_nginx_compat,
            bootstrap_rate_limit: coxswain_operator::identity::ratelimit::RateLimit {
                burst: args.bootstrap_burst,
                per_minute: args.bootstrap_per_minute,
                ..Default::default()
            },
            tracer,
            health_addr: Some(args.admin.health_addr),
            metrics_addr: Some(args.admin.metrics_addr),
            jwks: coxswain_operator::jwks::Settings {
                refresh_cap: args
                    .jwks_max_refresh_interval
                    .map(std::time::Duration::from_secs),
                ..Default::default()
            },
            lease: Some(coxswain_operator::leader::LeaseConfig {
                namespace: ns.clone(),
                name: names::LEADER_LEASE.to_owned(),
                // The pod name (downward API); the host name outside a pod.
                identity: args
                    .pod_name
                    .clone()
                    .or_else(|| std::env::var("HOSTNAME").ok())
                    .unwrap_or_else(|| format!("coxswain-{}", std::process::id())),
                duration: std::time::Duration::from_secs(15),
                renew_every: std::time::Duration::from_secs(5),
                pod: args.pod_name.clone(),
            }),
        };
        let stop = termination();
        coxswain_operator::controller::run(client, config, stop)
            .await
            .context("controller")
    })?;
    Ok(ExitCode::SUCCESS)
}
