//! Requests whose Content-Length body is larger than `MAX_BODY`, chunked ones whose body did
//! not come whole with the head, and ones whose client holds the body back for a 100 Continue
//! (`Expect: 100-continue`): the head goes upstream at once and the body follows as it
//! arrives, at most `CHUNK` of it held at a time. An upload costs the proxy one bounded
//! buffer whatever its size, and stays on this path.
//!
//! - A chunked body is decoded (`http1::Chunked`, strict: hex sizes, CRLF line ends, bounded
//!   lines and trailers) and framed again: what each read brought becomes one chunk, and the
//!   body ends with the last chunk and no trailer fields. Pingora forwards chunked bodies the
//!   same way, so the backend sees the same bytes from either engine, and never the client's
//!   own extensions, whitespace or trailers, on which parsers disagree. A malformed chunk
//!   gets the client 400 (the answer has not begun) or the connection cut (it has), and the
//!   backend connection, holding half a request, is dropped. Bytes after the body's end are
//!   the client's next request.
//! - Such a request is never sent again once body bytes beyond those read with its head went
//!   upstream: they are gone (Pingora's retry buffer has the same bound). Only writing the
//!   head to a pooled connection the backend had closed is retried, on another connection:
//!   an incomplete request cannot have been acted on.
//! - Each read of the body may wait the head deadline (`Limits::request_head`), restarting
//!   with every read; a client that stops sending gets 408, and the backend connection,
//!   left with half a request, is dropped.
//! - The answer is relayed as it comes while the body still goes up: a backend may answer
//!   before the body ends (a 413 of its own), or stream its answer while it reads (an echo).
//!   An answer that ends before the whole body went, and after which the backend keeps its
//!   connection, leaves the rest of the body to go on to it: both connections stay usable,
//!   as with HAProxy. One after which the backend closes (a 413 with `Connection: close`)
//!   ends the exchange: the client's connection closes after the answer, its unsent body
//!   read and dropped for a while (`conn::linger`) so a reset does not cost the client the
//!   answer. A client that stops sending after the answer began gets the rest of it.

use super::backend::{Attempts, open, read_more, write_both};
use super::heads::status_response;
use super::{ANSWER_BUFFER, Env, Exchange, KEPT_BUFFER, Next, Plan, relay};
use crate::conn::Buffered;
use crate::http1::{BadResponse, Chunked, reframe};
use crate::upstream::pool;
use futures::FutureExt;
use std::future::Future;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The most of a body held between the client and the backend at a time.
pub(super) const CHUNK: usize = 64 * 1024;

/// How copying a body upstream ended.
pub(super) enum Pumped {
    /// All of it went.
    Whole,
    /// The client closed (or its connection failed) before the body's end.
    ClientLeft,
    /// The client sent nothing within the head deadline.
    ClientSlow,
    /// Writing to the backend failed (it closed, or took nothing within the upstream timeout).
    BackendFailed(std::io::Error),
    /// The client's chunked framing is malformed.
    Malformed,
}

/// What is still to come of a streamed body.
enum Rest {
    /// This many bytes.
    Length(usize),
    /// Chunks up to the last one, decoded and framed again as they come.
    Chunked(Chunked),
}

/// Answers a request whose chunked body is malformed before anything went upstream: 400, as
/// Pingora answers one; the connection ends.
pub(super) async fn refuse_body(
    conn: &mut Buffered,
    env: &Env<'_>,
    plan: &Plan,
    why: BadResponse,
    started: Instant,
) -> Option<Next> {
    tracing::debug!(peer = %env.peer, error = %why, "request body refused");
    plan.record.done(400, None, started);
    if conn.write_all(status_response(400)).await.is_ok() {
        crate::conn::linger(conn, env.limits.request_head).await;
    }
    Some(Next::Closed)
}

/// Serves a request with a large Content-Length body, or a chunked one, whose head of `len`
/// bytes starts `req`; `up_head` is the head to send upstream. `chunked`: the decoder that
/// took the rest of `req` and the chunk it made of it. None: the connection goes on to its
/// next request.
pub(super) async fn request(
    conn: &mut Buffered,
    env: &Env<'_>,
    (req, len): (&mut Vec<u8>, usize),
    up_head: &[u8],
    chunked: Option<(Chunked, Vec<u8>)>,
    mut plan: Plan,
    started: Instant,
) -> Option<Next> {
    // The part of the body read with the head goes with it.
    let (have, rest) = match &chunked {
        Some((decoder, _)) => (req.len() - len, Rest::Chunked(decoder.clone())),
        None => {
            let have = (req.len() - len).min(plan.body);
            (have, Rest::Length(plan.body - have))
        }
    };
    let first = match &chunked {
        Some((_, reframed)) => &reframed[..],
        None => &req[len..len + have],
    };
    let mut resp: Vec<u8> = Vec::with_capacity(ANSWER_BUFFER);
    // Bytes read past a chunked body's end: the client's next request.
    let mut next = Vec::new();
    let outcome = forward(
        conn,
        (up_head, first),
        rest,
        &mut next,
        &mut plan,
        &mut resp,
        env,
    )
    .await;
    req.drain(..len + have);
    req.splice(0..0, next);
    match outcome {
        Ok(Exchange {
            status,
            keep_client,
        }) => {
            plan.record.done(status, Some(plan.upstream), started);
            if keep_client && !*env.shutdown.borrow() {
                if req.capacity() > 2 * KEPT_BUFFER && req.len() < KEPT_BUFFER {
                    req.shrink_to(KEPT_BUFFER);
                }
                return None;
            }
            crate::conn::linger(conn, env.limits.request_head).await;
        }
        // The client left: nobody to answer.
        Err(0) => plan.record.done(0, None, started),
        Err(status) => {
            let upstream = (status != 408).then_some(plan.upstream);
            plan.record.done(status, upstream, started);
            if conn.write_all(status_response(status)).await.is_ok() {
                crate::conn::linger(conn, env.limits.request_head).await;
            }
        }
    }
    Some(Next::Closed)
}

/// Sends the head, then the body as it comes while the answer is relayed as it comes: a
/// backend may answer before the body ends, and one that streams its answer while it reads
/// (an echo, a progress feed) needs both directions moving at once. Err(status): nothing was
/// sent to the client, which gets that status (0: the client left, nothing to send).
async fn forward(
    conn: &mut Buffered,
    request: (&[u8], &[u8]),
    rest: Rest,
    next: &mut Vec<u8>,
    plan: &mut Plan,
    resp: &mut Vec<u8>,
    env: &Env<'_>,
) -> Result<Exchange, u16> {
    let (mut upstream, sent) = send_head(request, plan, env).await?;
    // Set once the backend's final answer began: past it, a client that stops sending can
    // no longer be told 408 (after a 100 Continue it still can, and the backend, which asked
    // for the body, is not blamed for the wait).
    let answering = AtomicBool::new(false);
    // A client that held its body back for a 100 and got a final answer instead may never
    // send it: the connection is not kept waiting for the rest.
    let awaits_continue = plan.awaits_continue;
    let target = plan.upstream;
    let ((exchange, reusable), body_whole) = {
        let (client_in, mut client_out) = tokio::io::split(&mut *conn);
        let (mut up_in, up_out) = upstream.split();
        let pump = pump(client_in, (up_out, plan.bounds.write()), rest, next, env);
        let answer = async {
            match read_more(&mut up_in, resp, plan.bounds.read()).await {
                Ok(n) if n > 0 => {}
                Err(e) if e.kind() == ErrorKind::TimedOut => return Err(plan.timed_out(env)),
                _ => return Err(backend_failed(plan, env)),
            }
            relay(
                &mut client_out,
                &mut up_in,
                sent,
                plan,
                resp,
                env,
                Some(&answering),
            )
            .await
        };
        let reusable = |(exchange, reusable): &(Exchange, bool)| {
            *reusable && exchange.keep_client && !awaits_continue
        };
        both_ways(pump, answer, reusable, &answering, target, env).await?
    };
    if !body_whole {
        // Answered before the body was all sent: the rest of it is still on its way from
        // the client, and the backend connection holds half a request. Neither goes on.
        return Ok(Exchange {
            status: exchange.status,
            keep_client: false,
        });
    }
    if reusable {
        pool::put(plan.upstream, upstream, env.limits.upstream_idle);
    }
    Ok(exchange)
}

/// Drives the body going up (`pump`) and the answer coming back (`answer`) together until the
/// answer is done; returns the answer's result and whether the whole body went. Err(0): the
/// client left; Err(408): it stopped sending before the answer began (`answering` unset).
///
/// An answer that ended before the body did, and after which both connections may go on
/// (`reusable`: the backend did not ask to close, its framing was clean), does not end the
/// exchange: the rest of the body still goes to the backend, which reads and drops it, so
/// neither connection is lost to an answer that came early (a backend that answers before
/// reading, as an nginx `return` does). Each read and write keeps its deadline.
pub(super) async fn both_ways<T>(
    pump: impl Future<Output = Pumped>,
    answer: impl Future<Output = Result<T, u16>>,
    reusable: impl Fn(&T) -> bool,
    answering: &AtomicBool,
    target: SocketAddr,
    env: &Env<'_>,
) -> Result<(T, bool), u16> {
    tokio::pin!(pump, answer);
    // The pump finished, and whether with the whole body.
    let (mut pumped, mut whole) = (false, false);
    loop {
        tokio::select! {
            // The pump first: an answer that ends just as the body's last bytes went must
            // not pass for one that came before them.
            biased;
            body = &mut pump, if !pumped => match body {
                Pumped::Whole => (pumped, whole) = (true, true),
                Pumped::ClientLeft => return Err(0),
                Pumped::ClientSlow if !answering.load(Ordering::Relaxed) => {
                    tracing::debug!(peer = %env.peer, "request body stalled past the head deadline");
                    return Err(408);
                }
                // The answer began (and may end without the rest of the body), or the
                // backend stopped taking the body: what it answers decides.
                Pumped::ClientSlow => pumped = true,
                Pumped::BackendFailed(e) => {
                    tracing::debug!(upstream = %target, error = %e, "backend took no more of a request body");
                    pumped = true;
                }
                // The backend holds half a request, and the client connection cannot go on.
                Pumped::Malformed => {
                    tracing::debug!(peer = %env.peer, "malformed chunked request body");
                    return Err(if answering.load(Ordering::Relaxed) { 0 } else { 400 });
                }
            },
            relayed = &mut answer => {
                let relayed = relayed?;
                if !pumped {
                    // The echo of the body's last bytes can complete the answer in the same
                    // wake-up as their write completes the pump.
                    whole = match (&mut pump).now_or_never() {
                        Some(body) => matches!(body, Pumped::Whole),
                        None if reusable(&relayed) => matches!(pump.await, Pumped::Whole),
                        None => false,
                    };
                }
                return Ok((relayed, whole));
            }
        }
    }
}

/// A backend that closed or failed in the middle of a request: counted against its endpoint.
pub(super) fn backend_failed(plan: &Plan, env: &Env<'_>) -> u16 {
    plan.cluster
        .record(plan.endpoint, true, &env.limits.outlier);
    502
}

/// Writes the head and the body bytes read with it to a connection to `plan`'s endpoint;
/// returns the connection and when the request went.
pub(super) async fn send_head(
    (head, have): (&[u8], &[u8]),
    plan: &mut Plan,
    env: &Env<'_>,
) -> Result<(TcpStream, Instant), u16> {
    let mut attempts = Attempts::default();
    let mut resent = 0;
    loop {
        if !plan.bounds.start_attempt() {
            return Err(504);
        }
        let (mut up, reused) = open(plan, env, &mut attempts).await?;
        let sent = Instant::now();
        match write_both(&mut up, head, have, plan.bounds.write()).await {
            Ok(()) => return Ok((up, sent)),
            Err(e) if e.kind() == ErrorKind::TimedOut => return Err(plan.timed_out(env)),
            // A pooled connection the backend closed meanwhile: routine, and the request, not
            // whole yet, goes on another.
            Err(_) if reused && resent < crate::request::BROKEN_RESENDS => resent += 1,
            Err(e) => {
                tracing::debug!(upstream = %plan.upstream, error = %e, "writing a request head failed");
                return Err(if reused {
                    502
                } else {
                    backend_failed(plan, env)
                });
            }
        }
    }
}

/// Copies the rest of a body from the client to the backend, a read at a time; bytes read
/// past a chunked body's end go to `next`.
async fn pump<R: AsyncRead + Unpin>(
    mut client: R,
    (mut up, within): (tokio::net::tcp::WriteHalf<'_>, std::time::Duration),
    rest: Rest,
    next: &mut Vec<u8>,
    env: &Env<'_>,
) -> Pumped {
    let (mut left, mut decoder) = match rest {
        Rest::Length(0) => return Pumped::Whole,
        Rest::Length(n) => (n, None),
        Rest::Chunked(decoder) => (usize::MAX, Some(decoder)),
    };
    let mut chunk = vec![0u8; left.min(CHUNK)];
    let mut reframed = Vec::new();
    loop {
        let want = left.min(chunk.len());
        let n = match tokio::time::timeout(env.limits.request_head, client.read(&mut chunk[..want]))
            .await
        {
            Ok(Ok(n)) if n > 0 => n,
            Ok(_) => return Pumped::ClientLeft,
            Err(_) => return Pumped::ClientSlow,
        };
        let (out, whole) = match &mut decoder {
            None => {
                left -= n;
                (&chunk[..n], left == 0)
            }
            Some(decoder) => {
                reframed.clear();
                match reframe(decoder, &chunk[..n], &mut reframed) {
                    Ok(None) => (&reframed[..], false),
                    Ok(Some(end)) => {
                        next.extend_from_slice(&chunk[end..n]);
                        (&reframed[..], true)
                    }
                    Err(_) => return Pumped::Malformed,
                }
            }
        };
        if !out.is_empty() {
            match tokio::time::timeout(within, up.write_all(out)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Pumped::BackendFailed(e),
                Err(_) => return Pumped::BackendFailed(ErrorKind::TimedOut.into()),
            }
        }
        if whole {
            return Pumped::Whole;
        }
    }
}
