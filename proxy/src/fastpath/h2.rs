//! HTTP/2 connections (ALPN h2, or cleartext with prior knowledge), served stream by stream
//! the way `fastpath` serves HTTP/1 requests.
//!
//! The connection's framing is ours (`http2::conn`): this loop reads the client's octets
//! into the state machine, writes what it queues, and acts on each stream it opens. Each
//! stream's head is checked (`http2::request`) and goes through the request layer, then
//! either the fast path serves it (`forward`) or Pingora does (`bridge`):
//! - served here: what the HTTP/1 fast path takes (a `passthrough` route, header modifiers
//!   at most), with an origin-form :path, :authority and no Host field, no `te` or `expect`
//!   field, and no body or one announced by Content-Length (read whole up to `MAX_BODY`,
//!   streamed past it). It goes upstream as HTTP/1.1 over this worker's pool, Host taken
//!   from :authority as Pingora takes it, and the answer comes back as HEADERS and DATA, its
//!   HTTP/1 framing taken off;
//! - everything else (gRPC, other routes, bodies of unknown length, refusals) is relayed to
//!   Pingora's HTTP/2 server over an in-memory bridge, opened at the connection's first such
//!   stream.
//!
//! A stream is a future of the connection's own task, not a task of its own: forwarding it
//! needs no channel or task switch between the client's frames and the backend's bytes.

use super::{Env, Step, plan_checked};
use crate::hpack::Fields;
use crate::http2::ErrorCode;
use crate::http2::conn::{Config, Connection, Event};
use crate::http2::request::{self as h2request, Request};
use crate::metrics::Metrics;
use crate::request::{self, Body, Head};
use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use pingora::apps::HttpServerApp;
use pingora::protocols::{Digest, Stream};
use shared::{Shared, State};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Streams a connection may have refused (malformed heads) before it is closed: as Pingora
/// bounds it, so a client cannot make the proxy reject streams for ever on one connection.
const MAX_REJECTED_STREAMS: usize = 32;
/// Room made for each read: a busy connection's, and an idle one's (which holds only this).
const READ_BUSY: usize = 16 << 10;
const READ_IDLE: usize = 2 << 10;

type StreamFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Serves an HTTP/2 connection until the client closes it, it idles for `keepalive_idle`
/// with no stream open, or the listener stops (then streams in progress finish after a
/// GOAWAY). `pingora` serves the streams this path does not.
pub async fn serve<P: HttpServerApp + Send + Sync + 'static>(
    mut io: Stream,
    env: &Env<'_>,
    pingora: &Arc<P>,
) {
    let digest = Arc::new(Digest {
        ssl_digest: io.get_ssl_digest(),
        timing_digest: io.get_timing_digest(),
        proxy_digest: io.get_proxy_digest(),
        socket_digest: io.get_socket_digest(),
    });
    let shared = Shared::new(Connection::new(config(env)));
    let mut driver = Driver {
        shared: &shared,
        env,
        pingora,
        digest,
        bridge: None,
        rejected: 0,
    };
    let mut bridge_run: Option<StreamFuture<'_>> = None;
    let mut streams: FuturesUnordered<StreamFuture<'_>> = FuturesUnordered::new();
    let mut input: Vec<u8> = Vec::new();
    let mut closing = env.closing.clone();
    let mut shutdown = env.shutdown.clone();
    let mut draining = false;
    if *shutdown.borrow() || *closing.borrow() {
        shared.lock().conn.go_away();
        draining = true;
    }
    // Made once, not per turn of the loop: each `changed()` registers a waiter.
    let stop = async {
        tokio::select! {
            _ = closing.changed() => {}
            _ = shutdown.changed() => {}
        }
    };
    tokio::pin!(stop);
    // The client's preface and settings are due as soon as it connected.
    let setup = tokio::time::sleep(env.limits.request_head);
    tokio::pin!(setup);
    let idle = tokio::time::sleep(env.limits.keepalive_idle);
    tokio::pin!(idle);
    let mut ended = false;
    loop {
        if !write_out(&mut io, &shared, env).await {
            return;
        }
        let busy = !streams.is_empty();
        if ended || (draining && !busy) {
            // Streams the client opened before it read our GOAWAY may still be arriving.
            crate::conn::linger(&mut io, env.limits.request_head).await;
            return;
        }
        let established = shared.lock().conn.established();
        input.reserve(if busy { READ_BUSY } else { READ_IDLE });
        tokio::select! {
            biased;
            () = &mut stop, if !draining => {
                shared.lock().conn.go_away();
                draining = true;
            }
            () = shared.output.notified() => {}
            Some(()) = streams.next(), if busy => {
                // Every other stream that can finish now does, before the output is written:
                // the answers that came in one wake-up go out in one write, not one each.
                // (Polled here with a waker that does nothing, the set is polled again with
                // the task's own by the next turn's select before the task sleeps.)
                while let Some(Some(())) = streams.next().now_or_never() {}
                if streams.is_empty() {
                    idle.as_mut().reset(tokio::time::Instant::now() + env.limits.keepalive_idle);
                    shared.lock().conn.free_buffers();
                    if input.is_empty() {
                        input = Vec::new();
                    }
                }
            }
            () = async { if let Some(run) = bridge_run.as_mut() { run.await } }, if bridge_run.is_some() => {
                // Pingora's end closed: its streams are over; the next one opens a new bridge.
                bridge_run = None;
                driver.bridge = None;
            }
            read = io.read_buf(&mut input) => match read {
                Ok(n) if n > 0 => {
                    let (opened, fine) = driver.on_input(&mut input, &mut streams, &mut bridge_run);
                    ended = !fine;
                    if opened {
                        idle.as_mut().reset(tokio::time::Instant::now() + env.limits.keepalive_idle);
                    }
                    shared.input.notify_waiters();
                }
                // Closed by the client, or broken: nothing more to serve.
                _ => return,
            },
            () = &mut setup, if !established => {
                tracing::debug!(peer = %env.peer, "HTTP/2 preface deadline passed");
                return;
            }
            () = &mut idle, if !busy && established => {
                shared.lock().conn.go_away();
                draining = true;
            }
        }
    }
}

fn config(env: &Env<'_>) -> Config {
    let mut config = Config {
        initial_window_size: env.limits.http2_stream_window,
        connection_window: env.limits.http2_connection_window,
        ..Config::default()
    };
    // Room for the request layer's own bound, which answers past it as it would on HTTP/1.
    let head = u32::try_from(env.limits.max_request_head_bytes).unwrap_or(u32::MAX);
    config.max_header_list_size = config.max_header_list_size.max(head.saturating_mul(2));
    config
}

/// Writes what the connection queued. False: the client took none of it for `client_send`,
/// or the connection broke.
async fn write_out(io: &mut Stream, shared: &Shared, env: &Env<'_>) -> bool {
    let mut out = {
        let mut state = shared.lock();
        if state.conn.output().is_empty() {
            return true;
        }
        std::mem::take(state.conn.output())
    };
    // Each write has `client_send` to make progress, as on HTTP/1: a slow client that keeps
    // reading is not cut off because a turn queued much.
    let mut at = 0;
    while at < out.len() {
        match tokio::time::timeout(env.limits.client_send, io.write(&out[at..])).await {
            Ok(Ok(n)) if n > 0 => at += n,
            Ok(_) => return false,
            Err(_) => {
                Metrics::count(&env.table.metrics().client_send_timeouts);
                return false;
            }
        }
    }
    match tokio::time::timeout(env.limits.client_send, io.flush()).await {
        Ok(Ok(())) => {}
        Ok(Err(_)) => return false,
        Err(_) => {
            Metrics::count(&env.table.metrics().client_send_timeouts);
            return false;
        }
    }
    // Nothing ran meanwhile (the streams are polled by this loop): the buffer goes back.
    out.clear();
    let mut state = shared.lock();
    if state.conn.output().is_empty() {
        *state.conn.output() = out;
    }
    true
}

/// The connection's loop state that deciding a stream needs.
struct Driver<'a, 'e, P> {
    shared: &'a Shared,
    env: &'a Env<'e>,
    pingora: &'a Arc<P>,
    digest: Arc<Digest>,
    /// The client end of the bridge to Pingora, once a stream needed it.
    bridge: Option<h2::client::SendRequest<Bytes>>,
    rejected: usize,
}

/// What becomes of a stream whose head arrived. Returned once and matched at once, as
/// `Step` is: boxing the plan would cost an allocation per stream.
#[allow(clippy::large_enum_variant)]
enum Opened {
    Forward(super::Plan, Vec<u8>),
    Answer(super::Answered),
    Bridge(hyper::Request<()>),
    Malformed,
}

impl<'a, P: HttpServerApp + Send + Sync + 'static> Driver<'a, '_, P> {
    /// Feeds what was read to the connection and acts on each event; streams opened join
    /// `streams`. Returns whether a stream opened, and false when the connection must end
    /// (its GOAWAY queued).
    fn on_input(
        &mut self,
        input: &mut Vec<u8>,
        streams: &mut FuturesUnordered<StreamFuture<'a>>,
        bridge_run: &mut Option<StreamFuture<'a>>,
    ) -> (bool, bool) {
        let shared = self.shared;
        let mut state = shared.lock();
        let mut at = 0;
        let mut opened = false;
        let fine = loop {
            let State { conn, inboxes, .. } = &mut *state;
            let (used, event) = match conn.poll(&input[at..]) {
                Ok(step) => step,
                Err(e) => {
                    tracing::debug!(peer = %self.env.peer, error = %e, "HTTP/2 connection ended");
                    break false;
                }
            };
            at += used;
            let Some(event) = event else { break true };
            match event {
                Event::Headers {
                    stream,
                    fields,
                    end_stream,
                    trailers: false,
                } => {
                    opened = true;
                    let (what, length) = self.decide(fields, end_stream);
                    let started = Instant::now();
                    match what {
                        Opened::Malformed => {
                            conn.cancel(stream, ErrorCode::Protocol);
                            Metrics::count(&self.env.table.metrics().requests_refused);
                            self.rejected += 1;
                            if self.rejected > MAX_REJECTED_STREAMS {
                                tracing::debug!(peer = %self.env.peer,
                                    "too many malformed streams; connection closed");
                                conn.close(ErrorCode::Protocol, "too many malformed streams");
                                break false;
                            }
                        }
                        Opened::Answer(answered) => {
                            forward::answer(conn, stream, answered, started);
                        }
                        Opened::Forward(plan, up_head) => {
                            shared::open(inboxes, stream, length, end_stream);
                            let env = self.env;
                            streams.push(Box::pin(async move {
                                forward::forward(shared, stream, plan, up_head, env, started).await;
                                shared.finish(stream, ErrorCode::Cancel);
                            }));
                        }
                        Opened::Bridge(head) => {
                            let Some(send) = self.bridge(bridge_run) else {
                                conn.cancel(stream, ErrorCode::Internal);
                                continue;
                            };
                            shared::open(inboxes, stream, length, end_stream);
                            let env = self.env;
                            streams.push(Box::pin(bridge::relay(
                                shared, stream, head, end_stream, send, env,
                            )));
                        }
                    }
                }
                Event::Headers {
                    stream,
                    fields,
                    trailers: true,
                    ..
                } => {
                    let well_formed = h2request::trailers(fields).is_ok();
                    let Some(inbox) = inboxes.iter_mut().find(|i| i.stream == stream) else {
                        continue;
                    };
                    if !well_formed || inbox.trailers(fields).is_err() {
                        inbox.reset();
                        conn.cancel(stream, ErrorCode::Protocol);
                    }
                }
                Event::Data {
                    stream,
                    data,
                    end_stream,
                } => {
                    let len = data.len();
                    let kept = inboxes
                        .iter_mut()
                        .find(|i| i.stream == stream)
                        .map(|inbox| inbox.data(data, end_stream));
                    match kept {
                        Some(Ok(())) => {}
                        Some(Err(())) => {
                            conn.release(stream, len);
                            conn.cancel(stream, ErrorCode::Protocol);
                        }
                        // Nobody will take them (the answer went already).
                        None => conn.release(stream, len),
                    }
                }
                Event::Reset { stream, .. } => {
                    if let Some(inbox) = inboxes.iter_mut().find(|i| i.stream == stream) {
                        inbox.reset();
                    }
                }
                Event::Refused { .. } => {
                    Metrics::count(&self.env.table.metrics().requests_refused);
                }
                Event::GoAway { .. } => {}
            }
        };
        drop(state);
        input.drain(..at);
        (opened, fine)
    }

    /// The client end of the bridge, opened at the first stream that needs it.
    fn bridge(
        &mut self,
        bridge_run: &mut Option<StreamFuture<'a>>,
    ) -> Option<h2::client::SendRequest<Bytes>> {
        if self.bridge.is_none() {
            let (send, run) = bridge::open(self.digest.clone(), self.pingora, self.env)?;
            self.bridge = Some(send);
            *bridge_run = Some(run);
        }
        self.bridge.clone()
    }

    /// Checks a stream's head and decides who serves it; with the Content-Length its DATA
    /// must add up to.
    fn decide(&self, fields: &Fields, end_stream: bool) -> (Opened, Option<u64>) {
        let env = self.env;
        let req = match h2request::request(fields) {
            Ok(req) => req,
            Err(why) => {
                tracing::debug!(peer = %env.peer, reason = %why, "malformed HTTP/2 request");
                return (Opened::Malformed, None);
            }
        };
        let length = req.content_length;
        if end_stream && length.is_some_and(|n| n > 0) {
            // No DATA can add up to it (RFC 9113 section 8.1.1).
            tracing::debug!(peer = %env.peer, "HTTP/2 request announces a body it does not send");
            return (Opened::Malformed, None);
        }
        let mut up_head = Vec::new();
        let step = if env.limits.fast_path {
            up_head.reserve(1024);
            plan(&req, end_stream, env, &mut up_head)
        } else {
            Step::Pingora
        };
        let metrics = env.table.metrics();
        let opened = match step {
            Step::Forward(plan) => {
                Metrics::count(&metrics.http2_streams_fast_path);
                Opened::Forward(plan, up_head)
            }
            Step::Answer(answer) => {
                Metrics::count(&metrics.http2_streams_fast_path);
                Opened::Answer(answer)
            }
            // Refusals too: Pingora answers them as it does on a stream of its own.
            Step::Pingora | Step::Reject(_) => {
                Metrics::count(&metrics.http2_streams_pingora);
                match bridge::request_head(&req) {
                    Some(head) => Opened::Bridge(head),
                    None => Opened::Malformed,
                }
            }
        };
        (opened, length)
    }
}

/// The HTTP/2 side of `fastpath::plan`: the stream's own conditions, then routing and the
/// decision as for HTTP/1.
fn plan(req: &Request<'_>, end_stream: bool, env: &Env<'_>, up_head: &mut Vec<u8>) -> Step {
    if env.client_cert_refused {
        return Step::Pingora;
    }
    let Ok(checked) = request::check(req, env.limits) else {
        return Step::Pingora;
    };
    // Pingora reconciles a Host field with :authority; a stream with both is left to it.
    if req.target().first() != Some(&b'/')
        || req.authority().is_none()
        || req
            .fields()
            .any(|(name, _)| matches!(name, b"host" | b"te" | b"expect"))
    {
        return Step::Pingora;
    }
    // HTTP/2 frames the body itself: a stream that ends with its head has none, whatever it
    // says, and one without a Content-Length has a length nobody knows yet (None), sent to
    // the backend chunked.
    let body = if end_stream {
        Some(0)
    } else {
        match checked.body {
            Body::Length(n) => match usize::try_from(n) {
                Ok(n) => Some(n),
                Err(_) => return Step::Pingora,
            },
            _ => None,
        }
    };
    let step = plan_checked(req, &checked, body, false, Some(checked.host), env, up_head);
    if matches!(&step, Step::Forward(plan) if plan.chunked) {
        // As Pingora frames an HTTP/1 request for a body of unknown length.
        super::heads::append_field(up_head, b"transfer-encoding", b"chunked");
    }
    step
}

mod bridge;
mod forward;
mod shared;
