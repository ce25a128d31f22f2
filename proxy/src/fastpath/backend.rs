//! The fast path's side of a backend: opening a connection within the limit, sending a
//! request, reading its answer, and where a request goes when an attempt failed before any
//! of the answer came.
//!
//! Every wait on a backend is bounded (`Bounds`): by the route's timeouts when it has any,
//! else by `Limits::upstream_timeout`, as `handler::timeouts` bounds them on the other
//! engine: a backend that accepts and then says nothing gets the request 504 (counted against
//! the endpoint, never sent again, since it may be at work on it); one that stops halfway
//! through a body ends the exchange, and so does a request's time running out.

use super::{Env, MAX_RESPONSE_HEAD, MAX_RESPONSE_HEADERS, Plan};
use crate::http1;
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::policy::PolicyField;
use crate::upstream::{may_connect_again, pool};
use coxswain_api::snapshot as snap;
use std::borrow::Cow;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a request's waits on its backend may last. The rules are `handler::timeouts`'s:
/// a route's request timeout bounds the whole exchange from the request's arrival, its
/// backend request timeout each attempt, and the Ingress timeouts each connect, read and
/// write; a wait nothing else bounds gets `Limits::upstream_timeout` (connecting,
/// `Limits::upstream_connect`). A route without timeouts reads no clock here.
#[derive(Clone, Copy, Debug)]
pub(super) struct Bounds {
    /// The request timeout's end.
    deadline: Option<Instant>,
    /// The backend request timeout: each attempt's budget.
    attempt: Option<Duration>,
    /// The current attempt's end: the sooner of `deadline` and `attempt` from its start.
    attempt_end: Option<Instant>,
    connect: Duration,
    /// The Ingress read and send timeouts.
    read: Option<Duration>,
    write: Option<Duration>,
    /// What bounds a read or write when nothing above does.
    idle: Duration,
}

impl Bounds {
    /// The bounds of a request that arrived just now on a route with `timeouts`.
    pub(super) fn new(timeouts: Option<snap::Timeouts>, limits: &Limits) -> Self {
        let ms = |ms: u64| (ms > 0).then(|| Duration::from_millis(ms));
        let t = timeouts.unwrap_or_default();
        let deadline = ms(t.request_ms).and_then(|d| Instant::now().checked_add(d));
        Self {
            deadline,
            attempt: ms(t.backend_request_ms),
            attempt_end: deadline,
            connect: ms(t.connect_ms).unwrap_or(limits.upstream_connect),
            read: ms(t.read_ms),
            write: ms(t.send_ms),
            idle: limits.upstream_timeout,
        }
    }

    /// The route bounds the whole exchange or each attempt, so the time a request body takes
    /// to arrive counts against it.
    pub(super) fn timed(&self) -> bool {
        self.deadline.is_some() || self.attempt.is_some()
    }

    /// Starts an attempt. False: the request's time is up already (504, sent nowhere).
    pub(super) fn start_attempt(&mut self) -> bool {
        if self.attempt.is_none() && self.deadline.is_none() {
            return true;
        }
        let now = Instant::now();
        if self.deadline.is_some_and(|d| d <= now) {
            return false;
        }
        let per_attempt = self.attempt.and_then(|a| now.checked_add(a));
        self.attempt_end = match (self.deadline, per_attempt) {
            (Some(d), Some(a)) => Some(d.min(a)),
            (d, a) => d.or(a),
        };
        true
    }

    /// How long connecting may take.
    pub(super) fn connect(&self) -> Duration {
        self.left()
            .map_or(self.connect, |left| left.min(self.connect))
    }

    /// How long the next read from the backend may wait.
    pub(super) fn read(&self) -> Duration {
        self.wait(self.read)
    }

    /// How long the next write to the backend may wait.
    pub(super) fn write(&self) -> Duration {
        self.wait(self.write)
    }

    /// The request timeout ran out (no attempt may start).
    pub(super) fn expired(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// How long a wait of `wanted` may last before the request timeout.
    pub(super) fn until_deadline(&self, wanted: Duration) -> Duration {
        self.deadline.map_or(wanted, |d| {
            wanted.min(d.saturating_duration_since(Instant::now()))
        })
    }

    /// The attempt's time is up: a response still streaming is cut, as Pingora's body filter
    /// cuts it.
    pub(super) fn past(&self) -> bool {
        self.attempt_end.is_some_and(|end| Instant::now() >= end)
    }

    fn left(&self) -> Option<Duration> {
        self.attempt_end
            .map(|end| end.saturating_duration_since(Instant::now()))
    }

    fn wait(&self, ingress: Option<Duration>) -> Duration {
        match (self.left(), ingress) {
            (Some(left), Some(each)) => left.min(each),
            (Some(left), None) => left,
            (None, each) => each.unwrap_or(self.idle),
        }
    }
}

impl Plan {
    /// The fields the route's policies add to the answer, in Pingora's order: CORS's, then
    /// the session's name for the endpoint that served (final once an answer came from it).
    pub(super) fn added_fields(&self) -> Cow<'_, [PolicyField]> {
        let session = self
            .session
            .as_ref()
            .filter(|s| s.named != Some(self.endpoint))
            .and_then(|s| s.policy.session.as_ref());
        match session {
            None => Cow::Borrowed(&self.policy_fields),
            Some(session) => {
                let mut fields = self.policy_fields.clone();
                fields.push(session.answer(self.cluster.endpoint_id(self.endpoint)));
                Cow::Owned(fields)
            }
        }
    }

    /// The backend's final answer came, `status`, for a request sent at `sent`: its latency
    /// is observed, and a 5xx counts toward the endpoint's ejection (anything else clears
    /// its streak).
    pub(super) fn answered(&self, env: &Env<'_>, sent: Instant, status: u16) {
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

    /// The backend outlasted its time before its answer began: counted, and held
    /// against the endpoint whether the connection was new or pooled (a pooled one that is
    /// merely closed fails at once instead). The request's status, 504.
    pub(super) fn timed_out(&self, env: &Env<'_>) -> u16 {
        self.stalled(env);
        self.cluster
            .record(self.endpoint, true, &env.limits.outlier);
        504
    }

    /// The backend outlasted its time (`Bounds`): counted. Past the answer's head it is not
    /// held against the endpoint, which answered; a stream that pauses longer than the
    /// upstream timeout (server-sent events) is a route's to allow with a timeout of its own.
    pub(super) fn stalled(&self, env: &Env<'_>) {
        tracing::debug!(upstream = %self.upstream, bounds = ?self.bounds,
            "backend sent nothing in time");
        Metrics::count(&env.table.metrics().upstream_timeouts);
    }
}

/// Why an attempt got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failed {
    /// No connection could be opened (to any endpoint the request could move to): nothing
    /// was sent.
    Connect,
    /// The connection broke before any of the answer came.
    Broken,
    /// The backend sent nothing in time, or the request's time was up before it went.
    TimedOut,
}

impl From<Failed> for u16 {
    /// The status the client gets.
    fn from(f: Failed) -> u16 {
        match f {
            Failed::Connect | Failed::Broken => 502,
            Failed::TimedOut => 504,
        }
    }
}

/// Writes a request to `plan`'s endpoint, over a pooled connection or a new one, until the
/// first bytes of an answer are in `resp`; returns the connection and when the request went.
/// Err: no answer came, and nothing was sent to the client. On a route with a retry policy a
/// broken connection is the policy's to send again (`Plan::send_again`), not this loop's.
pub(super) async fn send(
    (head, body): (&[u8], &[u8]),
    plan: &mut Plan,
    resp: &mut Vec<u8>,
    env: &Env<'_>,
    attempts: &mut Attempts,
) -> Result<(TcpStream, Instant), Failed> {
    // A pooled connection the backend closed meanwhile fails on first use, and a new one to a
    // Pod shutting down may be reset: an idempotent request is sent again (at most
    // `policy::BROKEN_RESENDS` times); any other may have been acted on. A connection that
    // cannot be opened sent nothing: another endpoint is tried.
    let mut resent = 0;
    loop {
        if !plan.bounds.start_attempt() {
            return Err(Failed::TimedOut);
        }
        let (mut up, reused) = open(plan, env, attempts)
            .await
            .map_err(|_| Failed::Connect)?;
        let sent = Instant::now();
        resp.clear();
        let answered = match write_both(&mut up, head, body, plan.bounds.write()).await {
            Ok(()) => read_more(&mut up, resp, plan.bounds.read()).await,
            Err(e) => Err(e),
        };
        match answered {
            Ok(n) if n > 0 => return Ok((up, sent)),
            // The backend may be at work on the request: it is not sent again (but by a
            // retry policy, which says it may be).
            Err(e) if e.kind() == ErrorKind::TimedOut => {
                plan.timed_out(env);
                return Err(Failed::TimedOut);
            }
            _ => {}
        }
        // A new connection that broke without an answer is the endpoint failing (as on
        // Pingora); a pooled one the backend closed meanwhile is routine.
        if !reused {
            plan.cluster
                .record(plan.endpoint, true, &env.limits.outlier);
        }
        let policy_decides = plan.retry.as_ref().is_some_and(|r| r.decides_broken());
        if policy_decides || resent >= crate::request::BROKEN_RESENDS || !plan.idempotent {
            return Err(Failed::Broken);
        }
        resent += 1;
        // Nothing of the answer came: on a new connection, an idempotent request goes again
        // to an endpoint it was not sent to (as on Pingora: `Gateway::resend_elsewhere` says
        // why).
        if !reused {
            if !plan.move_on(env, &mut attempts.tried) {
                return Err(Failed::Broken);
            }
            Metrics::count(&env.table.metrics().broken_resends);
        }
    }
}

/// The endpoints a request was moved away from, and its failed connects, over all its
/// attempts (a retry policy's too, as Pingora counts them).
#[derive(Default)]
pub(super) struct Attempts {
    /// Endpoints already tried; allocated only when one failed.
    pub(super) tried: Vec<usize>,
    failed: usize,
    /// Failed connects that did not fail at once (timed out rather than refused).
    slow: usize,
}

/// A connection to `plan`'s endpoint: an idle pooled one, else a new one; when connecting
/// fails, the request moves to another endpoint while `may_connect_again` allows. Returns
/// the connection and whether it came from the pool. Err(502): no connection.
pub(super) async fn open(
    plan: &mut Plan,
    env: &Env<'_>,
    attempts: &mut Attempts,
) -> Result<(TcpStream, bool), u16> {
    loop {
        let target = plan.upstream;
        if let Some(up) = pool::take(target) {
            return Ok((up, true));
        }
        match connect(target, plan.bounds.connect()).await {
            Ok(up) => {
                let _ = up.set_nodelay(true);
                return Ok((up, false));
            }
            Err(e) => {
                tracing::debug!(upstream = %target, error = %e, "connect failed");
                plan.cluster
                    .record(plan.endpoint, true, &env.limits.outlier);
                attempts.failed += 1;
                if e.kind() != ErrorKind::ConnectionRefused {
                    attempts.slow += 1;
                }
                if may_connect_again(attempts.failed, attempts.slow)
                    && plan.retry.as_ref().is_none_or(|r| r.in_time())
                    && plan.move_on(env, &mut attempts.tried)
                {
                    Metrics::count(&env.table.metrics().connect_retries);
                    continue;
                }
                return Err(502);
            }
        }
    }
}

/// Reads until a whole response head (interim or final) starts `resp`. Err(502): the
/// backend closed or sent something that is not a response head (counted against it), or
/// a 101; Err(504): it sent nothing more in time (`Bounds::read`).
pub(super) async fn next_head<R: AsyncRead + Unpin>(
    upstream: &mut R,
    resp: &mut Vec<u8>,
    plan: &Plan,
    env: &Env<'_>,
) -> Result<http1::ResponseHead, u16> {
    loop {
        match http1::parse_response(resp, plan.head_only, MAX_RESPONSE_HEADERS) {
            // 101 answers an Upgrade, which the fast path never forwards.
            Ok(Some(h)) if h.status == 101 => return Err(502),
            Ok(Some(h)) => return Ok(h),
            Ok(None) if resp.len() < MAX_RESPONSE_HEAD => {
                match read_more(upstream, resp, plan.bounds.read()).await {
                    Ok(n) if n > 0 => {}
                    Err(e) if e.kind() == ErrorKind::TimedOut => return Err(plan.timed_out(env)),
                    _ => {
                        plan.cluster
                            .record(plan.endpoint, true, &env.limits.outlier);
                        return Err(502);
                    }
                }
            }
            Ok(None) => {
                plan.cluster
                    .record(plan.endpoint, true, &env.limits.outlier);
                return Err(502);
            }
            Err(e) => {
                tracing::debug!(upstream = %plan.upstream, error = %e, "response refused");
                plan.cluster
                    .record(plan.endpoint, true, &env.limits.outlier);
                return Err(502);
            }
        }
    }
}

/// Opens a connection to a backend within `limit`; past it, a timed-out error.
pub(super) async fn connect(target: SocketAddr, limit: Duration) -> std::io::Result<TcpStream> {
    match tokio::time::timeout(limit, TcpStream::connect(target)).await {
        Ok(result) => result,
        Err(_) => Err(ErrorKind::TimedOut.into()),
    }
}

/// Writes a request's head and body with as few sends as the socket allows (with Nagle off,
/// a write each would put them in separate segments), all of it within `within`.
pub(super) async fn write_both(
    up: &mut TcpStream,
    head: &[u8],
    body: &[u8],
    within: Duration,
) -> std::io::Result<()> {
    let write = async {
        if body.is_empty() {
            return up.write_all(head).await;
        }
        let (mut head, mut body) = (head, body);
        while !head.is_empty() {
            let parts = [std::io::IoSlice::new(head), std::io::IoSlice::new(body)];
            let n = up.write_vectored(&parts).await?;
            if n == 0 {
                return Err(ErrorKind::WriteZero.into());
            }
            if n >= head.len() {
                body = &body[n - head.len()..];
                head = &[];
            } else {
                head = &head[n..];
            }
        }
        up.write_all(body).await
    };
    // A request the socket takes at once (the usual case) never arms the timer.
    tokio::time::timeout(within, write)
        .await
        .unwrap_or_else(|_| Err(ErrorKind::TimedOut.into()))
}

/// Reads what is available into the spare capacity of `buf`, waiting at most `within` for it;
/// past that, a timed-out error.
pub(super) async fn read_more<R: AsyncRead + Unpin>(
    up: &mut R,
    buf: &mut Vec<u8>,
    within: Duration,
) -> std::io::Result<usize> {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(16 * 1024);
    }
    tokio::time::timeout(within, up.read_buf(buf))
        .await
        .unwrap_or_else(|_| Err(ErrorKind::TimedOut.into()))
}
