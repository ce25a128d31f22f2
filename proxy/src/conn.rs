//! HTTP/1 client connections, cleartext or TLS, with userspace buffering.
//!
//! Pingora's own listeners buffer each accepted stream (reads up to 64 KiB, writes up to one
//! MSS, flushed when a response is done), but that switch is private to its listener code,
//! and these accept loops are ours. Unbuffered, a response went out as one `send` for the
//! header and another for the body: an extra syscall, an extra wake-up of the client and an
//! extra loopback round of TCP processing per request. This type buffers writes the same
//! way; reads go straight into the reader's own buffer, and no read buffer is held while a
//! connection waits (see `poll_small_read`).
//!
//! Over TLS, rustls seals every write into a record of its own and sends it at once; a
//! buffer above it makes a small response's head and body one record and one `send`.
//!
//! Every write goes through one bound, for both engines alike: a write the client takes no
//! byte of within `Limits::client_send` fails (`SendDeadline`).

use async_trait::async_trait;
use pingora::protocols::l4::socket::SocketAddr as PingoraSocketAddr;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::tls::{SslDigest, TlsRef, TlsStream};
use pingora::protocols::{
    ALPN, GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl,
    TimingDigest, UniqueID, UniqueIDType,
};
use std::io;
use std::os::unix::io::AsRawFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

mod gather;
use gather::Gather;

/// A read asking for at least this much, with nothing staged, goes straight into the
/// reader's own buffer: the fast path and Pingora read heads and bodies into buffers of their
/// own, and staging those bytes here first would copy every one of them twice (a 64 KiB body
/// cost a 64 KiB memmove per request).
const DIRECT_READ: usize = 1024;
/// A smaller read (a peek) takes up to this much from the socket at once, staged for the
/// reads after it.
const STAGE: usize = 16 * 1024;
/// Write buffer: about one MSS, so small responses leave in one segment and large bodies
/// are not held back.
const WRITE_BUFFER: usize = 1460;
/// Plaintext gathered before rustls seals it: a TLS record's largest payload, so a response
/// up to that size leaves as one record, and larger writes go straight through.
const TLS_WRITE_BUFFER: usize = 16 * 1024;

/// The transport under the buffers.
#[derive(Debug)]
enum Io {
    /// Writes gathered into one MSS.
    Tcp(Gather<TcpStream>),
    /// No read buffer: rustls holds decrypted bytes already.
    Tls(Gather<Box<TlsStream<L4Stream>>>),
    /// Moved to a lingering close when Pingora dropped the connection (see `Drop`): reads
    /// end, writes fail.
    Gone,
}

#[derive(Debug)]
pub struct Buffered {
    io: Io,
    /// Bytes a peek took from the stream, or that the fast path read and put back, read
    /// again before it.
    rewound: Vec<u8>,
    /// Bytes of the requests after the one Pingora is serving: hidden from Pingora (reads
    /// wait as if the client were quiet) so it does not take them as overread.
    held: Vec<u8>,
    fd: UniqueIDType,
    socket: Option<Arc<SocketDigest>>,
    accepted: SystemTime,
    send: Option<SendDeadline>,
    /// Set while Pingora serves a request on it. If Pingora drops it rather than handing it
    /// back, the client may still be sending (a 413 before the body's end, a 502 during an
    /// upload): its transport goes back this way, to be closed lingering.
    lent: Option<tokio::sync::oneshot::Sender<Abandoned>>,
}

/// The transport of a connection Pingora dropped, for its connection task to close.
#[derive(Debug)]
pub struct Abandoned(Io);

impl Abandoned {
    /// Closes it lingering ([`linger`]). Boxed: the connection task awaiting it is held by
    /// every connection.
    pub fn close(self) -> Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let mut io = self.0;
        Box::pin(async move { shut_then_drain(&mut io, LINGER).await })
    }
}

/// How long a write may wait on a client that takes none of its bytes. The timer is armed
/// when a write (or flush) first has to wait and disarmed when one completes, so it bounds a
/// stall, not a transfer, and costs nothing while the socket takes every write at once.
#[derive(Debug)]
struct SendDeadline {
    within: Duration,
    /// Kept between stalls and reset, rather than allocated per stall.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    armed: bool,
    expired: bool,
    metrics: Arc<crate::metrics::Metrics>,
}

impl SendDeadline {
    /// What a write's poll returns once the deadline had its say: a result as it came (and
    /// the timer disarmed), a wait, or a timed-out error once the client stalled too long.
    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.armed = false;
            return polled;
        }
        if !self.armed {
            self.armed = true;
            let deadline = tokio::time::Instant::now() + self.within;
            match &mut self.timer {
                Some(timer) => timer.as_mut().reset(deadline),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        let Some(timer) = &mut self.timer else {
            return Poll::Pending;
        };
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        if !self.expired {
            self.expired = true;
            crate::metrics::Metrics::count(&self.metrics.client_send_timeouts);
            tracing::debug!(within = ?self.within, "client took no bytes within the send timeout");
        }
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client took none of the bytes sent within the send timeout",
        )))
    }
}

impl Buffered {
    /// Wraps an accepted connection; `peer` is the client address accept() returned, so no
    /// getpeername is needed later.
    pub fn new(tcp: TcpStream, peer: std::net::SocketAddr) -> Self {
        let fd = tcp.as_raw_fd();
        let digest = SocketDigest::from_raw_fd(fd);
        let _ = digest.peer_addr.set(Some(PingoraSocketAddr::Inet(peer)));
        Self {
            io: Io::Tcp(Gather::new(WRITE_BUFFER, tcp)),
            rewound: Vec::new(),
            held: Vec::new(),
            fd,
            socket: Some(Arc::new(digest)),
            accepted: SystemTime::now(),
            send: None,
            lent: None,
        }
    }

    /// Bounds every write by `within` of no progress (`Limits::client_send`), counted in
    /// `metrics` when it ends a connection.
    pub fn bounding_sends(
        mut self,
        within: Duration,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Self {
        self.send = Some(SendDeadline {
            within,
            timer: None,
            armed: false,
            expired: false,
            metrics,
        });
        self
    }

    /// Wraps a connection whose TLS handshake is done; its socket digest (with the client
    /// address) and its TLS digest (with the SNI) stay the stream's.
    pub fn tls(stream: Box<TlsStream<L4Stream>>) -> Self {
        Self {
            fd: stream.id(),
            socket: stream.get_socket_digest(),
            accepted: SystemTime::now(),
            io: Io::Tls(Gather::new(TLS_WRITE_BUFFER, stream)),
            rewound: Vec::new(),
            held: Vec::new(),
            send: None,
            lent: None,
        }
    }

    /// The TLS stream under the buffer, if any.
    fn tls_stream(&self) -> Option<&TlsStream<L4Stream>> {
        match &self.io {
            Io::Tls(w) => Some(w.get_ref()),
            Io::Tcp(_) | Io::Gone => None,
        }
    }
}

/// A read smaller than `DIRECT_READ` on a cleartext socket: what the socket has is read
/// into a buffer allocated once it is readable (not while it waits), and what the caller
/// did not take is put in `rewound`, read again first. No read buffer outlives its bytes: a
/// 64 KiB one per connection made 5,000 idle connections cost 200 MB.
fn poll_small_read(
    tcp: &TcpStream,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
    rewound: &mut Vec<u8>,
) -> Poll<io::Result<()>> {
    loop {
        std::task::ready!(tcp.poll_read_ready(cx))?;
        let mut staged = Vec::with_capacity(STAGE);
        match tcp.try_read_buf(&mut staged) {
            Ok(_) => {
                let n = staged.len().min(buf.remaining());
                buf.put_slice(&staged[..n]);
                if n < staged.len() {
                    staged.drain(..n);
                    *rewound = staged;
                }
                return Poll::Ready(Ok(()));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Poll::Ready(Err(e)),
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s.get_mut()).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.get_mut()).poll_read(cx, buf),
            Io::Gone => Poll::Ready(Ok(())),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s).poll_write(cx, buf),
            Io::Gone => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Gone => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Tcp(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
            Io::Gone => false,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s).poll_flush(cx),
            Io::Gone => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s).poll_shutdown(cx),
            Io::Gone => Poll::Ready(Ok(())),
        }
    }
}

impl Buffered {
    /// Hands one request to Pingora: `now` is read first, `later` (the requests that follow)
    /// only after [`Buffered::take_unread`].
    pub fn hand_over(&mut self, now: &[u8], later: &[u8]) {
        self.rewound.extend_from_slice(now);
        self.held.extend_from_slice(later);
    }

    /// Waits until a read would not wait, without a buffer to read into: the fast path waits
    /// for a keep-alive connection's next request this way. Over TLS it returns at once
    /// (rustls may hold decrypted bytes the socket no longer shows).
    pub async fn readable(&mut self) -> io::Result<()> {
        if !self.rewound.is_empty() || !self.held.is_empty() {
            return Ok(());
        }
        match &self.io {
            Io::Tcp(s) => s.get_ref().readable().await,
            Io::Tls(_) | Io::Gone => Ok(()),
        }
    }

    /// Marks the connection as Pingora's for one request ([`Buffered::returned`] when it
    /// comes back). Pingora drops a connection it will not reuse with the request's body
    /// possibly still arriving; dropped while lent, its transport arrives on the receiver.
    pub fn lend(&mut self) -> tokio::sync::oneshot::Receiver<Abandoned> {
        let (back, abandoned) = tokio::sync::oneshot::channel();
        self.lent = Some(back);
        abandoned
    }

    pub fn returned(&mut self) {
        self.lent = None;
    }

    /// What was put back and not read, for the fast path's reader.
    pub fn take_unread(&mut self) -> Vec<u8> {
        let mut bytes = std::mem::take(&mut self.rewound);
        bytes.append(&mut self.held);
        bytes
    }
}

impl AsyncRead for Buffered {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.rewound.is_empty() {
            let n = self.rewound.len().min(buf.remaining());
            buf.put_slice(&self.rewound[..n]);
            self.rewound.drain(..n);
            if self.rewound.is_empty() {
                self.rewound = Vec::new();
            }
            return Poll::Ready(Ok(()));
        }
        if !self.held.is_empty() {
            // The next request is already here; Pingora must not read it. Its reads in this
            // state are idle checks, which end with the response.
            return Poll::Pending;
        }
        let this = &mut *self;
        match &mut this.io {
            Io::Tcp(s) if buf.remaining() < DIRECT_READ => {
                poll_small_read(s.get_ref(), cx, buf, &mut this.rewound)
            }
            io => Pin::new(io).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Buffered {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        bounded(&mut this.send, cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        bounded(&mut this.send, cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        bounded(&mut this.send, cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.io).poll_shutdown(cx);
        bounded(&mut this.send, cx, polled)
    }
}

/// A write's poll under the connection's send deadline, if it has one.
fn bounded<T>(
    send: &mut Option<SendDeadline>,
    cx: &mut Context<'_>,
    polled: Poll<io::Result<T>>,
) -> Poll<io::Result<T>> {
    match send {
        Some(deadline) => deadline.check(cx, polled),
        None => polled,
    }
}

impl Drop for Buffered {
    fn drop(&mut self) {
        // Not a task of its own: the connection's task closes it, still counted against the
        // connection limit, as the fast path's lingering closes are.
        if let Some(back) = self.lent.take() {
            let io = std::mem::replace(&mut self.io, Io::Gone);
            let _ = back.send(Abandoned(io));
        }
    }
}

#[async_trait]
impl Shutdown for Buffered {
    async fn shutdown(&mut self) {
        // Flushes what is buffered, then closes the write side.
        if let Err(e) = AsyncWriteExt::shutdown(&mut self.io).await {
            tracing::debug!(error = %e, "closing a client connection");
        }
    }
}

impl UniqueID for Buffered {
    fn id(&self) -> UniqueIDType {
        self.fd
    }
}

impl Ssl for Buffered {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.tls_stream()?.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<SslDigest>> {
        self.tls_stream()?.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.tls_stream()?.selected_alpn_proto()
    }
}

impl GetTimingDigest for Buffered {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        match self.tls_stream() {
            Some(tls) => tls.get_timing_digest(),
            None => vec![Some(TimingDigest {
                established_ts: self.accepted,
                ..Default::default()
            })],
        }
    }
}

impl GetProxyDigest for Buffered {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        None
    }
}

impl GetSocketDigest for Buffered {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.socket.clone()
    }

    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.socket = Some(Arc::new(digest));
    }
}

#[async_trait]
impl Peek for Buffered {
    /// Pingora peeks for the HTTP/2 preface. This fills `buf` only as far as the bytes can
    /// still be that preface: a request that differs early (any HTTP/1 request, however
    /// short) is known at once, instead of waiting for a client that may send nothing more.
    /// Whatever was read is put back to be read again.
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        let mut have = std::mem::take(&mut self.rewound);
        while have.len() < buf.len() && crate::http1::H2_PREFACE.starts_with(&have) {
            let mut more = [0u8; 64];
            let want = (buf.len() - have.len()).min(more.len());
            let n = self.io.read(&mut more[..want]).await?;
            if n == 0 {
                break;
            }
            have.extend_from_slice(&more[..n]);
        }
        let n = have.len().min(buf.len());
        buf[..n].copy_from_slice(&have[..n]);
        buf[n..].fill(0);
        self.rewound = have;
        Ok(true)
    }
}

/// How long a connection closed while its client may still be sending is read and dropped.
pub(crate) const LINGER: Duration = Duration::from_secs(2);

/// Closes a connection whose client may still be sending (a request refused before its end,
/// pipelined requests after a failed one, HTTP/2 streams opened after our GOAWAY): the last
/// bytes and our FIN go out, then whatever arrives is read and dropped until the client's
/// own FIN, for `LINGER` at most (`within` bounds the first part). Closing with bytes
/// unread makes the kernel answer with a TCP RST, which can reach the client before it read
/// our last answer and make it discard that answer (RFC 9112 section 9.6; nginx's
/// `lingering_close`).
pub(crate) async fn linger<S: AsyncRead + AsyncWrite + Unpin>(io: &mut S, within: Duration) {
    // Boxed: the connection futures that call this are held by every idle connection, and
    // its timers and read buffer inline made each of them larger (every idle HTTP/2
    // connection by 8.6 KiB, through jemalloc's size classes).
    Box::pin(shut_then_drain(io, within)).await;
}

async fn shut_then_drain<S: AsyncRead + AsyncWrite + Unpin>(io: &mut S, within: Duration) {
    if !matches!(
        tokio::time::timeout(within, io.shutdown()).await,
        Ok(Ok(()))
    ) {
        return;
    }
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(LINGER, async {
        while matches!(io.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// A connection for the TLS acceptor, which takes Pingora's own stream type (rustls then
/// batches writes into records, so it needs no buffer under it).
pub(crate) fn l4_stream(tcp: TcpStream, peer: std::net::SocketAddr) -> L4Stream {
    let mut stream = L4Stream::from(tcp);
    // The client address, for allowlists and access logs.
    let digest = SocketDigest::from_raw_fd(stream.as_raw_fd());
    let _ = digest.peer_addr.set(Some(peer.into()));
    stream.set_socket_digest(digest);
    stream
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn pair() -> (Buffered, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, peer) = listener.accept().await.unwrap();
        (Buffered::new(server, peer), client)
    }

    #[tokio::test]
    async fn writes_wait_for_flush_and_peeked_bytes_are_read_again() {
        let (mut conn, mut client) = pair().await;
        assert_eq!(
            conn.get_socket_digest().unwrap().peer_addr().unwrap(),
            &PingoraSocketAddr::Inet(client.local_addr().unwrap())
        );

        client.write_all(b"PRI * HTTP/2.0 and more").await.unwrap();
        let mut peeked = [0u8; 14];
        assert!(conn.try_peek(&mut peeked).await.unwrap());
        assert_eq!(&peeked, b"PRI * HTTP/2.0");
        let mut all = [0u8; 23];
        conn.read_exact(&mut all).await.unwrap();
        assert_eq!(&all, b"PRI * HTTP/2.0 and more");

        // Fewer bytes than the preface, already different from it: no waiting for more.
        client.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
        let mut peeked = [0u8; 24];
        let early = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            conn.try_peek(&mut peeked),
        )
        .await
        .expect("a short HTTP/1 request is told from the preface without waiting");
        assert!(early.unwrap());
        assert_ne!(&peeked[..], crate::http1::H2_PREFACE);
        let mut again = [0u8; 18];
        conn.read_exact(&mut again).await.unwrap();
        assert_eq!(&again, b"GET / HTTP/1.0\r\n\r\n");

        // Header and body written apart leave together, at the flush.
        conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\n")
            .await
            .unwrap();
        conn.write_all(b"ok\n").await.unwrap();
        let mut probe = [0u8; 64];
        let early = tokio::time::timeout(
            std::time::Duration::from_millis(100),
            client.read(&mut probe),
        )
        .await;
        assert!(early.is_err(), "nothing is sent before the flush");
        conn.flush().await.unwrap();
        let mut got = vec![0u8; 41];
        client.read_exact(&mut got).await.unwrap();
        assert!(got.ends_with(b"\r\n\r\nok\n"));
    }

    /// Bytes read from the socket and not yet by the caller, and the room held for them.
    fn staged(conn: &Buffered) -> (usize, usize) {
        (conn.rewound.len(), conn.rewound.capacity())
    }

    #[tokio::test]
    async fn a_connection_holds_a_read_buffer_only_while_it_has_bytes_in_it() {
        let (mut conn, mut client) = pair().await;
        assert_eq!(staged(&conn), (0, 0));
        client.write_all(b"abcdef").await.unwrap();
        // Waiting for the bytes takes no buffer.
        conn.readable().await.unwrap();
        assert_eq!(staged(&conn), (0, 0));
        // A small read takes what the socket has and hands the rest to the next reads.
        let mut two = [0u8; 2];
        conn.read_exact(&mut two).await.unwrap();
        assert_eq!(&two, b"ab");
        assert_eq!(staged(&conn).0, 4);
        let mut rest = [0u8; 4];
        conn.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"cdef");
        assert_eq!(staged(&conn), (0, 0), "a drained buffer is freed");
        // A large read goes straight into the reader's buffer.
        client.write_all(&[9u8; 3000]).await.unwrap();
        let mut big = vec![0u8; 4096];
        let mut got = 0;
        while got < 3000 {
            got += conn.read(&mut big[got..]).await.unwrap();
            assert_eq!(staged(&conn), (0, 0));
        }
        assert!(big[..3000].iter().all(|&b| b == 9));
    }

    /// A connection whose socket buffers stay small (64 KiB each way, no autotuning), so a
    /// client that reads slowly holds the writer back at once.
    async fn small_pair() -> (Buffered, TcpStream) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_send_buffer_size(64 * 1024).unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(4).unwrap();
        let client = tokio::net::TcpSocket::new_v4().unwrap();
        client.set_recv_buffer_size(64 * 1024).unwrap();
        let client = client
            .connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, peer) = listener.accept().await.unwrap();
        (Buffered::new(server, peer), client)
    }

    #[tokio::test]
    async fn a_write_the_client_takes_nothing_of_fails_at_the_send_deadline() {
        let (conn, mut client) = small_pair().await;
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let within = Duration::from_millis(300);
        let mut conn = conn.bounding_sends(within, metrics.clone());
        let timeouts = || {
            metrics
                .client_send_timeouts
                .load(std::sync::atomic::Ordering::Relaxed)
        };

        // A client that reads slowly, 256 KiB every 50 ms: the writer waits on it again and
        // again, for far longer than the deadline in all, but never that long at once.
        let total = 4 * 1024 * 1024;
        let reader = tokio::spawn(async move {
            let mut got = 0;
            let mut buf = vec![0u8; 64 * 1024];
            while got < total {
                let mut taken = 0;
                while taken < 256 * 1024 && got < total {
                    let n = client.read(&mut buf).await.unwrap();
                    assert!(n > 0);
                    taken += n;
                    got += n;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            client
        });
        let started = std::time::Instant::now();
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..total / chunk.len() {
            conn.write_all(&chunk).await.unwrap();
        }
        conn.flush().await.unwrap();
        assert!(
            started.elapsed() > 2 * within,
            "the writer was held back for {:?} in all: the test exercised no stalls",
            started.elapsed()
        );
        let client = reader.await.unwrap();
        assert_eq!(timeouts(), 0);

        // Now it stops reading: once its window and the socket buffers are full, the next
        // write waits, and fails when the deadline passes.
        let mut sent = 0usize;
        let err = loop {
            match conn.write_all(&chunk).await {
                Ok(()) => sent += chunk.len(),
                Err(e) => break e,
            }
            assert!(sent < 64 * 1024 * 1024, "the socket never filled");
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(timeouts(), 1);
        // The connection stays failed: the next write does not wait another round.
        let again = tokio::time::timeout(within / 2, conn.write_all(&chunk)).await;
        assert!(matches!(again, Ok(Err(_))), "{again:?}");
        assert_eq!(timeouts(), 1, "one connection is counted once");
        drop(client);
    }
}
