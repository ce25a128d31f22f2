//! External authorization on both engines, over HTTP and HTTPS listeners, against real
//! authorization services: an HTTP one (the auth-url / GEP-1494 HTTP protocol) and a gRPC one
//! speaking Envoy's `envoy.service.auth.v3.Authorization`. Both decide by the request's
//! Authorization field: "Bearer good" is allowed (and named `x-user: ada`), "Bearer
//! forbidden" gets 403 with a reason, anything else 401 with a challenge.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use bytes::Bytes;
use coxswain_api::ext_authz as pb;
use coxswain_proxy::limits::Limits;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::net::SocketAddr;
use support::*;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const SNAPSHOT: &str = r#"
listeners:
- port: {HTTP}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes: &routes
    - source: {kind: HTTPRoute, namespace: t, name: http, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /http}}
      externalAuth:
        protocol: HTTP
        address: "127.0.0.1:{AUTH_HTTP}"
        path: /check
        pathIsPrefix: true
        responseFields: [x-user]
        failureStatus: 503
      backends: [{cluster: "t/app:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: grpc, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /grpc}}
      externalAuth:
        protocol: GRPC
        cluster: "t/authz:9000"
        allRequestFields: true
        failureStatus: 503
      backends: [{cluster: "t/app:80", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: down, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /down}}
      externalAuth:
        protocol: HTTP
        address: "127.0.0.1:{CLOSED}"
        path: /verify
        method: GET
        allRequestFields: true
        originalFields: true
        deny401403Only: true
        failureStatus: 500
      backends: [{cluster: "t/app:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: grpcdown, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /grpcdown}}
      externalAuth: {protocol: GRPC, address: "127.0.0.1:{CLOSED}", failureStatus: 503}
      backends: [{cluster: "t/app:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: open, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /open}}
      backends: [{cluster: "t/app:80", weight: 1}]
- port: {HTTPS}
  protocol: PROTOCOL_HTTPS
  certificates:
  - {sni: "", certificate: t/cert}
  virtualHosts:
  - hostname: ""
    routes: *routes
clusters:
- name: t/app:80
  endpoints: [{address: 127.0.0.1, port: {BACKEND}, ready: true}]
- name: t/authz:9000
  endpoints: [{address: 127.0.0.1, port: {AUTH_GRPC}, ready: true}]
certificates:
- {name: t/cert, certChainPem: "{CERT}", privateKeyPem: "{KEY}"}
requires: [external-auth]
"#;

/// What the HTTP authorization service was asked.
#[derive(Debug)]
struct Asked {
    method: String,
    path: String,
    headers: hyper::HeaderMap,
}

/// The decision both services make, by the Authorization field.
enum Decision {
    Allow,
    Forbid,
    Challenge,
}

fn decide(authorization: Option<&str>) -> Decision {
    match authorization {
        Some("Bearer good") => Decision::Allow,
        Some("Bearer forbidden") => Decision::Forbid,
        _ => Decision::Challenge,
    }
}

async fn http_auth_service() -> (SocketAddr, mpsc::UnboundedReceiver<Asked>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let tx = tx.clone();
                    async move {
                        let authorization = req
                            .headers()
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned);
                        let _ = tx.send(Asked {
                            method: req.method().to_string(),
                            path: req.uri().to_string(),
                            headers: req.headers().clone(),
                        });
                        let answer = match decide(authorization.as_deref()) {
                            Decision::Allow => Response::builder()
                                .status(200)
                                .header("x-user", "ada")
                                .header("x-not-listed", "dropped")
                                .body(Full::new(Bytes::new())),
                            Decision::Forbid => Response::builder()
                                .status(403)
                                .header("x-reason", "policy")
                                .body(Full::new(Bytes::from_static(b"forbidden by policy"))),
                            Decision::Challenge => Response::builder()
                                .status(401)
                                .header("www-authenticate", "Bearer realm=\"shop\"")
                                .body(Full::new(Bytes::from_static(b"sign in"))),
                        };
                        Ok::<_, std::convert::Infallible>(answer.unwrap())
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, rx)
}

/// An Envoy ext_authz server, as OPA's or Authorino's would answer.
struct Authorizer {
    asked: mpsc::UnboundedSender<pb::CheckRequest>,
}

#[tonic::async_trait]
impl pb::authorization_server::Authorization for Authorizer {
    async fn check(
        &self,
        request: tonic::Request<pb::CheckRequest>,
    ) -> Result<tonic::Response<pb::CheckResponse>, tonic::Status> {
        let check = request.into_inner();
        let authorization = check
            .attributes
            .as_ref()
            .and_then(|a| a.request.as_ref())
            .and_then(|r| r.http.as_ref())
            .and_then(|h| h.headers.get("authorization").cloned());
        let _ = self.asked.send(check);
        let field = |name: &str, value: &str| pb::HeaderValueOption {
            header: Some(pb::HeaderValue {
                key: name.into(),
                value: value.into(),
                raw_value: Vec::new(),
            }),
            append: None,
        };
        let denied = |code: i32, headers, body: &str| pb::CheckResponse {
            status: Some(pb::RpcStatus {
                code: 7,
                message: "denied".into(),
            }),
            http_response: Some(pb::check_response::HttpResponse::DeniedResponse(
                pb::DeniedHttpResponse {
                    status: Some(pb::HttpStatus { code }),
                    headers,
                    body: body.into(),
                },
            )),
        };
        let answer = match decide(authorization.as_deref()) {
            Decision::Allow => pb::CheckResponse {
                status: Some(pb::RpcStatus::default()),
                http_response: Some(pb::check_response::HttpResponse::OkResponse(
                    pb::OkHttpResponse {
                        headers: vec![field("x-user", "ada")],
                        headers_to_remove: vec!["authorization".into()],
                        response_headers_to_add: Vec::new(),
                    },
                )),
            },
            Decision::Forbid => denied(
                403,
                vec![field("x-reason", "policy")],
                "forbidden by policy",
            ),
            Decision::Challenge => denied(
                401,
                vec![field("www-authenticate", "Bearer realm=\"shop\"")],
                "sign in",
            ),
        };
        Ok(tonic::Response::new(answer))
    }
}

async fn grpc_auth_service() -> (SocketAddr, mpsc::UnboundedReceiver<pb::CheckRequest>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::authorization_server::AuthorizationServer::new(
                Authorizer { asked: tx },
            ))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (addr, rx)
}

struct Setup {
    proxy: Proxy,
    http: u16,
    https: u16,
    backend: mpsc::UnboundedReceiver<Recorded>,
    http_asked: mpsc::UnboundedReceiver<Asked>,
    grpc_asked: mpsc::UnboundedReceiver<pb::CheckRequest>,
}

async fn start(fast_path: bool) -> Setup {
    let (backend, backend_rx) = recording_backend().await;
    let (auth_http, http_asked) = http_auth_service().await;
    let (auth_grpc, grpc_asked) = grpc_auth_service().await;
    let (http, https, closed) = (free_port(), free_port(), free_port());
    let c = cert("gw.example");
    let snap = snapshot(
        SNAPSHOT,
        &[
            ("HTTP", http.to_string()),
            ("HTTPS", https.to_string()),
            ("BACKEND", backend.port().to_string()),
            ("AUTH_HTTP", auth_http.port().to_string()),
            ("AUTH_GRPC", auth_grpc.port().to_string()),
            ("CLOSED", closed.to_string()),
            ("CERT", yaml_escape(&c.pem)),
            ("KEY", yaml_escape(&c.key)),
        ],
    );
    let limits = Limits {
        fast_path,
        ..Limits::default()
    };
    Setup {
        proxy: Proxy::start_with(&snap, limits).await,
        http,
        https,
        backend: backend_rx,
        http_asked,
        grpc_asked,
    }
}

/// Every value of a field the backend received.
fn values<'r>(r: &'r Recorded, name: &str) -> Vec<&'r str> {
    r.headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_authorization_service_allows_refuses_and_names_the_user() {
    for (fast_path, engine) in engines() {
        let mut s = start(fast_path).await;
        for (port, tls) in [(s.http, false), (s.https, true)] {
            let what = format!("{engine} tls={tls}");
            let mut c = Conn::connect([127, 0, 0, 2], port, tls).await;

            // Allowed: the service's x-user replaces the one the client forged, and fields the
            // route does not list stay with the service.
            let a = c
                .get(
                    "/http/orders?id=7",
                    &[("authorization", "Bearer good"), ("x-user", "mallory")],
                )
                .await;
            assert_eq!(a.status, 200, "{what}");
            let asked = s.http_asked.recv().await.unwrap();
            assert_eq!(asked.method, "GET", "{what}");
            assert_eq!(asked.path, "/check/http/orders?id=7", "{what}");
            assert_eq!(asked.headers["authorization"], "Bearer good", "{what}");
            assert_eq!(asked.headers["host"], "gw.example", "{what}");
            assert_eq!(asked.headers["content-length"], "0", "{what}");
            assert!(
                asked.headers.get("x-user").is_none(),
                "{what}: an unlisted field went to the service"
            );
            let seen = s.backend.recv().await.unwrap();
            assert_eq!(values(&seen, "x-user"), ["ada"], "{what}");
            assert!(seen.headers.get("x-not-listed").is_none(), "{what}");
            assert_eq!(values(&seen, "authorization"), ["Bearer good"], "{what}");

            // The body waits for the decision and reaches the backend whole.
            let body: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
            let a = c
                .send(
                    "POST",
                    "/http/upload",
                    &[("authorization", "Bearer good")],
                    Bytes::from(body.clone()),
                )
                .await;
            assert_eq!(a.status, 200, "{what}");
            let asked = s.http_asked.recv().await.unwrap();
            assert_eq!(asked.method, "POST", "{what}");
            assert_eq!(
                asked.headers["content-length"], "0",
                "{what}: the body is not sent"
            );
            let seen = s.backend.recv().await.unwrap();
            assert_eq!(seen.method, "POST", "{what}");
            assert_eq!(seen.body.len(), body.len(), "{what}");
            assert!(
                seen.body[..] == body[..],
                "{what}: the body changed on the way"
            );

            // Refused: the service's status, fields and body reach the client; the backend
            // sees nothing (the next request it records is the allowed one below).
            let a = c
                .get("/http/orders", &[("authorization", "Bearer forbidden")])
                .await;
            assert_eq!(a.status, 403, "{what}");
            assert_eq!(a.header("x-reason"), Some("policy"), "{what}");
            assert_eq!(&a.raw[..], b"forbidden by policy", "{what}");
            let a = c.get("/http/orders", &[]).await;
            assert_eq!(a.status, 401, "{what}");
            assert_eq!(
                a.header("www-authenticate"),
                Some("Bearer realm=\"shop\""),
                "{what}"
            );
            assert_eq!(&a.raw[..], b"sign in", "{what}");
            s.http_asked.recv().await.unwrap();
            s.http_asked.recv().await.unwrap();
            let a = c.get("/open/after", &[]).await;
            assert_eq!(a.status, 200, "{what}");
            let seen = s.backend.recv().await.unwrap();
            assert_eq!(
                seen.path, "/open/after",
                "{what}: a refused request reached the backend"
            );
        }
        assert_eq!(
            s.proxy
                .metric("coxswain_proxy_external_auth_allowed_total")
                .await,
            4,
            "{engine}"
        );
        assert_eq!(
            s.proxy
                .metric("coxswain_proxy_external_auth_denied_total")
                .await,
            4,
            "{engine}"
        );
        s.proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_ext_authz_service_allows_refuses_and_edits_the_request() {
    for (fast_path, engine) in engines() {
        let mut s = start(fast_path).await;
        for (port, tls) in [(s.http, false), (s.https, true)] {
            let what = format!("{engine} tls={tls}");
            let mut c = Conn::connect([127, 0, 0, 3], port, tls).await;

            let a = c
                .send(
                    "PUT",
                    "/grpc/items/9?v=2",
                    &[("authorization", "Bearer good"), ("x-tenant", "blue")],
                    Bytes::from_static(b"{\"name\":\"nine\"}"),
                )
                .await;
            assert_eq!(a.status, 200, "{what}");
            let asked = s.grpc_asked.recv().await.unwrap();
            let attributes = asked.attributes.unwrap();
            let http = attributes.request.unwrap().http.unwrap();
            assert_eq!(http.method, "PUT", "{what}");
            assert_eq!(http.path, "/grpc/items/9?v=2", "{what}");
            assert_eq!(http.host, "gw.example", "{what}");
            assert_eq!(http.scheme, if tls { "https" } else { "http" }, "{what}");
            assert_eq!(http.size, 15, "{what}");
            assert_eq!(http.headers["x-tenant"], "blue", "{what}");
            let source = attributes
                .source
                .unwrap()
                .address
                .unwrap()
                .socket_address
                .unwrap();
            assert_eq!(source.address, "127.0.0.3", "{what}");
            // The service set x-user and took the credentials away before the backend.
            let seen = s.backend.recv().await.unwrap();
            assert_eq!(values(&seen, "x-user"), ["ada"], "{what}");
            assert!(seen.headers.get("authorization").is_none(), "{what}");
            assert_eq!(&seen.body[..], b"{\"name\":\"nine\"}", "{what}");

            let a = c
                .get("/grpc/items", &[("authorization", "Bearer forbidden")])
                .await;
            assert_eq!(a.status, 403, "{what}");
            assert_eq!(a.header("x-reason"), Some("policy"), "{what}");
            assert_eq!(&a.raw[..], b"forbidden by policy", "{what}");
            let a = c.get("/grpc/items", &[]).await;
            assert_eq!(a.status, 401, "{what}");
            assert_eq!(
                a.header("www-authenticate"),
                Some("Bearer realm=\"shop\""),
                "{what}"
            );
            s.grpc_asked.recv().await.unwrap();
            s.grpc_asked.recv().await.unwrap();
            assert_eq!(c.get("/open/after", &[]).await.status, 200, "{what}");
            let seen = s.backend.recv().await.unwrap();
            assert_eq!(
                seen.path, "/open/after",
                "{what}: a refused request reached the backend"
            );
        }
        s.proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_authorization_service_fails_closed() {
    for (fast_path, engine) in engines() {
        let mut s = start(fast_path).await;
        for (port, tls) in [(s.http, false), (s.https, true)] {
            let what = format!("{engine} tls={tls}");
            let mut c = Conn::connect([127, 0, 0, 4], port, tls).await;
            let a = c.get("/down/x", &[("authorization", "Bearer good")]).await;
            assert_eq!(a.status, 500, "{what}: as configured for the auth-url form");
            let a = c
                .send(
                    "POST",
                    "/grpcdown/x",
                    &[("authorization", "Bearer good")],
                    Bytes::from_static(b"payload"),
                )
                .await;
            assert_eq!(a.status, 503, "{what}");
            // A refusal leaves the body unread, so the proxy may close that connection.
            let mut c = Conn::connect([127, 0, 0, 4], port, tls).await;
            assert_eq!(c.get("/open/after", &[]).await.status, 200, "{what}");
            let seen = s.backend.recv().await.unwrap();
            assert_eq!(
                seen.path, "/open/after",
                "{what}: a request went through unchecked"
            );
        }
        assert_eq!(
            s.proxy
                .metric("coxswain_proxy_external_auth_failed_total")
                .await,
            4,
            "{engine}"
        );
        s.proxy.stop().await;
    }
}
