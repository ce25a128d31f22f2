//! Reading a proxy's answers in the body tests (streamed, chunked): whole answers with a
//! Content-Length body, the connection's end, and bodies that show where each byte belongs.

use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpStream;

/// Reads more into `buf`; false at the end of the stream.
pub async fn fill<R: AsyncRead + Unpin>(s: &mut R, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 16384];
    match s.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

/// Reads one answer with a Content-Length body: (head in lower case, body).
pub async fn answer<R: AsyncRead + Unpin>(s: &mut R, buf: &mut Vec<u8>) -> (String, Vec<u8>) {
    let within = Duration::from_secs(10);
    let end = loop {
        if let Some(e) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break e + 4;
        }
        let more = tokio::time::timeout(within, fill(s, buf)).await.unwrap();
        assert!(
            more,
            "closed before an answer: {:?}",
            String::from_utf8_lossy(buf)
        );
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    buf.drain(..end);
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    while buf.len() < length {
        let more = tokio::time::timeout(within, fill(s, buf)).await.unwrap();
        assert!(more, "closed inside a body");
    }
    (head, buf.drain(..length).collect())
}

/// Reads until the proxy closes the connection; false when it is still open after 10 s.
pub async fn closed(s: &mut TcpStream) -> bool {
    let mut sink = [0u8; 4096];
    let wait = async { while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {} };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .is_ok()
}

/// A body of `n` bytes that shows where each byte belongs.
pub fn body(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}
