//! Relayed connections: bytes to a backend, never read as HTTP.
//!
//! TCP listeners (Gateway listener protocol TCP, with TCPRoutes) have one host, "": a
//! connection goes to a backend of its first route. UDP listeners relay datagrams per client
//! flow ([`udp`]).
//!
//! TLS listeners (protocol TLS, with TLSRoutes) route by the name the client asks for. The proxy reads the client's first flight until the ClientHello
//! is complete, takes its server_name (SNI), and picks the virtual host by it as HTTP
//! listeners pick one by Host. Then, by the host's listener mode:
//! - Passthrough: TLS ends at the backend. The connection is relayed to a backend of the
//!   host's first route, starting with the bytes already read.
//! - Terminate: the proxy completes the handshake with the port's certificate for the name
//!   (client certificates verified as the port asks), then relays the plaintext.
//!
//! Both modes may share a port (TLSRouteModeMixed): the ClientHello is read before either
//! begins. Metrics count each connection as one request of its route: 2xx relayed, 5xx when
//! no backend could take it, 403 for a resumed session without the client certificate the
//! port now requires; a name no route serves counts as an unrouted 404.

pub mod udp;

use crate::metrics::Metrics;
use crate::router::Pick;
use crate::table::SharedTable;
use pingora::listeners::tls::Acceptor;
use pingora::protocols::Ssl;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

/// A ClientHello is a few hundred bytes, a couple of KiB with post-quantum key shares; the TLS
/// record limit is 16 KiB per record and a hello may span records. Past this, it is refused.
const MAX_HELLO: usize = 64 * 1024;
/// How long a client may take to send its ClientHello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting to a backend may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How a port's connections are relayed.
#[derive(Clone)]
pub enum Relay {
    /// By the ClientHello's SNI, TLS passed through or ended by this.
    Tls(Arc<Terminator>),
    /// As they come, to the first route of the port's one host.
    Tcp,
}

/// What ends TLS for the hosts of a port that terminate it.
pub struct Terminator {
    /// The port's certificates and client verification, without ALPN: the bytes relayed are
    /// the backend's protocol, which the proxy does not speak for it.
    pub acceptor: Arc<Acceptor>,
    /// How long the rest of the handshake may take.
    pub handshake: Duration,
}

/// What the bytes read so far say.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// The ClientHello is not complete yet.
    NeedMore,
    /// Not a TLS ClientHello (or a malformed one).
    NotTls,
    /// A complete ClientHello and its server_name, if it has one.
    Complete(Option<String>),
}

/// Reads the server_name of the ClientHello at the start of `buf`, which may be split over
/// several handshake records (RFC 8446 §5.1, RFC 6066 §3).
pub fn client_hello_sni(buf: &[u8]) -> Hello {
    // Reassemble the handshake message from the records' fragments.
    let mut handshake = Vec::new();
    let mut rest = buf;
    loop {
        if rest.len() < 5 {
            return Hello::NeedMore;
        }
        // ContentType handshake(22), legacy version 3.x.
        if rest[0] != 22 || rest[1] != 3 {
            return Hello::NotTls;
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if len == 0 || len > 16 * 1024 + 256 {
            return Hello::NotTls;
        }
        let Some(fragment) = rest.get(5..5 + len) else {
            return Hello::NeedMore;
        };
        handshake.extend_from_slice(fragment);
        rest = &rest[5 + len..];
        if handshake.len() >= 4 {
            // HandshakeType client_hello(1), 24-bit length.
            if handshake[0] != 1 {
                return Hello::NotTls;
            }
            let body_len = (usize::from(handshake[1]) << 16)
                | (usize::from(handshake[2]) << 8)
                | usize::from(handshake[3]);
            if body_len > MAX_HELLO {
                return Hello::NotTls;
            }
            if let Some(body) = handshake.get(4..4 + body_len) {
                return match server_name(body) {
                    Some(name) => Hello::Complete(name),
                    None => Hello::NotTls,
                };
            }
        }
    }
}

/// A cursor over a ClientHello body; every read is bounds-checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = tail;
        Some(head)
    }

    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }

    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    /// A vector with a length prefix of `width` bytes.
    fn vec(&mut self, width: usize) -> Option<&'a [u8]> {
        let n = if width == 1 { self.u8()? } else { self.u16()? };
        self.take(n)
    }
}

/// None: malformed. Some(None): well formed without a host_name.
fn server_name(body: &[u8]) -> Option<Option<String>> {
    let mut r = Reader(body);
    r.take(2)?; // legacy_version
    r.take(32)?; // random
    r.vec(1)?; // legacy_session_id
    r.vec(2)?; // cipher_suites
    r.vec(1)?; // legacy_compression_methods
    if r.0.is_empty() {
        // No extensions at all (allowed before TLS 1.3).
        return Some(None);
    }
    let mut extensions = Reader(r.vec(2)?);
    while !extensions.0.is_empty() {
        let kind = extensions.u16()?;
        let data = extensions.vec(2)?;
        if kind != 0 {
            continue;
        }
        let mut list = Reader(Reader(data).vec(2)?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let name = list.vec(2)?;
            if name_type == 0 {
                let name = std::str::from_utf8(name).ok()?;
                return Some(Some(name.to_ascii_lowercase()));
            }
        }
        return Some(None);
    }
    Some(None)
}

/// Serves one connection accepted on `port`.
pub async fn serve(
    client: TcpStream,
    table: &SharedTable,
    port: u16,
    peer: SocketAddr,
    relay: &Relay,
    idle: Duration,
) {
    let at = Arrival {
        table,
        port,
        peer,
        idle,
    };
    match relay {
        Relay::Tcp => forward(client, &at, "", &[]).await,
        Relay::Tls(terminator) => serve_tls(client, &at, terminator).await,
    }
}

/// Where a relayed connection arrived, and how long it may stay silent.
struct Arrival<'a> {
    table: &'a SharedTable,
    port: u16,
    peer: SocketAddr,
    idle: Duration,
}

/// Serves one connection accepted on TLS `port`.
async fn serve_tls(mut client: TcpStream, at: &Arrival<'_>, terminator: &Terminator) {
    let (table, port, peer) = (at.table, at.port, at.peer);
    let mut first = Vec::with_capacity(2048);
    let sni = match tokio::time::timeout(HELLO_TIMEOUT, read_hello(&mut client, &mut first)).await {
        Ok(Some(sni)) => sni,
        Ok(None) => {
            tracing::debug!(%peer, port, "not a TLS ClientHello; connection closed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, port, "no ClientHello in time; connection closed");
            return;
        }
    };
    let name = sni.as_deref().unwrap_or("");
    let terminate = {
        let current = table.load();
        match current.router.port(port).and_then(|p| p.relay_route(name)) {
            Some((_, terminate)) => terminate,
            None => {
                table.metrics().unrouted(404);
                tracing::debug!(%peer, port, sni = name, "no route for this name");
                return;
            }
        }
    };
    if !terminate {
        forward(client, at, name, &first).await;
        return;
    }
    let mut stream = crate::conn::l4_stream(client, peer);
    // The handshake starts from the ClientHello already read.
    stream.rewind(&first);
    let handshake = terminator.acceptor.tls_handshake(stream);
    let tls = match tokio::time::timeout(terminator.handshake, handshake).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(%peer, port, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            Metrics::count(&table.metrics().tls_handshake_timeouts);
            tracing::debug!(%peer, port, "TLS handshake deadline passed");
            return;
        }
    };
    let refused = tls.get_ssl_digest().is_some_and(|d| {
        d.extension
            .get::<crate::tls::ConnectionTls>()
            .is_some_and(|t| t.client_cert_refused)
    });
    if refused {
        // Record it against the route, as HTTPS answers such a session's requests 403.
        if let Some((route, _)) = table
            .load()
            .router
            .port(port)
            .and_then(|p| p.relay_route(name))
        {
            route.counters.record(403);
        }
        tracing::debug!(%peer, port, "resumed session without the required client certificate");
        return;
    }
    forward(tls, at, name, &[]).await;
}

/// Relays `client` to a backend of the first route of the host `name` lands on, sending
/// `first` (bytes already read from the client) ahead of the rest.
async fn forward<C>(mut client: C, at: &Arrival<'_>, name: &str, first: &[u8])
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let (table, port, peer) = (at.table, at.port, at.peer);
    // Held while the connection is relayed: a least-request cluster counts it as busy.
    let (addr, counters, _in_flight) = {
        let metrics = table.metrics().clone();
        let table = table.load();
        let Some((route, _)) = table.router.port(port).and_then(|p| p.relay_route(name)) else {
            // The table changed during a handshake and no longer serves the name.
            metrics.unrouted(404);
            tracing::debug!(%peer, port, sni = name, "no route for this name");
            return;
        };
        let counters = route.counters.clone();
        // Only the client address is known before the backend is chosen: a cluster hashing
        // on a header or cookie is balanced round robin here.
        let mut key = |source: &crate::balance::HashSource| {
            (*source == crate::balance::HashSource::ClientAddress)
                .then(|| crate::balance::address_hash(peer.ip()))
        };
        match route.pick(&mut key) {
            Pick::Endpoint {
                addr,
                endpoint,
                cluster,
                ..
            } => (addr, counters, cluster.start(endpoint)),
            Pick::InvalidBackend => {
                counters.record(500);
                return;
            }
            Pick::NoEndpoints => {
                counters.record(503);
                return;
            }
        }
    };
    let mut upstream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            counters.record(503);
            tracing::debug!(%peer, %addr, error = %e, "backend refused the connection");
            return;
        }
        Err(_) => {
            counters.record(503);
            tracing::debug!(%peer, %addr, "connecting to the backend timed out");
            return;
        }
    };
    let _ = upstream.set_nodelay(true);
    if !first.is_empty() && upstream.write_all(first).await.is_err() {
        counters.record(503);
        return;
    }
    counters.record(200);
    // There are no request boundaries to stop at: on SIGTERM a relayed connection lives until
    // either side closes it, it idles out, or the drain period ends with the process.
    match copy_until_idle(&mut client, &mut upstream, at.idle).await {
        Ok(Ended::Closed) => {}
        Ok(Ended::Idle) => {
            Metrics::count(&table.metrics().relay_idle_closed);
            tracing::debug!(%peer, %addr, idle = ?at.idle, "relayed connection idle; closed");
        }
        Err(e) => tracing::debug!(%peer, %addr, error = %e, "relayed connection ended"),
    }
}

/// Why a relay stopped copying.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// A side closed its half and the other followed.
    Closed,
    /// No byte moved either way for the idle time.
    Idle,
}

/// Copies both ways until both sides have closed, or until nothing has been read from either
/// for `idle`.
async fn copy_until_idle<A, B>(a: &mut A, b: &mut B, idle: Duration) -> std::io::Result<Ended>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let start = Instant::now();
    // Milliseconds since `start` of the last read that brought bytes, from either side.
    let last = AtomicU64::new(0);
    let mut a = Watched {
        inner: a,
        last: &last,
        start,
    };
    let mut b = Watched {
        inner: b,
        last: &last,
        start,
    };
    let copy = tokio::io::copy_bidirectional(&mut a, &mut b);
    tokio::pin!(copy);
    loop {
        let quiet_since = start + Duration::from_millis(last.load(Ordering::Relaxed));
        tokio::select! {
            result = &mut copy => return result.map(|_| Ended::Closed),
            () = tokio::time::sleep_until((quiet_since + idle).into()) => {
                let quiet_since = start + Duration::from_millis(last.load(Ordering::Relaxed));
                if quiet_since.elapsed() >= idle {
                    return Ok(Ended::Idle);
                }
            }
        }
    }
}

/// A stream that notes when it last read bytes.
struct Watched<'a, S> {
    inner: S,
    last: &'a AtomicU64,
    start: Instant,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<'_, S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
            self.last.store(now, Ordering::Relaxed);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<'_, S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Reads until the ClientHello is complete. None: not TLS, too large, or the client left.
async fn read_hello(client: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Option<String>> {
    loop {
        match client_hello_sni(buf) {
            Hello::Complete(sni) => return Some(sni),
            Hello::NotTls => return None,
            Hello::NeedMore if buf.len() >= MAX_HELLO => return None,
            Hello::NeedMore => {}
        }
        let mut chunk = [0u8; 4096];
        let n = client.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello as a TLS client would send it for `sni`.
    fn hello(sni: Option<&str>) -> Vec<u8> {
        let mut ext = Vec::new();
        // supported_versions first, so the parser has to skip an extension.
        ext.extend_from_slice(&[0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]);
        if let Some(name) = sni {
            let n = name.len();
            let mut list = vec![0u8];
            list.extend_from_slice(&u16::try_from(n).unwrap_or(0).to_be_bytes());
            list.extend_from_slice(name.as_bytes());
            let mut data = u16::try_from(list.len())
                .unwrap_or(0)
                .to_be_bytes()
                .to_vec();
            data.extend_from_slice(&list);
            ext.extend_from_slice(&[0, 0]);
            ext.extend_from_slice(&u16::try_from(data.len()).unwrap_or(0).to_be_bytes());
            ext.extend_from_slice(&data);
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7u8; 32]);
        body.extend_from_slice(&[0]); // no session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]);
        body.extend_from_slice(&[1, 0]);
        body.extend_from_slice(&u16::try_from(ext.len()).unwrap_or(0).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut hs = vec![1];
        let len = u32::try_from(body.len()).unwrap_or(0).to_be_bytes();
        hs.extend_from_slice(&len[1..]);
        hs.extend_from_slice(&body);
        hs
    }

    /// The handshake message in records of at most `max` bytes of fragment each.
    fn records(hs: &[u8], max: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in hs.chunks(max) {
            out.extend_from_slice(&[22, 3, 1]);
            out.extend_from_slice(&u16::try_from(chunk.len()).unwrap_or(0).to_be_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }

    #[test]
    fn the_server_name_is_read_at_every_split() {
        let wire = records(&hello(Some("DB.Example.com")), 16 * 1024);
        for cut in 0..wire.len() {
            assert_eq!(
                client_hello_sni(&wire[..cut]),
                Hello::NeedMore,
                "cut at {cut}"
            );
        }
        assert_eq!(
            client_hello_sni(&wire),
            Hello::Complete(Some("db.example.com".into()))
        );
    }

    #[test]
    fn a_hello_spanning_records_is_reassembled() {
        let wire = records(&hello(Some("a.example")), 7);
        assert_eq!(
            client_hello_sni(&wire),
            Hello::Complete(Some("a.example".into()))
        );
    }

    #[test]
    fn no_server_name_is_a_complete_hello_without_one() {
        let wire = records(&hello(None), 16 * 1024);
        assert_eq!(client_hello_sni(&wire), Hello::Complete(None));
    }

    #[test]
    fn other_protocols_and_garbage_are_not_tls() {
        assert_eq!(client_hello_sni(b"GET / HTTP/1.1\r\n\r\n"), Hello::NotTls);
        assert_eq!(client_hello_sni(b"PRI * HTTP/2.0\r\n"), Hello::NotTls);
        // A handshake record whose message is not a ClientHello.
        assert_eq!(
            client_hello_sni(&[22, 3, 3, 0, 4, 2, 0, 0, 0]),
            Hello::NotTls
        );
        // Lengths that point past the message.
        let mut bad = hello(Some("x.example"));
        let n = bad.len();
        bad[n - 11] = 0xff; // the name's length, high byte
        assert_eq!(client_hello_sni(&records(&bad, 16 * 1024)), Hello::NotTls);
    }
}
