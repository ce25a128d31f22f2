//! The `coxswain` binary's command-line contract, run as a process.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

use std::path::Path;
use std::process::{Command, Output};

fn coxswain(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_coxswain"));
    // Flags may also come from the environment; the tests must not inherit any.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("COXSWAIN_") {
            cmd.env_remove(key);
        }
    }
    cmd.args(args).output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn help_lists_the_roles() {
    let out = coxswain(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("serve") && help.contains("crd"), "{help}");

    let out = coxswain(&["serve", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("controller") && help.contains("proxy"),
        "{help}"
    );

    let out = coxswain(&["serve", "proxy", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--shared",
        "--dedicated",
        "--gateway-name",
        "--gateway-namespace",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}

#[test]
fn dedicated_proxy_without_gateway_name_is_a_usage_error() {
    let out = coxswain(&[
        "serve",
        "proxy",
        "--dedicated",
        "--gateway-namespace",
        "web",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("--gateway-name"), "{err}");
}

#[test]
fn proxy_needs_exactly_one_mode() {
    let out = coxswain(&["serve", "proxy"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--shared"), "{}", stderr(&out));
    let out = coxswain(&["serve", "proxy", "--shared", "--dedicated"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn crd_output_is_byte_identical_to_config_crd_bases() {
    let out = coxswain(&["crd"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let bases = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/crd/bases");
    let mut files: Vec<_> = std::fs::read_dir(&bases)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let committed: String = files
        .iter()
        .map(|p| format!("---\n{}", std::fs::read_to_string(p).unwrap()))
        .collect();
    assert!(
        out.stdout == committed.as_bytes(),
        "`coxswain crd` differs from config/crd/bases; run `make manifests` and commit"
    );
}

#[test]
fn crd_out_dir_writes_one_file_per_crd() {
    let dir = tempfile::tempdir().unwrap();
    let out = coxswain(&["crd", "--out-dir", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "gateway.coxswain-labs.dev_coxswainaccesspolicies.yaml",
            "gateway.coxswain-labs.dev_coxswainbackendpolicies.yaml",
            "gateway.coxswain-labs.dev_coxswaingatewayparameters.yaml",
            "ingress.coxswain-labs.dev_coxswainingressclassparameters.yaml"
        ]
    );
}

#[test]
fn the_controller_without_an_api_server_fails_with_a_clear_message() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_coxswain"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("COXSWAIN_") {
            cmd.env_remove(key);
        }
    }
    let out = cmd
        .args(["serve", "controller"])
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", "/nonexistent")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("connecting to the Kubernetes API"),
        "{}",
        stderr(&out)
    );
}

/// Our GatewayClass and a Gateway `web/edge` listening on 8080: the start of every fixture.
const CLASS_AND_GATEWAY: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: coxswain}
spec: {controllerName: coxswain-labs.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: web}
spec:
  gatewayClassName: coxswain
  listeners: [{name: http, port: 8080, protocol: HTTP}]
---
"#;

const ROUTES: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: broken, namespace: web}
spec: {parentRefs: "edge"}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: fine, namespace: web}
spec:
  parentRefs: [{name: edge}]
  rules: [{backendRefs: [{name: missing, port: 80}]}]
"#;

#[test]
fn snapshot_compile_reports_bad_objects_and_compiles_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("app.yaml");
    std::fs::write(&file, format!("{CLASS_AND_GATEWAY}{ROUTES}")).unwrap();
    let path = file.to_str().unwrap();

    let out = coxswain(&["snapshot", "compile", "-f", path, "-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("app.yaml: HTTPRoute broken:"), "{err}");
    let snapshot: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(snapshot["version"].as_str().unwrap().len(), 64);
    assert_eq!(snapshot["listeners"][0]["port"], 8080);
    assert_eq!(snapshot["listeners"][0]["protocol"], "PROTOCOL_HTTP");

    let out = coxswain(&["snapshot", "status", "-f", path, "-o", "json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let conditions = &status["httpRoutes"]["web/fine"][0]["conditions"];
    assert_eq!(conditions[1]["type"], "ResolvedRefs");
    assert_eq!(conditions[1]["reason"], "BackendNotFound");

    let out = coxswain(&[
        "snapshot",
        "compile",
        "-f",
        path,
        "--scope",
        "gateway/web/nope",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no snapshot for scope gateway/web/nope"),
        "{}",
        stderr(&out)
    );
    let out = coxswain(&["snapshot", "compile", "-f", path, "--scope", "dedicated"]);
    assert!(stderr(&out).contains("expected `shared` or `gateway/NAMESPACE/NAME`"));
}

#[test]
fn snapshot_match_answers_from_a_compiled_snapshot() {
    let routes = r#"
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: web}
spec: {ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: echo-x, namespace: web, labels: {kubernetes.io/service-name: echo}}
addressType: IPv4
ports: [{port: 3000}]
endpoints: [{addresses: [127.0.0.1]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: app, namespace: web}
spec:
  parentRefs: [{name: edge}]
  hostnames: [app.example]
  rules:
  - matches: [{path: {type: PathPrefix, value: /api}, headers: [{name: x-env, value: canary}]}]
    backendRefs: [{name: echo, port: 80, weight: 5}]
  - matches: [{path: {type: PathPrefix, value: /api}}]
    backendRefs: [{name: missing, port: 80}]
"#;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("app.yaml");
    std::fs::write(&input, format!("{CLASS_AND_GATEWAY}{routes}")).unwrap();
    for format in ["json", "yaml"] {
        let out = coxswain(&[
            "snapshot",
            "compile",
            "-f",
            input.to_str().unwrap(),
            "-o",
            format,
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let snapshot = dir.path().join(format!("snapshot.{format}"));
        std::fs::write(&snapshot, &out.stdout).unwrap();
        let ask = |extra: &[&str]| -> serde_json::Value {
            let mut args = vec![
                "snapshot",
                "match",
                "--snapshot",
                snapshot.to_str().unwrap(),
                "--port",
                "8080",
                "--host",
                "app.example",
            ];
            args.extend_from_slice(extra);
            let out = coxswain(&args);
            assert!(out.status.success(), "{}", stderr(&out));
            serde_json::from_slice(&out.stdout).unwrap()
        };
        let canary = ask(&["--path", "/api/x", "--header", "X-Env: canary"]);
        assert_eq!(canary["status"], 200, "{canary}");
        assert_eq!(canary["route"], "HTTPRoute/web/app");
        assert_eq!(canary["rule"], 0);
        assert_eq!(
            canary["backends"],
            serde_json::json!([{"service": "web/echo", "port": 80, "weight": 5}])
        );
        let broken = ask(&["--path", "/api/x"]);
        assert_eq!(
            (broken["status"].clone(), broken["rule"].clone()),
            (500.into(), 1.into())
        );
        let none = ask(&["--path", "/other"]);
        assert_eq!(none["status"], 404);
        assert!(none["route"].is_null() && none["rule"].is_null());
    }
}

#[test]
fn snapshot_match_compiles_an_ingress_nginx_ingress_and_names_its_access_checks() {
    // A migrating user asks what an ingress-nginx Ingress becomes before applying it: with
    // compatibility its auth-url and limit-rps are access checks of the route; without it,
    // they are not Coxswain's annotations and the route has none.
    let ingress = r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: nginx}
spec: {controller: coxswain-labs.dev/gateway-controller}
---
apiVersion: v1
kind: Service
metadata: {name: http-svc, namespace: default}
spec: {ports: [{port: 80}]}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: external-auth
  namespace: default
  annotations:
    nginx.ingress.kubernetes.io/auth-url: https://httpbin.org/basic-auth/user/passwd
    nginx.ingress.kubernetes.io/limit-rps: "5"
spec:
  ingressClassName: nginx
  rules:
  - host: external-auth-01.sample.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: http-svc, port: {number: 80}}}}
"#;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("ingress.yaml");
    std::fs::write(&input, ingress).unwrap();
    let ask = |compat: bool| -> serde_json::Value {
        let mut args = vec![
            "snapshot",
            "match",
            "-f",
            input.to_str().unwrap(),
            "--port",
            "80",
            "--host",
            "external-auth-01.sample.com",
            "--path",
            "/",
        ];
        if compat {
            args.push("--ingress-nginx-compat");
        }
        let out = coxswain(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let with = ask(true);
    assert_eq!(with["route"], "Ingress/default/external-auth", "{with}");
    assert_eq!(
        with["access"],
        serde_json::json!({
            "rateLimits": ["Ingress/default/external-auth/rps"],
            "externalAuth": {"protocol": "HTTP", "service": "httpbin.org:443", "failureStatus": 500},
        }),
        "{with}"
    );
    let without = ask(false);
    assert_eq!(
        without["route"], "Ingress/default/external-auth",
        "{without}"
    );
    assert!(without["access"].is_null(), "{without}");
    // --snapshot and -f are alternatives, and one of them is needed.
    let out = coxswain(&[
        "snapshot", "match", "--port", "80", "--host", "a", "--path", "/",
    ]);
    assert!(!out.status.success());
}
