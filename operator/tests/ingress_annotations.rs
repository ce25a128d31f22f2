//! Ingress annotations end to end without a cluster: Ingress YAML compiled by the real compiler,
//! the snapshot served by a proxy in standalone mode, and requests through real sockets to
//! small backends. Covers class defaults with accessLog: false, a canary split measured over
//! 1,000 requests, and an ingress-nginx style Ingress under compatibility.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

use coxswain_operator::compile::{self, Config, Store};
use coxswain_proxy::standalone::{self, StandaloneConfig};
use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use coxswain_testenv::ports::free_port;

/// A server that reads one request head per connection and writes what `reply` makes of it
/// (one request per connection is enough for these tests).
async fn one_shot_server(reply: impl Fn(&str) -> String + Send + Sync + 'static) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let reply = Arc::new(reply);
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            let reply = reply.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = reply(&String::from_utf8_lossy(&head));
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

/// A backend that names itself in `x-backend` and answers the request head it got as the body.
async fn backend(name: &'static str) -> SocketAddr {
    one_shot_server(move |body| {
        format!(
            "HTTP/1.1 200 OK\r\nx-backend: {name}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    })
    .await
}

struct Reply {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

/// One HTTP/1.1 request on a new connection.
async fn request(
    port: u16,
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// Log output captured by the one global subscriber of this test binary.
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

fn access_log() -> &'static Capture {
    static CAPTURE: OnceLock<Capture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let capture = Capture::default();
        let writer = capture.clone();
        tracing_subscriber::fmt()
            .json()
            .with_env_filter("coxswain::access=info")
            .with_writer(move || writer.clone())
            .init();
        capture
    })
}

/// Hosts of the access log lines so far.
fn logged_hosts() -> Vec<String> {
    let text = String::from_utf8(access_log().0.lock().unwrap().clone()).unwrap();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["fields"]["host"].as_str().map(str::to_owned))
        .collect()
}

/// Services "main" and "canary" in namespace web, with their endpoints on local backends.
fn services(main: SocketAddr, canary: SocketAddr) -> String {
    let mut out = String::new();
    for (name, addr) in [("main", main), ("canary", canary)] {
        out.push_str(&format!(
            r#"
---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: web}}
spec:
  ports: [{{name: http, port: 80, targetPort: {port}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  namespace: web
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
ports: [{{name: http, port: {port}}}]
endpoints:
- addresses: [127.0.0.1]
  conditions: {{ready: true}}
"#,
            port = addr.port()
        ));
    }
    out
}

/// Compiles the objects and serves the shared pool's snapshot; returns the HTTP port, the
/// compiler's output and a handle that stops the proxy.
async fn serve(yaml: &str, compat: bool) -> (u16, compile::Compiled, Running) {
    let mut store = Store::default();
    let mut errors = Vec::new();
    store.load_yaml(Path::new("test.yaml"), yaml, &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    let http = free_port();
    let config = Config {
        ingress_http_port: u32::from(http),
        ingress_https_port: u32::from(free_port()),
        ingress_nginx_compat: compat,
        ..Config::default()
    };
    let compiled = compile::compile(&store, &config);
    let snapshot = &compiled.snapshots[&compile::ScopeKey::SharedPool];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("snapshot.json");
    std::fs::write(&file, serde_json::to_vec(snapshot.snapshot()).unwrap()).unwrap();
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(standalone::serve(
        StandaloneConfig {
            snapshot_file: file,
            bind_ip: "127.0.0.1".parse().unwrap(),
            admin_addr: admin,
            poll: Duration::from_millis(20),
            drain: Duration::from_secs(2),
            threads: 2,
            limits: Default::default(),
        },
        async {
            let _ = stopped.await;
        },
    ));
    // Ready once the listener answers.
    for _ in 0..250 {
        if TcpStream::connect(("127.0.0.1", http)).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (
        http,
        compiled,
        Running {
            stop,
            task,
            _dir: dir,
        },
    )
}

struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), standalone::StandaloneError>>,
    _dir: tempfile::TempDir,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

fn ingress(name: &str, class: &str, host: &str, service: &str, annotations: &str) -> String {
    format!(
        r#"
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: {name}
  namespace: web
  annotations: {{{annotations}}}
spec:
  ingressClassName: {class}
  rules:
  - host: {host}
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: {service}, port: {{number: 80}}}}}}}}
"#
    )
}

const CLASSES: &str = r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: quiet}
spec:
  controller: coxswain-labs.dev/gateway-controller
  parameters: {apiGroup: ingress.coxswain-labs.dev, kind: CoxswainIngressClassParameters, name: quiet, namespace: web, scope: Namespace}
---
apiVersion: ingress.coxswain-labs.dev/v1alpha1
kind: CoxswainIngressClassParameters
metadata: {name: quiet, namespace: web}
spec:
  accessLog: false
  defaultAnnotations:
    ingress.coxswain-labs.dev/response-header-set: "X-Class: default"
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: loud}
spec: {controller: coxswain-labs.dev/gateway-controller}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class_defaults_access_log_and_a_canary_split() {
    access_log();
    let main = backend("main").await;
    let canary = backend("canary").await;
    let yaml = [
        CLASSES.to_owned(),
        services(main, canary),
        ingress("shop", "quiet", "shop.example", "main", ""),
        ingress(
            "shop-canary",
            "quiet",
            "shop.example",
            "canary",
            r#"ingress.coxswain-labs.dev/canary: "true", ingress.coxswain-labs.dev/canary-weight: "25", ingress.coxswain-labs.dev/canary-by-header: X-Canary"#,
        ),
        ingress(
            "own",
            "quiet",
            "own.example",
            "main",
            r#"ingress.coxswain-labs.dev/response-header-set: "X-Class: own""#,
        ),
        ingress("loud", "loud", "loud.example", "main", ""),
    ]
    .concat();
    let (port, _, proxy) = serve(&yaml, false).await;

    // The class default applies unless the Ingress sets its own value.
    let r = request(port, "GET", "own.example", "/", &[]).await;
    assert_eq!((r.status, r.header("x-class")), (200, Some("own")));
    let r = request(port, "GET", "loud.example", "/", &[]).await;
    assert_eq!((r.status, r.header("x-class")), (200, None));

    // Canary: 25% of 1,000 requests, within 5 points; the header overrides the weight.
    let mut to_canary = 0;
    for _ in 0..1000 {
        let r = request(port, "GET", "shop.example", "/", &[]).await;
        assert_eq!(r.header("x-class"), Some("default"), "class default");
        if r.header("x-backend") == Some("canary") {
            to_canary += 1;
        }
    }
    assert!(
        (200..=300).contains(&to_canary),
        "canary got {to_canary} of 1000"
    );
    for _ in 0..20 {
        let always = request(port, "GET", "shop.example", "/", &[("x-canary", "always")]).await;
        assert_eq!(always.header("x-backend"), Some("canary"));
        let never = request(port, "GET", "shop.example", "/", &[("x-canary", "never")]).await;
        assert_eq!(never.header("x-backend"), Some("main"));
    }

    // accessLog: false on the quiet class: only the loud class's request was logged. Lines
    // are written just after each response: poll for the one expected.
    let mut hosts = Vec::new();
    for _ in 0..100 {
        hosts = logged_hosts();
        if !hosts.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.stop().await;
    let hosts: Vec<String> = hosts
        .into_iter()
        .filter(|h| !h.starts_with("legacy"))
        .collect();
    assert_eq!(hosts, ["loud.example"]);
}

/// Secret web/legacy-tls with a real self-signed key pair (the proxy loads it).
fn tls_secret() -> String {
    use k8s_openapi::ByteString;
    let c = rcgen::generate_simple_self_signed(vec!["legacy.example".to_owned()]).unwrap();
    let secret = k8s_openapi::api::core::v1::Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("legacy-tls".into()),
            namespace: Some("web".into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(
            [
                ("tls.crt".to_owned(), ByteString(c.cert.pem().into_bytes())),
                (
                    "tls.key".to_owned(),
                    ByteString(c.signing_key.serialize_pem().into_bytes()),
                ),
            ]
            .into(),
        ),
        ..Default::default()
    };
    let mut value = serde_json::to_value(&secret).unwrap();
    value["apiVersion"] = "v1".into();
    value["kind"] = "Secret".into();
    format!("\n---\n{}", serde_yaml::to_string(&value).unwrap())
}

/// An Ingress as ingress-nginx users write it: a regex path with a capture group rewritten,
/// an HTTPS redirect, a CORS block and a snippet. `legacy-plain` is the same without TLS, so
/// the rewrite and CORS are visible over plain HTTP.
const NGINX_STYLE: &str = r#"
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: coxswain}
spec: {controller: coxswain-labs.dev/gateway-controller}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: legacy
  namespace: web
  annotations:
    nginx.ingress.kubernetes.io/rewrite-target: /$2
    nginx.ingress.kubernetes.io/ssl-redirect: "true"
    nginx.ingress.kubernetes.io/enable-cors: "true"
    nginx.ingress.kubernetes.io/cors-allow-origin: https://app.example
    nginx.ingress.kubernetes.io/configuration-snippet: |
      more_set_headers "X-Frame-Options: DENY";
spec:
  ingressClassName: coxswain
  tls: [{hosts: [legacy.example], secretName: legacy-tls}]
  rules:
  - host: legacy.example
    http:
      paths:
      - path: /app(/|$)(.*)
        pathType: ImplementationSpecific
        backend: {service: {name: main, port: {number: 80}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: legacy-plain
  namespace: web
  annotations:
    nginx.ingress.kubernetes.io/rewrite-target: /$2
    nginx.ingress.kubernetes.io/ssl-redirect: "true"
    nginx.ingress.kubernetes.io/enable-cors: "true"
    nginx.ingress.kubernetes.io/cors-allow-origin: https://app.example
    nginx.ingress.kubernetes.io/configuration-snippet: |
      more_set_headers "X-Frame-Options: DENY";
spec:
  ingressClassName: coxswain
  rules:
  - host: legacy-plain.example
    http:
      paths:
      - path: /app(/|$)(.*)
        pathType: ImplementationSpecific
        backend: {service: {name: main, port: {number: 80}}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingress_nginx_style_ingress_behaves_the_same_under_compat() {
    access_log();
    let main = backend("main").await;
    let canary = backend("canary").await;
    let yaml = [services(main, canary), tls_secret(), NGINX_STYLE.to_owned()].concat();
    let (port, compiled, proxy) = serve(&yaml, true).await;

    // ssl-redirect: plain HTTP is sent to HTTPS with 308.
    let r = request(port, "GET", "legacy.example", "/app/items?page=2", &[]).await;
    assert_eq!(r.status, 308);
    assert_eq!(
        r.header("location"),
        Some("https://legacy.example/app/items?page=2")
    );

    // rewrite-target /$2 with the path's capture groups, case-insensitive like NGINX.
    let r = request(
        port,
        "GET",
        "legacy-plain.example",
        "/APP/items?page=2",
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(
        r.body.starts_with("GET /items?page=2 HTTP/1.1"),
        "{}",
        r.body
    );
    let r = request(port, "GET", "legacy-plain.example", "/app", &[]).await;
    assert!(r.body.starts_with("GET / HTTP/1.1"), "{}", r.body);
    assert_eq!(
        request(port, "GET", "legacy-plain.example", "/other", &[])
            .await
            .status,
        404
    );

    // CORS: the preflight is answered by the proxy, the real request gets the origin back.
    let r = request(
        port,
        "OPTIONS",
        "legacy-plain.example",
        "/app/items",
        &[
            ("origin", "https://app.example"),
            ("access-control-request-method", "PUT"),
        ],
    )
    .await;
    assert_eq!(r.status, 204);
    assert_eq!(r.header("x-backend"), None);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(
        r.header("access-control-allow-methods"),
        Some("GET, PUT, POST, DELETE, PATCH, OPTIONS")
    );
    let r = request(
        port,
        "GET",
        "legacy-plain.example",
        "/app/items",
        &[("origin", "https://app.example")],
    )
    .await;
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    // The snippet did nothing...
    assert_eq!(r.header("x-frame-options"), None);
    proxy.stop().await;

    // ...and is the one warning on each Ingress.
    for name in ["legacy", "legacy-plain"] {
        let status = &compiled.status.ingresses[&compile::status::ObjectKey::new("web", name)];
        let warned: Vec<&str> = status
            .warnings
            .iter()
            .map(|w| w.annotation.as_str())
            .collect();
        assert_eq!(
            warned,
            ["nginx.ingress.kubernetes.io/configuration-snippet"],
            "{name}"
        );
    }
}

/// ingress-nginx's Basic-auth example (a Secret made by `htpasswd -c auth foo` and
/// `kubectl create secret generic basic-auth --from-file=auth`) and its `limit-rps`
/// annotation, under compatibility.
const NGINX_ACCESS: &str = r#"
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: nginx}
spec: {controller: coxswain-labs.dev/gateway-controller}
---
apiVersion: v1
kind: Secret
metadata: {name: basic-auth, namespace: web}
type: Opaque
stringData:
  auth: "foo:$apr1$r31Jzq3U$oriiaS31APatLwvTBKE3D.\n"
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: ingress-with-auth
  namespace: web
  annotations:
    nginx.ingress.kubernetes.io/enable-access-log: "false"
    nginx.ingress.kubernetes.io/auth-type: basic
    nginx.ingress.kubernetes.io/auth-secret: basic-auth
    nginx.ingress.kubernetes.io/auth-realm: 'Authentication Required - foo'
spec:
  ingressClassName: nginx
  rules:
  - host: foo.bar.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: main, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: ingress-with-limit
  namespace: web
  annotations:
    nginx.ingress.kubernetes.io/enable-access-log: "false"
    nginx.ingress.kubernetes.io/limit-rps: "5"
spec:
  ingressClassName: nginx
  rules:
  - host: limited.bar.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: main, port: {number: 80}}}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_nginx_basic_auth_and_limit_rps_behave_as_there_under_compat() {
    access_log();
    let main = backend("main").await;
    let canary = backend("canary").await;
    let yaml = [services(main, canary), NGINX_ACCESS.to_owned()].concat();
    let (port, compiled, proxy) = serve(&yaml, true).await;

    // No credentials, or wrong ones: 401 with the realm, and the backend is not asked.
    let r = request(port, "GET", "foo.bar.com", "/", &[]).await;
    assert_eq!(r.status, 401);
    assert_eq!(
        r.header("www-authenticate"),
        Some("Basic realm=\"Authentication Required - foo\"")
    );
    assert_eq!(r.header("x-backend"), None);
    // "foo:wrong" and "foo:correct horse".
    let r = request(
        port,
        "GET",
        "foo.bar.com",
        "/",
        &[("authorization", "Basic Zm9vOndyb25n")],
    )
    .await;
    assert_eq!(r.status, 401);
    let r = request(
        port,
        "GET",
        "foo.bar.com",
        "/",
        &[("authorization", "Basic Zm9vOmNvcnJlY3QgaG9yc2U=")],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-backend"), Some("main"));

    // limit-rps 5 with ingress-nginx's burst multiplier 5: 25 requests above the rate pass at
    // once (burst=25 nodelay), then 429 with Retry-After until the bucket refills.
    let mut statuses = Vec::new();
    for _ in 0..40 {
        statuses.push(request(port, "GET", "limited.bar.com", "/", &[]).await);
    }
    let accepted = statuses.iter().filter(|r| r.status == 200).count();
    assert!((26..=28).contains(&accepted), "{accepted} accepted");
    let refused: Vec<&Reply> = statuses.iter().filter(|r| r.status != 200).collect();
    assert!(refused.iter().all(|r| r.status == 429), "only 429s");
    assert!(refused.iter().all(|r| r.header("retry-after") == Some("1")));
    // The other Ingress is not limited by this one's bucket.
    let r = request(port, "GET", "foo.bar.com", "/", &[]).await;
    assert_eq!(r.status, 401, "{:?} {}", r.headers, r.body);
    proxy.stop().await;

    for name in ["ingress-with-auth", "ingress-with-limit"] {
        let status = &compiled.status.ingresses[&compile::status::ObjectKey::new("web", name)];
        assert!(
            status.warnings.is_empty() && status.problems.is_empty(),
            "{name}: {status:?}"
        );
    }
}

/// A stand-in for httpbin's `/basic-auth/{user}/{passwd}`, which ingress-nginx's external
/// authentication example uses as its auth-url: 200 for the right Basic credentials (here also
/// naming the user in `x-auth-user`), else 401 with a Basic challenge.
async fn httpbin() -> SocketAddr {
    one_shot_server(|head| {
        let head = head.to_ascii_lowercase();
        let path_ok = head.starts_with("get /basic-auth/user/passwd ");
        // "user:passwd", lower-cased with the rest of the head.
        let credentials = head.contains("\r\nauthorization: basic dxnlcjpwyxnzd2q=\r\n");
        if path_ok && credentials {
            let body = r#"{"authenticated": true, "user": "user"}"#;
            format!(
                "HTTP/1.1 200 OK\r\nx-auth-user: user\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            )
        } else {
            "HTTP/1.1 401 UNAUTHORIZED\r\nwww-authenticate: Basic realm=\"Fake Realm\"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_owned()
        }
    })
    .await
}

/// ingress-nginx's "External Basic Authentication" example (auth-url to httpbin), once with the
/// URL as an address and once as an in-cluster Service name with auth-response-headers and
/// auth-signin, plus an auth-url nobody answers.
fn nginx_external_auth(httpbin: SocketAddr, closed: u16) -> String {
    format!(
        r#"
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {{name: nginx}}
spec: {{controller: coxswain-labs.dev/gateway-controller}}
---
apiVersion: v1
kind: Service
metadata: {{name: httpbin, namespace: auth}}
spec:
  ports: [{{name: http, port: 80, targetPort: {port}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: httpbin-1
  namespace: auth
  labels: {{kubernetes.io/service-name: httpbin}}
addressType: IPv4
ports: [{{name: http, port: {port}}}]
endpoints:
- addresses: [127.0.0.1]
  conditions: {{ready: true}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: external-auth
  namespace: web
  annotations:
    nginx.ingress.kubernetes.io/enable-access-log: "false"
    nginx.ingress.kubernetes.io/auth-url: http://127.0.0.1:{port}/basic-auth/user/passwd
spec:
  ingressClassName: nginx
  rules:
  - host: external-auth-01.sample.com
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: main, port: {{number: 80}}}}}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: external-auth-svc
  namespace: web
  annotations:
    nginx.ingress.kubernetes.io/enable-access-log: "false"
    nginx.ingress.kubernetes.io/auth-url: http://httpbin.auth.svc.cluster.local/basic-auth/user/passwd
    nginx.ingress.kubernetes.io/auth-response-headers: X-Auth-User
    nginx.ingress.kubernetes.io/auth-signin: https://login.sample.com/start
spec:
  ingressClassName: nginx
  rules:
  - host: external-auth-02.sample.com
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: main, port: {{number: 80}}}}}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: external-auth-down
  namespace: web
  annotations:
    nginx.ingress.kubernetes.io/enable-access-log: "false"
    nginx.ingress.kubernetes.io/auth-url: http://127.0.0.1:{closed}/basic-auth/user/passwd
spec:
  ingressClassName: nginx
  rules:
  - host: external-auth-03.sample.com
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: main, port: {{number: 80}}}}}}}}
"#,
        port = httpbin.port()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_nginx_external_auth_behaves_as_there_under_compat() {
    access_log();
    let main = backend("main").await;
    let canary = backend("canary").await;
    let bin = httpbin().await;
    let yaml = [
        services(main, canary),
        nginx_external_auth(bin, free_port()),
    ]
    .concat();
    let (port, compiled, proxy) = serve(&yaml, true).await;
    // "user:passwd", as `curl -u user:passwd` sends it.
    let good = [("authorization", "Basic dXNlcjpwYXNzd2Q=")];
    let wrong = [("authorization", "Basic dXNlcjp3cm9uZw==")];

    // The example's three curls: no credentials and wrong ones get the service's 401 with its
    // challenge (the backend never sees them), the right ones reach the backend.
    for host in ["external-auth-01.sample.com", "external-auth-02.sample.com"] {
        for headers in [&[][..], &wrong[..]] {
            let r = request(port, "GET", host, "/", headers).await;
            if host.ends_with("01.sample.com") {
                assert_eq!(r.status, 401, "{host}");
                assert_eq!(
                    r.header("www-authenticate"),
                    Some("Basic realm=\"Fake Realm\""),
                    "{host}"
                );
            } else {
                // auth-signin: a 401 becomes a redirect to sign in, back to where it was.
                assert_eq!(r.status, 302, "{host}");
                assert_eq!(
                    r.header("location"),
                    Some(
                        "https://login.sample.com/start?rd=http%3A%2F%2Fexternal-auth-02.sample.com%2F"
                    ),
                    "{host}"
                );
            }
            assert_eq!(r.header("x-backend"), None, "{host}");
        }
        let r = request(port, "GET", host, "/", &good).await;
        assert_eq!(r.status, 200, "{host}: {}", r.body);
        assert_eq!(r.header("x-backend"), Some("main"), "{host}");
    }
    // auth-response-headers: the service's X-Auth-User replaces a forged one.
    let r = request(
        port,
        "GET",
        "external-auth-02.sample.com",
        "/",
        &[good[0], ("x-auth-user", "admin")],
    )
    .await;
    assert_eq!(r.status, 200);
    let sent = r.body.to_ascii_lowercase();
    assert!(sent.contains("\r\nx-auth-user: user\r\n"), "{}", r.body);
    assert!(!sent.contains("admin"), "{}", r.body);
    // The service cannot be reached: 500, as nginx answers a failed auth subrequest.
    let r = request(port, "GET", "external-auth-03.sample.com", "/", &good).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.header("x-backend"), None);
    proxy.stop().await;

    for name in ["external-auth", "external-auth-svc", "external-auth-down"] {
        let status = &compiled.status.ingresses[&compile::status::ObjectKey::new("web", name)];
        assert!(
            status.warnings.is_empty() && status.problems.is_empty(),
            "{name}: {status:?}"
        );
    }
    // The in-cluster name went to the Service's endpoints, not to DNS.
    let snapshot = &compiled.snapshots[&compile::ScopeKey::SharedPool];
    let svc_auth = snapshot
        .listeners
        .iter()
        .flat_map(|l| &l.virtual_hosts)
        .filter(|v| v.hostname == "external-auth-02.sample.com")
        .flat_map(|v| &v.routes)
        .find_map(|r| r.external_auth.clone())
        .unwrap();
    assert_eq!(svc_auth.cluster, "auth/httpbin:80");
    assert_eq!(svc_auth.address, "");
}
