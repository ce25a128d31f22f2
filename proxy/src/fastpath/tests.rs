use super::backend::write_both;
use super::read::head_end;
use super::*;
use std::time::Duration;
use tokio::io::AsyncReadExt;

#[test]
fn head_end_finds_the_empty_line() {
    assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nrest"), Some(27));
    assert_eq!(head_end(b"GET / HTTP/1.1\nHost: a\n\nrest"), Some(24));
    assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n"), None);
    assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\n"), Some(18));
}

#[test]
fn header_values_are_text_only_when_visible_ascii() {
    assert_eq!(visible(b"a b\tc"), Some("a b\tc"));
    assert_eq!(visible(b"caf\xc3\xa9"), None);
    assert_eq!(visible(b"a\x01"), None);
}

/// A connection to a backend whose sending side has a 4 KiB buffer, and the backend's end.
async fn small_sender() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_send_buffer_size(4096).unwrap();
    let up = socket
        .connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (peer, _) = listener.accept().await.unwrap();
    (up, peer)
}

/// A head and body larger than the socket's send buffer leave in several writes; every byte
/// arrives once, in order.
#[tokio::test]
async fn head_and_body_survive_partial_writes() {
    let (mut up, mut peer) = small_sender().await;
    let head: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    let body: Vec<u8> = (0..300_000u32).map(|i| (i % 241) as u8).collect();
    let expected = [head.clone(), body.clone()].concat();
    let reader = tokio::spawn(async move {
        let mut got = Vec::new();
        peer.read_to_end(&mut got).await.unwrap();
        got
    });
    let within = Duration::from_secs(30);
    write_both(&mut up, &head, &body, within).await.unwrap();
    write_both(&mut up, b"tail", b"", within).await.unwrap();
    drop(up);
    let got = reader.await.unwrap();
    assert_eq!(got.len(), expected.len() + 4);
    assert!(got.starts_with(&expected) && got.ends_with(b"tail"));
}

/// A backend that takes none of a request holds its write no longer than the limit.
#[tokio::test]
async fn a_request_the_backend_does_not_take_times_out() {
    // Accepted and never read.
    let (mut up, _peer) = small_sender().await;
    let body = vec![b'x'; 8 * 1024 * 1024];
    let err = write_both(
        &mut up,
        b"POST / HTTP/1.1\r\n\r\n",
        &body,
        Duration::from_millis(200),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
}

/// Every keep-alive connection holds this future for its whole life, idle or not: a buffer
/// or timer that a rarely taken path keeps inline in it costs every connection. A 4 KiB
/// read buffer of `conn::linger` once was, and made each idle connection larger.
#[tokio::test]
async fn a_connections_future_stays_small() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (tcp, peer) = listener.accept().await.unwrap();
    let mut conn = Buffered::new(tcp, peer);
    let table = SharedTable::default();
    let limits = Limits::default();
    let (_stop, mut closing) = watch::channel(false);
    let (_end, shutdown) = watch::channel(false);
    let mut env = Env {
        table: &table,
        limits: &limits,
        port: 80,
        public_port: 80,
        peer,
        https: false,
        sni: None,
        client_cert_refused: false,
        closing: &mut closing,
        shutdown: &shutdown,
    };
    let serving = serve(&mut conn, &mut env, true);
    let size = std::mem::size_of_val(&serving);
    // 640 bytes in a debug build when this was written; 4,392 with linger's buffer inline.
    assert!(size < 1024, "the connection's future is {size} bytes");
    drop(serving);
    drop(client);
}

/// Stands in for Pingora's app: the HTTP/2 connection's future is measured, never polled.
struct NoApp;

#[async_trait::async_trait]
impl pingora::apps::HttpServerApp for NoApp {
    async fn process_new_http(
        self: &std::sync::Arc<Self>,
        _session: pingora::protocols::http::ServerSession,
        _shutdown: &pingora::server::ShutdownWatch,
    ) -> Option<pingora::apps::ReusedHttpStream> {
        None
    }
}

#[tokio::test]
async fn an_http2_connections_future_stays_small() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (tcp, peer) = listener.accept().await.unwrap();
    let io: pingora::protocols::Stream = Box::new(Buffered::new(tcp, peer));
    let table = SharedTable::default();
    let limits = Limits::default();
    let (_stop, mut closing) = watch::channel(false);
    let (_end, shutdown) = watch::channel(false);
    let env = Env {
        table: &table,
        limits: &limits,
        port: 443,
        public_port: 443,
        peer,
        https: true,
        sni: None,
        client_cert_refused: false,
        closing: &mut closing,
        shutdown: &shutdown,
    };
    let app = std::sync::Arc::new(NoApp);
    let serving = h2::serve(io, &env, &app);
    let size = std::mem::size_of_val(&serving);
    // Every connection holds this future for its whole life, idle or not: rare paths (the
    // lingering close, the bridge) belong behind a Box. 1,424 bytes in a debug build when
    // this was written; 5,528 with the lingering close inline.
    assert!(
        size < 2048,
        "the HTTP/2 connection's future is {size} bytes"
    );
    drop(serving);
    drop(client);
}

#[test]
fn bounds_follow_the_route_timeouts_and_else_the_proxy_limits() {
    use super::backend::Bounds;
    use coxswain_api::snapshot::Timeouts;
    let limits = Limits::default();
    let ms = Duration::from_millis;

    // No timeouts: the proxy's limits, and no deadline.
    let mut none = Bounds::new(None, &limits);
    assert!(!none.timed() && none.start_attempt() && !none.past());
    assert_eq!(none.read(), limits.upstream_timeout);
    assert_eq!(none.write(), limits.upstream_timeout);
    assert_eq!(none.connect(), limits.upstream_connect);

    // Ingress timeouts bound each connect, read and write, and nothing else.
    let ingress = Timeouts {
        connect_ms: 700,
        read_ms: 300,
        send_ms: 400,
        ..Default::default()
    };
    let mut each = Bounds::new(Some(ingress), &limits);
    assert!(!each.timed() && each.start_attempt());
    assert_eq!(
        (each.connect(), each.read(), each.write()),
        (ms(700), ms(300), ms(400))
    );

    // A backend request timeout is each attempt's budget, within the request timeout: the
    // waits shrink as the attempt goes on, and none lasts past the sooner end.
    let both = Timeouts {
        request_ms: 60_000,
        backend_request_ms: 300,
        read_ms: 10_000,
        ..Default::default()
    };
    let mut attempt = Bounds::new(Some(both), &limits);
    assert!(attempt.timed() && attempt.start_attempt() && !attempt.past());
    assert!(attempt.read() <= ms(300) && attempt.read() > ms(200));
    assert!(attempt.connect() <= ms(300));
    assert!(attempt.write() <= ms(300));

    // A request timeout that has run out: no attempt starts, and every wait is 0.
    let gone = Timeouts {
        request_ms: 1,
        ..Default::default()
    };
    let mut late = Bounds::new(Some(gone), &limits);
    std::thread::sleep(ms(5));
    assert!(late.past());
    assert!(!late.start_attempt());
    assert_eq!(late.read(), Duration::ZERO);
}
