//! Reading a request from the client: its head under the head deadline, a small
//! Content-Length body after it, and where in the bytes read the request ends.

use super::{Env, FastHead, REQUEST_LINE};
use crate::conn::Buffered;
use crate::http1::H2_PREFACE;
use tokio::io::AsyncReadExt;

pub(super) enum HeadRead {
    /// A whole head of this many bytes starts the buffer.
    Complete(usize),
    /// The buffer starts with the HTTP/2 preface.
    H2c,
    Closed,
    /// Answer this status and close.
    Reject(u16),
}

/// Reads until `req` starts with a whole request head. Empty lines before a request are
/// dropped (RFC 9112 2.2), so they are never forwarded. Waits at most the keep-alive idle
/// time for a first byte, then the head deadline for the rest (for a connection's first
/// request, the head deadline counts from accept).
pub(super) async fn read_head(
    conn: &mut Buffered,
    req: &mut Vec<u8>,
    env: &mut Env<'_>,
    first: bool,
) -> HeadRead {
    let limits = env.limits;
    let max = limits.max_request_head_bytes + REQUEST_LINE;
    let mut deadline = first.then(|| tokio::time::Instant::now() + limits.request_head);
    loop {
        let blank = req
            .iter()
            .take_while(|b| matches!(b, b'\r' | b'\n'))
            .count();
        if blank > 0 {
            req.drain(..blank);
        }
        if !req.is_empty() {
            if deadline.is_none() {
                deadline = Some(tokio::time::Instant::now() + limits.request_head);
            }
            if req.starts_with(H2_PREFACE) {
                return HeadRead::H2c;
            }
            if !H2_PREFACE.starts_with(req) {
                match head_end(req) {
                    Some(len) if len > max => return HeadRead::Reject(431),
                    Some(len) => return HeadRead::Complete(len),
                    None if req.len() > max => return HeadRead::Reject(431),
                    None => {}
                }
            }
        }
        let read = read_some(conn, req);
        let result = match deadline {
            Some(d) => match tokio::time::timeout_at(d, read).await {
                Ok(r) => r,
                Err(_) => {
                    tracing::debug!(peer = %env.peer, "request head deadline passed");
                    crate::metrics::Metrics::count(&env.table.metrics().request_head_timeouts);
                    // A request begun and not finished in time: 408, as nginx answers.
                    return if req.is_empty() {
                        HeadRead::Closed
                    } else {
                        HeadRead::Reject(408)
                    };
                }
            },
            None => {
                let idle = tokio::time::timeout(limits.keepalive_idle, read);
                tokio::select! {
                    r = idle => match r {
                        Ok(r) => r,
                        Err(_) => return HeadRead::Closed,
                    },
                    _ = env.closing.wait_for(|c| *c) => return HeadRead::Closed,
                }
            }
        };
        match result {
            Ok(0) | Err(_) => return HeadRead::Closed,
            Ok(_) => {}
        }
    }
}

/// Reads what the client sends next into `req`. With nothing pending, the connection waits
/// holding no buffer: an idle keep-alive connection costs no head buffer.
async fn read_some(conn: &mut Buffered, req: &mut Vec<u8>) -> std::io::Result<usize> {
    if req.is_empty() {
        *req = Vec::new();
        conn.readable().await?;
    }
    if req.capacity() - req.len() < 1024 {
        req.reserve(4096);
    }
    conn.read_buf(req).await
}

/// Why a request body did not arrive whole.
pub(super) enum BodyRead {
    /// Not within the head deadline of the head's end.
    TimedOut,
    /// The client closed the connection (or it failed) first.
    Closed,
}

/// Reads until `req` holds `end` bytes: a request's head and its Content-Length body. The
/// body must arrive within the head deadline (`--request-head-timeout-seconds`) of the head's
/// end.
pub(super) async fn read_body(
    conn: &mut Buffered,
    req: &mut Vec<u8>,
    end: usize,
    env: &Env<'_>,
) -> Result<(), BodyRead> {
    let deadline = tokio::time::Instant::now() + env.limits.request_head;
    while req.len() < end {
        req.reserve(end - req.len());
        match tokio::time::timeout_at(deadline, conn.read_buf(req)).await {
            Ok(Ok(n)) if n > 0 => {}
            Ok(_) => return Err(BodyRead::Closed),
            Err(_) => {
                tracing::debug!(peer = %env.peer, "request body deadline passed");
                return Err(BodyRead::TimedOut);
            }
        }
    }
    Ok(())
}

/// The length of the head at the start of `buf` (through its empty line), if whole.
pub(super) fn head_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while let Some(lf) = buf[i..].iter().position(|b| *b == b'\n') {
        let at = i + lf;
        // "\n\n" or "\n\r\n": the line that just ended was empty.
        if at > 0 && buf[at - 1] == b'\n' {
            return Some(at + 1);
        }
        if at > 1 && buf[at - 1] == b'\r' && buf[at - 2] == b'\n' {
            return Some(at + 1);
        }
        i = at + 1;
    }
    None
}

/// Where a request whose head is `len` bytes ends among `available` bytes read: after its
/// Content-Length body, or, for a chunked body (whose end is not known here), at the end of
/// what was read.
pub(super) fn request_end(head: &FastHead<'_, '_>, len: usize, available: usize) -> usize {
    let mut body = 0u64;
    for h in head.0.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return available;
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            match std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse().ok())
            {
                Some(n) => body = n,
                None => return available,
            }
        }
    }
    usize::try_from(body)
        .ok()
        .and_then(|b| b.checked_add(len))
        .map_or(available, |e| e.min(available))
}
