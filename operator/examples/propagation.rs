//! `make bench-propagation [ROUTES=N]`: how fast route changes reach the shared proxy on a
//! cluster already holding N HTTPRoutes, and what the controller and the proxy weigh then.
//!
//! A real local control plane and the test node (Pods as local processes) run echo-basic
//! backends; the controller (`coxswain serve controller`) and one shared proxy (`coxswain serve
//! proxy --shared`, bootstrapped with a TokenRequest token) run as separate processes of the
//! release binary, so their RSS is their own. `COXSWAIN_BENCH_EXISTING` routes (N, default
//! 1,000) are created first, over one selector-less headless Service per 10 routes with one
//! EndpointSlice each (the object mix of a real cluster). Then, in order:
//!
//! 1. create -> first 200: `COXSWAIN_BENCH_ADDED` routes (default 100) added one by one;
//! 2. update -> new answer: `COXSWAIN_BENCH_UPDATED` existing routes (default 100) each get a
//!    new RequestHeaderModifier value, timed until echo-basic echoes it back;
//! 3. `COXSWAIN_BENCH_BATCH` routes (default 1,000) created at once, timed from the first
//!    create until a list shows every one Accepted;
//! 4. endpoint churn: the echo Deployment scaled along `COXSWAIN_BENCH_SCALE` (default 2,10,2)
//!    while a client sends requests through the proxy, counting failures;
//! 5. VmRSS and VmHWM of both processes, after the N routes are served and at the end.
//!
//! Prints p50, p90, p99 and max of 1 and 2, and a summary block with every figure.
#![allow(clippy::unwrap_used)] // a measurement program: a failed step ends it

#[path = "../tests/support/mod.rs"]
mod support;

use coxswain_api::names;
use coxswain_testenv::{TestEnv, eventually};
use futures::StreamExt;
use gateway_api::apis::experimental::httproutes::HttpRoute;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use support::{apply_yaml, free_port, service_account_token};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Routes per backend Service among the existing ones.
const ROUTES_PER_SERVICE: usize = 10;
/// API requests in flight while creating objects in bulk.
const CREATE_CONCURRENCY: usize = 25;
/// Client requests keep going this long after each scaling step reaches its ready count, so
/// failures from endpoints the proxy still holds are counted too.
const CHURN_SETTLE: Duration = Duration::from_secs(5);
/// Pause between the steady client's requests (about 100 requests a second).
const CLIENT_PAUSE: Duration = Duration::from_millis(10);
/// The steady client gives up on a request after this long (a failure); one slower than
/// `SLOW` but answered in time is counted as slow.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(15);
const SLOW: Duration = Duration::from_secs(1);
/// Label on the routes of one set (existing, batch), so a list reads only them.
const SET_LABEL: &str = "bench.coxswain-labs.dev/set";

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One HTTP/1.0 GET through the proxy: the status line and the body, or what went wrong.
async fn try_fetch(port: u16, host: &str, timeout: Duration) -> Result<(String, String), String> {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        s.write_all(format!("GET / HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)
            .await
            .map_err(|e| format!("read: {e}"))?;
        Ok::<_, String>(buf)
    };
    let buf = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("no answer within {} s", timeout.as_secs()))??;
    let text = String::from_utf8_lossy(&buf);
    let status = text.lines().next().unwrap_or("empty answer").to_owned();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

async fn fetch(port: u16, host: &str) -> Option<(String, String)> {
    try_fetch(port, host, Duration::from_secs(5)).await.ok()
}

fn is_ok(status: &str) -> bool {
    status.split_whitespace().nth(1) == Some("200")
}

/// Polls `host` every 2 ms until it answers 200 and `body_has` (when given) is in the body.
async fn wait_answer(port: u16, host: &str, body_has: Option<&str>, started: Instant) {
    loop {
        if let Some((status, body)) = fetch(port, host).await
            && is_ok(&status)
            && body_has.is_none_or(|want| body.contains(want))
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{host} never answered as expected"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn route(ns: &str, name: &str, backend: &str, labels: serde_json::Value) -> HttpRoute {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "parentRefs": [{"name": "bench"}],
            "hostnames": [format!("{name}.bench.example")],
            "rules": [{"backendRefs": [{"name": backend, "port": 8080}]}],
        }
    }))
    .unwrap()
}

/// How many routes of set `set` have a parent with Accepted=True, by one list.
async fn accepted(routes: &Api<HttpRoute>, set: &str) -> usize {
    let lp = ListParams::default().labels(&format!("{SET_LABEL}={set}"));
    routes
        .list(&lp)
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|r| {
                    r.status.as_ref().is_some_and(|s| {
                        s.parents.iter().any(|p| {
                            p.conditions
                                .iter()
                                .any(|c| c.type_ == "Accepted" && c.status == "True")
                        })
                    })
                })
                .count()
        })
        .unwrap_or(0)
}

/// Creates every object, `CREATE_CONCURRENCY` requests at a time.
async fn create_all<K>(api: &Api<K>, objects: Vec<K>)
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let pp = PostParams::default();
    let mut results = futures::stream::iter(objects)
        .map(|o| {
            let (api, pp) = (api.clone(), pp.clone());
            async move { api.create(&pp, &o).await.map(|_| ()) }
        })
        .buffer_unordered(CREATE_CONCURRENCY);
    while let Some(result) = results.next().await {
        result.unwrap();
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// "p50 .. ms, p90 .. ms, p99 .. ms, max .. ms" of unsorted samples.
fn distribution(samples: &mut [Duration]) -> String {
    if samples.is_empty() {
        return "no samples".into();
    }
    samples.sort();
    format!(
        "p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        ms(percentile(samples, 50.0)),
        ms(percentile(samples, 90.0)),
        ms(percentile(samples, 99.0)),
        ms(samples[samples.len() - 1]),
    )
}

/// A child process killed when the bench ends, however it ends.
struct Process(std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// (VmRSS, VmHWM) of a process, in MiB.
fn rss_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .map_or(f64::NAN, |kib| kib / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The controller's compile passes, total compile seconds and status writes so far, from its
/// /metrics.
#[derive(Clone, Copy, Default)]
struct ControllerCounters {
    passes: f64,
    compile_seconds: f64,
    status_writes: f64,
}

impl ControllerCounters {
    async fn read(port: u16) -> Self {
        let text = tokio::task::spawn_blocking(move || {
            support::http_get(port, "/metrics", "localhost").unwrap_or_default()
        })
        .await
        .unwrap();
        let value = |l: &str| {
            l.rsplit_once(' ')
                .and_then(|(_, v)| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let mut c = Self::default();
        for l in text.lines() {
            if l.starts_with("coxswain_controller_compile_duration_seconds_count ") {
                c.passes = value(l);
            } else if l.starts_with("coxswain_controller_compile_duration_seconds_sum ") {
                c.compile_seconds = value(l);
            } else if l.starts_with("coxswain_controller_status_writes_total{") {
                c.status_writes += value(l);
            }
        }
        c
    }

    /// What happened between `before` and now, as one line.
    fn since(&self, before: &Self) -> String {
        let passes = self.passes - before.passes;
        let compile = self.compile_seconds - before.compile_seconds;
        let mean = if passes > 0.0 {
            compile * 1000.0 / passes
        } else {
            0.0
        };
        format!(
            "{passes:.0} compile passes (mean {mean:.1} ms, total {compile:.2} s), {:.0} status writes",
            self.status_writes - before.status_writes
        )
    }
}

/// The release binary next to this example (target/release/examples/propagation ->
/// target/release/coxswain), unless `COXSWAIN_BENCH_BIN` names another.
fn coxswain_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("COXSWAIN_BENCH_BIN") {
        return bin.into();
    }
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(Path::parent)
        .unwrap()
        .join("coxswain")
}

fn log_file(dir: &Path, name: &str) -> std::fs::File {
    std::fs::File::create(dir.join(name)).unwrap()
}

/// Total endpoints with `ready: true` in the EndpointSlices of Service `service`.
async fn ready_endpoints(slices: &Api<EndpointSlice>, service: &str) -> usize {
    let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={service}"));
    let Ok(list) = slices.list(&lp).await else {
        return usize::MAX;
    };
    list.items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .count()
}

/// Requests sent and failed (non-200 or no answer) by the steady client, the slow ones, and
/// the failures by kind.
#[derive(Default)]
struct ClientCounts {
    sent: AtomicU64,
    failed: AtomicU64,
    slow: AtomicU64,
    slowest_ms: AtomicU64,
    kinds: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let existing = env_count("COXSWAIN_BENCH_EXISTING", 1000);
    let added = env_count("COXSWAIN_BENCH_ADDED", 100);
    let updated = env_count("COXSWAIN_BENCH_UPDATED", 100);
    let batch = env_count("COXSWAIN_BENCH_BATCH", 1000);
    let scale: Vec<i32> = std::env::var("COXSWAIN_BENCH_SCALE")
        .unwrap_or_else(|_| "2,10,2".into())
        .split(',')
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let bin = coxswain_bin();
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build --release --bin coxswain` (make \
         bench-propagation does) or set COXSWAIN_BENCH_BIN",
        bin.display()
    );
    let logs = std::env::temp_dir().join(format!("coxswain-propagation-{}", std::process::id()));
    std::fs::create_dir_all(&logs).unwrap();
    eprintln!("controller and proxy logs in {}", logs.display());

    let env = TestEnv::new().await;
    let ns = env.namespace.clone();
    let cluster = env.cluster();
    tokio::task::spawn_blocking(move || cluster.start_node(&[]))
        .await
        .unwrap();

    let (discovery_port, bootstrap_port, listen) = (free_port(), free_port(), free_port());
    let (controller_metrics, proxy_metrics) = (free_port(), free_port());
    let controller = Process(
        Command::new(&bin)
            .args(["serve", "controller", "--shared-gateway-ports", "off"])
            .args(["--discovery-addr", &format!("127.0.0.1:{discovery_port}")])
            .args(["--bootstrap-addr", &format!("127.0.0.1:{bootstrap_port}")])
            .args(["--health-addr", &format!("127.0.0.1:{}", free_port())])
            .args(["--metrics-addr", &format!("127.0.0.1:{controller_metrics}")])
            .env("KUBECONFIG", cluster.kubeconfig())
            .env("COXSWAIN_NAMESPACE", &ns)
            .env(
                "COXSWAIN_LOG",
                std::env::var("COXSWAIN_BENCH_CONTROLLER_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log_file(&logs, "controller.log"))
            .stderr(log_file(&logs, "controller.err"))
            .spawn()
            .unwrap(),
    );
    let low = scale.first().copied().unwrap_or(2);
    apply_yaml(
        &env.client,
        &format!(
            r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: echo, namespace: {ns}}}
spec:
  replicas: {low}
  selector: {{matchLabels: {{app: echo}}}}
  template:
    metadata: {{labels: {{app: echo}}}}
    spec:
      containers:
      - name: echo
        image: echo-basic
        ports: [{{name: http, containerPort: 3000}}]
        readinessProbe: {{httpGet: {{path: /, port: http}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: {ns}}}
spec:
  selector: {{app: echo}}
  ports: [{{name: http, port: 8080, targetPort: http}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: echo-static, namespace: {ns}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: echo-static}}}}
  template:
    metadata: {{labels: {{app: echo-static}}}}
    spec:
      containers:
      - name: echo
        image: echo-basic
        ports: [{{name: http, containerPort: 3000}}]
        readinessProbe: {{httpGet: {{path: /, port: http}}, periodSeconds: 1}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: coxswain}}
spec: {{controllerName: {controller}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: bench, namespace: {ns}}}
spec:
  gatewayClassName: coxswain
  listeners: [{{name: http, port: {listen}, protocol: HTTP}}]
"#,
            controller = names::CONTROLLER_NAME
        ),
    )
    .await;

    // The shared proxy, as its Pod would run it: audience token and the published trust bundle.
    let token = service_account_token(
        &env,
        names::SHARED_PROXY_SERVICE_ACCOUNT,
        names::TOKEN_AUDIENCE,
    )
    .await;
    std::fs::write(logs.join("token"), token).unwrap();
    let maps: Api<ConfigMap> = env.api();
    let bundle = eventually("the trust bundle", Duration::from_secs(60), || {
        let maps = maps.clone();
        async move {
            maps.get_opt(names::TRUST_BUNDLE_CONFIGMAP)
                .await
                .ok()??
                .data?
                .get("ca.crt")
                .cloned()
        }
    })
    .await;
    std::fs::write(logs.join("ca.crt"), bundle).unwrap();
    let proxy = Process(
        Command::new(&bin)
            .args(["serve", "proxy", "--shared", "--bind-address", "127.0.0.1"])
            .args([
                "--discovery-endpoint",
                &format!("https://localhost:{discovery_port}"),
            ])
            .args([
                "--discovery-bootstrap-endpoint",
                &format!("https://localhost:{bootstrap_port}"),
            ])
            .arg("--discovery-trust-bundle")
            .arg(logs.join("ca.crt"))
            .arg("--token-path")
            .arg(logs.join("token"))
            .args(["--health-addr", &format!("127.0.0.1:{}", free_port())])
            .args(["--metrics-addr", &format!("127.0.0.1:{proxy_metrics}")])
            .env_remove("KUBECONFIG")
            .env(
                "COXSWAIN_LOG",
                std::env::var("COXSWAIN_BENCH_PROXY_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log_file(&logs, "proxy.log"))
            .stderr(log_file(&logs, "proxy.err"))
            .spawn()
            .unwrap(),
    );

    // The existing routes' backends: headless Services without a selector, each with one
    // EndpointSlice on a Pod the churn below does not touch.
    let pods: Api<Pod> = env.api();
    let static_ip = eventually(
        "the echo-static Pod ready",
        Duration::from_secs(120),
        || {
            let pods = pods.clone();
            async move {
                let list = pods
                    .list(&ListParams::default().labels("app=echo-static"))
                    .await
                    .ok()?;
                list.items.iter().find_map(|p| {
                    let status = p.status.as_ref()?;
                    let ready = status
                        .conditions
                        .iter()
                        .flatten()
                        .any(|c| c.type_ == "Ready" && c.status == "True");
                    ready.then(|| status.pod_ip.clone()).flatten()
                })
            }
        },
    )
    .await;
    let services = existing.div_ceil(ROUTES_PER_SERVICE);
    let setup = Instant::now();
    let svc_objects: Vec<Service> = (0..services)
        .map(|k| {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("s{k}"), "namespace": ns},
                "spec": {
                    "clusterIP": "None",
                    "ports": [{"name": "http", "port": 8080, "targetPort": 3000}],
                },
            }))
            .unwrap()
        })
        .collect();
    create_all(&env.api::<Service>(), svc_objects).await;
    let slice_objects: Vec<EndpointSlice> = (0..services)
        .map(|k| {
            serde_json::from_value(serde_json::json!({
                "metadata": {
                    "name": format!("s{k}-bench"),
                    "namespace": ns,
                    "labels": {"kubernetes.io/service-name": format!("s{k}")},
                },
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 3000, "protocol": "TCP"}],
                "endpoints": [{"addresses": [static_ip], "conditions": {"ready": true}}],
            }))
            .unwrap()
        })
        .collect();
    let slices: Api<EndpointSlice> = env.api();
    create_all(&slices, slice_objects).await;

    let routes: Api<HttpRoute> = env.api();
    let no_labels = serde_json::json!({});
    let existing_label = serde_json::json!({SET_LABEL: "existing"});
    let existing_routes: Vec<HttpRoute> = (0..existing)
        .map(|i| {
            let backend = format!("s{}", i / ROUTES_PER_SERVICE);
            route(&ns, &format!("r{i}"), &backend, existing_label.clone())
        })
        .collect();
    create_all(&routes, existing_routes).await;
    // The steady client's route, on the Deployment the churn scales.
    routes
        .create(
            &PostParams::default(),
            &route(&ns, "steady", "echo", no_labels.clone()),
        )
        .await
        .unwrap();
    let created = setup.elapsed();
    for host in ["steady.bench.example".to_owned()]
        .into_iter()
        .chain((existing > 0).then(|| format!("r{}.bench.example", existing - 1)))
    {
        eventually(&format!("{host} served"), Duration::from_secs(1800), || {
            let host = host.clone();
            async move { fetch(listen, &host).await.filter(|(s, _)| is_ok(s)) }
        })
        .await;
    }
    let served = setup.elapsed();
    // The controller idle before measuring: a new route waits for every status write of the
    // pass before it, so a backlog of the existing routes' statuses would be timed too.
    loop {
        let n = accepted(&routes, "existing").await;
        if n == existing {
            break;
        }
        assert!(
            setup.elapsed() < Duration::from_secs(3600),
            "only {n} of {existing} existing routes Accepted after an hour"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let all_accepted = setup.elapsed();
    let rss_loaded = (rss_mib(controller.0.id()), rss_mib(proxy.0.id()));
    eprintln!(
        "{existing} routes, {services} Services and EndpointSlices created in {:.1}s, served \
         in {:.1}s, all Accepted in {:.1}s",
        created.as_secs_f64(),
        served.as_secs_f64(),
        all_accepted.as_secs_f64()
    );
    let mut counters = vec![("setup", ControllerCounters::read(controller_metrics).await)];

    // 1. create -> first 200, one route at a time.
    let mut create_latencies = Vec::with_capacity(added);
    for i in 0..added {
        let name = format!("n{i}");
        let host = format!("{name}.bench.example");
        let t0 = Instant::now();
        let sent_at = time::OffsetDateTime::now_utc();
        routes
            .create(
                &PostParams::default(),
                &route(&ns, &name, "echo", no_labels.clone()),
            )
            .await
            .unwrap();
        let created = t0.elapsed();
        wait_answer(listen, &host, None, t0).await;
        create_latencies.push(t0.elapsed());
        // COXSWAIN_BENCH_TRACE=1: when each create was sent, to line up with the controller's
        // and the proxy's logs (COXSWAIN_BENCH_CONTROLLER_LOG=coxswain_operator=debug).
        if std::env::var_os("COXSWAIN_BENCH_TRACE").is_some() {
            eprintln!(
                "create {name}: sent at {sent_at}, POST answered after {} ms, 200 after {} ms",
                created.as_millis(),
                t0.elapsed().as_millis()
            );
        }
    }
    let create_line = distribution(&mut create_latencies);
    println!(
        "route propagation (create -> first 200), {added} routes added to {existing}: \
         {create_line}"
    );
    counters.push(("create", ControllerCounters::read(controller_metrics).await));

    // 2. update -> new answer: a new request header value on routes spread over the set.
    let targets: Vec<String> = if existing > 0 {
        (0..updated)
            .map(|j| format!("r{}", j * existing / updated.max(1)))
            .collect()
    } else {
        (0..updated)
            .map(|j| format!("n{}", j % added.max(1)))
            .collect()
    };
    let mut update_latencies = Vec::with_capacity(updated);
    for (j, name) in targets.iter().enumerate() {
        let backend = match name.strip_prefix('r') {
            Some(i) => format!("s{}", i.parse::<usize>().unwrap() / ROUTES_PER_SERVICE),
            None => "echo".into(),
        };
        // Unique per run, so an earlier run's value can never match.
        let value = format!("u{j}-{}", std::process::id());
        let patch = serde_json::json!({"spec": {"rules": [{
            "backendRefs": [{"name": backend, "port": 8080}],
            "filters": [{
                "type": "RequestHeaderModifier",
                "requestHeaderModifier": {"set": [{"name": "x-bench", "value": value}]},
            }],
        }]}});
        let t0 = Instant::now();
        routes
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        wait_answer(listen, &format!("{name}.bench.example"), Some(&value), t0).await;
        update_latencies.push(t0.elapsed());
    }
    let update_line = distribution(&mut update_latencies);
    println!(
        "route update (patch -> new header echoed), {updated} routes of {}: {update_line}",
        existing + added + 1
    );
    counters.push(("update", ControllerCounters::read(controller_metrics).await));

    // 3. A batch created at once: time until a list shows every one Accepted.
    let batch_routes: Vec<HttpRoute> = (0..batch)
        .map(|i| {
            route(
                &ns,
                &format!("b{i}"),
                "echo",
                serde_json::json!({SET_LABEL: "batch"}),
            )
        })
        .collect();
    let t0 = Instant::now();
    create_all(&routes, batch_routes).await;
    let batch_created = t0.elapsed();
    let mut first_accepted = None;
    let batch_accepted = loop {
        let accepted = accepted(&routes, "batch").await;
        if accepted > 0 && first_accepted.is_none() {
            first_accepted = Some(t0.elapsed());
        }
        if accepted == batch {
            break t0.elapsed();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(1800),
            "only {accepted} of {batch} routes Accepted after 30 min"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let batch_line = format!(
        "creates done {:.2} s, first Accepted {:.2} s, last Accepted {:.2} s after the first create",
        batch_created.as_secs_f64(),
        first_accepted.unwrap_or_default().as_secs_f64(),
        batch_accepted.as_secs_f64()
    );
    println!("{batch} routes created at once: {batch_line}");
    counters.push(("batch", ControllerCounters::read(controller_metrics).await));

    // 4. Endpoint churn under a steady client.
    let counts = Arc::new(ClientCounts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let client = tokio::spawn({
        let (counts, stop) = (counts.clone(), stop.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                let answer = try_fetch(listen, "steady.bench.example", CLIENT_TIMEOUT).await;
                let took = t0.elapsed();
                counts.sent.fetch_add(1, Ordering::Relaxed);
                counts
                    .slowest_ms
                    .fetch_max(took.as_millis() as u64, Ordering::Relaxed);
                let failure = match answer {
                    Ok((status, _)) if is_ok(&status) => None,
                    Ok((status, _)) => Some(status),
                    Err(e) => Some(e),
                };
                match failure {
                    Some(kind) => {
                        counts.failed.fetch_add(1, Ordering::Relaxed);
                        *counts.kinds.lock().unwrap().entry(kind).or_default() += 1;
                    }
                    None if took > SLOW => {
                        counts.slow.fetch_add(1, Ordering::Relaxed);
                    }
                    None => {}
                }
                tokio::time::sleep(CLIENT_PAUSE).await;
            }
        }
    });
    let deployments: Api<Deployment> = env.api();
    let mut churn_lines = Vec::new();
    tokio::time::sleep(CHURN_SETTLE).await;
    churn_lines.push(format!(
        "  before: {} sent, {} failed in {} s at {low} replicas",
        counts.sent.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
        CHURN_SETTLE.as_secs()
    ));
    let (mut sent0, mut failed0) = (
        counts.sent.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
    );
    for &replicas in scale.iter().skip(1) {
        let t0 = Instant::now();
        deployments
            .patch(
                "echo",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}})),
            )
            .await
            .unwrap();
        let want = usize::try_from(replicas).unwrap();
        loop {
            if ready_endpoints(&slices, "echo").await == want {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(300),
                "the echo EndpointSlices never showed {replicas} ready endpoints"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let ready = t0.elapsed();
        tokio::time::sleep(CHURN_SETTLE).await;
        churn_lines.push(format!(
            "  scale to {replicas}: {want} ready in the EndpointSlice after {:.1} s; {} sent, {} \
             failed (until {} s later)",
            ready.as_secs_f64(),
            counts.sent.load(Ordering::Relaxed) - sent0,
            counts.failed.load(Ordering::Relaxed) - failed0,
            CHURN_SETTLE.as_secs()
        ));
        (sent0, failed0) = (
            counts.sent.load(Ordering::Relaxed),
            counts.failed.load(Ordering::Relaxed),
        );
    }
    stop.store(true, Ordering::Relaxed);
    // The request in flight may be one that hangs: it counts, in a line of its own.
    client.await.unwrap();
    churn_lines.push(format!(
        "  the request in flight when the client stopped: {} sent, {} failed",
        counts.sent.load(Ordering::Relaxed) - sent0,
        counts.failed.load(Ordering::Relaxed) - failed0,
    ));
    let (sent, failed, slow, slowest) = (
        counts.sent.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
        counts.slow.load(Ordering::Relaxed),
        counts.slowest_ms.load(Ordering::Relaxed),
    );
    let kinds = counts.kinds.lock().unwrap().clone();
    println!("endpoint churn {scale:?}: {sent} requests sent, {failed} failed");
    counters.push(("churn", ControllerCounters::read(controller_metrics).await));

    // 5. Memory: both processes now, after everything above.
    let rss_end = (rss_mib(controller.0.id()), rss_mib(proxy.0.id()));
    let total_routes = existing + 1 + added + batch;

    println!();
    println!("=== bench-propagation summary ===");
    println!(
        "cluster: {existing} existing HTTPRoutes over {services} headless Services with one \
         EndpointSlice each ({ROUTES_PER_SERVICE} routes per Service), 1 Gateway, echo \
         Deployment at {low} replicas; {total_routes} HTTPRoutes at the end"
    );
    println!(
        "setup: created in {:.1} s; after the first create, last one served at {:.1} s, all \
         Accepted at {:.1} s (measuring starts then)",
        created.as_secs_f64(),
        served.as_secs_f64(),
        all_accepted.as_secs_f64()
    );
    println!("1. create -> first 200 ({added} routes, one by one): {create_line}");
    println!("2. update -> new answer ({updated} header changes): {update_line}");
    println!("3. {batch} routes at once: {batch_line}");
    println!(
        "4. endpoint churn {scale:?} under one client (one request at a time, {} ms apart, new \
         connection each, gives up after {} s):",
        CLIENT_PAUSE.as_millis(),
        CLIENT_TIMEOUT.as_secs()
    );
    for l in &churn_lines {
        println!("{l}");
    }
    println!(
        "  total: {sent} requests sent, {failed} failed; {slow} answered 200 but took over {} s; \
         slowest {slowest} ms",
        SLOW.as_secs()
    );
    for (kind, n) in &kinds {
        println!("  failed {n}x: {kind}");
    }
    let mem = |label: &str, (rss, hwm): (f64, f64)| {
        println!("{label}: VmRSS {rss:.1} MiB (peak VmHWM {hwm:.1} MiB)");
    };
    mem(
        &format!("5. controller RSS after {existing} routes served"),
        rss_loaded.0,
    );
    mem(
        &format!("   shared proxy RSS after {existing} routes served"),
        rss_loaded.1,
    );
    mem(
        &format!("   controller RSS at the end ({total_routes} routes)"),
        rss_end.0,
    );
    mem(
        &format!("   shared proxy RSS at the end ({total_routes} routes)"),
        rss_end.1,
    );
    println!("controller passes per phase (from its /metrics):");
    println!(
        "  setup: {}",
        counters[0].1.since(&ControllerCounters::default())
    );
    for pair in counters.windows(2) {
        println!("  {}: {}", pair[1].0, pair[1].1.since(&pair[0].1));
    }
    drop(proxy);
    drop(controller);
}
