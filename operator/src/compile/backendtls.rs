//! BackendTLSPolicies: which Service ports the proxy reaches over verified TLS, with which CA
//! and hostname, and each policy's conditions.
//!
//! Policies are taken oldest first (then by namespace/name); a policy whose target (a Service,
//! or one named port of it) an earlier one already holds is Conflicted and not used. A policy
//! naming a port outranks one naming the whole Service. A policy with no usable CA still
//! claims its target, and the proxy refuses requests to it (502) rather than sending them
//! unverified. With subjectAltNames, the backend's certificate must carry one of them instead
//! of the hostname (which is then only the SNI).

use super::status::{Condition, ObjectKey, Problem, Verdict, reason};
use super::store::Store;
use coxswain_api::snapshot as snap;
use gateway_api::apis::standard::backendtlspolicies::{
    BackendTlsPolicy, BackendTlsPolicyValidationSubjectAltNamesType as SanType,
};
use std::collections::BTreeMap;

/// (namespace, Service, port name or "" for every port).
type Target = (String, String, String);

#[derive(Debug, Default)]
pub struct Output {
    settings: BTreeMap<Target, snap::BackendTls>,
    /// Per policy: its conditions, the same for every ancestor, and the Services it targets.
    pub decided: BTreeMap<ObjectKey, Decided>,
}

#[derive(Debug, Clone)]
pub struct Decided {
    pub conditions: Vec<Condition>,
    pub services: Vec<(String, String)>,
}

impl Output {
    /// The TLS settings for a Service port, if a policy holds it.
    pub fn for_port(
        &self,
        namespace: &str,
        service: &str,
        port_name: &str,
    ) -> Option<&snap::BackendTls> {
        // Most clusters have no policy: answer that without building the keys.
        if self.settings.is_empty() {
            return None;
        }
        let key = |p: &str| (namespace.to_owned(), service.to_owned(), p.to_owned());
        if !port_name.is_empty()
            && let Some(t) = self.settings.get(&key(port_name))
        {
            return Some(t);
        }
        self.settings.get(&key(""))
    }
}

pub fn compile(store: &Store) -> Output {
    let mut out = Output::default();
    let mut policies: Vec<&BackendTlsPolicy> =
        store.backend_tls_policies.iter().map(|p| &**p).collect();
    policies.sort_by(|a, b| {
        let key = |p: &BackendTlsPolicy| (p.metadata.namespace.clone(), p.metadata.name.clone());
        super::store::oldest_first(&a.metadata, &b.metadata).then_with(|| key(a).cmp(&key(b)))
    });
    for policy in policies {
        let ns = policy.metadata.namespace.clone().unwrap_or_default();
        let name = policy.metadata.name.clone().unwrap_or_default();
        let generation = policy.metadata.generation.unwrap_or(0);
        let targets: Vec<Target> = policy
            .spec
            .target_refs
            .iter()
            .filter(|t| t.group.is_empty() && t.kind == "Service")
            .map(|t| {
                (
                    ns.clone(),
                    t.name.clone(),
                    t.section_name.clone().unwrap_or_default(),
                )
            })
            .collect();
        let services = targets
            .iter()
            .map(|(n, s, _)| (n.clone(), s.clone()))
            .collect();
        let (tls, accepted, resolved) = validate(store, policy, &ns);
        let taken = targets.iter().find(|t| out.settings.contains_key(*t));
        let accepted = match taken {
            Some((_, svc, section)) => Problem::new(
                reason::CONFLICTED,
                if section.is_empty() {
                    format!("an older BackendTLSPolicy already targets Service {svc}")
                } else {
                    format!(
                        "an older BackendTLSPolicy already targets port {section} of Service {svc}"
                    )
                },
            )
            .into(),
            None => {
                for t in &targets {
                    out.settings.insert(t.clone(), tls.clone());
                }
                accepted
            }
        };
        let conditions = vec![
            accepted.condition(reason::ACCEPTED, generation),
            resolved.condition(reason::RESOLVED_REFS, generation),
        ];
        out.decided.insert(
            ObjectKey::new(&ns, &name),
            Decided {
                conditions,
                services,
            },
        );
    }
    out
}

/// The TLS settings a policy asks for, and its Accepted and ResolvedRefs verdicts.
fn validate(
    store: &Store,
    policy: &BackendTlsPolicy,
    ns: &str,
) -> (snap::BackendTls, Verdict, Verdict) {
    let v = &policy.spec.validation;
    let mut tls = snap::BackendTls {
        hostname: v.hostname.clone(),
        ..Default::default()
    };
    let mut resolved = Verdict::holds(reason::RESOLVED_REFS, String::new());
    let mut pems = Vec::new();
    for r in v.ca_certificate_refs.iter().flatten() {
        let problem = if !r.group.is_empty() || r.kind != "ConfigMap" {
            Some(Problem::new(
                reason::INVALID_KIND,
                format!(
                    "caCertificateRef {}/{} {} is not a ConfigMap",
                    r.group, r.kind, r.name
                ),
            ))
        } else {
            match ca_bundle(store, ns, &r.name, "ca.crt") {
                Ok(pem) => {
                    pems.push(pem);
                    None
                }
                Err(why) => Some(Problem::new(reason::INVALID_CA_CERTIFICATE_REF, why)),
            }
        };
        // The first problem found is the one reported.
        if let (Some(problem), true) = (problem, resolved.holds) {
            resolved = problem.into();
        }
    }
    tls.ca_pem = pems.join("\n");
    let accepted: Verdict = match v.well_known_ca_certificates.as_deref() {
        Some("System") => {
            tls.system_roots = true;
            Verdict::holds(reason::ACCEPTED, String::new())
        }
        Some(other) => Problem::new(
            reason::INVALID,
            format!("wellKnownCACertificates {other:?} is not supported; use System"),
        )
        .into(),
        None if pems.is_empty() => Problem::new(
            reason::NO_VALID_CA_CERTIFICATE,
            "no caCertificateRef holds a usable CA certificate".into(),
        )
        .into(),
        None => Verdict::holds(reason::ACCEPTED, String::new()),
    };
    let mut sans = Vec::new();
    for san in v.subject_alt_names.iter().flatten() {
        use snap::subject_alt_name::Kind;
        let (kind, field) = match san.r#type {
            SanType::Hostname => (san.hostname.clone().map(Kind::Hostname), "hostname"),
            SanType::Uri => (san.uri.clone().map(Kind::Uri), "uri"),
        };
        // The CRD's rules require the value; without it the policy names nothing to trust.
        match kind {
            Some(Kind::Hostname(n) | Kind::Uri(n)) if n.is_empty() => {}
            Some(kind) => {
                sans.push(snap::SubjectAltName { kind: Some(kind) });
                continue;
            }
            None => {}
        }
        let why = format!("a subjectAltName of type {:?} has no {field}", san.r#type);
        return refused(tls, Problem::new(reason::INVALID, why).into(), resolved);
    }
    if !accepted.holds {
        return refused(tls, accepted, resolved);
    }
    // With subjectAltNames, `refuse` stays set for proxies that predate them (snapshot.proto).
    tls.refuse = !sans.is_empty();
    tls.subject_alt_names = sans;
    (tls, accepted, resolved)
}

/// A policy the proxy must refuse traffic for: no names to verify, only the refusal.
fn refused(
    mut tls: snap::BackendTls,
    accepted: Verdict,
    resolved: Verdict,
) -> (snap::BackendTls, Verdict, Verdict) {
    tls.refuse = true;
    tls.subject_alt_names.clear();
    (tls, accepted, resolved)
}

/// The PEM CA bundle under `key` of a ConfigMap, if every certificate in it parses.
pub(super) fn ca_bundle(store: &Store, ns: &str, name: &str, key: &str) -> Result<String, String> {
    let cm = store
        .config_maps
        .iter()
        .find(|c| {
            c.metadata.namespace.as_deref() == Some(ns) && c.metadata.name.as_deref() == Some(name)
        })
        .ok_or_else(|| format!("ConfigMap {ns}/{name} not found"))?;
    let pem = cm
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .ok_or_else(|| format!("ConfigMap {ns}/{name} has no {key}"))?;
    let mut count = 0;
    for block in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
        let block = block.map_err(|e| format!("ConfigMap {ns}/{name} {key}: {e}"))?;
        block
            .parse_x509()
            .map_err(|e| format!("ConfigMap {ns}/{name} {key}: {e}"))?;
        count += 1;
    }
    if count == 0 {
        return Err(format!("ConfigMap {ns}/{name} {key} holds no certificate"));
    }
    Ok(pem.clone())
}
