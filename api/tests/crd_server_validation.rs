//! The CRDs as the API server enforces them: valid objects are stored intact and invalid ones
//! are rejected by the server's own schema validation, with messages a person can act on.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

use coxswain_api::{
    Autoscaling, CoxswainGatewayParameters, CoxswainGatewayParametersSpec,
    CoxswainIngressClassParameters, ServiceType,
};
use coxswain_testenv::TestEnv;
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::discovery::ApiResource;
use kube::{Api, Resource};
use serde_json::json;

fn parameters(name: &str, spec: serde_json::Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "gateway.coxswain-labs.dev/v1alpha1",
        "kind": "CoxswainGatewayParameters",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap()
}

fn dynamic_api(env: &TestEnv) -> Api<DynamicObject> {
    let resource = ApiResource::erase::<CoxswainGatewayParameters>(&());
    Api::namespaced_with(env.client.clone(), &env.namespace, &resource)
}

/// Creates the object and returns the server's rejection message.
async fn rejection(env: &TestEnv, obj: &DynamicObject) -> String {
    match dynamic_api(env).create(&PostParams::default(), obj).await {
        Ok(_) => panic!("the API server accepted {obj:?}"),
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            status.message
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[tokio::test]
async fn valid_gateway_parameters_are_stored_intact() {
    let env = TestEnv::new().await;
    let api: Api<CoxswainGatewayParameters> = env.api();
    let mut params = CoxswainGatewayParameters::new(
        "edge",
        CoxswainGatewayParametersSpec {
            replicas: Some(3),
            image: Some("registry.example/coxswain:1.0".into()),
            service_type: Some(ServiceType::ClusterIp),
            autoscaling: Some(Autoscaling {
                enabled: Some(true),
                min_replicas: Some(2),
                max_replicas: Some(5),
                target_cpu_utilization_percentage: Some(75),
            }),
            // Fields the schema does not describe must survive: podTemplate is free-form.
            pod_template: Some(json!({
                "metadata": {"labels": {"team": "edge"}},
                "spec": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]},
            })),
            ..Default::default()
        },
    );
    params.meta_mut().namespace = Some(env.namespace.clone());
    api.create(&PostParams::default(), &params).await.unwrap();

    let stored = api.get("edge").await.unwrap();
    assert_eq!(stored.spec, params.spec);

    let raw = dynamic_api(&env).get("edge").await.unwrap();
    assert_eq!(raw.data["spec"]["serviceType"], "ClusterIP");
    assert_eq!(
        raw.data["spec"]["autoscaling"]["targetCPUUtilizationPercentage"],
        75
    );
}

#[tokio::test]
async fn unknown_service_type_is_rejected_by_the_server() {
    let env = TestEnv::new().await;
    let msg = rejection(
        &env,
        &parameters("bad-type", json!({"serviceType": "Ingress"})),
    )
    .await;
    assert!(msg.contains("spec.serviceType"), "{msg}");
    assert!(msg.contains("Unsupported value"), "{msg}");
}

#[tokio::test]
async fn min_replicas_above_max_replicas_is_rejected_by_the_cel_rule() {
    let env = TestEnv::new().await;
    let obj = parameters(
        "bad-range",
        json!({"autoscaling": {"enabled": true, "minReplicas": 5, "maxReplicas": 2}}),
    );
    let msg = rejection(&env, &obj).await;
    assert!(
        msg.contains("minReplicas must not exceed maxReplicas"),
        "{msg}"
    );

    // The same bounds the right way round are fine, and so is either bound alone.
    for (name, spec) in [
        (
            "ok-range",
            json!({"autoscaling": {"minReplicas": 2, "maxReplicas": 5}}),
        ),
        ("ok-min", json!({"autoscaling": {"minReplicas": 5}})),
    ] {
        dynamic_api(&env)
            .create(&PostParams::default(), &parameters(name, spec))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn negative_replicas_and_out_of_range_cpu_targets_are_rejected() {
    let env = TestEnv::new().await;
    let msg = rejection(&env, &parameters("neg", json!({"replicas": -1}))).await;
    assert!(msg.contains("spec.replicas"), "{msg}");
    let msg = rejection(
        &env,
        &parameters(
            "cpu",
            json!({"autoscaling": {"targetCPUUtilizationPercentage": 150}}),
        ),
    )
    .await;
    assert!(msg.contains("targetCPUUtilizationPercentage"), "{msg}");
}

#[tokio::test]
async fn ingress_class_parameters_round_trip_and_samples_apply() {
    let env = TestEnv::new().await;
    let samples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/samples");
    let apply = PatchParams::apply("coxswain-test").force();

    let text = std::fs::read_to_string(
        samples.join("ingress_v1alpha1_coxswainingressclassparameters.yaml"),
    )
    .unwrap();
    let mut sample: CoxswainIngressClassParameters = serde_yaml::from_str(&text).unwrap();
    sample.meta_mut().namespace = Some(env.namespace.clone());
    let api: Api<CoxswainIngressClassParameters> = env.api();
    api.patch("coxswain", &apply, &Patch::Apply(&sample))
        .await
        .unwrap();
    let stored = api.get("coxswain").await.unwrap();
    assert_eq!(stored.spec, sample.spec);
    assert_eq!(
        stored.spec.default_annotations["ingress.coxswain-labs.dev/read-timeout"],
        "30s"
    );

    let text =
        std::fs::read_to_string(samples.join("gateway_v1alpha1_coxswaingatewayparameters.yaml"))
            .unwrap();
    let mut sample: CoxswainGatewayParameters = serde_yaml::from_str(&text).unwrap();
    sample.meta_mut().namespace = Some(env.namespace.clone());
    let api: Api<CoxswainGatewayParameters> = env.api();
    api.patch("edge", &apply, &Patch::Apply(&sample))
        .await
        .unwrap();
    assert_eq!(api.get("edge").await.unwrap().spec, sample.spec);
}

fn policy_api(env: &TestEnv) -> Api<DynamicObject> {
    let resource = ApiResource::erase::<coxswain_api::CoxswainBackendPolicy>(&());
    Api::namespaced_with(env.client.clone(), &env.namespace, &resource)
}

fn policy(name: &str, spec: serde_json::Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "gateway.coxswain-labs.dev/v1alpha1",
        "kind": "CoxswainBackendPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap()
}

#[tokio::test]
async fn backend_policy_sample_round_trips_and_sourceip_survives_pruning() {
    let env = TestEnv::new().await;
    let samples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/samples");
    let text = std::fs::read_to_string(samples.join("gateway_v1alpha1_coxswainbackendpolicy.yaml"))
        .unwrap();
    let mut sample: coxswain_api::CoxswainBackendPolicy = serde_yaml::from_str(&text).unwrap();
    sample.meta_mut().namespace = Some(env.namespace.clone());
    let api: Api<coxswain_api::CoxswainBackendPolicy> = env.api();
    api.patch(
        "shop",
        &PatchParams::apply("coxswain-test").force(),
        &Patch::Apply(&sample),
    )
    .await
    .unwrap();
    assert_eq!(api.get("shop").await.unwrap().spec, sample.spec);

    // `sourceIP: {}` has no fields; the server must keep it, or the CEL rule's key is lost.
    let obj = policy(
        "by-client",
        json!({
            "targetRefs": [{"kind": "Service", "name": "shop"}],
            "loadBalancer": {"type": "ConsistentHash", "consistentHash": {"sourceIP": {}}},
        }),
    );
    policy_api(&env)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap();
    let stored = api.get("by-client").await.unwrap();
    let hash = stored.spec.load_balancer.unwrap().consistent_hash.unwrap();
    assert!(hash.source_ip.is_some());
    // group defaults to "" (core).
    assert_eq!(stored.spec.target_refs[0].group, "");
}

#[tokio::test]
async fn backend_policy_mistakes_are_rejected_by_the_server() {
    let env = TestEnv::new().await;
    let service = json!([{"group": "", "kind": "Service", "name": "shop"}]);
    for (name, spec, says) in [
        (
            "unknown-type",
            json!({"targetRefs": service, "loadBalancer": {"type": "Random"}}),
            "Unsupported value",
        ),
        (
            "hash-without-key",
            json!({"targetRefs": service, "loadBalancer": {"type": "ConsistentHash"}}),
            "consistentHash is required with type ConsistentHash",
        ),
        (
            "two-keys",
            json!({"targetRefs": service, "loadBalancer": {"type": "ConsistentHash",
                "consistentHash": {"sourceIP": {}, "cookie": {"name": "s"}}}}),
            "exactly one of header, cookie or sourceIP",
        ),
        (
            "key-without-hash",
            json!({"targetRefs": service, "loadBalancer": {"type": "RoundRobin",
                "consistentHash": {"sourceIP": {}}}}),
            "allowed only with it",
        ),
        (
            "not-a-service",
            json!({"targetRefs": [{"group": "apps", "kind": "Deployment", "name": "shop"}]}),
            "only Services can be targeted",
        ),
        ("no-targets", json!({"targetRefs": []}), "spec.targetRefs"),
        (
            "bad-header",
            json!({"targetRefs": service, "loadBalancer": {"type": "ConsistentHash",
                "consistentHash": {"header": {"name": "X User"}}}}),
            "consistentHash.header.name",
        ),
    ] {
        let obj = policy(name, spec);
        let msg = match policy_api(&env).create(&PostParams::default(), &obj).await {
            Ok(_) => panic!("{name}: the API server accepted it"),
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{name}: {status:?}");
                status.message
            }
            Err(e) => panic!("{name}: unexpected error: {e}"),
        };
        assert!(msg.contains(says), "{name}: {msg}");
    }
}

fn access_policy_api(env: &TestEnv) -> Api<DynamicObject> {
    let resource = ApiResource::erase::<coxswain_api::CoxswainAccessPolicy>(&());
    Api::namespaced_with(env.client.clone(), &env.namespace, &resource)
}

fn access_policy(name: &str, spec: serde_json::Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "gateway.coxswain-labs.dev/v1alpha1",
        "kind": "CoxswainAccessPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap()
}

#[tokio::test]
async fn access_policy_sample_round_trips() {
    let env = TestEnv::new().await;
    let samples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/samples");
    let text = std::fs::read_to_string(samples.join("gateway_v1alpha1_coxswainaccesspolicy.yaml"))
        .unwrap();
    let mut sample: coxswain_api::CoxswainAccessPolicy = serde_yaml::from_str(&text).unwrap();
    sample.meta_mut().namespace = Some(env.namespace.clone());
    let api: Api<coxswain_api::CoxswainAccessPolicy> = env.api();
    api.patch(
        "shop",
        &PatchParams::apply("coxswain-test").force(),
        &Patch::Apply(&sample),
    )
    .await
    .unwrap();
    assert_eq!(api.get("shop").await.unwrap().spec, sample.spec);
}

#[tokio::test]
async fn access_policy_mistakes_are_rejected_by_the_server() {
    let env = TestEnv::new().await;
    let route =
        json!([{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "shop"}]);
    let users = json!({"secretRef": {"name": "users"}});
    for (name, spec, says) in [
        (
            "nothing",
            json!({"targetRefs": route}),
            "set basicAuth, jwt, rateLimit, globalRateLimit or several",
        ),
        (
            "a-service",
            json!({"targetRefs": [{"group": "", "kind": "Service", "name": "shop"}], "basicAuth": users}),
            "only HTTPRoutes, GRPCRoutes and Gateways can be targeted",
        ),
        (
            "empty-limit",
            json!({"targetRefs": route, "rateLimit": {"burst": 3}}),
            "set requests, maxInProgress or both",
        ),
        (
            "zero-rate",
            json!({"targetRefs": route, "rateLimit": {"requests": 0}}),
            "spec.rateLimit.requests",
        ),
        (
            "header-key-without-header",
            json!({"targetRefs": route, "rateLimit": {"requests": 5, "key": {"type": "Header"}}}),
            "header is required with type Header",
        ),
        (
            "unknown-unit",
            json!({"targetRefs": route, "rateLimit": {"requests": 5, "unit": "Fortnight"}}),
            "Unsupported value",
        ),
        (
            "jwks-name-and-remote",
            json!({"targetRefs": route, "jwt": {"providers": [{"name": "idp", "jwks": {"name": "keys", "remote": {"uri": "https://idp.example/jwks"}}}]}}),
            "set name (a ConfigMap or Secret) or remote (a URL), exactly one",
        ),
        (
            "jwks-neither",
            json!({"targetRefs": route, "jwt": {"providers": [{"name": "idp", "jwks": {}}]}}),
            "set name (a ConfigMap or Secret) or remote (a URL), exactly one",
        ),
        (
            "jwks-key-with-remote",
            json!({"targetRefs": route, "jwt": {"providers": [{"name": "idp", "jwks": {"key": "k", "remote": {"uri": "https://idp.example/jwks"}}}]}}),
            "kind and key go with name, not with remote",
        ),
        (
            "jwks-over-http",
            json!({"targetRefs": route, "jwt": {"providers": [{"name": "idp", "jwks": {"remote": {"uri": "http://idp.example/jwks"}}}]}}),
            "spec.jwt.providers[0].jwks.remote.uri",
        ),
        (
            "jwks-refreshed-too-often",
            json!({"targetRefs": route, "jwt": {"providers": [{"name": "idp", "jwks": {"remote": {"uri": "https://idp.example/jwks", "refreshSeconds": 5}}}]}}),
            "spec.jwt.providers[0].jwks.remote.refreshSeconds",
        ),
        (
            "global-unit-without-requests",
            json!({"targetRefs": route, "globalRateLimit": {"service": {"name": "rl", "port": 8081}, "unit": "Minute"}}),
            "unit goes with requests",
        ),
        (
            "global-without-service",
            json!({"targetRefs": route, "globalRateLimit": {"requests": 5}}),
            "spec.globalRateLimit.service",
        ),
        (
            "global-port-zero",
            json!({"targetRefs": route, "globalRateLimit": {"service": {"name": "rl", "port": 0}}}),
            "spec.globalRateLimit.service.port",
        ),
        (
            "global-unknown-failure-mode",
            json!({"targetRefs": route, "globalRateLimit": {"service": {"name": "rl", "port": 8081}, "failureMode": "Maybe"}}),
            "Unsupported value",
        ),
        (
            "quote-in-realm",
            json!({"targetRefs": route, "basicAuth": {"secretRef": {"name": "users"}, "realm": "a\"b"}}),
            "spec.basicAuth.realm",
        ),
    ] {
        let obj = access_policy(name, spec);
        match access_policy_api(&env)
            .create(&PostParams::default(), &obj)
            .await
        {
            Ok(_) => panic!("{name}: the API server accepted it"),
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{name}: {status:?}");
                assert!(status.message.contains(says), "{name}: {}", status.message);
            }
            Err(e) => panic!("{name}: unexpected error: {e}"),
        }
    }
}
