//! A shared Gateway's client certificate towards its backends (`spec.tls.backend`).
//!
//! A dedicated proxy serves one Gateway, so its certificate goes on every TLS cluster of its
//! snapshot. The shared proxies serve many, and their connections to a backend are pooled per
//! cluster: presenting one Gateway's certificate on them would lend its identity to the
//! others. So a shared Gateway that presents one gets clusters of its own for the TLS backends
//! its routes use: the same endpoints and TLS settings under another name, with its
//! certificate, and so a connection pool of their own.

use super::encode::EncodedRoute;
use super::entries::Entry;
use super::status::{ObjectKey, ScopeKey};
use coxswain_api::snapshot::{self as snap, filter::Kind};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Moves the shared-pool routes of each Gateway in `certificates` (Gateway -> certificate
/// name) onto clusters of its own for their TLS backends, and adds those clusters.
pub fn give_own_clusters(
    entries: &mut [Arc<Entry>],
    clusters: &mut Vec<Arc<snap::Cluster>>,
    certificates: &BTreeMap<ObjectKey, String>,
) {
    if certificates.is_empty() {
        return;
    }
    let tls: BTreeMap<String, snap::Cluster> = clusters
        .iter()
        .filter(|c| c.tls.is_some())
        .map(|c| (c.name.clone(), (**c).clone()))
        .collect();
    let mut own: BTreeMap<String, snap::Cluster> = BTreeMap::new();
    for e in entries
        .iter_mut()
        .filter(|e| e.scope == ScopeKey::SharedPool)
    {
        let Some((gateway, _)) = e.parent.as_deref().cloned() else {
            continue;
        };
        let Some(certificate) = certificates.get(&gateway) else {
            continue;
        };
        if !e.route.clusters.iter().any(|c| tls.contains_key(c)) {
            continue;
        }
        let mut rename = |name: &mut String| {
            let Some(base) = tls.get(name.as_str()) else {
                return;
            };
            // '#' occurs in no Service, namespace or port name, so the name is unambiguous;
            // what precedes it is the base cluster's name, which metrics and logs show.
            let variant = format!("{name}#client:{gateway}");
            own.entry(variant.clone()).or_insert_with(|| {
                let mut c = base.clone();
                c.name = variant.clone();
                if let Some(t) = c.tls.as_mut() {
                    t.client_certificate = certificate.clone();
                }
                c
            });
            *name = variant;
        };
        // Shared with the incremental compiler's last pass: copied only for such a Gateway.
        let mut route = e.route.decode();
        for b in &mut route.backends {
            rename(&mut b.cluster);
            for f in &mut b.filters {
                if let Some(Kind::RequestMirror(m)) = &mut f.kind {
                    rename(&mut m.cluster);
                }
            }
        }
        for f in &mut route.filters {
            if let Some(Kind::RequestMirror(m)) = &mut f.kind {
                rename(&mut m.cluster);
            }
        }
        Arc::make_mut(e).route = EncodedRoute::new(&route);
    }
    clusters.extend(own.into_values().map(Arc::new));
}
