//! The streams Pingora serves (gRPC, routes with more than header edits, bodies of unknown
//! length, anything the request layer refuses): Pingora's HTTP/2 server runs on one end of
//! an in-memory pipe, with the real client connection's digest, and each such stream is
//! relayed to it by an HTTP/2 client on the other end: head, DATA and trailers both ways,
//! each direction within the windows of the side it goes to.
//!
//! The bridge opens at a connection's first such stream and lasts as long as it: a
//! connection whose streams the fast path takes never pays for it.

use super::shared::{Gone, Recv, Shared};
use crate::fastpath::Env;
use crate::hpack::Fields;
use crate::http2::ErrorCode;
use crate::http2::request::Request;
use crate::metrics::Metrics;
use bytes::Bytes;
use futures::FutureExt;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use pingora::apps::HttpServerApp;
use pingora::protocols::Digest;
use pingora::protocols::Stream;
use pingora::protocols::http::ServerSession;
use pingora::protocols::http::v2::server::{H2Accept, HttpSession, handshake};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// The pipe's buffer each way: frames wait in it only until the other end's task runs.
const PIPE_BUFFER: usize = 64 << 10;
/// The most request body relayed in one DATA frame call.
const UPLOAD_CHUNK: usize = 64 << 10;

/// Opens a bridge: the client handle streams are sent with, and the future that runs both
/// ends (the client's connection and Pingora's server), to be polled by the connection's
/// loop until it ends. None: the client's handshake could not be written (it always can:
/// the pipe is empty).
#[allow(clippy::type_complexity)]
pub(super) fn open<'a, P: HttpServerApp + Send + Sync + 'static>(
    digest: Arc<Digest>,
    pingora: &'a Arc<P>,
    env: &'a Env<'_>,
) -> Option<(
    h2::client::SendRequest<Bytes>,
    Pin<Box<dyn Future<Output = ()> + Send + 'a>>,
)> {
    let (ours, theirs) = tokio::io::duplex(PIPE_BUFFER);
    let stream: Stream = Box::new(crate::virtual_socket::stream(theirs));
    let (send, client) = h2::client::Builder::new()
        // How much of Pingora's answers may wait for the client's windows: the bounds the
        // client's own uploads have.
        .initial_window_size(env.limits.http2_stream_window)
        .initial_connection_window_size(env.limits.http2_connection_window)
        .max_concurrent_reset_streams(1024)
        .handshake::<_, Bytes>(ours)
        .now_or_never()?
        .ok()?;
    let shutdown = env.shutdown;
    let client_send = env.limits.client_send;
    let driver = async move {
        let client = async {
            if let Err(e) = client.await {
                tracing::debug!(error = %e, "bridge to Pingora ended");
            }
        };
        tokio::join!(
            client,
            serve(stream, digest, pingora, shutdown, client_send)
        );
    };
    Some((send, Box::pin(driver)))
}

/// Pingora's end: every stream the bridge opens is a session of Pingora's, as on a client
/// connection of its own.
async fn serve<P: HttpServerApp + Send + Sync + 'static>(
    stream: Stream,
    digest: Arc<Digest>,
    pingora: &Arc<P>,
    shutdown: &tokio::sync::watch::Receiver<bool>,
    client_send: std::time::Duration,
) {
    // Pingora's default windows (65,535 octets) stay. A build that granted it the client's
    // (256 KiB per stream, 1 MiB per connection), and kept each inbox's room after a take,
    // spent 24-39 % more CPU per bridged 256 KiB upload (bench-proxy's h2-upload).
    let Ok(mut conn) = handshake(stream, None).await else {
        return;
    };
    let mut sessions = FuturesUnordered::new();
    loop {
        tokio::select! {
            Some(()) = sessions.next(), if !sessions.is_empty() => {}
            // Accepting drives the connection: it is polled whatever the sessions are doing.
            accepted = HttpSession::from_h2_conn(&mut conn, digest.clone()) => match accepted {
                Ok(Some(H2Accept::Session(mut session))) => {
                    session.set_write_timeout(Some(client_send));
                    sessions.push(async move {
                        let _ = pingora
                            .process_new_http(ServerSession::new_http2(session), shutdown)
                            .await;
                    });
                }
                // Checked on our side first: nothing malformed is relayed.
                Ok(Some(H2Accept::Rejected)) => {}
                Ok(None) | Err(_) => break,
            },
        }
    }
}

/// The request head as the bridge client sends it.
pub(super) fn request_head(req: &Request<'_>) -> Option<hyper::Request<()>> {
    use crate::head::Head;
    let mut uri = hyper::Uri::builder();
    let mut version = hyper::Version::HTTP_2;
    match req.authority() {
        Some(authority) => {
            if let Some(scheme) = req.scheme() {
                uri = uri.scheme(scheme);
            }
            uri = uri.authority(authority);
        }
        // A relative target is sent as HTTP/1's would be (h2 then says "http"); Pingora
        // takes the host from the Host field, as it would have.
        None => version = hyper::Version::HTTP_11,
    }
    if !req.is_connect() {
        uri = uri.path_and_query(req.target());
    }
    let mut head = hyper::Request::builder()
        .method(req.method())
        .uri(uri.build().ok()?)
        .version(version)
        .body(())
        .ok()?;
    let headers = head.headers_mut();
    // `try_`: a map past its size limit is an error here, not a panic (only a head limit
    // raised far past the default lets that many fields through).
    headers.try_reserve(req.fields().count()).ok()?;
    for (name, value) in req.fields() {
        headers
            .try_append(
                hyper::header::HeaderName::from_bytes(name).ok()?,
                hyper::header::HeaderValue::from_bytes(value).ok()?,
            )
            .ok()?;
    }
    Some(head)
}

/// Relays one stream through the bridge until its answer has gone out or either side gave
/// up; then the stream is finished (reset with the code, when it did not end).
pub(super) async fn relay(
    shared: &Shared,
    stream: u32,
    head: hyper::Request<()>,
    end: bool,
    send: h2::client::SendRequest<Bytes>,
    env: &Env<'_>,
) {
    let code = match exchange(shared, stream, head, end, send, env).await {
        Ok(()) => ErrorCode::NoError,
        Err(code) => code,
    };
    shared.finish(stream, code);
}

async fn exchange(
    shared: &Shared,
    stream: u32,
    head: hyper::Request<()>,
    end: bool,
    send: h2::client::SendRequest<Bytes>,
    env: &Env<'_>,
) -> Result<(), ErrorCode> {
    let mut send = send.ready().await.map_err(|_| ErrorCode::Internal)?;
    let (response, upload) = send
        .send_request(head, end)
        .map_err(|_| ErrorCode::Internal)?;
    let upload = async {
        if !end {
            // Pingora may answer and stop reading before the body ends (then it resets its
            // side): the answer still goes out whole.
            let _ = upload_body(shared, stream, upload).await;
        }
        // The answer decides when the stream is over.
        std::future::pending::<()>().await;
    };
    tokio::select! {
        biased;
        // The client reset the stream (or broke a rule on it): Pingora's side is reset too,
        // when the request and the answer's future are dropped.
        () = shared.closed(stream) => Err(ErrorCode::Cancel),
        answered = download(shared, stream, response, env) => answered,
        () = upload => Err(ErrorCode::Cancel),
    }
}

/// The client's body and trailers to Pingora, as fast as Pingora's windows take them: the
/// client is granted credit back only for what went on.
///
/// A stream asks for Pingora's window only for octets the client already sent. Pingora's
/// connection window is shared: a stream holding a share of it while it waits for its
/// client, whose own connection window is full of other streams' octets waiting for that
/// same share, would stop both.
async fn upload_body(
    shared: &Shared,
    stream: u32,
    mut tx: h2::SendStream<Bytes>,
) -> Result<(), ()> {
    loop {
        let mut capacity = tx.capacity();
        if capacity == 0 {
            // What this stream holds goes back to the connection while it waits.
            tx.reserve_capacity(0);
            let waiting = shared.waiting(stream).await;
            if waiting > 0 {
                tx.reserve_capacity(waiting.min(UPLOAD_CHUNK));
                capacity = match std::future::poll_fn(|cx| tx.poll_capacity(cx)).await {
                    Some(Ok(n)) => n,
                    _ => return Err(()),
                };
                if capacity == 0 {
                    continue;
                }
            }
        }
        match shared.recv(stream, capacity.max(1)).await {
            Recv::Data(data) => tx.send_data(data.freeze(), false).map_err(|_| ())?,
            Recv::End(None) => return tx.send_data(Bytes::new(), true).map_err(|_| ()),
            Recv::End(Some(trailers)) => {
                return tx.send_trailers(trailer_map(&trailers)?).map_err(|_| ());
            }
            // The stream is over: `exchange` ends it.
            Recv::Reset => return Err(()),
        }
    }
}

/// Pingora's answer to the client, as fast as the client's windows take it.
async fn download(
    shared: &Shared,
    stream: u32,
    response: h2::client::ResponseFuture,
    env: &Env<'_>,
) -> Result<(), ErrorCode> {
    let response = response.await.map_err(|e| reason(&e))?;
    let (parts, mut body) = response.into_parts();
    let fields = parts
        .headers
        .iter()
        .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()));
    let end = body.is_end_stream();
    shared
        .send_headers(stream, Some(parts.status.as_u16()), fields, end)
        .map_err(|_| ErrorCode::Cancel)?;
    if end {
        return Ok(());
    }
    let stall = env.limits.client_send;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| reason(&e))?;
        let last = body.is_end_stream();
        let sent = shared.send_data(stream, &chunk, last, stall).await;
        if let Err(gone) = sent {
            if gone == Gone::Stalled {
                Metrics::count(&env.table.metrics().client_send_timeouts);
            }
            return Err(ErrorCode::Cancel);
        }
        let _ = body.flow_control().release_capacity(chunk.len());
        if last {
            return Ok(());
        }
    }
    match body.trailers().await.map_err(|e| reason(&e))? {
        Some(trailers) => {
            let fields = trailers
                .iter()
                .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()));
            shared
                .send_headers(stream, None, fields, true)
                .map_err(|_| ErrorCode::Cancel)
        }
        None => shared
            .send_data(stream, &[], true, stall)
            .await
            .map_err(|_| ErrorCode::Cancel),
    }
}

fn trailer_map(fields: &Fields) -> Result<hyper::HeaderMap, ()> {
    let mut map = hyper::HeaderMap::try_with_capacity(fields.len()).map_err(|_| ())?;
    for (name, value) in fields.iter() {
        map.try_append(
            hyper::header::HeaderName::from_bytes(name).map_err(|_| ())?,
            hyper::header::HeaderValue::from_bytes(value).map_err(|_| ())?,
        )
        .map_err(|_| ())?;
    }
    Ok(map)
}

/// The code to reset the client's stream with when Pingora's side of it failed: Pingora's
/// own reset code, passed on, or INTERNAL_ERROR.
fn reason(e: &h2::Error) -> ErrorCode {
    match e.reason() {
        Some(h2::Reason::REFUSED_STREAM) => ErrorCode::RefusedStream,
        Some(h2::Reason::CANCEL) => ErrorCode::Cancel,
        Some(h2::Reason::PROTOCOL_ERROR) => ErrorCode::Protocol,
        Some(h2::Reason::NO_ERROR) => ErrorCode::NoError,
        _ => ErrorCode::Internal,
    }
}
