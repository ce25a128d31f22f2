//! HTTP/2 server work per request, without sockets: the h2 crate (what Pingora and today's
//! fast path serve clients with) against `coxswain_proxy::http2`, fed the same client octets
//! and giving the same answers (`make bench`; a benchmark, not a test).
//!
//! The client bytes are h2load's shape of load: one connection, a preface, then GET heads on
//! 1,000 streams; each answer is `200`, `content-length: 3` and "ok\n". The h2 side runs on a
//! current-thread tokio runtime over an in-memory pipe, as it would on a socket, minus the
//! syscalls; ours is the state machine plus the request checks. Both include HPACK both ways,
//! framing and stream bookkeeping. The printed ratio is h2's time per request over ours.

use bytes::Bytes;
use coxswain_proxy::hpack::Encoder;
use coxswain_proxy::http2::conn::{Config, Connection, Event};
use coxswain_proxy::http2::{PREFACE, frame, request};
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const STREAMS: u32 = 1_000;

/// What a client sends: the preface, empty SETTINGS, then `STREAMS` GETs, in frames of 16 KiB
/// reads as a socket would hand them over.
fn client_bytes() -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    frame::write_settings(&mut out, &[]);
    let mut encoder = Encoder::new();
    let mut block = Vec::new();
    for i in 0..STREAMS {
        block.clear();
        for (n, v) in [
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/"),
            (":authority", "127.0.0.1:18443"),
            ("user-agent", "h2load nghttp2/1.64.0"),
        ] {
            encoder.field(n.as_bytes(), v.as_bytes(), &mut block);
        }
        let len = (block.len() as u32).to_be_bytes();
        out.extend_from_slice(&[len[1], len[2], len[3], 0x1, 0x5]);
        out.extend_from_slice(&(2 * i + 1).to_be_bytes());
        out.extend_from_slice(&block);
    }
    out
}

/// Serves `input` with our connection, read 16 KiB at a time into one buffer as the driver
/// will; returns the octets it wrote.
fn ours(input: &[u8]) -> usize {
    let mut conn = Connection::new(Config::default());
    let mut buf = Vec::with_capacity(32 << 10);
    let mut written = 0;
    for chunk in input.chunks(16 << 10) {
        buf.extend_from_slice(chunk);
        let mut at = 0;
        loop {
            let (used, event) = conn.poll(&buf[at..]).expect("valid");
            at += used;
            let stream = match event {
                Some(Event::Headers { stream, fields, .. }) => {
                    request::request(fields).expect("well formed");
                    stream
                }
                Some(_) => continue,
                None => break,
            };
            let length: (&[u8], &[u8]) = (b"content-length", b"3");
            conn.send_headers(stream, Some(200), [length], false)
                .expect("open");
            conn.send_data(stream, b"ok\n", true).expect("open");
        }
        // A frame cut by the chunk's end stays for the next chunk.
        buf.drain(..at);
        let out = conn.output();
        written += out.len();
        out.clear();
    }
    written
}

/// An in-memory socket: reads hand out `input` 16 KiB at a time, then nothing; writes are
/// taken and dropped.
struct Pipe {
    input: Vec<u8>,
    at: usize,
}

impl AsyncRead for Pipe {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = buf
            .remaining()
            .min(16 << 10)
            .min(self.input.len() - self.at);
        if n == 0 {
            // No EOF: h2 would drop the streams not yet accepted. The caller stops at the last.
            return Poll::Pending;
        }
        let at = self.at;
        buf.put_slice(&self.input[at..at + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Pipe {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Serves `input` with the h2 crate; returns the requests it answered.
async fn theirs(input: Vec<u8>) -> u32 {
    let pipe = Pipe { input, at: 0 };
    let mut conn = h2::server::handshake(pipe).await.expect("handshake");
    let mut answered = 0;
    while let Some(accepted) = conn.accept().await {
        let (_request, mut respond) = match accepted {
            Ok(stream) => stream,
            Err(e) => panic!("h2: {e}"),
        };
        let response = hyper::Response::builder()
            .status(200)
            .header("content-length", "3")
            .body(())
            .expect("response");
        let mut body = respond.send_response(response, false).expect("open");
        body.send_data(Bytes::from_static(b"ok\n"), true)
            .expect("open");
        answered += 1;
        if answered == STREAMS {
            break;
        }
    }
    // Once more, so that the last answers are encoded and written too.
    std::future::poll_fn(|cx| {
        let _ = conn.poll_closed(cx);
        Poll::Ready(())
    })
    .await;
    answered
}

fn bench(c: &mut Criterion) {
    let input = client_bytes();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    assert_eq!(runtime.block_on(theirs(input.clone())), STREAMS);
    assert!(ours(&input) > STREAMS as usize * 20, "every answer written");

    let mut group = c.benchmark_group("http2 server, 1,000 requests");
    group.bench_function("h2 crate", |b| {
        b.iter(|| runtime.block_on(theirs(black_box(input.clone()))))
    });
    group.bench_function("coxswain http2", |b| b.iter(|| ours(black_box(&input))));
    group.finish();

    // Criterion keeps its estimates to itself: time the same loops once more for the ratio.
    let rounds = 200;
    let start = Instant::now();
    for _ in 0..rounds {
        black_box(runtime.block_on(theirs(input.clone())));
    }
    let h2 = start.elapsed().as_secs_f64() / f64::from(rounds * STREAMS);
    let start = Instant::now();
    for _ in 0..rounds {
        black_box(ours(&input));
    }
    let own = start.elapsed().as_secs_f64() / f64::from(rounds * STREAMS);
    println!(
        "http2 server per request: h2 crate {:.2} us, coxswain http2 {:.2} us: ratio {:.2}",
        h2 * 1e6,
        own * 1e6,
        h2 / own
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
