//! One HTTP/2 server connection as a state machine over bytes (RFC 9113 sections 5 and 6):
//! the client's octets go in, events and the octets to send come out. It does no I/O and
//! reads no clock, so every rule is tested by feeding it frames.
//!
//! The driver's loop: hand [`Connection::poll`] what the socket gave until it takes nothing
//! more, act on each [`Event`], answer with `send_headers` and `send_data`, and write what
//! [`Connection::output`] holds. A returned [`ConnError`] has already queued its GOAWAY:
//! write the output, then close.

use super::frame::{self, Frame, FrameError, SettingsFrame};
use super::{ErrorCode, PREFACE, Settings, Window};
use crate::hpack::{self, Fields};

/// The limits this side announces and enforces.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub max_concurrent_streams: u32,
    /// Each stream's receive window: how much request body a client may send ahead of us.
    pub initial_window_size: u32,
    /// The whole connection's receive window: the most request body of all its streams
    /// together that the proxy holds for backends that have not taken it yet (at least
    /// 65,535, the window every connection starts with).
    pub connection_window: u32,
    /// Decoded size of a request's header list (names, values, 32 each).
    pub max_header_list_size: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 128,
            initial_window_size: 256 << 10,
            connection_window: 1 << 20,
            max_header_list_size: 64 << 10,
        }
    }
}

/// Streams the client may reset before resets count as an attack (CVE-2023-44487): beyond
/// this, more than half of all streams reset ends the connection.
const RESET_ALLOWANCE: u32 = 100;
/// Frames that carry nothing (empty DATA or CONTINUATION, without an end flag) a connection
/// may send: each costs us work and the client nothing (CVE-2019-9518).
const MAX_EMPTY_FRAMES: u32 = 100;
/// Octets of replies to the client's control frames (PING, SETTINGS) that may wait unsent:
/// a client that sends them without reading ours is flooding (CVE-2019-9512, -9515).
const MAX_CONTROL_BACKLOG: usize = 64 << 10;
/// Our SETTINGS identifiers.
const SETTINGS_ENABLE_PUSH: u16 = 0x2;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// The connection must end: a GOAWAY with `code` is already in the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("HTTP/2 connection error {code:?}: {reason}")]
pub struct ConnError {
    pub code: ErrorCode,
    pub reason: &'static str,
}

/// What the client did, for the driver to act on.
#[derive(Debug)]
pub enum Event<'a> {
    /// A request's head (or, with `trailers`, its trailer fields), decoded.
    Headers {
        stream: u32,
        fields: &'a Fields,
        end_stream: bool,
        trailers: bool,
    },
    /// Request body octets. Call [`Connection::release`] once they are passed on, which lets
    /// the client send more.
    Data {
        stream: u32,
        data: &'a [u8],
        end_stream: bool,
    },
    /// The stream ended without a whole exchange: reset by the client (`by_client`), or by us
    /// for breaking a rule (the code we sent).
    Reset {
        stream: u32,
        code: u32,
        by_client: bool,
    },
    /// A request answered here with `status` before the driver saw it: 431 for a header list
    /// over our bound. Its stream is closed.
    Refused { stream: u32, status: u16 },
    /// The client will open no more streams past `last_stream`.
    GoAway { last_stream: u32 },
}

/// A call that named a stream that cannot take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("stream {0} is not open for sending")]
    NotOpen(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the client's preface.
    Preface,
    /// Waiting for the client's first frame, which must be SETTINGS (section 3.4).
    FirstSettings,
    Open,
    /// A GOAWAY went out for an error; nothing more is read.
    Failed,
}

#[derive(Debug)]
struct Stream {
    id: u32,
    /// Whether the client has ended its side (END_STREAM received).
    remote_closed: bool,
    send: Window,
    recv: Window,
    /// Octets the driver released on this stream and the client has not been granted back.
    released: u32,
}

/// A header block still arriving in CONTINUATION frames.
#[derive(Debug)]
struct Pending {
    stream: u32,
    end_stream: bool,
    /// The HEADERS frame made the stream depend on itself: reset once the block is decoded.
    self_dependent: bool,
}

/// The connection's state.
#[derive(Debug)]
pub struct Connection {
    config: Config,
    phase: Phase,
    theirs: Settings,
    decoder: hpack::Decoder,
    encoder: hpack::Encoder,
    fields: Fields,
    /// A header block being gathered from HEADERS and CONTINUATION frames.
    block: Vec<u8>,
    pending: Option<Pending>,
    /// Scratch for encoding our header blocks.
    scratch: Vec<u8>,
    streams: Vec<Stream>,
    /// The highest stream the client has used: anything at or below it not in `streams` is
    /// closed (or was never opened, being past our GOAWAY).
    last_stream: u32,
    /// Streams opened and reset by the client, for the rapid-reset bound.
    opened: u32,
    client_resets: u32,
    empty_frames: u32,
    send: Window,
    recv: Window,
    /// Connection-level octets released but not yet granted back with WINDOW_UPDATE.
    released: u32,
    client_going_away: bool,
    /// The last stream our GOAWAY promised to serve: streams above it are not opened.
    going_away: Option<u32>,
    out: Vec<u8>,
}

impl Connection {
    /// A connection that has sent nothing yet; its SETTINGS are in the output already.
    pub fn new(mut config: Config) -> Self {
        let mut out = Vec::new();
        frame::write_settings(
            &mut out,
            &[
                (SETTINGS_ENABLE_PUSH, 0),
                (
                    SETTINGS_MAX_CONCURRENT_STREAMS,
                    config.max_concurrent_streams,
                ),
                (SETTINGS_INITIAL_WINDOW_SIZE, config.initial_window_size),
                (SETTINGS_MAX_HEADER_LIST_SIZE, config.max_header_list_size),
            ],
        );
        // A connection window starts at 65,535 and can only grow (RFC 9113 section 6.9.2).
        config.connection_window = config.connection_window.max(super::flow::DEFAULT_WINDOW);
        let connection_window = config.connection_window;
        if connection_window > super::flow::DEFAULT_WINDOW {
            frame::write_window_update(
                &mut out,
                0,
                connection_window - super::flow::DEFAULT_WINDOW,
            );
        }
        Self {
            config,
            phase: Phase::Preface,
            theirs: Settings::default(),
            decoder: hpack::Decoder::new(Settings::default().header_table_size as usize),
            encoder: hpack::Encoder::new(),
            fields: Fields::new(),
            block: Vec::new(),
            pending: None,
            scratch: Vec::new(),
            streams: Vec::new(),
            last_stream: 0,
            opened: 0,
            client_resets: 0,
            empty_frames: 0,
            send: Window::new(super::flow::DEFAULT_WINDOW),
            recv: Window::new(connection_window),
            released: 0,
            client_going_away: false,
            going_away: None,
            out,
        }
    }

    /// Octets to write to the client; the driver drains it.
    pub fn output(&mut self) -> &mut Vec<u8> {
        &mut self.out
    }

    /// Streams open now.
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// Gives back the buffers a busy spell grew, for a connection going idle: an idle
    /// connection then holds its dynamic table and nothing else. Output not yet written is
    /// kept.
    pub fn free_buffers(&mut self) {
        self.fields.free();
        if self.pending.is_none() {
            self.block = Vec::new();
        }
        self.scratch = Vec::new();
        if self.out.is_empty() {
            self.out = Vec::new();
        }
        if self.streams.is_empty() {
            self.streams = Vec::new();
        }
    }

    /// Octets of buffers held now (the dynamic table aside).
    pub fn buffer_size(&self) -> usize {
        self.fields.heap_size()
            + self.block.capacity()
            + self.scratch.capacity()
            + self.out.capacity()
            + self.streams.capacity() * std::mem::size_of::<Stream>()
    }

    /// Whether the client's preface and first SETTINGS have come: until then the connection
    /// is still being set up, under the head deadline.
    pub fn established(&self) -> bool {
        self.phase == Phase::Open
    }

    /// Whether `stream` is open on our side: `send_headers` and `send_data` may still use it.
    pub fn is_open(&self, stream: u32) -> bool {
        self.index(stream).is_some()
    }

    /// Whether the client said it opens no more streams.
    pub fn client_going_away(&self) -> bool {
        self.client_going_away
    }

    /// Reads from `input` up to the next event: the octets taken, and the event if one
    /// happened. `(0, None)` means `input` holds no whole frame: read more.
    pub fn poll<'a>(
        &'a mut self,
        input: &'a [u8],
    ) -> Result<(usize, Option<Event<'a>>), ConnError> {
        let mut taken = 0;
        loop {
            let rest = &input[taken..];
            match self.phase {
                Phase::Failed => return Ok((taken, None)),
                Phase::Preface => {
                    let n = rest.len().min(PREFACE.len());
                    if rest[..n] != PREFACE[..n] {
                        return Err(self.fail(ErrorCode::Protocol, "not the HTTP/2 preface"));
                    }
                    if n < PREFACE.len() {
                        return Ok((taken, None));
                    }
                    taken += n;
                    self.phase = Phase::FirstSettings;
                }
                Phase::FirstSettings | Phase::Open => {
                    let parsed = match frame::parse(rest, frame::DEFAULT_MAX_FRAME_SIZE) {
                        Ok(parsed) => parsed,
                        Err(FrameError::Connection { code, reason }) => {
                            return Err(self.fail(code, reason));
                        }
                        Err(FrameError::Stream { stream, code }) => {
                            // Reported on whole frames only: skip this one, end its stream.
                            taken += frame_len(rest);
                            if self.pending.is_some() {
                                return Err(
                                    self.fail(ErrorCode::Protocol, "frame inside a header block")
                                );
                            }
                            match self.reset(stream, code) {
                                Some(Decided::Other(event)) => return Ok((taken, Some(event))),
                                _ => continue,
                            }
                        }
                    };
                    let Some((frame, used)) = parsed else {
                        return Ok((taken, None));
                    };
                    taken += used;
                    if let Some(event) = self.on_frame(frame)? {
                        return Ok((taken, Some(self.event(event))));
                    }
                }
            }
        }
    }

    /// Turns what `on_frame` decided into an event borrowing the decoded fields or input.
    fn event<'a>(&'a self, event: Decided<'a>) -> Event<'a> {
        match event {
            Decided::Headers {
                stream,
                end_stream,
                trailers,
            } => Event::Headers {
                stream,
                fields: &self.fields,
                end_stream,
                trailers,
            },
            Decided::Other(event) => event,
        }
    }

    fn on_frame<'a>(&mut self, frame: Frame<'a>) -> Result<Option<Decided<'a>>, ConnError> {
        if self.phase == Phase::FirstSettings {
            if !matches!(frame, Frame::Settings(SettingsFrame::Params(_))) {
                return Err(self.fail(ErrorCode::Protocol, "first frame is not SETTINGS"));
            }
            self.phase = Phase::Open;
        }
        if let Some(pending) = &self.pending {
            // Section 6.10: nothing may come between a header block's frames.
            let stream = pending.stream;
            return match frame {
                Frame::Continuation {
                    stream: s,
                    end_headers,
                    fragment,
                } if s == stream => self.continuation(end_headers, fragment),
                _ => Err(self.fail(ErrorCode::Protocol, "frame inside a header block")),
            };
        }
        match frame {
            Frame::Headers {
                stream,
                end_stream,
                end_headers,
                depends_on,
                fragment,
            } => {
                let self_dependent = depends_on == Some(stream);
                self.headers(stream, end_stream, end_headers, self_dependent, fragment)
            }
            Frame::Continuation { .. } => {
                Err(self.fail(ErrorCode::Protocol, "CONTINUATION without HEADERS"))
            }
            Frame::Data {
                stream,
                end_stream,
                data,
                flow_len,
            } => self.data(stream, end_stream, data, flow_len),
            Frame::RstStream { stream, code } => {
                if stream > self.last_stream {
                    return Err(self.fail(ErrorCode::Protocol, "RST_STREAM on an idle stream"));
                }
                if self.remove(stream).is_none() {
                    return Ok(None);
                }
                self.client_resets += 1;
                if self.client_resets > RESET_ALLOWANCE && self.client_resets * 2 > self.opened {
                    return Err(self.fail(ErrorCode::EnhanceYourCalm, "too many streams reset"));
                }
                Ok(Some(Decided::Other(Event::Reset {
                    stream,
                    code,
                    by_client: true,
                })))
            }
            Frame::Settings(SettingsFrame::Ack) => Ok(None),
            Frame::Settings(params) => {
                let old = self.theirs.initial_window_size;
                if params.apply(&mut self.theirs).is_err() {
                    // Checked when read; kept as an error rather than trusted.
                    return Err(self.fail(ErrorCode::Protocol, "SETTINGS"));
                }
                let new = self.theirs.initial_window_size;
                for s in &mut self.streams {
                    if s.send.resize(old, new).is_err() {
                        return Err(self.fail(ErrorCode::FlowControl, "window past 2^31-1"));
                    }
                }
                self.control_reply(frame::write_settings_ack)?;
                Ok(None)
            }
            Frame::Ping { ack: true, .. } => Ok(None),
            Frame::Ping { ack: false, data } => {
                self.control_reply(|out| frame::write_ping_ack(out, &data))?;
                Ok(None)
            }
            Frame::GoAway { last_stream, .. } => {
                self.client_going_away = true;
                Ok(Some(Decided::Other(Event::GoAway { last_stream })))
            }
            Frame::WindowUpdate {
                stream: 0,
                increment,
            } => {
                if self.send.grant(increment).is_err() {
                    return Err(self.fail(ErrorCode::FlowControl, "window past 2^31-1"));
                }
                Ok(None)
            }
            Frame::WindowUpdate { stream, increment } => {
                if stream > self.last_stream {
                    return Err(self.fail(ErrorCode::Protocol, "WINDOW_UPDATE on an idle stream"));
                }
                let overflow = self
                    .find(stream)
                    .is_some_and(|s| s.send.grant(increment).is_err());
                if overflow {
                    return Ok(self.reset(stream, ErrorCode::FlowControl));
                }
                Ok(None)
            }
            // Priorities are not honoured (RFC 9113 deprecates them), only checked when read;
            // one on an idle stream does not open it.
            Frame::Priority { .. } | Frame::Unknown => Ok(None),
        }
    }
}

/// An event decided while `self` was borrowed mutably; headers are lent out afterwards.
enum Decided<'a> {
    Headers {
        stream: u32,
        end_stream: bool,
        trailers: bool,
    },
    Other(Event<'a>),
}

/// The length of the whole frame at the start of `input`, header included (it is there: the
/// reader only reports stream errors on whole frames).
fn frame_len(input: &[u8]) -> usize {
    match input.first_chunk::<3>() {
        Some(len) => frame::HEADER_LEN + u32::from_be_bytes([0, len[0], len[1], len[2]]) as usize,
        None => input.len(),
    }
}

mod streams;

#[cfg(test)]
mod tests;
