//! The controller's view of the cluster: one watch-backed cache per kind the compiler reads,
//! and a signal whenever any of them changes. Kinds whose CRDs are missing (Gateway API not
//! installed yet) keep retrying with backoff and are picked up when they appear.
//!
//! Objects are cached through `DeserializeGuard`: one object these types cannot read (for
//! example an HTTPRoute using an experimental-channel filter) is logged and left out, instead
//! of failing the whole list and stalling every other object of its kind.

use crate::compile::Store;
use coxswain_api::{CoxswainGatewayParameters, CoxswainIngressClassParameters};
use futures::StreamExt;
use gateway_api::apis::standard::gatewayclasses::GatewayClass;
use gateway_api::apis::standard::gateways::Gateway;
use gateway_api::apis::standard::httproutes::HttpRoute;
use gateway_api::apis::standard::referencegrants::ReferenceGrant;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::core::DeserializeGuard;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::Arc;
use tokio::sync::Notify;

/// Readers of every cache.
#[derive(Clone)]
pub struct Reflector {
    gateway_classes: Cache<GatewayClass>,
    gateways: Cache<Gateway>,
    http_routes: Cache<HttpRoute>,
    reference_grants: Cache<ReferenceGrant>,
    services: Cache<Service>,
    endpoint_slices: Cache<EndpointSlice>,
    secrets: Cache<Secret>,
    namespaces: Cache<Namespace>,
    ingresses: Cache<Ingress>,
    ingress_classes: Cache<IngressClass>,
    ingress_class_parameters: Cache<CoxswainIngressClassParameters>,
    gateway_parameters: Cache<CoxswainGatewayParameters>,
    /// Notified after any cache changed.
    pub changed: Arc<Notify>,
}

type Cache<K> = reflector::Store<DeserializeGuard<K>>;

fn reflect<K>(client: &Client, config: watcher::Config, changed: Arc<Notify>) -> Cache<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let api: Api<DeserializeGuard<K>> = Api::all(client.clone());
    let (reader, writer) = reflector::store();
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let stream = reflector(writer, watcher(api, config).default_backoff());
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => {
                    if let watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) = &event
                        && let Err(invalid) = &obj.0
                    {
                        tracing::warn!(
                            %kind,
                            namespace = obj.namespace().unwrap_or_default(),
                            name = %obj.name_any(),
                            error = %invalid,
                            "object skipped: it does not match the types this controller reads"
                        );
                    }
                    changed.notify_one();
                }
                // Missing CRDs and API hiccups: the watcher backs off and retries.
                Err(e) => tracing::debug!(%kind, error = %e, "watch error"),
            }
        }
    });
    reader
}

impl Reflector {
    /// Starts every watch cluster-wide. Secrets are limited to TLS ones.
    pub fn start(client: &Client) -> Self {
        let changed = Arc::new(Notify::new());
        let all = watcher::Config::default();
        let tls = watcher::Config::default().fields("type=kubernetes.io/tls");
        Self {
            gateway_classes: reflect(client, all.clone(), changed.clone()),
            gateways: reflect(client, all.clone(), changed.clone()),
            http_routes: reflect(client, all.clone(), changed.clone()),
            reference_grants: reflect(client, all.clone(), changed.clone()),
            services: reflect(client, all.clone(), changed.clone()),
            endpoint_slices: reflect(client, all.clone(), changed.clone()),
            secrets: reflect(client, tls, changed.clone()),
            namespaces: reflect(client, all.clone(), changed.clone()),
            ingresses: reflect(client, all.clone(), changed.clone()),
            ingress_classes: reflect(client, all.clone(), changed.clone()),
            ingress_class_parameters: reflect(client, all.clone(), changed.clone()),
            gateway_parameters: reflect(client, all, changed.clone()),
            changed,
        }
    }

    /// A copy of every cache, as the compiler's input.
    pub fn snapshot(&self) -> Store {
        fn copy<K: Resource + Clone>(s: &Cache<K>) -> Vec<K>
        where
            K::DynamicType: Eq + std::hash::Hash + Clone,
        {
            s.state()
                .iter()
                .filter_map(|o| o.0.as_ref().ok().cloned())
                .collect()
        }
        Store {
            gateway_classes: copy(&self.gateway_classes),
            gateways: copy(&self.gateways),
            http_routes: copy(&self.http_routes),
            reference_grants: copy(&self.reference_grants),
            services: copy(&self.services),
            endpoint_slices: copy(&self.endpoint_slices),
            secrets: copy(&self.secrets),
            namespaces: copy(&self.namespaces),
            ingresses: copy(&self.ingresses),
            ingress_classes: copy(&self.ingress_classes),
            ingress_class_parameters: copy(&self.ingress_class_parameters),
            gateway_parameters: copy(&self.gateway_parameters),
        }
    }
}
