//! What the incremental compiler ([`super::incremental`]) keeps of each route between passes,
//! and what a route's compilation read ([`Read`]), which tells whether the kept part still
//! holds. A leaf below the route compiler, which fills it, and the backend resolution, which
//! records reads into it.

use super::entries::Entry;
use super::refs::{self, GATEWAY_GROUP, Index};
use super::route::{RouteKind, Stored};
use super::status::{ObjectKey, Parents, RouteParentStatus};
use super::store::{Objects, Store};
use super::totals::{Contribution, Totals};
use coxswain_api::snapshot as snap;
use gateway_api::apis::standard::backendtlspolicies::BackendTlsPolicy;
use gateway_api::apis::standard::referencegrants::ReferenceGrant;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::any::Any;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Weak};

/// What one route contributes to a pass.
#[derive(Debug, Clone, Default)]
pub struct RoutePart {
    pub entries: Vec<Arc<Entry>>,
    /// `status.parents` this controller owns.
    pub parents: Vec<RouteParentStatus>,
    /// One per listener the route is attached to (see [`RouteOutput::attached`]).
    pub attached: Vec<(ObjectKey, Option<ObjectKey>, String)>,
    pub service_gateways: Vec<((String, String), ObjectKey)>,
    pub clusters: Vec<snap::Cluster>,
}

/// Each route's compiled part, kept between passes by an incremental compile, and what the
/// parts add up to.
#[derive(Debug, Default)]
pub struct RouteMemo {
    /// The kept routes (None: a free slot). `index` finds one by kind and key: a table of
    /// slots, hashed and compared by the key their route holds.
    slots: Vec<Option<Kept>>,
    free: Vec<usize>,
    index: hashbrown::HashTable<usize>,
    hasher: std::hash::RandomState,
    /// The last pass's routes in the order it met them: (the stored object's address, its
    /// slot). The next pass meets an unchanged route at the same place, and knows it by the
    /// address alone: no key read, copied or hashed.
    pub(super) order: Vec<(usize, usize)>,
    /// What the kept parts add up to.
    pub totals: Totals,
    /// Clusters of kept parts, one copy per name and content: ten routes to one Service share
    /// its cluster instead of keeping ten.
    clusters: HashMap<String, Arc<snap::Cluster>>,
    /// Reads, listeners attached to and Services sent to, one copy each for the routes that
    /// have the same.
    pub(super) reads: Pool<Vec<Read>>,
    attached: Pool<Vec<Attachment>>,
    service_gateways: Pool<Vec<ServiceGateway>>,
    /// The (Gateway, listener) of entries ([`Entry::parent`]): one copy per listener.
    entry_parents: Pool<(ObjectKey, String)>,
    /// Status parents: routes attached alike with the same generation have the same.
    parents: Pool<[RouteParentStatus]>,
    /// Passes made: a route not seen in the latest is gone.
    pub(super) pass: u64,
    /// Routes compiled and reused over the memo's life: what the passes saved.
    pub compiled: u64,
    pub reused: u64,
    /// Routes compiled since the kept parts were last copied together ([`Self::tidy`]).
    compiled_since_compact: usize,
    /// Whether the kept entries are those the last pass gave: false after a clear or a copy,
    /// when the next pass's changes would not say what changed since.
    pub(super) continuous: bool,
    /// The last pass's copy of what reads read ([`ReadInputs`]).
    pub(super) read_inputs: Option<ReadInputs>,
}

/// The store's lists a route's reads look at (Services, EndpointSlices, ReferenceGrants, and
/// what BackendTLSPolicies resolve: the policies, ConfigMaps, Secrets). The lists are
/// persistent vectors, shared while unchanged: when each is the last pass's, every read gives
/// what it gave then, and no read needs looking up again.
#[derive(Debug)]
pub struct ReadInputs {
    services: Objects<Service>,
    endpoint_slices: Objects<EndpointSlice>,
    reference_grants: Objects<ReferenceGrant>,
    backend_tls_policies: Objects<BackendTlsPolicy>,
    config_maps: Objects<ConfigMap>,
    secrets: Objects<Secret>,
}

impl ReadInputs {
    pub fn of(store: &Store) -> Self {
        Self {
            services: store.services.clone(),
            endpoint_slices: store.endpoint_slices.clone(),
            reference_grants: store.reference_grants.clone(),
            backend_tls_policies: store.backend_tls_policies.clone(),
            config_maps: store.config_maps.clone(),
            secrets: store.secrets.clone(),
        }
    }

    /// Whether `store` holds these very lists.
    pub fn same(&self, store: &Store) -> bool {
        same_list(&self.services, &store.services)
            && same_list(&self.endpoint_slices, &store.endpoint_slices)
            && same_list(&self.reference_grants, &store.reference_grants)
            && same_list(&self.backend_tls_policies, &store.backend_tls_policies)
            && same_list(&self.config_maps, &store.config_maps)
            && same_list(&self.secrets, &store.secrets)
    }
}

/// Whether two lists are one: the same tree, or (a list so short the vector holds it inline,
/// where there is no tree to compare) the same objects.
fn same_list<K>(a: &Objects<K>, b: &Objects<K>) -> bool {
    if a.is_inline() && b.is_inline() {
        return a.len() == b.len() && a.iter().zip(b).all(|(a, b)| Arc::ptr_eq(a, b));
    }
    a.ptr_eq(b)
}

/// The fewest compiled routes worth copying the memo for; tests copy at every chance, so the
/// equality tests run over copied parts too.
const COMPACT_AT_LEAST: usize = if cfg!(test) { 1 } else { 1_000 };

/// A route's part as the memo keeps it: exactly sized, clusters shared.
#[derive(Debug)]
pub struct KeptPart {
    pub entries: Box<[Arc<Entry>]>,
    pub parents: Parents,
    pub attached: Arc<Vec<Attachment>>,
    pub service_gateways: Arc<Vec<ServiceGateway>>,
    pub clusters: Box<[Arc<snap::Cluster>]>,
}

pub use super::totals::{Attachment, ServiceGateway};

impl KeptPart {
    /// What the part counts for in the totals.
    pub fn contribution(&self) -> Contribution<'_> {
        Contribution {
            parents: &self.parents,
            attached: &self.attached,
            service_gateways: &self.service_gateways,
            clusters: &self.clusters,
        }
    }

    /// The same part in new allocations.
    fn copy(&self) -> Self {
        Self {
            entries: self
                .entries
                .iter()
                .map(|e| Arc::new((**e).clone()))
                .collect(),
            parents: Arc::clone(&self.parents),
            attached: Arc::clone(&self.attached),
            service_gateways: Arc::clone(&self.service_gateways),
            clusters: self.clusters.clone(),
        }
    }
}

impl RouteMemo {
    pub fn clear(&mut self) {
        self.slots.clear();
        self.free.clear();
        self.index.clear();
        self.order.clear();
        self.totals = Totals::default();
        self.continuous = false;
        self.read_inputs = None;
        self.clusters.clear();
        self.reads.clear();
        self.attached.clear();
        self.service_gateways.clear();
        self.entry_parents.clear();
        self.parents.clear();
    }

    pub(super) fn keep(&mut self, part: RoutePart) -> KeptPart {
        self.compiled_since_compact += 1;
        let RoutePart {
            entries,
            mut parents,
            mut attached,
            mut service_gateways,
            clusters,
        } = part;
        for p in &mut parents {
            p.conditions.shrink_to_fit();
        }
        attached.shrink_to_fit();
        service_gateways.shrink_to_fit();
        let clusters = clusters
            .into_iter()
            .map(|c| match self.clusters.get(&c.name) {
                Some(kept) if **kept == c => Arc::clone(kept),
                _ => {
                    let c = Arc::new(c);
                    self.clusters.insert(c.name.clone(), Arc::clone(&c));
                    c
                }
            })
            .collect();
        let entries: Box<[Arc<Entry>]> = entries
            .into_iter()
            .enumerate()
            .map(|(i, mut e)| {
                let entry = Arc::make_mut(&mut e);
                if let Some(parent) = &entry.parent {
                    entry.parent = Some(self.entry_parents.share((**parent).clone()));
                }
                entry.ordinal = u32::try_from(i).unwrap_or(u32::MAX);
                e
            })
            .collect();
        KeptPart {
            entries,
            parents: self.parents.share_slice(parents),
            attached: self.attached.share(attached),
            service_gateways: self.service_gateways.share(service_gateways),
            clusters,
        }
    }

    /// After a pass: drops clusters no kept part holds, and copies the kept parts together
    /// once as many routes were compiled since the last copy as are kept. A pass's own
    /// allocations come and go between those of the parts it compiles, which then pin
    /// half-empty pages: at 20,000 routes compiled in one pass the kept parts took 57 MiB
    /// and pinned 50 MiB more. Copying costs a few of these passes, once per doubling.
    pub(super) fn tidy(&mut self) {
        if self.compiled_since_compact == 0 {
            return;
        }
        self.clusters.retain(|_, c| Arc::strong_count(c) > 1);
        self.reads.tidy();
        self.attached.tidy();
        self.service_gateways.tidy();
        self.entry_parents.tidy();
        self.parents.tidy();
        if self.compiled_since_compact < self.len().max(COMPACT_AT_LEAST) {
            return;
        }
        self.compiled_since_compact = 0;
        self.continuous = false;
        for kept in self.slots.iter_mut().flatten() {
            if let Some(part) = &mut kept.part {
                *part = part.copy();
            }
        }
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub(super) fn slot(&self, slot: usize) -> Option<&Kept> {
        self.slots.get(slot).and_then(Option::as_ref)
    }

    pub(super) fn slot_mut(&mut self, slot: usize) -> Option<&mut Kept> {
        self.slots.get_mut(slot).and_then(Option::as_mut)
    }

    pub(super) fn find(&self, id: &(RouteKind, ObjectKey)) -> Option<usize> {
        let (kind, key) = id;
        self.index
            .find(self.hasher.hash_one((kind, key)), |&s| {
                self.slot(s)
                    .is_some_and(|k| k.id.0 == *kind && *k.id.1 == *key)
            })
            .copied()
    }

    fn hash_of(hasher: &std::hash::RandomState, slots: &[Option<Kept>], s: usize) -> u64 {
        match slots.get(s).and_then(Option::as_ref) {
            Some(k) => hasher.hash_one((&k.id.0, &*k.id.1)),
            None => 0,
        }
    }

    /// Keeps `kept` in `slot` (None: a new one), counting its part into the totals in place of
    /// the one it replaces; returns its slot.
    pub(super) fn put(&mut self, slot: Option<usize>, kept: Kept) -> usize {
        let old = slot.and_then(|s| self.slots.get_mut(s).and_then(Option::take));
        if let Some(o) = &old
            && let Some(part) = &o.part
        {
            self.totals.take_out(o.id.0, &o.id.1, part.contribution());
        }
        if let Some(part) = &kept.part {
            self.totals.add(kept.id.0, &kept.id.1, part.contribution());
        }
        let s = match (slot, old) {
            (Some(s), Some(_)) => s,
            _ => {
                let s = self.free.pop().unwrap_or_else(|| {
                    self.slots.push(None);
                    self.slots.len() - 1
                });
                self.slots[s] = Some(kept);
                let (hasher, slots) = (&self.hasher, &self.slots);
                self.index
                    .insert_unique(Self::hash_of(hasher, slots, s), s, |&i| {
                        Self::hash_of(hasher, slots, i)
                    });
                return s;
            }
        };
        self.slots[s] = Some(kept);
        s
    }

    /// Drops the routes the pass `pass` did not see, taking their parts out of the totals;
    /// returns their entries.
    pub(super) fn drop_unseen(&mut self, pass: u64) -> Vec<Arc<Entry>> {
        let mut entries = Vec::new();
        for s in 0..self.slots.len() {
            if self.slot(s).is_none_or(|k| k.pass == pass) {
                continue;
            }
            let hash = Self::hash_of(&self.hasher, &self.slots, s);
            if let Ok(found) = self.index.find_entry(hash, |&i| i == s) {
                found.remove();
            }
            if let Some(gone) = self.slots[s].take() {
                if let Some(part) = gone.part {
                    self.totals
                        .take_out(gone.id.0, &gone.id.1, part.contribution());
                    entries.extend(part.entries);
                }
                self.free.push(s);
            }
        }
        entries
    }

    /// Every kept entry, in the order the last pass met the routes.
    pub(super) fn entries(&self) -> Vec<Arc<Entry>> {
        self.order
            .iter()
            .filter_map(|&(_, slot)| self.slot(slot)?.part.as_ref())
            .flat_map(|p| p.entries.iter().cloned())
            .collect()
    }
}

/// One route's kept part and what it was compiled from.
#[derive(Debug)]
pub struct Kept {
    /// The route's kind and key (shared with its status decision's key).
    pub id: (RouteKind, Arc<ObjectKey>),
    pub stored: Stored,
    /// The stored object the route was last met as: held weakly, so its address stays its own
    /// while the next pass compares addresses.
    pub object: Weak<dyn Any + Send + Sync>,
    pub turned_away: Vec<Rejection>,
    pub reads: Arc<Vec<Read>>,
    /// Whether `reads` has a ReferenceGrant's answer, which depends on the route's namespace.
    pub reads_grant: bool,
    /// None: the route names no parent of ours.
    pub part: Option<KeptPart>,
    /// The last pass that saw the route, and the route's place in that pass's order.
    pub pass: u64,
    pub at: usize,
}

impl Kept {
    /// Whether the last pass met this route as the object at `address`.
    pub fn met_as(&self, address: usize) -> bool {
        self.object.as_ptr().addr() == address
    }
}

/// A listener a route was turned away from: (Gateway, ListenerSet, listener) and the route
/// that keeps it.
pub type Rejection = (ObjectKey, Option<ObjectKey>, String, String);

/// Something a route's compilation read besides the route and the Gateways.
#[derive(Debug, Clone)]
pub enum Read {
    /// Whether a ReferenceGrant let the route use a Service in another namespace.
    Grant {
        to_namespace: String,
        to_name: String,
        permitted: bool,
    },
    /// A Service port a backendRef resolved to: the objects its cluster is built from.
    Service {
        namespace: String,
        name: String,
        port: i32,
        /// Weak, as [`super::route::Stored`]: identity without keeping replaced objects.
        service: Option<Weak<Service>>,
        slices: Vec<Weak<EndpointSlice>>,
        tls: Option<snap::BackendTls>,
    },
}

/// Reads are equal when they read the same objects (by identity) and got the same answers: the
/// memo keeps one copy of a route's reads for every route that read the same.
impl PartialEq for Read {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (
                Self::Grant {
                    to_namespace: a_ns,
                    to_name: a_name,
                    permitted: a,
                },
                Self::Grant {
                    to_namespace: b_ns,
                    to_name: b_name,
                    permitted: b,
                },
            ) => a_ns == b_ns && a_name == b_name && a == b,
            (
                Self::Service {
                    namespace: a_ns,
                    name: a_name,
                    port: a_port,
                    service: a_service,
                    slices: a_slices,
                    tls: a_tls,
                },
                Self::Service {
                    namespace: b_ns,
                    name: b_name,
                    port: b_port,
                    service: b_service,
                    slices: b_slices,
                    tls: b_tls,
                },
            ) => {
                a_ns == b_ns
                    && a_name == b_name
                    && a_port == b_port
                    && a_service.as_ref().map(Weak::as_ptr) == b_service.as_ref().map(Weak::as_ptr)
                    && a_slices.len() == b_slices.len()
                    && a_slices
                        .iter()
                        .zip(b_slices)
                        .all(|(a, b)| std::ptr::eq(a.as_ptr(), b.as_ptr()))
                    && a_tls == b_tls
            }
            _ => false,
        }
    }
}

impl Eq for Read {}

impl std::hash::Hash for Read {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match self {
            Self::Grant {
                to_namespace,
                to_name,
                permitted,
            } => (0u8, to_namespace, to_name, permitted).hash(state),
            Self::Service {
                namespace,
                name,
                port,
                service,
                ..
            } => (
                1u8,
                namespace,
                name,
                port,
                service.as_ref().map(Weak::as_ptr),
            )
                .hash(state),
        }
    }
}

/// One shared copy of equal values: what many kept routes hold alike (the listener they
/// attached to, the Service they read) is kept once.
#[derive(Debug)]
pub struct Pool<T: ?Sized>(std::collections::HashSet<Arc<T>>);

impl<T: ?Sized> Default for Pool<T> {
    fn default() -> Self {
        Self(std::collections::HashSet::new())
    }
}

impl<T: std::hash::Hash + Eq> Pool<T> {
    pub fn share(&mut self, value: T) -> Arc<T> {
        if let Some(kept) = self.0.get(&value) {
            return Arc::clone(kept);
        }
        let value = Arc::new(value);
        self.0.insert(Arc::clone(&value));
        value
    }
}

impl<E: std::hash::Hash + Eq> Pool<[E]> {
    pub fn share_slice(&mut self, value: Vec<E>) -> Arc<[E]> {
        if let Some(kept) = self.0.get(&value[..]) {
            return Arc::clone(kept);
        }
        let value: Arc<[E]> = value.into();
        self.0.insert(Arc::clone(&value));
        value
    }
}

impl<T: ?Sized + std::hash::Hash + Eq> Pool<T> {
    /// Drops the values only the pool holds.
    pub fn tidy(&mut self) {
        self.0.retain(|v| Arc::strong_count(v) > 1);
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }
}

impl Read {
    pub fn service(index: &Index<'_>, namespace: &str, name: &str, port: i32) -> Self {
        let (service, slices) = index.service_objects(namespace, name);
        Self::Service {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            port,
            service: service.map(Arc::downgrade),
            slices: slices.iter().map(|s| Arc::downgrade(s)).collect(),
            tls: index.port_tls(namespace, name, port).cloned(),
        }
    }

    /// Whether reading again now, for a route of `kind` in `route_namespace`, gives the same.
    pub fn unchanged(
        &self,
        store: &Store,
        index: &Index<'_>,
        kind: RouteKind,
        route_namespace: &str,
    ) -> bool {
        match self {
            Self::Grant {
                to_namespace,
                to_name,
                permitted,
            } => {
                refs::permitted(
                    store,
                    GATEWAY_GROUP,
                    kind.name(),
                    route_namespace,
                    "",
                    "Service",
                    to_namespace,
                    to_name,
                ) == *permitted
            }
            Self::Service {
                namespace,
                name,
                port,
                service,
                slices,
                tls,
            } => {
                let (now, now_slices) = index.service_objects(namespace, name);
                let same_service = match (service, now) {
                    (Some(a), Some(b)) => std::ptr::eq(a.as_ptr(), Arc::as_ptr(b)),
                    (None, None) => true,
                    _ => false,
                };
                same_service
                    && slices.len() == now_slices.len()
                    && slices
                        .iter()
                        .zip(now_slices)
                        .all(|(a, b)| std::ptr::eq(a.as_ptr(), Arc::as_ptr(b)))
                    && index.port_tls(namespace, name, *port) == tls.as_ref()
            }
        }
    }
}

/// A number per `Arc`, by its address (the assembler's entries, the route output's shared
/// parts).
pub type ByAddress = HashMap<usize, usize, std::hash::BuildHasherDefault<AddressHasher>>;

/// Hashes an address with a multiply: addresses are already spread, and every entry and
/// route of every pass is looked up by one, so SipHash's cost would show.
#[derive(Default)]
pub struct AddressHasher(u64);

impl std::hash::Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_usize(&mut self, n: usize) {
        let x = (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        // The high bits mixed into the low ones, which pick the bucket.
        self.0 = x ^ (x >> 29);
    }
}
