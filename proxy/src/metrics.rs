//! Prometheus metrics of the data plane. Counters are atomics reached through `Arc`s that the
//! routing table holds, so recording a request takes no lock and no allocation; the registry's
//! lock is only taken when a table is built and when /metrics is scraped. Counters outlive
//! tables, so a snapshot swap never resets them.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Requests of one route rule by status class.
#[derive(Debug, Default)]
pub struct RouteCounters {
    classes: [AtomicU64; 5],
}

impl RouteCounters {
    pub fn record(&self, status: u16) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.classes[class].fetch_add(1, Ordering::Relaxed);
    }
}

/// Upstream response time (request sent to response header), cumulative buckets in seconds.
const BUCKETS_MS: [u64; 11] = [5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000];

#[derive(Debug, Default)]
struct Histogram {
    /// Observations by the first bucket they fall in; `render` makes them cumulative, so a
    /// request costs one atomic add here instead of one per bucket.
    buckets: [AtomicU64; BUCKETS_MS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

#[derive(Debug, Default)]
pub struct Metrics {
    routes: Mutex<BTreeMap<(String, u32), Arc<RouteCounters>>>,
    unrouted: RouteCounters,
    upstream: Histogram,
    pub active_connections: Arc<AtomicUsize>,
    /// Ports the current snapshot asks for that could not be bound at the last try.
    pub listeners_unbound: AtomicUsize,
    /// Times the accept loop found the connection limit reached and waited.
    pub connection_limit_waits: AtomicU64,
    /// Request heads refused before routing (400, 405, 431).
    pub requests_refused: AtomicU64,
    /// Requests answered 421: their Host belongs to another listener than their SNI.
    pub misdirected: AtomicU64,
    /// Request heads not complete within the head deadline.
    pub request_head_timeouts: AtomicU64,
    /// TLS handshakes not complete within their deadline.
    pub tls_handshake_timeouts: AtomicU64,
    /// Client connections ended because a write to them made no progress in time.
    pub client_send_timeouts: AtomicU64,
    /// Requests whose backend took or sent nothing within the upstream timeout.
    pub upstream_timeouts: AtomicU64,
    /// Connections closed because their PROXY protocol header was missing, malformed or late.
    pub proxy_protocol_refused: AtomicU64,
    /// UDP datagrams dropped because their port's flow table was full.
    pub udp_flows_refused: AtomicU64,
    /// Relayed TCP/TLS connections closed because no byte moved either way for the idle time.
    pub relay_idle_closed: AtomicU64,
    /// Requests sent to another endpoint because connecting to the one picked failed.
    pub connect_retries: AtomicU64,
    /// Idempotent requests without a retry policy sent once more, to another endpoint,
    /// because their new connection broke before any of the answer came.
    pub broken_resends: AtomicU64,
    /// HTTP/2 streams served by the fast path's HTTP/2 side (`fastpath::h2`): forwarded, or
    /// answered 401 or 429 by the request layer.
    pub http2_streams_fast_path: AtomicU64,
    /// HTTP/2 streams handed to Pingora: every stream the fast path does not take.
    pub http2_streams_pingora: AtomicU64,
    /// HTTP/1 requests the fast path handed to Pingora.
    pub http1_requests_pingora: AtomicU64,
    /// Requests sent again under their route's retry policy: an answer it retries, the
    /// backend request timeout, or a connection that broke before the answer.
    pub policy_retries: AtomicU64,
    /// Endpoint health per cluster (outlier ejection); kept here so it outlives tables.
    pub outliers: crate::outlier::Registry,
    /// Rate-limit buckets by limit; kept here so a snapshot swap does not refill them.
    pub rate_limits: crate::ratelimit::Registry,
    /// Requests answered 429 by a route's rate limit or in-progress limit.
    pub rate_limited: AtomicU64,
    /// Requests answered 401: no or wrong credentials for a route's authentication.
    pub auth_refused: AtomicU64,
    /// External authorization: requests the service allowed, refused, or could not decide.
    pub external_auth_allowed: AtomicU64,
    pub external_auth_denied: AtomicU64,
    pub external_auth_failed: AtomicU64,
    /// Global rate limits: requests the service said were over, and calls it could not answer
    /// (let through or refused as the route's fail_open says).
    pub global_rate_limit_over: AtomicU64,
    pub global_rate_limit_errors: AtomicU64,
    /// Snapshots that could not be turned into a table (the previous one kept serving).
    pub snapshots_rejected: AtomicU64,
    /// The tracer's span counters, when tracing is on (rendered as zeros otherwise).
    pub trace: std::sync::OnceLock<Arc<crate::trace::Counters>>,
}

impl Metrics {
    /// The counters of a route rule, created on first use and kept across tables.
    pub fn route(&self, route: &str, rule: u32) -> Arc<RouteCounters> {
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        routes.entry((route.to_owned(), rule)).or_default().clone()
    }

    /// Forgets what only the registries still hold: the counters of route rules and the
    /// health of clusters that no table has any more (deleted, renamed). Without it every
    /// route and cluster a proxy ever served stayed in memory and in /metrics. Called before
    /// a table is built, while the table it replaces still holds its own, so what goes is
    /// what has been gone for a whole snapshot; a route that comes back counts from zero,
    /// which Prometheus reads as a counter reset.
    pub fn forget_unused(&self) {
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        routes.retain(|_, c| Arc::strong_count(c) > 1);
        drop(routes);
        self.outliers.forget_unused();
    }

    /// A request no route matched.
    pub fn unrouted(&self, status: u16) {
        self.unrouted.record(status);
    }

    pub fn upstream_latency(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        if let Some(i) = BUCKETS_MS.iter().position(|bound| ms <= *bound) {
            self.upstream.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.upstream.count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.upstream
            .sum_micros
            .fetch_add(micros, Ordering::Relaxed);
    }

    /// Prometheus text exposition.
    pub fn render(&self, out: &mut String) {
        const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
        let _ = writeln!(
            out,
            "# HELP coxswain_proxy_requests_total Requests by route rule and status class."
        );
        let _ = writeln!(out, "# TYPE coxswain_proxy_requests_total counter");
        let routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        for ((route, rule), c) in routes.iter() {
            for (i, class) in CLASSES.iter().enumerate() {
                let n = c.classes[i].load(Ordering::Relaxed);
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "coxswain_proxy_requests_total{{route=\"{route}\",rule=\"{rule}\",code=\"{class}\"}} {n}"
                    );
                }
            }
        }
        drop(routes);
        for (i, class) in CLASSES.iter().enumerate() {
            let n = self.unrouted.classes[i].load(Ordering::Relaxed);
            if n > 0 {
                let _ = writeln!(
                    out,
                    "coxswain_proxy_requests_total{{route=\"\",rule=\"\",code=\"{class}\"}} {n}"
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP coxswain_proxy_upstream_response_seconds Time from sending a request upstream to its response header."
        );
        let _ = writeln!(
            out,
            "# TYPE coxswain_proxy_upstream_response_seconds histogram"
        );
        let mut n = 0;
        for (i, bound) in BUCKETS_MS.iter().enumerate() {
            n += self.upstream.buckets[i].load(Ordering::Relaxed);
            let le = *bound as f64 / 1000.0;
            let _ = writeln!(
                out,
                "coxswain_proxy_upstream_response_seconds_bucket{{le=\"{le}\"}} {n}"
            );
        }
        let count = self.upstream.count.load(Ordering::Relaxed);
        let sum = self.upstream.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(
            out,
            "coxswain_proxy_upstream_response_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(out, "coxswain_proxy_upstream_response_seconds_sum {sum}");
        let _ = writeln!(
            out,
            "coxswain_proxy_upstream_response_seconds_count {count}"
        );
        let clusters = self.outliers.report();
        let _ = writeln!(
            out,
            "# HELP coxswain_proxy_upstream_ejections_total Endpoints taken out of rotation after consecutive failures, by cluster."
        );
        let _ = writeln!(
            out,
            "# TYPE coxswain_proxy_upstream_ejections_total counter"
        );
        for (cluster, total, _) in &clusters {
            let _ = writeln!(
                out,
                "coxswain_proxy_upstream_ejections_total{{cluster=\"{cluster}\"}} {total}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP coxswain_proxy_upstream_ejected_endpoints Endpoints out of rotation now, by cluster."
        );
        let _ = writeln!(
            out,
            "# TYPE coxswain_proxy_upstream_ejected_endpoints gauge"
        );
        for (cluster, _, now) in &clusters {
            let _ = writeln!(
                out,
                "coxswain_proxy_upstream_ejected_endpoints{{cluster=\"{cluster}\"}} {now}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP coxswain_proxy_active_connections Downstream connections open now."
        );
        let _ = writeln!(out, "# TYPE coxswain_proxy_active_connections gauge");
        let _ = writeln!(
            out,
            "coxswain_proxy_active_connections {}",
            self.active_connections.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP coxswain_proxy_listeners_unbound Ports the current snapshot asks for that the proxy could not bind (in use, or not permitted); nothing is served on them."
        );
        let _ = writeln!(out, "# TYPE coxswain_proxy_listeners_unbound gauge");
        let _ = writeln!(
            out,
            "coxswain_proxy_listeners_unbound {}",
            self.listeners_unbound.load(Ordering::Relaxed)
        );
        let counters = [
            (
                "coxswain_proxy_connection_limit_waits_total",
                "Times new connections waited because the proxy's connection limit was reached.",
                &self.connection_limit_waits,
            ),
            (
                "coxswain_proxy_requests_refused_total",
                "Request heads refused before routing (400, 405, 408, 431).",
                &self.requests_refused,
            ),
            (
                "coxswain_proxy_requests_misdirected_total",
                "Requests answered 421: their Host belongs to another listener of the port than \
                 their connection's SNI.",
                &self.misdirected,
            ),
            (
                "coxswain_proxy_request_head_timeouts_total",
                "Request heads that did not arrive whole within the head deadline.",
                &self.request_head_timeouts,
            ),
            (
                "coxswain_proxy_tls_handshake_timeouts_total",
                "TLS handshakes that did not finish within their deadline.",
                &self.tls_handshake_timeouts,
            ),
            (
                "coxswain_proxy_client_send_timeouts_total",
                "Client connections ended because the client took none of a response's bytes \
                 within the send timeout.",
                &self.client_send_timeouts,
            ),
            (
                "coxswain_proxy_upstream_timeouts_total",
                "Requests whose backend sent nothing (or took none of the request) within the \
                 upstream timeout: 504 before the answer began, the connection ended after.",
                &self.upstream_timeouts,
            ),
            (
                "coxswain_proxy_proxy_protocol_refused_total",
                "Connections closed because their PROXY protocol header was missing, malformed or late.",
                &self.proxy_protocol_refused,
            ),
            (
                "coxswain_proxy_udp_flows_refused_total",
                "UDP datagrams of new client flows dropped because the port's flow table was full.",
                &self.udp_flows_refused,
            ),
            (
                "coxswain_proxy_relay_idle_closed_total",
                "Relayed TCP and TLS connections closed because no byte moved either way for the relay idle time.",
                &self.relay_idle_closed,
            ),
            (
                "coxswain_proxy_http2_streams_fast_path_total",
                "HTTP/2 streams served by the fast path: forwarded (passthrough routes, bodies of known length) or answered 401/429.",
                &self.http2_streams_fast_path,
            ),
            (
                "coxswain_proxy_http2_streams_pingora_total",
                "HTTP/2 streams served by Pingora: every stream the fast path does not take.",
                &self.http2_streams_pingora,
            ),
            (
                "coxswain_proxy_http1_requests_pingora_total",
                "HTTP/1 requests served by Pingora: every request the fast path does not take (coxswain_proxy_requests_total less these is what the fast path served).",
                &self.http1_requests_pingora,
            ),
            (
                "coxswain_proxy_upstream_connect_retries_total",
                "Requests sent to another endpoint because connecting to the one picked failed.",
                &self.connect_retries,
            ),
            (
                "coxswain_proxy_upstream_broken_resends_total",
                "Idempotent requests without a retry policy sent once more, to another endpoint, because their new backend connection broke before any of the answer came.",
                &self.broken_resends,
            ),
            (
                "coxswain_proxy_upstream_retries_total",
                "Requests sent again under their route's retry policy: an answer status it retries, the backend request timeout, or a backend connection that broke before the answer.",
                &self.policy_retries,
            ),
            (
                "coxswain_proxy_rate_limited_total",
                "Requests answered 429 by a route's rate limit (local or global) or its limit on requests in progress.",
                &self.rate_limited,
            ),
            (
                "coxswain_proxy_snapshots_rejected_total",
                "Snapshots refused (invalid, or requiring a feature this proxy lacks); the previous one kept serving.",
                &self.snapshots_rejected,
            ),
            (
                "coxswain_proxy_auth_refused_total",
                "Requests answered 401: missing or wrong credentials for a route's authentication.",
                &self.auth_refused,
            ),
            (
                "coxswain_proxy_external_auth_allowed_total",
                "Requests an external authorization service allowed.",
                &self.external_auth_allowed,
            ),
            (
                "coxswain_proxy_external_auth_denied_total",
                "Requests an external authorization service refused (its answer went to the client).",
                &self.external_auth_denied,
            ),
            (
                "coxswain_proxy_external_auth_failed_total",
                "Requests refused because the external authorization service could not be asked (unreachable, timed out, malformed answer).",
                &self.external_auth_failed,
            ),
            (
                "coxswain_proxy_global_rate_limit_over_total",
                "Requests answered 429 because the global rate limit service said over limit.",
                &self.global_rate_limit_over,
            ),
            (
                "coxswain_proxy_global_rate_limit_errors_total",
                "Calls to the global rate limit service that got no usable answer (the request then went on or got 503, as the route's failure mode says).",
                &self.global_rate_limit_errors,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
        }
        match self.trace.get() {
            Some(c) => c.render("coxswain_proxy", out),
            None => crate::trace::Counters::default().render("coxswain_proxy", out),
        }
    }

    /// Adds one to a counter.
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_survive_rebuilds_and_render_as_prometheus_text() {
        let m = Metrics::default();
        m.route("HTTPRoute/web/app", 0).record(200);
        // A new table asks again and gets the same counters.
        m.route("HTTPRoute/web/app", 0).record(503);
        m.unrouted(404);
        m.upstream_latency(Duration::from_millis(7));
        let mut text = String::new();
        m.render(&mut text);
        assert!(text.contains("coxswain_proxy_requests_total{route=\"HTTPRoute/web/app\",rule=\"0\",code=\"2xx\"} 1"), "{text}");
        assert!(text.contains("code=\"5xx\"} 1"), "{text}");
        assert!(
            text.contains("coxswain_proxy_requests_total{route=\"\",rule=\"\",code=\"4xx\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("coxswain_proxy_upstream_response_seconds_bucket{le=\"0.005\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("coxswain_proxy_upstream_response_seconds_bucket{le=\"0.01\"} 1"),
            "{text}"
        );
        // Cumulative: every bucket from the first one it falls in counts it.
        assert!(
            text.contains("coxswain_proxy_upstream_response_seconds_bucket{le=\"10\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("coxswain_proxy_upstream_response_seconds_count 1"),
            "{text}"
        );
    }
}
