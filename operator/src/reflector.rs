//! The controller's view of the cluster: one watch-backed cache per kind the compiler reads,
//! and a signal whenever any of them changes. Kinds whose CRDs are missing (Gateway API not
//! installed yet) keep retrying with backoff and are picked up when they appear.

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
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::Arc;
use tokio::sync::Notify;

/// Readers of every cache.
#[derive(Clone)]
pub struct Reflector {
    gateway_classes: reflector::Store<GatewayClass>,
    gateways: reflector::Store<Gateway>,
    http_routes: reflector::Store<HttpRoute>,
    reference_grants: reflector::Store<ReferenceGrant>,
    services: reflector::Store<Service>,
    endpoint_slices: reflector::Store<EndpointSlice>,
    secrets: reflector::Store<Secret>,
    namespaces: reflector::Store<Namespace>,
    ingresses: reflector::Store<Ingress>,
    ingress_classes: reflector::Store<IngressClass>,
    ingress_class_parameters: reflector::Store<CoxswainIngressClassParameters>,
    gateway_parameters: reflector::Store<CoxswainGatewayParameters>,
    /// Notified after any cache changed.
    pub changed: Arc<Notify>,
}

fn reflect<K>(api: Api<K>, config: watcher::Config, changed: Arc<Notify>) -> reflector::Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let stream = reflector(writer, watcher(api, config).default_backoff());
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => changed.notify_one(),
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
        let c = || client.clone();
        Self {
            gateway_classes: reflect(Api::all(c()), all.clone(), changed.clone()),
            gateways: reflect(Api::all(c()), all.clone(), changed.clone()),
            http_routes: reflect(Api::all(c()), all.clone(), changed.clone()),
            reference_grants: reflect(Api::all(c()), all.clone(), changed.clone()),
            services: reflect(Api::all(c()), all.clone(), changed.clone()),
            endpoint_slices: reflect(Api::all(c()), all.clone(), changed.clone()),
            secrets: reflect(
                Api::all(c()),
                watcher::Config::default().fields("type=kubernetes.io/tls"),
                changed.clone(),
            ),
            namespaces: reflect(Api::all(c()), all.clone(), changed.clone()),
            ingresses: reflect(Api::all(c()), all.clone(), changed.clone()),
            ingress_classes: reflect(Api::all(c()), all.clone(), changed.clone()),
            ingress_class_parameters: reflect(Api::all(c()), all.clone(), changed.clone()),
            gateway_parameters: reflect(Api::all(c()), all, changed.clone()),
            changed,
        }
    }

    /// A copy of every cache, as the compiler's input.
    pub fn snapshot(&self) -> Store {
        fn copy<K: Resource + Clone>(s: &reflector::Store<K>) -> Vec<K>
        where
            K::DynamicType: Eq + std::hash::Hash + Clone,
        {
            s.state().iter().map(|o| (**o).clone()).collect()
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
