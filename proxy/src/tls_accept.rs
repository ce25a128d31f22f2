//! What each HTTPS port's TLS acceptor asks the current table during a handshake: which
//! client certificates to ask for and accept ([`PortVerifier`]), and, once the handshake is
//! done, what the HTTP layer must know of it ([`KeepSni`]).
//!
//! A listener's TLS settings are built once, when its port is bound, but a snapshot can add,
//! change or drop a port's CAs at any time; so these read the table at each handshake, as
//! `SniResolver` does for certificates, and use what `TlsStore::build` made for the port.

use crate::client_auth::ClientAuth;
use crate::table::SharedTable;
use crate::tls::ConnectionTls;
use rustls::DistinguishedName;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::sync::Arc;

/// The signature algorithms of the one crypto provider the proxy uses.
fn algorithms() -> &'static WebPkiSupportedAlgorithms {
    static ALGS: std::sync::OnceLock<WebPkiSupportedAlgorithms> = std::sync::OnceLock::new();
    ALGS.get_or_init(|| rustls::crypto::ring::default_provider().signature_verification_algorithms)
}

/// rustls' client certificate callback for one listener port, reading the current table.
#[derive(Debug)]
pub struct PortVerifier {
    pub port: u16,
    pub table: SharedTable,
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

/// Pingora's post-handshake hook for one port: keeps the SNI in the connection's TLS digest,
/// and checks the client certificate again against the port's current CAs.
pub struct KeepSni {
    pub port: u16,
    pub table: SharedTable,
}

#[async_trait::async_trait]
impl pingora::listeners::TlsAccept for KeepSni {
    async fn handshake_complete_callback(
        &self,
        tls: &pingora::protocols::tls::TlsRef,
    ) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        let client_cert_refused = {
            let table = self.table.load();
            table
                .tls
                .client_auth(self.port)
                .is_some_and(|a| !a.accepts(tls.peer_cert_chain_der()))
        };
        let sni = tls.server_name().map(|n| n.to_ascii_lowercase().into());
        if sni.is_none() && !client_cert_refused {
            return None;
        }
        Some(Arc::new(ConnectionTls {
            sni,
            client_cert_refused,
        }))
    }
}
