//! TLS certificates by port and SNI name, built from a snapshot; rustls asks it during each
//! handshake, so new certificates apply to new connections without touching listeners.

use crate::client_auth::{ClientAuth, ClientAuthError};
use coxswain_api::snapshot::outline::Outline;
use rustls::crypto::ring::sign::any_supported_type;

use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("certificate {name}: {message}")]
    Invalid { name: String, message: String },
    #[error("listener {port} names certificate {name}, which the snapshot does not carry")]
    Missing { port: u32, name: String },
    #[error(transparent)]
    ClientAuth(#[from] ClientAuthError),
}

/// Certificates of one port: exact SNI names, wildcard suffixes, and a default.
#[derive(Debug, Default)]
pub struct SniCertificates {
    exact: HashMap<Box<str>, Arc<CertifiedKey>>,
    wildcard: HashMap<Box<str>, Arc<CertifiedKey>>,
    default: Option<Arc<CertifiedKey>>,
}

impl SniCertificates {
    /// Exact name, then the longest wildcard suffix, then the default.
    pub fn resolve(&self, sni: Option<&str>) -> Option<Arc<CertifiedKey>> {
        if let Some(name) = sni {
            let name = name.to_ascii_lowercase();
            if let Some(c) = self.exact.get(name.as_str()) {
                return Some(c.clone());
            }
            let mut rest = name.as_str();
            while let Some((_, parent)) = rest.split_once('.') {
                if let Some(c) = self.wildcard.get(parent) {
                    return Some(c.clone());
                }
                rest = parent;
            }
        }
        self.default.clone()
    }
}

#[derive(Debug, Default)]
pub struct TlsStore {
    ports: HashMap<u16, SniCertificates>,
    /// Ports that ask clients for a certificate, with the verifier built for their CAs.
    client_auth: HashMap<u16, ClientAuth>,
}

impl TlsStore {
    pub fn build(snapshot: &Outline) -> Result<Self, CertError> {
        let mut keys: HashMap<&str, Arc<CertifiedKey>> = HashMap::new();
        for c in &snapshot.certificates {
            keys.insert(
                &c.name,
                Arc::new(certified_key(
                    &c.name,
                    &c.cert_chain_pem,
                    &c.private_key_pem,
                )?),
            );
        }
        let mut ports = HashMap::new();
        let mut client_auth = HashMap::new();
        for l in &snapshot.listeners {
            let Ok(port) = u16::try_from(l.port) else {
                continue;
            };
            if let Some(v) = &l.client_validation {
                client_auth.insert(port, ClientAuth::build(l.port, v)?);
            }
            if l.certificates.is_empty() {
                continue;
            }
            let mut sni = SniCertificates::default();
            for c in &l.certificates {
                let key = keys.get(c.certificate.as_str()).cloned().ok_or_else(|| {
                    CertError::Missing {
                        port: l.port,
                        name: c.certificate.clone(),
                    }
                })?;
                let name = c.sni.to_ascii_lowercase();
                if name.is_empty() {
                    sni.default = Some(key);
                } else if let Some(suffix) = name.strip_prefix("*.") {
                    sni.wildcard.insert(suffix.into(), key);
                } else {
                    sni.exact.insert(name.into(), key);
                }
            }
            ports.insert(port, sni);
        }
        Ok(Self { ports, client_auth })
    }

    pub fn port(&self, port: u16) -> Option<&SniCertificates> {
        self.ports.get(&port)
    }

    /// The client verification of a port, when it asks for client certificates.
    pub fn client_auth(&self, port: u16) -> Option<&ClientAuth> {
        self.client_auth.get(&port)
    }
}

/// Parses a PEM chain and key into what rustls serves.
pub fn certified_key(
    name: &str,
    chain_pem: &str,
    key_pem: &str,
) -> Result<CertifiedKey, CertError> {
    let invalid = |message: String| CertError::Invalid {
        name: name.to_owned(),
        message,
    };
    let chain = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err(invalid("no certificate in the chain".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| invalid(format!("private key: {e}")))?;
    let signing = any_supported_type(&key).map_err(|e| invalid(format!("private key: {e}")))?;
    Ok(CertifiedKey::new(chain, signing))
}

/// What the HTTP layer needs to know of a connection's handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionTls {
    /// The server name the client asked for.
    pub sni: Option<Box<str>>,
    /// The port asks for a valid client certificate and this connection has none: a session
    /// resumed from before the port's CAs changed (rustls verifies full handshakes only).
    /// Every request on it is refused.
    pub client_cert_refused: bool,
}
