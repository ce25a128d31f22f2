//! What a proxy serves at one moment: the routing table and the TLS certificates, built together
//! from one snapshot and swapped in as one pointer.

use crate::metrics::Metrics;
use crate::router::{BuildError, Router};
use crate::tls::{CertError, TlsStore};
use arc_swap::ArcSwap;
use coxswain_api::snapshot::{Snapshot, feature};
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
    #[error(transparent)]
    Certificate(#[from] CertError),
}

impl Table {
    /// Builds everything a request needs, off the request path.
    /// A snapshot that cannot be built is counted in `coxswain_proxy_snapshots_rejected_total`.
    pub fn build(snapshot: &Snapshot, metrics: &Metrics) -> Result<Self, TableError> {
        let built = Self::build_from(snapshot, metrics);
        if built.is_err() {
            Metrics::count(&metrics.snapshots_rejected);
        }
        built
    }

    fn build_from(snapshot: &Snapshot, metrics: &Metrics) -> Result<Self, TableError> {
        if let Some(missing) = snapshot.unknown_requirement(FEATURES) {
            return Err(TableError::Unsupported(missing.to_owned()));
        }
        Ok(Self {
            router: Router::build_with_metrics(snapshot, metrics)?,
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
