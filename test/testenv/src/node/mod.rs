//! The test node: a stand-in kubelet for machines without a container runtime.
//!
//! It registers one Node, binds every unscheduled Pod to it, and runs each Pod as real
//! processes in a network namespace of its own (a veth on a host bridge, an address from the
//! instance's Pod range). Images map to local binaries (`coxswain` → the built coxswain binary,
//! `echo-basic` → the Gateway API conformance echo server); any other image leaves the Pod
//! Pending with `ErrImagePull` and a message saying so. It also plays kube-proxy (Service
//! cluster IPs, forwarded in user space to ready endpoints) and a LoadBalancer provider
//! (addresses from the instance's LoadBalancer range, reachable from the host).
//!
//! Address plan for network index N (claimed by hack/cluster/up.sh): Pods 10.244.N.0/24 behind
//! bridge `cxbrN` (10.244.N.1, also the node's address), Services 10.96.N.0/24 and
//! LoadBalancers 10.97.N.0/24 as /32s on the same bridge. Pod namespaces are `cxN-…`, so
//! hack/cluster/down.sh can remove everything by index even after a crash.
//!
//! Not a kubelet: no image pulls, no cgroups or resource limits, user IDs and capabilities are
//! not applied (processes run as root), no exec/attach/port-forward API, no Service environment
//! variables. Container output is in `<cluster-dir>/node/pods/<ns>_<pod>_<uid>/<container>.log`,
//! and served to the API server for `kubectl logs` (see [`logs`]).

mod logs;
mod net;
mod pod;
mod probe;
mod services;
mod volumes;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub use net::Network;

/// The Node this agent registers.
pub const NODE_NAME: &str = "coxswain-node";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed: {stderr}")]
    Command { command: String, stderr: String },
    #[error("{0}")]
    Config(String),
}

impl Error {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| Self::Io { what, source }
    }
}

/// What the agent needs to know about its cluster instance.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The instance's state directory (hack/cluster's COXSWAIN_CLUSTER_DIR).
    pub cluster_dir: PathBuf,
    /// The instance's network index (`<cluster_dir>/run/net-index`).
    pub net_index: u8,
    /// Where the `kubernetes` Service forwards: the apiserver on loopback.
    pub apiserver: SocketAddr,
    /// Image name (the repository's last path segment) → local binary.
    pub images: HashMap<String, PathBuf>,
}

impl NodeConfig {
    /// Reads the network index and the apiserver address from an instance's directory.
    pub fn for_cluster(
        cluster_dir: &Path,
        images: HashMap<String, PathBuf>,
    ) -> Result<Self, Error> {
        let index_file = cluster_dir.join("run/net-index");
        let text = std::fs::read_to_string(&index_file)
            .map_err(Error::io(format!("reading {}", index_file.display())))?;
        let net_index = text.trim().parse::<u8>().map_err(|e| {
            Error::Config(format!(
                "{}: not a network index: {e}",
                index_file.display()
            ))
        })?;
        let kubeconfig = cluster_dir.join("kubeconfig");
        let text = std::fs::read_to_string(&kubeconfig)
            .map_err(Error::io(format!("reading {}", kubeconfig.display())))?;
        let apiserver = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("server: https://"))
            .and_then(|hostport| hostport.trim().parse::<SocketAddr>().ok())
            .ok_or_else(|| {
                Error::Config(format!(
                    "{}: no `server: https://IP:PORT` line",
                    kubeconfig.display()
                ))
            })?;
        Ok(Self {
            cluster_dir: cluster_dir.to_owned(),
            net_index,
            apiserver,
            images,
        })
    }

    fn state_dir(&self) -> PathBuf {
        self.cluster_dir.join("node")
    }
}

/// Shared by every task of the agent.
pub(crate) struct Shared {
    pub client: Client,
    pub config: NodeConfig,
    pub network: Network,
    /// Service name → cluster IP, per namespace: what each Pod's /etc/hosts lists.
    pub hosts: watch::Receiver<Arc<services::HostsTable>>,
    /// Host parts (10.244.N.x) of the Pod addresses in use.
    ips: std::sync::Mutex<std::collections::HashSet<u8>>,
}

impl Shared {
    pub fn allocate_ip(&self) -> Option<u8> {
        let mut used = match self.ips.lock() {
            Ok(u) => u,
            Err(poisoned) => poisoned.into_inner(),
        };
        let host = (2..=254).find(|h| !used.contains(h))?;
        used.insert(host);
        Some(host)
    }

    pub fn release_ip(&self, host: u8) {
        let mut used = match self.ips.lock() {
            Ok(u) => u,
            Err(poisoned) => poisoned.into_inner(),
        };
        used.remove(&host);
    }

    /// The local binary for an image: matched on the repository's last path segment, without
    /// registry, tag or digest (`ghcr.io/coxswain-labs/coxswain:v1` → `coxswain`).
    pub fn binary_for(&self, image: &str) -> Option<&Path> {
        self.config
            .images
            .get(image_name(image))
            .map(PathBuf::as_path)
    }

    /// The `kubernetes` Service's address: the first of the instance's Service range.
    pub fn kubernetes_service_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 96, self.config.net_index, 1)
    }
}

/// `registry:port/path/name:tag@digest` → `name`.
pub fn image_name(image: &str) -> &str {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    last.split(':').next().unwrap_or(last)
}

/// Runs the node until `shutdown` resolves, then stops every Pod's processes and removes the
/// host network it created.
pub async fn run(
    client: Client,
    config: NodeConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Error> {
    run_notify(client, config, shutdown, None).await
}

/// [`run`], sending on `ready` once the Node is registered and Pods are being watched.
pub async fn run_notify(
    client: Client,
    config: NodeConfig,
    shutdown: impl std::future::Future<Output = ()>,
    ready: Option<tokio::sync::oneshot::Sender<()>>,
) -> Result<(), Error> {
    let network = Network::new(config.net_index);
    network.setup_host().await?;
    let state = config.state_dir();
    std::fs::create_dir_all(state.join("pids"))
        .map_err(Error::io(format!("creating {}", state.display())))?;
    register_node(&client, &network).await?;
    tracing::info!(
        node = NODE_NAME,
        index = config.net_index,
        "test node registered"
    );

    let (hosts_tx, hosts_rx) = watch::channel(Arc::new(services::HostsTable::default()));
    let shared = Arc::new(Shared {
        client: client.clone(),
        config,
        network,
        hosts: hosts_rx,
        ips: Default::default(),
    });
    let heartbeat = tokio::spawn(heartbeat(client.clone(), shared.network.clone()));
    let logs = {
        let (dir, ip) = (state.join("pods"), shared.network.gateway().into());
        tokio::spawn(async move {
            if let Err(e) = logs::serve(dir, ip).await {
                tracing::warn!(error = %e, "no container log endpoint: kubectl logs will fail");
            }
        })
    };
    let services = tokio::spawn(services::run(shared.clone(), hosts_tx));
    let mut pods = PodSet::default();
    if let Some(ready) = ready {
        let _ = ready.send(());
    }
    let result = tokio::select! {
        r = watch_pods(shared.clone(), &mut pods) => r,
        () = shutdown => Ok(()),
    };
    heartbeat.abort();
    logs.abort();
    services.abort();
    pods.stop_all().await;
    shared.network.teardown_host().await;
    result
}

async fn register_node(client: &Client, network: &Network) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let cidr = network.pod_cidr();
    let node = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE_NAME,
            "labels": {
                "kubernetes.io/hostname": NODE_NAME,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "coxswain-test-node",
            },
        },
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
    });
    let pp = PatchParams::apply("coxswain-test-node").force();
    nodes.patch(NODE_NAME, &pp, &Patch::Apply(&node)).await?;
    nodes
        .patch_status(NODE_NAME, &pp, &Patch::Apply(&node_status(network)))
        .await?;
    Ok(())
}

fn node_status(network: &Network) -> serde_json::Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        serde_json::json!({
            "type": type_, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        })
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE_NAME},
        "status": {
            "conditions": [
                condition("Ready", "True", "TestNodeReady", "coxswain test node is running Pods as processes"),
                condition("MemoryPressure", "False", "TestNodeHasSufficientMemory", "no memory pressure"),
                condition("DiskPressure", "False", "TestNodeHasNoDiskPressure", "no disk pressure"),
                condition("PIDPressure", "False", "TestNodeHasSufficientPID", "no PID pressure"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": network.gateway().to_string()},
                {"type": "Hostname", "address": NODE_NAME},
            ],
            // Where the API server fetches container logs (the API server is told to reach
            // the node by its InternalIP: the Hostname does not resolve).
            "daemonEndpoints": {"kubeletEndpoint": {"Port": logs::KUBELET_PORT}},
            "capacity": {"cpu": cpus.to_string(), "memory": "16Gi", "pods": "250"},
            "allocatable": {"cpu": cpus.to_string(), "memory": "16Gi", "pods": "250"},
            "nodeInfo": {
                "architecture": "amd64", "operatingSystem": "linux",
                "bootID": "", "machineID": "", "systemUUID": "", "kernelVersion": "",
                "osImage": "coxswain test node", "containerRuntimeVersion": "process://",
                "kubeletVersion": "v0.0.0-coxswain-test-node", "kubeProxyVersion": "",
            },
        },
    })
}

/// Keeps the node Ready: the node lifecycle controller taints a node whose heartbeat stops.
async fn heartbeat(client: Client, network: Network) {
    let nodes: Api<Node> = Api::all(client);
    let pp = PatchParams::apply("coxswain-test-node").force();
    loop {
        tokio::time::sleep(Duration::from_secs(10)).await;
        if let Err(e) = nodes
            .patch_status(NODE_NAME, &pp, &Patch::Apply(&node_status(&network)))
            .await
        {
            tracing::warn!(error = %e, "node heartbeat failed");
        }
    }
}

/// The Pods this node runs, by UID: each has a supervisor task fed the latest object.
#[derive(Default)]
struct PodSet {
    pods: HashMap<String, (watch::Sender<Option<Pod>>, tokio::task::JoinHandle<()>)>,
}

impl PodSet {
    fn update(&mut self, shared: &Arc<Shared>, pod: Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        if let Some((tx, _)) = self.pods.get(&uid) {
            tx.send_replace(Some(pod));
            return;
        }
        // A Pod that already finished before this agent saw it is not run again.
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed"))
            && pod.metadata.deletion_timestamp.is_none()
        {
            return;
        }
        let (tx, rx) = watch::channel(Some(pod));
        let task = tokio::spawn(pod::supervise(shared.clone(), uid.clone(), rx));
        self.pods.insert(uid, (tx, task));
    }

    /// The Pod object is gone (force-deleted, or deleted after we confirmed termination).
    fn gone(&mut self, uid: &str) {
        if let Some((tx, _)) = self.pods.get(uid) {
            tx.send_replace(None);
        }
    }

    fn reap(&mut self) {
        self.pods.retain(|_, (_, task)| !task.is_finished());
    }

    async fn stop_all(&mut self) {
        for (tx, _) in self.pods.values() {
            tx.send_replace(None);
        }
        for (_, (_, task)) in self.pods.drain() {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }
}

async fn watch_pods(shared: Arc<Shared>, pods: &mut PodSet) -> Result<(), Error> {
    let api: Api<Pod> = Api::all(shared.client.clone());
    let mut stream = watcher(api.clone(), watcher::Config::default()).boxed();
    let mut relisted: Option<std::collections::HashSet<String>> = None;
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "pod watch failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        match event {
            watcher::Event::Init => relisted = Some(Default::default()),
            watcher::Event::InitApply(pod) | watcher::Event::Apply(pod) => {
                if let (Some(seen), Some(uid)) = (relisted.as_mut(), pod.metadata.uid.as_ref()) {
                    seen.insert(uid.clone());
                }
                handle_pod(&shared, pods, &api, pod).await;
            }
            watcher::Event::InitDone => {
                if let Some(seen) = relisted.take() {
                    let missing: Vec<String> = pods
                        .pods
                        .keys()
                        .filter(|uid| !seen.contains(*uid))
                        .cloned()
                        .collect();
                    for uid in missing {
                        pods.gone(&uid);
                    }
                }
            }
            watcher::Event::Delete(pod) => {
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    pods.gone(uid);
                }
            }
        }
        pods.reap();
    }
    Ok(())
}

async fn handle_pod(shared: &Arc<Shared>, pods: &mut PodSet, api: &Api<Pod>, pod: Pod) {
    let spec = pod.spec.as_ref();
    match spec.and_then(|s| s.node_name.as_deref()) {
        Some(NODE_NAME) => pods.update(shared, pod),
        Some(_) => {}
        None => {
            // Scheduling: this is the cluster's only node, so every Pod for the default
            // scheduler is bound here, as kube-scheduler would with one feasible node.
            let scheduler = spec.and_then(|s| s.scheduler_name.as_deref());
            if pod.metadata.deletion_timestamp.is_none()
                && matches!(scheduler, None | Some("default-scheduler"))
            {
                bind(api, &pod).await;
            }
        }
    }
}

async fn bind(api: &Api<Pod>, pod: &Pod) {
    let (Some(ns), Some(name)) = (
        pod.metadata.namespace.as_deref(),
        pod.metadata.name.as_deref(),
    ) else {
        return;
    };
    let api: Api<Pod> = Api::namespaced(api.clone().into_client(), ns);
    let binding = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": ns, "uid": pod.metadata.uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME},
    });
    match api
        .create_subresource::<_, serde_json::Value>(
            "binding",
            name,
            &PostParams::default(),
            &binding,
        )
        .await
    {
        Ok(_) => tracing::info!(namespace = ns, pod = name, "bound"),
        // Already bound (a watch event raced the binding) is fine.
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => tracing::warn!(namespace = ns, pod = name, error = %e, "binding failed"),
    }
}

/// Pod IPs are handed out from the instance's /24.
pub(crate) fn pod_ip(index: u8, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, index, host)
}

#[cfg(test)]
mod tests {
    #[test]
    fn image_names() {
        for (image, name) in [
            ("coxswain", "coxswain"),
            ("ghcr.io/coxswain-labs/coxswain:v0.1.0", "coxswain"),
            ("localhost:5000/coxswain@sha256:abc", "coxswain"),
            (
                "gcr.io/k8s-staging-gateway-api/echo-basic:v20240412-v1.0.0-394-g40c666fd",
                "echo-basic",
            ),
        ] {
            assert_eq!(super::image_name(image), name, "{image}");
        }
    }
}
