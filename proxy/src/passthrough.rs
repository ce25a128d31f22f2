//! The fast path: plain HTTP/1.1 requests without a body, on routes that only forward.
//!
//! Profiles of the proxy under load put half of its CPU in Pingora's per-request machinery
//! (header maps rebuilt on both sides, a task pair joined by channels per request, an upstream
//! pool that spawns a task and takes locks per release, a getpeername per reuse). For the most
//! common request there is nothing for that machinery to do: no filter changes a header, no
//! body streams, no protocol changes. Such a request is forwarded here as the bytes it came
//! in: parsed once in place (httparse) to route it, written upstream verbatim over a
//! connection from this worker's pool, and the response copied back with its framing tracked
//! so both connections stay reusable.
//!
//! Everything else is handed to Pingora, with the bytes read so far put back: the first
//! request that is not plain (a body, an upgrade, HTTP/1.0, h2c, a route with filters,
//! timeouts, mirrors, policies or a non-HTTP/1 backend, any parse doubt) moves the connection
//! to Pingora for the rest of its life. Which routes qualify is decided once per snapshot
//! (`CompiledRoute::passthrough`).

use crate::conn::Buffered;
use crate::router::{Headers, Pick, Request};
use crate::server::{AccessLine, access_line};
use crate::table::SharedTable;
use coxswain_api::snapshot as snap;
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// Header lines a request or response may have on this path (more: Pingora takes it).
const MAX_HEADERS: usize = 64;
/// A request or response head larger than this is not handled here.
const MAX_HEAD: usize = 32 * 1024;
/// Idle upstream connections kept per backend address and worker.
const POOL_PER_ADDR: usize = 128;
/// Time to receive a request head (Pingora's default read timeout).
const HEAD_READ: Duration = Duration::from_secs(60);
/// An idle upstream connection older than this is closed rather than reused.
const POOL_IDLE: Duration = Duration::from_secs(60);

/// What the connection does after the fast path returns.
pub enum Next {
    /// The connection is finished (closed by either side, or an error).
    Closed,
    /// Pingora serves the rest: the unread request bytes have been put back.
    Pingora,
}

/// Serves requests from `conn` until one does not qualify or the connection ends.
pub async fn serve(
    conn: &mut Buffered,
    table: &SharedTable,
    port: u16,
    peer: SocketAddr,
    closing: &mut watch::Receiver<bool>,
    shutdown: &watch::Receiver<bool>,
) -> Next {
    let mut req: Vec<u8> = Vec::with_capacity(4096);
    let mut resp: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut first = true;
    loop {
        // Read until a whole request head is buffered.
        let head = loop {
            if !req.is_empty() {
                match parse_request(&req, table, port) {
                    Parsed::Partial if req.len() < MAX_HEAD => {}
                    Parsed::Partial | Parsed::Pingora => {
                        conn.unread(&req);
                        return Next::Pingora;
                    }
                    Parsed::Forward(f) => break f,
                }
            }
            if req.capacity() - req.len() < 1024 {
                req.reserve(4096);
            }
            // As Pingora: a request (the first, or one begun) must arrive within a minute;
            // between requests a keep-alive connection may idle until the listener closes.
            let idle = req.is_empty();
            let limit = (first || !idle).then_some(HEAD_READ);
            let read = conn.read_buf(&mut req);
            let read = async move {
                match limit {
                    Some(d) => tokio::time::timeout(d, read)
                        .await
                        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into())),
                    None => read.await,
                }
            };
            let read = if idle {
                tokio::select! {
                    r = read => r,
                    _ = closing.wait_for(|c| *c) => return Next::Closed,
                }
            } else {
                read.await
            };
            match read {
                Ok(0) | Err(_) => return Next::Closed,
                Ok(_) => {}
            }
        };
        let started = Instant::now();
        let outcome = exchange(conn, &req[..head.len], &head, &mut resp, table).await;
        let status = match outcome {
            Ok(Exchange { status, .. }) => status,
            Err(status) => status,
        };
        head.counters.record(status);
        if let Some(log) = &head.access_log {
            access_line(&AccessLine {
                client: Some(peer.ip()),
                method: &log.method,
                host: &log.host,
                path: &log.path,
                status,
                route: log.route.source.as_ref(),
                upstream: Some(head.upstream),
                duration_ms: started.elapsed().as_millis() as u64,
            });
        }
        match outcome {
            Ok(Exchange { keep_client, .. }) if keep_client && !*shutdown.borrow() => {
                req.drain(..head.len);
                first = false;
            }
            Ok(_) => {
                let _ = conn.flush().await;
                return Next::Closed;
            }
            Err(status) => {
                let _ = conn.write_all(error_response(status)).await;
                let _ = conn.flush().await;
                return Next::Closed;
            }
        }
    }
}

enum Parsed {
    /// More bytes are needed.
    Partial,
    /// Not for this path.
    Pingora,
    Forward(Forward),
}

/// A request this path forwards, and what it needs to know afterwards.
struct Forward {
    /// Length of the request head in the buffer.
    len: usize,
    upstream: SocketAddr,
    head_only: bool,
    counters: Arc<crate::metrics::RouteCounters>,
    /// Some when the route logs and the access log target is enabled.
    access_log: Option<AccessFields>,
}

/// What the access log line needs once the request buffer has moved on.
struct AccessFields {
    method: String,
    host: String,
    path: String,
    route: Arc<snap::Route>,
}

/// Headers as httparse leaves them, for the router.
struct ParsedHeaders<'a, 'b>(&'a [httparse::Header<'b>]);

impl Headers for ParsedHeaders<'_, '_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| visible(h.value))
    }
}

/// A header value as text when it is visible ASCII (what `http::HeaderValue::to_str` takes).
fn visible(v: &[u8]) -> Option<&str> {
    if v.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b)) {
        std::str::from_utf8(v).ok()
    } else {
        None
    }
}

fn parse_request(buf: &[u8], table: &SharedTable, port: u16) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut headers);
    let len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Pingora,
    };
    let (Some(method), Some(path), Some(1)) = (parsed.method, parsed.path, parsed.version) else {
        return Parsed::Pingora;
    };
    if !path.starts_with('/') || method == "CONNECT" {
        return Parsed::Pingora;
    }
    let mut host = None;
    for h in parsed.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("host") {
            if host.is_some() {
                return Parsed::Pingora;
            }
            match visible(h.value) {
                Some(v) => host = Some(v),
                None => return Parsed::Pingora,
            }
        } else if name.eq_ignore_ascii_case("content-length") {
            if h.value != b"0" {
                return Parsed::Pingora;
            }
        } else if name.eq_ignore_ascii_case("connection") {
            if !h.value.eq_ignore_ascii_case(b"keep-alive") {
                return Parsed::Pingora;
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("upgrade")
            || name.eq_ignore_ascii_case("expect")
        {
            return Parsed::Pingora;
        }
    }
    let Some(host) = host else {
        return Parsed::Pingora;
    };
    let guard = table.load();
    let request = Request {
        host,
        path_and_query: path,
        method,
        headers: &ParsedHeaders(parsed.headers),
    };
    let Some(route) = guard.router.route(port, &request) else {
        return Parsed::Pingora;
    };
    if !route.passthrough {
        return Parsed::Pingora;
    }
    let Pick::Endpoint { addr, .. } = route.pick() else {
        // Not reached: a passthrough route's backends all have endpoints. Pingora answers.
        return Parsed::Pingora;
    };
    let access_log = (route.policy.access_log
        && tracing::enabled!(target: "coxswain::access", tracing::Level::INFO))
    .then(|| AccessFields {
        method: method.to_owned(),
        host: host.to_owned(),
        path: path.split_once('?').map_or(path, |(p, _)| p).to_owned(),
        route: route.route.clone(),
    });
    Parsed::Forward(Forward {
        len,
        upstream: addr,
        head_only: method == "HEAD",
        counters: route.counters.clone(),
        access_log,
    })
}

struct Exchange {
    status: u16,
    /// The client connection can take another request.
    keep_client: bool,
}

impl Exchange {
    /// The response went (at least partly) out and the client connection ends with it.
    fn client_done(status: u16) -> Self {
        Self {
            status,
            keep_client: false,
        }
    }
}

/// Sends one request upstream and copies the response back. Err(status): nothing was sent
/// to the client, which gets that status.
async fn exchange(
    conn: &mut Buffered,
    request: &[u8],
    head: &Forward,
    resp: &mut Vec<u8>,
    table: &SharedTable,
) -> Result<Exchange, u16> {
    // A pooled connection the backend closed meanwhile fails on first use: once, a fresh one.
    let mut attempt = 0;
    let (mut upstream, sent) = loop {
        attempt += 1;
        let (mut up, reused) = match pool_take(head.upstream) {
            Some(up) => (up, true),
            None => match TcpStream::connect(head.upstream).await {
                Ok(up) => {
                    let _ = up.set_nodelay(true);
                    (up, false)
                }
                Err(e) => {
                    tracing::debug!(upstream = %head.upstream, error = %e, "connect failed");
                    return Err(502);
                }
            },
        };
        let sent = Instant::now();
        resp.clear();
        let ok = up.write_all(request).await.is_ok()
            && matches!(read_more(&mut up, resp).await, Ok(n) if n > 0);
        if ok {
            break (up, sent);
        }
        if !reused || attempt > 1 {
            return Err(502);
        }
    };
    // Response heads: 1xx interim ones are passed on, then the final one.
    let (status, head_len, framing, upstream_keep) = loop {
        match parse_response(resp, head.head_only) {
            Ok(Some((status, len, _, _))) if (100..200).contains(&status) => {
                // 101 answers an Upgrade, which this path never forwards.
                if status == 101 {
                    return Err(502);
                }
                if conn.write_all(&resp[..len]).await.is_err() {
                    return Ok(Exchange::client_done(status));
                }
                resp.drain(..len);
                if resp.is_empty()
                    && !matches!(read_more(&mut upstream, resp).await, Ok(n) if n > 0)
                {
                    return Err(502);
                }
            }
            Ok(Some(done)) => break done,
            Ok(None) if resp.len() < MAX_HEAD => {
                if !matches!(read_more(&mut upstream, resp).await, Ok(n) if n > 0) {
                    return Err(502);
                }
            }
            Ok(None) | Err(()) => return Err(502),
        }
    };
    table.metrics().upstream_latency(sent.elapsed());

    // The head and whatever body came with it, then the rest of the body as it arrives.
    let mut framing = framing;
    let mut pos = head_len;
    let complete;
    loop {
        let (end, done) = framing.advance(&resp[pos..]);
        let upto = pos + end;
        if conn.write_all(&resp[..upto]).await.is_err() {
            return Ok(Exchange::client_done(status));
        }
        if done {
            // Bytes past the response's end: the backend broke framing; do not reuse it.
            complete = upto == resp.len();
            break;
        }
        resp.clear();
        pos = 0;
        match read_more(&mut upstream, resp).await {
            Ok(n) if n > 0 => {}
            _ => {
                // End of stream: the end of a close-delimited body, else a truncated one.
                let _ = conn.flush().await;
                return Ok(Exchange::client_done(status));
            }
        }
    }
    if conn.flush().await.is_err() {
        return Ok(Exchange::client_done(status));
    }
    if complete && upstream_keep {
        pool_put(head.upstream, upstream);
    }
    Ok(Exchange {
        status,
        keep_client: framing.delimited(),
    })
}

/// Reads what is available into the spare capacity of `buf`.
async fn read_more(up: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(16 * 1024);
    }
    up.read_buf(buf).await
}

/// (status, head length, body framing, backend connection reusable); None: partial.
#[allow(clippy::type_complexity)]
fn parse_response(buf: &[u8], head_only: bool) -> Result<Option<(u16, usize, Framing, bool)>, ()> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut headers);
    let len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(()),
    };
    let status = parsed.code.ok_or(())?;
    if parsed.version != Some(1) {
        return Err(());
    }
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut keep = true;
    for h in parsed.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or(())?;
            if length.is_some_and(|l| l != v) {
                return Err(());
            }
            length = Some(v);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // Only a lone "chunked" is framed here; other codings end with the connection.
            chunked = h.value.eq_ignore_ascii_case(b"chunked");
            if !chunked {
                keep = false;
            }
        } else if h.name.eq_ignore_ascii_case("connection") {
            keep &= !h
                .value
                .split(|b| *b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
        }
    }
    let framing = if head_only || status == 204 || status == 304 || (100..200).contains(&status) {
        Framing::Length(0)
    } else if chunked {
        Framing::Chunked(Chunked::default())
    } else if let Some(l) = length {
        Framing::Length(l)
    } else {
        keep = false;
        Framing::UntilClose
    };
    Ok(Some((status, len, framing, keep)))
}

/// Where a response body ends.
#[derive(Debug)]
enum Framing {
    /// This many bytes remain.
    Length(u64),
    Chunked(Chunked),
    /// Until the backend closes; the client connection closes after it.
    UntilClose,
}

impl Framing {
    /// Of `bytes`, how many belong to this body, and whether the body ends within them.
    fn advance(&mut self, bytes: &[u8]) -> (usize, bool) {
        match self {
            Self::Length(left) => {
                let take = usize::try_from(*left)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                *left -= take as u64;
                (take, *left == 0)
            }
            Self::Chunked(c) => match c.feed(bytes) {
                Some(end) => (end, true),
                None => (bytes.len(), false),
            },
            Self::UntilClose => (bytes.len(), false),
        }
    }

    /// Whether the body's end is known from the message itself (so the client connection
    /// can carry on).
    fn delimited(&self) -> bool {
        !matches!(self, Self::UntilClose)
    }
}

/// Tracks chunked framing over bytes that are forwarded unchanged.
#[derive(Debug, Default)]
struct Chunked {
    state: ChunkState,
    size: u64,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Hex digits of a chunk size.
    #[default]
    Size,
    /// Chunk extensions, up to the line's LF.
    SizeLine,
    /// Chunk data: `size` bytes left.
    Data,
    /// The CR LF after chunk data.
    DataEnd,
    /// A trailer line (or the final empty line): at its start.
    TrailerStart,
    /// Inside a trailer line.
    Trailer,
    /// The CR of the final empty line was seen.
    FinalLf,
}

impl Chunked {
    /// Feeds bytes; Some(n): the message ends after the first `n` of them.
    fn feed(&mut self, bytes: &[u8]) -> Option<usize> {
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            match self.state {
                ChunkState::Size => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        let digit = (b as char).to_digit(16).unwrap_or(0);
                        self.size = self
                            .size
                            .saturating_mul(16)
                            .saturating_add(u64::from(digit));
                    }
                    b'\n' => self.end_size_line(),
                    _ => self.state = ChunkState::SizeLine,
                },
                ChunkState::SizeLine => {
                    if b == b'\n' {
                        self.end_size_line();
                    }
                }
                ChunkState::Data => {
                    let take = usize::try_from(self.size)
                        .unwrap_or(usize::MAX)
                        .min(bytes.len() - i);
                    self.size -= take as u64;
                    i += take;
                    if self.size == 0 {
                        self.state = ChunkState::DataEnd;
                    }
                    continue;
                }
                ChunkState::DataEnd => {
                    if b == b'\n' {
                        self.state = ChunkState::Size;
                        self.size = 0;
                    }
                }
                ChunkState::TrailerStart => match b {
                    b'\r' => self.state = ChunkState::FinalLf,
                    b'\n' => return Some(i + 1),
                    _ => self.state = ChunkState::Trailer,
                },
                ChunkState::Trailer => {
                    if b == b'\n' {
                        self.state = ChunkState::TrailerStart;
                    }
                }
                ChunkState::FinalLf => {
                    if b == b'\n' {
                        return Some(i + 1);
                    }
                    self.state = ChunkState::Trailer;
                }
            }
            i += 1;
        }
        None
    }

    fn end_size_line(&mut self) {
        self.state = if self.size == 0 {
            ChunkState::TrailerStart
        } else {
            ChunkState::Data
        };
    }
}

fn error_response(status: u16) -> &'static [u8] {
    match status {
        500 => b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\ncache-control: private, no-store\r\nconnection: close\r\n\r\n",
        503 => b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\ncache-control: private, no-store\r\nconnection: close\r\n\r\n",
        _ => b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\ncache-control: private, no-store\r\nconnection: close\r\n\r\n",
    }
}

thread_local! {
    /// Idle upstream connections of this worker, by backend address, most recent last.
    static POOL: RefCell<HashMap<SocketAddr, Vec<(TcpStream, Instant)>>> =
        RefCell::new(HashMap::new());
}

/// The most recently used idle connection to `addr` that still looks open.
fn pool_take(addr: SocketAddr) -> Option<TcpStream> {
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        let idle = pool.get_mut(&addr)?;
        while let Some((up, since)) = idle.pop() {
            if since.elapsed() > POOL_IDLE {
                continue;
            }
            // Readable while idle means closed (or a backend talking out of turn): drop it.
            // Without a readiness event this costs no syscall.
            let mut probe = [0u8; 1];
            match up.try_read(&mut probe) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Some(up),
                _ => continue,
            }
        }
        None
    })
}

fn pool_put(addr: SocketAddr, up: TcpStream) {
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        let idle = pool.entry(addr).or_default();
        if idle.len() >= POOL_PER_ADDR {
            idle.remove(0);
        }
        idle.push((up, Instant::now()));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked(input: &[u8]) -> Option<usize> {
        Chunked::default().feed(input)
    }

    #[test]
    fn chunked_framing_finds_the_end_across_any_split() {
        let body = b"4\r\nWiki\r\n5;ext=1\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nX-Trailer: 1\r\n\r\nNEXT";
        let end = body.len() - 4;
        assert_eq!(chunked(body), Some(end));
        for split in 0..body.len() {
            let mut c = Chunked::default();
            let (a, b) = body.split_at(split);
            match c.feed(a) {
                Some(n) => assert_eq!(n, end, "split at {split}"),
                None => assert_eq!(c.feed(b).map(|n| n + split), Some(end), "split at {split}"),
            }
        }
        assert_eq!(chunked(b"0\r\n\r\n"), Some(5));
        assert_eq!(chunked(b"0\n\n"), Some(3));
        assert_eq!(chunked(b"10\r\n0123456789abcdef\r\n"), None);
    }

    #[test]
    fn response_framing() {
        let parse = |r: &[u8], head| parse_response(r, head).unwrap().unwrap();
        let (status, len, framing, keep) =
            parse(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n", false);
        assert_eq!((status, len, keep), (200, 38, true));
        assert!(matches!(framing, Framing::Length(3)));
        let (_, _, framing, _) = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", true);
        assert!(matches!(framing, Framing::Length(0)), "HEAD has no body");
        let (_, _, framing, keep) = parse(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
            false,
        );
        assert!(matches!(framing, Framing::Chunked(_)));
        assert!(!keep);
        let (_, _, framing, keep) = parse(b"HTTP/1.1 200 OK\r\n\r\n", false);
        assert!(matches!(framing, Framing::UntilClose));
        assert!(!keep && !framing.delimited());
        let (_, _, framing, _) = parse(
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n",
            false,
        );
        assert!(matches!(framing, Framing::Length(0)));
        assert!(
            parse_response(
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
                false
            )
            .is_err()
        );
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", false).is_err());
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Le", false)
                .unwrap()
                .is_none()
        );
        let mut f = Framing::Length(5);
        assert_eq!(f.advance(b"abc"), (3, false));
        assert_eq!(f.advance(b"defgh"), (2, true));
    }

    #[test]
    fn header_values_are_text_only_when_visible_ascii() {
        assert_eq!(visible(b"a b\tc"), Some("a b\tc"));
        assert_eq!(visible(b"caf\xc3\xa9"), None);
        assert_eq!(visible(b"a\x01"), None);
    }
}
