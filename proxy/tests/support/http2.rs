//! HTTP/2 clients for the proxy's tests.

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// An HTTP/2 connection with prior knowledge (h2c) to the proxy on `port`, driven by a task
/// of its own.
pub async fn h2c(port: u16) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    over(tcp).await
}

/// An HTTP/2 client connection over `io` (TCP, or TLS after ALPN h2), driven by a task of
/// its own.
pub async fn over<I>(io: I) -> hyper::client::conn::http2::SendRequest<Full<Bytes>>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

/// The client's preface and an empty SETTINGS frame: how a hand-made client starts.
pub fn preface() -> Vec<u8> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    out
}
