//! Connections to authorization services: TCP, TLS verified as the route says (a
//! BackendTLSPolicy's CAs, or the system's for an https auth-url), HTTP/1 handshakes, and
//! the connector the gRPC channels open theirs with.

use super::{AuthError, TlsTo};
use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// The proxy's system trust store (for an https auth-url), loaded once.
pub(super) fn system_roots() -> Arc<rustls::ClientConfig> {
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

pub(super) trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

pub(super) async fn connect(
    addr: SocketAddr,
    tls: Option<&TlsTo>,
) -> Result<Box<dyn Io>, AuthError> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|source| AuthError::Connect { addr, source })?;
    let _ = tcp.set_nodelay(true);
    match tls {
        None => Ok(Box::new(tcp)),
        Some((config, name)) => {
            let stream = tokio_rustls::TlsConnector::from(config.clone())
                .connect(name.clone(), tcp)
                .await
                .map_err(|source| AuthError::Connect { addr, source })?;
            Ok(Box::new(stream))
        }
    }
}

pub(super) async fn handshake(
    addr: SocketAddr,
    tls: Option<&TlsTo>,
) -> Result<SendRequest<Full<Bytes>>, AuthError> {
    let io = connect(addr, tls).await?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(%addr, error = %e, "authorization service connection ended");
        }
    });
    Ok(sender)
}

/// Opens the gRPC channel's connections to one endpoint, with TLS when asked.
#[derive(Clone)]
pub(super) struct Connector {
    pub(super) addr: SocketAddr,
    pub(super) tls: Option<TlsTo>,
}

impl tower_service::Service<hyper::Uri> for Connector {
    type Response = TokioIo<Box<dyn Io>>;
    type Error = AuthError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, AuthError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), AuthError>> {
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
