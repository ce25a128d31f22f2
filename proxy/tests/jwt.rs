//! JWT validation on both engines, over HTTP and HTTPS: a valid token is served (its `sub`
//! reaching the backend as a field), every kind of bad token is answered 401 with a Bearer
//! challenge, and a new JWKS in the snapshot takes effect without a restart.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

#[path = "../../test/jwt.rs"]
mod mint;
mod support;

use coxswain_proxy::limits::Limits;
use mint::{Signer, jwks, now, unsigned};
use serde_json::json;
use support::*;

const SNAPSHOT: &str = r#"
listeners:
- port: {HTTP}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes: &routes
    - source: {kind: HTTPRoute, namespace: t, name: claims, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /claims}}
      jwt:
        providers:
        - name: idp
          issuer: https://idp.example
          audiences: [shop]
          jwks: {JWKS}
          claimsToHeaders: [{claim: sub, header: x-user}]
          clockSkewSeconds: 5
      backends: [{cluster: "t/echo:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: plain, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /plain}}
      jwt:
        providers:
        - {name: idp, issuer: https://idp.example, audiences: [shop], jwks: {JWKS}}
      backends: [{cluster: "t/echo:80", weight: 1}]
- port: {HTTPS}
  protocol: PROTOCOL_HTTPS
  certificates:
  - {sni: "", certificate: t/cert}
  virtualHosts:
  - hostname: ""
    routes: *routes
clusters:
- name: t/echo:80
  endpoints: [{address: 127.0.0.1, port: {BACKEND}, ready: true}]
certificates:
- {name: t/cert, certChainPem: "{CERT}", privateKeyPem: "{KEY}"}
requires: [jwt]
"#;

struct Setup {
    proxy: Proxy,
    http: u16,
    https: u16,
    vars: Vec<(&'static str, String)>,
}

fn vars_with(base: &[(&'static str, String)], keys: &str) -> Vec<(&'static str, String)> {
    let mut vars = base.to_vec();
    // A JSON string is a YAML double-quoted scalar.
    vars.push(("JWKS", serde_json::to_string(keys).unwrap()));
    vars
}

async fn start(fast_path: bool, keys: &str) -> Setup {
    let backend = echo_backend("echo").await;
    let (http, https) = (free_port(), free_port());
    let c = cert("gw.example");
    let vars = vec![
        ("HTTP", http.to_string()),
        ("HTTPS", https.to_string()),
        ("BACKEND", backend.port().to_string()),
        ("CERT", yaml_escape(&c.pem)),
        ("KEY", yaml_escape(&c.key)),
    ];
    let snap = snapshot(SNAPSHOT, &vars_with(&vars, keys));
    let limits = Limits {
        fast_path,
        ..Limits::default()
    };
    Setup {
        proxy: Proxy::start_with(&snap, limits).await,
        http,
        https,
        vars,
    }
}

fn claims() -> serde_json::Value {
    json!({"iss": "https://idp.example", "aud": "shop", "sub": "ada", "exp": now() + 300})
}

fn with(key: &str, value: serde_json::Value) -> serde_json::Value {
    let mut c = claims();
    c[key] = value;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valid_tokens_pass_and_every_bad_one_is_answered_401() {
    let signer = Signer::p256("2026-12");
    let stranger = Signer::p256("2026-12");
    let rsa = Signer::rsa("rsa-1");
    for (fast_path, engine) in engines() {
        let s = start(fast_path, &jwks(&[&signer, &rsa])).await;
        for (port, tls) in [(s.http, false), (s.https, true)] {
            let what = format!("{engine} tls={tls}");
            let mut c = Conn::connect([127, 0, 0, 2], port, tls).await;
            for key in [&signer, &rsa] {
                let bearer = format!("Bearer {}", key.sign(&claims()));
                let a = c
                    .get(
                        "/claims/x",
                        &[("authorization", &bearer), ("x-user", "mallory")],
                    )
                    .await;
                assert_eq!(a.status, 200, "{what} {}", key.alg());
                assert_eq!(a.body["headers"]["x-user"], "ada", "{what}: the claim wins");
                let a = c.get("/plain/x", &[("authorization", &bearer)]).await;
                assert_eq!(a.status, 200, "{what} {}", key.alg());
            }
            let refused = [
                ("expired", signer.sign(&with("exp", json!(now() - 60)))),
                (
                    "wrong issuer",
                    signer.sign(&with("iss", json!("https://evil.example"))),
                ),
                ("wrong audience", signer.sign(&with("aud", json!("admin")))),
                ("bad signature", stranger.sign(&claims())),
                ("alg none", unsigned(&claims())),
            ];
            for path in ["/claims/x", "/plain/x"] {
                for (why, token) in &refused {
                    let bearer = format!("Bearer {token}");
                    let a = c.get(path, &[("authorization", &bearer)]).await;
                    assert_eq!(a.status, 401, "{what} {path}: {why}");
                    assert_eq!(
                        a.header("www-authenticate"),
                        Some("Bearer error=\"invalid_token\""),
                        "{what} {path}: {why}"
                    );
                }
                let a = c.get(path, &[]).await;
                assert_eq!(a.status, 401, "{what} {path}: no token");
            }
        }
        // 5 bad tokens and one without, on 2 routes and 2 listeners.
        assert_eq!(
            s.proxy.metric("coxswain_proxy_auth_refused_total").await,
            24,
            "{engine}"
        );
        s.proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_jwks_takes_effect_without_a_restart() {
    let old = Signer::ed25519("old");
    let new = Signer::ed25519("new");
    for (fast_path, engine) in engines() {
        let s = start(fast_path, &jwks(&[&old])).await;
        let old_token = format!("Bearer {}", old.sign(&claims()));
        let new_token = format!("Bearer {}", new.sign(&claims()));
        let mut c = Conn::connect([127, 0, 0, 3], s.http, false).await;
        assert_eq!(
            c.get("/plain/x", &[("authorization", &old_token)])
                .await
                .status,
            200
        );
        assert_eq!(
            c.get("/plain/x", &[("authorization", &new_token)])
                .await
                .status,
            401
        );

        // The provider publishes the new key next to the old one, then drops the old one.
        for (keys, old_status) in [(jwks(&[&old, &new]), 200), (jwks(&[&new]), 401)] {
            let next = snapshot(SNAPSHOT, &vars_with(&s.vars, &keys));
            s.proxy.update(&next);
            s.proxy.wait_ready(&next.version).await;
            for path in ["/plain/x", "/claims/x"] {
                let a = c.get(path, &[("authorization", &new_token)]).await;
                assert_eq!(a.status, 200, "{engine} {path}: the new key");
                let a = c.get(path, &[("authorization", &old_token)]).await;
                assert_eq!(a.status, old_status, "{engine} {path}: the old key");
            }
        }
        s.proxy.stop().await;
    }
}
