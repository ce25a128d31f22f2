//! TLSRoutes, read as HTTPRoutes with neither matches nor filters: a passthrough listener
//! chooses by the ClientHello's SNI alone, so a TLSRoute is hostnames and weighted backends,
//! which is an HTTPRoute whose rules match every request. The route compiler then attaches
//! and resolves them like other routes; [`RouteKind::Tls`] keeps them on TLS listeners and
//! names them in status and ReferenceGrants.

use super::route::{RouteForm, RouteKind};
use gateway_api::apis::experimental::httproutes as http;
use gateway_api::apis::standard::tlsroutes::TlsRoute;

/// `route` in the shared form. Every TLSRoute has one.
pub fn as_route_form<'a>(route: &TlsRoute) -> RouteForm<'a> {
    let parent_refs = route.spec.parent_refs.as_ref().map(|refs| {
        refs.iter()
            .map(|p| http::HttpRouteParentRefs {
                group: p.group.clone(),
                kind: p.kind.clone(),
                name: p.name.clone(),
                namespace: p.namespace.clone(),
                port: p.port,
                section_name: p.section_name.clone(),
            })
            .collect()
    });
    let rules = route
        .spec
        .rules
        .iter()
        .map(|r| http::HttpRouteRules {
            name: r.name.clone(),
            backend_refs: Some(
                r.backend_refs
                    .iter()
                    .map(|b| http::HttpRouteRulesBackendRefs {
                        group: b.group.clone(),
                        kind: b.kind.clone(),
                        name: b.name.clone(),
                        namespace: b.namespace.clone(),
                        port: b.port,
                        weight: b.weight,
                        filters: None,
                    })
                    .collect(),
            ),
            ..Default::default()
        })
        .collect();
    let spec = http::HttpRouteSpec {
        parent_refs,
        hostnames: Some(route.spec.hostnames.clone()),
        rules: Some(rules),
        ..Default::default()
    };
    RouteForm::equivalent(RouteKind::Tls, &route.metadata, spec, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames_and_weighted_backends_carry_over() {
        let route: TlsRoute = serde_yaml::from_str(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {name: db, namespace: ns}
spec:
  parentRefs: [{name: gw, sectionName: tls}]
  hostnames: [db.example.com]
  rules:
  - name: primary
    backendRefs: [{name: a, port: 5432, weight: 3}, {name: b, port: 5432}]
"#,
        )
        .expect("TLSRoute fixture");
        let RouteForm {
            route: http,
            problem,
            ..
        } = as_route_form(&route);
        assert_eq!(problem, None);
        assert_eq!(
            http.spec.hostnames.as_deref(),
            Some(&["db.example.com".to_owned()][..])
        );
        let parent = &http.spec.parent_refs.as_ref().expect("parents")[0];
        assert_eq!(parent.section_name.as_deref(), Some("tls"));
        let rule = &http.spec.rules.as_ref().expect("rules")[0];
        assert_eq!(rule.name.as_deref(), Some("primary"));
        assert!(rule.matches.is_none() && rule.filters.is_none());
        let backends = rule.backend_refs.as_ref().expect("backends");
        assert_eq!(
            backends
                .iter()
                .map(|b| (b.name.as_str(), b.weight))
                .collect::<Vec<_>>(),
            [("a", Some(3)), ("b", None)]
        );
    }
}
