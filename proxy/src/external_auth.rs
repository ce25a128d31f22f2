//! External authorization: before a route's request goes to its backend, an authorization
//! service decides. Over HTTP (ingress-nginx's auth-url, GEP-1494's HTTP protocol) the
//! service gets a request describing the client's (no body) and a 2xx answer allows; over gRPC
//! it gets Envoy's `Authorization/Check` and status OK allows. An allowing answer may set
//! fields on the request to the backend; a refusing one is passed on to the client.
//!
//! Fail closed: a service that cannot be reached, times out or answers nonsense gets the
//! client `failure_status`, and the backend never sees the request.
//!
//! Connections to the service are kept per route policy (rebuilt with each snapshot): HTTP/1
//! connections in a small idle list, gRPC channels (HTTP/2, one per endpoint) in a map.

use crate::callout::{
    CalloutError, Channels, HandshakeError, TlsTo, cluster_endpoint, handshake, system_roots,
};
use crate::upstream::ClusterState;
use bytes::Bytes;
use coxswain_api::ext_authz as pb;
use coxswain_api::snapshot as snap;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// When the snapshot names no timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// A refusal's body is passed on up to this size; a larger one fails the check.
const MAX_ANSWER_BODY: usize = 64 * 1024;
/// Idle HTTP connections kept per route policy.
const MAX_IDLE: usize = 32;

/// Why the service could not decide.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error(transparent)]
    Callout(#[from] CalloutError),
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    #[error("building the auth request: {0}")]
    Request(#[from] hyper::http::Error),
    #[error("HTTP exchange: {0}")]
    Http(#[from] hyper::Error),
    #[error("gRPC channel: {0}")]
    Channel(#[from] tonic::transport::Error),
    #[error("gRPC call: {0}")]
    Grpc(#[from] tonic::Status),
    #[error("the service answered {0}, which neither allows nor refuses")]
    Unexpected(u16),
    #[error("the answer's body is larger than {MAX_ANSWER_BODY} bytes")]
    BodyTooLarge,
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// What the service decided.
#[derive(Debug)]
pub enum Verdict {
    /// Forward the request, with these edits to its fields.
    Allow(Edits),
    /// Answer the client with this instead.
    Deny(Denial),
    /// The service could not decide: answer `failure_status`.
    Failed(AuthError),
}

/// Field edits an allowing answer asks for: `remove` first, then `add`. Names are lower case.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Edits {
    pub remove: Vec<String>,
    pub add: Vec<(String, String)>,
}

/// A refusal as the client receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub status: u16,
    pub fields: Vec<(String, String)>,
    pub body: Bytes,
}

/// What the service is told about a request; owned, so the engine's head can be released
/// while the service thinks.
#[derive(Debug, Clone)]
pub struct AuthRequest {
    pub method: String,
    pub scheme: &'static str,
    /// As the client sent it, with its port if any.
    pub host: String,
    /// `host` without its port.
    pub hostname: String,
    pub path_and_query: String,
    /// Names in lower case, in the order received.
    pub fields: Vec<(String, String)>,
    pub client: Option<IpAddr>,
    pub port: u16,
    pub protocol: &'static str,
    /// The body's length, -1 when unknown (chunked), 0 for none.
    pub body_size: i64,
    pub sni: Option<String>,
}

impl AuthRequest {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The request's URL, as the client asked for it.
    fn url(&self) -> String {
        format!("{}://{}{}", self.scheme, self.host, self.path_and_query)
    }
}

/// Where the service is.
enum Target {
    Cluster(Arc<ClusterState>),
    /// "host:port", resolved when a connection is opened; TLS verified for `tls_hostname`.
    /// `$host` in either stands for the request's host (ingress-nginx's
    /// `auth-url: https://$host/oauth2/auth`).
    Address {
        authority: Box<str>,
        tls_hostname: Option<Box<str>>,
    },
    /// The snapshot names a cluster it does not carry: every request fails closed.
    Missing(Box<str>),
}

/// A route's external authorization, compiled once per snapshot.
pub struct ExternalAuth {
    grpc: bool,
    target: Target,
    path: Box<str>,
    path_is_prefix: bool,
    method: Option<Box<str>>,
    host: Option<Box<str>>,
    request_fields: Vec<Box<str>>,
    all_request_fields: bool,
    response_fields: Vec<Box<str>>,
    all_response_fields: bool,
    deny_401_403_only: bool,
    original_fields: bool,
    signin_url: Option<Box<str>>,
    pub failure_status: u16,
    timeout: Duration,
    idle: Mutex<Vec<(SocketAddr, SendRequest<Full<Bytes>>)>>,
    channels: Channels,
}

impl std::fmt::Debug for ExternalAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalAuth")
            .field("service", &self.service())
            .field("grpc", &self.grpc)
            .finish_non_exhaustive()
    }
}

impl ExternalAuth {
    pub fn new(e: &snap::ExternalAuth, clusters: &HashMap<Box<str>, Arc<ClusterState>>) -> Self {
        let target = if e.cluster.is_empty() && e.address.is_empty() {
            Target::Missing("(no service)".into())
        } else if !e.cluster.is_empty() {
            match clusters.get(e.cluster.as_str()) {
                Some(c) => Target::Cluster(c.clone()),
                None => Target::Missing(e.cluster.as_str().into()),
            }
        } else {
            Target::Address {
                authority: e.address.as_str().into(),
                tls_hostname: (!e.tls_hostname.is_empty()).then(|| e.tls_hostname.as_str().into()),
            }
        };
        let lower = |names: &[String]| {
            names
                .iter()
                .map(|n| n.to_ascii_lowercase().into_boxed_str())
                .collect()
        };
        Self {
            grpc: e.protocol == snap::external_auth::Protocol::Grpc as i32,
            target,
            path: e.path.as_str().into(),
            path_is_prefix: e.path_is_prefix,
            method: (!e.method.is_empty()).then(|| e.method.as_str().into()),
            host: (!e.host.is_empty()).then(|| e.host.as_str().into()),
            request_fields: lower(&e.request_fields),
            all_request_fields: e.all_request_fields,
            response_fields: lower(&e.response_fields),
            all_response_fields: e.all_response_fields,
            deny_401_403_only: e.deny_401_403_only,
            original_fields: e.original_fields,
            signin_url: (!e.signin_url.is_empty()).then(|| e.signin_url.as_str().into()),
            failure_status: u16::try_from(e.failure_status)
                .ok()
                .filter(|s| (400..600).contains(s))
                .unwrap_or(503),
            timeout: match e.timeout_ms {
                0 => DEFAULT_TIMEOUT,
                ms => Duration::from_millis(ms),
            },
            idle: Mutex::new(Vec::new()),
            channels: Channels::default(),
        }
    }

    /// The service, as logs name it.
    fn service(&self) -> &str {
        match &self.target {
            Target::Cluster(c) => &c.name,
            Target::Address { authority, .. } => authority,
            Target::Missing(name) => name,
        }
    }

    /// Asks the service about `req`. Never takes longer than the timeout.
    pub async fn check(&self, req: &AuthRequest) -> Verdict {
        let asked = async {
            if self.grpc {
                self.check_grpc(req).await
            } else {
                self.check_http(req).await
            }
        };
        let result = match tokio::time::timeout(self.timeout, asked).await {
            Ok(result) => result,
            Err(_) => Err(AuthError::Timeout(self.timeout)),
        };
        match result {
            Ok(verdict) => verdict,
            Err(error) => {
                tracing::warn!(service = self.service(), %error, status = self.failure_status,
                    "external authorization could not decide; the request is refused");
                Verdict::Failed(error)
            }
        }
    }

    /// An endpoint of the service and the TLS to speak to it.
    async fn endpoint(&self, req: &AuthRequest) -> Result<(SocketAddr, Option<TlsTo>), AuthError> {
        match &self.target {
            Target::Cluster(c) => Ok(cluster_endpoint(c)?),
            Target::Address {
                authority,
                tls_hostname,
            } => {
                let authority = with_host(authority, req);
                let tls = match tls_hostname {
                    None => None,
                    Some(name) => Some((
                        system_roots(),
                        rustls_pki_types::ServerName::try_from(with_host(name, req).into_owned())
                            .map_err(|_| CalloutError::TlsRefused)?,
                    )),
                };
                let mut addrs = tokio::net::lookup_host(&*authority)
                    .await
                    .map_err(|source| CalloutError::Resolve {
                        authority: authority.as_ref().into(),
                        source,
                    })?;
                Ok((addrs.next().ok_or(CalloutError::NoEndpoint)?, tls))
            }
            Target::Missing(_) => Err(CalloutError::NoEndpoint.into()),
        }
    }

    async fn check_http(&self, req: &AuthRequest) -> Result<Verdict, AuthError> {
        let (addr, tls) = self.endpoint(req).await?;
        let pooled = self.take_idle(addr);
        let (mut sender, reused) = match pooled {
            Some(s) => (s, true),
            None => (handshake(addr, tls.as_ref()).await?, false),
        };
        let response = match sender.send_request(self.http_request(req)?).await {
            Ok(r) => r,
            // A kept connection the service closed meanwhile: once more on a new one.
            Err(e) if reused && (e.is_closed() || e.is_canceled() || e.is_incomplete_message()) => {
                sender = handshake(addr, tls.as_ref()).await?;
                sender.send_request(self.http_request(req)?).await?
            }
            Err(e) => return Err(e.into()),
        };
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, MAX_ANSWER_BODY)
            .collect()
            .await
            .map_err(|_| AuthError::BodyTooLarge)?
            .to_bytes();
        self.put_idle(addr, sender);
        self.http_verdict(req, parts.status.as_u16(), &parts.headers, body)
    }

    fn take_idle(&self, addr: SocketAddr) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(i) = idle.iter().position(|(a, _)| *a == addr) {
            let (_, sender) = idle.swap_remove(i);
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    fn put_idle(&self, addr: SocketAddr, sender: SendRequest<Full<Bytes>>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push((addr, sender));
        }
    }

    /// The HTTP request put to the service: no body, Content-Length 0 (GEP-1494).
    fn http_request(&self, req: &AuthRequest) -> Result<hyper::Request<Full<Bytes>>, AuthError> {
        let path = if self.path_is_prefix {
            format!("{}{}", self.path.trim_end_matches('/'), req.path_and_query)
        } else if self.path.is_empty() {
            "/".to_owned()
        } else {
            self.path.to_string()
        };
        let host = match &self.host {
            Some(h) => with_host(h, req),
            None => std::borrow::Cow::Borrowed(req.host.as_str()),
        };
        let mut b = hyper::Request::builder()
            .method(self.method.as_deref().unwrap_or(&req.method))
            .uri(path)
            .header("host", &*host);
        for (name, value) in &req.fields {
            let sent = !(name == "host" || name == "content-length" || hop_by_hop(name))
                && (self.all_request_fields
                    || name == "authorization"
                    || self.request_fields.iter().any(|f| **f == **name));
            if sent {
                b = b.header(name.as_str(), value.as_str());
            }
        }
        if self.original_fields {
            b = b
                .header("x-original-url", req.url())
                .header("x-original-method", req.method.as_str())
                .header("x-original-uri", req.path_and_query.as_str())
                .header("x-auth-request-redirect", req.path_and_query.as_str());
            if let Some(client) = req.client {
                let client = client.to_string();
                b = b
                    .header("x-real-ip", client.as_str())
                    .header("x-forwarded-for", client);
            }
        }
        Ok(b.header("content-length", "0")
            .body(Full::new(Bytes::new()))?)
    }

    fn http_verdict(
        &self,
        req: &AuthRequest,
        status: u16,
        fields: &hyper::HeaderMap,
        body: Bytes,
    ) -> Result<Verdict, AuthError> {
        let text =
            |v: &hyper::header::HeaderValue| String::from_utf8_lossy(v.as_bytes()).into_owned();
        if (200..300).contains(&status) {
            // A listed field is always the service's: the client's own never reaches the backend.
            let mut edits = Edits {
                remove: self.response_fields.iter().map(|n| n.to_string()).collect(),
                add: Vec::new(),
            };
            for (name, value) in fields {
                let name = name.as_str();
                let copied = if self.all_response_fields {
                    !(name == "host" || name == "content-length" || hop_by_hop(name))
                } else {
                    self.response_fields.iter().any(|f| **f == *name)
                };
                if copied {
                    if self.all_response_fields {
                        edits.remove.push(name.to_owned());
                    }
                    edits.add.push((name.to_owned(), text(value)));
                }
            }
            return Ok(Verdict::Allow(edits));
        }
        if status == 401
            && let Some(signin) = &self.signin_url
        {
            return Ok(Verdict::Deny(Denial {
                status: 302,
                fields: vec![("location".to_owned(), signin_location(signin, req))],
                body: Bytes::new(),
            }));
        }
        if self.deny_401_403_only && status != 401 && status != 403 {
            return Err(AuthError::Unexpected(status));
        }
        if !(300..600).contains(&status) {
            return Err(AuthError::Unexpected(status));
        }
        let fields = fields
            .iter()
            .filter(|(n, _)| {
                let n = n.as_str();
                !(n == "content-length" || hop_by_hop(n))
            })
            .map(|(n, v)| (n.as_str().to_owned(), text(v)))
            .collect();
        Ok(Verdict::Deny(Denial {
            status,
            fields,
            body,
        }))
    }

    async fn check_grpc(&self, req: &AuthRequest) -> Result<Verdict, AuthError> {
        let (addr, tls) = self.endpoint(req).await?;
        let channel = self.channels.get(addr, tls, self.timeout)?;
        let mut client = pb::authorization_client::AuthorizationClient::new(channel);
        let answer = client.check(self.check_request(req)).await?.into_inner();
        Ok(grpc_verdict(answer))
    }

    fn check_request(&self, req: &AuthRequest) -> pb::CheckRequest {
        use pb::attribute_context::{HttpRequest, Peer, Request, TlsSession};
        let mut headers: HashMap<String, String> = HashMap::new();
        for (name, value) in &req.fields {
            if self.all_request_fields || self.request_fields.iter().any(|f| **f == **name) {
                headers
                    .entry(name.clone())
                    .and_modify(|v| {
                        v.push(',');
                        v.push_str(value);
                    })
                    .or_insert_with(|| value.clone());
            }
        }
        // As Envoy sends them, so policies written for Envoy read the same keys.
        headers.insert(":authority".to_owned(), req.host.clone());
        headers.insert(":method".to_owned(), req.method.clone());
        headers.insert(":path".to_owned(), req.path_and_query.clone());
        headers.insert(":scheme".to_owned(), req.scheme.to_owned());
        let peer = |address: String, port: u16| Peer {
            address: Some(pb::Address {
                socket_address: Some(pb::SocketAddress {
                    address,
                    port_value: u32::from(port),
                }),
            }),
            principal: String::new(),
        };
        pb::CheckRequest {
            attributes: Some(pb::AttributeContext {
                source: req.client.map(|ip| peer(ip.to_string(), 0)),
                destination: Some(peer(String::new(), req.port)),
                request: Some(Request {
                    http: Some(HttpRequest {
                        id: req.field("x-request-id").unwrap_or_default().to_owned(),
                        method: req.method.clone(),
                        headers,
                        path: req.path_and_query.clone(),
                        host: req.host.clone(),
                        scheme: req.scheme.to_owned(),
                        size: req.body_size,
                        protocol: req.protocol.to_owned(),
                    }),
                }),
                context_extensions: HashMap::new(),
                tls_session: req.sni.clone().map(|sni| TlsSession { sni }),
            }),
        }
    }
}

/// Envoy's reading of a CheckResponse: status OK allows (an absent status is OK, as in
/// Envoy); any other denies, with the denied response's status (403 when it names none).
fn grpc_verdict(answer: pb::CheckResponse) -> Verdict {
    let code = answer.status.as_ref().map_or(0, |s| s.code);
    if code == 0 {
        let mut edits = Edits::default();
        if let Some(pb::check_response::HttpResponse::OkResponse(ok)) = answer.http_response {
            for name in ok.headers_to_remove {
                let name = name.to_ascii_lowercase();
                // Host and pseudo-fields cannot go: the request would be malformed.
                if name != "host" && !name.starts_with(':') && valid_name(&name) {
                    edits.remove.push(name);
                }
            }
            for (name, value, append) in header_options(ok.headers) {
                if name == "host" {
                    continue;
                }
                if !append {
                    edits.remove.push(name.clone());
                }
                edits.add.push((name, value));
            }
        }
        return Verdict::Allow(edits);
    }
    let mut denial = Denial {
        status: 403,
        fields: Vec::new(),
        body: Bytes::new(),
    };
    if let Some(pb::check_response::HttpResponse::DeniedResponse(d)) = answer.http_response {
        if let Some(s) = d.status
            && let Ok(s) = u16::try_from(s.code)
            && (300..600).contains(&s)
        {
            denial.status = s;
        }
        denial.fields = header_options(d.headers)
            .into_iter()
            .filter(|(n, _, _)| !(n == "content-length" || hop_by_hop(n)))
            .map(|(n, v, _)| (n, v))
            .collect();
        denial.body = Bytes::from(d.body);
    }
    Verdict::Deny(denial)
}

/// (lower-case name, value, append) of each well-formed option; others are dropped.
fn header_options(options: Vec<pb::HeaderValueOption>) -> Vec<(String, String, bool)> {
    options
        .into_iter()
        .filter_map(|o| {
            let append = o.append.is_some_and(|a| a.value);
            let h = o.header?;
            let value = if h.value.is_empty() {
                String::from_utf8(h.raw_value).ok()?
            } else {
                h.value
            };
            let name = h.key.to_ascii_lowercase();
            if !valid_name(&name) || !valid_value(&value) {
                tracing::debug!(field = %name, "authorization service sent a malformed field; dropped");
                return None;
            }
            Some((name, value, append))
        })
        .collect()
}

/// An RFC 9110 token.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Visible characters, spaces and tabs: nothing that could end the field.
fn valid_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80)
}

/// Fields of one connection, never passed from one exchange into another (RFC 9110 7.6.1).
fn hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// `template` with `$host` replaced by the request's host (without its port).
fn with_host<'t>(template: &'t str, req: &AuthRequest) -> std::borrow::Cow<'t, str> {
    if template.contains("$host") {
        std::borrow::Cow::Owned(template.replace("$host", req.hostname.as_str()))
    } else {
        std::borrow::Cow::Borrowed(template)
    }
}

/// Where a 401 sends the client with auth-signin: the URL with ingress-nginx's variables
/// filled in, and `rd=<the request's URL>` added unless it names `rd` itself.
fn signin_location(signin: &str, req: &AuthRequest) -> String {
    let mut url = signin.to_owned();
    if url.contains('$') {
        let escaped = percent_encode(&req.path_and_query);
        // Longest names first: `$request_uri` is not `$request` + "_uri".
        for (name, value) in [
            ("$escaped_request_uri", escaped.as_str()),
            ("$request_uri", req.path_and_query.as_str()),
            ("$http_host", req.host.as_str()),
            ("$scheme", req.scheme),
            ("$host", req.hostname.as_str()),
        ] {
            url = url.replace(name, value);
        }
    }
    if !url.contains("rd=") {
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str("rd=");
        url.push_str(&percent_encode(&req.url()));
    }
    url
}

/// A URL as a query value: everything but unreserved characters percent-encoded.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3 / 2);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests;
