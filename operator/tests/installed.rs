//! Coxswain installed the way a user installs it without OLM, `kubectl apply -k config/default`,
//! running as Pods on the test node: the controller replicas elect a leader, the shared pool
//! and a Gateway's dedicated proxy bootstrap their SVIDs from projected tokens, and real HTTP
//! through LoadBalancer addresses reaches echo-basic Pods. Gateway status says Programmed.
//! TCP through a TCPRoute splits connections by weight and survives a route change; UDP
//! through a UDPRoute splits client flows by weight.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_api::names;
use coxswain_testenv::{TestEnv, eventually};
use gateway_api::apis::experimental::httproutes::HttpRoute;
use gateway_api::apis::experimental::tcproutes::TcpRoute;
use gateway_api::apis::experimental::udproutes::UdpRoute;
use gateway_api::apis::standard::gateways::Gateway;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use support::apply_yaml;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

const WAIT: Duration = Duration::from_secs(120);

/// One HTTP/1.0 request; the status line and the body.
async fn request(addr: SocketAddr, path: &str, host: &str) -> Option<(String, String)> {
    let connect = tokio::net::TcpStream::connect(addr);
    let mut stream = tokio::time::timeout(Duration::from_secs(3), connect)
        .await
        .ok()?
        .ok()?;
    let req = format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n");
    stream.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_owned(), body.to_owned()))
}

/// A DNS query for who.example (type A) from `socket`, and the address the answer holds: each
/// CoreDNS backend of the UDP test answers with its own.
async fn who(socket: &tokio::net::UdpSocket, server: SocketAddr) -> Option<std::net::Ipv4Addr> {
    // Header: id, flags (recursion desired), one question; then the name, type A, class IN.
    let mut query = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in ["who", "example"] {
        query.push(u8::try_from(label.len()).ok()?);
        query.extend_from_slice(label.as_bytes());
    }
    query.extend_from_slice(&[0, 0, 1, 0, 1]);
    socket.send_to(&query, server).await.ok()?;
    let mut buf = [0u8; 512];
    let (n, _) = tokio::time::timeout(Duration::from_secs(2), socket.recv_from(&mut buf))
        .await
        .ok()?
        .ok()?;
    let answer = &buf[..n];
    // One answer record, an A record: its address ends the message.
    if answer.get(6..8)? != [0, 1] {
        return None;
    }
    let address: [u8; 4] = answer.get(n.checked_sub(4)?..)?.try_into().ok()?;
    Some(address.into())
}

/// A connection to echo-basic's TCP server (TCP_ECHO_SERVER), past its welcome line.
type TcpEcho = tokio::io::Lines<BufReader<tokio::net::TcpStream>>;

async fn tcp_echo(addr: SocketAddr) -> Option<TcpEcho> {
    let connect = tokio::net::TcpStream::connect(addr);
    let stream = tokio::time::timeout(Duration::from_secs(3), connect)
        .await
        .ok()?
        .ok()?;
    let mut lines = BufReader::new(stream).lines();
    let welcome = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
        .await
        .ok()?
        .ok()??;
    welcome.contains("TCP Server").then_some(lines)
}

/// One line to echo-basic's TCP server and its answer: "TEST" is answered with the Pod's
/// context as JSON, "PING" with "PONG".
async fn tcp_ask(conn: &mut TcpEcho, line: &str) -> Option<String> {
    let stream = conn.get_mut().get_mut();
    stream
        .write_all(format!("{line}\n").as_bytes())
        .await
        .ok()?;
    tokio::time::timeout(Duration::from_secs(5), conn.next_line())
        .await
        .ok()?
        .ok()?
}

/// The Pod that answered "TEST" on `conn`.
async fn tcp_pod(conn: &mut TcpEcho) -> Option<String> {
    let json: serde_json::Value = serde_json::from_str(&tcp_ask(conn, "TEST").await?).ok()?;
    Some(json["pod"].as_str()?.to_owned())
}

/// The TCP and UDP backends of the L4 tests, each a Deployment of one Pod and a Service:
/// echo-basic's TCP server as tcp-a and tcp-b (port 5432), and CoreDNS as dns-a and dns-b
/// (UDP port 53), answering who.example with 10.0.0.1 and 10.0.0.2.
fn l4_backends(ns: &str) -> String {
    let mut out = String::new();
    for name in ["tcp-a", "tcp-b"] {
        out.push_str(&backend(
            ns,
            name,
            r#"      - name: echo
        image: gcr.io/k8s-staging-gateway-api/echo-basic:v20240412-v1.0.0-394-g40c666fd
        ports: [{name: tcp, containerPort: 3000}]
        env:
        - {name: TCP_ECHO_SERVER, value: "1"}
        - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
        readinessProbe: {tcpSocket: {port: tcp}, periodSeconds: 1}
"#,
            "{name: tcp, port: 5432, targetPort: tcp}",
        ));
    }
    for (name, ip) in [("dns-a", "10.0.0.1"), ("dns-b", "10.0.0.2")] {
        out.push_str(&format!(
            r#"---
apiVersion: v1
kind: ConfigMap
metadata: {{name: {name}, namespace: {ns}}}
data:
  Corefile: |
    .:1053 {{
        hosts {{
            {ip} who.example
        }}
    }}
"#
        ));
        out.push_str(&backend(
            ns,
            name,
            &format!(
                r#"      - name: coredns
        image: registry.k8s.io/coredns/coredns:v1.12.0
        args: [-conf, /etc/coredns/Corefile]
        ports: [{{name: dns, containerPort: 1053, protocol: UDP}}, {{name: dns-tcp, containerPort: 1053}}]
        readinessProbe: {{tcpSocket: {{port: dns-tcp}}, periodSeconds: 1}}
        volumeMounts: [{{name: config, mountPath: /etc/coredns}}]
      volumes: [{{name: config, configMap: {{name: {name}}}}}]
"#
            ),
            "{name: dns, port: 53, targetPort: dns, protocol: UDP}",
        ));
    }
    out
}

/// A Deployment of one Pod running `containers` (YAML under `containers:`), and a Service
/// with `port` selecting it, both called `name`.
fn backend(ns: &str, name: &str, containers: &str, port: &str) -> String {
    format!(
        r#"---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {ns}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      containers:
{containers}---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {ns}}}
spec:
  selector: {{app: {name}}}
  ports: [{port}]
"#
    )
}

/// Whether a route's first parent says Accepted and ResolvedRefs, both True.
fn accepted_and_resolved(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> bool {
    ["Accepted", "ResolvedRefs"].iter().all(|t| {
        conditions
            .iter()
            .any(|c| c.type_ == *t && c.status == "True")
    })
}

async fn ready_replicas(api: &Api<Deployment>, name: &str, want: i32) {
    eventually(
        &format!("Deployment {name} with {want} ready replicas"),
        WAIT,
        || {
            let api = api.clone();
            async move {
                let d = api.get_opt(name).await.ok()??;
                (d.status?.ready_replicas? >= want).then_some(())
            }
        },
    )
    .await;
}

async fn load_balancer_ip(api: &Api<Service>, name: &str) -> std::net::IpAddr {
    eventually(&format!("a LoadBalancer address for {name}"), WAIT, || {
        let api = api.clone();
        async move {
            let svc = api.get_opt(name).await.ok()??;
            svc.status?
                .load_balancer?
                .ingress?
                .first()?
                .ip
                .as_deref()?
                .parse()
                .ok()
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_from_config_default_it_serves_traffic_from_pods() {
    let env = TestEnv::new().await;
    let ns = env.namespace.clone();
    let cluster = env.cluster();
    let node = tokio::task::spawn_blocking(move || {
        cluster.start_node(&[("coxswain", Path::new(env!("CARGO_BIN_EXE_coxswain")))])
    })
    .await
    .unwrap();

    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = cluster
        .kubectl()
        .args(["apply", "--server-side", "-k"])
        .arg(repo.join("config/default"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl apply -k config/default: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let system = names::DEFAULT_NAMESPACE;
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), system);
    ready_replicas(&deployments, "coxswain-controller", 2).await;
    // Exactly one controller Pod carries the leader label the discovery Service selects.
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), system);
    let leaders = eventually("one leader Pod", WAIT, || {
        let pods = pods.clone();
        async move {
            let lp = ListParams::default().labels(&format!(
                "{}={}",
                names::LEADER_LABEL,
                names::LEADER_LABEL_VALUE
            ));
            let list = pods.list(&lp).await.ok()?;
            (list.items.len() == 1).then_some(list.items.len())
        }
    })
    .await;
    assert_eq!(leaders, 1);

    // The application: echo-basic behind a Service, a dedicated Gateway and two shared ones
    // on the same port with the same hostname.
    apply_yaml(
        &env.client,
        &format!(
            r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: echo, namespace: {ns}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: echo}}}}
  template:
    metadata: {{labels: {{app: echo}}}}
    spec:
      containers:
      - name: echo
        image: gcr.io/k8s-staging-gateway-api/echo-basic:v20240412-v1.0.0-394-g40c666fd
        ports: [{{name: http, containerPort: 3000}}]
        env:
        - {{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
        - {{name: NAMESPACE, valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}}}
        readinessProbe: {{httpGet: {{path: /, port: http}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: {ns}}}
spec:
  selector: {{app: echo}}
  ports: [{{name: http, port: 8080, targetPort: http}}]
---
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainGatewayParameters
metadata: {{name: edge-params, namespace: {ns}}}
spec: {{replicas: 1, serviceType: LoadBalancer}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: coxswain}}
spec: {{controllerName: {controller}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: {ns}}}
spec:
  gatewayClassName: coxswain
  infrastructure:
    parametersRef: {{group: gateway.coxswain-labs.dev, kind: CoxswainGatewayParameters, name: edge-params}}
  listeners:
  - {{name: http, port: 8080, protocol: HTTP}}
  - {{name: tcp, port: 5432, protocol: TCP}}
  - {{name: dns, port: 5353, protocol: UDP}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: main, namespace: {ns}}}
spec:
  gatewayClassName: coxswain
  listeners: [{{name: http, port: 80, protocol: HTTP}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: other, namespace: {ns}}}
spec:
  gatewayClassName: coxswain
  listeners: [{{name: http, port: 80, protocol: HTTP, hostname: shared.example}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: dedicated, namespace: {ns}}}
spec:
  parentRefs: [{{name: edge}}]
  rules: [{{backendRefs: [{{name: echo, port: 8080}}]}}]
{l4_backends}---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: UDPRoute
metadata: {{name: dns, namespace: {ns}}}
spec:
  parentRefs: [{{name: edge, sectionName: dns}}]
  rules:
  - backendRefs: [{{name: dns-a, port: 53, weight: 3}}, {{name: dns-b, port: 53, weight: 1}}]
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: {{name: db, namespace: {ns}}}
spec:
  parentRefs: [{{name: edge, sectionName: tcp}}]
  rules:
  - backendRefs: [{{name: tcp-a, port: 5432, weight: 3}}, {{name: tcp-b, port: 5432, weight: 1}}]
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {{name: coxswain}}
spec: {{controller: {controller}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: echo, namespace: {ns}}}
spec:
  ingressClassName: coxswain
  rules:
  - host: ingress.example
    http:
      paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: echo, port: {{number: 8080}}}}}}}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: shared, namespace: {ns}}}
spec:
  parentRefs: [{{name: main}}]
  hostnames: [shared.example]
  rules:
  - filters: [{{type: RequestHeaderModifier, requestHeaderModifier: {{set: [{{name: x-gateway, value: main}}]}}}}]
    backendRefs: [{{name: echo, port: 8080}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: other, namespace: {ns}}}
spec:
  parentRefs: [{{name: other}}]
  hostnames: [shared.example]
  rules:
  - filters: [{{type: RequestHeaderModifier, requestHeaderModifier: {{set: [{{name: x-gateway, value: other}}]}}}}]
    backendRefs: [{{name: echo, port: 8080}}]
"#,
            controller = names::CONTROLLER_NAME,
            l4_backends = l4_backends(&ns),
        ),
    )
    .await;

    // The dedicated proxy runs as a Pod of its own Deployment, bootstraps its SVID from its
    // projected token, and answers on its Service's LoadBalancer address.
    let name = names::dedicated_proxy_name("edge", "coxswain");
    let app_deployments: Api<Deployment> = env.api();
    ready_replicas(&app_deployments, &name, 1).await;
    let services: Api<Service> = env.api();
    let edge_ip = load_balancer_ip(&services, &name).await;
    let (status, body) = eventually(
        "echo-basic through the dedicated proxy",
        WAIT,
        || async move {
            let r = request(SocketAddr::new(edge_ip, 8080), "/dedicated", "edge.example").await?;
            r.0.contains(" 200 ").then_some(r)
        },
    )
    .await;
    let json: serde_json::Value =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {status} {body}"));
    assert_eq!(json["namespace"], ns.as_str(), "{json}");
    assert_eq!(json["path"], "/dedicated", "{json}");
    assert!(
        json["pod"]
            .as_str()
            .unwrap_or_default()
            .starts_with("echo-"),
        "{json}"
    );

    // The shared pool answers for each shared Gateway on an address of the Gateway's own: its
    // Service in the controller's namespace maps port 80 to the Gateway's internal port on
    // the shared proxies. Both Gateways listen on 80 for shared.example, and each answers
    // with its own route.
    let system_services: Api<Service> = Api::namespaced(env.client.clone(), system);
    let shared_ip = load_balancer_ip(&system_services, "coxswain-proxy").await;
    let main_ip = load_balancer_ip(
        &system_services,
        &names::shared_gateway_service_name(&ns, "main"),
    )
    .await;
    let other_ip = load_balancer_ip(
        &system_services,
        &names::shared_gateway_service_name(&ns, "other"),
    )
    .await;
    assert!(
        main_ip != other_ip && main_ip != shared_ip && other_ip != shared_ip,
        "each shared Gateway has an address of its own: {main_ip} {other_ip} {shared_ip}"
    );
    for (gw, ip) in [("main", main_ip), ("other", other_ip)] {
        let (_, body) = eventually(
            &format!("echo-basic through shared Gateway {gw} at {ip}"),
            WAIT,
            || async move {
                let r = request(SocketAddr::new(ip, 80), "/shared", "shared.example").await?;
                r.0.contains(" 200 ").then_some(r)
            },
        )
        .await;
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["path"], "/shared", "{json}");
        assert_eq!(
            json["headers"]["X-Gateway"][0], gw,
            "the request went through {gw}'s route: {json}"
        );
    }
    // The pool's own address serves Ingresses only: neither Gateway's route is there.
    let (status, _) = request(SocketAddr::new(shared_ip, 80), "/shared", "shared.example")
        .await
        .expect("an answer from the pool's address");
    assert!(status.contains(" 404 "), "{status}");

    // The Ingress, through the same shared pool; its status carries the pool's address.
    let (_, body) = eventually("echo-basic through the Ingress", WAIT, || async move {
        let r = request(
            SocketAddr::new(shared_ip, 80),
            "/ingress",
            "ingress.example",
        )
        .await?;
        r.0.contains(" 200 ").then_some(r)
    })
    .await;
    assert!(body.contains("\"path\": \"/ingress\""), "{body}");
    let ingresses: Api<Ingress> = env.api();
    eventually("Ingress status.loadBalancer", WAIT, || {
        let ingresses = ingresses.clone();
        async move {
            let ing = ingresses.get("echo").await.ok()?;
            let ip = ing.status?.load_balancer?.ingress?.first()?.ip.clone()?;
            (ip == shared_ip.to_string()).then_some(())
        }
    })
    .await;

    // What `kubectl get gateway -o yaml` tells a person: both Gateways Programmed, each with
    // the address that reaches it.
    let gateways: Api<Gateway> = env.api();
    for (gw, address) in [("edge", edge_ip), ("main", main_ip), ("other", other_ip)] {
        eventually(
            &format!("Gateway {gw} Programmed at {address}"),
            WAIT,
            || {
                let gateways = gateways.clone();
                async move {
                    let status = gateways.get(gw).await.ok()?.status?;
                    let programmed = status
                        .conditions?
                        .into_iter()
                        .find(|c| c.type_ == "Programmed")?;
                    let addresses = status.addresses?;
                    (programmed.status == "True" && addresses.first()?.value == address.to_string())
                        .then_some(())
                }
            },
        )
        .await;
    }

    // TCP through the dedicated proxy. The TCPRoute is accepted with its references resolved,
    // connections split 3:1 between its backends, and a route change applies to new
    // connections while an established one keeps its backend.
    let tcp_routes: Api<TcpRoute> = env.api();
    eventually("TCPRoute Accepted and ResolvedRefs", WAIT, || {
        let tcp_routes = tcp_routes.clone();
        async move {
            let status = tcp_routes.get("db").await.ok()?.status?;
            accepted_and_resolved(&status.parents.first()?.conditions).then_some(())
        }
    })
    .await;
    let tcp_addr = SocketAddr::new(edge_ip, 5432);
    // Both backends answer before counting: until then, Pods may still be starting.
    eventually(
        "both TCP backends through the dedicated proxy",
        WAIT,
        || async move {
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..40 {
                let pod = tcp_pod(&mut tcp_echo(tcp_addr).await?).await?;
                seen.insert(pod.starts_with("tcp-a-"));
            }
            (seen.len() == 2).then_some(())
        },
    )
    .await;
    let (mut to_a, mut to_b) = (0u32, 0u32);
    for i in 0..1000 {
        let mut conn = tcp_echo(tcp_addr)
            .await
            .unwrap_or_else(|| panic!("TCP connection {i} through the dedicated proxy"));
        let pod = tcp_pod(&mut conn)
            .await
            .unwrap_or_else(|| panic!("TEST on {i}"));
        if pod.starts_with("tcp-a-") {
            to_a += 1;
        } else {
            assert!(pod.starts_with("tcp-b-"), "{pod}");
            to_b += 1;
        }
    }
    eprintln!("TCPRoute 3:1 over 1,000 connections: tcp-a {to_a}, tcp-b {to_b}");
    // 750 expected; a random pick stays within five standard deviations (about 68).
    assert!((682..=818).contains(&to_a), "tcp-a {to_a}, tcp-b {to_b}");
    let mut established = tcp_echo(tcp_addr).await.expect("a kept connection");
    let kept_by = tcp_pod(&mut established).await.expect("TEST");
    let only_b = serde_json::json!({"spec": {"rules": [{"backendRefs":
        [{"name": "tcp-b", "port": 5432}]}]}});
    tcp_routes
        .patch("db", &PatchParams::default(), &Patch::Merge(&only_b))
        .await
        .unwrap();
    eventually("new TCP connections only to tcp-b", WAIT, || async move {
        for _ in 0..20 {
            let pod = tcp_pod(&mut tcp_echo(tcp_addr).await?).await?;
            if !pod.starts_with("tcp-b-") {
                return None;
            }
        }
        Some(())
    })
    .await;
    assert_eq!(
        tcp_ask(&mut established, "PING").await.as_deref(),
        Some("PONG")
    );
    assert_eq!(
        tcp_pod(&mut established).await.as_deref(),
        Some(kept_by.as_str()),
        "the established connection keeps its backend"
    );
    drop(established);

    // UDP through the dedicated proxy: each client socket is a flow, and flows split 3:1
    // between two CoreDNS backends that answer who.example with their own address.
    let udp_routes: Api<UdpRoute> = env.api();
    eventually("UDPRoute Accepted and ResolvedRefs", WAIT, || {
        let udp_routes = udp_routes.clone();
        async move {
            let status = udp_routes.get("dns").await.ok()?.status?;
            accepted_and_resolved(&status.parents.first()?.conditions).then_some(())
        }
    })
    .await;
    let dns_addr = SocketAddr::new(edge_ip, 5353);
    let (a_ip, b_ip) = (
        std::net::Ipv4Addr::new(10, 0, 0, 1),
        std::net::Ipv4Addr::new(10, 0, 0, 2),
    );
    eventually(
        "both DNS backends through the dedicated proxy",
        WAIT,
        || async move {
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..40 {
                let socket = tokio::net::UdpSocket::bind("0.0.0.0:0").await.ok()?;
                seen.insert(who(&socket, dns_addr).await?);
            }
            (seen.len() == 2).then_some(())
        },
    )
    .await;
    // Every client socket stays open until counted: a closed one's port could come back as
    // a later client, which would be the same flow.
    let mut clients = Vec::new();
    let (mut udp_a, mut udp_b) = (0u32, 0u32);
    for i in 0..1000 {
        let socket = tokio::net::UdpSocket::bind("0.0.0.0:0").await.unwrap();
        let ip = who(&socket, dns_addr)
            .await
            .unwrap_or_else(|| panic!("DNS answer {i} through the dedicated proxy"));
        match ip {
            ip if ip == a_ip => udp_a += 1,
            ip if ip == b_ip => udp_b += 1,
            other => panic!("answer from {other}"),
        }
        clients.push(socket);
    }
    drop(clients);
    eprintln!("UDPRoute 3:1 over 1,000 client flows: dns-a {udp_a}, dns-b {udp_b}");
    assert!((682..=818).contains(&udp_a), "dns-a {udp_a}, dns-b {udp_b}");

    // Editing the route changes the answer; deleting it gives 404.
    let routes: Api<HttpRoute> = env.api();
    let redirect = serde_json::json!({"spec": {"rules": [{"filters": [{"type": "RequestRedirect",
        "requestRedirect": {"hostname": "moved.example", "statusCode": 302}}]}]}});
    routes
        .patch("shared", &PatchParams::default(), &Patch::Merge(&redirect))
        .await
        .unwrap();
    eventually("the edited route's redirect", WAIT, || async move {
        let r = request(SocketAddr::new(main_ip, 80), "/x", "shared.example").await?;
        r.0.contains(" 302 ").then_some(())
    })
    .await;
    routes
        .delete("shared", &DeleteParams::default())
        .await
        .unwrap();
    eventually("404 once the route is gone", WAIT, || async move {
        let r = request(SocketAddr::new(main_ip, 80), "/x", "shared.example").await?;
        r.0.contains(" 404 ").then_some(())
    })
    .await;

    // Failover: the leader is killed (no grace, so its Lease is not handed over). A client
    // sends requests through the shared pool throughout; the other replica takes the Lease
    // within one TTL and the proxies follow it, with no failed request.
    let leader_label = format!("{}={}", names::LEADER_LABEL, names::LEADER_LABEL_VALUE);
    let (leader, leader_uid) = eventually("the current leader", WAIT, || {
        let (pods, leader_label) = (pods.clone(), leader_label.clone());
        async move {
            let list = pods
                .list(&ListParams::default().labels(&leader_label))
                .await
                .ok()?;
            let meta = &list.items.first()?.metadata;
            Some((meta.name.clone()?, meta.uid.clone()?))
        }
    })
    .await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = tokio::spawn({
        let stop = stop.clone();
        async move {
            let (mut ok, mut failed) = (0u32, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let addr = SocketAddr::new(shared_ip, 80);
                match request(addr, "/during-failover", "ingress.example").await {
                    Some((status, _)) if status.contains(" 200 ") => ok += 1,
                    other => failed.push((std::time::Instant::now(), format!("{other:?}"))),
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (ok, failed)
        }
    });
    // Each change to echo's ready endpoints during the failover, for the failure message: a
    // 503 means a proxy applied a snapshot in which echo had none.
    let endpoint_changes = tokio::spawn({
        let slices: Api<EndpointSlice> = env.api();
        let stop = stop.clone();
        async move {
            use futures::StreamExt;
            let config =
                kube::runtime::watcher::Config::default().labels("kubernetes.io/service-name=echo");
            let mut events = std::pin::pin!(kube::runtime::watcher(slices, config));
            let mut seen = Vec::new();
            loop {
                let next = tokio::time::timeout(Duration::from_millis(200), events.next());
                match next.await {
                    Ok(Some(Ok(
                        kube::runtime::watcher::Event::Apply(slice)
                        | kube::runtime::watcher::Event::InitApply(slice),
                    ))) => {
                        let ready = slice
                            .endpoints
                            .iter()
                            .flatten()
                            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
                            .count();
                        seen.push((std::time::Instant::now(), ready));
                    }
                    Ok(None) => break,
                    _ if stop.load(std::sync::atomic::Ordering::Relaxed) => break,
                    _ => {}
                }
            }
            seen
        }
    });
    // A crash: SIGKILL, so nothing hands the Lease over; the Pod is then force-deleted so
    // the node does not restart it in place.
    let pid = node
        .container_pid(&leader_uid, "controller")
        .expect("the leader's pid");
    let killed_at = std::time::Instant::now();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success(), "kill -KILL {pid}");
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    pods.delete(&leader, &force).await.unwrap();
    let new_leader = eventually("a new leader", WAIT, || {
        let (pods, leader_label, leader) = (pods.clone(), leader_label.clone(), leader.clone());
        async move {
            let list = pods
                .list(&ListParams::default().labels(&leader_label))
                .await
                .ok()?;
            let name = list.items.first()?.metadata.name.clone()?;
            (name != leader).then_some(name)
        }
    })
    .await;
    let takeover = killed_at.elapsed();
    // The proxies follow the new leader: a change made now reaches them.
    apply_yaml(
        &env.client,
        &format!(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: after-failover, namespace: {ns}}}
spec:
  parentRefs: [{{name: main}}]
  hostnames: [after.example]
  rules: [{{backendRefs: [{{name: echo, port: 8080}}]}}]
"#
        ),
    )
    .await;
    eventually("a route applied after the failover", WAIT, || async move {
        let r = request(SocketAddr::new(main_ip, 80), "/after", "after.example").await?;
        r.0.contains(" 200 ").then_some(())
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = client.await.unwrap();
    eprintln!(
        "failover: {new_leader} took over from {leader} in {takeover:?}; {ok} requests, {} failed",
        failed.len()
    );
    // The standby checks every 5 s and the Lease lasts 15 s: no sooner than the Lease's
    // remaining life, no later than a TTL plus one check.
    assert!(
        takeover < Duration::from_secs(15 + 5),
        "takeover within one TTL (15 s) and a renew period: {takeover:?}"
    );
    assert!(
        takeover > Duration::from_secs(5),
        "a crashed leader hands nothing over; the Lease had to expire: {takeover:?}"
    );
    assert!(ok > 50, "the client kept sending: {ok}");
    if !failed.is_empty() {
        // When they failed, counted from the kill, and what the pool and the new leader
        // logged meanwhile: which snapshot each proxy applied, and when.
        let at = |t: std::time::Instant| {
            let ms = |d: Duration| d.as_millis();
            match t.checked_duration_since(killed_at) {
                Some(after) => format!("+{} ms", ms(after)),
                None => format!("-{} ms", ms(killed_at - t)),
            }
        };
        let failed: Vec<String> = failed
            .iter()
            .map(|(t, answer)| format!("{}: {answer}", at(*t)))
            .collect();
        let logs = |selector: &str| {
            let out = env
                .cluster()
                .kubectl()
                .args([
                    "logs",
                    "-n",
                    system,
                    "--prefix",
                    "--tail=60",
                    "-l",
                    selector,
                ])
                .output();
            out.map_or_else(
                |e| format!("kubectl logs: {e}"),
                |o| String::from_utf8_lossy(&o.stdout).into_owned(),
            )
        };
        let slices: Vec<String> = endpoint_changes
            .await
            .unwrap()
            .into_iter()
            .map(|(t, ready)| format!("{}: {ready} ready", at(t)))
            .collect();
        panic!(
            "requests failed during the failover (killed at +0 ms, new leader after {takeover:?}):\n{}\n\
             shared pool logs:\n{}\nnew leader logs:\n{}\necho's ready endpoints as they changed:\n{}",
            failed.join("\n"),
            logs("app.kubernetes.io/component=shared-proxy"),
            logs(&leader_label),
            slices.join("\n"),
        );
    }

    // A rolling restart of the shared pool (`kubectl rollout restart`) under a client sending
    // a request every 20 ms, each on a new connection. A new Pod is ready before an old one
    // stops; an old one fails readiness at SIGTERM but accepts through its shutdown delay
    // while the Service's endpoints catch up. No request may fail.
    let pool = "app.kubernetes.io/component=shared-proxy";
    let old_pods: Vec<String> = pods
        .list(&ListParams::default().labels(pool))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(old_pods.len(), 2, "{old_pods:?}");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = tokio::spawn({
        let stop = stop.clone();
        async move {
            let (mut ok, mut failed) = (0u32, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let addr = SocketAddr::new(shared_ip, 80);
                match request(addr, "/during-rollout", "ingress.example").await {
                    Some((status, _)) if status.contains(" 200 ") => ok += 1,
                    other => failed.push(format!("{other:?}")),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (ok, failed)
        }
    });
    let restart = serde_json::json!({"spec": {"template": {"metadata": {"annotations":
        {"kubectl.kubernetes.io/restartedAt": "rolling-restart-test"}}}}});
    let restarted_at = std::time::Instant::now();
    deployments
        .patch(
            "coxswain-proxy",
            &PatchParams::default(),
            &Patch::Merge(&restart),
        )
        .await
        .unwrap();
    eventually("the shared pool replaced by 2 new ready Pods", WAIT, || {
        let (pods, deployments, old_pods) = (pods.clone(), deployments.clone(), old_pods.clone());
        async move {
            let left = pods.list(&ListParams::default().labels(pool)).await.ok()?;
            let names: Vec<String> = left
                .items
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .collect();
            if names.iter().any(|n| old_pods.contains(n)) {
                return None;
            }
            let d = deployments.get("coxswain-proxy").await.ok()?;
            let status = d.status?;
            (status.updated_replicas? == 2 && status.ready_replicas? == 2).then_some(())
        }
    })
    .await;
    let rolled = restarted_at.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = client.await.unwrap();
    eprintln!(
        "rolling restart of the shared pool (2 replicas) in {rolled:?}: {ok} requests every 20 ms, {} failed",
        failed.len()
    );
    assert!(ok > 100, "the client kept sending: {ok}");
    assert!(
        failed.is_empty(),
        "requests failed during the rolling restart: {failed:?}"
    );
}
