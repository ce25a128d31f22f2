//! The compiler's input: plain lists of Kubernetes objects, as the reflector's caches hold
//! them, or as `coxswain snapshot` reads them from YAML files. Each object is behind an `Arc`
//! so that a pass's input can share the reflector's cached objects instead of copying them.

use coxswain_api::{
    CoxswainAccessPolicy, CoxswainBackendPolicy, CoxswainGatewayParameters,
    CoxswainIngressClassParameters,
};
use gateway_api::apis::experimental::httproutes::HttpRoute;
use gateway_api::apis::experimental::tcproutes::TcpRoute;
use gateway_api::apis::experimental::udproutes::UdpRoute;
use gateway_api::apis::standard::backendtlspolicies::BackendTlsPolicy;
use gateway_api::apis::standard::gatewayclasses::GatewayClass;
use gateway_api::apis::standard::gateways::Gateway;
use gateway_api::apis::standard::grpcroutes::GrpcRoute;
use gateway_api::apis::standard::listenersets::ListenerSet;
use gateway_api::apis::standard::referencegrants::ReferenceGrant;
use gateway_api::apis::standard::tlsroutes::TlsRoute;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A kind's objects, in the reflector's order. A persistent vector: a pass's copy of the caches
/// is made in constant time, and a watch event changes the reflector's copy without touching
/// the others' objects.
pub type Objects<K> = imbl::Vector<Arc<K>>;

#[derive(Debug, Clone, Default)]
pub struct Store {
    pub gateway_classes: Objects<GatewayClass>,
    pub gateways: Objects<Gateway>,
    /// Listeners added to a Gateway by other objects (GEP-1713).
    pub listener_sets: Objects<ListenerSet>,
    pub http_routes: Objects<HttpRoute>,
    pub grpc_routes: Objects<GrpcRoute>,
    pub tls_routes: Objects<TlsRoute>,
    /// Experimental (v1alpha2): absent unless the cluster installs the experimental channel.
    pub tcp_routes: Objects<TcpRoute>,
    /// Experimental (v1alpha2), as TCPRoute.
    pub udp_routes: Objects<UdpRoute>,
    pub backend_tls_policies: Objects<BackendTlsPolicy>,
    /// Read for BackendTLSPolicy CA certificates.
    pub config_maps: Objects<ConfigMap>,
    pub reference_grants: Objects<ReferenceGrant>,
    pub services: Objects<Service>,
    pub endpoint_slices: Objects<EndpointSlice>,
    pub secrets: Objects<Secret>,
    pub namespaces: Objects<Namespace>,
    pub ingresses: Objects<Ingress>,
    pub ingress_classes: Objects<IngressClass>,
    pub ingress_class_parameters: Objects<CoxswainIngressClassParameters>,
    pub gateway_parameters: Objects<CoxswainGatewayParameters>,
    pub backend_policies: Objects<CoxswainBackendPolicy>,
    pub access_policies: Objects<CoxswainAccessPolicy>,
    /// JWKS documents the controller fetched from policies' URLs (`crate::jwks`): the
    /// document, or why there is none yet. Never read from files: `coxswain snapshot` fetches
    /// nothing, so remote providers compile as not fetched there.
    pub remote_jwks: std::collections::BTreeMap<JwksSource, Result<String, String>>,
}

/// One JWKS URL to fetch, with the CA certificates (PEM, besides the system's) its server's
/// certificate must chain to. Keyed by the certificates' text, not the ConfigMap's name, so a
/// changed bundle is a new source and is fetched again under the new trust.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JwksSource {
    pub uri: String,
    pub ca_pem: Option<String>,
}

impl Store {
    /// Objects per kind, for the controller's metrics.
    pub fn counts(&self) -> std::collections::BTreeMap<&'static str, usize> {
        std::collections::BTreeMap::from([
            ("GatewayClass", self.gateway_classes.len()),
            ("Gateway", self.gateways.len()),
            ("ListenerSet", self.listener_sets.len()),
            ("HTTPRoute", self.http_routes.len()),
            ("GRPCRoute", self.grpc_routes.len()),
            ("TLSRoute", self.tls_routes.len()),
            ("TCPRoute", self.tcp_routes.len()),
            ("UDPRoute", self.udp_routes.len()),
            ("BackendTLSPolicy", self.backend_tls_policies.len()),
            ("ConfigMap", self.config_maps.len()),
            ("ReferenceGrant", self.reference_grants.len()),
            ("Service", self.services.len()),
            ("EndpointSlice", self.endpoint_slices.len()),
            ("Secret", self.secrets.len()),
            ("Namespace", self.namespaces.len()),
            ("Ingress", self.ingresses.len()),
            ("IngressClass", self.ingress_classes.len()),
            (
                "CoxswainIngressClassParameters",
                self.ingress_class_parameters.len(),
            ),
            ("CoxswainGatewayParameters", self.gateway_parameters.len()),
            ("CoxswainBackendPolicy", self.backend_policies.len()),
            ("CoxswainAccessPolicy", self.access_policies.len()),
        ])
    }
}

/// Older objects first by creationTimestamp; objects without one (read from files) after those
/// with one. Callers break ties by namespace/name: Gateway API conflict rules.
pub fn oldest_first(
    a: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    b: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> std::cmp::Ordering {
    let created = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        m.creation_timestamp
            .as_ref()
            .map(|t| (t.0.as_second(), t.0.subsec_nanosecond()))
    };
    match (created(a), created(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    }
}

/// A document that could not be loaded. The rest of the input still compiles.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: document {index}: not YAML: {message}")]
    Yaml {
        path: PathBuf,
        index: usize,
        message: String,
    },
    #[error("{path}: {kind} {name}: {message}")]
    Object {
        path: PathBuf,
        kind: String,
        name: String,
        message: String,
    },
}

/// What happened to one document.
enum Loaded {
    Stored,
    /// A kind the compiler does not read (Deployments, ConfigMaps...): not an error.
    Ignored,
}

impl Store {
    /// Loads every `.yaml`/`.yml` file under the given files and directories (recursively,
    /// in name order). `List` objects are unpacked. Errors are collected, not fatal.
    pub fn load_paths(paths: &[PathBuf]) -> (Self, Vec<LoadError>) {
        let mut store = Self::default();
        let mut errors = Vec::new();
        let mut files = Vec::new();
        for p in paths {
            collect_files(p, &mut files, &mut errors);
        }
        for file in files {
            match std::fs::read_to_string(&file) {
                Ok(text) => store.load_yaml(&file, &text, &mut errors),
                Err(source) => errors.push(LoadError::Read { path: file, source }),
            }
        }
        (store, errors)
    }

    /// Loads a multi-document YAML text; `path` is only for error messages.
    pub fn load_yaml(&mut self, path: &Path, text: &str, errors: &mut Vec<LoadError>) {
        for (index, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
            let value = match serde_json::Value::deserialize_yaml(doc) {
                Ok(v) => v,
                Err(message) => {
                    errors.push(LoadError::Yaml {
                        path: path.to_owned(),
                        index,
                        message,
                    });
                    // The parser cannot resynchronise after a syntax error; it would repeat it.
                    break;
                }
            };
            if value.is_null() {
                continue;
            }
            self.load_value(path, value, errors);
        }
    }

    fn load_value(&mut self, path: &Path, value: serde_json::Value, errors: &mut Vec<LoadError>) {
        let kind = value["kind"].as_str().unwrap_or("").to_owned();
        let api_version = value["apiVersion"].as_str().unwrap_or("").to_owned();
        if kind.ends_with("List") && value["items"].is_array() {
            if let serde_json::Value::Array(items) = value["items"].clone() {
                for item in items {
                    self.load_value(path, item, errors);
                }
            }
            return;
        }
        let name = value["metadata"]["name"]
            .as_str()
            .unwrap_or("<unnamed>")
            .to_owned();
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        let result = match (group, kind.as_str()) {
            ("gateway.networking.k8s.io", "GatewayClass") => push(&mut self.gateway_classes, value),
            ("gateway.networking.k8s.io", "Gateway") => push(&mut self.gateways, value),
            ("gateway.networking.k8s.io", "ListenerSet") => push(&mut self.listener_sets, value),
            ("gateway.networking.k8s.io", "HTTPRoute") => push(&mut self.http_routes, value),
            ("gateway.networking.k8s.io", "GRPCRoute") => push(&mut self.grpc_routes, value),
            ("gateway.networking.k8s.io", "TLSRoute") => push(&mut self.tls_routes, value),
            ("gateway.networking.k8s.io", "TCPRoute") => push(&mut self.tcp_routes, value),
            ("gateway.networking.k8s.io", "UDPRoute") => push(&mut self.udp_routes, value),
            ("gateway.networking.k8s.io", "BackendTLSPolicy") => {
                push(&mut self.backend_tls_policies, value)
            }
            ("", "ConfigMap") => push(&mut self.config_maps, value),
            ("gateway.networking.k8s.io", "ReferenceGrant") => {
                push(&mut self.reference_grants, value)
            }
            ("", "Service") => push(&mut self.services, value),
            ("discovery.k8s.io", "EndpointSlice") => push(&mut self.endpoint_slices, value),
            ("", "Secret") => push(&mut self.secrets, value),
            ("", "Namespace") => push(&mut self.namespaces, value),
            ("networking.k8s.io", "Ingress") => push(&mut self.ingresses, value),
            ("networking.k8s.io", "IngressClass") => push(&mut self.ingress_classes, value),
            ("ingress.coxswain-labs.dev", "CoxswainIngressClassParameters") => {
                push(&mut self.ingress_class_parameters, value)
            }
            ("gateway.coxswain-labs.dev", "CoxswainGatewayParameters") => {
                push(&mut self.gateway_parameters, value)
            }
            ("gateway.coxswain-labs.dev", "CoxswainAccessPolicy") => {
                push(&mut self.access_policies, value)
            }
            ("gateway.coxswain-labs.dev", "CoxswainBackendPolicy") => {
                push(&mut self.backend_policies, value)
            }
            _ => Ok(Loaded::Ignored),
        };
        if let Err(message) = result {
            errors.push(LoadError::Object {
                path: path.to_owned(),
                kind,
                name,
                message,
            });
        }
    }
}

fn push<T: DeserializeOwned>(
    list: &mut Objects<T>,
    value: serde_json::Value,
) -> Result<Loaded, String> {
    let obj = serde_json::from_value(value).map_err(|e| e.to_string())?;
    list.push_back(Arc::new(obj));
    Ok(Loaded::Stored)
}

trait FromYamlDoc: Sized {
    fn deserialize_yaml(doc: serde_yaml::Deserializer<'_>) -> Result<Self, String>;
}

impl FromYamlDoc for serde_json::Value {
    fn deserialize_yaml(doc: serde_yaml::Deserializer<'_>) -> Result<Self, String> {
        serde::Deserialize::deserialize(doc).map_err(|e| e.to_string())
    }
}

fn collect_files(path: &Path, out: &mut Vec<PathBuf>, errors: &mut Vec<LoadError>) {
    if path.is_dir() {
        let entries = match std::fs::read_dir(path) {
            Ok(e) => e,
            Err(source) => {
                errors.push(LoadError::Read {
                    path: path.to_owned(),
                    source,
                });
                return;
            }
        };
        let mut children: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        children.sort();
        for child in children {
            let is_yaml = child.extension().is_some_and(|e| e == "yaml" || e == "yml");
            if child.is_dir() || is_yaml {
                collect_files(&child, out, errors);
            }
        }
    } else {
        out.push(path.to_owned());
    }
}
