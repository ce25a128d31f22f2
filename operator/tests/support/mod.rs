//! Helpers shared by the operator's integration tests.
#![allow(dead_code, clippy::unwrap_used)]

pub mod silence;

use coxswain_testenv::TestEnv;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use std::io::{Read, Write};
use std::time::Duration;

/// A loopback port for a server a test starts, never one `bind(0)` could take meanwhile.
pub use coxswain_testenv::ports::free_port;

/// Creates the ServiceAccount if needed and returns a token for it with `audience`, bound to
/// Pod `{name}-0` of that ServiceAccount, as a projected token volume would hold.
pub async fn service_account_token(env: &TestEnv, name: &str, audience: &str) -> String {
    pod_token(env, name, &format!("{name}-0"), audience).await
}

/// Creates the ServiceAccount `sa` and a Pod `pod` running as it if needed, and returns a
/// token for `sa` with `audience` bound to that Pod: what the kubelet puts in a projected
/// token volume. The Pod is never scheduled (a scheduling gate holds it).
pub async fn pod_token(env: &TestEnv, sa: &str, pod: &str, audience: &str) -> String {
    pod_token_in(&env.client, &env.namespace, sa, pod, audience).await
}

/// [`pod_token`] in any namespace.
pub async fn pod_token_in(
    client: &kube::Client,
    namespace: &str,
    sa: &str,
    pod: &str,
    audience: &str,
) -> String {
    use k8s_openapi::api::authentication::v1::BoundObjectReference;
    use k8s_openapi::api::core::v1::{
        Capabilities, Container, Pod, PodSchedulingGate, PodSecurityContext, PodSpec,
        SeccompProfile, SecurityContext,
    };
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(sa.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    // Already there from an earlier call: fine.
    let _ = sas.create(&PostParams::default(), &account).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let spec = Pod {
        metadata: ObjectMeta {
            name: Some(pod.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            service_account_name: Some(sa.into()),
            automount_service_account_token: Some(false),
            scheduling_gates: Some(vec![PodSchedulingGate {
                name: "coxswain-labs.dev/test-never-scheduled".into(),
            }]),
            // Admitted by the restricted Pod Security level (Coxswain's namespace enforces it).
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            containers: vec![Container {
                name: "proxy".into(),
                image: Some("example.invalid/never-pulled:1".into()),
                security_context: Some(SecurityContext {
                    allow_privilege_escalation: Some(false),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".into()]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let existing = pods.get_opt(pod).await.unwrap();
    let created = match existing {
        Some(p) => p,
        None => pods.create(&PostParams::default(), &spec).await.unwrap(),
    };
    assert_eq!(
        created
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.as_deref()),
        Some(sa),
        "Pod {pod} runs as another ServiceAccount"
    );
    let req = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![audience.into()]),
            expiration_seconds: Some(3600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.into()),
                uid: created.metadata.uid.clone(),
            }),
        }),
        ..Default::default()
    };
    let issued: TokenRequest = sas
        .create_subresource("token", sa, &PostParams::default(), &req)
        .await
        .unwrap();
    issued.status.unwrap().token.unwrap()
}

/// A token for ServiceAccount `sa` (created if needed) bound to no object; `audience` None
/// means the API server's own.
pub async fn unbound_token(env: &TestEnv, sa: &str, audience: Option<&str>) -> String {
    let sas: Api<ServiceAccount> = env.api();
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(sa.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let _ = sas.create(&PostParams::default(), &account).await;
    let req = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: audience.map(|a| vec![a.to_owned()]),
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let issued: TokenRequest = sas
        .create_subresource("token", sa, &PostParams::default(), &req)
        .await
        .unwrap();
    issued.status.unwrap().token.unwrap()
}

/// One HTTP/1.1 GET over a fresh connection; the raw response.
pub fn http_get(port: u16, path: &str, host: &str) -> std::io::Result<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// `http_get` from async code.
pub async fn get(port: u16, path: &str) -> Result<String, String> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        http_get(port, &path, "app.example").map_err(|e| e.to_string())
    })
    .await
    .unwrap()
}

/// A backend answering every request with `body` after `delay`.
pub fn backend(body: &'static str, delay: Duration) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = c.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    std::thread::sleep(delay);
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if c.write_all(resp.as_bytes()).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// Manifests for the offline compiler: our GatewayClass, Gateway `web/edge` listening on
/// `listen`, and an HTTPRoute sending every path to Service `web/app`, whose EndpointSlice
/// points at `backend` on loopback (fine for `coxswain snapshot compile`, which does not
/// validate like the API server does).
pub fn app_manifests(listen: u16, backend: u16) -> String {
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: coxswain}}
spec: {{controllerName: coxswain-labs.dev/gateway-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: web}}
spec:
  gatewayClassName: coxswain
  listeners: [{{name: http, port: {listen}, protocol: HTTP}}]
---
apiVersion: v1
kind: Service
metadata: {{name: app, namespace: web}}
spec: {{ports: [{{port: 80}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: app-1, namespace: web, labels: {{kubernetes.io/service-name: app}}}}
addressType: IPv4
ports: [{{port: {backend}}}]
endpoints: [{{addresses: [127.0.0.1]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: app, namespace: web}}
spec:
  parentRefs: [{{name: edge}}]
  rules: [{{backendRefs: [{{name: app, port: 80}}]}}]
"#
    )
}

/// `coxswain snapshot compile -o json` of `manifests`, run with the binary `bin`: the snapshot
/// file it writes in `dir`.
pub fn compile_snapshot(bin: &str, dir: &std::path::Path, manifests: &str) -> std::path::PathBuf {
    let input = dir.join("manifests.yaml");
    std::fs::write(&input, manifests).unwrap();
    let out = std::process::Command::new(bin)
        .args(["snapshot", "compile", "-o", "json", "-f"])
        .arg(&input)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snapshot = dir.join("snapshot.json");
    std::fs::write(&snapshot, &out.stdout).unwrap();
    snapshot
}

/// Waits (30 s at most) until the proxy process `child`, with its admin listener on `admin`,
/// answers /readyz with 200; fails at once, with its exit status, when the process ended.
pub fn wait_proxy_ready(admin: u16, child: &mut std::process::Child) {
    let start = std::time::Instant::now();
    while !http_get(admin, "/readyz", "test").is_ok_and(|r| r.starts_with("HTTP/1.1 200")) {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the proxy exited before it was ready: {status}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "proxy never became ready"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Server-side applies multi-document YAML, whatever the kinds (field manager coxswain-test).
pub async fn apply_yaml(client: &kube::Client, yaml: &str) {
    if let Err(e) = try_apply_yaml(client, yaml).await {
        panic!("{e}");
    }
}

/// `apply_yaml` that reports instead of panicking, for kinds that may not be served yet.
pub async fn try_apply_yaml(client: &kube::Client, yaml: &str) -> Result<(), String> {
    use kube::api::{DynamicObject, GroupVersionKind, Patch, PatchParams};
    use kube::discovery::{Discovery, Scope};
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .map_err(|e| format!("API discovery: {e}"))?;
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let obj: DynamicObject = serde::Deserialize::deserialize(doc).unwrap();
        let types = obj.types.as_ref().unwrap();
        let (group, version) = types
            .api_version
            .rsplit_once('/')
            .unwrap_or(("", &types.api_version));
        let (resource, caps) = discovery
            .resolve_gvk(&GroupVersionKind::gvk(group, version, &types.kind))
            .ok_or_else(|| format!("no API for {}", types.kind))?;
        let api: Api<DynamicObject> = match (caps.scope, obj.metadata.namespace.as_deref()) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
            _ => Api::all_with(client.clone(), &resource),
        };
        let name = obj.metadata.name.clone().unwrap();
        api.patch(
            &name,
            &PatchParams::apply("coxswain-test").force(),
            &Patch::Apply(&obj),
        )
        .await
        .map_err(|e| format!("applying {} {name}: {e}", types.kind))?;
    }
    Ok(())
}

/// A controller for tests: listeners on loopback (certificate for `localhost`), CA created on
/// demand, the shared pool's default ServiceAccount, no Lease (it always leads), default image.
pub fn local_controller_config(
    namespace: &str,
    controller_name: &str,
    discovery_port: u16,
    bootstrap_port: u16,
) -> coxswain_operator::controller::ControllerConfig {
    coxswain_operator::controller::ControllerConfig {
        namespace: namespace.to_owned(),
        controller_name: controller_name.to_owned(),
        trust_domain: "cluster.local".into(),
        ca_mode: coxswain_operator::identity::store::CaMode::Auto,
        discovery_addr: ([127, 0, 0, 1], discovery_port).into(),
        bootstrap_addr: ([127, 0, 0, 1], bootstrap_port).into(),
        server_names: vec!["localhost".into()],
        shared_proxy_service_account: coxswain_api::names::SHARED_PROXY_SERVICE_ACCOUNT.into(),
        lease: None,
        proxy_image: None,
        ingress_ports: (80, 443),
        // The proxies of these tests run on loopback without a Service network: shared
        // Gateways are served on their listener ports.
        shared_gateway_ports: None,
        ingress_nginx_compat: false,
        bootstrap_rate_limit: Default::default(),
        tracer: None,
        health_addr: None,
        metrics_addr: None,
        jwks: Default::default(),
    }
}

/// A shared-pool proxy subscribed to an in-process controller on loopback: bootstrapped with
/// a TokenRequest token of ServiceAccount `coxswain-proxy` bound to Pod `node_id`, and the
/// trust bundle the controller published.
pub struct SharedProxy {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), coxswain_proxy::discovery::ServeError>>,
    _files: tempfile::TempDir,
}

impl SharedProxy {
    pub async fn start(
        env: &TestEnv,
        discovery_port: u16,
        bootstrap_port: u16,
        node_id: &str,
    ) -> Self {
        use coxswain_api::snapshot as snap;
        use k8s_openapi::api::core::v1::ConfigMap;
        let token = pod_token(env, "coxswain-proxy", node_id, "coxswain-discovery").await;
        let files = tempfile::tempdir().unwrap();
        std::fs::write(files.path().join("token"), token).unwrap();
        let maps: Api<ConfigMap> = env.api();
        let bundle = coxswain_testenv::eventually(
            "the controller publishes its trust bundle",
            Duration::from_secs(10),
            || async {
                maps.get_opt(coxswain_api::names::TRUST_BUNDLE_CONFIGMAP)
                    .await
                    .ok()??
                    .data?
                    .get("ca.crt")
                    .cloned()
            },
        )
        .await;
        std::fs::write(files.path().join("ca.crt"), bundle).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(coxswain_proxy::discovery::serve(
            coxswain_proxy::discovery::DiscoveryConfig {
                endpoints: vec![format!("https://localhost:{discovery_port}")],
                bootstrap_endpoint: format!("https://localhost:{bootstrap_port}"),
                token_path: files.path().join("token"),
                trust_bundle_path: files.path().join("ca.crt"),
                scope: snap::Scope {
                    kind: Some(snap::scope::Kind::SharedPool(snap::SharedPool {})),
                },
                node_id: node_id.into(),
                workers: 2,
                limits: Default::default(),
                liveness: Default::default(),
            },
            "127.0.0.1".parse().unwrap(),
            ([127, 0, 0, 1], free_port()).into(),
            Duration::from_secs(1),
            async {
                let _ = stopped.await;
            },
        ));
        Self {
            stop: Some(stop),
            task,
            _files: files,
        }
    }

    /// Stops it and waits for it to exit.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.unwrap().unwrap();
    }
}

/// The helm binary built from its Go module by hack/helm/build.sh (cached under
/// $HOME/.cache/coxswain/helm; the first call of a cold cache builds it).
pub fn helm_bin() -> std::path::PathBuf {
    static BIN: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| go_tool("hack/helm/build.sh")).clone()
}

/// hack/promql (Prometheus' PromQL parser and engine), built by hack/promql/build.sh.
pub fn promql_bin() -> std::path::PathBuf {
    static BIN: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| go_tool("hack/promql/build.sh")).clone()
}

/// Runs a repository build script that prints a cached binary's path as its last line.
fn go_tool(script: &str) -> std::path::PathBuf {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(script);
    let out = std::process::Command::new("bash")
        .arg(&script)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned();
    std::path::PathBuf::from(path)
}

/// One entry of a policy's `status.ancestors`, as the tests compare it: ancestor kind and
/// name, controller name, and the Accepted condition's (status, reason, observedGeneration).
pub type AncestorEntry = (
    String,
    String,
    String,
    Option<(String, String, Option<i64>)>,
);

/// A policy's ancestors by `name`, or None while it has none (or does not exist).
pub async fn policy_ancestors<K>(
    api: &kube::Api<K>,
    name: &str,
    ancestors: impl Fn(K) -> Option<Vec<coxswain_api::PolicyAncestorStatus>>,
) -> Option<Vec<AncestorEntry>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list: Vec<AncestorEntry> = ancestors(api.get(name).await.ok()?)?
        .into_iter()
        .map(|a| {
            let c = a.conditions.iter().find(|c| c.type_ == "Accepted").cloned();
            (
                a.ancestor_ref.kind,
                a.ancestor_ref.name,
                a.controller_name,
                c.map(|c| (c.status, c.reason, c.observed_generation)),
            )
        })
        .collect();
    (!list.is_empty()).then_some(list)
}
