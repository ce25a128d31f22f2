//! TLSRoutes, read as HTTPRoutes with neither matches nor filters: a passthrough listener
//! chooses by the ClientHello's SNI alone, so a TLSRoute is hostnames and weighted backends,
//! which is an HTTPRoute whose rules match every request. [`super::httproute`] then attaches
//! and resolves them like other routes; [`super::httproute::RouteKind::Tls`] keeps them on TLS
//! listeners and names them in status and ReferenceGrants.

use super::httproute::equivalent_route;
use super::status::Problem;
use gateway_api::apis::experimental::httproutes::HttpRoute;
use gateway_api::apis::standard::tlsroutes::TlsRoute;
use serde_json::json;

/// The HTTPRoute equivalent of `route`, and a problem when it has none (then only its parents
/// are kept, so the route can be told why it is not accepted).
pub fn as_http_route(route: &TlsRoute) -> (HttpRoute, Option<Problem>) {
    let rules: Vec<_> = route
        .spec
        .rules
        .iter()
        .map(|r| json!({"name": r.name, "backendRefs": r.backend_refs}))
        .collect();
    equivalent_route(
        "TLSRoute",
        &route.metadata,
        &route.spec.parent_refs,
        &route.spec.hostnames,
        Some(rules),
    )
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
        let (http, problem) = as_http_route(&route);
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
