//! What a request head that met its protocol's conditions becomes on the fast path: routed
//! and decided by the request layer, then forwarded (with the head to send upstream written),
//! answered here, or left to Pingora.

use super::heads::{RequestEdit, rewritten, write_upstream_head};
use super::retry::Retrying;
use super::{AccessFields, Answered, Bounds, Env, MAX_BODY, Plan, Record, SessionAnswer, Step};
use crate::policy::FieldOp;
use crate::request::{self, Arrival, Decision, Head};
use coxswain_api::snapshot as snap;

/// What `plan` does once a head met the conditions of its protocol (HTTP/1 here, HTTP/2 in
/// `h2`): route it, decide it, and write the HTTP/1.1 head to send upstream, led by `host`
/// when the request named its host elsewhere than in a field (HTTP/2's :authority). `body`:
/// its length, None for a chunked one. `awaits_continue`: the client sends its body after a
/// 100 Continue (`Expect: 100-continue`), so the head goes up before it, whatever its size.
pub(super) fn plan_checked<H: Head + ?Sized>(
    head: &H,
    checked: &request::Checked<'_>,
    body: Option<usize>,
    awaits_continue: bool,
    host: Option<&str>,
    env: &Env<'_>,
    up_head: &mut Vec<u8>,
) -> Step {
    let table = env.table.load();
    // A Host that belongs to another listener than the SNI: Pingora answers 421 and counts it.
    if env.https && request::misdirected(&table, env.port, env.sni, checked) {
        return Step::Pingora;
    }
    let Some(route) = request::route(&table, env.port, head, checked).filter(|r| r.passthrough)
    else {
        return Step::Pingora;
    };
    let forwarded = request::forwarded(
        head,
        checked,
        Some(env.peer.ip()),
        env.public_port,
        env.https,
        env.limits,
    );
    let arrival = Arrival {
        port: env.public_port,
        https: env.https,
        client: forwarded.client,
        consulted: None,
    };
    let method = head.method();
    let record = |route: &crate::router::CompiledRoute| Record {
        counters: route.counters.clone(),
        access_log: (route.policy.access_log
            && tracing::enabled!(target: "coxswain::access", tracing::Level::INFO))
        .then(|| AccessFields {
            client: forwarded.client,
            method: method.to_owned(),
            host: checked.host.to_owned(),
            path: checked.path().to_owned(),
            route: route.route.clone(),
        }),
        span: crate::request_trace::span(
            env.limits,
            &forwarded,
            head,
            checked,
            &arrival,
            Some(route),
        ),
    };
    // A body over the route's limit is Pingora's 413, decided there alone (deciding here too
    // would take a rate-limit token twice).
    if route.policy.max_body_bytes > 0
        && body.is_none_or(|n| n as u64 > route.policy.max_body_bytes)
    {
        return Step::Pingora;
    }
    let bounds = Bounds::new(route.route.timeouts, env.limits);
    // A body that streams on a route whose time runs out while it arrives: Pingora answers
    // 504 at its next piece past the deadline; this path bounds only what it reads whole.
    let streams = awaits_continue || body.is_none_or(|n| n > MAX_BODY as usize);
    if bounds.timed() && streams {
        return Step::Pingora;
    }
    // A retry sends the request again: only one whose body is read whole here has it all
    // (Pingora keeps what fits its retry buffer). HTTP/2 streams are Pingora's too.
    if route.policy.retry.is_some() && (streams || host.is_some()) {
        return Step::Pingora;
    }
    let metrics = env.table.metrics();
    // An answer decided by the request layer, with the fields it carries.
    let answer = |status, fields| {
        Step::Answer(Answered {
            status,
            fields,
            record: record(route),
            body,
            close_client: false,
        })
    };
    let forward = match request::decide(Some(route), head, checked, &arrival) {
        Decision::Forward(forward) => forward,
        Decision::Unauthorized(challenge) => {
            crate::metrics::Metrics::count(&metrics.auth_refused);
            let challenge = challenge.to_owned();
            return answer(
                401,
                vec![("www-authenticate".into(), challenge, FieldOp::Set)],
            );
        }
        Decision::Limited { retry_after } => {
            crate::metrics::Metrics::count(&metrics.rate_limited);
            let retry = retry_after.to_string();
            return answer(429, vec![("retry-after".into(), retry, FieldOp::Set)]);
        }
        // An allowlist's 403, a route's fixed status.
        Decision::Status(status) => return answer(status, Vec::new()),
        Decision::Redirect { status, location } => {
            return answer(status, vec![("location".into(), location, FieldOp::Set)]);
        }
        Decision::Preflight(policy) => {
            let fields = policy.cors.as_ref().map(|cors| {
                cors.preflight_fields(
                    head.get("origin"),
                    head.get("access-control-request-method"),
                    head.get("access-control-request-headers"),
                )
            });
            return answer(204, fields.unwrap_or_default());
        }
        // Not reached: a passthrough route has no other policy that answers by itself (the
        // services), and a body over its limit went to Pingora above.
        _ => return Step::Pingora,
    };
    let route = forward.route;
    let filters = || route.route.filters.iter().chain(&forward.backend.filters);
    let request_edits = filters().filter_map(|f| match &f.kind {
        Some(snap::filter::Kind::RequestHeaderModifier(m)) => Some(RequestEdit::Fields(m)),
        Some(snap::filter::Kind::UrlRewrite(r)) if !r.hostname.is_empty() => {
            Some(RequestEdit::Host(&r.hostname))
        }
        _ => None,
    });
    let target = rewritten(route, filters(), &checked.path_and_query);
    write_upstream_head(
        up_head,
        head,
        host,
        target.as_deref().unwrap_or(&checked.path_and_query),
        &forwarded,
        request_edits,
    );
    Step::Forward(Plan {
        upstream: forward.addr,
        endpoint: forward.endpoint,
        cluster: forward.cluster.clone(),
        head_only: method == "HEAD",
        idempotent: request::idempotent(method),
        record: record(route),
        in_flight: forward.cluster.start(forward.endpoint),
        response_edits: forward.backend.response_edits.clone(),
        policy_fields: {
            let mut fields = Vec::new();
            if let Some(cors) = &route.policy.cors {
                cors.answer_fields(head.get("origin"), &mut fields);
            }
            fields
        },
        retry: Retrying::new(&route.policy),
        session: route.policy.session.is_some().then(|| SessionAnswer {
            policy: route.policy.clone(),
            named: forward.session.is_none().then_some(forward.endpoint),
        }),
        body: body.unwrap_or(0),
        chunked: body.is_none(),
        awaits_continue,
        close_client: false,
        bounds,
        _slots: forward.slots,
    })
}
