//! Test support: a real local Kubernetes control plane (etcd, kube-apiserver,
//! kube-controller-manager built from their Go modules by `hack/cluster`) shared by every test of
//! one test binary, and a fresh namespace per test.
//!
//! ```no_run
//! # async fn demo() {
//! let env = coxswain_testenv::TestEnv::new().await;
//! // env.client is a kube::Client for this test's runtime; env.namespace is new and empty.
//! # }
//! ```
//!
//! The cluster is started on first use, on free loopback ports, and torn down by a watchdog
//! once the test binary exits, however it exits. Set `COXSWAIN_TEST_KUBECONFIG` to run the tests
//! against a cluster that is already up (`make cluster-up`) instead.
//!
//! When a test fails, the tails of the apiserver and controller-manager logs are printed.
#![forbid(unsafe_code)]

pub mod node;
pub mod ports;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Label on every namespace a test creates, so leftovers on a shared cluster are easy to find.
pub const TEST_NAMESPACE_LABEL: &str = "coxswain-labs.dev/test";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("running {script}: {source}")]
    Spawn {
        script: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{script} failed ({status}); its output:\n{output}")]
    Script {
        script: PathBuf,
        status: std::process::ExitStatus,
        output: String,
    },
    #[error("reading kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("kube client: {0}")]
    Client(#[from] kube::Error),
}

/// One control plane instance.
#[derive(Debug)]
pub struct Cluster {
    kubeconfig: PathBuf,
    /// Present when this binary started the instance; then its logs are ours to show.
    state_dir: Option<PathBuf>,
}

impl Cluster {
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Directory with `kube-apiserver.log`, `kube-controller-manager.log` and `etcd.log`.
    pub fn logs_dir(&self) -> Option<PathBuf> {
        self.state_dir.as_ref().map(|d| d.join("logs"))
    }

    /// A kube client with admin rights. Make one per tokio runtime (each `#[tokio::test]` has
    /// its own): a client's connections belong to the runtime that made them.
    pub async fn client(&self) -> Result<Client, Error> {
        let kubeconfig =
            Kubeconfig::read_from(&self.kubeconfig).map_err(|source| Error::Kubeconfig {
                path: self.kubeconfig.clone(),
                source,
            })?;
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|source| Error::Kubeconfig {
                path: self.kubeconfig.clone(),
                source,
            })?;
        Ok(Client::try_from(config)?)
    }

    /// `kubectl` from the same Kubernetes release, pointed at this cluster.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(k8s_bin_dir().join("kubectl"));
        cmd.arg("--kubeconfig").arg(&self.kubeconfig);
        cmd
    }

    fn start() -> Result<Self, Error> {
        if let Some(path) = std::env::var_os("COXSWAIN_TEST_KUBECONFIG") {
            return Ok(Self {
                kubeconfig: PathBuf::from(path),
                state_dir: None,
            });
        }
        let ports = free_ports::<4>();
        let dir = cache_dir()
            .join("clusters")
            .join(format!("test-{}", std::process::id()));
        let script = repo_root().join("hack/cluster/up.sh");
        let output = Command::new("bash")
            .arg(&script)
            .env("COXSWAIN_CLUSTER_DIR", &dir)
            .env("COXSWAIN_ETCD_PORT", ports[0].to_string())
            .env("COXSWAIN_ETCD_PEER_PORT", ports[1].to_string())
            .env("COXSWAIN_APISERVER_PORT", ports[2].to_string())
            .env("COXSWAIN_KCM_PORT", ports[3].to_string())
            .env("COXSWAIN_CLUSTER_OWNER_PID", std::process::id().to_string())
            .stdin(Stdio::null())
            .output()
            .map_err(|source| Error::Spawn {
                script: script.clone(),
                source,
            })?;
        if !output.status.success() {
            return Err(Error::Script {
                script,
                status: output.status,
                output: String::from_utf8_lossy(&[output.stdout, output.stderr].concat())
                    .into_owned(),
            });
        }
        let kubeconfig = String::from_utf8_lossy(&output.stdout)
            .lines()
            .last()
            .map(PathBuf::from)
            .unwrap_or_else(|| dir.join("kubeconfig"));
        Ok(Self {
            kubeconfig,
            state_dir: Some(dir),
        })
    }
}

/// The test node of this test binary's cluster (see [`node`]), running in-process.
#[derive(Debug)]
pub struct TestNode {
    pub network: node::Network,
    /// Where each Pod's container logs are (`<ns>_<pod>_<uid>/<container>.log`).
    pub pods_dir: PathBuf,
    pids_dir: PathBuf,
}

impl TestNode {
    /// The process id of a running container (its process group leader), for tests that crash
    /// a container the way a kernel OOM kill or a node fault would.
    pub fn container_pid(&self, pod_uid: &str, container: &str) -> Option<u32> {
        std::fs::read_to_string(self.pids_dir.join(format!("{pod_uid}-{container}")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

impl Cluster {
    /// Starts the test node on this cluster once per test binary: Pods then run as processes.
    /// `images` maps image names (e.g. `coxswain`) to local binaries; `echo-basic` and `coredns`
    /// (built by hack/cluster/build.sh) are always there. The first call's images are the ones used. Panics when the node cannot start (it
    /// needs root, for network namespaces).
    pub fn start_node(&'static self, images: &[(&str, &Path)]) -> &'static TestNode {
        static NODE: OnceLock<Result<TestNode, String>> = OnceLock::new();
        let started = NODE.get_or_init(|| {
            let Some(dir) = self.state_dir.clone() else {
                return Err(
                    "the test node runs only on a cluster this test binary started \
                            (unset COXSWAIN_TEST_KUBECONFIG)"
                        .into(),
                );
            };
            let mut map: std::collections::HashMap<String, PathBuf> = images
                .iter()
                .map(|(name, path)| ((*name).to_owned(), path.to_path_buf()))
                .collect();
            map.insert("echo-basic".into(), echo_basic_bin());
            map.insert("coredns".into(), k8s_bin_dir().join("coredns"));
            let config = node::NodeConfig::for_cluster(&dir, map).map_err(|e| e.to_string())?;
            let network = node::Network::new(config.net_index);
            let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
            std::thread::Builder::new()
                .name("coxswain-test-node".into())
                .spawn(move || {
                    let runtime = match tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .enable_all()
                        .build()
                    {
                        Ok(r) => r,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                            return;
                        }
                    };
                    runtime.block_on(async move {
                        let client = match self.client().await {
                            Ok(c) => c,
                            Err(e) => {
                                let _ = ready_tx.send(Err(e.to_string()));
                                return;
                            }
                        };
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        let ready_tx2 = ready_tx.clone();
                        tokio::spawn(async move {
                            if rx.await.is_ok() {
                                let _ = ready_tx2.send(Ok(()));
                            }
                        });
                        let result =
                            node::run_notify(client, config, std::future::pending(), Some(tx))
                                .await;
                        if let Err(e) = result {
                            let _ = ready_tx.send(Err(e.to_string()));
                        }
                    });
                })
                .map_err(|e| e.to_string())?;
            ready_rx
                .recv_timeout(Duration::from_secs(60))
                .map_err(|e| format!("test node did not start: {e}"))??;
            Ok(TestNode {
                network,
                pods_dir: dir.join("node/pods"),
                pids_dir: dir.join("node/pids"),
            })
        });
        match started {
            Ok(node) => node,
            Err(e) => panic!("test node: {e}"),
        }
    }
}

/// The cluster of this test binary, started on first use.
pub fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
    match CLUSTER.get_or_init(|| Cluster::start().map_err(|e| e.to_string())) {
        Ok(c) => c,
        Err(e) => panic!("local control plane did not start: {e}"),
    }
}

/// What one test gets: a client for its own runtime and a fresh namespace.
pub struct TestEnv {
    pub client: Client,
    pub namespace: String,
    cluster: &'static Cluster,
}

impl TestEnv {
    /// Starts (or reuses) the cluster and creates a new namespace for the calling test.
    pub async fn new() -> Self {
        let cluster = tokio::task::spawn_blocking(cluster)
            .await
            .unwrap_or_else(|e| panic!("starting the cluster: {e}"));
        let client = match cluster.client().await {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let namespace = format!(
            "t{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(namespace.clone()),
                labels: Some([(TEST_NAMESPACE_LABEL.to_owned(), "true".to_owned())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        if let Err(e) = Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
        {
            panic!("creating test namespace {namespace}: {e}");
        }
        // The ServiceAccount admission plugin refuses Pods until the controller-manager has
        // created the namespace's "default" ServiceAccount; tests should not race it.
        let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(client.clone(), &namespace);
        eventually(
            "the namespace's default ServiceAccount",
            Duration::from_secs(30),
            || {
                let sas = sas.clone();
                async move { sas.get_opt("default").await.ok().flatten().map(|_| ()) }
            },
        )
        .await;
        Self {
            client,
            namespace,
            cluster,
        }
    }

    pub fn cluster(&self) -> &'static Cluster {
        self.cluster
    }

    /// A namespaced API in this test's namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let Some(logs) = self.cluster.logs_dir() else {
            return;
        };
        for name in ["kube-apiserver", "kube-controller-manager"] {
            let path = logs.join(format!("{name}.log"));
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!(
                "----- last {} lines of {} -----",
                tail.len(),
                path.display()
            );
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

/// Polls `probe` until it returns `Some`, or panics with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("COXSWAIN_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    home.join(".cache/coxswain")
}

/// Where hack/cluster/build.sh puts the binaries; asked from the script so the version is
/// spelled in one place.
pub fn k8s_bin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| env_sh_path("K8S_BIN")).clone()
}

/// The echo-basic build.sh made for the Gateway API release env.sh names (a directory per
/// release, so it is asked from the script too).
fn echo_basic_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| env_sh_path("ECHO_BASIC_BIN")).clone()
}

/// One path variable of hack/cluster/env.sh, as the scripts see it.
fn env_sh_path(var: &str) -> PathBuf {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("source \"$0\" && echo \"${var}\""))
        .arg(repo_root().join("hack/cluster/env.sh"))
        .output();
    match out {
        Ok(o) if o.status.success() => {
            PathBuf::from(String::from_utf8_lossy(&o.stdout).trim().to_owned())
        }
        _ => panic!("could not read {var} from hack/cluster/env.sh"),
    }
}

/// Loopback ports for the cluster's servers: from `ports`, so no `bind(0)` of this process
/// takes one of them before etcd or the API server binds it.
fn free_ports<const N: usize>() -> [u16; N] {
    std::array::from_fn(|_| ports::free_port())
}
