//! The install manifests on a real control plane: `kubectl apply -k config/default` works, the
//! controller runs through its main scenarios on nothing but the rights config/rbac gives its
//! ServiceAccount (a TokenRequest token in a kubeconfig, no admin credentials anywhere), and the
//! shared proxy's ServiceAccount holds no rights at all.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_api::names;
use coxswain_operator::bundle;
use coxswain_testenv::{TestEnv, eventually};
use gateway_api::apis::experimental::httproutes::HttpRoute;
use gateway_api::apis::standard::gatewayclasses::GatewayClass;
use gateway_api::apis::standard::gateways::Gateway;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use kube::Api;
use kube::api::{ListParams, ObjectMeta, PostParams};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::{free_port, get};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs a command to completion off the async runtime; its stdout, or a panic with both
/// streams.
async fn run(mut cmd: Command, what: &str) -> String {
    let what = what.to_owned();
    tokio::task::spawn_blocking(move || {
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
    .await
    .unwrap()
}

/// `kubectl apply -k config/default`, once per test binary: two client-side applies racing
/// would both try to create the namespace.
async fn apply_config_default(env: &TestEnv) {
    static APPLIED: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let mut cmd = env.cluster().kubectl();
    cmd.arg("apply")
        .arg("-k")
        .arg(repo_root().join("config/default"));
    tokio::task::spawn_blocking(move || {
        let mut applied = APPLIED.lock().unwrap_or_else(|p| p.into_inner());
        if *applied {
            return;
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "kubectl apply -k config/default failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        *applied = true;
    })
    .await
    .unwrap();
}

/// A child process killed when the test ends, however it ends.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A token for `namespace/name`, from the TokenRequest API; `audience` None means the API
/// server's own audience.
async fn token(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    audience: Option<&str>,
) -> String {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let req = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: audience.map(|a| vec![a.to_owned()]),
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let issued: TokenRequest = sas
        .create_subresource("token", name, &PostParams::default(), &req)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for {namespace}/{name}: {e}"));
    issued.status.unwrap().token.unwrap()
}

/// A kubeconfig for the test cluster that authenticates with `token` only.
fn token_kubeconfig(admin: &Path, token: &str, namespace: &str, out: &Path) {
    let admin: Value = serde_yaml::from_str(&std::fs::read_to_string(admin).unwrap()).unwrap();
    let cluster = &admin["clusters"][0]["cluster"];
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": cluster["server"],
            "certificate-authority-data": cluster["certificate-authority-data"],
        }}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": "sa", "namespace": namespace}}],
        "current-context": "sa",
    });
    std::fs::write(out, serde_yaml::to_string(&config).unwrap()).unwrap();
}

fn condition(status: &Value, type_: &str) -> Option<(String, String)> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_owned(),
                c["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_default_installs_and_its_rbac_is_all_the_controller_needs() {
    let env = TestEnv::new().await;
    let client = env.client.clone();
    let system = names::DEFAULT_NAMESPACE;
    let admin_kubeconfig = env.cluster().kubeconfig().to_owned();

    // 1. The install manifests apply as they are.
    apply_config_default(&env).await;

    // Both Deployments' Pods are admitted in a namespace enforcing the restricted Pod Security
    // Standard (no test node runs them here).
    let pods: Api<Pod> = Api::namespaced(client.clone(), system);
    for component in [
        names::labels::COMPONENT_CONTROLLER,
        names::labels::COMPONENT_SHARED_PROXY,
    ] {
        let selector = format!("{}={component}", names::labels::COMPONENT);
        let pods = pods.clone();
        eventually(
            &format!("two {component} Pods"),
            Duration::from_secs(60),
            || {
                let (pods, selector) = (pods.clone(), selector.clone());
                async move {
                    let list = pods
                        .list(&ListParams::default().labels(&selector))
                        .await
                        .ok()?;
                    (list.items.len() == 2).then_some(())
                }
            },
        )
        .await;
    }
    let controller_pod = pods
        .list(&ListParams::default().labels(&format!(
            "{}={}",
            names::labels::COMPONENT,
            names::labels::COMPONENT_CONTROLLER
        )))
        .await
        .unwrap()
        .items[0]
        .metadata
        .name
        .clone()
        .unwrap();

    // 2. The controller, with its ServiceAccount's token and nothing else.
    let dir = tempfile::tempdir().unwrap();
    let controller_kubeconfig = dir.path().join("controller.kubeconfig");
    token_kubeconfig(
        &admin_kubeconfig,
        &token(&client, system, "coxswain-controller", None).await,
        system,
        &controller_kubeconfig,
    );
    let (discovery, bootstrap) = (free_port(), free_port());
    // The shared Gateway's internal port (its own Service maps its listener port to it): one
    // free port on this machine, the range the controller may hand out.
    let internal = free_port();
    let controller_log = dir.path().join("controller.log");
    let log_file = std::fs::File::create(&controller_log).unwrap();
    let mut controller = Process(
        Command::new(env!("CARGO_BIN_EXE_coxswain"))
            .args(["serve", "controller"])
            .args(["--discovery-addr", &format!("127.0.0.1:{discovery}")])
            .args(["--bootstrap-addr", &format!("127.0.0.1:{bootstrap}")])
            .args(["--shared-gateway-ports", &format!("{internal}-{internal}")])
            .args(["--health-addr", &format!("127.0.0.1:{}", free_port())])
            .args(["--metrics-addr", &format!("127.0.0.1:{}", free_port())])
            .env("KUBECONFIG", &controller_kubeconfig)
            .env("COXSWAIN_NAMESPACE", system)
            .env("COXSWAIN_POD_NAME", &controller_pod)
            // Debug: watch errors (a missing list or watch right) are logged at debug level.
            .env(
                "COXSWAIN_LOG",
                "debug,hyper=info,hyper_util=info,h2=info,rustls=info,tower=info,tonic=info",
            )
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .unwrap(),
    );

    // 3. The shared proxy: its audience-bound token and the trust bundle the controller
    // published, no kubeconfig.
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), system);
    let ca = eventually(
        "the trust bundle ConfigMap",
        Duration::from_secs(30),
        || {
            let maps = maps.clone();
            async move {
                maps.get_opt(names::TRUST_BUNDLE_CONFIGMAP)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|cm| cm.data)
                    .and_then(|d| d.get("ca.crt").cloned())
            }
        },
    )
    .await;
    std::fs::write(dir.path().join("ca.crt"), ca).unwrap();
    std::fs::write(
        dir.path().join("token"),
        // Bound to a Pod, as the kubelet's projected token is: the SVID names that Pod.
        support::pod_token_in(
            &client,
            system,
            names::SHARED_PROXY_SERVICE_ACCOUNT,
            "coxswain-proxy-0",
            names::TOKEN_AUDIENCE,
        )
        .await,
    )
    .unwrap();
    let shutdown_delay = Duration::from_secs(2);
    let mut proxy = Process(
        Command::new(env!("CARGO_BIN_EXE_coxswain"))
            .args(["serve", "proxy", "--shared", "--bind-address", "127.0.0.1"])
            .args([
                "--shutdown-delay-seconds",
                &shutdown_delay.as_secs().to_string(),
            ])
            .args([
                "--discovery-endpoint",
                &format!("https://localhost:{discovery}"),
            ])
            .args([
                "--discovery-bootstrap-endpoint",
                &format!("https://localhost:{bootstrap}"),
            ])
            .arg("--discovery-trust-bundle")
            .arg(dir.path().join("ca.crt"))
            .arg("--token-path")
            .arg(dir.path().join("token"))
            .args(["--health-addr", &format!("127.0.0.1:{}", free_port())])
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

    // 4. What users apply: every kind the controller watches. The Ingress belongs to another
    // class, so the shared proxy does not try to bind port 80 on this machine.
    let ns = &env.namespace;
    let listen = free_port();
    let objects = format!(
        r#"
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
  - matches: [{{path: {{type: PathPrefix, value: /old}}}}]
    filters: [{{type: RequestRedirect, requestRedirect: {{hostname: new.example, statusCode: 301}}}}]
  - backendRefs: [{{name: app, port: 80}}]
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {{name: from-anywhere, namespace: {ns}}}
spec:
  from: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: default}}]
  to: [{{group: "", kind: Service}}]
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {{name: someone-else}}
spec: {{controller: example.com/other-controller}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: app, namespace: {ns}}}
spec:
  ingressClassName: someone-else
  rules: [{{host: app.example, http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: app, port: {{number: 80}}}}}}}}]}}}}]
---
apiVersion: ingress.coxswain-labs.dev/v1alpha1
kind: CoxswainIngressClassParameters
metadata: {{name: defaults, namespace: {ns}}}
spec: {{accessLog: true}}
---
# A Gateway with a dedicated proxy: provisioning applies its ServiceAccount, trust bundle,
# Deployment and Service in this namespace (the Pods stay pending: no node runs them here).
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainGatewayParameters
metadata: {{name: dedicated, namespace: {ns}}}
spec: {{replicas: 1, serviceType: ClusterIP}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: own-proxy, namespace: {ns}}}
spec:
  gatewayClassName: {class}
  infrastructure:
    parametersRef: {{group: gateway.coxswain-labs.dev, kind: CoxswainGatewayParameters, name: dedicated}}
  listeners: [{{name: http, port: 8080, protocol: HTTP}}]
"#,
        class = names::CLASS_NAME,
        controller = names::CONTROLLER_NAME,
    );
    let manifests = dir.path().join("objects.yaml");
    std::fs::write(&manifests, objects).unwrap();
    let mut apply = env.cluster().kubectl();
    apply.args(["apply", "--server-side", "-f"]).arg(&manifests);
    run(apply, "kubectl apply the users' objects").await;

    // 5. Routing reaches the credential-less proxy (reflector, compiler, TokenReview, SVID,
    // discovery stream), on the Gateway's internal port: no Service network forwards the
    // listener port here, so the test connects where the Service would ...
    let answer = eventually(
        "the route served by the shared proxy",
        Duration::from_secs(60),
        || async {
            get(internal, "/old/page")
                .await
                .ok()
                .filter(|r| r.starts_with("HTTP/1.1 301"))
        },
    )
    .await;
    let location = answer
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("location: ")
                .map(str::to_owned)
        })
        .unwrap_or_default();
    assert_eq!(
        location,
        format!("http://new.example:{listen}/old/page"),
        "the redirect keeps the port the client addressed, not the internal one: {answer}"
    );

    // ... through the Service the controller made for the Gateway, in its own namespace
    // (the rights config/rbac gives it cover that too) ...
    let system_services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(client.clone(), system);
    let gateway_service = names::shared_gateway_service_name(ns, "edge");
    let ports = eventually(
        "the shared Gateway's own Service",
        Duration::from_secs(60),
        || {
            let (services, name) = (system_services.clone(), gateway_service.clone());
            async move {
                let svc = services.get_opt(&name).await.ok()??;
                let p = svc.spec?.ports?.first()?.clone();
                Some((p.port, p.target_port))
            }
        },
    )
    .await;
    assert_eq!(
        ports,
        (
            i32::from(listen),
            Some(
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i32::from(internal))
            )
        )
    );

    // ... and status is written: GatewayClass, Gateway (Programmed after bind and ack),
    // HTTPRoute.
    let classes: Api<GatewayClass> = Api::all(client.clone());
    let gateways: Api<Gateway> = env.api();
    let routes: Api<HttpRoute> = env.api();
    eventually(
        "status on the GatewayClass, Gateway and HTTPRoute",
        Duration::from_secs(60),
        || {
            let (classes, gateways, routes) = (classes.clone(), gateways.clone(), routes.clone());
            async move {
                let class =
                    serde_json::to_value(classes.get(names::CLASS_NAME).await.ok()?.status).ok()?;
                let gateway = serde_json::to_value(gateways.get("edge").await.ok()?.status).ok()?;
                let route = serde_json::to_value(routes.get("app").await.ok()?.status).ok()?;
                let accepted = Some(("True".to_owned(), "Accepted".to_owned()));
                (condition(&class, "Accepted") == accepted
                    && condition(&gateway, "Accepted") == accepted
                    && condition(&gateway, "Programmed")
                        == Some(("True".into(), "Programmed".into()))
                    && condition(&route["parents"][0], "Accepted") == accepted)
                    .then_some(())
            }
        },
    )
    .await;

    // ... and the Gateway with its own parameters gets its dedicated proxy's objects.
    let dedicated = names::dedicated_proxy_name("own-proxy", names::CLASS_NAME);
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = env.api();
    let services: Api<k8s_openapi::api::core::v1::Service> = env.api();
    let accounts: Api<ServiceAccount> = env.api();
    eventually(
        "the dedicated proxy's objects",
        Duration::from_secs(60),
        || {
            let (deployments, services, accounts) =
                (deployments.clone(), services.clone(), accounts.clone());
            let name = dedicated.clone();
            async move {
                deployments.get_opt(&name).await.ok()??;
                services.get_opt(&name).await.ok()??;
                accounts.get_opt(&name).await.ok()??;
                Some(())
            }
        },
    )
    .await;

    // 5b. Stopping the shared proxy: for --shutdown-delay-seconds after SIGTERM it still
    // serves new connections (a Pod leaves its Service's endpoints only as it is signalled, so
    // connections keep arriving for a moment), then drains and exits.
    let pid = proxy.0.id().to_string();
    run(
        {
            let mut kill = Command::new("kill");
            kill.args(["-TERM", &pid]);
            kill
        },
        "kill -TERM proxy",
    )
    .await;
    let signalled = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let late = get(internal, "/old/page").await;
    assert!(
        late.as_ref().is_ok_and(|r| r.starts_with("HTTP/1.1 301")),
        "a new connection 300 ms after SIGTERM was not served: {late:?}"
    );
    let status = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::task::spawn_blocking(move || {
            let status = proxy.0.wait().unwrap();
            std::mem::forget(proxy);
            status
        }),
    )
    .await
    .expect("the shared proxy did not exit after its delay and drain")
    .unwrap();
    assert!(status.success(), "shared proxy exited with {status}");
    assert!(
        signalled.elapsed() >= shutdown_delay,
        "exited {:?} after SIGTERM, before its {shutdown_delay:?} delay",
        signalled.elapsed()
    );
    assert!(
        get(internal, "/old/page").await.is_err(),
        "a connection was accepted after the proxy exited"
    );

    // 6. Leadership: the Lease is held by this replica, and its Pod carries the leader label
    // that the discovery Service selects.
    let leases: Api<Lease> = Api::namespaced(client.clone(), system);
    let lease = leases.get(names::LEADER_LEASE).await.unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some(controller_pod.as_str())
    );
    let labelled = |pod: Pod| {
        pod.metadata
            .labels
            .unwrap_or_default()
            .get(names::LEADER_LABEL)
            .cloned()
    };
    let pod = pods.get(&controller_pod).await.unwrap();
    assert_eq!(labelled(pod).as_deref(), Some(names::LEADER_LABEL_VALUE));
    let secrets: Api<Secret> = Api::namespaced(client.clone(), system);
    assert!(secrets.get_opt(names::CA_SECRET).await.unwrap().is_some());

    // 7. A clean stop hands the Lease back and takes the label off.
    let pid = controller.0.id().to_string();
    run(
        {
            let mut kill = Command::new("kill");
            kill.args(["-TERM", &pid]);
            kill
        },
        "kill -TERM controller",
    )
    .await;
    let status = tokio::task::spawn_blocking(move || {
        let status = controller.0.wait().unwrap();
        std::mem::forget(controller);
        status
    })
    .await
    .unwrap();
    let log = std::fs::read_to_string(&controller_log).unwrap();
    assert!(status.success(), "controller exited with {status}:\n{log}");
    let pod = pods.get(&controller_pod).await.unwrap();
    assert_eq!(labelled(pod), None, "leader label left behind");

    // 8. Not one request of the run was refused.
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.to_ascii_lowercase().contains("forbidden"))
        .collect();
    assert!(
        refused.is_empty(),
        "the controller's ServiceAccount lacks rights:\n{}",
        refused.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_proxy_service_account_has_no_rights() {
    let env = TestEnv::new().await;
    let client = env.client.clone();
    let system = names::DEFAULT_NAMESPACE;
    apply_config_default(&env).await;

    // Nothing binds it, in any namespace.
    let bound = |subjects: Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects.unwrap_or_default().iter().any(|s| {
            s.kind == "ServiceAccount"
                && s.name == names::SHARED_PROXY_SERVICE_ACCOUNT
                && s.namespace.as_deref() == Some(system)
        })
    };
    let crbs: Api<ClusterRoleBinding> = Api::all(client.clone());
    for b in crbs.list(&ListParams::default()).await.unwrap() {
        assert!(!bound(b.subjects), "{:?} binds the proxy", b.metadata.name);
    }
    let rbs: Api<RoleBinding> = Api::all(client.clone());
    for b in rbs.list(&ListParams::default()).await.unwrap() {
        assert!(!bound(b.subjects), "{:?} binds the proxy", b.metadata.name);
    }

    // `kubectl auth can-i --list` as the proxy shows exactly what a ServiceAccount that nothing
    // mentions gets: the self-review APIs every authenticated user has, and no resource.
    let sas: Api<ServiceAccount> = env.api();
    sas.create(
        &PostParams::default(),
        &ServiceAccount {
            metadata: ObjectMeta {
                name: Some("nobody".into()),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let admin = env.cluster().kubeconfig().to_owned();
    let proxy_config = dir.path().join("proxy.kubeconfig");
    let nobody_config = dir.path().join("nobody.kubeconfig");
    token_kubeconfig(
        &admin,
        &token(&client, system, names::SHARED_PROXY_SERVICE_ACCOUNT, None).await,
        system,
        &proxy_config,
    );
    token_kubeconfig(
        &admin,
        &token(&client, &env.namespace, "nobody", None).await,
        system,
        &nobody_config,
    );
    let kubectl = coxswain_testenv::k8s_bin_dir().join("kubectl");
    for namespace in [system, env.namespace.as_str()] {
        let can_i = |config: &Path| {
            let mut cmd = Command::new(&kubectl);
            cmd.arg("--kubeconfig")
                .arg(config)
                .args(["auth", "can-i", "--list", "-n", namespace]);
            cmd
        };
        let whoami = {
            let mut cmd = Command::new(&kubectl);
            cmd.arg("--kubeconfig").arg(&proxy_config).args([
                "auth",
                "whoami",
                "-o",
                "jsonpath={.status.userInfo.username}",
            ]);
            cmd
        };
        assert_eq!(
            run(whoami, "kubectl auth whoami as the proxy").await,
            format!(
                "system:serviceaccount:{system}:{}",
                names::SHARED_PROXY_SERVICE_ACCOUNT
            )
        );
        let proxy = run(
            can_i(&proxy_config),
            "kubectl auth can-i --list as the proxy",
        )
        .await;
        let nobody = run(can_i(&nobody_config), "kubectl auth can-i --list as nobody").await;
        assert_eq!(
            proxy, nobody,
            "the proxy has rights a bare ServiceAccount lacks"
        );
        let resources: Vec<&str> = proxy
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next())
            .filter(|r| !r.starts_with('['))
            .collect();
        assert!(
            resources.iter().all(|r| r.starts_with("selfsubject")),
            "rights on resources in {namespace}:\n{proxy}"
        );
    }
}

/// Numbers as f64: kustomize prints `1` where the CRD file says `1.0`.
fn normalize(v: Value) -> Value {
    match v {
        Value::Number(n) => n
            .as_f64()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::Null, Value::Number),
        Value::Array(a) => Value::Array(a.into_iter().map(normalize).collect()),
        Value::Object(m) => Value::Object(m.into_iter().map(|(k, v)| (k, normalize(v))).collect()),
        other => other,
    }
}

/// `coxswain bundle` reads config/ itself; it must see what kustomize builds.
#[test]
fn the_bundle_reads_config_as_kustomize_builds_it() {
    for dir in ["config/default", "config/manifests"] {
        let out = Command::new(coxswain_testenv::k8s_bin_dir().join("kubectl"))
            .arg("kustomize")
            .arg(repo_root().join(dir))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl kustomize {dir}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let key = |v: &Value| {
            format!(
                "{}/{}/{}/{}",
                v["apiVersion"], v["kind"], v["metadata"]["namespace"], v["metadata"]["name"]
            )
        };
        let mut built: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
            .map(|d| normalize(serde::Deserialize::deserialize(d).unwrap()))
            .collect();
        built.sort_by_key(|v| key(v));
        let mut ours: Vec<Value> = bundle::config::build(&repo_root().join(dir))
            .unwrap()
            .into_iter()
            .map(|o| normalize(o.value))
            .collect();
        ours.sort_by_key(|v| key(v));
        assert_eq!(built.len(), ours.len(), "{dir}: object count");
        for (k, o) in built.iter().zip(&ours) {
            assert!(
                k == o,
                "{dir}: {} differs from kustomize's:\n{k}\n{o}",
                key(o)
            );
        }
    }
}
