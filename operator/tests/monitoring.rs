//! The dashboards and alerts under config/monitoring name only metrics Coxswain exports.
//!
//! What is exported is read from the `/metrics` of a real proxy process (`coxswain serve
//! proxy`) and a real controller process (`coxswain serve controller` against the local API
//! server), so no list of names is kept by hand. Every PromQL expression is parsed by
//! Prometheus' own parser (hack/promql, built from its Go module), which also names the metrics
//! each one selects.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_testenv::{TestEnv, eventually};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::{free_port, http_get};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every dashboard and rule file under config/monitoring.
fn monitoring_files() -> Vec<PathBuf> {
    let dir = repo().join("config/monitoring");
    let mut files = vec![dir.join("prometheusrule.yaml")];
    for entry in std::fs::read_dir(dir.join("dashboards")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// Names a scrape can select, from the `# TYPE` lines of an exposition (families with no
/// sample yet, such as a labelled counter nothing has counted, are there too): a histogram
/// adds its `_bucket`, `_sum` and `_count` series.
fn exported(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        if kind == "histogram" || kind == "summary" {
            for suffix in ["_sum", "_count"] {
                out.insert(format!("{name}{suffix}"));
            }
            if kind == "histogram" {
                out.insert(format!("{name}_bucket"));
            }
        } else {
            out.insert(name.to_owned());
        }
    }
    out
}

/// `promql names` of `files`: each expression with its source and the metrics it selects.
fn expressions(files: &[PathBuf]) -> Result<Vec<Value>, String> {
    let out = Command::new(support::promql_bin())
        .arg("names")
        .args(files)
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap())
}

/// "source: metric" for every metric an expression names that is not exported.
fn unknown(expressions: &[Value], exported: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for e in expressions {
        for m in e["metrics"].as_array().unwrap() {
            let m = m.as_str().unwrap();
            if !exported.contains(m) {
                out.push(format!("{}: {m} in {}", e["source"], e["expr"]));
            }
        }
    }
    out
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn scrape(port: u16, what: &str) -> String {
    let response =
        http_get(port, "/metrics", "localhost").unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(response.starts_with("HTTP/1.1 200"), "{what}: {response}");
    response
}

/// The proxy's exposition: a standalone proxy process serving a compiled snapshot.
fn proxy_metrics() -> String {
    let bin = env!("CARGO_BIN_EXE_coxswain");
    let (port, admin) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let backend = support::backend("ok", Duration::ZERO);
    let snapshot =
        support::compile_snapshot(bin, dir.path(), &support::app_manifests(port, backend));
    let mut proxy = Killed(
        Command::new(bin)
            .args(["serve", "proxy", "--bind-address", "127.0.0.1"])
            .arg("--snapshot-file")
            .arg(&snapshot)
            .args(["--health-addr", &format!("127.0.0.1:{admin}")])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    support::wait_proxy_ready(admin, &mut proxy.0);
    scrape(admin, "proxy")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_and_alert_query_names_only_exported_metrics() {
    let env = TestEnv::new().await;
    let proxy = tokio::task::spawn_blocking(proxy_metrics).await.unwrap();

    // The controller's exposition: `coxswain serve controller` against the local API server.
    let (health, metrics) = (free_port(), free_port());
    let _controller = Killed(
        Command::new(env!("CARGO_BIN_EXE_coxswain"))
            .args(["serve", "controller"])
            .env("KUBECONFIG", env.cluster().kubeconfig())
            .env("COXSWAIN_NAMESPACE", &env.namespace)
            .env(
                "COXSWAIN_CONTROLLER_NAME",
                "coxswain-labs.dev/monitoring-test",
            )
            .env("COXSWAIN_POD_NAME", "monitoring-test")
            .env("COXSWAIN_HEALTH_ADDR", format!("127.0.0.1:{health}"))
            .env("COXSWAIN_METRICS_ADDR", format!("127.0.0.1:{metrics}"))
            .env(
                "COXSWAIN_DISCOVERY_ADDR",
                format!("127.0.0.1:{}", free_port()),
            )
            .env(
                "COXSWAIN_BOOTSTRAP_ADDR",
                format!("127.0.0.1:{}", free_port()),
            )
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let controller = eventually(
        "the controller's /metrics",
        Duration::from_secs(60),
        || async move {
            tokio::task::spawn_blocking(move || http_get(metrics, "/metrics", "localhost").ok())
                .await
                .unwrap()
                .filter(|r| {
                    r.starts_with("HTTP/1.1 200") && r.contains("coxswain_controller_leader")
                })
        },
    )
    .await;

    let mut names = exported(&proxy);
    names.extend(exported(&controller));
    assert!(
        names.iter().any(|n| n.starts_with("coxswain_proxy_"))
            && names.iter().any(|n| n.starts_with("coxswain_controller_")),
        "{names:?}"
    );

    let files = monitoring_files();
    let exprs = expressions(&files).unwrap();
    let sources: BTreeSet<String> = exprs
        .iter()
        .map(|e| {
            e["source"]
                .as_str()
                .unwrap()
                .split(':')
                .next()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        sources.len(),
        files.len(),
        "every file has expressions: {sources:?}"
    );
    assert!(exprs.len() >= 30, "{} expressions", exprs.len());
    let missing = unknown(&exprs, &names);
    assert!(
        missing.is_empty(),
        "queries name metrics the code does not export:\n{}\nexported: {names:?}",
        missing.join("\n")
    );
    eprintln!(
        "{} expressions in {} files name only exported metrics ({} exported names)",
        exprs.len(),
        files.len(),
        names.len()
    );

    // The same check on a dashboard that names a metric nobody exports, and one that does not
    // parse: both are caught.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"panels": [{"title": "made up", "targets": [{"expr": "sum(rate(coxswain_proxy_made_up_total[5m]))"}]}]}"#,
    )
    .unwrap();
    let missing = unknown(&expressions(std::slice::from_ref(&bad)).unwrap(), &names);
    assert_eq!(
        missing,
        [
            "\"bad.json: made up\": coxswain_proxy_made_up_total in \"sum(rate(coxswain_proxy_made_up_total[5m]))\""
        ]
    );
    std::fs::write(
        &bad,
        r#"{"panels": [{"title": "broken", "targets": [{"expr": "sum(rate(coxswain_proxy_requests_total[5m])"}]}]}"#,
    )
    .unwrap();
    let err = expressions(&[bad]).unwrap_err();
    assert!(err.contains("broken"), "{err}");
}
