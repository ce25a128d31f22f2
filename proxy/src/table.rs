//! What a proxy serves at one moment: the routing table and the TLS certificates, built together
//! from one snapshot and swapped in as one pointer.

use crate::metrics::Metrics;
use crate::router::{BuildError, Router};
use crate::tls::{CertError, TlsStore};
use crate::upstream::ClusterState;
use arc_swap::ArcSwap;
use coxswain_api::snapshot::outline::Outline;
use coxswain_api::snapshot::{Sealed, feature};
use std::sync::Arc;

#[derive(Debug)]
pub struct Table {
    pub router: Router,
    pub tls: TlsStore,
}

/// What this proxy implements of what a snapshot may require (`Snapshot.requires`).
pub const FEATURES: &[&str] = &[
    feature::BASIC_AUTH,
    feature::RATE_LIMIT,
    feature::EXTERNAL_AUTH,
    feature::JWT,
    feature::GLOBAL_RATE_LIMIT,
    feature::FRONTEND_CLIENT_VALIDATION,
    feature::TLS_TERMINATE,
    feature::PUBLIC_PORT,
];

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error(
        "the snapshot requires {0:?}, which this proxy does not implement; upgrade the proxy \
         (it keeps serving its last snapshot)"
    )]
    Unsupported(String),
    #[error(transparent)]
    Router(#[from] BuildError),
    #[error("the snapshot does not decode: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error(transparent)]
    Certificate(#[from] CertError),
}

impl Table {
    /// Builds everything a request needs, off the request path.
    /// A snapshot that cannot be built is counted in `coxswain_proxy_snapshots_rejected_total`.
    /// Counters of routes no table holds any more are dropped first
    /// ([`Metrics::forget_unused`]).
    pub fn build(snapshot: &Sealed, metrics: &Metrics) -> Result<Self, TableError> {
        metrics.forget_unused();
        let built = Outline::of(snapshot)
            .map_err(TableError::from)
            .and_then(|outline| Self::build_from(&outline, metrics, &Router::default()));
        if built.is_err() {
            Metrics::count(&metrics.snapshots_rejected);
        }
        built
    }

    /// Builds the table that is to replace `previous`, sharing what it can with it
    /// ([`Router::build_after`]). Rejections are counted as in [`Table::build`].
    pub fn build_after(
        snapshot: &Outline,
        metrics: &Metrics,
        previous: &Table,
    ) -> Result<Self, TableError> {
        let built = Self::build_from(snapshot, metrics, &previous.router);
        if built.is_err() {
            Metrics::count(&metrics.snapshots_rejected);
        }
        built
    }

    fn build_from(
        snapshot: &Outline,
        metrics: &Metrics,
        previous: &Router,
    ) -> Result<Self, TableError> {
        if let Some(missing) = snapshot.unknown_requirement(FEATURES) {
            return Err(TableError::Unsupported(missing.to_owned()));
        }
        Ok(Self {
            router: Router::build_after(snapshot, metrics, previous)?,
            tls: TlsStore::build(snapshot)?,
        })
    }

    /// A table with no routes: what a proxy serves before its first snapshot.
    pub fn empty() -> Self {
        Self {
            router: Router::default(),
            tls: TlsStore::default(),
        }
    }
}

/// The current table, shared by every connection. Requests `load()` it once; a new snapshot is
/// one `store()`. In-flight requests keep the table they started with.
#[derive(Debug, Clone)]
pub struct SharedTable {
    inner: Arc<ArcSwap<Table>>,
    /// False until the first real snapshot: readiness.
    loaded: Arc<std::sync::atomic::AtomicBool>,
    swaps: Arc<std::sync::atomic::AtomicU64>,
    metrics: Arc<Metrics>,
    /// The version whose listeners are bound too: what readiness and metrics report.
    applied: Arc<ArcSwap<String>>,
}

impl Default for SharedTable {
    fn default() -> Self {
        Self {
            inner: Arc::new(ArcSwap::from_pointee(Table::empty())),
            loaded: Arc::default(),
            swaps: Arc::default(),
            metrics: Arc::default(),
            applied: Arc::default(),
        }
    }
}

impl SharedTable {
    pub fn load(&self) -> arc_swap::Guard<Arc<Table>> {
        self.inner.load()
    }

    /// `cluster` as the current table holds it, for a request whose attempt failed; see
    /// [`ClusterState::newest`] (`tried` is carried over by address).
    pub fn current_cluster(
        &self,
        cluster: &Arc<ClusterState>,
        tried: &mut Vec<usize>,
    ) -> Arc<ClusterState> {
        let current = self.load().router.cluster(&cluster.name).cloned();
        cluster.newest(current.as_ref(), tried)
    }

    /// Builds the table to swap in for the current one, sharing the routes they have in
    /// common ([`Table::build_after`]). `snapshot` is a sealed snapshot's outline
    /// ([`Outline::verify`], [`Outline::of`]).
    pub fn build(&self, snapshot: &Outline) -> Result<Table, TableError> {
        Table::build_after(snapshot, &self.metrics, &self.inner.load_full())
    }

    /// Drops the counters and cluster health records no table holds any more
    /// ([`Metrics::forget_unused`]): after a swap, off the path of the change. What goes has
    /// been gone since the table before the current one at least.
    pub fn forget_unused(&self) {
        self.metrics.forget_unused();
    }

    /// Swaps in a new table. Call [`SharedTable::mark_applied`] once its listeners are bound.
    pub fn store(&self, table: Table) {
        self.inner.store(Arc::new(table));
        self.swaps
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The current table's ports are bound: the proxy is ready and reports this version.
    pub fn mark_applied(&self) {
        let version = self.load().router.version().to_owned();
        self.applied.store(Arc::new(version));
        self.loaded
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// The version last fully applied (table swapped and listeners bound).
    pub fn applied_version(&self) -> Arc<String> {
        self.applied.load_full()
    }

    pub fn is_loaded(&self) -> bool {
        self.loaded.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn swaps(&self) -> u64 {
        self.swaps.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion
    use super::*;
    use coxswain_api::snapshot::{self as snap, Snapshot};

    /// One HTTPRoute per name on port 8080, each to a cluster of its own, path `/{name}`.
    fn snapshot(names: &[&str]) -> Sealed {
        let route = |name: &&str| snap::Route {
            source: Some(snap::RouteSource {
                kind: "HTTPRoute".into(),
                namespace: "web".into(),
                name: (*name).into(),
                ..Default::default()
            }),
            r#match: Some(snap::RouteMatch {
                path: Some(snap::PathMatch {
                    kind: snap::path_match::Kind::Prefix as i32,
                    value: format!("/{name}"),
                }),
                ..Default::default()
            }),
            backends: vec![snap::WeightedBackend {
                cluster: format!("web/{name}:80"),
                weight: 1,
                ..Default::default()
            }],
            ..Default::default()
        };
        let cluster = |name: &&str| snap::Cluster {
            name: format!("web/{name}:80"),
            endpoints: vec![snap::Endpoint {
                address: "10.0.0.1".into(),
                port: 80,
                ready: true,
                serving: true,
                terminating: false,
            }],
            ..Default::default()
        };
        Snapshot {
            listeners: vec![snap::Listener {
                port: 8080,
                protocol: snap::Protocol::Http as i32,
                virtual_hosts: vec![snap::VirtualHost {
                    hostname: String::new(),
                    routes: names.iter().map(route).collect(),
                    single_label: false,
                    terminate_tls: false,
                }],
                ..Default::default()
            }],
            clusters: names.iter().map(cluster).collect(),
            ..Default::default()
        }
        .seal()
    }

    /// Counts one 200 on the route serving `path`.
    fn request(table: &Table, path: &str) {
        let headers: &[(String, String)] = &[];
        let req = crate::router::Request {
            host: "any.example",
            path_and_query: path,
            method: "GET",
            headers,
        };
        table.router.route(8080, &req).unwrap().counters.record(200);
    }

    fn rendered(metrics: &Metrics) -> String {
        let mut text = String::new();
        metrics.render(&mut text);
        text
    }

    #[test]
    fn a_deleted_routes_counters_and_cluster_are_forgotten_once_no_table_has_them() {
        let metrics = Metrics::default();
        let first = Table::build(&snapshot(&["kept", "gone"]), &metrics).unwrap();
        request(&first, "/kept");
        request(&first, "/gone");
        let gone = "route=\"HTTPRoute/web/gone\"";
        let gone_cluster = "cluster=\"web/gone:80\"";

        // The snapshot without "gone" is built while the first table still serves: its
        // counters and cluster stay, and "kept" keeps counting where it was.
        let second = Table::build(&snapshot(&["kept"]), &metrics).unwrap();
        let text = rendered(&metrics);
        assert!(text.contains(gone) && text.contains(gone_cluster), "{text}");
        drop(first);
        request(&second, "/kept");

        // No table holds "gone" any more: the next build forgets it.
        let _third = Table::build(&snapshot(&["kept"]), &metrics).unwrap();
        let text = rendered(&metrics);
        assert!(!text.contains(gone), "{text}");
        assert!(!text.contains(gone_cluster), "{text}");
        assert!(
            text.contains("route=\"HTTPRoute/web/kept\",rule=\"0\",code=\"2xx\"} 2"),
            "{text}"
        );
        assert!(text.contains("cluster=\"web/kept:80\""), "{text}");
    }
}
