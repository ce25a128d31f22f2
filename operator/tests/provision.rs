//! The provisioning operator against the local control plane: dedicated proxy objects from
//! CoxswainGatewayParameters (merged as `kubectl` merges), their lifecycle, and a dedicated
//! proxy that serves exactly its Gateway.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_api::crd::gateway::CoxswainGatewayParameters;
use coxswain_api::discovery::discovery_client::DiscoveryClient;
use coxswain_api::discovery::{ProxyMessage, Subscribe, WIRE_VERSION, proxy_message};
use coxswain_api::names;
use coxswain_api::snapshot as snap;
use coxswain_operator::controller;
use coxswain_operator::provision::render::{self, Inputs};
use coxswain_proxy::discovery::DiscoveryConfig;
use coxswain_testenv::{TestEnv, eventually};
use gateway_api::apis::standard::gateways::Gateway;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use std::time::Duration;
use support::{apply_yaml, free_port, http_get, local_controller_config, pod_token};

const WAIT: Duration = Duration::from_secs(60);

fn controller_name(env: &TestEnv) -> String {
    format!("coxswain-labs.dev/test-{}", env.namespace)
}

struct RunningController {
    discovery_port: u16,
    bootstrap_port: u16,
    _stop: tokio::sync::oneshot::Sender<()>,
}

fn start_controller(env: &TestEnv) -> RunningController {
    let (discovery_port, bootstrap_port) = (free_port(), free_port());
    // Tests share one cluster: each controller serves only its own test's classes.
    let config = local_controller_config(
        &env.namespace,
        &controller_name(env),
        discovery_port,
        bootstrap_port,
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(controller::run(env.client.clone(), config, async {
        let _ = stopped.await;
    }));
    RunningController {
        discovery_port,
        bootstrap_port,
        _stop: stop,
    }
}

const CLASS_PARAMS: &str = r#"
replicas: 2
resources: {requests: {cpu: 100m, memory: 64Mi}}
podTemplate:
  spec:
    containers:
    - name: proxy
      env: [{name: LOG_LEVEL, value: info}, {name: KEEP, value: class}]
"#;

fn gateway_params(image: &str) -> String {
    format!(
        r#"
image: {image}
podTemplate:
  spec:
    hostNetwork: true
    tolerations: [{{key: spot, operator: Exists, effect: NoSchedule}}]
    containers:
    - name: proxy
      env: [{{name: LOG_LEVEL, value: debug}}]
    - name: sidecar
      image: example.com/sidecar:1
"#
    )
}

fn indent(yaml: &str, by: usize) -> String {
    yaml.lines()
        .map(|l| format!("{}{l}\n", " ".repeat(by)))
        .collect()
}

fn params_yaml(ns: &str, name: &str, spec: &str) -> String {
    format!(
        "apiVersion: gateway.coxswain-labs.dev/v1alpha1\nkind: CoxswainGatewayParameters\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n{}",
        indent(spec.trim(), 2)
    )
}

/// `kubectl patch --local --type strategic`: what kubectl's strategic merge makes of `base`
/// with `template` as the patch of its pod template.
fn kubectl_strategic_merge(
    env: &TestEnv,
    base: &Deployment,
    template: &serde_json::Value,
) -> Deployment {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("deployment.json");
    let mut value = serde_json::to_value(base).unwrap();
    value["apiVersion"] = "apps/v1".into();
    value["kind"] = "Deployment".into();
    std::fs::write(&file, value.to_string()).unwrap();
    let patch = serde_json::json!({"spec": {"template": template}}).to_string();
    let out = env
        .cluster()
        .kubectl()
        .args([
            "patch",
            "--local",
            "--type",
            "strategic",
            "-o",
            "json",
            "-f",
        ])
        .arg(&file)
        .args(["-p", &patch])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl patch: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The fields the merge decides, comparable between an API object and a local render.
fn merged_fields(d: &Deployment) -> serde_json::Value {
    let pod = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let containers: Vec<serde_json::Value> = pod
        .containers
        .iter()
        .map(|c| {
            serde_json::json!({
                "name": c.name,
                "image": c.image,
                "args": c.args,
                "env": c.env.iter().flatten().map(|e| (e.name.clone(), e.value.clone())).collect::<Vec<_>>(),
                "requests": c.resources.as_ref().and_then(|r| r.requests.clone()),
            })
        })
        .collect();
    let tolerations: Vec<(Option<String>, Option<String>)> = pod
        .tolerations
        .iter()
        .flatten()
        .map(|t| (t.key.clone(), t.operator.clone()))
        .collect();
    serde_json::json!({"containers": containers, "tolerations": tolerations, "replicas": d.spec.as_ref().unwrap().replicas})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameters_render_a_merged_owned_proxy_that_follows_its_gateway() {
    let env = TestEnv::new().await;
    let ns = env.namespace.clone();
    let _controller = start_controller(&env);
    let class = format!("dedicated-{ns}");
    let objects = format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: {class}}}
spec:
  controllerName: {controller}
  parametersRef: {{group: gateway.coxswain-labs.dev, kind: CoxswainGatewayParameters, name: class-params, namespace: {ns}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: {ns}}}
spec:
  gatewayClassName: {class}
  infrastructure:
    labels: {{team: payments}}
    parametersRef: {{group: gateway.coxswain-labs.dev, kind: CoxswainGatewayParameters, name: edge-params}}
  listeners: [{{name: http, port: 8080, protocol: HTTP}}]
"#,
        controller = controller_name(&env)
    );
    let params = format!(
        "{}---\n{}---\n",
        params_yaml(&ns, "class-params", CLASS_PARAMS),
        params_yaml(&ns, "edge-params", &gateway_params("example.com/custom:1")),
    );
    apply_yaml(&env.client, &(params + &objects)).await;
    let name = names::dedicated_proxy_name("edge", &class);
    let deployments: Api<Deployment> = env.api();
    let deployment = eventually("the dedicated Deployment", WAIT, || {
        let (deployments, name) = (deployments.clone(), name.clone());
        async move { deployments.get_opt(&name).await.ok().flatten() }
    })
    .await;

    // Owned by the Gateway, labelled from spec.infrastructure, with its PDB, SA and Service.
    let gateway: Gateway = env.api::<Gateway>().get("edge").await.unwrap();
    let owner = &deployment.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Gateway", "edge")
    );
    assert_eq!(Some(&owner.uid), gateway.metadata.uid.as_ref());
    assert_eq!(
        deployment.metadata.labels.as_ref().unwrap()["team"],
        "payments"
    );
    let pdb = eventually("the PodDisruptionBudget", WAIT, || {
        let (pdbs, name) = (env.api::<PodDisruptionBudget>(), name.clone());
        async move { pdbs.get_opt(&name).await.ok().flatten() }
    })
    .await;
    assert_eq!(
        pdb.spec.unwrap().max_unavailable,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    );
    let sa = env.api::<ServiceAccount>().get(&name).await.unwrap();
    assert_eq!(sa.automount_service_account_token, Some(false));
    let svc = env.api::<Service>().get(&name).await.unwrap();
    assert_eq!(svc.spec.unwrap().type_.as_deref(), Some("LoadBalancer"));

    // The merged fields equal kubectl's strategic merge of the same layers onto the same base.
    let class_params: CoxswainGatewayParameters = env.api().get("class-params").await.unwrap();
    let edge_params: CoxswainGatewayParameters = env.api().get("edge-params").await.unwrap();
    let strip = |p: &CoxswainGatewayParameters| {
        let mut spec = p.spec.clone();
        spec.pod_template = None;
        spec
    };
    let (class_spec, edge_spec) = (strip(&class_params), strip(&edge_params));
    let base = render::render(&Inputs {
        gateway: &gateway,
        class_params: Some(&class_spec),
        gateway_params: Some(&edge_spec),
        class_params_name: "class",
        gateway_params_name: "gateway",
        controller_namespace: &ns,
        controller_name: &controller_name(&env),
        default_image: &controller::release_image(),
        trust_bundle_pem: "",
        proxy_name: &name,
    })
    .unwrap()
    .deployment;
    let after_class = kubectl_strategic_merge(
        &env,
        &base,
        class_params.spec.pod_template.as_ref().unwrap(),
    );
    let expected = kubectl_strategic_merge(
        &env,
        &after_class,
        edge_params.spec.pod_template.as_ref().unwrap(),
    );
    assert_eq!(merged_fields(&deployment), merged_fields(&expected));
    let fields = merged_fields(&deployment);
    assert_eq!(fields["containers"][0]["image"], "example.com/custom:1");
    assert_eq!(fields["containers"][1]["name"], "sidecar");
    assert_eq!(fields["replicas"], 2);
    let env_vars = &fields["containers"][0]["env"];
    assert!(
        env_vars.to_string().contains(r#"["LOG_LEVEL","debug"]"#),
        "the Gateway's value wins: {env_vars}"
    );
    assert!(
        env_vars.to_string().contains(r#"["KEEP","class"]"#),
        "{env_vars}"
    );

    // hostNetwork is one of the settings no podTemplate may change: restored, and said so on
    // the Gateway as an Event.
    assert_eq!(
        deployment
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .host_network,
        None
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = env.api();
    let note = eventually("the override Event on the Gateway", WAIT, || {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            list.items.into_iter().find_map(|e| {
                let about_edge = e.regarding.as_ref()?.name.as_deref() == Some("edge");
                (about_edge && e.reason.as_deref() == Some("SecurityOverrideIgnored"))
                    .then_some(e.note.unwrap_or_default())
            })
        }
    })
    .await;
    assert!(note.contains("spec.hostNetwork"), "{note}");

    // Editing the parameters rolls the Deployment.
    let params: Api<CoxswainGatewayParameters> = env.api();
    params
        .patch(
            "edge-params",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"image": "example.com/custom:2"}})),
        )
        .await
        .unwrap();
    let generation = deployment.metadata.generation.unwrap_or(0);
    eventually("the Deployment rolled to the new image", WAIT, || {
        let (deployments, name) = (deployments.clone(), name.clone());
        async move {
            let d = deployments.get(&name).await.ok()?;
            let image = d.spec.as_ref()?.template.spec.as_ref()?.containers[0]
                .image
                .clone()?;
            (image == "example.com/custom:2" && d.metadata.generation.unwrap_or(0) > generation)
                .then_some(())
        }
    })
    .await;

    // Leaving dedicated mode (no reference on the Gateway or its class) removes every object.
    env.api::<Gateway>()
        .patch(
            "edge",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"infrastructure": null}})),
        )
        .await
        .unwrap();
    Api::<gateway_api::apis::standard::gatewayclasses::GatewayClass>::all(env.client.clone())
        .patch(
            &class,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"parametersRef": null}})),
        )
        .await
        .unwrap();
    let trust = format!("{name}-trust");
    eventually("the dedicated objects removed", WAIT, || {
        let (env, name, trust) = (&env, name.clone(), trust.clone());
        async move {
            let gone = env.api::<Deployment>().get_opt(&name).await.ok()?.is_none()
                && env.api::<Service>().get_opt(&name).await.ok()?.is_none()
                && env
                    .api::<ServiceAccount>()
                    .get_opt(&name)
                    .await
                    .ok()?
                    .is_none()
                && env
                    .api::<PodDisruptionBudget>()
                    .get_opt(&name)
                    .await
                    .ok()?
                    .is_none()
                && env.api::<ConfigMap>().get_opt(&trust).await.ok()?.is_none();
            gone.then_some(())
        }
    })
    .await;

    // Back in dedicated mode, then the Gateway is deleted: garbage collection removes them.
    env.api::<Gateway>()
        .patch(
            "edge",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"infrastructure": {"parametersRef": {"group": names::GATEWAY_GROUP, "kind": "CoxswainGatewayParameters", "name": "edge-params"}}}})),
        )
        .await
        .unwrap();
    eventually("the Deployment back", WAIT, || {
        let (deployments, name) = (deployments.clone(), name.clone());
        async move { deployments.get_opt(&name).await.ok().flatten() }
    })
    .await;
    env.api::<Gateway>()
        .delete("edge", &DeleteParams::default())
        .await
        .unwrap();
    eventually("garbage collection of the Deployment", WAIT, || {
        let (deployments, name) = (deployments.clone(), name.clone());
        async move {
            deployments
                .get_opt(&name)
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedicated_proxy_serves_its_gateway_and_nothing_of_the_shared_pool() {
    let env = TestEnv::new().await;
    let ns = env.namespace.clone();
    let controller = start_controller(&env);
    let class = format!("plain-{ns}");
    let (dedicated_port, shared_port) = (free_port(), free_port());
    apply_yaml(
        &env.client,
        &format!(
            r#"{params}---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: {class}}}
spec: {{controllerName: {controller}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: {ns}}}
spec:
  gatewayClassName: {class}
  infrastructure:
    parametersRef: {{group: gateway.coxswain-labs.dev, kind: CoxswainGatewayParameters, name: edge-params}}
  listeners: [{{name: http, port: {dedicated_port}, protocol: HTTP}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: main, namespace: {ns}}}
spec:
  gatewayClassName: {class}
  listeners: [{{name: http, port: {shared_port}, protocol: HTTP}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: dedicated, namespace: {ns}}}
spec:
  parentRefs: [{{name: edge}}]
  hostnames: [a.example]
  rules:
  - filters: [{{type: RequestRedirect, requestRedirect: {{hostname: dedicated.example, statusCode: 302}}}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: shared, namespace: {ns}}}
spec:
  parentRefs: [{{name: main}}]
  hostnames: [b.example]
  rules:
  - filters: [{{type: RequestRedirect, requestRedirect: {{hostname: shared.example, statusCode: 302}}}}]
"#,
            params = params_yaml(&ns, "edge-params", "serviceType: ClusterIP"),
            controller = controller_name(&env)
        ),
    )
    .await;

    // The provisioner creates the proxy's ServiceAccount and trust bundle copy; the proxy gets
    // a token for that ServiceAccount, as its projected volume would hold.
    let name = names::dedicated_proxy_name("edge", &class);
    let trust: ConfigMap = eventually("the proxy's trust bundle", WAIT, || {
        let (maps, trust) = (env.api::<ConfigMap>(), format!("{name}-trust"));
        async move { maps.get_opt(&trust).await.ok().flatten() }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.crt"), &trust.data.unwrap()["ca.crt"]).unwrap();
    let token = pod_token(&env, &name, "dedicated-0", names::TOKEN_AUDIENCE).await;
    std::fs::write(dir.path().join("token"), token).unwrap();
    let config = |token: &str, scope: snap::Scope| DiscoveryConfig {
        endpoints: vec![format!("https://localhost:{}", controller.discovery_port)],
        bootstrap_endpoint: format!("https://localhost:{}", controller.bootstrap_port),
        token_path: dir.path().join(token),
        trust_bundle_path: dir.path().join("ca.crt"),
        scope,
        node_id: "dedicated-0".into(),
        workers: 2,
        limits: Default::default(),
        liveness: Default::default(),
    };
    let edge_scope = snap::Scope {
        kind: Some(snap::scope::Kind::Gateway(snap::ObjectRef {
            namespace: ns.clone(),
            name: "edge".into(),
        })),
    };
    let (stop_proxy, proxy_stopped) = tokio::sync::oneshot::channel::<()>();
    let proxy = tokio::spawn(coxswain_proxy::discovery::serve(
        config("token", edge_scope.clone()),
        "127.0.0.1".parse().unwrap(),
        ([127, 0, 0, 1], free_port()).into(),
        Duration::from_secs(1),
        async {
            let _ = proxy_stopped.await;
        },
    ));

    let get = |port: u16, host: &'static str| async move {
        tokio::task::spawn_blocking(move || http_get(port, "/", host).unwrap_or_default())
            .await
            .unwrap()
    };
    let answer = eventually(
        "the dedicated route through the dedicated proxy",
        WAIT,
        || async {
            let r = get(dedicated_port, "a.example").await;
            r.starts_with("HTTP/1.1 302").then_some(r)
        },
    )
    .await;
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("location: http://dedicated.example:"),
        "{answer}"
    );
    let other = get(dedicated_port, "b.example").await;
    assert!(
        other.starts_with("HTTP/1.1 404"),
        "the shared pool's route is not served here: {other}"
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", shared_port)).is_err(),
        "the shared Gateway's listener is not bound by the dedicated proxy"
    );

    // The shared pool's identity may not subscribe to this Gateway's scope.
    let shared_token = pod_token(
        &env,
        names::SHARED_PROXY_SERVICE_ACCOUNT,
        "shared-0",
        names::TOKEN_AUDIENCE,
    )
    .await;
    std::fs::write(dir.path().join("shared-token"), shared_token).unwrap();
    let svid = coxswain_proxy::discovery::bootstrap(&config("shared-token", edge_scope.clone()))
        .await
        .unwrap();
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(
            &svid.trust_bundle_pem,
        ))
        .identity(tonic::transport::Identity::from_pem(
            &svid.chain_pem,
            &svid.key_pem,
        ))
        .domain_name("localhost");
    let channel = tonic::transport::Channel::from_shared(format!(
        "https://localhost:{}",
        controller.discovery_port
    ))
    .unwrap()
    .tls_config(tls)
    .unwrap()
    .connect()
    .await
    .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(ProxyMessage {
        kind: Some(proxy_message::Kind::Subscribe(Subscribe {
            node_id: "shared-0".into(),
            wire_version: WIRE_VERSION,
            scope: Some(edge_scope),
        })),
    })
    .await
    .unwrap();
    let result = DiscoveryClient::new(channel)
        .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await;
    let status = match result {
        Err(status) => status,
        Ok(response) => match response.into_inner().message().await {
            Err(status) => status,
            Ok(m) => panic!("the shared identity received {m:?} for a dedicated scope"),
        },
    };
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status}");

    let _ = stop_proxy.send(());
    let _ = proxy.await;
}

/// The condition of `type_` in a Gateway's status, if any: (status, reason, message).
async fn gateway_condition(
    env: &TestEnv,
    gateway: &str,
    type_: &str,
) -> Option<(String, String, String)> {
    let gw = env.api::<Gateway>().get_opt(gateway).await.ok()??;
    gw.status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status, c.reason, c.message))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_whose_gep_1762_names_collide_get_distinct_proxies() {
    use coxswain_operator::compile::proxies::{NAME_CONFLICTED, NAME_TAKEN};
    let env = TestEnv::new().await;
    let ns = env.namespace.clone();
    let _controller = start_controller(&env);
    // Gateway a-b of class c-{ns} and Gateway a of class b-c-{ns}: both a-b-c-{ns}.
    let (class_c, class_bc) = (format!("c-{ns}"), format!("b-c-{ns}"));
    let plain = names::dedicated_proxy_name("a-b", &class_c);
    assert_eq!(plain, names::dedicated_proxy_name("a", &class_bc));
    let gateway = |name: &str, class: &str, port: u16| {
        format!(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: {name}, namespace: {ns}}}
spec:
  gatewayClassName: {class}
  infrastructure:
    parametersRef: {{group: gateway.coxswain-labs.dev, kind: CoxswainGatewayParameters, name: params}}
  listeners: [{{name: http, port: {port}, protocol: HTTP}}]
"#
        )
    };
    apply_yaml(
        &env.client,
        &format!(
            "{params}---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: {class_c}}}
spec: {{controllerName: {controller}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: {class_bc}}}
spec: {{controllerName: {controller}}}
---{first}",
            params = params_yaml(&ns, "params", "serviceType: ClusterIP"),
            controller = controller_name(&env),
            first = gateway("a-b", &class_c, free_port()),
        ),
    )
    .await;
    let deployments: Api<Deployment> = env.api();
    let owner_of = |d: &Deployment| {
        d.metadata
            .owner_references
            .as_ref()
            .and_then(|o| o.first())
            .map(|o| o.name.clone())
            .unwrap_or_default()
    };
    let first = eventually("Gateway a-b's proxy under the plain name", WAIT, || {
        let (deployments, plain) = (deployments.clone(), plain.clone());
        async move { deployments.get_opt(&plain).await.ok().flatten() }
    })
    .await;
    assert_eq!(owner_of(&first), "a-b");

    // The second Gateway wanting the same name gets its own, and is told why.
    apply_yaml(&env.client, &gateway("a", &class_bc, free_port())).await;
    let renamed = names::disambiguated_proxy_name("a", &class_bc, 0);
    assert_ne!(renamed, plain);
    let second = eventually("Gateway a's proxy under a disambiguated name", WAIT, || {
        let (deployments, renamed) = (deployments.clone(), renamed.clone());
        async move { deployments.get_opt(&renamed).await.ok().flatten() }
    })
    .await;
    assert_eq!(owner_of(&second), "a");
    let service_accounts: Api<ServiceAccount> = env.api();
    let services: Api<Service> = env.api();
    // The Service is applied after the Deployment: wait for both objects, do not race them.
    for name in [&plain, &renamed] {
        eventually(&format!("ServiceAccount and Service {name}"), WAIT, || {
            let (service_accounts, services) = (service_accounts.clone(), services.clone());
            async move {
                let account = service_accounts.get_opt(name).await.ok().flatten();
                let service = services.get_opt(name).await.ok().flatten();
                (account.is_some() && service.is_some()).then_some(())
            }
        })
        .await;
    }
    let pod_account = |d: &Deployment| {
        d.spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .service_account_name
            .clone()
    };
    let first = deployments.get(&plain).await.unwrap();
    assert_eq!(
        owner_of(&first),
        "a-b",
        "the first Gateway's proxy is untouched"
    );
    assert_eq!(pod_account(&first).as_deref(), Some(plain.as_str()));
    assert_eq!(pod_account(&second).as_deref(), Some(renamed.as_str()));
    let selector = |name: &str| {
        let (services, name) = (services.clone(), name.to_owned());
        async move { services.get(&name).await.unwrap().spec.unwrap().selector }
    };
    assert_ne!(selector(&plain).await, selector(&renamed).await);

    let (status, reason, message) = eventually("the name conflict on Gateway a", WAIT, || {
        gateway_condition(&env, "a", NAME_CONFLICTED)
    })
    .await;
    assert_eq!((status.as_str(), reason.as_str()), ("True", NAME_TAKEN));
    assert!(
        message.contains(&plain) && message.contains("Gateway a-b") && message.contains(&renamed),
        "{message}"
    );
    eventually("Gateway a-b's status", WAIT, || {
        gateway_condition(&env, "a-b", "Accepted")
    })
    .await;
    assert_eq!(gateway_condition(&env, "a-b", NAME_CONFLICTED).await, None);

    // The renamed proxy's ServiceAccount is the one that gets an SVID for Gateway a.
    let trust: ConfigMap = eventually("Gateway a's trust bundle", WAIT, || {
        let (maps, trust) = (env.api::<ConfigMap>(), format!("{renamed}-trust"));
        async move { maps.get_opt(&trust).await.ok().flatten() }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.crt"), &trust.data.unwrap()["ca.crt"]).unwrap();
    let token = pod_token(&env, &renamed, "a-0", names::TOKEN_AUDIENCE).await;
    std::fs::write(dir.path().join("token"), token).unwrap();
    let svid = coxswain_proxy::discovery::bootstrap(&DiscoveryConfig {
        endpoints: vec![],
        bootstrap_endpoint: format!("https://localhost:{}", _controller.bootstrap_port),
        token_path: dir.path().join("token"),
        trust_bundle_path: dir.path().join("ca.crt"),
        scope: snap::Scope::default(),
        node_id: String::new(),
        workers: 0,
        limits: Default::default(),
        liveness: Default::default(),
    })
    .await
    .unwrap();
    assert!(
        svid.spiffe_id.ends_with(&format!("/ns/{ns}/sa/{renamed}")),
        "{}",
        svid.spiffe_id
    );

    // Once the conflict is gone, Gateway a gets its GEP-1762 name back and the condition goes.
    env.api::<Gateway>()
        .delete("a-b", &DeleteParams::default())
        .await
        .unwrap();
    eventually("Gateway a's proxy under the plain name", WAIT, || {
        let (deployments, plain) = (deployments.clone(), plain.clone());
        async move {
            let d = deployments.get_opt(&plain).await.ok()??;
            (owner_of(&d) == "a" && pod_account(&d).as_deref() == Some(plain.as_str()))
                .then_some(())
        }
    })
    .await;
    eventually("the disambiguated objects removed", WAIT, || {
        let (deployments, renamed) = (deployments.clone(), renamed.clone());
        async move {
            deployments
                .get_opt(&renamed)
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await;
    eventually("the condition cleared", WAIT, || async {
        gateway_condition(&env, "a", NAME_CONFLICTED)
            .await
            .is_none()
            .then_some(())
    })
    .await;
}

/// The Gateway's `status.addresses` values.
async fn gateway_addresses(env: &TestEnv, gateway: &str) -> Option<Vec<String>> {
    let gw = env.api::<Gateway>().get_opt(gateway).await.ok()??;
    Some(gw.status?.addresses?.into_iter().map(|a| a.value).collect())
}

// Gateway API, GatewaySpec.addresses: the requested address is asked of the proxy's
// LoadBalancer Service, and the Gateway is not Programmed until the load balancer assigns it.
// This test plays the load-balancer provider by writing the Service's status, as one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requested_address_is_asked_of_the_proxy_service_and_reported_once_assigned() {
    let env = TestEnv::new().await;
    let ns = env.namespace.clone();
    let _controller = start_controller(&env);
    let class = format!("addresses-{ns}");
    let gateway = |addresses: &str| {
        format!(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: fixed, namespace: {ns}}}
spec:
  gatewayClassName: {class}
  infrastructure:
    parametersRef: {{group: gateway.coxswain-labs.dev, kind: CoxswainGatewayParameters, name: params}}
  addresses: {addresses}
  listeners: [{{name: http, port: {port}, protocol: HTTP}}]
"#,
            port = 8080
        )
    };
    apply_yaml(
        &env.client,
        &format!(
            "{params}---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: {class}}}
spec: {{controllerName: {controller}}}
---{gw}",
            params = params_yaml(&ns, "params", "replicas: 1"),
            controller = controller_name(&env),
            gw = gateway("[{type: IPAddress, value: 203.0.113.10}]"),
        ),
    )
    .await;
    let name = names::dedicated_proxy_name("fixed", &class);
    let services = env.api::<Service>();
    eventually("spec.loadBalancerIP on the proxy's Service", WAIT, || {
        let (services, name) = (services.clone(), name.clone());
        async move {
            let svc = services.get_opt(&name).await.ok()??;
            (svc.spec?.load_balancer_ip.as_deref() == Some("203.0.113.10")).then_some(())
        }
    })
    .await;
    let (status, _, message) = eventually("Programmed=False, AddressNotAssigned", WAIT, || async {
        gateway_condition(&env, "fixed", "Programmed")
            .await
            .filter(|(_, why, _)| why == "AddressNotAssigned")
    })
    .await;
    assert_eq!(status, "False");
    assert!(message.contains("203.0.113.10"), "{message}");
    assert_eq!(
        gateway_addresses(&env, "fixed").await.unwrap_or_default(),
        ["203.0.113.10"]
    );

    // The provider assigns it: no address problem is left (no proxy runs here, so the
    // Gateway waits for one, Pending).
    let lb = serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}});
    services
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&lb))
        .await
        .unwrap();
    eventually("Programmed waiting for a proxy only", WAIT, || async {
        gateway_condition(&env, "fixed", "Programmed")
            .await
            .filter(|(_, why, _)| why == "Pending")
    })
    .await;

    // Two addresses cannot be asked of one LoadBalancer Service: nothing is asked, and the
    // Gateway says why.
    apply_yaml(
        &env.client,
        &gateway("[{value: 203.0.113.10}, {value: 203.0.113.11}]"),
    )
    .await;
    let (_, _, message) = eventually("Programmed=False, AddressNotUsable", WAIT, || async {
        gateway_condition(&env, "fixed", "Programmed")
            .await
            .filter(|(_, why, _)| why == "AddressNotUsable")
    })
    .await;
    assert!(message.contains("keep one"), "{message}");
    eventually("spec.loadBalancerIP withdrawn", WAIT, || {
        let (services, name) = (services.clone(), name.clone());
        async move {
            let svc = services.get_opt(&name).await.ok()??;
            svc.spec?.load_balancer_ip.is_none().then_some(())
        }
    })
    .await;
}
