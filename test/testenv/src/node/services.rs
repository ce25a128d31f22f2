//! kube-proxy and LoadBalancer provider of the test node, in user space: a TCP listener (or UDP
//! socket) on every Service cluster IP and LoadBalancer address port, forwarding each
//! connection (each UDP client's datagrams) to a ready endpoint from the Service's
//! EndpointSlices (round robin). Also keeps the Service → cluster IP
//! table every Pod's /etc/hosts is written from (there is no cluster DNS).

use super::Shared;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{Notify, watch};

/// Service name → cluster IP for every Service that has one.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct HostsTable {
    /// (namespace, name) → cluster IP.
    pub services: BTreeMap<(String, String), Ipv4Addr>,
}

impl HostsTable {
    /// /etc/hosts for a Pod in `namespace`: its own name, and every Service under the names a
    /// cluster DNS would answer (`svc`, `svc.ns`, `svc.ns.svc`, `svc.ns.svc.cluster.local`; the
    /// bare name only in the Pod's own namespace, as the DNS search path would).
    pub fn render(&self, namespace: &str, hostname: &str, pod_ip: Ipv4Addr) -> String {
        let mut out = format!(
            "# written by the coxswain test node\n127.0.0.1\tlocalhost\n::1\tlocalhost\n{pod_ip}\t{hostname}\n"
        );
        for ((ns, name), ip) in &self.services {
            let mut names = format!("{name}.{ns}.svc.cluster.local {name}.{ns}.svc {name}.{ns}");
            if ns == namespace {
                names.push(' ');
                names.push_str(name);
            }
            out.push_str(&format!("{ip}\t{names}\n"));
        }
        out
    }
}

/// Where a listener sends its connections.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Backend {
    /// The `kubernetes` Service: the apiserver on the host's loopback.
    Fixed(SocketAddr),
    /// Endpoints of a Service port: (namespace, service, port name).
    Endpoints(String, String, String),
}

#[derive(Default)]
struct EndpointTable {
    ready: RwLock<HashMap<(String, String, String), Vec<SocketAddr>>>,
    next: AtomicUsize,
}

impl EndpointTable {
    fn candidates(&self, backend: &Backend) -> Vec<SocketAddr> {
        match backend {
            Backend::Fixed(addr) => vec![*addr],
            Backend::Endpoints(ns, svc, port) => {
                let table = match self.ready.read() {
                    Ok(t) => t,
                    Err(poisoned) => poisoned.into_inner(),
                };
                let Some(list) = table.get(&(ns.clone(), svc.clone(), port.clone())) else {
                    return Vec::new();
                };
                if list.is_empty() {
                    return Vec::new();
                }
                let start = self.next.fetch_add(1, Ordering::Relaxed) % list.len();
                list[start..]
                    .iter()
                    .chain(&list[..start])
                    .copied()
                    .collect()
            }
        }
    }
}

struct Listener {
    backend: watch::Sender<Backend>,
    task: tokio::task::JoinHandle<()>,
}

/// A Service port's transport: the same number may be served over both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Transport {
    Tcp,
    Udp,
}

pub(crate) async fn run(shared: Arc<Shared>, hosts: watch::Sender<Arc<HostsTable>>) {
    let client = shared.client.clone();
    let changed = Arc::new(Notify::new());
    let (services, svc_writer) = reflector::store::<Service>();
    let (slices, slice_writer) = reflector::store::<EndpointSlice>();
    for task in [
        spawn_reflector(
            reflector::reflector(
                svc_writer,
                watcher(Api::<Service>::all(client.clone()), Default::default()),
            )
            .applied_objects()
            .map(|r| r.map(|_| ()))
            .boxed(),
            changed.clone(),
        ),
        spawn_reflector(
            reflector::reflector(
                slice_writer,
                watcher(
                    Api::<EndpointSlice>::all(client.clone()),
                    Default::default(),
                ),
            )
            .touched_objects()
            .map(|r| r.map(|_| ()))
            .boxed(),
            changed.clone(),
        ),
    ] {
        drop(task);
    }
    let mut proxy = Proxy {
        shared,
        endpoints: Arc::new(EndpointTable::default()),
        listeners: HashMap::new(),
        addresses: HashSet::new(),
        load_balancers: HashMap::new(),
    };
    loop {
        changed.notified().await;
        // Debounce: a Deployment's rollout touches many objects at once.
        tokio::time::sleep(Duration::from_millis(50)).await;
        proxy.reconcile(&services, &slices, &hosts).await;
    }
}

fn spawn_reflector(
    stream: futures::stream::BoxStream<'static, Result<(), watcher::Error>>,
    changed: Arc<Notify>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut stream = stream;
        while let Some(item) = stream.next().await {
            if let Err(e) = item {
                tracing::debug!(error = %e, "service/endpointslice watch error; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            changed.notify_one();
        }
    })
}

struct Proxy {
    shared: Arc<Shared>,
    endpoints: Arc<EndpointTable>,
    listeners: HashMap<(SocketAddrV4, Transport), Listener>,
    addresses: HashSet<Ipv4Addr>,
    /// (namespace, name) → allocated LoadBalancer address.
    load_balancers: HashMap<(String, String), Ipv4Addr>,
}

impl Proxy {
    async fn reconcile(
        &mut self,
        services: &Store<Service>,
        slices: &Store<EndpointSlice>,
        hosts: &watch::Sender<Arc<HostsTable>>,
    ) {
        let services = services.state();
        self.update_endpoints(&slices.state());

        let mut table = HostsTable::default();
        let mut wanted: HashMap<(SocketAddrV4, Transport), Backend> = HashMap::new();
        let mut live_lbs = HashSet::new();
        for svc in &services {
            let (ns, name) = (svc.namespace().unwrap_or_default(), svc.name_any());
            let Some(spec) = svc.spec.as_ref() else {
                continue;
            };
            let cluster_ip = spec
                .cluster_ip
                .as_deref()
                .and_then(|ip| ip.parse::<Ipv4Addr>().ok());
            let lb_ip = if spec.type_.as_deref() == Some("LoadBalancer") {
                live_lbs.insert((ns.clone(), name.clone()));
                self.load_balancer_address(svc, &ns, &name).await
            } else {
                None
            };
            if let Some(ip) = cluster_ip {
                table.services.insert((ns.clone(), name.clone()), ip);
            }
            for port in spec.ports.iter().flatten() {
                let transport = match port.protocol.as_deref() {
                    None | Some("TCP") => Transport::Tcp,
                    Some("UDP") => Transport::Udp,
                    Some(_) => continue,
                };
                let Ok(number) = u16::try_from(port.port) else {
                    continue;
                };
                let backend = if ns == "default" && name == "kubernetes" {
                    Backend::Fixed(self.shared.config.apiserver)
                } else {
                    Backend::Endpoints(
                        ns.clone(),
                        name.clone(),
                        port.name.clone().unwrap_or_default(),
                    )
                };
                for ip in cluster_ip.iter().chain(lb_ip.iter()) {
                    wanted.insert((SocketAddrV4::new(*ip, number), transport), backend.clone());
                }
            }
        }
        self.load_balancers.retain(|k, _| live_lbs.contains(k));
        self.apply_listeners(wanted).await;
        hosts.send_if_modified(|current| {
            if **current == table {
                false
            } else {
                *current = Arc::new(table);
                true
            }
        });
    }

    fn update_endpoints(&self, slices: &[Arc<EndpointSlice>]) {
        let mut ready: HashMap<(String, String, String), Vec<SocketAddr>> = HashMap::new();
        for slice in slices {
            let Some(service) = slice.labels().get("kubernetes.io/service-name") else {
                continue;
            };
            let ns = slice.namespace().unwrap_or_default();
            for port in slice.ports.iter().flatten() {
                let Some(number) = port.port.and_then(|p| u16::try_from(p).ok()) else {
                    continue;
                };
                let entry = ready
                    .entry((
                        ns.clone(),
                        service.clone(),
                        port.name.clone().unwrap_or_default(),
                    ))
                    .or_default();
                for endpoint in slice.endpoints.iter().flatten() {
                    // Unset `ready` means ready (EndpointSlice API).
                    if endpoint.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                        continue;
                    }
                    for address in &endpoint.addresses {
                        if let Ok(ip) = address.parse::<std::net::IpAddr>() {
                            entry.push(SocketAddr::new(ip, number));
                        }
                    }
                }
                entry.sort();
                entry.dedup();
            }
        }
        let mut table = match self.endpoints.ready.write() {
            Ok(t) => t,
            Err(poisoned) => poisoned.into_inner(),
        };
        *table = ready;
    }

    /// The Service's LoadBalancer address. A requested one (`spec.loadBalancerIP`) is
    /// honoured when it is in the pool and no other Service has it, and refused otherwise (no
    /// address, as a real provider leaves it pending). Without a request: the one already in
    /// its status when it is ours, else the lowest free one in the pool. Written to
    /// status.loadBalancer.ingress.
    async fn load_balancer_address(
        &mut self,
        svc: &Service,
        ns: &str,
        name: &str,
    ) -> Option<Ipv4Addr> {
        let key = (ns.to_owned(), name.to_owned());
        let network = &self.shared.network;
        let in_pool = |ip: Ipv4Addr| (2..=254).any(|h| network.load_balancer_ip(h) == ip);
        let in_status = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .and_then(|i| i.first())
            .and_then(|i| i.ip.as_deref())
            .and_then(|ip| ip.parse::<Ipv4Addr>().ok());
        let requested = svc
            .spec
            .as_ref()
            .and_then(|s| s.load_balancer_ip.as_deref())
            .filter(|ip| !ip.is_empty());
        let others: HashSet<Ipv4Addr> = self
            .load_balancers
            .iter()
            .filter(|(k, _)| **k != key)
            .map(|(_, ip)| *ip)
            .collect();
        let ip = match requested {
            Some(wanted) => {
                let ip = wanted
                    .parse::<Ipv4Addr>()
                    .ok()
                    .filter(|ip| in_pool(*ip) && !others.contains(ip));
                if ip.is_none() {
                    tracing::debug!(
                        namespace = ns,
                        service = name,
                        requested = wanted,
                        "requested load balancer address is outside the pool or taken; not assigned"
                    );
                }
                ip
            }
            None => match self.load_balancers.get(&key) {
                Some(ip) => Some(*ip),
                None => match in_status {
                    Some(ip) if !others.contains(&ip) && in_pool(ip) => Some(ip),
                    _ => (2..=254)
                        .map(|h| network.load_balancer_ip(h))
                        .find(|ip| !others.contains(ip)),
                },
            },
        };
        match ip {
            Some(ip) => self.load_balancers.insert(key, ip),
            None => self.load_balancers.remove(&key),
        };
        if in_status != ip {
            let ingress = match ip {
                Some(ip) => serde_json::json!([{"ip": ip.to_string(), "ipMode": "VIP"}]),
                None => serde_json::Value::Null,
            };
            let api: Api<Service> = Api::namespaced(self.shared.client.clone(), ns);
            let patch = serde_json::json!({"status": {"loadBalancer": {"ingress": ingress}}});
            match api
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    tracing::info!(namespace = ns, service = name, ip = ?ip, "load balancer address assigned")
                }
                Err(e) => {
                    tracing::warn!(namespace = ns, service = name, error = %e, "writing load balancer status failed")
                }
            }
        }
        ip
    }

    async fn apply_listeners(&mut self, wanted: HashMap<(SocketAddrV4, Transport), Backend>) {
        self.listeners.retain(|addr, listener| {
            let keep = wanted.contains_key(addr);
            if !keep {
                listener.task.abort();
            }
            keep
        });
        let wanted_ips: HashSet<Ipv4Addr> = wanted.keys().map(|(a, _)| *a.ip()).collect();
        for ip in &wanted_ips {
            if !self.addresses.contains(ip) {
                match self.shared.network.add_service_address(*ip).await {
                    Ok(()) => {
                        self.addresses.insert(*ip);
                    }
                    Err(e) => tracing::warn!(%ip, error = %e, "adding service address failed"),
                }
            }
        }
        for ((addr, transport), backend) in wanted {
            if let Some(listener) = self.listeners.get(&(addr, transport)) {
                listener.backend.send_if_modified(|b| {
                    let changed = *b != backend;
                    *b = backend.clone();
                    changed
                });
                continue;
            }
            let (tx, rx) = watch::channel(backend);
            let task = match transport {
                Transport::Tcp => match TcpListener::bind(addr).await {
                    Ok(socket) => tokio::spawn(forward(socket, rx, self.endpoints.clone())),
                    Err(e) => {
                        tracing::warn!(%addr, error = %e, "service listener failed");
                        continue;
                    }
                },
                Transport::Udp => match UdpSocket::bind(addr).await {
                    Ok(socket) => tokio::spawn(forward_udp(socket, rx, self.endpoints.clone())),
                    Err(e) => {
                        tracing::warn!(%addr, error = %e, "service UDP socket failed");
                        continue;
                    }
                },
            };
            self.listeners
                .insert((addr, transport), Listener { backend: tx, task });
        }
        let stale: Vec<Ipv4Addr> = self.addresses.difference(&wanted_ips).copied().collect();
        for ip in stale {
            self.shared.network.remove_service_address(ip).await;
            self.addresses.remove(&ip);
        }
    }
}

async fn forward(
    socket: TcpListener,
    backend: watch::Receiver<Backend>,
    endpoints: Arc<EndpointTable>,
) {
    loop {
        let Ok((mut downstream, _)) = socket.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let candidates = endpoints.candidates(&backend.borrow());
        tokio::spawn(async move {
            // No ready endpoint: the connection is closed at once, as kube-proxy rejects it.
            for target in candidates.into_iter().take(3) {
                let connect = TcpStream::connect(target);
                if let Ok(Ok(mut upstream)) =
                    tokio::time::timeout(Duration::from_secs(2), connect).await
                {
                    let _ = tokio::io::copy_bidirectional(&mut downstream, &mut upstream).await;
                    return;
                }
            }
        });
    }
}

/// How long a UDP flow lives without a reply from its endpoint.
const UDP_FLOW_IDLE: Duration = Duration::from_secs(30);

/// UDP as kube-proxy forwards it: each client address is a flow to one endpoint, whose
/// replies come back from the Service address; a flow without a reply for [`UDP_FLOW_IDLE`] is
/// dropped (simpler than kube-proxy's conntrack, enough for request/response tests).
async fn forward_udp(
    socket: UdpSocket,
    backend: watch::Receiver<Backend>,
    endpoints: Arc<EndpointTable>,
) {
    let socket = Arc::new(socket);
    let flows: Arc<tokio::sync::Mutex<HashMap<SocketAddr, Arc<UdpSocket>>>> = Arc::default();
    let mut buf = vec![0u8; 65_535];
    loop {
        let Ok((n, client)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        let existing = flows.lock().await.get(&client).cloned();
        let upstream = match existing {
            Some(u) => u,
            None => {
                let Some(target) = endpoints.candidates(&backend.borrow()).first().copied() else {
                    continue;
                };
                let Ok(upstream) = UdpSocket::bind(("0.0.0.0", 0)).await else {
                    continue;
                };
                if upstream.connect(target).await.is_err() {
                    continue;
                }
                let upstream = Arc::new(upstream);
                flows.lock().await.insert(client, upstream.clone());
                tokio::spawn({
                    let (upstream, socket, flows) =
                        (upstream.clone(), socket.clone(), flows.clone());
                    async move {
                        let mut buf = vec![0u8; 65_535];
                        while let Ok(Ok(n)) =
                            tokio::time::timeout(UDP_FLOW_IDLE, upstream.recv(&mut buf)).await
                        {
                            let _ = socket.send_to(&buf[..n], client).await;
                        }
                        flows.lock().await.remove(&client);
                    }
                });
                upstream
            }
        };
        let _ = upstream.send(&buf[..n]).await;
    }
}
