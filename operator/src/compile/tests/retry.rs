//! HTTPRoute `rules[].retry` (GEP-1731; Gateway API v1.6's HTTPRouteRetry feature): what each
//! rule's retry stanza compiles into, and the values that make a route unacceptable.

use super::fixtures::*;
use crate::compile::status::ConditionStatus;
use crate::compile::*;
use coxswain_api::snapshot as snap;

/// The retry policy and timeouts of rule `rule` of route `name` in the shared snapshot.
fn rule_of(c: &Compiled, name: &str, rule: u32) -> (Option<snap::Retry>, Option<snap::Timeouts>) {
    let routes = &shared(c).listeners[0].virtual_hosts[0].routes;
    let r = routes
        .iter()
        .find(|r| {
            r.source
                .as_ref()
                .is_some_and(|s| s.name == name && s.rule == rule)
        })
        .unwrap_or_else(|| panic!("no route {name}/{rule} in the snapshot"));
    (r.retry.clone(), r.timeouts)
}

#[test]
fn each_rule_keeps_its_own_codes_and_attempts() {
    // The shape of the v1.6 conformance test HTTPRouteRetry: one rule retries only 500, three
    // times; the next retries the gateway errors, twice. `attempts` counts retries after the
    // first try ("the maximum number of times an individual request ... should be retried").
    let retries = route(
        "retries",
        r#"  parentRefs: [{name: edge}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /retry/code-500-attempts-3}}]
    retry: {codes: [500], attempts: 3}
    backendRefs: [{name: echo, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /retry/code-all-attempts-2}}]
    retry: {codes: [504, 500, 503, 502], attempts: 2}
    backendRefs: [{name: echo, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /plain}}]
    backendRefs: [{name: echo, port: 8080}]
"#,
    );
    let c = compile_yaml(&[BASE, GATEWAY, &retries]);
    assert!(route_condition(&c, "retries", "Accepted").is_true());
    assert!(route_condition(&c, "retries", "ResolvedRefs").is_true());
    let policy = |rule| {
        rule_of(&c, "retries", rule).0.map(|r| {
            (
                r.codes,
                r.attempts,
                r.backoff_ms,
                r.non_idempotent,
                r.timeout_ms,
            )
        })
    };
    // No backoff given: the next try starts at once. Only idempotent methods are sent again
    // (a POST that reached the backend may have had its effect), and nothing bounds the
    // retries as a whole.
    assert_eq!(policy(0), Some((vec![500], 3, 0, false, 0)));
    assert_eq!(
        policy(1),
        Some((vec![500, 502, 503, 504], 2, 0, false, 0)),
        "codes in ascending order, as the proxy's lookup needs"
    );
    assert_eq!(policy(2), None, "a rule without retry is tried once");
}

#[test]
fn the_backend_request_timeout_bounds_each_try_not_the_retries() {
    // GEP-1731 with GEP-1742: timeouts.backendRequest is per try, so a retried request may
    // take up to (attempts + 1) of them, within timeouts.request.
    let timed = route(
        "timed",
        r#"  parentRefs: [{name: edge}]
  rules:
  - backendRefs: [{name: echo, port: 8080}]
    retry: {codes: [503], attempts: 2, backoff: 250ms}
    timeouts: {request: 10s, backendRequest: 2s}
"#,
    );
    let c = compile_yaml(&[BASE, GATEWAY, &timed]);
    assert!(route_condition(&c, "timed", "Accepted").is_true());
    let (retry, timeouts) = rule_of(&c, "timed", 0);
    let retry = retry.expect("the rule retries");
    assert_eq!(
        (retry.attempts, retry.backoff_ms, retry.timeout_ms),
        (2, 250, 0)
    );
    let timeouts = timeouts.expect("the rule has timeouts");
    assert_eq!(
        (timeouts.request_ms, timeouts.backend_request_ms),
        (10_000, 2_000)
    );
}

#[test]
fn backoff_takes_gateway_api_durations_only() {
    // GEP-2257 durations: whole numbers with h, m, s or ms, possibly several.
    let spaced = route(
        "spaced",
        r#"  parentRefs: [{name: edge}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /a}}]
    backendRefs: [{name: echo, port: 8080}]
    retry: {codes: [502], backoff: 1s500ms}
  - matches: [{path: {type: PathPrefix, value: /b}}]
    backendRefs: [{name: echo, port: 8080}]
    retry: {codes: [502], backoff: 1m}
"#,
    );
    let fractional = route(
        "fractional",
        "  parentRefs: [{name: edge}]
  rules: [{backendRefs: [{name: echo, port: 8080}], retry: {codes: [502], backoff: 1.5s}}]
",
    );
    let c = compile_yaml(&[BASE, GATEWAY, &spaced, &fractional]);
    assert!(route_condition(&c, "spaced", "Accepted").is_true());
    let backoff = |rule| rule_of(&c, "spaced", rule).0.map(|r| r.backoff_ms);
    assert_eq!(backoff(0), Some(1_500));
    assert_eq!(backoff(1), Some(60_000));
    let cond = route_condition(&c, "fractional", "Accepted");
    assert_eq!(
        (cond.status, cond.reason),
        (ConditionStatus::False, "UnsupportedValue")
    );
    assert!(cond.message.contains("retry.backoff"), "{}", cond.message);
}

#[test]
fn codes_outside_4xx_and_5xx_make_the_route_unacceptable() {
    // The CRD allows 400-599 only; an object stored under another schema must not turn a
    // success or a redirect into a retry.
    let redirect = route(
        "redirect",
        "  parentRefs: [{name: edge}]
  rules: [{backendRefs: [{name: echo, port: 8080}], retry: {codes: [503, 302]}}]
",
    );
    let c = compile_yaml(&[BASE, GATEWAY, &redirect]);
    let cond = route_condition(&c, "redirect", "Accepted");
    assert_eq!(
        (cond.status, cond.reason),
        (ConditionStatus::False, "UnsupportedValue")
    );
    assert!(
        cond.message.contains("retry.codes: 302"),
        "{}",
        cond.message
    );
}
