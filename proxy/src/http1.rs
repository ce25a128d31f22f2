//! HTTP/1 response framing, as both engines must read it from a backend.
//!
//! A backend is not trusted to frame its responses well (RFC 9112 6.3). A Content-Length
//! is digits only, and several must agree; a Transfer-Encoding frames the body (chunked
//! when its last coding is, else until close) and any Content-Length beside it is removed
//! before the head goes on, as Pingora does too; chunk sizes are hex digits and nothing
//! else. Anything else is a 502 (or, once the head went out, a cut connection). A backend
//! connection that sent anything but clean framing is not used again.

/// What an HTTP/2 connection with prior knowledge starts with (RFC 9113 3.4).
pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Why a backend's response cannot be forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadResponse {
    #[error("malformed response head")]
    Malformed,
    #[error("invalid Content-Length")]
    Length,
    #[error("malformed chunked body")]
    Chunk,
}

/// The HTTP version of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Http10,
    Http11,
}

/// What a response head says about the message and the connection.
#[derive(Debug)]
pub struct ResponseHead {
    pub status: u16,
    pub version: Version,
    /// Length of the head in bytes.
    pub len: usize,
    pub framing: Framing,
    /// The backend connection can carry another request after this response.
    pub reusable: bool,
    /// The head has a Content-Length beside a Transfer-Encoding: it must go on without it.
    pub drop_length: bool,
}

/// Reads a response head at the start of `buf`; Ok(None): more bytes are needed.
/// `head_only`: the request was HEAD, so no body follows whatever the head says.
pub fn parse_response(
    buf: &[u8],
    head_only: bool,
    max_headers: usize,
) -> Result<Option<ResponseHead>, BadResponse> {
    let mut headers = vec![httparse::EMPTY_HEADER; max_headers];
    let mut parsed = httparse::Response::new(&mut headers);
    let len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(BadResponse::Malformed),
    };
    let status = parsed.code.ok_or(BadResponse::Malformed)?;
    let version = match parsed.version {
        Some(0) => Version::Http10,
        Some(1) => Version::Http11,
        _ => return Err(BadResponse::Malformed),
    };
    let fields = framing_fields(parsed.headers.iter().map(|h| (h.name.as_bytes(), h.value)))?;
    // HTTP/1.0 keeps a connection only when it says so; we do not rely on that. Nor on a
    // backend that sent conflicting framing.
    let drop_length = fields.encoded && fields.length_present;
    let mut reusable = version == Version::Http11 && !fields.close && !drop_length;
    let no_body = head_only || status == 204 || status == 304 || (100..200).contains(&status);
    let framing = if no_body {
        Framing::Length(0)
    } else if fields.encoded {
        if fields.chunked && version == Version::Http11 {
            Framing::Chunked(Chunked::default())
        } else {
            // Another final coding, or any coding from HTTP/1.0: the body ends at close.
            reusable = false;
            Framing::UntilClose
        }
    } else if let Some(n) = fields.length {
        Framing::Length(n)
    } else {
        reusable = false;
        Framing::UntilClose
    };
    Ok(Some(ResponseHead {
        status,
        version,
        len,
        framing,
        reusable,
        drop_length,
    }))
}

/// The framing-relevant header fields of a message.
#[derive(Debug, Default)]
pub struct FramingFields {
    /// The Content-Length, when no Transfer-Encoding overrides it.
    pub length: Option<u64>,
    /// A Content-Length field is present (valid or not).
    pub length_present: bool,
    /// A Transfer-Encoding field is present.
    pub encoded: bool,
    /// Its last coding is chunked.
    pub chunked: bool,
    /// "Connection: close".
    pub close: bool,
}

/// Reads Content-Length, Transfer-Encoding and Connection from header fields, refusing
/// an invalid or contradictory Content-Length that frames the body. Used on the fast path's
/// parse and on Pingora's parsed response alike.
pub fn framing_fields<'a>(
    headers: impl Iterator<Item = (&'a [u8], &'a [u8])>,
) -> Result<FramingFields, BadResponse> {
    let mut f = FramingFields::default();
    let mut length_error = false;
    for (name, value) in headers {
        if name.eq_ignore_ascii_case(b"content-length") {
            f.length_present = true;
            for v in value.split(|b| *b == b',') {
                match parse_length(v.trim_ascii()) {
                    Some(n) if f.length.is_none_or(|l| l == n) => f.length = Some(n),
                    _ => length_error = true,
                }
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            f.encoded = true;
            for coding in value.split(|b| *b == b',') {
                let coding = coding.trim_ascii();
                if !coding.is_empty() {
                    f.chunked = coding.eq_ignore_ascii_case(b"chunked");
                }
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            f.close |= value
                .split(|b| *b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
        }
    }
    if f.encoded {
        // Transfer-Encoding overrides it (RFC 9112 6.3); the field is dropped on the way.
        f.length = None;
    } else if length_error {
        return Err(BadResponse::Length);
    }
    Ok(f)
}

/// Digits only: no sign, no inner space, no overflow.
fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Where a response body ends.
#[derive(Debug)]
pub enum Framing {
    /// This many bytes remain.
    Length(u64),
    Chunked(Chunked),
    /// Until the backend closes; the client connection closes after it.
    UntilClose,
}

impl Framing {
    /// Of `bytes`, how many belong to this body, and whether the body ends within them.
    pub fn advance(&mut self, bytes: &[u8]) -> Result<(usize, bool), BadResponse> {
        match self {
            Self::Length(left) => {
                let take = usize::try_from(*left)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                *left -= take as u64;
                Ok((take, *left == 0))
            }
            Self::Chunked(c) => Ok(match c.feed(bytes)? {
                Some(end) => (end, true),
                None => (bytes.len(), false),
            }),
            Self::UntilClose => Ok((bytes.len(), false)),
        }
    }

    /// As `advance`, and calls `data` with each range of `bytes` that is body content rather
    /// than framing.
    pub fn advance_data(
        &mut self,
        bytes: &[u8],
        data: &mut dyn FnMut(std::ops::Range<usize>),
    ) -> Result<(usize, bool), BadResponse> {
        match self {
            Self::Chunked(c) => Ok(match c.feed_data(bytes, data)? {
                Some(end) => (end, true),
                None => (bytes.len(), false),
            }),
            _ => {
                let (end, done) = self.advance(bytes)?;
                if end > 0 {
                    data(0..end);
                }
                Ok((end, done))
            }
        }
    }

    /// Whether the body's end is known from the message itself (so the client connection
    /// can carry on).
    pub fn delimited(&self) -> bool {
        !matches!(self, Self::UntilClose)
    }
}

/// Longest chunk-size line (size and extensions) and trailer line accepted.
const MAX_LINE: usize = 4096;
/// Most trailer bytes accepted after the last chunk, all lines together (Pingora's bound).
const MAX_TRAILERS: usize = 64 * 1024;

/// Tracks chunked framing over bytes that are forwarded unchanged (RFC 9112 7.1).
#[derive(Debug, Default, Clone)]
pub struct Chunked {
    state: ChunkState,
    size: u64,
    digits: u8,
    line: usize,
    trailers: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Hex digits of a chunk size.
    #[default]
    Size,
    /// After the size: whitespace, then ";" and extensions, then CR.
    SizeRest,
    /// Chunk extensions, up to CR.
    Extension,
    /// The LF ending a size line.
    SizeLf,
    /// Chunk data: `size` bytes left.
    Data,
    /// The CR after chunk data.
    DataCr,
    /// The LF after chunk data.
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    /// Inside a trailer line, up to CR.
    Trailer,
    /// The LF ending a trailer line.
    TrailerLf,
    /// The LF of the final empty line.
    FinalLf,
}

impl Chunked {
    /// Feeds bytes; Ok(Some(n)): the message ends after the first `n` of them.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Option<usize>, BadResponse> {
        self.feed_data(bytes, &mut |_| {})
    }

    /// As `feed`, and calls `data` with each range of `bytes` that is chunk data (what an
    /// HTTP/2 client gets as the body, the framing taken off).
    pub fn feed_data(
        &mut self,
        bytes: &[u8],
        data: &mut dyn FnMut(std::ops::Range<usize>),
    ) -> Result<Option<usize>, BadResponse> {
        use ChunkState as S;
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            if matches!(
                self.state,
                S::Size | S::SizeRest | S::Extension | S::Trailer
            ) {
                self.line += 1;
                if self.line > MAX_LINE {
                    return Err(BadResponse::Chunk);
                }
            }
            if matches!(self.state, S::TrailerStart | S::Trailer | S::TrailerLf) {
                self.trailers += 1;
                if self.trailers > MAX_TRAILERS {
                    return Err(BadResponse::Chunk);
                }
            }
            match self.state {
                S::Size => match hex_digit(b) {
                    Some(d) if self.digits < 16 => {
                        self.size = self.size << 4 | u64::from(d);
                        self.digits += 1;
                    }
                    None if self.digits > 0 => {
                        self.state = S::SizeRest;
                        continue;
                    }
                    _ => return Err(BadResponse::Chunk),
                },
                S::SizeRest => match b {
                    b' ' | b'\t' => {}
                    b';' => self.state = S::Extension,
                    b'\r' => self.state = S::SizeLf,
                    _ => return Err(BadResponse::Chunk),
                },
                S::Extension => match b {
                    b'\r' => self.state = S::SizeLf,
                    b'\n' => return Err(BadResponse::Chunk),
                    _ => {}
                },
                S::SizeLf => {
                    if b != b'\n' {
                        return Err(BadResponse::Chunk);
                    }
                    self.line = 0;
                    self.state = if self.size == 0 {
                        S::TrailerStart
                    } else {
                        S::Data
                    };
                }
                S::Data => {
                    let take = usize::try_from(self.size)
                        .unwrap_or(usize::MAX)
                        .min(bytes.len() - i);
                    self.size -= take as u64;
                    if take > 0 {
                        data(i..i + take);
                    }
                    i += take;
                    if self.size == 0 {
                        self.state = S::DataCr;
                    }
                    continue;
                }
                S::DataCr => {
                    if b != b'\r' {
                        return Err(BadResponse::Chunk);
                    }
                    self.state = S::DataLf;
                }
                S::DataLf => {
                    if b != b'\n' {
                        return Err(BadResponse::Chunk);
                    }
                    self.state = S::Size;
                    self.digits = 0;
                    self.size = 0;
                }
                S::TrailerStart => match b {
                    b'\r' => self.state = S::FinalLf,
                    b'\n' => return Err(BadResponse::Chunk),
                    _ => {
                        self.line = 1;
                        self.state = S::Trailer;
                    }
                },
                S::Trailer => match b {
                    b'\r' => self.state = S::TrailerLf,
                    b'\n' => return Err(BadResponse::Chunk),
                    _ => {}
                },
                S::TrailerLf => {
                    if b != b'\n' {
                        return Err(BadResponse::Chunk);
                    }
                    self.line = 0;
                    self.state = S::TrailerStart;
                }
                S::FinalLf => {
                    if b != b'\n' {
                        return Err(BadResponse::Chunk);
                    }
                    return Ok(Some(i + 1));
                }
            }
            i += 1;
        }
        Ok(None)
    }
}

/// Decodes `bytes` of a chunked body with `decoder` and appends their chunk data to `out`
/// framed again as one chunk (nothing when they held no data), then the last chunk, with no
/// trailer fields, if the body ended; Some(n): it ended after `n` of the bytes. A body
/// forwarded this way reaches the next hop with canonical framing only: none of the sender's
/// extensions, whitespace or trailers, on which parsers disagree.
pub fn reframe(
    decoder: &mut Chunked,
    bytes: &[u8],
    out: &mut Vec<u8>,
) -> Result<Option<usize>, BadResponse> {
    let mut data: Vec<std::ops::Range<usize>> = Vec::new();
    let ended = decoder.feed_data(bytes, &mut |r| data.push(r))?;
    let size: usize = data.iter().map(ExactSizeIterator::len).sum();
    if size > 0 {
        out.reserve(size + 24);
        let _ = std::io::Write::write_fmt(out, format_args!("{size:x}\r\n"));
        for r in data {
            out.extend_from_slice(&bytes[r]);
        }
        out.extend_from_slice(b"\r\n");
    }
    if ended.is_some() {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    Ok(ended)
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
