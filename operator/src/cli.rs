//! Command line of the `coxswain` binary. Every flag can also come from a `COXSWAIN_*`
//! environment variable, which is how the Deployment manifests configure the roles.

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use coxswain_api::names;
use std::net::SocketAddr;
use std::path::PathBuf;

mod limits;
pub use limits::ProxyLimitArgs;

/// Coxswain: a Kubernetes Ingress and Gateway API controller with a Pingora data plane.
///
/// One binary, several roles. `serve controller` is the only role that talks to the
/// Kubernetes API; `serve proxy` roles receive routing snapshots from it over mTLS and hold no
/// Kubernetes credentials.
#[derive(Debug, Parser)]
#[command(name = "coxswain", version, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,

    #[command(subcommand)]
    pub command: Command,
}

// Parsed once at start-up: the variants' size difference costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a role: the controller or a proxy.
    Serve(Serve),
    /// Print every Coxswain CRD as multi-document YAML (or write one file per CRD).
    Crd(CrdArgs),
    /// Write the OLM bundle (bundle/ and bundle.Dockerfile) from config/ and the CRD types.
    Bundle(BundleArgs),
    /// Write the Helm chart (deploy/helm/coxswain) from config/default.
    Helm(HelmArgs),
    /// Work with routing snapshots offline: see what Coxswain does with manifests before
    /// applying them.
    Snapshot(SnapshotArgs),
}

#[derive(Debug, Args)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    pub command: SnapshotCommand,
}

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Compile manifests (Gateway API objects, Ingresses, IngressClasses, Services,
    /// EndpointSlices, Secrets, ReferenceGrants, Namespaces) into the snapshot a proxy scope
    /// would receive.
    Compile(CompileArgs),
    /// Print, for every object Coxswain is responsible for, the status the controller would
    /// write.
    Status(CompileArgs),
    /// Ask a snapshot's routing table (or that of manifests compiled on the spot) what the
    /// proxy does with one request.
    Match(MatchArgs),
}

#[derive(Debug, Args)]
pub struct MatchArgs {
    /// A snapshot written by `coxswain snapshot compile` (JSON or YAML) ...
    #[arg(long, required_unless_present = "files", conflicts_with = "files")]
    pub snapshot: Option<PathBuf>,
    /// ... or manifests to compile first, as `coxswain snapshot compile -f` does.
    #[arg(short = 'f', long = "filename", num_args = 1..)]
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub compile: CompileSettings,
    /// The port the request arrives on.
    #[arg(long)]
    pub port: u16,
    /// Host header.
    #[arg(long)]
    pub host: String,
    /// Path, optionally with a query (`/a?b=c`).
    #[arg(long)]
    pub path: String,
    #[arg(long, default_value = "GET")]
    pub method: String,
    /// A request header; repeat for more.
    #[arg(long = "header", value_name = "NAME:VALUE")]
    pub headers: Vec<String>,
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Json)]
    pub output: OutputFormat,
}

#[derive(Debug, Args)]
pub struct CompileArgs {
    /// YAML files or directories (read recursively); multi-document files and Lists are fine.
    #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,

    #[command(flatten)]
    pub compile: CompileSettings,

    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Yaml)]
    pub output: OutputFormat,
}

/// How manifests are compiled offline: as `serve controller` would with the same settings.
#[derive(Debug, Args)]
pub struct CompileSettings {
    /// Which proxy scope: `shared`, or `gateway/NAMESPACE/NAME` for a dedicated Gateway.
    #[arg(long, default_value = "shared")]
    pub scope: String,

    /// `spec.controllerName` of the classes to compile for.
    #[arg(long, env = "COXSWAIN_CONTROLLER_NAME", default_value = names::CONTROLLER_NAME)]
    pub controller_name: String,

    /// Read Ingress annotations as `serve controller --ingress-nginx-compat` does, so an
    /// ingress-nginx Ingress can be checked before it is applied.
    #[arg(long, env = "COXSWAIN_INGRESS_NGINX_COMPAT")]
    pub ingress_nginx_compat: bool,

    /// Port Ingresses are served on, as `serve controller` sets it.
    #[arg(long, env = "COXSWAIN_INGRESS_HTTP_PORT", default_value_t = 80)]
    pub ingress_http_port: u16,

    /// Port Ingresses with TLS are served on, as `serve controller` sets it.
    #[arg(long, env = "COXSWAIN_INGRESS_HTTPS_PORT", default_value_t = 443)]
    pub ingress_https_port: u16,

    /// Internal ports for shared Gateways, as `serve controller` sets them. Off by default
    /// here: offline there are no Services holding earlier allocations, and with it off
    /// `snapshot match --port` takes a shared Gateway's listener port as it is.
    #[arg(long, default_value = "off")]
    pub shared_gateway_ports: SharedGatewayPorts,
}

/// `--shared-gateway-ports`: `FIRST-LAST`, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedGatewayPorts(pub Option<crate::compile::gateway_services::PortRange>);

impl std::str::FromStr for SharedGatewayPorts {
    type Err = crate::compile::gateway_services::PortRangeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("off") {
            return Ok(Self(None));
        }
        s.parse().map(|r| Self(Some(r)))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Json,
    Yaml,
}

#[derive(Debug, Args)]
pub struct LogArgs {
    /// Log filter, in tracing's EnvFilter syntax (e.g. `info,coxswain_operator=debug`).
    #[arg(
        long = "log",
        env = "COXSWAIN_LOG",
        default_value = "info",
        global = true
    )]
    pub filter: String,

    /// Log line format.
    #[arg(long, env = "COXSWAIN_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct CrdArgs {
    /// Write one `<group>_<plural>.yaml` file per CRD into this directory instead of printing.
    #[arg(long, env = "COXSWAIN_CRD_OUT_DIR")]
    pub out_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct BundleArgs {
    /// Repository root: config/ and PROJECT are read from it, bundle/ and bundle.Dockerfile
    /// are written into it.
    #[arg(long, default_value = ".")]
    pub root: PathBuf,

    /// Write nothing; fail, listing the files, when the committed bundle differs from a fresh
    /// generation.
    #[arg(long)]
    pub check: bool,

    /// Write (or check) bundle/ and bundle.Dockerfile under this directory instead of --root.
    #[arg(long)]
    pub out_dir: Option<PathBuf>,

    /// Publish this build as another version, to rehearse an upgrade through a catalog: the
    /// CSV gets this version and every image the tag v<VERSION> (same repository). Needs
    /// --replaces; use with --out-dir, as the result is not the release bundle.
    #[arg(long, value_name = "VERSION", requires = "replaces")]
    pub as_version: Option<String>,

    /// With --as-version: the CSV this version replaces (spec.replaces), e.g. coxswain.v0.1.0.
    #[arg(long, value_name = "CSV", requires = "as_version")]
    pub replaces: Option<String>,
}

#[derive(Debug, Args)]
pub struct HelmArgs {
    /// Repository root: config/default is read from it.
    #[arg(long, default_value = ".")]
    pub root: PathBuf,

    /// Chart directory, relative to --root; the generator owns it (other files there are
    /// removed).
    #[arg(long, default_value = crate::helm::DEFAULT_OUT_DIR)]
    pub out_dir: PathBuf,

    /// Write nothing; fail, listing the files, when the committed chart differs from a fresh
    /// generation.
    #[arg(long)]
    pub check: bool,
}

#[derive(Debug, Args)]
pub struct Serve {
    #[command(subcommand)]
    pub role: ServeRole,
}

#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum ServeRole {
    /// The controller: watches Ingress and Gateway API objects, compiles routing snapshots,
    /// writes status (leader only), provisions dedicated proxies, and serves discovery
    /// (:50051, mTLS, leader only) and bootstrap identity (:50052, every replica).
    Controller(ControllerArgs),
    /// A Pingora data plane: `--shared` for every Ingress and non-dedicated Gateway, or
    /// `--dedicated` for a single Gateway. Holds no Kubernetes credentials.
    Proxy(ProxyArgs),
}

#[derive(Debug, Args)]
pub struct ControllerArgs {
    /// Namespace the controller runs in: holds the Lease, the CA Secret and the shared pool.
    #[arg(long, env = "COXSWAIN_NAMESPACE", default_value = names::DEFAULT_NAMESPACE)]
    pub namespace: String,

    /// `spec.controllerName` of the GatewayClasses and IngressClasses to serve.
    #[arg(long, env = "COXSWAIN_CONTROLLER_NAME", default_value = names::CONTROLLER_NAME)]
    pub controller_name: String,

    /// Name of this pod (downward API): the Lease holder identity and the pod the leader labels.
    #[arg(long, env = "COXSWAIN_POD_NAME")]
    pub pod_name: Option<String>,

    /// Discovery stream listener (mTLS mandatory, served by the leader only).
    #[arg(long, env = "COXSWAIN_DISCOVERY_ADDR", default_value_t = SocketAddr::from(([0, 0, 0, 0], names::DISCOVERY_PORT)))]
    pub discovery_addr: SocketAddr,

    /// Bootstrap identity listener (server TLS; issues SVIDs after TokenReview).
    #[arg(long, env = "COXSWAIN_BOOTSTRAP_ADDR", default_value_t = SocketAddr::from(([0, 0, 0, 0], names::BOOTSTRAP_PORT)))]
    pub bootstrap_addr: SocketAddr,

    /// SPIFFE trust domain of issued SVIDs.
    #[arg(long, env = "COXSWAIN_TRUST_DOMAIN", default_value = names::DEFAULT_TRUST_DOMAIN)]
    pub trust_domain: String,

    /// ServiceAccount of the shared proxy pool (in --namespace): the identity allowed to
    /// subscribe to the shared pool's snapshots.
    #[arg(long, env = "COXSWAIN_SHARED_PROXY_SERVICE_ACCOUNT", default_value = names::SHARED_PROXY_SERVICE_ACCOUNT)]
    pub shared_proxy_service_account: String,

    /// Who provides the discovery CA (Secret coxswain-discovery-ca): `auto` creates it when
    /// absent; `external` refuses to start without it.
    #[arg(long, env = "COXSWAIN_CA_MODE", value_enum, default_value_t = crate::identity::store::CaMode::Auto)]
    pub ca_mode: crate::identity::store::CaMode,

    /// Image of dedicated proxies when CoxswainGatewayParameters sets none.
    #[arg(long, env = "COXSWAIN_PROXY_IMAGE")]
    pub proxy_image: Option<String>,

    /// Port the shared pool serves Ingresses on over HTTP (the proxy Service's `http` port).
    #[arg(long, env = "COXSWAIN_INGRESS_HTTP_PORT", default_value_t = 80)]
    pub ingress_http_port: u16,

    /// Port the shared pool serves Ingresses with TLS on.
    #[arg(long, env = "COXSWAIN_INGRESS_HTTPS_PORT", default_value_t = 443)]
    pub ingress_https_port: u16,

    /// Ports the shared proxies listen on for Gateways (FIRST-LAST). Each Gateway on the shared
    /// pool gets a Service of its own (its own address) in this namespace, mapping its listener
    /// ports to ports of this range, so Gateways on one port stay apart
    /// (docs/shared-pool-addresses.md). `off`: shared Gateways are served on their listener
    /// ports themselves, behind the pool's one Service (host networking).
    #[arg(
        long,
        env = "COXSWAIN_SHARED_GATEWAY_PORTS",
        default_value = "20000-29999"
    )]
    pub shared_gateway_ports: SharedGatewayPorts,

    /// Also read the nginx.ingress.kubernetes.io/ equivalents of Coxswain's Ingress
    /// annotations (typed, never passed through), so an Ingress moves over by changing its
    /// class. Snippet annotations are never executed; each gets a Warning Event.
    #[arg(long, env = "COXSWAIN_INGRESS_NGINX_COMPAT")]
    pub ingress_nginx_compat: bool,

    /// Bootstrap calls one source address (an IPv6 /64) may make at once; each costs a
    /// TokenReview. Calls over the limit are refused with RESOURCE_EXHAUSTED.
    #[arg(long, env = "COXSWAIN_BOOTSTRAP_BURST", default_value_t = crate::identity::ratelimit::RateLimit::default().burst, value_parser = clap::value_parser!(u32).range(1..))]
    pub bootstrap_burst: u32,

    /// Bootstrap calls a source address regains per minute, up to --bootstrap-burst.
    #[arg(long, env = "COXSWAIN_BOOTSTRAP_PER_MINUTE", default_value_t = crate::identity::ratelimit::RateLimit::default().per_minute, value_parser = clap::value_parser!(u32).range(1..))]
    pub bootstrap_per_minute: u32,

    /// Fetch every remote JWKS (a CoxswainAccessPolicy's jwks.remote) at least this often, in
    /// seconds, even when its policy's refreshSeconds is longer. Unset: as the policies say
    /// (30 s at the least). For clusters that rotate keys faster, and for tests.
    #[arg(long, env = "COXSWAIN_JWKS_MAX_REFRESH_INTERVAL", value_parser = clap::value_parser!(u64).range(1..))]
    pub jwks_max_refresh_interval: Option<u64>,

    #[command(flatten)]
    pub tracing: TracingArgs,

    #[command(flatten)]
    pub admin: AdminArgs,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("mode").required(true).args(["shared", "dedicated", "snapshot_file"])))]
pub struct ProxyArgs {
    /// Serve every Ingress and every Gateway not opted into a dedicated proxy.
    #[arg(long, env = "COXSWAIN_PROXY_SHARED", conflicts_with_all = ["gateway_name", "gateway_namespace"])]
    pub shared: bool,

    /// Serve one Gateway only (requires --gateway-name and --gateway-namespace).
    #[arg(long, env = "COXSWAIN_PROXY_DEDICATED", requires_all = ["gateway_name", "gateway_namespace"])]
    pub dedicated: bool,

    /// Name of the Gateway a dedicated proxy serves.
    #[arg(long, env = "COXSWAIN_GATEWAY_NAME", value_name = "NAME")]
    pub gateway_name: Option<String>,

    /// Namespace of the Gateway a dedicated proxy serves.
    #[arg(long, env = "COXSWAIN_GATEWAY_NAMESPACE", value_name = "NS")]
    pub gateway_namespace: Option<String>,

    /// Standalone: serve this snapshot file (from `coxswain snapshot compile -o json`) without a
    /// controller, and reload it when it changes.
    #[arg(long, env = "COXSWAIN_SNAPSHOT_FILE", value_name = "PATH")]
    pub snapshot_file: Option<PathBuf>,

    /// Keep the last applied snapshot in this directory (shared and dedicated proxies) and serve
    /// it at start, before the controller answers, when its content hash verifies. Mount an
    /// emptyDir here: it survives container restarts, not a new Pod.
    #[arg(
        long,
        env = "COXSWAIN_SNAPSHOT_CACHE_DIR",
        value_name = "DIR",
        conflicts_with = "snapshot_file"
    )]
    pub snapshot_cache_dir: Option<PathBuf>,

    /// Address the snapshot's listener ports are bound on.
    #[arg(long, env = "COXSWAIN_BIND_ADDRESS", default_value = "0.0.0.0")]
    pub bind_address: std::net::IpAddr,

    /// After SIGTERM, how long in-flight requests may take before the proxy exits. Keep it
    /// and --shutdown-delay-seconds together below the pod's terminationGracePeriodSeconds.
    #[arg(long, env = "COXSWAIN_DRAIN_SECONDS", default_value_t = 15)]
    pub drain_seconds: u64,

    /// After SIGTERM, keep accepting new connections this long before draining (shared and
    /// dedicated proxies). A terminating Pod leaves its Service's endpoints while it receives
    /// SIGTERM, not before; until every load balancer and node has seen that, new connections
    /// still arrive, and a proxy that stopped accepting would leave them unanswered. A second
    /// signal ends the delay.
    #[arg(long, env = "COXSWAIN_SHUTDOWN_DELAY_SECONDS", default_value_t = 5)]
    pub shutdown_delay_seconds: u64,

    /// Worker threads (default: one per CPU).
    #[arg(long, env = "COXSWAIN_THREADS")]
    pub threads: Option<usize>,

    #[command(flatten)]
    pub limits: ProxyLimitArgs,

    #[command(flatten)]
    pub tracing: TracingArgs,

    /// Controller discovery stream endpoint(s), comma-separated, `https://` (mTLS).
    #[arg(
        long,
        env = "COXSWAIN_DISCOVERY_ENDPOINT",
        value_delimiter = ',',
        default_value = "https://coxswain-controller-discovery.coxswain-system.svc:50051"
    )]
    pub discovery_endpoint: Vec<String>,

    /// Controller bootstrap endpoint that issues this proxy's SVID.
    #[arg(
        long,
        env = "COXSWAIN_DISCOVERY_BOOTSTRAP_ENDPOINT",
        default_value = "https://coxswain-controller-discovery-bootstrap.coxswain-system.svc:50052"
    )]
    pub discovery_bootstrap_endpoint: String,

    /// CA bundle that signs the controller's discovery and bootstrap listeners (the published
    /// trust bundle, mounted from a ConfigMap).
    #[arg(
        long,
        env = "COXSWAIN_DISCOVERY_TRUST_BUNDLE",
        default_value = "/var/run/coxswain/trust/ca.crt"
    )]
    pub discovery_trust_bundle: PathBuf,

    /// Name of this proxy in the controller's records (downward API: the pod name).
    #[arg(long, env = "COXSWAIN_POD_NAME")]
    pub node_id: Option<String>,

    /// Projected ServiceAccount token (audience coxswain-discovery) used only for bootstrap.
    #[arg(
        long,
        env = "COXSWAIN_TOKEN_PATH",
        default_value = "/var/run/secrets/coxswain/token"
    )]
    pub token_path: PathBuf,

    #[command(flatten)]
    pub admin: AdminArgs,
}

/// Which snapshots a proxy subscribes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyMode {
    Shared,
    Dedicated {
        name: String,
        namespace: String,
    },
    /// Serve a snapshot file; no controller.
    Standalone(PathBuf),
}

impl ProxyArgs {
    /// The mode clap has already validated: exactly one of --shared and --dedicated, and a
    /// dedicated proxy always has both Gateway coordinates.
    pub fn mode(&self) -> ProxyMode {
        if let Some(path) = &self.snapshot_file {
            return ProxyMode::Standalone(path.clone());
        }
        match (&self.gateway_name, &self.gateway_namespace) {
            (Some(name), Some(namespace)) if self.dedicated => ProxyMode::Dedicated {
                name: name.clone(),
                namespace: namespace.clone(),
            },
            _ => ProxyMode::Shared,
        }
    }
}

#[derive(Debug, Args)]
pub struct AdminArgs {
    /// Health endpoints (`/healthz`, `/readyz`).
    #[arg(long, env = "COXSWAIN_HEALTH_ADDR", default_value_t = SocketAddr::from(([0, 0, 0, 0], names::HEALTH_PORT)))]
    pub health_addr: SocketAddr,

    /// Prometheus metrics (`/metrics`).
    #[arg(long, env = "COXSWAIN_METRICS_ADDR", default_value_t = SocketAddr::from(([0, 0, 0, 0], names::METRICS_PORT)))]
    pub metrics_addr: SocketAddr,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    fn proxy(args: &[&str]) -> Result<ProxyArgs, clap::Error> {
        let argv = ["coxswain", "serve", "proxy"].iter().chain(args);
        let cli = Cli::try_parse_from(argv)?;
        match cli.command {
            Command::Serve(Serve {
                role: ServeRole::Proxy(p),
            }) => Ok(p),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn dedicated_mode_carries_the_gateway() {
        let p = proxy(&[
            "--dedicated",
            "--gateway-name",
            "edge",
            "--gateway-namespace",
            "web",
        ])
        .unwrap();
        assert_eq!(
            p.mode(),
            ProxyMode::Dedicated {
                name: "edge".into(),
                namespace: "web".into()
            }
        );
    }

    #[test]
    fn proxy_mode_is_required_and_exclusive() {
        assert!(proxy(&[]).is_err());
        assert!(proxy(&["--shared", "--dedicated"]).is_err());
        assert!(proxy(&["--shared", "--gateway-name", "edge"]).is_err());
        assert!(proxy(&["--dedicated", "--gateway-name", "edge"]).is_err());
        assert_eq!(proxy(&["--shared"]).unwrap().mode(), ProxyMode::Shared);
    }

    #[test]
    fn tracing_flags_are_checked_when_parsed() {
        let p = proxy(&[
            "--shared",
            "--otlp-endpoint",
            "http://collector.observability:4317",
            "--trace-sampling-ratio",
            "0.25",
        ])
        .unwrap();
        assert_eq!(
            p.tracing.otlp_endpoint.as_deref(),
            Some("http://collector.observability:4317")
        );
        assert_eq!(p.tracing.trace_sampling_ratio, 0.25);
        // Off by default, everything recorded once on.
        let off = proxy(&["--shared"]).unwrap();
        assert_eq!(off.tracing.otlp_endpoint, None);
        assert_eq!(off.tracing.trace_sampling_ratio, 1.0);
        let err = proxy(&["--shared", "--trace-sampling-ratio", "1.5"]).unwrap_err();
        assert!(err.to_string().contains("not between 0 and 1"), "{err}");
        let err = proxy(&["--shared", "--otlp-endpoint", "collector:4317"]).unwrap_err();
        assert!(err.to_string().contains("http://"), "{err}");
    }

    #[test]
    fn trusted_proxies_are_checked_when_parsed() {
        let p = proxy(&["--shared", "--trusted-proxies", "10.0.0.0/8, 2001:db8::/32"]).unwrap();
        let limits = p.limits.limits();
        assert!(limits.client_address.trusts("10.1.2.3".parse().unwrap()));
        assert!(limits.client_address.trusts("2001:db8::1".parse().unwrap()));
        assert!(!limits.client_address.trusts("192.0.2.1".parse().unwrap()));
        let err = proxy(&["--shared", "--trusted-proxies", "10.0.0.0/40"]).unwrap_err();
        assert!(err.to_string().contains("10.0.0.0/40"), "{err}");
        assert!(
            !proxy(&["--shared"])
                .unwrap()
                .limits
                .limits()
                .client_address
                .proxy_protocol
        );
        assert!(
            proxy(&["--shared", "--proxy-protocol"])
                .unwrap()
                .limits
                .limits()
                .client_address
                .proxy_protocol
        );
    }

    #[test]
    fn discovery_endpoints_split_on_commas() {
        let p = proxy(&[
            "--shared",
            "--discovery-endpoint",
            "https://a:1,https://b:2",
        ])
        .unwrap();
        assert_eq!(p.discovery_endpoint, ["https://a:1", "https://b:2"]);
    }
}

/// OpenTelemetry traces, exported over OTLP/gRPC (`coxswain_proxy::trace`).
#[derive(Debug, Clone, clap::Args)]
pub struct TracingArgs {
    /// Export spans to this OTLP/gRPC collector, `http://host:port` (e.g.
    /// http://otel-collector.observability:4317). Unset, tracing is off: no spans, and a proxy
    /// passes a request's traceparent on as it came.
    #[arg(long, env = "COXSWAIN_OTLP_ENDPOINT", value_name = "URL", value_parser = parse_otlp_endpoint)]
    pub otlp_endpoint: Option<String>,

    /// Share of new traces recorded, 0 to 1. A request whose traceparent continues a trace
    /// follows that trace's sampled flag instead.
    #[arg(long, env = "COXSWAIN_TRACE_SAMPLING_RATIO", value_name = "RATIO", default_value_t = 1.0, value_parser = parse_sampling_ratio)]
    pub trace_sampling_ratio: f64,

    /// `service.name` of the spans (default: coxswain-proxy, or coxswain-controller).
    #[arg(long, env = "COXSWAIN_TRACE_SERVICE_NAME", value_name = "NAME")]
    pub trace_service_name: Option<String>,
}

fn parse_otlp_endpoint(s: &str) -> Result<String, String> {
    let s = s.trim();
    coxswain_proxy::trace::check_endpoint(s)
        .map(|()| s.to_owned())
        .map_err(|e| e.to_string())
}

fn parse_sampling_ratio(s: &str) -> Result<f64, String> {
    let ratio: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    coxswain_proxy::trace::check_ratio(ratio)
        .map(|()| ratio)
        .map_err(|e| e.to_string())
}

impl TracingArgs {
    /// Starts the span exporter when an endpoint is set. `resource`: attributes naming this
    /// process besides `service.name` (its Pod, the Gateway it serves).
    pub fn tracer(
        &self,
        default_service: &str,
        resource: Vec<(&'static str, String)>,
    ) -> Result<
        Option<std::sync::Arc<coxswain_proxy::trace::Tracer>>,
        coxswain_proxy::trace::TraceError,
    > {
        let Some(endpoint) = &self.otlp_endpoint else {
            return Ok(None);
        };
        let service = self
            .trace_service_name
            .as_deref()
            .unwrap_or(default_service);
        let mut settings =
            coxswain_proxy::trace::Settings::new(endpoint, self.trace_sampling_ratio, service);
        settings.resource = resource;
        let tracer = coxswain_proxy::trace::Tracer::start(settings)?;
        tracing::info!(
            %endpoint,
            sampling_ratio = self.trace_sampling_ratio,
            service,
            "exporting traces over OTLP/gRPC"
        );
        Ok(Some(tracer))
    }
}
