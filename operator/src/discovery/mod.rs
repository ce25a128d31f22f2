//! The discovery stream server: proxies subscribe to a scope over mutual TLS and receive that
//! scope's snapshots; they ack or nack each push and report the listeners they bound.
//!
//! Security: the TLS layer demands a client certificate chained to the discovery CA; this
//! module then reads the SPIFFE ID from it and lets a peer subscribe only to the scope its
//! identity is for (the shared pool's ServiceAccount, or the ServiceAccount of a dedicated
//! Gateway's proxy), before any snapshot is sent.
//!
//! Several proxies share one SPIFFE ID (the replicas of one Deployment), so the SPIFFE ID
//! cannot tell them apart. The SVID's subject common name can: the bootstrap service puts the
//! Pod name the API server vouched for (the token's bound Pod) there. That Pod name is the
//! node id that keys what a proxy reports; a node id sent in Subscribe must equal it. So the
//! holder of one replica's SVID cannot ack, nack or report listeners for another replica.

use crate::compile::ScopeKey;
use crate::compile::status::ObjectKey;
use coxswain_api::discovery::discovery_server::Discovery;
use coxswain_api::discovery::{
    ControllerMessage, Liveness, ProxyMessage, SnapshotPush, WIRE_VERSION, controller_message,
    proxy_message,
};
use coxswain_api::names::SpiffeId;
use coxswain_api::snapshot::{Sealed, scope};
use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

/// What one connected proxy last told us.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyState {
    pub acked_version: Option<String>,
    pub last_nack: Option<String>,
    pub bound_ports: Vec<u32>,
}

/// A proxy's state and the stream it arrived on: when one Pod reconnects before its old stream
/// is gone, the old stream must neither write nor forget the new stream's state.
#[derive(Debug, Clone, Default)]
struct Reported {
    stream: u64,
    state: ProxyState,
}

/// A scope's snapshot as the streams send it.
#[derive(Debug)]
struct Published {
    version: String,
    encoded: bytes::Bytes,
}

/// Snapshots per scope, the identities allowed per scope, and what proxies report.
#[derive(Default)]
pub struct Hub {
    scopes: RwLock<HashMap<ScopeKey, watch::Sender<Option<Arc<Published>>>>>,
    /// The ServiceAccount (namespace, name) allowed to subscribe to each scope.
    identities: RwLock<HashMap<ScopeKey, (String, String)>>,
    /// By scope and node id (the Pod name from the peer's SVID).
    proxies: RwLock<BTreeMap<(ScopeKey, String), Reported>>,
    nonce: AtomicU64,
    streams: AtomicU64,
    /// Notified whenever a proxy acks, nacks, reports listeners or leaves: Programmed may change.
    pub changed: tokio::sync::Notify,
}

impl Hub {
    fn channel(&self, scope: &ScopeKey) -> watch::Receiver<Option<Arc<Published>>> {
        let mut scopes = self.scopes.write().unwrap_or_else(|p| p.into_inner());
        scopes
            .entry(scope.clone())
            .or_insert_with(|| watch::channel(None).0)
            .subscribe()
    }

    /// Publishes a scope's snapshot; subscribers get it unless it is the one they have. It is
    /// kept encoded, as sealed: every stream sends the same bytes, and the controller does not
    /// hold the decoded snapshot (at 20,000 routes, tens of MB against 3.5 MB encoded).
    pub fn publish(&self, scope: ScopeKey, snapshot: Sealed) {
        // The decoded snapshot is dropped here, before the lock that every stream reads
        // through is taken: freeing 20,000 routes takes milliseconds.
        let version = snapshot.version().to_owned();
        let (snapshot, encoded) = snapshot.into_parts();
        drop(snapshot);
        let mut scopes = self.scopes.write().unwrap_or_else(|p| p.into_inner());
        let tx = scopes
            .entry(scope)
            .or_insert_with(|| watch::channel(None).0);
        if tx.borrow().as_ref().is_some_and(|c| c.version == version) {
            return;
        }
        tx.send_replace(Some(Arc::new(Published { version, encoded })));
    }

    /// Which ServiceAccount may subscribe to `scope`.
    pub fn allow(&self, scope: ScopeKey, namespace: &str, service_account: &str) {
        let mut ids = self.identities.write().unwrap_or_else(|p| p.into_inner());
        ids.insert(scope, (namespace.to_owned(), service_account.to_owned()));
    }

    /// Replaces every scope's allowed ServiceAccount (namespace, name): scopes not listed
    /// accept nobody, and open streams of identities no longer allowed end at their next push.
    pub fn allow_only(&self, scopes: impl IntoIterator<Item = (ScopeKey, (String, String))>) {
        let fresh: HashMap<_, _> = scopes.into_iter().collect();
        let mut ids = self.identities.write().unwrap_or_else(|p| p.into_inner());
        *ids = fresh;
    }

    /// The proxies of a scope and what they reported.
    pub fn proxies(&self, scope: &ScopeKey) -> Vec<(String, ProxyState)> {
        let proxies = self.proxies.read().unwrap_or_else(|p| p.into_inner());
        proxies
            .iter()
            .filter(|((s, _), _)| s == scope)
            .map(|((_, node), r)| (node.clone(), r.state.clone()))
            .collect()
    }

    /// How many proxies have a stream open, over every scope.
    pub fn connected(&self) -> usize {
        self.proxies.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether every connected proxy of `scope` has acked `version` and bound `port`: what
    /// Programmed=True claims.
    pub fn serving(&self, scope: &ScopeKey, version: &str, port: u32) -> bool {
        let proxies = self.proxies(scope);
        !proxies.is_empty()
            && proxies.iter().all(|(_, st)| {
                st.acked_version.as_deref() == Some(version) && st.bound_ports.contains(&port)
            })
    }

    /// Records a new stream for `key`, replacing the state of an earlier stream of that node;
    /// returns the stream's id.
    fn join(&self, key: &(ScopeKey, String)) -> u64 {
        let stream = self.streams.fetch_add(1, Ordering::Relaxed);
        {
            let mut proxies = self.proxies.write().unwrap_or_else(|p| p.into_inner());
            proxies.insert(
                key.clone(),
                Reported {
                    stream,
                    state: ProxyState::default(),
                },
            );
        }
        self.changed.notify_one();
        stream
    }

    /// Applies `f` to the node's state if `stream` is still the node's current stream.
    fn update(&self, key: &(ScopeKey, String), stream: u64, f: impl FnOnce(&mut ProxyState)) {
        {
            let mut proxies = self.proxies.write().unwrap_or_else(|p| p.into_inner());
            match proxies.get_mut(key) {
                Some(r) if r.stream == stream => f(&mut r.state),
                _ => return,
            }
        }
        self.changed.notify_one();
    }

    fn forget(&self, key: &(ScopeKey, String), stream: u64) {
        {
            let mut proxies = self.proxies.write().unwrap_or_else(|p| p.into_inner());
            if proxies.get(key).is_none_or(|r| r.stream != stream) {
                return;
            }
            proxies.remove(key);
        }
        self.changed.notify_one();
    }

    fn allowed(&self, scope: &ScopeKey, id: &SpiffeId) -> bool {
        self.expected_identity(scope)
            .is_some_and(|(ns, sa)| ns == id.namespace && sa == id.service_account)
    }

    fn expected_identity(&self, scope: &ScopeKey) -> Option<(String, String)> {
        let ids = self.identities.read().unwrap_or_else(|p| p.into_inner());
        ids.get(scope).cloned()
    }
}

pub struct DiscoveryService {
    pub hub: Arc<Hub>,
    /// Only the Lease holder serves streams.
    pub leader: Arc<AtomicBool>,
}

/// How often an open stream checks that this replica still holds the Lease. A replica that
/// lost it pushes nothing more (the new leader does), so its proxies must be sent on at once:
/// they would otherwise keep a stream that stays silent while routes change.
const LEADERSHIP_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

type Pushes = Pin<Box<dyn Stream<Item = Result<ControllerMessage, Status>> + Send>>;

/// Who the peer's client certificate says it is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Peer {
    id: SpiffeId,
    /// The Pod the SVID was issued to (its subject common name).
    pod: Option<String>,
}

/// The SPIFFE ID and Pod name in the peer's client certificate.
fn peer_identity<T>(request: &Request<T>) -> Result<Peer, Status> {
    let certs = request
        .peer_certs()
        .ok_or_else(|| Status::unauthenticated("a client certificate is required"))?;
    let leaf = certs
        .first()
        .ok_or_else(|| Status::unauthenticated("a client certificate is required"))?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|_| Status::unauthenticated("the client certificate does not parse"))?;
    let san = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .ok_or_else(|| Status::unauthenticated("the client certificate has no SPIFFE ID"))?;
    let uris: Vec<&str> = san
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::URI(u) => Some(*u),
            _ => None,
        })
        .collect();
    let id = match uris.as_slice() {
        [one] => SpiffeId::parse(one).map_err(|e| Status::unauthenticated(e.to_string()))?,
        _ => {
            return Err(Status::unauthenticated(
                "the client certificate must carry exactly one SPIFFE ID",
            ));
        }
    };
    let mut names = cert.subject().iter_common_name();
    let pod = match (names.next(), names.next()) {
        (Some(cn), None) => cn
            .as_str()
            .ok()
            .filter(|s| coxswain_api::names::is_dns_subdomain(s))
            .map(str::to_owned),
        _ => None,
    };
    Ok(Peer { id, pod })
}

fn scope_key(s: Option<coxswain_api::snapshot::Scope>) -> Result<ScopeKey, Status> {
    match s.and_then(|s| s.kind) {
        Some(scope::Kind::SharedPool(_)) => Ok(ScopeKey::SharedPool),
        Some(scope::Kind::Gateway(g)) if !g.namespace.is_empty() && !g.name.is_empty() => {
            Ok(ScopeKey::Gateway(ObjectKey::new(g.namespace, g.name)))
        }
        _ => Err(Status::invalid_argument(
            "subscribe needs a scope: sharedPool or gateway{namespace, name}",
        )),
    }
}

#[tonic::async_trait]
impl Discovery for DiscoveryService {
    type StreamStream = Pushes;

    async fn stream(
        &self,
        request: Request<Streaming<ProxyMessage>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        if !self.leader.load(Ordering::Acquire) {
            return Err(Status::failed_precondition("not the leader; retry"));
        }
        let Peer { id, pod } = peer_identity(&request)?;
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the stream ended before subscribing"))?;
        let Some(proxy_message::Kind::Subscribe(sub)) = first.kind else {
            return Err(Status::invalid_argument(
                "the first message must be Subscribe",
            ));
        };
        if sub.wire_version != WIRE_VERSION {
            return Err(Status::failed_precondition(format!(
                "wire version {} is not supported; this controller speaks {WIRE_VERSION}",
                sub.wire_version
            )));
        }
        let scope = scope_key(sub.scope)?;
        if !self.hub.allowed(&scope, &id) {
            tracing::warn!(%id, ?scope, "subscription refused: identity not allowed for scope");
            return Err(Status::permission_denied(format!(
                "{id} may not subscribe to {scope:?}"
            )));
        }
        let Some(node) = pod else {
            tracing::warn!(%id, "subscription refused: the SVID names no Pod");
            return Err(Status::permission_denied(
                "the client certificate names no Pod (an SVID from an older controller?); \
                 bootstrap again for a new one",
            ));
        };
        if !sub.node_id.is_empty() && sub.node_id != node {
            tracing::warn!(%id, pod = %node, node_id = %sub.node_id, "subscription refused: node id is not the SVID's Pod");
            return Err(Status::permission_denied(format!(
                "node id {:?} is not the Pod this SVID was issued to ({node}); send that or none",
                sub.node_id
            )));
        }
        tracing::info!(%id, node = %node, ?scope, "proxy subscribed");

        let key = (scope.clone(), node);
        let stream = self.hub.join(&key);
        let (tx, rx) = mpsc::channel::<Result<ControllerMessage, Status>>(4);
        let hub = self.hub.clone();
        let leader = self.leader.clone();
        let mut snapshots = hub.channel(&scope);
        tokio::spawn(async move {
            let mut current = snapshots.borrow_and_update().clone();
            let mut leadership = tokio::time::interval(LEADERSHIP_CHECK);
            leadership.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                if let Some(s) = current.take() {
                    // The scope may have been given to another identity since subscribing.
                    if !hub.allowed(&key.0, &id) {
                        tracing::warn!(%id, scope = ?key.0, "stream ended: identity no longer allowed for scope");
                        let _ = tx
                            .send(Err(Status::permission_denied(format!(
                                "{id} may no longer subscribe to {:?}",
                                key.0
                            ))))
                            .await;
                        break;
                    }
                    let nonce = hub.nonce.fetch_add(1, Ordering::Relaxed).to_string();
                    let push = ControllerMessage {
                        kind: Some(controller_message::Kind::Snapshot(SnapshotPush {
                            nonce,
                            // Shared with every other stream, not copied.
                            snapshot: s.encoded.clone(),
                        })),
                    };
                    if tx.send(Ok(push)).await.is_err() {
                        break;
                    }
                    tracing::debug!(node = %key.1, version = %s.version, "snapshot queued for the proxy");
                }
                tokio::select! {
                    _ = leadership.tick() => {
                        if !leader.load(Ordering::Acquire) {
                            tracing::info!(node = %key.1, "stream ended: this replica no longer leads");
                            // The proxy's "not the leader" retry: soon, at the next endpoint.
                            let _ = tx
                                .send(Err(Status::failed_precondition(
                                    "not the leader any more; reconnect to the new one",
                                )))
                                .await;
                            break;
                        }
                    }
                    changed = snapshots.changed() => {
                        if changed.is_err() { break; }
                        current = snapshots.borrow_and_update().clone();
                    }
                    msg = inbound.message() => match msg {
                        Ok(Some(ProxyMessage { kind: Some(kind) })) => match kind {
                            proxy_message::Kind::Ack(a) => hub.update(&key, stream, |st| {
                                st.acked_version = Some(a.version);
                                st.last_nack = None;
                            }),
                            proxy_message::Kind::Nack(n) => {
                                tracing::warn!(node = %key.1, version = %n.version, error = %n.error, "snapshot refused by proxy");
                                hub.update(&key, stream, |st| st.last_nack = Some(n.error));
                            }
                            proxy_message::Kind::NodeStatus(ns) => hub.update(&key, stream, |st| {
                                st.bound_ports = ns.listeners.iter().filter(|l| l.bound).map(|l| l.port).collect();
                            }),
                            proxy_message::Kind::Subscribe(_) => {
                                let _ = tx.send(Err(Status::invalid_argument("already subscribed"))).await;
                                break;
                            }
                        },
                        Ok(Some(_)) => {}
                        Ok(None) | Err(_) => break,
                    },
                }
            }
            hub.forget(&key, stream);
            tracing::info!(node = %key.1, "proxy disconnected");
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// Serves discovery with mandatory mutual TLS: client certificates must chain to `ca_pem`.
/// Connections whose proxy stops answering pings (`liveness`) are closed, so a proxy that is
/// gone stops counting among those that must ack before a Gateway is Programmed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    cert_pem: &str,
    key_pem: &str,
    ca_pem: &str,
    service: DiscoveryService,
    liveness: Liveness,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    use coxswain_api::discovery::discovery_server::DiscoveryServer;
    use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(cert_pem, key_pem))
        .client_ca_root(Certificate::from_pem(ca_pem))
        .client_auth_optional(false);
    // Without TCP_NODELAY the tail of each snapshot waited for the proxy's delayed ACK: a
    // steady 40-50 ms per push (tonic sets it only on listeners it binds itself).
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        |accepted| {
            let stream = accepted?;
            stream.set_nodelay(true)?;
            Ok::<_, std::io::Error>(stream)
        },
    );
    Server::builder()
        .tls_config(tls)?
        .http2_keepalive_interval(Some(liveness.ping_every))
        .http2_keepalive_timeout(Some(liveness.answer_within))
        .add_service(DiscoveryServer::new(service))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}
