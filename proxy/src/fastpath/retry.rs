//! A route's retry policy on the fast path (GEP-1731, the Ingress retry annotations), by
//! Pingora's rules (`handler::retries`): an answer with one of the policy's codes is dropped
//! before any of it goes out, and a connection that broke or outlasted the backend request
//! timeout before any of the answer came is given up; either way the request goes again, to an endpoint
//! not tried yet when there is one, after the backoff, while attempts, the retry timeout and
//! the request timeout allow. A connection that could not be opened is tried elsewhere first
//! (`backend::open`), then counts as an attempt too. Only requests whose body was read whole
//! take this path (`plan::plan_checked`), so every attempt sends the same bytes.

use super::backend::{Attempts, Failed};
use super::{Env, Plan};
use crate::metrics::Metrics;
use crate::policy::RoutePolicy;
use std::sync::Arc;
use std::time::Instant;

/// The retries of one request.
pub(super) struct Retrying {
    policy: Arc<RoutePolicy>,
    /// When the request arrived, for the retry timeout.
    arrived: Instant,
    /// Retries so far.
    count: u32,
}

impl Retrying {
    /// For a route with a retry policy.
    pub(super) fn new(policy: &Arc<RoutePolicy>) -> Option<Self> {
        policy.retry.as_ref()?;
        Some(Self {
            policy: policy.clone(),
            arrived: Instant::now(),
            count: 0,
        })
    }

    /// The policy decides whether a broken connection is tried again, even a pooled one the
    /// backend had just closed (with `attempts: 0`, the rule without a policy stays).
    pub(super) fn decides_broken(&self) -> bool {
        self.policy.retry.as_ref().is_some_and(|r| r.attempts > 0)
    }

    /// Another endpoint may still be tried after a failed connect: the retry timeout has not
    /// passed.
    pub(super) fn in_time(&self) -> bool {
        self.policy
            .retry
            .as_ref()
            .is_none_or(|r| r.in_time(Some(self.arrived)))
    }

    /// The policy retries an answer with `status`.
    pub(super) fn retries(&self, status: u16) -> bool {
        status >= 200
            && self
                .policy
                .retry
                .as_ref()
                .is_some_and(|r| r.retries(status))
    }
}

impl Plan {
    /// The route's retry policy allows another attempt after `failed` (None: the answer had a
    /// status the policy retries): attempts left, a method it sends again (any may go when
    /// nothing of the request went), and in time.
    pub(super) fn may_send_again(&self, failed: Option<Failed>) -> bool {
        let Some(retrying) = &self.retry else {
            return false;
        };
        let Some(policy) = retrying.policy.retry.as_ref() else {
            return false;
        };
        let sent = failed != Some(Failed::Connect);
        retrying.count < policy.attempts
            && (!sent || policy.non_idempotent || self.idempotent)
            && policy.in_time(Some(retrying.arrived))
            && !self.bounds.expired()
    }

    /// Sets up the next attempt under the route's retry policy, after `failed` (as
    /// `may_send_again`), and waits out its backoff. False when the policy allows no more, or
    /// the backend has no endpoint. `attempts`: the endpoints tried so far, which the next
    /// attempt avoids when it can.
    pub(super) async fn send_again(
        &mut self,
        failed: Option<Failed>,
        attempts: &mut Attempts,
        env: &Env<'_>,
    ) -> bool {
        if !self.may_send_again(failed) {
            return false;
        }
        attempts.tried.push(self.endpoint);
        let Some(next) = self
            .cluster
            .pick_excluding(&attempts.tried)
            .or_else(|| self.cluster.pick_endpoint())
        else {
            return false;
        };
        let Some(retrying) = self.retry.as_mut() else {
            return false;
        };
        retrying.count += 1;
        let backoff = retrying
            .policy
            .retry
            .as_ref()
            .map(|r| r.backoff)
            .unwrap_or_default();
        self.endpoint = next;
        self.upstream = self.cluster.addr(next);
        self.in_flight = None;
        self.in_flight = self.cluster.start(next);
        Metrics::count(&env.table.metrics().policy_retries);
        if !backoff.is_zero() {
            tokio::time::sleep(self.bounds.until_deadline(backoff)).await;
        }
        true
    }
}
