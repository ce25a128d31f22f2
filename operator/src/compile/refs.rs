//! Cross-object references: ReferenceGrants, Services and their endpoints, TLS Secrets.

// Re-exported where the route compilers have always found them.
pub use super::clusters::{H2C_CLUSTER_SUFFIX, cluster_name};
use super::store::Store;
use coxswain_api::snapshot::{AppProtocol, BackendTls, Cluster, Endpoint};
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::collections::HashMap;
use std::sync::Arc;

pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";

/// Whether a ReferenceGrant in `to_namespace` lets objects of `from_kind` in `from_namespace`
/// refer to `to_kind` `to_name` (Gateway API ReferenceGrant: the grant lives in the target's
/// namespace; an empty `to.name` allows every object of the kind).
#[allow(clippy::too_many_arguments)]
pub fn permitted(
    store: &Store,
    from_group: &str,
    from_kind: &str,
    from_namespace: &str,
    to_group: &str,
    to_kind: &str,
    to_namespace: &str,
    to_name: &str,
) -> bool {
    if from_namespace == to_namespace {
        return true;
    }
    store.reference_grants.iter().any(|grant| {
        grant.metadata.namespace.as_deref() == Some(to_namespace)
            && grant.spec.from.iter().any(|f| {
                f.group == from_group && f.kind == from_kind && f.namespace == from_namespace
            })
            && grant.spec.to.iter().any(|t| {
                t.group == to_group
                    && t.kind == to_kind
                    && t.name
                        .as_deref()
                        .is_none_or(|n| n.is_empty() || n == to_name)
            })
    })
}

/// Indexes built once per compile so lookups are not linear scans per reference (hashed: they
/// are looked up by exact name only, with foldhash: built every pass over every Service and
/// EndpointSlice, where SipHash's cost showed).
pub struct Index<'a> {
    /// The store's `Arc`s: an incremental compile tells an unchanged object by its identity.
    services: ByName<'a, &'a Arc<Service>>,
    /// (namespace, service name) -> slices
    slices: ByName<'a, Vec<&'a Arc<EndpointSlice>>>,
    secrets: ByName<'a, &'a Secret>,
    /// BackendTLSPolicies, decided once: every cluster of a Service port they hold gets TLS.
    pub backend_tls: super::backendtls::Output,
    /// CoxswainBackendPolicies, decided once: the load balancer of the Service ports they hold.
    pub backend_policy: super::backendpolicy::Output,
}

type ByName<'a, V> = HashMap<(&'a str, &'a str), V, foldhash::fast::RandomState>;

impl<'a> Index<'a> {
    pub fn new(store: &'a Store) -> Self {
        let key = |m: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            (
                m.namespace.as_deref().unwrap_or("default"),
                m.name.as_deref().unwrap_or(""),
            )
        };
        let mut slices: ByName<'a, Vec<_>> = HashMap::default();
        for slice in &store.endpoint_slices {
            let Some(svc) = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("kubernetes.io/service-name"))
            else {
                continue;
            };
            let ns = slice.metadata.namespace.as_deref().unwrap_or("default");
            slices.entry((ns, svc.as_str())).or_default().push(slice);
        }
        Self {
            services: store
                .services
                .iter()
                .map(|s| (key(&s.metadata), s))
                .collect(),
            slices,
            secrets: store
                .secrets
                .iter()
                .map(|s| (key(&s.metadata), &**s))
                .collect(),
            backend_tls: super::backendtls::compile(store),
            backend_policy: super::backendpolicy::compile(store),
        }
    }

    pub fn service(&self, namespace: &str, name: &str) -> Option<&'a Service> {
        self.services.get(&(namespace, name)).map(|s| &***s)
    }

    /// The Service and its EndpointSlices as stored: what [`Self::cluster`] reads of them.
    pub fn service_objects<'s>(
        &'s self,
        namespace: &'s str,
        name: &'s str,
    ) -> (Option<&'a Arc<Service>>, &'s [&'a Arc<EndpointSlice>]) {
        (
            self.services.get(&(namespace, name)).copied(),
            self.slices
                .get(&(namespace, name))
                .map_or(&[][..], Vec::as_slice),
        )
    }

    /// The BackendTLSPolicy settings [`Self::cluster`] gives the Service port.
    pub fn port_tls(&self, namespace: &str, name: &str, port: i32) -> Option<&BackendTls> {
        let port_name = self
            .service(namespace, name)?
            .spec
            .as_ref()?
            .ports
            .iter()
            .flatten()
            .find(|p| p.port == port)?
            .name
            .as_deref()
            .unwrap_or_default();
        self.backend_tls.for_port(namespace, name, port_name)
    }

    pub fn secret(&self, namespace: &str, name: &str) -> Option<&'a Secret> {
        self.secrets.get(&(namespace, name)).copied()
    }

    /// The cluster for one Service port: endpoints from the Service's EndpointSlices whose
    /// port has the Service port's name. None when the Service has no such port.
    pub fn cluster(&self, namespace: &str, name: &str, port: i32) -> Option<Cluster> {
        let service = self.service(namespace, name)?;
        let spec = service.spec.as_ref()?;
        let svc_port = spec.ports.iter().flatten().find(|p| p.port == port)?;
        let port_name = svc_port.name.clone().unwrap_or_default();
        let app_protocol = match svc_port.app_protocol.as_deref() {
            Some("kubernetes.io/h2c") => AppProtocol::H2c,
            Some("kubernetes.io/ws" | "kubernetes.io/wss") => AppProtocol::Ws,
            _ => AppProtocol::Http1,
        };
        let mut endpoints = Vec::new();
        for slice in self.slices.get(&(namespace, name)).into_iter().flatten() {
            if slice.address_type == "FQDN" {
                continue;
            }
            let Some(target) = slice
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.clone().unwrap_or_default() == port_name)
            else {
                continue;
            };
            let Some(target_port) = target.port.and_then(|p| u32::try_from(p).ok()) else {
                continue;
            };
            for ep in slice.endpoints.iter().flatten() {
                let c = ep.conditions.as_ref();
                // EndpointSlice API: a nil ready condition means ready; serving defaults to ready.
                let ready = c.and_then(|c| c.ready).unwrap_or(true);
                let serving = c.and_then(|c| c.serving).unwrap_or(ready);
                let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
                for address in &ep.addresses {
                    endpoints.push(Endpoint {
                        address: address.clone(),
                        port: target_port,
                        ready,
                        serving,
                        terminating,
                    });
                }
            }
        }
        endpoints.sort_by(|a, b| (&a.address, a.port).cmp(&(&b.address, b.port)));
        endpoints.dedup_by(|a, b| a.address == b.address && a.port == b.port);
        Some(Cluster {
            name: cluster_name(namespace, name, port),
            app_protocol: app_protocol as i32,
            endpoints,
            tls: self
                .backend_tls
                .for_port(namespace, name, &port_name)
                .cloned(),
            // Set once every route's clusters are known (compile::compile): policies and
            // Ingress annotations decide per Service port, whichever route asked.
            load_balancer: None,
        })
    }
}

/// Why a TLS Secret cannot serve as a certificate.
pub fn tls_key_pair(secret: &Secret) -> Result<(String, String), String> {
    if secret.type_.as_deref() != Some("kubernetes.io/tls") {
        return Err(format!(
            "Secret is of type {:?}, not kubernetes.io/tls",
            secret.type_.as_deref().unwrap_or("Opaque")
        ));
    }
    let data = secret.data.as_ref();
    let field = |k: &str| -> Result<String, String> {
        let bytes = data
            .and_then(|d| d.get(k))
            .map(|b| b.0.clone())
            .ok_or_else(|| format!("Secret has no {k}"))?;
        let text = String::from_utf8(bytes).map_err(|_| format!("{k} is not PEM text"))?;
        if !text.contains("-----BEGIN ") {
            return Err(format!("{k} is not PEM"));
        }
        Ok(text)
    };
    let cert = field("tls.crt")?;
    let key = field("tls.key")?;
    if !cert.contains("CERTIFICATE-----") {
        return Err("tls.crt holds no certificate".into());
    }
    if !key.contains("PRIVATE KEY-----") {
        return Err("tls.key holds no private key".into());
    }
    Ok((cert, key))
}
