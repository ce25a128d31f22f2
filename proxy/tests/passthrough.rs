//! The plain HTTP/1.1 fast path, with raw sockets on both sides: connections that move from
//! the fast path to Pingora mid-way, pipelining, every response framing, interim responses,
//! pooled backend connections that the backend closed, and an unreachable backend.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use std::net::SocketAddr;
use std::time::Duration;
use support::http2::h2c;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const ROUTES: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: echo, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /echo}}
      backends: [{cluster: "t/echo:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: raw, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /raw}}
      backends: [{cluster: "t/raw:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: gone, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /gone}}
      backends: [{cluster: "t/gone:80", weight: 1}]
clusters:
- name: t/echo:80
  endpoints: [{address: 127.0.0.1, port: {ECHO}, ready: true, serving: true}]
- name: t/raw:80
  endpoints: [{address: 127.0.0.1, port: {RAW}, ready: true, serving: true}]
- name: t/gone:80
  endpoints: [{address: 127.0.0.1, port: {GONE}, ready: true, serving: true}]
"#;

/// A backend speaking HTTP/1.1 by hand, so each framing can be produced exactly. It closes
/// every connection right after `/raw/close-after` answers, without saying so.
async fn raw_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut accepted = 0u32;
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            accepted += 1;
            let connection = accepted;
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Some(end) = find(&buf, b"\r\n\r\n") else {
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_string();
                    buf.drain(..end + 4);
                    // A Content-Length body is read whole before the answer.
                    let length: usize = head
                        .to_ascii_lowercase()
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap_or(0));
                    while buf.len() < length {
                        let mut chunk = [0u8; 16384];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body: Vec<u8> = buf.drain(..length).collect();
                    let line = head.lines().next().unwrap_or("").to_owned();
                    let path = line.split(' ').nth(1).unwrap_or("/");
                    let counted;
                    let told;
                    let reply: &[u8] = match path {
                        // Which of the backend's connections this is, and the head it got.
                        "/raw/tell" => {
                            let text = format!("connection {connection}\n{head}");
                            told = format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}",
                                text.len()
                            );
                            told.as_bytes()
                        }
                        "/raw/count" => {
                            let sum: u64 = body.iter().map(|b| u64::from(*b)).sum();
                            let text = format!("{} bytes, sum {sum}", body.len());
                            counted = format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}",
                                text.len()
                            );
                            counted.as_bytes()
                        }
                        "/raw/truncated" => b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
                        "/raw/chunked" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=1\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n",
                        "/raw/interim" => b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal",
                        "/raw/head" => b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
                        "/raw/until-close" => b"HTTP/1.1 200 OK\r\n\r\nuntil the end",
                        _ => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Raw: yes\r\n\r\nok",
                    };
                    if s.write_all(reply).await.is_err() {
                        return;
                    }
                    if path == "/raw/until-close"
                        || path == "/raw/close-after"
                        || path == "/raw/truncated"
                    {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads what arrives next (within 5 s) onto `buf`; 0 at end of stream.
async fn read_more(s: &mut TcpStream, buf: &mut Vec<u8>) -> usize {
    let mut chunk = [0u8; 8192];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut chunk))
        .await
        .expect("a response in time")
        .unwrap();
    buf.extend_from_slice(&chunk[..n]);
    n
}

/// One response from `s`: status, head text and body (content-length, chunked, or to EOF).
async fn response(s: &mut TcpStream, buf: &mut Vec<u8>, head_only: bool) -> (u16, String, Vec<u8>) {
    let end = loop {
        if let Some(e) = find(buf, b"\r\n\r\n") {
            break e;
        }
        assert!(read_more(s, buf).await > 0, "connection closed mid-head");
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_string();
    buf.drain(..end + 4);
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let lower = head.to_ascii_lowercase();
    let length = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse::<usize>().unwrap());
    let body = if head_only || (100..200).contains(&status) {
        Vec::new()
    } else if lower.contains("transfer-encoding: chunked") {
        loop {
            if let Some(e) = find(buf, b"0\r\n")
                && let Some(t) = find(&buf[e..], b"\r\n\r\n")
            {
                break buf.drain(..e + t + 4).collect();
            }
            assert!(read_more(s, buf).await > 0, "connection closed mid-body");
        }
    } else if let Some(len) = length {
        while buf.len() < len {
            assert!(read_more(s, buf).await > 0, "connection closed mid-body");
        }
        buf.drain(..len).collect()
    } else {
        while read_more(s, buf).await > 0 {}
        std::mem::take(buf)
    };
    (status, head, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_asks_to_close_is_answered_and_closed_while_the_backend_connection_stays() {
    let (proxy, port, _) = start().await;
    let mut seen = std::collections::BTreeSet::new();
    let options = ["close", "keep-alive, Close"];
    for (i, option) in options.iter().cycle().take(8).enumerate() {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let req =
            format!("GET /raw/tell HTTP/1.1\r\nHost: a.example\r\nConnection: {option}\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let (status, head, body) = response(&mut s, &mut buf, false).await;
        assert_eq!(status, 200);
        let head = head.to_ascii_lowercase();
        assert!(head.contains("\r\nconnection: close"), "{head}");
        // Pingora writes a Date into every answer; the fast path passes the backend's head on,
        // and this backend sends none.
        assert!(!head.contains("\r\ndate:"), "served by Pingora: {head}");
        // The proxy closes first (RFC 9112 section 9.6): the next read is the end.
        assert_eq!(
            read_more(&mut s, &mut buf).await,
            0,
            "request {i}: still open"
        );
        let told = String::from_utf8(body).unwrap();
        // The option was about the client's hop: it is not forwarded.
        assert!(!told.to_ascii_lowercase().contains("connection:"), "{told}");
        seen.insert(told.lines().next().unwrap().to_owned());
    }
    // Backend connections stay in their worker's pool in between: at most one per worker
    // (the test proxy has two) for eight client connections.
    assert!(seen.len() <= 2, "{seen:?}");

    // A Connection that names a field is Pingora's, and the named field stays on the client's
    // hop (RFC 9110 section 7.6.1).
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(b"GET /raw/tell HTTP/1.1\r\nHost: a.example\r\nConnection: close, X-Private\r\nX-Private: 1\r\nX-Public: 2\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let (status, head, body) = response(&mut s, &mut buf, false).await;
    assert_eq!(status, 200, "{head} {}", String::from_utf8_lossy(&body));
    assert!(head.to_ascii_lowercase().contains("\r\ndate:"), "{head}");
    let told = String::from_utf8(body).unwrap().to_ascii_lowercase();
    assert!(!told.contains("x-private"), "{told}");
    assert!(!told.contains("connection:"), "{told}");
    assert!(told.contains("\r\nx-public: 2\r\n"), "{told}");
    assert!(told.contains("\r\nhost: a.example\r\n"), "{told}");

    // Naming Host (or a forwarded field) would strip what routing and the backend rely on:
    // refused, whichever engine the route would take.
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(b"GET /raw/tell HTTP/1.1\r\nHost: a.example\r\nConnection: Host\r\n\r\n")
        .await
        .unwrap();
    let (status, _, _) = response(&mut s, &mut buf, false).await;
    assert_eq!(status, 400);
    proxy.stop().await;
}

async fn start() -> (Proxy, u16, SocketAddr) {
    let echo = echo_backend("echo").await;
    let raw = raw_backend().await;
    let port = free_port();
    let snap = snapshot(
        ROUTES,
        &[
            ("PORT", port.to_string()),
            ("ECHO", echo.port().to_string()),
            ("RAW", raw.port().to_string()),
            ("GONE", free_port().to_string()),
        ],
    );
    (Proxy::start(&snap).await, port, raw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_moves_from_the_fast_path_to_pingora_without_losing_a_request() {
    let (proxy, port, _) = start().await;
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut buf = Vec::new();

    // Two plain requests in one write (pipelined), both on the fast path.
    s.write_all(b"GET /echo/1 HTTP/1.1\r\nHost: a.example\r\nX-Keep: Case\r\n\r\nGET /echo/2 HTTP/1.1\r\nHost: a.example\r\n\r\n")
        .await
        .unwrap();
    for n in ["1", "2"] {
        let (status, _, body) = response(&mut s, &mut buf, false).await;
        assert_eq!(status, 200);
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["path"], format!("/echo/{n}"));
        assert_eq!(json["headers"]["host"], "a.example");
        if n == "1" {
            assert_eq!(json["headers"]["x-keep"], "Case");
        }
    }

    // A request with a chunked body is Pingora's: same connection, nothing lost.
    s.write_all(b"POST /echo/3 HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        .await
        .unwrap();
    let (status, _, body) = response(&mut s, &mut buf, false).await;
    assert_eq!(status, 200);
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["method"], "POST");
    assert_eq!(json["path"], "/echo/3");

    // Pingora keeps the connection from then on.
    s.write_all(b"GET /echo/4 HTTP/1.1\r\nHost: a.example\r\n\r\n")
        .await
        .unwrap();
    let (status, _, body) = response(&mut s, &mut buf, false).await;
    assert_eq!(status, 200);
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["path"], "/echo/4");

    // A request no route takes: Pingora's 404, whatever path the connection was on.
    let mut fresh = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    fresh
        .write_all(b"GET /nothing HTTP/1.1\r\nHost: a.example\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    assert_eq!(response(&mut fresh, &mut buf, false).await.0, 404);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_framing_passes_through_intact() {
    let (proxy, port, _) = start().await;
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut buf = Vec::new();
    let ask = async |s: &mut TcpStream, buf: &mut Vec<u8>, req: &str, head_only| {
        s.write_all(req.as_bytes()).await.unwrap();
        response(s, buf, head_only).await
    };

    let (status, head, body) = ask(
        &mut s,
        &mut buf,
        "GET /raw/chunked HTTP/1.1\r\nHost: x\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
    );
    assert_eq!(
        body, b"5\r\nhello\r\n6;x=1\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n",
        "chunks and trailer verbatim"
    );

    // An interim response reaches the client before the final one.
    let (status, head, _) = ask(
        &mut s,
        &mut buf,
        "GET /raw/interim HTTP/1.1\r\nHost: x\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(status, 103);
    assert!(head.contains("Link: </style.css>"));
    let (status, _, body) = response(&mut s, &mut buf, false).await;
    assert_eq!((status, body.as_slice()), (200, &b"final"[..]));

    // HEAD: a length but no body; the connection stays in step.
    let (status, head, _) = ask(
        &mut s,
        &mut buf,
        "HEAD /raw/head HTTP/1.1\r\nHost: x\r\n\r\n",
        true,
    )
    .await;
    assert_eq!(status, 200);
    assert!(head.contains("Content-Length: 5"));
    let (status, head, body) = ask(
        &mut s,
        &mut buf,
        "GET /raw/plain HTTP/1.1\r\nHost: x\r\n\r\n",
        false,
    )
    .await;
    assert_eq!((status, body.as_slice()), (200, &b"ok"[..]));
    assert!(
        head.contains("X-Raw: yes"),
        "backend headers verbatim: {head}"
    );

    // No length: the body runs to the backend's close, and the client connection closes too.
    let (status, _, body) = ask(
        &mut s,
        &mut buf,
        "GET /raw/until-close HTTP/1.1\r\nHost: x\r\n\r\n",
        false,
    )
    .await;
    assert_eq!((status, body.as_slice()), (200, &b"until the end"[..]));
    let mut probe = [0u8; 1];
    let closed = tokio::time::timeout(Duration::from_secs(5), s.read(&mut probe))
        .await
        .unwrap();
    assert!(
        matches!(closed, Ok(0)),
        "client connection closed after a close-delimited body"
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_connections_closed_while_pooled_are_replaced_and_dead_backends_get_502() {
    let (proxy, port, _) = start().await;
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut buf = Vec::new();
    // The backend closes each connection after answering, without a Connection: close.
    // Each pooled connection is dead by the next request, found so, and replaced.
    for i in 0..30 {
        s.write_all(b"GET /raw/close-after HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let (status, _, body) = response(&mut s, &mut buf, false).await;
        assert_eq!((status, body.as_slice()), (200, &b"ok"[..]), "request {i}");
        if i % 3 == 0 {
            // Sometimes the close has been seen before the next request, sometimes not.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Nothing listens behind /gone.
    s.write_all(b"GET /gone HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (status, _, _) = response(&mut s, &mut buf, false).await;
    assert_eq!(status, 502);

    // The requests are counted per route.
    let metrics = get(&format!("http://{}/metrics", proxy.admin), &[])
        .await
        .unwrap();
    assert!(
        metrics.body.contains(
            r#"coxswain_proxy_requests_total{route="HTTPRoute/t/raw",rule="0",code="2xx"} 30"#
        ),
        "{}",
        metrics.body
    );
    assert!(metrics.body.contains(
        r#"coxswain_proxy_requests_total{route="HTTPRoute/t/gone",rule="0",code="5xx"} 1"#
    ));
    proxy.stop().await;
}

/// An HTTP/2 client (prior knowledge) on the proxy's port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_streams_take_the_fast_path_and_get_every_framing_as_frames() {
    let (proxy, port, _) = start().await;
    let mut h2 = h2c(port).await;
    let get = async |h2: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>,
                     method: &str,
                     path: &str,
                     body: Vec<u8>| {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://x{path}"));
        if !body.is_empty() {
            req = req.header("content-length", body.len());
        }
        let resp = h2
            .send_request(req.body(Full::new(Bytes::from(body))).unwrap())
            .await
            .unwrap();
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.map(|b| b.to_bytes().to_vec());
        (parts.status.as_u16(), parts.headers, body)
    };

    // Chunked: the chunks' data as the body, no framing fields, the trailer dropped.
    let (status, headers, body) = get(&mut h2, "GET", "/raw/chunked", Vec::new()).await;
    assert_eq!(status, 200);
    assert_eq!(body.unwrap(), b"hello world");
    assert!(headers.get("transfer-encoding").is_none());
    // An interim answer is not passed on (HTTP/2 has one response head per stream here, as on
    // Pingora); the final one is.
    let (status, _, body) = get(&mut h2, "GET", "/raw/interim", Vec::new()).await;
    assert_eq!((status, body.unwrap().as_slice()), (200, &b"final"[..]));
    // HEAD: the length, no body.
    let (status, headers, body) = get(&mut h2, "HEAD", "/raw/head", Vec::new()).await;
    assert_eq!(status, 200);
    assert_eq!(headers.get("content-length").unwrap(), "5");
    assert!(body.unwrap().is_empty());
    let (status, headers, body) = get(&mut h2, "GET", "/raw/plain", Vec::new()).await;
    assert_eq!((status, body.unwrap().as_slice()), (200, &b"ok"[..]));
    assert_eq!(headers.get("x-raw").unwrap(), "yes");
    // A body that ends when the backend closes has ended: the stream finishes normally.
    let (status, _, body) = get(&mut h2, "GET", "/raw/until-close", Vec::new()).await;
    assert_eq!(
        (status, body.unwrap().as_slice()),
        (200, &b"until the end"[..])
    );
    // A body cut short of its length: the stream is reset (before or after the client read
    // the head), never finished as if whole.
    let req = Request::get("http://x/raw/truncated")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let outcome = match h2.send_request(req).await {
        Ok(resp) => resp.into_body().collect().await.map(|b| b.to_bytes()),
        Err(e) => Err(e),
    };
    assert!(outcome.is_err(), "a truncated body must fail: {outcome:?}");
    // A 64 KiB body (past HTTP/2's initial flow-control window) arrives whole.
    let sent: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    let sum: u64 = sent.iter().map(|b| u64::from(*b)).sum();
    let (status, _, body) = get(&mut h2, "POST", "/raw/count", sent).await;
    assert_eq!(status, 200);
    assert_eq!(
        String::from_utf8(body.unwrap()).unwrap(),
        format!("65536 bytes, sum {sum}")
    );
    // Streams of one connection run at once: 50 in flight on one connection.
    let mut all = Vec::new();
    for _ in 0..50 {
        let mut h2 = h2.clone();
        all.push(tokio::spawn(async move {
            let req = Request::get("http://x/raw/plain")
                .body(Full::new(Bytes::new()))
                .unwrap();
            let resp = h2.send_request(req).await.unwrap();
            resp.into_body().collect().await.unwrap().to_bytes()
        }));
    }
    for one in all {
        assert_eq!(one.await.unwrap().as_ref(), b"ok");
    }
    // Every one of them was forwarded by the fast path, none by Pingora.
    assert_eq!(
        proxy
            .metric("coxswain_proxy_http2_streams_fast_path_total")
            .await,
        57
    );
    assert_eq!(
        proxy
            .metric("coxswain_proxy_http2_streams_pingora_total")
            .await,
        0
    );
    // A stream the fast path does not take (no route here) is Pingora's, on the same
    // connection.
    let (status, _, _) = get(&mut h2, "GET", "/nothing-routes-this", Vec::new()).await;
    assert_eq!(status, 404);
    assert_eq!(
        proxy
            .metric("coxswain_proxy_http2_streams_pingora_total")
            .await,
        1
    );
    let (status, _, body) = get(&mut h2, "GET", "/raw/plain", Vec::new()).await;
    assert_eq!((status, body.unwrap().as_slice()), (200, &b"ok"[..]));
    proxy.stop().await;
}

/// The frames of stream 1 on a raw HTTP/2 connection (prior knowledge) after a GET of `path`,
/// up to the one that ends the stream: (type, flags, payload).
async fn h2_frames_of_one_get(port: u16, path: &str) -> Vec<(u8, u8, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    // HPACK by hand: :method GET, :scheme http (static entries), :path and :authority as
    // literals with a static name.
    let mut block = vec![0x82, 0x86, 0x04, path.len() as u8];
    block.extend_from_slice(path.as_bytes());
    block.extend_from_slice(&[0x01, 1, b'x']);
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // SETTINGS, empty
    out.extend_from_slice(&[0, 0, block.len() as u8, 1, 0x5, 0, 0, 0, 1]); // HEADERS, END_STREAM|END_HEADERS
    out.extend_from_slice(&block);
    s.write_all(&out).await.unwrap();
    let mut frames = Vec::new();
    loop {
        let mut header = [0u8; 9];
        tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut header))
            .await
            .expect("the stream did not end")
            .unwrap();
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let (kind, flags) = (header[3], header[4]);
        let id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; length];
        s.read_exact(&mut payload).await.unwrap();
        if id != 1 {
            continue;
        }
        frames.push((kind, flags, payload));
        // RST_STREAM, or END_STREAM on HEADERS or DATA.
        if kind == 3 || ((kind == 0 || kind == 1) && flags & 0x1 != 0) {
            return frames;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_answer_ends_on_its_last_data_frame() {
    let (proxy, port, _) = start().await;
    // A Content-Length body: HEADERS, then one DATA frame that ends the stream, no empty
    // DATA frame after it.
    let frames = h2_frames_of_one_get(port, "/raw/plain").await;
    let kinds: Vec<(u8, u8)> = frames.iter().map(|(k, f, _)| (*k, *f & 0x1)).collect();
    assert_eq!(kinds, [(1, 0), (0, 1)], "{frames:?}");
    assert_eq!(frames[1].2, b"ok");
    // Chunked: the chunks' data in order, and the stream ends on a DATA frame.
    let frames = h2_frames_of_one_get(port, "/raw/chunked").await;
    assert_eq!(frames[0].0, 1, "{frames:?}");
    let body: Vec<u8> = frames[1..].iter().flat_map(|(_, _, p)| p.clone()).collect();
    assert_eq!(body, b"hello world");
    assert!(frames[1..].iter().all(|(k, _, _)| *k == 0), "{frames:?}");
    proxy.stop().await;
}
