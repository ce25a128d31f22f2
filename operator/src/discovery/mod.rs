//! The discovery stream server: proxies subscribe to a scope over mutual TLS and receive that
//! scope's snapshots; they ack or nack each push and report the listeners they bound.
//!
//! Security: the TLS layer demands a client certificate chained to the discovery CA; this
//! module then reads the SPIFFE ID from it and lets a peer subscribe only to the scope its
//! identity is for (the shared pool's ServiceAccount, or the `{gateway}-{gatewayclass}`
//! ServiceAccount of a dedicated Gateway), before any snapshot is sent.

use crate::compile::ScopeKey;
use crate::compile::status::ObjectKey;
use coxswain_api::discovery::discovery_server::Discovery;
use coxswain_api::discovery::{
    ControllerMessage, ProxyMessage, SnapshotPush, WIRE_VERSION, controller_message, proxy_message,
};
use coxswain_api::names::SpiffeId;
use coxswain_api::snapshot::{Snapshot, scope};
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

/// Snapshots per scope, the identities allowed per scope, and what proxies report.
#[derive(Default)]
pub struct Hub {
    scopes: RwLock<HashMap<ScopeKey, watch::Sender<Option<Arc<Snapshot>>>>>,
    /// The ServiceAccount (namespace, name) allowed to subscribe to each scope.
    identities: RwLock<HashMap<ScopeKey, (String, String)>>,
    proxies: RwLock<BTreeMap<(ScopeKey, String), ProxyState>>,
    nonce: AtomicU64,
    /// Notified whenever a proxy acks, nacks, reports listeners or leaves: Programmed may change.
    pub changed: tokio::sync::Notify,
}

impl Hub {
    fn channel(&self, scope: &ScopeKey) -> watch::Receiver<Option<Arc<Snapshot>>> {
        let mut scopes = self.scopes.write().unwrap_or_else(|p| p.into_inner());
        scopes
            .entry(scope.clone())
            .or_insert_with(|| watch::channel(None).0)
            .subscribe()
    }

    /// Publishes a scope's snapshot; subscribers get it unless it is the one they have.
    pub fn publish(&self, scope: ScopeKey, snapshot: Snapshot) {
        let mut scopes = self.scopes.write().unwrap_or_else(|p| p.into_inner());
        let tx = scopes
            .entry(scope)
            .or_insert_with(|| watch::channel(None).0);
        tx.send_if_modified(|current| {
            if current
                .as_ref()
                .is_some_and(|c| c.version == snapshot.version)
            {
                return false;
            }
            *current = Some(Arc::new(snapshot));
            true
        });
    }

    /// Which ServiceAccount may subscribe to `scope`.
    pub fn allow(&self, scope: ScopeKey, namespace: &str, service_account: &str) {
        let mut ids = self.identities.write().unwrap_or_else(|p| p.into_inner());
        ids.insert(scope, (namespace.to_owned(), service_account.to_owned()));
    }

    /// The proxies of a scope and what they reported.
    pub fn proxies(&self, scope: &ScopeKey) -> Vec<(String, ProxyState)> {
        let proxies = self.proxies.read().unwrap_or_else(|p| p.into_inner());
        proxies
            .iter()
            .filter(|((s, _), _)| s == scope)
            .map(|((_, node), st)| (node.clone(), st.clone()))
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

    fn update(&self, key: &(ScopeKey, String), f: impl FnOnce(&mut ProxyState)) {
        {
            let mut proxies = self.proxies.write().unwrap_or_else(|p| p.into_inner());
            f(proxies.entry(key.clone()).or_default());
        }
        self.changed.notify_one();
    }

    fn forget(&self, key: &(ScopeKey, String)) {
        {
            let mut proxies = self.proxies.write().unwrap_or_else(|p| p.into_inner());
            proxies.remove(key);
        }
        self.changed.notify_one();
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

type Pushes = Pin<Box<dyn Stream<Item = Result<ControllerMessage, Status>> + Send>>;

/// The SPIFFE ID in the peer's client certificate.
fn peer_identity<T>(request: &Request<T>) -> Result<SpiffeId, Status> {
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
    match uris.as_slice() {
        [one] => SpiffeId::parse(one).map_err(|e| Status::unauthenticated(e.to_string())),
        _ => Err(Status::unauthenticated(
            "the client certificate must carry exactly one SPIFFE ID",
        )),
    }
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
        let id = peer_identity(&request)?;
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
        match self.hub.expected_identity(&scope) {
            Some((ns, sa)) if ns == id.namespace && sa == id.service_account => {}
            _ => {
                tracing::warn!(%id, ?scope, "subscription refused: identity not allowed for scope");
                return Err(Status::permission_denied(format!(
                    "{id} may not subscribe to {scope:?}"
                )));
            }
        }
        let node = if sub.node_id.is_empty() {
            id.to_string()
        } else {
            sub.node_id
        };
        tracing::info!(%id, node = %node, ?scope, "proxy subscribed");

        let key = (scope.clone(), node);
        self.hub.update(&key, |_| {});
        let (tx, rx) = mpsc::channel::<Result<ControllerMessage, Status>>(4);
        let hub = self.hub.clone();
        let mut snapshots = hub.channel(&scope);
        tokio::spawn(async move {
            let mut current = snapshots.borrow_and_update().clone();
            loop {
                if let Some(s) = current.take() {
                    let nonce = hub.nonce.fetch_add(1, Ordering::Relaxed).to_string();
                    let push = ControllerMessage {
                        kind: Some(controller_message::Kind::Snapshot(SnapshotPush {
                            nonce,
                            snapshot: Some((*s).clone()),
                        })),
                    };
                    if tx.send(Ok(push)).await.is_err() {
                        break;
                    }
                }
                tokio::select! {
                    changed = snapshots.changed() => {
                        if changed.is_err() { break; }
                        current = snapshots.borrow_and_update().clone();
                    }
                    msg = inbound.message() => match msg {
                        Ok(Some(ProxyMessage { kind: Some(kind) })) => match kind {
                            proxy_message::Kind::Ack(a) => hub.update(&key, |st| {
                                st.acked_version = Some(a.version);
                                st.last_nack = None;
                            }),
                            proxy_message::Kind::Nack(n) => {
                                tracing::warn!(node = %key.1, version = %n.version, error = %n.error, "snapshot refused by proxy");
                                hub.update(&key, |st| st.last_nack = Some(n.error));
                            }
                            proxy_message::Kind::NodeStatus(ns) => hub.update(&key, |st| {
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
            hub.forget(&key);
            tracing::info!(node = %key.1, "proxy disconnected");
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// Serves discovery with mandatory mutual TLS: client certificates must chain to `ca_pem`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    cert_pem: &str,
    key_pem: &str,
    ca_pem: &str,
    service: DiscoveryService,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    use coxswain_api::discovery::discovery_server::DiscoveryServer;
    use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(cert_pem, key_pem))
        .client_ca_root(Certificate::from_pem(ca_pem))
        .client_auth_optional(false);
    Server::builder()
        .tls_config(tls)?
        .add_service(DiscoveryServer::new(service))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            shutdown,
        )
        .await
}
