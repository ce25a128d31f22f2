//! The controller's traces: with `--otlp-endpoint`, each reconcile pass is a trace whose
//! `compile` span counts what went in and what came out, exported to an OTLP/gRPC collector
//! running in this process; the controller's /metrics count the spans exported.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_operator::controller;
use coxswain_proxy::trace::{Settings, Tracer};
use coxswain_testenv::{TestEnv, eventually};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{apply_yaml, free_port, get, local_controller_config};

#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for r in request.into_inner().resource_spans {
            for s in r.scope_spans {
                spans.extend(s.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn int(span: &Span, key: &str) -> Option<i64> {
    match span
        .attributes
        .iter()
        .find(|a| a.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()?
    {
        Value::IntValue(i) => Some(*i),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_passes_are_traced() {
    let env = TestEnv::new().await;
    let ns = env.namespace.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector_addr = listener.local_addr().unwrap();
    let collector = Collector::default();
    let service = TraceServiceServer::new(collector.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    let mut settings = Settings::new(
        &format!("http://{collector_addr}"),
        1.0,
        "coxswain-controller",
    );
    settings.delay = Duration::from_millis(50);

    let (discovery_port, bootstrap_port, health_port) = (free_port(), free_port(), free_port());
    let mut config = local_controller_config(
        &ns,
        "coxswain-labs.dev/gateway-controller",
        discovery_port,
        bootstrap_port,
    );
    config.health_addr = Some(([127, 0, 0, 1], health_port).into());
    config.tracer = Some(Tracer::start(settings).unwrap());
    let (stop_ctl, ctl_stopped) = tokio::sync::oneshot::channel::<()>();
    let ctl = tokio::spawn(controller::run(env.client.clone(), config, async {
        let _ = ctl_stopped.await;
    }));

    apply_yaml(
        &env.client,
        &format!(
            r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {{name: coxswain-{ns}}}
spec: {{controller: coxswain-labs.dev/gateway-controller}}
---
apiVersion: v1
kind: Service
metadata: {{name: app, namespace: {ns}}}
spec: {{ports: [{{port: 80}}]}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: app, namespace: {ns}}}
spec:
  ingressClassName: coxswain-{ns}
  rules:
  - host: app.example
    http:
      paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: app, port: {{number: 80}}}}}}}}]
"#
        ),
    )
    .await;

    // A pass that compiled the Ingress: its compile span, and the reconcile span it is part of.
    let collected = &collector;
    let (compile, reconcile) = eventually(
        "a compile span counting the Ingress",
        Duration::from_secs(30),
        move || async move {
            let spans = collected.spans.lock().unwrap().clone();
            let compile = spans.iter().find(|s| {
                s.name == "compile"
                    && int(s, "coxswain.input.ingresses") >= Some(1)
                    && int(s, "coxswain.routes") >= Some(1)
            })?;
            let reconcile = spans.iter().find(|s| {
                s.name == "reconcile"
                    && s.trace_id == compile.trace_id
                    && s.span_id == compile.parent_span_id
            })?;
            Some((compile.clone(), reconcile.clone()))
        },
    )
    .await;
    assert!(
        reconcile.parent_span_id.is_empty(),
        "a pass is a trace's root"
    );
    assert!(int(&compile, "coxswain.snapshots") >= Some(1));
    assert!(compile.start_time_unix_nano >= reconcile.start_time_unix_nano);

    eventually(
        "exported spans counted",
        Duration::from_secs(10),
        || async {
            get(health_port, "/metrics").await.ok().filter(|m| {
                m.lines().any(|l| {
                    l.strip_prefix("coxswain_controller_trace_spans_exported_total ")
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .is_some_and(|n| n >= 2)
                })
            })
        },
    )
    .await;
    let _ = stop_ctl.send(());
    let _ = ctl.await;
}
