//! Byte streams Pingora takes as sockets: the in-memory pipe to its HTTP/2 server
//! (`fastpath::h2::bridge`) and TLS connections to backends verified by our own rules
//! (`upstream_tls`). Pingora reads and writes a `VirtualSocket` as it would a TCP stream and
//! asks it to set socket options, which only a stream over TCP has.

use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::l4::virt::{VirtualSockOpt, VirtualSocket, VirtualSocketStream};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::net::TcpStream;

/// What a stream does when Pingora asks for TCP_NODELAY.
pub trait NoDelay {
    fn set_nodelay(&self) -> std::io::Result<()>;
}

/// Memory has no Nagle to turn off.
impl NoDelay for DuplexStream {
    fn set_nodelay(&self) -> std::io::Result<()> {
        Ok(())
    }
}

impl NoDelay for tokio_rustls::client::TlsStream<TcpStream> {
    fn set_nodelay(&self) -> std::io::Result<()> {
        self.get_ref().0.set_nodelay(true)
    }
}

/// A stream Pingora uses as its socket.
#[derive(Debug)]
pub struct Socket<S>(pub S);

/// `io` as the layer-4 stream Pingora's sessions and connectors take.
pub fn stream<S>(io: S) -> L4Stream
where
    S: AsyncRead + AsyncWrite + NoDelay + Unpin + Send + Sync + std::fmt::Debug + 'static,
{
    L4Stream::from(VirtualSocketStream::new(Box::new(Socket(io))))
}

impl<S> VirtualSocket for Socket<S>
where
    S: AsyncRead + AsyncWrite + NoDelay + Unpin + Send + Sync + std::fmt::Debug,
{
    fn set_socket_option(&self, opt: VirtualSockOpt) -> std::io::Result<()> {
        match opt {
            VirtualSockOpt::NoDelay => self.0.set_nodelay(),
            // Keepalive: the proxy sets none on these.
            _ => Ok(()),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Socket<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Socket<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
