//! The controller's admin endpoints: `/healthz` (its listeners and loop are alive), `/readyz`
//! (caches listed, listeners bound, first compile done) and `/metrics` (Prometheus text).
//!
//! Readiness does not depend on leadership: a standby serves bootstrap and must stay behind
//! its Service; only the discovery Service selects the leader, by label.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Upper bounds (seconds) of the compile-duration histogram buckets.
const COMPILE_BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// What the endpoints report; shared by the controller's tasks.
#[derive(Default)]
pub struct State {
    pub leader: Arc<AtomicBool>,
    listeners_bound: AtomicBool,
    /// Set when a listener task ends: the replica can no longer serve proxies.
    listener_failed: Mutex<Option<String>>,
    unsynced: Mutex<Vec<String>>,
    compiled: AtomicBool,
    compiles: AtomicU64,
    compile_micros: AtomicU64,
    compile_buckets: [AtomicU64; COMPILE_BUCKETS.len()],
    /// Routes compiled again and routes whose last output was reused, over all passes.
    routes_compiled: AtomicU64,
    routes_reused: AtomicU64,
    /// (kind, outcome) -> count.
    status_writes: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    /// Event type -> count.
    events: Mutex<BTreeMap<&'static str, u64>>,
    /// Kind -> objects in the last compile's input.
    objects: Mutex<BTreeMap<&'static str, usize>>,
    connected_proxies: AtomicU64,
    /// Bootstrap refusals by reason (`identity::server::refused`).
    bootstrap_refused: Mutex<BTreeMap<&'static str, u64>>,
    svids_issued: AtomicU64,
    /// Remote JWKS fetches that gave a usable document, and those that did not.
    jwks_fetches_ok: AtomicU64,
    jwks_fetches_failed: AtomicU64,
    /// The tracer's span counters, when tracing is on (rendered as zeros otherwise).
    pub trace: std::sync::OnceLock<Arc<coxswain_proxy::trace::Counters>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    pub fn new(leader: Arc<AtomicBool>) -> Self {
        Self {
            leader,
            ..Default::default()
        }
    }

    pub fn listeners_bound(&self) {
        self.listeners_bound.store(true, Ordering::Release);
    }

    pub fn listener_failed(&self, which: &str, error: &str) {
        *lock(&self.listener_failed) = Some(format!("{which} listener stopped: {error}"));
    }

    pub fn set_unsynced(&self, kinds: Vec<String>) {
        *lock(&self.unsynced) = kinds;
    }

    /// The incremental compiler's totals so far.
    pub fn route_reuse(&self, compiled: u64, reused: u64) {
        self.routes_compiled.store(compiled, Ordering::Relaxed);
        self.routes_reused.store(reused, Ordering::Relaxed);
    }

    pub fn compiled(&self, took: Duration, objects: BTreeMap<&'static str, usize>) {
        self.compiled.store(true, Ordering::Release);
        self.compiles.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.compile_micros.fetch_add(micros, Ordering::Relaxed);
        let secs = took.as_secs_f64();
        for (bound, count) in COMPILE_BUCKETS.iter().zip(&self.compile_buckets) {
            if secs <= *bound {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
        *lock(&self.objects) = objects;
    }

    pub fn status_write(&self, kind: &'static str, ok: bool) {
        let outcome = if ok { "ok" } else { "error" };
        *lock(&self.status_writes)
            .entry((kind, outcome))
            .or_default() += 1;
    }

    pub fn status_conflict(&self, kind: &'static str) {
        *lock(&self.status_writes)
            .entry((kind, "conflict"))
            .or_default() += 1;
    }

    pub fn event(&self, type_: &'static str) {
        *lock(&self.events).entry(type_).or_default() += 1;
    }

    pub fn bootstrap_refused(&self, reason: &'static str) {
        *lock(&self.bootstrap_refused).entry(reason).or_default() += 1;
    }

    pub fn svid_issued(&self) {
        self.svids_issued.fetch_add(1, Ordering::Relaxed);
    }

    pub fn jwks_fetched(&self, ok: bool) {
        let counter = if ok {
            &self.jwks_fetches_ok
        } else {
            &self.jwks_fetches_failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn set_connected_proxies(&self, n: usize) {
        self.connected_proxies
            .store(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// `/healthz`: fails only for what a restart can fix.
    pub fn healthz(&self) -> Result<(), String> {
        match lock(&self.listener_failed).clone() {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// `/readyz`: every reason not to be ready yet, in words a person can act on.
    pub fn readyz(&self) -> Result<(), String> {
        self.healthz()?;
        let mut waiting = Vec::new();
        if !self.listeners_bound.load(Ordering::Acquire) {
            waiting.push("discovery and bootstrap listeners not bound yet".to_owned());
        }
        let unsynced = lock(&self.unsynced).clone();
        if !unsynced.is_empty() {
            waiting.push(format!(
                "waiting for the first list of: {}",
                unsynced.join(", ")
            ));
        } else if !self.compiled.load(Ordering::Acquire) {
            waiting.push("first compile not done yet".to_owned());
        }
        if waiting.is_empty() {
            Ok(())
        } else {
            Err(waiting.join("; "))
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let gauge = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(
            &mut out,
            "coxswain_controller_leader",
            "Whether this replica holds the leader Lease.",
            u64::from(self.leader.load(Ordering::Acquire)),
        );
        gauge(
            &mut out,
            "coxswain_controller_ready",
            "Whether /readyz answers 200.",
            u64::from(self.readyz().is_ok()),
        );
        gauge(
            &mut out,
            "coxswain_controller_connected_proxies",
            "Proxies with an open discovery stream to this replica.",
            self.connected_proxies.load(Ordering::Relaxed),
        );

        let name = "coxswain_controller_compile_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time to compile the cluster's objects into snapshots and statuses.\n# TYPE {name} histogram"
        );
        let count = self.compiles.load(Ordering::Relaxed);
        for (bound, n) in COMPILE_BUCKETS.iter().zip(&self.compile_buckets) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }
        let sum = self.compile_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"+Inf\"}} {count}\n{name}_sum {sum}\n{name}_count {count}"
        );

        let name = "coxswain_controller_routes_compiled_total";
        let _ = writeln!(
            out,
            "# HELP {name} Routes taken by compile passes: compiled again (compiled), or their last output reused because nothing they read changed (reused).\n# TYPE {name} counter"
        );
        for (outcome, n) in [
            ("compiled", &self.routes_compiled),
            ("reused", &self.routes_reused),
        ] {
            let _ = writeln!(
                out,
                "{name}{{outcome=\"{outcome}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }

        let name = "coxswain_controller_status_writes_total";
        let _ = writeln!(
            out,
            "# HELP {name} Status writes by kind and outcome (ok, error, conflict).\n# TYPE {name} counter"
        );
        for ((kind, outcome), n) in lock(&self.status_writes).iter() {
            let _ = writeln!(out, "{name}{{kind=\"{kind}\",outcome=\"{outcome}\"}} {n}");
        }
        let name = "coxswain_controller_events_total";
        let _ = writeln!(
            out,
            "# HELP {name} Kubernetes Events published, by type.\n# TYPE {name} counter"
        );
        for (type_, n) in lock(&self.events).iter() {
            let _ = writeln!(out, "{name}{{type=\"{type_}\"}} {n}");
        }
        let name = "coxswain_controller_objects";
        let _ = writeln!(
            out,
            "# HELP {name} Objects of each kind in the last compile's input.\n# TYPE {name} gauge"
        );
        for (kind, n) in lock(&self.objects).iter() {
            let _ = writeln!(out, "{name}{{kind=\"{kind}\"}} {n}");
        }
        let name = "coxswain_controller_svids_issued_total";
        let _ = writeln!(
            out,
            "# HELP {name} SVIDs issued by the bootstrap service.\n# TYPE {name} counter\n{name} {}",
            self.svids_issued.load(Ordering::Relaxed)
        );
        let name = "coxswain_controller_bootstrap_refused_total";
        let _ = writeln!(
            out,
            "# HELP {name} Bootstrap calls refused, by reason (rate_limited: over the per-address limit).\n# TYPE {name} counter"
        );
        for (reason, n) in lock(&self.bootstrap_refused).iter() {
            let _ = writeln!(out, "{name}{{reason=\"{reason}\"}} {n}");
        }
        let name = "coxswain_controller_jwks_fetches_total";
        let _ = writeln!(
            out,
            "# HELP {name} Fetches of remote JWKS documents by outcome (failed: no usable document; the last good one stays in use).\n# TYPE {name} counter\n{name}{{outcome=\"ok\"}} {}\n{name}{{outcome=\"failed\"}} {}",
            self.jwks_fetches_ok.load(Ordering::Relaxed),
            self.jwks_fetches_failed.load(Ordering::Relaxed)
        );
        match self.trace.get() {
            Some(c) => c.render("coxswain_controller", &mut out),
            None => {
                coxswain_proxy::trace::Counters::default().render("coxswain_controller", &mut out)
            }
        }
        out
    }

    fn answer(&self, path: &str) -> (&'static str, String) {
        const UNAVAILABLE: &str = "503 Service Unavailable";
        match path {
            "/healthz" => match self.healthz() {
                Ok(()) => ("200 OK", "ok\n".into()),
                Err(why) => (UNAVAILABLE, format!("{why}\n")),
            },
            "/readyz" => match self.readyz() {
                Ok(()) => ("200 OK", "ok\n".into()),
                Err(why) => (UNAVAILABLE, format!("{why}\n")),
            },
            "/metrics" => ("200 OK", self.render()),
            _ => ("404 Not Found", "not found\n".into()),
        }
    }
}

/// Serves every endpoint on `addr` in the background; returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    state: Arc<State>,
) -> Result<SocketAddr, coxswain_proxy::admin::AdminError> {
    coxswain_proxy::admin::serve_fn(addr, move |path| state.answer(path)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_after_listeners_caches_and_a_compile() {
        let state = State::new(Arc::new(AtomicBool::new(false)));
        state.set_unsynced(vec!["Secret".into(), "HTTPRoute (list forbidden)".into()]);
        let why = state.readyz().unwrap_err();
        assert!(why.contains("listeners not bound"), "{why}");
        assert!(why.contains("Secret, HTTPRoute (list forbidden)"), "{why}");

        state.listeners_bound();
        state.set_unsynced(Vec::new());
        assert_eq!(
            state.readyz().unwrap_err(),
            "first compile not done yet".to_owned()
        );
        state.compiled(Duration::from_millis(3), BTreeMap::from([("Gateway", 2)]));
        assert_eq!(state.readyz(), Ok(()));
        assert_eq!(state.answer("/readyz").0, "200 OK");

        state.listener_failed("discovery", "accept: too many open files");
        assert!(state.healthz().unwrap_err().contains("discovery listener"));
        assert_eq!(state.answer("/healthz").0, "503 Service Unavailable");
        assert_eq!(state.answer("/readyz").0, "503 Service Unavailable");
    }

    #[test]
    fn metrics_render_as_prometheus_text() {
        let state = State::new(Arc::new(AtomicBool::new(true)));
        state.compiled(
            Duration::from_millis(30),
            BTreeMap::from([("HTTPRoute", 7)]),
        );
        state.compiled(
            Duration::from_millis(300),
            BTreeMap::from([("HTTPRoute", 8)]),
        );
        state.status_write("Gateway", true);
        state.status_write("Gateway", true);
        state.status_conflict("HTTPRoute");
        state.event("Warning");
        state.bootstrap_refused("rate_limited");
        state.bootstrap_refused("rate_limited");
        state.svid_issued();
        state.jwks_fetched(true);
        state.jwks_fetched(false);
        state.jwks_fetched(false);
        state.route_reuse(3, 40);
        let text = state.render();
        for line in [
            "coxswain_controller_leader 1",
            "coxswain_controller_compile_duration_seconds_bucket{le=\"0.05\"} 1",
            "coxswain_controller_compile_duration_seconds_bucket{le=\"0.5\"} 2",
            "coxswain_controller_compile_duration_seconds_bucket{le=\"+Inf\"} 2",
            "coxswain_controller_compile_duration_seconds_count 2",
            "coxswain_controller_compile_duration_seconds_sum 0.33",
            "coxswain_controller_routes_compiled_total{outcome=\"compiled\"} 3",
            "coxswain_controller_routes_compiled_total{outcome=\"reused\"} 40",
            "coxswain_controller_status_writes_total{kind=\"Gateway\",outcome=\"ok\"} 2",
            "coxswain_controller_status_writes_total{kind=\"HTTPRoute\",outcome=\"conflict\"} 1",
            "coxswain_controller_events_total{type=\"Warning\"} 1",
            "coxswain_controller_objects{kind=\"HTTPRoute\"} 8",
            "coxswain_controller_bootstrap_refused_total{reason=\"rate_limited\"} 2",
            "coxswain_controller_svids_issued_total 1",
            "coxswain_controller_jwks_fetches_total{outcome=\"ok\"} 1",
            "coxswain_controller_jwks_fetches_total{outcome=\"failed\"} 2",
            "coxswain_controller_trace_spans_exported_total 0",
            "coxswain_controller_trace_spans_dropped_total{reason=\"export_failed\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
