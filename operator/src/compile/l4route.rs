//! TLSRoutes, TCPRoutes and UDPRoutes, read as HTTPRoutes with neither matches nor filters: a
//! relayed connection (or UDP flow) is chosen by the ClientHello's SNI alone (TLS) or by its
//! port alone (TCP, UDP), so such a route is hostnames (TLS only) and weighted backends, which
//! is an HTTPRoute whose rules match every request. The route compiler then attaches and
//! resolves them like other routes; their [`RouteKind`] keeps them on listeners of their
//! protocol and names them in status and ReferenceGrants.

use super::route::{RouteForm, RouteKind};
use gateway_api::apis::experimental::httproutes as http;
use gateway_api::apis::experimental::tcproutes::TcpRoute;
use gateway_api::apis::experimental::udproutes::UdpRoute;
use gateway_api::apis::standard::tlsroutes::TlsRoute;

/// The shared form of a route whose generated type has the parentRefs and rules (backendRefs
/// only) of TLSRoute, TCPRoute and UDPRoute: the fields agree, the types are distinct.
macro_rules! relayed_route_form {
    ($kind:expr, $route:expr, $hostnames:expr) => {{
        let route = $route;
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
            hostnames: $hostnames,
            rules: Some(rules),
            ..Default::default()
        };
        RouteForm::equivalent($kind, &route.metadata, spec, None)
    }};
}

/// A TLSRoute in the shared form. Every TLSRoute has one.
pub fn tls_route_form<'a>(route: &TlsRoute) -> RouteForm<'a> {
    relayed_route_form!(RouteKind::Tls, route, Some(route.spec.hostnames.clone()))
}

/// A TCPRoute in the shared form: no hostnames, so it serves whatever arrives on the port.
pub fn tcp_route_form<'a>(route: &TcpRoute) -> RouteForm<'a> {
    relayed_route_form!(RouteKind::Tcp, route, None)
}

/// A UDPRoute in the shared form: no hostnames, like a TCPRoute.
pub fn udp_route_form<'a>(route: &UdpRoute) -> RouteForm<'a> {
    relayed_route_form!(RouteKind::Udp, route, None)
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
        } = tls_route_form(&route);
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

    #[test]
    fn a_tcp_route_has_no_hostnames_and_keeps_its_backends() {
        let route: TcpRoute = serde_yaml::from_str(
            r#"
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: {name: db, namespace: ns}
spec:
  parentRefs: [{name: gw, sectionName: tcp, port: 5432}]
  rules:
  - backendRefs: [{name: a, port: 5432, weight: 9}, {name: b, port: 5432, weight: 1}]
"#,
        )
        .expect("TCPRoute fixture");
        let form = tcp_route_form(&route);
        assert_eq!((form.kind, form.problem), (RouteKind::Tcp, None));
        assert_eq!(form.route.spec.hostnames, None);
        let parent = &form.route.spec.parent_refs.as_ref().expect("parents")[0];
        assert_eq!(
            (parent.section_name.as_deref(), parent.port),
            (Some("tcp"), Some(5432))
        );
        let rule = &form.route.spec.rules.as_ref().expect("rules")[0];
        let backends = rule.backend_refs.as_ref().expect("backends");
        assert_eq!(
            backends
                .iter()
                .map(|b| (b.name.as_str(), b.weight))
                .collect::<Vec<_>>(),
            [("a", Some(9)), ("b", Some(1))]
        );
    }
}
