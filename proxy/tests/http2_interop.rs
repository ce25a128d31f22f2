//! `http2::conn` against a real HTTP/2 client, the h2 crate's, over loopback TCP: what unit
//! tests with hand-made frames cannot show. The h2 client's HPACK encoder indexes repeated
//! fields (so our decoder's dynamic table is exercised by another implementation), it keeps
//! its own flow-control windows (so uploads and downloads larger than every window only
//! finish if both sides grant credit correctly), and it sends trailers.
//!
//! The server here is a minimal driver around the state machine: read, poll, answer, write.
//! It answers each request with 200, `x-path`, `x-body-len`, `x-trailer` (a request trailer's
//! value) and a body of `?size=N` octets.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

use bytes::Bytes;
use coxswain_proxy::head::Head;
use coxswain_proxy::http2::conn::{Config, Connection, Event};
use coxswain_proxy::http2::request;
use std::collections::HashMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Exchange {
    path: String,
    body_len: usize,
    trailer: String,
}

/// An answer still going out as the client's windows allow.
struct Sending {
    stream: u32,
    body: Vec<u8>,
    sent: usize,
}

async fn serve(mut tcp: TcpStream) {
    let mut conn = Connection::new(Config::default());
    let mut input = Vec::new();
    let mut chunk = vec![0u8; 16 << 10];
    let mut exchanges: HashMap<u32, Exchange> = HashMap::new();
    let mut sending: Vec<Sending> = Vec::new();
    loop {
        let out = std::mem::take(conn.output());
        if tcp.write_all(&out).await.is_err() {
            return;
        }
        let n = match tcp.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        input.extend_from_slice(&chunk[..n]);
        let mut at = 0;
        let mut released = Vec::new();
        let mut complete = Vec::new();
        loop {
            let (used, event) = match conn.poll(&input[at..]) {
                Ok(step) => step,
                Err(e) => {
                    let _ = tcp.write_all(conn.output()).await;
                    panic!("the client broke a rule: {e}");
                }
            };
            at += used;
            let Some(event) = event else { break };
            match event {
                Event::Headers {
                    stream,
                    fields,
                    end_stream,
                    trailers,
                } => {
                    if trailers {
                        request::trailers(fields).unwrap();
                        let (_, value) = fields.iter().next().unwrap();
                        exchanges.get_mut(&stream).unwrap().trailer =
                            String::from_utf8_lossy(value).into();
                    } else {
                        let head = request::request(fields).unwrap();
                        let path = String::from_utf8_lossy(head.target()).into_owned();
                        exchanges.insert(
                            stream,
                            Exchange {
                                path,
                                ..Exchange::default()
                            },
                        );
                    }
                    if end_stream {
                        complete.push(stream);
                    }
                }
                Event::Data {
                    stream,
                    data,
                    end_stream,
                } => {
                    exchanges.get_mut(&stream).unwrap().body_len += data.len();
                    released.push((stream, data.len()));
                    if end_stream {
                        complete.push(stream);
                    }
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        input.drain(..at);
        for (stream, len) in released {
            conn.release(stream, len);
        }
        for stream in complete {
            let exchange = exchanges.remove(&stream).unwrap();
            let size = exchange
                .path
                .split_once("size=")
                .map_or(0, |(_, n)| n.parse().unwrap());
            let body_len = exchange.body_len.to_string();
            let fields: [(&[u8], &[u8]); 3] = [
                (b"x-path", exchange.path.as_bytes()),
                (b"x-body-len", body_len.as_bytes()),
                (b"x-trailer", exchange.trailer.as_bytes()),
            ];
            conn.send_headers(stream, Some(200), fields, false).unwrap();
            let body = (0..size).map(|i| (i % 251) as u8).collect();
            sending.push(Sending {
                stream,
                body,
                sent: 0,
            });
        }
        // Whatever the windows allow now; the rest after the client's next WINDOW_UPDATE.
        sending.retain_mut(|s| {
            s.sent += conn.send_data(s.stream, &s.body[s.sent..], true).unwrap();
            s.sent < s.body.len()
        });
    }
}

/// A stall (credit never granted) fails the test instead of hanging it.
const BOUND: std::time::Duration = std::time::Duration::from_secs(30);

async fn client() -> h2::client::SendRequest<Bytes> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        serve(tcp).await;
    });
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send
}

/// Reads a whole answer: its head's fields of interest and its body, releasing credit as it
/// goes (as any client must for bodies over its window).
async fn answer(response: h2::client::ResponseFuture) -> (HashMap<String, String>, Vec<u8>) {
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    let head = response
        .headers()
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
        .collect();
    let mut body = response.into_body();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        body.flow_control().release_capacity(chunk.len()).unwrap();
        data.extend_from_slice(&chunk);
    }
    (head, data)
}

fn get(path: &str) -> hyper::Request<()> {
    hyper::Request::builder()
        .uri(format!("http://a.example{path}"))
        .header(
            "x-same",
            "a value repeated on every request, indexed by the client",
        )
        .header("cookie", "session=abc")
        .body(())
        .unwrap()
}

#[tokio::test]
async fn concurrent_streams_with_fields_the_client_indexes() {
    tokio::time::timeout(BOUND, async {
        let mut send = client().await;
        let mut answers = Vec::new();
        for i in 0..40 {
            send = send.ready().await.unwrap();
            let (response, _) = send
                .send_request(get(&format!("/r/{i}?size={i}")), true)
                .unwrap();
            answers.push((i, tokio::spawn(answer(response))));
        }
        for (i, pending) in answers {
            let (head, body) = pending.await.unwrap();
            assert_eq!(head["x-path"], format!("/r/{i}?size={i}"));
            assert_eq!(body.len(), i);
            assert!(body.iter().enumerate().all(|(j, &b)| b == (j % 251) as u8));
        }
    })
    .await
    .expect("finished within the bound");
}

#[tokio::test]
async fn uploads_and_downloads_past_every_window() {
    tokio::time::timeout(BOUND, async {
        let mut send = client().await;
        // 3 MiB up: three times our stream window of 1 MiB. 3 MiB down: far past the client's
        // window of 64 KiB.
        let size = 3 << 20;
        let request = hyper::Request::builder()
            .method("POST")
            .uri(format!("http://a.example/up?size={size}"))
            .body(())
            .unwrap();
        send = send.ready().await.unwrap();
        let (response, mut upload) = send.send_request(request, false).unwrap();
        let down = tokio::spawn(answer(response));
        let mut left = size;
        while left > 0 {
            upload.reserve_capacity(left.min(256 << 10));
            let granted = std::future::poll_fn(|cx| upload.poll_capacity(cx))
                .await
                .unwrap()
                .unwrap();
            let n = granted.min(left);
            upload
                .send_data(Bytes::from(vec![7u8; n]), n == left)
                .unwrap();
            left -= n;
        }
        let (head, body) = down.await.unwrap();
        assert_eq!(head["x-body-len"], size.to_string());
        assert_eq!(body.len(), size);
    })
    .await
    .expect("finished within the bound");
}

#[tokio::test]
async fn request_trailers_arrive_after_the_body() {
    tokio::time::timeout(BOUND, async {
        let mut send = client().await;
        let request = hyper::Request::builder()
            .method("POST")
            .uri("http://a.example/t")
            .body(())
            .unwrap();
        send = send.ready().await.unwrap();
        let (response, mut upload) = send.send_request(request, false).unwrap();
        upload
            .send_data(Bytes::from_static(b"body"), false)
            .unwrap();
        let mut trailers = hyper::HeaderMap::new();
        trailers.insert("x-checksum", "c0ffee".parse().unwrap());
        upload.send_trailers(trailers).unwrap();
        let (head, _) = answer(response).await;
        assert_eq!(head["x-body-len"], "4");
        assert_eq!(head["x-trailer"], "c0ffee");
    })
    .await
    .expect("finished within the bound");
}
