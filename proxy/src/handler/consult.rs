//! Asking a route's services about a request (`Decision::Consult`) on the Pingora engine: the
//! global rate limit service first, then the authorization service.

use super::Ctx;
use super::answers::{respond, respond_denial, respond_limited};
use crate::external_auth::{AuthRequest, ExternalAuth, Verdict};
use crate::metrics::Metrics;
use crate::policy::RoutePolicy;
use crate::ratelimit::global::Outcome;
use pingora::prelude::Session;
use std::sync::Arc;

/// The questions for a route's services, owned so the table guard can be dropped meanwhile.
pub(super) struct Consulting {
    pub(super) policy: Arc<RoutePolicy>,
    pub(super) limit: Option<coxswain_api::ratelimit::RateLimitRequest>,
    pub(super) authorize: Option<(Arc<ExternalAuth>, AuthRequest)>,
}

/// Asks; Some(the answer written) when a service refused the request, None when it may go on
/// (with the authorization service's edits in `ctx`).
pub(super) async fn ask(
    session: &mut Session,
    ctx: &mut Ctx,
    c: Consulting,
    metrics: &Metrics,
) -> Option<pingora::Result<bool>> {
    let Consulting {
        policy,
        limit,
        authorize,
    } = c;
    if let (Some(global), Some(asked)) = (&policy.global_limit, limit) {
        match global.check(asked).await {
            Outcome::Under => {}
            Outcome::Over {
                retry_after,
                fields,
            } => {
                Metrics::count(&metrics.rate_limited);
                Metrics::count(&metrics.global_rate_limit_over);
                return Some(respond_limited(session, retry_after, &fields).await);
            }
            Outcome::Failed(_) => {
                Metrics::count(&metrics.global_rate_limit_errors);
                if !global.fails_open() {
                    return Some(respond(session, 503, None).await);
                }
            }
        }
    }
    if let Some((service, asked)) = authorize {
        match service.check(&asked).await {
            Verdict::Allow(mut edits) => {
                Metrics::count(&metrics.external_auth_allowed);
                // The service's edits come after the token's, so they win.
                ctx.auth_edits.remove.append(&mut edits.remove);
                ctx.auth_edits.add.append(&mut edits.add);
            }
            Verdict::Deny(denial) => {
                Metrics::count(&metrics.external_auth_denied);
                return Some(respond_denial(session, &denial).await);
            }
            Verdict::Failed(_) => {
                Metrics::count(&metrics.external_auth_failed);
                return Some(respond(session, service.failure_status, None).await);
            }
        }
    }
    None
}
