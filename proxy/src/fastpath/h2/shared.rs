//! What a connection's streams share with its loop: the state machine, each stream's inbox
//! of client octets, and the two wake-ups between them.
//!
//! Everything runs in the connection's one task, so the lock is never contended; it is a
//! lock at all because the task's future must be `Send` (a `RefCell` held across an await
//! is not) and it is never held across an await.

use crate::hpack::Fields;
use crate::http2::ErrorCode;
use crate::http2::conn::{Connection, SendError};
use bytes::BytesMut;
use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::task::{Poll, Waker};
use std::time::Duration;
use tokio::sync::Notify;

pub(super) struct Shared {
    state: Mutex<State>,
    /// A stream queued output: the loop writes it.
    pub(super) output: Notify,
    /// The loop read from the client (body octets, window credit, resets): streams look again.
    pub(super) input: Notify,
}

pub(super) struct State {
    pub(super) conn: Connection,
    pub(super) inboxes: Vec<Inbox>,
    /// DATA octets sent on any stream so far: whether the client is taking answers at all.
    sent_data: u64,
}

/// What the client sent on a stream after its head and the stream has not taken yet. It
/// lives as long as the stream's future.
pub(super) struct Inbox {
    pub(super) stream: u32,
    /// Taken from the front without copying what stays (a bridged upload takes what
    /// Pingora's window allows, often less than what waits).
    body: BytesMut,
    received: u64,
    /// What Content-Length announced: DATA must add up to it (RFC 9113 section 8.1.1).
    expected: Option<u64>,
    /// The client's side ended, with trailers if it sent some.
    end: bool,
    trailers: Option<Fields>,
    /// Reset, by the client or for breaking a rule: the stream gives up.
    reset: bool,
    /// Wakes the stream's `closed` when it is reset.
    on_reset: Option<Waker>,
}

/// The next part of a request body.
pub(super) enum Recv {
    Data(BytesMut),
    End(Option<Fields>),
    Reset,
}

/// Why a stream cannot send any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gone {
    /// Reset or closed: the client does not want the rest.
    Closed,
    /// The client's windows stayed shut for `client_send`.
    Stalled,
}

impl Shared {
    pub(super) fn new(conn: Connection) -> Self {
        Self {
            state: Mutex::new(State {
                conn,
                inboxes: Vec::new(),
                sent_data: 0,
            }),
            output: Notify::new(),
            input: Notify::new(),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding it leaves nothing half-done that matters more than serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the stream's next body octets (at most `max`), its end, or its reset. Taken
    /// octets are released: the client may send as many again.
    pub(super) async fn recv(&self, stream: u32, max: usize) -> Recv {
        loop {
            {
                let mut state = self.lock();
                let State { conn, inboxes, .. } = &mut *state;
                let Some(inbox) = inboxes.iter_mut().find(|i| i.stream == stream) else {
                    return Recv::Reset;
                };
                if inbox.reset {
                    return Recv::Reset;
                }
                if !inbox.body.is_empty() {
                    let data = if inbox.body.len() <= max {
                        std::mem::take(&mut inbox.body)
                    } else {
                        inbox.body.split_to(max)
                    };
                    conn.release(stream, data.len());
                    self.output.notify_one();
                    return Recv::Data(data);
                }
                if inbox.end {
                    return Recv::End(inbox.trailers.take());
                }
            }
            self.input.notified().await;
        }
    }

    /// Waits until the stream has body octets to take, its end, or its reset, and says how
    /// many octets wait (0 at its end or reset) without taking them.
    pub(super) async fn waiting(&self, stream: u32) -> usize {
        loop {
            {
                let state = self.lock();
                let Some(inbox) = state.inboxes.iter().find(|i| i.stream == stream) else {
                    return 0;
                };
                if inbox.reset || inbox.end || !inbox.body.is_empty() {
                    return inbox.body.len();
                }
            }
            self.input.notified().await;
        }
    }

    /// Resolves once the stream is reset (by the client, or for breaking a rule): whatever
    /// its future is waiting for, it has no one to answer. The reset wakes this stream
    /// alone: streams in flight are not woken by every read to look.
    pub(super) fn closed(&self, stream: u32) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            let mut state = self.lock();
            match state.inboxes.iter_mut().find(|i| i.stream == stream) {
                Some(inbox) if !inbox.reset => {
                    match &inbox.on_reset {
                        Some(waker) if waker.will_wake(cx.waker()) => {}
                        _ => inbox.on_reset = Some(cx.waker().clone()),
                    }
                    Poll::Pending
                }
                _ => Poll::Ready(()),
            }
        })
    }

    /// Sends an answer's head, or its trailers (`status` None).
    pub(super) fn send_headers<'f>(
        &self,
        stream: u32,
        status: Option<u16>,
        fields: impl IntoIterator<Item = (&'f [u8], &'f [u8])>,
        end: bool,
    ) -> Result<(), SendError> {
        let sent = self.lock().conn.send_headers(stream, status, fields, end);
        self.output.notify_one();
        sent
    }

    /// Sends all of `data` as the client's windows allow, ending the stream with it if `end`.
    pub(super) async fn send_data(
        &self,
        stream: u32,
        data: &[u8],
        end: bool,
        stall: Duration,
    ) -> Result<(), Gone> {
        let mut sent = 0;
        let mut deadline = tokio::time::Instant::now() + stall;
        let mut seen = None;
        loop {
            {
                let mut state = self.lock();
                if state.reset(stream) {
                    return Err(Gone::Closed);
                }
                let n = state
                    .conn
                    .send_data(stream, &data[sent..], end)
                    .map_err(|_| Gone::Closed)?;
                sent += n;
                state.sent_data += n as u64;
                if n > 0 || data.is_empty() {
                    self.output.notify_one();
                }
                if sent == data.len() {
                    return Ok(());
                }
                // Progress is the connection's, not this stream's alone: a client reading
                // other streams while the connection's window is theirs is not stalled.
                if seen != Some(state.sent_data) {
                    seen = Some(state.sent_data);
                    deadline = tokio::time::Instant::now() + stall;
                }
            }
            if tokio::time::timeout_at(deadline, self.input.notified())
                .await
                .is_err()
            {
                return Err(Gone::Stalled);
            }
        }
    }

    /// The stream's future is done: its inbox goes, what it held is released, and a stream
    /// still open (its future gave up) is reset with `code`.
    pub(super) fn finish(&self, stream: u32, code: ErrorCode) {
        let mut state = self.lock();
        let State { conn, inboxes, .. } = &mut *state;
        if let Some(i) = inboxes.iter().position(|i| i.stream == stream) {
            let inbox = inboxes.swap_remove(i);
            conn.release(stream, inbox.body.len());
        }
        if conn.is_open(stream) {
            conn.cancel(stream, code);
        }
        self.output.notify_one();
    }
}

impl State {
    fn reset(&self, stream: u32) -> bool {
        self.inboxes.iter().any(|i| i.stream == stream && i.reset)
    }
}

/// A stream opened: its inbox, with the Content-Length its DATA must add up to.
pub(super) fn open(inboxes: &mut Vec<Inbox>, stream: u32, expected: Option<u64>, end: bool) {
    inboxes.push(Inbox {
        stream,
        body: BytesMut::new(),
        received: 0,
        expected,
        end,
        trailers: None,
        reset: false,
        on_reset: None,
    });
}

impl Inbox {
    /// Body octets arrived. Err: they broke the announced length, and the stream is over.
    pub(super) fn data(&mut self, data: &[u8], end: bool) -> Result<(), ()> {
        self.received += data.len() as u64;
        let over = self.expected.is_some_and(|n| self.received > n);
        let short = end && self.expected.is_some_and(|n| self.received != n);
        if over || short {
            self.reset();
            return Err(());
        }
        self.body.extend_from_slice(data);
        self.end = end;
        Ok(())
    }

    /// The client's trailers ended the stream. Err: it was short of its announced length.
    pub(super) fn trailers(&mut self, fields: &Fields) -> Result<(), ()> {
        if self.expected.is_some_and(|n| self.received != n) {
            self.reset();
            return Err(());
        }
        self.trailers = Some(fields.clone());
        self.end = true;
        Ok(())
    }

    pub(super) fn reset(&mut self) {
        self.reset = true;
        if let Some(waker) = self.on_reset.take() {
            waker.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inbox(expected: Option<u64>) -> Inbox {
        let mut inboxes = Vec::new();
        open(&mut inboxes, 1, expected, false);
        inboxes.remove(0)
    }

    #[test]
    fn data_must_add_up_to_the_announced_length() {
        let mut exact = inbox(Some(5));
        assert_eq!(exact.data(b"abc", false), Ok(()));
        assert_eq!(exact.data(b"de", true), Ok(()));
        assert!(exact.end && !exact.reset);
        assert_eq!(&exact.body[..], b"abcde");

        let mut over = inbox(Some(2));
        assert_eq!(over.data(b"abc", false), Err(()));
        assert!(over.reset);

        let mut short = inbox(Some(4));
        assert_eq!(short.data(b"abc", true), Err(()));
        assert!(short.reset);

        let mut trailers_early = inbox(Some(4));
        assert_eq!(trailers_early.data(b"ab", false), Ok(()));
        assert_eq!(trailers_early.trailers(&Fields::new()), Err(()));
        assert!(trailers_early.reset);
    }

    #[test]
    fn without_a_length_any_amount_ends_with_trailers() {
        let mut open_ended = inbox(None);
        assert_eq!(open_ended.data(&[7; 100], false), Ok(()));
        let mut fields = Fields::new();
        fields.push(b"x-sum", b"700");
        assert_eq!(open_ended.trailers(&fields), Ok(()));
        assert!(open_ended.end);
        assert_eq!(open_ended.trailers.map(|t| t.len()), Some(1));
    }
}
