//! Wildcard hosts on both engines: an Ingress "*.foo.com" serves exactly one label above
//! foo.com, a Gateway API "*.foo.com" on the same port one or more, as the compiler marks them
//! in the snapshot (VirtualHost.single_label).
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_proxy::limits::Limits;
use support::*;

// What the compiler emits for an Ingress and an HTTPRoute both on "*.foo.com", an Ingress alone
// on "*.bar.org" and an Ingress default backend: the multi-label virtual host (Gateway API
// routes only), then the single-label one (every route of the name, in precedence order).
const SNAPSHOT: &str = r#"
listeners:
- port: {HTTP}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: Ingress, namespace: t, name: default, rule: 4294967295}
      backends: [{cluster: "t/default:80", weight: 1}]
  - hostname: "*.foo.com"
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: gw, rule: 0}
      backends: [{cluster: "t/gateway:80", weight: 1}]
  - hostname: "*.foo.com"
    singleLabel: true
    routes:
    - source: {kind: Ingress, namespace: t, name: ing, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /ing}}
      backends: [{cluster: "t/ingress:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: gw, rule: 0}
      backends: [{cluster: "t/gateway:80", weight: 1}]
  - hostname: "*.bar.org"
    singleLabel: true
    routes:
    - source: {kind: Ingress, namespace: t, name: bar, rule: 0}
      backends: [{cluster: "t/ingress:80", weight: 1}]
clusters:
- name: t/default:80
  endpoints: [{address: 127.0.0.1, port: {DEFAULT}, ready: true}]
- name: t/gateway:80
  endpoints: [{address: 127.0.0.1, port: {GATEWAY}, ready: true}]
- name: t/ingress:80
  endpoints: [{address: 127.0.0.1, port: {INGRESS}, ready: true}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingress_wildcard_serves_one_label_and_a_gateway_wildcard_any_depth() {
    let default = echo_backend("default").await;
    let gateway = echo_backend("gateway").await;
    let ingress = echo_backend("ingress").await;
    for (fast_path, engine) in engines() {
        let http = free_port();
        let snap = snapshot(
            SNAPSHOT,
            &[
                ("HTTP", http.to_string()),
                ("DEFAULT", default.port().to_string()),
                ("GATEWAY", gateway.port().to_string()),
                ("INGRESS", ingress.port().to_string()),
            ],
        );
        let limits = Limits {
            fast_path,
            ..Limits::default()
        };
        let proxy = Proxy::start_with(&snap, limits).await;
        let cases = [
            // One label above foo.com: the Ingress's path, else the HTTPRoute beside it.
            ("bar.foo.com", "/ing/x", "ingress"),
            ("Bar.FOO.com:80", "/ing", "ingress"),
            ("bar.foo.com", "/other", "gateway"),
            // Deeper: the Ingress rule does not reach; the HTTPRoute's does.
            ("baz.bar.foo.com", "/ing/x", "gateway"),
            ("a.b.c.foo.com", "/ing", "gateway"),
            // The bare suffix is no wildcard's.
            ("foo.com", "/ing", "default"),
            // An Ingress wildcard alone: one label, else the default backend.
            ("x.bar.org", "/", "ingress"),
            ("y.x.bar.org", "/", "default"),
            ("bar.org", "/", "default"),
        ];
        for (host, path, want) in cases {
            let r = get(&format!("http://127.0.0.1:{http}{path}"), &[("host", host)])
                .await
                .unwrap_or_else(|e| panic!("{engine}: {host}{path}: {e}"));
            assert_eq!(r.status, 200, "{engine}: {host}{path}: {}", r.body);
            assert_eq!(r.header("x-backend"), Some(want), "{engine}: {host}{path}");
        }
        proxy.stop().await;
    }
}
