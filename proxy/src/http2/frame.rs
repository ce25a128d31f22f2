//! HTTP/2 frames (RFC 9113 sections 4 and 6): read from a client's bytes without copying,
//! every size and stream rule of section 6 checked, and written into an output buffer.

use super::{ErrorCode, Settings};

/// Octets in a frame header.
pub const HEADER_LEN: usize = 9;

/// SETTINGS_MAX_FRAME_SIZE's floor and initial value.
pub const DEFAULT_MAX_FRAME_SIZE: u32 = 16_384;

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY_FLAG: u8 = 0x20;

/// A frame, its payload borrowed from the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'a> {
    Data {
        stream: u32,
        end_stream: bool,
        data: &'a [u8],
        /// The whole payload, padding included: what flow control counts (section 6.9.1).
        flow_len: u32,
    },
    Headers {
        stream: u32,
        end_stream: bool,
        end_headers: bool,
        /// The stream this one depends on, when the frame carries a priority.
        depends_on: Option<u32>,
        fragment: &'a [u8],
    },
    Priority {
        stream: u32,
        depends_on: u32,
    },
    RstStream {
        stream: u32,
        code: u32,
    },
    Settings(SettingsFrame<'a>),
    Ping {
        ack: bool,
        data: [u8; 8],
    },
    GoAway {
        last_stream: u32,
        code: u32,
    },
    WindowUpdate {
        stream: u32,
        increment: u32,
    },
    Continuation {
        stream: u32,
        end_headers: bool,
        fragment: &'a [u8],
    },
    /// A frame type this endpoint does not know, which it must ignore (section 4.1).
    Unknown,
}

/// A SETTINGS frame: an acknowledgement, or parameters (each already checked) to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingsFrame<'a> {
    Ack,
    Params(&'a [u8]),
}

impl SettingsFrame<'_> {
    /// Applies the parameters to `settings`, in order; unknown ones are ignored.
    pub fn apply(&self, settings: &mut Settings) -> Result<(), FrameError> {
        let SettingsFrame::Params(params) = self else {
            return Ok(());
        };
        for param in params.chunks_exact(6) {
            let id = u16::from_be_bytes([param[0], param[1]]);
            let value = u32::from_be_bytes([param[2], param[3], param[4], param[5]]);
            match id {
                0x1 => settings.header_table_size = value,
                0x2 if value > 1 => return Err(connection(ErrorCode::Protocol, "ENABLE_PUSH")),
                0x3 => settings.max_concurrent_streams = value,
                0x4 if value > i32::MAX as u32 => {
                    return Err(connection(
                        ErrorCode::FlowControl,
                        "INITIAL_WINDOW_SIZE over 2^31-1",
                    ));
                }
                0x4 => settings.initial_window_size = value,
                0x5 if !(DEFAULT_MAX_FRAME_SIZE..=0xff_ffff).contains(&value) => {
                    return Err(connection(ErrorCode::Protocol, "MAX_FRAME_SIZE"));
                }
                0x5 => settings.max_frame_size = value,
                0x6 => settings.max_header_list_size = value,
                _ => {}
            }
        }
        Ok(())
    }
}

/// What a frame broke, and so what must be reset: the stream, or the whole connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("connection error {code:?}: {reason}")]
    Connection {
        code: ErrorCode,
        reason: &'static str,
    },
    #[error("stream {stream} error {code:?}")]
    Stream { stream: u32, code: ErrorCode },
}

fn connection(code: ErrorCode, reason: &'static str) -> FrameError {
    FrameError::Connection { code, reason }
}

/// Reads the frame at the start of `input`: `Ok(None)` until all of it is there, else the
/// frame and the octets it took. Frames over `max_frame_size` (ours, as announced) are a
/// connection error before their payload is even awaited.
pub fn parse(input: &[u8], max_frame_size: u32) -> Result<Option<(Frame<'_>, usize)>, FrameError> {
    let Some(head) = input.first_chunk::<HEADER_LEN>() else {
        return Ok(None);
    };
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]);
    if len > max_frame_size {
        return Err(connection(
            ErrorCode::FrameSize,
            "frame over SETTINGS_MAX_FRAME_SIZE",
        ));
    }
    let total = HEADER_LEN + len as usize;
    let Some(payload) = input.get(HEADER_LEN..total) else {
        return Ok(None);
    };
    let (kind, flags) = (head[3], head[4]);
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let frame = match kind {
        DATA => {
            let stream = on_stream(stream)?;
            Frame::Data {
                stream,
                end_stream: flags & END_STREAM != 0,
                data: unpad(payload, flags)?,
                flow_len: len,
            }
        }
        HEADERS => {
            let stream = on_stream(stream)?;
            let mut fragment = unpad(payload, flags)?;
            let mut depends_on = None;
            if flags & PRIORITY_FLAG != 0 {
                let Some((priority, rest)) = fragment.split_first_chunk::<5>() else {
                    return Err(connection(
                        ErrorCode::FrameSize,
                        "HEADERS priority cut short",
                    ));
                };
                // Depending on itself is checked by the connection, after the block is
                // decoded: HPACK's table must take every block (RFC 9113 section 4.3).
                depends_on = Some(dependency_of(priority));
                fragment = rest;
            }
            Frame::Headers {
                stream,
                end_stream: flags & END_STREAM != 0,
                end_headers: flags & END_HEADERS != 0,
                depends_on,
                fragment,
            }
        }
        PRIORITY => {
            let stream = on_stream(stream)?;
            let Ok(priority) = <&[u8; 5]>::try_from(payload) else {
                return Err(FrameError::Stream {
                    stream,
                    code: ErrorCode::FrameSize,
                });
            };
            Frame::Priority {
                stream,
                depends_on: dependency(priority, stream)?,
            }
        }
        RST_STREAM => Frame::RstStream {
            stream: on_stream(stream)?,
            code: word(payload, "RST_STREAM is 4 octets")?,
        },
        SETTINGS => {
            if stream != 0 {
                return Err(connection(ErrorCode::Protocol, "SETTINGS on a stream"));
            }
            if flags & ACK != 0 {
                if len != 0 {
                    return Err(connection(
                        ErrorCode::FrameSize,
                        "SETTINGS ack with a payload",
                    ));
                }
                Frame::Settings(SettingsFrame::Ack)
            } else if !len.is_multiple_of(6) {
                return Err(connection(
                    ErrorCode::FrameSize,
                    "SETTINGS not in 6-octet units",
                ));
            } else {
                let frame = SettingsFrame::Params(payload);
                // Checked now, so that applying it later cannot fail half-way.
                frame.apply(&mut Settings::default())?;
                Frame::Settings(frame)
            }
        }
        PUSH_PROMISE => {
            // A server has push off towards itself by definition: clients never push.
            return Err(connection(
                ErrorCode::Protocol,
                "PUSH_PROMISE from a client",
            ));
        }
        PING => {
            if stream != 0 {
                return Err(connection(ErrorCode::Protocol, "PING on a stream"));
            }
            let Ok(data) = <[u8; 8]>::try_from(payload) else {
                return Err(connection(ErrorCode::FrameSize, "PING is 8 octets"));
            };
            Frame::Ping {
                ack: flags & ACK != 0,
                data,
            }
        }
        GOAWAY => {
            if stream != 0 {
                return Err(connection(ErrorCode::Protocol, "GOAWAY on a stream"));
            }
            let Some((last, rest)) = payload.split_first_chunk::<4>() else {
                return Err(connection(ErrorCode::FrameSize, "GOAWAY cut short"));
            };
            Frame::GoAway {
                last_stream: u32::from_be_bytes(*last) & 0x7fff_ffff,
                code: word(rest.get(..4).unwrap_or_default(), "GOAWAY cut short")?,
            }
        }
        WINDOW_UPDATE => {
            let increment = word(payload, "WINDOW_UPDATE is 4 octets")? & 0x7fff_ffff;
            if increment == 0 {
                // Section 6.9: on the connection a connection error, on a stream a stream one.
                return Err(if stream == 0 {
                    connection(ErrorCode::Protocol, "WINDOW_UPDATE of 0")
                } else {
                    FrameError::Stream {
                        stream,
                        code: ErrorCode::Protocol,
                    }
                });
            }
            Frame::WindowUpdate { stream, increment }
        }
        CONTINUATION => Frame::Continuation {
            stream: on_stream(stream)?,
            end_headers: flags & END_HEADERS != 0,
            fragment: payload,
        },
        _ => Frame::Unknown,
    };
    Ok(Some((frame, total)))
}

/// Frames that belong to a stream may not name stream 0.
fn on_stream(stream: u32) -> Result<u32, FrameError> {
    if stream == 0 {
        Err(connection(ErrorCode::Protocol, "stream frame on stream 0"))
    } else {
        Ok(stream)
    }
}

fn word(payload: &[u8], reason: &'static str) -> Result<u32, FrameError> {
    <[u8; 4]>::try_from(payload)
        .map(u32::from_be_bytes)
        .map_err(|_| connection(ErrorCode::FrameSize, reason))
}

fn dependency_of(priority: &[u8; 5]) -> u32 {
    u32::from_be_bytes([priority[0], priority[1], priority[2], priority[3]]) & 0x7fff_ffff
}

/// A PRIORITY frame's dependency; a stream may not depend on itself (section 5.3.1).
fn dependency(priority: &[u8; 5], stream: u32) -> Result<u32, FrameError> {
    let on = dependency_of(priority);
    if on == stream {
        return Err(FrameError::Stream {
            stream,
            code: ErrorCode::Protocol,
        });
    }
    Ok(on)
}

/// The payload without its padding (section 6.1): a pad length at least the rest is an error.
fn unpad(payload: &[u8], flags: u8) -> Result<&[u8], FrameError> {
    if flags & PADDED == 0 {
        return Ok(payload);
    }
    let Some((&pad, rest)) = payload.split_first() else {
        return Err(connection(
            ErrorCode::FrameSize,
            "padded frame without a pad length",
        ));
    };
    rest.len()
        .checked_sub(usize::from(pad))
        .map(|keep| &rest[..keep])
        .ok_or(connection(
            ErrorCode::Protocol,
            "padding longer than the payload",
        ))
}

fn header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = (len as u32).to_be_bytes();
    out.extend_from_slice(&[len[1], len[2], len[3], kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
}

/// Our SETTINGS: each (identifier, value) pair.
pub fn write_settings(out: &mut Vec<u8>, params: &[(u16, u32)]) {
    header(out, params.len() * 6, SETTINGS, 0, 0);
    for (id, value) in params {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&value.to_be_bytes());
    }
}

pub fn write_settings_ack(out: &mut Vec<u8>) {
    header(out, 0, SETTINGS, ACK, 0);
}

pub fn write_ping_ack(out: &mut Vec<u8>, data: &[u8; 8]) {
    header(out, 8, PING, ACK, 0);
    out.extend_from_slice(data);
}

pub fn write_window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    header(out, 4, WINDOW_UPDATE, 0, stream);
    out.extend_from_slice(&increment.to_be_bytes());
}

pub fn write_rst_stream(out: &mut Vec<u8>, stream: u32, code: ErrorCode) {
    header(out, 4, RST_STREAM, 0, stream);
    out.extend_from_slice(&(code as u32).to_be_bytes());
}

pub fn write_goaway(out: &mut Vec<u8>, last_stream: u32, code: ErrorCode) {
    header(out, 8, GOAWAY, 0, 0);
    out.extend_from_slice(&last_stream.to_be_bytes());
    out.extend_from_slice(&(code as u32).to_be_bytes());
}

/// A header block as HEADERS, then CONTINUATIONs when it is over `max_frame_size` (the
/// client's).
pub fn write_headers(
    out: &mut Vec<u8>,
    stream: u32,
    block: &[u8],
    end_stream: bool,
    max_frame_size: u32,
) {
    let max = max_frame_size.max(DEFAULT_MAX_FRAME_SIZE) as usize;
    let mut chunks = block.chunks(max).peekable();
    let first = chunks.next().unwrap_or_default();
    let mut flags = if end_stream { END_STREAM } else { 0 };
    if chunks.peek().is_none() {
        flags |= END_HEADERS;
    }
    header(out, first.len(), HEADERS, flags, stream);
    out.extend_from_slice(first);
    while let Some(chunk) = chunks.next() {
        let flags = if chunks.peek().is_none() {
            END_HEADERS
        } else {
            0
        };
        header(out, chunk.len(), CONTINUATION, flags, stream);
        out.extend_from_slice(chunk);
    }
}

/// A DATA frame's header, for `len` octets the caller writes after it (at most the client's
/// SETTINGS_MAX_FRAME_SIZE, and within both flow-control windows).
pub fn write_data_header(out: &mut Vec<u8>, stream: u32, len: usize, end_stream: bool) {
    header(
        out,
        len,
        DATA,
        if end_stream { END_STREAM } else { 0 },
        stream,
    );
}
