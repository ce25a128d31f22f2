//! Client certificates on HTTPS ports (Gateway `spec.tls.frontend`, GEP-91): the verifier of
//! one port's CAs, built once per snapshot by [`ClientAuth::build`] so nothing is parsed
//! during a handshake. `tls_accept::PortVerifier` finds the current one at each handshake.

use coxswain_api::snapshot as snap;
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls_pki_types::pem::PemObject;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum ClientAuthError {
    #[error("port {port}: a client CA certificate is not valid PEM: {message}")]
    Pem { port: u32, message: String },
    #[error("port {port}: no client CA certificate")]
    Empty { port: u32 },
    #[error("port {port}: a client CA certificate is not usable as a trust anchor: {message}")]
    Anchor { port: u32, message: String },
    #[error("port {port}: building the client certificate verifier: {message}")]
    Verifier { port: u32, message: String },
}

/// One port's client verification, built once per snapshot.
#[derive(Debug)]
pub struct ClientAuth {
    pub(crate) verifier: Arc<dyn ClientCertVerifier>,
    /// AllowInsecureFallback: a client without a valid certificate is served anyway.
    pub(crate) insecure_fallback: bool,
}

impl ClientAuth {
    /// The verifier for a port's CAs. A bundle that does not parse refuses the snapshot: the
    /// port must not fall back to serving clients unverified.
    pub fn build(port: u32, v: &snap::ClientValidation) -> Result<Self, ClientAuthError> {
        let mut roots = RootCertStore::empty();
        for der in CertificateDer::pem_slice_iter(v.ca_pem.as_bytes()) {
            let der = der.map_err(|e| ClientAuthError::Pem {
                port,
                message: e.to_string(),
            })?;
            roots.add(der).map_err(|e| ClientAuthError::Anchor {
                port,
                message: e.to_string(),
            })?;
        }
        if roots.is_empty() {
            return Err(ClientAuthError::Empty { port });
        }
        let mut builder = WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        );
        if v.allow_insecure_fallback {
            builder = builder.allow_unauthenticated();
        }
        let verifier = builder.build().map_err(|e| ClientAuthError::Verifier {
            port,
            message: e.to_string(),
        })?;
        Ok(Self {
            verifier,
            insecure_fallback: v.allow_insecure_fallback,
        })
    }

    /// Whether a chain passes this port's verification (for resumed sessions, which rustls
    /// does not verify again).
    pub fn accepts(&self, chain: Option<&[CertificateDer<'_>]>) -> bool {
        if self.insecure_fallback {
            return true;
        }
        let Some((leaf, intermediates)) = chain.and_then(|c| c.split_first()) else {
            return false;
        };
        self.verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .is_ok()
    }
}
