//! ListenerSets (GEP-1713): listeners added to a Gateway that allows them.

use super::fixtures::*;
use crate::compile::status::{Condition, ConditionStatus};

const LISTENER_SETS: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: parent, namespace: web, generation: 1}
spec:
  gatewayClassName: coxswain
  allowedListeners: {namespaces: {from: Selector, selector: {matchLabels: {team: web}}}}
  listeners:
  - {name: main, port: 80, protocol: HTTP, hostname: main.example, allowedRoutes: {namespaces: {from: All}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: extra, namespace: web, generation: 2, creationTimestamp: "2026-01-01T00:00:00Z"}
spec:
  parentRef: {name: parent}
  listeners:
  - {name: a, port: 80, protocol: HTTP, hostname: a.example}
  - {name: main, port: 80, protocol: HTTP, hostname: main.example}
  - {name: tcp, port: 80, protocol: TCP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: later, namespace: web, generation: 1, creationTimestamp: "2026-01-02T00:00:00Z"}
spec:
  parentRef: {name: parent}
  listeners:
  - {name: a, port: 80, protocol: HTTP, hostname: a.example}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: elsewhere, namespace: other, generation: 1}
spec:
  parentRef: {name: parent, namespace: web}
  listeners:
  - {name: b, port: 80, protocol: HTTP, hostname: b.example}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: on-set, namespace: web}
spec:
  parentRefs: [{kind: ListenerSet, name: extra}]
  rules: [{backendRefs: [{name: echo, port: 8080}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: on-gateway, namespace: web}
spec:
  parentRefs: [{name: parent}]
  rules: [{backendRefs: [{name: echo, port: 8080}]}]
"#;

fn set_listener_condition<'a>(
    listeners: &'a [crate::compile::status::ListenerStatus],
    name: &str,
    type_: &str,
) -> &'a Condition {
    let l = listeners
        .iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no listener {name}"));
    find(&l.conditions, type_)
}

// Gateway API ListenerSet (GEP-1713): a Gateway takes ListenerSets only from the namespaces
// its allowedListeners names; their listeners join its own, which win a conflict, then the
// older ListenerSet; routes reach a ListenerSet's listeners through a parentRef to it.
#[test]
fn listener_sets_add_listeners_to_their_gateway() {
    let c = compile_yaml(&[BASE, LISTENER_SETS]);
    let sets = &c.status.listener_sets;

    let refused = &sets[&key("other", "elsewhere")];
    let accepted = find(&refused.conditions, "Accepted");
    assert_eq!(
        (accepted.status, accepted.reason),
        (ConditionStatus::False, "NotAllowed")
    );
    assert!(
        accepted.message.contains("namespace other"),
        "{}",
        accepted.message
    );
    assert_eq!(find(&refused.conditions, "Programmed").reason, "NotAllowed");

    let extra = &sets[&key("web", "extra")];
    let accepted = find(&extra.conditions, "Accepted");
    assert_eq!(
        (
            accepted.status,
            accepted.reason,
            accepted.observed_generation
        ),
        (ConditionStatus::True, "ListenersNotValid", 2)
    );
    assert!(set_listener_condition(&extra.listeners, "a", "Accepted").is_true());
    for (name, why) in [("main", "HostnameConflict"), ("tcp", "ProtocolConflict")] {
        for type_ in ["Accepted", "Programmed"] {
            let cond = set_listener_condition(&extra.listeners, name, type_);
            assert_eq!(
                (cond.status, cond.reason),
                (ConditionStatus::False, why),
                "{name}"
            );
        }
        let conflicted = set_listener_condition(&extra.listeners, name, "Conflicted");
        assert_eq!(
            (conflicted.status, conflicted.reason),
            (ConditionStatus::True, why)
        );
    }
    // The Gateway's own listener keeps its place.
    let gw = &c.status.gateways[&key("web", "parent")];
    assert!(set_listener_condition(&gw.listeners, "main", "Accepted").is_true());
    assert_eq!(
        set_listener_condition(&gw.listeners, "main", "Conflicted").status,
        ConditionStatus::False
    );
    // The younger ListenerSet loses a.example to the older one.
    let later = &sets[&key("web", "later")];
    let accepted = find(&later.conditions, "Accepted");
    assert_eq!(
        (accepted.status, accepted.reason),
        (ConditionStatus::False, "ListenersNotValid")
    );
    assert_eq!(
        set_listener_condition(&later.listeners, "a", "Conflicted").reason,
        "HostnameConflict"
    );
    assert_eq!(gw.attached_listener_sets, 1);

    // Each route is served only on its parent's listeners, and reported against it.
    let s = shared(&c);
    assert_eq!(routes_for(s, 80, "a.example"), ["on-set/0"]);
    assert_eq!(routes_for(s, 80, "main.example"), ["on-gateway/0"]);
    let listener = s.listeners.iter().find(|l| l.port == 80).unwrap();
    assert!(
        listener
            .sources
            .contains(&"ListenerSet/web/extra/a".to_owned()),
        "{:?}",
        listener.sources
    );
    let parent = &c.status.http_routes[&key("web", "on-set")][0];
    assert_eq!(
        (
            parent.parent_ref.kind.as_str(),
            parent.parent_ref.name.as_str()
        ),
        ("ListenerSet", "extra")
    );
    assert!(find(&parent.conditions, "Accepted").is_true());
    assert_eq!(
        set_listener_condition(&extra.listeners, "a", "Accepted").observed_generation,
        2
    );
    assert_eq!(
        extra
            .listeners
            .iter()
            .find(|l| l.name == "a")
            .unwrap()
            .attached_routes,
        1
    );
    assert_eq!(gw.listeners[0].attached_routes, 1);
}

// A Gateway takes no ListenerSet unless spec.allowedListeners says so.
#[test]
fn listener_sets_are_refused_by_default() {
    let c = compile_yaml(&[
        BASE,
        GATEWAY,
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: extra, namespace: web}
spec:
  parentRef: {name: edge}
  listeners: [{name: a, port: 80, protocol: HTTP, hostname: a.example}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: on-refused, namespace: web}
spec:
  parentRefs: [{kind: ListenerSet, name: extra}]
  rules: [{backendRefs: [{name: echo, port: 8080}]}]
"#,
    ]);
    let status = &c.status.listener_sets[&key("web", "extra")];
    let accepted = find(&status.conditions, "Accepted");
    assert_eq!(
        (accepted.status, accepted.reason),
        (ConditionStatus::False, "NotAllowed")
    );
    assert!(
        accepted.message.contains("allowedListeners"),
        "{}",
        accepted.message
    );
    assert_eq!(
        c.status.gateways[&key("web", "edge")].attached_listener_sets,
        0
    );
    // A route attached to it is told, not left without a word.
    let parent = &c.status.http_routes[&key("web", "on-refused")][0];
    assert_eq!(parent.parent_ref.kind, "ListenerSet");
    let accepted = find(&parent.conditions, "Accepted");
    assert_eq!(
        (accepted.status, accepted.reason),
        (ConditionStatus::False, "NoMatchingParent")
    );
    assert!(
        accepted.message.contains("not accepted"),
        "{}",
        accepted.message
    );
}
