//! GRPCRoutes end to end without an API server: `coxswain snapshot compile` turns a Gateway and
//! a GRPCRoute into a snapshot, `coxswain serve proxy --snapshot-file` serves it, and gRPC calls
//! (HTTP/2 without TLS, as gRPC clients send them to a plaintext listener) reach gRPC backends
//! that speak only HTTP/2, with the grpc-status trailers coming back through the proxy.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{HeaderMap, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::process::{Child, Command, Stdio};
use support::free_port;

/// A length-prefixed gRPC message (uncompressed).
fn grpc_frame(payload: &[u8]) -> Bytes {
    let mut framed = Vec::with_capacity(payload.len() + 5);
    framed.push(0);
    framed.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(payload);
    framed.into()
}

fn grpc_payload(framed: &[u8]) -> String {
    assert!(framed.len() >= 5, "not a gRPC message: {framed:?}");
    String::from_utf8_lossy(&framed[5..]).into_owned()
}

/// A gRPC server that speaks only HTTP/2 (an HTTP/1.1 request fails the connection), answers
/// every call with "<name> <path> <request message>" and trailers carrying grpc-status 0.
async fn grpc_backend(name: &'static str) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<Incoming>| async move {
                        let path = req.uri().path().to_owned();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let answer = format!("{name} {path} {}", grpc_payload(&body));
                        let mut trailers = HeaderMap::new();
                        trailers.insert("grpc-status", "0".parse().unwrap());
                        trailers.insert("grpc-message", format!("from-{name}").parse().unwrap());
                        let frames = vec![
                            Ok::<_, Infallible>(Frame::data(grpc_frame(answer.as_bytes()))),
                            Ok(Frame::trailers(trailers)),
                        ];
                        let response = Response::builder()
                            .header("content-type", "application/grpc")
                            .body(StreamBody::new(futures::stream::iter(frames)))
                            .unwrap();
                        Ok::<_, Infallible>(response)
                    });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    port
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    message: String,
    trailers: HeaderMap,
}

/// One unary call over a fresh HTTP/2 cleartext connection (prior knowledge).
async fn call(port: u16, host: &str, path: &str, metadata: &[(&str, &str)]) -> Answer {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = Request::post(format!("http://{host}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in metadata {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(grpc_frame(b"ping"))).unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let collected = body.collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let bytes = collected.to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        message: if parts.status == StatusCode::OK {
            grpc_payload(&bytes)
        } else {
            String::new()
        },
        trailers,
    }
}

struct Proxy(Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_route_by_method_and_metadata_to_http2_backends() {
    let (v1, v2) = (grpc_backend("v1").await, grpc_backend("v2").await);
    let (listen, admin) = (free_port(), free_port());
    // The Services have no appProtocol: a GRPCRoute's backends get HTTP/2 regardless.
    let manifests = format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: coxswain}}
spec: {{controllerName: coxswain-labs.dev/gateway-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: web}}
spec:
  gatewayClassName: coxswain
  listeners: [{{name: http, port: {listen}, protocol: HTTP}}]
---
apiVersion: v1
kind: Service
metadata: {{name: v1, namespace: web}}
spec: {{ports: [{{port: 9000}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: v1-1, namespace: web, labels: {{kubernetes.io/service-name: v1}}}}
addressType: IPv4
ports: [{{port: {v1}}}]
endpoints: [{{addresses: [127.0.0.1]}}]
---
apiVersion: v1
kind: Service
metadata: {{name: v2, namespace: web}}
spec: {{ports: [{{port: 9000}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: v2-1, namespace: web, labels: {{kubernetes.io/service-name: v2}}}}
addressType: IPv4
ports: [{{port: {v2}}}]
endpoints: [{{addresses: [127.0.0.1]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{name: echo, namespace: web}}
spec:
  parentRefs: [{{name: edge}}]
  hostnames: [grpc.example.com]
  rules:
  - matches: [{{method: {{service: pkg.Echo, method: Say}}}}]
    backendRefs: [{{name: v1, port: 9000}}]
  - matches: [{{method: {{service: pkg.Echo, method: Shout}}}}]
    filters:
    - type: ResponseHeaderModifier
      responseHeaderModifier: {{set: [{{name: x-shouted, value: "yes"}}]}}
    backendRefs: [{{name: v2, port: 9000}}]
  - matches: [{{method: {{service: pkg.Echo}}, headers: [{{name: version, value: two}}]}}]
    backendRefs: [{{name: v2, port: 9000}}]
  - matches: [{{method: {{type: RegularExpression, service: "pkg\\.Admin.*"}}}}]
    backendRefs: [{{name: v1, port: 9000}}]
"#
    );
    let dir = tempfile::tempdir().unwrap();
    let snapshot =
        support::compile_snapshot(env!("CARGO_BIN_EXE_coxswain"), dir.path(), &manifests);
    let mut proxy = Proxy(
        Command::new(env!("CARGO_BIN_EXE_coxswain"))
            .args(["serve", "proxy", "--bind-address", "127.0.0.1"])
            .arg("--snapshot-file")
            .arg(&snapshot)
            .args(["--health-addr", &format!("127.0.0.1:{admin}")])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let _proxy = tokio::task::spawn_blocking(move || {
        support::wait_proxy_ready(admin, &mut proxy.0);
        proxy
    })
    .await
    .unwrap();

    let host = "grpc.example.com";
    let say = call(listen, host, "/pkg.Echo/Say", &[]).await;
    assert_eq!(say.status, StatusCode::OK);
    assert_eq!(say.message, "v1 /pkg.Echo/Say ping");
    // The trailers are the call's result: they must cross the proxy intact.
    assert_eq!(say.trailers.get("grpc-status").unwrap(), "0");
    assert_eq!(say.trailers.get("grpc-message").unwrap(), "from-v1");

    let shout = call(listen, host, "/pkg.Echo/Shout", &[]).await;
    assert_eq!(shout.message, "v2 /pkg.Echo/Shout ping");
    assert_eq!(shout.headers.get("x-shouted").unwrap(), "yes");
    assert_eq!(shout.trailers.get("grpc-message").unwrap(), "from-v2");

    // Any method of the service, with metadata version: two.
    let other = call(listen, host, "/pkg.Echo/Whisper", &[("version", "two")]).await;
    assert_eq!(other.message, "v2 /pkg.Echo/Whisper ping");
    let admin_call = call(listen, host, "/pkg.AdminV2/Reset", &[]).await;
    assert_eq!(admin_call.message, "v1 /pkg.AdminV2/Reset ping");

    // No rule matches: HTTP 404 without grpc-status, which gRPC clients read as UNIMPLEMENTED.
    let unmatched = call(listen, host, "/pkg.Echo/Whisper", &[]).await;
    assert_eq!(unmatched.status, StatusCode::NOT_FOUND);
    assert!(unmatched.trailers.get("grpc-status").is_none());
    // Another hostname is not the route's.
    let elsewhere = call(listen, "other.example.com", "/pkg.Echo/Say", &[]).await;
    assert_eq!(elsewhere.status, StatusCode::NOT_FOUND);
}
