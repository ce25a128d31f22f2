//! Access log lines: one JSON object per request on the `coxswain::access` target, and none for
//! routes that switch it off. Its own test binary, because it installs the global subscriber.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use support::*;

/// Collects everything the subscriber writes.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    /// Access log lines so far, parsed.
    fn access_lines(&self) -> Vec<serde_json::Value> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|v| v["target"] == "coxswain::access")
            .collect()
    }
}

const ROUTES: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: Ingress, namespace: t, name: logged, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /logged}}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: quiet, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /quiet}}
      accessLogOff: true
      backends: [{cluster: "t/a:80", weight: 1}]
clusters:
- name: t/a:80
  endpoints: [{address: 127.0.0.1, port: {A}, ready: true}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_lines_are_json_and_routes_can_switch_them_off() {
    let capture = Capture::default();
    let writer = capture.clone();
    tracing_subscriber::fmt()
        .json()
        .with_env_filter("coxswain::access=info")
        .with_writer(move || writer.clone())
        .init();

    let a = echo_backend("a").await;
    let port = free_port();
    let snap = snapshot(
        ROUTES,
        &[("PORT", port.to_string()), ("A", a.port().to_string())],
    );
    let proxy = Proxy::start(&snap).await;
    let url = |p: &str| format!("http://127.0.0.1:{port}{p}");
    for _ in 0..3 {
        assert_eq!(get(&url("/quiet"), &[]).await.unwrap().status, 200);
    }
    assert_eq!(get(&url("/logged/x"), &[]).await.unwrap().status, 200);
    assert_eq!(get(&url("/nowhere"), &[]).await.unwrap().status, 404);

    // Lines are written in the logging phase, just after the response: poll.
    let mut lines = Vec::new();
    for _ in 0..100 {
        lines = capture.access_lines();
        if lines.len() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    proxy.stop().await;
    let paths: Vec<&str> = lines
        .iter()
        .map(|l| l["fields"]["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["/logged/x", "/nowhere"], "no line for /quiet");
    let f = &lines[0]["fields"];
    assert_eq!(f["status"], 200);
    assert_eq!(f["method"], "GET");
    assert_eq!(f["route"], "Ingress/t/logged");
    assert_eq!(f["client"], "127.0.0.1");
    assert!(f["upstream"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert_eq!(lines[1]["fields"]["status"], 404);
}
