//! The fast path's side of a backend: opening a connection within the limit, sending a
//! request, reading its answer, and where a request goes when an attempt failed before any
//! of the answer came.

use super::{Env, Plan};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

impl Plan {
    /// The backend's final answer came, `status`, for a request sent at `sent`: its latency
    /// is observed, and a 5xx counts toward the endpoint's ejection (anything else clears
    /// its streak).
    pub(super) fn answered(&self, env: &Env<'_>, sent: std::time::Instant, status: u16) {
        env.table.metrics().upstream_latency(sent.elapsed());
        self.cluster
            .record(self.endpoint, status >= 500, &env.limits.outlier);
    }

    /// After an attempt on `endpoint` failed before any of the answer came, moves the request
    /// to an endpoint not in `tried` (which gains `endpoint`), picked from the cluster as the
    /// current table holds it ([`crate::upstream::ClusterState::newest`]). False when every
    /// endpoint was tried.
    pub(super) fn move_on(&mut self, env: &Env<'_>, tried: &mut Vec<usize>) -> bool {
        tried.push(self.endpoint);
        self.cluster = env.table.current_cluster(&self.cluster, tried);
        let Some(next) = self.cluster.pick_excluding(tried) else {
            return false;
        };
        self.endpoint = next;
        self.upstream = self.cluster.addr(next);
        self.in_flight = None;
        self.in_flight = self.cluster.start(next);
        true
    }
}

/// Opens a connection to a backend within `limit`; past it, a timed-out error.
pub(super) async fn connect(
    target: SocketAddr,
    limit: std::time::Duration,
) -> std::io::Result<TcpStream> {
    match tokio::time::timeout(limit, TcpStream::connect(target)).await {
        Ok(result) => result,
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

/// Writes a request's head and body with as few sends as the socket allows: with Nagle off, a
/// write each would put them in separate segments.
pub(super) async fn write_both(
    up: &mut TcpStream,
    head: &[u8],
    body: &[u8],
) -> std::io::Result<()> {
    if body.is_empty() {
        return up.write_all(head).await;
    }
    let (mut head, mut body) = (head, body);
    while !head.is_empty() {
        let parts = [std::io::IoSlice::new(head), std::io::IoSlice::new(body)];
        let n = up.write_vectored(&parts).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        if n >= head.len() {
            body = &body[n - head.len()..];
            head = &[];
        } else {
            head = &head[n..];
        }
    }
    up.write_all(body).await
}

/// Reads what is available into the spare capacity of `buf`.
pub(super) async fn read_more(up: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(16 * 1024);
    }
    up.read_buf(buf).await
}
