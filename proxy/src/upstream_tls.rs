//! TLS to backends whose BackendTLSPolicy lists subjectAltNames: the certificate must chain to
//! the policy's CAs and carry one of those names, while the policy's hostname is only the SNI.
//!
//! Pingora's rustls connector checks a certificate against the SNI it sends and nothing else,
//! so for these backends the proxy opens the TLS connection itself, with [`SanVerifier`], and
//! hands it to Pingora as an already connected stream ([`Connect`]). Mirrors and callouts use
//! the same verifier through their client config.

use coxswain_api::snapshot::{self as snap, subject_alt_name::Kind};
use pingora::protocols::l4::socket::SocketAddr as PeerAddr;
use pingora::protocols::l4::stream::Stream;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::sync::Arc;
use tokio::net::TcpStream;

/// Why a policy's names cannot be verified; the proxy then refuses requests to the backend.
#[derive(Debug, thiserror::Error)]
pub enum SanError {
    #[error("subjectAltName {0:?} is not a DNS name")]
    Hostname(String),
    #[error("a subjectAltName is empty")]
    Empty,
    #[error("building the certificate verifier: {0}")]
    Verifier(#[from] rustls::client::VerifierBuilderError),
}

/// A name the certificate must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum San {
    Dns(ServerName<'static>),
    Uri(String),
}

/// The snapshot's names, checked.
pub fn names(list: &[snap::SubjectAltName]) -> Result<Vec<San>, SanError> {
    list.iter()
        .map(|s| match &s.kind {
            Some(Kind::Hostname(h)) if !h.is_empty() => ServerName::try_from(h.clone())
                .map(San::Dns)
                .map_err(|_| SanError::Hostname(h.clone())),
            Some(Kind::Uri(u)) if !u.is_empty() => Ok(San::Uri(u.clone())),
            _ => Err(SanError::Empty),
        })
        .collect()
}

/// Verifies the chain as webpki does, then requires one of the names instead of the SNI.
#[derive(Debug)]
pub struct SanVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    names: Vec<San>,
}

impl SanVerifier {
    pub fn new(roots: RootCertStore, names: Vec<San>) -> Result<Self, SanError> {
        let webpki = WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()?;
        Ok(Self { webpki, names })
    }
}

/// A certificate valid but for another name: webpki reports that only once the chain, the
/// validity period and the key usage have passed.
fn wrong_name(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
        )
    )
}

/// Whether the certificate carries `uri` as a URI subjectAltName (compared exactly).
fn has_uri(cert: &CertificateDer<'_>, uri: &str) -> bool {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return false;
    };
    let Ok(Some(ext)) = cert.subject_alternative_name() else {
        return false;
    };
    ext.value
        .general_names
        .iter()
        .any(|n| matches!(n, x509_parser::extensions::GeneralName::URI(u) if *u == uri))
}

impl ServerCertVerifier for SanVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // The chain first, under the SNI: any failure but the name is final.
        match self
            .webpki
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Ok(_) => {}
            Err(e) if wrong_name(&e) => {}
            Err(e) => return Err(e),
        }
        for name in &self.names {
            match name {
                San::Dns(n) => {
                    match self
                        .webpki
                        .verify_server_cert(end_entity, intermediates, n, ocsp, now)
                    {
                        Ok(v) => return Ok(v),
                        Err(e) if wrong_name(&e) => {}
                        Err(e) => return Err(e),
                    }
                }
                San::Uri(u) => {
                    if has_uri(end_entity, u) {
                        return Ok(ServerCertVerified::assertion());
                    }
                }
            }
        }
        Err(rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName,
        ))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// A client config that verifies with `verifier`, but for its client certificate (mirrors and
/// callouts set their own ALPN).
pub fn client_config_builder(
    verifier: SanVerifier,
) -> Result<
    rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>,
    rustls::Error,
> {
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .dangerous()
    .with_custom_certificate_verifier(Arc::new(verifier)))
}

/// The system's CA certificates (wellKnownCACertificates: System), read once.
pub fn system_store() -> RootCertStore {
    static STORE: std::sync::OnceLock<RootCertStore> = std::sync::OnceLock::new();
    STORE
        .get_or_init(|| {
            let mut roots = RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::warn!(error = %e, "reading the system's CA certificates");
            }
            roots.add_parsable_certificates(found.certs);
            roots
        })
        .clone()
}

/// Pingora's connection to such a backend: TCP, then TLS verified by [`SanVerifier`] with the
/// policy's hostname as SNI. Pingora speaks cleartext HTTP over the stream it gets.
///
/// Pooling: Pingora keys its pool by the peer (address, group key: `BackendTls::pool_key`
/// covers the CAs and names), so a connection verified for one policy never serves another.
/// Within one key it tells connections apart by file descriptor, which a virtual stream lacks
/// (all are -1): an idle one that closes may take another idle one out of the pool with it,
/// and HTTP/2 connections to one endpoint may trade places in its in-use bookkeeping. Pingora
/// tests an idle connection before reusing it, so that costs a handshake, never a wrong or
/// dead connection.
#[derive(Debug)]
pub struct Connect {
    config: Arc<rustls::ClientConfig>,
    sni: ServerName<'static>,
}

impl Connect {
    /// Offers HTTP/1.1 by ALPN, or only h2 (then Pingora speaks HTTP/2 over the stream), as
    /// Pingora does on the TLS connections it opens.
    pub fn new(config: &rustls::ClientConfig, sni: ServerName<'static>, h2: bool) -> Self {
        let mut config = config.clone();
        config.alpn_protocols = vec![if h2 {
            b"h2".to_vec()
        } else {
            b"http/1.1".to_vec()
        }];
        Self {
            config: Arc::new(config),
            sni,
        }
    }
}

#[async_trait::async_trait]
impl pingora::connectors::L4Connect for Connect {
    async fn connect(&self, addr: &PeerAddr) -> pingora::Result<Stream> {
        use pingora::{ErrorType, OrErr};
        let PeerAddr::Inet(addr) = addr else {
            return Err(pingora::Error::explain(
                ErrorType::ConnectError,
                "a backend under a BackendTLSPolicy is reached over TCP",
            ));
        };
        let tcp = TcpStream::connect(addr)
            .await
            .or_err(ErrorType::ConnectError, "connecting to the backend")?;
        let _ = tcp.set_nodelay(true);
        let tls = tokio_rustls::TlsConnector::from(self.config.clone())
            .connect(self.sni.clone(), tcp)
            .await
            .or_err(
                ErrorType::TLSHandshakeFailure,
                "TLS to the backend (BackendTLSPolicy subjectAltNames)",
            )?;
        Ok(crate::virtual_socket::stream(tls))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};

    /// A CA's trust store and a leaf it issued with `sans`.
    fn issued(sans: Vec<SanType>) -> (RootCertStore, CertificateDer<'static>) {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::default();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let mut leaf = CertificateParams::default();
        leaf.subject_alt_names = sans;
        let leaf = leaf
            .signed_by(&KeyPair::generate().unwrap(), &issuer)
            .unwrap();
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from(ca_cert.der().to_vec()))
            .unwrap();
        (roots, CertificateDer::from(leaf.der().to_vec()))
    }

    fn verify(roots: &RootCertStore, leaf: &CertificateDer<'_>, names: &[San]) -> bool {
        let v = SanVerifier::new(roots.clone(), names.to_vec()).unwrap();
        let sni = ServerName::try_from("sni.example").unwrap();
        v.verify_server_cert(leaf, &[], &sni, &[], UnixTime::now())
            .is_ok()
    }

    fn dns(n: &str) -> San {
        San::Dns(ServerName::try_from(n.to_owned()).unwrap())
    }

    #[test]
    fn a_name_matches_as_tls_clients_match_and_a_uri_exactly() {
        let (roots, leaf) = issued(vec![
            SanType::DnsName("*.example.com".try_into().unwrap()),
            SanType::URI("spiffe://td/ns/a/sa/b".try_into().unwrap()),
        ]);
        assert!(verify(&roots, &leaf, &[dns("abc.example.com")]));
        assert!(
            !verify(&roots, &leaf, &[dns("a.b.example.com")]),
            "one label"
        );
        assert!(!verify(&roots, &leaf, &[dns("example.com")]));
        assert!(verify(
            &roots,
            &leaf,
            &[San::Uri("spiffe://td/ns/a/sa/b".into())]
        ));
        assert!(!verify(
            &roots,
            &leaf,
            &[San::Uri("spiffe://td/ns/a/sa/B".into())]
        ));
        assert!(!verify(
            &roots,
            &leaf,
            &[San::Uri("spiffe://td/ns/a/sa".into())]
        ));
        // Any one of several.
        assert!(verify(
            &roots,
            &leaf,
            &[San::Uri("spiffe://other".into()), dns("x.example.com")]
        ));
        // The SNI is never enough, even when the certificate carries it.
        let (roots, leaf) = issued(vec![SanType::DnsName("sni.example".try_into().unwrap())]);
        assert!(!verify(&roots, &leaf, &[dns("other.example")]));
    }

    #[test]
    fn the_right_name_from_another_ca_is_refused() {
        let (_, leaf) = issued(vec![SanType::DnsName(
            "abc.example.com".try_into().unwrap(),
        )]);
        let (other_roots, _) = issued(vec![]);
        assert!(!verify(&other_roots, &leaf, &[dns("abc.example.com")]));
    }

    #[test]
    fn names_must_be_usable() {
        let name = |kind| snap::SubjectAltName { kind: Some(kind) };
        assert_eq!(
            names(&[
                name(Kind::Hostname("a.example".into())),
                name(Kind::Uri("spiffe://x".into()))
            ])
            .unwrap(),
            [dns("a.example"), San::Uri("spiffe://x".into())]
        );
        assert!(matches!(
            names(&[name(Kind::Hostname("not a name".into()))]),
            Err(SanError::Hostname(_))
        ));
        assert!(matches!(
            names(&[name(Kind::Uri(String::new()))]),
            Err(SanError::Empty)
        ));
        assert!(matches!(
            names(&[snap::SubjectAltName { kind: None }]),
            Err(SanError::Empty)
        ));
    }
}
