//! Real sockets for the proxy's integration tests: echo backends, a proxy in standalone mode
//! serving a snapshot file, and an HTTP client.
#![allow(dead_code, clippy::unwrap_used)]

pub mod bodies;
pub mod http2;
#[path = "../../../test/testenv/src/ports.rs"]
mod ports;

use bytes::Bytes;
use coxswain_api::snapshot::Snapshot;
use coxswain_proxy::standalone::{self, StandaloneConfig};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_rustls::TlsConnector;

/// A loopback port for a server a test starts, never one `bind(0)` could take meanwhile.
pub use ports::free_port;

/// An HTTP backend (HTTP/1.1 and h2c) that answers with what it received, as JSON, and names
/// itself in `x-backend`. `/slow` answers after a second, `?delay_ms=N` after N ms.
pub async fn echo_backend(name: &'static str) -> SocketAddr {
    echo_backend_with_hits(name).await.0
}

/// An echo backend and the number of requests it has received.
pub async fn echo_backend_with_hits(
    name: &'static str,
) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = hits.clone();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    async move {
                        if req.uri().path() == "/slow" {
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        // `?delay_ms=N` anywhere: answer after N milliseconds.
                        if let Some(ms) = req.uri().query().and_then(|q| {
                            q.split('&')
                                .find_map(|kv| kv.strip_prefix("delay_ms="))
                                .and_then(|v| v.parse::<u64>().ok())
                        }) {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                        }
                        // Repeated headers are joined with ", ", as HTTP allows.
                        let mut headers = serde_json::Map::new();
                        for name in req.headers().keys() {
                            let values: Vec<&str> = req
                                .headers()
                                .get_all(name)
                                .iter()
                                .map(|v| v.to_str().unwrap_or(""))
                                .collect();
                            headers.insert(name.to_string(), values.join(", ").into());
                        }
                        let body = serde_json::json!({
                            "backend": name,
                            "method": req.method().as_str(),
                            "path": req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/"),
                            "version": format!("{:?}", req.version()),
                            "headers": headers,
                        });
                        Ok::<_, std::convert::Infallible>(
                            Response::builder()
                                .header("x-backend", name)
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(body.to_string())))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, hits)
}

/// A proxy in standalone mode on a snapshot file.
pub struct Proxy {
    pub dir: tempfile::TempDir,
    pub file: PathBuf,
    pub admin: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(snapshot: &Snapshot) -> Self {
        Self::start_with(snapshot, Default::default()).await
    }

    /// Replaces the snapshot file (write to a temporary name, then rename: atomic).
    pub fn update(&self, snapshot: &Snapshot) {
        write_snapshot(&self.file, snapshot);
    }

    /// Waits until the proxy serves `version` (from /metrics) on every port it asks for: a
    /// port the proxy could not bind fails the test here, not as odd answers later.
    pub async fn wait_ready(&self, version: &str) {
        self.wait_loaded(version).await;
        let unbound = self.metric("coxswain_proxy_listeners_unbound").await;
        assert_eq!(
            unbound, 0,
            "the proxy could not bind {unbound} of its ports"
        );
    }

    /// Waits until the proxy serves `version` (from /metrics), bound or not.
    pub async fn wait_loaded(&self, version: &str) {
        let url = format!("http://{}/metrics", self.admin);
        for _ in 0..250 {
            if let Ok(r) = get(&url, &[]).await
                && r.body.contains(version)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("proxy did not load snapshot {version}");
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.task).await;
    }
}

pub fn write_snapshot(file: &std::path::Path, snapshot: &Snapshot) {
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(snapshot).unwrap()).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

pub struct Reply {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// One HTTP/1.1 request; `headers` may set Host.
pub async fn get(url: &str, headers: &[(&str, &str)]) -> Result<Reply, String> {
    request(&client(), "GET", url, headers).await
}

pub async fn request(
    client: &Client<HttpConnector, Full<Bytes>>,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<Reply, String> {
    let mut b = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = client
        .request(b.body(Full::new(Bytes::new())).unwrap())
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// As [`request`], with a body.
pub async fn request_with_body(
    client: &Client<HttpConnector, Full<Bytes>>,
    method: &str,
    url: &str,
    body: Vec<u8>,
) -> Result<Reply, String> {
    let req = Request::builder()
        .method(method)
        .uri(url)
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = client.request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

pub fn shared_client() -> Client<HttpConnector, Full<Bytes>> {
    client()
}

/// A sealed snapshot from YAML with `{NAME}` placeholders replaced.
pub fn snapshot(yaml: &str, vars: &[(&str, String)]) -> Snapshot {
    let mut text = yaml.to_owned();
    for (k, v) in vars {
        text = text.replace(&format!("{{{k}}}"), v);
    }
    Snapshot::from_yaml(&text).unwrap().seal().into_snapshot()
}

/// What a recording backend received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

/// A backend that answers 200 to everything and reports each request, body included.
pub async fn recording_backend() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Recorded>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let tx = tx.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await?.to_bytes();
                        let _ = tx.send(Recorded {
                            method: parts.method.to_string(),
                            path: parts
                                .uri
                                .path_and_query()
                                .map_or("/", |p| p.as_str())
                                .into(),
                            headers: parts.headers,
                            body,
                        });
                        Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, rx)
}

impl Proxy {
    /// A proxy serving `snapshot` under these limits.
    pub async fn start_with(snapshot: &Snapshot, limits: coxswain_proxy::limits::Limits) -> Self {
        let proxy = Self::launch(snapshot, limits).await;
        proxy.wait_ready(&snapshot.version).await;
        proxy
    }

    /// A proxy started on `snapshot` once it has loaded it, whether or not it bound its ports.
    pub async fn launch(snapshot: &Snapshot, limits: coxswain_proxy::limits::Limits) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("snapshot.json");
        write_snapshot(&file, snapshot);
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let (tx, rx) = oneshot::channel();
        let config = StandaloneConfig {
            snapshot_file: file.clone(),
            bind_ip: "127.0.0.1".parse().unwrap(),
            admin_addr: admin,
            poll: Duration::from_millis(20),
            drain: Duration::from_secs(5),
            threads: 2,
            limits,
        };
        let task = tokio::spawn(async move {
            standalone::serve(config, async {
                let _ = rx.await;
            })
            .await
            .unwrap();
        });
        let proxy = Self {
            dir,
            file,
            admin,
            stop: Some(tx),
            task,
        };
        proxy.wait_loaded(&snapshot.version).await;
        proxy
    }

    /// The value of an unlabelled metric once `ready` holds for it (within 5 s).
    pub async fn metric_eventually(&self, name: &str, ready: impl Fn(u64) -> bool) -> u64 {
        for _ in 0..250 {
            let v = self.metric(name).await;
            if ready(v) {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{name} did not reach the expected value");
    }

    /// The value of an unlabelled metric.
    pub async fn metric(&self, name: &str) -> u64 {
        let r = get(&format!("http://{}/metrics", self.admin), &[])
            .await
            .unwrap();
        r.body
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no metric {name}"))
    }
}

/// A request as a raw backend received it: the connection it came on (numbered from 0),
/// the head's bytes exactly, and its path.
#[derive(Debug, Clone)]
pub struct RawSeen {
    pub conn: usize,
    pub head: Vec<u8>,
    pub method: String,
    pub path: String,
}

/// What a raw backend does with a request.
pub enum RawAnswer {
    /// Write these bytes; the connection stays open.
    Send(Vec<u8>),
    /// Write these bytes, then close.
    SendClose(Vec<u8>),
    /// Close without answering.
    Close,
    /// Write the first part, wait to be notified, write the second, then close.
    Stream(Vec<u8>, std::sync::Arc<tokio::sync::Notify>, Vec<u8>),
}

/// A backend that speaks HTTP/1 by hand, so it can misbehave on purpose. It reads each request
/// head (and a Content-Length body), reports it, and answers as `answer` says. Like some real
/// servers, it answers an empty line before a request with a keep-alive 400 of its own.
/// Returns its address, what it saw, and how many of its connections the proxy has closed.
pub async fn raw_backend<F>(
    answer: F,
) -> (
    SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<RawSeen>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
)
where
    F: Fn(&RawSeen) -> RawAnswer + Send + Sync + 'static,
{
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let closed = Arc::new(AtomicUsize::new(0));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answer = Arc::new(answer);
    let counter = closed.clone();
    tokio::spawn(async move {
        let mut next_conn = 0;
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            let conn = next_conn;
            next_conn += 1;
            let (tx, answer, closed) = (tx.clone(), answer.clone(), counter.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // An empty line first: answered on its own, connection kept.
                    if buf.starts_with(b"\r\n") {
                        buf.drain(..2);
                        let bad = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 3\r\n\r\nbad";
                        if s.write_all(bad).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => {
                                closed.fetch_add(1, Ordering::SeqCst);
                                return;
                            }
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head: Vec<u8> = buf.drain(..end + 4).collect();
                    let text = String::from_utf8_lossy(&head).into_owned();
                    let mut words = text.split(' ');
                    let method = words.next().unwrap_or("").to_owned();
                    let path = words.next().unwrap_or("").to_owned();
                    let length: usize = text
                        .lines()
                        .find_map(|l| {
                            let (n, v) = l.split_once(':')?;
                            n.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse().ok())?
                        })
                        .unwrap_or(0);
                    let chunked = text.lines().any(|l| {
                        l.split_once(':').is_some_and(|(n, v)| {
                            n.eq_ignore_ascii_case("transfer-encoding")
                                && v.trim().eq_ignore_ascii_case("chunked")
                        })
                    });
                    // The body: Content-Length bytes, or chunks up to the last one.
                    loop {
                        let end = if chunked {
                            chunked_end(&buf)
                        } else {
                            (buf.len() >= length).then_some(length)
                        };
                        if let Some(end) = end {
                            buf.drain(..end);
                            break;
                        }
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let seen = RawSeen {
                        conn,
                        head,
                        method,
                        path,
                    };
                    let reply = answer(&seen);
                    let _ = tx.send(seen);
                    match reply {
                        RawAnswer::Send(b) => {
                            if s.write_all(&b).await.is_err() {
                                return;
                            }
                        }
                        RawAnswer::SendClose(b) => {
                            let _ = s.write_all(&b).await;
                            return;
                        }
                        RawAnswer::Close => return,
                        RawAnswer::Stream(first, go, rest) => {
                            let _ = s.write_all(&first).await;
                            go.notified().await;
                            let _ = s.write_all(&rest).await;
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, rx, closed)
}

/// Sends raw bytes on a new connection and reads until the proxy closes it (at most `wait`).
/// Returns what was read and whether the connection was closed by the proxy.
pub async fn raw_exchange(port: u16, request: &[u8], wait: Duration) -> (Vec<u8>, bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(request).await.unwrap();
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let mut buf = [0u8; 4096];
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (got, true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (got, false),
        }
    }
}

/// The status code of the first response in `bytes`.
pub fn status_of(bytes: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(bytes.get(..12)?).ok()?;
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// Where a chunked body at the start of `buf` ends (None: not all there yet). No trailers.
fn chunked_end(buf: &[u8]) -> Option<usize> {
    let mut at = 0;
    loop {
        let line = buf[at..].windows(2).position(|w| w == b"\r\n")?;
        let size_text = String::from_utf8_lossy(&buf[at..at + line]).into_owned();
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        let next = at + line + 2 + size + 2;
        if buf.len() < next {
            return None;
        }
        at = next;
        if size == 0 {
            return Some(at);
        }
    }
}

// TLS for tests: self-signed certificates and a client that accepts any.

/// Accepts any certificate: the test compares the presented certificate itself.
#[derive(Debug)]
pub struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

pub fn connector(alpn: &[&[u8]]) -> TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsConnector::from(Arc::new(config))
}

/// As [`connector`], presenting this client certificate (chain and key, PEM) when asked.
pub fn connector_with_client_cert(alpn: &[&[u8]], chain_pem: &str, key_pem: &str) -> TlsConnector {
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        .with_client_auth_cert(chain, key)
        .unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsConnector::from(Arc::new(config))
}

pub struct Cert {
    pub pem: String,
    pub key: String,
    pub der: Vec<u8>,
}

pub fn cert(name: &str) -> Cert {
    let c = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
    Cert {
        pem: c.cert.pem(),
        key: c.signing_key.serialize_pem(),
        der: c.cert.der().to_vec(),
    }
}

/// A certificate authority for client certificates.
pub struct Ca {
    pub pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

pub fn ca() -> Ca {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer: rcgen::Issuer::new(params, key),
    }
}

/// A client certificate `ca` issued: (chain PEM, key PEM).
pub fn client_of(ca: &Ca) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["client.example".to_owned()]).unwrap();
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// YAML double-quoted scalars keep PEM newlines as \n.
pub fn yaml_escape(pem: &str) -> String {
    pem.replace('\n', "\\n")
}

/// A keep-alive HTTP/1.1 connection to the proxy from a loopback address of its own (127.0.0.2,
/// .3, ...: a client address as a real client has), in clear or over TLS (SNI gw.example).
pub struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

/// An answer read by [`Conn`]: `body` as JSON when it is JSON (the echo backend's), else Null.
pub struct Answer {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: serde_json::Value,
    pub raw: Bytes,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Conn {
    pub async fn connect(from: [u8; 4], port: u16, tls: bool) -> Self {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((from, 0))).unwrap();
        let tcp = socket
            .connect(SocketAddr::from(([127, 0, 0, 1], port)))
            .await
            .unwrap();
        let sender = if tls {
            let stream = connector(&[b"http/1.1"])
                .connect(ServerName::try_from("gw.example").unwrap(), tcp)
                .await
                .unwrap();
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .unwrap();
            tokio::spawn(conn);
            sender
        } else {
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                .await
                .unwrap();
            tokio::spawn(conn);
            sender
        };
        Self { sender }
    }

    pub async fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> Answer {
        self.send("GET", path, headers, Bytes::new()).await
    }

    /// One request with Host gw.example; a non-empty body goes with its Content-Length.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Answer {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "gw.example");
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        self.sender.ready().await.unwrap();
        let resp = self
            .sender
            .send_request(req.body(Full::new(body)).unwrap())
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let raw = resp.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            headers,
            body: serde_json::from_slice(&raw).unwrap_or(serde_json::Value::Null),
            raw,
        }
    }
}

/// The two HTTP engines a test runs on: (`Limits::fast_path`, its name for messages).
pub fn engines() -> [(bool, &'static str); 2] {
    [(true, "fast path"), (false, "pingora")]
}
