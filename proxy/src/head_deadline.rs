//! A whole-head deadline for connections whose request heads Pingora reads itself (HTTP/1
//! over TLS). Pingora's read timeout restarts on every read, so a client sending one header
//! line now and then could hold a request open for ever. This stream wrapper watches the
//! bytes going by: the first byte of a request (or accept, for the first one) starts the
//! deadline, the empty line ending the head stops it, and the response going out makes the
//! connection idle again. A read past the deadline fails, and Pingora closes the connection.

use crate::metrics::Metrics;
use async_trait::async_trait;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::tls::SslDigest;
use pingora::protocols::{
    ALPN, GetProxyDigest, GetSocketDigest, GetTimingDigest, IO, Peek, Shutdown, SocketDigest, Ssl,
    TimingDigest, UniqueID, UniqueIDType,
};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

#[derive(Debug)]
enum Phase {
    /// Between requests (the keep-alive timeout applies, not this one).
    Idle,
    /// Reading a head that must be whole by the deadline. `tail`: the last bytes seen, to
    /// find the empty line across reads.
    Head {
        deadline: Pin<Box<tokio::time::Sleep>>,
        tail: [u8; 3],
    },
    /// The head is in; a body may follow, read at the client's pace.
    Body,
}

/// A stream whose request heads must arrive whole within `limit`.
#[derive(Debug)]
pub struct HeadDeadline<S> {
    inner: S,
    limit: Duration,
    phase: Phase,
    metrics: Arc<Metrics>,
}

impl<S> HeadDeadline<S> {
    /// Wraps a connection whose first request head is due within `limit` from now.
    pub fn new(inner: S, limit: Duration, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            limit,
            phase: Phase::Head {
                deadline: Box::pin(tokio::time::sleep(limit)),
                tail: [0; 3],
            },
            metrics,
        }
    }
}

/// Where the empty line ending a head is in `bytes`, given the three bytes before them.
fn head_ends(tail: &mut [u8; 3], bytes: &[u8]) -> bool {
    for &b in bytes {
        let ends = b == b'\n' && (tail[2] == b'\n' || (tail[2] == b'\r' && tail[1] == b'\n'));
        *tail = [tail[1], tail[2], b];
        if ends {
            return true;
        }
    }
    false
}

impl<S: AsyncRead + Unpin> AsyncRead for HeadDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Phase::Head { deadline, .. } = &mut this.phase
            && deadline.as_mut().poll(cx).is_ready()
        {
            Metrics::count(&this.metrics.request_head_timeouts);
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "request head deadline passed",
            )));
        }
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &result {
            let new = &buf.filled()[before..];
            if !new.is_empty() {
                if matches!(this.phase, Phase::Idle) {
                    this.phase = Phase::Head {
                        deadline: Box::pin(tokio::time::sleep(this.limit)),
                        tail: [0; 3],
                    };
                }
                if let Phase::Head { tail, .. } = &mut this.phase
                    && head_ends(tail, new)
                {
                    this.phase = Phase::Body;
                }
            }
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for HeadDeadline<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            // An answer is going out: what the client sends next starts a new head.
            self.phase = Phase::Idle;
        }
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[async_trait]
impl<S: IO> Shutdown for HeadDeadline<S> {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await;
    }
}

impl<S: IO> UniqueID for HeadDeadline<S> {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl<S: IO> Ssl for HeadDeadline<S> {
    fn get_ssl(&self) -> Option<&pingora::protocols::tls::TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl<S: IO> GetTimingDigest for HeadDeadline<S> {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }
}

impl<S: IO> GetProxyDigest for HeadDeadline<S> {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
}

impl<S: IO> GetSocketDigest for HeadDeadline<S> {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest);
    }
}

#[async_trait]
impl<S: IO> Peek for HeadDeadline<S> {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_empty_line_is_found_across_reads() {
        let mut tail = [0; 3];
        assert!(!head_ends(&mut tail, b"GET / HTTP/1.1\r\nHost: a\r"));
        assert!(head_ends(&mut tail, b"\n\r\n"));
        let mut tail = [0; 3];
        assert!(head_ends(&mut tail, b"GET / HTTP/1.1\nHost: a\n\n"));
        let mut tail = [0; 3];
        assert!(!head_ends(&mut tail, b"GET / HTTP/1.1\r\nHost: a\r\n"));
        assert!(head_ends(&mut tail, b"\r\n"));
    }
}
