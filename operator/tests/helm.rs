//! The Helm chart generated from config/default (`make helm`), through the real helm binary
//! (built from its Go module): it lints, renders to exactly what config/default installs with
//! its default values, its values change what they say, and installed on the local cluster it
//! runs the controller and the shared pool, programs a Gateway, and uninstalls cleanly.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_operator::bundle::config;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chart_dir() -> PathBuf {
    repo().join(coxswain_operator::helm::DEFAULT_OUT_DIR)
}

fn helm() -> Command {
    let mut cmd = Command::new(support::helm_bin());
    // No repository cache, plugins or registry config of the machine's user.
    let home = std::env::temp_dir().join(format!("coxswain-helm-home-{}", std::process::id()));
    cmd.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    cmd
}

fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{:?} failed: {}{}",
            cmd,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `helm template` of the chart in `coxswain-system` with `--set` values: (kind, name) -> object.
fn render(sets: &[&str]) -> Result<BTreeMap<(String, String), Value>, String> {
    let mut cmd = helm();
    cmd.args(["template", "coxswain"])
        .arg(chart_dir())
        .args(["--namespace", "coxswain-system"]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let text = run(&mut cmd)?;
    let mut out = BTreeMap::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value: Value = serde::Deserialize::deserialize(doc).unwrap();
        if value.is_null() {
            continue;
        }
        let key = (
            value["kind"].as_str().unwrap().to_owned(),
            value["metadata"]["name"].as_str().unwrap().to_owned(),
        );
        assert!(out.insert(key.clone(), value).is_none(), "{key:?} twice");
    }
    Ok(out)
}

#[test]
fn the_chart_passes_helm_lint_strict() {
    let out = run(helm().args(["lint", "--strict"]).arg(chart_dir())).unwrap();
    assert!(out.contains("0 chart(s) failed"), "{out}");
}

#[test]
fn default_values_render_what_config_default_installs() {
    let rendered = render(&[]).unwrap();
    let mut expected = BTreeMap::new();
    for obj in config::build(&repo().join("config/default")).unwrap() {
        // Helm keeps the release in its namespace, so the namespace exists before the chart.
        if obj.kind() == "Namespace" {
            continue;
        }
        let mut value = obj.value.clone();
        // The one intended difference: CRDs outlive the release (crds.keep).
        if obj.kind() == "CustomResourceDefinition" {
            value["metadata"]["annotations"] =
                serde_json::json!({"helm.sh/resource-policy": "keep"});
        }
        expected.insert((obj.kind().to_owned(), obj.name().to_owned()), value);
    }
    assert_eq!(
        rendered.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (key, want) in &expected {
        assert_eq!(&rendered[key], want, "{key:?}");
    }
}

fn container(objects: &BTreeMap<(String, String), Value>, deployment: &str) -> Value {
    objects[&("Deployment".to_owned(), deployment.to_owned())]["spec"]["template"]["spec"]
        ["containers"][0]
        .clone()
}

#[test]
fn tracing_values_reach_both_deployments() {
    let rendered = render(&[
        "tracing.endpoint=http://otel-collector.observability:4317",
        "tracing.samplingRatio=0.25",
    ])
    .unwrap();
    for deployment in ["coxswain-controller", "coxswain-proxy"] {
        let env = container(&rendered, deployment)["env"].clone();
        let value = |name: &str| {
            env.as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == name)
                .map(|e| e["value"].clone())
        };
        assert_eq!(
            value("COXSWAIN_OTLP_ENDPOINT"),
            Some("http://otel-collector.observability:4317".into()),
            "{deployment}: {env}"
        );
        assert_eq!(
            value("COXSWAIN_TRACE_SAMPLING_RATIO"),
            Some("0.25".into()),
            "{deployment}: {env}"
        );
    }
    // The values schema refuses what the binaries would refuse at start.
    let err = render(&["tracing.endpoint=otel-collector:4317"]).unwrap_err();
    assert!(err.contains("tracing"), "{err}");
    let err = render(&["tracing.samplingRatio=2"]).unwrap_err();
    assert!(err.contains("samplingRatio"), "{err}");
}

#[test]
fn values_set_the_image_replicas_resources_and_what_is_installed() {
    let rendered = render(&[
        "image.repository=registry.example/coxswain",
        "image.tag=v9.9.9",
        "controller.replicas=3",
        "controller.resources.limits.memory=1Gi",
        "sharedPool.replicas=5",
        "sharedPool.resources.requests.cpu=2",
        "crds.keep=false",
    ])
    .unwrap();
    let controller = &rendered[&("Deployment".into(), "coxswain-controller".into())];
    assert_eq!(controller["spec"]["replicas"], 3);
    let c = container(&rendered, "coxswain-controller");
    assert_eq!(c["image"], "registry.example/coxswain:v9.9.9");
    let proxy_image = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "COXSWAIN_PROXY_IMAGE")
        .unwrap();
    assert_eq!(proxy_image["value"], "registry.example/coxswain:v9.9.9");
    assert_eq!(c["resources"]["limits"]["memory"], "1Gi");
    assert_eq!(c["resources"]["requests"]["cpu"], "100m", "defaults merge");
    let pool = &rendered[&("Deployment".into(), "coxswain-proxy".into())];
    assert_eq!(pool["spec"]["replicas"], 5);
    let p = container(&rendered, "coxswain-proxy");
    assert_eq!(p["image"], "registry.example/coxswain:v9.9.9");
    assert_eq!(p["resources"]["requests"]["cpu"], 2);
    for ((kind, name), obj) in &rendered {
        if kind == "CustomResourceDefinition" {
            assert!(obj["metadata"].get("annotations").is_none(), "{name}");
        }
    }

    // Without the shared pool and the CRDs: the controller and its objects only.
    let rendered = render(&["sharedPool.enabled=false", "crds.install=false"]).unwrap();
    let kinds: Vec<_> = rendered
        .iter()
        .filter(|(_, o)| {
            o["kind"] == "CustomResourceDefinition"
                || o["metadata"]["labels"]["app.kubernetes.io/component"] == "shared-proxy"
        })
        .map(|(k, _)| k)
        .collect();
    assert!(kinds.is_empty(), "{kinds:?}");
    assert!(rendered.contains_key(&("Deployment".into(), "coxswain-controller".into())));
}

#[test]
fn a_misspelt_or_mistyped_value_is_refused_with_its_path() {
    let err = render(&["controller.replica=3"]).unwrap_err();
    assert!(err.contains("replica"), "{err}");
    let err = render(&["sharedPool.enabled=maybe"]).unwrap_err();
    assert!(err.contains("/sharedPool/enabled"), "{err}");
}

mod installed {
    use super::*;
    use coxswain_api::names;
    use coxswain_testenv::{TestEnv, eventually};
    use gateway_api::apis::standard::gateways::Gateway;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use k8s_openapi::api::rbac::v1::ClusterRole;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::Api;
    use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
    use std::time::Duration;

    const WAIT: Duration = Duration::from_secs(120);
    const CRDS: [&str; 4] = [
        "coxswaingatewayparameters.gateway.coxswain-labs.dev",
        "coxswainingressclassparameters.ingress.coxswain-labs.dev",
        "coxswainbackendpolicies.gateway.coxswain-labs.dev",
        "coxswainaccesspolicies.gateway.coxswain-labs.dev",
    ];

    async fn ready_replicas(api: &Api<Deployment>, name: &str, want: i32) {
        eventually(
            &format!("Deployment {name} with {want} ready replicas"),
            WAIT,
            || {
                let api = api.clone();
                async move {
                    let d = api.get_opt(name).await.ok()??;
                    (d.status?.ready_replicas? >= want).then_some(())
                }
            },
        )
        .await;
    }

    fn helm_on(kubeconfig: &Path, args: &[&str]) -> String {
        let mut cmd = helm();
        cmd.arg("--kubeconfig").arg(kubeconfig).args(args);
        run(&mut cmd).unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn helm_install_runs_coxswain_and_helm_uninstall_removes_it() {
        let env = TestEnv::new().await;
        let cluster = env.cluster();
        tokio::task::spawn_blocking(move || {
            cluster.start_node(&[("coxswain", Path::new(env!("CARGO_BIN_EXE_coxswain")))])
        })
        .await
        .unwrap();
        let kubeconfig = cluster.kubeconfig().to_owned();

        // The local cluster comes with Coxswain's CRDs; the chart is to install them itself.
        let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
        for crd in CRDS {
            let _ = crds.delete(crd, &DeleteParams::default()).await;
        }
        eventually("Coxswain's CRDs gone", WAIT, || {
            let crds = crds.clone();
            async move {
                for crd in CRDS {
                    if crds.get_opt(crd).await.ok()?.is_some() {
                        return None;
                    }
                }
                Some(())
            }
        })
        .await;

        // What the docs tell a person: the namespace first, at the restricted Pod Security level.
        let system = names::DEFAULT_NAMESPACE;
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(system.into()),
                labels: Some(
                    [(
                        "pod-security.kubernetes.io/enforce".to_owned(),
                        "restricted".to_owned(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(env.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        let chart = chart_dir();
        let out = tokio::task::spawn_blocking({
            let kubeconfig = kubeconfig.clone();
            move || {
                helm_on(
                    &kubeconfig,
                    &[
                        "install",
                        "coxswain",
                        chart.to_str().unwrap(),
                        "--namespace",
                        system,
                    ],
                )
            }
        })
        .await
        .unwrap();
        assert!(out.contains("STATUS: deployed"), "{out}");

        let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), system);
        ready_replicas(&deployments, "coxswain-controller", 2).await;
        ready_replicas(&deployments, "coxswain-proxy", 2).await;
        for crd in CRDS {
            crds.get(crd).await.unwrap();
        }

        // A Gateway on the shared pool becomes Programmed.
        let ns = &env.namespace;
        support::apply_yaml(
            &env.client,
            &format!(
                r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: coxswain-helm}}
spec: {{controllerName: {controller}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: main, namespace: {ns}}}
spec:
  gatewayClassName: coxswain-helm
  listeners: [{{name: http, port: 80, protocol: HTTP}}]
"#,
                controller = names::CONTROLLER_NAME
            ),
        )
        .await;
        let gateways: Api<Gateway> = env.api();
        eventually("Gateway main Programmed", WAIT, || {
            let gateways = gateways.clone();
            async move {
                let status = gateways.get("main").await.ok()?.status?;
                let programmed = status
                    .conditions?
                    .into_iter()
                    .find(|c| c.type_ == "Programmed")?;
                (programmed.status == "True").then_some(())
            }
        })
        .await;

        // The controller's own RBAC lets it write the status of Coxswain's parameters kinds.
        support::apply_yaml(
            &env.client,
            &format!(
                r#"
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainGatewayParameters
metadata: {{name: spare, namespace: {ns}}}
spec: {{replicas: 1}}
---
apiVersion: ingress.coxswain-labs.dev/v1alpha1
kind: CoxswainIngressClassParameters
metadata: {{name: spare, namespace: {ns}}}
spec: {{accessLog: false}}
"#
            ),
        )
        .await;
        let gwp: Api<coxswain_api::CoxswainGatewayParameters> = env.api();
        let icp: Api<coxswain_api::CoxswainIngressClassParameters> = env.api();
        eventually("both parameters objects Accepted", WAIT, || {
            let (gwp, icp) = (gwp.clone(), icp.clone());
            async move {
                let a = gwp.get("spare").await.ok()?.status?.conditions;
                let b = icp.get("spare").await.ok()?.status?.conditions;
                let ok = |c: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]| {
                    c.iter()
                        .any(|c| c.type_ == "Accepted" && c.status == "True")
                };
                (ok(&a) && ok(&b)).then_some(())
            }
        })
        .await;

        let out = tokio::task::spawn_blocking(move || {
            helm_on(
                &kubeconfig,
                &["uninstall", "coxswain", "--namespace", system],
            )
        })
        .await
        .unwrap();
        assert!(out.contains("uninstalled"), "{out}");
        // The controller and the pool are gone, Pods included; the cluster-wide RBAC too; the
        // CRDs stay (crds.keep), so parameters objects survive a reinstall.
        let pods: Api<Pod> = Api::namespaced(env.client.clone(), system);
        let roles: Api<ClusterRole> = Api::all(env.client.clone());
        eventually(
            "no Deployment, Pod or ClusterRole of the release",
            WAIT,
            || {
                let (deployments, pods, roles) = (deployments.clone(), pods.clone(), roles.clone());
                async move {
                    let d = deployments.list(&ListParams::default()).await.ok()?;
                    let p = pods.list(&ListParams::default()).await.ok()?;
                    let r = roles.get_opt("coxswain-controller").await.ok()?;
                    (d.items.is_empty() && p.items.is_empty() && r.is_none()).then_some(())
                }
            },
        )
        .await;
        for crd in CRDS {
            crds.get(crd).await.unwrap();
        }
    }
}
