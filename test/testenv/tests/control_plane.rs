//! The local control plane behaves like a real cluster where Coxswain depends on it:
//! service-account tokens with audiences, workload controllers and garbage collection.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

use coxswain_testenv::{TestEnv, eventually};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::authentication::v1::{
    TokenRequest, TokenRequestSpec, TokenReview, TokenReviewSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams, PropagationPolicy};
use serde_json::json;
use std::time::Duration;

const AUDIENCE: &str = coxswain_api::names::TOKEN_AUDIENCE;

async fn review(env: &TestEnv, token: &str, audience: &str) -> TokenReview {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_owned(),
            audiences: Some(vec![audience.to_owned()]),
        },
        ..Default::default()
    };
    Api::<TokenReview>::all(env.client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
}

#[tokio::test]
async fn audience_scoped_token_passes_review_only_for_its_audience() {
    let env = TestEnv::new().await;
    let sas: Api<ServiceAccount> = env.api();
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("edge-coxswain".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    sas.create(&PostParams::default(), &sa).await.unwrap();

    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![AUDIENCE.to_owned()]),
            expiration_seconds: Some(600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let issued: TokenRequest = sas
        .create_subresource("token", "edge-coxswain", &PostParams::default(), &request)
        .await
        .unwrap();
    let token = issued.status.unwrap().token.unwrap();

    let ok = review(&env, &token, AUDIENCE).await.status.unwrap();
    assert_eq!(ok.authenticated, Some(true), "{ok:?}");
    assert_eq!(ok.audiences.as_deref(), Some(&[AUDIENCE.to_owned()][..]));
    let user = ok.user.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:serviceaccount:{}:edge-coxswain", env.namespace).as_str())
    );

    let other = review(&env, &token, "some-other-audience")
        .await
        .status
        .unwrap();
    assert_ne!(other.authenticated, Some(true), "{other:?}");
    assert!(other.error.is_some_and(|e| !e.is_empty()));

    let forged = format!("{token}x");
    let bad = review(&env, &forged, AUDIENCE).await.status.unwrap();
    assert_ne!(
        bad.authenticated,
        Some(true),
        "a tampered token was accepted"
    );
}

#[tokio::test]
async fn deployment_gets_a_replicaset_from_the_controller_manager() {
    let env = TestEnv::new().await;
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "echo"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "echo"}},
            "template": {
                "metadata": {"labels": {"app": "echo"}},
                "spec": {"containers": [{"name": "echo", "image": "echo-basic"}]}
            }
        }
    }))
    .unwrap();
    let created = env
        .api::<Deployment>()
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let uid = created.metadata.uid.unwrap();

    let rs_api = env.api::<ReplicaSet>();
    let rs = eventually(
        "a ReplicaSet owned by the Deployment",
        Duration::from_secs(30),
        || {
            let rs_api = rs_api.clone();
            let uid = uid.clone();
            async move {
                let list = rs_api.list(&Default::default()).await.ok()?;
                list.items.into_iter().find(|rs| {
                    rs.metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|o| o.uid == uid && o.controller == Some(true))
                })
            }
        },
    )
    .await;
    assert_eq!(rs.spec.unwrap().replicas, Some(2));
}

#[tokio::test]
async fn deleting_an_owner_garbage_collects_its_dependents() {
    let env = TestEnv::new().await;
    let cms = env.api::<ConfigMap>();
    let owner = cms
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("owner".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let dependent = ConfigMap {
        metadata: ObjectMeta {
            name: Some("dependent".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: "owner".into(),
                uid: owner.metadata.uid.unwrap(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        ..Default::default()
    };
    cms.create(&PostParams::default(), &dependent)
        .await
        .unwrap();

    let background = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..Default::default()
    };
    cms.delete("owner", &background).await.unwrap();
    eventually(
        "the dependent to be collected",
        Duration::from_secs(30),
        || {
            let cms = cms.clone();
            async move { cms.get_opt("dependent").await.ok()?.is_none().then_some(()) }
        },
    )
    .await;
}
