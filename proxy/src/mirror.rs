//! RequestMirror: the request as the rule's filters leave it, body included, sent to a
//! mirror backend over a connection of its own; the answer is read and dropped. The main
//! request never waits for a mirror: body chunks are handed over without blocking, and a
//! mirror that falls behind (or whose request ends early) is abandoned.

use bytes::Bytes;
use pingora::http::RequestHeader;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Chunks a mirror may lag behind the main request before it is dropped.
const BACKLOG: usize = 64;
/// A mirror that has not finished by then is given up.
const DEADLINE: Duration = Duration::from_secs(10);

/// How the mirrored request frames its body.
#[derive(Clone, Copy)]
pub enum Framing {
    Empty,
    Length(u64),
    Chunked,
}

/// The body feed of one mirror: `Some(chunk)`, then `None` at the end. A feed dropped
/// without `None` aborts the mirrored request, so a backend never takes a cut body as whole.
pub type Tap = mpsc::Sender<Option<Bytes>>;

/// Verified TLS to a mirror's backend (BackendTLSPolicy), with the name to verify.
pub type TlsTo = (
    std::sync::Arc<rustls::ClientConfig>,
    rustls_pki_types::ServerName<'static>,
);

/// Starts a copy of `req` to `target`; returns the feed for its body (none when empty).
pub fn start(
    target: SocketAddr,
    tls: Option<TlsTo>,
    req: &RequestHeader,
    framing: Framing,
) -> Option<Tap> {
    let head = head(req, framing);
    let (tap, body) = match framing {
        Framing::Empty => (None, None),
        _ => {
            let (tx, rx) = mpsc::channel(BACKLOG);
            (Some(tx), Some(rx))
        }
    };
    tokio::spawn(async move {
        let copy = send(target, tls, head, body, matches!(framing, Framing::Chunked));
        let result = tokio::time::timeout(DEADLINE, copy)
            .await
            .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()));
        if let Err(e) = result {
            tracing::debug!(%target, error = %e, "mirror request failed");
        }
    });
    tap
}

async fn send(
    target: SocketAddr,
    tls: Option<TlsTo>,
    head: Vec<u8>,
    body: Option<mpsc::Receiver<Option<Bytes>>>,
    chunked: bool,
) -> std::io::Result<()> {
    let tcp = tokio::net::TcpStream::connect(target).await?;
    tcp.set_nodelay(true)?;
    match tls {
        None => copy(tcp, head, body, chunked).await,
        Some((config, name)) => {
            let s = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await?;
            copy(s, head, body, chunked).await
        }
    }
}

async fn copy<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    head: Vec<u8>,
    body: Option<mpsc::Receiver<Option<Bytes>>>,
    chunked: bool,
) -> std::io::Result<()> {
    s.write_all(&head).await?;
    if let Some(mut body) = body {
        loop {
            match body.recv().await {
                Some(Some(chunk)) if chunked => {
                    // An empty chunk would end the body early.
                    if !chunk.is_empty() {
                        s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                            .await?;
                        s.write_all(&chunk).await?;
                        s.write_all(b"\r\n").await?;
                    }
                }
                Some(Some(chunk)) => s.write_all(&chunk).await?,
                Some(None) => {
                    if chunked {
                        s.write_all(b"0\r\n\r\n").await?;
                    }
                    break;
                }
                None => {
                    return Err(std::io::Error::other("the request body was cut short"));
                }
            }
        }
    }
    let mut sink = [0u8; 4096];
    while s.read(&mut sink).await? > 0 {}
    Ok(())
}

/// The HTTP/1.1 request head: the request's headers minus hop-by-hop ones, then framing
/// of our own and `connection: close`.
fn head(req: &RequestHeader, framing: Framing) -> Vec<u8> {
    let mut head = Vec::with_capacity(512);
    let path = req.uri.path_and_query().map_or("/", |p| p.as_str());
    head.extend_from_slice(req.method.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(path.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &req.headers {
        if matches!(
            name.as_str(),
            "connection"
                | "content-length"
                | "transfer-encoding"
                | "keep-alive"
                | "proxy-connection"
                | "te"
                | "upgrade"
        ) {
            continue;
        }
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    if req.headers.get("host").is_none()
        && let Some(a) = req.uri.authority()
    {
        head.extend_from_slice(b"host: ");
        head.extend_from_slice(a.as_str().as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    match framing {
        Framing::Empty => head.extend_from_slice(b"content-length: 0\r\n"),
        Framing::Length(n) => head.extend_from_slice(format!("content-length: {n}\r\n").as_bytes()),
        Framing::Chunked => head.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    head.extend_from_slice(b"connection: close\r\n\r\n");
    head
}
