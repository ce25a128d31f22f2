//! The test node against the local control plane: Deployments become running Pods with their
//! own addresses, Services and LoadBalancers forward to them, volumes and tokens are mounted,
//! failing containers restart, and deleted Pods leave nothing behind.

use coxswain_testenv::{TestEnv, TestNode, eventually};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(60);

async fn node(env: &TestEnv) -> &'static TestNode {
    let cluster = env.cluster();
    tokio::task::spawn_blocking(move || cluster.start_node(&[("shell", Path::new("/bin/sh"))]))
        .await
        .unwrap_or_else(|e| panic!("starting the test node: {e}"))
}

/// One HTTP/1.0 GET; the body parsed as JSON.
async fn get_json(addr: SocketAddr, path: &str) -> Option<serde_json::Value> {
    let mut stream =
        tokio::time::timeout(Duration::from_secs(3), tokio::net::TcpStream::connect(addr))
            .await
            .ok()?
            .ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: test.example\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return None;
    }
    serde_json::from_str(body).ok()
}

/// Fixtures are written as JSON (a subset of YAML) to keep this crate free of a YAML parser.
fn apply<K: serde::de::DeserializeOwned>(json: &str) -> K {
    match serde_json::from_str(json) {
        Ok(v) => v,
        Err(e) => panic!("fixture: {e}\n{json}"),
    }
}

fn echo_deployment(name: &str, replicas: i32) -> Deployment {
    apply(&format!(
        r#"{{
  "apiVersion": "apps/v1", "kind": "Deployment",
  "metadata": {{"name": "{name}"}},
  "spec": {{
    "replicas": {replicas},
    "selector": {{"matchLabels": {{"app": "{name}"}}}},
    "template": {{
      "metadata": {{"labels": {{"app": "{name}"}}}},
      "spec": {{
        "terminationGracePeriodSeconds": 5,
        "containers": [{{
          "name": "echo",
          "image": "gcr.io/k8s-staging-gateway-api/echo-basic:v20240412-v1.0.0-394-g40c666fd",
          "ports": [{{"name": "http", "containerPort": 3000}}],
          "env": [
            {{"name": "POD_NAME", "valueFrom": {{"fieldRef": {{"fieldPath": "metadata.name"}}}}}},
            {{"name": "NAMESPACE", "valueFrom": {{"fieldRef": {{"fieldPath": "metadata.namespace"}}}}}},
            {{"name": "SERVICE_NAME", "value": "{name}"}}
          ],
          "readinessProbe": {{"httpGet": {{"path": "/", "port": "http"}}, "periodSeconds": 1}}
        }}]
      }}
    }}
  }}
}}"#
    ))
}

fn service(name: &str, type_: &str, port: u16) -> Service {
    apply(&format!(
        r#"{{
  "apiVersion": "v1", "kind": "Service",
  "metadata": {{"name": "{name}"}},
  "spec": {{
    "type": "{type_}",
    "selector": {{"app": "{name}"}},
    "ports": [{{"name": "http", "port": {port}, "targetPort": "http"}}]
  }}
}}"#
    ))
}

async fn ready_pods(env: &TestEnv, app: &str, count: usize) -> Vec<Pod> {
    let pods: Api<Pod> = env.api();
    let lp = ListParams::default().labels(&format!("app={app}"));
    eventually(&format!("{count} Ready pods of {app}"), WAIT, || {
        let (pods, lp) = (pods.clone(), lp.clone());
        async move {
            let list = pods.list(&lp).await.ok()?;
            let ready: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.status.as_ref().is_some_and(|s| {
                            s.conditions
                                .iter()
                                .flatten()
                                .any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                })
                .collect();
            (ready.len() == count).then_some(ready)
        }
    })
    .await
}

fn pod_ip(pod: &Pod) -> std::net::IpAddr {
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .unwrap_or_default();
    ip.parse().unwrap_or_else(|e| panic!("pod IP {ip:?}: {e}"))
}

#[tokio::test]
async fn deployment_pods_get_addresses_endpoints_and_a_cluster_ip() {
    let env = TestEnv::new().await;
    let node = node(&env).await;
    let deployments: Api<Deployment> = env.api();
    let services: Api<Service> = env.api();
    let pp = PostParams::default();
    deployments
        .create(&pp, &echo_deployment("echo", 2))
        .await
        .expect("deployment");
    let svc = services
        .create(&pp, &service("echo", "ClusterIP", 80))
        .await
        .expect("service");

    let pods = ready_pods(&env, "echo", 2).await;
    let ips: BTreeSet<_> = pods.iter().map(pod_ip).collect();
    assert_eq!(ips.len(), 2, "distinct Pod IPs: {ips:?}");
    for pod in &pods {
        let ip = pod_ip(pod);
        let prefix = node.network.pod_cidr().trim_end_matches("0/24").to_owned();
        assert!(
            ip.to_string().starts_with(&prefix),
            "{ip} in {}",
            node.network.pod_cidr()
        );
        let name = pod.metadata.name.clone().unwrap_or_default();
        let body = get_json(SocketAddr::new(ip, 3000), "/hello")
            .await
            .unwrap_or_else(|| panic!("GET {ip}:3000"));
        assert_eq!(body["pod"], name.as_str(), "{body}");
        assert_eq!(body["namespace"], env.namespace.as_str(), "{body}");
        assert_eq!(body["path"], "/hello", "{body}");
        let status = pod.status.as_ref().expect("status");
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let containers = status
            .container_statuses
            .as_ref()
            .expect("container statuses");
        assert!(
            containers[0].ready
                && containers[0]
                    .state
                    .as_ref()
                    .and_then(|s| s.running.as_ref())
                    .is_some()
        );
    }

    // kube-controller-manager's EndpointSlice controller lists both, as in a real cluster.
    let slices: Api<EndpointSlice> = env.api();
    let lp = ListParams::default().labels("kubernetes.io/service-name=echo");
    let listed = eventually("an EndpointSlice with both Pods", WAIT, || {
        let (slices, lp, ips) = (slices.clone(), lp.clone(), ips.clone());
        async move {
            let list = slices.list(&lp).await.ok()?;
            let found: BTreeSet<std::net::IpAddr> = list
                .items
                .iter()
                .flat_map(|s| s.endpoints.iter().flatten())
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                .flat_map(|e| e.addresses.iter().filter_map(|a| a.parse().ok()))
                .collect();
            (found == ips).then_some(found)
        }
    })
    .await;
    assert_eq!(listed, ips);

    // The Service's cluster IP forwards to them.
    let cluster_ip: std::net::IpAddr = svc
        .spec
        .and_then(|s| s.cluster_ip)
        .and_then(|ip| ip.parse().ok())
        .expect("cluster IP");
    let names: BTreeSet<String> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let body = eventually("an answer through the cluster IP", WAIT, || {
        get_json(SocketAddr::new(cluster_ip, 80), "/via-service")
    })
    .await;
    assert!(
        names.contains(body["pod"].as_str().unwrap_or_default()),
        "{body}"
    );
}

#[tokio::test]
async fn load_balancer_service_gets_an_address_that_forwards_to_its_pods() {
    let env = TestEnv::new().await;
    node(&env).await;
    let pp = PostParams::default();
    env.api::<Deployment>()
        .create(&pp, &echo_deployment("lb", 2))
        .await
        .expect("deployment");
    let services: Api<Service> = env.api();
    services
        .create(&pp, &service("lb", "LoadBalancer", 8080))
        .await
        .expect("service");
    let pods = ready_pods(&env, "lb", 2).await;
    let names: BTreeSet<String> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();

    let ip: std::net::IpAddr = eventually("status.loadBalancer.ingress", WAIT, || {
        let services = services.clone();
        async move {
            let svc = services.get("lb").await.ok()?;
            let ip = svc.status?.load_balancer?.ingress?.first()?.ip.clone()?;
            ip.parse().ok()
        }
    })
    .await;
    assert!(
        ip.to_string().starts_with("10.97."),
        "address from the LoadBalancer pool: {ip}"
    );

    // Round robin over ready endpoints: both Pods answer within a few requests.
    let mut seen = BTreeSet::new();
    for _ in 0..20 {
        if let Some(body) = get_json(SocketAddr::new(ip, 8080), "/lb").await {
            seen.insert(body["pod"].as_str().unwrap_or_default().to_owned());
        }
        if seen == names {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        seen, names,
        "both Pods answer through the LoadBalancer address"
    );
}

async fn load_balancer_ip(services: &Api<Service>, name: &str) -> Option<std::net::IpAddr> {
    let svc = services.get(name).await.ok()?;
    let ip = svc.status?.load_balancer?.ingress?.first()?.ip.clone()?;
    ip.parse().ok()
}

async fn request_load_balancer_ip(services: &Api<Service>, name: &str, ip: &str) {
    let patch = serde_json::json!({"spec": {"loadBalancerIP": ip}});
    services
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("requesting {ip} for Service {name}: {e}"));
}

// A LoadBalancer provider honours `spec.loadBalancerIP` when it can (the Gateway API's
// static addresses rely on it) and leaves the Service without an address when it cannot.
#[tokio::test]
async fn load_balancer_honours_a_requested_address_in_its_pool_only() {
    let env = TestEnv::new().await;
    node(&env).await;
    let pp = PostParams::default();
    env.api::<Deployment>()
        .create(&pp, &echo_deployment("lbip", 1))
        .await
        .expect("deployment");
    let services: Api<Service> = env.api();
    services
        .create(&pp, &service("lbip", "LoadBalancer", 8080))
        .await
        .expect("service");
    ready_pods(&env, "lbip", 1).await;
    let assigned = eventually("a pool address", WAIT, || {
        load_balancer_ip(&services, "lbip")
    })
    .await;
    // The pool is 10.97.N.0/24: ask for its .250.
    let pool = assigned.to_string();
    let wanted: std::net::IpAddr = format!("{}.250", &pool[..pool.rfind('.').expect("IPv4")])
        .parse()
        .expect("address");

    request_load_balancer_ip(&services, "lbip", &wanted.to_string()).await;
    eventually("the requested address", WAIT, || async {
        (load_balancer_ip(&services, "lbip").await == Some(wanted)).then_some(())
    })
    .await;
    eventually("an answer through the requested address", WAIT, || {
        get_json(SocketAddr::new(wanted, 8080), "/lbip")
    })
    .await;

    // Outside the pool: refused, so the Service has no address at all.
    request_load_balancer_ip(&services, "lbip", "192.0.2.250").await;
    eventually(
        "no address for a request outside the pool",
        WAIT,
        || async {
            let svc = services.get("lbip").await.ok()?;
            let ingress = svc
                .status
                .and_then(|s| s.load_balancer)
                .and_then(|lb| lb.ingress)
                .unwrap_or_default();
            ingress.is_empty().then_some(())
        },
    )
    .await;
}

fn shell_pod(name: &str, script: &str, restart_policy: &str) -> Pod {
    let script = serde_json::to_string(script).unwrap_or_default();
    // Also mounted over $HOME, which holds the node's own state (~/.cache/coxswain): the other
    // volumes must still mount (their sources are staged before any target is covered).
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    apply(&format!(
        r#"{{
  "apiVersion": "v1", "kind": "Pod",
  "metadata": {{"name": "{name}", "labels": {{"app": "{name}"}}}},
  "spec": {{
    "restartPolicy": "{restart_policy}",
    "terminationGracePeriodSeconds": 3,
    "containers": [{{
      "name": "main",
      "image": "shell",
      "command": ["/bin/sh", "-c", {script}],
      "env": [{{"name": "GREETING", "value": "hello"}},
              {{"name": "POD_NAME", "valueFrom": {{"fieldRef": {{"fieldPath": "metadata.name"}}}}}},
              {{"name": "MESSAGE", "value": "$(GREETING) from $(POD_NAME), not $(LATER)"}},
              {{"name": "LATER", "value": "later"}}],
      "volumeMounts": [{{"name": "config", "mountPath": "/etc/test-config"}},
                       {{"name": "config", "mountPath": "{home}"}}]
    }}],
    "volumes": [{{"name": "config", "configMap": {{"name": "{name}"}}}}]
  }}
}}"#
    ))
}

async fn log_of(node: &TestNode, namespace: &str, pod: &str) -> String {
    let prefix = format!("{namespace}_{pod}_");
    let dir = std::fs::read_dir(&node.pods_dir)
        .map(|d| d.flatten().collect::<Vec<_>>())
        .unwrap_or_default();
    dir.iter()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .filter_map(|e| std::fs::read_to_string(e.path().join("main.log")).ok())
        .collect()
}

#[tokio::test]
async fn containers_get_volumes_tokens_environment_and_restarts() {
    let env = TestEnv::new().await;
    let node = node(&env).await;
    let pp = PostParams::default();
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> = env.api();
    let cm: k8s_openapi::api::core::v1::ConfigMap = apply(
        r#"{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "worker"}, "data": {"greeting.txt": "from a configmap"}}"#,
    );
    configmaps.create(&pp, &cm).await.expect("configmap");
    let pods: Api<Pod> = env.api();
    // The default ServiceAccount's projected token, CA and namespace are mounted by the
    // ServiceAccount admission plugin's volume; the script prints what it sees, then fails.
    let script = "echo \"msg=$MESSAGE\"; cat /etc/test-config/greeting.txt; echo; \
                  cat /var/run/secrets/kubernetes.io/serviceaccount/namespace; echo; \
                  wc -c < /var/run/secrets/kubernetes.io/serviceaccount/token; \
                  grep -c 'BEGIN CERTIFICATE' /var/run/secrets/kubernetes.io/serviceaccount/ca.crt; \
                  sleep 0.5; exit 3";
    pods.create(&pp, &shell_pod("worker", script, "OnFailure"))
        .await
        .expect("pod");

    let restarted = eventually("the failing container restarted", WAIT, || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("worker").await.ok()?;
            let status = pod.status?.container_statuses?.into_iter().next()?;
            let last = status.last_state?.terminated?;
            (status.restart_count >= 1).then_some(last.exit_code)
        }
    })
    .await;
    assert_eq!(restarted, 3, "lastState.terminated.exitCode");

    let log = log_of(node, &env.namespace, "worker").await;
    // Only variables defined earlier expand, as in Kubernetes.
    assert!(
        log.contains("msg=hello from worker, not $(LATER)"),
        "env expansion and downward API: {log}"
    );
    assert!(log.contains("from a configmap"), "configMap volume: {log}");
    assert!(log.contains(&env.namespace), "projected namespace: {log}");
    let token_len: usize = log
        .lines()
        .filter_map(|l| l.trim().parse::<usize>().ok())
        .find(|n| *n > 100)
        .unwrap_or(0);
    assert!(token_len > 100, "a projected token was written: {log}");

    // An image with no local binary: Pending, with a reason a person can act on.
    let mut bad = shell_pod("unknown-image", "true", "Never");
    if let Some(spec) = bad.spec.as_mut() {
        spec.containers[0].image = Some("docker.io/library/nginx:1.27".into());
        if let Some(cm) = spec.volumes.as_mut().and_then(|v| v[0].config_map.as_mut()) {
            cm.name = "worker".into();
        }
    }
    pods.create(&pp, &bad).await.expect("pod");
    let (phase, reason, message) = eventually("ErrImagePull on the unknown image", WAIT, || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("unknown-image").await.ok()?;
            let status = pod.status?;
            let waiting = status
                .container_statuses?
                .into_iter()
                .next()?
                .state?
                .waiting?;
            let reason = waiting.reason.filter(|r| r != "ContainerCreating")?;
            Some((status.phase?, reason, waiting.message.unwrap_or_default()))
        }
    })
    .await;
    assert_eq!(
        (phase.as_str(), reason.as_str()),
        ("Pending", "ErrImagePull")
    );
    assert!(
        message.contains("nginx") && message.contains("echo-basic"),
        "{message}"
    );
}

#[tokio::test]
async fn deleted_pods_stop_and_leave_no_namespace() {
    let env = TestEnv::new().await;
    let node = node(&env).await;
    let pp = PostParams::default();
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> = env.api();
    let cm: k8s_openapi::api::core::v1::ConfigMap = apply(
        r#"{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "sleeper"}, "data": {}}"#,
    );
    configmaps.create(&pp, &cm).await.expect("configmap");
    let pods: Api<Pod> = env.api();
    // Traps SIGTERM and exits, as a well-behaved process does within its grace period.
    let script = "trap 'echo got TERM; exit 0' TERM; echo started; while true; do sleep 0.1; done";
    let created = pods
        .create(&pp, &shell_pod("sleeper", script, "Always"))
        .await
        .expect("pod");
    let uid = created.metadata.uid.clone().unwrap_or_default();
    ready_pods(&env, "sleeper", 1).await;
    let netns = node.network.namespace_of(&uid);
    assert!(netns_exists(&netns), "{netns} exists while the Pod runs");
    // Ready only means the process was started: a SIGTERM that lands before the shell has
    // installed its trap kills it silently (a loaded CI machine showed that), so wait for
    // the line it prints once the trap is in place.
    eventually("the shell's trap is installed", WAIT, || async {
        log_of(node, &env.namespace, "sleeper")
            .await
            .contains("started")
            .then_some(())
    })
    .await;

    pods.delete("sleeper", &DeleteParams::default())
        .await
        .expect("delete");
    eventually("the Pod is gone", WAIT, || {
        let pods = pods.clone();
        async move {
            pods.get_opt("sleeper")
                .await
                .ok()
                .and_then(|p| p.is_none().then_some(()))
        }
    })
    .await;
    assert!(!netns_exists(&netns), "{netns} removed with the Pod");
    let log = log_of(node, &env.namespace, "sleeper").await;
    assert!(log.contains("got TERM"), "SIGTERM before SIGKILL: {log}");
}

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}
