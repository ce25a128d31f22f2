//! The PROXY protocol (versions 1 and 2, as HAProxy specifies them): an L4 load balancer in
//! front of the proxy opens each connection with a header naming the client it accepted.
//! When a listener takes it, the header is required: a connection without a valid one is
//! closed, since its peer would otherwise be taken for the client.
//!
//! The header is read with exact-length reads, never past its end, so what follows (a TLS
//! ClientHello, an HTTP request) is left in the socket for whoever serves the connection.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use tokio::io::AsyncReadExt;

/// The v2 header's first 12 bytes.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// A v1 header is one line of at most this many bytes, CRLF included.
const V1_MAX: usize = 107;
/// Address and TLV bytes after a v2 header's fixed 16 beyond which it is refused; TLVs that
/// load balancers send (ALPN, authority, unique id, SSL details) fit in much less.
const V2_MAX_BODY: usize = 4096;
/// The shortest v1 header, "PROXY UNKNOWN\r\n": this much is always read first.
const FIRST: usize = 15;

/// What a header says about the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// Relayed for this client.
    Proxied { source: SocketAddr },
    /// The load balancer's own connection (a health check), or an address family with no
    /// IP (UNKNOWN, UNIX): the connection's peer stands.
    Local,
}

impl Header {
    /// The client of a connection from `peer` that carried this header.
    pub fn client(&self, peer: SocketAddr) -> SocketAddr {
        match self {
            Self::Proxied { source } => *source,
            Self::Local => peer,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("the connection does not start with a PROXY protocol header")]
    Missing,
    #[error("malformed PROXY protocol v1 line: {0}")]
    V1(&'static str),
    #[error("malformed PROXY protocol v2 header: {0}")]
    V2(&'static str),
}

/// Parses a header at the start of `buf`. Ok(None): not whole yet, read more; Ok(Some):
/// the header and its length in bytes.
pub fn parse(buf: &[u8]) -> Result<Option<(Header, usize)>, Invalid> {
    if buf.is_empty() {
        return Ok(None);
    }
    let sig = buf.len().min(V2_SIGNATURE.len());
    if buf[..sig] == V2_SIGNATURE[..sig] {
        return parse_v2(buf);
    }
    let v1 = b"PROXY ";
    let pre = buf.len().min(v1.len());
    if buf[..pre] == v1[..pre] {
        return parse_v1(buf);
    }
    Err(Invalid::Missing)
}

fn parse_v1(buf: &[u8]) -> Result<Option<(Header, usize)>, Invalid> {
    let Some(lf) = buf.iter().take(V1_MAX).position(|b| *b == b'\n') else {
        return if buf.len() >= V1_MAX {
            Err(Invalid::V1("no CRLF within 107 bytes"))
        } else {
            Ok(None)
        };
    };
    if lf == 0 || buf[lf - 1] != b'\r' {
        return Err(Invalid::V1("the line does not end in CRLF"));
    }
    let line = std::str::from_utf8(&buf[..lf - 1]).map_err(|_| Invalid::V1("not ASCII"))?;
    let mut words = line.split(' ');
    words.next(); // "PROXY"
    let family = words.next().ok_or(Invalid::V1("no protocol"))?;
    if family == "UNKNOWN" {
        // The rest of the line is to be ignored.
        return Ok(Some((Header::Local, lf + 1)));
    }
    let mut next = |what| {
        words
            .next()
            .filter(|w| !w.is_empty())
            .ok_or(Invalid::V1(what))
    };
    let (src, _dst, sport, _dport) = (
        next("no source address")?,
        next("no destination address")?,
        next("no source port")?,
        next("no destination port")?,
    );
    if words.next().is_some() {
        return Err(Invalid::V1("more than six fields"));
    }
    let ip: IpAddr = match family {
        "TCP4" => src
            .parse::<Ipv4Addr>()
            .map_err(|_| Invalid::V1("bad IPv4 source"))?
            .into(),
        "TCP6" => src
            .parse::<Ipv6Addr>()
            .map_err(|_| Invalid::V1("bad IPv6 source"))?
            .into(),
        _ => return Err(Invalid::V1("protocol is not TCP4, TCP6 or UNKNOWN")),
    };
    let port = v1_port(sport).ok_or(Invalid::V1("bad source port"))?;
    v1_port(_dport).ok_or(Invalid::V1("bad destination port"))?;
    Ok(Some((
        Header::Proxied {
            source: SocketAddr::new(ip, port),
        },
        lf + 1,
    )))
}

/// A port in decimal without a sign or leading zeros (the spec's form).
fn v1_port(s: &str) -> Option<u16> {
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if s.len() > 1 && s.starts_with('0') {
        return None;
    }
    s.parse().ok()
}

fn parse_v2(buf: &[u8]) -> Result<Option<(Header, usize)>, Invalid> {
    if buf.len() < 16 {
        return Ok(None);
    }
    let version = buf[12] >> 4;
    let command = buf[12] & 0x0f;
    if version != 2 {
        return Err(Invalid::V2("version is not 2"));
    }
    let body = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if body > V2_MAX_BODY {
        return Err(Invalid::V2("longer than 4096 bytes"));
    }
    let total = 16 + body;
    if buf.len() < total {
        return Ok(None);
    }
    let addresses = &buf[16..total];
    let header = match command {
        0 => Header::Local,
        1 => match buf[13] {
            // TCP over IPv4, then IPv6.
            0x11 => {
                let a = addresses
                    .get(..12)
                    .ok_or(Invalid::V2("IPv4 addresses cut short"))?;
                let ip = Ipv4Addr::new(a[0], a[1], a[2], a[3]);
                Header::Proxied {
                    source: SocketAddr::new(ip.into(), u16::from_be_bytes([a[8], a[9]])),
                }
            }
            0x21 => {
                let a = addresses
                    .get(..36)
                    .ok_or(Invalid::V2("IPv6 addresses cut short"))?;
                let mut octets = [0u8; 16];
                octets.copy_from_slice(&a[..16]);
                Header::Proxied {
                    source: SocketAddr::new(
                        Ipv6Addr::from(octets).into(),
                        u16::from_be_bytes([a[32], a[33]]),
                    ),
                }
            }
            // UDP, UNIX sockets or unspecified: no TCP client address to take.
            0x00 | 0x12 | 0x22 | 0x31 | 0x32 => Header::Local,
            _ => return Err(Invalid::V2("unknown address family or protocol")),
        },
        _ => return Err(Invalid::V2("command is neither LOCAL nor PROXY")),
    };
    Ok(Some((header, total)))
}

/// Why reading a header failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Invalid(#[from] Invalid),
    #[error("reading the PROXY protocol header: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads exactly one header from the start of a connection (the caller bounds it in time).
pub async fn read<S: tokio::io::AsyncRead + Unpin>(io: &mut S) -> Result<Header, ReadError> {
    let mut buf = vec![0u8; FIRST];
    io.read_exact(&mut buf).await?;
    loop {
        match parse(&buf)? {
            Some((header, len)) => {
                debug_assert_eq!(len, buf.len());
                return Ok(header);
            }
            None => {
                // How much more is certainly part of the header.
                let more = if buf.starts_with(&V2_SIGNATURE) {
                    if buf.len() < 16 {
                        16 - buf.len()
                    } else {
                        16 + usize::from(u16::from_be_bytes([buf[14], buf[15]])) - buf.len()
                    }
                } else {
                    // v1: one byte at a time, since the line's end is not known.
                    1
                };
                let at = buf.len();
                buf.resize(at + more, 0);
                io.read_exact(&mut buf[at..]).await?;
            }
        }
    }
}

#[cfg(test)]
mod tests;
