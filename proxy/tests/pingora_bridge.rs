//! The bridge the fast path's own HTTP/2 will use for the streams Pingora must serve: Pingora's
//! HTTP/2 server on one end of an in-memory pipe, an HTTP/2 client on the other, and the
//! client connection's digest handed to Pingora's sessions. This guards the one assumption
//! the design rests on (issue 21's note): that Pingora serves HTTP/2 over a socket that is
//! not a socket, with the real client's details. A Pingora upgrade that breaks it fails here.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::protocols::http::v2::server::{H2Accept, HttpSession, handshake};
use pingora::protocols::l4::socket::SocketAddr;
use pingora::protocols::{Digest, SocketDigest, Stream};
use std::sync::Arc;

#[tokio::test]
async fn pingora_serves_http2_over_an_in_memory_pipe_with_the_clients_digest() {
    let (ours, theirs) = tokio::io::duplex(64 << 10);
    let stream: Stream = Box::new(coxswain_proxy::virtual_socket::stream(theirs));
    // The real client's address, as the fast path would pass its connection's digest on.
    let client: std::net::SocketAddr = "192.0.2.7:40000".parse().unwrap();
    let socket = SocketDigest::from_raw_fd(-1);
    socket
        .peer_addr
        .set(Some(SocketAddr::Inet(client)))
        .unwrap();
    let digest = Arc::new(Digest {
        socket_digest: Some(Arc::new(socket)),
        ..Digest::default()
    });

    let server = tokio::spawn(async move {
        let mut conn = handshake(stream, None).await.unwrap();
        let Some(H2Accept::Session(mut session)) =
            HttpSession::from_h2_conn(&mut conn, digest).await.unwrap()
        else {
            panic!("no stream");
        };
        let path = session.req_header().uri.path().to_string();
        let peer = session
            .digest()
            .and_then(|d| d.socket_digest.as_ref())
            .and_then(|s| s.peer_addr())
            .map(|a| a.to_string())
            .unwrap_or_default();
        let mut header = ResponseHeader::build(200, None).unwrap();
        header.insert_header("x-path", path).unwrap();
        header.insert_header("x-peer", peer).unwrap();
        session
            .write_response_header(Box::new(header), false)
            .unwrap();
        session
            .write_body(Bytes::from_static(b"served by pingora"), true)
            .await
            .unwrap();
        session.finish().unwrap();
        // Accepting drives the connection: the answer's frames go out until the client leaves.
        while let Ok(Some(_)) = HttpSession::from_h2_conn(&mut conn, Arc::default()).await {}
    });

    let (send, connection) = h2::client::handshake(ours).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut send = send.ready().await.unwrap();
    let request = hyper::Request::builder()
        .uri("https://a.example/bridged")
        .body(())
        .unwrap();
    let (response, _) = send.send_request(request, true).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-path"], "/bridged");
    assert_eq!(response.headers()["x-peer"], "192.0.2.7:40000");
    let mut body = response.into_body();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        data.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(data, b"served by pingora");
    drop(send);
    drop(body);
    server.abort();
}
