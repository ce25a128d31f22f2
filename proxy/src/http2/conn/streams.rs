//! Streams: opening them from header blocks, their DATA and windows, and what the driver
//! sends on them.

use super::{ConnError, Connection, Decided, Event, Pending, Phase, SendError, Stream};
use super::{MAX_CONTROL_BACKLOG, MAX_EMPTY_FRAMES};
use crate::hpack::DecodeError;
use crate::http2::frame;
use crate::http2::{ErrorCode, Window};

impl Connection {
    pub(super) fn headers<'a>(
        &mut self,
        stream: u32,
        end_stream: bool,
        end_headers: bool,
        self_dependent: bool,
        fragment: &[u8],
    ) -> Result<Option<Decided<'a>>, ConnError> {
        if stream.is_multiple_of(2) {
            return Err(self.fail(ErrorCode::Protocol, "a client opened an even stream"));
        }
        self.block.clear();
        self.gather(fragment)?;
        if !end_headers {
            self.pending = Some(Pending {
                stream,
                end_stream,
                self_dependent,
            });
            return Ok(None);
        }
        self.finish_block(stream, end_stream, self_dependent)
    }

    pub(super) fn continuation<'a>(
        &mut self,
        end_headers: bool,
        fragment: &[u8],
    ) -> Result<Option<Decided<'a>>, ConnError> {
        if fragment.is_empty() && !end_headers {
            self.empty_frame()?;
        }
        self.gather(fragment)?;
        if !end_headers {
            return Ok(None);
        }
        match self.pending.take() {
            Some(Pending {
                stream,
                end_stream,
                self_dependent,
            }) => self.finish_block(stream, end_stream, self_dependent),
            None => Err(self.fail(ErrorCode::Protocol, "CONTINUATION without HEADERS")),
        }
    }

    /// Adds a fragment to the block being gathered. A block larger, still compressed, than
    /// the list we accept decoded is no honest client's (CVE-2024-27316's CONTINUATION flood).
    fn gather(&mut self, fragment: &[u8]) -> Result<(), ConnError> {
        if self.block.len() + fragment.len() > self.config.max_header_list_size as usize {
            return Err(self.fail(
                ErrorCode::EnhanceYourCalm,
                "header block over the list bound",
            ));
        }
        self.block.extend_from_slice(fragment);
        Ok(())
    }

    fn finish_block<'a>(
        &mut self,
        stream: u32,
        end_stream: bool,
        self_dependent: bool,
    ) -> Result<Option<Decided<'a>>, ConnError> {
        // Decoded whatever becomes of the stream: the table must stay in step with the client's.
        let limit = self.config.max_header_list_size as usize;
        let decoded = self.decoder.decode(&self.block, limit, &mut self.fields);
        if let Err(e) = &decoded
            && e.is_connection_error()
        {
            return Err(self.fail(ErrorCode::Compression, "header block does not decode"));
        }
        let too_large = matches!(decoded, Err(DecodeError::ListTooLarge { .. }));
        if self_dependent {
            // Section 5.3.1: the stream's PROTOCOL_ERROR, the block having been taken.
            self.last_stream = self.last_stream.max(stream);
            return Ok(self.reset(stream, ErrorCode::Protocol));
        }
        if let Some(i) = self.index(stream) {
            // Trailers: they must end the stream, which must still be open on the client's side.
            if self.streams[i].remote_closed || !end_stream || too_large {
                return Ok(self.reset(stream, ErrorCode::Protocol));
            }
            self.streams[i].remote_closed = true;
            return Ok(Some(Decided::Headers {
                stream,
                end_stream,
                trailers: true,
            }));
        }
        if stream <= self.last_stream {
            // Closed already, by us or by both sides: frames in flight are ignored (5.1).
            return Ok(None);
        }
        self.last_stream = stream;
        if self.going_away.is_some_and(|last| stream > last) {
            // Past our GOAWAY: the client retries it elsewhere (section 6.8). Not opened; its
            // frames in flight are ignored as a closed stream's.
            return Ok(None);
        }
        if too_large {
            self.refuse(stream, 431, end_stream);
            return Ok(Some(Decided::Other(Event::Refused {
                stream,
                status: 431,
            })));
        }
        if self.streams.len() >= self.config.max_concurrent_streams as usize {
            frame::write_rst_stream(&mut self.out, stream, ErrorCode::RefusedStream);
            return Ok(Some(Decided::Other(Event::Reset {
                stream,
                code: ErrorCode::RefusedStream as u32,
                by_client: false,
            })));
        }
        self.opened += 1;
        self.streams.push(Stream {
            id: stream,
            remote_closed: end_stream,
            send: Window::new(self.theirs.initial_window_size),
            recv: Window::new(self.config.initial_window_size),
            released: 0,
        });
        Ok(Some(Decided::Headers {
            stream,
            end_stream,
            trailers: false,
        }))
    }

    pub(super) fn data<'a>(
        &mut self,
        stream: u32,
        end_stream: bool,
        data: &'a [u8],
        flow_len: u32,
    ) -> Result<Option<Decided<'a>>, ConnError> {
        if stream > self.last_stream {
            return Err(self.fail(ErrorCode::Protocol, "DATA on an idle stream"));
        }
        // The connection's window counts every DATA frame, whatever its stream (6.9).
        if self.recv.consume(flow_len).is_err() {
            return Err(self.fail(ErrorCode::FlowControl, "DATA past the connection window"));
        }
        if data.is_empty() && !end_stream {
            self.empty_frame()?;
        }
        // Padding is nobody's to release: granted back at once, with the whole frame when
        // the stream will not take it.
        let padding = flow_len - data.len() as u32;
        let Some(i) = self.index(stream) else {
            self.release_connection(flow_len);
            return Ok(None);
        };
        let s = &mut self.streams[i];
        if s.remote_closed {
            self.release_connection(flow_len);
            return Ok(self.reset(stream, ErrorCode::StreamClosed));
        }
        if s.recv.consume(flow_len).is_err() {
            self.release_connection(flow_len);
            return Ok(self.reset(stream, ErrorCode::FlowControl));
        }
        s.remote_closed = end_stream;
        self.release_connection(padding);
        Ok(Some(Decided::Other(Event::Data {
            stream,
            data,
            end_stream,
        })))
    }

    fn empty_frame(&mut self) -> Result<(), ConnError> {
        self.empty_frames += 1;
        if self.empty_frames > MAX_EMPTY_FRAMES {
            return Err(self.fail(ErrorCode::EnhanceYourCalm, "too many empty frames"));
        }
        Ok(())
    }

    /// The driver passed `len` octets of a stream's body on: the client may send as many
    /// again. Call it for every Data event's octets, even after the stream ended.
    pub fn release(&mut self, stream: u32, len: usize) {
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        self.release_connection(len);
        let half = self.config.initial_window_size / 2;
        if let Some(i) = self.index(stream) {
            let s = &mut self.streams[i];
            if s.remote_closed {
                return;
            }
            s.released = s.released.saturating_add(len);
            if s.released >= half && s.recv.grant(s.released).is_ok() {
                frame::write_window_update(&mut self.out, stream, s.released);
                s.released = 0;
            }
        }
    }

    fn release_connection(&mut self, len: u32) {
        self.released = self.released.saturating_add(len);
        if self.released >= self.config.connection_window / 2
            && self.recv.grant(self.released).is_ok()
        {
            frame::write_window_update(&mut self.out, 0, self.released);
            self.released = 0;
        }
    }

    /// Sends an answer's head (or trailers: `status` None) on `stream`.
    pub fn send_headers<'f>(
        &mut self,
        stream: u32,
        status: Option<u16>,
        fields: impl IntoIterator<Item = (&'f [u8], &'f [u8])>,
        end_stream: bool,
    ) -> Result<(), SendError> {
        let i = self.index(stream).ok_or(SendError::NotOpen(stream))?;
        self.scratch.clear();
        self.encoder.begin(&mut self.scratch);
        if let Some(status) = status {
            self.encoder.status(status, &mut self.scratch);
        }
        for (name, value) in fields {
            self.encoder.field(name, value, &mut self.scratch);
        }
        frame::write_headers(
            &mut self.out,
            stream,
            &self.scratch,
            end_stream,
            self.theirs.max_frame_size,
        );
        if end_stream {
            self.close_local(i);
        }
        Ok(())
    }

    /// Octets `send_data` would take on `stream` now.
    pub fn send_capacity(&self, stream: u32) -> usize {
        self.index(stream).map_or(0, |i| {
            self.send.available().min(self.streams[i].send.available())
        })
    }

    /// Sends what the windows allow of `data` on `stream`, in frames of the client's maximum
    /// size, and returns how much that was. The stream ends only if all of it went.
    pub fn send_data(
        &mut self,
        stream: u32,
        data: &[u8],
        end_stream: bool,
    ) -> Result<usize, SendError> {
        let i = self.index(stream).ok_or(SendError::NotOpen(stream))?;
        let n = data.len().min(self.send_capacity(stream));
        let max = self.theirs.max_frame_size as usize;
        let ends = end_stream && n == data.len();
        let mut chunks = data[..n].chunks(max).peekable();
        if n == 0 && ends {
            frame::write_data_header(&mut self.out, stream, 0, true);
        }
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            frame::write_data_header(&mut self.out, stream, chunk.len(), ends && last);
            self.out.extend_from_slice(chunk);
        }
        // Within both windows by construction.
        let sent = n as u32;
        let _ = self.send.consume(sent);
        let _ = self.streams[i].send.consume(sent);
        if ends {
            self.close_local(i);
        }
        Ok(n)
    }

    /// Our side of stream `i` is done. If the client's is not, it is told to stop sending
    /// with RST_STREAM NO_ERROR (RFC 9113 section 8.1): the answer does not need the rest.
    fn close_local(&mut self, i: usize) {
        let s = self.streams.swap_remove(i);
        if !s.remote_closed {
            frame::write_rst_stream(&mut self.out, s.id, ErrorCode::NoError);
        }
    }

    /// Ends `stream` with RST_STREAM `code`: the Reset event when it was live.
    pub(super) fn reset<'a>(&mut self, stream: u32, code: ErrorCode) -> Option<Decided<'a>> {
        frame::write_rst_stream(&mut self.out, stream, code);
        self.remove(stream).map(|_| {
            Decided::Other(Event::Reset {
                stream,
                code: code as u32,
                by_client: false,
            })
        })
    }

    /// The driver ends `stream` (its backend failed, or it gave up on the client).
    pub fn cancel(&mut self, stream: u32, code: ErrorCode) {
        frame::write_rst_stream(&mut self.out, stream, code);
        self.remove(stream);
    }

    /// Answers `stream` with a bare `status` and closes it, telling the client to stop
    /// sending when its side is still open.
    fn refuse(&mut self, stream: u32, status: u16, remote_closed: bool) {
        self.scratch.clear();
        self.encoder.begin(&mut self.scratch);
        self.encoder.status(status, &mut self.scratch);
        frame::write_headers(
            &mut self.out,
            stream,
            &self.scratch,
            true,
            self.theirs.max_frame_size,
        );
        if !remote_closed {
            frame::write_rst_stream(&mut self.out, stream, ErrorCode::NoError);
        }
    }

    /// Ends the connection at once for a reason of the driver's: a GOAWAY with `code`, and
    /// nothing more is read. Write the output, then close.
    pub fn close(&mut self, code: ErrorCode, reason: &'static str) {
        let _ = self.fail(code, reason);
    }

    /// Ends the connection gracefully: streams opened so far may finish, no new one is
    /// taken. Once they are done (`open_streams() == 0`) the driver closes the connection.
    pub fn go_away(&mut self) {
        if self.going_away.is_none() {
            self.going_away = Some(self.last_stream);
            frame::write_goaway(&mut self.out, self.last_stream, ErrorCode::NoError);
        }
    }

    pub(super) fn index(&self, stream: u32) -> Option<usize> {
        self.streams.iter().position(|s| s.id == stream)
    }

    pub(super) fn find(&mut self, stream: u32) -> Option<&mut Stream> {
        self.streams.iter_mut().find(|s| s.id == stream)
    }

    pub(super) fn remove(&mut self, stream: u32) -> Option<Stream> {
        self.index(stream).map(|i| self.streams.swap_remove(i))
    }

    /// Queues a reply to a control frame, unless the client is not reading them.
    pub(super) fn control_reply(
        &mut self,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(), ConnError> {
        if self.out.len() > MAX_CONTROL_BACKLOG {
            return Err(self.fail(
                ErrorCode::EnhanceYourCalm,
                "control frames sent without reading",
            ));
        }
        write(&mut self.out);
        Ok(())
    }

    /// Queues GOAWAY with `code`; nothing more is read.
    pub(super) fn fail(&mut self, code: ErrorCode, reason: &'static str) -> ConnError {
        if self.phase != Phase::Failed {
            let last = self.going_away.unwrap_or(self.last_stream);
            frame::write_goaway(&mut self.out, last, code);
            self.phase = Phase::Failed;
        }
        ConnError { code, reason }
    }
}
