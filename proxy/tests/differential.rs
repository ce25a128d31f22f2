//! The two HTTP engines must agree: the same generated requests go through a proxy whose
//! HTTP/1 requests may take the fast path and through one that sends every request through
//! Pingora, on the same snapshot and the same backend, in clear and over TLS. Each pair must get the same
//! status, the same body, the same Location, and the backend must have received the same
//! request (it answers with a canonical form of what it got, so that is part of the body).
//!
//! `COXSWAIN_DIFF_SEED` replays a run; `COXSWAIN_DIFF_REQUESTS` changes its size.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use bytes::Bytes;
use coxswain_proxy::forwarded::ClientAddress;
use coxswain_proxy::limits::Limits;
use coxswain_proxy::policy::AddressSet;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// The server name the TLS clients ask for: one of the HTTPS listener's hostnames, so
/// requests for the other (`*.wild.example`) are misdirected (421) on both engines.
const SNI: &str = "a.example";

const ROUTES: &str = r#"
listeners:
- port: {PORT}
  protocol: {PROTOCOL}
{LISTENER_TLS}
  virtualHosts:
  - hostname: a.example
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: exact, rule: 0}
      match: {path: {kind: KIND_EXACT, value: /exact}}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: admin, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /admin}}
      clientAllowlist: {cidrs: [{address: 10.0.0.0, prefixLen: 8}]}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: old, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /old}}
      filters:
      - kind: {requestRedirect: {scheme: https, statusCode: 301}}
    - source: {kind: HTTPRoute, namespace: t, name: gone, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /gone}}
      directStatus: 410
    - source: {kind: HTTPRoute, namespace: t, name: header, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /p}, headers: [{name: x-match, value: "yes"}]}
      filters:
      - kind: {requestHeaderModifier: {set: [{name: x-added, value: "1"}]}}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: method, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /p}, method: DELETE}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: query, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /p}, queryParams: [{name: q, value: "1"}]}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: prefix, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /p}}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: small, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /small}}
      maxRequestBodyBytes: 3
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: empty, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /empty}}
      backends: [{cluster: "t/none:80", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: auth, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /auth}}
      basicAuth: {realm: diff, users: ["u:{PLAIN}pw"]}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: edit, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /edit}}
      filters:
      - kind: {requestHeaderModifier: {set: [{name: X-Custom, value: set}, {name: x-forwarded-proto, value: edited}], add: [{name: x-added, value: "1"}], remove: [authorization]}}
      - kind: {responseHeaderModifier: {set: [{name: x-served-by, value: edge}], add: [{name: x-answer, value: rule}], remove: [x-backend]}}
      backends:
      - cluster: "t/a:80"
        weight: 1
        filters:
        - kind: {requestHeaderModifier: {add: [{name: x-added, value: "2"}]}}
        - kind: {responseHeaderModifier: {add: [{name: x-answer, value: backend}], set: [{name: content-type, value: text/edited}]}}
    - source: {kind: HTTPRoute, namespace: t, name: moved, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /rw}}
      filters:
      - kind: {urlRewrite: {hostname: inner.example, path: {kind: {replacePrefixMatch: /new}}}}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: whole, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /full}}
      filters:
      - kind: {requestHeaderModifier: {set: [{name: host, value: first.example}]}}
      - kind: {urlRewrite: {hostname: second.example, path: {kind: {replaceFullPath: /whole}}}}
      backends:
      - cluster: "t/a:80"
        weight: 1
        filters:
        - kind: {urlRewrite: {path: {kind: {replacePrefixMatch: /again}}}}
    - source: {kind: Ingress, namespace: t, name: re, rule: 0}
      match: {path: {kind: KIND_REGEX, value: "(?i:/re(/|$)(.*)).*"}}
      filters:
      - kind: {urlRewrite: {path: {kind: {replaceRegexMatch: "/$2"}}}}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: cors, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /cors}}
      filters:
      - kind: {cors: {allowOrigins: ["https://app.example", "https://*.example.com"], allowMethods: [GET, POST], allowHeaders: [X-Token], exposeHeaders: [X-Backend], allowCredentials: true, maxAgeSeconds: 600}}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: anycors, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /anycors}}
      filters:
      - kind: {cors: {allowOrigins: ["*"], allowMethods: ["*"], allowHeaders: ["*"], maxAgeSeconds: 5}}
      - kind: {responseHeaderModifier: {add: [{name: x-answer, value: cors}]}}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: sticky, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /sticky}}
      sessionPersistence: {kind: COOKIE, name: app-session, maxAgeS: 60, path: /sticky}
      filters:
      - kind: {responseHeaderModifier: {add: [{name: x-answer, value: sticky}]}}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: stuck, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /stuck}}
      sessionPersistence: {kind: HEADER, name: X-Session}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: Ingress, namespace: t, name: again, rule: 0}
      match: {path: {kind: KIND_PREFIX, value: /again}}
      retry: {codes: [503], attempts: 2, nonIdempotent: true}
      backends: [{cluster: "t/a:80", weight: 1}]
    - source: {kind: HTTPRoute, namespace: t, name: rest, rule: 0}
      backends: [{cluster: "t/a:80", weight: 1}]
  - hostname: "*.wild.example"
    routes:
    - source: {kind: HTTPRoute, namespace: t, name: wild, rule: 0}
      backends: [{cluster: "t/a:80", weight: 1}]
clusters:
- name: t/a:80
  endpoints: [{address: 127.0.0.1, port: {A}, ready: true}]
- name: t/none:80
  endpoints: []
requires: [basic-auth]
{CERTIFICATES}
"#;

/// Headers the engines may legitimately treat differently on the way: framing the proxy
/// sets itself. Hop-by-hop fields are compared: neither engine may forward them.
const HOP: [&str; 2] = ["transfer-encoding", "content-length"];

/// The backend's answer: the request line and the end-to-end headers it received, sorted.
/// X-Forwarded-Port names the listener, which differs between the two proxies: one of
/// `listeners` is written as "<listener>".
fn canonical(head: &[u8], listeners: [u16; 2]) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or("").to_owned();
    let mut headers: Vec<String> = lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| {
            let (n, v) = l.split_once(':')?;
            let n = n.trim().to_ascii_lowercase();
            let v = v.trim();
            let v = if n == "x-forwarded-port" && listeners.iter().any(|p| p.to_string() == v) {
                "<listener>"
            } else {
                v
            };
            (!HOP.contains(&n.as_str())).then(|| format!("{n}: {v}"))
        })
        .collect();
    headers.sort();
    let mut out = request_line.into_bytes();
    for h in headers {
        out.extend_from_slice(b"\n");
        out.extend_from_slice(h.as_bytes());
    }
    out
}

/// xorshift64*: a seeded sequence, so a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn word(&mut self, items: &[&'static str]) -> &'static str {
        items[self.below(items.len())]
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
    /// With `percent` chance, one of `values` as a header line after `prefix` (a field name
    /// and its colon, or nothing when the values are whole lines).
    fn field(&mut self, req: &mut Vec<u8>, percent: usize, prefix: &str, values: &[&'static str]) {
        if self.chance(percent) {
            let value = self.word(values);
            req.extend_from_slice(format!("{prefix}{value}\r\n").as_bytes());
        }
    }
}

/// One generated request, as raw bytes. `session`: the backend's endpoint name, as session
/// persistence writes it.
fn generate(rng: &mut Rng, session: &str) -> Vec<u8> {
    const METHODS: [&str; 7] = ["GET", "GET", "GET", "HEAD", "DELETE", "OPTIONS", "POST"];
    const SEGMENTS: [&str; 30] = [
        "admin", "p", "x", "..", ".", "", "%61dmin", "%2e%2e", "a%2fb", "exact", "old", "gone",
        "small", "empty", "%7E", "a.b", "P", "%41", "q=1", "auth", "edit", "rw", "full", "re",
        "cors", "anycors", "sticky", "stuck", "again", "busy",
    ];
    const HOSTS: [&str; 8] = [
        "a.example",
        "A.Example",
        "a.example:80",
        "a.example.",
        "x.wild.example",
        "y.x.wild.example",
        "other.example",
        "bad host",
    ];
    let method = rng.word(&METHODS);
    let mut target = String::new();
    for _ in 0..=rng.below(4) {
        target.push('/');
        target.push_str(rng.word(&SEGMENTS));
    }
    if rng.chance(25) {
        target.push('?');
        target.push_str(rng.word(&["q=1", "q=2", "a=b&q=1", "x=%2e", ""]));
    }
    if rng.chance(10) {
        target.push_str(rng.word(&["#frag", "#", "#/../admin"]));
    }
    let mut req = Vec::new();
    if rng.chance(5) {
        req.extend_from_slice(b"\r\n");
    }
    let version = if rng.chance(5) {
        "HTTP/1.0"
    } else {
        "HTTP/1.1"
    };
    req.extend_from_slice(format!("{method} {target} {version}\r\n").as_bytes());
    if !rng.chance(3) {
        req.extend_from_slice(format!("Host: {}\r\n", rng.word(&HOSTS)).as_bytes());
    }
    if rng.chance(2) {
        req.extend_from_slice(b"Host: second.example\r\n");
    }
    if rng.chance(30) {
        req.extend_from_slice(format!("x-match: {}\r\n", rng.word(&["yes", "no"])).as_bytes());
    }
    if rng.chance(10) {
        req.extend_from_slice(b"X-Custom: Value\r\nx-custom: second\r\n");
    }
    // Credentials for /auth ("u:pw"), wrong ones, and schemes that are not Basic.
    rng.field(
        &mut req,
        20,
        "Authorization: ",
        &[
            "Basic dTpwdw==",
            "basic dTpwdw==",
            "Basic dTp4",
            "Basic !!",
            "Bearer dTpwdw==",
        ],
    );
    // Forwarded fields, believed or not depending on the proxy's trusted blocks; an address
    // in 10/8 opens the allowlisted /admin when it is believed.
    rng.field(
        &mut req,
        30,
        "X-Forwarded-For: ",
        &[
            "10.1.2.3",
            "192.0.2.1",
            "10.1.2.3, 127.0.0.5",
            "garbage, 10.2.3.4",
            "[2001:db8::1]:80",
            "",
        ],
    );
    if rng.chance(10) {
        req.extend_from_slice(b"x-forwarded-for: 10.9.9.9\r\n");
    }
    rng.field(
        &mut req,
        15,
        "",
        &[
            "X-Forwarded-Proto: https",
            "X-Forwarded-Host: other.example",
            "X-Forwarded-Port: 8443",
            "X-Real-IP: 6.6.6.6",
            "Forwarded: for=192.0.2.60;proto=http",
        ],
    );
    if method == "OPTIONS" && rng.chance(50) {
        req.extend_from_slice(
            b"Origin: https://app.example\r\nAccess-Control-Request-Method: GET\r\n",
        );
        rng.field(
            &mut req,
            50,
            "Access-Control-Request-Headers: ",
            &["X-Token", "x-other, x-token"],
        );
    } else {
        // Origins the CORS routes allow, one matching a wildcard, and ones they do not.
        rng.field(
            &mut req,
            25,
            "Origin: ",
            &[
                "https://app.example",
                "https://api.example.com",
                "https://evil.example",
                "https://a.b.example.com/path",
                "null",
            ],
        );
    }
    // A client that would hold its body back for a 100 Continue (this one sends it at once),
    // and an expectation no one knows.
    rng.field(
        &mut req,
        10,
        "Expect: ",
        &["100-continue", "100-Continue", "100-continue", "x-other"],
    );
    // Sessions naming the backend, or no endpoint of it.
    if rng.chance(60) {
        let field = match rng.below(7) {
            0 | 1 => format!("Cookie: app-session={session}"),
            2 => format!("Cookie: a=1; app-session={session}; b=2"),
            3 => "Cookie: app-session=00000000deadbeef".to_owned(),
            4 | 5 => format!("X-Session: {session}"),
            _ => "X-Session: not-an-endpoint".to_owned(),
        };
        req.extend_from_slice(field.as_bytes());
        req.extend_from_slice(b"\r\n");
    }
    let body: &[u8] = match rng.below(10) {
        0 => b"Content-Length: 5\r\n\r\nhello",
        1 => b"Content-Length: 0\r\n\r\n",
        2 if method == "POST" => b"Transfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
        3 if rng.chance(20) => b"Content-Length: +1\r\n\r\nx",
        4 if rng.chance(20) => b"Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        _ => b"\r\n",
    };
    if version == "HTTP/1.1" {
        // This hop's own options, which neither engine forwards, and one (an upgrade with no
        // Upgrade) that goes on as it came.
        rng.field(
            &mut req,
            30,
            "Connection: ",
            &[
                "keep-alive",
                "keep-alive",
                "close",
                "Keep-Alive, Close",
                "upgrade",
            ],
        );
    }
    // Fields about this hop alone, which must not reach the backend on either engine (the
    // proxy's own credentials above all).
    rng.field(
        &mut req,
        20,
        "",
        &[
            "Keep-Alive: timeout=5",
            "Proxy-Connection: keep-alive",
            "Proxy-Authorization: Basic dTpwdw==",
            "Trailer: x-checksum",
            "HTTP2-Settings: AAMAAABkAAQAAP__",
        ],
    );
    req.extend_from_slice(body);
    req
}

/// The request's Connection field has the `close` option.
fn asks_close(req: &[u8]) -> bool {
    String::from_utf8_lossy(req).split("\r\n").any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.eq_ignore_ascii_case("connection")
                && value
                    .split(',')
                    .any(|o| o.trim().eq_ignore_ascii_case("close"))
        })
    })
}

/// What a client saw of one response.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    status: u16,
    location: Option<String>,
    /// WWW-Authenticate and Retry-After: the answers the request layer decides with a field.
    challenge: Option<String>,
    retry_after: Option<String>,
    /// The fields the /edit route's response header modifiers and the CORS routes touch,
    /// every value in order.
    edited: Vec<String>,
    body: Vec<u8>,
    /// The answer said `connection: close`, and the proxy then closed the connection.
    closed: bool,
}

/// The response fields the /edit route's modifiers touch, by name (stable: the values of one
/// name stay in the order they came, which the engines must agree on; where a new field lands
/// among the others is theirs to choose).
fn edited_fields(head: &str) -> Vec<String> {
    let mut fields: Vec<(String, String)> = head
        .split("\r\n")
        .skip(1)
        .filter_map(|l| {
            let (n, v) = l.split_once(':')?;
            let n = n.trim().to_ascii_lowercase();
            let cors = n.starts_with("access-control-") || n == "vary";
            let edited = [
                "x-served-by",
                "x-answer",
                "x-backend",
                "content-type",
                "set-cookie",
                "x-session",
            ];
            (cors || edited.contains(&n.as_str())).then(|| (n, v.trim().to_owned()))
        })
        .collect();
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    fields
        .into_iter()
        .map(|(n, v)| format!("{n}: {v}"))
        .collect()
}

/// A client connection, in clear or over TLS.
trait Duplex: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Duplex for T {}

/// A keep-alive client connection to one proxy, reopened when the proxy closes it.
struct Client {
    port: u16,
    tls: bool,
    conn: Option<Box<dyn Duplex>>,
    buf: Vec<u8>,
}

impl Client {
    fn new(port: u16, tls: bool) -> Self {
        Self {
            port,
            tls,
            conn: None,
            buf: Vec::new(),
        }
    }

    async fn connect(&self) -> Box<dyn Duplex> {
        let tcp = TcpStream::connect(("127.0.0.1", self.port)).await.unwrap();
        if !self.tls {
            return Box::new(tcp);
        }
        let name = rustls::pki_types::ServerName::try_from(SNI).unwrap();
        Box::new(connector(&[b"http/1.1"]).connect(name, tcp).await.unwrap())
    }

    async fn send(&mut self, req: &[u8], head_only: bool) -> Result<Seen, String> {
        // A new connection per request would leave tens of thousands of sockets in
        // TIME_WAIT; a connection the proxy closed after its last answer is reopened.
        for attempt in 0..2 {
            if self.conn.is_none() {
                self.conn = Some(self.connect().await);
                self.buf.clear();
            }
            let conn = self.conn.as_mut().unwrap();
            if conn.write_all(req).await.is_err() || conn.flush().await.is_err() {
                self.conn = None;
                continue;
            }
            match read_response(conn, &mut self.buf, head_only).await {
                Ok((seen, keep)) => {
                    if !keep {
                        self.conn = None;
                    }
                    return Ok(seen);
                }
                Err(e) if attempt == 0 && e == "closed before a response" => {
                    self.conn = None;
                }
                Err(e) => {
                    self.conn = None;
                    return Err(e);
                }
            }
        }
        Err("no connection".into())
    }
}

/// Reads one response (Content-Length or chunked framed, or until close).
async fn read_response(
    conn: &mut Box<dyn Duplex>,
    buf: &mut Vec<u8>,
    head_only: bool,
) -> Result<(Seen, bool), String> {
    let fill = async |conn: &mut Box<dyn Duplex>, buf: &mut Vec<u8>| -> Result<bool, String> {
        let mut chunk = [0u8; 8192];
        match tokio::time::timeout(Duration::from_secs(10), conn.read(&mut chunk)).await {
            Err(_) => Err("timed out".into()),
            // A TLS peer that closes without close_notify: the end of the connection.
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(0)) => Ok(false),
            Ok(Ok(n)) => {
                buf.extend_from_slice(&chunk[..n]);
                Ok(true)
            }
        }
    };
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if !fill(conn, buf).await? {
            return Err(if buf.is_empty() {
                "closed before a response".into()
            } else {
                "closed inside a response head".into()
            });
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    buf.drain(..head_end);
    let status: u16 = head
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line: {head:?}"))?;
    let header = |name: &str| {
        head.split("\r\n").skip(1).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    };
    let close = header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
    let mut body = Vec::new();
    let mut keep = !close;
    if head_only || status == 204 || status == 304 {
        // No body.
    } else if let Some(len) = header("content-length") {
        let len: usize = len.parse().map_err(|_| format!("bad length in {head:?}"))?;
        while buf.len() < len {
            if !fill(conn, buf).await? {
                return Err("closed inside a body".into());
            }
        }
        body = buf.drain(..len).collect();
    } else if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let Some(line) = buf.windows(2).position(|w| w == b"\r\n") else {
                if !fill(conn, buf).await? {
                    return Err("closed inside a chunk".into());
                }
                continue;
            };
            let size = usize::from_str_radix(
                String::from_utf8_lossy(&buf[..line])
                    .split(';')
                    .next()
                    .unwrap_or(""),
                16,
            )
            .map_err(|_| "bad chunk size".to_string())?;
            while buf.len() < line + 2 + size + 2 {
                if !fill(conn, buf).await? {
                    return Err("closed inside a chunk".into());
                }
            }
            body.extend_from_slice(&buf[line + 2..line + 2 + size]);
            buf.drain(..line + 2 + size + 2);
            if size == 0 {
                break;
            }
        }
    } else {
        while fill(conn, buf).await? {}
        body = std::mem::take(buf);
        keep = false;
    }
    // A server that answers `close` must then close (RFC 9112 section 9.6): nothing more
    // comes, and the connection ends before the read's deadline.
    if close && !buf.is_empty() {
        return Err(format!("{} bytes after a close answer", buf.len()));
    }
    if close && fill(conn, buf).await? {
        return Err("bytes after a close answer".into());
    }
    Ok((
        Seen {
            status,
            location: header("location"),
            challenge: header("www-authenticate"),
            retry_after: header("retry-after"),
            edited: edited_fields(&head),
            body,
            closed: close,
        },
        keep,
    ))
}

/// How the clients reach the two proxies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Cleartext,
    Tls,
    /// HTTP/2 over TLS (ALPN h2): every stream is a request.
    H2,
    /// HTTP/2 in clear, with prior knowledge.
    H2c,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_engines_answer_generated_requests_alike() {
    run(Transport::Cleartext, 10_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_engines_answer_generated_requests_alike_over_tls() {
    run(Transport::Tls, 4_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_engines_answer_generated_requests_alike_over_http2() {
    run(Transport::H2, 4_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_engines_answer_generated_requests_alike_over_h2c() {
    run(Transport::H2c, 2_000).await;
}

/// An HTTP/2 client connection to one proxy, reopened when the proxy ends it.
struct H2Client {
    port: u16,
    tls: bool,
    sender: Option<hyper::client::conn::http2::SendRequest<Full<Bytes>>>,
}

/// A generated request as an HTTP/2 client sends it: its host as :authority, its body as
/// DATA (a chunked one de-chunked), without the fields HTTP/2 forbids. None: it has no
/// HTTP/2 form (no or several Host fields, a host no URI takes, a malformed head).
fn as_h2(raw: &[u8], tls: bool) -> Option<Request<Full<Bytes>>> {
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Request::new(&mut fields);
    let len = match parsed.parse(raw) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return None,
    };
    let mut hosts = parsed
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"));
    let host = std::str::from_utf8(hosts.next()?.value).ok()?;
    if hosts.next().is_some() {
        return None;
    }
    let scheme = if tls { "https" } else { "http" };
    let uri: hyper::Uri = format!("{scheme}://{host}{}", parsed.path?).parse().ok()?;
    let mut req = Request::builder().method(parsed.method?).uri(uri);
    let mut chunked = false;
    for h in parsed.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        match name.as_str() {
            "host" | "connection" | "keep-alive" | "proxy-connection" | "upgrade" | "te" => {}
            "transfer-encoding" => chunked = true,
            _ => req = req.header(name, h.value),
        }
    }
    let rest = &raw[len..];
    let body = if chunked {
        // The generator's one chunked body: "2\r\nhi\r\n0\r\n\r\n".
        let text = std::str::from_utf8(rest).ok()?;
        let mut out = Vec::new();
        let mut lines = text.split("\r\n");
        while let Some(size) = lines.next() {
            let size = usize::from_str_radix(size, 16).ok()?;
            if size == 0 {
                break;
            }
            out.extend_from_slice(lines.next()?.as_bytes().get(..size)?);
        }
        out
    } else {
        rest.to_vec()
    };
    req.body(Full::new(Bytes::from(body))).ok()
}

impl H2Client {
    fn new(port: u16, tls: bool) -> Self {
        Self {
            port,
            tls,
            sender: None,
        }
    }

    async fn connect(&self) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
        let tcp = TcpStream::connect(("127.0.0.1", self.port)).await.unwrap();
        let io: Box<dyn Duplex> = if self.tls {
            let name = rustls::pki_types::ServerName::try_from(SNI).unwrap();
            Box::new(connector(&[b"h2"]).connect(name, tcp).await.unwrap())
        } else {
            Box::new(tcp)
        };
        support::http2::over(io).await
    }

    async fn send(&mut self, req: Request<Full<Bytes>>) -> Result<Seen, String> {
        let head_only = req.method() == hyper::Method::HEAD;
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map_or_else(|_| Bytes::new(), |b| b.to_bytes());
        let mut resent = false;
        let resp = loop {
            if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
                self.sender = Some(self.connect().await);
            }
            let sender = self.sender.as_mut().unwrap();
            let req = Request::from_parts(parts.clone(), Full::new(body.clone()));
            let answer =
                tokio::time::timeout(Duration::from_secs(10), sender.send_request(req)).await;
            match answer {
                Err(_) => return Err("timed out".into()),
                Ok(Ok(r)) => break r,
                // Sent as the connection was ending (the proxy closes one after too many
                // malformed streams, and the client may not have seen it yet): not refused,
                // so sent once more on a new connection, whichever proxy it was.
                Ok(Err(e)) if !resent && !reset_by_proxy(&e) => {
                    resent = true;
                    self.sender = None;
                }
                // A reset stream or a refused request: which error it was is the client's
                // wording.
                Ok(Err(_)) => return Err("stream failed".into()),
            }
        };
        let status = resp.status().as_u16();
        let mut head = format!("HTTP/2 {status}\r\n");
        for (name, value) in resp.headers() {
            head.push_str(&format!(
                "{name}: {}\r\n",
                String::from_utf8_lossy(value.as_bytes())
            ));
        }
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_owned())
        };
        let (location, challenge, retry_after) = (
            header("location"),
            header("www-authenticate"),
            header("retry-after"),
        );
        let body =
            match tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect()).await {
                Ok(Ok(b)) => b.to_bytes().to_vec(),
                _ => return Err("body failed".into()),
            };
        if head_only && !body.is_empty() {
            return Err("a body in answer to HEAD".into());
        }
        Ok(Seen {
            status,
            location,
            challenge,
            retry_after,
            edited: edited_fields(&head),
            body,
            // HTTP/2 has no Connection field.
            closed: false,
        })
    }
}

/// Whether the proxy reset this request's stream itself (RST_STREAM), as opposed to the
/// connection ending under it.
fn reset_by_proxy(e: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(h2) = cause.downcast_ref::<h2::Error>() {
            return h2.is_reset() && h2.is_remote();
        }
        source = cause.source();
    }
    false
}

/// The two clients of a run: one per proxy.
enum Clients {
    Http1(Client, Client),
    Http2(H2Client, H2Client, bool),
}

impl Clients {
    /// Sends one generated request to both proxies; None when it has no form here.
    async fn send(&mut self, req: &[u8]) -> Option<(Result<Seen, String>, Result<Seen, String>)> {
        match self {
            Self::Http1(fast, pingora) => {
                let head_only = req.windows(5).take(3).any(|w| w == b"HEAD ");
                Some((
                    fast.send(req, head_only).await,
                    pingora.send(req, head_only).await,
                ))
            }
            Self::Http2(fast, pingora, tls) => {
                let (a, b) = (as_h2(req, *tls)?, as_h2(req, *tls)?);
                Some((fast.send(a).await, pingora.send(b).await))
            }
        }
    }
}

/// Sends `default_count` generated requests (or `COXSWAIN_DIFF_REQUESTS`) through both
/// engines and compares what each client saw.
async fn run(transport: Transport, default_count: usize) {
    let tls = matches!(transport, Transport::Tls | Transport::H2);
    let seed: u64 = std::env::var("COXSWAIN_DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    let count: usize = std::env::var("COXSWAIN_DIFF_REQUESTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_count);
    let over = format!("{transport:?}");
    eprintln!(
        "differential ({over}): seed {seed} (COXSWAIN_DIFF_SEED={seed} replays it), {count} requests"
    );
    let listeners = [free_port(), free_port()];
    let cert = cert(SNI);
    let (backend, _seen, _) = raw_backend(move |r| {
        let body = canonical(&r.head, listeners);
        // A target with /busy in it, or ending in /again, is answered 503, which the /again
        // route retries (about 1 in 100 requests is "/again" alone).
        let path = r.path.split('?').next().unwrap_or_default();
        let status = if path.contains("/busy") || path.ends_with("/again") {
            "503 Service Unavailable"
        } else {
            "200 OK"
        };
        let mut resp = format!(
            "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\nx-backend: raw\r\nx-answer: backend-own\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        if r.method != "HEAD" {
            resp.extend_from_slice(&body);
        }
        RawAnswer::Send(resp)
    })
    .await;
    // Half the runs believe the test client's forwarded fields (it connects from 127.0.0.1),
    // half replace them; the seed decides, so a replay takes the same half.
    let trusted: &[&str] = if seed % 4 < 2 { &["127.0.0.0/8"] } else { &[] };
    eprintln!("differential: trusted proxies {trusted:?}");
    let mut ports = Vec::new();
    let mut proxies = Vec::new();
    for (fast_path, port) in [(true, listeners[0]), (false, listeners[1])] {
        let snap = snapshot(ROUTES, &template_vars(port, backend.port(), tls, &cert));
        let limits = Limits {
            fast_path,
            client_address: ClientAddress {
                trusted: AddressSet::parse(trusted).unwrap(),
                proxy_protocol: false,
            },
            ..Limits::default()
        };
        proxies.push(Proxy::start_with(&snap, limits).await);
        ports.push(port);
    }
    let http2 = matches!(transport, Transport::H2 | Transport::H2c);
    let mut clients = if http2 {
        Clients::Http2(
            H2Client::new(ports[0], tls),
            H2Client::new(ports[1], tls),
            tls,
        )
    } else {
        Clients::Http1(Client::new(ports[0], tls), Client::new(ports[1], tls))
    };
    let mut rng = Rng(seed);
    let mut divergences = Vec::new();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let mut edited = 0;
    let mut rewritten = 0;
    let mut cors = 0;
    let mut sessions = [0; 2];
    let mut sent = 0;
    let session = format!("{:016x}", coxswain_proxy::balance::endpoint_id(backend));
    for i in 0..count {
        let req = generate(&mut rng, &session);
        let Some((mut a, mut b)) = clients.send(&req).await else {
            continue;
        };
        // Whether a connection stays open after an answer is each engine's to decide (Pingora
        // closes after a refusal whose body it did not read; the fast path reads it) unless
        // the client asked to close: then both must have.
        if !asks_close(&req) {
            for seen in [&mut a, &mut b].into_iter().flatten() {
                seen.closed = false;
            }
        }
        sent += 1;
        if let Ok(s) = &a {
            *statuses.entry(s.status).or_default() += 1;
            edited += usize::from(s.edited.iter().any(|f| f == "x-served-by: edge"));
            cors += usize::from(
                s.edited
                    .iter()
                    .any(|f| f.starts_with("access-control-allow-origin")),
            );
            // Sessions named in the answer, and ones the request kept.
            if s.edited.iter().any(|f| f == "x-answer: sticky") {
                let named = s.edited.iter().any(|f| f.starts_with("set-cookie"));
                sessions[usize::from(named)] += 1;
            }
            let seen_by_backend = String::from_utf8_lossy(&s.body);
            rewritten += usize::from(
                [
                    "/new",
                    "/again/whole",
                    "host: inner.example",
                    "host: second.example",
                ]
                .iter()
                .any(|r| seen_by_backend.contains(r)),
            );
        }
        if a != b {
            divergences.push(format!(
                "#{i} {:?}\n  fast path: {a:?}\n  pingora:   {b:?}",
                String::from_utf8_lossy(&req)
            ));
        }
    }
    eprintln!("differential ({over}): statuses {statuses:?}");
    for d in divergences.iter().take(20) {
        eprintln!("{d}");
    }
    assert!(
        divergences.is_empty(),
        "{} of {count} requests diverged (seed {seed})",
        divergences.len()
    );
    // The run exercised both answers and forwarding.
    assert!(
        sent > count / 2,
        "only {sent} of {count} requests had a form here"
    );
    assert!(
        statuses.get(&200).is_some_and(|n| *n > sent / 10),
        "{statuses:?}"
    );
    assert!(statuses.len() >= 6, "{statuses:?}");
    // And the route whose header modifiers the fast path applies itself.
    assert!(edited > sent / 100, "{edited} responses through /edit");
    // And the routes whose URL rewrites it applies itself.
    assert!(rewritten > sent / 100, "{rewritten} rewritten requests");
    // And CORS answers, preflights and others.
    assert!(cors > sent / 200, "{cors} CORS answers");
    // And session answers, new sessions named and kept ones not (about 1 in 100 requests
    // keeps a session on /sticky: some in every run).
    assert!(
        sessions.iter().all(|n| *n > 0),
        "{sessions:?} sessions kept and named"
    );
    // Both engines retried the same answers of the /again route, as often.
    let mut retried = Vec::new();
    for p in &proxies {
        retried.push(p.metric("coxswain_proxy_upstream_retries_total").await);
    }
    eprintln!("differential ({over}): retries {retried:?}");
    assert_eq!(
        retried[0], retried[1],
        "retries on the fast path and on Pingora"
    );
    assert!(retried[0] > 0, "no answer was retried");
    if http2 {
        // Streams took the fast path on one proxy and never on the other.
        let fast = proxies[0]
            .metric("coxswain_proxy_http2_streams_fast_path_total")
            .await;
        let none = proxies[1]
            .metric("coxswain_proxy_http2_streams_fast_path_total")
            .await;
        eprintln!("differential ({over}): {fast} of {sent} streams on the fast path");
        assert!(
            fast as usize > sent / 10,
            "{fast} of {sent} streams on the fast path"
        );
        assert_eq!(none, 0);
    }
    // Over TLS, requests for the other listener's names were told apart from the SNI's.
    if tls {
        assert!(statuses.contains_key(&421), "{statuses:?}");
    }
    for p in proxies {
        p.stop().await;
    }
}

/// The snapshot's variables: an HTTP listener, or an HTTPS one with a certificate for
/// everything and two listener hostnames (for 421).
fn template_vars(port: u16, backend: u16, tls: bool, cert: &Cert) -> Vec<(&'static str, String)> {
    let (protocol, listener_tls, certificates) = if tls {
        (
            "PROTOCOL_HTTPS",
            "  certificates: [{sni: \"\", certificate: t/default}]\n  listenerHostnames: [a.example, \"*.wild.example\"]".to_owned(),
            format!(
                "certificates:\n- {{name: t/default, certChainPem: \"{}\", privateKeyPem: \"{}\"}}",
                yaml_escape(&cert.pem),
                yaml_escape(&cert.key)
            ),
        )
    } else {
        ("PROTOCOL_HTTP", String::new(), String::new())
    };
    vec![
        ("PORT", port.to_string()),
        ("A", backend.to_string()),
        ("PROTOCOL", protocol.to_owned()),
        ("LISTENER_TLS", listener_tls),
        ("CERTIFICATES", certificates),
    ]
}
