//! Which failed attempts Pingora sends again, and where: connections that could not be
//! opened (always, to another endpoint), and under a route's retry policy (GEP-1731) answers
//! it retries, backend request timeouts and connections that broke before the answer.

use super::{Ctx, Gateway, past};
use crate::request;
use pingora::prelude::{HttpPeer, Session};

impl Gateway {
    /// Sets up the next attempt under the route's retry policy: another endpoint when there
    /// is one (else the same again), no sooner than the backoff. False when the policy allows
    /// no more: attempts used up, a method it does not resend, or out of time. `method`: the
    /// request went out with this method; None when none of it did (any method may go).
    pub(super) fn send_again(&self, ctx: &mut Ctx, method: Option<&str>) -> bool {
        let Some(policy) = ctx.policy.clone() else {
            return false;
        };
        let Some(retry) = policy.retry.as_ref() else {
            return false;
        };
        if ctx.policy_retries >= retry.attempts
            || method.is_some_and(|m| !retry.allows(m))
            || !retry.in_time(ctx.started)
            || past(ctx.deadline)
        {
            return false;
        }
        let Some(cluster) = ctx.cluster.clone() else {
            return false;
        };
        ctx.tried.push(ctx.endpoint);
        let Some(next) = cluster
            .pick_excluding(&ctx.tried)
            .or_else(|| cluster.pick_endpoint())
        else {
            return false;
        };
        ctx.policy_retries += 1;
        ctx.endpoint = next;
        ctx.upstream = Some(cluster.addr(next));
        ctx.retry_not_before =
            (!retry.backoff.is_zero()).then(|| std::time::Instant::now() + retry.backoff);
        crate::metrics::Metrics::count(&self.table.metrics().policy_retries);
        true
    }

    /// An attempt failed after its connection was open. GEP-1731: with a retry policy, one
    /// that broke or ran out of its backend request timeout before any of its answer went out
    /// is tried again, within the same attempts as retried answers; the policy decides even
    /// for a pooled connection the backend may have closed first, so a client that asked for
    /// N retries gets at most N. Without one, Pingora's rule: idempotent methods only, only
    /// while the body is still in the retry buffer, and only on a pooled connection.
    pub(super) fn attempt_error(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<pingora::Error>,
        ctx: &mut Ctx,
        client_reused: bool,
    ) -> Box<pingora::Error> {
        let mut e = e.more_context(format!("Peer: {peer}"));
        let method = session.req_header().method.as_str();
        let truncated = session.as_ref().retry_buffer_truncated();
        let stalled = matches!(
            e.etype(),
            pingora::ErrorType::ReadTimedout | pingora::ErrorType::WriteTimedout
        );
        if !ctx.answer_started
            && *e.esource() == pingora::ErrorSource::Upstream
            && attempt_failure(e.etype())
        {
            // A pooled connection found closed is routine, not the endpoint failing; one that
            // outlasted its timeout is the endpoint failing, pooled or not (as on the fast
            // path).
            if (!client_reused || stalled)
                && let Some(cluster) = &ctx.cluster
            {
                cluster.record(ctx.endpoint, true, &self.limits.outlier);
            }
            let policy_retries = ctx
                .policy
                .as_ref()
                .and_then(|p| p.retry.as_ref())
                .is_some_and(|r| r.attempts > 0);
            if policy_retries {
                e.set_retry(!truncated && self.send_again(ctx, Some(method)));
                return e;
            }
        }
        let allowed = request::idempotent(method)
            || ctx
                .policy
                .as_ref()
                .and_then(|p| p.retry.as_ref())
                .is_some_and(|r| r.allows(method));
        // The connection broke (not a timeout) before any of the answer came.
        let broke = !ctx.answer_started
            && *e.esource() == pingora::ErrorSource::Upstream
            && attempt_failure(e.etype())
            && !stalled;
        if !allowed || truncated || (broke && ctx.resent >= request::BROKEN_RESENDS) {
            e.set_retry(false);
        } else if broke && !client_reused && request::idempotent(method) {
            // A new connection: as on the fast path, again, to another endpoint.
            e.set_retry(self.resend_elsewhere(ctx));
        } else {
            e.retry.decide_reuse(client_reused);
            // A pooled connection found closed: sent again, to the same endpoint.
            if broke && e.retry() {
                ctx.resent += 1;
            }
        }
        e
    }

    /// Without a retry policy, an idempotent request whose new connection broke before any
    /// of the answer came goes again, to an endpoint it was not sent to, up to
    /// `policy::BROKEN_RESENDS` times: a Pod shutting down resets connections it accepted in
    /// the moment before its EndpointSlice says so. nginx's default (`proxy_next_upstream
    /// error timeout`) resends these too. False when there is no other endpoint.
    fn resend_elsewhere(&self, ctx: &mut Ctx) -> bool {
        let Some(cluster) = ctx.cluster.clone() else {
            return false;
        };
        ctx.resent += 1;
        let cluster = self.after_failure(ctx, &cluster);
        let Some(next) = cluster.pick_excluding(&ctx.tried) else {
            return false;
        };
        crate::metrics::Metrics::count(&self.table.metrics().broken_resends);
        ctx.endpoint = next;
        ctx.upstream = Some(cluster.addr(next));
        true
    }

    /// After an attempt on `ctx.endpoint` failed before any of the answer came: marks it
    /// tried and takes `cluster` as the current table holds it (as the fast path's
    /// `Plan::move_on`), for the next endpoint to come from.
    fn after_failure(
        &self,
        ctx: &mut Ctx,
        cluster: &std::sync::Arc<crate::upstream::ClusterState>,
    ) -> std::sync::Arc<crate::upstream::ClusterState> {
        ctx.tried.push(ctx.endpoint);
        let current = self.table.current_cluster(cluster, &mut ctx.tried);
        ctx.cluster = Some(current.clone());
        current
    }

    /// A connection that could not be opened sent nothing: the request goes to another
    /// endpoint, while `upstream::may_connect_again` allows (as on the fast path), then
    /// within the route's retry policy if it has one (as the fast path's `Plan::send_again`).
    pub(super) fn connect_failure(
        &self,
        ctx: &mut Ctx,
        mut e: Box<pingora::Error>,
    ) -> Box<pingora::Error> {
        let Some(cluster) = ctx.cluster.clone() else {
            return e;
        };
        cluster.record(ctx.endpoint, true, &self.limits.outlier);
        ctx.connect_failures += 1;
        if *e.etype() != pingora::ErrorType::ConnectRefused {
            ctx.slow_connect_failures += 1;
        }
        let cluster = self.after_failure(ctx, &cluster);
        let in_time = ctx
            .policy
            .as_ref()
            .and_then(|p| p.retry.as_ref())
            .is_none_or(|r| r.in_time(ctx.started));
        let next =
            (crate::upstream::may_connect_again(ctx.connect_failures, ctx.slow_connect_failures)
                && in_time)
                .then(|| cluster.pick_excluding(&ctx.tried))
                .flatten();
        match next {
            Some(next) => {
                crate::metrics::Metrics::count(&self.table.metrics().connect_retries);
                ctx.endpoint = next;
                ctx.upstream = Some(cluster.addr(next));
                e.set_retry(true);
            }
            // Every endpoint tried, or the connect attempts used up: the route's retry policy
            // may still try again (GEP-1731 retries TCP failures), after its backoff.
            None if self.send_again(ctx, None) => e.set_retry(true),
            None => e.set_retry(false),
        }
        e
    }
}

/// Failures of an attempt on an open connection that a retry policy retries (GEP-1731's
/// "disconnect, reset, timeout"): the connection broke, or a read or write outlasted the
/// attempt's time. Answers the backend did send (a malformed head) are not among them.
fn attempt_failure(kind: &pingora::ErrorType) -> bool {
    use pingora::ErrorType::{
        ConnectionClosed, H2Error, ReadError, ReadTimedout, WriteError, WriteTimedout,
    };
    matches!(
        kind,
        ConnectionClosed | ReadError | WriteError | ReadTimedout | WriteTimedout | H2Error
    )
}
