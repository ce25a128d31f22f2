//! A Gateway's own TLS settings (`spec.tls`, GEP-91): the CAs its HTTPS listeners verify client
//! certificates against (`frontend`, a default and per-port overrides), and the certificate it
//! presents to backends that ask for one (`backend.clientCertificateRef`).
//!
//! Client validation needs ports of the Gateway's own: a dedicated proxy's, or its internal
//! ports on the shared pool (`gateway_services`). Without them shared proxies serve several
//! Gateways on one port, and a TLS handshake cannot tell which Gateway's CAs apply before the
//! request names its host. A shared Gateway's backend client certificate goes on clusters of
//! its own (`backend_clients`): the shared pool's pooled backend connections are everyone's.

use super::backendtls::ca_bundle;
use super::refs::{self, GATEWAY_GROUP, Index};
use super::status::{Condition, ObjectKey, Problem, reason};
use super::store::Store;
use coxswain_api::snapshot as snap;
use gateway_api::apis::standard::gateways::{
    Gateway, GatewayTlsFrontendDefaultValidationMode, GatewayTlsFrontendPerPortTlsValidationMode,
};

/// What a Gateway's frontend TLS settings make of one HTTPS port.
#[derive(Debug, Clone, PartialEq)]
pub enum PortValidation {
    /// No client certificate is asked for.
    None,
    /// Clients are verified as this says; `partial` names a reference that did not resolve
    /// while another did (ResolvedRefs=False, the listener still serves with the others).
    Valid {
        validation: snap::ClientValidation,
        partial: Option<Problem>,
    },
    /// No CA is usable: the listener is not accepted (`accepted`) and serves nothing, rather
    /// than let clients in unverified. `resolved` says which reference failed.
    Invalid {
        accepted: Problem,
        resolved: Option<Problem>,
    },
}

/// One validation block (the default or a port's), resolved.
#[derive(Debug, Clone)]
struct Resolved {
    validation: PortValidation,
    insecure: bool,
}

/// A Gateway's frontend settings, resolved once for all its listeners (and its ListenerSets').
#[derive(Debug, Clone, Default)]
pub struct FrontendTls {
    default: Option<Resolved>,
    per_port: Vec<(i32, Resolved)>,
}

impl FrontendTls {
    /// Resolves `spec.tls.frontend` of `gateway`. `own_ports`: whether no other Gateway shares
    /// its ports (only then can they ask for client certificates).
    pub fn resolve(store: &Store, gateway: &Gateway, key: &ObjectKey, own_ports: bool) -> Self {
        let Some(frontend) = gateway.spec.tls.as_ref().and_then(|t| t.frontend.as_ref()) else {
            return Self::default();
        };
        let shared = |what: String| Resolved {
            validation: PortValidation::Invalid {
                accepted: Problem::new(
                    reason::UNSUPPORTED_VALUE,
                    format!(
                        "{what} asks for client certificates, which needs ports no other \
                         Gateway shares: give the Gateway or its class a \
                         CoxswainGatewayParameters parametersRef, or run the controller with \
                         --shared-gateway-ports"
                    ),
                ),
                resolved: None,
            },
            insecure: false,
        };
        let default = frontend.default.validation.as_ref().map(|v| {
            if !own_ports {
                return shared("spec.tls.frontend.default".into());
            }
            let refs: Vec<CaRef<'_>> = v
                .ca_certificate_refs
                .iter()
                .map(|r| CaRef {
                    group: &r.group,
                    kind: &r.kind,
                    name: &r.name,
                    namespace: r.namespace.as_deref(),
                })
                .collect();
            let insecure =
                v.mode == Some(GatewayTlsFrontendDefaultValidationMode::AllowInsecureFallback);
            resolve_block(store, key, &refs, insecure)
        });
        let per_port = frontend
            .per_port
            .iter()
            .flatten()
            .filter_map(|p| {
                let v = p.tls.validation.as_ref()?;
                if !own_ports {
                    return Some((
                        p.port,
                        shared(format!("spec.tls.frontend.perPort {}", p.port)),
                    ));
                }
                let refs: Vec<CaRef<'_>> = v
                    .ca_certificate_refs
                    .iter()
                    .map(|r| CaRef {
                        group: &r.group,
                        kind: &r.kind,
                        name: &r.name,
                        namespace: r.namespace.as_deref(),
                    })
                    .collect();
                let insecure = v.mode
                    == Some(GatewayTlsFrontendPerPortTlsValidationMode::AllowInsecureFallback);
                Some((p.port, resolve_block(store, key, &refs, insecure)))
            })
            .collect();
        Self { default, per_port }
    }

    /// The validation an HTTPS listener on `port` gets: its port's, else the default.
    pub fn for_port(&self, port: i32) -> PortValidation {
        self.per_port
            .iter()
            .find(|(p, _)| *p == port)
            .map(|(_, r)| r)
            .or(self.default.as_ref())
            .map_or(PortValidation::None, |r| r.validation.clone())
    }

    /// The Gateway's InsecureFrontendValidationMode condition: present (True) while a
    /// validation block lets clients in without a valid certificate, so whoever reads the
    /// Gateway sees that its listeners do not enforce mutual TLS.
    pub fn insecure_condition(&self, generation: i64) -> Option<Condition> {
        let mut where_ = Vec::new();
        if self.default.as_ref().is_some_and(|d| d.insecure) {
            where_.push("spec.tls.frontend.default".to_owned());
        }
        for (port, r) in &self.per_port {
            if r.insecure {
                where_.push(format!("spec.tls.frontend.perPort {port}"));
            }
        }
        (!where_.is_empty()).then(|| {
            Condition::new(
                reason::INSECURE_FRONTEND_VALIDATION_MODE,
                true,
                reason::CONFIGURATION_CHANGED,
                format!(
                    "{} uses mode AllowInsecureFallback: clients without a valid certificate \
                     are served",
                    where_.join(", ")
                ),
                generation,
            )
        })
    }
}

/// A caCertificateRef, whichever block it came from.
struct CaRef<'a> {
    group: &'a str,
    kind: &'a str,
    name: &'a str,
    namespace: Option<&'a str>,
}

/// The CA bundle of one validation block: every reference that resolves; the first that does
/// not names the ResolvedRefs reason.
fn resolve_block(
    store: &Store,
    gateway: &ObjectKey,
    refs: &[CaRef<'_>],
    insecure: bool,
) -> Resolved {
    let mut pems = Vec::new();
    let mut first_problem: Option<Problem> = None;
    for r in refs {
        let problem = match ca_of(store, gateway, r) {
            Ok(pem) => {
                pems.push(pem);
                continue;
            }
            Err(p) => p,
        };
        first_problem.get_or_insert(problem);
    }
    let validation = if pems.is_empty() {
        PortValidation::Invalid {
            accepted: Problem::new(
                reason::NO_VALID_CA_CERTIFICATE,
                match &first_problem {
                    Some(p) => format!(
                        "no caCertificateRef holds a usable CA certificate: {}",
                        p.message
                    ),
                    None => "caCertificateRefs is empty".into(),
                },
            ),
            resolved: first_problem,
        }
    } else {
        PortValidation::Valid {
            validation: snap::ClientValidation {
                ca_pem: pems.join("\n"),
                allow_insecure_fallback: insecure,
            },
            partial: first_problem,
        }
    };
    Resolved {
        validation,
        insecure,
    }
}

/// One CA reference: a core ConfigMap with `ca.crt`, in the Gateway's namespace or one whose
/// ReferenceGrant lets Gateways refer to it.
fn ca_of(store: &Store, gateway: &ObjectKey, r: &CaRef<'_>) -> Result<String, Problem> {
    if !r.group.is_empty() || r.kind != "ConfigMap" {
        return Err(Problem::new(
            reason::INVALID_CA_CERTIFICATE_KIND,
            format!(
                "caCertificateRef {}/{} {} is not a ConfigMap",
                r.group, r.kind, r.name
            ),
        ));
    }
    let ns = r.namespace.unwrap_or(&gateway.namespace);
    if !refs::permitted(
        store,
        GATEWAY_GROUP,
        "Gateway",
        &gateway.namespace,
        "",
        "ConfigMap",
        ns,
        r.name,
    ) {
        return Err(Problem::new(
            reason::REF_NOT_PERMITTED,
            format!(
                "no ReferenceGrant in {ns} allows Gateways in {} to use ConfigMap {}",
                gateway.namespace, r.name
            ),
        ));
    }
    ca_bundle(store, ns, r.name, "ca.crt")
        .map_err(|why| Problem::new(reason::INVALID_CA_CERTIFICATE_REF, why))
}

/// A certificate chain and private key, PEM.
type KeyPair = (String, String);

/// `spec.tls.backend.clientCertificateRef`, resolved: the certificate's name and key pair for
/// the snapshot, or why the Gateway's ResolvedRefs is False. None: the Gateway sets none.
pub fn backend_client_certificate(
    store: &Store,
    index: &Index<'_>,
    gateway: &Gateway,
    key: &ObjectKey,
) -> Option<Result<(String, KeyPair), Problem>> {
    let r = gateway
        .spec
        .tls
        .as_ref()?
        .backend
        .as_ref()?
        .client_certificate_ref
        .as_ref()?;
    let group = r.group.as_deref().unwrap_or("");
    let kind = r.kind.as_deref().unwrap_or("Secret");
    Some((|| {
        if !group.is_empty() || kind != "Secret" {
            return Err(Problem::new(
                reason::INVALID_CLIENT_CERTIFICATE_REF,
                format!(
                    "clientCertificateRef {group}/{kind} {} is not a core Secret",
                    r.name
                ),
            ));
        }
        let ns = r.namespace.as_deref().unwrap_or(&key.namespace);
        if !refs::permitted(
            store,
            GATEWAY_GROUP,
            "Gateway",
            &key.namespace,
            "",
            "Secret",
            ns,
            &r.name,
        ) {
            return Err(Problem::new(
                reason::REF_NOT_PERMITTED,
                format!(
                    "no ReferenceGrant in {ns} allows Gateways in {} to use Secret {}",
                    key.namespace, r.name
                ),
            ));
        }
        let Some(secret) = index.secret(ns, &r.name) else {
            return Err(Problem::new(
                reason::INVALID_CLIENT_CERTIFICATE_REF,
                format!(
                    "Secret {ns}/{} not found (a kubernetes.io/tls Secret)",
                    r.name
                ),
            ));
        };
        let pair = refs::tls_key_pair(secret).map_err(|m| {
            Problem::new(
                reason::INVALID_CLIENT_CERTIFICATE_REF,
                format!("Secret {ns}/{}: {m}", r.name),
            )
        })?;
        Ok((format!("{ns}/{}", r.name), pair))
    })())
}
