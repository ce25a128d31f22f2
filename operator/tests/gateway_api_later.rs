//! A cluster without the Gateway API: the controller becomes ready and serves Ingresses, and
//! once the CRDs are installed it serves Gateways too, without a restart.
//!
//! This test binary has a cluster of its own (every test binary does), so taking the CRDs
//! away cannot disturb other tests; they are restored at the end all the same.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_operator::controller;
use coxswain_testenv::{TestEnv, eventually};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use std::time::Duration;
use support::{SharedProxy, apply_yaml, free_port, get, local_controller_config};

const GROUP: &str = "gateway.networking.k8s.io";

async fn gateway_api_crds(crds: &Api<CustomResourceDefinition>) -> Vec<CustomResourceDefinition> {
    crds.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| c.spec.group == GROUP)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingresses_are_served_until_the_gateway_api_arrives_then_gateways_too() {
    let env = TestEnv::new().await;
    let ns = env.namespace.clone();
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    let installed = gateway_api_crds(&crds).await;
    assert!(
        installed.len() >= 5,
        "the cluster starts with the Gateway API"
    );
    for crd in &installed {
        let name = crd.metadata.name.clone().unwrap();
        crds.delete(&name, &DeleteParams::default()).await.unwrap();
    }
    eventually(
        "Gateway API CRDs removed",
        Duration::from_secs(60),
        || async { gateway_api_crds(&crds).await.is_empty().then_some(()) },
    )
    .await;

    let (discovery_port, bootstrap_port, health_port) = (free_port(), free_port(), free_port());
    let (ingress_port, ingress_tls_port) = (free_port(), free_port());
    let mut config = local_controller_config(
        &ns,
        "coxswain-labs.dev/gateway-controller",
        discovery_port,
        bootstrap_port,
    );
    config.ingress_ports = (ingress_port, ingress_tls_port);
    config.health_addr = Some(([127, 0, 0, 1], health_port).into());
    let (stop_ctl, ctl_stopped) = tokio::sync::oneshot::channel::<()>();
    let ctl = tokio::spawn(controller::run(env.client.clone(), config, async {
        let _ = ctl_stopped.await;
    }));
    let proxy = SharedProxy::start(&env, discovery_port, bootstrap_port, "proxy-0").await;

    // Absent kinds are not waited for: the controller gets ready and serves Ingresses.
    eventually(
        "/readyz without the Gateway API",
        Duration::from_secs(30),
        || async {
            get(health_port, "/readyz")
                .await
                .ok()
                .filter(|r| r.starts_with("HTTP/1.1 200"))
        },
    )
    .await;
    apply_yaml(
        &env.client,
        &format!(
            r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {{name: coxswain-{ns}}}
spec: {{controller: coxswain-labs.dev/gateway-controller}}
---
apiVersion: v1
kind: Service
metadata: {{name: app, namespace: {ns}}}
spec: {{ports: [{{port: 80}}]}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: app, namespace: {ns}}}
spec:
  ingressClassName: coxswain-{ns}
  rules:
  - host: app.example
    http:
      paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: app, port: {{number: 80}}}}}}}}]
"#
        ),
    )
    .await;
    // The Service has no endpoints: 503 from the proxy proves the Ingress route is there.
    eventually("the Ingress served", Duration::from_secs(30), || async {
        get(ingress_port, "/x")
            .await
            .ok()
            .filter(|r| r.starts_with("HTTP/1.1 503"))
    })
    .await;

    // The Gateway API arrives; nothing is restarted.
    for crd in &installed {
        let fresh = CustomResourceDefinition {
            metadata: ObjectMeta {
                name: crd.metadata.name.clone(),
                labels: crd.metadata.labels.clone(),
                annotations: crd.metadata.annotations.clone(),
                ..Default::default()
            },
            spec: crd.spec.clone(),
            status: None,
        };
        crds.create(&PostParams::default(), &fresh).await.unwrap();
    }
    let listen = free_port();
    let manifest = format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: coxswain-{ns}}}
spec: {{controllerName: coxswain-labs.dev/gateway-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: {ns}}}
spec:
  gatewayClassName: coxswain-{ns}
  listeners: [{{name: http, port: {listen}, protocol: HTTP}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: moved, namespace: {ns}}}
spec:
  parentRefs: [{{name: edge}}]
  rules:
  - filters: [{{type: RequestRedirect, requestRedirect: {{hostname: new.example, statusCode: 301}}}}]
"#
    );
    // Until each CRD is established its objects are refused; keep applying until they land.
    eventually(
        "Gateway API objects accepted by the API server",
        Duration::from_secs(60),
        || async { support::try_apply_yaml(&env.client, &manifest).await.ok() },
    )
    .await;
    eventually("the HTTPRoute served", Duration::from_secs(60), || async {
        get(listen, "/old")
            .await
            .ok()
            .filter(|r| r.starts_with("HTTP/1.1 301"))
    })
    .await;
    let gateways: Api<gateway_api::apis::standard::gateways::Gateway> = env.api();
    eventually(
        "the Gateway Programmed",
        Duration::from_secs(30),
        || async {
            let gw = gateways.get("edge").await.ok()?;
            gw.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Programmed" && c.status == "True")
                .then_some(())
        },
    )
    .await;
    // And the Ingress still answers.
    assert!(
        get(ingress_port, "/x")
            .await
            .unwrap()
            .starts_with("HTTP/1.1 503")
    );

    proxy.stop().await;
    let _ = stop_ctl.send(());
    ctl.await.unwrap().unwrap();
}
