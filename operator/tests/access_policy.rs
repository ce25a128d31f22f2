//! CoxswainAccessPolicy status on the local control plane, in a cluster of its own: other
//! tests' controllers would add their own entries to every policy's shared ancestors list.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_api::CoxswainAccessPolicy;
use coxswain_operator::controller;
use coxswain_testenv::TestEnv;
use kube::Api;
use std::time::Duration;
use support::{apply_yaml, free_port, local_controller_config};

/// A policy protecting an HTTPRoute with an htpasswd Secret is Accepted under the route's
/// Gateway; one naming a missing Secret is Accepted=False Invalid (its rules answer 503) with
/// a Warning Event saying which Secret; `kubectl get cxap` shows the Accepted column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_policies_report_their_ancestors_and_problems() {
    let env = TestEnv::new().await;
    let ns = env.namespace.clone();
    let controller_name = "coxswain-labs.dev/access-test";
    let config = local_controller_config(&ns, controller_name, free_port(), free_port());
    let (stop_ctl, ctl_stopped) = tokio::sync::oneshot::channel::<()>();
    let ctl = tokio::spawn(controller::run(env.client.clone(), config, async {
        let _ = ctl_stopped.await;
    }));
    let listen = free_port();
    apply_yaml(
        &env.client,
        &format!(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: access-{ns}}}
spec: {{controllerName: {controller_name}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: {ns}}}
spec:
  gatewayClassName: access-{ns}
  listeners: [{{name: http, port: {listen}, protocol: HTTP}}]
---
apiVersion: v1
kind: Service
metadata: {{name: app, namespace: {ns}}}
spec: {{ports: [{{name: http, port: 80}}]}}
---
apiVersion: v1
kind: Secret
metadata: {{name: users, namespace: {ns}}}
type: Opaque
stringData:
  auth: "foo:$apr1$r31Jzq3U$oriiaS31APatLwvTBKE3D.\n"
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: app, namespace: {ns}}}
spec:
  parentRefs: [{{name: edge}}]
  rules: [{{name: all, backendRefs: [{{name: app, port: 80}}]}}]
---
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainAccessPolicy
metadata: {{name: guard, namespace: {ns}}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, name: app}}]
  basicAuth: {{secretRef: {{name: users}}}}
  rateLimit: {{requests: 100, unit: Minute}}
---
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainAccessPolicy
metadata: {{name: lost-secret, namespace: {ns}}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: Gateway, name: edge}}]
  basicAuth: {{secretRef: {{name: nobody}}}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: idp-keys, namespace: {ns}}}
data:
  jwks.json: '{{"keys": [{{"kty": "OKP", "crv": "Ed25519", "kid": "a", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}}]}}'
---
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainAccessPolicy
metadata: {{name: tokens, namespace: {ns}}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, name: app, sectionName: all}}]
  jwt:
    providers:
    - {{name: idp, issuer: "https://idp.example", audiences: [shop], jwks: {{name: idp-keys}}}}
"#
        ),
    )
    .await;
    let policies: Api<CoxswainAccessPolicy> = env.api();
    let entries = |name: &'static str| {
        let policies = policies.clone();
        async move { support::policy_ancestors(&policies, name, |p| Some(p.status?.ancestors)).await }
    };
    let guard = coxswain_testenv::eventually(
        "the policy's ancestor: the route's Gateway",
        Duration::from_secs(30),
        || async { entries("guard").await.filter(|l| l[0].0 == "Gateway") },
    )
    .await;
    assert_eq!(
        guard,
        vec![(
            "Gateway".to_owned(),
            "edge".to_owned(),
            controller_name.to_owned(),
            Some(("True".to_owned(), "Accepted".to_owned(), Some(1)))
        )]
    );
    let lost = coxswain_testenv::eventually(
        "the policy without its Secret is Invalid",
        Duration::from_secs(30),
        || async {
            entries("lost-secret")
                .await
                .filter(|l| l[0].3.as_ref().is_some_and(|c| c.1 == "Invalid"))
        },
    )
    .await;
    assert_eq!(lost[0].3.as_ref().map(|c| c.0.as_str()), Some("False"));

    let events: Api<k8s_openapi::api::events::v1::Event> = env.api();
    let warning = coxswain_testenv::eventually(
        "a Warning Event on the policy without its Secret",
        Duration::from_secs(30),
        || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.regarding.as_ref().is_some_and(|r| {
                        r.kind.as_deref() == Some("CoxswainAccessPolicy")
                            && r.name.as_deref() == Some("lost-secret")
                    })
            })
        },
    )
    .await;
    assert_eq!(warning.reason.as_deref(), Some("Invalid"));
    assert!(
        warning
            .note
            .as_deref()
            .is_some_and(|n| n.contains("Basic-auth Secret") && n.contains("nobody not found")),
        "{warning:?}"
    );

    // A JWT policy reads its keys from a ConfigMap; a new document there is compiled again
    // (here one without keys, so the policy says so and its rule fails closed).
    let accepted = |name: &'static str, reason: &'static str| async move {
        entries(name)
            .await
            .filter(|l| l[0].3.as_ref().is_some_and(|c| c.1 == reason))
    };
    coxswain_testenv::eventually(
        "the JWT policy is Accepted",
        Duration::from_secs(30),
        || accepted("tokens", "Accepted"),
    )
    .await;
    apply_yaml(
        &env.client,
        &format!(
            r#"
apiVersion: v1
kind: ConfigMap
metadata: {{name: idp-keys, namespace: {ns}}}
data:
  jwks.json: '{{"keys": []}}'
"#
        ),
    )
    .await;
    coxswain_testenv::eventually(
        "the JWT policy whose JWKS lost its keys is Invalid",
        Duration::from_secs(30),
        || accepted("tokens", "Invalid"),
    )
    .await;

    let out = env
        .cluster()
        .kubectl()
        .args(["get", "cxap", "-n", &ns, "guard"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("True"), "{table}");

    let _ = stop_ctl.send(());
    ctl.await.unwrap().unwrap();
}
