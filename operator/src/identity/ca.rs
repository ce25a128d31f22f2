//! CA key material and SVID issuance.

use coxswain_api::names::SpiffeId;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use std::time::Duration;
use time::OffsetDateTime;

/// How long an SVID is valid: proxies renew at half of it.
pub const DEFAULT_SVID_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// How long a generated CA is valid.
const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Certificates start a little in the past: clocks of nodes drift.
const BACKDATE: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("generating a key: {0}")]
    Key(#[source] rcgen::Error),
    #[error("CA certificate or key is not usable: {0}")]
    Load(#[source] rcgen::Error),
    #[error("the CSR is not a valid, self-signed PKCS#10 request: {0}")]
    Csr(#[source] rcgen::Error),
    #[error("SPIFFE ID {0} cannot be put in a certificate")]
    SpiffeId(String),
    #[error("{0:?} is not a Pod name")]
    PodName(String),
    #[error("signing: {0}")]
    Sign(#[source] rcgen::Error),
}

/// The CA: its certificate (the trust bundle) and signing key.
pub struct Ca {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("Ca")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl Ca {
    /// A new self-signed CA (ECDSA P-256) for `trust_domain`.
    pub fn generate(trust_domain: &str, now: OffsetDateTime) -> Result<Self, CaError> {
        let key = KeyPair::generate().map_err(CaError::Key)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "coxswain");
        dn.push(
            DnType::CommonName,
            format!("coxswain discovery CA ({trust_domain})"),
        );
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = now - BACKDATE;
        params.not_after = now + CA_LIFETIME;
        let cert = params.self_signed(&key).map_err(CaError::Sign)?;
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// A CA from its stored certificate and key (the coxswain-discovery-ca Secret).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CaError> {
        let key = KeyPair::from_pem(key_pem).map_err(CaError::Load)?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).map_err(CaError::Load)?;
        Ok(Self {
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
            issuer,
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Signs a proxy's CSR as an SVID for `id`, issued to Pod `pod`. Whatever names the CSR
    /// asks for are dropped: the certificate carries exactly one URI SAN, the identity the
    /// token proved, and the subject common name is the Pod the token was bound to (replicas
    /// share a SPIFFE ID; the discovery server tells them apart by it). Client authentication
    /// is its only use: a proxy never serves TLS with it.
    pub fn sign_svid(
        &self,
        csr_pem: &str,
        id: &SpiffeId,
        pod: &str,
        now: OffsetDateTime,
        lifetime: Duration,
    ) -> Result<(String, OffsetDateTime), CaError> {
        if !coxswain_api::names::is_dns_subdomain(pod) {
            return Err(CaError::PodName(pod.to_owned()));
        }
        let mut csr = CertificateSigningRequestParams::from_pem(csr_pem).map_err(CaError::Csr)?;
        let uri = id.to_string();
        let san = rcgen::string::Ia5String::try_from(uri.clone())
            .map_err(|_| CaError::SpiffeId(uri.clone()))?;
        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![SanType::URI(san)];
        let mut subject = DistinguishedName::new();
        subject.push(DnType::CommonName, pod);
        params.distinguished_name = subject;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = now - BACKDATE;
        let not_after = now + lifetime;
        params.not_after = not_after;
        params.use_authority_key_identifier_extension = true;
        csr.params = params;
        let cert = csr.signed_by(&self.issuer).map_err(CaError::Sign)?;
        Ok((cert.pem(), not_after))
    }

    /// A server certificate for the controller's own listeners, signed by this CA.
    pub fn sign_server(
        &self,
        dns_names: &[String],
        now: OffsetDateTime,
        lifetime: Duration,
    ) -> Result<(String, String), CaError> {
        let key = KeyPair::generate().map_err(CaError::Key)?;
        let mut params = CertificateParams::new(dns_names.to_vec()).map_err(CaError::Sign)?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = now - BACKDATE;
        params.not_after = now + lifetime;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(CaError::Sign)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::extensions::GeneralName;
    use x509_parser::pem::parse_x509_pem;

    fn csr_asking_for(names: &[&str]) -> (String, KeyPair) {
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .unwrap();
        let csr = params.serialize_request(&key).unwrap();
        (csr.pem().unwrap(), key)
    }

    #[test]
    fn svids_carry_only_the_proven_identity() {
        let now = OffsetDateTime::now_utc();
        let ca = Ca::generate("cluster.local", now).unwrap();
        // The CSR asks for a name it has no right to; the SVID ignores it.
        let (csr, _key) = csr_asking_for(&["coxswain-controller.coxswain-system.svc", "admin"]);
        let id = SpiffeId::new("cluster.local", "web", "edge-coxswain");
        let (pem, not_after) = ca
            .sign_svid(
                &csr,
                &id,
                "edge-coxswain-7d9f-x2x4b",
                now,
                DEFAULT_SVID_LIFETIME,
            )
            .unwrap();

        let (_, parsed) = parse_x509_pem(pem.as_bytes()).unwrap();
        let cert = parsed.parse_x509().unwrap();
        let sans: Vec<String> = cert
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .map(|n| match n {
                GeneralName::URI(u) => format!("uri:{u}"),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(sans, ["uri:spiffe://cluster.local/ns/web/sa/edge-coxswain"]);
        assert!(!cert.is_ca());
        let subject: Vec<&str> = cert
            .subject()
            .iter_common_name()
            .map(|cn| cn.as_str().unwrap())
            .collect();
        assert_eq!(
            subject,
            ["edge-coxswain-7d9f-x2x4b"],
            "the Pod, as the subject"
        );
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(
            eku.client_auth,
            "client authentication is what an SVID is for"
        );
        assert!(!eku.server_auth, "never a server certificate");
        assert!(!eku.any && eku.other.is_empty());
        assert_eq!(
            cert.validity().not_after.timestamp(),
            not_after.unix_timestamp()
        );
        let life = not_after - now;
        assert_eq!(life.whole_hours(), 24);

        // Signed by the CA, and only by it.
        let (_, ca_pem) = parse_x509_pem(ca.cert_pem().as_bytes()).unwrap();
        let ca_cert = ca_pem.parse_x509().unwrap();
        assert!(cert.verify_signature(Some(ca_cert.public_key())).is_ok());
        let other = Ca::generate("cluster.local", now).unwrap();
        let (_, other_pem) = parse_x509_pem(other.cert_pem().as_bytes()).unwrap();
        let other_cert = other_pem.parse_x509().unwrap();
        assert!(
            cert.verify_signature(Some(other_cert.public_key()))
                .is_err()
        );
    }

    #[test]
    fn a_stored_ca_signs_like_the_generated_one() {
        let now = OffsetDateTime::now_utc();
        let ca = Ca::generate("cluster.local", now).unwrap();
        let loaded = Ca::from_pem(ca.cert_pem(), ca.key_pem()).unwrap();
        let (csr, _) = csr_asking_for(&[]);
        let id = SpiffeId::new("cluster.local", "coxswain-system", "coxswain-proxy");
        let (pem, _) = loaded
            .sign_svid(&csr, &id, "coxswain-proxy-0", now, DEFAULT_SVID_LIFETIME)
            .unwrap();
        let (_, parsed) = parse_x509_pem(pem.as_bytes()).unwrap();
        let cert = parsed.parse_x509().unwrap();
        let (_, ca_pem) = parse_x509_pem(ca.cert_pem().as_bytes()).unwrap();
        assert!(
            cert.verify_signature(Some(ca_pem.parse_x509().unwrap().public_key()))
                .is_ok()
        );
        assert_eq!(cert.issuer(), ca_pem.parse_x509().unwrap().subject());
    }

    #[test]
    fn garbage_csrs_and_keys_are_errors() {
        let now = OffsetDateTime::now_utc();
        let ca = Ca::generate("cluster.local", now).unwrap();
        let id = SpiffeId::new("cluster.local", "a", "b");
        assert!(matches!(
            ca.sign_svid("not a csr", &id, "pod", now, DEFAULT_SVID_LIFETIME),
            Err(CaError::Csr(_))
        ));
        let (csr, _) = csr_asking_for(&[]);
        for bad_pod in ["", "Pod", "a/b", "CN=x,O=y"] {
            assert!(
                matches!(
                    ca.sign_svid(&csr, &id, bad_pod, now, DEFAULT_SVID_LIFETIME),
                    Err(CaError::PodName(_))
                ),
                "{bad_pod:?}"
            );
        }
        assert!(Ca::from_pem(ca.cert_pem(), "junk").is_err());
    }
}
