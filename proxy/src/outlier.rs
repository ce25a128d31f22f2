//! Passive outlier ejection: an endpoint that keeps failing (connections refused, 5xx answers)
//! is taken out of its cluster's rotation for a while, longer each time it happens again, so
//! a broken replica stops failing requests before its EndpointSlice says anything.
//!
//! Health is kept per (cluster, endpoint) in a registry that outlives routing tables, so a
//! snapshot swap (an EndpointSlice change elsewhere) neither forgets an ejection nor resets
//! a streak. On the request path, a cluster with nothing ejected costs one atomic load per
//! pick; a success writes nothing unless the endpoint had failed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// When an endpoint is ejected, for how long, and how much of a cluster may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Failures in a row (connect errors and 5xx answers) that eject an endpoint; 0: never.
    pub consecutive_failures: u32,
    /// The first ejection lasts this long; the n-th, n times as long (at most 10 times).
    pub base_ejection: Duration,
    /// Endpoints of one cluster ejected at once, at most, in percent of its endpoints (one
    /// at least, when the cluster has two or more).
    pub max_ejected_percent: u32,
}

impl Default for Settings {
    fn default() -> Self {
        // Envoy's outlier detection defaults, except a larger share (Envoy: 10 %), so that
        // one of two or three replicas can be ejected.
        Self {
            consecutive_failures: 5,
            base_ejection: Duration::from_secs(30),
            max_ejected_percent: 50,
        }
    }
}

/// Successes in a row after which an endpoint's ejection count starts again from zero.
const FORGIVEN_AFTER: u32 = 20;
/// The n-th ejection lasts at most this many base periods.
const MAX_MULTIPLIER: u32 = 10;

/// Milliseconds on a clock that starts with the process (so 0 means "not ejected").
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .saturating_add(1)
}

/// One endpoint's record.
#[derive(Debug, Default)]
pub struct EndpointHealth {
    failures: AtomicU32,
    /// 0: in rotation; else the `now_ms` at which it comes back.
    ejected_until: AtomicU64,
    /// Ejections so far (the back-off multiplier).
    ejections: AtomicU32,
    /// Successes since it last failed, counted only while `ejections` > 0.
    successes: AtomicU32,
}

impl EndpointHealth {
    pub fn ejected(&self, now: u64) -> bool {
        let until = self.ejected_until.load(Ordering::Relaxed);
        until != 0 && now < until
    }
}

/// One cluster's ejection state.
#[derive(Debug, Default)]
pub struct ClusterHealth {
    /// Endpoints ejected (or whose ejection has not been noticed to end): while 0, picks skip
    /// every check.
    ejected: AtomicUsize,
    /// Ejections so far, for the metric.
    pub ejections_total: AtomicU64,
    endpoints: Mutex<HashMap<SocketAddr, Arc<EndpointHealth>>>,
}

impl ClusterHealth {
    /// The record of one endpoint, made on first sight (table build time, not request time).
    pub fn endpoint(&self, addr: SocketAddr) -> Arc<EndpointHealth> {
        let mut map = self.endpoints.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(addr).or_default().clone()
    }

    /// Drops records no table holds (endpoints that left), and recounts what is ejected
    /// among `current` (a new table's endpoints).
    pub fn settle(&self, current: &[Arc<EndpointHealth>]) {
        let mut map = self.endpoints.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, h| Arc::strong_count(h) > 1);
        let now = now_ms();
        let ejected = current.iter().filter(|h| h.ejected(now)).count();
        self.ejected.store(ejected, Ordering::Relaxed);
    }

    /// Whether any endpoint may be out of rotation (picks then check each candidate).
    pub fn any_ejected(&self) -> bool {
        self.ejected.load(Ordering::Relaxed) > 0
    }

    /// Whether `e` may take a request at `now`; an ejection found over is ended here.
    pub fn available(&self, e: &EndpointHealth, now: u64) -> bool {
        let until = e.ejected_until.load(Ordering::Relaxed);
        if until == 0 {
            return true;
        }
        if now < until {
            return false;
        }
        // Back in rotation: whoever sees it first ends the ejection, once.
        if e.ejected_until
            .compare_exchange(until, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            e.failures.store(0, Ordering::Relaxed);
            let _ = self
                .ejected
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
        true
    }

    /// Records how a request to `e` went; `all` is the cluster's endpoints (for the share
    /// that may be ejected). Returns true when this failure ejected it.
    pub fn record(
        &self,
        e: &EndpointHealth,
        failed: bool,
        all: &[Arc<EndpointHealth>],
        settings: &Settings,
    ) -> bool {
        if !failed {
            if e.failures.load(Ordering::Relaxed) != 0 {
                e.failures.store(0, Ordering::Relaxed);
            }
            if e.ejections.load(Ordering::Relaxed) > 0
                && e.successes.fetch_add(1, Ordering::Relaxed) + 1 >= FORGIVEN_AFTER
            {
                e.ejections.store(0, Ordering::Relaxed);
                e.successes.store(0, Ordering::Relaxed);
            }
            return false;
        }
        if e.ejections.load(Ordering::Relaxed) > 0 {
            e.successes.store(0, Ordering::Relaxed);
        }
        let streak = e.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if settings.consecutive_failures == 0 || streak < settings.consecutive_failures {
            return false;
        }
        let now = now_ms();
        if e.ejected(now) || all.len() < 2 {
            return false;
        }
        // The share: counted now, over the endpoints this table has.
        let ejected = all.iter().filter(|h| h.ejected(now)).count();
        let allowed = (all.len() * settings.max_ejected_percent as usize / 100).max(1);
        if ejected >= allowed {
            return false;
        }
        let times = e.ejections.fetch_add(1, Ordering::Relaxed) + 1;
        let period = settings
            .base_ejection
            .saturating_mul(times.min(MAX_MULTIPLIER));
        let until = now.saturating_add(u64::try_from(period.as_millis()).unwrap_or(u64::MAX));
        e.ejected_until.store(until, Ordering::Relaxed);
        e.failures.store(0, Ordering::Relaxed);
        self.ejected.fetch_add(1, Ordering::Relaxed);
        self.ejections_total.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Endpoints of `current` out of rotation right now (for the gauge).
    pub fn ejected_now(&self) -> usize {
        let now = now_ms();
        let map = self.endpoints.lock().unwrap_or_else(|p| p.into_inner());
        map.values().filter(|h| h.ejected(now)).count()
    }
}

/// Every cluster's health, by cluster name; held by the metrics, so it outlives tables.
#[derive(Debug, Default)]
pub struct Registry {
    clusters: Mutex<std::collections::BTreeMap<String, Arc<ClusterHealth>>>,
}

impl Registry {
    pub fn cluster(&self, name: &str) -> Arc<ClusterHealth> {
        let mut map = self.clusters.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(name.to_owned()).or_default().clone()
    }

    /// Drops the clusters no table holds (see `Metrics::forget_unused`).
    pub fn forget_unused(&self) {
        let mut map = self.clusters.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, c| Arc::strong_count(c) > 1);
    }

    /// (cluster, ejections so far, ejected now), by cluster name.
    pub fn report(&self) -> Vec<(String, u64, usize)> {
        let map = self.clusters.lock().unwrap_or_else(|p| p.into_inner());
        map.iter()
            .map(|(name, c)| {
                (
                    name.clone(),
                    c.ejections_total.load(Ordering::Relaxed),
                    c.ejected_now(),
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
