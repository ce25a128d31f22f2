//! A request head as the engines parsed it: the one view the request layer, the router and
//! the forwarded fields read, whichever engine holds the bytes.

use crate::router::Headers;
use pingora::http::RequestHeader;

/// The protocol version a request arrived with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Http10,
    Http11,
    Http2,
}

/// A request head, however an engine parsed it.
pub trait Head: Headers {
    fn method(&self) -> &str;
    /// The request target as received (origin-form "/a?b", absolute-form, ...).
    fn target(&self) -> &[u8];
    fn version(&self) -> Version;
    /// HTTP/2's :authority (HTTP/1 carries the host in the target or the Host header).
    fn authority(&self) -> Option<&[u8]> {
        None
    }
    /// Calls `f` with every header field, in order; names in any case.
    fn each_header<'s>(&'s self, f: &mut dyn FnMut(&'s [u8], &'s [u8]));
}

/// Pingora's parsed request (HTTP/1 or an HTTP/2 stream) as the request layer reads it.
pub struct PingoraHead<'a>(pub &'a RequestHeader);

impl Headers for PingoraHead<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.0.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Head for PingoraHead<'_> {
    fn method(&self) -> &str {
        self.0.method.as_str()
    }

    fn target(&self) -> &[u8] {
        self.0.raw_path()
    }

    fn version(&self) -> Version {
        match self.0.version {
            pingora::http::Version::HTTP_10 | pingora::http::Version::HTTP_09 => Version::Http10,
            pingora::http::Version::HTTP_2 | pingora::http::Version::HTTP_3 => Version::Http2,
            _ => Version::Http11,
        }
    }

    fn authority(&self) -> Option<&[u8]> {
        // HTTP/1 carries it in the target (absolute-form) or Host; HTTP/2 in :authority.
        (self.version() == Version::Http2)
            .then(|| self.0.uri.authority().map(|a| a.as_str().as_bytes()))
            .flatten()
    }

    fn each_header<'s>(&'s self, f: &mut dyn FnMut(&'s [u8], &'s [u8])) {
        for (name, value) in &self.0.headers {
            f(name.as_str().as_bytes(), value.as_bytes());
        }
    }
}

/// A header value as text when it is visible ASCII (what `http::HeaderValue::to_str` takes).
pub(crate) fn visible(v: &[u8]) -> Option<&str> {
    if v.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b)) {
        std::str::from_utf8(v).ok()
    } else {
        None
    }
}

/// An HTTP/2 request's Cookie field as HTTP/1 must carry it: HTTP/2 clients may split it
/// into one field per cookie, which are joined with "; " before the request goes on over
/// HTTP/1 (RFC 9113 section 8.2.3). None: there is nothing to join.
pub fn joined_cookies<H: Head + ?Sized>(head: &H) -> Option<Vec<u8>> {
    if head.version() != Version::Http2 {
        return None;
    }
    let mut crumbs = 0;
    head.each_header(&mut |name, _| crumbs += usize::from(name.eq_ignore_ascii_case(b"cookie")));
    if crumbs < 2 {
        return None;
    }
    let mut joined = Vec::new();
    head.each_header(&mut |name, value| {
        if name.eq_ignore_ascii_case(b"cookie") {
            if !joined.is_empty() {
                joined.extend_from_slice(b"; ");
            }
            joined.extend_from_slice(value);
        }
    });
    Some(joined)
}
