//! A ListenerSet's listeners in the Gateway's own listener type, so one validator
//! ([`super::listeners`]) serves both. The generated types differ by name only; the fields are
//! the same, field by field, and each is carried over here (no JSON round trip that would drop
//! a field silently if the two ever diverged: the compiler would say so).

use gateway_api::apis::standard::gateways::{
    GatewayAllowedListenersNamespacesSelector, GatewayListeners, GatewayListenersAllowedRoutes,
    GatewayListenersAllowedRoutesKinds, GatewayListenersAllowedRoutesNamespaces,
    GatewayListenersAllowedRoutesNamespacesFrom, GatewayListenersAllowedRoutesNamespacesSelector,
    GatewayListenersAllowedRoutesNamespacesSelectorMatchExpressions, GatewayListenersTls,
    GatewayListenersTlsCertificateRefs, GatewayListenersTlsMode,
};
use gateway_api::apis::standard::listenersets::{
    ListenerSetListeners, ListenerSetListenersAllowedRoutesNamespacesFrom,
    ListenerSetListenersTlsMode,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

/// A ListenerSet listener as a Gateway listener.
pub fn as_gateway_listener(l: &ListenerSetListeners) -> GatewayListeners {
    GatewayListeners {
        name: l.name.clone(),
        hostname: l.hostname.clone(),
        port: l.port,
        protocol: l.protocol.clone(),
        allowed_routes: l
            .allowed_routes
            .as_ref()
            .map(|a| GatewayListenersAllowedRoutes {
                kinds: a.kinds.as_ref().map(|kinds| {
                    kinds
                        .iter()
                        .map(|k| GatewayListenersAllowedRoutesKinds {
                            group: k.group.clone(),
                            kind: k.kind.clone(),
                        })
                        .collect()
                }),
                namespaces: a.namespaces.as_ref().map(|n| {
                    GatewayListenersAllowedRoutesNamespaces {
                        from: n.from.as_ref().map(|f| match f {
                            ListenerSetListenersAllowedRoutesNamespacesFrom::All => {
                                GatewayListenersAllowedRoutesNamespacesFrom::All
                            }
                            ListenerSetListenersAllowedRoutesNamespacesFrom::Selector => {
                                GatewayListenersAllowedRoutesNamespacesFrom::Selector
                            }
                            ListenerSetListenersAllowedRoutesNamespacesFrom::Same => {
                                GatewayListenersAllowedRoutesNamespacesFrom::Same
                            }
                        }),
                        selector: n.selector.as_ref().map(|s| {
                            GatewayListenersAllowedRoutesNamespacesSelector {
                                match_labels: s.match_labels.clone(),
                                match_expressions: s.match_expressions.as_ref().map(|es| {
                                    es.iter()
                                        .map(|e| {
                                            GatewayListenersAllowedRoutesNamespacesSelectorMatchExpressions {
                                                key: e.key.clone(),
                                                operator: e.operator.clone(),
                                                values: e.values.clone(),
                                            }
                                        })
                                        .collect()
                                }),
                            }
                        }),
                    }
                }),
            }),
        tls: l.tls.as_ref().map(|t| GatewayListenersTls {
            certificate_refs: t.certificate_refs.as_ref().map(|refs| {
                refs.iter()
                    .map(|r| GatewayListenersTlsCertificateRefs {
                        group: r.group.clone(),
                        kind: r.kind.clone(),
                        name: r.name.clone(),
                        namespace: r.namespace.clone(),
                    })
                    .collect()
            }),
            mode: t.mode.as_ref().map(|m| match m {
                ListenerSetListenersTlsMode::Terminate => GatewayListenersTlsMode::Terminate,
                ListenerSetListenersTlsMode::Passthrough => GatewayListenersTlsMode::Passthrough,
            }),
            options: t.options.clone(),
        }),
    }
}

/// A Gateway's `spec.allowedListeners.namespaces.selector` as a Kubernetes label selector.
pub fn label_selector(s: &GatewayAllowedListenersNamespacesSelector) -> LabelSelector {
    LabelSelector {
        match_labels: s.match_labels.clone(),
        match_expressions: s.match_expressions.as_ref().map(|es| {
            es.iter()
                .map(|e| LabelSelectorRequirement {
                    key: e.key.clone(),
                    operator: e.operator.clone(),
                    values: e.values.clone(),
                })
                .collect()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field of a ListenerSet listener arrives in the Gateway listener: compared through
    /// their YAML, which names the fields the same way.
    #[test]
    fn a_listener_set_listener_keeps_every_field() {
        let yaml = r#"
name: https
hostname: "*.example.com"
port: 8443
protocol: HTTPS
allowedRoutes:
  kinds: [{group: gateway.networking.k8s.io, kind: HTTPRoute}]
  namespaces:
    from: Selector
    selector:
      matchLabels: {team: web}
      matchExpressions: [{key: tier, operator: In, values: [edge]}]
tls:
  mode: Terminate
  certificateRefs: [{group: "", kind: Secret, name: cert, namespace: other}]
  options: {example.com/cipher: fast}
"#;
        let from: ListenerSetListeners = serde_yaml::from_str(yaml).unwrap();
        let want: GatewayListeners = serde_yaml::from_str(yaml).unwrap();
        assert_eq!(as_gateway_listener(&from), want);
        let bare: ListenerSetListeners =
            serde_yaml::from_str("{name: h, port: 80, protocol: HTTP}").unwrap();
        let want: GatewayListeners =
            serde_yaml::from_str("{name: h, port: 80, protocol: HTTP}").unwrap();
        assert_eq!(as_gateway_listener(&bare), want);
    }

    #[test]
    fn an_allowed_listeners_selector_is_a_label_selector() {
        let yaml = "{matchLabels: {team: web}, matchExpressions: [{key: tier, operator: NotIn, values: [x]}]}";
        let from: GatewayAllowedListenersNamespacesSelector = serde_yaml::from_str(yaml).unwrap();
        let want: LabelSelector = serde_yaml::from_str(yaml).unwrap();
        assert_eq!(label_selector(&from), want);
    }
}
