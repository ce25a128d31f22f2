//! CoxswainBackendPolicy status on the local control plane, in a cluster of its own: other
//! tests' controllers would add their own entries to every policy's shared ancestors list.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_operator::controller;
use coxswain_testenv::TestEnv;
use kube::Api;
use std::time::Duration;
use support::{apply_yaml, free_port, local_controller_config};

/// CoxswainBackendPolicies get `status.ancestors` from the leader: the IngressClass and the
/// Gateway whose routes use a targeted Service, Accepted for the policy's generation; a
/// misspelt target is TargetNotFound under the Service it names, a second policy on a target
/// is Conflicted, and each problem is a Warning Event on the policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_policies_report_their_ancestors_and_problems() {
    use coxswain_api::CoxswainBackendPolicy;
    let env = TestEnv::new().await;
    let ns = env.namespace.clone();
    let controller_name = "coxswain-labs.dev/policy-test";
    let mut config = local_controller_config(&ns, controller_name, free_port(), free_port());
    config.ingress_ports = (free_port(), free_port());
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
metadata: {{name: policy-{ns}}}
spec: {{controllerName: {controller_name}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: {ns}}}
spec:
  gatewayClassName: policy-{ns}
  listeners: [{{name: http, port: {listen}, protocol: HTTP}}]
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {{name: policy-{ns}}}
spec: {{controller: {controller_name}}}
---
apiVersion: v1
kind: Service
metadata: {{name: app, namespace: {ns}}}
spec: {{ports: [{{name: http, port: 80}}]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: app, namespace: {ns}}}
spec:
  parentRefs: [{{name: edge}}]
  rules: [{{backendRefs: [{{name: app, port: 80}}]}}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: app, namespace: {ns}}}
spec:
  ingressClassName: policy-{ns}
  rules:
  - host: app.example
    http:
      paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: app, port: {{number: 80}}}}}}}}]
---
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainBackendPolicy
metadata: {{name: a-sticky, namespace: {ns}}}
spec:
  targetRefs: [{{group: "", kind: Service, name: app}}]
  loadBalancer: {{type: ConsistentHash, consistentHash: {{cookie: {{name: user}}}}}}
---
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainBackendPolicy
metadata: {{name: typo, namespace: {ns}}}
spec:
  targetRefs: [{{group: "", kind: Service, name: ap}}]
  loadBalancer: {{type: LeastRequest}}
"#
        ),
    )
    .await;
    let policies: Api<CoxswainBackendPolicy> = env.api();
    let entries = |name: &'static str| {
        let policies = policies.clone();
        async move { support::policy_ancestors(&policies, name, |p| Some(p.status?.ancestors)).await }
    };
    let sticky = coxswain_testenv::eventually(
        "the policy's ancestors: the Gateway and the IngressClass",
        Duration::from_secs(30),
        || async { entries("a-sticky").await.filter(|l| l.len() == 2) },
    )
    .await;
    let accepted = Some(("True".to_owned(), "Accepted".to_owned(), Some(1)));
    assert_eq!(
        sticky,
        vec![
            (
                "Gateway".to_owned(),
                "edge".to_owned(),
                controller_name.to_owned(),
                accepted.clone()
            ),
            (
                "IngressClass".to_owned(),
                format!("policy-{ns}"),
                controller_name.to_owned(),
                accepted
            ),
        ]
    );
    let typo = coxswain_testenv::eventually(
        "the misspelt policy's status",
        Duration::from_secs(30),
        || async { entries("typo").await },
    )
    .await;
    assert_eq!(
        typo,
        vec![(
            "Service".to_owned(),
            "ap".to_owned(),
            controller_name.to_owned(),
            Some(("False".to_owned(), "TargetNotFound".to_owned(), Some(1)))
        )]
    );

    // A second policy on the same Service, created later, is Conflicted.
    apply_yaml(
        &env.client,
        &format!(
            r#"
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainBackendPolicy
metadata: {{name: b-second, namespace: {ns}}}
spec:
  targetRefs: [{{group: "", kind: Service, name: app}}]
  loadBalancer: {{type: RoundRobin}}
"#
        ),
    )
    .await;
    coxswain_testenv::eventually(
        "the younger policy is Conflicted",
        Duration::from_secs(30),
        || async {
            let list = entries("b-second").await?;
            list.iter()
                .all(|e| e.3.as_ref().is_some_and(|c| c.1 == "Conflicted"))
                .then_some(())
        },
    )
    .await;

    let events: Api<k8s_openapi::api::events::v1::Event> = env.api();
    let warning = coxswain_testenv::eventually(
        "a Warning Event on the misspelt policy",
        Duration::from_secs(30),
        || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.regarding.as_ref().is_some_and(|r| {
                        r.kind.as_deref() == Some("CoxswainBackendPolicy")
                            && r.name.as_deref() == Some("typo")
                    })
            })
        },
    )
    .await;
    assert_eq!(warning.reason.as_deref(), Some("TargetNotFound"));
    assert!(
        warning
            .note
            .as_deref()
            .is_some_and(|n| n.contains("Service ap not found")),
        "{warning:?}"
    );

    let out = env
        .cluster()
        .kubectl()
        .args(["get", "cxbp", "-n", &ns, "a-sticky"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("ConsistentHash") && table.contains("True"),
        "{table}"
    );

    let _ = stop_ctl.send(());
    ctl.await.unwrap().unwrap();
}
