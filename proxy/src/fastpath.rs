//! HTTP/1 connections, cleartext or TLS: every request head is read here, under the head
//! deadline, and checked, normalised and routed by `request`; then either forwarded by the
//! fast path or handed to Pingora for that one request.
//!
//! The fast path exists because, for the most common request, Pingora's per-request
//! machinery (header maps rebuilt on both sides, a task pair joined by channels, an upstream
//! pool that spawns a task and takes locks per release) has nothing to do: no protocol
//! changes, at most a few header fields edited. Such a request (HTTP/1.1, no body, a
//! Content-Length one or a chunked one, no upgrade, on a route that only forwards to HTTP/1
//! backends, with plain header modifiers, URL rewrites and timeouts at most:
//! `CompiledRoute::passthrough`, decided once per snapshot) is written upstream with its fields
//! as they came, except for a normalised (and rewritten) target, the forwarded fields
//! (`forwarded`) and the filters' edits (`heads`), over a
//! connection from this worker's pool, and the response is copied back with its framing
//! checked (`http1`) so both connections stay reusable. A Content-Length body of at most
//! `MAX_BODY` is read whole and sent with the head; a larger one streams after it
//! (`stream`). A chunked body is framed again on the way: sent with the head when it came
//! whole with it, else streamed.
//!
//! Any other request goes to Pingora with its bytes put back. Pingora serves it and returns
//! the connection, and the next request is read here again.

use crate::access_log::{AccessLine, access_line};
use crate::conn::Buffered;
use crate::head::visible;
use crate::http1;
use crate::limits::Limits;
use crate::request::{self, Body, ConnectionOption, Head, Version};
use crate::table::SharedTable;
use crate::upstream::{ClusterState, pool};
use backend::{Bounds, next_head, read_more, send};
use coxswain_api::snapshot as snap;
use heads::{answer_head, edited_response_head, status_response, without_content_length};
use plan::plan_checked;
use read::{BodyRead, HeadRead, read_body, read_head, request_end};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

/// Header fields parsed in place; a request with more is counted by Pingora.
const MAX_HEADERS: usize = 128;
/// Header fields a backend's response may have on this path.
const MAX_RESPONSE_HEADERS: usize = 128;
/// A response head larger than this is refused (502).
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// Room for the request line on top of the header bytes the limits allow.
const REQUEST_LINE: usize = 8 * 1024;
/// The largest Content-Length body read whole before the request goes upstream, so a request
/// sent again on a fresh connection (see `exchange`) still has it: the same bound as
/// Pingora's retry buffer. Larger ones stream (`stream`).
const MAX_BODY: u64 = 64 * 1024;
/// What a client connection's request buffer shrinks back to after a large body.
const KEPT_BUFFER: usize = 16 * 1024;
/// A request's buffer for its answer: jemalloc's largest small size class. Allocated per
/// request, it must stay below 16 KiB, where allocations leave the thread cache for the arena
/// (a 16 KiB one cost about 0.5 µs per request).
const ANSWER_BUFFER: usize = 14 * 1024;

/// What the connection does after `serve` returns.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// The connection is finished (closed by either side, a deadline, or an error).
    Closed,
    /// Pingora serves the next request (the bytes read have been put back); then the
    /// connection comes back here.
    Pingora,
    /// An HTTP/2 connection with prior knowledge: Pingora serves all of it.
    H2c,
}

/// What a connection is served with.
pub struct Env<'a> {
    pub table: &'a SharedTable,
    pub limits: &'a Limits,
    /// The port listened on, which routes the request.
    pub port: u16,
    /// The port the client addressed (redirects, X-Forwarded-Port); see `router::Binding`.
    pub public_port: u16,
    pub peer: SocketAddr,
    /// The connection is TLS (an HTTPS listener).
    pub https: bool,
    /// The server name the TLS client asked for.
    pub sni: Option<&'a str>,
    /// A resumed TLS session without the client certificate the port requires: Pingora
    /// answers its requests (403).
    pub client_cert_refused: bool,
    /// Tells connections idling between requests to close (the listener stopped).
    pub closing: &'a mut watch::Receiver<bool>,
    pub shutdown: &'a watch::Receiver<bool>,
}

/// Serves requests from `conn` until one is for Pingora or the connection ends. `first`:
/// no request was read on this connection yet (the head deadline runs from accept).
pub async fn serve(conn: &mut Buffered, env: &mut Env<'_>, first: bool) -> Next {
    let mut req: Vec<u8> = conn.take_unread();
    let mut first = first;
    loop {
        let len = match read_head(conn, &mut req, env, first).await {
            HeadRead::Complete(len) => len,
            HeadRead::H2c => {
                conn.hand_over(&req, &[]);
                return Next::H2c;
            }
            HeadRead::Closed => return Next::Closed,
            HeadRead::Reject(status) => {
                crate::metrics::Metrics::count(&env.table.metrics().requests_refused);
                // The client may still be sending the head refused.
                if conn.write_all(status_response(status)).await.is_ok() {
                    crate::conn::linger(conn, env.limits.request_head).await;
                }
                return Next::Closed;
            }
        };
        first = false;
        // A request's state (its buffers, the backend exchange) lives in a box of its own for
        // as long as the request does: the connection's task, which an idle keep-alive
        // connection holds, stays as small as waiting for a head needs.
        if let Some(next) = Box::pin(request(conn, env, &mut req, len)).await {
            return next;
        }
    }
}

/// Serves the request whose head of `len` bytes starts `req`. None: the connection goes on
/// to its next request.
async fn request(
    conn: &mut Buffered,
    env: &Env<'_>,
    req: &mut Vec<u8>,
    len: usize,
) -> Option<Next> {
    let started = Instant::now();
    // Buffers a request needs live as long as it does (from jemalloc's thread cache, below
    // 16 KiB, so allocating them costs about what reusing them would): a connection waiting
    // for its next request holds none.
    let mut up_head: Vec<u8> = Vec::with_capacity(4096);
    // Where the request ends in `req`: Pingora gets that much, the rest waits.
    let mut end = req.len();
    let step = {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Request::new(&mut headers);
        match parsed.parse(&req[..len]) {
            Ok(httparse::Status::Complete(_)) => {
                let head = FastHead(&parsed);
                end = request_end(&head, len, req.len());
                if env.limits.fast_path {
                    plan(&head, env, &mut up_head)
                } else {
                    Step::Pingora
                }
            }
            Err(httparse::Error::TooManyHeaders)
                if env.limits.fast_path && env.limits.max_request_headers < MAX_HEADERS =>
            {
                Step::Reject(431)
            }
            // Anything httparse leaves to others: Pingora parses it and decides.
            _ => Step::Pingora,
        }
    };
    let mut plan = match step {
        Step::Pingora => {
            crate::metrics::Metrics::count(&env.table.metrics().http1_requests_pingora);
            conn.hand_over(&req[..end], &req[end..]);
            return Some(Next::Pingora);
        }
        Step::Reject(status) => {
            crate::metrics::Metrics::count(&env.table.metrics().requests_refused);
            // Its body, if any, was not read.
            if conn.write_all(status_response(status)).await.is_ok() {
                crate::conn::linger(conn, env.limits.request_head).await;
            }
            return Some(Next::Closed);
        }
        Step::Answer(answer) => {
            answer.record.done(answer.status, None, started);
            let head = answer_head(answer.status, &answer.fields, answer.close_client);
            if conn.write_all(&head).await.is_err() {
                return Some(Next::Closed);
            }
            if answer.close_client {
                // A body the client may still be sending is read and dropped for a while, so
                // the answer is not lost to a reset.
                if answer.body != Some(0) {
                    crate::conn::linger(conn, env.limits.request_head).await;
                } else {
                    close(conn, env.limits.request_head).await;
                }
                return Some(Next::Closed);
            }
            if conn.flush().await.is_err() || *env.shutdown.borrow() {
                return Some(Next::Closed);
            }
            // Then the body is read and dropped, so the next request starts after it (as
            // Pingora drains one); a body that does not come ends the connection. One of
            // unknown length closed the connection above.
            let body = answer.body.unwrap_or(0);
            if body > 0 && read_body(conn, req, len + body, env).await.is_err() {
                return Some(Next::Closed);
            }
            req.drain(..len + body);
            return None;
        }
        Step::Forward(plan) => plan,
    };
    // A chunked body that came whole with the head goes with it, re-framed; one still on
    // its way streams.
    let mut reframed = Vec::new();
    if plan.chunked {
        let mut decoder = http1::Chunked::default();
        match http1::reframe(&mut decoder, &req[len..], &mut reframed) {
            Ok(Some(consumed)) => plan.body = consumed,
            Ok(None) => {
                let chunked = Some((decoder, reframed));
                return stream::request(conn, env, (req, len), &up_head, chunked, plan, started)
                    .await;
            }
            Err(e) => return stream::refuse_body(conn, env, &plan, e, started).await,
        }
    }
    let held_back = plan.awaits_continue && req.len() < len + plan.body;
    if !plan.chunked && (plan.body > MAX_BODY as usize || held_back) {
        return stream::request(conn, env, (req, len), &up_head, None, plan, started).await;
    }
    if plan.body > 0 {
        match read_body(conn, req, len + plan.body, env).await {
            Ok(()) => {}
            // A client that stopped sending in time gets 408; one that left gets nothing.
            // Either way nothing went upstream.
            Err(BodyRead::TimedOut) => {
                plan.record.done(408, None, started);
                let _ = conn.write_all(status_response(408)).await;
                let _ = conn.flush().await;
                return Some(Next::Closed);
            }
            Err(BodyRead::Closed) => {
                plan.record.done(0, None, started);
                return Some(Next::Closed);
            }
        }
    }
    let mut resp: Vec<u8> = Vec::with_capacity(ANSWER_BUFFER);
    let body = if plan.chunked {
        &reframed[..]
    } else {
        &req[len..len + plan.body]
    };
    let outcome = exchange(conn, (&up_head, body), &mut plan, &mut resp, env).await;
    let status = match outcome {
        Ok(Exchange { status, .. }) | Err(status) => status,
    };
    plan.record.done(status, Some(plan.upstream), started);
    match outcome {
        Ok(Exchange { keep_client, .. }) if keep_client && !*env.shutdown.borrow() => {
            req.drain(..len + plan.body);
            // A large body grew the buffer; a connection idling between requests keeps
            // only what a head needs.
            if req.capacity() > 2 * KEPT_BUFFER && req.len() < KEPT_BUFFER {
                req.shrink_to(KEPT_BUFFER);
            }
            None
        }
        Ok(_) => {
            close(conn, env.limits.request_head).await;
            Some(Next::Closed)
        }
        Err(status) => {
            // Requests the client pipelined after this one are not read.
            if conn.write_all(status_response(status)).await.is_ok() {
                crate::conn::linger(conn, env.limits.request_head).await;
            }
            Some(Next::Closed)
        }
    }
}

/// httparse's view of a request head, for the request layer.
struct FastHead<'h, 'b>(&'h httparse::Request<'h, 'b>);

impl crate::router::Headers for FastHead<'_, '_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| visible(h.value))
    }
}

impl Head for FastHead<'_, '_> {
    fn method(&self) -> &str {
        self.0.method.unwrap_or("")
    }

    fn target(&self) -> &[u8] {
        self.0.path.unwrap_or("").as_bytes()
    }

    fn version(&self) -> Version {
        if self.0.version == Some(0) {
            Version::Http10
        } else {
            Version::Http11
        }
    }

    fn each_header<'s>(&'s self, f: &mut dyn FnMut(&'s [u8], &'s [u8])) {
        for h in self.0.headers.iter() {
            f(h.name.as_bytes(), h.value);
        }
    }
}

// A request's one step, returned once and matched at once: boxing the plan would cost an
// allocation per request to save stack no one keeps.
#[allow(clippy::large_enum_variant)]
enum Step {
    Pingora,
    Reject(u16),
    /// Answered here without going upstream, and the connection kept (401, 403, 429, a
    /// redirect, a route's fixed status).
    Answer(Answered),
    Forward(Plan),
}

/// An answer the request layer decided, with the header fields it gets.
struct Answered {
    status: u16,
    fields: Vec<crate::policy::PolicyField>,
    record: Record,
    /// The request's body length: read and dropped so the connection can go on (None:
    /// chunked, left unread, and the connection closes).
    body: Option<usize>,
    /// The client asked to close after this request (`ConnectionOption::Close`).
    close_client: bool,
}

/// How a request is counted and logged once its status is known.
struct Record {
    counters: Arc<crate::metrics::RouteCounters>,
    /// Some when the route logs and the access log target is enabled.
    access_log: Option<AccessFields>,
    /// Some when tracing is on and the request sampled.
    span: Option<crate::trace::RequestSpan>,
}

impl Record {
    fn done(&self, status: u16, upstream: Option<SocketAddr>, started: Instant) {
        self.counters.record(status);
        if let Some(span) = &self.span {
            span.finish(status, upstream);
        }
        if let Some(log) = &self.access_log {
            access_line(&AccessLine {
                client: log.client,
                method: &log.method,
                host: &log.host,
                path: &log.path,
                status,
                route: log.route.source.as_ref(),
                upstream,
                duration_ms: started.elapsed().as_millis() as u64,
            });
        }
    }
}

/// Ends a client connection after its last answer: the bytes buffered, then TLS's
/// close_notify, then the TCP FIN. The proxy closes first, as RFC 9112 section 9.6 asks of
/// a server after answering a `close`, so the client is not the one left holding TIME_WAIT.
/// A client that takes none of the last bytes holds the task no longer than `within`; the
/// socket is dropped then all the same.
async fn close(conn: &mut Buffered, within: std::time::Duration) {
    match tokio::time::timeout(within, conn.shutdown()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "closing a client connection"),
        Err(_) => tracing::debug!("client took none of the last answer's bytes in time"),
    }
}

/// A request this path forwards, and what it needs to know afterwards.
struct Plan {
    upstream: SocketAddr,
    /// `upstream`'s index in `cluster`, where another endpoint comes from when connecting
    /// fails, and where how the request went is recorded.
    endpoint: usize,
    cluster: Arc<ClusterState>,
    head_only: bool,
    /// Sent again on a fresh connection if a pooled one fails (RFC 9110 9.2.2).
    idempotent: bool,
    record: Record,
    /// The request counted as busy on `endpoint` (least-request clusters only).
    in_flight: Option<crate::upstream::InFlight>,
    /// Header modifiers for the response head (`ResolvedBackend::response_edits`).
    response_edits: Option<Arc<[snap::HeaderModifier]>>,
    /// Fields the route's policy adds to the answer before the modifiers (CORS).
    policy_fields: Vec<crate::policy::PolicyField>,
    /// Session persistence: the answer names the endpoint that served it, unless the request
    /// named that one.
    session: Option<SessionAnswer>,
    /// The route's retry policy, and this request's retries under it.
    retry: Option<retry::Retrying>,
    /// The Content-Length body after the head: read whole up to `MAX_BODY`, streamed past it.
    /// For a chunked body, the bytes of it read with the head once it was found whole there.
    body: usize,
    /// The body is chunked: forwarded re-framed, whole with the head when it came with it,
    /// else streamed (`stream`).
    chunked: bool,
    /// The client waits for a 100 Continue before it sends the body (`Expect: 100-continue`):
    /// unless the body came with the head anyway, the head goes up at once and the body
    /// streams after it (`stream`), the backend's 100 relayed as any interim answer.
    awaits_continue: bool,
    /// The client asked to close after this request: the answer says so and the client
    /// connection ends with it.
    close_client: bool,
    /// How long each wait on the backend may last (the route's timeouts).
    bounds: Bounds,
    /// The request counted against its route's limit on requests in progress.
    _slots: Vec<crate::ratelimit::Slot>,
}

/// A route's session persistence, for the answer to one request.
struct SessionAnswer {
    policy: Arc<crate::policy::RoutePolicy>,
    /// The endpoint the request named and was first sent to: the answer names none while
    /// the request stays there, and the new one when a failed connection moved it.
    named: Option<usize>,
}

/// What the access log line needs once the request buffer has moved on.
struct AccessFields {
    client: Option<std::net::IpAddr>,
    method: String,
    host: String,
    path: String,
    route: Arc<snap::Route>,
}

/// Checks and routes a parsed head; forwards it here only when nothing but forwarding is
/// asked of it, and then writes the head to send upstream into `up_head`.
fn plan(head: &FastHead<'_, '_>, env: &Env<'_>, up_head: &mut Vec<u8>) -> Step {
    if env.client_cert_refused {
        return Step::Pingora;
    }
    let checked = match request::check(head, env.limits) {
        Ok(c) => c,
        Err(reject) => {
            tracing::debug!(peer = %env.peer, reason = reject.reason(), "request refused");
            return Step::Reject(reject.status());
        }
    };
    // The fast path's own conditions: HTTP/1.1 origin-form, no body or a small Content-Length
    // one, nothing in the headers that asks for more than forwarding.
    let target = head.target();
    if head.version() != Version::Http11 || target.first() != Some(&b'/') {
        return Step::Pingora;
    }
    // None: a chunked body, whose length nobody knows yet.
    let body = match checked.body {
        Body::None => Some(0),
        Body::Length(n) => match usize::try_from(n) {
            Ok(n) => Some(n),
            Err(_) => return Step::Pingora,
        },
        Body::Chunked => None,
    };
    let mut close = false;
    let mut awaits_continue = false;
    let mut codings = 0;
    for h in head.0.headers.iter() {
        let name = h.name;
        let plain = if name.eq_ignore_ascii_case("connection") {
            match request::connection_option(h.value) {
                Some(option) => {
                    close |= option == ConnectionOption::Close;
                    true
                }
                None => false,
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // Chunked alone, in one field: the body is re-framed on the way (`stream`), so
            // the field stays true. Other codings, and a Content-Length beside it (which
            // Pingora removes, closing the connection after), are Pingora's.
            codings += 1;
            h.value.trim_ascii().eq_ignore_ascii_case(b"chunked")
        } else if name.eq_ignore_ascii_case("content-length") {
            body.is_some()
        } else if name.eq_ignore_ascii_case("expect") {
            // The one expectation there is, on a request with a body to hold back, once.
            // Others (and a second field) are Pingora's to forward or refuse.
            let continues = h.value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
            let first = !awaits_continue;
            awaits_continue = true;
            continues && first && body != Some(0)
        } else {
            !(name.eq_ignore_ascii_case("upgrade") || name.eq_ignore_ascii_case("te"))
        };
        if !plain || codings > 1 {
            return Step::Pingora;
        }
    }
    let mut step = plan_checked(head, &checked, body, awaits_continue, None, env, up_head);
    match &mut step {
        Step::Forward(plan) => plan.close_client = close,
        // A body too large to read and drop here, of a length not known, or that the client
        // holds back until a 100 Continue it will not get, stays unread: the connection ends
        // after the answer.
        Step::Answer(answer) => {
            answer.close_client =
                close || awaits_continue || answer.body.is_none_or(|n| n > MAX_BODY as usize);
        }
        Step::Pingora | Step::Reject(_) => {}
    }
    step
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
    request: (&[u8], &[u8]),
    plan: &mut Plan,
    resp: &mut Vec<u8>,
    env: &Env<'_>,
) -> Result<Exchange, u16> {
    let mut attempts = backend::Attempts::default();
    let (mut upstream, sent) = loop {
        let (mut upstream, sent) = match send(request, plan, resp, env, &mut attempts).await {
            Ok(sent) => sent,
            Err(failed) if plan.send_again(Some(failed), &mut attempts, env).await => continue,
            Err(failed) => return Err(failed.into()),
        };
        // An answer the route's retry policy retries is dropped before any of it goes out,
        // with its connection, and held against its endpoint before the next one is picked
        // (the last answer is, as it is relayed).
        if let Some(retrying) = &plan.retry {
            let head = next_head(&mut upstream, resp, plan, env).await?;
            if retrying.retries(head.status) && plan.may_send_again(None) {
                plan.cluster
                    .record(plan.endpoint, head.status >= 500, &env.limits.outlier);
                if plan.send_again(None, &mut attempts, env).await {
                    continue;
                }
            }
        }
        break (upstream, sent);
    };
    let (exchange, reusable) = relay(conn, &mut upstream, sent, plan, resp, env, None).await?;
    if reusable {
        pool::put(plan.upstream, upstream, env.limits.upstream_idle);
    }
    Ok(exchange)
}

/// Copies the answer whose first bytes are in `resp` from `upstream` to the client, for a
/// request sent at `sent`; with it, whether the backend connection ended the answer cleanly
/// (it may go back to the pool if the request went whole). Err(status): nothing but interim
/// answers was sent to the client, which gets that status. `final_head` is set once the final
/// answer's head came (a client may still be told 408 after a 100 Continue).
async fn relay<W, R>(
    conn: &mut W,
    upstream: &mut R,
    sent: Instant,
    plan: &mut Plan,
    resp: &mut Vec<u8>,
    env: &Env<'_>,
    final_head: Option<&std::sync::atomic::AtomicBool>,
) -> Result<(Exchange, bool), u16>
where
    W: tokio::io::AsyncWrite + Unpin,
    R: tokio::io::AsyncRead + Unpin,
{
    // Response heads: 1xx interim ones are passed on, then the final one.
    let head = loop {
        let h = next_head(upstream, resp, plan, env).await?;
        if !(100..200).contains(&h.status) {
            break h;
        }
        // Pingora runs the response filters on interim heads too.
        let fields = plan.added_fields();
        let written = if plan.response_edits.is_some() || !fields.is_empty() {
            let edits = plan.response_edits.as_deref().unwrap_or_default();
            let added = (&fields[..], edits);
            match edited_response_head(&resp[..h.len], false, added, false) {
                Some(edited) => write_head(conn, &edited, h.version).await,
                None => return Err(502),
            }
        } else {
            write_head(conn, &resp[..h.len], h.version).await
        };
        // At once: a client may wait for a 100 Continue before it sends its body, and a 103's
        // hints are worth something only before the answer.
        if written.is_err() || conn.flush().await.is_err() {
            return Ok((Exchange::client_done(h.status), false));
        }
        resp.drain(..h.len);
    };
    let status = head.status;
    plan.answered(env, sent, status);
    if let Some(flag) = final_head {
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    // The head, then the body as it arrives: each read is flushed to the client at once,
    // so streamed responses (server-sent events, long polls) are not held back.
    let fields = plan.added_fields();
    let written = if plan.response_edits.is_some() || plan.close_client || !fields.is_empty() {
        // The head parsed once already; it parses again the same way.
        let edits = plan.response_edits.as_deref().unwrap_or_default();
        match edited_response_head(
            &resp[..head.len],
            head.drop_length,
            (&fields, edits),
            plan.close_client,
        ) {
            Some(edited) => write_head(conn, &edited, head.version).await,
            None => return Err(502),
        }
    } else if head.drop_length {
        let kept = without_content_length(&resp[..head.len]);
        write_head(conn, &kept, head.version).await
    } else {
        write_head(conn, &resp[..head.len], head.version).await
    };
    if written.is_err() {
        return Ok((Exchange::client_done(status), false));
    }
    let mut framing = head.framing;
    let mut pos = head.len;
    let complete;
    loop {
        let (end, done) = match framing.advance(&resp[pos..]) {
            Ok(step) => step,
            Err(e) => {
                // The head went out: the client can only see the connection end.
                tracing::debug!(upstream = %plan.upstream, error = %e, "response body refused");
                let _ = conn.flush().await;
                return Ok((Exchange::client_done(status), false));
            }
        };
        let upto = pos + end;
        if !done && plan.bounds.past() {
            // The route's time ran out with the body still coming: cut, as on Pingora.
            tracing::debug!(upstream = %plan.upstream, "route timeout passed mid-response");
            let _ = conn.flush().await;
            return Ok((Exchange::client_done(status), false));
        }
        if done {
            // The backend is done with this request: a least-request pick for the client's
            // next one, which may come as soon as these bytes arrive, must not count it.
            plan.in_flight = None;
        }
        if conn.write_all(&resp[pos..upto]).await.is_err() {
            return Ok((Exchange::client_done(status), false));
        }
        if done {
            // Bytes past the response's end: the backend broke framing; do not reuse it.
            complete = upto == resp.len();
            break;
        }
        if conn.flush().await.is_err() {
            return Ok((Exchange::client_done(status), false));
        }
        resp.clear();
        pos = 0;
        match read_more(upstream, resp, plan.bounds.read()).await {
            Ok(n) if n > 0 => {}
            end => {
                // End of stream: the end of a close-delimited body, else a truncated one. A
                // backend that stalled is cut off all the same.
                if end.is_err_and(|e| e.kind() == std::io::ErrorKind::TimedOut) {
                    plan.stalled(env);
                }
                let _ = conn.flush().await;
                return Ok((Exchange::client_done(status), false));
            }
        }
    }
    if conn.flush().await.is_err() {
        return Ok((Exchange::client_done(status), false));
    }
    let exchange = Exchange {
        status,
        keep_client: framing.delimited() && !plan.close_client,
    };
    Ok((exchange, complete && head.reusable))
}

/// Writes a response head to the client; an HTTP/1.0 backend's status line goes out as
/// HTTP/1.1, the version this proxy speaks.
async fn write_head<W: tokio::io::AsyncWrite + Unpin>(
    conn: &mut W,
    head: &[u8],
    version: http1::Version,
) -> std::io::Result<()> {
    if version == http1::Version::Http10 && head.starts_with(b"HTTP/1.0") {
        conn.write_all(b"HTTP/1.1").await?;
        conn.write_all(&head[8..]).await
    } else {
        conn.write_all(head).await
    }
}

mod backend;
pub mod h2;
mod heads;
mod plan;
mod read;
mod retry;
mod stream;
#[cfg(test)]
mod tests;
