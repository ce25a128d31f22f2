//! The controller's view of the cluster: one watch-backed cache per kind the compiler reads,
//! and a signal whenever any of them changes. Kinds whose CRDs are missing (Gateway API not
//! installed yet) keep retrying with backoff and are picked up when they appear.
//!
//! Objects are cached through `DeserializeGuard`: one object these types cannot read (for
//! example an HTTPRoute using an experimental-channel filter) is logged and left out, instead
//! of failing the whole list and stalling every other object of its kind.
//!
//! Each cache keeps its objects behind `Arc`s and a pass's snapshot shares them: with 20,000
//! routes, Services and EndpointSlices a deep copy per pass would cost tens of megabytes and
//! milliseconds. kube's own `reflector::Store<DeserializeGuard<K>>` holds `Arc<Result<K, _>>`,
//! from which no `Arc<K>` can be had without copying K; hence the small map here.
//!
//! Nothing is compiled before every cache has listed once (or found its CRD absent): a
//! snapshot built from half-filled caches would send proxies routes without backends and
//! write statuses that are wrong for a moment.

use crate::compile::{self, Store};
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
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::DeserializeGuard;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
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
    /// Notified after a cache changed in what the compiler reads.
    pub changed: Arc<Notify>,
    /// Notified after an object's status alone changed (which compiles nothing): a status
    /// write that conflicted with another writer's is redone from the newer copy.
    pub status_changed: Arc<Notify>,
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

/// One kind's objects, written by its watch task and read by `Reflector::snapshot`.
type Cache<K> = Arc<RwLock<Objects<K>>>;

/// An object's identity within its kind: namespace ("" when cluster-scoped) and name.
type Key = (String, String);

fn key(meta: &ObjectMeta) -> Key {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// The objects of one kind that deserialized, by namespace and name, each with the list it was
/// last seen in.
///
/// A relist updates the map in place and drops what it did not see once it is done, rather
/// than filling a second map and swapping it in as kube's `Store` does: a kind is then never
/// held twice. A pass during a relist sees some objects already relisted and some not, each
/// a version the apiserver had, as it would while ordinary watch events arrive.
struct Objects<K> {
    by_key: BTreeMap<Key, (Arc<K>, u64)>,
    /// The same objects in the same order, as the persistent vector a pass gets a copy of in
    /// constant time ([`Objects::shared`]).
    sorted: compile::store::Objects<K>,
    /// Counts the lists started; objects listed or applied since carry its value.
    list: u64,
}

impl<K> Default for Objects<K> {
    fn default() -> Self {
        Self {
            by_key: BTreeMap::new(),
            sorted: Default::default(),
            list: 0,
        }
    }
}

/// When a kind's change calls for a compile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// Any change.
    Always,
    /// Not when only the status (or the resourceVersion) changed. For kinds whose status
    /// subresource this controller writes and whose spec bumps `metadata.generation`: the
    /// compiler reads no status, so its own status writes would only compile everything again
    /// for the same result, doubling the passes while routes are created.
    UnlessOnlyStatus,
}

/// What one watch event did to a cache.
struct Applied {
    /// An object that could not be read, for the caller to report: it is dropped from the map,
    /// so no older version of it stays compiled.
    invalid: Option<InvalidObject>,
    /// Whether the compiler's input changed.
    changed: bool,
}

/// Whether `new` differs from `old` in its status and resourceVersion at most: the same object
/// (uid), the same spec (generation, which the apiserver bumps on every spec change of these
/// kinds) and the same metadata the compiler reads.
fn only_status_changed(old: &ObjectMeta, new: &ObjectMeta) -> bool {
    old.uid.is_some()
        && old.uid == new.uid
        && old.generation.is_some()
        && old.generation == new.generation
        && old.labels == new.labels
        && old.annotations == new.annotations
        && old.deletion_timestamp == new.deletion_timestamp
        && old.finalizers == new.finalizers
        && old.owner_references == new.owner_references
}

impl<K: Resource> Objects<K> {
    /// Folds in one watch event.
    fn apply(&mut self, event: watcher::Event<DeserializeGuard<K>>, wake: Wake) -> Applied {
        let changed = |invalid| Applied {
            invalid,
            changed: true,
        };
        match event {
            watcher::Event::Init => {
                self.list += 1;
                changed(None)
            }
            watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => match obj.0 {
                Ok(k) => {
                    let key = key(k.meta());
                    let same_input = wake == Wake::UnlessOnlyStatus
                        && self
                            .by_key
                            .get(&key)
                            .is_some_and(|(old, _)| only_status_changed(old.meta(), k.meta()));
                    let k = Arc::new(k);
                    match self.place(&key) {
                        Ok(i) => {
                            self.sorted.set(i, Arc::clone(&k));
                        }
                        Err(i) => self.sorted.insert(i, Arc::clone(&k)),
                    }
                    self.by_key.insert(key, (k, self.list));
                    Applied {
                        invalid: None,
                        changed: !same_input,
                    }
                }
                Err(invalid) => {
                    self.remove(&key(&invalid.metadata));
                    changed(Some(invalid))
                }
            },
            watcher::Event::Delete(obj) => {
                self.remove(&key(obj.meta()));
                changed(None)
            }
            // Whatever the list did not return was deleted while the watch was down.
            watcher::Event::InitDone => {
                let list = self.list;
                self.by_key.retain(|_, (_, seen)| *seen == list);
                self.sorted = self.by_key.values().map(|(k, _)| Arc::clone(k)).collect();
                changed(None)
            }
        }
    }

    fn remove(&mut self, key: &Key) {
        if self.by_key.remove(key).is_some()
            && let Ok(i) = self.place(key)
        {
            self.sorted.remove(i);
        }
    }

    /// Where `key` is in `sorted` (Err: where it would go).
    fn place(&self, key: &Key) -> Result<usize, usize> {
        self.sorted.binary_search_by(|o| {
            let m = o.meta();
            (
                m.namespace.as_deref().unwrap_or_default(),
                m.name.as_deref().unwrap_or_default(),
            )
                .cmp(&(key.0.as_str(), key.1.as_str()))
        })
    }

    /// Every object, shared, in namespace/name order: a copy in constant time.
    fn shared(&self) -> compile::store::Objects<K> {
        self.sorted.clone()
    }
}

/// The lock is only held for map operations, which leave the map whole even if one panics.
fn read<K>(cache: &Cache<K>) -> std::sync::RwLockReadGuard<'_, Objects<K>> {
    cache.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<K>(cache: &Cache<K>) -> std::sync::RwLockWriteGuard<'_, Objects<K>> {
    cache.write().unwrap_or_else(PoisonError::into_inner)
}

fn reflect<K>(
    client: &Client,
    config: watcher::Config,
    (wake, meta): (Wake, Meta),
    (changed, status_changed): (Arc<Notify>, Arc<Notify>),
    sync: &mut Vec<(String, Arc<AtomicU8>)>,
) -> Cache<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let api: Api<DeserializeGuard<K>> = Api::all(client.clone());
    let cache: Cache<K> = Default::default();
    let objects = cache.clone();
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let stream = watcher(api, config).backoff(Retry::default());
    let state = Arc::new(AtomicU8::new(LISTING));
    sync.push((kind.clone(), state.clone()));
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => {
                    let listed = matches!(event, watcher::Event::InitDone);
                    let event = event.modify(|obj| strip_unread(obj, meta));
                    let Applied {
                        invalid,
                        changed: compile,
                    } = write(&objects).apply(event, wake);
                    if let Some(invalid) = invalid {
                        tracing::warn!(
                            %kind,
                            namespace = invalid.metadata.namespace.as_deref().unwrap_or_default(),
                            name = invalid.metadata.name.as_deref().unwrap_or_default(),
                            error = %invalid,
                            "object skipped: it does not match the types this controller reads"
                        );
                    }
                    if listed {
                        state.store(SYNCED, Ordering::Release);
                    }
                    if compile {
                        changed.notify_one();
                    } else {
                        status_changed.notify_one();
                    }
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
    cache
}

/// kubectl's copy of the last object it applied: as large as the object, never compiled.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Which metadata of a kind is cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Meta {
    /// Labels and annotations: the compiler reads them (selected Namespaces, Services' and
    /// EndpointSlices' labels, Ingresses' annotations), or the kind is one of few objects.
    Labelled,
    /// Neither labels nor annotations: no compiler module, status or event reads them, and
    /// these are the kinds a cluster holds by the thousand (routes), each labelled and
    /// annotated by whatever tool applied it. A BTreeMap of a single label costs about 600
    /// bytes of a 20,000-route cache's 2,900 per route.
    Unlabelled,
}

/// Drops what the compiler never reads and objects carry plenty of, field managers and
/// kubectl's last applied copy (and, for `Meta::Unlabelled` kinds, every label and
/// annotation), before caching: the cache does not pay for them. A label or annotation edit
/// on such a kind then changes nothing the compiler sees, and wakes no pass.
fn strip_unread<K: Resource>(obj: &mut DeserializeGuard<K>, keep: Meta) {
    if let Ok(k) = &mut obj.0 {
        let meta = k.meta_mut();
        meta.managed_fields = None;
        if keep == Meta::Unlabelled {
            meta.labels = None;
            meta.annotations = None;
        }
        if let Some(annotations) = &mut meta.annotations {
            annotations.remove(LAST_APPLIED);
        }
    }
}

impl Reflector {
    /// Starts every watch cluster-wide. Secrets are limited to the types the compiler reads:
    /// TLS key pairs, and Opaque ones (htpasswd lists); service-account tokens, Helm releases
    /// and the like are never cached.
    pub fn start(client: &Client) -> Self {
        let changed = Arc::new(Notify::new());
        let status_changed = Arc::new(Notify::new());
        let all = watcher::Config::default();
        let tls = watcher::Config::default().fields("type=kubernetes.io/tls");
        let opaque = watcher::Config::default().fields("type=Opaque");
        let mut sync = Vec::new();
        let c = &(changed.clone(), status_changed.clone());
        let s = &mut sync;
        // Routes are cached without labels and annotations; every other kind with them.
        let (ask, unl) = (
            (Wake::UnlessOnlyStatus, Meta::Labelled),
            (Wake::UnlessOnlyStatus, Meta::Unlabelled),
        );
        let always = (Wake::Always, Meta::Labelled);
        Self {
            gateway_classes: reflect(client, all.clone(), ask, c.clone(), s),
            gateways: reflect(client, all.clone(), ask, c.clone(), s),
            listener_sets: reflect(client, all.clone(), ask, c.clone(), s),
            http_routes: reflect(client, all.clone(), unl, c.clone(), s),
            grpc_routes: reflect(client, all.clone(), unl, c.clone(), s),
            tls_routes: reflect(client, all.clone(), unl, c.clone(), s),
            tcp_routes: reflect(client, all.clone(), unl, c.clone(), s),
            udp_routes: reflect(client, all.clone(), unl, c.clone(), s),
            backend_tls_policies: reflect(client, all.clone(), ask, c.clone(), s),
            config_maps: reflect(client, all.clone(), always, c.clone(), s),
            reference_grants: reflect(client, all.clone(), always, c.clone(), s),
            services: reflect(client, all.clone(), always, c.clone(), s),
            endpoint_slices: reflect(client, all.clone(), always, c.clone(), s),
            secrets: reflect(client, tls, always, c.clone(), s),
            opaque_secrets: reflect(client, opaque, always, c.clone(), s),
            namespaces: reflect(client, all.clone(), always, c.clone(), s),
            ingresses: reflect(client, all.clone(), ask, c.clone(), s),
            ingress_classes: reflect(client, all.clone(), always, c.clone(), s),
            ingress_class_parameters: reflect(client, all.clone(), ask, c.clone(), s),
            gateway_parameters: reflect(client, all.clone(), ask, c.clone(), s),
            backend_policies: reflect(client, all.clone(), ask, c.clone(), s),
            access_policies: reflect(client, all, ask, c.clone(), s),
            changed,
            status_changed,
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

    /// `store` with each object whose status alone has changed since replaced by the cached
    /// copy: what the status writer compares its decisions with. A pass's own status writes
    /// compile nothing ([`Wake::UnlessOnlyStatus`]), so without this the next write would
    /// compare against the copy from before them, write again and conflict. Objects whose
    /// spec changed keep the pass's copy: their decisions are that pass's, and so must be the
    /// generation they report.
    pub fn with_current_status(&self, store: &Store) -> Store {
        fn newer<K: Resource>(
            cache: &Cache<K>,
            objects: &compile::store::Objects<K>,
        ) -> compile::store::Objects<K> {
            let cache = read(cache);
            objects
                .iter()
                .map(|object| match cache.by_key.get(&key(object.meta())) {
                    Some((cached, _)) if only_status_changed(object.meta(), cached.meta()) => {
                        Arc::clone(cached)
                    }
                    _ => Arc::clone(object),
                })
                .collect()
        }
        Store {
            gateway_classes: newer(&self.gateway_classes, &store.gateway_classes),
            gateways: newer(&self.gateways, &store.gateways),
            listener_sets: newer(&self.listener_sets, &store.listener_sets),
            http_routes: newer(&self.http_routes, &store.http_routes),
            grpc_routes: newer(&self.grpc_routes, &store.grpc_routes),
            tls_routes: newer(&self.tls_routes, &store.tls_routes),
            tcp_routes: newer(&self.tcp_routes, &store.tcp_routes),
            udp_routes: newer(&self.udp_routes, &store.udp_routes),
            backend_tls_policies: newer(&self.backend_tls_policies, &store.backend_tls_policies),
            ingresses: newer(&self.ingresses, &store.ingresses),
            ingress_class_parameters: newer(
                &self.ingress_class_parameters,
                &store.ingress_class_parameters,
            ),
            gateway_parameters: newer(&self.gateway_parameters, &store.gateway_parameters),
            backend_policies: newer(&self.backend_policies, &store.backend_policies),
            access_policies: newer(&self.access_policies, &store.access_policies),
            ..store.clone()
        }
    }

    /// Every cache's objects, shared, as the compiler's input.
    pub fn snapshot(&self) -> Store {
        fn copy<K: Resource>(cache: &Cache<K>) -> compile::store::Objects<K> {
            read(cache).shared()
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
            secrets: {
                let mut secrets = copy(&self.secrets);
                secrets.append(copy(&self.opaque_secrets));
                secrets
            },
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
    use watcher::Event;

    fn map(namespace: &str, name: &str, value: &str) -> DeserializeGuard<ConfigMap> {
        DeserializeGuard(Ok(ConfigMap {
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some([("v".to_string(), value.to_string())].into()),
            ..Default::default()
        }))
    }

    fn unreadable(namespace: &str, name: &str) -> DeserializeGuard<ConfigMap> {
        DeserializeGuard(Err(InvalidObject {
            error: "data: invalid type".into(),
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                ..Default::default()
            },
        }))
    }

    /// namespace/name=value of every cached object, in snapshot order.
    fn contents(objects: &Objects<ConfigMap>) -> Vec<String> {
        objects
            .shared()
            .iter()
            .map(|m| {
                let value = m.data.as_ref().and_then(|d| d.get("v")).cloned();
                format!(
                    "{}/{}={}",
                    m.metadata.namespace.as_deref().unwrap_or_default(),
                    m.metadata.name.as_deref().unwrap_or_default(),
                    value.unwrap_or_default()
                )
            })
            .collect()
    }

    #[test]
    fn applies_insert_and_replace_by_namespace_and_name_and_deletes_remove() {
        let mut objects = Objects::default();
        for event in [
            Event::Apply(map("b", "x", "1")),
            Event::Apply(map("a", "x", "1")),
            Event::Apply(map("a", "y", "1")),
            Event::Apply(map("a", "x", "2")),
        ] {
            assert!(objects.apply(event, Wake::Always).invalid.is_none());
        }
        assert_eq!(contents(&objects), ["a/x=2", "a/y=1", "b/x=1"]);
        // A delete carries the last state the watch saw; only its identity matters.
        objects.apply(Event::Delete(map("a", "y", "0")), Wake::Always);
        objects.apply(Event::Delete(map("c", "z", "0")), Wake::Always);
        assert_eq!(contents(&objects), ["a/x=2", "b/x=1"]);
    }

    /// An HTTPRoute-like object: uid, generation, labels.
    fn versioned(
        generation: i64,
        uid: &str,
        label: &str,
        value: &str,
    ) -> DeserializeGuard<ConfigMap> {
        let mut obj = map("a", "r", value);
        if let Ok(m) = &mut obj.0 {
            m.metadata.uid = Some(uid.into());
            m.metadata.generation = Some(generation);
            m.metadata.labels = Some([("l".to_string(), label.to_string())].into());
        }
        obj
    }

    #[test]
    fn a_status_only_change_is_cached_but_compiles_nothing_where_asked() {
        let mut objects = Objects::default();
        let wake = Wake::UnlessOnlyStatus;
        assert!(
            objects
                .apply(Event::Apply(versioned(1, "u1", "x", "1")), wake)
                .changed
        );
        // Same uid, generation and metadata: only status (here standing in as data) changed.
        let applied = objects.apply(Event::Apply(versioned(1, "u1", "x", "2")), wake);
        assert!(!applied.changed);
        assert_eq!(
            contents(&objects),
            ["a/r=2"],
            "the newer copy is cached all the same"
        );
        for (event, why) in [
            (
                versioned(2, "u1", "x", "3"),
                "a spec change bumps the generation",
            ),
            (
                versioned(2, "u1", "y", "3"),
                "labels are read by the compiler",
            ),
            (
                versioned(2, "u2", "y", "3"),
                "a new object under the same name",
            ),
        ] {
            assert!(objects.apply(Event::Apply(event), wake).changed, "{why}");
        }
        // Objects without a generation (core kinds) always count as changed.
        let mut objects = Objects::default();
        objects.apply(Event::Apply(map("a", "x", "1")), wake);
        assert!(
            objects
                .apply(Event::Apply(map("a", "x", "2")), wake)
                .changed
        );
        // Kinds that always wake do so for status-only changes too.
        let mut objects = Objects::default();
        objects.apply(Event::Apply(versioned(1, "u1", "x", "1")), Wake::Always);
        assert!(
            objects
                .apply(Event::Apply(versioned(1, "u1", "x", "2")), Wake::Always)
                .changed
        );
        assert!(
            objects
                .apply(Event::Delete(versioned(1, "u1", "x", "2")), wake)
                .changed
        );
    }

    proptest::proptest! {
        /// The persistent vector a pass copies lists what the map holds, in its order,
        /// through applies, replacements, unreadable objects, deletes and relists.
        #[test]
        fn the_shared_vector_follows_the_map(
            ops in proptest::collection::vec((0u8..6, 0usize..2, 0usize..4, 0u8..3), 1..60),
        ) {
            let mut objects = Objects::default();
            for (op, ns, name, value) in ops {
                let (ns, name) = (["a", "b"][ns], ["w", "x", "y", "z"][name]);
                let event = match op {
                    0 | 1 => Event::Apply(map(ns, name, &value.to_string())),
                    2 => Event::Delete(map(ns, name, "")),
                    3 => Event::Apply(unreadable(ns, name)),
                    4 => Event::Init,
                    _ => if value == 0 {
                        Event::InitDone
                    } else {
                        Event::InitApply(map(ns, name, &value.to_string()))
                    },
                };
                objects.apply(event, Wake::Always);
                let in_map: Vec<*const ConfigMap> =
                    objects.by_key.values().map(|(k, _)| Arc::as_ptr(k)).collect();
                let shared: Vec<*const ConfigMap> =
                    objects.shared().iter().map(Arc::as_ptr).collect();
                proptest::prop_assert_eq!(shared, in_map);
            }
        }
    }

    #[test]
    fn snapshots_share_the_cached_objects() {
        let mut objects = Objects::default();
        objects.apply(Event::Apply(map("a", "x", "1")), Wake::Always);
        let (first, second) = (objects.shared(), objects.shared());
        assert!(Arc::ptr_eq(&first[0], &second[0]));
        // A replacement is a new object; the pass holding the old one keeps it.
        objects.apply(Event::Apply(map("a", "x", "2")), Wake::Always);
        assert!(!Arc::ptr_eq(&first[0], &objects.shared()[0]));
        assert_eq!(first[0].data.as_ref().map(|d| d["v"].as_str()), Some("1"));
    }

    #[test]
    fn a_relist_updates_in_place_and_drops_what_it_did_not_see_when_done() {
        let mut objects = Objects::default();
        objects.apply(Event::Init, Wake::Always);
        objects.apply(Event::InitApply(map("a", "x", "1")), Wake::Always);
        objects.apply(Event::InitApply(map("a", "y", "1")), Wake::Always);
        objects.apply(Event::InitDone, Wake::Always);
        assert_eq!(contents(&objects), ["a/x=1", "a/y=1"]);
        objects.apply(Event::Apply(map("a", "z", "1")), Wake::Always);

        // The watch restarts: a/y and a/z were deleted meanwhile, a/x changed, b/w appeared.
        objects.apply(Event::Init, Wake::Always);
        objects.apply(Event::InitApply(map("a", "x", "2")), Wake::Always);
        objects.apply(Event::InitApply(map("b", "w", "1")), Wake::Always);
        assert_eq!(
            contents(&objects),
            ["a/x=2", "a/y=1", "a/z=1", "b/w=1"],
            "until the list is done, what it has not returned yet may still be coming"
        );
        objects.apply(Event::InitDone, Wake::Always);
        assert_eq!(contents(&objects), ["a/x=2", "b/w=1"]);
    }

    #[test]
    fn an_unreadable_update_removes_the_older_readable_copy() {
        let mut objects = Objects::default();
        objects.apply(Event::Apply(map("a", "x", "1")), Wake::Always);
        objects.apply(Event::Apply(map("a", "y", "1")), Wake::Always);
        let invalid = objects
            .apply(Event::Apply(unreadable("a", "x")), Wake::Always)
            .invalid;
        assert_eq!(
            invalid.map(|i| (i.metadata.name, i.error)),
            Some((Some("x".into()), "data: invalid type".into()))
        );
        assert_eq!(contents(&objects), ["a/y=1"]);
        // Also during a relist: the unreadable object is not kept until the list is done.
        objects.apply(Event::Init, Wake::Always);
        assert!(
            objects
                .apply(Event::InitApply(unreadable("a", "y")), Wake::Always)
                .invalid
                .is_some()
        );
        assert!(contents(&objects).is_empty());
        objects.apply(Event::InitDone, Wake::Always);
        assert!(contents(&objects).is_empty());
    }

    #[test]
    fn field_managers_and_the_last_applied_copy_are_not_cached() {
        let annotated = || {
            let mut obj = map("a", "x", "1");
            if let Ok(m) = &mut obj.0 {
                m.metadata.managed_fields = Some(vec![Default::default()]);
                m.metadata.labels = Some([("app".to_string(), "x".to_string())].into());
                m.metadata.annotations = Some(
                    [
                        (LAST_APPLIED.to_string(), "{...}".to_string()),
                        ("keep".to_string(), "me".to_string()),
                    ]
                    .into(),
                );
            }
            obj
        };
        let mut obj = annotated();
        strip_unread(&mut obj, Meta::Labelled);
        let m = obj.0.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.metadata.managed_fields, None);
        assert_eq!(
            m.metadata.annotations,
            Some([("keep".to_string(), "me".to_string())].into())
        );
        assert_eq!(
            m.metadata.labels,
            Some([("app".to_string(), "x".to_string())].into())
        );
        // Routes: no labels or annotations at all.
        let mut obj = annotated();
        strip_unread(&mut obj, Meta::Unlabelled);
        let m = obj.0.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (
                m.metadata.managed_fields,
                m.metadata.labels,
                m.metadata.annotations
            ),
            (None, None, None)
        );
        assert_eq!(m.metadata.name.as_deref(), Some("x"), "the identity stays");
    }

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
