//! HTTP/2 clients for the proxy's tests.

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

/// An HTTP/2 connection with prior knowledge (h2c) to the proxy on `port`, driven by a task
/// of its own.
pub async fn h2c(port: u16) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}
