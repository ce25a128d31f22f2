//! The controller role end to end on the local control plane: objects applied to the API server
//! reach a credential-less proxy through the reflector, the compiler and discovery, and the
//! proxy answers real HTTP from them.
//!
//! EndpointSlices may not hold loopback addresses, and nothing else on this machine is ours
//! to send traffic to until the test node gives pods addresses in their own network
//! namespaces (issue 10). So the routes here are answered by the proxy itself: a redirect, a
//! 503 for a Service without endpoints, a 404 where no route matches.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_operator::controller;
use coxswain_testenv::TestEnv;
use kube::Api;
use std::time::Duration;
use support::{SharedProxy, apply_yaml, free_port, get, local_controller_config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applied_routes_reach_the_proxy_and_serve_traffic() {
    let env = TestEnv::new().await;
    let ns = env.namespace.clone();
    let (discovery_port, bootstrap_port) = (free_port(), free_port());
    let mut config = local_controller_config(
        &ns,
        "coxswain-labs.dev/gateway-controller",
        discovery_port,
        bootstrap_port,
    );
    let health_port = free_port();
    config.health_addr = Some(([127, 0, 0, 1], health_port).into());
    config.lease = Some(coxswain_operator::leader::LeaseConfig {
        namespace: ns.clone(),
        name: "coxswain-leader".into(),
        identity: "controller-0".into(),
        duration: Duration::from_secs(5),
        renew_every: Duration::from_millis(500),
        pod: None,
    });
    let (stop_ctl, ctl_stopped) = tokio::sync::oneshot::channel::<()>();
    let ctl = tokio::spawn(controller::run(env.client.clone(), config, async {
        let _ = ctl_stopped.await;
    }));

    let proxy = SharedProxy::start(&env, discovery_port, bootstrap_port, "proxy-0").await;

    // Apply what a user would: a class, a Gateway, a Service with endpoints, a route.
    let listen = free_port();
    apply_yaml(
        &env.client,
        &format!(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: coxswain}}
spec: {{controllerName: coxswain-labs.dev/gateway-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: {ns}}}
spec:
  gatewayClassName: coxswain
  listeners: [{{name: http, port: {listen}, protocol: HTTP}}]
---
apiVersion: v1
kind: Service
metadata: {{name: app, namespace: {ns}}}
spec: {{ports: [{{port: 80}}]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: app, namespace: {ns}}}
spec:
  parentRefs: [{{name: edge}}]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /app}}}}]
    backendRefs: [{{name: app, port: 80}}]
  - matches: [{{path: {{type: PathPrefix, value: /old}}}}]
    filters: [{{type: RequestRedirect, requestRedirect: {{scheme: https, hostname: new.example, statusCode: 301}}}}]
---
# An experimental-channel filter: the authorization service (app) has no endpoints, so the
# route is served but fails closed.
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: experimental, namespace: {ns}}}
spec:
  parentRefs: [{{name: edge}}]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /ext}}}}]
    filters: [{{type: ExternalAuth, externalAuth: {{protocol: HTTP, http: {{}}, backendRef: {{name: app, port: 80}}}}}}]
    backendRefs: [{{name: app, port: 80}}]
"#
        ),
    )
    .await;

    let mut answer = String::new();
    for _ in 0..300 {
        if let Ok(r) = get(listen, "/old/page").await
            && r.starts_with("HTTP/1.1 301")
        {
            answer = r;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("location: https://new.example/old/page"),
        "the route never reached the proxy: {answer:?}"
    );
    assert!(
        get(listen, "/app/x")
            .await
            .unwrap()
            .starts_with("HTTP/1.1 503"),
        "no endpoints: 503"
    );
    assert!(
        get(listen, "/other")
            .await
            .unwrap()
            .starts_with("HTTP/1.1 404")
    );
    // The second HTTPRoute may reach the proxy in a later snapshot than the first: wait until
    // its path is routed (no longer 404), then it must be refused.
    let mut ext = String::new();
    for _ in 0..300 {
        ext = get(listen, "/ext/x").await.unwrap_or_default();
        if !ext.is_empty() && !ext.starts_with("HTTP/1.1 404") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        ext.starts_with("HTTP/1.1 503"),
        "an authorization service without endpoints: refused, never forwarded: {ext:?}"
    );

    // Status: what `kubectl get gateway -o yaml` shows a platform engineer.
    let gateways: Api<gateway_api::apis::standard::gateways::Gateway> = env.api();
    let condition =
        |conds: &Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>>,
         t: &str| {
            conds
                .iter()
                .flatten()
                .find(|c| c.type_ == t)
                .map(|c| (c.status.clone(), c.reason.clone()))
        };
    // Status follows the data plane once passes settle, so an earlier pass's status (one
    // route attached) may still be there when both routes already answer.
    let mut status = None;
    for _ in 0..200 {
        let gw = gateways.get("edge").await.unwrap();
        let st = gw.status.clone().unwrap_or_default();
        let attached = st
            .listeners
            .iter()
            .flatten()
            .map(|l| l.attached_routes)
            .sum::<i32>();
        if condition(&st.conditions, "Programmed") == Some(("True".into(), "Programmed".into()))
            && attached == 2
        {
            status = Some(st);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = status
        .expect("the Gateway never became Programmed (bound and acked) with both routes attached");
    assert_eq!(
        condition(&status.conditions, "Accepted"),
        Some(("True".into(), "Accepted".into()))
    );
    let listener = &status.listeners.as_ref().unwrap()[0];
    assert_eq!(listener.name, "http");
    assert_eq!(listener.attached_routes, 2);
    let listener_programmed = listener
        .conditions
        .iter()
        .find(|c| c.type_ == "Programmed")
        .unwrap();
    assert_eq!(listener_programmed.status, "True");

    // Route status is written after the Gateway's, in the same pass: wait for it too.
    let routes: Api<gateway_api::apis::experimental::httproutes::HttpRoute> = env.api();
    let mut parents = Vec::new();
    for _ in 0..200 {
        let route = routes.get("app").await.unwrap();
        if let Some(status) = route.status {
            parents = status.parents;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(parents.len(), 1);
    assert_eq!(
        parents[0].controller_name,
        "coxswain-labs.dev/gateway-controller"
    );
    let reasons: Vec<(String, String)> = parents[0]
        .conditions
        .iter()
        .map(|c| (c.type_.clone(), c.status.clone()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("Accepted".into(), "True".into()),
            ("ResolvedRefs".into(), "True".into())
        ]
    );

    let classes: Api<gateway_api::apis::standard::gatewayclasses::GatewayClass> =
        Api::all(env.client.clone());
    let class = classes.get("coxswain").await.unwrap();
    let class_conditions = class.status.unwrap().conditions;
    assert_eq!(
        condition(&class_conditions, "Accepted"),
        Some(("True".into(), "Accepted".into()))
    );
    // The local cluster runs the Gateway API release this controller supports.
    assert_eq!(
        condition(&class_conditions, "SupportedVersion"),
        Some(("True".into(), "SupportedVersion".into()))
    );

    // Statuses are server-side applied: the status subresource's fields belong to our manager.
    let gw = gateways.get("edge").await.unwrap();
    let managers: Vec<(String, String, String)> = gw
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|m| {
            (
                m.manager.clone().unwrap_or_default(),
                m.operation.clone().unwrap_or_default(),
                m.subresource.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        managers.contains(&(
            "coxswain-controller".into(),
            "Apply".into(),
            "status".into()
        )),
        "status not applied by coxswain-controller: {managers:?}"
    );

    // The controller's own endpoints: ready (caches listed, first compile done), leading.
    let ready = get(health_port, "/readyz").await.unwrap();
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    assert!(
        get(health_port, "/healthz")
            .await
            .unwrap()
            .starts_with("HTTP/1.1 200")
    );
    let metrics = get(health_port, "/metrics").await.unwrap();
    for line in [
        "coxswain_controller_leader 1",
        "coxswain_controller_ready 1",
        "coxswain_controller_connected_proxies 1",
        "coxswain_controller_objects{kind=\"Gateway\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line:?} missing from\n{metrics}"
        );
    }
    assert!(
        metrics.lines().any(|l| l.starts_with(
            "coxswain_controller_status_writes_total{kind=\"Gateway\",outcome=\"ok\"}"
        )),
        "{metrics}"
    );

    // The writer skips no-op patches: once settled, its own writes do not make it write again.
    let before = gateways
        .get("edge")
        .await
        .unwrap()
        .metadata
        .resource_version;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = gateways
        .get("edge")
        .await
        .unwrap()
        .metadata
        .resource_version;
    assert_eq!(
        before, after,
        "the status writer keeps rewriting an unchanged status"
    );

    // Invalid routes get the spec's reasons while the valid one keeps serving.
    let named_port = free_port();
    apply_yaml(
        &env.client,
        &format!(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: named, namespace: {ns}}}
spec:
  gatewayClassName: coxswain
  listeners: [{{name: http, port: {named_port}, protocol: HTTP, hostname: named.example}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: missing-backend, namespace: {ns}}}
spec:
  parentRefs: [{{name: edge}}]
  hostnames: [missing.example]
  rules: [{{backendRefs: [{{name: does-not-exist, port: 80}}]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: cross-namespace, namespace: {ns}}}
spec:
  parentRefs: [{{name: edge}}]
  hostnames: [cross.example]
  rules: [{{backendRefs: [{{name: kubernetes, namespace: default, port: 443}}]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: wrong-host, namespace: {ns}}}
spec:
  parentRefs: [{{name: named}}]
  hostnames: [elsewhere.example]
  rules: [{{backendRefs: [{{name: app, port: 80}}]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{name: rpc, namespace: {ns}}}
spec:
  parentRefs: [{{name: named}}]
  hostnames: [named.example]
  rules:
  - matches: [{{method: {{service: pkg.Echo}}}}]
    backendRefs: [{{name: no-grpc-here, port: 9000}}]
---
# HTTPRoute "app" (older, every hostname) has this listener's names: a GRPCRoute may not share
# them.
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{name: shadowed, namespace: {ns}}}
spec:
  parentRefs: [{{name: edge}}]
  hostnames: [rpc.example]
  rules: [{{backendRefs: [{{name: app, port: 80}}]}}]
---
# Its CA ConfigMap does not exist: the policy is not usable, and says so on the Gateway that
# sends to the Service.
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {{name: app-tls, namespace: {ns}}}
spec:
  targetRefs: [{{group: "", kind: Service, name: app}}]
  validation:
    hostname: app.internal
    caCertificateRefs: [{{group: "", kind: ConfigMap, name: no-such-ca}}]
"#
        ),
    )
    .await;
    // A GRPCRoute gets its status from the same writer: accepted, its missing backend named.
    let grpc_routes: Api<gateway_api::apis::standard::grpcroutes::GrpcRoute> = env.api();
    let grpc_status = coxswain_testenv::eventually(
        "the GRPCRoute's status",
        Duration::from_secs(30),
        || async {
            let r = grpc_routes.get("rpc").await.ok()?;
            let parent = r.status?.parents.into_iter().next()?;
            let of = |t: &str| {
                parent
                    .conditions
                    .iter()
                    .find(|c| c.type_ == t)
                    .map(|c| (c.status.clone(), c.reason.clone()))
            };
            let resolved = of("ResolvedRefs")?;
            (resolved.0 == "False")
                .then(|| (parent.controller_name.clone(), of("Accepted"), resolved))
        },
    )
    .await;
    assert_eq!(grpc_status.0, "coxswain-labs.dev/gateway-controller");
    assert_eq!(
        grpc_status.1,
        Some(("True".to_owned(), "Accepted".to_owned()))
    );
    assert_eq!(grpc_status.2.1, "BackendNotFound");
    coxswain_testenv::eventually(
        "the GRPCRoute sharing the HTTPRoute's hostnames is turned away",
        Duration::from_secs(30),
        || async {
            let r = grpc_routes.get("shadowed").await.ok()?;
            let parent = r.status?.parents.into_iter().next()?;
            parent
                .conditions
                .iter()
                .any(|c| {
                    c.type_ == "Accepted"
                        && c.status == "False"
                        && c.reason == "NotAllowedByListeners"
                        && c.message.contains("HTTPRoute")
                })
                .then_some(())
        },
    )
    .await;
    let policies: Api<gateway_api::apis::standard::backendtlspolicies::BackendTlsPolicy> =
        env.api();
    let ancestor = coxswain_testenv::eventually(
        "the BackendTLSPolicy's status",
        Duration::from_secs(30),
        || async {
            let p = policies.get("app-tls").await.ok()?;
            p.status?.ancestors.into_iter().next()
        },
    )
    .await;
    assert_eq!(
        (
            ancestor.ancestor_ref.kind.as_deref(),
            ancestor.ancestor_ref.name.as_str()
        ),
        (Some("Gateway"), "edge")
    );
    let of = |t: &str| {
        ancestor
            .conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    assert_eq!(
        of("Accepted"),
        Some(("False".to_owned(), "NoValidCACertificate".to_owned()))
    );
    assert_eq!(
        of("ResolvedRefs"),
        Some(("False".to_owned(), "InvalidCACertificateRef".to_owned()))
    );
    let reason_of = |route: &'static str, type_: &'static str| {
        let routes = routes.clone();
        async move {
            let r = routes.get(route).await.ok()?;
            let parent = r.status?.parents.into_iter().next()?;
            let c = parent.conditions.into_iter().find(|c| c.type_ == type_)?;
            Some((c.status, c.reason))
        }
    };
    for (route, type_, want) in [
        (
            "missing-backend",
            "ResolvedRefs",
            ("False", "BackendNotFound"),
        ),
        (
            "cross-namespace",
            "ResolvedRefs",
            ("False", "RefNotPermitted"),
        ),
        (
            "wrong-host",
            "Accepted",
            ("False", "NoMatchingListenerHostname"),
        ),
    ] {
        coxswain_testenv::eventually(
            &format!("{route}: {type_}={}/{}", want.0, want.1),
            Duration::from_secs(30),
            || async {
                let got = reason_of(route, type_).await?;
                (got.0 == want.0 && got.1 == want.1).then_some(())
            },
        )
        .await;
    }
    // Transitions a person should see are Events on the objects: the Gateway's Programmed,
    // and a Warning naming each broken route's problem.
    let events: Api<k8s_openapi::api::events::v1::Event> = env.api();
    let event_of = |kind: &'static str, name: &'static str, reason: &'static str| {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)
                }) && e.reason.as_deref() == Some(reason)
            })
        }
    };
    for (kind, name, reason, type_) in [
        ("Gateway", "edge", "Programmed", "Normal"),
        ("HTTPRoute", "missing-backend", "BackendNotFound", "Warning"),
        ("HTTPRoute", "cross-namespace", "RefNotPermitted", "Warning"),
        (
            "HTTPRoute",
            "wrong-host",
            "NoMatchingListenerHostname",
            "Warning",
        ),
    ] {
        let event = coxswain_testenv::eventually(
            &format!("{type_} event {reason} on {kind} {name}"),
            Duration::from_secs(30),
            || event_of(kind, name, reason),
        )
        .await;
        assert_eq!(event.type_.as_deref(), Some(type_));
        assert_eq!(
            event.reporting_controller.as_deref(),
            Some("coxswain-controller")
        );
    }
    let missing = event_of("HTTPRoute", "missing-backend", "BackendNotFound")
        .await
        .unwrap();
    let note = missing.note.unwrap_or_default();
    assert!(
        note.contains("ResolvedRefs=False") && note.contains("does-not-exist"),
        "the note says what is wrong: {note}"
    );
    // The valid route's good news is not announced: routes are many.
    assert!(event_of("HTTPRoute", "app", "Accepted").await.is_none());

    let still = get(listen, "/old/page").await.unwrap();
    assert!(
        still.starts_with("HTTP/1.1 301"),
        "the valid route serves on: {still}"
    );

    // A parent entry written by another controller survives this controller's writes.
    let current = routes.get("app").await.unwrap();
    let mut parents = serde_json::to_value(&current.status.unwrap().parents).unwrap();
    parents.as_array_mut().unwrap().push(serde_json::json!({
        "parentRef": {"name": "theirs", "group": "gateway.networking.k8s.io", "kind": "Gateway"},
        "controllerName": "example.com/other-controller",
        "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}],
    }));
    routes
        .patch_status(
            "app",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"status": {"parents": parents}})),
        )
        .await
        .unwrap();
    // Our entry must be rewritten: a new generation changes its observedGeneration.
    routes
        .patch(
            "app",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"hostnames": ["app.example"]}})),
        )
        .await
        .unwrap();
    let parents = coxswain_testenv::eventually(
        "our entry rewritten for generation 2",
        Duration::from_secs(30),
        || async {
            let r = routes.get("app").await.ok()?;
            let parents = r.status?.parents;
            let ours = parents
                .iter()
                .find(|p| p.controller_name == "coxswain-labs.dev/gateway-controller")?;
            ours.conditions
                .iter()
                .all(|c| c.observed_generation == Some(2))
                .then_some(parents)
        },
    )
    .await;
    let theirs = parents
        .iter()
        .find(|p| p.controller_name == "example.com/other-controller")
        .expect("the other controller's entry was dropped");
    assert_eq!(theirs.parent_ref.name, "theirs");

    // The route leaves our Gateway: the entry we wrote goes, theirs stays.
    routes
        .patch(
            "app",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"spec": {"parentRefs": [{"name": "theirs"}]}}),
            ),
        )
        .await
        .unwrap();
    let parents = coxswain_testenv::eventually(
        "our entry removed once the route no longer names our Gateway",
        Duration::from_secs(30),
        || async {
            let parents = routes.get("app").await.ok()?.status?.parents;
            parents
                .iter()
                .all(|p| p.controller_name != "coxswain-labs.dev/gateway-controller")
                .then_some(parents)
        },
    )
    .await;
    assert_eq!(
        parents
            .iter()
            .map(|p| p.controller_name.as_str())
            .collect::<Vec<_>>(),
        ["example.com/other-controller"]
    );

    proxy.stop().await;
    let _ = stop_ctl.send(());
    ctl.await.unwrap().unwrap();
}

/// Under --ingress-nginx-compat: an ingress-nginx style Ingress gets exactly one Warning Event,
/// for its snippet, and keeps it at one across recompiles; refused annotations and a broken
/// class parameters reference are Warning Events too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_annotation_findings_are_warning_events() {
    let env = TestEnv::new().await;
    let ns = env.namespace.clone();
    // A controller name of its own: the other test's controller leaves these objects alone.
    let controller_name = "coxswain-labs.dev/events-test";
    let mut config = local_controller_config(&ns, controller_name, free_port(), free_port());
    config.ingress_ports = (free_port(), free_port());
    config.ingress_nginx_compat = true;
    let (stop_ctl, ctl_stopped) = tokio::sync::oneshot::channel::<()>();
    let ctl = tokio::spawn(controller::run(env.client.clone(), config, async {
        let _ = ctl_stopped.await;
    }));
    apply_yaml(
        &env.client,
        &format!(
            r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {{name: events-{ns}}}
spec:
  controller: {controller_name}
  parameters: {{apiGroup: example.com, kind: Tuning, name: fast}}
---
apiVersion: v1
kind: Service
metadata: {{name: app, namespace: {ns}}}
spec: {{ports: [{{port: 80}}]}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: legacy
  namespace: {ns}
  annotations:
    nginx.ingress.kubernetes.io/rewrite-target: /$2
    nginx.ingress.kubernetes.io/ssl-redirect: "true"
    nginx.ingress.kubernetes.io/enable-cors: "true"
    nginx.ingress.kubernetes.io/cors-allow-origin: https://app.example
    nginx.ingress.kubernetes.io/configuration-snippet: |
      more_set_headers "X-Frame-Options: DENY";
spec:
  ingressClassName: events-{ns}
  rules:
  - host: legacy.example
    http:
      paths:
      - {{path: /app(/|$)(.*), pathType: ImplementationSpecific, backend: {{service: {{name: app, port: {{number: 80}}}}}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: refused
  namespace: {ns}
  annotations:
    ingress.coxswain-labs.dev/read-timeout: soon
    ingress.coxswain-labs.dev/allowlist-source-range: 10.0.0.0/33
spec:
  ingressClassName: events-{ns}
  rules:
  - host: refused.example
    http:
      paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: app, port: {{number: 80}}}}}}}}]
"#
        ),
    )
    .await;
    let events: Api<k8s_openapi::api::events::v1::Event> = env.api();
    let class_events: Api<k8s_openapi::api::events::v1::Event> = Api::all(env.client.clone());
    let warnings = |api: Api<k8s_openapi::api::events::v1::Event>,
                    kind: &'static str,
                    name: String| async move {
        let list = api.list(&Default::default()).await.unwrap();
        list.items
            .into_iter()
            .filter(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.regarding.as_ref().is_some_and(|r| {
                        r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name.as_str())
                    })
            })
            .map(|e| {
                (
                    e.reason.unwrap_or_default(),
                    e.note.unwrap_or_default(),
                    e.deprecated_count.unwrap_or(1),
                )
            })
            .collect::<Vec<_>>()
    };
    let refused = coxswain_testenv::eventually(
        "Warnings on the Ingress with refused annotations",
        Duration::from_secs(30),
        || async {
            let w = warnings(events.clone(), "Ingress", "refused".into()).await;
            (w.len() >= 2).then_some(w)
        },
    )
    .await;
    let find = |reason: &str, annotation: &str| {
        refused
            .iter()
            .any(|(r, note, _)| r == reason && note.starts_with(annotation))
    };
    assert!(
        find(
            "AnnotationIgnored",
            "ingress.coxswain-labs.dev/read-timeout"
        ),
        "{refused:?}"
    );
    assert!(
        find(
            "AnnotationFailedClosed",
            "ingress.coxswain-labs.dev/allowlist-source-range"
        ),
        "{refused:?}"
    );
    let class = coxswain_testenv::eventually(
        "a Warning on the IngressClass with a foreign parameters kind",
        Duration::from_secs(30),
        || async {
            let w = warnings(class_events.clone(), "IngressClass", format!("events-{ns}")).await;
            w.into_iter().next()
        },
    )
    .await;
    assert_eq!(class.0, "InvalidParameters");
    assert!(class.1.contains("Tuning"), "{}", class.1);

    let legacy =
        coxswain_testenv::eventually("the snippet's Warning", Duration::from_secs(30), || async {
            let w = warnings(events.clone(), "Ingress", "legacy".into()).await;
            (!w.is_empty()).then_some(w)
        })
        .await;
    // Other objects keep the controller recompiling; the Warning must not repeat.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let legacy_after = warnings(events.clone(), "Ingress", "legacy".into()).await;
    assert_eq!(legacy, legacy_after);
    assert_eq!(legacy.len(), 1, "exactly one Warning: {legacy:?}");
    let (reason, note, count) = &legacy[0];
    assert_eq!(reason, "SnippetIgnored");
    assert_eq!(*count, 1);
    assert!(
        note.starts_with("nginx.ingress.kubernetes.io/configuration-snippet"),
        "{note}"
    );

    let _ = stop_ctl.send(());
    ctl.await.unwrap().unwrap();
}

/// Coxswain's own kinds carry status: Accepted with a reason and message to act on,
/// observedGeneration, and the classes and Gateways that use them; `kubectl get` shows it in
/// the ACCEPTED column. Fixing the object turns it Accepted for the new generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameters_objects_say_whether_they_are_accepted_and_who_uses_them() {
    use coxswain_api::{CoxswainGatewayParameters, CoxswainIngressClassParameters};
    use kube::api::{Patch, PatchParams};
    let env = TestEnv::new().await;
    let ns = env.namespace.clone();
    let controller_name = "coxswain-labs.dev/parameters-test";
    let mut config = local_controller_config(&ns, controller_name, free_port(), free_port());
    config.ingress_ports = (free_port(), free_port());
    let (stop_ctl, ctl_stopped) = tokio::sync::oneshot::channel::<()>();
    let ctl = tokio::spawn(controller::run(env.client.clone(), config, async {
        let _ = ctl_stopped.await;
    }));
    apply_yaml(
        &env.client,
        &format!(
            r#"
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainGatewayParameters
metadata: {{name: class-params, namespace: {ns}}}
spec:
  podTemplate: {{spec: {{containers: [{{image: example.invalid/sidecar:1}}]}}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: params-{ns}}}
spec:
  controllerName: {controller_name}
  parametersRef: {{group: gateway.coxswain-labs.dev, kind: CoxswainGatewayParameters, name: class-params, namespace: {ns}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: {ns}}}
spec:
  gatewayClassName: params-{ns}
  listeners: [{{name: http, port: 8080, protocol: HTTP}}]
---
apiVersion: ingress.coxswain-labs.dev/v1alpha1
kind: CoxswainIngressClassParameters
metadata: {{name: defaults, namespace: {ns}}}
spec:
  defaultAnnotations: {{ingress.coxswain-labs.dev/read-timout: 30s}}
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {{name: params-{ns}}}
spec:
  controller: {controller_name}
  parameters: {{apiGroup: ingress.coxswain-labs.dev, kind: CoxswainIngressClassParameters, name: defaults, namespace: {ns}, scope: Namespace}}
"#
        ),
    )
    .await;

    let gwp: Api<CoxswainGatewayParameters> = env.api();
    let accepted = |status: Option<serde_json::Value>| {
        let status = status?;
        let c = status["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Accepted")?
            .clone();
        Some((status, c))
    };
    // Objects reach the controller one at a time: the condition can be written a pass
    // before the Gateway using the parameters is known, so wait for both.
    let (status, condition) = coxswain_testenv::eventually(
        "CoxswainGatewayParameters Accepted=False, used by the Gateway",
        Duration::from_secs(30),
        || async {
            let p = gwp.get("class-params").await.ok()?;
            let (status, c) = accepted(serde_json::to_value(p.status?).ok())?;
            (c["status"] == "False" && status["gateways"].is_array()).then_some((status, c))
        },
    )
    .await;
    assert_eq!(condition["reason"], "InvalidPodTemplate", "{condition}");
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.contains("spec.containers[0] has no name") && message.contains("spec.podTemplate"),
        "{message}"
    );
    assert_eq!(condition["observedGeneration"], 1);
    assert_eq!(status["observedGeneration"], 1);
    assert_eq!(
        status["gatewayClasses"],
        serde_json::json!([format!("params-{ns}")])
    );
    assert_eq!(
        status["gateways"],
        serde_json::json!([{"namespace": ns, "name": "edge"}])
    );

    // What a person sees.
    let kubectl = |args: Vec<String>| {
        let out = env.cluster().kubectl().args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The cell under a column's header (kubectl aligns them; empty cells are blank).
    let cell = |table: &str, column: &str| {
        let mut lines = table.lines();
        let at = lines.next().unwrap().find(column).unwrap();
        lines.next().unwrap()[at..]
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    let table = kubectl(vec!["get".into(), "cxgwp".into(), "-n".into(), ns.clone()]);
    assert_eq!(cell(&table, "ACCEPTED"), "False", "{table}");

    // A Warning Event on the object says the same.
    let events: Api<k8s_openapi::api::events::v1::Event> = env.api();
    coxswain_testenv::eventually(
        "a Warning Event on the parameters",
        Duration::from_secs(30),
        || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("InvalidPodTemplate")
                        && e.regarding
                            .as_ref()
                            .is_some_and(|r| r.name.as_deref() == Some("class-params"))
                })
                .map(|_| ())
        },
    )
    .await;

    // Fixed: the container is named; generation 2 is Accepted.
    let fix = serde_json::json!({"spec": {"podTemplate": {"spec": {"containers": [
        {"name": "sidecar", "image": "example.invalid/sidecar:1"}]}}}});
    gwp.patch("class-params", &PatchParams::default(), &Patch::Merge(&fix))
        .await
        .unwrap();
    let condition = coxswain_testenv::eventually(
        "CoxswainGatewayParameters Accepted=True for generation 2",
        Duration::from_secs(30),
        || async {
            let p = gwp.get("class-params").await.ok()?;
            let (status, c) = accepted(serde_json::to_value(p.status?).ok())?;
            (c["status"] == "True" && status["observedGeneration"] == 2).then_some(c)
        },
    )
    .await;
    assert_eq!(condition["reason"], "Accepted");
    assert_eq!(condition["observedGeneration"], 2);
    // The fix is announced once, and the problem was told once.
    let told = |reason: &'static str| {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await.unwrap();
            list.items
                .into_iter()
                .filter(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.regarding
                            .as_ref()
                            .is_some_and(|r| r.name.as_deref() == Some("class-params"))
                })
                .map(|e| e.deprecated_count.unwrap_or(1))
                .sum::<i32>()
        }
    };
    coxswain_testenv::eventually(
        "a Normal Event for the fix",
        Duration::from_secs(30),
        || async { (told("Accepted").await == 1).then_some(()) },
    )
    .await;
    assert_eq!(told("InvalidPodTemplate").await, 1);
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains(&format!("GatewayClass params-{ns} and 1 Gateway(s)")),
        "{condition}"
    );

    let icp: Api<CoxswainIngressClassParameters> = env.api();
    let (status, condition) = coxswain_testenv::eventually(
        "CoxswainIngressClassParameters Accepted=False",
        Duration::from_secs(30),
        || async {
            let p = icp.get("defaults").await.ok()?;
            let (status, c) = accepted(serde_json::to_value(p.status?).ok())?;
            (c["status"] == "False" && status["ingressClasses"].is_array()).then_some((status, c))
        },
    )
    .await;
    assert_eq!(condition["reason"], "InvalidDefaultAnnotations");
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("ingress.coxswain-labs.dev/read-timout"),
        "{condition}"
    );
    assert_eq!(
        status["ingressClasses"],
        serde_json::json!([format!("params-{ns}")])
    );
    assert_eq!(status["observedGeneration"], 1);
    let table = kubectl(vec!["get".into(), "cxicp".into(), "-n".into(), ns.clone()]);
    assert_eq!(cell(&table, "ACCEPTED"), "False", "{table}");

    let _ = stop_ctl.send(());
    ctl.await.unwrap().unwrap();
}
