//! Connections to the services a route calls out to before forwarding (an authorization
//! service, a global rate limit service): TCP, TLS verified as the route says (a
//! BackendTLSPolicy's CAs, or the system's for an https auth-url), HTTP/1 handshakes, and the
//! gRPC channels, one per endpoint, kept with the route's policy.

use crate::upstream::ClusterState;
use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// gRPC channels kept per route policy (one per endpoint); past this the map starts over.
const MAX_CHANNELS: usize = 64;

/// Verified TLS to a service, with the name to verify.
pub type TlsTo = (
    Arc<rustls::ClientConfig>,
    rustls_pki_types::ServerName<'static>,
);

/// Why no connection to the service could be had.
#[derive(Debug, thiserror::Error)]
pub enum CalloutError {
    #[error("the service has no endpoint")]
    NoEndpoint,
    #[error("the service's BackendTLSPolicy is unusable")]
    TlsRefused,
    #[error("resolving {authority}: {source}")]
    Resolve {
        authority: Box<str>,
        source: std::io::Error,
    },
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// An endpoint of a cluster and the TLS its BackendTLSPolicy asks for (the policy's CAs, or the
/// system's with `WellKnownCACertificates`).
pub fn cluster_endpoint(c: &ClusterState) -> Result<(SocketAddr, Option<TlsTo>), CalloutError> {
    let tls = match &c.backend_tls {
        None => None,
        Some(t) if t.refuse => return Err(CalloutError::TlsRefused),
        Some(t) => match &t.mirror {
            Some(tls) => Some(tls.clone()),
            None => Some((
                system_roots(),
                rustls_pki_types::ServerName::try_from(t.hostname.to_string())
                    .map_err(|_| CalloutError::TlsRefused)?,
            )),
        },
    };
    Ok((c.pick().ok_or(CalloutError::NoEndpoint)?, tls))
}

/// gRPC channels to a service's endpoints: HTTP/2, connected on first use and again after a
/// failure.
#[derive(Default)]
pub struct Channels {
    by_addr: Mutex<HashMap<SocketAddr, tonic::transport::Channel>>,
}

impl Channels {
    pub fn get(
        &self,
        addr: SocketAddr,
        tls: Option<TlsTo>,
        connect_timeout: Duration,
    ) -> Result<tonic::transport::Channel, tonic::transport::Error> {
        let mut channels = self.by_addr.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = channels.get(&addr) {
            return Ok(c.clone());
        }
        // gRPC over TLS needs h2 by ALPN; the verification settings stay the policy's.
        let tls = tls.map(|(config, name)| {
            let mut config = (*config).clone();
            config.alpn_protocols = vec![b"h2".to_vec()];
            (Arc::new(config), name)
        });
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(connect_timeout)
            .connect_with_connector_lazy(Connector { addr, tls });
        if channels.len() >= MAX_CHANNELS {
            channels.clear();
        }
        channels.insert(addr, channel.clone());
        Ok(channel)
    }
}

/// The proxy's system trust store (for an https auth-url), loaded once.
pub fn system_roots() -> Arc<rustls::ClientConfig> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::warn!(error = %e, "reading the system's CA certificates");
            }
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                tracing::warn!("no system CA certificates: TLS to an authorization URL will fail");
            }
            let config = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map(|b| b.with_root_certificates(roots).with_no_client_auth());
            match config {
                Ok(c) => Arc::new(c),
                // Not reached with ring's provider; an empty store then refuses every server.
                Err(e) => {
                    tracing::error!(error = %e, "TLS client settings");
                    Arc::new(
                        rustls::ClientConfig::builder()
                            .with_root_certificates(rustls::RootCertStore::empty())
                            .with_no_client_auth(),
                    )
                }
            }
        })
        .clone()
}

pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

pub async fn connect(addr: SocketAddr, tls: Option<&TlsTo>) -> Result<Box<dyn Io>, CalloutError> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|source| CalloutError::Connect { addr, source })?;
    let _ = tcp.set_nodelay(true);
    match tls {
        None => Ok(Box::new(tcp)),
        Some((config, name)) => {
            let stream = tokio_rustls::TlsConnector::from(config.clone())
                .connect(name.clone(), tcp)
                .await
                .map_err(|source| CalloutError::Connect { addr, source })?;
            Ok(Box::new(stream))
        }
    }
}

pub async fn handshake(
    addr: SocketAddr,
    tls: Option<&TlsTo>,
) -> Result<SendRequest<Full<Bytes>>, HandshakeError> {
    let io = connect(addr, tls).await?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(%addr, error = %e, "authorization service connection ended");
        }
    });
    Ok(sender)
}

#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error(transparent)]
    Callout(#[from] CalloutError),
    #[error("HTTP handshake: {0}")]
    Http(#[from] hyper::Error),
}

/// Opens the gRPC channel's connections to one endpoint, with TLS when asked.
#[derive(Clone)]
struct Connector {
    addr: SocketAddr,
    tls: Option<TlsTo>,
}

impl tower_service::Service<hyper::Uri> for Connector {
    type Response = TokioIo<Box<dyn Io>>;
    type Error = CalloutError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, CalloutError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), CalloutError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: hyper::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            connect(this.addr, this.tls.as_ref())
                .await
                .map(TokioIo::new)
        })
    }
}
