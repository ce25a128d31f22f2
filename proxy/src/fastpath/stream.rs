//! Requests whose Content-Length body is larger than `MAX_BODY`: the head goes upstream at
//! once and the body follows as it arrives, at most `CHUNK` of it held at a time. An upload
//! costs the proxy one bounded buffer whatever its size, and stays on this path.
//!
//! - Such a request is never sent again once body bytes beyond those read with its head went
//!   upstream: they are gone (Pingora's retry buffer has the same bound). Only writing the
//!   head to a pooled connection the backend had closed is retried, on another connection:
//!   an incomplete request cannot have been acted on.
//! - Each read of the body may wait the head deadline (`Limits::request_head`), restarting
//!   with every read; a client that stops sending gets 408, and the backend connection,
//!   left with half a request, is dropped.
//! - A backend may answer before the body ends (a 413 of its own, a redirect): the answer is
//!   relayed at once and no more of the body is sent. That backend connection is not reused,
//!   and the client's closes after the answer, its unsent body read and dropped for a while
//!   (`conn::linger`) so a reset does not cost the client the answer.

use super::backend::{Attempts, open, read_more, write_both};
use super::heads::status_response;
use super::{ANSWER_BUFFER, Env, Exchange, KEPT_BUFFER, Next, Plan, relay};
use crate::conn::Buffered;
use std::io::ErrorKind;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The most of a body held between the client and the backend at a time.
const CHUNK: usize = 64 * 1024;

/// How copying a body upstream ended.
enum Pumped {
    /// All of it went.
    Whole,
    /// The backend's answer began first; its first bytes are in the answer buffer.
    Answered,
    /// The client closed (or its connection failed) before the body's end.
    ClientLeft,
    /// The client sent nothing within the head deadline.
    ClientSlow,
    /// Writing to or reading from the backend failed, or it closed.
    BackendFailed(std::io::Error),
}

/// Serves a request with a large Content-Length body whose head of `len` bytes starts `req`;
/// `up_head` is the head to send upstream. None: the connection goes on to its next request.
pub(super) async fn request(
    conn: &mut Buffered,
    env: &Env<'_>,
    req: &mut Vec<u8>,
    len: usize,
    up_head: &[u8],
    mut plan: Plan,
    started: Instant,
) -> Option<Next> {
    // The part of the body read with the head goes with it.
    let have = (req.len() - len).min(plan.body);
    let rest = plan.body - have;
    let mut resp: Vec<u8> = Vec::with_capacity(ANSWER_BUFFER);
    let outcome = forward(
        conn,
        (up_head, &req[len..len + have]),
        rest,
        &mut plan,
        &mut resp,
        env,
    )
    .await;
    req.drain(..len + have);
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

/// Sends the head and the body upstream and relays the answer. Err(status): nothing was
/// sent to the client, which gets that status (0: the client left, nothing to send).
async fn forward(
    conn: &mut Buffered,
    request: (&[u8], &[u8]),
    rest: usize,
    plan: &mut Plan,
    resp: &mut Vec<u8>,
    env: &Env<'_>,
) -> Result<Exchange, u16> {
    let (mut upstream, sent) = send_head(request, plan, env).await?;
    match pump(conn, &mut upstream, rest, resp, env).await {
        Pumped::Whole => {
            if resp.is_empty() {
                match read_more(&mut upstream, resp, env.limits.upstream_timeout).await {
                    Ok(n) if n > 0 => {}
                    Err(e) if e.kind() == ErrorKind::TimedOut => return Err(plan.timed_out(env)),
                    _ => return Err(backend_failed(plan, env)),
                }
            }
            relay(conn, upstream, sent, plan, resp, env, true).await
        }
        Pumped::Answered => {
            // The rest of the body stays unread: the client connection cannot go on.
            plan.close_client = true;
            relay(conn, upstream, sent, plan, resp, env, false).await
        }
        Pumped::ClientLeft => Err(0),
        Pumped::ClientSlow => {
            tracing::debug!(peer = %env.peer, "request body stalled past the head deadline");
            Err(408)
        }
        Pumped::BackendFailed(e) if e.kind() == ErrorKind::TimedOut => Err(plan.timed_out(env)),
        Pumped::BackendFailed(e) => {
            tracing::debug!(upstream = %plan.upstream, error = %e, "backend failed during a request body");
            Err(backend_failed(plan, env))
        }
    }
}

/// A backend that closed or failed in the middle of a request: counted against its endpoint.
fn backend_failed(plan: &Plan, env: &Env<'_>) -> u16 {
    plan.cluster
        .record(plan.endpoint, true, &env.limits.outlier);
    502
}

/// Writes the head and the body bytes read with it to a connection to `plan`'s endpoint;
/// returns the connection and when the request went.
async fn send_head(
    (head, have): (&[u8], &[u8]),
    plan: &mut Plan,
    env: &Env<'_>,
) -> Result<(TcpStream, Instant), u16> {
    let mut attempts = Attempts::default();
    let mut resent = 0;
    loop {
        let (mut up, reused) = open(plan, env, &mut attempts).await?;
        let sent = Instant::now();
        match write_both(&mut up, head, have, env.limits.upstream_timeout).await {
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

/// Copies `rest` bytes of body from the client to `up`, a chunk at a time, until they all
/// went or the backend's answer begins (read into `resp`).
async fn pump(
    conn: &mut Buffered,
    up: &mut TcpStream,
    mut rest: usize,
    resp: &mut Vec<u8>,
    env: &Env<'_>,
) -> Pumped {
    if rest == 0 {
        return Pumped::Whole;
    }
    let mut chunk = vec![0u8; rest.min(CHUNK)];
    let (reader, mut writer) = up.split();
    let backend: &TcpStream = reader.as_ref();
    while rest > 0 {
        let want = rest.min(chunk.len());
        let n = loop {
            tokio::select! {
                biased;
                ready = backend.readable() => {
                    if let Some(end) = answered_early(backend, ready, resp) {
                        return end;
                    }
                }
                read = tokio::time::timeout(env.limits.request_head, conn.read(&mut chunk[..want])) => {
                    match read {
                        Ok(Ok(n)) if n > 0 => break n,
                        Ok(_) => return Pumped::ClientLeft,
                        Err(_) => return Pumped::ClientSlow,
                    }
                }
            }
        };
        rest -= n;
        let write =
            tokio::time::timeout(env.limits.upstream_timeout, writer.write_all(&chunk[..n]));
        tokio::pin!(write);
        loop {
            tokio::select! {
                biased;
                ready = backend.readable() => {
                    if let Some(end) = answered_early(backend, ready, resp) {
                        return end;
                    }
                }
                written = &mut write => match written {
                    Ok(Ok(())) => break,
                    Ok(Err(e)) => return Pumped::BackendFailed(e),
                    Err(_) => return Pumped::BackendFailed(ErrorKind::TimedOut.into()),
                },
            }
        }
    }
    Pumped::Whole
}

/// The backend's side became readable while the body was being sent: the start of its
/// answer (read into `resp`), its close, or nothing after all (None: go on).
fn answered_early(
    backend: &TcpStream,
    ready: std::io::Result<()>,
    resp: &mut Vec<u8>,
) -> Option<Pumped> {
    if let Err(e) = ready {
        return Some(Pumped::BackendFailed(e));
    }
    match backend.try_read_buf(resp) {
        Ok(0) => Some(Pumped::BackendFailed(ErrorKind::UnexpectedEof.into())),
        Ok(_) => Some(Pumped::Answered),
        Err(e) if e.kind() == ErrorKind::WouldBlock => None,
        Err(e) => Some(Pumped::BackendFailed(e)),
    }
}
