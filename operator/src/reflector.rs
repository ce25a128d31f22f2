//! The controller's view of the cluster: one watch-backed cache per kind the compiler reads,
//! and a signal whenever any of them changes. Kinds whose CRDs are missing (Gateway API not
//! installed yet) keep retrying with backoff and are picked up when they appear.
//!
//! Objects are cached through `DeserializeGuard`: one object these types cannot read (for
//! example an HTTPRoute using an experimental-channel filter) is logged and left out, instead
//! of failing the whole list and stalling every other object of its kind.
//!
//! Nothing is compiled before every cache has listed once (or found its CRD absent): a
//! snapshot built from half-filled caches would send proxies routes without backends and
//! write statuses that are wrong for a moment.

use crate::compile::Store;
use coxswain_api::{
    CoxswainAccessPolicy, CoxswainBackendPolicy, CoxswainGatewayParameters,
    CoxswainIngressClassParameters,
};
use futures::StreamExt;
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
use kube::core::DeserializeGuard;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use tokio::sync::Notify;

/// Readers of every cache.
#[derive(Clone)]
pub struct Reflector {
    gateway_classes: Cache<GatewayClass>,
    gateways: Cache<Gateway>,
    listener_sets: Cache<ListenerSet>,
    http_routes: Cache<HttpRoute>,
    grpc_routes: Cache<GrpcRoute>,
    tls_routes: Cache<TlsRoute>,
    tcp_routes: Cache<TcpRoute>,
    udp_routes: Cache<UdpRoute>,
    backend_tls_policies: Cache<BackendTlsPolicy>,
    config_maps: Cache<ConfigMap>,
    reference_grants: Cache<ReferenceGrant>,
    services: Cache<Service>,
    endpoint_slices: Cache<EndpointSlice>,
    secrets: Cache<Secret>,
    /// Opaque Secrets: htpasswd lists for Basic authentication.
    opaque_secrets: Cache<Secret>,
    namespaces: Cache<Namespace>,
    ingresses: Cache<Ingress>,
    ingress_classes: Cache<IngressClass>,
    ingress_class_parameters: Cache<CoxswainIngressClassParameters>,
    gateway_parameters: Cache<CoxswainGatewayParameters>,
    backend_policies: Cache<CoxswainBackendPolicy>,
    access_policies: Cache<CoxswainAccessPolicy>,
    /// Notified after any cache changed.
    pub changed: Arc<Notify>,
    /// Per kind: has its initial list completed?
    sync: Vec<(String, Arc<AtomicU8>)>,
}

/// Delays between a kind's failed lists or watches: doubling from `RETRY_MIN` to `RETRY_MAX`,
/// back to the start after a success. kube's default backoff reaches 30 s; with it, a kind
/// whose list failed for a moment (as while its CRD is being removed) or whose CRD appears
/// later could hold up compiling, or go unseen, for half a minute.
struct Retry {
    next: std::time::Duration,
}

const RETRY_MIN: std::time::Duration = std::time::Duration::from_millis(250);
const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

impl Default for Retry {
    fn default() -> Self {
        Self { next: RETRY_MIN }
    }
}

impl Iterator for Retry {
    type Item = std::time::Duration;
    fn next(&mut self) -> Option<std::time::Duration> {
        let delay = self.next;
        self.next = (delay * 2).min(RETRY_MAX);
        Some(delay)
    }
}

impl kube::runtime::utils::Backoff for Retry {
    fn reset(&mut self) {
        self.next = RETRY_MIN;
    }
}

const LISTING: u8 = 0;
const SYNCED: u8 = 1;
/// The kind's CRD is not installed: nothing to wait for until it appears.
const ABSENT: u8 = 2;
/// The apiserver refuses the list (RBAC): the controller must not compile without it.
const REFUSED: u8 = 3;

type Cache<K> = reflector::Store<DeserializeGuard<K>>;

fn reflect<K>(
    client: &Client,
    config: watcher::Config,
    changed: Arc<Notify>,
    sync: &mut Vec<(String, Arc<AtomicU8>)>,
) -> Cache<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let api: Api<DeserializeGuard<K>> = Api::all(client.clone());
    let (reader, writer) = reflector::store();
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let stream = reflector(writer, watcher(api, config).backoff(Retry::default()));
    let state = Arc::new(AtomicU8::new(LISTING));
    sync.push((kind.clone(), state.clone()));
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
                    if let watcher::Event::InitDone = &event {
                        state.store(SYNCED, Ordering::Release);
                    }
                    changed.notify_one();
                }
                // Missing CRDs and API hiccups: the watcher backs off and retries.
                Err(e) => {
                    if let watcher::Error::InitialListFailed(kube::Error::Api(status)) = &e {
                        let now = match status.code {
                            404 => ABSENT,
                            401 | 403 => REFUSED,
                            _ => LISTING,
                        };
                        if state.swap(now, Ordering::AcqRel) != now {
                            if now == REFUSED {
                                tracing::warn!(%kind, error = %e, "listing refused; check the controller's RBAC");
                            }
                            changed.notify_one();
                        }
                    }
                    tracing::debug!(%kind, error = %e, "watch error");
                }
            }
        }
    });
    reader
}

impl Reflector {
    /// Starts every watch cluster-wide. Secrets are limited to the types the compiler reads:
    /// TLS key pairs, and Opaque ones (htpasswd lists); service-account tokens, Helm releases
    /// and the like are never cached.
    pub fn start(client: &Client) -> Self {
        let changed = Arc::new(Notify::new());
        let all = watcher::Config::default();
        let tls = watcher::Config::default().fields("type=kubernetes.io/tls");
        let opaque = watcher::Config::default().fields("type=Opaque");
        let mut sync = Vec::new();
        let c = &changed;
        let s = &mut sync;
        Self {
            gateway_classes: reflect(client, all.clone(), c.clone(), s),
            gateways: reflect(client, all.clone(), c.clone(), s),
            listener_sets: reflect(client, all.clone(), c.clone(), s),
            http_routes: reflect(client, all.clone(), c.clone(), s),
            grpc_routes: reflect(client, all.clone(), c.clone(), s),
            tls_routes: reflect(client, all.clone(), c.clone(), s),
            tcp_routes: reflect(client, all.clone(), c.clone(), s),
            udp_routes: reflect(client, all.clone(), c.clone(), s),
            backend_tls_policies: reflect(client, all.clone(), c.clone(), s),
            config_maps: reflect(client, all.clone(), c.clone(), s),
            reference_grants: reflect(client, all.clone(), c.clone(), s),
            services: reflect(client, all.clone(), c.clone(), s),
            endpoint_slices: reflect(client, all.clone(), c.clone(), s),
            secrets: reflect(client, tls, c.clone(), s),
            opaque_secrets: reflect(client, opaque, c.clone(), s),
            namespaces: reflect(client, all.clone(), c.clone(), s),
            ingresses: reflect(client, all.clone(), c.clone(), s),
            ingress_classes: reflect(client, all.clone(), c.clone(), s),
            ingress_class_parameters: reflect(client, all.clone(), c.clone(), s),
            gateway_parameters: reflect(client, all.clone(), c.clone(), s),
            backend_policies: reflect(client, all.clone(), c.clone(), s),
            access_policies: reflect(client, all, c.clone(), s),
            changed,
            sync,
        }
    }

    /// The kinds whose first list has not completed, with why; empty once every cache is
    /// filled or its CRD is known to be absent.
    pub fn unsynced(&self) -> Vec<String> {
        self.sync
            .iter()
            .filter_map(|(kind, state)| match state.load(Ordering::Acquire) {
                SYNCED | ABSENT => None,
                REFUSED => Some(format!("{kind} (list forbidden)")),
                _ => Some(kind.clone()),
            })
            .collect()
    }

    /// A copy of every cache, as the compiler's input.
    pub fn snapshot(&self) -> Store {
        fn copy<K: Resource + Clone>(s: &Cache<K>) -> Vec<Arc<K>>
        where
            K::DynamicType: Eq + std::hash::Hash + Clone,
        {
            s.state()
                .iter()
                .filter_map(|o| o.0.as_ref().ok().map(|k| Arc::new(k.clone())))
                .collect()
        }
        Store {
            gateway_classes: copy(&self.gateway_classes),
            gateways: copy(&self.gateways),
            listener_sets: copy(&self.listener_sets),
            http_routes: copy(&self.http_routes),
            grpc_routes: copy(&self.grpc_routes),
            tls_routes: copy(&self.tls_routes),
            tcp_routes: copy(&self.tcp_routes),
            udp_routes: copy(&self.udp_routes),
            backend_tls_policies: copy(&self.backend_tls_policies),
            config_maps: copy(&self.config_maps),
            reference_grants: copy(&self.reference_grants),
            services: copy(&self.services),
            endpoint_slices: copy(&self.endpoint_slices),
            secrets: copy(&self.secrets)
                .into_iter()
                .chain(copy(&self.opaque_secrets))
                .collect(),
            namespaces: copy(&self.namespaces),
            ingresses: copy(&self.ingresses),
            ingress_classes: copy(&self.ingress_classes),
            ingress_class_parameters: copy(&self.ingress_class_parameters),
            gateway_parameters: copy(&self.gateway_parameters),
            backend_policies: copy(&self.backend_policies),
            access_policies: copy(&self.access_policies),
            // Not a watched kind: the controller adds what its JWKS fetcher holds.
            remote_jwks: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::utils::Backoff;
    use std::time::Duration;

    #[test]
    fn watch_retries_double_up_to_five_seconds_and_start_over_after_a_success() {
        let mut retry = Retry::default();
        let delays: Vec<Duration> = retry.by_ref().take(7).collect();
        let ms = |v: u64| Duration::from_millis(v);
        assert_eq!(
            delays,
            [
                ms(250),
                ms(500),
                ms(1000),
                ms(2000),
                ms(4000),
                ms(5000),
                ms(5000)
            ]
        );
        retry.reset();
        assert_eq!(retry.next(), Some(ms(250)));
    }
}
