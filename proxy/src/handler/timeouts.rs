//! How long each attempt may wait on its backend. A route's own timeouts decide it when it
//! has any (Gateway API `timeouts`, Ingress `proxy-*-timeout`); otherwise the proxy's
//! `Limits::upstream_timeout` bounds each read and write, as it bounds them on the fast path,
//! and an upgraded connection (a WebSocket) idles as long as a relayed one may.

use super::{Ctx, Gateway, timed_out};
use pingora::prelude::HttpPeer;
use std::time::{Duration, Instant};

impl Gateway {
    /// Sets `peer`'s connect, read and write timeouts for this attempt. Err: the route's
    /// request timeout has already passed (504).
    pub(super) fn bound_attempt(
        &self,
        peer: &mut HttpPeer,
        ctx: &mut Ctx,
        upgrade: bool,
    ) -> pingora::Result<()> {
        // Gateway API timeouts: the request timeout bounds every attempt by what is left of
        // it; the backend request timeout bounds each attempt. Pingora has no whole-exchange
        // timer, so the budget caps connecting and each read and write, and the body filters
        // end a response still streaming at the deadline.
        let now = Instant::now();
        let mut budget = match ctx.deadline {
            Some(d) if d <= now => return Err(timed_out()),
            Some(d) => Some(d - now),
            None => None,
        };
        let timeouts = ctx.route.as_ref().and_then(|r| r.timeouts);
        if let Some(ms) = timeouts.map(|t| t.backend_request_ms).filter(|ms| *ms > 0) {
            let d = Duration::from_millis(ms);
            budget = Some(budget.map_or(d, |b| b.min(d)));
        }
        ctx.attempt_deadline = budget.and_then(|b| now.checked_add(b));
        if let Some(b) = budget {
            peer.options.read_timeout = Some(b);
            peer.options.write_timeout = Some(b);
            peer.options.total_connection_timeout = Some(b);
        }
        // Connecting is bounded even without a route timeout (`Limits::upstream_connect`).
        peer.options.connection_timeout = Some(self.limits.upstream_connect);
        if let Some(t) = timeouts {
            // The Ingress timeouts: connect, and each read and write.
            let at_most = |a: Option<Duration>, ms: u64| match (a, ms) {
                (a, 0) => a,
                (None, ms) => Some(Duration::from_millis(ms)),
                (Some(a), ms) => Some(a.min(Duration::from_millis(ms))),
            };
            if t.connect_ms > 0 {
                peer.options.connection_timeout = Some(Duration::from_millis(t.connect_ms));
                peer.options.total_connection_timeout =
                    at_most(peer.options.total_connection_timeout, t.connect_ms);
            }
            peer.options.read_timeout = at_most(peer.options.read_timeout, t.read_ms);
            peer.options.write_timeout = at_most(peer.options.write_timeout, t.send_ms);
        }
        // What the route left open. A route that turned its request timeout off (0) still
        // has this: it lifts the bound on the whole exchange, not on a backend gone silent.
        let idle = if upgrade {
            self.limits.relay_idle
        } else {
            self.limits.upstream_timeout
        };
        peer.options.read_timeout.get_or_insert(idle);
        peer.options.write_timeout.get_or_insert(idle);
        Ok(())
    }
}
