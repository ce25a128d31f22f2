//! A stream the fast path serves itself: forwarded upstream as HTTP/1.1 over this worker's
//! pool, or answered here (401, 429), with the answer's HTTP/1 framing turned into HEADERS
//! and DATA frames on the client's windows.

use super::shared::{Gone, Recv, Shared};
use crate::fastpath::heads::edited_response_head;
use crate::fastpath::stream::{CHUNK, Pumped, backend_failed, both_ways, send_head};
use crate::fastpath::{
    ANSWER_BUFFER, Answered, Env, MAX_BODY, MAX_RESPONSE_HEADERS, Plan, next_head, read_more, send,
};
use crate::http1::Framing;
use crate::http2::ErrorCode;
use crate::http2::conn::Connection;
use crate::metrics::Metrics;
use crate::upstream::pool;
use bytes::BytesMut;
use std::io::ErrorKind;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncWriteExt};

/// Serves a forwarded stream to its end; the stream's status goes to its record.
pub(super) async fn forward(
    shared: &Shared,
    stream: u32,
    mut plan: Plan,
    up_head: Vec<u8>,
    env: &Env<'_>,
    started: Instant,
) {
    if plan.chunked || plan.body > MAX_BODY as usize {
        return streamed(shared, stream, plan, up_head, env, started).await;
    }
    let body = if plan.body > 0 {
        match read_body(shared, stream, plan.body, env).await {
            Ok(body) => body,
            Err(status) => {
                plan.record.done(status, None, started);
                if status > 0 {
                    respond(&mut shared.lock().conn, stream, status);
                }
                return;
            }
        }
    } else {
        BytesMut::new()
    };
    let mut resp = Vec::with_capacity(crate::fastpath::ANSWER_BUFFER);
    let outcome = tokio::select! {
        biased;
        // Reset by the client: the backend exchange is dropped with its connection, and
        // the stream counts as one whose client left (status 0).
        () = shared.closed(stream) => Ok(0),
        outcome = exchange(shared, stream, (&up_head, &body[..]), &mut plan, &mut resp, env) => outcome,
    };
    let status = match outcome {
        Ok(status) | Err(status) => status,
    };
    plan.record.done(status, Some(plan.upstream), started);
    if let Err(status) = outcome {
        respond(&mut shared.lock().conn, stream, status);
    }
}

/// An answer decided here: its head, then the stream ends (the client, told to stop
/// sending, keeps its connection).
pub(super) fn answer(conn: &mut Connection, stream: u32, answer: Answered, started: Instant) {
    answer.record.done(answer.status, None, started);
    let mut fields: Vec<(&[u8], &[u8])> = Vec::with_capacity(answer.fields.len() + 1);
    for (name, value, _) in &answer.fields {
        fields.push((name.as_bytes(), value.as_bytes()));
    }
    fields.push((b"content-length", b"0"));
    let _ = conn.send_headers(stream, Some(answer.status), fields, true);
}

/// Reads a Content-Length body whole within the head deadline, as the HTTP/1 fast path
/// does. Err(408): it did not come in time; Err(0): the stream was reset (the loop resets
/// one whose DATA disagrees with its Content-Length).
async fn read_body(
    shared: &Shared,
    stream: u32,
    length: usize,
    env: &Env<'_>,
) -> Result<BytesMut, u16> {
    let deadline = tokio::time::Instant::now() + env.limits.request_head;
    let mut body = BytesMut::new();
    loop {
        match tokio::time::timeout_at(deadline, shared.recv(stream, usize::MAX)).await {
            Ok(Recv::Data(chunk)) if body.is_empty() => body = chunk,
            Ok(Recv::Data(chunk)) => body.extend_from_slice(&chunk),
            // Trailers have nowhere to go on a Content-Length request to HTTP/1 (Pingora
            // drops them too).
            Ok(Recv::End(_)) if body.len() == length => return Ok(body),
            Ok(Recv::End(_) | Recv::Reset) => return Err(0),
            Err(_) => {
                tracing::debug!(peer = %env.peer, "request body deadline passed");
                return Err(408);
            }
        }
    }
}

/// Sends the request upstream and streams the answer back. Ok(status): the response head
/// went out (the stream is then finished, or reset when the backend broke off its body);
/// Err(status): nothing went out, and the client gets that status.
async fn exchange(
    shared: &Shared,
    stream: u32,
    request: (&[u8], &[u8]),
    plan: &mut Plan,
    resp: &mut Vec<u8>,
    env: &Env<'_>,
) -> Result<u16, u16> {
    let mut attempts = crate::fastpath::backend::Attempts::default();
    let (mut upstream, sent) = send(request, plan, resp, env, &mut attempts).await?;
    let (status, reusable) = relay(shared, stream, &mut upstream, sent, plan, resp, env).await?;
    if reusable {
        pool::put(plan.upstream, upstream, env.limits.upstream_idle);
    }
    Ok(status)
}

/// A stream whose Content-Length body is larger than `MAX_BODY`, or whose body has no
/// Content-Length (sent chunked, each DATA frame's payload a chunk): the head goes upstream at
/// once, and the body follows as its DATA arrives while the answer comes back, as on HTTP/1
/// (`fastpath::stream` says how, and what happens when either side stops). Taking the DATA
/// reopens the client's window, so the stream holds at most its window and one chunk.
async fn streamed(
    shared: &Shared,
    stream: u32,
    mut plan: Plan,
    up_head: Vec<u8>,
    env: &Env<'_>,
    started: Instant,
) {
    let mut resp = Vec::with_capacity(ANSWER_BUFFER);
    let outcome = tokio::select! {
        biased;
        // Reset by the client: the backend exchange is dropped with its connection.
        () = shared.closed(stream) => Err(0),
        outcome = stream_exchange(shared, stream, &up_head, &mut plan, &mut resp, env) => outcome,
    };
    match outcome {
        Ok(status) => plan.record.done(status, Some(plan.upstream), started),
        Err(0) => plan.record.done(0, None, started),
        Err(status) => {
            let upstream = (status != 408).then_some(plan.upstream);
            plan.record.done(status, upstream, started);
            respond(&mut shared.lock().conn, stream, status);
        }
    }
}

/// Sends the head, then the body as it comes while the answer is relayed as it comes.
/// Ok(status): the answer's head went out; Err(status): nothing went out, and the client
/// gets that status (0: the stream is gone, nothing to send).
async fn stream_exchange(
    shared: &Shared,
    stream: u32,
    head: &[u8],
    plan: &mut Plan,
    resp: &mut Vec<u8>,
    env: &Env<'_>,
) -> Result<u16, u16> {
    let (mut upstream, sent) = send_head((head, &[]), plan, env).await?;
    // Set once the backend's answer began: past it, a client that stops sending can no
    // longer be told 408.
    let answering = AtomicBool::new(false);
    let target = plan.upstream;
    let ((status, reusable), body_whole) = {
        let (mut up_in, up_out) = upstream.split();
        let pump = pump(
            shared,
            stream,
            (up_out, plan.bounds.write()),
            plan.chunked,
            env,
        );
        let answer = async {
            match read_more(&mut up_in, resp, plan.bounds.read()).await {
                Ok(n) if n > 0 => answering.store(true, Ordering::Relaxed),
                Err(e) if e.kind() == ErrorKind::TimedOut => return Err(plan.timed_out(env)),
                _ => return Err(backend_failed(plan, env)),
            }
            relay(shared, stream, &mut up_in, sent, plan, resp, env).await
        };
        // An answer that ends tells the client to stop sending (RST_STREAM NO_ERROR, from
        // `http2::conn`), so the rest of an early-answered body never comes: the backend
        // connection, holding half a request, is not kept.
        both_ways(pump, answer, |_| false, &answering, target, env).await?
    };
    if !body_whole {
        // The answer ended before the body: the client may stop sending the rest without
        // error (RFC 9113 section 8.1); the backend connection holds half a request.
        shared.finish(stream, ErrorCode::NoError);
        return Ok(status);
    }
    if reusable {
        pool::put(plan.upstream, upstream, env.limits.upstream_idle);
    }
    Ok(status)
}

/// Copies the stream's DATA to the backend as it comes, until the stream's end; `chunked`:
/// each payload framed as a chunk, and the last chunk at the end.
async fn pump(
    shared: &Shared,
    stream: u32,
    (mut up, within): (tokio::net::tcp::WriteHalf<'_>, std::time::Duration),
    chunked: bool,
    env: &Env<'_>,
) -> Pumped {
    let mut framed = Vec::new();
    loop {
        let data =
            match tokio::time::timeout(env.limits.request_head, shared.recv(stream, CHUNK)).await {
                Ok(Recv::Data(data)) => data,
                // The inbox resets a stream whose DATA disagree with its Content-Length, so its
                // end is the whole body. Trailers are dropped, as `read_body` drops them (and
                // Pingora drops them on the way to HTTP/1).
                Ok(Recv::End(_)) if chunked => {
                    return match write(&mut up, b"0\r\n\r\n", within).await {
                        Ok(()) => Pumped::Whole,
                        Err(e) => Pumped::BackendFailed(e),
                    };
                }
                Ok(Recv::End(_)) => return Pumped::Whole,
                Ok(Recv::Reset) => return Pumped::ClientLeft,
                Err(_) => return Pumped::ClientSlow,
            };
        // An empty payload would read as the last chunk.
        let out = if !chunked {
            &data[..]
        } else if data.is_empty() {
            continue;
        } else {
            framed.clear();
            // Into the reused buffer: no allocation per frame.
            let _ = std::io::Write::write_fmt(&mut framed, format_args!("{:x}\r\n", data.len()));
            framed.extend_from_slice(&data);
            framed.extend_from_slice(b"\r\n");
            &framed[..]
        };
        if let Err(e) = write(&mut up, out, within).await {
            return Pumped::BackendFailed(e);
        }
    }
}

/// Writes to the backend, waiting at most `within`.
async fn write(
    up: &mut tokio::net::tcp::WriteHalf<'_>,
    bytes: &[u8],
    within: std::time::Duration,
) -> std::io::Result<()> {
    match tokio::time::timeout(within, up.write_all(bytes)).await {
        Ok(result) => result,
        Err(_) => Err(ErrorKind::TimedOut.into()),
    }
}

/// Relays the answer whose first bytes are in `resp` from `upstream` as HEADERS and DATA,
/// for a request sent at `sent`; with its status, whether the backend connection ended the
/// answer cleanly (it may be pooled if the request went whole). Ok: the head went out (the
/// stream is then finished, or reset when the backend broke off its body); Err(status):
/// nothing went out, and the client gets that status.
async fn relay<R: AsyncRead + Unpin>(
    shared: &Shared,
    stream: u32,
    upstream: &mut R,
    sent: Instant,
    plan: &mut Plan,
    resp: &mut Vec<u8>,
    env: &Env<'_>,
) -> Result<(u16, bool), u16> {
    let head = loop {
        let h = next_head(upstream, resp, plan, env).await?;
        if !(100..200).contains(&h.status) {
            break h;
        }
        // An interim answer has no place before this stream's one HEADERS frame of the
        // final answer here (as on Pingora, which drops them on HTTP/2).
        resp.drain(..h.len);
    };
    let status = head.status;
    plan.answered(env, sent, status);
    let mut framing = head.framing;
    let empty = matches!(framing, Framing::Length(0));
    if empty {
        plan.in_flight = None;
    }
    let edited;
    let fields = plan.added_fields();
    let response_head = if plan.response_edits.is_some() || !fields.is_empty() {
        let edits = plan.response_edits.as_deref().unwrap_or_default();
        let added = (&fields[..], edits);
        edited = edited_response_head(&resp[..head.len], head.drop_length, added, false)
            .ok_or(502u16)?;
        &edited[..]
    } else {
        &resp[..head.len]
    };
    if write_head(shared, stream, response_head, head.drop_length, empty)? {
        return Ok((status, false));
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
                    shared.finish(stream, ErrorCode::Internal);
                    return Ok((status, false));
                }
            };
            if !done && plan.bounds.past() {
                // The route's time ran out with the body still coming: cut, as on Pingora.
                tracing::debug!(upstream = %plan.upstream, "route timeout passed mid-response");
                shared.finish(stream, ErrorCode::Internal);
                return Ok((status, false));
            }
            if done {
                plan.in_flight = None;
            }
            let last = ranges.len();
            let mut ended = false;
            for (i, r) in ranges.drain(..).enumerate() {
                // The body's last DATA frame carries END_STREAM: no empty frame after it.
                let end = done && i + 1 == last;
                ended |= end;
                let data = &resp[pos + r.start..pos + r.end];
                if let Err(gone) = shared
                    .send_data(stream, data, end, env.limits.client_send)
                    .await
                {
                    if gone == Gone::Stalled {
                        Metrics::count(&env.table.metrics().client_send_timeouts);
                    }
                    return Ok((status, false));
                }
            }
            if done {
                if !ended
                    && shared
                        .send_data(stream, &[], true, env.limits.client_send)
                        .await
                        .is_err()
                {
                    return Ok((status, false));
                }
                // Bytes past the response's end: the backend broke framing; do not reuse it.
                complete = pos + end == resp.len();
                break;
            }
            resp.clear();
            pos = 0;
            let read = read_more(upstream, resp, plan.bounds.read()).await;
            if !matches!(read, Ok(n) if n > 0) {
                let stalled = read.is_err_and(|e| e.kind() == std::io::ErrorKind::TimedOut);
                if stalled {
                    plan.stalled(env);
                }
                if framing.delimited() || stalled {
                    // Cut short: the client must not take a truncated body for the whole.
                    shared.finish(stream, ErrorCode::Internal);
                    return Ok((status, false));
                }
                // A body that ends when the backend closes has ended.
                if shared
                    .send_data(stream, &[], true, env.limits.client_send)
                    .await
                    .is_err()
                {
                    return Ok((status, false));
                }
                complete = false;
                break;
            }
        }
    }
    Ok((status, complete && head.reusable))
}

/// Fields HTTP/2 forbids in a message (RFC 9113 section 8.2.2), taken off a backend's head
/// as Pingora takes them off.
fn connection_specific(name: &str) -> bool {
    [
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
    ]
    .iter()
    .any(|n| name.eq_ignore_ascii_case(n))
}

/// Sends a backend's HTTP/1 response head as HEADERS. Ok(true): the stream is gone, and
/// nothing more is sent; Err(502): the head does not parse again (it parsed once).
fn write_head(
    shared: &Shared,
    stream: u32,
    head: &[u8],
    drop_length: bool,
    end: bool,
) -> Result<bool, u16> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
    let mut parsed = httparse::Response::new(&mut fields);
    let status = match parsed.parse(head) {
        Ok(httparse::Status::Complete(_)) => parsed.code.ok_or(502u16)?,
        _ => return Err(502),
    };
    let kept = parsed.headers.iter().filter(|h| {
        !(connection_specific(h.name)
            || (drop_length && h.name.eq_ignore_ascii_case("content-length")))
    });
    let gone = shared
        .send_headers(
            stream,
            Some(status),
            kept.map(|h| (h.name.as_bytes(), h.value)),
            end,
        )
        .is_err();
    Ok(gone)
}

/// The status of a request that could not be forwarded, without a body (as the HTTP/1 fast
/// path's `status_response`).
fn respond(conn: &mut Connection, stream: u32, status: u16) {
    let mut fields: Vec<(&[u8], &[u8])> = Vec::with_capacity(2);
    fields.push((b"content-length", b"0"));
    if status >= 500 {
        fields.push((b"cache-control", b"private, no-store"));
    }
    let _ = conn.send_headers(stream, Some(status), fields, true);
}
