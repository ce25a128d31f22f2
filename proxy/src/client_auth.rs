//! Client certificates on HTTPS ports (Gateway `spec.tls.frontend`, GEP-91).
//!
//! A listener's TLS settings are built once, when its port is bound, but a snapshot can add,
//! change or drop a port's CAs at any time. So every HTTPS port gets [`PortVerifier`], which
//! reads the current table at each handshake (as `SniResolver` does for certificates) and
//! delegates to the webpki verifier that [`ClientAuth::build`] made for that port when the
//! snapshot was loaded: nothing is parsed during a handshake.

use coxswain_api::snapshot as snap;
use rustls::DistinguishedName;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
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
    verifier: Arc<dyn ClientCertVerifier>,
    /// AllowInsecureFallback: a client without a valid certificate is served anyway.
    insecure_fallback: bool,
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

    pub fn insecure_fallback(&self) -> bool {
        self.insecure_fallback
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

/// The signature algorithms of the one crypto provider the proxy uses.
fn algorithms() -> &'static WebPkiSupportedAlgorithms {
    static ALGS: std::sync::OnceLock<WebPkiSupportedAlgorithms> = std::sync::OnceLock::new();
    ALGS.get_or_init(|| rustls::crypto::ring::default_provider().signature_verification_algorithms)
}

/// rustls' client certificate callback for one listener port, reading the current table.
#[derive(Debug)]
pub struct PortVerifier {
    pub port: u16,
    pub table: crate::table::SharedTable,
}

impl PortVerifier {
    fn with<T>(&self, f: impl FnOnce(Option<&ClientAuth>) -> T) -> T {
        let table = self.table.load();
        f(table.tls.client_auth(self.port))
    }
}

impl ClientCertVerifier for PortVerifier {
    fn offer_client_auth(&self) -> bool {
        self.with(|a| a.is_some())
    }

    fn client_auth_mandatory(&self) -> bool {
        self.with(|a| a.is_some_and(|a| !a.insecure_fallback))
    }

    /// No hints: the CAs change with snapshots, and this borrow outlives a table load. An
    /// empty list tells a client to send whatever certificate it has (RFC 8446 4.3.2).
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.with(|auth| match auth {
            // The port stopped asking between the request and the answer (a new snapshot).
            None => Ok(ClientCertVerified::assertion()),
            Some(a) => match a.verifier.verify_client_cert(end_entity, intermediates, now) {
                Ok(v) => Ok(v),
                // The spec's AllowInsecureFallback: served even when verification fails.
                Err(e) if a.insecure_fallback => {
                    tracing::debug!(port = self.port, error = %e, "client certificate not valid; served (AllowInsecureFallback)");
                    Ok(ClientCertVerified::assertion())
                }
                Err(e) => {
                    tracing::debug!(port = self.port, error = %e, "client certificate refused");
                    Err(e)
                }
            },
        })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        algorithms().supported_schemes()
    }
}
