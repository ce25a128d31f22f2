//! CoxswainAccessPolicy status on the local control plane, in a cluster of its own: other
//! tests' controllers would add their own entries to every policy's shared ancestors list. So
//! one test, one controller; the remote JWKS part also runs a real shared proxy.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

#[path = "../../test/jwks_server.rs"]
mod jwks_server;
#[path = "../../test/jwt.rs"]
mod mint;
mod support;

use coxswain_api::CoxswainAccessPolicy;
use coxswain_operator::controller;
use coxswain_testenv::TestEnv;
use kube::Api;
use std::time::Duration;
use support::{SharedProxy, apply_yaml, free_port, local_controller_config};

/// A policy protecting an HTTPRoute with an htpasswd Secret is Accepted under the route's
/// Gateway; one naming a missing Secret is Accepted=False Invalid (its rules answer 503) with
/// a Warning Event saying which Secret; `kubectl get cxap` shows the Accepted column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_policies_report_their_ancestors_and_problems() {
    let env = TestEnv::new().await;
    let ns = env.namespace.clone();
    let controller_name = "coxswain-labs.dev/access-test";
    let (discovery_port, bootstrap_port) = (free_port(), free_port());
    let mut config = local_controller_config(&ns, controller_name, discovery_port, bootstrap_port);
    // Policies cannot ask for a refresh under 30 s; the controller's cap makes rotation quick.
    config.jwks.refresh_cap = Some(Duration::from_secs(1));
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

    // A global limit whose rate limit Service does not exist yet says so, and what requests
    // get meanwhile; the Service's arrival makes it Accepted.
    apply_yaml(
        &env.client,
        &format!(
            r#"
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainAccessPolicy
metadata: {{name: shared-limit, namespace: {ns}}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: http}}]
  globalRateLimit: {{service: {{name: ratelimit, port: 8081}}, requests: 100, failureMode: Closed}}
"#
        ),
    )
    .await;
    coxswain_testenv::eventually(
        "the global limit without its Service is Invalid",
        Duration::from_secs(30),
        || accepted("shared-limit", "Invalid"),
    )
    .await;
    let status = policies.get("shared-limit").await.unwrap().status.unwrap();
    let message = status.ancestors[0]
        .conditions
        .iter()
        .find(|c| c.type_ == "Accepted")
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains(&format!("rate limit Service {ns}/ratelimit not found"))
            && message.contains("answered 503"),
        "{message}"
    );
    apply_yaml(
        &env.client,
        &format!(
            r#"
apiVersion: v1
kind: Service
metadata: {{name: ratelimit, namespace: {ns}}}
spec: {{ports: [{{name: grpc, port: 8081}}]}}
"#
        ),
    )
    .await;
    coxswain_testenv::eventually(
        "the global limit is Accepted once its Service exists",
        Duration::from_secs(30),
        || accepted("shared-limit", "Accepted"),
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

    let proxy = SharedProxy::start(&env, discovery_port, bootstrap_port, "proxy-0").await;
    remote_jwks_keys_reach_the_proxy_and_rotate(&env, controller_name, &entries).await;
    proxy.stop().await;

    let _ = stop_ctl.send(());
    ctl.await.unwrap().unwrap();
}

/// A GET of `path` through the proxy's listener on `port`, with a bearer token if given: the
/// status line.
async fn status_line(port: u16, path: &str, token: Option<String>) -> String {
    use std::io::{Read, Write};
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
        write!(
            s,
            "GET {path} HTTP/1.1\r\nhost: api.example\r\n{auth}connection: close\r\n\r\n"
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        out.lines().next().map(str::to_owned)
    })
    .await
    .unwrap()
    .unwrap_or_default()
}

/// A policy whose JWKS the controller fetches from an HTTPS server (its certificate signed by
/// a CA the policy's caBundle names): tokens of the served key pass the proxy, and when the
/// server rotates to another key, the next refresh swaps the keys on the proxy.
///
/// The route's Service has no endpoints (EndpointSlices may not hold loopback addresses), so a
/// token that passes gets 503 from the proxy, and one that does not gets 401.
async fn remote_jwks_keys_reach_the_proxy_and_rotate<F, Fut>(
    env: &TestEnv,
    controller_name: &str,
    entries: &F,
) where
    F: Fn(&'static str) -> Fut,
    Fut: std::future::Future<Output = Option<Vec<support::AncestorEntry>>>,
{
    use mint::{Signer, jwks, now};
    let ns = &env.namespace;
    let (a, b) = (Signer::ed25519("a"), Signer::p256("b"));
    let server = jwks_server::JwksServer::start(200, &jwks(&[&a])).await;
    let listen = free_port();
    apply_yaml(
        &env.client,
        &format!(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: api, namespace: {ns}}}
spec:
  gatewayClassName: access-{ns}
  listeners: [{{name: http, port: {listen}, protocol: HTTP}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: api, namespace: {ns}}}
spec:
  parentRefs: [{{name: api}}]
  rules: [{{backendRefs: [{{name: app, port: 80}}]}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: idp-ca, namespace: {ns}}}
data:
  ca.crt: {ca}
---
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainAccessPolicy
metadata: {{name: remote-tokens, namespace: {ns}}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, name: api}}]
  jwt:
    providers:
    - name: idp
      issuer: https://idp.example
      audiences: [shop]
      jwks: {{remote: {{uri: "{uri}", caBundle: {{name: idp-ca}}, refreshSeconds: 30}}}}
"#,
            ca = serde_json::to_string(&server.ca_pem).unwrap(),
            uri = server.uri(),
        ),
    )
    .await;
    let accepted = coxswain_testenv::eventually(
        "the remote JWKS policy is Accepted under Gateway api",
        Duration::from_secs(30),
        || async {
            entries("remote-tokens").await.filter(|l| {
                l[0].0 == "Gateway" && l[0].3.as_ref().is_some_and(|c| c.1 == "Accepted")
            })
        },
    )
    .await;
    assert_eq!(accepted[0].2, controller_name);

    let token = |signer: &Signer| {
        Some(signer.sign(&serde_json::json!({
            "iss": "https://idp.example", "aud": "shop", "sub": "someone", "exp": now() + 600
        })))
    };
    // Served by the proxy: the key fetched from the server verifies A's tokens. (A rule
    // failing closed answers 503 to everyone, so a 401 without a token is waited for too.)
    let passes = |signer: &Signer, refused: &Signer| {
        let (good, bad) = (token(signer), token(refused));
        async move {
            let no_token = status_line(listen, "/x", None).await;
            let good = status_line(listen, "/x", good).await;
            let bad = status_line(listen, "/x", bad).await;
            (no_token.contains(" 401") && good.contains(" 503") && bad.contains(" 401"))
                .then_some(())
        }
    };
    coxswain_testenv::eventually(
        "tokens of key A pass the proxy, those of B and none do not",
        Duration::from_secs(30),
        || passes(&a, &b),
    )
    .await;

    // The provider rotates: the next refresh ships B's key, and A's tokens stop passing.
    server.set(200, &jwks(&[&b]));
    coxswain_testenv::eventually(
        "tokens of key B pass the proxy, those of A and none do not",
        Duration::from_secs(30),
        || passes(&b, &a),
    )
    .await;

    // The server fails from now on: the last good keys stay in use.
    server.set(500, "down");
    let served = server.served();
    coxswain_testenv::eventually("two failed refreshes", Duration::from_secs(30), || async {
        (server.served() >= served + 2).then_some(())
    })
    .await;
    assert!(status_line(listen, "/x", token(&b)).await.contains(" 503"));
}
