//! UDP listeners (Gateway listener protocol UDP, with UDPRoutes): datagrams relayed per client
//! flow. UDP has no connections, so the proxy makes one per client address: its first
//! datagram picks a backend of the port's route (by weight, as a TCP connection does) and
//! opens a socket to it; later datagrams from that address go the same way, and what the
//! backend sends back goes to the address from the port's own socket. A flow ends after
//! [`FLOW_IDLE`] without a datagram either way, so a route change reaches a client once its
//! flow has been idle, and never splits a conversation between backends.
//!
//! Bounded: at most [`MAX_FLOWS`] flows per port (a new client's datagrams are dropped and
//! counted beyond that), one receive buffer per port and per flow, datagrams of at most 64
//! KiB. Metrics count each flow as one request of its route: 2xx relayed, 5xx when no backend
//! could take it.

use crate::metrics::Metrics;
use crate::router::Pick;
use crate::table::SharedTable;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// A flow with no datagram either way for this long ends; the next datagram from its client
/// starts a new one (and may pick another backend).
pub const FLOW_IDLE: Duration = Duration::from_secs(60);
/// Flows one port keeps at once.
pub const MAX_FLOWS: usize = 16 * 1024;
/// The largest UDP payload over IPv4 and IPv6 without jumbograms.
const MAX_DATAGRAM: usize = 65_535;

/// A client's flow, as the port's receive loop sees it.
struct Flow {
    /// Connected to the flow's backend.
    upstream: Arc<UdpSocket>,
    /// Milliseconds since `epoch` of the last datagram either way.
    last_seen: Arc<AtomicU64>,
    /// Tells a flow that ended from one that replaced it for the same client.
    id: u64,
}

/// Relays the datagrams arriving on `socket` (bound to `port`) until the task is dropped;
/// dropping it ends every flow.
pub async fn serve(socket: UdpSocket, table: SharedTable, port: u16) {
    serve_with(socket, table, port, FLOW_IDLE, MAX_FLOWS).await;
}

/// [`serve`] with its bounds given, for tests.
pub async fn serve_with(
    socket: UdpSocket,
    table: SharedTable,
    port: u16,
    idle: Duration,
    max_flows: usize,
) {
    let socket = Arc::new(socket);
    let epoch = Instant::now();
    let mut flows: HashMap<SocketAddr, Flow> = HashMap::new();
    // Flow tasks live in this set: when the port closes, they end with it.
    let mut tasks = JoinSet::new();
    let (ended_tx, mut ended_rx) = mpsc::unbounded_channel::<(SocketAddr, u64)>();
    let mut next_id = 0u64;
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        tokio::select! {
            received = socket.recv_from(&mut buf) => {
                let (n, client) = match received {
                    Ok(r) => r,
                    Err(e) => {
                        // ICMP errors of earlier sends surface here on some systems; the
                        // socket itself is fine.
                        tracing::debug!(port, error = %e, "UDP receive failed");
                        continue;
                    }
                };
                let datagram = &buf[..n];
                let now = millis_since(epoch);
                if let Some(flow) = flows.get(&client) {
                    flow.last_seen.store(now, Ordering::Relaxed);
                    if let Err(e) = flow.upstream.send(datagram).await {
                        tracing::debug!(port, %client, error = %e, "UDP send to the backend failed");
                    }
                    continue;
                }
                if flows.len() >= max_flows {
                    Metrics::count(&table.metrics().udp_flows_refused);
                    tracing::debug!(port, %client, "UDP flow table full; datagram dropped");
                    continue;
                }
                let Some(opened) = open(&table, port, client).await else {
                    continue;
                };
                if let Err(e) = opened.upstream.send(datagram).await {
                    tracing::debug!(port, %client, error = %e, "UDP send to the backend failed");
                }
                next_id += 1;
                let last_seen = Arc::new(AtomicU64::new(now));
                flows.insert(
                    client,
                    Flow {
                        upstream: opened.upstream.clone(),
                        last_seen: last_seen.clone(),
                        id: next_id,
                    },
                );
                tasks.spawn(replies(
                    Replies {
                        upstream: opened.upstream,
                        socket: socket.clone(),
                        client,
                        last_seen,
                        epoch,
                        idle,
                        _in_flight: opened.in_flight,
                    },
                    ended_tx.clone(),
                    next_id,
                ));
            }
            Some((client, id)) = ended_rx.recv() => {
                if flows.get(&client).is_some_and(|f| f.id == id) {
                    flows.remove(&client);
                }
            }
            // Reap finished tasks so the set does not grow with every flow that ever was.
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}

fn millis_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A new flow's backend socket and what it holds while it lives.
struct Opened {
    upstream: Arc<UdpSocket>,
    in_flight: Option<crate::upstream::InFlight>,
}

/// Picks a backend for a new flow from `client` and opens a socket to it.
async fn open(table: &SharedTable, port: u16, client: SocketAddr) -> Option<Opened> {
    let (addr, counters, in_flight) = {
        let metrics = table.metrics().clone();
        let current = table.load();
        let Some((route, _)) = current.router.port(port).and_then(|p| p.relay_route("")) else {
            metrics.unrouted(404);
            tracing::debug!(port, %client, "no UDPRoute on this port");
            return None;
        };
        let counters = route.counters.clone();
        let mut key = |source: &crate::balance::HashSource| {
            (*source == crate::balance::HashSource::ClientAddress)
                .then(|| crate::balance::address_hash(client.ip()))
        };
        match route.pick(&mut key) {
            Pick::Endpoint {
                addr,
                endpoint,
                cluster,
                ..
            } => (addr, counters, cluster.start(endpoint)),
            Pick::InvalidBackend => {
                counters.record(500);
                return None;
            }
            Pick::NoEndpoints => {
                counters.record(503);
                return None;
            }
        }
    };
    let local: SocketAddr = if addr.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        ([0u16; 8], 0).into()
    };
    let upstream = match UdpSocket::bind(local).await {
        Ok(s) => s,
        Err(e) => {
            counters.record(503);
            tracing::warn!(port, error = %e, "no UDP socket for a backend");
            return None;
        }
    };
    if let Err(e) = upstream.connect(addr).await {
        counters.record(503);
        tracing::debug!(port, %addr, error = %e, "UDP backend unreachable");
        return None;
    }
    counters.record(200);
    Some(Opened {
        upstream: Arc::new(upstream),
        in_flight,
    })
}

/// What a flow's reply task holds.
struct Replies {
    upstream: Arc<UdpSocket>,
    socket: Arc<UdpSocket>,
    client: SocketAddr,
    last_seen: Arc<AtomicU64>,
    epoch: Instant,
    idle: Duration,
    /// Counts the flow as busy on its endpoint (least-request balancing) while it lives.
    _in_flight: Option<crate::upstream::InFlight>,
}

/// Sends the backend's datagrams back to the client until the flow has been idle for
/// `idle`, then says so on `ended`.
async fn replies(flow: Replies, ended: mpsc::UnboundedSender<(SocketAddr, u64)>, id: u64) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let idle_ms = u64::try_from(flow.idle.as_millis()).unwrap_or(u64::MAX);
    loop {
        let last = flow.last_seen.load(Ordering::Relaxed);
        let deadline = flow.epoch + Duration::from_millis(last.saturating_add(idle_ms));
        tokio::select! {
            received = flow.upstream.recv(&mut buf) => {
                match received {
                    Ok(n) => {
                        flow.last_seen.store(millis_since(flow.epoch), Ordering::Relaxed);
                        if let Err(e) = flow.socket.send_to(&buf[..n], flow.client).await {
                            tracing::debug!(client = %flow.client, error = %e, "UDP reply not sent");
                        }
                    }
                    // An ICMP port-unreachable from the backend: the flow waits out its idle
                    // time like any other, in case the backend comes back.
                    Err(e) => tracing::debug!(client = %flow.client, error = %e, "UDP backend error"),
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                // Datagrams from the client move the deadline; look again before ending.
                if millis_since(flow.epoch) >= flow.last_seen.load(Ordering::Relaxed).saturating_add(idle_ms) {
                    let _ = ended.send((flow.client, id));
                    return;
                }
            }
        }
    }
}
