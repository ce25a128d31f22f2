//! The proxy's own HTTP/2 server (`fastpath::h2`) with a real client: streams served by the
//! fast path and streams relayed to Pingora over the bridge, on one connection at once,
//! bodies larger than every flow-control window on the way (client to proxy, proxy to
//! Pingora, Pingora back, proxy to client), and a connection ended gracefully when the
//! proxy stops.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::time::Duration;
use support::http2::{h2c, preface};
use support::*;
use tokio::net::{TcpListener, TcpStream};

const ROUTES: &str = r#"
listeners:
- port: {PORT}
  protocol: PROTOCOL_HTTP
  virtualHosts:
  - hostname: ""
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: mirror, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /mirror}}
      backends: [{cluster: "t/mirror:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: bridged, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /bridged}}
      # A retry policy (for a status no backend here sends): not a passthrough route, so its
      # streams cross the bridge.
      retry: {codes: [599], attempts: 1}
      backends: [{cluster: "t/mirror:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: silent, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /silent}}
      backends: [{cluster: "t/silent:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: echo, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /echo}}
      backends: [{cluster: "t/echo:80", weight: 1}]
clusters:
- name: t/silent:80
  endpoints: [{address: 127.0.0.1, port: {SILENT}, ready: true, serving: true}]
- name: t/echo:80
  endpoints: [{address: 127.0.0.1, port: {ECHO}, ready: true, serving: true}]
- name: t/mirror:80
  endpoints: [{address: 127.0.0.1, port: {MIRROR}, ready: true, serving: true}]
"#;

/// A bound no correct exchange comes near: a stall fails the test instead of hanging it.
const BOUND: Duration = Duration::from_secs(60);

/// An HTTP/1.1 backend that answers every request with its own body, streamed back as it
/// arrives, and `x-path`.
async fn mirror_backend() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let path = req.uri().path().to_owned();
                    let mut resp = Response::new(req.into_body());
                    resp.headers_mut().insert("x-path", path.parse().unwrap());
                    Ok::<_, hyper::Error>(resp)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    port
}

async fn start() -> (Proxy, u16) {
    start_with(coxswain_proxy::limits::Limits::default()).await
}

async fn start_with(limits: coxswain_proxy::limits::Limits) -> (Proxy, u16) {
    start_with_silent(limits, free_port()).await
}

async fn start_with_silent(limits: coxswain_proxy::limits::Limits, silent: u16) -> (Proxy, u16) {
    let mirror = mirror_backend().await;
    let echo = echo_backend("echo").await;
    let port = free_port();
    let snap = snapshot(
        ROUTES,
        &[
            ("PORT", port.to_string()),
            ("MIRROR", mirror.to_string()),
            ("ECHO", echo.port().to_string()),
            ("SILENT", silent.to_string()),
        ],
    );
    (Proxy::start_with(&snap, limits).await, port)
}

/// A backend that reads a request head and never answers. It says when a request arrived
/// and when the proxy closed that connection.
async fn silent_backend() -> (u16, tokio::sync::mpsc::UnboundedReceiver<&'static str>) {
    use tokio::io::AsyncReadExt;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                continue;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut chunk = [0u8; 4096];
                let mut told = false;
                loop {
                    match tcp.read(&mut chunk).await {
                        Ok(0) | Err(_) => {
                            let _ = tx.send("closed");
                            return;
                        }
                        Ok(n) => got.extend_from_slice(&chunk[..n]),
                    }
                    if !told && got.windows(4).any(|w| w == b"\r\n\r\n") {
                        told = true;
                        let _ = tx.send("request");
                    }
                }
            });
        }
    });
    (port, rx)
}

/// A POST of `body` to `path`, and what came back: status, `x-path`, body.
async fn post(
    mut h2: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    path: String,
    body: Vec<u8>,
) -> (u16, String, Vec<u8>) {
    let req = Request::post(format!("http://a.example{path}"))
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = h2.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let at = match resp.headers().get("x-path") {
        Some(at) => at.to_str().unwrap().to_owned(),
        None => format!("no x-path: {:?}", resp.headers()),
    };
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, at, body)
}

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| ((i + seed) % 251) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_past_every_window_crosses_both_engines_both_ways_whole() {
    let (proxy, port) = start().await;
    // 3 MiB: past the fast path's read-whole bound (so it streams), past our stream window
    // of 1 MiB, the bridge's, and the client's 64 KiB default the answer must respect. The
    // mirror answers while it reads. To a passthrough route (the fast path), then to one
    // that is not (Pingora, over the bridge).
    for (path, engine) in [("/mirror/big", "fast_path"), ("/bridged/big", "pingora")] {
        tokio::time::timeout(BOUND, async {
            let h2 = h2c(port).await;
            let sent = pattern(3 << 20, 7);
            let (status, at, body) = post(h2, path.into(), sent.clone()).await;
            assert_eq!((status, at.as_str()), (200, path));
            assert_eq!(body.len(), sent.len());
            assert!(body == sent, "{path}: the body came back altered");
        })
        .await
        .expect("finished within the bound");
        let served = proxy
            .metric(&format!("coxswain_proxy_http2_streams_{engine}_total"))
            .await;
        assert_eq!(served, 1, "{path}");
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_of_both_engines_run_at_once_on_one_connection() {
    let (proxy, port) = start().await;
    tokio::time::timeout(BOUND, async {
        let h2 = h2c(port).await;
        let mut all = Vec::new();
        for i in 0..40 {
            // Even: forwarded by the fast path, 1 KiB or 200 KiB (streamed past its
            // read-whole bound). Odd: 200 KiB, to a route that is not passthrough, relayed
            // to Pingora.
            let len = if i % 4 == 0 { 1 << 10 } else { 200 << 10 };
            let sent = pattern(len, i);
            let path = if i % 2 == 0 {
                format!("/mirror/{i}")
            } else {
                format!("/bridged/{i}")
            };
            let h2 = h2.clone();
            all.push(tokio::spawn(async move {
                let (status, at, body) = post(h2, path.clone(), sent.clone()).await;
                assert_eq!((status, at), (200, path));
                assert!(body == sent, "stream {i}'s body came back altered");
            }));
        }
        for one in all {
            one.await.unwrap();
        }
    })
    .await
    .expect("finished within the bound");
    let fast = proxy
        .metric("coxswain_proxy_http2_streams_fast_path_total")
        .await;
    let pingora = proxy
        .metric("coxswain_proxy_http2_streams_pingora_total")
        .await;
    assert_eq!((fast, pingora), (20, 20));
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_announcing_a_body_it_does_not_send_is_refused_alone() {
    let (proxy, port) = start().await;
    let mut h2 = h2c(port).await;
    // Content-Length 5 on a stream that ends with its head (RFC 9113 section 8.1.1).
    let req = Request::post("http://a.example/mirror/short")
        .header("content-length", "5")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let refused = h2.send_request(req).await;
    assert!(refused.is_err(), "a malformed request was answered");
    // The connection goes on.
    let (status, _, body) = post(h2, "/mirror/after".into(), b"next".to_vec()).await;
    assert_eq!((status, body.as_slice()), (200, &b"next"[..]));
    assert_eq!(
        proxy.metric("coxswain_proxy_requests_refused_total").await,
        1
    );
    proxy.stop().await;
}

/// Reads frames until one of `kind` on `stream`: (flags, payload) of it. Frames before it
/// are collected into `seen` as (type, stream, flags, payload).
async fn frame_until(
    s: &mut TcpStream,
    kind: u8,
    stream: u32,
    seen: &mut Vec<(u8, u32, u8, Vec<u8>)>,
) -> (u8, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    loop {
        let mut header = [0u8; 9];
        tokio::time::timeout(BOUND, s.read_exact(&mut header))
            .await
            .expect("the frame came within the bound")
            .unwrap();
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; length];
        s.read_exact(&mut payload).await.unwrap();
        if header[3] == kind && id == stream {
            return (header[4], payload);
        }
        seen.push((header[3], id, header[4], payload));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_proxy_says_goaway_and_finishes_the_stream_in_progress() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (proxy, port) = start().await;
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    // HPACK by hand: :method POST, :scheme http (static entries), :path and :authority as
    // literals with a static name, content-length 4 (static name 28).
    let path = b"/mirror/drain";
    let mut block = vec![0x83, 0x86, 0x04, path.len() as u8];
    block.extend_from_slice(path);
    block.extend_from_slice(&[0x01, 1, b'x', 0x0f, 0x0d, 1, b'4']);
    let mut out = preface(); // SETTINGS, empty
    // HEADERS, END_HEADERS only: the body is still to come.
    out.extend_from_slice(&[0, 0, block.len() as u8, 1, 0x4, 0, 0, 0, 1]);
    out.extend_from_slice(&block);
    s.write_all(&out).await.unwrap();
    // The proxy has taken the stream once it acknowledges our SETTINGS, sent after it.
    let mut seen = Vec::new();
    while frame_until(&mut s, 4, 0, &mut seen).await.0 & 0x1 == 0 {}

    let stopping = tokio::spawn(proxy.stop());
    let (_, goaway) = frame_until(&mut s, 7, 0, &mut seen).await;
    let last = u32::from_be_bytes([goaway[0], goaway[1], goaway[2], goaway[3]]) & 0x7fff_ffff;
    assert_eq!(last, 1, "the GOAWAY must promise the stream in progress");

    // The body, then the whole answer on the stream the GOAWAY kept.
    s.write_all(&[0, 0, 4, 0, 0x1, 0, 0, 0, 1]).await.unwrap();
    s.write_all(b"body").await.unwrap();
    let (flags, _) = frame_until(&mut s, 1, 1, &mut seen).await;
    let mut body = Vec::new();
    if flags & 0x1 == 0 {
        loop {
            let (flags, payload) = frame_until(&mut s, 0, 1, &mut seen).await;
            body.extend_from_slice(&payload);
            if flags & 0x1 != 0 {
                break;
            }
        }
    }
    assert_eq!(body, b"body");
    // Then the proxy closes the connection.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(BOUND, s.read_to_end(&mut rest)).await;
    assert!(matches!(closed, Ok(Ok(_))), "the connection was not closed");
    stopping.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookie_crumbs_reach_an_http1_backend_as_one_field_on_both_engines() {
    for fast_path in [true, false] {
        let (proxy, port) = start_with(coxswain_proxy::limits::Limits {
            fast_path,
            ..Default::default()
        })
        .await;
        let mut h2 = h2c(port).await;
        // Two Cookie fields on the wire, as HTTP/2 clients may split them (RFC 9113 8.2.3).
        let req = Request::get("http://a.example/echo/cookies")
            .header("cookie", "a=1")
            .header("x-between", "yes")
            .header("cookie", "b=2")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = h2.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let seen: serde_json::Value = serde_json::from_slice(&body).unwrap();
        // The echo backend joins repeated fields with ", ": one field shows as it was sent.
        assert_eq!(
            seen["headers"]["cookie"], "a=1; b=2",
            "fast path {fast_path}: {seen}"
        );
        let engine = if fast_path { "fast_path" } else { "pingora" };
        assert_eq!(
            proxy
                .metric(&format!("coxswain_proxy_http2_streams_{engine}_total"))
                .await,
            1
        );
        proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_client_resets_stops_its_backend_request_on_both_engines() {
    for fast_path in [true, false] {
        let (silent, mut seen) = silent_backend().await;
        let limits = coxswain_proxy::limits::Limits {
            fast_path,
            ..Default::default()
        };
        let (proxy, port) = start_with_silent(limits, silent).await;
        let h2 = h2c(port).await;
        // A second handle keeps the connection open: only the stream is reset.
        let mut stream_h2 = h2.clone();
        let req = Request::get("http://a.example/silent/wait")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let pending = tokio::spawn(async move { stream_h2.send_request(req).await });
        assert_eq!(seen.recv().await, Some("request"));
        // Dropping the client's side of the stream resets it (RST_STREAM CANCEL).
        pending.abort();
        // The backend's connection closes long before the upstream timeout (60 s), which is
        // all that would end it otherwise.
        let closed = tokio::time::timeout(Duration::from_secs(10), seen.recv()).await;
        assert_eq!(
            closed,
            Ok(Some("closed")),
            "fast path {fast_path}: the backend request outlived the stream"
        );
        drop(h2);
        proxy.stop().await;
    }
}

/// The preface, then `count` streams whose heads are malformed: GET /, :authority x, then a
/// field named "X" (capitals are malformed, RFC 9113 section 8.2.1).
fn malformed_streams(count: u32) -> Vec<u8> {
    let block = [0x82, 0x86, 0x84, 0x01, 1, b'x', 0x00, 1, b'X', 1, b'y'];
    let mut out = preface();
    for i in 0..count {
        let id = (2 * i + 1).to_be_bytes();
        out.extend_from_slice(&[0, 0, block.len() as u8, 1, 0x5, id[0], id[1], id[2], id[3]]);
        out.extend_from_slice(&block);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_of_malformed_streams_ends_with_a_goaway() {
    use tokio::io::AsyncWriteExt;
    let (proxy, port) = start().await;
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(&malformed_streams(33)).await.unwrap();
    let mut seen = Vec::new();
    let (_, goaway) = frame_until(&mut s, 7, 0, &mut seen).await;
    let code = u32::from_be_bytes([goaway[4], goaway[5], goaway[6], goaway[7]]);
    assert_eq!(code, 1, "PROTOCOL_ERROR");
    let resets = seen.iter().filter(|(kind, ..)| *kind == 3).count();
    assert_eq!(
        resets, 33,
        "each malformed stream is reset, the 33rd past the bound too"
    );
    assert_eq!(
        proxy.metric("coxswain_proxy_requests_refused_total").await,
        33
    );
    proxy.stop().await;
}

/// A client still sending when the proxy ends its connection reads the GOAWAY: the proxy
/// reads and drops what follows until the client stops. Closing with bytes unread makes
/// the kernel reset the connection, and the client's writes fail before it reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_still_sending_after_the_goaway_reads_it() {
    use tokio::io::AsyncWriteExt;
    let (proxy, port) = start().await;
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(&malformed_streams(33)).await.unwrap();
    // Then 8 MiB of frames of an unknown type (which a connection skips): more than the
    // socket buffers take (about 4 MiB here) before the proxy has closed.
    let mut unknown = vec![0, 0x40, 0, 0xfa, 0, 0, 0, 0, 0];
    unknown.resize(9 + 0x4000, 0);
    for i in 0..512 {
        if let Err(e) = s.write_all(&unknown).await {
            panic!("write {i} failed: {e}");
        }
    }
    let mut seen = Vec::new();
    let (_, goaway) = frame_until(&mut s, 7, 0, &mut seen).await;
    let code = u32::from_be_bytes([goaway[4], goaway[5], goaway[6], goaway[7]]);
    assert_eq!(code, 1, "PROTOCOL_ERROR");
    proxy.stop().await;
}

/// The receive windows a new connection announces: SETTINGS_INITIAL_WINDOW_SIZE and the
/// connection's WINDOW_UPDATE.
async fn announced_windows(port: u16) -> (u32, u32) {
    use tokio::io::AsyncWriteExt;
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let out = preface();
    s.write_all(&out).await.unwrap();
    let mut seen = Vec::new();
    let (_, update) = frame_until(&mut s, 8, 0, &mut seen).await;
    let (_, _, _, settings) = seen
        .iter()
        .find(|(kind, id, flags, _)| *kind == 4 && *id == 0 && flags & 0x1 == 0)
        .expect("the proxy's SETTINGS come before its WINDOW_UPDATE");
    let stream = settings
        .chunks(6)
        .find(|p| p[..2] == [0, 4])
        .map(|p| u32::from_be_bytes([p[2], p[3], p[4], p[5]]))
        .expect("SETTINGS_INITIAL_WINDOW_SIZE is announced");
    let connection = 65_535 + u32::from_be_bytes([update[0], update[1], update[2], update[3]]);
    (stream, connection)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_announces_the_receive_windows_its_limits_set() {
    let defaults = coxswain_proxy::limits::Limits::default();
    let (proxy, port) = start().await;
    assert_eq!(
        announced_windows(port).await,
        (
            defaults.http2_stream_window,
            defaults.http2_connection_window
        )
    );
    assert_eq!(announced_windows(port).await, (256 << 10, 1 << 20));
    proxy.stop().await;

    let (proxy, port) = start_with(coxswain_proxy::limits::Limits {
        http2_stream_window: 100_000,
        http2_connection_window: 3_000_000,
        ..coxswain_proxy::limits::Limits::default()
    })
    .await;
    assert_eq!(announced_windows(port).await, (100_000, 3_000_000));
    proxy.stop().await;
}

/// Uploads on one connection, together many times its receive window, streamed by the fast
/// path and then relayed to Pingora. Pingora's connection window is shared too: a stream
/// that held a share of it while its client could not send (our window full of other
/// streams' octets, which waited for that share) stopped them all, and 20 uploads of 200 KiB
/// hung at a 1 MiB window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_past_the_connection_window_all_finish_on_both_engines() {
    for (prefix, engine) in [("/mirror", "fast_path"), ("/bridged", "pingora")] {
        uploads_past_the_connection_window(prefix, engine).await;
    }
}

async fn uploads_past_the_connection_window(prefix: &str, engine: &str) {
    let (proxy, port) = start().await;
    let window = coxswain_proxy::limits::Limits::default().http2_connection_window as usize;
    tokio::time::timeout(BOUND, async {
        let h2 = h2c(port).await;
        let mut all = Vec::new();
        for i in 0..40 {
            let sent = pattern(window / 4 + 1000 * i, i);
            let path = format!("{prefix}/up-{i}");
            let h2 = h2.clone();
            all.push(tokio::spawn(async move {
                let (status, at, body) = post(h2, path.clone(), sent.clone()).await;
                assert_eq!((status, at), (200, path));
                assert!(body == sent, "stream {i}'s body came back altered");
            }));
        }
        for one in all {
            one.await.unwrap();
        }
    })
    .await
    .expect("every upload finished within the bound");
    assert_eq!(
        proxy
            .metric(&format!("coxswain_proxy_http2_streams_{engine}_total"))
            .await,
        40,
        "{prefix}"
    );
    proxy.stop().await;
}
