//! `make bench-propagation`: how long a new HTTPRoute takes from `create` to its first 200
//! through the shared proxy, on a cluster already holding many routes.
//!
//! A real local control plane, the test node running an echo-basic backend Pod, the controller
//! (reflector, compiler, discovery, status writer) and a shared proxy bootstrapped with a
//! TokenRequest token, all in this process. `COXSWAIN_BENCH_EXISTING` routes (default 1,000)
//! are created first; then `COXSWAIN_BENCH_ADDED` (default 100) are added one by one, each
//! timed until a request with its hostname answers 200. Prints p50, p90, p99 and max.
#![allow(clippy::unwrap_used)] // a measurement program: a failed step ends it

#[path = "../tests/support/mod.rs"]
mod support;

use coxswain_api::names;
use coxswain_api::snapshot as snap;
use coxswain_operator::controller;
use coxswain_proxy::discovery::DiscoveryConfig;
use coxswain_testenv::{TestEnv, eventually};
use gateway_api::apis::experimental::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;
use std::time::{Duration, Instant};
use support::{apply_yaml, free_port, local_controller_config, service_account_token};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The status line of one HTTP/1.0 request to the proxy.
async fn status(port: u16, host: &str) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(format!("GET / HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    String::from_utf8_lossy(&buf)
        .lines()
        .next()
        .map(str::to_owned)
}

fn route(ns: &str, name: &str) -> HttpRoute {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "parentRefs": [{"name": "bench"}],
            "hostnames": [format!("{name}.bench.example")],
            "rules": [{"backendRefs": [{"name": "echo", "port": 8080}]}],
        }
    }))
    .unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let existing = env_count("COXSWAIN_BENCH_EXISTING", 1000);
    let added = env_count("COXSWAIN_BENCH_ADDED", 100);
    let env = TestEnv::new().await;
    let ns = env.namespace.clone();
    let cluster = env.cluster();
    tokio::task::spawn_blocking(move || cluster.start_node(&[]))
        .await
        .unwrap();

    let (discovery_port, bootstrap_port, listen) = (free_port(), free_port(), free_port());
    let (_stop_controller, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(controller::run(
        env.client.clone(),
        local_controller_config(&ns, names::CONTROLLER_NAME, discovery_port, bootstrap_port),
        async {
            let _ = stopped.await;
        },
    ));
    apply_yaml(
        &env.client,
        &format!(
            r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: echo, namespace: {ns}}}
spec:
  replicas: 1
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
    let dir = tempfile::tempdir().unwrap();
    let token = service_account_token(
        &env,
        names::SHARED_PROXY_SERVICE_ACCOUNT,
        names::TOKEN_AUDIENCE,
    )
    .await;
    std::fs::write(dir.path().join("token"), token).unwrap();
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
    std::fs::write(dir.path().join("ca.crt"), bundle).unwrap();
    tokio::spawn(coxswain_proxy::discovery::serve(
        DiscoveryConfig {
            endpoints: vec![format!("https://localhost:{discovery_port}")],
            bootstrap_endpoint: format!("https://localhost:{bootstrap_port}"),
            token_path: dir.path().join("token"),
            trust_bundle_path: dir.path().join("ca.crt"),
            scope: snap::Scope {
                kind: Some(snap::scope::Kind::SharedPool(snap::SharedPool {})),
            },
            node_id: "bench-proxy".into(),
            workers: 1,
            limits: Default::default(),
        },
        "127.0.0.1".parse().unwrap(),
        ([127, 0, 0, 1], free_port()).into(),
        Duration::from_secs(1),
        std::future::pending(),
    ));

    let routes: Api<HttpRoute> = env.api();
    let pp = PostParams::default();
    let started = Instant::now();
    for chunk in (0..existing).collect::<Vec<_>>().chunks(25) {
        let creates = chunk.iter().map(|i| {
            let (routes, pp) = (routes.clone(), pp.clone());
            let r = route(&ns, &format!("r{i}"));
            async move { routes.create(&pp, &r).await.map(|_| ()) }
        });
        for result in futures::future::join_all(creates).await {
            result.unwrap();
        }
    }
    if existing > 0 {
        let last = format!("r{}.bench.example", existing - 1);
        eventually(
            "the existing routes served",
            Duration::from_secs(600),
            || {
                let last = last.clone();
                async move {
                    let s = status(listen, &last).await?;
                    s.contains(" 200 ").then_some(())
                }
            },
        )
        .await;
    }
    eprintln!(
        "{existing} routes created and served in {:.1}s; adding {added} one by one",
        started.elapsed().as_secs_f64()
    );

    let mut latencies = Vec::with_capacity(added);
    for i in 0..added {
        let name = format!("n{i}");
        let host = format!("{name}.bench.example");
        let t0 = Instant::now();
        routes.create(&pp, &route(&ns, &name)).await.unwrap();
        loop {
            if status(listen, &host)
                .await
                .is_some_and(|s| s.contains(" 200 "))
            {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{host} never served"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        latencies.push(t0.elapsed());
    }
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "route propagation (create -> first 200), {added} routes added to {existing}: \
         p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        ms(percentile(&latencies, 50.0)),
        ms(percentile(&latencies, 90.0)),
        ms(percentile(&latencies, 99.0)),
        ms(latencies[latencies.len() - 1]),
    );
}
