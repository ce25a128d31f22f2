//! What all routes add up to: their status decisions, the listeners they attach to, the
//! Services each Gateway's routes send to and their clusters. Kept between passes and
//! changed by the routes that changed ([`Totals::add`], [`Totals::take_out`]), so a pass costs
//! what changed, not every route. A leaf below the route compiler.

use super::route::RouteKind;
use super::status::{ObjectKey, Parents, StatusMap};
use coxswain_api::snapshot as snap;
use std::collections::BTreeMap;
use std::sync::Arc;

/// (Gateway, owning ListenerSet, listener name): a listener a route is attached to.
pub type Attachment = (ObjectKey, Option<ObjectKey>, String);
/// ((namespace, Service), Gateway): a Service a route attached to the Gateway sends to.
pub type ServiceGateway = ((String, String), ObjectKey);

/// What one route's part counts for.
pub struct Contribution<'a> {
    pub parents: &'a Parents,
    pub attached: &'a [Attachment],
    pub service_gateways: &'a [ServiceGateway],
    pub clusters: &'a [Arc<snap::Cluster>],
}

/// (namespace, Service) -> the Gateways whose accepted routes send to it, each with how many
/// of those routes do.
pub type ServiceGateways = BTreeMap<(String, String), BTreeMap<ObjectKey, usize>>;

#[derive(Debug, Default)]
pub struct Totals {
    /// Per route kind, in [`RouteKind`] order.
    pub status: [StatusMap; 5],
    /// (Gateway, owning ListenerSet, listener name) -> how many routes attach there.
    pub attached: BTreeMap<Attachment, i32>,
    pub service_gateways: ServiceGateways,
    /// One cluster per name, with how many kept parts list it.
    clusters: BTreeMap<String, (Arc<snap::Cluster>, usize)>,
}

fn slot(kind: RouteKind) -> usize {
    match kind {
        RouteKind::Http => 0,
        RouteKind::Grpc => 1,
        RouteKind::Tls => 2,
        RouteKind::Tcp => 3,
        RouteKind::Udp => 4,
    }
}

impl Totals {
    /// Counts `part` in, as route `key` of `kind`.
    pub fn add(&mut self, kind: RouteKind, key: &Arc<ObjectKey>, part: Contribution<'_>) {
        self.status[slot(kind)].insert(Arc::clone(key), Arc::clone(part.parents));
        for a in part.attached.iter() {
            match self.attached.get_mut(a) {
                Some(n) => *n += 1,
                None => {
                    self.attached.insert(a.clone(), 1);
                }
            }
        }
        for (service, gw) in part.service_gateways.iter() {
            let gateways = match self.service_gateways.get_mut(service) {
                Some(g) => g,
                None => self.service_gateways.entry(service.clone()).or_default(),
            };
            match gateways.get_mut(gw) {
                Some(n) => *n += 1,
                None => {
                    gateways.insert(gw.clone(), 1);
                }
            }
        }
        for c in part.clusters.iter() {
            match self.clusters.get_mut(&c.name) {
                // Every kept part was compiled against this pass's Services, so a cluster of
                // one name is the same in each; the newest copy is kept.
                Some((kept, n)) => {
                    *n += 1;
                    if !Arc::ptr_eq(kept, c) {
                        *kept = Arc::clone(c);
                    }
                }
                None => {
                    self.clusters.insert(c.name.clone(), (Arc::clone(c), 1));
                }
            }
        }
    }

    /// Counts `part` out again: what [`Self::add`] counted in.
    pub fn take_out(&mut self, kind: RouteKind, key: &ObjectKey, part: Contribution<'_>) {
        self.status[slot(kind)].remove(key);
        for a in part.attached.iter() {
            if let Some(n) = self.attached.get_mut(a) {
                *n -= 1;
                if *n <= 0 {
                    self.attached.remove(a);
                }
            }
        }
        for (service, gw) in part.service_gateways.iter() {
            let Some(gateways) = self.service_gateways.get_mut(service) else {
                continue;
            };
            if let Some(n) = gateways.get_mut(gw) {
                *n -= 1;
                if *n == 0 {
                    gateways.remove(gw);
                }
            }
            if gateways.is_empty() {
                self.service_gateways.remove(service);
            }
        }
        for c in part.clusters.iter() {
            if let Some((_, n)) = self.clusters.get_mut(&c.name) {
                *n -= 1;
                if *n == 0 {
                    self.clusters.remove(&c.name);
                }
            }
        }
    }

    /// Every cluster the routes send to, one per name, in name order: shared, so a cluster
    /// that did not change is the same `Arc` pass after pass (the assembler keeps its
    /// encoding by it).
    pub fn clusters(&self) -> Vec<Arc<snap::Cluster>> {
        self.clusters.values().map(|(c, _)| Arc::clone(c)).collect()
    }

    /// The Gateways whose routes send to `service`.
    pub fn gateways_of<'a>(
        &'a self,
        service: &(String, String),
    ) -> impl Iterator<Item = &'a ObjectKey> + 'a {
        self.service_gateways
            .get(service)
            .into_iter()
            .flat_map(BTreeMap::keys)
    }
}
