//! HTTP/2 connections (ALPN h2, or cleartext with prior knowledge), served stream by stream
//! the way `fastpath` serves HTTP/1 requests.
//!
//! An HTTP/2 connection carries requests for any route at once, so it cannot go to one
//! engine whole. This loop accepts each stream, reads its head through the request layer
//! and then either forwards it here or hands that one stream to Pingora, which serves it as
//! it would on a connection of its own:
//! - forwarded here: what the HTTP/1 fast path takes (a `passthrough` route, header modifiers
//!   at most), with an origin-form :path, no Host field beside :authority, no `te` or
//!   `expect` field, and no body or one of at most `MAX_BODY` announced by Content-Length.
//!   It goes upstream as HTTP/1.1 over this worker's pool, Host taken from :authority as
//!   Pingora takes it, and the answer comes back as HEADERS and DATA frames, its HTTP/1
//!   framing taken off;
//! - everything else (gRPC, other routes, bodies of unknown length, refusals) is Pingora's.
//!
//! The streams of a connection run in its task, not in a task each: forwarding one stream
//! needs no channel or task switch between the client's frames and the backend's bytes.

use super::{Env, MAX_BODY, Plan, Step, next_head, send};
use crate::head::PingoraHead;
use crate::http1::Framing;
use crate::metrics::Metrics;
use crate::request::{self, Body, Head};
use crate::upstream::pool;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use pingora::apps::HttpServerApp;
use pingora::http::ResponseHeader;
use pingora::protocols::http::ServerSession;
use pingora::protocols::http::v2::server::{H2Accept, HttpSession, handshake};
use pingora::protocols::{Digest, Stream};
use std::sync::Arc;
use std::time::Instant;

/// Streams a connection may have refused (malformed heads) before it is closed: as Pingora
/// bounds it, so a client cannot make the proxy reject streams for ever on one connection.
const MAX_REJECTED_STREAMS: usize = 32;

/// Serves an HTTP/2 connection until the client closes it, it idles for
/// `keepalive_idle` with no stream open, or the listener stops (then streams in progress
/// finish after a GOAWAY). `pingora` serves the streams this path does not forward.
pub async fn serve<P: HttpServerApp + Send + Sync + 'static>(
    io: Stream,
    env: &Env<'_>,
    pingora: &Arc<P>,
) {
    let digest = Arc::new(Digest {
        ssl_digest: io.get_ssl_digest(),
        timing_digest: io.get_timing_digest(),
        proxy_digest: io.get_proxy_digest(),
        socket_digest: io.get_socket_digest(),
    });
    // The client's preface and settings are due as soon as it connected.
    let mut conn = match tokio::time::timeout(env.limits.request_head, handshake(io, None)).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            tracing::debug!(peer = %env.peer, error = %e, "HTTP/2 handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(peer = %env.peer, "HTTP/2 preface deadline passed");
            return;
        }
    };
    let mut closing = env.closing.clone();
    let mut shutdown = env.shutdown.clone();
    let mut draining = *shutdown.borrow() || *closing.borrow();
    if draining {
        conn.graceful_shutdown();
    }
    // Made once, not per turn of the loop: each `changed()` registers a waiter.
    let stop = async {
        tokio::select! {
            _ = closing.changed() => {}
            _ = shutdown.changed() => {}
        }
    };
    tokio::pin!(stop);
    let mut streams = FuturesUnordered::new();
    let mut rejected = 0usize;
    let idle = tokio::time::sleep(env.limits.keepalive_idle);
    tokio::pin!(idle);
    loop {
        let open = !streams.is_empty();
        tokio::select! {
            biased;
            () = &mut stop, if !draining => {
                conn.graceful_shutdown();
                draining = true;
            }
            Some(()) = streams.next(), if open => {
                if streams.is_empty() {
                    idle.as_mut().reset(tokio::time::Instant::now() + env.limits.keepalive_idle);
                }
            }
            // Accepting drives the connection: it is polled whatever the streams are doing.
            accepted = HttpSession::from_h2_conn(&mut conn, digest.clone()) => match accepted {
                Ok(Some(H2Accept::Session(session))) => {
                    streams.push(stream(session, env, pingora));
                }
                Ok(Some(H2Accept::Rejected)) => {
                    Metrics::count(&env.table.metrics().requests_refused);
                    rejected += 1;
                    if rejected > MAX_REJECTED_STREAMS {
                        tracing::debug!(peer = %env.peer, "too many malformed streams; connection closed");
                        return;
                    }
                }
                // Closed by the client, after a GOAWAY, or broken: nothing more to serve.
                Ok(None) => return,
                Err(e) => {
                    tracing::debug!(peer = %env.peer, error = %e, "HTTP/2 connection ended");
                    return;
                }
            },
            () = &mut idle, if !open => return,
        }
    }
}

/// One stream: forwarded here, answered here (401, 429), or Pingora's.
async fn stream<P: HttpServerApp + Send + Sync + 'static>(
    mut session: HttpSession,
    env: &Env<'_>,
    pingora: &Arc<P>,
) {
    let started = Instant::now();
    // A client that takes none of the answer (its flow-control window shut) holds the stream
    // only this long without progress; then it is reset. Set here, it holds on either engine:
    // Pingora serves the stream with this session.
    session.set_write_timeout(Some(env.limits.client_send));
    // Room for a usual head with the forwarded fields, so writing it does not reallocate.
    let mut up_head = Vec::with_capacity(1024);
    let step = if env.limits.fast_path {
        plan(&session, env, &mut up_head)
    } else {
        Step::Pingora
    };
    if matches!(step, Step::Answer(_) | Step::Forward(_)) {
        Metrics::count(&env.table.metrics().http2_streams_fast_path);
    }
    let mut plan = match step {
        // Refusals too: Pingora answers them as it does on a stream of its own.
        Step::Pingora | Step::Reject(_) => {
            Metrics::count(&env.table.metrics().http2_streams_pingora);
            let _ = pingora
                .process_new_http(ServerSession::new_http2(session), env.shutdown)
                .await;
            return;
        }
        Step::Answer(answer) => {
            answer.record.done(answer.status, None, started);
            let (name, value) = answer.field;
            respond(&mut session, answer.status, Some((name, &value)));
            return;
        }
        Step::Forward(plan) => plan,
    };
    let body = if plan.body > 0 {
        match read_body(&mut session, plan.body, env).await {
            Ok(body) => body,
            Err(status) => {
                plan.record.done(status, None, started);
                if status > 0 {
                    respond(&mut session, status, None);
                }
                return;
            }
        }
    } else {
        Vec::new()
    };
    let mut resp = Vec::with_capacity(super::ANSWER_BUFFER);
    let outcome = exchange(&mut session, (&up_head, &body), &mut plan, &mut resp, env).await;
    let status = match outcome {
        Ok(status) | Err(status) => status,
    };
    plan.record.done(status, Some(plan.upstream), started);
    if let Err(status) = outcome {
        respond(&mut session, status, None);
    }
}

/// The HTTP/2 side of `fastpath::plan`: the stream's own conditions, then routing and the
/// decision as for HTTP/1.
fn plan(session: &HttpSession, env: &Env<'_>, up_head: &mut Vec<u8>) -> Step {
    if env.client_cert_refused {
        return Step::Pingora;
    }
    let req = session.req_header();
    let head = PingoraHead(req);
    let Ok(checked) = request::check(&head, env.limits) else {
        return Step::Pingora;
    };
    // Pingora reconciles a Host field with :authority; a stream with both is left to it.
    if head.target().first() != Some(&b'/')
        || req.uri.authority().is_none()
        || req.headers.contains_key("host")
        || req.headers.contains_key("te")
        || req.headers.contains_key("expect")
    {
        return Step::Pingora;
    }
    // HTTP/2 frames the body itself: a stream that ends with its head has none, whatever it
    // says, and one without a Content-Length has a length nobody knows yet.
    let body = if session.is_body_empty() {
        0
    } else {
        match checked.body {
            Body::Length(n) if n <= MAX_BODY => n as usize,
            _ => return Step::Pingora,
        }
    };
    super::plan_checked(&head, &checked, body, Some(checked.host), env, up_head)
}

/// Reads a Content-Length body whole, within the head deadline (as the HTTP/1 fast path
/// does). Err(408): it did not come in time; Err(0): the stream broke (h2 resets a stream
/// whose DATA disagrees with its Content-Length).
async fn read_body(
    session: &mut HttpSession,
    length: usize,
    env: &Env<'_>,
) -> Result<Vec<u8>, u16> {
    let deadline = tokio::time::Instant::now() + env.limits.request_head;
    let mut body = Vec::with_capacity(length);
    loop {
        match tokio::time::timeout_at(deadline, session.read_body_bytes()).await {
            Ok(Ok(Some(chunk))) => {
                if body.len() + chunk.len() > length {
                    return Err(0);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(Ok(None)) if body.len() == length => return Ok(body),
            Ok(_) => return Err(0),
            Err(_) => {
                tracing::debug!(peer = %env.peer, "request body deadline passed");
                return Err(408);
            }
        }
    }
}

/// Sends the request upstream and streams the answer back as HEADERS and DATA. Ok(status):
/// the response head went out (the stream is then finished, or reset when the backend
/// broke off its body); Err(status): nothing went out, and the client gets that status.
async fn exchange(
    session: &mut HttpSession,
    request: (&[u8], &[u8]),
    plan: &mut Plan,
    resp: &mut Vec<u8>,
    env: &Env<'_>,
) -> Result<u16, u16> {
    let (mut upstream, sent) = send(request, plan, resp, env).await?;
    let head = loop {
        let h = next_head(&mut upstream, resp, plan, env).await?;
        if !(100..200).contains(&h.status) {
            break h;
        }
        // An interim answer has no place in this stream's one HEADERS frame (Pingora drops
        // them on HTTP/2 too).
        resp.drain(..h.len);
    };
    let status = head.status;
    plan.answered(env, sent, status);
    let Some(mut header) = response_header(&resp[..head.len], head.drop_length) else {
        return Err(502);
    };
    if let Some(edits) = &plan.response_edits {
        for m in edits.iter() {
            crate::filters::modify_headers(&mut header, m);
        }
    }
    let mut framing = head.framing;
    let empty = matches!(framing, Framing::Length(0));
    if empty {
        plan.in_flight = None;
    }
    if session
        .write_response_header(Box::new(header), empty)
        .is_err()
    {
        return Ok(status);
    }
    let mut complete = true;
    if !empty {
        let mut pos = head.len;
        let mut ranges: Vec<std::ops::Range<usize>> = Vec::new();
        loop {
            let (end, done) = match framing.advance_data(&resp[pos..], &mut |r| ranges.push(r)) {
                Ok(step) => step,
                Err(e) => {
                    tracing::debug!(upstream = %plan.upstream, error = %e, "response body refused");
                    session.shutdown();
                    return Ok(status);
                }
            };
            if done {
                plan.in_flight = None;
            }
            let last = ranges.len();
            for (i, r) in ranges.drain(..).enumerate() {
                let data = Bytes::copy_from_slice(&resp[pos + r.start..pos + r.end]);
                // The body's last DATA frame carries END_STREAM: no empty frame after it.
                let end = done && i + 1 == last;
                if let Err(e) = session.write_body(data, end).await {
                    if e.etype() == &pingora::ErrorType::WriteTimedout {
                        Metrics::count(&env.table.metrics().client_send_timeouts);
                    }
                    return Ok(status);
                }
            }
            if done {
                // Bytes past the response's end: the backend broke framing; do not reuse it.
                complete = pos + end == resp.len();
                break;
            }
            resp.clear();
            pos = 0;
            let read = super::read_more(&mut upstream, resp, env.limits.upstream_timeout).await;
            if !matches!(read, Ok(n) if n > 0) {
                let stalled = read.is_err_and(|e| e.kind() == std::io::ErrorKind::TimedOut);
                if stalled {
                    plan.stalled(env);
                }
                if framing.delimited() || stalled {
                    // Cut short: the client must not take a truncated body for the whole.
                    session.shutdown();
                    return Ok(status);
                }
                // A body that ends when the backend closes has ended.
                complete = false;
                break;
            }
        }
    }
    if session.finish().is_err() {
        return Ok(status);
    }
    if complete && head.reusable {
        pool::put(plan.upstream, upstream, env.limits.upstream_idle);
    }
    Ok(status)
}

/// A backend's HTTP/1 response head as an HTTP/2 one: its fields, less Content-Length beside
/// a Transfer-Encoding (Pingora's session takes the connection-specific ones off).
fn response_header(head: &[u8], drop_length: bool) -> Option<ResponseHeader> {
    let mut fields = [httparse::EMPTY_HEADER; super::MAX_RESPONSE_HEADERS];
    let mut parsed = httparse::Response::new(&mut fields);
    parsed.parse(head).ok()?;
    // HTTP/2 names are lowercase on the wire: no map of the names' case to fill per field.
    let mut header =
        ResponseHeader::build_no_case(parsed.code?, Some(parsed.headers.len())).ok()?;
    for h in parsed.headers.iter() {
        if drop_length && h.name.eq_ignore_ascii_case("content-length") {
            continue;
        }
        let name = hyper::header::HeaderName::from_bytes(h.name.as_bytes()).ok()?;
        let value = hyper::header::HeaderValue::from_bytes(h.value).ok()?;
        header.append_header(name, value).ok()?;
    }
    Some(header)
}

/// An answer without a body, decided here: 401 and 429 with their field, or the status of a
/// request that could not be forwarded (as the HTTP/1 fast path's `status_response`).
fn respond(session: &mut HttpSession, status: u16, field: Option<(&'static str, &str)>) {
    let Ok(mut header) = ResponseHeader::build_no_case(status, Some(3)) else {
        return;
    };
    if let Some((name, value)) = field {
        let _ = header.insert_header(name, value);
    }
    let _ = header.insert_header("content-length", "0");
    if status >= 500 {
        let _ = header.insert_header("cache-control", "private, no-store");
    }
    let _ = session.write_response_header(Box::new(header), true);
}
